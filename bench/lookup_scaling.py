"""Why a deeper model costs more per node (issue 43: a 10,000-layer profile within 10x of the
1,000-layer one): the same per-node reads, timed on a loaded decoder and on one several times deeper.

    .venv/bin/python bench/lookup_scaling.py                    # 1,000 and 6,000 layers
    .venv/bin/python bench/lookup_scaling.py --layers 1000,3000

Three walks over ``graph.nodes``, in graph order, each a kind of read the passes, lowerings and the
emulator make for every node: a field of the node itself (``node.inputs``, ``node.meta``), a
record looked up by the node's name in a dict of every node (the lowerings' ``costs[name]``, the
emulator's ``node_plans[name]``), and each input's `Value` looked up by its name in the graph's
value table. Nanoseconds per node, CPU time, best of ``--repeat``.

A read of the node itself costs the same at any depth; a read by name through a dict of all nodes
grows with the dict (its table and the records it points at outgrow the CPU caches, so each
probe is a cache miss). That growth, on the ~50 name-keyed reads each node gets in a run, is what
makes the per-node cost of a whole profile rise with depth; the structural answer is per-node data
held by position (columns, or on the node), not in name-keyed tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from _models import exported


def _best(walk: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        walk()
        best = min(best, time.process_time() - start)
    return best


def measure(layers: int, repeat: int) -> dict[str, float]:
    """Nanoseconds per node of each walk on the GPT-2-small block stamped ``layers`` times."""
    from dabench_ir.frontends.onnx import load_onnx

    path = exported(f"gpt2-L{layers}.onnx", "--preset", "gpt2-small", "--layers", str(layers), "--weights", "none")
    graph = load_onnx(path)
    nodes, values = graph.nodes, graph.values
    by_name = {node.name: node for node in nodes}

    def own_fields() -> int:
        return sum(len(node.inputs) + len(node.meta) for node in nodes)

    def by_node_name() -> int:
        return sum(len(by_name[node.name].inputs) for node in nodes)

    def inputs_by_value_name() -> int:
        return sum(values[v].type is not None for node in nodes for v in node.inputs)

    walks = {
        "node's own fields": own_fields,
        "record by node name": by_node_name,
        "inputs by value name": inputs_by_value_name,
    }
    return {what: _best(walk, repeat) / len(nodes) * 1e9 for what, walk in walks.items()} | {"nodes": len(nodes)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="1000,6000", help="two layer counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=5, help="walks per figure (the best is kept)")
    args = ap.parse_args(argv)
    depths = [int(x) for x in args.layers.split(",")]
    rows = {d: measure(d, args.repeat) for d in depths}
    first, last = rows[depths[0]], rows[depths[-1]]
    print(
        "| read, ns per node (CPU) | "
        + " | ".join(f"{d:,} layers ({rows[d]['nodes']:,.0f} nodes)" for d in depths)
        + " | ratio |"
    )
    print("|---|" + "---|" * (len(depths) + 1))
    for what in (k for k in first if k != "nodes"):
        cells = " | ".join(f"{rows[d][what]:.0f}" for d in depths)
        print(f"| {what} | {cells} | {last[what] / first[what]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
