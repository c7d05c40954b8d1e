"""Level 2: scaling one model over several chips (DP, TP, PP), on top of single-chip lowerings.

- DP (data parallel): every chip runs the whole graph on its own batch (weak scaling); in
  training, gradients are all-reduced once per step over the target's link. Where the lowering's
  systems stream their weights (`Lowering.systems_stream_weights`: a Cerebras Wafer-Scale
  Cluster), "chips" are systems that each stream the same weights from one store through a
  broadcast/reduce tree, which sums the gradients on the way back: no all-reduce, the tree's
  latency per level. Copies of a model on one chip are that lowering's own knob (the WSE's
  ``--replicas``), not chips. Where the lowering places its replicas over devices itself
  (`Lowering.replicates_itself`: the IPU's ``--replicas``), n chips are its plan with n replicas,
  whose step all-reduces the gradients itself.
- TP (tensor parallel, Megatron-style; Shoeybi et al. 2019): attention heads and MLP
  columns are split across chips. Nodes inside a block's attention or MLP module do 1/n of
  the work and hold 1/n of the weights; norms, residual adds and everything outside the
  blocks are replicated. Each split module ends in an all-reduce of its output: two per
  layer forward, four in training.
- PP (pipeline parallel): decoder blocks are assigned to chips as contiguous stages that
  minimise the most-loaded stage (exact, `optimal_contiguous_split`); the step runs m
  micro-batches through p stages, idle for the bubble (p − 1)/(m + p − 1), and sends the
  boundary activations over the link. On an IPU the IPU lowering pipelines itself.

Every chip's share is placed with `dabench_ir.place.place` (lower -> emulate -> metrics),
so per-chip allocation, load balance and fit come from the same model as `profile`. The
samples follow `dabench_ir.run`: the graph's batch is one chip's (one replica's) per step, so
data parallelism over n chips runs n times the graph's batch per step. The
closed forms (collectives, bubbles, contiguous splits) live in `dabench_ir.lowering.collectives`.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, Graph, Node, Value, ValueKind, module_of
from dabench_ir.lowering import lowering_for
from dabench_ir.lowering.collectives import (
    hierarchical_allreduce_time,
    optimal_contiguous_split,
    p2p_time,
    ring_allreduce_bytes,
    ring_allreduce_time,
    root_allreduce_time,
)
from dabench_ir.lowering.context import (
    LoweringContext,
    cache_bytes,
    outside_blocks,
    stored_root,
    training_state,
    value_bytes,
    weight_bytes,
)
from dabench_ir.lowering.gpu import (
    HOST_ISSUE,
    OFFLOAD_GRADIENTS,
    OFFLOAD_WEIGHTS,
    host_shortfall,
    live_bytes,
    live_skip,
)
from dabench_ir.metrics import Metrics, compute_metrics
from dabench_ir.options import KNOBS
from dabench_ir.passes import meta
from dabench_ir.passes.precision import cache_inputs, reads_kv_cache
from dabench_ir.passes.training import (
    BACKWARD_COST,
    FORWARD_COST,
    SAVED,
    is_loss,
    is_optimizer_step,
    lm_logits,
    token_table,
)
from dabench_ir.place import place
from dabench_ir.plan import COLLECTIVES, GRADIENT_REDUCE, PIPELINE_BOUNDARIES, PIPELINE_FILL_DRAIN, row_bound
from dabench_ir.run import ResolvedRun, lowering_options, resolve

if TYPE_CHECKING:
    from dabench_ir.energy import MultiChipEnergy
    from dabench_ir.plan import Plan
    from dabench_ir.run import Placed
    from dabench_ir.targets import Link, Target
    from dabench_ir.timeline import Timeline

__all__ = [
    "EMBEDDING",
    "LM_HEAD",
    "SCALE_SCHEMA",
    "STRATEGIES",
    "ChipRun",
    "Collective",
    "ScalePoint",
    "ScaleResult",
    "allreduce_time",
    "broadcast_tree",
    "chips_per_node",
    "scale",
    "shard_optimizer_step",
    "split_for_tp",
]

logger = logging.getLogger(__name__)

SCALE_SCHEMA = "dabench-ir/scale/v1"
STRATEGIES = ("dp", "tp", "pp")


NODE_CROSSING = "crosses the node boundary"
"""How a point's note begins when its collectives or pipeline stages cross machines (`ScalePoint.crosses_nodes`)."""


@dataclass(slots=True)
class ScalePoint:
    """One chip count (and batch) of a scaling study."""

    chips: int
    batch: int
    time_s: float
    throughput_samples_per_s: float | None  # None when the point does not fit (no figure for a run that cannot happen)
    compute_time_s: float
    comm_time_s: float
    bubble_fraction: float = 0.0
    speedup: float | None = None
    scaling_efficiency: float | None = None
    base_samples: int | None = None  # the one chip's samples per step that ``speedup`` is over
    allocation_ratio: float | None = None
    load_imbalance: float | None = None
    compute_efficiency: float | None = None
    fits: bool = True
    failure: dict[str, Any] | None = None
    stages: list[list[int]] | None = None  # PP: the layers on each chip
    stage_times_s: list[float] | None = None  # PP: each stage's busy time a step (its micro-batches, in turn)
    dominant_bound: str | None = None  # the bound class (communication included) holding most of the step
    nodes: int = 1  # nodes the chips span (target topology); > 1: collectives cross the node boundary
    notes: list[str] = field(default_factory=list)
    # bytes one device holds: by kind (weights, gradients, kv_cache, ...; dp and pp points) or by memory
    # (a chip's placement: one chip, a tp share; ``sram:ipu2``, an IPU of a pipeline): `device_bytes` reads both
    memory_per_device: dict[str, int] | None = None
    micro_batches: int | None = None
    superlinear: str | None = None  # the mechanism that lets the speedup exceed the chips (verify.speedup_linear)
    chip: ChipRun | None = field(default=None, repr=False)  # one chip's placement (its nodes' times), not serialised
    # chips that each do the placement's work per step (DP replicas, TP shares; 1: it is the whole step)
    copies: int = 1
    devices: int = 1  # devices drawing power: the chips, the IPUs of a pipeline, the wafer on-wafer replicas share
    link_bytes: float = 0.0  # bytes the chip-to-chip links carry per step, all links together
    energy: MultiChipEnergy | None = None  # the step's energy on every device and link (`multi_chip_energy`)
    # seconds of the step beyond its chip's own timeline that no node owns, by name: the collectives a
    # tp or dp step waits for; under pp the pipeline's fill and drain and its stage boundaries
    overheads_s: dict[str, float] = field(default_factory=dict)

    @property
    def crosses_nodes(self) -> bool:
        """Whether the point's collectives or stage boundaries cross machines (its note says how)."""
        return any(note.startswith(NODE_CROSSING) for note in self.notes)

    @property
    def device_bytes(self) -> int | None:
        """Bytes the most loaded device holds: ``memory_per_device`` is one device's by kind (weights,
        gradients, ...) or by memory, or each device's by memory (``sram:ipu2``: one IPU's tile
        memory), summed per device; ``host`` is off the devices. None when the point states none."""
        if not self.memory_per_device:
            return None
        per_device: dict[str, int] = {}
        for key, held in self.memory_per_device.items():
            if key != "host":
                device = key.partition(":")[2]
                per_device[device] = per_device.get(device, 0) + held
        return max(per_device.values(), default=0)

    @property
    def comm_share(self) -> float:
        return self.comm_time_s / self.time_s if self.time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "chips": self.chips,
            "batch": self.batch,
            "time_s": self.time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "speedup": self.speedup,
            "scaling_efficiency": self.scaling_efficiency,
            "base_samples": self.base_samples,
            "compute_time_s": self.compute_time_s,
            "comm_time_s": self.comm_time_s,
            "comm_share": self.comm_share,
            "bubble_fraction": self.bubble_fraction,
            "allocation_ratio": self.allocation_ratio,
            "load_imbalance": self.load_imbalance,
            "compute_efficiency": self.compute_efficiency,
            "fits": self.fits,
            "failure": self.failure,
            "stages": self.stages,
            "stage_times_s": self.stage_times_s,
            "dominant_bound": self.dominant_bound,
            "nodes": self.nodes,
            "notes": self.notes,
            "memory_per_device": self.memory_per_device,
            "micro_batches": self.micro_batches,
            "superlinear": self.superlinear,
            "devices": self.devices,
            "link_bytes": self.link_bytes,
            "energy": None if self.energy is None else self.energy.to_dict(),
            "overheads_s": self.overheads_s,
        }


