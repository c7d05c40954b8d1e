"""Running catalogue points through the tool: one result per point, whatever happens.

Model points are built from the graph cache, given the point's options and profiled through
the public pipeline; microbenchmarks run in `gemm`; host points are measured live.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.report.table import percent
from dabench_ir.validate.cache import GraphCache, Say, graph_key
from dabench_ir.validate.catalog import (
    MEASURED_FILES,
    MEASURED_NUMBERS,
    Point,
    measured_numbers,
    option_kinds,
    run_option,
)
from dabench_ir.validate.gemm import run_bandwidth, run_gemm, run_max_fit, run_ratio
from dabench_ir.validate.predict import PREDICTORS, kernel_quantities
from dabench_ir.validate.results import CannotRun, PointResult, Quantity, Validation

__all__ = ["Bar", "options_of_point", "per_replica_model", "run_validation"]

logger = logging.getLogger(__name__)


Bar = Callable[..., None]


def run_validation(
    points: Sequence[Point],
    *,
    target: str | None = None,
    cache_dir: str | Path | None = None,
    say: Say | None = None,
    bar: Bar | None = None,
) -> Validation:
    """Run ``points`` (those on ``target`` when given) through the tool; every point gets a result.

    ``cache_dir``: where 1-layer base exports are kept (default: the dabench-ir cache folder's
    ``models/``, shared format with sweeps). ``say(message)`` and ``bar(done, total)`` report progress.
    """
    import time

    from dabench_ir.targets import HOST, is_host, load_target

    start = time.perf_counter()
    host_run = is_host(target)
    if not host_run:  # live host measurements only when asked for (--target cpu)
        points = [p for p in points if p.kind != "host"]
    if target is not None and host_run:
        points = [p for p in points if p.target == HOST]
        if not points:
            raise UserError(f"--target {target}: no catalogue point is on {HOST}")
    elif target is not None:
        wanted = load_target(target).name
        points = [p for p in points if p.target == wanted or load_target(p.target).name == wanted]
        if not points:
            raise UserError(f"--target {target}: no catalogue point is on {wanted}")
    say = say or (lambda _m: None)
    tick = bar or (lambda *a, **k: None)
    from dabench_ir.sweep.graphs import default_cache

    folder = Path(cache_dir) if cache_dir else default_cache()
    graphs = GraphCache(folder, say)
    jobs = os.cpu_count() or 1
    graphs.prefetch(_point_models(points), jobs=jobs)  # a cold cache: the exports in parallel
    order = sorted(range(len(points)), key=lambda i: (points[i].kind != "model", graph_key(points[i])))
    done: dict[int, PointResult] = {}
    groups: dict[tuple, list[int]] = {}
    for i in order:
        if points[i].kind != "host":  # measured live: one at a time, nothing beside them
            groups.setdefault(graph_key(points[i]) if points[i].kind == "model" else ("", i), []).append(i)
    if jobs > 1 and len(groups) > 1:
        deepest = sorted(groups.values(), key=lambda g: -_depth(points[g[0]]))  # the longest first: no long tail
        _run_parallel(points, deepest, folder, min(jobs, len(groups)), done, tick)
    graphs.expect(_point_models([points[i] for i in order if i not in done]))
    for i in order:
        if i not in done:  # serial: host points, a lost worker's points, or one core
            p = points[i]
            tick(len(done), len(points), label=f"{p.id[:28]:28s} ")
            done[i] = _run_point(p, graphs)
    tick(len(points), len(points))
    return Validation([done[i] for i in range(len(points))], seconds=time.perf_counter() - start)


def _depth(p: Point) -> int:
    """A model point's layer count (what its time grows with); 0 for the other kinds."""
    try:
        return int(p.model.get("layers", 0)) if p.kind == "model" else 0
    except (TypeError, ValueError):
        return 0


