"""Emulation: dependencies hold on every target, pipelines fill and drain, traces open."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from dabench_ir.emulate import check_dependencies, emulate
from dabench_ir.lowering import lower
from dabench_ir.lowering.ipu import IpuLowering
from dabench_ir.metrics import compute_metrics
from dabench_ir.options import ProfileOptions
from dabench_ir.plan import NodePlan
from dabench_ir.report.trace import write_chrome_trace
from dabench_ir.targets import load_target
from tests.conftest import analyze_text
from tests.lowering_graphs import chain, decoder

CASES = [
    ("a100", ProfileOptions()),
    ("wse", ProfileOptions(wse_mode="pipelined")),
    ("wse", ProfileOptions(wse_mode="streaming")),
    ("rdu", ProfileOptions(opt_level="O0")),
    ("rdu", ProfileOptions(opt_level="O3")),
    ("ipu", ProfileOptions(ipus=2)),
]


@pytest.mark.parametrize("target,opts", CASES)
def test_timeline_respects_dependencies(target, opts):
    g = decoder(layers=2, hidden=64, seq=8, batch=4)
    plan = lower(g, load_target(target), opts)
    timeline = emulate(plan, g)
    assert set(timeline.nodes) == {n.name for n in g.nodes}
    assert check_dependencies(timeline, g) == []
    for name, runs in timeline.slices.items():
        assert len(runs) == plan.micro_batches
        assert all(b >= a for a, b in runs)
        spans = sum(b - a for a, b in runs)
        if name in timeline.streamed_rows:  # its rows spread over the time its producers' rows arrive
            assert timeline.busy(name) <= spans + 1e-15
        else:
            assert timeline.busy(name) == pytest.approx(spans)
    assert timeline.step_time_s > 0
    assert timeline.samples_per_step == 4


def test_pipeline_fill_and_drain():
    # three stages on three IPUs, four micro-batches
    g = chain([10**9] * 3, [10**3] * 3)
    g.nodes[0].layer, g.nodes[1].layer, g.nodes[2].layer = 0, 1, 2
    ipu = load_target("ipu")
    plan = lower(g, ipu, ProfileOptions(ipus=3, micro_batches=4, precision="fp16"))
    timeline = emulate(plan, g)
    # stages 1 and 2 also pay the IPU-Link transfer of their input
    assert plan.node_plans["n1"].comm_s > plan.node_plans["n0"].comm_s
    # identical micro-batches through a chain: makespan = sum of stages + (M - 1) x slowest
    assert timeline.makespan_s == pytest.approx(
        sum(plan.node_plans[n].per_micro_batch_s for n in ("n0", "n1", "n2"))
        + 3 * max(plan.node_plans[n].per_micro_batch_s for n in ("n0", "n1", "n2")),
        rel=1e-6,
    )
    # steady state: consecutive steps overlap, the busiest stage sets the step time
    assert timeline.step_time_s == pytest.approx(max(timeline.unit_busy_s.values()))
    one_step = emulate(
        lower(g, ipu, IpuLowering.options(ProfileOptions(ipus=3, micro_batches=4), steady_state=False)), g
    )
    assert one_step.step_time_s == pytest.approx(one_step.makespan_s)


def test_sequential_units_never_overlap():
    g = decoder(layers=2, hidden=64, seq=8)
    plan = lower(g, load_target("rdu"), ProfileOptions(opt_level="O1"))
    timeline = emulate(plan, g)
    for unit in plan.units:
        start, end = timeline.unit_spans[unit.id]
        for n in unit.nodes:
            assert start <= timeline.nodes[n].start and timeline.nodes[n].end <= end + 1e-15


def test_chrome_trace(tmp_path):
    g = decoder(layers=1, hidden=64, seq=8)
    plan = lower(g, load_target("rdu"), ProfileOptions(opt_level="O1"))
    timeline = emulate(plan, g)
    path = write_chrome_trace(timeline, g, tmp_path / "t.json", plan=plan)
    doc = json.loads(path.read_text())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] not in ("unit", "overhead")]
    assert {e["name"] for e in slices} == {n.name for n in g.nodes}
    assert len(slices) == len(g.nodes)
    for e in slices:
        assert {"flops", "bytes", "bound"} <= set(e["args"]) and e["dur"] >= 0
    # one track per hardware unit group (report/trace.py), not one per node
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert "sn30 RDU" in procs


_ONNX = """
agraph (float[2,8,16] x, float[16,32] w1, float[32,16] w2) => (float[2,8,16] y) {
    h = MatMul(x, w1)
    a = Relu(h)
    z = MatMul(a, w2)
    s = Softmax(z)
    y = Add(s, x)
}
"""


@pytest.mark.parametrize("target", ["a100", "wse", "rdu", "ipu"])
def test_analyzed_onnx_graph_runs_end_to_end(target):
    g = analyze_text(_ONNX)
    tgt = load_target(target)
    plan = lower(g, tgt, ProfileOptions(batch=2))
    timeline = emulate(plan, g)
    metrics = compute_metrics(g, plan, timeline, tgt)
    assert plan.fits and check_dependencies(timeline, g) == []
    assert metrics.total_flops == sum(plan.node_plans[n.name].flops for n in g.nodes) > 0
    assert set(metrics.node_intensity) == {n.name for n in g.nodes}
    assert all(t.bound is not None for t in timeline.nodes.values())


def test_a_pipelined_step_reports_its_period_and_its_latency_apart():
    """WSE pipelined mode overlaps consecutive steps: the step time is the period (the bottleneck
    region's time), one step alone takes the pipeline's whole depth; a sequential target's are equal."""
    from dabench_ir.pipeline import profile_graph

    wse = profile_graph(decoder(layers=4, hidden=64), "wse", {"wse_mode": "pipelined"})
    t = wse.totals
    assert t["latency_s"] > 2 * t["time_s"] and t["period_s"] == t["time_s"]
    assert t["time_basis"].startswith("steady-state period")
    assert t["latency_s"] == pytest.approx(wse.timeline.makespan_s + sum(wse.timeline.overheads_s.values()))
    rdu = profile_graph(decoder(layers=4, hidden=64), "rdu").totals
    assert rdu["latency_s"] == rdu["time_s"] and rdu["time_basis"] == "one step"


@pytest.mark.parametrize(
    ("stage_flops", "ipus", "micro_batches"),
    [([10**9] * 3, 3, 64), ([10**9, 4 * 10**9, 10**9], 3, 200), ([10**8, 10**9, 3 * 10**9, 10**9], 2, 500)],
)
def test_the_closed_form_matches_simulating_every_micro_batch(monkeypatch, stage_flops, ipus, micro_batches):
    # stages on fewer IPUs than stages, and light stages ahead of heavy ones: lanes that run ahead
    # of the bottleneck at their own rate must not keep the closed form from applying, or bend it
    import dabench_ir.emulate as emulate_module

    g = chain(stage_flops, [10**3] * len(stage_flops))
    for i, node in enumerate(g.nodes):
        node.layer = i
    opts = IpuLowering.options(
        ProfileOptions(ipus=ipus, micro_batches=micro_batches, precision="fp16"), steady_state=False
    )
    closed = emulate(lower(g, load_target("ipu"), opts), g)
    monkeypatch.setattr(emulate_module, "_lane_rates", lambda *a: defaultdict(lambda: math.nan))  # never settles
    simulated = emulate(lower(g, load_target("ipu"), opts), g)
    assert closed.makespan_s == pytest.approx(simulated.makespan_s, rel=1e-12)
    for name, runs in simulated.slices.items():
        assert closed.slices[name][-1] == pytest.approx(runs[-1], rel=1e-12)
        assert closed.busy(name) == pytest.approx(simulated.busy(name), rel=1e-12)
    assert len(closed.slices["n0"]) < micro_batches  # the closed form did apply


def test_one_lane_runs_at_its_nodes_sum_exactly_as_the_walk_gives(monkeypatch):
    """An RDU section's nodes share one lane: its rate is their durations' sum, without the walk
    over lanes, to the last bit of what the walk gives (here with a second lane beside it, which
    reaches nothing), and a training step with 16 micro-batches matches simulating every one."""
    import random

    import dabench_ir.emulate as emulate_module
    from dabench_ir.emulate import _lane_rates, _Runs
    from dabench_ir.passes.training import TrainingPass

    rng = random.Random(7)
    durations = [rng.uniform(1e-9, 1e-3) for _ in range(40)]
    preds = [[j for j in range(i) if rng.random() < 0.2] for i in range(40)]

    def runs(lanes: list[str], preds: list[list[int]]) -> _Runs:
        return _Runs.start(
            [NodePlan(node=str(i), unit=lane, lane=lane, per_micro_batch_s=0.0) for i, lane in enumerate(lanes)], preds
        )

    alone = _lane_rates(list(range(40)), durations, runs(["rdu"] * 40, preds))
    beside = _lane_rates(list(range(41)), [*durations, 5.0], runs(["rdu"] * 40 + ["host"], [*preds, []]))
    assert alone == {"rdu": beside["rdu"]} and beside["host"] == 5.0

    g = TrainingPass()(decoder(layers=2, hidden=64, batch=16)).graph
    plan = lower(g, load_target("rdu"), ProfileOptions(micro_batches=16, mode="train"))
    assert plan.micro_batches == 16 and {p.lane for p in plan.node_plans.values()} == {"rdu"}
    closed = emulate(plan, g)
    monkeypatch.setattr(emulate_module, "_lane_rates", lambda *a: defaultdict(lambda: math.nan))  # never settles
    simulated = emulate(plan, g)
    assert closed.step_time_s == pytest.approx(simulated.step_time_s, rel=1e-12)
    for name, runs in simulated.slices.items():
        assert closed.slices[name][-1] == pytest.approx(runs[-1], rel=1e-12)
    assert len(closed.slices[g.nodes[0].name]) < 16  # the closed form did apply


def test_lane_rates_are_the_largest_cycle_mean_that_reaches_each_lane():
    from dabench_ir.emulate import _reached_cycle_means

    # a round trip a -> b -> a of 3 + 3 over two micro-batches beats either lane's own load
    assert _reached_cycle_means({"a": {"a": 1.0, "b": 3.0}, "b": {"a": 3.0, "b": 1.0}}) == {"a": 3.0, "b": 3.0}
    # no way back: b goes at the slower of its own load and the lane that feeds it
    assert _reached_cycle_means({"a": {"a": 2.0, "b": 5.0}, "b": {"b": 1.0}}) == {"a": 2.0, "b": 2.0}
    assert _reached_cycle_means({"a": {"a": 2.0, "b": 5.0}, "b": {"b": 4.0}, "c": {"c": 0.5}}) == {
        "a": 2.0,
        "b": 4.0,
        "c": 0.5,
    }


def test_the_dependencies_by_position_are_the_graphs_own_worked_out_once():
    """Every emulation of a graph walks its producers by position (`Graph.producer_positions`): worked
    out once (the why lines' variants emulate the report's graph again), forgotten when the graph is
    rewired, and read for a timeline of part of the graph as the producers among its nodes."""
    from dataclasses import replace

    from dabench_ir.timeline import Timeline

    g = decoder(layers=2, hidden=64, seq=8, batch=4)
    plan = lower(g, load_target("rdu"), ProfileOptions())
    assert "producer_positions" not in g.__dict__
    first = emulate(plan, g)
    preds = g.__dict__["producer_positions"]  # the emulation read the graph's own
    assert emulate(plan, g).nodes == first.nodes and g.producer_positions is preds
    writer = {out: i for i, n in enumerate(g.nodes) for out in n.outputs if out}
    assert preds == [list(dict.fromkeys(writer[v] for v in n.inputs if v in writer)) for n in g.nodes]
    g.invalidate()
    assert "producer_positions" not in g.__dict__ and g.producer_positions == preds
    # part of the graph: the first node left out; a consumer moved before its producer's end is named
    consumer = next(i for i, p in enumerate(preds) if p and min(p) > 0)
    producer = g.nodes[preds[consumer][0]].name
    name = g.nodes[consumer].name
    nodes = {n.name: first.nodes[n.name] for n in g.nodes[1:]}
    early = first.nodes[producer].end - 1.0
    nodes[name] = replace(nodes[name], start=early)
    part = Timeline(nodes=nodes, step_time_s=first.step_time_s)
    problems = check_dependencies(part, g)
    assert any(p.startswith(f"{name} (micro-batch 0) starts") and f"before {producer} ends" in p for p in problems)


@pytest.mark.parametrize("target", ["bow", "wse2"])
def test_a_training_step_that_drains_is_its_own_latency(target):
    """A training step drains its pipeline before the weight update, so nothing overlaps it: one step
    alone is the step. The latency had been the emulated makespan, 1.5 ms shorter than a Bow step (the
    fill and drain at (stages - 1) cycles against the emulated ramp) and 4.9x a WSE step (24.8 against
    5.09 ms: the emulator passes whole samples region to region, where the wafer streams rows)."""
    from dabench_ir.pipeline import profile_graph
    from tests.lowering_graphs import decoder

    knobs = {"mode": "train", "ipus": 4} if target == "bow" else {"mode": "train", "wse_mode": "pipelined"}
    report = profile_graph(decoder(layers=4, hidden=128, seq=64, batch=8), target, knobs)
    assert report.to_dict()["overheads"]["pipeline_fill_drain"] > 0
    assert report.totals["latency_s"] == report.totals["time_s"]
