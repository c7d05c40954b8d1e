"""`dabench-ir study MODEL --pipeline NAME ... --target T ...`: pass pipelines compared node by node per target."""

from __future__ import annotations

import argparse
import logging
import os
from functools import partial

from dabench_ir.commands.flags import add_outputs, add_quiet, check_top, strict_warnings, write_given
from dabench_ir.errors import UserError

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "check_paths", "run", "write_outputs"]

logger = logging.getLogger(__name__)


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for group in values or [] for v in group.split(",") if v.strip()]


def _unique_targets(names: list[str]) -> list[str]:
    """Each target once, in the order given: a repeat or an alias of one given before (rdu = sn30) is dropped."""
    from dabench_ir.targets import HOST, is_host, load_target

    seen: dict[str, str] = {}
    for name in names:
        seen.setdefault(HOST if is_host(name) else load_target(name).name, name)
    return list(seen.values())


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """The output flags `study` and `diff` share."""
    add_outputs(
        p,
        json="write the study as JSON (schema dabench-ir/study/v1)",
        csv="write one CSV line per run and node row",
        html="write a self-contained HTML page",
    )
    p.add_argument("--top", type=int, default=12, metavar="N", help="changed nodes and modules shown per run")
    p.add_argument("--strict", action="store_true", help="exit 2 when a side has nodes without a cost rule")
    add_quiet(p, "no progress, no table")


