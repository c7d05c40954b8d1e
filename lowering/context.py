"""The lowering context and the helpers every lowering shares: a prepared graph's facts
(`LoweringContext`: node costs, stored values, sizes), grouping, liveness, balancing and bound rules.
Public to the scaling stage and the advice, which read the same facts of the graph they place.

Nothing here knows a hardware figure; every number comes from the `Target` passed in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from dabench_ir.ir import Cost, DType, Graph, Node, model_path, module_of, value_bytes
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import ESTIMATED_NOTE, traits_of
from dabench_ir.passes.precision import graph_compute_dtype
from dabench_ir.plan import NodePlan, Plan, Schedule
from dabench_ir.targets import ridge as ridge_of
from dabench_ir.timeline import Bound, classify_bound

if TYPE_CHECKING:
    from dabench_ir.targets import Target

__all__ = [
    "Block",
    "LoweringContext",
    "TrainingState",
    "balance",
    "cache_bytes",
    "cache_inputs",
    "kernel_groups",
    "largest_divisor",
    "layer_blocks",
    "module_key",
    "outside_blocks",
    "peak_live_bytes",
    "place_node",
    "stored_root",
    "stored_values",
    "training_bytes",
    "training_state",
    "value_bytes",
    "weight_bytes",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _op_class(node: Node) -> str:
    cls = node.meta.get(meta.OP_CLASS)
    if cls is None:
        return ""
    return str(getattr(cls, "value", cls)).lower()


@dataclass(slots=True)
class LoweringContext:
    """Per-node costs and the resolved options a lowering works from."""

    graph: Graph
    costs: dict[str, Cost]
    unattributed: list[str]
    precision: DType
    batch: int
    total_weight_bytes: int = 0
    stored: frozenset[str] = frozenset()
    """Names of the graph's stored values (weights, constants: `ValueKind.is_stored`), asked for every input read."""
    activations: frozenset[str] = frozenset()
    """Names of its other values (graph inputs, activations, outputs): what liveness and boundaries count."""
    _work: dict[str, bool] = field(
        default_factory=dict, repr=False
    )  # is_work by node name (`build`), asked ~8 times a node
    _sizes: dict[str, int] = field(
        default_factory=dict, repr=False
    )  # value_bytes by value name (-1: unknown or absent)
    _stored: dict[str, tuple[tuple[str, int], ...]] = field(
        default_factory=dict, repr=False
    )  # `stored_values` per node
    _facts: dict[tuple[Hashable, ...], Any] = field(
        default_factory=dict, repr=False
    )  # `fact`, by the function that works each out and its arguments

    @staticmethod
    def plan_precision(graph: Graph, precision: DType | None) -> DType:
        """The precision a plan of ``graph`` computes at: ``precision``, else what the graph computes in."""
        return precision or graph_compute_dtype(graph)

    def serves(self, graph: Graph, precision: DType | None) -> bool:
        """Whether this is the context a lowering of ``graph`` at ``precision`` would build."""
        return self.graph is graph and self.precision == self.plan_precision(graph, precision)

    @classmethod
    def build(cls, graph: Graph, precision: DType | None = None) -> LoweringContext:
        """The context of ``graph``: its node costs, the plan's precision (None: what the graph computes
        in) and its batch, the samples one replica runs per step (`Graph.batch_size`, see `dabench_ir.run`)."""
        costs: dict[str, Cost] = {}
        unattributed: list[str] = []
        work: dict[str, bool] = {}  # `is_work` of every node, in the one walk (every lowering asks it of every node)
        for node in graph.nodes:
            cost = meta.get_cost(node)  # MissingAnnotationError names the cost pass
            if cost is None:
                unattributed.append(node.name)
                cost = Cost()
            costs[node.name] = cost
            work[node.name] = not traits_of(node).shape_only and (cost.flops > 0 or cost.bytes > 0)
        if unattributed:
            logger.info("%d unattributed node(s) take zero time: %s", len(unattributed), ", ".join(unattributed[:5]))
        ctx = cls(graph, costs, unattributed, cls.plan_precision(graph, precision), graph.batch_size or 1, _work=work)
        ctx._index_values()
        ctx.total_weight_bytes = weight_bytes(ctx)
        return ctx

    def _index_values(self) -> None:
        """Every value's byte size and whether it is stored, in one pass over the graph's values:
        the lowerings ask both for every input and output they read. A size is worked out once
        per distinct (shape, dtype) (a 96-layer decoder's 5,004 values have 16): `value_bytes`
        is a function of the type and the graph's bindings alone."""
        graph, sizes, stored = self.graph, self._sizes, set()
        by_type: dict[tuple[Any, str], int] = {}
        for name, value in graph.values.items():
            key = (value.type.shape, value.type.dtype.name)  # the member's name: an enum hashes in Python
            size = by_type.get(key)
            if size is None:
                size = by_type[key] = value_bytes(graph, name, -1)
            sizes[name] = size
            if value.kind.is_stored:
                stored.add(name)
        # "" is an omitted optional input, never a value read
        self.stored, self.activations = frozenset(stored - {""}), frozenset(sizes.keys() - stored - {""})

    def plan(self, target: Target, options: Any, schedule: Schedule, **fields: Any) -> Plan:
        """An empty Plan of this graph on ``target``: precision, batch and unattributed nodes filled in."""
        return Plan(
            target=target,
            options=options,
            precision=self.precision,
            schedule=schedule,
            batch=self.batch,
            unattributed=list(self.unattributed),
            **fields,
        )

    def fact(self, work_out: Callable[..., T], *args: Hashable) -> T:
        """``work_out(self, *args)``, worked out on the first ask and kept: a fact of the context's
        graph at its precision that a lowering reads in every plan it makes of them, however many
        placements share the context (the why lines' variants do). ``work_out`` and ``args`` are the
        key: a module-level function (or class) of the context, never a closure over a run, and
        hashable arguments besides (an option the fact depends on)."""
        key = (work_out, *args)
        try:
            return self._facts[key]
        except KeyError:
            value = self._facts[key] = work_out(self, *args)
            return value

    def live_bytes(self) -> int:
        """The peak of live activations while the whole graph runs in order (`peak_live_bytes`), a
        `fact` of the context: every RDU memory check reads it."""
        return self.fact(_whole_graph_live)

    def resident_bytes(self) -> int:
        """What one device holds running the whole graph: weights, the peak of live
        activations, and the training state."""
        return self.total_weight_bytes + self.live_bytes() + training_bytes(self)

    def node_precision(self, node: Node) -> DType:
        """The dtype ``node`` computes in: the precision pass's choice per node (mixed
        precision keeps norms and softmax in fp32), else the plan's precision."""
        prec = node.meta.get(meta.PRECISION)
        return prec if isinstance(prec, DType) else self.precision

    def is_shape(self, node: Node) -> bool:
        """Zero-cost bookkeeping ops (reshape, shape, ...) that no unit really executes."""
        return traits_of(node).shape_only

    def is_work(self, node: Node) -> bool:
        """Whether some unit works on ``node``: no bookkeeping op (`is_shape`), and it computes or
        moves something (worked out for every node in `build`)."""
        return self._work[node.name]

    def value_bytes(self, name: str, default: int = 0) -> int:
        """`value_bytes` of the context's graph, read from its index of sizes (`_index_values`)."""
        size = self._sizes.get(name, -1)
        return default if size < 0 else size

    def is_elementwise(self, node: Node) -> bool:
        cls = _op_class(node)
        if cls:
            return cls == "vector"
        cost = self.costs[node.name]
        return cost.contraction_flops == 0 and cost.weight_bytes == 0 and cost.flops > 0


