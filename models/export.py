"""ONNX export of decoder models, with per-layer stamping so cost does not grow with L.

How an export goes:

1. The model is built on the `meta` device (no weight data) with ONE decoder block (or
   all L blocks when `stamp=False`) and exported with torch's dynamo exporter
   (`torch.onnx.export(..., dynamo=True, optimize=False)`).
2. Every initializer (all are module parameters) becomes a shape-only graph input, then
   onnxscript's optimizer folds what is left constant (causal mask, rotary tables).
3. Stamping: the nodes whose exporter scope starts with `layers.0` form the block; it is
   copied L−1 times at the ONNX graph level. Each copy gets renamed values and nodes
   (`layers.i/<name>`), its own weight inputs (`layers.i.attn.q_proj.weight`, …), and node
   metadata (`pkg.torch.onnx.name_scopes`, `namespace`) rewritten to say `layers.i`.
   Copy i reads copy i−1's output; whatever read block 0's output now reads the last copy.
4. Bulky per-node props (`pkg.torch.onnx.stack_trace`, `pkg.torch.onnx.fx_node`) are
   dropped; model metadata_props get `dabench.family`, `dabench.preset`, `dabench.params`
   and `dabench.weights` (JSON list of the weight input names).
5. `weights="random"` turns the weight inputs back into initializers holding the seeded
   weights of the full torch module (so the file runs in onnxruntime as it is).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dabench_ir.errors import UserError
from dabench_ir.models.config import ModelConfig
from dabench_ir.options import DEFAULT_MAX_WEIGHT_BYTES
from dabench_ir.progress import silent

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = [
    "AUTO_NONE_THRESHOLD_BYTES",
    "DEFAULT_MAX_WEIGHT_BYTES",
    "ExportOptions",
    "ExportResult",
    "bind_dims",
    "cache_names",
    "example_input",
    "export_model",
    "export_onnx",
    "export_options",
    "quiet_torch",
    "resolve_weights",
    "stamp_layers",
]

logger = logging.getLogger(__name__)

DYNAMIC_TRACE_LENGTH = 2
"""A dynamic export's dims are traced at least this long: torch.export specialises dims of size 0 and 1."""
AUTO_NONE_THRESHOLD_BYTES = 256 * 2**20
"""`weights="auto"` means "random" up to this many weight bytes, "none" above."""
# `weights="random"` refuses models whose weights need more bytes than DEFAULT_MAX_WEIGHT_BYTES (the options' one)
_EXTERNAL_DATA_BYTES = 1_500_000_000  # protobuf caps a file at 2 GB: above this, weights go to PATH.data

from dabench_ir.passes.meta import MODEL_FAMILY as META_FAMILY  # noqa: E402 - the keys are declared there
from dabench_ir.passes.meta import MODEL_KV_CACHE as META_KV_CACHE  # noqa: E402
from dabench_ir.passes.meta import MODEL_PARAMS as META_PARAMS  # noqa: E402
from dabench_ir.passes.meta import MODEL_PHASE as META_PHASE  # noqa: E402
from dabench_ir.passes.meta import MODEL_PRESET as META_PRESET  # noqa: E402
from dabench_ir.passes.meta import MODEL_WEIGHTS as META_WEIGHTS  # noqa: E402

_SCOPES = "pkg.torch.onnx.name_scopes"
_NAMESPACE = "namespace"
_DROPPED_PROPS = ("pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node")
_LAYER0 = re.compile(r"(?<![\w.])layers\.0(?!\d)")

Progress = Callable[[str], None]


@dataclass
class ExportResult:
    """What an export wrote: path, format, weights mode and the weight input names."""

    path: Path
    format: str
    weights: str
    weight_names: list[str] = field(default_factory=list)
    seconds: float = 0.0
    nodes: int = 0


