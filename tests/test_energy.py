"""Energy per node and fair cross-node normalisation."""

from __future__ import annotations

import pytest

from dabench_ir import api
from dabench_ir.cli import main
from dabench_ir.emulate import emulate
from dabench_ir.energy import energy_model, load_catalog, node_energies, normalize, scale_factors, step_energy
from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, DType, Graph, ValueKind
from dabench_ir.lowering import lower
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.passes.training import TrainingPass
from dabench_ir.place import place
from dabench_ir.report.build import build_report
from dabench_ir.run import lowering_options, resolve
from dabench_ir.targets import load_target
from tests.lowering_graphs import _Builder, decoder


@pytest.mark.parametrize("rule", ["post-dennard", "dennard"])
def test_normalisation_is_identity_at_own_node(rule):
    assert normalize(1000.0, 50.0, 16, 16, gops_per_mm2=3.0, rule=rule) == {
        "gops": 1000.0,
        "gops_per_w": 50.0,
        "gops_per_mm2": 3.0,
    }


@pytest.mark.parametrize("rule", ["post-dennard", "dennard"])
def test_normalisation_is_monotone_in_node_size(rule):
    # the same design built at a finer node is faster and more efficient; at a coarser one, less
    nodes = [3, 5, 7, 10, 16, 28, 40, 65]
    gops = [normalize(1000.0, 50.0, n, 16, gops_per_mm2=3.0, rule=rule) for n in nodes]
    for key in ("gops", "gops_per_w", "gops_per_mm2"):
        values = [g[key] for g in gops]
        assert values == sorted(values), key  # designs from coarser nodes gain when brought to 16 nm
    to = [normalize(1000.0, 50.0, 16, n, rule=rule)["gops_per_w"] for n in nodes]
    assert to == sorted(to, reverse=True)


def test_dennard_scales_energy_faster_than_post_dennard():
    assert scale_factors(32, 16, "dennard")["gops_per_w"] == pytest.approx(8)
    assert scale_factors(32, 16, "post-dennard")["gops_per_w"] == pytest.approx(2)
    with pytest.raises(UserError):
        scale_factors(7, 16, "moore")


def _emulated(target_name):
    graph = decoder(layers=2, hidden=64)
    target = load_target(target_name)
    plan = lower(graph, target, ProfileOptions())
    timeline = emulate(plan, graph)
    return graph, plan, timeline, target


TARGETS = ["wse", "rdu", "ipu", "h100", "a100"]


def _train(graph):
    TrainingPass()(graph)
    return graph


def _placed(target_name, mode="inference", graph=None):
    """A tiny decoder (or ``graph``) placed on a target and reported: (graph, plan, timeline, target, report)."""
    graph = graph if graph is not None else decoder(layers=2, hidden=64)
    if mode == "train":
        _train(graph)
    target = load_target(target_name)
    plan, timeline, metrics = place(graph, target)
    report = build_report(graph, run=resolve(graph, target), plan=plan, timeline=timeline, metrics=metrics)
    return graph, plan, timeline, target, report


@pytest.mark.parametrize("mode", ["inference", "train"])
@pytest.mark.parametrize("name", TARGETS)
def test_energy_obeys_the_chips_power(name, mode):
    # the physics check: no node draws more than the chips' rated power while it runs, nor the step
    graph, plan, timeline, target, report = _placed(name, mode)
    t = report.totals
    rated = float(target.watts) * max(1, plan.chips)
    assert t["target_power_w"] == rated
    step = step_energy(graph, plan, timeline, target)
    for n in report.nodes:
        if n.energy_j is None:
            continue
        busy = timeline.busy(n.name) or 0.0
        if busy > 0:
            assert n.energy_j <= rated * busy, n.name
        else:  # run off the timeline (an optimizer step inside a step overhead): no static energy
            assert step.static[n.name] == 0.0 and n.energy_j == step.dynamic[n.name], n.name
            assert n.energy_j <= rated * timeline.step_time_s, n.name
    assert t["energy_j"] <= rated * timeline.step_time_s
    assert t["power_w"] <= rated


