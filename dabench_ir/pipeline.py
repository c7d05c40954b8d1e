"""The profile pipeline: load -> passes -> (lower -> emulate | measure) -> Report.

`analyze` gives the annotated Graph; `profile` goes on to a target and returns a Report.
Heavy modules (torch, torch-mlir, onnxruntime) are imported only on the paths that use them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, Graph
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import FLOP_CONVENTION, meta, standard_passes
from dabench_ir.report.model import NodeRecord, Report

if TYPE_CHECKING:
    from dabench_ir.timeline import Timeline

__all__ = [
    "ProfileOptions",
    "analyze",
    "apply_precision_and_mode",
    "build_report",
    "load_graph",
    "prepare_graph",
    "profile",
    "profile_graph",
    "resolve_target",
]

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def load_graph(model: Any, *, via: str = "onnx", dims: Mapping[str, int] | None = None) -> Graph:
    """Read a model (path or onnx.ModelProto) into a Graph, by file type and `via`."""
    suffix = Path(model).suffix.lower() if isinstance(model, (str, os.PathLike)) else ""
    if suffix == ".mlir":
        from dabench_ir.frontends.mlir import load_mlir

        return load_mlir(model, dims=dict(dims or {}))
    if via == "mlir":
        from dabench_ir.frontends.mlir import onnx_via_mlir

        return onnx_via_mlir(model, dims=dict(dims or {}))
    if via != "onnx":
        raise UserError(f"--via {via}: expected 'onnx' or 'mlir'")
    if suffix and suffix != ".onnx" and isinstance(model, (str, os.PathLike)) and Path(model).is_file():
        logger.info("%s has no .onnx suffix; reading it as ONNX", model)
    from dabench_ir.frontends.onnx import load_onnx

    return load_onnx(model)


def analyze(model: Any, dims: Mapping[str, int] | None = None, *, via: str = "onnx") -> Graph:
    """Load ``model`` and run the standard passes; every node gets a Cost or a reason it has none."""
    return prepare_graph(model, ProfileOptions(dims=dict(dims or {}), via=via))


def profile(model: Any, target: str | None = None, *, progress: Progress | None = None, **options: Any) -> Report:
    """Profile ``model`` on ``target`` (None: cost only). Options: see `ProfileOptions`."""
    try:
        opts = ProfileOptions(**options)
    except TypeError as exc:
        raise UserError(f"profile: {exc}") from None
    say = progress or _quiet
    tgt = resolve_target(target, opts) if target is not None else None  # a bad name fails before any work
    say("loading and costing the graph")
    graph = prepare_graph(model, opts)
    graph.meta["ort_opt"] = opts.ort_opt  # the host prediction follows what onnxruntime will run
    measurement = None
    if opts.measure:
        from dabench_ir.execute import measure

        if isinstance(model, (str, os.PathLike)) and Path(model).suffix.lower() == ".mlir":
            raise UserError("--measure runs ONNX models in onnxruntime; give the .onnx file")
        say("measuring in onnxruntime")
        measurement = measure(
            model,
            graph,
            dims=dict(graph.bindings),
            warmup=opts.warmup,
            repeat=opts.repeat,
            threads=opts.threads,
            ort_opt=opts.ort_opt,
            max_weight_bytes=opts.max_weight_bytes,
            target=tgt if tgt is not None and tgt.kind == "cpu" else None,
        )
    return profile_graph(
        graph,
        tgt,
        opts,
        measurement=measurement,
        model_path=str(model) if isinstance(model, (str, os.PathLike)) else None,
        progress=say,
    )


def resolve_target(target: Any, opts: ProfileOptions | None = None) -> Any:
    """A Target from a name, alias, path or Target; ``cpu`` is calibrated with the run's threads."""
    from dabench_ir.targets import Target, load_target

    if isinstance(target, Target):
        return target
    threads = opts.threads if opts is not None else None
    if target == "cpu" and threads:
        from dabench_ir.execute.calibrate import cpu_target_path

        return load_target(str(cpu_target_path(threads=threads)))
    return load_target(target)


def profile_graph(
    graph: Graph,
    target: Any,
    opts: ProfileOptions | None = None,
    *,
    measurement: Any = None,
    model_path: str | None = None,
    progress: Progress | None = None,
) -> Report:
    """Lower, emulate and report an already prepared graph (see `prepare_graph`).

    ``target`` is a Target (or a name), or None for a cost-only report. Sweeps call this
    directly to cost a model once and place it on many targets.
    """
    opts = opts or ProfileOptions()
    say = progress or _quiet
    tgt = resolve_target(target, opts) if target is not None else None
    plan = timeline = metrics = None
    if tgt is not None:
        from dabench_ir.emulate import emulate
        from dabench_ir.lowering import lower
        from dabench_ir.metrics import compute_metrics

        say(f"lowering onto {tgt.name}")
        plan = lower(graph, tgt, opts)
        say(f"emulating on {tgt.name}")
        timeline = emulate(plan, graph)
        metrics = compute_metrics(graph, plan, timeline, tgt)
    elif measurement is not None:
        timeline = measurement.timeline
    return build_report(
        graph,
        options=opts,
        target=tgt,
        plan=plan,
        timeline=timeline,
        metrics=metrics,
        measurement=measurement,
        model_path=model_path,
    )