# ---- options ------------------------------------------------------------------------------
def resolve_weights(
    cfg: ModelConfig, weights: str, max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES, *, format: str = "onnx"
) -> str:
    """Resolve `weights` (auto|none|random) to "none" or "random"; refuse random above the cap.

    An MLIR ``format`` keeps its weights as function arguments, the form the MLIR frontend reads as
    the model's parameters (frozen into the module they were constants: a profile counted 0
    parameters and trained nothing), so "auto" is "none" there and "random" is refused."""
    if weights not in ("auto", "none", "random"):
        raise UserError(f"--weights must be none or random, got {weights!r}")
    if format != "onnx":
        if weights == "random":
            raise UserError(
                f"--format {format} keeps the weights as function arguments (what profile reads as the model's "
                "parameters): --weights random applies to ONNX; drop it"
            )
        return "none"
    need = cfg.weight_bytes()
    if weights == "auto":
        return "random" if need <= min(AUTO_NONE_THRESHOLD_BYTES, max_weight_bytes) else "none"
    if weights == "random" and need > max_weight_bytes:
        raise UserError(
            f"random weights need {need:,} bytes ({need / 2**30:.2f} GiB), over --max-weight-bytes "
            f"{max_weight_bytes:,}; use --weights none or raise --max-weight-bytes"
        )
    if weights == "random":
        _check_memory(need)
    return weights


def _available_memory() -> int | None:
    """Bytes of memory free for a new allocation (Linux MemAvailable, else free pages); None if unknown."""
    from dabench_ir.fileio import meminfo_bytes

    free = meminfo_bytes("MemAvailable")
    if free is not None:
        return free
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _check_memory(need: int) -> None:
    """Refuse, before building, random weights this machine's free memory cannot hold (the
    weights are held twice while the model is built: the torch state and the ONNX copy)."""
    free = _available_memory()
    if free is not None and 2 * need > free:
        raise UserError(
            f"random weights need {need:,} bytes ({need / 2**30:.2f} GiB), held twice while building, and this "
            f"machine has {free / 2**30:.2f} GiB of memory free; use --weights none or a smaller model"
        )


def _check_disk(need: int, folder: Path) -> None:
    """Refuse, before building, weights the output folder's file system has no room for."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if need > free:
        raise UserError(
            f"the model's weights need {need:,} bytes ({need / 2**30:.2f} GiB) on disk and {folder} has "
            f"{free / 2**30:.2f} GiB free; use --weights none or write it elsewhere"
        )


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence the exporter's prints, warnings and log lines (they go to debug logging)."""
    sink = io.StringIO()
    names = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "torch.fx")
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)
        if sink.getvalue():
            logger.debug("exporter output:\n%s", sink.getvalue())


_REGISTRIES: dict[tuple, object] = {}


@contextlib.contextmanager
def _registry_once() -> Iterator[None]:
    """Build torch's ATen-to-ONNX registry once per process instead of once per export.

    ``torch.onnx.export(dynamo=True)`` rebuilds it from torchlib every call (onnxscript reads the
    source of ~500 functions: ~0.5 s of the ~0.9 s a small export takes after the first). It is the
    same registry each time and the export only reads it (a custom translation table, which we never
    pass, is what writes to it), so within an export here the classmethod answers from a memo; the
    bytes exported are identical (tests/test_export_onnx.py checks it). Where torch has no such method
    (another torch version) nothing is changed.
    """
    try:
        from torch.onnx._internal.exporter import _registration

        cls = _registration.ONNXRegistry
        original = cls.__dict__["from_torchlib"]
        build = original.__func__
    except (ImportError, AttributeError, KeyError):
        yield
        return

    def from_torchlib(klass: type, *args: object, **kwargs: object) -> object:
        key = (klass, args, tuple(sorted(kwargs.items())))
        if key not in _REGISTRIES:
            _REGISTRIES[key] = build(klass, *args, **kwargs)
        return _REGISTRIES[key]

    cls.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        cls.from_torchlib = original


def cache_names(cfg: ModelConfig, layers: int | None = None) -> tuple[list[str], list[str]]:
    """Decode graphs: the KV-cache input names and the new-K/V output names, K then V per layer."""
    if cfg.phase != "decode":
        return [], []
    n = cfg.layers if layers is None else layers
    ins = [f"layers.{i}.attn.{kv}_cache" for i in range(n) for kv in ("k", "v")]
    outs = [f"layers.{i}.attn.{kv}_new" for i in range(n) for kv in ("k", "v")]
    return ins, outs


