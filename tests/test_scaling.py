"""Level-2 scaling on top of the single-chip lowerings: DP, TP, PP and refusals."""

from __future__ import annotations

import pytest

from dabench_ir.errors import UserError
from dabench_ir.lowering.collectives import ring_allreduce_time, root_allreduce_time
from dabench_ir.lowering.gpu import live_bytes, live_skip
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.scaling import EMBEDDING, LM_HEAD, scale, split_for_tp
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder


def _contraction(graph, pred=lambda n: True):
    return sum(meta.get_cost(n).contraction_flops for n in graph.nodes if pred(n))


@pytest.mark.parametrize("chips", [2, 4])
def test_tp_share_is_one_nth_of_split_matmuls_plus_replicated_rest(chips):
    graph = decoder(layers=2, hidden=64)
    share, collectives = split_for_tp(graph, chips)
    allreduces = [c.nbytes for c in collectives if c.op == "all-reduce" and c.count == 1]
    split = lambda n: ".attn" in n.scope or ".mlp" in n.scope  # noqa: E731
    assert _contraction(share, split) == _contraction(graph, split) // chips
    # norms and residual adds are replicated: every chip does all of them
    rest = lambda n: not split(n)  # noqa: E731
    assert sum(meta.get_cost(n).flops for n in share.nodes if rest(n)) == sum(
        meta.get_cost(n).flops for n in graph.nodes if rest(n)
    )
    # Megatron: one all-reduce per attention and one per MLP, of the block's output size (no LM head here)
    assert len(allreduces) == len(collectives) == 2 * 2
    assert set(allreduces) == {1 * 16 * 64 * 2}


def test_tp_forward_two_allreduces_per_layer_four_in_training():
    graph = decoder(layers=2, hidden=64)
    target = load_target("h100")
    link = target.link()
    one = ring_allreduce_time(16 * 64 * 2, 2, link.bandwidth_bytes_per_s, link.latency_s)
    fwd = scale(graph, target, [2], "tp", ProfileOptions()).points[0]
    assert fwd.comm_time_s == pytest.approx(2 * 2 * one)
    assert fwd.dominant_bound in ("compute", "memory", "overhead", "communication")
    graph.meta["mode"] = "train"
    train = scale(graph, target, [2], "tp", ProfileOptions()).points[0]
    assert train.comm_time_s == pytest.approx(2 * 2 * 2 * one)


def test_dp_training_all_reduces_the_gradient():
    from dabench_ir.passes.training import TrainingPass

    graph = decoder(layers=2, hidden=64)
    TrainingPass()(graph)
    target = load_target("a100")
    link = target.link()
    grad = sum(v.type.nbytes() for v in graph.weights() if not v.name.startswith("__"))  # every weight, once
    assert meta.training_state(graph).gradient_bytes == grad  # the training pass's record is what is reduced
    result = scale(graph, target, [1, 4], "dp", ProfileOptions())
    one, four = result.points
    assert four.comm_time_s == pytest.approx(ring_allreduce_time(grad, 4, link.bandwidth_bytes_per_s, link.latency_s))
    assert four.batch == 4 * one.batch
    assert 0 < four.scaling_efficiency <= 1


def test_pp_uses_an_optimal_contiguous_split_and_the_bubble():
    graph = decoder(layers=6, hidden=64, batch=4)
    result = scale(graph, load_target("h100"), [1, 3], "pp", ProfileOptions(micro_batches=4))
    p3 = result.points[1]
    assert [len(s) for s in p3.stages] == [2, 2, 2]
    assert p3.bubble_fraction == pytest.approx(2 / 6)
    assert 0 < p3.load_imbalance <= 1


@pytest.mark.parametrize("state", ["onchip", "offchip"])
def test_pp_stages_update_their_own_weights_once_a_step(state):
    """The optimizer runs once a step, after the last micro-batch's backward, every stage over its
    own weights at once: outside the pipeline's fill and drain, the slowest stage's share of the
    one-chip update (with the state offloaded: CPU Adam, on a host the stages share, and the PCIe
    copies, `lowering.gpu.Offload`). The stages' times are those of the whole graph on one chip
    running the 4 micro-batches one after another (each reads the weights again), a quarter of
    them a micro-batch; the embedding is the first stage's and the head the last's (they were
    halved between the two)."""
    from dabench_ir.emulate import emulate
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.context import LoweringContext, weight_bytes
    from dabench_ir.lowering.gpu import HOST_ISSUE, OFFLOAD_GRADIENTS, OFFLOAD_WEIGHTS
    from dabench_ir.passes.training import TrainingPass, is_optimizer_step

    graph = decoder(layers=6, hidden=256, batch=4)
    TrainingPass()(graph)
    opts = ProfileOptions(micro_batches=4, optimizer_state=state)
    h100 = load_target("h100")
    one, three = scale(graph.clone(), h100, [1, 3], "pp", opts).points
    single = one.chip
    plan = lower(graph, h100, opts)  # the micro-batches in turn on one chip
    timeline = emulate(plan, graph)
    adam = next(n.name for n in graph.nodes if is_optimizer_step(n))
    rows = single.plan.step_overheads_s
    # offloaded, the three stages' CPU Adam share one host's DRAM, which the one-chip run had alone
    sharers = 3 if state == "offchip" else 1
    update = single.timeline.busy(adam) * sharers + rows.get(OFFLOAD_GRADIENTS, 0.0) + rows.get(OFFLOAD_WEIGHTS, 0.0)
    assert (OFFLOAD_WEIGHTS in rows) == (state == "offchip")
    ctx = LoweringContext.build(graph)
    first = [n for n in graph.nodes if n.layer in three.stages[0] or (n.layer is None and n.name != adam)]
    share = weight_bytes(ctx, first) / weight_bytes(ctx)  # the first stage holds the most: its blocks and the rest
    per_layer = [sum(timeline.busy(n.name) for n in graph.nodes if n.layer == k) for k in range(6)]
    first = next(i for i, n in enumerate(graph.nodes) if n.layer is not None)
    outside = [(i, timeline.busy(n.name)) for i, n in enumerate(graph.nodes) if n.layer is None and n.name != adam]
    stage_s = [sum(per_layer[k] for k in st) for st in three.stages]
    stage_s[0] += sum(t for i, t in outside if i < first)  # the embedding: the first stage's
    stage_s[-1] += sum(t for i, t in outside if i > first)  # the head and the loss: the last's
    wait = plan.step_overheads_s.get(HOST_ISSUE, 0.0)  # the stream's wait for the host, shared by work
    worst = max(t + wait * t / sum(stage_s) for t in stage_s)
    assert three.stage_times_s == pytest.approx([t + wait * t / sum(stage_s) for t in stage_s], rel=1e-9)
    assert three.time_s == pytest.approx((4 + 3 - 1) * worst / 4 + share * update + three.comm_time_s, rel=1e-3)
    if state == "offchip":  # the stage's state lives in host memory, not on the GPU
        assert three.memory_per_device["optimizer"] == 0 < three.memory_per_device["host"]