@pytest.mark.parametrize("mode", ["inference", "train"])
@pytest.mark.parametrize("name", TARGETS)
def test_energy_total_is_nodes_plus_rows(name, mode):
    graph, plan, timeline, target, report = _placed(name, mode)
    t = report.totals
    per_node = [n.energy_j for n in report.nodes if n.energy_j is not None]
    assert per_node and all(e > 0 for e in per_node)
    assert t["node_energy_j"] == pytest.approx(sum(per_node), rel=1e-12)
    rows = t["idle_energy_j"] + sum(t["overhead_energy_j"].values())
    assert t["energy_j"] == pytest.approx(t["node_energy_j"] + rows, rel=1e-12)
    assert t["energy_j"] == pytest.approx(t["dynamic_energy_j"] + t["static_energy_j"], rel=1e-12)
    # static power is drawn for the whole step, every second of it on exactly one row
    static_w = energy_model(target).static_watts * max(1, plan.chips)
    assert t["static_power_w"] == pytest.approx(static_w)
    assert t["static_energy_j"] == pytest.approx(static_w * timeline.step_time_s, rel=1e-12)
    assert t["node_static_energy_j"] + rows == pytest.approx(t["static_energy_j"], rel=1e-12)
    assert t["idle_energy_j"] >= 0
    assert set(t["overhead_energy_j"]) == set(timeline.overheads_s)
    for row, seconds in timeline.overheads_s.items():  # the whole plan idles through an overhead
        assert t["overhead_energy_j"][row] == pytest.approx(static_w * seconds, rel=1e-12)
    assert sum(node_energies(graph, plan, timeline, target).values()) == pytest.approx(t["node_energy_j"])
    assert t["energy_j"] > t["static_energy_j"]


@pytest.mark.parametrize(("name", "options"), [("wse2", {"wse_mode": "pipelined"}), ("bow", {})])
def test_data_parallel_copies_on_one_plan_each_spend_the_nodes_dynamic_energy(name, options):
    """A plan that runs r copies of the graph itself (the WSE's replicas on the wafer, the IPU's
    replicas) does every node's FLOPs and bytes r times: its dynamic energy is r times one copy's,
    node by node (it was one copy's whatever r, so a copy's work cost nothing)."""
    target = load_target(name)
    graph = decoder(layers=2, hidden=64, batch=2)
    energies = {}
    for r in (1, 2):
        run = resolve(graph, target, ProfileOptions(replicas=r, **options), defaults=False)
        plan, timeline, _ = place(graph, target, lowering_options(run))
        assert plan.replicas == r
        energies[r] = step_energy(graph, plan, timeline, target)
    one, two = energies[1], energies[2]
    assert two.dynamic_j == pytest.approx(2 * one.dynamic_j, rel=1e-12)
    assert {n: 2 * e for n, e in one.dynamic.items()} == pytest.approx(two.dynamic)


def test_rdu_ddr_bound_section_nodes_obey_the_chips_power():
    """A DDR-bound section's traffic streams over its whole span: a node moves the share that falls
    in its own time (metrics.node_feed_intensity), so no node draws more than the chip's power."""
    _, _, timeline, target, report = _placed("rdu", "train", decoder(layers=1, hidden=512, seq=128, batch=4))
    for n in report.nodes:
        busy = timeline.busy(n.name) or 0.0
        if n.energy_j is not None and busy > 0:
            assert n.energy_j <= target.watts * busy, n.name


def test_gpu_node_holds_only_its_sms_for_its_own_time():
    # H100, bf16 by default: 0.06667 pJ/FLOP, 31.2 pJ per HBM byte, static 0.3 x 700 W;
    # a small kernel holds one SM of 132 while it runs
    graph, plan, timeline, _, report = _placed("h100")
    name = "layers.0.attn.q_proj"
    node, np_ = graph.node(name), plan.node_plans[name]
    busy = timeline.busy(name)
    assert np_.allocation == pytest.approx(1 / 132)
    expected = node.meta[meta.COST].flops * 0.06667e-12 + np_.feed_bytes * 31.2e-12 + 210.0 / 132 * busy
    assert report.node(name).energy_j == pytest.approx(expected, rel=1e-12)
    # the other 131 SMs and the time the stream runs other kernels are the idle row, not this node's;
    # the time the GPU waits for the host to issue kernels is its own row, at static power
    t = report.totals
    held = sum(210.0 * plan.node_plans[n.name].allocation * timeline.busy(n.name) for n in report.nodes)
    waiting = 210.0 * timeline.overheads_s["host_issue"]
    assert t["overhead_energy_j"] == {"host_issue": pytest.approx(waiting, rel=1e-12)}
    assert t["idle_energy_j"] == pytest.approx(210.0 * timeline.step_time_s - held - waiting, rel=1e-9)


