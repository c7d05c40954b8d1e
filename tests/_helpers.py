"""Helpers that several test modules call and that are no fixture: Hugging Face reference models and
one-finding studies."""

from __future__ import annotations

_HF_CLASSES = {  # family: transformers' config class and causal-LM class
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "gptj": ("GPTJConfig", "GPTJForCausalLM"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
}
_FFN_FIELD = {"gpt2": "n_inner", "gptj": "n_inner"}  # the others' is intermediate_size


def hf_causal_lm(family: str, *, layers: int, hidden: int, heads: int, vocab: int, positions: int, **fields):
    """transformers' causal LM of ``family`` at these sizes, randomly initialised (no download).

    The sizes go by transformers' common names, which its ``attribute_map`` turns into GPT-2's and
    GPT-J's own (``n_layer``, ``n_embd``, ``n_head``, ``n_positions``); ``ffn`` is the MLP width under the
    family's name for it; every other field of ``fields`` is the family's config field as it is."""
    import transformers

    config_class, model_class = _HF_CLASSES[family]
    if "ffn" in fields:
        fields[_FFN_FIELD.get(family, "intermediate_size")] = fields.pop("ffn")
    config = getattr(transformers, config_class)(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=positions,
        **fields,
    )
    return getattr(transformers, model_class)(config)


def trained_looking(model):
    """``model`` with every parameter redrawn from N(0, 0.02) from torch's current seed, in place:
    distinct values, as a trained model has (an exporter stores equal tensors, such as zero biases,
    once). Returns the model."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    return model


SMALL = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 2048, "positions": 512}
"""The small decoder the exporter tests build (`small_decoder`): its sizes by hf_causal_lm's names."""
SMALL_KV_HEADS, SMALL_FFN = 2, 688  # Llama's grouped K/V heads and MLP width; GPT-2: all heads, 4 x hidden


def small_decoder(family: str):
    """A random-initialised HF GPT-2 or Llama of the `SMALL` sizes (Llama with grouped-query attention)."""
    gqa = {"num_key_value_heads": SMALL_KV_HEADS, "ffn": SMALL_FFN} if family == "llama" else {}
    return hf_causal_lm(family, **SMALL, **gqa)


def one_finding_study(defaults: dict, axes: dict, **finding) -> dict:
    """A study, as its TOML file reads, of one experiment ``e`` (``defaults``, ``axes``) and one finding ``x``:
    layers 2 over layers 1 against a paper's 0.5, each field as ``finding`` gives it instead (None: left out)."""
    base = {
        "id": "x",
        "experiment": "e",
        "claim": "c",
        "kind": "ratio",
        "numerator": {"layers": 2},
        "denominator": {"layers": 1},
        "paper": 0.5,
    }
    base.update(finding)
    return {
        "name": "t",
        "experiment": {"e": {"defaults": defaults, "axes": axes}},
        "finding": [{k: v for k, v in base.items() if v is not None}],
    }
