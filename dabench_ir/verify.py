"""Physics verifiers: invariants that hold on any real machine, checked on a finished `Report`.

`verify(report)` returns every `Violation` of the invariants below; `check(report)` raises a
`PhysicsError` carrying the first. Each check reads only the numbers the report already carries
(its node records, totals, metrics, role rows, the lowering's `Plan` for feed levels and bytes,
the `Target` for peaks, bandwidths and power) and recomputes nothing of the model. A tolerance
of `RTOL` (relative) absorbs rounding; nodes with zero time or zero work are skipped.

Invariant names (`Violation.invariant`), each a limit no real machine exceeds:

``node_peak_flops``
    a node's achieved FLOP/s (FLOPs / its busy time) <= the peak FLOP/s at the dtype it
    computes in x the chips the plan spans;
``node_class_rate``
    a node's vector FLOPs and its special-function ops per second <= their op class's rate
    (`Target.rate`, at the node's dtype or the plan's, whichever is faster) x the chips: an
    elementwise op cannot borrow the contraction units' peak;
``step_peak_flops``
    the step's achieved FLOP/s (``totals``) <= the highest peak among the node dtypes x chips;
``node_feed_bandwidth``
    a node's bytes/s at the memory level that feeds it (feed bytes / busy time) <= that
    level's bandwidth x chips;
``memory_capacity``
    resident bytes <= capacity at every memory level, when the plan says it fits;
``step_time_work``
    step time >= total FLOPs / (peak x chips);
``step_time_critical_path``
    step time >= the roofline lower bound (max(FLOPs / peak, each op class's work / its rate,
    feed bytes / bandwidth)) of the
    largest single node (the optimizer update's over the step's chips, which may each update their
    own parameters) and, when steps do not overlap and every node runs once per step, of the
    heaviest dependency chain;
``node_power``
    a node's energy <= rated power x chips x its busy time;
``step_power``
    the step's energy <= rated power x chips x the step time;
``energy_sum``
    the step's energy is its dynamic (the links' energy among it) and static parts' sum;
``energy_floor``
    its dynamic and static energy >= every chip's static power x the step time (a multi-chip
    step's energy is its chips', not one chip's);
``shares_sum``
    the shares a table states as shares of one total (role rows, the representative layer's
    rows) sum to 100 % on their basis;
``roofline_point``
    every point the roofline plot draws (intensity, FLOPs / time) is at or below its roof:
    min(peak at the report's precision, intensity x the bandwidth of the node's feed level);
``times_valid``
    every time the report states (a node's, emulated or measured; a row no node owns) is a finite,
    non-negative number of seconds;
``speedup_linear``
    a multi-chip point's speedup over one chip <= its chips, unless the point names the
    mechanism that lets it exceed them (``superlinear``: ZeRO sharding the optimizer's work);
``stage_weight_reads``
    a pipeline whose chips read their weights from memory every step (a GPU's HBM): its busiest
    stage is busy at least as long as the stage holding the most weights takes to read them once
    a micro-batch at its memory's bandwidth.

Light by design (no torch, no onnxruntime, no matplotlib): `dabench_ir.run.execute` may run it
after every profile.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from dabench_ir.errors import TargetError
from dabench_ir.passes import meta
from dabench_ir.passes.training import is_optimizer_step
from dabench_ir.schema import finite_float

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.plan import Plan
    from dabench_ir.report.model import NodeRecord, Report
    from dabench_ir.scaling import ScaleResult
    from dabench_ir.targets import Target
    from dabench_ir.timeline import Timeline

__all__ = [
    "INVARIANTS",
    "RTOL",
    "PhysicsError",
    "Violation",
    "check",
    "check_scaled",
    "check_step",
    "verify",
]

RTOL = 1e-6
"""Relative tolerance of every check: ``value <= limit * (1 + RTOL)``; shares within 1e-6 of 1."""

INVARIANTS = (
    "node_peak_flops",
    "node_class_rate",
    "step_peak_flops",
    "node_feed_bandwidth",
    "memory_capacity",
    "step_time_work",
    "step_time_critical_path",
    "node_power",
    "step_power",
    "energy_sum",
    "energy_floor",
    "speedup_linear",
    "stage_weight_reads",
    "shares_sum",
    "roofline_point",
    "times_valid",
)
"""Every invariant `verify` checks, by name (see the module docstring)."""
LOWER_BOUNDS = frozenset({"stage_weight_reads"})
"""Invariants beside the ``step_time_*`` ones whose limit is a lower bound: their value is a time."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its name, where (a node, ``step``, a memory level, a table), the
    report's number and the limit it breaks, and a line saying how the limit was made.

    For the lower bounds (``step_time_*``, `LOWER_BOUNDS`) ``value`` is the time and ``limit`` the
    bound it falls under; for ``shares_sum`` ``value`` is the sum and ``limit`` 1.0."""

    invariant: str
    where: str
    value: float
    limit: float
    detail: str = ""

    def __str__(self) -> str:
        lower = self.invariant.startswith("step_time") or self.invariant in LOWER_BOUNDS
        op = "<" if lower else ("!=" if self.invariant == "shares_sum" else ">")
        more = f" ({self.detail})" if self.detail else ""
        return f"{self.invariant} at {self.where}: {self.value:.6g} {op} {self.limit:.6g}{more}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "where": self.where,
            "value": self.value,
            "limit": self.limit,
            "detail": self.detail,
        }


class PhysicsError(RuntimeError):
    """A report breaks an invariant no real machine breaks: a modelling bug, not the user's input.

    ``violation`` is the first `Violation` found (`check`)."""

    def __init__(self, violation: Violation) -> None:
        self.violation = violation
        super().__init__(f"physics check failed: {violation}")


def check(report: Report) -> Report:
    """``report`` when it keeps every invariant; else raise `PhysicsError` with the first violation."""
    for violation in _violations(report):
        raise PhysicsError(violation)
    return report


def check_step(graph: Graph, target: Target, plan: Plan, timeline: Timeline) -> None:
    """The step of a placement whose report is not built (`dabench_ir.run.Placed`, a why line's
    variant run): ``step_time_work`` with the step's FLOPs (the costed nodes', times the plan's
    replicas: every copy's, as the report's ``step_flops``) at the target's highest peak x the
    plan's chips, a bound whatever dtype each node computes in. Raises `PhysicsError`. The
    node-level invariants are checked on every report the same lowering gives (`check`)."""
    step = finite_float(timeline.step_time_s)
    if step is None or step <= 0:
        return
    copy = sum(float(c.flops) for c in map(meta.attributed_cost, graph.nodes) if c is not None)
    flops = copy * max(1, int(plan.replicas or 1))
    chips = max(1, int(plan.chips or 1))
    peak = max(q.value for q in target.peaks.values()) * chips
    if flops > 0 and _above(flops / peak, step):
        raise PhysicsError(
            Violation(
                invariant="step_time_work",
                where="step",
                value=step,
                limit=flops / peak,
                detail=f"{flops:.6g} FLOPs at the highest peak x {chips} chip(s)",
            )
        )


def check_scaled(result: ScaleResult) -> None:
    """The points of a placement over several chips whose report is not built (the fitting
    search's try over more chips, a why line's): ``speedup_linear`` over its points, and
    `check_step` of each point's one-chip placement (a tensor-parallel share, a replica's run).
    Raises `PhysicsError`. The report, when built, is checked whole (`check`)."""
    for violation in (*_speedups(result.to_dict()), *_stage_weight_reads(result)):
        raise PhysicsError(violation)
    for chip in (point.chip for point in result.points):
        if chip is not None and chip.run is not None and chip.plan is not None and chip.timeline is not None:
            check_step(chip.graph, chip.run.target, chip.plan, chip.timeline)


def verify(report: Report) -> list[Violation]:
    """Every violation of the invariants (`INVARIANTS`) in ``report``; empty when it is physical."""
    return list(_violations(report))


# -- the checks ----------------------------------------------------------------------------------


def _above(value: float, limit: float) -> bool:
    return value > limit * (1.0 + RTOL)


def _column(values: Iterable[Any]) -> np.ndarray:
    """A float column with NaN where a value is missing or not finite."""
    return np.array([math.nan if (f := finite_float(v)) is None else f for v in values], dtype=np.float64)


class _Context:
    """What the checks read from a report: its target, plan, chips, and each dtype's limits."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.target = report.target_obj
        self.plan = report.plan
        self.node_plans: Mapping[str, Any] = getattr(self.plan, "node_plans", None) or {}
        self.plan_chips = max(1, int(getattr(self.plan, "chips", 1) or 1))
        self.step_chips = max(self.plan_chips, int(report.config.get("chips") or 1))
        self.precision = str(report.config.get("precision") or getattr(self.plan, "precision", "") or "fp32")
        self.plan_dtype = str(getattr(self.plan, "precision", "") or self.precision)  # a node's without its own
        self.peak = functools.cache(self._peak)
        self.rate = functools.cache(self._rate)
        self.bandwidth = functools.cache(self._bandwidth)

    def _peak(self, dtype: str | None) -> float:
        """Peak FLOP/s of one chip at ``dtype``; a dtype the target lists no peak for gets its
        highest peak (a bound no node exceeds whatever units it runs on)."""
        return float(self.target.peak_bound(str(dtype or self.precision)))

    def _rate(self, op_class: str, dtype: str) -> float:
        """The fastest one chip runs ``op_class`` (vector FLOPs, special-function ops) for a node
        computing in ``dtype``: its rate at that dtype or at the plan's (a lowering may time a
        node's elementwise math at the plan's precision)."""
        rates = []
        for d in {dtype, self.plan_dtype}:
            try:
                rates.append(float(self.target.rate(op_class, d)))
            except (TargetError, ValueError):
                continue
        return max(rates) if rates else self.peak(dtype)

    def _bandwidth(self, level: str | None) -> tuple[str, float] | None:
        """(memory name, bytes/s of one chip) of the memory at ``level`` (a name or a level)."""
        if not level or not self.target.has_memory(level):
            return None
        mem = self.target.memory(level)
        return mem.name, float(mem.bandwidth_bytes_per_s)


