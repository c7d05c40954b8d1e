"""Each node as one bulk-synchronous superstep on its IPU: tiles, compute, sync, exchange.

A node's work spreads over the tiles it needs (`tiles_for`); its three Cost parts run at their
own rates (`precision_key` picks them): contractions on the AMP units at
``arch.matmul_efficiency_<prec>`` of peak (`amp_rate`: ``arch.amp_share_fp32_partials`` of it for 16-bit contractions with fp32
partial sums, ``--half-partials false``), vector ops on the tile's vector lanes, transcendentals
at the special-function rate. A sync follows, then an exchange of its inputs between tiles and,
for a tensor made on another IPU, one copy over the IPU-Link. A matmul whose full-speed
temporaries exceed the matmul proportion's budget is serialised (`serial_plan`): each pass after
the first pays a sync and the broadcast operand's exchange again. A contraction's tile-memory
traffic is its AMP loop's (`amp_stream_bytes`: partial sums loaded and stored every cycle), which
places it on the roofline. `place_nodes` is the
lowering's step that times every stage node this way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dabench_ir.lowering.context import place_node
from dabench_ir.lowering.ipu.common import act_bytes
from dabench_ir.passes import meta
from dabench_ir.passes.training import is_optimizer_step

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.ipu.common import IpuRun
    from dabench_ir.lowering.ipu.stages import Pipeline
    from dabench_ir.plan import NodePlan, Plan

__all__ = [
    "NO_MATMUL",
    "IpuTimes",
    "SerialPlan",
    "amp_rate",
    "place_nodes",
    "precision_key",
    "serial_plan",
    "tiles_for",
]


@dataclass(frozen=True, slots=True)
class SerialPlan:
    """A matmul's plan under the matmul proportion: serial passes, the temporaries the plan
    holds, and the operand it broadcasts again in each pass (bytes per micro-batch)."""

    passes: int = 1
    temporaries: float = 0.0
    broadcast_bytes: float = 0.0


NO_MATMUL = SerialPlan()
"""The plan of a node that contracts nothing (most nodes): one pass, nothing held; shared, as it is frozen."""


@dataclass(slots=True)
class IpuTimes:
    """What `place_nodes` adds up per IPU (by index), and each node's matmul plan (by name)."""

    lane_s: dict[int, float] = field(default_factory=dict)  # one micro-batch through the IPU's stages
    busy_s: dict[int, float] = field(default_factory=dict)  # a step's busy time
    tile_weighted_s: dict[int, float] = field(default_factory=dict)  # busy time x the share of tiles used
    serials: dict[str, SerialPlan] = field(default_factory=dict)  # under its IPU's budget, for time and memory
    link_bytes: float = 0.0  # a step's bytes over the IPU-Links (activations, and their gradients back)

    @property
    def cycle_s(self) -> float:
        """The pipeline cycle: the most loaded IPU's time for one micro-batch."""
        return max(self.lane_s.values(), default=0.0)

    def utilisation(self, ipu: int) -> float:
        """The busy-time-weighted share of ``ipu``'s tiles its nodes use (0 when it is never busy)."""
        return self.tile_weighted_s.get(ipu, 0.0) / self.busy_s[ipu] if self.busy_s.get(ipu) else 0.0


def precision_key(node: Node, ctx: LoweringContext) -> str:
    """fp32 or fp16 (16-bit AMP and vector lanes serve fp16 and bf16 alike): the node's own
    precision, except that a 16-bit plan keeps every op but the optimizer in 16 bits
    (Graphcore's examples run ``model.half()``; the fp32 state is the optimizer's)."""
    if ctx.precision.itemsize < 4 and not is_optimizer_step(node):
        return "fp16"  # a 16-bit plan runs norms and softmax in 16 bits too, as model.half() does
    return "fp32" if ctx.node_precision(node).itemsize >= 4 else "fp16"


def amp_rate(run: IpuRun, prec: str) -> float:
    """One tile's achieved AMP rate for a contraction of precision key ``prec``, FLOP/s: the
    tile's share of the peak at ``arch.matmul_efficiency_<prec>``. A 16-bit contraction keeping
    fp32 partial sums (``--half-partials false``) gets ``arch.amp_share_fp32_partials`` of it:
    on the Mk2 AMP an fp32 partial needs twice the store width of an fp16 one, so PopLibs plans
    it on half the conv units (targets/bow.toml gives the source)."""
    fig = run.fig
    rate = fig.eta[prec] * fig.amp_peak[prec]
    if prec == "fp16" and not run.options.half_partials:
        rate *= fig.fp32_partials_share
    return rate


