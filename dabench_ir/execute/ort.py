"""Run a model in onnxruntime with its per-node profiler, and join the events to nodes.

The profiler writes Chrome-trace JSON: one ``cat == "Node"`` event per kernel run, named
``<node>_kernel_time``, with ``dur`` in microseconds and ``args.op_name``/``args.provider``,
and one ``model_run`` session event per ``InferenceSession.run``. On the CUDA execution provider
a Node event's ``dur`` is the host's launch time; the device time is in the ``cat == "Kernel"``
events (CUDA kernels, recorded through CUPTI when onnxruntime is built with
``--enable_cuda_profiling``): each follows the Node event that launched it in the file, with
``ts`` = that node's ``ts`` plus 1, 2, ... and ``args.op_name`` copied from it (onnxruntime
``core/common/gpu_profiler_common.cc``, ``GPUProfilerBase::MergeEvents``). A CUDA node's time is
the sum of its kernels' ``dur``; a kernel no node claims is kept as its own labelled row
(`OrtProfile.unmatched_kernels`), never dropped. Node events are grouped
by the run whose window holds them, warm-up runs are dropped, and the median over the
remaining runs is kept. One basis everywhere (**warm median**): each kernel's time is its
median over the warm runs, the overhead is the median over the warm runs of the run's
duration less its kernels, and the headline step is their sum.

With graph optimisation on, onnxruntime replaces groups of nodes by fused ones
(MatMul+Add -> Gemm, LayerNorm, GELU, ...). `map_fused` recovers which original nodes
each optimised node replaced by walking the original graph back from the optimised node's
outputs to its inputs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.ir import walk_back
from dabench_ir.passes.cost_rules import OpClass, op_traits

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = [
    "AUTO_MAX_RUNS",
    "AUTO_MAX_S",
    "AUTO_TARGET",
    "KERNEL_CAT",
    "UNMATCHED_KERNEL_PREFIX",
    "FusionMap",
    "OrtProfile",
    "default_threads",
    "map_fused",
    "median_ci_halfwidth",
    "rel_spread",
    "resolve_provider",
    "run_profiled",
]

logger = logging.getLogger(__name__)

_SUFFIX = "_kernel_time"
AUTO_TARGET = 0.02
"""``repeat="auto"``: stop once the median run time is known to within this (95% CI half-width, relative)."""
AUTO_MIN_RUNS = 8
AUTO_MAX_RUNS = 200
AUTO_MAX_S = 10.0
"""``repeat="auto"`` never runs more than this many timed runs, nor longer than this many seconds."""
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def default_threads() -> int:
    """The intra-op thread count used when none is given: the CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_provider(provider: str | None) -> str:
    """``None``/``cpu``/``cuda`` or a full onnxruntime provider name -> an available provider."""
    import onnxruntime as ort

    name = _PROVIDERS.get((provider or "cpu").lower(), provider or "CPUExecutionProvider")
    available = ort.get_available_providers()
    if name not in available:
        raise UserError(f"onnxruntime execution provider {name} is not available here (have: {', '.join(available)})")
    return name


@dataclass(slots=True)
class OrtProfile:
    """Median kernel times per onnxruntime node, and what ran them."""

    node_times: dict[str, float]  # ORT node name -> median seconds per run
    op_types: dict[str, str]  # ORT node name -> op_name as onnxruntime ran it
    providers: dict[str, str]  # ORT node name -> execution provider
    order: list[str]  # ORT node names in the order they first ran
    run_time_s: float  # the headline step: sum of the per-node warm medians + the warm median overhead
    run_times_s: list[float] = field(default_factory=list)  # each warm model_run's duration
    overhead_s: float = 0.0  # warm median of (model_run duration - the kernels run in it)
    run_median_s: float = 0.0  # warm median model_run duration (for reference; close to run_time_s)
    optimized: onnx.ModelProto | None = None  # the graph onnxruntime ran, when optimisation was on
    node_spread: dict[str, float] = field(default_factory=dict)  # ORT node -> IQR / median over the warm runs
    run_spread: float = 0.0  # IQR / median of the warm runs' durations
    kernels: dict[str, list[str]] = field(default_factory=dict)  # ORT node -> the CUDA kernels it launched
    unmatched_kernels: dict[str, float] = field(default_factory=dict)  # labelled row -> median seconds per run


