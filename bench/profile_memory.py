"""Peak memory of `dabench-ir profile` against a bare `onnx.load` of the same file (issue 20).

Exports a model with its weights inside the file (cached under bench/_cache/), then runs,
each in a fresh process, (a) ``onnx.load(FILE, load_external_data=False)`` and (b)
``dabench-ir profile FILE --quiet --json OUT``, and prints each one's peak RSS (ru_maxrss)
and their ratio. Target: profile within 1.5x of the bare load.

    .venv/bin/python bench/profile_memory.py            # --layers 4 --hidden 1024
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from _models import llama_model

_LOAD = "import onnx, sys; m = onnx.load(sys.argv[1], load_external_data=False)"
_PROFILE = (
    "import sys; from dabench_ir.cli import main; "
    "assert main(['profile', sys.argv[1], '--quiet', '--json', sys.argv[2]]) == 0"
)


def _peak_rss_mb(code: str, *args: str) -> float:
    """Peak RSS (MiB) of a fresh Python process running ``code``."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code + "; import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)",
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(proc.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    model = llama_model(
        f"llama-L{args.layers}-H{args.hidden}-V{args.vocab}-weights.onnx",
        layers=args.layers,
        hidden=args.hidden,
        vocab=args.vocab,
        weights="random",
    )
    size_mb = model.stat().st_size / 2**20
    load = _peak_rss_mb(_LOAD, str(model))
    with tempfile.TemporaryDirectory() as tmp:
        prof = _peak_rss_mb(_PROFILE, str(model), str(Path(tmp) / "r.json"))
    print(f"model        {model.name}: {size_mb:.0f} MiB")
    print(f"onnx.load    peak RSS {load:.0f} MiB")
    print(f"profile      peak RSS {prof:.0f} MiB")
    print(f"ratio        {prof / load:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
