"""Formula-free linalg counting: exact FLOPs and bytes on tiny hand-written MLIR."""

from __future__ import annotations

import pytest

pytest.importorskip("torch_mlir")

from dabench_ir.errors import UnboundSymbolError, UserError
from dabench_ir.ir import Cost
from dabench_ir.mlir import UNATTRIBUTED_NODE, load_mlir, onnx_via_mlir
from dabench_ir.passes.meta import COST, UNATTRIBUTED
from tests.conftest import parse


def _costed_load_mlir(*args, **kwargs):
    """Frontends only load: the linalg cost pass counts."""
    from dabench_ir.mlir import LinalgCostPass

    return LinalgCostPass()(load_mlir(*args, **kwargs)).graph


def _costed_onnx_via_mlir(*args, **kwargs):
    from dabench_ir.mlir import LinalgCostPass

    return LinalgCostPass()(onnx_via_mlir(*args, **kwargs)).graph


MATMUL = """
func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<2x4xf32>
  %c = linalg.fill ins(%zero : f32) outs(%init : tensor<2x4xf32>) -> tensor<2x4xf32> loc("mm")
  %0 = linalg.matmul ins(%a, %b : tensor<2x3xf32>, tensor<3x4xf32>)
                     outs(%c : tensor<2x4xf32>) -> tensor<2x4xf32> loc("mm")
  return %0 : tensor<2x4xf32>
}
"""

# Row sums of a 4x8 tensor (a reduction without multiply), and a dot product per row
# (a reduction whose multiply-add is a contraction).
REDUCTIONS = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %acc: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %0 = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<4x8xf32>) outs(%acc : tensor<4xf32>) {
    ^bb0(%in: f32, %out: f32):
      %s = arith.addf %in, %out : f32
      linalg.yield %s : f32
  } -> tensor<4xf32> loc("rowsum")
  %1 = linalg.generic {indexing_maps = [#id, #id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x, %y : tensor<4x8xf32>, tensor<4x8xf32>) outs(%acc : tensor<4xf32>) {
    ^bb0(%a: f32, %b: f32, %out: f32):
      %p = arith.mulf %a, %b : f32
      %s = arith.addf %out, %p : f32
      linalg.yield %s : f32
  } -> tensor<4xf32> loc("rowdot")
  return %0, %1 : tensor<4xf32>, tensor<4xf32>
}
"""

ELEMENTWISE = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %init = tensor.empty() : tensor<4x8xf32>
  %0 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%init : tensor<4x8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %e = math.exp %in : f32
      linalg.yield %e : f32
  } -> tensor<4x8xf32> loc("exp")
  %1 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%0 : tensor<4x8xf32>) outs(%init : tensor<4x8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %z = arith.constant 0.0 : f32
      %c = arith.cmpf ogt, %in, %z : f32
      %m = arith.select %c, %in, %z : f32
      %h = arith.mulf %m, %m : f32
      linalg.yield %h : f32
  } -> tensor<4x8xf32> loc("relu_sq")
  %2 = tensor.collapse_shape %1 [[0, 1]] : tensor<4x8xf32> into tensor<32xf32> loc("reshape")
  %3 = tensor.expand_shape %2 [[0, 1]] output_shape [4, 8] : tensor<32xf32> into tensor<4x8xf32> loc("reshape")
  return %3 : tensor<4x8xf32>
}
"""


def _costs(text: str) -> dict[str, Cost]:
    graph = _costed_load_mlir(text)
    return {n.name: n.meta[COST] for n in graph.nodes}


def test_matmul_is_two_flops_per_multiply_add():
    cost = _costs(MATMUL)["mm"]
    # fill: writes 32 B; matmul: reads A (24 B), B (48 B) and the accumulator (32 B), writes 32 B.
    assert cost == Cost(contraction_flops=2 * 2 * 3 * 4, act_bytes_in=24 + 48 + 32, act_bytes_out=32 + 32)


def test_generic_reductions():
    costs = _costs(REDUCTIONS)
    assert costs["rowsum"] == Cost(vector_flops=32, act_bytes_in=128 + 16, act_bytes_out=16)
    assert costs["rowdot"] == Cost(contraction_flops=64, act_bytes_in=128 + 128 + 16, act_bytes_out=16)


def test_elementwise_exp_compare_select_and_views():
    costs = _costs(ELEMENTWISE)
    assert costs["exp"] == Cost(special_ops=32, act_bytes_in=128, act_bytes_out=128)
    assert costs["relu_sq"] == Cost(vector_flops=3 * 32, act_bytes_in=128, act_bytes_out=128)
    assert costs["reshape"] == Cost()  # views: data movement, no FLOPs, no bytes


