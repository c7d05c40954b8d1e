"""`dabench-ir profile MODEL`: cost every node, place it on a target, report the bottlenecks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dabench_ir.errors import UserError

__all__ = ["parse_dims", "register", "run"]


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """``["batch=1", "seq=128"]`` -> ``{"batch": 1, "seq": 128}``, or one clear error."""
    dims: dict[str, int] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name or not value.strip().isdigit() or int(value) <= 0:
            raise UserError(f"malformed --dim {item!r}: expected NAME=VALUE with a positive integer, e.g. --dim batch=1")
        dims[name] = int(value)
    return dims


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="cost, place and time a model on a target",
        description="Cost every node of MODEL (.onnx or .mlir), optionally place it on a target "
        "(emulated) or run it in onnxruntime (--measure), and attribute the time per node.",
    )
    p.add_argument("model", metavar="MODEL", help="an .onnx or .mlir file")
    p.add_argument("--target", "-t", help="cpu|wse|rdu|ipu|a100|h100|h200, a target name, or a path to a target .toml")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE", help="bind a symbolic dim (repeatable)")
    p.add_argument("--batch", type=int, help="batch size (binds the model's batch dim when symbolic)")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16", "mixed"], help="rewrite dtypes before costing")
    p.add_argument("--mode", choices=["inference", "train"], default="inference")
    p.add_argument("--recompute", action="store_true", help="train mode: recompute activations in backward")
    p.add_argument("--via", choices=["onnx", "mlir"], default="onnx", help="cost from ONNX rules or from linalg")
    p.add_argument("--cross-check", action="store_true", help="compare ONNX-rule and linalg counts per node")
    g = p.add_argument_group("target options")
    g.add_argument("--opt-level", choices=["O0", "O1", "O3"], default="O1", help="RDU compiler fusion level")
    g.add_argument("--wse-mode", choices=["pipelined", "streaming", "auto"], default="auto")
    g.add_argument("--replicas", help="WSE on-wafer replicas: N or 'auto'")
    g.add_argument("--ipus", type=int, default=1, help="IPUs to pipeline over")
    g.add_argument("--micro-batches", type=int, help="micro-batches per step where the target pipelines")
    m = p.add_argument_group("measurement (onnxruntime)")
    m.add_argument("--measure", action="store_true", help="run the model in onnxruntime and time every node")
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--repeat", type=int, default=5)
    m.add_argument("--threads", type=int, help="onnxruntime intra-op threads")
    m.add_argument("--ort-opt", action="store_true", help="keep onnxruntime graph optimisation on")
    m.add_argument("--max-weight-bytes", type=int, default=4 << 30, help="cap on synthesised weights")
    o = p.add_argument_group("output")
    o.add_argument("--top", type=int, default=20, help="rows in the node table (0: all)")
    o.add_argument("--sort", choices=["time", "flops", "energy"], help="rank nodes by (default: time when timed)")
    o.add_argument("--json", metavar="F", help="write the report as JSON (schema dabench-ir/report/v1)")
    o.add_argument("--csv", metavar="F", help="write one row per node")
    o.add_argument("--html", metavar="F", help="write a self-contained HTML report")
    o.add_argument("--trace", metavar="F", help="write the timeline as a Chrome trace (Perfetto)")
    o.add_argument("--plots", metavar="DIR", help="write the roofline, per-layer and predicted-vs-measured plots (PNG, SVG)")
    o.add_argument("--annotate", metavar="F", help="write the model with per-node annotations")
    o.add_argument("--no-color", action="store_true")
    o.add_argument("--quiet", "-q", action="store_true", help="no progress, no table")
    o.add_argument("--strict", action="store_true", help="exit 2 when any node is unattributed")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dabench_ir.progress import Progress

    dims = parse_dims(args.dim)
    replicas: int | str | None = args.replicas
    if replicas is not None and replicas != "auto":
        if not str(replicas).isdigit() or int(replicas) <= 0:
            raise UserError(f"--replicas {replicas}: expected a positive integer or 'auto'")
        replicas = int(replicas)
    for flag in ("batch", "ipus", "warmup", "repeat", "threads", "micro_batches"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag == "warmup" else 1):
            raise UserError(f"--{flag.replace('_', '-')} {value}: must be a positive integer")
    _check_outputs(args)
    progress = Progress(quiet=args.quiet)
    if args.target and "," in args.target:
        return _compare_targets(args, [t.strip() for t in args.target.split(",") if t.strip()], progress, dims, replicas)
    report = _profile_one(args, args.target, progress, dims, replicas)
    progress.done()
    return _after_profile(args, report, progress)


def _profile_one(args: argparse.Namespace, target: str | None, progress, dims: dict[str, int], replicas):
    from dabench_ir.pipeline import profile

    return profile(
        args.model,
        target=target,
        progress=progress,
        dims=dims,
        batch=args.batch,
        precision=args.precision,
        mode=args.mode,
        recompute=args.recompute,
        via=args.via,
        opt_level=args.opt_level,
        wse_mode=args.wse_mode,
        replicas=replicas,
        ipus=args.ipus,
        micro_batches=args.micro_batches,
        measure=args.measure,
        warmup=args.warmup,
        repeat=args.repeat,
        threads=args.threads,
        ort_opt=args.ort_opt,
        max_weight_bytes=args.max_weight_bytes,
    )


def _compare_targets(args: argparse.Namespace, targets: list[str], progress, dims, replicas) -> int:
    """``--target wse,rdu,ipu``: the same model on each target, side by side."""
    from dabench_ir.report.compare import compare_reports, render_compare, write_compare_json
    from dabench_ir.targets import load_target

    for name in targets:  # every name is checked before any work
        load_target(name) if name != "cpu" else None
    reports = []
    for name in targets:
        progress(f"profiling on {name}")
        reports.append(_profile_one(args, name, progress, dims, replicas))
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
    if args.strict and report.unattributed:
        first = report.unattributed[0]
        raise UserError(
            f"{len(report.unattributed)} node(s) unattributed (first: {first['name']}: {first['reason']}); "
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
            n.name: {"dabench.unit": n.unit, "dabench.time_s": n.time_s}
            for n in report.nodes
            if n.time_s is not None
        }
        written.append(str(annotate(args.model, report.graph, args.annotate, extra)))
    if written and not args.quiet:
        sys.stdout.flush()
    return written
