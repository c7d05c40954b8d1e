"""Named model shapes: published GPT-2 and LLaMA-2 sizes and the DABench sweep points.

Sources: GPT-2 sizes from Radford et al. 2019 (Table 2) and the released checkpoints'
config.json (n_embd, n_layer, n_head, n_positions 1024, vocab 50257); LLaMA-2 sizes from
Touvron et al. 2023 and the released params.json (dim, n_layers, n_heads, n_kv_heads,
ffn hidden size, vocab 32000, context 4096). The DABench points are the GPT-2-family
decoder stacks (no embedding, no head) of the DABench sweep: hidden 768/1024/1280/1600
with 12/24/36/48 layers.
"""

from __future__ import annotations

import logging
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.models.config import ModelConfig

__all__ = ["PRESETS", "describe_presets", "get_preset"]

logger = logging.getLogger(__name__)

_GPT2 = {"family": "gpt2", "vocab": 50257, "max_positions": 1024, "seq": 1024, "tie_embeddings": True}
_LLAMA2 = {"family": "llama", "vocab": 32000, "seq": 4096, "tie_embeddings": False}

PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-small": {**_GPT2, "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072},
    "gpt2-medium": {**_GPT2, "layers": 24, "hidden": 1024, "heads": 16, "ffn": 4096},
    "gpt2-large": {**_GPT2, "layers": 36, "hidden": 1280, "heads": 20, "ffn": 5120},
    "gpt2-xl": {**_GPT2, "layers": 48, "hidden": 1600, "heads": 25, "ffn": 6400},
    "llama-7b": {**_LLAMA2, "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008},
    "llama-13b": {**_LLAMA2, "layers": 40, "hidden": 5120, "heads": 40, "kv_heads": 40, "ffn": 13824},
    "llama-70b": {**_LLAMA2, "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672},
}
for _h, _l, _n in ((768, 12, 12), (1024, 24, 16), (1280, 36, 20), (1600, 48, 25)):
    PRESETS[f"dabench-gpt2-h{_h}"] = {
        "family": "gpt2", "layers": _l, "hidden": _h, "heads": _n, "ffn": 4 * _h,
        "vocab": None, "positional": "none", "seq": 1024,
    }  # fmt: skip


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset's config with `overrides` (None values ignored) applied on top."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise UserError(f"unknown preset {name!r}; see `dabench-ir export --list-presets`") from None
    params = {**base, **{k: v for k, v in overrides.items() if v is not None}, "preset": name}
    return ModelConfig(**params)


def describe_presets() -> list[str]:
    """One line per preset: name, shape and parameter count."""
    lines = []
    for name in PRESETS:
        cfg = get_preset(name)
        vocab = f"vocab {cfg.vocab}" if cfg.vocab else "no embedding/head"
        lines.append(
            f"{name:18s} {cfg.family:5s} L={cfg.layers:<3d} h={cfg.hidden:<5d} heads={cfg.heads:<3d} "
            f"kv={cfg.kv_heads:<3d} ffn={cfg.ffn:<6d} seq={cfg.seq:<5d} {vocab:18s} "
            f"{cfg.param_count() / 1e9:6.3f} B params"
        )
    return lines
