"""The per-point run path's speed-ups give the answers of the code they replace (issue 34, session 39).

- the verifier's chain bound, its max written out, answers as the generator walk it replaced, on real
  graphs and where a value has two producers or a node is named "";
- `DType.is_float` and `ValueKind.is_stored` are member attributes with the sets they had as properties;
- the precision rewrite keeps the type record of a value already at the asked dtype, so the cost
  pass after it keeps every cost;
- validate's graph cache hands its graph itself only to the last ask it was told to expect.
"""

from __future__ import annotations

import pytest

from dabench_ir.ir import DType, Graph, Node, TensorType, Value, ValueKind
from dabench_ir.verify import _chain_bound
from tests.lowering_graphs import chain, decoder


class _Ctx:  # what `_chain_bound` reads of the verifier's context
    def __init__(self, graph: Graph) -> None:
        from dabench_ir.report.model import Report

        self.plan = None
        self.report = Report(model={}, target=None, config={}, nodes=[], unattributed=[], totals={}, graph=graph)


def _graph(edges: list[tuple[str, list[str], list[str]]]) -> Graph:
    t = TensorType((2,), DType.FLOAT32)
    names = {v for _, ins, outs in edges for v in (*ins, *outs) if v}
    values = {v: Value(v, t, ValueKind.ACTIVATION) for v in names}
    nodes = [Node(n, "Add", inputs=ins, outputs=outs) for n, ins, outs in edges]
    return Graph(nodes, values, [], [])


def _chain_bound_mapped(graph: Graph, bounds: dict[str, float]) -> tuple[float, str] | None:
    """The chain walk as it was written before (the reference)."""
    producer: dict[str, str] = {}
    for node in graph.nodes:
        for out in node.outputs:
            producer[out] = node.name
    best: dict[str, float] = {}
    top: tuple[float, str] | None = None
    for node in graph.nodes:
        before = max((best.get(producer.get(i, ""), 0.0) for i in node.inputs), default=0.0)
        best[node.name] = before + bounds.get(node.name, 0.0)
        if top is None or best[node.name] > top[0]:
            top = (best[node.name], node.name)
    return top


def test_chain_walk_equals_the_producer_map_on_real_graphs():
    for graph in (chain([4, 8, 2], [2, 2, 2]), decoder()):
        bounds = {n.name: 1.0 + (i % 7) / 3 for i, n in enumerate(graph.nodes)}
        assert _chain_bound(_Ctx(graph), bounds) == _chain_bound_mapped(graph, bounds)


@pytest.mark.parametrize(
    "edges, expected",
    [
        # a -> b -> c: 1 + 2 + 3
        ([("a", ["x"], ["y"]), ("b", ["y"], ["z"]), ("c", ["z"], ["w"])], (6.0, "c")),
        # y written twice: the map reads its last producer (d, not yet walked when b reads it: 0)
        ([("a", ["x"], ["y"]), ("b", ["y"], ["z"]), ("d", ["z"], ["y"])], (7.0, "d")),
        # a node named "": the map's key for "no producer", read by every input without one
        ([("", ["x"], ["y"]), ("b", ["q"], ["z"])], (3.0, "b")),
    ],
)
def test_chain_bound_takes_the_map_where_the_walk_would_differ(edges, expected):
    graph = _graph(edges)
    bounds = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 5.0, "": 1.0}
    assert _chain_bound(_Ctx(graph), bounds) == _chain_bound_mapped(graph, bounds) == expected


def test_dtype_and_value_kind_flags():
    floats = {"fp32", "fp16", "fp64", "bf16", "fp8e4m3", "fp8e4m3fnuz", "fp8e5m2", "fp8e5m2fnuz"}
    assert {d.short for d in DType if d.is_float} == floats
    assert all(type(d.is_float) is bool for d in DType)
    assert [k for k in ValueKind if k.is_stored] == [ValueKind.WEIGHT, ValueKind.CONSTANT]


def test_precision_at_the_model_dtype_keeps_types_and_costs():
    from dabench_ir.passes import meta, standard_passes
    from dabench_ir.run import prepare, resolve

    graph = standard_passes()(decoder(dtype=DType.FLOAT32)).graph
    before = {n.name: meta.get_cost(n) for n in graph.nodes}
    types = {k: v.type for k, v in graph.values.items()}
    run = resolve(graph, None, {"precision": "fp32"})
    out = prepare(run, graph)
    assert all(out.values[k].type is t for k, t in types.items())  # the same records, not copies
    assert {n.name: meta.get_cost(n) for n in out.nodes} == before
    assert {n.meta[meta.PRECISION] for n in out.nodes} == {DType.FLOAT32}


def test_validate_cache_hands_its_graph_to_the_last_expected_ask(tmp_path, monkeypatch):
    from dabench_ir.sweep import graphs
    from dabench_ir.validate.cache import _GraphCache

    built = []
    monkeypatch.setattr(graphs, "base_key", lambda params: f"k{params['hidden']}")
    monkeypatch.setattr(graphs, "build_graph", lambda base, layers: built.append(layers) or decoder())
    cache = _GraphCache(tmp_path, lambda _m: None)
    cache.bases = {"k8": b"", "k16": b""}
    a, b = {"hidden": 8, "layers": 2}, {"hidden": 16, "layers": 2}
    cache.expect([a, a, {"hidden": 8}])  # a model without layers is not counted
    first, second = cache.graph(a), cache.graph(a)
    assert first is not second and second is not None and built == [2]
    assert (cache.bases["k8"], 2) not in cache.graphs  # handed out: the next ask builds it again
    third = cache.graph(a)
    assert built == [2, 2] and (cache.bases["k8"], 2) not in cache.uses
    assert cache.graph(b) is not cache.graphs[("k16", 2)]  # not expected: a copy, the graph kept
    assert third is not cache.graphs[("k8", 2)]