class _Nodes:
    """The report's nodes that ran (a finite, positive time), as columns: one array a figure,
    NaN where a node has none. Every per-node check is one expression over them.

    ``peak``, ``vector_rate``, ``special_rate`` and ``bandwidth`` are one chip's limits at each
    node's dtype and feed level (`_Context`); ``memory`` is the feed memory's name."""

    def __init__(self, ctx: _Context) -> None:
        def feed_bytes(r: NodeRecord) -> Any:  # what its roofline point counts, else its plan's
            return r.feed_bytes if r.feed_bytes is not None else getattr(ctx.node_plans.get(r.name), "feed_bytes", 0)

        def did_work(r: NodeRecord) -> bool:  # a node with no FLOPs and no bytes has no limit to break
            return (finite_float(r.flops) or 0.0) > 0 or (finite_float(feed_bytes(r)) or 0.0) > 0

        records = [r for r in ctx.report.nodes if (finite_float(r.time_s) or 0.0) > 0 and did_work(r)]
        costs = [r.cost for r in records]
        feeds = [ctx.bandwidth(getattr(ctx.node_plans.get(r.name), "feed_level", None)) for r in records]
        self.records = records
        self.dtypes = [str(r.precision or ctx.plan_dtype) for r in records]
        self.time = _column(r.time_s for r in records)
        self.flops = _column(0 if c is None else c.flops for c in costs)
        self.vector = _column(0 if c is None else c.vector_flops for c in costs)
        self.special = _column(0 if c is None else c.special_ops for c in costs)
        self.feed = _column(feed_bytes(r) for r in records)
        self.energy = _column(r.energy_j for r in records)
        self.intensity = _column(r.intensity for r in records)
        self.peak = np.array([ctx.peak(d) for d in self.dtypes], dtype=np.float64)
        self.vector_rate = np.array([ctx.rate("vector", d) for d in self.dtypes], dtype=np.float64)
        self.special_rate = np.array([ctx.rate("special", d) for d in self.dtypes], dtype=np.float64)
        self.bandwidth = np.array([math.nan if f is None else f[1] for f in feeds], dtype=np.float64)
        self.memory = [None if f is None else f[0] for f in feeds]

    def top_peak(self) -> float | None:
        """The highest dtype peak among the nodes with FLOPs (None: no such node)."""
        working = self.flops > 0
        return float(self.peak[working].max()) if working.any() else None

    def least_times(self, chips: int | np.ndarray) -> np.ndarray:
        """Each node's least time on ``chips`` (one count, or one a node): the longest of its FLOPs at
        its dtype's peak, its vector and special work at their classes' rates, its feed bytes at its
        level's bandwidth."""
        if not self.records:
            return np.zeros(0)
        feed_s = np.where(np.isnan(self.bandwidth), 0.0, self.feed / self.bandwidth)
        parts = np.stack(
            [self.flops / self.peak, self.vector / self.vector_rate, self.special / self.special_rate, feed_s]
        )
        return np.nan_to_num(parts).max(axis=0) / chips


