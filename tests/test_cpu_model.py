"""Host-CPU model (issue 23): node signatures, the per-node benchmark table, cache residency,
noise (repeat=auto, per-node spread) and the validate host points.

Timing accuracy is never asserted: structure, exact numbers from synthetic tables, and the
benchmark's time bound."""

from __future__ import annotations

import json
import math
import time

import onnx
import pytest

from dabench_ir.errors import UserError
from dabench_ir.execute.ort import median_ci_halfwidth, parse_profile, rel_spread, run_profiled
from dabench_ir.lowering.cpu import (
    OUTPUT_COLD,
    CpuModel,
    _bytes_written_before,
    cold_share,
    load_cpu_model,
    node_signature,
    node_table_path,
    predict_cpu_times,
)
from dabench_ir.metrics import prediction_error
from dabench_ir.pipeline import analyze
from tests._helpers import cpu_target_data
from tests.conftest import parse

# two layers' worth of the same shapes, a weight transpose, a head transpose, a reshape
_TEXT = """
agraph (float[8,16] x) => (float[2,8,8] y) <float[16,16] W1 = {%s}, float[16,16] W2 = {%s}, int64[3] shp = {2,8,8}>
{
    a = MatMul(x, W1)
    b = MatMul(a, W2)
    t = Transpose<perm=[1,0]>(W1)
    c = MatMul(b, t)
    r = Reshape(c, shp)
    y = Transpose<perm=[0,2,1]>(r)
}
""" % (",".join(["0.5"] * 256), ",".join(["0.25"] * 256))  # noqa: UP031


def _graph():
    return analyze(parse(_TEXT))


def _names(graph):
    return {n.op_type + str(i): n for i, n in enumerate(graph.nodes)}


def test_signature_separates_shape_families_and_merges_repeats():
    graph = _graph()
    n = _names(graph)
    sig = {k: node_signature(graph, v) for k, v in n.items()}
    # same op, shapes and weight operand: one family (measured once)
    assert sig["MatMul0"] == sig["MatMul1"]
    # B computed at run time (a transposed weight) is another family than a stored, pre-packed B
    assert sig["MatMul3"] != sig["MatMul0"]
    assert "fp32[16, 16]w" in sig["MatMul0"] and sig["MatMul3"].endswith("out:fp32[8, 16]")
    # the permutation and the operand kind are part of a transpose's family
    assert "perm=[1, 0]" in sig["Transpose2"] and "in:fp32[16, 16]w" in sig["Transpose2"]
    assert "perm=[0, 2, 1]" in sig["Transpose5"]


def test_plan_signatures_groups_and_orders_by_estimate():
    from dabench_ir.execute.microbench import plan_signatures

    graph = _graph()
    cpu = CpuModel(peak_flops=1e9, bandwidth=1e9, overhead_s=1e-6)
    plan = plan_signatures(graph, cpu)
    assert sum(len(names) for _, names, _ in plan) == len(graph.nodes)
    groups = {len(names) for _, names, _ in plan}
    assert 2 in groups  # the two identical MatMuls share one benchmark
    estimates = [e for _, _, e in plan]
    assert estimates == sorted(estimates, reverse=True)


def test_cold_share_by_reuse_distance():
    graph = _graph()
    n = _names(graph)
    written = _bytes_written_before(graph)
    # MatMul0 reads x (graph input, cold, 512 B) and W1 (weight, cold, 1024 B); its output (512 B)
    # goes to a buffer the run freed: hot
    assert OUTPUT_COLD == 0.0
    assert cold_share(graph, n["MatMul0"], written, 1 << 20) == pytest.approx(1536 / 2048)
    # MatMul1 reads a (just written: hot, 512 B) and W2 (cold, 1024 B); output 512 B cold
    expected = (0 * 512 + 1 * 1024 + OUTPUT_COLD * 512) / (512 + 1024 + 512)
    assert cold_share(graph, n["MatMul1"], written, 1 << 20) == pytest.approx(expected)
    # MatMul3 reads t, written one node earlier... and b, written before t (t's 1024 B since):
    # with a 2048-byte private cache b is half cold
    b_share = 1024 / 2048
    expected = (b_share * 512 + 0 * 1024 + OUTPUT_COLD * 512) / (512 + 1024 + 512)
    assert cold_share(graph, n["MatMul3"], written, 2048) == pytest.approx(expected)
    # views touch no data
    assert cold_share(graph, n["Reshape4"], written, 2048) == 0.0


