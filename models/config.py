"""`ModelConfig`: the parameters of a decoder-block model, validated, with closed-form counts.

The closed forms here (parameters, MatMul FLOPs) are the reference the tests check the
torch modules and the exported graphs against; docs/models.md states them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any

from dabench_ir.errors import UserError

__all__ = ["DTYPES", "FAMILIES", "HEAD_DIM", "LOGITS", "PARALLEL_FAMILIES", "PHASES", "ModelConfig", "default_heads"]

logger = logging.getLogger(__name__)

FAMILIES = ("gpt2", "llama", "gptj", "gpt_neox")
PARALLEL_FAMILIES = ("gptj", "gpt_neox")
"""Families whose block is parallel-residual: x + attn(ln(x)) + mlp(ln'(x)) (GPT-J: one LayerNorm read
by both branches; GPT-NeoX: one per branch). Named as Hugging Face's ``model_type``."""
DTYPES = ("fp32", "fp16", "bf16")
PHASES = ("prefill", "decode")
LOGITS = ("all", "last")
"""Which positions the LM head projects: every one (a plain forward, training) or each sequence's last,
as serving engines run a prefill: only the next token is sampled (TensorRT-LLM's
``gather_last_token_logits`` before ``lm_head``, NVIDIA/TensorRT-LLM tensorrt_llm/models/modeling_utils.py;
vLLM's ``_prune_hidden_states`` to the prompt's last token, vllm/model_executor/layers/logits_processor.py)."""
HEAD_DIM = 64
"""Width of one attention head when a model's heads are not given (GPT-2's and LLaMA's)."""


def default_heads(hidden: int, *, hint: str = "give heads for it") -> int:
    """Attention heads when none are given: ``hidden / HEAD_DIM``. A ``hidden`` that is no
    positive multiple of `HEAD_DIM` raises UserError, ending with ``hint`` (how to give them)."""
    if hidden <= 0 or hidden % HEAD_DIM:
        raise UserError(f"hidden {hidden} is not a multiple of {HEAD_DIM}: {hint}")
    return hidden // HEAD_DIM


