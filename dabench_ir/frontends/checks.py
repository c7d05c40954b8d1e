"""Structural checks on an ONNX model before anything costs, runs or emulates it.

A model file is untrusted input: these checks turn what would be a traceback, a silent
nonsense figure or a hang further on into one line saying what is wrong with the file.

- dims: negative dims are refused (they would give negative bytes and intensities);
  rank above `MAX_RANK` is refused (onnxruntime's limit is lower still);
- element types: a code ONNX does not define is refused; a defined type without a byte
  size (string, 4-bit) is named in a warning, never counted as 0 bytes unflagged;
- external data: ``offset`` and ``length`` must be non-negative integers;
- cycles: a graph whose nodes depend on each other in a loop is refused, as onnxruntime does;
- wiring: duplicate initializer names, a tensor two nodes (or a node and an input) define, a
  node input nothing defines (in its graph or an enclosing one), and a standard op given more
  or fewer inputs or outputs than its ONNX schema takes are refused;
- shapes: `infer_checked` runs ONNX shape inference strictly, so inputs an op cannot take
  (``[4,7] x [64,64]``) are refused by the op's own rule; other inference failures fall back
  to best effort;
- metadata: `safe_name_scopes` and `safe_name_list` read exporter metadata of any shape.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import InputError

if TYPE_CHECKING:
    import onnx

__all__ = [
    "GRAPH_ATTRS",
    "INFER_PART_NODES",
    "MAX_METADATA_CHARS",
    "MAX_RANK",
    "check_onnx_model",
    "infer_checked",
    "safe_name_list",
    "safe_name_scopes",
]

logger = logging.getLogger(__name__)

MAX_RANK = 64
"""The highest tensor rank accepted (ONNX sets none; onnxruntime's kernels stop well below)."""

MAX_METADATA_CHARS = 1 << 20
"""Exporter metadata longer than this (1 MiB) is ignored rather than parsed."""

GRAPH_ATTRS = (5, 10)
"""The attribute types that hold a subgraph (``onnx.AttributeProto.GRAPH``, ``GRAPHS``)."""

_UNSIZED = {"STRING", "INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2"}


# The list the torch exporter writes, ``['layers.0', 'linear']``: quoted printable ASCII with no
# quote or backslash inside, so each item is its text as written. Anything else is parsed in full.
_PLAIN_ITEM = r"'[ -&(-\[\]-~]*'"
_PLAIN_LIST = re.compile(rf"\[(?:{_PLAIN_ITEM}(?:, {_PLAIN_ITEM})*)?\]")


def safe_name_scopes(text: Any) -> list[str]:
    """``pkg.torch.onnx.name_scopes`` metadata as a list of strings; [] for anything else.

    The exporter's plain form is split directly (one regex match, where a full parse costs a
    compile per node); any other text goes through `ast.literal_eval` and gives the same list."""
    if not isinstance(text, str) or not text or len(text) > MAX_METADATA_CHARS:
        return []
    if _PLAIN_LIST.fullmatch(text):
        return [s for s in text[2:-2].split("', '") if s] if len(text) > 2 else []
    try:
        entries = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return []
    if not isinstance(entries, (list, tuple)):
        return []
    return [s for s in entries if isinstance(s, str) and s]


def safe_name_list(text: Any, key: str, names_of: Iterable[str] = ()) -> list[str]:
    """A JSON list of names (``dabench.weights``); a warning and [] for anything else. It may be as
    long as `MAX_METADATA_CHARS`, or as the quoted names it can list (``names_of``: the graph's
    inputs and initializers), whichever is more: a 10,000-layer model names ~120,000 weights."""
    limit = max(MAX_METADATA_CHARS, sum(len(n) + 4 for n in names_of))
    if not isinstance(text, str) or len(text) > limit:
        logger.warning("model metadata %s is too large or not text; ignoring it", key)
        return []
    try:
        names = json.loads(text)
    except (ValueError, RecursionError):
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        logger.warning("model metadata %s is not a JSON list of names; ignoring it", key)
        return []
    return names


NodeRead = tuple[Any, str, str, list[str], list[str], list[Any]]
"""One node as `read_nodes` reads it: (proto, op_type, domain, inputs, outputs, attributes)."""


def read_nodes(graph: onnx.GraphProto) -> list[NodeRead]:
    """Each node of ``graph`` with the fields the checks and the ONNX frontend read, each read once
    from the protos (every read of a protobuf field builds a Python object: reading them once for
    all the checks and the Graph saved ~10 ms on a 2,000-node model)."""
    return [(n, n.op_type, n.domain, list(n.input), list(n.output), list(n.attribute)) for n in graph.node]


@functools.cache
def _elem_name(code: int) -> str | None:
    import onnx

    try:
        return onnx.TensorProto.DataType.Name(code)
    except ValueError:
        return None


def _check_type(name: str, elem_type: int, dims: list[int], where: str, unsized: dict[str, str]) -> None:
    if len(dims) > MAX_RANK:
        raise InputError(f"{where}tensor {name!r} has rank {len(dims)}; at most {MAX_RANK} is supported")
    for d in dims:
        if d < 0:
            raise InputError(f"{where}tensor {name!r} has a negative dim {d} in shape {list(dims)}; fix the model")
    if elem_type == 0:
        return  # undefined: shape inference may fill it in; an untyped value is reported where costed
    label = _elem_name(elem_type)
    if label is None:
        raise InputError(
            f"{where}tensor {name!r} has element type {elem_type}, which ONNX does not define; "
            "is the file from a newer ONNX than this onnx package?"
        )
    if label in _UNSIZED:
        unsized.setdefault(name, label)


def _check_value_info(vi: onnx.ValueInfoProto, where: str, unsized: dict[str, str], passed: dict[bytes, bool]) -> bool:
    """A declared tensor's dims and element type (one read of its shape); whether every dim is a size.

    ``passed`` holds the types (serialized) that passed with nothing to record: a model repeats a
    few types over all its values (each layer's copies), and such a type passes again."""
    key = vi.type.SerializeToString()
    known = passed.get(key)
    if known is not None:
        return known
    static = _checked_type(vi, where, unsized)
    if _elem_name(vi.type.tensor_type.elem_type) not in _UNSIZED:  # an unsized type records each value's name
        passed[key] = static
    return static


def _checked_type(vi: onnx.ValueInfoProto, where: str, unsized: dict[str, str]) -> bool:
    if not vi.type.HasField("tensor_type"):
        return False
    tt = vi.type.tensor_type
    rank = 0
    static = tt.HasField("shape")
    if static:
        dims = [d.dim_value for d in tt.shape.dim]  # a symbolic or unknown dim reads 0
        if dims and min(dims) < 0:
            first = next(d for d in dims if d < 0)
            raise InputError(f"{where}tensor {vi.name!r} has a negative dim {first}; fix the model")
        rank = len(dims)
        static = not dims or min(dims) > 0  # a symbol or an unknown dim reads 0 (an explicit 0 counts as not static)
    _check_type(vi.name, tt.elem_type, [0] * rank if rank > MAX_RANK else [], where, unsized)  # rank: of every dim
    return static and tt.elem_type != 0  # an undefined element type is one inference would fill in


def _check_external(init: onnx.TensorProto, where: str) -> None:
    for entry in init.external_data:
        if entry.key in ("offset", "length"):
            text = entry.value.strip()
            if not text.isdigit():
                raise InputError(
                    f"{where}initializer {init.name!r}: external-data {entry.key} {entry.value!r} is not a "
                    "non-negative integer; fix or re-save the model"
                )


def _check_acyclic(graph: onnx.GraphProto, nodes: list[NodeRead], where: str) -> None:
    """Refuse a cycle among the nodes of one graph (Kahn's algorithm over producer edges)."""
    producer: dict[str, int] = {}
    for i, read in enumerate(nodes):
        for out in read[4]:
            if out:
                producer.setdefault(out, i)
    # Nodes in topological order, as ONNX asks and exporters write: every edge runs forward, so no cycle.
    if all(producer.get(x, -1) < i for i, read in enumerate(nodes) for x in read[3]):
        return
    deps: list[set[int]] = []
    users: dict[int, list[int]] = {}
    for i, read in enumerate(nodes):
        d = {producer[x] for x in read[3] if x in producer}
        deps.append(d)
        for j in d:
            users.setdefault(j, []).append(i)
    remaining = [len(d) for d in deps]
    ready = [i for i, n in enumerate(remaining) if n == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in users.get(i, ()):
            remaining[j] -= 1
            if remaining[j] == 0:
                ready.append(j)
    if seen < len(deps):
        stuck = next(i for i, n in enumerate(remaining) if n > 0)
        node = graph.node[stuck]
        raise InputError(
            f"{where}the graph has a cycle (node {node.name or node.op_type!r} depends on its own output); "
            "ONNX graphs must be acyclic"
        )


def _node_label(node: onnx.NodeProto) -> str:
    return f"node {node.name!r} ({node.op_type})" if node.name else f"a {node.op_type} node"


def _subgraphs(attributes: list[Any]) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold, in order (``g``, then ``graphs``, attribute by attribute)."""
    found: list[onnx.GraphProto] = []
    for attr in attributes:
        if attr.HasField("g"):
            found.append(attr.g)
        if attr.graphs:  # tested before it is copied: most attributes hold none (4x faster)
            found += attr.graphs
    return found


def _check_wiring(
    graph: onnx.GraphProto,
    outer: frozenset[str],
    opsets: dict[str, int],
    where: str,
    nodes: list[NodeRead] | None = None,
) -> None:
    """Every tensor defined once, every node input defined (here or in an enclosing graph),
    and each standard op's input and output counts within its schema; subgraphs recursively.
    ``nodes``: the graph's `read_nodes`, when the caller has them."""
    nodes = read_nodes(graph) if nodes is None else nodes
    defined: dict[
        str, str | int
    ] = {}  # what defines each name: a label, or the index of the node (labelled on error only)

    def label(by: str | int) -> str:
        return by if isinstance(by, str) else _node_label(nodes[by][0])

    def define(name: str, by: str | int) -> None:
        if name in defined:
            raise InputError(
                f"{where}tensor {name!r} is defined twice ({label(defined[name])} and {label(by)}); each name must be unique"
            )
        defined[name] = by

    for vi in graph.input:
        defined.setdefault(vi.name, "a graph input")  # an initializer may also be listed as an input
    seen_inits: set[str] = set()
    for init in graph.initializer:
        if init.name in seen_inits:
            raise InputError(f"{where}two initializers are named {init.name!r}; each name must be unique")
        seen_inits.add(init.name)
        if defined.get(init.name) != "a graph input":
            define(init.name, "an initializer")
    for init in graph.sparse_initializer:
        define(init.values.name, "a sparse initializer")
    for i, read in enumerate(nodes):
        for out in read[4]:
            if out:
                if out in defined:
                    define(out, i)  # raises, naming both
                defined[out] = i
    seen_by_subgraphs: frozenset[str] | None = None  # what a subgraph reads from here or above: built at the first
    version = opsets.get("")  # the standard ops' opset; None: no standard op is checked
    for node, op_type, domain, inputs, outputs, attributes in nodes:
        if version is not None and domain in ("", "ai.onnx"):  # contrib and custom ops: their own rules (or none)
            _check_arity(node, op_type, inputs, len(outputs), version, where)
        for name in inputs:
            if name and name not in defined and name not in outer:
                raise InputError(
                    f"{where}{_node_label(node)} reads tensor {name!r}, which no input, initializer or node "
                    "defines; fix the model"
                )
        if attributes:
            for g in _subgraphs(attributes):
                if seen_by_subgraphs is None:
                    seen_by_subgraphs = outer | frozenset(defined)
                _check_wiring(g, seen_by_subgraphs, opsets, where)


@functools.cache
def _arity(op_type: str, version: int) -> tuple[int, int, int, int] | None:
    """The standard op's (min, max) input and output counts at this opset; None where ONNX does not define it.
    Looked up once per op and opset (a schema lookup per node was most of the wiring check)."""
    import onnx

    try:
        schema = onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return None
    return schema.min_input, schema.max_input, schema.min_output, schema.max_output


def _check_arity(node: onnx.NodeProto, op_type: str, inputs: list[str], outputs: int, version: int, where: str) -> None:
    """A standard op given fewer or more inputs or outputs than its ONNX schema takes at opset ``version``
    (``inputs``: the node's input names; ``outputs``: how many outputs it lists)."""
    counts = _arity(op_type, version)
    if counts is None:
        return  # an op ONNX does not define here: reported where it is costed
    min_input, max_input, min_output, max_output = counts
    ins = len(inputs)
    while ins and not inputs[ins - 1]:
        ins -= 1  # trailing optional inputs left out
    if min_input <= ins <= max_input and min_output <= outputs <= max_output:
        return
    for what, n, low, high in (("input", ins, min_input, max_input), ("output", outputs, min_output, max_output)):
        if not low <= n <= high:
            want = f"{low}" if low == high else f"{low} to {high}" if high < 2**31 - 1 else f"at least {low}"
            raise InputError(f"{where}{_node_label(node)} has {n} {what}(s); {op_type} takes {want}; fix the model")


INFER_PART_NODES = 16_384
"""Nodes ONNX shape inference checks at a time in a model that declares every node output static
(`infer_checked`): inference copies the model it is given several times over (serialised, parsed in
C++, inferred, serialised back and parsed again), which for a 10,000-layer decoder (360,000 nodes,
a 275 MB file) peaked at 3.2 GB and took 16 s, most of it the kernel handing out fresh pages;
checked in parts of this size the copies stay a part's, and memory is reused from part to part
(1.5 GB, 6 s). A model this size or smaller is one part, inferred as it is."""


def infer_checked(
    model: onnx.ModelProto,
    path: Path | None = None,
    *,
    declared_static: bool = False,
    nodes: list[NodeRead] | None = None,
) -> onnx.ModelProto:
    """ONNX shape inference, strict first: an op whose input shapes its own rule refuses
    (``MatMul`` of ``[4,7]`` and ``[64,64]``) is an InputError naming it; any other failure
    of strict inference falls back to best effort (as before).

    ``declared_static`` (from `check_onnx_model`): the model declares a static, typed shape for every
    node output. Inference can then only confirm those shapes: it runs without data propagation
    (``data_prop``: the values of shape tensors, ``Shape`` -> ``Concat`` -> ``Reshape``; 2.5x faster),
    in parts of `INFER_PART_NODES` (`_infer_static`), and ``model`` itself is returned, the model full
    inference gives. If a part fails, the full inference runs and says why. ``nodes``: the model's
    graph's `read_nodes`, when the caller has them."""
    import onnx

    if declared_static:
        try:
            _infer_static(model, read_nodes(model.graph) if nodes is None else nodes)
            return model
        except onnx.shape_inference.InferenceError:
            pass
    where = f"{path}: " if path is not None else ""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        text = " ".join(str(exc).split())
        if "[ShapeInferenceError]" in text and (
            "Incompatible dimensions" in text or "dimension mismatch" in text.lower()
        ):
            detail = text.split("Inference error(s): ", 1)[-1][:300]
            raise InputError(f"{where}the model's shapes do not fit its ops: {detail}; fix the model") from None
    return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)


def _infer_static(model: onnx.ModelProto, nodes: list[NodeRead]) -> None:
    """Strict inference without data propagation of a model declaring every node output static, in
    parts of consecutive nodes (a graph's nodes are in topological order): a part reads the values
    earlier parts produce as inputs of their declared types, its initializers and the Constant nodes
    it reads are copied in (an op whose output shape follows from a constant input still sees it),
    and the types it produces are declared, so inference checks each of them against its producer's
    rule as it does in the whole graph. A model of at most `INFER_PART_NODES` nodes, or one holding
    sparse initializers, is inferred whole. Raises `onnx.shape_inference.InferenceError` as inference
    of the whole model would."""
    import onnx

    g = model.graph
    if len(nodes) <= INFER_PART_NODES or len(g.sparse_initializer):  # one part: the model as it is
        onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=False)
        return
    declared = {vi.name: vi for vi in (*g.input, *g.value_info, *g.output)}
    graph_outputs = {vi.name for vi in g.output}
    initializers = {t.name: t for t in g.initializer}
    constants = {
        out: node
        for node, op, domain, _, outs, _ in nodes
        if op == "Constant" and domain in ("", "ai.onnx")
        for out in outs
    }
    for start in range(0, len(nodes), INFER_PART_NODES):
        part = nodes[start : start + INFER_PART_NODES]
        produced = dict.fromkeys(out for read in part for out in read[4] if out)  # in node order
        sub = onnx.ModelProto(ir_version=model.ir_version)
        sub.opset_import.extend(model.opset_import)
        sub.functions.extend(model.functions)
        graph = sub.graph
        outside: set[str] = set()  # what the part reads from before it, each once
        for name in (name for read in part for name in read[3]):
            if not name or name in produced or name in outside:
                continue
            outside.add(name)
            if name in initializers:
                graph.initializer.append(initializers[name])
            elif name in constants:
                graph.node.append(constants[name])
            else:
                graph.input.append(declared[name])
        graph.node.extend(read[0] for read in part)
        for name in produced:
            (graph.output if name in graph_outputs else graph.value_info).append(declared[name])
        onnx.shape_inference.infer_shapes(sub, strict_mode=True, data_prop=False)


