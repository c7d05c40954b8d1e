"""Study files: experiments (sweep specs), findings and plots in one TOML file, checked when read.

Everything a finding names is checked against its experiment's points before anything
runs: its kind and that kind's fields, every parameter a selector or an axis names, that
each selector picks a point (exactly one where one is meant), that an axis has one point per
value, that each ``where`` condition filters (keeps some points, not all), that a ratio's two
points differ, that every group an ``expect`` names is among the points' groups, that a
dominant finding's ``bound`` is a bound its column takes. The study's points together are held
to the sweep's `MAX_POINTS` (without ``--force``); its target files are found inside the study
file's folder, never outside. A bad study file is one UserError line naming the file, the
finding and the field (exit 2).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.reproduce import kinds as K
from dabench_ir.reproduce.bands import NO_FIGURE, Grading, grade
from dabench_ir.reproduce.counterfactual import Counterfactual, needed_points, parse_counterfactual
from dabench_ir.reproduce.rows import METRICS, REDUCERS, check_selector, group_label, label_sort_key, matches
from dabench_ir.schema import is_number
from dabench_ir.sweep.spec import MAX_POINTS, Point, SweepSpec, bundled_tomls, parse_spec, point_count, read_named_toml

__all__ = ["Finding", "PlotSpec", "Study", "bundled_studies", "load_study", "parse_study"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

COMMON_FIELDS = (
    "id",
    "level",
    "table",
    "claim",
    "source",
    "experiment",
    "kind",
    "metric",
    "paper",
    "format",
    "mechanism",
    "note",
    "where",
    "counterfactual",
    "tautology",
    "evidence",
)
"""Fields every finding may have; a kind adds its own (`kinds.Kind.fields`)."""

TABLES = ("paper", "artifact")
"""Which table a finding belongs to: the paper's own findings, or checks against the paper's
artifact (its logs and scripts), reported apart."""


@dataclass(frozen=True)
class Finding:
    """One claim of the paper, as data: what to compute from which experiment, and when it counts as reproduced."""

    id: str
    kind: str
    experiment: str
    claim: str
    level: int | None = None
    source: str = ""
    metric: str = "throughput_samples_per_s"
    paper: Any = None
    format: str = "num"
    mechanism: str = ""
    note: str = ""
    where: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    grading: Grading = NO_FIGURE
    counterfactual: Counterfactual | None = None
    tautology: str = ""
    evidence: tuple[str, ...] = ()
    table: str = "paper"

    @property
    def accept(self) -> tuple[float, float] | None:
        """The band the tool's figure must lie in: the grading rule's, from the paper's figure."""
        return self.grading.accept


@dataclass(frozen=True)
class PlotSpec:
    """One figure of the paper, drawn from an experiment (see `plots.PLOT_KINDS`)."""

    id: str
    kind: str
    experiment: str
    title: str = ""
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Study:
    """A parsed study: its experiments (parsed sweep specs), findings and plots."""

    name: str
    title: str
    experiments: dict[str, SweepSpec]
    findings: list[Finding]
    plots: list[PlotSpec] = field(default_factory=list)
    source: str = ""
    description: str = ""
    origin: str = "<study>"
    path: Path | None = None
    """The study file (None: parsed from a table); with the target files its points name, an
    input no output of the run may overwrite (`input_files`)."""

    def input_files(self) -> list[Path]:
        """The files the study reads: its own file and the target files its points name."""
        from dabench_ir.targets import is_target_path

        targets = {str(p["target"]) for p in self.points() if is_target_path(str(p["target"]))}
        return ([self.path] if self.path is not None else []) + [Path(t) for t in sorted(targets)]

    def points(self) -> list[Point]:
        """Every experiment's points, each distinct configuration once (in first-seen order)."""
        seen: dict[str, Point] = {}
        for spec in self.experiments.values():
            for p in spec.points:
                seen.setdefault(p.canonical(), p)
        return list(seen.values())

    def merged_spec(self) -> SweepSpec:
        """All experiments as one sweep spec (identical points run once)."""
        return SweepSpec(name=self.name, points=self.points(), description=self.title, origin=self.origin)

    def restrict(self, ids: Iterable[str]) -> Study:
        """The study with only the findings ``ids``, the experiments they need and those experiments' plots."""
        wanted = list(dict.fromkeys(ids))
        known = [f.id for f in self.findings]
        if not wanted:
            raise UserError(f"--only names no finding; give finding ids, comma-separated (e.g. --only {known[0]})")
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise UserError(f"--only {','.join(unknown)}: no such finding in {self.origin}; it has {', '.join(known)}")
        findings = [f for f in self.findings if f.id in wanted]
        needed = {f.experiment for f in findings}
        experiments = {n: s for n, s in self.experiments.items() if n in needed}
        plots = [p for p in self.plots if p.experiment in needed]
        return replace(self, experiments=experiments, findings=findings, plots=plots)


