"""`dabench-ir validate`: the catalogue of published measurements, predicted vs measured."""

from __future__ import annotations

import argparse
import sys

from dabench_ir.commands.flags import add_outputs, add_quiet

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


HELP = "compare the emulated targets with published measurements"
DESCRIPTION = (
    "Run every point of the measurement catalogue (the bundled one, or --catalog FILE in the "
    "same format: docs/validation.md) through the tool and print measured vs predicted with the relative "
    "error of each quantity, then per target the median and worst absolute error. Points the tool cannot "
    "run, and points with a run key the tool has no knob for, are listed with the reason (CANNOT RUN)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dabench_ir.commands.sweep import CACHE_DIR_HELP

    p.add_argument("--target", "-t", metavar="T", help="only the points on this target (name or alias)")
    p.add_argument(
        "--catalog",
        metavar="FILE",
        action="append",
        help="a catalogue TOML file instead of the bundled ones (repeatable)",
    )
    add_outputs(
        p,
        json="write the table and summary as JSON",
        csv="write the table as CSV (one row per point and quantity)",
        plots="write one figure per target (validation-<target>.png)",
    )
    p.add_argument("--cache-dir", metavar="DIR", help=CACHE_DIR_HELP)
    add_quiet(p, "no progress on stderr")


def run(args: argparse.Namespace) -> int:
    from dabench_ir import validate
    from dabench_ir.errors import UserError
    from dabench_ir.fileio import check_output_dir, plan_outputs
    from dabench_ir.progress import Progress
    from dabench_ir.validate.catalog import input_files
    from dabench_ir.validate.crossval import validate_points

    points = validate.load_catalog(args.catalog)  # read and checked, not run: the inputs are known before any work
    outputs = [(v, f) for f, v in (("--json", args.json), ("--csv", args.csv)) if v is not None]
    plan_outputs([*(args.catalog or []), *input_files(points)], outputs)  # kernel tables and target files too
    if args.plots is not None:
        check_output_dir(args.plots, "--plots")
    progress = Progress(quiet=args.quiet)
    try:
        result = validate_points(
            points,
            bundled=not args.catalog,
            target=args.target,
            cache_dir=args.cache_dir,
            say=progress,
            bar=progress.bar,
        )
    finally:
        progress.done()
    if args.json != "-":  # stdout carries the JSON alone
        print(result.format_table())
    written = []
    for flag, value, write in (
        ("--json", args.json, validate.write_json),
        ("--csv", args.csv, validate.write_csv),
        ("--plots", args.plots, validate.write_plots),
    ):
        if not value:
            continue
        try:
            out = write(result, value)
        except OSError as exc:
            raise UserError(f"{flag} {value}: cannot write it ({exc.strerror or exc})") from None
        written += out if isinstance(out, list) else [out]
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0
