"""Whole `dabench-ir profile` processes on a deep decoder and one ten times deeper, every target
(issue 43: a 10,000-layer profile within 10x of the 1,000-layer one).

    .venv/bin/python bench/layer_scaling.py                       # 1,000 and 10,000 layers, every target
    .venv/bin/python bench/layer_scaling.py --layers 100,1000 --targets rdu,h100

The models: GPT-2 small's block (hidden 768, 12 heads, seq 1024) exported weight-free by
``dabench-ir export --preset gpt2-small --layers L`` (one block exported with torch and stamped;
cached under bench/_cache/). Each cell is one fresh process of ``dabench-ir profile FILE -t T -q
--json OUT``: loading, costing, placing, emulating, the why lines' variant placements, the report
and its verification. It prints wall and CPU seconds (user + system) and peak RSS (the
child's own ru_maxrss), then each target's last / first ratio of both times; with ``--repeat N``
the fastest of N processes per cell (wall, CPU and peak each on its own).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _models import exported

TARGETS = "wse2,sn30,bow,h100,cpu"


def model(layers: int) -> Path:
    return exported(f"gpt2-L{layers}.onnx", "--preset", "gpt2-small", "--layers", str(layers), "--weights", "none")


_CHILD = (
    "import resource, sys; from dabench_ir.cli import main; code = main(sys.argv[1:]); "
    "r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime, r.ru_maxrss); sys.exit(code)"
)


def run(path: Path, target: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one profile process."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        argv = [sys.executable, "-c", _CHILD, "profile", str(path), "-t", target, "-q", "--json", f"{tmp}/r.json"]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        wall = time.perf_counter() - start
    cpu, rss_kb = out.split()[-2:]
    return wall, float(cpu), int(rss_kb) / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="1000,10000", help="two layer counts, comma-separated")
    ap.add_argument("--targets", default=TARGETS, help="targets, comma-separated")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="processes per cell, the fastest kept (wall and CPU each; this VM's CPU seconds for the same "
        "run have varied by a third within minutes)",
    )
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat: give 1 or more")
    depths = [int(x) for x in args.layers.split(",")]
    paths = {d: model(d) for d in depths}
    print("| target | layers | wall s | CPU s | peak RSS MB |")
    print("|---|---|---|---|---|")
    ratios = []
    for target in args.targets.split(","):
        cells = {}
        for d in depths:
            tries = [run(paths[d], target) for _ in range(args.repeat)]
            cells[d] = tuple(min(column) for column in zip(*tries, strict=True))
            wall, cpu, rss = cells[d]
            print(f"| {target} | {d:,} | {wall:.1f} | {cpu:.1f} | {rss:,.0f} |", flush=True)
        first, last = cells[depths[0]], cells[depths[-1]]
        ratios.append(f"{target}: {last[0] / first[0]:.1f}x wall, {last[1] / first[1]:.1f}x CPU")
    print(f"\n{depths[-1]:,} over {depths[0]:,} layers: " + "; ".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
