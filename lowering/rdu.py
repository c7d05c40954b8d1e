"""SambaNova RDU lowering: cut the graph into sections, each an on-chip pipeline.

``opt_level`` sets how much is fused into one section: O0 about one operator per
section, O1 one module (an attention, an MLP: ``module_key(node.scope)``), O3 greedy
fusion along topological order for as long as PCUs and PMUs last. Inside a section each
node is a pipeline stage on PCUs (allocated by work), its buffers on PMUs. Sections run
one after another; section weights and tensors crossing section boundaries go through
DDR at its bandwidth, and each section switch costs ``overheads.section_reconfig_s``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.lowering import Lowering, LoweringOptions
from dabench_ir.lowering._common import (
    LoweringContext,
    balance,
    module_key,
    place_node,
    value_bytes,
)
from dabench_ir.plan import Plan, Schedule, Unit

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.targets import Target

__all__ = ["LOWERING", "RduLowering", "RduOptions", "partition"]

logger = logging.getLogger(__name__)
_WHO = "rdu"


class _Demand:
    """PCU and PMU demand of nodes, from the target's arch knobs."""

    def __init__(self, ctx: LoweringContext, target: Target, micro_batches: int) -> None:
        self.ctx = ctx
        self.pcus = int(target.arch_value("pcus", target.num_units))
        self.pmus = int(target.arch_value("pmus", needed_by=_WHO))
        self.pmu_bytes = target.arch_value("pmu_bytes", needed_by=_WHO)
        self.min_pcus = int(target.arch_value("min_pcus_per_node", 1))
        self.m = micro_batches

    def pcu(self, node: Node) -> int:
        return self.min_pcus if self.ctx.is_work(node) else 0

    def pmu(self, node: Node) -> int:
        if not self.ctx.is_work(node):
            return 0
        cost = self.ctx.costs[node.name]
        buf = (cost.act_bytes_in + cost.act_bytes_out) / self.m
        return min(self.pmus, max(1, math.ceil(buf / self.pmu_bytes)))

    def fits(self, pcu: int, pmu: int) -> bool:
        return pcu <= self.pcus and pmu <= self.pmus


def partition(ctx: LoweringContext, demand: _Demand, opt_level: str) -> list[list[Node]]:
    """Sections (lists of nodes in topological order) for an opt level."""
    sections: list[list[Node]] = []
    pcu = pmu = 0
    key: str | None = None
    for node in ctx.graph.nodes:
        work = ctx.is_work(node)
        if not sections or not work:
            if not sections:
                sections.append([])
            sections[-1].append(node)  # bookkeeping ops ride with the current section
            if work:
                pcu, pmu, key = demand.pcu(node), demand.pmu(node), module_key(node)
            continue
        has_work = any(ctx.is_work(n) for n in sections[-1])
        np_, nm = demand.pcu(node), demand.pmu(node)
        if opt_level == "O0":
            split = has_work
        elif opt_level == "O1":
            split = has_work and (module_key(node) != key or not demand.fits(pcu + np_, pmu + nm))
        else:
            split = has_work and not demand.fits(pcu + np_, pmu + nm)
        if split:
            sections.append([node])
            pcu, pmu = np_, nm
        else:
            sections[-1].append(node)
            pcu, pmu = pcu + np_, pmu + nm
        key = module_key(node)
    return [s for s in sections if s]


@dataclass(frozen=True, slots=True, kw_only=True)
class RduOptions(LoweringOptions):
    """What the RDU lowering reads."""

    micro_batches: int | None
    opt_level: str


class RduLowering(Lowering):
    """SambaNova RDU: sections run one after another, each an on-chip pipeline fed from DDR."""

    name = "rdu"
    kinds = ("rdu",)
    Options = RduOptions

    def feed_level(self, target: Target) -> str:
        return "off-chip"

    def _lower(self, ctx: LoweringContext, target: Target, options: RduOptions) -> Plan:
        return _lower(ctx, target, options)


LOWERING = RduLowering()


