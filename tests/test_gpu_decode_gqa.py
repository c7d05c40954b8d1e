"""What a GPU decode step reads under grouped-query attention, node by node (issue 44).

A decode step streams every weight once (the token embedding by the rows it gathers, the LM head
whole) and the KV cache once per K/V head: that is what HBM delivers. The serving engines' decode
attention kernels (TensorRT-LLM's masked multi-head attention, vLLM's paged attention) run one thread
block per (sequence, query head), and each loads the K/V of its head's group, so the cache is loaded
once per *query* head, at the rate such a kernel loads (`lowering.gpu.cache_rereads`,
``arch.decode_attention_load_bytes_per_s``: on the A100 its L2's measured bandwidth). The tiny model's expectations below are closed forms of its shapes; the catalogue's decode
points are held to bands the mechanism states (HBM once, and every load from HBM), not to their errors.
"""

from __future__ import annotations

import dataclasses

import pytest

from dabench_ir.models import ModelConfig
from dabench_ir.options import ProfileOptions

BATCH, HIDDEN, HEADS, HEAD_DIM, CONTEXT, FFN, VOCAB = 3, 256, 8, 32, 40, 512, 1000
FP16 = 2
CACHE_PER_KV_HEAD = BATCH * HEAD_DIM * CONTEXT * FP16  # one K (or V) head of the cache, every sequence


def _model(kv_heads: int, *, phase: str = "decode", batch: int = BATCH):
    """The tiny Llama's weight-free export: a decode step over CONTEXT cached tokens, or a prefill of them."""
    from dabench_ir.models.export import export_onnx

    cfg = ModelConfig(
        family="llama",
        layers=1,
        hidden=HIDDEN,
        heads=HEADS,
        kv_heads=kv_heads,
        ffn=FFN,
        vocab=VOCAB,
        positional="rope",
        seq=1 if phase == "decode" else CONTEXT,
        batch=batch,
        dtype="fp16",
        phase=phase,
        context=CONTEXT if phase == "decode" else 0,
    )
    return export_onnx(cfg, weights="none")


def _decode(kv_heads: int, *, phase: str = "decode"):
    from dabench_ir.pipeline import prepare_graph

    return prepare_graph(_model(kv_heads, phase=phase), ProfileOptions(precision="fp16"))


@pytest.fixture(scope="module")
def graphs():
    return {kv: _decode(kv) for kv in (8, 2, 1)}  # multi-head, GQA (4 query heads a group), multi-query


def _ctx(graph):
    from dabench_ir.lowering.context import LoweringContext

    return LoweringContext.build(graph)


def _reader(graph, weight: str):
    """The node that reads initializer ``weight``, through the Transpose view a linear layer adds."""
    node = graph.consumers[weight][0]
    return graph.consumers[node.outputs[0]][0] if node.op_type == "Transpose" else node


