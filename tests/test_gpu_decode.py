"""GPU decode and training memory against independent references (issue 44).

- What a decode step reads: the KV cache once per K/V head (grouped-query attention), checked
  exactly against the bytes a real decode kernel reads: onnxruntime PR #21414 (microsoft/onnxruntime,
  "[CUDA] Page Attention", FA2 paged batch decode on an H100 SXM, nvbench): llama3 70B's attention,
  64 sequences x 32 cached tokens, 64 query heads, 8 K/V heads, head size 128, reads 9.000 MiB
  (K and V, 8 MiB, plus Q, 1 MiB) and writes 1.000 MiB (O).
- The fixed host cost of a decode step is its own row (`DECODE_STEP`), never a node's.
- Activations saved for the backward pass without recompute, each memory once: GPT-2 with a fused
  attention against Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models" (MLSys 2023), section 4.1: 34sbh + 5as^2bh bytes per layer at 16 bits, less the two
  dropout masks (sbh each; no dropout here) and the 5as^2b of the scores (a fused kernel keeps none,
  only the softmax's log-sum-exp): 32sbh bytes, i.e. 16 values of s x b x h per layer.
"""

from __future__ import annotations

import pytest

from dabench_ir.models import ModelConfig
from dabench_ir.options import ProfileOptions

MIB = 1 << 20


def _graph(cfg: ModelConfig, **opts):
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import prepare_graph

    return prepare_graph(export_onnx(cfg, weights="none"), ProfileOptions(**opts))


def _ctx(graph):
    from dabench_ir.lowering.context import LoweringContext

    return LoweringContext.build(graph)


@pytest.fixture(scope="module")
def llama70b_attention_decode():
    """One llama3-70B-shaped decode layer at the nvbench configuration of onnxruntime PR #21414."""
    cfg = ModelConfig(
        family="llama",
        layers=1,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn=256,
        seq=1,
        batch=64,
        dtype="bf16",
        phase="decode",
        context=32,
    )
    return _graph(cfg, precision="bf16")


def test_a_gqa_decode_step_reads_the_cache_once_per_kv_head_as_a_decode_kernel_does(llama70b_attention_decode):
    from dabench_ir.passes import meta

    graph = llama70b_attention_decode
    caches = {n for n in graph.inputs if n.endswith(("k_cache", "v_cache"))}
    assert len(caches) == 2
    readers = [n for n in graph.nodes if caches & set(n.inputs)]
    assert [n.op_type for n in readers] == ["MatMul", "MatMul"]  # no Expand, no copy of the cache
    cache_bytes = sum(graph.type_of(v).nbytes() for v in caches)
    assert cache_bytes == 8 * MIB  # 64 x 32 tokens x 8 heads x 128 x 2 (K, V) x 2 bytes
    # the scores against the cache read Q once: nvbench's 9 MiB read = K/V + Q
    qk = readers[0]
    q = next(v for v in qk.inputs if v not in caches)
    assert cache_bytes + graph.type_of(q).nbytes() == 9 * MIB
    # every cached K/V byte is counted as read once, by its MatMul, no more
    for node in readers:
        cost = meta.get_cost(node)
        cache = next(v for v in node.inputs if v in caches)
        others = sum(graph.type_of(v).nbytes() for v in node.inputs if v and v != cache)
        assert cost.act_bytes_in == graph.type_of(cache).nbytes() + others


def test_a_decode_step_pays_the_engine_host_cost_as_its_own_row(llama70b_attention_decode):
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.gpu import DECODE_STEP, GpuLowering
    from dabench_ir.targets import load_target

    for name in ("h100", "a100", "h200"):
        target = load_target(name)
        plan = lower(llama70b_attention_decode, target, GpuLowering.options(ProfileOptions(precision="bf16")))
        figure = target.overheads[DECODE_STEP + "_s"]
        assert figure.estimate  # a sum of sourced parts and an estimate: says so
        assert plan.step_overheads_s[DECODE_STEP] == figure.value == pytest.approx(0.77e-3)
        assert all(DECODE_STEP not in (np_.note or "") for np_ in plan.node_plans.values())


def test_micro_batches_split_a_decode_steps_cache_reads_not_repeat_them(llama70b_attention_decode):
    """Four micro-batches of a GQA decode step each attend over their own sequences: the attention
    matmuls load the cache (and the per-query-head kernel's repeats of it) once over the step, as
    one micro-batch does; each of the four loaded the whole cache before."""
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.gpu import GpuLowering, cache_rereads
    from dabench_ir.targets import load_target

    graph = llama70b_attention_decode
    target = load_target("h100")
    plans = [
        lower(graph, target, GpuLowering.options(ProfileOptions(precision="bf16", micro_batches=m))) for m in (1, 4)
    ]
    rereads = cache_rereads(_ctx(graph))
    assert rereads
    for name in rereads:
        one, four = (p.node_plans[name].memory_s for p in plans)
        assert four == pytest.approx(one, rel=1e-12) and one > 0


def test_a_prefill_has_no_decode_step_row():
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.gpu import DECODE_STEP, GpuLowering
    from dabench_ir.targets import load_target

    cfg = ModelConfig(family="llama", layers=1, hidden=256, heads=8, kv_heads=2, ffn=512, seq=16, batch=1)
    plan = lower(_graph(cfg), load_target("h100"), GpuLowering.options(ProfileOptions()))
    assert DECODE_STEP not in plan.step_overheads_s


