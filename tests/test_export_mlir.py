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
