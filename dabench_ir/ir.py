"""Core graph types: dtypes, tensor types, values, nodes, graphs and the summable Cost.

A `Graph` is what every frontend produces and every pass reads. It never holds weight
data: a model without weights is a normal, complete input.
"""

from __future__ import annotations

import enum
import functools
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UnboundSymbolError

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "MODULE_KINDS",
    "SCOPE_CACHE",
    "TOOL_DOMAIN",
    "Cost",
    "DType",
    "Dim",
    "Graph",
    "Node",
    "ScopeModule",
    "TensorType",
    "Value",
    "ValueKind",
    "layer_from_scope",
    "layer_wildcard",
    "model_path",
    "model_root",
    "module_kind",
    "module_of",
    "scope_parts",
    "value_bytes",
    "walk_back",
]


SCOPE_CACHE = 1 << 20
"""Entries of each per-scope memo (`module_of`, `dabench_ir.report.roles`): a model has ~11 scopes a
layer, so a bound of 16,384 thrashed past ~1,500 layers (a 3,000-layer model called `module_of`
11x as often as a 1,000-layer one); a million holds a 90,000-layer model's scopes."""

TOOL_DOMAIN = "dabench"
"""The operator domain of the nodes the tool's own passes append to a model (the training pass's loss
and optimizer step, ``dabench::SoftmaxCrossEntropy`` and ``dabench::AdamStep``): they are in none of
the model's modules, so the model's root (`Graph.model_root`) is read without them."""

_FLOAT_SHORTS = frozenset({"fp32", "fp16", "fp64", "bf16", "fp8e4m3", "fp8e4m3fnuz", "fp8e5m2", "fp8e5m2fnuz"})
"""The floating-point dtypes (`DType.is_float`), by short name."""


class DType(enum.Enum):
    """Element types, with their size in bytes (0.5 for int4) and ONNX TensorProto code."""

    FLOAT32 = ("fp32", 4, 1)
    UINT8 = ("uint8", 1, 2)
    INT8 = ("int8", 1, 3)
    UINT16 = ("uint16", 2, 4)
    INT16 = ("int16", 2, 5)
    INT32 = ("int32", 4, 6)
    INT64 = ("int64", 8, 7)
    STRING = ("string", 0, 8)
    BOOL = ("bool", 1, 9)
    FLOAT16 = ("fp16", 2, 10)
    FLOAT64 = ("fp64", 8, 11)
    UINT32 = ("uint32", 4, 12)
    UINT64 = ("uint64", 8, 13)
    COMPLEX64 = ("complex64", 8, 14)
    COMPLEX128 = ("complex128", 16, 15)
    BFLOAT16 = ("bf16", 2, 16)
    FLOAT8E4M3FN = ("fp8e4m3", 1, 17)
    FLOAT8E4M3FNUZ = ("fp8e4m3fnuz", 1, 18)
    FLOAT8E5M2 = ("fp8e5m2", 1, 19)
    FLOAT8E5M2FNUZ = ("fp8e5m2fnuz", 1, 20)
    INT4 = ("int4", 0.5, 22)  # two per byte (weight-only quantisation, w4a16)
    UNDEFINED = ("undefined", 0, 0)

    def __init__(self, short: str, itemsize: float, onnx_code: int) -> None:
        self.short = short
        self.itemsize = itemsize
        self.onnx_code = onnx_code
        # an attribute, not a property: read for every value by the passes and lowerings, and a
        # property's lookup in `_FLOAT_TYPES` ran Enum's Python-level __hash__ each time
        self.is_float: bool = short in _FLOAT_SHORTS

    def __str__(self) -> str:
        return self.short

    @classmethod
    def from_onnx(cls, code: int) -> DType:
        try:
            return _BY_ONNX[code]
        except KeyError:
            return cls.UNDEFINED

    @classmethod
    def from_name(cls, name: str) -> DType:
        """Look a dtype up by its short name (``fp16``) or a common alias (``float16``)."""
        key = name.strip().lower()
        key = _ALIASES.get(key, key)
        for dtype in cls:
            if dtype.short == key:
                return dtype
        raise ValueError(f"unknown dtype {name!r}")


