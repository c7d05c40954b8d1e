"""GPU / CPU lowering: roofline kernel times, launch overhead, fusion, HBM capacity."""

from __future__ import annotations

import pytest

from dabench_ir.lowering import lower
from dabench_ir.lowering.gpu import GpuLowering
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import Target, load_target
from dabench_ir.timeline import Bound
from tests.lowering_graphs import chain, decoder

A100 = load_target("a100")


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
    assert n1.per_micro_batch_s == pytest.approx(10**9 / A100.memory("hbm").bandwidth_bytes_per_s + launch)
    assert n1.bound is Bound.MEMORY
    tiny = lower(chain([small], [small]), A100, ProfileOptions())
    assert tiny.node_plans["n0"].bound is Bound.OVERHEAD


def test_a_step_of_short_kernels_is_bound_by_the_host_issuing_them():
    from dabench_ir.emulate import emulate
    from dabench_ir.lowering.gpu import HOST_ISSUE

    launch, issue = A100.overhead("kernel_launch_s"), A100.overhead("host_issue_s")
    assert 0 < launch < issue  # a tiny kernel runs (with its launch) faster than the host issues the next
    opts = GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False)
    bw = A100.memory("hbm").bandwidth_bytes_per_s
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
    assert _tile_efficiency(65536, 768, 768, 1, 128, 108) == pytest.approx(65536 * 768 * 768 / (57 * 384 * 108 * 128**2))
    assert _tile_efficiency(65536, 768, 768, 1, 128, 132) > 0.99  # large GEMMs: the MAMF share is the ceiling


def test_small_gemm_pays_its_partial_wave_large_gemm_does_not():
    from dabench_ir.lowering._common import LoweringContext
    from dabench_ir.lowering.gpu import gemm_wave_efficiency

    g = decoder(layers=1, hidden=768, seq=128)  # 128 x 768 x 768 projections, 128 x 768 x 3072 fc1
    ctx = LoweringContext.build(g, None)
    node = {n.name: n for n in g.nodes}
    assert gemm_wave_efficiency(ctx, node["layers.0.attn.q_proj"], A100) == pytest.approx(1 / 3)
    assert gemm_wave_efficiency(ctx, node["layers.0.mlp.fc1"], A100) == pytest.approx(8 / 9)  # 24 tiles x split-K 4: 96 blocks
    plan = lower(g, A100, GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False))
    q = plan.node_plans["layers.0.attn.q_proj"]
    mm = A100.peak_flops("fp32") * A100.arch_value("matmul_efficiency")
    assert q.compute_s == pytest.approx(2 * 128 * 768 * 768 / (mm / 3))
    no_tile = Target.from_dict({**A100.raw, "arch": {k: v for k, v in A100.raw["arch"].items() if k != "gemm_tile"}},
                               origin="a100-no-tile.toml")  # fmt: skip
    plain = lower(g, no_tile, GpuLowering.options(ProfileOptions(precision="fp32"), fuse_elementwise=False))
    assert plain.node_plans["layers.0.attn.q_proj"].compute_s == pytest.approx(q.compute_s / 3)


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
    adam_s = (4 + 4 + 8 + 4 + 8) * params / A100.memory("hbm").bandwidth_bytes_per_s
    plain = scale(graph, A100, [4], "dp", ScaleOptions(precision="fp32")).points[0]
    sharded = scale(graph, A100, [4], "dp", ScaleOptions(precision="fp32", zero=zero)).points[0]
    # each of the 4 chips updates a quarter of the parameters; ZeRO 3 also gathers weights (1.5x comm)
    assert plain.compute_time_s - sharded.compute_time_s == pytest.approx(adam_s * 3 / 4, rel=1e-3)
    assert sharded.comm_time_s == pytest.approx(plain.comm_time_s * (1.5 if zero == 3 else 1.0))
