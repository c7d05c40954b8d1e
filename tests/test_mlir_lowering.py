"""Lowering ONNX to linalg without torch-mlir's shape and dtype refinement when every type is
static (`ONNX_STATIC_PIPELINE`): the same module as the full `ONNX_PIPELINE`, and the full one
whenever a type is not static or the shortened pipeline fails."""

from __future__ import annotations

import logging

import onnx
import pytest

pytest.importorskip("torch_mlir")

from dabench_ir.errors import UserError
from dabench_ir.mlir.load import (
    all_static,
    import_onnx,
    lower_static_onnx,
    lower_to_linalg,
    mlir_context,
    parse_mlir,
    prepare_onnx,
)
from tests.conftest import parse

# A decoder-ish block: matmul, softmax, layer norm, erf (each lowered through torch's decompositions).
BLOCK = """
agraph (float[N, 8] x, float[8, 8] w, float[8] g, float[8] b) => (float[N, 8] y) {
    h = MatMul(x, w)
    s = Softmax <axis = -1> (h)
    n = LayerNormalization <axis = -1, epsilon = 0.00001> (s, g, b)
    e = Erf(n)
    y = Mul(n, e)
}
"""

# Range's length is data: ONNX shape inference leaves it `?`, torch-mlir's shape library refines it.
RANGE = """
agraph (float[N, 4] x) => (float[N, 4] y) {
    zero = Constant <value = int64 {0}> ()
    one = Constant <value = int64 {1}> ()
    axes = Constant <value = int64[1] {1}> ()
    shape = Shape(x)
    n = Gather <axis = 0> (shape, zero)
    r = Range(zero, n, one)
    rf = Cast <to = 1> (r)
    ru = Unsqueeze(rf, axes)
    y = Add(x, ru)
}
"""


def _bound_unfolded(text: str) -> onnx.ModelProto:
    """``text`` with N bound to 2 and its shapes inferred by ONNX alone: what `prepare_onnx` gave before
    it folded the shape arithmetic (a dim ONNX cannot infer stays ``?`` for torch-mlir to refine)."""
    proto = parse(text)
    for vi in (*proto.graph.input, *proto.graph.output):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param == "N":
                d.dim_value = 2
    return onnx.shape_inference.infer_shapes(proto, data_prop=True)


def _lowered(text: str, caplog: pytest.LogCaptureFixture, *, folded: bool = True, **kwargs: bool) -> tuple[str, str]:
    proto = prepare_onnx(parse(text), {"N": 2}, frozenset())[0] if folded else _bound_unfolded(text)
    module = import_onnx(proto, context=mlir_context())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dabench_ir.mlir.load"):
        assert lower_to_linalg(module, **kwargs) == "onnx"
    lowered = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lowered")]
    return module.operation.get_asm(enable_debug_info=True, large_elements_limit=16), lowered[0]


def test_static_onnx_skips_the_refinement_and_lowers_to_the_same_module(caplog):
    refined, how_refined = _lowered(BLOCK, caplog, refine=True)
    static, how = _lowered(BLOCK, caplog)
    assert "static types, no shape refinement" in how and "shapes and dtypes refined" in how_refined
    assert static == refined
    assert "linalg.matmul" in static and "math.erf" in static and "?" not in static


def test_a_dim_onnx_cannot_infer_takes_the_full_pipeline(caplog):
    imported = import_onnx(_bound_unfolded(RANGE), context=mlir_context()).operation.get_asm(large_elements_limit=1)
    assert "!torch.vtensor<[?],si64>" in imported and not all_static(imported)
    refined, _ = _lowered(RANGE, caplog, folded=False, refine=True)
    lowered, how = _lowered(RANGE, caplog, folded=False)
    assert "shapes and dtypes refined" in how and lowered == refined


