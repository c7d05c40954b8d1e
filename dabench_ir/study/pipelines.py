"""Named pass pipelines a study runs on one model: a registry users can add to.

A `Pipeline` is a list of graph passes (run by the `PassManager`, before costing) and a set
of knob overrides (placement variants such as an RDU opt level or a WSE mode). The graph
passes here rewrite the ONNX model itself (`OnnxRewritePass`): they read the model the
Graph came from, hand it to an optimiser (onnxscript, onnxruntime), save what comes back
beside the study's outputs, and load that as the new Graph. Adding a pipeline is one call:

    register_pipeline(Pipeline("my-fusion", "what it does", passes=lambda: [MyRewrite()]))
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dabench_ir.errors import UserError
from dabench_ir.options import OPT_LEVELS, WSE_MODES
from dabench_ir.passes import Pass, PassResult
from dabench_ir.passes.cost_rules import traits_of
from dabench_ir.passes.meta import MODEL_PARAMS, MODEL_WEIGHTS

from .scopes import attach_scopes, write_scopes

if TYPE_CHECKING:
    import onnx

    from dabench_ir.ir import Graph

__all__ = [
    "OnnxRewritePass",
    "Pipeline",
    "declare_weights",
    "get_pipeline",
    "lost_weights",
    "pipeline_names",
    "register_pipeline",
]

logger = logging.getLogger(__name__)

Rewrite = Callable[["onnx.ModelProto", Path], "onnx.ModelProto"]


@dataclass(frozen=True)
class OnnxRewritePass(Pass):
    """Rewrite the ONNX model a Graph was loaded from with ``rewrite`` and load the result.

    ``rewrite(model, workdir)`` returns the optimised ModelProto; it is saved as
    ``<out_dir>/<stem>.<name>.onnx`` (a temporary folder when ``out_dir`` is None), and the
    new Graph's ``path`` points there, so later runs and measurements read the same model.

    Optimisers drop the exporter's node scopes (onnxruntime keeps none); the pass re-attaches
    them from ``graph`` through the `provenance` of each new node (`scopes.attach_scopes`:
    the common module of the source nodes it came from) and records them in the saved file.

    Optimisers fold layouts of weights into new initializers (onnxruntime saves a transposed
    weight as ``val_19``); the pass declares each one a weight when the source graph computed it
    from one (`declare_weights`), so training still updates it and the parameter count holds.

    A ``graph`` with bound dims (a study's run at ``--batch``/``--seq``) is rewritten at those
    dims (`bind_dims`): the optimiser sees the shapes the run asks, and its output has no
    symbols of its own to bind (onnxruntime's fused ``com.microsoft`` ops are opaque to ONNX
    shape inference, so the ``unk__N`` dims it names in a dynamic model could not be derived).
    """

    name: str = "onnx-rewrite"
    in_place: ClassVar[bool] = False  # a new Graph, loaded from the rewritten file
    rewrite: Rewrite | None = None
    out_dir: str | None = None

    def requires(self, graph: Graph) -> None:
        if not graph.path or not Path(graph.path).is_file():
            raise UserError(f"pipeline pass {self.name!r} rewrites the model file; give the model as an .onnx path")

    def call(self, graph: Graph) -> PassResult:
        import onnx

        from dabench_ir.frontends.onnx import load_onnx

        assert self.rewrite is not None, "OnnxRewritePass needs a rewrite function"
        src = Path(str(graph.path))
        out_dir = Path(self.out_dir) if self.out_dir else Path(tempfile.mkdtemp(prefix="dabench-study-"))
        out_dir.mkdir(parents=True, exist_ok=True)
        model = onnx.load(str(src), load_external_data=False)
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
            model = onnx.load(str(src))
        if graph.bindings:
            from dabench_ir.models.export import bind_dims

            model = bind_dims(model, dict(graph.bindings))
            del model.graph.value_info[:]  # the export's inferred shapes, symbolic: inferred again, static
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        try:
            optimised = self.rewrite(model, out_dir)
        except UserError:
            raise
        except Exception as exc:  # optimisers raise their own types; say which pipeline failed on what
            raise UserError(
                f"pipeline pass {self.name!r} failed on {src.name}: {str(exc).splitlines()[0][:300]}"
            ) from None
        path = out_dir / f"{src.stem}.{self.name}.onnx"
        declare_weights(graph, optimised)
        onnx.save(optimised, str(path))
        new = load_onnx(str(path))
        counts = attach_scopes(graph, new)
        write_scopes(optimised, new)  # later loads of the file (placing, diff, measuring) read them
        onnx.save(optimised, str(path))
        logger.info(
            "%s: scopes re-attached to %d nodes (%s)",
            self.name,
            len(new.nodes),
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        )
        new.metadata = {**graph.metadata, **new.metadata}
        return PassResult(new, True)


def _stored_sources(graph: Graph, tensor: str) -> set[str]:
    """The stored values (weights, constants) whose data ``tensor`` is computed from in ``graph``:
    itself when stored; nothing when it is not one of the graph's values."""
    sources: set[str] = set()
    seen: set[str] = set()
    stack = [tensor]
    while stack:
        name = stack.pop()
        value = graph.values.get(name)
        if name in seen or value is None:
            continue
        seen.add(name)
        if value.kind.is_stored:
            sources.add(name)
        elif value.producer is not None:
            producer = graph.node(value.producer)
            if not traits_of(producer).reads_metadata_only:  # a mask sized by the embeddings' Shape is no weight
                stack.extend(t for t in producer.inputs if t)
    return sources


def declare_weights(source: Graph, model: onnx.ModelProto) -> list[str]:
    """Write the parameters of ``model`` (``source`` rewritten) into its ``dabench.weights`` and return them.

    A parameter is a weight of ``source`` the rewrite kept under its name, or a new initializer
    named after a ``source`` value computed from a weight (onnxruntime's and onnxscript's constant
    folding save ``Transpose(layers.0.attn.q_proj.weight)`` as ``val_11``; a ``Gather`` of the
    position table by a constant ``arange`` as ``embedding_1``). Without this the loader's rule
    (`frontends.onnx`: a declared model's undeclared initializer is a constant) would make every
    folded weight a constant: no gradient, no optimizer step, and ``model.params`` 107,264 -> 1,792.
    A ``source`` without weights leaves ``model`` as it is.
    """
    weights = {v.name for v in source.weights()}
    if not weights:
        return []
    stored = [t.name for t in model.graph.initializer] + [v.name for v in model.graph.input]
    declared = [name for name in dict.fromkeys(stored) if _stored_sources(source, name) & weights]
    kept = [p for p in model.metadata_props if p.key != MODEL_WEIGHTS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = MODEL_WEIGHTS, json.dumps(declared)
    return declared


def lost_weights(source: Graph, rewritten: Graph) -> list[str]:
    """The weights of ``source`` that no parameter of ``rewritten`` holds or was folded from
    (`declare_weights`): merged into an identical one (onnxscript's initializer deduplication
    merges the export's equal LayerNorm scales) or dropped."""
    held: set[str] = set()
    for value in rewritten.weights():
        held |= _stored_sources(source, value.name)
    return [v.name for v in source.weights() if v.name not in held]


@dataclass(frozen=True)
class Pipeline:
    """A named study pipeline: graph passes to run first, and knob overrides for placing.

    ``passes(out_dir)`` builds the passes (None: the model as it is); ``options`` overrides
    `ProfileOptions` knobs (``{"opt_level": "O0"}``); ``targets`` limits the pipeline to
    target kinds (None: every target); ``needs`` names a module that must be importable.
    ``mlir`` makes it an MLIR pipeline: upstream MLIR passes run one at a time on the model's
    linalg-on-tensors module (`dabench_ir.mlir.pipelines`; the study needs ``--via mlir``).
    ``quantises`` says its passes may change the parameter count (packed low-bit weights); any
    other rewrite that does so gets no speedup in a study (`study.run.parameters_changed`).
    """

    name: str
    help: str
    passes: Callable[[str | None], Sequence[Pass]] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    targets: frozenset[str] | None = None
    needs: str | None = None
    mlir: tuple[str, ...] | None = None
    quantises: bool = False

    def applies_to(self, target_kind: str | None) -> bool:
        return self.targets is None or target_kind in self.targets

    def build(self, out_dir: str | None) -> list[Pass]:
        if self.needs:
            import importlib.util

            if importlib.util.find_spec(self.needs) is None:
                raise UserError(f"--pipeline {self.name}: needs the {self.needs!r} package (pip install {self.needs})")
        return list(self.passes(out_dir)) if self.passes else []


_PIPELINES: dict[str, Pipeline] = {}


def register_pipeline(pipeline: Pipeline, *, replace: bool = False) -> Pipeline:
    """Add ``pipeline`` to the registry (``dabench-ir study --pipeline NAME`` finds it)."""
    if pipeline.name in _PIPELINES and not replace:
        raise ValueError(f"pipeline {pipeline.name!r} is already registered (pass replace=True)")
    _PIPELINES[pipeline.name] = pipeline
    return pipeline


def pipeline_names() -> list[str]:
    return list(_PIPELINES)


def get_pipeline(name: str) -> Pipeline:
    try:
        return _PIPELINES[name]
    except KeyError:
        raise UserError(f"--pipeline {name}: unknown pipeline (have: {', '.join(_PIPELINES)})") from None


# -- the built-in pipelines ---------------------------------------------------------------


def _onnxscript_optimizer(model: onnx.ModelProto, _: Path) -> onnx.ModelProto:
    import onnxscript.optimizer

    return onnxscript.optimizer.optimize(model)


def _onnxscript_fusions(model: onnx.ModelProto, _: Path) -> onnx.ModelProto:
    import onnx_ir as ir
    from onnxscript.rewriter import ort_fusions

    graph = ir.from_proto(model)
    ort_fusions.optimize_for_ort(graph)
    return ir.to_proto(graph)


def _ort_level(level: str) -> Rewrite:
    def rewrite(model: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
        import onnx
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = {
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[level]
        so.log_severity_level = 3
        fd, out = tempfile.mkstemp(suffix=".onnx", dir=workdir)
        os.close(fd)
        so.optimized_model_filepath = out
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimised = onnx.load(out)
        os.unlink(out)
        return optimised

    return rewrite


_ORT_MODEL_TYPES = {"gpt2": "gpt2", "gpt_neox": "gpt_neox", "phi": "phi", "qwen3": "qwen3"}
"""The decoder families onnxruntime's transformers optimizer has a model type for (its
``optimizer.MODEL_TYPES``, onnxruntime 1.2x), by this tool's family name."""

_FAMILY_BY_NAME = (("c_attn", "gpt2"), ("gate_proj", "llama"), ("query_key_value", "gpt_neox"))
"""A Hugging Face export's family by its parameter and node names, when it carries no ``dabench.params``:
GPT-2's fused ``c_attn``, Llama-style ``gate_proj`` (Llama, Qwen2, Mistral), GPT-NeoX's ``query_key_value``."""


def _family(model: onnx.ModelProto, params: dict[str, Any]) -> str | None:
    """The model's family: its ``dabench.params``, else its parameter and node names (`_FAMILY_BY_NAME`)."""
    if params.get("family"):
        return str(params["family"])
    names = [*(i.name for i in model.graph.initializer), *(n.name for n in model.graph.node)]
    return next((family for part, family in _FAMILY_BY_NAME if any(part in n for n in names)), None)


def _ort_transformers(model: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
    import json

    import onnx
    from onnxruntime.transformers import optimizer

    meta = {p.key: p.value for p in model.metadata_props}
    try:  # heads and width from dabench-ir's export metadata; 0 lets the optimiser detect them
        params = json.loads(meta.get(MODEL_PARAMS) or "{}")
    except ValueError:
        params = {}
    family = _family(model, params)
    model_type = _ORT_MODEL_TYPES.get(family or "")
    if model_type is None:
        raise UserError(
            f"ort-transformers: onnxruntime's transformers optimizer has no model type for "
            f"{family or 'this model (its family is not known)'} (it has {', '.join(sorted(_ORT_MODEL_TYPES))}); "
            "use --pipeline onnxscript-fusions or ort-all for its fusions"
        )
    heads, hidden = int(params.get("heads") or 0), int(params.get("hidden") or 0)
    fd, src = tempfile.mkstemp(suffix=".onnx", dir=workdir)
    os.close(fd)
    onnx.save(model, src)  # the optimiser reads a file
    try:
        opt = optimizer.optimize_model(src, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0)
        opt.save_model_to_file(src)  # adds the com.microsoft opset import
        return onnx.load(src)
    finally:
        os.unlink(src)


def _rewrite(name: str, fn: Rewrite) -> Callable[[str | None], Sequence[Pass]]:
    return lambda out_dir: [OnnxRewritePass(name=name, rewrite=fn, out_dir=out_dir)]


register_pipeline(Pipeline("none", "the model as exported (the baseline)"))
_REWRITES = [  # (name, what it does, the ModelProto rewrite, the module it needs)
    (
        "onnxscript-optimizer",
        "onnxscript.optimizer.optimize: constant folding, dead code, ...",
        _onnxscript_optimizer,
        "onnxscript",
    ),
    (
        "onnxscript-fusions",
        "onnxscript.rewriter.ort_fusions.optimize_for_ort: fused attention, norms, GELU",
        _onnxscript_fusions,
        "onnxscript",
    ),
    *(
        (
            f"ort-{level}",
            f"onnxruntime graph optimisation, level {level} (its saved optimised model)",
            _ort_level(level),
            "onnxruntime",
        )
        for level in ("basic", "extended", "all")
    ),
    (
        "ort-transformers",
        "onnxruntime.transformers.optimizer, model type by the model's family (gpt2, gpt_neox, phi, qwen3; "
        "refused for others): attention and norm fusions",
        _ort_transformers,
        "onnxruntime",
    ),
]
for _name, _help, _fn, _needs in _REWRITES:
    register_pipeline(Pipeline(_name, _help, _rewrite(_name, _fn), needs=_needs))
_PLACEMENTS = [  # (target kind, the knob, its values, how the help names one)
    ("rdu", "opt_level", OPT_LEVELS, "at RDU opt level {}"),
    ("wse", "wse_mode", tuple(m for m in WSE_MODES if m != "auto"), "in WSE {} mode"),
]
for _kind, _knob, _values, _how in _PLACEMENTS:
    for _value in _values:
        register_pipeline(
            Pipeline(
                f"{_kind}-{_value}",
                f"the model as it is, placed {_how.format(_value)}",
                options={_knob: _value},
                targets=frozenset({_kind}),
            )
        )
_MLIR = [  # (name, what it does, the MLIR passes)
    (
        "mlir-elementwise",
        "linalg-fuse-elementwise-ops, then canonicalize and cse (on linalg, --via mlir)",
        ("linalg-fuse-elementwise-ops", "canonicalize", "cse"),
    ),
    (
        "mlir-generalize-fuse",
        "linalg-generalize-named-ops, linalg-fuse-elementwise-ops, canonicalize, cse (named ops fused too; --via mlir)",
        ("linalg-generalize-named-ops", "linalg-fuse-elementwise-ops", "canonicalize", "cse"),
    ),
    (
        "mlir-bufferize",
        "mlir-elementwise, then one-shot-bufferize: the buffers that need memory (--via mlir)",
        ("linalg-fuse-elementwise-ops", "canonicalize", "cse", "one-shot-bufferize{bufferize-function-boundaries}"),
    ),
]
for _name, _help, _passes in _MLIR:
    register_pipeline(Pipeline(_name, _help, mlir=_passes, needs="torch_mlir"))
