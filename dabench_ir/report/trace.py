"""Chrome trace-event JSON of a Timeline, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One track per hardware unit, not per node: a process per chip-level unit (the WSE wafer,
the RDU, each IPU, the GPU, the host), and inside it one thread per unit group — WSE
kernel regions grouped by decoder layer, streamed WSE layers, RDU PCU groups (the
pipeline stages of the running section), each IPU's compute / exchange / sync phases, a
GPU stream, a host thread. Slices that overlap inside a group are packed onto as few
sub-tracks as needed, so a 7B model gives tens of tracks. Each node run is a complete
("X") slice with the node's FLOPs, bytes, bound and role in its args; the step costs no
node owns (reconfiguration, memory stalls, host time, fill/drain, collectives) are slices
on an "overheads" process; a measured host timeline, when given, is its own process
next to the predicted one. `validate_trace` checks a document against the trace-event
format (required fields per phase, slices on a thread properly nested).
"""

from __future__ import annotations

import bisect
import json
import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dabench_ir.ir import Graph
from dabench_ir.timeline import Timeline

__all__ = ["chrome_trace_events", "track_count", "validate_trace", "write_chrome_trace", "write_report_trace"]

logger = logging.getLogger(__name__)
_US = 1e6
_EPS_US = 1e-6
_MAX_SUBTRACKS = 4

_PROCESS = {
    "wse_region": "wafer",
    "wse_layer": "wafer",
    "rdu_section": "RDU",
    "gpu_stream": "GPU",
    "cpu": "host",
}


def _node_args(graph: Graph, name: str, roles: Mapping[str, str]) -> dict[str, Any]:
    from dabench_ir.passes import meta

    args: dict[str, Any] = {}
    if not graph.has_node(name):
        return args
    node = graph.node(name)
    args["op_type"] = node.op_type
    if name in roles:
        args["role"] = roles[name]
    if node.scope:
        args["scope"] = node.scope
    if node.layer is not None:
        args["layer"] = node.layer
    cost = node.meta.get(meta.COST)
    if cost is not None and meta.UNATTRIBUTED not in node.meta:
        args["flops"] = cost.flops
        args["bytes"] = cost.bytes
    elif meta.UNATTRIBUTED in node.meta:
        args["unattributed"] = str(node.meta[meta.UNATTRIBUTED])
    return args


def _fits(lane: list[tuple[float, float]], start: float, end: float) -> bool:
    """True when [start, end) overlaps no interval of the sorted ``lane`` (touching is fine)."""
    i = bisect.bisect_left(lane, (start, end))
    before = lane[i - 1] if i > 0 else None
    after = lane[i] if i < len(lane) else None
    return (before is None or before[1] <= start + _EPS_US) and (after is None or after[0] >= end - _EPS_US)


