"""Studies: provenance of rewritten nodes, the per-node/per-module diff, pipelines, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dabench_ir.cli import main
from dabench_ir.frontends.onnx import load_onnx
from dabench_ir.report.compare import compare_reports, estimated_warnings
from dabench_ir.study import (
    OnnxRewritePass,
    Pipeline,
    diff_reports,
    name_provenance,
    provenance,
    register_pipeline,
    run_study,
)
from dabench_ir.study.render import validate_study
from tests.conftest import report_flags

F = TensorProto.FLOAT


def _mlp(path, *, relu_op: str = "Relu", domain: str = "") -> str:
    """x[4,64] -> MatMul W1 -> Add b1 -> Relu -> MatMul W2: onnxruntime fuses MatMul+Add into Gemm."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "W2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node(relu_op, ["hb"], ["a"], name="act", domain=domain),
        helper.make_node("MatMul", ["a", "W2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", F, [4, 64])],
        [helper.make_tensor_value_info("y", F, [4, 32])],
        inits,
        value_info=[helper.make_tensor_value_info("a", F, [4, 64])],
    )
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return str(path)


def _fused(path) -> str:
    """The same MLP with fc1 and its bias fused into one Gemm (renamed), as an optimiser writes it."""
    model = onnx.load(path)
    g = model.graph
    gemm = helper.make_node("Gemm", ["x", "W1", "b1"], ["hb"], name="fused_gemm")
    keep = [n for n in g.node if n.name not in ("fc1", "fc1_bias")]
    del g.node[:]
    g.node.extend([gemm, *keep])
    out = str(path).replace(".onnx", ".fused.onnx")
    onnx.save(model, out)
    return out


def test_provenance_by_names_and_subgraph(tmp_path):
    src = _mlp(tmp_path / "m.onnx")
    before, after = load_onnx(src), load_onnx(_fused(src))
    prov = provenance(before, after)
    assert prov.members == {"fused_gemm": ["fc1", "fc1_bias"], "act": ["act"], "fc2": ["fc2"]}
    assert prov.method == {"act": "names", "fc2": "names", "fc1_bias": "subgraph", "fc1": "subgraph"}


def test_provenance_through_renamed_tensors_joins_a_neighbour(tmp_path):
    src = _mlp(tmp_path / "m.onnx")
    model = onnx.load(_fused(src))
    g = model.graph
    g.node[0].output[0] = "renamed"  # the rewrite renamed the fused node's output
    g.node[1].input[0] = "renamed"
    onnx.save(model, tmp_path / "r.onnx")
    prov = provenance(load_onnx(src), load_onnx(str(tmp_path / "r.onnx")))
    # fc1 and its bias are claimed by no walk; they join the group of a neighbour... none is new but
    # the Gemm, which is in their module (no scopes here: the module outside), so "scope" holds them
    assert sorted(prov.members["fused_gemm"]) == ["fc1", "fc1_bias"]
    assert {prov.method["fc1"], prov.method["fc1_bias"]} <= {"neighbour", "scope"}


def test_a_layout_node_after_a_gemm_hands_the_work_it_claims_to_the_gemm(tmp_path):
    """MatMulAddFusion on 3-D input writes Reshape -> Gemm -> Reshape, the last keeping the original
    output's name: the walk from it claimed the bias Add for the Reshape (credited with removing it),
    and the Gemm's FLOPs were not the sum of what it replaced. The Gemm holds what it absorbed."""
    src = _mlp(tmp_path / "m.onnx")
    model = onnx.load(src)
    g = model.graph
    nodes = [
        helper.make_node("Reshape", ["x", "shape_in"], ["x2"], name="gemm_input_reshape"),
        helper.make_node("Gemm", ["x2", "W1", "b1"], ["g"], name="fc1/MatMulAddFusion"),
        helper.make_node("Reshape", ["g", "shape_out"], ["hb"], name="gemm_output_reshape"),
    ]
    keep = [n for n in g.node if n.name not in ("fc1", "fc1_bias")]
    del g.node[:]
    g.node.extend([*nodes, *keep])
    for name in ("shape_in", "shape_out"):
        g.initializer.append(numpy_helper.from_array(np.array([4, 64], np.int64), name))
    onnx.save(model, tmp_path / "r.onnx")
    prov = provenance(load_onnx(src), load_onnx(str(tmp_path / "r.onnx")))
    assert sorted(prov.members["fc1/MatMulAddFusion"]) == ["fc1", "fc1_bias"]
    assert prov.members["gemm_output_reshape"] == []


