"""`--via mlir` at a precision: the ONNX model is imported at it, chosen as on the ONNX path.

The graph: ``y = Softmax(MatMul(x, W))``, x a [4, 8] input, W an [8, 16] weight, y [4, 16] (T = 64
elements of y). Expected figures, written before running (docs/mlir.md, "Precision"):

- FLOPs do not depend on the precision on either path, and the MatMul's contraction FLOPs agree
  between the paths (2 x 4 x 8 x 16 = 1024);
- weight bytes agree between the paths at each precision: W is stored at the precision and read
  once (512 B in fp32, 256 B in bf16);
- every tensor that crosses an ONNX node is at the precision, but torch-mlir lowers a bf16 model
  with its own numerics: the matmul accumulates in an f32 tensor (zero fill, accumulate, then a
  truncf to bf16) and softmax computes in f32 (extf in, truncf out). So at linalg level:
  MatMul bf16 = MatMul fp32 - 64 (x read at 2 B) - 256 (W at 2 B) + 256 + 128 (truncf: the f32
  accumulator read, y written in bf16); Softmax bf16 = Softmax fp32 + 128 + 256 (extf) + 256 + 128
  (truncf). The ONNX path halves both nodes' bytes (its bf16 accumulates in bf16).
"""

from __future__ import annotations

import pytest

from dabench_ir.errors import UserError
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.pipeline import prepare_graph, profile
from tests._helpers import IN_BLOCK, matmul_softmax

pytest.importorskip("torch_mlir")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return matmul_softmax(tmp_path_factory.mktemp("prec") / "tiny.onnx")


def _costs(model, target=None, **options):
    graph = prepare_graph(model, ProfileOptions(**options), target)
    by_op = {n.op_type: meta.get_cost(n) for n in graph.nodes if meta.get_cost(n) is not None}
    return by_op["MatMul"], by_op["Softmax"]


@pytest.fixture(scope="module")
def costs(model):
    return {
        (via, prec): _costs(model, via=via, precision=prec) for via in ("onnx", "mlir") for prec in ("fp32", "bf16")
    }


def test_flops_follow_no_precision(costs):
    for via in ("onnx", "mlir"):
        for k in range(2):
            assert costs[via, "fp32"][k].flops == costs[via, "bf16"][k].flops
    assert costs["mlir", "bf16"][0].contraction_flops == costs["onnx", "bf16"][0].contraction_flops == 1024


def test_weight_bytes_agree_between_paths(costs):
    for prec, size in (("fp32", 4), ("bf16", 2)):
        assert costs["onnx", prec][0].weight_bytes == costs["mlir", prec][0].weight_bytes == 128 * size


def test_onnx_path_halves_bytes(costs):
    assert costs["onnx", "fp32"][0].bytes == 128 + 512 + 256
    assert costs["onnx", "bf16"][0].bytes == (128 + 512 + 256) // 2
    assert costs["onnx", "bf16"][1].bytes * 2 == costs["onnx", "fp32"][1].bytes


def test_mlir_bytes_follow_torch_mlir_numerics(costs):
    matmul32, softmax32 = costs["mlir", "fp32"]
    matmul16, softmax16 = costs["mlir", "bf16"]
    # fp32: zero fill 256 written; x 128 + W 512 + accumulator 256 read; y 256 written
    assert matmul32.bytes == 256 + 128 + 512 + 256 + 256
    assert matmul16.bytes == matmul32.bytes - 64 - 256 + 256 + 128
    assert softmax16.bytes == softmax32.bytes + 128 + 256 + 256 + 128


def test_target_default_applies_to_both_paths(model, costs):
    """The RDU's [defaults] precision is bf16: both paths run at it, say so, and cost what --precision bf16 costs."""
    for via in ("onnx", "mlir"):
        run = profile(model, "rdu", via=via).to_dict()["config"]
        assert run["precision"] == "bf16"
        assert run["run"]["knobs"]["precision"] == {"value": "bf16", "source": "target"}
        assert run["run"]["costed_from"] == ("linalg" if via == "mlir" else "onnx")
        matmul, softmax = _costs(model, "rdu", via=via)
        assert (matmul.bytes, softmax.bytes) == (costs[via, "bf16"][0].bytes, costs[via, "bf16"][1].bytes)


def test_fp16_and_mixed_import(model, costs):
    """fp16 is imported as bf16 is (same sizes); mixed is imported at bf16, the graph marked mixed."""
    assert [c.bytes for c in _costs(model, via="mlir", precision="fp16")] == [c.bytes for c in costs["mlir", "bf16"]]
    config = profile(model, "rdu", via="mlir", precision="mixed").to_dict()["config"]
    assert config["precision"] == "mixed"
    assert config["precision_by_class"] == {"contraction": "bf16", "vector": "fp32"}  # softmax in fp32
    assert [c.bytes for c in _costs(model, via="mlir", precision="mixed")] == [c.bytes for c in costs["mlir", "bf16"]]


