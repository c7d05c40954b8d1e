"""Rates per op class: contraction at the tensor peak, vector at the CUDA-core / PE vector rate,
special functions at the SFU rate (issue "Physics verifiers after every stage")."""

from __future__ import annotations

import pytest

from dabench_ir.ir import Cost, DType, Graph, Node, TensorType, Value, ValueKind
from dabench_ir.lowering import lower
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.lowering.gpu import GpuLowering
from dabench_ir.lowering.wse import wse_kernels
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.passes.training import FUSED_ATTENTION, FusedAttentionPass
from dabench_ir.targets import OP_CLASSES, Target, load_target
from dabench_ir.timeline import Bound
from tests.lowering_graphs import decoder

GPUS = ("a100", "h100", "h200")
N = 10**10  # elements: big enough that every node is compute-bound on every GPU


def _one_node(op: str, cost: Cost, dtype: DType, *, weight: bool = False) -> Graph:
    """One node ``op`` reading an activation (and a weight) with ``cost`` in its meta."""
    values = {"x": Value("x", TensorType((1, 64), dtype), ValueKind.INPUT)}
    inputs = ["x"]
    if weight:
        values["w"] = Value("w", TensorType((64, 64), dtype), ValueKind.WEIGHT)
        inputs.append("w")
    values["y"] = Value("y", TensorType((1, 64), dtype), ValueKind.ACTIVATION, "n")
    node = Node("n", op, inputs=inputs, outputs=["y"], scope="", layer=None)
    node.meta[meta.COST] = cost
    return Graph([node], values, ["x"], ["y"], name=f"one-{op}")


def _gpu_node(target: Target, graph: Graph, precision: str):
    plan = lower(graph, target, GpuLowering.options(ProfileOptions(precision=precision), fuse_elementwise=False))
    return plan.node_plans["n"]


def _tiny_bytes() -> dict[str, int]:
    return {"act_bytes_in": 64, "act_bytes_out": 64}


@pytest.mark.parametrize("name", GPUS)
def test_gpu_each_class_at_its_own_rate(name):
    t = load_target(name)
    exp = _gpu_node(t, _one_node("Exp", Cost(special_ops=N, **_tiny_bytes()), DType.BFLOAT16), "bf16")
    assert exp.compute_s == pytest.approx(N / t.rate("special", "bf16"))
    assert exp.bound is Bound.COMPUTE and "special-function" in exp.note
    add = _gpu_node(t, _one_node("Add", Cost(vector_flops=N, **_tiny_bytes()), DType.BFLOAT16), "bf16")
    assert add.compute_s == pytest.approx(N / t.rate("vector", "bf16"))
    assert add.bound is Bound.COMPUTE and "vector" in add.note
    mm = _gpu_node(
        t, _one_node("MatMul", Cost(contraction_flops=N * 1000, **_tiny_bytes()), DType.BFLOAT16, weight=True), "bf16"
    )
    assert mm.compute_s == pytest.approx(N * 1000 / (t.peak_flops("bf16") * t.arch_value("matmul_efficiency")))
    assert mm.bound is Bound.COMPUTE and mm.note == ""
    # the classes add (one issue slot per warp scheduler for all of them)
    both = Cost(vector_flops=N, special_ops=N, **_tiny_bytes())
    mixed = _gpu_node(t, _one_node("Gelu", both, DType.BFLOAT16), "bf16")
    assert mixed.compute_s == pytest.approx(N / t.rate("vector", "bf16") + N / t.rate("special", "bf16"))


def test_h100_rates_are_the_published_ones():
    h100 = load_target("h100")
    assert h100.rate("contraction", "bf16") == 989e12
    assert h100.rate("vector", "fp32") == 67e12 and h100.rate("vector", "bf16") == 133.8e12
    assert h100.rate("special", "fp32") == 3.9e12  # FlashAttention-3: 3.9 TFLOPS of special functions
    sfu = 16 * h100.num_units * 1.83e9  # CUDA guide: 16 results/clock/SM on sm_90, at the tensor peak's clock
    assert h100.rate("special", "fp32") == pytest.approx(sfu, rel=0.02)
    assert h100.rate("contraction", "bf16") / h100.rate("special", "bf16") > 100  # two orders of magnitude
    a100 = load_target("a100")
    assert a100.rate("special", "fp32") == pytest.approx(16 * a100.num_units * 1.41e9, rel=1e-3)
    assert a100.rate("vector", "bf16") == 39e12 and a100.rate("vector", "fp16") == 78e12


