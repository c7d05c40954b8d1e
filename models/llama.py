"""LLaMA family: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP.

RMSNorm and rotary embedding are written with plain ops (Pow, ReduceMean, Sqrt,
Reciprocal, Cos, Sin, Slice, Concat) so the exported ONNX needs no fused or contrib op.
Rotary cos/sin and the causal mask are computed once per forward, outside the blocks.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from dabench_ir.models.config import ModelConfig
from dabench_ir.models.gpt2 import Attention, causal_mask, run_blocks, stack

__all__ = ["LlamaAttention", "LlamaBlock", "LlamaMLP", "LlamaModel", "RMSNorm", "apply_rotary", "rotary_tables"]

logger = logging.getLogger(__name__)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, computed in fp32."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * scale).to(x.dtype) * self.weight


def rotary_tables(
    seq: int, head_dim: int, theta: float, dtype: torch.dtype, device: torch.device, start=0, *, interleaved=False
):
    """cos and sin tables `[seq, head_dim]` for positions start…start+seq−1: half-split layout (LLaMA,
    GPT-NeoX: frequency i at columns i and i + head_dim/2) or ``interleaved`` (GPT-J: at 2i and 2i+1).
    ``head_dim`` is the width rotated (GPT-J's and GPT-NeoX's ``rotary_dim``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if isinstance(start, int) and start == 0:
        pos = torch.arange(seq, device=device, dtype=torch.float32)
    else:  # decode: positions after a cache whose length may be symbolic
        pos = torch.arange(start, start + seq, device=device).to(torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.stack((freqs, freqs), dim=-1).flatten(-2) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin, half-split layout (`rotary_tables`)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(Attention):
    """Grouped-query attention with rotary q and k; projections without bias."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, cache=None):
        return self.attention(
            x, mask, cache, rotate=lambda q, k: (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin))
        )


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) · up(x)); SiLU written as x·sigmoid(x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        return self.down_proj(gate * torch.sigmoid(gate) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm block: x + attn(rms(x)), then x + mlp(rms(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = LlamaAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, cache=None):
        if cache is None:
            x = x + self.attn(self.attn_norm(x), mask, cos, sin)
            return x + self.mlp(self.mlp_norm(x))
        attn, k, v = self.attn(self.attn_norm(x), mask, cos, sin, cache)
        x = x + attn
        return x + self.mlp(self.mlp_norm(x)), k, v


class LlamaModel(nn.Module):
    """Optional token embedding, `layers` blocks, final RMSNorm, optional (untied) LM head.

    Decode (`caches` given, as `GPT2Model`): rotary positions start after the cache.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden) if cfg.vocab else None
        stack(self, cfg, (LlamaBlock(cfg) for _ in range(cfg.layers)), RMSNorm(cfg.hidden, cfg.norm_eps))

    def forward(self, x: torch.Tensor, *caches: torch.Tensor):
        h = self.embed(x) if self.embed is not None else x
        seq, start = h.shape[1], (caches[1].shape[2] if caches else 0)
        mask = causal_mask(seq, h.dtype, h.device) if not caches or seq > 1 else None
        cos, sin = rotary_tables(seq, self.cfg.head_dim, self.cfg.rope_theta, h.dtype, h.device, start)
        return run_blocks(self, h, mask, caches, cos, sin)
