"""Chrome trace-event JSON of a Timeline, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One track per hardware unit, not per node: a process per chip-level unit (the WSE wafer,
the RDU, each IPU, the GPU, the host), and inside it one thread per unit group — WSE
kernel regions grouped by decoder layer, streamed WSE layers, RDU PCU groups (the
pipeline stages of the running section), each IPU's compute / exchange / sync phases, a
GPU stream, a host thread. Slices that overlap inside a group are packed onto as few
sub-tracks as needed, so a 7B model gives tens of tracks. Each node run is a complete
("X") slice with the node's FLOPs, bytes, bound and role in its args; the step costs no
node owns (reconfiguration, memory stalls, host time, fill/drain, collectives) are slices
on the target's "step" process, beside two counter tracks ("ph": "C") over the step:
``memory in use`` (the bytes of node outputs written and not yet read by their last
reader, plus what the plan keeps resident) and ``link busy`` (the running nodes' share of
their time spent on links and exchange). A measured host timeline, when given, is its own
process next to the predicted one. A node the plan runs on the host while the device waits
(a GPU's CPU Adam under ``--optimizer-state offchip``: fed from host memory, no device compute)
is drawn on the host process's "CPU" thread, not on the device's. Several targets' reports go into one file
(`write_targets_trace`), each target's processes named after it and kept together.
`validate_trace` checks a document against the trace-event format (required fields per
phase, timestamps in microseconds non-decreasing per track, slices on a thread nested).
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from dabench_ir.ir import Graph
from dabench_ir.plan import PIPELINE_FILL_DRAIN
from dabench_ir.report.attribution import STEP_OVERHEADS, step_overheads
from dabench_ir.report.model import json_bytes
from dabench_ir.timeline import Timeline

__all__ = [
    "chrome_trace_events",
    "track_count",
    "validate_trace",
    "write_chrome_trace",
    "write_report_trace",
    "write_targets_trace",
]

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
    cost = meta.attributed_cost(node)
    if cost is not None:
        args["flops"] = cost.flops
        args["bytes"] = cost.bytes
        if meta.ESTIMATED in node.meta:  # a bytes-only lower bound: its 0 FLOPs are uncounted, not none
            from dabench_ir.passes.cost_rules import ESTIMATED_NOTE

            args["estimated"] = f"{ESTIMATED_NOTE}, bytes only; FLOPs not counted ({node.meta[meta.ESTIMATED]})"
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
            self.events.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            )
        return self.pids[process]

    def add(
        self,
        process: str,
        group: str,
        name: str,
        start_s: float,
        end_s: float,
        args: dict[str, Any],
        cat: str = "node",
        cap: int | None = None,
    ) -> bool:
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
        self.events.append(
            {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": self.tids[key], "ts": ts, "dur": dur, "args": args}
        )
        return True

    def counter(self, process: str, name: str, samples: list[tuple[float, dict[str, float]]]) -> None:
        """A counter track: ``samples`` (seconds, {series: value}) as "C" events, in time order."""
        pid = self.pid(process)
        for t, values in sorted(samples, key=lambda x: x[0]):
            self.events.append(
                {"ph": "C", "name": name, "cat": "counter", "pid": pid, "ts": t * _US, "args": dict(values)}
            )

    def ordered(self) -> list[dict[str, Any]]:
        """Metadata first, then every timed event by timestamp (stable): each track's ``ts`` non-decreasing."""
        meta = [e for e in self.events if e["ph"] == "M"]
        timed = [e for e in self.events if e["ph"] != "M"]
        return meta + sorted(timed, key=lambda e: e["ts"])


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


def _runs_on_host(np_: Any) -> bool:
    """Whether a node's placement runs it on the host, the device waiting: fed from host memory
    with no device compute (`dabench_ir.lowering.gpu.Offload`)."""
    return np_ is not None and np_.feed_level == "host" and np_.compute_s == 0


class _Slice(NamedTuple):
    """One node run drawn on a track: its process and group (the track), the node, when it ran and
    the slice's args."""

    process: str
    group: str
    name: str
    start: float
    end: float
    args: dict[str, Any]


