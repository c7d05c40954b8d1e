"""Per-op cost rules: one function per ONNX op type, found by name.

A rule gets an `OpView` (the node with its input and output types bound) and returns the
node's FLOPs as a `Cost`; the registry adds the bytes moved (weights read, activations
read, outputs written) unless the rule says it counts bytes itself. The same registration
carries every other per-op fact as an `OpTraits` (shape-only, folds on weights, fp32 under
mixed precision, host-CPU kernel class, backward rule, what autograd saves, module role,
row reductions, ...), read with `op_traits`, `traits_of` or `ops_with` by the passes, the
lowerings, the reports and the host predictor; no other module keeps a table of op names
(tests/test_op_registry_only.py). Adding an op is one decorated function:

    @cost_rule("Relu", op_class=OpClass.VECTOR)
    def relu(op: OpView) -> Cost:
        return Cost(vector_flops=op.out_numel())

The rule's docstring is its line in docs/costs.md's per-op table, which is generated from
the registry (`render_costs_markdown`).

FLOP convention (also in docs/costs.md and in every JSON report as "flop_convention"):
a multiply-add in a contraction is 2 FLOPs; vector FLOPs count one per elementwise
arithmetic or comparison op; special-function ops (exp, log, erf, tanh, sqrt, rsqrt, pow,
sin, cos, ...) are counted apart, one per evaluation.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from dabench_ir.errors import UnboundSymbolError
from dabench_ir.frontends import contrib_types as _types
from dabench_ir.ir import TOOL_DOMAIN, Cost, Graph, Node, TensorType, Value

__all__ = [
    "CPU_GELU_TANH",
    "CPU_KERNELS",
    "CPU_KERNEL_FALLBACK",
    "CPU_MATMUL",
    "CPU_STREAM",
    "CPU_TRANSPOSE_2D",
    "ESTIMATED_NOTE",
    "FLOP_CONVENTION",
    "UNKNOWN_OP",
    "Backward",
    "CostRule",
    "OpClass",
    "OpTraits",
    "OpView",
    "Role",
    "Saves",
    "ShapeUnknownError",
    "cost_rule",
    "estimate_cost",
    "find_rule",
    "op_traits",
    "op_traits_only",
    "ops_with",
    "registered_ops",
    "render_costs_markdown",
    "traits_of",
]

FLOP_CONVENTION = (
    "contraction: 2 FLOPs per multiply-add; vector: 1 FLOP per elementwise arithmetic or "
    "comparison op; special: 1 op per transcendental evaluation (exp, log, erf, tanh, sqrt, "
    "rsqrt, pow, sin, cos); flops = contraction + vector + special; bytes = weight bytes read "
    "+ activation bytes read + bytes written (shape-parameter inputs excluded)"
)


class OpClass(enum.StrEnum):
    """What kind of work an op is, for lowerings and reports."""

    CONTRACTION = "contraction"  # matmul, conv, einsum: the MAC arrays' work
    VECTOR = "vector"  # elementwise, normalisation, softmax, reductions
    DATA_MOVEMENT = "data_movement"  # transpose, concat, gather, cast, views
    SHAPE = "shape"  # reads no tensor data: Shape, Constant, ConstantOfShape, Range


class Backward(enum.StrEnum):
    """How the training pass derives an op's backward cost from its forward cost (docs/training.md)."""

    NONE = "none"  # no gradient flows through it
    CONTRACTION = "contraction"  # one gradient contraction per operand that needs a gradient
    VECTOR = "vector"  # 2x the forward vector FLOPs, 1x its special ops
    MOVE = "move"  # the same bytes move back, no FLOPs
    SCATTER_ADD = "scatter_add"  # Gather: gradient rows summed into the table, one add per element


class Saves(enum.StrEnum):
    """What autograd keeps of an op for the backward pass (`passes.training.saved_for_backward`;
    PyTorch's saved tensors, docs/training.md)."""

    OPERANDS = "operands"  # a contraction: each activation operand whose partner needs a gradient
    INPUTS = "inputs"  # its activation inputs (a data-dependent derivative: GELU, Pow, Mul, ...)
    OUTPUT = "output"  # its output (softmax, sigmoid, tanh, exp, sqrt, reciprocal)
    INPUT_AND_STATS = "input_and_stats"  # a fused norm: its input and two fp32 statistics per row
    NOTHING = "nothing"  # adds, casts, some reductions, views and layout moves


class Role(enum.StrEnum):
    """What an op signals to the report's module roles (`dabench_ir.report.roles`); an op carries
    a set of them, and the role finder decides by its own precedence which one names the node."""

    CONTRACTION = "contraction"  # a matmul: named after its weight, else attention scores/values
    ATTENTION = "attention"  # a fused attention kernel
    SOFTMAX = "softmax"  # the attention softmax
    NORM = "norm"  # a normalisation op
    NORM_PART = "norm_part"  # a piece of a decomposed norm (outside an MLP module)
    ACTIVATION = "activation"  # an activation function
    ELEMENTWISE = "elementwise"  # element-wise arithmetic: inside an MLP module, part of its activation
    ROTARY = "rotary"  # a rotary position embedding, or rotate-half's Neg
    ROTARY_TABLE = "rotary_table"  # computes RoPE's cos/sin tables: the multiplies they feed are the rotary
    LAYOUT = "layout"  # re-lays data out: RoPE's tables flow through it to their multiplies
    PASS_THROUGH = "pass_through"  # passes values on unchanged: softmax probabilities reach P·V through it


CPU_STREAM = "Add"
"""Host-CPU kernel class of an op with no closer calibrated kernel: a streaming op of the same bytes."""
CPU_MATMUL = "MatMul"
"""Host-CPU kernel class timed from the calibrated matmul curves rather than a bytes curve."""
CPU_GELU_TANH = "GeluTanh"
"""Host-CPU kernel class of a tanh-approximated GELU (FastGelu; Gelu with ``approximate="tanh"``)."""
CPU_TRANSPOSE_2D = "Transpose2D"
"""Host-CPU kernel class of a Transpose that moves the innermost axis (an element-wise gather)."""
CPU_KERNELS = (
    CPU_STREAM,
    "Tanh",
    "Erf",
    "Gelu",
    CPU_GELU_TANH,
    "Softmax",
    "ReduceMean",
    "Transpose",
    CPU_TRANSPOSE_2D,
    "LayerNormalization",
)
"""The host-CPU kernel classes `execute.calibrate` measures (bytes -> seconds curves), in the order
it measures them: every registered `OpTraits.cpu_class` is one of them or `CPU_MATMUL`."""
CPU_KERNEL_FALLBACK = {CPU_GELU_TANH: "Gelu", "Gelu": "Erf", "Erf": "Tanh", CPU_TRANSPOSE_2D: "Transpose"}
"""Where a kernel class a calibration lacks (older or quick files) borrows its curve from."""

_BACKWARD_OF_CLASS = {
    OpClass.CONTRACTION: Backward.CONTRACTION,
    OpClass.VECTOR: Backward.VECTOR,
    OpClass.DATA_MOVEMENT: Backward.MOVE,
    OpClass.SHAPE: Backward.NONE,
}
_SAVES_OF_BACKWARD = {
    Backward.CONTRACTION: Saves.OPERANDS,
    Backward.VECTOR: Saves.INPUTS,
    Backward.MOVE: Saves.NOTHING,
    Backward.NONE: Saves.NOTHING,
    Backward.SCATTER_ADD: Saves.NOTHING,
}


