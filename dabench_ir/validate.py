"""Predicted vs measured: run the catalogue of published measurements through the tool.

The catalogue (``dabench_ir/data/measurements/*.toml``, format in its README.md and
docs/validation.md) holds one record per published data point: a system, a model and the
options it ran with, the quantities measured, and the source. `validate` builds each
model weight-free (the sweep's cached 1-layer export, stamped to L layers), profiles it
with the point's options through the public pipeline, and compares every measured
quantity with the tool's prediction. A point the tool cannot run is kept with its reason;
a quantity the tool does not predict is shown as such; an option it has no knob for is
listed as ignored. Users run their own measurements with ``--catalog FILE``.

Relative error = (predicted - measured) / measured. Statistics per target use |error| and
leave out points marked ``reference_only`` (measured on another chip generation).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import statistics
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError

if TYPE_CHECKING:
    import onnx

    from dabench_ir.report import Report

__all__ = [
    "FORMAT",
    "HEADLINE",
    "KINDS",
    "PREDICTORS",
    "RUN_OPTIONS",
    "Point",
    "PointResult",
    "Quantity",
    "Validation",
    "baseline",
    "bundled_catalogs",
    "gemm_model",
    "kernel_classes",
    "kernel_load_imbalance",
    "load_catalog",
    "parse_catalog",
    "regressions",
    "run_validation",
    "write_csv",
    "write_json",
    "write_plots",
]

logger = logging.getLogger(__name__)

FORMAT = "dabench-ir/measurements/v1"
KINDS = ("model", "gemm", "gemm_max_fit", "gemm_ratio", "bandwidth", "host")
HOST_TARGET = "cpu"
"""``host`` points (a model measured live on this machine) run only under ``--target cpu``."""
HEADLINE = "samples_per_s"
"""The headline quantity: throughput, samples (sequences) per second."""

Say = Callable[[str], None]
Bar = Callable[..., None]

# -- the catalogue's schema ----------------------------------------------------------------

_POINT_KEYS = {
    "id": str, "kind": str, "target": str, "source": str, "system": str, "note": str, "reference_only": bool,
    "assumptions": list, "model": dict, "run": dict, "measured": dict, "expect": dict, "gemm": dict, "bandwidth": dict,
    "host": dict,
}  # fmt: skip
_REQUIRED = ("id", "kind", "target", "source")
_MODEL_KEYS = {
    "family": str, "preset": str, "layers": int, "hidden": int, "heads": int, "kv_heads": int, "ffn": int,
    "seq": int, "vocab": int, "batch": int, "positional": str,
}  # fmt: skip
_MODEL_REQUIRED = ("layers", "batch")
_MEASURED_NUMBERS = {
    # model points
    "samples_per_s", "tokens_per_s", "step_time_s", "latency_s", "host_time_s", "device_time_s", "sections", "max_pcu_utilization",
    "active_pes", "compute_utilization", "compute_limited_samples_per_s", "transmission_limited_samples_per_s",
    # microbenchmarks
    "tflops", "fraction_of_peak", "max_square", "ratio", "bandwidth_gb_s",
}  # fmt: skip
_MEASURED_FILES = {"kernels_csv"}
_PRECISIONS = ("fp32", "fp16", "bf16", "mixed")


@dataclass(frozen=True)
class _Option:
    """How one catalogue run key reaches the tool: a ProfileOptions field, for some target kinds.

    ``field`` None: the tool has no knob for it. A field ProfileOptions does not declare (yet)
    is reported as ignored too, so adding the knob there makes the key take effect.
    ``convert(value, point)`` turns the catalogue value into the field's value.
    """

    field: str | None
    kinds: frozenset[str] | None = None  # None: every target kind
    convert: Callable[[Any, Point], Any] | None = None


def _micro_batches(value: Any, point: Point) -> int:
    """Pipeline micro-batches per step: the model's batch over the micro-batch."""
    micro = int(point.run.get("micro_batch", 1))
    return max(1, int(point.model.get("batch", value * micro)) // micro)


RUN_OPTIONS: dict[str, _Option] = {
    "mode": _Option("mode"),
    "precision": _Option("precision"),
    "recompute": _Option("recompute"),
    "opt_level": _Option("opt_level", frozenset({"rdu"})),
    "tiles": _Option("tiles", frozenset({"rdu"})),
    "resource_scaling": _Option("resource_scale", frozenset({"rdu"})),
    "wse_mode": _Option("wse_mode", frozenset({"wse"})),
    "replicas": _Option("replicas", frozenset({"wse", "ipu"})),  # IPU: data-parallel replicas (throughput of all)
    "ipus": _Option("ipus", frozenset({"ipu"})),
    "layers_per_ipu": _Option("layers_per_ipu", frozenset({"ipu"})),
    "matmul_proportion": _Option("matmul_proportion", frozenset({"ipu"})),
    "optimizer_state": _Option("optimizer_state"),
    "gradient_accumulation": _Option("micro_batches", frozenset({"ipu"}), _micro_batches),
    "micro_batch": _Option(None),
    "half_partials": _Option(None),
    "replicated_tensor_sharding": _Option("replicated_tensor_sharding", frozenset({"ipu"})),
    "optimizer": _Option(None),
    "chips": _Option("chips"),  # chips of one model instance (with ``strategy``): through the scaling stage
    "strategy": _Option("strategy"),
}
"""Catalogue ``run`` key -> ProfileOptions field. Adding a knob: one line here (or none, when
the knob is named as the key already is)."""

_UNKNOWN = _Option(None)

_IMPLIED = {"optimizer": ("adam", "adamw")}  # values the tool models without a knob (its Adam state)


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
    target = _check_target(entry["target"], bad)
    model, run, measured = entry.get("model", {}), entry.get("run", {}), entry.get("measured", {})
    expect = entry.get("expect", {})
    if kind == "model":
        _check_model(model, bad)
    for key, value in run.items():  # an option the tool does not know is run without and listed as ignored
        _check_run_value(key, value, bad)
    for key, value in measured.items():  # a quantity the tool does not know is listed as not predicted
        if key in _MEASURED_FILES:
            if not isinstance(value, str):
                raise bad(f"measured.{key}", f"expected a file name, got {value!r}")
        elif not _is_number(value) or value <= 0:
            raise bad(f"measured.{key}", f"expected a positive number, got {value!r}")
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
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse_host_point(name: str, entry: Mapping[str, Any], bad: Callable[[str, str], UserError]) -> Point:
    """A ``host`` point: a model (``[host]``) measured live on ``cpu``; no published numbers."""
    from dabench_ir.execute.hostcheck import check_host

    if entry["target"] != HOST_TARGET:
        raise bad("target", f"a host point runs on this machine: target = {HOST_TARGET!r}")
    for key in ("model", "run", "measured", "expect", "gemm", "bandwidth"):
        if key in entry:
            raise bad(key, "not used by a host point (the model goes in [host], the measurement is live)")
    check_host(entry.get("host", {}), bad)
    return Point(id=entry["id"], kind="host", target=HOST_TARGET, source=entry["source"], file=name,
                 system=entry.get("system", ""), note=entry.get("note", ""), host=dict(entry.get("host", {})))  # fmt: skip


def _check_target(name: str, bad: Callable[[str, str], UserError]) -> str:
    """The target's own name (aliases resolved), or a UserError naming the key."""
    from dabench_ir.targets import load_target

    try:
        target = load_target(name)
    except UserError as exc:
        raise bad("target", str(exc)) from None
    # a target file given by path keeps its path, so the points load it again
    return name if name.endswith(".toml") else target.name


def _check_model(model: Mapping[str, Any], bad: Callable[[str, str], UserError]) -> None:
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
    if "preset" not in model:
        for key in ("family", "hidden", "heads", "seq"):
            if key not in model:
                raise bad(f"model.{key}", "missing (or give model.preset)")


def _check_run_value(key: str, value: Any, bad: Callable[[str, str], UserError]) -> None:
    if key == "precision" and value not in _PRECISIONS:
        raise bad("run.precision", f"{value!r} is not one of {', '.join(_PRECISIONS)}")
    if key == "mode" and value not in ("inference", "train"):
        raise bad("run.mode", f"{value!r} is not inference or train")
    if key in ("ipus", "tiles", "replicas", "micro_batch", "gradient_accumulation") and (
        not isinstance(value, int) or isinstance(value, bool) or value < 1
    ):
        raise bad(f"run.{key}", f"expected a positive integer, got {value!r}")
    if key in ("layers_per_ipu", "matmul_proportion", "resource_scaling") and not isinstance(value, (list, int, float)):
        raise bad(f"run.{key}", f"expected a number or a list of numbers, got {value!r}")


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


def kernel_classes(csv_path: str | Path) -> dict[str, dict[str, float]]:
    """Per kernel class of a compile report's kernel table: count, PEs (sum, min, max, median),
    utilisation (min, max, median) and rates.

    The class is the kernel name without its trailing number (``attention12`` -> attention).
    The median is the typical kernel: the region the compiler's balance sets, unmoved by the
    few regions it oversizes (8 of GPT-2 small's 25 layer norms run at 1.1-2.2x the pipeline's rate).
    """
    rows: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for name, pes, util, rate in _kernel_rows(csv_path):
        rows.setdefault(name, []).append((pes, util, rate))
    out: dict[str, dict[str, float]] = {}
    for name, kernels in rows.items():
        pes = [k[0] for k in kernels]
        utils = [k[1] for k in kernels if k[1] is not None]
        rates = [k[2] for k in kernels if k[2] is not None]
        out[name] = {
            "count": len(kernels), "pes": sum(pes), "pes_min": min(pes), "pes_max": max(pes),
            "pes_median": statistics.median(pes),
            "util_min": min(utils, default=None), "util_max": max(utils, default=None),
            "util_median": statistics.median(utils) if utils else None,
            "rate_min": min(rates, default=None), "rate_max": max(rates, default=None),
        }  # fmt: skip
    return out


def kernel_load_imbalance(csv_path: str | Path) -> float | None:
    """A compile report's LI as the tool defines it (docs/targets.md, WSE): the PE-weighted share
    of each period a kernel is busy, ``sum_k p_k x (slowest rate / rate_k) / sum_k p_k``, over the
    kernels that state a rate."""
    timed = [(pes, rate) for _, pes, _, rate in _kernel_rows(csv_path) if rate]
    if not timed:
        return None
    slowest = min(rate for _, rate in timed)
    return sum(pes * slowest / rate for pes, rate in timed) / sum(pes for pes, _ in timed)


def _kernel_rows(csv_path: str | Path) -> Iterator[tuple[str, float, float | None, float | None]]:
    """(class, PEs, utilisation, samples/s) per row of a compile report's kernel table."""
    with open(csv_path, newline="") as fh:
        for row in csv.DictReader(fh):
            name = row["kernel"].rstrip("0123456789") or row["kernel"]
            yield name, float(row["active_pes"]), _pct(row.get("compute_utilization_pct")), _float(row.get("samples_per_s"))


def _pct(text: str | None) -> float | None:
    value = _float((text or "").rstrip("%"))
    return value / 100 if value is not None else None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "-", "–") else None
    except ValueError:
        return None