class _Tracks:
    """Processes and threads by name; slices in a (process, group) packed onto sub-tracks."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.pids: dict[str, int] = {}
        self.free: dict[tuple[str, str], list[list[tuple[float, float]]]] = {}  # busy intervals (µs) per sub-track
        self.tids: dict[tuple[str, str, int], int] = {}

    def pid(self, process: str) -> int:
        if process not in self.pids:
            pid = self.pids[process] = len(self.pids) + 1
            self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}})
            self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                                "args": {"sort_index": pid}})  # fmt: skip
        return self.pids[process]

    def add(self, process: str, group: str, name: str, start_s: float, end_s: float, args: dict[str, Any],
            cat: str = "node", cap: int | None = None) -> bool:  # fmt: skip
        """Add a slice on the first free sub-track of (process, group); with ``cap``, refuse
        (return False) rather than open a sub-track past ``cap``."""
        ts, dur = start_s * _US, max(0.0, (end_s - start_s) * _US)
        lanes = self.free.setdefault((process, group), [])
        k = next((i for i, lane in enumerate(lanes) if _fits(lane, ts, ts + dur)), None)  # first free sub-track
        if k is None:
            if cap is not None and len(lanes) >= cap:
                return False
            k = len(lanes)
            lanes.append([])
        pid = self.pid(process)
        bisect.insort(lanes[k], (ts, ts + dur))
        key = (process, group, k)
        if key not in self.tids:
            tid = self.tids[key] = 1 + sum(1 for p, _g, _k in self.tids if p == process)
            label = group if k == 0 else f"{group} #{k + 1}"
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
        self.events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": self.tids[key], "ts": ts,
                            "dur": dur, "args": args})  # fmt: skip
        return True


def _unit_group(unit_id: str, kind: str | None, nodes: list[str], graph: Graph, target: str) -> tuple[str, str]:
    """(process, thread group) of a unit: see the module docstring. A kind's ``:sub`` part
    (``wse_region:fc``) and other units of the same chip (``wse_io``, ``ipu_optimizer``) go
    to that chip's process."""
    full = kind or ""
    kind = full.partition(":")[0]
    family = kind.split("_")[0]
    chip = _PROCESS.get(kind) or {"wse": "wafer", "rdu": "RDU", "gpu": "GPU", "cpu": "host"}.get(family)
    if kind == "wse_region":
        layers = Counter(graph.node(n).layer for n in nodes if graph.has_node(n))
        layer = layers.most_common(1)[0][0] if layers else None
        return f"{target} {chip}", "regions, outside blocks" if layer is None else f"regions, layer {layer}"
    if kind == "wse_layer":
        return f"{target} {chip}", "streamed layers"
    if kind == "rdu_section":
        return f"{target} {chip}", "PCU group"
    if kind == "ipu":
        return f"{target} {unit_id}", "phase"
    if family == "ipu":
        return f"{target} IPU host side".strip(), unit_id
    if chip is not None:
        return f"{target} {chip}" if target else chip, unit_id
    return f"{target} {kind or 'unit'}".strip(), unit_id


def chrome_trace_events(
    timeline: Timeline,
    graph: Graph,
    *,
    plan: Any = None,
    roles: Mapping[str, str] | None = None,
    measured: Timeline | None = None,
) -> list[dict[str, Any]]:
    """Trace events: metadata for each process and thread, then slices (see the module docstring)."""
    roles = roles or {}
    tracks = _Tracks()
    target = getattr(getattr(plan, "target", None), "name", "") or ""
    kinds = {u.id: u.kind for u in plan.units} if plan is not None else {}
    members = {u.id: list(u.nodes) for u in plan.units} if plan is not None else {}
    predicted = "predicted: " if measured is not None else ""
    skipped = 0
    # a node's first run always gets its slice; the later micro-batches' runs only while their
    # group has a free sub-track among _MAX_SUBTRACKS (a spatial pipeline keeps every region busy
    # at once: drawing every run would take a track per region). Each slice's args give the
    # node's run count and busy time, so nothing is lost.
    ordered = sorted(timeline.nodes.items(), key=lambda kv: (kv[1].start, kv[0]))
    later: list[tuple[str, str, str, float, float, dict[str, Any]]] = []
    for name, timing in ordered:
        kind = kinds.get(timing.unit) or ("cpu" if timeline.source == "measured" else None)
        process, group = _unit_group(timing.unit, kind, members.get(timing.unit, []), graph, target)
        process = predicted + process if timeline.source != "measured" else f"measured: {process}"
        args = _node_args(graph, name, roles)
        args["bound"] = str(timing.bound) if timing.bound is not None else None
        args["unit"] = timing.unit
        runs = timeline.slices.get(name) or [(timing.start, timing.end)]
        np_ = plan.node_plans.get(name) if plan is not None else None
        if len(runs) > 1:
            args["runs"] = len(runs)
            args["busy_s"] = sum(b - a for a, b in runs)
        for m, (start, end) in enumerate(runs):
            slice_args = dict(args)
            if len(runs) > 1:
                slice_args["micro_batch"] = m
            if kind == "ipu" and np_ is not None:
                _ipu_phases(tracks, process, name, start, end, np_, slice_args)
            elif m == 0:
                tracks.add(process, group, name, start, end, slice_args, cat=args.get("op_type", "node"))
            else:
                later.append((process, group, name, start, end, slice_args))
    for process, group, name, start, end, slice_args in sorted(later, key=lambda x: x[3]):
        if not tracks.add(process, group, name, start, end, slice_args, cat=slice_args.get("op_type", "node"),
                          cap=_MAX_SUBTRACKS):  # fmt: skip
            skipped += 1
    if plan is not None:  # sequential units (RDU sections, streamed layers): their spans on a track of their own
        for u in plan.units:
            if u.kind in ("rdu_section", "wse_layer") and u.id in timeline.unit_spans:
                start, end = timeline.unit_spans[u.id]
                process, _ = _unit_group(u.id, u.kind, [], graph, target)
                group = "sections" if u.kind == "rdu_section" else "layers"
                tracks.add(predicted + process, group, u.id, start, end,
                           {"nodes": len(u.nodes), "allocation": u.allocation}, cat="unit")  # fmt: skip
    if skipped:
        logger.info("trace: %d later micro-batch runs folded into their node's args (runs, busy_s)", skipped)
    _overheads(tracks, timeline, plan, predicted)
    if measured is not None:
        for name, timing in sorted(measured.nodes.items(), key=lambda kv: (kv[1].start, kv[0])):
            args = _node_args(graph, name, roles)
            args["unit"] = timing.unit
            tracks.add("measured: host (onnxruntime)", "host", name, timing.start, timing.end, args,
                       cat=args.get("op_type", "node"))  # fmt: skip
        _overheads(tracks, measured, None, "measured: ")
    return tracks.events


