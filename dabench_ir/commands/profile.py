"""`dabench-ir profile MODEL`: cost every node, place it on a target, report the bottlenecks."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dabench_ir.commands.flags import add_outputs, add_quiet, check_top, refuse_uncounted, write_given
from dabench_ir.errors import UserError
from dabench_ir.options import (
    PROFILE,
    SHARING_KNOBS,
    ScaleOptions,
    add_knob_arguments,
    check_shared,
    knob_values,
    options_from_args,
)

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


HELP = "cost, place and time a model on a target"
DESCRIPTION = (
    "Cost every node of MODEL (.onnx or .mlir), optionally place it on a target "
    "(emulated) or run it in onnxruntime (--measure), and attribute the time per node."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        metavar="MODEL",
        help="an .onnx or .mlir file, or a preset name (exported weight-free once, then cached; "
        "see `dabench-ir export --list-presets`)",
    )
    p.add_argument("--target", "-t", help="cpu|wse|rdu|ipu|a100|h100|h200, a target name, or a path to a target .toml")
    p.add_argument("--cross-check", action="store_true", help="compare ONNX-rule and linalg counts per node")
    add_knob_arguments(p, PROFILE)
    o = p.add_argument_group("output")
    o.add_argument("--top", type=int, default=20, help="rows in the node table (0: all)")
    o.add_argument("--sort", choices=["time", "flops", "energy"], help="rank rows by (default: time when timed)")
    o.add_argument(
        "--by",
        choices=["role", "node"],
        default="role",
        help="group the table by module role across layers (default), or show single nodes",
    )
    add_outputs(
        o,
        json="write the report as JSON (schema dabench-ir/report/v1); '-' writes it to stdout. With several "
        "targets: F is the comparison and F-TARGET.json each report, or a folder DIR/ gets DIR/TARGET.json "
        "and DIR/compare.json (the same for --csv, --html)",
        csv="write one row per node and per overhead, with model and target columns "
        "(and F's .roles.csv: one row per module role)",
        html="write a self-contained HTML report (its role and node tables as --top, --sort and --by give the text's)",
        trace="write the timeline as a Chrome trace (Perfetto), one track per unit; several targets: one file, "
        "a process per target",
        plots="write the roofline, per-layer and predicted-vs-measured plots (PNG, SVG) into folder DIR "
        "(made if missing; its parent must exist)",
        annotate="write the model with per-node annotations (Netron); with several targets, F's stem + '-TARGET' + "
        "F's suffix for each target, or DIR/TARGET.onnx for a folder DIR/",
    )
    o.add_argument("--no-color", action="store_true", help="no colour in the tables (the default colours a terminal)")
    add_quiet(o, "no progress, no tables (cross-check included)")
    o.add_argument(
        "--strict", action="store_true", help="exit 2 when any node has no cost rule (estimated or unattributed)"
    )


def run(args: argparse.Namespace) -> int:
    from dabench_ir.progress import Progress

    opts = options_from_args(args, ScaleOptions, PROFILE)  # checked once; the run resolves what was given
    given = knob_values(args, PROFILE)
    _check_outputs(args)
    _check_request(args, opts)
    to_stdout = [f"--{flag}" for flag in _OUTPUTS if getattr(args, flag, None) == "-"]
    if len(to_stdout) > 1:
        raise UserError(f"{' and '.join(to_stdout)}: only one output can go to stdout ('-')")
    if to_stdout and to_stdout[0] != "--json":
        raise UserError(f"{to_stdout[0]} -: only --json can be written to stdout; give a file name")
    progress = Progress(quiet=args.quiet)
    if opts.scenario:  # --scenario generate: prefill + decode of a request batch
        from dabench_ir.scenario import run_scenario

        return run_scenario(args, opts, progress)
    if args.target is not None and "," in args.target:
        names = [t.strip() for t in args.target.split(",") if t.strip()]
        if not names:
            raise UserError(f"--target {args.target!r}: no target named; give e.g. --target wse,rdu")
        return _compare_targets(args, names, progress, given)
    from dabench_ir.pipeline import run_profile

    report = run_profile(args.model, args.target, given, progress=progress)
    if report.plan is not None:
        from dabench_ir.advice import advise
        from dabench_ir.report.why import explain

        advise(report, progress=progress)  # one variant run per knob change (dabench_ir.run.execute)
        explain(report)
    progress.done()
    return _after_profile(args, report, progress)


def _compare_targets(args: argparse.Namespace, targets: list[str], progress, given: dict) -> int:
    """``--target wse,rdu,ipu``: the same model on each target, side by side; costed once, placed many
    times. Each output flag gets the comparison and one file per target (see `_per_target_path`), but
    --trace: one trace, a process per target."""
    from dabench_ir.advice import advise
    from dabench_ir.pipeline import profile_targets
    from dabench_ir.report.compare import compare_reports, render_compare, write_compare_csv, write_compare_json
    from dabench_ir.report.html import write_compare_html
    from dabench_ir.report.trace import write_targets_trace
    from dabench_ir.report.why import explain
    from dabench_ir.run import check_target

    if args.json == "-":
        raise UserError("--json -: several targets give several reports; give a folder (--json DIR/) or a file name")
    for name in targets:  # every name is checked before any work
        check_target(name)
    reports = profile_targets(args.model, targets, given, progress=progress)
    for name, report in reports.items():
        if report.plan is not None:
            advise(report, progress=lambda line, name=name: progress(f"{name}: {line}"))
            explain(report)
    progress.done()
    rows = compare_reports(list(reports.values()))
    written = write_given(
        args,
        {
            "json": lambda path: write_compare_json(rows, _compare_path(path, ".json")),
            "csv": lambda path: write_compare_csv(rows, _compare_path(path, ".csv")),
            "html": lambda path: write_compare_html(rows, _compare_path(path, ".html")),
            "trace": lambda path: write_targets_trace(reports, _trace_path(path)),  # one trace, a process per target
        },
    )
    for name, report in reports.items():
        per = {
            flag: _per_target_path(getattr(args, flag), name, _SUFFIX.get(flag, "." + flag))
            for flag in ("json", "csv", "html", "annotate")
            if getattr(args, flag)
        }
        if args.plots:
            per["plots"] = args.plots
            per["stem"] = _plot_stem(args.model, name)
        written += _write_report(report, args, **per)
    if not args.quiet:
        print(render_compare(rows))
        for path in written:
            print(f"wrote {path}")
    return 0


_SUFFIX = {"trace": ".trace.json", "annotate": ".onnx"}
"""A per-target file's suffix where it is not the flag's name (a folder given: DIR/TARGET + suffix)."""


def _is_folder(path: str) -> bool:
    return path.endswith(("/", "\\")) or os.path.isdir(path)  # os.path: an over-long name is no folder


def _compare_path(path: str, suffix: str) -> Path:
    """Where the comparison goes: the file given, or DIR/compare.EXT."""
    if _is_folder(path):
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path) / f"compare{suffix}"
    return Path(path)


def _trace_path(path: str) -> Path:
    """The one trace of several targets: the file given, or DIR/trace.json."""
    if _is_folder(path):
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path) / "trace.json"
    return Path(path)


def _per_target_path(path: str, target: str, suffix: str) -> Path:
    """One target's file: DIR/TARGET.EXT for a folder, else F's stem + '-TARGET' + F's suffix. Makes no
    folder: `_planned_outputs` names the files before any check, and `_check_outputs` makes DIR
    (its parent must exist) once every check passed."""
    stem = Path(target).stem if target.endswith(".toml") else target.replace("/", "_")
    if _is_folder(path):
        return Path(path) / f"{stem}{suffix}"
    p = Path(path)
    return p.with_name(f"{p.stem}-{stem}{p.suffix or suffix}")


def _after_profile(args: argparse.Namespace, report, progress) -> int:
    from dabench_ir.report import render_table

    if args.cross_check:
        from dabench_ir.crosscheck import cross_check, render_cross_check
        from dabench_ir.pipeline import analyze

        progress("cross-checking against linalg")
        linalg = report.run.linalg  # how the report was costed: the other side is the other path
        other = analyze(args.model, dims=report.config["dims"], via="onnx" if linalg else "mlir")
        onnx_graph, mlir_graph = (other, report.graph) if linalg else (report.graph, other)
        progress.done()
        check = cross_check(onnx_graph, mlir_graph)
        if not args.quiet:
            print(render_cross_check(check))
    written = _write_report(report, args, **{flag: getattr(args, flag) for flag in _OUTPUTS})
    if not args.quiet:
        print(render_table(report, top=args.top, color=False if args.no_color else None, sort=args.sort, by=args.by))
        for path in written:
            print(f"wrote {path}")
    refuse_uncounted([report], strict=args.strict)
    return 0


_OUTPUTS = ("json", "csv", "html", "trace", "annotate", "plots")


def _check_outputs(args: argparse.Namespace) -> None:
    """Fail before the work, not after, when an output cannot be written (dabench_ir.fileio)."""
    import os

    from dabench_ir.fileio import check_input_file, plan_outputs

    models = [args.model] if os.path.lexists(args.model) else [m for m in args.model.split(",") if m]  # prefill,decode
    if models == [args.model] and not os.path.lexists(args.model):
        from dabench_ir.models.presets import names_preset  # a file needs no preset catalogue

        models = [] if names_preset(args.model) else models  # a preset: the run exports it (pipeline.load_graph)
    for model in models:
        check_input_file(model, "MODEL")
    check_top(args.top)
    creates = [(args.plots, "--plots")] if args.plots is not None else []
    several = bool(args.target) and "," in args.target  # one file per target: --annotate may name a folder too
    folders = [
        (getattr(args, f), f"--{f}")
        for f in ("json", "csv", "html", "trace", *(("annotate",) if several else ()))
        if getattr(args, f) not in (None, "-")
    ]
    creates += [(path, flag) for path, flag in folders if _is_folder(path)]
    from dabench_ir.targets import target_files

    inputs = [*models, *target_files(args.target)]  # a target file is an input too
    plan_outputs(inputs, _planned_outputs(args), creates=creates, allow_stdout=True)


def _planned_outputs(args: argparse.Namespace) -> list[tuple[Path | str, str]]:
    """Every file this run writes, with the flag that asks for it (one target or several)."""
    names = [t.strip() for t in args.target.split(",") if t.strip()] if args.target and "," in args.target else []
    out: list[tuple[Path | str, str]] = []
    for flag in ("json", "csv", "html", "trace", "annotate"):
        path = getattr(args, flag)
        if path is None:
            continue
        suffix = _SUFFIX.get(flag, "." + flag)
        files = [path] if not names else [_per_target_path(path, n, suffix) for n in names]
        if names and flag == "trace":
            files = [Path(path) / "trace.json" if _is_folder(path) else Path(path)]
        if names and flag in ("json", "csv", "html"):
            files.append(Path(path) / f"compare{suffix}" if _is_folder(path) else Path(path))
        for f in files:
            out.append((f, f"--{flag}"))
            if flag == "csv" and not (names and f == Path(path)):  # the comparison CSV has no roles table
                out.append((_roles_path(f), "--csv (its .roles.csv)"))
    if args.plots is not None:
        from dabench_ir.report.plots import PLOT_FORMATS, PLOT_NAMES, plot_path

        stems = [_plot_stem(args.model, n) for n in names] if names else [Path(args.model).stem]
        out += [
            (plot_path(args.plots, stem, name, fmt), "--plots")
            for stem in stems
            for name in PLOT_NAMES
            for fmt in PLOT_FORMATS
        ]
    return out


def _roles_path(csv_path: str | Path) -> Path:
    """The per-role table written beside a per-node CSV: F's stem + ``.roles.csv``."""
    p = Path(csv_path)
    return p.with_name(p.stem + ".roles.csv")


