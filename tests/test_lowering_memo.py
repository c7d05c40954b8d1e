"""The lowering context's memoised answers (sizes, work, RDU demand) equal the functions they
memoise, node by node, asked once or many times."""

from __future__ import annotations

from dabench_ir.ir import Cost, TensorType, Value, ValueKind
from dabench_ir.lowering.context import LoweringContext, value_bytes
from dabench_ir.lowering.rdu import Chip, RduOptions
from dabench_ir.lowering.rdu.sections import Demand, pmu_demand
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import traits_of
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder


def test_value_bytes_memo_equals_the_function_and_keeps_each_callers_default():
    graph = decoder(layers=2, hidden=64, seq=16)
    graph.values["free"] = Value(
        "free", TensorType(("n", 4), graph.values[graph.inputs[0]].type.dtype), ValueKind.ACTIVATION
    )
    ctx = LoweringContext.build(graph)
    names = [*graph.values, "free", "missing"]
    for _ in range(2):  # the second round reads the memo
        for name in names:
            assert ctx.value_bytes(name) == value_bytes(graph, name)
            assert ctx.value_bytes(name, 7) == value_bytes(graph, name, 7)
    assert (ctx.value_bytes("free", 7), ctx.value_bytes("missing", 9), ctx.value_bytes("free")) == (7, 9, 0)
    assert ctx.value_bytes(graph.inputs[0]) == 16 * 64 * 2  # seq x hidden, fp16


def test_is_work_memo_equals_its_rule():
    graph = decoder(layers=2, hidden=64, seq=16)
    graph.nodes[1].meta[meta.COST] = Cost()  # no FLOPs, no bytes: not work
    ctx = LoweringContext.build(graph)
    for _ in range(2):
        for node in graph.nodes:
            cost = ctx.costs[node.name]
            assert ctx.is_work(node) == (not traits_of(node).shape_only and (cost.flops > 0 or cost.bytes > 0))
    assert not ctx.is_work(graph.nodes[1]) and any(ctx.is_work(n) for n in graph.nodes)


def test_rdu_demand_memo_equals_a_fresh_computation():
    graph = decoder(layers=2, hidden=64, seq=16)
    target = load_target("rdu")
    ctx = LoweringContext.build(graph)
    opts = RduOptions(
        precision=None,
        micro_batches=None,
        opt_level="O3",
        tiles=None,
        resource_scale=1.0,
        rdu_mapping="compiler",
        rdu_host_loop="tutorial",
    )
    chip = Chip.of(target, opts)
    memo = Demand(ctx, chip)
    for _ in range(2):
        for node in graph.nodes:
            for phase in ("forward", "backward"):
                fresh = Demand(ctx, chip)
                assert memo.pmu(node, phase) == pmu_demand(ctx, chip, node, fresh.cost(node, phase))
                assert memo.pcu(node, phase) == fresh.pcu(node, phase)
    assert any(memo.pcu(n, "forward") > 0 for n in graph.nodes)


def _stored_reference(ctx: LoweringContext, nodes) -> dict[str, int]:
    """The distinct stored values ``nodes`` read, by root, first reader's bytes: walked afresh."""
    from dabench_ir.lowering.context import stored_root

    graph, out = ctx.graph, {}
    for node in nodes:
        if meta.FOLDED in node.meta:
            continue
        skip = traits_of(node).output_shape_input
        stored = [
            v
            for i, v in enumerate(node.inputs)
            if v and i != skip and v in graph.values and graph.values[v].kind.is_stored
        ]
        for v in stored:
            out.setdefault(
                stored_root(graph, v), value_bytes(graph, v, ctx.costs[node.name].weight_bytes // len(stored))
            )
    return out


def test_stored_values_memo_equals_a_fresh_walk_for_every_subset():
    from dabench_ir.lowering.context import stored_values, weight_bytes

    graph = decoder(layers=2, hidden=64, seq=16)
    ctx = LoweringContext.build(graph)  # the whole graph once: every node's reads memoised
    nodes = graph.nodes
    subsets = [nodes, nodes[:7], nodes[5:], nodes[::3], list(reversed(nodes)), [n for n in nodes if n.layer == 1], []]
    for _ in range(2):
        for subset in subsets:
            assert stored_values(ctx, subset) == _stored_reference(ctx, subset)
            assert list(stored_values(ctx, subset)) == list(_stored_reference(ctx, subset))  # first reader's order
    assert weight_bytes(ctx) == ctx.total_weight_bytes == sum(_stored_reference(ctx, nodes).values()) > 0


def test_wse_work_s_memo_equals_a_fresh_computation_for_every_node():
    from dabench_ir.lowering.wse.common import is_data
    from dabench_ir.lowering.wse.kernels import KernelRates
    from dabench_ir.passes.precision import accumulate_dtype

    graph = decoder(layers=3, hidden=64, seq=16)
    target = load_target("wse")
    ctx = LoweringContext.build(graph)
    memo = KernelRates.of(target)
    for _ in range(2):  # the second round reads the memo
        for node in graph.nodes:
            args = (ctx.costs[node.name], ctx.node_precision(node), is_data(node), accumulate_dtype(graph, node))
            assert memo.work_s(*args) == KernelRates.of(target)._work_s(*args)
    assert 0 < len(memo._seconds) < len(graph.nodes)  # repeated layers share their arguments


def test_rdu_pipeline_and_rates_equal_their_sums_bit_for_bit():
    import random

    from dabench_ir.lowering.rdu import pipeline_s
    from dabench_ir.lowering.rdu.timing import Rates

    rng = random.Random(7)
    for _ in range(300):
        stages = [(rng.choice([0.0, rng.random()]), rng.randint(0, 9)) for _ in range(rng.randint(1, 6))]
        room, pcus = rng.randint(1, 64), rng.randint(1, 64)
        held = sum(max(1, p) for _, p in stages)
        assert pipeline_s(stages, room, pcus) == pcus * max(t / max(1, p) for t, p in stages) * max(1.0, held / room)
        rates = Rates(
            contraction=rng.random() * 1e12,
            vector=rng.choice([0.0, 1e11]),
            special=rng.choice([0.0, 1e10]),
            k_half=rng.choice([0.0, 64.0]),
        )
        cost = Cost(
            contraction_flops=rng.choice([0, 10**9]),
            vector_flops=rng.choice([0, 10**6]),
            special_ops=rng.choice([0, 10**5]),
        )
        parts = sum(
            n / r for n, r in ((cost.vector_flops, rates.vector), (cost.special_ops, rates.special)) if n and r > 0
        )
        c = cost.contraction_flops
        for k in (None, rng.random() * 512):
            want = parts if not c else parts + c / (rates.contraction * (1.0 if k is None else rates.shape(k)))
            assert rates.time(cost, k) == want
