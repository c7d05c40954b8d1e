"""Cerebras WSE lowering: pipelined kernel regions, or weight streaming layer by layer.

Pipelined mode: every kernel (a node, or an elementwise chain fused onto its producer)
gets its own rectangular region of PEs; all run at once and activations stream between
regions. Regions are sized so kernels take near-equal time, but each region must hold
its kernel's weights and buffers in PE SRAM, is at least ``arch.min_region_pes`` PEs and
at most one PE per ``arch.min_pe_work_flops`` of one micro-batch's work. The slowest kernel sets
throughput. ``replicas`` copies of the model share the wafer (intra-chip data parallel).

Streaming mode: each decoder block in turn uses the whole wafer while its weights stream
in from external memory; blocks run one after another.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering._common import (
    LoweringContext,
    balance,
    kernel_groups,
    layer_blocks,
    peak_live_bytes,
    place_node,
    training_bytes,
    weight_bytes,
)
from dabench_ir.plan import Plan, Schedule, Unit

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.targets import Target

__all__ = ["LOWERING", "WseLowering", "WseOptions"]

logger = logging.getLogger(__name__)
_WHO = "wse"


@dataclass(frozen=True, slots=True, kw_only=True)
class WseOptions(LoweringOptions):
    """What the WSE lowering reads. ``replicas`` None means one copy.

    Internal (no knobs): ``fuse_elementwise`` fuses elementwise chains onto their producer's
    kernel; ``steady_state`` overlaps consecutive steps (step time = the slowest region).
    """

    micro_batches: int | None
    wse_mode: str
    replicas: int | str | None
    fuse_elementwise: bool = internal(True)
    steady_state: bool = internal(True)


class WseLowering(Lowering):
    """Cerebras WSE: pipelined kernel regions on PE SRAM, or weight streaming layer by layer."""

    name = "wse"
    kinds = ("wse",)
    Options = WseOptions

    def feed_level(self, target: Target) -> str:
        return "on-chip"

    def _lower(self, ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
        if options.wse_mode == "streaming":
            return _streaming(ctx, target, options)
        plan = _pipelined_best(ctx, target, options)
        if plan.fits or options.wse_mode == "pipelined":
            return plan
        reason = plan.failure.reason if plan.failure else "does not fit"
        streamed = _streaming(ctx, target, options)
        streamed.notes.insert(0, f"pipelined mode does not fit ({reason}); using weight streaming")
        return streamed


LOWERING = WseLowering()


# -- pipelined mode ----------------------------------------------------------------------
def _kernel_bytes(ctx: LoweringContext, group: list[Node], replicas: int, micro_batches: int) -> int:
    """Resident bytes of a kernel: its weights plus one micro-batch of its input/output buffers."""
    acts = sum(ctx.costs[n.name].act_bytes_in + ctx.costs[n.name].act_bytes_out for n in group)
    return weight_bytes(ctx, group) + training_bytes(ctx, group) + math.ceil(acts / replicas / micro_batches)


def _pipelined_best(ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
    if options.replicas != "auto":
        return _pipelined(ctx, target, options, int(options.replicas or 1))
    best: Plan | None = None
    for r in (d for d in range(1, ctx.batch + 1) if ctx.batch % d == 0):
        plan = _pipelined(ctx, target, options, r)
        if not plan.fits:
            break  # more copies only need more SRAM
        period = max((sum(plan.node_plans[n].per_micro_batch_s for n in u.nodes) for u in plan.units), default=0.0)
        period *= plan.micro_batches
        if best is None or period < best.extra["period_s"] * (1 - 1e-9):
            plan.extra["period_s"] = period
            best = plan
    return best if best is not None else _pipelined(ctx, target, options, 1)


def _pipelined(ctx: LoweringContext, target: Target, options: WseOptions, replicas: int) -> Plan:
    pes = target.num_units
    pe_peak = target.peak_flops(ctx.precision) / pes
    sram = target.memory(LOWERING.feed_level(target))
    pe_bw = sram.bandwidth_bytes_per_s / pes
    pe_sram = target.arch_value("pe_sram_bytes", needed_by=_WHO)
    min_region = int(target.arch_value("min_region_pes", needed_by=_WHO))
    pe_grain = target.arch_value("min_pe_work_flops", 0.0)
    ridge = target.peak_flops(ctx.precision) / sram.bandwidth_bytes_per_s
    m = options.micro_batches or max(1, math.ceil(ctx.batch / replicas))
    plan = ctx.plan(
        target, options, Schedule.CONCURRENT, micro_batches=m, replicas=replicas, pipelined_steps=options.steady_state
    )
    available = pes // replicas
    groups = kernel_groups(ctx, options.fuse_elementwise)
    work_s, min_pes, max_pes, resident = [], [], [], []
    for g in groups:
        flops = sum(ctx.costs[n.name].flops for n in g) / replicas
        moved = sum(ctx.costs[n.name].bytes for n in g) / replicas
        need = _kernel_bytes(ctx, g, replicas, m)
        lo = max(min_region, math.ceil(need / pe_sram))
        # a region works on one micro-batch at a time: its parallelism is one micro-batch's work
        hi = max(lo, math.ceil(flops / m / pe_grain)) if pe_grain > 0 else available
        work_s.append(max(flops / pe_peak, moved / pe_bw))
        min_pes.append(lo)
        max_pes.append(max(lo, min(hi, available)))
        resident.append(need)
    needed = sum(resident) * replicas
    plan.memory_bytes[sram.name] = needed
    plan.traffic_bytes[sram.name] = sum(c.bytes for c in ctx.costs.values())
    if needed > sram.capacity_bytes:
        plan.fail(
            f"pipelined mode needs {needed / 1e9:.2f} GB of PE SRAM for weights and buffers "
            f"({replicas} cop{'y' if replicas == 1 else 'ies'}), the wafer has {sram.capacity_bytes / 1e9:.2f} GB",
            needed,
            sram.capacity_bytes,
        )
    sizes = balance(work_s, min_pes, max_pes, available)
    if sizes is None:
        plan.fail(
            f"{len(groups)} kernels need at least {sum(min_pes) * replicas} PEs "
            f"(minimum regions and SRAM), the wafer has {pes}",
            needed,
            sram.capacity_bytes,
        )
        # still time it, as if the regions were squeezed onto the wafer in proportion, so
        # the figures of a plan that does not fit stay physical (never above peak)
        squeeze = available / sum(min_pes)
        sizes = [max(1, math.floor(p * squeeze)) for p in min_pes]
    placed = 0
    for k, (g, p) in enumerate(zip(groups, sizes, strict=True)):
        width = math.ceil(math.sqrt(p))
        height = math.ceil(p / width)
        unit = Unit(
            id=f"region{k}",
            kind="wse_region",
            nodes=[n.name for n in g],
            resources={
                "pes": float(p),
                "width": float(width),
                "height": float(height),
                "sram_bytes": float(resident[k]),
                "weight_bytes": float(weight_bytes(ctx, g)),
                "replicas": float(replicas),
            },
            allocation=p * replicas / pes,
        )
        placed += p
        plan.units.append(unit)
        for node in g:
            cost = ctx.costs[node.name]
            plan.node_plans[node.name] = place_node(
                ctx,
                node,
                unit=unit.id,
                compute_s=cost.flops / replicas / (pe_peak * p),
                memory_s=cost.bytes / replicas / (pe_bw * p),
                feed_level=sram.level,
                feed_bytes=cost.bytes,
                ridge=ridge,
                allocation=p * replicas / pes,
                micro_batches=m,
            )
    plan.extra.update({"mode": "pipelined", "pes_placed": placed * replicas, "pes": pes})
    return plan


# -- weight-streaming mode -----------------------------------------------------------------
def _streaming(ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
    pes = target.num_units
    peak = target.peak_flops(ctx.precision)
    sram = target.memory("on-chip")
    ext = target.memory("off-chip")
    pe_grain = target.arch_value("min_pe_work_flops", 0.0)
    switch = target.overhead("layer_switch_s")
    pe_sram = target.arch_value("pe_sram_bytes", needed_by=_WHO)
    sram_ridge = peak / sram.bandwidth_bytes_per_s
    ext_ridge = peak / ext.bandwidth_bytes_per_s
    plan = ctx.plan(target, options, Schedule.SEQUENTIAL)
    if options.replicas not in (None, 1, "auto"):
        plan.notes.append("replicas apply to pipelined mode only; weight streaming uses one copy")
    blocks = layer_blocks(ctx.graph)
    worst_resident = 0
    for b, block in enumerate(blocks):
        unit = Unit(id=f"layer{b}" if block.key.startswith("layer") else block.key, kind="wse_layer")
        unit.gap_before_s = switch if len(blocks) > 1 else 0.0
        unit.gap_kind = "layer_switch"
        busy = weighted = 0.0
        for node in block.nodes:
            cost = ctx.costs[node.name]
            # a layer's operator spreads over enough PEs for its work and to hold its
            # activations in PE SRAM (a zero-FLOP transpose still moves its bytes in parallel)
            by_data = math.ceil((cost.act_bytes_in + cost.act_bytes_out) / pe_sram)
            used = min(pes, max(1, math.ceil(cost.flops / pe_grain), by_data)) if pe_grain > 0 else pes
            frac = used / pes
            compute_s = cost.flops / (peak * frac)
            act = cost.act_bytes_in + cost.act_bytes_out
            sram_s = act / (sram.bandwidth_bytes_per_s * frac)
            stream_s = cost.weight_bytes / ext.bandwidth_bytes_per_s
            if stream_s > max(compute_s, sram_s):
                level, feed, ridge = ext.level, cost.weight_bytes, ext_ridge
            else:
                level, feed, ridge = sram.level, cost.bytes, sram_ridge
            unit.nodes.append(node.name)
            plan.node_plans[node.name] = np_ = place_node(
                ctx,
                node,
                unit=unit.id,
                compute_s=compute_s,
                memory_s=max(sram_s, stream_s),
                feed_level=level,
                feed_bytes=feed,
                ridge=ridge,
                allocation=frac if ctx.is_work(node) else 0.0,
            )
            t = np_.per_micro_batch_s
            busy += t
            weighted += t * frac
        unit.allocation = weighted / busy if busy > 0 else 0.0
        unit.resources = {"pes": float(pes), "weight_bytes": float(weight_bytes(ctx, block.nodes))}
        resident = max(
            (weight_bytes(ctx, [n]) for n in block.nodes), default=0
        ) + peak_live_bytes(ctx, block.nodes)
        worst_resident = max(worst_resident, resident)
        plan.units.append(unit)
    total_w = weight_bytes(ctx)
    plan.memory_bytes = {sram.name: worst_resident, ext.name: total_w}
    plan.traffic_bytes = {ext.name: sum(c.weight_bytes for c in ctx.costs.values())}
    if worst_resident > sram.capacity_bytes:
        plan.fail(
            f"weight streaming needs {worst_resident / 1e9:.2f} GB of SRAM for one layer's activations "
            f"and largest weight, the wafer has {sram.capacity_bytes / 1e9:.2f} GB",
            worst_resident,
            sram.capacity_bytes,
        )
    if total_w > ext.capacity_bytes:
        plan.fail(f"weights ({total_w / 1e9:.1f} GB) exceed {ext.name}", total_w, ext.capacity_bytes)
    plan.extra["mode"] = "streaming"
    return plan
