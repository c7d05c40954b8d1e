"""GPU / CPU lowering: roofline kernel times, launch overhead, fusion, HBM capacity."""

from __future__ import annotations

import math

import pytest

from dabench_ir.lowering import lower
from dabench_ir.lowering.gpu import GpuLowering
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import Target, load_target
from dabench_ir.timeline import Bound
from tests.conftest import analyze_text
from tests.lowering_graphs import chain, decoder

A100 = load_target("a100")
HBM = A100.memory("hbm").bandwidth_bytes_per_s * A100.arch_value("memory_efficiency")
"""The A100's sustained HBM rate: the datasheet's 2.039 TB/s at the share a streaming copy measures."""


def test_kernel_time_is_roofline_plus_launch():
    big, small = 10**12, 10**3
    g = chain([big, 0], [10**6, 10**9])
    plan = lower(g, A100, GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False))
    launch = A100.overhead("kernel_launch_s")
    n0, n1 = plan.node_plans["n0"], plan.node_plans["n1"]
    # contraction FLOPs at the peak times the maximum achievable matmul share (a contraction figure)
    mm = A100.peak_flops("fp32") * A100.arch_value("matmul_efficiency")
    assert n0.per_micro_batch_s == pytest.approx(big / mm + launch)
    assert n0.bound is Bound.COMPUTE
    assert n1.per_micro_batch_s == pytest.approx(10**9 / HBM + launch)
    assert n1.bound is Bound.MEMORY
    tiny = lower(chain([small], [small]), A100, ProfileOptions())
    assert tiny.node_plans["n0"].bound is Bound.OVERHEAD


def test_a_step_of_short_kernels_is_bound_by_the_host_issuing_them():
    from dabench_ir.emulate import emulate
    from dabench_ir.lowering.gpu import HOST_ISSUE

    launch, issue = A100.overhead("kernel_launch_s"), A100.overhead("host_issue_s")
    assert 0 < launch < issue  # a tiny kernel runs (with its launch) faster than the host issues the next
    opts = GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False)
    bw = HBM
    tiny_s = 2000 / bw + launch
    # ten 2 kB kernels: the host issues one every `issue`, the device idles before each
    g = chain([0] * 10, [2000] * 10)
    tiny = lower(g, A100, opts)
    assert tiny.step_overheads_s[HOST_ISSUE] == pytest.approx(issue + 9 * (issue - tiny_s))
    assert emulate(tiny, g).step_time_s == pytest.approx(10 * issue + tiny_s)  # the host's pace, then the last kernel
    # a 1 ms kernel first: the host issues the nine tiny ones while it runs; only the first waits
    g = chain([0] * 10, [int(bw * 1e-3)] + [2000] * 9)
    long = lower(g, A100, opts)
    assert long.step_overheads_s[HOST_ISSUE] == pytest.approx(issue)
    assert emulate(long, g).step_time_s == pytest.approx(issue + int(bw * 1e-3) / bw + launch + 9 * tiny_s)


def test_fusion_saves_launches():
    g = decoder(layers=2, hidden=64, seq=8)
    fused = lower(g, A100, GpuLowering.options(ProfileOptions(), fuse_elementwise=True))
    plain = lower(g, A100, GpuLowering.options(ProfileOptions(), fuse_elementwise=False))
    launches = [sum(p.overhead_s > 0 for p in plan.node_plans.values()) for plan in (fused, plain)]
    assert launches[0] < launches[1] == len(g.nodes)


def test_hbm_capacity():
    g = decoder(layers=64, hidden=8192, seq=8)  # ~103 GB of fp16 weights
    plan = lower(g, A100, ProfileOptions())
    assert not plan.fits and plan.failure.needed_bytes > plan.failure.capacity_bytes
    assert lower(g, load_target("h200"), ProfileOptions()).fits


def test_cpu_kind_uses_the_roofline_lowering():
    d = dict(A100.raw)
    d.update(name="host", kind="cpu")
    cpu = Target.from_dict(d, origin="host.toml")
    plan = lower(decoder(layers=1), cpu, ProfileOptions())
    assert plan.units[0].kind == "cpu" and plan.fits


# -- GEMM tile and wave quantisation (arch.gemm_tile), backward kernels in training -----------------


