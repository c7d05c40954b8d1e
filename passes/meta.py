"""Every annotation key of dabench-ir — on `Node.meta`, on `Graph.meta` and in a model's metadata —
declared once, here, with checked accessors.

Reading an annotation that is missing says which pass writes it. Graph-level facts are
`GraphKey`s: a named, typed key read with `graph_get`/`graph_find` and written with
`graph_set`, which checks the value's type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from dabench_ir.ir import Cost, Graph, Node

__all__ = [
    "ACCUMULATE",
    "ANALYZED",
    "BACKWARD_COST",
    "CAUSAL_SHARE",
    "COST",
    "ELIMINATED",
    "ESTIMATED",
    "FOLDED",
    "FORWARD_COST",
    "FUSED_ATTENTION",
    "GRAPH_MODE",
    "GRAPH_PRECISION",
    "LINALG_COUNTS",
    "MLIR_ARTIFACT",
    "MLIR_CLASS",
    "MLIR_OPS",
    "MODEL_FAMILY",
    "MODEL_KV_CACHE",
    "MODEL_PARAMS",
    "MODEL_PHASE",
    "MODEL_PRESET",
    "MODEL_WEIGHTS",
    "OP_CLASS",
    "PRECISION",
    "QUANTISED",
    "RECOMPUTED",
    "SAVED",
    "SUBGRAPH",
    "TRAINING",
    "TRANSFORMED",
    "UNATTRIBUTED",
    "GraphKey",
    "MissingAnnotationError",
    "TrainingRecord",
    "analyzed_by",
    "attributed_cost",
    "get",
    "get_cost",
    "get_op_class",
    "graph_find",
    "graph_get",
    "graph_mode",
    "graph_precision",
    "graph_set",
    "training_state",
]

COST = "dabench.cost"  # Cost, written by the 'cost' pass
UNATTRIBUTED = "dabench.unattributed"  # str reason, written by the 'cost' pass
ESTIMATED = "dabench.estimated"  # str: why no rule counted it; its COST is `estimate_cost`'s bytes-only lower bound
OP_CLASS = "dabench.op_class"  # OpClass, written by the 'classify' pass
PRECISION = "dabench.precision"  # DType the node computes in, written by the 'precision' pass
ACCUMULATE = "dabench.accumulate"  # DType a contraction node accumulates its products in (mixed: fp32), by 'precision'
FOLDED = "dabench.folded"  # str: why the node costs nothing (a weight layout folded at compile time)
ELIMINATED = "dabench.eliminated"  # str: why it costs nothing (a no-op copy, or read for its shape only), by 'cost'
SUBGRAPH = "dabench.subgraph"  # True: the node holds a nested graph (If, Loop, Scan), set by the ONNX frontend
FORWARD_COST = "dabench.cost.forward"  # Cost of the forward phase, written by the 'training' pass
BACKWARD_COST = "dabench.cost.backward"  # Cost of the backward phase, written by the 'training' pass
FUSED_ATTENTION = "dabench.fused_attention"  # the attention core id a fused kernel runs the node in ('fused-attention')
CAUSAL_SHARE = (
    "dabench.causal_share"  # float: share of its core's scores a causal fused kernel computes ('fused-attention')
)
SAVED = "dabench.train.saved"  # {value: bytes} the node keeps for backward (whole bound batch), by 'training'
RECOMPUTED = "dabench.train.recomputed"  # True: its backward cost holds its forward run again, by 'training'
QUANTISED = "dabench.quantised"  # (mode, weight value names) of a weight-only quantised matmul, by 'precision'
MLIR_OPS = "dabench.mlir.ops"  # list[OpCount] attributed to the node, by 'linalg-cost'
MLIR_CLASS = "dabench.mlir.class"  # contraction | vector | data_movement | none, by 'linalg-cost'
# graph.meta keys of opaque frontend artifacts (not GraphKeys: their values are not plain records)
MLIR_ARTIFACT = "dabench.mlir.artifact"  # MlirArtifact (the lowered module), by the MLIR frontend
LINALG_COUNTS = "dabench.mlir.counts"  # list[OpCount], by the .mlir frontend or 'linalg-cost'
# model metadata keys (Graph.metadata, the ONNX file's metadata_props) the exporter writes
MODEL_FAMILY, MODEL_PRESET, MODEL_PARAMS, MODEL_WEIGHTS = (
    "dabench.family",
    "dabench.preset",
    "dabench.params",
    "dabench.weights",
)
MODEL_PHASE, MODEL_KV_CACHE = "dabench.phase", "dabench.kv_cache"

_WRITERS = {COST: "cost", OP_CLASS: "classify", PRECISION: "precision", ACCUMULATE: "precision"}


class MissingAnnotationError(KeyError):
    """An annotation was read before the pass that writes it ran."""

    def __str__(self) -> str:
        return str(self.args[0])


def get(node: Node, key: str) -> Any:
    try:
        return node.meta[key]
    except KeyError:
        writer = _WRITERS.get(key, "?")
        raise MissingAnnotationError(
            f"node {node.name!r} has no {key!r} annotation; run the {writer!r} pass first"
        ) from None


def get_cost(node: Node) -> Cost | None:
    """The node's Cost, or None when the node is unattributed (see `UNATTRIBUTED`)."""
    annotations = node.meta
    if UNATTRIBUTED in annotations:
        return None
    cost = annotations.get(COST)  # `get` written out for the common case: read once per node a lowering
    return cost if cost is not None else get(node, COST)


