"""How fast is `dabench-ir profile` on a big graph, against just loading it?

Builds (or reuses) a weight-free 32-layer hidden-4096 LLaMA-style decoder ONNX (1,964
nodes), then times, each as a fresh process, alternating so that a busy machine slows both
alike (best of N each):

- baseline: `onnx.load` + `onnx.shape_inference.infer_shapes` on the same file;
- `dabench-ir profile FILE --quiet --json OUT` (load, checks, passes, report, JSON).

Prints both wall and CPU times and their ratios (the figure: issue 34's goal is <= 1.5x; on a
busy machine the CPU-time ratio is the one to read). The package's
bytecode is compiled first, as an installed package has it (with PYTHONDONTWRITEBYTECODE set,
every run would otherwise compile dabench-ir's sources again). ``--stages`` also prints the
in-process time of each stage (best of N), to see where the difference goes.

    .venv/bin/python bench/profile_speed.py [--layers 32] [--hidden 4096] [--repeat 5] [--stages]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

from _models import profile_model
from _timing import best, compile_package, timed

GOAL = 1.5

BASELINE = (
    "import onnx, sys\n"
    "m = onnx.load(sys.argv[1], load_external_data=False)\n"
    "onnx.shape_inference.infer_shapes(m, data_prop=True)\n"
)


def _stages(model: Path, repeat: int) -> None:
    """In-process time of each stage of a cost-only profile, best of ``repeat`` (warm: imports excluded)."""
    import onnx

    from dabench_ir.cli import build_parser
    from dabench_ir.frontends.checks import check_onnx_model, infer_checked
    from dabench_ir.frontends.onnx import load_onnx
    from dabench_ir.run import execute, prepare, resolve

    best: dict[str, float] = {}
    for _ in range(repeat):
        marks = [("start", time.perf_counter())]
        build_parser("profile")  # what `dabench-ir profile` builds
        marks.append(("argument parser", time.perf_counter()))
        proto = onnx.load(str(model), load_external_data=False)
        marks.append(("onnx.load", time.perf_counter()))
        declared_static = check_onnx_model(proto)
        marks.append(("check_onnx_model", time.perf_counter()))
        infer_checked(proto, declared_static=declared_static)
        marks.append(("infer_checked (shape inference)", time.perf_counter()))
        graph = load_onnx(model)
        marks.append(("load_onnx (all of the above but the parser)", time.perf_counter()))
        run = resolve(graph, None, {}, model=str(model))
        prepare(run, graph)
        marks.append(("passes (prepare)", time.perf_counter()))
        graph = load_onnx(model)
        marks.append(("(reload)", time.perf_counter()))
        report = execute(resolve(graph, None, {}, model=str(model)), graph)
        marks.append(("execute (passes + build_report)", time.perf_counter()))
        report.to_json(indent=None)
        marks.append(("to_json", time.perf_counter()))
        for (_, t0), (name, t1) in itertools.pairwise(marks):
            best[name] = min(best.get(name, float("inf")), t1 - t0)
    for name, seconds in best.items():
        if not name.startswith("("):
            print(f"  stage {name:<44} {seconds * 1e3:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stages", action="store_true", help="also print each stage's in-process time")
    args = ap.parse_args()
    model = profile_model(args.layers, args.hidden)
    compile_package()
    exe = [sys.executable, "-m", "dabench_ir"]
    import onnx

    nodes = len(onnx.load(str(model), load_external_data=False).graph.node)
    base, prof = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        for _ in range(args.repeat):
            base.append(timed([sys.executable, "-c", BASELINE, str(model)]))
            prof.append(timed([*exe, "profile", str(model), "--quiet", "--json", str(out)]))
    (bw, bc), (pw, pc) = best(base), best(prof)
    print(f"model       {model.name}: {nodes} nodes, {model.stat().st_size / 1e6:.2f} MB; best of {args.repeat}")
    print("                                            wall      cpu")
    print(f"baseline    onnx.load + infer_shapes    {bw:7.3f} s {bc:7.3f} s")
    print(f"dabench-ir  profile --quiet --json      {pw:7.3f} s {pc:7.3f} s")
    print(f"ratio                                   {pw / bw:7.2f}x {pc / bc:7.2f}x   (goal <= {GOAL}x)")
    if args.stages:
        _stages(model, args.repeat)


if __name__ == "__main__":
    main()
