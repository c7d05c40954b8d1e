"""A module's private names stay in the module (issue 43): what another module needs is public.

The check reads the package's source, not a spelling: an ``import`` of a ``_name`` from another of
the tool's modules fails it, wherever it is written (top level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import dabench_ir

ROOT = Path(dabench_ir.__file__).resolve().parent
# the top-level packages the tool maps into dabench_ir (dabench_ir/_layout.py)
SOURCES = [ROOT, *(ROOT.parent / name for name in ("lowering", "passes", "targets", "models"))]


def _private_imports(path: Path, base: Path = ROOT.parent) -> list[str]:
    """Each ``from <one of the tool's modules> import _name`` in ``path``, named relative to ``base``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        tool_module = node.level > 0 or (node.module or "").split(".")[0] == "dabench_ir"
        for alias in node.names if tool_module else ():
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{path.relative_to(base)}:{node.lineno}: {alias.name} from {node.module}")
    return found


def test_no_module_imports_another_modules_private_names():
    files = [p for src in SOURCES if src.is_dir() for p in sorted(src.rglob("*.py"))]
    assert len(files) > 100  # the walk found the package
    offenders = [line for path in files for line in _private_imports(path)]
    assert offenders == []


def test_the_check_sees_a_private_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from dabench_ir.run import _hidden\n    from .sibling import _other\n")
    assert _private_imports(module, tmp_path) == [
        "m.py:2: _hidden from dabench_ir.run",
        "m.py:3: _other from sibling",
    ]
