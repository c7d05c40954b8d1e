"""GPT-J and GPT-NeoX families (parallel residual, partial rotary) against Hugging Face's own modules.

Fast: closed forms and presets (no torch), and the torch modules against transformers'
`GPTJForCausalLM` / `GPTNeoXForCausalLM` built from small configs (no download, eager attention):
same logits with the same weights, the same parameter count (`num_parameters()`), and MatMul FLOPs
(`ModelConfig.matmul_flops`) exactly torch's `FlopCounterMode` count on Hugging Face's model.
Slow (exports with torch): the exported graph's contraction FLOPs and parameters exact, the
parallel residual visible in it, stamped = plain, a profile on every dataflow target and a GPU.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from dabench_ir.errors import UserError
from dabench_ir.models import PRESETS, ModelConfig, get_preset
from tests._helpers import hf_causal_lm
from tests.test_models_config import PUBLISHED

GPTJ = ModelConfig(family="gptj", layers=2, hidden=64, heads=4, seq=8, batch=2, vocab=101)
NEOX = GPTJ.replace(family="gpt_neox")

# the two families' presets: test_models_config checks their published totals
NEW_PRESETS = [name for name in PUBLISHED if get_preset(name).family in ("gptj", "gpt_neox")]


# -- closed forms (no torch) -----------------------------------------------------------------------


def test_gpt_j_6b_shape() -> None:
    cfg = get_preset("gpt-j-6b")
    assert (cfg.family, cfg.layers, cfg.hidden, cfg.heads, cfg.head_dim) == ("gptj", 28, 4096, 16, 256)
    assert (cfg.rotary_dim, cfg.ffn, cfg.vocab, cfg.seq, cfg.tie_embeddings) == (64, 16384, 50400, 2048, False)
    assert cfg.parallel_residual and cfg.lm_head_bias
    assert get_preset("gpt-j") is not None and get_preset("GPTJ").preset == "gpt-j-6b"


def test_neox_rotary_is_a_quarter_of_each_head() -> None:
    for name in NEW_PRESETS:
        cfg = get_preset(name)
        assert cfg.rotary_dim == cfg.head_dim // 4  # rotary_pct 0.25; GPT-J: 64 of 256
    assert get_preset("pythia-2.8b").rotary_dim == 20  # head_dim 80: int(80 · 0.25), as HF takes it
    assert not get_preset("gpt-neox-20b").lm_head_bias


def test_block_closed_forms() -> None:
    h, f = 64, 256
    # GPT-J: q/k/v/o without bias, MLP with biases, one LayerNorm
    assert GPTJ.block_params() == 4 * h * h + 2 * h * f + f + h + 2 * h
    # GPT-NeoX: fused qkv and dense biased, two LayerNorms
    assert NEOX.block_params() == 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    # untied embedding and head; GPT-J's head has a bias
    assert GPTJ.param_count() == 2 * GPTJ.block_params() + 2 * h + 2 * 101 * h + 101
    assert NEOX.param_count() == 2 * NEOX.block_params() + 2 * h + 2 * 101 * h
    # the parallel residual changes no FLOPs: 2·B·S·(4h² + 2h·f) + 4·B·S²·h per block, plus the head
    b, s = 2, 8
    block = 2 * b * s * (4 * h * h + 2 * h * f) + 4 * b * s * s * h
    assert GPTJ.matmul_flops() == NEOX.matmul_flops() == 2 * block + 2 * b * s * h * 101


@pytest.mark.parametrize(
    ("changes", "word"),
    [
        ({"rotary_dim": 3}, "even"),
        ({"rotary_dim": 18}, "at most the head dim"),
        ({"kv_heads": 2}, "grouped-query"),
        ({"family": "llama", "rotary_dim": 8}, "rotary_dim applies to"),
        ({"family": "gpt2", "rotary_dim": 8}, "rotary_dim applies to"),
        ({"positional": "learned"}, "positional"),
    ],
)
def test_config_errors(changes: dict, word: str) -> None:
    with pytest.raises(UserError, match=word):
        GPTJ.replace(**changes)


def test_existing_families_keep_their_params() -> None:
    assert get_preset("llama-7b").rotary_dim is None and get_preset("gpt2-small").rotary_dim is None
    assert not get_preset("llama-7b").parallel_residual and not get_preset("gpt2-small").lm_head_bias


# -- torch modules against Hugging Face's ----------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

_RENAMES = {
    "gptj": (
        (r"^transformer\.wte\.", "embed."),
        (r"^transformer\.ln_f\.", "norm."),
        (r"^transformer\.h\.", "layers."),
        (r"\.ln_1\.", ".attn_norm."),
        (r"\.out_proj\.", ".o_proj."),
    ),
    "gpt_neox": (
        (r"^gpt_neox\.embed_in\.", "embed."),
        (r"^gpt_neox\.final_layer_norm\.", "norm."),
        (r"^gpt_neox\.layers\.", "layers."),
        (r"\.input_layernorm\.", ".attn_norm."),
        (r"\.post_attention_layernorm\.", ".mlp_norm."),
        (r"\.attention\.query_key_value\.", ".attn.qkv_proj."),
        (r"\.attention\.dense\.", ".attn.o_proj."),
        (r"\.dense_h_to_4h\.", ".fc_in."),
        (r"\.dense_4h_to_h\.", ".fc_out."),
        (r"^embed_out\.", "lm_head."),
    ),
}


def hf_model(cfg: ModelConfig):
    """Hugging Face's model of ``cfg``'s shape (seeded weights, eager attention, no download)."""
    if cfg.family == "gptj":
        rotary = {"rotary_dim": cfg.rotary_dim}
    else:
        rotary = {"rotary_pct": cfg.rotary_dim / cfg.head_dim, "use_parallel_residual": True}
    sizes = {"layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads, "vocab": cfg.vocab, "ffn": cfg.ffn}
    torch.manual_seed(1)
    model = hf_causal_lm(cfg.family, **sizes, positions=64, attn_implementation="eager", **rotary)
    return model.eval()


def _our_name(name: str, family: str) -> str:
    for pattern, new in _RENAMES[family]:
        name = re.sub(pattern, new, name)
    return name


@pytest.mark.parametrize("cfg", [GPTJ, NEOX], ids=["gptj", "gpt_neox"])
def test_same_logits_and_parameters_as_hugging_face(cfg: ModelConfig) -> None:
    from dabench_ir.models import build_model

    ref, ours = hf_model(cfg), build_model(cfg)
    assert cfg.param_count() == ref.num_parameters() == sum(p.numel() for p in ours.parameters())
    state = {_our_name(k, cfg.family): v for k, v in ref.named_parameters()}
    ours.load_state_dict(state, strict=True)  # every tensor named and shaped as HF's
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), ref(ids).logits, rtol=1e-5, atol=1e-5)


def _flop_count(model, ids) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    return counter.get_total_flops()


def hf_flops(cfg: ModelConfig) -> int:
    """FlopCounterMode's count of Hugging Face's forward pass over ``cfg``'s batch, less what its GPT-NeoX
    spends building the rotary tables: ``GPTNeoXRotaryEmbedding`` forms the position × frequency outer
    product as a bmm of inv_freq `[1, rotary_dim/2, 1]` by the positions `[1, 1, S]` every forward
    (2 · rotary_dim/2 · S FLOPs); GPT-J's table is built once, at init, and ours folds into constants."""
    ids = torch.zeros(cfg.batch, cfg.seq, dtype=torch.int64)
    tables = 2 * (cfg.rotary_dim // 2) * cfg.seq if cfg.family == "gpt_neox" else 0
    return _flop_count(hf_model(cfg), ids) - tables


@pytest.mark.parametrize("cfg", [GPTJ, NEOX], ids=["gptj", "gpt_neox"])
def test_closed_form_flops_equal_flop_counter_on_hugging_face(cfg: ModelConfig) -> None:
    assert hf_flops(cfg) == cfg.matmul_flops()


@pytest.mark.parametrize("cfg", [GPTJ.replace(seq=6), NEOX.replace(seq=6)], ids=["gptj", "gpt_neox"])
def test_decode_with_cache_matches_prefill(cfg: ModelConfig) -> None:
    """Rotary positions continue after the cache: token by token equals the whole prompt at once."""
    from dabench_ir.models import build_model

    model = build_model(cfg, seed=0)
    x = torch.randint(0, cfg.vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x)
        caches = [torch.zeros(2, cfg.heads, cfg.head_dim, 0), torch.zeros(2, cfg.heads, 0, cfg.head_dim)] * cfg.layers
        steps = []
        for start, stop in ((0, 2), (2, 3), (3, 4), (4, 5), (5, 6)):
            out, *new = model(x[:, start:stop], *caches)
            steps.append(out)
            caches = [
                torch.cat((c, n), dim=3 if i % 2 == 0 else 2) for i, (c, n) in enumerate(zip(caches, new, strict=True))
            ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


# -- exported graphs (slow: torch exports) ---------------------------------------------------------


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Weight-free static exports of the two small configs, 3 blocks stamped from one."""
    pytest.importorskip("onnxscript")
    import onnx

    from dabench_ir.models.export import export_onnx

    folder = tmp_path_factory.mktemp("gptj")
    paths = {}
    for cfg in (GPTJ.replace(layers=3), NEOX.replace(layers=3)):
        paths[cfg.family] = folder / f"{cfg.family}.onnx"
        onnx.save(export_onnx(cfg, weights="none"), str(paths[cfg.family]))
    return paths


def _contraction_flops(graph) -> int:
    from dabench_ir.passes import meta

    return sum(meta.get_cost(n).contraction_flops for n in graph.nodes if meta.get_cost(n) is not None)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gptj", "gpt_neox"])
def test_export_flops_and_params_exact(exports, family: str) -> None:
    import json

    import onnx

    from dabench_ir.passes import meta
    from dabench_ir.pipeline import analyze

    cfg = (GPTJ if family == "gptj" else NEOX).replace(layers=3)
    graph = analyze(exports[family])
    assert _contraction_flops(graph) == cfg.matmul_flops() == hf_flops(cfg)
    assert graph.num_params == cfg.param_count() == hf_model(cfg).num_parameters()
    assert graph.layers == [0, 1, 2]
    assert not [n.name for n in graph.nodes if meta.UNATTRIBUTED in n.meta]
    props = {p.key: p.value for p in onnx.load(str(exports[family])).metadata_props}
    params = json.loads(props["dabench.params"])
    assert (params["family"], params["rotary_dim"]) == (family, cfg.rotary_dim)
    assert props["dabench.family"] == family


def _scoped(graph, op: str, scope: str):
    found = [n for n in graph.nodes if n.op_type == op and n.scope.startswith(scope)]
    assert len(found) == 1, (scope, [n.name for n in found])
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gptj", "gpt_neox"])
def test_parallel_residual_visible_in_the_graph(exports, family: str) -> None:
    """Every block: attention and MLP read the same LayerNorm output (GPT-J) or the block input through
    a LayerNorm each (GPT-NeoX); neither branch reaches the other; both are added to the block input."""
    import networkx as nx

    from dabench_ir.pipeline import analyze

    graph = analyze(exports[family])
    dag = graph.to_networkx()
    q_proj = "qkv_proj" if family == "gpt_neox" else "q_proj"
    for layer in range(3):
        scope = f"layers.{layer}"
        q = _scoped(graph, "MatMul", f"{scope}.attn.{q_proj}")
        fc_in = _scoped(graph, "MatMul", f"{scope}.mlp.fc_in")
        o, fc_out = _scoped(graph, "MatMul", f"{scope}.attn.o_proj"), _scoped(graph, "MatMul", f"{scope}.mlp.fc_out")
        norms = [n for n in graph.nodes if n.op_type == "LayerNormalization" and n.layer == layer]
        if family == "gptj":
            assert len(norms) == 1 and q.inputs[0] == fc_in.inputs[0] == norms[0].outputs[0]
        else:
            assert len(norms) == 2 and {q.inputs[0], fc_in.inputs[0]} == {n.outputs[0] for n in norms}
            assert norms[0].inputs[0] == norms[1].inputs[0]  # both read the block input
        assert not nx.has_path(dag, o.name, fc_in.name) and not nx.has_path(dag, fc_out.name, q.name)
        # the block's input reaches its output through an Add, beside the two branches
        block_in = norms[0].inputs[0]
        adds = [n for n in graph.nodes if n.op_type == "Add" and n.layer == layer and block_in in n.inputs]
        assert adds, "the residual Add reads the block input"


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [GPTJ.replace(layers=3), NEOX.replace(layers=3)], ids=["gptj", "gpt_neox"])
def test_stamped_equals_plain_export(cfg: ModelConfig) -> None:
    pytest.importorskip("onnxscript")
    from dabench_ir.models.export import export_onnx

    stamped = export_onnx(cfg, weights="none", stamp=True)
    plain = export_onnx(cfg, weights="none", stamp=False)
    assert len(stamped.graph.node) == len(plain.graph.node)
    by_op = lambda m: sorted(n.op_type for n in m.graph.node)  # noqa: E731
    assert by_op(stamped) == by_op(plain)
    assert [v.name for v in stamped.graph.input] == [v.name for v in plain.graph.input]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["wse2", "sn30", "bow", "h100"])
def test_profile_on_every_target(exports, target: str, tmp_path) -> None:
    import json

    from dabench_ir.cli import main

    for family, path in exports.items():
        out = tmp_path / f"{family}-{target}.json"
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["profile", str(path), "-t", target, "--json", str(out)]) == 0
        report = json.loads(out.read_text())
        cfg = (GPTJ if family == "gptj" else NEOX).replace(layers=3)
        assert report["totals"]["time_s"] > 0 and not report["unattributed"]
        assert report["model"]["params"] == cfg.param_count()


@pytest.mark.slow
def test_decode_export_costs_the_closed_form() -> None:
    pytest.importorskip("onnxscript")
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import analyze

    cfg = GPTJ.replace(layers=2, seq=1, phase="decode", context=7)
    graph = analyze(export_onnx(cfg, weights="none"))
    assert _contraction_flops(graph) == cfg.matmul_flops()


def test_every_new_preset_listed() -> None:
    for name in NEW_PRESETS:
        assert name in PRESETS