def attributed_cost(node: Node) -> Cost | None:
    """The work credited to ``node``: what its report row carries and every total adds (the report's,
    the energy's, the step's FLOPs the verifier bounds). None when no rule attributes work to it
    (`UNATTRIBUTED`) or it is not costed; unlike `get_cost`, never an error."""
    return None if UNATTRIBUTED in node.meta else node.meta.get(COST)


def get_op_class(node: Node) -> Any:
    return get(node, OP_CLASS)


# -- graph-level facts ------------------------------------------------------------------------


class GraphKey(NamedTuple):  # a record built at import without generated code (a dataclass: ~1 ms)
    """A graph-level annotation: its key in ``Graph.meta``, its type and the pass that writes it."""

    key: str
    type: type | tuple[type, ...]
    writer: str


@dataclass(frozen=True, slots=True)
class TrainingRecord:
    """The training pass's record of one step (`passes.training.TrainingPass`): how it trains and
    the state it keeps beside the weights, by kind, over the whole bound batch.

    ``to_dict`` is the report's ``config.train`` (these fields, in this order).
    """

    optimizer: str = "adam"
    """The optimizer whose update step the pass appended (``adam``)."""
    loss: str | None = None
    """Name of the loss node the pass appended; None: no language-model logits to score."""
    recompute: bool = False
    """Whole blocks are recomputed in backward (``recompute_mode == "full"``; the IPU lowering's stash model)."""
    recompute_mode: str = "none"
    """``none`` | ``selective`` | ``full``: what the backward recomputes instead of keeping."""
    fused_attention: bool = False
    """The attention cores run as fused kernels (the scores never leave the chip)."""
    params: int = 0
    """Parameters the optimizer updates (0: a symbolic weight shape)."""
    gradient_bytes: int = 0
    """One full gradient, in the weights' precision."""
    master_weight_bytes: int = 0
    """The fp32 master copy of 16-bit weights (0 when the weights are fp32)."""
    optimizer_state_bytes: int = 0
    """Adam's two fp32 moments."""
    saved_activation_bytes: int = 0
    """Activations kept for backward: what autograd saves per op, or with full recompute the
    tensors crossing block boundaries plus one block's set."""

    def to_dict(self) -> dict[str, Any]:
        """The record as the report's ``config.train`` holds it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingRecord:
        """The record of a report's ``config.train`` (keys it does not know are ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


# The key strings are those the lowerings read today; read them through the accessors below.
GRAPH_PRECISION = GraphKey("precision", str, "precision")  # fp16 | bf16 | mixed | fp32: the rewrite applied
GRAPH_MODE = GraphKey("mode", str, "training")  # "train" once the training expansion ran
TRAINING = GraphKey("train", TrainingRecord, "training")  # optimizer/gradient/activation state of a training step
ANALYZED = GraphKey("dabench.analyzed", str, "cost")  # "onnx" | "linalg": which costing gave every node its Cost
TRANSFORMED = GraphKey("dabench.transformed", tuple, "run")  # the rewrites applied after costing (run.transform_key)
CACHE_GROUP_SHARE = GraphKey(
    "dabench.tp.cache_group_share", float, "tensor parallelism"
)  # of a cached K/V head's query heads, the share one chip serves (scaling.split_for_tp)


def graph_get(graph: Graph, key: GraphKey) -> Any:
    """The graph's ``key``; MissingAnnotationError naming the pass that writes it."""
    try:
        return graph.meta[key.key]
    except KeyError:
        raise MissingAnnotationError(
            f"graph {graph.name!r} has no {key.key!r} annotation; run the {key.writer!r} pass first"
        ) from None


def graph_find(graph: Graph, key: GraphKey, default: Any = None) -> Any:
    """The graph's ``key``, or ``default`` when no pass wrote it (an optional fact)."""
    return graph.meta.get(key.key, default)


def graph_set(graph: Graph, key: GraphKey, value: Any) -> None:
    """Write ``key``; a value of the wrong type is a bug in the writer, said at once."""
    if not isinstance(value, key.type):
        raise TypeError(f"graph annotation {key.key!r} takes {key.type}, got {type(value).__name__}")
    graph.meta[key.key] = value


def analyzed_by(graph: Graph) -> str | None:
    """``onnx`` or ``linalg`` once a costing pass gave every node its Cost (or a reason), else None."""
    return graph_find(graph, ANALYZED)


def graph_precision(graph: Graph) -> str | None:
    """The precision rewrite applied to the graph, or None when it computes as exported."""
    return graph_find(graph, GRAPH_PRECISION)


def graph_mode(graph: Graph) -> str:
    """``train`` once the training expansion ran, else ``inference``."""
    return graph_find(graph, GRAPH_MODE, "inference")


def training_state(graph: Graph) -> TrainingRecord | None:
    """The training step's record (see `passes.training`), or None for inference."""
    return graph_find(graph, TRAINING)