def test_rdu_node_holds_its_sections_pcus_and_host_time_is_a_row():
    # SN30: static 0.3 x 500 W; a node holds its section's PCU allocation while it runs; the
    # host time and the section reconfigurations are rows of their own
    graph, plan, timeline, target, report = _placed("rdu", "train")
    t = report.totals
    step = step_energy(graph, plan, timeline, target)
    for n in report.nodes:
        runs = [(u.allocation, u.node_s[n.name]) for u in plan.units if n.name in u.nodes]
        share = sum(a * s for a, s in runs) / sum(s for _, s in runs)
        assert step.static[n.name] == pytest.approx(150.0 * share * timeline.busy(n.name), rel=1e-12)
    twice = [n.name for n in report.nodes if sum(n.name in u.nodes for u in plan.units) > 1]
    assert twice  # forward and backward sections: the time-weighted mean of the two allocations
    assert t["overhead_energy_j"]["host"] == pytest.approx(150.0 * timeline.overheads_s["host"], rel=1e-12)
    assert t["overhead_energy_j"]["section_reconfig"] == pytest.approx(150.0 * 24 * 1e-5, rel=1e-9)
    assert t["overhead_energy_j"]["host"] > 100 * t["node_static_energy_j"]  # training's host step: not the nodes'


def _embedding_graph(vocab=50257, hidden=768, seq=128, batch=8):
    """A token embedding (Gather) and one projection: the issue's short Gather on SN30."""
    b = _Builder(DType.FLOAT16)
    ids = b.value("ids", (batch, seq), ValueKind.INPUT)
    wte = b.value("wte", (vocab, hidden), ValueKind.WEIGHT)
    tok = (batch, seq, hidden)
    rows = b.nbytes(tok)
    x = b.node(
        "embed", "Gather", [wte, ids], tok, Cost(act_bytes_in=rows + batch * seq * 8, act_bytes_out=rows), "embed", None
    )
    w = b.value("fc.weight", (hidden, hidden), ValueKind.WEIGHT)
    cost = Cost(
        contraction_flops=2 * batch * seq * hidden * hidden,
        weight_bytes=b.nbytes((hidden, hidden)),
        act_bytes_in=rows,
        act_bytes_out=rows,
    )
    y = b.node("fc", "MatMul", [x, w], tok, cost, "fc", None)
    return Graph(b.nodes, b.values, ["ids"], [y], name="embed", bindings={"batch": batch})


def test_short_gather_on_sn30_is_far_below_the_chips_power():
    # the issue: the whole step's static power, host time included, spread over node time gave a
    # microseconds-long Gather kilowatts on a ~500 W chip; now it holds its section's PCUs only
    _, plan, timeline, target, report = _placed("rdu", graph=_embedding_graph())
    busy = timeline.busy("embed")
    host = next(k for k in timeline.overheads_s if k.startswith("host"))  # inference: labelled an estimate
    assert busy < 20e-6 and timeline.overheads_s[host] > 50 * busy
    gather = report.node("embed").energy_j
    # 1,574,912 DDR bytes at 120 pJ/B, no FLOPs, and 150 W x its section's PCUs (2 of 1280) while it runs
    np_ = plan.node_plans["embed"]
    section = next(u for u in plan.units if u.id == np_.unit)
    assert np_.feed_bytes == 1574912 and section.allocation == pytest.approx(2 / 1280)
    assert gather == pytest.approx(1574912 * 120e-12 + 150.0 * 2 / 1280 * busy, rel=1e-12)
    assert gather / busy < 0.1 * target.watts
    assert report.totals["overhead_energy_j"][host] == pytest.approx(150.0 * timeline.overheads_s[host])


