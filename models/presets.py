"""Named model shapes: published GPT-2, LLaMA-2, GPT-J and GPT-NeoX sizes and the DABench sweep points.

Sources: GPT-2 sizes from Radford et al. 2019 (Table 2) and the released checkpoints'
config.json (n_embd, n_layer, n_head, n_positions 1024, vocab 50257); LLaMA-2 sizes from
Touvron et al. 2023 and the released params.json (dim, n_layers, n_heads, n_kv_heads,
ffn hidden size, vocab 32000, context 4096). GPT-J-6B from the config.json of EleutherAI/gpt-j-6b
(n_layer 28, n_embd 4096, n_head 16, n_inner null = 4h, rotary_dim 64, n_positions 2048, vocab
50400, tie_word_embeddings false). GPT-NeoX sizes from the config.json of EleutherAI/pythia-160m,
-1.4b, -2.8b, -6.9b, -12b and EleutherAI/gpt-neox-20b (hidden_size, num_hidden_layers,
num_attention_heads, intermediate_size = 4h, rotary_pct 0.25, max_position_embeddings 2048,
use_parallel_residual true, untied; vocab 50304, 50432 (6.9b, 20b), 50688 (12b)); the 20B shape
is also transformers' `GPTNeoXConfig` default. The DABench points are the GPT-2-family
decoder stacks (no embedding, no head) of the DABench sweep: hidden 768/1024/1280/1600
with 12/24/36/48 layers.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.models.config import ModelConfig

__all__ = [
    "ALIASES",
    "PRESETS",
    "close_presets",
    "describe_presets",
    "get_preset",
    "names_preset",
    "preset_file",
    "preset_name",
    "preset_shape",
]

logger = logging.getLogger(__name__)

_GPT2 = {"family": "gpt2", "vocab": 50257, "max_positions": 1024, "seq": 1024, "tie_embeddings": True}
_LLAMA2 = {"family": "llama", "vocab": 32000, "seq": 4096, "tie_embeddings": False}
_GPTJ = {"family": "gptj", "seq": 2048, "tie_embeddings": False}  # rotary_dim: head_dim/4, 64 of 256
_NEOX = {"family": "gpt_neox", "seq": 2048, "tie_embeddings": False}  # rotary_pct 0.25: head_dim/4


class _Presets(dict):
    """The presets by canonical name; ``in`` and ``[]`` also answer to an alias (`ALIASES`, any case),
    so every reader of a preset name (export, sweep specs, --scenario's MODEL) takes the same names.
    Iterating gives the canonical names only."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and preset_name(name) is not None

    def __getitem__(self, name: str) -> dict[str, Any]:
        return super().__getitem__(preset_name(name) or name)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[name] if name in self else default  # noqa: SIM401 (self.get is this method)


PRESETS: dict[str, dict[str, Any]] = _Presets(
    {
        "gpt2-small": {**_GPT2, "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072},
        "gpt2-medium": {**_GPT2, "layers": 24, "hidden": 1024, "heads": 16, "ffn": 4096},
        "gpt2-large": {**_GPT2, "layers": 36, "hidden": 1280, "heads": 20, "ffn": 5120},
        "gpt2-xl": {**_GPT2, "layers": 48, "hidden": 1600, "heads": 25, "ffn": 6400},
        "llama-7b": {**_LLAMA2, "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008},
        "llama-13b": {**_LLAMA2, "layers": 40, "hidden": 5120, "heads": 40, "kv_heads": 40, "ffn": 13824},
        "llama-70b": {**_LLAMA2, "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672},
        "gpt-j-6b": {
            **_GPTJ,
            "layers": 28,
            "hidden": 4096,
            "heads": 16,
            "ffn": 16384,
            "rotary_dim": 64,
            "vocab": 50400,
        },
        "pythia-160m": {**_NEOX, "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 50304},
        "pythia-1.4b": {**_NEOX, "layers": 24, "hidden": 2048, "heads": 16, "ffn": 8192, "vocab": 50304},
        "pythia-2.8b": {**_NEOX, "layers": 32, "hidden": 2560, "heads": 32, "ffn": 10240, "vocab": 50304},
        "pythia-6.9b": {**_NEOX, "layers": 32, "hidden": 4096, "heads": 32, "ffn": 16384, "vocab": 50432},
        "pythia-12b": {**_NEOX, "layers": 36, "hidden": 5120, "heads": 40, "ffn": 20480, "vocab": 50688},
        "gpt-neox-20b": {**_NEOX, "layers": 44, "hidden": 6144, "heads": 64, "ffn": 24576, "vocab": 50432},
    }
)
for _h, _l, _n in ((768, 12, 12), (1024, 24, 16), (1280, 36, 20), (1600, 48, 25)):
    PRESETS[f"dabench-gpt2-h{_h}"] = {
        "family": "gpt2",
        "layers": _l,
        "hidden": _h,
        "heads": _n,
        "ffn": 4 * _h,
        "vocab": None,
        "positional": "none",
        "seq": 1024,
    }


ALIASES: dict[str, str] = {
    "gpt2": "gpt2-small",  # the Hugging Face checkpoint names: gpt2 is the 124 M model
    "llama": "llama-7b",
    "llama2": "llama-7b",  # a family alone: its smallest size
    **{f"{prefix}-{size}": f"llama-{size}" for prefix in ("llama2", "llama-2") for size in ("7b", "13b", "70b")},
    "gptj": "gpt-j-6b",
    "gpt-j": "gpt-j-6b",
    "gptj-6b": "gpt-j-6b",
    "pythia": "pythia-160m",
    "gpt-neox": "gpt-neox-20b",
    "gpt_neox": "gpt-neox-20b",
}
"""Other names of presets (lower case): a family's name alone, and the released checkpoints' spellings."""


def preset_name(name: str) -> str | None:
    """The canonical name of preset ``name`` (itself, or what the alias stands for; any case), or None."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if dict.__contains__(PRESETS, key) else None


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset's config with `overrides` (None values ignored) applied on top; ``name`` may be an alias
    (the config records the canonical name)."""
    canonical = preset_name(name)
    if canonical is None:
        raise UserError(f"unknown preset {name!r}; see `dabench-ir export --list-presets`")
    params = {**PRESETS[canonical], **{k: v for k, v in overrides.items() if v is not None}, "preset": canonical}
    return ModelConfig(**params)


def close_presets(name: str) -> str:
    """The presets (and aliases) spelt like ``name``, for a one-line refusal: ``close presets: a, b``,
    or every preset when none is close."""
    names = [*PRESETS, *ALIASES]
    near = difflib.get_close_matches(name.strip().lower(), names, n=4, cutoff=0.5)
    return f"close presets: {', '.join(near)}" if near else f"presets: {', '.join(PRESETS)}"


def preset_shape(name: str) -> dict[str, int]:
    """The batch and sequence length preset ``name`` runs at unless the run binds them (``--batch``,
    ``--seq``): the symbols of its export (`preset_file`) by name."""
    cfg = get_preset(name)
    return {"batch": cfg.batch, "seq": cfg.seq}


def names_preset(model: str) -> bool:
    """Whether MODEL, a name that is no file, is a preset; a name that is neither is one line naming the
    close presets (a name ending .onnx or .mlir is left to the file check: False)."""
    if preset_name(model) is not None:
        return True
    if not model.endswith((".onnx", ".mlir")):
        raise UserError(f"MODEL {model}: no such file, and not a preset ({close_presets(model)})")
    return False


_EXPORT_VERSION = "1"  # bump when a preset's export changes, to invalidate cached ones


def preset_file(name: str, folder: Path | None = None) -> Path:
    """The ONNX file of preset ``name``: weight-free, batch and seq symbolic (``--batch``/``--seq`` bind
    them), exported once with torch (blocks stamped) and kept in ``folder`` (`cached_export`)."""
    return cached_export(get_preset(name), folder, what=f"MODEL {name}")


def cached_export(cfg: ModelConfig, folder: Path | None = None, *, what: str = "the model") -> Path:
    """The weight-free dynamic export of ``cfg``, made once with torch and kept in ``folder`` (default:
    the per-machine cache, ``$DABENCH_IR_CACHE`` or ``~/.cache/dabench-ir``, under ``presets/``),
    keyed by the whole configuration, the tool's version and the export's. A damaged cached file is
    exported again (`dabench_ir.sweep.graphs.load_base`, the sweeps' cache of exports)."""
    from dabench_ir import __version__
    from dabench_ir.sweep.graphs import load_base, save_base

    if folder is None:
        from dabench_ir.execute.calibrate import cache_dir

        folder = cache_dir() / "presets"
    text = json.dumps({"cfg": cfg.to_dict(), "v": __version__, "export": _EXPORT_VERSION}, sort_keys=True)
    where = folder / hashlib.sha256(text.encode()).hexdigest()[:12]
    name = cfg.preset or "model"  # the file keeps the preset's name
    if load_base(where, name) is None:
        from dabench_ir.models.export import export_onnx, require_exporter

        require_exporter(f"{what}: exporting the model")

        logger.info("exporting %s (weight-free, once; cached in %s)", cfg.preset or "the model", where)
        save_base(where, name, export_onnx(cfg, weights="none", dynamic=True).SerializeToString())
    return where / f"{name}.onnx"


def describe_presets() -> list[str]:
    """One line per preset: name, shape and parameter count."""
    lines = []
    for name in PRESETS:
        cfg = get_preset(name)
        vocab = f"vocab {cfg.vocab}" if cfg.vocab else "no embedding/head"
        lines.append(
            f"{name:18s} {cfg.family:8s} L={cfg.layers:<3d} h={cfg.hidden:<5d} heads={cfg.heads:<3d} "
            f"kv={cfg.kv_heads:<3d} ffn={cfg.ffn:<6d} seq={cfg.seq:<5d} {vocab:18s} "
            f"{cfg.param_count() / 1e9:6.3f} B params"
        )
    lines.append("aliases: " + ", ".join(f"{alias} = {name}" for alias, name in ALIASES.items()))
    return lines