def chrome_trace_events(
    timeline: Timeline,
    graph: Graph,
    *,
    plan: Any = None,
    roles: Mapping[str, str] | None = None,
    measured: Timeline | None = None,
    label: str | None = None,
    tracks: _Tracks | None = None,
    after: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Trace events: metadata for each process and thread, then slices and counters in time
    order (see the module docstring). ``label`` names the target's processes (default: the
    plan's target name); ``tracks`` adds them to another target's trace (`write_targets_trace`);
    ``after``: step costs beyond the timeline's step (a multi-chip step's collectives), drawn after it."""
    roles = roles or {}
    own = tracks is None
    tracks = tracks if tracks is not None else _Tracks()
    target = label if label is not None else getattr(getattr(plan, "target", None), "name", "") or ""
    kinds = {u.id: u.kind for u in plan.units} if plan is not None else {}
    members = {u.id: list(u.nodes) for u in plan.units} if plan is not None else {}
    predicted = "predicted: " if measured is not None else ""
    skipped = 0
    # a node's first run always gets its slice; the later micro-batches' runs only while their
    # group has a free sub-track among _MAX_SUBTRACKS (a spatial pipeline keeps every region busy
    # at once: drawing every run would take a track per region). Each slice's args give the
    # node's run count and busy time, so nothing is lost.
    ordered = sorted(timeline.nodes.items(), key=lambda kv: (kv[1].start, kv[0]))
    later: list[_Slice] = []  # later micro-batches' runs, drawn after every first run
    for name, timing in ordered:
        kind = kinds.get(timing.unit) or ("cpu" if timeline.source == "measured" else None)
        np_ = plan.node_plans.get(name) if plan is not None else None
        if _runs_on_host(np_):
            process, group = f"{target} host".strip(), "CPU"
        else:
            process, group = _unit_group(timing.unit, kind, members.get(timing.unit, []), graph, target)
        process = predicted + process if timeline.source != "measured" else f"measured: {process}"
        args = _node_args(graph, name, roles)
        args["bound"] = str(timing.bound) if timing.bound is not None else None
        args["unit"] = timing.unit
        runs = _every_run(timeline.slices.get(name) or [(timing.start, timing.end)], timeline.micro_batches)
        if len(runs) > 1:
            args["runs"] = len(runs)
        if len(runs) > 1 or name in timeline.streamed_rows:  # a slice that is not its busy time
            args["busy_s"] = timeline.busy(name)
        for m, (start, end) in enumerate(runs):
            slice_args = dict(args)
            if len(runs) > 1:
                slice_args["micro_batch"] = m
            if kind == "ipu" and np_ is not None:
                _ipu_phases(tracks, process, name, start, end, np_, slice_args)
            elif m == 0:
                tracks.add(process, group, name, start, end, slice_args, cat=args.get("op_type", "node"))
            else:
                later.append(_Slice(process=process, group=group, name=name, start=start, end=end, args=slice_args))
    for run in sorted(later, key=lambda run: run.start):
        cat = run.args.get("op_type", "node")
        if not tracks.add(run.process, run.group, run.name, run.start, run.end, run.args, cat=cat, cap=_MAX_SUBTRACKS):
            skipped += 1
    if plan is not None:  # sequential units (RDU sections, streamed layers): their spans on a track of their own
        for u in plan.units:
            if u.kind in ("rdu_section", "wse_layer") and u.id in timeline.unit_spans:
                start, end = timeline.unit_spans[u.id]
                process, _ = _unit_group(u.id, u.kind, [], graph, target)
                group = "sections" if u.kind == "rdu_section" else "layers"
                tracks.add(
                    predicted + process,
                    group,
                    u.id,
                    start,
                    end,
                    {"nodes": len(u.nodes), "allocation": u.allocation},
                    cat="unit",
                )
    if skipped:
        logger.info("trace: %d later micro-batch runs folded into their node's args (runs, busy_s)", skipped)
    step = f"{predicted}{target} step".strip()
    _overheads(tracks, timeline, plan, step)
    t = timeline.step_time_s
    for kind, seconds in (after or {}).items():
        tracks.add(step, kind, kind, t, t + seconds, {"bound": "overhead"}, cat="overhead")
        t += seconds
    _counters(tracks, timeline, graph, plan, step)
    if measured is not None:
        host = "measured: host (onnxruntime)"
        for name, timing in sorted(measured.nodes.items(), key=lambda kv: (kv[1].start, kv[0])):
            args = _node_args(graph, name, roles)
            args["unit"] = timing.unit
            tracks.add(host, "host", name, timing.start, timing.end, args, cat=args.get("op_type", "node"))
        _overheads(tracks, measured, None, host)
        _counters(tracks, measured, graph, None, host)
    return tracks.ordered() if own else tracks.events


def _counters(tracks: _Tracks, timeline: Timeline, graph: Graph, plan: Any, process: str) -> None:
    """The step's counter tracks on ``process``: memory in use and link busy (module docstring)."""
    end = max([timeline.makespan_s, timeline.step_time_s, *(b for _, b in (timeline.unit_spans or {}).values())])
    resident = {k: float(v) for k, v in (getattr(plan, "memory_bytes", None) or {}).items() if v}
    live = _live_bytes(timeline, graph)
    if live or resident:
        changes = live or [(0.0, 0.0)]
        samples = [(t, {**resident, "activations live": b}) for t, b in changes]
        samples.append((max(end, changes[-1][0]), {**resident, "activations live": changes[-1][1]}))
        tracks.counter(process, "memory in use (bytes)", samples)
    links = _link_busy(timeline, plan)
    if links:
        tracks.counter(process, "link busy (share of running nodes' time on links/exchange)", links)


