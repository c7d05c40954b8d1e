"""Where each node runs: a Unit per section part, and each node's NodePlan on the one RDU lane."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.lowering.context import LoweringContext, place_node
from dabench_ir.plan import Unit, UnitStats
from dabench_ir.timeline import Bound

if TYPE_CHECKING:
    from dabench_ir.lowering.rdu.chip import Chip
    from dabench_ir.lowering.rdu.memory import Feed
    from dabench_ir.lowering.rdu.sections import Section
    from dabench_ir.lowering.rdu.timing import SectionTime
    from dabench_ir.plan import Plan

__all__ = ["RDU_LANE", "NodeRun", "Placement"]

RDU_LANE = "rdu"
"""The one lane every node of an RDU plan runs on: sections run one after another, each one pipeline."""


@dataclass(slots=True)
class NodeRun:
    """One node's runs summed (a node runs in its forward and its backward section, and in every
    part of a tiled group): its home ``unit`` (the first it runs in), then its time, compute
    seconds, DDR seconds and DDR bytes, each summed in run order from 0 as sum() adds."""

    unit: str
    time_s: float = 0
    compute_s: float = 0
    memory_s: float = 0
    feed_bytes: int = 0


class Placement:
    """Builds a plan's Units, section part by section part, and then its NodePlans.

    ``runs``: node -> its `NodeRun` (summed per node as the units are added: a list of runs
    zipped and summed per node was a tenth of an O0 lowering); ``bound``: unit -> what binds
    its section's pipeline (DDR traffic or compute).
    """

    def __init__(
        self, chip: Chip, feed: Feed, reconfig_s: float, micro_batches: int, *, accumulated: bool = False
    ) -> None:
        self.chip = chip
        self.feed = feed
        self.reconfig_s = reconfig_s
        self.micro_batches = micro_batches
        self.accumulated = accumulated
        self.launches = 0
        """Section launches the host makes a step: a unit's, once per pass over it (`passes`)."""
        self.runs: dict[str, NodeRun] = {}
        self.bound: dict[str, Bound] = {}
        self._next_unit = 0

    def passes(self, sec: Section) -> int:
        """How many times a step runs ``sec``: once per micro-batch when the step accumulates
        gradients (each micro-batch's forward and backward run whole, the optimizer once), else once
        (the micro-batches stream through the section in one run)."""
        return self.micro_batches if self.accumulated and sec.phase != "optimizer" else 1

    def add_section(self, plan: Plan, sec: Section, timed: SectionTime) -> None:
        """Append a Unit to ``plan`` for each part of ``sec`` (timed as ``timed``), and add each
        node's share of every part to its run."""
        chip, parts, passes = self.chip, sec.parts, self.passes(sec)
        ddr_bytes = timed.traffic.total
        pcus = min(timed.room, math.ceil(sec.pcus / parts))
        pmus = min(timed.room, math.ceil(sec.pmus / parts))
        for _part in range(parts):
            unit = Unit(
                id=f"section{self._next_unit}",
                kind="rdu_section",
                nodes=[n.name for n in sec.nodes],
                resources={
                    "phase_" + sec.phase: 1.0,
                    "pcus": float(pcus),
                    "pmus": float(pmus),
                    "pcu_allocation": pcus / chip.pcus,
                    "flops": timed.total_flops / parts,
                    "ddr_bytes": float(ddr_bytes / parts),
                    "compute_s": timed.compute_s / parts,
                    "ddr_s": timed.memory_s / parts,
                    "time_s": timed.work_s / parts,  # max(compute_s, ddr_s), or the stages' floors in a tiny section
                },
                stats=UnitStats(
                    pmu_allocation=pmus / chip.pmus,
                    load_imbalance=timed.load_imbalance,
                    feed_bytes=float(ddr_bytes / parts),
                ),
                allocation=pcus / chip.pcus,
                gap_before_s=self.reconfig_s * passes,  # a switch to the section at each pass
                gap_kind="section_reconfig",
            )
            self._next_unit += 1
            self.launches += passes
            self._add_runs(unit, sec, timed)
            plan.units.append(unit)
            self.bound[unit.id] = timed.bound

    def _add_runs(self, unit: Unit, sec: Section, timed: SectionTime) -> None:
        """Each node's share of one part of ``sec``: its seconds on ``unit`` (per micro-batch), and its run."""
        parts, bw = sec.parts, self.feed.bandwidth
        node_bytes = timed.traffic.per_node
        for n in sec.nodes:
            t = timed.node_s(n.name) / parts
            unit.node_s[n.name] = t / self.micro_batches
            nbytes = node_bytes.get(n.name, 0)
            run = self.runs.get(n.name)
            if run is None:
                run = self.runs[n.name] = NodeRun(unit.id)
            run.time_s += t
            run.compute_s += timed.busy[n.name] / parts
            run.memory_s += nbytes / bw / parts
            run.feed_bytes += nbytes // parts

    def place_nodes(self, ctx: LoweringContext, plan: Plan) -> None:
        """Every node's NodePlan, in graph order, from its summed runs.

        One lane for every node: the RDU runs one section at a time and a section is one pipeline,
        so nothing in a section overlaps anything else. A node runs in its forward and its backward
        section; a lane per home section would let a backward section's nodes from different
        forward sections overlap one another and end before the section's planned time.
        """
        allocation = {u.id: u.allocation for u in plan.units}
        feed = self.feed
        for node in ctx.graph.nodes:
            run = self.runs.get(node.name) or NodeRun("section0")  # in no section: no time, on the first
            home = run.unit
            plan.node_plans[node.name] = place_node(
                ctx,
                node,
                unit=home,
                lane=RDU_LANE,
                compute_s=run.compute_s,
                memory_s=run.memory_s,
                feed_level=feed.ddr.level,
                feed_bytes=run.feed_bytes,
                ridge=feed.ridge,
                allocation=allocation.get(home, 0.0),  # the PCUs of the section it runs in
                micro_batches=self.micro_batches,
                time_s=run.time_s,
                binds=self.bound.get(home),  # one pipeline: what binds the section binds each of its nodes
            )