def _cache_readers(graph):
    from dabench_ir.passes.precision import kv_cache_values

    caches = set(kv_cache_values(graph)) & set(graph.inputs)
    return {cache: next(n for n in graph.nodes if cache in n.inputs) for cache in sorted(caches)}


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_a_decode_step_reads_each_weight_once_and_the_cache_at_kv_heads(graphs, kv_heads):
    from dabench_ir.passes import meta

    graph = graphs[kv_heads]
    kv_dim = kv_heads * HEAD_DIM
    weights = {
        "layers.0.attn.q_proj.weight": HIDDEN * HIDDEN,
        "layers.0.attn.k_proj.weight": HIDDEN * kv_dim,
        "layers.0.attn.v_proj.weight": HIDDEN * kv_dim,
        "layers.0.attn.o_proj.weight": HIDDEN * HIDDEN,
        "layers.0.mlp.gate_proj.weight": HIDDEN * FFN,
        "layers.0.mlp.up_proj.weight": HIDDEN * FFN,
        "layers.0.mlp.down_proj.weight": FFN * HIDDEN,
        "lm_head.weight": VOCAB * HIDDEN,  # the LM head whole, every step
        "embed.weight": BATCH * HIDDEN,  # the embedding only by the rows it gathers, one a sequence
    }
    for name, elements in weights.items():
        assert meta.get_cost(_reader(graph, name)).weight_bytes == elements * FP16, name
    readers = _cache_readers(graph)
    assert [n.op_type for n in readers.values()] == ["MatMul", "MatMul"]  # read where it lies: no copy, no Expand
    for cache, node in readers.items():
        # the query heads of a group are the rows of one matmul against the group's cached head
        q_rows = BATCH * HEADS * (HEAD_DIM if cache.endswith("k_cache") else CONTEXT) * FP16
        out = BATCH * HEADS * (CONTEXT if cache.endswith("k_cache") else HEAD_DIM) * FP16
        assert meta.get_cost(node).bytes == q_rows + kv_heads * CACHE_PER_KV_HEAD + out, cache


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_a_decode_kernel_loads_the_cache_once_per_query_head(graphs, kv_heads):
    """HBM carries the cache once per K/V head; the kernel loads it once per query head, the
    ``heads / kv_heads - 1`` repeats from L2. Its loads are multi-head attention's, whatever kv_heads."""
    from dabench_ir.lowering.gpu import cache_rereads

    graph = graphs[kv_heads]
    rereads = cache_rereads(_ctx(graph))
    readers = _cache_readers(graph)
    if kv_heads == HEADS:
        assert rereads == {}
        return
    assert rereads == {node.name: (HEADS - kv_heads) * CACHE_PER_KV_HEAD for node in readers.values()}
    for node in readers.values():
        assert kv_heads * CACHE_PER_KV_HEAD + rereads[node.name] == HEADS * CACHE_PER_KV_HEAD


def test_a_prefill_rereads_nothing():
    from dabench_ir.lowering.gpu import cache_rereads

    assert cache_rereads(_ctx(_decode(2, phase="prefill"))) == {}


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
@pytest.mark.parametrize("l2", ["measured", "none"])
def test_a_cache_matmul_takes_the_slower_of_hbm_once_and_l2_per_query_head(graphs, kv_heads, l2):
    """A cache matmul's memory time is its bytes at the sustained HBM rate, or all it loads (the cache
    once per query head) at the L2 rate when that is longer; a target without an L2 figure reads HBM once."""
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.gpu import GpuLowering, cache_rereads
    from dabench_ir.passes import meta
    from dabench_ir.targets import load_target

    target = load_target("a100")
    if l2 == "none":
        target = target.with_changes({"arch.decode_attention_load_bytes_per_s": 0})
    graph = graphs[kv_heads]
    plan = lower(graph, target, GpuLowering.options(ProfileOptions(precision="fp16")))
    hbm = target.feed_memory.bandwidth_bytes_per_s * target.arch_value("memory_efficiency")
    rate = target.arch_value("decode_attention_load_bytes_per_s")
    rereads = cache_rereads(_ctx(graph))
    for node in _cache_readers(graph).values():
        nbytes = meta.get_cost(node).bytes
        np_ = plan.node_plans[node.name]
        once = nbytes / hbm
        if rate > 0 and kv_heads < HEADS:
            per_head = (nbytes + rereads[node.name]) / rate
            assert np_.memory_s == pytest.approx(max(once, per_head), rel=1e-12)
            assert ("load-bound" in np_.note) == (per_head > once)
        else:
            assert np_.memory_s == pytest.approx(once, rel=1e-12)
            assert "load-bound" not in np_.note


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_a_kernel_per_kv_head_loads_a_grouped_cache_once(graphs, kv_heads):
    """``--decode-attention per-kv-head`` (TensorRT-LLM's XQA: a thread block per K/V head serves its
    query heads): the cache matmul's memory time is its bytes once at the sustained HBM rate, the L2
    repeats gone; every other node is placed as by the kernel per query head."""
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.gpu import GpuLowering
    from dabench_ir.passes import meta
    from dabench_ir.targets import load_target

    target = load_target("a100")
    graph = graphs[kv_heads]
    hbm = target.feed_memory.bandwidth_bytes_per_s * target.arch_value("memory_efficiency")
    plans = {
        kernel: lower(graph, target, GpuLowering.options(ProfileOptions(precision="fp16", decode_attention=kernel)))
        for kernel in ("per-query-head", "per-kv-head")
    }
    readers = {node.name for node in _cache_readers(graph).values()}
    for name, grouped in plans["per-kv-head"].node_plans.items():
        per_head = plans["per-query-head"].node_plans[name]
        if name in readers:
            assert grouped.memory_s == pytest.approx(meta.get_cost(graph.node(name)).bytes / hbm, rel=1e-12)
            assert grouped.memory_s < per_head.memory_s  # 4 and 8 query heads a group: past the L2 / HBM ratio
            assert "load-bound" not in grouped.note
        else:
            assert grouped.per_micro_batch_s == per_head.per_micro_batch_s