def test_prediction_from_a_synthetic_node_table_is_exact(tmp_path):
    graph = _graph()
    n = _names(graph)
    sig = node_signature(graph, n["MatMul1"])
    table = {sig: (10e-6, 30e-6)}
    # a 1 KiB private cache: the run (weights 2 KiB, activations) does not fit, what it read a run ago is cold
    cpu = CpuModel(peak_flops=1e9, bandwidth=1e9, overhead_s=1e-6, nodes=table, l2_bytes=1024)
    pred = predict_cpu_times(graph, cpu)
    share = cold_share(graph, n["MatMul1"], _bytes_written_before(graph), 1024)
    assert 0 < share < 1
    # both MatMul0 and MatMul1 have the signature; each sits between hot and flushed by its cold share
    assert pred[n["MatMul1"].name] == pytest.approx(10e-6 + share * 20e-6)
    assert pred[n["MatMul0"].name] == pytest.approx(10e-6 + 0.75 * 20e-6)  # every operand cold, output hot
    # a node without a table entry keeps the class model (here the overhead of a view)
    assert pred[n["Reshape4"].name] == pytest.approx(1e-6)


def test_node_table_is_read_beside_the_calibration(tmp_path):
    from dabench_ir.execute.calibrate import dump_toml
    from dabench_ir.lowering.cpu import NODE_TABLE_FORMAT

    target = tmp_path / "cpu-1t-x.toml"
    target.write_text(dump_toml(cpu_target_data()))
    table = {
        "format": NODE_TABLE_FORMAT,
        "threads": 1,
        "l2_bytes": 4096,
        "nodes": {"sig-a": {"time_s": 1e-5, "cold_s": 2e-5}, "bad": {"time_s": "x"}},
    }
    node_table_path(target).write_text(json.dumps(table))
    model = load_cpu_model(target)
    assert model.nodes == {"sig-a": (1e-5, 2e-5)} and model.l2_bytes == 4096
    node_table_path(target).write_text(json.dumps({**table, "format": NODE_TABLE_FORMAT + 1}))
    assert load_cpu_model(target).nodes == {}  # another format: measured again, class model meanwhile


def test_a_node_table_timed_at_another_thread_count_is_neither_read_nor_written_over(tmp_path):
    """A 1-thread calibration's table had been read whatever its thread count, and a run at 2 threads
    wrote its 2-thread table over it (the 1-thread peak then met 2-thread kernel times)."""
    from types import SimpleNamespace

    from dabench_ir.execute.calibrate import dump_toml
    from dabench_ir.execute.microbench import ensure_node_table
    from dabench_ir.lowering.cpu import NODE_TABLE_FORMAT

    data = cpu_target_data()
    data["calibration"]["key"] = {"threads": 1}
    target = tmp_path / "cpu-1t-x.toml"
    target.write_text(dump_toml(data))
    table = {
        "format": NODE_TABLE_FORMAT,
        "threads": 1,
        "l2_bytes": 4096,
        "nodes": {"s": {"time_s": 1e-5, "cold_s": 2e-5}},
    }
    node_table_path(target).write_text(json.dumps(table))
    assert load_cpu_model(target).nodes == {"s": (1e-5, 2e-5)}
    node_table_path(target).write_text(json.dumps({**table, "threads": 2}))
    assert load_cpu_model(target).nodes == {}
    named = {**data, "calibration": {**data["calibration"], "file": str(target)}}  # as `with_node_table` names it
    assert load_cpu_model(SimpleNamespace(raw=named)).nodes == {}
    before = node_table_path(target).read_text()
    model = parse(_TEXT)
    with pytest.raises(UserError, match="calibrated at 1 thread"):
        ensure_node_table(model, analyze(model), target, threads=2, budget_s=5.0)
    assert node_table_path(target).read_text() == before


