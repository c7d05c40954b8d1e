"""Metrics: ranges, roofline bound classes, efficiency and memory use."""

from __future__ import annotations

import pytest

from dabench_ir.emulate import emulate
from dabench_ir.lowering import lower
from dabench_ir.lowering.gpu import GpuLowering
from dabench_ir.metrics import compute_metrics
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import load_target
from dabench_ir.timeline import Bound
from tests.lowering_graphs import chain, decoder

CASES = [
    ("a100", ProfileOptions()),
    ("h100", GpuLowering.options(ProfileOptions(), fuse_elementwise=False)),
    ("wse", ProfileOptions(wse_mode="pipelined")),
    ("wse", ProfileOptions(wse_mode="pipelined", replicas="auto")),
    ("wse", ProfileOptions(wse_mode="streaming")),
    ("rdu", ProfileOptions(opt_level="O0")),
    ("rdu", ProfileOptions(opt_level="O1")),
    ("rdu", ProfileOptions(opt_level="O3")),
    ("ipu", ProfileOptions()),
    ("ipu", ProfileOptions(ipus=3)),
]


def _run(target, opts, graph):
    tgt = load_target(target)
    plan = lower(graph, tgt, opts)
    timeline = emulate(plan, graph)
    return tgt, plan, timeline, compute_metrics(graph, plan, timeline, tgt)


@pytest.mark.parametrize("target,opts", CASES)
@pytest.mark.parametrize("shape", [(1, 64, 8, 1), (3, 256, 64, 4)])
def test_allocation_and_li_in_unit_interval(target, opts, shape):
    layers, hidden, seq, batch = shape
    g = decoder(layers=layers, hidden=hidden, seq=seq, batch=batch)
    _, _, timeline, m = _run(target, opts, g)
    assert 0 < m.allocation_ratio <= 1
    assert 0 < m.load_imbalance <= 1
    assert 0 < m.compute_efficiency <= 1
    assert m.achieved_flops_per_s == pytest.approx(m.total_flops / timeline.step_time_s)
    for use in m.memory_use.values():
        assert use.capacity_bytes > 0 and use.fraction == pytest.approx(use.bytes / use.capacity_bytes)


@pytest.mark.parametrize("target,opts", CASES)
def test_a_nodes_bound_is_what_outlasts_the_other_compute_or_its_traffic(target, opts):
    """Compute-bound exactly when a node's compute outlasts its traffic (its feed bytes over the
    bandwidth it reads them at: the level's, or the SRAM of the PEs a WSE region holds), whatever its
    intensity against the chip's contraction ridge: a residual add on the WSE's vector rate was called
    memory-bound at 20 PB/s of SRAM (171 of 317 GPT-2 nodes), every IPU role memory-bound while its
    compute took 10x its traffic."""
    g = decoder(layers=2, hidden=2048, seq=512, batch=4)  # big enough that GPU launches do not dominate
    tgt, plan, timeline, m = _run(target, opts, g)
    checked = 0
    bounds = {name: timing.bound for name, timing in timeline.nodes.items()}  # the plan's, carried by the timeline
    assert bounds == {name: plan.node_plans[name].bound for name in timeline.nodes}
    unit_of = {n: u for u in plan.units for n in u.nodes}
    for name, bound in bounds.items():
        if bound in (Bound.COMMUNICATION, Bound.OVERHEAD):
            continue
        unit, np_ = unit_of.get(name), plan.node_plans[name]
        if unit is not None and unit.kind == "rdu_section":  # one pipeline: what binds the section binds its nodes
            ddr_bound = unit.resources["ddr_s"] > unit.resources["compute_s"]
            assert bound is (Bound.MEMORY if ddr_bound else Bound.COMPUTE), name
        else:
            traffic_s = np_.memory_s
            if not traffic_s and np_.feed_bytes:  # a WSE node: its feed at the SRAM of the PEs it holds
                held = unit.stats.held_units / tgt.num_units if unit.kind.startswith("wse_region") else 1.0
                traffic_s = np_.feed_bytes / (tgt.memory(np_.feed_level).bandwidth_bytes_per_s * held)
            assert bound is (Bound.COMPUTE if np_.compute_s >= traffic_s else Bound.MEMORY), name
        checked += 1
    assert checked > 0
    assert not hasattr(m, "node_bound")  # metrics never recomputes a bound the plan has


