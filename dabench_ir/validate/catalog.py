"""The catalogue format: the schema of a measurement point, its TOML parser and the run keys.

One record per published data point (``dabench_ir/data/measurements/*.toml``, format in its
README.md and docs/validation.md); a bad file is a UserError naming the file, point and key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError, did_you_mean
from dabench_ir.options import FLOAT_PRECISIONS as _PRECISIONS
from dabench_ir.options import KV_PRECISIONS, MAX_LAYERS, PRECISIONS
from dabench_ir.schema import is_number
from dabench_ir.targets import HOST

__all__ = [
    "FORMAT",
    "HEADLINE",
    "KINDS",
    "MEASURED_FILES",
    "MEASURED_NUMBERS",
    "NOT_RUN_KEYS",
    "RUN_OPTIONS",
    "Point",
    "bundled_catalogs",
    "input_files",
    "load_catalog",
    "measured_numbers",
    "parse_catalog",
    "run_option",
]


FORMAT = "dabench-ir/measurements/v1"
KINDS = ("model", "generate", "gemm", "gemm_max_fit", "gemm_ratio", "bandwidth", "host")
HEADLINE = "samples_per_s"
"""The headline quantity: throughput, samples (sequences) per second."""


# -- the catalogue's schema ----------------------------------------------------------------

_POINT_KEYS = {
    "id": str,
    "kind": str,
    "target": str,
    "source": str,
    "system": str,
    "note": str,
    "reference_only": bool,
    "assumptions": list,
    "model": dict,
    "run": dict,
    "measured": dict,
    "expect": dict,
    "gemm": dict,
    "bandwidth": dict,
    "host": dict,
    "generate": dict,
    "holdout": bool,
}
_REQUIRED = ("id", "kind", "target", "source")
_MODEL_KEYS = {
    "family": str,
    "preset": str,
    "layers": int,
    "hidden": int,
    "heads": int,
    "kv_heads": int,
    "ffn": int,
    "seq": int,
    "vocab": int,
    "batch": int,
    "positional": str,
}
_MODEL_REQUIRED = ("layers", "batch")
MEASURED_NUMBERS = {
    # model points
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "latency_s",
    "host_time_s",
    "device_time_s",
    "sections",
    "max_pcu_utilization",
    "active_pes",
    "compute_utilization",
    "compute_limited_samples_per_s",
    "transmission_limited_samples_per_s",
    # microbenchmarks
    "tflops",
    "fraction_of_peak",
    "max_square",
    "ratio",
    "bandwidth_gb_s",
    # generate points (dabench_ir.scenario): time to first token, per output token, end to end, decode rate
    "ttft_s",
    "tpot_s",
    "decode_tokens_per_s",
}
_MEASURED_FRACTIONS = {"fraction_of_peak", "max_pcu_utilization", "compute_utilization"}
"""Measured quantities that are shares of a whole: in (0, 1] (a percentage is given as 0.85, not 85)."""
_GENERATE_KEYS = ("prompt", "gen")
MEASURED_FILES = {"kernels_csv"}
"""Measured quantities that name a file: resolved inside the catalogue's folder (`fileio.resolve_inside`)."""


@dataclass(frozen=True)
class _Option:
    """How one catalogue run key reaches the tool: a ScaleOptions field, for some target kinds.

    ``field`` None: the tool cannot honour the key; ``refused`` says why (one line), and a point
    that gives it is not run (a figure computed without it would not be the point's). ``implied``:
    values the tool models without a knob (they are accepted; any other value is refused).
    ``kinds`` None: the target kinds the knob itself applies to (`dabench_ir.options.Knob.targets`;
    None there: every kind). A key given for a kind it does not apply to is refused too.
    ``micro_batch`` and ``gradient_accumulation`` are read together (`runner._batching`).
    """

    field: str | None
    kinds: frozenset[str] | None = None
    refused: str = ""
    implied: tuple[Any, ...] = ()


