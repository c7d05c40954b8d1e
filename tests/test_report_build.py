"""`report.build.build_report`: the report serializes the types it holds and never
recomputes what a lowering decided (a node's bound is the lowering's)."""

from __future__ import annotations

import pytest

from dabench_ir.options import ProfileOptions, ScaleOptions
from dabench_ir.place import place
from dabench_ir.plan import Failure
from dabench_ir.report.build import build_report
from dabench_ir.run import resolve
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder


@pytest.mark.parametrize("name", ["wse", "rdu", "ipu", "a100"])
def test_bounds_are_the_lowerings(name):
    graph = decoder(layers=2, hidden=64)
    target = load_target(name)
    plan, timeline, metrics = place(graph, target, ProfileOptions())
    report = build_report(graph, run=resolve(graph, target), plan=plan, timeline=timeline, metrics=metrics)
    for record in report.nodes:
        if record.name in timeline.nodes:
            given = timeline.nodes[record.name].bound or plan.node_plans[record.name].bound
            assert record.bound == (str(given) if given is not None else None), record.name
    assert report.metrics == {**report.metrics, **metrics.to_dict()}


def test_failure_and_config_come_from_their_types():
    graph = decoder(layers=1, hidden=64)
    target = load_target("rdu")
    plan, timeline, metrics = place(graph, target, ProfileOptions())
    plan.failure = Failure("too big", needed_bytes=10, capacity_bytes=5)
    opts = ScaleOptions(opt_level="O3", strategy="tp", chips=2)
    report = build_report(graph, run=resolve(graph, target, opts), plan=plan, timeline=timeline, metrics=metrics)
    assert report.failure == {"reason": "too big", "needed_bytes": 10, "capacity_bytes": 5}
    config = report.to_dict()["config"]
    # schema dabench-ir/report/v1 keys, resolved against the plan and the graph
    assert {"batch", "precision", "mode", "chips", "strategy", "dims", "via"} <= set(config)
    # one placement: its chips, and no strategy (a multi-chip run records its own)
    assert (config["chips"], config["strategy"], config["opt_level"]) == (plan.chips, None, "O3")
    cost_only = build_report(graph, run=resolve(graph)).to_dict()["config"]
    assert "opt_level" not in cost_only and cost_only["mode"] == "inference"


def test_the_report_total_adds_each_cost_field_as_sum_does():
    from dabench_ir.ir import Cost
    from dabench_ir.report.build import _total

    costs = [Cost(1, 2, 3, 4, 5, 6), Cost(10, 0, 0, 1, 1, 1), Cost(0.1, 0, 0, 0, 0, 2**70), Cost(0.2, 7)]
    for part in (costs, costs[:1], [], list(reversed(costs))):
        assert _total(part) == sum(part, Cost())
    assert _total(costs).contraction_flops == 0 + 1 + 10 + 0.1 + 0.2  # the same additions, in order


def test_the_lowerings_notes_reach_every_rendering():
    """What a lowering assumed or decided (`Plan.notes`) is the report's ``extra.notes``, a ``note`` line
    of the terminal summary and a note of the HTML summary: an RDU inference run says its host time is
    training's per-section estimate; a target whose lowering notes nothing writes no key."""
    from dabench_ir.report.html import render_html
    from dabench_ir.report.table import render_table

    graph = decoder(layers=1, hidden=64)
    target = load_target("rdu")
    plan, timeline, metrics = place(graph, target, ProfileOptions())
    report = build_report(graph, run=resolve(graph, target), plan=plan, timeline=timeline, metrics=metrics)
    (note,) = report.to_dict()["extra"]["notes"]
    assert note == plan.notes[0] and note.startswith("host (estimate: fitted to training steps): 0.411 ms")
    assert f"  note       {note}" in render_table(report, color=False).splitlines()
    assert "host (estimate: fitted to training steps): 0.411 ms" in render_html(report)
    h100 = load_target("h100")
    plan, timeline, metrics = place(graph, h100, ProfileOptions())
    assert not plan.notes
    report = build_report(graph, run=resolve(graph, h100), plan=plan, timeline=timeline, metrics=metrics)
    assert "notes" not in report.to_dict().get("extra", {})


def test_a_multi_chip_report_carries_the_scaling_stages_notes():
    """A multi-chip run's report says what the scaling stage assumed (`ScalePoint.notes`) after the chip's
    lowering's: the all-reduces of a tensor-parallel step, as `scale` prints them under its table."""
    from dabench_ir.report.table import render_table
    from dabench_ir.run import execute

    graph = decoder(layers=2, hidden=64)
    report = execute(resolve(graph, "h100", ScaleOptions(chips=2, strategy="tp")), graph)
    notes = report.to_dict()["extra"]["notes"]
    assert notes == ["4 all-reduces per step"]  # 2 layers x (attention, MLP); no LM head in this stack
    assert "  note       4 all-reduces per step" in render_table(report, color=False).splitlines()


def test_a_run_that_does_not_fit_shows_its_rates_as_what_it_would_take():
    """No throughput for a run that does not fit: its time and its efficiency are what it would take."""
    from dabench_ir import api
    from dabench_ir.report.table import render_table

    text = render_table(api.profile("gpt2-small", "bow", batch=8, mode="train"), color=False, width=200)
    assert "fits: NO" in text and "if it fitted; throughput: does not fit" in text
    assert next(line for line in text.splitlines() if line.startswith("  metrics")).endswith("of peak if it fitted")


def test_every_format_says_how_many_nodes_are_estimated_and_the_basis_of_its_time(tmp_path):
    """The HTML summary and the annotated model state what the text does: nodes without a cost rule
    (0 too), the time no node owns, the energy, and a pipelined chip's period beside its latency."""
    import onnx

    from dabench_ir import api
    from dabench_ir.report.table import render_table

    wse = api.profile("gpt2-small", "wse2", wse_mode="pipelined")
    assert wse.totals["latency_s"] > wse.totals["time_s"]  # a period, consecutive steps overlapping
    from dabench_ir.report.html import write_html

    html = write_html(wse, tmp_path / "r.html").read_text()
    for card in ("period (steady state)", "latency (one step alone)", "time no node owns", "energy per step"):
        assert f'<div class="k">{card}</div>' in html
    assert '<div class="k">estimated nodes (no cost rule)</div><div class="v">0</div>' in html
    assert '<div class="k">precision by op class</div><div class="v">contraction ' in html  # as the text
    assert "  estimated  0 nodes without a cost rule" in render_table(wse, color=False)
    from dabench_ir.cli import main

    assert main(["profile", "gpt2-small", "-t", "h100", "-q", "--annotate", str(tmp_path / "a.onnx")]) == 0
    model = onnx.load(tmp_path / "a.onnx")
    props = {p.key: p.value for p in model.metadata_props}
    assert props["dabench.estimated_nodes"] == "0" and float(props["dabench.energy_j"]) > 0
    assert float(props["dabench.overhead_s"]) >= 0
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    node = {p.key: p.value for p in matmul.metadata_props}
    assert node["dabench.precision"] == "bf16" and float(node["dabench.energy_j"]) > 0  # as the JSON's nodes
