"""WSE defects of a cold review, each pinned with its before/after figures (small models, fast).

1. ``--logits last``: the tied embedding/LM head kernel streams every token out of its lookup, not only
   the last token's logits, so its region may grow to the lookup's rows (`kernels._streams`).
2. A decode step reads the KV cache the step before wrote: steps do not overlap, its time is its latency
   (`pipelined._steps_overlap`), as the generation scenario times it.
3. Weight streaming's own recompute of each layer does not run again what the graph's ``--recompute``
   already recomputes, nor the head after the last layer (`streaming._runs_forward_again`).
4. The streaming remedy names a micro-batch count that divides the batch, as the CLI requires.
5. Pipelined SRAM counts the residual adds' skip FIFOs; a failure of PEs states PEs, not bytes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dabench_ir import api
from dabench_ir.lowering import lower
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.lowering.wse import wse_kernels
from dabench_ir.options import ProfileOptions
from dabench_ir.passes.training import TrainingPass
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

WSE = load_target("wse")
WSE_TOML = Path(__file__).resolve().parents[1] / "targets" / "wse2.toml"
TINY = {"family": "gpt2", "layers": 2, "hidden": 128, "heads": 4, "vocab": 4096, "seq": 512}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """Weight-free dynamic exports of a 2-layer GPT-2 (h 128, vocab 4096): all logits, the last
    position's only, and its decode step over a cache (one export each, made once with torch)."""
    pytest.importorskip("torch")
    from dabench_ir.models.config import ModelConfig
    from dabench_ir.models.presets import cached_export

    folder = tmp_path_factory.mktemp("wse_review")
    base = ModelConfig(**TINY)
    return {
        "all": cached_export(base, folder),
        "last": cached_export(replace(base, logits="last"), folder),
        "decode": cached_export(replace(base, phase="decode", seq=1, context=64), folder),
    }


def test_logits_last_streams_every_token_out_of_the_lookup_so_its_region_is_not_capped_by_one_row(exports):
    """Batch 8 x 512 tokens: with the last position's logits only, the emb_fc kernel's shape had come
    from its last node (one row of 4,096 logits: 64 PEs at most) while its lookup streams 512 rows, so
    the step took 15.59 ms against 2.51 ms with every position's logits (more work). Now the lookup's
    512 x 128 elements bound the region: 2.51 ms, as with all logits (whose other kernels bind)."""
    last = api.profile(exports["last"], "wse2", batch=8, dims={"seq": 512})
    every = api.profile(exports["all"], "wse2", batch=8, dims={"seq": 512})
    head = next(k for k in wse_kernels(LoweringContext.build(last.graph), WSE) if k.cls == "emb_fc")
    assert (head.tokens, head.width, head.out_elems) == (512, 4096, 512 * 128)
    assert last.totals["flops"] < every.totals["flops"]
    assert last.totals["time_s"] <= every.totals["time_s"] * (1 + 1e-9)
    assert last.totals["time_s"] == pytest.approx(2.514e-3, rel=1e-3)


def test_a_decode_step_is_timed_alone_not_as_an_overlapped_period(exports):
    """Batch 8 over 64 cached tokens: the step had been a steady-state period (consecutive steps
    overlapping) of 190 us, 42.0 k samples/s, shorter than one step alone; each step's token is the
    step before's output, so the step is its latency, basis "one step" (the generation scenario's
    decode step): 280 us, the lowering's own fill and periods (the emulator had read 324 us: a
    bookkeeping node of no time held its region's lane, so each sample waited on the one before)."""
    r = api.profile(exports["decode"], "wse2", batch=8, past=64)
    t = r.totals
    assert t["time_basis"] == "one step" and not r.plan.pipelined_steps
    assert t["time_s"] == pytest.approx(t["latency_s"], rel=1e-12)
    assert t["time_s"] == pytest.approx(r.plan.stats.step_s, rel=1e-4)
    assert t["time_s"] == pytest.approx(279.8e-6, rel=1e-3)


def _layer_compute_s(path: Path, recompute: str) -> dict[str, float]:
    """Each streamed layer's compute per lane (batch 8 x 512 tokens, training, weight streaming)."""
    r = api.profile(path, "wse2", batch=8, dims={"seq": 512}, mode="train", wse_mode="streaming", recompute=recompute)
    return {u.id: u.resources["compute_s_per_micro_batch"] for u in r.plan.units if u.id.startswith("layer")}