RUN_OPTIONS: dict[str, _Option] = {
    "mode": _Option("mode"),
    "precision": _Option("precision"),
    "kv_precision": _Option("kv_precision"),
    "recompute": _Option("recompute"),
    "fused_attention": _Option("fused_attention"),
    "opt_level": _Option("opt_level"),
    "tiles": _Option("tiles"),
    "resource_scaling": _Option("resource_scale"),
    "rdu_mapping": _Option("rdu_mapping"),  # RDU stage mapping: compiler or tuned (human-decision files)
    "rdu_host_loop": _Option("rdu_host_loop"),  # RDU training app's host loop: tutorial or production
    "wse_mode": _Option("wse_mode"),
    "replicas": _Option("replicas"),  # IPU: data-parallel replicas (throughput of all); WSE: on-wafer copies
    "ipus": _Option("ipus"),
    "layers_per_ipu": _Option("layers_per_ipu"),
    "matmul_proportion": _Option("matmul_proportion"),
    "optimizer_state": _Option("optimizer_state"),
    "replicated_tensor_sharding": _Option("replicated_tensor_sharding"),
    # samples per micro-batch and micro-batches per step: `_batching` (train: profile's --micro-batch)
    "micro_batch": _Option("micro_batch"),
    "gradient_accumulation": _Option("micro_batches"),
    "chips": _Option("chips"),  # chips of one model instance (with ``strategy``): through the scaling stage
    "strategy": _Option("strategy"),
    "zero": _Option("zero"),
    "chips_per_node": _Option("chips_per_node"),
    "optimizer": _Option(
        None,
        refused="the training expansion models Adam(W) state (fp32 master weights and two moments) only",
        implied=("adam", "adamw"),
    ),
    "half_partials": _Option("half_partials"),  # IPU matmul partials: fp32 ones on half the AMP units
}
"""Catalogue ``run`` key -> ScaleOptions field. Adding a knob: one line here (or none, when the knob
is named as the key already is: any `dabench_ir.options.KNOBS` run, target or scale knob not listed
here or in `NOT_RUN_KEYS` is taken under its own name)."""

NOT_RUN_KEYS: dict[str, str] = {
    "batch": "the samples of a step are model.batch",
    "dims": "the model table fixes every dimension",
    "micro_batches": "give gradient_accumulation (micro-batches per optimizer step) or micro_batch",
    "via": "catalogue points are costed from ONNX rules",
    "no_verify": "every catalogue prediction passes the physics verifier",
    "scenario": 'a generation point is kind = "generate" with a [generate] table',
    "prompt": "a generation point gives generate.prompt",
    "gen": "a generation point gives generate.gen",
    "measure": 'the catalogue holds published measurements; live ones are kind = "host"',
    "warmup": 'a measurement setting (kind = "host" points measure live)',
    "repeat": 'a measurement setting (kind = "host" points measure live)',
    "threads": 'a measurement setting (kind = "host" points measure live)',
    "ort_opt": "a measurement setting (host points give host.ort_opt)",
    "max_weight_bytes": 'a measurement setting (kind = "host" points measure live)',
}
"""Knobs that are not catalogue run keys, each with the reason (a point giving one is refused)."""


def run_option(key: str) -> _Option:
    """How the catalogue run key ``key`` reaches the tool (an unknown key: refused, with the reason)."""
    from dabench_ir.options import KNOBS

    if key in RUN_OPTIONS:
        return RUN_OPTIONS[key]
    if key in NOT_RUN_KEYS:
        return _Option(None, refused=f"not a run key: {NOT_RUN_KEYS[key]}")
    if key in KNOBS:
        return _Option(key)
    return _Option(None, refused=_NO_KNOB)


_NO_KNOB = "the tool has no such knob (dabench_ir.validate.RUN_OPTIONS lists the keys)"


def option_kinds(opt: _Option) -> frozenset[str] | None:
    """The target kinds ``opt`` applies to (None: every kind)."""
    from dabench_ir.options import KNOBS

    if opt.kinds is not None:
        return opt.kinds
    knob = KNOBS.get(opt.field) if opt.field else None
    return knob.targets if knob is not None else None


@dataclass(frozen=True)
class Point:
    """One published data point, as the catalogue states it."""

    id: str
    kind: str
    target: str
    source: str
    file: str
    system: str = ""
    note: str = ""
    reference_only: bool = False
    assumptions: tuple[str, ...] = ()
    model: Mapping[str, Any] = field(default_factory=dict)
    run: Mapping[str, Any] = field(default_factory=dict)
    measured: Mapping[str, Any] = field(default_factory=dict)
    expect: Mapping[str, Any] = field(default_factory=dict)
    gemm: Mapping[str, Any] = field(default_factory=dict)
    bandwidth: Mapping[str, Any] = field(default_factory=dict)
    host: Mapping[str, Any] = field(default_factory=dict)
    generate: Mapping[str, Any] = field(default_factory=dict)
    holdout: bool = False
    """The catalogue's word that no parameter is fitted to the point: checked against the target
    file's ``fitted_to`` lists, which decide in and out of sample (`PointResult.informed`)."""


def bundled_catalogs() -> list[Path]:
    """The catalogue files shipped in the package, in name order."""
    folder = resources.files("dabench_ir") / "data" / "measurements"
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".toml"))


