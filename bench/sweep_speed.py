"""Benchmark: the bundled Level-1 grid (420 points) from a cold cache, wall-clock seconds.

    .venv/bin/python bench/sweep_speed.py [--jobs N] [--spec level1] [--keep DIR]

Target: under 120 s on a 2-core machine. Prints exports, points, failures and the time, and
the time of one 96-layer point broken into stages (build graph, then per-target profile).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

__all__ = ["main"]

logger = logging.getLogger(__name__)


def _one_point(hidden: int = 768, layers: int = 96) -> None:
    """Stage timings of the biggest Level-1 model (export excluded)."""
    from dabench_ir.models.config import default_heads
    from dabench_ir.sweep import graphs, worker

    params = {"family": "gpt2", "positional": "none", "layers": layers, "hidden": hidden, "heads": default_heads(hidden),
              "seq": 1024, "batch": 1, "precision": "fp32", "mode": "inference", "chips": 1}  # fmt: skip
    t = time.perf_counter()
    base = graphs.export_base(params)
    print(f"export 1-layer base h{hidden}: {time.perf_counter() - t:.2f}s")
    t = time.perf_counter()
    graph = graphs.build_graph(base, layers)
    print(f"build+cost {layers}-layer graph ({len(graph.nodes)} nodes): {time.perf_counter() - t:.2f}s")
    for target, opt in (("wse", None), ("rdu", "O0"), ("rdu", "O1"), ("rdu", "O3"), ("ipu", None)):
        p = {**params, "target": target, **({"opt_level": opt} if opt else {})}
        t = time.perf_counter()
        worker.run_group(base, layers, [("bench", p)])
        print(f"  full point {target} {opt or ''}: {time.perf_counter() - t:.2f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--spec", default="level1")
    parser.add_argument("--keep", metavar="DIR", help="write the sweep here (default: a temp folder)")
    parser.add_argument("--stages", action="store_true", help="also time one 96-layer point by stage")
    args = parser.parse_args(argv)
    from dabench_ir.progress import Progress
    from dabench_ir.sweep import load_spec, run_sweep

    out = args.keep or tempfile.mkdtemp(prefix="dabench-sweep-bench-")
    if args.keep and os.path.exists(out):
        shutil.rmtree(out)
    spec = load_spec(args.spec)
    progress = Progress()
    start = time.perf_counter()
    result = run_sweep(spec, out, jobs=args.jobs, bar=lambda d, t, failed=0: progress.bar(d, t, failed=failed))
    wall = time.perf_counter() - start
    progress.done()
    print(f"{spec.name}: {result.total} points, {result.failed} failed, {result.exports} exports, "
          f"jobs={args.jobs}, cold cache: {wall:.1f}s (target < 120s) -> {out}")  # fmt: skip
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    if args.stages:
        _one_point()
    return 0 if wall < 120 else 1


if __name__ == "__main__":
    sys.exit(main())
