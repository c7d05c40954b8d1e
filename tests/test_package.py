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
