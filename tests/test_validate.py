"""`dabench-ir validate`: the bundled catalogue, user catalogues (good and bad), the error
arithmetic, and the regression guard against tests/data/validation_baseline.json."""

from __future__ import annotations

import csv
import fnmatch
import json
import math
import re
from pathlib import Path

import pytest

from dabench_ir import validate
from dabench_ir.cli import main
from dabench_ir.errors import UserError
from dabench_ir.validate import gemm, runner, write

BASELINE = Path(__file__).parent / "data" / "validation_baseline.json"


# -- the bundled catalogue ----------------------------------------------------------------------


def test_bundled_catalogue_loads_and_holds_every_reference_point():
    points = validate.load_catalog()
    by_id = {p.id: p for p in points}
    assert len(by_id) == len(points)  # ids unique
    assert {p.target for p in points if p.kind != "host"} == {
        "wse2",
        "sn30",
        "bow",
        "a100",
        "a100-40gb",
        "h100",
        "h200",
    }  # host points: cpu, live
    assert all(p.source for p in points)
    sn30 = [p for p in points if p.target == "sn30" and p.kind == "model"]
    assert len(sn30) == 16  # every row of the SN30 depth sweep, ALCF's GPT 13B runs on 4 and 8 RDUs, its GPT-2 XL run
    assert sorted(p.model["layers"] for p in sn30 if p.run["opt_level"] == "O0") == [1, 6, 12, 18, 24, 30, 36]
    row = by_id["sn30-gpt2-h1600-L36-O3"]
    assert row.measured == {
        "samples_per_s": 3.59,
        "step_time_s": 4.5,
        "host_time_s": 1.668,
        "device_time_s": 2.783,
        "sections": 185,
        "max_pcu_utilization": 0.75,
    }
    streaming = [p for p in points if p.run.get("wse_mode") == "streaming"]
    assert sorted(p.measured["samples_per_s"] for p in streaming) == [11.9, 19.81, 20.445, 46.6, 373.4, 494.4]
    assert by_id["bow-gpt2-small-pod16-layout"].run["layers_per_ipu"] == [0, 4, 4, 4]
    assert by_id["bow-gpt2-small-pod16-layout"].expect == {"fits": True}
    assert by_id["gc200-gemm-fp32-largest-fit"].measured == {"max_square": 3584}
    kinds = {p.kind for p in points}
    assert kinds == set(validate.KINDS)  # TTFT/TPOT: the ALCF user guide's Llama 2 7B generation on SN30
    h = by_id["a100x8-llmc-gpt2-124m"]  # point H: llm.c on 8x A100, held out of every fit
    assert h.holdout and h.run["chips"] == 8 and h.run["zero"] == 1 and h.model["batch"] == 512
    assert h.measured == {"step_time_s": 0.300, "samples_per_s": 1706.67}


