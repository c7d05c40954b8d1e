"""A model exported inside a user's wrapper gives the figures of the model exported alone (issue 45).

The usual way to export a Hugging Face model with tensors-only inputs is a module of one's own whose
``self.model`` is the HF model and whose forward only calls it. Every recorded scope then starts one
level down (TorchScript's ``/model/model/layers.0/...``, dynamo's ``model.model.layers.0``), and the
RDU's O1 sections, which cut at modules, read a module outside the decoder blocks as the root's child:
the whole model became one module ``model``, so the final norm and the LM head shared a section and
the SN30 step was 6.6 % shorter than the same model's unwrapped (GPT-2 and Llama, TorchScript and
dynamo alike). `model_root` finds the module the model is in, and `module_of` reads the module below it.

The tolerance, stated before comparing: none, the figures are equal. Unlike two exporters
(`tests/test_exporter_differential.py`, ``REL_TOL`` = 5 % for their different decompositions), a
wrapper changes no node: the two graphs hold the same operators in the same order, and only the
scope text differs. So the parameter count, every FLOP count, the step time and each node's time and
unit are asserted equal, exactly, on every emulated target (the CPU target is timed by micro-benchmarks
of this host, not by a model of a compiler, as in the exporters' test).
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dabench_ir.cli import main
from dabench_ir.ir import Node, ScopeModule, layer_from_scope, model_path, model_root, module_of
from dabench_ir.lowering.context import module_key
from dabench_ir.study.diff import diff_reports
from tests._helpers import seeded_small_decoders

TARGETS = ("wse2", "sn30", "bow", "a100", "h100", "h200")
FORMS = ("plain", "wrapped", "listed")
"""How the model is exported: as its own class, in a wrapper's ``self.model``, in a wrapper's
``self.models = nn.ModuleList([model])`` (scopes ``models.0.…``: the list's index is no decoder block)."""
SEQ = 128

# -- the scope functions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scopes", "root"),
    [
        (["lm_head", "model.layers.0.self_attn", "model.norm", ""], ""),  # HF Llama as exported
        (["model.lm_head", "model.model.layers.0.self_attn", "model.model.norm", ""], "model"),  # wrapped
        (["model", "model.lm_head", "model.model"], "model"),  # the wrapped model's own nodes: at the root
        (["w.v.lm_head", "w.v.transformer.h.0.attn"], "w.v"),  # two wrappers
        (["0.lm_head", "0.transformer.h.0.attn"], "0"),  # nn.Sequential(model)
        (["models.0.lm_head", "models.0.model.layers.0.self_attn", "models.0.model.norm"], "models.0"),  # a list's
        (["models.0.model.layers.0.attn", "models.0.model.layers.0.mlp"], "models.0.model"),  # its one block
        (["models.0.attn", "models.0.mlp"], ""),  # no stack below the number: one block
        (["embed", "pos_embed", "layers.0.attn", "norm", "lm_head"], ""),  # the tool's own exports
        (["layers.0.attn", "layers.1.mlp"], ""),  # a stack alone: the root is above it, not ``layers``
        (["w.layers.0.attn", "w.layers.1.mlp"], "w"),
        (["layers.0.attn", "layers.0.mlp"], ""),  # one block: not inside it
        (["attn"], ""),  # one module holds every node: it is the model's own
        (["w.attn"], "w"),
        (["w.attn", "w.attn_norm"], "w"),  # whole parts: ``attn`` is no part of ``attn_norm``
        (["", ""], ""),
        ([], ""),
    ],
)
def test_model_root(scopes, root):
    assert model_root(scopes) == root