def _example_caches(cfg: ModelConfig, dynamic: bool, device: str) -> list[torch.Tensor]:
    """Zero caches per layer (none for prefill): K `[B, kv_heads, head_dim, context]` (kept
    transposed, see `attend_cached`) and V `[B, kv_heads, context, head_dim]`."""
    import torch

    from dabench_ir.models.gpt2 import torch_dtype

    if cfg.phase != "decode":
        return []
    batch = max(cfg.batch, DYNAMIC_TRACE_LENGTH) if dynamic else cfg.batch
    context = max(cfg.context, DYNAMIC_TRACE_LENGTH) if dynamic else cfg.context
    k_shape = (batch, cfg.kv_heads, cfg.head_dim, context)
    v_shape = (batch, cfg.kv_heads, context, cfg.head_dim)
    dtype = torch_dtype(cfg.dtype)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.layers) for shape in (k_shape, v_shape)]


def example_input(cfg: ModelConfig, dynamic: bool, device: str) -> torch.Tensor:
    import torch

    from dabench_ir.models.gpt2 import torch_dtype

    # torch.export specialises dims of size 0/1: trace a dynamic export with batch, seq >= 2.
    # A decode export keeps its chunk of new tokens static (the context is the dynamic dim).
    batch = max(cfg.batch, DYNAMIC_TRACE_LENGTH) if dynamic else cfg.batch
    seq = max(cfg.seq, DYNAMIC_TRACE_LENGTH) if dynamic and cfg.phase != "decode" else cfg.seq
    if cfg.vocab:
        return torch.zeros(batch, seq, dtype=torch.int64, device=device)
    return torch.zeros(batch, seq, cfg.hidden, dtype=torch_dtype(cfg.dtype), device=device)


# ---- step 1-2: plain dynamo export of a meta module ----------------------------------------
def _dynamo_export(cfg: ModelConfig, *, dynamic: bool) -> onnx.ModelProto:
    """Export `cfg` (built on meta) with every parameter as a shape-only graph input."""
    import onnx_ir as ir
    import onnxscript
    import torch

    from dabench_ir.models import build_model

    model = build_model(cfg, device="meta")
    example = example_input(cfg, dynamic, "meta")
    caches = _example_caches(cfg, dynamic, "meta")
    cache_in, cache_out = cache_names(cfg)
    input_name = "input_ids" if cfg.vocab else "hidden_states"
    output_name = "logits" if cfg.vocab else "output"
    dynamic_shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=2)
        if cfg.phase == "decode":
            ctx_max = cfg.max_positions - cfg.seq if cfg.positional == "learned" else None
            context = torch.export.Dim("context", min=2, max=ctx_max) if ctx_max else torch.export.Dim("context", min=2)
            dynamic_shapes = ({0: batch}, tuple({0: batch, 3 - i % 2: context} for i in range(len(caches))))
        else:
            seq_max = cfg.max_positions if cfg.positional == "learned" else None
            seq = torch.export.Dim("seq", min=2, max=seq_max) if seq_max else torch.export.Dim("seq", min=2)
            dynamic_shapes = ({0: batch, 1: seq},)
    with quiet_torch(), _registry_once():
        program = torch.onnx.export(
            model,
            (example, *caches),
            dynamo=True,
            optimize=False,
            verbose=False,
            input_names=[input_name, *cache_in],
            output_names=[output_name, *cache_out],
            dynamic_shapes=dynamic_shapes,
        )
        graph = program.model.graph
        for name in list(graph.initializers):
            value = graph.initializers.pop(name)
            value.const_value = None
            graph.inputs.append(value)
        onnxscript.optimizer.optimize_ir(program.model)
        proto = ir.serde.serialize_model(program.model)
    if dynamic:
        names = {input_name: ("batch", "seq")}
        names.update(
            {c: ("batch", "", "", "context") if ".k_" in c else ("batch", "", "context", "") for c in cache_in}
        )
        _rename_dims(proto, names)
    for node in proto.graph.node:
        _drop_props(node)
    return proto


