"""Before/after diff of two reports of one model: total, per node and per module.

`diff_reports(before, after, provenance)` takes two report dicts (schema
dabench-ir/report/v1) and the `Provenance` of ``after``'s nodes (from `provenance`, from
``after["extra"]["provenance"]``, or else matched by names and by module scopes), and returns
one row per node of ``after`` (with the source nodes it replaced) plus one per source node
that nothing replaced, one row per module, and the totals. Every source node is in exactly
one row. A module is named below its report's model root (`report_root`), so the same model
exported inside a user's wrapper and not matches module for module.

The step time of each side is split into **parts** (`speedup_split`): the node-owned time
(the sum of the node times), one part per overhead row of the report (``overheads``: host,
section reconfiguration, stalls, fill/drain, collectives, ...) and the ``step_residual``
(step time neither owns: negative where node times overlap, as in a pipelined WSE step).
The parts of each side add up to its step time, so every speedup is decomposed: the totals
carry ``speedup_total``, ``speedup_nodes`` and ``speedup_overheads``, and the run's
``split`` one row per part with its before, after, delta, share of the change and the
speedup it alone would give.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dabench_ir.ir import TOOL_DOMAIN, model_root

from .provenance import Provenance, module_label, named_after

__all__ = ["NODE_COLUMNS", "SPLIT_COLUMNS", "diff_reports", "name_provenance", "report_root", "speedup_split"]

NODE_COLUMNS = (
    "node",
    "op",
    "status",
    "replaces",
    "provenance",
    "module",
    "flops_before",
    "flops_after",
    "bytes_before",
    "bytes_after",
    "time_before_s",
    "time_after_s",
    "bound_before",
    "bound_after",
    "note",
)
"""Keys of a node row of the diff (CSV column order)."""

SHARED_CHANGE_MIN = 0.01
"""The least change of a step, as a share of its time before, whose parts get shares of it
(``change_share``): a smaller change is inside what the chip models tell apart, and the shares of
it would be ratios of noise."""
SPLIT_COLUMNS = ("part", "kind", "before_s", "after_s", "delta_s", "change_share", "speedup_alone")
"""Keys of a row of a run's ``split``: one for node time, one per overhead row, the residual."""

RESIDUAL = "step_residual"
"""The split part for step time neither the nodes nor an overhead row own."""

_WEIGHT = {"contraction": 3, "vector": 2}


def report_root(nodes: Sequence[Mapping[str, Any]]) -> str:
    """The model's root of a report's nodes, as `Graph.model_root` reads it of the graph's: `model_root`
    of their scopes, the nodes the tool's passes appended (op ``dabench::...``: `TOOL_DOMAIN`) left out."""
    tool = f"{TOOL_DOMAIN}::"
    return model_root(str(n.get("scope") or "") for n in nodes if not str(n.get("op_type") or "").startswith(tool))