@pytest.fixture(scope="module")
def block_model(tmp_path_factory):
    return matmul_softmax(tmp_path_factory.mktemp("w8a16") / "block19.onnx", opset=19, name=IN_BLOCK)


def test_w8a16_imports_the_weight_int8_behind_a_dequantize(block_model):
    """w8a16 through linalg: W stored int8 (128 B) with an fp16 scale (32 B) and, because torch-mlir
    lowers a DequantizeLinear only with one, an int8 zero point (16 B) per output channel; the
    dequantisation is the matmul's work, 2 vector FLOPs a weight element (subtract the zero point,
    multiply the scale). The ONNX path: 128 + 32 B and 1 FLOP an element (no zero point). The
    contraction (2 x 4 x 8 x 16) is the same on both."""
    onnx_mm, _ = _costs(block_model, via="onnx", precision="w8a16")
    mlir_mm, _ = _costs(block_model, via="mlir", precision="w8a16")
    assert onnx_mm.contraction_flops == mlir_mm.contraction_flops == 1024
    assert (onnx_mm.weight_bytes, mlir_mm.weight_bytes) == (128 + 32, 128 + 32 + 16)
    assert (onnx_mm.vector_flops, mlir_mm.vector_flops) == (128, 256)
    assert profile(block_model, "h100", via="mlir", precision="w8a16").to_dict()["config"]["precision"] == "w8a16"


def test_w8a16_before_opset_19_dequantizes_through_fp32(tmp_path):
    """Before opset 19 a DequantizeLinear's scale and output are fp32 (ONNX's DequantizeLinear-13):
    the scale is 16 x 4 B and the result is cast to the fp16 the matmul reads."""
    mlir_mm, _ = _costs(matmul_softmax(tmp_path / "block17.onnx", name=IN_BLOCK), via="mlir", precision="w8a16")
    assert mlir_mm.weight_bytes == 128 + 16 * 4 + 16 and mlir_mm.contraction_flops == 1024


def test_a_precision_no_import_writes_is_refused_in_one_line():
    """Every ``--precision`` choice is imported (w4a16 as an explicit group-wise dequantisation:
    tests/test_mlir_quantised.py); another is refused in one line, naming those that are."""
    from dabench_ir.mlir.load import IMPORT_PRECISIONS, check_import_precision
    from dabench_ir.options import PRECISIONS

    assert set(PRECISIONS) <= set(IMPORT_PRECISIONS)
    with pytest.raises(UserError, match="--precision int3 with --via mlir") as info:
        check_import_precision("int3")
    assert "\n" not in str(info.value) and "w4a16" in str(info.value)


def test_mlir_file_keeps_its_types(model, tmp_path):
    from dabench_ir.mlir.load import onnx_via_mlir

    path = tmp_path / "tiny.mlir"
    graph = onnx_via_mlir(model)
    path.write_text(graph.meta[meta.MLIR_ARTIFACT].module.operation.get_asm(enable_debug_info=True))
    with pytest.raises(UserError, match="keeps the types it was written in") as info:
        profile(str(path), "rdu", precision="bf16")
    assert "\n" not in str(info.value)
    config = profile(str(path), "rdu").to_dict()["config"]  # the target's bf16 default does not apply
    assert config["run"]["knobs"]["precision"]["source"] == "model"
    # nor has it an ONNX graph to cost from: --via onnx was accepted, recorded and ignored
    with pytest.raises(UserError, match=r"^--via onnx: an MLIR module has no ONNX to cost from"):
        profile(str(path), "rdu", via="onnx")


def test_study_mlir_rows_record_their_precision(model):
    """Each MLIR row runs, and records, the precision its target's ONNX rows run at (the RDU's bf16,
    the WSE's mixed): the module is imported once per precision."""
    from dabench_ir.study import run_study

    doc = run_study(model, ["mlir-elementwise", "ort-basic"], ["rdu", "wse"], ProfileOptions(), via="mlir")
    rows = {(r["pipeline"], r["target"]): r for r in doc["runs"]}
    for target, precision in (("sn30", "bf16"), ("wse2", "mixed")):
        assert rows["mlir-elementwise", target]["config"]["precision"] == precision
        assert rows["mlir-elementwise", target]["mlir"]["precision"] == precision
        assert rows["ort-basic", target]["config"]["precision"] == precision
