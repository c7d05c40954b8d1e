"""Annotated ONNX stays checker-valid without loading weights; annotated MLIR parses back."""

from __future__ import annotations

import onnx
import onnx.numpy_helper
import pytest

from dabench_ir.annotate import annotate_onnx
from dabench_ir.pipeline import analyze
from tests.conftest import parse


def _costed_load_mlir(*args, **kwargs):
    """Frontends only load: the linalg cost pass counts."""
    from dabench_ir.frontends.mlir import load_mlir
    from dabench_ir.passes.linalg_cost import LinalgCostPass

    return LinalgCostPass()(load_mlir(*args, **kwargs)).graph


def _costed_onnx_via_mlir(*args, **kwargs):
    from dabench_ir.frontends.mlir import onnx_via_mlir
    from dabench_ir.passes.linalg_cost import LinalgCostPass

    return LinalgCostPass()(onnx_via_mlir(*args, **kwargs)).graph


MODEL = """
agraph (float[2, 4] x, float[4, 3] w) => (float[2, 3] y) {
    h = MatMul(x, w)
    y = Relu(h)
}
"""


def _props(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def test_annotated_onnx_is_checker_valid(tmp_path):
    graph = analyze(parse(MODEL))
    out = annotate_onnx(
        parse(MODEL), graph, tmp_path / "ann.onnx", extra={graph.nodes[0]: {"unit": "pcu0", "time_s": 2e-6}}
    )
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    props = _props(model.graph.node[0])
    assert props["dabench.flops"] == str(2 * 2 * 4 * 3)
    assert props["dabench.unit"] == "pcu0" and props["dabench.time_s"] == "2e-06"
    assert "dabench.bytes" in props and "dabench.intensity" in props


def test_annotation_does_not_load_external_weights(tmp_path):
    model = parse(MODEL)
    import numpy as np

    weight = onnx.numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    model.graph.initializer.append(weight)
    src = tmp_path / "ext.onnx"
    onnx.save_model(model, str(src), save_as_external_data=True, location="ext.data", size_threshold=0)
    data = (tmp_path / "ext.data").read_bytes()
    (tmp_path / "ext.data").unlink()  # annotation must not need the weight file
    graph = analyze(src)
    out = annotate_onnx(src, graph, tmp_path / "ext_ann.onnx")
    ann = onnx.load(str(out), load_external_data=False)
    assert ann.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    assert out.stat().st_size < len(data) + 1000 and not ann.graph.initializer[0].raw_data
    (tmp_path / "ext.data").write_bytes(data)  # the checker verifies the reference resolves
    onnx.checker.check_model(str(out))
    assert _props(ann.graph.node[0])["dabench.flops"] == "48"


def test_annotated_mlir_round_trips(tmp_path):
    pytest.importorskip("torch_mlir")
    from torch_mlir import ir

    from dabench_ir.annotate import annotate_mlir
    from dabench_ir.frontends.mlir import parse_mlir

    graph = _costed_onnx_via_mlir(parse(MODEL))
    out = annotate_mlir(None, graph, tmp_path / "ann.mlir", extra={graph.nodes[0].name: {"unit": "pcu0"}})
    text = out.read_text()
    module = parse_mlir(text)
    found = {}

    def visit(op):
        if "dabench.flops" in op.attributes:
            origin = ir.StringAttr(op.attributes["dabench.origin"]).value
            found[origin] = found.get(origin, 0) + ir.IntegerAttr(op.attributes["dabench.flops"]).value
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    assert found[graph.nodes[0].name] == 48
    assert 'dabench.unit = "pcu0"' in text
    again = _costed_load_mlir(out)  # the annotated file is a valid input too, with the same costs
    assert sum(n.meta["dabench.cost"].flops for n in again.nodes) == sum(found.values())
