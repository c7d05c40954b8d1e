"""Training memory as frameworks keep it: per-op saved tensors, fused attention, recompute,
micro-batches, and the sharding of training state (docs/training.md)."""

from __future__ import annotations

import math

import pytest

from dabench_ir.errors import UserError
from dabench_ir.ir import DType
from dabench_ir.options import ProfileOptions, ScaleOptions
from dabench_ir.passes import meta
from dabench_ir.passes.training import SAVED, FusedAttentionPass, TrainingPass
from dabench_ir.run import resolve
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder


def _layer_saved(graph, layer: int) -> int:
    kept: dict[str, int] = {}
    for node in graph.nodes:
        if node.layer == layer:
            kept.update(node.meta.get(SAVED) or {})
    return sum(kept.values())


def _hand_count(s: int, b: int, h: int, a: int, *, fused: bool, selective: bool = False) -> int:
    """One GPT-2 block in 16-bit (2 B/element), no dropout, by hand:

    ln1 input x (2sbh) and its mean/rstd (2 fp32 per row: 8bs); ln1 output read by q/k/v (2sbh,
    saved once); q and k for QKᵀ (4sbh); the softmax output (2·a·s²·b) unless fused or
    recomputed; v (2sbh); the attention output read by o_proj (2sbh); ln2 input (2sbh + 8bs) and
    output (2sbh); fc1 output = GELU input (8sbh); GELU output = fc2 input (8sbh). Adds keep
    nothing. Fused attention keeps the softmax's log-sum-exp instead (4·a·s·b). That is
    Korthikanti et al.'s 34sbh + 5as²b without the dropout masks and dropout output."""
    sbh = s * b * h
    count = 32 * sbh + 16 * b * s
    if fused:
        return count + 4 * a * s * b
    return count if selective else count + 2 * a * s * s * b


@pytest.mark.parametrize(("seq", "batch"), [(16, 1), (32, 1), (16, 2), (64, 3)])
@pytest.mark.parametrize("fused", [False, True])
def test_one_block_saves_what_autograd_keeps(seq, batch, fused):
    h, a = 64, 4
    g = decoder(layers=2, hidden=h, seq=seq, batch=batch, heads=a)
    if fused:
        FusedAttentionPass()(g)
    TrainingPass()(g)
    assert _layer_saved(g, 1) == _hand_count(seq, batch, h, a, fused=fused)


