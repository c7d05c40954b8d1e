"""The pass infrastructure on its own: PassManager order and errors, symbol binding, layer
tagging, graph-level annotations, in-place declarations, `Graph.clone`, and the one pass list a
run assembles (`dabench_ir.run`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dabench_ir.errors import UserError
from dabench_ir.frontends.onnx import load_onnx, onnx_node_names
from dabench_ir.ir import DType, Graph, Node, TensorType, Value, ValueKind
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import BindSymbols, Pass, PassError, PassManager, PassResult, TagLayers, meta, standard_passes
from dabench_ir.run import analysis_passes, prepare, resolve, transform_passes
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
    with pytest.raises(UserError, match=r"--dim batch=-1: dims must be whole numbers"):
        BindSymbols({"batch": -1})(graph)


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


def test_tag_layers_leaves_a_root_op_between_the_embeddings_and_the_first_block_in_no_block():
    """GPT-2's token + position add is an op of the model's root (scope ''), read by block 0 alone: it
    reads the embeddings, which are no block's, so it is not block 0's either. A cast the optimiser put
    between two of block 0's ops (no scope, its reads block 0's) still is."""
    tok = Node("tok", "Gather", inputs=["wte", "ids"], outputs=["e"], scope="embed")
    pos = Node("pos", "Gather", inputs=["wpe", "ids"], outputs=["p"], scope="pos_embed")
    add = Node("add", "Add", inputs=["e", "p"], outputs=["h"])
    norm = Node("norm", "LayerNormalization", inputs=["h"], outputs=["n"], scope="layers.0.attn_norm")
    cast = Node("cast", "Cast", inputs=["n"], outputs=["c"])
    q = Node("q", "MatMul", inputs=["c", "w"], outputs=["y"], scope="layers.0.attn.q_proj")
    graph = _graph(tok, pos, add, norm, cast, q)
    for node in graph.nodes:
        graph.values[node.outputs[0]].producer = node.name
    TagLayers()(graph)
    assert [n.layer for n in (tok, pos, add, norm, cast, q)] == [None, None, None, 0, 0, 0]


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


def _names(passes) -> list[str]:
    return [p.name for p in passes]


def test_a_run_assembles_the_whole_pass_list_from_its_options():
    standard = ["bind-symbols", "tag-layers", "classify", "fold-weight-layouts", "cost"]
    graph = load_onnx(parse("agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) { C = MatMul(A, B) }"))
    assert _names(analysis_passes(resolve(graph).dims)) == standard
    assert _names(transform_passes(ProfileOptions())) == []
    opts = ProfileOptions(precision="bf16", mode="train")
    # the precision rewrite changes types only: the costs follow in their own pass, visibly
    assert _names(transform_passes(opts)) == ["precision", "cost", "dequantise", "training"]
    assert _names(analysis_passes(linalg=resolve(graph, None, {"via": "mlir"}).linalg)) == ["linalg-cost"]


def test_prepare_runs_precision_and_training_on_a_graph_once():
    graph = load_onnx(parse("agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) { C = MatMul(A, B) }"))
    run = resolve(graph, None, {"precision": "fp16", "mode": "train"})
    graph = prepare(run, graph)
    assert meta.graph_precision(graph) == "fp16" and meta.graph_mode(graph) == "train"
    assert meta.training_state(graph).optimizer
    nodes = len(graph.nodes)
    assert len(prepare(run, graph).nodes) == nodes  # a rewritten graph is not rewritten twice
    with pytest.raises(RuntimeError, match="already rewritten"):
        prepare(resolve(graph, None, {"precision": "bf16"}), graph)


def test_a_precision_that_retypes_nothing_keeps_the_costs_the_cost_pass_would_give():
    text = "agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) { C = MatMul(A, B) }"
    costed = standard_passes()(load_onnx(parse(text))).graph  # as a sweep costs a model once for its points
    again = costed.clone()
    kept = prepare(resolve(again, None, {"precision": "fp32"}), again)  # already fp32: the costs it has
    assert kept.nodes[0].meta[meta.COST] is costed.nodes[0].meta[meta.COST]
    fresh = PassManager(transform_passes(ProfileOptions(precision="fp32")))(costed.clone()).graph
    assert meta.get_cost(kept.nodes[0]) == meta.get_cost(fresh.nodes[0]) == meta.get_cost(costed.nodes[0])
    halved = prepare(resolve(costed.clone(), None, {"precision": "bf16"}), costed.clone())  # retyped: costed again
    assert meta.get_cost(halved.nodes[0]).bytes * 2 == meta.get_cost(costed.nodes[0]).bytes
    rewritten = PassManager(transform_passes(ProfileOptions(precision="bf16")))(costed.clone()).graph
    assert meta.get_cost(halved.nodes[0]) == meta.get_cost(rewritten.nodes[0])


def test_a_pass_that_breaks_its_in_place_declaration_is_a_pass_error():
    @dataclass(frozen=True)
    class _New(Pass):
        name: str = "new"

        def call(self, graph: Graph) -> PassResult:
            return PassResult(graph.clone(), True)

    graph = _graph(Node("a", "Relu", inputs=["x"], outputs=["y"]))
    with pytest.raises(PassError, match="declares in_place"):
        PassManager([_New()])(graph)


def test_clone_is_independent_of_its_source():
    graph = load_onnx(parse("agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) { C = MatMul(A, B) }"))
    costed = prepare(resolve(graph), graph)
    copy = costed.clone()
    copy.nodes[0].meta[meta.COST] = None
    copy.values["C"].kind = ValueKind.WEIGHT
    copy.bindings["x"] = 1
    copy.meta["extra"] = 1
    assert meta.get_cost(costed.nodes[0]).contraction_flops == 48
    assert costed.values["C"].kind is ValueKind.OUTPUT and "x" not in costed.bindings and "extra" not in costed.meta
    assert [n.name for n in copy.nodes] == [n.name for n in costed.nodes] and copy.node("MatMul_0") is copy.nodes[0]


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