def prepare_graph(model: Any, opts: ProfileOptions) -> Graph:
    """Load, bind dims (and the batch), cost, then rewrite precision and expand training."""
    dims = dict(opts.dims)
    graph = load_graph(model, via=opts.via, dims=dims)
    if opts.batch is not None:
        dim = graph.batch_dim
        batch_sym = "batch" if "batch" in graph.symbols else dim if isinstance(dim, str) else None
        if batch_sym and batch_sym not in dims:
            dims[batch_sym] = opts.batch
        elif batch_sym is None and dim is not None and dim != opts.batch:
            raise UserError(
                f"--batch {opts.batch}: the model's batch is fixed at {dim}; export it with --dynamic "
                f"(symbolic batch) or with --batch {opts.batch}"
            )
    if not graph.meta.get("costed"):
        standard_passes(dims)(graph)
    return apply_precision_and_mode(graph, opts)


def apply_precision_and_mode(graph: Graph, opts: ProfileOptions) -> Graph:
    """Precision rewrite and training expansion, when asked (passes from the Level-2 work)."""
    if opts.precision is not None:
        from dabench_ir.passes.precision import PrecisionPass

        PrecisionPass(opts.precision)(graph)
    if opts.mode != "inference":
        if opts.mode != "train":
            raise UserError(f"--mode {opts.mode}: expected 'inference' or 'train'")
        from dabench_ir.passes.training import TrainingPass

        TrainingPass(recompute=opts.recompute)(graph)
    return graph


# -- report -----------------------------------------------------------------------------


def build_report(
    graph: Graph,
    *,
    options: ProfileOptions | None = None,
    target: Any = None,
    plan: Any = None,
    timeline: Timeline | None = None,
    metrics: Any = None,
    measurement: Any = None,
    model_path: str | None = None,
) -> Report:
    """Gather graph costs, and timeline/metrics/measurements when present, into a Report."""
    opts = options or ProfileOptions()
    records: list[NodeRecord] = []
    unattributed: list[dict[str, Any]] = []
    measured = dict(getattr(measurement, "node_times", {}) or {})
    missing_measure = dict(getattr(measurement, "missing", {}) or {})
    node_bound = dict(getattr(metrics, "node_bound", {}) or {})
    node_intensity = dict(getattr(metrics, "node_intensity", {}) or {})
    for node in graph.nodes:
        cost = meta.get_cost(node) if meta.COST in node.meta or meta.UNATTRIBUTED in node.meta else None
        op_class = node.meta.get(meta.OP_CLASS)
        record = NodeRecord(
            name=node.name,
            op_type=node.qualified_op,
            layer=node.layer,
            scope=node.scope,
            op_class=str(op_class) if op_class is not None else None,
            cost=cost,
            intensity=cost.intensity if cost is not None else None,
            precision=str(node.meta[meta.PRECISION]) if meta.PRECISION in node.meta else None,
        )
        if node.name in node_intensity:
            record.intensity = node_intensity[node.name]
        if timeline is not None and node.name in timeline.nodes:
            t = timeline.nodes[node.name]
            # busy time, not the first-start-to-last-end span: a pipelined node runs once
            # per micro-batch and waits between runs
            record.time_s, record.start_s, record.unit = timeline.busy(node.name), t.start, t.unit
            record.bound = str(t.bound) if t.bound is not None else None
        if node.name in node_bound and node_bound[node.name] is not None:
            record.bound = str(node_bound[node.name])
        if meta.FOLDED in node.meta:
            record.note = meta.get(node, meta.FOLDED)
        if node.name in measured:
            record.measured_time_s = measured[node.name]
        elif node.name in missing_measure:
            record.note = f"not measured: {missing_measure[node.name]}"
        if cost is None:
            reason = node.meta.get(meta.UNATTRIBUTED, "not costed")
            unattributed.append({"name": node.name, "op_type": node.qualified_op, "reason": reason})
        records.append(record)

    total = sum((r.cost for r in records if r.cost is not None), Cost())
    samples = opts.batch or graph.batch_size or 1
    time_s = timeline.step_time_s if timeline is not None else None
    if measurement is not None and timeline is None:
        time_s = measurement.run_time_s
    throughput = samples / time_s if time_s else None
    totals: dict[str, Any] = {
        "flops": total.flops,
        "bytes": total.bytes,
        "time_s": time_s,
        "throughput_samples_per_s": throughput,
        "achieved_flops_per_s": total.flops / time_s if time_s else None,
        **total.as_dict(),
        "intensity": total.intensity,
        "nodes": len(records),
        "unattributed_nodes": len(unattributed),
    }
    if measurement is not None:
        totals["measured_time_s"] = measurement.run_time_s
    if target is not None and plan is not None and timeline is not None and timeline.source == "emulated":
        _add_energy(graph, plan, timeline, target, records, totals, samples)
    metric_dict: dict[str, Any] = {"allocation_ratio": None, "load_imbalance": None, "compute_efficiency": None}
    if metrics is not None:
        metric_dict.update(_metrics_dict(metrics))
    if target is not None:
        metric_dict["target_power_w"] = float(target.watts)
    if measurement is not None and timeline is not None and timeline.source == "emulated":
        from dabench_ir.metrics import prediction_error

        predicted = {r.name: r.time_s for r in records if r.time_s is not None}
        for r in records:
            r.predicted_time_s = r.time_s
        metric_dict["prediction_error"] = prediction_error(predicted, measured)
    units = []
    if plan is not None:
        busy = timeline.unit_busy_s if timeline is not None else {}
        for unit in plan.units:
            units.append(
                {
                    "id": unit.id,
                    "kind": unit.kind,
                    "nodes": list(unit.nodes),
                    "allocation": getattr(unit, "allocation", None),
                    "time_s": busy.get(unit.id),
                    "resources": dict(getattr(unit, "resources", {}) or {}),
                }
            )
    fits = True if plan is None else bool(plan.fits)
    failure = None
    if plan is not None and plan.failure is not None:
        f = plan.failure
        failure = {"reason": f.reason, "needed_bytes": f.needed_bytes, "capacity_bytes": f.capacity_bytes}
    config = {
        "batch": samples,
        "precision": opts.precision or _dominant_dtype(graph),
        "mode": opts.mode,
        "chips": getattr(plan, "chips", 1) if plan is not None else 1,
        "strategy": getattr(plan, "strategy", None),
        "dims": dict(graph.bindings),
        "via": opts.via,
    }
    if graph.meta.get("precision"):
        from dabench_ir.passes.precision import precision_by_class

        config["precision_by_class"] = precision_by_class(graph)
    if graph.meta.get("train"):
        config["train"] = dict(graph.meta["train"])
    if target is not None:
        config.update({"opt_level": opts.opt_level, "wse_mode": opts.wse_mode, "ipus": opts.ipus})
    extra: dict[str, Any] = {}
    if measurement is not None:
        extra["measurement"] = {
            "threads": measurement.threads,
            "provider": measurement.provider,
            "run_time_s": measurement.run_time_s,
            "fused": measurement.fused,
        }
    return Report(
        model={
            "path": model_path or graph.path,
            "name": graph.name,
            "nodes": len(graph.nodes),
            "params": graph.num_params,
            "layers": len(graph.layers),
            "family": graph.metadata.get("dabench.family"),
            "preset": graph.metadata.get("dabench.preset") or None,
        },
        target=None if target is None else {"name": target.name, "kind": target.kind},
        config=config,
        nodes=records,
        unattributed=unattributed,
        totals=totals,
        metrics=metric_dict,
        units=units,
        fits=fits,
        failure=failure,
        flop_convention=FLOP_CONVENTION,
        extra=extra,
        graph=graph,
        timeline=timeline,
        target_obj=target,
    )


