"""Graph queries the WSE kernel grouping, pipelined mode and weight streaming all read.

Shapes of values, the samples a graph's costs cover, trained parameters, the bytes of weights
with their training state, and a node's forward/backward cost split: kept here so that
`kernels`, `pipelined` and `streaming` each import them from one place (and none imports
another mode).
"""

from __future__ import annotations

from collections.abc import Sequence

from dabench_ir.errors import UnboundSymbolError
from dabench_ir.ir import Cost, Node, ValueKind
from dabench_ir.lowering.context import LoweringContext, training_state, weight_bytes
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import OpClass

__all__ = [
    "FEED_LEVEL",
    "WHO",
    "is_data",
    "phase_cost",
    "sample_count",
    "shape_of",
    "trained_params",
    "weight_state_bytes",
]

WHO = "wse"
"""The lowering's name in missing-field messages (``needed by the wse lowering``)."""

FEED_LEVEL = "on-chip"
"""The memory level that feeds the kernels: PE SRAM (`WseLowering.feed_level`)."""


def weight_state_bytes(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> int:
    """Weights and the training state that lives with them (gradients, fp32 master, moments)."""
    state = training_state(ctx, nodes)
    return weight_bytes(ctx, nodes) + state.gradients + state.master_weights + state.optimizer


def is_data(node: Node) -> bool:
    """Whether ``node`` only moves data (the data-movement op class): timed at the fabric link width."""
    cls = node.meta.get(meta.OP_CLASS)
    return cls is OpClass.DATA_MOVEMENT or str(getattr(cls, "value", cls)) == "data_movement"


def phase_cost(node: Node, which: str, fallback: Cost) -> Cost:
    """The node's forward or backward cost when the training pass split it, else ``fallback``."""
    c = node.meta.get(which)
    return c if isinstance(c, Cost) else fallback


def sample_count(ctx: LoweringContext) -> int:
    """Samples the graph's costs cover (one replica's step), to turn costs into per-sample work."""
    return ctx.batch


def shape_of(ctx: LoweringContext, name: str) -> tuple[int, ...] | None:
    """The concrete shape of value ``name``, or None when it is unknown or has an unbound symbol."""
    try:
        return tuple(int(d) for d in ctx.graph.type_of(name).dims(ctx.graph.bindings))
    except (UnboundSymbolError, KeyError, TypeError, ValueError):
        return None


def trained_params(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> int:
    """Trained parameters (weight elements) that ``nodes`` (None: the graph) read, each counted once."""
    graph = ctx.graph
    if nodes is None:
        try:
            return int(graph.num_params or 0)
        except UnboundSymbolError:
            return 0
    seen: set[str] = set()
    total = 0
    for node in nodes:
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            if value is None or v in seen:
                continue
            if value.kind is ValueKind.WEIGHT:
                seen.add(v)
                total += value.type.numel(graph.bindings)
            elif value.producer and meta.FOLDED in graph.node(value.producer).meta:
                for w in graph.node(value.producer).inputs:  # a folded layout of a weight: the weight
                    wv = graph.values.get(w) if w else None
                    if wv is not None and wv.kind is ValueKind.WEIGHT and w not in seen:
                        seen.add(w)
                        total += wv.type.numel(graph.bindings)
    return total