@pytest.mark.parametrize(
    ("scope", "root", "expected"),
    [
        ("lm_head", "", ScopeModule("", None, "lm_head", None, ("lm_head",))),
        ("model.lm_head", "model", ScopeModule("", None, "model.lm_head", None, ("lm_head",))),
        ("model.norm", "", ScopeModule("", None, "model", None, ("model", "norm"))),
        ("model.model.norm", "model", ScopeModule("", None, "model.model", None, ("model", "norm"))),
        ("model", "model", ScopeModule("", None, "", None, ())),  # the root's own node: no module
        ("", "", ScopeModule("", None, "", None, ())),
        ("ln_f", "", ScopeModule("", None, "ln_f", "norm", ("ln_f",))),
        ("w.ln_f", "w", ScopeModule("", None, "w.ln_f", "norm", ("ln_f",))),
        (
            "model.layers.3.self_attn.q_proj",
            "",
            ScopeModule("model.layers.3", 3, "model.layers.3.self_attn", "attention", ("self_attn", "q_proj")),
        ),
        # a decoder block by its own shape, at any depth, the root given or not
        *(
            (
                "model.model.layers.3.self_attn.q_proj",
                root,
                ScopeModule(
                    "model.model.layers.3", 3, "model.model.layers.3.self_attn", "attention", ("self_attn", "q_proj")
                ),
            )
            for root in ("", "model")
        ),
        (
            "/model/model/layers.3/mlp/down_proj",  # TorchScript's separators
            "model",
            ScopeModule("model.model.layers.3", 3, "model.model.layers.3.mlp", "mlp", ("mlp", "down_proj")),
        ),
        (
            "0.transformer.h.1.ln_2",
            "0",
            ScopeModule("0.transformer.h.1", 1, "0.transformer.h.1.ln_2", "norm", ("ln_2",)),
        ),
        ("model.layers.0", "model", ScopeModule("model.layers.0", 0, "model.layers.0", None, ())),
        # a list that holds the model: its number is no block below the root, and is one without it
        (
            "models.0.model.layers.3.mlp",
            "models.0",
            ScopeModule("models.0.model.layers.3", 3, "models.0.model.layers.3.mlp", "mlp", ("mlp",)),
        ),
        ("models.0.lm_head", "models.0", ScopeModule("", None, "models.0.lm_head", None, ("lm_head",))),
        ("models.0", "models.0", ScopeModule("", None, "", None, ())),
        ("models.0.lm_head", "", ScopeModule("models.0", 0, "models.0.lm_head", None, ("lm_head",))),
    ],
)
def test_module_of(scope, root, expected):
    assert module_of(scope, root) == expected


@pytest.mark.parametrize(
    ("path", "root", "expected"),
    [
        ("model.lm_head", "model", "lm_head"),
        ("model.model.layers.0.mlp", "model", "model.layers.0.mlp"),
        ("models.0.lm_head.weight", "models.0", "lm_head.weight"),
        ("model", "model", ""),
        ("modelx.lm_head", "model", "modelx.lm_head"),  # whole parts only
        ("lm_head", "model", "lm_head"),
        ("lm_head", "", "lm_head"),
    ],
)
def test_model_path(path, root, expected):
    assert model_path(path, root) == expected


def test_a_wrapper_leaves_the_modules_of_every_scope_alike():
    """The modules of an HF Llama's scopes, and of the same scopes one and two wrappers down or in a
    wrapper's list, part the nodes alike: the wrapped module is the unwrapped one with the wrapper's path
    in front, and its identity (`module_key`, the study's and the RDU's) is the unwrapped one's."""
    scopes = ["", "lm_head", "model", "model.embed_tokens", "model.rotary_emb", "model.norm"]
    scopes += [f"model.layers.{i}{m}" for i in range(2) for m in ("", ".self_attn", ".self_attn.q_proj", ".mlp")]
    own = {s: module_of(s, model_root(scopes)).module for s in scopes}
    keys = {s: module_key(Node("n", "Add", scope=s, layer=layer_from_scope(s)), model_root(scopes)) for s in scopes}
    for prefix in ("model.", "outer.model.", "models.0."):
        wrapped = [prefix + s if s else "" for s in scopes]
        root = model_root(wrapped)
        assert root == prefix[:-1]
        for scope, inside in zip(scopes, wrapped, strict=True):
            assert module_of(inside, root).module == (prefix + own[scope] if own[scope] else ""), scope
            node = Node("n", "Add", scope=inside, layer=layer_from_scope(inside))
            assert module_key(node, root) == keys[scope], scope


# -- the placement, on a small graph (no torch) ----------------------------------------------------


def _scoped_model(tmp_path, wrapper: str) -> str:
    """A one-block decoder whose node names are TorchScript's (``/layers.0/mlp/fc/MatMul``: the loader
    reads the scope from them), each under ``/{wrapper}`` when one is given; its last Mul is the top
    module's own node (``/Mul``: no scope; wrapped ``/model/Mul``: the wrapper's child's)."""
    top = f"/{wrapper}" if wrapper else ""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"], name=f"{top}/layers.0/mlp/fc_in/MatMul"),
        helper.make_node("Relu", ["h"], ["a"], name=f"{top}/layers.0/mlp/act/Relu"),
        helper.make_node("MatMul", ["a", "w_out"], ["o"], name=f"{top}/layers.0/mlp/fc_out/MatMul"),
        helper.make_node("Add", ["x", "o"], ["r"], name=f"{top}/layers.0/Add"),
        helper.make_node("LayerNormalization", ["r", "g", "b"], ["n"], axis=-1, name=f"{top}/norm/LayerNormalization"),
        helper.make_node("MatMul", ["n", "w_head"], ["logits"], name=f"{top}/lm_head/MatMul"),
        helper.make_node("Mul", ["logits", "scale"], ["y"], name=f"{top}/Mul"),
    ]
    inits = [weight("w_in", 64, 256), weight("w_out", 256, 64), weight("g", 64), weight("b", 64)]
    inits += [weight("w_head", 64, 512), numpy_helper.from_array(np.array(0.5, dtype=np.float32), "scale")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 512])
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    path = tmp_path / f"decoder-{wrapper or 'plain'}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return str(path)


