"""`dabench-ir diff A.json B.json`: two reports of one model, node by node (as a study run does)."""

from __future__ import annotations

import argparse
import logging

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]

logger = logging.getLogger(__name__)


HELP = "diff two reports (JSON) of one model node by node"
DESCRIPTION = (
    "Compare report B against report A (both written by `profile --json` or `study -o DIR`): "
    "the total change, every node of B with the nodes of A it replaced (from B's recorded provenance when a "
    "study wrote it, else by names and module scopes), cost, time and bound before and after, and per module."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dabench_ir.commands.study import add_output_arguments

    p.add_argument("before", metavar="A.json", help="the baseline report")
    p.add_argument("after", metavar="B.json", help="the report to compare with it")
    add_output_arguments(p)


def run(args: argparse.Namespace) -> int:
    from dabench_ir.commands.study import check_paths, write_outputs
    from dabench_ir.errors import UserError
    from dabench_ir.report.compare import cost_only_note, is_cost_only, load_report_json, model_differences
    from dabench_ir.study import STUDY_SCHEMA, study_run

    check_paths(args)
    before, after = load_report_json(args.before), load_report_json(args.after)
    differs = model_differences(before, after)
    if differs:
        raise UserError(
            f"{args.before} and {args.after} are reports of different models ({'; '.join(differs)}); diff compares "
            "one model before and after a change: use `dabench-ir compare` to set different models side by side"
        )
    doc = {
        "schema": STUDY_SCHEMA,
        "command": "diff",  # the table's header names the command that made it
        "model": str((before.get("model") or {}).get("path") or args.before),
        "baseline": args.before,
        "runs": [study_run(before, after)],
    }
    write_outputs(args, doc)
    if not args.quiet:
        for path, report in ((args.before, before), (args.after, after)):
            if is_cost_only(report):
                totals = report.get("totals") or {}
                print(cost_only_note(path, totals.get("flops"), totals.get("bytes")))
    return 0
