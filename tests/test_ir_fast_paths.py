"""The IR's fast paths give what their plain forms give: Cost's stored sums, the consumers map,
the parameter count over shared types, and a clone's independence."""

from __future__ import annotations

import copy
import dataclasses
import pickle

from dabench_ir.ir import ZERO_COST, Cost, DType, Graph, Node, TensorType, Value, ValueKind

_FIELDS = ("contraction_flops", "vector_flops", "special_ops", "weight_bytes", "act_bytes_in", "act_bytes_out")


def test_cost_sums_follow_every_way_a_cost_is_made():
    c = Cost(contraction_flops=10, vector_flops=2, special_ops=1, weight_bytes=4, act_bytes_in=8, act_bytes_out=16)
    assert (c.flops, c.bytes) == (13, 28)
    assert tuple(f.name for f in dataclasses.fields(Cost)) == _FIELDS
    assert repr(c) == (
        "Cost(contraction_flops=10, vector_flops=2, special_ops=1, weight_bytes=4, act_bytes_in=8, act_bytes_out=16)"
    )
    made = {
        "sum": c + c,
        "plus_bytes": c.plus_bytes(1, 2, 3),
        "scale": c.scale(3),
        "replace": dataclasses.replace(c, vector_flops=7),
        "pickle": pickle.loads(pickle.dumps(c)),
        "deepcopy": copy.deepcopy(c),
        "copy": copy.copy(c),
    }
    expected = {
        "sum": (26, 56),
        "plus_bytes": (13, 34),
        "scale": (39, 84),
        "replace": (18, 28),
        "pickle": (13, 28),
        "deepcopy": (13, 28),
        "copy": (13, 28),
    }
    assert {k: (v.flops, v.bytes) for k, v in made.items()} == expected
    assert made["pickle"] == c and hash(made["pickle"]) == hash(c)
    assert (ZERO_COST.flops, ZERO_COST.bytes, ZERO_COST.intensity) == (0, 0, None)
    assert c.as_dict() == dict(zip(_FIELDS, (10, 2, 1, 4, 8, 16), strict=True))


def _graph() -> Graph:
    f32 = TensorType((2, 3), DType.FLOAT32)
    w = TensorType((3, 3), DType.FLOAT32)  # one record shared by both weights
    values = {
        "x": Value("x", f32, ValueKind.INPUT),
        "w1": Value("w1", w, ValueKind.WEIGHT),
        "w2": Value("w2", w, ValueKind.WEIGHT),
        "b": Value("b", TensorType((3,), DType.FLOAT32), ValueKind.WEIGHT),
        "h": Value("h", f32, ValueKind.ACTIVATION, "mm"),
        "s": Value("s", f32, ValueKind.ACTIVATION, "sq"),
        "y": Value("y", f32, ValueKind.OUTPUT, "out"),
    }
    nodes = [
        Node("mm", "MatMul", inputs=["x", "w1"], outputs=["h"], meta={"k": {"nested": 1}}),
        Node("sq", "Mul", inputs=["h", "h"], outputs=["s"]),  # reads h twice: one consumer
        Node("out", "Add", inputs=["s", "", "h", "b", "w2"], outputs=["y"]),  # an empty (omitted) input
    ]
    return Graph(nodes, values, ["x"], ["y"])


def test_consumers_list_each_reader_once_in_node_order():
    g = _graph()
    assert {k: [n.name for n in v] for k, v in g.consumers.items()} == {
        "x": ["mm"],
        "w1": ["mm"],
        "h": ["sq", "out"],
        "s": ["out"],
        "b": ["out"],
        "w2": ["out"],
    }
    assert list(g.consumers) == ["x", "w1", "h", "s", "b", "w2"]  # first read first


def test_num_params_sizes_shared_types_and_says_none_when_symbolic():
    g = _graph()
    assert g.num_params == 9 + 9 + 3
    g.values["b"].type = TensorType(("n",), DType.FLOAT32)
    assert g.num_params is None
    g.bindings["n"] = 5
    assert g.num_params == 9 + 9 + 5


def test_clone_copies_nodes_values_and_dict_annotations():
    g = _graph()
    c = g.clone()
    assert [(n.name, n.inputs, n.outputs, n.meta) for n in c.nodes] == [
        (n.name, n.inputs, n.outputs, n.meta) for n in g.nodes
    ]
    first = c.nodes[0]
    first.inputs.append("z")
    first.meta["k"]["nested"] = 2
    first.meta["new"] = 1
    c.values["h"].type = TensorType((2, 3), DType.FLOAT16)
    assert g.nodes[0].inputs == ["x", "w1"] and g.nodes[0].meta == {"k": {"nested": 1}}
    assert g.values["h"].type.dtype is DType.FLOAT32
    assert c.node("sq") is c.nodes[1] and c.consumers["h"][0] is c.nodes[1]
