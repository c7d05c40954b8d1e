"""Real Hugging Face decoders (GPT-2, Llama with grouped-query attention) built from configs (no
download) and exported with their KV cache by optimum (``text-generation-with-past``): ``--batch``,
``--seq`` and ``--past`` alone bind them on every target; the attention mask's ``past_sequence_length
+ sequence_length`` follows from its parts, and the dims shape inference names (``unk__N``) from the
bound inputs. The reference: the closed-form contraction FLOPs of one decode step."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch]  # Hugging Face models exported by optimum, as test_hf_export.py

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("optimum.exporters.onnx")

from dabench_ir.cli import main  # noqa: E402
from tests._helpers import hf_causal_lm, trained_looking, weightless  # noqa: E402

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, POSITIONS = 2, 64, 4, 2, 128, 256, 128
PAST, SEQ = 31, 1
PARAMS: dict[str, int] = {}  # each model's own count (transformers' num_parameters)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """optimum's with-past exports of a random GPT-2 and a random Llama (GQA: 4 heads, 2 KV heads)."""
    from optimum.exporters.onnx import main_export

    root = tmp_path_factory.mktemp("hf")
    sizes = {"layers": LAYERS, "hidden": HIDDEN, "heads": HEADS, "vocab": VOCAB, "positions": POSITIONS}
    models = {
        "gpt2": hf_causal_lm("gpt2", **sizes),  # an MLP of 4 x hidden, a KV head per head
        "llama": hf_causal_lm("llama", **sizes, num_key_value_heads=KV_HEADS, ffn=FFN),
    }
    out = {}
    for name, model in models.items():
        trained_looking(model)
        model.save_pretrained(root / name)
        PARAMS[name] = model.num_parameters()  # the tied embedding and LM head once
        main_export(str(root / name), output=root / f"{name}-past", task="text-generation-with-past")
        out[name] = root / f"{name}-past" / "model.onnx"
    main_export(str(root / "llama"), output=root / "llama-plain", task="text-generation")  # no cache
    out["llama-plain"] = root / "llama-plain" / "model.onnx"
    return out