_BY_ONNX = {d.onnx_code: d for d in DType}
_FLOAT_TYPES = frozenset(d for d in DType if d.is_float)
_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "double": "fp64",
    "fp8": "fp8e4m3",
    "float8": "fp8e4m3",
}

Dim = int | str
"""A tensor dimension: a concrete size or the name of a symbol bound later."""


_INTS = frozenset({int})
"""The dim types of a static shape: ``_INTS.issuperset(map(type, shape))`` is the fast test (no generator)."""


@dataclass(frozen=True, slots=True)
class TensorType:
    """Shape and element type of a value. ``shape`` is None when even the rank is unknown."""

    shape: tuple[Dim, ...] | None
    dtype: DType

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def symbols(self) -> frozenset[str]:
        if self.shape is None or _INTS.issuperset(map(type, self.shape)):  # static: no symbol
            return frozenset()
        return frozenset(d for d in self.shape if isinstance(d, str))

    @property
    def is_static(self) -> bool:
        return self.shape is not None and not self.symbols

    def dims(self, bindings: Mapping[str, int] | None = None) -> tuple[int, ...]:
        """Concrete dims, resolving symbols through ``bindings``.

        Raises UnboundSymbolError naming every symbol that is still free.
        """
        if self.shape is None:
            raise UnboundSymbolError(frozenset({"<unknown rank>"}))
        if _INTS.issuperset(map(type, self.shape)):  # the common, static case: nothing to resolve
            return self.shape  # type: ignore[return-value]
        bindings = bindings or {}
        missing = frozenset(d for d in self.shape if isinstance(d, str) and d not in bindings)
        if missing:
            raise UnboundSymbolError(missing)
        return tuple(bindings[d] if isinstance(d, str) else d for d in self.shape)

    def numel(self, bindings: Mapping[str, int] | None = None) -> int:
        shape = self.shape
        if shape is not None and _INTS.issuperset(map(type, shape)):  # static: `dims` is the shape itself
            return math.prod(shape)
        return math.prod(self.dims(bindings))

    def nbytes(self, bindings: Mapping[str, int] | None = None) -> int:
        size = self.dtype.itemsize
        numel = self.numel(bindings)
        return numel * size if type(size) is int else math.ceil(numel * size)  # int4: half a byte each

    def bind(self, bindings: Mapping[str, int]) -> TensorType:
        """This type with every bound symbol replaced by its value."""
        if self.shape is None or _INTS.issuperset(map(type, self.shape)):  # static: nothing to bind
            return self
        shape = tuple(bindings.get(d, d) if isinstance(d, str) else d for d in self.shape)
        return TensorType(shape, self.dtype)

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join(str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


class ValueKind(enum.StrEnum):
    """What a value is in the model.

    ``weight`` is a trained parameter (an initializer or a shape-only graph input the
    exporter marked as a parameter); ``constant`` is any other initializer (scales,
    shape tensors); neither needs its data.
    """

    INPUT = "input"
    WEIGHT = "weight"
    CONSTANT = "constant"
    ACTIVATION = "activation"
    OUTPUT = "output"

    @property
    def is_stored(self) -> bool:
        """Read from memory rather than produced by the graph (weights and constants)."""
        return self in _STORED


_STORED = frozenset({ValueKind.WEIGHT, ValueKind.CONSTANT})


@dataclass(slots=True)
class Value:
    """A named tensor in the graph. ``producer`` is the node that writes it, if any.

    ``scalar`` is the number a one-element constant holds (an initializer or a Constant node's
    output), kept because a cost rule reads it (Pow's exponent); no other tensor data is kept.
    ``tied_to`` names the weight this one is a stored copy of (a tied LM head the exporter wrote
    as the embedding's transpose): read and stored as itself, one parameter with it.
    """

    name: str
    type: TensorType
    kind: ValueKind
    producer: str | None = None
    scalar: float | None = None
    tied_to: str | None = None


@dataclass(slots=True, eq=False)
class Node:
    """One operator. ``scope`` is the exporter's module path, ``layer`` its decoder block."""

    name: str
    op_type: str
    domain: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    layer: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def qualified_op(self) -> str:
        """``op_type`` prefixed with its domain when it is not the default ONNX domain."""
        if self.domain in ("", "ai.onnx"):
            return self.op_type
        return f"{self.domain}::{self.op_type}"

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.qualified_op})"


