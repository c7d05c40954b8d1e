"""Hugging Face-style decoders exported by torch.onnx.export, TorchScript and dynamo, with dynamic axes
named as HF's exporters name them (``batch_size``, ``sequence_length``): ``--batch`` and ``--seq`` alone
bind them, and the dims the graph derives (TorchScript's ``unk__N`` after shape inference) follow.
The reference: the same decoder exported with static shapes at that batch and length."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # the development lane (-m "not slow") leaves it out

torch = pytest.importorskip("torch")
nn = torch.nn

from dabench_ir.pipeline import profile  # noqa: E402

AXES = {
    "input_ids": {0: "batch_size", 1: "sequence_length"},
    "attention_mask": {0: "batch_size", 1: "sequence_length"},
    "logits": {0: "batch_size", 1: "sequence_length"},
}


class _Block(nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.ln = heads, nn.LayerNorm(hidden)
        self.qkv, self.o = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x, mask):
        b, t, h = x.shape
        q, k, v = (y.view(b, t, self.heads, h // self.heads).transpose(1, 2) for y in self.qkv(self.ln(x)).split(h, -1))
        a = q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        a = a.masked_fill(~causal, float("-inf")) + (1.0 - mask[:, None, None, :].to(a.dtype)) * -1e4
        x = x + self.o((a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln(x))))


class _Decoder(nn.Module):
    """GPT-2's shape: token and learned position embeddings (positions from ``arange(seq)``), blocks, LM head."""

    def __init__(self, vocab: int = 64, hidden: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(64, hidden)
        self.layers = nn.ModuleList(_Block(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, attention_mask):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1])[None])
        for layer in self.layers:
            x = layer(x, attention_mask)
        return self.head(x)


def _export(path, batch: int, seq: int, *, dynamo: bool, dynamic: bool) -> str:
    torch.manual_seed(0)
    ids, mask = torch.zeros(batch, seq, dtype=torch.long), torch.ones(batch, seq, dtype=torch.long)
    kwargs = {"dynamo": dynamo, **({} if dynamo else {"opset_version": 17})}
    torch.onnx.export(
        _Decoder().eval(),
        (ids, mask),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamic_axes=AXES if dynamic else None,
        **kwargs,
    )
    return str(path)


@pytest.fixture(scope="module", params=[False, True], ids=["torchscript", "dynamo"])
def exports(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    dynamo = request.param
    return (
        _export(folder / "dyn.onnx", 2, 8, dynamo=dynamo, dynamic=True),
        _export(folder / "static.onnx", 3, 12, dynamo=dynamo, dynamic=False),
        "dynamo" if dynamo else "torchscript",
    )


def test_batch_and_seq_alone_bind_a_dynamic_hf_export(exports):
    dynamic, static, kind = exports
    bound = profile(dynamic, target="h100", batch=3, seq=12)
    reference = profile(static, target="h100")
    assert bound.totals["flops"] == reference.totals["flops"] > 0
    if kind == "torchscript":  # dynamo's static export folds arange(seq) into a constant
        assert bound.totals["bytes"] == reference.totals["bytes"]
    assert bound.config["dims"]["batch_size"] == 3 and bound.config["dims"]["sequence_length"] == 12


def test_the_cli_takes_batch_and_seq_alone(exports, tmp_path):
    dynamic, _, _ = exports
    done = subprocess.run(
        [sys.executable, "-m", "dabench_ir", "profile", dynamic, "-t", "h100", "--batch", "3", "--seq", "12", "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "dabench_ir", "profile", dynamic, "-t", "h100", "--batch", "3"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "--seq N" in missing.stderr and "unk__" not in missing.stderr, missing.stderr  # only the inputs' named


def test_seq_on_a_model_without_a_sequence_symbol_is_one_line(exports):
    from dabench_ir.errors import UserError

    _, static, _ = exports
    with pytest.raises(UserError, match="--seq 12: the model has no symbolic sequence length"):
        profile(static, target="h100", seq=12)