def test_gemm_tile_and_wave_efficiency_exact_numbers():
    from dabench_ir.lowering.gpu import _tile_efficiency

    assert A100.arch_value("gemm_tile") == 128 and A100.num_units == 108
    assert _tile_efficiency(128 * 12, 128 * 9, 128, 1, 128, 108) == 1.0  # 108 tiles: one full wave
    assert _tile_efficiency(128 * 109, 128, 128, 1, 128, 108) == pytest.approx(109 / 216)  # a 2nd wave of one
    assert _tile_efficiency(100, 128, 128, 1, 128, 108) == pytest.approx(100 / 112 / 108)  # one 112-row tile
    # 6 tiles of a 128 x 768 x 768 GEMM (a seq-128 prefill): K split 6 ways fills 36 of 108 SMs
    assert _tile_efficiency(128, 768, 768, 1, 128, 108) == pytest.approx(1 / 3)
    # point H's projection (65536 x 768 x 768): 3072 tiles; split-K 2 gives 57 waves of 384-deep blocks
    assert _tile_efficiency(65536, 768, 768, 1, 128, 108) == pytest.approx(
        65536 * 768 * 768 / (57 * 384 * 108 * 128**2)
    )
    assert _tile_efficiency(65536, 768, 768, 1, 128, 132) > 0.99  # large GEMMs: the MAMF share is the ceiling


def test_each_thread_block_pays_its_pipeline_fill_and_tile_write():
    from dabench_ir.lowering.gpu import _tile_efficiency

    # llm.c's attention projection at 32768 tokens (32768 x 768 x 768): 1536 tiles in 15 waves, unsplit
    # (split 2: 29 waves of 384 + 64), each block 768 of K + 64: 1536 x 768 / (108 x 15 x 832)
    assert _tile_efficiency(32768, 768, 768, 1, 128, 108, 64) == pytest.approx(1536 * 768 / (108 * 15 * 832))
    # with the MAMF share: 76.0 %, Nsight Compute measured 75.4 % of the tensor pipe (llm.c PR #378)
    assert 0.869 * _tile_efficiency(32768, 768, 768, 1, 128, 108, 64) == pytest.approx(0.7606, abs=1e-4)
    # a deep K loop hides it: 768 x 768 weight gradient over 32768 tokens, 36 tiles split 3 ways: 1 wave
    deep = _tile_efficiency(768, 768, 32768, 1, 128, 108, 64)
    assert deep == pytest.approx(36 * 3 * (32768 / 3) / (108 * (math.ceil(32768 / 3) + 64)))
    assert deep > 0.99
    # and it stops split-K from cutting K finer than pays: 128 x 768 x 768 splits 6 ways either way,
    # but a 16 x 4096 x 4096 GEMV-like shape (32 tiles) no longer splits to 128-deep slices
    assert _tile_efficiency(16, 4096, 4096, 1, 128, 108, 64) == pytest.approx(
        32 * 4096 / (108 * min(math.ceil(32 * s / 108) * (math.ceil(4096 / s) + 64) for s in range(1, 33)))
    )


def test_small_gemm_pays_its_partial_wave_large_gemm_does_not():
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.gpu import gemm_wave_efficiency

    g = decoder(layers=1, hidden=768, seq=128)  # 128 x 768 x 768 projections, 128 x 768 x 3072 fc1
    ctx = LoweringContext.build(g, None)
    node = {n.name: n for n in g.nodes}
    assert A100.arch_value("gemm_block_overhead_k") == 64
    # 6 tiles x split-K 6: 36 blocks of 128 of K, each paying 64 more: 36 x 128 / (108 x 192)
    assert gemm_wave_efficiency(ctx, node["layers.0.attn.q_proj"], A100) == pytest.approx(2 / 9)
    # 24 tiles x split-K 4: 96 blocks of 192 (+ 64): 96 x 192 / (108 x 256); split 5 needs a second wave
    assert gemm_wave_efficiency(ctx, node["layers.0.mlp.fc1"], A100) == pytest.approx(2 / 3)
    plan = lower(g, A100, GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False))
    q = plan.node_plans["layers.0.attn.q_proj"]
    mm = A100.peak_flops("fp32") * A100.arch_value("matmul_efficiency")
    assert q.compute_s == pytest.approx(2 * 128 * 768 * 768 / (mm * 2 / 9))
    no_tile = Target.from_dict(
        {**A100.raw, "arch": {k: v for k, v in A100.raw["arch"].items() if k != "gemm_tile"}},
        origin="a100-no-tile.toml",
    )
    plain = lower(g, no_tile, GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False))
    assert plain.node_plans["layers.0.attn.q_proj"].compute_s == pytest.approx(q.compute_s * 2 / 9)


