"""Namespaced annotation keys on `Node.meta`, and checked accessors for them.

Reading an annotation that is missing says which pass writes it.
"""

from __future__ import annotations

from typing import Any

from dabench_ir.ir import Cost, Node

__all__ = [
    "COST",
    "FOLDED",
    "OP_CLASS",
    "PRECISION",
    "UNATTRIBUTED",
    "MissingAnnotationError",
    "get",
    "get_cost",
    "get_op_class",
]

COST = "dabench.cost"  # Cost, written by the 'cost' pass
UNATTRIBUTED = "dabench.unattributed"  # str reason, written by the 'cost' pass
OP_CLASS = "dabench.op_class"  # OpClass, written by the 'classify' pass
PRECISION = "dabench.precision"  # DType the node computes in, written by the 'precision' pass
FOLDED = "dabench.folded"  # str: why the node costs nothing (a weight layout folded at compile time)

_WRITERS = {COST: "cost", OP_CLASS: "classify", PRECISION: "precision"}


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
    if UNATTRIBUTED in node.meta:
        return None
    return get(node, COST)


def get_op_class(node: Node) -> Any:
    return get(node, OP_CLASS)