def test_pp_cannot_split_a_batch_into_more_micro_batches_than_samples():
    graph = decoder(layers=8, hidden=64)
    with pytest.raises(UserError, match="--micro-batches 8 does not divide the batch 1"):
        scale(graph, load_target("h100"), [1, 8], "pp", ProfileOptions(micro_batches=8))
    # batch 1 is one micro-batch: the pipeline only adds its bubble, no speedup (was 4x)
    p8 = scale(graph, load_target("h100"), [1, 8], "pp", ProfileOptions(batch=1)).points[1]
    assert p8.micro_batches == 1 and p8.bubble_fraction == pytest.approx(7 / 8)
    assert p8.speedup < 1.01


def test_ipu_pipelines_over_ipus_and_wse_replicates_on_the_wafer():
    ipu = scale(decoder(layers=4, hidden=64, batch=4), load_target("ipu"), [1, 2], "pp")
    assert ipu.points[1].speedup > 1
    wse = scale(decoder(layers=4, hidden=64, batch=2), load_target("wse"), [1, 2], "dp")
    assert wse.points[1].batch == 4  # two copies on the wafer, each running the graph's batch of 2


def _ipu_trained(layers: int = 2) -> object:
    from dabench_ir.passes.training import TrainingPass

    graph = decoder(layers=layers, hidden=64, batch=2)
    TrainingPass()(graph)
    return graph


def test_ipu_data_parallel_is_the_lowerings_own_replicas():
    """``--strategy dp`` on the IPU is its lowering's ``--replicas`` (each replica on its own IPUs, the
    gradients ring all-reduced over the IPU-Links in the step): n chips place one plan of n replicas,
    and the point's communication is that plan's reduce, not a second all-reduce of the scaling stage."""
    from dabench_ir.place import place
    from dabench_ir.run import lowering_options, resolve

    graph, ipu = _ipu_trained(), load_target("ipu")
    result = scale(graph, ipu, [1, 2, 4], "dp", ProfileOptions())
    one, two, four = result.points
    link = ipu.link("ipu_link")
    for pt, n in ((two, 2), (four, 4)):
        run = resolve(graph, ipu, ProfileOptions(replicas=n), defaults=False)
        plan, timeline, _ = place(graph, ipu, lowering_options(run))
        reduce_s = plan.step_overheads_s["gradient_reduce"]
        grads = sum(v.type.nbytes() for v in graph.weights())  # every weight's gradient, in its dtype
        assert reduce_s == pytest.approx(ring_allreduce_time(grads, n, link.bandwidth_bytes_per_s))
        assert pt.time_s == pytest.approx(timeline.step_time_s)  # the replicas' plan is the step
        assert pt.comm_time_s == pytest.approx(reduce_s)
        assert pt.compute_time_s == pytest.approx(timeline.step_time_s - reduce_s)
        assert pt.batch == 2 * n and pt.devices == n  # weak scaling, one IPU a replica
        assert pt.speedup == pytest.approx(n * one.time_s / pt.time_s)
        assert pt.energy.dynamic_j == pytest.approx(n * one.energy.dynamic_j)  # n replicas' work
        # replicated tensor sharding (on by default): each replica streams 1/n of the optimizer
        # state, work one IPU does alone, so the speedup passes n and the point names why
        assert pt.speedup > n and "replicated tensor sharding" in pt.superlinear
    assert any("places the replicas itself" in note for note in four.notes)
    # without the sharding every replica streams the whole state: below linear by the reduce
    plain = scale(graph, ipu, [1, 2], "dp", ProfileOptions(replicated_tensor_sharding=False)).points[1]
    assert plain.speedup < 2 and plain.superlinear is None


def test_ipu_data_parallel_serving_scales_linearly_and_refuses_its_own_replicas():
    graph, ipu = decoder(layers=2, hidden=64, batch=2), load_target("ipu")
    four = scale(graph, ipu, [1, 4], "dp", ProfileOptions()).points[1]
    assert four.comm_time_s == 0 and four.speedup == pytest.approx(4)  # no gradients to reduce
    with pytest.raises(UserError, match=r"--replicas 2 with --strategy dp: .* drop --replicas"):
        scale(graph, ipu, [1, 2], "dp", ProfileOptions(replicas=2))


