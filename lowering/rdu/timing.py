"""How long a section takes: the compiled tiles' rates, each node's seconds, the pipeline, DDR traffic.

A node's seconds are its Cost in three parts at the tiles' rates (`Rates`); a contraction's
rate depends on its reduction depth (`reduction_depths`, `backward_contraction_s`). A section
is one pipeline that lasts its slowest stage (`pipeline_s`), or its DDR traffic, whichever is
longer (`SectionTimer`); its time is then shared out over its stages (`SectionTime.node_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from dabench_ir.errors import TargetError, UnboundSymbolError
from dabench_ir.ir import Cost, DType
from dabench_ir.lowering.rdu.chip import NEEDED_BY
from dabench_ir.lowering.rdu.sections import phase_cost
from dabench_ir.lowering.rdu.stats import section_load_imbalance
from dabench_ir.passes import meta
from dabench_ir.timeline import Bound

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.rdu.chip import Chip
    from dabench_ir.lowering.rdu.memory import Feed, SectionTraffic
    from dabench_ir.lowering.rdu.sections import Section, SectionLayout
    from dabench_ir.targets import Target

__all__ = [
    "CoreForward",
    "Depths",
    "NodeTimer",
    "Rates",
    "SectionTime",
    "SectionTimer",
    "Stage",
    "TileFloor",
    "backward_contraction_s",
    "balanced_s",
    "core_forwards",
    "pipeline_s",
    "reduction_depths",
]


class Depths(NamedTuple):
    """A contraction's reduction depths: the forward's ``k``, the backward dA's ``n`` (the
    output's last dim) and the backward dB's ``rows``."""

    k: float
    n: float
    rows: float


def reduction_depths(ctx: LoweringContext, node: Node) -> Depths | None:
    """A contraction's reduction depths: the forward's K, and the two backward GEMMs' (dA = dC·Bᵀ
    reduces over N, the output's last dim; dB = Aᵀ·dC over the rows, every token when B is a
    weight, else the per-matrix rows M). None when the node contracts nothing or its shape is unknown."""
    cost = ctx.costs[node.name]
    if cost.contraction_flops <= 0:  # most nodes: asked first, before the output is looked for
        return None
    out = next((v for v in node.outputs if v), None)
    if out is None:
        return None
    fwd = phase_cost(node, "forward", cost)
    try:
        dims = ctx.graph.type_of(out).dims()
    except UnboundSymbolError:  # an unknown rank or a free symbol: no shape to tile
        return None
    numel = math.prod(dims) if dims else 0
    if not numel or not dims:
        return None
    k = fwd.contraction_flops / (2 * numel)
    n = float(dims[-1])
    b = node.inputs[1] if len(node.inputs) > 1 else None
    rows = numel / n if b in ctx.stored else float(dims[-2] if len(dims) > 1 else 1)
    return Depths(max(k, 1.0), n, rows)


@dataclass(frozen=True, slots=True)
class Rates:
    """What the compiled tiles sustain per op class: contraction FLOPs on PCUs in systolic mode,
    vector FLOPs and special-function ops on PCUs in SIMD mode (`Target.rate`:
    ``[compute.vector_flops]``, ``[compute.special_ops]``).

    A contraction runs at ``contraction · K / (K + k_half)``: the PCU reduces along its lanes
    (the cross-lane reduction tree, SN40L at Hot Chips 2024) and each output vector pays the
    tree's drain and its write-back once, amortised over the reduction depth K. ``contraction``
    is the tiles' peak times the fitted asymptotic share ``pcu_efficiency``; ``k_half``
    is the fitted ``arch.pcu_k_half`` (the depth at which half the asymptotic rate is reached).
    """

    contraction: float
    vector: float
    special: float
    k_half: float = 0.0

    @classmethod
    def of(cls, target: Target, precision: DType, chip: Chip) -> Rates:
        """The rates of ``chip``'s compiled tiles on ``target`` at ``precision`` (at any compile mode:
        what a mode changes is the sections and the PCUs they hold, `sections` and `pipeline_s`)."""
        eff = target.arch_value("pcu_efficiency", needed_by=NEEDED_BY)
        peak = target.peak_flops(precision)
        share = chip.share
        return cls(
            contraction=peak * share * eff,  # systolic PCUs at the fitted achieved fraction
            vector=target.rate("vector", precision) * share,
            special=target.rate("special", precision) * share,
            k_half=target.arch_value("pcu_k_half", 0.0),
        )

    def shape(self, k: float) -> float:
        """Share of the asymptotic contraction rate a GEMM of reduction depth ``k`` reaches."""
        return k / (k + self.k_half) if self.k_half > 0 else 1.0

    def time(self, cost: Cost, k: float | None = None) -> float:
        """Seconds of ``cost``: each of its three parts at its own rate.

        ``k``: the forward contraction's reduction depth K (`reduction_depths`; None: the asymptotic
        rate); a backward's split over its GEMMs is `backward_contraction_s`."""
        t = 0  # from int 0, as a sum of the parts
        if cost.vector_flops and self.vector > 0:
            t += cost.vector_flops / self.vector
        if cost.special_ops and self.special > 0:
            t += cost.special_ops / self.special
        c = cost.contraction_flops
        if not c or self.contraction <= 0:
            return t
        if k is None:
            return t + c / self.contraction
        return t + c / (self.contraction * self.shape(k))


