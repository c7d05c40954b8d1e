"""Defects a cold review of `study`, `diff` and `compare` found: each test fails without its fix."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dabench_ir.cli import main
from dabench_ir.frontends.onnx import load_onnx
from dabench_ir.models import ModelConfig, export_model
from dabench_ir.options import ProfileOptions
from dabench_ir.passes.meta import MODEL_WEIGHTS
from dabench_ir.study import OnnxRewritePass, Pipeline, diff_reports, register_pipeline, run_study
from dabench_ir.study.render import render_study

pytest.importorskip("onnxruntime")

_GPT2 = {"family": "gpt2", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 96}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 (2 layers, width 64, vocab 96) with seeded weights in the file: 107,264 parameters."""
    path = tmp_path_factory.mktemp("review") / "gpt2.onnx"
    export_model(ModelConfig(**_GPT2), path, weights="random")
    return path


def _by_pipeline(doc):
    return {run["pipeline"]: run for run in doc["runs"]}


def test_weights_onnxruntime_folds_stay_parameters(gpt2, tmp_path):
    """onnxruntime saves each transposed weight under a new name (``val_19``) the model's
    ``dabench.weights`` did not list, so the loader made it a constant: under ``--mode train`` ort-all
    read FLOPs -39.3% (no weight gradients, Adam over 1,792 parameters) and ``model.params`` went
    107,264 -> 1,792. Now every folded weight is declared: 107,264 both sides, FLOPs within 0.2 %."""
    doc = run_study(gpt2, ["ort-all"], [], ProfileOptions(mode="train"), out_dir=tmp_path)
    before = json.loads((tmp_path / "gpt2.none.cost.json").read_text())
    after = json.loads((tmp_path / "gpt2.ort-all.cost.json").read_text())
    assert before["model"]["params"] == after["model"]["params"] == 107_264  # was 1,792 after
    t = doc["runs"][0]["totals"]
    assert t["flops_after"] == pytest.approx(t["flops_before"], rel=2e-3)  # was -39.3 %
    saved = onnx.load(str(tmp_path / "gpt2.ort-all.onnx"), load_external_data=False)
    declared = json.loads({p.key: p.value for p in saved.metadata_props}[MODEL_WEIGHTS])
    assert {"val_19", "layers.1/val_19", "embedding_1"} <= set(declared)  # Transpose(k_proj), Gather(pos_embed)
    assert load_onnx(str(tmp_path / "gpt2.ort-all.onnx")).num_params == 107_264