def outside_blocks(nodes: Sequence[Node]) -> tuple[list[Node], list[Node]]:
    """The nodes outside the decoder blocks, in order: those before the first block (the embedding)
    and those after it (the head, the loss, an optimizer step): the two ends of a pipeline."""
    first = next((i for i, n in enumerate(nodes) if n.layer is not None), len(nodes))
    before: list[Node] = []
    after: list[Node] = []
    for i, node in enumerate(nodes):
        if node.layer is None:
            (before if i < first else after).append(node)
    return before, after


def cache_bytes(ctx: LoweringContext, nodes: Sequence[Node]) -> int:
    """Bytes of the KV caches ``nodes`` read (a decode step's cache inputs, `cache_inputs`): held
    whole through the step, and from step to step, every sequence's however many micro-batches the
    step runs; so not a micro-batch's working set (the GPU's `live_skip` leaves them out of it)."""
    caches = cache_inputs(ctx)
    read = {v for node in nodes for v in node.inputs if v in caches}
    return sum(ctx.value_bytes(v) for v in read)


def cache_inputs(ctx: LoweringContext) -> frozenset[str]:
    """A decode step's KV-cache inputs (`passes.precision.cache_inputs`): state a step holds from one
    step to the next, not its input; worked out once a context (`LoweringContext.fact`)."""
    return ctx.fact(_cache_inputs)


