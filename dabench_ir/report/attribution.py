"""Grouped attribution: node times added up by module role, overhead rows, the representative
layer and identical layers collapsed.

Every view here is computed from a `Report`'s node records (``role``, ``time_s``, cost) and
its timeline's ``overheads_s``; the renderers (table, HTML, JSON, CSV) only format them.
Every time share here is on one basis, `TIME_BASIS`: the summed time, node busy times
plus the overhead rows (`summed_time`). On a target that runs nodes one after another
that is the step; on one that runs nodes concurrently it exceeds the step, and a share
says how much of the work a role is, not how much of the wall clock. Groupings by op type,
layer, op class or bound add the overheads as a row of their own (`OVERHEAD_GROUP`), so the
shares on a basis sum to 100 %. The roofline's numbers (`roofline_points`, `roofline_roofs`)
are computed here once for the plot, the tables and the HTML.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dabench_ir.plan import row_bound
from dabench_ir.report.roles import OVERHEAD_PREFIX, overhead_role

if TYPE_CHECKING:
    from dabench_ir.report.model import NodeRecord, Report

__all__ = [
    "FLOPS_BASIS",
    "LAYER_BASIS",
    "OVERHEAD_GROUP",
    "ROLE_COLUMNS",
    "STEP_OVERHEADS",
    "TIME_BASIS",
    "bound_shares",
    "bound_times",
    "comm_label",
    "dominant_bound",
    "dominant_of_shares",
    "layer_runs",
    "node_share",
    "overhead_rows",
    "representative_layer",
    "role_rows",
    "roofline_points",
    "roofline_roofs",
    "shares_of_times",
    "step_overheads",
    "summed_time",
    "target_peak",
    "time_groups",
]

TIME_BASIS = "summed time"
"""The basis of every time share: node busy times plus the overhead rows (headers: "share of summed time")."""
FLOPS_BASIS = "FLOPs"
"""The basis of a share of work when nothing is timed (headers: "share of FLOPs")."""
LAYER_BASIS = "layer time"
"""The representative layer's shares: of that one layer's summed node time (headers: "share of layer")."""
OVERHEAD_GROUP = "(overhead)"
"""The row a grouping by op type, layer or op class gives the step costs no node owns (bound: ``overhead``)."""

ROLE_COLUMNS = (
    "role",
    "nodes",
    "layers",
    "time_s",
    "share",
    "flops",
    "bytes",
    "intensity",
    "achieved_flops_per_s",
    "peak_fraction",
    "bound",
    "bound_share",
    "measured_time_s",
    "energy_j",
    "cost_intensity",
)
"""The keys of one role row (JSON ``roles``, the roles CSV). ``share`` is of `TIME_BASIS` (of
`FLOPS_BASIS` untimed); ``intensity`` is at the feed level, as the nodes' (their FLOPs over
their feed bytes, FLOPs / node intensity), ``cost_intensity`` the FLOPs over every byte the
nodes touch."""


def target_peak(report: Report) -> float | None:
    """The target's peak FLOP/s at the precision the placement ran at, as the metrics' efficiency reads
    it: the plan's (``fp8`` runs the contraction at ``fp8e4m3``, ``w4a16`` at fp16); the report's
    precision without a plan (None without a target)."""
    target = report.target_obj
    if target is None:
        return None
    precision = report.plan.precision if report.plan is not None else report.config.get("precision") or "fp32"
    for p in (precision, "bf16", "fp32"):
        try:
            return float(target.peak_flops(p))
        except Exception:
            continue
    return None


def summed_time(report: Report) -> float:
    """The `TIME_BASIS` total: every node's busy time plus every row no node owns (`step_overheads`,
    a multi-chip step's collectives among them; 0.0 untimed)."""
    return sum(n.time_s or 0.0 for n in report.nodes) + sum(step_overheads(report).values())


def node_share(report: Report, node: NodeRecord) -> float | None:
    """One node's share of the summed time (`TIME_BASIS`), as the role table counts it."""
    total = summed_time(report)
    return node.time_s / total if total and node.time_s is not None else None


def time_groups(report: Report, key: str) -> dict[Any, float]:
    """Node time grouped by a NodeRecord attribute, plus the rows no node owns: under each row's
    bound class (`plan.row_bound`: communication or overhead) for ``key="bound"``, else as the row
    `OVERHEAD_GROUP`. Sums to `summed_time`."""
    out = dict(report.group_time(key))
    for row, seconds in step_overheads(report).items():
        if seconds:
            name = row_bound(row) if key == "bound" else OVERHEAD_GROUP
            out[name] = out.get(name, 0.0) + float(seconds)
    return out