def test_ipu_replicas_reduce_on_ipu_links_inside_a_pod64_and_through_the_gateway_past_it():
    """The IPU-Link domain is a Pod64 (bow.toml [topology]: 16 machines of 4 IPUs in a 2D torus; Pod64s
    joined by GW-Links): 64 replicas ring-reduce on the IPU-Links, 128 reduce hierarchically, the
    shard of each IPU crossing the gateway (`hierarchical_allreduce_time`, bandwidth terms only)."""
    from dabench_ir.lowering.collectives import LinkFigures, hierarchical_allreduce_time

    graph, ipu = _ipu_trained(), load_target("ipu")
    grads = sum(v.type.nbytes() for v in graph.weights())
    intra, inter = ipu.topology.intra.bandwidth_bytes_per_s, ipu.topology.inter.bandwidth_bytes_per_s
    assert ipu.topology.per_node == 64
    pod, two_pods = scale(graph, ipu, [64, 128], "dp", ProfileOptions()).points
    assert pod.comm_time_s == pytest.approx(ring_allreduce_time(grads, 64, intra))
    assert pod.nodes == 1 and not pod.crosses_nodes
    expected = hierarchical_allreduce_time(grads, 128, 64, LinkFigures(intra), LinkFigures(inter))
    assert two_pods.comm_time_s == pytest.approx(expected)
    assert expected > ring_allreduce_time(grads, 128, intra)  # the gateway's 6.25 GB/s an IPU costs more
    assert two_pods.nodes == 2 and two_pods.crosses_nodes


@pytest.mark.parametrize("train", [False, True])
def test_ipu_tensor_parallel_splits_like_popxl_and_reduces_over_the_ipu_links(train):
    """Tensor parallelism on the IPU (Graphcore's popxl GPT-J): each IPU places its share of the
    graph, and each split module's all-reduce is a ring over the IPU-Links, closed form."""
    from dabench_ir.passes.training import TrainingPass

    graph = decoder(layers=2, hidden=64, batch=2)
    if train:
        TrainingPass()(graph)
    ipu = load_target("ipu")
    one, two = scale(graph, ipu, [1, 2], "tp", ProfileOptions()).points
    collectives = split_for_tp(graph, 2)[1]
    link = ipu.link("ipu_link")
    expected = sum(
        c.count * ring_allreduce_time(c.nbytes, 2, link.bandwidth_bytes_per_s, link.latency_s) for c in collectives
    )
    assert len(collectives) == 4 and {c.count for c in collectives} == {2 if train else 1}
    assert two.comm_time_s == pytest.approx(expected)
    assert two.devices == 2 and two.batch == one.batch  # both IPUs work on the same samples
    assert two.compute_time_s < one.time_s  # each IPU runs half of every split module


@pytest.mark.parametrize(("target", "strategy", "supported"), [("rdu", "pp", "dp, tp"), ("wse", "tp", "dp")])
def test_unsupported_strategy_is_refused_by_name(target, strategy, supported):
    with pytest.raises(UserError, match=rf"does not support --strategy {strategy}; it supports: {supported}"):
        scale(decoder(layers=2), load_target(target), [1, 2], strategy)


def test_training_state_counts_against_memory_and_can_flip_fits():
    from dabench_ir.lowering import lower
    from dabench_ir.passes.training import ADAM_MOMENT_BYTES_PER_PARAM, TrainingPass

    infer, train = decoder(layers=2, hidden=64), decoder(layers=2, hidden=64)
    TrainingPass()(train)
    target = load_target("h100")
    a = lower(infer, target, ProfileOptions()).memory_bytes
    b = lower(train, target, ProfileOptions()).memory_bytes
    params = sum(v.type.numel() for v in infer.weights())
    assert sum(b.values()) - sum(a.values()) >= (4 + ADAM_MOMENT_BYTES_PER_PARAM) * params  # fp32 grads + moments
    # with optimizer state in tile SRAM too, a model that fits for inference stops fitting in training
    big_infer, big_train = decoder(layers=8, hidden=1024), decoder(layers=8, hidden=1024)
    TrainingPass()(big_train)
    ipu = load_target("ipu")
    assert lower(big_infer, ipu, ProfileOptions()).fits
    assert not lower(big_train, ipu, ProfileOptions(optimizer_state="onchip")).fits


def test_pp_stage_fit_counts_training_state_like_the_lowerings():
    """One rounding of a stage's training-state share: `training_bytes` (rounded up), as the
    lowerings use; the scaling stage used to floor its own copy of the formula."""
    import copy
    import math

    from dabench_ir.lowering.context import LoweringContext, training_bytes, weight_bytes
    from dabench_ir.passes.training import TrainingPass
    from dabench_ir.targets import Target

    graph = decoder(layers=3, hidden=64)
    TrainingPass()(graph)
    raw = copy.deepcopy(load_target("h100").raw)
    raw["memory"][0]["capacity_bytes"]["value"] = 1000.0  # every stage overflows: the first is reported
    tiny = Target.from_dict(raw, origin="tiny-h100.toml")
    point = scale(graph, tiny, [3], "pp", ProfileOptions(batch=1)).points[0]
    assert not point.fits
    ctx = LoweringContext.build(graph)
    stage = [n for n in graph.nodes if n.layer in point.stages[0]]
    train = meta.training_state(graph)
    share = weight_bytes(ctx, stage) / weight_bytes(ctx)
    kinds = ("gradient_bytes", "master_weight_bytes", "optimizer_state_bytes", "saved_activation_bytes")
    exact = [getattr(train, k) * share for k in kinds]
    assert training_bytes(ctx, stage) == sum(math.ceil(e) for e in exact) > sum(math.floor(e) for e in exact)
    live = live_bytes(
        ctx, stage, live_skip(ctx), micro_batches=1
    )  # the micro-batch's working set, as a one-chip run counts it
    assert live > 0 and point.failure["needed_bytes"] == weight_bytes(ctx, stage) + training_bytes(ctx, stage) + live


