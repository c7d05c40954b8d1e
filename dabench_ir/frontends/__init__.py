"""Frontends: model files (ONNX, MLIR) -> `dabench_ir.ir.Graph`."""

from __future__ import annotations

import os
from pathlib import Path

from dabench_ir.errors import InputError

__all__ = ["existing_file"]


def existing_file(source: str | os.PathLike[str], expected: str) -> Path:
    """``source`` as a Path to a file that exists, or one clear line saying what is wrong."""
    path = Path(source)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected {expected}")
    return path