def load_catalog(paths: str | Path | Iterable[str | Path] | None = None) -> list[Point]:
    """Points from catalogue files (default: the bundled ones), schema-checked.

    A bad file raises UserError with one line naming the file, the point and the key.
    """
    if paths is None:
        files = bundled_catalogs()
    elif isinstance(paths, (str, Path)):
        files = [Path(paths)]
    else:
        files = [Path(p) for p in paths]
    points: list[Point] = []
    seen: dict[str, str] = {}
    for path in files:
        from dabench_ir.fileio import read_text_file

        try:
            text = read_text_file(path)  # a FIFO, folder or binary file is refused here
        except UserError as exc:
            raise UserError(f"--catalog: cannot read {exc}") from None
        for point in parse_catalog(text, str(path)):
            if point.id in seen:
                raise UserError(f"{path}: point {point.id!r}: id also used in {seen[point.id]}; ids must be unique")
            seen[point.id] = str(path)
            points.append(point)
    return points


def input_files(points: Iterable[Point]) -> list[Path]:
    """Every file the points read: their catalogue files, the kernel tables they name and the
    target files they run on; inputs of ``validate`` that no output of it may overwrite
    (`dabench_ir.fileio.plan_outputs`)."""
    from dabench_ir.targets import is_target_path

    files: dict[str, Path] = {}
    for p in points:
        files.setdefault(p.file, Path(p.file))
        for key in MEASURED_FILES & set(p.measured):
            table = Path(p.file).parent / str(p.measured[key])
            files.setdefault(str(table), table)
        if is_target_path(p.target):
            files.setdefault(p.target, Path(p.target))
    return list(files.values())