def _report(nodes, time_s, **totals):
    return {"nodes": nodes, "totals": {"time_s": time_s, "flops": sum(n["flops"] for n in nodes), "bytes": 0, **totals}}


def _node(name, op, flops, time_s, bound, scope="layers.0.mlp"):
    return {
        "name": name,
        "op_type": op,
        "flops": flops,
        "bytes": 10,
        "time_s": time_s,
        "bound": bound,
        "scope": scope,
        "layer": 0,
        "op_class": "contraction",
    }


def test_each_side_of_a_module_table_is_its_own_nodes_where_they_are():
    """A fusion across modules (an MLP's matmul with the norm before it) must not move the baseline's
    cost between modules: the 'before' column is the baseline's own breakdown whatever the pipeline
    (it went to the fused node's first source's module), the 'after' column the new nodes' scopes."""
    from dabench_ir.study.provenance import Provenance

    before = _report(
        [
            _node("norm", "LayerNormalization", 8, 1e-6, "memory", scope="layers.0.mlp_norm"),
            _node("fc1", "MatMul", 100, 3e-6, "compute", scope="layers.0.mlp"),
            _node("head", "MatMul", 50, 1e-6, "compute", scope="lm_head"),
        ],
        5e-6,
    )
    fused = _node("fused", "MatMul", 108, 3e-6, "compute", scope="layers.0")
    after = _report([fused, _node("head", "MatMul", 50, 1e-6, "compute", scope="lm_head")], 4e-6)
    for first in (["norm", "fc1"], ["fc1", "norm"]):  # two pipelines' provenance, the sources in either order
        prov = Provenance({"fused": first, "head": ["head"]}, {"norm": "subgraph", "fc1": "subgraph"})
        modules = {m["module"]: m for m in diff_reports(before, after, prov)["modules"]}
        befores = {name: (m["nodes_before"], m["flops_before"]) for name, m in modules.items() if m["nodes_before"]}
        assert befores == {"layers.0.mlp_norm": (1, 8), "layers.0.mlp": (1, 100), "lm_head": (1, 50)}
        assert modules["layers.0"]["nodes_after"] == 1 and modules["layers.0"]["flops_after"] == 108


def test_diff_accounts_for_every_source_node():
    before = _report(
        [
            _node("fc1", "MatMul", 100, 3e-6, "compute"),
            _node("fc1_bias", "Add", 4, 1e-6, "memory"),
            _node("act", "Relu", 4, 1e-6, "memory"),
            _node("cast", "Cast", 0, 0.5e-6, "memory", scope="embed"),
        ],
        5.5e-6,
    )
    after = _report([_node("fused_gemm", "Gemm", 104, 2e-6, "compute"), _node("act", "Relu", 4, 1e-6, "memory")], 3e-6)
    diff = diff_reports(before, after, name_provenance(before["nodes"], after["nodes"]))
    rows = {r["node"]: r for r in diff["nodes"]}
    gemm = rows["fused_gemm"]
    assert (
        gemm["status"] == "fused"
        and sorted(gemm["replaces"]) == ["fc1", "fc1_bias"]
        and gemm["provenance"] == ["scope"]
    )
    assert (gemm["flops_before"], gemm["flops_after"]) == (104, 104)
    assert gemm["time_before_s"] == pytest.approx(4e-6) and gemm["bound_before"] == "compute"
    assert rows["act"]["status"] == "kept"
    gone = rows[None]
    assert gone["status"] == "removed" and gone["replaces"] == ["cast"] and gone["time_after_s"] == 0.0
    t = diff["totals"]
    assert t["source_nodes_accounted"] == t["nodes_before"] == 4
    assert t["speedup"] == pytest.approx(5.5 / 3) and (t["nodes_fused"], t["nodes_removed"]) == (1, 1)
    mlp = next(m for m in diff["modules"] if m["module"] == "layers.0.mlp")
    assert (mlp["nodes_before"], mlp["nodes_after"]) == (3, 2)
    assert mlp["time_before_s"] == pytest.approx(5e-6) and mlp["time_after_s"] == pytest.approx(3e-6)