def test_the_docs_say_what_the_catalogue_holds():
    """docs/validation.md's table of sources is the catalogue's own, not a hand-kept list (the list it
    replaced still said no generate point was bundled, and named none of the GPU serving points)."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("validation_report", root / "scripts" / "validation_report.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    table = script.holdings_table(validate.load_catalog())
    doc = (root / "docs" / "validation.md").read_text()
    section = re.search(r"<!-- validation:holdings:start -->\n(.*?)\n<!-- validation:holdings:end -->", doc, re.S)
    assert section and section.group(1) == table, "regenerate: .venv/bin/python scripts/validation_report.py"
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:3]) for line in table.splitlines()[2:]}
    assert ("sn30", "augustuszzq/Regular-DABench-LLM", "13") in rows  # the DABench depth sweep, one source
    assert f"sources | {len(validate.load_catalog())} |" in table.splitlines()[-1]  # every point counted once


def test_compile_report_kernels_summarised_per_class():
    wse = next(p for p in validate.load_catalog() if p.id == "wse2-gpt2-small-pipelined-compile")
    classes = validate.kernel_classes(Path(wse.file).parent / wse.measured["kernels_csv"])
    assert sum(c["count"] for c in classes.values()) == 128
    assert {k: classes[k]["count"] for k in ("attention", "fc", "layer_norm", "add", "nlin")} == {
        "attention": 12,
        "fc": 24,
        "layer_norm": 25,
        "add": 48,
        "nlin": 12,
    }
    assert classes["attention"]["pes_min"] == 8788 and classes["attention"]["pes_max"] == 10298
    assert classes["emb_fc"]["pes"] == 65604 and classes["patio"]["pes"] == 307840
    assert classes["patio"]["util_max"] == 0.0
    # the typical layer norm: 17 of 25 sit at 66 PEs and 56 %; 8 are oversized (78-768 PEs)
    assert (classes["layer_norm"]["pes_median"], classes["layer_norm"]["util_median"]) == (66, 0.56)
    assert (classes["layer_norm"]["pes_min"], classes["layer_norm"]["pes_max"]) == (66, 768)
    # LI as the tool defines it: PE-weighted share of each period a kernel is busy
    path = Path(wse.file).parent / wse.measured["kernels_csv"]
    rows = [r for r in csv.DictReader(path.open()) if r["samples_per_s"] != "--"]
    slowest = min(float(r["samples_per_s"]) for r in rows)
    by_hand = sum(float(r["active_pes"]) * slowest / float(r["samples_per_s"]) for r in rows)
    assert validate.kernel_load_imbalance(path) == pytest.approx(by_hand / sum(float(r["active_pes"]) for r in rows))
    assert validate.kernel_load_imbalance(path) == pytest.approx(0.979, abs=5e-4)


# -- error arithmetic -----------------------------------------------------------------------------


def _point(pid="p", target="sn30", kind="model", **kw):
    return validate.Point(id=pid, kind=kind, target=target, source="test", file="t.toml", **kw)


def test_relative_error_and_summary_statistics():
    assert validate.Quantity("x", 2.0, 3.0).error == 0.5
    assert validate.Quantity("x", 4.0, 3.0).error == -0.25
    assert validate.Quantity("x", 4.0, None).error is None
    ok1 = validate.PointResult(
        _point("a"),
        quantities=[
            validate.Quantity("samples_per_s", 10.0, 12.0),
            validate.Quantity("host_time_s", 1.0, None, "not predicted"),
        ],
    )
    ok2 = validate.PointResult(
        _point("b"),
        quantities=[validate.Quantity("samples_per_s", 10.0, 5.0), validate.Quantity("sections", 4, 5)],
        fits_expected=True,
        fits_predicted=False,
    )
    ref = validate.PointResult(_point("c", reference_only=True), quantities=[validate.Quantity("tflops", 1.0, 9.0)])
    bad = validate.PointResult(_point("d"), status="cannot run", reason="export failed")
    s = validate.Validation([ok1, ok2, ref, bad]).summary()["sn30"]
    assert s["points"] == 4 and s["ran"] == 2 and s["cannot_run"] == 1 and s["reference_only"] == 1
    assert s["fit_wrong"] == 1 and s["fit_right"] == 0 and s["not_predicted"] == 1
    assert s["compared"] == 3
    assert s["median_abs_error"] == pytest.approx(0.25) and s["worst_abs_error"] == pytest.approx(0.5)
    assert s["median_abs_error_throughput"] == pytest.approx(0.35) and s["worst_abs_error_throughput"] == 0.5


def test_run_keys_map_to_their_knobs_or_the_point_is_refused_with_the_reason():
    point = _point(
        run={
            "opt_level": "O3",
            "optimizer": "AdamW",
            "chips_per_node": 4,
            "fused_attention": False,
            "kv_precision": "fp8",
        }
    )
    opts = runner.options_of_point(point, "rdu", validate.PointResult(point))
    assert (opts.opt_level, opts.chips_per_node, opts.fused_attention, opts.kv_precision) == ("O3", 4, False, "fp8")
    gpu = _point(target="a100", run={"zero": 1})
    assert runner.options_of_point(gpu, "gpu", validate.PointResult(gpu)).zero == 1
    ipu = _point(target="bow", run={"half_partials": False})  # fp32 partials: half the AMP units
    assert runner.options_of_point(ipu, "ipu", validate.PointResult(ipu)).half_partials is False
    refused = {
        ("rdu", "num_widgets", 2): "run.num_widgets = 2 refused: the tool has no such knob",
        ("rdu", "wse_mode", "streaming"): "run.wse_mode = streaming: applies to wse targets, not sn30 (rdu)",
        ("rdu", "half_partials", True): "run.half_partials = True: applies to ipu targets",
        ("rdu", "optimizer", "sgd"): "run.optimizer = sgd refused: the training expansion models Adam(W) state",
        ("gpu", "tiles", 4): "run.tiles = 4: applies to rdu targets",
        ("rdu", "zero", 1): "run.zero = 1: applies to gpu targets",  # ZeRO sharding is modelled for GPUs
        ("gpu", "measure", True): "run.measure = True refused: not a run key: the catalogue holds published",
        ("gpu", "micro_batches", 4): "not a run key: give gradient_accumulation",
    }
    for (kind, key, value), why in refused.items():
        p = _point(run={key: value})
        with pytest.raises(runner.CannotRun) as info:
            runner.options_of_point(p, kind, validate.PointResult(p))
        assert why in str(info.value) and len(str(info.value).splitlines()) == 1


def test_micro_batch_and_gradient_accumulation_reach_profile_as_it_takes_them():
    def opts(model, **run):
        p = _point(model=model, run=run)
        return runner.options_of_point(p, "gpu", validate.PointResult(p))

    train = opts({"batch": 64}, mode="train", micro_batch=8, gradient_accumulation=8)
    assert (train.micro_batch, train.micro_batches) == (8, None)  # profile's --micro-batch: 8 micro-batches
    assert opts({"batch": 64}, mode="train", gradient_accumulation=4).micro_batches == 4
    assert opts({"batch": 8}, micro_batch=2).micro_batches == 4  # inference: a pipeline's micro-batches
    # data parallel: the catalogue batch is global; a replica's share is micro_batch x GA
    dp = opts({"batch": 512}, mode="train", chips=8, strategy="dp", micro_batch=64, gradient_accumulation=1)
    assert (dp.micro_batch, dp.chips, dp.strategy) == (64, 8, "dp")
    with pytest.raises(runner.CannotRun, match=r"micro_batch = 8 x run.gradient_accumulation = 2 is not the batch"):
        opts({"batch": 64}, mode="train", micro_batch=8, gradient_accumulation=2)


def test_every_knob_is_a_catalogue_run_key_or_refused_with_a_reason():
    from dabench_ir.options import KNOBS
    from dabench_ir.validate.catalog import NOT_RUN_KEYS, run_option

    mapped = {o.field for o in validate.RUN_OPTIONS.values() if o.field}
    for name in KNOBS:
        if name in NOT_RUN_KEYS:
            assert run_option(name).field is None and run_option(name).refused.startswith("not a run key: ")
        else:
            assert name in mapped or run_option(name).field == name, name
    for key, opt in validate.RUN_OPTIONS.items():
        assert opt.field in KNOBS or opt.refused, key  # a mapped key sets a declared knob


def test_in_sample_and_out_of_sample_are_summarised_apart():
    fit = validate.PointResult(
        _point("a"),
        informed=("arch.x",),
        quantities=[validate.Quantity("samples_per_s", 10.0, 11.0), validate.Quantity("sections", 4, 5)],
    )
    out1 = validate.PointResult(_point("b", holdout=True), quantities=[validate.Quantity("samples_per_s", 10.0, 13.0)])
    out2 = validate.PointResult(_point("c"), quantities=[validate.Quantity("samples_per_s", 10.0, 9.0)])
    s = validate.Validation([fit, out1, out2]).summary()["sn30"]
    assert s["in_sample"]["compared"] == 2 and s["in_sample"]["median_abs_error"] == pytest.approx(0.175)
    assert s["in_sample"]["worst_abs_error_throughput"] == pytest.approx(0.1)
    assert s["out_of_sample"]["compared"] == 2 and s["out_of_sample"]["median_abs_error"] == pytest.approx(0.2)
    assert s["out_of_sample"]["worst_abs_error"] == pytest.approx(0.3)
    assert s["compared"] == 4 and s["worst_abs_error"] == pytest.approx(0.3)  # all points, as before
    text = validate.Validation([fit, out1, out2]).format_table()
    assert "b [out]" in text and "c [out]" in text and "a [out]" not in text
    assert "sn30     out of sample        2     20.0%     30.0%" in text
    assert [(r["in_sample"], r["informed"]) for r in fit.rows()] == [(True, "arch.x")] * 2
    parsed = validate.parse_catalog(
        _GOOD_HEAD + "[[points]]\nid = 'h'\nkind = 'bandwidth'\ntarget = 'ipu'\n"
        "source = 's'\nholdout = true\nmeasured = {bandwidth_gb_s = 20.0}\n"
    )
    assert parsed[0].holdout
    with pytest.raises(UserError, match="informs: unknown key"):  # one record of what is in sample: fitted_to
        validate.parse_catalog(
            _GOOD_HEAD + "[[points]]\nid = 'h'\nkind = 'bandwidth'\ntarget = 'ipu'\nsource = 's'\n"
            "informs = ['arch.x']\nmeasured = {bandwidth_gb_s = 20.0}\n"
        )


def test_fitted_to_decides_the_sample_and_a_contradicting_holdout_is_refused():
    """The target file's fitted_to is the one record of in sample; a holdout the file fits to is refused."""
    from dabench_ir.targets import load_target

    sn30 = load_target("sn30")
    assert "arch.pcu_efficiency" in sn30.fitted_on("sn30-gpt2-h1600-L24-O3")
    assert sn30.fitted_on("sn30-gpt13b-dp4-ss2k") == []
    points = {p.id: p for p in validate.load_catalog()}
    for pid, p in points.items():  # every bundled holdout point is one no parameter is fitted to
        if p.holdout and p.target != "cpu":
            assert load_target(p.target).fitted_on(pid) == [], pid
    for t in ("sn30", "wse2", "bow"):  # every fitted_to pattern names a bundled point
        for name, q in load_target(t).quantities():
            for pattern in q.fitted_to:
                assert any(fnmatch.fnmatchcase(pid, pattern) for pid in points), (t, name, pattern)
    bad = validate.parse_catalog(
        _GOOD_HEAD + "[[points]]\nid = 'sn30-gpt2-h1600-L24-O3'\nkind = 'bandwidth'\n"
        "target = 'sn30'\nsource = 's'\nholdout = true\nmeasured = {bandwidth_gb_s = 20.0}\n"
    )
    with pytest.raises(UserError, match=r"marked holdout = true, but sn30.toml fits \S+ to it"):
        validate.run_validation(bad)


