"""``--recompute op``: torchtitan's per-op selective activation checkpointing (issue 44).

The policy (pytorch/torchtitan, ``selective_ac_option = "op"``, the llama3 8B config's choice):
each decoder block runs under a selective-checkpoint context whose policy saves the outputs of
the ops in ``_save_list`` (``aten.mm``, the SDPA kernels, ``reduce_scatter_tensor``,
``aten.max``) "except every second mm" and recomputes every other op; the checkpoint wrapper
keeps the block's input (docs/training.md)."""

from __future__ import annotations

from dabench_ir.models import ModelConfig
from dabench_ir.options import RECOMPUTE, ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.passes import training as training_pass
from dabench_ir.passes.training import SAVED
from tests.test_training_memory import _layer_saved

S, B, H, A, KV_HEADS, FFN = 8, 1, 64, 4, 2, 128
KV = KV_HEADS * (H // A)  # the K/V projections' width, 32
E = 4  # fp32


def _graph(recompute: str, layers: int = 1):
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import prepare_graph

    cfg = ModelConfig(family="llama", layers=layers, hidden=H, heads=A, kv_heads=KV_HEADS, ffn=FFN, seq=S, batch=B)
    opts = ProfileOptions(mode="train", precision="fp32", fused_attention=True, recompute=recompute)
    return prepare_graph(export_onnx(cfg, weights="none"), opts)


def _totals(graph) -> tuple[int, int, int]:
    costs = [meta.get_cost(n) for n in graph.nodes]
    return (
        sum(c.contraction_flops for c in costs if c),
        sum(c.vector_flops for c in costs if c),
        sum(c.special_ops for c in costs if c),
    )


def test_op_is_a_recompute_choice_owned_by_the_options():
    assert "op" in RECOMPUTE
    assert not hasattr(training_pass, "RECOMPUTE") or training_pass.RECOMPUTE is RECOMPUTE


def test_one_llama_block_keeps_what_torchtitans_op_policy_saves():
    """Hand count, one Llama block (s=8, b=1, h=64, 4 heads, 2 K/V heads of 16, ffn 128, fp32),
    stated before the run: the block input x (sbh), the weight matmuls in order q, k, v, o, gate,
    up, down with the 1st, 3rd, 5th and 7th saved: q (sbh), v (sb·32), gate (sb·ffn), down (sbh);
    the SDPA kernel's output O (sbh) and log-sum-exp (4·a·s·b, fp32). Norms, rotary, SiLU, the
    SwiGLU product and the residual adds keep nothing. 4·(4·512 + 256 + 1024) + 128 = 13,440 B.
    The final norm outside the block keeps what autograd saves: its input (sbh), the normalised
    x (sbh) and two per-row fp32 (sqrt, 1/rms: 4·sb each): 4,160 B. Whole step: 17,600 B."""
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.gpu import device_memory

    graph = _graph("op")
    sbh = S * B * H
    block = E * (4 * sbh + S * B * KV + S * B * FFN) + 4 * A * S * B
    assert block == 13_440
    assert _layer_saved(graph, 0) == block
    final_norm = E * (2 * sbh + 2 * S * B)
    assert meta.training_state(graph).saved_activation_bytes == block + final_norm == 17_600
    assert device_memory(LoweringContext.build(graph))["activations"] == block + final_norm
    assert device_memory(LoweringContext.build(_graph("none")))["activations"] > block + final_norm


def test_op_adds_exactly_the_recomputed_ops_forward_flops():
    """The backward runs again every op of the block but the saved matmuls (q, v, gate, down) and
    the attention kernel (its scores are recomputed by FlashAttention's own backward in every
    mode): the contraction FLOPs rise by the k, o and up projections, 2·sb·(h·32 + h·h + h·ffn);
    the vector FLOPs and special ops by the forward of every other op of the block."""
    none, op = _graph("none"), _graph("op")
    (c0, v0, s0), (c1, v1, s1) = _totals(none), _totals(op)
    assert c1 - c0 == 2 * S * B * (H * KV + H * H + H * FFN) == 229_376
    cores = {n.name for n in op.nodes if meta.FUSED_ATTENTION in n.meta}

    def cached(node) -> bool:  # a save-listed op: it keeps its own output
        return any(k.split("#")[0] in node.outputs for k in node.meta.get(SAVED) or {})

    again = [n for n in op.nodes if n.layer == 0 and n.name not in cores and not cached(n) and meta.get_cost(n)]
    assert sum(1 for n in op.nodes if n.layer == 0 and cached(n) and n.name not in cores) == 4  # q, v, gate, down
    forward = [n.meta[meta.FORWARD_COST] for n in again]
    assert c1 - c0 == sum(f.contraction_flops for f in forward)
    assert v1 - v0 == sum(f.vector_flops for f in forward) > 0
    assert s1 - s0 == sum(f.special_ops for f in forward) > 0


def test_full_recompute_holds_each_block_input_and_one_block_on_a_gpu():
    """``--recompute full`` on a GPU holds every block's input, what the nodes outside the blocks save
    and one block's set during its backward: with two blocks less than ``none``, and at least the
    final norm's 4,160 B plus a block input. It held as much as ``none`` while paying the recompute
    (session 51)."""
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.gpu import device_memory

    held = {
        mode: device_memory(LoweringContext.build(_graph(mode, layers=2)))["activations"] for mode in ("none", "full")
    }
    assert 4160 + E * S * B * H <= held["full"] < held["none"]