def test_every_class_rate_has_a_source():
    for name in (*GPUS, "wse2"):
        t = load_target(name)
        for table in (t.vector_rates, t.special_rates):
            assert {"fp32", "fp16", "bf16"} <= set(table), name
            assert all(len(q.source) > 10 for q in table.values()), name
        shown = {path for path, _ in t.quantities()}
        assert {"compute.vector_flops.bf16", "compute.special_ops.fp32"} <= shown


def test_rate_fallbacks():
    h100 = load_target("h100")
    assert h100.rate("vector", "int8") == h100.rate("vector", "fp32")  # no int8 vector unit: fp32 math
    assert h100.rate("special", DType.FLOAT16) == h100.rate("special", "fp32")
    with pytest.raises(ValueError):
        h100.rate("tensor", "bf16")
    d = dict(h100.raw)
    d["compute"] = {k: v for k, v in d["compute"].items() if k not in ("vector_flops", "special_ops")}
    single = Target.from_dict(d, origin="single.toml")  # a file without class tables: one rate for every FLOP
    assert all(single.rate(c, "bf16") == single.peak_flops("bf16") for c in OP_CLASSES)
    cost = Cost(contraction_flops=10, vector_flops=20, special_ops=30)
    assert single.compute_time(cost, "bf16", contraction_efficiency=0.5) == pytest.approx(
        10 / (0.5 * 989e12) + 50 / 989e12
    )


def test_wse_work_at_the_per_class_rates():
    wse = load_target("wse2")
    pes = wse.num_units
    eff = wse.arch_value("pe_matmul_efficiency")
    cases = [
        ("Exp", Cost(special_ops=N, **_tiny_bytes()), False, N / wse.rate("special", "fp16")),
        ("Add", Cost(vector_flops=N, **_tiny_bytes()), False, N / wse.rate("vector", "fp16")),
        ("MatMul", Cost(contraction_flops=N, **_tiny_bytes()), True, N / (wse.peak_flops("fp16") * eff)),
    ]
    for op, cost, weight, seconds in cases:
        graph = _one_node(op, cost, DType.FLOAT16, weight=weight)
        (kernel,) = wse_kernels(LoweringContext.build(graph), wse)
        assert kernel.work_s == pytest.approx(seconds * pes), op  # busy PE-seconds: the wafer's time x its PEs
    # the fitted per-PE figures the class rates were written from (point A): unchanged
    assert wse.rate("vector", "fp16") / pes / wse.clock.value == pytest.approx(0.30)
    assert pes * wse.clock.value / wse.rate("special", "fp16") == pytest.approx(110)


def _fused_decoder(dtype: DType = DType.BFLOAT16) -> Graph:
    g = decoder(layers=1, hidden=2048, seq=2048, heads=16, dtype=dtype)
    return FusedAttentionPass().call(g).graph


def test_h100_softmax_runs_at_the_sfu_and_vector_rates_not_the_tensor_peak():
    h100 = load_target("h100")
    g = _fused_decoder()
    plan = lower(g, h100, ProfileOptions(precision="bf16"))
    sm = plan.node_plans["layers.0.attn.softmax"]
    assert FUSED_ATTENTION in g.node("layers.0.attn.softmax").meta
    cost = LoweringContext.build(g).costs["layers.0.attn.softmax"]
    achieved = sm.flops / sm.compute_s
    # formerly every FLOP at 35 % of the bf16 tensor peak: 346 TFLOP/s, "compute-bound"
    assert achieved < 0.35 * h100.peak_flops("bf16") / 10
    assert achieved <= h100.rate("vector", "bf16")
    assert cost.special_ops / sm.compute_s <= h100.rate("special", "bf16")  # no exp faster than the SFUs
    assert sm.compute_s >= cost.vector_flops / h100.rate("vector", "bf16") + cost.special_ops / h100.rate(
        "special", "bf16"
    )
    assert sm.bound is Bound.COMPUTE  # its scores stay on chip: nothing to read, the SFUs and FMAs bind


