"""What a training step pays outside the pipeline cycle: ramp, host streams, accumulation, optimizer, reduction.

A step is ``m`` cycles of the most loaded IPU plus (``Plan.step_overheads_s``, one row each, in
this order):

- ``pipeline_fill_drain``: the ramp up and ramp down, (S - 1) cycles (training drains before
  each weight update; Graphcore: "2N stages are always under-utilised during the ramp up and
  ramp down phases", Memory and Performance Optimisation on the IPU, sec. 4.2: with the 2S - 1
  forward/backward pipeline stages of a training pipeline, their partial cycles add up to S - 1
  full ones when the stages are balanced);
- ``host_streams``: each micro-batch's graph inputs (token ids, labels) streamed from the host
  through the IPU-Gateway (``link.gateway``: its latency once a micro-batch, the bytes at its
  bandwidth), serial with compute and holding every IPU (PopART streams host data serially to
  computation unless IO tiles are set, and its default ``Full`` sync pattern makes any host
  transfer synchronise all IPUs: PopART User Guide, "Overlapping IO with compute" and
  "Performance optimisation: sync configuration"). Outputs return once per host call
  (``outputMode(Sum)`` in Graphcore's GPT-2 example), not per micro-batch;
- ``grad_accumulate``: with ``m`` > 1, each micro-batch's weight gradients added into the
  accumulator (PopART glossary, "Accumulation factor": accumulated over that many micro-batches in
  series before a weight update) on the tiles' vector lanes of the accumulator's precision
  (``arch.vector_elems_per_cycle_<p>``), the most loaded IPU's;
- ``optimizer``: the update on the tiles' fp32 vector lanes, or at streaming-memory bandwidth
  when its state is off-chip (`place_optimizer`);
- ``gradient_reduce``: the gradient all-reduce over replicas (`gradient_reduce_s`): a ring on the
  IPU-Links inside a Pod64, hierarchical through the gateway past it.

`add_step_costs` is the lowering's step that adds them. Not modelled (no published figure): the
host's own time per ``poptorch`` call (Python, ``setOptimizer`` each call in the example), spread
over ``deviceIterations`` steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from dabench_ir.ir import ValueKind
from dabench_ir.lowering.collectives import (
    LinkFigures,
    hierarchical_allreduce_time,
    ring_allreduce_bytes,
    ring_allreduce_time,
)
from dabench_ir.lowering.context import place_node
from dabench_ir.lowering.ipu.common import trained_params
from dabench_ir.plan import GRADIENT_REDUCE, PIPELINE_FILL_DRAIN, Unit

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.ipu.common import IpuRun
    from dabench_ir.lowering.ipu.memory import TileMemory
    from dabench_ir.lowering.ipu.stages import Pipeline
    from dabench_ir.plan import Plan

__all__ = [
    "adam_cycles",
    "add_step_costs",
    "grad_accumulate_s",
    "gradient_reduce_s",
    "host_input_bytes",
    "host_streams_s",
    "place_optimizer",
]


def adam_cycles(ctx: LoweringContext, node: Node, lanes: float, special: float) -> float:
    """Tile cycles per parameter of an optimizer step node: its element ops on the fp32 vector
    lanes and its transcendentals (the square root) at the fp32 special-function rate."""
    cost = ctx.costs[node.name]
    params = trained_params(ctx)
    if not params:
        return 0.0
    return (cost.vector_flops / lanes + cost.special_ops / special) / params


def host_input_bytes(ctx: LoweringContext) -> float:
    """Bytes of the graph's inputs (token ids, labels) over the whole bound batch: what the host
    streams to the IPUs a step."""
    return float(sum(ctx.value_bytes(v.name) for v in ctx.graph.values.values() if v.kind is ValueKind.INPUT))


def host_streams_s(run: IpuRun) -> float:
    """A step's host data streams: ``m`` stream copies through the IPU-Gateway, each its latency
    plus one micro-batch's inputs at its bandwidth (0 without a gateway link or inputs)."""
    host = run.fig.host
    total = host_input_bytes(run.ctx)
    if host is None or total <= 0:
        return 0.0
    return run.m * host.latency_s + total / host.bandwidth_bytes_per_s


def grad_accumulate_s(run: IpuRun, memory: TileMemory) -> float:
    """A step's gradient accumulation: with ``m`` > 1 micro-batches, ``m`` adds of each IPU's
    weight gradients into its accumulator on all its tiles' vector lanes, in the accumulator's
    precision (fp32 lanes for 4-byte gradients, else 16-bit); the most loaded IPU's."""
    if run.m <= 1 or not memory.params_on:
        return 0.0
    fig = run.fig
    lanes = fig.lanes["fp32" if memory.accum_pp >= 4 else "fp16"]
    return run.m * max(memory.params_on.values()) / (lanes * fig.clock * fig.tiles)