@dataclass(slots=True)
class ScaleResult:
    target: str
    strategy: str
    mode: str
    precision: str
    link: str | None
    points: list[ScalePoint]
    model: dict[str, Any] = field(default_factory=dict)
    devices_per_node: int | None = None  # the target's node size (None: no topology declared)
    chips_per_node: int | None = None  # the run's chips to a node (the knob; default the node size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCALE_SCHEMA,
            "model": self.model,
            "target": self.target,
            "strategy": self.strategy,
            "mode": self.mode,
            "precision": self.precision,
            "link": self.link,
            "devices_per_node": self.devices_per_node,
            "chips_per_node": self.chips_per_node,
            "points": [p.to_dict() for p in self.points],
        }


# -- single chip ------------------------------------------------------------------------


@dataclass(slots=True)
class ChipRun:
    """One chip's run of a scaling study, placed and summarised: its step, the figures a point reads
    (allocation, load imbalance, efficiency, the time per layer and per bound, what each memory holds),
    and the placement itself (``plan``, ``timeline``, ``metrics`` of ``graph``: the whole graph, a
    tensor-parallel share, or, under pp, the whole graph the stages are shares of). `ScalePoint.chip`."""

    time_s: float
    allocation: float | None
    li: float | None
    efficiency: float | None
    fits: bool
    failure: dict[str, Any] | None
    layer_time: dict[int | None, float]
    bound_time: dict[str, float]
    memory: dict[str, int] = field(default_factory=dict)  # resident bytes per memory of one device
    run: ResolvedRun | None = field(default=None, repr=False)  # the run placed, on the chip's graph (a TP share)
    graph: Graph | None = field(default=None, repr=False)  # ... with its plan, timeline and metrics
    plan: Plan | None = field(default=None, repr=False)
    timeline: Timeline | None = field(default=None, repr=False)
    metrics: Metrics | None = field(default=None, repr=False)

    def dominant_bound(self, comm_s: float = 0.0) -> str | None:
        """The bound class with the most time, communication (``comm_s``) included."""
        times = dict(self.bound_time)
        if comm_s > 0:
            times["communication"] = times.get("communication", 0.0) + comm_s
        return max(times, key=times.__getitem__) if times else None


def _run_one(graph: Graph, run: ResolvedRun) -> ChipRun:
    return _summarised(run, graph, *place(graph, run.target, lowering_options(run)))


def _summarised(run: ResolvedRun, graph: Graph, plan: Plan, timeline: Timeline, metrics: Metrics) -> ChipRun:
    """``run``'s placement on one chip of ``graph`` as the scaling stage reads it: its step, metrics
    and fit, its busy time by decoder layer and by bound (the timeline's rows no node owns as
    ``overhead``, as the report's shares count them, a gradient reduce among them as communication)."""
    per_layer: dict[int | None, float] = {}
    per_bound: dict[str, float] = {}
    for node in graph.nodes:
        busy = timeline.busy(node.name)
        if busy:
            per_layer[node.layer] = per_layer.get(node.layer, 0.0) + busy
            bound = timeline.nodes[node.name].bound
            if bound is not None:
                per_bound[str(bound)] = per_bound.get(str(bound), 0.0) + busy
    for name, seconds in (timeline.overheads_s or {}).items():
        if seconds:
            bound = row_bound(name)
            per_bound[bound] = per_bound.get(bound, 0.0) + seconds
    return ChipRun(
        time_s=timeline.step_time_s,
        allocation=metrics.allocation_ratio,
        li=metrics.load_imbalance,
        efficiency=metrics.compute_efficiency,
        fits=plan.fits,
        failure=plan.failure.to_dict() if plan.failure else None,
        layer_time=per_layer,
        bound_time=per_bound,
        memory=dict(plan.memory_bytes),
        run=run,
        graph=graph,
        plan=plan,
        timeline=timeline,
        metrics=metrics,
    )


def _one_chip(graph: Graph, run: ResolvedRun, baseline: Placed | None) -> ChipRun:
    """``run`` on one chip: ``baseline`` when it is that placement (``graph`` itself, placed for the
    same target with the same lowering options), else placed. A 10,000-layer GPT-2 tried over
    two H100s (the fitting search) placed its one-chip baseline again: a quarter of the profile."""
    same = (
        baseline is not None
        and baseline.run.target == run.target
        and lowering_options(baseline.run) == lowering_options(run)
        and baseline.graph is graph
    )
    if not same:
        return _run_one(graph, run)
    metrics = compute_metrics(graph, baseline.plan, baseline.timeline, run.target)
    return _summarised(run, graph, baseline.plan, baseline.timeline, metrics)


# -- collectives over the target's topology --------------------------------------------------


def chips_per_node(target: Target, options: Any = None) -> int | None:
    """How many of a run's chips share a node: the ``chips_per_node`` knob (a job spread over
    machines), else the target's ``[topology] devices_per_node``; None when the target declares
    no topology. A UserError for more than a node holds, or for a node size on a target without one."""
    given = getattr(options, "chips_per_node", None)
    topo = target.topology
    if topo is None:
        if given is not None:
            raise UserError(
                f"--chips-per-node {given}: {target.name} declares no [topology] (devices per node and "
                "the links inside and between nodes); drop it"
            )
        return None
    if given is not None and given > topo.per_node:
        raise UserError(
            f"--chips-per-node {given}: a {target.name} node holds {topo.per_node} devices "
            f"([topology] devices_per_node); give 1 to {topo.per_node}"
        )
    return given or topo.per_node


def tp_collective(target: Target) -> str:
    """How ``target``'s tensor-parallel compile reduces a split module's partial results: ``ring``
    (the default) or ``root`` (`root_allreduce_time`), from its ``[parallel] tp_collective``."""
    entry = (target.raw.get("parallel") or {}).get("tp_collective")
    value = entry.get("value") if isinstance(entry, dict) else entry
    return str(value or "ring")


def allreduce_time(
    target: Target, nbytes: float, chips: int, per_node: int | None = None, *, algorithm: str = "ring"
) -> float:
    """All-reduce of ``nbytes`` over ``chips`` of ``target``: hierarchical when they span nodes
    of its ``[topology]`` (``per_node`` of them to a node, default the target's node size), else a
    ring over its first link; ``algorithm`` ``root``: through one root device (`root_allreduce_time`)."""
    topo = target.topology
    if topo is not None:
        if algorithm == "root":
            return root_allreduce_time(nbytes, chips, per_node or topo.per_node, topo.intra, topo.inter)
        return hierarchical_allreduce_time(nbytes, chips, per_node or topo.per_node, topo.intra, topo.inter)
    link = target.link()
    if link is None:
        raise UserError(f"{target.name} declares no link; all-reduce across chips needs one")
    return ring_allreduce_time(nbytes, chips, link.bandwidth_bytes_per_s, link.latency_s)


# -- tensor parallel -----------------------------------------------------------------------


def _tp_module(node: Node, root: str) -> str | None:
    """The split module (``layers.3.attn``: an attention or MLP of the node's decoder block) a node
    belongs to, or None when it is replicated (norms, residual adds, everything outside the blocks);
    ``root``: its graph's `Graph.model_root`."""
    module = module_of(node.scope, root)
    if node.layer is None or module.index != node.layer or module.kind not in ("attention", "mlp"):
        return None
    return module.module


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective a tensor-parallel step runs ``count`` times over the chips: ``op`` ``all-reduce``
    (a split module's partial sums) or ``all-gather`` (the LM head's vocabulary slices), of a buffer
    of ``nbytes``, for ``module``."""

    op: str
    nbytes: int
    count: int
    module: str

    def time_s(self, target: Target, chips: int, per_node: int | None, algorithm: str) -> float:
        """Seconds of the ``count`` collectives on ``target`` (`allreduce_time`). An all-gather is the
        second half of a ring all-reduce (reduce-scatter, then all-gather: Patarasuk & Yuan 2009), so it
        takes half of one; through a root device (gather the slices in, send the whole out) it takes
        (1 + 1/n)/2 of one, taken as half."""
        one = allreduce_time(target, self.nbytes, chips, per_node, algorithm=algorithm)
        return self.count * (one / 2 if self.op == "all-gather" else one)

    def link_bytes(self, chips: int) -> float:
        """Bytes the links carry for the ``count`` collectives (`ring_allreduce_bytes`; an all-gather half)."""
        moved = ring_allreduce_bytes(self.nbytes, chips)
        return self.count * (moved / 2 if self.op == "all-gather" else moved)


LM_HEAD = "lm_head"
"""The module the LM head's collectives name (`Collective.module`), beside the blocks' ``layers.N.attn``."""
EMBEDDING = "embed"
"""The module a training step's token embedding, split over the vocabulary, names (`split_for_tp`)."""
LM_HEAD_LOSS_REDUCTIONS = 3
"""All-reduces of one fp32 per token the vocabulary-parallel cross-entropy runs in the forward pass: the
logits' maximum, the target token's logit and the sum of exponentials, each over the chips' vocabulary
slices (Megatron-LM, megatron/core/tensor_parallel/cross_entropy.py, `_VocabParallelCrossEntropy`)."""