def bound_shares(nodes: Sequence[Any], overheads: dict[str, float] | None = None) -> dict[str, float]:
    """Share of the summed time (`TIME_BASIS`) per bound class, each overhead row under its own
    (`plan.row_bound`). ``nodes``: NodeRecords or report-JSON node dicts; ``overheads``: seconds by
    name (the timeline's ``overheads_s``, the JSON's ``overheads``). Empty without times."""
    return shares_of_times(bound_times(nodes), overheads)


def bound_times(nodes: Sequence[Any]) -> dict[str, float]:
    """The node time per bound class (``unknown`` for a timed node without one), added in node order:
    what `bound_shares` divides, for a caller that wants the shares with and without the overheads
    from one pass over the nodes (`shares_of_times`)."""
    times: dict[str, float] = {}
    isfinite = math.isfinite
    for n in nodes:
        if isinstance(n, dict):
            t, bound = n.get("time_s"), n.get("bound")
        else:
            t, bound = n.time_s, n.bound
        if t and isfinite(t):  # a NaN counts as the null its JSON holds
            key = str(bound or "unknown")
            times[key] = times.get(key, 0.0) + float(t)
    return times


def shares_of_times(times: dict[str, float], overheads: dict[str, float] | None = None) -> dict[str, float]:
    """`bound_shares` from the node times of `bound_times` (not changed) and the overhead rows, each
    under its own bound class (`plan.row_bound`: a multi-chip step's collectives are communication)."""
    times = dict(times)
    for name, seconds in (overheads or {}).items():
        if seconds:
            bound = row_bound(name)
            times[bound] = times.get(bound, 0.0) + float(seconds)
    total = sum(times.values())
    return {k: v / total for k, v in times.items()} if total else {}


def dominant_bound(nodes: Sequence[Any], overheads: dict[str, float] | None = None) -> tuple[str | None, float | None]:
    """The bound class with the largest share of the summed time, the rows no node owns under their
    own (a host-heavy step says overhead, a collective-heavy one communication), and that share;
    (None, None) untimed."""
    return dominant_of_shares(bound_shares(nodes, overheads))


def dominant_of_shares(shares: dict[str, float]) -> tuple[str | None, float | None]:
    """`dominant_bound` of the shares `bound_shares` (or `shares_of_times`) gives."""
    if not shares:
        return None, None
    best = max(shares, key=shares.__getitem__)
    return best, shares[best]


def _feed_level(report: Report, target: Any, name: str) -> str | None:
    plan = report.plan
    np_ = plan.node_plans.get(name) if plan is not None else None
    if np_ is not None and np_.feed_level:
        return str(np_.feed_level)
    try:
        return str(target.feed_level)
    except Exception:
        return None


def _node_peak(target: Any, precision: str | None, fallback: str | None) -> float | None:
    for p in (precision, fallback, "fp32"):
        if not p:
            continue
        try:
            return float(target.peak_flops(p))
        except Exception:
            continue
    values = [float(q.value) for q in (getattr(target, "peaks", None) or {}).values()]
    return max(values) if values else None


def _ridge(target: Any, precision: str, mem: Any, peak: float) -> float:
    """`Target.ridge_point` of ``mem`` at ``precision``; peak / bandwidth for a target without one."""
    try:
        return float(target.ridge_point(precision, mem))
    except Exception:
        from dabench_ir.targets import ridge

        return ridge(peak, float(mem.bandwidth_bytes_per_s))


