"""Precision rewrite and training expansion on tiny graphs, with exact figures."""

from __future__ import annotations

from dabench_ir.ir import DType
from dabench_ir.passes import meta
from dabench_ir.passes.precision import precision_by_class
from dabench_ir.passes.training import ADAM_MOMENT_BYTES_PER_PARAM, TrainingPass
from tests.conftest import analyze_text, rewrite

BLOCK = """
agraph (float[2,8] x) => (float[2,8] y)
<float[8] g = {{1,1,1,1,1,1,1,1}}, float[8] b = {{0,0,0,0,0,0,0,0}}, float[8,8] W1 = {{{}}}, float[8,8] W2 = {{{}}}>
{{
    h = LayerNormalization<axis=-1>(x, g, b)
    a = MatMul(h, W1)
    s = Softmax<axis=-1>(a)
    y = MatMul(s, W2)
}}
""".format(",".join(["0.5"] * 64), ",".join(["0.25"] * 64))


def costs(graph):
    return {n.op_type + str(i): meta.get_cost(n) for i, n in enumerate(graph.nodes)}


def test_fp16_halves_float_bytes_on_every_node():
    fp32 = analyze_text(BLOCK)
    fp16 = analyze_text(BLOCK)
    rewrite(fp16, precision="fp16")
    for a, b in zip(fp32.nodes, fp16.nodes, strict=True):
        ca, cb = meta.get_cost(a), meta.get_cost(b)
        assert cb.bytes * 2 == ca.bytes
        assert cb.flops == ca.flops
        assert b.meta[meta.PRECISION] is DType.FLOAT16


def test_mixed_keeps_norms_and_softmax_in_fp32():
    graph = analyze_text(BLOCK)
    rewrite(graph, precision="mixed")
    ln, mm1, sm, _mm2 = graph.nodes
    assert ln.meta[meta.PRECISION] is DType.FLOAT32
    assert sm.meta[meta.PRECISION] is DType.FLOAT32
    assert mm1.meta[meta.PRECISION] is DType.BFLOAT16
    # LayerNorm reads bf16 x (32 B) and bf16 gains (32 B), writes fp32 h (64 B)
    assert meta.get_cost(ln).bytes == 32 + 16 + 16 + 64
    # the matmul reads fp32 h (64 B) and a bf16 weight (128 B), writes bf16 (32 B)
    assert meta.get_cost(mm1).bytes == 64 + 128 + 32
    assert precision_by_class(graph) == {"contraction": "bf16", "vector": "fp32"}


def test_training_triples_contraction_flops_and_adds_adam():
    graph = analyze_text(BLOCK)
    forward = sum(meta.get_cost(n).contraction_flops for n in graph.nodes)
    TrainingPass()(graph)
    train = sum(meta.get_cost(n).contraction_flops for n in graph.nodes)
    # both matmuls have a weight and an input that needs a gradient: dX and dW each cost
    # what the forward did, so training is exactly 3x forward
    assert train == 3 * forward
    step = graph.nodes[-1]
    assert step.op_type == "AdamStep"
    params = 8 + 8 + 64 + 64
    assert meta.get_cost(step).vector_flops == 13 * params
    state = meta.training_state(graph)
    # fp32 weights: gradients in fp32, no separate master copy, two fp32 moments; the
    # weights themselves are counted once, where they are read, not as training state
    assert state.optimizer_state_bytes == ADAM_MOMENT_BYTES_PER_PARAM * params
    assert (state.gradient_bytes, state.master_weight_bytes) == (4 * params, 0)


def test_first_matmul_on_a_raw_input_skips_dx():
    graph = analyze_text(
        "agraph (float[2,8] x) => (float[2,8] y) <float[8,8] W = {{{}}}> {{ y = MatMul(x, W) }}".format(
            ",".join(["1"] * 64)
        )
    )
    forward = meta.get_cost(graph.nodes[0]).contraction_flops
    TrainingPass()(graph)
    # x is a model input and needs no gradient: only dW is computed
    assert meta.get_cost(graph.nodes[0]).contraction_flops == 2 * forward


def test_recompute_adds_a_forward_pass_and_keeps_less():
    plain, again = analyze_text(BLOCK), analyze_text(BLOCK)
    TrainingPass()(plain)
    TrainingPass(recompute=True)(again)
    f = lambda g: sum(meta.get_cost(n).flops for n in g.nodes)  # noqa: E731
    fwd = sum(n.meta["dabench.cost.forward"].flops for n in plain.nodes if "dabench.cost.forward" in n.meta)
    assert f(again) - f(plain) == fwd
    # a graph without blocks (no scopes) is one checkpoint: recomputed, its saved set is live again
    assert meta.training_state(again).saved_activation_bytes == meta.training_state(plain).saved_activation_bytes


def test_mixed_marks_contractions_as_fp32_accumulated():
    # mixed precision: 16-bit inputs, fp32 accumulation (Cerebras "Data Formats"; NVIDIA AMP);
    # the pure modes accumulate as they compute; only contractions carry the mark
    from dabench_ir.passes.precision import accumulate_dtype

    graph = analyze_text(BLOCK)
    rewrite(graph, precision="mixed")
    ln, mm1, sm, mm2 = graph.nodes
    assert mm1.meta[meta.ACCUMULATE] is DType.FLOAT32 and mm2.meta[meta.ACCUMULATE] is DType.FLOAT32
    assert mm1.meta[meta.PRECISION] is DType.BFLOAT16  # the inputs stay 16-bit
    assert meta.ACCUMULATE not in ln.meta and meta.ACCUMULATE not in sm.meta
    assert accumulate_dtype(graph) is DType.FLOAT32  # the graph's rule, for work no node carries
    for mode, dtype in (("fp16", DType.FLOAT16), ("bf16", DType.BFLOAT16), ("fp32", DType.FLOAT32)):
        g = analyze_text(BLOCK)
        rewrite(g, precision=mode)
        assert [accumulate_dtype(g, n) for n in g.nodes if meta.ACCUMULATE in n.meta] == [dtype, dtype], mode
        assert accumulate_dtype(g) is None
    plain = analyze_text(BLOCK)  # no rewrite: as the model computes
    assert accumulate_dtype(plain, plain.nodes[1]) is None
