"""Grouped attribution: roles, overhead rows, representative layer, collapsed layers, why, traces."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dabench_ir.advice import advise, candidate_knobs
from dabench_ir.options import KNOBS, ProfileOptions
from dabench_ir.pipeline import profile_graph
from dabench_ir.report.attribution import layer_runs, representative_layer, role_rows
from dabench_ir.report.roles import general_scope, node_roles
from dabench_ir.report.table import render_table
from dabench_ir.report.trace import chrome_trace_events, track_count, validate_trace, write_report_trace
from dabench_ir.report.why import explain
from tests.conftest import analyze_text
from tests.lowering_graphs import decoder


def test_general_scope():
    assert general_scope("layers.31.mlp.down_proj") == "layers.*.mlp.down_proj"
    assert general_scope("model.layers.0.self_attn") == "model.layers.*.self_attn"
    assert general_scope("h.3.attn") == "h.*.attn"
    assert general_scope("lm_head") == "lm_head"


def test_roles_from_scopes():
    roles = node_roles(decoder(layers=3))
    counts: dict[str, int] = {}
    for r in roles.values():
        counts[r] = counts.get(r, 0) + 1
    assert counts == {
        "layers.*.ln1": 3,
        "layers.*.attn.q_proj": 3,
        "layers.*.attn.k_proj": 3,
        "layers.*.attn.v_proj": 3,
        "layers.*.attn: attention scores": 3,
        "layers.*.attn: softmax": 3,
        "layers.*.attn: attention values": 3,
        "layers.*.attn.o_proj": 3,
        "layers.*: residual adds": 6,
        "layers.*.ln2": 3,
        "layers.*.mlp.fc1": 3,
        "layers.*.mlp: activation": 3,
        "layers.*.mlp.fc2": 3,
    }


def test_roles_without_scopes_from_op_patterns():
    import onnx.helper as oh
    from onnx import TensorProto

    from dabench_ir.pipeline import analyze

    w = "model.layers.0.q_proj.weight"  # a foreign export: no scopes, but the weight names its module
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", w], ["q"]),
            oh.make_node("Transpose", ["q"], ["kt"], perm=[0, 2, 1]),
            oh.make_node("MatMul", ["q", "kt"], ["s"]),
            oh.make_node("Softmax", ["s"], ["p"]),
            oh.make_node("MatMul", ["p", "q"], ["a"]),
            oh.make_node("Add", ["a", "x"], ["r"]),
            oh.make_node("LayerNormalization", ["r", "g", "b"], ["y"]),
        ],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [
            oh.make_tensor(w, TensorProto.FLOAT, [16, 16], [0.0] * 256),
            oh.make_tensor("g", TensorProto.FLOAT, [16], [1.0] * 16),
            oh.make_tensor("b", TensorProto.FLOAT, [16], [0.0] * 16),
        ],
    )
    g = analyze(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    assert list(node_roles(g).values()) == [
        "model.layers.*.q_proj",  # a weight contraction, named after its weight
        "layout",
        "attention scores",
        "softmax",
        "attention values",
        "residual adds",
        "norms",
    ]


def test_fallback_is_op_type():
    g = analyze_text("""
    agraph (float[4] x, float[4] z) => (float[4] y) {
        y = Mod <fmod = 1> (x, z)
    }
    """)
    assert node_roles(g) == {g.nodes[0].name: "Mod"}


@pytest.fixture(scope="module")
def rdu_report():
    return profile_graph(decoder(layers=3), "rdu", ProfileOptions())


def test_role_rows_add_up_with_overhead_rows(rdu_report):
    r = rdu_report
    rows = role_rows(r)
    node_time = sum(n.time_s or 0.0 for n in r.nodes)
    overheads = r.timeline.overheads_s
    assert overheads  # several sections: reconfiguration between them
    assert sum(x["time_s"] for x in rows) == pytest.approx(node_time + sum(overheads.values()), rel=1e-12)
    over = [x for x in rows if x["role"].startswith("overhead: ")]
    assert {x["role"] for x in over} == {f"overhead: {k}" for k, v in overheads.items() if v}
    assert all(x["bound"] == "overhead" and x["nodes"] == 0 for x in over)
    assert sum(x["share"] for x in rows) == pytest.approx(1.0)
    q = next(x for x in rows if x["role"] == "layers.*.attn.q_proj")
    assert q["nodes"] == 3 and q["layers"] == 3
    assert q["flops"] == 3 * 2 * 16 * 64 * 64
    assert q["time_s"] == pytest.approx(sum(n.time_s for n in r.nodes if n.role == "layers.*.attn.q_proj"))
    d = r.to_dict()
    assert d["overheads"] == {k: v for k, v in overheads.items() if v}
    assert {x["role"] for x in d["roles"]} == {x["role"] for x in rows}
    assert all("role" in n for n in d["nodes"])


def test_layers_collapse_and_representative_layer(rdu_report):
    runs = layer_runs(rdu_report)
    assert [(x["layers"], x["count"]) for x in runs] == [("0-2", 3)]
    per_layer = sum(n.flops for n in rdu_report.nodes if n.layer == 0)
    assert runs[0]["flops"] == per_layer
    rep = {x["role"]: x for x in representative_layer(rdu_report)}
    assert len(rep) == 13 and rep["layers.*: residual adds"]["nodes_per_layer"] == 2
    q = rep["layers.*.attn.q_proj"]
    assert q["min_time_s"] == pytest.approx(q["max_time_s"]) and q["spread"] == pytest.approx(0.0, abs=1e-9)


def test_bound_class_overhead_in_table(rdu_report):
    text = render_table(rdu_report, color=False, width=200)
    assert "module roles by time" in text and "overhead: section_reconfig" in text
    bound_table = text.split("Time by bound class")[1]
    assert "overhead" in bound_table
    assert "0-2" in text and "x3" in text  # identical layers collapsed
    nodes = render_table(rdu_report, color=False, by="node")
    assert "layers.0.attn.q_proj" in nodes and "nodes by time" in nodes


def test_candidate_knobs_come_from_the_option_schema(rdu_report):
    pairs = candidate_knobs(rdu_report)
    expected = {n for n, k in KNOBS.items() if k.group == "target" and (k.targets is None or "rdu" in k.targets)}
    assert {k.name for k, _ in pairs} <= expected
    assert ("opt_level", "O3") in {(k.name, v) for k, v in pairs}
    assert ("opt_level", "O1") not in {(k.name, v) for k, v in pairs}  # the current value is not a candidate


def test_why_is_computed_by_replacing(rdu_report):
    from dabench_ir.advice import hold_estimates
    from dabench_ir.place import place
    from dabench_ir.run import execute

    if rdu_report.advice is None:
        assert explain(rdu_report) == []  # no advice runs: nothing to render
    advice = advise(rdu_report)
    assert rdu_report.advice is advice and advice.placements == len(candidate_knobs(rdu_report))
    lines = explain(rdu_report)
    assert len(lines) == 3 and rdu_report.why == lines
    first = next(x for x in lines if x["role"] == "overhead: section_reconfig")
    assert first["knob"] == "--opt-level" and "before each of" in first["resource"]
    _, timeline, _ = place(
        rdu_report.graph, rdu_report.target_obj, dataclasses.replace(rdu_report.options, opt_level=first["value"])
    )
    # an inference run's host cost is an estimate (fitted to training steps): the variant is
    # compared with it held at the report's own value (dabench_ir.advice.hold_estimates)
    label = "host (estimate: fitted to training steps)"
    held = rdu_report.timeline.overheads_s[label] - timeline.overheads_s[label]
    assert first["new_step_s"] == pytest.approx(timeline.step_time_s + held)
    assert first["new_time_s"] == pytest.approx(timeline.overheads_s.get("section_reconfig", 0.0))
    # the advice is the orchestration's run: the run with the knob changed, executed again, agrees
    trial = next(t for t in advice.trials if t.knob.name == "opt_level" and t.value == first["value"])
    assert trial.run.sources["opt_level"] == "user" and trial.run.options.opt_level == first["value"]
    again = execute(rdu_report.run.variant(opt_level=first["value"]), rdu_report.graph.clone())
    assert first["new_step_s"] == hold_estimates(rdu_report, again.timeline).step_time_s
    memory = next(x for x in explain(rdu_report, top=40) if x["bound"] == "memory")  # every role
    assert "ddr" in memory["resource"]
    assert first["text"] in [w["text"] for w in json.loads(rdu_report.to_json())["why"]]


@pytest.mark.parametrize("target", ["rdu", "wse", "ipu", "h100", "cpu"])
def test_trace_has_tens_of_tracks_for_many_layers(target):
    g = decoder(layers=32, hidden=64, seq=16)
    opts = ProfileOptions(ipus=4) if target == "ipu" else ProfileOptions()
    report = profile_graph(g, target, opts)
    events = chrome_trace_events(report.timeline, g, plan=report.plan, roles={n.name: n.role for n in report.nodes})
    doc = {"traceEvents": events}
    assert validate_trace(doc) == []
    # a wafer's regions pass their rows on as they make them, so a layer's regions run at once, each on
    # a track of the layer's (tens of tracks on the other targets)
    assert 1 <= track_count(events) < (10 * 32 if target == "wse" else 100)
    slices = [e for e in events if e["ph"] == "X" and e["cat"] not in ("unit", "overhead")]
    assert {e["name"] for e in slices} == {n.name for n in g.nodes}
    node_slice = next(e for e in slices if e["name"] == "layers.3.attn.q_proj")
    assert {"flops", "bytes", "bound", "role"} <= set(node_slice["args"])
    assert node_slice["args"]["role"] == "layers.*.attn.q_proj"
    over = [e for e in events if e["ph"] == "X" and e["cat"] == "overhead"]
    total = sum(v for v in report.timeline.overheads_s.values() if v)
    assert sum(e["dur"] for e in over) == pytest.approx(total * 1e6, rel=1e-9, abs=1e-6)


def test_validate_trace_catches_bad_events():
    bad = {
        "traceEvents": [
            {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
            {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10},  # overlaps a without nesting
            {"ph": "X", "name": "c", "pid": 1, "tid": 2, "ts": 0, "dur": -1},
            {"ph": "Q", "name": "d", "pid": 1, "tid": 1},
        ]
    }
    problems = validate_trace(bad)
    assert len(problems) == 3
    assert (
        validate_trace(
            {
                "traceEvents": [
                    {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                    {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
                ]
            }
        )
        == []
    )


def test_measured_trace_is_its_own_process(tiny_matmul_path, tmp_path):
    from dabench_ir.pipeline import profile

    report = profile(tiny_matmul_path, "cpu", measure=True, warmup=0, repeat=1)
    assert report.measured_timeline is not None
    doc = json.loads(write_report_trace(report, tmp_path / "t.json").read_text())
    assert validate_trace(doc) == []
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert "measured: host (onnxruntime)" in procs
    assert any(p.startswith("predicted: ") for p in procs)


def test_candidate_knobs_cover_switches_counts_and_fractions():
    report = profile_graph(decoder(layers=2), "ipu", ProfileOptions())
    pairs = {k.name: v for k, v in candidate_knobs(report)}
    default = report.options
    assert pairs["ipus"] == 2 * default.ipus
    assert pairs["matmul_proportion"] == tuple(p / 2 for p in default.matmul_proportion)
    assert "opt_level" not in pairs  # an RDU knob: the IPU lowering does not read it
    assert "replicated_tensor_sharding" not in pairs  # a training knob: this run is inference
    trained = profile_graph(decoder(layers=2), "ipu", ProfileOptions(mode="train"))
    switched = {k.name: v for k, v in candidate_knobs(trained)}
    assert switched["replicated_tensor_sharding"] is (not trained.options.replicated_tensor_sharding)


def test_the_verifier_checks_the_role_tables_the_json_writes_built_once():
    report = profile_graph(decoder(layers=3), "rdu")  # verified: the tables were built for the check
    tables = report.share_tables()
    assert report.share_tables() is tables and report.share_tables()[0] is tables[0]
    data = report.to_dict()
    assert data["roles"] == role_rows(report) == tables[0] and data["roles"] is not tables[0]
    assert data["representative_layer"] == representative_layer(report) == tables[1]
    data["roles"][0]["share"] = 2.0  # a caller's change to the JSON's rows reaches no other caller
    assert report.to_dict()["roles"] == role_rows(report)
    assert sum(r["share"] for r in tables[0]) == pytest.approx(1.0)


def test_a_measured_run_counts_the_samples_its_run_records(tmp_path):
    """The measured timeline's samples are the graph's batch (`Graph.batch_size`), the one the run
    resolves: a 64 x 128 GEMM is one sample, not 64 (issue 43: the measurement counted the first
    input's leading dim)."""
    import onnx

    from dabench_ir import profile
    from tests.conftest import parse

    path = tmp_path / "gemm.onnx"
    onnx.save(parse("agraph (float[64,128] A, float[128,32] B) => (float[64,32] C) { C = MatMul(A, B) }"), path)
    report = profile(path, None, measure=True, warmup=0, repeat=1)
    assert report.timeline.samples_per_step == report.config["run"]["samples"]["per_replica"] == 1
    assert report.totals["throughput_samples_per_s"] == pytest.approx(1 / report.totals["time_s"])