def roofline_points(report: Report, target: Any = None) -> list[dict[str, Any]]:
    """The roofline's point for every timed node with FLOPs and a feed-level intensity.

    Each: ``name``, ``role``, ``op_class``, ``flops``, ``time_s``, ``intensity`` (the report's
    node intensity: FLOPs per byte at the feed level, as the table and JSON state it),
    ``achieved_flops_per_s`` (FLOPs / busy time), ``feed_level``, ``memory`` and
    ``bandwidth_bytes_per_s`` (the feed memory), ``precision`` and ``peak_flops_per_s`` (at the
    node's dtype), ``ridge`` (`Target.ridge_point` of the feed memory), ``roof_flops_per_s``
    (min(peak, intensity x bandwidth)), ``roof_fraction`` (achieved / roof) and ``share`` (of
    the summed time). Without a target the roof fields are None. The plot, the table and
    the HTML all read these.
    """
    if target is None:
        from .plots import target_of

        target = target_of(report)
    precision = report.config.get("precision") or "fp32"
    total = summed_time(report) or None
    out = []
    for n in report.nodes:
        x = n.intensity
        if not (n.flops and n.time_s and x is not None and math.isfinite(x) and x > 0):
            continue
        level = memory = bw = peak = ridge = roof = None
        if target is not None:
            level = _feed_level(report, target, n.name)
            try:
                mem = target.memory(level) if level else None
            except Exception:
                mem = None
            peak = _node_peak(target, n.precision, precision)
            if mem is not None and peak:
                memory, bw = mem.name, float(mem.bandwidth_bytes_per_s)
                ridge = _ridge(target, n.precision or precision, mem, peak)
                roof = min(peak, x * bw)
        achieved = n.flops / n.time_s
        out.append(
            {
                "name": n.name,
                "role": n.role,
                "op_class": n.op_class,
                "flops": n.flops,
                "time_s": n.time_s,
                "intensity": x,
                "achieved_flops_per_s": achieved,
                "feed_level": level,
                "memory": memory,
                "bandwidth_bytes_per_s": bw,
                "precision": n.precision or precision,
                "peak_flops_per_s": peak,
                "ridge": ridge,
                "roof_flops_per_s": roof,
                "roof_fraction": achieved / roof if roof else None,
                "share": n.time_s / total if total else None,
            }
        )
    return out


def roofline_roofs(report: Report, target: Any = None) -> list[dict[str, Any]]:
    """The roofs to draw: one per (memory, dtype) that feeds a plotted node, feed levels first, then
    the target's other memories on or beside the chip at the report's precision. Each: ``memory``, ``level``,
    ``bandwidth_bytes_per_s``, ``precision``, ``peak_flops_per_s``, ``ridge``, ``feeds`` (the number
    of plotted nodes it feeds)."""
    if target is None:
        from .plots import target_of

        target = target_of(report)
    if target is None:
        return []
    precision = report.config.get("precision") or "fp32"
    feeds: dict[tuple[str, str], int] = {}
    for p in roofline_points(report, target):
        if p["memory"] is not None:
            key = (p["memory"], p["precision"])
            feeds[key] = feeds.get(key, 0) + 1
    for mem in getattr(target, "memories", ()):
        if mem.level != "host":  # the host's memory bounds only what the host runs: drawn when it feeds some
            feeds.setdefault((mem.name, precision), 0)
    out = []
    for (name, prec), count in feeds.items():
        mem = next((m for m in target.memories if m.name == name), None)
        peak = _node_peak(target, prec, precision)
        if mem is None or not peak:
            continue
        bw = float(mem.bandwidth_bytes_per_s)
        ridge = _ridge(target, prec, mem, peak)
        out.append(
            {
                "memory": name,
                "level": mem.level,
                "bandwidth_bytes_per_s": bw,
                "precision": prec,
                "peak_flops_per_s": peak,
                "ridge": ridge,
                "feeds": count,
            }
        )
    out.sort(key=lambda r: (-r["feeds"], r["bandwidth_bytes_per_s"]))
    return out


STEP_OVERHEADS = "step_overheads_s"
"""``Report.extra`` key of the step costs a multi-chip report adds beyond its chip's timeline (the
collectives a tensor- or data-parallel step waits for: `build.build_scaled_report`)."""


def comm_label(strategy: str | None) -> str:
    """What a multi-chip step's communication is called: a pipeline's stage-boundary transfers, else
    the collectives."""
    return "stage-boundary transfers" if strategy == "pp" else "collectives"


def step_overheads(report: Report) -> dict[str, float]:
    """Seconds of each step cost no node owns: the timeline's, and a multi-chip step's beyond its
    chip's (`STEP_OVERHEADS`)."""
    return {**(getattr(report.timeline, "overheads_s", None) or {}), **report.extra.get(STEP_OVERHEADS, {})}


def overhead_rows(report: Report) -> list[dict[str, Any]]:
    """One row per step cost no node owns (reconfiguration, stalls, host time, fill/drain, collectives):
    `step_overheads`, each with its energy where the report has it (``totals.overhead_energy_j``: the
    static power the target draws through it; none for a multi-chip step's own rows)."""
    overheads = step_overheads(report)
    energies = report.totals.get("overhead_energy_j") or {}
    rows = []
    for name, seconds in overheads.items():
        if not seconds:
            continue
        row = dict.fromkeys(ROLE_COLUMNS)
        row.update(
            role=overhead_role(name),
            nodes=0,
            layers=0,
            time_s=float(seconds),
            flops=0,
            bytes=0,
            bound=row_bound(name),
            bound_share=1.0,
            energy_j=energies.get(name),
        )
        rows.append(row)
    return rows


