"""ONNX export: validity, metadata, onnxruntime parity, stamping equivalence, scopes, FLOPs."""

from __future__ import annotations

import ast
import json
import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

import numpy as np  # noqa: E402

from dabench_ir.errors import UserError  # noqa: E402
from dabench_ir.models import ModelConfig, build_model  # noqa: E402
from dabench_ir.models.export import export_model, export_onnx  # noqa: E402
from dabench_ir.passes.cost_rules import registered_ops  # noqa: E402

# Each module run exports ~8 tiny models with torch (a few seconds each).
pytestmark = [pytest.mark.slow, pytest.mark.torch]


GPT2 = ModelConfig(family="gpt2", layers=2, hidden=32, heads=4, seq=8, batch=2, vocab=50)
LLAMA = ModelConfig(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, seq=8, batch=2)
GPT2_STACK = GPT2.replace(vocab=None, positional="none")
LLAMA_LM = LLAMA.replace(vocab=50)


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _props(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def _scopes(node: onnx.NodeProto) -> list[str]:
    return ast.literal_eval(_props(node).get("pkg.torch.onnx.name_scopes", "[]"))


def _layer(node: onnx.NodeProto) -> int | None:
    scopes = _scopes(node)
    return int(scopes[1].split(".")[1]) if len(scopes) > 1 and scopes[1].startswith("layers.") else None


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    out = {}
    for v in (*g.input, *g.output, *g.value_info):
        out[v.name] = tuple(d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim)
    for t in g.initializer:
        out[t.name] = tuple(t.dims)
    return out


def matmul_flops(model: onnx.ModelProto, layer: int | None = ...) -> int:
    """2·M·N·K per output element batch for every MatMul / Gemm (of one layer if given)."""
    shapes = _shapes(model)
    total = 0
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or (layer is not ... and _layer(node) != layer):
            continue
        a = shapes[node.input[0]]
        k = a[0] if node.op_type == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute) else a[-1]
        total += 2 * math.prod(shapes[node.output[0]]) * k
    return total


@pytest.fixture(scope="module")
def exports() -> dict[str, onnx.ModelProto]:
    return {
        "gpt2": export_onnx(GPT2, weights="random"),
        "llama": export_onnx(LLAMA, weights="random"),
        "gpt2-stack": export_onnx(GPT2_STACK, weights="none"),
        "llama-lm": export_onnx(LLAMA_LM, weights="none"),
    }


@pytest.mark.parametrize("key", ["gpt2", "llama", "gpt2-stack", "llama-lm"])
def test_valid_covered_and_tagged(exports, key: str) -> None:
    model = exports[key]
    onnx.checker.check_model(model, full_check=True)
    assert {n.op_type for n in model.graph.node} <= set(registered_ops())  # every op has a cost rule
    meta = _meta(model)
    params = json.loads(meta["dabench.params"])
    assert meta["dabench.family"] == params["family"]
    assert params["layers"] == 2 and "hidden" in params and "kv_heads" in params
    names = json.loads(meta["dabench.weights"])
    held = {t.name for t in model.graph.initializer} | {v.name for v in model.graph.input}
    assert set(names) <= held
    assert "layers.1.attn.q_proj.weight" in names
    for node in model.graph.node:
        assert not {"pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node"} & set(_props(node))


def test_weightless_export_has_shape_only_weight_inputs(exports) -> None:
    model = exports["llama-lm"]
    names = json.loads(_meta(model)["dabench.weights"])
    inputs = {v.name for v in model.graph.input}
    assert set(names) == inputs - {"input_ids"}
    assert len(names) == 1 + 9 * 2 + 1 + 1  # embed, 9 per block, final norm, lm_head
    assert all(t.name not in names for t in model.graph.initializer)
    assert model.ByteSize() < 200_000


@pytest.mark.parametrize(("key", "cfg"), [("gpt2", GPT2), ("llama", LLAMA)])
def test_onnxruntime_matches_torch(exports, key: str, cfg: ModelConfig) -> None:
    ort = pytest.importorskip("onnxruntime")
    module = build_model(cfg, seed=0)
    shape = (cfg.batch, cfg.seq)
    x = torch.randint(0, cfg.vocab, shape) if cfg.vocab else torch.randn(*shape, cfg.hidden)
    with torch.no_grad():
        want = module(x).numpy()
    session = ort.InferenceSession(exports[key].SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("key", "cfg"), [("gpt2", GPT2), ("llama", LLAMA), ("llama-lm", LLAMA_LM)])
def test_matmul_flops_closed_form(exports, key: str, cfg: ModelConfig) -> None:
    model = exports[key]
    for layer in range(cfg.layers):
        assert matmul_flops(model, layer) == cfg.block_matmul_flops()
    assert matmul_flops(model) == cfg.matmul_flops()


def test_matmul_flops_equal_flop_counter_mode(exports) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    module = build_model(LLAMA, seed=0)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(torch.randn(LLAMA.batch, LLAMA.seq, LLAMA.hidden))
    assert matmul_flops(exports["llama"]) == counter.get_total_flops()


