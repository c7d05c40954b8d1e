"""Two exports of the same model give the same figures (issue 45): a random-initialised Hugging Face GPT-2
and Llama (built from configs, no download) exported by TorchScript (optimum's exporter, which patches
transformers' vmap mask code that a plain ``torch.onnx.export(dynamo=False)`` fails in) and by torch's
dynamo exporter (``torch.onnx.export(dynamo=True)`` with ``dynamic_shapes``), the same model call on
both sides: ``input_ids``, ``attention_mask`` and ``position_ids``, with and without a KV cache, eager
attention. Profiled with only ``--batch``, ``--seq`` (and ``--past``) on every emulated target.

The tolerance, stated before any figure was looked at: ``REL_TOL`` = 5 % of the step time on every
target. Both graphs hold the same matmuls (their contraction FLOPs are asserted equal, exactly) and the
same parameters (equal, and equal to transformers' ``num_parameters``); the rest is the same elementwise
work (the mask built from ``attention_mask``, softmax, norms, activations, rotary) up to the exporter's
decomposition: TorchScript writes its shape arithmetic (``Shape -> Gather -> Unsqueeze -> Concat``),
casts and layout ops as nodes, dynamo writes fewer. The tool folds the shape arithmetic at compile time
once the dims are bound and a compiler removes no-op casts and copies, so what may still differ is small
layout and elementwise work beside the matmuls and attention at this size: 5 %.

What is not the same program is not compared: optimum's default (``main_export``) loads the model with
SDPA attention, and TorchScript writes ``scaled_dot_product_attention`` with the query and the key each
scaled by the square root of the scale and the probabilities guarded by ``IsNaN``/``Where`` (fully masked
rows), work the eager program does not do; so both exports here run eager attention, and
`test_sdpa_export_is_another_program` pins that difference.

The CPU target is left out: it is timed by micro-benchmarks of this host (``calibrate``), not by a
compiler's model, and takes tens of seconds for a new model's ops.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dabench_ir.cli import main
from tests._helpers import SMALL, SMALL_KV_HEADS, seeded_small_decoders

REL_TOL = 0.05
"""Step time, relative, per target: see the module docstring (stated before the first comparison)."""

LAYERS, HIDDEN, HEADS, KV_HEADS = SMALL["layers"], SMALL["hidden"], SMALL["heads"], SMALL_KV_HEADS
SEQ, PAST = 128, 127  # a prefill of 128 tokens; a decode step of one token over 127 cached
TARGETS = ("wse2", "sn30", "bow", "a100", "h100", "h200")
PARAMS: dict[str, int] = {}


def _step_class(base):
    """``base`` (the HF class itself, so the module scopes are the model's own, as TorchScript records
    them) with a forward of tensors only: the cache as lists of keys and values, rebuilt as the
    ``DynamicCache`` transformers takes (torch.export cannot take one as an input)."""
    import transformers

    class Step(base):
        def forward(self, input_ids, attention_mask, position_ids, keys=None, values=None):
            args = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
            if keys is None:
                return super().forward(**args, use_cache=False).logits
            cache = transformers.DynamicCache()
            for i, (k, v) in enumerate(zip(keys, values, strict=True)):
                cache.update(k, v, i)
            out = super().forward(**args, past_key_values=cache, use_cache=True)
            layers = out.past_key_values.layers
            return out.logits, *(layer.keys for layer in layers), *(layer.values for layer in layers)

    return Step


def _dynamo_exports(folder, family: str, base) -> dict[str, str]:
    import torch

    model = _step_class(base).from_pretrained(folder / family, attn_implementation="eager").eval()
    batch, seq, past, total = (torch.export.Dim(n) for n in ("batch", "seq", "past", "total"))
    tokens = {0: batch, 1: seq}
    b, s, p = 2, 3, 7  # a sample with no dim of 1 (torch.export specialises those)
    plain = folder / f"{family}-dynamo.onnx"
    args = (torch.zeros(b, s, dtype=torch.long), torch.ones(b, s, dtype=torch.long), torch.arange(s).repeat(b, 1))
    shapes = {"input_ids": tokens, "attention_mask": tokens, "position_ids": tokens}
    names = ["input_ids", "attention_mask", "position_ids"]
    torch.onnx.export(model, args, str(plain), dynamo=True, dynamic_shapes=shapes, input_names=names)
    kv_heads = KV_HEADS if family == "llama" else HEADS
    cache = [torch.randn(b, kv_heads, p, HIDDEN // HEADS) for _ in range(LAYERS)]
    args = (
        torch.zeros(b, s, dtype=torch.long),
        torch.ones(b, p + s, dtype=torch.long),
        torch.arange(p, p + s).repeat(b, 1),
        cache,
        list(cache),
    )
    shapes = {**shapes, "attention_mask": {0: batch, 1: total}}
    shapes |= {"keys": [{0: batch, 2: past}] * LAYERS, "values": [{0: batch, 2: past}] * LAYERS}
    names += [f"past_key_values.{i}.{kind}" for kind in ("key", "value") for i in range(LAYERS)]
    cached = folder / f"{family}-dynamo-past.onnx"
    torch.onnx.export(model, args, str(cached), dynamo=True, dynamic_shapes=shapes, input_names=names)
    return {"plain": str(plain), "past": str(cached)}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Per family, per cache (``plain``, ``past``), per exporter: the ONNX file."""
    models = seeded_small_decoders()
    from optimum.exporters.onnx import onnx_export_from_model

    folder = tmp_path_factory.mktemp("exporters")
    out: dict[str, dict[str, dict[str, str]]] = {}
    for family, model in models:
        model.save_pretrained(folder / family)
        PARAMS[family] = model.num_parameters()
        base = type(model)
        eager = base.from_pretrained(folder / family, attn_implementation="eager").eval()
        torchscript = {}
        for cache, task in (("plain", "text-generation"), ("past", "text-generation-with-past")):
            onnx_export_from_model(eager, folder / f"{family}-{cache}", task=task, do_validation=False)
            torchscript[cache] = str(folder / f"{family}-{cache}" / "model.onnx")
        out[family] = {"torchscript": torchscript, "dynamo": _dynamo_exports(folder, family, base)}
    out["root"] = {"folder": {"path": str(folder)}}
    return out