def test_gpu_matmul_compute_bound_elementwise_memory_bound():
    g = decoder(layers=1, hidden=2048, seq=512, batch=4)
    _, plan, _, m = _run("a100", GpuLowering.options(ProfileOptions(), fuse_elementwise=False), g)
    assert plan.node_plans["layers.0.mlp.fc1"].bound is Bound.COMPUTE
    assert plan.node_plans["layers.0.add1"].bound is Bound.MEMORY
    assert m.node_intensity["layers.0.mlp.fc1"] > load_target("a100").ridge_point("fp16")


def test_feed_level_is_per_architecture():
    g = decoder(layers=1, hidden=64, seq=8)
    levels = {
        t: set(_run(t, ProfileOptions(wse_mode="pipelined"), g)[3].node_feed_level.values())
        for t in ("wse", "ipu", "rdu", "a100")
    }
    assert levels == {"wse": {"on-chip"}, "ipu": {"on-chip"}, "rdu": {"off-chip"}, "a100": {"off-chip"}}


def test_li_below_one_when_stages_are_unbalanced():
    g = chain([10**10, 10**6], [10**3, 10**3])
    g.nodes[0].layer, g.nodes[1].layer = 0, 1
    _, _, _, m = _run("ipu", ProfileOptions(ipus=2), g)
    assert m.load_imbalance < 0.6


def test_rdu_reports_pmu_allocation_apart():
    g = decoder(layers=1, hidden=64, seq=8)
    _, _, _, m = _run("rdu", ProfileOptions(opt_level="O3"), g)
    assert 0 < m.extra["pmu_allocation"] <= 1


@pytest.mark.parametrize("target,opts", CASES)
def test_roofline_bound_is_the_side_of_the_ridge_the_summed_work_falls_on(target, opts):
    from dabench_ir.metrics import node_feed_intensity

    g = decoder(layers=2, hidden=1024, seq=256, batch=4)
    tgt, plan, timeline, m = _run(target, opts, g)
    _, feed, nbytes = node_feed_intensity(plan, timeline)
    peak = tgt.peak_flops(plan.precision)
    at_peak = sum(plan.node_plans[n].flops / peak for n in nbytes if plan.node_plans[n].flops)
    at_bandwidth = sum(
        b / tgt.memory(feed[n]).bandwidth_bytes_per_s for n, b in nbytes.items() if plan.node_plans[n].flops and b
    )
    assert m.extra["roofline_bound"] == ("memory" if at_bandwidth > at_peak else "compute")


def test_roofline_bound_of_one_model_per_architecture():
    # the same decoder: its GEMMs sit far right of the WSE's SRAM ridge (0.4 FLOP/B) and left of
    # the RDU's DDR ridge (3,250 FLOP/B at bf16), whose section traffic and weights cross DDR
    g = decoder(layers=2, hidden=1024, seq=256, batch=4)
    assert _run("wse", ProfileOptions(wse_mode="pipelined"), g)[3].extra["roofline_bound"] == "compute"
    assert _run("rdu", ProfileOptions(opt_level="O3"), g)[3].extra["roofline_bound"] == "memory"


def test_every_data_parallel_copy_counts_in_the_achieved_flops():
    """IPU replicas and WSE copies on the wafer each run the graph: a step's work is the graph's
    times the copies. Two IPU replicas (each on its own 4 IPUs) achieve twice one replica's FLOP/s at
    the same efficiency; three copies on one wafer achieve three times the work of one copy in the step."""
    from dabench_ir.pipeline import profile_graph

    graph = decoder(layers=4, hidden=256, seq=64)
    one, two = (profile_graph(graph.clone(), "ipu", ProfileOptions(ipus=4, replicas=r)) for r in (1, 2))
    assert two.timeline.step_time_s == pytest.approx(one.timeline.step_time_s)
    assert (two.totals["copies"], two.totals["step_flops"]) == (2, 2 * one.totals["flops"])
    assert two.totals["flops"] == one.totals["flops"]  # the graph's: the node rows' sum
    assert two.totals["achieved_flops_per_s"] == pytest.approx(2 * one.totals["achieved_flops_per_s"])
    assert two.metrics["compute_efficiency"] == pytest.approx(one.metrics["compute_efficiency"])  # on 8 IPUs' peak
    wafer = profile_graph(graph.clone(), "wse", ProfileOptions(wse_mode="pipelined", replicas=3))
    assert wafer.plan.replicas == 3 and wafer.plan.chips == 1
    step = wafer.totals
    assert step["achieved_flops_per_s"] == pytest.approx(3 * step["flops"] / step["time_s"])
    assert wafer.metrics["achieved_flops_per_s"] == pytest.approx(step["achieved_flops_per_s"])
