"""Decode graphs (KV cache), quantised precisions and the generation scenario.

Hand counts: weights read once per step, the KV cache read in full and once, grouped-query
attention reading kv_heads (not heads) cache heads; KV-cache bytes exact against
2 × layers × kv_heads × head_dim × context × bytes × batch for every preset.
"""

from __future__ import annotations

import itertools
import json

import pytest

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, DType, TensorType
from dabench_ir.models import PRESETS, ModelConfig, get_preset
from dabench_ir.options import ProfileOptions

# -- closed forms (no torch) ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_kv_cache_bytes_formula_every_preset(name):
    cfg = get_preset(name)
    head_dim = cfg.hidden // cfg.heads
    for context, batch, size in ((1, 1, 2), (1000, 1, 2), (1000, 8, 1), (777, 3, 4)):
        expected = 2 * cfg.layers * cfg.kv_heads * head_dim * context * size * batch
        assert cfg.replace(batch=batch).kv_cache_bytes(context, size) == expected


def test_kv_cache_bytes_known_values():
    # per token in fp16: LLaMA-2-7B 512 KiB, LLaMA-2-70B (GQA, 8 kv heads) 320 KiB, GPT-2 small 36 KiB
    assert get_preset("llama-7b", dtype="fp16").kv_cache_bytes(1) == 524_288
    assert get_preset("llama-70b", dtype="fp16").kv_cache_bytes(1) == 327_680
    assert get_preset("gpt2-small", dtype="fp16").kv_cache_bytes(1) == 36_864
    assert get_preset("llama-70b", dtype="fp16", batch=4).kv_cache_bytes(4096) == 4 * 4096 * 327_680
    cfg = ModelConfig(family="llama", phase="decode", context=10, seq=1, batch=2, dtype="bf16")
    assert cfg.kv_cache_bytes() == 2 * 2 * 4 * 16 * 10 * 2 * 2


def test_decode_flops_closed_form():
    cfg = ModelConfig(
        family="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, seq=1, batch=3, phase="decode", context=10
    )
    # 2·B·S·(2h² + 2h·kv + 3h·f) + 4·B·S·(C+S)·h per block
    block = 2 * 3 * 1 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 4 * 3 * 1 * 11 * 64
    assert cfg.block_matmul_flops() == block
    assert cfg.replace(phase="prefill", context=0, seq=11).block_matmul_flops() == (
        2 * 3 * 11 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 4 * 3 * 11 * 11 * 64
    )


def test_decode_config_errors():
    with pytest.raises(UserError, match="--context"):
        ModelConfig(phase="decode")
    with pytest.raises(UserError, match="phase decode only"):
        ModelConfig(context=4)
    with pytest.raises(UserError, match="exceeds max_positions"):
        get_preset("gpt2-small", phase="decode", context=1024, seq=1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--phase", "decode"], "needs --context"),
        (["--context", "8"], "apply to --phase decode"),
        (["--phase", "decode", "--context", "8", "--seq", "4"], "not --seq"),
        (["--phase", "decode", "--context", "8", "--format", "mlir-torch"], "ONNX only"),
    ],
)
def test_export_decode_usage_errors(argv, message, tmp_path, capsys):
    from dabench_ir.cli import main

    assert main(["export", "--preset", "llama-7b", *argv, "-o", str(tmp_path / "x.onnx")]) == 2
    assert message in capsys.readouterr().err


def test_int4_is_half_a_byte():
    assert TensorType((3, 5), DType.INT4).nbytes() == 8  # 15 nibbles, rounded up to whole bytes
    assert TensorType((4096, 4096), DType.INT4).nbytes() == 4096 * 2048
    assert DType.from_name("fp8") is DType.FLOAT8E4M3FN