def test_each_micro_batch_runs_its_own_share_of_a_gemms_rows():
    """Gradient accumulation over 8 micro-batches of a batch of 8 runs every GEMM at one sample's
    shape: the 128 x 768 x 768 projection of the batch-1 graph (2/9 of its waves useful), not the
    1024-row one; a batched attention GEMM splits its batch the same way."""
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.gpu import gemm_wave_efficiency

    one = decoder(layers=1, hidden=768, seq=128)
    eight = decoder(layers=1, hidden=768, seq=128, batch=8)
    ctx1, ctx8 = LoweringContext.build(one, None), LoweringContext.build(eight, None)
    for name in ("layers.0.attn.q_proj", "layers.0.mlp.fc1"):
        single = gemm_wave_efficiency(ctx1, one.node(name), A100)
        assert gemm_wave_efficiency(ctx8, eight.node(name), A100, 8) == pytest.approx(single)
        assert gemm_wave_efficiency(ctx8, eight.node(name), A100) > single  # the whole batch fills more waves
    batched = {
        b: analyze_text(
            f"agraph (float[{b},128,64] A, float[{b},64,128] B) => (float[{b},128,128] C) {{ C = MatMul(A, B) }}"
        )
        for b in (1, 8)
    }
    (g1, n1), (g8, n8) = ((g, g.nodes[0]) for g in batched.values())
    single = gemm_wave_efficiency(LoweringContext.build(g1, None), n1, A100)
    assert gemm_wave_efficiency(LoweringContext.build(g8, None), n8, A100, 8) == pytest.approx(single)
    assert gemm_wave_efficiency(LoweringContext.build(g8, None), n8, A100) == pytest.approx(8 * single)  # 8 of 108 SMs
    assert gemm_wave_efficiency(ctx1, one.node("layers.0.attn.q_proj"), A100) == pytest.approx(2 / 9)
    opts = ProfileOptions(precision="fp32", micro_batches=8)
    plan = lower(eight, A100, GpuLowering.options(opts, fuse_elementwise=False))
    mm = A100.peak_flops("fp32") * A100.arch_value("matmul_efficiency")
    assert plan.node_plans["layers.0.attn.q_proj"].compute_s == pytest.approx(2 * 1024 * 768 * 768 / (mm * 2 / 9))


def test_training_launches_the_backward_kernels():
    from dabench_ir.passes import PassManager
    from dabench_ir.passes.training import TrainingPass

    launch = A100.overhead("kernel_launch_s")
    g = decoder(layers=1, hidden=64, seq=8)
    opts = GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False)
    forward = lower(g.clone(), A100, opts)
    assert sum(p.overhead_s for p in forward.node_plans.values()) == pytest.approx(14 * launch)  # one per node
    trained = PassManager([TrainingPass()])(g).graph
    plan = lower(trained, A100, opts)
    # 14 forward kernels and the Adam step; backward: dW for q, k, v (their input needs no gradient), dX and
    # dW (or both operands) for qk, av, o_proj, fc1, fc2, one kernel each for softmax, add1, ln2, gelu, add2;
    # ln1 (no weights, input without gradient) has no backward
    assert sum(p.overhead_s for p in plan.node_plans.values()) == pytest.approx((15 + 3 + 5 * 2 + 5) * launch)


