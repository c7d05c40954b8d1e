"""`dabench-ir compare A.json B.json ...`: reports written by ``profile --json``, side by side."""

from __future__ import annotations

import argparse
import logging
from functools import partial
from pathlib import Path

from dabench_ir.commands.flags import (
    add_node_scaling,
    add_outputs,
    add_quiet,
    node_scaling,
    strict_warnings,
    write_given,
)

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "check_estimated", "run"]

logger = logging.getLogger(__name__)


HELP = "put profile reports (JSON) side by side"
DESCRIPTION = (
    "Compare reports written by `dabench-ir profile --json`: time, throughput, allocation, "
    "load imbalance, efficiency, fit, dominant bound and GOP/s/W, one row per report."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("reports", nargs="+", metavar="REPORT.json", help="report files (schema dabench-ir/report/v1)")
    add_outputs(
        p,
        json="write the comparison as JSON",
        csv="write the comparison as CSV",
        html="write the comparison as a self-contained HTML page",
    )
    add_node_scaling(p, "add GOP/s/W as if built at this node (nm)")
    add_quiet(p, "no table on stdout")
    p.add_argument(
        "--strict", action="store_true", help="exit 2 when a report has nodes without a cost rule (estimated)"
    )


def run(args: argparse.Namespace) -> int:
    from dabench_ir.energy import check_process_node
    from dabench_ir.fileio import plan_outputs
    from dabench_ir.report.compare import (
        compare_reports,
        load_report_json,
        render_compare,
        write_compare_csv,
        write_compare_json,
    )
    from dabench_ir.report.html import write_compare_html

    rule = node_scaling(args)
    if args.normalize_to is not None:
        check_process_node(args.normalize_to)
    plan_outputs(args.reports, [(getattr(args, f), f"--{f}") for f in ("json", "csv", "html") if getattr(args, f)])
    from dabench_ir.execute.calibrate import host_powers

    reports = [load_report_json(p) for p in args.reports]
    rows = compare_reports(reports, powers=host_powers(reports))  # the host's figure, read before rendering
    if args.normalize_to is not None:
        from dabench_ir.report.compare import add_normalised

        add_normalised(rows, args.normalize_to, rule)
    links = [[("json", Path(src).resolve().as_uri())] for src in args.reports]  # --html: each row to its report
    written = write_given(
        args,
        {
            "json": partial(write_compare_json, rows),
            "csv": partial(write_compare_csv, rows),
            "html": partial(write_compare_html, rows, links=links),
        },
    )
    if not args.quiet:
        print(render_compare(rows))
        for path in written:
            print(f"wrote {path}")
    check_estimated(rows, strict=args.strict)
    return 0


def check_estimated(rows: list, *, strict: bool) -> None:
    """Warn (stderr) for every row with nodes no rule counts; with ``strict`` that is an error (exit 2)."""
    from dabench_ir.report.compare import estimated_warnings

    strict_warnings(estimated_warnings(rows), strict=strict, holders="report(s)")
