"""How well the calibrated ``cpu`` target predicts measured onnxruntime node times.

Exports GPT-2 and LLaMA decoder stacks at a few sizes (weights synthesised at run time),
measures every node with onnxruntime's profiler (`dabench_ir.execute.measure`), predicts
every node from the host calibration (`dabench_ir.lowering.cpu.predict_cpu_times`),
and prints end-to-end and per-node errors (nodes taking >= 1% of the measured time).

    python bench/fidelity_cpu.py                  # default sizes, cached calibration
    python bench/fidelity_cpu.py --recalibrate --threads 2 --by-op

Goal: end-to-end error <= 10 %, median per-node error <= 20 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

from dabench_ir.execute import measure
from dabench_ir.execute.calibrate import calibrate, cpu_target_path
from dabench_ir.lowering.cpu import load_cpu_model, predict_cpu_times
from dabench_ir.metrics import prediction_error
from dabench_ir.models import ModelConfig
from dabench_ir.models.export import export_onnx
from dabench_ir.pipeline import analyze

# (family, layers, hidden, seq): heads = hidden / 64
SIZES = (
    ("gpt2", 2, 256, 128),
    ("gpt2", 2, 512, 256),
    ("gpt2", 2, 768, 128),
    ("llama", 2, 256, 128),
    ("llama", 2, 512, 256),
    ("llama", 2, 768, 128),
)


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{100 * x:5.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--recalibrate", action="store_true", help="measure the host again first")
    ap.add_argument("--by-op", action="store_true", help="print the error per op type too")
    ap.add_argument("--only", default=None, help="run only this family (gpt2 or llama)")
    ap.add_argument(
        "--trials",
        type=int,
        default=1,
        help="measure each model N times and keep each node's fastest median (damps bursts of other load)",
    )
    args = ap.parse_args(argv)

    path = calibrate(args.threads, verbose=True) if args.recalibrate else cpu_target_path(args.threads)
    model = load_cpu_model(path)
    print(f"calibration: {path}   (load average now: {', '.join(f'{x:.2f}' for x in os.getloadavg())})")
    print(
        f"  peak fp32 {model.peak_flops / 1e9:.1f} GFLOP/s, stream {model.bandwidth / 1e9:.1f} GB/s, "
        f"overhead {model.overhead_s * 1e6:.1f} us"
    )
    header = f"{'model':28s} {'nodes':>5s} {'cmp':>4s} {'meas ms':>8s} {'pred ms':>8s} {'e2e':>6s} {'median':>6s} {'p90':>6s}"
    print(header)
    e2es: list[float] = []
    medians: list[float] = []
    by_op: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for family, layers, hidden, seq in SIZES:
        if args.only and family != args.only:
            continue
        cfg = ModelConfig(family=family, layers=layers, hidden=hidden, heads=hidden // 64, seq=seq)
        proto = export_onnx(cfg, weights="none")
        graph = analyze(proto)
        start = time.perf_counter()
        m = measure(proto, graph, warmup=args.warmup, repeat=args.repeat, threads=args.threads, target=path)
        for _ in range(args.trials - 1):
            again = measure(proto, graph, warmup=args.warmup, repeat=args.repeat, threads=args.threads)
            m.node_times = {n: min(t, again.node_times.get(n, t)) for n, t in m.node_times.items()}
        wall = time.perf_counter() - start
        pred = predict_cpu_times(graph, model)
        err = prediction_error(pred, m.node_times)
        meas_ms = sum(m.node_times.values()) * 1e3
        pred_ms = sum(pred[n] for n in m.node_times if n in pred) * 1e3
        name = f"{family} L{layers} H{hidden} S{seq}"
        print(
            f"{name:28s} {len(graph.nodes):5d} {err['nodes_compared']:4d} {meas_ms:8.2f} {pred_ms:8.2f} "
            f"{_pct(err['end_to_end_rel_error'])} {_pct(err['median_node_rel_error'])} "
            f"{_pct(err['p90_node_rel_error'])}   ({wall:.1f} s)"
        )
        if err["end_to_end_rel_error"] is not None:
            e2es.append(err["end_to_end_rel_error"])
            medians.append(err["median_node_rel_error"] or 0.0)
        total = sum(m.node_times.values())
        for node in graph.nodes:
            t = m.node_times.get(node.name)
            if t is not None and node.name in pred and t >= 0.01 * total:
                by_op[node.op_type].append((pred[node.name], t))
    if e2es:
        print(
            f"{'mean over models':28s} {'':5s} {'':4s} {'':8s} {'':8s} {_pct(statistics.mean(e2es))} "
            f"{_pct(statistics.mean(medians))}"
        )
        ok = max(e2es) <= 0.10 and max(medians) <= 0.20
        print(f"goal (e2e <= 10%, median node <= 20% on every model): {'met' if ok else 'NOT met'}")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    if args.by_op:
        print("\nper op type (nodes >= 1% of their model's time): count, sum pred/meas, median |err|")
        for op, pairs in sorted(by_op.items(), key=lambda kv: -sum(t for _, t in kv[1])):
            ratio = sum(p for p, _ in pairs) / sum(t for _, t in pairs)
            med = statistics.median(abs(p - t) / t for p, t in pairs)
            print(f"  {op:22s} {len(pairs):4d}  {ratio:5.2f}  {100 * med:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
