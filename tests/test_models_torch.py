"""Torch modules: parameter counts against the closed form, scopes, FLOPs (FlopCounterMode)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from dabench_ir.models import PRESETS, ModelConfig, build_model, get_preset  # noqa: E402

TINY = [
    ModelConfig(family="gpt2", layers=2, hidden=32, heads=4, seq=8, batch=2),
    ModelConfig(family="gpt2", layers=2, hidden=32, heads=4, seq=8, vocab=50, positional="none"),
    ModelConfig(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, seq=8, batch=2),
    ModelConfig(family="llama", layers=2, hidden=64, heads=8, kv_heads=8, ffn=160, seq=8, vocab=50),
]


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() counts tied weights once


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_module_matches_closed_form(name: str) -> None:
    cfg = get_preset(name)
    model = build_model(cfg, device="meta")
    assert _numel(model) == cfg.param_count()
    assert len(model.layers) == cfg.layers


@pytest.mark.parametrize("cfg", TINY, ids=lambda c: f"{c.family}-v{c.vocab}")
def test_tiny_module_counts_and_flops(cfg: ModelConfig) -> None:
    model = build_model(cfg)
    assert _numel(model) == cfg.param_count()
    x = torch.zeros(cfg.batch, cfg.seq, dtype=torch.int64) if cfg.vocab else torch.randn(cfg.batch, cfg.seq, cfg.hidden)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        out = model(x)
    assert out.shape == (cfg.batch, cfg.seq, cfg.vocab or cfg.hidden)
    assert counter.get_total_flops() == cfg.matmul_flops()


def test_module_names_give_layer_scopes() -> None:
    names = {n for n, _ in build_model(TINY[2], device="meta").named_modules()}
    assert {"layers.1.attn.q_proj", "layers.1.attn.k_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.down_proj"} <= names
    names = {n for n, _ in build_model(TINY[0], device="meta").named_modules()}
    assert {"layers.1.attn.o_proj", "layers.0.mlp.fc_in", "layers.0.attn_norm", "pos_embed"} <= names


def test_gqa_matches_repeated_kv_mha() -> None:
    """GQA with kv_heads=2 equals MHA whose K/V weights repeat each KV head's rows."""
    gqa = ModelConfig(family="llama", layers=1, hidden=32, heads=4, kv_heads=2, seq=8)
    mha = gqa.replace(kv_heads=4)
    a, b = build_model(gqa), build_model(mha)
    state = a.state_dict()
    for key in ("layers.0.attn.k_proj.weight", "layers.0.attn.v_proj.weight"):
        state[key] = state[key].view(2, 1, 8, 32).expand(2, 2, 8, 32).reshape(32, 32)
    b.load_state_dict(state)
    x = torch.randn(1, 8, 32)
    torch.testing.assert_close(a(x), b(x))


@pytest.mark.parametrize("family", ["gpt2", "llama", "gptj"])
def test_last_logits_project_only_each_sequences_last_position(family: str) -> None:
    """``logits="last"`` (a serving engine's prefill): the LM head reads each sequence's last position
    only, so its FLOPs are 2·B·h·V instead of 2·B·S·h·V (FlopCounterMode against the closed form), and
    the logits it gives are the plain forward's last row."""
    cfg = ModelConfig(family=family, layers=2, hidden=64, heads=4, seq=8, batch=2, vocab=50)
    last = cfg.replace(logits="last")
    assert cfg.matmul_flops() - last.matmul_flops() == 2 * cfg.batch * (cfg.seq - 1) * cfg.hidden * cfg.vocab
    x = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    every, only = build_model(cfg, seed=0), build_model(last, seed=0)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        out = only(x)
    assert out.shape == (cfg.batch, 1, cfg.vocab)
    assert counter.get_total_flops() == last.matmul_flops()
    with torch.no_grad():
        torch.testing.assert_close(out, every(x)[:, -1:, :])


def test_logits_takes_all_or_last() -> None:
    from dabench_ir.errors import UserError

    with pytest.raises(UserError, match="logits must be one of all, last"):
        ModelConfig(family="gpt2", layers=1, hidden=32, heads=4, vocab=50, logits="first")
    with pytest.raises(UserError, match="without --vocab has none"):
        ModelConfig(family="gpt2", layers=1, hidden=32, heads=4, logits="last")
