"""Run a study: every experiment's points as one sweep into one folder, then every finding evaluated.

Layout of the output folder::

    OUT/points/<key>.json              one record per point (the sweep's; identical points run once)
    OUT/results.csv                    every point of every experiment (the sweep's table)
    OUT/experiments/<name>/results.csv one experiment's points
    OUT/findings.csv, .json, .md       one row per finding: paper vs tool, reproduced, mechanism, reason
    OUT/<plot id>.png                  the study's plots

The points run through `dabench_ir.sweep.run_sweep`, so a rerun skips what is done, an
interrupted run resumes without loss or duplication, and ``jobs``/``executor``/``address``
mean what they mean for ``dabench-ir sweep``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dabench_ir.reproduce.kinds import accept_text, evaluate, format_value, is_change
from dabench_ir.reproduce.study import Finding, Study
from dabench_ir.sweep import SweepResult, point_key, run_sweep
from dabench_ir.sweep.executors import Executor

__all__ = ["FindingOutcome", "StudyResult", "evaluate_study", "run_study"]

logger = logging.getLogger(__name__)

MISSING = "no result (lost to a dead worker, or being computed by another run into this folder); run again"


@dataclass
class FindingOutcome:
    """One row of the findings table: the claim, the paper's figure, the tool's, and the verdict."""

    id: str
    level: int | None
    experiment: str
    kind: str
    claim: str
    source: str
    metric: str
    paper: Any
    paper_text: str
    value: Any
    tool: str
    reproduced: bool
    accept: list[float] | None
    accept_text: str
    mechanism: str
    reason: str
    detail: str
    note: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StudyResult:
    """What a study run produced: the outcomes, the sweep's account of the points, the files written."""

    study: Study
    outcomes: list[FindingOutcome]
    sweep: SweepResult | None = None
    files: list[Path] = field(default_factory=list)
    out_dir: Path | None = None

    @property
    def reproduced(self) -> int:
        return sum(1 for o in self.outcomes if o.reproduced)


def _paper_text(f: Finding, signed: bool) -> str:
    paper = f.paper
    if paper is None:
        expect = f.options.get("expect")
        if expect is None:
            return "-"
        return " or ".join(map(str, expect)) if isinstance(expect, list) else str(expect)
    if isinstance(paper, list):
        return f"{format_value(paper[0], f.format)}-{format_value(paper[1], f.format)}"
    if isinstance(paper, str):
        return paper
    return format_value(paper, f.format, signed=signed)


def outcome_row(f: Finding, rows: list[dict[str, Any]]) -> FindingOutcome:
    """Evaluate one finding on its experiment's rows and dress the outcome for the table."""
    outcome = evaluate(rows, f)
    signed = is_change(f)
    shown = outcome.text or format_value(outcome.value, f.format, signed=signed)
    if outcome.value is None and outcome.text is None:
        shown = "-"
    accept = f.accept
    if f.kind == "range" and accept is not None:
        text = f"{accept_text(accept, f.format)} for {format_value(f.options.get('share', 1.0), 'pct')} of points"
    elif accept is not None:
        text = accept_text(accept, f.format)
    elif f.kind == "dominant" and "group" not in f.options:
        text = f">= {format_value(f.options.get('share', 0.5), 'pct')} {f.options['bound']}-bound"
    elif "expect" in f.options:
        expect = f.options["expect"]
        text = str(expect) if f.kind == "trend" else "= " + _paper_text(replace(f, paper=None), signed)
    else:
        text = "-"
    return FindingOutcome(
        id=f.id, level=f.level, experiment=f.experiment, kind=f.kind, claim=f.claim, source=f.source,
        metric=f.metric, paper=f.paper, paper_text=_paper_text(f, signed), value=outcome.value, tool=shown,
        reproduced=bool(outcome.reproduced), accept=list(accept) if accept else None, accept_text=text,
        mechanism=f.mechanism, reason="" if outcome.reproduced else outcome.reason, detail=outcome.detail,
        note=f.note,
    )  # fmt: skip


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


def evaluate_study(study: Study, rows_by_key: dict[str, dict[str, Any]]) -> list[FindingOutcome]:
    """Every finding of ``study`` evaluated on the rows (by point key) of a run."""
    by_exp = experiment_rows(study, rows_by_key)
    return [outcome_row(f, by_exp[f.experiment]) for f in study.findings]


def run_study(
    study: Study,
    out_dir: str | Path,
    *,
    jobs: int | None = None,
    executor: str | Executor = "local",
    address: str | None = None,
    cache_dir: str | Path | None = None,
    retry_failed: bool = False,
    plots: bool = True,
    bar: Any = None,
) -> StudyResult:
    """Run every experiment's points (one sweep into ``out_dir``), evaluate the findings, write
    the findings tables and the plots. Ctrl-C keeps every finished point (rerun to resume)."""
    from dabench_ir.reproduce.render import write_findings
    from dabench_ir.sweep.results import read_point, write_table

    out = Path(out_dir)
    sweep = run_sweep(
        study.merged_spec(), out, jobs=jobs, executor=executor, address=address, cache_dir=cache_dir,
        retry_failed=retry_failed, plots=False, node_detail=False, bar=bar,
    )  # fmt: skip
    rows_by_key = {r["key"]: r for r in sweep.rows}
    files = list(sweep.files)
    by_exp = experiment_rows(study, rows_by_key)
    for name, rows in by_exp.items():
        folder = out / "experiments" / name
        folder.mkdir(parents=True, exist_ok=True)
        files += write_table(folder, [r for r in rows if r.get("status") != "missing"])
    outcomes = [outcome_row(f, by_exp[f.experiment]) for f in study.findings]
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
    return StudyResult(study, outcomes, sweep, files, out)
