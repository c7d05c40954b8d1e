"""Counting a linalg module (formula-free cost from linalg on tensors): iteration domain × arithmetic in the region.

Every structured linalg op (named or generic) is counted the same way: a clone of the
module is generalised (`linalg-generalize-named-ops`), each op's loop bounds are derived
from its indexing maps and operand shapes, and its payload region is read op by op:

- a multiply feeding an add that accumulates into an output in a reduction = 2
  contraction FLOPs (one multiply-add),
- ``math.*`` ops = one special-function op each,
- comparisons, selects, min/max and every other float or integer ``arith`` op = one
  vector FLOP each; casts and index arithmetic are free.

FLOPs = iteration-domain size × the per-iteration count. Bytes are the operand tensors
read (``outs`` only when the region reads them) plus the result tensors written. Tensor
ops that only move data (``tensor.expand_shape``, ``extract_slice``, ``pad``, ...) are
classified as data movement with no FLOPs. No ONNX or torch per-op formula is used.

The counts are tied back to their origin through each op's location (`origin_of`):
torch-mlir's ONNX importer names every op after its ONNX node, the fx importer records
``file:line`` call sites. `LinalgCostPass` sums them onto graph nodes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, DType, Graph, Node, TensorType, ValueKind
from dabench_ir.passes import meta
from dabench_ir.passes.base import Pass, PassResult
from dabench_ir.passes.cost_rules import power_multiplies, traits_of
from dabench_ir.passes.meta import COST, UNATTRIBUTED

__all__ = [
    "BUFFER_VIEWS",
    "LINALG_COUNTS",
    "MLIR_ARTIFACT",
    "MLIR_CLASS",
    "MLIR_OPS",
    "UNATTRIBUTED_NODE",
    "VIEW_OPS",
    "LinalgCostPass",
    "MlirArtifact",
    "OpCount",
    "Origin",
    "assign_costs",
    "count_module",
    "generic_op_views",
    "mark_narrow_contractions",
    "node_keys",
    "ops_in",
    "origin_keys",
    "origin_of",
    "tensor_nbytes",
    "tensor_type_of",
]

logger = logging.getLogger(__name__)

MLIR_ARTIFACT, LINALG_COUNTS = meta.MLIR_ARTIFACT, meta.LINALG_COUNTS  # declared in passes/meta.py
MLIR_OPS, MLIR_CLASS = meta.MLIR_OPS, meta.MLIR_CLASS
UNATTRIBUTED_NODE = "unattributed"
"""Name of the node that gathers linalg ops with no recoverable origin."""

_IDX_ATTR = "dabench.idx"

# -- payload classification --------------------------------------------------------------
_FREE = frozenset(
    {
        "linalg.yield",
        "linalg.index",
        "arith.constant",
        "arith.index_cast",
        "arith.index_castui",
        "arith.extf",
        "arith.truncf",
        "arith.extsi",
        "arith.extui",
        "arith.trunci",
        "arith.sitofp",
        "arith.uitofp",
        "arith.fptosi",
        "arith.fptoui",
        "arith.bitcast",
        "arith.scaling_extf",
        "arith.scaling_truncf",
    }
)
_GATHERS = frozenset({"tensor.extract", "memref.load"})  # an element read from a tensor (a buffer) in a payload
_MUL = frozenset({"arith.mulf", "arith.muli"})
_ADD = frozenset({"arith.addf", "arith.addi"})
_SUB = frozenset({"arith.subf", "arith.subi"})
_WIDENINGS = frozenset({"arith.extf"})  # a cast to a wider float: what a pure widening op's body holds
_INT_WIDENINGS = frozenset({"arith.sitofp", "arith.uitofp"})  # an int4 weight's cast to float (w4a16)

# Tensor-dialect ops that only change how data is viewed: no bytes, no FLOPs.
VIEW_OPS = frozenset(
    {"tensor.expand_shape", "tensor.collapse_shape", "tensor.reshape", "tensor.cast", "tensor.bitcast"}
)
# Ops that are neither work nor data movement: skipped silently.
_IGNORED = frozenset(
    {
        "builtin.module",
        "func.func",
        "func.return",
        "func.call",
        "arith.constant",
        "tensor.empty",
        "tensor.dim",
        "tensor.extract",
        "tensor.from_elements",
        "ml_program.global",
    }
)
_IGNORED_DIALECTS = ("arith.", "index.", "math.", "cf.", "torch_c.", "bufferization.", "memref.")
# After bufferization: ops that only view a buffer (no bytes, no FLOPs).
BUFFER_VIEWS = frozenset(
    {
        "memref.expand_shape",
        "memref.collapse_shape",
        "memref.cast",
        "memref.subview",
        "memref.reinterpret_cast",
        "bufferization.to_memref",
        "bufferization.to_buffer",
        "bufferization.to_tensor",
    }
)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an op came from: an ONNX node name, an fx ``file:line`` call site, or nothing."""

    name: str | None
    kind: str = "unknown"  # "name" | "file" | "unknown"
    scope: str = ""
    file: str | None = None
    line: int | None = None
    names: tuple[str, ...] = ()  # every node name a fused location names (``name`` is the first)


@dataclass(slots=True)
class OpCount:
    """The counted cost of one MLIR op in the lowered module."""

    op_name: str
    origin: Origin
    cost: Cost
    op_class: str  # contraction | vector | data_movement | uncounted
    reason: str | None = None
    domain: tuple[int, ...] | None = None
    op: Any = field(default=None, repr=False)  # the torch_mlir Operation (original module)
    operand_dtype: DType | None = None  # a contraction's narrowest operand, when 8-bit (`_narrow_operand`)


