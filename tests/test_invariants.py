"""Invariants every plan keeps, fitting or not: shares in (0, 1], never above peak."""

from __future__ import annotations

import pytest

from dabench_ir.emulate import check_dependencies, emulate
from dabench_ir.lowering import lower
from dabench_ir.metrics import compute_metrics
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

SIZES = [(1, 64, 16), (4, 256, 64), (12, 1024, 256), (48, 2048, 512)]  # the last fits nowhere on chip


@pytest.mark.parametrize("target", ["wse", "rdu", "ipu", "a100", "h100"])
@pytest.mark.parametrize("options", [{}, {"wse_mode": "pipelined"}, {"opt_level": "O3"}, {"batch": 4}])
def test_metrics_stay_physical(target, options):
    tgt = load_target(target)
    for layers, hidden, seq in SIZES:
        graph = decoder(layers=layers, hidden=hidden, seq=seq)
        plan = lower(graph, tgt, ProfileOptions(**options))
        timeline = emulate(plan, graph)
        m = compute_metrics(graph, plan, timeline, tgt)
        where = f"{target} {options} L{layers} h{hidden} fits={plan.fits}"
        assert 0 < m.allocation_ratio <= 1 + 1e-9, where
        assert 0 < m.load_imbalance <= 1 + 1e-9, where
        assert 0 < m.compute_efficiency <= 1 + 1e-9, where
        assert timeline.step_time_s > 0, where
        assert not check_dependencies(timeline, graph), where
        if not plan.fits:
            assert plan.failure.needed_bytes > plan.failure.capacity_bytes, where
