"""Run a study: every experiment's points as one sweep into one folder, then every finding evaluated.

Layout of the output folder::

    OUT/points/<key>.json              one record per point (the sweep's; identical points run once)
    OUT/results.csv                    every point of every experiment (the sweep's table)
    OUT/experiments/<name>/results.csv one experiment's points
    OUT/findings.csv, .json, .md       one row per finding: paper vs tool, verdict, counterfactual, provenance
    OUT/counterfactuals/               the counterfactual points (a sweep of their own) and changed targets
    OUT/<plot id>.png                  the study's plots

The points run through `dabench_ir.sweep.run_sweep`, so a rerun skips what is done, an
interrupted run resumes without loss or duplication, and ``jobs``/``executor``/``address``
mean what they mean for ``dabench-ir sweep``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dabench_ir.reproduce.bands import MAJORITY, RANGE_SHARE
from dabench_ir.reproduce.counterfactual import CounterfactualRun, plan_counterfactuals
from dabench_ir.reproduce.kinds import Outcome, accept_text, evaluate, format_value, is_change
from dabench_ir.reproduce.rows import usable
from dabench_ir.reproduce.study import Finding, Study
from dabench_ir.sweep import SweepResult, point_key, run_sweep
from dabench_ir.sweep.spec import SweepSpec

__all__ = ["COUNTERFACTUALS", "VERDICTS", "FindingOutcome", "StudyResult", "evaluate_study", "run_study"]

Row = Mapping[str, Any]

COUNTERFACTUALS = "counterfactuals"
"""The folder of a study's output where its counterfactual points run (`counterfactual`)."""

logger = logging.getLogger(__name__)

MISSING = "no result (lost to a dead worker, or being computed by another run into this folder); run again"


VERDICTS = ("reproduced", "not reproduced", "not a test")
"""A finding's verdict: its figure lies in the band and its counterfactual fails it; it does not;
or it could not have failed (no counterfactual, the counterfactual reproduces it too, or the paper
gives no figure the study has)."""


@dataclass
class FindingOutcome:
    """One row of the findings table: the claim, the paper's figure, the tool's, the verdict, the
    counterfactual that shows the finding can fail, and the provenance (whether a parameter of
    the tool was fitted to the figure it checks)."""

    id: str
    level: int | None
    table: str
    experiment: str
    kind: str
    claim: str
    source: str
    metric: str
    paper: Any
    paper_text: str
    value: Any
    tool: str
    verdict: str
    grading: str
    accept: list[float] | None
    accept_text: str
    counterfactual: str
    counterfactual_tool: str
    counterfactual_reproduced: bool | None
    fitted: list[str]
    mechanism: str
    reason: str
    detail: str
    note: str

    @property
    def reproduced(self) -> bool:
        return self.verdict == "reproduced"

    @property
    def provenance(self) -> str:
        """``predicted``, or ``in sample`` when a parameter of the tool was fitted to the figure."""
        return "in sample" if self.fitted else "predicted"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reproduced": self.reproduced, "provenance": self.provenance}


_AS_GIVEN = ("id", "level", "table", "experiment", "kind", "claim", "source", "metric", "paper", "mechanism", "note")
"""The fields of a `FindingOutcome` that are its `Finding`'s, as the study gives them."""


@dataclass
class StudyResult:
    """What a study run produced: the outcomes, the sweeps' account of the points (the study's
    and its counterfactuals'), the files written."""

    study: Study
    outcomes: list[FindingOutcome]
    sweep: SweepResult | None = None
    files: list[Path] = field(default_factory=list)
    out_dir: Path | None = None
    counterfactual_sweep: SweepResult | None = None

    @property
    def reproduced(self) -> int:
        return sum(1 for o in self.outcomes if o.reproduced)


def _paper_text(f: Finding, signed: bool) -> str:
    paper = f.paper
    if paper is None:
        expect = f.options.get("expect")
        if expect is None:
            return "-"
        if isinstance(expect, Mapping):
            return ", ".join(f"{g} {v}" for g, v in expect.items())
        return " or ".join(map(str, expect)) if isinstance(expect, list) else str(expect)
    if isinstance(paper, list):
        return f"{format_value(paper[0], f.format)}-{format_value(paper[1], f.format)}"
    if isinstance(paper, str):
        return paper
    return format_value(paper, f.format, signed=signed)


