"""Module roles: which part of the model each node belongs to, the same across layers.

A role names what a node does in the model so that its time can be added up over the
decoder layers: ``layers.*.attn.q_proj`` (the model's own scope with the layer index
replaced by ``*``), ``layers.*.attn: softmax`` (a pattern inside a container module),
``layers.*: residual adds``. A node in a leaf module (one that holds no other module:
a Linear, a norm, an embedding) takes the module's scope; a node in a container module
(attention, MLP, the block) takes the container's scope and the pattern it matches.
A graph without scopes (a foreign ONNX file) gets the pattern alone, and the fallback
is the op type. Overheads that belong to no node are rows of their own (`overhead_role`).
Scopes and weight names are read below the model's root (`Graph.model_root`, `model_path`): a
model exported inside a user's wrapper has the roles of the unwrapped export (``lm_head``, not
``model.lm_head``).

What an op signals (a contraction, a norm, an activation, ...) is its `OpTraits.roles` in the
op registry (`passes/cost_rules.py`); this module holds only the precedence between them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from dabench_ir.ir import SCOPE_CACHE, Graph, Node, ValueKind, layer_wildcard, model_path, module_kind, scope_parts
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import Role, op_traits

__all__ = ["OVERHEAD_PREFIX", "general_scope", "node_roles", "overhead_role"]

OVERHEAD_PREFIX = "overhead: "
"""Role of a step cost no node owns: ``overhead: section_reconfig``."""

_TABLE_NAME = re.compile(r"(?:^|[._])(cos|sin)")


@functools.lru_cache(maxsize=SCOPE_CACHE)
def general_scope(scope: str) -> str:
    """The scope with its layer index replaced by ``*``: ``layers.3.attn.q_proj`` -> ``layers.*.attn.q_proj``.
    Cached: the points of one model (and of its other layer counts) ask for the same scopes and weights."""
    return layer_wildcard(scope)


def overhead_role(name: str) -> str:
    """The role row of a named step overhead (``section_reconfig`` -> ``overhead: section_reconfig``)."""
    return OVERHEAD_PREFIX + name


def node_roles(graph: Graph) -> dict[str, str]:
    """Every node's role (see the module docstring), by node name."""
    root = graph.model_root
    scopes = {model_path(n.scope, root) for n in graph.nodes if n.scope}
    containers = _containers(scopes)
    producers = {o: n for n in graph.nodes for o in n.outputs if o}  # one map for both walks
    op_roles = _OpRoles()
    softmaxes, table_ops = _softmaxes_and_tables(graph, op_roles)
    softmax_in, softmax_out = _around_softmax(graph, softmaxes, producers, op_roles)
    rotary = _rotary(graph, table_ops, producers, op_roles)
    roles: dict[str, str] = {}
    general: dict[str, str] = {}  # scope -> general_scope(scope): the nodes of a module share it
    for node in graph.nodes:
        scope = node.scope
        if scope.startswith("optimizer") or node.name.startswith("optimizer."):
            roles[node.name] = "optimizer"
            continue
        scope = model_path(scope, root)  # the root's own nodes: unscoped, as in an unwrapped export
        if scope:
            module = general.get(scope)
            if module is None:
                module = general[scope] = general_scope(scope)
            if scope not in containers:
                roles[node.name] = module  # a leaf module: its own name says what it is
                continue
        pattern = (
            "rotary embedding"
            if node.name in rotary
            else _pattern(graph, node, softmax_in, softmax_out, op_roles, root)
        )
        roles[node.name] = f"{module}: {pattern}" if scope else pattern
    return roles


def _containers(scopes: Iterable[str]) -> set[str]:
    """Scopes that hold another scope (``layers.0.attn`` holds ``layers.0.attn.q_proj``)."""
    return {".".join(parts[:i]) for parts in (scope.split(".") for scope in scopes) for i in range(1, len(parts))}


class _OpRoles(dict[tuple[str, str], frozenset[Role]]):
    """What each op signals (`OpTraits.roles`) by (op type, domain): the registry asked once per op
    type of one `node_roles` call, not once per node it looks at (rules may be registered between calls)."""

    def __missing__(self, key: tuple[str, str]) -> frozenset[Role]:
        roles = self[key] = op_traits(key[0], key[1]).roles
        return roles


def _softmaxes_and_tables(graph: Graph, op_roles: _OpRoles) -> tuple[list[Node], list[Node]]:
    """The nodes whose op signals `Role.SOFTMAX`, and those signalling `Role.ROTARY_TABLE`, in order:
    one walk of the nodes for both."""
    softmaxes: list[Node] = []
    tables: list[Node] = []
    softmax, table = Role.SOFTMAX, Role.ROTARY_TABLE
    for node in graph.nodes:
        roles = op_roles[node.op_type, node.domain]
        if softmax in roles:
            softmaxes.append(node)
        if table in roles:
            tables.append(node)
    return softmaxes, tables


