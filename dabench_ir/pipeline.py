"""The profile API: load a model, then ask `dabench_ir.run` for the run.

`load_graph` reads a model into a Graph; every other function here resolves a question with
`dabench_ir.run.resolve` and answers it with `dabench_ir.run.execute`, the one orchestration
every command uses. Heavy modules (torch, torch-mlir, onnxruntime) are imported only on the
paths that use them.
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
from dabench_ir.progress import silent
from dabench_ir.report.model import Report
from dabench_ir.run import (
    Progress,
    ResolvedRun,
    check_target,
    execute,
    is_mlir_file,
    prepare,
    resolve,
    resolve_target,
)

__all__ = [
    "ProfileOptions",
    "ResolvedRun",
    "analyze",
    "load_for_run",
    "load_graph",
    "prepare_graph",
    "profile",
    "profile_graph",
    "profile_targets",
    "resolve_target",
    "run_profile",
]

logger = logging.getLogger(__name__)


def load_graph(
    model: Any, *, via: str = "onnx", dims: Mapping[str, int] | None = None, batch: int | None = None
) -> Graph:
    """Read a model (path, onnx.ModelProto, or a preset name that is no file) into a Graph, by file type
    and `via` (frontends only load). A preset is its weight-free export (`models.presets.preset_file`)
    at the preset's batch and seq, unless the run binds them (``batch``: the run's, when given).
    ONNX ``via`` MLIR is lowered at ``dims`` and the preset's shape (`pipeline.run_profile` binds a
    run's batch and sequence first)."""
    if via not in ("onnx", "mlir"):
        raise UserError(f"--via {via}: expected 'onnx' or 'mlir'")
    if is_mlir_file(model):
        from dabench_ir.mlir import load_mlir

        return load_mlir(model, dims=dict(dims or {}))
    if via == "mlir":
        graph = load_graph(model, dims=dims, batch=batch)
        return _lowered(graph, model, {**graph.bindings, **(dims or {})})
    if isinstance(model, str) and not os.path.lexists(model) and not model.endswith((".onnx", ".mlir")):
        from dabench_ir.models.presets import preset_file, preset_name, preset_shape

        if preset_name(model) is not None:
            graph = load_graph(preset_file(model), dims=dims)
            bound = {*(dims or {}), *(["batch"] if batch is not None else [])}
            graph.bindings.update({k: v for k, v in preset_shape(model).items() if k not in bound})
            return graph
    suffix = Path(model).suffix.lower() if isinstance(model, (str, os.PathLike)) else ""
    if suffix and suffix != ".onnx" and Path(model).is_file():
        logger.info("%s has no .onnx suffix; reading it as ONNX", model)
    from dabench_ir.frontends.onnx import load_onnx

    return load_onnx(model)


def _lowered(graph: Graph, model: Any, dims: Mapping[str, int], precision: str | None = None) -> Graph:
    """The ONNX ``graph`` of ``model`` with its torch-mlir linalg module, lowered at ``dims`` and
    imported at ``precision`` (None: the dtypes it was exported in)."""
    from dabench_ir.mlir import attach_mlir

    source = graph.path if graph.path is not None else model  # a preset's file; a proto as it is
    return attach_mlir(graph, source, dims, where=str(graph.path or "<onnx>"), precision=precision)


def _options(options: Any) -> Any:
    """What `resolve` takes: an options object as it is, keyword arguments as the user's mapping."""
    return options if options is None or dataclasses.is_dataclass(options) else dict(options)


def _as_options(options: Any) -> Any:
    """The options object of what was given (an object as it is; a mapping checked: a keyword no
    knob has is one line)."""
    if options is None or dataclasses.is_dataclass(options):
        return options or ProfileOptions()
    from dabench_ir.options import ScaleOptions

    try:
        return ScaleOptions(**options)
    except TypeError as exc:
        raise UserError(f"profile: {exc}") from None


