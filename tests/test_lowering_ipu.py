"""IPU lowering: tile SRAM fit, pipeline stages over IPUs, tile utilisation."""

from __future__ import annotations

from dabench_ir.emulate import emulate
from dabench_ir.lowering import lower
from dabench_ir.metrics import compute_metrics
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

IPU = load_target("ipu")


def test_more_layers_eventually_do_not_fit_and_more_ipus_fix_it():
    fits = {}
    for layers in (4, 16, 64):
        fits[layers] = lower(decoder(layers=layers, hidden=1024, seq=8), IPU, ProfileOptions(ipus=1))
    assert fits[4].fits and not fits[64].fits
    failure = fits[64].failure
    assert "tile SRAM" in failure.reason and "--ipus" in failure.reason and "IPU 0" in failure.reason
    assert failure.needed_bytes > failure.capacity_bytes == IPU.memory("sram").capacity_bytes
    split = lower(decoder(layers=64, hidden=1024, seq=8), IPU, ProfileOptions(ipus=4))
    assert split.fits and len(split.units) == 4


def test_stages_are_contiguous_layers():
    g = decoder(layers=6, hidden=64, seq=8)
    plan = lower(g, IPU, ProfileOptions(ipus=3))
    order = {n.name: i for i, n in enumerate(g.nodes)}
    last = -1
    for unit in plan.units:
        idx = [order[n] for n in unit.nodes]
        assert idx == list(range(idx[0], idx[0] + len(idx))) and idx[0] == last + 1
        last = idx[-1]
    layers = [{g.node(n).layer for n in u.nodes} for u in plan.units]
    assert all(len(s) == 2 for s in layers)  # balanced: two layers per IPU


def test_pipeline_overlaps_micro_batches_and_reports_tiles():
    g = decoder(layers=4, hidden=128, seq=16, batch=8)
    plan = lower(g, IPU, ProfileOptions(ipus=2))
    timeline = emulate(plan, g)
    busy = [timeline.unit_busy_s[u.id] for u in plan.units]
    assert timeline.makespan_s < sum(busy)  # stages overlap across micro-batches
    assert timeline.step_time_s == max(busy)  # the most loaded IPU sets throughput
    metrics = compute_metrics(g, plan, timeline, IPU)
    for util in metrics.extra["tile_utilisation"]:
        assert 0 < util <= 1
    assert 0 < metrics.allocation_ratio <= 1
