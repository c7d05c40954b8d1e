"""`dabench-ir profile MODEL`: cost every node, place it on a target, report the bottlenecks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dabench_ir.errors import UserError
from dabench_ir.options import PROFILE, ProfileOptions, add_knob_arguments, options_from_args

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="cost, place and time a model on a target",
        description="Cost every node of MODEL (.onnx or .mlir), optionally place it on a target "
        "(emulated) or run it in onnxruntime (--measure), and attribute the time per node.",
    )
    p.add_argument("model", metavar="MODEL", help="an .onnx or .mlir file")
    p.add_argument("--target", "-t", help="cpu|wse|rdu|ipu|a100|h100|h200, a target name, or a path to a target .toml")
    p.add_argument("--cross-check", action="store_true", help="compare ONNX-rule and linalg counts per node")
    add_knob_arguments(p, PROFILE)
    o = p.add_argument_group("output")
    o.add_argument("--top", type=int, default=20, help="rows in the node table (0: all)")
    o.add_argument("--sort", choices=["time", "flops", "energy"], help="rank nodes by (default: time when timed)")
    o.add_argument("--json", metavar="F", help="write the report as JSON (schema dabench-ir/report/v1)")
    o.add_argument("--csv", metavar="F", help="write one row per node")
    o.add_argument("--html", metavar="F", help="write a self-contained HTML report")
    o.add_argument("--trace", metavar="F", help="write the timeline as a Chrome trace (Perfetto)")
    o.add_argument(
        "--plots", metavar="DIR", help="write the roofline, per-layer and predicted-vs-measured plots (PNG, SVG)"
    )
    o.add_argument("--annotate", metavar="F", help="write the model with per-node annotations")
    o.add_argument("--no-color", action="store_true")
    o.add_argument("--quiet", "-q", action="store_true", help="no progress, no table")
    o.add_argument("--strict", action="store_true", help="exit 2 when any node has no cost rule (estimated or unattributed)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dabench_ir.progress import Progress

    opts = options_from_args(args, ProfileOptions, PROFILE)
    _check_outputs(args)
    progress = Progress(quiet=args.quiet)
    if args.target and "," in args.target:
        return _compare_targets(args, [t.strip() for t in args.target.split(",") if t.strip()], progress, opts)
    from dabench_ir.pipeline import run_profile

    report = run_profile(args.model, args.target, opts, progress=progress)
    progress.done()
    return _after_profile(args, report, progress)


def _compare_targets(args: argparse.Namespace, targets: list[str], progress, opts: ProfileOptions) -> int:
    """``--target wse,rdu,ipu``: the same model on each target, side by side; costed once, placed many times."""
    from dabench_ir.pipeline import profile_targets, resolve_target
    from dabench_ir.report.compare import compare_reports, render_compare, write_compare_json

    for name in targets:  # every name is checked before any work
        resolve_target(name, opts)
    reports = list(profile_targets(args.model, targets, opts, progress=progress).values())
    progress.done()
    rows = compare_reports(reports)
    written = []
    if args.json:
        written.append(str(write_compare_json(rows, args.json)))
    if args.csv:
        from dabench_ir.report.compare import write_compare_csv

        written.append(str(write_compare_csv(rows, args.csv)))
    if args.html:
        from dabench_ir.report.html import write_compare_html

        written.append(str(write_compare_html(rows, args.html)))
    if not args.quiet:
        print(render_compare(rows))
        for path in written:
            print(f"wrote {path}")
    return 0


def _after_profile(args: argparse.Namespace, report, progress) -> int:
    from dabench_ir.report import render_table

    if args.cross_check:
        from dabench_ir.crosscheck import cross_check, render_cross_check
        from dabench_ir.pipeline import analyze

        progress("cross-checking against linalg")
        other = analyze(args.model, dims=report.config["dims"], via="onnx" if args.via == "mlir" else "mlir")
        onnx_graph, mlir_graph = (report.graph, other) if args.via == "onnx" else (other, report.graph)
        progress.done()
        print(render_cross_check(cross_check(onnx_graph, mlir_graph)))
    written = _write_outputs(args, report)
    if not args.quiet:
        print(render_table(report, top=args.top, color=False if args.no_color else None, sort=args.sort))
        for path in written:
            print(f"wrote {path}")
    uncounted = report.unattributed + list(report.extra.get("estimated") or [])  # estimated: no rule
    if args.strict and uncounted:
        first = uncounted[0]
        raise UserError(
            f"{len(uncounted)} node(s) without a cost rule (first: {first['name']}: {first['reason']}); "
            "drop --strict to report them and go on"
        )
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Fail before the work, not after, when an output cannot be written."""
    for flag in ("json", "csv", "html", "trace", "annotate"):
        path = getattr(args, flag)
        if path is None:
            continue
        parent = Path(path).resolve().parent
        if not parent.is_dir():
            raise UserError(f"--{flag} {path}: folder {parent} does not exist")


def _write_outputs(args: argparse.Namespace, report) -> list[str]:
    written = []
    if args.json:
        written.append(str(report.write_json(args.json)))
    if args.csv:
        written.append(str(report.write_csv(args.csv)))
    if args.trace:
        if report.timeline is None:
            raise UserError("--trace needs a timeline: give --target or --measure")
        from dabench_ir.report.trace import write_chrome_trace

        written.append(str(write_chrome_trace(report.timeline, report.graph, args.trace)))
    if args.html:
        from dabench_ir.report.html import write_html

        written.append(str(write_html(report, args.html)))
    if args.plots:
        from dabench_ir.report.plots import write_plots

        written.extend(str(p) for p in write_plots(report, args.plots, stem=Path(args.model).stem))
    if args.annotate:
        from dabench_ir.annotate import annotate

        extra = {
            n.name: {"dabench.unit": n.unit, "dabench.time_s": n.time_s} for n in report.nodes if n.time_s is not None
        }
        written.append(str(annotate(args.model, report.graph, args.annotate, extra)))
    if written and not args.quiet:
        sys.stdout.flush()
    return written
