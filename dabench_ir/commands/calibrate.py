"""`dabench-ir calibrate`: measure the host CPU target (matmul FLOP/s, bandwidth, overhead).

The result is cached per machine, onnxruntime version and thread count; a valid cached
calibration is shown rather than measured again unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from dabench_ir.errors import UserError

__all__ = ["register", "run"]

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure the host CPU (matmul FLOP/s, bandwidth, per-op overhead) for the cpu target",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="onnxruntime intra-op threads (default: the CPUs this process may use)",
    )
    parser.add_argument("--force", action="store_true", help="measure again even when a valid calibration is cached")
    parser.add_argument(
        "--quick", action="store_true", help="a rough sub-second calibration (tiny shapes; for tests and smoke runs)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dabench_ir.execute.calibrate import calibrate, calibration_status, load_calibration, machine_key

    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be a positive integer, got {args.threads}")
    key = machine_key(args.threads)
    path, reason = calibration_status(key["threads"], allow_quick=args.quick)
    if args.force or reason is not None:
        if reason is not None and not args.force:
            print(f"{reason}.")
        print(f"calibrating {key['cpu']} ({key['threads']} threads, onnxruntime {key['ort_version']})...")
        path = calibrate(key["threads"], quick=args.quick, verbose=True)
        status = "measured"
    else:
        status = "cached"
    print(_summary(load_calibration(path), status))
    print(f"calibration file: {path}")
    return 0


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
        "  matmul shapes (batch x M x K x N):",
    ]
    for row in cal.get("matmul", []):
        shape = f"{row['batch']}x{row['m']}x{row['k']}x{row['n']}"
        lines.append(
            f"    {row['dtype']:4s} {shape:>18s}  {row['flops_per_s'] / 1e9:7.1f} GFLOP/s  "
            f"{row['time_s'] * 1e6:9.1f} us"
        )
    return "\n".join(lines)
