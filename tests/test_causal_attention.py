"""A causal attention core run as one fused kernel computes the scores at and below the diagonal only
(FlashAttention-2, section 3.1.1: the key blocks wholly above it are skipped), so its time is that
share of the full kernel's, while the graph keeps counting every score (FLOPs as written).

The share is a closed form of the core's S queries and T keys, the queries the last S of the keys:
S·(T − S) + S·(S + 1)/2 of S·T pairs. It applies where the core's mask is causal: made by a Trilu (this
tool's exporter, ``torch.triu``) or by comparing key and query positions (transformers' mask
functions, ``kv_idx <= q_idx``); a core without a mask, and a decode step (S = 1: every key seen),
keep the full kernel.
"""

from __future__ import annotations

import pytest

from dabench_ir.lowering import lower
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.models import ModelConfig
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.passes.training import FUSED_ATTENTION, FusedAttentionPass
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

SEQ = 64


def _export(phase: str = "prefill", **sizes):
    from dabench_ir.models.export import export_onnx

    cfg = ModelConfig(
        family="llama",
        layers=2,
        hidden=1024,
        heads=4,
        kv_heads=2,
        ffn=512,
        vocab=1000,
        positional="rope",
        seq=1 if phase == "decode" else SEQ,
        batch=2,
        dtype="fp16",
        phase=phase,
        context=SEQ if phase == "decode" else 0,
        **sizes,
    )
    return export_onnx(cfg, weights="none")


def _fused(model):
    from dabench_ir.pipeline import prepare_graph

    return prepare_graph(model, ProfileOptions(precision="fp16", fused_attention=True))


def _shares(graph) -> dict[object, set[float]]:
    shares: dict[object, set[float]] = {}
    for node in graph.nodes:
        if FUSED_ATTENTION in node.meta:
            shares.setdefault(node.meta[FUSED_ATTENTION], set()).add(node.meta.get(meta.CAUSAL_SHARE))
    return shares


def test_a_prefill_core_computes_the_scores_at_and_below_the_diagonal():
    shares = _shares(_fused(_export()))
    assert len(shares) == 2  # one core a layer
    assert all(s == {(SEQ + 1) / (2 * SEQ)} for s in shares.values())


def test_a_decode_step_and_a_core_without_a_mask_keep_the_full_kernel():
    decode = _shares(_fused(_export("decode")))
    assert decode and all(s == {None} for s in decode.values())  # one query row sees every key
    unmasked = FusedAttentionPass().call(decoder(layers=1, hidden=256, seq=SEQ, heads=4)).graph
    assert all(s == {None} for s in _shares(unmasked).values())


def test_a_hugging_face_mask_made_by_comparing_positions_is_causal(tmp_path):
    """optimum's export of a transformers Llama builds its mask from ``kv_idx <= q_idx`` (LessOrEqual)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("optimum.exporters.onnx")
    from optimum.exporters.onnx import main_export

    from dabench_ir.pipeline import load_graph
    from dabench_ir.run import prepare, resolve
    from tests._helpers import hf_causal_lm, trained_looking

    model = trained_looking(hf_causal_lm("llama", layers=1, hidden=64, heads=4, vocab=256, positions=128, ffn=128))
    model.save_pretrained(tmp_path / "llama")
    main_export(str(tmp_path / "llama"), output=tmp_path / "onnx", task="text-generation")
    graph = load_graph(str(tmp_path / "onnx" / "model.onnx"))
    run = resolve(graph, load_target("h100"), {"batch": 2, "seq": 16, "fused_attention": True})
    shares = _shares(prepare(run, graph))
    assert shares and all(s == {17 / 32} for s in shares.values())


@pytest.mark.parametrize("target", ["h100", "h200"])
def test_a_causal_kernel_takes_its_share_of_the_full_kernels_time(target):
    """The kernel's matmul FLOPs at the published share of peak, on the share of the scores it computes;
    every FLOP is still counted (the node's cost is the graph's)."""
    t = load_target(target)
    graph = _fused(_export())
    plan = lower(graph, t, ProfileOptions(precision="fp16", fused_attention=True))
    ctx = LoweringContext.build(graph)
    core = [n for n in graph.nodes if FUSED_ATTENTION in n.meta and n.layer == 0]
    flops = sum(ctx.costs[n.name].contraction_flops for n in core)
    seconds = sum(plan.node_plans[n.name].compute_s for n in core)
    share = (SEQ + 1) / (2 * SEQ)
    full = flops / (t.arch_value("fused_attention_efficiency") * t.peak_flops("fp16"))
    floor = sum(t.compute_time(ctx.costs[n.name], ctx.node_precision(n), contraction_dtype="fp16") for n in core)
    assert seconds == pytest.approx(max(share * full, floor), rel=1e-9)
    assert (
        share * full > floor
    )  # heads of 256: the published share binds, the kernel is the causal half of the full one