def _autograd_saved(cfg) -> dict[int, int]:
    """The float tensors torch's autograd saves for backward in one forward of the exporter's own
    module, by storage (a tensor saved twice is held once), weights and the input left out."""
    import torch

    from dabench_ir.models import build_model

    model = build_model(cfg).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden)
    held: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr != x.untyped_storage().data_ptr() and t.dtype.is_floating_point:
            held[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return held


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_exported_block_saves_what_torch_autograd_saves(family, tmp_path):
    """The exporter's own block (fp32, seq 32, hidden 64) against torch's saved-tensor hooks on the
    same module. A product keeps a factor only for its partner's gradient: ``scores * scale`` kept the
    S x S scores (GPT-2 small at bf16, batch 1: 909,320,192 B where the closed form gives 607,330,304)
    and rotary's ``q * cos`` kept q and k. GPT-2 is exact; LLaMA differs by what the two graphs hold
    differently: torch saves the cos and sin tables it computes each forward (constants in the export),
    and the export's Sqrt -> Reciprocal keeps one more fp32 per row than torch's rsqrt, per norm."""
    import onnx

    from dabench_ir.models.config import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import prepare_graph

    seq, hidden, heads = 32, 64, 4
    cfg = ModelConfig(family=family, layers=1, hidden=hidden, heads=heads, kv_heads=2 if family == "llama" else None,
                      ffn=128, seq=seq, vocab=None, dtype="fp32")  # fmt: skip
    path = tmp_path / f"{family}.onnx"
    onnx.save(export_onnx(cfg, weights="random"), path)
    ours = meta.graph_get(prepare_graph(path, {"mode": "train"}, None), meta.TRAINING).saved_activation_bytes
    torch_saved = sum(_autograd_saved(cfg).values())
    if family == "gpt2":
        assert ours == torch_saved == 123_648
    else:
        rotary_tables = 2 * seq * (hidden // heads) * 4  # cos and sin, [seq, head_dim] fp32
        assert ours == torch_saved - rotary_tables + 2 * seq * 4 == 188_928


def test_selective_recompute_drops_the_scores_and_recomputes_the_core():
    h, a, s = 64, 4, 32
    plain, sel = decoder(layers=2, hidden=h, seq=s, heads=a), decoder(layers=2, hidden=h, seq=s, heads=a)
    TrainingPass()(plain)
    TrainingPass(recompute="selective")(sel)
    assert _layer_saved(sel, 1) == _hand_count(s, 1, h, a, fused=False, selective=True)
    qk = "layers.1.attn.qk"
    # QKᵀ's forward runs again in backward; the AV matmul does not
    extra = meta.get_cost(sel.node(qk)).contraction_flops - meta.get_cost(plain.node(qk)).contraction_flops
    assert extra == 2 * s * s * h
    av = "layers.1.attn.av"
    assert meta.get_cost(sel.node(av)) == meta.get_cost(plain.node(av))
    # unfused, the recomputed ops read and write their tensors again: the softmax its S x S scores
    # in and probabilities out (it had cost its FLOPs alone, the traffic free)
    softmax = "layers.1.attn.softmax"
    scores = 2 * a * s * s  # one (1, a, s, s) fp16 tensor
    moved = meta.get_cost(sel.node(softmax)).bytes - meta.get_cost(plain.node(softmax)).bytes
    assert moved == 2 * scores


def test_fused_attention_writes_no_score_matrix():
    g = decoder(layers=1, hidden=64, seq=32, heads=4)
    before = {n.name: meta.get_cost(n) for n in g.nodes}
    FusedAttentionPass()(g)
    scores = 2 * 4 * 32 * 32  # one (b, a, s, s) fp16 tensor
    qk, sm, av = (g.node(f"layers.0.attn.{n}") for n in ("qk", "softmax", "av"))
    assert meta.get_cost(qk).act_bytes_out == before[qk.name].act_bytes_out - scores
    assert meta.get_cost(sm).act_bytes_in == 0 and meta.get_cost(sm).act_bytes_out == 0
    assert meta.get_cost(av).act_bytes_in == before[av.name].act_bytes_in - scores
    assert meta.get_cost(qk).flops == before[qk.name].flops


def test_full_recompute_keeps_block_inputs_and_one_block():
    g = decoder(layers=4, hidden=64, seq=16, heads=4)
    TrainingPass(recompute=True)(g)  # True from older specs means full
    train = meta.training_state(g)
    assert train.recompute_mode == "full" and train.recompute is True
    sbh2 = 2 * 16 * 64
    # three block outputs cross into the next block; the largest block's saved set is layer 1+
    assert train.saved_activation_bytes == 3 * sbh2 + _hand_count(16, 1, 64, 4, fused=False)


def test_full_recompute_runs_the_blocks_again_and_not_the_head(tmp_path):
    """Full recompute checkpoints the transformer blocks: the embedding, final norm and LM head run
    forward once and keep what they keep. A training step's matmul FLOPs are Narayanan et al.'s
    Eq. 3 (SC'21), 96·B·s·l·h²·(1 + s/6h + V/16lh), to the FLOP; the head ran again too (GPT-2 small at
    seq 1024: 1,166.6 against 1,087.5 TFLOP), and its input was left out of the memory kept."""
    import onnx

    from dabench_ir.models.config import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.pipeline import prepare_graph

    b, s, layers, h, vocab = 1, 16, 2, 64, 128
    cfg = ModelConfig(family="gpt2", layers=layers, hidden=h, heads=4, ffn=4 * h, seq=s, vocab=vocab, max_positions=s)
    path = tmp_path / "g.onnx"
    onnx.save(export_onnx(cfg, weights="random"), path)
    runs = {mode: prepare_graph(path, {"mode": "train", "recompute": mode}, None) for mode in ("none", "full")}
    full = runs["full"]
    contraction = sum(meta.get_cost(n).contraction_flops for n in full.nodes if meta.get_cost(n))
    assert contraction == 96 * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h)) == 13_893_632
    head = next(n for n in full.nodes if n.scope == "lm_head" and n.op_type in ("MatMul", "Gemm"))
    assert not head.meta.get(meta.RECOMPUTED)
    head_input = head.meta[SAVED]
    assert set(head_input) == set(runs["none"].node(head.name).meta[SAVED])
    kept = meta.training_state(full).saved_activation_bytes
    assert kept > sum(head_input.values())


