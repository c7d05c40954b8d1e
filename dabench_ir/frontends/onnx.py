"""ONNX frontend: a `.onnx` file (or ModelProto) -> `Graph`, never reading weight data.

External data is not loaded (a 70B model whose weight files are absent still profiles),
and an external-data location that points outside the model's folder is refused
before anything could open it.
"""

from __future__ import annotations

import ast
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dabench_ir.errors import InputError, UserError
from dabench_ir.fileio import resolve_inside
from dabench_ir.frontends import existing_file
from dabench_ir.frontends.checks import (
    GRAPH_ATTRS,
    NodeRead,
    check_onnx_model,
    infer_checked,
    read_nodes,
    safe_name_list,
    safe_name_scopes,
)
from dabench_ir.ir import DType, Graph, Node, TensorType, Value, ValueKind, layer_from_scope
from dabench_ir.passes import meta
from dabench_ir.passes.meta import MODEL_FAMILY, MODEL_WEIGHTS

if TYPE_CHECKING:
    import onnx

__all__ = [
    "SEQ_SYMBOLS",
    "SHAPE_MODEL",
    "WEIGHTS_METADATA_KEY",
    "combined_dims",
    "derived_dims",
    "dim_parts",
    "fold_shapes",
    "load_onnx",
    "mask_length_symbols",
    "onnx_node_names",
    "past_symbols",
    "read_model",
    "seq_symbols",
    "unbound_inputs",
]

logger = logging.getLogger(__name__)

WEIGHTS_METADATA_KEY = MODEL_WEIGHTS
"""Model metadata key: JSON list of graph-input names that hold parameters."""

_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
_TENSOR_ATTR = 4  # onnx.AttributeProto.TENSOR

SHAPE_MODEL = "onnx.shape_model"
"""Graph-level annotation: the model without weight data or inferred shapes, kept when the graph
has symbols its inputs do not name (exporters' ``sequence_length + 1``, shape inference's
``unk__13``), so `derived_dims` can infer them again once the input symbols are bound."""

SEQ_SYMBOLS = frozenset(
    {
        "seq",
        "seq_len",
        "seq_length",
        "sequence",
        "sequence_length",
        "sequence_len",
        "total_sequence_length",
        "total_seq_len",
    }
)
"""The names exporters give a symbolic sequence length (ours: ``seq``; Hugging Face's and
onnxruntime's: ``sequence_length``, ``total_sequence_length``): what ``--seq`` binds."""


