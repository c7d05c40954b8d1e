"""How fast is `dabench-ir profile` on a big graph, against just loading it?

Builds (or reuses) a weight-free 32-layer hidden-4096 LLaMA-style decoder ONNX (about
3,000 nodes), then times, each as a fresh process (best of N):

- baseline: `onnx.load` + `onnx.shape_inference.infer_shapes` on the same file;
- `dabench-ir profile FILE --quiet --json OUT` (load, passes, rendering).

Prints both wall times and their ratio. Target: the ratio within 3x.

    .venv/bin/python bench/profile_speed.py [--layers 32] [--hidden 4096] [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _models import llama_model

BASELINE = (
    "import onnx, sys\n"
    "m = onnx.load(sys.argv[1], load_external_data=False)\n"
    "onnx.shape_inference.infer_shapes(m, data_prop=True)\n"
)


def _wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = llama_model(f"llama_L{args.layers}_h{args.hidden}.onnx", "--layers", str(args.layers), "--hidden",
                        str(args.hidden), "--seq", "2048", "--batch", "1", "--weights", "none")  # fmt: skip
    exe = [sys.executable, "-m", "dabench_ir"]
    import onnx

    nodes = len(onnx.load(str(model), load_external_data=False).graph.node)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        base = min(_wall([sys.executable, "-c", BASELINE, str(model)]) for _ in range(args.repeat))
        prof = min(_wall([*exe, "profile", str(model), "--quiet", "--json", str(out)]) for _ in range(args.repeat))
    print(f"model            {model.name}: {nodes} nodes, {model.stat().st_size / 1e6:.2f} MB")
    print(f"baseline         onnx.load + infer_shapes: {base:.2f} s (process wall, best of {args.repeat})")
    print(f"dabench-ir       profile --json:           {prof:.2f} s")
    print(f"ratio            {prof / base:.2f}x (target <= 3x)")


if __name__ == "__main__":
    main()