@pytest.mark.parametrize("precision, itemsize", [("bf16", 2), ("fp32", 4)])
def test_saved_activations_match_korthikanti_without_dropout_with_a_fused_core(precision, itemsize):
    from dabench_ir.lowering.gpu import device_memory

    layers, hidden, heads, seq, batch = 2, 256, 4, 128, 2
    cfg = ModelConfig(family="gpt2", layers=layers, hidden=hidden, heads=heads, seq=seq, batch=batch)
    graph = _graph(cfg, mode="train", precision=precision, fused_attention=True, recompute="none")
    sbh = seq * batch * hidden
    rows = seq * batch
    korthikanti = 16 * sbh * itemsize  # 32sbh bytes at 16 bits, per layer: LN 4, attention 10, MLP 18
    lse = 4 * batch * heads * seq  # the fused softmax's log-sum-exp, fp32 per score row
    stats = 2 * 4 * rows  # a LayerNorm's mean and 1/sigma, fp32 per row
    final_norm = sbh * itemsize + stats  # the last LayerNorm keeps its input too
    expected = layers * (korthikanti + lse + 2 * stats) + final_norm
    assert device_memory(_ctx(graph))["activations"] == expected


def test_gqa_keeps_k_and_v_at_kv_heads_under_a_fused_core():
    """FlashAttention takes K and V with fewer heads than Q and saves them so; the head broadcast
    (``Expand``) is a view, so a GQA model saves K and V at kv_heads, not heads."""
    from dabench_ir.lowering.gpu import device_memory

    def saved(kv_heads: int) -> int:
        cfg = ModelConfig(family="llama", layers=1, hidden=256, heads=8, kv_heads=kv_heads, ffn=512, seq=64, batch=2)
        graph = _graph(cfg, mode="train", precision="fp32", fused_attention=True, recompute="none")
        return device_memory(_ctx(graph))["activations"]

    kv_bytes = 2 * 64 * (256 // 8) * 4  # one K/V head of one sequence's 64 tokens, fp32, x batch 2
    # the K and V the core keeps shrink with the K/V heads, nothing else changes; RoPE's products of K
    # with the cos and sin tables keep nothing of K (a factor is kept for its partner's gradient only:
    # they had kept K and its rotated half, 4 K/V tensors a head instead of 2)
    mha, gqa = saved(8), saved(2)
    assert mha - gqa == (8 - 2) * kv_bytes * 2


def test_training_working_set_beyond_the_saved_tensors_is_not_counted_twice():
    """The live tensors of the forward that are already saved are held once (``activations``),
    not again as ``live``: what ``live`` adds is what is not saved."""
    from dabench_ir.lowering.gpu import device_memory

    cfg = ModelConfig(family="gpt2", layers=2, hidden=256, heads=4, seq=128, batch=2)
    graph = _graph(cfg, mode="train", precision="fp32", fused_attention=True, recompute="none")
    parts = device_memory(_ctx(graph))
    sbh = 128 * 2 * 256 * 4
    assert parts["live"] <= 4 * sbh  # a residual, a norm output and the MLP's ffn = 4h-wide tensor at most


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_gqa_broadcast_into_a_fused_core_is_a_view_in_inference_and_a_kernel_in_training(mode):
    """Forward: FlashAttention reads K/V at kv_heads, the ``Expand`` copies nothing and launches
    nothing. Training: FA2's backward sums dK/dV over each query-head group (a kernel of its own)."""
    from dabench_ir.lowering import lower
    from dabench_ir.lowering.gpu import GpuLowering
    from dabench_ir.targets import load_target

    cfg = ModelConfig(family="llama", layers=1, hidden=256, heads=8, kv_heads=2, ffn=512, seq=16, batch=1)
    graph = _graph(cfg, mode=mode, fused_attention=True)
    plan = lower(graph, load_target("h100"), GpuLowering.options(ProfileOptions(mode=mode)))
    expands = [n.name for n in graph.nodes if n.op_type == "Expand"]
    assert len(expands) == 2  # K and V
    times = [plan.node_plans[n].per_micro_batch_s for n in expands]
    assert all(t == 0 for t in times) if mode == "inference" else all(t > 0 for t in times)


def test_the_kv_cache_inputs_are_one_fact_for_the_loader_and_the_lowering(llama70b_attention_decode):
    """A decode model without the exporter's list (a user's file) has its caches found by their
    names, for the scenario and scaling (`passes.precision.cache_inputs`) and for the GPU lowering
    alike: the lowering read the list only, so such a model's cache was a micro-batch's activations."""
    import copy

    from dabench_ir.lowering.context import cache_inputs as lowered
    from dabench_ir.passes import meta
    from dabench_ir.passes.precision import cache_inputs

    listed = copy.deepcopy(llama70b_attention_decode)
    unlisted = copy.deepcopy(listed)
    unlisted.metadata.pop(meta.MODEL_KV_CACHE)
    for graph in (listed, unlisted):
        found = cache_inputs(graph)
        assert len(found) == 2 and set(lowered(_ctx(graph))) == set(found)
