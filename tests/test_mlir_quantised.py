"""`--via mlir` at the quantised precisions int8 (W8A8), fp8 and w4a16: the block matmuls' weights stored
quantised in the ONNX model imported (dabench_ir/mlir/load.py, `dequantised_weights`), costed from
the linalg module as the ONNX path costs them (docs/mlir.md, "Precision").

Expected before running: the contraction FLOPs equal the ONNX path's (the quantisation changes no
multiply-add); each block matmul node computes at the 8-bit dtype, read from the module
(`count.mark_narrow_contractions`): int8 from ``linalg.quantized_matmul``'s i8 operands, fp8 from
the contraction's weight widened from f8E4M3FN; weight bytes one byte an element on both paths.
w4a16 (group-wise uint4, groups of 128 along K, an fp16 scale and a uint4 zero point per group)
computes at fp16 on both paths: the MLIR path's explicit dequantisation (two casts, a subtract, a
multiply) is fused into the matmul, so its vector FLOPs (2 per weight element) and weight bytes
(half a byte an element, 2.5 B a group) are the ONNX path's `DequantisePass` figures exactly.
On a decoder the MLIR path's step time over the ONNX path's is what it is at fp16 (the precision
both import the rest of the model at), within 10 %, and total FLOPs agree within 1 %.
"""

from __future__ import annotations

import pytest

from dabench_ir.ir import DType
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.pipeline import prepare_graph, profile
from tests._helpers import IN_BLOCK, matmul_softmax, weightless

pytest.importorskip("torch_mlir")


@pytest.fixture(scope="module")
def block_model(tmp_path_factory):
    """``y = Softmax(MatMul(x, W))``, the MatMul inside decoder block 0, so its weight is quantised."""
    return matmul_softmax(tmp_path_factory.mktemp("quantised") / "block.onnx", opset=19, name=IN_BLOCK)


def _matmul(model, **options):
    graph = prepare_graph(model, ProfileOptions(**options), "h100")
    (node,) = [n for n in graph.nodes if n.op_type == "MatMul"]
    return node, meta.get_cost(node)


def test_int8_is_an_integer_matmul_in_the_module(block_model):
    """W8A8 in QDQ form: torch-mlir fuses it into linalg.quantized_matmul (i8 x i8 into i32); its
    zero-point subtractions (of the constant 0) are free, so the contraction is 2 x 4 x 8 x 16; the
    activation's quantisation (divide, round, add the zero point, clamp twice: 4 vector FLOPs and a
    special op per x element) and the output's rescale (1 multiply per y element) are the matmul's."""
    node, cost = _matmul(block_model, via="mlir", precision="int8")
    ops = {c.op_name for c in node.meta[meta.MLIR_OPS]}
    assert "linalg.quantized_matmul" in ops
    assert node.meta[meta.PRECISION] is DType.INT8
    assert cost.contraction_flops == 1024 and cost.weight_bytes == 128
    assert (cost.vector_flops, cost.special_ops) == (4 * 32 + 64, 32)


def test_fp8_weight_widening_is_fused_into_the_contraction(block_model):
    """fp8: W stored f8E4M3FN behind a Cast to fp16; the widening is fused into the matmul, which
    reads W at one byte (a weight) and computes at fp8; its bytes are the fp16 matmul's less W's
    second byte an element."""
    node, cost = _matmul(block_model, via="mlir", precision="fp8")
    _, fp16 = _matmul(block_model, via="mlir", precision="fp16")
    assert node.meta[meta.PRECISION] is DType.FLOAT8E4M3FN
    widening = [c for c in node.meta[meta.MLIR_OPS] if c.reason and "widening" in c.reason]
    assert len(widening) == 1 and widening[0].cost.bytes == 0
    assert cost.contraction_flops == fp16.contraction_flops == 1024 and cost.vector_flops == fp16.vector_flops
    assert cost.weight_bytes == 128 and cost.bytes == fp16.bytes - 128


@pytest.mark.parametrize("precision", ["int8", "fp8", "w4a16"])
def test_quantised_runs_record_their_precision(block_model, precision):
    config = profile(block_model, "h100", via="mlir", precision=precision).to_dict()["config"]
    assert config["precision"] == precision
    assert config["run"]["costed_from"] == "linalg"


@pytest.fixture(scope="module")
def wide_block_model(tmp_path_factory):
    """``y = Softmax(MatMul(x, W))`` with W [256, 16], in decoder block 0: two int4 groups of 128 per column."""
    return matmul_softmax(tmp_path_factory.mktemp("quantised") / "wide_block.onnx", k=256, opset=19, name=IN_BLOCK)


def test_w4a16_dequantisation_is_fused_into_the_matmul(wide_block_model):
    """w4a16: W stored uint4 [2, 128, 16], widened, less its zero point, times its scale (each [2, 1, 16]),
    reshaped to [256, 16]; the widenings are free and the subtract and multiply (2 x 4096 vector FLOPs)
    are fused into the matmul, which reads W at half a byte an element plus 32 groups x (2 B scale +
    0.5 B zero point): the ONNX path's `DequantisePass` figures; it computes at fp16, and every byte
    but the weight's is the fp16 matmul's."""
    node, cost = _matmul(wide_block_model, via="mlir", precision="w4a16")
    _, onnx_cost = _matmul(wide_block_model, precision="w4a16")
    _, fp16 = _matmul(wide_block_model, via="mlir", precision="fp16")
    assert node.meta[meta.PRECISION] is DType.FLOAT16
    fused = [c for c in node.meta[meta.MLIR_OPS] if c.reason and "int4" in c.reason]
    assert len(fused) == 4 and all(c.cost.act_bytes_out == 0 for c in fused)
    assert cost.contraction_flops == onnx_cost.contraction_flops == fp16.contraction_flops == 2 * 4 * 256 * 16
    assert cost.vector_flops == onnx_cost.vector_flops == 2 * 256 * 16
    assert cost.weight_bytes == onnx_cost.weight_bytes == 256 * 16 // 2 + 32 * 2 + 32 // 2
    assert (cost.act_bytes_in, cost.act_bytes_out) == (fp16.act_bytes_in, fp16.act_bytes_out)