def test_gops_per_watt_modelled_is_flops_per_modelled_joule():
    *_, target, report = _placed("rdu")
    t = report.totals
    assert t["gops_per_w_modelled"] == pytest.approx(t["flops"] / t["energy_j"] / 1e9)
    assert t["gops_per_w"] == pytest.approx(t["achieved_flops_per_s"] / 1e9 / target.watts)


def test_gops_per_watt_modelled_counts_every_copy_a_step_runs():
    """Two IPU replicas run twice one copy's FLOPs on twice the energy: the same FLOPs per joule as
    one, within the replicas' own costs (their gradient all-reduce, the step's sync)."""
    one, two = (api.profile("gpt2-small", "bow", replicas=n).totals for n in (1, 2))
    assert two["step_flops"] == 2 * one["step_flops"]
    assert two["gops_per_w_modelled"] == pytest.approx(two["step_flops"] / two["energy_j"] / 1e9)
    assert two["gops_per_w_modelled"] == pytest.approx(one["gops_per_w_modelled"], rel=0.1)


def test_a_gpu_micro_batch_reads_the_weights_again_and_spends_their_bytes():
    """Eight micro-batches on an H100 read every weight eight times (each is timed so): the nodes'
    bytes from HBM, and so their energy, count the seven further reads too (they counted one)."""
    one, eight = (api.profile("gpt2-small", "h100", batch=8, micro_batches=m) for m in (1, 8))
    weights = sum(c.weight_bytes for c in map(meta.attributed_cost, one.graph.nodes) if c is not None)
    moved = [sum(p.feed_bytes for p in r.plan.node_plans.values()) for r in (one, eight)]
    assert moved[1] - moved[0] == 7 * weights
    extra_j = eight.totals["dynamic_energy_j"] - one.totals["dynamic_energy_j"]
    assert extra_j == pytest.approx(7 * weights * energy_model(load_target("h100")).pj_per_byte["hbm"] * 1e-12)


def test_gops_per_watt_is_achieved_over_power():
    graph, plan, timeline, target = _emulated("a100")
    report = build_report(graph, run=resolve(graph, target), plan=plan, timeline=timeline)
    t = report.totals
    achieved = t["flops"] / t["time_s"]
    assert t["achieved_flops_per_s"] == pytest.approx(achieved)
    assert t["gops_per_w"] == pytest.approx(achieved / 1e9 / target.watts)
    assert t["gops_per_w_modelled"] == pytest.approx(achieved / 1e9 / t["power_w"])


def test_every_target_file_has_energy_node_and_power_with_sources():
    for name in ("wse2", "sn30", "bow", "a100", "h100", "h200"):
        target = load_target(name)
        raw = target.raw
        assert raw["process"]["node_nm"]["source"] and raw["power"]["watts"]["source"]
        for table in ("pj_per_flop", "pj_per_byte"):
            for entry in raw["energy"][table].values():
                assert entry["source"] and "estimate" in entry
        assert {"fp32", "fp16", "bf16"} <= set(raw["energy"]["pj_per_flop"])


def test_catalog_rows_have_sources_and_cli_lists_them(capsys):
    rows = load_catalog()
    assert len(rows) >= 6 and all(r["source"] and r["node_nm"] > 0 for r in rows)
    assert main(["targets", "--catalog", "--normalize-to", "16"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA A100" in out and "@16" in out and "(unverified)" in out
    assert main(["targets", "--normalize-to", "16"]) == 0
    assert "wse2" in capsys.readouterr().out
    assert main(["targets", "--normalize-to", "0"]) == 2


def test_compare_shows_normalised_beside_raw(tmp_path, capsys):
    graph, plan, timeline, target = _emulated("a100")
    report = build_report(graph, run=resolve(graph, target), plan=plan, timeline=timeline)
    path = tmp_path / "a.json"
    report.write_json(path)
    assert main(["compare", str(path), "--normalize-to", "16", "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "GOP/s/W @16nm" in out
    import json

    row = json.loads((tmp_path / "c.json").read_text())["rows"][0]
    # A100 is 7 nm: post-Dennard normalisation to 16 nm divides GOP/s/W by 16/7
    assert row["gops_per_w_normalized"] == pytest.approx(row["gops_per_w"] * 7 / 16)
