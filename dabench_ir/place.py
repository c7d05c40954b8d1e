"""`place`: one graph on one target, through every stage after costing.

lower (the target's `Lowering`) -> emulate (the Plan as a discrete-event simulation) ->
metrics. `dabench_ir.run.execute` places a run's costed graph through this function (`profile`,
`--target a,b,c`, `demo`, `sweep`), and `scaling` each chip's share; `run.placed` (a why line's
variant: no metrics) and `run.placement` (a fit check: no emulation) take its first stages alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dabench_ir.emulate import emulate
from dabench_ir.lowering import lower
from dabench_ir.metrics import Metrics, compute_metrics

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.plan import Plan
    from dabench_ir.targets import Target
    from dabench_ir.timeline import Timeline

__all__ = ["place"]

logger = logging.getLogger(__name__)


def place(graph: Graph, target: Target, options: Any = None) -> tuple[Plan, Timeline, Metrics]:
    """Lower ``graph`` onto ``target``, emulate one step, and measure it.

    ``options`` is a `ProfileOptions` (or `ScaleOptions`, or a lowering's own options;
    None: the defaults). Returns the Plan, its emulated Timeline and its Metrics.
    """
    plan = lower(graph, target, options)
    timeline = emulate(plan, graph)
    metrics = compute_metrics(graph, plan, timeline, target)
    return plan, timeline, metrics