def test_weight_streaming_recomputes_each_layer_once_whatever_the_graph_recomputes(exports):
    """Weight streaming keeps each layer's input and runs the layer forward again in backward. It had
    added that forward on top of the graph's own ``--recompute selective``/``op`` (layer 0: 9.07 /
    9.64 us against 7.75 us with ``none`` or ``full``) and recomputed the final norm, LM head and loss
    it streams with the last layer unless ``full`` (layer 1: 17.16 us with ``none``, 13.64 us with
    ``full``). Now every setting runs each layer forward once more, and not the head: 7.75 and 13.64 us."""
    times = {rc: _layer_compute_s(exports["all"], rc) for rc in ("none", "selective", "op", "full")}
    for rc, layers in times.items():
        assert layers == pytest.approx({"layer0": 7.754e-6, "layer1": 13.641e-6}, rel=1e-3), rc


def _small_wafer(tmp_path: Path, sram: float):
    text = WSE_TOML.read_text().replace("capacity_bytes = { value = 40e9,", f"capacity_bytes = {{ value = {sram!r},")
    path = tmp_path / "wse-small.toml"
    path.write_text(text)
    return load_target(path)


def test_the_streaming_remedy_names_micro_batches_that_divide_the_batch(tmp_path):
    """A wafer that holds lanes of 10 samples of a batch of 32 (4 layers of h 1024, seq 512): the
    remedy had been --micro-batches 3 (32 // 3 = 10), which the CLI refuses (3 does not divide 32).
    Now: --micro-batches 4, lanes of 8, and that run fits."""
    act = 512 * 1024 * 2
    per_sample = (3 + 14) * act
    weights = 12 * 1024 * 1024 * 2
    small = _small_wafer(tmp_path, (10.5 * per_sample + 2 * weights) / WSE.arch_value("sram_usable_fraction"))
    g = TrainingPass()(decoder(layers=4, hidden=1024, seq=512, heads=8, batch=32)).graph
    short = lower(g, small, ProfileOptions(wse_mode="streaming", micro_batches=2))
    ((knob, count),) = short.failure.remedy
    assert (knob, count) == ("micro_batches", 4) and 32 % count == 0
    assert "--micro-batches 4, lanes of 8 samples" in short.failure.reason
    assert lower(g, small, ProfileOptions(wse_mode="streaming", micro_batches=count)).fits


def test_pipelined_sram_counts_the_skip_fifos():
    """A 2-layer decoder (h 64, seq 16, fp16): each layer's second residual add holds one sample of
    its skip stream (16 x 64 x 2 = 2 KiB) in a FIFO. The SRAM need had been the weights alone
    (196,608 B); now the weights plus the two FIFOs (200,704 B)."""
    g = decoder(layers=2, hidden=64, seq=16)
    plan = lower(g, WSE, ProfileOptions(wse_mode="pipelined"))
    fifo = sum(u.resources.get("skip_fifo_bytes", 0.0) for u in plan.units)
    assert fifo == 2 * 16 * 64 * 2
    assert plan.memory_bytes["sram"] == plan.extra["state_bytes"] + fifo == 196_608 + 4_096


def test_a_failure_of_pes_states_pes_not_bytes():
    """When the minimum regions do not fit beside the I/O region, the failure had carried the SRAM
    bytes ("(needs 19.4 GB, has 30 GB)" for a 24-layer h 2048 model; here 196,608 B of 30 GB) though
    bytes fit: now it states the PEs needed and left (28 and 5), and no bytes."""
    crowded = WSE.with_changes({"arch.io_region_pes": 781_990})
    plan = lower(decoder(layers=2, hidden=64, seq=16), crowded, ProfileOptions(wse_mode="pipelined"))
    assert not plan.fits and "need at least 28 PEs" in plan.failure.reason and "5 are left" in plan.failure.reason
    assert (plan.failure.needed_bytes, plan.failure.capacity_bytes) == (None, None)


def test_a_regions_fixed_time_a_row_is_overhead_not_compute():
    """A norm region's time is mostly its kernel's fixed time a row (tau), which no PE count shortens:
    it was counted as compute, so the why lines called the norms compute-bound at 0.75 % of the peak.
    Its share of tau is the node's overhead now; the time is the same."""
    from dabench_ir.pipeline import profile_graph
    from tests.lowering_graphs import decoder

    report = profile_graph(decoder(layers=2, hidden=768, seq=1024, batch=4), "wse2", {"wse_mode": "pipelined"})
    plans = report.plan.node_plans
    norms = [plans[n.name] for n in report.graph.nodes if n.op_type == "LayerNormalization"]
    assert norms and all(p.overhead_s > p.compute_s > 0 and p.bound.value == "overhead" for p in norms)
    for p in norms:
        assert p.per_micro_batch_s * 4 == pytest.approx(p.compute_s + p.overhead_s, rel=1e-12)
