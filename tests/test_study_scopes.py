"""Studies keep the source model's scopes through a rewrite, and split every speedup into parts."""

from __future__ import annotations

import json

import onnx
import pytest

from dabench_ir.cli import main
from dabench_ir.frontends.onnx import load_onnx
from dabench_ir.models import ModelConfig, export_model
from dabench_ir.study import diff_reports, provenance, run_study
from dabench_ir.study.render import render_study, validate_study
from dabench_ir.study.scopes import common_scope
from tests.conftest import report_flags

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A tiny GPT-2 decoder, optimised by onnxruntime (level all), placed on rdu and h100."""
    root = tmp_path_factory.mktemp("scopes")
    src = root / "gpt2.onnx"
    export_model(ModelConfig(family="gpt2", layers=2, hidden=64, heads=4, seq=16, vocab=96), src, weights="random")
    doc = run_study(src, ["ort-all"], ["rdu", "h100"], out_dir=root / "out")
    return src, root / "out", doc


def _report(out, pipeline, target):
    return json.loads((out / f"gpt2.{pipeline}.{target}.json").read_text())


def test_common_scope_is_the_longest_dotted_prefix():
    assert common_scope(["layers.0.attn.q_proj", "layers.0.attn.q_proj"]) == "layers.0.attn.q_proj"
    assert common_scope(["layers.0.attn.q_proj", "layers.0.attn.k_proj", ""]) == "layers.0.attn"
    assert common_scope(["layers.0", "layers.0.mlp_norm"]) == "layers.0"
    assert common_scope(["layers.1", "layers.10"]) == "layers"  # whole components, never a character prefix
    assert common_scope(["embed", "layers.0.attn_norm"]) == "" and common_scope(["", ""]) == ""


def test_ort_optimised_model_keeps_scopes_layers_and_sections(study):
    src, out, _ = study
    source = load_onnx(str(src))
    rewritten = load_onnx(str(out / "gpt2.ort-all.onnx"))  # the saved file carries the scopes
    saved = onnx.load(str(out / "gpt2.ort-all.onnx"), load_external_data=False).graph.node
    assert sum(any(p.key == "pkg.torch.onnx.name_scopes" for p in n.metadata_props) for n in saved) > len(saved) // 2
    prov = provenance(source, rewritten)
    by_name = {n.name: n for n in source.nodes}
    # onnxruntime names its fused nodes "<source>/<fusion>": that source node is theirs, by name
    gemm = rewritten.node("node_MatMul_42/MatMulAddFusion")
    assert "node_MatMul_42" in prov.members[gemm.name] and gemm.scope == "layers.0.mlp.fc_in" and gemm.layer == 0
    for node in rewritten.nodes:
        members = [by_name[m] for m in prov.members[node.name]]
        if members:  # the common module of the source nodes it came from
            assert node.scope == common_scope([m.scope for m in members]), node.name
            layers = {m.layer for m in members}
            if len(layers) == 1 and node.scope:
                assert node.layer == layers.pop(), node.name
    for i in (0, 1):  # every block's nodes are tagged with their layer, inserted Reshapes too
        before = sum(1 for n in source.nodes if n.layer == i)
        after = [n for n in rewritten.nodes if n.layer == i]
        assert len(after) >= before - 3 and all(n.scope.startswith(f"layers.{i}") for n in after)
    reshapes = [n for n in rewritten.nodes if n.name.startswith("gemm_input_reshape")]
    assert reshapes and all(n.scope and n.layer is not None for n in reshapes)
    # RDU O1: a section per module, as in the source (onnxruntime folded the position embedding
    # and fused the last residual Add into the final norm: two fewer), not a handful
    base, opt = _report(out, "none", "rdu"), _report(out, "ort-all", "rdu")
    assert len(opt["units"]) >= len(base["units"]) - 3 > 8
    roles = {r["role"] for r in opt["roles"]}
    assert "overhead: section_reconfig" in roles and any(r.startswith("overhead: host") for r in roles)


def test_lost_scopes_collapse_sections(study, tmp_path):
    """What the study guards against: the same optimised file without its scopes."""
    _, out, _ = study
    model = onnx.load(str(out / "gpt2.ort-all.onnx"))
    for node in model.graph.node:
        del node.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(model, bare)
    assert main(["profile", str(bare), "--target", "rdu", "--json", str(tmp_path / "bare.json"), "--quiet"]) == 0
    lost = json.loads((tmp_path / "bare.json").read_text())
    assert len(lost["units"]) < len(_report(out, "ort-all", "rdu")["units"]) // 2


def test_speedup_is_split_into_node_time_and_overhead_rows(study):
    _, out, doc = study
    validate_study(doc)
    runs = dict(zip(["rdu", "h100"], doc["runs"], strict=True))  # in the order of the targets
    assert [r["target"] for r in doc["runs"]] == ["sn30", "h100"]
    for target, run in runs.items():
        t, split = run["totals"], run["split"]
        before, after = _report(out, "none", target), _report(out, "ort-all", target)
        # the parts of each side add up to its step time
        assert sum(p["before_s"] for p in split) == pytest.approx(t["time_before_s"], rel=1e-12)
        assert sum(p["after_s"] for p in split) == pytest.approx(t["time_after_s"], rel=1e-12)
        assert sum(p["delta_s"] for p in split) == pytest.approx(t["time_after_s"] - t["time_before_s"], rel=1e-9)
        nodes = next(p for p in split if p["kind"] == "nodes")
        assert nodes["before_s"] == pytest.approx(sum(n["time_s"] for n in before["nodes"]), rel=1e-12)
        assert nodes["after_s"] == pytest.approx(sum(n["time_s"] for n in after["nodes"]), rel=1e-12)
        # ... and the node part is the node rows of the diff, every source node counted once
        assert nodes["before_s"] == pytest.approx(sum(r["time_before_s"] or 0 for r in run["nodes"]), rel=1e-9)
        assert nodes["after_s"] == pytest.approx(sum(r["time_after_s"] or 0 for r in run["nodes"]), rel=1e-9)
        rows = {p["part"]: p for p in split if p["kind"] == "overhead"}
        assert set(rows) == set(before["overheads"]) | set(after["overheads"])
        for name, p in rows.items():
            assert (p["before_s"], p["after_s"]) == (
                before["overheads"].get(name, 0.0),
                after["overheads"].get(name, 0.0),
            )
        assert (
            t["speedup_total"] == pytest.approx(t["time_before_s"] / t["time_after_s"]) == pytest.approx(t["speedup"])
        )
        assert t["speedup_nodes"] == pytest.approx(nodes["before_s"] / nodes["after_s"])
        assert sum(p["change_share"] for p in split) == pytest.approx(1.0)
    rdu = runs["rdu"]
    parts = {p["part"] for p in rdu["split"]}
    assert "section_reconfig" in parts and any(p.startswith("host") for p in parts)  # inference: an estimate, so named
    assert rdu["totals"]["speedup_overheads"] == pytest.approx(
        rdu["totals"]["overhead_time_before_s"] / rdu["totals"]["overhead_time_after_s"]
    )
    assert rdu["totals"]["speedup_total"] < 2  # bookkeeping no longer reads as a speedup
    h100 = runs["h100"]  # the GPU's one overhead row: the time it waits for the host to issue kernels
    assert {p["part"] for p in h100["split"] if p["kind"] == "overhead"} == {"host_issue"}
    assert h100["totals"]["speedup_overheads"] == pytest.approx(
        h100["totals"]["overhead_time_before_s"] / h100["totals"]["overhead_time_after_s"]
    )
    text = render_study(doc)
    assert "overhead: host" in text and "node time x" in text and "step (total)" in text


def test_diff_shows_the_split(study, tmp_path, capsys):
    _, out, doc = study
    a, b = out / "gpt2.none.rdu.json", out / "gpt2.ort-all.rdu.json"
    argv = ["diff", str(a), str(b), *report_flags(tmp_path / "d")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "overhead: host" in text and "(overhead)" in text and "speedup alone" in text
    run = json.loads((tmp_path / "d.json").read_text())["runs"][0]
    rdu = doc["runs"][0]
    assert run["split"] == rdu["split"] and run["totals"]["speedup_nodes"] == rdu["totals"]["speedup_nodes"]
    csv = (tmp_path / "d.csv").read_text()
    assert "overhead: host" in csv and ",overhead," in csv
    assert "Speedup split" in (tmp_path / "d.html").read_text()


def test_split_residual_when_node_times_overlap():
    """A step shorter than its node times (pipelined): the residual makes the parts add up."""

    def rep(nodes, overheads, total):
        return {
            "nodes": [{"name": f"n{i}", "op_type": "Add", "time_s": t} for i, t in enumerate(nodes)],
            "overheads": overheads,
            "totals": {"time_s": total},
        }

    d = diff_reports(rep([3.0, 3.0], {"fill_drain": 1.0}, 4.0), rep([2.0, 2.0], {}, 2.0))
    parts = {p["part"]: p for p in d["split"]}
    assert parts["nodes"]["before_s"] == 6.0 and parts["fill_drain"]["after_s"] == 0.0
    assert (parts["step_residual"]["before_s"], parts["step_residual"]["after_s"]) == (-3.0, -2.0)
    assert sum(p["before_s"] for p in d["split"]) == 4.0 and sum(p["after_s"] for p in d["split"]) == 2.0
    # overlapping node times are no stretch of the step: no node-time speedup (1.5x before), no shares
    assert d["totals"]["speedup_total"] == 2.0 and d["totals"]["speedup_nodes"] is None
    assert d["totals"]["node_times_overlap"] and all(p["change_share"] is None for p in d["split"])
    assert parts["fill_drain"]["speedup_alone"] == pytest.approx(4 / 3)


def test_a_step_that_barely_moves_gives_its_parts_no_share_of_the_change():
    """Parts that move 301 us against each other in a step that moves 427 ns had shares of 70,611 %:
    under 1 % of the step (`SHARED_CHANGE_MIN`) a change has no shares; at 1 % and more it has."""

    def rep(nodes, residual_step):
        return {
            "nodes": [{"name": "n", "op_type": "Add", "time_s": nodes}],
            "overheads": {},
            "totals": {"time_s": residual_step},
        }

    still = diff_reports(rep(2.23e-3, 138e-6), rep(1.92e-3, 138e-6 - 427e-9))
    assert all(p["change_share"] is None for p in still["split"])
    # node times that add up to less than the step (a positive residual): a move of 1 % has shares
    moved = diff_reports(rep(100e-6, 138e-6), rep(90e-6, 130e-6))
    assert sum(p["change_share"] for p in moved["split"]) == pytest.approx(1.0)
    # node times that overlap (2.23 ms in a 138 us step, a pipelined WSE): no shares at all, since
    # the review of WSE splits (they summed to 100 % of an 8 us move here before)
    overlapping = diff_reports(rep(2.23e-3, 138e-6), rep(1.92e-3, 130e-6))
    assert all(p["change_share"] is None for p in overlapping["split"])


def test_torchs_placeholder_for_a_missing_module_stack_is_no_module():
    """torch writes ``_empty_nn_module_stack_from_metadata_hook`` as the module of a node whose module
    stack a model's hooks dropped (HF models): read as no module, never shown as a role of that name."""
    from onnx import TensorProto, helper

    placeholder = "_empty_nn_module_stack_from_metadata_hook"
    nodes = []
    for name, scopes in (("a", [placeholder, "linear"]), ("b", ["layers.0", placeholder, "linear"])):
        node = helper.make_node("Relu", ["x"], [f"y_{name}"], name=name)
        prop = node.metadata_props.add()
        prop.key, prop.value = "pkg.torch.onnx.name_scopes", str(scopes)
        nodes.append(node)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    outs = [helper.make_tensor_value_info(f"y_{n}", TensorProto.FLOAT, [4]) for n in "ab"]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 17)])
    graph = load_onnx(model)
    assert [n.scope for n in graph.nodes] == ["", "layers.0"]