def _rename_dims(proto: onnx.ModelProto, names: dict[str, tuple[str, ...]]) -> None:
    """Rename the symbolic dims of the named inputs (batch, seq) everywhere in the graph."""
    mapping: dict[str, str] = {}
    for value in proto.graph.input:
        if value.name in names:
            for dim, new in zip(value.type.tensor_type.shape.dim, names[value.name], strict=False):
                if dim.dim_param and new:
                    mapping[dim.dim_param] = new
    if not mapping or all(k == v for k, v in mapping.items()):
        return
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True)) + r")\b")
    for coll in (proto.graph.input, proto.graph.output, proto.graph.value_info):
        for value in coll:
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param:
                    dim.dim_param = pattern.sub(lambda m: mapping[m.group(1)], dim.dim_param)


def _drop_props(node: onnx.NodeProto) -> None:
    keep = [p for p in node.metadata_props if p.key not in _DROPPED_PROPS]
    if len(keep) != len(node.metadata_props):
        del node.metadata_props[:]
        node.metadata_props.extend(keep)


def _scopes(node: onnx.NodeProto) -> list[str]:
    for prop in node.metadata_props:
        if prop.key == _SCOPES:
            try:
                return list(ast.literal_eval(prop.value))
            except (ValueError, SyntaxError):
                return []
    return []


def _layer_of(node: onnx.NodeProto) -> int | None:
    """The decoder-block index from the node's outermost `layers.N` scope, if any."""
    for scope in _scopes(node):
        match = re.fullmatch(r"layers\.(\d+)", scope)
        if match:
            return int(match.group(1))
    return None


# ---- step 3: stamping -----------------------------------------------------------------------
def stamp_layers(proto: onnx.ModelProto, layers: int) -> onnx.ModelProto:
    """Copy the `layers.0` block of a 1-layer export so the graph has `layers` blocks.

    Works in place on `proto` (and returns it). Weight inputs named `layers.0.*` get a
    `layers.i.*` copy per block; every other value the block reads from outside (mask,
    rotary tables, shared constants) is shared by all copies. Steps: find the block and its one
    hidden-state input and output (`_Block`), write the nodes before it, block 0 and each copy
    (`_stamp_copy`), then the nodes after it reading the last copy's output, and the copies'
    weight inputs and per-layer outputs beside block 0's.
    """
    if layers < 1:
        raise ValueError("layers must be >= 1")
    graph = proto.graph
    nodes = list(graph.node)
    node_layers = [_layer_of(n) for n in nodes]  # one read of each node's scopes
    in_block = [layer == 0 for layer in node_layers]
    if not any(in_block):
        raise RuntimeError("no node has a `layers.0` scope: cannot find the block to stamp")
    if any(layer not in (None, 0) for layer in node_layers):
        raise RuntimeError("stamping needs a 1-layer export; found nodes of other layers")
    if layers == 1:
        return proto
    block = _Block.of(graph, nodes, in_block)
    # Order: nodes before the block, block 0, copies 1..L-1, then what reads the block output.
    tainted = {block.output}
    before, after = [], []
    for node, b in zip(nodes, in_block, strict=True):
        if b:
            continue
        if tainted.intersection(node.input):
            tainted.update(node.output)
            after.append(node)
        else:
            before.append(node)
    # The copies are written straight into the graph (one copy each, not a copy of a copy), after
    # the nodes before the block and block 0; `after` goes in once they are all there.
    del graph.node[:]
    graph.node.extend([*before, *block.nodes])
    new_inputs: list[onnx.ValueInfoProto] = []
    new_outputs: list[onnx.ValueInfoProto] = []
    prev_out = block.output
    for i in range(1, layers):
        prev_out = _stamp_copy(graph, block, i, prev_out, new_inputs, new_outputs)
    for node in after:
        for k, name in enumerate(node.input):
            if name == block.output:
                node.input[k] = prev_out
    for out in graph.output:
        if out.name == block.output:  # a graph output that is the block's output itself
            out.name = prev_out
    graph.node.extend(after)
    # Weight inputs of copies go right after block 0's weights (the order a plain export uses).
    inputs = list(graph.input)
    last_w = max((k for k, v in enumerate(inputs) if v.name in block.weights), default=len(inputs) - 1)
    del graph.input[:]
    graph.input.extend([*inputs[: last_w + 1], *new_inputs, *inputs[last_w + 1 :]])
    graph.output.extend(new_outputs)
    metadata = {p.key: p.value for p in proto.metadata_props}
    if META_PARAMS in metadata:  # an export's own metadata (a sweep's cached base): now of `layers` blocks
        dynamic = bool(json.loads(metadata[META_PARAMS]).get("dynamic", False))
        cfg = ModelConfig.from_params(metadata[META_PARAMS]).replace(layers=layers)
        mode = metadata.get("dabench.weights_mode", "none")
        names = _weight_names(cfg, proto)  # a stamped graph's weights are inputs (`_stamp_copy` copies those)
        _set_metadata(proto, _model_metadata(cfg, names, mode=mode, dynamic=dynamic, stamped=True))
    return proto


