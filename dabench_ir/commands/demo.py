"""`dabench-ir demo`: the whole job on embedded default models, written to ./dabench-report/.

GPT-2 small (12 layers, hidden 768, seq 1024, weight-free: the size DABench studied) is
exported on the fly and emulated on the three dataflow chips (WSE, RDU, IPU) side by side:
their Level-1 metrics (allocation, load imbalance, efficiency), the time grouped by module
role, the "why" lines, and each target's median validation error against published
measurements (`dabench_ir.validate`). The host CPU is measured in onnxruntime on a model
small enough to run (2 layers, hidden 128): a smaller model is no bar beside GPT-2, so the
throughput chart holds the targets that ran the one model, and the host is a panel of its
own with its model named. The output folder gets one HTML and JSON report per target, the
plots (PNG and SVG), and an index.html / compare.csv comparing the targets.
A target that fails with a UserError is recorded and skipped.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dabench_ir.commands.flags import add_quiet
from dabench_ir.errors import UserError
from dabench_ir.options import add_flag
from dabench_ir.progress import silent
from dabench_ir.targets import HOST, is_host

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_TARGETS",
    "DESCRIPTION",
    "HELP",
    "HOST_MODEL",
    "VALIDATION_NOTE",
    "DemoResult",
    "ValidationFigures",
    "add_arguments",
    "render_side_by_side",
    "run",
    "run_demo",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL: dict[str, Any] = {
    "family": "gpt2",
    "layers": 12,
    "hidden": 768,
    "heads": 12,
    "seq": 1024,
    "batch": 1,
    "vocab": 50257,
}
"""GPT-2 small, exported weight-free: the model the dataflow chips are emulated on."""

HOST_MODEL: dict[str, Any] = {
    "family": "gpt2",
    "layers": 2,
    "hidden": 128,
    "heads": 4,
    "seq": 64,
    "batch": 1,
    "vocab": 1024,
}
"""Small enough to run: the model the host CPU is measured (and emulated) on."""

DEFAULT_TARGETS = ("wse", "rdu", "ipu", HOST)


@dataclass
class DemoResult:
    """What a demo wrote: the folder, its index page, the reports and the failures."""

    folder: Path
    index: Path
    reports: dict[str, Any] = field(default_factory=dict)  # target -> Report
    errors: dict[str, str] = field(default_factory=dict)  # target -> one-line reason
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    validation: dict[str, ValidationFigures | None] = field(default_factory=dict)  # stem -> its errors (validate)
    validation_note: str = ""


HELP = "profile an embedded GPT-2 model on cpu, wse, rdu and ipu; write an HTML report folder"
DESCRIPTION = (
    "Export a small GPT-2-style decoder, measure it on the host CPU and emulate it on "
    "WSE, RDU and IPU, then write per-target HTML/JSON reports, plots and a comparison to DIR."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o", "--output", default="dabench-report", metavar="DIR", help="output folder (default ./dabench-report)"
    )
    add_flag(
        p,
        "--target",
        "-t",
        dest="targets",
        default=",".join(DEFAULT_TARGETS),
        deprecated=("--targets",),
        help=f"comma list of targets, as profile --target takes (default {','.join(DEFAULT_TARGETS)})",
    )
    p.add_argument("--model", metavar="MODEL.onnx", help="profile this model on every target instead of the defaults")
    p.add_argument("--no-measure", action="store_true", help="do not run the model in onnxruntime on the cpu target")
    p.add_argument(
        "--no-validate",
        action="store_true",
        help="do not show each target's median error against published measurements",
    )
    add_quiet(p, "no progress and no table; print only the index path")


def run(args: argparse.Namespace) -> int:
    from dabench_ir.progress import Progress
    from dabench_ir.run import resolve_target

    targets = [t.strip() for t in str(args.targets).split(",") if t.strip()]
    if not targets:
        raise UserError("--target: give at least one target, e.g. --target cpu,rdu")
    _check_inputs(args.output, args.model)
    for name in targets:  # a misspelt target is the user's mistake: exit 2 before any work, quiet or not
        try:
            resolve_target(name)
        except UserError as exc:
            raise UserError(f"--target {name}: {exc}") from None
    progress = Progress(quiet=args.quiet)
    result = run_demo(
        args.output,
        targets=targets,
        model=args.model,
        measure=not args.no_measure,
        validation=not args.no_validate,
        progress=progress,
    )
    progress.done()
    if not args.quiet:
        from dabench_ir.report.compare import render_compare

        print(render_compare(result.rows))
        print()
        print(render_side_by_side(result))
        for target, reason in result.errors.items():
            print(f"{target}: failed: {reason}")
        print(f"demo took {result.seconds:.1f} s; open the report:")
    print(result.index)
    return 0


def _check_inputs(output: str, model: str | None) -> None:
    """Refuse a bad folder or model up front (exit 2), not as an error file after the work."""
    from dabench_ir.fileio import check_output_dir, plan_outputs

    check_output_dir(output, "-o")
    plan_outputs([model] if model is not None else [], [], folders=[(output, "-o")])  # index.html, TARGET.*, plots/
    if model is not None:
        from dabench_ir.frontends.onnx import read_model

        read_model(model)  # a text file or a FIFO given as the model fails here


def _export(folder: Path, spec: dict[str, Any], name: str, weights: str, say: Any) -> Path:
    from dabench_ir.models import ModelConfig, export_model

    cfg = ModelConfig(**spec)
    path = folder / name
    say(f"exporting {cfg.family} ({cfg.layers} layers, hidden {cfg.hidden}, seq {cfg.seq}, weights {weights})")
    export_model(cfg, path, weights=weights)
    return path


def _refit(report: Any, name: str, say: Any) -> tuple[Any, Any]:
    """A target the default options do not fit on (GPT-2 small on one IPU) is placed again with
    the knob change that fits (`dabench_ir.advice.fitting_knob`: the variant run's own report);
    the report says so. Returns the report and, when it is still the one given (no change
    fits), the variant runs made for it, for its why lines to reuse."""
    from dabench_ir.advice import VariantRuns, fitting_knob
    from dabench_ir.report.why import change_text

    runs = VariantRuns(report, progress=lambda line: say(f"{name}: {line}"))
    found = fitting_knob(report, runs=runs)
    if found is None or found.report is None:
        return report, runs
    text = change_text(found.changes)
    say(f"{name}: does not fit with the defaults; placing with {text}")
    refit = found.report
    reason = report.failure.get("reason") if report.failure else ""
    refit.extra["demo_note"] = f"placed with {text}: with the defaults it does not fit ({reason})"
    refit.extra["demo_change"] = text  # the side-by-side table's "placed with" row
    return refit, None


@dataclass(frozen=True)
class ValidationFigures:
    """A target's median |relative error| against the published measurements `dabench-ir validate`
    runs: ``cross_validated`` (leave one source out, the figure to trust for a run nobody fitted to;
    ``compared`` quantities) and over ``all_points`` (points some parameter was fitted to included)."""

    cross_validated: float | None
    compared: int
    all_points: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cross_validated_median": self.cross_validated,
            "cross_validated_compared": self.compared,
            "all_points_median": self.all_points,
        }


VALIDATION_NOTE = (
    "median |relative error| over the published measurements of `dabench-ir validate`, cross-validated "
    "(each source predicted by the parameters refitted without it: the figure to trust), then over all "
    "points (in sample included)"
)


def _validation_figures(stems: dict[str, Any], say: Any) -> dict[str, ValidationFigures | None]:
    """Each emulated target's `ValidationFigures`; the one place the demo reads the validation module."""
    from dabench_ir.validate import load_catalog
    from dabench_ir.validate.crossval import validate_points

    points = load_catalog()
    out: dict[str, ValidationFigures | None] = {}
    for stem, report in stems.items():
        if report.target_obj is None or report.target_obj.kind == "cpu":
            continue
        name = report.target_obj.name
        say(f"{stem}: validating against published measurements, each source left out in turn")
        try:
            validation = validate_points(points, bundled=True, target=name)
            cv = validation.cross_validation.targets.get(name)
        except UserError as exc:
            logger.info("demo: no validation for %s: %s", stem, exc)
            out[stem] = None
            continue
        stats = cv.stats() if cv is not None else {}
        out[stem] = ValidationFigures(
            cross_validated=stats.get("median_abs_error"),
            compared=stats.get("compared", 0),
            all_points=(validation.summary().get(name) or {}).get("median_abs_error"),
        )
    return out


def run_demo(
    output: str | Path = "dabench-report",
    *,
    targets: list[str] | tuple[str, ...] = DEFAULT_TARGETS,
    model: str | Path | None = None,
    measure: bool = True,
    validation: bool = True,
    progress: Any = None,
) -> DemoResult:
    """Profile the defaults (GPT-2 small on the dataflow chips, the small model measured on the
    host) or ``model`` on every target, and write the report folder."""
    from dabench_ir.advice import advise
    from dabench_ir.fileio import write_output
    from dabench_ir.options import ProfileOptions
    from dabench_ir.pipeline import profile_targets
    from dabench_ir.report.compare import compare_reports, write_compare_csv, write_compare_json
    from dabench_ir.report.html import write_compare_html, write_html
    from dabench_ir.report.why import explain

    start = time.monotonic()
    say = progress or silent
    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"-o {folder}: exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    plot_dir = folder / "plots"
    if model is not None and not Path(model).is_file():
        raise UserError(f"--model {model}: no such file")
    result = DemoResult(folder=folder.resolve(), index=(folder / "index.html").resolve())
    host = [t for t in targets if is_host(t)] if model is None else []
    emulated = [t for t in targets if t not in host]
    outcomes: dict[str, Any] = {}
    if emulated:
        big = Path(model) if model is not None else _export(folder, DEFAULT_MODEL, "gpt2-small.onnx", "none", say)
        outcomes.update(
            profile_targets(
                str(big),
                emulated,
                ProfileOptions(),
                measure_on=lambda name: measure and is_host(name),
                keep_going=True,
                progress=say,
            )
        )  # costed once, placed on every target
    if host:
        small = _export(folder, HOST_MODEL, "host-model.onnx", "random", say)
        outcomes.update(
            profile_targets(
                str(small), host, ProfileOptions(), measure_on=lambda _n: measure, keep_going=True, progress=say
            )
        )
    for name in targets:
        stem = name.replace("/", "_").replace(".toml", "")
        (folder / f"{stem}.error.txt").unlink(missing_ok=True)
        report = outcomes[name]
        if isinstance(report, UserError):
            exc = report
            logger.info("demo: target %s failed: %s", name, exc)
            result.errors[name] = str(exc)
            write_output(folder / f"{stem}.error.txt", f"{exc}\n")
            continue
        watts = getattr(report.target_obj, "watts", None)
        if watts:
            report.extra["target_power_w"] = float(watts)
        runs = None
        if report.plan is not None and not report.plan.fits:
            report, runs = _refit(report, name, say)
        if report.plan is not None:
            advise(report, runs=runs, progress=lambda line, name=name: say(f"{name}: {line}"))
            explain(report)
        result.reports[stem] = report
    if validation and result.reports:
        result.validation, result.validation_note = _validation_figures(result.reports, say), VALIDATION_NOTE
    for stem, report in result.reports.items():
        errors = result.validation.get(stem)
        if errors is not None:
            report.extra["validation_abs_error"] = errors.to_dict()
        say(f"{stem}: writing report and plots")
        report.write_json(folder / f"{stem}.json")
        write_html(report, folder / f"{stem}.html", plot_dir=plot_dir, plot_stem=stem)
    say("comparing targets")
    stems = list(result.reports)
    result.rows = compare_reports(list(result.reports.values()))
    for row, stem in zip(result.rows, stems, strict=True):
        errors = result.validation.get(stem)
        row["validation_cv_median_abs_error"] = errors.cross_validated if errors else None
        row["validation_median_abs_error"] = errors.all_points if errors else None
    write_compare_csv(result.rows, folder / "compare.csv")
    write_compare_json(result.rows, folder / "compare.json")
    extra = _side_by_side_html(result) + _charts_html(result, stems, plot_dir)
    links = [[("report", f"{s}.html"), ("json", f"{s}.json")] for s in stems]
    what = "GPT-2 small (weight-free) on the dataflow chips; a 2-layer model measured on the host, charted apart"
    model_name = what if model is None else Path(model).name
    write_compare_html(
        result.rows,
        folder / "index.html",
        title=f"dabench-ir demo: {', '.join(targets)}",
        subtitle=f"{model_name} · {len(stems)} of {len(targets)} targets profiled · comparison in compare.csv",
        links=links,
        errors=result.errors,
        extra_html=extra,
    )
    result.seconds = time.monotonic() - start
    return result


def _model_text(model: dict[str, Any]) -> str:
    """A report's model in words (its ``model`` table): name, layers and parameters."""
    from dabench_ir.report.table import human

    name = model.get("preset") or model.get("name") or "model"
    return f"{name} ({model.get('layers')} layers, {human(model.get('params'))} params)"


def _charts_html(result: DemoResult, stems: list[str], plot_dir: Path) -> str:
    """Throughput and efficiency, one chart per model: the targets that ran the same model share
    a chart (``plots/compare.png``, the most targets first), each other model gets its own panel
    named after it (``plots/compare-STEM.png``); never a small model's bar beside a large one's."""
    from dabench_ir.report.html import escape, figure_html
    from dabench_ir.report.plots import compare_figure, save_figure

    groups: dict[str, list[int]] = {}
    for i, stem in enumerate(stems):
        groups.setdefault(_model_text(result.reports[stem].model), []).append(i)
    out = ""
    for n, (named, rows) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
        fig = compare_figure([result.rows[i] for i in rows])
        if fig is None:
            continue
        plot_dir.mkdir(exist_ok=True)
        base = "compare" if n == 0 else f"compare-{stems[rows[0]]}"
        save_figure(fig, plot_dir / f"{base}.png")
        save_figure(fig, plot_dir / f"{base}.svg")
        who = ", ".join(stems[i] for i in rows)
        note = (
            ""
            if n == 0
            else '<p class="note">A smaller model than the chart above: its throughput is not '
            "comparable with theirs.</p>"
        )
        out += (
            f"<section><h2>Throughput and efficiency: {escape(named)}</h2>{note}"
            f"{figure_html(fig, f'{named} on {who}; colour: dominant bound class')}</section>"
        )
    return out


_SIDE_ROLES = 8
_FIXED_ROWS = 8  # model, step time, throughput, allocation, load imbalance, efficiency, validation, placed with


def _side_by_side(result: DemoResult) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: Level-1 metrics, validation error, the knob the demo applied to make a
    target fit ("placed with": "defaults" when none), then the top roles' shares per target."""
    from dabench_ir.report.attribution import role_rows
    from dabench_ir.report.table import human, percent, seconds

    stems = list(result.reports)
    reports = [result.reports[s] for s in stems]
    headers = [""] + [f"{s} ({(r.target or {}).get('name', '-')})" for s, r in zip(stems, reports, strict=True)]

    rows = [
        ["model"] + [_model_text(r.model) for r in reports],
        ["step time"] + [seconds(r.totals.get("time_s")) for r in reports],
        ["throughput"] + [human(r.totals.get("throughput_samples_per_s"), "samples/s") for r in reports],
        ["allocation"] + [percent(r.metrics.get("allocation_ratio")) for r in reports],
        ["load imbalance"] + [_fmt(r.metrics.get("load_imbalance")) for r in reports],
        ["efficiency"] + [percent(r.metrics.get("compute_efficiency")) for r in reports],
        ["validation |error|"] + [_validation_cell(result, s, r) for s, r in zip(stems, reports, strict=True)],
        ["placed with"] + [str(r.extra.get("demo_change") or "defaults") for r in reports],
    ]
    per = [{x["role"]: x for x in role_rows(r)} for r in reports]
    ranked: dict[str, float] = {}
    for table in per:
        for role, x in table.items():
            ranked[role] = max(ranked.get(role, 0.0), x["share"] or 0.0)
    for role in sorted(ranked, key=lambda k: -ranked[k])[:_SIDE_ROLES]:
        cells = []
        for table in per:
            x = table.get(role)
            cells.append("-" if x is None else f"{percent(x['share'])} {x['bound'] or ''}".strip())
        rows.append([role, *cells])
    return headers, rows


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def _validation_cell(result: DemoResult, stem: str, report: Any) -> str:
    """The target's median validation errors, cross-validated then over all points; the measured
    host run says its own instead."""
    from dabench_ir.report.table import percent

    if report.measured_timeline is not None or report.extra.get("measurement"):
        err = (report.metrics.get("prediction_error") or {}).get("end_to_end_rel_error")
        return "measured" if err is None else f"{percent(abs(err))} (measured here)"
    errors = result.validation.get(stem)
    if errors is None:
        return "-"
    return f"{percent(errors.cross_validated)} cv, {percent(errors.all_points)} all"


def render_side_by_side(result: DemoResult) -> str:
    """The targets side by side: Level-1 metrics, validation error and the grouped attribution (text)."""
    if not result.reports:
        return ""
    headers, rows = _side_by_side(result)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows[:_FIXED_ROWS]]
    out.append(line(["share of time by module role (bound)", *[""] * (len(headers) - 1)]))
    out += [line(r) for r in rows[_FIXED_ROWS:]]
    for stem, report in result.reports.items():
        if report.extra.get("demo_note"):
            out.append(f"{stem}: {report.extra['demo_note']}")
        if report.why:
            out.append(f"why on {stem}: {report.why[0]['text']}")
    if result.validation_note:
        out.append(f"validation |error|: {result.validation_note}")
    return "\n".join(out)


def _side_by_side_html(result: DemoResult) -> str:
    if not result.reports:
        return ""
    from dabench_ir.report.html import escape, table_html

    headers, rows = _side_by_side(result)
    why = "".join(
        f"<li><b>{escape(s)}</b>: {escape(r.why[0]['text'])}</li>" for s, r in result.reports.items() if r.why
    )
    note = f'<p class="note">validation |error|: {escape(result.validation_note)}</p>' if result.validation_note else ""
    placed = "".join(
        f"<li><b>{escape(s)}</b>: {escape(r.extra['demo_note'])}</li>"
        for s, r in result.reports.items()
        if r.extra.get("demo_note")
    )  # a knob the demo applied to make a target fit
    return (
        "<section><h2>Side by side: Level-1 metrics and time by module role</h2>"
        + (f'<h3>Not the defaults</h3><ul class="note">{placed}</ul>' if placed else "")
        + table_html(headers, rows, set(range(1, len(headers))))
        + (f"<h3>Why</h3><ul>{why}</ul>" if why else "")
        + note
        + "</section>"
    )
