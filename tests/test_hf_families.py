"""Decoder families beyond GPT-2 and Llama, as Hugging Face builds them from configs (no download) and
optimum exports them (``text-generation`` and ``text-generation-with-past``), profiled with
``--batch`` and ``--seq`` (and ``--past``) alone (issue 45).

Each family differs where a frontend can trip: Phi-3 fuses q/k/v and gate/up into one projection each
and splits its heads for the rotary embedding into a rotated part and a pass-through part, which is
*empty* when the whole head rotates (``partial_rotary_factor`` = 1: a dim shape inference derives as
0, which was read as unknown, and the run asked for ``--dim unk__22=N``); Gemma has a head wider than
hidden / heads and a GeGLU MLP; Falcon runs attention and MLP in parallel with one K/V head (MQA);
BLOOM has ALiBi instead of rotary positions.

The reference: FlopCounterMode over the same forward, fed what the export takes (input ids, an
attention mask, position ids of the batch's shape), eager attention so every matmul is an aten op. A
node the tool folds at compile time (computing on constants only: Gemma's rotary angles, whose
positions the export derives from the bound sequence length) is left out of the tool's total and says
so in its note; it is added back to compare. No tolerance: the counts are equal.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch]  # Hugging Face models exported by optimum, as test_hf_export.py

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("optimum.exporters.onnx")

from dabench_ir.cli import main  # noqa: E402
from tests._helpers import trained_looking  # noqa: E402

BATCH, SEQ, PAST = 2, 16, 15
FOLDED = "folded at compile time"
FAMILIES = {  # a config of each family's own fields, small; vocab 256, 2 layers
    "phi3": {
        "model_type": "phi3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 128,
        "pad_token_id": 0,
    },
    "gemma": {
        "model_type": "gemma",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 128,
        "max_position_embeddings": 128,
    },
    "falcon": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "multi_query": True,
        "parallel_attn": True,
        "new_decoder_architecture": False,
        "alibi": False,
        "bias": False,
    },
    "bloom": {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4},
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Each family's random model (its saved folder, its parameter count and the reference FLOPs of
    one forward at BATCH x SEQ) and optimum's exports of it: ``plain`` and ``past`` (with a KV cache)."""
    from optimum.exporters.onnx import main_export
    from torch.utils.flop_counter import FlopCounterMode

    root = tmp_path_factory.mktemp("families")
    out = {}
    for family, fields in FAMILIES.items():
        fields = dict(fields)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), vocab_size=256, **fields)
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = trained_looking(transformers.AutoModelForCausalLM.from_config(config).eval())
        ids = torch.randint(0, 256, (BATCH, SEQ))
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(SEQ).expand(BATCH, SEQ))
        model.save_pretrained(root / family)
        main_export(str(root / family), output=root / f"{family}-plain", task="text-generation")
        out[family] = {
            "plain": root / f"{family}-plain" / "model.onnx",
            "params": model.num_parameters(),
            "flops": counter.get_total_flops(),
        }
        main_export(str(root / family), output=root / f"{family}-past", task="text-generation-with-past")
        out[family]["past"] = root / f"{family}-past" / "model.onnx"
    return out


def _report(argv: list[str], tmp_path, capsys) -> dict:
    out = tmp_path / "r.json"
    assert main([*argv, "-q", "--json", str(out)]) == 0, capsys.readouterr().err
    return json.loads(out.read_text())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_family_profiles_with_batch_and_seq_alone_and_counts_as_flop_counter_mode(exports, family, tmp_path, capsys):
    model = exports[family]
    argv = ["profile", str(model["plain"]), "-t", "h100", "--batch", str(BATCH), "--seq", str(SEQ)]
    report = _report(argv, tmp_path, capsys)
    folded = [n for n in report["nodes"] if n["op_type"] == "MatMul" and FOLDED in (n.get("note") or "")]
    assert all(n["contraction_flops"] == 0 for n in folded)  # at compile time: no work in the step
    head = FAMILIES[family].get("head_dim", 64 // 4)
    rotary = 2 * BATCH * SEQ * (head // 2)  # the rotary angles: inv_freq @ positions, one matmul
    assert [n["scope"] for n in folded] in ([], ["model.rotary_emb"])
    assert report["totals"]["contraction_flops"] + rotary * len(folded) == model["flops"]
    assert report["model"]["params"] == model["params"]


@pytest.mark.parametrize("target", ["wse2", "sn30", "bow", "h100"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_familys_exports_profile_on_every_target_with_the_runs_flags_alone(exports, family, target, tmp_path, capsys):
    """The plain export with --batch and --seq, the one with a KV cache with --past too. Phi-3's rotary
    split leaves a pass-through part 0 wide, which follows from the bound inputs like any derived dim."""
    plain = ["profile", str(exports[family]["plain"]), "-t", target, "--batch", str(BATCH), "--seq", str(SEQ)]
    _report(plain, tmp_path, capsys)
    cached = ["profile", str(exports[family]["past"]), "-t", target, "--batch", str(BATCH), "--seq", "1"]
    report = _report([*cached, "--past", str(PAST)], tmp_path, capsys)
    assert report["config"]["past"] == PAST


@pytest.mark.parametrize(("kind", "graph"), [("past", "kv-cache"), ("plain", "recompute")])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_on_a_familys_export(exports, family, kind, graph, tmp_path, capsys):
    """``--scenario generate`` on each family's file: with a KV cache it is its own decode step (a step
    at context C is ``--seq 1 --past C``), without one each step runs the whole sequence again."""
    path, prompt, gen = str(exports[family][kind]), 8, 4
    argv = ["profile", path, "-t", "h100", "--batch", str(BATCH), "--scenario", "generate"]
    result = _report([*argv, "--prompt", str(prompt), "--gen", str(gen)], tmp_path, capsys)
    assert result["decode_graph"] == graph
    last = result["decode"][-1]
    assert last["context"] == prompt + gen - 2
    step = ["--seq", "1", "--past", str(last["context"])] if kind == "past" else ["--seq", str(last["context"] + 1)]
    alone = _report(["profile", path, "-t", "h100", "--batch", str(BATCH), *step], tmp_path, capsys)
    assert last["time_s"] == alone["totals"]["time_s"]


@pytest.mark.parametrize("precision", ["fp16", "int8", "fp8", "w4a16"])
def test_a_family_profiles_through_linalg_at_every_import_precision_without_a_word(
    exports, precision, tmp_path, capsys
):
    """``--via mlir`` on Falcon's export at a 16-bit or quantised precision: its mask's fp32 minimum
    becomes -inf in fp16 (as ``Tensor.half()`` makes it) without a numpy overflow warning on stderr,
    and the contraction FLOPs are the ONNX path's."""
    pytest.importorskip("torch_mlir")
    argv = ["profile", str(exports["falcon"]["plain"]), "-t", "h100", "--batch", str(BATCH), "--seq", str(SEQ)]
    linalg = _report([*argv, "--via", "mlir", "--precision", precision], tmp_path, capsys)
    assert "Warning" not in capsys.readouterr().err
    onnx_path = _report([*argv, "--precision", precision], tmp_path, capsys)
    assert linalg["totals"]["contraction_flops"] == onnx_path["totals"]["contraction_flops"]
