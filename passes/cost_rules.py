"""Per-op cost rules: one function per ONNX op type, found by name.

A rule gets an `OpView` (the node with its input and output types bound) and returns the
node's FLOPs as a `Cost`; the registry adds the bytes moved (weights read, activations
read, outputs written) unless the rule says it counts bytes itself. Adding an op is one
decorated function:

    @cost_rule("Relu", op_class=OpClass.VECTOR)
    def relu(op: OpView) -> Cost:
        return Cost(vector_flops=op.out_numel())

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
from dataclasses import dataclass
from typing import Any

from dabench_ir.ir import Cost, Graph, Node, TensorType

__all__ = [
    "FLOP_CONVENTION",
    "CostRule",
    "OpClass",
    "OpView",
    "ShapeUnknownError",
    "cost_rule",
    "find_rule",
    "registered_ops",
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
    SHAPE = "shape"  # metadata only: Shape, Constant, Range; reads no tensor data


class ShapeUnknownError(Exception):
    """A type the rule needs is not known (shape inference could not tell)."""


@dataclass(frozen=True, slots=True)
class CostRule:
    fn: Callable[[OpView], Cost]
    op_class: OpClass
    params: frozenset[int]  # input indices that are shape parameters (not data, not costed)
    custom_bytes: bool  # the rule returns bytes too


_RULES: dict[tuple[str, str], CostRule] = {}
_ONNX_DOMAINS = ("", "ai.onnx")


def cost_rule(
    *op_types: str,
    op_class: OpClass,
    domain: str = "",
    params: Iterable[int] = (),
    custom_bytes: bool = False,
) -> Callable[[Callable[[OpView], Cost]], Callable[[OpView], Cost]]:
    """Register ``fn`` as the cost rule of ``op_types`` in ``domain``."""

    def register(fn: Callable[[OpView], Cost]) -> Callable[[OpView], Cost]:
        rule = CostRule(fn, op_class, frozenset(params), custom_bytes)
        for op_type in op_types:
            _RULES[(domain, op_type)] = rule
        return fn

    return register


def find_rule(node: Node) -> CostRule | None:
    domain = "" if node.domain in _ONNX_DOMAINS else node.domain
    return _RULES.get((domain, node.op_type))


def registered_ops() -> list[str]:
    return sorted(op if not d else f"{d}::{op}" for d, op in _RULES)


class OpView:
    """A node with its value types resolved through the graph's symbol bindings."""

    __slots__ = ("graph", "node", "rule")

    def __init__(self, node: Node, graph: Graph, rule: CostRule) -> None:
        self.node = node
        self.graph = graph
        self.rule = rule

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    @property
    def n_inputs(self) -> int:
        return sum(1 for name in self.node.inputs if name)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def _type(self, name: str) -> TensorType:
        value = self.graph.values.get(name)
        if value is None or value.type.shape is None:
            raise ShapeUnknownError(f"shape of {name!r} is unknown (shape inference could not infer it)")
        return value.type.bind(self.graph.bindings)

    def in_type(self, i: int) -> TensorType:
        return self._type(self.node.inputs[i])

    def out_type(self, i: int = 0) -> TensorType:
        return self._type(self.node.outputs[i])

    def in_dims(self, i: int) -> tuple[int, ...]:
        return self.in_type(i).dims(self.graph.bindings)

    def out_dims(self, i: int = 0) -> tuple[int, ...]:
        return self.out_type(i).dims(self.graph.bindings)

    def in_numel(self, i: int = 0) -> int:
        return math.prod(self.in_dims(i))

    def out_numel(self, i: int = 0) -> int:
        return math.prod(self.out_dims(i))

    def default_bytes(self) -> Cost:
        """Weights and constants read, activations read (each distinct value once), outputs written."""
        weight = act_in = act_out = 0
        seen: set[str] = set()
        for i, name in enumerate(self.node.inputs):
            if not name or i in self.rule.params or name in seen:
                continue
            seen.add(name)
            nbytes = self._type(name).nbytes(self.graph.bindings)
            if self.graph.values[name].kind.is_stored:
                weight += nbytes
            else:
                act_in += nbytes
        for name in self.node.outputs:
            if name:
                act_out += self._type(name).nbytes(self.graph.bindings)
        return Cost(weight_bytes=weight, act_bytes_in=act_in, act_bytes_out=act_out)

    def cost(self) -> Cost:
        flops = self.rule.fn(self)
        return flops if self.rule.custom_bytes else flops + self.default_bytes()


