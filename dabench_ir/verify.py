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
    step time >= the roofline lower bound (max(FLOPs / peak, feed bytes / bandwidth)) of the
    largest single node and, when steps do not overlap and every node runs once per step,
    of the heaviest dependency chain;
``node_power``
    a node's energy <= rated power x chips x its busy time;
``step_power``
    the step's energy <= rated power x chips x the step time;
``shares_sum``
    the shares a table states as shares of one total (role rows, the representative layer's
    rows) sum to 100 % on their basis;
``roofline_point``
    every point the roofline plot draws (intensity, FLOPs / time) is at or below its roof:
    min(peak at the report's precision, intensity x the bandwidth of the node's feed level);
``speedup_linear``
    a multi-chip point's speedup over one chip <= its chips, unless the point names the
    mechanism that lets it exceed them (``superlinear``: ZeRO sharding the optimizer's work).

Light by design (no torch, no onnxruntime, no matplotlib): `dabench_ir.run.execute` may run it
after every profile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dabench_ir.report.model import NodeRecord, Report

    _Point = tuple[NodeRecord, float, int, float, tuple[str, float] | None]  # a roofline point (`_Walk.points`)

__all__ = [
    "INVARIANTS",
    "RTOL",
    "PhysicsError",
    "Violation",
    "check",
    "verify",
]

RTOL = 1e-6
"""Relative tolerance of every check: ``value <= limit * (1 + RTOL)``; shares within 1e-6 of 1."""

INVARIANTS = (
    "node_peak_flops",
    "step_peak_flops",
    "node_feed_bandwidth",
    "memory_capacity",
    "step_time_work",
    "step_time_critical_path",
    "node_power",
    "step_power",
    "speedup_linear",
    "shares_sum",
    "roofline_point",
)
"""Every invariant `verify` checks, by name (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its name, where (a node, ``step``, a memory level, a table), the
    report's number and the limit it breaks, and a line saying how the limit was made.

    For the lower bounds (``step_time_*``) ``value`` is the step time and ``limit`` the bound it
    falls under; for ``shares_sum`` ``value`` is the sum and ``limit`` 1.0."""

    invariant: str
    where: str
    value: float
    limit: float
    detail: str = ""

    def __str__(self) -> str:
        op = "<" if self.invariant.startswith("step_time") else ("!=" if self.invariant == "shares_sum" else ">")
        more = f" ({self.detail})" if self.detail else ""
        return f"{self.invariant} at {self.where}: {self.value:.6g} {op} {self.limit:.6g}{more}"

    def to_dict(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "where": self.where, "value": self.value, "limit": self.limit,
                "detail": self.detail}  # fmt: skip


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


def verify(report: Report) -> list[Violation]:
    """Every violation of the invariants (`INVARIANTS`) in ``report``; empty when it is physical."""
    return list(_violations(report))


# -- the checks ----------------------------------------------------------------------------------


def _above(value: float, limit: float) -> bool:
    return value > limit * (1.0 + RTOL)


_SLACK = 1.0 + RTOL  # `_above` written out in the per-node loop: value > limit * _SLACK


def _finite(x: Any) -> float | None:
    if type(x) is float:  # the common case (a time, an energy) without the conversion below
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, bool):
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class _Context:
    """What the checks read from a report: its target, plan, chips and a node's dtype peak."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.target = report.target_obj
        self.plan = report.plan
        self.node_plans: Mapping[str, Any] = getattr(self.plan, "node_plans", None) or {}
        self.plan_chips = max(1, int(getattr(self.plan, "chips", 1) or 1))
        self.step_chips = max(self.plan_chips, int(report.config.get("chips") or 1))
        self.precision = str(report.config.get("precision") or getattr(self.plan, "precision", "") or "fp32")
        self.plan_dtype = str(getattr(self.plan, "precision", "") or self.precision)  # a node's without its own
        self._peaks: dict[str, float] = {}
        self._bandwidths: dict[str | None, tuple[str, float] | None] = {}

    def peak(self, dtype: str | None) -> float:
        """Peak FLOP/s of one chip at ``dtype``; a dtype the target lists no peak for gets its
        highest peak (a bound no node exceeds whatever units it runs on)."""
        key = str(dtype or self.precision)
        if key not in self._peaks:
            self._peaks[key] = float(self.target.peak_bound(key))
        return self._peaks[key]

    def bandwidth(self, level: str | None) -> tuple[str, float] | None:
        """(memory name, bytes/s of one chip) of the memory at ``level`` (a name or a level)."""
        if level not in self._bandwidths:
            if not level or not self.target.has_memory(level):
                self._bandwidths[level] = None
            else:
                mem = self.target.memory(level)
                self._bandwidths[level] = (mem.name, float(mem.bandwidth_bytes_per_s))
        return self._bandwidths[level]


class _Walk:
    """The one pass over the report's nodes that the node, step and roofline checks read.

    ``violations``: the per-node ones (``node_peak_flops``, ``node_feed_bandwidth``,
    ``node_power``, in node order); ``peak``: the highest node-dtype peak of the nodes with FLOPs
    (None: no such node); ``bounds``: each node's roofline lower bound on its own time (only with
    ``bounds=True``: the step has a time); ``points``: the roofline plot's points
    (record, time, FLOPs, intensity, feed memory). One walk instead of one per check (each read
    every record's fields, plan and feed level again: ~60 % of the verifier's time)."""

    def __init__(self, ctx: _Context, *, bounds: bool) -> None:
        self.violations: list[Violation] = []
        self.peak: float | None = None
        self.bounds: dict[str, float] = {}
        self.points: list[_Point] = []
        chips = ctx.plan_chips
        watts = float(ctx.target.watts) * chips
        # the loop below runs once per node: the caches, lists and `math.isfinite` are read as locals,
        # and `_finite` is inlined for the float a time, an energy or an intensity nearly always is
        node_plans, peaks, bandwidths, isfinite = ctx.node_plans, ctx._peaks, ctx._bandwidths, math.isfinite
        found, points, node_bounds, top = self.violations, self.points, self.bounds, None
        for r in ctx.report.nodes:
            t = r.time_s
            if type(t) is not float or not isfinite(t):
                t = _finite(t)
            if not t or t <= 0:
                continue  # not run: no node check and no roofline point
            np_ = node_plans.get(r.name)
            level = getattr(np_, "feed_level", None)
            bw = bandwidths[level] if level in bandwidths else ctx.bandwidth(level)
            cost = r.cost
            flops = None if cost is None else cost.flops
            if flops:  # a roofline point when its intensity is a finite positive number
                intensity = r.intensity
                if type(intensity) is not float or not isfinite(intensity):
                    intensity = _finite(intensity)
                if intensity is not None and intensity > 0:
                    points.append((r, t, flops, intensity, bw))
            if type(flops) is not int:  # the conversions only where needed: no call per node
                flops = int(flops or 0)
            feed = r.feed_bytes
            if feed is None:
                feed = getattr(np_, "feed_bytes", 0)  # the roofline's bytes
            if type(feed) is not float:
                feed = float(feed or 0)
            if flops <= 0 and feed <= 0:
                continue  # did no work
            bound = 0.0
            if flops > 0:
                dtype = r.precision or ctx.plan_dtype
                peak = peaks.get(dtype)
                if peak is None:
                    peak = ctx.peak(dtype)
                if top is None or peak > top:
                    top = peak
                limit = peak * chips
                if flops / t > limit * _SLACK:
                    found.append(Violation("node_peak_flops", r.name, flops / t, limit,
                                           f"{r.op_type}: {flops} FLOPs in {t:.6g} s; peak at {dtype} x {chips} chip(s)"))  # fmt: skip
                if bounds:
                    bound = flops / limit
            if feed > 0 and bw is not None:
                limit = bw[1] * chips
                if feed / t > limit * _SLACK:
                    found.append(Violation("node_feed_bandwidth", r.name, feed / t, limit,
                                           f"{r.op_type}: {feed} B at {bw[0]} in {t:.6g} s; {bw[0]} bandwidth x {chips} chip(s)"))  # fmt: skip
                if bounds and feed / limit > bound:
                    bound = feed / limit
            energy = r.energy_j
            if type(energy) is not float or not isfinite(energy):
                energy = _finite(energy)
            if energy is not None and energy > 0 and energy > watts * t * _SLACK:
                found.append(Violation("node_power", r.name, energy, watts * t,
                                       f"{r.op_type}: {energy:.6g} J in {t:.6g} s is {energy / t:.6g} W; "
                                       f"rated {watts:g} W x {t:.6g} s"))  # fmt: skip
            if bounds:
                node_bounds[r.name] = bound
        self.peak = top


def _violations(report: Report) -> Iterable[Violation]:
    yield from _shares(report)
    yield from _speedups(report)
    if report.target_obj is None or report.plan is None:
        return  # nothing placed: only the tables' shares to check
    ctx = _Context(report)
    step = _finite(report.totals.get("time_s"))
    walk = _Walk(ctx, bounds=step is not None and step > 0)
    yield from walk.violations
    yield from _step(ctx, walk, step)
    yield from _memory(ctx)
    yield from _roofline(ctx, walk.points)


def _speedups(report: Report) -> Iterable[Violation]:
    """A multi-chip point faster than its chips allow, with no mechanism named for it."""
    for point in (report.extra.get("scale") or {}).get("points") or []:
        speedup, chips = _finite(point.get("speedup")), point.get("chips") or 1
        if speedup is not None and _above(speedup, chips) and not point.get("superlinear"):
            yield Violation("speedup_linear", f"{chips} chips", speedup, float(chips),
                            "speedup over one chip above linear, and no mechanism named for it")  # fmt: skip


def _step(ctx: _Context, walk: _Walk, step: float | None) -> Iterable[Violation]:
    totals = ctx.report.totals
    if step is not None and step > 0:
        chips = ctx.step_chips
        peak = walk.peak if walk.peak is not None else ctx.peak(None)
        achieved = _finite(totals.get("achieved_flops_per_s"))
        if achieved is not None and _above(achieved, peak * chips):
            yield Violation("step_peak_flops", "step", achieved, peak * chips,
                            f"highest node-dtype peak x {chips} chip(s)")  # fmt: skip
        flops = _finite(totals.get("flops")) or 0.0
        if flops > 0 and _above(flops / (peak * chips), step):
            yield Violation("step_time_work", "step", step, flops / (peak * chips),
                            f"{flops:.6g} FLOPs at the highest peak x {chips} chip(s)")  # fmt: skip
        bounds = walk.bounds
        if bounds:
            name = max(bounds, key=bounds.__getitem__)
            if _above(bounds[name], step):
                yield Violation("step_time_critical_path", "step", step, bounds[name],
                                f"node {name} alone needs {bounds[name]:.6g} s at its roofline")  # fmt: skip
            chain = _chain_bound(ctx, bounds)
            if chain is not None and chain[0] > bounds[name] and _above(chain[0], step):
                yield Violation("step_time_critical_path", "step", step, chain[0],
                                f"the chain ending at {chain[1]} needs {chain[0]:.6g} s at its nodes' rooflines")  # fmt: skip
        energy = _finite(totals.get("energy_j"))
        watts = _finite(totals.get("target_power_w")) or float(ctx.target.watts) * ctx.plan_chips
        if energy is not None and energy > 0 and _above(energy, watts * step):
            yield Violation("step_power", "step", energy, watts * step,
                            f"{energy:.6g} J in {step:.6g} s is {energy / step:.6g} W; rated {watts:g} W")  # fmt: skip


def _chain_bound(ctx: _Context, bounds: Mapping[str, float]) -> tuple[float, str] | None:
    """The heaviest dependency chain's summed node bounds, and its last node; None where a chain
    need not fit in one step (steps that overlap, nodes run once per micro-batch, a multi-chip step
    whose nodes are one chip's share)."""
    plan, report = ctx.plan, ctx.report
    graph = report.graph
    timeline = report.timeline
    if (graph is None or getattr(plan, "pipelined_steps", False) or int(getattr(plan, "micro_batches", 1) or 1) != 1
            or int(getattr(timeline, "micro_batches", 1) or 1) != 1 or "scale" in report.extra):  # fmt: skip
        return None
    # costed graphs are in topological order: an input whose producer comes later counts as 0
    producer = {out: node.name for node in graph.nodes for out in node.outputs}  # a value's last producer
    best: dict[str, float] = {}
    top: tuple[float, str] | None = None
    for node in graph.nodes:
        before, first = 0.0, True
        for i in node.inputs:  # max(..., default=0.0) without a generator per node
            here = best.get(producer.get(i, ""), 0.0)
            if first or here > before:
                before, first = here, False
        here = best[node.name] = before + bounds.get(node.name, 0.0)
        if top is None or here > top[0]:
            top = (here, node.name)
    return top


def _memory(ctx: _Context) -> Iterable[Violation]:
    if not ctx.report.fits:
        return
    for level, use in (ctx.report.metrics.get("memory_use") or {}).items():
        used = _finite((use or {}).get("bytes"))
        cap = _finite((use or {}).get("capacity_bytes"))
        if used is not None and cap is not None and cap > 0 and _above(used, cap):
            yield Violation("memory_capacity", level, used, cap, "resident bytes over capacity in a plan that fits")


def _shares(report: Report) -> Iterable[Violation]:
    roles, representative = report.share_tables()  # the rows the report's JSON writes
    for table, rows, basis in (("roles", roles, "summed busy time (node times and overheads)"),
                               ("representative_layer", representative, "the layer's time")):  # fmt: skip
        shares = [_finite(r.get("share")) for r in rows]
        if not rows or all(s is None for s in shares):
            continue  # nothing to share out (no time, no FLOPs)
        total = sum(s or 0.0 for s in shares)
        if abs(total - 1.0) > RTOL:
            yield Violation("shares_sum", table, total, 1.0, f"shares of {basis} over {len(rows)} rows")


def _roofline(ctx: _Context, points: list[_Point]) -> Iterable[Violation]:
    """The roofline plot's points (`report.plots.roofline_figure`: nodes with FLOPs, a time and a
    finite positive intensity, found by the `_Walk`) against the roof it draws at each node's feed level."""
    peak = ctx.peak(ctx.precision)
    highest = None  # the highest roof drawn, for a node with no feed level known
    for r, t, flops, intensity, bw in points:
        if bw is None:
            if highest is None:
                highest = max(((m.name, float(m.bandwidth_bytes_per_s)) for m in ctx.target.memories),
                              key=lambda x: x[1])  # fmt: skip
            bw = highest
        roof = min(peak, intensity * bw[1])
        achieved = flops / t
        if _above(achieved, roof):
            which = "peak" if roof == peak else f"{bw[0]} roof at {intensity:.6g} FLOP/B"
            yield Violation("roofline_point", r.name, achieved, roof,
                            f"{r.op_type}: plotted above the {which} ({ctx.precision} peak {peak:.6g} FLOP/s)")  # fmt: skip