_LAYER_RE = re.compile(r"((?:^|[./:_])(?:layers|layer|h|blocks|block)[./_])(\d+)(?=$|[./:_])")
"""A decoder-block container and its index in a scope or name (`layer_from_scope`, `layer_wildcard`)."""


def walk_back(starts: Iterable[str], expand: Callable[[str], Iterable[str]], stop: Iterable[str] = ()) -> list[str]:
    """Tensors reached walking producers back from ``starts``, each once, depth first on a stack
    (the first start first, then a tensor's inputs last to first); ``expand(tensor)`` gives the
    tensors its producer reads (nothing: a leaf), and the walk does not enter ``stop``. The one
    backward walk of the IR and of the fusion map."""
    stopped = set(stop)
    seen: set[str] = set()
    order: list[str] = []
    todo = [t for t in reversed(list(starts)) if t]
    while todo:
        tensor = todo.pop()
        if tensor in seen or tensor in stopped:
            continue
        seen.add(tensor)
        order.append(tensor)
        todo.extend(t for t in expand(tensor) if t)
    return order


def value_bytes(graph: Graph, name: str, default: int = 0) -> int:
    """Bytes of a value with the graph's bindings, or ``default`` when its shape is unknown."""
    try:
        return graph.type_of(name).nbytes()
    except (UnboundSymbolError, KeyError):
        return default


def layer_from_scope(scope: str) -> int | None:
    """Decoder-block index in a module path: ``layers.3.attn.q_proj`` -> 3.

    Recognises the common container names (``layers``, ``h``, ``blocks``), with ``.`` or
    ``/`` separators as the dynamo and TorchScript exporters write them.
    """
    match = _LAYER_RE.search(scope)
    return int(match.group(2)) if match else None


def layer_wildcard(scope: str) -> str:
    """``scope`` with its block index replaced by ``*``: ``layers.3.attn.q_proj`` -> ``layers.*.attn.q_proj``
    (every block's index, where the scope names several), by `layer_from_scope`'s rule."""
    return _LAYER_RE.sub(_star, scope)


def _star(match: re.Match[str]) -> str:
    return match.group(1) + "*"  # a function: a template string is expanded anew per match, 2x slower


MODULE_KINDS = ("attention", "mlp", "norm")
"""The kinds of module a decoder block holds, by the names models give them (`module_kind`)."""

_MODULE_NAMES = (
    ("attention", re.compile(r"(?:attn|attention)$", re.I)),  # attn, self_attn, attention, self_attention
    ("mlp", re.compile(r"(?:^|[._])(?:mlp|ffn|feed_forward|feedforward|ff)$", re.I)),
    ("norm", re.compile(r"(?:^|[._])(?:norm|ln\d*|layernorm|layer_norm|rmsnorm|ln_\w+|\w*_norm|norm_\w+)$", re.I)),
)


def scope_parts(scope: str) -> tuple[str, ...]:
    """A node scope's module path as its parts: ``layers.3.attn`` and ``/layers/3/attn`` alike."""
    return tuple(p for p in scope.replace("/", ".").split(".") if p)