class LmHead(NamedTuple):
    """The LM head `split_for_tp` splits over the vocabulary: its ``nodes``, the ``logits`` they write and
    the ``hidden`` state its contraction reads whole on every chip."""

    nodes: frozenset[str]
    logits: str
    hidden: str


def _moving_inputs(graph: Graph, node: Node) -> list[str]:
    """``node``'s inputs that are not stored (weights, constants)."""
    return [v for v in node.inputs if v and not graph.values[v].kind.is_stored]


def _lm_head(graph: Graph) -> LmHead | None:
    """The LM head, which tensor parallelism splits over the vocabulary (a column-parallel projection:
    Megatron-LM's output layer, TensorRT-LLM's ``lm_head`` with ``gather_output``, vLLM's
    ``ParallelLMHead``): the contraction that writes the logits (`passes.training.lm_logits`) outside the
    decoder blocks, a bias added to its output, the nodes that only reshape its weight (a Transpose),
    and the loss the training pass reads the logits with. None for a decoder stack without one."""
    logits = lm_logits(graph)
    value = graph.values.get(logits) if logits else None
    node = graph.node(value.producer) if value is not None and value.producer else None
    names: set[str] = set()
    while node is not None and node.layer is None:
        names.add(node.name)
        cost = meta.get_cost(node)
        if cost is not None and cost.contraction_flops > 0:
            break
        moving = _moving_inputs(graph, node)
        producer = graph.values[moving[0]].producer if len(moving) == 1 else None
        node = graph.node(producer) if producer else None
    else:
        return None  # no contraction writes the logits outside the blocks
    for name in node.inputs:
        prep = graph.values[name].producer if name else None
        if prep and not _moving_inputs(graph, graph.node(prep)):
            names.add(prep)  # the weight's own reshaping (a tied table's Transpose)
    names.update(n.name for n in graph.nodes if is_loss(n))
    hidden = next(iter(_moving_inputs(graph, node)), "")
    return LmHead(nodes=frozenset(names), logits=logits, hidden=hidden)