@pytest.mark.parametrize(("batch", "xqa"), [(13, False), (14, True)])
def test_xqa_auto_takes_the_kernel_per_kv_head_where_tensorrt_llm_s_heuristic_does(batch, xqa):
    """``--decode-attention xqa-auto``: TensorRT-LLM runs XQA when a step's (sequence, K/V head) blocks
    times 4 reach the SMs (`lowering.gpu.XQA_MIN_BLOCK_FACTOR`). With 2 K/V heads on the A100's 108 SMs
    that is 14 sequences (28 blocks, x 4 = 112), not 13 (26 blocks, x 4 = 104): below it the plan is
    per-query-head's to the node; from there, per-kv-head's."""
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.gpu import GpuLowering
    from dabench_ir.pipeline import prepare_graph
    from dabench_ir.targets import load_target

    target = load_target("a100")
    assert target.num_units == 108
    graph = prepare_graph(_model(2, batch=batch), ProfileOptions(precision="fp16"))
    plans = {
        kernel: lower(graph, target, GpuLowering.options(ProfileOptions(precision="fp16", decode_attention=kernel)))
        for kernel in ("per-query-head", "per-kv-head", "xqa-auto")
    }
    chosen = plans["per-kv-head" if xqa else "per-query-head"]
    assert plans["per-kv-head"].node_plans != plans["per-query-head"].node_plans  # the choice shows
    for name, placed in plans["xqa-auto"].node_plans.items():
        assert placed == chosen.node_plans[name], name


def test_xqa_auto_counts_the_k_v_heads_of_one_chip_of_a_tensor_parallel_run():
    """Over 2 chips each holds 1 of the 2 K/V heads: 14 sequences are 14 blocks a chip (56 < 108 SMs),
    so the engine stays per query head where one chip of the whole model (28 blocks) takes XQA; and
    so it does on one chip running the 14 sequences as 2 micro-batches (14 blocks a launch)."""
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.gpu import xqa_takes
    from dabench_ir.pipeline import prepare_graph
    from dabench_ir.scaling import split_for_tp
    from dabench_ir.targets import load_target

    target = load_target("a100")
    whole = prepare_graph(_model(2, batch=14), ProfileOptions(precision="fp16"))
    share, _ = split_for_tp(whole, 2)
    for graph, xqa in ((whole, True), (share, False)):
        ctx = LoweringContext.build(graph)
        assert [xqa_takes(ctx, n.name, target) for n in _cache_readers(graph).values()] == [xqa, xqa]
    # one launch runs a micro-batch's sequences: 14 in 2 micro-batches are 14 blocks a launch
    ctx = LoweringContext.build(whole)
    assert not any(xqa_takes(ctx, n.name, target, 2) for n in _cache_readers(whole).values())


