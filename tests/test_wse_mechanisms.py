"""WSE mechanisms of issue 44, each with exact numbers on a hand-built graph and the mechanism off.

- Pipelined capacity: a synchronous training step drains its pipeline before the weight update,
  so a block boundary never holds more samples than the step's batch (`pipelined._in_flight_bytes`);
  with Cerebras' pipelined backpropagation (``arch.drain_per_step`` 0) it holds the whole round trip.
  The auto mode follows: pipelined when the bounded plan fits below 1 B parameters.
- Parallel-residual blocks (GPT-J: attention and MLP read one norm's output and are summed into
  the residual): the MLP branch waits one sample at the join for the attention branch, beside the
  skip stream's own FIFO (`kernels._skip_bytes`).
"""

from __future__ import annotations

from dabench_ir.ir import Cost, DType, Graph, ValueKind
from dabench_ir.lowering import lower
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.lowering.wse import wse_kernels
from dabench_ir.options import ProfileOptions
from dabench_ir.passes.training import TrainingPass
from dabench_ir.targets import load_target
from tests.lowering_graphs import _Builder, decoder

WSE = load_target("wse")
FLOWING = WSE.with_changes({"arch.drain_per_step": 0})  # pipelined backpropagation: no drain a step


def _train(graph):
    return TrainingPass()(graph).graph


def test_a_step_never_holds_more_samples_than_its_batch_so_a_deep_long_sequence_model_stays_pipelined():
    # 40 blocks of 768 at sequence 8192, batch 2: one block boundary is 8192 x 768 fp16 a sample
    graph = _train(decoder(layers=40, hidden=768, seq=8192, batch=2, heads=12))
    per_sample = 8192 * 768 * 2
    plan = lower(graph, WSE, ProfileOptions(wse_mode="auto"))
    # the last block holds 1 sample (its round trip is one period), the 39 before it the step's 2
    assert plan.extra["buffer_bytes"] == per_sample * (1 + 39 * 2)
    assert plan.stats.mode == "pipelined" and plan.fits
    assert plan.notes[0].startswith("auto: pipelined (283 M parameters < 1 B, and it fits)")
    # the mechanism off: the pipeline stays full across steps, every block holds its whole
    # 2(L-i)-1 round trip (1,600 samples of 12.6 MB), the minimum regions no longer fit and the
    # auto mode streams the weights
    full = lower(graph, FLOWING, ProfileOptions(wse_mode="pipelined"))
    assert full.extra["buffer_bytes"] == per_sample * 40 * 40
    assert not full.fits
    auto = lower(graph, FLOWING, ProfileOptions(wse_mode="auto"))
    assert auto.stats.mode == "streaming" and "pipelined mode does not fit" in auto.notes[0]