def test_node_benchmarks_measure_each_family_once_within_budget(tmp_path):
    from dabench_ir.execute.calibrate import dump_toml
    from dabench_ir.execute.microbench import ensure_node_table

    target = tmp_path / "cpu-1t-x.toml"
    target.write_text(dump_toml(cpu_target_data()))
    model = parse(_TEXT)
    graph = analyze(model)
    # no budget: nothing measured, every family left to the class model, said why
    res = ensure_node_table(model, graph, target, threads=1, budget_s=0.0)
    assert not res.measured and all("budget" in why for why in res.skipped.values())
    assert not node_table_path(target).exists()
    # a small budget is kept (each family takes a bounded slice of it)
    start = time.perf_counter()
    res = ensure_node_table(model, graph, target, threads=1, budget_s=5.0)
    assert time.perf_counter() - start < 5.0 + 2.0
    assert len(res.measured) == 5  # six nodes, the two identical MatMuls once
    for rec in res.measured.values():
        assert rec["time_s"] > 0 and rec["cold_s"] > 0 and rec["spread"] >= 0 and rec["runs"] >= 5
    data = json.loads(node_table_path(target).read_text())
    assert data["threads"] == 1 and set(data["nodes"]) == set(res.measured)
    # cached: nothing measured again; the lowering now predicts from the table
    again = ensure_node_table(model, graph, target, threads=1, budget_s=5.0)
    assert not again.measured and again.cached == 5
    cpu = load_cpu_model(target)
    assert len(cpu.nodes) == 5
    assert set(predict_cpu_times(graph, cpu)) == {n.name for n in graph.nodes}


def test_bench_node_model_takes_shape_operands_from_the_output():
    from dabench_ir.execute.microbench import _Context, bench_node_model

    model = parse("""agraph (float[4,6] x, int64[2] s) => (float[2,12] y) { y = Reshape(x, s) }""")
    graph = analyze(model)
    ctx = _Context.of(model, {})
    bench, feeds = bench_node_model(model.graph.node[0], graph, ctx)
    assert [n.name for n in bench.graph.node] == ["bench"]
    assert feeds["s"].tolist() == [2, 12]
    onnx.checker.check_model(bench)


# -- noise ---------------------------------------------------------------------------------
def test_spread_statistics_exact():
    assert rel_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)
    assert rel_spread([2.0]) == 0.0
    # n = 9: order statistics floor(4.5 - 2.94) = 1 and ceil(4.5 + 2.94) - 1 = 7
    xs = [float(i) for i in range(1, 10)]
    assert median_ci_halfwidth(xs) == pytest.approx((8.0 - 2.0) / (2 * 5.0))
    assert math.isinf(median_ci_halfwidth([1.0, 2.0]))


def test_parse_profile_gives_each_node_its_spread():
    def run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}

    def node(name, ts, dur):
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": "Add"}}

    events = []
    for i, d in enumerate([10, 20, 30, 40, 50]):
        base = 1000 * (i + 1)
        events += [run(base, 100), node("a", base + 1, d), node("b", base + 60, 5)]
    prof = parse_profile(events)
    assert prof.node_spread["a"] == pytest.approx((40 - 20) / 30)
    assert prof.node_spread["b"] == 0.0
    assert prof.run_spread == 0.0


def test_repeat_auto_runs_until_the_median_is_known():
    from dabench_ir.execute.ort import AUTO_MAX_RUNS

    model = parse("agraph (float[64] x, float[64] z) => (float[64] y) { y = Add(x, z) }")
    import numpy as np

    feeds = {"x": np.ones(64, np.float32), "z": np.ones(64, np.float32)}
    prof = run_profiled(model, feeds, warmup=1, repeat="auto", threads=1)
    assert 8 <= len(prof.run_times_s) <= AUTO_MAX_RUNS
    with pytest.raises(UserError):
        run_profiled(model, feeds, repeat="often")