def run_profiled(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    *,
    warmup: int = 2,
    repeat: int | str = 5,
    threads: int | None = None,
    ort_opt: bool = False,
    provider: str | None = None,
) -> OrtProfile:
    """Run ``model`` ``warmup + repeat`` times with profiling on; medians over the repeats.

    ``repeat="auto"``: timed runs go on until the median run time is known to within
    `AUTO_TARGET` (at least `AUTO_MIN_RUNS`, at most `AUTO_MAX_RUNS` runs or `AUTO_MAX_S`).
    """
    import onnx
    import onnxruntime as ort

    if (repeat != "auto" and (not isinstance(repeat, int) or repeat < 1)) or warmup < 0:
        raise UserError(f"need repeat >= 1 and warmup >= 0 (got repeat={repeat}, warmup={warmup})")
    providers = [resolve_provider(provider)]
    if providers[0] != "CPUExecutionProvider":
        providers.append("CPUExecutionProvider")
    with tempfile.TemporaryDirectory(prefix="dabench-ort-") as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        so.intra_op_num_threads = threads or default_threads()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 4  # fatal only: a load error reaches the user as our one line
        so.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL if ort_opt else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        opt_path = os.path.join(tmp, "optimized.onnx")
        if ort_opt:
            so.optimized_model_filepath = opt_path
        source: Any = model.SerializeToString() if model.ByteSize() < PROTO_LIMIT_BYTES else _external(model, tmp)
        try:
            session = ort.InferenceSession(source, so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise UserError(f"onnxruntime cannot load the model: {str(exc).splitlines()[0][:300]}") from None
        if providers[0] not in session.get_providers():  # onnxruntime falls back to the CPU without a device
            raise UserError(
                f"onnxruntime could not start {providers[0]} (no usable device here); "
                "refusing to measure on the CPU instead"
            )
        try:
            for _ in range(warmup):
                session.run(None, feeds)
            if repeat == "auto":
                _run_until_known(session, feeds)
            else:
                for _ in range(repeat):
                    session.run(None, feeds)
        except Exception as exc:
            raise UserError(f"onnxruntime failed running the model: {str(exc).splitlines()[0][:300]}") from None
        profile_file = session.end_profiling()
        with open(profile_file, encoding="utf-8") as fh:
            events = json.load(fh)
        optimized = onnx.load(opt_path, load_external_data=False) if ort_opt and os.path.exists(opt_path) else None
    result = parse_profile(events, warmup=warmup)
    result.optimized = optimized
    return result


def median_ci_halfwidth(values: Sequence[float]) -> float:
    """Half the width of a distribution-free 95% confidence interval of the median (order
    statistics n/2 -+ 0.98 sqrt(n)), relative to the median; inf with fewer than 3 values."""
    n = len(values)
    xs = sorted(values)
    med = statistics.median(xs) if xs else 0.0
    if n < 3 or med <= 0:
        return math.inf
    lo = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))
    hi = min(n - 1, math.ceil(n / 2 + 0.98 * math.sqrt(n)) - 1)
    return (xs[hi] - xs[lo]) / (2 * med)


def rel_spread(values: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than 2 values or a zero median)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    if med <= 0:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[2] - q[0]) / med


def _run_until_known(session: object, feeds: dict[str, np.ndarray]) -> int:
    """Timed runs until the median's confidence interval is within `AUTO_TARGET`; how many."""
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        session.run(None, feeds)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t0)
        n = len(times)
        if n >= AUTO_MAX_RUNS or time.perf_counter() - start >= AUTO_MAX_S:
            return n
        if n >= AUTO_MIN_RUNS and median_ci_halfwidth(times) <= AUTO_TARGET:
            return n


PROTO_LIMIT_BYTES = 2**31 - 2**20
"""Protobuf cannot serialize a message of 2 GiB or more: a larger model is handed to
onnxruntime as a file whose tensors live in one external-data file beside it."""


def _external(model: onnx.ModelProto, folder: str) -> str:
    """Save ``model`` with its tensors as external data in ``folder``; return the model's path."""
    import onnx

    path = os.path.join(folder, "model.onnx")
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.data",
        size_threshold=1024,
    )
    return path