def parse_catalog(text: str, name: str = "<catalog>") -> list[Point]:
    """Points from catalogue TOML text; ``name`` is used in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{name}: not valid TOML ({exc})") from None
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise UserError(f"{name}: format {fmt!r} is not {FORMAT!r}")
    unknown = set(data) - {"format", "points"}
    if unknown:
        raise UserError(f"{name}: unknown top-level key(s) {', '.join(sorted(unknown))}; expected format, [[points]]")
    raw = data.get("points")
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{name}: no [[points]] tables; each measurement is one [[points]] table")
    return [_parse_point(name, i, entry) for i, entry in enumerate(raw)]


def _parse_point(name: str, index: int, entry: Any) -> Point:
    label = (
        f"{name}: point {entry.get('id', f'#{index + 1}')!r}"
        if isinstance(entry, dict)
        else f"{name}: point #{index + 1}"
    )

    def bad(key: str, why: str) -> UserError:
        return UserError(f"{label}: {key}: {why}")

    if not isinstance(entry, dict):
        raise UserError(f"{label}: expected a table")
    for key in _REQUIRED:
        if key not in entry:
            raise bad(key, "missing (every point needs id, kind, target, source)")
    for key, value in entry.items():
        if key not in _POINT_KEYS:
            raise bad(key, f"unknown key; expected one of {', '.join(_POINT_KEYS)}")
        want = _POINT_KEYS[key]
        if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
            raise bad(key, f"expected a {want.__name__}, got {value!r}")
    kind = entry["kind"]
    if kind not in KINDS:
        raise bad("kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    if kind == "host":
        return _parse_host_point(name, entry, bad)
    target = _check_target(entry["target"], bad, name)
    model, run, measured = entry.get("model", {}), entry.get("run", {}), entry.get("measured", {})
    expect = entry.get("expect", {})
    generate = entry.get("generate", {})
    if generate and kind != "generate":
        raise bad("generate", 'only a kind = "generate" point has a [generate] table')
    if kind in ("model", "generate"):
        _check_model(model, bad, generate=kind == "generate")
    if kind == "generate":
        _check_generate(generate, run, bad)
    for key, value in run.items():  # a knob the tool has but cannot honour refuses the point (CANNOT RUN)
        if run_option(key).refused == _NO_KNOB:  # a typo: refused with the file
            from dabench_ir.options import KNOBS

            raise bad(f"run.{key}", f"no such run key{did_you_mean(key, [*RUN_OPTIONS, *KNOBS])}")
        _check_run_value(key, value, bad)
    for key, value in measured.items():  # one the format does not define is listed as not predicted (joules) ...
        if key not in MEASURED_FILES and key not in MEASURED_NUMBERS and (near := did_you_mean(key, MEASURED_NUMBERS)):
            raise bad(f"measured.{key}", f"a quantity the format does not define{near}")  # ... but not a typo
        if key in MEASURED_FILES:
            if not isinstance(value, str):
                raise bad(f"measured.{key}", f"expected a file name, got {value!r}")
            table = _inside_catalog(name, value, f"measured.{key}", bad)
            if table.exists():  # a missing one is reported as "not found" on its row
                from dabench_ir.fileio import check_input_file
                from dabench_ir.validate.kernels import check_kernel_table

                try:
                    check_input_file(table)  # a folder or FIFO says what it is, not "not found"
                    check_kernel_table(table)
                except UserError as exc:
                    raise bad(f"measured.{key}", str(exc)) from None
        elif not is_number(value) or value <= 0:
            raise bad(f"measured.{key}", f"expected a positive number, got {value!r}")
        elif key in _MEASURED_FRACTIONS and value > 1:
            raise bad(f"measured.{key}", f"{value!r} is a share of a whole, in (0, 1]; give 0.75 for 75 %")
    for key, value in expect.items():
        if key != "fits" or not isinstance(value, bool):
            raise bad(f"expect.{key}", "the only expectation is fits = true|false")
    if not measured and "fits" not in expect:
        raise bad("measured", "a point needs measured quantities or expect.fits")
    gemm, bandwidth = entry.get("gemm", {}), entry.get("bandwidth", {})
    if kind.startswith("gemm"):
        _check_gemm(kind, gemm, measured, bad)
    if kind == "bandwidth":
        if not isinstance(bandwidth.get("memory", "off-chip"), str):
            raise bad("bandwidth.memory", "expected a memory name or level (on-chip, off-chip)")
        if bandwidth.get("pattern", "streaming") not in ("streaming", "random"):
            raise bad("bandwidth.pattern", "expected streaming or random")
        if "bandwidth_gb_s" not in measured:
            raise bad("measured.bandwidth_gb_s", "missing for a bandwidth point")
    kinds_measured = {"gemm": "tflops", "gemm_max_fit": "max_square", "gemm_ratio": "ratio"}
    if kind in kinds_measured and kinds_measured[kind] not in measured:
        raise bad(f"measured.{kinds_measured[kind]}", f"missing for a {kind} point")
    return Point(
        id=entry["id"],
        kind=kind,
        target=target,
        source=entry["source"],
        file=name,
        system=entry.get("system", ""),
        note=entry.get("note", ""),
        reference_only=entry.get("reference_only", False),
        assumptions=tuple(str(a) for a in entry.get("assumptions", [])),
        model=dict(model),
        run=dict(run),
        measured=dict(measured),
        expect=dict(expect),
        gemm=dict(gemm),
        bandwidth=dict(bandwidth),
        generate=dict(generate),
        holdout=entry.get("holdout", False),
    )


def _parse_host_point(name: str, entry: Mapping[str, Any], bad: Callable[[str, str], UserError]) -> Point:
    """A ``host`` point: a model (``[host]``) measured live on ``cpu``; no published numbers."""
    from dabench_ir.execute.hostcheck import check_host

    if entry["target"] != HOST:
        raise bad("target", f"a host point runs on this machine: target = {HOST!r}")
    for key in ("model", "run", "measured", "expect", "gemm", "bandwidth", "generate"):
        if key in entry:
            raise bad(key, "not used by a host point (the model goes in [host], the measurement is live)")
    check_host(entry.get("host", {}), bad)
    return Point(
        id=entry["id"],
        kind="host",
        target=HOST,
        source=entry["source"],
        file=name,
        system=entry.get("system", ""),
        note=entry.get("note", ""),
        host=dict(entry.get("host", {})),
    )


def _check_target(name: str, bad: Callable[[str, str], UserError], catalog: str = "<catalog>") -> str:
    """The target's own name (aliases resolved), or a UserError naming the key. A target file
    is found inside the catalogue's folder (``catalog``: its path)."""
    from dabench_ir.targets import is_target_path, load_target

    if is_target_path(name):
        name = str(_inside_catalog(catalog, name, "target", bad))
    try:
        target = load_target(name)
    except UserError as exc:
        raise bad("target", str(exc)) from None
    # a target file given by path keeps its (resolved) path, so the points load it again
    return name if name.endswith(".toml") else target.name


def _inside_catalog(catalog: str, name: str, key: str, bad: Callable[[str, str], UserError]) -> Path:
    """A file a catalogue names (under ``key``), inside the catalogue's folder, or a UserError."""
    from dabench_ir.fileio import resolve_inside

    try:
        return resolve_inside(Path(catalog).parent, name)
    except UserError as exc:
        raise bad(key, str(exc)) from None