class MlirArtifact:
    """A lowered torch_mlir module kept on a Graph; shared (not copied) by deepcopy.

    ``precision``: the float precision an ONNX model was imported at (`dabench_ir.mlir.load.
    attach_mlir`; None: the dtypes it was exported in). ``onnx_model``: the ONNX model (a path or
    an onnx.ModelProto) the module was imported from, so a run at another precision imports it
    again; None for a `.mlir` file, which keeps its own types."""

    def __init__(
        self,
        module: Any,
        *,
        weight_args: frozenset[int] = frozenset(),
        source: str = "",
        precision: str | None = None,
        onnx_model: Any = None,
    ) -> None:
        self.module = module
        self.weight_args = weight_args
        self.source = source
        self.precision = precision
        self.onnx_model = onnx_model

    def __deepcopy__(self, memo: dict[int, Any]) -> MlirArtifact:
        return self

    def __repr__(self) -> str:
        return f"MlirArtifact({self.source!r})"


# -- locations ---------------------------------------------------------------------------
_LIB_PATH = re.compile(r"(site-packages|dist-packages)[/\\](torch|torch_mlir|functorch|transformers)[/\\]")


def _is_asm_position(filename: str) -> bool:
    """A location the parser made from the MLIR text itself (printed without debug info)."""
    return filename in ("", "-", "<stdin>") or filename.endswith((".mlir", ".mlirbc"))


def origin_of(loc: Any) -> Origin:
    """Unwrap name, fused and call-site locations down to an ONNX node name or a source line."""
    from torch_mlir import ir

    names: list[str] = []
    files: list[tuple[str, int]] = []

    def visit(loc: Any, depth: int = 0) -> None:
        if depth > 32:
            return
        if isinstance(loc, ir.NameLoc):
            names.append(loc.name_str)
            visit(loc.child_loc, depth + 1)
        elif isinstance(loc, ir.FusedLoc):
            for sub in loc.locations:
                visit(sub, depth + 1)
        elif isinstance(loc, ir.CallSiteLoc):
            visit(loc.callee, depth + 1)
            visit(loc.caller, depth + 1)
        elif isinstance(loc, ir.FileLineColLoc) and not _is_asm_position(loc.filename):
            files.append((loc.filename, loc.start_line))

    visit(loc)
    names = list(dict.fromkeys(n for n in names if n and not n.startswith("graph:")))
    if names:
        return Origin(names[0], "name", scope="", names=tuple(names))
    if files:
        # The innermost frame outside torch's own sources is the user's model line.
        user = [f for f in files if not _LIB_PATH.search(f[0])] or files
        path, line = user[0]
        label = f"{os.path.basename(path)}:{line}"
        scope = " <- ".join(f"{os.path.basename(p)}:{n}" for p, n in user[:4])
        return Origin(label, "file", scope=scope, file=path, line=line)
    return Origin(None)


# -- types -------------------------------------------------------------------------------
_INT_RE = re.compile(r"^[su]?i(\d+)$")
_FLOAT_SIZES = {"f64": 8, "f32": 4, "tf32": 4, "f16": 2, "bf16": 2, "index": 8}
_PACKED = frozenset({"i4", "si4", "ui4"})
"""Element types stored two to a byte (int4 weights, as the ONNX path sizes `DType.INT4`); an ``i1``
is a byte, as torch stores a bool."""


