"""`dabench-ir demo`: the report folder, end to end (slow) and with a failing target (fast)."""

from __future__ import annotations

import csv
import json

import pytest

from dabench_ir.cli import main
from dabench_ir.commands.demo import run_demo
from tests.test_report_helpers import load_schema, validate

pytest.importorskip("matplotlib")


def test_demo_records_a_failing_target_and_goes_on(tiny_matmul_path, tmp_path):
    out = tmp_path / "rep"
    result = run_demo(out, targets=["rdu", "no-such-chip"], model=tiny_matmul_path, measure=False, validation=False)
    assert list(result.reports) == ["rdu"]
    assert "no-such-chip" in result.errors and "unknown target" in result.errors["no-such-chip"]
    assert "unknown target" in (out / "no-such-chip.error.txt").read_text()
    for name in ("index.html", "rdu.html", "rdu.json", "compare.csv", "compare.json"):
        assert (out / name).is_file(), name
    index = (out / "index.html").read_text()
    assert 'href="rdu.html"' in index and "Failed (1)" in index and "no-such-chip" in index
    assert validate(json.loads((out / "rdu.json").read_text()), load_schema()) == []


def test_demo_quiet_with_unknown_target_exits_2(tmp_path, capsys):
    assert main(["demo", "-q", "-o", str(tmp_path / "x"), "--target", "rdu,no-such-chip"]) == 2
    err = capsys.readouterr().err
    assert "--target no-such-chip" in err and not (tmp_path / "x").exists()


def test_demo_rejects_empty_targets(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path / "x"), "--target", ","]) == 2
    assert "--target" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.torch
