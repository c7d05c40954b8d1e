"""Training expansion: each node's cost becomes forward + backward, plus an optimizer step.

The rules, with their sources, are in docs/training.md. In short:

- a contraction's backward computes one gradient contraction per input that needs a
  gradient (dX = dY·Wᵀ, dW = Xᵀ·dY): 2× the forward FLOPs for a linear layer, so a
  matmul-dominated model costs 3× its forward pass (Kaplan et al. 2020, "6N" per token);
- vector ops: backward = 2× forward vector FLOPs (the local derivative, then the product
  with the incoming gradient) and 1× forward special ops (e.g. erf' needs one exp);
- data movement: backward moves the same bytes back (transpose back, scatter-add for gather);
- bytes: backward reads dY, the saved inputs and the weights, writes dX and dW;
- with ``recompute``, each layer's forward runs again during backward and only the tensors
  that cross layer boundaries are kept;
- one `dabench::AdamStep` node updates every parameter once per step: 13 vector FLOPs and
  1 sqrt per parameter, reading and writing fp32 master weights, momentum and variance;
- the training state beside the weights is written by kind (gradients in the weights'
  precision, fp32 master weights when the weights are 16-bit, Adam's two fp32 moments,
  saved activations), so each lowering can put each kind where its target keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dabench_ir.errors import UnboundSymbolError
from dabench_ir.ir import Cost, DType, Graph, Node, ValueKind

from . import meta
from .base import Pass, PassResult
from .cost_rules import Backward, OpClass, traits_of

__all__ = [
    "ADAM_FLOPS_PER_PARAM",
    "ADAM_MOMENT_BYTES_PER_PARAM",
    "FORWARD_COST",
    "MASTER_BYTES_PER_PARAM",
    "TrainingPass",
    "backward_cost",
    "is_optimizer_step",
]

FORWARD_COST = "dabench.cost.forward"
BACKWARD_COST = "dabench.cost.backward"

# Adam per parameter: m ← β1·m + (1−β1)·g (3), v ← β2·v + (1−β2)·g² (4), bias corrections
# (2), p ← p − lr·m̂ / (√v̂ + ε) (4): 13 vector FLOPs and one sqrt.
ADAM_FLOPS_PER_PARAM = (13, 1)
# Mixed-precision Adam state (Rajbhandari et al., ZeRO, SC'20, §3.1): 16-bit weights (2) and
# gradients (2), fp32 master weights (4), momentum and variance (8): 16 bytes per parameter.
# The weights are counted where they are read; the rest is training state.
ADAM_MOMENT_BYTES_PER_PARAM = 8  # fp32 momentum and variance
MASTER_BYTES_PER_PARAM = 4  # fp32 master copy, kept when the working weights are 16-bit
OPTIMIZER_OP = ("dabench", "AdamStep")


def is_optimizer_step(node: Node) -> bool:
    """The optimizer update the training pass appends: it runs once per step, after every
    micro-batch's backward, and belongs to no layer, stage or section of the model."""
    return (node.domain, node.op_type) == OPTIMIZER_OP


def _needs_grad(graph: Graph) -> set[str]:
    """Values whose gradient backward must compute: weights and what depends on them."""
    needs = {v.name for v in graph.values.values() if v.kind is ValueKind.WEIGHT}
    for node in graph.nodes:
        if any(name in needs for name in node.inputs if name):
            needs.update(out for out in node.outputs if out)
    return needs


def backward_cost(node: Node, forward: Cost, grad_inputs: int, data_inputs: int) -> Cost:
    """Backward cost of one node from its forward cost, by its op's `Backward` rule (module docstring)."""
    rule = traits_of(node).backward
    if rule is Backward.NONE or grad_inputs == 0:
        return Cost()
    contraction, vector, special = 0, 0, 0
    if rule is Backward.CONTRACTION:
        share = grad_inputs / max(data_inputs, 1)
        contraction = round(forward.contraction_flops * grad_inputs)
        vector = round(forward.vector_flops * share)
    elif rule is Backward.SCATTER_ADD:  # one add per gradient element summed into the table
        vector = forward.act_bytes_out // max(_itemsize(node), 1)
    elif rule is Backward.VECTOR:
        vector, special = 2 * forward.vector_flops, forward.special_ops
    return Cost(
        contraction_flops=contraction,
        vector_flops=vector,
        special_ops=special,
        weight_bytes=2 * forward.weight_bytes,  # read W, write dW
        act_bytes_in=forward.act_bytes_out + forward.act_bytes_in,  # dY and the saved inputs
        act_bytes_out=forward.act_bytes_in,  # dX
    )