def _itemsize(elem: Any) -> int:
    text = str(elem)
    if text in _FLOAT_SIZES:
        return _FLOAT_SIZES[text]
    match = _INT_RE.match(text)
    if match:
        return max(1, (int(match.group(1)) + 7) // 8)
    if text.startswith("f8") or text.startswith("f4") or text.startswith("f6"):
        return 1
    if text.startswith("complex<"):
        return 2 * _itemsize(text[8:-1])
    return 4


_DTYPES = {
    "f32": DType.FLOAT32,
    "f16": DType.FLOAT16,
    "bf16": DType.BFLOAT16,
    "f64": DType.FLOAT64,
    "i1": DType.BOOL,
    "i8": DType.INT8,
    "si8": DType.INT8,
    "ui8": DType.UINT8,
    "i16": DType.INT16,
    "i32": DType.INT32,
    "i64": DType.INT64,
    "si64": DType.INT64,
    "i4": DType.INT4,
    "si4": DType.INT4,
    "ui4": DType.INT4,
}


def tensor_type_of(mlir_type: Any) -> TensorType | None:
    """dabench TensorType of a ranked tensor type or a buffer (memref), or None for anything else."""
    from torch_mlir import ir

    if not isinstance(mlir_type, (ir.RankedTensorType, ir.MemRefType)):
        return None
    shape = tuple(d if d >= 0 else "?" for d in mlir_type.shape)
    return TensorType(shape, _DTYPES.get(str(mlir_type.element_type), DType.UNDEFINED))


def tensor_nbytes(mlir_type: Any) -> int:
    """Bytes of a statically shaped ranked tensor or buffer (memref): an int4 element half a byte (two
    packed in a byte, rounded up); 0 for scalars; raises on dynamic dims."""
    from torch_mlir import ir

    if not isinstance(mlir_type, (ir.RankedTensorType, ir.MemRefType)):
        return 0
    if not mlir_type.has_static_shape:
        raise UserError(
            f"tensor type {mlir_type} has dynamic dims; costs need static shapes "
            "(bind symbolic dims with --dim NAME=N, or export with static shapes)"
        )
    elem = mlir_type.element_type
    if str(elem) in _PACKED:
        return (math.prod(mlir_type.shape) + 1) // 2
    return math.prod(mlir_type.shape) * _itemsize(elem)


# -- the counter -------------------------------------------------------------------------
def _countable(op: Any) -> bool:
    name = op.name
    return name.startswith("linalg.") and name not in ("linalg.yield", "linalg.index")


@contextlib.contextmanager
def generic_op_views() -> Iterator[None]:
    """Inside it, ops are handed out as generic views: torch-mlir imports no dialect's Python module.

    The bindings import a dialect's generated Python classes the first time they hand out one of
    its ops (``torch_mlir.dialects.linalg`` brings its op DSL: 0.2 s of a `profile --via mlir`).
    The MLIR path reads ops only through what every view has (name, attributes, operands,
    results, regions, location), so it needs none of them. Usable as a decorator."""
    try:
        from torch_mlir._mlir_libs._mlir import globals as bindings

        saved = bindings.dialect_search_modules
    except (ImportError, AttributeError):  # pragma: no cover - another torch-mlir layout: typed views
        bindings = saved = None
    if bindings is not None:
        bindings.dialect_search_modules = []
    try:
        yield
    finally:
        if bindings is not None:
            bindings.dialect_search_modules = saved


def ops_in(region_holder: Any) -> Iterator[Any]:
    """Ops under `region_holder` in program order, not descending into linalg payloads."""
    for region in region_holder.regions:
        for block in region.blocks:
            for op in block.operations:
                op = op.operation
                yield op
                if not _countable(op):
                    yield from ops_in(op)


class _Shapes:
    """What the counter reads of MLIR types and indexing maps, read once per distinct one.

    Types and attributes are uniqued in their context (equal ones hash equal), and a decoder
    repeats a few dozen of each across its layers: 2,067 generic ops of the 32-layer LLaMA have
    21 distinct result types and 21 distinct indexing maps. The counter asked the bindings for
    each again per op (0.30 s of which this saves ~0.1 s). One per `count_module` call, so no
    key outlives its context."""

    def __init__(self) -> None:
        self._nbytes: dict[Any, int] = {}
        self._shape: dict[Any, tuple[int, ...] | None] = {}
        self._itemsize: dict[Any, int] = {}
        self._segments: dict[Any, int | None] = {}
        self._loops: dict[tuple[Any, Any], tuple[list[list[tuple[int, int]]], int, bool]] = {}

    @staticmethod
    def _once(table: dict[Any, Any], read: Callable[[Any], Any], key: Any) -> Any:
        """``read(key)``, kept in ``table`` (an exception is raised again each time, not kept)."""
        try:
            return table[key]
        except KeyError:
            value = table[key] = read(key)
            return value

    def nbytes(self, mlir_type: Any) -> int:
        """`tensor_nbytes` of the type (it raises on dynamic dims)."""
        return self._once(self._nbytes, tensor_nbytes, mlir_type)

    def shape(self, mlir_type: Any) -> tuple[int, ...] | None:
        """The dims of a ranked shaped type (negative: dynamic), None for any other type."""
        return self._once(self._shape, _shape_of, mlir_type)

    def itemsize(self, elem: Any) -> int:
        return self._once(self._itemsize, _itemsize, elem)

    def first_segment(self, segments: Any) -> int | None:
        """The first of an ``operandSegmentSizes`` (the number of ``ins``), None when it is empty."""
        return self._once(self._segments, _first_segment, segments)

    def loops(self, maps: Any, iterators: Any) -> tuple[list[list[tuple[int, int]]], int, bool]:
        """Per operand, (result position, loop dim) of each indexing-map result that is a plain
        loop dim; the number of loops; whether one is a reduction."""
        return self._once(self._loops, _loops_of, (maps, iterators))


def _shape_of(mlir_type: Any) -> tuple[int, ...] | None:
    from torch_mlir import ir

    return tuple(mlir_type.shape) if isinstance(mlir_type, ir.ShapedType) and mlir_type.has_rank else None


def _first_segment(segments: Any) -> int | None:
    sizes = list(segments)
    return int(sizes[0]) if sizes else None


def _loops_of(key: tuple[Any, Any]) -> tuple[list[list[tuple[int, int]]], int, bool]:
    from torch_mlir import ir

    maps, iterators = key
    dims = [
        [
            (pos, expr.position)
            for pos, expr in enumerate(ir.AffineMapAttr(a).value.results)
            if isinstance(expr, ir.AffineDimExpr)
        ]
        for a in maps
    ]
    kinds = [str(a) for a in iterators]
    return dims, len(kinds), any("reduction" in k for k in kinds)


def _loop_bounds(
    operands: list[Any], dims: list[list[tuple[int, int]]], n_loops: int, shapes: _Shapes
) -> tuple[int, ...]:
    bounds: list[int | None] = [None] * n_loops
    for operand, operand_dims in zip(operands, dims, strict=False):
        shape = shapes.shape(operand.type)
        if shape is None:
            continue
        for pos, dim in operand_dims:
            if bounds[dim] is None and shape[pos] >= 0:
                bounds[dim] = shape[pos]
    missing = [f"d{i}" for i, b in enumerate(bounds) if b is None]
    if missing:
        raise _Uncountable(f"cannot derive loop bounds for {', '.join(missing)} from the indexing maps")
    return tuple(b for b in bounds if b is not None)


class _Uncountable(Exception):
    """An op this counter cannot count; the message is the reason shown to the user."""


_WHOLE_POWERS = ("math.fpowi", "math.ipowi")
"""Powers with an integer exponent (``x ** 3`` in GPT-2's tanh GELU, ``x ** 2`` in an RMS norm)."""


def _constant_exponent(op: Any) -> float | None:
    """The exponent of a power op when an ``arith.constant`` defines it; None otherwise."""
    owner = op.operands[1].owner if len(op.operands) > 1 else None
    if owner is None or not hasattr(owner, "name") or owner.name != "arith.constant":
        return None
    try:
        return float(int(str(owner.attributes["value"]).split(":")[0].strip()))
    except (KeyError, ValueError):
        return None


def _count_payload(
    op: Any, n_inputs: int, has_reduction: bool, gathers: list[Any], index_type: Any
) -> tuple[int, int, int, set[int]]:
    """Per-iteration (contraction, vector, special) counts and the block args the body reads.

    Tensors the body gathers from (``tensor.extract``) are appended to `gathers`."""
    block = op.regions[0].blocks[0]
    contraction = vector = special = 0
    used_args: set[int] = set()
    fused_muls: set[Any] = set()
    arg_index = {arg: arg.arg_number for arg in block.arguments}  # a value is one of the body's arguments
    body = [o.operation for o in block.operations]
    # First pass: find multiply-adds (mul result accumulated into an output block arg).
    if has_reduction:
        for inner in body:
            if inner.name not in _ADD:
                continue
            lhs, rhs = inner.operands[0], inner.operands[1]
            for acc, other in ((lhs, rhs), (rhs, lhs)):
                idx = arg_index.get(acc)
                owner = other.owner
                if idx is not None and idx >= n_inputs and not isinstance(owner, type(block)) and owner.name in _MUL:
                    fused_muls.add(owner)
                    fused_muls.add(inner)
                    contraction += 2
                    break
    guards = _guard_only(body)
    for inner in body:
        if inner not in guards:
            for operand in inner.operands:
                idx = arg_index.get(operand)
                if idx is not None:
                    used_args.add(idx)
        name = inner.name
        if name in _FREE or inner in fused_muls or inner in guards or _subtracts_zero(op, inner, arg_index, n_inputs):
            continue
        if name in _GATHERS:  # a gather: one element read per iteration, no FLOPs
            gathers.append(inner.operands[0])
            continue
        if name in _WHOLE_POWERS and (multiplies := power_multiplies(_constant_exponent(inner))):
            vector += multiplies  # a small whole power is multiplies, as the ONNX rule counts Pow
        elif name.startswith("math."):
            special += 1
        elif name.startswith("arith."):
            if inner.results and inner.results[0].type == index_type:
                continue  # address arithmetic
            vector += 1
        elif inner.regions and len(inner.regions) > 0:
            raise _Uncountable(f"payload op {name} has regions")
        else:
            raise _Uncountable(f"payload op {name} has no counting rule")
    return contraction, vector, special, used_args


def _subtracts_zero(op: Any, inner: Any, arg_index: dict[Any, int], n_inputs: int) -> bool:
    """``inner`` subtracts an input of ``op`` that is a constant zero (``x - 0`` is ``x``): the zero
    point of a symmetric quantisation, which ``linalg.quantized_matmul`` subtracts from each operand
    before it multiplies (torch-mlir's int8 matmul writes the constant 0 there)."""
    if inner.name not in _SUB:
        return False
    idx = arg_index.get(inner.operands[1])
    if idx is None or idx >= n_inputs:
        return False
    source = op.operands[idx]
    owner = source.owner
    if isinstance(owner, type(op.regions[0].blocks[0])) or owner.name != "arith.constant":
        return False
    return _is_zero(owner.attributes["value"])


def _is_zero(attr: Any) -> bool:
    """A scalar or splat zero (integer or float) constant."""
    from torch_mlir import ir

    if isinstance(attr, ir.DenseElementsAttr):
        if not attr.is_splat:
            return False
        attr = attr.get_splat_value()
    if isinstance(attr, ir.IntegerAttr):
        return attr.value == 0
    if isinstance(attr, ir.FloatAttr):
        return attr.value == 0.0
    return False


def _guard_only(body: list[Any]) -> set[Any]:
    """Runtime checks (``cf.assert``) and the ops that only feed them or only compute a
    gather address (``tensor.extract`` indices): not model arithmetic."""
    guards: set[Any] = set()
    if not any(inner.name == "cf.assert" or inner.name in _GATHERS for inner in body):
        return guards  # nothing to guard or to address: no op can join (the common payload)
    for inner in reversed(body):
        if inner.name == "cf.assert":
            guards.add(inner)
            continue
        uses = [(use.owner.operation, use.operand_number) for r in inner.results for use in r.uses]
        if uses and all(u in guards or (u.name in _GATHERS and k >= 1) for u, k in uses):
            guards.add(inner)
    return guards


def _count_generic(op: Any, is_weight: Any, shapes: _Shapes, index_type: Any) -> tuple[Cost, str, tuple[int, ...]]:
    attrs = op.attributes
    dims, n_loops, has_reduction = shapes.loops(attrs["indexing_maps"], attrs["iterator_types"])
    operands = list(op.operands)
    results = list(op.results)
    segments = shapes.first_segment(attrs["operandSegmentSizes"]) if "operandSegmentSizes" in attrs else None
    n_inputs = segments if segments is not None else len(operands) - len(results)
    bounds = _loop_bounds(operands, dims, n_loops, shapes)
    domain = math.prod(bounds)
    gathers: list[Any] = []
    c, v, s, used = _count_payload(op, n_inputs, has_reduction, gathers, index_type)
    weight_bytes = act_in = act_out = 0
    for table in gathers:
        nbytes = domain * shapes.itemsize(table.type.element_type)
        if is_weight(table):
            weight_bytes += nbytes
        else:
            act_in += nbytes
    seen: list[Any] = []
    for i, operand in enumerate(operands):
        if i >= n_inputs and i not in used:
            continue  # an init tensor the body never reads (its shape only)
        if any(operand == v for v in seen):
            continue  # one value in two operands (x * x) is read once
        seen.append(operand)
        nbytes = shapes.nbytes(operand.type)
        if is_weight(operand):
            weight_bytes += nbytes
        else:
            act_in += nbytes
    for result in results:
        act_out += shapes.nbytes(result.type)
    if not results:  # on buffers (after bufferization): the outs buffers are written
        act_out += sum(shapes.nbytes(o.type) for o in operands[n_inputs:])
    cost = Cost(
        contraction_flops=domain * c,
        vector_flops=domain * v,
        special_ops=domain * s,
        weight_bytes=weight_bytes,
        act_bytes_in=act_in,
        act_bytes_out=act_out,
    )
    op_class = "contraction" if c else ("vector" if (v or s) else "data_movement")
    return cost, op_class, bounds


def _count_tensor_op(op: Any, is_weight: Any) -> tuple[Cost, str]:
    """Data movement outside linalg: bytes read and written, no FLOPs."""
    name = op.name
    if name in VIEW_OPS:
        return Cost(), "data_movement"
    results = sum(tensor_nbytes(r.type) for r in op.results)
    if name == "tensor.extract_slice":
        read = results
    elif name in ("tensor.insert_slice", "tensor.parallel_insert_slice"):
        read = tensor_nbytes(op.operands[0].type)
        results = read  # written in place into the destination
    else:
        read = 0
        w = 0
        for operand in op.operands:
            nb = tensor_nbytes(operand.type)
            if is_weight(operand):
                w += nb
            else:
                read += nb
        return Cost(weight_bytes=w, act_bytes_in=read, act_bytes_out=results), "data_movement"
    return Cost(act_bytes_in=read, act_bytes_out=results), "data_movement"


def _weight_tracer(weight_args: frozenset[int]) -> Any:
    """is_weight(value): the value is a weight argument or a weight-sized constant, possibly
    seen through reshapes (views). A materialised copy (broadcast, transpose) is an
    activation: the weight bytes are counted once, where the weight is read."""
    from torch_mlir import ir

    passthrough = VIEW_OPS

    def is_weight(value: Any, depth: int = 0) -> bool:
        if depth > 8 or not isinstance(value.type, (ir.RankedTensorType, ir.MemRefType)):
            return False
        if isinstance(value, ir.BlockArgument):
            block = value.owner
            parent = block.owner
            return parent is not None and parent.operation.name == "func.func" and value.arg_number in weight_args
        op = value.owner
        name = op.name
        if name == "arith.constant":
            ttype = value.type
            attr = op.attributes["value"]
            splat = isinstance(attr, ir.DenseElementsAttr) and attr.is_splat  # not a parameter
            return ttype.has_static_shape and ttype.rank >= 1 and math.prod(ttype.shape) > 1 and not splat
        if name in passthrough or name in BUFFER_VIEWS:
            return bool(op.operands) and is_weight(op.operands[0], depth + 1)
        return False

    return is_weight


@generic_op_views()
def count_module(module: Any, *, weight_args: Sequence[int] | frozenset[int] = ()) -> list[OpCount]:
    """Count every op of a linalg-on-tensors module; one OpCount per counted op, in order.

    `weight_args` are the indices of the entry function's arguments that hold weights
    (their reads are weight bytes). The module itself is left unchanged.
    """
    from torch_mlir import ir
    from torch_mlir.passmanager import PassManager

    operation = getattr(module, "operation", module)
    originals = [op for op in ops_in(operation)]
    i64 = ir.IntegerType.get_signless(64, context=operation.context)
    countable = [op for op in originals if _countable(op)]
    for i, op in enumerate(countable):
        op.attributes[_IDX_ATTR] = ir.IntegerAttr.get(i64, i)
    try:
        clone = operation.clone()
        with operation.context:
            PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))").run(clone)
    finally:
        for op in countable:
            del op.attributes[_IDX_ATTR]
    generic_by_idx: dict[int, Any] = {}
    for op in ops_in(clone):
        if _countable(op) and _IDX_ATTR in op.attributes:
            generic_by_idx[ir.IntegerAttr(op.attributes[_IDX_ATTR]).value] = op

    is_weight = _weight_tracer(frozenset(weight_args))
    is_weight_clone = _weight_tracer(frozenset(weight_args))
    shapes = _Shapes()
    index_type = ir.IndexType.get(context=operation.context)
    counts: list[OpCount] = []
    index = {id(op): i for i, op in enumerate(countable)}  # operations are unique objects per walk
    for op in originals:
        name = op.name
        if name in _IGNORED or (name.startswith(_IGNORED_DIALECTS) and not _has_tensor(op) and name != "memref.copy"):
            continue
        origin = origin_of(op.location)
        if _countable(op):
            generic = generic_by_idx.get(index[id(op)])
            try:
                if generic is None:
                    raise _Uncountable("op disappeared when generalised (dead code?)")
                if generic.name != "linalg.generic":
                    raise _Uncountable(f"{name} cannot be generalised to linalg.generic")
                cost, op_class, bounds = _count_generic(generic, is_weight_clone, shapes, index_type)
                counts.append(OpCount(op_name=name, origin=origin, cost=cost, op_class=op_class, domain=bounds, op=op))
            except _Uncountable as exc:
                counts.append(
                    OpCount(op_name=name, origin=origin, cost=Cost(), op_class="uncounted", reason=str(exc), op=op)
                )
        elif name.startswith("tensor."):
            cost, op_class = _count_tensor_op(op, is_weight)
            counts.append(OpCount(op_name=name, origin=origin, cost=cost, op_class=op_class, op=op))
        elif name == "memref.copy":  # a buffer copy: its source read, its target written
            src, dst = op.operands[0], op.operands[1]
            w = tensor_nbytes(src.type) if is_weight(src) else 0
            cost = Cost(weight_bytes=w, act_bytes_in=tensor_nbytes(src.type) - w, act_bytes_out=tensor_nbytes(dst.type))
            counts.append(OpCount(op_name=name, origin=origin, cost=cost, op_class="data_movement", op=op))
        elif _has_tensor(op):
            counts.append(
                OpCount(
                    op_name=name,
                    origin=origin,
                    cost=Cost(),
                    op_class="uncounted",
                    reason=f"no linalg-level counting rule for {name}",
                    op=op,
                )
            )
    _fuse_narrow_widenings(counts, is_weight)
    return counts