def _default_ffn(family: str, hidden: int) -> int:
    """GPT-2, GPT-J, GPT-NeoX: 4h. LLaMA: 2/3 of 4h, rounded up to a multiple of 256 (the LLaMA recipe)."""
    if family == "llama":
        ffn = int(2 * 4 * hidden / 3)
        return 256 * ((ffn + 255) // 256)
    return 4 * hidden


@dataclass(frozen=True)
class ModelConfig:
    """One decoder stack: `layers` blocks of width `hidden`, run on `batch` × `seq` tokens.

    `vocab` set means the model has a token embedding and an LM head (input: token ids);
    `vocab` None means a bare stack of blocks (input: hidden states `[batch, seq, hidden]`).
    `kv_heads` < `heads` is grouped-query attention. `ffn`, `kv_heads` default per family.
    `rotary_dim` (GPT-J, GPT-NeoX only): the leading dims of each head that rotary embedding
    rotates, the rest pass through; default head_dim / 4 (GPT-J-6B's 64 of 256, GPT-NeoX's
    rotary_pct 0.25).

    `phase` "prefill" (default) runs `seq` tokens from an empty cache; "decode" runs `seq`
    new tokens (the chunk, usually 1) against a KV cache of `context` past tokens, which the
    graph takes as inputs (one K and one V per layer) and appends to. `logits` (`LOGITS`): "last" projects
    only each sequence's last position through the LM head, as a serving engine's prefill does.
    """

    family: str = "llama"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int | None = None
    ffn: int | None = None
    seq: int = 8
    batch: int = 1
    vocab: int | None = None
    dtype: str = "fp32"
    positional: str | None = None  # gpt2: "learned" | "none"; llama: "rope"
    max_positions: int | None = None  # rows of GPT-2's learned position table; default seq
    tie_embeddings: bool | None = None  # LM head shares the embedding (GPT-2) or not (LLaMA)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rotary_dim: int | None = None  # gptj, gpt_neox: rotated dims per head; default head_dim // 4
    preset: str | None = None
    phase: str = "prefill"
    context: int = 0  # past tokens in the KV cache (decode)
    logits: str = "all"  # LOGITS: the positions the LM head projects

    def __post_init__(self) -> None:
        fam = self.family
        if fam not in FAMILIES:
            raise UserError(f"unknown family {fam!r}; choose one of: {', '.join(FAMILIES)}")
        for name in ("layers", "hidden", "heads", "seq", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        for name in ("kv_heads", "ffn", "vocab", "max_positions", "rotary_dim"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        if self.phase not in PHASES:
            raise UserError(f"phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        if not isinstance(self.context, int) or isinstance(self.context, bool) or self.context < 0:
            raise UserError(f"context must be a non-negative integer, got {self.context!r}")
        if self.phase == "decode" and self.context < 1:
            raise UserError("a decode export needs --context N (past tokens in the KV cache), N >= 1")
        if self.logits not in LOGITS:
            raise UserError(f"logits must be one of {', '.join(LOGITS)}, got {self.logits!r}")
        if self.logits == "last" and not self.vocab:
            raise UserError("--logits last projects through the LM head; a model without --vocab has none")
        if self.phase == "prefill" and self.context:
            raise UserError("--context applies to --phase decode only")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn is None:
            object.__setattr__(self, "ffn", _default_ffn(fam, self.hidden))
        if self.hidden % self.heads:
            raise UserError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}); change --hidden or --heads"
            )
        if self.heads % self.kv_heads:
            raise UserError(
                f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads}); change --heads or --kv-heads"
            )
        self._check_rotary()
        if self.dtype not in DTYPES:
            raise UserError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        positional = self.positional or ("learned" if fam == "gpt2" else "rope")
        allowed = ("learned", "none") if fam == "gpt2" else ("rope",)  # llama, gptj, gpt_neox: rotary
        if positional not in allowed:
            raise UserError(f"positional for {fam} must be one of {', '.join(allowed)}, got {positional!r}")
        object.__setattr__(self, "positional", positional)
        if fam == "llama" and self.head_dim % 2:
            raise UserError(f"head dim hidden/heads ({self.head_dim}) must be even for rotary embedding")
        if self.max_positions is None and positional == "learned":
            object.__setattr__(self, "max_positions", self.total_len)
        if positional != "learned":
            object.__setattr__(self, "max_positions", None)
        elif self.max_positions < self.total_len:
            what = f"context + seq ({self.total_len})" if self.context else f"seq ({self.seq})"
            raise UserError(f"{what} exceeds max_positions ({self.max_positions})")
        if self.tie_embeddings is None:
            object.__setattr__(self, "tie_embeddings", fam == "gpt2")

    def _check_rotary(self) -> None:
        """Partial rotary (GPT-J, GPT-NeoX): default `rotary_dim`, and refuse one that is odd, wider than a
        head, or given to a family that rotates whole heads (LLaMA) or has none (GPT-2); and refuse
        grouped-query attention there (GPT-J and GPT-NeoX have none)."""
        if self.family not in PARALLEL_FAMILIES:
            if self.rotary_dim is not None:
                raise UserError(f"rotary_dim applies to {', '.join(PARALLEL_FAMILIES)}, not {self.family}")
            return
        if self.kv_heads != self.heads:
            raise UserError(f"{self.family} has no grouped-query attention: kv_heads must equal heads ({self.heads})")
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", max(2, self.head_dim // 4 // 2 * 2))
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise UserError(
                f"rotary_dim ({self.rotary_dim}) must be even and at most the head dim hidden/heads ({self.head_dim})"
            )

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the K and V projections: kv_heads × head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "fp32" else 2

    @property
    def total_len(self) -> int:
        """Tokens attended to by the last new token: past context plus the new ones."""
        return self.context + self.seq

    @property
    def parallel_residual(self) -> bool:
        """Attention and MLP read the block's input side by side and are summed into it (GPT-J, GPT-NeoX)."""
        return self.family in PARALLEL_FAMILIES

    @property
    def lm_head_bias(self) -> bool:
        """GPT-J's LM head has a bias (HF ``GPTJForCausalLM.lm_head``); the other families' heads do not."""
        return self.family == "gptj"

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes` applied (and validated again)."""
        return dataclasses.replace(self, **changes)

    # ---- closed forms --------------------------------------------------------------------
    def block_params(self) -> int:
        """Parameters of one decoder block.

        Attention 2h² + 2h·kv, plus q/k/v/o biases for GPT-2 and GPT-NeoX (its fused qkv and dense are
        biased; GPT-J's four projections are not); MLP 2hf + f + h (fc_in, fc_out with biases) or 3hf
        (LLaMA's SwiGLU, no bias); norms: two LayerNorms (GPT-2, GPT-NeoX), one (GPT-J: both branches
        read it) or two RMSNorms (LLaMA, weight only).
        """
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        attn = 2 * h * h + 2 * h * kv
        if self.family in ("gpt2", "gpt_neox"):
            attn += 2 * h + 2 * kv  # biases of q, o and k, v
        if self.family == "llama":
            return attn + 3 * h * f + 2 * h  # SwiGLU; two RMSNorms, weight only
        norms = 2 * h if self.family == "gptj" else 2 * 2 * h  # LayerNorms, weight + bias
        return attn + 2 * h * f + f + h + norms

    def param_count(self) -> int:
        """All parameters: blocks, final norm, embeddings and LM head (with GPT-J's bias) when `vocab` is set."""
        h = self.hidden
        total = self.layers * self.block_params()
        total += h if self.family == "llama" else 2 * h  # final norm
        if self.positional == "learned":
            total += self.max_positions * h
        if self.vocab:
            total += self.vocab * h
            if not self.tie_embeddings:
                total += self.vocab * h
            if self.lm_head_bias:
                total += self.vocab
        return total

    def weight_bytes(self) -> int:
        """Bytes of all parameters in `dtype`."""
        return self.param_count() * self.itemsize

    def block_matmul_flops(self) -> int:
        """MatMul FLOPs (2 per multiply-add) of one block's forward pass.

        2·B·S·(2h² + 2h·kv + m·h·f) + 4·B·S·T·h, with m = 3 (LLaMA SwiGLU) or 2 (GPT-2, GPT-J,
        GPT-NeoX: the parallel residual runs the same matmuls side by side; GPT-NeoX's fused qkv
        is one h×3h matmul, the FLOPs of three),
        kv = kv_heads·head_dim and T = context + S the keys attended to (T = S in prefill).
        The S·T term is Q·Kᵀ plus P·V over all heads (causal masking is applied by adding
        −inf, so the full S×T rectangle is computed). Grouped-query attention shares K and V
        between heads but not the FLOPs: every query head still multiplies.
        """
        b, s, h, f, kv = self.batch, self.seq, self.hidden, self.ffn, self.kv_dim
        m = 3 if self.family == "llama" else 2
        return 2 * b * s * (2 * h * h + 2 * h * kv + m * h * f) + 4 * b * s * self.total_len * h

    def matmul_flops(self) -> int:
        """MatMul FLOPs of the whole forward pass: blocks plus the LM head when present (over every
        position, or each sequence's last with ``logits`` "last")."""
        total = self.layers * self.block_matmul_flops()
        if self.vocab:
            projected = 1 if self.logits == "last" else self.seq
            total += 2 * self.batch * projected * self.hidden * self.vocab
        return total

    def kv_cache_bytes(self, context: int | None = None, itemsize: float | None = None) -> int:
        """Bytes of the KV cache holding ``context`` tokens (default: this config's context).

        2 (K and V) × layers × kv_heads × head_dim × context × bytes per element × batch;
        ``itemsize`` defaults to the model dtype's (``--kv-precision`` changes it).
        """
        ctx = self.context if context is None else context
        size = self.itemsize if itemsize is None else itemsize
        return round(2 * self.layers * self.kv_heads * self.head_dim * ctx * size * self.batch)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_params(cls, text: str) -> ModelConfig:
        """The config an export's ``dabench.params`` holds (its JSON, `to_dict` and the export's own
        keys, such as ``dynamic``, which are no field and are left out)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in fields})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)
