"""`dabench-ir calibrate`: measure the host CPU target (matmul FLOP/s, bandwidth, overhead).

The result is cached per machine, onnxruntime version and thread count; a valid cached
calibration is shown rather than measured again unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import Any

from dabench_ir.commands.flags import add_outputs, add_quiet
from dabench_ir.options import KNOBS
from dabench_ir.progress import silent

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]

logger = logging.getLogger(__name__)


HELP = "measure the host CPU (matmul FLOP/s, bandwidth, per-op overhead) for the cpu target"
DESCRIPTION = __doc__.splitlines()[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        metavar="N",
        help="onnxruntime intra-op threads, at most the CPUs this process may use (default: all of them)",
    )
    p.add_argument("--force", action="store_true", help="measure again even when a valid calibration is cached")
    p.add_argument(
        "--quick", action="store_true", help="a rough sub-second calibration (tiny shapes; for tests and smoke runs)"
    )
    add_outputs(p, json="write the calibration (figures, shapes and their labels) as JSON to F ('-': stdout)")
    add_quiet(p, "no progress and no summary (errors only)")


def run(args: argparse.Namespace) -> int:
    from dabench_ir.execute.calibrate import calibrate, calibration_status, load_calibration, machine_key

    threads = KNOBS["threads"].check(args.threads)  # the one range of a thread count (profile's --threads too)
    key = machine_key(threads)
    path, reason = calibration_status(key["threads"], allow_quick=args.quick)
    to_stdout = args.json == "-"
    say = silent if args.quiet else (lambda text: print(text, file=sys.stderr)) if to_stdout else print
    if args.json and not to_stdout:
        from dabench_ir.fileio import check_output_path

        check_output_path(args.json, "--json", inputs=[path])  # never over the calibration it keeps
    if args.force or reason is not None:
        if reason is not None and not args.force:
            say(f"{reason}.")
        say(f"calibrating {key['cpu']} ({key['threads']} threads, onnxruntime {key['ort_version']})...")
        if to_stdout:
            with contextlib.redirect_stdout(sys.stderr):
                path = calibrate(key["threads"], quick=args.quick, verbose=not args.quiet)
        else:
            path = calibrate(key["threads"], quick=args.quick, verbose=not args.quiet)
        status = "measured"
    else:
        status = "cached"
    data = load_calibration(path)
    if args.json:
        doc = {"schema": "dabench-ir/calibration/v1", "status": status, "file": str(path), **data}
        for row in (doc.get("calibration") or {}).get("matmul", []):
            row.setdefault("label", _label(row))
        text = json.dumps(doc, indent=1, default=str)
        if to_stdout:
            print(text)
            return 0
        from dabench_ir.fileio import write_output

        write_output(args.json, text + "\n")
    say(_summary(data, status))
    say(f"calibration file: {path}")
    if args.json:
        say(f"wrote {args.json}")
    return 0


def _label(row: dict[str, Any]) -> str:
    """How a matmul shape was timed: B fed each run or a constant (pre-packed) B, warm or cold cache."""
    return ("constant B" if row.get("packed") else "B fed") + (", cold" if row.get("cold") else "")


def _summary(data: dict[str, Any], status: str) -> str:
    cal = data.get("calibration", {})
    peaks = data["compute"]["peak_flops"]
    dram = data["memory"][0]
    lines = [
        f"host cpu target ({status} on {cal.get('date')}, {cal.get('threads')} threads, "
        f"onnxruntime {cal.get('ort_version')}{', quick' if cal.get('quick') else ''}):",
        *(f"  peak {dtype:4s} matmul  {rec['value'] / 1e9:9.1f} GFLOP/s" for dtype, rec in peaks.items()),
        f"  stream bandwidth   {dram['bandwidth_bytes_per_s']['value'] / 1e9:9.1f} GB/s",
        f"  per-op overhead    {data['overheads']['kernel_launch_s']['value'] * 1e6:9.1f} us",
        "  matmul shapes (batch x M x K x N; B fed each run or a constant pre-packed B; cold: caches flushed):",
    ]
    for row in cal.get("matmul", []):
        shape = f"{row['batch']}x{row['m']}x{row['k']}x{row['n']}"
        lines.append(
            f"    {row['dtype']:4s} {shape:>18s}  {_label(row):18s} {row['flops_per_s'] / 1e9:7.1f} GFLOP/s  "
            f"{row['time_s'] * 1e6:9.1f} us"
        )
    return "\n".join(lines)