@dataclasses.dataclass
class _Block:
    """Block 0 of a 1-layer export as `stamp_layers` copies it: its nodes, the values it produces (in
    block order: the copies' value infos follow it), its weight inputs (``layers.0.*``), its
    per-layer graph outputs (a decode graph's new K and V), its one hidden-state input and output,
    and what each copy reads of the graph (inputs, outputs, value infos by name; each node's scope
    texts split around ``layers.0``)."""

    nodes: list[onnx.NodeProto]
    produced: dict[str, None]
    weight_inputs: list[str]
    weights: set[str]
    layer_outputs: list[str]
    input: str
    output: str
    graph_inputs: dict[str, onnx.ValueInfoProto]
    graph_outputs: dict[str, onnx.ValueInfoProto]
    value_info: dict[str, onnx.ValueInfoProto]
    scope_parts: list[list[tuple[int, list[str]]]]

    @classmethod
    def of(cls, graph: onnx.GraphProto, nodes: list[onnx.NodeProto], in_block: list[bool]) -> _Block:
        block = [n for n, b in zip(nodes, in_block, strict=True) if b]
        produced = dict.fromkeys(o for n in block for o in n.output if o)
        initializers = {t.name for t in graph.initializer}
        weight_inputs = [v.name for v in graph.input if v.name.startswith("layers.0.")]
        weights = set(weight_inputs)
        # Per-layer graph outputs of block 0 are copied with the block; of the other values the
        # rest of the graph reads there is exactly one (the hidden state).
        graph_outputs = {o.name: o for o in graph.output}
        layer_outputs = [v for v in graph_outputs if v in produced and v.startswith("layers.0.")]
        outside_reads = {i for n, b in zip(nodes, in_block, strict=True) if not b for i in n.input}
        outside_reads |= {o.name for o in graph.output} - set(layer_outputs)
        block_outputs = [v for v in dict.fromkeys(o for n in block for o in n.output) if v in outside_reads]
        if len(block_outputs) != 1:
            raise RuntimeError(f"block 0 should have one output read outside it, found {block_outputs}")
        block_out = block_outputs[0]
        # The hidden-state input: the external, non-weight input with the block output's type.
        types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}
        external = [i for i in dict.fromkeys(i for n in block for i in n.input) if i and i not in produced]
        candidates = [
            i for i in external if i not in weights and i not in initializers and types.get(i) == types.get(block_out)
        ]
        if len(candidates) != 1:
            raise RuntimeError(f"cannot tell the block's hidden-state input among {candidates}")
        # A block node's scope texts split around `layers.0` once: a copy joins them with `layers.i`
        # (the pattern has no groups, so the join is the substitution).
        scope_parts = [
            [
                (k, parts)
                for k, prop in enumerate(node.metadata_props)
                if prop.key in (_SCOPES, _NAMESPACE) and len(parts := _LAYER0.split(prop.value)) > 1
            ]
            for node in block
        ]
        return cls(
            nodes=block,
            produced=produced,
            weight_inputs=weight_inputs,
            weights=weights,
            layer_outputs=layer_outputs,
            input=candidates[0],
            output=block_out,
            graph_inputs={v.name: v for v in graph.input},
            graph_outputs=graph_outputs,
            value_info={v.name: v for v in graph.value_info},
            scope_parts=scope_parts,
        )