# -- 8-bit operands ------------------------------------------------------------------------
_NARROW_DTYPES = {
    "i8": DType.INT8,
    "si8": DType.INT8,
    "ui8": DType.UINT8,
    "f8E4M3FN": DType.FLOAT8E4M3FN,
    "f8E4M3FNUZ": DType.FLOAT8E4M3FNUZ,
    "f8E5M2": DType.FLOAT8E5M2,
    "f8E5M2FNUZ": DType.FLOAT8E5M2FNUZ,
}
"""The 8-bit element types a contraction can multiply in (an i1 mask is no 8-bit operand)."""


def _widened_source(op: Any) -> Any | None:
    """The 8-bit float or int4 ``op`` only widens (a ``linalg.generic`` whose body is one ``arith.extf``,
    or for an int4 one ``arith.sitofp`` or ``arith.uitofp``, of its single input), else None: what a
    compiler fuses into the op that reads the wide copy."""
    if op.name != "linalg.generic" or len(op.results) != 1 or len(op.operands) != 2:
        return None
    source = op.operands[0]
    elem = str(getattr(source.type, "element_type", ""))
    widenings = _WIDENINGS if elem.startswith("f8") else _INT_WIDENINGS if elem in _PACKED else None
    if widenings is None:
        return None
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    if len(body) != 2 or body[0].name not in widenings or body[1].name != "linalg.yield":
        return None
    arg = op.regions[0].blocks[0].arguments[0]
    return source if body[0].operands[0] == arg and body[1].operands[0] == body[0].results[0] else None