def _around_softmax(
    graph: Graph, softmaxes: list[Node], producers: dict[str, Node], op_roles: _OpRoles
) -> tuple[set[str], set[str]]:
    """Nodes on the path into a Softmax (scores, scale, mask) and those reading its output (P·V).

    Walks back from each Softmax through element-wise and layout ops to the first
    contraction (the scores), and forward to the first contraction (the values).
    """
    into: set[str] = set()
    out: set[str] = set()
    consumers = graph.consumers
    for sm in softmaxes:
        stack = [i for i in sm.inputs if i]
        seen: set[str] = set()
        while stack:
            node = producers.get(stack.pop())
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            into.add(node.name)
            if Role.CONTRACTION in op_roles[node.op_type, node.domain]:
                continue  # the scores: stop here
            stack.extend(
                i
                for i in node.inputs
                if i and _is_activation(graph, i) and (p := producers.get(i)) is not None and p.layer == sm.layer
            )
        frontier = [o for o in sm.outputs if o]
        seen = set()
        while frontier:
            for reader in consumers.get(frontier.pop(), []):
                if reader.name in seen:
                    continue
                seen.add(reader.name)
                roles = op_roles[reader.op_type, reader.domain]
                if Role.CONTRACTION in roles:
                    out.add(reader.name)
                elif Role.PASS_THROUGH in roles:
                    frontier.extend(o for o in reader.outputs if o)
    return into, out


def _rotary(graph: Graph, table_ops: list[Node], producers: dict[str, Node], op_roles: _OpRoles) -> set[str]:
    """RoPE: the multiplies by the cos/sin tables (and their layout), the Neg and the Adds joining them;
    ``table_ops``: the nodes computing the tables."""
    tables = {o for n in table_ops for o in n.outputs if o}
    tables |= {  # the substring test first: most graphs' thousands of weights name neither
        name
        for name, v in graph.values.items()
        if ("cos" in name or "sin" in name) and v.kind.is_stored and _TABLE_NAME.search(v.name)
    }
    out: set[str] = set()
    for node in graph.nodes if tables else ():  # topological order: tables flow forward through layout ops
        if tables.isdisjoint(node.inputs):
            continue
        if Role.LAYOUT in op_roles[node.op_type, node.domain]:
            tables.update(o for o in node.outputs if o)
        elif node.op_type == "Mul":
            out.add(node.name)
    for node in graph.nodes:
        op = node.op_type
        if op == "Add":  # joins: every input's producer is rotary
            if all((p := producers.get(i)) is not None and p.name in out for i in node.inputs if i):
                out.add(node.name)
        elif (
            op == "Neg"
            and node.scope
            and any(  # rotates
                r.name in out or r.op_type == "Concat" for o in node.outputs for r in graph.consumers.get(o, [])
            )
        ):
            out.add(node.name)
    return out


def _is_activation(graph: Graph, name: str) -> bool:
    value = graph.values.get(name)
    return value is not None and not value.kind.is_stored


def _stored_input(graph: Graph, node: Node) -> str | None:
    """The first weight (trained parameter) the node reads, if any."""
    for name in node.inputs:
        value = graph.values.get(name) if name else None
        if value is not None and value.kind is ValueKind.WEIGHT:
            return name
    return None


def _pattern(
    graph: Graph, node: Node, softmax_in: set[str], softmax_out: set[str], op_roles: _OpRoles, root: str
) -> str:
    """What the node does, from its op and neighbours: a role without a scope (``root``: the model's,
    that a weight's name is read below)."""
    op = node.op_type
    roles = op_roles[op, node.domain]
    if Role.ATTENTION in roles:
        return "attention"
    if Role.SOFTMAX in roles:
        return "softmax"
    if Role.CONTRACTION in roles:
        weight = _stored_input(graph, node)
        if weight is not None:
            return _weight_role(model_path(weight, root), graph, node)
        if node.name in softmax_out:
            return "attention values"
        if node.name in softmax_in:
            return "attention scores"
        return f"{op} (activations)"
    if node.name in softmax_in:
        return "attention scale/mask"
    if op == "Gather" and _stored_input(graph, node) is not None:
        return "embedding"
    norm_scope, mlp_scope = _scope_names(node.scope)
    if Role.NORM in roles or norm_scope:
        return "norms"
    if Role.ROTARY in roles or Role.ROTARY_TABLE in roles:
        return "rotary embedding"
    if Role.ACTIVATION in roles:
        return "activation"
    if op == "Add" and _residual(graph, node):
        return "residual adds"
    if mlp_scope and Role.ELEMENTWISE in roles:
        return "activation"
    if Role.NORM_PART in roles:
        return "norms"
    op_class = node.meta.get(meta.OP_CLASS)
    if op_class is not None and str(op_class) == "data_movement":
        return "layout"
    if op_class is not None and str(op_class) == "shape":
        return "shape ops"
    return op


@functools.lru_cache(maxsize=SCOPE_CACHE)
def _scope_names(scope: str) -> tuple[bool, bool]:
    """Whether the last part of ``scope`` names a norm, and an MLP: once per scope (a 96-layer
    model's attention blocks ask it for every reshape and transpose)."""
    parts = scope_parts(scope)
    kind = module_kind(parts[-1]) if parts else None
    return kind == "norm", kind == "mlp"


def _residual(graph: Graph, node: Node) -> bool:
    """An Add of two activations of the same shape (the skip connection)."""
    inputs = [graph.values.get(i) for i in node.inputs if i]
    if len(inputs) != 2 or any(v is None or v.kind.is_stored for v in inputs):
        return False
    a, b = (v.type.shape for v in inputs)  # type: ignore[union-attr]
    return a is not None and a == b


def _weight_role(weight: str, graph: Graph, node: Node) -> str:
    """A contraction with a weight and no scope: named after the weight (``model.layers.*.q_proj``)."""
    name = weight.removesuffix(".weight").removesuffix(".bias")
    if "." in name and not name.startswith(("onnx::", "val_", "_")):
        return general_scope(name)
    return "lm_head" if not any(graph.consumers.get(o) for o in node.outputs if o) else "linear"