# -- results ------------------------------------------------------------------------------------


@dataclass
class Quantity:
    """One measured quantity of a point and what the tool predicts for it."""

    name: str
    measured: float | None
    predicted: float | None = None
    note: str = ""  # "not predicted", "model does not fit", ...

    @property
    def error(self) -> float | None:
        """Relative error (predicted - measured) / measured, or None."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


@dataclass
class PointResult:
    """What validating one point found."""

    point: Point
    status: str = "ok"  # ok | cannot run
    reason: str = ""
    quantities: list[Quantity] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    fits_expected: bool | None = None
    fits_predicted: bool | None = None
    notes: list[str] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)  # host points: prediction_error with noise, label

    @property
    def fit_verdict(self) -> str | None:
        """ "right", "wrong", or None when the point states no fit or the tool did not run."""
        if self.fits_expected is None or self.fits_predicted is None:
            return None
        return "right" if self.fits_expected == self.fits_predicted else "wrong"

    def rows(self) -> list[dict[str, Any]]:
        """One table row per quantity (a point with none gets one row for its status)."""
        p = self.point
        base = {
            "id": p.id, "target": p.target, "kind": p.kind, "status": self.status, "reason": self.reason,
            "reference_only": p.reference_only, "fits_expected": self.fits_expected,
            "fits_predicted": self.fits_predicted, "fit_verdict": self.fit_verdict,
            "ignored": ";".join(self.ignored), "source": p.source,
        }  # fmt: skip
        if self.host:  # live host points: per-node errors and the measured noise
            base["host"] = dict(self.host)
        out = []
        for q in self.quantities:
            out.append({**base, "quantity": q.name, "measured": q.measured, "predicted": q.predicted,
                        "rel_error": q.error, "note": q.note})  # fmt: skip
        if not out:
            out.append({**base, "quantity": None, "measured": None, "predicted": None, "rel_error": None, "note": ""})
        return out


@dataclass
class Validation:
    """All point results, with per-target statistics."""

    results: list[PointResult]
    seconds: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        return [row for r in self.results for row in r.rows()]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per target: points, ran, cannot run, fit right/wrong, not predicted, and |error| statistics.

        ``median_abs_error``/``worst_abs_error`` over every compared quantity;
        ``*_throughput`` over samples/s only. Reference-only points are left out.
        """
        out: dict[str, dict[str, Any]] = {}
        for r in self.results:
            s = out.setdefault(r.point.target, {"points": 0, "ran": 0, "cannot_run": 0, "reference_only": 0,
                                                "fit_right": 0, "fit_wrong": 0, "not_predicted": 0,
                                                "_all": [], "_tp": []})  # fmt: skip
            s["points"] += 1
            if r.point.reference_only:
                s["reference_only"] += 1
                continue
            if r.status != "ok":
                s["cannot_run"] += 1
                continue
            s["ran"] += 1
            if r.fit_verdict == "right":
                s["fit_right"] += 1
            elif r.fit_verdict == "wrong":
                s["fit_wrong"] += 1
            for q in r.quantities:
                if q.error is not None:
                    s["_all"].append(abs(q.error))
                    if q.name == HEADLINE:
                        s["_tp"].append(abs(q.error))
                elif q.note.startswith("not predicted"):
                    s["not_predicted"] += 1
        for s in out.values():
            errs, tp = s.pop("_all"), s.pop("_tp")
            s["compared"] = len(errs)
            s["median_abs_error"] = statistics.median(errs) if errs else None
            s["worst_abs_error"] = max(errs) if errs else None
            s["median_abs_error_throughput"] = statistics.median(tp) if tp else None
            s["worst_abs_error_throughput"] = max(tp) if tp else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "dabench-ir/validation/v1", "seconds": self.seconds, "summary": self.summary(),
                "rows": self.rows()}  # fmt: skip

    def format_table(self) -> str:
        """The text table: per point and quantity, then per target."""
        lines = [f"{'point':38s} {'quantity':30s} {'measured':>11s} {'predicted':>11s} {'error':>8s}  note"]
        for r in self.results:
            head = r.point.id + (" [ref]" if r.point.reference_only else "")
            if r.status != "ok":
                lines.append(f"{head:38s} CANNOT RUN: {r.reason}")
                continue
            extra = []
            if r.fit_verdict is not None:
                extra.append(
                    f"fits: predicted {_yn(r.fits_predicted)}, measured {_yn(r.fits_expected)} ({r.fit_verdict})"
                )
            if r.ignored:
                extra.append("ignored: " + ", ".join(r.ignored))
            extra += r.notes
            if not r.quantities:
                lines.append(f"{head:38s} {'(fit only)':30s}")
            for i, q in enumerate(r.quantities):
                err = f"{q.error:+.1%}" if q.error is not None else "-"
                lines.append(
                    f"{head if i == 0 else '':38s} {q.name:30s} {_num(q.measured):>11s} {_num(q.predicted):>11s} "
                    f"{err:>8s}  {q.note}"
                )
            lines += [f"{'':38s}   {e}" for e in extra]
        lines.append("")
        lines.append(f"{'target':8s} {'points':>6s} {'ran':>4s} {'n/run':>5s} {'ref':>4s} {'fit ok':>6s} "
                     f"{'fit bad':>7s} {'n/pred':>6s} {'median|e|':>9s} {'worst|e|':>9s} {'tp med':>8s} {'tp worst':>8s}")  # fmt: skip
        for target, s in self.summary().items():
            lines.append(
                f"{target:8s} {s['points']:6d} {s['ran']:4d} {s['cannot_run']:5d} {s['reference_only']:4d} "
                f"{s['fit_right']:6d} {s['fit_wrong']:7d} {s['not_predicted']:6d} {_pc(s['median_abs_error']):>9s} "
                f"{_pc(s['worst_abs_error']):>9s} {_pc(s['median_abs_error_throughput']):>8s} "
                f"{_pc(s['worst_abs_error_throughput']):>8s}"
            )
        return "\n".join(lines)