def amp_stream_bytes(run: IpuRun, node: Node, prec: str) -> float:
    """Tile-memory bytes a contraction's AMP loop moves: ``arch.amp_bytes_per_cycle`` (each AMP
    instruction's input load and partials load and store) for every AMP cycle its FLOPs need at
    the unit's full rate (the tile's peak, times ``arch.amp_share_fp32_partials`` with fp32
    partials). Partial sums stream through memory on every pass over 16 input channels, so a
    matmul's traffic is this, not its operands once: at the peak rate it takes as long as its
    FLOPs (the loop sits at the ridge), and fp32 partials on half the units move the same bytes
    for half the FLOPs (left of it). 0 for a node that contracts nothing."""
    fig = run.fig
    flops = run.ctx.costs[node.name].contraction_flops
    if flops <= 0 or fig.amp_bytes <= 0:
        return 0.0
    share = fig.fp32_partials_share if prec == "fp16" and not run.options.half_partials else 1.0
    flops_per_cycle = fig.amp_peak[prec] * share / fig.clock
    return flops / flops_per_cycle * fig.amp_bytes


def compute_s(run: IpuRun, node: Node, prec: str, tiles: int) -> float:
    """Seconds ``node``'s work takes on ``tiles`` tiles, each part at its unit's rate: contractions
    on the AMP (`amp_rate`), vector FLOPs on the vector lanes, transcendentals on the special unit."""
    return _work_s(run, node, prec, amp_rate(run, prec)) / tiles


def _work_s(run: IpuRun, node: Node, prec: str, amp: float) -> float:
    """Seconds ``node``'s work takes on one tile, its contractions at ``amp`` FLOP/s."""
    fig, cost = run.fig, run.ctx.costs[node.name]
    vector_s = cost.vector_flops / (fig.lanes[prec] * fig.clock)
    special_s = cost.special_ops / (fig.special[prec] * fig.clock)
    return cost.contraction_flops / amp + vector_s + special_s


def tiles_for(run: IpuRun, node: Node) -> int:
    """Tiles an operator spreads over: enough that each has at least a grain of work a micro-batch
    (``arch.min_grain_flops`` at one tile's 16-bit AMP peak, about 400 ns), and enough to hold its
    tensors in tile memory. The work is each part's at its unit's rate (a vector FLOP takes about 100
    times an AMP FLOP at the peak: a norm of 6.9e5 FLOP a micro-batch holds 664 tiles' grains, where
    as FLOPs it took 7), the contractions' at the AMP's peak for their data: how the planner partitions
    a matmul is the data's, not the partials' (fp32 partials run the same tiles at half the rate)."""
    fig, cost = run.fig, run.ctx.costs[node.name]
    prec = precision_key(node, run.ctx)
    grain_s = fig.grain / fig.amp_peak["fp16"]
    by_work = math.ceil(_work_s(run, node, prec, fig.amp_peak[prec]) / run.m / grain_s)
    by_data = math.ceil(cost.bytes / run.m / fig.tile_sram)
    return max(1, min(fig.tiles, max(by_work, by_data)))


def serial_plan(ctx: LoweringContext, node: Node, m: int, gamma: float, budget: float) -> SerialPlan:
    """How the PopLibs planner fits a matmul's temporaries into ``budget`` (the matmul
    proportion of the IPU's memory). At full speed the plan wants ``gamma`` bytes of
    temporaries per operand byte (rearranged copies, partials), W. When W exceeds the budget
    the planner serialises the matmul into k = ceil(W / budget) passes over the larger
    operands; each pass holds 1/k of their temporaries plus the whole copy of the operand it
    broadcasts to every pass (the smaller input), so a small budget can be exceeded by that
    copy, as Poplar's plans can. Each pass after the first pays a sync and exchanges the
    broadcast operand again (the lowering's time); none of it where the budget does not bind."""
    graph = ctx.graph
    if ctx.costs[node.name].contraction_flops <= 0:
        return NO_MATMUL
    sizes: list[float] = []
    total = 0.0
    for i, v in enumerate([*node.inputs, *node.outputs]):
        value = graph.values.get(v) if v else None
        if value is None:
            continue
        size = ctx.value_bytes(v) if value.kind.is_stored else act_bytes(ctx, v) / m
        total += size
        if i < len(node.inputs) and size > 0:
            sizes.append(size)
    broadcast = min(sizes, default=0.0)
    want = gamma * total
    if want <= budget or budget <= 0:
        return SerialPlan(1, want, broadcast)
    passes = math.ceil(want / budget)
    return SerialPlan(passes, gamma * (broadcast + (total - broadcast) / passes), broadcast)


