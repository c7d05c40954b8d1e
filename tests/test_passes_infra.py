"""The pass infrastructure on its own: PassManager order and errors, symbol binding, layer
tagging, graph-level annotations, and the one pass list `build_passes` assembles."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dabench_ir.errors import UserError
from dabench_ir.frontends.onnx import load_onnx, onnx_node_names
from dabench_ir.ir import DType, Graph, Node, TensorType, Value, ValueKind
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import BindSymbols, Pass, PassError, PassManager, PassResult, TagLayers, meta
from dabench_ir.pipeline import build_passes
from tests.conftest import parse


def _graph(*nodes: Node, symbolic: bool = False) -> Graph:
    dim = "batch" if symbolic else 2
    names = {v for n in nodes for v in (*n.inputs, *n.outputs)}
    values = {v: Value(v, TensorType((dim, 4), DType.FLOAT32), ValueKind.ACTIVATION) for v in names}
    return Graph(nodes, values, [], [], name="g")


@dataclass(frozen=True)
class _Record(Pass):
    name: str = "record"
    log: list = None  # type: ignore[assignment]

    def call(self, graph: Graph) -> PassResult:
        self.log.append(self.name)
        return PassResult(graph, self.name.endswith("!"))


@dataclass(frozen=True)
class _Boom(Pass):
    name: str = "boom"

    def call(self, graph: Graph) -> PassResult:
        raise ZeroDivisionError("division by zero")


@dataclass(frozen=True)
class _UserMistake(Pass):
    name: str = "mistake"

    def call(self, graph: Graph) -> PassResult:
        raise UserError("--dim seq: the model has no symbolic dim 'seq'")


@dataclass(frozen=True)
class _Needs(Pass):
    name: str = "needs-cost"

    def requires(self, graph: Graph) -> None:
        for node in graph.nodes:
            meta.get(node, meta.COST)

    def call(self, graph: Graph) -> PassResult:
        return PassResult(graph, False)


class _NotAResult(Pass):
    name = "sloppy"

    def call(self, graph: Graph):  # type: ignore[override]
        return graph


# -- PassManager ---------------------------------------------------------------------------------


def test_passes_run_in_order_and_modified_is_any():
    log: list[str] = []
    pm = PassManager([_Record("a", log), _Record("b!", log), _Record("c", log)])
    result = pm(_graph())
    assert log == ["a", "b!", "c"] and result.modified is True
    assert pm.names == ["a", "b!", "c"] and set(pm.timings) == {"a", "b!", "c"}
    assert PassManager([_Record("a", [])])(_graph()).modified is False


def test_a_failing_pass_is_named_with_what_ran_before():
    log: list[str] = []
    with pytest.raises(PassError) as info:
        PassManager([_Record("a", log), _Record("b", log), _Boom(), _Record("c", log)])(_graph())
    assert str(info.value) == "pass 'boom' failed (passes run before it: a, b): division by zero"
    assert isinstance(info.value.__cause__, ZeroDivisionError) and log == ["a", "b"]
    with pytest.raises(PassError, match=r"pass 'boom' failed \(passes run before it: none\)"):
        PassManager([_Boom()])(_graph())


def test_a_user_error_passes_through_unwrapped():
    with pytest.raises(UserError, match=r"^--dim seq: the model has no symbolic dim 'seq'$"):
        PassManager([_Record("a", []), _UserMistake()])(_graph())


def test_requires_names_the_pass_to_run_first():
    graph = _graph(Node("mm", "MatMul", inputs=["x"], outputs=["y"]))
    with pytest.raises(PassError, match=r"pass 'needs-cost' failed .*run the 'cost' pass first"):
        PassManager([_Needs()])(graph)


def test_a_pass_must_return_a_pass_result():
    with pytest.raises(PassError, match="pass 'sloppy' returned Graph, not PassResult"):
        _NotAResult()(_graph())


# -- symbol binding ------------------------------------------------------------------------------


def test_bind_symbols_binds_and_refuses_unknown_names():
    graph = _graph(Node("r", "Relu", inputs=["x"], outputs=["y"]), symbolic=True)
    assert BindSymbols({"batch": 3})(graph).modified and graph.bindings == {"batch": 3}
    assert BindSymbols({})(graph).modified is False
    with pytest.raises(UserError, match=r"^--dim seq: the model has no symbolic dim 'seq' \(its symbols: batch\)$"):
        BindSymbols({"seq": 8})(graph)
    with pytest.raises(UserError, match=r"--dim batch=0: dims must be positive"):
        BindSymbols({"batch": 0})(graph)


# -- layer tagging -------------------------------------------------------------------------------


def test_tag_layers_reads_scopes_and_lends_unscoped_nodes_their_consumers_layer():
    const = Node("c", "Constant", outputs=["k"])
    q = Node("q", "MatMul", inputs=["x", "k"], outputs=["y"], scope="model.layers.3.attn.q_proj")
    v = Node("v", "MatMul", inputs=["x", "k"], outputs=["z"], scope="model.layers.3.attn.v_proj")
    shared = Node("s", "Constant", outputs=["w"])
    a = Node("a", "Add", inputs=["y", "w"], outputs=["u"], scope="transformer.h.0.mlp")
    b = Node("b", "Add", inputs=["z", "w"], outputs=["t"], scope="transformer.h.1.mlp")
    graph = _graph(const, shared, q, v, a, b)
    assert TagLayers()(graph).modified
    assert [n.layer for n in (q, v, a, b)] == [3, 3, 0, 1]
    assert const.layer == 3  # every consumer agrees
    assert shared.layer is None  # consumers in layers 0 and 1: left alone
    assert TagLayers()(graph).modified is False


# -- graph-level annotations ---------------------------------------------------------------------


def test_graph_keys_are_typed_and_name_their_writer():
    graph = _graph()
    assert meta.graph_precision(graph) is None and meta.graph_mode(graph) == "inference"
    assert meta.training_state(graph) is None
    with pytest.raises(meta.MissingAnnotationError, match="no 'train' annotation; run the 'training' pass first"):
        meta.graph_get(graph, meta.TRAINING)
    meta.graph_set(graph, meta.GRAPH_PRECISION, "bf16")
    assert meta.graph_precision(graph) == "bf16" == meta.graph_get(graph, meta.GRAPH_PRECISION)
    with pytest.raises(TypeError, match="'train' takes"):
        meta.graph_set(graph, meta.TRAINING, ["not", "a", "dict"])


# -- the one pass list ---------------------------------------------------------------------------


def test_build_passes_assembles_the_whole_list_from_the_options():
    standard = ["bind-symbols", "tag-layers", "classify", "fold-weight-layouts", "cost"]
    assert build_passes(ProfileOptions()).names == standard
    opts = ProfileOptions(precision="bf16", mode="train")
    assert build_passes(opts).names == [*standard, "precision", "training"]
    assert build_passes(opts, analysis=False).names == ["precision", "training"]
    assert build_passes(opts, linalg=True).names == ["linalg-cost", "precision", "training"]


def test_build_passes_runs_precision_and_training_on_a_graph():
    graph = load_onnx(parse("agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) { C = MatMul(A, B) }"))
    graph = build_passes(ProfileOptions(precision="fp16", mode="train"))(graph).graph
    assert meta.graph_precision(graph) == "fp16" and meta.graph_mode(graph) == "train"
    assert meta.training_state(graph)["optimizer"]


# -- node names ----------------------------------------------------------------------------------


def test_one_function_names_onnx_nodes():
    model = parse(
        """
        agraph (float[2] x) => (float[2] z) {
            y = Relu(x)
            a = Relu(y)
            b = Neg(a)
            z = Abs(b)
        }
        """
    )
    model.graph.node[1].name = "act"
    model.graph.node[2].name = "act"
    assert onnx_node_names(model.graph) == ["Relu_0", "act", "act__2", "Abs_3"]
    assert [n.name for n in load_onnx(model).nodes] == onnx_node_names(model.graph)