def _plot_stem(model: str, target: str) -> str:
    return f"{Path(model).stem}-{Path(target).stem if target.endswith('.toml') else target}"


def _check_request(args: argparse.Namespace, opts: ScaleOptions) -> None:
    """Refuse, before any work, what cannot give a meaningful answer."""
    check_shared(opts.chips, {name: getattr(args, name, None) for name in SHARING_KNOBS})
    if args.cross_check and Path(args.model).suffix.lower() == ".mlir":
        raise UserError(
            "--cross-check compares the ONNX rules with the linalg counts; an .mlir input has only the linalg side. "
            "Give the .onnx file it came from (add --via mlir to profile it through linalg)"
        )
    if opts.measure and args.target:
        from dabench_ir.execute import measure_provider
        from dabench_ir.pipeline import resolve_target

        for name in (t.strip() for t in args.target.split(",") if t.strip()):
            target = resolve_target(name, opts.threads)
            measure_provider(target.kind, name)  # the CPU, or a GPU on the CUDA provider; else one line, exit 2


def _write_report(report, args: argparse.Namespace, **paths: str | Path | None) -> list[str]:
    """Write each output given in ``paths`` (json, csv, html, trace, plots, annotate); '-' is stdout.
    ``stem`` names the plot files (default: the model's file name)."""
    written = []
    if paths.get("json") == "-":
        sys.stdout.write(report.to_json(indent=1 if len(report.nodes) <= 300 else None) + "\n")
    elif paths.get("json"):
        written.append(str(report.write_json(paths["json"])))
    if paths.get("csv"):
        csv_path = Path(paths["csv"])
        written.append(str(report.write_csv(csv_path)))
        written.append(str(report.write_roles_csv(_roles_path(csv_path))))
    if paths.get("trace"):
        if report.timeline is None:
            raise UserError("--trace needs a timeline: give --target or --measure")
        from dabench_ir.report.trace import write_report_trace

        written.append(str(write_report_trace(report, paths["trace"])))
    if paths.get("html"):
        from dabench_ir.report.html import write_html

        options = {"top": args.top, "sort": args.sort, "by": args.by}  # the tables as the text shows them
        written.append(str(write_html(report, paths["html"], **options)))
    if paths.get("plots"):
        from dabench_ir.report.plots import write_plots

        written.extend(
            str(p) for p in write_plots(report, paths["plots"], stem=str(paths.get("stem") or Path(args.model).stem))
        )
    if paths.get("annotate"):
        from dabench_ir.annotate import annotate_report

        source = args.model if os.path.lexists(args.model) else report.graph.path  # a preset: its cached export
        written.append(str(annotate_report(source, report, paths["annotate"])))
    if written and not args.quiet:
        sys.stdout.flush()
    return written
