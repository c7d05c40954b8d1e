"""Measured execution: run the model in onnxruntime and time every graph node.

`measure` synthesises what the model lacks (inputs, absent weights), runs it with
onnxruntime's per-node profiler, drops the warm-up runs, and joins the median kernel time
of each onnxruntime node back to the dabench Graph node it came from. Graph optimisation
is off by default so names match one to one; with ``ort_opt`` it stays on and each fused
kernel's time is split over the original nodes it replaced by their predicted share (each
says so in its note), so the per-node times add up to onnxruntime's own profile. The
headline step is on one basis, the warm median: the per-node medians plus the measured
overhead rows (`Measurement.overheads_s`). Every node ends with a measured time or a
reason it has none.

A GPU target is measured on onnxruntime's CUDA execution provider (`measure_provider`): each
node's time is the device time of the CUDA kernels it launched, and a kernel no node claims is
its own labelled row. Where no CUDA provider or device is present the run is refused with one
line, never measured on the CPU instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.execute.ort import default_threads, map_fused, resolve_provider, run_profiled
from dabench_ir.execute.synth import DEFAULT_MAX_WEIGHT_BYTES, name_nodes, prepare_model
from dabench_ir.passes import meta
from dabench_ir.timeline import Bound, NodeTiming, Timeline, classify_bound

if TYPE_CHECKING:
    import onnx

    from dabench_ir.ir import Graph

__all__ = ["DEFAULT_MAX_WEIGHT_BYTES", "Measurement", "NodeRate", "measure", "measure_provider"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeRate:
    """What a node achieved in its measured time, and what bound it on the host roofline."""

    flops_per_s: float | None
    bytes_per_s: float | None
    bound: Bound | None


@dataclass(slots=True)
class Measurement:
    """The measured run: per-node median kernel times, joined to the Graph's nodes."""

    timeline: Timeline
    node_times: dict[str, float]  # graph node -> median seconds
    missing: dict[str, str]  # graph node -> why it has no measured time
    fused: dict[str, list[str]]  # onnxruntime node -> the graph nodes it replaced (ort_opt)
    threads: int
    provider: str
    run_time_s: float  # median session run (model_run) time
    warmup: int = 0
    repeat: int = 0
    ort_opt: bool = False
    ort_version: str = ""
    ort_ops: dict[str, str] = field(default_factory=dict)  # graph node -> op onnxruntime ran
    unmatched: dict[str, float] = field(default_factory=dict)  # ORT-only nodes -> seconds
    rates: dict[str, NodeRate] = field(default_factory=dict)
    synthesized: dict[str, str] = field(default_factory=dict)  # tensor -> what was made up
    notes: dict[str, str] = field(default_factory=dict)  # graph node -> how its measured time was attributed
    overheads_s: dict[str, float] = field(default_factory=dict)  # the measured step's rows no node owns
    run_median_s: float = 0.0  # the median model_run duration (reference; the headline is run_time_s)
    kernel_total_s: float = 0.0  # onnxruntime's own profile: the sum of its per-kernel warm medians
    node_spread: dict[str, float] = field(default_factory=dict)  # graph node -> IQR / median of its warm runs
    run_spread: float = 0.0  # IQR / median of the warm runs' durations
    repeat_auto: bool = False  # repeat="auto": runs went on until the median was known to within 2%

    BASIS = "warm median: per-node medians over the warm runs + the median per-run overhead"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": "measured",
            "provider": self.provider,
            "threads": self.threads,
            "warmup": self.warmup,
            "repeat": self.repeat,
            "ort_opt": self.ort_opt,
            "ort_version": self.ort_version,
            "run_time_s": self.run_time_s,
            "basis": self.BASIS,
            "run_median_s": self.run_median_s,
            "ort_kernel_total_s": self.kernel_total_s,
            "overheads_s": dict(self.overheads_s),
            "node_times_s": dict(self.node_times),
            "notes": dict(self.notes),
            "missing": dict(self.missing),
            "fused": {k: list(v) for k, v in self.fused.items()},
            "unmatched_s": dict(self.unmatched),
            "rates": {
                n: {
                    "flops_per_s": r.flops_per_s,
                    "bytes_per_s": r.bytes_per_s,
                    "bound": None if r.bound is None else str(r.bound),
                }
                for n, r in self.rates.items()
            },
            "synthesized": dict(self.synthesized),
            "node_spread_rel": dict(self.node_spread),
            "run_spread_rel": self.run_spread,
            "repeat_auto": self.repeat_auto,
        }