def _add_energy(graph, plan, timeline, target, records, totals, samples) -> None:
    """Per-node joules, and the step's energy, power and efficiency (docs/energy.md)."""
    from dabench_ir.energy import node_energies

    energies = node_energies(graph, plan, timeline, target)
    for r in records:
        r.energy_j = energies.get(r.name)
    energy = sum(energies.values())
    step = timeline.step_time_s
    achieved = totals["flops"] / step if step else None
    totals.update(
        {
            "energy_j": energy,
            "energy_per_sample_j": energy / samples if samples else None,
            "power_w": energy / step if step else None,
            "target_power_w": float(target.watts),
            # achieved GOP/s per rated watt, and per modelled watt (FLOPs per joule)
            "gops_per_w": achieved / 1e9 / float(target.watts) if achieved and target.watts else None,
            "gops_per_w_modelled": totals["flops"] / energy / 1e9 if energy else None,
        }
    )


def _metrics_dict(metrics: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("allocation_ratio", "load_imbalance", "compute_efficiency", "achieved_flops_per_s"):
        out[key] = getattr(metrics, key, None)
    memory_use = getattr(metrics, "memory_use", None)
    if memory_use is not None:
        out["memory_use"] = {
            k: (v if isinstance(v, (dict, int, float)) else getattr(v, "__dict__", str(v)))
            for k, v in dict(memory_use).items()
        }
    for key, value in (getattr(metrics, "extra", None) or {}).items():
        out.setdefault(key, value)
    return out


def _dominant_dtype(graph: Graph) -> str | None:
    """The float dtype holding most weight (or activation) elements: what the model computes in."""
    counts: dict[str, int] = {}
    for value in graph.values.values():
        if value.type.dtype.is_float and value.type.shape is not None:
            try:
                n = value.type.numel(graph.bindings)
            except UserError:
                n = 1
            counts[str(value.type.dtype)] = counts.get(str(value.type.dtype), 0) + n
    return max(counts, key=counts.__getitem__) if counts else None