def backward_contraction_s(rates: Rates, c: float, k: float, n: float, rows: float, fwd: float | None = None) -> float:
    """A backward's contraction seconds: dA (depth N) and dB (depth rows), each one forward's FLOPs;
    with FLOPs for one gradient only, the weight's (dB) when there is one; the rest at depth K."""
    one = fwd if fwd else c / 2  # FLOPs of one backward GEMM: the forward's
    parts = [(min(c, one), rows), (min(max(c - one, 0.0), one), n), (max(c - 2 * one, 0.0), k)]
    return sum(f / (rates.contraction * rates.shape(d)) for f, d in parts if f > 0)


class Stage(NamedTuple):
    """One stage of a section's pipeline: the ``seconds`` its work takes on all the compiled
    tiles' PCUs, and the ``pcus`` it demands."""

    seconds: float
    pcus: int


def pipeline_s(stages: list[Stage], room: int, pcus: int) -> float:
    """A section's compute seconds as one pipeline whose slowest stage sets the pace.

    ``stages``: (seconds the stage's work takes on all ``pcus`` PCUs of the compiled tiles, its
    PCU demand). The compiler sizes each stage by its memory (a PCU per PMU it needs: `Demand`),
    not by its FLOPs, and a stage computes on the PCUs it holds: stage i takes
    ``t_i · pcus / p_i``. The section's PCUs are its allocation (`Section.pcus`, the DABench
    allocation ratio), so no stage runs faster than its own PCUs' peak. A group above the
    ``room`` (every unit, for a group tiled into parts) holds the room in proportion to its
    demand, ``p_i · room / Σp`` each. Every stage streams the same samples, so the section lasts
    its longest stage: ``max(t_i / p_i) · pcus · max(1, Σp / room)``.
    """
    if not stages:
        return 0.0
    held = 0  # sum(max(1, p)) and max(t / max(1, p)) in one loop (two generators were most of its time)
    slowest = None
    for t, p in stages:
        p = p if p > 1 else 1
        held += p
        if slowest is None or t / p > slowest:
            slowest = t / p
    return pcus * slowest * max(1.0, held / room)


def balanced_s(stages: list[Stage], room: int, pcus: int) -> float:
    """A section's compute seconds when its stages hold PCUs in proportion to their work.

    A tuned mapping (SambaNova's human-decision files: each operator's tiling and PCUs set by hand)
    shares the section's PCUs (its demand ``Σp``, at most the ``room``) out by work, so every stage
    takes ``Σt · pcus / min(Σp, room)``: the pipeline at its balanced time on the PCUs it holds,
    which `pipeline_s` reaches only when work follows memory demand.
    """
    held = sum(max(1, p) for _, p in stages)
    return pcus / min(room, held) * sum(t for t, _ in stages) if stages else 0.0


class NodeTimer:
    """A node's seconds in one phase at the compiled tiles' ``rates``: a forward contraction at its
    depth K, a backward's two GEMMs at theirs (`backward_contraction_s`), the optimizer at the
    asymptotic rate. Each node's `reduction_depths` is found once."""

    def __init__(self, ctx: LoweringContext, rates: Rates) -> None:
        self.ctx = ctx
        self.rates = rates
        self._depths: dict[str, Depths | None] = {}

    def depths(self, node: Node) -> Depths | None:
        """``node``'s `reduction_depths`, found on first asking."""
        name = node.name
        if name not in self._depths:
            self._depths[name] = reduction_depths(self.ctx, node)
        return self._depths[name]

    def seconds(self, node: Node, phase: str) -> float:
        """``node``'s seconds in ``phase`` on all the compiled tiles."""
        d = self.depths(node)
        cost = phase_cost(node, phase, self.ctx.costs[node.name])
        if d is None or phase == "optimizer":
            return self.rates.time(cost)
        if phase == "forward":
            return self.rates.time(cost, d.k)
        fwd = phase_cost(node, "forward", self.ctx.costs[node.name]).contraction_flops
        t = self.rates.time(Cost(vector_flops=cost.vector_flops, special_ops=cost.special_ops))
        return t + backward_contraction_s(self.rates, cost.contraction_flops, d.k, d.n, d.rows, fwd=fwd)