# -- contractions ---------------------------------------------------------------------


@cost_rule("MatMul", "MatMulInteger", op_class=OpClass.CONTRACTION)
def matmul(op: OpView) -> Cost:
    """[..., M, K] @ [..., K, N]: 2·K FLOPs per output element (broadcast batch dims included)."""
    a = op.in_dims(0)
    k = a[-1]
    return Cost(contraction_flops=2 * k * op.out_numel())


@cost_rule("MatMulNBits", domain="com.microsoft", op_class=OpClass.CONTRACTION)
def matmul_nbits(op: OpView) -> Cost:
    return Cost(contraction_flops=2 * int(op.attr("K")) * op.out_numel())


@cost_rule("FusedMatMul", domain="com.microsoft", op_class=OpClass.CONTRACTION)
def fused_matmul(op: OpView) -> Cost:
    a = op.in_dims(0)
    k = a[-2] if op.attr("transA", 0) and len(a) >= 2 else a[-1]
    scale = 0 if op.attr("alpha", 1.0) == 1.0 else op.out_numel()
    return Cost(contraction_flops=2 * k * op.out_numel(), vector_flops=scale)


@cost_rule("Gemm", op_class=OpClass.CONTRACTION)
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


@cost_rule("Conv", "ConvInteger", op_class=OpClass.CONTRACTION)
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


@cost_rule("Einsum", op_class=OpClass.CONTRACTION)
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


# -- elementwise -----------------------------------------------------------------------

# op type -> (vector FLOPs, special ops) per output element
_ELEMENTWISE: dict[str, tuple[int, int]] = {
    # arithmetic
    "Add": (1, 0),
    "Sub": (1, 0),
    "Mul": (1, 0),
    "Div": (1, 0),
    "Neg": (1, 0),
    "Abs": (1, 0),
    "Reciprocal": (1, 0),
    "Mod": (1, 0),
    "Floor": (1, 0),
    "Ceil": (1, 0),
    "Round": (1, 0),
    "Sign": (1, 0),
    "BitShift": (1, 0),
    "BitwiseAnd": (1, 0),
    "BitwiseOr": (1, 0),
    "BitwiseXor": (1, 0),
    "BitwiseNot": (1, 0),
    # comparisons and selection
    "Equal": (1, 0),
    "Less": (1, 0),
    "LessOrEqual": (1, 0),
    "Greater": (1, 0),
    "GreaterOrEqual": (1, 0),
    "And": (1, 0),
    "Or": (1, 0),
    "Xor": (1, 0),
    "Not": (1, 0),
    "Where": (1, 0),
    "IsNaN": (1, 0),
    "IsInf": (1, 0),
    # activations
    "Relu": (1, 0),
    "LeakyRelu": (2, 0),  # compare, multiply
    "PRelu": (2, 0),
    "Clip": (2, 0),  # max, min
    "ThresholdedRelu": (1, 0),
    "HardSigmoid": (3, 0),  # mul, add, clip
    "HardSwish": (4, 0),
    "Shrink": (2, 0),
    "Sigmoid": (2, 1),  # exp(-x), add 1, divide
    "Tanh": (0, 1),
    "Erf": (0, 1),
    "Exp": (0, 1),
    "Log": (0, 1),
    "Sqrt": (0, 1),
    "Pow": (0, 1),
    "Sin": (0, 1),
    "Cos": (0, 1),
    "Tan": (0, 1),
    "Asin": (0, 1),
    "Acos": (0, 1),
    "Atan": (0, 1),
    "Sinh": (0, 1),
    "Cosh": (0, 1),
    "Asinh": (0, 1),
    "Acosh": (0, 1),
    "Atanh": (0, 1),
    "Softplus": (1, 2),  # log(1 + exp(x))
    "Softsign": (2, 0),  # x / (1 + |x|)
    "Elu": (2, 1),
    "Selu": (3, 1),
    "Celu": (3, 1),
    "Mish": (2, 3),  # x·tanh(softplus(x))
    "Swish": (3, 1),  # x·sigmoid(x)
}


def _elementwise_rule(vector: int, special: int) -> Callable[[OpView], Cost]:
    def rule(op: OpView) -> Cost:
        n = op.out_numel()
        return Cost(vector_flops=vector * n, special_ops=special * n)

    return rule


