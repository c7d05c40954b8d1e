"""Module scopes re-attached to a rewritten model from the model it came from.

Optimisers drop the exporter's per-node metadata: onnxruntime's saved optimised model keeps
no ``pkg.torch.onnx.name_scopes`` at all, so every node would load without a scope. The
scope drives layer tagging, the RDU O1 sections (one module per section) and the report's
roles, so an RDU study would compare a model of modules with one of a handful of sections
and credit the optimiser with the host's per-section launches it no longer counts.

`attach_scopes(source, rewritten)` gives every node of ``rewritten`` a scope, by this rule:

1. **from its source nodes**: a node the `provenance` matched to source nodes (kept by
   name, named ``<source>/<fusion>``, or found between its inputs and outputs) takes the
   **longest common dotted prefix** of their non-empty scopes: a Gemm that replaced the
   MatMul and Add of ``layers.0.attn.q_proj`` is in ``layers.0.attn.q_proj``, a
   SkipLayerNormalization that fused the residual Add of ``layers.0`` with
   ``layers.0.mlp_norm`` is in ``layers.0``, a node spanning two blocks is in their
   container (``layers``) or in none, as is a node whose source nodes had no scope;
2. **its own**: a node no source node speaks for keeps the scope the optimiser wrote, if any;
3. **from its neighbours**: a node the optimiser inserted (the Reshapes around a Gemm)
   takes the common prefix of its consumers' scopes in the rewritten graph, else of its
   producers', repeated until nothing changes;
4. otherwise none (its layer then comes from its name, as on loading).

The layer follows the scope as the ONNX loader derives it (`layer_from_scope`, else the
node's name). `write_scopes` records the scopes in the rewritten ONNX file as
``pkg.torch.onnx.name_scopes``, so every later load of it (placing, `dabench-ir diff`,
measuring) reads the same modules.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from dabench_ir.ir import scope_parts

if TYPE_CHECKING:
    import onnx

    from dabench_ir.ir import Graph

    from .provenance import Provenance

__all__ = ["attach_scopes", "common_scope", "write_scopes"]

_SCOPES_KEY = "pkg.torch.onnx.name_scopes"  # what the ONNX loader reads (`frontends.onnx._scope_of`)


def common_scope(scopes: list[str]) -> str:
    """The longest common dotted prefix of the non-empty ``scopes`` ('' when none is left)."""
    prefix: list[str] = []
    for column in zip(*(scope_parts(s) for s in scopes if s), strict=False):  # i-th parts, while every scope has one
        if any(part != column[0] for part in column):
            break
        prefix.append(column[0])
    return ".".join(prefix)


def attach_scopes(source: Graph, rewritten: Graph, prov: Provenance | None = None) -> Counter[str]:
    """Set ``scope`` and ``layer`` on every node of ``rewritten`` (rule: the module doc).

    Returns how many nodes each rule gave a scope (``members``, ``own``, ``neighbours``, ``none``).
    """
    from dabench_ir.ir import layer_from_scope

    from .provenance import provenance

    prov = prov or provenance(source, rewritten)
    src = {n.name: n for n in source.nodes}
    how: dict[str, str] = {}
    for node in rewritten.nodes:
        members = [src[m] for m in prov.members.get(node.name, ()) if m in src]
        if members:  # the source speaks for it, also when its nodes were outside every module
            node.scope, how[node.name] = common_scope([m.scope for m in members]), "members"
        elif node.scope:
            how[node.name] = "own"
    by_name = {n.name: n for n in rewritten.nodes}
    changed = True
    while changed:  # 3. neighbours: consumers first (an inserted node works for its reader)
        changed = False
        for node in rewritten.nodes:
            if node.name in how:
                continue
            readers = [c.scope for t in node.outputs if t for c in rewritten.consumers.get(t, ()) if c.name in how]
            writers = []
            for t in node.inputs:
                value = rewritten.values.get(t) if t else None
                prod = value.producer if value is not None else None
                if prod is not None and prod in how:
                    writers.append(by_name[prod].scope)
            scope = common_scope(readers) or common_scope(writers)
            if scope:
                node.scope, how[node.name] = scope, "neighbours"
                changed = True
    for node in rewritten.nodes:
        node.layer = layer_from_scope(node.scope) if node.scope else layer_from_scope(node.name)
    return Counter(how.get(n.name, "none") for n in rewritten.nodes)


def write_scopes(model: onnx.ModelProto, graph: Graph) -> None:
    """Record each node's scope in ``model`` (the ONNX file ``graph`` was loaded from)."""
    from dabench_ir.frontends.onnx import onnx_node_names

    scopes = {n.name: n.scope for n in graph.nodes}
    for proto, name in zip(model.graph.node, onnx_node_names(model.graph), strict=True):
        props = [p for p in proto.metadata_props if p.key not in (_SCOPES_KEY, "namespace")]
        del proto.metadata_props[:]
        proto.metadata_props.extend(props)
        scope = scopes.get(name, "")
        if scope:
            entry = proto.metadata_props.add()
            entry.key, entry.value = _SCOPES_KEY, repr([scope, proto.op_type])