def _node_checks(ctx: _Context, nodes: _Nodes) -> list[Violation]:
    """``node_peak_flops``, ``node_class_rate``, ``node_feed_bandwidth`` and ``node_power``: by
    node, and each node's in that order."""
    chips = ctx.plan_chips
    watts = float(ctx.target.watts) * chips
    t, dtypes = nodes.time, nodes.dtypes
    found: list[tuple[int, int, Violation]] = []

    def over(invariant: str, value: np.ndarray, limit: np.ndarray, detail: Callable[[int, NodeRecord], str]) -> None:
        for i in np.flatnonzero((value > 0) & (value > limit * (1.0 + RTOL))):
            record = nodes.records[i]
            violation = Violation(
                invariant=invariant,
                where=record.name,
                value=float(value[i]),
                limit=float(limit[i]),
                detail=detail(i, record),
            )
            found.append((int(i), INVARIANTS.index(invariant), violation))

    with np.errstate(invalid="ignore", divide="ignore"):
        over(
            "node_peak_flops",
            nodes.flops / t,
            nodes.peak * chips,
            lambda i, r: (
                f"{r.op_type}: {nodes.flops[i]:.0f} FLOPs in {t[i]:.6g} s; peak at {dtypes[i]} x {chips} chip(s)"
            ),
        )
        for cls, work, rate in (
            ("vector", nodes.vector, nodes.vector_rate),
            ("special", nodes.special, nodes.special_rate),
        ):
            over(
                "node_class_rate",
                work / t,
                rate * chips,
                lambda i, r, cls=cls, work=work: (
                    f"{r.op_type}: {work[i]:.0f} {cls} ops in {t[i]:.6g} s; {cls} rate at {dtypes[i]} x {chips} chip(s)"
                ),
            )
        over(
            "node_feed_bandwidth",
            np.where(np.isnan(nodes.bandwidth), 0.0, nodes.feed / t),
            nodes.bandwidth * chips,
            lambda i, r: (
                f"{r.op_type}: {nodes.feed[i]:.6g} B at {nodes.memory[i]} in {t[i]:.6g} s; "
                f"{nodes.memory[i]} bandwidth x {chips} chip(s)"
            ),
        )
        over(
            "node_power",
            nodes.energy,
            watts * t,
            lambda i, r: (
                f"{r.op_type}: {nodes.energy[i]:.6g} J in {t[i]:.6g} s is {nodes.energy[i] / t[i]:.6g} W; "
                f"rated {watts:g} W x {t[i]:.6g} s"
            ),
        )
    return [violation for _, _, violation in sorted(found, key=lambda f: f[:2])]


