"""Real Hugging Face decoders (GPT-2, Llama with grouped-query attention) built from configs (no
download) and exported with their KV cache by optimum (``text-generation-with-past``): ``--batch``,
``--seq`` and ``--past`` alone bind them on every target; the attention mask's ``past_sequence_length
+ sequence_length`` follows from its parts, and the dims shape inference names (``unk__N``) from the
bound inputs. The reference: the closed-form contraction FLOPs of one decode step."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("optimum.exporters.onnx")

from dabench_ir.cli import main  # noqa: E402

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, POSITIONS = 2, 64, 4, 2, 128, 256, 128
PAST, SEQ = 31, 1
PARAMS: dict[str, int] = {}  # each model's own count (transformers' num_parameters)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """optimum's with-past exports of a random GPT-2 and a random Llama (GQA: 4 heads, 2 KV heads)."""
    from optimum.exporters.onnx import main_export

    root = tmp_path_factory.mktemp("hf")
    models = {
        "gpt2": transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, n_positions=POSITIONS, vocab_size=VOCAB
            )
        ),
        "llama": transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                num_hidden_layers=LAYERS,
                hidden_size=HIDDEN,
                num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS,
                intermediate_size=FFN,
                vocab_size=VOCAB,
                max_position_embeddings=POSITIONS,
            )
        ),
    }
    out = {}
    for name, model in models.items():
        with torch.no_grad():  # trained-looking values: the exporter stores equal tensors (zero biases) once
            for param in model.parameters():
                param.normal_(0.0, 0.02)
        model.save_pretrained(root / name)
        PARAMS[name] = model.num_parameters()  # the tied embedding and LM head once
        main_export(str(root / name), output=root / f"{name}-past", task="text-generation-with-past")
        out[name] = root / f"{name}-past" / "model.onnx"
    return out


def _decode_contraction_flops(family: str) -> int:
    """One decode step (SEQ new tokens over PAST cached ones): 2 FLOPs per weight of every matmul the
    token passes, plus the scores and the weighted values over all PAST + SEQ positions."""
    head = HIDDEN // HEADS
    kv = KV_HEADS * head if family == "llama" else HIDDEN
    per_layer = HIDDEN * HIDDEN * 2 + 2 * HIDDEN * kv  # q, o and k, v projections
    per_layer += 3 * HIDDEN * FFN if family == "llama" else 2 * HIDDEN * 4 * HIDDEN  # SwiGLU or GELU MLP
    weights = LAYERS * per_layer + HIDDEN * VOCAB  # the LM head
    attention = LAYERS * 2 * (2 * SEQ * (PAST + SEQ) * HIDDEN)  # scores and values, every head
    rotary = 2 * (head // 2) * SEQ if family == "llama" else 0  # HF's rotary angles: inv_freq @ position_ids
    return SEQ * 2 * weights + attention + rotary


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("target", ["wse2", "sn30", "bow", "h100"])
def test_a_kv_cache_export_profiles_with_batch_seq_and_past(exports, family, target, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["profile", str(exports[family]), "-t", target, "--batch", "1", "--seq", str(SEQ), "--past", str(PAST)]
    assert main([*argv, "-q", "--json", str(out)]) == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["totals"]["contraction_flops"] == _decode_contraction_flops(family)
    assert report["config"]["past"] == PAST
    # GPT-2's LM head is the embedding (tied): the export holds it again as its transpose, one parameter
    assert report["model"]["params"] == PARAMS[family]


def test_a_combined_dim_follows_from_its_parts_and_a_contradiction_is_refused(exports, capsys):
    path = str(exports["gpt2"])
    mask = "past_sequence_length + sequence_length"
    argv = ["profile", path, "-t", "rdu", "--batch", "1", "--seq", "1", "--past", "31", "-q"]
    assert main([*argv, "--dim", f"{mask}=40"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--dim {mask}=40 disagrees with its parts (= 32)" in err
    assert main([*argv, "--dim", f"{mask}=32", "--json", "-"]) == 0


def test_past_on_a_model_without_a_cache_is_refused(tmp_path, capsys):
    from dabench_ir.models import ModelConfig, export_model

    path = tmp_path / "g.onnx"
    export_model(ModelConfig(family="gpt2", layers=1, hidden=32, heads=2, seq=8, vocab=16), path, weights="none")
    assert main(["profile", str(path), "-t", "rdu", "--past", "8", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--past 8: the model has no KV-cache input" in err


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_kv_cache_export_profiles_through_linalg_too(exports, family, tmp_path, capsys):
    """``--via mlir`` on the same TorchScript export: the shape arithmetic folded with the dims bound, so
    torch-mlir imports static types; the linalg counts give the closed form's contraction FLOPs."""
    pytest.importorskip("torch_mlir")
    out = tmp_path / "r.json"
    argv = ["profile", str(exports[family]), "-t", "rdu", "--via", "mlir", "--batch", "1", "--seq", str(SEQ)]
    assert main([*argv, "--past", str(PAST), "-q", "--json", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["totals"]["contraction_flops"] == _decode_contraction_flops(family)
