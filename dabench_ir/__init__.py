"""dabench-ir: a compiler-pass framework for benchmarking LLM graphs on dataflow accelerators.

    >>> import dabench_ir
    >>> report = dabench_ir.profile("model.onnx", target="rdu")
    >>> report.totals["flops"]

The API is docs/api.md: `profile`, `profile_targets`, `generate`, `scale`, `run_study`, `run_validation`,
`Report` (`Report.from_json`, `Report.to_pandas`), the typed mappings `Totals`, `Metrics`,
`StudyTotals`, `TargetSummary`, and `ApiError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_RESULTS = {  # the result types' modules; every other name of __all__ is dabench_ir.api's
    "Report": "dabench_ir.report.model",
    "GenerateResult": "dabench_ir.scenario",
    "ScaleResult": "dabench_ir.scaling",
    "ScalePoint": "dabench_ir.scaling",
    "Validation": "dabench_ir.validate",
    "PointResult": "dabench_ir.validate",
}

__all__ = [
    "ApiError",
    "GenerateResult",
    "Metrics",
    "PointResult",
    "Report",
    "ScalePoint",
    "ScaleResult",
    "StudyResult",
    "StudyRun",
    "StudyTotals",
    "TargetSummary",
    "Totals",
    "Validation",
    "__version__",
    "generate",
    "profile",
    "profile_targets",
    "run_study",
    "run_validation",
    "scale",
]

if TYPE_CHECKING:
    from dabench_ir.api import (
        ApiError,
        Metrics,
        StudyResult,
        StudyRun,
        StudyTotals,
        TargetSummary,
        Totals,
        generate,
        profile,
        profile_targets,
        run_study,
        run_validation,
        scale,
    )
    from dabench_ir.report.model import Report
    from dabench_ir.scaling import ScalePoint, ScaleResult
    from dabench_ir.scenario import GenerateResult
    from dabench_ir.validate import PointResult, Validation


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (``import dabench_ir`` stays light)."""
    if name in __all__:
        import importlib

        return getattr(importlib.import_module(_RESULTS.get(name, "dabench_ir.api")), name)
    raise AttributeError(f"module 'dabench_ir' has no attribute {name!r}")