def _report(path: str, target: str, tmp_path, capsys, *flags: str) -> dict:
    out = tmp_path / "report.json"
    assert main(["profile", path, "-t", target, *flags, "-q", "--json", str(out)]) == 0, capsys.readouterr().err
    return json.loads(out.read_text())


def _modules(report: dict) -> dict:
    """The report's per-module views: the role rows, the representative layer's and each node's role."""
    return {
        "roles": report["roles"],
        "representative_layer": report["representative_layer"],
        "layer_runs": report["layer_runs"],
        "why": report["why"],
        "node_roles": [n["role"] for n in report["nodes"]],
    }


def _diffed_alike(plain: dict, wrapped: dict) -> None:
    """The study's diff of the wrapped report against the plain one (`diff_reports`, matching nodes by
    module where their names differ) matches module for module: the plain export's modules, each with
    the same nodes, FLOPs, bytes and time either side, no source node left unmatched."""
    diff = diff_reports(plain, wrapped)
    assert diff["totals"]["nodes_removed"] == 0
    assert diff["totals"]["source_nodes_accounted"] == len(plain["nodes"])
    by_module: dict[str, list[dict]] = {}
    for row in diff_reports(plain, plain)["nodes"]:
        by_module.setdefault(row["module"], []).append(row)
    assert {m["module"] for m in diff["modules"]} == set(by_module)
    for m in diff["modules"]:
        assert m["nodes_before"] == m["nodes_after"] == len(by_module[m["module"]]), m
        for key in ("flops", "bytes", "time"):
            suffix = "_s" if key == "time" else ""
            assert m[f"{key}_before{suffix}"] == m[f"{key}_after{suffix}"], m


def _figures(report: dict) -> dict:
    """Everything of a report that is not a name: parameters, FLOPs, the step, and per node its time and unit."""
    nodes = report["nodes"]
    return {
        "params": report["model"]["params"],
        "totals": {k: v for k, v in report["totals"].items() if isinstance(v, (int, float))},
        "overheads": report["overheads"],
        "nodes": [(n["op_type"], n["layer"], n["flops"], n["time_s"], n["unit"]) for n in nodes],
    }


@pytest.mark.parametrize("wrapper", ["model", "models.0"])
@pytest.mark.parametrize("target", TARGETS)
def test_a_wrapper_places_a_small_decoder_alike(target, wrapper, tmp_path, capsys):
    """The wrapped graph's figures equal the plain one's, in a wrapper's ``self.model`` and in its
    ``self.models`` list (``/models.0/layers.0/...``: before, every node was read in one decoder block
    ``models.0`` and the WSE's kernels and the RDU's sections of the two differed). On the SN30 at O1
    the final norm, the LM head and the scaling after it are two sections in both (before: one, the
    wrapped model being one module ``model`` outside its block). The per-module views are the plain
    export's too (before, the roles kept the wrapper's path: ``model.lm_head``), and so is the study's
    diff of the two, module for module (before, no module matched: ``model.lm_head`` for ``lm_head``)."""
    plain, wrapped = (_scoped_model(tmp_path, w) for w in ("", wrapper))
    a, b = (_report(path, target, tmp_path, capsys) for path in (plain, wrapped))
    assert _figures(a) == _figures(b)
    assert _modules(a) == _modules(b)
    _diffed_alike(a, b)
    if target == "sn30":
        units = {n["name"].removeprefix(f"/{wrapper}"): n["unit"] for n in b["nodes"]}
        assert units["/norm/LayerNormalization"] != units["/lm_head/MatMul"] == units["/Mul"]


@pytest.mark.parametrize("target", ["wse2", "sn30"])
def test_a_wrapper_trains_a_small_decoder_alike(target, tmp_path, capsys):
    """Training appends a loss and an optimizer step (scopes ``loss``, ``optimizer``) that are in none of
    the model's modules: the model's root is read without them (`Graph.model_root`), so the wrapped
    training step's figures and per-module views are the plain one's."""
    paths = [_scoped_model(tmp_path, w) for w in ("", "model", "models.0")]
    plain, *wrapped = (_report(path, target, tmp_path, capsys, "--mode", "train") for path in paths)
    assert any(n["op_type"].startswith("dabench::") for n in plain["nodes"])  # the training pass's own
    for report in wrapped:
        assert _figures(report) == _figures(plain)
        assert _modules(report) == _modules(plain)
        _diffed_alike(plain, report)


