"""WSE lowering: SRAM demand, fit and weight streaming, region balance, replicas."""

from __future__ import annotations

import pytest

from dabench_ir.emulate import emulate
from dabench_ir.lowering import lower
from dabench_ir.metrics import compute_metrics
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

WSE = load_target("wse")


def _weights(plan) -> float:
    return sum(u.resources["weight_bytes"] for u in plan.units)


def test_doubling_hidden_quadruples_weight_sram():
    opts = ProfileOptions(wse_mode="pipelined")
    small = lower(decoder(layers=2, hidden=256, seq=8), WSE, opts)
    big = lower(decoder(layers=2, hidden=512, seq=8), WSE, opts)
    assert _weights(big) / _weights(small) == pytest.approx(4.0)
    total = big.memory_bytes["sram"] / small.memory_bytes["sram"]
    assert 3.0 < total <= 4.0


def test_growing_hidden_eventually_does_not_fit():
    opts = ProfileOptions(wse_mode="pipelined")
    fits = []
    for hidden in (1024, 2048, 4096, 8192):
        plan = lower(decoder(layers=32, hidden=hidden, seq=8), WSE, opts)
        fits.append(plan.fits)
    assert fits[0] and not fits[-1]
    assert fits == sorted(fits, reverse=True)  # once it stops fitting it never fits again
    failure = plan.failure
    assert failure is not None and failure.needed_bytes > failure.capacity_bytes
    assert failure.capacity_bytes == pytest.approx(WSE.memory("sram").capacity_bytes)


def test_auto_mode_streams_weights_when_pipelined_does_not_fit():
    g = decoder(layers=32, hidden=8192, seq=8)
    plan = lower(g, WSE, ProfileOptions(wse_mode="auto"))
    assert plan.fits and plan.extra["mode"] == "streaming"
    assert {u.kind for u in plan.units} == {"wse_layer"}
    assert "pipelined mode does not fit" in plan.notes[0]
    # streaming moves every weight from external memory once per step
    assert plan.traffic_bytes["memoryx"] > 0


def test_regions_balance_and_hold_their_bytes():
    plan = lower(decoder(layers=2, hidden=256, seq=32), WSE, ProfileOptions(wse_mode="pipelined"))
    pe_sram = WSE.arch_value("pe_sram_bytes")
    for unit in plan.units:
        assert unit.resources["pes"] >= WSE.arch_value("min_region_pes")
        assert unit.resources["pes"] * pe_sram >= unit.resources["sram_bytes"]
        assert unit.resources["width"] * unit.resources["height"] >= unit.resources["pes"]
    assert sum(u.resources["pes"] for u in plan.units) <= WSE.num_units


def test_replicas_multiply_sram_and_auto_fills_the_wafer():
    g = decoder(layers=2, hidden=128, seq=16, batch=8)
    one = lower(g, WSE, ProfileOptions(wse_mode="pipelined", replicas=1))
    two = lower(g, WSE, ProfileOptions(wse_mode="pipelined", replicas=2))
    auto = lower(g, WSE, ProfileOptions(wse_mode="pipelined", replicas="auto"))
    assert two.memory_bytes["sram"] > one.memory_bytes["sram"]
    assert auto.replicas >= 1
    step = {p.replicas: emulate(p, g).step_time_s for p in (one, two, auto)}
    assert step[auto.replicas] <= step[1]
    alloc = [compute_metrics(g, p, emulate(p, g), WSE).allocation_ratio for p in (one, auto)]
    assert alloc[1] >= alloc[0]