class TileFloor:
    """The least seconds the compiled tiles need for a node's work: each op class at its own peak
    rate on the tiles' share of the chip (contraction FLOPs at the peak, not at the fitted
    ``pcu_efficiency``; vector FLOPs and special-function ops at their SIMD rates), the classes
    adding as `Target.compute_time` rules. A node computing in an integer dtype, or one the target
    gives no peak for, is floored at the plan's precision. No stage of a section runs faster."""

    def __init__(self, ctx: LoweringContext, target: Target, share: float) -> None:
        self.ctx = ctx
        self.target = target
        self.share = share

    def seconds(self, node: Node, cost: Cost) -> float:
        """The least seconds ``cost`` (``node``'s work in one phase) takes on the tiles."""
        dt = self.ctx.node_precision(node)
        try:
            return self.target.compute_time(cost, dt if dt.is_float else self.ctx.precision) / self.share
        except TargetError:
            return self.target.compute_time(cost, self.ctx.precision) / self.share


@dataclass(slots=True)
class CoreForward:
    """One attention core's forward, which its backward section runs again (recompute): its nodes
    in order, their FLOPs and their seconds."""

    flops: int = 0
    seconds: float = 0.0
    least_s: float = 0.0  # its work at the tiles' peak rates (`TileFloor`)
    nodes: list[Node] = field(default_factory=list)


def core_forwards(
    ctx: LoweringContext, cores: dict[str, int], timer: NodeTimer, floor: TileFloor
) -> dict[int, CoreForward]:
    """Core id -> its `CoreForward` (``cores``: node -> core id), gathered once for every backward
    section (a scan of every core per section was quadratic). A node whose backward cost holds its
    forward already (`passes.meta.RECOMPUTED`: ``--recompute selective`` or ``full``) is the same
    recompute, counted there once."""
    out: dict[int, CoreForward] = {}
    for name, cid in cores.items():
        node = ctx.graph.node(name)
        if node.meta.get(meta.RECOMPUTED):
            continue
        fwd = phase_cost(node, "forward", ctx.costs[name])
        core = out.get(cid)
        if core is None:
            core = out[cid] = CoreForward()
        core.flops += fwd.flops
        core.seconds += timer.seconds(node, "forward")
        core.least_s += floor.seconds(node, fwd)
        core.nodes.append(node)
    return out


@dataclass(slots=True)
class SectionTime:
    """One section's time and how it is shared out over its nodes (all its parts together).

    ``flops`` and ``busy``: each node's FLOPs and seconds alone on the tiles (a backward core's
    first node also carries the core's recomputed forward); ``compute_s``: the pipeline
    (`pipeline_s`) on ``room`` PCUs; ``memory_s``: its DDR traffic at the DDR bandwidth;
    ``work_s``: the larger, or the stages' ``floors`` summed in a tiny section; ``weights``:
    what each working node would take alone (``wsum`` their sum), by which ``rest`` (``work_s``
    less the floors) is shared out.
    """

    traffic: SectionTraffic
    flops: dict[str, int]
    busy: dict[str, float]
    total_flops: int
    room: int
    compute_s: float
    memory_s: float
    work_s: float
    floors: dict[str, float]
    weights: dict[str, float]
    wsum: float
    rest: float
    load_imbalance: float

    def node_s(self, name: str) -> float:
        """Node ``name``'s share of the section's time: its floor, then its weight's share of the rest."""
        return self.floors.get(name, 0.0) + self.rest * self.weights.get(name, 0.0) / self.wsum

    @property
    def bound(self) -> Bound:
        """What binds the section's pipeline: its DDR traffic or its compute."""
        return Bound.MEMORY if self.memory_s > self.compute_s else Bound.COMPUTE


@dataclass(slots=True)
class _NodeWork:
    """Each node's FLOPs and seconds in one section, and each working node's bytes through the PMUs
    (in seconds at the SRAM bandwidth)."""

    flops: dict[str, int] = field(default_factory=dict)
    busy: dict[str, float] = field(default_factory=dict)
    least_s: dict[str, float] = field(default_factory=dict)  # a working node's work at the tiles' peak rates
    through_pmus: dict[str, float] = field(default_factory=dict)
    working: list[Node] = field(default_factory=list)