def _check_generate(gen: Mapping[str, Any], run: Mapping[str, Any], bad: Callable[[str, str], UserError]) -> None:
    """A generation point's [generate] table: prompt and gen, positive integers; it serves (inference)."""
    for key in gen:
        if key not in _GENERATE_KEYS:
            raise bad(f"generate.{key}", f"unknown key; expected {', '.join(_GENERATE_KEYS)}")
    for key in _GENERATE_KEYS:
        value = gen.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad(f"generate.{key}", f"expected a positive integer, got {value!r}")
    if run.get("mode", "inference") != "inference":
        raise bad("run.mode", 'a generation point serves the model: mode = "inference" (or leave it out)')


def _check_model(model: Mapping[str, Any], bad: Callable[[str, str], UserError], *, generate: bool = False) -> None:
    if not model:
        raise bad("model", "missing: a model point needs a [model] table (family, layers, hidden, heads, seq, batch)")
    for key, value in model.items():
        if key not in _MODEL_KEYS:
            raise bad(f"model.{key}", f"unknown key; expected one of {', '.join(_MODEL_KEYS)}")
        want = _MODEL_KEYS[key]
        if not isinstance(value, want) or isinstance(value, bool):
            raise bad(f"model.{key}", f"expected a {want.__name__}, got {value!r}")
    for key in _MODEL_REQUIRED:
        if key not in model:
            raise bad(f"model.{key}", "missing")
    for key, value in model.items():
        if _MODEL_KEYS[key] is int and value < 1:
            raise bad(f"model.{key}", f"expected a positive integer, got {value!r}")
    if model["layers"] > MAX_LAYERS:
        raise bad("model.layers", f"{model['layers']:,} is more than the {MAX_LAYERS:,} decoder blocks the tool builds")
    if "preset" not in model:
        for key in ("family", "hidden", "heads") if generate else ("family", "hidden", "heads", "seq"):
            if key not in model:
                raise bad(f"model.{key}", "missing (or give model.preset)")


def _check_run_value(key: str, value: Any, bad: Callable[[str, str], UserError]) -> None:
    if key == "precision" and value not in PRECISIONS:  # a run at any precision profile takes
        raise bad("run.precision", f"{value!r} is not one of {', '.join(PRECISIONS)}")
    if key == "kv_precision" and value not in KV_PRECISIONS:
        raise bad("run.kv_precision", f"{value!r} is not one of {', '.join(KV_PRECISIONS)}")
    if key == "mode" and value not in ("inference", "train"):
        raise bad("run.mode", f"{value!r} is not inference or train")
    if key in ("ipus", "tiles", "replicas", "micro_batch", "gradient_accumulation", "chips", "chips_per_node") and (
        not isinstance(value, int) or isinstance(value, bool) or value < 1
    ):
        raise bad(f"run.{key}", f"expected a positive integer, got {value!r}")
    if key in ("layers_per_ipu", "matmul_proportion", "resource_scaling") and not isinstance(value, (list, int, float)):
        raise bad(f"run.{key}", f"expected a number or a list of numbers, got {value!r}")
    if key == "zero" and value not in (0, 1, 2, 3):
        raise bad("run.zero", f"expected a ZeRO stage 0, 1, 2 or 3, got {value!r}")
    if key in ("fused_attention", "half_partials", "replicated_tensor_sharding") and not isinstance(value, bool):
        raise bad(f"run.{key}", f"expected true or false, got {value!r}")
    from dabench_ir.options import KNOBS

    opt = run_option(key)
    if opt.field in KNOBS:  # the value the knob takes, as its flag would be checked (nan, 0, 9.82 refused here)
        try:
            KNOBS[opt.field].validate(value)
        except ValueError as exc:
            raise bad(f"run.{key}", f"{value!r}: {exc}") from None


def _check_gemm(kind: str, gemm: Mapping[str, Any], measured: Mapping[str, Any], bad: Callable) -> None:
    precision = gemm.get("precision", "fp32")
    if precision not in _PRECISIONS:
        raise bad("gemm.precision", f"{precision!r} is not one of {', '.join(_PRECISIONS)}")
    if kind == "gemm_ratio" and gemm.get("baseline_precision", "fp32") not in _PRECISIONS:
        raise bad("gemm.baseline_precision", f"expected one of {', '.join(_PRECISIONS)}")
    if kind != "gemm_max_fit":
        size = gemm.get("size")
        if size != "best" and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise bad("gemm.size", f'expected a positive integer (M = N = K) or "best", got {size!r}')


def measured_numbers(measured: Mapping[str, Any]) -> list[tuple[str, float]]:
    return [(k, float(v)) for k, v in measured.items() if k not in MEASURED_FILES]
