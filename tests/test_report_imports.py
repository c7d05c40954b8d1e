"""Renderers take a Report: nothing under ``dabench_ir/report/`` imports the stages that make one.

An AST scan of every import in the package, module level and function level, absolute or
relative, so a renderer that starts placing, running, lowering, emulating, executing on the
host or scaling fails here, naming the file and line. Imports under ``if TYPE_CHECKING:`` are
type names only (never executed: `build_report` annotates its ``run: ResolvedRun``) and pass.
The runs a renderer shows (the why lines' knob changes) are made outside it (`dabench_ir.advice`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import dabench_ir

PACKAGE = Path(dabench_ir.__file__).resolve().parent
REPORT = PACKAGE / "report"
FORBIDDEN = (
    "dabench_ir.place",
    "dabench_ir.run",
    "dabench_ir.lowering",
    "dabench_ir.emulate",
    "dabench_ir.execute",
    "dabench_ir.scaling",
    "lowering",  # the top-level lowering package dabench_ir.lowering re-exports
)


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in ``path``; ``from X import y`` also yields ``X.y``
    (``from dabench_ir import run`` imports the module dabench_ir.run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_of(path).split(".") if path.name == "__init__.py" else _module_of(path).split(".")[:-1]
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
    return out


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _forbidden(module: str) -> str | None:
    for banned in FORBIDDEN:
        if module == banned or module.startswith(banned + "."):
            return banned
    return None


def _offences() -> list[str]:
    found = []
    for path in sorted(REPORT.rglob("*.py")):
        seen: set[int] = set()
        for line, module in _imported(path):
            banned = _forbidden(module)
            if banned is not None and line not in seen:
                seen.add(line)
                found.append(f"{path.relative_to(PACKAGE.parent).as_posix()}:{line}: imports {module} ({banned})")
    return found


def test_report_modules_import_no_stage():
    offences = _offences()
    assert not offences, "renderers take a Report; these imports run a stage:\n" + "\n".join(offences)


def test_the_scan_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    """The scan itself: a function-level absolute import and a relative one are both caught."""
    fake = tmp_path / "dabench_ir" / "report"
    fake.mkdir(parents=True)
    (tmp_path / "dabench_ir" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text(
        "from __future__ import annotations\n\nfrom typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from dabench_ir.run import ResolvedRun\n\n"
        "def f():\n    from dabench_ir.place import place\n    return place\n\n"
        "def g():\n    from .. import run\n    return run\n\n"
        "def h():\n    import dabench_ir.scaling.plan\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["_"]), "PACKAGE", tmp_path / "dabench_ir")
    monkeypatch.setattr(__import__(__name__, fromlist=["_"]), "REPORT", fake)
    offences = _offences()
    assert len(offences) == 3, offences
    assert offences[0].startswith("dabench_ir/report/bad.py:9: imports dabench_ir.place")
    assert "bad.py:13: imports dabench_ir.run" in offences[1]
    assert "bad.py:17: imports dabench_ir.scaling.plan" in offences[2]