def _yn(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


def _pc(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


# -- running the points ---------------------------------------------------------------------------


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

    from dabench_ir.targets import load_target

    start = time.perf_counter()
    host_run = target is not None and str(target).lower() == HOST_TARGET
    if not host_run:  # live host measurements only when asked for (--target cpu)
        points = [p for p in points if p.kind != "host"]
    if target is not None and host_run:
        points = [p for p in points if p.target == HOST_TARGET]
        if not points:
            raise UserError(f"--target {target}: no catalogue point is on {HOST_TARGET}")
    elif target is not None:
        wanted = load_target(target).name
        points = [p for p in points if p.target == wanted or load_target(p.target).name == wanted]
        if not points:
            raise UserError(f"--target {target}: no catalogue point is on {wanted}")
    say = say or (lambda _m: None)
    tick = bar or (lambda *a, **k: None)
    folder = Path(cache_dir) if cache_dir else _default_cache()
    graphs = _GraphCache(folder, say)
    results: list[PointResult] = []
    order = sorted(range(len(points)), key=lambda i: (points[i].kind != "model", _graph_key(points[i])))
    done: dict[int, PointResult] = {}
    for n, i in enumerate(order):
        p = points[i]
        tick(n, len(points), label=f"{p.id[:28]:28s} ")
        done[i] = _run_point(p, graphs)
    tick(len(points), len(points))
    results = [done[i] for i in range(len(points))]
    return Validation(results, seconds=time.perf_counter() - start)


def _default_cache() -> Path:
    from dabench_ir.execute.calibrate import cache_dir

    return cache_dir() / "models"


def _graph_key(p: Point) -> tuple:
    if p.kind != "model":
        return ("", 0)
    return (json.dumps(dict(p.model), sort_keys=True, default=str), 0)


class _GraphCache:
    """Base exports (disk cache) and costed L-layer graphs (memory), shared by points."""

    def __init__(self, folder: Path, say: Say) -> None:
        self.folder = folder
        self.say = say
        self.bases: dict[str, bytes | Exception] = {}
        self.graphs: dict[tuple[str, int], Any] = {}

    def graph(self, model: Mapping[str, Any]) -> Any:
        """A fresh costed Graph of ``model`` (raises what export or building raised)."""
        from dabench_ir.sweep import graphs

        params = dict(model)
        key = graphs.base_key(params)
        if key not in self.bases:
            data = graphs.load_base(self.folder, key)
            if data is None:
                self.say(f"exporting {key} (once; cached in {self.folder})")
                try:
                    data = graphs.export_base(params)
                except Exception as exc:  # an export failure is the point's reason, not a crash
                    self.bases[key] = exc
                    raise
                try:
                    graphs.save_base(self.folder, key, data)
                except OSError as exc:
                    logger.warning("cannot cache the export in %s: %s", self.folder, exc)
            self.bases[key] = data
        base = self.bases[key]
        if isinstance(base, Exception):
            raise base
        gkey = (key, int(params["layers"]))
        if gkey not in self.graphs:
            self.graphs[gkey] = graphs.build_graph(base, int(params["layers"]))
        return self.graphs[gkey].clone()


def _run_point(p: Point, graphs: _GraphCache) -> PointResult:
    result = PointResult(p, fits_expected=p.expect.get("fits"))
    try:
        runner = {"model": _run_model, "gemm": _run_gemm, "gemm_max_fit": _run_max_fit,
                  "gemm_ratio": _run_ratio, "bandwidth": _run_bandwidth, "host": _run_host}[p.kind]  # fmt: skip
        runner(p, result, graphs)
    except _CannotRun as exc:
        result.status, result.reason = "cannot run", str(exc)
    except UserError as exc:
        result.status, result.reason = "cannot run", f"the tool refused it: {exc}"
    except Exception as exc:
        logger.debug("point %s failed", p.id, exc_info=True)
        text = str(exc).strip().splitlines()
        result.status, result.reason = "cannot run", f"{type(exc).__name__}: {text[0] if text else ''}"
    if result.status != "ok":
        result.quantities = [Quantity(k, v, None, "cannot run") for k, v in _numbers(p.measured)]
    return result


def _run_host(p: Point, result: PointResult, graphs: _GraphCache) -> None:
    """Measure the point's model live and predict it: end-to-end time as the quantity, the
    per-node errors and the measurement's noise as notes."""
    from dabench_ir.execute.hostcheck import run_host

    h = run_host(p.host)
    e = h.error
    result.quantities.append(Quantity("step_time_s", h.measured_s, h.predicted_s, f"{h.label}; repeat {h.repeat}"))

    def pc(x: Any) -> str:
        return "-" if x is None else f"{x:.1%}"

    result.notes.append(
        f"nodes >= 1% of time: {e['nodes_compared']}, median |error| {pc(e['median_node_rel_error'])}, "
        f"p90 {pc(e['p90_node_rel_error'])}; {e.get('nodes_within_noise')} within their noise"
    )
    verdict = "within" if e.get("end_to_end_within_noise") else "beyond"
    result.notes.append(
        f"noise (IQR/median): end to end {pc(e.get('end_to_end_spread'))}, median node "
        f"{pc(e.get('median_node_spread'))}; the end-to-end error is {verdict} noise"
    )
    result.host = {"label": h.label, "repeat": h.repeat, "bench_s": h.bench_s, **e}


class _CannotRun(Exception):
    """A point the tool cannot run, with the reason."""


def _numbers(measured: Mapping[str, Any]) -> list[tuple[str, float]]:
    return [(k, float(v)) for k, v in measured.items() if k not in _MEASURED_FILES]


def _options(p: Point, kind: str, result: PointResult, **extra: Any) -> Any:
    """ScaleOptions for the point; run keys without a knob go to ``result.ignored``."""
    from dabench_ir.options import KNOBS, ScaleOptions

    fields = set(ScaleOptions.__dataclass_fields__)
    values: dict[str, Any] = {}
    for key, value in p.run.items():
        opt = RUN_OPTIONS.get(key, _UNKNOWN)
        if key in _IMPLIED and str(value).lower() in _IMPLIED[key]:
            continue
        if opt.field is None or opt.field not in fields:
            result.ignored.append(f"{key}={_short(value)}")
            continue
        if opt.kinds is not None and kind not in opt.kinds:
            result.ignored.append(f"{key}={_short(value)} (no effect on {kind} targets)")
            continue
        values[opt.field] = opt.convert(value, p) if opt.convert else value
    values.update(extra)
    for name, value in list(values.items()):
        if isinstance(value, list) and name in KNOBS and KNOBS[name].parse is not None:
            values[name] = ",".join(str(v) for v in value)  # a list-valued knob parses its CLI text
    try:
        return ScaleOptions(**values)
    except UserError as exc:
        raise _CannotRun(f"options: {exc}") from None


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def _per_replica_model(p: Point, opts: Any) -> dict[str, Any]:
    """The point's model as one replica runs it: a data-parallel point's catalogue batch is the
    global batch of a step, each of its chips runs its share (`dabench_ir.run`: the graph's batch
    is one replica's)."""
    model = dict(p.model)
    if opts.chips > 1 and opts.strategy == "dp":
        if int(model["batch"]) % opts.chips:
            raise _CannotRun(f"batch {model['batch']} does not split over {opts.chips} data-parallel chips")
        model["batch"] = int(model["batch"]) // opts.chips
    return model


def _run_model(p: Point, result: PointResult, graphs: _GraphCache) -> None:
    from dabench_ir.run import execute, lowering_options, prepare, resolve
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    opts = _options(p, target.kind, result)
    if opts.chips > 1 and opts.strategy is None:
        raise _CannotRun(f"run.chips = {opts.chips} needs run.strategy (dp, tp or pp)")
    try:
        graph = graphs.graph(_per_replica_model(p, opts))
    except UserError as exc:
        raise _CannotRun(f"model: {exc}") from None
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise _CannotRun(f"export failed: {type(exc).__name__}: {text[0] if text else ''}") from None
    run = resolve(graph, target, opts)
    if not p.measured and opts.chips == 1:  # fit only: the placement decides it, no emulation needed
        from dabench_ir.lowering import lower

        plan = lower(prepare(run, graph), target, lowering_options(run))
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
        if key in _MEASURED_FILES:
            result.quantities += _kernel_quantities(p, key, value, report)
            continue
        if not report.fits:
            result.quantities.append(Quantity(key, float(value), None, "model does not fit"))
            continue
        extractor = PREDICTORS.get(key) if opts.chips == 1 or key in _SCALED else None
        predicted = extractor(report, p) if extractor else None
        note = "" if predicted is not None else "not predicted" + (" (multi-chip)" if opts.chips > 1 else "")
        if key not in _MEASURED_NUMBERS:
            note = "not predicted (a quantity the catalogue format does not define)"
        result.quantities.append(Quantity(key, float(value), predicted, note))
    if result.fits_expected is None and _numbers(p.measured):
        result.fits_expected = True  # a measured run ran: it fitted
    if result.fits_expected is True and result.fits_predicted is False:
        result.notes.append("the measurement says it ran, the tool says it does not fit")


_SCALED = frozenset({"samples_per_s", "tokens_per_s", "step_time_s"})
"""The quantities a multi-chip point predicts (the step of all chips); the rest are one chip's."""


def _kernel_quantities(p: Point, key: str, name: str, report: Report | None = None) -> list[Quantity]:
    """A compile report's kernel table against the plan's regions, per kernel class: total PEs
    (``kernel_pes``), the typical kernel's PEs (``kernel_pes_typical``, classes of more than one
    kernel) and utilisation (``kernel_utilization``), and the load imbalance (``load_imbalance``)."""
    path = Path(p.file).parent / name
    if not path.is_file():
        return [Quantity(f"{key}", None, None, f"file {name} not found next to {Path(p.file).name}")]
    # the plan's regions by kernel class (WSE: unit kind "wse_region:<class>"; the I/O region is "patio")
    regions: dict[str, list[tuple[float, float | None]]] = {}
    for u in report.units if report is not None and report.fits else []:
        kind = str(u.get("kind", ""))
        cls = kind.partition(":")[2] if kind.startswith("wse_region:") else "patio" if kind == "wse_io" else ""
        if cls:
            res = u.get("resources", {})
            regions.setdefault(cls, []).append((float(res.get("pes", 0.0)), res.get("utilisation")))
    out = []
    for cls, c in sorted(kernel_classes(path).items()):
        mine = regions.get(cls)
        if not mine:
            out.append(Quantity(f"kernel_pes[{cls}]", c["pes"], None, "not predicted"))
            continue
        out.append(Quantity(f"kernel_pes[{cls}]", c["pes"], sum(pes for pes, _ in mine)))
        if c["count"] > 1:
            out.append(Quantity(f"kernel_pes_typical[{cls}]", c["pes_median"], statistics.median(x for x, _ in mine)))
        utils = [u for _, u in mine if u is not None]
        if c["util_median"] and utils:
            out.append(Quantity(f"kernel_utilization[{cls}]", c["util_median"], statistics.median(utils)))
    li = kernel_load_imbalance(path)
    if li is not None:
        predicted = report.metrics.get("load_imbalance") if report is not None and report.fits else None
        out.append(Quantity("load_imbalance", li, predicted, "" if predicted is not None else "not predicted"))
    return out


def _kernel_utilisation(report: Report) -> float | None:
    """PE-weighted mean utilisation of the plan's kernel regions (what a compile report's "compute
    utilisation" is), else the compute efficiency."""
    regions = [u.get("resources", {}) for u in report.units]
    regions = [r for r in regions if "utilisation" in r and r.get("pes")]
    if not regions:
        return report.metrics.get("compute_efficiency")
    return sum(r["utilisation"] * r["pes"] for r in regions) / sum(r["pes"] for r in regions)


def _io_rate(report: Report, key: str) -> float | None:
    """A compile report's steady-state ceilings as the plan's I/O region states them (WSE
    pipelined: ``compute``, the slowest kernel's rate, and ``transmission``, that rate under the
    input-transmission ceiling; no per-step optimizer or I/O cost); None where the plan has none."""
    for u in report.units:
        if u.get("kind") == "wse_io":
            value = u.get("resources", {}).get(f"{key}_samples_per_s")
            return float(value) if value is not None and math.isfinite(value) else None
    return None


def _host_s(report: Report) -> float | None:
    timeline = getattr(report, "timeline", None)
    over = getattr(timeline, "overheads_s", None) or {}
    host = [v for k, v in over.items() if k.startswith("host")]
    return float(sum(host)) if host else None


def _device_s(report: Report) -> float | None:
    step = report.totals.get("time_s")
    if step is None:
        return None
    return step - (_host_s(report) or 0.0)


def _sections(report: Report) -> float | None:
    n = sum(1 for u in report.units if u.get("kind") == "rdu_section")
    return float(n) if n else None


def _max_pcu(report: Report) -> float | None:
    alloc = [u.get("allocation") for u in report.units if u.get("kind") == "rdu_section"]
    alloc = [a for a in alloc if a is not None]
    return max(alloc) if alloc else None


def _tokens_per_s(report: Report, point: Point) -> float | None:
    from dabench_ir.sweep.graphs import base_config

    tp = report.totals.get("throughput_samples_per_s")
    return tp * base_config(dict(point.model)).seq if tp else None


def _tflops(report: Report) -> float | None:
    achieved = report.totals.get("achieved_flops_per_s")
    return achieved / 1e12 if achieved else None


PREDICTORS: dict[str, Callable[[Report, Point], float | None]] = {
    "samples_per_s": lambda r, _p: r.totals.get("throughput_samples_per_s"),
    "tokens_per_s": _tokens_per_s,
    "step_time_s": lambda r, _p: r.totals.get("time_s"),
    "latency_s": lambda r, _p: r.totals.get("time_s"),
    "host_time_s": lambda r, _p: _host_s(r),
    "device_time_s": lambda r, _p: _device_s(r),
    "sections": lambda r, _p: _sections(r),
    "max_pcu_utilization": lambda r, _p: _max_pcu(r),
    "active_pes": lambda r, _p: r.metrics.get("allocation_ratio"),
    "compute_utilization": lambda r, _p: _kernel_utilisation(r),
    "tflops": lambda r, _p: _tflops(r),
    "compute_limited_samples_per_s": lambda r, _p: _io_rate(r, "compute"),
    "transmission_limited_samples_per_s": lambda r, _p: _io_rate(r, "transmission"),
}
"""Measured quantity -> how the report predicts it (missing: "not predicted")."""


# -- microbenchmarks ---------------------------------------------------------------------------------


def gemm_model(m: int, n: int, k: int) -> onnx.ModelProto:
    """A one-MatMul ONNX model, ``[m, k] x [k, n] -> [m, n]`` in fp32, both operands graph inputs."""
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [k, n])
    c = helper.make_tensor_value_info("C", TensorProto.FLOAT, [m, n])
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"], name="gemm")], f"gemm{m}x{n}x{k}",
                              [a, b], [c])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="dabench-ir validate")
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _gemm_report(size: int, target: Any, precision: str) -> Report:
    from dabench_ir import pipeline

    return pipeline.run_profile(gemm_model(size, size, size), target, {"precision": precision})


