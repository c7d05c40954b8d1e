"""Exact FLOPs and bytes of every rule family on hand-built tiny graphs."""

from __future__ import annotations

import math

import pytest

from dabench_ir.ir import Cost
from dabench_ir.passes import meta, registered_ops
from tests.conftest import analyze_text, node_cost

# (graph text, expected Cost of the first node)
CASES = {
    "matmul 2x3 @ 3x4": (
        "agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) { C = MatMul(A, B) }",
        Cost(contraction_flops=48, act_bytes_in=24 + 48, act_bytes_out=32),
    ),
    "batched matmul broadcasts the weight": (
        "agraph (float[2,5,3] A, float[3,4] B) => (float[2,5,4] C) { C = MatMul(A, B) }",
        Cost(contraction_flops=2 * 3 * 2 * 5 * 4, act_bytes_in=120 + 48, act_bytes_out=160),
    ),
    "gemm with transB and bias initializers": (
        """agraph (float[2,3] A) => (float[2,4] Y)
           <float[4,3] W = {1,2,3,4,5,6,7,8,9,10,11,12}, float[4] bias = {1,2,3,4}>
           { Y = Gemm<transB=1>(A, W, bias) }""",
        Cost(contraction_flops=2 * 3 * 8, vector_flops=8, weight_bytes=48 + 16, act_bytes_in=24, act_bytes_out=32),
    ),
    "conv 3x3 with bias": (
        "agraph (float[1,2,5,5] X, float[3,2,3,3] W, float[3] B) => (float[1,3,3,3] Y) { Y = Conv(X, W, B) }",
        Cost(contraction_flops=2 * 18 * 27, vector_flops=27, act_bytes_in=200 + 216 + 12, act_bytes_out=108),
    ),
    "einsum batched contraction": (
        'agraph (float[2,3,4] A, float[2,4,5] B) => (float[2,3,5] C) { C = Einsum<equation="bij,bjk->bik">(A, B) }',
        Cost(contraction_flops=2 * 2 * 3 * 4 * 5, act_bytes_in=96 + 160, act_bytes_out=120),
    ),
    "add broadcasts": (
        "agraph (float[2,3] A, float[3] B) => (float[2,3] C) { C = Add(A, B) }",
        Cost(vector_flops=6, act_bytes_in=24 + 12, act_bytes_out=24),
    ),
    "mul reads a value used twice once": (
        "agraph (float[8] A) => (float[8] C) { C = Mul(A, A) }",
        Cost(vector_flops=8, act_bytes_in=32, act_bytes_out=32),
    ),
    "variadic max of three": (
        "agraph (float[4] A, float[4] B, float[4] D) => (float[4] C) { C = Max(A, B, D) }",
        Cost(vector_flops=8, act_bytes_in=48, act_bytes_out=16),
    ),
    "layer norm with bias": (
        "agraph (float[2,4] X, float[4] S, float[4] B) => (float[2,4] Y) { Y = LayerNormalization<axis=-1>(X, S, B) }",
        Cost(vector_flops=7 * 8 + 3 * 2, special_ops=2, act_bytes_in=32 + 16 + 16, act_bytes_out=32),
    ),
    "reduce mean over axis 1 (axes input is a parameter)": (
        """agraph (float[2,4] X) => (float[2] Y) <int64[1] axes = {1}>
           { Y = ReduceMean<keepdims=0>(X, axes) }""",
        Cost(vector_flops=8 + 2, act_bytes_in=32, act_bytes_out=8),
    ),
    "max pool 2x2 stride 2": (
        "agraph (float[1,1,4,4] X) => (float[1,1,2,2] Y) { Y = MaxPool<kernel_shape=[2,2], strides=[2,2]>(X) }",
        Cost(vector_flops=16, act_bytes_in=64, act_bytes_out=16),
    ),
    "gather from an embedding table reads only the rows it gathers": (
        """agraph (int64[2,3] ids) => (float[2,3,4] Y)
           <float[10,4] table = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}>
           { Y = Gather(table, ids) }""",
        Cost(weight_bytes=96, act_bytes_in=48, act_bytes_out=96),
    ),
    "reshape moves data, its shape input is not data": (
        "agraph (float[2,6] X) => (float[3,4] Y) <int64[2] shape = {3,4}> { Y = Reshape(X, shape) }",
        Cost(act_bytes_in=48, act_bytes_out=48),
    ),
    "shape reads metadata only": (
        "agraph (float[2,6] X) => (int64[2] Y) { Y = Shape(X) }",
        Cost(act_bytes_out=16),
    ),
    "where selects per element": (
        "agraph (bool[4] c, float[4] a, float[4] b) => (float[4] y) { y = Where(c, a, b) }",
        Cost(vector_flops=4, act_bytes_in=4 + 16 + 16, act_bytes_out=16),
    ),
    "transpose": (
        "agraph (float[2,3] X) => (float[3,2] Y) { Y = Transpose<perm=[1,0]>(X) }",
        Cost(act_bytes_in=24, act_bytes_out=24),
    ),
    "cast to half": (
        "agraph (float[4] X) => (float16[4] Y) { Y = Cast<to=10>(X) }",
        Cost(act_bytes_in=16, act_bytes_out=8),
    ),
}


