"""Chrome/Perfetto traces: one file for several targets, counter tracks, and the format checks."""

from __future__ import annotations

import json

import onnx
import pytest

import dabench_ir
from dabench_ir.cli import main
from dabench_ir.report.trace import validate_trace, write_report_trace, write_targets_trace
from tests.conftest import parse

CHAIN = """
agraph (float[2, 4] x, float[4, 3] w) => (float[2, 3] y) {
    h = MatMul(x, w)
    y = Relu(h)
}
"""

from tests.test_annotate import ATTENTION  # noqa: E402  (one attention graph for both files)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace")
    for name, text in (("chain", CHAIN), ("att", ATTENTION)):
        onnx.save(parse(text), folder / f"{name}.onnx")
    return folder


def _processes(doc):
    return {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def test_several_targets_give_one_trace_with_a_process_per_target(models, tmp_path, capsys):
    out = tmp_path / "t.json"
    code = main(["profile", str(models / "att.onnx"), "-t", "rdu,wse,ipu", "--trace", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no t-rdu.json and the like
    doc = json.loads(out.read_text())
    assert validate_trace(doc) == []
    procs = _processes(doc)
    labels = ("rdu (sn30)", "wse (wse2)", "ipu (bow)")
    owner = {pid: next(x for x in labels if name.startswith(x)) for pid, name in procs.items()}
    assert set(owner.values()) == set(labels)  # every process belongs to one target
    order = [owner[pid] for pid in sorted(procs)]
    assert order == sorted(order, key=labels.index)  # each target's processes kept together, in the order given
    for label in labels:
        step = next(pid for pid, name in procs.items() if name == f"{label} step")
        counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == step}
        assert "memory in use (bytes)" in counters, label
    ipu_step = next(pid for pid, name in procs.items() if name == "ipu (bow) step")
    busy = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == ipu_step and e["name"].startswith("link")]
    assert busy and max(e["args"]["busy"] for e in busy) > 0  # the IPU's nodes exchange
    assert set(doc["otherData"]["targets"]) == {"rdu", "wse", "ipu"}


def test_counters_follow_the_dataflow_in_microseconds(models, tmp_path):
    """On the RDU the chain runs MatMul then Relu: h lives from MatMul's start to Relu's end, y from
    Relu's start to the step's end; the plan's resident bytes are a constant series."""
    report = dabench_ir.profile(models / "chain.onnx", target="rdu")
    doc = json.loads(write_report_trace(report, tmp_path / "t.json").read_text())
    assert validate_trace(doc) == []
    mm, relu = (report.timeline.nodes[n.name] for n in report.graph.nodes)
    size = {v: report.graph.values[v].type.dtype.itemsize * 6 for v in ("h", "y")}  # [2, 3] each
    node = next(e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == report.graph.nodes[0].name)
    assert node["ts"] == mm.start * 1e6 and node["dur"] == pytest.approx((mm.end - mm.start) * 1e6, rel=1e-12)
    memory = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "memory in use (bytes)"]
    live = [(e["ts"], e["args"]["activations live"]) for e in memory]
    end = max(report.timeline.makespan_s, report.totals["time_s"])  # the host time runs after the nodes
    expected = sorted({mm.start: size["h"], relu.start: size["h"] + size["y"], relu.end: size["y"]}.items())
    assert live[: len(expected)] == [(t * 1e6, b) for t, b in expected]
    assert live[-1] == (end * 1e6, size["y"])  # the output is held to the step's end
    resident = {k: v for k, v in report.plan.memory_bytes.items() if v}
    assert all({k: e["args"][k] for k in resident} == resident for e in memory)


def test_write_targets_trace_skips_a_report_without_timeline(models, tmp_path):
    rdu = dabench_ir.profile(models / "chain.onnx", target="rdu")
    cost_only = dabench_ir.profile(models / "chain.onnx")
    doc = json.loads(write_targets_trace({"rdu": rdu, "none": cost_only}, tmp_path / "t.json").read_text())
    assert validate_trace(doc) == [] and set(doc["otherData"]["targets"]) == {"rdu"}
    assert all(name.startswith("rdu (sn30)") for name in _processes(doc).values())


@pytest.mark.parametrize(
    ("event", "needle"),
    [
        ({"ph": "C", "name": "m", "pid": 1, "ts": 0}, "no args"),
        ({"ph": "C", "name": "m", "pid": 1, "ts": 0, "args": {"a": "x"}}, "numeric series"),
        ({"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0}, "no dur"),
        ({"ph": "M", "name": "process_name", "pid": 1}, "no args"),
        ({"ph": "i", "name": "a", "pid": 1, "tid": 1, "ts": True}, "ts is not a number"),
        ({"ph": "B", "name": "a", "pid": 1, "ts": 0}, "no tid"),
    ],
)
def test_validate_trace_names_the_missing_key(event, needle):
    problems = validate_trace({"traceEvents": [event]})
    assert len(problems) == 1 and needle in problems[0]


def test_validate_trace_catches_time_going_back_per_track():
    ok = [
        {"ph": "C", "name": "m", "pid": 1, "ts": 5, "args": {"a": 1}},
        {"ph": "C", "name": "other", "pid": 1, "ts": 0, "args": {"a": 1}},  # another track: fine
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
    ]
    assert validate_trace({"traceEvents": ok}) == []
    back = [*ok, {"ph": "C", "name": "m", "pid": 1, "ts": 4, "args": {"a": 2}}]
    problems = validate_trace({"traceEvents": back})
    assert len(problems) == 1 and "goes back" in problems[0]


def test_an_ipu_nodes_phases_carry_its_flops_and_bytes_once(tmp_path):
    """An IPU node is drawn as compute, exchange and sync slices: summing the trace's slices counts
    its FLOPs and bytes once (each slice carried them all: 3x a matmul's FLOPs)."""
    from dabench_ir import api

    report = api.profile("gpt2-small", "bow")
    doc = json.loads(write_report_trace(report, tmp_path / "t.json").read_text())
    flops: dict[str, float] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and "flops" in e.get("args", {}):
            flops[e["name"]] = flops.get(e["name"], 0) + e["args"]["flops"]
    by_node = {n.name: n.flops for n in report.nodes}
    assert flops and all(flops[name] == by_node[name] for name in flops)


@pytest.mark.parametrize("ipus", [1, 4])
def test_an_ipu_training_trace_draws_every_micro_batchs_work_and_ends_at_the_steps_latency(tmp_path, ipus):
    """The emulator keeps a node's last run once its micro-batches settle into a steady state: the trace
    drew only the kept runs (4.53 of a step's 9.07 ms of node work on 8 micro-batches), and after a
    pipeline's runs, which hold its fill and drain already, it drew the fill and drain again (a trace
    35.1 ms long for a 32.9 ms latency)."""
    from dabench_ir.pipeline import profile_graph
    from tests.lowering_graphs import decoder

    report = profile_graph(decoder(layers=4, hidden=128, seq=64, batch=8), "ipu", {"mode": "train", "ipus": ipus})
    path = write_report_trace(report, tmp_path / "t.json")
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    nodes = [e for e in events if e.get("cat") not in ("overhead", "unit")]
    work = sum(n.time_s or 0.0 for n in report.nodes)
    assert sum(e["dur"] for e in nodes) * 1e-6 == pytest.approx(work, rel=1e-6)
    end = max(e["ts"] + e["dur"] for e in events) * 1e-6
    assert end == pytest.approx(report.totals["latency_s"], rel=1e-6) and end <= report.totals["time_s"] * (1 + 1e-9)