def test_micro_batches_hold_one_micro_batch_and_run_the_optimizer_once():
    from dabench_ir.place import place

    h100 = load_target("h100")
    g = decoder(layers=2, hidden=64, seq=16, batch=8, heads=4)
    TrainingPass()(g)
    acts = meta.training_state(g).saved_activation_bytes
    one, _, _ = place(g, h100, ProfileOptions())
    four, tl4, _ = place(g, h100, ProfileOptions(micro_batches=4))
    assert resolve(g, "h100", {"micro_batch": 2}).samples.micro_batches == 4  # the graph's batch of 8 in 4 parts
    assert one.memory_bytes["hbm"] - four.memory_bytes["hbm"] >= acts * 3 // 4
    opt = next(n for n in g.nodes if n.op_type == "AdamStep")
    assert tl4.nodes[opt.name].end - tl4.nodes[opt.name].start == pytest.approx(
        one.node_plans[opt.name].per_micro_batch_s
    )  # once per step, same time as without accumulation
    with pytest.raises(UserError, match="does not divide"):
        resolve(g, "h100", {"micro_batch": 3})


def test_a_micro_batch_count_must_divide_the_batch_however_it_is_asked():
    """A micro-batch holds whole samples: 3 micro-batches of a batch of 8 are refused from the flag,
    from a variant of a resolved run (what the why lines try) and from the CLI (exit 2, one line)."""
    import subprocess
    import sys

    g = decoder(layers=2, hidden=64, seq=16, batch=8, heads=4)
    TrainingPass()(g)
    assert resolve(g, "h100", {"micro_batches": 4}).samples.micro_batch == 2
    with pytest.raises(UserError, match="--micro-batches 3 does not divide the batch 8"):
        resolve(g, "h100", {"micro_batches": 3})
    with pytest.raises(UserError, match="--micro-batches 16 does not divide the batch 8"):
        resolve(g, "h100", {"micro_batches": 4}).variant(micro_batches=16)
    cli = [sys.executable, "-m", "dabench_ir", "profile", "gpt2-small", "-t", "bow", "--micro-batches", "3"]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dabench-ir: error: --micro-batches 3 does not divide the batch 1: a micro-batch holds whole samples; "
        "give a divisor of 1, or a --batch that is a multiple of 3"
    ]


def test_zero_stages_shard_the_state_over_data_parallel_gpus():
    from dabench_ir.scaling import scale

    g = decoder(layers=2, hidden=256, seq=16, batch=1, heads=4, dtype=DType.BFLOAT16)
    TrainingPass()(g)
    mem = {
        z: scale(g, load_target("a100"), [8], "dp", ScaleOptions(batch=1, zero=z)).points[0].memory_per_device
        for z in (0, 1, 2, 3)
    }
    assert mem[1]["optimizer"] * 8 == pytest.approx(mem[0]["optimizer"], rel=1e-3)
    assert mem[1]["gradients"] == mem[0]["gradients"] and mem[2]["gradients"] * 8 == pytest.approx(
        mem[0]["gradients"], rel=1e-3
    )
    # ZeRO-3 (FSDP) shards the weights too, and gathers a block's whole while it runs: the largest
    # block's beyond its shard are held beside the shards (each block here: 4 projections and 2 MLP weights)
    block = max(sum(v.type.nbytes() for v in g.weights() if v.name.startswith(f"layers.{i}.")) for i in (0, 1))
    assert mem[2]["weights"] == mem[0]["weights"]
    assert mem[3]["weights"] == math.ceil(mem[0]["weights"] / 8) + block - math.ceil(block / 8)


def test_tensor_parallel_shards_the_training_state():
    from dabench_ir.scaling import split_for_tp

    g = decoder(layers=2, hidden=256, seq=16, heads=4)
    TrainingPass()(g)
    share, _ = split_for_tp(g, 4)
    whole, part = meta.training_state(g), meta.training_state(share)
    # every weight of this decoder is in an attention or MLP module: all of it is split
    assert part.optimizer_state_bytes * 4 == whole.optimizer_state_bytes
    assert part.gradient_bytes * 4 == whole.gradient_bytes
    assert whole.saved_activation_bytes / 4 < part.saved_activation_bytes < whole.saved_activation_bytes