# -- Hugging Face models, exported with and without a wrapper --------------------------------------


@contextlib.contextmanager
def _torchscript_masks():
    """transformers' mask code for TorchScript: its default builds the causal mask with ``torch.vmap``,
    which ``torch.onnx.export(dynamo=False)`` cannot trace; optimum's exporter swaps in its vectorised
    equivalent for the export, and so does this, putting the originals back after."""
    import transformers.masking_utils as masks
    from optimum.exporters.onnx.model_patcher import eager_mask_without_vmap, find_packed_sequence_indices_patched

    packed = masks.find_packed_sequence_indices
    masks.ALL_MASK_ATTENTION_FUNCTIONS.register("eager", eager_mask_without_vmap)
    masks.find_packed_sequence_indices = find_packed_sequence_indices_patched
    try:
        yield
    finally:
        masks.ALL_MASK_ATTENTION_FUNCTIONS.register("eager", masks.eager_mask)
        masks.find_packed_sequence_indices = packed


def _forms(model):
    """The model in each of `FORMS`: as its own class (a subclass whose forward takes and returns tensors:
    its scopes are the model's), inside a user's wrapper (``self.model``, scopes one level down) and in a
    wrapper's list (``self.models``, scopes two levels down, the second a number), the same weights."""
    import torch

    class Step(type(model)):
        def forward(self, input_ids, attention_mask, position_ids):
            return (
                super()
                .forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
                .logits
            )

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, input_ids, attention_mask, position_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).logits

    class Listed(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.models = torch.nn.ModuleList([inner])

        def forward(self, input_ids, attention_mask, position_ids):
            return self.models[0](
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).logits

    plain = Step(model.config).eval()
    plain.load_state_dict(model.state_dict())
    return plain, Wrapper(model).eval(), Listed(model).eval()


def _export(module, path: str, dynamo: bool) -> str:
    import torch

    b, s = 2, 3  # a sample with no dim of 1 (torch.export specialises those)
    args = (torch.zeros(b, s, dtype=torch.long), torch.ones(b, s, dtype=torch.long), torch.arange(s).repeat(b, 1))
    names = ["input_ids", "attention_mask", "position_ids"]
    if dynamo:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        shapes = {name: {0: batch, 1: seq} for name in names}
        torch.onnx.export(module, args, path, dynamo=True, dynamic_shapes=shapes, input_names=names)
    else:
        axes = {name: {0: "batch", 1: "seq"} for name in names}
        with _torchscript_masks():
            torch.onnx.export(module, args, path, dynamo=False, input_names=names, dynamic_axes=axes)
    return path


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Per family, per exporter (``torchscript``, ``dynamo``), per form (`FORMS`): the file."""
    models = seeded_small_decoders()
    folder = tmp_path_factory.mktemp("wrapped")
    out: dict[str, dict[str, dict[str, str]]] = {}
    for family, model in models:
        model.config._attn_implementation = "eager"  # both exporters write the same attention program
        forms = dict(zip(FORMS, _forms(model.eval()), strict=True))
        out[family] = {
            exporter: {
                form: _export(module, str(folder / f"{family}-{exporter}-{form}.onnx"), exporter == "dynamo")
                for form, module in forms.items()
            }
            for exporter in ("torchscript", "dynamo")
        }
    return out


@pytest.mark.slow  # twelve exports and 72 profiles, about 40 s
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_wrapped_export_gives_the_figures_of_the_model(exports, family, exporter, tmp_path, capsys):
    """Per target and wrapper: the wrapped export's parameters, FLOPs, step time and every node's time and
    unit equal the plain export's (see the module docstring: no tolerance), and so do its per-module views
    and the study's diff of the two, module for module. Before `model_root` the SN30 step was 6.6 %
    shorter wrapped (14 sections for 15) in all four cases; every other target was equal. In a wrapper's
    list (``models.0``) the WSE's figures differed until the list's number was read as no block."""
    paths = exports[family][exporter]
    scopes = {}
    for target in TARGETS:
        reports = {f: _report(paths[f], target, tmp_path, capsys, "--batch", "1", "--seq", str(SEQ)) for f in paths}
        for form in FORMS[1:]:
            assert _figures(reports[form]) == _figures(reports["plain"]), (target, form)
            assert _modules(reports[form]) == _modules(reports["plain"]), (target, form)
            _diffed_alike(reports["plain"], reports[form])
        scopes = {f: {n["scope"] for n in reports[f]["nodes"]} for f in FORMS}
    assert (
        "model.lm_head" in scopes["wrapped"] and model_root(scopes["wrapped"]) == "model"
    )  # the wrapper is in the scopes
    assert "models.0.lm_head" in scopes["listed"] and model_root(scopes["listed"]) == "models.0"
