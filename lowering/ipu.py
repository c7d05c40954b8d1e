"""Graphcore IPU lowering: bulk-synchronous steps on tiles, layers pipelined over IPUs.

Each node is one BSP superstep on its IPU: a compute phase on the tiles its work spreads
over (one tile per ``arch.min_grain_flops``, so small ops use few tiles), a sync
(``overheads.sync_s``), and an exchange phase moving its input bytes between tiles at
``arch.exchange_bytes_per_s``. With ``ipus`` > 1, decoder blocks are split into
contiguous pipeline stages, one per IPU; tensors crossing a stage boundary go over
IPU-Links. All weights, live activations and code of a stage must fit in its IPU's tile
SRAM, else the plan does not fit. The most loaded IPU sets throughput.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering._common import (
    Block,
    LoweringContext,
    layer_blocks,
    peak_live_bytes,
    place_node,
    training_bytes,
    value_bytes,
    weight_bytes,
)
from dabench_ir.plan import Plan, Schedule, Unit

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.targets import Target

__all__ = ["LOWERING", "IpuLowering", "IpuOptions"]

logger = logging.getLogger(__name__)
_WHO = "ipu"


@dataclass(frozen=True, slots=True, kw_only=True)
class IpuOptions(LoweringOptions):
    """What the IPU lowering reads. Internal (no knob): ``steady_state`` overlaps
    consecutive steps in the pipeline (step time = the most loaded IPU)."""

    micro_batches: int | None
    ipus: int
    steady_state: bool = internal(True)


class IpuLowering(Lowering):
    """Graphcore IPU: BSP supersteps on tiles, decoder blocks pipelined over IPUs."""

    name = "ipu"
    kinds = ("ipu",)
    Options = IpuOptions

    def feed_level(self, target: Target) -> str:
        return "on-chip"

    def _lower(self, ctx: LoweringContext, target: Target, options: IpuOptions) -> Plan:
        return _lower(ctx, target, options)


LOWERING = IpuLowering()


def _lower(ctx: LoweringContext, target: Target, options: IpuOptions) -> Plan:
    graph = ctx.graph
    tiles = int(target.arch_value("tiles", target.num_units))
    peak = target.peak_flops(ctx.precision)
    tile_peak = peak / tiles
    sram = target.memory(LOWERING.feed_level(target))
    grain = target.arch_value("min_grain_flops", needed_by=_WHO)
    exchange_bw = target.arch_value("exchange_bytes_per_s", needed_by=_WHO)
    tile_sram = target.arch_value("tile_sram_bytes", sram.capacity_bytes / tiles)
    code_per = target.arch_value("code_bytes_per_tile_op", 0.0)
    sync = target.overhead("sync_s")
    link = target.link("ipu_link") or target.link()
    ridge = peak / sram.bandwidth_bytes_per_s
    m = options.micro_batches or ctx.batch

    def tiles_for(node: Node) -> int:
        """Tiles an operator spreads over: enough for its work (one micro-batch per superstep,
        at least ``grain`` FLOPs a tile) and enough to hold its tensors in tile SRAM."""
        cost = ctx.costs[node.name]
        by_work = math.ceil(cost.flops / m / grain)
        by_data = math.ceil(cost.bytes / m / tile_sram)
        return max(1, min(tiles, max(by_work, by_data)))

    blocks = layer_blocks(graph)
    block_time = [sum(_node_work_s(ctx, n, tiles_for(n), tile_peak, sram.bandwidth_bytes_per_s / tiles,
                                   exchange_bw, sync * m) for n in b.nodes) for b in blocks]
    block_w = [weight_bytes(ctx, b.nodes) + training_bytes(ctx, b.nodes) for b in blocks]
    block_code = [sum(tiles_for(n) * code_per for n in b.nodes if ctx.is_work(n)) for b in blocks]
    block_act = [math.ceil(peak_live_bytes(ctx, b.nodes) / m) for b in blocks]
    n_ipus = min(options.ipus, len(blocks)) if blocks else 1
    plan = ctx.plan(
        target, options, Schedule.CONCURRENT, micro_batches=m, chips=n_ipus, pipelined_steps=options.steady_state
    )
    if options.ipus > n_ipus:
        plan.notes.append(f"only {len(blocks)} pipeline stage(s) to place: {options.ipus - n_ipus} IPU(s) unused")
    stages = _split(blocks, block_time, block_w, block_code, block_act, n_ipus, sram.capacity_bytes)
    stage_of = {n.name: s for s, blk in enumerate(stages) for b in blk for n in b.nodes}
    for s, blk in enumerate(stages):
        nodes = [n for b in blk for n in b.nodes]
        unit = Unit(id=f"ipu{s}", kind="ipu", nodes=[n.name for n in nodes])
        busy = weighted = 0.0
        for node in nodes:
            cost = ctx.costs[node.name]
            used = tiles_for(node)
            work = ctx.is_work(node)
            compute_s = max(cost.flops / (tile_peak * used), cost.bytes / (sram.bandwidth_bytes_per_s * used / tiles))
            exchange_s = cost.act_bytes_in / exchange_bw
            link_bytes = 0
            for v in node.inputs:
                value = graph.values.get(v) if v else None
                if value is not None and value.producer is not None and stage_of.get(value.producer, s) != s:
                    link_bytes += value_bytes(graph, v)
            comm_s = (link_bytes / link.bandwidth_bytes_per_s + link.latency_s * m) if link and link_bytes else 0.0
            plan.node_plans[node.name] = np_ = place_node(
                ctx,
                node,
                unit=unit.id,
                compute_s=compute_s,
                comm_s=exchange_s + comm_s,
                overhead_s=sync * m if work else 0.0,
                feed_level=sram.level,
                feed_bytes=cost.bytes,
                ridge=ridge,
                allocation=used / tiles / n_ipus if work else 0.0,
                micro_batches=m,
            )
            total = np_.per_micro_batch_s * m
            busy += total
            weighted += total * used / tiles
        util = weighted / busy if busy > 0 else 0.0
        w = sum(block_w[blocks.index(b)] for b in blk)
        code = sum(block_code[blocks.index(b)] for b in blk)
        act = max((block_act[blocks.index(b)] for b in blk), default=0)
        resident = w + code + act
        unit.allocation = util / n_ipus
        unit.resources = {
            "tiles": float(tiles),
            "tile_utilisation": util,
            "sram_bytes": float(resident),
            "weight_bytes": float(w),
            "code_bytes": float(code),
            "activation_bytes": float(act),
        }
        plan.units.append(unit)
        plan.memory_bytes[f"{sram.name}:ipu{s}"] = int(resident)
        if resident > sram.capacity_bytes:
            plan.fail(
                f"IPU {s} needs {resident / 1e6:.0f} MB of tile SRAM (weights {w / 1e6:.0f} MB, "
                f"activations {act / 1e6:.0f} MB, code {code / 1e6:.0f} MB), an IPU has "
                f"{sram.capacity_bytes / 1e6:.0f} MB; {_more_ipus(blocks, block_w, block_act, block_code, sram.capacity_bytes, n_ipus)}",
                resident,
                sram.capacity_bytes,
            )
    plan.memory_bytes[sram.name] = sum(int(u.resources["sram_bytes"]) for u in plan.units)
    plan.traffic_bytes[sram.name] = sum(c.bytes for c in ctx.costs.values())
    plan.extra.update({"ipus": n_ipus, "stages": [[b.key for b in blk] for blk in stages]})
    return plan


def _node_work_s(
    ctx: LoweringContext, node: Node, used: int, tile_peak: float, tile_bw: float, exchange_bw: float, sync_s: float
) -> float:
    if not ctx.is_work(node):
        return 0.0
    cost = ctx.costs[node.name]
    return max(cost.flops / (tile_peak * used), cost.bytes / (tile_bw * used)) + cost.act_bytes_in / exchange_bw + sync_s


def _split(
    blocks: list[Block],
    time: list[float],
    weights: list[int],
    code: list[float],
    act: list[int],
    n: int,
    capacity: float,
) -> list[list[Block]]:
    """Contiguous stages minimising (SRAM overflow, time) of the worst stage, by dynamic programming."""
    nb = len(blocks)
    if n <= 1 or nb <= 1:
        return [blocks]

    def cost(i: int, j: int) -> tuple[float, float]:  # blocks i..j-1 as one stage
        mem = sum(weights[i:j]) + sum(code[i:j]) + max(act[i:j])
        return (max(0.0, mem - capacity), sum(time[i:j]))

    inf = (math.inf, math.inf)
    best = [[inf] * (nb + 1) for _ in range(n + 1)]
    cut = [[0] * (nb + 1) for _ in range(n + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, n + 1):
        for j in range(k, nb + 1):
            for i in range(k - 1, j):
                if best[k - 1][i] == inf:
                    continue
                cand = max(best[k - 1][i], cost(i, j))
                if cand < best[k][j]:
                    best[k][j], cut[k][j] = cand, i
    stages: list[list[Block]] = []
    j = nb
    for k in range(n, 0, -1):
        i = cut[k][j]
        stages.append(blocks[i:j])
        j = i
    return stages[::-1]


def _more_ipus(blocks, block_w, block_act, block_code, capacity: float, n_ipus: int) -> str:
    """What to try next: at least as many IPUs as the total footprint needs, if any number can do."""
    worst = max((w + a + c for w, a, c in zip(block_w, block_act, block_code, strict=True)), default=0)
    if worst > capacity:
        return "one decoder block alone exceeds an IPU's SRAM, so no pipeline split fits (try fp16 or a shorter sequence)"
    total = sum(block_w) + sum(block_act) + sum(block_code)
    need = max(n_ipus + 1, math.ceil(total / capacity))
    if need > len(blocks):
        return f"even one block per IPU needs {need} IPUs for {len(blocks)} blocks"
    return f"use more IPUs (ipus={need} or more)"
