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
