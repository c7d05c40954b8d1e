"""dabench-ir: a compiler-pass framework for benchmarking LLM graphs on dataflow accelerators.

    >>> import dabench_ir
    >>> report = dabench_ir.profile("model.onnx", target="rdu")
    >>> report.totals["flops"]

The API is docs/api.md: `profile`, `profile_targets`, `Report` (`Report.from_json`,
`Report.to_pandas`), `ApiError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["ApiError", "Report", "__version__", "profile", "profile_targets"]

if TYPE_CHECKING:
    from dabench_ir.api import ApiError, profile, profile_targets
    from dabench_ir.report.model import Report

_LAZY = {"ApiError": "dabench_ir.api", "profile": "dabench_ir.api", "profile_targets": "dabench_ir.api",
         "Report": "dabench_ir.report.model"}  # fmt: skip


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (``import dabench_ir`` stays light)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dabench_ir' has no attribute {name!r}")