def name_provenance(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> Provenance:
    """Provenance from report nodes alone, by the study's name rules and then module scopes (no graph
    structure): a kept name; a new node named ``<source node>/<fusion>`` stands for that source node
    (`provenance.named_after`, as a study's own provenance reads it); what is left goes to the node
    of its module that does the most work."""
    src = {n["name"]: n for n in before}
    out = Provenance()
    new = []
    for n in after:
        old = src.get(n["name"])
        if old is not None and old.get("op_type") == n.get("op_type"):
            out.members[n["name"]] = [n["name"]]
            out.method[n["name"]] = "names"
        else:
            new.append(n)
            out.members[n["name"]] = []
    gone = {n["name"] for n in before if n["name"] not in out.method}
    for n in new:
        source = named_after(n["name"], gone)
        if source is not None and source not in out.method:
            out.members[n["name"]].append(source)
            out.method[source] = "names"
    old_root, new_root = report_root(before), report_root(after)
    by_module: dict[str, list[Mapping[str, Any]]] = {}
    for n in new:
        by_module.setdefault(module_label(n.get("scope"), n.get("layer"), new_root), []).append(n)
    for n in before:
        if n["name"] in out.method:
            continue
        candidates = by_module.get(module_label(n.get("scope"), n.get("layer"), old_root))
        if candidates:
            best = max(candidates, key=lambda c: _WEIGHT.get(str(c.get("op_class")), 0))
            out.members[best["name"]].append(n["name"])
            out.method[n["name"]] = "scope"
        else:
            out.method[n["name"]] = "removed"
    return out


def _num(values: Sequence[Any]) -> float | int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _dominant_bound(nodes: Sequence[Mapping[str, Any]]) -> str | None:
    times: dict[str, float] = {}
    for n in nodes:
        if n.get("bound"):
            times[n["bound"]] = times.get(n["bound"], 0.0) + float(n.get("time_s") or 0.0)
    return max(times, key=times.__getitem__) if times else None


def diff_reports(before: Mapping[str, Any], after: Mapping[str, Any], prov: Provenance | None = None) -> dict[str, Any]:
    """The diff of ``after`` against ``before``: ``{"totals", "nodes", "modules"}`` (see the module doc)."""
    src_nodes = list(before.get("nodes") or [])
    new_nodes = list(after.get("nodes") or [])
    if prov is None:  # B's recorded provenance, when it was worked out against this A: it names every node of A
        stored = (after.get("extra") or {}).get("provenance")
        recorded = Provenance.from_dict(stored) if stored else None
        of_this = recorded is not None and set(recorded.method) == {n["name"] for n in src_nodes}
        prov = recorded if of_this else name_provenance(src_nodes, new_nodes)
    src = {n["name"]: n for n in src_nodes}
    old_root, new_root = report_root(src_nodes), report_root(new_nodes)
    rows: list[dict[str, Any]] = []
    claimed: set[str] = set()
    for n in new_nodes:
        members = [src[m] for m in prov.members.get(n["name"], []) if m in src]
        claimed.update(m["name"] for m in members)
        if not members:
            status = "added"
        elif len(members) == 1 and members[0]["name"] == n["name"]:
            status = "kept"
        else:
            status = "fused" if len(members) > 1 else "replaced"
        module = (
            module_label(members[0].get("scope"), members[0].get("layer"), old_root)
            if members
            else module_label(n.get("scope"), n.get("layer"), new_root)
        )
        rows.append(
            {
                "node": n["name"],
                "op": n.get("op_type"),
                "status": status,
                "replaces": [m["name"] for m in members],
                "provenance": sorted({prov.method.get(m["name"], "names") for m in members}) if members else [],
                "module": module,
                "flops_before": _num([m.get("flops") for m in members]) if members else 0,
                "flops_after": n.get("flops"),
                "bytes_before": _num([m.get("bytes") for m in members]) if members else 0,
                "bytes_after": n.get("bytes"),
                "time_before_s": _num([m.get("time_s") for m in members]) if members else None,
                "time_after_s": n.get("time_s"),
                "bound_before": _dominant_bound(members),
                "bound_after": n.get("bound"),
                "note": n.get("note"),
            }
        )
    for n in src_nodes:
        if n["name"] in claimed:
            continue
        rows.append(
            {
                "node": None,
                "op": n.get("op_type"),
                "status": "folded" if prov.method.get(n["name"]) == "folded" else "removed",
                "replaces": [n["name"]],
                "provenance": [prov.method.get(n["name"], "removed")],
                "module": module_label(n.get("scope"), n.get("layer"), old_root),
                "flops_before": n.get("flops"),
                "flops_after": 0,
                "bytes_before": n.get("bytes"),
                "bytes_after": 0,
                "time_before_s": n.get("time_s"),
                "time_after_s": 0.0 if n.get("time_s") is not None else None,
                "bound_before": n.get("bound"),
                "bound_after": None,
                "note": n.get("note"),
            }
        )
    totals, split = speedup_split(before, after)
    return {
        "totals": {**_totals(before, after, rows), **totals},
        "nodes": rows,
        "modules": _modules(src_nodes, new_nodes, old_root, new_root),
        "split": split,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b and b > 0 else None


def _parts(report: Mapping[str, Any]) -> tuple[float, dict[str, float], float] | None:
    """(node time, overhead rows, residual) of one report; None without a step time."""
    total = (report.get("totals") or {}).get("time_s")
    if total is None:
        return None
    nodes = math.fsum(float(n.get("time_s") or 0.0) for n in report.get("nodes") or [])
    overheads = {str(k): float(v or 0.0) for k, v in (report.get("overheads") or {}).items()}
    residual = float(total) - math.fsum([nodes, *overheads.values()])
    if abs(residual) <= 1e-12 * abs(float(total)):  # float rounding of a step that is exactly the sum
        residual = 0.0
    return nodes, overheads, residual


def speedup_split(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The speedup of ``after`` over ``before`` split into node time and overhead rows.

    Returns the totals fields (``speedup_total``, ``speedup_nodes``, ``speedup_overheads``,
    node, overhead and residual time on each side) and one row per part (`SPLIT_COLUMNS`): the
    node time, every overhead row either side has (0 where the other lacks it) and
    ``step_residual`` when either side has one. The parts of each side add up to its step
    time; ``change_share`` is the part's share of the step-time change (None where the step moves by
    less than `SHARED_CHANGE_MIN` of itself) and ``speedup_alone``
    the speedup if only that part had changed.

    Where a side's node times overlap (a negative residual: a pipelined WSE step's kernels run
    at once), the node time is no stretch of the step: ``node_times_overlap`` is true and no part
    has a share of the change, the nodes and the residual no ``speedup_alone`` and the totals no
    ``speedup_nodes``; an overhead row still has its own (it adds to the step).
    ``speedup_overheads`` is None where a side has no overhead time (0 -> 13.4 ms is no ratio): the
    overhead times of both sides are in the totals.
    """
    pb, pa = _parts(before), _parts(after)
    t0, t1 = (before.get("totals") or {}).get("time_s"), (after.get("totals") or {}).get("time_s")
    if pb is None or pa is None:
        keys = (
            "speedup_total",
            "speedup_nodes",
            "speedup_overheads",
            "node_times_overlap",
            "node_time_before_s",
            "node_time_after_s",
            "overhead_time_before_s",
            "overhead_time_after_s",
            "residual_before_s",
            "residual_after_s",
        )
        return {k: (_ratio(t0, t1) if k == "speedup_total" else None) for k in keys}, []
    (n0, o0, r0), (n1, o1, r1) = pb, pa
    parts = [("nodes", "nodes", n0, n1)]
    parts += [(k, "overhead", o0.get(k, 0.0), o1.get(k, 0.0)) for k in [*o0, *(k for k in o1 if k not in o0)]]
    if r0 or r1:
        parts.append((RESIDUAL, "residual", r0, r1))
    overlap = r0 < 0 or r1 < 0  # node times overlap on a side (a pipelined WSE step): their sum is not the step
    change = float(t0) - float(t1)
    if abs(change) < SHARED_CHANGE_MIN * float(t0) or overlap:
        # the step barely moved (its parts' shares would be noise: 70,611 % of 427 ns), or its parts do
        # not add up as times on its path (a share of 13,946 % for nodes, -13,846 % for the residual)
        change = 0.0
    rows = [
        {
            "part": name,
            "kind": kind,
            "before_s": b,
            "after_s": a,
            "delta_s": a - b,
            "change_share": (b - a) / change if change else None,
            "speedup_alone": None if overlap and kind != "overhead" else _ratio(float(t0), float(t0) - (b - a)),
        }
        for name, kind, b, a in parts
    ]
    ob, oa = math.fsum(o0.values()), math.fsum(o1.values())
    totals = {
        "speedup_total": _ratio(t0, t1),
        "speedup_nodes": None if overlap else _ratio(n0, n1),  # 1.23x beside a 1.02x step, when they overlap
        "node_times_overlap": overlap,
        "speedup_overheads": _ratio(ob, oa),
        "node_time_before_s": n0,
        "node_time_after_s": n1,
        "overhead_time_before_s": ob,
        "overhead_time_after_s": oa,
        "residual_before_s": r0,
        "residual_after_s": r1,
    }
    return totals, rows


def _modules(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], old_root: str, new_root: str
) -> list[dict[str, Any]]:
    """Per module, each side's nodes where they are: a baseline node in its own module, a rewritten
    node in the module its scope names (a fused node's is its sources' common scope, as the study
    re-attaches it). Not through the node rows' provenance: a fusion would move the cost of all it
    replaced into its first source's module, so one baseline would break down differently by pipeline."""
    mods: dict[str, dict[str, Any]] = {}
    counts = ("nodes_before", "nodes_after", "flops_before", "flops_after", "bytes_before", "bytes_after")

    def add(nodes: Sequence[Mapping[str, Any]], root: str, side: str) -> None:
        for n in nodes:
            name = module_label(n.get("scope"), n.get("layer"), root)
            empty = {"module": name, **dict.fromkeys(counts, 0), "time_before_s": 0.0, "time_after_s": 0.0}
            m = mods.setdefault(name, empty)
            m[f"nodes_{side}"] += 1
            m[f"flops_{side}"] += n.get("flops") or 0
            m[f"bytes_{side}"] += n.get("bytes") or 0
            m[f"time_{side}_s"] += n.get("time_s") or 0

    add(before, old_root, "before")
    add(after, new_root, "after")
    return sorted(mods.values(), key=lambda m: -abs(m["time_before_s"] - m["time_after_s"]))


def _totals(before: Mapping[str, Any], after: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    tb, ta = before.get("totals") or {}, after.get("totals") or {}
    t0, t1 = tb.get("time_s"), ta.get("time_s")
    count = {
        s: sum(1 for r in rows if r["status"] == s) for s in ("kept", "fused", "replaced", "added", "removed", "folded")
    }
    return {
        "time_before_s": t0,
        "time_after_s": t1,
        "speedup": t0 / t1 if t0 and t1 else None,
        "flops_before": tb.get("flops"),
        "flops_after": ta.get("flops"),
        "bytes_before": tb.get("bytes"),
        "bytes_after": ta.get("bytes"),
        "nodes_before": len(before.get("nodes") or []),
        "nodes_after": len(after.get("nodes") or []),
        "source_nodes_accounted": sum(len(r["replaces"]) for r in rows),
        "estimated_before": int(tb.get("estimated_nodes") or 0),
        "estimated_after": int(ta.get("estimated_nodes") or 0),
        "bound_changes": sum(1 for r in rows if r["node"] and r["replaces"] and r["bound_before"] != r["bound_after"]),
        **{f"nodes_{k}": v for k, v in count.items()},
    }
