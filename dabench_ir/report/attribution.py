"""Grouped attribution: node times added up by module role, overhead rows, the representative
layer and identical layers collapsed.

Every view here is computed from a `Report`'s node records (``role``, ``time_s``, cost) and
its timeline's ``overheads_s``; the renderers (table, HTML, JSON, CSV) only format them.
Shares are of the summed busy time (node times plus overheads): on a target that runs
nodes concurrently this sum exceeds the step time, and a share says how much of the
work a role is, not how much of the wall clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dabench_ir.report.roles import OVERHEAD_PREFIX, overhead_role

if TYPE_CHECKING:
    from dabench_ir.report.model import NodeRecord, Report

__all__ = ["ROLE_COLUMNS", "layer_runs", "overhead_rows", "representative_layer", "role_rows", "target_peak"]

ROLE_COLUMNS = (
    "role", "nodes", "layers", "time_s", "share", "flops", "bytes", "intensity", "achieved_flops_per_s",
    "peak_fraction", "bound", "bound_share", "measured_time_s", "energy_j",
)  # fmt: skip
"""The keys of one role row (JSON ``roles``, the roles CSV)."""


def target_peak(report: Report) -> float | None:
    """The target's peak FLOP/s at the report's precision (None without a target)."""
    target = report.target_obj
    if target is None:
        return None
    precision = report.config.get("precision") or "fp32"
    for p in (precision, "bf16", "fp32"):
        try:
            return float(target.peak_flops(p))
        except Exception:
            continue
    return None


def overhead_rows(report: Report) -> list[dict[str, Any]]:
    """One row per step cost no node owns (reconfiguration, stalls, host time, fill/drain, collectives)."""
    timeline = report.timeline
    overheads = dict(getattr(timeline, "overheads_s", None) or {})
    rows = []
    for name, seconds in overheads.items():
        if not seconds:
            continue
        row = dict.fromkeys(ROLE_COLUMNS)
        row.update(role=overhead_role(name), nodes=0, layers=0, time_s=float(seconds), flops=0, bytes=0,
                   bound="overhead", bound_share=1.0)  # fmt: skip
        rows.append(row)
    return rows


def _bound_of(records: Sequence[NodeRecord]) -> tuple[str | None, float | None]:
    """The bound holding most of the group's time, and that share of it."""
    by: dict[str, float] = {}
    for r in records:
        if r.bound is not None and r.time_s is not None:
            by[r.bound] = by.get(r.bound, 0.0) + r.time_s
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
    timed = [r.time_s for r in records if r.time_s is not None]
    time_s = sum(timed) if timed else None
    flops = sum(r.flops or 0 for r in records)
    nbytes = sum(r.bytes or 0 for r in records)
    measured = [r.measured_time_s for r in records if r.measured_time_s is not None]
    energy = [r.energy_j for r in records if r.energy_j is not None]
    bound, bound_share = _bound_of(records)
    achieved = flops / time_s if time_s else None
    return {
        "role": role,
        "nodes": len(records),
        "layers": len({r.layer for r in records if r.layer is not None}),
        "time_s": time_s,
        "share": None,
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes if nbytes else None,
        "achieved_flops_per_s": achieved,
        "peak_fraction": achieved / peak if achieved is not None and peak else None,
        "bound": bound,
        "bound_share": bound_share,
        "measured_time_s": sum(measured) if measured else None,
        "energy_j": sum(energy) if energy else None,
    }


def role_rows(report: Report, *, overheads: bool = True) -> list[dict[str, Any]]:
    """One row per role (all layers together) and, with ``overheads``, one per overhead;
    ranked by time (by FLOPs when nothing is timed). Keys: `ROLE_COLUMNS`."""
    groups: dict[str, list[NodeRecord]] = {}
    for r in report.nodes:
        groups.setdefault(r.role or r.op_type, []).append(r)
    peak = target_peak(report)
    rows = [_row(role, records, peak) for role, records in groups.items()]
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


def representative_layer(report: Report) -> list[dict[str, Any]]:
    """One decoder layer, every role in it: the median layer's time (FLOPs, bytes) per role,
    and the spread across layers (min, max). Rows in the layer's node order."""
    per: dict[str, dict[int, list[NodeRecord]]] = {}
    for r in report.nodes:
        if r.layer is None:
            continue
        per.setdefault(r.role or r.op_type, {}).setdefault(r.layer, []).append(r)
    layers = sorted({r.layer for r in report.nodes if r.layer is not None})
    rows = []
    for role, by_layer in per.items():
        times = [sum(x.time_s or 0.0 for x in by_layer.get(i, [])) for i in layers]
        timed = any(x.time_s is not None for recs in by_layer.values() for x in recs)
        flops = [sum(x.flops or 0 for x in by_layer.get(i, [])) for i in layers]
        nbytes = [sum(x.bytes or 0 for x in by_layer.get(i, [])) for i in layers]
        bound, _ = _bound_of([x for recs in by_layer.values() for x in recs])
        rows.append(
            {
                "role": role,
                "layers": len(by_layer),
                "nodes_per_layer": round(sum(len(v) for v in by_layer.values()) / len(by_layer)),
                "time_s": statistics.median(times) if timed else None,
                "min_time_s": min(times) if timed else None,
                "max_time_s": max(times) if timed else None,
                "spread": (max(times) / min(times) - 1.0) if timed and min(times) > 0 else None,
                "flops": int(statistics.median(flops)),
                "bytes": int(statistics.median(nbytes)),
                "bound": bound,
            }
        )
    layer_total = sum(r["time_s"] or 0.0 for r in rows)
    for r in rows:
        r["share"] = (r["time_s"] or 0.0) / layer_total if layer_total else None
    return rows


def layer_runs(report: Report) -> list[dict[str, Any]]:
    """The per-layer totals with runs of identical consecutive layers collapsed into one row.

    Two layers are identical when their FLOPs and bytes are equal and their times agree to
    1e-9 relative. Each row: ``layers`` ("1-30"), ``count``, ``first``, and the per-layer
    ``flops``, ``bytes``, ``time_s`` (None when untimed); the outside-block nodes are the
    row with ``first`` None.
    """
    totals: dict[int | None, list[float]] = {}
    timed = report.has_times
    for r in report.nodes:
        t = totals.setdefault(r.layer, [0, 0, 0.0])
        t[0] += r.flops or 0
        t[1] += r.bytes or 0
        t[2] += r.time_s or 0.0
    rows: list[dict[str, Any]] = []
    for layer in sorted(k for k in totals if k is not None):
        flops, nbytes, time_s = totals[layer]
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
        rows.append({"first": layer, "last": layer, "count": 1, "flops": int(flops), "bytes": int(nbytes),
                     "time_s": time_s if timed else None})  # fmt: skip
    if None in totals:
        flops, nbytes, time_s = totals[None]
        rows.append({"first": None, "last": None, "count": 1, "flops": int(flops), "bytes": int(nbytes),
                     "time_s": time_s if timed else None})  # fmt: skip
    for r in rows:
        if r["first"] is None:
            r["layers"] = "(outside blocks)"
        else:
            r["layers"] = str(r["first"]) if r["count"] == 1 else f"{r['first']}-{r['last']}"
    return rows


def is_overhead(role: str) -> bool:
    """True for an overhead row's role."""
    return role.startswith(OVERHEAD_PREFIX)
