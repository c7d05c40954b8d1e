"""ModelConfig validation, presets and closed-form parameter counts (no torch needed)."""

from __future__ import annotations

import pytest

from dabench_ir.errors import UserError
from dabench_ir.models import PRESETS, ModelConfig, get_preset

# Published totals: GPT-2 (tied LM head, 1024 learned positions), LLaMA-2 (untied head), GPT-J and GPT-NeoX.
PUBLISHED = {
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
    "llama-70b": 68_976_648_192,
    # Pythia (Biderman et al. 2023, Table 1 "total params") and GPT-NeoX-20B (Black et al. 2022); each
    # equals transformers' num_parameters() of the checkpoint's config.json (checked on the meta device
    # when this was written). GPT-J-6B: the same count of its config.json (vocab 50400); its model
    # card's 6,053,381,344 is 2,498,560 more, a count from the original JAX code not reconstructed here.
    "gpt-j-6b": 6_050_882_784,
    "pythia-160m": 162_322_944,
    "pythia-1.4b": 1_414_647_808,
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
    "pythia-12b": 11_846_072_320,
    "gpt-neox-20b": 20_554_567_680,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name: str) -> None:
    assert get_preset(name).param_count() == PUBLISHED[name]


def test_llama2_7b_shape() -> None:
    cfg = get_preset("llama-7b")
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab) == (4096, 32, 32, 32, 11008, 32000)
    assert round(cfg.param_count() / 1e9, 2) == 6.74


def test_llama2_70b_is_gqa() -> None:
    cfg = get_preset("llama-70b")
    assert (cfg.heads, cfg.kv_heads, cfg.kv_dim, cfg.ffn) == (64, 8, 1024, 28672)


@pytest.mark.parametrize(("hidden", "layers"), [(768, 12), (1024, 24), (1280, 36), (1600, 48)])
def test_dabench_sweep_points(hidden: int, layers: int) -> None:
    cfg = get_preset(f"dabench-gpt2-h{hidden}")
    assert (cfg.family, cfg.hidden, cfg.layers, cfg.ffn, cfg.vocab) == ("gpt2", hidden, layers, 4 * hidden, None)
    # Stack only: L blocks of 12h² + 13h parameters, plus the final LayerNorm.
    assert cfg.param_count() == layers * (12 * hidden**2 + 13 * hidden) + 2 * hidden


def test_every_preset_is_valid() -> None:
    for name in PRESETS:
        assert get_preset(name).preset == name


def test_preset_overrides() -> None:
    cfg = get_preset("llama-7b", layers=2, seq=16, batch=None)
    assert (cfg.layers, cfg.seq, cfg.batch, cfg.hidden) == (2, 16, 1, 4096)


@pytest.mark.parametrize(
    ("changes", "word"),
    [
        ({"hidden": 100, "heads": 3}, "hidden"),
        ({"heads": 4, "kv_heads": 3}, "kv_heads"),
        ({"layers": 0}, "layers"),
        ({"seq": -1}, "seq"),
        ({"ffn": 0}, "ffn"),
        ({"vocab": -5}, "vocab"),
        ({"family": "bert"}, "family"),
        ({"dtype": "fp64"}, "dtype"),
    ],
)
def test_invalid_combinations_raise_user_error(changes: dict, word: str) -> None:
    with pytest.raises(UserError, match=word):
        ModelConfig(**{"family": "llama", "hidden": 64, "heads": 4, **changes})


def test_unknown_preset() -> None:
    with pytest.raises(UserError, match="unknown preset"):
        get_preset("llama-9000b")


def test_closed_form_block_flops() -> None:
    # GPT-2 MHA: 2·B·S·(4h² + 2h·ffn) + 4·B·S²·h
    g = ModelConfig(family="gpt2", hidden=64, heads=4, seq=8, batch=2)
    b, s, h, f = 2, 8, 64, 256
    assert g.block_matmul_flops() == 2 * b * s * (4 * h * h + 2 * h * f) + 4 * b * s * s * h
    # LLaMA GQA SwiGLU: 2·B·S·(2h² + 2h·kv + 3h·ffn) + 4·B·S²·h
    m = ModelConfig(family="llama", hidden=64, heads=4, kv_heads=2, ffn=96, seq=8, batch=2)
    assert m.block_matmul_flops() == 2 * b * s * (2 * h * h + 2 * h * 32 + 3 * h * 96) + 4 * b * s * s * h