def _run_parallel(
    points: Sequence[Point], groups: list[list[int]], folder: Path, jobs: int, done: dict[int, PointResult], tick: Bar
) -> None:
    """Run ``groups`` of point indices (the points of one model together, so its graph is built
    once) in ``jobs`` worker processes, filling ``done``; the points of a lost worker, or all not
    done when a result cannot come back, are left out of ``done`` (the caller runs them here).
    Workers are forked, or spawned when this process has loaded torch (an API user's session, the
    test suite), whose thread pools do not survive a fork."""
    from dabench_ir.sweep.executors import LocalExecutor, WorkerLost

    tasks = [(_run_points, ([points[i] for i in group], str(folder))) for group in groups]
    executor = LocalExecutor(jobs, start="spawn" if "torch" in sys.modules else "fork")
    try:
        for task, out in executor.map_unordered(tasks):
            if isinstance(out, WorkerLost):
                logger.warning("%s; its %d point(s) run here", out, len(groups[task]))
                continue
            for i, result in zip(groups[task], out, strict=True):
                result.point = points[i]  # the catalogue's own object, not the worker's copy
                done[i] = result
            tick(len(done), len(points))
    except Exception as exc:  # e.g. a result that does not pickle: the rest run in this process
        logger.warning("points in worker processes stopped (%s: %s); the rest run here", type(exc).__name__, exc)
    finally:
        executor.close()


def _run_points(points: list[Point], folder: str) -> list[PointResult]:
    """A worker's task: ``points`` run in order on one graph cache (bases from ``folder``)."""
    graphs = GraphCache(Path(folder), lambda _m: None)
    graphs.expect(_point_models(points))
    return [_run_point(p, graphs) for p in points]


def _point_models(points: Sequence[Point]) -> list[dict[str, Any]]:
    """The model each model point asks the graph cache for (`_run_model`); a point refused before
    that is left out here and refused in its turn."""
    from dabench_ir.targets import load_target

    models = []
    for p in points:
        if p.kind != "model":
            continue
        try:
            models.append(per_replica_model(p, options_of_point(p, load_target(p.target).kind, PointResult(p))))
        except Exception:  # the point's own run reports it
            continue
    return models


def _informed(p: Point) -> tuple[str, ...]:
    """The parameters of ``p``'s target fitted to ``p``; a point its catalogue marks ``holdout``
    that a parameter is fitted to is refused (the catalogue and the target file disagree)."""
    from dabench_ir.targets import HOST, load_target

    if p.target == HOST:  # the host model is measured, not fitted to catalogue points
        return ()
    target = load_target(p.target)
    informed = tuple(target.fitted_on(p.id))
    if informed and p.holdout:
        raise UserError(
            f"catalogue point {p.id}: marked holdout = true, but {target.origin} fits "
            f"{informed[0]} to it (its fitted_to names the point); drop one of the two"
        )
    return informed


def _run_point(p: Point, graphs: GraphCache) -> PointResult:
    result = PointResult(p, fits_expected=p.expect.get("fits"), informed=_informed(p))
    try:
        runner = {
            "model": _run_model,
            "generate": _run_generate,
            "gemm": run_gemm,
            "gemm_max_fit": run_max_fit,
            "gemm_ratio": run_ratio,
            "bandwidth": run_bandwidth,
            "host": _run_host,
        }[p.kind]
        runner(p, result, graphs)
    except CannotRun as exc:
        result.status, result.reason = "cannot run", str(exc)
    except UserError as exc:
        result.status, result.reason = "cannot run", f"the tool refused it: {exc}"
    except Exception as exc:
        logger.debug("point %s failed", p.id, exc_info=True)
        text = str(exc).strip().splitlines()
        result.status, result.reason = "cannot run", f"{type(exc).__name__}: {text[0] if text else ''}"
    if result.status != "ok":
        result.quantities = [Quantity(k, v, None, "cannot run") for k, v in measured_numbers(p.measured)]
    return result


def _run_host(p: Point, result: PointResult, graphs: GraphCache) -> None:
    """Measure the point's model live and predict it: end-to-end time as the quantity, the
    per-node errors and the measurement's noise as notes."""
    from dabench_ir.execute.hostcheck import run_host

    h = run_host(p.host)
    e = h.error
    result.quantities.append(Quantity("step_time_s", h.measured_s, h.predicted_s, f"{h.label}; repeat {h.repeat}"))

    result.notes.append(
        f"nodes >= 1% of time: {e['nodes_compared']}, median |error| {percent(e['median_node_rel_error'])}, "
        f"p90 {percent(e['p90_node_rel_error'])}; {e.get('nodes_within_noise')} within their noise"
    )
    verdict = "within" if e.get("end_to_end_within_noise") else "beyond"
    result.notes.append(
        f"noise (IQR/median): end to end {percent(e.get('end_to_end_spread'))}, median node "
        f"{percent(e.get('median_node_spread'))}; the end-to-end error is {verdict} noise"
    )
    result.host = {"label": h.label, "repeat": h.repeat, **e}