def module_kind(name: str) -> str | None:
    """The kind (`MODULE_KINDS`) of a module named ``name`` (one part of a scope: ``self_attn``,
    ``mlp``, ``post_attention_layernorm``), or None for any other name. The one vocabulary: tensor
    parallelism splits attention and MLP modules, the WSE lowering maps an attention to one kernel,
    the report's roles name norms and MLPs by it."""
    return next((kind for kind, pattern in _MODULE_NAMES if pattern.search(name)), None)


@dataclass(frozen=True, slots=True)
class ScopeModule:
    """Where a scope sits in a decoder stack (`module_of`).

    ``block``: the decoder block's path (``layers.3``; '' outside every block) and ``index`` its
    number; ``module``: the module right below the block (``layers.3.attn``), or outside a block
    the child of the model's root (`model_root`) the scope is in; ``kind``: that module's
    (`module_kind`); ``rest``: the parts below the block (outside a block: below the root). Paths are
    the scope's own, a wrapper's part included: the root changes where the parts are counted from."""

    block: str
    index: int | None
    module: str
    kind: str | None
    rest: tuple[str, ...]


def model_root(scopes: Iterable[str]) -> str:
    """The module the whole model is in below a user's wrapper: the longest path every recorded scope
    (``''``: none) is at or below, when a scope is below it (else its parent), and never a decoder
    stack (``layers``) or inside one; '' when the model is the exported module.

    A user's wrapper (``self.model = hf_model``, whose forward only calls it: how a model is exported
    with tensors-only inputs) puts every scope one level down, ``model.lm_head`` for ``lm_head``; the
    root is that wrapper's child (``model``), so `module_of` counts a scope's parts from there and a
    module's identity does not depend on how deep the model sits. A module that holds every node
    besides has no sibling to be told apart from: when every scope is one path, the root is its parent.

    A numeric part every scope shares is a decoder block that holds every node (``layers.0``: the root
    is above its stack) only when no scope has a numeric part below it, for a block holds no decoder
    stack: otherwise it is the entry of a list that holds the model, the root (``models.0``, a wrapper's
    ``self.models = nn.ModuleList([hf_model])``, above ``models.0.model.layers.3``).
    """
    named = {s for s in scopes if s}
    if not named or not scope_parts(_common_text(min(named), max(named))):
        return ""  # the usual case (``lm_head``, ``model.layers.0``): the text of every scope shares nothing
    parts_of = [scope_parts(scope) for scope in named]
    common: tuple[str, ...] | None = None
    for parts in parts_of:
        if common is None:
            common = parts
        elif parts[: len(common)] != common:
            same = 0
            for mine, theirs in zip(common, parts, strict=False):
                if mine != theirs:
                    break
                same += 1
            common = common[:same]
            if not common:
                return ""
    if not common:
        return ""
    below = [parts[len(common)] for parts in parts_of if len(parts) > len(common)]
    if not below:
        common = common[:-1]  # one path holds every node: that module is the model's own, not a wrapper
    deepest = max((i for parts in parts_of for i, part in enumerate(parts) if i and part.isdigit()), default=0)
    for i, part in enumerate(common):
        if part.isdigit() and 0 < i == deepest:  # every node in one decoder block: the root is above its stack
            return ".".join(common[: i - 1])
    if any(part.isdigit() for part in below):
        common = common[:-1]  # the decoder stack (``layers``) holds every node: the root is above it
    return ".".join(common)


def _common_text(low: str, high: str) -> str:
    """The text two strings start with (of the lowest and highest of many: the text all of them start with)."""
    end = 0
    for a, b in zip(low, high, strict=False):
        if a != b:
            break
        end += 1
    return low[:end]


