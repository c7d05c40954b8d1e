"""The per-point run path's speed-ups give the answers of the code they replace (issue 34, session 39).

- `DType.is_float` and `ValueKind.is_stored` are member attributes with the sets they had as properties;
- the precision rewrite keeps the type record of a value already at the asked dtype, so the cost
  pass after it keeps every cost;
- validate's graph cache hands its graph itself only to the last ask it was told to expect.
"""

from __future__ import annotations

from dabench_ir.ir import DType, ValueKind
from tests.lowering_graphs import decoder


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
    from dabench_ir.validate.cache import GraphCache

    built = []
    monkeypatch.setattr(graphs, "base_key", lambda params: f"k{params['hidden']}")
    monkeypatch.setattr(graphs, "build_graph", lambda base, layers: built.append(layers) or decoder())
    cache = GraphCache(tmp_path, lambda _m: None)
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
