"""The op-trait registry: one registration per op carries every per-op fact, and docs/costs.md follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dabench_ir.frontends import contrib_types
from dabench_ir.ir import Cost, DType
from dabench_ir.passes import cost_rules, meta
from dabench_ir.passes.cost_rules import (
    CPU_MATMUL,
    CPU_STREAM,
    UNKNOWN_OP,
    Backward,
    OpClass,
    OpTraits,
    Role,
    Saves,
    cost_rule,
    op_traits,
    ops_with,
    registered_ops,
    render_costs_markdown,
    traits_of,
)
from dabench_ir.passes.training import TrainingPass
from tests.conftest import analyze_text, rewrite

DOC = Path(__file__).resolve().parents[1] / "docs" / "costs.md"


def _rule(op_class: OpClass, **fields) -> OpTraits:
    """The traits of an op registered with a cost rule: ``fields`` are those away from the default."""
    return OpTraits(op_class, has_cost_rule=True, **fields)


_SOFTMAX = _rule(
    OpClass.VECTOR,
    keeps_fp32=True,
    cpu_class="Softmax",
    saves=Saves.OUTPUT,
    roles=frozenset({Role.SOFTMAX}),
    row_reductions=1,
)
_MOVE = {"backward": Backward.MOVE, "saves": Saves.NOTHING, "roles": frozenset({Role.LAYOUT, Role.PASS_THROUGH})}
_NORM = {
    "keeps_fp32": True,
    "cpu_class": "LayerNormalization",
    "saves": Saves.INPUT_AND_STATS,
    "roles": frozenset({Role.NORM}),
}
_CONTRACTION = {"cpu_class": CPU_MATMUL, "backward": Backward.CONTRACTION, "saves": Saves.OPERANDS}


@pytest.mark.parametrize(
    ("op", "domain", "expected"),
    [
        ("MatMul", "", _rule(OpClass.CONTRACTION, **_CONTRACTION, roles=frozenset({Role.CONTRACTION}))),
        ("Softmax", "", _SOFTMAX),
        ("Softmax", "ai.onnx", _SOFTMAX),
        ("Relu", "", _rule(OpClass.VECTOR, roles=frozenset({Role.ACTIVATION}), nonlinear=True)),
        (
            "Transpose",
            "",
            _rule(OpClass.DATA_MOVEMENT, **_MOVE, folds_on_weights=True, strided_view=True, cpu_class="Transpose"),
        ),
        (
            "Reshape",
            "",
            _rule(
                OpClass.DATA_MOVEMENT,
                **_MOVE,
                shape_only=True,
                folds_on_weights=True,
                keeps_values=True,
                output_shape_input=1,
            ),
        ),
        (
            "Gather",
            "",
            _rule(
                OpClass.DATA_MOVEMENT,
                backward=Backward.SCATTER_ADD,
                saves=Saves.NOTHING,
                roles=frozenset({Role.LAYOUT}),
                index_input=1,
            ),
        ),
        (
            "Shape",
            "",
            _rule(
                OpClass.SHAPE, shape_only=True, reads_metadata_only=True, backward=Backward.NONE, saves=Saves.NOTHING
            ),
        ),
        (
            "SkipLayerNormalization",
            "com.microsoft",
            _rule(OpClass.VECTOR, **_NORM, row_reductions=2, output_types=contrib_types.skip_norm),
        ),
        ("RMSNormalization", "", _rule(OpClass.VECTOR, **_NORM, row_reductions=1)),
        (
            "FastGelu",
            "com.microsoft",
            _rule(
                OpClass.VECTOR,
                cpu_class="GeluTanh",
                roles=frozenset({Role.ACTIVATION}),
                nonlinear=True,
                gelu_form="tanh",
                output_types=contrib_types.same,
            ),
        ),
        (
            "LogSoftmax",
            "",
            _rule(
                OpClass.VECTOR, keeps_fp32=True, cpu_class="Softmax", saves=Saves.OUTPUT, row_reductions=1, loss=True
            ),
        ),
        (
            "FusedGemm",
            "com.microsoft",
            _rule(OpClass.CONTRACTION, **_CONTRACTION, output_types=contrib_types.fused_gemm),
        ),
    ],
)
def test_registered_traits(op, domain, expected):
    assert op_traits(op, domain) == expected


def test_unknown_op_gets_the_documented_default():
    assert op_traits("Frobnicate", "com.example") is UNKNOWN_OP
    assert op_traits("SkipLayerNormalization") is UNKNOWN_OP  # registered in com.microsoft only
    documented = {
        "op_class": None,
        "shape_only": False,
        "folds_on_weights": False,
        "strided_view": False,
        "keeps_fp32": False,
        "cpu_class": CPU_STREAM,
        "backward": Backward.VECTOR,
        "keeps_values": False,
        "identity_when_unchanged": False,
        "has_cost_rule": False,
        "saves": Saves.INPUTS,
        "roles": frozenset(),
        "row_reductions": 0,
        "nonlinear": False,
        "loss": False,
        "output_shape_input": None,
        "index_input": None,
        "reads_quantised_weights": False,
        "reads_metadata_only": False,
        "gelu_form": None,
        "makes_causal_mask": False,
        "output_types": None,
    }
    assert OpTraits(**documented) == UNKNOWN_OP and set(documented) == set(OpTraits._fields)


def test_traits_of_a_node_uses_its_domain():
    graph = analyze_text(
        """<ir_version: 9, opset_import: ["" : 18, "com.microsoft" : 1]>
        agraph (float[4] x) => (float[4] y, float[4] z) { y = Softmax(x)  z = com.microsoft.FastGelu(x) }"""
    )
    softmax, gelu = graph.nodes
    assert traits_of(softmax).keeps_fp32
    assert traits_of(gelu).cpu_class == "GeluTanh"


def test_every_cost_rule_has_traits_with_its_class():
    for name in registered_ops():
        domain, _, op = name.rpartition("::")
        traits = op_traits(op, domain)
        assert traits.has_cost_rule
        assert traits.op_class is cost_rules._RULES[(domain, op)].op_class


# -- the shape-only decision -----------------------------------------------------------


def test_shape_only_ops_are_metadata_views_and_load_time_constants():
    """Three sets disagreed: the SHAPE op class (Shape, Size, Constant, ConstantOfShape, EyeLike,
    Random*, Range), the lowerings' set (that class plus Reshape/Squeeze/Unsqueeze/Flatten/Identity)
    and the host predictor's (Shape, Size, Constant, the views and Dropout). Shape-only means no
    target does any work, so it is the predictor's: ConstantOfShape, Range, EyeLike and Random*
    write a tensor (onnxruntime runs a kernel for each) and are not shape-only."""
    assert ops_with(shape_only=True) == {
        "Shape",
        "Size",
        "Constant",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Identity",
        "Dropout",
    }
    for op in ("ConstantOfShape", "Range", "EyeLike", "RandomNormal", "RandomUniformLike"):
        assert op_traits(op).op_class is OpClass.SHAPE  # reads no tensor data
        assert not op_traits(op).shape_only  # but writes its output


def test_shape_only_ops_compute_nothing_and_views_still_record_their_bytes():
    graph = analyze_text(
        """agraph (float[2,3] x) => (float[6] y, int64[2] s, float[2,3] z) <int64[1] shp = {6}> {
            y = Reshape(x, shp)  s = Shape(x)  z = Identity(x) }"""
    )
    reshape, shape, identity = graph.nodes
    assert all(traits_of(n).shape_only for n in graph.nodes)
    assert meta.get_cost(reshape) == Cost(act_bytes_in=24, act_bytes_out=24)  # the bytes ONNX semantics move
    assert meta.get_cost(shape) == Cost(act_bytes_out=16)  # reads metadata only
    assert meta.get_cost(identity).flops == 0


# -- the passes read the traits ----------------------------------------------------------


def test_mixed_precision_follows_keeps_fp32():
    graph = analyze_text("agraph (float[2,4] x) => (float[2,4] y, float[2,4] z) { y = Exp(x)  z = Tanh(x) }")
    rewrite(graph, precision="mixed")
    exp, tanh = graph.nodes
    assert op_traits("Exp").keeps_fp32 and exp.meta[meta.PRECISION] is DType.FLOAT32
    assert not op_traits("Tanh").keeps_fp32 and tanh.meta[meta.PRECISION] is DType.BFLOAT16


def test_backward_rule_comes_from_the_op_not_from_the_classify_pass():
    """A graph costed without the classify pass (the ONNX-via-MLIR path) used to lose the
    backward contraction of every MatMul; the rule now comes from the registry."""
    text = "agraph (float[2,8] x) => (float[2,8] y) <float[8,8] W = {{{}}}> {{ y = MatMul(x, W) }}".format(
        ",".join(["1"] * 64)
    )
    classified, bare = analyze_text(text), analyze_text(text)
    for node in bare.nodes:
        del node.meta[meta.OP_CLASS]
    forward = meta.get_cost(classified.nodes[0]).contraction_flops
    TrainingPass()(classified)
    TrainingPass()(bare)
    assert meta.get_cost(classified.nodes[0]).contraction_flops == 2 * forward  # forward + dW
    assert meta.get_cost(bare.nodes[0]) == meta.get_cost(classified.nodes[0])


def test_gather_backward_is_a_scatter_add():
    graph = analyze_text(
        """agraph (int64[3] ids) => (float[3,4] y) <float[10,4] E = {{{}}}> {{ y = Gather(E, ids) }}""".format(
            ",".join(["1"] * 40)
        )
    )
    TrainingPass()(graph)
    gather = graph.nodes[0]
    assert meta.get_cost(gather).vector_flops == 12  # one add per gradient element (3 rows of 4)


# -- adding an op, and the doc ------------------------------------------------------------


def test_adding_an_op_is_one_registration(monkeypatch):
    monkeypatch.setattr(cost_rules, "_RULES", dict(cost_rules._RULES))
    monkeypatch.setattr(cost_rules, "_TRAITS", dict(cost_rules._TRAITS))

    @cost_rule("Frobnicate", domain="com.example", op_class=OpClass.VECTOR, keeps_fp32=True, cpu_class="Tanh")
    def frobnicate(op):
        """Three vector FLOPs per output element."""
        return Cost(vector_flops=3 * op.out_numel())

    graph = analyze_text(
        """<ir_version: 9, opset_import: ["" : 18, "com.example" : 1]>
        agraph (float[4] x) => (float[4] y) { y = com.example.Frobnicate(x) }"""
    )
    node = graph.nodes[0]
    assert meta.get_cost(node).vector_flops == 12
    assert node.meta[meta.OP_CLASS] is OpClass.VECTOR
    assert traits_of(node) == OpTraits(OpClass.VECTOR, keeps_fp32=True, cpu_class="Tanh", has_cost_rule=True)
    assert "| com.example::Frobnicate | vector | Three vector FLOPs per output element. |" in render_costs_markdown()


def test_costs_doc_table_matches_the_registry():
    table = render_costs_markdown()
    assert table in DOC.read_text(), "docs/costs.md has drifted from the registry: run scripts/gen_costs_doc.py"


def test_a_new_op_declares_its_role_saves_and_kernel_traits_in_one_registration(monkeypatch):
    """docs/extending.md's "Adding an op", followed once: the report's roles, the training
    pass's saved tensors and the WSE/microbenchmark traits come from the registration alone."""
    from dabench_ir.passes.training import saved_for_backward
    from dabench_ir.report.roles import node_roles

    monkeypatch.setattr(cost_rules, "_RULES", dict(cost_rules._RULES))
    monkeypatch.setattr(cost_rules, "_TRAITS", dict(cost_rules._TRAITS))

    @cost_rule(
        "Frobnicate",
        domain="com.example",
        op_class=OpClass.VECTOR,
        cpu_class="Tanh",
        roles=(Role.ACTIVATION,),
        saves=Saves.OUTPUT,
        nonlinear=True,
        row_reductions=1,
    )
    def frobnicate(op):
        """One vector FLOP and one special op per output element."""
        return Cost(vector_flops=op.out_numel(), special_ops=op.out_numel())

    graph = analyze_text(
        """<ir_version: 9, opset_import: ["" : 18, "com.example" : 1]>
        agraph (float[2,4] x) => (float[2,4] y) { y = com.example.Frobnicate(x) }"""
    )
    node = graph.nodes[0]
    assert node_roles(graph)[node.name] == "activation"
    assert saved_for_backward(graph, node, {"x"}) == {"y": 32}  # its output, not its input
    assert "com.example::Frobnicate" in ops_with(nonlinear=True, roles=Role.ACTIVATION)
    assert traits_of(node).row_reductions == 1
    assert "roles: activation, 1 row reduction(s), nonlinear kernel" in render_costs_markdown()
    with pytest.raises(ValueError, match="calibrated host kernel class"):
        cost_rule("Frobnicate2", op_class=OpClass.VECTOR, cpu_class="Frob")