# -- checking fields ---------------------------------------------------------------------------
def _params_of(spec: SweepSpec) -> set[str]:
    return {k for p in spec.points for k in p.params}


def _check_names(names: Iterable[str], params: set[str], where: str, exp: str) -> None:
    for name in names:
        if name not in params:
            raise UserError(
                f"{where} names {name!r}, a parameter no point of experiment {exp!r} has; it has "
                f"{', '.join(sorted(params))}"
            )


def _is_names(value: Any) -> bool:
    names = [value] if isinstance(value, str) else value
    return isinstance(names, list) and bool(names) and all(isinstance(n, str) for n in names)


def _is_labels(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in items)


def _is_label_map(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(isinstance(v, str) for v in value.values())


_ONE_OF: dict[str, tuple[tuple[Any, ...], str]] = {
    K.REDUCE: (tuple(REDUCERS), "one of " + ", ".join(REDUCERS)),
    K.GROUP_REDUCE: ((*REDUCERS, "any"), "one of " + ", ".join([*REDUCERS, "any"])),
    K.DIRECTION: (("increasing", "decreasing", "flat"), "increasing, decreasing or flat"),
    K.BOUND_OF: (tuple(K.BOUND_COLUMNS), "one of " + ", ".join(K.BOUND_COLUMNS)),
    K.FORMAT: (K.FORMATS, "one of " + ", ".join(K.FORMATS)),
}
"""Field types that take one of a set of words: the words, and how a refusal lists them."""
_OF_SHAPE: dict[str, tuple[Callable[[Any], bool], str]] = {
    K.PARAM: (lambda v: isinstance(v, str), "a parameter name"),
    K.GROUP: (_is_names, "a parameter name or a list of them"),
    K.BOOL: (lambda v: isinstance(v, bool), "true or false"),
    K.VALUE: (lambda v: isinstance(v, (str, int, float, bool)), "an axis value"),
    K.LABELS: (_is_labels, "a label or a list of labels"),
    K.TEXT: (lambda v: isinstance(v, str), "a string"),
    K.LABEL_MAP: (_is_label_map, "a table of group = label"),
}
"""Field types whose value has a shape: its test, and what a refusal says was expected."""


def _check_field(ftype: str, value: Any, where: str, params: set[str], exp: str) -> Any:
    """A kind's or plot's field value, checked by its declared type."""
    if ftype in (K.ROW, K.GROUP_ROW, K.SELECTOR):
        selector = check_selector(value, where)
        _check_names(selector, params, where, exp)
        return selector
    if ftype in _ONE_OF:
        words, listed = _ONE_OF[ftype]
        if value not in words:
            raise UserError(f"{where}: {value!r}; expected {listed}")
        return value
    if ftype in _OF_SHAPE:
        test, expected = _OF_SHAPE[ftype]
        if not test(value):
            raise UserError(f"{where}: expected {expected}, got {value!r}")
        if ftype in (K.PARAM, K.GROUP):
            _check_names([value] if isinstance(value, str) else value, params, where, exp)
        return dict(value) if ftype == K.LABEL_MAP else value
    if ftype == K.METRIC:
        return _check_metric(value, where)
    if ftype == K.POINTS:
        return _check_paper_points(value, where)
    if ftype == K.MAPPING:
        return _check_paper_bars(value, where)
    raise AssertionError(f"unknown field type {ftype}")


def _check_metric(value: Any, where: str) -> str:
    if value not in METRICS:
        raise UserError(f"{where}: {value!r} is not a results column; expected one of {', '.join(METRICS)}")
    return value


_MARKS = {  # a paper mark's shape -> its keys (besides panel, series, label)
    "point": ({"x", "y"}, {"relative_to"}),
    "band": ({"hspan"}, set()),
    "line": ({"vline"}, set()),
    "linear": ({"linear_from"}, set()),
}
"""The paper's marks on a plot: a point (``y`` a figure, or with ``relative_to`` a factor of the
tool's figure at that x), a horizontal band (``hspan = [lo, hi]``), a vertical line (``vline``) and
a linear-scaling line through the tool's figure at ``linear_from`` (the paper's "near-linear")."""


def _check_paper_points(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise UserError(f"{where}: expected a list of {{ x = ..., y = ... }} tables")
    for i, p in enumerate(value):
        shape = next((m for m, (keys, _) in _MARKS.items() if isinstance(p, Mapping) and keys <= set(p)), None)
        if shape is None:
            raise UserError(
                f"{where} #{i + 1}: expected {{ x, y }}, {{ hspan = [lo, hi] }}, {{ vline = x }} or "
                f"{{ linear_from = x }} (with panel?, series?, label?), got {p!r}"
            )
        keys, optional = _MARKS[shape]
        extra = set(p) - keys - optional - {"panel", "series", "label"}
        if extra:
            raise UserError(f"{where} #{i + 1}: unknown key {sorted(extra)[0]!r} for a paper {shape}")
        numbers = [p[k] for k in (keys | optional) & set(p)]
        numbers = [x for v in numbers for x in (v if isinstance(v, list) else [v])]
        if not numbers or not all(is_number(x) and math.isfinite(x) for x in numbers):
            raise UserError(f"{where} #{i + 1}: {', '.join(sorted(keys | optional & set(p)))} must be finite numbers")
        span = p.get("hspan")
        if shape == "band" and (not isinstance(span, list) or len(span) != 2 or span[0] > span[1]):
            raise UserError(f"{where} #{i + 1}: hspan must be [low, high] with low <= high, got {span!r}")
    return [dict(p) for p in value]


def _check_paper_bars(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: expected a table of label = number")
    for k, v in value.items():
        inner = v.values() if isinstance(v, Mapping) else [v]
        if not all(is_number(x) for x in inner):
            raise UserError(f"{where}: {k} = {v!r}: expected a number (or a table of label = number)")
    return dict(value)


def _differ(points: list[Point]) -> str:
    keys = {k for p in points for k in p.params}
    return ", ".join(sorted(k for k in keys if len({json.dumps(p[k]) for p in points}) > 1)) or "nothing"


def _pick(points: list[Point], *selectors: Mapping[str, Any] | None) -> list[Point]:
    return [p for p in points if all(matches(p.params, s) for s in selectors)]


def _check_filters(selector: Mapping[str, Any], points: list[Point], where: str, exp: str) -> None:
    """Each entry of a ``where`` selector leaves out some of ``points``: one that keeps every point
    filters nothing (a typo of a value, a bound below every point's), refused."""
    for name, want in selector.items():
        if len(points) > 1 and all(matches(p.params, {name: want}) for p in points):
            raise UserError(
                f"{where}: {name} = {want!r} keeps every point of experiment {exp!r}: a filter that "
                "filters nothing; drop it or give a value that selects"
            )


def _check_static(f: Finding, kind: K.Kind, spec: SweepSpec, where: str) -> None:
    """What the points already tell: selectors pick points, one where one is meant; one point per
    axis value; a ratio's two points differ; the groups ``expect`` names exist."""
    _check_filters(f.where, spec.points, f"{where}: where", f.experiment)
    base = _pick(spec.points, f.where)
    if not base:
        raise UserError(f"{where}: where ({f.where}) matches no point of experiment {f.experiment!r}")
    group = f.options.get("group")
    _check_pair(f, base, group, where)
    _check_expect(f, base, group, where)
    for name, ftype in kind.fields.items():
        if name not in f.options or ftype not in (K.ROW, K.GROUP_ROW, K.SELECTOR):
            continue
        sel = f.options[name]
        if ftype == K.GROUP_ROW:
            if not group:
                raise UserError(f"{where}: {name} needs group")
            labels = sorted({group_label(p.params, group) for p in base})
            for g in labels:
                found = [p for p in _pick(base, sel) if group_label(p.params, group) == g]
                if len(found) != 1:
                    raise UserError(
                        f"{where}: {name} ({sel}) matches {len(found)} points in group {g!r}, "
                        f"not one{' (they differ in ' + _differ(found) + ')' if found else ''}"
                    )
            continue
        found = _pick(base, sel)
        if not found:
            raise UserError(f"{where}: {name} ({sel}) matches no point of experiment {f.experiment!r} (with where)")
        if ftype == K.ROW and len(found) > 1:
            raise UserError(
                f"{where}: {name} ({sel}) matches {len(found)} points, not one "
                f"(they differ in {_differ(found)}); narrow it or where"
            )
    if f.kind == "switch" and len(K.labels(f.options["expect"])) != 2:
        raise UserError(f"{where}: expect must name two modes, the one before the switch and the one after")
    if f.kind == "switch" and not set(K.labels(f.options["expect"])) <= set(K.execution_modes()):
        unknown = sorted(set(K.labels(f.options["expect"])) - set(K.execution_modes()))
        raise UserError(
            f"{where}: expect {unknown[0]!r} is no execution mode (modes: {', '.join(K.execution_modes())})"
        )
    if ("numerator" in f.options) != ("denominator" in f.options):
        raise UserError(f"{where}: numerator and denominator go together")
    if f.kind == "value" and "select" in f.options and "reduce" in f.options:
        raise UserError(f"{where}: give select (one point) or reduce (over where), not both")
    if f.kind == "value" and "reduce" not in f.options and len(_pick(base, f.options.get("select"))) != 1:
        found = _pick(base, f.options.get("select"))
        raise UserError(
            f"{where}: select and where match {len(found)} points, not one "
            f"(they differ in {_differ(found)}); narrow them or give reduce"
        )
    if kind.fields.get("reduce") == K.GROUP_REDUCE and "reduce" in f.options:
        if not group:
            raise UserError(f"{where}: reduce combines the groups' figures: give group")
        if f.options["reduce"] == "any" and f.accept is None:
            raise UserError(f"{where}: reduce = 'any' needs the paper's figure (paper)")
    if "axis" in f.options:
        axis = f.options["axis"]
        counts = Counter((group_label(p.params, group) if group else "", json.dumps(p[axis])) for p in base)
        (g, value), n = counts.most_common(1)[0]
        if n > 1:
            found = [
                p for p in base if json.dumps(p[axis]) == value and (not group or group_label(p.params, group) == g)
            ]
            raise UserError(
                f"{where}: {n} points at {axis} = {value}{' in group ' + repr(g) if g else ''} "
                f"(they differ in {_differ(found)}); add them to where or group"
            )
        values = {json.dumps(p[axis]) for p in base}
        for end in ("from", "to"):
            if end in f.options and json.dumps(f.options[end]) not in values:
                raise UserError(f"{where}: {end} = {f.options[end]!r} is not a value of {axis} among the points")


def _check_pair(f: Finding, base: list[Point], group: Any, where: str) -> None:
    """A numerator and a denominator that pick the same point (in some group) give a ratio of 1
    whatever the tool computes: refused."""
    if "numerator" not in f.options or "denominator" not in f.options:
        return
    groups = {group_label(p.params, group) for p in base} if group else {""}
    for g in sorted(groups):
        mine = [p for p in base if not group or group_label(p.params, group) == g]
        num, den = _pick(mine, f.options["numerator"]), _pick(mine, f.options["denominator"])
        if num and {p.canonical() for p in num} == {p.canonical() for p in den}:
            shown = f" in group {g!r}" if g else ""
            raise UserError(
                f"{where}: numerator and denominator pick the same point{shown} ({num[0].label()}): "
                "a ratio of a point over itself; make them differ in the parameter the finding compares"
            )


def _check_expect(f: Finding, base: list[Point], group: Any, where: str) -> None:
    """The groups an ``expect`` names are groups of the points (argmax, argmin, dominant, limits), the
    limiters a ``limits`` finding expects are `kinds.LIMITERS`; a dominant ``bound`` is one its
    column takes (`kinds.BOUND_VALUES`)."""
    if f.kind == "dominant":
        of = f.options.get("of", "step")
        allowed = K.BOUND_VALUES[of]
        if f.options["bound"] not in allowed:
            raise UserError(
                f"{where}: bound {f.options['bound']!r}; with of = {of!r} expected one of {', '.join(allowed)}"
            )
        if "expect" in f.options and not group:
            raise UserError(f"{where}: expect names groups: give group")
    if "expect" not in f.options or not group or f.kind not in ("argmax", "argmin", "dominant", "limits"):
        return
    expect = f.options["expect"]
    named = [str(k) for k in expect] if isinstance(expect, Mapping) else K.labels(expect)
    groups = sorted({group_label(p.params, group) for p in base}, key=label_sort_key)
    missing = [g for g in named if g not in groups]
    if missing:
        raise UserError(
            f"{where}: expect names group {missing[0]!r}, which no point (with where) has; "
            f"the groups of {group!r} are {', '.join(groups)}"
        )
    if f.kind == "limits":
        wrong = [f"{g} = {v!r}" for g, v in expect.items() if v not in K.LIMITERS]
        if wrong:
            raise UserError(f"{where}: expect {wrong[0]}; a limiter is one of {', '.join(K.LIMITERS)}")


def _check_paper(value: Any, where: str) -> Any:
    if isinstance(value, str) or (is_number(value) and math.isfinite(value)):
        return value
    if isinstance(value, list) and len(value) == 2 and all(is_number(v) and math.isfinite(v) for v in value):
        if value[0] > value[1]:
            raise UserError(f"{where}: paper range [{value[0]}, {value[1]}] is reversed (low > high)")
        return list(value)
    raise UserError(f"{where}: paper must be a number, a [low, high] range or a text, got {value!r}")


def _check_evidence(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UserError(f"{where}: evidence must be a list of measurement ids (catalogue points, artifact logs)")
    return tuple(value)


def _text(table: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = table.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise UserError(f"{where}: {key} must be {'a non-empty ' if required else 'a '}string, got {value!r}")
    return value


def _entry_id(raw: Any, i: int, table: str, origin: str) -> str:
    """The id of the ``i``-th ``[[table]]`` entry, checked to be a table with a name."""
    if not isinstance(raw, Mapping):
        raise UserError(f"{origin}: [[{table}]] #{i + 1} must be a table")
    name = raw.get("id")
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError(f"{origin}: [[{table}]] #{i + 1}: id must be a name (letters, digits, _ . -), got {name!r}")
    return name


def _experiment(raw: Mapping[str, Any], experiments: dict[str, SweepSpec], where: str, verb: str) -> str:
    """The experiment an entry names, checked to be defined (``verb``: what the entry does with it)."""
    exp = raw.get("experiment")
    if exp is None:
        raise UserError(f"{where}: give the experiment it {verb} (one of {', '.join(experiments)})")
    if exp not in experiments:
        raise UserError(f"{where}: experiment {exp!r} is not defined; the study has {', '.join(experiments) or 'none'}")
    return exp


def _parse_finding(raw: Any, i: int, experiments: dict[str, SweepSpec], origin: str) -> Finding:
    fid = _entry_id(raw, i, "finding", origin)
    where = f"{origin}: finding {fid}"
    kind_name = raw.get("kind")
    if kind_name not in K.KINDS:
        raise UserError(f"{where}: unknown kind {kind_name!r}; known: {', '.join(K.KINDS)}")
    kind = K.KINDS[kind_name]
    if "accept" in raw:
        raise UserError(
            f"{where}: accept is not a finding's to set: the band comes from the paper's figure by the "
            "rule for the finding's kind (docs/reproduce.md, Bands); give paper"
        )
    unknown = [k for k in raw if k not in COMMON_FIELDS and k not in kind.fields]
    if unknown:
        takes = ", ".join([*COMMON_FIELDS, *kind.fields])
        raise UserError(f"{where}: unknown field {unknown[0]!r} for kind {kind_name}; it takes {takes}")
    exp = _experiment(raw, experiments, where, "reads")
    params = _params_of(experiments[exp])
    missing = [k for k in sorted(kind.required) if k not in raw]
    if missing:
        raise UserError(f"{where}: kind {kind_name} needs {', '.join(missing)}")
    options = {k: _check_field(t, raw[k], f"{where}: {k}", params, exp) for k, t in kind.fields.items() if k in raw}
    level = raw.get("level")
    if level is not None and not (isinstance(level, int) and not isinstance(level, bool) and level > 0):
        raise UserError(f"{where}: level must be a positive integer, got {level!r}")
    table = raw.get("table", "paper")
    if table not in TABLES:
        raise UserError(f"{where}: table {table!r}; expected one of {', '.join(TABLES)}")
    fmt = raw.get("format", kind.format)
    if fmt not in K.FORMATS:
        raise UserError(f"{where}: format {fmt!r}; expected one of {', '.join(K.FORMATS)}")
    metric = _check_metric(raw.get("metric", "throughput_samples_per_s"), f"{where}: metric")
    paper = _check_paper(raw["paper"], where) if "paper" in raw else None
    finding = Finding(
        id=fid,
        kind=kind_name,
        experiment=exp,
        claim=_text(raw, "claim", where, required=True),
        level=level,
        source=_text(raw, "source", where),
        metric=metric,
        paper=paper,
        format=fmt,
        mechanism=_text(raw, "mechanism", where),
        note=_text(raw, "note", where),
        where=_check_field(K.SELECTOR, raw.get("where", {}), f"{where}: where", params, exp),
        options=options,
        grading=grade(kind.rule(options, metric), paper, options),
        tautology=_text(raw, "tautology", where),
        evidence=_check_evidence(raw.get("evidence", []), where),
        table=table,
    )
    _check_static(finding, kind, experiments[exp], where)
    if "counterfactual" in raw:
        if finding.tautology:
            raise UserError(f"{where}: give a counterfactual or a tautology (why none exists), not both")
        cf = parse_counterfactual(raw["counterfactual"], where, needed_points(finding, experiments[exp]))
        finding = replace(finding, counterfactual=cf)
    return finding


def _parse_plot(raw: Any, i: int, experiments: dict[str, SweepSpec], origin: str) -> PlotSpec:
    from dabench_ir.reproduce.plots import PLOT_KINDS

    pid = _entry_id(raw, i, "plot", origin)
    where = f"{origin}: plot {pid}"
    kind = PLOT_KINDS.get(raw.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        raise UserError(f"{where}: unknown kind {raw.get('kind')!r}; known: {', '.join(PLOT_KINDS)}")
    exp = _experiment(raw, experiments, where, "draws")
    fields = {**kind.fields, "where": K.SELECTOR}
    unknown = [k for k in raw if k not in ("id", "kind", "experiment", "title", *fields)]
    if unknown:
        raise UserError(
            f"{where}: unknown field {unknown[0]!r}; plot kind {raw['kind']} takes {', '.join(['title', *fields])}"
        )
    missing = [k for k in sorted(kind.required) if k not in raw]
    if missing:
        raise UserError(f"{where}: plot kind {raw['kind']} needs {', '.join(missing)}")
    params = _params_of(experiments[exp])
    options = {k: _check_field(t, raw[k], f"{where}: {k}", params, exp) for k, t in fields.items() if k in raw}
    _check_filters(options.get("where") or {}, experiments[exp].points, f"{where}: where", exp)
    if not _pick(experiments[exp].points, options.get("where")):
        raise UserError(f"{where}: where matches no point of experiment {exp!r}")
    return PlotSpec(id=pid, kind=raw["kind"], experiment=exp, title=_text(raw, "title", where), options=options)


def parse_study(
    data: Mapping[str, Any], *, origin: str = "<study>", force: bool = False, folder: str | Path | None = None
) -> Study:
    """A study from its TOML (already parsed): every experiment parsed as a sweep spec, every
    finding and plot checked against its experiment's points. Bad input raises UserError.

    ``folder``: the study file's folder; a target file an experiment names is found inside it
    (`fileio.resolve_inside`: relative to it, never outside it), as a sweep spec's is. The points
    of all experiments together are held to `MAX_POINTS` unless ``force``."""
    allowed = ("name", "title", "source", "description", "experiment", "finding", "plot")
    for key in data:
        if key not in allowed:
            raise UserError(f"{origin}: unknown top-level key {key!r}; expected {', '.join(allowed)}")
    name = data.get("name", Path(origin).stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError(f"{origin}: name must be a name (letters, digits, _ . -), got {name!r}")
    raw_exps = data.get("experiment", {})
    if not isinstance(raw_exps, Mapping) or not raw_exps:
        raise UserError(f"{origin}: no experiments; give [experiment.NAME] tables (sweep specs)")
    total = sum(point_count(t) for t in raw_exps.values() if isinstance(t, Mapping))
    if total > MAX_POINTS and not force:
        raise UserError(
            f"{origin}: {total:,} points over {len(raw_exps)} experiment(s), more than {MAX_POINTS:,} for the "
            "whole study; narrow the axes, or pass --force to run them all"
        )
    experiments: dict[str, SweepSpec] = {}
    for ename, table in raw_exps.items():
        if not _NAME.match(ename):
            raise UserError(f"{origin}: experiment name {ename!r} must be letters, digits, _ . -")
        if not isinstance(table, Mapping):
            raise UserError(f"{origin}: experiment.{ename} must be a table (a sweep spec)")
        experiments[ename] = parse_spec(
            dict(table), origin=f"{origin} [experiment.{ename}]", name=ename, force=force, folder=folder
        )
    raw_findings = data.get("finding", [])
    if not isinstance(raw_findings, list) or not raw_findings:
        raise UserError(f"{origin}: no findings; give [[finding]] tables")
    findings = [_parse_finding(raw, i, experiments, origin) for i, raw in enumerate(raw_findings)]
    dup = [i for i, n in Counter(f.id for f in findings).items() if n > 1]
    if dup:
        raise UserError(f"{origin}: finding id {dup[0]!r} is used more than once")
    raw_plots = data.get("plot", [])
    if not isinstance(raw_plots, list):
        raise UserError(f"{origin}: plots are [[plot]] tables")
    plots = [_parse_plot(raw, i, experiments, origin) for i, raw in enumerate(raw_plots)]
    dup = [i for i, n in Counter(p.id for p in plots).items() if n > 1]
    if dup:
        raise UserError(f"{origin}: plot id {dup[0]!r} is used more than once")
    where = f"{origin}"
    return Study(
        name=name,
        title=_text(data, "title", where) or name,
        experiments=experiments,
        findings=findings,
        plots=plots,
        source=_text(data, "source", where),
        description=_text(data, "description", where),
        origin=origin,
    )


# -- files and bundled studies -----------------------------------------------------------------
def bundled_studies() -> dict[str, Path]:
    """Bundled study name -> its TOML file."""
    return bundled_tomls("reproduce")


def load_study(source: str | Path, *, force: bool = False) -> Study:
    """A study from a TOML path, or a bundled study by name (``dabench``)."""
    path, data = read_named_toml(source, "reproduce", "study", "STUDY")
    return replace(parse_study(data, origin=path.name, force=force, folder=path.parent), path=path)
