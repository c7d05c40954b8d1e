"""Measured execution: run the model in onnxruntime and time every graph node.

`measure` synthesises what the model lacks (inputs, absent weights), runs it with
onnxruntime's per-node profiler, drops the warm-up runs, and joins the median kernel time
of each onnxruntime node back to the dabench Graph node it came from. Graph optimisation
is off by default so names match one to one; with ``ort_opt`` it stays on and each fused
node is mapped back to the original nodes it replaced. Every node ends with a measured
time or a reason it has none.
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

__all__ = ["DEFAULT_MAX_WEIGHT_BYTES", "Measurement", "NodeRate", "measure"]

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
            "node_times_s": dict(self.node_times),
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
        }


def measure(
    model: str | os.PathLike[str] | onnx.ModelProto,
    graph: Graph | None = None,
    *,
    dims: Mapping[str, int] | None = None,
    warmup: int = 2,
    repeat: int = 5,
    threads: int | None = None,
    ort_opt: bool = False,
    max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    provider: str | None = None,
    target: Any = None,
    seed: int = 0,
) -> Measurement:
    """Run ``model`` in onnxruntime and time each node of ``graph``.

    ``graph`` is the dabench Graph of the same model (loaded here when None); ``dims``
    binds symbolic dims; ``threads`` is the onnxruntime intra-op thread count (default:
    the CPUs this process may use). With ``target`` (the calibrated ``cpu`` target) each
    node's bound is classified against the measured host roofline.
    """
    import onnxruntime as ort

    from dabench_ir.frontends.onnx import read_model

    ort.set_default_logger_severity(3)  # onnxruntime's own [E:onnxruntime...] lines: our error is the one line

    proto, path = read_model(model)
    if graph is None:
        from dabench_ir.frontends.onnx import load_onnx

        graph = load_onnx(proto if path is None else path)
    threads = int(threads or default_threads())
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

    node_times: dict[str, float] = {}
    missing: dict[str, str] = {}
    fused: dict[str, list[str]] = {}
    ort_ops: dict[str, str] = {}
    unmatched: dict[str, float] = {}
    known = {n.name for n in graph.nodes}

    if ort_opt and profile.optimized is not None:
        fmap = map_fused(prepared.model, profile.optimized)
        for ort_name, t in profile.node_times.items():
            members = fmap.members.get(ort_name)
            if not members:
                unmatched[ort_name] = t
                continue
            anchor = fmap.anchors[ort_name]
            node_times[anchor] = node_times.get(anchor, 0.0) + t
            ort_ops[anchor] = profile.op_types.get(ort_name, "")
            if len(members) > 1 or ort_name != anchor:
                fused[ort_name] = members
                for member in members:
                    if member != anchor:
                        missing[member] = (
                            f"fused by onnxruntime into {ort_name!r} ({profile.op_types.get(ort_name, '?')}); "
                            f"its time is counted on {anchor!r}"
                        )
        for name in fmap.folded:
            missing.setdefault(name, "constant-folded by onnxruntime graph optimisation (no kernel runs)")
        for name in fmap.removed:
            missing.setdefault(name, "removed by onnxruntime graph optimisation (no kernel runs)")
    else:
        for ort_name, t in profile.node_times.items():
            if ort_name in known:
                node_times[ort_name] = t
                ort_ops[ort_name] = profile.op_types.get(ort_name, "")
            else:
                unmatched[ort_name] = t

    for node in graph.nodes:
        if node.name in node_times or node.name in missing:
            continue
        if node.op_type == "Constant":
            missing[node.name] = "Constant: onnxruntime turns it into an initializer at load (no kernel runs)"
        elif node.meta.get(meta.SUBGRAPH):
            missing[node.name] = "control flow with subgraphs: its kernels are not joined back"
        else:
            missing[node.name] = "no kernel event from onnxruntime for this node"
    for name, t in unmatched.items():
        logger.debug(
            "onnxruntime node %s (%s) matches no graph node: %.1f us", name, profile.op_types.get(name, "?"), t * 1e6
        )

    rates = _rates(graph, node_times, target)
    unit = "cpu" if provider_name == "CPUExecutionProvider" else provider_name.removesuffix("ExecutionProvider").lower()
    timings: list[NodeTiming] = []
    cursor = 0.0
    for node in graph.nodes:
        t = node_times.get(node.name)
        if t is None:
            continue
        rate = rates.get(node.name)
        timings.append(NodeTiming(node.name, unit, cursor, cursor + t, rate.bound if rate else None))
        cursor += t
    overheads = {}
    if unmatched:
        overheads["onnxruntime_only_nodes"] = sum(unmatched.values())
    gap = profile.run_time_s - cursor - sum(unmatched.values())
    if gap > 0:
        overheads["session"] = gap
    batch = _batch_of(graph, {**graph.bindings, **(dims or {})})
    timeline = Timeline.from_timings(
        timings, step_time_s=profile.run_time_s, samples_per_step=batch, source="measured", overheads_s=overheads
    )
    return Measurement(
        timeline=timeline,
        node_times=node_times,
        missing=missing,
        fused=fused,
        threads=threads,
        provider=provider_name,
        run_time_s=profile.run_time_s,
        warmup=warmup,
        repeat=repeat,
        ort_opt=ort_opt,
        ort_version=ort.__version__,
        ort_ops=ort_ops,
        unmatched=unmatched,
        rates=rates,
        synthesized=prepared.synthesized,
    )


def _rates(graph: Graph, node_times: Mapping[str, float], target: Any) -> dict[str, NodeRate]:
    from dabench_ir.passes.meta import COST, UNATTRIBUTED

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
        cost = node.meta.get(COST) if UNATTRIBUTED not in node.meta else None
        if t is None or t <= 0 or cost is None:
            continue
        bound = None
        if model is not None:  # the fixed per-op cost against the rest, then the measured roofline
            work_s = max(t - model.overhead_s, 0.0)
            bound = classify_bound(cost.flops, cost.bytes, model.ridge, work_s=work_s, overhead_s=model.overhead_s)
        out[node.name] = NodeRate(cost.flops / t, cost.bytes / t, bound)
    return out


def _batch_of(graph: Graph, bindings: Mapping[str, int]) -> int:
    """The leading dim of the first input when it is known (samples per step), else 1."""
    for name in graph.inputs:
        value = graph.values.get(name)
        if value is None or not value.type.shape:
            continue
        first = value.type.shape[0]
        first = bindings.get(first) if isinstance(first, str) else first
        if isinstance(first, int) and first > 0:
            return first
    return 1
