"""`place`: one graph on one target, lower -> emulate -> metrics, the step every command shares."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.metrics import Metrics
    from dabench_ir.plan import Plan
    from dabench_ir.targets import Target
    from dabench_ir.timeline import Timeline

__all__ = ["place"]


def place(graph: Graph, target: Target, options: Any = None) -> tuple[Plan, Timeline, Metrics]:
    """Lower ``graph`` onto ``target`` with the lowering ``options``, emulate the Plan, measure it."""
    from dabench_ir.emulate import emulate
    from dabench_ir.lowering import lower
    from dabench_ir.metrics import compute_metrics

    plan = lower(graph, target, options)
    timeline = emulate(plan, graph)
    return plan, timeline, compute_metrics(graph, plan, timeline, target)
