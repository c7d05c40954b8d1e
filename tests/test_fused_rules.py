"""Fused and quantised ops against the unfused subgraphs they replace.

Each case builds the fused node and the subgraph an optimiser replaces with it, costs both,
and checks that the FLOPs are equal where the math is the same (and says where it is not).
Fused attention must read its inputs and write its outputs only: never the S×T scores.
"""

from __future__ import annotations

import math

import onnx
import pytest
from onnx import TensorProto, helper

from dabench_ir.ir import Cost
from dabench_ir.passes import meta
from dabench_ir.pipeline import analyze

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, value_info=(), inits=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(inits),
        value_info=[helper.make_tensor_value_info(n, t, s) for n, t, s in value_info],
    )
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _total(model: onnx.ModelProto) -> Cost:
    graph = analyze(model)
    for node in graph.nodes:
        assert meta.ESTIMATED not in node.meta and meta.UNATTRIBUTED not in node.meta, node.name
    return sum((meta.get_cost(n) for n in graph.nodes), Cost())


def _const(name: str, value: float):
    return helper.make_tensor(name, F, [], [value])


def _ms(op: str, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, domain="com.microsoft", **attrs)


B, S, N, H = 2, 8, 4, 16
D = N * H


def _unfused_attention(t: int, h_v: int = H, mask: bool = False) -> Cost:
    """Q·Kᵀ, scale, (mask add), Softmax, P·V on 4-D head tensors (the layout ops cost no FLOPs)."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["s2"]),
    ]
    vi = [("s", F, [B, N, S, t]), ("s2", F, [B, N, S, t]), ("p", F, [B, N, S, t])]
    last = "s2"
    if mask:
        nodes.append(helper.make_node("Add", ["s2", "mask"], ["s3"]))
        vi.append(("s3", F, [B, N, S, t]))
        last = "s3"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]
    inputs = [("q", F, [B, N, S, H]), ("kt", F, [B, N, H, t]), ("v", F, [B, N, t, h_v])]
    if mask:
        inputs.append(("mask", F, [1, 1, S, t]))
    return _total(_model(nodes, inputs, [("o", F, [B, N, S, h_v])], vi, [_const("scale", 0.25)]))


def test_multi_head_attention_equals_unfused_and_writes_no_scores():
    fused_model = _model(
        [_ms("MultiHeadAttention", ["q", "k", "v"], ["o"], num_heads=N)],
        [("q", F, [B, S, D]), ("k", F, [B, S, D]), ("v", F, [B, S, D])],
        [("o", F, [B, S, D])],
    )
    fused = _total(fused_model)
    unfused = _unfused_attention(S)
    assert fused.flops == unfused.flops
    assert fused.contraction_flops == unfused.contraction_flops == 2 * 2 * B * N * S * S * H
    # bytes: Q, K, V read and the output written, nothing of the B·N·S·S scores
    assert fused.bytes == 4 * 4 * B * S * D
    assert unfused.bytes - fused.bytes >= 3 * 2 * 4 * B * N * S * S  # s, s2, p written and read


def test_multi_head_attention_with_past_and_bias_mask():
    past = 5
    fused_model = _model(
        [
            _ms(
                "MultiHeadAttention",
                ["q", "k", "v", "", "", "ab", "pk", "pv"],
                ["o", "present_k", "present_v"],
                num_heads=N,
            )
        ],
        [
            ("q", F, [B, S, D]),
            ("k", F, [B, S, D]),
            ("v", F, [B, S, D]),
            ("ab", F, [1, 1, S, past + S]),
            ("pk", F, [B, N, past, H]),
            ("pv", F, [B, N, past, H]),
        ],
        [("o", F, [B, S, D]), ("present_k", F, [B, N, past + S, H]), ("present_v", F, [B, N, past + S, H])],
    )
    assert _total(fused_model).flops == _unfused_attention(past + S, mask=True).flops


def test_group_query_attention_equals_unfused_causal_gqa():
    kv = 2
    fused_model = _model(
        [
            _ms(
                "GroupQueryAttention",
                ["q", "k", "v", "", "", "seqlens", "total"],
                ["o", "present_k", "present_v"],
                num_heads=N,
                kv_num_heads=kv,
            )
        ],
        [
            ("q", F, [B, S, D]),
            ("k", F, [B, S, kv * H]),
            ("v", F, [B, S, kv * H]),
            ("seqlens", TensorProto.INT32, [B]),
            ("total", TensorProto.INT32, []),
        ],
        [("o", F, [B, S, D]), ("present_k", F, [B, kv, S, H]), ("present_v", F, [B, kv, S, H])],
    )
    # unfused: K/V heads repeated (Expand: no FLOPs), then causal attention with the mask added
    assert _total(fused_model).flops == _unfused_attention(S, mask=True).flops


def test_packed_attention_equals_projection_plus_causal_attention():
    fused_model = _model(
        [_ms("Attention", ["x", "w", "b"], ["o"], num_heads=N, unidirectional=1)],
        [("x", F, [B, S, D]), ("w", F, [D, 3 * D]), ("b", F, [3 * D])],
        [("o", F, [B, S, D])],
    )
    projection = _total(
        _model(
            [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
            [("x", F, [B, S, D]), ("w", F, [D, 3 * D]), ("b", F, [3 * D])],
            [("z", F, [B, S, 3 * D])],
            [("y", F, [B, S, 3 * D])],
        )
    )
    assert _total(fused_model).flops == projection.flops + _unfused_attention(S, mask=True).flops


X = [("x", F, [B, S, D])]
ROWS = B * S
ELEMS = B * S * D


def _layer_norm_unfused(rms: bool, skip: bool, bias: bool = False, beta: bool = True) -> Cost:
    """(x + skip (+ bias)) then the normalisation spelled out in primitive ops."""
    nodes, vi, inputs = [], [], list(X)
    cur = "x"
    if skip:
        nodes.append(helper.make_node("Add", ["x", "skip"], ["sum"]))
        inputs.append(("skip", F, [B, S, D]))
        vi.append(("sum", F, [B, S, D]))
        cur = "sum"
    if bias:
        nodes.append(helper.make_node("Add", [cur, "bias"], ["sum2"]))
        inputs.append(("bias", F, [D]))
        vi.append(("sum2", F, [B, S, D]))
        cur = "sum2"
    row, full = [B, S, 1], [B, S, D]
    if rms:
        nodes += [
            helper.make_node("Pow", [cur, "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Div", [cur, "rms"], ["n"]),
            helper.make_node("Mul", ["n", "gamma"], ["y"]),
        ]
        vi += [("sq", F, full), ("ms", F, row), ("mse", F, row), ("rms", F, row), ("n", F, full)]
    else:
        nodes += [
            helper.make_node("ReduceMean", [cur, "axes"], ["mean"]),
            helper.make_node("Sub", [cur, "mean"], ["c"]),
            helper.make_node("Pow", ["c", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["var"]),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["sd"]),
            helper.make_node("Div", ["c", "sd"], ["n"]),
            helper.make_node("Mul", ["n", "gamma"], ["y" if not beta else "g"]),
        ]
        vi += [("mean", F, row), ("c", F, full), ("sq", F, full), ("var", F, row), ("ve", F, row), ("sd", F, row)]
        vi += [("n", F, full)]
        if beta:
            nodes.append(helper.make_node("Add", ["g", "beta"], ["y"]))
            vi.append(("g", F, full))
            inputs.append(("beta", F, [D]))
    inits = [
        _const("two", 2.0),
        _const("eps", 1e-5),
        helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
    ]
    inputs.append(("gamma", F, [D]))
    return _total(_model(nodes, inputs, [("y", F, [B, S, D])], vi, inits))


@pytest.mark.parametrize(
    ("op", "inputs", "rms", "skip", "bias", "beta"),
    [
        ("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], False, True, False, True),
        ("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], False, True, True, True),
        ("SkipLayerNormalization", ["x", "skip", "gamma"], False, True, False, False),
        ("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], True, True, False, False),
        ("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma", "bias"], True, True, True, False),
        ("SimplifiedLayerNormalization", ["x", "gamma"], True, False, False, False),
    ],
)
def test_normalisations_equal_unfused(op, inputs, rms, skip, bias, beta):
    shapes = {"x": [B, S, D], "skip": [B, S, D], "gamma": [D], "beta": [D], "bias": [D]}
    domain = "" if op == "SimplifiedLayerNormalization" else "com.microsoft"
    fused_model = _model(
        [helper.make_node(op, inputs, ["y"], domain=domain, epsilon=1e-5)],
        [(n, F, shapes[n]) for n in inputs],
        [("y", F, [B, S, D])],
    )
    assert _total(fused_model).flops == _layer_norm_unfused(rms, skip, bias, beta).flops


def test_fused_matmul_equals_transpose_matmul_scale():
    fused = _total(
        _model(
            [_ms("FusedMatMul", ["a", "b"], ["y"], alpha=0.5, transB=1)],
            [("a", F, [B, S, D]), ("b", F, [B, S, D])],
            [("y", F, [B, S, S])],
        )
    )
    unfused = _total(
        _model(
            [
                helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
                helper.make_node("MatMul", ["a", "bt"], ["m"]),
                helper.make_node("Mul", ["m", "alpha"], ["y"]),
            ],
            [("a", F, [B, S, D]), ("b", F, [B, S, D])],
            [("y", F, [B, S, S])],
            [("bt", F, [B, D, S]), ("m", F, [B, S, S])],
            [_const("alpha", 0.5)],
        )
    )
    assert fused.flops == unfused.flops == 2 * D * B * S * S + B * S * S


def _elementwise_chain(ops: list[tuple[str, list[str]]], extra_inputs=(), inits=()) -> Cost:
    nodes = [helper.make_node(op, ins, [f"t{i}"]) for i, (op, ins) in enumerate(ops)]
    vi = [(f"t{i}", F, [B, S, D]) for i in range(len(ops) - 1)]
    out = f"t{len(ops) - 1}"
    return _total(_model(nodes, X + list(extra_inputs), [(out, F, [B, S, D])], vi, inits))


def test_gelu_family_equals_unfused():
    bias_gelu = _total(_model([_ms("BiasGelu", ["x", "b"], ["y"])], [*X, ("b", F, [D])], [("y", F, [B, S, D])]))
    exact = _elementwise_chain(
        [
            ("Add", ["x", "b"]),
            ("Div", ["t0", "c"]),
            ("Erf", ["t1"]),
            ("Add", ["t2", "one"]),
            ("Mul", ["t0", "t3"]),
            ("Mul", ["t4", "half"]),
        ],
        [("b", F, [D])],
        [_const("c", math.sqrt(2)), _const("one", 1.0), _const("half", 0.5)],
    )
    assert bias_gelu.flops == exact.flops == 6 * ELEMS
    fast = _total(_model([_ms("FastGelu", ["x", "b"], ["y"])], [*X, ("b", F, [D])], [("y", F, [B, S, D])]))
    # 0.5·x·(1 + tanh(x·(a + g·x²))) after the bias add, as onnxruntime's kernel computes it
    tanh_form = _elementwise_chain(
        [
            ("Add", ["x", "b"]),
            ("Mul", ["t0", "t0"]),
            ("Mul", ["t1", "g"]),
            ("Add", ["t2", "a"]),
            ("Mul", ["t3", "t0"]),
            ("Tanh", ["t4"]),
            ("Add", ["t5", "one"]),
            ("Mul", ["t6", "t0"]),
            ("Mul", ["t7", "half"]),
        ],
        [("b", F, [D])],
        [_const("g", 0.0356774), _const("a", 0.7978846), _const("one", 1.0), _const("half", 0.5)],
    )
    assert fast.flops == tanh_form.flops
    ms_gelu = _total(_model([_ms("Gelu", ["x"], ["y"])], X, [("y", F, [B, S, D])]))
    onnx_gelu = _total(_model([helper.make_node("Gelu", ["x"], ["y"])], X, [("y", F, [B, S, D])]))
    assert ms_gelu == onnx_gelu


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_quick_gelu_equals_sigmoid_product(alpha):
    fused = _total(_model([_ms("QuickGelu", ["x"], ["y"], alpha=alpha)], X, [("y", F, [B, S, D])]))
    chain = [("Sigmoid", ["x"]), ("Mul", ["x", "t0"])]
    if alpha != 1.0:
        chain = [("Mul", ["x", "al"]), ("Sigmoid", ["t0"]), ("Mul", ["x", "t1"])]
    assert fused.flops == _elementwise_chain(chain, inits=[_const("al", alpha)]).flops


def test_bias_add_equals_two_adds():
    fused = _total(
        _model(
            [_ms("BiasAdd", ["x", "b", "s"], ["y"])], [*X, ("b", F, [D]), ("s", F, [B, S, D])], [("y", F, [B, S, D])]
        )
    )
    unfused = _elementwise_chain([("Add", ["x", "b"]), ("Add", ["t0", "s"])], [("b", F, [D]), ("s", F, [B, S, D])])
    assert fused.flops == unfused.flops == 2 * ELEMS


def test_rotary_embedding_is_unfused_minus_the_negation():
    """HF's x·cos + rotate_half(x)·sin negates half the elements; the kernel folds that into a subtract."""
    x4 = [B, N, S, H]
    fused = _total(
        _model(
            [_ms("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"])],
            [("x", F, x4), ("pos", TensorProto.INT64, [B, S]), ("cos", F, [64, H // 2]), ("sin", F, [64, H // 2])],
            [("y", F, x4)],
        )
    )
    half = [B, N, S, H // 2]
    unfused = _total(
        _model(
            [
                helper.make_node("Mul", ["x", "c"], ["xc"]),
                helper.make_node("Split", ["x"], ["x1", "x2"], axis=-1, num_outputs=2),
                helper.make_node("Neg", ["x2"], ["nx2"]),
                helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
                helper.make_node("Mul", ["rot", "s"], ["rs"]),
                helper.make_node("Add", ["xc", "rs"], ["y"]),
            ],
            [("x", F, x4), ("c", F, [B, 1, S, H]), ("s", F, [B, 1, S, H])],
            [("y", F, x4)],
            [("xc", F, x4), ("x1", F, half), ("x2", F, half), ("nx2", F, half), ("rot", F, x4), ("rs", F, x4)],
        )
    )
    n = B * N * S * H
    assert fused.flops == 3 * n and unfused.flops == fused.flops + n // 2
    # reads x, the position ids and the gathered cos/sin rows only (not the 64-row caches), writes y
    assert fused.bytes == 4 * n + 8 * B * S + 2 * 4 * B * S * (H // 2) * N + 4 * n


def test_matmul_nbits_equals_dequantize_plus_matmul():
    k, n, block = 64, 32, 32
    blocks = k // block
    fused = _total(
        _model(
            [_ms("MatMulNBits", ["a", "bq", "sc", "zp"], ["y"], K=k, N=n, bits=4, block_size=block)],
            [("a", F, [B, S, k])],
            [("y", F, [B, S, n])],
            inits=[
                helper.make_tensor("bq", TensorProto.UINT8, [n, blocks, block // 2], [0] * (n * blocks * block // 2)),
                helper.make_tensor("sc", F, [n * blocks], [1.0] * (n * blocks)),
                helper.make_tensor("zp", TensorProto.UINT8, [n * blocks // 2], [0] * (n * blocks // 2)),
            ],
        )
    )
    unfused = _total(
        _model(
            [
                helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1, block_size=block),
                helper.make_node("MatMul", ["a", "w"], ["y"]),
            ],
            [("a", F, [B, S, k])],
            [("y", F, [B, S, n])],
            [("w", F, [k, n])],
            [
                helper.make_tensor("wq", TensorProto.UINT8, [k, n], [0] * (k * n)),
                helper.make_tensor("ws", F, [blocks, n], [1.0] * (blocks * n)),
                helper.make_tensor("wz", TensorProto.UINT8, [blocks, n], [0] * (blocks * n)),
            ],
        )
    )
    assert fused.flops == unfused.flops == 2 * k * B * S * n + 2 * k * n
    assert fused.weight_bytes < unfused.weight_bytes  # 4-bit weights read packed


def test_quantized_matmuls_contract_like_matmul():
    u8 = TensorProto.UINT8
    mm = _total(
        _model(
            [helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", F, [S, D]), ("b", F, [D, 8])], [("y", F, [S, 8])]
        )
    )
    integer = _total(
        _model(
            [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])],
            [("a", u8, [S, D]), ("b", u8, [D, 8]), ("az", u8, []), ("bz", u8, [])],
            [("y", TensorProto.INT32, [S, 8])],
        )
    )
    assert integer.contraction_flops == mm.contraction_flops and integer.vector_flops == S * D + D * 8
    qlinear = _total(
        _model(
            [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])],
            [
                ("a", u8, [S, D]),
                ("as", F, []),
                ("az", u8, []),
                ("b", u8, [D, 8]),
                ("bs", F, []),
                ("bz", u8, []),
                ("ys", F, []),
                ("yz", u8, []),
            ],
            [("y", u8, [S, 8])],
        )
    )
    assert qlinear.contraction_flops == mm.contraction_flops
    assert qlinear.vector_flops == S * D + D * 8 + 2 * S * 8


def test_quantize_dequantize_and_dynamic():
    q = _total(
        _model(
            [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
            X,
            [("y", TensorProto.UINT8, [B, S, D])],
            inits=[_const("s", 0.1), helper.make_tensor("z", TensorProto.UINT8, [], [3])],
        )
    )
    assert q.vector_flops == 2 * ELEMS
    dq = _total(
        _model(
            [helper.make_node("DequantizeLinear", ["xq", "s"], ["y"])],
            [("xq", TensorProto.INT8, [B, S, D])],
            [("y", F, [B, S, D])],
            inits=[_const("s", 0.1)],
        )
    )
    assert dq.vector_flops == ELEMS  # no zero point: the scale only
    dyn = _total(
        _model(
            [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"])],
            X,
            [("y", TensorProto.UINT8, [B, S, D]), ("ys", F, []), ("yz", TensorProto.UINT8, [])],
        )
    )
    assert dyn.vector_flops == 4 * ELEMS + 6


# -- whole decoders after the optimisers: every node has a rule ---------------------------------


@pytest.fixture(scope="module")
def decoder_files(tmp_path_factory):
    """A tiny GPT-2 and LLaMA (1 block, random weights) saved as ONNX files."""
    from dabench_ir.models.config import ModelConfig
    from dabench_ir.models.export import export_onnx

    folder = tmp_path_factory.mktemp("decoders")
    out = {}
    for family in ("gpt2", "llama"):
        cfg = ModelConfig(
            family=family, layers=1, hidden=64, heads=4, kv_heads=2 if family == "llama" else None, seq=16, vocab=128
        )
        out[family] = folder / f"{family}.onnx"
        onnx.save(export_onnx(cfg, weights="random"), out[family])
    return out


@pytest.fixture(scope="module")
def optimised_decoders(decoder_files):
    """Each decoder after onnxscript's optimize_for_ort and after onnxruntime's transformer optimiser."""
    pytest.importorskip("onnxscript")
    import onnx_ir as ir
    from onnxruntime.transformers import optimizer
    from onnxscript.rewriter import ort_fusions

    out = {}
    for family, path in decoder_files.items():
        fused = ir.from_proto(onnx.load(path))  # each optimiser starts from the file
        ort_fusions.optimize_for_ort(fused)
        out[f"{family}/onnxscript"] = ir.to_proto(fused)
        opt = optimizer.optimize_model(str(path), model_type="gpt2", num_heads=4, hidden_size=64, opt_level=0)
        opt.save_model_to_file(str(path.with_suffix(".ort.onnx")))  # adds the com.microsoft opset import
        out[f"{family}/ort-transformers"] = onnx.load(path.with_suffix(".ort.onnx"))
    return out


def test_optimised_decoders_have_no_node_without_a_rule(optimised_decoders):
    fused_ops = set()
    for key, model in optimised_decoders.items():
        graph = analyze(model)
        estimated = [n.qualified_op for n in graph.nodes if meta.ESTIMATED in n.meta or meta.UNATTRIBUTED in n.meta]
        assert estimated == [], key
        fused_ops |= {n.qualified_op for n in graph.nodes if n.domain == "com.microsoft"}
    assert {
        "com.microsoft::MultiHeadAttention",
        "com.microsoft::SkipLayerNormalization",
        "com.microsoft::SkipSimplifiedLayerNormalization",
    } <= fused_ops


def test_study_of_decoders_accounts_for_every_source_node(decoder_files, tmp_path):
    """onnxscript's fusions keep the FLOPs (GPT-2 exactly; LLaMA's fused RMSNorm/rotary differ by the
    per-row reciprocal and the rotate_half negation) and every source node lands in one diff row."""
    from dabench_ir.study import run_study

    for family, path in decoder_files.items():
        doc = run_study(path, ["onnxscript-fusions", "ort-all"], [], out_dir=tmp_path / family)
        for run in doc["runs"]:
            t = run["totals"]
            assert t["source_nodes_accounted"] == t["nodes_before"], (family, run["pipeline"])
            assert t["estimated_after"] == 0
            accounted = [m for r in run["nodes"] for m in r["replaces"]]
            assert len(accounted) == len(set(accounted)) == t["nodes_before"]
            if family == "gpt2" or run["pipeline"] == "ort-all":
                assert t["flops_after"] == t["flops_before"], (family, run["pipeline"])
            else:
                assert t["flops_after"] == pytest.approx(t["flops_before"], rel=5e-3)
        fusions = next(r for r in doc["runs"] if r["pipeline"] == "onnxscript-fusions")
        mha = [r for r in fusions["nodes"] if r["op"] == "com.microsoft::MultiHeadAttention"]
        assert mha and all(r["status"] == "fused" and r["flops_before"] == r["flops_after"] for r in mha)
        assert all(any("matmul" in m.lower() for m in r["replaces"]) for r in mha)