_GEN = """
[[points]]
id = "tiny-gen"
kind = "generate"
target = "a100"
source = "test"
model = { family = "llama", layers = 2, hidden = 64, heads = 4, kv_heads = 2, vocab = 128, batch = 2 }
generate = { prompt = 16, gen = 5 }
run = { precision = "fp16" }
measured = { ttft_s = 1e-4, tpot_s = 5e-5, latency_s = 4e-4, decode_tokens_per_s = 4e4, joules = 1.0 }
"""


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_GEN.replace("generate = { prompt = 16, gen = 5 }", ""), "generate.prompt: expected a positive integer"),
        (_GEN.replace("gen = 5", "gen = 0"), "generate.gen: expected a positive integer"),
        (_GEN.replace("gen = 5", "gen = 5, temperature = 1"), "generate.temperature: unknown key"),
        (
            _GEN.replace('run = { precision = "fp16" }', 'run = { mode = "train" }'),
            "run.mode: a generation point serves",
        ),
        (_GEN.replace('kind = "generate"', 'kind = "model"'), 'generate: only a kind = "generate" point'),
        (_GEN.replace('precision = "fp16"', 'precision = "fp4"'), "run.precision: 'fp4' is not one of fp32, fp16"),
        (_GEN.replace('precision = "fp16"', 'kv_precision = "w4a16"'), "run.kv_precision: 'w4a16' is not one of"),
    ],
)
def test_malformed_generate_points(body, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        validate.parse_catalog(_GOOD_HEAD + body)


def test_a_serving_point_runs_at_a_quantised_precision():
    """Serving benchmarks publish fp8 and int8 runs (TensorRT-LLM's H100 tables: fp8 weights, an fp8
    cache): a point takes every precision `profile` takes, as profile takes it."""
    body = _GEN.replace('target = "a100"', 'target = "h100"').replace(
        'precision = "fp16"', 'precision = "fp8", kv_precision = "fp8"'
    )
    (point,) = validate.parse_catalog(_GOOD_HEAD + body)
    assert point.run == {"precision": "fp8", "kv_precision": "fp8"}


@pytest.mark.slow
@pytest.mark.torch
def test_generate_point_runs_the_generate_scenario(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from dabench_ir.models import ModelConfig
    from dabench_ir.options import ScaleOptions
    from dabench_ir.scenario import generate

    (point,) = validate.parse_catalog(_GOOD_HEAD + _GEN)
    assert point.kind == "generate" and point.generate == {"prompt": 16, "gen": 5} and "seq" not in point.model
    (r,) = validate.run_validation([point], cache_dir=tmp_path).results
    assert r.status == "ok", r.reason
    q = {x.name: x for x in r.quantities}
    cfg = ModelConfig(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, seq=16, batch=1)
    g = generate(cfg, "a100", ScaleOptions(precision="fp16", batch=2), prompt=16, gen=5)
    assert q["ttft_s"].predicted == pytest.approx(g.ttft_s) and q["tpot_s"].predicted == pytest.approx(g.tpot_s)
    assert q["latency_s"].predicted == pytest.approx(g.ttft_s + 4 * g.tpot_s)
    assert q["decode_tokens_per_s"].predicted == pytest.approx(2 / g.tpot_s)
    assert q["joules"].predicted is None and q["joules"].note.startswith("not predicted")
    assert r.fit_verdict == "right"


def test_gemm_microbenchmark_exact_numbers():
    from dabench_ir.targets import load_target

    bow = load_target("bow")
    n = gemm._max_square(bow, "fp32")
    assert gemm._fits(n, bow, "fp32") and not gemm._fits(n + 1, bow, "fp32")
    report = gemm._gemm_report(512, bow, "fp32")
    assert report.totals["flops"] == 2 * 512**3
    tflops = gemm._gemm_tflops(512, bow, "fp32")
    assert tflops == pytest.approx(2 * 512**3 / report.totals["time_s"] / 1e12)


# -- user catalogues -----------------------------------------------------------------------------

_GOOD_HEAD = 'format = "dabench-ir/measurements/v1"\n'


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[[points]]\nid = 'x'\nkind = 'model'\ntarget = 'rdu'\n", "point 'x': source: missing"),
        ("[[points]]\nid = 'x'\nkind = 'nope'\ntarget = 'rdu'\nsource = 's'\n", "point 'x': kind: 'nope' is not"),
        ("[[points]]\nid = 'x'\nkind = 'bandwidth'\ntarget = 'nochip'\nsource = 's'\n", "point 'x': target:"),
        (
            "[[points]]\nid = 'x'\nkind = 'gemm'\ntarget = 'ipu'\nsource = 's'\ngemm = {size = 64}\n"
            "measured = {tflops = -3}\n",
            "point 'x': measured.tflops: expected a positive number",
        ),
        (
            "[[points]]\nid = 'x'\nkind = 'gemm'\ntarget = 'ipu'\nsource = 's'\ngemm = {size = 64}\n"
            "measured = {tflop = 1.0}\n",
            "point 'x': measured.tflop: a quantity the format does not define; did you mean 'tflops'?",
        ),
        (
            "[[points]]\nid = 'x'\nkind = 'model'\ntarget = 'rdu'\nsource = 's'\nmeasured = {samples_per_s = 1.0}\n"
            "model = {family = 'gpt2', layers = 1, hidden = 64, heads = 4, seq = 8, batch = 1}\n"
            "run = {opt_levl = 'O3'}\n",
            "point 'x': run.opt_levl: no such run key; did you mean 'opt_level'?",
        ),
        (
            "[[points]]\nid = 'x'\nkind = 'model'\ntarget = 'rdu'\nsource = 's'\nmeasured = {samples_per_s = 1.0}\n"
            "model = {family = 'gpt2', layers = 1, hidden = 'big', heads = 4, seq = 8, batch = 1}\n",
            "point 'x': model.hidden: expected a int",
        ),
        (
            "[[points]]\nid = 'x'\nkind = 'model'\ntarget = 'rdu'\nsource = 's'\nmeasured = {samples_per_s = 1.0}\n"
            "model = {family = 'gpt2', layers = 1, hidden = 64, heads = 4, seq = 8, batch = 1}\nrun = {ipus = 0}\n",
            "point 'x': run.ipus: expected a positive integer",
        ),
        ("[[points]\nid = 'x'\n", "not valid TOML"),
    ],
)
def test_malformed_user_catalogue_exits_2_with_one_line(tmp_path, capsys, body, needle):
    path = tmp_path / "bad.toml"
    path.write_text(_GOOD_HEAD + body)
    assert main(["validate", "--catalog", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) in err and needle in err


def test_unwritable_output_is_a_user_error(tmp_path, capsys):
    cat = tmp_path / "bw.toml"
    cat.write_text(
        _GOOD_HEAD + "[[points]]\nid = 'b'\nkind = 'bandwidth'\ntarget = 'ipu'\nsource = 's'\n"
        "measured = {bandwidth_gb_s = 20.0}\n"
    )
    assert main(["validate", "--catalog", str(cat), "-q", "--csv", str(tmp_path / "no" / "dir" / "v.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--csv" in err


def test_missing_catalogue_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        validate.load_catalog(tmp_path / "nothere.toml")


_TINY = Path(__file__).parent / "data" / "tiny_catalogue.toml"  # a user's catalogue in little


@pytest.mark.torch
def test_tiny_user_catalogue_runs_through_the_cli(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    cat = tmp_path / "mine.toml"
    cat.write_text(_TINY.read_text())
    out_json, out_csv, plots = tmp_path / "v.json", tmp_path / "v.csv", tmp_path / "plots"
    args = ["validate", "--catalog", str(cat), "--cache-dir", str(tmp_path / "cache"), "-q"]
    assert main([*args, "--json", str(out_json), "--csv", str(out_csv), "--plots", str(plots)]) == 0
    text = capsys.readouterr().out
    assert "tiny-rdu" in text and "ignored" not in text
    assert "tiny-refused" in text and "CANNOT RUN: run.half_partials = True: applies to ipu targets" in text
    assert "huge-gemm" in text and "CANNOT RUN" in text
    with out_csv.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(write._COLUMNS)
    by = {(r["id"], r["quantity"]): r for r in rows}
    tp = by[("tiny-rdu", "samples_per_s")]
    assert tp["status"] == "ok" and float(tp["predicted"]) > 0
    assert float(tp["rel_error"]) == pytest.approx((float(tp["predicted"]) - 100.0) / 100.0)
    assert float(by[("tiny-rdu", "host_time_s")]["predicted"]) > 0  # the RDU reports its host time as a row
    assert by[("tiny-rdu", "joules")]["note"].startswith("not predicted (a quantity the catalogue format does not")
    assert float(by[("tiny-rdu", "tokens_per_s")]["predicted"]) == pytest.approx(8 * float(tp["predicted"]))
    assert by[("tiny-rdu", "sections")]["predicted"] != ""
    # a multi-chip point goes through the scaling stage: throughput predicted, per-chip figures not
    assert float(by[("tiny-rdu-tp2", "samples_per_s")]["predicted"]) > 0
    assert by[("tiny-rdu-tp2", "sections")]["note"] == "not predicted (multi-chip)"
    assert tp["fit_verdict"] == "right"
    assert by[("huge-gemm", "tflops")]["status"] == "cannot run"
    assert float(by[("tiny-bw", "bandwidth_gb_s")]["predicted"]) == 20.0  # bow's streaming memory
    data = json.loads(out_json.read_text())
    assert data["schema"] == "dabench-ir/validation/v1"
    assert set(data["summary"]) == {"sn30", "bow"}
    assert data["summary"]["bow"]["cannot_run"] == 1
    assert sorted(p.name for p in plots.iterdir()) == ["validation-bow.png", "validation-sn30.png"]
    # the export is cached: a second run does not export again
    assert (tmp_path / "cache").is_dir() and len(list((tmp_path / "cache").glob("*.onnx"))) == 1


# -- regression guard ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.torch
def test_no_point_got_worse_than_the_pinned_baseline():
    """Every point's |error| stays within the pinned one (+ tolerance); no right fit verdict flips.

    After improving a model, regenerate the baseline: .venv/bin/python scripts/validation_report.py
    """
    pytest.importorskip("torch")
    pinned = json.loads(BASELINE.read_text())
    result = validate.run_validation(validate.load_catalog())
    assert result.seconds < 600
    problems = validate.regressions(result, pinned)
    assert not problems, "\n".join(problems)
    # every bundled point is pinned, so a new point is guarded as soon as the baseline is regenerated
    assert set(pinned["points"]) == {r.point.id for r in result.results}
    for r in result.results:
        for q in r.quantities:
            assert q.error is None or math.isfinite(q.error)


def test_regressions_detects_worse_errors_and_flipped_fits():
    good = validate.PointResult(
        _point("a"),
        quantities=[validate.Quantity("samples_per_s", 10.0, 11.0)],
        fits_expected=True,
        fits_predicted=True,
    )
    pinned = validate.baseline(validate.Validation([good]))
    assert validate.regressions(validate.Validation([good]), pinned) == []
    worse = validate.PointResult(
        _point("a"),
        quantities=[validate.Quantity("samples_per_s", 10.0, 13.0)],
        fits_expected=True,
        fits_predicted=False,
    )
    problems = validate.regressions(validate.Validation([worse]), pinned)
    assert any("fit verdict flipped" in p for p in problems)
    assert any("samples_per_s |error| 30.0%" in p for p in problems)
    assert validate.regressions(validate.Validation([]), pinned) == [
        "a: pinned point is missing from the catalogue run"
    ]


def test_points_run_in_forked_workers_give_the_serial_results(tmp_path):
    """Issue 34: `run_validation` runs groups of points (one model's together) in forked workers; each
    result equals the one the same point gets in this process, and carries the catalogue's own Point."""
    points = [p for p in validate.load_catalog() if p.kind in ("gemm", "gemm_max_fit", "gemm_ratio", "bandwidth")]
    assert len(points) >= 4
    serial_cache = runner.GraphCache(tmp_path, lambda _m: None)
    serial = [runner._run_point(p, serial_cache) for p in points]
    done: dict = {}
    groups = [[0, 1], *([i] for i in range(2, len(points)))]
    runner._run_parallel(points, groups, tmp_path, 2, done, lambda *a, **k: None)
    assert sorted(done) == list(range(len(points)))
    assert [done[i] for i in range(len(points))] == serial
    assert all(done[i].point is p for i, p in enumerate(points))
    assert any(q.predicted is not None for r in serial for q in r.quantities)


def test_points_a_worker_cannot_return_run_in_this_process(tmp_path, monkeypatch):
    """A worker whose results cannot come back (here: its task raises) leaves its points, and every
    point not yet done, to the serial run: `run_validation` still gives every point its result."""
    points = [p for p in validate.load_catalog() if p.kind in ("gemm_ratio", "bandwidth")]
    expected = [runner._run_point(p, runner.GraphCache(tmp_path, lambda _m: None)) for p in points]

    def broken(_points, _folder):
        raise RuntimeError("cannot pickle this")

    monkeypatch.setattr(runner, "_run_points", broken)
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)  # the fork path is taken
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    forked = []
    parallel = runner._run_parallel
    monkeypatch.setattr(runner, "_run_parallel", lambda *a: forked.append(parallel(*a)))
    result = validate.run_validation(points, cache_dir=tmp_path)
    assert forked and result.results == expected
