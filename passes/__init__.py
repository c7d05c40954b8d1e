"""Analysis passes over a `Graph` (installed as `dabench_ir.passes`)."""

from __future__ import annotations

from dabench_ir._layout import installed_as

installed_as(__name__, "passes")  # the folder is dabench_ir.passes; one file, one module

from collections.abc import Mapping

from .base import Pass, PassError, PassManager, PassResult
from .cost_rules import FLOP_CONVENTION, OpClass, cost_rule, registered_ops
from .passes import BindSymbols, ClassifyOps, CostPass, FoldWeightLayouts, TagLayers

__all__ = [
    "FLOP_CONVENTION",
    "BindSymbols",
    "ClassifyOps",
    "CostPass",
    "FoldWeightLayouts",
    "OpClass",
    "Pass",
    "PassError",
    "PassManager",
    "PassResult",
    "TagLayers",
    "cost_rule",
    "registered_ops",
    "standard_passes",
]


def standard_passes(dims: Mapping[str, int] | None = None) -> PassManager:
    """The analysis every profile runs: bind symbols, tag layers, classify, fold weight layouts, cost."""
    return PassManager([BindSymbols(dict(dims or {})), TagLayers(), ClassifyOps(), FoldWeightLayouts(), CostPass()])