def test_graph_edges_and_origin_nodes():
    graph = _costed_load_mlir(ELEMENTWISE)
    assert [n.name for n in graph.nodes] == ["exp", "relu_sq", "reshape"]
    relu = graph.node("relu_sq")
    assert relu.inputs and graph.values[relu.inputs[0]].producer == "exp"
    assert relu.meta["dabench.mlir.class"] == "vector"


def test_op_without_location_is_unattributed():
    """In a module whose other ops name their nodes, an op without a location is listed apart."""
    graph = _costed_load_mlir(MATMUL.replace(' loc("mm")', "", 1))  # the fill loses its location
    node = graph.node(UNATTRIBUTED_NODE)
    assert UNATTRIBUTED in node.meta and "no origin" in node.meta[UNATTRIBUTED]
    assert graph.node("mm").meta[COST].contraction_flops == 48


def test_module_without_locations_costs_each_op():
    """A hand-written module without any location: each op is a node of its own, its work costed
    (issue 46: it was 0 FLOP, 0 ns and "fits" whatever the operands)."""
    costs = _costs(MATMUL.replace(' loc("mm")', ""))
    assert set(costs) == {"linalg.fill", "linalg.matmul"}
    assert costs["linalg.matmul"] == Cost(contraction_flops=48, act_bytes_in=24 + 48 + 32, act_bytes_out=32)


def test_work_on_no_node_is_refused_not_zero():
    """Every op's origin names no node of the graph (a pass dropped or renamed them): refused, never 0 FLOP."""
    from dabench_ir.mlir import LinalgCostPass

    graph = load_mlir(MATMUL)
    graph.nodes[:] = []  # the node the locations name is gone
    graph.invalidate()
    with pytest.raises(UserError, match=r"none of the module's work can be costed on the graph: 2 op\(s\), 48 FLOPs"):
        LinalgCostPass()(graph)


def test_parse_error_is_one_line_user_error():
    with pytest.raises(UserError) as info:
        _costed_load_mlir("func.func @main() {\n  %0 = bogus.op : i32\n}\n")
    message = str(info.value)
    assert "\n" not in message and "bogus" in message


def test_dialect_the_pipeline_cannot_lower_is_user_error():
    text = """
func.func @main(%a: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
    attributes {torch.onnx_meta.opset_version = 18 : si64} {
  %0 = torch.operator "onnx.Frobnicate"(%a) : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> loc("n")
  return %0 : !torch.vtensor<[2],f32>
}
"""
    with pytest.raises(UserError) as info:
        _costed_load_mlir(text)
    assert "cannot lower" in str(info.value) and "\n" not in str(info.value)


ONNX_SYMBOLIC = """
agraph (float[N, 4] x, float[4, 3] w) => (float[N, 3] y) {
    h = MatMul(x, w)
    y = Relu(h)
}
"""


def test_onnx_via_mlir_binds_symbolic_dims():
    graph = _costed_onnx_via_mlir(parse(ONNX_SYMBOLIC), dims={"N": 2})
    mm = graph.nodes[0]
    assert mm.op_type == "MatMul"
    assert mm.meta[COST].contraction_flops == 2 * 2 * 4 * 3
    assert graph.nodes[1].meta[COST].vector_flops == 2 * 3 * 2  # cmpf + select per element
    with pytest.raises(UnboundSymbolError):
        _costed_onnx_via_mlir(parse(ONNX_SYMBOLIC))


def test_counting_imports_no_dialect_python_module():
    """Ops are read as generic views: costing a module imports none of torch-mlir's generated dialect
    classes (linalg's op DSL alone is 0.2 s of a `profile --via mlir`), and the bindings' dialect
    search is as it was afterwards."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from torch_mlir._mlir_libs._mlir import globals as bindings\n"
        "from dabench_ir.mlir import LinalgCostPass, load_mlir\n"
        "before = bindings.dialect_search_modules\n"
        f"graph = LinalgCostPass()(load_mlir({MATMUL!r})).graph\n"
        "assert bindings.dialect_search_modules == before, bindings.dialect_search_modules\n"
        "print(graph.node('mm').meta['dabench.cost'].flops,"
        " sorted(m for m in sys.modules if m.startswith('torch_mlir.dialects.') and m.count('.') == 2"
        " and not m.split('.')[-1].startswith('_')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "48 []", done.stdout + done.stderr


def test_unattributed_work_says_how_much(tmp_path):
    """An op without an origin is listed apart, not in the totals, with the work counted on it: the
    fill's 2x4 fp32 result, 32 B written, in the JSON row and in the table's line."""
    from dabench_ir.pipeline import profile
    from dabench_ir.report.table import render_table

    path = tmp_path / "m.mlir"
    path.write_text(MATMUL.replace(' loc("mm")', "", 1))
    report = profile(str(path), "h100")
    (row,) = report.unattributed
    assert (row["flops"], row["bytes"]) == (0, 32) and report.totals["flops"] == 48
    assert "not counted in the totals above: 0 FLOP, 32 B counted on 1 of them" in render_table(report)
