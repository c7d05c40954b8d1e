"""Sweep specs: axes, table-valued axes, listed points, normalisation and errors (no torch)."""

from __future__ import annotations

import pytest

from dabench_ir.cli import main
from dabench_ir.errors import UserError
from dabench_ir.sweep import bundled_specs, load_spec, parse_spec
from dabench_ir.sweep.runner import point_key


def test_cross_product_with_table_values():
    spec = parse_spec(
        {
            "defaults": {"hidden": 64, "heads": 4, "seq": 8},
            "axes": {"layers": [1, 2], "target": ["wse", {"target": "rdu", "opt_level": "O0"}, "ipu"]},
        }
    )
    assert len(spec.points) == 6
    rdu = [p for p in spec.points if p["target"] == "rdu"]
    assert {p["opt_level"] for p in rdu} == {"O0"}
    assert all("opt_level" not in p.params for p in spec.points if p["target"] != "rdu")
    assert spec.varied() == {"layers", "target", "opt_level"}


def test_listed_points_and_dedup():
    spec = parse_spec(
        {
            "axes": {"chips": [1, 2], "strategy": ["dp", "tp"]},
            "point": [{"chips": 4, "strategy": "pp", "layers": 3}],
        }
    )
    # chips = 1 has no strategy: its two copies collapse into one point
    assert sorted((p["chips"], p["strategy"]) for p in spec.points) == [(1, None), (2, "dp"), (2, "tp"), (4, "pp")]
    assert spec.points[-1]["layers"] == 3


def test_heads_default_and_preset():
    (point,) = parse_spec({"point": [{"hidden": 1600}]}).points
    assert point["heads"] == 25
    (preset,) = parse_spec({"point": [{"preset": "gpt2-medium", "layers": 2}]}).points
    assert (preset["hidden"], preset["heads"], preset["layers"]) == (1024, 16, 2)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"axes": {"layer": [1]}}, "'layer'"),
        ({"axes": {"layers": [0]}}, "layers must be a positive integer"),
        ({"axes": {"precision": ["fp4"]}}, "precision"),
        ({"axes": {"layers": 3}}, "non-empty list"),
        ({"axes": {"target": [{"opt_level": "O1"}]}}, "must set target"),
        ({"defaults": {"nope": 1}, "point": [{}]}, "'nope'"),
        ({"axis": {}}, "top-level key 'axis'"),
        ({}, "no points"),
        ({"point": [{"chips": 2}]}, "needs a strategy"),
        ({"point": [{"target": "tpu9000"}]}, "unknown target 'tpu9000'; known targets:"),
        ({"point": [{"replicas": "many"}]}, "replicas = 'many': expected a positive integer"),
        ({"point": [{"family": "bert"}]}, "family = 'bert'; expected one of gpt2, llama"),
    ],
)
def test_bad_specs_name_the_problem(data, needle):
    with pytest.raises(UserError, match=None) as info:
        parse_spec(data)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_bundled_grids():
    assert {"level1", "level2"} <= set(bundled_specs())
    level1 = load_spec("level1")
    assert len(level1.points) == 14 * 6 * 5 == 420
    assert {(p["target"], p["opt_level"]) for p in level1.points} == {
        ("wse", None),
        ("rdu", "O0"),
        ("rdu", "O1"),
        ("rdu", "O3"),
        ("ipu", None),
    }
    level2 = load_spec("level2")
    assert {p["chips"] for p in level2.points} == {1, 2, 4, 8}
    assert {p["precision"] for p in level2.points} == {"fp32", "fp16", "bf16", "mixed"}
    assert {p["batch"] for p in level2.points} == {1, 8, 32, 128, 256, 512}
    # each target with the strategy it supports: 3 targets x 4 chip counts x 6 batches x 4 precisions
    assert len(level2.points) == 3 * 4 * 6 * 4
    assert {(p["target"], p.params.get("strategy")) for p in level2.points if p["chips"] > 1} == {
        ("wse", "dp"),
        ("rdu", "tp"),
        ("ipu", "pp"),
    }


def test_point_key_depends_on_params_only():
    a, b = parse_spec({"axes": {"layers": [1, 2]}}).points
    assert point_key(a.params) != point_key(b.params)
    assert point_key(a.params) == point_key(dict(reversed(list(a.params.items()))))


def test_cli_list_and_errors(tmp_path, capsys):
    assert main(["sweep", "--list"]) == 0
    assert "level1" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("[axes]\nlayerz = [1]\n")
    assert main(["sweep", str(bad), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "layerz" in err and err.count("\n") == 1
    assert main(["sweep", "no-such-spec", "-o", str(tmp_path / "out")]) == 2
    assert main(["sweep", "level1", "--dry-run"]) == 0
    assert "420 points" in capsys.readouterr().out
