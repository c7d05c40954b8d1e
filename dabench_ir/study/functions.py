"""Rewrites that change the function a node computes, not only how it is computed.

A fusion is a gain only when the fused node computes what its source nodes did. onnxruntime's
transformers optimizer fuses a tanh-approximated GELU (``Gelu(approximate="tanh")``, GPT-2's
``gelu_new``) and its bias Add into ``com.microsoft::BiasGelu``, which is the exact (erf) GELU:
another function, with another cost (4 vector ops an element, not 7). `function_changes` finds
such nodes from the `Provenance`, so a study can say so in the run instead of counting the
change as a fusion gain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dabench_ir.passes.cost_rules import traits_of

if TYPE_CHECKING:
    from dabench_ir.ir import Graph, Node

    from .provenance import Provenance

__all__ = ["function_changes"]

_FORM_NAMES = {"erf": "exact (erf) GELU", "tanh": "tanh-approximated GELU", "sigmoid": "sigmoid-approximated GELU"}


def _gelu_form(node: Node) -> str | None:
    """The GELU ``node`` computes or is part of (a key of `_FORM_NAMES`, its `OpTraits.gelu_form`; a
    Gelu with ``approximate="tanh"`` is the tanh form), or None."""
    form = traits_of(node).gelu_form
    if form is not None and node.attrs.get("approximate") == "tanh":
        return "tanh"
    return form


def function_changes(before: Graph, after: Graph, prov: Provenance) -> dict[str, str]:
    """New node name -> a line saying how its function differs from its source nodes' (GELU forms)."""
    src = {n.name: n for n in before.nodes}
    out: dict[str, str] = {}
    for node in after.nodes:
        form = _gelu_form(node)
        if form is None:
            continue
        members = [src[m] for m in prov.members.get(node.name, ()) if m in src]
        other = next((m for m in members if _gelu_form(m) not in (None, form)), None)
        if other is None:
            continue
        was = _gelu_form(other)
        out[node.name] = (
            f"function changed: {node.name} ({node.qualified_op}) computes the {_FORM_NAMES[form]} where "
            f"{other.name} ({other.qualified_op}) computed the {_FORM_NAMES[str(was)]}: its cost and time "
            "differ by the function, not by fusion alone"
        )
    return out