HELP = "run named pass pipelines on one model and diff them node by node per target"
DESCRIPTION = (
    "Run pass pipelines (onnxscript, onnxruntime, RDU opt levels, WSE modes, or your own: "
    "docs/studies.md) on MODEL, place each on every target and report, against the model as it is, the "
    "total change and a per-node and per-module diff (which source nodes each fused node replaced, cost and "
    "time before and after, bound changes, nodes added or removed)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dabench_ir.options import STUDY, add_flag, add_knob_arguments

    p.add_argument("model", nargs="?", help="an .onnx model, or a preset name (as profile takes)")
    p.add_argument(
        "--pipeline",
        action="append",
        metavar="NAME",
        help="pipeline(s), repeatable or comma-separated; see --list-pipelines",
    )
    p.add_argument("--target", "-t", action="append", metavar="T", help="target(s), repeatable or comma-separated")
    p.add_argument("--list-pipelines", action="store_true", help="list the registered pipelines and exit")
    add_flag(
        p,
        "-o",
        "--output",
        dest="out_dir",
        metavar="DIR",
        deprecated=("--out-dir",),
        help="keep every optimised model and report JSON here",
    )
    p.add_argument(
        "--via",
        dest="study_via",
        choices=("onnx", "mlir"),
        default=None,
        help="mlir: run the MLIR pipelines on the model's linalg module, each diffed against it as lowered "
        "(docs/mlir.md); the default when an MLIR pipeline is given, else onnx",
    )
    p.add_argument(
        "--mlir-pipeline",
        metavar="PASSES",
        action="append",  # given twice is refused, not the last kept
        help="upstream MLIR passes, comma-separated "
        "('linalg-fuse-elementwise-ops,canonicalize,cse'), run one at a time with --via mlir",
    )
    add_output_arguments(p)
    # run, target and scale knobs: the baseline is placed with them, a pipeline's own overrides win
    add_knob_arguments(p, STUDY)


def write_outputs(args: argparse.Namespace, doc: dict) -> None:
    """Print the table and write --json/--csv/--html; warnings on stderr; --strict exits 2 on them."""
    from dabench_ir.study.render import render_study, write_study_csv, write_study_html, write_study_json

    written = write_given(
        args,
        {
            "json": partial(write_study_json, doc),
            "csv": partial(write_study_csv, doc),
            "html": partial(write_study_html, doc),
        },
    )
    if not args.quiet:
        print(render_study(doc, top=args.top))
        for failure in doc.get("failed", ()):
            print(f"{failure['pipeline']}: failed: {failure['reason']}")
        for path in written:
            print(f"wrote {path}")
    warnings = sorted({w for run in doc["runs"] for w in run["warnings"]})
    strict_warnings(warnings, strict=args.strict, holders="side(s)")


def check_paths(args: argparse.Namespace) -> None:
    from dabench_ir.fileio import check_input_file, check_output_dir, plan_outputs

    check_top(args.top)

    inputs = [
        p for p in (getattr(args, "model", None), getattr(args, "before", None), getattr(args, "after", None)) if p
    ]
    if getattr(args, "model", None) and not os.path.lexists(args.model):
        from dabench_ir.models.presets import names_preset

        inputs = [p for p in inputs if p != args.model or not names_preset(p)]  # a preset: exported (see run)
    for path in inputs:
        check_input_file(path)
    from dabench_ir.targets import target_files

    inputs += target_files(getattr(args, "target", None))  # a target file is an input too
    plan_outputs(inputs, [(getattr(args, f), f"--{f}") for f in ("json", "csv", "html") if getattr(args, f)])
    if getattr(args, "out_dir", None):
        check_output_dir(args.out_dir, "-o")


def run(args: argparse.Namespace) -> int:
    from dabench_ir.study import get_pipeline, pipeline_names

    if args.list_pipelines:
        for name in pipeline_names():
            pipe = get_pipeline(name)
            where = f" [{', '.join(sorted(pipe.targets))} only]" if pipe.targets else ""
            print(f"{name:22s} {pipe.help}{where}")
        return 0
    from dabench_ir.options import STUDY, ScaleOptions, options_from_args
    from dabench_ir.progress import Progress
    from dabench_ir.study import run_study

    if not args.model:
        raise UserError("study: give the model (an .onnx file or a preset name)")
    pipelines: list = list(dict.fromkeys(_split(args.pipeline)))  # a repeated pipeline runs once
    if args.mlir_pipeline is not None:
        from dabench_ir.mlir import parse_pipeline
        from dabench_ir.study import Pipeline

        if len(args.mlir_pipeline) > 1:
            raise UserError("--mlir-pipeline given twice; give one, its passes comma-separated")
        args.mlir_pipeline = args.mlir_pipeline[0]

        if args.study_via == "onnx":
            raise UserError("--mlir-pipeline runs MLIR passes on linalg: drop --via onnx")
        passes = tuple(parse_pipeline(args.mlir_pipeline))
        pipelines.append(Pipeline(f"mlir:{','.join(passes)}", args.mlir_pipeline, mlir=passes, needs="torch_mlir"))
    if not pipelines or pipelines == ["none"]:  # "none" is the baseline every study compares against
        raise UserError("study: give at least one --pipeline NAME to compare with the baseline (see --list-pipelines)")
    check_paths(args)
    opts = options_from_args(args, ScaleOptions, STUDY)
    from dabench_ir.api import study_input

    model, opts = study_input(args.model, opts)  # a preset: its export
    progress = Progress(quiet=args.quiet)
    from dabench_ir.mlir import MlirPassError

    try:
        doc = run_study(
            model,
            pipelines,
            _unique_targets(_split(args.target)),
            opts,
            out_dir=args.out_dir,
            progress=progress,
            via=args.study_via,
        )
    except MlirPassError as exc:  # the passes before the failing one keep their results: show them
        progress.done()
        if not args.quiet:
            from dabench_ir.study.render import pass_table

            print(pass_table(exc.before, exc.steps))
        raise
    progress.done()
    write_outputs(args, doc)
    if doc.get("failed"):  # the other pipelines ran and were written; the run still says it is incomplete
        names = ", ".join(f"{f['pipeline']} ({f['reason']})" for f in doc["failed"])
        raise UserError(f"study: {len(doc['failed'])} pipeline(s) failed: {names}")
    return 0