def _stamp_copy(
    graph: onnx.GraphProto,
    block: _Block,
    i: int,
    prev_out: str,
    new_inputs: list[onnx.ValueInfoProto],
    new_outputs: list[onnx.ValueInfoProto],
) -> str:
    """Block copy ``i`` written into ``graph``, reading ``prev_out`` as its hidden state: its nodes
    and value infos renamed ``layers.i``, its weight inputs and per-layer outputs appended to
    ``new_inputs`` and ``new_outputs``. Returns its hidden-state output."""
    import onnx

    rename = {v: f"layers.{i}/{v}" for v in block.produced}
    rename.update({w: f"layers.{i}." + w[len("layers.0.") :] for w in (*block.weights, *block.layer_outputs)})
    rename[block.input] = prev_out
    layer = f"layers.{i}"
    for node, scoped in zip(block.nodes, block.scope_parts, strict=True):
        copy = graph.node.add()
        copy.CopyFrom(node)
        copy.name = f"{layer}/{node.name}"
        copy.input[:] = [rename.get(name, name) for name in node.input]  # one write per list
        copy.output[:] = [rename.get(name, name) for name in node.output]
        props = copy.metadata_props
        for k, parts in scoped:
            props[k].value = layer.join(parts)
    for w in block.weight_inputs:
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(block.graph_inputs[w])
        vi.name = rename[w]
        new_inputs.append(vi)
    for v in block.layer_outputs:
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(block.graph_outputs[v])
        vi.name = rename[v]
        new_outputs.append(vi)
    for v in block.produced:
        if v in block.value_info:
            vi = graph.value_info.add()
            vi.CopyFrom(block.value_info[v])
            vi.name = rename[v]
    return rename[block.output]


# ---- binding symbolic dims ------------------------------------------------------------------
_DIM_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
}


def _eval_dim(text: str, dims: dict[str, int]) -> int | None:
    """The value of a dim expression such as ``context + 1`` under ``dims``; None when it has
    a symbol not in ``dims`` or an operation other than + − × //."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in dims:
            return dims[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPS:
            return _DIM_OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(text)

    try:
        return ev(ast.parse(text, mode="eval"))
    except (ValueError, SyntaxError):
        return None


def bind_dims(proto: onnx.ModelProto, dims: dict[str, int]) -> onnx.ModelProto:
    """A copy of a dynamic export with its symbolic dims (``batch``, ``seq``, ``context`` and
    expressions of them such as ``context + 1``) replaced by their values under ``dims``.

    One dynamic export then stands for every length: the generation scenario binds a decode
    graph at several context lengths without exporting again. Dims it cannot evaluate stay
    symbolic (the cost passes then name them).
    """
    import onnx

    bound = onnx.ModelProto()
    bound.CopyFrom(proto)
    graph = bound.graph
    for coll in (graph.input, graph.output, graph.value_info):
        for value in coll:
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param:
                    number = _eval_dim(dim.dim_param, dims)
                    if number is not None:
                        dim.dim_value = number  # clears dim_param (a oneof)
    return bound


# ---- step 5: weights -----------------------------------------------------------------------
def _tensor_proto(name: str, tensor: torch.Tensor) -> onnx.TensorProto:
    import onnx
    import torch

    codes = {
        torch.float32: onnx.TensorProto.FLOAT,
        torch.float16: onnx.TensorProto.FLOAT16,
        torch.bfloat16: onnx.TensorProto.BFLOAT16,
    }
    t = tensor.detach().cpu().contiguous()
    proto = onnx.TensorProto()
    proto.name = name
    proto.data_type = codes[t.dtype]
    proto.dims.extend(t.shape)
    proto.raw_data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return proto


def _attach_weights(proto: onnx.ModelProto, state: dict[str, torch.Tensor], names: list[str]) -> None:
    """Turn the weight inputs `names` into initializers holding `state`'s tensors."""
    wanted = set(names)
    missing = wanted - set(state)
    if missing:
        raise RuntimeError(f"no weights for graph inputs {sorted(missing)[:5]}")
    keep = [v for v in proto.graph.input if v.name not in wanted]
    del proto.graph.input[:]
    proto.graph.input.extend(keep)
    proto.graph.initializer.extend(_tensor_proto(n, state[n]) for n in names)