def _live_bytes(timeline: Timeline, graph: Graph) -> list[tuple[float, float]]:
    """(time, bytes) steps of the node outputs alive: from their producer's start to their last
    reader's end (a graph output: to the step's end); values of unknown size are left out."""
    readers: dict[str, float] = {}
    for node in graph.nodes:
        timing = timeline.nodes.get(node.name)
        if timing is not None:
            for v in node.inputs:
                readers[v] = max(readers.get(v, timing.end), timing.end)
    outputs = set(getattr(graph, "outputs", ()) or ())
    deltas: dict[float, float] = {}
    for node in graph.nodes:
        timing = timeline.nodes.get(node.name)
        if timing is None:
            continue
        for v in node.outputs:
            value = graph.values.get(v)
            try:
                nbytes = float(value.type.nbytes(graph.bindings)) if value is not None else 0.0
            except (KeyError, ValueError, TypeError):
                continue
            free = None if v in outputs else readers.get(v, timing.end)  # an output is held to the step's end
            if nbytes and (free is None or free > timing.start):
                deltas[timing.start] = deltas.get(timing.start, 0.0) + nbytes
                if free is not None:
                    deltas[free] = deltas.get(free, 0.0) - nbytes
    out, level = [], 0.0
    for t in sorted(deltas):
        level += deltas[t]
        out.append((t, max(level, 0.0)))
    return out


def _link_busy(timeline: Timeline, plan: Any) -> list[tuple[float, dict[str, float]]]:
    """(time, {"busy": sum over running node runs of comm_s / their time}) steps; [] when no node
    spends time on a link. The lowerings record each node's link and exchange time, not its bytes."""
    if plan is None:
        return []
    deltas: dict[float, float] = {}
    for name, timing in timeline.nodes.items():
        np_ = plan.node_plans.get(name)
        total = 0.0 if np_ is None else max(np_.compute_s, np_.memory_s) + np_.comm_s + np_.overhead_s
        if np_ is None or np_.comm_s <= 0 or total <= 0:
            continue
        share = np_.comm_s / total
        for start, stop in timeline.slices.get(name) or [(timing.start, timing.end)]:
            if stop > start:
                deltas[start] = deltas.get(start, 0.0) + share
                deltas[stop] = deltas.get(stop, 0.0) - share
    out, level = [], 0.0
    for t in sorted(deltas):
        level += deltas[t]
        out.append((t, {"busy": round(max(level, 0.0), 12)}))
    return out


def _ipu_phases(
    tracks: _Tracks, process: str, name: str, start: float, end: float, np_: Any, args: dict[str, Any]
) -> None:
    """An IPU node run as its bulk-synchronous phases: compute, then exchange, then sync. The node's
    FLOPs and bytes ride on its first slice only, so that summing a trace's slices counts them once."""
    work = max(np_.compute_s, np_.memory_s)
    parts = [("compute", work), ("exchange", np_.comm_s), ("sync", np_.overhead_s)]
    total = sum(p for _, p in parts)
    if total <= 0:
        tracks.add(process, "compute", name, start, end, args, cat=args.get("op_type", "node"))
        return
    t = start
    rest = {k: v for k, v in args.items() if k not in ("flops", "bytes")}
    for phase, part in parts:
        if part <= 0:
            continue
        stop = t + (end - start) * part / total
        shown = args if t == start else rest
        tracks.add(process, phase, name, t, stop, {**shown, "phase": phase}, cat=args.get("op_type", "node"))
        t = stop


