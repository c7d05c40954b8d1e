"""`dabench-ir profile x.onnx` must not import torch (nor torch-mlir)."""

from __future__ import annotations

import subprocess
import sys


def test_profile_does_not_import_torch(tiny_matmul_path):
    code = (
        "import sys\n"
        "from dabench_ir.cli import main\n"
        f"rc = main(['profile', {str(tiny_matmul_path)!r}, '--quiet'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_mlir', 'onnxruntime'))\n"
        "print(rc, heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "0 []"