def _mlp_declared(path) -> str:
    """x[4,64] -> MatMul W1 -> Add b1 -> Relu -> MatMul W2, its parameters listed in ``dabench.weights``."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("W1", (64, 64)), ("b1", (64,)), ("W2", (64, 32)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node("Relu", ["hb"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "W2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    helper.set_model_props(model, {MODEL_WEIGHTS: json.dumps(["W1", "b1", "W2"])})
    onnx.save(model, path)
    return str(path)


def _rename_w2(model, _workdir):
    """A rewrite that stores W2 under a name its source never had: the loader makes it a constant."""
    for init in model.graph.initializer:
        if init.name == "W2":
            init.name = "W2_moved"
    for node in model.graph.node:
        node.input[:] = ["W2_moved" if i == "W2" else i for i in node.input]
    return model


def test_a_rewrite_that_loses_parameters_gets_no_speedup(tmp_path):
    """Parameters are conserved by a rewrite that does not quantise; one that loses 2,048 of 6,208
    (W2 renamed, loaded as a constant) printed its training speedup as any other, the lost weight's
    gradient and update gone. Now a training run has none, and says why; an inference run computes the
    same from a constant, so it keeps its speedup and says what changed."""
    register_pipeline(
        Pipeline("test-rename-w2", "W2 renamed", lambda out: [OnnxRewritePass("test-rename-w2", _rename_w2, out)]),
        replace=True,
    )
    model = _mlp_declared(tmp_path / "m.onnx")
    runs = _by_pipeline(run_study(model, ["test-rename-w2", "ort-basic"], ["rdu"], ProfileOptions(mode="train")))
    lost = runs["test-rename-w2"]
    assert lost["totals"]["speedup"] is None and lost["totals"]["speedup_total"] is None
    assert any(
        w.startswith("no speedup: parameters changed: 6,208 before, 4,160 after") and "(W2)" in w
        for w in lost["warnings"]
    )
    kept = runs["ort-basic"]  # its Gemm keeps W1, b1 and W2: the speedup stands
    assert kept["totals"]["speedup"] is not None and not kept["warnings"]
    inference = _by_pipeline(run_study(model, ["test-rename-w2"], ["rdu"]))["test-rename-w2"]
    assert inference["totals"]["speedup"] is not None
    assert any(w.startswith("parameters changed: 6,208 before, 4,160 after") for w in inference["warnings"])


def test_compiled_seq_study_rewrites_at_the_padded_length(tmp_path):
    """``--compiled-seq 64`` on a dynamic model failed every rewrite pipeline ("pads the model's symbolic
    sequence length; this model's is fixed as exported"): the rewrite binds the padded length, then the
    option was applied to the static result again. Now ort-all runs and costs the same 64-token step."""
    src = tmp_path / "g2dyn.onnx"
    export_model(ModelConfig(**{**_GPT2, "seq": 128}), src, weights="random", dynamic=True)  # 128 positions
    doc = run_study(src, ["ort-all"], ["rdu"], ProfileOptions(seq=32, batch=2, compiled_seq=64))
    assert doc["failed"] == []  # was: ort-all failed
    (run,) = doc["runs"]
    assert run["totals"]["flops_before"] == run["totals"]["flops_after"] == 32_393_728


def test_cost_only_reports_diff_and_compare(gpt2, tmp_path, capsys):
    """A report written without a target (``study -o`` without ``--target``, ``profile --json``) was
    refused by diff and compare ("target has no 'name'"): exit 2. Now both compare FLOPs and bytes and
    say there are no times."""
    out = tmp_path / "s"
    run_study(gpt2, ["ort-all"], [], out_dir=out)
    a, b = out / "gpt2.none.cost.json", out / "gpt2.ort-all.cost.json"
    assert main(["diff", str(a), str(b)]) == 0  # was 2
    text = capsys.readouterr().out
    assert "gpt2@cost-only pipeline=ort-all" in text and f"{a}: cost only (written without --target)" in text
    assert "no times to compare" in text
    assert main(["compare", str(a), str(a)]) == 0  # was 2
    text = capsys.readouterr().out
    assert "gpt2@cost-only: cost only (written without --target): 3.61 MFLOP" in text


def _report(node_times, overheads, step):
    return {
        "nodes": [{"name": f"n{i}", "op_type": "Add", "time_s": t} for i, t in enumerate(node_times)],
        "overheads": overheads,
        "totals": {"time_s": step},
    }


def test_overlapping_node_times_give_no_shares_and_new_overheads_show_as_such():
    """A pipelined WSE step's node times overlap (their sum is not the step): the split printed
    "share of change 13945.9%" for nodes, -13845.9 % for the residual and "node time x 1.23x" beside a
    1.02x step; wse-streaming printed "overheads x -" for overheads 0 -> 13.4 ms. Now no part has a
    share, node time no speedup of its own ("overlap"), and the overheads read "0 -> 13.4 ms"."""
    d = diff_reports(_report([246e-6, 100e-6], {}, 20.4e-6), _report([200e-6, 81e-6], {}, 20e-6))
    assert d["totals"]["node_times_overlap"] is True
    assert d["totals"]["speedup_nodes"] is None  # was 1.23x
    assert d["totals"]["speedup_total"] == pytest.approx(1.02)
    assert all(p["change_share"] is None for p in d["split"])  # was 13,945.9 % / -13,845.9 %
    assert all(p["speedup_alone"] is None for p in d["split"] if p["kind"] != "overhead")
    streaming = diff_reports(_report([319e-6], {}, 20e-6), _report([2.68e-9], {"layer_switch": 13.4e-3}, 13.4e-3))
    assert streaming["totals"]["speedup_overheads"] is None and streaming["totals"]["speedup_nodes"] is None
    switch = next(p for p in streaming["split"] if p["part"] == "layer_switch")
    assert switch["speedup_alone"] == pytest.approx(20e-6 / (20e-6 + 13.4e-3))  # an overhead adds to the step
    doc = {
        "model": "m",
        "runs": [{"label": "m@wse2 streaming", "baseline_label": "m@wse2", "warnings": [], **streaming}],
    }
    for run in doc["runs"]:
        run["totals"].update({"flops_before": 1, "flops_after": 1, "bytes_before": 1, "bytes_after": 1})
    text = render_study(doc)
    row = next(line for line in text.splitlines() if line.startswith("m@wse2 streaming"))
    assert "overlap" in row and "0 -> 13.4 ms" in row  # was "118702.51x" and "-"
    assert "node times overlap" in text


def test_a_fusion_that_changes_the_gelu_says_so(gpt2):
    """onnxruntime's transformers optimizer fuses Gelu(approximate="tanh") and its bias into
    com.microsoft::BiasGelu, the exact (erf) GELU: the study counted it as a fusion. Now the run's
    warnings and the node's row say the function changed."""
    doc = run_study(gpt2, ["ort-transformers"], [])
    (run,) = doc["runs"]
    changed = [w for w in run["warnings"] if w.startswith("function changed:")]
    assert len(changed) == 2 and all("BiasGelu" in w and "tanh-approximated" in w for w in changed)
    rows = [r for r in run["nodes"] if r["op"] == "com.microsoft::BiasGelu"]
    assert len(rows) == 2 and all("function changed" in (r["note"] or "") for r in rows)
    assert not [w for w in run["warnings"] if w.startswith("no speedup")]