def test_an_inference_stage_holds_its_micro_batchs_working_set_as_one_chip_holds_its_batchs():
    """A pipeline stage's device memory counts the tensors alive while its micro-batch runs (``live``),
    as the one-chip run counts its whole batch's: a stage is never charged its weights alone."""
    from dabench_ir.lowering.context import LoweringContext

    graph = decoder(layers=4, hidden=64, batch=8)
    one, two = scale(graph, load_target("h100"), [1, 2], "pp", ProfileOptions(micro_batches=4)).points
    stage = two.memory_per_device
    assert stage["activations"] == 0 and stage["live"] > 0  # inference: nothing saved, a working set held
    m = two.micro_batches
    ctx = LoweringContext.build(graph)
    first = [n for n in graph.nodes if n.layer in two.stages[0]]
    assert stage["live"] in {
        live_bytes(ctx, nodes, live_skip(ctx), micro_batches=m)
        for nodes in (first, [n for n in graph.nodes if n.layer in two.stages[1]])
    }
    assert two.device_bytes == sum(stage.values()) <= one.device_bytes


def test_tp_crosses_the_node_boundary_through_its_root():
    # SN30-8 nodes hold 8 RDUs: 8 chips stay inside one node, 16 span two; the SN30's TP reduction
    # goes through RDU 0 (targets/sn30.toml [parallel] tp_collective, issue 44)
    graph = decoder(layers=2, hidden=64)
    target = load_target("sn30")
    assert target.topology.per_node == 8
    result = scale(graph, target, [8, 16], "tp", ProfileOptions())
    assert result.devices_per_node == 8
    eight, sixteen = result.points
    assert (eight.nodes, sixteen.nodes) == (1, 2)
    allreduces = [c.nbytes for c in split_for_tp(graph, 16)[1]]
    intra, inter = target.topology.intra, target.topology.inter
    per = root_allreduce_time(
        allreduces[0],
        16,
        8,
        intra,
        inter,
    )
    assert sixteen.comm_time_s == pytest.approx(len(allreduces) * per)
    assert per > ring_allreduce_time(allreduces[0], 8, intra.bandwidth_bytes_per_s, intra.latency_s)
    assert any("crosses the node boundary" in n for n in sixteen.notes)
    assert not any("crosses" in n for n in eight.notes)


def test_scale_table_marks_the_node_boundary():
    from dabench_ir.commands.scale import render_scale

    graph = decoder(layers=2, hidden=64)
    text = render_scale(scale(graph, load_target("h100"), [1, 8, 16], "tp", ProfileOptions()))
    assert "8 per node" in text
    assert "crosses the node boundary" in text
    rows = [line.split() for line in text.splitlines()[2:5]]
    assert [r[:2] for r in rows] == [["1", "1"], ["8", "1"], ["16", "2*"]]


def test_tp_allreduces_one_forward_activation_in_its_dtype_when_training():
    """The all-reduce of a split module moves its output once, in the dtype it is stored in (16-bit
    here, bf16 under mixed precision); the node's training cost sums forward and backward traffic
    and must not size it. Four per layer in training: two forward, two in the backward."""
    from dabench_ir.passes.training import TrainingPass

    graph = decoder(layers=2, hidden=64, seq=16, batch=2)
    TrainingPass()(graph)
    _, collectives = split_for_tp(graph, 2)
    assert [(c.op, c.nbytes, c.count) for c in collectives] == [("all-reduce", 2 * 16 * 64 * 2, 2)] * 4
    target = load_target("sn30")
    intra = target.topology.intra
    one = root_allreduce_time(2 * 16 * 64 * 2, 2, 8, intra, None)
    point = scale(graph, target, [2], "tp", ProfileOptions()).points[0]
    assert point.comm_time_s == pytest.approx(2 * 4 * one)


def test_chips_per_node_spreads_a_tp_run_over_machines():
    """Two RDUs to a node: a 4-chip TP run spans two nodes and its all-reduces cross node_net
    (through RDU 0, the SN30's TP reduction); the default (the target's 8 per node) keeps it inside one node."""
    from dabench_ir.options import ScaleOptions

    graph = decoder(layers=2, hidden=64)
    target = load_target("sn30")
    inside = scale(graph, target, [2, 4], "tp", ScaleOptions())
    spread = scale(graph, target, [2, 4], "tp", ScaleOptions(chips_per_node=2))
    assert (inside.chips_per_node, spread.chips_per_node, spread.devices_per_node) == (8, 2, 8)
    assert [p.nodes for p in inside.points] == [1, 1] and [p.nodes for p in spread.points] == [1, 2]
    assert spread.points[0].comm_time_s == pytest.approx(inside.points[0].comm_time_s)  # two chips: one node
    allreduces = [c.nbytes for c in split_for_tp(graph, 4)[1]]
    intra, inter = target.topology.intra, target.topology.inter
    per = root_allreduce_time(
        allreduces[0],
        4,
        2,
        intra,
        inter,
    )
    assert spread.points[1].comm_time_s == pytest.approx(len(allreduces) * per)
    assert spread.points[1].comm_time_s > inside.points[1].comm_time_s
    assert any("2 nodes of 2" in n for n in spread.points[1].notes)
    assert spread.to_dict()["chips_per_node"] == 2