def _shown(f: Finding, outcome: Outcome) -> str:
    if outcome.value is None and outcome.text is None:
        return "-"
    return outcome.text or format_value(outcome.value, f.format, signed=is_change(f))


def _accept_text(f: Finding) -> str:
    """The band as shown: the rule's text and, for a number, its range."""
    accept, rule = f.accept, f.grading.text
    if f.kind == "range" and accept is not None:
        return f"{rule}: {accept_text(accept, f.format)} for {format_value(RANGE_SHARE, 'pct')} of points"
    if accept is not None:
        return f"{rule}: {accept_text(accept, f.format)}"
    if f.kind == "dominant" and "group" not in f.options:
        return f"{rule}: >= {format_value(MAJORITY, 'pct')} {f.options['bound']}-bound"
    if f.kind == "trend":
        return f"{rule}: {f.options['expect']}"
    return rule


def _fitted(study: Study, f: Finding, targets: Iterable[str]) -> list[str]:
    """The parameters fitted to the figure ``f`` checks: those whose ``fitted_to`` names the finding
    (``STUDY/ID``) or a measurement its figure is (``evidence``), on the targets its points use."""
    from dabench_ir.targets import load_target

    ids = [f"{study.name}/{f.id}", *f.evidence]
    out = []
    for name in dict.fromkeys(targets):
        target = load_target(name)
        out += [f"{target.name} {p}" for i in ids for p in target.fitted_on(i)]
    return list(dict.fromkeys(out))


def _verdict(f: Finding, outcome: Outcome, cf: Outcome | None, cf_rows: Sequence[Row]) -> tuple[str, str]:
    """The verdict and its reason (`VERDICTS`)."""
    if f.grading.rule == "none":
        return "not a test", "the paper's figure is not in the study's sources: nothing to compare"
    if not outcome.reproduced:  # it could fail: it did
        return "not reproduced", outcome.reason
    if f.counterfactual is None:
        return "not a test", f"no counterfactual: {f.tautology or 'the study names none'}"
    broken = [r for r in cf_rows if r.get("status") != "ok"]
    if cf is None or broken:
        why = usable(broken[0]) if broken else "not run"
        return "not a test", f"the counterfactual ({f.counterfactual.what}) did not run: {why}"
    if cf.reproduced:
        shown = _shown(f, cf)
        return (
            "not a test",
            f"still reproduced with {f.counterfactual.what} (tool {shown}): the finding does not test it",
        )
    return "reproduced", ""


def outcome_row(
    f: Finding, rows: Sequence[Row], cf_rows: Sequence[Row] = (), study: Study | None = None
) -> FindingOutcome:
    """Evaluate one finding on its experiment's rows (and its counterfactual's) and dress the outcome for the table."""
    outcome = evaluate(rows, f)
    cf = evaluate(cf_rows, f) if f.counterfactual is not None and cf_rows else None
    verdict, reason = _verdict(f, outcome, cf, cf_rows)
    fitted = _fitted(study, f, (str(r["target"]) for r in rows if r.get("target"))) if study is not None else []
    return FindingOutcome(
        **{name: getattr(f, name) for name in _AS_GIVEN},
        paper_text=_paper_text(f, is_change(f)),
        value=outcome.value,
        tool=_shown(f, outcome),
        verdict=verdict,
        grading=f.grading.rule,
        accept=list(f.accept) if f.accept else None,
        accept_text=_accept_text(f),
        counterfactual=f.counterfactual.what if f.counterfactual else "",
        counterfactual_tool=_shown(f, cf) if cf is not None else "-",
        counterfactual_reproduced=cf.reproduced if cf is not None else None,
        fitted=fitted,
        reason=reason,
        detail=outcome.detail,
    )


def _keys(study: Study) -> dict[str, str]:
    """Point (canonical text) -> its sweep key."""
    return {p.canonical(): point_key(p.params) for p in study.points()}