def _every_run(runs: list[tuple[float, float]], micro_batches: int) -> list[tuple[float, float]]:
    """A node's runs, one a micro-batch. Once its lanes settle into a linear steady state the emulator
    keeps only the last run (`dabench_ir.emulate`); the runs between are at equal steps from the one
    before it (drawn as kept, a step's trace held half a training step's work on 8 micro-batches)."""
    missing = micro_batches - len(runs)
    if missing <= 0 or len(runs) < 2:
        return runs
    (start, end), (last, _) = runs[-2], runs[-1]
    step = (last - start) / (missing + 1)
    return [*runs[:-1], *((start + k * step, end + k * step) for k in range(1, missing + 1)), runs[-1]]


def _overheads(tracks: _Tracks, timeline: Timeline, plan: Any, process: str) -> None:
    """Slices on ``process`` for the step costs no node owns: unit gaps where the units start,
    memory stalls where a unit outlasts its nodes, the rest after the last node. A pipeline's fill
    and drain is none of them: the stages' runs drawn from the first input to the last output hold
    it already (`plan.PIPELINE_FILL_DRAIN`), so drawn after them it was counted twice."""
    remaining = {k: v for k, v in (timeline.overheads_s or {}).items() if v and k != PIPELINE_FILL_DRAIN}
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
                    tracks.add(
                        process,
                        "memory_stall",
                        "memory_stall",
                        max(ends),
                        spans[u.id][1],
                        {"unit": u.id, "bound": "overhead"},
                        cat="overhead",
                    )
                    remaining["memory_stall"] = max(0.0, remaining["memory_stall"] - stall)
    t = max(timeline.makespan_s, max((b for _, b in spans.values()), default=0.0))
    for kind, seconds in remaining.items():
        if seconds > 1e-15:
            tracks.add(process, kind, kind, t, t + seconds, {"bound": "overhead"}, cat="overhead")
            t += seconds
    # a step that drains before the next is as long as the lowering's fill and drain says: what of it
    # the stages' runs do not hold is drawn after them, so the trace ends at the step's latency
    beyond = (timeline.latency_s or 0.0) - t
    if PIPELINE_FILL_DRAIN in (timeline.overheads_s or {}) and beyond > 1e-15:
        tracks.add(
            process, PIPELINE_FILL_DRAIN, PIPELINE_FILL_DRAIN, t, t + beyond, {"bound": "overhead"}, cat="overhead"
        )


def _matching(overheads: Mapping[str, float], total: float) -> str | None:
    """The overhead whose amount the unit gaps add up to (e.g. ``section_reconfig``)."""
    for kind, seconds in overheads.items():
        if total > 0 and abs(seconds - total) <= 1e-9 * max(seconds, total):
            return kind
    return None


def track_count(events: list[dict[str, Any]]) -> int:
    """Distinct (process, thread) pairs holding slices."""
    return len({(e["pid"], e["tid"]) for e in events if e.get("ph") == "X"})


_REQUIRED = {
    "X": ("name", "ph", "pid", "tid", "ts", "dur"),
    "B": ("name", "ph", "pid", "tid", "ts"),
    "E": ("ph", "pid", "tid", "ts"),
    "i": ("name", "ph", "pid", "tid", "ts"),
    "C": ("name", "ph", "pid", "ts", "args"),
    "M": ("name", "ph", "pid", "args"),
}
"""The keys each phase needs (Trace Event Format: "Duration Events", "Complete Events",
"Instant Events", "Counter Events", "Metadata Events")."""


