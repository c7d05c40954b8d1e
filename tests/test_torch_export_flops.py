"""A torch-exported 2-layer GPT-2-style stack: MatMul FLOPs equal FlopCounterMode, layers tagged."""

from __future__ import annotations

import contextlib
import io

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dabench_ir.passes import meta  # noqa: E402
from dabench_ir.pipeline import analyze  # noqa: E402

H, HEADS, SEQ, BATCH, LAYERS = 32, 4, 8, 2, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(H, 3 * H)
        self.proj = nn.Linear(H, H)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(H, dim=-1)
        q, k, v = (t.view(b, s, HEADS, H // HEADS).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / (H // HEADS) ** 0.5
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((probs @ v).transpose(1, 2).reshape(b, s, H))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(H)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(H)
        self.fc = nn.Linear(H, 4 * H)
        self.out = nn.Linear(4 * H, H)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.out(nn.functional.gelu(self.fc(self.ln_2(x))))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = Stack().eval()
    with torch.no_grad():  # distinct values: the exporter's optimiser merges identical initializers
        for param in model.parameters():
            param.normal_()
    x = torch.randn(BATCH, SEQ, H)
    path = tmp_path_factory.mktemp("gpt2") / "stack.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(model, (x,), str(path), dynamo=True, verbose=False)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(x)
    return path, counter.get_total_flops()


def test_contraction_flops_equal_flop_counter_mode(exported):
    path, torch_flops = exported
    graph = analyze(path)
    matmul_flops = sum(meta.get_cost(n).contraction_flops for n in graph.nodes if meta.get_cost(n) is not None)
    assert matmul_flops == torch_flops
    # and the closed form: 2·B·S·(3h² + h² + 8h²) + 2·2·B·S²·h per layer
    per_layer = 2 * BATCH * SEQ * (12 * H * H) + 4 * BATCH * SEQ * SEQ * H
    assert matmul_flops == LAYERS * per_layer


def test_every_costed_node_is_tagged_with_its_layer(exported):
    path, _ = exported
    graph = analyze(path)
    assert graph.layers == [0, 1]
    for node in graph.nodes:
        if meta.get_cost(node) is not None and meta.get_cost(node).flops:
            assert node.layer in (0, 1), node
            assert node.scope.startswith(f"layers.{node.layer}"), node.scope
    contractions = [n for n in graph.nodes if n.op_type == "MatMul"]
    assert sum(n.layer == 0 for n in contractions) == sum(n.layer == 1 for n in contractions)


def test_weights_recognised_from_the_exporter_signature(exported):
    path, _ = exported
    graph = analyze(path)
    expected = sum(p.numel() for p in Stack().parameters())
    assert graph.num_params == expected
    assert all(meta.UNATTRIBUTED not in n.meta for n in graph.nodes)


def test_training_is_exactly_three_times_forward_contraction(exported):
    from dabench_ir.passes.training import TrainingPass

    path, torch_flops = exported
    graph = analyze(path)
    TrainingPass()(graph)
    train = sum(meta.get_cost(n).contraction_flops for n in graph.nodes if meta.get_cost(n) is not None)
    # every block starts with a LayerNorm that has weights, so every matmul operand needs a
    # gradient: dX and dW each cost one forward contraction
    assert train == 3 * torch_flops
