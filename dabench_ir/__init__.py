"""dabench-ir: a compiler-pass framework for benchmarking LLM graphs on dataflow accelerators.

    >>> import dabench_ir
    >>> report = dabench_ir.profile("model.onnx", target="rdu")
    >>> report.to_dict()["totals"]["flops"]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "profile"]

if TYPE_CHECKING:
    from dabench_ir.report import Report


def profile(model: Any, target: str | None = None, **options: Any) -> Report:
    """Load ``model`` (a path or an ``onnx.ModelProto``), run the passes, return a Report.

    See `dabench_ir.pipeline.profile` for the options.
    """
    from dabench_ir.pipeline import profile as _profile

    return _profile(model, target=target, **options)