def measure_provider(target_kind: str | None, target_name: str = "") -> str:
    """The onnxruntime execution provider ``--measure`` runs a target of ``target_kind`` on:
    ``cpu`` for the host (or no target), ``cuda`` for a GPU. Raises `UserError` (one line) when a
    GPU target finds no CUDA provider here, or for a kind no provider measures."""
    from dabench_ir.errors import UserError

    if target_kind in (None, "cpu"):
        return "cpu"
    name = target_name or str(target_kind)
    if target_kind != "gpu":
        raise UserError(
            f"--measure runs the model in onnxruntime on this host's CPU or an NVIDIA GPU, so it cannot "
            f"measure --target {name} ({target_kind}); drop --measure to emulate {name}"
        )
    try:
        resolve_provider("cuda")
    except UserError as exc:
        raise UserError(
            f"--measure --target {name} runs onnxruntime's CUDA execution provider: {exc}; install "
            f"onnxruntime-gpu on a machine with an NVIDIA GPU, drop --measure to emulate {name}, or use "
            "--target cpu to measure this host"
        ) from None
    return "cuda"


def measure(
    model: str | os.PathLike[str] | onnx.ModelProto,
    graph: Graph | None = None,
    *,
    dims: Mapping[str, int] | None = None,
    warmup: int = 2,
    repeat: int | str = 5,
    threads: int | None = None,
    ort_opt: bool = False,
    max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    provider: str | None = None,
    target: Any = None,
    seed: int = 0,
) -> Measurement:
    """Run ``model`` in onnxruntime and time each node of ``graph``.

    ``graph`` is the dabench Graph of the same model (loaded and costed here when None, as
    ``profile --measure`` costs it: a fused kernel is split by its members' predictions);
    ``dims`` binds symbolic dims; ``threads`` is the onnxruntime intra-op thread count
    (default: the count ``target`` was calibrated at, else the CPUs this process may use;
    another count than a calibrated target's raises UserError). With ``target`` (the
    calibrated ``cpu`` target) each node's bound is classified against the measured host
    roofline. ``repeat="auto"``
    runs until the median run time is known to within 2%; every node carries its spread
    (IQR over median of its warm runs) in `Measurement.node_spread`.
    """
    import onnxruntime as ort

    from dabench_ir.frontends.onnx import read_model
    from dabench_ir.lowering.cpu import calibrated_threads
    from dabench_ir.options import check_calibrated_threads

    ort.set_default_logger_severity(4)  # onnxruntime's own [E:onnxruntime...] lines: our error is the one line

    proto, path = read_model(model)
    check_calibrated_threads(target, threads)
    threads = int(threads or calibrated_threads(getattr(target, "raw", target)) or default_threads())
    if graph is None:
        from dabench_ir.pipeline import analyze

        graph = analyze(proto if path is None else path, dims=dims)
    provider_name = resolve_provider(provider)

    prepared = prepare_model(
        proto, path=Path(path) if path else None, graph=graph, dims=dims, max_weight_bytes=max_weight_bytes, seed=seed
    )
    name_nodes(prepared.model, graph)
    profile = run_profiled(
        prepared.model,
        prepared.feeds,
        warmup=warmup,
        repeat=repeat,
        threads=threads,
        ort_opt=ort_opt,
        provider=provider_name,
    )

    joined = (
        _join_fused(graph, prepared.model, profile, target, threads)
        if ort_opt and profile.optimized is not None
        else _join_nodes(graph, profile)
    )
    _mark_missing(graph, joined)
    for name, t in joined.unmatched.items():
        logger.debug(
            "onnxruntime node %s (%s) matches no graph node: %.1f us", name, profile.op_types.get(name, "?"), t * 1e6
        )
    rates = _rates(graph, joined.node_times, target)
    unit = "cpu" if provider_name == "CPUExecutionProvider" else provider_name.removesuffix("ExecutionProvider").lower()
    timeline, overheads = _measured_timeline(graph, joined, rates, unit, profile, dims)
    return Measurement(
        timeline=timeline,
        node_times=joined.node_times,
        missing=joined.missing,
        fused=joined.fused,
        threads=threads,
        provider=provider_name,
        run_time_s=profile.run_time_s,
        warmup=warmup,
        repeat=len(profile.run_times_s) if repeat == "auto" else repeat,
        ort_opt=ort_opt,
        ort_version=ort.__version__,
        ort_ops=joined.ort_ops,
        unmatched=joined.unmatched,
        rates=rates,
        synthesized=prepared.synthesized,
        notes=joined.notes,
        overheads_s=overheads,
        run_median_s=profile.run_median_s,
        kernel_total_s=sum(profile.node_times.values()),
        node_spread=joined.spread,
        run_spread=profile.run_spread,
        repeat_auto=repeat == "auto",
    )