def _gemm_tflops(size: int, target: Any, precision: str) -> float | None:
    report = _gemm_report(size, target, precision)
    if not report.fits:
        return None
    achieved = report.totals.get("achieved_flops_per_s")
    return achieved / 1e12 if achieved else None


def _best_gemm(target: Any, precision: str) -> tuple[int, float]:
    """The best achieved TFLOP/s over square sizes 256, 512, ... up to the largest that fits."""
    best, best_size, size = 0.0, 0, 256
    limit = _max_square(target, precision)
    sizes = sorted({*range(256, limit + 1, 256), limit}) if limit else []
    for size in sizes:
        t = _gemm_tflops(size, target, precision)
        if t is not None and t > best:
            best, best_size = t, size
    if not best_size:
        raise _CannotRun(f"no square {precision} GEMM fits on {target.name}")
    return best_size, best


def _fits(size: int, target: Any, precision: str) -> bool:
    return bool(_gemm_report(size, target, precision).fits)


def _max_square(target: Any, precision: str, cap: int = 1 << 17) -> int:
    """Largest n with an n x n x n GEMM that fits (bisection; 0 if not even 1 fits)."""
    if not _fits(1, target, precision):
        return 0
    lo, hi = 1, 2
    while hi <= cap and _fits(hi, target, precision):
        lo, hi = hi, hi * 2
    if hi > cap:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(mid, target, precision) else (lo, mid)
    return lo