# -- torch: decode is the prefill, one token at a time -----------------------------------------

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, seq=6, vocab=50),
        ModelConfig(family="gpt2", layers=2, hidden=64, heads=4, kv_heads=1, seq=6, max_positions=16),
    ],
    ids=["llama-gqa", "gpt2-mqa"],
)
def test_decode_with_cache_matches_prefill(cfg):
    from dabench_ir.models import build_model

    model = build_model(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 50, (2, 6), generator=gen) if cfg.vocab else torch.randn(2, 6, 64, generator=gen)
    with torch.no_grad():
        full = model(x)
        caches = []
        for _ in range(cfg.layers):
            caches += [torch.zeros(2, cfg.kv_heads, cfg.head_dim, 0), torch.zeros(2, cfg.kv_heads, 0, cfg.head_dim)]
        steps = []
        # a chunk of 2 tokens (causal mask among them), then one token at a time
        for start, stop in ((0, 2), (2, 3), (3, 4), (4, 5), (5, 6)):
            out, *new = model(x[:, start:stop], *caches)
            steps.append(out)
            pairs = enumerate(zip(caches, new, strict=True))
            caches = [torch.cat((c, n), dim=3 if i % 2 == 0 else 2) for i, (c, n) in pairs]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


# -- exported decode graphs ---------------------------------------------------------------------

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

SMALL = ModelConfig(
    family="llama",
    layers=3,
    hidden=64,
    heads=4,
    kv_heads=2,
    ffn=128,
    seq=1,
    batch=2,
    vocab=100,
    dtype="fp16",
    phase="decode",
    context=16,
)


@pytest.fixture(scope="module")
def small_decode():
    from dabench_ir.models.export import export_onnx

    return export_onnx(SMALL, weights="none")


@pytest.fixture(scope="module")
def small_graph(small_decode):
    from dabench_ir.pipeline import prepare_graph

    return prepare_graph(small_decode, ProfileOptions())


def _costs(graph):
    from dabench_ir.passes import meta

    return {n.name: meta.get_cost(n) or Cost() for n in graph.nodes}


def test_decode_graph_inputs_outputs(small_decode):
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in small_decode.graph.input}
    outs = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in small_decode.graph.output}
    for i in range(3):
        assert shapes[f"layers.{i}.attn.k_cache"] == [2, 2, 16, 16]  # [B, kv_heads, head_dim, context]
        assert shapes[f"layers.{i}.attn.v_cache"] == [2, 2, 16, 16]  # [B, kv_heads, context, head_dim]
        assert outs[f"layers.{i}.attn.k_new"] == [2, 2, 16, 1]
        assert outs[f"layers.{i}.attn.v_new"] == [2, 2, 1, 16]
    assert outs["logits"] == [2, 1, 100]
    meta = {p.key: p.value for p in small_decode.metadata_props}
    assert meta["dabench.phase"] == "decode"
    weights = json.loads(meta["dabench.weights"])
    assert not [w for w in weights if "cache" in w]
    assert len(json.loads(meta["dabench.kv_cache"])["inputs"]) == 6
    assert "Expand" not in {n.op_type for n in small_decode.graph.node}  # GQA: K/V heads never repeated


def test_a_decode_steps_p_v_matmuls_are_the_attention_values(small_decode):
    """A decode step slices its softmax into the cached part and the new part, each with its own
    P·V: both are "attention values" (they were "attn: MatMul", the role walk stopping at the Slice),
    as many as the attention scores."""
    from collections import Counter

    from dabench_ir.frontends.onnx import load_onnx
    from dabench_ir.pipeline import profile_graph

    report = profile_graph(load_onnx(small_decode), "h100")
    roles = Counter(n.role for n in report.nodes if n.op_type == "MatMul")
    values, scores = roles["layers.*.attn: attention values"], roles["layers.*.attn: attention scores"]
    assert values == scores == 2 * SMALL.layers and not any(r and r.endswith("attn: MatMul") for r in roles)