def parse_profile(events: Sequence[dict], *, warmup: int = 0) -> OrtProfile:
    """Median per-node kernel time over the runs after the first ``warmup``."""
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
    )
    kept = runs[warmup:]
    if not kept:
        raise UserError("the onnxruntime profile holds no measured run (is repeat >= 1?)")
    if any(e.get("cat") == "Node" and _on_device(e) for e in events) and not any(
        e.get("cat") == KERNEL_CAT for e in events
    ):
        raise UserError(
            "this onnxruntime build records no CUDA kernel events, so node times on the GPU are unknown "
            "(a Node event's dur is the host's launch); use an onnxruntime built with "
            "--enable_cuda_profiling, CUPTI on the library path"
        )
    windows = [(r["ts"], r["ts"] + r["dur"]) for r in kept]
    per_run: list[dict[str, float]] = [{} for _ in kept]
    op_types: dict[str, str] = {}
    providers: dict[str, str] = {}
    order: list[str] = []
    kernels: dict[str, list[str]] = {}
    stray: list[dict[str, float]] = [{} for _ in kept]
    running_until = [0 for _ in kept]  # per run: where the host node event that runs now ends
    w = 0
    for event, parent in sorted(_with_parents(events), key=lambda pair: pair[0]["ts"]):
        ts = event["ts"]
        while w < len(windows) and ts > windows[w][1]:
            w += 1
        if w == len(windows):
            break
        if ts < windows[w][0]:
            continue  # a warm-up run or session set-up
        seconds = event["dur"] * 1e-6
        if event.get("cat") == KERNEL_CAT:
            if parent is None:
                label = f"{UNMATCHED_KERNEL_PREFIX}{event.get('name', '?')}"
                stray[w][label] = stray[w].get(label, 0.0) + seconds
                continue
            name = parent["name"][: -len(_SUFFIX)]
            launched = kernels.setdefault(name, [])
            if event.get("name", "?") not in launched:
                launched.append(event.get("name", "?"))
        else:
            name = event["name"][: -len(_SUFFIX)]
            if _on_device(event):
                seconds = 0.0  # its dur is the host's launch; its kernels carry the device time
            elif ts + event["dur"] <= running_until[w] and ts < running_until[w]:
                continue  # a node of an If, Loop or Scan's subgraph: its time is inside its parent node's
            else:
                running_until[w] = ts + event["dur"]
        per_run[w][name] = per_run[w].get(name, 0.0) + seconds
        if name not in op_types:
            args = (parent or event).get("args", {})
            op_types[name] = str(args.get("op_name", ""))
            providers[name] = str(args.get("provider", ""))
            order.append(name)
    node_times = {name: statistics.median(run.get(name, 0.0) for run in per_run) for name in order}
    labels = sorted({label for run in stray for label in run})
    unmatched_kernels = {label: statistics.median(run.get(label, 0.0) for run in stray) for label in labels}
    run_times = [r["dur"] * 1e-6 for r in kept]
    overhead = max(
        0.0,
        statistics.median(
            t - sum(run.values()) - sum(extra.values()) for t, run, extra in zip(run_times, per_run, stray, strict=True)
        ),
    )
    spread = {name: rel_spread([run.get(name, 0.0) for run in per_run]) for name in order}
    return OrtProfile(
        node_spread=spread,
        run_spread=rel_spread(run_times),
        node_times=node_times,
        op_types=op_types,
        providers=providers,
        order=order,
        run_time_s=sum(node_times.values()) + sum(unmatched_kernels.values()) + overhead,
        run_times_s=run_times,
        overhead_s=overhead,
        run_median_s=statistics.median(run_times),
        kernels=kernels,
        unmatched_kernels=unmatched_kernels,
    )


KERNEL_CAT = "Kernel"
"""The ``cat`` of a device kernel event in onnxruntime's profile (CUDA / ROCm execution providers)."""
UNMATCHED_KERNEL_PREFIX = "cuda kernel without a node: "
"""How a kernel no node event claims is labelled in `OrtProfile.unmatched_kernels`."""


def _on_device(node_event: dict) -> bool:
    return str(node_event.get("args", {}).get("provider", "")) == _PROVIDERS["cuda"]


def _with_parents(events: Sequence[dict]) -> list[tuple[dict, dict | None]]:
    """Node and Kernel events in file order, each Kernel with the Node event that launched it.

    onnxruntime writes a node's kernels right after its Node event, at ``ts`` = the node's ``ts`` +
    1, 2, ... and with the node's ``args.op_name``; a kernel that follows no node of the CUDA
    provider, or whose ``ts`` or op name does not fit the node before it, has no parent (None).
    """
    out: list[tuple[dict, dict | None]] = []
    parent: dict | None = None
    count = 0
    for event in events:
        cat = event.get("cat")
        if cat == "Node" and event.get("name", "").endswith(_SUFFIX):
            parent, count = (event if _on_device(event) else None), 0
            out.append((event, None))
        elif cat == KERNEL_CAT:
            count += 1
            fits = (
                parent is not None
                and 0 < event.get("ts", 0) - parent["ts"] <= count
                and str(event.get("args", {}).get("op_name", ""))
                in ("", str(parent.get("args", {}).get("op_name", "")))
            )
            out.append((event, parent if fits else None))
    return out


@dataclass(slots=True)
class FusionMap:
    """How onnxruntime's optimised graph relates to the original one."""

    members: dict[str, list[str]]  # optimised node -> original nodes it stands for
    anchors: dict[str, str]  # optimised node -> the member its time is attributed to
    folded: set[str]  # original nodes removed by constant folding
    removed: set[str]  # original nodes gone for another reason (eliminated)
    inserted: set[str]  # optimised nodes standing for no original node (copies, layout)
    joined: dict[str, str] = field(default_factory=dict)  # inserted node -> the mapped node it works for