def _run_gemm(p: Point, result: PointResult, _graphs: _GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    precision = p.gemm.get("precision", "fp32")
    size = p.gemm.get("size")
    if size == "best":
        size, tflops = _best_gemm(target, precision)
        result.notes.append(f"best square GEMM predicted at {size}")
    else:
        if not _fits(size, target, precision):
            result.fits_predicted = False
            raise _CannotRun(f"a {size}^3 {precision} GEMM does not fit on {target.name} in the tool")
        tflops = _gemm_tflops(size, target, precision)
    result.fits_predicted = True
    peak = target.peak_flops(precision)
    predicted = {"tflops": tflops, "fraction_of_peak": tflops * 1e12 / peak if peak and tflops else None}
    for key, value in _numbers(p.measured):
        pred = predicted.get(key)
        result.quantities.append(Quantity(key, value, pred, "" if pred is not None else "not predicted"))


def _run_max_fit(p: Point, result: PointResult, _graphs: _GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    precision = p.gemm.get("precision", "fp32")
    n = _max_square(target, precision)
    for key, value in _numbers(p.measured):
        pred = float(n) if key == "max_square" else None
        result.quantities.append(Quantity(key, value, pred, "" if pred is not None else "not predicted"))
    measured = p.measured.get("max_square")
    if measured:
        result.fits_expected = True
        result.fits_predicted = _fits(int(measured), target, precision)


def _run_ratio(p: Point, result: PointResult, _graphs: _GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    size = p.gemm["size"]
    if size == "best":
        _, fast = _best_gemm(target, p.gemm.get("precision", "fp16"))
        _, slow = _best_gemm(target, p.gemm.get("baseline_precision", "fp32"))
    else:
        fast = _gemm_tflops(size, target, p.gemm.get("precision", "fp16"))
        slow = _gemm_tflops(size, target, p.gemm.get("baseline_precision", "fp32"))
    if not fast or not slow:
        raise _CannotRun(f"a {size}^3 GEMM does not fit on {target.name} at both precisions")
    for key, value in _numbers(p.measured):
        pred = fast / slow if key == "ratio" else None
        result.quantities.append(Quantity(key, value, pred, "" if pred is not None else "not predicted"))


def _run_bandwidth(p: Point, result: PointResult, _graphs: _GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    memory = p.bandwidth.get("memory", "off-chip")
    if not target.has_memory(memory):
        raise _CannotRun(f"target {target.name} has no memory {memory!r}")
    mem = target.memory(memory)
    pattern = p.bandwidth.get("pattern", "streaming")
    pred = mem.bandwidth_bytes_per_s / 1e9 if pattern == "streaming" else None
    note = "" if pred is not None else f"not predicted ({pattern} access: the target models streaming bandwidth)"
    for key, value in _numbers(p.measured):
        q = Quantity(key, value, pred if key == "bandwidth_gb_s" else None, note)
        if q.predicted is None and not q.note:
            q.note = "not predicted"
        result.quantities.append(q)
    result.notes.append(f"compared with {target.name}'s {mem.name} bandwidth")


# -- output ----------------------------------------------------------------------------------------

_COLUMNS = ("id", "target", "kind", "status", "quantity", "measured", "predicted", "rel_error", "note",
            "fits_expected", "fits_predicted", "fit_verdict", "ignored", "reference_only", "reason", "source")  # fmt: skip


def write_json(validation: Validation, path: str | Path) -> Path:
    """The summary and every row as JSON (schema ``dabench-ir/validation/v1``)."""
    from dabench_ir.fileio import write_output

    return write_output(path, json.dumps(validation.to_dict(), indent=1, default=str) + "\n")


def write_csv(validation: Validation, path: str | Path) -> Path:
    """One row per point and quantity (columns: see ``_COLUMNS``)."""
    from dabench_ir.fileio import write_with
    from dabench_ir.report.model import csv_cell

    def write(fh: Any) -> None:
        writer = csv.DictWriter(fh, fieldnames=list(_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in validation.rows():
            writer.writerow({k: csv_cell(v) for k, v in row.items()})

    return write_with(path, write)


def write_plots(validation: Validation, folder: str | Path, *, prefix: str = "validation-") -> list[Path]:
    """One PNG per target: predicted (open) and measured (filled) on the same axes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    by_target: dict[str, list[PointResult]] = {}
    for r in validation.results:
        by_target.setdefault(r.point.target, []).append(r)
    paths = []
    for target, results in by_target.items():
        fig = _target_figure(target, results)
        if fig is None:
            continue
        from dabench_ir.report.plots import save_figure

        paths.append(save_figure(fig, folder / f"{prefix}{target}.png"))
    return paths


def _series_key(p: Point) -> str:
    """Points differing only in layers form one series (a depth sweep)."""
    model = {k: v for k, v in p.model.items() if k != "layers"}
    label = ", ".join(f"{k} {v}" for k, v in model.items() if k in ("hidden", "seq", "batch"))
    opts = ", ".join(f"{v}" for k, v in p.run.items() if k in ("opt_level", "wse_mode", "ipus"))
    return f"{opts} {label}".strip()


def _target_figure(target: str, results: list[PointResult]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def value(r: PointResult, name: str) -> tuple[float | None, float | None]:
        for q in r.quantities:
            if q.name == name:
                return q.measured, q.predicted
        return None, None

    model = [r for r in results if r.point.kind == "model" and value(r, HEADLINE)[0] is not None]
    micro = [r for r in results if r.point.kind != "model" and r.quantities]
    series: dict[str, list[PointResult]] = {}
    for r in model:
        series.setdefault(_series_key(r.point), []).append(r)
    sweeps = {k: v for k, v in series.items() if len({r.point.model["layers"] for r in v}) > 1}
    singles = [r for k, v in series.items() if k not in sweeps for r in v]
    panels = [x for x in (sweeps, singles, micro) if x]
    if not panels:
        return None
    fig = Figure(figsize=(6.0 * len(panels), 4.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]

    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
    ax_i = 0
    if sweeps:
        ax = axes[ax_i]
        ax_i += 1
        for c, (label, rs) in enumerate(sweeps.items()):
            rs = sorted(rs, key=lambda r: r.point.model["layers"])
            xs = [r.point.model["layers"] for r in rs]
            meas = [value(r, HEADLINE)[0] for r in rs]
            pred = [value(r, HEADLINE)[1] for r in rs]
            color = colors[c % len(colors)]
            ax.plot(xs, meas, "o-", color=color, label=f"{label}: measured")
            if any(v is not None for v in pred):
                ax.plot(xs, [v if v is not None else math.nan for v in pred], "s--", color=color,
                        mfc="none", label=f"{label}: predicted")  # fmt: skip
        ax.set_xlabel("decoder layers")
        ax.set_ylabel("throughput (samples/s)")
        ax.set_yscale("log")
        ax.set_title(f"{target}: throughput vs depth")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    for group, title, ylabel in ((singles, "throughput per model", "samples/s"), (micro, "microbenchmarks", "value")):
        if not group:
            continue
        ax = axes[ax_i]
        ax_i += 1
        labels, meas, pred, nofit = [], [], [], []
        for r in group:
            names = [HEADLINE] if r.point.kind == "model" else [q.name for q in r.quantities]
            for name in names:
                m, pr = value(r, name)
                if m is None:
                    continue
                labels.append(r.point.id if r.point.kind == "model" else f"{r.point.id}\n{name}")
                meas.append(m)
                pred.append(pr if pr is not None else math.nan)
                if r.fits_predicted is False:
                    nofit.append((len(labels) - 1, m))
        xs = list(range(len(labels)))
        ax.scatter(xs, meas, marker="o", color="#1f77b4", label="measured", zorder=3)
        ax.scatter(xs, pred, marker="s", facecolors="none", edgecolors="#d62728", label="predicted", zorder=3)
        for x, m in nofit:
            ax.annotate("tool: does not fit", (x, m), xytext=(6, -3), textcoords="offset points", fontsize=7,
                        color="#d62728")  # fmt: skip
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{target}: {title}")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


# -- regression guard ---------------------------------------------------------------------------------


def baseline(validation: Validation) -> dict[str, Any]:
    """Each point's status, fit verdict and |relative error| per quantity: what a rerun must not worsen."""
    points: dict[str, Any] = {}
    for r in validation.results:
        points[r.point.id] = {
            "status": r.status,
            "fit_verdict": r.fit_verdict,
            "abs_errors": {q.name: (abs(q.error) if q.error is not None else None) for q in r.quantities},
        }
    return {"schema": "dabench-ir/validation-baseline/v1", "points": points}


def regressions(
    validation: Validation, pinned: Mapping[str, Any], *, abs_tol: float = 0.01, rel_tol: float = 0.02
) -> list[str]:
    """What got worse than ``pinned`` (a `baseline`): one line per regression, empty when none.

    Worse: a pinned point missing or no longer run; a fit verdict that was right and is now
    wrong; a predicted quantity no longer predicted; an |error| above pinned x (1 + rel_tol) + abs_tol.
    """
    now = baseline(validation)["points"]
    problems = []
    for pid, old in pinned.get("points", {}).items():
        new = now.get(pid)
        if new is None:
            problems.append(f"{pid}: pinned point is missing from the catalogue run")
            continue
        if old["status"] == "ok" and new["status"] != "ok":
            reason = next((r.reason for r in validation.results if r.point.id == pid), "")
            problems.append(f"{pid}: ran before, cannot run now ({reason})")
            continue
        if old.get("fit_verdict") == "right" and new.get("fit_verdict") == "wrong":
            problems.append(f"{pid}: fit verdict flipped from right to wrong")
        for name, err in old.get("abs_errors", {}).items():
            if err is None:
                continue
            cur = new["abs_errors"].get(name)
            if cur is None:
                problems.append(f"{pid}: {name} was predicted (|error| {err:.1%}), is not now")
            elif cur > err * (1 + rel_tol) + abs_tol:
                problems.append(f"{pid}: {name} |error| {cur:.1%} is worse than the pinned {err:.1%}")
    return problems
