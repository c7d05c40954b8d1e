"""`compare_reports` / `dabench-ir compare`: rows match the reports, from objects or from JSON."""

from __future__ import annotations

import csv
import json

import pytest

from dabench_ir.cli import main
from dabench_ir.report.compare import (
    COMPARE_COLUMNS,
    compare_reports,
    dominant_bound,
    render_compare,
    write_compare_csv,
    write_compare_json,
)
from tests.conftest import report_flags
from tests.test_report_helpers import make_report


def _two_reports():
    a = make_report()
    b = make_report()
    b.target = {"name": "otherchip", "kind": "ipu"}
    b.target_obj = None
    b.metrics = {"allocation_ratio": 0.5, "load_imbalance": 1.0, "compute_efficiency": 0.3}
    for n in b.nodes:
        if n.bound == "compute":
            n.bound = "memory"
    b.fits = False
    b.failure = {"reason": "weights exceed SRAM", "needed_bytes": 2e9, "capacity_bytes": 1e9}
    return a, b


def test_rows_match_reports():
    a, b = _two_reports()
    rows = compare_reports([a, b])
    assert [r["target"] for r in rows] == ["fakechip", "otherchip"]
    assert {k for k in rows[0] if not k.startswith("_")} == set(COMPARE_COLUMNS)
    r = rows[0]
    assert r["time_s"] == pytest.approx(290e-6)
    assert r["throughput_samples_per_s"] == pytest.approx(2 / 290e-6)
    assert (r["allocation_ratio"], r["load_imbalance"], r["compute_efficiency"]) == (0.25, 0.8, 0.1)
    assert r["fits"] is True and r["failure"] is None
    assert r["dominant_bound"] == "compute" and r["dominant_bound_share"] == pytest.approx(266 / 290)
    # GOP/s/W: achieved FLOP/s over the live target's 500 W
    assert r["power_w"] == 500.0
    assert r["gops_per_w"] == pytest.approx(a.totals["achieved_flops_per_s"] / 500 / 1e9)
    assert rows[1]["dominant_bound"] == "memory" and rows[1]["dominant_bound_share"] == pytest.approx(1.0)
    assert rows[1]["fits"] is False and rows[1]["failure"] == "weights exceed SRAM"
    assert rows[1]["gops_per_w"] is None  # unknown target, no power in the report


def test_dict_and_object_give_the_same_row():
    a, _ = _two_reports()
    a.extra["target_power_w"] = 500.0
    from_dict = compare_reports([json.loads(a.to_json())])[0]
    from_obj = compare_reports([a])[0]
    assert from_dict == from_obj


def test_power_from_metrics_or_builtin_target():
    data = json.loads(make_report().to_json())
    data["metrics"]["target_power_w"] = 100.0
    assert compare_reports([data])[0]["power_w"] == 100.0
    from dabench_ir.targets import load_target

    data = json.loads(make_report().to_json())
    data["target"] = {"name": "rdu", "kind": "rdu"}
    row = compare_reports([data])[0]
    assert row["power_w"] == load_target("rdu").watts


def test_dominant_bound_without_times():
    assert dominant_bound([{"time_s": None, "bound": None}]) == (None, None)


