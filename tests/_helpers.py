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


IN_BLOCK = "/layers.0/mlp/MatMul"
"""A node name whose scope is decoder block 0 (where weight quantisation applies)."""


def matmul_softmax(path, *, k: int = 8, opset: int = 17, name: str | None = None) -> str:
    """``y = Softmax(MatMul(x, W))`` with x [4, k] and W [k, 16] = arange(16 k) / 16 k, saved to ``path``:
    the MLIR precision and quantisation tests' model. ``name``: the MatMul's node name, its scope
    (`IN_BLOCK` puts it in decoder block 0)."""
    import numpy as np
    import onnx
    import onnx.parser
    from onnx import numpy_helper

    proto = onnx.parser.parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        tiny (float[4,{k}] x) => (float[4,16] y) {{
            m = MatMul(x, W)
            y = Softmax<axis = -1>(m)
        }}
        """
    )
    if name is not None:
        proto.graph.node[0].name = name
    weight = np.arange(16 * k, dtype=np.float32).reshape(k, 16) / (16 * k)
    proto.graph.initializer.append(numpy_helper.from_array(weight, "W"))
    onnx.save(proto, path)
    return str(path)


def weightless(path, *, dynamic: bool = False, **config) -> str:
    """``ModelConfig(**config)`` exported weight-free to ``path`` (``dynamic``: a symbolic batch and
    sequence); the test is skipped where torch is not installed."""
    import pytest

    pytest.importorskip("torch")
    from dabench_ir.models import ModelConfig, export_model

    export_model(ModelConfig(**config), path, weights="none", dynamic=dynamic)
    return str(path)


def seeded_small_decoders(families: tuple[str, ...] = ("gpt2", "llama")) -> list:
    """(family, model) for each family: its `small_decoder`, made `trained_looking` from seed 0. The
    test is skipped without what the exporter tests need (torch, transformers, optimum's ONNX exporter)."""
    import pytest

    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("optimum.exporters.onnx")
    out = []
    for family in families:
        torch.manual_seed(0)
        out.append((family, trained_looking(small_decoder(family))))
    return out


def cpu_target_data(threads: int | None = None) -> dict:
    """A parsed ``cpu`` target TOML with the fields the host model reads, calibrated at ``threads``
    (None: a calibration that names no thread count)."""
    rec = {"value": 1e9, "source": "test", "estimate": False}
    calibration: dict = {"ops": [{"op": "Add", "bytes": 1000, "time_s": 2e-6}]}
    if threads is not None:
        calibration["key"] = {"threads": threads}
    return {
        "name": "cpu",
        "kind": "cpu",
        "compute": {"peak_flops": {"fp32": rec}},
        "memory": [{"name": "dram", "level": "off-chip", "bandwidth_bytes_per_s": rec}],
        "overheads": {"kernel_launch_s": {"value": 1e-6, "source": "t"}},
        "calibration": calibration,
    }
