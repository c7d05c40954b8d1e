"""Leave one source out: each source's points predicted by parameters fitted without it.

A point's error is only evidence about points the model was not built on. The in- and
out-of-sample split of `Validation.summary` says which points a parameter was fitted to; this
module asks the harder question, per target and per *source* (a paper, a log set, a vendor
table: `source_of`): refit every parameter that source informed on the other sources' points
alone, then predict the source's points with the refitted values. The errors of all folds
together are the target's cross-validated error, the figure to trust for runs nobody has seen.

- A source no parameter was fitted to needs no refit: its points' errors at the file's values
  already are out of sample (every GPU point today).
- A source that alone informs some parameter (no other source's point is in its ``fitted_to``)
  cannot be refitted without itself: that parameter would have nothing to be fitted to. The
  parameters are named, and of its points only those that depend on none of the parameters the
  source informs are scored, at the file's values (`independent`: their predictions do not move
  when those parameters are moved by `PERTURB`); the others are counted, never scored.
- A parameter whose refitted value moves by more than `MOVED` between folds (or from the
  file's value, the all-sources fit) is flagged as not identified by the points.

The fits are slow (a validation per trial value), so ``scripts/refit.py --cross-validate``
runs them once and records each fold's values in ``dabench_ir/data/crossval.json`` with a key
of what they were fitted to (`inputs_key`); `cross_validate` then predicts every fold live, at
the recorded values, and calls a fold stale when its target's parameters or points changed
since (rerun the script).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dabench_ir.report.table import percent
from dabench_ir.validate.catalog import Point
from dabench_ir.validate.fit import counts, fit, informed_by, with_values
from dabench_ir.validate.results import PointResult, Validation
from dabench_ir.validate.runner import run_validation

__all__ = [
    "MOVED",
    "PERTURB",
    "CrossValidation",
    "Fold",
    "cross_validate",
    "fit_folds",
    "folds_of",
    "independent",
    "source_of",
    "validate_points",
]

MOVED = 0.25
"""A parameter is not identified when its refitted values (and the file's) span more than 25 %
(max / min - 1), stated before any fold was fitted."""

PERTURB = (0.8, 1.25)
"""How far a source's fitted parameters are moved, down and up, to find the points of that source
that do not depend on them (`independent`), stated before any point was tested. The k-th parameter
moves by the factor to the power 1 + k/10, so two parameters a prediction reads only as a ratio
cannot cancel."""

RECORD = "crossval.json"
"""The recorded fold fits, package data beside the catalogue (``dabench_ir/data/``)."""

_REPO = re.compile(r"\b([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)\b")


def source_of(point: Point) -> str:
    """The source a point comes from, for leaving it out: the repository its ``source`` names
    first (``graphcore/examples``, ``augustuszzq/Regular-DABench-LLM``), else the text before the
    first comma (``Jia et al.``: one paper)."""
    head = point.source.split(",", 1)[0].strip()
    repo = _REPO.search(head)
    return repo.group(1) if repo else head


@dataclass
class Fold:
    """One source left out of one target's fits."""

    target: str
    source: str
    points: tuple[str, ...]
    informed: tuple[str, ...] = ()  # the parameters fitted to some of the source's points
    alone: tuple[str, ...] = ()  # of those, the ones no other source's point informs (not cross-validatable)
    fit_points: tuple[str, ...] = ()  # the other sources' points the informed parameters are refitted to
    values: dict[str, float] = field(default_factory=dict)  # the refit (empty: nothing to refit, or alone)

    @property
    def needs_fit(self) -> bool:
        return bool(self.informed) and not self.alone

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "points": list(self.points),
            "informed": list(self.informed),
            "alone": list(self.alone),
            "fit_points": list(self.fit_points),
            "values": self.values,
        }


def _target(name: str) -> Any:
    from dabench_ir.targets import load_target

    return load_target(name)


def folds_of(target: str, catalogue: Sequence[Point]) -> list[Fold]:
    """The folds of ``target``: one per source of its catalogue points (live host points aside),
    with what each source informs; no fitting. A source informs a parameter fitted to any of its
    points, another target's among them: a value carried from the chip it was fitted on (the H200's
    decode attention rate, the H100's) is not evidence about that source's points on this one."""
    t = _target(target)
    quantities = dict(t.quantities())
    mine = [p.id for p in catalogue if p.kind != "host" and _target(p.target).name == t.name]
    by_source: dict[str, list[str]] = {}
    for p in catalogue:
        if p.id in mine:
            by_source.setdefault(source_of(p), []).append(p.id)
    sources = {p.id: source_of(p) for p in catalogue}
    folds = []
    for source, ids in by_source.items():
        informed = informed_by(quantities.items(), [i for i, s in sources.items() if s == source])
        elsewhere = {q: [i for i in mine if i not in ids and quantities[q].fitted_on(i)] for q in informed}
        alone = tuple(q for q, others in elsewhere.items() if not others)
        fit_points = tuple(dict.fromkeys(i for others in elsewhere.values() for i in others))
        folds.append(
            Fold(
                target=t.name,
                source=source,
                points=tuple(sorted(ids)),
                informed=tuple(informed),
                alone=alone,
                fit_points=fit_points,
            )
        )
    return folds


