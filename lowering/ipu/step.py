"""What a step pays once, outside the pipeline cycle: fill and drain, the optimizer, the gradient reduction.

A step is ``m`` cycles of the most loaded IPU plus, once per step (``Plan.step_overheads_s``),
the pipeline fill and drain (training drains before each weight update), the optimizer update
(on the tiles' fp32 vector lanes, or at streaming-memory bandwidth when its state is
off-chip) and the gradient reduction over replicas. `add_step_costs` is the lowering's step
that adds them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from dabench_ir.lowering._common import place_node
from dabench_ir.lowering.collectives import ring_allreduce_bytes, ring_allreduce_time
from dabench_ir.lowering.ipu.common import trained_params
from dabench_ir.plan import Unit

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.lowering._common import LoweringContext
    from dabench_ir.lowering.ipu.common import IpuRun
    from dabench_ir.lowering.ipu.memory import TileMemory
    from dabench_ir.lowering.ipu.stages import Pipeline
    from dabench_ir.plan import Plan

__all__ = ["adam_cycles", "add_step_costs", "place_optimizer"]


def adam_cycles(ctx: LoweringContext, node: Node, lanes: float, special: float) -> float:
    """Tile cycles per parameter of an optimizer step node: its element ops on the fp32 vector
    lanes and its transcendentals (the square root) at the fp32 special-function rate."""
    cost = ctx.costs[node.name]
    params = trained_params(ctx)
    if not params:
        return 0.0
    return (cost.vector_flops / lanes + cost.special_ops / special) / params


def place_optimizer(run: IpuRun, pipeline: Pipeline, memory: TileMemory, plan: Plan) -> None:
    """The optimizer step as a unit of its own: each IPU updates its parameters on all its tiles
    while, with the state off-chip, the state streams in and out; the slowest IPU's time is the
    step's ``optimizer`` overhead, on the step nodes' plans as memory time."""
    ctx, fig = run.ctx, run.fig
    stream, offchip = fig.stream, memory.offchip
    opt_nodes = pipeline.sections.optimizer
    per_ipu = []
    for k, params in memory.params_on.items():
        cycles = sum(adam_cycles(ctx, n, fig.lanes["fp32"], fig.special["fp32"]) for n in opt_nodes)
        update = params * cycles / (fig.clock * fig.tiles)
        moved = 2 * memory.offchip_bytes.get(k, 0.0) / stream.bandwidth_bytes_per_s if offchip and stream else 0.0
        per_ipu.append(max(update, moved))  # the state streams in and out while the tiles update
    opt_s = max(per_ipu, default=0.0)
    unit = Unit(id="optimizer", kind="ipu_optimizer", nodes=[n.name for n in opt_nodes])
    plan.units.append(unit)
    for node in opt_nodes:
        plan.node_plans[node.name] = place_node(
            ctx,
            node,
            unit=unit.id,
            compute_s=0.0,
            memory_s=opt_s,
            feed_level=stream.level if offchip and stream else fig.sram.level,
            feed_bytes=ctx.costs[node.name].bytes,
            ridge=fig.ridge,
            allocation=0.0,
            micro_batches=run.m,
            time_s=0.0,
        )
    plan.step_overheads_s["optimizer"] = opt_s
    if offchip and stream is not None:
        plan.traffic_bytes[stream.name] = int(2 * sum(memory.offchip_bytes.values()))


def add_step_costs(run: IpuRun, pipeline: Pipeline, memory: TileMemory, cycle_s: float, plan: Plan) -> None:
    """Step 5: what a step pays once (``plan.step_overheads_s``), in this order: the pipeline fill
    and drain, the optimizer (`place_optimizer`), and the gradient ring all-reduce over replicas."""
    if run.training and pipeline.n_stages > 1 and run.options.steady_state:
        # the pipeline drains before each weight update: the bubble is paid every step (in
        # inference consecutive steps stream through without one; without steady_state the
        # event simulation already holds the fill and drain)
        plan.step_overheads_s["pipeline_fill_drain"] = (pipeline.n_stages - 1) * cycle_s
    if pipeline.sections.optimizer:
        place_optimizer(run, pipeline, memory, plan)
    link = run.fig.link
    if run.training and run.replicas > 1 and link is not None:
        grads = max(memory.params_on.values(), default=0) * max(memory.accum_pp, 1)
        # the ring's bandwidth term only: the IPU model has always left the link latency out
        plan.step_overheads_s["gradient_reduce"] = ring_allreduce_time(grads, run.replicas, link.bandwidth_bytes_per_s)
        plan.stats = replace(plan.stats, link_bytes=plan.stats.link_bytes + ring_allreduce_bytes(grads, run.replicas))