class OpTraits(NamedTuple):
    """Everything the passes, lowerings and the host predictor need to know about an op type.

    One record per registered op, written by its `cost_rule` (or `op_traits_only`)
    registration; `op_traits` returns `UNKNOWN_OP` for an op nobody registered. (A NamedTuple,
    like `CostRule`: built at import without the code a dataclass generates, ~1 ms each.)
    """

    op_class: OpClass | None = None
    """Kind of work; None for an op the registry does not know."""
    shape_only: bool = False
    """No target does work for it: it reads only metadata (Shape, Size), is a view of its
    input (Reshape, Squeeze, Unsqueeze, Flatten, Identity, inference Dropout) or a constant
    materialised at load (Constant). Its Cost still records the bytes ONNX semantics move."""
    folds_on_weights: bool = False
    """A layout op that a compiler applies once, at compile time, when every input is stored."""
    strided_view: bool = False
    """Its output is its input read with other strides (Transpose): a kernel that takes strided
    operands (a fused attention kernel's Q, K, V and output) reads or writes it in place."""
    keeps_fp32: bool = False
    """Computes and writes fp32 under mixed precision (softmax, normalisations, reductions, ...)."""
    cpu_class: str = CPU_STREAM
    """The host-CPU predictor's calibrated kernel class (`CPU_MATMUL`: the matmul curves)."""
    backward: Backward = Backward.VECTOR
    """The training pass's backward rule."""
    keeps_values: bool = False
    """Output holds the input's values, only re-shaped or re-typed (token ids stay token ids)."""
    identity_when_unchanged: bool = False
    """Its output is its input whenever the output's type (shape and dtype) is the input's: a Cast to
    the input's dtype, a Slice or an Expand to the input's whole shape. Compilers remove such a node
    (onnxruntime's level-1 CastElimination, EliminateSlice, ExpandElimination); the cost pass marks it
    `meta.ELIMINATED` (passes/passes.py, ``_no_op``)."""
    has_cost_rule: bool = False
    """A cost rule is registered; without one the cost pass gives the node a bytes-only estimate
    (`estimate_cost`, labelled `ESTIMATED_NOTE`)."""
    saves: Saves = Saves.INPUTS
    """What autograd keeps of it for the backward pass; defaults to the backward rule's
    (contraction: operands, vector: inputs, move/none/scatter-add: nothing)."""
    roles: frozenset[Role] = frozenset()
    """The module-role classes it signals to the report (`dabench_ir.report.roles`)."""
    row_reductions: int = 0
    """Dependent reductions along a row it needs, one after the other (layer norm 2: mean, then
    variance; RMS norm, softmax, a Reduce* and a loss 1): the WSE lowering's reduction latency."""
    nonlinear: bool = False
    """Runs as a nonlinear activation-function kernel (GELU, tanh, sigmoid, ReLU, ...; the WSE's nlin)."""
    loss: bool = False
    """A loss over the logits (after the LM head, the WSE runs it as its loss kernel)."""
    output_shape_input: int | None = None
    """The input that holds the output's shape (Reshape, Expand): a microbenchmark feeds it the
    output's static shape."""
    index_input: int | None = None
    """The input that holds indices (Gather*): a microbenchmark may feed zeros, which are valid."""
    reads_quantised_weights: bool = False
    """Its weights are integers with scales (MatMulNBits, MatMulInteger, QLinearMatMul, a weight's
    DequantizeLinear): a model of such ops is for inference; a training step has no rule for them."""
    reads_metadata_only: bool = False
    """Its output is its input's shape, never its data (Shape, Size): a value computed through it is not
    computed from the tensor behind it (`dabench_ir.study.pipelines.declare_weights`)."""
    gelu_form: str | None = None
    """The GELU it computes or is part of: ``erf`` (exact), ``tanh`` (approximated) or ``sigmoid``
    (x·sigmoid(1.702x)); a Gelu's ``approximate="tanh"`` attribute makes it ``tanh``
    (`dabench_ir.study.functions`: a fusion that changes the form changes the function)."""
    makes_causal_mask: bool = False
    """An attention mask made by it is causal: a triangle of the score matrix (Trilu, ``torch.triu``) or
    key positions compared with query positions (Less, Greater, ...: ``kv_idx <= q_idx``) (`passes.training.causal_shares`)."""
    output_types: Callable[[Any, list[Any]], list[Any]] | None = None
    """Output (shape, elem type) from the inputs' for an op ONNX shape inference does not know
    (onnxruntime contrib ops; `frontends.contrib_types.complete_contrib_types` calls it)."""


class ShapeUnknownError(Exception):
    """A type the rule needs is not known (shape inference could not tell)."""


UNKNOWN_OP = OpTraits()
"""Traits of an op no registration names: no class, no special treatment anywhere, a
streaming kernel on the host CPU, and the vector backward rule (what the training pass
applied to unclassified nodes). Such a node has no cost rule, so the cost pass estimates it
from its bytes (`estimate_cost`)."""


class CostRule(NamedTuple):
    fn: Callable[[OpView], Cost]
    op_class: OpClass
    params: frozenset[int]  # input indices that are shape parameters (not data, not costed)
    custom_bytes: bool  # the rule returns bytes too
    traits: OpTraits = UNKNOWN_OP


_RULES: dict[tuple[str, str], CostRule] = {}
_TRAITS: dict[tuple[str, str], OpTraits] = {}
_ONNX_DOMAINS = ("", "ai.onnx")


def _traits(
    op_class: OpClass | None,
    has_rule: bool,
    backward: Backward | None = None,
    saves: Saves | None = None,
    roles: Iterable[Role] = (),
    cpu_class: str = CPU_STREAM,
    **flags: Any,
) -> OpTraits:
    """The `OpTraits` a registration declares: ``backward`` defaults to the rule of ``op_class``,
    ``saves`` to that of ``backward``; ``flags`` are the other fields by name (a wrong name raises)."""
    if backward is None:
        backward = _BACKWARD_OF_CLASS[op_class] if op_class is not None else UNKNOWN_OP.backward
    if saves is None:
        saves = _SAVES_OF_BACKWARD[backward]
    if cpu_class != CPU_MATMUL and cpu_class not in CPU_KERNELS:
        raise ValueError(f"cpu_class {cpu_class!r} is not a calibrated host kernel class (CPU_KERNELS)")
    return OpTraits(
        op_class=op_class,
        backward=backward,
        has_cost_rule=has_rule,
        saves=saves,
        roles=frozenset(roles),
        cpu_class=cpu_class,
        **flags,
    )


def cost_rule(
    *op_types: str,
    op_class: OpClass,
    domain: str = "",
    params: Iterable[int] = (),
    custom_bytes: bool = False,
    **traits: Any,
) -> Callable[[Callable[[OpView], Cost]], Callable[[OpView], Cost]]:
    """Register ``fn`` as the cost rule of ``op_types`` in ``domain``, with their `OpTraits`:
    ``traits`` are its fields by name (``keeps_fp32=True``, ``cpu_class="Tanh"``, ``roles=(...)``;
    `op_traits_only` takes the same).

    ``params``: the input indices that are shape parameters (neither data nor costed);
    ``custom_bytes``: the rule counts the bytes moved itself. ``backward`` defaults to the rule
    of ``op_class`` (contraction, vector, move, none) and ``saves`` to that of ``backward``
    (operands, inputs, nothing).
    """
    registered = _traits(op_class, True, **traits)

    def register(fn: Callable[[OpView], Cost]) -> Callable[[OpView], Cost]:
        rule = CostRule(
            fn=fn, op_class=op_class, params=frozenset(params), custom_bytes=custom_bytes, traits=registered
        )
        for op_type in op_types:
            _RULES[(domain, op_type)] = rule
            _TRAITS[(domain, op_type)] = registered
        return fn

    return register


def op_traits_only(*op_types: str, op_class: OpClass | None, domain: str = "", **traits: Any) -> None:
    """Register traits for ops the registry does not cost (their nodes get a bytes-only estimate);
    ``traits`` are `cost_rule`'s (`OpTraits` fields by name: ``roles=``, ``nonlinear=``, ``loss=``, ...)."""
    registered = _traits(op_class, False, **traits)
    for op_type in op_types:
        _TRAITS[(domain, op_type)] = registered


def _key(op_type: str, domain: str) -> tuple[str, str]:
    return ("" if domain in _ONNX_DOMAINS else domain, op_type)


def find_rule(node: Node) -> CostRule | None:
    domain = node.domain  # `_key` written out: find_rule and traits_of run ~10^5 times a point
    return _RULES.get(("" if domain in _ONNX_DOMAINS else domain, node.op_type))