@functools.lru_cache(maxsize=SCOPE_CACHE)
def module_of(scope: str, root: str = "") -> ScopeModule:
    """The block and module of ``scope`` (`ScopeModule`), its parts counted below ``root``, the module the
    model is in below a user's wrapper (`model_root`; '' for the exported module). The block ends at the
    first numeric part after the first below the root (``layers.3``, ``model.layers.3``, ``h.3``): a
    decoder block is found by its own shape, at any depth, and a list that holds the model (the root
    ``models.0``) is none. Outside a block the module is the child of the root the scope is in
    (``lm_head``, ``model``); the root's own nodes are in none, as an unwrapped export leaves them
    unscoped. Cached: a scope holds a few nodes."""
    parts = scope_parts(scope)
    top = scope_parts(root) if root else ()
    skip = len(top) if top and parts[: len(top)] == top else 0
    for i in range(skip + 1, len(parts)):
        if parts[i].isdigit():
            rest = parts[i + 1 :]
            module = ".".join(parts[: i + 2])
            return ScopeModule(
                block=".".join(parts[: i + 1]),
                index=int(parts[i]),
                module=module,
                kind=module_kind(rest[0]) if rest else None,
                rest=rest,
            )
    below = parts[skip:]
    if not below:
        return ScopeModule(block="", index=None, module="", kind=None, rest=())
    return ScopeModule(block="", index=None, module=".".join(parts[: skip + 1]), kind=module_kind(below[0]), rest=below)


def model_path(path: str, root: str) -> str:
    """A module's or a weight's path (``.``-separated) below the model's root (`model_root`): ``lm_head``
    for ``model.lm_head`` under the root ``model``, '' for the root itself, the path itself when it is
    not below the root. What names a module alike whether the model was exported inside a wrapper or not."""
    if not root or not path.startswith(root):
        return path
    if len(path) == len(root):
        return ""
    return path[len(root) + 1 :] if path[len(root)] == "." else path