def test_study_on_onnxruntime_levels_and_rdu_opt_levels(tmp_path):
    src = _mlp(tmp_path / "m.onnx")
    doc = run_study(src, ["ort-basic", "rdu-O0"], ["rdu"], out_dir=tmp_path / "out")
    validate_study(doc)
    by = {r["pipeline"]: r for r in doc["runs"]}
    ort = by["ort-basic"]
    assert ort["totals"]["source_nodes_accounted"] == ort["totals"]["nodes_before"] == 4
    fused = [r for r in ort["nodes"] if r["status"] == "fused"]
    assert len(fused) == 1 and fused[0]["op"] == "Gemm" and sorted(fused[0]["replaces"]) == ["fc1", "fc1_bias"]
    assert fused[0]["flops_before"] == fused[0]["flops_after"]
    o0 = by["rdu-O0"]
    assert o0["config"]["opt_level"] == "O0" and "O0" in o0["label"] and "O1" in o0["baseline_label"]
    assert all(r["status"] == "kept" for r in o0["nodes"])
    # the report files written beside the study diff the same way
    again = json.loads(
        json.dumps(
            diff_reports(
                json.loads((tmp_path / "out" / "m.none.rdu.json").read_text()),
                json.loads((tmp_path / "out" / "m.ort-basic.rdu.json").read_text()),
            )
        )
    )
    assert again["totals"] == ort["totals"]


def test_a_registered_pipeline_runs_in_a_study(tmp_path):
    def relu_to_sigmoid(model, _workdir):
        for node in model.graph.node:
            if node.op_type == "Relu":
                node.op_type, node.name = "Sigmoid", "act_sigmoid"
        return model

    register_pipeline(
        Pipeline(
            "test-sigmoid", "Relu -> Sigmoid", lambda out: [OnnxRewritePass("test-sigmoid", relu_to_sigmoid, out)]
        ),
        replace=True,
    )
    doc = run_study(_mlp(tmp_path / "m.onnx"), ["test-sigmoid"], [])
    rows = {r["node"]: r for r in doc["runs"][0]["nodes"]}
    assert rows["act_sigmoid"]["replaces"] == ["act"] and rows["act_sigmoid"]["status"] == "replaced"
    assert rows["act_sigmoid"]["flops_after"] == 3 * 4 * 64 and rows["act_sigmoid"]["flops_before"] == 4 * 64