def test_chips_per_node_moves_pipeline_boundaries_onto_the_network():
    from dabench_ir.options import ScaleOptions

    graph = decoder(layers=4, hidden=64, batch=4)
    target = load_target("h100")
    inside = scale(graph, target, [4], "pp", ScaleOptions(micro_batches=4)).points[0]
    spread = scale(graph, target, [4], "pp", ScaleOptions(micro_batches=4, chips_per_node=2)).points[0]
    assert (inside.nodes, spread.nodes) == (1, 2)
    assert spread.comm_time_s > inside.comm_time_s  # the middle boundary goes over infiniband


def test_more_chips_per_node_than_a_node_holds_is_refused():
    from dabench_ir.options import ScaleOptions

    with pytest.raises(UserError, match=r"--chips-per-node 16: a sn30 node holds 8 devices"):
        scale(decoder(layers=2), load_target("sn30"), [1, 2], "tp", ScaleOptions(chips_per_node=16))


def test_tp_keeps_the_host_step_cost_on_every_chip():
    """Tensor parallelism splits the RDU work, not the host's: each chip's step keeps the fixed
    host cost (its runtime still drives its own sections)."""
    from dabench_ir.passes.training import TrainingPass

    graph = decoder(layers=2, hidden=256, seq=64, batch=4)
    TrainingPass()(graph)
    target = load_target("sn30")
    for point in scale(graph, target, [1, 2, 4], "tp", ProfileOptions(opt_level="O3")).points:
        plan = point.chip.plan
        host = target.overhead("host_step_s") + target.overhead("host_per_section_s") * plan.extra["sections"]
        assert plan.step_overheads_s["host"] == pytest.approx(host)
        assert point.time_s > target.overhead("host_step_s")


def test_every_scale_point_is_a_verified_run_and_answers_as_profile_does(tmp_path):
    """`scale` asks each chip count as a run of its own through `execute` (so the physics verifier
    checks it), and each point gives what `profile --chips N --strategy S` gives (issue 43)."""
    pytest.importorskip("torch")
    from dabench_ir import api
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.verify import verify

    path = tmp_path / "m.onnx"
    path.write_bytes(
        export_onnx(
            ModelConfig(family="gpt2", layers=2, hidden=64, heads=2, seq=16, batch=1), weights="none"
        ).SerializeToString()
    )
    result = api.scale(str(path), "h100", strategy="dp", chips=(1, 2, 8), mode="train", zero=1)
    assert [p.chips for p in result.points] == [1, 2, 8]
    for point in result.points[1:]:
        report = api.profile(str(path), "h100", chips=point.chips, strategy="dp", mode="train", zero=1)
        assert report.totals["throughput_samples_per_s"] == pytest.approx(point.throughput_samples_per_s, rel=1e-12)
        assert report.extra["scale"]["points"][-1]["superlinear"] == point.superlinear
        assert verify(report) == []
    # ZeRO-1: each chip updates 1/8 of the weights, work one chip does alone: the mechanism that may take
    # the speedup above 8 is named, and the verifier (speedup_linear) accepts nothing above linear without it
    assert result.points[-1].superlinear.startswith("ZeRO-1 shards the optimizer update")
    assert result.points[0].superlinear is None


@pytest.mark.parametrize(("chips", "per_node", "sharers"), [(8, None, 8), (8, 4, 4), (2, None, 2)])
def test_data_parallel_gpus_that_offload_share_their_hosts_dram(chips, per_node, sharers):
    """ZeRO-Offload without ZeRO sharding: every GPU of a node runs the whole CPU Adam at once, each
    through its share of the host's DRAM (the node's GPUs that the run uses: --chips-per-node)."""
    from dabench_ir.options import ScaleOptions
    from dabench_ir.passes.training import TrainingPass, is_optimizer_step

    graph = decoder(layers=2, hidden=256, batch=4)
    TrainingPass()(graph)
    adam = next(n.name for n in graph.nodes if is_optimizer_step(n))
    opts = ScaleOptions(optimizer_state="offchip", chips_per_node=per_node)
    one, many = scale(graph, load_target("h100"), [1, chips], "dp", opts).points
    assert many.chip.timeline.busy(adam) == pytest.approx(sharers * one.chip.timeline.busy(adam))


@pytest.mark.parametrize(("strategy", "whose"), [("dp", "one device's"), ("pp", "stage 0 (layers 0-0)'s")])
def test_offloaded_state_beyond_a_gpus_share_of_its_host_has_no_throughput(tmp_path, strategy, whose):
    """The one host-memory check (`lowering.gpu.host_shortfall`) refuses a data-parallel point and a
    pipeline stage whose offloaded optimizer state outgrows their GPU's share of the host, in the words
    the lowering uses for one GPU."""
    from importlib import resources

    from dabench_ir.options import ScaleOptions
    from dabench_ir.passes.training import TrainingPass

    toml = (resources.files("dabench_ir.targets") / "h100.toml").read_text()
    small = toml.replace(
        'capacity_bytes = { value = 2e12, source = "the host', 'capacity_bytes = { value = 2e6, source = "the host'
    )
    assert small != toml
    path = tmp_path / "h100-small-host.toml"
    path.write_text(small)
    graph = decoder(layers=2, hidden=256, batch=4)
    TrainingPass()(graph)
    opts = ScaleOptions(optimizer_state="offchip", micro_batches=2 if strategy == "pp" else None)
    point = scale(graph, load_target(str(path)), [1, 2], strategy, opts).points[1]
    assert not point.fits and point.throughput_samples_per_s is None
    reason = point.failure["reason"]
    assert reason.startswith(f"{whose} offloaded optimizer state needs") and "(2 GPU(s) sharing its host)" in reason
    assert point.failure["capacity_bytes"] == 1_000_000  # 2 MB shared by the two GPUs