for _op, (_vector, _special) in _ELEMENTWISE.items():
    cost_rule(_op, op_class=OpClass.VECTOR)(_elementwise_rule(_vector, _special))


@cost_rule("Gelu", op_class=OpClass.VECTOR)
def gelu(op: OpView) -> Cost:
    """Exact GELU: 4 vector + 1 erf per element; tanh approximation: 7 vector + 1 tanh."""
    n = op.out_numel()
    vector = 7 if op.attr("approximate", "none") == "tanh" else 4
    return Cost(vector_flops=vector * n, special_ops=n)


@cost_rule("Gelu", "FastGelu", "BiasGelu", domain="com.microsoft", op_class=OpClass.VECTOR)
def ms_gelu(op: OpView) -> Cost:
    n = op.out_numel()
    bias = n if op.n_inputs > 1 else 0
    vector = 7 if op.node.op_type == "FastGelu" else 4
    return Cost(vector_flops=vector * n + bias, special_ops=n)


@cost_rule("Sum", "Max", "Min", "Mean", op_class=OpClass.VECTOR)
def variadic(op: OpView) -> Cost:
    """(inputs − 1) per element; Mean adds one division per element."""
    n = op.out_numel()
    vector = max(op.n_inputs - 1, 0) * n + (n if op.node.op_type == "Mean" else 0)
    return Cost(vector_flops=vector)


@cost_rule("QuantizeLinear", "DequantizeLinear", op_class=OpClass.VECTOR)
def quantize(op: OpView) -> Cost:
    """Scale and shift (and round/saturate) per element."""
    return Cost(vector_flops=2 * op.out_numel())


# -- normalisation and softmax ---------------------------------------------------------


def _rows(dims: tuple[int, ...], axis: int) -> tuple[int, int]:
    """(rows, row length) when reducing over dims[axis:]."""
    axis = axis % len(dims) if dims else 0
    return math.prod(dims[:axis]), math.prod(dims[axis:])


@cost_rule("Softmax", "LogSoftmax", op_class=OpClass.VECTOR)
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


@cost_rule("LayerNormalization", op_class=OpClass.VECTOR)
def layer_norm(op: OpView) -> Cost:
    """Per element: sum, subtract mean, square, sum, normalise, scale (+ bias) = 6 (7);
    per row: mean and variance divisions, add epsilon (3 vector) and one rsqrt."""
    dims = op.in_dims(0)
    rows, _ = _rows(dims, op.attr("axis", -1))
    n = math.prod(dims)
    per_element = 7 if op.has_input(2) else 6
    return Cost(vector_flops=per_element * n + 3 * rows, special_ops=rows)


@cost_rule("RMSNormalization", op_class=OpClass.VECTOR)
def rms_norm(op: OpView) -> Cost:
    """Per element: square, sum, normalise, scale = 4; per row: divide, add epsilon, rsqrt."""
    dims = op.in_dims(0)
    rows, _ = _rows(dims, op.attr("axis", -1))
    return Cost(vector_flops=4 * math.prod(dims) + 2 * rows, special_ops=rows)


@cost_rule("SimplifiedLayerNormalization", domain="", op_class=OpClass.VECTOR)
def simplified_layer_norm(op: OpView) -> Cost:
    return rms_norm(op)


@cost_rule("SimplifiedLayerNormalization", domain="com.microsoft", op_class=OpClass.VECTOR)
def ms_simplified_layer_norm(op: OpView) -> Cost:
    return rms_norm(op)


@cost_rule("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", domain="com.microsoft",
           op_class=OpClass.VECTOR)
def skip_layer_norm(op: OpView) -> Cost:
    """Residual add (and optional bias add), then the normalisation."""
    n = op.in_numel(0)
    adds = n * (2 if op.has_input(4) else 1)
    norm = rms_norm(op) if "Simplified" in op.node.op_type else layer_norm(op)
    return norm + Cost(vector_flops=adds)


@cost_rule("BatchNormalization", op_class=OpClass.VECTOR)
def batch_norm(op: OpView) -> Cost:
    """Inference form: subtract mean, divide by sqrt(var + eps), scale, shift = 4 per element."""
    channels = op.in_dims(1)[0]
    return Cost(vector_flops=4 * op.in_numel(0) + channels, special_ops=channels)