@pytest.mark.parametrize(
    ("target", "kv_heads", "phase", "why"),
    [
        ("a100", 8, "decode", "no decode attention over a grouped-query KV cache"),  # multi-head: nothing grouped
        ("a100", 2, "prefill", "no decode attention over a grouped-query KV cache"),
        ("sn30", 2, "decode", "applies to gpu targets, not sn30"),
    ],
)
@pytest.mark.parametrize("kernel", ["per-kv-head", "xqa-auto"])
def test_a_kernel_per_kv_head_is_refused_where_nothing_reads_a_grouped_cache(target, kv_heads, phase, why, kernel):
    """``xqa-auto`` had been accepted on a prefill and a multi-head model, choosing nothing."""
    from dabench_ir import api
    from dabench_ir.errors import UserError

    with pytest.raises(UserError, match=why):
        api.profile(_model(kv_heads, phase=phase), target, precision="fp16", decode_attention=kernel)


def test_l2_binds_a_gqa_cache_read_exactly_when_its_query_heads_outrun_the_l2_hbm_ratio():
    """On the A100 the L2 serves 5.41 TB/s against a sustained 1.78 TB/s from HBM: a group of more
    than 3.05 query heads per K/V head makes the cache read L2-bound (its matmul's other bytes aside)."""
    from dabench_ir.targets import load_target

    a100 = load_target("a100")
    ratio = a100.arch_value("decode_attention_load_bytes_per_s") / (
        a100.feed_memory.bandwidth_bytes_per_s * a100.arch_value("memory_efficiency")
    )
    assert 3 < ratio < 4  # 4 query heads a group (Llama-3-8B, Mistral-7B) are past it; 2 are not


# -- the catalogue's decode points -----------------------------------------------------------------------

_GQA_DECODE = {
    "a100": ("a100-trtllm090-mistral-7b-b120-128-2048", "a100-trtllm090-mistral-7b-b56-2048-2048"),
    "h200": ("h200-trtllm090-mistral-7b-b120-128-2048", "h200-trtllm090-mistral-7b-b56-2048-2048"),
}
"""GQA points whose time is mostly decode steps (2048 of them against one prefill): the bounds below
hold the steps, and a prefill error moves them little. Both targets' points are out of sample: the
A100's rate is its L2's, the H200's the H100's fit (targets/h100.toml), neither fitted to them."""


def _with_rate(tmp_path, name: str, value: float, tag: str):
    from dabench_ir.targets import load_target

    path = tmp_path / f"{name}-{tag}.toml"
    path.write_text(load_target(name).with_changes({"arch.decode_attention_load_bytes_per_s": value}).toml())
    return str(path)


def _predicted(points, target: str | None = None) -> dict[str, float]:
    from dabench_ir import validate

    runs = [dataclasses.replace(p, target=target) if target else p for p in points]
    result = validate.run_validation(runs)
    return {r.point.id: r.quantities[0].predicted for r in result.results}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(_GQA_DECODE))
def test_catalogue_decode_points_sit_inside_the_bounds_the_mechanism_states(tmp_path, name):
    """Multi-head points: the per-query-head loads are the HBM loads, so the load rate changes nothing.
    GQA points decode-bound: the measured time lies between the cache read once from HBM (no load
    rate, the lower bound) and every query head's load from HBM (the rate at the sustained HBM rate,
    the upper bound), and the prediction at the file's rate lies between the two."""
    pytest.importorskip("torch")
    from dabench_ir import validate
    from dabench_ir.targets import load_target

    decode = [p for p in validate.load_catalog() if p.kind == "generate" and p.target == name]
    mha = [p for p in decode if p.model.get("kv_heads", p.model["heads"]) == p.model["heads"]]
    gqa = [p for p in decode if p.id in _GQA_DECODE[name]]
    assert len(gqa) == len(_GQA_DECODE[name]) and len(mha) >= 4
    target = load_target(name)
    hbm = target.feed_memory.bandwidth_bytes_per_s * target.arch_value("memory_efficiency")
    once, every = _with_rate(tmp_path, name, 0, "hbm-once"), _with_rate(tmp_path, name, hbm, "hbm-every-head")
    fits = [p for p in mha if p.id != "a100-trtllm061-llama2-7b-b60-128-2048"]  # the tool says it does not fit
    assert _predicted(fits) == _predicted(fits, once)
    low, mid, high = _predicted(gqa, once), _predicted(gqa), _predicted(gqa, every)
    for p in gqa:
        measured = p.measured["latency_s"]
        print(
            f"{p.id}: measured {measured:.2f} s; HBM once {low[p.id]:.2f} ({low[p.id] / measured - 1:+.1%}), "
            f"at the load rate {mid[p.id]:.2f} ({mid[p.id] / measured - 1:+.1%}), "
            f"HBM per query head {high[p.id]:.2f} ({high[p.id] / measured - 1:+.1%})"
        )
        assert low[p.id] < measured < high[p.id]
        assert low[p.id] < mid[p.id] < high[p.id]