def _times(report: Report) -> Iterable[Violation]:
    """Every time the report states is a finite, non-negative number of seconds: a node's (emulated or
    measured) and every row no node owns. The other checks skip a node without a positive time, so a
    node at -1 s had passed them all."""
    timeline = report.timeline
    stated = [(r.name, r.time_s) for r in report.nodes]
    stated += [(r.name, r.measured_time_s) for r in report.nodes]
    stated += list((timeline.overheads_s or {}).items()) if timeline is not None else []
    for where, seconds in stated:
        if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
            yield Violation(
                invariant="times_valid",
                where=str(where),
                value=float(seconds),
                limit=0.0,
                detail="a time is a finite number of seconds, none below 0",
            )


def _violations(report: Report) -> Iterable[Violation]:
    yield from _times(report)
    yield from _shares(report)
    yield from _speedups(report.extra.get("scale") or {})
    if report.scaling is not None:
        yield from _stage_weight_reads(report.scaling)
    if report.target_obj is None or report.plan is None:
        return  # nothing placed: only the tables' shares to check
    ctx = _Context(report)
    nodes = _Nodes(ctx)
    yield from _node_checks(ctx, nodes)
    yield from _step(ctx, nodes)
    yield from _memory(ctx)
    yield from _roofline(ctx, nodes)