def test_measure_records_spread_per_node_and_auto_repeat():
    from dabench_ir.execute import measure

    model = parse("agraph (float[64] x, float[64] z) => (float[64] y) { a = Add(x, z)  y = Mul(a, z) }")
    m = measure(model, warmup=1, repeat="auto", threads=1)
    assert set(m.node_spread) == set(m.node_times) and m.repeat >= 8 and m.repeat_auto
    d = m.to_dict()
    assert set(d["node_spread_rel"]) == set(m.node_times) and "run_spread_rel" in d


def test_repeat_knob_accepts_auto():
    from dabench_ir.options import ProfileOptions

    assert ProfileOptions(repeat="auto").repeat == "auto"
    assert ProfileOptions(repeat="7").repeat == 7
    with pytest.raises(UserError):
        ProfileOptions(repeat="sometimes")


def test_prediction_error_says_what_is_within_noise():
    measured = {"a": 0.50, "b": 0.30, "c": 0.20}
    predicted = {"a": 0.55, "b": 0.24, "c": 0.20}
    spread = {"a": 0.2, "b": 0.1, "c": 0.0}
    err = prediction_error(predicted, measured, spread=spread, run_spread=0.005)
    # node errors 0.1, 0.2, 0.0 against spreads 0.2, 0.1, 0.0: a and c within
    assert err["nodes_within_noise"] == 2
    assert err["median_node_spread"] == pytest.approx(0.1)
    # the nodes' time-weighted spread 0.5*0.2 + 0.3*0.1 = 0.13 is the nodes', named so
    assert err["weighted_node_spread"] == pytest.approx(0.13)
    # end to end: the runs' own spread (0.5%), against the end-to-end error |0.99 - 1.0| = 1%: beyond it
    # (the weighted node spread had stood in for it: "13% end to end, within noise")
    assert err["end_to_end_spread"] == pytest.approx(0.005)
    assert err["end_to_end_within_noise"] is False
    assert prediction_error(predicted, measured, run_spread=0.02)["end_to_end_within_noise"] is True
    # no run spread given: no end-to-end noise figure, rather than the nodes' under its name
    nodes_only = prediction_error(predicted, measured, spread=spread)
    assert "end_to_end_spread" not in nodes_only and "end_to_end_within_noise" not in nodes_only
    assert "nodes_within_noise" not in prediction_error(predicted, measured)


# -- validate host points -------------------------------------------------------------------
_HOST_POINT = """
format = "dabench-ir/measurements/v1"
[[points]]
id = "h1"
kind = "host"
target = "cpu"
source = "live"
host = { builder = "hf", family = "llama", layers = 1, hidden = 128, heads = 2, kv_heads = 1, seq = 16 }
"""


def test_host_points_parse_and_reject_bad_keys():
    from dabench_ir import validate

    (p,) = validate.parse_catalog(_HOST_POINT)
    assert p.kind == "host" and p.target == "cpu" and p.host["kv_heads"] == 1
    with pytest.raises(UserError, match=r"host\.attention"):
        validate.parse_catalog(_HOST_POINT.replace("seq = 16", 'seq = 16, attention = "flash"'))
    with pytest.raises(UserError, match="measured"):
        validate.parse_catalog(_HOST_POINT + "measured = { samples_per_s = 1.0 }\n")
    bundled = [p for p in validate.load_catalog() if p.kind == "host"]
    assert {p.host.get("family") for p in bundled} == {"llama", "gpt2"}
    assert {p.host.get("attention", "eager") for p in bundled} == {"eager", "sdpa"}
    assert any(p.host.get("ort_opt") for p in bundled)


def test_host_points_run_only_under_target_cpu(monkeypatch):
    from dabench_ir import validate
    from dabench_ir.execute import hostcheck

    err = {
        "end_to_end_rel_error": 0.05,
        "median_node_rel_error": 0.1,
        "p90_node_rel_error": 0.3,
        "nodes_compared": 12,
        "median_node_spread": 0.04,
        "end_to_end_spread": 0.06,
        "end_to_end_within_noise": True,
        "nodes_within_noise": 5,
    }
    calls = []

    def fake(host, **_kw):
        calls.append(host)
        return hostcheck.HostResult(
            label=hostcheck.host_label(host), measured_s=1e-3, predicted_s=1.05e-3, error=err, repeat=40
        )

    monkeypatch.setattr(hostcheck, "run_host", fake)
    points = validate.parse_catalog(_HOST_POINT)
    assert validate.run_validation(points).results == [] and not calls  # not asked for: not measured
    result = validate.run_validation(points, target="cpu")
    (row,) = result.rows()
    assert row["kind"] == "host" and row["quantity"] == "step_time_s"
    assert row["rel_error"] == pytest.approx(0.05)
    assert row["host"]["median_node_rel_error"] == 0.1 and row["host"]["end_to_end_within_noise"] is True
    text = result.format_table()
    assert "within noise" in text and "median |error| 10.0%" in text