def test_the_fitted_load_rate_lies_between_hbm_and_the_l2():
    """The H100's fitted load rate (targets/h100.toml) is a rate of loads the L2 can serve: above the
    sustained HBM rate (the repeats do not all come from HBM) and below the 9.77 TB/s the GH100's L2
    serves a benchmark's re-reads (gpu-benches h200.txt); the H200, the same die, carries it."""
    from dabench_ir.targets import load_target

    h100, h200 = load_target("h100"), load_target("h200")
    rate = h100.arch_value("decode_attention_load_bytes_per_s")
    hbm = h100.feed_memory.bandwidth_bytes_per_s * h100.arch_value("memory_efficiency")
    assert hbm < rate < 9.77e12
    assert h200.arch_value("decode_attention_load_bytes_per_s") == rate


@pytest.mark.parametrize("chips", [2, 4])
@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_tensor_parallel_keeps_each_chips_kv_heads_of_the_cache(graphs, kv_heads, chips):
    """Megatron TP splits the K/V heads over the chips with the attention's columns: one chip's cache
    holds ceil(kv_heads / chips) heads, a head copied on each chip that reads it when there are fewer
    heads than chips (TensorRT-LLM's per-rank cache). Before this, every chip held the whole cache,
    and a 70B TP 4 serving run at batch 512 'did not fit' (200 GB a chip)."""
    from dabench_ir.passes.precision import cache_inputs
    from dabench_ir.scaling import split_for_tp

    graph = graphs[kv_heads]
    share, _ = split_for_tp(graph, chips)
    caches = cache_inputs(share)
    assert len(caches) == 2  # K and V of the one layer
    kept = -(-kv_heads // chips)
    for name in caches:
        assert share.type_of(name).shape[1] == kept
        assert share.type_of(name).nbytes() == kept * CACHE_PER_KV_HEAD
        assert graph.type_of(name).shape[1] == kv_heads  # the model itself is left whole


@pytest.mark.parametrize("chips", [2, 4])
@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_a_tensor_parallel_chip_reloads_its_kv_heads_for_its_own_query_heads(graphs, kv_heads, chips):
    """One chip holds HEADS / chips query heads and ceil(kv_heads / chips) K/V heads: each K/V head it
    holds is loaded once per query head of the chip's that reads it, HEADS / (chips x kept) times. With
    fewer K/V heads than chips that is fewer than the model's whole group (HEADS / kv_heads): 8 query
    heads over 1 K/V head on 4 chips load each chip's copy twice, not 8 times."""
    from dabench_ir.lowering.gpu import cache_rereads
    from dabench_ir.scaling import split_for_tp

    share, _ = split_for_tp(graphs[kv_heads], chips)
    kept = -(-kv_heads // chips)
    loads = HEADS / (chips * kept)
    rereads = cache_rereads(_ctx(share))
    readers = _cache_readers(share)
    assert len(readers) == 2
    for cache, node in readers.items():
        assert share.type_of(cache).nbytes() == kept * CACHE_PER_KV_HEAD
        assert rereads.get(node.name, 0) == (loads - 1) * kept * CACHE_PER_KV_HEAD
