"""The lowering context's value index and the liveness walk that reads it give what the plain
per-value rules give: the index is a speed-up (one pass over the values per context), never a
second definition."""

from __future__ import annotations

import pytest

from dabench_ir.ir import TensorType, Value, ValueKind
from dabench_ir.lowering.context import LoweringContext, peak_live_bytes, value_bytes
from dabench_ir.passes import PassManager
from dabench_ir.passes.training import TrainingPass
from tests.lowering_graphs import decoder


def _peak_reference(ctx: LoweringContext, nodes, skip=frozenset()) -> int:
    """Peak live activation bytes, walked from the value kinds and sizes afresh (no index)."""
    graph = ctx.graph
    in_set = {n.name for n in nodes}
    position = {n.name: i for i, n in enumerate(nodes)}
    last_use: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            if value is None or value.kind.is_stored:
                continue
            last_use[v] = i
            sizes.setdefault(v, value_bytes(graph, v))
        out_default = ctx.costs[node.name].act_bytes_out // max(1, len(node.outputs))
        for v in node.outputs:
            value = graph.values.get(v) if v else None
            if v and (value is None or not value.kind.is_stored):
                sizes[v] = value_bytes(graph, v, out_default)
                last_use.setdefault(v, i)
    for v in graph.outputs:
        if v in sizes:
            last_use[v] = len(nodes)
    for v in sizes:
        if any(c.name not in in_set for c in graph.consumers.get(v, ())):
            last_use[v] = len(nodes)
    events: dict[int, int] = {}
    for v, size in sizes.items():
        if v in skip:
            continue
        value = graph.values.get(v)
        prod = value.producer if value is not None else None
        born = position[prod] if prod in in_set else 0
        events[born] = events.get(born, 0) + size
        events[last_use[v] + 1] = events.get(last_use[v] + 1, 0) - size
    peak = live = 0
    for i in sorted(events):
        live += events[i]
        peak = max(peak, live)
    return peak


def _graphs():
    inference = decoder(layers=3, hidden=64, seq=16)
    inference.values["free"] = Value(
        "free", TensorType(("n", 4), inference.values[inference.inputs[0]].type.dtype), ValueKind.ACTIVATION
    )
    train = PassManager([TrainingPass()])(decoder(layers=2, hidden=64, seq=16)).graph
    return [inference, train]


@pytest.mark.parametrize("graph", _graphs(), ids=["inference", "train"])
def test_value_index_is_the_kind_rule_and_the_size_rule(graph):
    ctx = LoweringContext.build(graph)
    assert ctx.stored == {n for n, v in graph.values.items() if n and v.kind.is_stored}
    assert ctx.activations == {n for n, v in graph.values.items() if n and not v.kind.is_stored}
    assert ctx.stored and ctx.activations and not ctx.stored & ctx.activations
    for name in [*graph.values, "missing"]:
        assert ctx.value_bytes(name, 5) == value_bytes(graph, name, 5)


@pytest.mark.parametrize("graph", _graphs(), ids=["inference", "train"])
def test_peak_live_bytes_equals_a_fresh_walk_for_the_graph_and_its_subsets(graph):
    ctx = LoweringContext.build(graph)
    nodes = graph.nodes
    inner = {v for n in nodes[3:9] for v in n.outputs if v}
    subsets = [nodes, list(nodes), nodes[:7], nodes[5:], nodes[::2], [n for n in nodes if n.layer == 1], []]
    for subset in subsets:
        for skip in (frozenset(), inner):
            assert peak_live_bytes(ctx, subset, skip) == _peak_reference(ctx, subset, skip)
    assert peak_live_bytes(ctx, nodes) > peak_live_bytes(ctx, nodes[:3]) > 0
