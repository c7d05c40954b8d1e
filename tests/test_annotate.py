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
    from dabench_ir.mlir import LinalgCostPass, load_mlir

    return LinalgCostPass()(load_mlir(*args, **kwargs)).graph


def _costed_onnx_via_mlir(*args, **kwargs):
    from dabench_ir.mlir import LinalgCostPass, onnx_via_mlir

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
    from dabench_ir.mlir import parse_mlir

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


ATTENTION = """
agraph (float[1, 8, 16] x, float[16, 16] wq) => (float[1, 8, 8] p) {
    q = MatMul(x, wq)
    kt = Transpose<perm=[0,2,1]>(x)
    s = MatMul(q, kt)
    p = Softmax<axis=-1>(s)
}
"""


def test_annotated_report_has_target_units_bound_and_role(tmp_path):
    """What Netron shows: readable time, target, bound and role first, the exact numbers after."""
    import dabench_ir
    from dabench_ir.annotate import annotate_report
    from dabench_ir.report.attribution import node_share

    src = tmp_path / "att.onnx"
    onnx.save(parse(ATTENTION), src)
    report = dabench_ir.profile(src, target="rdu")
    out = annotate_report(src, report, tmp_path / "ann.onnx")
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    from dabench_ir.frontends.onnx import onnx_node_names

    index = next(i for i, n in enumerate(model.graph.node) if n.op_type == "MatMul" and n.input[1] == "kt")
    props = _props(model.graph.node[index])
    record = report.node(onnx_node_names(model.graph)[index])
    assert list(props)[:6] == [
        "dabench.target",
        "dabench.time",
        "dabench.share",
        "dabench.bound",
        "dabench.role",
        "dabench.unit",
    ]
    assert props["dabench.target"] == "sn30" and props["dabench.role"] == "attention scores"
    assert props["dabench.bound"] == record.bound == "compute"  # on the 2 PCUs its section holds
    assert float(props["dabench.time_s"]) == record.time_s  # exact: repr reads back to the same float
    t = record.time_s
    unit, scale = next(((u, s) for u, s in (("s", 1), ("ms", 1e3), ("µs", 1e6)) if t * s >= 1), ("ns", 1e9))
    assert props["dabench.time"] == f"{t * scale:.3g} {unit}"
    assert props["dabench.share"] == f"{100 * node_share(report, record):.1f}% of summed time"
    assert props["dabench.flops"] == str(2 * 8 * 16 * 8) and props["dabench.work"] == "2.05 kFLOP"
    top = {p.key: p.value for p in model.metadata_props}
    assert top["dabench.target"] == "sn30" and float(top["dabench.step_time_s"]) == report.totals["time_s"]
    assert top["dabench.time_basis"] == "one step"


def test_an_annotated_mlir_op_shares_its_nodes_figures_as_the_report_has_them(tmp_path):
    """Each origin's ops sum to its node's FLOPs and bytes in the JSON report: a folded weight
    transpose moves nothing, a fused core less (the ops carried their raw counts: 22 of 75 nodes of a
    tiny GPT-2 disagreed, 2,020,420 B against the report's 1,453,120)."""
    import collections
    import json
    import re

    pytest.importorskip("torch_mlir")
    from dabench_ir.cli import main
    from tests._helpers import weightless

    model = weightless(tmp_path / "gpt2.onnx", family="gpt2", layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=1)
    report, annotated = tmp_path / "r.json", tmp_path / "a.mlir"
    argv = ["profile", model, "--via", "mlir", "-t", "h100", "-q", "--json", str(report), "--annotate", str(annotated)]
    assert main(argv) == 0
    nodes = {n["name"]: n for n in json.loads(report.read_text())["nodes"]}
    summed: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for attrs in re.findall(r"\{([^{}]*dabench\.origin[^{}]*)\}", annotated.read_text()):
        fields = dict(re.findall(r'(dabench\.\w+) = ("[^"]*"|[-\d.e+]+)', attrs))
        origin = fields["dabench.origin"].strip('"')
        summed[origin][0] += int(fields["dabench.flops"])
        summed[origin][1] += int(fields["dabench.bytes"])
    assert summed and all(
        summed[name] == [nodes[name]["flops"], nodes[name]["bytes"]] for name in summed if name in nodes
    )


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"mode": "train"}, {"chips": 2, "strategy": "tp"}])
def test_an_annotated_files_figures_add_up_to_its_reports_step_and_totals(tmp_path, options):
    """A training step's loss and optimizer have no node in the exported file: their time was left out
    of it (39 % of an H100 step), and a tp run's file gave one chip's FLOPs as the model's total."""
    import onnx

    from dabench_ir.annotate import annotate_report
    from dabench_ir.frontends.onnx import load_onnx
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import profile_graph

    proto = export_onnx(ModelConfig(family="gpt2", layers=2, hidden=64, heads=4, seq=16, batch=2), weights="none")
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    report = profile_graph(load_onnx(str(path)), "h100", options)
    out = onnx.load(str(annotate_report(str(path), report, tmp_path / "a.onnx")), load_external_data=False)
    props = {p.key: p.value for p in out.metadata_props}
    nodes = sum(float({p.key: p.value for p in n.metadata_props}.get("dabench.time_s", 0)) for n in out.graph.node)
    if "chips" not in options:  # one chip: its nodes, in the file or not, and its overhead rows are the step
        parts = nodes + float(props["dabench.overhead_s"]) + float(props["dabench.time_outside_file_s"])
        assert parts == pytest.approx(float(props["dabench.step_time_s"]), rel=1e-9)
        assert "optimizer" in props["dabench.nodes_outside_file"]
    assert (
        int(props["dabench.total_flops"]) == report.totals["flops"]
        and int(props["dabench.total_bytes"]) == report.totals["bytes"]
    )
