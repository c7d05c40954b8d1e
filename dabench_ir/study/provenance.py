"""Which source nodes each node of a rewritten graph stands for.

`provenance(before, after)` matches the two Graphs of one model before and after a pipeline:

1. **names**: a node kept under its name (and op) stands for itself; a new node named after a
   removed one and a ``/`` (onnxruntime names a fused node so: ``node_MatMul_42/MatMulAddFusion``)
   claims that node (method ``names``);
2. **subgraph**: a new node claims the removed source nodes between its inputs and its
   outputs, found by walking the source graph back from its output tensors (names the
   rewrite kept) to its inputs, a stored value or a node still present;
3. **neighbour**: a removed node left unclaimed (its tensors were renamed) joins the new
   node that claimed a producer or consumer of it, preferring compute over layout nodes,
   repeated until nothing changes;
4. **scope**: what is still unclaimed joins a new node of the same module;
5. otherwise it was **folded** (all its inputs stored: constant folding) or **removed**.

Every source node ends in exactly one of these, so a diff accounts for all of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dabench_ir.ir import Graph, Node

__all__ = ["Provenance", "module_label", "named_after", "provenance"]


def module_label(scope: str | None, layer: int | None, root: str = "") -> str:
    """The module of a node from its scope and layer, named below its model's root (``root``:
    `Graph.model_root`): `lowering.context.module_key`, alike for a model exported in a wrapper or not."""
    from dabench_ir.lowering.context import module_key

    return module_key(SimpleNamespace(scope=scope or "", layer=layer), root) or "(outside modules)"  # type: ignore[arg-type]


@dataclass(slots=True)
class Provenance:
    """New node -> the source nodes it replaced; source node -> how that was found."""

    members: dict[str, list[str]] = field(default_factory=dict)
    method: dict[str, str] = field(default_factory=dict)  # source node -> names|subgraph|neighbour|scope|folded|removed

    def to_dict(self) -> dict[str, object]:
        return {"members": {k: list(v) for k, v in self.members.items()}, "method": dict(self.method)}

    @classmethod
    def from_dict(cls, data: dict) -> Provenance:
        return cls({k: list(v) for k, v in (data.get("members") or {}).items()}, dict(data.get("method") or {}))


def _weight(node: Node) -> int:
    from dabench_ir.passes.cost_rules import OpClass, traits_of

    t = traits_of(node)
    return {OpClass.CONTRACTION: 3, OpClass.VECTOR: 2}.get(t.op_class, 0) if not t.shape_only else -1  # type: ignore[arg-type]


def named_after(name: str, candidates: set[str]) -> str | None:
    """The longest ``/``-prefix of ``name`` that is one of ``candidates`` (``a/b/Fusion`` -> ``a/b``)."""
    parts = name.split("/")
    for end in range(len(parts) - 1, 0, -1):
        prefix = "/".join(parts[:end])
        if prefix in candidates:
            return prefix
    return None


def _hand_work_to_its_producer(
    after: Graph, owner: dict[str, str], src: dict[str, Node], weight: dict[str, int]
) -> None:
    """A new layout node (a Reshape the rewrite put after a Gemm) keeps the original output's name, so
    the subgraph walk gives it what the Gemm absorbed (the bias Add): a source node that does work
    goes to the new node that produces the layout node's input, when that one does work."""
    for name, held in list(owner.items()):
        if weight.get(held, 0) >= 0 or _weight(src[name]) < 0:
            continue
        layout = after.node(held)
        feeders = [after.values[t].producer for t in layout.inputs if t in after.values]
        worker = next((f for f in feeders if f and weight.get(f, -1) >= 0), None)
        if worker is not None:
            owner[name] = worker


def provenance(before: Graph, after: Graph) -> Provenance:
    """Match ``after``'s nodes to the ``before`` nodes they stand for (see the module doc)."""
    src = {n.name: n for n in before.nodes}
    order = {n.name: i for i, n in enumerate(before.nodes)}
    old_root, new_root = before.model_root, after.model_root
    out = Provenance()
    new_nodes: list[Node] = []
    for node in after.nodes:
        old = src.get(node.name)
        if old is not None and old.qualified_op == node.qualified_op:
            out.members[node.name] = [node.name]
            out.method[node.name] = "names"
        else:
            new_nodes.append(node)
    kept = set(out.method)
    gone = [n for n in before.nodes if n.name not in kept]
    owner: dict[str, str] = {}  # gone source node -> new node
    gone_names = {n.name for n in gone}
    for node in new_nodes:  # 1. names: "<source node>/<fusion>" stands for that source node
        source = named_after(node.name, gone_names)
        if source is not None and source not in owner:
            owner[source] = node.name
            out.method[source] = "names"

    def producer(tensor: str) -> str | None:
        value = before.values.get(tensor)
        return value.producer if value is not None else None

    for node in new_nodes:  # 2. subgraph: walk back from the outputs the rewrite kept
        stop = {t for t in node.inputs if t}
        stack = [t for t in node.outputs if t and t in before.values]
        seen: set[str] = set()
        while stack:
            tensor = stack.pop()
            if tensor in seen or tensor in stop:
                continue
            seen.add(tensor)
            prod = producer(tensor)
            if prod is None or prod in kept or prod in owner:
                continue
            owner[prod] = node.name
            out.method[prod] = "subgraph"
            stack.extend(t for t in src[prod].inputs if t)
    new_weight = {n.name: _weight(n) for n in new_nodes}
    _hand_work_to_its_producer(after, owner, src, new_weight)
    changed = True
    while changed:  # 3. neighbour: unclaimed nodes join a claimed producer's or consumer's group
        changed = False
        for node in gone:
            if node.name in owner:
                continue
            near = [producer(t) for t in node.inputs if t]
            near += [c.name for t in node.outputs if t for c in before.consumers.get(t, ())]
            groups = {owner[n] for n in near if n in owner}
            if groups:
                owner[node.name] = max(sorted(groups), key=lambda g: new_weight.get(g, 0))
                out.method[node.name] = "neighbour"
                changed = True
    by_module: dict[str, list[str]] = {}
    for node in new_nodes:  # 4. scope: a new node of the same module (its own scope or its members')
        mods = Counter(module_label(src[m].scope, src[m].layer, old_root) for m, o in owner.items() if o == node.name)
        module = mods.most_common(1)[0][0] if mods else module_label(node.scope, node.layer, new_root)
        by_module.setdefault(module, []).append(node.name)
    stored = {name for name, v in before.values.items() if v.kind.is_stored}
    for node in gone:
        if node.name in owner:
            continue
        candidates = by_module.get(module_label(node.scope, node.layer, old_root))
        if all(t in stored for t in node.inputs if t):
            out.method[node.name] = "folded"
            stored.update(t for t in node.outputs if t)
        elif candidates:
            owner[node.name] = max(candidates, key=lambda g: new_weight.get(g, 0))
            out.method[node.name] = "scope"
        else:
            out.method[node.name] = "removed"
    for node in new_nodes:
        members = sorted((m for m, o in owner.items() if o == node.name), key=order.__getitem__)
        out.members[node.name] = members
    return out