def _fuse_narrow_widenings(counts: list[OpCount], is_weight: Any) -> None:
    """Fuse each widening of an 8-bit float or an int4 (`_widened_source`) into the linalg ops that read
    it, as a compiler fuses the cast into its consumer: the widening costs nothing, each consumer reads
    the narrow source instead of the wide copy (a weight's bytes stay weight bytes); then mark every
    contraction whose operand is 8-bit, read directly or through such a widening and data
    movement (a broadcast of the weight), with that dtype (`OpCount.operand_dtype`). A widening
    something other than a linalg op reads (a function result) is left as it is."""
    by_op = {c.op: c for c in counts if c.op is not None and c.op_name.startswith("linalg.")}
    fused: dict[Any, Any] = {}  # a fused widening's op -> its 8-bit source
    for c in counts:
        source = _widened_source(c.op) if c.op is not None else None
        if source is None:
            continue
        wide = c.op.results[0]
        readers = [by_op.get(use.owner.operation) for use in wide.uses]
        if not readers or any(r is None or r.op_class == "uncounted" for r in readers):
            continue
        narrow, wide_bytes = tensor_nbytes(source.type), tensor_nbytes(wide.type)
        moved = Cost(weight_bytes=narrow) if is_weight(source) else Cost(act_bytes_in=narrow)
        for reader in {id(r): r for r in readers}.values():
            cost = reader.cost
            cost = replace(cost, act_bytes_in=max(0, cost.act_bytes_in - wide_bytes))
            reader.cost = cost + moved
        narrow_kind = "an int4" if str(source.type.element_type) in _PACKED else "an 8-bit float"
        c.cost, c.reason = Cost(), f"{narrow_kind} widening, fused into the ops that read it"
        fused[c.op] = source
    _fuse_dequantisations(counts, by_op, fused, is_weight)
    for c in counts:
        if c.op_class == "contraction" and c.op is not None:
            c.operand_dtype = _narrow_operand(c.op, by_op, fused)