class Graph:
    """Nodes in topological order, the values they connect, and symbol bindings."""

    def __init__(
        self,
        nodes: Iterable[Node],
        values: Mapping[str, Value],
        inputs: Iterable[str],
        outputs: Iterable[str],
        *,
        name: str = "",
        path: str | None = None,
        metadata: Mapping[str, str] | None = None,
        bindings: Mapping[str, int] | None = None,
        opsets: Mapping[str, int] | None = None,
    ) -> None:
        self.nodes: list[Node] = list(nodes)
        self.values: dict[str, Value] = dict(values)
        self.inputs: list[str] = list(inputs)
        self.outputs: list[str] = list(outputs)
        self.name = name
        self.path = path
        self.metadata: dict[str, str] = dict(metadata or {})
        self.bindings: dict[str, int] = dict(bindings or {})
        self.opsets: dict[str, int] = dict(opsets or {})
        self.meta: dict[str, Any] = {}
        self._by_name = {n.name: n for n in self.nodes}
        if len(self._by_name) != len(self.nodes):
            raise ValueError("node names must be unique")

    # -- lookup ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Node:
        return self._by_name[name]

    def has_node(self, name: str) -> bool:
        return name in self._by_name

    def value(self, name: str) -> Value:
        return self.values[name]

    def type_of(self, name: str) -> TensorType:
        """The value's type with the graph's symbol bindings applied."""
        return self.values[name].type.bind(self.bindings)

    @cached_property
    def consumers(self) -> dict[str, list[Node]]:
        """Value name -> nodes that read it."""
        out: dict[str, list[Node]] = {}
        get = out.get
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    readers = get(name)
                    if readers is None:
                        out[name] = [node]
                    elif readers[-1] is not node:  # a value read twice is one consumer (its list is in node order)
                        readers.append(node)
        return out

    @cached_property
    def producer_positions(self) -> list[list[int]]:
        """Each node's producers (the nodes its input values name as theirs), by position in ``nodes``,
        in input order and each once: the dependencies every emulation of this graph walks (the why
        lines' variants emulate the report's graph again), worked out once."""
        position = {n.name: i for i, n in enumerate(self.nodes)}
        producer_of = {name: position[v.producer] for name, v in self.values.items() if name and v.producer in position}
        preds: list[list[int]] = []
        for node in self.nodes:
            seen: list[int] = []
            for v in node.inputs:
                p = producer_of.get(v)
                if p is not None and p not in seen:
                    seen.append(p)
            preds.append(seen)
        return preds

    @cached_property
    def model_root(self) -> str:
        """The module the model is in below a user's wrapper (`model_root` of the nodes' scopes), read once
        per graph: its nodes' modules (`module_of`) and identities (`model_path`) are read below it. The
        nodes the tool's passes append (`TOOL_DOMAIN`: the training pass's loss and optimizer step) are
        none of the exported model's and are left out."""
        return model_root(n.scope for n in self.nodes if n.domain != TOOL_DOMAIN)

    def weights(self) -> list[Value]:
        return [v for v in self.values.values() if v.kind is ValueKind.WEIGHT]

    @property
    def num_params(self) -> int | None:
        """Number of weight elements (a tied copy counted once, with its original), or None when a
        weight's shape is symbolic."""
        bindings, total = self.bindings, 0
        # by the type's id: a model's weights share a few type records (1,538 weights, 5 types)
        sizes: dict[int, int] = {}
        try:
            for v in self.values.values():
                if v.kind is ValueKind.WEIGHT and v.tied_to is None:
                    t = v.type
                    n = sizes.get(id(t))
                    if n is None:
                        n = sizes[id(t)] = t.numel(bindings)
                    total += n
        except UnboundSymbolError:
            return None
        return total

    @property
    def batch_dim(self) -> Dim | None:
        """The batch: dim 0 of the first model input with a known rank, a size or a symbol, when that
        input is a batch of sequences (token ids, a symbolic leading dim, or rank 3 and up); None for a
        graph without one (a plain ``[M, K] x [K, N]`` GEMM is one sample, not M)."""
        for name in self.inputs:
            t = self.values[name].type
            if t.shape:
                sequences = not t.dtype.is_float or isinstance(t.shape[0], str) or len(t.shape) >= 3
                return t.shape[0] if sequences and len(t.shape) >= 2 else None
        return None

    @property
    def batch_size(self) -> int | None:
        """The batch with the graph's bindings applied, or None while it is an unbound symbol."""
        return self.batch_under(self.bindings)

    def batch_under(self, bindings: Mapping[str, int]) -> int | None:
        """The batch with ``bindings`` applied (a run's dims beside the graph's), or None while unbound."""
        dim = self.batch_dim
        if isinstance(dim, str):
            dim = bindings.get(dim)
        return dim if isinstance(dim, int) and dim > 0 else None

    @property
    def layers(self) -> list[int]:
        return sorted({n.layer for n in self.nodes if n.layer is not None})

    @property
    def symbols(self) -> frozenset[str]:
        syms: set[str] = set()
        for t in {id(v.type): v.type for v in self.values.values()}.values():  # a type is shared by many values
            syms |= t.symbols
        return frozenset(syms)

    # -- graph algorithms -----------------------------------------------------------
    def to_networkx(self) -> nx.DiGraph:
        """A DiGraph over node names; each edge carries the value names it transports."""
        import networkx as nx

        dg = nx.DiGraph()
        for node in self.nodes:
            dg.add_node(node.name)
        for node in self.nodes:
            for name in node.inputs:
                value = self.values.get(name) if name else None
                if value is None or value.producer is None:
                    continue
                if dg.has_edge(value.producer, node.name):
                    carried = dg.edges[value.producer, node.name]["values"]
                    if name not in carried:
                        carried.append(name)
                else:
                    dg.add_edge(value.producer, node.name, values=[name])
        return dg

    def clone(self) -> Graph:
        """An independent copy to run in-place passes on: nodes, values, bindings and annotations
        are copied (annotation values are immutable records, or replaced rather than mutated by the
        passes); opaque graph-level artifacts (an MLIR module) are shared."""
        nodes = []
        for n in self.nodes:
            meta = n.meta.copy()
            for v in meta.values():  # a copy per node, a comprehension only where an annotation is a dict
                if type(v) is dict:
                    meta = {k: (dict(v) if type(v) is dict else v) for k, v in meta.items()}
                    break
            nodes.append(
                Node(
                    name=n.name,
                    op_type=n.op_type,
                    domain=n.domain,
                    inputs=n.inputs.copy(),
                    outputs=n.outputs.copy(),
                    attrs=n.attrs.copy(),
                    scope=n.scope,
                    layer=n.layer,
                    meta=meta,
                )
            )
        values = {
            k: Value(name=v.name, type=v.type, kind=v.kind, producer=v.producer, scalar=v.scalar, tied_to=v.tied_to)
            for k, v in self.values.items()
        }
        copy = Graph(
            nodes,
            values,
            self.inputs,
            self.outputs,
            name=self.name,
            path=self.path,
            metadata=self.metadata,
            bindings=self.bindings,
            opsets=self.opsets,
        )
        copy.meta = {k: (dict(v) if type(v) is dict else v) for k, v in self.meta.items()}
        return copy

    def invalidate(self) -> None:
        """Forget cached views after nodes were added or rewired."""
        self._by_name = {n.name: n for n in self.nodes}
        self.__dict__.pop("consumers", None)
        self.__dict__.pop("producer_positions", None)
        self.__dict__.pop("model_root", None)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={len(self.nodes)}, values={len(self.values)})"


