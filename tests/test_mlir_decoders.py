"""Instrumented MLIR pipelines on real decoders: a LLaMA block (models/: RMSNorm, RoPE, GQA, SwiGLU) and
an HF-style LLaMA decoder (execute/hostmodels.py), both exported to ONNX and imported by torch-mlir's ONNX
importer, through `linalg-fuse-elementwise-ops,canonicalize,cse`, placed on RDU, WSE and IPU."""

from __future__ import annotations

import json
from collections import Counter

import onnx
import pytest

pytest.importorskip("torch_mlir")
pytest.importorskip("torch")

from dabench_ir.cli import main
from dabench_ir.frontends.onnx import load_onnx

pytestmark = [pytest.mark.slow, pytest.mark.torch]

PIPELINE = "linalg-fuse-elementwise-ops,canonicalize,cse"


@pytest.fixture(scope="module", params=["llama-block", "hf-llama"])
def decoder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    if request.param == "llama-block":
        from dabench_ir.models import ModelConfig, export_model

        export_model(ModelConfig(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, seq=8), path)
    else:
        from dabench_ir.execute.hostmodels import HostModel, export_host_model

        cfg = HostModel(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, seq=8, vocab=64)
        onnx.save(export_host_model(cfg), path)
    return path


def test_a_decoder_through_an_mlir_pipeline_on_rdu_wse_and_ipu(decoder, tmp_path):
    out = tmp_path / "s.json"
    argv = [
        "study",
        str(decoder),
        "--via",
        "mlir",
        "--mlir-pipeline",
        PIPELINE,
        "--target",
        "rdu,wse,ipu",
        "--json",
        str(out),
        "-q",
    ]
    assert main(argv) == 0
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 3 and len({r["target"] for r in runs}) == 3
    layer = {n.name: n.layer for n in load_onnx(decoder).nodes}
    for run in runs:
        t = run["totals"]
        # every op of the lowered module in exactly one row of the placed diff
        rows = Counter(m for r in run["nodes"] for m in r["replaces"])
        assert set(rows.values()) == {1} and len(rows) == t["nodes_before"] == t["source_nodes_accounted"]
        assert t["nodes_after"] < t["nodes_before"]  # elementwise chains fused into one unit each
        fuse, _, cse = run["mlir"]["steps"]
        assert fuse["delta"]["contraction_flops"] == 0 and fuse["delta"]["bytes_read"] < 0
        assert fuse["removed"] == 0 and cse["delta"]["ops"] == 0
        nodes = run["mlir"]["nodes"]
        assert sum(r["bytes_after"] for r in nodes) == cse["after"]["bytes_read"] + cse["after"]["bytes_written"]
        for r in nodes:  # a fused op names nodes of one decoder block only
            layers = {layer.get(n) for n in [r["node"], *r["shared_with"]]} - {None}
            assert len(layers) <= 1, (r["node"], r["shared_with"])
        fused = {frozenset([r["node"], *r["shared_with"]]) for r in nodes if r["shared_with"]}
        # RMSNorm (mean of squares, + eps, rsqrt) and the SwiGLU gate (sigmoid, x * sigmoid, * up) fuse per block
        assert sum(1 for g in fused if any("rsqrt" in n for n in g) and any("mean" in n for n in g)) >= 4
        assert sum(1 for g in fused if any("sigmoid" in n.lower() for n in g)) >= 2
