"""Benchmark: weight-free ONNX export time and peak RSS vs. layer count.

LLaMA-style blocks of hidden 8192 (64 heads, 8 KV heads, ffn 28672, seq 2048) at
L = 1, 8, 32, 72, each exported in a fresh subprocess (so imports and caches count the
same for every L). Reports the subprocess wall time, the export call's own time, and the
subprocess peak RSS (ru_maxrss). Target: L=72 within 2x of L=1, peak RSS < 1.5 GB.

    python bench/export_scaling.py [--layers 1,8,32,72] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main", "measure"]

logger = logging.getLogger(__name__)

SHAPE = {"family": "llama", "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, "seq": 2048, "batch": 1}


def _child(layers: int, out: str) -> None:
    """Runs in the subprocess: export, then print one JSON line."""
    start = time.perf_counter()
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_model

    imported = time.perf_counter()
    result = export_model(ModelConfig(layers=layers, **SHAPE), out, weights="none")
    done = time.perf_counter()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        json.dumps(
            {
                "layers": layers,
                "import_s": imported - start,
                "export_s": done - imported,
                "nodes": result.nodes,
                "file_bytes": Path(out).stat().st_size,
                "child_rss_bytes": rss_kib * 1024,
            }
        )
    )


def measure(layers: int) -> dict:
    """Export L layers in a fresh Python process; wall time and peak RSS of that process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "model.onnx")
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--child", str(layers), out], capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"export of L={layers} failed:\n{proc.stderr[-2000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["wall_s"] = wall
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="1,8,32,72", help="comma-separated layer counts")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--child", nargs=2, metavar=("L", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(int(args.child[0]), args.child[1])
        return 0
    rows = [measure(int(n)) for n in args.layers.split(",")]
    print(f"{'L':>4} {'wall s':>8} {'export s':>9} {'import s':>9} {'nodes':>7} {'file MB':>8} {'peak RSS MB':>12}")
    for r in rows:
        print(
            f"{r['layers']:>4} {r['wall_s']:>8.2f} {r['export_s']:>9.2f} {r['import_s']:>9.2f} {r['nodes']:>7} "
            f"{r['file_bytes'] / 1e6:>8.2f} {r['child_rss_bytes'] / 1e6:>12.0f}"
        )
    children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    first, last = rows[0], rows[-1]
    print(
        f"wall ratio L={last['layers']}/L={first['layers']}: {last['wall_s'] / first['wall_s']:.2f}x "
        f"(target <= 2x); peak RSS of any child: {children_peak / 1e6:.0f} MB (target < 1500 MB)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
