"""The IPU's matmul partials (lowering/ipu/supersteps.py amp_rate): exact figures on tiny graphs, and
what a run loses when the mechanism is taken away (the precision-ipu finding's counterfactual)."""

from __future__ import annotations

import pytest

import dabench_ir
from dabench_ir.lowering import lower
from dabench_ir.options import ProfileOptions
from dabench_ir.targets import load_target
from tests._helpers import weightless
from tests.conftest import analyze_text, rewrite

IPU = load_target("ipu")
TILES = 1472
SHARE = 0.5  # arch.amp_share_fp32_partials: 8 of the AMP's 16 conv units with fp32 partials
FP16 = 0.430449  # arch.matmul_efficiency_fp16, as scripts/refit.py fitted it (targets/bow.toml)


def _gemm(n: int) -> object:
    return analyze_text(f"agraph (float[{n},{n}] A, float[{n},{n}] B) => (float[{n},{n}] C) {{ C = MatMul(A, B) }}")


def _matmul(precision: str, *, target=IPU, **kw) -> object:
    """The one MatMul's NodePlan of a 64^3 GEMM rewritten to ``precision``."""
    graph = rewrite(_gemm(64), precision=precision)
    plan = lower(graph, target, ProfileOptions(precision=precision, **kw))
    return next(iter(plan.node_plans.values()))


def test_the_figure_the_rate_reads():
    assert IPU.arch_value("amp_share_fp32_partials") == SHARE
    assert IPU.arch_value("matmul_efficiency_fp16") == FP16


def test_a_16_bit_matmul_with_fp32_partials_runs_on_half_the_amp():
    tiles = 6  # one tile per 1e5 FLOPs of its 2 x 64^3
    half = _matmul("fp16")  # the default: fp16 partials, as Graphcore's GPT-2 examples run
    assert half.compute_s == pytest.approx(2 * 64**3 / (FP16 * 350e12 / TILES * tiles), rel=1e-12)
    full = _matmul("fp16", half_partials=False)
    assert full.compute_s == pytest.approx(2 * 64**3 / (SHARE * FP16 * 350e12 / TILES * tiles), rel=1e-12)
    # the exchange and the syncs are the data's; the AMP loop's partials traffic is per AMP cycle
    assert (full.comm_s, full.overhead_s) == (half.comm_s, half.overhead_s)
    assert full.feed_bytes == 2 * half.feed_bytes


def test_a_matmuls_roofline_bytes_are_its_amp_loops_partials_traffic():
    """24 B a tile-cycle (two 64-bit loads, one 64-bit store) for every AMP cycle its FLOPs need at
    the full rate: 350e12 / 1472 / 1.85e9 = 128.5 FLOP a cycle with fp16 partials, half that with
    fp32 partials; fp32 data 87.5e12 / 1472 / 1.85e9 = 32.1."""
    flops = 2 * 64**3
    cycle16, cycle32 = 350e12 / TILES / 1.85e9, 87.5e12 / TILES / 1.85e9
    assert _matmul("fp16").feed_bytes == pytest.approx(flops / cycle16 * 24, rel=1e-12)
    assert _matmul("fp16", half_partials=False).feed_bytes == pytest.approx(flops / (SHARE * cycle16) * 24, rel=1e-12)
    assert _matmul("fp32").feed_bytes == pytest.approx(flops / cycle32 * 24, rel=1e-12)
    # against tile SRAM (65 TB/s) over the FLOPs at the 16-bit peak: fp16 partials at the ridge (24 B
    # a cycle on every tile is 65.4 TB/s), fp32 partials twice there: left of the ridge
    at_ridge = TILES * 1.85e9 * 24 / 65e12  # 1.0055
    sram = IPU.memory("sram").bandwidth_bytes_per_s
    assert _matmul("fp16").feed_bytes / sram / (flops / 350e12) == pytest.approx(at_ridge, rel=1e-12)
    full = _matmul("fp16", half_partials=False)
    assert full.feed_bytes / sram / (flops / 350e12) == pytest.approx(2 * at_ridge, rel=1e-12)


def test_without_the_amp_loop_a_matmul_moves_its_operands_once():
    operands = 3 * 64 * 64 * 2  # A, B and C in fp16
    once = IPU.with_changes({"arch.amp_bytes_per_cycle": 0})
    assert _matmul("fp16", target=once).feed_bytes == operands


def test_fp32_data_keeps_fp32_partials_whatever_the_knob():
    assert _matmul("fp32", half_partials=False).compute_s == _matmul("fp32").compute_s


def test_without_the_mechanism_fp32_partials_cost_nothing():
    same = IPU.with_changes({"arch.amp_share_fp32_partials": 1.0})
    assert _matmul("fp16", target=same, half_partials=False).compute_s == pytest.approx(_matmul("fp16").compute_s)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ipu_mech") / "gpt2.onnx"
    return weightless(path, family="gpt2", layers=2, hidden=64, heads=4, seq=32, vocab=128, batch=2)


def test_a_training_step_pays_the_amp_time_once_more_and_nothing_else(tiny):
    """The step with fp32 partials is longer by exactly its matmuls' AMP time at the fp16-partials
    rate (each micro-batch's, on the most loaded IPU): the rows outside the cycle do not move."""

    def step(hp: bool):
        return dabench_ir.profile(tiny, target="ipu", mode="train", precision="fp16", micro_batches=2, half_partials=hp)

    half, full = step(True), step(False)
    assert full.timeline.overheads_s["optimizer"] == half.timeline.overheads_s["optimizer"]
    assert full.timeline.overheads_s["host_streams"] == half.timeline.overheads_s["host_streams"]
    extra_s = sum(full.plan.node_plans[name].compute_s - np_.compute_s for name, np_ in half.plan.node_plans.items())
    amp_s = sum(
        np_.compute_s for name, np_ in half.plan.node_plans.items() if half.node(name).cost.contraction_flops > 0
    )
    assert extra_s == pytest.approx(amp_s * (1 / SHARE - 1), rel=1e-9) and extra_s > 0
    # one IPU: the cycle is every node's per-micro-batch time; m = 2 micro-batches a step
    assert full.plan.extra["cycle_s"] - half.plan.extra["cycle_s"] == pytest.approx(extra_s / 2, rel=1e-9)


@pytest.mark.parametrize("state", ["onchip", "offchip"])
def test_replicated_tensor_sharding_splits_the_weight_update_over_the_replicas(state):
    """Under replicated tensor sharding each of n replicas updates its 1/n shard of the weights (popxl's
    optimiser "operates directly on the RTS sharded ... optimiser state and variables"), and streams its
    1/n of an off-chip state: the step's optimizer row is 1/n of one replica's, and the plan names why."""
    from dabench_ir.passes.training import TrainingPass
    from tests.lowering_graphs import decoder

    graph = decoder(layers=2, hidden=64, batch=2)
    TrainingPass()(graph)
    ipu = load_target("ipu")
    rows = {}
    for replicas, rts in ((1, True), (4, True), (4, False)):
        plan = lower(
            graph, ipu, ProfileOptions(replicas=replicas, optimizer_state=state, replicated_tensor_sharding=rts)
        )
        rows[replicas, rts] = plan.step_overheads_s["optimizer"]
        assert (plan.stats.replicas_share is not None) == (replicas > 1 and rts)
    assert rows[4, True] == pytest.approx(rows[1, True] / 4)
    assert rows[4, False] == pytest.approx(rows[1, True])  # without the sharding each updates every weight