def _cache_inputs(ctx: LoweringContext) -> frozenset[str]:
    from dabench_ir.passes.precision import cache_inputs as of_graph

    return frozenset(of_graph(ctx.graph))


def stored_root(graph: Graph, name: str) -> str:
    """The stored value a folded weight layout came from (``W`` for a folded ``Transpose(W)``)."""
    value = graph.values.get(name)
    if value is None or not value.producer:  # a weight or constant as stored (the common case)
        return name
    if meta.FOLDED not in graph.node(value.producer).meta:  # a value an unfolded node writes: itself
        return name
    seen: set[str] = set()
    while name not in seen:
        seen.add(name)
        value = graph.values.get(name)
        producer = graph.node(value.producer) if value is not None and value.producer else None
        if producer is None or meta.FOLDED not in producer.meta or not producer.inputs:
            break
        if not traits_of(producer).folds_on_weights:  # a folded constant subgraph: its output is the tensor
            break
        name = producer.inputs[0]
    return name


def stored_values(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> dict[str, int]:
    """The distinct stored values (weights, constants) ``nodes`` read, by root, with their bytes.

    A weight is one entry however many layouts of it are read: a matmul reading the folded
    ``Transpose(W)`` and the optimizer reading ``W`` hold one tensor between them.
    """
    out: dict[str, int] = {}
    memo = ctx._stored  # each node's (root, bytes) worked out once: lowerings ask for every kernel, layer and stage
    for node in ctx.graph.nodes if nodes is None else nodes:
        read = memo.get(node.name)
        if read is None:
            read = memo[node.name] = _stored_reads(ctx, node)
        for root, nbytes in read:
            if root not in out:
                out[root] = nbytes
    return out


def _stored_reads(ctx: LoweringContext, node: Node) -> tuple[tuple[str, int], ...]:
    """The stored values one node reads, in input order: (root, bytes of the layout it reads)."""
    if meta.FOLDED in node.meta:  # its output is the weight, read (and counted) by its consumer
        return ()
    held, inputs = ctx.stored, node.inputs
    if held.isdisjoint(inputs):  # most nodes read none
        return ()
    shape_input = traits_of(node).output_shape_input  # a target shape: compile-time metadata, not held
    stored = [v for i, v in enumerate(inputs) if v in held and i != shape_input]
    if not stored:
        return ()
    graph = ctx.graph
    fallback = ctx.costs[node.name].weight_bytes // len(stored)
    return tuple([(stored_root(graph, v), ctx.value_bytes(v, fallback)) for v in stored])


def weight_bytes(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> int:
    """Bytes of the distinct stored values (weights, constants) that ``nodes`` read."""
    return sum(stored_values(ctx, nodes).values())


@dataclass(frozen=True, slots=True)
class TrainingState:
    """Training state beside the weights, by kind (bytes); zero for inference."""

    gradients: int = 0
    master_weights: int = 0  # fp32 copies of 16-bit working weights
    optimizer: int = 0  # Adam's momentum and variance
    activations: int = 0  # saved for the backward pass

    @property
    def total(self) -> int:
        return self.gradients + self.master_weights + self.optimizer + self.activations

    @property
    def optimizer_side(self) -> int:
        """What an optimizer offload moves off the device: master weights and moments."""
        return self.master_weights + self.optimizer


def training_state(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> TrainingState:
    """The training state of the whole graph, or of a subset of nodes (a kernel, a stage).

    A subset's share of every kind follows the share of the weights those nodes hold
    (the training pass writes the totals).
    """
    train = meta.training_state(ctx.graph)
    if train is None:
        return TrainingState()
    kinds = (
        int(train.gradient_bytes),
        int(train.master_weight_bytes),
        int(train.optimizer_state_bytes),
        int(train.saved_activation_bytes),
    )
    if nodes is not None:
        if not ctx.total_weight_bytes:
            return TrainingState()
        share = weight_bytes(ctx, nodes) / ctx.total_weight_bytes
        kinds = tuple(math.ceil(k * share) for k in kinds)
    return TrainingState(*kinds)


def training_bytes(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> int:
    """All the training state of the whole graph, or of a subset of nodes (see `training_state`)."""
    return training_state(ctx, nodes).total


def module_key(node: Node, root: str = "") -> str:
    """The module a node belongs to, one level below its decoder block (``layers.0.attn``: `module_of`),
    named below the model's root (``root``: its graph's `Graph.model_root`; `model_path`), so that a
    model exported inside a user's wrapper has the modules of the unwrapped export, names and all; the
    node's layer (``layer0``) when no module is recorded."""
    module = module_of(node.scope, root).module
    return model_path(module, root) if module else (f"layer{node.layer}" if node.layer is not None else "")


def kernel_groups(ctx: LoweringContext, fuse_elementwise: bool) -> list[list[Node]]:
    """Kernels in topological order: one per node, or elementwise chains fused onto their producer.

    An elementwise node joins the previous kernel when it reads the previous node's output
    and that output has no other reader (a fusible chain, as GPU and WSE compilers do).
    A node that does no work (bookkeeping, a node folded at compile time, a no-op the cost pass
    eliminated) rides along with the kernel before it, and a folded node is never "the previous
    node": the compiled program does not hold it, so the constant arithmetic an exporter writes
    between a matmul and its scaling (TorchScript's ``Shape -> Gather -> Cast -> Pow`` of the
    head size) neither launches a kernel nor breaks the chain (issue 45: two exports of one model
    had different kernel counts from the order their nodes were written in).
    """
    groups: list[list[Node]] = []
    graph = ctx.graph
    for node in graph.nodes:
        if fuse_elementwise and groups and ctx.is_elementwise(node):
            prev = next((n for n in reversed(groups[-1]) if meta.FOLDED not in n.meta), groups[-1][-1])
            shared = [v for v in prev.outputs if v in node.inputs]
            if shared and all(len(graph.consumers.get(v, [])) == 1 for v in prev.outputs if v):
                groups[-1].append(node)
                continue
        if groups and not ctx.is_work(node):
            groups[-1].append(node)  # bookkeeping ops ride along with the kernel before them
            continue
        groups.append([node])
    return groups


@dataclass(slots=True)
class Block:
    """A run of consecutive nodes in one decoder block (or outside any block)."""

    key: str
    nodes: list[Node]


def layer_blocks(graph: Graph) -> list[Block]:
    """Consecutive nodes grouped by ``node.layer``; runs outside any layer are blocks too."""
    blocks: list[Block] = []
    for node in graph.nodes:
        key = f"layer{node.layer}" if node.layer is not None else ""
        if blocks and (blocks[-1].key == key or (key == "" and blocks[-1].key != "")):
            # nodes without a layer (residual adds the exporter left unscoped) stay with
            # the block they follow; a leading run without layer becomes its own block
            blocks[-1].nodes.append(node)
            continue
        blocks.append(Block(key or "pre", [node]))
    for i, b in enumerate(blocks):
        if b.key == "pre" and i > 0:
            b.key = f"block{i}"
    return blocks


def _whole_graph_live(ctx: LoweringContext) -> int:
    """`peak_live_bytes` of every node of the context's graph, in order (`LoweringContext.live_bytes`)."""
    return peak_live_bytes(ctx, ctx.graph.nodes)


def peak_live_bytes(ctx: LoweringContext, nodes: Sequence[Node], skip: Set[str] = frozenset()) -> int:
    """Peak bytes of activations alive at once while ``nodes`` run in order (simple liveness);
    values in ``skip`` never reach memory (a fused kernel's on-chip intermediates)."""
    graph = ctx.graph
    activations, stored, known = ctx.activations, ctx.stored, ctx._sizes
    end = len(nodes)
    position = {n.name: i for i, n in enumerate(nodes)}
    last_use: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if v not in activations:
                continue
            last_use[v] = i
            if v not in sizes:
                sizes[v] = ctx.value_bytes(v)
        for v in node.outputs:
            if v and v not in stored:  # a folded weight layout is a weight, not live
                size = known.get(v, -1)  # `ctx.value_bytes`, its default (a share of the node's bytes) only if unknown
                sizes[v] = size if size >= 0 else ctx.costs[node.name].act_bytes_out // max(1, len(node.outputs))
                last_use.setdefault(v, i)
    for v in graph.outputs:
        if v in sizes:
            last_use[v] = end
    if nodes is not graph.nodes:  # the whole graph reads nothing from outside itself
        consumers = graph.consumers
        for v in sizes:
            for c in consumers.get(v, ()):
                if c.name not in position:
                    last_use[v] = end  # read by a node outside this set: held to the end
                    break
    values = graph.values
    events = [0] * (end + 2)  # bytes born (+) and freed (-) before each position: a list, not a sorted map
    for v, size in sizes.items():
        if v in skip:
            continue
        value = values.get(v)
        born = position.get(value.producer, 0) if value is not None else 0  # produced outside: live from the start
        events[born] += size
        events[last_use[v] + 1] -= size
    peak = live = 0
    for change in events:
        live += change
        if live > peak:
            peak = live
    return peak


def largest_divisor(n: int, bound: int) -> int:
    """The largest divisor of ``n`` that is at most ``bound`` (1 when ``bound`` < 1), in O(sqrt n)."""
    best = 1
    i = 1
    while i * i <= n:
        if n % i == 0:
            for d in (i, n // i):
                if best < d <= bound:
                    best = d
        i += 1
    return best


def balance(
    work_s: Sequence[float],
    min_units: Sequence[int],
    max_units: Sequence[int],
    available: int,
    fixed_s: Sequence[float] | None = None,
) -> list[int] | None:
    """Units per task so tasks take near-equal time: the smallest T with sum(units) <= available.

    ``work_s[i]`` is task i's time on one unit; it gets ``ceil(work/T)`` units, clamped to
    ``[min_units[i], max_units[i]]``. With ``fixed_s`` a task on ``u`` units takes
    ``work/u + fixed`` (a part more units do not shorten), so it gets ``ceil(work/(T-fixed))``
    (its maximum while ``T <= fixed``). When every task at its maximum fits, T is the slowest
    task's time at its maximum and the others get just enough units to keep pace (units stay
    free). None when even the minimum sizes exceed ``available``.
    """
    if sum(min_units) > available:
        return None
    fixed = list(fixed_s) if fixed_s is not None else [0.0] * len(work_s)

    def units_at(t: float) -> list[int]:
        return [
            (max(lo, min(hi, math.ceil(w / (t - f) - 1e-9))) if t > f else hi) if w > 0 else lo
            for w, lo, hi, f in zip(work_s, min_units, max_units, fixed, strict=True)
        ]

    positive = [w for w in work_s if w > 0]
    if not positive:
        return list(min_units)
    hi_t = max(w / max(lo, 1) + f for w, lo, f in zip(work_s, min_units, fixed, strict=True)) or 1.0
    # the period can go no lower than the slowest task at its maximum: the others then get only
    # what keeps pace with it, and the rest of ``available`` stays unused
    floor_t = max(w / max(hi, 1) + f for w, hi, f in zip(work_s, max_units, fixed, strict=True) if w > 0)
    at_floor = units_at(floor_t)
    if sum(at_floor) <= available:
        return at_floor
    lo_t = floor_t
    at_hi = None  # units_at(hi_t) once a bisection step has found it (each is a pass over the tasks)
    for _ in range(100):  # bisection on a log scale; sum(units_at(t)) falls as t grows
        mid = math.sqrt(lo_t * hi_t)
        at_mid = units_at(mid)
        if sum(at_mid) <= available:
            hi_t, at_hi = mid, at_mid
        else:
            lo_t = mid
        if hi_t / lo_t < 1 + 1e-4:  # within 0.01%: finer balance changes no unit count that matters
            break
    return at_hi if at_hi is not None else units_at(hi_t)


UNATTRIBUTED_NOTE = "unattributed: zero time"


def place_node(
    ctx: LoweringContext,
    node: Node,
    *,
    unit: str,
    lane: str | None = None,
    compute_s: float,
    memory_s: float = 0.0,
    comm_s: float = 0.0,
    overhead_s: float = 0.0,
    feed_level: str,
    feed_bytes: int,
    ridge: float,
    allocation: float,
    micro_batches: int = 1,
    time_s: float | None = None,
    binds: Bound | None = None,
    feed_bandwidth: float | None = None,
    rows: int = 1,
    holds: bool = False,
) -> NodePlan:
    """The `NodePlan` of one node, from the times a lowering worked out for it.

    Its time is the roofline ``max(compute_s, memory_s)`` plus ``comm_s`` and
    ``overhead_s``, for a whole step. A node that does no work on this target (bookkeeping
    ops such as Shape or Reshape, nodes without a cost) takes zero time and is bound by
    overhead. ``time_s`` replaces the time where a lowering has a finer model (the
    calibrated host CPU). The bound comes from `classify_bound` against ``ridge`` (peak
    FLOP/s over the bandwidth of ``feed_level``), or, given ``feed_bandwidth`` (the bandwidth its
    feed comes at) and a compute time, against the node's own ridge: the rate its compute runs at
    (its op classes' mix: a residual add on a vector rate, not the contraction peak) over that
    bandwidth, so that it is compute-bound exactly when its compute outlasts its traffic.
    ``binds``, where the lowering times the node as part of something larger whose bound binds it
    (an RDU section: one pipeline), replaces a compute or memory bound. An unattributed node carries the note that says it takes zero time.
    ``rows``, ``holds``: the rows a run takes in one after another, and whether it emits them only
    once the run is done (`NodePlan.rows`, `NodePlan.holds`).
    Every lowering places nodes through here.
    """
    cost = ctx.costs[node.name]
    if ctx.is_work(node):
        flops, feed = cost.flops, feed_bytes
    else:  # bookkeeping: no unit works on it, it moves no feed bytes (a reshape is a view); its bound is overhead
        compute_s = memory_s = comm_s = overhead_s = 0.0
        flops = feed = 0
    work_s = max(compute_s, memory_s)
    if time_s is None:
        time_s = work_s + comm_s + overhead_s
    note = UNATTRIBUTED_NOTE if node.name in ctx.unattributed else ESTIMATED_NOTE if meta.ESTIMATED in node.meta else ""
    if feed_bandwidth and compute_s > 0:
        ridge = ridge_of(flops / compute_s, feed_bandwidth)
    bound = classify_bound(flops, feed, ridge, work_s=work_s, comm_s=comm_s, overhead_s=overhead_s)
    return NodePlan(
        node=node.name,
        unit=unit,
        lane=lane or unit,
        per_micro_batch_s=time_s / micro_batches,
        flops=cost.flops,
        bytes=cost.bytes,
        feed_level=feed_level,
        feed_bytes=feed,
        compute_s=compute_s,
        memory_s=memory_s,
        comm_s=comm_s,
        overhead_s=overhead_s,
        bound=bound if binds is None or bound not in (Bound.COMPUTE, Bound.MEMORY) else binds,
        allocation=allocation,
        note=note,
        rows=rows,
        holds=holds,
    )