def op_traits(op_type: str, domain: str = "") -> OpTraits:
    """The registered traits of ``op_type`` in ``domain`` ("" and "ai.onnx" are ONNX), else `UNKNOWN_OP`."""
    return _TRAITS.get(_key(op_type, domain), UNKNOWN_OP)


def traits_of(node: Node) -> OpTraits:
    """`op_traits` of a node's op type and domain."""
    domain = node.domain  # `op_traits` written out (see `find_rule`)
    return _TRAITS.get(("" if domain in _ONNX_DOMAINS else domain, node.op_type), UNKNOWN_OP)


def _matches(value: Any, wanted: Any) -> bool:
    """A trait ``value`` matches ``wanted`` when equal; a set-valued trait (``roles``) also when it holds it."""
    return value == wanted or (isinstance(value, frozenset) and not isinstance(wanted, frozenset) and wanted in value)


def ops_with(**wanted: Any) -> frozenset[str]:
    """Qualified names (``op`` or ``domain::op``) of the registered ops whose traits match ``wanted``
    (``ops_with(roles=Role.NORM)``: the ops whose roles include NORM)."""
    return frozenset(
        op if not d else f"{d}::{op}"
        for (d, op), t in _TRAITS.items()
        if all(_matches(getattr(t, k), v) for k, v in wanted.items())
    )


def registered_ops() -> list[str]:
    """Qualified names of the ops that have a cost rule."""
    return sorted(op if not d else f"{d}::{op}" for d, op in _RULES)


class OpView:
    """A node with its value types resolved through the graph's symbol bindings.

    ``sizes``: bytes of the value types already sized, by the type's id, shared by the views of
    one cost pass (a model repeats a few types over all its values; the types and bindings stay
    as they are while the pass runs)."""

    __slots__ = ("graph", "node", "rule", "sizes")

    def __init__(self, node: Node, graph: Graph, rule: CostRule, sizes: dict[int, int] | None = None) -> None:
        self.node = node
        self.graph = graph
        self.rule = rule
        self.sizes = {} if sizes is None else sizes

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    @property
    def n_inputs(self) -> int:
        return sum(1 for name in self.node.inputs if name)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def _value(self, name: str) -> Value:
        value = self.graph.values.get(name)
        if value is None or value.type.shape is None:
            raise ShapeUnknownError(f"shape of {name!r} is unknown (shape inference could not infer it)")
        return value

    def _type(self, name: str) -> TensorType:
        return self._value(name).type.bind(self.graph.bindings)

    def in_type(self, i: int) -> TensorType:
        return self._type(self.node.inputs[i])

    def out_type(self, i: int = 0) -> TensorType:
        return self._type(self.node.outputs[i])

    def in_dims(self, i: int) -> tuple[int, ...]:
        return self.in_type(i).dims(self.graph.bindings)

    def out_dims(self, i: int = 0) -> tuple[int, ...]:
        return self.out_type(i).dims(self.graph.bindings)

    def in_scalar(self, i: int) -> float | None:
        """The number input ``i`` holds when it is a one-element constant (`Value.scalar`), else None."""
        value = self.graph.values.get(self.node.inputs[i]) if self.has_input(i) else None
        return value.scalar if value is not None else None

    def in_numel(self, i: int = 0) -> int:
        return math.prod(self.in_dims(i))

    def out_numel(self, i: int = 0) -> int:
        return math.prod(self.out_dims(i))

    def default_bytes(self) -> Cost:
        """Weights and constants read, activations read (each distinct value once), outputs written."""
        weight, act_in, act_out = self._default_bytes()
        return Cost(weight_bytes=weight, act_bytes_in=act_in, act_bytes_out=act_out)

    def _default_bytes(self) -> tuple[int, int, int]:
        """`default_bytes` as (weight, activations in, activations out)."""
        values, params = self.graph.values, self.rule.params
        weight = act_in = act_out = 0
        seen: set[str] = set()
        for i, name in enumerate(self.node.inputs):
            if not name or i in params or name in seen:
                continue
            seen.add(name)
            value = values.get(name)
            if value is None or value.type.shape is None:
                value = self._value(name)  # raises, naming it
            nbytes = self._nbytes(value.type)
            if value.kind.is_stored:
                weight += nbytes
            else:
                act_in += nbytes
        for name in self.node.outputs:
            if name:
                value = values.get(name)
                if value is None or value.type.shape is None:
                    value = self._value(name)
                act_out += self._nbytes(value.type)
        return weight, act_in, act_out

    def _nbytes(self, t: TensorType) -> int:
        """``t.nbytes`` with the graph's bindings (they resolve the symbols: no bind() needed), sized once per type."""
        nbytes = self.sizes.get(id(t))
        if nbytes is None:
            nbytes = self.sizes[id(t)] = t.nbytes(self.graph.bindings)
        return nbytes

    def cost(self) -> Cost:
        flops = self.rule.fn(self)
        return flops if self.rule.custom_bytes else flops.plus_bytes(*self._default_bytes())


ESTIMATED_NOTE = "estimated: no rule"
"""The label of a node costed by `estimate_cost` (no rule could count it), in every output."""


def estimate_cost(node: Node, graph: Graph) -> Cost | None:
    """A memory-bound lower bound for a node no rule can count: no FLOPs, and the bytes of
    every distinct input it reads (stored values as weight bytes) and output it writes, from
    the tensor types that are known. None when no type of the node is known.

    Placed like any other cost, it takes the time its bytes take on the target's memory:
    never zero, and never more than the node could possibly take at least.
    """
    weight = act_in = act_out = 0
    known = False
    seen: set[str] = set()
    for i, names in enumerate((node.inputs, node.outputs)):
        for name in names:
            value = graph.values.get(name) if name else None
            if value is None or name in seen or value.type.shape is None:
                continue
            seen.add(name)
            try:
                nbytes = value.type.nbytes(graph.bindings)
            except UnboundSymbolError:
                continue
            known = True
            if i == 1:
                act_out += nbytes
            elif value.kind.is_stored:
                weight += nbytes
            else:
                act_in += nbytes
    return Cost(weight_bytes=weight, act_bytes_in=act_in, act_bytes_out=act_out) if known else None


# -- contractions ---------------------------------------------------------------------

_CONTRIB = {"domain": "com.microsoft"}  # an onnxruntime contrib op
_MATMUL_KERNEL = {"op_class": OpClass.CONTRACTION, "cpu_class": CPU_MATMUL}  # timed on the host as a matmul
_MATMUL = {**_MATMUL_KERNEL, "roles": (Role.CONTRACTION,)}  # and a matmul to the report's roles


@cost_rule("MatMul", **_MATMUL)
def matmul(op: OpView) -> Cost:
    """[..., M, K] @ [..., K, N]: 2·K FLOPs per output element (broadcast batch dims included)."""
    a = op.in_dims(0)
    k = a[-1]
    return Cost(contraction_flops=2 * k * op.out_numel())


@cost_rule("MatMulInteger", **_MATMUL, reads_quantised_weights=True)
def matmul_integer(op: OpView) -> Cost:
    """Integer matmul (int32 out): 2·K per output element, plus one zero-point subtraction per
    element of A (input 2 given) and of B (input 3 given)."""
    zero_points = (op.in_numel(0) if op.has_input(2) else 0) + (op.in_numel(1) if op.has_input(3) else 0)
    return Cost(contraction_flops=2 * op.in_dims(0)[-1] * op.out_numel(), vector_flops=zero_points)


@cost_rule("QLinearMatMul", **_MATMUL, reads_quantised_weights=True)
def qlinear_matmul(op: OpView) -> Cost:
    """Quantized matmul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp): 2·K per output
    element in integers, one zero-point subtraction per element of A and of B, and a requantize
    per output (multiply by a_scale·b_scale/y_scale, add y_zp; round and saturate go with it)."""
    out = op.out_numel()
    return Cost(
        contraction_flops=2 * op.in_dims(0)[-1] * out,
        vector_flops=op.in_numel(0) + op.in_numel(3) + 2 * out,
    )


