"""Instrumented MLIR pipelines: exact per-pass costs on tiny hand-written modules, and the study path."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("torch_mlir")

from dabench_ir.cli import main
from dabench_ir.errors import UserError
from dabench_ir.ir import Cost
from dabench_ir.mlir import (
    MLIR_ARTIFACT,
    MlirPassError,
    count_module,
    load_mlir,
    mlir_context,
    parse_mlir,
    parse_pipeline,
    run_mlir_pipeline,
    split_by_nodes,
    unit_graph,
    unit_names,
)
from tests.conftest import report_flags
from tests.test_study import _mlp

MAP = "#map = affine_map<(d0, d1) -> (d0, d1)>\n"
EW = """  %e{i} = tensor.empty() : tensor<4x8xf32>
  %{out} = linalg.generic {{indexing_maps = [{maps}], iterator_types = ["parallel", "parallel"]}}
      ins({ins} : {types}) outs(%e{i} : tensor<4x8xf32>) {{
  ^bb0({args}, %o: f32):
    %r = {body}
    linalg.yield %r : f32
  }} -> tensor<4x8xf32> loc("{loc}")
"""


def _ew(i: int, out: str, ins: list[str], body: str, loc: str) -> str:
    return EW.format(
        i=i,
        out=out,
        maps=", ".join(["#map"] * (len(ins) + 1)),
        ins=", ".join(ins),
        types=", ".join(["tensor<4x8xf32>"] * len(ins)),
        args=", ".join(f"%x{k}: f32" for k in range(len(ins))),
        body=body,
        loc=loc,
    )


def _module(*ops: str, ret: str) -> str:
    return (
        MAP + "func.func @main(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
        "  %z = arith.constant 0.0 : f32\n" + "".join(ops) + f"  return %{ret} : tensor<4x8xf32>\n}}\n"
    )


ADD_RELU = _module(
    _ew(0, "s", ["%a", "%b"], "arith.addf %x0, %x1 : f32", "Add"),
    _ew(1, "t", ["%s"], "arith.maximumf %x0, %z : f32", "Relu"),
    ret="t",
)
T = 4 * 8 * 4  # bytes of one 4x8 f32 tensor


def _parse(text: str):
    return parse_mlir(text, context=mlir_context(), isolate=False)


def test_add_then_relu_fused_reads_each_input_once_and_writes_once():
    record, counts = run_mlir_pipeline(_parse(ADD_RELU), ["linalg-fuse-elementwise-ops"])
    b = record.before
    assert (b.ops, b.linalg_ops, b.vector_flops) == (2, 2, 64)
    assert (b.bytes_read, b.bytes_written) == (3 * T, 2 * T)  # a, b, then s read back; s and t written
    assert (b.intermediates, b.intermediate_bytes) == (1, T)  # s
    (step,) = record.steps
    a = step.cost
    assert (a.ops, a.linalg_ops, a.vector_flops) == (1, 1, 64)  # the same arithmetic, one loop nest
    assert (a.bytes_read, a.bytes_written, a.intermediates, a.intermediate_bytes) == (2 * T, T, 0, 0)
    assert (step.kept, step.created, step.fused_away, step.removed) == (0, 1, 2, 0)
    (fused,) = counts
    assert set(fused.origin.names) == {"Add", "Relu"}  # the fused location names both nodes
    assert record.sources == {0: frozenset({0, 1})} and record.kept == frozenset()
    deltas = record.steps_dict()[0]["delta"]
    assert (deltas["bytes_read"], deltas["bytes_written"], deltas["intermediate_bytes"]) == (-T, -T, -T)


def test_a_fused_op_is_split_over_its_nodes_by_their_costs_before():
    before = {
        "Add": Cost(vector_flops=32, act_bytes_in=2 * T, act_bytes_out=T),
        "Relu": Cost(vector_flops=32, act_bytes_in=T, act_bytes_out=T),
    }
    _, counts = run_mlir_pipeline(_parse(ADD_RELU), ["linalg-fuse-elementwise-ops"])
    after, shared = split_by_nodes(counts, before)
    # fused: 64 vector FLOPs, 256 B read, 128 B written; read split 256:128 -> 171 + 85 (largest remainder)
    assert after["Add"] == Cost(vector_flops=32, act_bytes_in=171, act_bytes_out=64)
    assert after["Relu"] == Cost(vector_flops=32, act_bytes_in=85, act_bytes_out=64)
    assert after["Add"] + after["Relu"] == counts[0].cost
    assert shared == {"Add": {"Relu"}, "Relu": {"Add"}}


def test_one_value_in_two_operands_is_read_once():
    square = _module(_ew(0, "s", ["%a", "%a"], "arith.mulf %x0, %x1 : f32", "Square"), ret="s")
    (c,) = count_module(_parse(square))
    assert c.cost == Cost(vector_flops=32, act_bytes_in=T, act_bytes_out=T)


def test_dead_code_is_removed_not_fused():
    dead = _module(
        _ew(0, "s", ["%a", "%b"], "arith.addf %x0, %x1 : f32", "Add"),
        _ew(1, "u", ["%a", "%b"], "arith.mulf %x0, %x1 : f32", "Dead"),
        _ew(2, "t", ["%s"], "arith.maximumf %x0, %z : f32", "Relu"),
        ret="t",
    )
    record, counts = run_mlir_pipeline(_parse(dead), ["canonicalize", "cse"])
    canon, cse = record.steps
    assert (canon.kept, canon.created, canon.fused_away, canon.removed) == (2, 0, 0, 1)
    assert (record.before.ops, canon.cost.ops) == (3, 2)
    # a dead op is never counted (the counter's generalising clone drops it): bytes do not move
    assert (canon.cost.bytes_read, canon.cost.bytes_written) == (record.before.bytes_read, record.before.bytes_written)
    assert (cse.kept, cse.created, cse.removed) == (2, 0, 0)
    assert len(counts) == 2 and len(record.kept) == 2  # both ops are ops of the module before, untouched


def test_bufferization_shows_the_buffers_that_need_memory():
    unfused, _ = run_mlir_pipeline(_parse(ADD_RELU), ["one-shot-bufferize{bufferize-function-boundaries}"])
    fused, _ = run_mlir_pipeline(
        _parse(ADD_RELU), ["linalg-fuse-elementwise-ops", "one-shot-bufferize{bufferize-function-boundaries}"]
    )
    assert unfused.before.buffers is None  # still on tensors
    b = unfused.steps[-1].cost
    assert (b.buffers, b.buffer_bytes) == (2, 2 * T)  # s and t each get a buffer
    assert (b.bytes_read, b.bytes_written) == (3 * T, 2 * T)  # on buffers the counts are those of the tensors
    f = fused.steps[-1].cost
    assert (f.buffers, f.buffer_bytes, f.bytes_read, f.bytes_written) == (1, T, 2 * T, T)  # only the result


def test_a_failing_pass_names_itself_and_keeps_the_passes_before():
    with pytest.raises(MlirPassError) as info:
        run_mlir_pipeline(
            _parse(ADD_RELU),
            ["linalg-fuse-elementwise-ops", "one-shot-bufferize", "one-shot-bufferize{bufferize-function-boundaries}"],
        )
    msg = str(info.value)
    assert "one-shot-bufferize{bufferize-function-boundaries}" in msg and "to_tensor" in msg and "\n" not in msg
    assert [s.name for s in info.value.steps] == ["linalg-fuse-elementwise-ops", "one-shot-bufferize"]
    assert info.value.steps[0].cost.ops == 1


def test_pipeline_text_and_unknown_passes():
    assert parse_pipeline("a, b{x=1,y=2},func.func(c,d)") == ["a", "b{x=1,y=2}", "func.func(c,d)"]
    with pytest.raises(UserError):
        parse_pipeline("a,(b")
    with pytest.raises(UserError, match="no-such-pass"):
        run_mlir_pipeline(_parse(ADD_RELU), ["canonicalize", "no-such-pass"])


# Two layers as torch-mlir lowers them: one zero fill (named after layer 0's MatMul, which CSE kept)
# is the init of both layers' batch_matmuls through a reshape; bias Add then Relu per layer.
M3, B3, T3 = "affine_map<(d0, d1, d2) -> (d0, d1, d2)>", "affine_map<(d0, d1, d2) -> (d2)>", "tensor<1x4x8xf32>"
_EW3 = """  %{out} = linalg.generic {{indexing_maps = [{maps}], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins({ins} : {types}) outs(%e3 : {T3}) {{
  ^bb0({args}, %o: f32):
    {body}
  }} -> {T3} loc("{loc}")
"""


def _ew3(out: str, ins: list[tuple[str, str, str]], body: str, loc: str) -> str:
    """A 1x4x8 elementwise generic; ``ins``: (value, type, indexing map); ``body`` yields %r."""
    return _EW3.format(
        out=out,
        maps=", ".join([m for _, _, m in ins] + [M3]),
        ins=", ".join(v for v, _, _ in ins),
        types=", ".join(t for _, t, _ in ins),
        args=", ".join(f"%x{k}: f32" for k in range(len(ins))),
        body=body + "\n    linalg.yield %r : f32",
        T3=T3,
        loc=loc,
    )


def _layer(k: int, x: str) -> str:
    return (
        f"  %fe{k} = tensor.expand_shape %f [[0, 1], [2]] output_shape [1, 4, 8] : tensor<4x8xf32> into {T3} "
        f'loc("layers.{k}/MatMul")\n'
        f"  %m{k} = linalg.batch_matmul ins({x}, %w{k} : {T3}, tensor<1x8x8xf32>) outs(%fe{k} : {T3}) -> {T3} "
        f'loc("layers.{k}/MatMul")\n'
        + _ew3(
            f"a{k}",
            [(f"%m{k}", T3, M3), (f"%b{k}", "tensor<8xf32>", B3)],
            "%r = arith.addf %x0, %x1 : f32",
            f"layers.{k}/Add",
        )
        + _ew3(f"r{k}", [(f"%a{k}", T3, M3)], "%r = arith.maximumf %x0, %z : f32", f"layers.{k}/Relu")
    )


TWO_LAYERS = (
    f"func.func @main(%x: {T3}, %w0: tensor<1x8x8xf32>, %b0: tensor<8xf32>, %w1: tensor<1x8x8xf32>, "
    f"%b1: tensor<8xf32>) -> {T3} {{\n  %z = arith.constant 0.0 : f32\n"
    '  %e = tensor.empty() : tensor<4x8xf32> loc("layers.0/MatMul")\n'
    f'  %e3 = tensor.empty() : {T3} loc("layers.0/Add")\n'
    '  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32> loc("layers.0/MatMul")\n'
    + _layer(0, "%x")
    + _layer(1, "%r0")
    + f"  return %r1 : {T3}\n}}\n"
)


def test_a_shared_producer_re_created_per_layer_is_charged_to_each_layer_it_feeds():
    weights = frozenset({1, 2, 3, 4})
    module = _parse(TWO_LAYERS)
    counts0 = count_module(module, weight_args=weights)
    record, counts = run_mlir_pipeline(
        module, ["linalg-fuse-elementwise-ops", "canonicalize", "cse"], weight_args=weights
    )
    fuse, canon, cse = record.steps
    assert (fuse.kept, fuse.created, fuse.fused_away, fuse.removed) == (3, 2, 4, 0)  # Add+Relu, twice
    # canonicalize folds reshape(fill) into fill(reshape): the shared fill becomes one per layer
    assert (canon.kept, canon.created, canon.fused_away, canon.removed) == (4, 2, 1, 0)
    assert (canon.cost.bytes_written - fuse.cost.bytes_written, cse.created) == (T, 0)  # one more 4x8 fill written
    work = [(c.op_name, c.origin.names) for c in counts if c.op_name != "tensor.expand_shape"]
    assert work == [
        (op, names)
        for k in (0, 1)
        for op, names in (
            ("linalg.fill", (f"layers.{k}/MatMul",)),
            ("linalg.batch_matmul", (f"layers.{k}/MatMul",)),
            ("linalg.generic", (f"layers.{k}/Relu", f"layers.{k}/Add")),
        )
    ]
    before, _ = split_by_nodes(counts0, {})
    after, shared = split_by_nodes(counts, before)
    fill = Cost(act_bytes_out=T)
    mm = Cost(contraction_flops=2 * 4 * 8 * 8, weight_bytes=8 * 8 * 4, act_bytes_in=2 * T, act_bytes_out=T)
    assert before["layers.0/MatMul"] == fill + mm and before["layers.1/MatMul"] == mm  # the fill was layer 0's
    assert after["layers.0/MatMul"] == after["layers.1/MatMul"] == fill + mm  # now each layer fills its own
    for k in (0, 1):  # fused Add+Relu: reads the matmul result and the bias once, writes once; 32 adds, 32 maxes
        assert after[f"layers.{k}/Add"] + after[f"layers.{k}/Relu"] == Cost(
            vector_flops=64, weight_bytes=32, act_bytes_in=T, act_bytes_out=T
        )
    assert shared == {
        f"layers.{k}/{a}": {f"layers.{k}/{b}"} for k in (0, 1) for a, b in (("Add", "Relu"), ("Relu", "Add"))
    }
    # the shared fill (op 0 before) is behind both layers' fills; every op before is in some op's sources
    fills = [k for k, c in enumerate(counts) if c.op_name == "linalg.fill"]
    assert all(0 in record.sources[k] for k in fills)
    assert set().union(*record.sources.values()) == set(range(len(counts0)))


MM_BIAS_GELU = (  # batch_matmul into a zero fill, then bias Add, then erf-GELU lowered as two generics
    f"func.func @main(%x: {T3}, %w: tensor<1x8x8xf32>, %b: tensor<8xf32>) -> {T3} {{\n"
    "  %z = arith.constant 0.0 : f32\n  %h = arith.constant 0.5 : f32\n  %one = arith.constant 1.0 : f32\n"
    f"  %s2 = arith.constant 0.70710678 : f32\n  %e3 = tensor.empty() : {T3}\n"
    f'  %f = linalg.fill ins(%z : f32) outs(%e3 : {T3}) -> {T3} loc("MatMul")\n'
    f'  %m = linalg.batch_matmul ins(%x, %w : {T3}, tensor<1x8x8xf32>) outs(%f : {T3}) -> {T3} loc("MatMul")\n'
    + _ew3("a", [("%m", T3, M3), ("%b", "tensor<8xf32>", B3)], "%r = arith.addf %x0, %x1 : f32", "Add")
    + _ew3("g", [("%a", T3, M3)], "%t = arith.mulf %x0, %s2 : f32\n    %r = math.erf %t : f32", "Gelu")
    + _ew3(
        "y",
        [("%a", T3, M3), ("%g", T3, M3)],
        "%t = arith.addf %x1, %one : f32\n    %u = arith.mulf %x0, %t : f32\n    %r = arith.mulf %u, %h : f32",
        "Gelu",
    )
    + f"  return %y : {T3}\n}}\n"
)


def test_matmul_bias_gelu_bytes_per_pass_against_a_hand_count():
    weights = frozenset({1, 2})  # %w (256 B) and %b (32 B)
    module = _parse(MM_BIAS_GELU)
    before = split_by_nodes(count_module(module, weight_args=weights), {})[0]
    record, counts = run_mlir_pipeline(
        module, ["linalg-fuse-elementwise-ops", "canonicalize", "cse"], weight_args=weights
    )
    # by hand, T = one 1x4x8 f32 tensor (128 B), 32 elements:
    #   fill:   writes T                                      matmul: reads x (T), w (256), its init (T); writes T
    #   Add:    reads m (T), b (32); writes a (T); 32 adds    erf:    reads a; writes g; 32 muls + 32 erf
    #   combine: reads a and g (2T); writes T; 96 (add, mul, mul)
    b = record.before
    assert (b.ops, b.contraction_flops, b.vector_flops, b.special_ops) == (5, 512, 160, 32)
    assert (b.bytes_read, b.bytes_written) == (6 * T + 256 + 32, 5 * T)
    assert (b.intermediates, b.intermediate_bytes) == (4, 4 * T)  # the fill, m, a, g
    fuse = record.steps[0]
    # Add, erf and combine fuse into one generic: it reads m and b once and writes y; a and g are gone
    assert (fuse.kept, fuse.created, fuse.fused_away, fuse.removed) == (2, 1, 3, 0)
    assert record.steps_dict()[0]["delta"] == {
        "ops": -2,
        "linalg_ops": -2,
        "contraction_flops": 0,
        "vector_flops": 0,
        "special_ops": 0,
        "flops": 0,
        "bytes_read": -3 * T,
        "bytes_written": -2 * T,
        "intermediates": -2,
        "intermediate_bytes": -2 * T,
        "buffers": None,
        "buffer_bytes": None,
    }
    assert (fuse.cost.bytes_read, fuse.cost.bytes_written) == (3 * T + 256 + 32, 3 * T)
    assert all(v in (0, None) for s in record.steps_dict()[1:] for v in s["delta"].values())  # nothing left to do
    assert [c.origin.names for c in counts] == [("MatMul",), ("MatMul",), ("Gelu", "Add")]
    after, _ = split_by_nodes(counts, before)
    assert before["Add"] == Cost(vector_flops=32, weight_bytes=32, act_bytes_in=T, act_bytes_out=T)
    assert before["Gelu"] == Cost(vector_flops=128, special_ops=32, act_bytes_in=3 * T, act_bytes_out=2 * T)
    # the fused op (160 vector, 32 erf, 32 B weight, T in, T out) split field by field by those costs:
    # in 128 as 1:3 -> 32 / 96; out 128 as 1:2 -> 42.7 / 85.3 -> 43 / 85 (largest remainder)
    assert after["Add"] == Cost(vector_flops=32, weight_bytes=32, act_bytes_in=32, act_bytes_out=43)
    assert after["Gelu"] == Cost(vector_flops=128, special_ops=32, act_bytes_in=96, act_bytes_out=85)
    assert after["MatMul"] == before["MatMul"]


MM_BIAS_MM = (  # two linear layers: MM1's batch_matmul and bias Add (both its node's), MM2's batch_matmul
    f"func.func @main(%x: {T3}, %w: tensor<1x8x8xf32>, %b: tensor<8xf32>, %v: tensor<1x8x8xf32>) -> {T3} {{\n"
    f"  %z = arith.constant 0.0 : f32\n  %e3 = tensor.empty() : {T3}\n"
    f'  %f = linalg.fill ins(%z : f32) outs(%e3 : {T3}) -> {T3} loc("MM1")\n'
    f'  %m = linalg.batch_matmul ins(%x, %w : {T3}, tensor<1x8x8xf32>) outs(%f : {T3}) -> {T3} loc("MM1")\n'
    + _ew3("a", [("%m", T3, M3), ("%b", "tensor<8xf32>", B3)], "%r = arith.addf %x0, %x1 : f32", "MM1")
    + f'  %f2 = linalg.fill ins(%z : f32) outs(%e3 : {T3}) -> {T3} loc("MM2")\n'
    f'  %y = linalg.batch_matmul ins(%a, %v : {T3}, tensor<1x8x8xf32>) outs(%f2 : {T3}) -> {T3} loc("MM2")\n'
    f"  return %y : {T3}\n}}\n"
)


def test_a_fused_op_splits_each_field_by_what_its_own_ops_held():
    """MM1's bias Add fused into MM2's generalised matmul: the fused op's multiply-adds are MM2's
    alone (its own op held them), the Add's arithmetic MM1's. Split by the two nodes' whole costs,
    each holding 512 multiply-adds before, MM1 took half of MM2's (604 -> 906 / 302 MFLOP on GPT-2)."""
    weights = frozenset({1, 2, 3})
    module = _parse(MM_BIAS_MM)
    counts0 = count_module(module, weight_args=weights)
    before = split_by_nodes(counts0, {})[0]
    record, counts = run_mlir_pipeline(
        module, ["linalg-generalize-named-ops", "linalg-fuse-elementwise-ops"], weight_args=weights
    )
    assert any(set(c.origin.names) == {"MM1", "MM2"} and c.cost.contraction_flops for c in counts)  # fused
    after, _ = split_by_nodes(counts, before, sources=record.sources, counts_before=counts0)
    for node in ("MM1", "MM2"):
        assert after[node].contraction_flops == before[node].contraction_flops == 2 * 4 * 8 * 8
    # the bias add, now run once per reduction step of MM2's loop (8), is MM1's arithmetic
    assert (after["MM1"].vector_flops, after["MM2"].vector_flops) == (8 * before["MM1"].vector_flops, 0)
    by_whole = split_by_nodes(counts, before)[0]
    assert by_whole["MM1"].contraction_flops != before["MM1"].contraction_flops  # what the old rule did


M4, T4 = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>", "tensor<1x2x4x8xf32>"
ROPE_INTO_QK = f"""func.func @main(%q: {T4}, %c: {T4}, %k: tensor<2x8x4xf32>) -> tensor<2x4x4xf32> {{
  %z = arith.constant 0.0 : f32
  %e4 = tensor.empty() : {T4}
  %r = linalg.generic {{indexing_maps = [{M4}, {M4}, {M4}], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%q, %c : {T4}, {T4}) outs(%e4 : {T4}) {{
  ^bb0(%x0: f32, %x1: f32, %o: f32):
    %m = arith.mulf %x0, %x1 : f32
    linalg.yield %m : f32
  }} -> {T4} loc("Rope")
  %flat = tensor.collapse_shape %r [[0, 1], [2], [3]] : {T4} into tensor<2x4x8xf32> loc("QK")
  %e = tensor.empty() : tensor<2x4x4xf32> loc("QK")
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("QK")
  %s = linalg.batch_matmul ins(%flat, %k : tensor<2x4x8xf32>, tensor<2x8x4xf32>) outs(%f : tensor<2x4x4xf32>)
      -> tensor<2x4x4xf32> loc("QK")
  return %s : tensor<2x4x4xf32>
}}
"""  # LLaMA's rotary multiply, reshaped into the heads of the Q.K^T batch_matmul


def test_an_op_fused_through_a_reshape_into_a_matmul_is_claimed_by_it():
    record, counts = run_mlir_pipeline(_parse(ROPE_INTO_QK), ["linalg-fuse-elementwise-ops"])
    (step,) = record.steps
    # the reshape moves to the matmul's other operands, which becomes a 5-d generic reading q and c itself
    assert (step.kept, step.created, step.fused_away, step.removed) == (1, 1, 2, 0)  # Rope and the matmul went
    (qk,) = [c for c in counts if c.op_name == "linalg.generic"]
    assert qk.origin.names == ("QK", "Rope")
    # the rotary multiply now runs once per reduction step: 2*4*4*8 = 256 times instead of 64
    assert (qk.cost.contraction_flops, qk.cost.vector_flops) == (2 * 2 * 4 * 4 * 8, 256)
    assert set().union(*record.sources.values()) == {0, 1, 2, 3}  # Rope, the reshape, the fill, the matmul


R4, S4 = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>", "tensor<1x2x4x1xf32>"
NORM_INTO_MATMUL = f"""func.func @main(%x: {T4}, %k: tensor<2x8x4xf32>) -> tensor<2x4x4xf32> {{
  %z = arith.constant 0.0 : f32
  %e4 = tensor.empty() : {T4}
  %sq = linalg.generic {{indexing_maps = [{M4}, {M4}], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%x : {T4}) outs(%e4 : {T4}) {{
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %a : f32 loc("Norm")
    linalg.yield %m : f32
  }} -> {T4} loc("Norm")
  %es = tensor.empty() : {S4}
  %fs = linalg.fill ins(%z : f32) outs(%es : {S4}) -> {S4} loc("Norm")
  %s = linalg.generic {{indexing_maps = [{M4}, {R4}], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
      ins(%sq : {T4}) outs(%fs : {S4}) {{
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %a, %o : f32 loc("Norm")
    linalg.yield %m : f32
  }} -> {S4} loc("Norm")
  %d = linalg.generic {{indexing_maps = [{M4}, {R4}, {M4}], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%x, %s : {T4}, {S4}) outs(%e4 : {T4}) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32 loc("Norm")
    linalg.yield %m : f32
  }} -> {T4} loc("Norm")
  %flat = tensor.collapse_shape %d [[0, 1], [2], [3]] : {T4} into tensor<2x4x8xf32> loc("MatMul")
  %e = tensor.empty() : tensor<2x4x4xf32> loc("MatMul")
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("MatMul")
  %r = linalg.batch_matmul ins(%flat, %k : tensor<2x4x8xf32>, tensor<2x8x4xf32>) outs(%f : tensor<2x4x4xf32>)
      -> tensor<2x4x4xf32> loc("MatMul")
  return %r : tensor<2x4x4xf32>
}}
"""  # a norm (x * sum(x^2), locations on its body's ops too) reshaped into a matmul


def test_a_producer_fused_into_another_nodes_op_goes_with_its_consumer_not_to_its_nodes_other_op():
    record, counts = run_mlir_pipeline(_parse(NORM_INTO_MATMUL), ["linalg-fuse-elementwise-ops"])
    (step,) = record.steps
    assert (step.kept, step.created, step.fused_away, step.removed) == (2, 2, 4, 0)
    # the square fuses into the sum (an op of Norm's own); the multiply by the sum fuses into the matmul,
    # whose body now holds Norm's multiply: it is claimed there, not by the sum that only names its node
    work = {
        c.op_name + ":" + ",".join(c.origin.names): k for k, c in enumerate(counts) if c.op_name == "linalg.generic"
    }
    assert set(work) == {"linalg.generic:Norm", "linalg.generic:MatMul,Norm"}
    assert record.sources[work["linalg.generic:Norm"]] == {0, 2}  # square and sum (before: sq, fill, s, d, ...)
    assert record.sources[work["linalg.generic:MatMul,Norm"]] == {3, 4, 6}  # d, the reshape, the matmul


def test_after_bufferization_the_placed_graph_is_wired_by_buffer_writes_and_reads():
    graph = load_mlir(TWO_LAYERS)

    def edges(passes: list[str]) -> set[tuple[str, str]]:
        module = graph.meta[MLIR_ARTIFACT].module.operation.clone()
        _, counts = run_mlir_pipeline(module, passes)
        return set(unit_graph(graph, module, counts, unit_names(counts), path=None).to_networkx().edges())

    on_tensors = edges(["canonicalize"])  # SSA values: fill -> matmul -> add -> relu -> next layer's matmul
    chain = {
        (f"layers.{k}/{a}", f"layers.{k}/{b}")
        for k in (0, 1)
        for a, b in (("MatMul#0", "MatMul#1"), ("MatMul#1", "Add"), ("Add", "Relu"))
    } | {("layers.0/Relu", "layers.1/MatMul#1")}
    assert on_tensors == chain
    # bufferized (in place where it can): layer 0 copies the zero fill into its own buffer (MatMul#1),
    # layer 1 accumulates into the fill's buffer itself; Relu overwrites Add's buffer; the ops have no results
    assert edges(["one-shot-bufferize{bufferize-function-boundaries}"]) == {
        ("layers.0/MatMul#0", "layers.0/MatMul#1"),
        ("layers.0/MatMul#1", "layers.0/MatMul#2"),
        ("layers.0/MatMul#2", "layers.0/Add"),
        ("layers.0/Add", "layers.0/Relu"),
        ("layers.0/Relu", "layers.1/MatMul"),
        ("layers.0/MatMul#0", "layers.1/MatMul"),
        ("layers.1/MatMul", "layers.1/Add"),
        ("layers.1/Add", "layers.1/Relu"),
    }


M2, I2 = "affine_map<(d0, d1) -> (d0, d1)>", "affine_map<(d0, d1) -> (d0)>"
GATHER = f"""func.func @main(%ids: tensor<4xi64>, %table: tensor<16x8xf32>) -> tensor<4x8xf32> {{
  %e = tensor.empty() : tensor<4x8xf32>
  %g = linalg.generic {{indexing_maps = [{I2}, {M2}], iterator_types = ["parallel", "parallel"]}}
      ins(%ids : tensor<4xi64>) outs(%e : tensor<4x8xf32>) {{
  ^bb0(%i: i64, %o: f32):
    %r = arith.index_cast %i : i64 to index
    %c = linalg.index 1 : index
    %v = tensor.extract %table[%r, %c] : tensor<16x8xf32>
    linalg.yield %v : f32
  }} -> tensor<4x8xf32> loc("Gather")
  return %g : tensor<4x8xf32>
}}
"""  # an embedding lookup: 4 ids into a 16x8 table


def test_a_bufferized_gather_counts_as_on_tensors_and_reads_its_table():
    graph = load_mlir(GATHER)
    module = graph.meta[MLIR_ARTIFACT].module.operation.clone()
    record, counts = run_mlir_pipeline(module, ["one-shot-bufferize{bufferize-function-boundaries}"])
    b, a = record.before, record.steps[0].cost
    # 4 ids (32 B) read, one 4-byte element of the table per output element (32 x 4 B), 4x8 written
    assert (b.bytes_read, b.bytes_written) == (a.bytes_read, a.bytes_written) == (32 + 128, 128)
    (c,) = counts  # on buffers the body reads the table with memref.load: still a gather, not uncounted
    assert c.op_class == "data_movement" and a.buffers == 1
    (node,) = unit_graph(graph, module, counts, unit_names(counts), path=None).nodes
    assert node.inputs == ["arg0", "arg1"]  # the ids and, through the body's load, the table


def test_study_via_mlir_places_the_transformed_module(tmp_path, capsys):
    src = _mlp(tmp_path / "m.onnx")
    fuse = "linalg-fuse-elementwise-ops,canonicalize,cse"
    argv = ["study", src, "--via", "mlir", "--mlir-pipeline", fuse, "--pipeline", "ort-basic", "--target", "rdu"]
    assert main([*argv, *report_flags(tmp_path / "s"), "-o", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "pipeline=mlir:linalg-fuse-elementwise-ops,canonicalize,cse" in text and "per ONNX node" in text
    doc = json.loads((tmp_path / "s.json").read_text())
    mlir = next(r for r in doc["runs"] if r["pipeline"].startswith("mlir:"))
    t = mlir["totals"]
    assert t["source_nodes_accounted"] == t["nodes_before"]  # every op of the lowered module is in one row
    steps = mlir["mlir"]["steps"]
    assert [s["pass"] for s in steps] == ["linalg-fuse-elementwise-ops", "canonicalize", "cse"]
    # the bias Add and the Relu fuse: their intermediate is gone, the MatMuls stay
    assert steps[0]["delta"]["intermediates"] < 0 and steps[0]["delta"]["bytes_written"] < 0
    rows = {r["node"]: r for r in mlir["mlir"]["nodes"]}
    assert rows["fc1_bias"]["shared_with"] and "act" in rows["fc1_bias"]["shared_with"] + [rows["act"]["node"]]
    assert (
        sum(r["bytes_after"] for r in rows.values())
        == steps[-1]["after"]["bytes_read"] + steps[-1]["after"]["bytes_written"]
    )
    assert (tmp_path / "o" / "m.mlir-none.rdu.json").is_file()
    assert any(c["onnx_pipeline"] == "ort-basic" for c in doc.get("mlir_vs_onnx", []))
    # the CSV carries the per-pass table and the per-ONNX-node costs, once per MLIR pipeline
    with open(tmp_path / "s.csv", newline="") as fh:
        lines = list(csv.DictReader(fh))
    passes = [r for r in lines if r["status"] == "mlir-pass"]
    assert [r["node"] for r in passes] == [s["pass"] for s in steps] and {r["target"] for r in passes} == {""}
    prev = mlir["mlir"]["before"]
    for r, s in zip(passes, steps, strict=True):
        a = s["after"]
        assert (int(r["bytes_before"]), int(r["bytes_after"])) == (
            prev["bytes_read"] + prev["bytes_written"],
            a["bytes_read"] + a["bytes_written"],
        )
        assert (int(r["ops_before"]), int(r["ops_after"]), int(r["fused_away"])) == (
            prev["ops"],
            a["ops"],
            s["fused_away"],
        )
        prev = a
    nodes = {r["node"]: r for r in lines if r["status"] == "mlir-node"}
    assert set(nodes) == set(rows)
    assert nodes["fc1_bias"]["shared_with"] == ";".join(rows["fc1_bias"]["shared_with"])
    assert all(int(nodes[n]["bytes_after"]) == rows[n]["bytes_after"] for n in rows)
    page = (tmp_path / "s.html").read_text()
    assert "<h3>MLIR passes" in page and all(f"<td>{s['pass']}</td>" in page for s in steps)
    assert all(f"<td>{n}</td>" in page for n in rows) and "ONNX-level ort-basic vs MLIR-level" in page


def test_study_mlir_flags_are_checked(tmp_path, capsys):
    src = _mlp(tmp_path / "m.onnx")
    assert main(["study", src, "--via", "onnx", "--mlir-pipeline", "cse"]) == 2
    assert "drop --via onnx" in capsys.readouterr().err
    assert main(["study", src, "--via", "mlir", "--pipeline", "ort-basic"]) == 2
    assert "MLIR pipeline" in capsys.readouterr().err
    assert main(["study", src, "--via", "onnx", "--pipeline", "mlir-elementwise"]) == 2
    assert "drop --via onnx" in capsys.readouterr().err
    assert main(["study", src, "--via", "mlir", "--mlir-pipeline", "cse,bogus-pass", "-q"]) == 2
    err = capsys.readouterr().err
    assert "bogus-pass" in err and len(err.strip().splitlines()) == 1


def test_an_mlir_pipeline_runs_the_study_through_linalg_without_being_told(tmp_path, capsys):
    """``--mlir-pipeline`` (or a named MLIR pipeline) means ``--via mlir``: the flag is not needed twice."""
    src = _mlp(tmp_path / "m.onnx")
    out = tmp_path / "s.json"
    assert main(["study", src, "--mlir-pipeline", "cse", "-q", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert run["pipeline"] == "mlir:cse" and run["baseline_label"].endswith("pipeline=mlir-none") and run["mlir"]


def test_study_times_keep_their_sign():
    from dabench_ir.study.render import _t

    # a WSE step residual is negative where node times overlap: printed as a time with its sign
    assert (_t(-2.2e-3), _t(1e-6), _t(None)) == ("-2.2 ms", "1 µs", "-")


@pytest.mark.parametrize(
    ("passes", "lost"),
    [
        ("strip-debuginfo", "provenance lost: 100% of the work traced to graph nodes before the passes, 0% after"),
        (
            "one-shot-bufferize{bufferize-function-boundaries},convert-linalg-to-affine-loops",
            "work left the costed ops",
        ),
        ("canonicalize,cse", None),
    ],
)
def test_a_pass_that_loses_provenance_or_costed_work_gets_no_speedup(tmp_path, passes, lost):
    """Dropping locations (every op loses its node, sections collapse) or lowering to loops (the counts
    see no FLOPs) changes what the instrument sees, not the computation: the run says so and claims
    no speedup (an RDU "8.98x" from strip-debuginfo before)."""
    src = _mlp(tmp_path / "m.onnx")
    out = tmp_path / "s.json"
    assert main(["study", src, "--mlir-pipeline", passes, "-t", "rdu", "-q", "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["mlir"]["conservation"]["problem"] == lost or lost in (run["mlir"]["conservation"]["problem"] or "")
    if lost:
        assert (
            run["totals"]["speedup_total"] is None
            and f"no speedup: {run['mlir']['conservation']['problem']}" in run["warnings"]
        )
    else:
        assert run["totals"]["speedup_total"] is not None and not run["warnings"]