def options_of_point(p: Point, kind: str, result: PointResult, **extra: Any) -> Any:
    """ScaleOptions for the point. A run key the tool cannot honour (no knob, a value it does not
    model, a knob of other target kinds) refuses the point with the reason: no key is dropped."""
    from dabench_ir.options import KNOBS, ScaleOptions

    values: dict[str, Any] = {}
    for key, value in p.run.items():
        opt = run_option(key)
        kinds = option_kinds(opt)
        if kinds is not None and kind not in kinds:
            raise CannotRun(
                f"run.{key} = {_short(value)}: applies to {', '.join(sorted(kinds))} targets, "
                f"not {p.target} ({kind}); drop it from the point"
            )
        if opt.field is None:
            if _implied(value, opt.implied):
                continue
            shown = f" (the tool models {', '.join(map(_short, opt.implied))})" if opt.implied else ""
            raise CannotRun(f"run.{key} = {_short(value)} refused: {opt.refused}{shown}")
        if key in _BATCHING:
            continue  # `_batching` reads them together
        values[opt.field] = value
    values.update(_batching(p))
    values.update(extra)
    for name, value in list(values.items()):
        if isinstance(value, list) and name in KNOBS and KNOBS[name].parse is not None:
            values[name] = ",".join(str(v) for v in value)  # a list-valued knob parses its CLI text
    try:
        return ScaleOptions(**values)
    except UserError as exc:
        raise CannotRun(f"options: {exc}") from None


_BATCHING = ("micro_batch", "gradient_accumulation")


def _implied(value: Any, implied: tuple[Any, ...]) -> bool:
    text = value.lower() if isinstance(value, str) else value
    return any(text == v and type(text) is type(v) for v in implied)


