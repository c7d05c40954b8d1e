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
- one `dabench::AdamStep` node updates every parameter: 13 vector FLOPs and 1 sqrt per
  parameter, reading and writing fp32 master weights, momentum and variance.
"""

from __future__ import annotations

from dataclasses import dataclass

from dabench_ir.errors import UnboundSymbolError
from dabench_ir.ir import Cost, DType, Graph, Node, ValueKind

from . import meta
from .base import Pass, PassResult
from .cost_rules import Backward, OpClass, traits_of

__all__ = [
    "ADAM_BYTES_PER_PARAM",
    "ADAM_FLOPS_PER_PARAM",
    "FORWARD_COST",
    "TrainingPass",
    "backward_cost",
]

FORWARD_COST = "dabench.cost.forward"
BACKWARD_COST = "dabench.cost.backward"

# Adam per parameter: m ← β1·m + (1−β1)·g (3), v ← β2·v + (1−β2)·g² (4), bias corrections
# (2), p ← p − lr·m̂ / (√v̂ + ε) (4): 13 vector FLOPs and one sqrt.
ADAM_FLOPS_PER_PARAM = (13, 1)
# Mixed-precision Adam state (Rajbhandari et al., ZeRO, SC'20, §3.1): fp16 weights (2) and
# gradients (2), fp32 master weights, momentum and variance (12): 16 bytes per parameter.
ADAM_BYTES_PER_PARAM = 16


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
        step = _optimizer_node(graph, params)
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
            "optimizer_state_bytes": ADAM_BYTES_PER_PARAM * params,
            # activations kept for backward: every saved input, or with recompute only the
            # tensors crossing layer boundaries plus one layer's working set
            "saved_activation_bytes": boundary + per_layer_peak if self.recompute else saved,
        })  # fmt: skip
        return PassResult(graph, True)


def _optimizer_node(graph: Graph, params: int) -> Node:
    vector, special = ADAM_FLOPS_PER_PARAM
    node = Node(
        name="optimizer.adam_step",
        op_type="AdamStep",
        domain="dabench",
        inputs=[v.name for v in graph.weights()],
        outputs=[],
        scope="optimizer",
    )
    # reads p, g, m, v (fp32 master copies: 4 × 4 B) and writes p, m, v (3 × 4 B) and the
    # half-precision working copy of the weights (2 B)
    node.meta[meta.COST] = Cost(
        vector_flops=vector * params,
        special_ops=special * params,
        weight_bytes=16 * params,
        act_bytes_out=14 * params,
    )
    node.meta[meta.OP_CLASS] = OpClass.VECTOR
    node.meta[meta.PRECISION] = DType.FLOAT32
    return node
