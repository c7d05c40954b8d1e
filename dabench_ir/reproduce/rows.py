"""Rows of a study's results: selectors that pick them, the figures read from them, groups and reducers.

A row is what the sweep tabulates for one point (`dabench_ir.sweep.record_row`): the point's
parameters, then its status and metrics. A *selector* is a table of parameter -> wanted value;
a row matches when every parameter matches: a plain value (or a list, for list-valued
parameters such as ``layers_per_ipu``) is compared for equality, a table states a condition
(``{ min = 12 }``, ``{ max = 48 }``, ``{ in = [768, 1024] }``, ``{ not = "O0" }``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.schema import FINITE, check, finite_float, is_number
from dabench_ir.sweep.results import LABEL_COLUMNS, METRIC_COLUMNS

__all__ = [
    "CONDITIONS",
    "METRICS",
    "REDUCERS",
    "Unmet",
    "axis_sort_key",
    "check_selector",
    "group_label",
    "label_sort_key",
    "matches",
    "metric_value",
    "point_label",
    "select",
    "usable",
]

Row = Mapping[str, Any]

CONDITIONS = ("min", "max", "in", "not")
"""The keys a selector's table value may use."""

METRICS: tuple[str, ...] = tuple(c for c in METRIC_COLUMNS if c not in LABEL_COLUMNS)
"""The numeric columns of a sweep's results table (`dabench_ir.sweep.results.METRIC_COLUMNS`): what a finding reads."""


def _p90(values: Sequence[float]) -> float:
    """The 90th percentile, nearest rank: nine figures in ten are at or below it ("rarely above")."""
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


REDUCERS: dict[str, Callable[[Sequence[float]], float]] = {
    "max": max,
    "min": min,
    "mean": statistics.fmean,
    "median": statistics.median,
    "p90": _p90,
}
"""How several figures become one."""


class Unmet(Exception):
    """A finding cannot be evaluated: a row it needs is missing, failed or did not fit.

    The message is the reason shown beside the finding; evaluation never lets it escape.
    """


def _norm(value: Any) -> Any:
    """Tuples as lists, so a parameter read back from JSON compares equal to its TOML value."""
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    return value


def _match_one(have: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        if have is None:
            return False
        if "min" in want and not (is_number(have) and have >= want["min"]):
            return False
        if "max" in want and not (is_number(have) and have <= want["max"]):
            return False
        if "in" in want and _norm(have) not in [_norm(v) for v in want["in"]]:
            return False
        return not ("not" in want and _norm(have) == _norm(want["not"]))
    return _norm(have) == _norm(want)


def matches(row: Row, selector: Mapping[str, Any] | None) -> bool:
    """True when ``row`` (a results row or a point's parameters) meets every condition of ``selector``."""
    return all(_match_one(row.get(name), want) for name, want in (selector or {}).items())


def select(rows: Iterable[Row], *selectors: Mapping[str, Any] | None) -> list[Row]:
    """The rows matching every selector given."""
    return [r for r in rows if all(matches(r, s) for s in selectors)]


def check_selector(value: Any, where: str) -> dict[str, Any]:
    """A selector as written in a study file, checked for shape (names are checked against the
    experiment by the study loader); a bad one is a UserError naming ``where``."""
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: expected a table of parameter = value, got {value!r}")
    for name, want in value.items():
        if isinstance(want, Mapping):
            unknown = set(want) - set(CONDITIONS)
            if unknown or not want:
                raise UserError(f"{where}: {name} = {dict(want)!r}: a condition table takes {', '.join(CONDITIONS)}")
            for bound in ("min", "max"):
                if bound in want:
                    check(want[bound], FINITE, f"{where}: {name}.{bound}")
            if "min" in want and "max" in want and want["min"] > want["max"]:
                raise UserError(
                    f"{where}: {name} = {dict(want)!r}: the range is reversed (min > max); no point lies in it"
                )
            if "in" in want and (not isinstance(want["in"], list) or not want["in"]):
                raise UserError(f"{where}: {name}.in must be a non-empty list of values, got {want['in']!r}")
    return dict(value)


def point_label(row: Row) -> str:
    """A row's point as a short name (``gpt2 L12 h768 rdu O1 b16 mixed``), for reasons."""
    from dabench_ir.sweep.spec import Point

    return Point(dict(row)).label()


def metric_value(row: Row, metric: str) -> float | None:
    """The row's figure ``metric`` as a finite float, else None."""
    return finite_float(row.get(metric))


def usable(row: Row, metric: str | None = None) -> str | None:
    """Why ``row`` cannot give a figure (failed, does not fit, no ``metric``), or None when it can."""
    if row.get("status") != "ok":
        return f"point {point_label(row)} failed: {row.get('error') or 'no result'}"
    if row.get("fits") is False:
        reason = " ".join(str(row.get("failure_reason") or "does not fit").split())
        return f"point {point_label(row)} does not fit: {reason}"
    if metric is not None and metric_value(row, metric) is None:
        return f"point {point_label(row)} has no {metric}"
    return None


def group_label(row: Row, group: str | Sequence[str]) -> str:
    """The row's group: the value of ``group`` (a parameter), or the values of several joined (``rdu O3``)."""
    names = [group] if isinstance(group, str) else list(group)
    return " ".join(str(row[n]) for n in names if row.get(n) is not None)


def axis_sort_key(value: Any) -> tuple[int, Any]:
    """Numbers in order, anything else after them by its text."""
    return (0, value) if is_number(value) else (1, str(value))


def label_sort_key(label: str) -> tuple[tuple[int, Any], ...]:
    """Group labels in natural order: ``hidden 768`` before ``hidden 1024``, ``rdu O1`` before ``rdu O3``."""
    parts = []
    for token in str(label).split():
        try:
            parts.append((0, float(token)))
        except ValueError:
            parts.append((1, token))
    return tuple(parts)