def _view_readers(value: Any, by_op: dict[Any, OpCount]) -> list[tuple[OpCount | None, Any]] | None:
    """The ops that read ``value``, seen through views (``tensor.collapse_shape``...), each with the
    value it reads; None when something other than a view or a linalg op reads it."""
    found: list[tuple[OpCount | None, Any]] = []
    stack = [value]
    while stack:
        v = stack.pop()
        for use in v.uses:
            owner = use.owner.operation
            if owner.name in VIEW_OPS and owner.results:
                stack.append(owner.results[0])
            elif owner.name.startswith("linalg."):
                found.append((by_op.get(owner), v))
            else:
                return None
    return found


def _fuse_dequantisations(
    counts: list[OpCount], by_op: dict[Any, OpCount], fused: dict[Any, Any], is_weight: Any
) -> None:
    """Fuse a weight's int4 dequantisation (w4a16's ``(w - zero) * scale`` on the widened int4 weight,
    `load._dequantise_groups`) into the matmul that reads it, as a compiler dequantises in the
    matmul's prologue and as the ONNX path adds it to the matmul (`passes.precision.DequantisePass`):
    an elementwise op (all loops parallel, one result) whose inputs are each a fused int4 widening,
    a weight or such an op already fused, one of them not a weight, and which only linalg ops read
    (through views), keeps its FLOPs and the weight bytes it reads, but writes nothing, and its
    readers do not read its result. Only chains that start at an int4 widening are fused."""
    dequantised: set[Any] = {w.results[0] for w, src in fused.items() if str(src.type.element_type) in _PACKED}
    if not dequantised:
        return

    def root(value: Any) -> Any:
        for _ in range(8):
            owner = getattr(value, "owner", None)
            op = getattr(owner, "operation", owner)
            if op is None or not hasattr(op, "name") or op.name not in VIEW_OPS or not op.operands:
                break
            value = op.operands[0]
        return value

    for c in counts:
        op = c.op
        if op is None or op.name != "linalg.generic" or op in fused or c.op_class == "uncounted":
            continue
        if len(op.results) != 1 or any("parallel" not in str(t) for t in op.attributes["iterator_types"]):
            continue
        ins = list(op.operands)[: len(op.operands) - 1]
        from_dequantised = [v for v in ins if root(v) in dequantised]
        if not from_dequantised or not all(root(v) in dequantised or is_weight(v) for v in ins):
            continue
        result = op.results[0]
        readers = _view_readers(result, by_op)
        if not readers or any(r is None or r.op_class == "uncounted" for r, _ in readers):
            continue
        wide = tensor_nbytes(result.type)
        c.cost = replace(c.cost, act_bytes_out=max(0, c.cost.act_bytes_out - wide))
        c.reason = "an int4 weight's dequantisation, fused into the matmul that reads it"
        for reader in {id(r): r for r, _ in readers if r is not None}.values():
            reader.cost = replace(reader.cost, act_bytes_in=max(0, reader.cost.act_bytes_in - wide))
        dequantised.add(result)


