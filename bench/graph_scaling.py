"""Time per node of placing, emulating and reporting graphs of growing size, on every target,
and time beside batch size and micro-batch count (issue 34: linear in nodes, flat in batch).

    .venv/bin/python bench/graph_scaling.py             # the whole table: 1k-100k nodes, decoders, batches
    .venv/bin/python bench/graph_scaling.py --quick     # 1k-10k nodes, 8- and 80-layer decoders, batches
    .venv/bin/python bench/graph_scaling.py --sizes 1000,50000 --targets wse2,sn30 --sections size

Four tables, each cell one run of ``profile_graph`` on a clone of a graph loaded once
(`pipeline.load_graph`: the ONNX import and shape inference, not timed), then the report's JSON
(``Report.to_json``): the costing passes, placement, emulation, metrics, report and the
physics verifier. The first row of each table runs once untimed first (a target's first use
loads its calibration and modules).

- ``size``: a chain of N small elementwise nodes (``Relu``/``Add`` on a [64, 64] tensor) and a
  wide graph (8 such chains side by side, joined at the end); microseconds per node.
- ``decoder``: a weight-free LLaMA-2-70B-shaped decoder (hidden 8192, 64 heads, 8 KV heads, ffn
  28672, vocab 32000, seq 4096) exported by ``dabench-ir export`` at 8 and 80 layers (one block
  exported with torch and stamped), inference and training; microseconds per node.
- ``batch``: the 80-layer decoder at batch 1 / 64 / 4096, inference, and training with
  micro-batch 1 (gradient accumulation over ``batch`` micro-batches); seconds per run.
- ``pipeline``: bench/README.md's IPU case, GPT-2 small training on 4 IPUs
  (``--ipus 4 --layers-per-ipu 0,4,4,4 --micro-batch-size 1 --batch B``) at 1 / 128 / 4096
  micro-batches; seconds per run.

The figure to read: a column that rises down a table is super-linear in nodes (or grows with
batch). The last line names every column whose last row is more than 1.5x its first
(``--growth``): quadratic work is 100x from 1k to 100k nodes, n log n 1.67x, and on a machine
others share a large graph's time per node rises by up to ~1.6x with the same work (cache; on
such a machine read ``--clock cpu``). tests/test_graph_scaling.py counts the work instead
(Python calls per node, lines per micro-batch count), which no machine's load changes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx
from _models import exported
from onnx import TensorProto, helper

GROWTH = 2.0
"""A column flagged: its last row over its first (per node, or per run in the batch tables). From 1k
to 100k nodes n log n is 1.67x per node and quadratic 100x; the machine's noise is about 1.3x."""

TARGETS = "wse2,sn30,bow,h100,cpu"
DECODER = ("--preset", "llama-70b", "--weights", "none", "--dynamic")  # seq 4096, bound at run time
DECODER_SHAPE = {"seq": 4096}
GPT2 = ("--preset", "gpt2-small", "--weights", "none", "--dynamic")
IPU_PIPELINE = {"mode": "train", "ipus": 4, "layers_per_ipu": (0, 4, 4, 4), "micro_batch": 1, "seq": 1024}


def chain(n: int, width: int = 1) -> onnx.ModelProto:
    """``width`` chains of ``n // width`` elementwise nodes on a [64, 64] tensor, joined by Adds."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    nodes, heads = [], []
    per = max(1, n // width)
    for w in range(width):
        prev = "x"
        for i in range(per):
            out = f"t{w}_{i}"
            op = "Relu" if i % 2 else "Add"
            nodes.append(helper.make_node(op, [prev] if op == "Relu" else [prev, "x"], [out], name=f"n{w}_{i}"))
            prev = out
        heads.append(prev)
    while len(heads) > 1:  # join the branches pairwise
        a, b = heads.pop(), heads.pop()
        out = f"j{len(nodes)}"
        nodes.append(helper.make_node("Add", [a, b], [out], name=out))
        heads.insert(0, out)
    y = helper.make_tensor_value_info(heads[0], TensorProto.FLOAT, [64, 64])
    graph = helper.make_graph(nodes, "scaling", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def decoder(layers: int) -> Path:
    """The weight-free LLaMA-2-70B-shaped decoder at ``layers`` layers, cached under bench/_cache."""
    return exported(f"llama-70b-L{layers}-dyn.onnx", *DECODER, "--layers", str(layers))


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``--clock``: wall time, or this process's CPU time (steadier on a machine others share)."""


def _seconds(graph, target: str, options: dict, repeat: int, clock: str = "wall") -> float:
    """Best of ``repeat`` runs: profile a clone of ``graph`` on ``target`` and write its report's JSON."""
    from dabench_ir.pipeline import profile_graph

    now = CLOCKS[clock]
    best = float("inf")
    for _ in range(repeat):
        start = now()
        profile_graph(graph.clone(), target, dict(options)).to_json(indent=None)
        best = min(best, now() - start)
    return best