def load_for_run(model: Any, options: Any, target: Any = None) -> Graph:
    """``model`` loaded as a run with ``options`` on ``target`` loads it: by ``--via``; an ONNX model
    lowered to linalg at the run's dims (its batch, sequence and the dims derived from them) and
    imported at the run's precision (the user's, else ``target``'s ``[defaults]``: `run.resolve`).
    A run at another precision imports it again (`dabench_ir.mlir.load.MlirPrecisionPass`)."""
    opts = _as_options(options)
    if opts.via != "mlir" or is_mlir_file(model):
        return load_graph(model, via=opts.via, dims=opts.dims, batch=opts.batch)
    # torch-mlir imports static shapes only: the run binds the ONNX graph's batch, sequence and the
    # dims derived from them (`run.resolve`, as on the ONNX path), and the module is lowered at those
    graph = load_graph(model, dims=opts.dims, batch=opts.batch)
    from dabench_ir.targets import is_host

    # the host CPU is calibrated when resolved against; its [defaults] hold no precision
    run = resolve(graph, None if target is None or is_host(target) else target, options)
    return _lowered(graph, model, {**graph.bindings, **run.dims}, run.options.precision)


def analyze(model: Any, dims: Mapping[str, int] | None = None, *, via: str = "onnx") -> Graph:
    """Load ``model`` and run the costing passes; every node gets a Cost or a reason it has none."""
    return prepare_graph(model, ProfileOptions(dims=dict(dims or {}), via=via))


def prepare_graph(model: Any, options: Any = None, target: Any = None) -> Graph:
    """``model`` loaded and through every pass its run on ``target`` (None: cost only) needs."""
    graph = load_for_run(model, options, target)
    return prepare(resolve(graph, target, _options(options), model=model), graph)


def profile(model: Any, target: str | None = None, *, progress: Progress | None = None, **options: Any) -> Report:
    """Profile ``model`` on ``target`` (None: cost only). Options: see `ProfileOptions`."""
    return run_profile(model, target, options, progress=progress)


def run_profile(model: Any, target: Any, options: Any = None, *, progress: Progress | None = None) -> Report:
    """One run of ``model`` on ``target``: ``options`` is a mapping of the knobs given (their source is
    the user) or an options object."""
    say = progress or silent
    options = _options(options)
    check_target(target)  # a bad name or file fails before any work
    say("loading the model")
    graph = load_for_run(model, options, target)
    return execute(resolve(graph, target, options, model=model), graph, progress=say)


def profile_graph(graph: Graph, target: Any, options: Any = None, *, progress: Progress | None = None) -> Report:
    """One run of an already loaded (or costed) ``graph``; consumed (pass ``graph.clone()`` to keep it)."""
    return execute(resolve(graph, target, _options(options), model=graph.path), graph, progress=progress)


def profile_targets(
    model: Any,
    targets: Sequence[Any],
    options: Any = None,
    *,
    measure_on: Callable[[Any], bool] | None = None,
    keep_going: bool = False,
    progress: Progress | None = None,
) -> dict[Any, Report | UserError]:
    """Load once, cost once per distinct costing, place many: ``model`` on each of ``targets``.

    Runs whose costed graph is the same (`ResolvedRun.cost_key`) share it, each placement on its
    own clone. A target that is also measured in onnxruntime (``measure_on(target)``; default:
    every target when the options measure) runs in full. With ``keep_going`` a UserError is that
    target's result and the others go on; otherwise it is raised.
    """
    say = progress or silent
    options = _options(options)
    measures = options.get("measure") if isinstance(options, Mapping) else getattr(options, "measure", False)
    measured = measure_on or (lambda _t: bool(measures))
    placed_options = (
        {**options, "measure": False} if isinstance(options, Mapping) else dataclasses.replace(options, measure=False)
    )
    say("loading the model")
    loaded = load_for_run(model, options, targets[0] if targets else None)
    costed: dict[tuple[Any, ...], Graph | UserError] = {}
    results: dict[Any, Report | UserError] = {}
    for target in targets:
        try:
            if measured(target):
                measuring = (
                    {**options, "measure": True}
                    if isinstance(options, Mapping)
                    else dataclasses.replace(options, measure=True)
                )
                run = resolve(loaded, target, measuring, model=model)
                results[target] = execute(run, loaded.clone(), progress=say)
                continue
            run = resolve(loaded, target, placed_options, model=model)
            if run.cost_key not in costed:
                say("costing the graph")
                try:
                    costed[run.cost_key] = prepare(run, loaded.clone())
                except UserError as exc:
                    costed[run.cost_key] = exc
            graph = costed[run.cost_key]
            if isinstance(graph, UserError):
                raise graph
            results[target] = execute(run, graph.clone(), progress=say)
        except UserError as exc:
            if not keep_going:
                raise
            results[target] = exc
    return results