def read_model(source: str | os.PathLike[str] | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """Parse a model file without its external data; refuse bad paths with one clear line."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        return source, None
    path = existing_file(source, "an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable ONNX model ({_first_line(exc)})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InputError(f"{path}: not an ONNX model (no IR version or graph); is it the right file?")
    return model, path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


def _check_external_data(model: onnx.ModelProto, base: Path | None, nodes: list[NodeRead] | None = None) -> None:
    """Refuse external-data locations that escape the model's folder. Opens no file.
    ``nodes``: the model's own graph's `read_nodes`, when the caller has them."""
    import onnx

    folder = (base.parent if base is not None else Path.cwd()).resolve()
    for init in _all_initializers(model.graph, nodes):
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in init.external_data}
        try:
            resolve_inside(folder, entries.get("location", ""), f"initializer {init.name!r}: external data location")
        except UserError as exc:
            raise InputError(str(exc)) from None


def _all_initializers(graph: onnx.GraphProto, nodes: list[NodeRead] | None = None):
    yield from graph.initializer
    for attributes in (node.attribute for node in graph.node) if nodes is None else (read[5] for read in nodes):
        for attr in attributes:
            if attr.HasField("g") and (attr.g.node or attr.g.initializer):
                yield from _all_initializers(attr.g)
            for g in attr.graphs:
                yield from _all_initializers(g)


def _tensor_type(type_proto, types: dict[bytes, TensorType]) -> TensorType:
    """The TensorType of ``type_proto``; ``types`` holds those read already (by serialized type):
    a model repeats a few types over all its values (each layer's copies), and a type is immutable."""
    key = type_proto.SerializeToString()
    known = types.get(key)
    if known is None:
        known = types[key] = _read_tensor_type(type_proto)
    return known


def _read_tensor_type(type_proto) -> TensorType:
    if not type_proto.HasField("tensor_type"):
        return TensorType(None, DType.UNDEFINED)
    tt = type_proto.tensor_type
    dtype = DType.from_onnx(tt.elem_type)
    if not tt.HasField("shape"):
        return TensorType(None, dtype)
    dims: list[int | str] = []
    for d in tt.shape.dim:
        value = d.dim_value  # 0 when unset
        if value:  # a size: the common case, one read
            dims.append(value)
        elif d.dim_param:
            dims.append(d.dim_param)
        elif d.HasField("dim_value"):
            dims.append(0)
        else:  # shape inference could not tell this dim: the shape is unknown
            return TensorType(None, dtype)
    return TensorType(tuple(dims), dtype)


def onnx_node_names(graph_proto: onnx.GraphProto) -> list[str]:
    """The name of every node of ``graph_proto`` in dabench: its own, ``<op>_<index>`` when it
    has none, ``<name>__<index>`` for a repeat. The frontends, the annotated ONNX and the
    measured path (whose profiler reports node names) all name nodes with this function."""
    return _node_names((proto.name, proto.op_type) for proto in graph_proto.node)


def _node_names(named: Iterable[tuple[str, str]]) -> list[str]:
    """`onnx_node_names` of the nodes' (name, op_type) pairs."""
    names: list[str] = []
    seen: set[str] = set()
    for index, (own, op_type) in enumerate(named):
        name = own or f"{op_type}_{index}"
        if name in seen:
            name = f"{name}__{index}"
        seen.add(name)
        names.append(name)
    return names


def _scope_of(node: onnx.NodeProto, name: str, seen: dict[str, str | None] | None = None) -> str:
    """Module path the exporter recorded for this node (``name``: its own name), or '' when none was recorded.
    ``seen``: what each name-scopes text said (`_module_of`), shared by the nodes of one model (a module's
    nodes repeat most texts)."""
    scopes = namespace = None  # read only these two: the other props (stack traces) are long
    for p in node.metadata_props:
        key = p.key
        if key == "pkg.torch.onnx.name_scopes":
            scopes = p.value
        elif key == "namespace":
            namespace = p  # its text is read only when the name scopes say nothing
    if scopes:
        if seen is None:
            module = _module_of(scopes)
        elif scopes in seen:
            module = seen[scopes]
        else:
            module = seen[scopes] = _module_of(scopes)
        if module is not None:
            return module
    if namespace is not None and (text := namespace.value):
        # ": pkg.M/layers.0: pkg.Block/layers.0.attn: pkg.Attn/matmul: aten.matmul"
        parts = [p.split(":")[0].strip() for p in text.split("/")]
        modules = [p for p in parts[:-1] if p and p != _NO_MODULE_STACK]
        if modules:
            return modules[-1]
    # TorchScript exporter: node names like '/layers.0/attn/q_proj/MatMul'
    if name.startswith("/") and name.count("/") >= 2:
        return ".".join(part for part in name.strip("/").split("/")[:-1])
    return ""


_NO_MODULE_STACK = "_empty_nn_module_stack_from_metadata_hook"
"""What torch's exporter writes as the module of a node it has no module stack for (HF models whose
hooks drop it): no module, not a role of that name."""


def _module_of(scopes: str) -> str | None:
    """The module a name-scopes text names, None when it names none (`_scope_of` reads on)."""
    entries = [e for e in safe_name_scopes(scopes) if e != _NO_MODULE_STACK]
    # The last entry names the aten call (e.g. 'linear'); the ones before are modules.
    if len(entries) >= 2:
        return entries[-2]
    if entries and layer_from_scope(entries[0]) is not None:
        return entries[0]
    return None


def _inferred(
    model: onnx.ModelProto, path: Path | None, declared_static: bool, nodes: list[NodeRead]
) -> onnx.ModelProto:
    """``model`` after ONNX shape inference (`infer_checked`: an op whose shapes its own rule refuses
    is an InputError; any other failure is best effort, warned) and the types of the optimisers'
    com.microsoft ops, which ONNX inference does not know."""
    try:
        model = infer_checked(model, path, declared_static=declared_static, nodes=nodes)
    except InputError:
        raise
    except Exception as exc:  # shape inference is best effort; untyped values surface later
        logger.warning("ONNX shape inference failed, continuing without it: %s", _first_line(exc))
    from dabench_ir.frontends.contrib_types import complete_contrib_types, has_contrib_ops

    if has_contrib_ops(model):
        model = complete_contrib_types(model)
    return model


def _read_values(
    g: onnx.GraphProto, metadata: Mapping[str, str], tied: Mapping[str, str]
) -> tuple[dict[str, Value], list[str], list[str]]:
    """The graph's values by name (initializers as weights or constants, the inputs, the value infos,
    the outputs), its input names (weights left out) and its output names."""
    declared_weights, declared_constants = _declared_kinds(g, metadata)
    values: dict[str, Value] = {}
    types: dict[bytes, TensorType] = {}  # by serialized type: see `_tensor_type`
    initializers = {init.name: init for init in g.initializer}
    for name, init in initializers.items():
        kind = _initializer_kind(init, declared_weights, declared_constants)
        values[name] = Value(
            name=name,
            type=TensorType(tuple(init.dims), DType.from_onnx(init.data_type)),
            kind=kind,
            scalar=_scalar(init) if kind is ValueKind.CONSTANT else None,
            tied_to=tied.get(name),
        )
    graph_inputs: list[str] = []
    for vi in g.input:
        name = vi.name
        if name in initializers:
            continue  # older exporters list initializers as inputs too
        kind = ValueKind.WEIGHT if name in declared_weights else ValueKind.INPUT
        values[name] = Value(name=name, type=_tensor_type(vi.type, types), kind=kind)
        if kind is ValueKind.INPUT:
            graph_inputs.append(name)
    for vi in g.value_info:
        name = vi.name  # one read: each read of a protobuf field builds a new str
        if name not in values:
            values[name] = Value(name=name, type=_tensor_type(vi.type, types), kind=ValueKind.ACTIVATION)
    output_names: list[str] = []
    for vi in g.output:
        existing = values.get(vi.name)
        name = vi.name if existing is None else existing.name  # one object per name (`_read_graph_nodes`)
        vtype = _tensor_type(vi.type, types)
        if existing is None or (existing.type.shape is None and vtype.shape is not None):
            values[name] = Value(name=name, type=vtype, kind=ValueKind.OUTPUT)
        else:
            existing.kind = ValueKind.OUTPUT
        output_names.append(name)
    return values, graph_inputs, output_names


def _read_graph_nodes(protos: list[NodeRead], values: dict[str, Value]) -> list[Node]:
    """The Graph's nodes from the model's read nodes: a unique name, the scope and layer, the
    attributes, a subgraph flag; each output's value gets its producer (an untyped value is added)
    and a scalar Constant its value."""
    nodes: list[Node] = []
    scope_layers: dict[str, int | None] = {}  # a module's nodes share its scope, and so its layer
    scopes_seen: dict[str, str | None] = {}  # see `_scope_of`
    own_names = [read[0].name for read in protos]
    names = _node_names(zip(own_names, (read[1] for read in protos), strict=True))
    # One str object per value name: each read of a protobuf field built a new one, so a node's inputs
    # and outputs become the values' own keys. A lookup by name then finds its key by identity instead
    # of comparing characters, and each name is held once (bench/README.md, session 70).
    one_name = {value_name: value_name for value_name in values}
    for (proto, op_type, domain, inputs, outputs, attributes), own, name in zip(protos, own_names, names, strict=True):
        inputs = [one_name.setdefault(v, v) for v in inputs]
        outputs = [one_name.setdefault(v, v) for v in outputs]
        attrs, nested = _attributes(attributes) if attributes else ({}, False)
        scope = _scope_of(proto, own, scopes_seen)
        if not scope:
            layer = layer_from_scope(name)
        elif scope in scope_layers:
            layer = scope_layers[scope]
        else:
            layer = scope_layers[scope] = layer_from_scope(scope)
        node = Node(
            name=name,
            op_type=op_type,
            domain=domain or "",
            inputs=inputs,
            outputs=outputs,
            attrs=attrs,
            scope=scope,
            layer=layer,
        )
        if nested or op_type in _SUBGRAPH_OPS:
            node.meta[meta.SUBGRAPH] = True
        for out in node.outputs:
            if not out:
                continue
            value = values.get(out)
            if value is None:
                value = values[out] = Value(name=out, type=TensorType(None, DType.UNDEFINED), kind=ValueKind.ACTIVATION)
            value.producer = name
            if op_type == "Constant" and [a.name for a in attributes] == ["value"]:
                value.scalar = _scalar(attributes[0].t)
        nodes.append(node)
    return nodes


def load_onnx(
    source: str | os.PathLike[str] | onnx.ModelProto,
    *,
    infer_shapes: bool = True,
) -> Graph:
    """Load an ONNX model as a Graph: types from shape inference, weights recognised, scopes set.
    Steps: the checks, the weight bytes dropped (a model read here), shape inference, the values
    (`_read_values`), the nodes (`_read_graph_nodes`)."""

    model, path = read_model(source)
    # Each node's fields read once, for the checks and the Graph (shape inference adds value infos
    # and changes no node, so the exported model's nodes are the inferred model's).
    protos = read_nodes(model.graph)
    declared_static = check_onnx_model(model, path, nodes=protos)  # dims, rank, element types, external data, cycles
    _check_external_data(model, path, protos)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    _check_domains(protos, opsets, path)
    tied = _tied_copies(model.graph)  # before the weight bytes are freed: they are compared
    if path is not None:  # our own copy: free weight bytes before shape inference copies the model
        _drop_tensor_data(model.graph, protos)
    exported = model
    if infer_shapes:
        blanks = _name_blank_input_dims(model.graph)
        model = _inferred(model, path, declared_static, protos)
        if path is None:  # a caller's model: its inputs as they were (the inferred copy keeps the names)
            for dim in blanks:
                dim.ClearField("dim_param")
    g = model.graph
    metadata = {p.key: p.value for p in model.metadata_props}
    values, graph_inputs, output_names = _read_values(g, metadata, tied)
    nodes = _read_graph_nodes(protos, values)
    name = metadata.get(MODEL_FAMILY) or (path.stem if path else g.name) or "model"
    graph = Graph(
        nodes,
        values,
        graph_inputs,
        output_names,
        name=name,
        path=str(path) if path else None,
        metadata=metadata,
        opsets=opsets,
    )
    if graph.symbols - _input_symbols(graph):
        graph.meta[SHAPE_MODEL] = _shape_model(exported)
    logger.info("loaded %s: %d nodes, %d values", graph.path or graph.name, len(nodes), len(values))
    return graph


def _name_blank_input_dims(graph: onnx.GraphProto) -> list[onnx.TensorShapeProto.Dimension]:
    """Name each model-input dim that has neither a size nor a name (``[None, 64]``) after its input
    and axis (``x_dim0``), before shape inference: inference leaves such a dim blank on the input (the
    whole shape then unknown) and names it only where it flows into a node's output (``unk__0``), so
    the input could not be bound (``--batch``, ``--dim``) nor its readers costed exactly. Returns the
    dims named."""
    weights = {init.name for init in graph.initializer}
    named = []
    for vi in graph.input:
        if vi.name in weights or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value") and not dim.dim_param:
                dim.dim_param = f"{re.sub(r'[^0-9A-Za-z_]', '_', vi.name)}_dim{axis}"
                named.append(dim)
    return named


def _input_symbols(graph: Graph) -> frozenset[str]:
    return frozenset().union(*(graph.values[name].type.symbols for name in graph.inputs))


def seq_symbols(graph: Graph) -> list[str]:
    """The graph's input symbols that name a sequence length (`SEQ_SYMBOLS`)."""
    return sorted(s for s in _input_symbols(graph) if s.lower() in SEQ_SYMBOLS)


def past_symbols(graph: Graph) -> list[str]:
    """The symbols of the KV-cache inputs' length: in each cache input (`cache_inputs`) its symbolic
    dims but the first (the batch): [batch, heads, past, head_dim], or this tool's [batch, heads, dim,
    context]."""
    found: set[str] = set()
    from dabench_ir.passes.precision import cache_inputs

    for name in cache_inputs(graph):
        found.update(d for d in graph.values[name].type.shape[1:] if isinstance(d, str))
    return sorted(found)


def mask_length_symbols(graph: Graph) -> list[str]:
    """The symbols of an attention mask's length in a model with a KV cache: dim 1 of a rank-2 input
    named ``attention_mask`` when it is its own symbol (a dynamo export's ``total``), not the sequence
    nor the cache length nor a sum of symbols. Hugging Face's contract makes it the cache length plus
    the new tokens ("the attention_mask always has to have the length len(past_key_values) +
    len(input_ids)", transformers' GPT-2 and Llama docs), so ``--seq`` and ``--past`` bind it."""
    if not past_symbols(graph):
        return []
    known = {*seq_symbols(graph), *past_symbols(graph)}
    found = []
    for name in graph.inputs:
        shape = graph.values[name].type.shape
        if "attention_mask" in name and shape is not None and len(shape) == 2:
            length = shape[1]
            if isinstance(length, str) and length not in known and dim_parts(length) is None:
                found.append(length)
    return sorted(set(found))


_DIM_EXPRESSION = re.compile(r"[A-Za-z_]\w*|\d+|[-+*()\s]")


def combined_dims(graph: Graph, bound: Mapping[str, int]) -> dict[str, int]:
    """The input symbols written as arithmetic of other symbols (``past_sequence_length +
    sequence_length``, as Hugging Face's exporters name an attention mask's length), valued from
    ``bound`` once all their parts are bound (whether or not ``bound`` holds the symbol itself); the
    others are left out."""
    values: dict[str, int] = {}
    for symbol in _input_symbols(graph):
        names = dim_parts(symbol)
        if names and all(n in bound for n in names):
            values[symbol] = _evaluate(ast.parse(symbol, mode="eval").body, bound)
    return values


def dim_parts(symbol: str) -> list[str] | None:
    """The names a dim written as arithmetic is made of (``past_sequence_length + sequence_length``:
    both); None for a plain name or anything but names, integers, +, - and * (`combined_dims`)."""
    tokens = _DIM_EXPRESSION.findall(symbol)
    if "".join(tokens) != symbol or not set("+-*") & set(symbol):
        return None
    return [t for t in tokens if t[0].isalpha() or t[0] == "_"] or None


def _evaluate(node: ast.AST, bound: Mapping[str, int]) -> int:
    """A dim expression's value: names, integers, +, - and *, nothing else."""
    if isinstance(node, ast.Name):
        return bound[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = _evaluate(node.left, bound), _evaluate(node.right, bound)
        return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
    raise ValueError(f"not a dim expression: {ast.dump(node)}")


def unbound_inputs(graph: Graph, bound: Mapping[str, int]) -> list[str]:
    """The input symbols ``bound`` leaves open, in a graph that derives others from them (only
    there: the others are named by the cost pass as unbound, with the dims that need them)."""
    return sorted(_input_symbols(graph) - bound.keys()) if SHAPE_MODEL in graph.meta else []


def _shape_model(model: onnx.ModelProto) -> bytes:
    """``model`` as exported, without weight data and without the shapes inference wrote."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _drop_tensor_data(copy.graph)
    del copy.graph.value_info[:]
    return copy.SerializeToString()


def derived_dims(graph: Graph, bound: Mapping[str, int]) -> dict[str, int]:
    """The values of the symbols a graph derives from its inputs' (``sequence_length + 1``, ``unk__13``),
    once ``bound`` binds every input symbol: ONNX shape inference run again on the exported model with
    the inputs' dims concrete. Empty when the graph derives none or an input symbol is unbound (the
    unbound-symbol error then names the input's). A derived dim may be 0: an empty slice, as Phi-3's
    rotary split leaves the pass-through part of a head when the whole head rotates
    (``partial_rotary_factor`` = 1)."""
    blob = graph.meta.get(SHAPE_MODEL)
    if blob is None or not _input_symbols(graph) <= bound.keys():
        return {}
    import onnx

    model = onnx.load_from_string(blob)
    for vi in (*model.graph.input, *model.graph.output):  # an output's declared dims too (a KV cache's present.*)
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in bound:
                d.dim_value = bound[d.dim_param]
    try:
        model = fold_shapes(model)
    except Exception as exc:  # best effort, as at load: what stays unbound is named by the cost pass
        logger.warning("ONNX shape inference with the bound dims failed: %s", _first_line(exc))
        return {}
    concrete = {
        vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        for vi in (*model.graph.value_info, *model.graph.output)
    }
    concrete.update({init.name: list(init.dims) for init in model.graph.initializer})
    found: dict[str, set[int]] = {}
    for name, dims in concrete.items():
        value = graph.values.get(name)
        shape = value.type.shape if value is not None else None
        if shape is None or len(shape) != len(dims):
            continue
        for symbol, d in zip(shape, dims, strict=True):
            if isinstance(symbol, str) and symbol not in bound and d is not None:  # 0: an empty slice
                found.setdefault(symbol, set()).add(d)
    return {symbol: values.pop() for symbol, values in found.items() if len(values) == 1}  # two values: not one dim


_FOLD_ELEMENTS = 1 << 16
"""Largest tensor the shape folding stores as a constant (a position range, not a causal mask)."""
_FOLD_ROUNDS = 256


def fold_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its shape arithmetic folded: shape inference, then every node whose inputs are
    known (``Shape`` of a tensor whose shape is now concrete, ops over constants) evaluated by onnx's
    reference evaluator and replaced by its outputs as constants, until nothing new is known. ONNX
    inference alone stops at a ``Reshape`` whose target is computed (``Range``, ``Div`` of shapes)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    opset = {o.domain or "": o.version for o in model.opset_import}
    known = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if not _data_dropped(i)}
    for _ in range(_FOLD_ROUNDS):
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        shapes = {
            vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output)
            if vi.type.tensor_type.HasField("shape")
        }
        shapes.update({i.name: list(i.dims) for i in model.graph.initializer})
        kept, folded = [], []
        for node in model.graph.node:
            outputs = None
            if node.op_type in ("Shape", "Size") and None not in shapes.get(node.input[0], [None]):
                dims = shapes[node.input[0]]
                if node.op_type == "Size":
                    outputs = [np.array(int(np.prod(dims)), dtype=np.int64)]
                else:
                    attrs = {a.name: a.i for a in node.attribute}
                    outputs = [np.array(dims[attrs.get("start", 0) : attrs.get("end", len(dims))], dtype=np.int64)]
            elif (
                node.domain in ("", "ai.onnx")
                and not any(a.type in GRAPH_ATTRS for a in node.attribute)
                and all(not i or i in known for i in node.input)
            ):
                try:
                    run = ReferenceEvaluator(node, opsets={"": opset.get("", 18)})
                    outputs = run.run(None, {i: known[i] for i in node.input if i})
                except Exception:  # an op the reference evaluator does not run: leave it to inference
                    outputs = None
            if outputs is None or any(np.asarray(o).size > _FOLD_ELEMENTS for o in outputs):
                kept.append(node)
                continue
            for name, out in zip(node.output, outputs, strict=False):
                known[name] = np.asarray(out)
                folded.append(numpy_helper.from_array(np.asarray(out), name))
        if not folded:
            return model
        del model.graph.node[:]
        model.graph.node.extend(kept)
        model.graph.initializer.extend(folded)
        del model.graph.value_info[:]
    return model


def _data_dropped(init: onnx.TensorProto) -> bool:
    """A tensor whose data `_drop_tensor_data` freed (or that lives in an external file)."""
    numel = 1
    for d in init.dims:
        numel *= d
    return numel > _KEEP_DATA_ELEMENTS or init.data_location == 1


def _check_domains(nodes: list[NodeRead], opsets: Mapping[str, int], path: Path | None) -> None:
    for node, _, domain, *_ in nodes:
        if domain not in opsets and domain != "ai.onnx":
            where = f"{path}: " if path else ""
            raise InputError(
                f"{where}node {node.name or node.op_type!r} uses op domain {domain!r}, which the model "
                f"does not import (add an opset_import entry for {domain!r})"
            )


_INPUT_SPEC_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"


def _declared_kinds(graph: onnx.GraphProto, metadata: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str]]:
    """Names the exporter declared as parameters, and as non-parameter state (buffers).

    Sources: our exporter's ``dabench.weights`` list, and the torch dynamo exporter's
    graph-signature metadata on inputs and value infos (``InputSpec.kind``).
    """
    weights: set[str] = set()
    constants: set[str] = set()
    raw = metadata.get(WEIGHTS_METADATA_KEY)
    if raw:
        listable = (v.name for v in (*graph.input, *graph.initializer))
        weights.update(safe_name_list(raw, WEIGHTS_METADATA_KEY, listable))
    folded: dict[str, str] = {}
    for vi in (*graph.input, *graph.value_info, *graph.initializer):
        for prop in vi.metadata_props:
            if prop.key == _FOLDED_FROM:
                folded[vi.name] = prop.value
            if prop.key == _INPUT_SPEC_KIND:
                if prop.value == "PARAMETER":
                    weights.add(vi.name)
                elif prop.value in ("BUFFER", "CONSTANT_TENSOR"):
                    constants.add(vi.name)
    for name, sources in folded.items():  # folded by the exporter's optimizer from other values
        (weights if _folded_from_parameter(sources, weights) else constants).add(name)
    return frozenset(weights), frozenset(constants)


def _folded_from_parameter(sources: str, weights: set[str]) -> bool:
    """A folded tensor is a parameter when it is a layout of one (folded from a declared
    parameter, or from a module path such as ``layers.0.fc.weight``); folded from temporaries
    only (``arange``, ``val_4``: RoPE tables, causal masks) or from a buffer's path
    (``rotary_emb.inv_freq``, torch.export's ``lifted_tensor_4``: `_CONSTANT_NAME`) it is a constant."""
    names = safe_name_scopes(sources)  # any shape of metadata: a list of strings or nothing
    return any(n in weights or ("." in n and not _CONSTANT_NAME.search(n)) for n in names)


_CONSTANT_NAME = re.compile(
    r"(?:^|[._/])(?:cos|sin)(?:_cached|_cache)?$|inv_freq|rotary|causal|(?:^|[._/])mask|lifted_tensor", re.I
)
_FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"


_TIE_SAMPLES = 1 << 16
"""Elements compared (a strided grid over the tensor) to call one 2-D weight another's transpose."""


def _tied_copies(graph: onnx.GraphProto) -> dict[str, str]:
    """Initializers that hold another's transpose (TorchScript writes a tied LM head as the embedding's
    transpose, under an ``onnx::MatMul_N`` name): copy -> original, the copy being the unnamed one (or
    the later one). Compared on the data (raw bytes in the file, read in place) at up to `_TIE_SAMPLES`
    elements; a tensor without its bytes here (external data, a weight-free export) is never tied."""
    import numpy as np
    from onnx import helper

    by_shape: dict[tuple[tuple[int, ...], int], list[onnx.TensorProto]] = {}
    for init in graph.initializer:
        if len(init.dims) == 2 and init.raw_data and init.data_location != 1 and init.dims[0] != init.dims[1]:
            by_shape.setdefault((tuple(init.dims), init.data_type), []).append(init)
    order = {init.name: i for i, init in enumerate(graph.initializer)}
    tied: dict[str, str] = {}
    for (shape, dtype), copies in by_shape.items():
        for copy in copies:
            for original in by_shape.get(((shape[1], shape[0]), dtype), ()):
                if copy.name in tied or original.name in tied:
                    continue
                unnamed = copy.name.startswith("onnx::") and not original.name.startswith("onnx::")
                if not (unnamed or order[copy.name] > order[original.name]):
                    continue
                np_type = helper.tensor_dtype_to_np_dtype(dtype)
                a = np.frombuffer(copy.raw_data, dtype=np_type).reshape(shape)
                b = np.frombuffer(original.raw_data, dtype=np_type).reshape(shape[::-1]).T
                step = max(1, int((a.size / _TIE_SAMPLES) ** 0.5))
                if np.array_equal(a[::step, ::step], b[::step, ::step]):
                    tied[copy.name] = original.name
    return tied


def _initializer_kind(init: onnx.TensorProto, weights: frozenset[str], constants: frozenset[str]) -> ValueKind:
    """A parameter is what a training step updates; everything else stored is a constant.

    The exporter's declarations win; a tensor the exporter's optimizer folded from other
    ops (RoPE cos/sin tables, causal masks: ``folded_from`` metadata) is a constant; when the
    exporter declared its parameters, an undeclared initializer is a constant; with nothing
    declared, a float tensor of more than one element is a parameter unless its name says it
    is a rotary table or a mask.
    """
    name = init.name
    if name in weights:
        return ValueKind.WEIGHT
    if name in constants:
        return ValueKind.CONSTANT
    if weights:
        return ValueKind.CONSTANT
    if _looks_like_parameter(init) and not _CONSTANT_NAME.search(name):
        return ValueKind.WEIGHT
    return ValueKind.CONSTANT


_KEEP_DATA_ELEMENTS = 4096
"""Tensors up to this many elements keep their data: shape tensors that shape inference reads."""


def _drop_tensor_data(graph: onnx.GraphProto, nodes: list[NodeRead] | None = None) -> None:
    """Free the data of every large initializer and Constant: the analysis reads shapes and
    types only, and holding weight bytes through shape inference (which copies the model)
    would make peak memory several times the file. Small tensors (shapes) keep their data.
    ``nodes``: the graph's `read_nodes`, when the caller has them."""
    tensors = list(graph.initializer)
    for attributes in (node.attribute for node in graph.node) if nodes is None else (read[5] for read in nodes):
        tensors += [a.t for a in attributes if a.HasField("t")]
    for t in tensors:
        numel = 1
        for d in t.dims:
            numel *= d
        if numel > _KEEP_DATA_ELEMENTS:
            for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                t.ClearField(name)


def _scalar(t: onnx.TensorProto) -> float | None:
    """The number a one-element tensor holds (`Value.scalar`); None for more elements or no data here."""
    from onnx import numpy_helper

    if math.prod(t.dims) != 1 or t.data_location == t.EXTERNAL:
        return None
    try:
        a = numpy_helper.to_array(t)
    except Exception:  # a malformed tensor: the rule that wanted it falls back to its general case
        return None
    return float(a.reshape(-1)[0]) if a.size == 1 and a.dtype.kind in "fiub" else None


def _looks_like_parameter(init: onnx.TensorProto) -> bool:
    """With nothing declared: float tensors of rank >= 1 and more than one element."""
    dtype = DType.from_onnx(init.data_type)
    numel = 1
    for d in init.dims:
        numel *= d
    return dtype.is_float and len(init.dims) >= 1 and numel > 1


def _attributes(attributes: list[onnx.AttributeProto]) -> tuple[dict[str, object], bool]:
    """A node's attributes by name, and whether one holds a subgraph (one read of them)."""
    import onnx

    out: dict[str, object] = {}
    nested = False
    for attr in attributes:
        kind = attr.type
        if kind in GRAPH_ATTRS:
            out[attr.name] = "<subgraph>"
            nested = True
        elif kind == _TENSOR_ATTR:
            out[attr.name] = TensorType(tuple(attr.t.dims), DType.from_onnx(attr.t.data_type))
        else:
            value = onnx.helper.get_attribute_value(attr)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif isinstance(value, list):
                value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
            out[attr.name] = value
    return out, nested