@cost_rule("MatMulNBits", **_CONTRIB, **_MATMUL, output_types=_types.matmul_nbits, reads_quantised_weights=True)
def matmul_nbits(op: OpView) -> Cost:
    """A [..., K] @ dequantized B [N, K] (block-quantized, ``bits`` per weight, read packed): 2·K
    per output element, 2 per weight element to dequantize ((q − zp)·scale, done on the fly per
    call), and the bias add when input 5 is given."""
    k, n = int(op.attr("K")), int(op.attr("N"))
    out = op.out_numel()
    return Cost(contraction_flops=2 * k * out, vector_flops=2 * k * n + (out if op.has_input(5) else 0))


@cost_rule("FusedMatMul", **_CONTRIB, **_MATMUL, output_types=_types.fused_matmul)
def fused_matmul(op: OpView) -> Cost:
    """2·K FLOPs per output element, plus the alpha scaling when alpha ≠ 1."""
    a = op.in_dims(0)
    k = a[-2] if op.attr("transA", 0) and len(a) >= 2 else a[-1]
    scale = 0 if op.attr("alpha", 1.0) == 1.0 else op.out_numel()
    return Cost(contraction_flops=2 * k * op.out_numel(), vector_flops=scale)


@cost_rule("Gemm", **_MATMUL)
def gemm(op: OpView) -> Cost:
    """alpha·A'B' + beta·C: 2·K per output, plus alpha/beta scaling and the C add."""
    a = op.in_dims(0)
    k = a[0] if op.attr("transA", 0) else a[-1]
    out = op.out_numel()
    vector = 0
    if op.attr("alpha", 1.0) != 1.0:
        vector += out
    if op.has_input(2):
        vector += out * (2 if op.attr("beta", 1.0) != 1.0 else 1)
    return Cost(contraction_flops=2 * k * out, vector_flops=vector)


@cost_rule("Conv", op_class=OpClass.CONTRACTION, roles=(Role.CONTRACTION,))
@cost_rule("ConvInteger", op_class=OpClass.CONTRACTION)
def conv(op: OpView) -> Cost:
    """2·(C_in/group)·prod(kernel) per output element, plus the bias add."""
    w = op.in_dims(1)  # [C_out, C_in/group, k...]
    per_out = math.prod(w[1:])
    out = op.out_numel()
    return Cost(contraction_flops=2 * per_out * out, vector_flops=out if op.has_input(2) else 0)


@cost_rule("ConvTranspose", op_class=OpClass.CONTRACTION)
def conv_transpose(op: OpView) -> Cost:
    """Every input element scatters into (C_out/group)·prod(kernel) outputs."""
    w = op.in_dims(1)  # [C_in, C_out/group, k...]
    per_in = math.prod(w[1:])
    bias = op.out_numel() if op.has_input(2) else 0
    return Cost(contraction_flops=2 * per_in * op.in_numel(0), vector_flops=bias)


_EINSUM_TERM = re.compile(r"[a-zA-Z]|\.\.\.")


@cost_rule("Einsum", op_class=OpClass.CONTRACTION, roles=(Role.CONTRACTION,))
def einsum(op: OpView) -> Cost:
    """Product of every distinct index size; ×2 when an index is summed away."""
    equation = str(op.attr("equation")).replace(" ", "")
    lhs, _, rhs = equation.partition("->")
    sizes: dict[str, int] = {}
    for i, term in enumerate(lhs.split(",")):
        labels = _EINSUM_TERM.findall(term)
        dims = op.in_dims(i)
        if "..." in labels:
            at = labels.index("...")
            n_ell = len(dims) - (len(labels) - 1)
            labels = labels[:at] + [f"...{j}" for j in range(n_ell)] + labels[at + 1 :]
        for label, size in zip(labels, dims, strict=False):
            sizes[label] = max(sizes.get(label, 1), size)
    kept = set(_EINSUM_TERM.findall(rhs)) if "->" in equation else None
    iterations = math.prod(sizes.values())
    reduces = kept is not None and any(lbl not in kept and not lbl.startswith("...") for lbl in sizes)
    if reduces:
        return Cost(contraction_flops=2 * iterations)
    return Cost(vector_flops=iterations if op.n_inputs > 1 else 0)


# -- fused attention (onnxruntime contrib ops) ---------------------------------------------
#
# A fused attention kernel computes Q·Kᵀ, scales, masks, softmaxes and multiplies by V
# without writing the S×T score matrix to memory: its bytes are its inputs and outputs (the
# registry's default), never the scores. Its FLOPs are those of the unfused subgraph:
# 2·H per score for Q·Kᵀ and 2·Hv per score for P·V, 1 per score for the scale, 4 vector +
# 1 exp per score for the softmax (as `Softmax`), and 1 per score per mask or bias added.


_ATTENTION = {**_CONTRIB, **_MATMUL_KERNEL, "roles": (Role.ATTENTION,)}  # a fused attention kernel


def _attention_flops(batch: int, heads: int, s: int, t: int, h_qk: int, h_v: int, masks: int) -> Cost:
    """Scores, scale, ``masks`` additive masks/biases, softmax and P·V for ``heads`` heads."""
    scores = batch * heads * s * t
    return Cost(
        contraction_flops=2 * scores * (h_qk + h_v),
        vector_flops=scores * (1 + 4 + masks),
        special_ops=scores,
    )


