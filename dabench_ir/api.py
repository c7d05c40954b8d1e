"""The Python API (docs/api.md): the CLI's questions as functions with keyword options.

Options are the knobs of `dabench_ir.options` by their field names (``batch=8``, ``precision="bf16"``,
``dims={"seq": 128}``). Bad input raises `ApiError` (a ValueError) worded for Python: ``batch=2``,
not ``--batch 2``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError

if TYPE_CHECKING:
    from dabench_ir.report.model import Report

__all__ = ["ApiError", "profile", "profile_targets"]


class ApiError(ValueError):
    """Bad input to the Python API: one line saying what is wrong and how to fix it."""


_FLAG = re.compile(r"--dim (\S+?)=(\S+?)(?=[:;,\s]|$)|(--[a-z][a-z-]*)(?: (\d\S*?|\S+?(?=[:;,]|$))(?=[:;,\s]|$))?")


def _keywords(message: str) -> str:
    """A CLI-worded message in keyword terms: ``--batch 2`` -> ``batch=2``, ``--dim seq=N`` ->
    ``dims={'seq': N}``; flags that are no keyword of the API (export's) stay as they are."""
    from dabench_ir.options import KNOBS

    names = {k.flag: name for name, k in KNOBS.items()}

    def word(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return f"dims={{{m.group(1)!r}: {m.group(2)}}}"
        name = names.get(m.group(3))
        if name is None:
            return m.group(0)
        if m.group(4) is None:
            return f"{name}="
        return f"dims[{m.group(4)!r}]" if name == "dims" else f"{name}={m.group(4)}"

    return _FLAG.sub(word, message)


def _api(call):
    try:
        return call()
    except UserError as exc:
        raise ApiError(_keywords(str(exc))) from None


def profile(model: str | Path | Any, target: str | None = None, **options: Any) -> Report:
    """``model`` (a path to .onnx/.mlir, or an ``onnx.ModelProto``) on ``target`` (None: cost only)."""
    from dabench_ir.pipeline import run_profile

    return _api(lambda: run_profile(model, target, options))


def profile_targets(model: str | Path | Any, targets: Sequence[str], **options: Any) -> dict[str, Report]:
    """``model`` on each of ``targets``, costed once per distinct costing: ``{target: Report}``."""
    from dabench_ir.pipeline import profile_targets as _profile_targets

    return _api(lambda: _profile_targets(model, list(targets), options))
