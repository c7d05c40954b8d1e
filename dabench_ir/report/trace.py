"""Chrome trace-event JSON of a Timeline, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process per unit (its track group), one thread per lane inside it (RDU pipeline
stages; a single lane elsewhere), and one complete ("X") slice per node run, with the
node's FLOPs, bytes, bound and op type in its args.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dabench_ir.ir import Graph
from dabench_ir.timeline import Timeline

__all__ = ["chrome_trace_events", "write_chrome_trace"]

logger = logging.getLogger(__name__)
_US = 1e6


def _node_args(graph: Graph, name: str) -> dict[str, Any]:
    from dabench_ir.passes import meta

    args: dict[str, Any] = {}
    if not graph.has_node(name):
        return args
    node = graph.node(name)
    args["op_type"] = node.op_type
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


def chrome_trace_events(timeline: Timeline, graph: Graph) -> list[dict[str, Any]]:
    """Trace events (metadata first, then slices in start order)."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    events: list[dict[str, Any]] = []
    for name, timing in sorted(timeline.nodes.items(), key=lambda kv: (kv[1].start, kv[0])):
        unit = timing.unit
        lane = timeline.lanes.get(name, unit)
        if unit not in pids:
            pids[unit] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[unit], "tid": 0, "args": {"name": unit}})
            events.append(
                {"ph": "M", "name": "process_sort_index", "pid": pids[unit], "tid": 0, "args": {"sort_index": pids[unit]}}
            )
        if (unit, lane) not in tids:
            tids[(unit, lane)] = len([k for k in tids if k[0] == unit]) + 1
            label = lane if lane != unit else unit
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pids[unit], "tid": tids[(unit, lane)], "args": {"name": label}}
            )
        args = _node_args(graph, name)
        args["bound"] = str(timing.bound) if timing.bound is not None else None
        runs = timeline.slices.get(name) or [(timing.start, timing.end)]
        for m, (start, end) in enumerate(runs):
            slice_args = dict(args)
            if len(runs) > 1:
                slice_args["micro_batch"] = m
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": args.get("op_type", "node"),
                    "pid": pids[unit],
                    "tid": tids[(unit, lane)],
                    "ts": start * _US,
                    "dur": max(0.0, (end - start) * _US),
                    "args": slice_args,
                }
            )
    return events


def write_chrome_trace(timeline: Timeline, graph: Graph, path: str | Path) -> Path:
    """Write the trace JSON to ``path`` and return it."""
    path = Path(path)
    doc = {
        "traceEvents": chrome_trace_events(timeline, graph),
        "displayTimeUnit": "ns",
        "otherData": {
            "source": timeline.source,
            "step_time_s": timeline.step_time_s,
            "samples_per_step": timeline.samples_per_step,
            "overheads_s": timeline.overheads_s,
        },
    }
    from dabench_ir.fileio import write_output

    write_output(path, json.dumps(doc, default=str))
    logger.info("wrote Chrome trace %s (%d events)", path, len(doc["traceEvents"]))
    return path
