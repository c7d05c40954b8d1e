"""Benchmark: the bundled Level-1 grid (420 points), first on a machine and again, wall-clock seconds.

    .venv/bin/python bench/sweep_speed.py [--jobs N] [--spec level1] [--keep DIR] [--no-plots] [--stages]
    .venv/bin/python bench/sweep_speed.py --scaling [--ray 1,2,4] [--repeat 1]
    .venv/bin/python bench/sweep_speed.py --validate [--repeat 3]
    .venv/bin/python bench/sweep_speed.py --points [--hidden 1024] [--repeat 3]

Goal (issue 34): level1 with --jobs 2 in 30 s on a 2-core machine. Runs ``dabench-ir sweep`` in a
fresh process with an empty model cache (the first sweep on a machine: the 1-layer bases are
exported with torch), then into another folder (the next sweep: the bases cached), printing each
one's wall and CPU time (the process and its workers) beside the goal; ``--stages`` first times
one 96-layer point broken into stages (build graph, then per-target profile).

``--scaling`` runs the Level-1 grid (``--spec``; bases exported once beforehand, not timed) with
the local executor at --jobs 1 and 2 and on a local Ray with 1, 2 and 4 workers, and prints each
wall time and its speedup over --jobs 1, all in one run so a busy machine slows them alike. A
Ray run's time starts after ``ray.init`` and includes its workers' start-up (each a fresh
interpreter importing dabench-ir, ~1 s), which a local worker forked from the driver does not pay.

``--points`` times the points alone: one hidden size's 70 Level-1 points (14 depths x 5 target
variants), serial in this process with the collector as a worker tunes it, bases exported first
(untimed); best of ``--repeat``, wall and CPU. The figure to compare builds by (alternate them).

``--validate`` times ``dabench-ir validate --quiet`` of the bundled catalogue as a user runs it (a
fresh process) with a cold ``--cache-dir`` (every base exported), then warm (best of ``--repeat``),
printing wall and CPU time (the process and its workers) beside the goals (cold <= 30 s, warm <= 2 s).
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

    params = {
        "family": "gpt2",
        "positional": "none",
        "layers": layers,
        "hidden": hidden,
        "heads": default_heads(hidden),
        "seq": 1024,
        "batch": 1,
        "precision": "fp32",
        "mode": "inference",
        "chips": 1,
    }
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


def _scaling(spec_name: str, ray_workers: list[int], repeat: int) -> None:
    """Wall time of the same grid per executor, best of ``repeat``, and the speedup over --jobs 1."""
    from dabench_ir.sweep import graphs, load_spec, run_sweep
    from dabench_ir.sweep.spec import SweepSpec

    spec = load_spec(spec_name)
    one_per_base = {graphs.base_key(p.params): p for p in spec.points if p.params["layers"] == 1}
    bases = SweepSpec("bases", list(one_per_base.values()))
    root = tempfile.mkdtemp(prefix="dabench-sweep-scaling-")
    cache = os.path.join(root, "models")
    try:
        run_sweep(bases, os.path.join(root, "warm"), jobs=2, cache_dir=cache, plots=False)  # the exports, untimed
        runs: list[tuple[str, float]] = []
        for label, kind, n in [
            ("local --jobs 1", "local", 1),
            ("local --jobs 2", "local", 2),
            *((f"ray, {n} worker(s)", "ray", n) for n in ray_workers),
        ]:
            best = float("inf")
            for r in range(repeat):
                out = os.path.join(root, f"{kind}{n}-{r}")
                start = time.perf_counter()
                if kind == "ray":
                    import ray

                    from dabench_ir.sweep.executors import RayExecutor

                    ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
                    try:
                        start = time.perf_counter()  # Ray's own start-up is not the sweep's
                        result = run_sweep(spec, out, executor=RayExecutor(n), cache_dir=cache, plots=False)
                    finally:
                        ray.shutdown()
                else:
                    result = run_sweep(spec, out, jobs=n, cache_dir=cache, plots=False)
                best = min(best, time.perf_counter() - start)
                assert result.ran == result.total and not result.failed, (label, result)
            runs.append((label, best))
            print(
                f"{label:<22} {len(spec.points)} points: {best:6.1f} s   speedup {runs[0][1] / best:4.2f}x", flush=True
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _validate(repeat: int) -> None:
    """Cold, then warm (best of ``repeat``), runs of ``dabench-ir validate`` in fresh processes."""
    import resource
    import subprocess

    cli = os.path.join(os.path.dirname(sys.executable), "dabench-ir")
    root = tempfile.mkdtemp(prefix="dabench-validate-bench-")
    try:
        for label, goal, runs in (("cold", 30.0, 1), ("warm", 2.0, repeat)):
            best = (float("inf"), 0.0)
            for _ in range(runs):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                subprocess.run(
                    [cli, "validate", "--cache-dir", os.path.join(root, "models"), "--quiet"],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                best = min(best, (wall, cpu))
            print(
                f"validate, {label} cache: {best[0]:5.1f} s wall, {best[1]:5.1f} s CPU   "
                f"goal <= {goal:g} s: {best[0] / goal:4.2f}x of it (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _points(hidden: int, repeat: int) -> None:
    """CPU of one hidden size's 70 Level-1 points, serial, best of ``repeat`` (exports untimed)."""
    from dabench_ir.sweep import load_spec, run_sweep
    from dabench_ir.sweep.spec import SweepSpec

    spec = load_spec("level1")
    points = [p for p in spec.points if p.params["hidden"] == hidden]
    if not points:
        raise SystemExit(f"--hidden {hidden}: Level 1 has {sorted({p.params['hidden'] for p in spec.points})}")
    root = tempfile.mkdtemp(prefix="dabench-sweep-points-")
    cache = os.path.join(root, "models")
    try:
        run_sweep(SweepSpec("bases", points[:1]), os.path.join(root, "warm"), jobs=1, cache_dir=cache, plots=False)
        best = (float("inf"), float("inf"))
        for r in range(repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            run_sweep(SweepSpec("points", points), os.path.join(root, f"run{r}"), jobs=1, cache_dir=cache, plots=False)
            best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
        print(
            f"{len(points)} Level-1 points at hidden {hidden}, serial: {best[0]:.2f} s wall, {best[1]:.2f} s CPU "
            f"(best of {repeat}, load {os.getloadavg()[0]:.1f})"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _grid(spec: str, jobs: int, keep: str | None, plots: bool) -> int:
    """``dabench-ir sweep SPEC --jobs N`` as a user runs it (a fresh process), twice: the first sweep
    on a machine (an empty model cache: the base exports with torch) and the next one (another output
    folder, the bases cached), each beside the goal."""
    import resource
    import subprocess

    cli = os.path.join(os.path.dirname(sys.executable), "dabench-ir")
    root = keep or tempfile.mkdtemp(prefix="dabench-sweep-bench-")
    if keep and os.path.exists(root):
        shutil.rmtree(root)
    env = {**os.environ, "DABENCH_IR_CACHE": os.path.join(root, "cache")}  # an empty cache, like a new machine
    worst = 0.0
    try:
        for label, out in (("first sweep on the machine (exports)", "first"), ("next sweep (bases cached)", "next")):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(
                [
                    cli,
                    "sweep",
                    spec,
                    "-o",
                    os.path.join(root, out),
                    "--jobs",
                    str(jobs),
                    "--quiet",
                    *([] if plots else ["--no-plots"]),
                ],
                check=True,
                env=env,
            )
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            worst = max(worst, wall)
            print(
                f"{spec} --jobs {jobs}{'' if plots else ' --no-plots'}, {label}: {wall:5.1f} s wall, {cpu:5.1f} s CPU"
                f"   goal <= 30 s: {wall / 30:4.2f}x of it (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if worst < 120 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--spec", default="level1")
    parser.add_argument(
        "--keep", metavar="DIR", help="write the sweeps and their model cache here (default: a temp folder)"
    )
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="sweep with --no-plots")
    parser.add_argument("--stages", action="store_true", help="also time one 96-layer point by stage")
    parser.add_argument("--scaling", action="store_true", help="speed of the grid per executor and worker count")
    parser.add_argument("--ray", default="1,2,4", help="with --scaling: local Ray worker counts")
    parser.add_argument("--repeat", type=int, default=1, help="with --scaling or --validate: runs (best kept)")
    parser.add_argument("--validate", action="store_true", help="time `dabench-ir validate`, cold and warm cache")
    parser.add_argument("--points", action="store_true", help="CPU of one hidden size's 70 Level-1 points, serial")
    parser.add_argument("--hidden", type=int, default=1024, help="with --points: the hidden size")
    args = parser.parse_args(argv)
    if args.validate:
        _validate(max(args.repeat, 1))
        return 0
    if args.points:
        _points(args.hidden, max(args.repeat, 1))
        return 0
    if args.scaling:
        _scaling(args.spec, [int(n) for n in args.ray.split(",") if n], args.repeat)
        return 0
    if args.stages:
        _one_point()
    return _grid(args.spec, args.jobs, args.keep, args.plots)


if __name__ == "__main__":
    sys.exit(main())