def test_a_gemm_narrower_than_a_tile_pads_to_the_mma_shape_only():
    from dabench_ir.lowering.gpu import _tile_efficiency

    # a batch-1 decode GEMV (1 x 4096 x 4096): one 16-row tile per 128 columns, 32 tiles; split-K 27 gives
    # 864 blocks of 152-deep slices, 8 full waves on 108 SMs
    assert _tile_efficiency(1, 4096, 4096, 1, 128, 108) == pytest.approx(4096 * 4096 / (108 * 16 * 128 * 8 * 152))
    assert _tile_efficiency(64, 128 * 108, 128, 1, 128, 108) == 1.0  # 64-row tiles, no padding


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_divides_the_optimizer_pass_over_the_data_parallel_chips(zero):
    from dabench_ir.options import ScaleOptions
    from dabench_ir.passes.training import ADAM_MOMENT_BYTES_PER_PARAM, MASTER_BYTES_PER_PARAM, TrainingPass
    from dabench_ir.scaling import scale

    graph = decoder(layers=2, hidden=64)
    TrainingPass()(graph)
    params = sum(v.type.numel() for v in graph.weights())
    # fp32 weights: Adam reads the parameter, its gradient and both moments and writes the
    # parameter and both moments (no master copy): a memory-bound pass over the states
    assert MASTER_BYTES_PER_PARAM == 4 and ADAM_MOMENT_BYTES_PER_PARAM == 8
    adam_s = (4 + 4 + 8 + 4 + 8) * params / HBM
    plain = scale(graph, A100, [4], "dp", ScaleOptions(precision="fp32")).points[0]
    sharded = scale(graph, A100, [4], "dp", ScaleOptions(precision="fp32", zero=zero)).points[0]
    # each of the 4 chips updates a quarter of the parameters; ZeRO 3 also gathers weights (1.5x comm)
    assert plain.compute_time_s - sharded.compute_time_s == pytest.approx(adam_s * 3 / 4, rel=1e-3)
    assert sharded.comm_time_s == pytest.approx(plain.comm_time_s * (1.5 if zero == 3 else 1.0))


def test_zero_3_holds_its_shard_and_the_largest_block_gathered_whole():
    """FSDP gathers a block's weights whole before it runs: a device holds its 1/n of every weight and,
    while the largest block runs, the rest of that block (the shards alone had been counted: LLaMA-7B
    over 8 GPUs left out a block's 405 MB)."""
    from dabench_ir.options import ScaleOptions
    from dabench_ir.passes.training import TrainingPass
    from dabench_ir.scaling import scale

    graph = decoder(layers=2, hidden=64)
    TrainingPass()(graph)
    weights = {v.name: v.type.nbytes() for v in graph.weights()}
    per_layer: dict[int | None, set[str]] = {}
    for node in graph.nodes:
        if node.op_type != "Adam" and not node.name.startswith("optimizer"):
            per_layer.setdefault(node.layer, set()).update(i for i in node.inputs if i in weights)
    largest = max(sum(weights[w] for w in names) for names in per_layer.values())
    total = sum(weights.values())
    held = {
        zero: scale(graph, A100, [4], "dp", ScaleOptions(zero=zero, mode="train")).points[0].memory_per_device
        for zero in (2, 3)
    }
    assert held[2]["weights"] == total
    assert held[3]["weights"] == math.ceil(total / 4) + largest - math.ceil(largest / 4)


def test_a_memory_bound_kernel_runs_at_the_sustained_not_the_datasheet_bandwidth():
    # the A100 file's figures: 2.039 TB/s datasheet, 87.1 % sustained (a measured device memcopy)
    plan = lower(chain([10**6], [10**9]), A100, GpuLowering.options(ProfileOptions(precision="fp32")))
    assert plan.node_plans["n0"].per_micro_batch_s == pytest.approx(10**9 / (2.039e12 * 0.871) + 4e-6)


_W = "{" + ", ".join(["0.01"] * 256) + "}"
_ATTENTION = """
agraph (float[2, SEQ, 16] x) => (float[2, SEQ, 16] y)
    <float[16, 16] wq = W, float[16, 16] wk = W, float[16, 16] wv = W, float[16, 16] wo = W> {
    shape = Constant <value = int64[4] {2, SEQ, 2, 8}> ()
    back = Constant <value = int64[3] {2, SEQ, 16}> ()
    q0 = MatMul (x, wq)
    k0 = MatMul (x, wk)
    v0 = MatMul (x, wv)
    q1 = Reshape (q0, shape)
    k1 = Reshape (k0, shape)
    v1 = Reshape (v0, shape)
    q = Transpose <perm = [0, 2, 1, 3]> (q1)
    kt = Transpose <perm = [0, 2, 3, 1]> (k1)
    v = Transpose <perm = [0, 2, 1, 3]> (v1)
    s = MatMul (q, kt)
    p = Softmax <axis = -1> (s)
    o = MatMul (p, v)
    o1 = Transpose <perm = [0, 2, 1, 3]> (o)
    o2 = Reshape (o1, back)
    y = MatMul (o2, wo)
}
""".replace("= W", "= " + _W)
"""One attention block (batch 2, hidden 16 in 2 heads of 8) as eager PyTorch exports it: the head split
(reshape, transpose to (batch, heads, seq, head_dim)), QK^T, softmax, PV and the merge back."""