@pytest.fixture(scope="module")
def headed():
    """A tiny Llama with its own (untied) LM head, exported weight-free, costed for serving and for training."""
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import prepare_graph

    cfg = ModelConfig(family="llama", layers=2, hidden=64, heads=4, kv_heads=4, seq=8, batch=2, vocab=96, dtype="fp16")
    proto = export_onnx(cfg, weights="none")
    return cfg, prepare_graph(proto, ProfileOptions()), prepare_graph(proto, ProfileOptions(mode="train"))


def _head_cost(graph):
    from dabench_ir.passes.training import lm_logits

    node = graph.node(graph.values[lm_logits(graph)].producer)
    return meta.get_cost(node)


@pytest.mark.parametrize("chips", [2, 4])
def test_tp_splits_the_lm_head_over_the_vocabulary(headed, chips):
    """Megatron's column-parallel output layer (TensorRT-LLM's lm_head, vLLM's ParallelLMHead): each chip
    computes its 1/n of the vocabulary's logits from the whole hidden state, reading 1/n of the head's
    weight; serving then all-gathers the logits. Kept whole (until session 62), the head cost every chip
    the whole 2·tokens·hidden·vocab: a Llama 3 8B head (128,256 x 4,096) is over a third of the weights
    a TP 8 chip reads a decode step."""
    cfg, serve, _ = headed
    tokens = cfg.batch * cfg.seq
    whole = _head_cost(serve)
    assert whole.contraction_flops == 2 * tokens * cfg.hidden * cfg.vocab  # closed form
    share, collectives = split_for_tp(serve, chips)
    part = _head_cost(share)
    assert part.contraction_flops == 2 * tokens * cfg.hidden * cfg.vocab // chips
    assert part.weight_bytes == cfg.hidden * cfg.vocab * 2 // chips
    assert part.act_bytes_in == whole.act_bytes_in  # the whole hidden state, on every chip
    assert part.act_bytes_out == whole.act_bytes_out // chips  # its slice of the logits
    # every contraction of the model is split: a chip does 1/n of them all
    assert _contraction(share) == _contraction(serve) // chips
    head = [c for c in collectives if c.module == LM_HEAD]
    assert [(c.op, c.nbytes, c.count) for c in head] == [("all-gather", tokens * cfg.vocab * 2, 1)]
    # the step's collectives against closed forms: a ring all-reduce per split module, and the all-gather
    # half of one: (n-1)/n of the logits and n-1 hops on NVLink
    h100 = load_target("h100")
    link = h100.topology.intra
    bw, lat = link.bandwidth_bytes_per_s, link.latency_s
    modules = [c.nbytes for c in collectives if c.module != LM_HEAD]
    assert len(modules) == 2 * cfg.layers
    expected = sum(ring_allreduce_time(b, chips, bw, lat) for b in modules)
    expected += (chips - 1) / chips * tokens * cfg.vocab * 2 / bw + (chips - 1) * lat
    point = scale(serve, h100, [chips], "tp", ProfileOptions()).points[0]
    assert point.comm_time_s == pytest.approx(expected)
    assert any("LM head split over the vocabulary" in n for n in point.notes)
    from dabench_ir.commands.scale import render_scale

    text = render_scale(scale(serve, h100, [1, chips], "tp", ProfileOptions()))
    assert "  note: LM head split over the vocabulary: its logits all-gathered" in text.splitlines()