def _parallel_block(hidden: int = 64, seq: int = 16, heads: int = 4):
    """One GPT-J-style block: attention and MLP both read ln(x); out = x + attn + mlp."""
    b = _Builder(DType.FLOAT16)
    tok = (1, seq, hidden)
    act = b.nbytes(tok)
    x = b.value("x", tok, ValueKind.INPUT)

    def linear(name: str, inp: str, n_in: int, n_out: int) -> str:
        w = b.value(f"{name}.weight", (n_in, n_out), ValueKind.WEIGHT)
        cost = Cost(
            contraction_flops=2 * seq * n_in * n_out,
            weight_bytes=b.nbytes((n_in, n_out)),
            act_bytes_in=b.nbytes((1, seq, n_in)),
            act_bytes_out=b.nbytes((1, seq, n_out)),
        )
        return b.node(name, "MatMul", [inp, w], (1, seq, n_out), cost, name, 0)

    def vector(name: str, op: str, inputs: list[str], scope: str) -> str:
        cost = Cost(vector_flops=seq * hidden, act_bytes_in=act * len(inputs), act_bytes_out=act)
        return b.node(name, op, inputs, tok, cost, scope, 0)

    h = vector("layers.0.ln_1", "LayerNormalization", [x], "layers.0.ln_1")
    q, k, v = (linear(f"layers.0.attn.{n}_proj", h, hidden, hidden) for n in "qkv")
    s_shape = (1, heads, seq, seq)
    mm = Cost(contraction_flops=2 * seq * seq * hidden, act_bytes_in=2 * act, act_bytes_out=b.nbytes(s_shape))
    s = b.node("layers.0.attn.qk", "MatMul", [q, k], s_shape, mm, "layers.0.attn", 0)
    sm_cost = Cost(vector_flops=4 * heads * seq * seq, special_ops=heads * seq * seq, act_bytes_in=b.nbytes(s_shape))
    sm = b.node("layers.0.attn.softmax", "Softmax", [s], s_shape, sm_cost, "layers.0.attn", 0)
    av = Cost(contraction_flops=2 * seq * seq * hidden, act_bytes_in=b.nbytes(s_shape) + act, act_bytes_out=act)
    a = b.node("layers.0.attn.av", "MatMul", [sm, v], tok, av, "layers.0.attn", 0)
    o = linear("layers.0.attn.out_proj", a, hidden, hidden)
    f1 = linear("layers.0.mlp.fc_in", h, hidden, 4 * hidden)  # reads the same norm output
    gelu_cost = Cost(vector_flops=8 * seq * 4 * hidden, act_bytes_in=4 * act, act_bytes_out=4 * act)
    g = b.node("layers.0.mlp.gelu", "Gelu", [f1], (1, seq, 4 * hidden), gelu_cost, "layers.0.mlp.act", 0)
    f2 = linear("layers.0.mlp.fc_out", g, 4 * hidden, hidden)
    joined = vector("layers.0.add_branches", "Add", [o, f2], "layers.0")
    out = vector("layers.0.add_residual", "Add", [x, joined], "layers.0")
    return Graph(b.nodes, b.values, [x], [out], name="parallel-block", bindings={"batch": 1})


def test_a_parallel_block_holds_its_mlp_branch_one_sample_at_the_join():
    hidden, seq = 64, 16
    sample = seq * hidden * 2  # one sample of a block-wide fp16 stream
    kernels = wse_kernels(LoweringContext.build(_parallel_block(hidden, seq)), WSE)
    adds = {k.key: k.skip_bytes for k in kernels if k.cls == "add"}
    # the MLP branch (token-wise, a few rows late) waits for attention's whole sample at the join,
    # and the residual stream waits for both branches: two FIFOs of one sample each
    assert adds == {"layers.0.add_branches": sample, "layers.0.add_residual": sample}
    # a sequential (GPT-2) block holds one: the MLP's add reads a stream that has passed attention
    seq_kernels = wse_kernels(LoweringContext.build(decoder(layers=1, hidden=hidden, seq=seq)), WSE)
    assert sorted(k.skip_bytes for k in seq_kernels if k.cls == "add") == [0, sample]


def test_a_batch_of_requests_decodes_through_the_pipeline_not_one_after_another():
    """GPT-2 small's emb_fc region holds both the tied embedding and the LM head: each request's head
    runs beside the next requests' lookups, so 4 requests take one pass and 3 periods of the pipeline,
    not 4 passes (3.01 ms a token against 752 µs for one: batching bought no throughput)."""
    import dabench_ir

    one = dabench_ir.generate("gpt2-small", "wse2", prompt=128, gen=2, batch=1)
    four = dabench_ir.generate("gpt2-small", "wse2", prompt=128, gen=2, batch=4)
    assert four.tpot_s < 1.25 * one.tpot_s


def test_the_generation_text_names_each_phases_weights_home_where_they_differ():
    """Llama 2 7B with 8 requests of 2,048 tokens: the prefill runs pipelined with its weights
    resident, every decode step streams them from MemoryX; the text had said only "in sram
    (resident)" while the JSON said otherwise."""
    import dabench_ir
    from dabench_ir.scenario import render_generate

    result = dabench_ir.generate("llama-7b", "wse2", prompt=2048, gen=64, batch=8)
    assert result.prefill.homes["weights"] == "sram (resident)"
    assert result.decode[-1].homes["weights"] == "memoryx (streamed per step)"
    text = render_generate(result, breakdown=None)
    assert "in sram (resident) for the prefill, memoryx (streamed per step) for each decode step" in text