def _report(path: str, target: str, cache: str, tmp_path, capsys) -> dict:
    out = tmp_path / f"{target}.json"
    step = ["--seq", "1", "--past", str(PAST)] if cache == "past" else ["--seq", str(SEQ)]
    argv = ["profile", path, "-t", target, "--batch", "1", *step, "-q", "--json", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(out.read_text())


@pytest.mark.slow  # eight exports and 48 profiles, about 40 s
@pytest.mark.parametrize("cache", ["plain", "past"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_two_exporters_give_the_same_figures(exports, family, cache, tmp_path, capsys):
    """Per target: the same parameters and contraction FLOPs (exactly) and the step time within
    ``REL_TOL``. Before issue 45's fixes the step differed by up to 30 % (WSE-2 decode: a mask's trailing
    dim of 1 streamed as 128 rows), 27 % (SN30: an unscoped ``Split`` cut an O1 section), 14 % (GPUs:
    folded shape arithmetic started kernels and broke fusion chains; no-op casts and slices and a
    transpose read only for its shape were kernels or host dispatches) and 13 % (Bow: the same nodes);
    after them, within 1 % on every target."""
    paths = {exporter: exports[family][exporter][cache] for exporter in ("torchscript", "dynamo")}
    far = []
    for target in TARGETS:
        ts, dyn = (_report(paths[e], target, cache, tmp_path, capsys) for e in ("torchscript", "dynamo"))
        assert ts["model"]["params"] == dyn["model"]["params"] == PARAMS[family], target
        assert ts["totals"]["contraction_flops"] == dyn["totals"]["contraction_flops"], target
        a, b = ts["totals"]["time_s"], dyn["totals"]["time_s"]
        if abs(b - a) > REL_TOL * a:
            far.append(f"{target}: torchscript {a * 1e6:.2f} us, dynamo {b * 1e6:.2f} us ({b / a - 1:+.1%})")
    assert not far, f"{family} {cache}: step time beyond {REL_TOL:.0%}: " + "; ".join(far)


@pytest.mark.slow
def test_sdpa_export_is_another_program(exports, tmp_path, capsys):
    """optimum's default export (SDPA attention, written by TorchScript) guards the softmax with
    ``IsNaN``/``Where`` and scales the query and the key separately: the same matmuls (contraction
    FLOPs equal to the eager export's) but more elementwise work, so its time is not compared."""
    import onnx
    from optimum.exporters.onnx import main_export

    folder = exports["root"]["folder"]["path"]
    main_export(f"{folder}/gpt2", output=f"{folder}/gpt2-sdpa", task="text-generation", do_validation=False)
    path = f"{folder}/gpt2-sdpa/model.onnx"
    ops = [n.op_type for n in onnx.load(path, load_external_data=False).graph.node]
    assert ops.count("IsNaN") == LAYERS
    sdpa = _report(path, "h100", "plain", tmp_path, capsys)
    eager = _report(exports["gpt2"]["torchscript"]["plain"], "h100", "plain", tmp_path, capsys)
    assert sdpa["totals"]["contraction_flops"] == eager["totals"]["contraction_flops"]
    assert sdpa["totals"]["vector_flops"] > eager["totals"]["vector_flops"]


# -- the mechanisms, on small graphs (no torch) ----------------------------------------------------


def _model_file(tmp_path, nodes, inits, outputs) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    outs = [helper.make_tensor_value_info(name, dtype, None) for name, dtype in outputs]
    graph = helper.make_graph(nodes, "g", [x], outs, initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return str(path)


def _ints(name: str, values: list[int] | int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def test_no_op_copies_and_shape_only_reads_cost_nothing(tmp_path):
    """A Cast to the input's own type, a Slice and an Expand that return their whole input, and a
    Transpose read only by a (folded) Shape are eliminated at compile time: no cost, and the report's
    note says why; a Slice of half the input and a Cast to fp16 stay real copies."""
    from dabench_ir.options import ProfileOptions
    from dabench_ir.passes import meta
    from dabench_ir.pipeline import prepare_graph

    f16 = TensorProto.FLOAT16
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT, name="same_cast"),
        helper.make_node("Slice", ["c", "zero", "all", "axis", "one"], ["s"], name="whole_slice"),
        helper.make_node("Shape", ["s"], ["shape"], name="shape"),
        helper.make_node("Expand", ["s", "shape"], ["e"], name="same_expand"),
        helper.make_node("Slice", ["e", "zero", "half", "axis"], ["h"], name="half_slice"),
        helper.make_node("Cast", ["h"], ["y"], to=f16, name="real_cast"),
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1], name="read_for_its_shape"),
        helper.make_node("Shape", ["t"], ["t_shape"], name="t_shape"),
        helper.make_node("Reshape", ["x", "t_shape"], ["r"], name="reshape"),
    ]
    inits = [_ints("zero", [0]), _ints("all", [16]), _ints("axis", [2]), _ints("one", [1]), _ints("half", [8])]
    path = _model_file(tmp_path, nodes, inits, [("y", f16), ("r", TensorProto.FLOAT)])
    graph = prepare_graph(path, ProfileOptions(), None)
    eliminated = {n.name for n in graph.nodes if meta.ELIMINATED in n.meta}
    assert eliminated == {"same_cast", "whole_slice", "same_expand", "read_for_its_shape"}
    for name in eliminated:
        assert meta.get_cost(graph.node(name)).bytes == 0
    assert meta.get_cost(graph.node("half_slice")).bytes > 0 and meta.get_cost(graph.node("real_cast")).bytes > 0


def test_folded_constant_arithmetic_neither_launches_nor_breaks_a_fusion(tmp_path):
    """TorchScript writes the attention scale's arithmetic (on constants once the dims are bound)
    between the scores' MatMul and its Div: folded at compile time, it rides with the MatMul's kernel
    and the Div still fuses into it, one kernel as in the export that writes the scale as a constant."""
    from dabench_ir.lowering.context import LoweringContext, kernel_groups
    from dabench_ir.options import ProfileOptions
    from dabench_ir.pipeline import prepare_graph

    weight = numpy_helper.from_array(np.full((16, 16), 0.5, dtype=np.float32), "w")
    dims = helper.make_tensor("dims", TensorProto.FLOAT, [2], [8.0, 64.0])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["scores"], name="scores"),
        helper.make_node("Constant", [], ["dims"], value=dims, name="dims"),
        helper.make_node("Gather", ["dims", "last"], ["head"], axis=0, name="head"),  # constants only: folded
        helper.make_node("Sqrt", ["head"], ["scale"], name="scale"),  # folded
        helper.make_node("Div", ["scores", "scale"], ["y"], name="scaled"),
    ]
    path = _model_file(tmp_path, nodes, [weight, _ints("last", 1)], [("y", TensorProto.FLOAT)])
    graph = prepare_graph(path, ProfileOptions(), None)
    ctx = LoweringContext.build(graph)
    launched = [[n.name for n in g] for g in kernel_groups(ctx, True) if any(ctx.is_work(n) for n in g)]
    assert launched == [["scores", "dims", "head", "scale", "scaled"]]