def place_optimizer(run: IpuRun, pipeline: Pipeline, memory: TileMemory, plan: Plan) -> None:
    """The optimizer step as a unit of its own: each IPU updates its parameters on all its tiles
    while, with the state off-chip, the state streams in and out; the slowest IPU's time is the
    step's ``optimizer`` overhead, on the step nodes' plans as memory time. Under replicated tensor
    sharding each replica updates its 1/n shard of the parameters and streams its 1/n of the state
    (Graphcore's popxl GPT-J, graphcore/examples nlp/gpt_j/popxl/README.md: "the optimiser layer
    operates directly on the RTS sharded gradient accumulators, optimiser state and variables")."""
    ctx, fig = run.ctx, run.fig
    stream, offchip = fig.stream, memory.offchip
    opt_nodes = pipeline.sections.optimizer
    per_ipu = []
    for k, params in memory.params_on.items():
        cycles = sum(adam_cycles(ctx, n, fig.lanes["fp32"], fig.special["fp32"]) for n in opt_nodes)
        update = params * cycles / (fig.clock * fig.tiles) / memory.shard
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
    if memory.shard > 1:
        n = memory.shard
        plan.stats = replace(
            plan.stats,
            replicas_share=f"replicated tensor sharding: each of the {n} replicas updates 1/{n} of the weights"
            + (f" and streams 1/{n} of the optimizer state" if offchip and stream else "")
            + " (--replicated-tensor-sharding)",
        )


def add_step_costs(run: IpuRun, pipeline: Pipeline, memory: TileMemory, cycle_s: float, plan: Plan) -> None:
    """Step 5: what a training step pays outside the cycle (``plan.step_overheads_s``), in this
    order: the pipeline fill and drain, the host data streams (`host_streams_s`), the gradient
    accumulation (`grad_accumulate_s`), the optimizer (`place_optimizer`), and the gradient ring
    all-reduce over replicas."""
    if run.training and pipeline.n_stages > 1 and run.options.steady_state:
        # the pipeline drains before each weight update: the bubble is paid every step (in
        # inference consecutive steps stream through without one; without steady_state the
        # event simulation already holds the fill and drain)
        plan.step_overheads_s[PIPELINE_FILL_DRAIN] = (pipeline.n_stages - 1) * cycle_s
    if run.training:
        if streams := host_streams_s(run):
            plan.step_overheads_s["host_streams"] = streams
        if accumulate := grad_accumulate_s(run, memory):
            plan.step_overheads_s["grad_accumulate"] = accumulate
    if pipeline.sections.optimizer:
        place_optimizer(run, pipeline, memory, plan)
    if run.training and run.replicas > 1 and run.fig.link is not None:
        # each IPU's stage all-reduces its own gradients in a ring of its own, the rings side by side:
        # the step waits for the largest, and the links carry every ring's bytes
        grads = {k: params * max(memory.accum_pp, 1) for k, params in memory.params_on.items()}
        plan.step_overheads_s[GRADIENT_REDUCE] = gradient_reduce_s(run, pipeline, max(grads.values(), default=0))
        carried = sum(ring_allreduce_bytes(g, run.replicas) for g in grads.values())
        plan.stats = replace(plan.stats, link_bytes=plan.stats.link_bytes + carried)


def gradient_reduce_s(run: IpuRun, pipeline: Pipeline, grads: float) -> float:
    """The all-reduce of each IPU's ``grads`` bytes over the replicas, the same stage of every replica
    in one ring: on the IPU-Links inside an IPU-Link domain (the target's ``[topology]`` node, a Pod64,
    which holds ``devices_per_node / ipus`` replicas), hierarchical through the gateway between domains
    (`hierarchical_allreduce_time`). The bandwidth terms only: the IPU model has always left the link
    latency out."""
    topo = run.target.topology
    if topo is None:
        return ring_allreduce_time(grads, run.replicas, run.fig.link.bandwidth_bytes_per_s)
    inter = None if topo.inter is None else LinkFigures(topo.inter.bandwidth_bytes_per_s)  # latency left out
    per_domain = max(1, topo.per_node // pipeline.ipus)
    return hierarchical_allreduce_time(
        grads, run.replicas, per_domain, LinkFigures(topo.intra.bandwidth_bytes_per_s), inter
    )