def test_a_target_default_precision_is_used_unless_asked():
    g = decoder(layers=1, hidden=64)
    a100 = resolve(g, load_target("a100"))
    assert (a100.options.precision, a100.sources["precision"]) == ("bf16", "target")
    assert a100.options.fused_attention is True
    asked = resolve(g, load_target("a100"), {"precision": "fp32"})
    assert (asked.options.precision, asked.sources["precision"]) == ("fp32", "user")
    assert resolve(g, load_target("bow")).options.precision == "fp16"
    assert resolve(g, load_target("sn30")).options.fused_attention is False
    assert resolve(g).sources["precision"] == "model" and resolve(g).options.precision is None  # no target


def test_a_point_that_does_not_fit_has_no_throughput_and_ranks_last():
    from dabench_ir.pipeline import profile_graph
    from dabench_ir.report.compare import compare_reports

    a100 = load_target("a100")
    big = profile_graph(decoder(layers=80, hidden=8192, seq=16, heads=64), a100, ProfileOptions())
    small = profile_graph(decoder(layers=2, hidden=64), a100, ProfileOptions())
    assert not big.fits and big.totals["time_s"] > 0
    assert big.totals["throughput_samples_per_s"] is None and big.totals["gops_per_w"] is None
    assert big.totals["achieved_flops_per_s"] is None
    rows = compare_reports([big, small])
    assert [r["fits"] for r in rows] == [True, False] and rows[1]["gops_per_w"] is None


def test_power_counts_every_device_a_plan_uses():
    from dabench_ir.lowering import lower

    g = decoder(layers=4, hidden=64, batch=4)
    TrainingPass()(g)
    bow = load_target("bow")
    plan = lower(g, bow, ProfileOptions(micro_batches=4, ipus=2, replicas=2, mode="train"))
    from dabench_ir.pipeline import profile_graph

    report = profile_graph(g, bow, ProfileOptions(micro_batches=4, ipus=2, replicas=2, mode="train"))
    assert plan.chips == 4
    assert report.totals["target_power_w"] == pytest.approx(4 * float(bow.watts))


def test_a_fused_attention_kernel_runs_at_its_published_share_of_peak():
    from dabench_ir.lowering import lower

    a100 = load_target("a100")
    g = decoder(layers=1, hidden=512, seq=32, heads=4)  # head dim 128 (at 16 the exps would bind)
    FusedAttentionPass()(g)
    plan = lower(g, a100, ProfileOptions())
    peak = a100.peak_flops(DType.FLOAT16)
    # the kernel (the core's nodes together) takes its matmul FLOPs at the published share; its
    # exps at the SFU rate and the rest fit in that time here (docs/targets.md, GPU section)
    core = [n for n in g.nodes if meta.FUSED_ATTENTION in n.meta]
    matmul = sum(meta.get_cost(n).contraction_flops for n in core)
    assert sum(plan.node_plans[n.name].compute_s for n in core) == pytest.approx(matmul / peak / 0.6)
    proj = g.node("layers.0.attn.q_proj")  # a GEMM outside it: the maximum achievable matmul share,
    # times its wave efficiency: 32 x 512 is 4 output tiles (32 rows, 4 x 128 columns), split 4 ways
    # over K, so 16 of the A100's 108 SMs work, each block 128 of K plus its 64 of pipeline fill
    # and tile write (lowering/gpu.py gemm_wave_efficiency)
    mamf = peak * a100.arch_value("matmul_efficiency") * 16 / 108 * 128 / 192
    assert plan.node_plans[proj.name].compute_s == pytest.approx(meta.get_cost(proj).flops / mamf)


def _tiny_lm(vocab: int = 10, hidden: int = 4, seq: int = 3):
    """A token embedding and a tied-shape LM head: the least graph with language-model logits."""
    from tests.conftest import analyze_text

    zeros = ",".join(["0.0"] * vocab * hidden)
    return analyze_text(
        f"""
        lm (int64[1,{seq}] ids) => (float[1,{seq},{vocab}] logits)
        <float[{vocab},{hidden}] wte = {{{zeros}}}, float[{hidden},{vocab}] head = {{{zeros}}}> {{
            h = Gather(wte, ids)
            logits = MatMul(h, head)
        }}
        """
    )


