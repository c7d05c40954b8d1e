"""MLIR export through torch-mlir's fx importer (torch and linalg-on-tensors dialects)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_mlir")

from dabench_ir.models import ModelConfig
from dabench_ir.models.export import export_model

pytestmark = [pytest.mark.slow, pytest.mark.torch]

CFG = ModelConfig(family="llama", layers=2, hidden=32, heads=4, kv_heads=2, seq=8)


def _header(text: str) -> dict[str, str]:
    return dict(line[3:].split(": ", 1) for line in text.splitlines() if line.startswith("// dabench."))


@pytest.mark.parametrize(("fmt", "marker"), [("mlir-torch", "torch.aten.mm"), ("mlir-linalg", "linalg.matmul")])
def test_weightless_mlir(tmp_path, fmt: str, marker: str) -> None:
    path = tmp_path / "m.mlir"
    result = export_model(CFG, path, format=fmt, weights="none")
    text = path.read_text()
    meta = _header(text)
    assert meta["dabench.family"] == "llama"
    assert json.loads(meta["dabench.params"])["layers"] == 2
    names = json.loads(meta["dabench.weights"])
    assert names == result.weight_names and "layers.1.attn.q_proj.weight" in names
    assert marker in text and "func.func @main" in text
    assert "dense_resource" not in text  # no weight data in a weight-free file
    # 7 projection matmuls per block (+ 2 attention batch matmuls in linalg).
    assert text.count(marker) >= 7 * CFG.layers


def test_a_small_mlir_export_keeps_its_weights_as_arguments_and_trains_as_the_onnx_export(tmp_path) -> None:
    """A model under the auto threshold was frozen into the module (random weights as constants): its
    profile counted 0 parameters. And a linalg contraction took the vector backward rule: a training
    step counted its forward contractions alone (17.4 of 52.5 MFLOP on a 2-layer GPT-2)."""
    from dabench_ir.api import profile
    from dabench_ir.errors import UserError

    cfg = ModelConfig(family="gpt2", layers=2, hidden=32, heads=4, seq=8)
    mlir, onnx_path = tmp_path / "m.mlir", tmp_path / "m.onnx"
    assert export_model(cfg, mlir, format="mlir-torch").weights == "none"  # the default, weights "auto"
    export_model(cfg, onnx_path, weights="none")
    trained = {p: profile(str(p), mode="train") for p in (mlir, onnx_path)}
    assert trained[mlir].model["params"] == trained[onnx_path].model["params"] == cfg.param_count()
    assert trained[mlir].totals["contraction_flops"] == trained[onnx_path].totals["contraction_flops"] > 0
    with pytest.raises(UserError, match="--weights random applies to ONNX"):
        export_model(cfg, tmp_path / "r.mlir", format="mlir-torch", weights="random")


def test_a_gpt2_mlir_exports_norms_and_residual_adds_have_their_blocks(tmp_path) -> None:
    """fx origins carry no layer index: a call chain that recurs the same number of times in every block
    is the blocks' in turn. GPT-2's block calls one line for both norms and one for both residual adds,
    twice a block: those 8 nodes had no layer, and the per-layer table put them outside the blocks.
    What has none now is the model's own: the embedding add, the final norm, the head."""
    from collections import Counter

    from dabench_ir.api import profile

    cfg = ModelConfig(family="gpt2", layers=2, hidden=32, heads=4, seq=8)
    path = tmp_path / "m.mlir"
    export_model(cfg, path, format="mlir-torch")
    report = profile(str(path))
    assert sum(1 for n in report.nodes if n.layer is None) == 3
    twice = [n for n in report.nodes if n.name.split("#")[0] in _lines_run_four_times(report)]
    assert len(twice) == 8 and Counter(n.layer for n in twice) == {0: 4, 1: 4}


def _lines_run_four_times(report) -> set[str]:
    """The origins (file:line) whose op runs four times in a 2-block model: twice a block."""
    from collections import Counter

    runs = Counter(n.name.split("#")[0] for n in report.nodes)
    return {line for line, count in runs.items() if count == 4}