def test_demo_end_to_end(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "dabench-report"
    assert main(["demo", "-o", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [str((out / "index.html").resolve())]
    for target in ("cpu", "wse", "rdu", "ipu"):
        assert (out / f"{target}.html").is_file() and (out / f"{target}.json").is_file(), target
        data = json.loads((out / f"{target}.json").read_text())
        assert validate(data, load_schema()) == []
        assert data["totals"]["time_s"] > 0
        assert (out / "plots" / f"{target}-roofline.png").is_file()
        assert (out / "plots" / f"{target}-layers.svg").is_file()
    # the cpu target was measured too
    assert (out / "plots" / "cpu-predicted-vs-measured.png").is_file()
    cpu = json.loads((out / "cpu.json").read_text())
    assert any(n["measured_time_s"] for n in cpu["nodes"])
    with (out / "compare.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["target"] for r in rows] == ["wse2", "sn30", "bow", "cpu"]
    # GPT-2 small on the dataflow chips, the 2-layer model on the host; roles and why in every report
    wse = json.loads((out / "wse.json").read_text())
    assert wse["model"]["layers"] == 12 and cpu["model"]["layers"] == 2
    assert any(r["role"] == "layers.*.mlp.fc_in" for r in wse["roles"]) and wse["why"]
    # the headline validation figure is the cross-validated one (leave one source out), all points beside it
    errors = wse["extra"]["validation_abs_error"]
    assert errors["cross_validated_compared"] > 0 and errors["cross_validated_median"] > 0
    assert errors["all_points_median"] > 0
    assert all(r["gops_per_w"] for r in rows)
    index = (out / "index.html").read_text()
    assert "Side by side" in index
    assert (out / "plots" / "compare.png").is_file() and (out / "plots" / "compare-cpu.png").is_file()  # apart
    assert "Throughput and efficiency: gpt2 (12 layers, 124 M params)" in index
    assert all(f'href="{t}.html"' in index for t in ("cpu", "wse", "rdu", "ipu"))


def test_a_knob_the_demo_applies_is_in_the_table_and_the_html(monkeypatch):
    """The demo's refit is never silent: the side-by-side table and its HTML carry the change."""
    from pathlib import Path
    from types import SimpleNamespace

    from dabench_ir.commands.demo import DemoResult, _side_by_side, _side_by_side_html, render_side_by_side

    def fake(name: str, extra: dict) -> SimpleNamespace:
        return SimpleNamespace(
            target={"name": name},
            model={"name": "m", "layers": 1},
            totals={},
            metrics={},
            extra=extra,
            why=[],
            measured_timeline=None,
            nodes=[],
            timeline=None,
            plan=None,
        )

    result = DemoResult(folder=Path("."), index=Path("index.html"))
    result.reports = {
        "ipu": fake(
            "bow",
            {
                "demo_change": "--matmul-proportion 0.3",
                "demo_note": "placed with --matmul-proportion 0.3: with the defaults it does not fit (x)",
            },
        ),
        "rdu": fake("sn30", {}),
    }
    from dabench_ir.report import attribution

    monkeypatch.setattr(attribution, "role_rows", lambda _r: [])  # the fixed rows are what is tested
    _headers, rows = _side_by_side(result)
    placed = next(r for r in rows if r[0] == "placed with")
    assert placed[1:] == ["--matmul-proportion 0.3", "defaults"]
    assert "placed with --matmul-proportion 0.3" in render_side_by_side(result)
    assert "Not the defaults" in _side_by_side_html(result) and "--matmul-proportion 0.3" in _side_by_side_html(result)


def test_throughput_charts_compare_one_model_at_a_time(monkeypatch, tmp_path):
    """The 2-layer host model is never a bar beside GPT-2: one chart per model, each named."""
    from types import SimpleNamespace

    from dabench_ir.commands.demo import DemoResult, _charts_html
    from dabench_ir.report import plots

    gpt2 = {"name": "gpt2-small", "layers": 12, "params": 124_000_000}
    small = {"name": "host-model", "layers": 2, "params": 500_000}
    result = DemoResult(folder=tmp_path, index=tmp_path / "index.html")
    result.reports = {s: SimpleNamespace(model=m) for s, m in (("wse", gpt2), ("cpu", small), ("rdu", gpt2))}
    result.rows = [
        {"target": t, "throughput_samples_per_s": x, "compute_efficiency": 0.5, "dominant_bound": "compute"}
        for t, x in (("wse2", 100.0), ("cpu", 2300.0), ("sn30", 4.0))
    ]
    charted = []
    real = plots.compare_figure
    monkeypatch.setattr(plots, "compare_figure", lambda rows: charted.append([r["target"] for r in rows]) or real(rows))
    html = _charts_html(result, list(result.reports), tmp_path / "plots")
    assert charted == [["wse2", "sn30"], ["cpu"]]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "compare-cpu.png",
        "compare-cpu.svg",
        "compare.png",
        "compare.svg",
    ]
    first, second = html.split("</section>")[:2]
    assert "gpt2-small (12 layers, 124 M params)" in first and "on wse, rdu" in first
    assert "host-model (2 layers, 500 k params)" in second and "not comparable" in second


@pytest.mark.slow  # two whole-target validations with their cross-validation folds
def test_the_demo_headlines_the_cross_validated_error_validate_prints():
    """The demo's validation row is the figure `dabench-ir validate` prints as cross-validated (leave
    one source out), not the median over all points, which includes the points parameters were
    fitted to: asked through both users, the same number."""
    from types import SimpleNamespace

    from dabench_ir.commands.demo import _validation_figures
    from dabench_ir.targets import load_target
    from dabench_ir.validate import load_catalog, run_validation
    from dabench_ir.validate.crossval import cross_validate

    validation = run_validation(load_catalog(), target="sn30")
    cv = cross_validate(validation).targets["sn30"].stats()
    errors = _validation_figures({"rdu": SimpleNamespace(target_obj=load_target("sn30"))}, lambda _m: None)["rdu"]
    assert errors.cross_validated == cv["median_abs_error"] and errors.compared == cv["compared"] > 0
    assert errors.all_points == validation.summary()["sn30"]["median_abs_error"]
    assert errors.cross_validated != errors.all_points  # two figures, not one shown twice
