"""Frontends: model files (ONNX, MLIR) -> `dabench_ir.ir.Graph`."""

from __future__ import annotations

import os
from pathlib import Path

from dabench_ir.errors import InputError

__all__ = ["existing_file"]


def existing_file(source: str | os.PathLike[str], expected: str) -> Path:
    """``source`` as a Path to a file that exists, or one clear line saying what is wrong."""
    from dabench_ir.errors import UserError
    from dabench_ir.fileio import check_input_file

    try:
        return check_input_file(Path(source))  # a FIFO would block forever: regular files only
    except UserError as exc:
        raise InputError(f"{exc}; expected {expected}") from None
