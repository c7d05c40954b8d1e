"""The Python API (docs/api.md): the CLI's questions as functions with keyword options.

Options are the knobs of `dabench_ir.options` by their field names (``batch=8``, ``precision="bf16"``,
``dims={"seq": 128}``). Bad input raises `ApiError` (a ValueError) worded for Python: ``batch=2``,
not ``--batch 2``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from dabench_ir.errors import UserError

if TYPE_CHECKING:
    from dabench_ir.report.model import Report
    from dabench_ir.scaling import ScaleResult
    from dabench_ir.scenario import GenerateResult
    from dabench_ir.validate import Validation

__all__ = [
    "ApiError",
    "Metrics",
    "StudyResult",
    "StudyRun",
    "StudyTotals",
    "TargetSummary",
    "Totals",
    "generate",
    "profile",
    "profile_targets",
    "run_study",
    "run_validation",
    "scale",
    "scale_model",
    "study_input",
]


class Totals(TypedDict, total=False):
    """`Report.totals`: the whole step. Every report has the cost keys; a placed or measured one the
    time keys; a modelled target the energy keys (J, W)."""

    flops: int  # all FLOPs: contraction + vector (special-function ops counted apart)
    contraction_flops: int  # MatMul, Gemm, Conv...: 2 per multiply-add
    vector_flops: int
    special_ops: int  # exp, erf, rsqrt, ...
    bytes: int  # weights + activations in + activations out
    weight_bytes: int
    act_bytes_in: int
    act_bytes_out: int
    intensity: float  # flops / bytes
    nodes: int
    unattributed_nodes: int  # nodes without a cost rule (never counted as zero)
    estimated_nodes: int  # nodes given a labelled bytes-only estimate
    copies: int  # data-parallel copies of the graph a step runs (IPU replicas, WSE copies on the wafer)
    step_flops: int  # flops x copies: the step's work, what achieved_flops_per_s counts
    time_s: float  # one step
    throughput_samples_per_s: float  # every copy's samples
    achieved_flops_per_s: float  # step_flops / time_s
    overhead_s: float  # time no node owns (host, reconfiguration, launch)
    energy_j: float
    energy_per_sample_j: float
    power_w: float


class Metrics(TypedDict, total=False):
    """`Report.metrics` (ARCHITECTURE.md, "Metrics"); None where the target has no such figure."""

    allocation_ratio: float | None  # units held / units on the chip
    load_imbalance: float | None  # LI = mean / max busy time of concurrent subtasks (1.0: balanced)
    compute_efficiency: float | None  # achieved / peak FLOP/s at the precision used
    achieved_flops_per_s: float | None
    peak_flops_per_s: float | None
    memory_use: dict[str, Any]  # per memory level: resident bytes, capacity, fits
    roofline_bound: str | None  # compute | memory | communication | overhead


class ApiError(UserError, ValueError):
    """Bad input to the Python API: one line saying what is wrong and how to fix it (a ValueError, and a
    UserError: a command line that meets one exits 2 with the line)."""


_FLAG = re.compile(r"--dim (\S+?)=(\S+?)(?=[:;,\s]|$)|(--[a-z][a-z-]*)(?: (\d\S*?|\S+?(?=[:;,]|$))(?=[:;,\s]|$))?")


def _keywords(message: str) -> str:
    """A CLI-worded message in keyword terms: ``--batch 2`` -> ``batch=2``, ``--dim seq=N`` ->
    ``dims={'seq': N}``; flags that are no keyword of the API (export's) stay as they are."""
    from dabench_ir.options import KNOBS

    names = {k.flag: name for name, k in KNOBS.items()}

    def word(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return f"dims={{{m.group(1)!r}: {m.group(2)}}}"
        name = names.get(m.group(3))
        if name is None:
            return m.group(0)
        if m.group(4) is None:
            return f"{name}="
        return f"dims[{m.group(4)!r}]" if name == "dims" else f"{name}={m.group(4)}"

    return _FLAG.sub(word, message)


def _api(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except UserError as exc:
        raise ApiError(_keywords(str(exc))) from None


def _model(model: Any) -> Any:
    """``model`` as the API takes it (a path, a preset name, an ``onnx.ModelProto``), else an ApiError."""
    if isinstance(model, (str, os.PathLike)) or type(model).__name__ == "ModelProto":
        return model
    raise ApiError(
        f"model={model!r}: give a path to an .onnx or .mlir file, a preset name (e.g. 'gpt2-small') "
        "or an onnx.ModelProto"
    )


def _counts(name: str, values: Any, example: str) -> list[int]:
    """A non-empty sequence of positive integers (``chips``, ``batch``), else an ApiError naming it."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ApiError(f"{name}={values!r}: give a sequence of positive integers, e.g. {name}={example}")
    if not values:
        raise ApiError(f"{name}={values!r}: give at least one, e.g. {name}={example}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise ApiError(f"{name}={values!r}: {bad[0]!r} is not a positive integer")
    return list(values)


def _one_step(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` of a one-step question; ``scenario`` is `generate`'s, whose steps are many."""
    if options.get("scenario") is not None:
        raise ApiError(
            f"scenario={options['scenario']!r} runs a prefill and decode steps, not one step: call "
            "dabench_ir.api.generate(model, target, prompt=P, gen=G, ...)"
        )
    return options


def profile(model: str | Path | Any, target: str | None = None, **options: Any) -> Report:
    """``model`` (a path to .onnx/.mlir, or an ``onnx.ModelProto``) on ``target`` (None: cost only)."""
    from dabench_ir.pipeline import run_profile

    model = _model(model)
    return _api(lambda: run_profile(model, target, _one_step(options)))


def generate(model: Any, target: str, *, prompt: int, gen: int, **options: Any) -> GenerateResult:
    """The generation scenario (``profile --scenario generate``): ``options.batch`` requests of
    ``prompt`` tokens each generating ``gen``, on ``target``: the prefill, each decode step as the
    cache grows, time to first token and per output token. ``model``: a preset name, a path, an
    ``onnx.ModelProto``, or a ``(prefill, decode)`` pair of dynamic exports."""
    from dabench_ir.options import ScaleOptions
    from dabench_ir.scenario import generate as run_generate

    def call() -> GenerateResult:
        try:
            opts = ScaleOptions(**{**options, "scenario": "generate", "prompt": prompt, "gen": gen})
        except TypeError as exc:
            raise UserError(f"options: {exc}") from None
        return run_generate(model if isinstance(model, tuple) else _model(model), target, opts, prompt=prompt, gen=gen)

    return _api(call)


def profile_targets(model: str | Path | Any, targets: Sequence[str], **options: Any) -> dict[str, Report]:
    """``model`` on each of ``targets``, costed once per distinct costing: ``{target: Report}``."""
    from dabench_ir.pipeline import profile_targets as _profile_targets

    model = _model(model)
    if isinstance(targets, str) or not isinstance(targets, Sequence) or not targets:
        raise ApiError(f"targets={targets!r}: give a list of target names, e.g. targets=['rdu', 'h100']")
    return _api(lambda: _profile_targets(model, list(targets), _one_step(options)))


def scale_model(
    model: Any,
    target: str,
    chips: Sequence[int],
    batches: Sequence[int | None],
    options: Mapping[str, Any],
    progress: Callable[[str], None] | None = None,
) -> ScaleResult:
    """``model`` over each of ``chips`` on ``target`` for each batch (None: as exported): the points of one
    `ScaleResult`, in batch order. ``options``: the knobs given (``strategy`` among them). Each point is a
    run of its own, its report checked by the physics verifier like any other (`dabench_ir.run.placed`,
    on the batch's prepared graph, over the one-chip placement of the first).
    Raises UserError."""
    from dabench_ir.options import check_shared
    from dabench_ir.pipeline import load_graph
    from dabench_ir.run import placed, prepare, resolve
    from dabench_ir.targets import load_target

    say = progress or (lambda _m: None)
    if options.get("strategy") is None:
        raise UserError("scale: give --strategy dp, tp or pp")
    check_shared(max(chips), {k: options.get(k) for k in ("zero", "chips_per_node")})  # the strategy is scale's own
    tgt = load_target(target)
    merged: ScaleResult | None = None
    loaded = load_graph(model, dims=options.get("dims"), batch=batches[0])
    for batch in batches:
        say(f"preparing the graph (batch {batch or 'as exported'})")
        run = resolve(loaded, tgt, {**options, "batch": batch}, model=model)
        graph = prepare(run, loaded.clone())
        one = None  # the one-chip placement every point's speedup is over: placed once a batch
        for n in chips:
            say(f"{n} chip{'s' if n > 1 else ''} ({run.options.strategy}), batch {batch or 'as exported'}")
            point = placed(run.variant(chips=n), graph, shared=True, baseline=one)
            result = point.report().scaling
            one = one or point.one_chip()
            if merged is None:
                merged = dataclasses.replace(result, points=[])
                merged.model = {
                    "path": str(model),
                    "name": graph.name,
                    "nodes": len(graph.nodes),
                    "layers": len(graph.layers),
                }
            merged.points.append(result.points[-1])
    assert merged is not None
    return merged


def scale(
    model: str | Path | Any,
    target: str,
    *,
    strategy: str,
    chips: Sequence[int] = (1, 2, 4, 8),
    batch: int | Sequence[int] | None = None,
    **options: Any,
) -> ScaleResult:
    """``model`` over ``chips`` chips of ``target`` with ``strategy`` (dp, tp, pp): a `ScaleResult`
    (``.points``: one `ScalePoint` per batch and chip count). ``batch``: one, several, or None (as
    exported)."""
    model = _model(model)
    counts = _counts("chips", chips, "(1, 2, 4)")
    batches = (
        [None]
        if batch is None
        else _counts("batch", [batch] if isinstance(batch, int) else batch, "8 or batch=(8, 32)")
    )
    return _api(lambda: scale_model(model, target, counts, batches, {**_one_step(options), "strategy": strategy}))


def study_input(model: Any, options: Any) -> tuple[Any, Any]:
    """What `dabench_ir.study.run_study` takes for ``model``: a file as it is; a preset name (no such file)
    its export, every side run at the preset's batch and seq unless ``options`` bind them."""
    if not isinstance(model, str) or os.path.lexists(model):
        return model, options
    from dabench_ir.models.presets import names_preset, preset_file, preset_shape

    if not names_preset(model):
        return model, options
    shape = preset_shape(model)
    options = dataclasses.replace(options, batch=options.batch or shape["batch"], seq=options.seq or shape["seq"])
    return str(preset_file(model)), options


class StudyTotals(TypedDict, total=False):
    """`StudyRun.totals`: the whole step before (the baseline) and after (the pipeline)."""

    time_before_s: float
    time_after_s: float
    speedup: float  # time_before_s / time_after_s
    speedup_nodes: float  # the nodes' busy time alone
    speedup_overheads: float  # the overhead rows alone
    flops_before: int
    flops_after: int
    bytes_before: int
    bytes_after: int
    nodes_before: int
    nodes_after: int
    nodes_kept: int
    nodes_fused: int
    nodes_replaced: int
    nodes_added: int
    nodes_removed: int
    nodes_folded: int
    bound_changes: int  # nodes whose bound class changed


@dataclass(frozen=True)
class StudyRun:
    """One pipeline on one target, against the baseline (the model as it is, on that target)."""

    pipeline: str
    target: str | None  # None: cost only (no target given)
    totals: StudyTotals
    config: dict[str, Any]  # the pipeline's run: opt_level, wse_mode, precision, mode, batch
    nodes: list[dict[str, Any]]  # per node: node, op, status (kept/fused/...), replaces, before/after figures
    modules: list[dict[str, Any]]  # per module: nodes, flops, bytes, time before and after
    warnings: list[str]


@dataclass(frozen=True)
class StudyResult:
    """`run_study`'s answer: ``runs`` one per pipeline and target, ``failed`` the pipelines that could not
    run (each with its one-line ``reason``); ``doc`` the JSON document (schema dabench-ir/study/v1)."""

    model: str
    targets: list[str]
    pipelines: list[str]
    runs: list[StudyRun]
    failed: list[dict[str, Any]]
    doc: dict[str, Any]

    def run(self, pipeline: str, target: str | None = None) -> StudyRun:
        """The run of ``pipeline`` on ``target`` (a name or alias, ``rdu`` = ``sn30``; None: its first run)."""
        from dabench_ir.targets import is_host, load_target

        names = {target}
        if target is not None and not is_host(target):
            names.add(load_target(target).name)
        for r in self.runs:
            if r.pipeline == pipeline and (target is None or r.target in names):
                return r
        have = ", ".join(f"{r.pipeline} on {r.target}" for r in self.runs)
        raise ApiError(f"pipeline={pipeline!r}, target={target!r}: no such run (runs: {have})")


def run_study(
    model: str | Path,
    pipelines: Sequence[str],
    targets: Sequence[str] = (),
    *,
    out_dir: str | Path | None = None,
    **options: Any,
) -> StudyResult:
    """The CLI's ``study``: each of ``pipelines`` (``--list-pipelines``) on ``model``, placed on each of
    ``targets`` and diffed node by node against the model as it is. ``out_dir`` keeps every rewritten
    model and report JSON. (Named ``run_study``: ``dabench_ir.study`` is the subpackage.)"""
    from dabench_ir.options import ScaleOptions
    from dabench_ir.study import run_study as _run_study

    def call() -> StudyResult:
        try:
            opts = ScaleOptions(**options)
        except TypeError as exc:
            raise UserError(f"run_study: {exc}") from None
        source, opts = study_input(str(model), opts)
        doc = _run_study(source, list(pipelines), list(targets), opts, out_dir=out_dir)
        runs = [
            StudyRun(
                pipeline=r["pipeline"],
                target=r.get("target"),
                totals=r["totals"],
                config=r["config"],
                nodes=r["nodes"],
                modules=r["modules"],
                warnings=r["warnings"],
            )
            for r in doc["runs"]
        ]
        return StudyResult(doc["model"], doc["targets"], doc["pipelines"], runs, doc["failed"], doc)

    return _api(call)


class TargetSummary(TypedDict):
    """One target's line of `Validation.summary()`: point counts and |relative error| statistics
    (None where nothing was compared); ``in_sample``/``out_of_sample`` the same statistics of the
    points a fitted parameter names (``fitted_to``) and of the rest."""

    points: int
    ran: int
    cannot_run: int
    reference_only: int
    fit_right: int
    fit_wrong: int
    not_predicted: int
    compared: int
    median_abs_error: float | None
    worst_abs_error: float | None
    median_abs_error_throughput: float | None
    worst_abs_error_throughput: float | None
    in_sample: dict[str, Any]
    out_of_sample: dict[str, Any]


def run_validation(
    target: str | None = None,
    *,
    catalog: str | Path | Sequence[str | Path] | None = None,
    cache_dir: str | Path | None = None,
) -> Validation:
    """The CLI's ``validate``: every catalogue point (the bundled catalogue, or ``catalog`` files in its
    format) on ``target`` (None: all), predicted vs measured. ``.results``: one `PointResult` per point;
    ``.summary()``: ``{target: TargetSummary}``; ``.cross_validation``: the leave-one-source-out errors
    (the figure to trust), for the bundled catalogue as the CLI prints them, None for a ``catalog`` of
    your own. (Named ``run_validation``: ``dabench_ir.validate`` is the subpackage.)"""
    from dabench_ir import validate
    from dabench_ir.validate.crossval import validate_points

    return _api(
        lambda: validate_points(
            validate.load_catalog(catalog), bundled=catalog is None, target=target, cache_dir=cache_dir
        )
    )