def _ipu_phases(tracks: _Tracks, process: str, name: str, start: float, end: float, np_: Any,
                args: dict[str, Any]) -> None:  # fmt: skip
    """An IPU node run as its bulk-synchronous phases: compute, then exchange, then sync."""
    work = max(np_.compute_s, np_.memory_s)
    parts = [("compute", work), ("exchange", np_.comm_s), ("sync", np_.overhead_s)]
    total = sum(p for _, p in parts)
    if total <= 0:
        tracks.add(process, "compute", name, start, end, args, cat=args.get("op_type", "node"))
        return
    t = start
    for phase, part in parts:
        if part <= 0:
            continue
        stop = t + (end - start) * part / total
        tracks.add(process, phase, name, t, stop, {**args, "phase": phase}, cat=args.get("op_type", "node"))
        t = stop


def _overheads(tracks: _Tracks, timeline: Timeline, plan: Any, prefix: str) -> None:
    """Slices for the step costs no node owns: unit gaps where the units start, memory stalls
    where a unit outlasts its nodes, the rest after the last node."""
    remaining = {k: v for k, v in (timeline.overheads_s or {}).items() if v}
    if not remaining:
        return
    process = f"{prefix}overheads"
    spans = timeline.unit_spans or {}
    if plan is not None:
        gaps = [(u, u.gap_before_s) for u in plan.units if u.gap_before_s > 0 and u.id in spans]
        total_gap = sum(g for _, g in gaps)
        for u, gap in gaps:
            kind = getattr(u, "gap_kind", None) or _matching(remaining, total_gap) or "unit gap"
            start = spans[u.id][0] - gap
            tracks.add(process, kind, kind, start, start + gap, {"unit": u.id, "bound": "overhead"}, cat="overhead")
        if gaps:
            kind = getattr(gaps[0][0], "gap_kind", None) or _matching(remaining, total_gap)
            if kind in remaining:
                remaining[kind] = max(0.0, remaining[kind] - total_gap)
        if "memory_stall" in remaining:
            for u in plan.units:
                ends = [timeline.nodes[n].end for n in u.nodes if n in timeline.nodes]
                if u.id not in spans or not ends:
                    continue
                stall = spans[u.id][1] - max(ends)
                if stall > 1e-15:
                    tracks.add(process, "memory_stall", "memory_stall", max(ends), spans[u.id][1],
                               {"unit": u.id, "bound": "overhead"}, cat="overhead")  # fmt: skip
                    remaining["memory_stall"] = max(0.0, remaining["memory_stall"] - stall)
    t = max(timeline.makespan_s, max((b for _, b in spans.values()), default=0.0))
    for kind, seconds in remaining.items():
        if seconds > 1e-15:
            tracks.add(process, kind, kind, t, t + seconds, {"bound": "overhead"}, cat="overhead")
            t += seconds