def _batching(p: Point) -> dict[str, Any]:
    """``micro_batch`` and ``gradient_accumulation`` as profile takes them.

    Training: ``micro_batch`` is profile's ``--micro-batch`` (the step runs batch / micro_batch
    micro-batches: a pipeline's micro-batches, gradient accumulation on a GPU); given alone,
    ``gradient_accumulation`` is ``--micro-batches``. Inference has no accumulation: the
    micro-batches a pipeline runs are ``--micro-batches`` = batch / micro_batch. Given both, a
    replica's batch must be micro_batch x gradient_accumulation (else the point is refused).
    """
    run = p.run
    micro, accum = run.get("micro_batch"), run.get("gradient_accumulation")
    if micro is None:
        return {} if accum is None else {"micro_batches": accum}
    batch = int(p.model.get("batch", micro * (accum or 1)))
    chips = int(run.get("chips", 1))
    if run.get("strategy") == "dp" and chips > 1:
        batch //= chips  # the catalogue batch is the step's global batch (`per_replica_model`)
    if accum is not None and batch != micro * accum:
        raise CannotRun(
            f"run.micro_batch = {micro} x run.gradient_accumulation = {accum} is not the batch of a "
            f"replica ({batch}); the point contradicts itself"
        )
    if batch % micro:
        raise CannotRun(f"run.micro_batch = {micro} does not divide the batch of a replica ({batch})")
    if run.get("mode", "inference") == "train":
        return {"micro_batch": micro}
    return {"micro_batches": batch // micro}


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def per_replica_model(p: Point, opts: Any) -> dict[str, Any]:
    """The point's model as one replica runs it: a data-parallel point's catalogue batch is the
    global batch of a step, each of its chips runs its share (`dabench_ir.run`: the graph's batch
    is one replica's)."""
    model = dict(p.model)
    if opts.chips > 1 and opts.strategy == "dp":
        if int(model["batch"]) % opts.chips:
            raise CannotRun(f"batch {model['batch']} does not split over {opts.chips} data-parallel chips")
        model["batch"] = int(model["batch"]) // opts.chips
    return model


def _run_model(p: Point, result: PointResult, graphs: GraphCache) -> None:
    from dabench_ir.run import execute, placement, resolve
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    opts = options_of_point(p, target.kind, result)
    if opts.chips > 1 and opts.strategy is None:
        raise CannotRun(f"run.chips = {opts.chips} needs run.strategy (dp, tp or pp)")
    try:
        graph = graphs.graph(per_replica_model(p, opts))
    except UserError as exc:
        raise CannotRun(f"model: {exc}") from None
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise CannotRun(f"export failed: {type(exc).__name__}: {text[0] if text else ''}") from None
    run = resolve(graph, target, opts)
    if not p.measured and opts.chips == 1:  # fit only: the placement decides it, no emulation needed
        plan = placement(run, graph)
        result.fits_predicted = bool(plan.fits)
        if not plan.fits:
            why = plan.failure.reason if plan.failure is not None else "does not fit"
            result.notes.append(f"the tool says it does not fit: {why}")
        return
    report = execute(run, graph)
    result.fits_predicted = bool(report.fits)
    if not report.fits:
        why = report.failure["reason"] if report.failure else "does not fit"
        result.notes.append(f"the tool says it does not fit: {why}")
    for key, value in p.measured.items():
        if key in MEASURED_FILES:
            result.quantities += kernel_quantities(p, key, value, report)
            continue
        if not report.fits:
            result.quantities.append(Quantity(key, float(value), None, "model does not fit"))
            continue
        extractor = PREDICTORS.get(key) if opts.chips == 1 or key in _SCALED else None
        predicted = extractor(report, p) if extractor else None
        note = "" if predicted is not None else "not predicted" + (" (multi-chip)" if opts.chips > 1 else "")
        if key not in MEASURED_NUMBERS:
            note = "not predicted (a quantity the catalogue format does not define)"
        result.quantities.append(Quantity(key, float(value), predicted, note))
    if result.fits_expected is None and measured_numbers(p.measured):
        result.fits_expected = True  # a measured run ran: it fitted
    if result.fits_expected is True and result.fits_predicted is False:
        result.notes.append("the measurement says it ran, the tool says it does not fit")


def _run_generate(p: Point, result: PointResult, graphs: GraphCache) -> None:
    """A generation point through ``--scenario generate`` (`dabench_ir.scenario.generate`): model.batch
    equal requests of generate.prompt tokens, each generating generate.gen tokens."""
    import dataclasses

    from dabench_ir.scenario import generate
    from dabench_ir.sweep.graphs import base_config
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    opts = options_of_point(p, target.kind, result)
    prompt, gen = int(p.generate["prompt"]), int(p.generate["gen"])
    model = {**p.model, "seq": int(p.model.get("seq", prompt))}
    try:
        cfg = base_config({**model, "batch": 1}).replace(layers=int(p.model["layers"]))
    except UserError as exc:
        raise CannotRun(f"model: {exc}") from None
    if cfg.family == "gpt2" and cfg.positional in (None, "learned") and (cfg.max_positions or cfg.seq) < prompt + gen:
        cfg = cfg.replace(max_positions=prompt + gen)  # room for the prompt and every generated token
    opts = dataclasses.replace(opts, batch=int(p.model["batch"]))
    g = generate(cfg, target, opts, prompt=prompt, gen=gen)
    result.fits_predicted = bool(g.fits)
    if not g.fits:
        why = g.prefill.failure or next((d.failure for d in g.decode if d.failure), None) or "does not fit"
        result.notes.append(f"the tool says it does not fit: {why}")
    figures = {
        "ttft_s": g.ttft_s,
        "tpot_s": g.tpot_s,
        "latency_s": g.latency_s,
        "decode_tokens_per_s": g.decode_tokens_per_s_total,
    }
    for key, value in p.measured.items():
        if not g.fits:
            result.quantities.append(Quantity(key, float(value), None, "model does not fit"))
            continue
        predicted = figures.get(key)
        note = "" if predicted is not None else "not predicted (a generation point predicts " + ", ".join(figures) + ")"
        result.quantities.append(Quantity(key, float(value), predicted, note))
    if result.fits_expected is None and measured_numbers(p.measured):
        result.fits_expected = True
    if g.interpolated:
        result.notes.append(f"tpot interpolated linearly in context between {len(g.decode)} placed decode steps")


_SCALED = frozenset({"samples_per_s", "tokens_per_s", "step_time_s"})
"""The quantities a multi-chip point predicts (the step of all chips); the rest are one chip's."""
