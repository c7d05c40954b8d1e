"""Known deployments: real configurations that must fit, or must not, each with its source.

Models are weight-free exports of one block stamped to the full depth (`dabench_ir.sweep.graphs`),
so the whole table runs in seconds. Each row says what was deployed, on what, and where it
is documented; the assertion is only fit / no fit (throughput checks live in validate).
"""

from __future__ import annotations

import functools

import pytest

from dabench_ir.targets import load_target

pytest.importorskip("torch")

_LLAMA7B = dict(family="llama", hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)
_LLAMA70B = dict(family="llama", hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000)
_GPT2S = dict(family="gpt2", hidden=768, heads=12, ffn=3072, vocab=50257)
# MPT-7B (MosaicML 2023, mosaicml/mpt-7b config.json): GPT-style, d_model 4096, 32 heads, 32 layers, 4x GELU MLP,
# vocab 50432, ALiBi (no position table), LayerNorm
_MPT7B = dict(family="gpt2", hidden=4096, heads=32, ffn=16384, vocab=50432, positional="none", max_positions=2048)


@functools.cache
def _base(shape: tuple, seq: int, batch: int) -> bytes:
    from dabench_ir.sweep import graphs

    return graphs.export_base(dict(dict(shape), layers=1, seq=seq, batch=batch))


def _fits(shape, layers, seq, batch, target_name, *, chips=1, strategy=None, **knobs) -> tuple[bool, object]:
    """The fit verdict of the deployment, asked as any command asks it: one resolved run, one execution."""
    from dabench_ir.run import execute, resolve
    from dabench_ir.sweep import graphs

    g = graphs.build_graph(_base(tuple(sorted(shape.items())), seq, batch), layers)
    run = resolve(g, load_target(target_name), {**knobs, "chips": chips, "strategy": strategy})
    report = execute(run, g)
    return report.fits, report.failure


DEPLOYMENTS = [
    # (id, model shape, layers, seq, batch, target, chips, strategy, knobs, fits, source)
    (
        "llama2-7b-bf16-inference-1xA100-80GB",
        _LLAMA7B,
        32,
        2048,
        1,
        "a100",
        1,
        None,
        {},
        True,
        "Touvron et al. 2023 (LLaMA 2) / Hugging Face TGI and vLLM: the 7B model (13.5 GB in bf16) is served on one "
        "80 GB A100",
    ),
    (
        "llama2-70b-bf16-inference-1xA100-80GB",
        _LLAMA70B,
        80,
        2048,
        1,
        "a100",
        1,
        None,
        {},
        False,
        "138 GB of bf16 weights alone exceed one 80 GB GPU (Touvron et al. 2023, 70B parameters x 2 B)",
    ),
    (
        "llama2-70b-bf16-inference-TP4-A100-80GB",
        _LLAMA70B,
        80,
        2048,
        1,
        "a100",
        4,
        "tp",
        {},
        True,
        "vLLM / TGI documentation: Llama-2-70B served with --tensor-parallel-size 4 on 4 x A100 80GB",
    ),
    (
        "mpt-7b-train-FSDP-8xA100-80GB-mb6-seq2048",
        _MPT7B,
        32,
        2048,
        6,
        "a100",
        8,
        "dp",
        {"mode": "train", "zero": 3},
        True,
        "MosaicML llm-foundry benchmarks (scripts/train/benchmarking/README.md): MPT-7B, seq 2048, micro-batch 6 per "
        "GPU, FSDP FULL_SHARD on 8 x A100 80GB, bf16 mixed precision, FlashAttention",
    ),
    (
        "mpt-7b-train-DDP-8xA100-80GB-mb6-seq2048",
        _MPT7B,
        32,
        2048,
        6,
        "a100",
        8,
        "dp",
        {"mode": "train", "zero": 0},
        False,
        "without sharding every GPU holds 16 B/parameter of weights, gradients and Adam state: 108 GB > 80 GB "
        "(Rajbhandari et al., ZeRO, SC'20, section 3.1)",
    ),
    (
        "gpt2-small-train-1xA100-80GB-b64-seq1024",
        _GPT2S,
        12,
        1024,
        64,
        "a100",
        1,
        None,
        {"mode": "train"},
        True,
        "karpathy/llm.c discussion #481 (reproducing GPT-2 124M): micro-batch 64 x 1024 tokens per A100 80GB, bf16, "
        "FlashAttention (cuDNN)",
    ),
    (
        "gpt2-small-train-4xBow-0/4/4/4",
        _GPT2S,
        12,
        1024,
        64,
        "bow",
        1,
        None,
        {
            "mode": "train",
            "precision": "mixed",
            "recompute": "full",
            "micro_batches": 64,
            "layers_per_ipu": "0,4,4,4",
            "matmul_proportion": "0.15",
            "replicas": 4,
        },
        True,
        "graphcore/examples nlp/gpt2/pytorch pretraining_small.sh: GPT-2 small on 4 IPUs, layers 0/4/4/4, recompute, "
        "matmul proportion 0.15, replicated tensor sharding",
    ),
]


@pytest.mark.parametrize(
    ("shape", "layers", "seq", "batch", "target", "chips", "strategy", "knobs", "expected", "source"),
    [pytest.param(*row[1:], id=row[0]) for row in DEPLOYMENTS],
)
def test_known_deployment(shape, layers, seq, batch, target, chips, strategy, knobs, expected, source):
    assert source
    fits, failure = _fits(shape, layers, seq, batch, target, chips=chips, strategy=strategy, **knobs)
    assert fits is expected, failure
