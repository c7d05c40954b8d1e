"""Installed layout: the top-level folders import as dabench_ir subpackages, never bare."""

from __future__ import annotations

import subprocess
import sys


def test_subpackages_import_under_dabench_ir_only(tmp_path):
    code = (
        "import importlib, importlib.util\n"
        "for name in ('passes', 'lowering', 'targets', 'models'):\n"
        "    assert importlib.import_module('dabench_ir.' + name).__file__\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
        "from dabench_ir.targets import list_targets\n"
        "assert {t.name for t in list_targets()} >= {'wse2', 'sn30', 'bow', 'a100', 'h100', 'h200'}\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_every_package_folder_is_listed_for_the_wheel():
    """The wheel lists its packages explicitly (pyproject.toml): a package folder left out ships
    without its modules (``dabench_ir.study`` once did), which an editable install never shows."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, mapped = set(tool["packages"]), tool["package-dir"]
    folders = {"dabench_ir": root / "dabench_ir", **{name: root / path for name, path in mapped.items()}}
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    assert found - listed == set(), f"packages missing from pyproject.toml [tool.setuptools] packages: {found - listed}"
