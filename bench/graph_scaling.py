"""Time per node of placing, emulating and reporting graphs of growing size, on every target.

    .venv/bin/python bench/graph_scaling.py                       # chains and wide graphs, 1k-10k nodes
    .venv/bin/python bench/graph_scaling.py --sizes 1000,10000,50000,100000 --targets wse2,rdu

A chain is N small elementwise nodes in a row (``Relu``/``Add`` on a [64, 64] tensor); a wide
graph is 8 such chains side by side, joined at the end. Each graph is loaded once
(`pipeline.load_graph`: the ONNX import and shape inference), then ``profile_graph`` runs the
costing passes on a clone, places it on each target, emulates it and builds the report, physics
verifier included, timed alone.
The figure to read is microseconds per node: a column that rises with N is super-linear.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,2500,5000,10000", help="node counts, comma-separated")
    ap.add_argument("--targets", default="wse2,sn30,bow,h100", help="targets, comma-separated")
    ap.add_argument("--shapes", default="chain,wide", help="chain and/or wide")
    args = ap.parse_args(argv)

    from dabench_ir.pipeline import load_graph, profile_graph

    sizes = [int(s) for s in args.sizes.split(",")]
    targets = args.targets.split(",")
    print(f"{'graph':>14s} {'nodes':>7s} {'load':>7s} " + " ".join(f"{t + ' us/node':>16s}" for t in targets))
    cases = [(shape, n) for shape in args.shapes.split(",") for n in sizes]
    with tempfile.TemporaryDirectory() as tmp:
        for shape, n in cases:
            path = Path(tmp) / f"{shape}{n}.onnx"
            onnx.save(chain(n, 1 if shape == "chain" else 8), path)
            t0 = time.perf_counter()
            graph = load_graph(str(path))
            load = time.perf_counter() - t0
            cells = []
            for t in targets:
                t0 = time.perf_counter()
                profile_graph(graph.clone(), t)
                cells.append(f"{(time.perf_counter() - t0) / len(graph.nodes) * 1e6:16.1f}")
            print(f"{shape:>14s} {len(graph.nodes):7d} {load:6.2f}s " + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
