"""WSE lowering: kernels as compiled, per-class rates, balanced regions, weight streaming, replicas.

Exact numbers on hand-built graphs (tests/lowering_graphs.py), then the GPT-2 small compile
report (catalogue point A) and the weight-streaming capacity limit.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from dabench_ir.emulate import emulate
from dabench_ir.errors import UserError
from dabench_ir.lowering import lower
from dabench_ir.lowering.context import LoweringContext, balance
from dabench_ir.lowering.wse import wse_kernels
from dabench_ir.metrics import compute_metrics
from dabench_ir.options import ProfileOptions
from dabench_ir.passes.training import TrainingPass
from dabench_ir.targets import builtin_target_paths, load_target
from tests.lowering_graphs import decoder

WSE = load_target("wse")
WSE_TOML = builtin_target_paths()["wse2"]
CLOCK = float(WSE.clock)


def _train(graph):
    return TrainingPass()(graph).graph


def _kernels(graph):
    return wse_kernels(LoweringContext.build(graph), WSE)


def test_balance_with_fixed_time_gives_the_closed_form_sizes():
    # without a fixed part: 6 and 2 units of work on 8 units -> T = 1
    assert balance([6.0, 2.0], [1, 1], [100, 100], 8) == [6, 2]
    # task 2 also pays 1 s that more units do not shorten: T = 1.5, ceil(6/1.5) + ceil(2/0.5) = 8
    assert balance([6.0, 2.0], [1, 1], [100, 100], 8, fixed_s=[0.0, 1.0]) == [4, 4]
    # a fixed part at or above the period: the task takes its maximum, the other only what keeps
    # pace with it (1 s on 1 unit against 10.2 s), and 2 units stay free
    assert balance([1.0, 1.0], [1, 1], [3, 5], 8, fixed_s=[0.0, 10.0]) == [1, 5]


def test_kernels_at_the_compilers_granularity():
    kinds = Counter(k.cls for k in _kernels(decoder(layers=2, hidden=64, seq=16)))
    assert kinds == {"attention": 2, "fc": 4, "nlin": 2, "layer_norm": 4, "add": 4}
    # training: each residual add becomes a forward add and a backward gradient-sum kernel
    kernels = _kernels(_train(decoder(layers=2, hidden=64, seq=16)))
    kinds = Counter(k.cls for k in kernels)
    assert kinds == {"attention": 2, "fc": 4, "nlin": 2, "layer_norm": 4, "add": 8}
    assert all(len(k.nodes) == 7 for k in kernels if k.cls == "attention")  # q, k, v, qk, softmax, av, o


def test_kernel_work_and_row_time_exact():
    hidden, seq = 64, 16
    kernels = _kernels(decoder(layers=1, hidden=hidden, seq=seq))
    add = next(k for k in kernels if k.cls == "add")
    vec = WSE.rate("vector", "fp16") / WSE.num_units / CLOCK  # elementwise ops per PE-cycle
    assert add.work_s == pytest.approx(seq * hidden / vec / CLOCK)  # one op per element
    assert (add.tokens, add.width) == (seq, hidden)
    fc1 = next(k for k in kernels if k.cls == "fc" and k.width == 4 * hidden)
    mm = WSE.arch_value("pe_matmul_efficiency") * WSE.peak_flops("fp16") / WSE.num_units / CLOCK
    assert fc1.work_s == pytest.approx(2 * seq * hidden * 4 * hidden / mm / CLOCK)
    assert fc1.params == hidden * 4 * hidden


def test_small_kernels_get_just_enough_pes():
    g = _train(decoder(layers=2, hidden=768, seq=1024, heads=12))
    plan = lower(g, WSE, ProfileOptions(wse_mode="pipelined"))
    regions = [u for u in plan.units if u.kind.startswith("wse_region:")]
    chunk = WSE.arch_value("row_chunk_elements")
    for u in regions:
        cls = u.kind.split(":")[1]
        if cls == "add":
            assert u.stats.pes >= math.ceil(768 / chunk)
        # min_utilisation bounds growth for rate; a region sized by the skip FIFO it holds may sit below it
        floor = WSE.arch_value("min_utilisation") if not u.resources.get("skip_fifo_bytes") else 0.0
        assert floor - 1e-9 <= u.stats.utilisation < 1
        tau = u.resources["row_s_per_sample"]
        busy = u.resources["work_pe_s_per_sample"] / u.stats.pes
        assert u.stats.utilisation == pytest.approx(busy / (busy + tau))
    util = {u.kind.split(":")[1]: u.stats.utilisation for u in regions}
    assert util["fc"] > max(util["nlin"], util["add"])  # matmul PEs busier than vector PEs


def test_an_add_after_attention_holds_one_sample_of_its_skip_stream():
    # the residual add (and, in training, its gradient sum) whose other input crosses attention
    # holds one whole sample of the skip stream; the add after the token-wise MLP holds nothing
    hidden, seq = 64, 16
    adds = [k for k in _kernels(_train(decoder(layers=1, hidden=hidden, seq=seq))) if k.cls == "add"]
    assert [(k.direction, k.skip_bytes) for k in adds] == [
        ("fwd", seq * hidden * 2),
        ("bwd", seq * hidden * 2),
        ("fwd", 0),
        ("bwd", 0),
    ]
    # at GPT-2 small's shapes: 1024 x 768 fp16 = 1.5 MB = 32 PEs of 48 KB, rounded up to whole
    # rows of ceil(768/64) = 12 PEs: 36 PEs (as the compile report's 24 larger adds); MLP adds 12
    g = _train(decoder(layers=2, hidden=768, seq=1024, heads=12))
    plan = lower(g, WSE, ProfileOptions(wse_mode="pipelined"))
    regions = [u for u in plan.units if u.kind == "wse_region:add"]
    assert [(u.stats.pes, u.resources["skip_fifo_bytes"]) for u in regions] == [(36, 1024 * 768 * 2)] * 2 + [
        (12, 0)
    ] * 2 + [(36, 1024 * 768 * 2)] * 2 + [(12, 0)] * 2


def test_allocation_counts_io_routing_and_buffers():
    g = _train(decoder(layers=4, hidden=768, seq=1024, heads=12))
    plan = lower(g, WSE, ProfileOptions(wse_mode="pipelined"))
    m = compute_metrics(g, plan, emulate(plan, g), WSE)
    route = WSE.arch_value("route_pes_per_kernel_pe")
    expected = plan.extra["pes_kernels"] * (1 + route) + WSE.arch_value("io_region_pes") + plan.extra["pes_buffer"]
    assert m.allocation_ratio == pytest.approx(expected / WSE.num_units)
    assert m.allocation_ratio <= WSE.arch_value("max_active_fraction") + 1e-9
    # the emulated LI misses the backward-add regions (their node is timed in the forward add's
    # region), which the plan's PE-weighted LI counts
    assert m.load_imbalance == pytest.approx(plan.extra["load_imbalance_pe_weighted"], rel=2e-3)
    assert plan.extra["pes_buffer"] > 0  # block-boundary activations in flight


def test_in_flight_buffers_grow_with_depth_squared_up_to_the_steps_batch():
    def buf(layers, batch, target=WSE):
        graph = _train(decoder(layers=layers, hidden=256, seq=128, batch=batch))
        return lower(graph, target, ProfileOptions(wse_mode="pipelined")).extra["buffer_bytes"]

    per_sample = 128 * 256 * 2  # one block boundary, fp16
    # block i of L holds its output for the 2(L-i)-1 periods of its round trip to backward ...
    assert buf(4, batch=8) == per_sample * (7 + 5 + 3 + 1)
    # ... but a synchronous step drains before its update: never more samples than its batch
    assert buf(4, batch=4) == per_sample * (4 + 4 + 3 + 1)
    assert buf(4, batch=1) == per_sample * 4
    # the mechanism off (Cerebras' pipelined backpropagation: no drain, the pipeline stays full
    # across steps): the whole round trip is held whatever the batch
    flowing = WSE.with_changes({"arch.drain_per_step": 0})
    assert buf(4, batch=1, target=flowing) == per_sample * (7 + 5 + 3 + 1)


def test_in_flight_buffers_hold_the_logits_gradient_not_the_tied_weights_layout():
    """GPT-2 small, batch 8: 80 block-samples of 1024 x 768 fp16 boundaries in flight, and two
    logits-sized buffers (8 x 1024 x 50257 fp16 / 8 a sample). The head kernel ends in a folded
    transpose of the tied embedding (768 x 50257), which the buffer had been sized from."""
    from dabench_ir import api

    plan = api.profile("gpt2-small", "wse2", mode="train", wse_mode="pipelined", batch=8).plan
    boundary = 1024 * 768 * 2
    logits = 1024 * 50257 * 2
    assert plan.extra["buffer_bytes"] == 80 * boundary + 2 * logits


def test_pipelined_capacity_limit_falls_with_width():
    # training state 16 B/param and buffers in 75 % of 40 GB: about 1 B parameters fit
    opts = ProfileOptions(wse_mode="pipelined")
    assert lower(_train(decoder(layers=24, hidden=1600, seq=64)), WSE, opts).fits  # 0.74 B params
    big = lower(_train(decoder(layers=36, hidden=1600, seq=64)), WSE, opts)  # 1.1 B params
    assert not big.fits and "optimizer state" in big.failure.reason


def test_auto_picks_pipelined_below_a_billion_parameters_and_streaming_above():
    small = lower(_train(decoder(layers=2, hidden=512, seq=64)), WSE, ProfileOptions(wse_mode="auto"))
    assert small.stats.mode == "pipelined" and small.notes[0].startswith("auto: pipelined")
    big = lower(_train(decoder(layers=20, hidden=2048, seq=64)), WSE, ProfileOptions(wse_mode="auto"))  # 1.0 B
    assert big.stats.mode == "streaming" and "parameters >= 1 B" in big.notes[0]
    assert "wse_layer" in {u.kind for u in big.units}


def test_auto_serves_with_the_weights_resident_wherever_they_fit():
    """The 1 B rule is a training rule: a serving graph of 1.0 B parameters, which fits pipelined, keeps its
    weights in PE SRAM (as `profile --scenario generate` placed it already), and streams only past the
    wafer: the same question answered alike by `profile --mode inference` and the scenario."""
    big = lower(decoder(layers=20, hidden=2048, seq=64), WSE, ProfileOptions(wse_mode="auto"))  # 1.0 B
    assert big.stats.mode == "pipelined" and big.notes[0].startswith("auto: pipelined (serving")
    huge = lower(decoder(layers=96, hidden=8192, seq=64, heads=64), WSE, ProfileOptions(wse_mode="auto"))  # 77 B
    assert huge.stats.mode == "streaming" and "pipelined mode does not fit" in huge.notes[0]


def test_streaming_capacity_is_finite_and_falls_with_hidden_and_micro_batch():
    def limit(hidden, mb, seq=2048):
        g = _train(decoder(layers=2, hidden=hidden, seq=seq, batch=mb, heads=hidden // 128))
        plan = lower(g, WSE, ProfileOptions(wse_mode="streaming", micro_batches=1))  # the graph's batch, whole
        return plan.stats.max_layers_at_micro_batch

    limits = [limit(h, 1) for h in (2560, 5120, 12288)]
    assert all(0 < x < 10_000 for x in limits)
    assert limits == sorted(limits, reverse=True) and limits[0] > limits[-1]
    assert limit(5120, 8) < limit(5120, 1) / 4
    assert limit(5120, 1, seq=8192) < limit(5120, 1, seq=2048)


def test_streaming_too_deep_does_not_fit_and_micro_batch_shrinks_to_fit():
    g = _train(decoder(layers=48, hidden=8192, seq=2048, heads=64, batch=64))
    plan = lower(g, WSE, ProfileOptions(wse_mode="streaming"))
    assert plan.fits and plan.stats.micro_batch < 64  # the largest divisor that fits
    assert plan.memory_bytes["sram"] <= WSE.arch_value("sram_usable_fraction") * WSE.memory("sram").capacity_bytes
    deep = _train(decoder(layers=1200, hidden=8192, seq=2048, heads=64, batch=8))
    plan = lower(deep, WSE, ProfileOptions(wse_mode="streaming"))
    assert not plan.fits and "micro-batch 1" in plan.failure.reason


def test_streaming_state_lives_in_memoryx_and_step_overheads_are_charged():
    g = _train(decoder(layers=4, hidden=1024, seq=512, heads=8, batch=32))
    plan = lower(g, WSE, ProfileOptions(wse_mode="streaming"))
    params = 4 * 12 * 1024 * 1024
    assert plan.memory_bytes["memoryx"] == params * 16  # fp16 weights + 14 B/param of state
    lw = 12 * 1024 * 1024 * 2
    bw = WSE.memory("memoryx").bandwidth_bytes_per_s
    assert plan.step_overheads_s["wse_grad_writeback"] == pytest.approx(lw / bw)
    assert plan.step_overheads_s["wse_memoryx_update"] == pytest.approx(lw / bw)
    layer = next(u for u in plan.units if u.id == "layer0")
    n_mb = plan.micro_batches
    assert layer.gap_before_s == pytest.approx(WSE.overhead("ws_layer_pass_s") * n_mb)
    assert layer.min_time_s == pytest.approx(3 * lw / bw * n_mb)  # W in, W in again, dW out


def test_streaming_runs_the_batch_in_lanes_whose_checkpoints_fit_on_the_wafer(tmp_path):
    # Activations never leave the wafer: the batch runs in lanes (the Cerebras log's "per-box batch
    # size 99 with 9 lanes"), each through every layer forward and backward with its own checkpoints.
    # Per sample at 4 x 1024, seq 512 (fp16, one s x h tensor = 1 MiB): 3 block-boundary checkpoints
    # (the last block's output is the graph's) and one layer's working set of 14 tensors (x, ln1 out,
    # o_proj out, first residual, ln2 out, 4 x fc1 out, 4 x GELU out, fc2 out). A wafer sized for
    # 10.5 samples next to the double-buffered 12 h^2 layer weights holds 8 of 32 (the largest
    # divisor of 32 up to 10): 4 lanes.
    act = 512 * 1024 * 2
    per_sample = (3 + 14) * act
    weights = 12 * 1024 * 1024 * 2
    usable = WSE.arch_value("sram_usable_fraction")
    sram = (10.5 * per_sample + 2 * weights) / usable
    text = WSE_TOML.read_text().replace("capacity_bytes = { value = 40e9,", f"capacity_bytes = {{ value = {sram!r},")
    path = tmp_path / "wse-small.toml"
    path.write_text(text)
    small = load_target(path)
    assert small.memory("sram").capacity_bytes == sram
    g = _train(decoder(layers=4, hidden=1024, seq=512, heads=8, batch=32))
    plan = lower(g, small, ProfileOptions(wse_mode="streaming"))
    assert plan.fits and (plan.stats.micro_batch, plan.micro_batches) == (8, 4)
    assert plan.extra["checkpoint_bytes_per_sample"] == 3 * act
    assert plan.extra["working_bytes_per_sample"] == 14 * act
    assert plan.memory_bytes["sram"] == 8 * per_sample + 2 * weights
    assert any("runs as 4 lanes of 8" in n and "(0.03 GB)" in n for n in plan.notes)
    # each lane pays the layer pass and streams the layer's weights (W in, W in again, dW out)
    layer = next(u for u in plan.units if u.id == "layer1")
    bw = small.memory("memoryx").bandwidth_bytes_per_s
    assert layer.gap_before_s == pytest.approx(4 * small.overhead("ws_layer_pass_s"))
    assert layer.min_time_s == pytest.approx(4 * 3 * weights / bw)
    # two lanes of 16 asked for overflow; the failure sizes the fix: lanes of 10 at most, and the
    # micro-batches must divide the batch (the CLI refuses 3 for 32): 4 lanes of 8
    short = lower(g, small, ProfileOptions(wse_mode="streaming", micro_batches=2))
    assert not short.fits and short.failure.remedy == (("micro_batches", 4),)
    assert short.failure.reason.endswith(
        "(use more micro-batches: --micro-batches 4, lanes of 8 samples; a lane fits up to 10)"
    )
    assert lower(g, small, ProfileOptions(wse_mode="streaming", micro_batches=4)).fits
    # the whole 40 GB wafer holds the batch in one lane: no lanes to report
    whole = lower(g, WSE, ProfileOptions(wse_mode="streaming"))
    assert (whole.stats.micro_batch, whole.micro_batches) == (32, 1)
    assert not any("lanes of" in n for n in whole.notes)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_micro_batches_are_weight_streaming_lanes_never_a_pipelined_knob(mode):
    """Pipelined mode streams samples one at a time: micro-batches there were accepted and changed
    nothing (GPT-2 small, batch 8: the same period and latency with 1, 2 or 8). They refuse an
    explicit pipelined run, and under auto they choose weight streaming, where they set the lanes."""
    g = decoder(layers=2, hidden=256, seq=64, heads=4, batch=8)
    g = _train(g) if mode == "train" else g
    pipelined = lower(g, WSE, ProfileOptions(mode=mode))
    assert pipelined.stats.mode == "pipelined" and pipelined.micro_batches == 8  # one sample each
    auto = lower(g, WSE, ProfileOptions(mode=mode, micro_batches=2))
    streamed = lower(g, WSE, ProfileOptions(mode=mode, wse_mode="streaming", micro_batches=2))
    assert auto.stats.mode == "streaming" and (auto.stats.micro_batch, auto.micro_batches) == (4, 2)
    assert auto.notes[0].startswith("auto: weight streaming (2 micro-batches: the lanes of weight streaming")
    assert auto.notes[1:] == streamed.notes
    for refused in ({"wse_mode": "pipelined"}, {"replicas": 2}):
        with pytest.raises(UserError, match="--micro-batches 2 splits the batch into weight streaming's lanes"):
            lower(g, WSE, ProfileOptions(mode=mode, micro_batches=2, **refused))


def test_streaming_throughput_flattens_with_batch():
    def rate(batch):
        g = _train(decoder(layers=4, hidden=2048, seq=2048, heads=16, batch=batch))
        plan = lower(g, WSE, ProfileOptions(wse_mode="streaming"))
        return batch / (emulate(plan, g).step_time_s + sum(plan.step_overheads_s.values()))

    r = [rate(b) for b in (1, 8, 32, 256, 512)]
    assert r == sorted(r)
    assert r[-1] / r[-2] < 1.05 < r[1] / r[0]


def test_replicas_pay_a_reduction_that_grows():
    g = _train(decoder(layers=2, hidden=256, seq=64, batch=8))
    reduce = [
        lower(g, WSE, ProfileOptions(wse_mode="pipelined", replicas=r)).step_overheads_s.get("wse_replica_reduce", 0.0)
        for r in (1, 2, 4, 8)
    ]
    assert reduce[0] == 0.0 and reduce[1] < reduce[2] < reduce[3]
    two = lower(g, WSE, ProfileOptions(wse_mode="pipelined", replicas=2))
    grad = sum(4 * n for n in (256 * 256 * 4 + 256 * 1024 * 2,)) * 2  # fp32 gradients, 2 layers
    side = math.sqrt(WSE.num_units)
    cut = side * WSE.arch_value("fabric_link_bytes_per_cycle") * CLOCK
    expected = grad / cut + side * WSE.link("fabric").latency_s
    assert two.step_overheads_s["wse_replica_reduce"] == pytest.approx(expected)
    auto = lower(g, WSE, ProfileOptions(wse_mode="pipelined", replicas="auto"))
    assert auto.replicas >= 1 and auto.fits


def test_fp32_matmuls_run_at_the_fp32_rate():
    g16 = decoder(layers=1, hidden=64, seq=16)
    from dabench_ir.ir import DType

    g32 = decoder(layers=1, hidden=64, seq=16, dtype=DType.FLOAT32)
    fc16 = next(k for k in _kernels(g16) if k.cls == "fc")
    fc32 = next(k for k in _kernels(g32) if k.cls == "fc")
    assert fc32.work_s / fc16.work_s == pytest.approx(WSE.peak_flops("fp16") / WSE.peak_flops("fp32"))


def test_a_contraction_runs_at_the_rate_of_its_accumulator():
    # mixed precision (16-bit inputs, fp32 accumulation) runs the 2-lane fp32 datapath: the
    # accumulator streams through SRAM 64 bits per cycle; only 16-bit accumulation (--precision
    # fp16/bf16) runs 4 lanes; the 16-bit format itself (fp16 or bf16) changes nothing
    from dabench_ir.ir import DType
    from dabench_ir.passes import meta

    def fc_work(dtype, accumulate=None):
        g = decoder(layers=1, hidden=64, seq=16, dtype=dtype)
        if accumulate is not None:
            meta.graph_set(g, meta.GRAPH_PRECISION, "mixed")
            for n in g.nodes:
                if n.meta[meta.COST].contraction_flops:
                    n.meta[meta.ACCUMULATE] = accumulate
        return next(k for k in _kernels(g) if k.cls == "fc").work_s

    fp32, mixed = fc_work(DType.FLOAT32), fc_work(DType.BFLOAT16, DType.FLOAT32)
    fp16, bf16 = fc_work(DType.FLOAT16), fc_work(DType.BFLOAT16)
    assert mixed == pytest.approx(fp32)
    assert fp16 == pytest.approx(bf16)
    assert mixed / fp16 == pytest.approx(WSE.peak_flops("fp16") / WSE.peak_flops("fp32"))
    # the fitted efficiency is a share of the 2-lane datapath point A runs on: a physical figure
    assert 0.9 < WSE.arch_value("pe_matmul_efficiency") <= 1.0


def _step(layers, batch, *, train=True, **options):
    g = decoder(layers=layers, hidden=256, seq=128, heads=4, batch=batch)
    g = _train(g) if train else g
    return lower(g, WSE, ProfileOptions(wse_mode="pipelined", **options))


def test_a_training_step_drains_and_refills_the_pipeline():
    # synchronous training: the update waits for the batch's last gradients, so each step pays one
    # sample's latency through the forward and backward chain beyond the periods of the others: its
    # first row's (an attention kernel holds a whole sample, any other kernel one token row) and the
    # longest a kernel holds it between its first row in and its last row out; then the first
    # regions' update
    plan = _step(12, 16)
    period = plan.extra["period_s"]
    chain, tail = 0.0, 0.0
    for u in plan.units:
        if u.kind.startswith("wse_region:"):
            t = u.resources["work_pe_s_per_sample"] / u.stats.pes + u.resources["row_s_per_sample"]
            first = t if u.kind == "wse_region:attention" else t / 128
            chain, tail = chain + first, max(tail, t - first)
    assert plan.extra["chain_latency_s"] == pytest.approx(chain)
    assert plan.step_overheads_s["pipeline_fill_drain"] == pytest.approx(chain + tail - period)
    assert 11 * period < chain < 13 * period  # about one period per attention kernel (12 blocks)
    assert plan.stats.step_s == pytest.approx(16 * period + sum(plan.step_overheads_s.values()))
    # a region updates its weights in the window before the next step's first sample reaches it:
    # the first regions' update holds the step back, a small cost beside the drain
    assert 0 < plan.step_overheads_s["wse_optimizer"] < 0.1 * plan.step_overheads_s["pipeline_fill_drain"]
    # inference streams batch after batch; the scenario's one-step latency times the fill itself
    assert "pipeline_fill_drain" not in _step(12, 16, train=False).step_overheads_s
    from dabench_ir.lowering.wse import WseLowering

    g = _train(decoder(layers=12, hidden=256, seq=128, heads=4, batch=16))
    single = lower(g, WSE, WseLowering.options(ProfileOptions(wse_mode="pipelined"), steady_state=False))
    assert "pipeline_fill_drain" not in single.step_overheads_s
    # the counterfactual machine: Cerebras' pipelined backpropagation, no drain a step (arch.drain_per_step 0)
    flowing = lower(
        _train(decoder(layers=12, hidden=256, seq=128, heads=4, batch=16)),
        WSE.with_changes({"arch.drain_per_step": 0}),
        ProfileOptions(wse_mode="pipelined"),
    )
    assert "pipeline_fill_drain" not in flowing.step_overheads_s
    assert flowing.extra["period_s"] == pytest.approx(period)


def test_throughput_grows_with_batch_then_flattens():
    # the drain is a fixed cost per step: about (layers - 1) periods, so the rate is
    # B / (B + ~11) of the steady state at 12 layers, whatever the width
    rate = {b: b / _step(12, b).stats.step_s for b in (16, 128, 256, 512)}
    steady = _step(12, 16).stats.pipeline_rate_samples_per_s
    assert rate[128] / rate[16] > 1.3
    assert rate[512] / rate[256] < 1.05
    assert rate[16] < rate[128] < rate[256] < rate[512] < steady
    # deeper pipelines drain longer: the knee moves out with depth
    shallow = {b: b / _step(4, b).stats.step_s for b in (16, 128)}
    assert shallow[128] / shallow[16] < rate[128] / rate[16]


def test_replicas_raise_throughput_at_a_falling_efficiency_per_replica():
    g = _train(decoder(layers=2, hidden=768, seq=1024, heads=12, batch=16))
    plans = {r: lower(g, WSE, ProfileOptions(wse_mode="pipelined", replicas=r)) for r in (1, 2, 4, 8)}
    rate = {r: p.samples_per_step / p.stats.step_s for r, p in plans.items()}
    assert rate[1] < rate[2] < rate[4] < rate[8]
    per_replica = [rate[r] / r / rate[1] for r in (1, 2, 4, 8)]
    assert per_replica == sorted(per_replica, reverse=True) and per_replica[-1] < 0.9
    # each copy drains and updates its own weights every step, after the gradients are reduced
    for r, p in plans.items():
        assert {"pipeline_fill_drain", "wse_optimizer"} <= set(p.step_overheads_s)
        assert ("wse_replica_reduce" in p.step_overheads_s) == (r > 1)


# -- catalogue point A: the GPT-2 small pipelined compile report --------------------------------
@pytest.fixture(scope="module")
def gpt2_small_train():
    pytest.importorskip("torch")
    from dabench_ir.models.export import export_onnx
    from dabench_ir.models.presets import get_preset
    from dabench_ir.pipeline import prepare_graph

    proto = export_onnx(get_preset("gpt2-small"), weights="none")
    return prepare_graph(proto, ProfileOptions(mode="train", precision="mixed"))


def test_gpt2_small_compile_report(gpt2_small_train):
    g = gpt2_small_train
    plan = lower(g, WSE, ProfileOptions(wse_mode="auto", batch=128, precision="mixed"))
    assert plan.stats.mode == "pipelined"
    m = compute_metrics(g, plan, emulate(plan, g), WSE)
    assert plan.stats.pipeline_rate_samples_per_s == pytest.approx(860.3, rel=0.30)
    assert m.allocation_ratio == pytest.approx(0.92, rel=0.30)
    assert m.load_imbalance == pytest.approx(0.978, abs=0.05)
    pes: Counter[str] = Counter()
    for u in plan.units:
        if u.kind.startswith("wse_region:"):
            pes[u.kind.split(":")[1]] += u.stats.pes
    measured = {"attention": 106966, "fc": 85514, "emb_fc": 65604, "nlin": 13028, "add": 1152, "mlm_loss": 6318}
    for cls, meas in measured.items():
        assert pes[cls] == pytest.approx(meas, rel=0.30), cls
    assert Counter(u.kind for u in plan.units)["wse_region:attention"] == 12
    assert Counter(u.kind for u in plan.units)["wse_region:fc"] == 24
    assert Counter(u.kind for u in plan.units)["wse_region:add"] == 48
    assert Counter(u.kind for u in plan.units)["wse_region:layer_norm"] == 25
    assert Counter(u.kind for u in plan.units)["wse_region:mlm_loss"] == 1


def test_a_row_pays_one_reduction_time_per_dependent_reduction(gpt2_small_train):
    # a layer norm reduces each row twice (mean, then variance) before it can leave, the loss
    # once (online softmax): its per-token fixed time is half a layer norm's, as report A shows
    # (260 cycles per token against 540, the loss not fitted)
    plan = lower(gpt2_small_train, WSE, ProfileOptions(wse_mode="pipelined", precision="mixed"))
    row = {u.kind.split(":")[1]: u.resources["row_s_per_sample"] for u in plan.units if u.kind.startswith("wse_region")}
    per_pass = WSE.arch_value("kernel_row_cycles_reduction") * 1024 / CLOCK
    assert row["layer_norm"] == pytest.approx(2 * per_pass)
    assert row["mlm_loss"] == pytest.approx(per_pass)
    loss = next(u for u in plan.units if u.kind == "wse_region:mlm_loss")
    assert loss.stats.utilisation == pytest.approx(0.77, abs=0.05)  # report A: 77 %


def test_a_graph_without_scopes_is_grouped_by_op_pattern():
    from tests.conftest import analyze_text, attention_text

    zeros = ",".join(["0.0"] * 64 * 64)
    g = analyze_text(
        f"""
        agraph (float[1,16,64] X) => (float[1,16,64] Y)
        <float[64,64] Wq = {{{zeros}}}, float[64,64] Wk = {{{zeros}}}, float[64,64] Wv = {{{zeros}}},
         float[64,64] Wo = {{{zeros}}}> {{
            v = MatMul(X, Wv)
            {attention_text("X", v="v", out="a")}
            o = MatMul(a, Wo)
            Y = Add(X, o)
        }}
        """
    )
    kernels = _kernels(g)
    assert [k.cls for k in kernels] == ["fc", "fc", "fc", "data", "attention", "fc", "add"]  # v, q, k, kᵀ, ...
    assert [n.op_type for n in kernels[4].nodes] == ["MatMul", "Softmax", "MatMul"]


def test_input_transmission_ceiling_is_reported():
    g = decoder(layers=1, hidden=64, seq=16)
    plan = lower(g, WSE, ProfileOptions(wse_mode="pipelined"))
    io = WSE.link("system_io").bandwidth_bytes_per_s
    assert plan.stats.transmission_rate_samples_per_s == pytest.approx(io / (16 * 64 * 2))
    assert "wse_input_transmission" not in plan.step_overheads_s  # compute-limited, as report A
    io_unit = next(u for u in plan.units if u.kind == "wse_io")  # the report's two steady states
    pipe = plan.stats.pipeline_rate_samples_per_s
    assert io_unit.stats.compute_samples_per_s == pipe
    assert io_unit.stats.transmission_samples_per_s == min(pipe, plan.stats.transmission_rate_samples_per_s)


# -- per-class costs follow the op's shape (issue 30): tiny exported LLaMA and GPT-2 blocks --
@pytest.fixture(scope="module")
def tiny_blocks():
    """One-block LLaMA (RMSNorm, rotary, SwiGLU) and GPT-2 (LayerNorm, GELU) of the same width,
    exported weight-free, trained in mixed precision, with their WSE kernels."""
    from dabench_ir.lowering.wse.pipelined import row_cycles
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import load_graph
    from dabench_ir.run import prepare, resolve

    out = {}
    for fam in ("llama", "gpt2"):
        cfg = ModelConfig(family=fam, layers=1, hidden=128, heads=2, ffn=256, seq=64, batch=1, vocab=500)
        g = load_graph(export_onnx(cfg, weights="none"))
        graph = prepare(resolve(g, WSE, ProfileOptions(mode="train", precision="mixed", wse_mode="pipelined")), g)
        ctx = LoweringContext.build(graph)
        kernels = wse_kernels(ctx, WSE)
        out[fam] = (ctx, kernels, {id(k): row_cycles(ctx, WSE, k) for k in kernels})
    return out


def test_a_norm_pays_one_row_reduction_per_dependent_reduction_whatever_the_family(tiny_blocks):
    # RMSNorm (Pow, ReduceMean, ..., Mul): one mean of squares before a row can leave; LayerNorm:
    # the mean, then the variance. The row time follows the op, not a per-model kernel table.
    per = WSE.arch_value("kernel_row_cycles_reduction")
    for fam, passes in (("llama", 1), ("gpt2", 2)):
        _, kernels, rows = tiny_blocks[fam]
        norms = [k for k in kernels if k.cls == "layer_norm"]
        assert len(norms) == 3  # two in the block, the final norm
        assert {rows[id(k)] for k in norms} == {passes * per}
        assert all((k.tokens, k.width) == (64, 128) for k in norms)


def test_swiglu_pays_its_gate_multiply_and_one_transcendental_per_element(tiny_blocks):
    # SwiGLU: silu(gate) * up = gate * sigmoid(gate) * up: the nlin kernel holds the sigmoid (one
    # exp per element, software on the FMAC) and gate * sigmoid; the product with up rides on the
    # up projection's fc. GELU: one transcendental per element (erf) and its few vector ops.
    ctx, kernels, rows = tiny_blocks["llama"]
    nlin = next(k for k in kernels if k.cls == "nlin")
    assert sorted(n.op_type for n in nlin.nodes if ctx.is_work(n)) == ["Mul", "Sigmoid"]
    assert (nlin.tokens, nlin.width) == (64, 256) and rows[id(nlin)] == WSE.arch_value("kernel_row_cycles_vector")
    pe = WSE.num_units
    sp = WSE.rate("special", "fp16") / pe  # transcendentals per PE-second
    vec = WSE.rate("vector", "fp16") / pe
    costs = {n.op_type: ctx.costs[n.name] for n in nlin.nodes if ctx.is_work(n)}
    elems = 64 * 256
    assert costs["Sigmoid"].special_ops >= elems and costs["Mul"].vector_flops >= elems
    expect = sum(c.special_ops / sp + c.vector_flops / vec for c in costs.values())
    assert nlin.work_s == pytest.approx(expect)
    up = next(k for k in kernels if k.cls == "fc" and k.key.endswith("up_proj"))
    assert sorted(n.op_type for n in up.nodes if ctx.is_work(n)) == ["MatMul", "Mul"]


def test_rmsnorm_squares_at_the_vector_rate(tiny_blocks):
    # LLaMA's RMSNorm: Pow(x, 2) with its exponent a one-element initializer the frontend keeps, so
    # the square is one multiply per element (not a 110-cycle software transcendental): 64 x 128
    # forward, twice that in backward (2 x g). The norm kernel's only transcendentals are the
    # Sqrt's, one per row forward and one backward.
    ctx, kernels, _ = tiny_blocks["llama"]
    norm = next(k for k in kernels if k.cls == "layer_norm")
    work = [(n.op_type, ctx.costs[n.name]) for n in norm.nodes if ctx.is_work(n)]
    (square,) = [c for op, c in work if op == "Pow"]
    assert (square.vector_flops, square.special_ops) == (3 * 64 * 128, 0)
    assert sum(c.special_ops for _, c in work) == 2 * 64
    pe = WSE.num_units
    vec, sp = WSE.rate("vector", "fp32") / pe, WSE.rate("special", "fp32") / pe
    expect = sum(c.vector_flops / vec + c.special_ops / sp for _, c in work)
    assert norm.work_s == pytest.approx(expect)


def test_rotary_positions_ride_in_the_attention_kernel_as_vector_work(tiny_blocks):
    # RoPE on q and k (x*cos + rotate(x)*sin): Mul, Neg, Add and Slice/Concat layout inside the
    # attention kernel, timed at the vector rate and the link width; no contraction of its own.
    ctx, kernels, rows = tiny_blocks["llama"]
    attn = next(k for k in kernels if k.cls == "attention")
    ops = Counter(n.op_type for n in attn.nodes if ctx.is_work(n))
    assert ops["Neg"] == 2 and ops["Concat"] == 2 and ops["Mul"] >= 4
    assert rows[id(attn)] == WSE.arch_value("kernel_row_cycles_matmul")
    rope = [n for n in attn.nodes if n.op_type in ("Neg", "Concat")]
    assert all(ctx.costs[n.name].contraction_flops == 0 for n in rope)


def test_explicit_replicas_keep_auto_mode_pipelined_and_fail_there_when_too_many():
    """On-wafer copies exist only in pipelined mode: with --replicas N the auto mode never falls
    back to weight streaming (one copy, the flag silently dropped); too many copies do not fit."""
    g = decoder(layers=1, hidden=64, seq=16, heads=4)
    four = lower(g, WSE, ProfileOptions(replicas=4))
    assert four.fits and four.replicas == 4 and four.notes[0].startswith("auto: pipelined (--replicas 4")
    many = lower(g, WSE, ProfileOptions(replicas=100_000))
    assert not many.fits and many.replicas == 100_000 and "PEs" in many.failure.reason
    assert lower(g, WSE, ProfileOptions()).replicas >= 1  # auto copies: still the best that fits


def _decode(batch: int, context: int):
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import prepare_graph

    cfg = ModelConfig(
        family="gpt2", layers=2, hidden=256, heads=4, vocab=1000, seq=1, batch=batch, phase="decode", context=context
    )
    return prepare_graph(export_onnx(cfg, weights="none"), ProfileOptions())


@pytest.mark.parametrize("mode", ["pipelined", "streaming"])
def test_a_decode_step_keeps_its_kv_cache_on_the_wafer(mode):
    """A decode step's KV caches are its state from step to step: held in PE SRAM beside the weights,
    not inputs sent over the system I/O each step (pipelined mode sent the whole cache every token and
    never counted it in SRAM, so a 38 GB cache 'fit' a 30 GB wafer)."""
    from dabench_ir.passes.precision import cache_inputs

    graph = _decode(batch=8, context=512)
    cache = sum(graph.type_of(v).nbytes() for v in cache_inputs(graph))
    assert cache == 2 * 2 * 8 * 512 * 256 * 4  # layers x (K, V) x batch x context x hidden x fp32
    plan = lower(graph, WSE, ProfileOptions(wse_mode=mode))
    empty = _decode(batch=8, context=1)  # the same step over a one-token cache
    small = lower(empty, WSE, ProfileOptions(wse_mode=mode))
    grown = plan.memory_bytes["sram"] - small.memory_bytes["sram"]
    assert grown >= cache - sum(empty.type_of(v).nbytes() for v in cache_inputs(empty))
    assert "wse_input_transmission" not in plan.step_overheads_s
    # a cache beyond the wafer's usable SRAM does not fit, and says the cache is why
    huge = lower(_decode(batch=4096, context=4096), WSE, ProfileOptions(wse_mode=mode))
    assert not huge.fits and "KV cache" in huge.failure.reason


def test_a_pipelined_regions_size_is_one_samples_not_the_steps_batch():
    """Samples flow through a region one after another: a region of short sequences cannot use more
    PEs at batch 64 than at batch 1, so the same stream cut into steps of 1 or 64 samples runs at the
    same rate (the batch multiplied the region's cap: 10x the samples/s at batch 64, sequences of 16)."""
    from dabench_ir import api

    one, many = (
        api.profile("gpt2-small", "wse2", wse_mode="pipelined", batch=b, dims={"seq": 16}).totals for b in (1, 64)
    )
    assert many["throughput_samples_per_s"] == pytest.approx(one["throughput_samples_per_s"], rel=1e-9)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_pipelined_regions_pass_rows_on_so_a_step_alone_is_the_fill_and_the_periods(batch, mode):
    # each region passes a token row on as it makes it (an attention region once it has read the
    # sample): the emulated step alone is the lowering's chain (the first row out) and the batch's
    # periods, not every region's whole time in turn (GPT-2 small's inference latency had read
    # 59.5 ms for a 629 us period and a 7.6 ms chain; a training step's last node ended at 102 ms
    # of a 15 ms step)
    from dabench_ir.emulate import check_dependencies

    g = decoder(layers=4, hidden=64, seq=64, batch=batch)
    if mode == "train":
        g = TrainingPass()(g).graph
    plan = lower(g, load_target("wse"), ProfileOptions(wse_mode="pipelined", mode=mode))
    timeline = emulate(plan, g)
    chain, period = plan.extra["chain_latency_s"], plan.extra["period_s"]
    assert check_dependencies(timeline, g) == []
    assert chain <= timeline.makespan_s <= chain + batch * period * (1 + 1e-9)
    if mode == "inference":
        assert timeline.latency_s == timeline.makespan_s
    else:  # the step drains: its nodes end where the lowering's fill and drain row says
        drained = timeline.step_time_s - timeline.overheads_s.get("wse_optimizer", 0.0)
        assert timeline.makespan_s == pytest.approx(drained, rel=1e-2)