class Table:
    """Rows of cells printed as they come (fixed width, or markdown), and the columns that grow."""

    def __init__(self, title: str, keys: list[str], columns: list[str], unit: str, markdown: bool) -> None:
        self.title, self.keys, self.columns, self.unit, self.markdown = title, keys, columns, unit, markdown
        self.rows: list[tuple[list[str], list[float]]] = []
        print(f"\n{title} ({unit})")
        if markdown:
            print("| " + " | ".join(keys + columns) + " |")
            print("|" + "---|" * (len(keys) + len(columns)))
        else:
            print(" ".join(f"{k:>12s}" for k in keys) + " " + " ".join(f"{c:>10s}" for c in columns))

    def row(self, keys: list[str], cells: list[float]) -> None:
        self.rows.append((keys, cells))
        digits = 3 if self.unit == "s" else 1
        if self.markdown:
            print("| " + " | ".join(keys + [f"{c:,.{digits}f}" for c in cells]) + " |", flush=True)
        else:
            print(" ".join(f"{k:>12s}" for k in keys) + " " + " ".join(f"{c:10.{digits}f}" for c in cells), flush=True)

    def growth(self, group: Callable[[list[str]], str], limit: float = GROWTH) -> list[str]:
        """One line per column whose last row (within a group of rows) is over ``limit`` x its first."""
        flagged, groups = [], {}
        for keys, cells in self.rows:
            groups.setdefault(group(keys), []).append((keys, cells))
        for name, rows in groups.items():
            (first_keys, first), (last_keys, last) = rows[0], rows[-1]
            for column, a, b in zip(self.columns, first, last, strict=True):
                if len(rows) > 1 and b > limit * a:
                    flagged.append(
                        f"{self.title}: {name} {column} {b / a:.2f}x {self.unit} "
                        f"from {'/'.join(first_keys)} to {'/'.join(last_keys)}"
                    )
        return flagged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="node counts of the chains and wide graphs")
    ap.add_argument("--quick", action="store_true", help="sizes 1000,2500,10000 (unless --sizes is given)")
    ap.add_argument("--targets", default=TARGETS, help="targets, comma-separated")
    ap.add_argument("--shapes", default="chain,wide", help="chain and/or wide")
    ap.add_argument("--depths", default="8,80", help="decoder layer counts")
    ap.add_argument("--batches", default="1,64,4096", help="batch sizes of the 80-layer decoder")
    ap.add_argument("--micro-batches", default="1,128,4096", help="micro-batches of the IPU pipeline")
    ap.add_argument("--sections", default="size,decoder,batch,pipeline", help="tables to run, comma-separated")
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs per cell")
    ap.add_argument("--clock", choices=tuple(CLOCKS), default="wall", help="wall or CPU time (default wall)")
    ap.add_argument("--growth", type=float, default=GROWTH, help=f"flag past this last/first ({GROWTH})")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = ap.parse_args(argv)
    if args.quick and "--sizes" not in (argv if argv is not None else sys.argv[1:]):
        args.sizes = "1000,2500,10000"

    from dabench_ir.pipeline import load_graph

    targets = args.targets.split(",")
    sections = args.sections.split(",")
    flagged: list[str] = []
    print(f"{args.clock} time, best of {args.repeat} per cell")

    def cells(graph, options: dict, warm: bool, per_node: bool) -> list[float]:
        out = []
        for t in targets:
            if warm:
                _seconds(graph, t, options, 1)
            seconds = _seconds(graph, t, options, args.repeat, args.clock)
            out.append(seconds / len(graph.nodes) * 1e6 if per_node else seconds)
        return out

    if "size" in sections:
        table = Table("placement by graph size", ["graph", "nodes"], targets, "us/node", args.markdown)
        with tempfile.TemporaryDirectory() as tmp:
            for shape in args.shapes.split(","):
                for i, n in enumerate(int(s) for s in args.sizes.split(",")):
                    path = Path(tmp) / f"{shape}{n}.onnx"
                    onnx.save(chain(n, 1 if shape == "chain" else 8), path)
                    graph = load_graph(str(path))
                    table.row([shape, f"{len(graph.nodes):,}"], cells(graph, {}, i == 0, per_node=True))
        flagged += table.growth(lambda keys: keys[0], args.growth)

    if "decoder" in sections:
        graphs = {layers: load_graph(str(decoder(layers))) for layers in (int(s) for s in args.depths.split(","))}
        table = Table("LLaMA-2-70B-shaped decoder", ["mode", "layers", "nodes"], targets, "us/node", args.markdown)
        for mode in ("inference", "train"):
            for i, (layers, graph) in enumerate(graphs.items()):
                options = {**DECODER_SHAPE, "batch": 1, "mode": mode}
                table.row([mode, str(layers), f"{len(graph.nodes):,}"], cells(graph, options, i == 0, per_node=True))
        flagged += table.growth(lambda keys: keys[0], args.growth)

    if "batch" in sections:
        graph = load_graph(str(decoder(80)))
        table = Table("80-layer decoder by batch", ["mode", "batch", "micro-batches"], targets, "s", args.markdown)
        for mode in ("inference", "train"):
            for i, batch in enumerate(int(s) for s in args.batches.split(",")):
                options = {**DECODER_SHAPE, "batch": batch, "mode": mode}
                if mode == "train":
                    options["micro_batch"] = 1
                table.row(
                    [mode, str(batch), str(batch) if mode == "train" else "-"],
                    cells(graph, options, i == 0, per_node=False),
                )
        flagged += table.growth(lambda keys: keys[0], args.growth)

    if "pipeline" in sections:
        graph = load_graph(str(exported("gpt2-small-dyn.onnx", *GPT2)))
        table = Table(
            "GPT-2 small training, 4 IPUs, layers 0,4,4,4, micro-batch 1",
            ["batch", "micro-batches"],
            ["bow"],
            "s",
            args.markdown,
        )
        for i, batch in enumerate(int(s) for s in args.micro_batches.split(",")):
            if i == 0:
                _seconds(graph, "bow", {**IPU_PIPELINE, "batch": batch}, 1)
            seconds = _seconds(graph, "bow", {**IPU_PIPELINE, "batch": batch}, args.repeat, args.clock)
            table.row([str(batch), str(batch)], [seconds])
        flagged += table.growth(lambda _keys: "pipeline", args.growth)

    print()
    if flagged:
        for line in flagged:
            print(f"GROWS: {line}")
    else:
        print(f"no column grows more than {args.growth}x from its first row to its last")
    return 0


if __name__ == "__main__":
    sys.exit(main())