_POINT_INPUTS = ("kind", "reference_only", "model", "run", "measured", "expect", "gemm", "bandwidth", "generate")
"""The fields of a catalogue point a prediction reads (`inputs_key`); its prose (system, note,
assumptions, the source's wording beyond `source_of`) does not move a fit."""


def inputs_key(target: str, catalogue: Sequence[Point]) -> str:
    """What a target's fold fits depend on: every figure of its file (each parameter's value, and the
    fitted ones' ``fitted_to``) and what each of its catalogue points asks and measured (a text edit
    to a source or a note does not change it). The tool's code is not in it: a change that moves a
    fitted target's predictions (`scripts/validation_report.py` shows which) needs the folds refitted."""
    t = _target(target)
    parts = [(name, q.value, sorted(q.fitted_to)) for name, q in t.quantities()]
    points = sorted(
        (p.id, source_of(p), [getattr(p, f) for f in _POINT_INPUTS])
        for p in catalogue
        if p.kind != "host" and _target(p.target).name == t.name
    )
    blob = json.dumps([parts, points], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fit_folds(
    target: str,
    catalogue: Sequence[Point],
    *,
    progress: Callable[[str], None] | None = None,
    steps: int = 14,
    rounds: int = 2,
) -> list[Fold]:
    """Every fold of ``target`` with its refit (`fit`, the same search as ``scripts/refit.py``)."""
    from dabench_ir.targets import builtin_target_paths

    t = _target(target)
    text = builtin_target_paths()[t.name].read_text(encoding="utf-8")
    quantities = dict(t.quantities())
    by_id = {p.id: p for p in catalogue}
    folds = folds_of(target, catalogue)
    with tempfile.TemporaryDirectory(prefix="dabench-crossval-") as scratch:
        for fold in folds:
            if fold.needs_fit:
                if progress is not None:
                    progress(f"{t.name}: without {fold.source}")
                start = {q: quantities[q].value for q in fold.informed}
                fold.values = fit(
                    [by_id[i] for i in fold.fit_points],
                    text,
                    start,
                    Path(scratch),
                    steps=steps,
                    rounds=rounds,
                    progress=progress,
                )
    return folds


def _record_path() -> Path:
    return Path(str(resources.files("dabench_ir") / "data" / RECORD))


def load_record() -> dict[str, Any]:
    """The recorded fold fits by target (``{}`` when none were recorded)."""
    path = _record_path()
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def save_record(target: str, folds: list[Fold], key: str, command: str, date: str) -> Path:
    """Record ``target``'s fold fits (other targets' records kept)."""
    record = load_record()
    record[target] = {"inputs": key, "command": command, "date": date, "folds": [f.to_dict() for f in folds]}
    path = _record_path()
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


@dataclass
class TargetCv:
    """One target's cross-validated errors."""

    target: str
    by_source: dict[str, list[float]] = field(
        default_factory=dict
    )  # |relative error| of each scored quantity, by source
    scored: list[str] = field(default_factory=list)  # point ids predicted without their source
    alone: dict[str, list[str]] = field(default_factory=dict)  # source -> the parameters only it informs
    independent: dict[str, list[str]] = field(default_factory=dict)  # such a source -> its points that do not read them
    dependent: dict[str, list[str]] = field(default_factory=dict)  # such a source -> its points that do
    unscored: list[str] = field(default_factory=list)  # point ids not cross-validatable
    wrong_fits: list[str] = field(default_factory=list)  # scored point ids whose fit verdict came out wrong
    not_run: list[str] = field(default_factory=list)  # scored point ids the tool could not run
    moved: dict[str, float] = field(default_factory=dict)  # parameter -> spread over folds, above MOVED
    stale: str = ""  # why the recorded fits cannot be used (nothing is scored from them)
    refitted: int = 0  # folds predicted at refitted values

    @property
    def errors(self) -> list[float]:
        """|relative error| of every scored quantity, every source's."""
        return [e for errors in self.by_source.values() for e in errors]

    def stats(self) -> dict[str, Any]:
        return {
            **_spread(self.errors),
            "points": len(self.scored),
            "fit_wrong": self.wrong_fits,
            "cannot_run": self.not_run,
            "not_cross_validatable": len(self.unscored),
            "alone": self.alone,
            "independent_of_alone": {source: len(ids) for source, ids in self.independent.items()},
            "dependent_on_alone": {source: len(ids) for source, ids in self.dependent.items()},
            "not_identified": self.moved,
            "refitted_folds": self.refitted,
            "stale": self.stale or None,
            "by_source": {source: _spread(errors) for source, errors in self.by_source.items()},
        }


@dataclass
class CrossValidation:
    targets: dict[str, TargetCv]

    def to_dict(self) -> dict[str, Any]:
        return {t: cv.stats() for t, cv in self.targets.items()}

    def format_table(self) -> str:
        lines = [
            f"{'target':8s} {'compared':>8s} {'points':>6s} {'median|e|':>9s} {'worst|e|':>9s} "
            f"{'fit bad':>7s} {'refits':>6s} {'not cv':>6s}  (leave one source out: each source predicted "
            f"by the parameters refitted without it)"
        ]
        notes = []
        for target, cv in self.targets.items():
            s = cv.stats()
            lines.append(
                f"{target:8s} {s['compared']:8d} {s['points']:6d} {percent(s['median_abs_error']):>9s} "
                f"{percent(s['worst_abs_error']):>9s} {len(cv.wrong_fits):7d} {cv.refitted:6d} {len(cv.unscored):6d}"
            )
            if cv.stale:
                notes.append(f"  {target}: {cv.stale}")
            if cv.wrong_fits:
                notes.append(f"  {target}: fit verdict wrong without its source: {', '.join(cv.wrong_fits)}")
            if cv.not_run:
                notes.append(f"  {target}: could not run without its source: {', '.join(cv.not_run)}")
            for source, params in cv.alone.items():
                free, bound = len(cv.independent[source]), len(cv.dependent[source])
                head = f"  {target}: only {source} informs {', '.join(params)}"
                if free:
                    notes.append(
                        f"{head}: {bound} of its points depend on what it informs (not cross-validatable), "
                        f"{free} do not (scored)"
                    )
                else:
                    every = "its one point depends" if bound == 1 else f"all {bound} of its points depend"
                    notes.append(f"{head}: not cross-validatable, {every} on what it informs")
            for param, spread in cv.moved.items():
                notes.append(f"  {target}: {param} not identified: its fold values span {spread:.0%} (> {MOVED:.0%})")
            if len(cv.by_source) > 1:  # which source a target's errors come from
                parts = [
                    f"{source} {s['compared']}: {percent(s['median_abs_error'])} / {percent(s['worst_abs_error'])}"
                    for source, s in sorted(s["by_source"].items(), key=lambda item: -item[1]["worst_abs_error"])
                ]
                notes.append(f"  {target} by source (compared: median / worst): {'; '.join(parts)}")
        return "\n".join(lines + notes)


def validate_points(
    points: Sequence[Point],
    *,
    bundled: bool,
    target: str | None = None,
    cache_dir: str | Path | None = None,
    say: Callable[[str], None] | None = None,
    bar: Any = None,
) -> Validation:
    """`dabench-ir validate`'s answer, as the CLI and the API give it: ``points`` predicted and
    compared (`run_validation`), then, when they are the ``bundled`` catalogue's, cross-validated
    (the folds are the bundled catalogue's sources; a user's catalogue has none recorded)."""
    result = run_validation(points, target=target, cache_dir=cache_dir, say=say, bar=bar)
    if bundled:
        if say is not None:
            say("cross-validating: each source's points at the parameters fitted without it")
        result.cross_validation = cross_validate(result)
    return result


def _spread(errors: Sequence[float]) -> dict[str, Any]:
    """How many ``errors`` and their median and worst (None for none)."""
    return {
        "compared": len(errors),
        "median_abs_error": statistics.median(errors) if errors else None,
        "worst_abs_error": max(errors) if errors else None,
    }


def cross_validate(validation: Validation) -> CrossValidation:
    """The cross-validated errors of every target ``validation`` ran bundled catalogue points of:
    the points of sources nothing was fitted to from ``validation`` (the file's values), the others
    predicted live at their fold's recorded values. The folds are the whole bundled catalogue's."""
    from dabench_ir.validate.catalog import load_catalog

    catalogue = load_catalog()
    record = load_record()
    results = {r.point.id: r for r in validation.results if r.point.kind != "host"}
    by_id = {p.id: p for p in catalogue}
    out: dict[str, TargetCv] = {}
    for target in dict.fromkeys(_target(r.point.target).name for r in results.values()):
        cv = out[target] = TargetCv(target)
        folds = folds_of(target, catalogue)
        recorded = record.get(target)
        fits = {f["source"]: f for f in recorded["folds"]} if recorded else {}
        if any(f.needs_fit for f in folds):
            if recorded is None:
                cv.stale = f"no fold fits recorded: run scripts/refit.py --cross-validate {target}"
            elif recorded["inputs"] != inputs_key(target, catalogue):
                cv.stale = (
                    f"the fold fits of {recorded['date']} were made on other parameters or points: "
                    f"rerun scripts/refit.py --cross-validate {target}"
                )
        for fold in folds:
            ran = [i for i in fold.points if i in results]
            if not ran:
                continue
            if fold.alone:
                cv.alone[fold.source] = list(fold.alone)
                free = independent(target, fold.informed, [results[i] for i in ran])
                cv.independent[fold.source] = [i for i in ran if i in free]
                cv.dependent[fold.source] = [i for i in ran if i not in free]
                cv.unscored += cv.dependent[fold.source]
                predicted = [results[i] for i in ran if i in free]
            elif not fold.needs_fit:
                predicted = [results[i] for i in ran]
            elif cv.stale or fold.source not in fits:
                cv.unscored += ran
                continue
            else:
                (predicted,) = _predict(target, [by_id[i] for i in ran], fits[fold.source]["values"])
                cv.refitted += 1
            for r in predicted:
                errors = [abs(e) for e in counts(r)]  # of another chip generation's point, its ratios only
                if r.point.reference_only and not errors:
                    continue
                cv.scored.append(r.point.id)
                if r.status != "ok":
                    cv.not_run.append(r.point.id)
                elif r.fit_verdict == "wrong":  # no figure, and the verdict is the prediction that failed
                    cv.wrong_fits.append(r.point.id)
                if errors:
                    cv.by_source.setdefault(fold.source, []).extend(errors)
        cv.moved = _moved(target, fits.values()) if not cv.stale else {}
    return CrossValidation(out)


def independent(target: str, params: Sequence[str], results: Sequence[PointResult]) -> set[str]:
    """The ids of ``results`` (of ``target``'s catalogue points, validated at the file's values)
    whose predictions do not depend on ``params``: every predicted quantity, the fit verdict and
    the status the same with all of ``params`` moved down and up (`PERTURB`). A point a parameter
    was fitted to is never independent of it, and is not run again; nor is any point while one of
    ``params`` is 0, which no factor moves."""
    quantities = dict(_target(target).quantities())
    values = {name: quantities[name].value for name in params}
    candidates = [r for r in results if not any(quantities[name].fitted_on(r.point.id) for name in params)]
    if not candidates or 0 in values.values():  # a factor cannot move a parameter at 0: none is shown free
        return set()
    moved = [
        {name: value * factor ** (1 + k / 10) for k, (name, value) in enumerate(values.items())} for factor in PERTURB
    ]
    runs = _predict(target, [r.point for r in candidates], *moved)
    return {r.point.id for r, *others in zip(candidates, *runs, strict=True) if all(_same(r, o) for o in others)}


def _same(a: PointResult, b: PointResult) -> bool:
    """Whether two validations of one point predict the same: status, fit and every quantity."""
    if (a.status, a.fits_predicted, len(a.quantities)) != (b.status, b.fits_predicted, len(b.quantities)):
        return False
    return all(
        (x.predicted is None) == (y.predicted is None)
        and (x.predicted is None or math.isclose(x.predicted, y.predicted, rel_tol=1e-9))
        for x, y in zip(a.quantities, b.quantities, strict=True)
    )


def _predict(target: str, points: list[Point], *trials: dict[str, float]) -> list[list[PointResult]]:
    """``points`` validated against ``target``'s file with each of ``trials``' values in turn, in
    one validation (the points of every trial share their graphs): one result list per trial."""
    from dabench_ir.targets import builtin_target_paths

    text = builtin_target_paths()[target].read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="dabench-crossval-") as scratch:
        files = [Path(scratch) / f"{k}" / f"{target}.toml" for k in range(len(trials))]
        for file, values in zip(files, trials, strict=True):
            file.parent.mkdir()
            file.write_text(with_values(text, values), encoding="utf-8")
        results = run_validation([replace(p, target=str(file)) for file in files for p in points]).results
    return [results[k * len(points) : (k + 1) * len(points)] for k in range(len(trials))]


def _moved(target: str, folds: Any) -> dict[str, float]:
    """Parameters whose fold values and file value span more than `MOVED`."""
    quantities = dict(_target(target).quantities())
    seen: dict[str, list[float]] = {}
    for fold in folds:
        for param, value in fold["values"].items():
            seen.setdefault(param, [quantities[param].value]).append(value)
    spread = {p: max(v) / min(v) - 1 if min(v) > 0 else math.inf for p, v in seen.items() if max(v) > 0}
    return {p: s for p, s in spread.items() if s > MOVED}