@dataclass(frozen=True, slots=True)
class Cost:
    """What one node (or a sum of nodes) computes and moves.

    FLOP convention: a multiply-add in a contraction is 2 FLOPs; vector FLOPs count one
    per elementwise arithmetic op; special-function ops (exp, erf, rsqrt, sin, ...) are
    counted apart, one per element. Bytes are weight bytes read, activation bytes read and
    bytes written. ``flops`` and ``bytes`` are their sums.
    """

    contraction_flops: int = 0
    vector_flops: int = 0
    special_ops: int = 0
    weight_bytes: int = 0
    act_bytes_in: int = 0
    act_bytes_out: int = 0

    @property
    def flops(self) -> int:
        """All arithmetic: contraction + vector + special-function ops."""
        return self.contraction_flops + self.vector_flops + self.special_ops

    @property
    def bytes(self) -> int:
        """Weight bytes read + activation bytes read + bytes written."""
        return self.weight_bytes + self.act_bytes_in + self.act_bytes_out

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(*map(operator.add, _cost_fields(self), _cost_fields(other)))  # field by field

    def plus_bytes(self, weight: int, act_in: int, act_out: int) -> Cost:
        """This cost with bytes read and written added: ``self + Cost(weight_bytes=weight, ...)``, one
        record built instead of two (the cost pass adds each node's bytes to its rule's FLOPs)."""
        return Cost(
            contraction_flops=self.contraction_flops,
            vector_flops=self.vector_flops,
            special_ops=self.special_ops,
            weight_bytes=self.weight_bytes + weight,
            act_bytes_in=self.act_bytes_in + act_in,
            act_bytes_out=self.act_bytes_out + act_out,
        )

    def __radd__(self, other: object) -> Cost:
        if other == 0:  # lets sum() start from its default 0
            return self
        return NotImplemented

    def scale(self, factor: int | float) -> Cost:
        """Every field multiplied by ``factor`` (rounded to whole FLOPs and bytes)."""
        return Cost(*(round(getattr(self, f.name) * factor) for f in fields(Cost)))

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte moved, None for a node that moves nothing."""
        return self.flops / self.bytes if self.bytes else None

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(Cost)}


_cost_fields = operator.attrgetter(*(f.name for f in fields(Cost)))
ZERO_COST = Cost()