def split_for_tp(graph: Graph, chips: int) -> tuple[Graph, list[Collective]]:
    """One chip's share of ``graph`` under Megatron tensor parallelism, and the collectives a step runs.

    Returns a copy whose split nodes cost 1/chips of their FLOPs and weight bytes (and of
    the activation bytes they read from or write to other split nodes of the same module),
    and the step's collectives: an all-reduce per split attention and MLP module, of the value that
    leaves it (the row-parallel projection's partial sums), once more in training for the gradient of
    its input; and the LM head's (`_lm_head`), split over the vocabulary: serving all-gathers its
    logits, training runs the vocabulary-parallel loss's all-reduces (`LM_HEAD_LOSS_REDUCTIONS`) and,
    backward, one of the head's input gradient. In training the token embedding is split over the
    vocabulary too (Megatron-LM's ``VocabParallelEmbedding``: each chip holds 1/n of the table and its
    optimizer state, looks up the tokens in its rows, and one all-reduce of the output a step, forward
    only, sums the rows); serving keeps it whole on every chip (TensorRT-LLM's default,
    ``use_parallel_embedding`` off).
    """
    share = graph.clone()
    root = share.model_root
    train = meta.graph_mode(graph) == "train"
    head = _lm_head(share)
    split = dict.fromkeys(head.nodes if head else (), LM_HEAD)
    if train:
        split.update(dict.fromkeys(_token_embedding(share), EMBEDDING))
    module_of = {n.name: split.get(n.name) or _tp_module(n, root) for n in share.nodes}
    producer_module = {out: module_of[n.name] for n in share.nodes for out in n.outputs if out}
    leaving: dict[str, int] = {}  # split module -> bytes of the values that leave it
    caches = set(cache_inputs(share))
    kv = _kv_heads(share, caches)
    held = math.ceil(kv / chips) / kv if kv else 1 / chips  # the share of the cache a chip holds and reads
    for node in share.nodes:
        mod = module_of[node.name]
        cost = meta.get_cost(node)
        if mod is None or cost is None:
            continue
        inside_in = all(producer_module.get(v) == mod for v in node.inputs if v and v in producer_module)
        consumers = [c for out in node.outputs for c in share.consumers.get(out, ())]
        inside_out = bool(consumers) and all(module_of[c.name] == mod for c in consumers)
        inside_out = inside_out or mod == LM_HEAD  # each chip writes its slice of the vocabulary
        for key in (meta.COST, FORWARD_COST, BACKWARD_COST):  # the training phases' costs split too
            if isinstance(node.meta.get(key), Cost):
                node.meta[key] = _split_cost(node.meta[key], chips, inside_in, inside_out)
        cached = sum(value_bytes(graph, v) for v in node.inputs if v in caches)
        if cached and held > 1 / chips:  # a chip reads its whole K/V heads, not 1/chips of the cache
            node.meta[meta.COST] = node.meta[meta.COST] + Cost(act_bytes_in=math.ceil(cached * (held - 1 / chips)))
        if not inside_out:  # the module's result: partial sums, all-reduced across chips
            leaving[mod] = max(leaving.get(mod, 0), _leaving_bytes(graph, node, module_of, cost))
    for value in share.values.values():  # weights of split modules are sharded too, and the activations inside one
        # a weight, or a layout of one folded at compile time; a stored constant (a causal mask, a rotary
        # table) serves every head whole: each chip holds it all
        weight = value.kind.is_stored and share.values[stored_root(share, value.name)].kind is ValueKind.WEIGHT
        readers = [r for r in share.consumers.get(value.name, []) if not is_optimizer_step(r)]
        inner = value.producer is not None and module_of.get(value.producer) is not None and bool(readers)
        inner = inner and all(module_of[r.name] == module_of[value.producer] for r in readers)
        if (weight and readers and all(module_of[r.name] for r in readers)) or inner:
            shape = value.type.shape
            if shape and isinstance(shape[-1], int):
                mod = module_of[value.producer] if inner else module_of[readers[0].name]
                matrix = weight and len(shape) >= 2  # a weight, not a scale or a bias
                if shape[-1] % chips and matrix and mod not in (LM_HEAD, EMBEDDING):
                    raise UserError(
                        f"--strategy tp over {chips} chips: {value.name} ({shape[-1]} columns, in {mod}) does "
                        f"not split {chips} ways; give a chip count that divides the model's heads and widths"
                    )
                # a vocabulary that does not divide is padded to a multiple of the chips (Megatron-LM's
                # make-vocab-size-divisible-by), and the activations with it
                value.type = replace(value.type, shape=(*shape[:-1], -(-shape[-1] // chips)))
    for name in caches:
        _shard_cache_heads(share.values[name], chips)
    if kv:  # a K/V head copied on several chips serves only each chip's own query heads
        meta.graph_set(share, meta.CACHE_GROUP_SHARE, kv / (chips * math.ceil(kv / chips)))
    _shard_training_state(graph, share, producer_module, chips)
    passes = 2 if train else 1  # backward: each split module's input gradient (token ids have none)
    collectives = [
        Collective(op="all-reduce", nbytes=b, count=1 if mod == EMBEDDING else passes, module=mod)
        for mod, b in leaving.items()
    ]
    return share, collectives + (_lm_head_collectives(graph, head, passes) if head else [])


def attention_heads(graph: Graph) -> int | None:
    """The model's (query) attention heads: its width, the token table's last dim, over a head's, the
    last dim of the query operand of the first activation-by-activation MatMul (the scores,
    ``[batch, heads, seq, head_dim]`` or a grouped layout of it); None where either is not known."""
    table, _ = token_table(graph)
    width = graph.type_of(table).shape[-1] if table is not None and graph.type_of(table).shape else None
    for node in graph.nodes:
        if node.op_type != "MatMul":
            continue
        operands = [graph.values.get(v) for v in node.inputs[:2]]
        if all(v is not None and not v.kind.is_stored and v.type.shape and len(v.type.shape) == 4 for v in operands):
            head = operands[0].type.shape[-1]
            ok = isinstance(width, int) and isinstance(head, int) and head > 0 and width % head == 0
            return width // head if ok else None
    return None


def _token_embedding(graph: Graph) -> set[str]:
    """The nodes that look tokens up in the token-embedding table (`passes.training.token_table`)."""
    table, _ = token_table(graph)
    if table is None:
        return set()
    return {n.name for n in graph.nodes if n.op_type == "Gather" and n.inputs[0] == table}


def _lm_head_collectives(graph: Graph, head: LmHead, passes: int) -> list[Collective]:
    """The collectives of the LM head split over the vocabulary (`split_for_tp`): serving, an
    all-gather of its logits; training, the loss's all-reduces of one fp32 per token, and backward one
    of the head's input gradient (the hidden state each chip read whole)."""
    if passes == 1:
        return [Collective(op="all-gather", nbytes=value_bytes(graph, head.logits), count=1, module=LM_HEAD)]
    tokens = math.prod(graph.type_of(head.logits).dims()[:-1])
    return [
        # one fp32 a token each
        Collective(op="all-reduce", nbytes=4 * tokens, count=LM_HEAD_LOSS_REDUCTIONS, module=LM_HEAD),
        Collective(op="all-reduce", nbytes=value_bytes(graph, head.hidden), count=1, module=LM_HEAD),
    ]


def _kv_heads(graph: Graph, caches: set[str]) -> int | None:
    """A decode graph's K/V heads (dim 1 of its cache inputs), None when not known or not one count. A
    chip holds and reads ceil(kv / chips) of them (`_shard_cache_heads`): more than 1/chips of the cache
    when there are fewer heads than chips (over 16 GPUs each reads the whole of one of LLaMA 70B's 8
    heads: it had read half of one)."""
    heads = {graph.values[name].type.shape[1] for name in caches if _cache_heads_known(graph.values[name])}
    return heads.pop() if len(heads) == 1 else None


def _cache_heads_known(value: Value) -> bool:
    shape = value.type.shape
    return shape is not None and len(shape) >= 2 and isinstance(shape[1], int)


def _shard_cache_heads(value: Value, chips: int) -> None:
    """One chip's share of a decode graph's KV-cache input: its K/V heads (dim 1 of the cache,
    [batch, heads, ...]) split over the chips, a head kept whole on each chip that reads it. With fewer
    K/V heads than chips (grouped-query attention at a high TP degree) every chip keeps one, copied on
    chips / heads of them: TensorRT-LLM's runtime sizes each rank's cache at ceil(kv_heads / tp)
    heads (NVIDIA/TensorRT-LLM tensorrt_llm/runtime/model_runner.py at 0243026,
    `_engine_config_to_model_config`: ``num_kv_heads = (num_kv_heads + tp_size - 1) // tp_size``).
    A cache whose head dim is not known is left whole."""
    if _cache_heads_known(value):
        dims = list(value.type.shape)
        dims[1] = math.ceil(dims[1] / chips)
        value.type = replace(value.type, shape=tuple(dims))


def _leaving_bytes(graph: Graph, node: Node, module_of: dict[str, str | None], cost: Cost) -> int:
    """Bytes of the values ``node`` hands out of its split module: one forward activation each, in
    its own dtype (bf16 under mixed precision). Not the node's cost: in training that sums the
    forward and backward traffic. Its forward cost's output bytes when no shape is known."""
    mod = module_of[node.name]
    out = 0
    for v in node.outputs:
        if v and any(module_of.get(c.name) != mod for c in graph.consumers.get(v, ())):
            out += value_bytes(graph, v)
    if out:
        return out
    fwd = node.meta.get(FORWARD_COST)
    return (fwd if isinstance(fwd, Cost) else cost).act_bytes_out


def _split_cost(cost: Cost, chips: int, inside_in: bool, inside_out: bool) -> Cost:
    """One chip's share of a split node's cost: work and weights over ``chips``, activations
    too where they stay inside the module."""
    return Cost(
        contraction_flops=math.ceil(cost.contraction_flops / chips),
        vector_flops=math.ceil(cost.vector_flops / chips),
        special_ops=math.ceil(cost.special_ops / chips),
        weight_bytes=math.ceil(cost.weight_bytes / chips),
        act_bytes_in=math.ceil(cost.act_bytes_in / chips) if inside_in else cost.act_bytes_in,
        act_bytes_out=math.ceil(cost.act_bytes_out / chips) if inside_out else cost.act_bytes_out,
    )


def shard_optimizer_step(graph: Graph, frac: float) -> None:
    """Scale the optimizer step's cost in ``graph`` to the ``frac`` of the parameters one chip
    updates (its FLOPs and the states it reads and writes: a memory-bound pass over them)."""
    for node in graph.nodes:
        cost = meta.get_cost(node)
        if is_optimizer_step(node) and cost is not None:
            node.meta[meta.COST] = Cost(
                vector_flops=math.ceil(cost.vector_flops * frac),
                special_ops=math.ceil(cost.special_ops * frac),
                weight_bytes=math.ceil(cost.weight_bytes * frac),
                act_bytes_out=math.ceil(cost.act_bytes_out * frac),
            )


def _shard_training_state(graph: Graph, share: Graph, producer_module: dict[str, str | None], chips: int) -> None:
    """Tensor parallelism shards the training state with the weights: gradients, master weights
    and moments follow the parameters each chip keeps; saved activations produced inside a
    split module are split too, those of norms and residuals are replicated (Korthikanti et
    al., MLSys 2023, without sequence parallelism: sbh·(10 + 24/t + 5as/(ht)) per layer)."""
    train = meta.training_state(share)
    if train is None:
        return
    before, after = graph.num_params, share.num_params  # None where a weight's shape is symbolic
    if before is None or after is None:
        return
    frac = after / before if before else 1.0
    saved: dict[str, int] = {}
    for node in share.nodes:
        for value, nbytes in (node.meta.get(SAVED) or {}).items():
            split = producer_module.get(value.split("#")[0]) is not None  # made inside a split module
            saved[value] = math.ceil(nbytes / chips) if split else nbytes
    shared = replace(
        train,
        gradient_bytes=math.ceil(int(train.gradient_bytes) * frac),
        master_weight_bytes=math.ceil(int(train.master_weight_bytes) * frac),
        optimizer_state_bytes=math.ceil(int(train.optimizer_state_bytes) * frac),
        params=after,
    )
    shard_optimizer_step(share, frac)  # the optimizer updates only this chip's shard
    if saved and train.recompute_mode != "full":
        shared = replace(shared, saved_activation_bytes=sum(saved.values()))
    elif saved:
        kept = sum(v for n in share.nodes for v in (n.meta.get(SAVED) or {}).values())
        shared = replace(
            shared,
            saved_activation_bytes=math.ceil(int(train.saved_activation_bytes) * sum(saved.values()) / max(1, kept)),
        )
    meta.graph_set(share, meta.TRAINING, shared)


# -- pipeline parallel -----------------------------------------------------------------------


def pipeline_micro_batches(run: ResolvedRun, stages: int, *, train: bool) -> int:
    """The micro-batches a ``pp`` step streams through its ``stages``: the run's (`Samples` holds that
    they divide the batch), else, in training, one a sample (1F1B at a micro-batch of one sample), and
    in inference as many as there are stages, the batch shared among them (the largest divisor of the
    batch up to the stages). A serving engine keeps one batch in flight per stage: vLLM runs
    ``pipeline_parallel_size`` virtual engines, each scheduling its own batch as one micro-batch
    (vllm-project/vllm-gaudi, docs/configuration/pipeline_parallelism.md). One a sample there would
    read each stage's weights once per request in a decode step: 16 requests over 2 H100s took 6.6 s
    to generate 128 tokens where one H100 takes 0.97 s."""
    if run.samples.micro_batches:
        return run.samples.micro_batches
    batch = max(1, run.samples.per_replica)
    if train:
        return batch
    return max(m for m in range(1, min(stages, batch) + 1) if batch % m == 0)


def _pp_point(graph: Graph, run: ResolvedRun, chips: int, single: ChipRun, staged: ChipRun) -> ScalePoint:
    """``chips`` pipeline stages of contiguous decoder blocks under 1F1B with the run's micro-batches:
    the fill and drain, the boundary traffic, and whether the fullest stage fits its chip.

    The stages and their times come from ``staged``, the whole graph on one chip running the
    micro-batches one after another (`pipeline_micro_batches`: each re-reads the weights its nodes
    stream, as a stage does), so a stage's time for one micro-batch is its share over them; dividing
    the whole batch's time (``single``'s) instead made a weight-bound decode step over 2 H100s faster
    than reading the weights once. ``single``, the one-chip run the speedups are over, gives the
    optimizer update."""
    target = run.target
    layers = graph.layers
    if len(layers) < chips:
        raise UserError(
            f"--strategy pp over {chips} chips needs at least {chips} decoder blocks; the model has {len(layers)}"
        )
    stages, stage_times = _pp_stages(staged, layers, chips)
    worst = max(stage_times)
    batch = run.samples.per_replica
    train = meta.graph_mode(graph) == "train"
    m = pipeline_micro_batches(run, chips, train=train)
    link = target.link()
    # each boundary carries a micro-batch's activations forward and, in training, their gradients back
    boundary_bytes = [b * (2 if train else 1) for b in _boundary_bytes(graph, stages)]
    comm = 0.0
    if link is not None and chips > 1:
        per_node = chips_per_node(target, run.options)
        links = [_stage_link(target, i, per_node) for i in range(len(boundary_bytes))]
        comm = m * sum(
            p2p_time(b / m, link.bandwidth_bytes_per_s, link.latency_s)
            for b, link in zip(boundary_bytes, links, strict=True)
        )
    # after the last micro-batch's backward every stage updates its own weights, all at once
    ctx = LoweringContext.build(graph, lowering_options(run).precision)
    sharers = _host_sharers(run, chips)
    update = max(_stage_weight_share(ctx, nodes) for nodes in _pp_stage_nodes(graph, stages)) * _update_s(
        single, sharers
    )
    fill_drain = _pipeline_bubble(graph, chips, m, worst, train=train)
    step = worst + fill_drain + update + _once_a_step_s(staged) + comm
    fits, failure, worst_memory = _pp_stage_memory(ctx, run, stages, chips, m, sharers)
    return ScalePoint(
        chips=chips,
        batch=batch,
        time_s=step,
        throughput_samples_per_s=batch / step if step > 0 and fits else None,
        compute_time_s=step - comm,
        comm_time_s=comm,
        # the idle share charged: GPipe's (p - 1) / (m + p - 1) for a step that fills and drains, a
        # decode step's (p - m) / p (none with a micro-batch a stage), `_pipeline_bubble`
        bubble_fraction=fill_drain / (worst + fill_drain) if worst + fill_drain > 0 else 0.0,
        load_imbalance=(sum(stage_times) / chips) / worst if worst > 0 else 1.0,
        allocation_ratio=staged.allocation,
        compute_efficiency=None,
        fits=fits,
        failure=failure,
        stages=stages,
        stage_times_s=stage_times,
        dominant_bound=staged.dominant_bound(comm),
        notes=[
            f"{m} micro-batch{'es' if m != 1 else ''}, each reading its stage's weights (--micro-batches N sets how many)"
        ],
        memory_per_device=worst_memory,
        micro_batches=m,
        overheads_s={
            name: seconds
            for name, seconds in ((PIPELINE_FILL_DRAIN, fill_drain), (PIPELINE_BOUNDARIES, comm))
            if seconds
        },
        # the whole graph on one chip running the micro-batches in turn: the stages are its layers'
        # shares, its node rows theirs (a stage's rows sum to its time)
        chip=staged,
        copies=1,  # ... so its work is the whole step's, done once over the stages
        devices=chips,
        link_bytes=float(sum(boundary_bytes)),
    )


def _pipeline_bubble(graph: Graph, stages: int, micro_batches: int, busiest_s: float, *, train: bool) -> float:
    """The time a ``pp`` step's stages wait beyond the busiest one's ``busiest_s`` of work.

    A step that is done once (a training step, flushed before its update; a prefill; a forward) fills
    and drains: the other stages' share of its first and last micro-batch, (stages - 1) micro-batch
    times. A decode step of a generation does not: each micro-batch's next token enters the first
    stage as soon as its last one leaves the last, so with as many micro-batches as stages the stages
    never wait (a serving engine's steady state), and with fewer, a token takes a turn through every
    stage, the busiest waiting (stages - micro-batches) micro-batch times."""
    per_micro_batch = busiest_s / micro_batches
    if train or not reads_kv_cache(graph):
        return (stages - 1) * per_micro_batch
    return max(0, stages - micro_batches) * per_micro_batch


def _pp_stages(single: ChipRun, layers: list[int], chips: int) -> tuple[list[list[int]], list[float]]:
    """The blocks of each stage (the contiguous split that minimises the slowest stage's time) and
    each stage's time a step's micro-batches take on it: its blocks', on the first stage what runs
    before the blocks (the embedding) and on the last what runs after them (the head), as
    `_pp_stage_nodes` holds them (the optimizer update, once a step, is `_update_s`), and on a
    host-issued target the stream's wait for the host shared by work."""
    loads = [single.layer_time.get(layer, 0.0) for layer in layers]
    before, after = _outside_s(single)
    loads[0] += before  # the first stage holds the first block, and the embedding with it
    loads[-1] += after  # the last stage the last block and the head: the split weighs both
    starts, _ = optimal_contiguous_split(loads, chips)
    stage_times = [sum(loads[a:b]) for a, b in itertools.pairwise([*starts, len(layers)])]
    stages = [layers[a:b] for a, b in itertools.pairwise([*starts, len(layers)])]
    wait = single.plan.step_overheads_s.get(HOST_ISSUE, 0.0) if single.plan is not None else 0.0
    if wait > 0:  # each stage's host issues its own kernels: the stream's wait for them, shared by work
        total = sum(stage_times) or 1.0
        stage_times = [t + wait * t / total for t in stage_times]
    return stages, stage_times


def _outside_nodes(nodes: Sequence[Node]) -> tuple[list[Node], list[Node]]:
    """The nodes outside the decoder blocks, the optimizer left out (`_update_s`): those before the
    first block (the embedding: the first pipeline stage's) and those after it (the head, the loss:
    the last stage's), one rule for where a stage's time (`_pp_stages`) and memory
    (`_pp_stage_nodes`) put them."""
    before, after = outside_blocks(nodes)
    return [n for n in before if not is_optimizer_step(n)], [n for n in after if not is_optimizer_step(n)]


def _outside_s(single: ChipRun) -> tuple[float, float]:
    """Busy seconds of the one-chip run's nodes outside the blocks, before and after them (`_outside_nodes`)."""
    if single.graph is None or single.timeline is None:
        return 0.0, 0.0
    busy = single.timeline.busy
    before, after = _outside_nodes(single.graph.nodes)
    return sum(busy(n.name) for n in before), sum(busy(n.name) for n in after)


def _optimizer_s(single: ChipRun) -> float:
    """Seconds the one-chip run's optimizer update is busy (it runs once a step)."""
    if single.graph is None or single.timeline is None:
        return 0.0
    return sum(single.timeline.busy(n.name) for n in single.graph.nodes if is_optimizer_step(n))


def _once_a_step_s(run: ChipRun) -> float:
    """Seconds of the one-chip run's step costs that a pipeline's step pays once, beside its stages:
    every step overhead of its plan but the host's issue wait (shared into the stages: `_pp_stages`)
    and the update's copies (`_update_s`), such as a decode step's framework cost (``decode_step``)."""
    rows = run.plan.step_overheads_s if run.plan is not None else {}
    return sum(
        seconds for name, seconds in rows.items() if name not in (HOST_ISSUE, OFFLOAD_GRADIENTS, OFFLOAD_WEIGHTS)
    )


def _update_s(single: ChipRun, sharers: int = 1) -> float:
    """Seconds the one-chip run's weight update takes a step: the optimizer and, when its state is
    offloaded to the host, the copies over PCIe no computation hides (`lowering.gpu.Offload`). With
    ``sharers`` GPUs offloading at once each host-run update streams through its share of the host's
    DRAM (the one-chip run had all of it: `_host_sharers`); each GPU's copies cross its own link."""
    rows = single.plan.step_overheads_s if single.plan is not None else {}
    return _optimizer_s(single) * sharers + rows.get(OFFLOAD_GRADIENTS, 0.0) + rows.get(OFFLOAD_WEIGHTS, 0.0)


def _host_sharers(run: ResolvedRun, chips: int) -> int:
    """The devices of a ``chips``-chip run that share one host's memory when the lowering offloads
    the optimizer state there (`Lowering.offloads_optimizer`): the run's chips on a node; 1 otherwise."""
    if not lowering_for(run.target).offloads_optimizer(lowering_options(run)):
        return 1
    per_node = chips_per_node(run.target, run.options)
    return min(chips, per_node) if per_node else chips


def _sharing_host(run: ResolvedRun, sharers: int) -> ResolvedRun:
    """``run`` as one of ``sharers`` GPUs offloading to one host (the GPU lowering's internal ``host_sharers``)."""
    return run if sharers == 1 else replace(run, internals={**run.internals, "host_sharers": sharers})


def _pp_stage_nodes(graph: Graph, stages: list[list[int]]) -> list[list[Node]]:
    """The nodes each pipeline stage holds, in graph order: its blocks', the embedding (what runs
    before the first block) on the first stage and the head (what runs after the last) on the last,
    as `_pp_stages` times them; a head tied to the embedding holds its copy there (Megatron-LM's
    pipeline keeps the tied word embeddings on both end stages). The optimizer update is every
    stage's, over its own weights."""
    before, after = _outside_nodes(graph.nodes)
    end_of = {n.name: 0 for n in before} | {n.name: len(stages) - 1 for n in after}
    stage_of = {layer: i for i, st in enumerate(stages) for layer in st}
    out: list[list[Node]] = [[] for _ in stages]
    for node in graph.nodes:
        k = stage_of.get(node.layer) if node.layer is not None else end_of.get(node.name)
        if k is not None:
            out[k].append(node)
    return out


def _stage_weight_share(ctx: LoweringContext, nodes: list[Node]) -> float:
    """The share of the model's weights a stage's ``nodes`` hold."""
    return weight_bytes(ctx, nodes) / ctx.total_weight_bytes if ctx.total_weight_bytes else 1.0


def _pp_stage_memory(
    ctx: LoweringContext, run: ResolvedRun, stages: list[list[int]], chips: int, m: int, sharers: int = 1
) -> tuple[bool, dict[str, Any] | None, dict[str, int] | None]:
    """Whether every stage fits its chip's memory: the stage's weights and training state, under
    1F1B the activations of the micro-batches in flight on it (stage i holds min(p - i, m) of them;
    Narayanan et al., SC'21), and the working set of the micro-batch it runs (``live``, as a
    one-chip run counts it: `lowering.gpu.live_bytes` over the stage's nodes); an offloaded
    optimizer state, its share of the host's memory, which ``sharers`` stages split. Returns (fits,
    the first stage's failure, the fullest stage's parts up to it)."""
    target, graph = run.target, ctx.graph
    layers = graph.layers
    mem = target.feed_memory
    state = training_state(ctx)
    worst_memory: dict[str, int] | None = None
    offload = lowering_for(target).offloads_optimizer(lowering_options(run))
    skip = live_skip(ctx)  # of the whole graph, once: each stage's working set leaves the same values out
    for i, (st, nodes) in enumerate(zip(stages, _pp_stage_nodes(graph, stages), strict=True)):
        part = training_state(ctx, nodes)
        in_flight = min(chips - i, m)
        acts = math.ceil(state.activations * len(st) / max(len(layers), 1) * in_flight / m)
        parts = {
            "weights": weight_bytes(ctx, nodes),
            "gradients": part.gradients,
            "optimizer": 0 if offload else part.optimizer_side,
            "activations": acts,
            "kv_cache": cache_bytes(ctx, nodes),  # every sequence's, whatever the micro-batches
            "live": live_bytes(ctx, nodes, skip, micro_batches=m),
        }
        if offload:  # the stage's optimizer state lives in its share of the host's memory
            parts["host"] = part.optimizer_side
        need = sum(v for k, v in parts.items() if k != "host")
        if worst_memory is None or need > sum(v for k, v in worst_memory.items() if k != "host"):
            worst_memory = parts
        stage = f"stage {i} (layers {st[0]}-{st[-1]})"
        if need > mem.capacity_bytes:
            failure = {
                "reason": f"{stage} needs {need / 1e9:.2f} GB of {mem.name}, "
                f"{target.name} has {mem.capacity_bytes / 1e9:.2f} GB",
                "needed_bytes": need,
                "capacity_bytes": int(mem.capacity_bytes),
            }
            return False, failure, worst_memory
        short = host_shortfall(target, parts["host"], sharers, f"{stage}'s") if offload else None
        if short is not None:
            return False, short.to_dict(), worst_memory
    return True, None, worst_memory


def _stage_link(target: Target, boundary: int, per_node: int | None = None) -> Link:
    """The link between pipeline stage ``boundary`` and the next: the inter-node link
    where the boundary falls between two nodes of the target's topology (``per_node`` stages to a
    node, default the target's node size), else the first link."""
    topo = target.topology
    if topo is not None:
        k = per_node or topo.per_node
        link = topo.inter if (boundary + 1) % k == 0 and topo.inter is not None else topo.intra
    else:
        link = target.link()
    return link


def _boundary_bytes(graph: Graph, stages: Sequence[Sequence[int]]) -> list[int]:
    """Bytes crossing each stage boundary: values produced in one stage and read in a later one."""
    stage_of = {layer: i for i, st in enumerate(stages) for layer in st}
    crossing = [0] * max(len(stages) - 1, 0)
    for node in graph.nodes:
        src = stage_of.get(node.layer)
        if src is None:
            continue
        for out in node.outputs:
            readers = {stage_of.get(c.layer) for c in graph.consumers.get(out, ())} - {None, src}
            if readers:
                # a size the shapes do not give: the producer's share of what its cost writes, never 0
                cost = meta.attributed_cost(node)
                share = cost.act_bytes_out // max(1, len(node.outputs)) if cost is not None else 0
                nbytes = value_bytes(graph, out, default=share)
                for boundary in range(src, max(readers)):
                    if boundary < len(crossing):
                        crossing[boundary] += nbytes
    return crossing


# -- driver ------------------------------------------------------------------------------------


def _gradient_bytes(graph: Graph) -> int:
    """Bytes of one full gradient, as the training pass records them (its one owner)."""
    train = meta.training_state(graph)
    return int(train.gradient_bytes) if train is not None else 0


def scale(
    graph: Graph,
    target: Target,
    chips: Sequence[int],
    strategy: str,
    options: Any = None,
    *,
    baseline: Placed | None = None,
) -> ScaleResult:
    """Throughput, speedup and efficiency of ``graph`` (costed for the run) on 1..n chips of ``target``.

    ``options``: the `ResolvedRun` (`dabench_ir.run.execute` and ``scale`` pass theirs), or an
    options object taken as it is (no target defaults applied). Each chip count is a variant of
    the run (``replicas``, ``ipus``, the lowering's internal ``systems``). Under ``pp`` the run's
    micro-batches are the pipeline's, and each chip's lowering runs without them.

    ``baseline``: a one-chip placement of the same graph the caller holds already (the fitting
    search's own report, tried over more chips): the speedups' baseline when it answers the same
    one-chip question (`_one_chip`), not placed again.
    """
    run = options if isinstance(options, ResolvedRun) else resolve(graph, target, options, defaults=False)
    lowering = lowering_for(target)
    per_node = chips_per_node(target, run.options)
    _check_request(target, lowering, chips, strategy, per_node)
    _check_devices(run, target, lowering, strategy)
    train = meta.graph_mode(graph) == "train"
    link = target.link()
    systems = strategy == "dp" and lowering.systems_stream_weights  # n chips: n systems streaming the weights
    if systems and max(chips) > 1:
        lowering_options(_on_systems(run, max(chips)))  # the lowering refuses a mode that runs on one system
        _tree_link(target)
    if systems and target.topology is not None and target.topology.inter is not None:
        link = target.topology.inter  # what joins the systems: the tree's links
    own_links = systems or (strategy == "pp" and lowering.pipelines_itself)  # not the links between nodes
    chip_run = run.variant(micro_batches=None) if strategy == "pp" and not lowering.pipelines_itself else run
    single = _one_chip(graph, chip_run, baseline)
    per_step = single.plan.samples_per_step if single.plan is not None else run.samples.per_replica
    points: list[ScalePoint] = []
    staged: dict[int, ChipRun] = {}  # pp: the one-chip run of the pipeline's micro-batches, by their count
    for n in chips:
        if n == 1:
            pt = _point_from_run(single, 1, per_step, comm=0.0)
            if systems:
                _store_apart(pt, target, 1)
        elif systems:
            pt = _systems_point(graph, chip_run, n, single, train)
        elif strategy == "dp" and lowering.replicates_itself:
            pt = _replicas_point(graph, chip_run, n, lowering.name)
        elif strategy == "dp":
            pt = _dp_point(graph, chip_run, n, single, train)
        elif strategy == "tp":
            pt = _tp_point(graph, chip_run, n, train)
        elif lowering.pipelines_itself:
            one = _run_one(graph, run.variant(ipus=n))
            pt = _point_from_run(one, n, one.plan.samples_per_step, comm=0.0, link_bytes=one.plan.stats.link_bytes)
            pt.notes.append(f"the {lowering.name} lowering pipelines the blocks over the devices itself")
        else:
            m = pipeline_micro_batches(run, n, train=train)
            if m not in staged:  # placed once a study: the chip counts streaming as many micro-batches share it
                staged[m] = single if m <= 1 else _run_one(graph, chip_run.variant(micro_batches=m))
            pt = _pp_point(graph, run, n, single, staged[m])
        if target.topology is not None:
            _place_on_nodes(pt, n, target.topology, per_node, strategy, own_links=own_links)
        points.append(pt)
    # one chip's rate, the speedups' base: none where one chip cannot hold the run (no throughput
    # for a configuration that does not fit, so none to be a multiple of)
    base = single.time_s and single.fits and per_step / single.time_s
    for pt in points:
        pt.base_samples = per_step
        if base and pt.throughput_samples_per_s is not None:
            pt.speedup = pt.throughput_samples_per_s / base
            pt.scaling_efficiency = pt.speedup / pt.chips
        elif not single.fits and pt.fits:
            pt.notes.append("no speedup: one chip does not hold the run, so it has no rate to be a multiple of")
        pt.energy = _point_energy(pt, target, link)
    precision = run.options.precision or lowering_options(run).precision  # as asked: mixed, not its bf16 compute
    if link is None and any(p.comm_time_s for p in points):
        logger.warning("%s has no link declared; communication is free", target.name)
    return ScaleResult(
        target=target.name,
        strategy=strategy,
        mode="train" if train else "inference",
        precision=str(precision) if precision else "model",
        link=link.name if link is not None else None,
        points=points,
        devices_per_node=target.topology.per_node if target.topology is not None else None,
        chips_per_node=per_node,
    )


def _check_request(target: Target, lowering: Any, chips: Sequence[int], strategy: str, per_node: int | None) -> None:
    """What a scale question cannot ask: an unknown strategy, one the target does not support past
    one chip, a chip count below one, a self-pipelining lowering's pipeline spread over machines."""
    if strategy not in STRATEGIES:
        raise UserError(f"--strategy {strategy}: expected one of {', '.join(STRATEGIES)}")
    supported = tuple(target.strategies)
    if strategy not in supported and any(n > 1 for n in chips):
        have = ", ".join(supported) or "none"
        raise UserError(f"{target.name} does not support --strategy {strategy}; it supports: {have}")
    if any(n < 1 for n in chips):
        raise UserError("--chips: chip counts must be positive integers")
    if per_node is not None and per_node < target.topology.per_node and strategy == "pp" and lowering.pipelines_itself:
        raise UserError(
            f"--chips-per-node {per_node}: the {lowering.name} lowering places its own pipeline inside one "
            f"node of {target.topology.per_node} ([topology] devices_per_node); a pipeline spread over "
            "nodes is not modelled there: drop --chips-per-node"
        )


def _check_devices(run: ResolvedRun, target: Target, lowering: Any, strategy: str) -> None:
    """The lowering's own device knobs a scale question cannot also ask. Where the lowering places its
    devices itself (`Lowering.pipelines_itself`, `Lowering.replicates_itself`: the IPU's ``--ipus``,
    ``--layers-per-ipu`` and ``--replicas``), the chips counted by ``--chips`` are its devices: under
    ``dp`` its replicas (each may still pipeline over ``--ipus`` of its own), under ``pp`` its
    pipeline's, under ``tp`` one each. A knob beside them made each "chip" several devices (pp over a
    1-chip baseline pipelined over 4 IPUs: 0.45x on 2 chips; tp over replicas: 1.34x on 2)."""
    if not (lowering.pipelines_itself or lowering.replicates_itself):
        return
    refused = ("replicas",) if strategy == "dp" else ("ipus", "layers_per_ipu", "replicas")
    for name in refused:
        value = run.knob(name)
        if run.sources.get(name) == "user" and value not in (None, 1):
            flag = KNOBS[name].flag
            given = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            raise UserError(
                f"{flag} {given} with --strategy {strategy}: on {target.name} the chips are the {lowering.name} "
                f"lowering's own devices ({'its replicas' if strategy == 'dp' else 'one a chip'}), counted by "
                f"--chips; drop {flag}"
            )


def _place_on_nodes(pt: ScalePoint, chips: int, topo: Any, per_node: int, strategy: str, *, own_links: bool) -> None:
    """The machines a point's ``chips`` span (``per_node`` to a node), and a note where its traffic
    crosses between them: stage boundaries under ``pp``, collectives under ``dp`` and ``tp``. None
    where the lowering carries the traffic over links of its own (``own_links``: the systems'
    weight-streaming tree, the IPU's pipeline over its IPU-Links)."""
    pt.nodes = max(1, math.ceil(chips / per_node))
    if pt.nodes == 1 or own_links:
        return
    between = topo.inter.name if topo.inter else topo.intra.name
    if strategy == "pp":
        pt.notes.append(
            f"{NODE_CROSSING}: {pt.nodes} nodes of {per_node}; stage boundaries between nodes go over {between}"
        )
    elif strategy in ("dp", "tp") and pt.comm_time_s > 0:
        pt.notes.append(
            f"{NODE_CROSSING}: {pt.nodes} nodes of {per_node} "
            f"(collectives over {topo.intra.name} inside a node, {between} between)"
        )


def _point_energy(pt: ScalePoint, target: Target, link: Any) -> MultiChipEnergy | None:
    """The point's step energy on every device and link, from its chip's placement (None: no placement)."""
    from dabench_ir.energy import multi_chip_energy, step_energy

    chip = pt.chip
    if chip is None or chip.plan is None or chip.timeline is None:
        return None
    feed = chip.metrics.node_feed_bytes if chip.metrics is not None else None
    one = step_energy(chip.graph, chip.plan, chip.timeline, target, feed)
    return multi_chip_energy(
        one,
        target,
        copies=pt.copies,
        devices=pt.devices,
        step_s=pt.time_s,
        link_bytes=pt.link_bytes,
        link=None if link is None else link.name,
    )


def _point_from_run(
    run: ChipRun,
    chips: int,
    batch: int,
    comm: float,
    *,
    copies: int = 1,
    link_bytes: float = 0.0,
    comm_within: float = 0.0,
) -> ScalePoint:
    """The point of ``chips`` whose step is ``copies`` chips each running ``run``'s placement, then ``comm``
    seconds of collectives moving ``link_bytes`` (the devices: ``copies`` x the chips the placement spans).
    ``comm_within``: seconds of the placement's own step that are collectives (a lowering that reduces
    over its replicas itself), counted as communication, not compute."""
    step = run.time_s + comm
    return ScalePoint(
        chips=chips,
        batch=batch,
        time_s=step,
        throughput_samples_per_s=batch / step if step > 0 and run.fits else None,
        compute_time_s=run.time_s - comm_within,
        comm_time_s=comm + comm_within,
        allocation_ratio=run.allocation,
        load_imbalance=run.li,
        # a chip's FLOPs over its peak for the whole step, collectives included (over its placement's
        # own time it read 20.8 % on 2 tensor-parallel H100s where the step holds 13.6 %)
        compute_efficiency=run.efficiency * run.time_s / step if run.efficiency is not None and step > 0 else None,
        fits=run.fits,
        failure=run.failure,
        dominant_bound=run.dominant_bound(comm),  # ``comm_within``: its timeline's reduce, counted there
        memory_per_device=dict(run.memory) or None,
        chip=run,
        copies=copies,
        devices=copies * (run.plan.chips if run.plan is not None else 1),
        link_bytes=link_bytes,
        overheads_s={COLLECTIVES: comm} if comm else {},  # ``comm_within`` is a row of the chip's timeline
    )


def _replicas_point(graph: Graph, run: ResolvedRun, n: int, lowering: str) -> ScalePoint:
    """``n`` data-parallel replicas placed by a lowering that places them itself
    (`Lowering.replicates_itself`): its plan with ``replicas`` n, each replica running the graph's
    batch (weak scaling). The placement is the whole step's work, on every device the replicas span;
    its gradient all-reduce (the ``gradient_reduce`` row of a training step) is the point's
    communication."""
    one = _run_one(graph, run.variant(replicas=n))
    plan = one.plan
    reduce_s = plan.step_overheads_s.get(GRADIENT_REDUCE, 0.0)
    pt = _point_from_run(
        one, n, plan.samples_per_step, comm=0.0, link_bytes=plan.stats.link_bytes, comm_within=reduce_s
    )
    pt.notes.append(
        f"the {lowering} lowering places the replicas itself: each runs the graph's batch"
        + (", the gradients all-reduced over them each step" if reduce_s > 0 else "")
    )
    pt.superlinear = plan.stats.replicas_share
    return pt


def _dp_point(graph: Graph, run: ResolvedRun, n: int, single: ChipRun, train: bool) -> ScalePoint:
    target, options = run.target, run.options
    lowering = lowering_for(target)
    batch = single.plan.samples_per_step
    comm = 0.0
    zero = int(getattr(options, "zero", 0) or 0) if train else 0
    if train:
        link = target.link()
        if link is None:
            raise UserError(f"{target.name} declares no link; data parallel training needs one")
        # ZeRO 1/2: reduce-scatter + all-gather, the all-reduce's volume; ZeRO 3 also gathers the
        # weights again for the backward: 1.5x (Rajbhandari et al., SC'20, §7)
        comm = allreduce_time(target, _gradient_bytes(graph), n, chips_per_node(target, options)) * (
            1.5 if zero == 3 else 1.0
        )
    lowering_opts = lowering_options(run)
    parts = lowering.device_memory(
        LoweringContext.build(graph, lowering_opts.precision), lowering_opts, zero=zero, shards=n
    )
    if zero and parts is None:
        raise UserError(f"--zero {zero}: ZeRO sharding is modelled for GPU targets; {target.name} keeps its own layout")
    chip = single
    sharers = _host_sharers(run, n)
    if zero:
        # ZeRO >= 1 shards the optimizer state: each chip's optimizer pass updates 1/n of the
        # parameters (its moments, master weights and gradient shard; Rajbhandari et al., SC'20, §5.1)
        share = graph.clone()
        shard_optimizer_step(share, 1.0 / n)
        chip = _run_one(share, _sharing_host(run, sharers))
    elif sharers > 1:
        chip = _run_one(graph, _sharing_host(run, sharers))
    link_bytes = ring_allreduce_bytes(_gradient_bytes(graph), n) * (1.5 if zero == 3 else 1.0) if train else 0.0
    pt = _point_from_run(chip, n, batch * n, comm, copies=n, link_bytes=link_bytes)
    pt.notes.append("weak scaling: each chip runs the graph's batch")
    if parts is not None:
        _fit_device(pt, target, parts, sharers)
    if zero:
        pt.notes.append(f"ZeRO stage {zero}{' (FSDP)' if zero == 3 else ''} over {n} chips")
        pt.superlinear = (
            f"ZeRO-{zero} shards the optimizer update: each chip updates 1/{n} of the weights "
            "(Rajbhandari et al., SC'20, §5.1), work one chip does alone"
        )
    return pt


# -- systems that stream the weights (a Cerebras Wafer-Scale Cluster) ----------------------------


def _on_systems(run: ResolvedRun, n: int) -> ResolvedRun:
    """``run`` as one of ``n`` systems that stream the weights (the lowering's internal ``systems``)."""
    return replace(run, internals={**run.internals, "systems": n})


def _tree_link(target: Target) -> Any:
    """The link between the systems, one hop of the broadcast/reduce tree per level (``[topology]
    inter_node_link``). A UserError when the target declares none."""
    topo = target.topology
    if topo is None or topo.inter is None:
        raise UserError(
            f"{target.name} declares no link between systems ([topology] inter_node_link); "
            "data parallelism over several systems needs one"
        )
    return topo.inter


def broadcast_tree(systems: int, fanout: int) -> tuple[int, int]:
    """(levels, nodes) of the smallest tree of ``fanout``-way broadcast/reduce nodes that reaches
    ``systems`` leaves from one root store: ``ceil(log_fanout(systems))`` levels, and at level l
    ``ceil(systems / fanout**l)`` nodes. One system needs no tree (0, 0)."""
    if fanout < 2:
        raise UserError(f"broadcast_fanout {fanout}: a broadcast/reduce tree needs a fan-out of 2 or more")
    levels = nodes = 0
    width = systems
    while width > 1:
        width = -(-width // fanout)
        levels += 1
        nodes += width
    return levels, nodes


def _store_apart(pt: ScalePoint, target: Target, n: int) -> None:
    """Leave the store weight-streaming systems stream from (MemoryX) out of ``pt``'s memory per device,
    with a note: it is one store for the ``n`` systems, no system's memory (one system's point had kept
    it, so the column read 1.2 GB at one system and 344 MB at two for the same per-system plan)."""
    store = target.memory("off-chip").name
    held = dict(pt.memory_per_device or {})
    if held.get(store):
        pt.memory_per_device = {name: b for name, b in held.items() if name != store} or None
        systems = "the system" if n == 1 else f"the {n} systems"
        pt.notes.append(f"{store} holds {held[store] / 1e6:,.0f} MB for {systems}: one store, no system's memory")


def _systems_point(graph: Graph, run: ResolvedRun, n: int, single: ChipRun, train: bool) -> ScalePoint:
    """``n`` systems that each run the one-system streaming plan on the graph's batch, joined by the
    broadcast/reduce tree (SwarmX glossary, cerebras.net: a bidirectional tree of broadcast-reduce
    nodes; each system receives the weights at its own I/O rate, as alone; the gradients are summed at
    line rate on their way back; the latency grows with the tree's depth). The weights stream ahead of
    the layers (double-buffered), so inside a step the tree adds no time; at the step boundary of
    training the last gradient goes up the tree and the updated first layer comes down before the next
    step can start: 2 x levels hops. Inference streams unchanged weights ahead: no hop is exposed."""
    target = run.target
    lowering = lowering_for(target)
    one = _run_one(graph, _on_systems(run, n))
    link = _tree_link(target)
    fanout = int(target.arch_value("broadcast_fanout", needed_by=lowering.name))
    levels, tree_nodes = broadcast_tree(n, fanout)
    hops = 2 * levels if train else 0
    comm = hops * link.latency_s
    plan = one.plan
    streamed = plan.traffic_bytes.get(target.memory("off-chip").name, 0) if plan is not None else 0
    per_system = plan.samples_per_step if plan is not None else run.samples.per_replica
    # every tree node's incoming link carries one system's stream (weights down, summed gradients up)
    pt = _point_from_run(one, n, per_system * n, comm, copies=n, link_bytes=float(tree_nodes * streamed))
    if plan is not None and plan.notes:  # the lowering's own word for its systems opens its notes
        pt.notes.append(plan.notes[0])
    _store_apart(pt, target, n)
    pt.notes.append(
        f"weak scaling: each system runs the graph's batch; broadcast/reduce tree of {tree_nodes} "
        f"node{'s' if tree_nodes != 1 else ''} ({levels} level{'s' if levels != 1 else ''} of fan-out {fanout} "
        f"over {link.name}): "
        + (
            f"{hops} hops of {link.latency_s * 1e6:g} µs at the step boundary (gradients up, weights down)"
            if train
            else "no hop exposed (the weights stream ahead of the layers)"
        )
    )
    mode = single.plan.stats.mode if single.plan is not None else None
    if plan is not None and mode != plan.stats.mode:
        pt.notes.append(
            f"one system runs {mode} (the speedups' baseline); {mode} mode runs on one system, "
            f"so {n} systems stream the weights"
        )
        alone = single.plan.samples_per_step / single.time_s if single.time_s > 0 else 0.0
        if pt.time_s > 0 and per_system / pt.time_s > alone:  # each system outruns the one-system baseline
            pt.superlinear = (
                f"each system runs {plan.stats.mode}, at this batch faster per sample than the {mode} mode "
                f"one system runs ({per_system / pt.time_s:.4g} against {alone:.4g} samples/s)"
            )
    return pt


def _fit_device(pt: ScalePoint, target: Target, parts: dict[str, int], sharers: int = 1) -> None:
    """Set ``pt``'s per-device memory and fit from ``parts`` (bytes by kind; ``host`` is off the device,
    held against its share of the host's memory, which ``sharers`` devices split)."""
    mem = target.feed_memory
    need = sum(v for k, v in parts.items() if k != "host")
    pt.memory_per_device = parts
    pt.fits = need <= mem.capacity_bytes
    pt.failure = (
        None
        if pt.fits
        else {
            "reason": f"one device needs {need / 1e9:.2f} GB of {mem.name} "
            f"({', '.join(f'{k} {v / 1e9:.1f}' for k, v in parts.items() if v)} GB), "
            f"{target.name} has {mem.capacity_bytes / 1e9:.2f} GB",
            "needed_bytes": need,
            "capacity_bytes": int(mem.capacity_bytes),
        }
    )
    short = host_shortfall(target, parts["host"], sharers, "one device's") if parts.get("host") else None
    if pt.fits and short is not None:
        pt.fits = False  # the optimizer state offloaded to the host outgrows the device's share of it
        pt.failure = short.to_dict()
    if not pt.fits:
        pt.throughput_samples_per_s = None
    elif pt.throughput_samples_per_s is None and pt.time_s > 0:
        pt.throughput_samples_per_s = pt.batch / pt.time_s


def _tp_point(graph: Graph, run: ResolvedRun, n: int, train: bool) -> ScalePoint:
    target = run.target
    algorithm = tp_collective(target)  # how the target's compile reduces the partial results
    heads = attention_heads(graph)
    if lowering_for(target).tp_whole_heads and heads is not None and heads % n:
        fits = ", ".join(str(d) for d in range(2, heads + 1) if heads % d == 0)
        raise UserError(
            f"--strategy tp over {n} chips: the model's {heads} attention heads do not split {n} ways (each "
            f"chip computes whole heads); give a count that divides them: {fits}"
        )
    share, collectives = split_for_tp(graph, n)
    modules = [c for c in collectives if c.module not in (LM_HEAD, EMBEDDING)]
    if not modules:
        raise UserError(
            "--strategy tp found no attention or MLP modules to split (node scopes like layers.N.attn / layers.N.mlp)"
        )
    one = _run_one(share, _sharing_host(run, _host_sharers(run, n)))
    link = target.link()
    if link is None:
        raise UserError(f"{target.name} declares no link; tensor parallelism needs one")
    per_node = chips_per_node(target, run.options)
    per_step = sum(c.time_s(target, n, per_node, algorithm) for c in collectives)
    moved = sum(c.link_bytes(n) for c in collectives)
    pt = _point_from_run(one, n, one.plan.samples_per_step, comm=per_step, copies=n, link_bytes=moved)
    pt.notes.append(f"{len(modules)} all-reduces per {'training step (x2 for backward)' if train else 'step'}")
    if any(c.module == LM_HEAD for c in collectives):
        pt.notes.append(
            "LM head split over the vocabulary: "
            + ("the loss's all-reduces and its input gradient's" if train else "its logits all-gathered")
        )
    if any(c.module == EMBEDDING for c in collectives):
        pt.notes.append("token embedding split over the vocabulary: one all-reduce of its output a step")
    return pt