def test_the_import_folds_the_shape_arithmetic_onnx_cannot_infer():
    """With the dims bound, `prepare_onnx` folds the shape computation (Shape, Gather, Range of a
    shape) so torch-mlir imports static types: TorchScript exports' ``unk__N`` dims no longer reach it."""
    proto, _ = prepare_onnx(parse(RANGE), {"N": 2}, frozenset())
    imported = import_onnx(proto, context=mlir_context()).operation.get_asm(large_elements_limit=1)
    assert all_static(imported) and "onnx.Range" not in imported


def test_the_full_pipeline_runs_on_the_module_as_it_was_when_the_short_one_fails(caplog):
    text = """
func.func @main_graph(%a: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
    attributes {torch.onnx_meta.opset_version = 17 : si64} {
  %0 = torch.operator "onnx.Frobnicate"(%a) : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> loc("n")
  return %0 : !torch.vtensor<[2],f32>
}
"""
    messages = []
    for refine in (True, False):
        module = parse_mlir(text, context=mlir_context(), isolate=False)
        assert all_static(module.operation.get_asm())
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dabench_ir.mlir.load"), pytest.raises(UserError) as info:
            lower_to_linalg(module, where="m.mlir", refine=refine)
        messages.append(str(info.value))
        fell_back = any("not static after the backend contract" in r.getMessage() for r in caplog.records)
        assert fell_back is not refine  # the short pipeline was tried, failed, and was undone
    assert messages[0] == messages[1] and messages[0].startswith("m.mlir: cannot lower to linalg: ")
    assert "onnx.Frobnicate" in messages[0]


@pytest.mark.parametrize(
    ("text", "static"),
    [
        ("%0 = f : !torch.vtensor<[1,2048,4096],f32> -> !torch.vtensor<[],si64>", True),
        ("!torch.vtensor<[2],complex<f32>>", True),
        ("!torch.vtensor<[?,4],f32>", False),
        ("!torch.vtensor<[2,4],unk>", False),
        ("!torch.vtensor<*,f32>", False),
        ("(!torch.vtensor) -> !torch.vtensor<[2],f32>", False),
        ("!torch.tensor<[2],f32>", False),
        ("!torch.list<vtensor>, !torch.int", True),
    ],
)
def test_static_means_every_tensor_type_has_static_dims_and_a_dtype(text, static):
    assert all_static(text) is static


@pytest.mark.parametrize("kind", ["list", "optional"])
def test_an_imported_sequence_of_tensors_takes_the_full_pipeline(kind):
    text = f'%0 = torch.operator "onnx.SequenceConstruct"(%a) : (!torch.vtensor<[2],f32>) -> !torch.{kind}<vtensor<[2],f32>>'
    assert all_static(text)  # the element type is static, but refinement may still type the sequence
    assert lower_static_onnx(None, text) is False  # decided on the text, before the module is touched


# A symbolic batch and sequence: a run binds them with --batch and --seq before the MLIR import.
SYMBOLIC = """
agraph (float[batch, seq, 8] x) => (float[batch, seq, 8] y)
<float[8, 8] w = {1,0,0,0,0,0,0,0, 0,1,0,0,0,0,0,0, 0,0,1,0,0,0,0,0, 0,0,0,1,0,0,0,0,
                  0,0,0,0,1,0,0,0, 0,0,0,0,0,1,0,0, 0,0,0,0,0,0,1,0, 0,0,0,0,0,0,0,1}> {
    y = MatMul(x, w)
}
"""


def test_batch_and_seq_bind_the_dims_before_the_mlir_import():
    from dabench_ir.pipeline import profile

    model = parse(SYMBOLIC)
    by_flags = profile(model, via="mlir", batch=2, seq=4)
    by_dims = profile(model, via="mlir", dims={"batch": 2, "seq": 4})
    assert by_flags.totals["flops"] == by_dims.totals["flops"] == 2 * 2 * 4 * 8 * 8  # 2 FLOPs per MAC
    assert by_flags.to_dict()["nodes"] == by_dims.to_dict()["nodes"]
    with pytest.raises(UserError, match=r"unbound symbolic dims: batch, seq; bind them with --batch N --seq N"):
        profile(model, via="mlir")
