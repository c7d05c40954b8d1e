"""GPT-2 family: LayerNorm, multi-head causal attention, GELU MLP, learned or no positions.

Module names are chosen so the exporter's scopes read `layers.3.attn.q_proj`,
`layers.3.mlp.fc_in`, …; the attention core here is shared with the LLaMA family.
Every op is written out (no fused SDPA) so the exported ONNX uses only plain ops.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from dabench_ir.models.config import ModelConfig

__all__ = ["GPT2MLP", "GPT2Attention", "GPT2Block", "GPT2Model", "attend", "causal_mask", "torch_dtype"]

logger = logging.getLogger(__name__)

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config dtype name (fp32, fp16, bf16)."""
    return _TORCH_DTYPES[name]


def causal_mask(seq: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`[seq, seq]` additive mask: 0 on and below the diagonal, −inf above (ONNX: Trilu)."""
    full = torch.full((seq, seq), float("-inf"), dtype=dtype, device=device)
    return torch.triu(full, diagonal=1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Causal attention on `[B, heads, S, D]` q and `[B, kv_heads, S, D]` k, v.

    K and V heads are repeated to match q (grouped-query attention when kv_heads < heads).
    Returns `[B, S, heads·D]`.
    """
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    if kv_heads != heads:
        rep = heads // kv_heads
        k = k[:, :, None].expand(batch, kv_heads, rep, seq, head_dim).reshape(batch, heads, seq, head_dim)
        v = v[:, :, None].expand(batch, kv_heads, rep, seq, head_dim).reshape(batch, heads, seq, head_dim)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))
    probs = torch.softmax(scores + mask, dim=-1)
    out = torch.matmul(probs, v)
    return out.transpose(1, 2).reshape(batch, seq, heads * head_dim)


class GPT2Attention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention with biased projections."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_dim)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_dim)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        return self.o_proj(attend(q, k, v, mask))


class GPT2MLP(nn.Module):
    """fc_in → GELU (tanh approximation, as GPT-2) → fc_out."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.act = nn.GELU(approximate="tanh")
        self.fc_out = nn.Linear(cfg.ffn, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(x)))


class GPT2Block(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = GPT2Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.mlp(self.mlp_norm(x))


class GPT2Model(nn.Module):
    """Optional token + position embedding, `layers` blocks, final LayerNorm, optional LM head.

    Input: token ids `[B, S]` (int64) when `cfg.vocab` is set, else hidden states `[B, S, h]`.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden) if cfg.vocab else None
        self.pos_embed = nn.Embedding(cfg.max_positions, cfg.hidden) if cfg.positional == "learned" else None
        self.layers = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False) if cfg.vocab else None
        if self.lm_head is not None and cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        seq = h.shape[1]
        if self.pos_embed is not None:
            h = h + self.pos_embed(torch.arange(seq, device=h.device))
        mask = causal_mask(seq, h.dtype, h.device)
        for layer in self.layers:
            h = layer(h, mask)
        h = self.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h
