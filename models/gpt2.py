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

__all__ = [
    "GPT2MLP",
    "GPT2Attention",
    "GPT2Block",
    "GPT2Model",
    "attend",
    "attend_cached",
    "causal_mask",
    "torch_dtype",
]

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


def attend_cached(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of `[B, heads, S, D]` new queries over a KV cache (K stored transposed,
    `[B, kv_heads, D, C]`; V `[B, kv_heads, C, D]`) plus the S new keys `[B, kv_heads, D, S]`
    and values `[B, kv_heads, S, D]`; returns `[B, S, heads·D]`.

    K is kept transposed so that Q·Kᵀ reads the cache as it lies (decode kernels keep K in a
    layout made for that read; a Transpose of the cache would copy it every step).

    The cache is read where it lies, never copied: scores against the cache and against the
    new keys are computed apart and concatenated (a few bytes per query), as decode kernels
    that append to a preallocated cache do. Grouped-query attention folds the query heads
    of a group into the rows of one matmul against the group's K and V, so each cached
    K/V head is read once, not once per query head. `mask` is the `[S, S]` causal mask of
    the new tokens among themselves (None for one new token).
    """
    batch, heads, seq, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    rep = heads // kv_heads
    qg = (q * (1.0 / math.sqrt(head_dim))).reshape(batch, kv_heads, rep * seq, head_dim)
    past = torch.matmul(qg, k_cache)
    new = torch.matmul(qg, k_new)
    if mask is not None:
        new = (new.reshape(batch, kv_heads, rep, seq, seq) + mask).reshape(batch, kv_heads, rep * seq, seq)
    context = k_cache.shape[3]
    probs = torch.softmax(torch.cat((past, new), dim=-1), dim=-1)
    out = torch.matmul(probs[..., :context], v_cache) + torch.matmul(probs[..., context:], v_new)
    out = out.reshape(batch, heads, seq, head_dim)
    return out.transpose(1, 2).reshape(batch, seq, heads * head_dim)


class Attention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention, with or without a KV cache: the one
    attention of every family (LLaMA's, GPT-J's and GPT-NeoX's rotate q and k first: ``rotate``).

    ``fused_qkv`` (GPT-NeoX): one h → 3h projection ``qkv_proj`` whose output holds, per head, that
    head's q, k and v side by side (HF ``GPTNeoXAttention.query_key_value``'s layout) instead of
    ``q_proj``, ``k_proj``, ``v_proj``: the same FLOPs in one MatMul.
    """

    def __init__(self, cfg: ModelConfig, *, bias: bool, fused_qkv: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        if fused_qkv:
            self.qkv_proj = nn.Linear(cfg.hidden, cfg.hidden + 2 * cfg.kv_dim, bias=bias)
        else:
            self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=bias)
            self.k_proj = nn.Linear(cfg.hidden, cfg.kv_dim, bias=bias)
            self.v_proj = nn.Linear(cfg.hidden, cfg.kv_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=bias)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q `[B, heads, S, D]`, k and v `[B, kv_heads, S, D]` of ``x``."""
        batch, seq, _ = x.shape
        if hasattr(self, "qkv_proj"):  # fused: heads == kv_heads (ModelConfig refuses GQA there)
            qkv = self.qkv_proj(x).view(batch, seq, self.heads, 3 * self.head_dim).transpose(1, 2)
            d = self.head_dim  # three Slices: a Split would leave the exporter's node without a scope
            return qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def attention(self, x: torch.Tensor, mask: torch.Tensor | None, cache=None, rotate=None):
        """``rotate(q, k)``: a positional rotation of q and k before the scores (None: GPT-2 adds
        its positions to the embeddings instead)."""
        q, k, v = self.project(x)
        if rotate is not None:
            q, k = rotate(q, k)
        if cache is None:
            return self.o_proj(attend(q, k, v, mask))
        k = k.transpose(-1, -2)  # the cache's K layout, [B, kv_heads, D, S]
        return self.o_proj(attend_cached(q, cache[0], cache[1], k, v, mask)), k, v


class GPT2Attention(Attention):
    """GPT-2's attention: biased projections."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, bias=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache=None):
        return self.attention(x, mask, cache)


class GPT2MLP(nn.Module):
    """fc_in → GELU → fc_out, both biased. GELU is the tanh approximation (GPT-2's and GPT-J's
    ``gelu_new``) unless ``approximate="none"`` (GPT-NeoX's exact ``gelu``)."""

    def __init__(self, cfg: ModelConfig, *, approximate: str = "tanh") -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.act = nn.GELU(approximate=approximate)
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache=None):
        if cache is None:
            x = x + self.attn(self.attn_norm(x), mask)
            return x + self.mlp(self.mlp_norm(x))
        attn, k, v = self.attn(self.attn_norm(x), mask, cache)
        x = x + attn
        return x + self.mlp(self.mlp_norm(x)), k, v


class GPT2Model(nn.Module):
    """Optional token + position embedding, `layers` blocks, final LayerNorm, optional LM head.

    Input: token ids `[B, S]` (int64) when `cfg.vocab` is set, else hidden states `[B, S, h]`.
    Decode (`caches` given: K `[B, kv_heads, D, C]` and V `[B, kv_heads, C, D]` per layer,
    in layer order): the new tokens sit at positions C…C+S−1; returns the output and each
    layer's new K (`[B, kv_heads, D, S]`) and V (`[B, kv_heads, S, D]`).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden) if cfg.vocab else None
        self.pos_embed = nn.Embedding(cfg.max_positions, cfg.hidden) if cfg.positional == "learned" else None
        stack(self, cfg, (GPT2Block(cfg) for _ in range(cfg.layers)), nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps))

    def forward(self, x: torch.Tensor, *caches: torch.Tensor):
        h = self.embed(x) if self.embed is not None else x
        seq, start = h.shape[1], (caches[1].shape[2] if caches else 0)
        if self.pos_embed is not None:
            h = h + self.pos_embed(torch.arange(start, start + seq, device=h.device))
        mask = causal_mask(seq, h.dtype, h.device) if not caches or seq > 1 else None
        return run_blocks(self, h, mask, caches)


def stack(model: nn.Module, cfg: ModelConfig, blocks, norm: nn.Module) -> None:
    """Give ``model`` what every family's stack shares after its embeddings: the blocks, the
    final norm and the LM head (tied to the token embedding where the config says so; biased
    where the family's is, `ModelConfig.lm_head_bias`)."""
    model.layers = nn.ModuleList(blocks)
    model.norm = norm
    model.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=cfg.lm_head_bias) if cfg.vocab else None
    if model.lm_head is not None and cfg.tie_embeddings:
        model.lm_head.weight = model.embed.weight


def run_blocks(model: nn.Module, h: torch.Tensor, mask: torch.Tensor | None, caches, *extra: torch.Tensor):
    """The blocks (each given ``extra``, e.g. LLaMA's rotary tables, and its layer's cache), the final
    norm and the head: the output, and with ``caches`` each layer's new K and V after it."""
    new: list[torch.Tensor] = []
    for i, layer in enumerate(model.layers):
        if caches:
            h, k, v = layer(h, mask, *extra, (caches[2 * i], caches[2 * i + 1]))
            new += [k, v]
        else:
            h = layer(h, mask, *extra)
    h = model.norm(h)
    if model.lm_head is not None and model.cfg.logits == "last":
        h = h[:, -1:, :]  # only the next token is sampled: the last position's logits (`LOGITS`)
    out = model.lm_head(h) if model.lm_head is not None else h
    return (out, *new) if caches else out
