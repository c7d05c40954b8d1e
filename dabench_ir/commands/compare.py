"""`dabench-ir compare A.json B.json ...`: reports written by ``profile --json``, side by side."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dabench_ir.errors import UserError

__all__ = ["check_estimated", "register", "run"]

logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="put profile reports (JSON) side by side",
        description="Compare reports written by `dabench-ir profile --json`: time, throughput, allocation, "
        "load imbalance, efficiency, fit, dominant bound and GOP/s/W, one row per report.",
    )
    p.add_argument("reports", nargs="+", metavar="REPORT.json", help="report files (schema dabench-ir/report/v1)")
    p.add_argument("--json", metavar="F", help="write the comparison as JSON")
    p.add_argument("--csv", metavar="F", help="write the comparison as CSV")
    p.add_argument("--html", metavar="F", help="write the comparison as a self-contained HTML page")
    p.add_argument("--normalize-to", type=float, metavar="NM", help="add GOP/s/W as if built at this node (nm)")
    p.add_argument("--scaling", choices=["post-dennard", "dennard"], default="post-dennard")
    p.add_argument("--quiet", "-q", action="store_true", help="no table on stdout")
    p.add_argument(
        "--strict", action="store_true", help="exit 2 when a report has nodes without a cost rule (estimated)"
    )
    p.set_defaults(func=run)


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

    if args.normalize_to is not None:
        check_process_node(args.normalize_to)
    plan_outputs(args.reports, [(getattr(args, f), f"--{f}") for f in ("json", "csv", "html") if getattr(args, f)])
    from dabench_ir.execute.calibrate import host_powers

    reports = [load_report_json(p) for p in args.reports]
    rows = compare_reports(reports, powers=host_powers(reports))  # the host's figure, read before rendering
    if args.normalize_to is not None:
        from dabench_ir.report.compare import add_normalised

        add_normalised(rows, args.normalize_to, args.scaling)
    written = []
    if args.json:
        written.append(write_compare_json(rows, args.json))
    if args.csv:
        written.append(write_compare_csv(rows, args.csv))
    if args.html:
        from dabench_ir.report.html import write_compare_html

        links = [[("json", Path(src).resolve().as_uri())] for src in args.reports]
        written.append(write_compare_html(rows, args.html, links=links))
    if not args.quiet:
        print(render_compare(rows))
        for path in written:
            print(f"wrote {path}")
    check_estimated(rows, strict=args.strict)
    return 0


def check_estimated(rows: list, *, strict: bool) -> None:
    """Warn (stderr) for every row with nodes no rule counts; with ``strict`` that is an error (exit 2)."""
    import sys

    from dabench_ir.report.compare import estimated_warnings

    warnings = estimated_warnings(rows)
    for line in warnings:
        print(line, file=sys.stderr)
    if strict and warnings:
        raise UserError(f"--strict: {len(warnings)} report(s) hold nodes without a cost rule (see the warnings above)")
