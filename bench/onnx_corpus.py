"""Run the onnx package's backend test models through the CLI and count the outcomes (issue 21).

The corpus is generated with onnx's own test-case code: every node test case
(`onnx.backend.test.case.node.collect_testcases`), every model test case
(`onnx.backend.test.case.model.collect_testcases`), and the model files shipped under
``onnx/backend/test/data`` (light, real, simple, pytorch-converted, pytorch-operator).
Each model goes through three paths:

    profile MODEL                                 (cost only)
    profile MODEL --target wse,rdu,ipu,h100       (costed once, placed on four targets)
    profile MODEL --measure --warmup 0 --repeat 1 (onnxruntime, per-node profiler)

in-process (``dabench_ir.cli.main``), inside a forked worker so that a crash (a signal in
native code) costs only the run that caused it. Every run ends in one of:

    ok          exit 0
    exit2       exit 2 with exactly one line on stderr (bad or unsupported input, said once)
    internal    exit 1 "internal error" (a bug: the last-resort handler caught it)
    bad-output  any other exit code, a traceback, or an exit 2 that is not exactly one line
    crash       the worker died (signal) during the run
    hang        the run took longer than --timeout seconds

Usage::

    .venv/bin/python bench/onnx_corpus.py [--budget 540] [--sample N] [--timeout 30] [--paths cost,targets,measure]

``--budget`` bounds the wall time: when the whole corpus would not fit, a deterministic
sample (every k-th model) is run and the output says so.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

PATHS = {
    "cost": [],
    "targets": ["--target", "wse,rdu,ipu,h100"],
    "measure": ["--measure", "--warmup", "0", "--repeat", "1"],
}
OUTCOMES = ("ok", "exit2", "internal", "bad-output", "crash", "hang")


def corpus(folder: Path) -> list[Path]:
    """Write every backend test model into ``folder``; the list of files (sorted, stable)."""
    import onnx
    from onnx.backend.test.case import model as model_cases
    from onnx.backend.test.case import node as node_cases

    paths: list[Path] = []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cases = [*node_cases.collect_testcases(None), *model_cases.collect_testcases()]
    for case in cases:
        if getattr(case, "model", None) is None:
            continue
        path = folder / f"{case.kind}-{case.name}.onnx"
        path.write_bytes(case.model.SerializeToString())
        paths.append(path)
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    for src in sorted(data.rglob("*.onnx")):
        path = folder / f"data-{src.parent.name}-{src.name}"
        path.write_bytes(src.read_bytes())
        paths.append(path)
    return sorted(paths)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _one(model: Path, extra: list[str], timeout: float) -> tuple[str, float, str]:
    with tempfile.TemporaryFile() as native:  # what native code (onnxruntime, MLIR) writes to fd 2 counts too
        return _run_one(model, extra, timeout, native)


def _run_one(model: Path, extra: list[str], timeout: float, native) -> tuple[str, float, str]:
    from dabench_ir.cli import main

    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    saved = os.dup(2)
    os.dup2(native.fileno(), 2)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["profile", str(model), "-q", *extra])
    except _Timeout:
        return "hang", time.perf_counter() - start, ""
    except BaseException as exc:  # escaped main(): not the contract
        return "bad-output", time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[:300]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.dup2(saved, 2)
        os.close(saved)
        native.seek(0)
        err.write(native.read().decode("utf-8", "replace"))
    seconds = time.perf_counter() - start
    text = err.getvalue()
    lines = text.strip().splitlines()
    if "Traceback" in text:
        return "bad-output", seconds, text[-300:]
    if code == 0:
        return "ok", seconds, ""
    if code == 2:
        return ("exit2" if len(lines) == 1 else "bad-output"), seconds, text.strip()[:300]
    if code == 1 and "internal error" in text:
        return "internal", seconds, text.strip()[:300]
    return "bad-output", seconds, f"exit {code}: {text.strip()[:300]}"


def _worker(jobs: list[tuple[int, Path, str]], start: int, timeout: float, fd: int) -> None:
    """In a forked child: run jobs[start:], one JSON line per run on ``fd``."""
    signal.signal(signal.SIGALRM, _alarm)
    with os.fdopen(fd, "w", buffering=1) as fh:
        for i in range(start, len(jobs)):
            _, model, path = jobs[i]
            fh.write(json.dumps({"i": i, "begin": True}) + "\n")
            outcome, seconds, line = _one(model, PATHS[path], timeout)
            fh.write(json.dumps({"i": i, "outcome": outcome, "s": seconds, "line": line}) + "\n")
    os._exit(0)


def run(jobs: list[tuple[int, Path, str]], timeout: float, budget: float) -> tuple[list[dict], bool]:
    """Run ``jobs`` in forked workers; a worker that dies is replaced after the run it died in."""
    results: list[dict] = []
    start_at = 0
    deadline = time.monotonic() + budget
    out_of_time = False
    while start_at < len(jobs):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _worker(jobs, start_at, timeout, write_fd)
        os.close(write_fd)
        current = start_at
        with os.fdopen(read_fd) as fh:
            for line in fh:
                rec = json.loads(line)
                if rec.get("begin"):
                    current = rec["i"]
                    if time.monotonic() > deadline:
                        out_of_time = True
                        os.kill(pid, signal.SIGKILL)
                        break
                    continue
                results.append({**rec, "model": jobs[rec["i"]][1].name, "path": jobs[rec["i"]][2]})
                current = rec["i"] + 1
        _, status = os.waitpid(pid, 0)
        if out_of_time:
            break
        if os.WIFSIGNALED(status) and current < len(jobs):
            results.append(
                {
                    "i": current,
                    "outcome": "crash",
                    "s": 0.0,
                    "model": jobs[current][1].name,
                    "path": jobs[current][2],
                    "line": f"signal {os.WTERMSIG(status)}",
                }
            )
            current += 1
        start_at = current
    return results, out_of_time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=540.0, help="wall-time bound in seconds (default 540)")
    ap.add_argument("--sample", type=int, default=0, help="run every k-th model (0: estimate k from the budget)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds before one run counts as a hang")
    ap.add_argument("--paths", default="cost,targets,measure", help="comma list of: cost, targets, measure")
    ap.add_argument("--json", metavar="F", help="write every run's outcome as JSON")
    args = ap.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="onnx-corpus-") as tmp:
        models = corpus(Path(tmp))
        made = time.monotonic() - t0
        print(f"corpus: {len(models)} models generated with onnx's test-case code in {made:.0f} s", flush=True)
        step = args.sample
        if step <= 0:  # probe: a few models, all paths, to estimate the cost per model
            probe = [(i, m, p) for i, m in enumerate(models[:: max(len(models) // 20, 1)][:20]) for p in paths]
            t = time.monotonic()
            run(probe, args.timeout, args.budget)
            per_model = (time.monotonic() - t) / max(len(probe) / len(paths), 1)
            left = args.budget - (time.monotonic() - t0)
            step = max(1, int(per_model * len(models) / max(left * 0.9, 1)) + 1)
        chosen = models[::step]
        jobs = [(i, m, p) for i, m in enumerate(chosen) for p in paths]
        note = "all" if step == 1 else f"a sample: every {step}th model"
        print(f"running {len(chosen)} models ({note}) x {len(paths)} paths = {len(jobs)} runs", flush=True)
        results, out_of_time = run(jobs, args.timeout, args.budget - (time.monotonic() - t0))
    counts: dict[str, collections.Counter] = {p: collections.Counter() for p in paths}
    for r in results:
        counts[r["path"]][r["outcome"]] += 1
    print(f"{'path':10s} " + " ".join(f"{o:>10s}" for o in OUTCOMES) + f" {'runs':>6s}")
    for p in paths:
        print(f"{p:10s} " + " ".join(f"{counts[p][o]:10d}" for o in OUTCOMES) + f" {sum(counts[p].values()):6d}")
    total = collections.Counter(r["outcome"] for r in results)
    print(f"{'all':10s} " + " ".join(f"{total[o]:10d}" for o in OUTCOMES) + f" {len(results):6d}")
    if out_of_time:
        print(f"stopped at the {args.budget:.0f} s budget after {len(results)} of {len(jobs)} runs")
    reasons = collections.Counter(r["line"].split(":", 2)[-1].strip()[:70] for r in results if r["outcome"] == "exit2")
    print("most common exit-2 reasons:")
    for reason, n in reasons.most_common(8):
        print(f"  {n:5d}  {reason}")
    for r in results:
        if r["outcome"] in ("internal", "bad-output", "crash", "hang"):
            print(f"  {r['outcome']:10s} {r['path']:8s} {r['model']}: {r['line'][:160]}")
    print(f"wall time {time.monotonic() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if not any(total[o] for o in ("internal", "bad-output", "crash", "hang")) else 1


if __name__ == "__main__":
    sys.exit(main())