def _speedups(study: Mapping[str, Any]) -> Iterable[Violation]:
    """A multi-chip point of ``study`` (a scaling record, `ScaleResult.to_dict`) faster than its chips
    allow, with no mechanism named for it: n chips are at most n times one chip, times how many more
    samples each chip runs a step than the one chip did (a chip with a larger batch may use itself
    better; never below 1: tensor-parallel shares)."""
    for point in study.get("points") or []:
        base = point.get("base_samples")  # each point's own baseline: a study over batches has one a batch
        speedup, chips = finite_float(point.get("speedup")), point.get("chips") or 1
        per_chip = point["batch"] / chips / base if base and point.get("batch") else 1.0
        limit = chips * max(1.0, per_chip)
        if speedup is not None and _above(speedup, limit) and not point.get("superlinear"):
            yield Violation(
                invariant="speedup_linear",
                where=f"{chips} chips",
                value=speedup,
                limit=limit,
                detail=f"speedup over one chip above {chips} chip(s) x {max(1.0, per_chip):.3g} (each chip's "
                "samples a step over the one chip's), and no mechanism named for it",
            )


def _stage_weight_reads(result: ScaleResult) -> Iterable[Violation]:
    """A pipeline point shorter than its weights allow: where the chip reads its weights from its
    feed memory every step (`PlanStats.weights_home`), each micro-batch reads a stage's weights
    again, so the busiest stage takes at least the micro-batches x the most weights a stage holds
    over that memory's bandwidth. (Its stage times divided by the micro-batches once made a decode
    token over two H100s shorter than reading the weights once.)"""
    for point in result.points:
        chip, held = point.chip, point.memory_per_device or {}
        if not point.stage_times_s or chip is None or chip.plan is None or chip.run is None:
            continue
        if "read every step" not in (chip.plan.stats.weights_home or "") or not held.get("weights"):
            continue
        memory = chip.run.target.feed_memory
        m = point.micro_batches or 1
        bound = m * held["weights"] / memory.bandwidth_bytes_per_s
        busiest = max(point.stage_times_s)
        if _above(bound, busiest):
            yield Violation(
                invariant="stage_weight_reads",
                where=f"{point.chips} chips",
                value=busiest,
                limit=bound,
                detail=f"{m} micro-batch(es) x {held['weights']:.6g} B of a stage's weights at {memory.name} "
                f"{memory.bandwidth_bytes_per_s:.6g} B/s",
            )


