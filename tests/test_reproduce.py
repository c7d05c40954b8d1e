"""`dabench-ir reproduce`: finding kinds on hand-made rows (exact figures), study-file checks,
the bundled DABench study (parsed, not run), and tiny studies end to end through the CLI
(outputs, resume, interruption, failed points)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from dabench_ir.cli import main
from dabench_ir.errors import UserError
from dabench_ir.reproduce import KINDS, Finding, bundled_studies, evaluate, load_study, parse_study
from dabench_ir.reproduce.bands import NO_FIGURE, RULES, grade
from dabench_ir.reproduce.counterfactual import Counterfactual
from dabench_ir.reproduce.render import findings_table
from dabench_ir.reproduce.rows import matches, select
from dabench_ir.reproduce.run import outcome_row
from tests._helpers import one_finding_study

INF = math.inf


def _f(kind: str, **fields) -> Finding:
    """A finding as the loader makes it: common fields by name, the kind's own in ``options``, the
    band from the paper's figure by the kind's rule."""
    common = {k: fields.pop(k) for k in ("metric", "where", "format", "paper") if k in fields}
    common.setdefault("format", KINDS[kind].format)
    rule = KINDS[kind].rule(fields, common.get("metric", TP))
    return Finding(
        id="f",
        kind=kind,
        experiment="e",
        claim="c",
        options=fields,
        grading=grade(rule, common.get("paper"), fields),
        **common,
    )


def _row(**params) -> dict:
    row = {"key": "k", "status": "ok", "error": None, "fits": True, "failure_reason": None}
    row.update(params)
    return row


TP = "throughput_samples_per_s"


# -- bands: one rule per kind of figure, from the paper's own magnitude -------------------------
@pytest.mark.parametrize(
    ("rule", "paper", "options", "accept"),
    [
        ("change", 0.343, {}, (0.343 * 2 / 3, 0.343 * 4 / 3)),
        ("change", -0.4, {}, (-0.4 * 4 / 3, -0.4 * 2 / 3)),
        ("factor", 0.6, {}, (0.6 - 0.4 / 3, 0.6 + 0.4 / 3)),
        ("relative", 860.0, {}, (860 * 2 / 3, 860 * 4 / 3)),
        ("scaling", "near-linear", {}, (2 / 3, 4 / 3)),
        ("scaling", "flat", {}, (-1 / 3, 1 / 3)),
        ("share", [0.92, 0.93], {}, (0.87, 0.98)),
        ("share", [0.96, 1.0], {}, (0.91, 1.0)),
        ("limit", 72, {}, (72 * 0.85, 72 * 1.15)),
        ("position", 200, {}, (100, 400)),
        ("change", "faster", {"expect": "increasing"}, (0.02, INF)),
        ("factor", "slower", {"expect": "decreasing"}, (-INF, 0.98)),
        ("change", "equal", {"expect": "flat"}, (-0.02, 0.02)),
    ],
)
def test_each_rule_sets_the_band_from_the_papers_figure(rule, paper, options, accept):
    g = grade(rule, paper, options)
    assert g.accept == pytest.approx(accept) and g.text == RULES[g.rule]
    assert g.rule == ("direction" if "expect" in options else rule)


def test_no_number_and_no_direction_is_no_figure_and_labels_have_no_band():
    assert grade("change", None, {}) == NO_FIGURE and not NO_FIGURE.numeric
    assert grade("relative", "a lot", {}).rule == "none"
    assert grade("label", "wse", {}).accept is None and grade("direction", "decreasing", {}).accept is None


def test_a_study_file_cannot_set_its_own_band():
    with pytest.raises(UserError, match="accept is not a finding's to set: the band comes from the paper's figure"):
        parse_study(_study(accept=[0, 1]), origin="t.toml")


# -- kinds on hand-made rows ---------------------------------------------------------------------
PREC = [
    _row(target="wse", precision="fp32", **{TP: 100.0}),
    _row(target="wse", precision="mixed", **{TP: 110.0}),
    _row(target="rdu", precision="fp32", **{TP: 10.0}),
    _row(target="rdu", precision="mixed", **{TP: 15.0}),
]


def test_ratio_is_numerator_over_denominator_minus_one():
    f = _f(
        "ratio",
        numerator={"target": "wse", "precision": "mixed"},
        denominator={"target": "wse", "precision": "fp32"},
        paper=0.107,
    )
    out = evaluate(PREC, f)
    assert out.value == pytest.approx(0.1) and out.reproduced  # +10 % in [+7.1 %, +14.3 %]
    plain = _f(
        "ratio",
        numerator={"target": "rdu", "precision": "mixed"},
        denominator={"target": "rdu", "precision": "fp32"},
        minus_one=False,
        paper=1.2,
        format="x",
    )
    out = evaluate(PREC, plain)
    assert out.value == pytest.approx(1.5) and not out.reproduced
    assert out.reason == "tool 1.50x outside [1.13x, 1.27x]"


def test_value_of_one_row_and_reduced_over_rows():
    one = _f("value", select={"target": "rdu", "precision": "mixed"}, paper=14.0)
    out = evaluate(PREC, one)
    assert out.value == 15.0 and out.reproduced
    for reduce, expected in (("max", 110.0), ("min", 10.0), ("mean", 58.75), ("median", 57.5), ("p90", 110.0)):
        out = evaluate(PREC, _f("value", reduce=reduce, paper=1.0))
        assert out.value == pytest.approx(expected), reduce
    wse = _f("value", reduce="mean", where={"target": "wse"}, paper=70.0)
    out = evaluate(PREC, wse)
    assert out.value == 105.0 and not out.reproduced and "outside [46.67, 93.33]" in out.reason
    nine = [_row(allocation_ratio=v / 10) for v in range(1, 11)]  # 0.1 ... 1.0: nine in ten at or below 0.9
    assert evaluate(nine, _f("value", metric="allocation_ratio", reduce="p90", paper=0.9)).value == pytest.approx(0.9)


def test_range_is_the_share_in_the_band_and_reports_the_span():
    rows = [_row(allocation_ratio=v) for v in (0.9, 0.92, 0.5, 0.93)]
    rows.append(_row(status="error", error="boom"))
    f = _f("range", metric="allocation_ratio", paper=[0.92, 0.93], format="pct")
    out = evaluate(rows, f)
    assert out.value == 0.75 and not out.reproduced
    assert out.text == "75.0% in range (50.0%-93.0%)"
    assert "1 point(s) left out" in out.detail and "boom" in out.detail
    assert "below the 90.0% asked" in out.reason
    assert evaluate(rows[:2] + rows[3:], f).reproduced


BATCH = [
    _row(target=t, batch=b, **{TP: v})
    for t, pts in {"a": {16: 10.0, 32: 19.0, 64: 36.0}, "b": {16: 10.0, 32: 12.0, 64: 12.5}}.items()
    for b, v in pts.items()
]


def test_curve_from_first_to_last_or_between_given_points():
    f = _f("curve", axis="batch", where={"target": "a"}, paper=3.0)
    assert evaluate(BATCH, f).value == pytest.approx(3.6)
    f = _f("curve", axis="batch", where={"target": "a"}, **{"from": 32, "to": 64}, paper=2.0)
    out = evaluate(BATCH, f)
    assert out.value == pytest.approx(36 / 19) and out.reproduced
    per = _f("curve", axis="batch", where={"target": "a"}, per_axis=True, minus_one=True, paper=-0.1)
    assert evaluate(BATCH, per).value == pytest.approx((36 / 64) / (10 / 16) - 1)
    grouped = _f("curve", axis="batch", group="target", reduce="min", paper=1.25)
    out = evaluate(BATCH, grouped)
    assert out.value == pytest.approx(1.25) and out.reproduced and "target=a: 3.60x" in out.detail
    anyg = _f("curve", axis="batch", group="target", reduce="any", paper=3.5)
    out = evaluate(BATCH, anyg)
    assert out.value == pytest.approx(3.6) and out.reproduced


def test_a_scaling_curve_is_its_gain_over_the_linear_gain():
    near = _f("curve", axis="batch", where={"target": "a"}, scaling=True, paper="near-linear")
    out = evaluate(BATCH, near)  # 16 -> 64: x3.6 against x4 linear: 2.6 / 3
    assert out.value == pytest.approx(2.6 / 3) and out.reproduced
    out = evaluate(BATCH, replace(near, where={"target": "b"}))  # x1.25: 0.25 / 3 of linear
    assert out.value == pytest.approx(0.25 / 3) and not out.reproduced
    flat = _f("curve", axis="batch", where={"target": "b"}, scaling=True, paper="flat")
    assert evaluate(BATCH, flat).reproduced


def test_curve_with_a_missing_end_point_is_not_reproduced_with_the_reason():
    rows = [r for r in BATCH if not (r["target"] == "a" and r["batch"] == 64)]
    out = evaluate(rows, _f("curve", axis="batch", where={"target": "a"}, to=64, paper=2.0))
    assert out.value is None and not out.reproduced and out.reason == "no result at batch = 64"


def test_trend_direction_share_of_steps_and_relative_change():
    rows = [_row(layers=n, load_imbalance=v) for n, v in ((1, 1.0), (2, 0.9), (4, 0.91), (8, 0.8))]
    f = _f("trend", metric="load_imbalance", axis="layers", expect="decreasing")
    out = evaluate(rows, f)
    assert out.value == pytest.approx(-0.2) and out.reproduced  # +1.1 % is within the 2 % tolerance
    assert out.detail.startswith("3 of 3 step(s) decreasing")
    bumpy = [_row(layers=n, load_imbalance=v) for n, v in ((1, 1.0), (2, 0.9), (4, 0.95), (8, 0.8))]
    out = evaluate(bumpy, f)
    assert not out.reproduced and "only 2 of 3 step(s)" in out.reason
    up = _f("trend", metric="load_imbalance", axis="layers", expect="increasing")
    assert not evaluate(rows, up).reproduced
    flat = [_row(layers=n, load_imbalance=0.5) for n in (1, 2, 4)]
    assert evaluate(flat, _f("trend", metric="load_imbalance", axis="layers", expect="flat")).reproduced


def test_knee_is_where_the_curve_reaches_nine_tenths_of_its_top():
    rows = [_row(batch=b, **{TP: v}) for b, v in ((16, 50.0), (64, 85.0), (256, 95.0), (1024, 100.0))]
    out = evaluate(rows, _f("knee", axis="batch", paper=200))
    assert out.value == 256 and out.reproduced and "64: 85%" in out.detail
    assert not evaluate(rows, _f("knee", axis="batch", paper=1000)).reproduced  # 256 is below 500


def test_switch_reads_the_chosen_execution_mode_along_an_axis():
    def rows(*modes):
        return [_row(hidden=h, execution_mode=m) for h, m in zip((768, 1600, 4096, 5120), modes, strict=True)]

    f = _f("switch", axis="hidden", expect=["pipelined", "streaming"])
    out = evaluate(rows("pipelined", "pipelined", "streaming", "streaming"), f)
    assert out.value == 4096 and out.reproduced
    assert not evaluate(rows("pipelined", "streaming", "pipelined", "streaming"), f).reproduced
    assert not evaluate(rows(*["pipelined"] * 4), f).reproduced
    unfit = [*rows("pipelined", "pipelined", "pipelined", "streaming")[:2], _row(hidden=4096, fits=False)]
    out = evaluate(unfit, f)
    assert not out.reproduced and "1 point(s) left out" in out.detail


def test_limits_name_what_each_group_meets():
    rows = [
        *(_row(target="wse", fits=n < 3, roofline_bound="compute") for n in range(4)),
        *(_row(target="rdu", roofline_bound="memory") for _ in range(3)),
        *(_row(target="ipu", roofline_bound=b) for b in ("memory", "compute", "compute")),
    ]
    f = _f("limits", group="target", expect={"wse": "capacity", "rdu": "bandwidth", "ipu": "bandwidth"})
    out = evaluate(rows, f)
    assert not out.reproduced and out.text == "ipu compute, rdu bandwidth, wse capacity"
    assert out.reason == "ipu compute, the paper bandwidth"
    assert evaluate(
        rows, replace(f, options={**f.options, "expect": {"wse": "capacity", "rdu": "bandwidth"}})
    ).reproduced


def test_fit_limit_is_the_largest_fitting_axis_value():
    rows = [_row(hidden=h, layers=n, fits=n <= lim) for h, lim in ((768, 12), (1024, 4)) for n in (1, 4, 12, 24)]
    f = _f("fit_limit", axis="layers", where={"hidden": 768}, paper=12)
    out = evaluate(rows, f)
    assert out.value == 12 and out.reproduced
    out = evaluate(rows, _f("fit_limit", axis="layers", group="hidden", reduce="min", paper=12))
    assert out.value == 4 and not out.reproduced and out.reason == "tool 4 outside [10, 14]"
    allfit = [_row(layers=n, fits=True) for n in (1, 2)]
    out = evaluate(allfit, _f("fit_limit", axis="layers", paper=8))
    assert out.value == 2 and "every point fits" in out.detail
    nofit = [_row(layers=n, fits=False) for n in (1, 2)]
    assert evaluate(nofit, _f("fit_limit", axis="layers", paper=8)).value == 0


def test_argmax_and_argmin_over_groups():
    rows = [
        _row(target=t, compute_efficiency=v) for t, v in (("wse", 0.1), ("wse", 0.12), ("ipu", 0.36), ("rdu", 0.05))
    ]
    out = evaluate(rows, _f("argmax", group="target", metric="compute_efficiency", reduce="max", expect="ipu"))
    assert out.value == "ipu" and out.reproduced and out.detail.startswith("ipu 0.36, wse 0.12, rdu 0.05")
    out = evaluate(rows, _f("argmin", group="target", metric="compute_efficiency", reduce="mean", expect="wse"))
    assert out.value == "rdu" and not out.reproduced and "tool picks rdu" in out.reason
    gains = _f(
        "argmin", group="target", numerator={"precision": "mixed"}, denominator={"precision": "fp32"}, expect="wse"
    )
    out = evaluate(PREC, gains)
    assert out.value == "wse" and out.reproduced and "wse 10.0%" in out.detail and "rdu 50.0%" in out.detail


def test_dominant_share_and_the_only_group_above_half():
    rows = [
        _row(target=t, dominant_bound=b)
        for t, b in (("wse", "compute"), ("wse", "compute"), ("ipu", "compute"), ("ipu", "memory"), ("ipu", "memory"))
    ]
    out = evaluate(rows, _f("dominant", where={"target": "ipu"}, bound="memory"))
    assert out.value == pytest.approx(2 / 3) and out.reproduced and out.text == "66.7% memory-bound"
    only = _f("dominant", group="target", bound="compute", expect="wse")
    out = evaluate(rows, only)
    assert out.value == 1.0 and out.reproduced and out.text == "wse 100.0%, ipu 33.3%"
    both = _f("dominant", group="target", bound="compute", expect="ipu")
    out = evaluate(rows, both)
    assert not out.reproduced and "at least 50.0% of points: wse (expected ipu" in out.reason


def test_dominant_reads_the_bound_of_the_step_the_nodes_or_the_roofline():
    rows = [_row(target="rdu", dominant_bound="overhead", node_bound="compute", roofline_bound="memory")] * 2
    step, nodes, roof = (
        evaluate(rows, _f("dominant", bound=b, **({"of": of} if of else {})))
        for b, of in (("overhead", None), ("compute", "nodes"), ("memory", "roofline"))
    )
    assert step.reproduced and nodes.reproduced and roof.reproduced and roof.value == 1.0
    assert not evaluate(rows, _f("dominant", bound="memory", of="nodes")).reproduced


def test_failed_and_unfitting_rows_give_not_reproduced_with_the_reason():
    rows = [
        _row(target="wse", precision="fp32", status="error", error="UserError: hidden (64) must be divisible"),
        _row(target="wse", precision="mixed", fits=False, failure_reason="needs 2 GB, has 1 GB", **{TP: 0.0}),
    ]
    f = _f("ratio", numerator={"precision": "mixed"}, denominator={"precision": "fp32"}, paper=0.5)
    out = evaluate(rows, f)
    assert not out.reproduced and out.value is None
    assert "does not fit: needs 2 GB, has 1 GB" in out.reason
    out = evaluate(rows[:1], f)
    assert "no result for the numerator point" in out.reason
    out = evaluate([*rows[:1], _row(target="wse", precision="mixed", **{TP: 1.0})], f)
    assert "failed: UserError: hidden (64) must be divisible" in out.reason
    row = outcome_row(f, rows)
    assert row.tool == "-" and row.reproduced is False and row.reason


# -- verdicts: a counterfactual decides whether a reproduced finding is a test -------------------
CF = Counterfactual("the fp32 rate at the 16-bit one", target={"compute.peak_flops.fp32": "compute.peak_flops.fp16"})


@pytest.mark.parametrize(
    ("rows", "cf_rows", "counterfactual", "verdict", "reason"),
    [
        (PREC[:2], PREC[2:], CF, "reproduced", ""),  # +10 % in the band; the counterfactual's +50 % is not
        (PREC[:2], PREC[:2], CF, "not a test", "still reproduced with the fp32 rate at the 16-bit one (tool +10.0%)"),
        (PREC[2:], PREC[:2], CF, "not reproduced", "tool +50.0% outside [7.1%, 14.3%]"),
        (PREC[:2], (), None, "not a test", "no counterfactual: the study names none"),
        (PREC[:2], [{**r, "status": "error", "error": "boom"} for r in PREC[:2]], CF, "not a test", "did not run"),
    ],
)
def test_the_verdict_needs_the_band_and_a_counterfactual_that_fails(rows, cf_rows, counterfactual, verdict, reason):
    f = replace(
        _f("ratio", numerator={"precision": "mixed"}, denominator={"precision": "fp32"}, paper=0.107),
        counterfactual=counterfactual,
    )
    out = outcome_row(f, rows, cf_rows)
    assert out.verdict == verdict and reason in out.reason
    assert out.reproduced == (verdict == "reproduced")


def test_a_finding_without_the_papers_figure_is_not_a_test():
    out = outcome_row(replace(_f("value", reduce="max"), counterfactual=CF), PREC, PREC[2:])
    assert out.verdict == "not a test" and "not in the study's sources" in out.reason and out.tool == "110"


def test_selectors_match_values_lists_and_conditions():
    row = {"layers": 24, "target": "rdu", "opt_level": "O3", "layers_per_ipu": (3, 3)}
    assert matches(row, {"layers": 24, "layers_per_ipu": [3, 3]})
    assert matches(row, {"layers": {"min": 12, "max": 48}, "opt_level": {"in": ["O1", "O3"]}})
    assert not matches(row, {"opt_level": {"not": "O3"}}) and not matches(row, {"precision": "fp32"})
    assert select([row, {**row, "layers": 1}], {"layers": {"max": 2}}) == [{**row, "layers": 1}]


def test_ascii_table_has_no_check_marks():
    f = replace(
        _f("ratio", numerator={"precision": "mixed"}, denominator={"precision": "fp32"}, paper=0.107), counterfactual=CF
    )
    outcomes = [
        outcome_row(f, PREC[:2], PREC[2:]),
        outcome_row(f, PREC[2:], PREC[:2]),
        outcome_row(f, PREC[:2], PREC[:2]),
    ]
    text = findings_table(outcomes, unicode=False)
    assert text.isascii() and " yes " in text and " NO " in text and " n/t " in text
    assert text.endswith(
        "the paper's findings: 1 of 3 reproduced as predicted, 0 in sample; 1 not a test, 1 not reproduced"
    )
    assert all(m in findings_table(outcomes) for m in "✓✗○")


# -- study files ---------------------------------------------------------------------------------
TINY = {"family": "gpt2", "hidden": 64, "heads": 4, "seq": 8, "batch": 1, "positional": "none"}


def _study(**finding) -> dict:
    return one_finding_study(TINY, {"layers": [1, 2], "target": ["wse"]}, **finding)


def test_a_good_tiny_study_parses_and_shared_points_run_once():
    data = _study()
    data["experiment"]["deep"] = {"defaults": {**TINY, "target": "wse"}, "axes": {"layers": [2, 3]}}
    study = parse_study(data, origin="t.toml")
    assert [f.id for f in study.findings] == ["x"]
    assert len(study.points()) == 3 and len(study.merged_spec().points) == 3  # layers 2 on wse is in both
    only = study.restrict(["x"])
    assert list(only.experiments) == ["e"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"kind": "bogus"}, "t.toml: finding x: unknown kind 'bogus'; known: ratio"),
        ({"numerator": {"flavour": "x"}}, "names 'flavour', a parameter no point of experiment 'e' has"),
        ({"experiment": "nothere"}, "finding x: experiment 'nothere' is not defined; the study has e"),
        ({"experiment": None}, "finding x: give the experiment it reads (one of e)"),
        ({"numerator": {"layers": 3}}, "numerator ({'layers': 3}) matches no point"),
        ({"numerator": {"target": "wse"}}, "matches 2 points, not one (they differ in layers)"),
        ({"paper": [1, 0]}, "paper range [1, 0] is reversed (low > high)"),
        ({"paper": math.nan}, "paper must be a number, a [low, high] range or a text"),
        (
            {"counterfactual": {"what": "x", "target": {"compute.peak_flops.fp64": 1}}},
            "counterfactual: target wse2: no figure 'compute.peak_flops.fp64'",
        ),
        ({"counterfactual": {"what": "x", "knobs": {"flavour": 1}}}, "unknown parameter 'flavour'"),
        (
            {"counterfactual": {"what": "x", "on": "rdu", "target": {"arch.x": 1}}},
            "no point the finding reads runs on it",
        ),
        ({"counterfactual": {"target": {"arch.x": 1}}}, "counterfactual.what must say what is switched off"),
        ({"counterfactual": {"what": "x"}}, "counterfactual needs target"),
        ({"counterfactual": {"what": "x", "knobs": {"batch": 2}}, "tautology": "t"}, "not both"),
        ({"table": "appendix"}, "table 'appendix'; expected one of paper, artifact"),
        ({"evidence": "point-a"}, "evidence must be a list of measurement ids"),
        ({"nmerator": {"layers": 2}}, "unknown field 'nmerator' for kind ratio"),
        ({"kind": "curve", "axis": "hidden", "numerator": None, "denominator": None}, "x: 2 points at hidden = 64"),
        ({"format": "percent"}, "format 'percent'; expected one of pct"),
        (
            {
                "kind": "dominant",
                "bound": "memory",
                "of": "chip",
                "numerator": None,
                "denominator": None,
                "paper": None,
            },
            "'chip'; expected one of step, nodes, roofline",
        ),
    ],
)
def test_bad_study_files_are_one_user_error_naming_the_finding(change, needle):
    with pytest.raises(UserError) as err:
        parse_study(_study(**change), origin="t.toml")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_bundled_dabench_study_parses_and_every_selector_picks_a_point():
    study = load_study("dabench")
    assert "dabench" in bundled_studies() and study.name == "dabench"
    assert {"precision", "batch-wse", "batch-rdu", "batch-ipu", "tp", "pp", "dp", "level1"} <= set(study.experiments)
    assert len(study.points()) <= 400  # minutes on 2 cores
    assert {f.level for f in study.findings} == {1, 2}
    for f in study.findings:
        points = [p.params for p in study.experiments[f.experiment].points]
        assert select(points, f.where), f.id
        for name in ("numerator", "denominator", "select"):
            if name in f.options:
                assert select(points, f.where, f.options[name]), (f.id, name)
        assert f.mechanism and f.source, f.id
    assert {p.kind for p in study.plots} == {"lines", "bars", "roofline", "fits"}


def test_list_and_dry_run(capsys):
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    study = load_study("dabench")
    assert out.startswith("dabench") and f"{len(study.findings)} findings" in out
    assert main(["reproduce", "dabench", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{len(study.points())} distinct points" in out and "level1" in out
    assert main(["reproduce", "dabench", "--dry-run", "--only", "precision-wse,tp-rdu-2to4"]) == 0
    out = capsys.readouterr().out
    assert "precision" in out and "tp " in out and "level1" not in out and "2 findings" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["reproduce", "nope"], "no study file or bundled study named 'nope'; bundled: dabench"),
        (["reproduce", "dabench", "--only", "nope", "--dry-run"], "--only nope: no such finding"),
        (["reproduce"], "give a STUDY"),
    ],
)
def test_bad_command_lines_exit_2_with_one_line(capsys, args, needle):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ('kind = "bogus"', "finding deeper-slower: unknown kind 'bogus'"),
        ('numerator = { flavour = "a" }', "names 'flavour'"),
        ('experiment = "nothere"', "experiment 'nothere' is not defined"),
    ],
)
def test_bad_study_files_exit_2_from_the_cli(tmp_path, capsys, change, needle):
    text = TINY_STUDY.replace('kind = "ratio"', change) if "kind" in change else TINY_STUDY
    if "numerator" in change:
        text = text.replace('numerator = { layers = 1, target = "rdu" }', change)
    if "experiment" in change:
        text = text.replace('experiment = "layers"\nclaim = "a deeper', f'{change}\nclaim = "a deeper')
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["reproduce", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and needle in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


# -- end to end on tiny models -------------------------------------------------------------------
TINY_STUDY = (Path(__file__).parent / "data" / "tiny_study.toml").read_text()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    return tmp_path_factory.mktemp("reproduce-models")


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_STUDY)
    return path


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_tiny_study_end_to_end_and_resume(tmp_path, tiny, cache, capsys):
    out = tmp_path / "out"
    args = ["reproduce", str(tiny), "-o", str(out), "-j", "1", "--cache-dir", str(cache)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "deeper-slower" in text and "Checks against the paper's artifact" in text
    assert "the paper's findings: 0 of 4 reproduced as predicted, 1 in sample; 2 not a test, 1 not reproduced" in text
    assert "checks against the paper's artifact: 0 of 1 reproduced as predicted, 0 in sample; 1 not a test" in text
    assert "8 points: 0 done before, 8 run now (2 failed)" in text and "counterfactuals: 4 points" in text
    findings = _csv(out / "findings.csv")
    by_id = {r["id"]: r for r in findings}
    assert list(by_id) == ["deeper-slower", "fits", "fastest", "precision", "broken"]
    # the section launch cost is not what makes a deeper stack slower: the finding does not test it
    assert (
        by_id["deeper-slower"]["verdict"] == "not a test"
        and "still reproduced with no cost" in by_id["deeper-slower"]["reason"]
    )
    assert (
        by_id["fits"]["tool"] == "2"
        and by_id["fits"]["verdict"] == "not a test"
        and by_id["fits"]["table"] == "artifact"
    )
    assert by_id["fits"]["accept_text"] == "within ±15 % of the paper's count: [2, 2]"
    prec = by_id["precision"]  # fp16 faster; at the fp16 rate fp32 is not: reproduced, and in sample by its evidence
    assert prec["verdict"] == "reproduced" and prec["counterfactual_reproduced"] == "False"
    assert prec["provenance"] == "in sample" and "wse2 arch.pe_matmul_efficiency" in prec["fitted"]
    assert (
        by_id["broken"]["verdict"] == "not reproduced" and "failed: UserError: hidden (64)" in by_id["broken"]["reason"]
    )
    doc = json.loads((out / "findings.json").read_text())
    assert doc["schema"] == "dabench-ir/reproduce/v1" and doc["study"] == "tiny" and doc["dabench_ir"]
    assert doc["total"] == 5 and doc["reproduced"] == 1 and doc["counts"]["paper"]["in_sample"] == 1
    assert doc["findings"][3]["accept"] == [0.02, "inf"] and doc["findings"][3]["grading"] == "direction"
    md = (out / "findings.md").read_text()
    assert md.startswith("# A tiny study") and "| deeper-slower | 1 |" in md and "## Checks against" in md
    for png in ("tput", "gain", "roof", "fitmap"):
        assert (out / f"{png}.png").stat().st_size > 1000, png
    rows = _csv(out / "results.csv")
    assert len(rows) == 8
    ok = [r for r in rows if r["status"] == "ok"]  # the mode a lowering chose, the memory use at each level
    assert {r["execution_mode"] for r in ok if r["target"] == "wse"} == {"pipelined"}
    assert {r["execution_mode"] for r in ok if r["target"] == "rdu"} == {""}
    assert all(0 < float(r["memory_onchip"]) < 1 for r in ok if r["target"] == "wse")
    assert all(0 < float(r["memory_offchip"]) < 1 for r in ok if r["target"] == "rdu")
    assert len(_csv(out / "experiments" / "layers" / "results.csv")) == 4
    assert len(_csv(out / "experiments" / "prec" / "results.csv")) == 2
    assert len(_csv(out / "counterfactuals" / "results.csv")) == 4
    assert len(list((out / "counterfactuals" / "targets").glob("*.toml"))) == 2
    points = {p.name for p in (out / "points").iterdir()}
    assert len(points) == 8 and not list(out.rglob(".*.tmp*"))
    # a rerun skips every point and gives the same findings
    before = (out / "findings.csv").read_text()
    assert main([*args, "-q", "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "done before" not in text  # --quiet: no sweep summary, the table still printed
    assert "reproduced as predicted" in text and (out / "findings.csv").read_text() == before
    assert main([*args, "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "8 points: 8 done before, 0 run now" in text and "counterfactuals: 4 points: 4 done before" in text


class _StopAfterOne:
    """An executor that finishes the first task, then stops as Ctrl-C does."""

    name = "stop"
    jobs = 1

    def __init__(self):
        from dabench_ir.sweep.executors import SerialExecutor

        self.inner = SerialExecutor()

    def map_unordered(self, tasks):
        for i, result in self.inner.map_unordered(tasks):
            yield i, result
            raise KeyboardInterrupt

    def close(self):
        pass


def test_an_interrupted_study_resumes_without_loss_or_duplicates(tmp_path, tiny, cache):
    from dabench_ir.reproduce import run_study
    from dabench_ir.sweep.executors import Executor

    stop = type("Stop", (_StopAfterOne, Executor), {})()
    study = load_study(tiny)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_study(study, out, executor=stop, cache_dir=cache, plots=False)
    done = {p.name for p in (out / "points").glob("*.json")}
    assert 1 <= len(done) < 8
    result = run_study(study, out, jobs=1, cache_dir=cache, plots=False)
    assert result.sweep.skipped == len(done) and result.sweep.ran == 8 - len(done)
    rows = _csv(out / "results.csv")
    assert len(rows) == 8 and len({r["key"] for r in rows}) == 8
    # a lost point file is computed again, and only it
    victim = sorted((out / "points").glob("*.json"))[0]
    victim.unlink()
    again = run_study(study, out, jobs=1, cache_dir=cache, plots=False)
    assert again.sweep.ran == 1 and again.sweep.skipped == 7 and len(_csv(out / "results.csv")) == 8
    assert [o.reproduced for o in again.outcomes] == [o.reproduced for o in result.outcomes]


def test_only_runs_the_findings_experiments(tmp_path, tiny, cache, capsys):
    out = tmp_path / "out"
    assert (
        main(
            [
                "reproduce",
                str(tiny),
                "-o",
                str(out),
                "-j",
                "1",
                "--cache-dir",
                str(cache),
                "--only",
                "precision",
                "--no-plots",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "0 of 1 reproduced as predicted, 1 in sample" in text and "2 points: " in text
    assert [r["id"] for r in _csv(out / "findings.csv")] == ["precision"]
    assert not list(out.glob("*.png"))


def test_the_docs_example_study_parses():
    import re
    import tomllib

    text = (Path(__file__).resolve().parents[1] / "docs" / "reproduce.md").read_text()
    (example,) = [b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if b.startswith('name = "mini"')]
    study = parse_study(tomllib.loads(example), origin="mini.toml")
    assert [f.id for f in study.findings] == ["wse-fp16-gain", "all-fit"] and len(study.points()) == 8