def _bound_of(records: Sequence[NodeRecord]) -> tuple[str | None, float | None]:
    """The bound holding most of the group's time, and that share of it."""
    by: dict[str, float] = {}
    for r in records:
        if r.bound is not None and r.time_s is not None:
            by[r.bound] = by.get(r.bound, 0.0) + r.time_s
    return _bound_from(by, records)


def _bound_from(by: dict[str, float], records: Sequence[NodeRecord]) -> tuple[str | None, float | None]:
    """`_bound_of` from the time per bound its records add up (``by``, in record order)."""
    total = sum(by.values())
    if not by:
        counts: dict[str, int] = {}
        for r in records:
            if r.bound is not None:
                counts[r.bound] = counts.get(r.bound, 0) + 1
        if not counts:
            return None, None
        best = max(counts, key=counts.__getitem__)
        return best, counts[best] / sum(counts.values())
    best = max(by, key=by.__getitem__)
    return best, (by[best] / total if total else 1.0)


def _row(role: str, records: Sequence[NodeRecord], peak: float | None) -> dict[str, Any]:
    # one pass over the records (a role of a 96-layer model holds hundreds); each sum adds in
    # record order from 0, as sum() would
    time_s: float | None = None
    flops = nbytes = feed_flops = 0
    feed_bytes = measured = energy = 0
    any_measured = any_energy = False
    layers = set()
    by_bound: dict[str, float] = {}  # `_bound_of`'s sums, added in the same walk
    for r in records:
        c = r.cost
        f = 0
        if c is not None:
            f = c.flops
            nbytes += c.bytes
        flops += f
        t = r.time_s
        if t is not None:
            time_s = (0 if time_s is None else time_s) + t
            bound = r.bound
            if bound is not None:
                by_bound[bound] = by_bound.get(bound, 0.0) + t
        if r.measured_time_s is not None:
            measured += r.measured_time_s
            any_measured = True
        if r.energy_j is not None:
            energy += r.energy_j
            any_energy = True
        # at the feed level, as every node's intensity (and roofline point) says: sum of FLOPs over
        # the sum of the nodes' feed bytes (FLOPs / intensity); nodes without FLOPs add no bytes here
        if f and r.intensity:
            feed_bytes += f / r.intensity
            feed_flops += f
        if r.layer is not None:
            layers.add(r.layer)
    bound, bound_share = _bound_from(by_bound, records)
    achieved = flops / time_s if time_s else None
    return {
        "role": role,
        "nodes": len(records),
        "layers": len(layers),
        "time_s": time_s,
        "share": None,
        "flops": flops,
        "bytes": nbytes,
        "intensity": feed_flops / feed_bytes if feed_bytes else (flops / nbytes if nbytes else None),
        "achieved_flops_per_s": achieved,
        "peak_fraction": achieved / peak if achieved is not None and peak else None,
        "bound": bound,
        "bound_share": bound_share,
        "measured_time_s": measured if any_measured else None,
        "energy_j": energy if any_energy else None,
        "cost_intensity": flops / nbytes if nbytes else None,
    }


def role_rows(report: Report, *, overheads: bool = True) -> list[dict[str, Any]]:
    """One row per role (all layers together) and, with ``overheads``, one per overhead;
    ranked by time (by FLOPs when nothing is timed). Keys: `ROLE_COLUMNS`."""
    groups: dict[str, list[NodeRecord]] = {}
    for r in report.nodes:
        groups.setdefault(r.role or r.op_type, []).append(r)
    peak = target_peak(report)
    rows = [_row(role, records, peak) for role, records in groups.items()]
    if report.target is None:  # cost only: no feed level, the intensity is over every byte
        for r in rows:
            r["intensity"] = r["cost_intensity"]
    if overheads:
        rows += overhead_rows(report)
    total = sum(r["time_s"] or 0.0 for r in rows)
    total_flops = sum(r["flops"] or 0 for r in rows)
    for r in rows:
        if total:
            r["share"] = (r["time_s"] or 0.0) / total
        elif total_flops:
            r["share"] = (r["flops"] or 0) / total_flops
    timed = bool(total)
    rows.sort(key=lambda r: (-(r["time_s"] or 0.0) if timed else -(r["flops"] or 0), r["role"]))
    return rows


@dataclass(slots=True)
class _Sums:
    """A group's node figures, each added in record order from 0 as `sum` adds, and its records."""

    time_s: float = 0  # untimed nodes add 0.0
    flops: int = 0
    bytes: int = 0
    records: list[NodeRecord] = field(default_factory=list)

    def add(self, r: NodeRecord) -> None:
        self.time_s += r.time_s or 0.0
        c = r.cost
        if c is not None:
            self.flops += c.flops
            self.bytes += c.bytes
        self.records.append(r)