def _narrow_operand(op: Any, by_op: dict[Any, OpCount], fused: dict[Any, Any]) -> DType | None:
    """The 8-bit dtype a contraction multiplies in: one of its inputs is 8-bit, read directly (the
    i8 operands of ``linalg.quantized_matmul``) or through a fused widening and ops that only move
    data; None when none is."""
    n_results = len(op.results)
    found: DType | None = None
    for value in list(op.operands)[: len(op.operands) - n_results]:
        for _ in range(8):
            dtype = _NARROW_DTYPES.get(str(getattr(value.type, "element_type", "")))
            if dtype is not None:
                found = found or dtype
                break
            owner = value.owner
            producer = by_op.get(getattr(owner, "operation", owner))
            if producer is None:
                break
            if producer.op in fused:
                value = fused[producer.op]
            elif producer.op_class == "data_movement" and len(producer.op.operands) == 2:
                value = producer.op.operands[0]
            else:
                break
    return found


def _has_tensor(op: Any) -> bool:
    from torch_mlir import ir

    return any(isinstance(r.type, ir.RankedTensorType) for r in op.results)


# -- the pass ----------------------------------------------------------------------------
def _summary_class(ops: list[OpCount]) -> str:
    classes = {c.op_class for c in ops}
    for name in ("contraction", "vector", "data_movement"):
        if name in classes:
            return name
    return "none"


@dataclass(frozen=True)
class LinalgCostPass(Pass):
    """Sum linalg-level costs onto graph nodes by origin.

    Reads the lowered module from ``graph.meta[MLIR_ARTIFACT]`` (and the frontend's counts
    from ``graph.meta[LINALG_COUNTS]`` when it counted already, to build nodes from a
    `.mlir` file). Each op's cost goes to the node named by its origin (`origin_keys`); an
    op whose origin is not a node is reported under ``unattributed``. Nodes no op maps to
    get a zero Cost (folded away or pure metadata).
    """

    name: str = "linalg-cost"

    def requires(self, graph: Graph) -> None:
        if MLIR_ARTIFACT not in graph.meta:
            raise UserError("the linalg cost pass needs an MLIR module; load the model with the MLIR frontend")

    def call(self, graph: Graph) -> PassResult:
        artifact: MlirArtifact = graph.meta[MLIR_ARTIFACT]
        counts = graph.meta.get(LINALG_COUNTS)
        if counts is None:
            counts = graph.meta[LINALG_COUNTS] = count_module(artifact.module, weight_args=artifact.weight_args)
        keys = node_keys(counts)
        assign_costs(graph, counts, keys)
        _check_costed(graph, counts, keys, artifact.source)
        fold_weight_layouts(graph)
        mark_narrow_contractions(graph)
        return PassResult(graph, True)


def fold_weight_layouts(graph: Graph) -> None:
    """What a compiler computes once, at compile time, costs nothing a step, as on the ONNX path
    (`passes.FoldWeightLayouts`, its rule): a linear layer's ``Transpose(W)``, which the module
    lowers to a ``linalg.transpose`` of the weight every step, and constant subgraphs.

    What a folded weight layout hands on is the weight as it is stored, laid out once: its readers
    read the stored bytes the module's copy read (an fp8 weight's 1 B an element; none where a fused
    int4 dequantisation counts the weight at its reader already) as weight bytes, in place of the
    activation the copy wrote (at the widened dtype). Where the module has no copy (an int8 weight its
    quantised matmul reads as it is stored) nothing moves: the readers counted the weight already."""
    from dabench_ir.passes.passes import FoldWeightLayouts

    FoldWeightLayouts()(graph)
    for node in graph.nodes:
        if meta.FOLDED not in node.meta:
            continue
        copy = node.meta.get(COST)
        node.meta[COST] = Cost()
        if not isinstance(copy, Cost) or not node.inputs:
            continue  # a fill of a literal (an accumulator's zero init) is no stored tensor its readers load
        typed = [graph.type_of(out).nbytes() if out in graph.values else 0 for out in node.outputs]
        of_weight = any(v in graph.values and graph.values[v].kind is ValueKind.WEIGHT for v in node.inputs)
        for out, size in zip(node.outputs, typed, strict=True):
            if of_weight:  # the weight as stored, laid out once: the copy's bytes, by output
                share = size / sum(typed) if sum(typed) else 0.0
                written, stored = int(copy.act_bytes_out * share), int(copy.weight_bytes * share)
            else:  # a constant subgraph's result (a causal mask, rotary tables): a stored constant of its own
                written = stored = size
            _read_as_stored(graph, out, written, stored)


def _read_as_stored(graph: Graph, value: str, written: int, stored: int) -> None:
    """``value``'s readers read it as stored bytes (``stored``, weight bytes) in place of the activation
    (``written``) the module's copy wrote, as the ONNX path's readers read a folded value: a causal mask
    the module builds every step had been an activation there, 8.4 MB of GPT-2's weight bytes apart,
    and dropped as an on-chip intermediate under fused attention. Indices a gather
    reads stay its input (its rule counts them so, stored or not: `OpTraits.index_input`)."""
    for reader in graph.consumers.get(value, ()):
        cost = reader.meta.get(COST)
        index = traits_of(reader).index_input
        if index is not None and index < len(reader.inputs) and reader.inputs[index] == value:
            continue
        if meta.FOLDED not in reader.meta and isinstance(cost, Cost) and cost.act_bytes_in >= written > 0:
            reader.meta[COST] = replace(
                cost, act_bytes_in=cost.act_bytes_in - written, weight_bytes=cost.weight_bytes + stored
            )


