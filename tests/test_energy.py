"""Energy per node and fair cross-node normalisation."""

from __future__ import annotations

import pytest

from dabench_ir.cli import main
from dabench_ir.emulate import emulate
from dabench_ir.energy import energy_model, load_catalog, node_energies, normalize, scale_factors
from dabench_ir.errors import UserError
from dabench_ir.lowering import lower
from dabench_ir.options import ProfileOptions
from dabench_ir.report.build import build_report
from dabench_ir.run import resolve
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder


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


@pytest.mark.parametrize("name", ["wse", "rdu", "ipu", "h100"])
def test_energy_total_is_the_sum_of_node_energies(name):
    graph, plan, timeline, target = _emulated(name)
    report = build_report(graph, run=resolve(graph, target), plan=plan, timeline=timeline)
    per_node = [n.energy_j for n in report.nodes if n.energy_j is not None]
    assert per_node and all(e > 0 for e in per_node)
    assert report.totals["energy_j"] == pytest.approx(sum(per_node))
    # and static energy is exactly the static power over the step
    direct = sum(node_energies(graph, plan, timeline, target).values())
    assert direct == pytest.approx(report.totals["energy_j"])
    static = energy_model(target).static_watts * timeline.step_time_s
    assert report.totals["energy_j"] > static


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
