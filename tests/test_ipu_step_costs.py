"""The IPU step's fixed costs, each a row of its own (lowering/ipu/step.py): host data streams,
gradient accumulation, pipeline ramp, optimizer; exact figures from their formulas on a tiny GPT-2."""

from __future__ import annotations

import pytest

import dabench_ir
from dabench_ir.ir import ValueKind
from dabench_ir.targets import load_target
from tests._helpers import weightless

IPU = load_target("bow")
GATEWAY = IPU.link("gateway")
ROWS = ("pipeline_fill_drain", "host_streams", "grad_accumulate", "optimizer")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ipu_step") / "gpt2.onnx"
    return weightless(path, family="gpt2", layers=2, hidden=64, heads=4, seq=32, vocab=128, batch=2)


def _train(path: str, m: int, precision: str = "fp16", **kw) -> dabench_ir.Report:
    return dabench_ir.profile(path, target="ipu", mode="train", precision=precision, ipus=2, micro_batches=m, **kw)


def _inputs(report) -> float:
    """The graph's input bytes counted here from its values (token ids, and labels if any)."""
    graph = report.graph
    inputs = [v for v in graph.values.values() if v.kind is ValueKind.INPUT]
    return float(sum(v.type.numel(graph.bindings) * v.type.dtype.itemsize for v in inputs))


def test_the_figures_the_rows_read():
    assert GATEWAY.bandwidth_bytes_per_s == 6.25e9 and GATEWAY.latency_s == 5e-6
    # PopLibs' elementwise codelets: 3 tile-cycles a 64-bit vector (4 fp16 or 2 fp32 elements)
    assert (
        IPU.arch_value("vector_elems_per_cycle_fp16") == 1.3333
        and IPU.arch_value("vector_elems_per_cycle_fp32") == 0.6667
    )


@pytest.mark.parametrize("m", [1, 2])
def test_host_streams_are_m_latencies_plus_the_inputs_at_gateway_bandwidth(tiny, m):
    report = _train(tiny, m)
    inputs = _inputs(report)
    assert inputs == 2 * 32 * 8  # one int64 token-id tensor of the batch
    want = m * 5e-6 + inputs / 6.25e9
    assert report.timeline.overheads_s["host_streams"] == pytest.approx(want, rel=1e-12)


def test_grad_accumulate_is_m_adds_of_the_most_loaded_ipus_gradients(tiny):
    report = _train(tiny, 2)
    params = max(u.resources["grad_accum_bytes"] / 2 for u in report.plan.units if u.kind == "ipu")  # fp16 grads
    want = 2 * params / (1.3333 * 1.85e9 * 1472)  # m adds on the fp16 vector lanes of every tile
    assert report.timeline.overheads_s["grad_accumulate"] == pytest.approx(want, rel=1e-12)
    fp32 = _train(tiny, 2, precision="fp32")
    params32 = max(u.resources["grad_accum_bytes"] / 4 for u in fp32.plan.units if u.kind == "ipu")
    assert params32 == params
    assert fp32.timeline.overheads_s["grad_accumulate"] == pytest.approx(2 * params / (0.6667 * 1.85e9 * 1472))
    # one micro-batch a step: nothing accumulated, no row
    assert "grad_accumulate" not in _train(tiny, 1).timeline.overheads_s


def test_step_is_m_cycles_plus_each_row_and_the_rows_are_the_reports_own(tiny):
    report = _train(tiny, 2)
    over = report.timeline.overheads_s
    assert tuple(over) == ROWS  # this order; no replicas: no gradient_reduce
    cycle = report.plan.extra["cycle_s"]
    stages = report.plan.extra["pipeline_stages"]
    assert over["pipeline_fill_drain"] == pytest.approx((stages - 1) * cycle)
    assert report.timeline.step_time_s == pytest.approx(2 * cycle + sum(over.values()), rel=1e-12)
    d = report.to_dict()
    assert d["overheads"] == pytest.approx(dict(over))
    roles = {r["role"]: r for r in d["roles"]}
    for name in ROWS:  # time no node owns: its own row, bound "overhead"
        assert roles[f"overhead: {name}"]["time_s"] == pytest.approx(over[name])
        assert roles[f"overhead: {name}"]["bound"] == "overhead" and roles[f"overhead: {name}"]["nodes"] == 0


def test_without_the_mechanisms_the_step_is_shorter_by_exactly_their_rows(tiny):
    """The counterfactual: the same run with host streams and accumulation taken out."""
    report = _train(tiny, 2)
    over = report.timeline.overheads_s
    without = report.timeline.step_time_s - over["host_streams"] - over["grad_accumulate"]
    assert without < report.timeline.step_time_s
    assert without == pytest.approx(2 * report.plan.extra["cycle_s"] + over["pipeline_fill_drain"] + over["optimizer"])


