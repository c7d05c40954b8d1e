"""Whole `dabench-ir scale` processes: one model over a list of chip counts, each point a verified
run of its own (issue 43), the one-chip baseline placed once for all of them.

    .venv/bin/python bench/scale_speed.py                         # 1,000 layers, h100, tp, 1,2,4,8 chips
    .venv/bin/python bench/scale_speed.py --layers 100 --target sn30 --strategy dp --repeat 3

The model: GPT-2 small's block (hidden 768, 12 heads, seq 1024) exported weight-free by ``dabench-ir
export --preset gpt2-small --layers L`` (one block exported with torch and stamped; cached under
bench/_cache/, the file bench/layer_scaling.py times). It prints the least wall and CPU seconds (user +
system) of ``--repeat`` fresh processes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from _models import exported
from _timing import best, compile_package, timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=1000, help="decoder blocks of the model")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--strategy", default="tp", choices=("dp", "tp", "pp"))
    ap.add_argument("--chips", default="1,2,4,8", help="chip counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=2, help="processes, the least time kept")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat: give 1 or more")
    path = exported(
        f"gpt2-L{args.layers}.onnx", "--preset", "gpt2-small", "--layers", str(args.layers), "--weights", "none"
    )
    compile_package()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "dabench_ir", "scale", str(path), "-t", args.target]
        cmd += ["--strategy", args.strategy, "--chips", args.chips, "-q", "--json", f"{tmp}/s.json"]
        wall, cpu = best([timed(cmd) for _ in range(args.repeat)])
    print(f"scale {path.name} -t {args.target} --strategy {args.strategy} --chips {args.chips}: ", end="")
    print(f"{wall:.2f} s wall, {cpu:.2f} s CPU (least of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