@pytest.mark.parametrize("key", ["gpt2", "llama"])
def test_every_block_node_has_its_layer_scope(exports, key: str) -> None:
    model = exports[key]
    by_layer = Counter(_layer(n) for n in model.graph.node)
    assert by_layer[0] == by_layer[1] > 10
    for node in model.graph.node:
        layer = _layer(node)
        if layer is None:
            continue
        scopes = _scopes(node)[1:-1]
        assert all(s == f"layers.{layer}" or s.startswith(f"layers.{layer}.") for s in scopes), scopes
        assert f"/layers.{layer}" in _props(node)["namespace"]
        assert f"layers.{1 - layer}" not in _props(node)["namespace"]
    q = [n for n in model.graph.node if n.op_type == "MatMul" and "layers.1.attn.q_proj" in _scopes(n)]
    assert len(q) == 1


def _signature(model: onnx.ModelProto) -> dict[int | None, list[tuple]]:
    """Per layer: (op type, module scopes, output shapes) of each node, in graph order."""
    shapes = _shapes(model)
    out: dict[int | None, list[tuple]] = {}
    for node in model.graph.node:
        key = (node.op_type, tuple(_scopes(node)[:-1]), tuple(shapes.get(o) for o in node.output))
        out.setdefault(_layer(node), []).append(key)
    out[None] = sorted(out.get(None, []), key=repr)  # nodes outside the blocks: order is free
    return out


@pytest.mark.parametrize(
    "cfg",
    [GPT2.replace(layers=3), LLAMA_LM.replace(layers=3), LLAMA_LM.replace(layers=3, logits="last")],
    ids=["gpt2", "llama", "llama-last-logits"],
)
def test_stamped_equals_plain_export(cfg: ModelConfig) -> None:
    stamped = export_onnx(cfg, weights="none", stamp=True)
    plain = export_onnx(cfg, weights="none", stamp=False)
    assert _meta(stamped)["dabench.export"] == "stamped"
    assert len(stamped.graph.node) == len(plain.graph.node)
    assert _signature(stamped) == _signature(plain)
    shape = lambda v: [d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    assert [(v.name, shape(v)) for v in stamped.graph.input] == [(v.name, shape(v)) for v in plain.graph.input]
    assert matmul_flops(stamped) == matmul_flops(plain) == cfg.matmul_flops()


def test_a_stamped_exports_metadata_is_its_own_layers(tmp_path) -> None:
    """A sweep stamps a cached 1-layer export: its metadata (shape, weights, KV-cache names) had stayed
    the base's, so ``--kv-precision fp8`` rewrote layer 0's cache alone (8 layers: 89.9 MB a step where
    the export of all 8 moves 60.5 MB). Stamped, it is the L-layer export's, and so is the profile."""
    from dabench_ir.api import profile
    from dabench_ir.models.export import stamp_layers

    cfg = LLAMA_LM.replace(layers=3, phase="decode", seq=1, context=16)
    base = export_onnx(cfg.replace(layers=1), weights="none", stamp=False)
    stamped, plain = stamp_layers(base, 3), export_onnx(cfg, weights="none", stamp=False)
    ours, theirs = _meta(stamped), _meta(plain)
    for key in ("dabench.kv_cache", "dabench.weights", "dabench.params", "dabench.phase"):
        assert ours[key] == theirs[key], key
    assert ours["dabench.export"] == "stamped"
    onnx.save(stamped, str(tmp_path / "stamped.onnx"))
    onnx.save(plain, str(tmp_path / "plain.onnx"))
    moved = [
        profile(tmp_path / f"{name}.onnx", "h100", kv_precision="fp8").totals["bytes"] for name in ("stamped", "plain")
    ]
    assert moved[0] == moved[1]


def test_registry_memo_exports_the_same_bytes(monkeypatch) -> None:
    """The exporter's registry, built once per process (`_registry_once`), gives the bytes a fresh
    registry gives, and torch's own method is back in place after each export."""
    import contextlib

    from torch.onnx._internal.exporter import _registration

    from dabench_ir.models import export as export_module

    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    cfg = GPT2.replace(layers=1)
    export_onnx(cfg.replace(hidden=48), weights="none")  # builds the memo
    assert export_module._REGISTRIES
    memo = export_onnx(cfg, weights="none").SerializeToString()
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is original
    monkeypatch.setattr(export_module, "_registry_once", contextlib.nullcontext)
    assert export_onnx(cfg, weights="none").SerializeToString() == memo


def test_dynamic_dims_are_named() -> None:
    cfg = LLAMA.replace(layers=1)
    model = export_onnx(cfg, weights="none", dynamic=True)
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims[:2] == ["batch", "seq"]
    onnx.checker.check_model(model, full_check=True)
    assert json.loads(_meta(model)["dabench.params"])["dynamic"] is True


def test_random_weights_refused_over_cap(tmp_path) -> None:
    cfg = LLAMA.replace(hidden=256, ffn=512)
    need = cfg.weight_bytes()
    with pytest.raises(UserError, match=f"{need:,} bytes"):
        export_model(cfg, tmp_path / "m.onnx", weights="random", max_weight_bytes=need - 1)


def test_export_model_writes_file(tmp_path) -> None:
    result = export_model(GPT2_STACK.replace(layers=1), tmp_path / "m.onnx", weights="none")
    loaded = onnx.load(tmp_path / "m.onnx")
    assert result.weights == "none" and result.nodes == len(loaded.graph.node)
    assert _meta(loaded)["dabench.preset"] == ""