class SectionTimer:
    """Times the sections of one plan: their pipelines, their DDR traffic, and each node's share.

    ``tuned``: the stages hold PCUs by their work (`balanced_s`, SambaNova's tuned mapping), else by
    their memory demand (`pipeline_s`, the compiler's own)."""

    def __init__(
        self,
        ctx: LoweringContext,
        chip: Chip,
        layout: SectionLayout,
        timer: NodeTimer,
        floor: TileFloor,
        feed: Feed,
        *,
        tuned: bool = False,
    ) -> None:
        self.tuned = tuned  # stages hold PCUs by their work (`balanced_s`), not by their memory demand
        self.ctx = ctx
        self.chip = chip
        self.layout = layout
        self.timer = timer
        self.floor = floor
        self.feed = feed
        self.cores = core_forwards(ctx, layout.cores, timer, floor)

    def time(self, sec: Section, traffic: SectionTraffic) -> SectionTime:
        """The time of ``sec``, whose DDR traffic is ``traffic`` (`section_ddr`)."""
        work = self._node_work(sec)
        demand = self.layout.demand
        stages = [Stage(work.busy[n.name], demand.pcu(n, sec.phase)) for n in sec.nodes if work.busy[n.name] > 0]
        if sec.phase == "backward":
            self._recompute(sec, work, stages)
        total_flops = sum(work.flops.values())
        room = self.chip.units if sec.oversized else self.chip.capacity  # a split group is tiled over every unit
        compute_s = (balanced_s if self.tuned else pipeline_s)(stages, room, self.chip.pcus)
        bw = self.feed.bandwidth
        memory_s = traffic.total / bw
        # the section's time is shared out over its stages (one pipeline, reported per node):
        # first each stage's floor, what its own DDR stream and its work at the tiles' peak rates need,
        # then the rest by what it would take alone (its FLOPs on the PCUs plus its bytes through
        # the PMUs, so a data-movement stage or one with an estimated cost holds a share too)
        weights = {name: work.busy[name] + pmu_s for name, pmu_s in work.through_pmus.items()}
        wsum = sum(weights.values()) or 1
        floors = {n.name: max(traffic.per_node.get(n.name, 0) / bw, work.least_s[n.name]) for n in work.working}
        # the floors fit in all but tiny sections (the DDR streams add up to the section's, the
        # work at the peak rates to pcu_efficiency of its compute); where they do not, the section
        # lasts their sum: no stage streams or computes faster than the chip can
        floor_s = sum(floors.values())
        work_s = max(compute_s, memory_s, floor_s)
        return SectionTime(
            traffic=traffic,
            flops=work.flops,
            busy=work.busy,
            total_flops=total_flops,
            room=room,
            compute_s=compute_s,
            memory_s=memory_s,
            work_s=work_s,
            floors=floors,
            weights=weights,
            wsum=wsum,
            rest=work_s - floor_s,
            load_imbalance=section_load_imbalance(demand, sec, work.flops),
        )

    def _node_work(self, sec: Section) -> _NodeWork:
        """Each node's FLOPs, seconds and PMU seconds in ``sec``: its phase cost read once for all three."""
        ctx, sram_bw = self.ctx, self.feed.sram_bandwidth
        work = _NodeWork()
        for n in sec.nodes:
            if ctx.is_work(n):
                cost = phase_cost(n, sec.phase, ctx.costs[n.name])
                work.flops[n.name] = cost.flops
                work.busy[n.name] = self.timer.seconds(n, sec.phase)
                work.least_s[n.name] = self.floor.seconds(n, cost)
                work.through_pmus[n.name] = cost.bytes / sram_bw
                work.working.append(n)
            else:
                work.flops[n.name], work.busy[n.name] = 0, 0.0
        return work

    def _recompute(self, sec: Section, work: _NodeWork, stages: list[Stage]) -> None:
        """Recompute: each attention core's forward runs again inside its backward section; its FLOPs
        and seconds go to the core's first node there, its forward nodes become stages of this section."""
        cores, demand = self.layout.cores, self.layout.demand
        for cid in {cores[n.name] for n in sec.nodes if n.name in cores}:
            core = self.cores.get(cid)
            if core is None:  # every node of it recomputed already (`core_forwards`)
                continue
            first = next(n for n in sec.nodes if cores.get(n.name) == cid)
            work.flops[first.name] += core.flops
            work.busy[first.name] += core.seconds
            work.least_s[first.name] += core.least_s
            # its forward nodes: stages of this section
            stages += [Stage(self.timer.seconds(c, "forward"), demand.pcu(c, "forward")) for c in core.nodes]