def test_inference_streams_through_without_step_rows(tiny):
    report = dabench_ir.profile(tiny, target="ipu", ipus=2, micro_batches=2)
    assert not {"host_streams", "grad_accumulate"} & set(report.timeline.overheads_s)


def test_a_tied_head_on_ipu_0_does_not_hold_up_the_next_micro_batch():
    """GPT-2 small's tied head returns to IPU 0, beside the embedding: in each cycle the IPU runs both
    stages, for different micro-batches. A step alone is one micro-batch through every stage, then one
    cycle (the period's share of a micro-batch) for each of the others; it was every node one after
    another (92.2 ms against 30.9), so a prefill on 4 IPUs took as long as on one. The period, the
    busiest IPU's work, is the same either way (27.322 ms: 26.797 ms while the token + position add
    ran with block 0 on IPU 1, 26.606 ms with the embeddings on IPU 0, then vector ops at PopLibs'
    codelet rates, spread over a grain of work a tile, and each op's exchange at its tiles' share;
    27.240 ms since a weight's folded layout no longer crosses the IPU-Link)."""
    from dabench_ir import api

    m = 16
    report = api.profile("gpt2-small", target="bow", ipus=4, batch=16, micro_batches=m)
    totals = report.totals
    one_pass = sum(n.time_s for n in report.nodes if n.time_s) / m
    assert totals["latency_s"] == pytest.approx(one_pass + (m - 1) * totals["period_s"] / m, rel=2e-2)
    assert totals["period_s"] == pytest.approx(27.240e-3, rel=1e-3)


def test_a_training_step_alone_fills_and_drains_its_pipeline_once():
    """A training step drains before its weight update, so its period pays the fill and drain; its
    latency, the emulated step from first input to last output, holds it already (it was added again:
    72.6 ms against a 65.1 ms period)."""
    from dabench_ir import api

    report = api.profile("dabench-gpt2-h768", target="bow", mode="train", ipus=4, batch=16, micro_batches=16)
    totals = report.totals
    assert report.to_dict()["overheads"]["pipeline_fill_drain"] > 0
    assert totals["latency_s"] <= totals["period_s"]


def test_a_decode_steps_kv_cache_is_held_in_tile_memory():
    """The Bow keeps a decode step's KV caches in its tiles' SRAM from one step to the next: 64
    requests at about 1,000 tokens of GPT-2 small hold 2.35 GB of cache, 2.5 times the IPU, which
    does not fit (it had 'fit' and given tokens/s: the cache was in no memory term)."""
    import dabench_ir

    small = dabench_ir.generate("gpt2-small", "bow", prompt=128, gen=4, batch=4)
    assert small.fits
    terms = small.decode[-1].report.plan.extra["memory_terms"]
    cache = 2 * 12 * 768 * 130 * 4 * 2  # K and V, 12 layers, 768 wide, the last step's 130 tokens, fp16
    assert sum(t["kv_cache"] for t in terms.values()) == cache
    big = dabench_ir.generate("gpt2-small", "bow", prompt=900, gen=100, batch=64)
    assert not big.fits and "largest part: kv cache" in big.decode[-1].failure


def test_a_pipelined_generation_states_one_ipus_weights_and_cache():
    """Over 2 pipelined IPUs, the weights and KV cache a generation states per chip are the fuller
    IPU's, not the whole model's (249 MB of weights and 18.9 MB of cache had been "per chip")."""
    import dabench_ir

    whole = dabench_ir.generate("gpt2-small", "bow", prompt=128, gen=2, batch=4)
    split = dabench_ir.generate("gpt2-small", "bow", prompt=128, gen=2, batch=4, chips=2, strategy="pp")
    step = split.decode[-1]
    terms = step.report.plan.extra["memory_terms"]
    # the model's weights the IPU reads (its tile memory's term adds 42 B of constants)
    assert step.weight_bytes == pytest.approx(max(t["weights"] for t in terms.values()), abs=64)
    assert step.weight_bytes < whole.decode[-1].weight_bytes
    assert step.kv_cache_bytes == max(t["kv_cache"] for t in terms.values()) < whole.decode[-1].kv_cache_bytes


def test_a_layout_that_leaves_the_last_ipus_empty_is_refused():
    """``--ipus 2 --layers-per-ipu 12,0``: IPU 1 would hold nothing (the tied head returns to IPU 0),
    and the run was placed on one IPU without a word; a first IPU of none is Graphcore's own layout."""
    import dabench_ir

    with pytest.raises(dabench_ir.ApiError, match=r"layers_per_ipu=12,0 leaves IPU 1 without a layer"):
        dabench_ir.profile("gpt2-small", "bow", ipus=2, layers_per_ipu=(12, 0))
    assert dabench_ir.profile("gpt2-small", "bow", ipus=4, layers_per_ipu=(0, 4, 4, 4)).plan.chips == 4