def experiment_rows(study: Study, rows_by_key: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each experiment's rows, in its points' order; a point without a result gets a row saying so
    (its findings are then "not reproduced" with that reason, never dropped)."""
    keys = _keys(study)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, spec in study.experiments.items():
        rows = []
        for p in spec.points:
            key = keys[p.canonical()]
            rows.append(rows_by_key.get(key) or {"key": key, **p.params, "status": "missing", "error": MISSING})
        out[name] = rows
    return out


def counterfactual_rows(plan: CounterfactualRun, rows_by_key: Mapping[str, Row]) -> dict[str, list[Row]]:
    """Each finding's counterfactual rows, each given its original point's parameters (so the
    finding's selectors pick it as they pick the original); a point without a result says so."""
    out: dict[str, list[Row]] = {}
    for fid, pairs in plan.reads.items():
        rows = []
        for point, original in pairs:
            key = point_key(point.params)
            row = rows_by_key.get(key) or {"status": "missing", "error": MISSING}
            rows.append({**row, "key": key, **original})
        out[fid] = rows
    return out


def evaluate_study(
    study: Study, rows_by_key: Mapping[str, Row], cf_rows: Mapping[str, Sequence[Row]] | None = None
) -> list[FindingOutcome]:
    """Every finding of ``study`` evaluated on the rows (by point key) of a run, and on its
    counterfactual's rows (by finding id: `counterfactual_rows`)."""
    by_exp = experiment_rows(study, dict(rows_by_key))
    return [outcome_row(f, by_exp[f.experiment], (cf_rows or {}).get(f.id, ()), study) for f in study.findings]


def run_study(
    study: Study,
    out_dir: str | Path,
    *,
    plots: bool = True,
    bar: Any = None,
    **grid: Any,
) -> StudyResult:
    """Run every experiment's points (one sweep into ``out_dir``), evaluate the findings, write
    the findings tables and the plots. Ctrl-C keeps every finished point (rerun to resume).
    ``grid``: how the points run, as `run_sweep` takes it (``jobs``, ``executor``, ``address``,
    ``cache_dir``, ``retry_failed``)."""
    from dabench_ir.fileio import check_output_dir
    from dabench_ir.reproduce.render import write_findings
    from dabench_ir.sweep.results import read_point, write_table

    out = Path(out_dir)
    cf_folder = out / COUNTERFACTUALS
    for folder in (out, cf_folder, cf_folder / "targets"):  # a file in a folder's place: one line, before any work
        check_output_dir(folder, "-o")
    run = {**grid, "plots": False, "node_detail": False}  # the study draws its own plots; records without node rows
    sweep = run_sweep(study.merged_spec(), out, bar=bar, **run)
    rows_by_key = {r["key"]: r for r in sweep.rows}
    files = list(sweep.files)
    by_exp = experiment_rows(study, rows_by_key)
    for name, rows in by_exp.items():
        folder = out / "experiments" / name
        folder.mkdir(parents=True, exist_ok=True)
        files += write_table(folder, [r for r in rows if r.get("status") != "missing"])
    plan = plan_counterfactuals(study, cf_folder / "targets")
    own = {point_key(p.params) for p in study.points()}  # a point the study ran is not run again
    fresh = [p for p in plan.points if point_key(p.params) not in own]
    cf_sweep = None
    if fresh:
        cf_bar = (
            None
            if bar is None
            else (
                lambda done, total, **kw: bar(done, total, **{**kw, "phase": f"counterfactuals {kw.get('phase', '')}"})
            )
        )
        cf_sweep = run_sweep(
            SweepSpec(f"{study.name}-counterfactuals", fresh, origin=study.origin), cf_folder, bar=cf_bar, **run
        )
        files += cf_sweep.files
        rows_by_key.update((r["key"], r) for r in cf_sweep.rows)
    outcomes = evaluate_study(study, rows_by_key, counterfactual_rows(plan, rows_by_key))
    files += write_findings(out, study, outcomes)
    if plots:
        from dabench_ir.report.plots import save_figure
        from dabench_ir.reproduce.plots import PLOT_KINDS

        points_dir = out / "points"

        def records(row: dict[str, Any]) -> dict[str, Any] | None:
            return read_point(points_dir, str(row.get("key")))

        for spec in study.plots:
            try:
                fig = PLOT_KINDS[spec.kind].draw(by_exp[spec.experiment], spec, records)
            except Exception as exc:  # a plot is a view of results already written: never fail the run for it
                logger.warning("plot %s skipped: %s: %s", spec.id, type(exc).__name__, exc)
                logger.debug("plot %s", spec.id, exc_info=True)
                continue
            files.append(save_figure(fig, out / f"{spec.id}.png"))
    return StudyResult(study, outcomes, sweep, files, out, cf_sweep)