def test_cli_study_and_diff(tmp_path, capsys):
    src = _mlp(tmp_path / "m.onnx")
    out = tmp_path / "s"
    argv = ["study", src, "--pipeline", "ort-basic", "--target", "rdu", "-o", str(tmp_path / "o"), *report_flags(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "m@sn30 pipeline=ort-basic" in text and "fused" in text and "Gemm" in text
    validate_study(json.loads((tmp_path / "s.json").read_text()))
    assert (tmp_path / "s.csv").read_text().splitlines()[0].startswith("pipeline,target,label,node,op,status")
    assert '<table class="sortable">' in (tmp_path / "s.html").read_text()
    a, b = tmp_path / "o" / "m.none.rdu.json", tmp_path / "o" / "m.ort-basic.rdu.json"
    assert main(["diff", str(a), str(b), "--json", str(tmp_path / "d.json")]) == 0
    assert "fused" in capsys.readouterr().out
    assert main(["study", src, "--pipeline", "nope"]) == 2
    assert "unknown pipeline" in capsys.readouterr().err
    assert main(["study", src, "--pipeline", "none"]) == 2  # the baseline alone: an empty table, exit 0 before
    assert "to compare with the baseline" in capsys.readouterr().err


def test_a_study_on_a_target_file_names_its_reports_by_the_files_stem(tmp_path, capsys):
    """``--target dir/my.toml`` put the path's folders into a report's file name (exit 2: "folder
    .../g.none.dir does not exist")."""
    from pathlib import Path

    chip = tmp_path / "chips" / "my-h100.toml"
    chip.parent.mkdir()
    chip.write_text((Path(__file__).resolve().parents[1] / "targets" / "h100.toml").read_text())
    argv = ["study", _mlp(tmp_path / "m.onnx"), "--pipeline", "ort-basic", "--target", str(chip)]
    assert main([*argv, "-o", str(tmp_path / "o"), "-q"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "o").glob("*.json")) == [
        "m.none.my-h100.json",
        "m.ort-basic.my-h100.json",
    ]


def test_estimated_nodes_warn_and_strict_exits_2(tmp_path, capsys):
    src = _mlp(tmp_path / "m.onnx", relu_op="Frobnicate", domain="com.example")
    assert main(["profile", src, "--target", "ipu", "--json", str(tmp_path / "a.json"), "--quiet"]) == 0
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["totals"]["estimated_nodes"] == 1 and data["totals"]["estimated_time_share"] > 0
    assert data["extra"]["estimated"][0]["op_type"] == "com.example::Frobnicate"
    assert any("estimated: no rule" in (n["note"] or "") for n in data["nodes"])
    rows = compare_reports([data])
    assert "com.example::Frobnicate" in estimated_warnings(rows)[0]
    assert main(["compare", str(tmp_path / "a.json"), "--quiet"]) == 0
    assert "without a cost rule" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a.json"), "--quiet", "--strict"]) == 2
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--quiet", "--strict"]) == 2


def test_compare_labels_say_what_differs(tmp_path):
    src = _mlp(tmp_path / "m.onnx")
    for level in ("O0", "O3"):
        assert (
            main(
                [
                    "profile",
                    src,
                    "--target",
                    "rdu",
                    "--opt-level",
                    level,
                    "--json",
                    str(tmp_path / f"{level}.json"),
                    "--quiet",
                ]
            )
            == 0
        )
    rows = compare_reports([json.loads((tmp_path / f"{lv}.json").read_text()) for lv in ("O0", "O3")])
    assert [r["label"] for r in rows] == ["m@sn30 O0", "m@sn30 O3"]
    assert [r["opt_level"] for r in rows] == ["O0", "O3"] and rows[0]["wse_mode"] is None
    assert (
        rows[0]["pipeline"] == "none" and rows[0]["mode"] == "inference" and rows[0]["batch"] == 1
    )  # x[4,64]: one sample


def test_a_diff_uses_bs_recorded_provenance_only_against_the_baseline_it_was_made_from():
    """`diff A B` where B's study recorded its provenance against another baseline: matched by names
    instead (B's record claimed A's nodes were all removed and B's all added)."""
    base = _report([_node("fc1", "MatMul", 100, 3e-6, "compute"), _node("act", "Relu", 4, 1e-6, "memory")], 4e-6)
    other = _report([_node("gemm", "Gemm", 100, 2e-6, "compute"), _node("act", "Relu", 4, 1e-6, "memory")], 3e-6)
    record = {"members": {"gemm": ["fc1"], "act": ["act"]}, "method": {"fc1": "subgraph", "act": "names"}}
    b = {**other, "extra": {"provenance": record}}
    rows = {r["node"]: r for r in diff_reports(base, b)["nodes"]}
    assert rows["gemm"]["replaces"] == ["fc1"]  # B's own baseline: its record is used
    stranger = _report(
        [_node("mha", "MultiHeadAttention", 90, 2e-6, "compute"), _node("act", "Relu", 4, 1e-6, "memory")], 3e-6
    )
    rows = {r["node"]: r for r in diff_reports(stranger, b)["nodes"]}
    assert rows["act"]["status"] == "kept"  # matched by names, not by a record of another baseline
    assert rows["gemm"]["replaces"] == ["mha"]  # by names and scopes: the matmul of the same module