def _set_metadata(proto: onnx.ModelProto, entries: dict[str, str]) -> None:
    keep = [p for p in proto.metadata_props if p.key not in entries]
    del proto.metadata_props[:]
    proto.metadata_props.extend(keep)
    for key, value in entries.items():
        prop = proto.metadata_props.add()
        prop.key, prop.value = key, value


@dataclass(frozen=True)
class ExportOptions:
    """How every exporter (ONNX, MLIR) writes a model: one set of options, one set of defaults.

    ``weights``: "none" (shape-only weight inputs), "random" (seeded initializers) or "auto"
    (random up to 256 MiB of weights, `resolve_weights`); ``max_weight_bytes`` refuses
    "random" above it. ``dynamic``: symbolic batch and seq. ``stamp=False`` (ONNX) exports all
    L blocks with the plain exporter (cost grows with L; kept for checking the stamped graph).
    """

    weights: str = "auto"
    max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES
    dynamic: bool = False
    stamp: bool = True
    seed: int = 0


EXPORTER_MODULES = ("torch", "onnxscript", "onnx_ir")
"""What exporting a model imports (the ``export`` extra): torch's dynamo exporter, and the ONNX IR it writes."""


def require_exporter(what: str) -> None:
    """A UserError naming what is missing when ``what`` (an export) cannot run here: found without
    importing (torch takes seconds to import), before any work."""
    import importlib.util

    missing = [m for m in EXPORTER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"{what} needs {', '.join(EXPORTER_MODULES)} ({', '.join(missing)} not installed): pip install "
            "'dabench-ir[export]' (install the torch build for your machine first); or give an .onnx file"
        )


def export_onnx(
    cfg: ModelConfig, options: ExportOptions | None = None, *, progress: Progress | None = None, **overrides
) -> onnx.ModelProto:
    """The ONNX model of `cfg` (in memory). See the module docstring for the method; ``options``
    (or keyword ``overrides`` of its fields) say how (`ExportOptions`)."""
    require_exporter(f"exporting {cfg.preset or cfg.family}")
    o = export_options(options, overrides)
    weights, max_weight_bytes, dynamic, stamp, seed = o.weights, o.max_weight_bytes, o.dynamic, o.stamp, o.seed
    mode = resolve_weights(cfg, weights, max_weight_bytes)
    say = progress or silent
    base = cfg.replace(layers=1) if stamp else cfg
    say(f"exporting {'one block' if stamp else f'{cfg.layers} blocks'} with torch.onnx (dynamo)")
    proto = _dynamo_export(base, dynamic=dynamic)
    if stamp and cfg.layers > 1:
        say(f"stamping {cfg.layers - 1} more blocks")
        stamp_layers(proto, cfg.layers)
    weight_names = _weight_names(cfg, proto)  # graph inputs until attached: read before
    if mode == "random":
        say(f"materialising {cfg.weight_bytes() / 2**20:.1f} MiB of seeded weights")
        from dabench_ir.models import build_model

        state = build_model(cfg, device="cpu", seed=seed).state_dict()
        _attach_weights(proto, state, weight_names)
    stamped = stamp and cfg.layers > 1
    _set_metadata(proto, _model_metadata(cfg, weight_names, mode=mode, dynamic=dynamic, stamped=stamped))
    return proto


def _weight_names(cfg: ModelConfig, proto: onnx.ModelProto) -> list[str]:
    """The graph inputs of an export of ``cfg`` that are its weights: all but the tokens and the caches."""
    inputs = {"input_ids", "hidden_states", *cache_names(cfg)[0]}
    return [v.name for v in proto.graph.input if v.name not in inputs]