def map_fused(original: onnx.ModelProto, optimized: onnx.ModelProto) -> FusionMap:
    """Map each optimised node back to the original nodes it replaced.

    A node kept under its own name maps to itself; a fused node's time is attributed to
    its contraction member (the MatMul of a MatMul+Add) or else to the member producing
    its output. A new (fused) node claims every removed
    original node between its inputs and its outputs, found by walking the original
    graph back from the outputs until reaching one of its inputs, a graph input or
    initializer, or a node that is still there. Removed nodes all of whose inputs are
    constant were constant-folded.
    """
    og = original.graph
    producer: dict[str, str] = {}
    inputs_of: dict[str, list[str]] = {}
    index: dict[str, int] = {}
    op_of: dict[str, str] = {}
    for i, node in enumerate(og.node):
        index[node.name] = i
        op_of[node.name] = node.op_type
        inputs_of[node.name] = [t for t in node.input if t]
        for out in node.output:
            if out:
                producer[out] = node.name
    opt_names = {n.name for n in optimized.graph.node}
    gone = {n.name for n in og.node} - opt_names

    constant = {init.name for init in og.initializer}
    folded: set[str] = set()
    for node in og.node:  # topological order: a node is constant when all its inputs are
        if all(t in constant for t in inputs_of[node.name]) and node.name in gone:
            folded.add(node.name)
            constant.update(o for o in node.output if o)

    boundary = {vi.name for vi in og.input} | {init.name for init in og.initializer}
    members: dict[str, list[str]] = {}
    anchors: dict[str, str] = {}
    claimed: set[str] = set()
    inserted: set[str] = set()
    for node in optimized.graph.node:
        found: list[str] = []
        if node.name in index:
            found.append(node.name)
        anchor = None

        def claim(tensor: str, this: str = node.name, found: list[str] = found) -> list[str]:
            """The inputs of the source node that wrote ``tensor``, when this optimised node replaced it."""
            nonlocal anchor
            prod = producer.get(tensor)
            if prod is None or prod in claimed or prod in folded or prod == this:
                return []
            if prod in opt_names:
                return []  # still in the optimised graph: not replaced by this node
            claimed.add(prod)
            found.append(prod)
            anchor = anchor or prod
            return inputs_of[prod]

        walk_back(node.output, claim, boundary | {t for t in node.input if t})  # the first output first
        if not found:
            inserted.add(node.name)
            continue
        found.sort(key=index.__getitem__)
        members[node.name] = found
        heavy = [m for m in found if op_traits(op_of[m]).op_class is OpClass.CONTRACTION]
        anchors[node.name] = node.name if node.name in index else (heavy[0] if heavy else anchor or found[-1])
    removed = gone - claimed - folded
    joined = _join_inserted(optimized, members, inserted)
    return FusionMap(
        members=members, anchors=anchors, folded=folded, removed=removed, inserted=inserted - set(joined), joined=joined
    )


def _join_inserted(optimized: onnx.ModelProto, members: dict[str, list[str]], inserted: set[str]) -> dict[str, str]:
    """Inserted nodes next to a mapped one work for it: MatMulAddFusion writes a Gemm between a
    reshape of its input and a reshape of its output, and only the output reshape keeps a tensor
    of the original graph. Each inserted node joins the group of a mapped consumer in the optimised
    graph, repeated until nothing changes (a reshape before a Gemm joins the Gemm once the Gemm has
    joined the reshape after it); only then may one with no such consumer join a mapped producer."""
    producer: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    for node in optimized.graph.node:
        for t in node.output:
            if t:
                producer[t] = node.name
        for t in node.input:
            if t:
                consumers.setdefault(t, []).append(node.name)
    by_name = {n.name: n for n in optimized.graph.node}
    owner: dict[str, str] = {}

    def group(name: str) -> str | None:
        return name if name in members else owner.get(name)

    def neighbours(name: str, producers: bool) -> list[str]:
        node = by_name[name]
        near = [c for t in node.output if t for c in consumers.get(t, ())]
        return near + [producer[t] for t in node.input if t in producer] if producers else near

    for producers in (False, True):  # consumers first, to a fixed point; producers for what is left
        changed = True
        while changed:
            changed = False
            for name in sorted(inserted - set(owner)):
                g = next((g for other in neighbours(name, producers) if (g := group(other)) is not None), None)
                if g is not None:
                    owner[name] = g
                    changed = True
    return owner