@cost_rule("Attention", **_ATTENTION, params=(6,), output_types=_types.attention)
def ms_attention(op: OpView) -> Cost:
    """Packed-projection attention (input [B,S,D], weights [D, Dq+Dk+Dv], bias, mask_index, past,
    attention_bias): the QKV projection (2·D per projected element, plus the bias add), then
    fused attention over T = past + S keys (causal masking when ``unidirectional``); the S×T
    scores are not written."""
    b, s, d = op.in_dims(0)
    width = op.in_dims(1)[-1]
    sizes = op.attr("qkv_hidden_sizes") or [width // 3] * 3
    heads = int(op.attr("num_heads"))
    past = op.in_dims(4)[3] if op.has_input(4) else 0
    masks = sum(1 for i in (3, 5) if op.has_input(i)) + int(bool(op.attr("unidirectional", 0)))
    proj = Cost(contraction_flops=2 * d * b * s * width, vector_flops=b * s * width if op.has_input(2) else 0)
    return proj + _attention_flops(b, heads, s, past + s, sizes[0] // heads, sizes[2] // heads, masks)


def _kv_length(op: OpView, key_index: int, past_index: int) -> int:
    """Keys attended: the present key's length when output 1 is typed, else past + new keys."""
    if len(op.node.outputs) > 1 and op.node.outputs[1]:
        try:
            return op.out_dims(1)[2]
        except ShapeUnknownError:
            pass
    past = op.in_dims(past_index)[2] if op.has_input(past_index) else 0
    if not op.has_input(key_index):  # packed QKV in the query: keys are the query's tokens
        return past + op.in_dims(0)[1]
    key = op.in_dims(key_index)
    return past + (key[2] if len(key) == 4 else key[1])  # [B,N,L,H] or [B,L,D] / [B,L,N,2,H]


@cost_rule("MultiHeadAttention", **_ATTENTION, output_types=_types.mha)
def ms_multi_head_attention(op: OpView) -> Cost:
    """query [B,S,D] (or packed [B,S,N,3,H]), key/value [B,L,D] or [B,N,L,H], optional bias
    (added to Q, K and V), key_padding_mask, attention_bias, past key/value: fused attention over
    T = past + L keys, ``num_heads`` heads; the S×T scores are not written."""
    q = op.in_dims(0)
    heads = int(op.attr("num_heads"))
    b, s = q[0], q[1]
    out = op.out_dims(0)
    h_v = out[-1] // heads
    h_qk = q[-1] if len(q) == 5 else q[-1] // heads
    t = _kv_length(op, 1, 6)
    masks = sum(1 for i in (4, 5) if op.has_input(i)) + int(bool(op.attr("unidirectional", 0)))
    bias = op.in_numel(3) * b * s if op.has_input(3) else 0
    return _attention_flops(b, heads, s, t, h_qk, h_v, masks) + Cost(vector_flops=bias)


@cost_rule("GroupQueryAttention", **_ATTENTION, params=(5, 6), output_types=_types.gqa)
def ms_group_query_attention(op: OpView) -> Cost:
    """query [B,S,N·H] (or packed QKV), key/value [B,S,Nkv·H], past key/value [B,Nkv,P,H]: causal
    attention of ``num_heads`` query heads over T keys (the present key's length), the K/V heads
    shared by groups (no K/V copies counted), the causal mask one op per score, and rotary
    embedding of Q and K (3 per rotated element) when ``do_rotary``; the scores are not written."""
    b, s, _width = op.in_dims(0)
    heads, kv_heads = int(op.attr("num_heads")), int(op.attr("kv_num_heads"))
    h = op.out_dims(0)[-1] // heads
    t = _kv_length(op, 1, 3)
    cost = _attention_flops(b, heads, s, t, h, h, 1)
    if op.attr("do_rotary", 0):
        rotated = b * s * (heads + kv_heads) * h
        cost = cost + Cost(vector_flops=3 * rotated)
    return cost


# a rotary embedding: counts its own bytes (it reads only the cos/sin rows it gathers)
_ROTARY = {"op_class": OpClass.VECTOR, "custom_bytes": True, "roles": (Role.ROTARY,)}


@cost_rule("RotaryEmbedding", **_CONTRIB, **_ROTARY, params=(1,), output_types=_types.same)
@cost_rule("RotaryEmbedding", **_ROTARY, params=(3,))
def rotary_embedding(op: OpView) -> Cost:
    """x·cos + rotate(x)·sin over the rotated part (``rotary_embedding_dim``, else the whole head):
    2 multiplies and 1 add or subtract per rotated element, the rest copied. Reads the input, the
    position ids and only the cos/sin rows it gathers; writes the output."""
    dims = op.in_dims(0)
    n = math.prod(dims)
    cos = op.in_dims(2 if op.node.domain == "com.microsoft" else 1)
    rotated_per_token = 2 * cos[-1]
    heads = int(op.attr("num_heads", 0) or 0)
    head = dims[-1] if len(dims) == 4 else dims[-1] // heads if heads else rotated_per_token
    rotated = n * min(rotated_per_token, head) // head
    itemsize = op.in_type(0).dtype.itemsize
    tokens = n // head
    pos = op.in_type(1).nbytes(op.graph.bindings) if op.node.domain == "com.microsoft" and op.has_input(1) else 0
    gathered = tokens * rotated_per_token * op.in_type(2 if op.node.domain == "com.microsoft" else 1).dtype.itemsize
    return Cost(vector_flops=3 * rotated, act_bytes_in=n * itemsize + pos + gathered, act_bytes_out=n * itemsize)


@cost_rule("FusedGemm", **_CONTRIB, **_MATMUL_KERNEL, output_types=_types.fused_gemm)
def fused_gemm(op: OpView) -> Cost:
    """Gemm followed by its fused ``activation`` (Relu, LeakyRelu, Sigmoid, Tanh, ...): the Gemm's
    count plus the activation's per output element (1 vector; Sigmoid/Tanh add 1 special)."""
    out = op.out_numel()
    act = str(op.attr("activation", "") or "")
    special = out if act in ("Sigmoid", "Tanh", "HardSigmoid") else 0
    return gemm(op) + Cost(vector_flops=out if act else 0, special_ops=special)


# -- elementwise -----------------------------------------------------------------------


def _elementwise(op_type: str, vector: int, special: int, **traits: Any) -> None:
    """Register ``op_type``: ``vector`` vector FLOPs and ``special`` special ops per output element."""

    def rule(op: OpView) -> Cost:
        n = op.out_numel()
        return Cost(vector_flops=vector * n, special_ops=special * n)

    rule.__doc__ = f"{vector} vector FLOP(s) and {special} special op(s) per output element."
    cost_rule(op_type, op_class=OpClass.VECTOR, **traits)(rule)


_FP32 = {"keeps_fp32": True}  # under mixed precision these compute and write fp32
_TANH = {"cpu_class": "Tanh"}  # timed on the host CPU like a transcendental of the same bytes
_ACT = {"roles": (Role.ACTIVATION,)}  # an activation function (report role "activation")
_NLIN = {**_ACT, "nonlinear": True}  # and a nonlinear kernel of its own (the WSE's nlin)
_EW = (Role.ELEMENTWISE,)  # element-wise arithmetic: part of the activation inside an MLP module
_NORM_PART = (Role.ELEMENTWISE, Role.NORM_PART)  # also a piece of a decomposed norm elsewhere
_KEEPS_OUT = {"saves": Saves.OUTPUT}  # autograd keeps the output (its derivative is a function of it)
_KEEPS_NONE = {"saves": Saves.NOTHING}  # autograd keeps nothing (a constant derivative)

# arithmetic
_elementwise("Add", 1, 0, roles=_EW, **_KEEPS_NONE)
_elementwise("Sub", 1, 0, roles=_EW, **_KEEPS_NONE)
_elementwise("Mul", 1, 0, roles=_EW)
_elementwise("Div", 1, 0, roles=_EW)
_elementwise("Neg", 1, 0, roles=(*_EW, Role.ROTARY), **_KEEPS_NONE)  # rotate-half
_elementwise("Abs", 1, 0)
_elementwise("Reciprocal", 1, 0, roles=(Role.NORM_PART,), **_KEEPS_OUT)
_elementwise("Mod", 1, 0)
_elementwise("Floor", 1, 0)
_elementwise("Ceil", 1, 0)
_elementwise("Round", 1, 0)
_elementwise("Sign", 1, 0)
_elementwise("BitShift", 1, 0)
_elementwise("BitwiseAnd", 1, 0)
_elementwise("BitwiseOr", 1, 0)
_elementwise("BitwiseXor", 1, 0)
_elementwise("BitwiseNot", 1, 0)
# comparisons and selection (an order comparison of positions makes a causal mask)
_ORDERS = {"makes_causal_mask": True}
_elementwise("Equal", 1, 0)
_elementwise("Less", 1, 0, **_ORDERS)
_elementwise("LessOrEqual", 1, 0, **_ORDERS)
_elementwise("Greater", 1, 0, **_ORDERS)
_elementwise("GreaterOrEqual", 1, 0, **_ORDERS)
_elementwise("And", 1, 0)
_elementwise("Or", 1, 0)
_elementwise("Xor", 1, 0)
_elementwise("Not", 1, 0)
_elementwise("Where", 1, 0, roles=_EW, **_KEEPS_NONE)
_elementwise("IsNaN", 1, 0)
_elementwise("IsInf", 1, 0)
# activations
_elementwise("Relu", 1, 0, **_NLIN)
_elementwise("LeakyRelu", 2, 0, **_ACT)  # compare, multiply
_elementwise("PRelu", 2, 0)
_elementwise("Clip", 2, 0)  # max, min
_elementwise("ThresholdedRelu", 1, 0)
_elementwise("HardSigmoid", 3, 0, **_TANH, **_NLIN)  # mul, add, clip
_elementwise("HardSwish", 4, 0, **_ACT)
_elementwise("Shrink", 2, 0)
_elementwise("Sigmoid", 2, 1, **_TANH, **_NLIN, **_KEEPS_OUT)  # exp(-x), add 1, divide
_elementwise("Tanh", 0, 1, **_TANH, **_NLIN, **_KEEPS_OUT, gelu_form="tanh")  # a decomposed tanh GELU's
_elementwise("Erf", 0, 1, **_FP32, cpu_class="Erf", **_NLIN, gelu_form="erf")  # a decomposed exact GELU's
_elementwise("Exp", 0, 1, **_FP32, **_TANH, roles=_EW, **_KEEPS_OUT)
_elementwise("Log", 0, 1, **_FP32, **_TANH)
_elementwise("Sqrt", 0, 1, **_FP32, roles=_NORM_PART, **_KEEPS_OUT)


def power_multiplies(exponent: float | None) -> int | None:
    """The multiplies ``x ** exponent`` takes by repeated squaring (x**2: 1, x**3: 2, x**4: 2), as
    compilers expand a small whole power (LLVM's powi, MLIR's math.fpowi); None for any other
    exponent (a fraction, a negative or a large one, or an unknown), which is exp(y log x)."""
    if exponent is None or exponent != int(exponent) or not 2 <= exponent <= 16:
        return None
    n = int(exponent)
    return n.bit_length() - 1 + bin(n).count("1") - 1


@cost_rule("Pow", op_class=OpClass.VECTOR, **_FP32, roles=_NORM_PART)
def _pow(op: OpView) -> Cost:
    """A small whole exponent: its multiplies per element (`power_multiplies`: x ** 2 one, x ** 3
    two, as the linalg path counts math.fpowi); any other or unknown exponent: exp(y log x), one
    special op per element (a transcendental evaluation)."""
    n = op.out_numel()
    multiplies = power_multiplies(op.in_scalar(1))
    return Cost(vector_flops=multiplies * n) if multiplies else Cost(special_ops=n)


_elementwise("Sin", 0, 1, **_TANH, roles=(Role.ROTARY_TABLE,))
_elementwise("Cos", 0, 1, **_TANH, roles=(Role.ROTARY_TABLE,))
_elementwise("Tan", 0, 1)
_elementwise("Asin", 0, 1)
_elementwise("Acos", 0, 1)
_elementwise("Atan", 0, 1)
_elementwise("Sinh", 0, 1)
_elementwise("Cosh", 0, 1)
_elementwise("Asinh", 0, 1)
_elementwise("Acosh", 0, 1)
_elementwise("Atanh", 0, 1)
_elementwise("Softplus", 1, 2, **_TANH, **_ACT)  # log(1 + exp(x))
_elementwise("Softsign", 2, 0)  # x / (1 + |x|)
_elementwise("Elu", 2, 1, **_ACT)
_elementwise("Selu", 3, 1, **_ACT)
_elementwise("Celu", 3, 1)
_elementwise("Mish", 2, 3, **_ACT)  # x·tanh(softplus(x))
_elementwise("Swish", 3, 1)  # x·sigmoid(x)


@cost_rule("Gelu", op_class=OpClass.VECTOR, cpu_class="Gelu", **_NLIN, gelu_form="erf")
def gelu(op: OpView) -> Cost:
    """Exact GELU: 4 vector + 1 erf per element; tanh approximation: 7 vector + 1 tanh."""
    n = op.out_numel()
    vector = 7 if op.attr("approximate", "none") == "tanh" else 4
    return Cost(vector_flops=vector * n, special_ops=n)


# an onnxruntime activation kernel: its output typed as its input
_CONTRIB_ACT = {**_CONTRIB, "op_class": OpClass.VECTOR, **_NLIN, "output_types": _types.same}


@cost_rule("Gelu", "BiasGelu", **_CONTRIB_ACT, cpu_class="Gelu", gelu_form="erf")
@cost_rule("FastGelu", **_CONTRIB_ACT, cpu_class=CPU_GELU_TANH, gelu_form="tanh")
def ms_gelu(op: OpView) -> Cost:
    """Exact (Gelu, BiasGelu) or tanh-approximated (FastGelu) GELU, plus the bias add when given."""
    n = op.out_numel()
    bias = n if op.n_inputs > 1 else 0
    vector = 7 if op.node.op_type == "FastGelu" else 4
    return Cost(vector_flops=vector * n + bias, special_ops=n)


@cost_rule("QuickGelu", **_CONTRIB_ACT, **_TANH, gelu_form="sigmoid")
def quick_gelu(op: OpView) -> Cost:
    """x·sigmoid(alpha·x): the sigmoid (2 vector + 1 exp), the product, and the alpha scaling
    when alpha ≠ 1 (onnxruntime fuses SiLU, x·sigmoid(x), into QuickGelu with alpha 1)."""
    n = op.out_numel()
    scale = n if float(op.attr("alpha", 1.702)) != 1.0 else 0
    return Cost(vector_flops=3 * n + scale, special_ops=n)


@cost_rule("BiasAdd", domain="com.microsoft", op_class=OpClass.VECTOR, output_types=_types.same)
def bias_add(op: OpView) -> Cost:
    """X + bias + skip: 2 adds per output element."""
    return Cost(vector_flops=2 * op.out_numel())


@cost_rule("Max", "Min", op_class=OpClass.VECTOR, roles=_EW)
@cost_rule("Sum", "Mean", op_class=OpClass.VECTOR)
def variadic(op: OpView) -> Cost:
    """(inputs − 1) per element; Mean adds one division per element."""
    n = op.out_numel()
    vector = max(op.n_inputs - 1, 0) * n + (n if op.node.op_type == "Mean" else 0)
    return Cost(vector_flops=vector)


@cost_rule("QuantizeLinear", "DequantizeLinear", op_class=OpClass.VECTOR)
@cost_rule("QuantizeLinear", domain="com.microsoft", op_class=OpClass.VECTOR, output_types=_types.quantize)
@cost_rule("DequantizeLinear", domain="com.microsoft", op_class=OpClass.VECTOR, output_types=_types.dequantize)
def quantize(op: OpView) -> Cost:
    """Per element: the scale (x/scale or x·scale) and, when the zero point (input 2) is given,
    its add or subtract; rounding and saturation are part of the type conversion."""
    return Cost(vector_flops=(2 if op.has_input(2) else 1) * op.out_numel())


@cost_rule("DynamicQuantizeLinear", op_class=OpClass.VECTOR)
def dynamic_quantize(op: OpView) -> Cost:
    """uint8 quantization with a scale from the data: min and max over x (2 per element), then
    x/scale + zero point (2 per element); the scalar scale and zero point are a few ops more."""
    return Cost(vector_flops=4 * op.in_numel(0) + 6)


# -- normalisation and softmax ---------------------------------------------------------


def _rows(dims: tuple[int, ...], axis: int) -> tuple[int, int]:
    """(rows, row length) when reducing over dims[axis:]."""
    axis = axis % len(dims) if dims else 0
    return math.prod(dims[:axis]), math.prod(dims[axis:])


@cost_rule(
    "Softmax",
    op_class=OpClass.VECTOR,
    **_FP32,
    cpu_class="Softmax",
    **_KEEPS_OUT,
    row_reductions=1,
    roles=(Role.SOFTMAX,),
)
@cost_rule(
    "LogSoftmax", op_class=OpClass.VECTOR, **_FP32, cpu_class="Softmax", **_KEEPS_OUT, row_reductions=1, loss=True
)
def softmax(op: OpView) -> Cost:
    """Per element: max, subtract, exp, sum, divide (LogSoftmax: subtract, plus a log per row).

    Opset ≥ 13 normalises over one axis; the count per element is the same either way.
    """
    dims = op.in_dims(0)
    n = math.prod(dims)
    if op.node.op_type == "LogSoftmax":
        axis = op.attr("axis", -1)
        rows = n // dims[axis] if dims else 1
        return Cost(vector_flops=4 * n, special_ops=n + rows)
    return Cost(vector_flops=4 * n, special_ops=n)


# a fused layer or RMS normalisation over the last axis: fp32, timed as the host's layer norm,
# autograd keeps its input and per-row statistics
_NORM = {
    "op_class": OpClass.VECTOR,
    "keeps_fp32": True,
    "cpu_class": "LayerNormalization",
    "roles": (Role.NORM,),
    "saves": Saves.INPUT_AND_STATS,
}
_LAYER_NORM = {**_NORM, "row_reductions": 2}  # mean, then variance
_RMS_NORM = {**_NORM, "row_reductions": 1}  # mean square


def _layer_norm_flops(n: int, rows: int, beta: bool) -> Cost:
    """LayerNormalization of ``n`` elements in ``rows`` rows (``beta``: with the bias)."""
    return Cost(vector_flops=(7 if beta else 6) * n + 3 * rows, special_ops=rows)


def _rms_norm_flops(n: int, rows: int) -> Cost:
    """RMS normalisation of ``n`` elements in ``rows`` rows."""
    return Cost(vector_flops=4 * n + 2 * rows, special_ops=rows)


def _norm_rows(op: OpView) -> tuple[int, int]:
    """(elements, rows) of a normalisation over input 0 from its ``axis`` on."""
    dims = op.in_dims(0)
    return math.prod(dims), _rows(dims, op.attr("axis", -1))[0]


@cost_rule("LayerNormalization", **_LAYER_NORM)
def layer_norm(op: OpView) -> Cost:
    """Per element: sum, subtract mean, square, sum, normalise, scale (+ bias) = 6 (7);
    per row: mean and variance divisions, add epsilon (3 vector) and one rsqrt."""
    return _layer_norm_flops(*_norm_rows(op), beta=op.has_input(2))


@cost_rule("RMSNormalization", **_RMS_NORM)
def rms_norm(op: OpView) -> Cost:
    """Per element: square, sum, normalise, scale = 4; per row: divide, add epsilon, rsqrt."""
    return _rms_norm_flops(*_norm_rows(op))


@cost_rule("SimplifiedLayerNormalization", **_CONTRIB, **_RMS_NORM, output_types=_types.simplified_norm)
@cost_rule("SimplifiedLayerNormalization", **_RMS_NORM, output_types=_types.simplified_norm)
def simplified_layer_norm(op: OpView) -> Cost:
    """As RMSNormalization."""
    return rms_norm(op)


@cost_rule("SkipLayerNormalization", **_CONTRIB, **_LAYER_NORM, output_types=_types.skip_norm)
@cost_rule("SkipSimplifiedLayerNormalization", **_CONTRIB, **_RMS_NORM, output_types=_types.skip_norm)
def skip_layer_norm(op: OpView) -> Cost:
    """input + skip (+ bias), then LayerNormalization (with beta when given) or RMS normalisation
    over the last axis. Inputs: SkipLayerNormalization (input, skip, gamma, beta, bias),
    SkipSimplifiedLayerNormalization (input, skip, gamma, bias)."""
    dims = op.in_dims(0)
    n = math.prod(dims)
    rows = n // dims[-1] if dims else 1
    simplified = "Simplified" in op.node.op_type
    adds = n * (2 if op.has_input(3 if simplified else 4) else 1)
    norm = _rms_norm_flops(n, rows) if simplified else _layer_norm_flops(n, rows, beta=op.has_input(3))
    return norm + Cost(vector_flops=adds)


@cost_rule("BatchNormalization", op_class=OpClass.VECTOR, **_FP32)
def batch_norm(op: OpView) -> Cost:
    """Inference form: subtract mean, divide by sqrt(var + eps), scale, shift = 4 per element."""
    channels = op.in_dims(1)[0]
    return Cost(vector_flops=4 * op.in_numel(0) + channels, special_ops=channels)


@cost_rule("GroupNormalization", op_class=OpClass.VECTOR, **_FP32, roles=(Role.NORM,))
@cost_rule("InstanceNormalization", op_class=OpClass.VECTOR, **_FP32)
@cost_rule("MeanVarianceNormalization", op_class=OpClass.VECTOR)
def instance_norm(op: OpView) -> Cost:
    """Statistics per group of elements, as LayerNormalization counts them."""
    dims = op.in_dims(0)
    n = math.prod(dims)
    if op.node.op_type == "GroupNormalization":
        groups = dims[0] * int(op.attr("num_groups", 1))
    elif op.node.op_type == "InstanceNormalization":
        groups = dims[0] * dims[1]
    else:
        axes = op.attr("axes", [0, 2, 3])
        groups = n // math.prod(dims[a] for a in axes)
    return Cost(vector_flops=7 * n + 3 * groups, special_ops=groups)


@cost_rule("LpNormalization", op_class=OpClass.VECTOR)
def lp_norm(op: OpView) -> Cost:
    """Per element: the p-th power of abs(x), sum, divide = 3; one root per row."""
    dims = op.in_dims(0)
    n = math.prod(dims)
    rows = n // dims[op.attr("axis", -1)]
    return Cost(vector_flops=3 * n, special_ops=rows)


# -- reductions ------------------------------------------------------------------------


def _reduction(op_type: str, per_in: int, special_in: int, per_out: int, special_out: int, **traits: Any) -> None:
    """Register ``op_type``: vector and special counts per input element and per output element."""

    def rule(op: OpView) -> Cost:
        n_in, n_out = op.in_numel(0), op.out_numel()
        return Cost(vector_flops=per_in * n_in + per_out * n_out, special_ops=special_in * n_in + special_out * n_out)

    rule.__doc__ = (
        f"{per_in} vector and {special_in} special per input element, "
        f"{per_out} vector and {special_out} special per output element."
    )
    row_reductions = 1 if op_type.startswith("Reduce") else 0  # a Reduce*: one reduction along the row
    cost_rule(op_type, op_class=OpClass.VECTOR, params=(1,), row_reductions=row_reductions, **traits)(rule)


_REDUCE = {"cpu_class": "ReduceMean"}

_reduction("ReduceSum", 1, 0, 0, 0, **_FP32, **_REDUCE, **_KEEPS_NONE)
_reduction("ReduceMax", 1, 0, 0, 0, **_REDUCE)
_reduction("ReduceMin", 1, 0, 0, 0, **_REDUCE)
_reduction("ReduceProd", 1, 0, 0, 0)
_reduction("ReduceMean", 1, 0, 1, 0, **_FP32, **_REDUCE, **_KEEPS_NONE, roles=(Role.NORM_PART,))
_reduction("ReduceL1", 2, 0, 0, 0)
_reduction("ReduceL2", 2, 0, 0, 1, **_FP32, **_REDUCE)
_reduction("ReduceSumSquare", 2, 0, 0, 0, **_FP32, **_REDUCE)
_reduction("ReduceLogSum", 1, 0, 0, 1)
_reduction("ReduceLogSumExp", 1, 1, 0, 1, **_FP32)
_reduction("ArgMax", 1, 0, 0, 0)
_reduction("ArgMin", 1, 0, 0, 0)


@cost_rule("CumSum", op_class=OpClass.VECTOR, params=(1,), **_FP32)
def cumsum(op: OpView) -> Cost:
    """One add per output element."""
    return Cost(vector_flops=op.out_numel())


@cost_rule("TopK", op_class=OpClass.VECTOR, params=(1,))
def topk(op: OpView) -> Cost:
    """About n·log2(k) comparisons per row for a heap selection."""
    dims = op.in_dims(0)
    k = op.out_dims(0)[op.attr("axis", -1)]
    return Cost(vector_flops=math.prod(dims) * max(1, math.ceil(math.log2(max(k, 2)))))


# -- pooling ---------------------------------------------------------------------------


@cost_rule("MaxPool", "AveragePool", "LpPool", op_class=OpClass.VECTOR)
def pool(op: OpView) -> Cost:
    """prod(kernel) per output element; AveragePool adds a division per output."""
    window = math.prod(op.attr("kernel_shape", [1]))
    out = op.out_numel()
    extra = out if op.node.op_type == "AveragePool" else 0
    return Cost(vector_flops=window * out + extra)


@cost_rule("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", op_class=OpClass.VECTOR)
def global_pool(op: OpView) -> Cost:
    """One op per input element; GlobalAveragePool adds a division per output."""
    extra = op.out_numel() if op.node.op_type == "GlobalAveragePool" else 0
    return Cost(vector_flops=op.in_numel(0) + extra)


@cost_rule("Resize", "Upsample", op_class=OpClass.DATA_MOVEMENT, params=(1, 2, 3))
def resize(op: OpView) -> Cost:
    """Nearest: a copy; linear/cubic: 2^d or 4^d weighted taps per output element (d spatial dims)."""
    mode = op.attr("mode", "nearest")
    spatial = max(len(op.out_dims()) - 2, 1)
    taps = {"nearest": 0, "linear": 2**spatial, "cubic": 4**spatial}.get(mode, 0)
    return Cost(vector_flops=2 * taps * op.out_numel())


# -- data movement and shape ops ---------------------------------------------------------


def _no_flops(op: OpView) -> Cost:
    """No FLOPs: the bytes it reads and writes."""
    return Cost()


def _moves(op_type: str, params: tuple[int, ...] = (), **traits: Any) -> None:
    """Register a data-movement op; ``params`` are the input indices that are shape parameters, not data."""
    cost_rule(op_type, op_class=OpClass.DATA_MOVEMENT, params=params, **traits)(_no_flops)


# views: free on every target (`OpTraits.shape_only`); layouts of a stored weight fold at compile time
_VIEW = {"shape_only": True, "folds_on_weights": True, "keeps_values": True}
_LAYOUT = (Role.LAYOUT,)  # RoPE's cos/sin tables flow through it to their multiplies (report roles)
_PASSES = (Role.LAYOUT, Role.PASS_THROUGH)  # and softmax probabilities reach P·V through it (a decode step
# slices them into the cached part and the new part, each with its own P·V)

_moves("Transpose", folds_on_weights=True, strided_view=True, cpu_class="Transpose", roles=_PASSES)
_moves("Reshape", (1,), **_VIEW, roles=_PASSES, output_shape_input=1)
_moves("Flatten", **_VIEW)
_moves("Squeeze", (1,), **_VIEW, roles=_LAYOUT)
_moves("Unsqueeze", (1,), **_VIEW, roles=_LAYOUT)
_moves("Identity", **_VIEW, roles=_PASSES)
_moves("Dropout", (1, 2), shape_only=True, roles=(Role.PASS_THROUGH,))  # inference (training_mode false): the identity
_moves("Concat", roles=_LAYOUT)
_moves("Split", (1,), roles=_PASSES)
_moves("Slice", (1, 2, 3, 4), roles=_PASSES, identity_when_unchanged=True)
_moves("Expand", (1,), keeps_values=True, roles=_LAYOUT, output_shape_input=1, identity_when_unchanged=True)
_moves("Tile", (1,))
_moves("Pad", (1, 2, 3))
_moves("Cast", folds_on_weights=True, keeps_values=True, roles=(*_EW, *_PASSES), identity_when_unchanged=True)
_moves("CastLike", (1,))
_moves("Trilu", (1,), makes_causal_mask=True)  # torch.triu of a full mask: the causal triangle
_moves("DepthToSpace")
_moves("SpaceToDepth")
_moves("GatherElements", index_input=1)
_moves("GatherND", index_input=1)
_moves("ScatterND")
_moves("ScatterElements")
_moves("Scatter")
_moves("OneHot", (1, 2))
_moves("Compress")
_moves("NonZero")
_moves("ReverseSequence", (1,))
_moves("Unique")
_moves("SplitToSequence", (1,))


@cost_rule(
    "Gather",
    op_class=OpClass.DATA_MOVEMENT,
    custom_bytes=True,
    backward=Backward.SCATTER_ADD,
    roles=_LAYOUT,
    index_input=1,
)
def gather(op: OpView) -> Cost:
    """Reads only the gathered slices (an embedding lookup reads B·S rows, not the table)."""
    data = op.graph.values[op.node.inputs[0]]
    out_bytes = op.out_type().nbytes(op.graph.bindings)
    index_bytes = op.in_type(1).nbytes(op.graph.bindings)
    gathered = out_bytes
    if data.kind.is_stored:
        return Cost(weight_bytes=gathered, act_bytes_in=index_bytes, act_bytes_out=out_bytes)
    return Cost(act_bytes_in=gathered + index_bytes, act_bytes_out=out_bytes)


@cost_rule("Shape", "Size", op_class=OpClass.SHAPE, params=(0,), shape_only=True, reads_metadata_only=True)
def shape_of(op: OpView) -> Cost:
    """Reads the input's metadata, not its data."""
    return Cost()


@cost_rule("Constant", op_class=OpClass.SHAPE, params=(0,), shape_only=True)  # an initializer once loaded
@cost_rule(
    "ConstantOfShape",
    "EyeLike",
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    op_class=OpClass.SHAPE,
    params=(0,),
)
def constant(op: OpView) -> Cost:
    """Materialises its output: bytes written, nothing computed."""
    return Cost()


@cost_rule("Range", op_class=OpClass.SHAPE, params=(0, 1, 2))
def range_(op: OpView) -> Cost:
    """start + i·delta: one multiply-add per element."""
    return Cost(vector_flops=2 * op.out_numel())


# -- ops without a cost rule whose traits matter ------------------------------------------

op_traits_only("Silu", op_class=None, **_NLIN)  # x·sigmoid(x) from exporters that keep it whole
op_traits_only("PackedAttention", domain="com.microsoft", op_class=None, roles=(Role.ATTENTION,))
op_traits_only("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "CrossEntropyLoss", op_class=None, loss=True)
# the loss the training pass appends to a language model's logits (passes.training.LOSS_OP); the
# pass costs it itself: its log-sum-exp is one row reduction
op_traits_only("SoftmaxCrossEntropy", domain=TOOL_DOMAIN, op_class=None, loss=True, row_reductions=1)


# -- the per-op table of docs/costs.md -----------------------------------------------------

_DOC_BEGIN = (
    "<!-- per-op table: generated by passes.cost_rules.render_costs_markdown(); run scripts/gen_costs_doc.py -->"
)
_DOC_END = "<!-- end of generated per-op table -->"


def _first_paragraph(doc: str | None) -> str:
    return " ".join(((doc or "").strip().split("\n\n") or [""])[0].split())


def _trait_notes(traits: OpTraits, rule: CostRule | None) -> str:
    notes = [
        label
        for label, on in (
            ("shape-only", traits.shape_only),
            ("folds on weights", traits.folds_on_weights),
            ("fp32 when mixed", traits.keeps_fp32),
            ("keeps values", traits.keeps_values),
            ("counts its own bytes", rule is not None and rule.custom_bytes),
            (f"roles: {'/'.join(sorted(r.value for r in traits.roles))}", traits.roles),
            (f"{traits.row_reductions} row reduction(s)", traits.row_reductions),
            ("nonlinear kernel", traits.nonlinear),
            ("loss", traits.loss),
            (f"output shape in input {traits.output_shape_input}", traits.output_shape_input is not None),
            (f"indices in input {traits.index_input}", traits.index_input is not None),
            ("contrib output types", traits.output_types is not None),
        )
        if on
    ]
    return ", ".join(notes)


def render_costs_markdown() -> str:
    """The per-op table of docs/costs.md, one row per group of ops that share a rule and traits.

    The block starts and ends with marker comments, so scripts/gen_costs_doc.py can replace
    it in place and tests/test_op_traits.py can check that the committed doc matches.
    """
    rows: dict[tuple[Any, ...], list[str]] = {}
    for (domain, op), traits in _TRAITS.items():
        rule = _RULES.get((domain, op))
        counts = _first_paragraph(rule.fn.__doc__) if rule else f"no cost rule: {ESTIMATED_NOTE} (bytes only)"
        params = ", ".join(str(i) for i in sorted(rule.params)) if rule else ""
        key = (counts, params, traits, rule.custom_bytes if rule else None)
        rows.setdefault(key, []).append(f"{domain}::{op}" if domain else op)
    lines = [
        _DOC_BEGIN,
        "",
        "| ops | class | counts | shape-parameter inputs | backward | autograd saves | host-CPU kernel | traits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (counts, params, traits, _), ops in rows.items():
        rule = _RULES.get(_key(ops[0].rpartition("::")[2], ops[0].rpartition("::")[0]))
        cells = [
            ", ".join(ops),
            traits.op_class.value if traits.op_class else "-",
            counts,
            params or "-",
            traits.backward.value if traits.has_cost_rule else "-",
            traits.saves.value,
            traits.cpu_class,
            _trait_notes(traits, rule) or "-",
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", _DOC_END]
    return "\n".join(lines) + "\n"