@dataclass
class _Joined:
    """onnxruntime's profile joined back to the graph's nodes: each node's measured seconds, spread,
    onnxruntime op and note; the nodes with no kernel (and why); the fused kernels (ORT node ->
    its source nodes); the ORT nodes and kernels that match no graph node, with their seconds."""

    node_times: dict[str, float] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    ort_ops: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    fused: dict[str, list[str]] = field(default_factory=dict)
    unmatched: dict[str, float] = field(default_factory=dict)


def _join_nodes(graph: Graph, profile: Any) -> _Joined:
    """A profile of the model as written (no onnxruntime graph optimisation): ORT nodes are the
    graph's, by name."""
    joined = _Joined()
    known = {n.name for n in graph.nodes}
    for ort_name, t in profile.node_times.items():
        if ort_name not in known:
            joined.unmatched[ort_name] = t
            continue
        joined.node_times[ort_name] = t
        joined.spread[ort_name] = profile.node_spread.get(ort_name, 0.0)
        joined.ort_ops[ort_name] = profile.op_types.get(ort_name, "")
        if profile.kernels.get(ort_name):
            joined.notes[ort_name] = "measured: its CUDA kernels " + ", ".join(profile.kernels[ort_name])
    return joined


def _join_fused(graph: Graph, model: onnx.ModelProto, profile: Any, target: Any, threads: int) -> _Joined:
    """A profile of onnxruntime's optimised graph: each ORT kernel (with the nodes onnxruntime
    inserted to work for it) is mapped to its source nodes (`map_fused`); a fused kernel's time is
    split over its members by their predicted shares (at the measured ``threads``), in equal shares
    when none of them has a prediction; folded and removed nodes are named."""
    joined = _Joined()
    fmap = map_fused(model, profile.optimized)
    predicted, basis = _predicted_times(graph, target, threads)
    kernel_s: dict[str, float] = {}  # mapped ORT node -> its time plus that of the inserted nodes working for it
    kernel_ops: dict[str, list[str]] = {}
    for ort_name, t in profile.node_times.items():
        owner = ort_name if ort_name in fmap.members else fmap.joined.get(ort_name)
        if owner is None:
            joined.unmatched[ort_name] = t
        else:
            kernel_s[owner] = kernel_s.get(owner, 0.0) + t
            kernel_ops.setdefault(owner, []).append(profile.op_types.get(ort_name, "?"))
    node_times, notes = joined.node_times, joined.notes
    for ort_name, t in kernel_s.items():
        members = fmap.members[ort_name]
        op = "+".join(kernel_ops.get(ort_name) or [profile.op_types.get(ort_name, "?")])
        for member in members:
            joined.ort_ops[member] = op
            joined.spread[member] = profile.node_spread.get(ort_name, 0.0)
        if len(members) == 1:
            node_times[members[0]] = node_times.get(members[0], 0.0) + t
            if members[0] != ort_name or len(kernel_ops.get(ort_name) or ()) > 1:  # renamed, or kernels joined
                notes[members[0]] = f"measured as onnxruntime's {ort_name!r} ({op})"
            continue
        joined.fused[ort_name] = members
        weights = [max(predicted.get(m, 0.0), 0.0) for m in members]
        total = sum(weights)
        if total > 0:
            shares, how = [w / total for w in weights], f"by predicted share ({basis})"
        else:
            shares, how = [1 / len(members)] * len(members), "in equal shares (no member has a prediction)"
        for member, share in zip(members, shares, strict=True):
            node_times[member] = node_times.get(member, 0.0) + t * share
            notes[member] = (
                f"measured: {100 * share:.0f}% of onnxruntime's fused kernel {ort_name!r} ({op}, "
                f"{t * 1e6:.1f} us), split over its {len(members)} source nodes {how}"
            )
    for name in fmap.folded:
        joined.missing.setdefault(name, "constant-folded by onnxruntime graph optimisation (no kernel runs)")
    for name in fmap.removed:
        joined.missing.setdefault(name, "removed by onnxruntime graph optimisation (no kernel runs)")
    return joined