def _decode_contraction_flops(family: str, *, past: int = PAST, seq: int = SEQ) -> int:
    """One step (``seq`` new tokens over ``past`` cached ones): 2 FLOPs per weight of every matmul a
    token passes, plus the scores and the weighted values over all past + seq positions."""
    head = HIDDEN // HEADS
    kv = KV_HEADS * head if family == "llama" else HIDDEN
    per_layer = HIDDEN * HIDDEN * 2 + 2 * HIDDEN * kv  # q, o and k, v projections
    per_layer += 3 * HIDDEN * FFN if family == "llama" else 2 * HIDDEN * 4 * HIDDEN  # SwiGLU or GELU MLP
    weights = LAYERS * per_layer + HIDDEN * VOCAB  # the LM head
    attention = LAYERS * 2 * (2 * seq * (past + seq) * HIDDEN)  # scores and values, every head
    rotary = 2 * (head // 2) * seq if family == "llama" else 0  # HF's rotary angles: inv_freq @ position_ids
    return seq * 2 * weights + attention + rotary


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


def test_a_kv_cache_exports_decode_step_runs_as_a_serving_engines_on_a_gpu(exports, tmp_path, capsys):
    """A step that reads a KV cache is a decode step whoever exported it: on a GPU, the engine's host
    work between steps is its own row and the kernels are fused a matmul each, as for the tool's own
    decode export (an optimum export's step had neither: a generation scenario's time per output
    token 2.7x lower than the same model exported by the tool); its prefill (``--past 0``) has neither."""
    argv = ["profile", str(exports["llama"]), "-t", "h100", "--batch", "2"]
    step = _report([*argv, "--seq", "1", "--past", str(PAST)], tmp_path, capsys)
    prefill = _report([*argv, "--seq", "8", "--past", "0"], tmp_path, capsys)
    assert step["overheads"]["decode_step"] > 0 and "decode_step" not in prefill["overheads"]


def test_a_combined_dim_follows_from_its_parts_and_a_contradiction_is_refused(exports, capsys):
    path = str(exports["gpt2"])
    mask = "past_sequence_length + sequence_length"
    argv = ["profile", path, "-t", "rdu", "--batch", "1", "--seq", "1", "--past", "31", "-q"]
    assert main([*argv, "--dim", f"{mask}=40"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--dim {mask}=40 disagrees with its parts (= 32)" in err
    assert main([*argv, "--dim", f"{mask}=32", "--json", "-"]) == 0


def test_past_on_a_model_without_a_cache_is_refused(tmp_path, capsys):
    path = weightless(tmp_path / "g.onnx", family="gpt2", layers=1, hidden=32, heads=2, seq=8, vocab=16)
    assert main(["profile", path, "-t", "rdu", "--past", "8", "-q"]) == 2
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


def _report(argv: list[str], tmp_path, capsys) -> dict:
    out = tmp_path / "r.json"
    assert main([*argv, "-q", "--json", str(out)]) == 0, capsys.readouterr().err
    return json.loads(out.read_text())


def test_past_0_is_a_prefill_through_the_cache_model(exports, tmp_path, capsys):
    """``--past 0``: the cache empty, the prompt alone; the same contraction FLOPs as the export without
    a cache at that length (and the closed form). Any other dim of 0 is refused in one line."""
    seq = ["--batch", "1", "--seq", "8"]
    cached = _report(["profile", str(exports["llama"]), "-t", "h100", *seq, "--past", "0"], tmp_path, capsys)
    plain = _report(["profile", str(exports["llama-plain"]), "-t", "h100", *seq], tmp_path, capsys)
    flops = _decode_contraction_flops("llama", past=0, seq=8)
    assert cached["totals"]["contraction_flops"] == plain["totals"]["contraction_flops"] == flops
    argv = ["profile", str(exports["llama"]), "-t", "h100", "--past", "3", "-q"]
    assert main([*argv, "--batch", "1", "--dim", "sequence_length=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dim sequence_length=0: only a KV cache's length may be 0" in err
    assert main([*argv, "--seq", "1"]) == 2  # the batch unbound: the flag that binds it is named
    assert "bind them with --batch N" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("family", "graph"), [("llama", "kv-cache"), ("gpt2", "kv-cache"), ("llama-plain", "recompute")]
)
@pytest.mark.parametrize("target", ["sn30", "h100"])
def test_generate_on_a_users_decoder_file(exports, family, graph, target, tmp_path, capsys):
    """``--scenario generate`` on a Hugging Face export: a file with a KV cache is its own decode step
    (one token over the context, as ``--seq 1 --past C`` profiles it; its prefill ``--past 0``); one
    without runs the whole sequence again each step (``--seq C+1``). The result says which."""
    path, prompt, gen = str(exports[family]), 12, 6
    argv = ["profile", path, "-t", target, "--scenario", "generate", "--prompt", str(prompt), "--gen", str(gen)]
    result = _report([*argv, "--batch", "2"], tmp_path, capsys)
    assert result["decode_graph"] == graph and result["model"]["layers"] == LAYERS
    if graph == "recompute" and target == "h100":  # each step reruns the sequence: no cache to hold in a pool
        assert main([*argv, "--batch", "2", "--kv-cache", "paged", "-q"]) == 2
        assert "--kv-cache paged: the decode steps keep no KV cache" in capsys.readouterr().err
    cached = graph == "kv-cache"
    prefill = ["--seq", str(prompt), *(["--past", "0"] if cached else [])]
    alone = _report(["profile", path, "-t", target, "--batch", "2", *prefill], tmp_path, capsys)
    assert result["ttft_s"] == alone["totals"]["time_s"]
    last = result["decode"][-1]
    assert last["context"] == prompt + gen - 2
    step = ["--seq", "1", "--past", str(last["context"])] if cached else ["--seq", str(last["context"] + 1)]
    alone = _report(["profile", path, "-t", target, "--batch", "2", *step], tmp_path, capsys)
    assert last["time_s"] == alone["totals"]["time_s"]
    assert last["report"]["totals"]["contraction_flops"] == alone["totals"]["contraction_flops"]
    if family == "llama":  # 2 layers x K and V x batch 2 x 2 KV heads x 16 x context, at the run's precision
        size = {"fp32": 4, "bf16": 2, "fp16": 2}[result["precision"]]
        assert result["precision"] == alone["config"]["precision"]
        assert last["kv_cache_bytes"] == LAYERS * 2 * 2 * KV_HEADS * (HIDDEN // HEADS) * last["context"] * size
    main([*argv, "--top", "0"])
    assert (
        "decode steps: " + ("the file's own KV-cache" if cached else "the file has no KV-cache")
        in capsys.readouterr().out
    )


def test_generate_refuses_a_file_with_a_fixed_sequence(exports, tmp_path, capsys):
    import onnx

    from dabench_ir.models.export import bind_dims

    static = tmp_path / "static.onnx"
    proto = onnx.load(str(exports["llama-plain"]), load_external_data=False)
    onnx.save(bind_dims(proto, {"batch_size": 1, "sequence_length": 8}), str(static))
    assert main(["profile", str(static), "-t", "h100", "--scenario", "generate", "--prompt", "8", "--gen", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "its sequence length is fixed as exported" in err


@pytest.mark.parametrize("flag", ["--seq", "--past"])
def test_generate_refuses_seq_and_past(exports, flag, capsys):
    """Each step binds its own length: a --seq or --past beside --scenario generate is refused, not ignored."""
    argv = ["profile", str(exports["llama"]), "-t", "h100", "--scenario", "generate", "--prompt", "8", "--gen", "4"]
    assert main([*argv, flag, "3", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{flag} is set per step by --prompt and --gen" in err


def test_an_onnxruntime_pipeline_on_a_dynamic_export_is_rewritten_at_the_runs_dims(exports, tmp_path):
    """``study --pipeline ort-all`` on optimum's dynamic Llama at --batch 2 --seq 16: the model is
    rewritten with those dims bound, so onnxruntime's fused ``com.microsoft`` ops (opaque to ONNX shape
    inference) leave no ``unk__N`` dim to bind; the contraction work is the baseline's."""
    from dabench_ir.options import ProfileOptions
    from dabench_ir.study import run_study

    opts = ProfileOptions(batch=2, seq=16)
    doc = run_study(str(exports["llama-plain"]), ["ort-all"], ["h100"], opts, out_dir=tmp_path / "out")
    assert doc["failed"] == []
    (run,) = doc["runs"]
    assert run["totals"]["nodes_after"] < run["totals"]["nodes_before"]
    before, after = (json.loads((tmp_path / "out" / f"model.{p}.h100.json").read_text()) for p in ("none", "ort-all"))
    flops = _decode_contraction_flops("llama", past=0, seq=16) * 2  # two sequences
    assert before["totals"]["contraction_flops"] == after["totals"]["contraction_flops"] == flops


def test_ort_transformers_takes_the_models_family(exports, tmp_path):
    """onnxruntime's transformers optimizer has no Llama model type: on optimum's Llama the pipeline is
    a failed row saying so (it ran as GPT-2 before); GPT-2's parameter names make it gpt2."""
    import onnx

    from dabench_ir.options import ProfileOptions
    from dabench_ir.study import run_study
    from dabench_ir.study.pipelines import _family

    doc = run_study(str(exports["llama-plain"]), ["ort-transformers"], ["h100"], ProfileOptions(batch=1, seq=8))
    (failed,) = doc["failed"]
    assert "has no model type for llama" in failed["reason"] and doc["runs"] == []
    assert _family(onnx.load(str(exports["gpt2"]), load_external_data=False), {}) == "gpt2"


def test_study_via_mlir_runs_the_asked_batch_and_sequence(exports, tmp_path, capsys):
    """``study --via mlir`` on a dynamic export lowers it at --batch 2 --seq 8 and its MLIR rows run two
    samples a step, as the ONNX path's run does (the MLIR rows ran one: the unit graph had no batch, so
    the same step showed half the samples/s), with the same contraction FLOPs. (The step itself is each graph's own: linalg units, ONNX nodes.)"""
    pytest.importorskip("torch_mlir")
    path, out = str(exports["llama-plain"]), tmp_path / "out"
    argv = ["study", path, "--via", "mlir", "--mlir-pipeline", "canonicalize", "-t", "rdu"]
    argv += ["--batch", "2", "--seq", "8"]
    assert main([*argv, "-o", str(out), "-q"]) == 0, capsys.readouterr().err
    onnx_run = _report(["profile", path, "-t", "rdu", "--batch", "2", "--seq", "8"], tmp_path, capsys)
    for name in ("mlir-none", "mlir:canonicalize"):
        mlir_run = json.loads((out / f"model.{name}.rdu.json").read_text())
        assert mlir_run["config"]["batch"] == onnx_run["config"]["batch"] == 2
        assert mlir_run["totals"]["contraction_flops"] == onnx_run["totals"]["contraction_flops"]
        for run in (mlir_run, onnx_run):  # two samples a step in both kinds of rows
            assert run["totals"]["throughput_samples_per_s"] * run["totals"]["time_s"] == pytest.approx(2, rel=1e-12)


@pytest.fixture(scope="module")
def dynamo_kv_export(exports, tmp_path_factory):
    """The same Llama (its saved weights) exported by torch.onnx's dynamo exporter with its cache as
    inputs, the dims named by `torch.export.Dim`: the mask's length is a symbol of its own (``total``)."""
    root = exports["llama"].parents[1]
    model = transformers.LlamaForCausalLM.from_pretrained(root / "llama", attn_implementation="eager").eval()

    class Step(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, keys, values):
            cache = transformers.DynamicCache()
            for i, (k, v) in enumerate(zip(keys, values, strict=True)):
                cache.update(k, v, i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            layers = out.past_key_values.layers
            return out.logits, *(layer.keys for layer in layers), *(layer.values for layer in layers)

    batch, seq, past, total = (torch.export.Dim(n) for n in ("batch", "seq", "past", "total"))
    b, s, p, head = 2, 3, 7, HIDDEN // HEADS  # a sample with no dim of 1 (torch.export specialises those)
    cache = [torch.randn(b, KV_HEADS, p, head) for _ in range(LAYERS)]
    shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: total},
        "keys": [{0: batch, 2: past}] * LAYERS,
        "values": [{0: batch, 2: past}] * LAYERS,
    }
    names = [f"past_key_values.{i}.{kind}" for kind in ("key", "value") for i in range(LAYERS)]
    path = tmp_path_factory.mktemp("dynamo") / "llama-kv.onnx"
    args = (torch.zeros(b, s, dtype=torch.long), torch.ones(b, p + s, dtype=torch.long), cache, list(cache))
    torch.onnx.export(
        Step(model),
        args,
        str(path),
        dynamo=True,
        dynamic_shapes=shapes,
        input_names=["input_ids", "attention_mask", *names],
    )
    return path


@pytest.mark.parametrize("target", ["wse2", "sn30", "bow", "h100"])
def test_a_dynamo_kv_export_binds_with_batch_seq_and_past_alone(dynamo_kv_export, target, tmp_path, capsys):
    """``--batch --seq --past`` bind the dynamo export: its mask's own length symbol is the cache plus the
    new tokens (Hugging Face's contract for attention_mask). Its parameters are the model's own (the
    rotary ``inv_freq`` buffer folded into a table is no parameter), as the optimum export's are; its
    contraction FLOPs are the closed form's but the rotary angles, which it computes from the cache's
    length, a shape: folded at compile time."""
    argv = ["profile", str(dynamo_kv_export), "-t", target, "--batch", "1", "--seq", str(SEQ), "--past", str(PAST)]
    report = _report(argv, tmp_path, capsys)
    assert report["model"]["params"] == PARAMS["llama"]
    rotary = 2 * (HIDDEN // HEADS // 2) * SEQ
    assert report["totals"]["contraction_flops"] == _decode_contraction_flops("llama") - rotary
    assert main([*argv, "--dim", "total=5", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the attention mask spans the cache and the new tokens" in err


def test_compiled_seq_pads_the_step_to_the_programs_length(exports, tmp_path, capsys):
    """``--compiled-seq N`` on an RDU: a program compiled for static shapes runs N tokens whatever the
    input's (SambaNova's generative tutorial pads input_ids to --max_seq_length): --seq 20 costs the
    contraction FLOPs of 32 tokens; the sample's own length stays recorded. Elsewhere, or longer, refused."""
    path = str(exports["llama-plain"])
    padded = _report(
        ["profile", path, "-t", "rdu", "--batch", "1", "--seq", "20", "--compiled-seq", "32"], tmp_path, capsys
    )
    assert padded["totals"]["contraction_flops"] == _decode_contraction_flops("llama", past=0, seq=32)
    assert (padded["config"]["seq"], padded["config"]["compiled_seq"]) == (20, 32)
    for argv, needle in (
        (["-t", "h100", "--seq", "20", "--compiled-seq", "32"], "--compiled-seq applies to rdu targets"),
        (["-t", "rdu", "--seq", "40", "--compiled-seq", "32"], "--seq 40 is longer than --compiled-seq 32"),
    ):
        assert main(["profile", path, "--batch", "1", *argv, "-q"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err


def test_a_model_sequence_longer_than_the_compiled_one_is_refused(capsys):
    """Without --seq the sample's own length is the one the model binds (GPT-2 small's preset: 1,024
    tokens): a program compiled for 512 cannot take it. It was run as a 512-token step instead, as if
    the sample had been cut to fit."""
    assert main(["profile", "gpt2-small", "-t", "rdu", "--compiled-seq", "512", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "the model's sequence (1024 tokens) is longer than --compiled-seq 512" in err and "--seq" in err


def test_generate_with_static_shapes_runs_the_compiled_window(exports, tmp_path, capsys):
    """With --compiled-seq N every prefill is N tokens and every decode step one token over a cache of
    N - 1, whatever the context (the table keeps each step's own context); a request longer than N is
    refused."""
    path = str(exports["llama"])
    argv = [
        "profile",
        path,
        "-t",
        "rdu",
        "--scenario",
        "generate",
        "--prompt",
        "10",
        "--gen",
        "6",
        "--compiled-seq",
        "32",
    ]
    result = _report(argv, tmp_path, capsys)
    assert result["compiled_seq"] == 32
    assert result["prefill"]["report"]["totals"]["contraction_flops"] == _decode_contraction_flops(
        "llama", past=0, seq=32
    )
    last = result["decode"][-1]
    assert last["context"] == 14 and last["report"]["totals"]["contraction_flops"] == _decode_contraction_flops(
        "llama", past=31
    )
    assert len({d["time_s"] for d in result["decode"]}) == 1  # one window: every step alike
    assert main([*argv[:-1], "12", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than --compiled-seq 12 holds" in err


def test_generate_tables_each_phase_as_profile_does(exports, capsys):
    """Each phase's report is tabled as `profile` tables one, by the same flags: ``--top N`` rows
    (0: every row; it was capped at 10, and 0 showed 8), ``--by`` module roles (the default) or
    nodes, ``--sort`` time, FLOPs or energy (it was accepted and ignored)."""
    argv = ["profile", str(exports["llama"]), "-t", "h100", "--scenario", "generate", "--prompt", "8", "--gen", "4"]
    tables = {}
    for flags in (["--top", "3"], ["--top", "0", "--by", "node"], ["--top", "3", "--sort", "flops", "--by", "node"]):
        assert main([*argv, *flags]) == 0
        out = capsys.readouterr().out
        tables[" ".join(flags)] = out.split("\nPrefill\n", 1)[1].split("\n\n", 1)[0].splitlines()
    roles, every_node, by_flops = tables.values()
    assert roles[0].startswith("Top 3 of ") and "module roles by time" in roles[0] and len(roles) == 3 + 3
    nodes = int(every_node[0].split()[3])  # "Top N of N nodes by time"
    assert every_node[0] == f"Top {nodes} of {nodes} nodes by time" and len(every_node) == nodes + 3
    assert by_flops[0] == f"Top 3 of {nodes} nodes by FLOPs" and len(by_flops) == 3 + 3


def test_a_files_fixed_batch_is_the_scenarios_batch(exports, tmp_path, capsys):
    """A user's decoder file whose batch is fixed (4) and sequence symbolic: the scenario serves its
    batch, as `profile` reads it (`Graph.batch_dim`), where it asked for a batch of 1 the user never
    gave and failed on it ("--batch 1: the model's batch is fixed at 4"). A --batch that disagrees
    is still refused in one line."""
    import onnx

    model = onnx.load(exports["llama-plain"])
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "batch_size":
                dim.Clear()
                dim.dim_value = 4
    path = tmp_path / "fixed-batch.onnx"
    onnx.save(model, path)
    argv = ["profile", str(path), "-t", "h100", "--scenario", "generate", "--prompt", "8", "--gen", "2"]
    assert _report(argv, tmp_path, capsys)["batch"] == 4
    assert main([*argv, "--batch", "2", "-q"]) == 2
    assert "the model's batch is fixed at 4" in capsys.readouterr().err
