"""The profile pipeline: load -> passes -> (place | measure) -> Report.

`analyze` gives the annotated Graph; `profile` goes on to a target and returns a Report.
`build_passes` is the one place the pass list is assembled from the options. Heavy
modules (torch, torch-mlir, onnxruntime) are imported only on the paths that use them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.ir import Graph
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import PassManager, standard_passes
from dabench_ir.report.build import build_report
from dabench_ir.report.model import Report

__all__ = [
    "ProfileOptions",
    "analyze",
    "build_passes",
    "load_graph",
    "prepare_graph",
    "profile",
    "profile_graph",
    "profile_targets",
    "resolve_defaults",
    "resolve_target",
    "run_profile",
]

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _is_mlir_file(model: Any) -> bool:
    return isinstance(model, (str, os.PathLike)) and Path(model).suffix.lower() == ".mlir"


def load_graph(model: Any, *, via: str = "onnx", dims: Mapping[str, int] | None = None) -> Graph:
    """Read a model (path or onnx.ModelProto) into a Graph, by file type and `via` (frontends only load)."""
    if _is_mlir_file(model):
        from dabench_ir.frontends.mlir import load_mlir

        return load_mlir(model, dims=dict(dims or {}))
    if via == "mlir":
        from dabench_ir.frontends.mlir import onnx_via_mlir

        return onnx_via_mlir(model, dims=dict(dims or {}))
    if via != "onnx":
        raise UserError(f"--via {via}: expected 'onnx' or 'mlir'")
    suffix = Path(model).suffix.lower() if isinstance(model, (str, os.PathLike)) else ""
    if suffix and suffix != ".onnx" and Path(model).is_file():
        logger.info("%s has no .onnx suffix; reading it as ONNX", model)
    from dabench_ir.frontends.onnx import load_onnx

    return load_onnx(model)


def build_passes(
    opts: ProfileOptions, *, dims: Mapping[str, int] | None = None, linalg: bool = False, analysis: bool = True
) -> PassManager:
    """The whole pass list a run needs, from its options.

    ``analysis``: the costing passes (the standard ONNX passes, or the linalg cost pass when
    the graph came through MLIR, ``linalg``); then the precision rewrite and the training
    expansion the options ask for. ``analysis=False`` gives only the latter, for a graph
    costed once and profiled under several options (sweeps).
    """
    passes: list[Any] = []
    if analysis:
        if linalg:
            from dabench_ir.passes.linalg_cost import LinalgCostPass

            passes.append(LinalgCostPass())
        else:
            passes.extend(standard_passes(dims if dims is not None else opts.dims).passes)
    if opts.precision is not None or opts.kv_precision is not None:
        from dabench_ir.passes.precision import PrecisionPass

        passes.append(PrecisionPass(opts.precision, kv=opts.kv_precision))
    if opts.fused_attention:
        from dabench_ir.passes.training import FusedAttentionPass

        passes.append(FusedAttentionPass())
    if opts.mode == "train":
        from dabench_ir.passes.training import TrainingPass

        passes.append(TrainingPass(recompute=opts.recompute))
    return PassManager(passes)


def analyze(model: Any, dims: Mapping[str, int] | None = None, *, via: str = "onnx") -> Graph:
    """Load ``model`` and run the standard passes; every node gets a Cost or a reason it has none."""
    return prepare_graph(model, ProfileOptions(dims=dict(dims or {}), via=via))


def profile(model: Any, target: str | None = None, *, progress: Progress | None = None, **options: Any) -> Report:
    """Profile ``model`` on ``target`` (None: cost only). Options: see `ProfileOptions`."""
    try:
        opts = ProfileOptions(**options)
    except TypeError as exc:
        raise UserError(f"profile: {exc}") from None
    return run_profile(model, target, opts, progress=progress)


def run_profile(model: Any, target: Any, opts: ProfileOptions, *, progress: Progress | None = None) -> Report:
    """`profile` with its options already built (the CLI builds them from its flags)."""
    say = progress or _quiet
    tgt = resolve_target(target, opts) if target is not None else None  # a bad name fails before any work
    opts = resolve_defaults(opts, tgt, model=model)
    say("loading and costing the graph")
    graph = prepare_graph(model, opts)
    tgt = _host_benchmarked(model, graph, tgt, opts, say)
    measurement = None
    if opts.measure:
        from dabench_ir.execute import measure

        if _is_mlir_file(model):
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


def profile_targets(
    model: Any,
    targets: Sequence[Any],
    opts: ProfileOptions,
    *,
    measure_on: Callable[[Any], bool] | None = None,
    keep_going: bool = False,
    progress: Progress | None = None,
) -> dict[Any, Report | UserError]:
    """Cost once, place many: ``model`` on each of ``targets``, the graph prepared once.

    Each placement gets its own copy of the costed graph. A target that is also measured in
    onnxruntime (``measure_on(target)``; default: every target when ``opts.measure``) is
    profiled in full. With ``keep_going`` a UserError is that target's result and the
    others go on; otherwise it is raised.
    """
    import pickle

    say = progress or _quiet
    measured = measure_on or (lambda _t: opts.measure)
    placed_opts = dataclasses.replace(opts, measure=False)
    results: dict[Any, Report | UserError] = {}
    blobs: dict[tuple[Any, Any], bytes | UserError] = {}  # costed once per (precision, fused attention)
    model_path = str(model) if isinstance(model, (str, os.PathLike)) else None
    for target in targets:
        try:
            if measured(target):
                results[target] = run_profile(model, target, dataclasses.replace(opts, measure=True), progress=say)
                continue
            tgt = resolve_target(target, opts)
            target_opts = resolve_defaults(placed_opts, tgt, model=model)
            key = (target_opts.precision, target_opts.fused_attention)
            if key not in blobs:
                say("loading and costing the graph")
                try:
                    blobs[key] = pickle.dumps(prepare_graph(model, target_opts), protocol=pickle.HIGHEST_PROTOCOL)
                except UserError as exc:
                    blobs[key] = exc
            blob = blobs[key]
            if isinstance(blob, UserError):
                raise blob
            graph = pickle.loads(blob)
            tgt = _host_benchmarked(model, graph, tgt, target_opts, say)
            report = profile_graph(graph, tgt, target_opts, model_path=model_path, progress=say)
            results[target] = report
        except UserError as exc:
            if not keep_going:
                raise
            results[target] = exc
    return results


def _host_benchmarked(model: Any, graph: Graph, target: Any, opts: ProfileOptions, say: Progress) -> Any:
    """The host CPU target with this model's own node shapes benchmarked (cached per machine);
    any other target as it is."""
    if target is None or target.kind != "cpu" or _is_mlir_file(model):
        return target
    from dabench_ir.execute.microbench import ensure_for_target

    return ensure_for_target(model, graph, target, threads=opts.threads, say=say)


def resolve_defaults(opts: Any, target: Any, *, model: Any = None) -> Any:
    """``opts`` with what the user left open taken from the target's ``[defaults]`` table:
    the precision practitioners run on it (bf16 on GPUs, ...) and whether its software stack
    fuses attention. Without a target (cost only) nothing changes; fp32 only when asked. A graph
    costed from linalg (``--via mlir``, an .mlir ``model``) keeps its dtypes: the precision
    rewrite works on ONNX-classified ops only."""
    if target is None or not hasattr(target, "default"):
        return opts
    changes: dict[str, Any] = {}
    linalg = getattr(opts, "via", "onnx") == "mlir" or (model is not None and _is_mlir_file(model))
    if opts.precision is None and target.default("precision") is not None and not linalg:
        changes["precision"] = str(target.default("precision"))
    if opts.fused_attention is None:
        changes["fused_attention"] = bool(target.default("fused_attention"))
    return dataclasses.replace(opts, **changes) if changes else opts


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
        from dabench_ir.place import place

        say(f"placing on {tgt.name}")
        plan, timeline, metrics = place(graph, tgt, opts)
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
    """Load, bind dims (and the batch), then run the pass list `build_passes` makes."""
    dims = dict(opts.dims)
    linalg = opts.via == "mlir" or _is_mlir_file(model)
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
    return build_passes(opts, dims=dims, linalg=linalg)(graph).graph