@pytest.mark.parametrize("fused", [True, False])
def test_fused_attention_reads_the_head_split_and_merge_in_place(fused):
    from tests.conftest import rewrite

    g = rewrite(analyze_text(_ATTENTION.replace("SEQ", "8")), precision="fp32", fused_attention=fused)
    plan = lower(g, A100, GpuLowering.options(ProfileOptions(precision="fp32", fused_attention=fused)))
    moves = [n.name for n in g.nodes if n.op_type == "Transpose"]
    assert len(moves) == 4  # q, k (to K^T), v and the output back to (batch, seq, heads, head_dim)
    for name in moves:
        np_ = plan.node_plans[name]
        if fused:  # FlashAttention takes (batch, seq, heads, head_dim) with strides: no copy, no launch
            assert (np_.per_micro_batch_s, np_.memory_s, np_.overhead_s) == (0.0, 0.0, 0.0), name
            assert "in place" in np_.note
        else:  # the unfused path copies each: 2 x 8 x 16 fp32 read and written, at the sustained bandwidth
            assert np_.memory_s == pytest.approx(2 * 2 * 8 * 16 * 4 / HBM), name
            assert np_.overhead_s == A100.overhead("kernel_launch_s")
    if fused:  # but the framework still dispatches each view op: the host issues 10 ops (5 GEMMs, the
        # core's 2 kernels, 4 views, the merge's reshape riding with its transpose), each kernel shorter
        # than the 7 us the host takes, so the stream waits 10 x 7 us less the device time of all but the last
        from dabench_ir.lowering.context import LoweringContext, kernel_groups
        from dabench_ir.lowering.gpu import HOST_ISSUE

        groups = [gr for gr in kernel_groups(LoweringContext.build(g), True) if gr[0].op_type != "Constant"]
        assert len(groups) == 10
        device = [sum(plan.node_plans[n.name].per_micro_batch_s for n in gr) for gr in groups]
        issue = A100.overhead("host_issue_s")
        assert plan.step_overheads_s[HOST_ISSUE] == pytest.approx(10 * issue - sum(device[:-1]))


@pytest.mark.parametrize("fused", [True, False])
def test_a_fused_attention_core_keeps_its_scores_on_chip(fused):
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.gpu import device_memory
    from tests.conftest import rewrite

    g = rewrite(analyze_text(_ATTENTION.replace("SEQ", "256")), precision="fp32", fused_attention=fused)
    live = device_memory(LoweringContext.build(g, None))["live"]
    token = 2 * 256 * 16 * 4  # one (batch, seq, hidden) fp32 tensor
    scores = 2 * 2 * 256 * 256 * 4  # one (batch, heads, seq, seq) fp32 tensor
    if fused:  # the peak is the head split: q1 read, q written, k1 and v1 waiting; no S x S in HBM
        assert live == 4 * token
    else:  # at the softmax: its scores in, its probabilities out, and v waiting for PV
        assert live == 2 * scores + token


@pytest.mark.parametrize("quant", ["int8", "fp8"])
def test_under_int8_or_fp8_a_matmul_left_in_fp16_runs_at_the_fp16_peak(quant):
    """Only the quantised block matmuls run at the int8 / fp8 peak; the attention matmuls the
    precision pass leaves in fp16 take the time they take in an fp16 plan (timed at the plan's
    peak, they outran the fp16 peak the verifier bounds them by: an internal error on a100)."""
    from dabench_ir.ir import DType
    from dabench_ir.passes import meta

    target = load_target("h100")

    def plan(precision: str):
        graph = decoder(layers=1, hidden=256, seq=128, batch=4)
        low = {"fp16": DType.FLOAT16, "int8": DType.INT8, "fp8": DType.FLOAT8E4M3FN}[precision]
        for node in graph.nodes:  # as `PrecisionPass` marks them: weights' matmuls quantised, the rest fp16
            projection = node.op_type == "MatMul" and not node.name.endswith((".qk", ".av"))
            node.meta[meta.PRECISION] = low if projection else DType.FLOAT16
        return lower(graph, target, ProfileOptions(precision=precision))

    fp16, quantised = plan("fp16"), plan(quant)
    for name in ("layers.0.attn.qk", "layers.0.attn.av"):
        assert quantised.node_plans[name].compute_s == fp16.node_plans[name].compute_s > 0
    proj = "layers.0.mlp.fc1"
    assert quantised.node_plans[proj].compute_s < fp16.node_plans[proj].compute_s  # at the int8 / fp8 peak


