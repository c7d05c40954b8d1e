"""What validating a point found: quantities, point results, and the per-target statistics.

``Validation`` holds every point's result; its summary and text table are what
`dabench-ir validate` prints.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from dabench_ir.report.table import percent
from dabench_ir.validate.catalog import HEADLINE, Point

__all__ = ["CannotRun", "PointResult", "Quantity", "Validation"]


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
    informed: tuple[str, ...] = ()
    """The target parameters fitted to this point (their ``fitted_to`` names it): none, and the
    point is out of sample."""

    @property
    def in_sample(self) -> bool:
        return bool(self.informed)

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
            "id": p.id,
            "target": p.target,
            "kind": p.kind,
            "status": self.status,
            "reason": self.reason,
            "reference_only": p.reference_only,
            "fits_expected": self.fits_expected,
            "fits_predicted": self.fits_predicted,
            "fit_verdict": self.fit_verdict,
            "ignored": ";".join(self.ignored),
            "source": p.source,
            "in_sample": self.in_sample,
            "informed": ";".join(self.informed),
        }
        if self.host:  # live host points: per-node errors and the measured noise
            base["host"] = dict(self.host)
        out = []
        for q in self.quantities:
            out.append(
                {
                    **base,
                    "quantity": q.name,
                    "measured": q.measured,
                    "predicted": q.predicted,
                    "rel_error": q.error,
                    "note": q.note,
                }
            )
        if not out:
            out.append({**base, "quantity": None, "measured": None, "predicted": None, "rel_error": None, "note": ""})
        return out


@dataclass
class Validation:
    """All point results, with per-target statistics."""

    results: list[PointResult]
    seconds: float = 0.0
    cross_validation: Any = None
    """The leave-one-source-out errors (`crossval.CrossValidation`), when computed: the figure to trust."""

    def rows(self) -> list[dict[str, Any]]:
        return [row for r in self.results for row in r.rows()]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per target: points, ran, cannot run, fit right/wrong, not predicted, and |error| statistics.

        ``median_abs_error``/``worst_abs_error`` over every compared quantity;
        ``*_throughput`` over samples/s only. Reference-only points are left out. The same
        statistics of the points some parameter was fitted to (its ``fitted_to`` in the target file)
        and of the rest are under ``in_sample`` and ``out_of_sample``.
        """
        out: dict[str, dict[str, Any]] = {}
        for r in self.results:
            s = out.setdefault(
                r.point.target,
                {
                    "points": 0,
                    "ran": 0,
                    "cannot_run": 0,
                    "reference_only": 0,
                    "fit_right": 0,
                    "fit_wrong": 0,
                    "not_predicted": 0,
                    "_all": [],
                    "_tp": [],
                    "_groups": {"in_sample": ([], []), "out_of_sample": ([], [])},
                },
            )
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
            group = s["_groups"]["in_sample" if r.in_sample else "out_of_sample"]
            for q in r.quantities:
                if q.error is not None:
                    s["_all"].append(abs(q.error))
                    group[0].append(abs(q.error))
                    if q.name == HEADLINE:
                        s["_tp"].append(abs(q.error))
                        group[1].append(abs(q.error))
                elif q.note.startswith("not predicted"):
                    s["not_predicted"] += 1
        for s in out.values():
            s.update(_stats(s.pop("_all"), s.pop("_tp")))
            for name, (errs, tp) in s.pop("_groups").items():
                s[name] = _stats(errs, tp)
        return out

    def to_dict(self) -> dict[str, Any]:
        cv = None if self.cross_validation is None else self.cross_validation.to_dict()
        return {
            "schema": "dabench-ir/validation/v1",
            "seconds": self.seconds,
            "summary": self.summary(),
            "cross_validation": cv,
            "rows": self.rows(),
        }

    def format_table(self) -> str:
        """The text table: per point and quantity, then per target."""
        lines = [f"{'point':38s} {'quantity':30s} {'measured':>11s} {'predicted':>11s} {'error':>8s}  note"]
        for r in self.results:
            head = r.point.id + (" [ref]" if r.point.reference_only else "") + ("" if r.in_sample else " [out]")
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
        lines.append(
            f"{'target':8s} {'points':>6s} {'ran':>4s} {'n/run':>5s} {'ref':>4s} {'fit ok':>6s} "
            f"{'fit bad':>7s} {'n/pred':>6s} {'median|e|':>9s} {'worst|e|':>9s} {'tp med':>8s} {'tp worst':>8s}"
        )
        for target, s in self.summary().items():
            lines.append(
                f"{target:8s} {s['points']:6d} {s['ran']:4d} {s['cannot_run']:5d} {s['reference_only']:4d} "
                f"{s['fit_right']:6d} {s['fit_wrong']:7d} {s['not_predicted']:6d} {percent(s['median_abs_error']):>9s} "
                f"{percent(s['worst_abs_error']):>9s} {percent(s['median_abs_error_throughput']):>8s} "
                f"{percent(s['worst_abs_error_throughput']):>8s}"
            )
        lines.append("")
        lines.append(
            f"{'target':8s} {'sample':13s} {'compared':>8s} {'median|e|':>9s} {'worst|e|':>9s} "
            f"{'tp med':>8s} {'tp worst':>8s}   (in sample: a parameter's fitted_to names the point)"
        )
        for target, s in self.summary().items():
            for name in ("in_sample", "out_of_sample"):
                g = s[name]
                lines.append(
                    f"{target:8s} {name.replace('_', ' '):13s} {g['compared']:8d} {percent(g['median_abs_error']):>9s} "
                    f"{percent(g['worst_abs_error']):>9s} {percent(g['median_abs_error_throughput']):>8s} "
                    f"{percent(g['worst_abs_error_throughput']):>8s}"
                )
        if self.cross_validation is not None:
            lines += [
                "",
                "cross-validated: the figure to trust for runs the models were not built on",
                self.cross_validation.format_table(),
            ]
        return "\n".join(lines)


def _stats(errs: list[float], tp: list[float]) -> dict[str, Any]:
    return {
        "compared": len(errs),
        "median_abs_error": statistics.median(errs) if errs else None,
        "worst_abs_error": max(errs) if errs else None,
        "median_abs_error_throughput": statistics.median(tp) if tp else None,
        "worst_abs_error_throughput": max(tp) if tp else None,
    }


def _yn(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


class CannotRun(Exception):
    """A point the tool cannot run, with the reason."""