def validate_trace(doc: Mapping[str, Any]) -> list[str]:
    """Problems with a trace document against the trace-event format (empty: valid).

    Checks the JSON-object form (``traceEvents`` list), the keys each phase needs
    (`_REQUIRED`; ``ts`` and ``dur`` numbers in microseconds, ``dur`` >= 0; ``M``: a known
    metadata name; ``C``: numeric series in ``args``), that each track's timestamps never go
    back in file order (a thread's events, a process's counter of one name), and that
    complete events on one thread nest (a slice that starts inside another ends inside it),
    which viewers need to draw them.
    """
    problems: list[str] = []
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is not a list"]
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    last_ts: dict[tuple[Any, ...], float] = {}
    for i, e in enumerate(events):
        ph = e.get("ph") if isinstance(e, dict) else None
        if ph not in _REQUIRED:
            problems.append(f"event {i}: unknown phase {ph!r}")
            continue
        missing = [k for k in _REQUIRED[ph] if k not in e]
        if missing:
            problems.append(f"event {i} ({ph}): no {', '.join(missing)}")
            continue
        if ph == "M":
            if e.get("name") not in (
                "process_name",
                "process_sort_index",
                "thread_name",
                "thread_sort_index",
                "process_labels",
            ):
                problems.append(f"event {i}: unknown metadata {e.get('name')!r}")
            if not isinstance(e.get("args"), dict):
                problems.append(f"event {i}: metadata without args")
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            problems.append(f"event {i} ({ph}): ts is not a number")
            continue
        track = (e["pid"], "counter", e["name"]) if ph == "C" else (e["pid"], e["tid"])
        if ts < last_ts.get(track, ts):
            problems.append(f"event {i} ({ph}): ts {ts} goes back on track {track} (was {last_ts[track]})")
        last_ts[track] = ts
        if ph == "C":
            args = e["args"]
            if (
                not isinstance(args, dict)
                or not args
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args.values())
            ):
                problems.append(f"event {i} (C): args must hold numeric series")
        elif ph == "X":
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


def _other_data(timeline: Timeline, measured: Timeline | None) -> dict[str, Any]:
    return {
        "source": timeline.source,
        "step_time_s": timeline.step_time_s,
        "samples_per_step": timeline.samples_per_step,
        "overheads_s": timeline.overheads_s,
        **({"measured_step_time_s": measured.step_time_s} if measured is not None else {}),
    }


def _report_data(report: Any) -> dict[str, Any]:
    """`_other_data` of a report's timeline, with the report's step: a multi-chip step beyond its
    chip's (its collectives among the overheads), and the basis of its time (a pipelined chip's
    period, and the latency of one step alone)."""
    totals = report.totals
    return {
        **_other_data(report.timeline, report.measured_timeline),
        "step_time_s": totals.get("time_s", report.timeline.step_time_s),
        "time_basis": totals.get("time_basis"),
        "latency_s": totals.get("latency_s"),
        "overheads_s": step_overheads(report),
    }


def _write_doc(path: str | Path, events: list[dict[str, Any]], other: dict[str, Any]) -> Path:
    from dabench_ir.fileio import write_output

    path = Path(path)
    doc = {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {**other, "tracks": track_count(events)}}
    write_output(path, json_bytes(doc))  # NaN and infinity as null
    logger.info("wrote Chrome trace %s (%d events, %d tracks)", path, len(events), track_count(events))
    return path


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
    events = chrome_trace_events(timeline, graph, plan=plan, roles=roles, measured=measured)
    return _write_doc(path, events, _other_data(timeline, measured))


def _report_events(report: Any, tracks: _Tracks | None = None, label: str | None = None) -> list[dict[str, Any]]:
    roles = {n.name: n.role for n in report.nodes if n.role}
    return chrome_trace_events(
        report.timeline,
        report.graph,
        plan=report.plan,
        roles=roles,
        measured=report.measured_timeline,
        label=label,
        tracks=tracks,
        after=report.extra.get(STEP_OVERHEADS),
    )


def write_report_trace(report: Any, path: str | Path) -> Path:
    """The trace of a Report: its timeline on its plan's units, node roles in the args, and the
    measured host timeline as its own process when the report has one beside a prediction."""
    return _write_doc(path, _report_events(report), _report_data(report))


def write_targets_trace(reports: Mapping[str, Any], path: str | Path) -> Path:
    """One trace for several targets' reports (``{name as given: Report}``, a report without a
    timeline left out): each target's processes named after it, in the order given, every
    target's step starting at 0; ``otherData.targets`` holds each one's step figures."""
    tracks = _Tracks()
    other: dict[str, Any] = {}
    for name, report in reports.items():
        if report.timeline is None:
            continue
        actual = getattr(report.target_obj, "name", None) or name
        _report_events(report, tracks, label=name if actual == name else f"{name} ({actual})")
        other[name] = _report_data(report)
    return _write_doc(path, tracks.ordered(), {"targets": other})