def _itemsize(node: Node) -> int:
    dtype = node.meta.get(meta.PRECISION)
    return dtype.itemsize if isinstance(dtype, DType) else 4


@dataclass(frozen=True)
class TrainingPass(Pass):
    """Turn a costed forward graph into one training step (forward, backward, optimizer)."""

    recompute: bool = False
    optimizer: str = "adam"
    name: str = "training"

    def requires(self, graph: Graph) -> None:
        for node in graph.nodes:
            if meta.COST in node.meta or meta.UNATTRIBUTED in node.meta:
                return
            meta.get(node, meta.COST)  # raises: run 'cost' first

    def call(self, graph: Graph) -> PassResult:
        if meta.graph_mode(graph) == "train":
            return PassResult(graph, False)
        needs = _needs_grad(graph)
        saved = 0
        boundary = 0
        for node in graph.nodes:
            forward = meta.get_cost(node)
            if forward is None:
                continue
            data = [n for n in node.inputs if n and graph.values[n].kind is not ValueKind.CONSTANT]
            if traits_of(node).backward is Backward.CONTRACTION:
                data = [n for n in node.inputs[:2] if n]  # the two operands; a bias grad is a reduction
            grads = sum(1 for n in data if n in needs)
            bwd = backward_cost(node, forward, grads, len(data))
            if self.recompute:
                bwd = bwd + forward
            node.meta[FORWARD_COST] = forward
            node.meta[BACKWARD_COST] = bwd
            node.meta[meta.COST] = forward + bwd
            if grads:
                saved += forward.act_bytes_in
            if any(c.layer != node.layer for out in node.outputs for c in graph.consumers.get(out, ())):
                boundary += forward.act_bytes_out
        try:
            params = sum(v.type.numel(graph.bindings) for v in graph.weights())
        except UnboundSymbolError:
            params = 0
        itemsize = _weight_itemsize(graph)
        step = _optimizer_node(graph, params, itemsize)
        graph.nodes.append(step)
        graph.invalidate()
        per_layer_peak = max(
            (sum(meta.get_cost(n).act_bytes_in for n in graph.nodes if n.layer == layer and meta.get_cost(n))
             for layer in graph.layers),
            default=0,
        )
        meta.graph_set(graph, meta.GRAPH_MODE, "train")
        meta.graph_set(graph, meta.TRAINING, {
            "optimizer": self.optimizer,
            "recompute": self.recompute,
            "params": params,
            "gradient_bytes": itemsize * params,
            "master_weight_bytes": MASTER_BYTES_PER_PARAM * params if itemsize < 4 else 0,
            "optimizer_state_bytes": ADAM_MOMENT_BYTES_PER_PARAM * params,
            # activations kept for backward: every saved input, or with recompute only the
            # tensors crossing layer boundaries plus one layer's working set
            "saved_activation_bytes": boundary + per_layer_peak if self.recompute else saved,
        })  # fmt: skip
        return PassResult(graph, True)


def _weight_itemsize(graph: Graph) -> int:
    """Bytes per parameter of the working weights (2 after a 16-bit precision rewrite)."""
    sizes = [v.type.dtype.itemsize for v in graph.weights() if v.type.dtype.is_float]
    return max(set(sizes), key=sizes.count) if sizes else 4


def _optimizer_node(graph: Graph, params: int, itemsize: int) -> Node:
    vector, special = ADAM_FLOPS_PER_PARAM
    domain, op_type = OPTIMIZER_OP
    node = Node(
        name="optimizer.adam_step",
        op_type=op_type,
        domain=domain,
        inputs=[v.name for v in graph.weights()],
        outputs=[],
        scope="optimizer",
    )
    # reads the fp32 parameter (the master copy when the weights are 16-bit), the gradient
    # and both moments; writes the parameter, both moments and, when 16-bit, the working copy
    half = itemsize < 4
    node.meta[meta.COST] = Cost(
        vector_flops=vector * params,
        special_ops=special * params,
        weight_bytes=(4 + itemsize + ADAM_MOMENT_BYTES_PER_PARAM) * params,
        act_bytes_out=(4 + ADAM_MOMENT_BYTES_PER_PARAM + (itemsize if half else 0)) * params,
    )
    node.meta[meta.OP_CLASS] = OpClass.VECTOR
    node.meta[meta.PRECISION] = DType.FLOAT32
    return node