# -- the optimizer offloaded to the host (--optimizer-state offchip, ZeRO-Offload) ------------------


def _trained(**shape):
    from dabench_ir.passes.training import TrainingPass

    graph = decoder(**shape)
    TrainingPass()(graph)
    return graph


def _offloaded(graph, target=A100, host_sharers=1, **options):
    opts = ProfileOptions(optimizer_state="offchip", **options)
    return lower(graph, target, GpuLowering.options(opts, host_sharers=host_sharers))


def test_an_offloaded_optimizer_runs_on_the_host_and_its_weights_come_back_over_pcie():
    from dabench_ir.lowering.gpu import HOST_ISSUE, OFFLOAD_WEIGHTS
    from dabench_ir.passes.training import ADAM_MOMENT_BYTES_PER_PARAM, MASTER_BYTES_PER_PARAM

    graph = _trained(layers=2, hidden=64)
    params = sum(v.type.numel() for v in graph.weights())
    host, pcie = A100.memory("host"), A100.link("pcie")
    assert (host.bandwidth_bytes_per_s, pcie.bandwidth_bytes_per_s) == (375.4e9, 32e9)  # the file's figures
    on = lower(graph.clone(), A100, GpuLowering.options(ProfileOptions(optimizer_state="onchip")))
    off = _offloaded(graph)
    adam = off.node_plans["optimizer.adam_step"]
    # fp16 weights: Adam reads the fp32 master, the gradient and both moments and writes the master, the
    # moments and the fp16 copy, 28 bytes a parameter, through the GPU's share of the host's DRAM
    assert adam.bytes == (4 + 2 + 8 + 4 + 8 + 2) * params
    assert adam.per_micro_batch_s == pytest.approx(adam.bytes / host.bandwidth_bytes_per_s)
    assert (adam.feed_level, adam.compute_s, adam.overhead_s, adam.bound) == ("host", 0.0, 0.0, Bound.MEMORY)
    assert on.node_plans["optimizer.adam_step"].feed_level == "off-chip"
    # the updated fp16 weights cross back, one direction of PCIe; the gradients hide under the backward
    copies = {k: v for k, v in off.step_overheads_s.items() if k != HOST_ISSUE}
    assert copies == {OFFLOAD_WEIGHTS: pytest.approx(2 * params / pcie.bandwidth_bytes_per_s)}
    assert on.step_overheads_s.keys() == {HOST_ISSUE}  # no copies when the state stays on the GPU
    # the state leaves HBM for the host, where its bytes are counted against the GPU's share
    moved = (MASTER_BYTES_PER_PARAM + ADAM_MOMENT_BYTES_PER_PARAM) * params
    assert off.memory_bytes["host"] == moved
    assert on.memory_bytes["hbm"] - off.memory_bytes["hbm"] == moved
    assert off.traffic_bytes["host"] == adam.bytes
    assert on.traffic_bytes["hbm"] - off.traffic_bytes["hbm"] == adam.bytes


def test_the_trace_draws_the_host_run_adam_on_the_host_not_on_the_gpu_stream():
    from dabench_ir.emulate import emulate
    from dabench_ir.report.trace import chrome_trace_events, validate_trace

    graph = _trained(layers=2, hidden=64)
    for state, process in (("offchip", "a100 host"), ("onchip", "a100 GPU")):
        plan = (
            _offloaded(graph.clone())
            if state == "offchip"
            else lower(graph.clone(), A100, GpuLowering.options(ProfileOptions(optimizer_state="onchip")))
        )
        events = chrome_trace_events(emulate(plan, graph), graph, plan=plan)
        assert validate_trace({"traceEvents": events}) == []
        names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        (adam,) = [e for e in events if e["ph"] == "X" and e["name"] == "optimizer.adam_step"]
        assert names[adam["pid"]] == process
        assert all(names[e["pid"]] != "a100 host" for e in events if e["ph"] == "X" and e is not adam)