def _model_metadata(
    cfg: ModelConfig, weight_names: list[str], *, mode: str, dynamic: bool, stamped: bool
) -> dict[str, str]:
    """The ``dabench.*`` metadata of an export of ``cfg`` whose weights are ``weight_names``
    (`_weight_names`): its shape, weights, phase and KV-cache names, each as many as its layers (a
    stamped graph's written again for its own: `stamp_layers`)."""
    cache_in, cache_out = cache_names(cfg)
    return {
        META_FAMILY: cfg.family,
        META_PRESET: cfg.preset or "",
        META_PARAMS: json.dumps({**cfg.to_dict(), "dynamic": dynamic}, sort_keys=True),
        META_WEIGHTS: json.dumps(weight_names),
        "dabench.weights_mode": mode,
        "dabench.export": "stamped" if stamped else "plain",
        META_PHASE: cfg.phase,
        META_KV_CACHE: json.dumps({"inputs": cache_in, "outputs": cache_out}),
    }


def export_options(options: ExportOptions | None, overrides: dict) -> ExportOptions:
    try:
        return dataclasses.replace(options or ExportOptions(), **overrides)
    except TypeError as exc:
        raise TypeError(f"export: {exc} (the options are ExportOptions' fields)") from None


def _save_with_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """``proto`` at ``path`` with its weights in ``PATH.data`` beside it, both written in a folder of
    their own and moved into place. onnx refuses a data file name that exists relative to the working
    directory (not the model's folder): an export run in its output folder failed over its own earlier
    file after minutes of work; in the empty folder the name is free."""
    import onnx

    data = path.with_name(path.name + ".data")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp, contextlib.chdir(tmp):
        onnx.save_model(proto, path.name, save_as_external_data=True, location=data.name)
        os.replace(data.name, data.absolute())
        os.replace(path.name, path.absolute())


def export_model(
    cfg: ModelConfig,
    path: str | Path,
    options: ExportOptions | None = None,
    *,
    format: str = "onnx",
    progress: Progress | None = None,
    **overrides,
) -> ExportResult:
    """Export `cfg` to `path` as onnx, mlir-torch or mlir-linalg; returns what was written.
    ``options`` (or keyword ``overrides`` of its fields): `ExportOptions`."""
    o = export_options(options, overrides)
    start = time.perf_counter()
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserError(f"output folder {path.parent} does not exist; create it or change -o")
    if cfg.phase == "decode" and format != "onnx":
        raise UserError("a decode graph (phase decode) exports as ONNX only; use format onnx")
    mode = resolve_weights(cfg, o.weights, o.max_weight_bytes, format=format)  # memory checked there
    if mode == "random":
        _check_disk(cfg.weight_bytes(), path.parent.absolute())
    if format in ("mlir-torch", "mlir-linalg"):
        from dabench_ir.models.mlir_export import export_mlir

        names = export_mlir(
            cfg, path, dataclasses.replace(o, weights=mode), dialect=format.removeprefix("mlir-"), progress=progress
        )
        return ExportResult(
            path=path, format=format, weights=mode, weight_names=names, seconds=time.perf_counter() - start
        )
    if format != "onnx":
        raise UserError(f"--format must be onnx, mlir-torch or mlir-linalg, got {format!r}")

    proto = export_onnx(cfg, o, progress=progress)
    mode = next(p.value for p in proto.metadata_props if p.key == "dabench.weights_mode")
    names = json.loads(next(p.value for p in proto.metadata_props if p.key == META_WEIGHTS))
    if progress:
        progress(f"writing {path}")
    if proto.ByteSize() > _EXTERNAL_DATA_BYTES:
        _save_with_external_data(proto, path)
    else:
        from dabench_ir.fileio import write_with

        write_with(path, lambda fh: fh.write(proto.SerializeToString()), binary=True)  # atomic, links followed
    return ExportResult(
        path=path,
        format="onnx",
        weights=mode,
        weight_names=names,
        seconds=time.perf_counter() - start,
        nodes=len(proto.graph.node),
    )
