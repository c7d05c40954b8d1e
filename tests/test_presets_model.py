"""A preset name is a MODEL for profile, scale and study: its weight-free export, cached per machine.

The preset here is a tiny one added for the test (the published ones take seconds to export);
the figures are checked against `ModelConfig.matmul_flops`, the closed-form count.
"""

from __future__ import annotations

import json

import pytest

from dabench_ir.cli import main
from dabench_ir.models import PRESETS, ModelConfig

TINY = {
    "family": "gpt2",
    "layers": 2,
    "hidden": 64,
    "heads": 2,
    "ffn": 256,
    "vocab": 128,
    "max_positions": 64,
    "seq": 32,
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # one export for the file's tests


@pytest.fixture
def tiny(monkeypatch, tmp_path, cache):
    pytest.importorskip("torch")
    monkeypatch.setitem(PRESETS, "tiny-test", TINY)
    monkeypatch.setenv("DABENCH_IR_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _flops(**shape) -> int:
    return ModelConfig(**{**TINY, **shape}).matmul_flops()


def test_profile_a_preset_at_its_shape_and_rebound(tiny, cache, capsys, monkeypatch):
    assert main(["profile", "tiny-test", "-t", "h100", "-q", "--json", "a.json"]) == 0
    a = json.loads((tiny / "a.json").read_text())
    per_layer = 2 * 32 * (4 * 64 * 64 + 2 * 64 * 256) + 4 * 32 * 32 * 64  # projections, MLP, attention
    assert a["totals"]["contraction_flops"] == _flops(batch=1, seq=32) == 2 * per_layer + 2 * 32 * 64 * 128
    assert a["config"]["dims"] == {"batch": 1, "seq": 32} and a["config"]["run"]["samples"]["source"] == "model"
    assert a["model"]["preset"] == "tiny-test"
    assert len(list(cache.glob("presets/*/tiny-test.onnx"))) == 1

    import dabench_ir.models.export as export

    monkeypatch.setattr(export, "export_onnx", lambda *a, **k: pytest.fail("the cached export was exported again"))
    assert main(["profile", "tiny-test", "-t", "h100", "-q", "--batch", "3", "--seq", "8", "--json", "b.json"]) == 0
    b = json.loads((tiny / "b.json").read_text())
    assert b["totals"]["contraction_flops"] == _flops(batch=3, seq=8)
    assert b["config"]["dims"] == {"batch": 3, "seq": 8}


def test_scale_and_study_take_a_preset(tiny, capsys):
    assert (
        main(
            [
                "scale",
                "tiny-test",
                "-t",
                "h100",
                "--chips",
                "1,2",
                "--strategy",
                "dp",
                "--batch",
                "1,2",
                "--json",
                "s.json",
                "-q",
            ]
        )
        == 0
    )
    points = json.loads((tiny / "s.json").read_text())["points"]
    assert [(p["chips"], p["batch"]) for p in points] == [(1, 1), (2, 2), (1, 2), (2, 4)]
    assert main(["study", "tiny-test", "--pipeline", "rdu-O3", "-t", "rdu", "-q", "--json", "st.json"]) == 0
    study = json.loads((tiny / "st.json").read_text())
    assert [r["pipeline"] for r in study["runs"]] == ["rdu-O3"] and study["runs"][0]["config"]["batch"] == 1


@pytest.mark.parametrize(
    "command", [["profile"], ["scale", "-t", "h100", "--strategy", "dp"], ["study", "--pipeline", "rdu-O3"]]
)
def test_neither_file_nor_preset_is_one_line_naming_close_presets(command, capsys):
    assert main([command[0], "gpt2-smal", *command[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "dabench-ir: error: MODEL gpt2-smal: no such file, and not a preset (close presets: gpt2-small, "
        "gpt2-xl, gpt2-large, gpt2)"
    ]
    assert main([command[0], "gone.onnx", *command[1:]]) == 2
    assert capsys.readouterr().err.strip().endswith("gone.onnx: no such file")