@cost_rule("InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization",
           op_class=OpClass.VECTOR)
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
    dims = op.in_dims(0)
    n = math.prod(dims)
    rows = n // dims[op.attr("axis", -1)]
    return Cost(vector_flops=3 * n, special_ops=rows)


# -- reductions ------------------------------------------------------------------------

# op type -> (vector per input element, special per input element, vector per output, special per output)
_REDUCTIONS: dict[str, tuple[int, int, int, int]] = {
    "ReduceSum": (1, 0, 0, 0),
    "ReduceMax": (1, 0, 0, 0),
    "ReduceMin": (1, 0, 0, 0),
    "ReduceProd": (1, 0, 0, 0),
    "ReduceMean": (1, 0, 1, 0),
    "ReduceL1": (2, 0, 0, 0),
    "ReduceL2": (2, 0, 0, 1),
    "ReduceSumSquare": (2, 0, 0, 0),
    "ReduceLogSum": (1, 0, 0, 1),
    "ReduceLogSumExp": (1, 1, 0, 1),
    "ArgMax": (1, 0, 0, 0),
    "ArgMin": (1, 0, 0, 0),
}


def _reduction_rule(per_in: int, special_in: int, per_out: int, special_out: int) -> Callable[[OpView], Cost]:
    def rule(op: OpView) -> Cost:
        n_in, n_out = op.in_numel(0), op.out_numel()
        return Cost(vector_flops=per_in * n_in + per_out * n_out, special_ops=special_in * n_in + special_out * n_out)

    return rule


for _op, _counts in _REDUCTIONS.items():
    cost_rule(_op, op_class=OpClass.VECTOR, params=(1,))(_reduction_rule(*_counts))


@cost_rule("CumSum", op_class=OpClass.VECTOR, params=(1,))
def cumsum(op: OpView) -> Cost:
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
    return Cost()


_DATA_MOVEMENT: dict[str, tuple[int, ...]] = {
    # op type -> input indices that are shape parameters, not data
    "Transpose": (),
    "Reshape": (1,),
    "Flatten": (),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Identity": (),
    "Dropout": (1, 2),
    "Concat": (),
    "Split": (1,),
    "Slice": (1, 2, 3, 4),
    "Expand": (1,),
    "Tile": (1,),
    "Pad": (1, 2, 3),
    "Cast": (),
    "CastLike": (1,),
    "Trilu": (1,),
    "DepthToSpace": (),
    "SpaceToDepth": (),
    "GatherElements": (),
    "GatherND": (),
    "ScatterND": (),
    "ScatterElements": (),
    "Scatter": (),
    "OneHot": (1, 2),
    "Compress": (),
    "NonZero": (),
    "ReverseSequence": (1,),
    "Unique": (),
    "SplitToSequence": (1,),
}

for _op, _params in _DATA_MOVEMENT.items():
    cost_rule(_op, op_class=OpClass.DATA_MOVEMENT, params=_params)(_no_flops)


@cost_rule("Gather", op_class=OpClass.DATA_MOVEMENT, custom_bytes=True)
def gather(op: OpView) -> Cost:
    """Reads only the gathered slices (an embedding lookup reads B·S rows, not the table)."""
    data = op.graph.values[op.node.inputs[0]]
    out_bytes = op.out_type().nbytes(op.graph.bindings)
    index_bytes = op.in_type(1).nbytes(op.graph.bindings)
    gathered = out_bytes
    if data.kind.is_stored:
        return Cost(weight_bytes=gathered, act_bytes_in=index_bytes, act_bytes_out=out_bytes)
    return Cost(act_bytes_in=gathered + index_bytes, act_bytes_out=out_bytes)


@cost_rule("Shape", "Size", op_class=OpClass.SHAPE, params=(0,))
def shape_of(op: OpView) -> Cost:
    """Reads the input's metadata, not its data."""
    return Cost()


@cost_rule("Constant", "ConstantOfShape", "EyeLike", "RandomNormal", "RandomUniform",
           "RandomNormalLike", "RandomUniformLike", op_class=OpClass.SHAPE, params=(0,))
def constant(op: OpView) -> Cost:
    """Materialises its output: bytes written, nothing computed."""
    return Cost()


@cost_rule("Range", op_class=OpClass.SHAPE, params=(0, 1, 2))
def range_(op: OpView) -> Cost:
    """start + i·delta: one multiply-add per element."""
    return Cost(vector_flops=2 * op.out_numel())