@pytest.mark.parametrize("text, expected", CASES.values(), ids=CASES.keys())
def test_rule_exact(text, expected):
    graph = analyze_text(text)
    assert node_cost(graph) == expected


@pytest.mark.parametrize(
    ("op", "dims", "vector", "special"),
    [
        ("Erf", [2, 4], 0, 8),  # a special-function op
        ("Sigmoid", [4], 8, 4),  # exp, add, divide
        ("Softmax<axis=-1>", [2, 4], 32, 8),
    ],
)
def test_unary_rule_exact(op, dims, vector, special):
    """One float tensor in, one of its shape out: 4 bytes an element read and written."""
    text = f"agraph (float{dims} A) => (float{dims} C) {{ C = {op}(A) }}"
    n = math.prod(dims)
    expected = Cost(vector_flops=vector, special_ops=special, act_bytes_in=4 * n, act_bytes_out=4 * n)
    assert node_cost(analyze_text(text)) == expected


def test_gelu_exact_and_tanh_forms():
    text = 'agraph (float[2,4] A) => (float[2,4] C) {{ C = Gelu<approximate="{a}">(A) }}'
    exact = node_cost(analyze_text(text.format(a="none"), opset=20))
    tanh = node_cost(analyze_text(text.format(a="tanh"), opset=20))
    assert (exact.vector_flops, exact.special_ops) == (32, 8)
    assert (tanh.vector_flops, tanh.special_ops) == (56, 8)


_POW_INIT = "agraph (float[2,4] X) => (float[2,4] Y) <float{dims} e = {{{e}}}> {{ Y = Pow(X, e) }}"


@pytest.mark.parametrize(
    "exponent, dims, vector, special",
    [
        ("2.0", "", 8, 0),  # a rank-0 initializer: x * x
        ("2", "[1]", 8, 0),  # a one-element tensor holds the exponent just as well
        ("0.5", "", 0, 8),  # a square root
        ("3.0", "", 16, 0),  # x * x * x: two multiplies (the linalg path's math.fpowi counts the same)
        ("4.0", "", 16, 0),  # (x * x) squared: two
        ("2.5", "", 0, 8),  # exp(2.5 log x)
        ("17.0", "", 0, 8),  # past the small powers a compiler expands: exp(17 log x)
    ],
)
def test_pow_costs_its_constant_exponent(exponent, dims, vector, special):
    # x: 32 B in, exponent: 4 B of constant (weight bytes, as every stored operand), y: 32 B out
    cost = node_cost(analyze_text(_POW_INIT.format(dims=dims, e=exponent)))
    assert cost == Cost(vector_flops=vector, special_ops=special, weight_bytes=4, act_bytes_in=32, act_bytes_out=32)


