"""Finding kinds: one registered evaluator per kind, ``(rows, finding) -> Outcome``.

A kind declares the fields a finding of it takes (with their types, checked when the study
is read), which are required, the band rule its figure is graded by (`bands.RULES`: the
study gives the paper's figure, the rule makes the band) and how its figure is shown by
default. Adding a kind is one decorated function::

    @finding_kind("ratio", fields={"numerator": ROW, "denominator": ROW, "minus_one": BOOL},
                  required={"numerator", "denominator"}, band="change", format="pct")
    def ratio(rows, finding) -> Outcome: ...

An evaluator raises `Unmet` (with the reason) when a row it needs is missing, failed or did
not fit; `evaluate` turns that into a "not reproduced" outcome, so no finding is ever dropped.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dabench_ir.reproduce.bands import DIRECTION_TOLERANCE, KNEE_LEVEL, MAJORITY, RANGE_SHARE, SHARE_METRICS
from dabench_ir.reproduce.rows import (
    REDUCERS,
    Unmet,
    axis_sort_key,
    group_label,
    label_sort_key,
    metric_value,
    point_label,
    select,
    usable,
)
from dabench_ir.timeline import Bound

if TYPE_CHECKING:
    from dabench_ir.reproduce.study import Finding

__all__ = [
    "BOUND_VALUES",
    "FORMATS",
    "KINDS",
    "Kind",
    "Outcome",
    "Unmet",
    "accept_text",
    "evaluate",
    "finding_kind",
    "format_value",
    "in_accept",
    "is_change",
    "labels",
]

logger = logging.getLogger(__name__)

Row = Mapping[str, Any]

# field types (checked by the study loader, `study._check_field`)
ROW = "row"  # a selector that, with `where`, picks exactly one point
GROUP_ROW = "group_row"  # a selector that, with `where`, picks exactly one point per group
SELECTOR = "selector"
PARAM = "param"  # one parameter name of the experiment
GROUP = "group"  # a parameter name, or a list of them
REDUCE = "reduce"  # max, min, mean, median
GROUP_REDUCE = "group_reduce"  # the same, or "any" (some group's figure lies in accept)
BOOL = "bool"
VALUE = "value"  # an axis value
LABELS = "labels"  # a group label or a list of them
DIRECTION = "direction"  # increasing, decreasing, flat
BOUND_OF = "bound_of"  # step (dominant_bound), nodes (node_bound) or roofline (roofline_bound)
TEXT = "text"
FORMAT = "format"  # one of FORMATS
LABEL_MAP = "label_map"  # a table of group label -> expected label
METRIC = "metric"  # a plot field: a results column (`rows.METRICS`)
POINTS = "points"  # a plot field: paper points [{x, y, panel?, series?}]
MAPPING = "mapping"  # a plot field: paper bars {label = value} or {series = {label = value}}

FORMATS = ("pct", "x", "num", "int", "label")
"""How a figure is shown: a percentage, a factor (1.99x), a number, an integer, a label."""


@dataclass(frozen=True)
class Outcome:
    """What a finding's evaluation found: the tool's figure, whether it reproduces the paper's,
    a detail line (the figures it came from) and, when not reproduced, why. ``text`` overrides
    how the figure is shown (e.g. a share with the range it spans)."""

    value: Any
    reproduced: bool
    detail: str = ""
    reason: str = ""
    text: str | None = None


@dataclass(frozen=True)
class Kind:
    """A registered finding kind (see `finding_kind`)."""

    name: str
    evaluate: Callable[[Sequence[Row], Finding], Outcome]
    fields: Mapping[str, str]
    required: frozenset[str]
    band: str | Callable[[Mapping[str, Any], str], str]
    format: str
    doc: str

    def rule(self, options: Mapping[str, Any], metric: str) -> str:
        """The band rule (`bands.RULES`) a finding of this kind, with these options, is graded by."""
        return self.band(options, metric) if callable(self.band) else self.band


KINDS: dict[str, Kind] = {}
"""Every finding kind, by name."""


def finding_kind(
    name: str,
    *,
    fields: Mapping[str, str] | None = None,
    required: set[str] | frozenset[str] = frozenset(),
    band: str | Callable[[Mapping[str, Any], str], str],
    format: str = "num",
) -> Callable[[Callable[[Sequence[Row], Finding], Outcome]], Callable[[Sequence[Row], Finding], Outcome]]:
    """Register an evaluator for findings of kind ``name`` (its docstring's first line documents
    it), graded by the band rule ``band`` (a `bands.RULES` name, or a function of the finding's
    options and metric giving one)."""

    def register(fn: Callable[[Sequence[Row], Finding], Outcome]) -> Callable[[Sequence[Row], Finding], Outcome]:
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        KINDS[name] = Kind(
            name=name,
            evaluate=fn,
            fields=dict(fields or {}),
            required=frozenset(required),
            band=band,
            format=format,
            doc=doc,
        )
        return fn

    return register


# -- shown values ------------------------------------------------------------------------------
def format_value(value: Any, fmt: str, *, signed: bool = False) -> str:
    """``value`` as the finding's ``format`` shows it (``+10.7%``, ``1.99x``, ``72``, ``ipu``)."""
    from dabench_ir.report.table import percent, times

    if value is None:
        return "-"
    if fmt == "label" or isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    v = float(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if fmt == "pct":
        return ("+" if signed and v > 0 else "") + percent(v)
    if fmt == "x":
        return times(v)
    if fmt == "int":
        return str(round(v))
    return f"{v:.4g}"


def in_accept(value: float | None, accept: tuple[float, float] | None) -> bool:
    """True when ``value`` lies in the closed range ``accept``."""
    return value is not None and accept is not None and accept[0] <= value <= accept[1]


def accept_text(accept: tuple[float, float] | None, fmt: str) -> str:
    """``[0.0%, 25.0%]``, ``>= 1.60x``, ``<= 1.15x``."""
    if accept is None:
        return "-"
    lo, hi = accept
    if math.isinf(hi) and not math.isinf(lo):
        return f">= {format_value(lo, fmt)}"
    if math.isinf(lo) and not math.isinf(hi):
        return f"<= {format_value(hi, fmt)}"
    return f"[{format_value(lo, fmt)}, {format_value(hi, fmt)}]"


def _selector_text(selector: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k} = {v}" for k, v in (selector or {}).items()) or "any"


def _fmt(f: Finding, value: Any) -> str:
    return format_value(value, f.format)


# -- evaluation ---------------------------------------------------------------------------------
def evaluate(rows: Sequence[Row], finding: Finding) -> Outcome:
    """Evaluate ``finding`` on its experiment's ``rows``; never raises for missing or failed rows
    (the outcome is "not reproduced" with the reason)."""
    kind = KINDS[finding.kind]
    try:
        outcome = kind.evaluate(rows, finding)
    except Unmet as exc:
        return Outcome(None, False, reason=str(exc))
    except (ArithmeticError, ValueError) as exc:
        logger.debug("finding %s: evaluation failed", finding.id, exc_info=True)
        return Outcome(None, False, reason=f"cannot evaluate: {exc}")
    if not outcome.reproduced and not outcome.reason:
        shown = outcome.text or format_value(outcome.value, finding.format, signed=is_change(finding))
        if finding.accept is not None and isinstance(outcome.value, (int, float)):
            lo, hi = finding.accept
            wanted = accept_text(finding.accept, finding.format)
            one_sided = math.isinf(lo) != math.isinf(hi)
            reason = f"tool {shown}, not {wanted}" if one_sided else f"tool {shown} outside {wanted}"
        else:
            reason = f"tool {shown}"
        outcome = Outcome(
            value=outcome.value, reproduced=False, detail=outcome.detail, reason=reason, text=outcome.text
        )
    return outcome


def is_change(f: Finding) -> bool:
    """True when the finding's figure is a relative change, shown with its sign (``+10.7%``)."""
    if f.kind == "trend":
        return True
    return bool(f.options.get("minus_one", f.kind in ("ratio", "argmax", "argmin")))


def _one(
    rows: Sequence[Row], f: Finding, selector: Mapping[str, Any] | None, what: str, *, where: bool = True
) -> tuple[Row, float]:
    """The one row ``where`` (unless not ``where``) and ``selector`` pick, and its metric; Unmet when it is
    missing or unusable."""
    base = f.where if where else {}
    found = select(rows, base, selector)
    if not found:
        raise Unmet(f"no result for the {what} point ({_selector_text({**base, **(selector or {})})})")
    if len(found) > 1:
        raise Unmet(f"{len(found)} results match the {what} point ({_selector_text(selector)}); narrow it")
    why = usable(found[0], f.metric)
    if why:
        raise Unmet(why)
    return found[0], metric_value(found[0], f.metric)  # type: ignore[return-value]


def _ratio(a: float, b: float, f: Finding, minus_one: bool) -> float:
    if b == 0:
        raise Unmet(f"the denominator's {f.metric} is 0")
    return a / b - (1.0 if minus_one else 0.0)


def _usable_rows(rows: Sequence[Row], f: Finding) -> tuple[list[Row], list[str]]:
    """Rows ``where`` picks that give the metric, and why the others do not."""
    ok, why = [], []
    for r in select(rows, f.where):
        reason = usable(r, f.metric)
        (why if reason else ok).append(reason or r)
    return ok, why  # type: ignore[return-value]


def _skipped(why: list[str]) -> str:
    if not why:
        return ""
    return f"; {len(why)} point(s) left out (e.g. {why[0]})"


def _change_or_factor(options: Mapping[str, Any], default_minus_one: bool) -> str:
    return "change" if options.get("minus_one", default_minus_one) else "factor"


@finding_kind(
    "ratio",
    fields={"numerator": ROW, "denominator": ROW, "minus_one": BOOL, "expect": DIRECTION},
    required={"numerator", "denominator"},
    band=lambda o, _m: _change_or_factor(o, True),
    format="pct",
)
def ratio(rows: Sequence[Row], f: Finding) -> Outcome:
    """metric(numerator) / metric(denominator) - 1 (a plain ratio with ``minus_one = false``);
    ``expect`` (increasing, decreasing, flat) where the paper gives no number."""
    minus_one = f.options.get("minus_one", True)
    _, a = _one(rows, f, f.options["numerator"], "numerator")
    _, b = _one(rows, f, f.options["denominator"], "denominator")
    value = _ratio(a, b, f, minus_one)
    return Outcome(value, in_accept(value, f.accept), f"{f.metric} {a:.4g} / {b:.4g}")


def _share_or_relative(_options: Mapping[str, Any], metric: str) -> str:
    return "share" if metric in SHARE_METRICS else "relative"


@finding_kind("value", fields={"select": ROW, "reduce": REDUCE}, band=_share_or_relative)
def value(rows: Sequence[Row], f: Finding) -> Outcome:
    """metric of one selected row, or ``reduce`` (max, min, mean, median, p90) over every row ``where`` picks."""
    reduce = f.options.get("reduce")
    if reduce is None:
        row, v = _one(rows, f, f.options.get("select"), "selected")
        return Outcome(v, in_accept(v, f.accept), f"{f.metric} of {point_label(row)}")
    ok, why = _usable_rows(rows, f)
    if not ok:
        raise Unmet(why[0] if why else f"no point matches where ({_selector_text(f.where)})")
    values = [metric_value(r, f.metric) for r in ok]
    v = REDUCERS[reduce](values)  # type: ignore[arg-type]
    detail = f"{reduce} {f.metric} over {len(ok)} point(s){_skipped(why)}"
    return Outcome(v, in_accept(v, f.accept), detail)


@finding_kind("range", band=_share_or_relative, format="pct")
def range_(rows: Sequence[Row], f: Finding) -> Outcome:
    """Share of the rows ``where`` picks whose metric lies in the band; reproduced when it is at
    least `bands.RANGE_SHARE` (the claim holds over the sweep)."""
    ok, why = _usable_rows(rows, f)
    if not ok:
        raise Unmet(why[0] if why else f"no point matches where ({_selector_text(f.where)})")
    values = [metric_value(r, f.metric) for r in ok]
    inside = [v for v in values if in_accept(v, f.accept)]
    share = len(inside) / len(values)
    threshold = RANGE_SHARE
    from dabench_ir.report.table import percent

    lo, hi = min(values), max(values)  # type: ignore[type-var]
    span = f"{_fmt(f, lo)}-{_fmt(f, hi)}" if lo != hi else _fmt(f, lo)
    text = f"{percent(share)} in range ({span})"
    detail = f"{len(inside)} of {len(values)} point(s) have {f.metric} in {accept_text(f.accept, f.format)}"
    detail += _skipped(why)
    reproduced = share >= threshold
    reason = (
        ""
        if reproduced
        else (
            f"{percent(share)} of {len(values)} point(s) have {f.metric} in {accept_text(f.accept, f.format)} "
            f"(range {span}), below the {percent(threshold)} asked"
        )
    )
    return Outcome(value=share, reproduced=reproduced, detail=detail, reason=reason, text=text)


# -- along an axis: curve, trend, fit_limit ----------------------------------------------------
def _series(rows: Sequence[Row], f: Finding) -> dict[str, list[tuple[Any, Row]]]:
    """The rows ``where`` picks, per group (one group without ``group``), sorted along ``axis``."""
    axis = f.options["axis"]
    group = f.options.get("group")
    out: dict[str, list[tuple[Any, Row]]] = defaultdict(list)
    for r in select(rows, f.where):
        out[group_label(r, group) if group else ""].append((r.get(axis), r))
    ordered = sorted(out.items(), key=lambda kv: label_sort_key(kv[0]))
    return {g: sorted(pts, key=lambda p: axis_sort_key(p[0])) for g, pts in ordered}


def _group_name(f: Finding, label: str) -> str:
    group = f.options.get("group")
    return f"{group}={label}" if isinstance(group, str) else label


def _figure(f: Finding, axis_value: Any, row: Row) -> float:
    why = usable(row, f.metric)
    if why:
        raise Unmet(why)
    v = metric_value(row, f.metric)
    if f.options.get("per_axis"):
        v = v / float(axis_value)  # type: ignore[operator]
    return v  # type: ignore[return-value]


def _combine(values: dict[str, float], f: Finding, notes: list[str], default: str = "min") -> Outcome:
    """One figure from per-group figures: the group's own without ``group``, else ``reduce``
    (``any``: reproduced when some group's figure lies in ``accept``)."""
    if not f.options.get("group"):
        (v,) = values.values()
        return Outcome(v, in_accept(v, f.accept), "; ".join(notes))
    shown = ", ".join(f"{_group_name(f, g)}: {_fmt(f, v)}" for g, v in values.items())
    detail = "; ".join([shown, *notes])
    if not values:
        raise Unmet("; ".join(notes) or "no group has a figure")
    reduce = f.options.get("reduce", default)
    if reduce == "any":
        inside = [g for g, v in values.items() if in_accept(v, f.accept)]
        if inside:
            return Outcome(values[inside[0]], True, f"{_group_name(f, inside[0])}; {detail}")
        lo, hi = f.accept  # type: ignore[misc]
        closest = min(values, key=lambda g: max(lo - values[g], values[g] - hi))
        return Outcome(
            value=values[closest],
            reproduced=False,
            detail=detail,
            reason=f"no group in {accept_text(f.accept, f.format)} ({shown})",
        )
    v = REDUCERS[reduce](list(values.values()))
    return Outcome(v, in_accept(v, f.accept), f"{reduce} over {detail}")


_CURVE_FIELDS = {
    "axis": PARAM,
    "from": VALUE,
    "to": VALUE,
    "minus_one": BOOL,
    "per_axis": BOOL,
    "group": GROUP,
    "reduce": GROUP_REDUCE,
    "scaling": BOOL,
    "expect": DIRECTION,
}


def _curve_rule(options: Mapping[str, Any], _metric: str) -> str:
    return "scaling" if options.get("scaling") else _change_or_factor(options, False)


@finding_kind("curve", fields=_CURVE_FIELDS, required={"axis"}, band=_curve_rule, format="x")
def curve(rows: Sequence[Row], f: Finding) -> Outcome:
    """Along ``axis``: metric at ``to`` (default the last point) / metric at ``from`` (default the
    first); with ``scaling``, that gain over the linear one, ``(m_to / m_from - 1) / (to / from - 1)``
    (1 near-linear, 0 flat)."""
    axis = f.options["axis"]
    values: dict[str, float] = {}
    notes: list[str] = []
    for g, pts in _series(rows, f).items():
        at = dict(pts)  # one point per axis value: the study loader checks it
        start, end = f.options.get("from", pts[0][0]), f.options.get("to", pts[-1][0])
        try:
            if start not in at or end not in at:
                missing = start if start not in at else end
                raise Unmet(f"no result at {axis} = {missing}")
            a, b = _figure(f, start, at[start]), _figure(f, end, at[end])
            values[g] = _ratio(b, a, f, bool(f.options.get("minus_one", False) or f.options.get("scaling")))
            if f.options.get("scaling"):
                values[g] /= float(end) / float(start) - 1.0
        except Unmet as exc:
            if f.options.get("reduce") != "any" or not f.options.get("group"):
                raise Unmet(f"{_group_name(f, g)}: {exc}" if g else str(exc)) from None
            notes.append(f"{_group_name(f, g)}: {exc}")
            continue
        if not f.options.get("group"):
            notes.append(f"{axis} {start} -> {end}: {f.metric} {a:.4g} -> {b:.4g}")
    return _combine(values, f, notes)


_TREND_FIELDS = {"axis": PARAM, "expect": DIRECTION, "per_axis": BOOL, "group": GROUP}


@finding_kind("trend", fields=_TREND_FIELDS, required={"axis", "expect"}, band="direction", format="pct")
def trend(rows: Sequence[Row], f: Finding) -> Outcome:
    """Along ``axis``: ``expect`` decreasing, increasing or flat (direction only); the figure is
    the relative change first -> last. Reproduced when that change goes the ``expect`` way by
    more than `bands.DIRECTION_TOLERANCE` and `bands.RANGE_SHARE` of the steps do (a step within
    the tolerance counts either way)."""
    from dabench_ir.report.table import percent

    axis, expect = f.options["axis"], f.options["expect"]
    tol = DIRECTION_TOLERANCE
    threshold = RANGE_SHARE
    step_ok = {"decreasing": lambda r: r <= tol, "increasing": lambda r: r >= -tol, "flat": lambda r: abs(r) <= tol}
    overall_ok = {"decreasing": lambda c: c < -tol, "increasing": lambda c: c > tol, "flat": lambda c: abs(c) <= tol}
    changes: dict[str, float] = {}
    steps: list[float] = []
    notes: list[str] = []
    for g, pts in _series(rows, f).items():
        good, why = [], []
        for a, r in pts:
            reason = usable(r, f.metric)
            if reason:
                why.append(reason)
            else:
                good.append(_figure(f, a, r))
        name = f"{_group_name(f, g)}: " if g else ""
        if len(good) < 2:
            raise Unmet(f"{name}{len(good)} usable point(s) along {axis}, 2 needed" + (f" ({why[0]})" if why else ""))
        if why:
            notes.append(f"{name}{len(why)} point(s) left out (e.g. {why[0]})")
        steps += [_ratio(b, a, f, True) for a, b in itertools.pairwise(good)]
        changes[g] = _ratio(good[-1], good[0], f, True)
    v = statistics.median(changes.values())
    ok_steps = sum(1 for r in steps if step_ok[expect](r))
    share = ok_steps / len(steps)
    failing = [g for g, c in changes.items() if not overall_ok[expect](c)]
    reproduced = share >= threshold and not failing and (f.accept is None or in_accept(v, f.accept))
    first_last = ", ".join(
        f"{_group_name(f, g) + ' ' if g else ''}{format_value(c, 'pct', signed=True)}" for g, c in changes.items()
    )
    detail = f"{ok_steps} of {len(steps)} step(s) {expect} (tolerance {percent(tol)}); first -> last {first_last}"
    detail = "; ".join([detail, *notes])
    reason = ""
    if not reproduced:
        if failing:
            reason = f"not {expect} from first to last {axis}: {first_last}"
        elif share < threshold:
            reason = f"only {ok_steps} of {len(steps)} step(s) along {axis} {expect}, {percent(threshold)} asked"
    return Outcome(value=v, reproduced=reproduced, detail=detail, reason=reason)


@finding_kind(
    "fit_limit",
    fields={"axis": PARAM, "group": GROUP, "reduce": GROUP_REDUCE},
    required={"axis"},
    band="limit",
    format="int",
)
def fit_limit(rows: Sequence[Row], f: Finding) -> Outcome:
    """Along ``axis``: the largest axis value whose point fits (0 when none does); ``group`` + ``reduce`` over groups."""
    axis = f.options["axis"]
    limits: dict[str, float] = {}
    notes: list[str] = []
    for g, pts in _series(rows, f).items():
        name = f"{_group_name(f, g)}: " if g else ""
        failed = [r for _, r in pts if r.get("status") != "ok"]
        known = [(a, r) for a, r in pts if r.get("status") == "ok" and r.get("fits") is not None]
        if not known:
            raise Unmet(f"{name}no point along {axis} has a result" + (f" ({usable(failed[0])})" if failed else ""))
        fitting = [a for a, r in known if r.get("fits") is True]
        limits[g] = float(max(fitting)) if fitting else 0.0
        if len(fitting) == len(known):
            notes.append(f"{name}every point fits (limit >= {known[-1][0]})")
        elif not fitting:
            notes.append(f"{name}no point fits (not even {axis} = {known[0][0]})")
        if failed:
            notes.append(f"{name}{len(failed)} failed point(s) left out ({usable(failed[0])})")
    return _combine(limits, f, notes)


@finding_kind("knee", fields={"axis": PARAM}, required={"axis"}, band="position", format="int")
def knee(rows: Sequence[Row], f: Finding) -> Outcome:
    """Along ``axis``: where the curve flattens, the first axis value whose metric reaches
    `bands.KNEE_LEVEL` of the largest over the range ("gains flatten past batch 200")."""
    axis = f.options["axis"]
    ((_, pts),) = _series(rows, f).items()
    figures = [(a, _figure(f, a, r)) for a, r in pts]
    top = max(v for _, v in figures)
    at = next(a for a, v in figures if v >= KNEE_LEVEL * top)
    shown = ", ".join(f"{a}: {v / top:.0%}" for a, v in figures)
    return Outcome(
        float(at), in_accept(float(at), f.accept), f"{f.metric} as a share of its largest along {axis}: {shown}"
    )


def execution_modes() -> tuple[str, ...]:
    """The modes a point's ``execution_mode`` can be (`dabench_ir.sweep.results`: the WSE mode a run
    was placed in): the ``--wse-mode`` knob's choices but ``auto``, which is a rule, not a mode."""
    from dabench_ir.options import KNOBS

    return tuple(c for c in KNOBS["wse_mode"].choices if c != "auto")


@finding_kind(
    "switch", fields={"axis": PARAM, "expect": LABELS}, required={"axis", "expect"}, band="label", format="label"
)
def switch(rows: Sequence[Row], f: Finding) -> Outcome:
    """Along ``axis``: the execution mode the lowering chose (``execution_mode``) goes from
    ``expect[0]`` to ``expect[1]`` once and stays (points that do not fit are left out: they do
    not run); the figure is the first axis value in the second mode."""
    axis = f.options["axis"]
    first, then = labels(f.options["expect"])
    modes, why = [], []
    for a, r in next(iter(_series(rows, f).values()), []):
        reason = usable(r)
        if reason:
            why.append(reason)
        else:
            modes.append((a, r.get("execution_mode")))
    shown = ", ".join(f"{a}: {m}" for a, m in modes) + _skipped(why)
    seen = [m for _, m in modes]
    k = seen.index(then) if then in seen else len(seen)
    ok = 0 < k < len(seen) and set(seen[:k]) == {first} and set(seen[k:]) == {then}
    reason = "" if ok else f"not {first} then {then} along {axis} ({shown or 'no point runs'})"
    return Outcome(
        value=modes[k][0] if k < len(modes) else None,
        reproduced=ok,
        detail=f"execution_mode along {axis}: {shown}",
        reason=reason,
    )


LIMITERS = ("capacity", "bandwidth", "compute")
"""What a target's sweep meets first (`limits`): memory capacity (points that do not fit), memory
bandwidth (most points that fit are memory-bound on their roofline) or neither."""


@finding_kind(
    "limits", fields={"group": GROUP, "expect": LABEL_MAP}, required={"group", "expect"}, band="label", format="label"
)
def limits(rows: Sequence[Row], f: Finding) -> Outcome:
    """Per ``group``: the resource its sweep is limited by (`LIMITERS`): ``bandwidth`` when at
    least `bands.MAJORITY` of the points that fit are memory-bound on their roofline, else
    ``capacity`` when some point does not fit, else ``compute``; reproduced when every group's
    is the ``expect`` table's."""
    group = f.options["group"]
    by: dict[str, list[Row]] = defaultdict(list)
    for r in select(rows, f.where):
        if r.get("status") == "ok":
            by[group_label(r, group)].append(r)
    found: dict[str, str] = {}
    for g, mine in sorted(by.items(), key=lambda kv: label_sort_key(kv[0])):
        fitting = [r for r in mine if r.get("fits") is not False]
        bound = sum(1 for r in fitting if r.get("roofline_bound") == "memory")
        if fitting and bound >= MAJORITY * len(fitting):
            found[g] = f"bandwidth ({bound} of {len(fitting)} fitting points memory-bound)"
        elif len(fitting) < len(mine):
            found[g] = f"capacity ({len(mine) - len(fitting)} of {len(mine)} points do not fit)"
        else:
            found[g] = "compute (every point fits, most compute-bound)"
    expect = {str(k): str(v) for k, v in f.options["expect"].items()}
    shown = "; ".join(f"{g}: {v}" for g, v in found.items())
    wrong = [g for g, want in expect.items() if found.get(g, "none").split()[0] != want]
    reason = (
        ""
        if not wrong
        else "; ".join(f"{g} {found.get(g, 'no result').split()[0]}, the paper {expect[g]}" for g in wrong)
    )
    text = ", ".join(f"{g} {v.split()[0]}" for g, v in found.items())
    return Outcome(value=text, reproduced=not wrong, detail=shown, reason=reason, text=text)


# -- across groups: argmax, argmin, dominant ---------------------------------------------------
def _group_figures(rows: Sequence[Row], f: Finding) -> tuple[dict[str, float], list[str]]:
    group = f.options["group"]
    labels = sorted({group_label(r, group) for r in select(rows, f.where)}, key=label_sort_key)
    figures: dict[str, float] = {}
    notes: list[str] = []
    for g in labels:
        mine = [r for r in select(rows, f.where) if group_label(r, group) == g]
        try:
            if "numerator" in f.options:
                _, a = _one(mine, f, f.options["numerator"], f"{g} numerator", where=False)
                _, b = _one(mine, f, f.options["denominator"], f"{g} denominator", where=False)
                figures[g] = _ratio(a, b, f, f.options.get("minus_one", True))
            else:
                ok = [r for r in mine if usable(r, f.metric) is None]
                if not ok:
                    raise Unmet(usable(mine[0], f.metric) or "no usable point")
                values = [metric_value(r, f.metric) for r in ok]
                figures[g] = REDUCERS[f.options.get("reduce", "max")](values)  # type: ignore[arg-type]
        except Unmet as exc:
            notes.append(f"{g}: {exc}")
    return figures, notes


def labels(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _arg(rows: Sequence[Row], f: Finding, pick: Callable[..., Any]) -> Outcome:
    figures, notes = _group_figures(rows, f)
    expect = labels(f.options["expect"])
    missing = [e for e in expect if e not in figures]
    if not figures or (len(expect) == 1 and missing):
        raise Unmet("; ".join(notes) or f"no figure for {', '.join(missing)}")
    winner = pick(figures, key=figures.__getitem__)
    ranked = sorted(figures, key=figures.__getitem__, reverse=pick is max)
    shown = ", ".join(f"{g} {format_value(figures[g], 'pct' if 'numerator' in f.options else 'num')}" for g in ranked)
    detail = "; ".join([shown, *notes])
    reason = "" if winner in expect else f"tool picks {winner} ({shown}), the paper {' or '.join(expect)}"
    return Outcome(value=winner, reproduced=winner in expect, detail=detail, reason=reason)


_ARG_FIELDS = {
    "group": GROUP,
    "reduce": REDUCE,
    "numerator": GROUP_ROW,
    "denominator": GROUP_ROW,
    "minus_one": BOOL,
    "expect": LABELS,
}


@finding_kind("argmax", fields=_ARG_FIELDS, required={"group", "expect"}, band="label", format="label")
def argmax(rows: Sequence[Row], f: Finding) -> Outcome:
    """The ``group`` whose figure (``reduce`` of the metric, default max, or a numerator/denominator ratio) is largest."""
    return _arg(rows, f, max)


@finding_kind("argmin", fields=_ARG_FIELDS, required={"group", "expect"}, band="label", format="label")
def argmin(rows: Sequence[Row], f: Finding) -> Outcome:
    """The ``group`` whose figure (as for argmax) is smallest."""
    return _arg(rows, f, min)


BOUND_VALUES: dict[str, tuple[str, ...]] = {
    "step": tuple(Bound),
    "nodes": tuple(Bound),
    "roofline": ("memory", "compute"),
}
"""``of`` of a dominant finding -> the bounds its column takes (`dabench_ir.timeline.Bound`; a
roofline's side of the ridge: `dabench_ir.metrics.roofline_bound`): what ``bound`` may name."""

BOUND_COLUMNS = {"step": "dominant_bound", "nodes": "node_bound", "roofline": "roofline_bound"}
"""``of`` of a dominant finding -> the results column it reads: the bound holding most of the step
(host, drain and other overhead rows counted as ``overhead``), most of the node work (the bound
class of the operators' own times), or the run's side of its roofline's ridge (memory or
compute: `dabench_ir.metrics.roofline_bound`, one point per model as a roofline chart shows it)."""


@finding_kind(
    "dominant",
    fields={"bound": TEXT, "group": GROUP, "expect": LABELS, "of": BOUND_OF},
    required={"bound"},
    band="label",
    format="pct",
)
def dominant(rows: Sequence[Row], f: Finding) -> Outcome:
    """Share of the rows ``where`` picks whose dominant bound (``of`` the step, default, or of the
    nodes' work) is ``bound``: reproduced when it is at least `bands.MAJORITY`; with ``group``,
    when exactly the ``expect`` groups reach it."""
    from dabench_ir.report.table import percent

    column = BOUND_COLUMNS[f.options.get("of", "step")]
    bound = f.options["bound"]
    threshold = MAJORITY
    group = f.options.get("group")
    by: dict[str, list[bool]] = defaultdict(list)
    left_out: list[str] = []
    for r in select(rows, f.where):
        why = usable(r) or (None if r.get(column) else f"point has no {column}")
        if why:
            left_out.append(why)
            continue
        by[group_label(r, group) if group else ""].append(r.get(column) == bound)
    if not by:
        raise Unmet(left_out[0] if left_out else f"no point matches where ({_selector_text(f.where)})")
    shares = {g: sum(v) / len(v) for g, v in sorted(by.items(), key=lambda kv: label_sort_key(kv[0]))}
    notes = [f"{len(left_out)} point(s) left out (e.g. {left_out[0]})"] if left_out else []
    if not group:
        share = shares[""]
        detail = "; ".join([f"{sum(by[''])} of {len(by[''])} point(s) {bound}-bound", *notes])
        reason = (
            ""
            if share >= threshold
            else (f"{percent(share)} of the points are {bound}-bound, below the {percent(threshold)} asked")
        )
        return Outcome(
            value=share,
            reproduced=share >= threshold,
            detail=detail,
            reason=reason,
            text=f"{percent(share)} {bound}-bound",
        )
    expect = labels(f.options.get("expect", []))
    above = [g for g, s in shares.items() if s >= threshold]
    shown = ", ".join(f"{g} {percent(s)}" for g, s in sorted(shares.items(), key=lambda kv: -kv[1]))
    reproduced = set(above) == set(expect)
    detail = "; ".join([f"{bound}-bound share: {shown}", *notes])
    reason = (
        ""
        if reproduced
        else (
            f"{bound}-bound in at least {percent(threshold)} of points: {', '.join(above) or 'none'} "
            f"(expected {', '.join(expect) or 'none'}; {shown})"
        )
    )
    value = shares.get(expect[0]) if len(expect) == 1 else None
    return Outcome(value=value, reproduced=reproduced, detail=detail, reason=reason, text=shown)
