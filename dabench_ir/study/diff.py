"""Before/after diff of two reports of one model: total, per node and per module.

`diff_reports(before, after, provenance)` takes two report dicts (schema
dabench-ir/report/v1) and the `Provenance` of ``after``'s nodes (from `provenance`, from
``after["extra"]["provenance"]``, or else matched by names and by module scopes), and returns
one row per node of ``after`` (with the source nodes it replaced) plus one per source node
that nothing replaced, one row per module, and the totals. Every source node is in exactly
one row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .provenance import Provenance, module_of

__all__ = ["NODE_COLUMNS", "diff_reports", "name_provenance"]

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

_WEIGHT = {"contraction": 3, "vector": 2}


def name_provenance(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> Provenance:
    """Provenance from report nodes alone: kept names, then module scopes (no graph structure)."""
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
    by_module: dict[str, list[Mapping[str, Any]]] = {}
    for n in new:
        by_module.setdefault(module_of(n.get("scope"), n.get("layer")), []).append(n)
    for n in before:
        if n["name"] in out.method:
            continue
        candidates = by_module.get(module_of(n.get("scope"), n.get("layer")))
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
    if prov is None:
        stored = (after.get("extra") or {}).get("provenance")
        prov = Provenance.from_dict(stored) if stored else name_provenance(src_nodes, new_nodes)
    src = {n["name"]: n for n in src_nodes}
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
            module_of(members[0].get("scope"), members[0].get("layer"))
            if members
            else module_of(n.get("scope"), n.get("layer"))
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
                "module": module_of(n.get("scope"), n.get("layer")),
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
    return {"totals": _totals(before, after, rows), "nodes": rows, "modules": _modules(rows)}


def _modules(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    mods: dict[str, dict[str, Any]] = {}
    for r in rows:
        m = mods.setdefault(
            r["module"],
            {"module": r["module"], "nodes_before": 0, "nodes_after": 0, "flops_before": 0, "flops_after": 0,
             "bytes_before": 0, "bytes_after": 0, "time_before_s": 0.0, "time_after_s": 0.0},
        )  # fmt: skip
        m["nodes_before"] += len(r["replaces"])
        m["nodes_after"] += 1 if r["node"] else 0
        for key in ("flops_before", "flops_after", "bytes_before", "bytes_after", "time_before_s", "time_after_s"):
            m[key] += r.get(key) or 0
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