def _step(ctx: _Context, nodes: _Nodes) -> Iterable[Violation]:
    totals = ctx.report.totals
    step = finite_float(totals.get("time_s"))
    if step is not None and step > 0:
        chips = ctx.step_chips
        peak = nodes.top_peak() or ctx.peak(None)
        achieved = finite_float(totals.get("achieved_flops_per_s"))
        if achieved is not None and _above(achieved, peak * chips):
            yield Violation(
                invariant="step_peak_flops",
                where="step",
                value=achieved,
                limit=peak * chips,
                detail=f"highest node-dtype peak x {chips} chip(s)",
            )
        flops = finite_float(totals.get("step_flops", totals.get("flops"))) or 0.0  # every copy's
        if flops > 0 and _above(flops / (peak * chips), step):
            yield Violation(
                invariant="step_time_work",
                where="step",
                value=step,
                limit=flops / (peak * chips),
                detail=f"{flops:.6g} FLOPs at the highest peak x {chips} chip(s)",
            )
        # the optimizer update is per parameter: on several chips each may update its own (ZeRO
        # shards, pipeline stages), so its bound is over the step's chips; any other node's over the plan's
        graph = ctx.report.graph
        chips = np.array(
            [ctx.step_chips if is_optimizer_step(graph.node(r.name)) else ctx.plan_chips for r in nodes.records]
            if graph is not None and ctx.step_chips > ctx.plan_chips
            else ctx.plan_chips
        )
        bounds = dict(zip((r.name for r in nodes.records), nodes.least_times(chips).tolist(), strict=True))
        if bounds:
            name = max(bounds, key=bounds.__getitem__)
            if _above(bounds[name], step):
                yield Violation(
                    invariant="step_time_critical_path",
                    where="step",
                    value=step,
                    limit=bounds[name],
                    detail=f"node {name} alone needs {bounds[name]:.6g} s at its roofline",
                )
            chain = _chain_bound(ctx, bounds)
            if chain is not None and chain.seconds > bounds[name] and _above(chain.seconds, step):
                yield Violation(
                    invariant="step_time_critical_path",
                    where="step",
                    value=step,
                    limit=chain.seconds,
                    detail=f"the chain ending at {chain.last} needs {chain.seconds:.6g} s at its nodes' rooflines",
                )
        energy = finite_float(totals.get("energy_j"))
        watts = finite_float(totals.get("target_power_w")) or float(ctx.target.watts) * ctx.plan_chips
        if energy is not None and energy > 0 and _above(energy, watts * step):
            yield Violation(
                invariant="step_power",
                where="step",
                value=energy,
                limit=watts * step,
                detail=f"{energy:.6g} J in {step:.6g} s is {energy / step:.6g} W; rated {watts:g} W",
            )
        yield from _energy_parts(ctx, totals, step, watts)


def _energy_parts(ctx: _Context, totals: Mapping[str, Any], step: float, watts: float) -> Iterable[Violation]:
    """``energy_sum`` and ``energy_floor``: a step's energy is its dynamic (the links' among it) and
    static parts, and every chip of the step (rated ``watts`` over one chip's) draws its static
    power the whole step."""
    from dabench_ir.energy import energy_model

    energy, dynamic, static = (finite_float(totals.get(k)) for k in ("energy_j", "dynamic_energy_j", "static_energy_j"))
    if energy is None or dynamic is None or static is None:
        return
    parts = dynamic + static
    if abs(energy - parts) > RTOL * max(abs(energy), abs(parts)):
        yield Violation(
            invariant="energy_sum",
            where="step",
            value=energy,
            limit=parts,
            detail="energy_j is not its dynamic and static parts' sum",
        )
    chips = watts / float(ctx.target.watts) if ctx.target.watts else float(ctx.plan_chips)
    floor = energy_model(ctx.target).static_watts * chips * step
    if dynamic + static < floor * (1 - RTOL):
        yield Violation(
            invariant="energy_floor",
            where="step",
            value=dynamic + static,
            limit=floor,
            detail=f"{chips:g} chip(s) draw at least their static power, {floor / chips / step:.6g} W each, for {step:.6g} s",
        )


