"""The standard analysis passes: bind symbols, tag layers, classify ops, cost every node."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from dabench_ir.errors import UnboundSymbolError, UserError
from dabench_ir.ir import ZERO_COST, Graph, Node, ValueKind, layer_from_scope

from . import meta
from .base import Pass, PassResult
from .cost_rules import ESTIMATED_NOTE, OpView, ShapeUnknownError, estimate_cost, find_rule, traits_of

__all__ = ["BindSymbols", "ClassifyOps", "CostPass", "FoldWeightLayouts", "TagLayers"]


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BindSymbols(Pass):
    """Bind symbolic dims (``batch``, ``seq``) to the values the user gave.

    A binding for a symbol the model does not have is a mistake worth one clear line.
    """

    dims: Mapping[str, int] = field(default_factory=dict)
    name: str = "bind-symbols"

    def call(self, graph: Graph) -> PassResult:
        unknown = sorted(set(self.dims) - graph.symbols)
        if unknown:
            have = ", ".join(sorted(graph.symbols)) or "none"
            raise UserError(f"--dim {unknown[0]}: the model has no symbolic dim {unknown[0]!r} (its symbols: {have})")
        for sym, value in self.dims.items():
            if value < 0:  # 0: an empty KV cache, or a dim derived from one (`dabench_ir.run.resolve`)
                raise UserError(f"--dim {sym}={value}: dims must be whole numbers")
        graph.bindings.update(self.dims)
        return PassResult(graph, bool(self.dims))


@dataclass(frozen=True)
class TagLayers(Pass):
    """Set ``Node.layer`` from the exporter's scope, and give unscoped nodes their neighbours' layer.

    Nodes the exporter left without a scope (constants, casts inserted by the optimiser)
    inherit the layer of the node that consumes their output when all consumers agree, unless
    a node they read from sits, by its own scope, outside that layer: an op of the model's root
    module (scope ``''``, as GPT-2's token + position embedding add) between the embeddings
    and the first block is no block's.
    """

    name: str = "tag-layers"

    def call(self, graph: Graph) -> PassResult:
        modified = False
        for node in graph.nodes:
            if node.layer is None and node.scope:
                node.layer = layer_from_scope(node.scope)
                modified |= node.layer is not None
        for node in reversed(graph.nodes):
            if node.layer is not None or node.scope:
                continue
            layers = {c.layer for out in node.outputs for c in graph.consumers.get(out, ())}
            if len(layers) == 1 and None not in layers and not _reads_outside(graph, node, layer := layers.pop()):
                node.layer = layer
                modified = True
        return PassResult(graph, modified)


def _reads_outside(graph: Graph, node: Node, layer: int) -> bool:
    """Whether ``node`` reads a value that a scoped node outside ``layer`` produced."""
    for name in node.inputs:
        value = graph.values.get(name)
        if value is not None and value.producer is not None:
            producer = graph.node(value.producer)
            if producer.scope and producer.layer != layer:
                return True
    return False


@dataclass(frozen=True)
class ClassifyOps(Pass):
    """Write each node's OpClass (contraction / vector / data movement / shape)."""

    name: str = "classify"

    def call(self, graph: Graph) -> PassResult:
        for node in graph.nodes:
            rule = find_rule(node)
            node.meta[meta.OP_CLASS] = rule.op_class if rule else None
        return PassResult(graph, True)


@dataclass(frozen=True)
class FoldWeightLayouts(Pass):
    """Fold what a compiler computes once, at compile time, into constants.

    - Layout ops applied to weights (``Transpose(W)`` before a MatMul): exporters write a
      linear layer that way; every accelerator compiler (and onnxruntime's constant folding)
      does the transpose once. Parameter counts do not change.
    - Shape arithmetic and constant subgraphs: ``Shape``/``Size`` of a tensor whose shape is
      static once the symbols are bound, and any node whose inputs are all constants (not
      weights) or such shapes — the causal mask a dynamic export builds with Range, Trilu and
      Expand, the target shapes of its Reshapes. A graph exported with a symbolic batch and
      bound to B then holds the same work as the one exported at B.

    A folded node costs nothing (`meta.FOLDED`), and its output becomes a stored constant, so
    its consumer reads it as stored bytes, as it reads an exported constant.
    """

    name: str = "fold-weight-layouts"

    def call(self, graph: Graph) -> PassResult:
        folded = 0
        for node in graph.nodes:
            reason = self._reason(graph, node)
            if reason is None:
                continue
            outs = [graph.values.get(v) for v in node.outputs if v]
            if not outs or any(v is None or v.kind is ValueKind.OUTPUT for v in outs):
                continue
            for value in outs:
                value.kind = ValueKind.CONSTANT
            node.meta[meta.FOLDED] = reason
            folded += 1
        if folded:
            logger.debug("folded %d node(s) at compile time", folded)
        return PassResult(graph, folded > 0)

    @staticmethod
    def _reason(graph: Graph, node: Node) -> str | None:
        if node.meta.get(meta.SUBGRAPH):
            return None
        ins = [graph.values.get(v) for v in node.inputs if v]
        if any(v is None for v in ins):
            return None
        shape_op = node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx")
        if not shape_op and not all(v.kind.is_stored for v in ins):
            return None  # reads an activation: none of the folds below applies (most nodes stop here)
        if traits_of(node).folds_on_weights and ins and all(v.kind.is_stored for v in ins):
            return f"layout of {node.inputs[0]!r}, folded at compile time"
        if shape_op and ins:
            return "a static shape, known at compile time" if graph.type_of(ins[0].name).is_static else None
        if all(v.kind is ValueKind.CONSTANT for v in ins):
            return "computes on constants only: folded at compile time"
        return None


@dataclass(frozen=True)
class CostPass(Pass):
    """Cost every node with its rule; a node no rule can count gets an estimate, never a zero.

    The estimate (`estimate_cost`) is a memory-bound lower bound: no FLOPs, the bytes the
    node reads and writes from its tensor types. It is the node's `meta.COST`, so every
    lowering places it like any node, and `meta.ESTIMATED` holds why no rule counted it
    (every report labels it `ESTIMATED_NOTE`). Only a node whose types are all unknown stays
    unattributed (`meta.UNATTRIBUTED`). All unbound symbols across the graph are reported
    together, in one error.
    """

    name: str = "cost"

    def call(self, graph: Graph) -> PassResult:
        unbound: set[str] = set()
        sizes: dict[int, int] = {}  # the rules' views share the bytes of each value type (`OpView`)
        unread = _shape_reads_only(graph)
        for node in graph.nodes:
            annotations = node.meta
            for stale in (meta.UNATTRIBUTED, meta.ESTIMATED, meta.COST, meta.ELIMINATED):
                annotations.pop(stale, None)
            reason = None
            rule = find_rule(node)
            if meta.FOLDED in annotations:
                annotations[meta.COST] = ZERO_COST  # immutable: one record for every folded node
                continue
            noop = _no_op(graph, node) if traits_of(node).identity_when_unchanged else None
            if node.name in unread:
                noop = "its outputs are read only for their shapes, known at compile time: never computed"
            if noop is not None:
                annotations[meta.COST] = ZERO_COST
                annotations[meta.ELIMINATED] = noop
                continue
            if annotations.get(meta.SUBGRAPH):
                reason = f"{node.op_type} holds a nested subgraph; subgraphs are not costed"
            elif rule is None:
                reason = f"no cost rule for op {node.qualified_op!r}"
            else:
                try:
                    annotations[meta.COST] = OpView(node, graph, rule, sizes).cost()
                except UnboundSymbolError as exc:
                    unbound |= {s for s in exc.symbols if not s.startswith("<")}
                    continue
                except ShapeUnknownError as exc:
                    reason = str(exc)
                except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
                    reason = f"cost rule for {node.qualified_op} could not read this node ({type(exc).__name__}: {exc})"
            if reason:
                estimate = estimate_cost(node, graph)
                if estimate is None:
                    node.meta[meta.UNATTRIBUTED] = reason
                    logger.debug("unattributed %s: %s", node.name, reason)
                else:
                    node.meta[meta.COST] = estimate
                    node.meta[meta.ESTIMATED] = reason
                    logger.debug("%s %s: %s", ESTIMATED_NOTE, node.name, reason)
        if unbound:
            batch = graph.batch_dim
            raise UnboundSymbolError(unbound, batch=batch if isinstance(batch, str) else None)
        if meta.analyzed_by(graph) is None:
            meta.graph_set(graph, meta.ANALYZED, "onnx")
        return PassResult(graph, True)


def _no_op(graph: Graph, node: Node) -> str | None:
    """Why ``node`` is the identity, with the graph's dims bound, or None: a ``Cast`` to the type its
    input already has, a ``Slice`` or an ``Expand`` whose output has its input's static shape and type
    (a Slice only with unit steps: a reversing one keeps the shape). Every compiler removes them before
    it runs anything: onnxruntime's level-1 rewrite rules ``CastElimination``, ``EliminateSlice`` and
    ``ExpandElimination`` (onnxruntime/core/optimizer/graph_transformer_utils.cc, GenerateRewriteRules),
    applied to every execution provider. Exporters differ in how many they write: TorchScript records
    ``hidden.to(torch.float32)`` on an fp32 tensor and ``mask[:, :, :, :key_length]`` over the whole mask
    as nodes, dynamo drops them while tracing; left in, each was a kernel on a GPU and a section cut or a
    region on a dataflow chip that the other export of the same model did not pay (issue 45)."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or not node.outputs or not node.inputs[0]:
        return None
    try:
        source, result = graph.type_of(node.inputs[0]), graph.type_of(node.outputs[0])
    except KeyError:
        return None
    if source.dtype != result.dtype:
        return None
    if node.op_type == "Cast":  # `OpTraits.identity_when_unchanged`: the dtype alone
        return f"a Cast to its input's type ({result.dtype.name.lower()}): eliminated at compile time"
    shape = source.shape
    if shape is None or shape != result.shape or not all(isinstance(d, int) for d in shape):
        return None  # another shape, or one not known statically: a real copy
    if node.op_type == "Slice" and len(node.inputs) > 4 and node.inputs[4]:
        steps = graph.values.get(node.inputs[4])
        if steps is None or steps.scalar != 1:  # unknown or not all ones (a reversal keeps the shape)
            return None
    return f"a {node.op_type} that returns its whole input: eliminated at compile time"


def _shape_reads_only(graph: Graph) -> set[str]:
    """Nodes no run computes: every reader of their outputs is folded at compile time (``Shape`` of a
    now static tensor: `FoldWeightLayouts`) or is such a node itself, and no output is the graph's.
    TorchScript keeps GPT-2's ``key.transpose(1, 2)`` as a node after it wrote the matmul's operand as
    one ``Transpose`` from the projection: what still reads it is ``key.shape`` (folded). Once the
    shapes are constants the node has no reader, and compilers drop it ("elimination of layers whose
    outputs are not used", the first build-phase optimization of the TensorRT User Guide, DU-08540-021,
    section 2.3; torch's own dead-code elimination: dynamo's exporter never writes it) (issue 45)."""
    dead: set[str] = set()
    outputs = set(graph.outputs)
    for node in reversed(graph.nodes):
        if meta.FOLDED in node.meta or not node.outputs or outputs.intersection(node.outputs):
            continue
        readers = [c for v in node.outputs if v for c in graph.consumers.get(v, ())]
        if readers and all(meta.FOLDED in c.meta or c.name in dead for c in readers):
            dead.add(node.name)
    return dead
