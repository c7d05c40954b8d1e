"""RDU lowering: section counts and DDR traffic by opt level, resources, reconfiguration."""

from __future__ import annotations

from itertools import pairwise

import pytest

from dabench_ir.emulate import emulate
from dabench_ir.lowering import lower
from dabench_ir.lowering._common import module_key
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

RDU = load_target("rdu")


def _plans(g):
    return {o: lower(g, RDU, ProfileOptions(opt_level=o)) for o in ("O0", "O1", "O3")}


def test_fusion_reduces_sections_and_ddr_traffic():
    g = decoder(layers=3, hidden=128, seq=16)
    plans = _plans(g)
    n = {o: len(p.units) for o, p in plans.items()}
    ddr = {o: p.traffic_bytes["ddr"] for o, p in plans.items()}
    assert n["O0"] >= n["O1"] >= n["O3"]
    assert n["O0"] > n["O3"]
    assert ddr["O0"] >= ddr["O1"] >= ddr["O3"]
    assert ddr["O0"] > ddr["O3"]
    # weights cross DDR at every opt level
    weights = sum(v.type.nbytes() for v in g.weights())
    assert ddr["O3"] >= weights


def test_o0_is_about_one_operator_per_section():
    g = decoder(layers=1, hidden=64, seq=8)
    plan = lower(g, RDU, ProfileOptions(opt_level="O0"))
    assert len(plan.units) == len(g.nodes)


def test_o1_sections_stay_inside_one_module():
    g = decoder(layers=2, hidden=64, seq=8)
    plan = lower(g, RDU, ProfileOptions(opt_level="O1"))
    for unit in plan.units:
        assert len({module_key(g.node(n)) for n in unit.nodes}) == 1


def test_sections_respect_pcu_and_pmu_limits():
    g = decoder(layers=8, hidden=256, seq=64)
    plan = lower(g, RDU, ProfileOptions(opt_level="O3"))
    for unit in plan.units:
        assert unit.resources["pcus"] <= RDU.arch_value("pcus")
        assert unit.resources["pmus"] <= RDU.arch_value("pmus")
        assert 0 < unit.allocation <= 1


def test_sections_run_one_after_another_with_reconfiguration():
    g = decoder(layers=1, hidden=64, seq=8)
    plan = lower(g, RDU, ProfileOptions(opt_level="O1"))
    timeline = emulate(plan, g)
    spans = [timeline.unit_spans[u.id] for u in plan.units]
    reconfig = RDU.overhead("section_reconfig_s")
    for (_, end), (start, _) in pairwise(spans):
        assert start >= end + reconfig * (1 - 1e-9)
    assert timeline.overheads_s["section_reconfig"] == pytest.approx(reconfig * len(plan.units))
    assert timeline.step_time_s >= reconfig * len(plan.units)