def representative_layer(report: Report) -> list[dict[str, Any]]:
    """One decoder layer, every role in it: the median layer's time (FLOPs, bytes) per role,
    and the spread across layers (min, max). Rows in the layer's node order."""
    per: dict[str, dict[int, _Sums]] = {}  # per role, its layers in first-seen order
    timed_roles: set[str] = set()
    seen_layers: set[int] = set()
    for r in report.nodes:
        layer = r.layer
        if layer is None:
            continue
        role = r.role or r.op_type
        by_layer = per.get(role)
        if by_layer is None:
            by_layer = per[role] = {}
        sums = by_layer.get(layer)
        if sums is None:
            sums = by_layer[layer] = _Sums()
            seen_layers.add(layer)
        sums.add(r)
        if r.time_s is not None:
            timed_roles.add(role)
    layers = sorted(seen_layers)
    none = _Sums()  # a layer without the role
    rows = []
    for role, by_layer in per.items():
        layer_sums = [by_layer.get(i, none) for i in layers]
        times = [x.time_s for x in layer_sums]
        timed = role in timed_roles
        flops = [x.flops for x in layer_sums]
        nbytes = [x.bytes for x in layer_sums]
        bound, _ = _bound_of([x for sums in by_layer.values() for x in sums.records])
        rows.append(
            {
                "role": role,
                "layers": len(by_layer),
                "nodes_per_layer": round(sum(len(sums.records) for sums in by_layer.values()) / len(by_layer)),
                "time_s": statistics.median(times) if timed else None,
                "min_time_s": min(times) if timed else None,
                "max_time_s": max(times) if timed else None,
                "spread": (max(times) / min(times) - 1.0) if timed and min(times) > 0 else None,
                "flops": int(statistics.median(flops)),
                "bytes": int(statistics.median(nbytes)),
                "bound": bound,
            }
        )
    layer_total = sum(r["time_s"] or 0.0 for r in rows)  # LAYER_BASIS
    for r in rows:
        r["share"] = (r["time_s"] or 0.0) / layer_total if layer_total else None
    return rows


def _run_of_one(layer: int | None, flops: float, nbytes: float, time_s: float | None) -> dict[str, Any]:
    """A `layer_runs` row of one layer (None: the outside-block nodes); later identical layers extend it."""
    return {"first": layer, "last": layer, "count": 1, "flops": int(flops), "bytes": int(nbytes), "time_s": time_s}


def layer_runs(report: Report) -> list[dict[str, Any]]:
    """The per-layer totals with runs of identical consecutive layers collapsed into one row.

    Two layers are identical when their FLOPs and bytes are equal and their times agree to
    1e-9 relative. Each row: ``layers`` ("1-30"), ``count``, ``first``, and the per-layer
    ``flops``, ``bytes``, ``time_s`` (None when untimed); the outside-block nodes are the
    row with ``first`` None.
    """
    totals: dict[int | None, _Sums] = {}
    timed = report.has_times
    for r in report.nodes:
        sums = totals.get(r.layer)
        if sums is None:
            sums = totals[r.layer] = _Sums()
        sums.add(r)
    rows: list[dict[str, Any]] = []
    for layer in sorted(k for k in totals if k is not None):
        flops, nbytes, time_s = totals[layer].flops, totals[layer].bytes, totals[layer].time_s
        last = rows[-1] if rows else None
        if (
            last is not None
            and last["first"] is not None
            and last["last"] == layer - 1
            and (last["flops"], last["bytes"]) == (flops, nbytes)
            and abs((last["time_s"] or 0.0) - time_s) <= 1e-9 * max(abs(time_s), 1e-30)
        ):
            last["last"] = layer
            last["count"] += 1
            continue
        rows.append(_run_of_one(layer, flops, nbytes, time_s if timed else None))
    if None in totals:
        flops, nbytes, time_s = totals[None].flops, totals[None].bytes, totals[None].time_s
        rows.append(_run_of_one(None, flops, nbytes, time_s if timed else None))
    for r in rows:
        if r["first"] is None:
            r["layers"] = "(outside blocks)"
        else:
            r["layers"] = str(r["first"]) if r["count"] == 1 else f"{r['first']}-{r['last']}"
    return rows


def is_overhead(role: str) -> bool:
    """True for an overhead row's role."""
    return role.startswith(OVERHEAD_PREFIX)