def _matching(overheads: Mapping[str, float], total: float) -> str | None:
    """The overhead whose amount the unit gaps add up to (e.g. ``section_reconfig``)."""
    for kind, seconds in overheads.items():
        if total > 0 and abs(seconds - total) <= 1e-9 * max(seconds, total):
            return kind
    return None


def track_count(events: list[dict[str, Any]]) -> int:
    """Distinct (process, thread) pairs holding slices."""
    return len({(e["pid"], e["tid"]) for e in events if e.get("ph") == "X"})


def validate_trace(doc: Mapping[str, Any]) -> list[str]:
    """Problems with a trace document against the trace-event format (empty: valid).

    Checks the JSON-object form (``traceEvents`` list), the fields each phase needs
    (``X``: name, pid, tid, numeric ts and dur >= 0; ``M``: a known metadata name and its
    args), and that complete events on one thread nest (a slice that starts inside
    another ends inside it), which viewers need to draw them.
    """
    problems: list[str] = []
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is not a list"]
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    for i, e in enumerate(events):
        ph = e.get("ph")
        if ph not in ("X", "M", "B", "E", "i", "C"):
            problems.append(f"event {i}: unknown phase {ph!r}")
            continue
        for key in ("name", "pid", "tid") if ph != "C" else ("name", "pid"):
            if key not in e:
                problems.append(f"event {i} ({ph}): no {key}")
        if ph == "M":
            if e.get("name") not in ("process_name", "process_sort_index", "thread_name", "thread_sort_index",
                                     "process_labels"):  # fmt: skip
                problems.append(f"event {i}: unknown metadata {e.get('name')!r}")
            if not isinstance(e.get("args"), dict):
                problems.append(f"event {i}: metadata without args")
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)):
            problems.append(f"event {i} ({ph}): ts is not a number")
            continue
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"event {i}: dur missing or negative")
                continue
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur, str(e.get("name"))))
    for key, slices in by_thread.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple[float, float, str]] = []
        for start, end, name in slices:
            while stack and stack[-1][1] <= start + _EPS_US:
                stack.pop()
            if stack and end > stack[-1][1] + _EPS_US:
                problems.append(f"thread {key}: {name} overlaps {stack[-1][2]} without nesting")
                break
            stack.append((start, end, name))
    return problems


def write_chrome_trace(
    timeline: Timeline,
    graph: Graph,
    path: str | Path,
    *,
    plan: Any = None,
    roles: Mapping[str, str] | None = None,
    measured: Timeline | None = None,
) -> Path:
    """Write the trace JSON to ``path`` (see `chrome_trace_events`) and return it."""
    path = Path(path)
    events = chrome_trace_events(timeline, graph, plan=plan, roles=roles, measured=measured)
    doc = {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "source": timeline.source,
            "step_time_s": timeline.step_time_s,
            "samples_per_step": timeline.samples_per_step,
            "overheads_s": timeline.overheads_s,
            "tracks": track_count(events),
            **({"measured_step_time_s": measured.step_time_s} if measured is not None else {}),
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    logger.info("wrote Chrome trace %s (%d events, %d tracks)", path, len(events), track_count(events))
    return path


def write_report_trace(report: Any, path: str | Path) -> Path:
    """The trace of a Report: its timeline on its plan's units, node roles in the args, and the
    measured host timeline as its own process when the report has one beside a prediction."""
    roles = {n.name: n.role for n in report.nodes if n.role}
    return write_chrome_trace(
        report.timeline, report.graph, path, plan=report.plan, roles=roles, measured=report.measured_timeline
    )
