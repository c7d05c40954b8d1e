"""GPT-J and GPT-NeoX families: parallel-residual blocks with partial rotary embedding.

Both run attention and the MLP side by side on the block's input and add both to it:

    GPT-J     x + attn(ln(x)) + mlp(ln(x))        one LayerNorm, read by both branches
    GPT-NeoX  x + attn(ln1(x)) + mlp(ln2(x))      two LayerNorms (``use_parallel_residual``)

so the two branches of a block have no data dependence on each other, unlike GPT-2's and
LLaMA's sequential ``x + attn(norm(x))`` then ``x + mlp(norm(x))``. As Hugging Face writes them
(transformers ``models/gptj/modeling_gptj.py`` and ``models/gpt_neox/modeling_gpt_neox.py``):

- GPT-J: q/k/v/o projections without bias; rotary on the first ``rotary_dim`` dims of each
  head, interleaved pairs (``rotate_every_two``); MLP fc_in → GELU (tanh, ``gelu_new``) →
  fc_out with biases; untied LM head with a bias.
- GPT-NeoX: one fused, biased h → 3h qkv projection (per head q, k, v side by side) and a
  biased output projection; rotary on the first ``rotary_pct`` of each head, half-split
  (``rotate_half``, LLaMA's layout); MLP with exact GELU and biases; untied LM head, no bias.

Module paths follow the other families (`layers.N.attn_norm`, `layers.N.attn.{q,k,v,o}_proj`
or `layers.N.attn.{qkv,o}_proj`, `layers.N.mlp_norm` (GPT-NeoX), `layers.N.mlp.{fc_in,fc_out}`);
every op is written out, so the ONNX export needs no fused or contrib op.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from dabench_ir.models.config import ModelConfig
from dabench_ir.models.gpt2 import GPT2MLP, Attention, causal_mask, run_blocks, stack
from dabench_ir.models.llama import apply_rotary, rotary_tables

__all__ = ["ParallelAttention", "ParallelBlock", "ParallelModel", "partial_rotate", "rotate_every_two"]

logger = logging.getLogger(__name__)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's pairwise rotation: (x0, x1, x2, x3, …) → (−x1, x0, −x3, x2, …), pairs interleaved."""
    pairs = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1)
    return pairs.flatten(-2)


def partial_rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, *, interleaved: bool
) -> torch.Tensor:
    """Rotary embedding on the first ``rotary_dim`` dims of each head of ``x`` `[B, heads, S, D]`; the
    rest pass through unchanged. ``cos``, ``sin``: `[S, rotary_dim]` (`rotary_tables`, same layout)."""
    rot, rest = (x, None) if rotary_dim == x.shape[-1] else (x[..., :rotary_dim], x[..., rotary_dim:])
    rot = rot * cos + rotate_every_two(rot) * sin if interleaved else apply_rotary(rot, cos, sin)
    return rot if rest is None else torch.cat((rot, rest), dim=-1)


class ParallelAttention(Attention):
    """GPT-J's attention (four projections, no bias, interleaved rotary) or GPT-NeoX's (fused biased qkv,
    biased output, half-split rotary), both rotating the first ``rotary_dim`` dims of each head."""

    def __init__(self, cfg: ModelConfig) -> None:
        neox = cfg.family == "gpt_neox"
        super().__init__(cfg, bias=neox, fused_qkv=neox)
        self.rotary_dim, self.interleaved = cfg.rotary_dim, not neox

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, cache=None):
        def rotate(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            turn = (partial_rotate(t, cos, sin, self.rotary_dim, interleaved=self.interleaved) for t in (q, k))
            return tuple(turn)

        return self.attention(x, mask, cache, rotate=rotate)


class ParallelBlock(nn.Module):
    """Parallel residual: x + attn(ln(x)) + mlp(ln(x)) (GPT-J: one LayerNorm, `attn_norm`, read by both
    branches) or x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX: `attn_norm` and `mlp_norm`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        neox = cfg.family == "gpt_neox"
        self.attn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = ParallelAttention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps) if neox else None
        self.mlp = GPT2MLP(cfg, approximate="none" if neox else "tanh")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, cache=None):
        a = self.attn_norm(x)
        m = self.mlp_norm(x) if self.mlp_norm is not None else a
        if cache is None:
            return x + self.attn(a, mask, cos, sin) + self.mlp(m)
        attn, k, v = self.attn(a, mask, cos, sin, cache)
        return x + attn + self.mlp(m), k, v


class ParallelModel(nn.Module):
    """Optional token embedding, `layers` parallel-residual blocks, final LayerNorm, optional untied LM
    head (biased for GPT-J). Decode (`caches` given, as `GPT2Model`): rotary positions start after the
    cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden) if cfg.vocab else None
        stack(self, cfg, (ParallelBlock(cfg) for _ in range(cfg.layers)), nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps))

    def forward(self, x: torch.Tensor, *caches: torch.Tensor):
        h = self.embed(x) if self.embed is not None else x
        seq, start = h.shape[1], (caches[1].shape[2] if caches else 0)
        mask = causal_mask(seq, h.dtype, h.device) if not caches or seq > 1 else None
        interleaved = self.cfg.family == "gptj"
        cos, sin = rotary_tables(
            seq, self.cfg.rotary_dim, self.cfg.rope_theta, h.dtype, h.device, start, interleaved=interleaved
        )
        return run_blocks(self, h, mask, caches, cos, sin)