def test_decode_graph_hand_count(small_graph):
    cfg = SMALL
    graph, costs = small_graph, _costs(small_graph)
    total = sum(costs.values(), Cost())
    declared = set(json.loads(graph.metadata["dabench.weights"]))
    assert sum(graph.type_of(w).numel() for w in declared) == cfg.param_count()
    assert total.contraction_flops == cfg.matmul_flops()
    # weights read once per step: every weight in full, except the embedding (only the B·S rows
    # gathered); besides them the nodes read small folded constants (rotary cos/sin, eps, scale)
    from dabench_ir.lowering.context import stored_root

    constants = sum(
        graph.type_of(v).nbytes()
        for n in graph.nodes
        for v in n.inputs
        if v in graph.values
        and graph.values[v].kind.is_stored
        and stored_root(graph, v) not in declared
        and graph.values[v].type.dtype.is_float  # int64 shape tensors are shape parameters, not data
    )
    rows = cfg.batch * cfg.seq * cfg.hidden * 2
    assert total.weight_bytes == cfg.weight_bytes() - cfg.vocab * cfg.hidden * 2 + rows + constants
    assert constants < 1000
    # the cache: each K/V input read in full, once, by one MatMul, with kv_heads (not heads) heads
    cache = [n for n in graph.inputs if "cache" in n]
    assert sum(graph.type_of(n).nbytes() for n in cache) == cfg.kv_cache_bytes() == 2 * 3 * 2 * 16 * 16 * 2 * 2
    for name in cache:
        (reader,) = graph.consumers[name]
        assert reader.op_type == "MatMul"
    # Q·Kᵀ over the cache reads the grouped queries [B, kv, rep·S, D] and K; P·V reads P [B, kv, rep·S, C] and V
    q_bytes = 2 * 2 * 2 * 16 * 2
    p_bytes = 2 * 2 * 2 * 16 * 2
    k_bytes = v_bytes = 2 * 2 * 16 * 16 * 2
    readers = {graph.consumers[n][0].name: n for n in cache}
    for node_name, value in readers.items():
        expected = q_bytes + k_bytes if ".k_cache" in value else p_bytes + v_bytes
        assert costs[node_name].act_bytes_in == expected


def test_kv_precision_rewrites_the_cache(small_decode):
    from dabench_ir.pipeline import prepare_graph

    graph = prepare_graph(small_decode, ProfileOptions(kv_precision="int8"))
    cache = [n for n in graph.inputs if "cache" in n]
    assert sum(graph.type_of(n).nbytes() for n in cache) == SMALL.kv_cache_bytes(itemsize=1)
    assert {str(graph.type_of(n).dtype) for n in graph.outputs if "_new" in n} == {"int8"}