def _lower(ctx: LoweringContext, target: Target, options: RduOptions) -> Plan:
    graph = ctx.graph
    m = options.micro_batches or ctx.batch
    demand = _Demand(ctx, target, m)
    peak = target.peak_flops(ctx.precision)
    pcu_peak = peak / demand.pcus
    ddr = target.memory(LOWERING.feed_level(target))
    bw = ddr.bandwidth_bytes_per_s
    ridge = peak / bw
    reconfig = target.overhead("section_reconfig_s")
    grain = target.arch_value("min_pcu_work_flops", 0.0)
    plan = ctx.plan(target, options, Schedule.SEQUENTIAL, micro_batches=m)
    sections = partition(ctx, demand, options.opt_level)
    section_of = {n.name: i for i, s in enumerate(sections) for n in s}
    graph_outputs = set(graph.outputs)
    ddr_total = 0
    for i, nodes in enumerate(sections):
        work_nodes = [n for n in nodes if ctx.is_work(n)]
        work_s = [ctx.costs[n.name].flops / pcu_peak for n in work_nodes]
        lo = [demand.pcu(n) for n in work_nodes]
        hi = [
            max(a, min(demand.pcus, math.ceil(ctx.costs[n.name].flops / m / grain))) if grain > 0 else demand.pcus
            for a, n in zip(lo, work_nodes, strict=True)
        ]
        sizes = balance(work_s, lo, hi, demand.pcus) or lo
        pcus_of = {n.name: p for n, p in zip(work_nodes, sizes, strict=True)}
        pmus_used = min(demand.pmus, sum(demand.pmu(n) for n in work_nodes))
        unit = Unit(id=f"section{i}", kind="rdu_section", nodes=[n.name for n in nodes])
        section_ddr = 0
        for node in nodes:
            cost = ctx.costs[node.name]
            ddr_bytes = cost.weight_bytes
            for v in node.inputs:  # tensors produced in another section (or graph inputs)
                value = graph.values.get(v) if v else None
                if value is None or value.kind.is_stored:
                    continue
                if value.producer is None or section_of.get(value.producer) != i:
                    ddr_bytes += value_bytes(graph, v)
            for v in node.outputs:  # tensors read by another section (or leaving the graph)
                readers = graph.consumers.get(v, [])
                if v in graph_outputs or any(section_of.get(c.name) != i for c in readers):
                    ddr_bytes += value_bytes(graph, v, cost.act_bytes_out // max(1, len(node.outputs)))
            p = pcus_of.get(node.name, 0)
            section_ddr += ddr_bytes
            plan.node_plans[node.name] = place_node(
                ctx,
                node,
                unit=unit.id,
                lane=f"{unit.id}/{node.name}",
                compute_s=cost.flops / (pcu_peak * p) if p else 0.0,
                memory_s=ddr_bytes / bw,
                feed_level=ddr.level,
                feed_bytes=ddr_bytes,
                ridge=ridge,
                allocation=p / demand.pcus,
                micro_batches=m,
            )
        pcus_used = sum(sizes)
        unit.allocation = pcus_used / demand.pcus
        unit.gap_before_s = reconfig if len(sections) > 1 else 0.0
        unit.gap_kind = "section_reconfig"
        unit.min_time_s = section_ddr / bw  # stages share the DDR bandwidth
        unit.resources = {
            "pcus": float(pcus_used),
            "pmus": float(pmus_used),
            "pmu_allocation": pmus_used / demand.pmus,
            "ddr_bytes": float(section_ddr),
        }
        ddr_total += section_ddr
        plan.units.append(unit)
    plan.traffic_bytes[ddr.name] = ddr_total
    resident = ctx.resident_bytes()
    plan.memory_bytes[ddr.name] = resident
    if target.has_memory("on-chip"):
        sram = target.memory("on-chip")
        plan.memory_bytes[sram.name] = int(
            max((u.resources["pmus"] for u in plan.units), default=0) * demand.pmu_bytes
        )
    if resident > ddr.capacity_bytes:
        plan.fail(
            f"weights and activations need {resident / 1e9:.1f} GB of DDR, the RDU has {ddr.capacity_bytes / 1e9:.1f} GB",
            resident,
            ddr.capacity_bytes,
        )
    plan.extra.update({"sections": len(sections), "opt_level": options.opt_level})
    return plan