def test_gradients_to_the_host_cost_what_the_backward_does_not_hide():
    from dabench_ir.lowering.gpu import OFFLOAD_GRADIENTS

    pcie = A100.link("pcie").bandwidth_bytes_per_s
    # wide layers over one token: 12 MB of fp16 gradients (0.38 ms over PCIe) behind a backward of a
    # few tens of microseconds, so most of the copy shows
    short = _offloaded(_trained(layers=1, hidden=1024, seq=1, heads=8))
    gradients_s = 2 * sum(v.type.numel() for v in _trained(layers=1, hidden=1024, seq=1, heads=8).weights()) / pcie
    # (a GPU plan's node times are over the step)
    stream_s = sum(p.per_micro_batch_s for n, p in short.node_plans.items() if n != "optimizer.adam_step")
    assert gradients_s - stream_s < short.step_overheads_s[OFFLOAD_GRADIENTS] < gradients_s
    # two micro-batches: each copies its gradients under its own (halved) backward
    two = _offloaded(_trained(layers=1, hidden=1024, seq=2, heads=8), micro_batches=2)
    assert two.step_overheads_s[OFFLOAD_GRADIENTS] == pytest.approx(
        2 * short.step_overheads_s[OFFLOAD_GRADIENTS], rel=0.05
    )
    # a long sequence: the backward outlasts the copy, which costs nothing
    assert OFFLOAD_GRADIENTS not in _offloaded(_trained(layers=1, hidden=1024, seq=1024, heads=8)).step_overheads_s


def test_under_zero_each_gpu_offloads_and_updates_its_partition():
    from dabench_ir.lowering.gpu import OFFLOAD_WEIGHTS
    from dabench_ir.scaling import shard_optimizer_step

    whole = _offloaded(_trained(layers=2, hidden=64))
    graph = _trained(layers=2, hidden=64)
    shard_optimizer_step(graph, 0.25)
    quarter = _offloaded(graph)
    assert quarter.step_overheads_s[OFFLOAD_WEIGHTS] == pytest.approx(whole.step_overheads_s[OFFLOAD_WEIGHTS] / 4)
    adam = "optimizer.adam_step"
    assert quarter.node_plans[adam].per_micro_batch_s == pytest.approx(
        whole.node_plans[adam].per_micro_batch_s / 4, rel=1e-4
    )


def _edited(tmp_path, old: str, new: str) -> Target:
    from pathlib import Path

    import dabench_ir.targets as targets

    text = (Path(targets.__file__).parent / "a100.toml").read_text()
    assert old in text
    path = tmp_path / "a100x.toml"
    path.write_text(text.replace(old, new).replace('name = "a100"', 'name = "a100x"'))
    return load_target(str(path))


def test_the_offloaded_state_must_fit_the_gpus_share_of_host_memory(tmp_path):
    small = _edited(tmp_path, "capacity_bytes = { value = 2e12", "capacity_bytes = { value = 1e5")
    plan = _offloaded(_trained(layers=2, hidden=64), small)
    assert not plan.fits and "of host memory" in plan.failure.reason
    assert _offloaded(_trained(layers=2, hidden=64)).fits
    # the GPUs of a node that offload at once split the host's memory
    need = _offloaded(_trained(layers=2, hidden=64)).memory_bytes["host"]
    half = _edited(tmp_path, "capacity_bytes = { value = 2e12", f"capacity_bytes = {{ value = {need * 1.5}")
    assert _offloaded(_trained(layers=2, hidden=64), half).fits
    assert not _offloaded(_trained(layers=2, hidden=64), half, host_sharers=2).fits


def test_a_target_without_a_host_link_refuses_to_offload(tmp_path):
    from dabench_ir.errors import UserError

    no_pcie = _edited(tmp_path, 'name = "pcie"', 'name = "pcie-x"')
    with pytest.raises(UserError, match="no host link"):
        _offloaded(_trained(layers=2, hidden=64), no_pcie)