def test_render_and_writers(tmp_path):
    rows = compare_reports(list(_two_reports()))
    text = render_compare(rows)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["model", "target", "run", "time"]
    assert "fakechip" in lines[2] and "compute (91.7%)" in lines[2] and "290 µs" in lines[2]
    assert "otherchip" in lines[3] and " NO " in lines[3] and lines[3].rstrip().endswith("-")
    assert "does not fit: weights exceed SRAM" in text
    with write_compare_csv(rows, tmp_path / "c.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [t["target"] for t in table] == ["fakechip", "otherchip"]
    assert float(table[0]["time_s"]) == pytest.approx(290e-6) and table[1]["gops_per_w"] == ""
    doc = json.loads(write_compare_json(rows, tmp_path / "c.json").read_text())
    assert doc["schema"] == "dabench-ir/compare/v1" and doc["rows"][1]["fits"] is False
    assert render_compare([]) == "no reports to compare"


def test_cli_compare(tmp_path, capsys):
    a, b = _two_reports()
    pa, pb = a.write_json(tmp_path / "a.json"), b.write_json(tmp_path / "b.json")
    out = tmp_path / "cmp"
    argv = ["compare", str(pa), str(pb), *report_flags(out)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "fakechip" in stdout and "otherchip" in stdout and "wrote" in stdout
    assert (tmp_path / "cmp.csv").is_file() and (tmp_path / "cmp.json").is_file()
    html = (tmp_path / "cmp.html").read_text()
    assert "Targets side by side" in html and pa.resolve().as_uri() in html


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not json at all", "is not JSON"),
        ('{"schema": "something/else"}', "is not a dabench-ir report"),
        ("[1, 2]", "is not a dabench-ir report"),
        ('{"schema": "dabench-ir/report/v1"}', "has no 'model' field"),
    ],
)
def test_cli_compare_rejects_non_reports(tmp_path, capsys, content, expected):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["compare", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1


def test_cli_compare_missing_file(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.json")]) == 2
    assert "cannot read report" in capsys.readouterr().err


def test_a_report_that_does_not_fit_carries_the_change_that_fits_it():
    """The fitting search's change (the report's "(fit)" why line) is the compare row's ``fits_with``
    and ends the text table's failure line; a report without one has None."""
    from dabench_ir.advice import advise
    from dabench_ir.options import ProfileOptions
    from dabench_ir.pipeline import profile_graph
    from dabench_ir.report.why import explain
    from tests.lowering_graphs import decoder

    unfit = profile_graph(decoder(layers=24, hidden=2048, seq=128), "ipu", ProfileOptions())
    advise(unfit)
    explain(unfit)
    fits = profile_graph(decoder(layers=2, hidden=64), "ipu", ProfileOptions())
    rows = compare_reports([unfit, fits])
    assert [r["fits_with"] for r in rows] == [None, "--ipus 5"]  # those that do not fit last
    assert render_compare(rows).endswith("; --ipus 5 makes it fit")


def test_a_multi_chip_report_compares_at_every_devices_power():
    """A multi-chip report's ``metrics`` are one chip's (named in ``metrics.per_chip``); its FLOP/s per
    watt is the whole step's over every device's power, as its own totals say, not over one chip's."""
    from dabench_ir import api

    one, eight = (api.profile("gpt2-small", "h100", mode="train", chips=n, strategy="dp") for n in (1, 8))
    rows = compare_reports([json.loads(one.to_json()), json.loads(eight.to_json())])
    data = json.loads(eight.to_json())
    assert "target_power_w" in data["metrics"]["per_chip"] and data["metrics"]["target_power_w"] == 700.0
    assert rows[1]["power_w"] == data["totals"]["target_power_w"] == 8 * 700.0
    assert rows[1]["gops_per_w"] == pytest.approx(data["totals"]["gops_per_w"], rel=1e-12)
    assert rows[1]["label"] == "gpt2-small@h100 b8 x8 dp" and rows[0]["label"] == "gpt2-small@h100 b1 x1"


def test_a_diff_whose_baseline_does_not_fit_keeps_before_and_after_apart():
    """GPT-2 small at batch 4 in fp32 does not fit one Bow IPU; fp16 does. The compare rows put a
    run that does not fit last, and the diff read the second row as "after": the run was labelled
    fp32 with fp16's time, its baseline fp16."""
    from dabench_ir import api
    from dabench_ir.study.run import study_run

    before = api.profile("gpt2-small", "bow", batch=4, precision="fp32").to_dict()
    after = api.profile("gpt2-small", "bow", batch=4, precision="fp16").to_dict()
    assert before["fits"] is False and after["fits"] is True
    run = study_run(before, after)
    assert run["label"].endswith("fp16") and run["baseline_label"].endswith("fp32")
    assert run["config"]["precision"] == "fp16"


def test_reports_of_different_sequence_lengths_are_different_models():
    """A step at seq 512 does four times a seq-128 step's tokens: diff compared their steps as one
    model's (0.73x) under identical labels; compare could not tell its rows apart."""
    from dabench_ir import api
    from dabench_ir.report.compare import compare_reports, model_differences

    short, long = (api.profile("gpt2-small", "h100", batch=4, seq=s).to_dict() for s in (128, 512))
    assert model_differences(short, long) == ["seq 128 vs 512"]
    assert [r["label"] for r in compare_reports([short, long])] == ["gpt2-small@h100 seq128", "gpt2-small@h100 seq512"]


def test_a_diff_of_reports_no_study_wrote_pairs_a_fusion_with_the_node_it_is_named_after():
    """ORT names a fused node ``<source>/<fusion>``: the study's provenance reads that name, the
    report-only one (``diff`` of two profiles) gave every unclaimed node of a module to one node, so a
    q projection's fusion "replaced" the k and v projections too (20.1 -> 4.02 us)."""
    from dabench_ir.study.diff import name_provenance

    def node(name, op, op_class="contraction"):
        return {"name": name, "op_type": op, "scope": "layers.0.attn", "layer": 0, "op_class": op_class}

    before = [node("q", "MatMul"), node("k", "MatMul"), node("v", "MatMul")]
    after = [node("q/MatMulAddFusion", "Gemm"), node("k/MatMulAddFusion", "Gemm"), node("v/MatMulAddFusion", "Gemm")]
    prov = name_provenance(before, after)
    assert [prov.members[n["name"]] for n in after] == [["q"], ["k"], ["v"]]
    assert {prov.method[s] for s in ("q", "k", "v")} == {"names"}


def test_a_diff_of_one_chip_against_several_says_its_node_rows_are_not_one_basis():
    """One H100 at batch 16 against 4 data-parallel at 4 each: the totals are the whole step's on both
    sides (517 GFLOP), the after rows one chip's (129 GFLOP); the diff set them side by side unsaid."""
    from dabench_ir import api
    from dabench_ir.study.run import study_run

    one = api.profile("gpt2-small", "h100", batch=16, seq=128).to_dict()
    four = api.profile("gpt2-small", "h100", batch=4, seq=128, chips=4, strategy="dp").to_dict()
    (line,) = [w for w in study_run(one, four)["warnings"] if w.startswith("node rows:")]
    assert "before the whole step, after one chip's share of the step" in line
    assert not [w for w in study_run(one, one)["warnings"] if w.startswith("node rows:")]
