"""Qualitative behaviour a held-out catalogue checks, on small closed-form graphs (fast).

The emulated WSE-2, SN30 and Bow models were fitted to a few published points; a second set
of measurements on other sizes and settings checks that throughput, allocation and balance
move the way the machines do. These properties hold whatever the fitted values are.
"""

from __future__ import annotations

import math

import pytest

from dabench_ir.options import ProfileOptions
from dabench_ir.passes.training import TrainingPass
from dabench_ir.place import place
from dabench_ir.scaling import scale, split_for_tp
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

_SN30 = {"opt_level": "O3", "tiles": 4, "resource_scale": 0.8}


def _train(g, recompute: bool = False):
    TrainingPass(recompute=recompute)(g)
    return g


def _step(graph, target: str, **opts) -> float:
    plan, timeline, metrics = place(graph, load_target(target), ProfileOptions(mode="train", **opts))
    assert plan.fits
    assert math.isfinite(timeline.step_time_s) and timeline.step_time_s > 0
    assert 0 < metrics.load_imbalance <= 1 + 1e-9
    assert 0 <= metrics.allocation_ratio <= 1 + 1e-9
    return timeline.step_time_s


@pytest.mark.parametrize("target,opts", [("sn30", _SN30), ("wse2", {"wse_mode": "streaming"}), ("bow", {"ipus": 2})])
def test_step_time_grows_with_layers(target, opts):
    times = [_step(_train(decoder(layers=n, hidden=256, seq=64, batch=4)), target, **opts) for n in (2, 4, 8)]
    assert times[0] < times[1] < times[2]


def test_sn30_o3_faster_than_o0():
    g = _train(decoder(layers=2, hidden=256, seq=64, batch=4))
    assert _step(g, "sn30", **{**_SN30, "opt_level": "O3"}) < _step(g, "sn30", **{**_SN30, "opt_level": "O0"})


def test_tp_share_splits_the_training_phases_and_the_activations_inside_a_module():
    """Training lowerings cost each phase from its own cost (forward, backward): TP splits those
    too, and the module's internal activations (scores, the MLP's 4h) are a chip's share."""
    from dabench_ir.passes import meta
    from dabench_ir.passes.training import BACKWARD_COST, FORWARD_COST

    g = _train(decoder(layers=1, hidden=64, seq=16, heads=4))
    share, _ = split_for_tp(g, 2)
    for key in (FORWARD_COST, BACKWARD_COST):
        before = sum(n.meta[key].contraction_flops for n in g.nodes if key in n.meta and ".mlp" in n.scope)
        after = sum(n.meta[key].contraction_flops for n in share.nodes if key in n.meta and ".mlp" in n.scope)
        assert before > 0 and after == before // 2
    scores = next(n for n in g.nodes if n.op_type == "Softmax" and meta.get_cost(n) is not None).outputs[0]
    assert share.type_of(scores).nbytes() == g.type_of(scores).nbytes() // 2


def test_sn30_tensor_parallel_training_halves_the_device_work_and_pays_more_across_nodes():
    g = _train(decoder(layers=2, hidden=512, seq=128, batch=8, heads=8))
    pts = scale(g, load_target("sn30"), [1, 2, 8, 16], "tp", ProfileOptions(mode="train", **_SN30)).points
    compute = [p.compute_time_s for p in pts]
    assert compute[1] < compute[0]  # a chip does half the split work
    eff = [p.scaling_efficiency for p in pts]
    assert eff == sorted(eff, reverse=True)
    assert pts[3].comm_time_s > pts[2].comm_time_s  # crossing the node boundary costs more


def _fits(graph, target: str, **opts) -> bool:
    return bool(place(graph, load_target(target), ProfileOptions(mode="train", **opts))[0].fits)


def _monotone_fit(verdicts: list[bool]) -> bool:
    """True, ..., True, False, ..., False: once a model stops fitting, a deeper one does not fit."""
    return verdicts == sorted(verdicts, reverse=True)


def test_ipu_fit_boundary_is_monotone_in_layers_and_moves_out_with_ipus():
    opts = {"precision": "mixed", "recompute": True, "optimizer_state": "offchip"}
    depth = (1, 2, 4, 8, 16, 32)
    # batch 8: eight one-sample micro-batches, enough for the 7 training stages of 4 IPUs (PopART's rule)
    one = [
        _fits(_train(decoder(layers=n, hidden=768, seq=1024, heads=12, batch=8), True), "bow", ipus=1, **opts)
        for n in depth
    ]
    four = [
        _fits(_train(decoder(layers=n, hidden=768, seq=1024, heads=12, batch=8), True), "bow", ipus=4, **opts)
        for n in depth
    ]
    assert _monotone_fit(one) and _monotone_fit(four)
    assert one[0] and not one[-1]
    assert sum(four) > sum(one)


def test_wse_pipelined_fit_limit_is_monotone_in_layers():
    verdicts = [
        _fits(
            _train(decoder(layers=n, hidden=2048, seq=1024, heads=16)), "wse2", wse_mode="pipelined", precision="mixed"
        )
        for n in (1, 4, 16, 64)
    ]
    assert _monotone_fit(verdicts) and verdicts[0] and not verdicts[-1]


def test_wse_compile_report_rate_is_the_steady_state_without_per_step_costs():
    """A compile report's compute-limited rate has no batch: the tool states the slowest kernel's
    rate beside the step's throughput, which pays the optimizer once per step."""
    g = _train(decoder(layers=2, hidden=256, seq=64, batch=1))
    plan, timeline, _ = place(g, load_target("wse2"), ProfileOptions(mode="train", wse_mode="pipelined"))
    io = next(u for u in plan.units if u.kind == "wse_io")
    rate = io.stats.compute_samples_per_s
    assert rate > 0 and rate >= 1 / timeline.step_time_s * (1 - 1e-9)


def test_wse_pipelined_pe_use_grows_with_depth_while_a_fixed_ceiling_binds():
    """A shallow model runs at its kernels' per-token ceiling: the compiler gives each kernel just
    enough PEs to keep pace (balance stays near 1) and leaves PEs idle, so active PEs grow with
    depth until the wafer's budget binds (compile reports: active PEs rise with depth)."""
    alloc, li = [], []
    for n in (1, 4, 32):
        g = _train(decoder(layers=n, hidden=768, seq=1024, heads=12))
        plan = place(g, load_target("wse2"), ProfileOptions(mode="train", wse_mode="pipelined"))[0]
        assert plan.fits
        alloc.append(plan.extra["active_pes_fraction"])
        li.append(plan.extra["load_imbalance_pe_weighted"])
    assert alloc[0] < alloc[1] <= alloc[2] <= load_target("wse2").arch_value("max_active_fraction") + 1e-9
    assert li[0] > 0.95