def mark_narrow_contractions(graph: Graph) -> None:
    """A node whose linalg contraction multiplies an 8-bit operand (`OpCount.operand_dtype`: the i8
    operands of ``linalg.quantized_matmul``, an fp8 weight whose widening the count fused) computes
    in that dtype (`meta.PRECISION`, what the lowerings take the peak at), as the module says,
    whatever precision pass ran before; the other nodes keep theirs."""
    for node in graph.nodes:
        dtypes = {c.operand_dtype for c in node.meta.get(MLIR_OPS, ()) if c.operand_dtype is not None}
        if dtypes:
            node.meta[meta.PRECISION] = min(dtypes, key=str)
            node.meta.pop(meta.ACCUMULATE, None)


def node_keys(counts: list[OpCount]) -> list[str | None]:
    """The node each op's cost goes to: its origin (`origin_keys`); in a module where no op carries
    an origin (a hand-written ``.mlir`` file without locations) each counted op is a node of its
    own, named by its op (``linalg.matmul``, then ``linalg.matmul#1``), so its work is costed rather
    than left unattributed. The `.mlir` loader builds the nodes by these keys, the cost pass
    assigns by them."""
    keys = origin_keys(counts)
    if any(k is not None for k in keys):
        return keys
    seen: dict[str, int] = {}
    out: list[str | None] = []
    for c in counts:
        k = seen[c.op_name] = seen.get(c.op_name, -1) + 1
        out.append(c.op_name if k == 0 else f"{c.op_name}#{k}")
    return out


def _check_costed(graph: Graph, counts: list[OpCount], keys: Sequence[str | None], source: str) -> None:
    """A UserError when the module's counted work (FLOPs and bytes) is all on ops that map to no node
    of the graph: the run would report 0 FLOP in 0 ns and "fits" whatever the work (a pass that
    drops locations, ``strip-debuginfo``, leaves nothing to attribute). Never a silent zero."""
    work = lambda c: c.cost.flops + c.cost.bytes  # noqa: E731
    placed = sum(
        work(c) for c, k in zip(counts, keys, strict=True) if c.op_class != "uncounted" and k and graph.has_node(k)
    )
    stray = [c for c, k in zip(counts, keys, strict=True) if work(c) and not (k and graph.has_node(k))]
    if placed or not stray:
        return
    flops = sum(c.cost.flops for c in stray)
    missing = sum(1 for c in stray if c.origin.name is None)
    why = (
        f"{missing} of them carry no location naming a node (a pass that strips locations leaves nothing to attribute)"
        if missing
        else "their locations name no node of the graph"
    )
    raise UserError(
        f"{source}: none of the module's work can be costed on the graph: {len(stray)} op(s), {flops:,} FLOPs, "
        f"map to no node; {why}"
    )


def assign_costs(graph: Graph, counts: list[OpCount], keys: Sequence[str | None]) -> None:
    """Each op's cost onto the node named by its key (`origin_keys`, or one node per op); an op
    whose key is not a node, or that could not be counted, goes to the ``unattributed`` node."""
    by_key: dict[str, list[OpCount]] = {}
    stray: list[OpCount] = []
    for c, key in zip(counts, keys, strict=True):
        if c.op_class == "uncounted" or key is None or not graph.has_node(key):
            stray.append(c)
        else:
            by_key.setdefault(key, []).append(c)
    for node in graph.nodes:
        ops = by_key.get(node.name, [])
        node.meta[COST] = sum((c.cost for c in ops), Cost())
        node.meta[MLIR_OPS] = ops
        node.meta[MLIR_CLASS] = _summary_class(ops) if ops else "none"
    if stray:
        _add_unattributed(graph, stray)
    graph.invalidate()
    meta.graph_set(graph, meta.ANALYZED, "linalg")


def origin_keys(counts: list[OpCount]) -> list[str | None]:
    """Node name for each op: its origin name; a source-line origin (fx) that recurs after
    other origins (the same line run once per layer) gets ``#k`` for its k-th run.

    An ONNX node name is never a source line, so ONNX origins are their node names as they are."""
    keys: list[str | None] = []
    runs: dict[str, int] = {}
    previous: str | None = None
    for c in counts:
        label = c.origin.name
        if label is None or c.origin.kind != "file":
            keys.append(label)
            continue
        if label != previous:
            runs[label] = runs.get(label, -1) + 1
        previous = label
        k = runs[label]
        keys.append(label if k == 0 else f"{label}#{k}")
    return keys


def _reason(c: OpCount) -> str:
    where = f" (from {c.origin.name})" if c.origin.name else ""
    if c.op_class == "uncounted":
        return f"{c.op_name}{where}: {c.reason}"
    if c.origin.name is None:
        return f"{c.op_name}: no origin in its location"
    return f"{c.op_name}{where}: origin is not a node of the graph"


def _add_unattributed(graph: Graph, stray: list[OpCount]) -> None:
    reasons: dict[str, int] = {}
    for c in stray:
        reasons[_reason(c)] = reasons.get(_reason(c), 0) + 1
    text = "; ".join(f"{r} ×{n}" if n > 1 else r for r, n in list(reasons.items())[:8])
    if len(reasons) > 8:
        text += f"; and {len(reasons) - 8} more"
    name = UNATTRIBUTED_NODE
    while graph.has_node(name):
        name = "_" + name
    node = Node(name=name, op_type="unattributed", domain="mlir")
    node.meta[COST] = sum((c.cost for c in stray), Cost())
    node.meta[UNATTRIBUTED] = f"{len(stray)} MLIR op(s) without a countable origin: {text}"
    node.meta[MLIR_OPS] = stray
    node.meta[MLIR_CLASS] = "none"
    graph.nodes.append(node)
    graph.invalidate()
    logger.info("%d MLIR op(s) unattributed", len(stray))
