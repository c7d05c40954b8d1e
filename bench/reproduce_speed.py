"""Benchmark: the bundled DABench study (`dabench-ir reproduce dabench`), wall-clock seconds.

    .venv/bin/python bench/reproduce_speed.py [--jobs 2] [--keep DIR]

Runs the study in a fresh process into an empty folder with an empty model cache (the first run on
a machine: bases exported with torch, every point and every counterfactual point run), then again
into the same folder (a rerun: every point done, the findings evaluated and the plots drawn).
Prints each one's wall and CPU time (the process and its workers) and the sweeps' point counts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def _timed(args: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its children, stdout) of one command."""
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, proc.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", metavar="DIR", help="write the run and its model cache here (default: a temp folder)")
    args = ap.parse_args(argv)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dabench-reproduce-"))
    out, cache = root / "out", root / "models"
    exe = str(Path(sys.executable).with_name("dabench-ir"))
    cmd = [exe, "reproduce", "dabench", "-o", str(out), "--cache-dir", str(cache), "--jobs", str(args.jobs)]
    try:
        for label in ("first run (empty folder and cache)", "rerun (every point done)"):
            wall, cpu, text = _timed(cmd)
            counts = re.findall(r"^(?:counterfactuals: )?\d+ points: .*$", text, re.M)
            print(f"{label:38s} wall {wall:6.1f} s  cpu {cpu:6.1f} s")
            for line in counts:
                print(f"    {line}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