def test_a_calibrated_target_brings_its_node_table_to_the_lowering(tmp_path, monkeypatch):
    from dabench_ir.execute import calibrate as cal
    from dabench_ir.execute.microbench import ensure_for_target
    from dabench_ir.targets import load_target

    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path))
    path = cal.calibrate(1, quick=True)
    target = load_target(path)
    model = parse(_TEXT)
    graph = analyze(model)
    assert load_cpu_model(target).nodes == {}  # the plain target does not say where its file is
    lowered_with = ensure_for_target(model, graph, target, threads=1)
    assert lowered_with.raw["calibration"]["file"] == str(path)
    assert len(load_cpu_model(lowered_with).nodes) == 5
    assert node_table_path(path).is_file()


def test_a_run_that_fits_the_private_cache_stays_hot():
    graph = _graph()
    n = _names(graph)
    written = _bytes_written_before(graph)
    # footprint 1 KiB against a 1 MiB L2: stored operands are 1/1024 cold (3/4 of MatMul0's bytes)
    assert cold_share(graph, n["MatMul0"], written, 1 << 20, run_bytes=1024) == pytest.approx(0.75 / 1024)
    assert cold_share(graph, n["MatMul0"], written, 1 << 20, run_bytes=4 << 20) == pytest.approx(0.75)


def test_a_model_whose_only_node_writes_the_graph_output_is_benchmarked(tmp_path):
    from dabench_ir.execute.calibrate import dump_toml
    from dabench_ir.execute.microbench import ensure_node_table

    target = tmp_path / "cpu-1t-x.toml"
    target.write_text(dump_toml(cpu_target_data()))
    ones = ",".join(["1.0"] * 64)
    model = parse("agraph (float[4,8] x) => (float[4,8] y) <float[8,8] W = {" + ones + "}> { y = MatMul(x, W) }")
    res = ensure_node_table(model, analyze(model), target, threads=1, budget_s=5.0)
    assert len(res.measured) == 1 and not res.skipped


def test_node_benchmark_passes_keep_the_median_of_the_quiet_ones():
    from dabench_ir.execute.microbench import combine_passes

    def rec(t, spread=0.1, runs=10):
        return {"time_s": t, "spread": spread, "runs": runs}

    hots = [rec(100e-6), rec(160e-6), rec(104e-6, 0.3)]
    colds = [rec(120e-6), rec(190e-6), rec(130e-6)]
    # no probe readings: the median over the passes, not the fastest or the slowest window
    hot, cold = combine_passes(hots, colds)
    assert hot["time_s"] == pytest.approx(104e-6) and cold["time_s"] == pytest.approx(130e-6)
    assert hot["runs"] == 30 and hot["attempts"] == 3 and hot["busy"] == 0
    assert hot["spread"] == pytest.approx(0.1) and hot["drift"] == pytest.approx(60 / 104)
    # the second pass ran while the probe read 2x its quiet time (another job held a core): dropped
    hot, cold = combine_passes(hots, colds, [1.0e-4, 2.0e-4, 1.2e-4], quiet=1.0e-4)
    assert hot["time_s"] == pytest.approx(102e-6) and cold["time_s"] == pytest.approx(125e-6)
    assert hot["attempts"] == 2 and hot["busy"] == 1 and hot["runs"] == 20
    # every pass busy against the table's quiet reading: those nearest it are kept
    hot, cold = combine_passes(hots, colds, [2.0e-4, 3.5e-4, 2.1e-4], quiet=1.0e-4)
    assert hot["time_s"] == pytest.approx(102e-6) and hot["busy"] == 1