def test_tp_training_splits_the_loss_with_the_lm_head(headed):
    """In training the loss reads each chip's slice of the logits (Megatron's vocabulary-parallel
    cross-entropy): three all-reduces of one fp32 a token forward, and backward one of the head's input
    gradient, the hidden state each chip read whole."""
    from dabench_ir.passes.training import is_loss

    cfg, _, train = headed
    tokens = cfg.batch * cfg.seq
    share, collectives = split_for_tp(train, 2)
    loss = next(n for n in train.nodes if is_loss(n))
    assert meta.get_cost(share.node(loss.name)).flops == -(-meta.get_cost(loss).flops // 2)
    head = [(c.op, c.nbytes, c.count) for c in collectives if c.module == LM_HEAD]
    assert head == [("all-reduce", 4 * tokens, 3), ("all-reduce", tokens * cfg.hidden * 2, 1)]
    blocks = [c for c in collectives if c.module not in (LM_HEAD, EMBEDDING)]
    assert len(blocks) == 2 * cfg.layers and all(c.count == 2 for c in blocks)  # forward and backward


@pytest.mark.parametrize("chips", [2, 4])
def test_tp_training_splits_the_token_embedding_over_the_vocabulary(headed, chips):
    """Megatron-LM's VocabParallelEmbedding: in training each chip holds 1/n of the token table, and so
    1/n of its gradient, master copy and Adam moments; its lookups are summed by one all-reduce of the
    embedding's output a step, forward only (token ids have no gradient). Serving keeps the table whole
    on every chip (TensorRT-LLM's default) and runs no such all-reduce."""
    from dabench_ir.passes.training import token_table

    cfg, serve, train = headed
    tokens = cfg.batch * cfg.seq
    table, vocab = token_table(train)
    assert vocab == cfg.vocab
    share, collectives = split_for_tp(train, chips)
    assert share.type_of(table).nbytes() == train.type_of(table).nbytes() // chips
    embed = [(c.op, c.nbytes, c.count) for c in collectives if c.module == EMBEDDING]
    assert embed == [("all-reduce", tokens * cfg.hidden * 2, 1)]
    # a chip keeps 1/n of every parameter but the norms' (RMSNorm weights, replicated): the table's too, and
    # its training state follows the parameters it keeps
    norms = sum(v.type.shape[0] for v in train.weights() if len(v.type.shape) == 1)
    part = meta.training_state(share)
    assert part.params == (train.num_params - norms) // chips + norms
    whole = meta.training_state(train).optimizer_state_bytes
    assert part.optimizer_state_bytes == pytest.approx(whole * part.params / train.num_params, abs=1)
    serve_share, serve_collectives = split_for_tp(serve, chips)
    assert serve_share.type_of(table).nbytes() == serve.type_of(table).nbytes()
    assert not any(c.module == EMBEDDING for c in serve_collectives)


def test_ipu_pipeline_spread_over_nodes_is_refused_with_the_fix():
    from dabench_ir.options import ScaleOptions

    with pytest.raises(
        UserError,
        match=r"--chips-per-node 4: the ipu lowering places its own pipeline inside one node of 64.*drop --chips-per-node",
    ):
        scale(decoder(layers=4, hidden=64, batch=4), load_target("ipu"), [1, 8], "pp", ScaleOptions(chips_per_node=4))


@pytest.mark.parametrize("strategy", ["tp", "pp", "dp"])
def test_scale_places_the_one_chip_baseline_once_and_each_point_as_its_own_run_gives_it(strategy, monkeypatch):
    """``scale`` over 1, 2 and 4 chips places the one-chip baseline once, not once a point: each
    point equals the scaling record of its own ``profile --chips N`` run, and the placements are
    those runs' less the two baselines the later points take from the first."""
    from dabench_ir import api, scaling

    placements: list[int] = []
    run_one = scaling._run_one
    monkeypatch.setattr(scaling, "_run_one", lambda graph, run: placements.append(1) or run_one(graph, run))
    kw = (
        {"batch": 4, "micro_batches": 4, "dims": {"seq": 64}} if strategy == "pp" else {"batch": 4, "dims": {"seq": 64}}
    )
    own = [api.profile("gpt2-small", "h100", chips=n, strategy=strategy, **kw) for n in (1, 2, 4)]
    apart = len(placements)
    placements.clear()
    result = api.scale("gpt2-small", "h100", strategy=strategy, chips=(1, 2, 4), **kw)
    assert len(placements) == apart - 2
    assert [p.to_dict() for p in result.points] == [r.extra["scale"]["points"][-1] for r in own]


def test_a_stage_walks_its_nodes_in_graph_order():
    """The first stage holds the embedding beside its blocks and the last the head, as the stages'
    times split them (the head was on the first stage with the embedding: Llama 7B's first stage
    held both, 0.52 GB, its last neither): walked in graph order, the embedding's output is made
    before the blocks read it (out of order, its liveness, and the stage's `live` memory with it,
    came out too small)."""
    from dabench_ir.pipeline import load_graph
    from dabench_ir.scaling import _pp_stage_nodes

    graph = load_graph("gpt2-small")
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    first, second = _pp_stage_nodes(graph, [list(range(6)), list(range(6, 12))])
    first_block = min(order[n.name] for n in graph.nodes if n.layer is not None)
    last_block = max(order[n.name] for n in graph.nodes if n.layer is not None)
    outside = [n for n in first if n.layer is None]
    assert outside and all(order[n.name] < first_block for n in outside)
    head = [n for n in second if n.layer is None]
    assert head and all(order[n.name] > last_block for n in head)
    assert any(n.op_type in ("MatMul", "Gemm") for n in head)  # the LM head
    for nodes in (first, second):
        positions = [order[n.name] for n in nodes]
        assert positions == sorted(positions)


def test_a_run_one_chip_cannot_hold_has_no_speedup_over_it():
    """A configuration that does not fit has no throughput, so no rate for the others to be a multiple
    of: with HBM too small for the one-chip run but not for each chip's half under tensor parallelism,
    the 2-chip point fits and has its throughput, and no speedup or scaling efficiency; with the real
    HBM the same point has both."""
    graph = decoder(layers=2, hidden=1024, batch=4)
    h100 = load_target("h100")
    assert h100.memories[0].name == "hbm"
    full = scale(graph.clone(), h100, [1, 2], "tp", ProfileOptions())
    one = full.points[0].memory_per_device["hbm"]
    assert full.points[1].speedup > 0 and full.points[1].memory_per_device["hbm"] < 0.7 * one
    small = h100.with_changes({"memory[0].capacity_bytes": 0.8 * one})
    first, second = scale(graph, small, [1, 2], "tp", ProfileOptions()).points
    assert not first.fits and first.throughput_samples_per_s is None
    assert second.fits and second.throughput_samples_per_s == pytest.approx(full.points[1].throughput_samples_per_s)
    assert second.speedup is None and second.scaling_efficiency is None
    assert any("no speedup: one chip does not hold the run" in note for note in second.notes)


def test_a_weight_bound_pp_step_reads_each_stages_weights_once_a_micro_batch():
    """A pipeline stage runs its micro-batches one after another, each streaming the stage's weights:
    on a weight-bound step (8 sequences of one token each) no stage is busy less than its micro-
    batches times its weights over the HBM's peak, and the step not less than the busiest stage.
    Dividing the whole batch's one-chip time by the micro-batches made the step over 2 H100s shorter
    than reading the weights once (a decode token at half of one chip's time)."""
    from dabench_ir.lowering.context import LoweringContext, weight_bytes

    graph = decoder(layers=4, hidden=1024, seq=1, batch=8)
    h100 = load_target("h100")
    one, two = scale(graph.clone(), h100, [1, 2], "pp", ProfileOptions()).points
    m = two.micro_batches
    assert m == 2  # inference: as many as the stages, the batch shared among them
    ctx = LoweringContext.build(graph)
    peak = h100.feed_memory.bandwidth_bytes_per_s
    for stage, busy in zip(two.stages, two.stage_times_s, strict=True):
        held = weight_bytes(ctx, [n for n in graph.nodes if n.layer in stage])
        assert busy >= m * held / peak
    assert two.time_s >= max(two.stage_times_s) > one.time_s / 2


def test_a_pp_reports_one_chip_as_its_busiest_stage_not_the_whole_graph():
    """Under pp the placement behind the node rows is the whole graph on one chip: its work is no one
    chip's (it read 1.06 PFLOP/s for one H100), and its time beside the pipelined step made the
    time no node owns negative. A chip is now its busiest stage: its busy time, no work of its own;
    what the step takes beyond it (fill and drain, update, boundaries) are rows of the step, and the
    time no node owns is every overhead row's, the whole graph's own beside them (as its node rows
    are the whole graph's): it had been the step's alone, under the rows' sum."""
    from dabench_ir.pipeline import profile_graph

    report = profile_graph(decoder(layers=4, hidden=256, batch=8), "h100", {"chips": 4, "strategy": "pp"})
    point = report.scaling.points[-1]
    per_chip = report.extra["per_chip"]
    assert per_chip["time_s"] == max(point.stage_times_s) and per_chip["flops"] is None
    beyond = report.totals["time_s"] - max(point.stage_times_s)
    assert sum(point.overheads_s.values()) == pytest.approx(beyond) and beyond > 0
    rows = report.to_dict()["overheads"]
    assert report.totals["overhead_s"] == pytest.approx(sum(rows.values()))
    assert report.totals["overhead_s"] == pytest.approx(sum(point.chip.timeline.overheads_s.values()) + beyond)
    # the node rows are the stages' (the whole graph running the micro-batches in turn, as the stages'
    # times are worked out): a stage's rows are its time, but for its share of the host's issue wait
    from dabench_ir.lowering.gpu import HOST_ISSUE

    graph, time_of = report.graph, {n.name: n.time_s or 0.0 for n in report.nodes}
    first = next(i for i, n in enumerate(graph.nodes) if n.layer is not None)
    stage_rows = [0.0] * len(point.stages)
    for i, node in enumerate(graph.nodes):
        k = next((k for k, st in enumerate(point.stages) if node.layer in st), None)
        stage_rows[0 if k is None and i < first else -1 if k is None else k] += time_of.get(node.name, 0.0)
    wait = point.chip.plan.step_overheads_s.get(HOST_ISSUE, 0.0)
    scale = 1 + wait / sum(stage_rows)
    assert point.stage_times_s == pytest.approx([r * scale for r in stage_rows], rel=1e-9)


def test_the_verifier_refuses_a_pipeline_stage_shorter_than_reading_its_weights_a_micro_batch():
    """`verify.stage_weight_reads`: a pipeline whose chips read their weights every step (a GPU) has
    its busiest stage busy at least the micro-batches x the most weights a stage holds over HBM's
    bandwidth. The stages' times as the scaling stage worked them out before session 73 (the whole
    batch's once, each micro-batch a share of it) break it; the times it works out now do not."""
    from dataclasses import replace

    from dabench_ir.verify import PhysicsError, check_scaled

    graph = decoder(layers=4, hidden=4096, seq=1, batch=8)  # 0.8 GB of weights a stage: weight-bound
    result = scale(graph, load_target("h100"), [1, 2], "pp", ProfileOptions())
    check_scaled(result)  # as worked out now: physical
    point = result.points[-1]
    m = point.micro_batches
    as_before = replace(point, stage_times_s=[t / m for t in point.stage_times_s])
    with pytest.raises(PhysicsError, match="stage_weight_reads at 2 chips"):
        check_scaled(replace(result, points=[result.points[0], as_before]))


@pytest.mark.slow
def test_tp_holds_a_stored_constant_whole_on_every_chip():
    """A static export's causal mask [S, S] and rotary tables are constants every head reads whole: tp
    split them like weight matrices, so a prompt of 511 tokens over 2 chips was refused ("does not
    split 2 ways") and an even one had the mask's bytes halved."""
    from dabench_ir.ir import ValueKind
    from dabench_ir.lowering.context import stored_root
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import prepare_graph

    proto = export_onnx(ModelConfig(family="llama", layers=1, hidden=64, heads=4, kv_heads=2, seq=5), weights="none")
    graph = prepare_graph(proto, ProfileOptions())
    stored = [v for v in graph.values.values() if v.kind.is_stored and v.type.shape]
    kind = {v.name: graph.values[stored_root(graph, v.name)].kind for v in stored}  # a folded weight layout: a weight
    constants = {v.name: v.type.shape for v in stored if kind[v.name] is ValueKind.CONSTANT}
    layouts = {v.name: v.type.shape for v in stored if kind[v.name] is ValueKind.WEIGHT and v.producer}
    assert any(shape[-2:] == (5, 5) for shape in constants.values()) and layouts  # the mask; W^T
    share, _ = split_for_tp(graph, 2)
    assert {name: share.values[name].type.shape for name in constants} == constants
    assert any(share.values[name].type.shape != shape for name, shape in layouts.items())  # weights still split