class _Chain(NamedTuple):
    seconds: float  # the chain's nodes' bounds, summed
    last: str  # the node it ends at


def _chain_bound(ctx: _Context, bounds: Mapping[str, float]) -> _Chain | None:
    """The heaviest dependency chain's summed node bounds, and its last node; None where a chain
    need not fit in one step (steps that overlap, nodes run once per micro-batch, a multi-chip step
    whose nodes are one chip's share)."""
    plan, report = ctx.plan, ctx.report
    graph = report.graph
    timeline = report.timeline
    if (
        graph is None
        or getattr(plan, "pipelined_steps", False)
        or int(getattr(plan, "micro_batches", 1) or 1) != 1
        or int(getattr(timeline, "micro_batches", 1) or 1) != 1
        or "scale" in report.extra
    ):
        return None
    # costed graphs are in topological order: an input whose producer comes later counts as 0
    producer = {out: node.name for node in graph.nodes for out in node.outputs}  # a value's last producer
    best: dict[str, float] = {}
    for node in graph.nodes:
        before = max((best.get(producer.get(i, ""), 0.0) for i in node.inputs), default=0.0)
        best[node.name] = before + bounds.get(node.name, 0.0)
    return max((_Chain(chain, name) for name, chain in best.items()), key=lambda c: c.seconds, default=None)


def _memory(ctx: _Context) -> Iterable[Violation]:
    if not ctx.report.fits:
        return
    for level, use in (ctx.report.metrics.get("memory_use") or {}).items():
        used = finite_float((use or {}).get("bytes"))
        cap = finite_float((use or {}).get("capacity_bytes"))
        if used is not None and cap is not None and cap > 0 and _above(used, cap):
            yield Violation(
                invariant="memory_capacity",
                where=level,
                value=used,
                limit=cap,
                detail="resident bytes over capacity in a plan that fits",
            )


def _shares(report: Report) -> Iterable[Violation]:
    roles, representative = report.share_tables()  # the rows the report's JSON writes
    for table, rows, basis in (
        ("roles", roles, "summed busy time (node times and overheads)"),
        ("representative_layer", representative, "the layer's time"),
    ):
        shares = [finite_float(r.get("share")) for r in rows]
        if not rows or all(s is None for s in shares):
            continue  # nothing to share out (no time, no FLOPs)
        total = sum(s or 0.0 for s in shares)
        if abs(total - 1.0) > RTOL:
            yield Violation(
                invariant="shares_sum",
                where=table,
                value=total,
                limit=1.0,
                detail=f"shares of {basis} over {len(rows)} rows",
            )


def _roofline(ctx: _Context, nodes: _Nodes) -> Iterable[Violation]:
    """The roofline plot's points (`report.plots.roofline_figure`: nodes with FLOPs, a time and a
    finite positive intensity) against the roof it draws at each node's feed level (a node with
    none known: the highest roof drawn)."""
    peak = ctx.peak(ctx.precision)
    highest = max(ctx.target.memories, key=lambda m: float(m.bandwidth_bytes_per_s))
    plotted = (nodes.flops > 0) & (nodes.intensity > 0)  # NaN compares False: not plotted
    for i in np.flatnonzero(plotted):
        r, intensity = nodes.records[i], float(nodes.intensity[i])
        known = not math.isnan(nodes.bandwidth[i])
        memory = nodes.memory[i] if known else highest.name
        roof = min(peak, intensity * (float(nodes.bandwidth[i]) if known else float(highest.bandwidth_bytes_per_s)))
        achieved = float(nodes.flops[i] / nodes.time[i])
        if _above(achieved, roof):
            which = "peak" if roof == peak else f"{memory} roof at {intensity:.6g} FLOP/B"
            yield Violation(
                invariant="roofline_point",
                where=r.name,
                value=achieved,
                limit=roof,
                detail=f"{r.op_type}: plotted above the {which} ({ctx.precision} peak {peak:.6g} FLOP/s)",
            )
