"""The profile and scale commands end to end on tiny models, every output flag."""

from __future__ import annotations

import csv
import json

import onnx
import pytest
from onnx import TensorProto, helper

from dabench_ir.cli import main
from tests.conftest import parse, report_flags

BLOCK = """
agraph (float[2,16,32] x) => (float[2,16,32] y)
<float[32,32] W1 = {%s}, float[32,32] W2 = {%s}>
{
    h = MatMul(x, W1)
    s = Softmax<axis=-1>(h)
    y = MatMul(s, W2)
}
""" % (",".join(["0.01"] * 1024), ",".join(["0.02"] * 1024))  # noqa: UP031


@pytest.fixture
def block(tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(parse(BLOCK), path)
    return path


def test_profile_on_a_target_writes_every_output(block, tmp_path, capsys):
    out = {k: tmp_path / f"r.{k}" for k in ("json", "csv", "html")}
    trace = tmp_path / "trace.json"
    code = main(
        ["profile", str(block), "--target", "rdu", *report_flags(tmp_path / "r"), "--trace", str(trace), "--no-color"]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "target     sn30 (rdu), fits: yes" in text and "Time by bound class" in text
    report = json.loads(out["json"].read_text())
    assert report["schema"] == "dabench-ir/report/v1" and report["target"]["name"] == "sn30"
    assert report["totals"]["time_s"] > 0 and report["totals"]["energy_j"] > 0
    assert all(n["time_s"] is not None and n["unit"] for n in report["nodes"])
    rows = list(csv.DictReader(out["csv"].open()))
    assert [r["name"] for r in rows if r["kind"] == "node"] == [n["name"] for n in report["nodes"]]
    assert "traceEvents" in json.loads(trace.read_text())
    assert "<img" in out["html"].read_text()


def test_precision_and_training_change_the_figures(block, tmp_path):
    def run(*extra):
        path = tmp_path / "r.json"
        assert main(["profile", str(block), "--target", "h100", "--quiet", "--json", str(path), *extra]) == 0
        return json.loads(path.read_text())

    fp32, fp16, train = (
        run("--precision", "fp32"),
        run("--precision", "fp16"),
        run("--mode", "train", "--precision", "fp32"),
    )
    assert fp16["totals"]["bytes"] * 2 == fp32["totals"]["bytes"]
    assert run()["config"]["precision"] == "bf16"  # what practitioners run on an H100: targets/h100.toml [defaults]
    assert fp16["config"]["precision_by_class"] == {"contraction": "fp16", "vector": "fp16"}
    # each matmul is half the forward contraction; the first reads the raw input (dW only:
    # 2x), the second an activation that needs a gradient (dX and dW: 3x)
    half = fp32["totals"]["contraction_flops"] // 2
    assert train["totals"]["contraction_flops"] == 2 * half + 3 * half
    assert train["config"]["train"]["optimizer_state_bytes"] == 8 * 2 * 1024  # Adam's two fp32 moments
    assert train["config"]["train"]["gradient_bytes"] == 4 * 2 * 1024
    assert train["config"]["train"]["loss"] is None  # no token table: no language-model logits to score


def test_a_language_model_trains_with_its_loss_and_says_so(tmp_path, capsys):
    path = tmp_path / "lm.onnx"
    zeros = ",".join(["0.0"] * 40)
    onnx.save(
        parse(f"""
        lm (int64[1,3] ids) => (float[1,3,10] logits)
        <float[10,4] wte = {{{zeros}}}, float[4,10] head = {{{zeros}}}> {{
            h = Gather(wte, ids)
            logits = MatMul(h, head)
        }}
        """),
        path,
    )
    out = tmp_path / "r.json"
    assert main(["profile", str(path), "--target", "wse", "--mode", "train", "--json", str(out), "--no-color"]) == 0
    assert "train (softmax cross-entropy loss, adam, recompute none)" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["config"]["train"]["loss"] == "loss.cross_entropy"
    assert any(n["name"] == "loss.cross_entropy" for n in report["nodes"])


def test_via_mlir_cross_check_and_annotate(block, tmp_path, capsys):
    annotated = tmp_path / "a.onnx"
    code = main(["profile", str(block), "--via", "mlir", "--cross-check", "--annotate", str(annotated)])
    assert code == 0  # (-q would silence the cross-check table too: tests/test_rough_edges.py)
    out = capsys.readouterr().out
    assert "contraction FLOPs: agree on every node" in out
    model = onnx.load(str(annotated))
    onnx.checker.check_model(model)
    props = {p.key: p.value for p in model.graph.node[0].metadata_props}
    assert props["dabench.flops"] == str(2 * 2 * 16 * 32 * 32)


@pytest.mark.parametrize("via", [None, "onnx", "mlir"])
def test_a_cross_check_puts_each_paths_figures_in_its_own_column_however_it_was_asked(block, capsys, via):
    """The softmax is 4 FLOPs an element by the ONNX rules, 6 on linalg (docs/mlir.md): without --via
    the columns had been swapped (ONNX 7,168, linalg 5,120)."""
    code = main(["profile", str(block), "--cross-check", *(["--via", via] if via else [])])
    assert code == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["Softmax"]]
    assert row.split()[3:6] == ["5,120", "7,168", "+2,048"]


def test_an_annotated_mlir_of_an_onnx_run(block, tmp_path, capsys):
    """``--annotate F.mlir`` on the ONNX path lowers the model and annotates its linalg ops (it failed
    with an internal ImportError)."""
    out = tmp_path / "a.mlir"
    assert main(["profile", str(block), "-t", "h100", "--annotate", str(out), "-q"]) == 0
    assert "dabench.flops" in out.read_text()


def test_comparing_targets(block, tmp_path, capsys):
    path = tmp_path / "c.json"
    assert main(["profile", str(block), "--target", "wse,rdu,ipu", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [r["target"] for r in rows] == ["wse2", "sn30", "bow"]
    assert "dominant bound" in capsys.readouterr().out
    assert main(["profile", str(block), "--target", "wse,tpu9", "--quiet"]) == 2


def test_subgraph_nodes_are_estimated_not_a_crash(tmp_path, capsys):
    branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"])], "b", [], [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])]
    )
    graph = helper.make_graph(
        [
            helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
            helper.make_node("Relu", ["x"], ["z"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [4]),
        ],
    )
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    report = tmp_path / "r.json"
    assert main(["profile", str(path), "--json", str(report), "--quiet"]) == 0
    data = json.loads(report.read_text())
    assert data["unattributed"] == []
    assert [u["op_type"] for u in data["extra"]["estimated"]] == ["If"]
    assert "subgraph" in data["extra"]["estimated"][0]["reason"]
    # the If's estimate: reads the bool condition (1 B), writes y (16 B); no FLOPs
    assert data["totals"]["estimated_nodes"] == 1 and data["totals"]["estimated_bytes"] == 17
    assert data["totals"]["vector_flops"] == 4


def test_scale_command(block, tmp_path, capsys):
    path = tmp_path / "s.json"
    flags = ["--target", "h100", "--chips", "1,2", "--strategy", "dp", "--mode", "train"]
    assert main(["scale", str(block), *flags, "--json", str(path), "--plots", str(tmp_path / "plots")]) == 0
    data = json.loads(path.read_text())
    assert data["schema"] == "dabench-ir/scale/v1"
    assert [p["chips"] for p in data["points"]] == [1, 2]
    assert data["points"][1]["comm_time_s"] > 0 and (tmp_path / "plots" / f"{block.stem}-scaling.svg").exists()
    assert main(["scale", str(block), "--target", "rdu", "--chips", "1,2", "--strategy", "pp"]) == 2
    assert "supports: dp, tp" in capsys.readouterr().err
    assert main(["scale", str(block), "--target", "h100", "--chips", "1,x", "--strategy", "dp"]) == 2
