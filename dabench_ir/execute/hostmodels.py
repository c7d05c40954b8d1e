"""Small HF-style decoders written independently of dabench-ir's own model builders, for host checks.

The host-CPU predictor is checked on models it was not tuned on: these are written the way
Hugging Face transformers writes its decoders (not by `models/`): a LLaMA-style block
(RMSNorm, rotary embeddings, grouped-query attention whose keys and values are repeated
per query group, SiLU-gated MLP, bias-free linears) and a GPT-style block (LayerNorm,
learned positions, fused QKV projection, GELU MLP), with eager attention (explicit
matmul, additive causal mask, softmax) or fused attention
(`torch.nn.functional.scaled_dot_product_attention`). `export_host_model` exports one
with torch's dynamo exporter at random weights. torch is imported only here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["HostModel", "export_host_model"]


@dataclass(frozen=True)
class HostModel:
    """One decoder to export: ``family`` "llama" or "gpt2", ``attention`` "eager" or "sdpa"."""

    family: str = "llama"
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int | None = None  # < heads: grouped-query attention (llama only)
    seq: int = 128
    vocab: int = 1024
    attention: str = "eager"

    @property
    def label(self) -> str:
        kv = f" kv{self.kv_heads}" if self.kv_heads and self.kv_heads != self.heads else ""
        return f"{self.family} L{self.layers} H{self.hidden} S{self.seq}{kv} {self.attention}"


def _modules(cfg: HostModel):
    import torch
    from torch import nn
    from torch.nn import functional as F

    heads, kv = cfg.heads, cfg.kv_heads or cfg.heads
    dim = cfg.hidden // heads

    def attend(q, k, v, mask):
        if cfg.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dim)
        probs = torch.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(cfg.hidden))

        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(var + 1e-6))

    def rotate_half(x):
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-b, a), dim=-1)

    class LlamaAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(cfg.hidden, heads * dim, bias=False)
            self.k_proj = nn.Linear(cfg.hidden, kv * dim, bias=False)
            self.v_proj = nn.Linear(cfg.hidden, kv * dim, bias=False)
            self.o_proj = nn.Linear(heads * dim, cfg.hidden, bias=False)

        def forward(self, x, cos, sin, mask):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, heads, dim).transpose(1, 2)
            k = self.k_proj(x).view(b, s, kv, dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, kv, dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if kv != heads:  # repeat_kv: each key/value head serves heads // kv query heads
                k = k[:, :, None].expand(b, kv, heads // kv, s, dim).reshape(b, heads, s, dim)
                v = v[:, :, None].expand(b, kv, heads // kv, s, dim).reshape(b, heads, s, dim)
            out = attend(q, k, v, mask)
            return self.o_proj(out.transpose(1, 2).reshape(b, s, heads * dim))

    class LlamaMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            ffn = int(8 * cfg.hidden / 3 / 64 + 1) * 64
            self.gate_proj = nn.Linear(cfg.hidden, ffn, bias=False)
            self.up_proj = nn.Linear(cfg.hidden, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, cfg.hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class GptAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(cfg.hidden, 3 * cfg.hidden)
            self.c_proj = nn.Linear(cfg.hidden, cfg.hidden)

        def forward(self, x, cos, sin, mask):
            b, s, _ = x.shape
            q, k, v = self.c_attn(x).split(cfg.hidden, dim=2)
            q, k, v = (t.view(b, s, heads, dim).transpose(1, 2) for t in (q, k, v))
            out = attend(q, k, v, mask)
            return self.c_proj(out.transpose(1, 2).reshape(b, s, cfg.hidden))

    class GptMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc = nn.Linear(cfg.hidden, 4 * cfg.hidden)
            self.c_proj = nn.Linear(4 * cfg.hidden, cfg.hidden)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    llama = cfg.family == "llama"

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = RMSNorm() if llama else nn.LayerNorm(cfg.hidden)
            self.attn = LlamaAttention() if llama else GptAttention()
            self.norm2 = RMSNorm() if llama else nn.LayerNorm(cfg.hidden)
            self.mlp = LlamaMLP() if llama else GptMLP()

        def forward(self, x, cos, sin, mask):
            x = x + self.attn(self.norm1(x), cos, sin, mask)
            return x + self.mlp(self.norm2(x))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
            if not llama:
                self.pos = nn.Embedding(cfg.seq, cfg.hidden)
            self.layers = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.norm = RMSNorm() if llama else nn.LayerNorm(cfg.hidden)
            self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

        def forward(self, input_ids):
            s = input_ids.shape[1]
            x = self.embed(input_ids)
            positions = torch.arange(s)
            if not llama:
                x = x + self.pos(positions)
            inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
            freqs = torch.outer(positions.float(), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            mask = torch.triu(torch.full((s, s), float("-inf")), diagonal=1)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            return self.lm_head(self.norm(x))

    return Decoder


def export_host_model(cfg: HostModel, *, seed: int = 0) -> onnx.ModelProto:
    """``cfg`` exported by torch's dynamo exporter (random weights as initializers, batch 1)."""
    import warnings

    import onnx
    import torch

    torch.manual_seed(seed)
    model = _modules(cfg)().eval()
    ids = torch.zeros((1, cfg.seq), dtype=torch.long)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (ids,), dynamo=True, verbose=False)
    proto = program.model_proto
    onnx.checker.check_model(proto)
    return proto
