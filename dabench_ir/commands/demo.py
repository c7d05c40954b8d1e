"""`dabench-ir demo`: the whole job on an embedded default model, written to ./dabench-report/.

A small GPT-2-style decoder is exported on the fly, measured on the host CPU (onnxruntime,
next to the CPU emulation) and emulated on WSE, RDU and IPU. The output folder gets one
HTML and JSON report per target, the plots (PNG and SVG), and an index.html / compare.csv
comparing the targets. A target that fails with a UserError is recorded and skipped.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError

__all__ = ["DEFAULT_MODEL", "DEFAULT_TARGETS", "DemoResult", "register", "run", "run_demo"]

logger = logging.getLogger(__name__)

DEFAULT_MODEL: dict[str, Any] = {
    "family": "gpt2",
    "layers": 2,
    "hidden": 128,
    "heads": 4,
    "seq": 64,
    "batch": 1,
    "vocab": 1024,
}
"""The embedded default: small enough to export, measure and emulate in well under a minute."""

DEFAULT_TARGETS = ("cpu", "wse", "rdu", "ipu")


@dataclass
class DemoResult:
    """What a demo wrote: the folder, its index page, the reports and the failures."""

    folder: Path
    index: Path
    reports: dict[str, Any] = field(default_factory=dict)  # target -> Report
    errors: dict[str, str] = field(default_factory=dict)  # target -> one-line reason
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="profile an embedded GPT-2 model on cpu, wse, rdu and ipu; write an HTML report folder",
        description="Export a small GPT-2-style decoder, measure it on the host CPU and emulate it on "
        "WSE, RDU and IPU, then write per-target HTML/JSON reports, plots and a comparison to DIR.",
    )
    p.add_argument(
        "-o", "--output", default="dabench-report", metavar="DIR", help="output folder (default ./dabench-report)"
    )
    p.add_argument(
        "--targets", default=",".join(DEFAULT_TARGETS), help="comma list of targets (default cpu,wse,rdu,ipu)"
    )
    p.add_argument("--model", metavar="MODEL.onnx", help="profile this model instead of the embedded default")
    p.add_argument("--no-measure", action="store_true", help="do not run the model in onnxruntime on the cpu target")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress and no table; print only the index path")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dabench_ir.progress import Progress

    targets = [t.strip() for t in str(args.targets).split(",") if t.strip()]
    if not targets:
        raise UserError("--targets: give at least one target, e.g. --targets cpu,rdu")
    _check_inputs(args.output, targets, args.model)
    progress = Progress(quiet=args.quiet)
    result = run_demo(args.output, targets=targets, model=args.model, measure=not args.no_measure, progress=progress)
    progress.done()
    if not args.quiet:
        from dabench_ir.report.compare import render_compare

        print(render_compare(result.rows))
        for target, reason in result.errors.items():
            print(f"{target}: failed: {reason}")
        print(f"demo took {result.seconds:.1f} s; open the report:")
    print(result.index)
    return 0


def _check_inputs(output: str, targets: list[str], model: str | None) -> None:
    """Refuse a bad folder, target name or model up front (exit 2), not as an error file after the work."""
    from dabench_ir.fileio import check_output_dir
    from dabench_ir.targets import load_target

    check_output_dir(output, "-o")
    for name in targets:
        if name.strip().lower() != "cpu":  # cpu is the host, calibrated when profiled
            load_target(name)
    if model is not None:
        from dabench_ir.frontends.onnx import read_model

        read_model(model)  # a text file or a FIFO given as the model fails here


def _export_default(folder: Path, say: Any) -> Path:
    from dabench_ir.models import ModelConfig, export_model

    cfg = ModelConfig(**DEFAULT_MODEL)
    path = folder / "model.onnx"
    say(f"exporting the default model ({cfg.family}, {cfg.layers} layers, hidden {cfg.hidden}, seq {cfg.seq})")
    export_model(cfg, path, weights="random")
    return path


def run_demo(
    output: str | Path = "dabench-report",
    *,
    targets: list[str] | tuple[str, ...] = DEFAULT_TARGETS,
    model: str | Path | None = None,
    measure: bool = True,
    progress: Any = None,
) -> DemoResult:
    """Profile ``model`` (default: the embedded GPT-2) on ``targets`` and write the report folder."""
    from dabench_ir.fileio import write_output
    from dabench_ir.options import ProfileOptions
    from dabench_ir.pipeline import profile_targets
    from dabench_ir.report.compare import compare_reports, write_compare_csv, write_compare_json
    from dabench_ir.report.html import figure_html, write_compare_html, write_html

    start = time.monotonic()
    say = progress or (lambda _msg: None)
    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"-o {folder}: exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    plot_dir = folder / "plots"
    model_path = Path(model) if model is not None else _export_default(folder, say)
    if not model_path.is_file():
        raise UserError(f"--model {model_path}: no such file")
    result = DemoResult(folder=folder.resolve(), index=(folder / "index.html").resolve())
    outcomes = profile_targets(
        str(model_path),
        list(targets),
        ProfileOptions(),
        measure_on=lambda name: measure and name == "cpu",
        keep_going=True,
        progress=say,
    )  # costed once, placed on every target
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
        say(f"{name}: writing report and plots")
        report.write_json(folder / f"{stem}.json")
        write_html(report, folder / f"{stem}.html", plot_dir=plot_dir, plot_stem=stem)
        result.reports[stem] = report
    say("comparing targets")
    stems = list(result.reports)
    result.rows = compare_reports(list(result.reports.values()))
    write_compare_csv(result.rows, folder / "compare.csv")
    write_compare_json(result.rows, folder / "compare.json")
    extra = ""
    if result.rows:
        from dabench_ir.report.plots import compare_figure, save_figure

        fig = compare_figure(result.rows)
        if fig is not None:
            plot_dir.mkdir(exist_ok=True)
            save_figure(fig, plot_dir / "compare.png")
            save_figure(fig, plot_dir / "compare.svg")
            extra = f"<section><h2>Throughput and efficiency</h2>{figure_html(fig, 'Per target; colour: dominant bound class')}</section>"
    links = [[("report", f"{s}.html"), ("json", f"{s}.json")] for s in stems]
    model_name = "default GPT-2 decoder" if model is None else model_path.name
    write_compare_html(
        result.rows,
        folder / "index.html",
        title=f"dabench-ir demo: {model_name} on {', '.join(targets)}",
        subtitle=f"model {model_path.name} · {len(stems)} of {len(targets)} targets profiled · comparison in compare.csv",
        links=links,
        errors=result.errors,
        extra_html=extra,
    )
    result.seconds = time.monotonic() - start
    return result