def _link_bytes(run: IpuRun, node: Node, ipu: int, ipu_of: dict[str, int], crossed: set[tuple[str, int]]) -> float:
    """Bytes ``node`` brings over the IPU-Link onto ``ipu``: each input made on another IPU, once
    per IPU however many ops read it there (``crossed`` holds the copies made), and in training
    its gradient back. A weight's layout folded at compile time (`meta.FOLDED`) is no run-time
    tensor: the compiler stores it where it is read (a tied head's transposed table, placed with the
    embedding, had crossed the link each micro-batch)."""
    graph = run.ctx.graph
    link_bytes = 0.0
    for v in node.inputs:
        value = graph.values.get(v) if v else None
        if (
            value is not None
            and value.producer is not None
            and meta.FOLDED not in graph.node(value.producer).meta
            and ipu_of.get(value.producer, ipu) != ipu
            and (v, ipu) not in crossed
        ):
            crossed.add((v, ipu))  # one inter-IPU copy per tensor, however many ops read it there
            link_bytes += act_bytes(run.ctx, v) * (2 if run.training else 1)  # and its gradient back
    return link_bytes


def _superstep(
    run: IpuRun, node: Node, unit_id: str, lane: str, used: int, serial: SerialPlan, link_bytes: float, n_ipus: int
) -> NodePlan:
    """The `NodePlan` of ``node`` on ``used`` tiles: its Cost parts at their rates, the
    exchange of its inputs, its link copies and the serial passes' extra broadcasts, and a
    sync per superstep (one more per extra serial pass)."""
    ctx, fig, m = run.ctx, run.fig, run.m
    link = fig.link
    cost = ctx.costs[node.name]
    prec = precision_key(node, ctx)
    work = ctx.is_work(node)
    extra = serial.passes - 1  # each pass after the first: one more sync and broadcast exchange
    serial_comm_s = m * extra * serial.broadcast_bytes / fig.exchange_bw
    feed = max(float(cost.bytes), amp_stream_bytes(run, node, prec))  # the AMP's partials, where it runs
    comm_s = (link_bytes / link.bandwidth_bytes_per_s + link.latency_s * m) if link and link_bytes else 0.0
    return place_node(
        ctx,
        node,
        unit=unit_id,
        lane=lane,
        compute_s=compute_s(run, node, prec, used),
        memory_s=feed / (fig.sram_bw * used / fig.tiles),
        feed_bandwidth=fig.sram_bw * used / fig.tiles,  # the SRAM of the tiles it uses
        comm_s=cost.act_bytes_in / (fig.exchange_bw * used / fig.tiles) + comm_s + serial_comm_s,
        overhead_s=(fig.sync + fig.vertex_s) * m * (1 + extra) if work else 0.0,  # a sync and a vertex launch a pass
        feed_level=fig.sram.level,
        feed_bytes=feed,
        ridge=fig.ridge,
        allocation=used / fig.tiles / n_ipus if work else 0.0,
        micro_batches=m,
    )


def place_nodes(run: IpuRun, pipeline: Pipeline, plan: Plan) -> IpuTimes:
    """Step 2: every stage node as a superstep on its stage's lane of its IPU (``plan.node_plans``),
    in stage order, each matmul planned under its IPU's matmul proportion of tile memory; the
    lanes' times and tile use add up per IPU. A stage that returns to an IPU (the tied head on
    IPU 0) has a lane of its own: in each pipeline cycle the IPU runs both of its stages, for
    different micro-batches, so the head of one micro-batch does not hold up the embedding of the
    next; the IPU's cycle is its lanes' sum (`dabench_ir.emulate`: a pipelined step's period is
    its busiest unit's)."""
    ctx, fig, m = run.ctx, run.fig, run.m
    amps = run.options.matmul_proportion
    ipu_of = pipeline.ipu_of()
    crossed: set[tuple[str, int]] = set()  # (tensor, IPU) pairs already copied over an IPU-Link
    times = IpuTimes()
    seen: set[int] = set()  # the IPUs a stage ran on already
    for index, st in enumerate(pipeline.stages):
        k = st.ipu
        budget = (amps[k] if len(amps) > 1 else amps[0]) * fig.capacity
        unit_id = f"ipu{k}"
        lane = f"{unit_id}.stage{index}" if k in seen else unit_id
        seen.add(k)
        for node in st.nodes:
            used = tiles_for(run, node)
            serial = times.serials[node.name] = serial_plan(ctx, node, m, fig.gamma, budget)
            link_bytes = _link_bytes(run, node, k, ipu_of, crossed)
            times.link_bytes += link_bytes
            plan.node_plans[node.name] = np_ = _superstep(
                run, node, unit_id, lane, used, serial, link_bytes, pipeline.ipus
            )
            times.lane_s[k] = times.lane_s.get(k, 0.0) + np_.per_micro_batch_s
            times.busy_s[k] = times.busy_s.get(k, 0.0) + np_.per_micro_batch_s * m
            times.tile_weighted_s[k] = times.tile_weighted_s.get(k, 0.0) + np_.per_micro_batch_s * m * used / fig.tiles
    return times
