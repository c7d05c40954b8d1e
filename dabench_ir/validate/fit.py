"""Fitting target parameters to catalogue points: the least-squares log error, by golden section.

A target parameter with ``fitted_to`` (targets/*.toml) was fitted to the catalogue points it
names. `fit` refits such parameters to any set of points: it minimises the sum of squared log
errors, ``log(predicted / measured)``, over every quantity the points compare (throughput, step
time, section counts, PEs: whatever each point measures; of a reference-only point, measured on
another chip generation, only the dimensionless ones), by golden-section search per parameter,
coordinate by coordinate. A point that cannot run or does not fit at a trial value costs as a
10x error, so the fit stays where the points run. Each trial writes the target file with the
trial values into a scratch folder and validates the points against it.

Used by ``scripts/refit.py`` (one fit, its in- and out-of-sample errors) and by
`dabench_ir.validate.crossval` (a fit per left-out source).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from dabench_ir.validate.catalog import Point
from dabench_ir.validate.results import PointResult, Validation
from dabench_ir.validate.runner import run_validation

__all__ = ["FitError", "counts", "fit", "informed_by", "score", "with_values"]

MISS = math.log(10.0) ** 2
"""The loss of a point that cannot run or does not fit at a trial value: as a 10x error."""

_GOLDEN = (math.sqrt(5) - 1) / 2
_TRIALS = itertools.count()


class FitError(ValueError):
    """A parameter the fit cannot find or search (a user's mistake: named in one line)."""


def _locate(text: str, param: str) -> re.Match[str]:
    """The ``value = NUM`` of ``param`` (``section.key``, e.g. ``arch.pcu_efficiency``) in TOML ``text``."""
    section, _, key = param.rpartition(".")
    head = re.search(rf"^\[{re.escape(section)}\]\s*$", text, re.M)
    if not head:
        raise FitError(f"no [{section}] table in the target file (parameter {param})")
    nxt = re.search(r"^\[", text[head.end() :], re.M)
    end = head.end() + (nxt.start() if nxt else len(text) - head.end())
    m = re.compile(rf"^{re.escape(key)}\s*=\s*\{{\s*value\s*=\s*([-+0-9.eE_]+)", re.M).search(text, head.end(), end)
    if not m:
        raise FitError(f"no {key} = {{ value = ... }} in [{section}] (parameter {param})")
    return m


def with_values(text: str, values: Mapping[str, float]) -> str:
    """Target file ``text`` with each parameter's ``value`` replaced (6 significant digits)."""
    for param, value in values.items():
        m = _locate(text, param)
        text = text[: m.start(1)] + f"{value:.6g}" + text[m.end(1) :]
    return text


def counts(result: PointResult) -> list[float]:
    """The relative errors of ``result`` a fit and a cross-validation compare: all its quantities',
    but of a reference-only point (another chip generation) only the dimensionless ones (fraction
    of peak, ratios): its absolute figures measure that chip's clock, not this target's efficiency."""
    point = result.point
    return [
        q.error
        for q in result.quantities
        if q.error is not None and (not point.reference_only or "fraction" in q.name or "ratio" in q.name)
    ]


def score(points: list[Point], text: str, scratch: Path) -> tuple[float, Validation]:
    """Sum of squared log errors of ``points`` under target file ``text``, and their validation; a
    trial value the target file refuses (a share above 1) is infinitely bad."""
    from dabench_ir.errors import TargetError
    from dabench_ir.targets import load_target

    path = scratch / f"trial{next(_TRIALS)}.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_target(str(path))
    except TargetError:
        return math.inf, Validation([])
    result = run_validation([replace(p, target=str(path)) for p in points])
    loss = 0.0
    for r in result.results:
        errors = counts(r)
        if r.status != "ok" or (not errors and r.fit_verdict != "right"):
            loss += MISS
        loss += sum(math.log1p(e) ** 2 if e > -1 else MISS for e in errors)
    return loss, result


def _golden(f: Callable[[float], float], lo: float, hi: float, log: bool, steps: int) -> float:
    """The minimiser of ``f`` on [lo, hi] by golden-section search (on log scale when ``log``)."""
    to, back = (math.log, math.exp) if log else (float, float)
    a, b = to(lo), to(hi)
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(back(c)), f(back(d))
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(back(c))
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(back(d))
    return back((a + b) / 2)


def fit(
    points: list[Point],
    text: str,
    start: Mapping[str, float],
    scratch: Path,
    *,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    steps: int = 14,
    rounds: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """The values of the parameters ``start`` names (from their ``start`` values) that fit ``points``
    best under target file ``text``: golden-section search per parameter within its range (default
    a quarter to four times its start value), ``rounds`` rounds of coordinates when several."""
    ranges = ranges or {}
    values = dict(start)
    for _ in range(rounds if len(values) > 1 else 1):
        for param in values:
            v = values[param]
            lo, hi = ranges.get(param, (v / 4, v * 4))
            if param not in ranges and not lo < hi:
                raise FitError(f"{param} is {v:g}: give its search range (--range {param}=LO:HI)")
            if progress is not None:
                progress(f"fitting {param} to {len(points)} point(s)")

            def loss(x: float, param: str = param) -> float:
                return score(points, with_values(text, {**values, param: x}), scratch)[0]

            values[param] = _golden(loss, lo, hi, lo > 0, steps)
    return values


def informed_by(quantities: Iterable[tuple[str, object]], point_ids: Iterable[str]) -> list[str]:
    """The fitted parameters (of a target's ``quantities()``) whose ``fitted_to`` names one of ``point_ids``."""
    ids = list(point_ids)
    return [name for name, q in quantities if q.fitted and any(q.fitted_on(i) for i in ids)]  # type: ignore[attr-defined]