def test_w4a16_weight_is_a_uint4_argument(wide_block_model):
    from dabench_ir.mlir.load import mlir_asm

    graph = prepare_graph(wide_block_model, ProfileOptions(via="mlir", precision="w4a16"), "h100")
    asm = mlir_asm(graph, debug_info=False)
    assert "tensor<2x128x16xi4>" in asm and "tensor<2x1x16xi4>" in asm and "tensor<2x1x16xf16>" in asm


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A 2-block LLaMA (GQA, SwiGLU) large enough that its step on an H100 is not all host issue."""
    path = tmp_path_factory.mktemp("decoder") / "llama.onnx"
    return weightless(path, family="llama", layers=2, hidden=512, heads=8, kv_heads=4, seq=256, batch=8)


@pytest.mark.torch
@pytest.mark.parametrize("precision", ["int8", "fp8", "w4a16"])
def test_decoder_agrees_with_the_onnx_path(decoder, precision):
    totals = {
        (via, p): profile(decoder, "h100", via=via, precision=p).to_dict()["totals"]
        for via in ("onnx", "mlir")
        for p in ("fp16", precision)
    }
    onnx_t, mlir_t = totals["onnx", precision], totals["mlir", precision]
    assert mlir_t["contraction_flops"] == onnx_t["contraction_flops"]
    # the quantisation takes as many weight bytes off on both paths (the block matmuls' weights at 1 B
    # an element, or 0.5 B plus 2.5 B a group): a folded weight transpose had handed its readers the
    # widened copy's 2 B an element as weight bytes (int8 MLIR 18.9 MB of weights against fp16's 12.6)
    saved = {
        via: totals[via, "fp16"]["weight_bytes"] - totals[via, precision]["weight_bytes"] for via in ("onnx", "mlir")
    }
    assert saved["mlir"] == saved["onnx"] > 0
    assert mlir_t["flops"] == pytest.approx(onnx_t["flops"], rel=0.01)
    ratio = mlir_t["time_s"] / onnx_t["time_s"]
    at_fp16 = totals["mlir", "fp16"]["time_s"] / totals["onnx", "fp16"]["time_s"]
    assert ratio == pytest.approx(at_fp16, rel=0.10)


def test_study_mlir_row_records_a_quantised_precision(block_model):
    from dabench_ir.study import run_study

    doc = run_study(block_model, ["mlir-elementwise"], ["h100"], ProfileOptions(precision="int8"), via="mlir")
    (row,) = doc["runs"]
    assert row["config"]["precision"] == row["mlir"]["precision"] == "int8"


def test_the_linalg_path_finds_the_attention_cores_the_onnx_path_finds(decoder):
    """A linalg module lowers each linear layer's weight through a transpose the graph keeps, whose
    output read as an activation: the weight matmuls then paired up as attention cores (q with k
    projection, v projection with QKᵀ, ...), the softmax fell outside every core, and fused attention
    (the H100's default) dropped the projections' outputs from memory instead of the scores. A
    weight's layout now folds into a constant as the ONNX passes fold it
    (`mlir.count.fold_weight_layouts`), so it is a weight: each layer has one core, QKᵀ to the probabilities' matmul,
    as on the ONNX path, and its nodes move, fused, what they move there."""
    from dabench_ir.passes.training import attention_cores

    graphs = {via: prepare_graph(decoder, ProfileOptions(via=via), "h100") for via in ("onnx", "mlir")}
    cores = {}
    for via, graph in graphs.items():
        by_core: dict[int, list[str]] = {}
        for name, cid in attention_cores(graph).items():
            by_core.setdefault(cid, []).append(graph.node(name).op_type)
        cores[via] = sorted(by_core.values())
    assert len(cores["mlir"]) == len(cores["onnx"]) == 2  # one a layer
    for ops in cores["mlir"]:
        assert ops[0] == ops[-1] == "MatMul" and ops.count("MatMul") == 2 and "Softmax" in ops
    mlir = graphs["mlir"]
    softmax = [n for n in mlir.nodes if n.op_type == "Softmax"]
    assert softmax and all(meta.get_cost(n).act_bytes_in == meta.get_cost(n).act_bytes_out == 0 for n in softmax)
    # fused, a core node moves what crosses the core's boundary on both paths, to the byte (QKᵀ's
    # linalg scaling and a softmax's max, exp, sum and divide are intermediates that stay on chip)
    onnx = graphs["onnx"]
    core_nodes = sorted(attention_cores(onnx))
    assert core_nodes == sorted(attention_cores(mlir))
    moved = {
        via: [(c.act_bytes_in, c.act_bytes_out) for c in (meta.get_cost(g.node(n)) for n in core_nodes)]
        for via, g in graphs.items()
    }
    assert moved["mlir"] == moved["onnx"] and any(moved["onnx"])
    folded = [n for n in mlir.nodes if meta.FOLDED in n.meta and n.op_type == "Transpose"]
    assert len(folded) >= 2 * 7  # each layer's seven weight transposes, costing nothing a step
    assert all(meta.get_cost(n).flops == meta.get_cost(n).bytes == 0 for n in folded)