def test_weight_only_int4_counts_dequantisation(small_decode):
    from dabench_ir.pipeline import prepare_graph

    base = sum(_costs(prepare_graph(small_decode, ProfileOptions(precision="fp16"))).values(), Cost())
    graph = prepare_graph(small_decode, ProfileOptions(precision="w4a16"))
    total = sum(_costs(graph).values(), Cost())
    h, f, kv, layers = 64, 128, 32, 3
    block_weights = layers * (2 * h * h + 2 * h * kv + 3 * h * f)  # the quantised matmul weights
    assert total.contraction_flops == base.contraction_flops
    assert total.vector_flops == base.vector_flops + 2 * block_weights  # subtract zero point, multiply scale
    # int4 block weights (half a byte) + group scales/zeros (2.5 B per 128) instead of fp16
    expected = (
        base.weight_bytes
        - block_weights * 2
        + block_weights // 2
        + sum(
            -(-(g * 25) // 10)
            for g in [-(-n // 128) for n in (h * h, h * kv, h * kv, h * h, h * f, h * f, f * h)] * layers
        )
    )
    assert total.weight_bytes == expected


def test_precision_a_target_lacks_exits_2(small_decode, tmp_path, capsys):
    from dabench_ir.cli import main

    path = tmp_path / "d.onnx"
    onnx.save(small_decode, str(path))
    assert main(["profile", str(path), "-t", "wse2", "--precision", "int8", "-q"]) == 2
    assert "wse2 does not support int8" in capsys.readouterr().err
    assert main(["profile", str(path), "-t", "a100", "--precision", "fp8", "-q"]) == 2
    err = capsys.readouterr().err
    assert "a100 does not support fp8e4m3" in err and "int8" in err
    assert main(["profile", str(path), "-t", "h100", "--precision", "fp8", "-q"]) == 0


# -- generation scenario and physics: LLaMA-2-7B shapes, all 32 layers stamped ------------------

L7B = get_preset("llama-7b", dtype="fp16")


@pytest.fixture(scope="module")
def llama7b_pair():
    from dabench_ir.models.export import export_onnx

    prefill = export_onnx(L7B.replace(seq=16), weights="none", dynamic=True)
    decode = export_onnx(L7B.replace(phase="decode", context=16, seq=1), weights="none", dynamic=True)
    return prefill, decode


def _decode_time(proto, batch, context, target="h100", **opts):
    from dabench_ir.pipeline import resolve_target
    from dabench_ir.scenario import run_phase

    run = run_phase(
        proto,
        {"batch": batch, "context": context},
        "decode",
        resolve_target(target),
        ProfileOptions(batch=batch, **opts),
    )
    return run


def test_decode_batch1_h100_is_weight_bandwidth_bound(llama7b_pair):
    from dabench_ir.targets import load_target

    run = _decode_time(llama7b_pair[1], 1, 512)
    bw = load_target("h100").memory("hbm").bandwidth_bytes_per_s
    floor = run.weight_bytes / bw
    assert run.weight_bytes == L7B.weight_bytes()  # 13.48 GB in fp16
    assert run.kv_cache_bytes == L7B.kv_cache_bytes(512)
    # the device's part of the step (the engine's host work between steps is its own row, issue 44)
    device_s = run.time_s - run.report.plan.step_overheads_s.get("decode_step", 0.0)
    assert floor <= device_s <= 1.5 * floor, (device_s, floor)


def test_decode_throughput_knee_at_the_ridge(llama7b_pair):
    from dabench_ir.targets import load_target

    h100 = load_target("h100")
    ridge = h100.ridge_point("fp16")  # FLOP/byte; fp16 weights: a linear layer does 2·B FLOPs per 2 bytes
    batches = [1, 2, 32, 64, 128, 256, 512, 1024, 2048]
    times = {b: _decode_time(llama7b_pair[1], b, 2).time_s for b in batches}
    rate = {b: b / t for b, t in times.items()}
    assert all(rate[b2] > rate[b1] for b1, b2 in itertools.pairwise(batches))  # rises with batch
    growth = {b: times[2 * b] / times[b] for b in batches if 2 * b in times}
    knee = min(b for b, g in growth.items() if g > 1.5)  # doubling the batch now nearly doubles the step
    assert ridge / 2 <= knee <= 2 * ridge, (knee, ridge, growth)
    assert growth[1] < 1.1 and growth[1024] > 1.8  # flat below the knee, linear above


def test_generate_scenario(llama7b_pair):
    from dabench_ir.scenario import SCHEMA, generate

    result = generate(llama7b_pair, "h100", ProfileOptions(batch=4), prompt=128, gen=33)
    assert [d.context for d in result.decode] == [128, 138, 149, 159]
    assert result.interpolated
    for d in result.decode:
        assert d.kv_cache_bytes == L7B.replace(batch=4).kv_cache_bytes(d.context)
        assert d.homes == {"weights": "hbm (read every step)", "kv_cache": "hbm (off-chip)"}
    times = [d.time_s for d in result.decode]
    assert times == sorted(times)  # the cache grows, the step slows
    # the interpolation checked at the placed steps: each inner one against its neighbours' line
    contexts = [d.context for d in result.decode]
    off = [
        abs(
            times[i - 1]
            + (times[i + 1] - times[i - 1]) * (contexts[i] - contexts[i - 1]) / (contexts[i + 1] - contexts[i - 1])
            - times[i]
        )
        / times[i]
        for i in (1, 2)
    ]
    assert result.interpolation_check == pytest.approx(max(off)) and result.interpolation_check < 1e-3
    assert result.decode_total_s == pytest.approx(sum(result.tpot_at(c) for c in range(128, 160)))
    assert result.tpot_s == pytest.approx(result.decode_total_s / 32)
    assert result.latency_s == pytest.approx(result.ttft_s + result.decode_total_s)
    data = result.to_dict()
    assert data["schema"] == SCHEMA
    assert data["tokens_per_s_total"] == pytest.approx(4 * 33 / result.latency_s)
    assert data["fits"] is True and data["prefill"]["report"]["nodes"]
    assert result.ttft_s > result.tpot_s  # 4 × 128 tokens of prefill against one token per request


def test_generate_cli(llama7b_pair, tmp_path, capsys):
    from dabench_ir.cli import main

    paths = []
    for name, proto in zip(("p.onnx", "d.onnx"), llama7b_pair, strict=True):
        onnx.save(proto, str(tmp_path / name))
        paths.append(str(tmp_path / name))
    pair = ",".join(paths)
    out = tmp_path / "gen.json"

    def generate(flags: str, *paths: str) -> int:
        return main(["profile", pair, "--scenario", "generate", *flags.split(), *paths])

    assert generate("--prompt 64 --gen 8 -t h100 --json", str(out)) == 0
    text = capsys.readouterr().out
    assert "time to first token" in text and "time per output token" in text
    assert json.loads(out.read_text())["schema"] == "dabench-ir/scenario/generate/v1"
    assert generate("--gen 8 -t h100") == 2
    assert "--prompt" in capsys.readouterr().err
    assert generate("--prompt 4 --gen 8 -t ipu --precision fp8 -q") == 2
    assert "does not support fp8e4m3" in capsys.readouterr().err


def test_generate_over_two_gpus_tensor_parallel(llama7b_pair):
    from dabench_ir.options import ScaleOptions
    from dabench_ir.scenario import generate

    one = generate(llama7b_pair, "h100", ProfileOptions(batch=1), prompt=16, gen=2)
    two = generate(llama7b_pair, "h100", ScaleOptions(batch=1, chips=2, strategy="tp"), prompt=16, gen=2)
    assert two.chips == 2 and two.to_dict()["strategy"] == "tp"
    # half the weights per GPU, plus two all-reduces per layer: faster, but not twice as fast
    assert one.tpot_s / 2 < two.tpot_s < one.tpot_s


@pytest.mark.slow
def test_a_preset_name_is_a_model_for_the_generation_scenario(capsys):
    """The README's example: MODEL may be a preset name with --scenario generate (it exports it)."""
    from dabench_ir.cli import main

    assert main(["profile", "gpt2-small", "-t", "h100", "--scenario", "generate", "--prompt", "8", "--gen", "2"]) == 0
    assert "Generation: " in capsys.readouterr().out
    assert (
        main(["profile", "no-such-preset", "-t", "h100", "--scenario", "generate", "--prompt", "8", "--gen", "2"]) == 2
    )
    assert "not a preset" in capsys.readouterr().err


def test_the_scenarios_prefill_projects_only_the_last_token_through_the_lm_head(tmp_path, monkeypatch):
    """A serving engine samples the first token from each request's last position: the scenario's own
    prefill export (`ModelConfig.logits` "last") runs the LM head over B rows, not B x prompt; the rest of
    the prefill is the plain forward's (closed forms, FLOPs as counted)."""
    from dabench_ir.scenario import generate

    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path))  # this test's own exports
    cfg = ModelConfig(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, vocab=100, dtype="fp16")
    batch, prompt = 3, 12
    result = generate(cfg, "h100", ProfileOptions(batch=batch), prompt=prompt, gen=2)
    prefill = cfg.replace(batch=batch, seq=prompt, logits="last")
    assert result.prefill.report.totals["contraction_flops"] == prefill.matmul_flops()
    assert prefill.matmul_flops() == cfg.replace(batch=batch, seq=prompt).matmul_flops() - (
        2 * batch * (prompt - 1) * cfg.hidden * cfg.vocab
    )
