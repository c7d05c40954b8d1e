"""Where one `dabench-ir profile` process spends its CPU, by stage (issue 43: what a columnar node
table would speed up, measured before building one).

    .venv/bin/python bench/stage_shares.py                                   # GPT-2 small's block x 1,000, sn30
    .venv/bin/python bench/stage_shares.py --layers 100 --target wse2

Runs the CLI's `profile MODEL -t T -q --json OUT` in this process with each stage's entry point
wrapped in a CPU-time counter: loading, the lowering and the emulation (the report's run and each
why-line variant's), the report build, its verification, the step energy, the role rows, the
representative layer and the JSON write. A stage inside another (the role rows inside the report
build) is counted in both; the whole process is the last line. The model is the weight-free
stamped export `bench/layer_scaling.py` uses (cached under bench/_cache/).
"""

from __future__ import annotations

import argparse
import collections
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _models import exported


def counted(owner: Any, name: str, label: str, seconds: collections.Counter[str]) -> None:
    """Replace ``owner.name`` by a wrapper adding its CPU seconds to ``seconds[label]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[label] += time.process_time() - start

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--target", default="sn30")
    args = parser.parse_args()
    model = exported(
        f"gpt2-L{args.layers}.onnx", "--preset", "gpt2-small", "--layers", str(args.layers), "--weights", "none"
    )

    import dabench_ir.emulate as emulate
    import dabench_ir.energy as energy
    import dabench_ir.lowering as lowering
    import dabench_ir.pipeline as pipeline
    import dabench_ir.report.attribution as attribution
    import dabench_ir.report.build as build
    import dabench_ir.report.model as report_model
    import dabench_ir.verify as verify
    from dabench_ir.cli import main as cli

    seconds: collections.Counter[str] = collections.Counter()
    for owner, name, label in [
        (pipeline, "load_graph", "loading"),
        (lowering, "lower", "lowering (the report's run and the variants')"),
        (emulate, "emulate", "emulation (the same runs)"),
        (build, "build_report", "report build"),
        (report_model.Report, "write_json", "JSON write"),
        (verify, "check", "verifier (report)"),
        (verify, "check_step", "verifier (variants' steps)"),
        (energy, "step_energy", "step energy"),
        (attribution, "role_rows", "role rows"),
        (attribution, "representative_layer", "representative layer"),
    ]:
        counted(owner, name, label, seconds)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.process_time()
        cli(["profile", str(model), "-t", args.target, "-q", "--json", str(Path(scratch) / "p.json")])
        whole = time.process_time() - start
    print(f"{model.name} on {args.target}: CPU seconds by stage")
    for label, value in seconds.most_common():
        print(f"  {label:48s} {value:7.2f} s  {100 * value / whole:5.1f} %")
    print(f"  {'whole profile':48s} {whole:7.2f} s")


if __name__ == "__main__":
    main()