def check_onnx_model(model: onnx.ModelProto, path: Path | None = None, *, nodes: list[NodeRead] | None = None) -> bool:
    """Refuse a structurally broken model with one line; warn about unsized element types.

    Returns whether the model declares a static shape and an element type for every node output and
    holds no subgraph (`infer_checked`'s ``declared_static``: what the exporters write, read here in the
    same walk).
    ``nodes``: the model's own graph's `read_nodes`, when the caller has them."""
    where = f"{path}: " if path is not None else ""
    unsized: dict[str, str] = {}
    passed: dict[bytes, bool] = {}  # the value types that passed (see `_check_value_info`)
    top = read_nodes(model.graph) if nodes is None else nodes
    static, nested = _check_graph(model.graph, top, where, unsized, passed)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    _check_wiring(model.graph, frozenset(), opsets, where, top)
    if unsized:
        first, label = next(iter(unsized.items()))
        logger.warning(
            "%s%d tensor(s) have an element type with no whole-byte size (first: %r, %s); their bytes are not counted",
            where,
            len(unsized),
            first,
            label,
        )
    return not nested and all(out in static for read in top for out in read[4] if out)


def _check_graph(
    g: onnx.GraphProto, nodes: list[NodeRead], where: str, unsized: dict[str, str], passed: dict[bytes, bool]
) -> tuple[set[str], bool]:
    """One graph's types, external data and cycles, then its subgraphs' (depth first, in node and
    attribute order); ``g``'s declared tensors whose every dim is a size, and whether any graph walked
    has a graph-valued attribute."""
    import onnx

    for init in g.initializer:
        _check_type(init.name, init.data_type, list(init.dims), where, unsized)
        if init.data_location == onnx.TensorProto.EXTERNAL:
            _check_external(init, where)
    declared = {vi.name for vi in (*g.input, *g.output, *g.value_info) if _check_value_info(vi, where, unsized, passed)}
    nested = False
    subgraphs: list[onnx.GraphProto] = []
    for node, op_type, _, _, _, attributes in nodes:
        for attr in attributes:
            nested = nested or attr.type in GRAPH_ATTRS
            if attr.HasField("t"):
                _check_type(f"{node.name or op_type}.{attr.name}", attr.t.data_type, list(attr.t.dims), where, unsized)
        if attributes:
            subgraphs += _subgraphs(attributes)
    _check_acyclic(g, nodes, where)
    for sub in subgraphs:
        nested = _check_graph(sub, read_nodes(sub), where, unsized, passed)[1] or nested
    return declared, nested