def _mark_missing(graph: Graph, joined: _Joined) -> None:
    """Why each node without a measured time has none."""
    for node in graph.nodes:
        if node.name in joined.node_times or node.name in joined.missing:
            continue
        if node.op_type == "Constant":
            joined.missing[node.name] = "Constant: onnxruntime turns it into an initializer at load (no kernel runs)"
        elif node.meta.get(meta.SUBGRAPH):
            joined.missing[node.name] = "control flow with subgraphs: its kernels are not joined back"
        else:
            joined.missing[node.name] = "no kernel event from onnxruntime for this node"


def _measured_timeline(
    graph: Graph,
    joined: _Joined,
    rates: Mapping[str, Any],
    unit: str,
    profile: Any,
    dims: Mapping[str, int] | None,
) -> tuple[Timeline, dict[str, float]]:
    """The measured nodes back to back in graph order, and the step's time no node owns. Warm-median
    basis: the step is the sum of the per-node medians, the onnxruntime-only kernels and the median of
    each run's time outside its kernels (``profile.run_time_s`` is exactly that sum). The CUDA
    kernels that match no node join ``joined.unmatched``, each under its own label."""
    timings: list[NodeTiming] = []
    cursor = 0.0
    for node in graph.nodes:
        t = joined.node_times.get(node.name)
        if t is None:
            continue
        rate = rates.get(node.name)
        timings.append(
            NodeTiming(node=node.name, unit=unit, start=cursor, end=cursor + t, bound=rate.bound if rate else None)
        )
        cursor += t
    overheads = {}
    if joined.unmatched:
        overheads["onnxruntime_only_nodes"] = sum(joined.unmatched.values())
    if profile.unmatched_kernels:
        joined.unmatched.update(profile.unmatched_kernels)
        overheads["cuda_kernels_without_node"] = sum(profile.unmatched_kernels.values())
    if profile.overhead_s > 0:
        overheads["session"] = profile.overhead_s
    samples = graph.batch_under({**graph.bindings, **(dims or {})}) or 1  # the graph's batch, as emulated
    timeline = Timeline.from_timings(
        timings, step_time_s=profile.run_time_s, samples_per_step=samples, source="measured", overheads_s=overheads
    )
    return timeline, overheads


def _predicted_times(graph: Graph, target: Any, threads: int) -> tuple[dict[str, float], str]:
    """Per-node predicted seconds to split a fused kernel's time by, and what they come from.

    The calibrated host-CPU model when a target is given or a calibration at the measured
    ``threads`` is cached (a kernel's members share their time differently at another count);
    else each node's bytes moved (a memory-bound proxy: most fused members are).
    """
    from dabench_ir.passes.meta import COST

    model_src = target
    if model_src is None:
        try:
            from dabench_ir.execute.calibrate import cpu_target_path

            model_src = str(cpu_target_path(threads, measure_if_missing=False))
        except Exception as exc:  # no cached calibration: fall back to bytes
            logger.debug("no host-CPU calibration to split fused kernels by: %s", exc)
    if model_src is not None:
        try:
            from dabench_ir.lowering.cpu import predict_cpu_times

            return predict_cpu_times(graph, model_src, ort_opt=True), "host-CPU model"
        except (TypeError, OSError, KeyError, ValueError) as exc:
            logger.debug("host-CPU prediction failed: %s", exc)
    return {n.name: float(n.meta[COST].bytes) for n in graph.nodes if COST in n.meta}, "bytes moved"


def _rates(graph: Graph, node_times: Mapping[str, float], target: Any) -> dict[str, NodeRate]:
    from dabench_ir.passes.meta import attributed_cost

    model = None
    if target is not None:
        from dabench_ir.lowering.cpu import load_cpu_model

        try:
            model = load_cpu_model(target)
        except (TypeError, OSError, KeyError, ValueError) as exc:
            logger.warning("cannot classify bounds against target: %s", exc)
    out: dict[str, NodeRate] = {}
    for node in graph.nodes:
        t = node_times.get(node.name)
        cost = attributed_cost(node)
        if t is None or t <= 0 or cost is None:
            continue
        bound = None
        if model is not None:  # the fixed per-op cost against the rest, then the measured roofline
            work_s = max(t - model.overhead_s, 0.0)
            bound = classify_bound(cost.flops, cost.bytes, model.ridge, work_s=work_s, overhead_s=model.overhead_s)
        out[node.name] = NodeRate(cost.flops / t, cost.bytes / t, bound)
    return out