def test_fused_attention_keeps_its_published_share():
    """The kernel's matmul FLOPs over its time is the published share of peak, while its exps fit."""
    for name in GPUS:
        t = load_target(name)
        g = _fused_decoder()
        plan = lower(g, t, ProfileOptions(precision="bf16"))
        core = [n.name for n in g.nodes if FUSED_ATTENTION in n.meta]
        ctx = LoweringContext.build(g)
        matmul = sum(ctx.costs[n].contraction_flops for n in core)
        seconds = sum(plan.node_plans[n].compute_s for n in core)
        share = t.arch_value("fused_attention_efficiency")
        assert matmul / seconds == pytest.approx(share * t.peak_flops("bf16")), name


def test_fused_attention_never_faster_than_its_sfu_work():
    """A kernel whose exps outlast its matmuls at the published share runs at the SFU rate."""
    h100 = load_target("h100")
    g = _fused_decoder()
    sm = g.node("layers.0.attn.softmax")
    c = sm.meta[meta.COST]
    sm.meta[meta.COST] = Cost(
        vector_flops=c.vector_flops,
        special_ops=c.special_ops * 200,
        act_bytes_in=c.act_bytes_in,
        act_bytes_out=c.act_bytes_out,
    )
    plan = lower(g, h100, ProfileOptions(precision="bf16"))
    ctx = LoweringContext.build(g)
    core = [n.name for n in g.nodes if FUSED_ATTENTION in n.meta]
    seconds = sum(plan.node_plans[n].compute_s for n in core)
    floor = sum(h100.compute_time(ctx.costs[n], ctx.node_precision(g.node(n)), contraction_dtype="bf16") for n in core)
    assert seconds == pytest.approx(floor)
    assert ctx.costs[sm.name].special_ops / plan.node_plans[sm.name].compute_s <= h100.rate("special", "bf16")


def test_fp32_accumulation_rate_is_the_targets_where_declared():
    # the WSE's FMAC rate is set by the accumulator's width (64 bits per cycle through PE SRAM:
    # 4 fp16 or 2 fp32 partial sums), so 16-bit inputs accumulated in fp32 run at the fp32 rate;
    # GPU tensor cores accumulate in fp32 at the 16-bit peak (no table: the peak)
    wse = load_target("wse2")
    for half in ("fp16", "bf16"):
        assert wse.rate("contraction", half, DType.FLOAT32) == wse.peak_flops("fp32")
        assert wse.rate("contraction", half) == wse.peak_flops(half)  # 16-bit accumulation: 4 lanes
        assert wse.rate("contraction", half, half) == wse.peak_flops(half)
    assert wse.rate("contraction", "fp32", "fp32") == wse.peak_flops("fp32")
    assert wse.rate("vector", "fp16", DType.FLOAT32) == wse.rate("vector", "fp16")  # contractions only
    assert "compute.fp32_accumulate_flops.bf16" in {path for path, _ in wse.quantities()}
    cost = Cost(contraction_flops=N)
    assert wse.compute_time(cost, "bf16", accumulate_dtype="fp32") == pytest.approx(N / wse.peak_flops("fp32"))
    for name in GPUS:
        t = load_target(name)
        assert not t.accumulate_rates
        assert t.rate("contraction", "bf16", DType.FLOAT32) == t.peak_flops("bf16")
    d = dict(wse.raw)
    d["compute"] = {**d["compute"], "fp32_accumulate_flops": {"fp32": {"value": 1.0, "source": "a bad key"}}}
    with pytest.raises(Exception, match="16-bit input dtype"):
        Target.from_dict(d, origin="bad.toml")