def test_a_language_model_step_ends_in_its_loss_with_exact_cost():
    from dabench_ir.ir import Cost
    from dabench_ir.passes.training import BACKWARD_COST, FORWARD_COST, is_loss, lm_logits

    graph = _tiny_lm()
    assert lm_logits(graph) == "logits"
    g = TrainingPass()(graph).graph
    loss = [n for n in g.nodes if is_loss(n)]
    assert [n.name for n in loss] == ["loss.cross_entropy"] and loss[0].inputs == ["logits"]
    assert meta.training_state(g).loss == "loss.cross_entropy"
    n, rows = 3 * 10, 3  # logits and token rows
    # forward 4 vector + 1 exp per logit, 1 log per row; the gradient in the same pass: 2 per logit + 1 per row
    assert loss[0].meta[FORWARD_COST] == Cost(
        vector_flops=4 * n + 2 * n + rows,
        special_ops=n + rows,
        act_bytes_in=4 * n + 8 * rows,
        act_bytes_out=4 + 4 * n,
    )
    assert loss[0].meta[BACKWARD_COST] == Cost()
    assert g.nodes[-1].op_type == "AdamStep"  # the optimizer still closes the step
    # a graph without a token table has no logits to score: no loss
    plain = TrainingPass()(decoder(layers=1)).graph
    assert not any(is_loss(node) for node in plain.nodes) and meta.training_state(plain).loss is None


def test_a_vocabulary_smaller_than_the_position_table_still_has_its_loss(tmp_path):
    """GPT-2 with 1,000 words and its 1,024 positions: the token table is the one as tall as the logits
    are wide, not the largest table a Gather reads (the position table, which left the step with no
    loss: "no language-model logits")."""
    import onnx

    from dabench_ir.models.config import ModelConfig
    from dabench_ir.models.export import export_onnx
    from dabench_ir.passes.training import lm_logits, token_table
    from dabench_ir.pipeline import load_graph

    cfg = ModelConfig(family="gpt2", layers=1, hidden=64, heads=4, ffn=128, seq=16, vocab=1000, max_positions=1024)
    path = tmp_path / "g.onnx"
    onnx.save(export_onnx(cfg, weights="random"), path)
    graph = load_graph(path)
    table, vocab = token_table(graph)
    assert vocab == 1000 and graph.values[table].type.shape == (1000, 64)
    assert lm_logits(graph) == graph.outputs[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"optimizer": "sgd"}, r"TrainingPass\(optimizer='sgd'\): the modelled optimizers are adam"),
        ({"recompute": "selectiv"}, r"TrainingPass\(recompute='selectiv'\): expected one of none, selective, op, full"),
    ],
)
def test_the_training_pass_refuses_what_it_would_not_model(kwargs, message):
    """``optimizer='sgd'`` was recorded and Adam's cost and 8 B a parameter of moments used; a misspelt
    recompute mode was recorded as given and run as none."""
    with pytest.raises(ValueError, match=message):
        TrainingPass(**kwargs)


def test_a_quantised_model_is_refused_for_training(tmp_path, capsys):
    """onnxruntime's 4-bit MatMulNBits reads packed integer weights: --mode train had run, Adam over the
    4,096 fp32 scales as the 'parameters', where the float model has 131,072 weights to train."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from dabench_ir.cli import main

    n, k, block = 512, 256, 32
    packed = numpy_helper.from_array(np.zeros((n, k // block, block // 2), np.uint8), "B")
    scales = numpy_helper.from_array(np.ones((n * k // block,), np.float32), "scales")
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "scales"],
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
        name="mm",
    )
    graph = helper.make_graph(
        [node],
        "nb",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 16, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 16, n])],
        [packed, scales],
    )
    path = tmp_path / "nb.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]),
        path,
    )
    assert main(["profile", str(path), "--mode", "train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "dabench-ir: error: nb: MatMulNBits (mm) reads quantised weights; a quantised model is for inference: "
        "train the float model (--mode train), and quantise it with --precision"
    )
    assert main(["profile", str(path), "-q"]) == 0  # inference profiles it