def test_pow_reads_a_constant_node_and_falls_back_without_one():
    const = """agraph (float[2,4] X) => (float[2,4] Y) {
        e = Constant<value = float {2.0}>()
        Y = Pow(X, e)
    }"""
    graph = analyze_text(const)
    assert graph.values["e"].scalar == 2.0
    pow_cost = node_cost(graph, 1)
    assert (pow_cost.vector_flops, pow_cost.special_ops) == (8, 0)
    # an exponent the graph computes (here an input) has no value to read: one transcendental each
    dynamic = node_cost(analyze_text("agraph (float[2,4] X, float e) => (float[2,4] Y) { Y = Pow(X, e) }"))
    assert (dynamic.vector_flops, dynamic.special_ops) == (0, 8)


def test_only_one_element_constants_keep_a_value():
    text = """agraph (float[2,4] X) => (float[2,4] Y) <float[4] w = {1, 2, 3, 4}, float e = {2.0}> {
        Z = Mul(X, w)
        Y = Pow(Z, e)
    }"""
    graph = analyze_text(text)
    assert graph.values["e"].scalar == 2.0
    assert graph.values["w"].scalar is None  # a tensor's data is not held
    assert graph.clone().values["e"].scalar == 2.0


def test_symbolic_dims_bind():
    text = "agraph (float[batch,3] A, float[3,4] B) => (float[batch,4] C) { C = MatMul(A, B) }"
    assert node_cost(analyze_text(text, dims={"batch": 5})).contraction_flops == 2 * 3 * 5 * 4


def test_unknown_op_is_estimated_never_zero():
    text = """<ir_version: 9, opset_import: ["" : 18, "com.example" : 1]>
    agraph (float[4] x) => (float[4] z) {
        y = com.example.Frobnicate(x)
        z = Relu(x)
    }"""
    graph = analyze_text(text)
    frob, relu = graph.nodes
    # a bytes-only lower bound from the types it knows (x read; y has no inferred type)
    assert meta.get_cost(frob) == Cost(act_bytes_in=16)
    assert "no cost rule for op 'com.example::Frobnicate'" in frob.meta[meta.ESTIMATED]
    assert meta.UNATTRIBUTED not in frob.meta
    assert meta.get_cost(relu).vector_flops == 4


def test_registry_covers_what_decoder_exporters_emit():
    needed = {
        "MatMul",
        "Gemm",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Reciprocal",
        "Neg",
        "Softmax",
        "LayerNormalization",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "Erf",
        "Gelu",
        "Tanh",
        "Sigmoid",
        "Exp",
        "Cos",
        "Sin",
        "Where",
        "Equal",
        "Trilu",
        "Cast",
        "Transpose",
        "Reshape",
        "Split",
        "Concat",
        "Slice",
        "Gather",
        "Unsqueeze",
        "Squeeze",
        "Expand",
        "Shape",
        "Constant",
        "ConstantOfShape",
        "Range",
        "Identity",
        "Max",
        "Min",
        "Conv",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "BatchNormalization",
        "Relu",
        "RMSNormalization",
        "Einsum",
        "CumSum",
        "ArgMax",
        "TopK",
        "Pad",
        "Tile",
        "Flatten",
        "Dropout",
        "Clip",
    }
    assert needed <= set(registered_ops())


def test_weight_transpose_is_folded_into_the_matmul():
    graph = analyze_text(
        """agraph (float[2,3] x) => (float[2,4] y) <float[4,3] W = {1,2,3,4,5,6,7,8,9,10,11,12}>
        { Wt = Transpose<perm=[1,0]>(W)  y = MatMul(x, Wt) }"""
    )
    transpose, mm = graph.nodes
    assert meta.get_cost(transpose) == Cost()
    assert "folded at compile time" in transpose.meta[meta.FOLDED]
    assert meta.get_cost(mm) == Cost(contraction_flops=48, weight_bytes=48, act_bytes_in=24, act_bytes_out=32)
    assert graph.num_params == 12  # the transposed copy is not a second parameter


def test_layout_of_an_activation_is_not_folded():
    graph = analyze_text("agraph (float[2,3] x) => (float[3,2] y) { y = Transpose<perm=[1,0]>(x) }")
    assert meta.FOLDED not in graph.nodes[0].meta
    assert meta.get_cost(graph.nodes[0]).bytes == 48
