"""What each IPU's tile memory holds, and whether it fits.

Every IPU must hold, in its tile memory, what Poplar keeps there (`MEMORY_TERMS`): program
memory, code, weights in their stored precision, a decode step's KV caches of its layers (state
kept from one step to the next, `lowering.context.cache_bytes`), the gradient accumulator, on-chip optimizer
state (an ``fp16`` plan trains as Graphcore's examples do: fp16 weights, no fp32 master copy,
``arch.fp16_optimizer_bytes_per_param`` of Adam moments), the checkpoints its stages stash for
micro-batches in flight (with ``--recompute selective`` each layer's saved tensors less its
attention core's scores), one layer's live activations, matmul temporaries as their (serialised)
plans need them, and the inter-IPU exchange buffers. `tile_memory` is the lowering's step that
adds them up per IPU; `place_units` turns them into the plan's units and fails a plan that
overflows (`overflow`), naming the IPUs that hold it (`more_ipus`).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from dabench_ir.errors import UnboundSymbolError
from dabench_ir.ir import ValueKind
from dabench_ir.lowering.context import cache_bytes, peak_live_bytes, stored_values, training_state
from dabench_ir.lowering.ipu.common import act_bytes, forward_cost, numel, trained_params
from dabench_ir.lowering.ipu.stages import form_stages, sections
from dabench_ir.lowering.ipu.supersteps import tiles_for
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import Backward, traits_of
from dabench_ir.passes.training import attention_cores, core_internal
from dabench_ir.plan import Unit, UnitStats

if TYPE_CHECKING:
    from collections.abc import Callable

    from dabench_ir.ir import Node
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.ipu import IpuOptions
    from dabench_ir.lowering.ipu.common import IpuRun
    from dabench_ir.lowering.ipu.stages import Pipeline, Stage
    from dabench_ir.lowering.ipu.supersteps import IpuTimes, SerialPlan
    from dabench_ir.plan import Plan

__all__ = [
    "BACKWARD_KERNELS",
    "LAYER_FIGURES",
    "MEMORY_TERMS",
    "SPREAD_TERMS",
    "GraphFigures",
    "Phase",
    "TileMemory",
    "boundary_bytes",
    "core_internal_values",
    "ipus_needed",
    "ipus_to_fit",
    "kept_bytes",
    "more_ipus",
    "most_of_layers",
    "overflow",
    "param_count",
    "place_units",
    "relayable",
    "saved_bytes",
    "saves_inputs",
    "state_bytes_per_param",
    "temporaries",
    "tile_memory",
    "work_tiles",
]

MEMORY_TERMS = (
    "program",
    "code",
    "weights",
    "kv_cache",
    "grad_accum",
    "optimizer_state",
    "stash",
    "live_activations",
    "matmul_temporaries",
    "exchange_buffers",
)
"""What each IPU's tile memory holds, in the order the report lists it (docs/targets.md)."""

BACKWARD_KERNELS = 2  # a differentiable op adds about two backward kernels (dX, dW): code for 3 per op
"""Backward kernels a differentiable op adds, for the code term of a training plan: an estimate (the
gradients of a matmul's input and weight, dX and dW; not a published Poplar figure)."""


class Phase(NamedTuple):
    """Memory that is live at once while a part of a stage runs (not always live: the IPU's
    peak is the phase with the most)."""

    live: float  # live activations
    temporaries: float  # matmul temporaries


@dataclass(slots=True)
class TileMemory:
    """Tile memory by term per IPU (`MEMORY_TERMS`, by IPU index in stage order), and what the
    optimizer, the fit check and the step costs read besides."""

    terms: dict[int, dict[str, float]] = field(default_factory=dict)
    offchip: bool = False  # the optimizer state lives in streaming memory
    offchip_bytes: dict[int, float] = field(default_factory=dict)  # per IPU, when ``offchip``
    params_on: dict[int, int] = field(default_factory=dict)  # parameters each IPU holds
    inflight_of: dict[int, int] = field(default_factory=dict)  # micro-batches its stash holds
    accum_pp: float = 0.0  # gradient-accumulator bytes per parameter
    shard: int = 1  # replicas the optimizer state is split over (--replicated-tensor-sharding)


def boundary_bytes(ctx: LoweringContext, nodes: list[Node]) -> float:
    """The largest activation entering ``nodes`` from another stage (a layer's input hidden state),
    whole batch. A graph input has no producing stage: the host streams it, or, a decode step's KV
    cache, the IPU holds it already (its own term); it had been taken for the boundary, a layer's
    512-token cache receive buffers of 1.57 MB where the hidden state crossing is 1.5 KB."""
    graph = ctx.graph
    inside = {n.name for n in nodes}
    best = 0.0
    for node in nodes:
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            if value is None or value.kind.is_stored or value.producer is None or value.producer in inside:
                continue
            best = max(best, act_bytes(ctx, v))
    return best


def exchange_buffers(entering: float, *, training: bool) -> float:
    """An IPU's receive buffers for what enters its stage from the previous IPU, ``entering`` bytes a
    micro-batch: double-buffered (one filling while the other is read), and in training both ways,
    the activations forward and their gradients back (docs/targets.md, the tile-memory terms). An
    estimate of Poplar's buffering, not a published figure."""
    directions = 2 if training else 1
    return directions * 2 * entering


def saved_bytes(ctx: LoweringContext, nodes: list[Node], dropped: frozenset[str] = frozenset()) -> float:
    """Activations a layer keeps for its backward pass, whole batch: each distinct activation read
    by an op whose backward needs its operands (contractions, vector ops), once; moves and
    views need none; ``dropped`` (an attention core's scores and probabilities,
    `core_internal_values`) are not kept."""
    graph = ctx.graph
    seen = {
        v
        for n in nodes
        if saves_inputs(ctx, n)
        for v in n.inputs
        if v and v in graph.values and not graph.values[v].kind.is_stored and v not in dropped
    }
    return sum(act_bytes(ctx, v) for v in seen)


def core_internal_values(ctx: LoweringContext) -> frozenset[str]:
    """The values an attention core produces and only that core reads (its S x S scores and
    probabilities): with ``--recompute selective`` the backward recomputes them from Q, K and V
    (Korthikanti et al., MLSys 2023) and a fused core never writes them, so neither is stashed."""
    return frozenset(core_internal(ctx.graph, attention_cores(ctx.graph)))


def saves_inputs(ctx: LoweringContext, node: Node) -> bool:
    """Whether the backward pass of ``node`` reads its forward inputs: a contraction does; a
    vector op does when its derivative depends on them (special functions, norms and
    softmax with several FLOPs an element, a product of two activations); a sum, a scaling
    by a constant, a move or a view does not."""
    if not ctx.is_work(node):
        return False
    rule = traits_of(node).backward
    if rule is Backward.CONTRACTION:
        return True
    if rule is not Backward.VECTOR:
        return False
    cost = ctx.costs[node.name]
    fwd = forward_cost(node, ctx)
    out = max((numel(ctx, v) for v in node.outputs if v), default=0)
    if fwd.special_ops > 0 or (out and fwd.vector_flops > out):
        return True
    graph = ctx.graph
    acts = [
        v
        for v in node.inputs
        if v and v in graph.values and not graph.values[v].kind.is_stored and numel(ctx, v) >= out
    ]
    return cost.vector_flops > 0 and len(acts) >= 2 and node.op_type in ("Mul", "Div")


def param_count(ctx: LoweringContext, roots: dict[str, int], known: dict[str, int]) -> int:
    """Parameters (trainable weights) among ``roots``; ``known``: each root's count, filled as
    worked out (`GraphFigures.params`)."""
    total = 0
    for name in roots:
        count = known.get(name)
        if count is None:
            count = known[name] = _params_of(ctx, name)
        total += count
    return total


def _params_of(ctx: LoweringContext, name: str) -> int:
    """Elements of the stored value ``name`` when it is a trainable weight, else 0."""
    graph = ctx.graph
    value = graph.values.get(name)
    if value is None or value.kind is not ValueKind.WEIGHT:
        return 0
    try:
        return value.type.numel(graph.bindings)
    except UnboundSymbolError:
        return 0


def state_bytes_per_param(ctx: LoweringContext, fp16_optimizer: float | None) -> tuple[float, float]:
    """(gradient accumulator, optimizer side) bytes per parameter in training, (0, 0) for inference.

    From the training pass's state by kind: the accumulator holds gradients in the weights'
    precision (Graphcore's GPT-2 example: ``accum_type=float16``); the optimizer side is the
    fp32 master copy and the Adam moments, which Poplar can keep in streaming memory. A plan
    rewritten to ``fp16`` trains as Graphcore's examples do (``model.half()`` with stochastic
    rounding: no fp32 master copy, the first moment in fp16 and the second in fp32), so its
    optimizer side is ``arch.fp16_optimizer_bytes_per_param`` (``fp16_optimizer``) when the
    target gives it; ``mixed`` keeps the master copy.
    """
    params = trained_params(ctx)
    if not params:
        return 0.0, 0.0
    state = training_state(ctx)
    side = state.optimizer_side / params
    if fp16_optimizer is not None and meta.graph_precision(ctx.graph) == "fp16":
        side = fp16_optimizer
    return state.gradients / params, side


def temporaries(serials: dict[str, SerialPlan], nodes: list[Node]) -> float:
    """Matmul temporaries of ``nodes``: the largest any one matmul's plan holds (``serials``: each
    node's `supersteps.serial_plan` under its IPU's budget)."""
    return max((serials[n.name].temporaries for n in nodes), default=0.0)


def kept_bytes(ctx: LoweringContext, nodes: list[Node]) -> float:
    """`saved_bytes` less the attention cores' internal values (`core_internal_values`): what a
    layer keeps when its backward recomputes its core or a fused kernel holds it."""
    return saved_bytes(ctx, nodes, ctx.fact(core_internal_values))


LAYER_FIGURES: dict[str, Callable[[LoweringContext, list[Node]], float]] = {
    "boundary": boundary_bytes,
    "saved": saved_bytes,
    "kept": kept_bytes,
    "live": peak_live_bytes,
}
"""The activation figures of a decoder layer that read its graph alone, by name (`GraphFigures`)."""


def most_of_layers(
    memo: dict[tuple[str, int], float],
    nodes: dict[int, list[Node]],
    figure: str,
    layers: list[int],
    work_out: Callable[[list[Node]], float],
) -> float:
    """The most ``figure`` any of the decoder ``layers`` (indices into ``nodes``) holds, each layer's
    ``work_out`` of its nodes worked out on the first ask and kept in ``memo``: the context's
    (`GraphFigures`) for a figure of the graph alone, the run's (`IpuRun.layer_figures`) for one that
    reads its options too. Every layout `ipus_to_fit` tries asks again for the same layers."""
    most = 0.0
    for i in layers:
        value = memo.get((figure, i))
        if value is None:
            value = memo[figure, i] = work_out(nodes[i])
        most = max(most, value)
    return most


class GraphFigures:
    """What the memory step reads of the graph alone, kept by the context (``ctx.fact(GraphFigures)``,
    `LoweringContext.fact`): every plan of the graph asks again, the why lines' variants as much as
    the layouts `ipus_to_fit` tries. Each decoder layer's activation figures (`LAYER_FIGURES`, whole
    batch), its own stored values' bytes and parameters (values no other layer and no node outside
    the layers reads: its weights) and the values it shares (a causal mask every layer reads)."""

    __slots__ = ("layer_bytes", "layers", "own", "params", "shared")

    def __init__(self, ctx: LoweringContext) -> None:
        parts = ctx.fact(sections)
        self.layers = parts.layers
        self.layer_bytes: dict[tuple[str, int], float] = {}
        self.params: dict[str, int] = {}  # each stored value's parameters (`param_count`)
        readers = Counter(root for roots in parts.layer_roots.values() for root in roots)
        readers.update(stored_values(ctx, parts.pre).keys() | stored_values(ctx, parts.post).keys())
        self.own: dict[int, tuple[int, int]] = {}  # each layer's own values: (bytes, parameters)
        self.shared: dict[int, dict[str, int]] = {}  # each layer's other values, bytes by root
        for i, roots in parts.layer_roots.items():
            own = {root: nbytes for root, nbytes in roots.items() if readers[root] == 1}
            self.own[i] = sum(own.values()), param_count(ctx, own, self.params)
            self.shared[i] = {root: nbytes for root, nbytes in roots.items() if root not in own}

    def most(self, ctx: LoweringContext, figure: str, layers: list[int]) -> float:
        """The most ``figure`` (`LAYER_FIGURES`) any of the decoder ``layers`` (indices) holds."""
        work_out = LAYER_FIGURES[figure]
        return most_of_layers(self.layer_bytes, self.layers, figure, layers, lambda ln: work_out(ctx, ln))

    def stored_on(self, ctx: LoweringContext, stages: list[Stage]) -> tuple[int, int]:
        """The bytes and parameters of the distinct stored values one IPU's ``stages`` read: each
        layer's own values as its sums, the others (the embedding's and head's, the values layers
        share) once each, by root (`stored_values`)."""
        nbytes = params = 0
        others: dict[str, int] = {}
        for st in stages:
            others.update(stored_values(ctx, st.others))
            for i in st.layers:
                own_bytes, own_params = self.own[i]
                nbytes, params = nbytes + own_bytes, params + own_params
                others.update(self.shared[i])
        return nbytes + sum(others.values()), params + param_count(ctx, others, self.params)


def _layer_phase(
    run: IpuRun,
    pipeline: Pipeline,
    layers: list[int],
    inflight: int,
    t: dict[str, float],
    serials: dict[str, SerialPlan],
    drops_cores: bool,
) -> Phase:
    """A stage's decoder ``layers`` (indices): add their stash (``inflight`` micro-batches of it) and
    exchange buffers to ``t``; their phase is one layer's live activations with its matmul temporaries.
    ``drops_cores``: the stash leaves out the attention cores' internal values (`kept_bytes`)."""
    ctx, m, train, training = run.ctx, run.m, run.train, run.training
    figures = ctx.fact(GraphFigures)

    def most(figure: str) -> float:
        return figures.most(ctx, figure, layers) / m

    # the layer's input, read by a recompute stash and by the exchange buffers only
    boundary = most("boundary") if run.recompute or pipeline.ipus > 1 else 0.0
    if training:
        saved = most("saved")
    if training and run.recompute:
        t["stash"] += len(layers) * boundary * inflight
        live = saved  # one layer recomputed and differentiated at a time
    elif training:
        kept = most("kept") if drops_cores else saved
        t["stash"] += len(layers) * kept * inflight
        # the one core the backward recomputes is live while it does (a fused core: on-tile)
        live = saved - kept if train.recompute_mode == "selective" else 0.0
    else:
        live = most("live")
    if pipeline.ipus > 1:
        t["exchange_buffers"] = max(t["exchange_buffers"], exchange_buffers(boundary, training=training))
    matmul = most_of_layers(
        run.layer_figures, pipeline.sections.layers, "temporaries", layers, lambda ln: temporaries(serials, ln)
    )
    return Phase(live, matmul)


def work_tiles(run: IpuRun, nodes: list[Node]) -> int:
    """The tiles the working ops among ``nodes`` spread over (`tiles_for`), summed: each holds its
    op's code on every tile it uses."""
    ctx = run.ctx
    return sum(tiles_for(run, n) for n in nodes if ctx.is_work(n))


def _other_phase(
    run: IpuRun, pipeline: Pipeline, other: list[Node], t: dict[str, float], serials: dict[str, SerialPlan]
) -> Phase:
    """A stage's nodes outside any layer (embedding, head, loss): add the exchange buffers for what
    enters them to ``t``; their phase is their peak of live activations with their matmul temporaries."""
    ctx, m = run.ctx, run.m
    phase = Phase(peak_live_bytes(ctx, other) / m, temporaries(serials, other))
    if pipeline.ipus > 1:
        entering = boundary_bytes(ctx, other) / m
        t["exchange_buffers"] = max(t["exchange_buffers"], exchange_buffers(entering, training=run.training))
    return phase


def _add_stage(
    run: IpuRun,
    pipeline: Pipeline,
    s: int,
    st: Stage,
    memory: TileMemory,
    serials: dict[str, SerialPlan],
    drops_cores: bool,
) -> None:
    """Add stage ``s`` (``st``) to its IPU's terms: stash, exchange buffers, code for its distinct
    ops, and its live activations and matmul temporaries where its phase peaks above the IPU's.
    ``drops_cores``: the stash leaves out the attention cores' internal values (`kept_bytes`)."""
    training, k = run.training, st.ipu
    t = memory.terms.setdefault(k, dict.fromkeys(MEMORY_TERMS, 0.0))
    inflight = pipeline.in_flight(s) if training else 1
    other = st.others
    phases: list[Phase] = []
    if st.layers:
        memory.inflight_of[k] = max(memory.inflight_of.get(k, 0), inflight)
        phases.append(_layer_phase(run, pipeline, st.layers, inflight, t, serials, drops_cores))
    if other:
        phases.append(_other_phase(run, pipeline, other, t, serials))
    # identical layers share outlined code: the stage's ops are its first layer's and its others'
    tiles = work_tiles(run, other)
    if st.layers:  # the first layer's, as the run's figure of that layer
        layers = pipeline.sections.layers
        tiles += most_of_layers(run.layer_figures, layers, "tiles", st.layers[:1], lambda ln: work_tiles(run, ln))
    factor = 1 + (BACKWARD_KERNELS if training else 0)
    t["code"] += factor * run.fig.code_per * tiles
    for live, tmp in phases:  # not-always-live memory peaks in the phase with the most
        if live + tmp > t["live_activations"] + t["matmul_temporaries"]:
            t["live_activations"], t["matmul_temporaries"] = live, tmp


def tile_memory(run: IpuRun, pipeline: Pipeline, serials: dict[str, SerialPlan]) -> TileMemory:
    """Step 3: what each IPU's tiles hold, term by term (`MEMORY_TERMS`): each stage's
    activations, stash, exchange buffers and code (`_add_stage`), then per IPU the program,
    its weights, gradient accumulator and optimizer state (`state_bytes_per_param`). The
    optimizer state goes off-chip unless ``--optimizer-state onchip`` or the target has no
    streaming memory; ``--replicated-tensor-sharding`` shards it over the replicas."""
    ctx, train, options = run.ctx, run.train, run.options
    fp16_optimizer = run.target.arch.get("fp16_optimizer_bytes_per_param")  # optional: fp16 training's own
    fp16_optimizer = None if fp16_optimizer is None else fp16_optimizer.value
    accum_pp, state_pp = state_bytes_per_param(ctx, fp16_optimizer)
    memory = TileMemory(accum_pp=accum_pp, shard=run.replicas if options.replicated_tensor_sharding else 1)
    # auto: Graphcore's default, off-chip; an inference step has no optimizer state
    memory.offchip = train is not None and options.optimizer_state != "onchip" and run.fig.stream is not None
    # what a stage need not stash: attention cores the backward recomputes or a fused kernel holds
    recomputes = train is not None and (train.recompute_mode in ("selective", "op") or train.fused_attention)
    drops_cores = recomputes and bool(ctx.fact(core_internal_values))
    for s, st in enumerate(pipeline.stages):
        _add_stage(run, pipeline, s, st, memory, serials, drops_cores)
    on_ipu, figures = pipeline.stages_by_ipu(), ctx.fact(GraphFigures)
    for k, t in memory.terms.items():
        t["program"] = run.fig.program
        t["weights"], memory.params_on[k] = figures.stored_on(ctx, on_ipu[k])
        t["kv_cache"] = cache_bytes(ctx, [n for st in on_ipu[k] for n in st.nodes])
        t["grad_accum"] = memory.params_on[k] * accum_pp
        state = memory.params_on[k] * state_pp / memory.shard
        if memory.offchip:
            memory.offchip_bytes[k] = state
        else:
            t["optimizer_state"] = state
    return memory


def place_units(run: IpuRun, pipeline: Pipeline, memory: TileMemory, times: IpuTimes, plan: Plan) -> None:
    """Step 4: one unit per IPU with its tiles, tile use and memory terms; tile memory per IPU
    (``sram:ipuK``, never summed) and streaming memory for off-chip state; the plan fails where
    an IPU's tiles or its streaming memory overflow."""
    fig = run.fig
    sram, stream, capacity = fig.sram, fig.stream, fig.capacity
    n_ipus = pipeline.ipus
    offchip_bytes = memory.offchip_bytes
    more = None  # `more_ipus`, sized once for every IPU that overflows
    on_ipu = pipeline.stages_by_ipu()
    for k in sorted(memory.terms):
        t = memory.terms[k]
        resident = sum(t.values())
        unit = Unit(id=f"ipu{k}", kind="ipu", nodes=[n.name for st in on_ipu[k] for n in st.nodes])
        util = times.utilisation(k)
        unit.allocation = util / n_ipus
        unit.stats = UnitStats(tile_utilisation=util)
        unit.resources = {
            "tiles": float(fig.tiles),
            "sram_bytes": float(resident),
            **{f"{name}_bytes": float(v) for name, v in t.items()},
        }
        if k in offchip_bytes:
            unit.resources["streaming_ddr_bytes"] = float(offchip_bytes[k])
        plan.units.append(unit)
        # no summed "sram" entry: tile memory is per IPU, and a sum over IPUs read as one device's use
        # (the multi-chip report does) would exceed any one IPU's capacity
        plan.memory_bytes[f"{sram.name}:ipu{k}"] = int(resident)
        if k in offchip_bytes and stream is not None:
            plan.memory_bytes[f"{stream.name}:ipu{k}"] = int(offchip_bytes[k])
        if resident > capacity:
            more = more or more_ipus(run, pipeline, memory, times.serials)
            reason, remedy = overflow(k, t, resident, capacity, memory.inflight_of.get(k, 0), run, more)
            plan.fail(reason, resident, capacity, remedy=remedy)
        if stream is not None and offchip_bytes.get(k, 0) > stream.capacity_bytes:
            plan.fail(
                f"IPU {k} needs {offchip_bytes[k] / 1e9:.1f} GB of streaming memory for optimizer state, "
                f"it has {stream.capacity_bytes / 1e9:.0f} GB; use more IPUs or replicas",
                offchip_bytes[k],
                stream.capacity_bytes,
            )


SPREAD_TERMS = ("weights", "kv_cache", "grad_accum", "optimizer_state", "stash")
"""The terms a layer brings with it, which more IPUs share out; each IPU holds the others (program
memory, its layers' outlined code, one layer's live activations and matmul temporaries, exchange
buffers) whatever its layers."""


def overflow(
    k: int,
    t: dict[str, float],
    resident: float,
    capacity: float,
    inflight: int,
    run: IpuRun,
    more: MoreIpus,
) -> tuple[str, tuple[tuple[str, int], ...]]:
    """The failure line of IPU ``k`` (its total, the part that overflows most, and what to try) and
    its remedy (`Failure.remedy`): ``--ipus`` as ``more`` (`more_ipus`) sizes it, when more IPUs help
    and the layout is the lowering's."""
    largest = max((name for name in t if name != "program"), key=t.__getitem__)
    parts = ", ".join(f"{name.replace('_', ' ')} {v / 1e6:.0f} MB" for name, v in t.items() if v >= 0.5e6)
    hints = {  # what to try when this part overflows most
        "stash": "use --recompute"
        if run.training and not run.recompute
        else "put fewer layers on early IPUs (--layers-per-ipu)",
        "matmul_temporaries": "lower --matmul-proportion",
        "optimizer_state": "keep optimizer state off-chip (--optimizer-state offchip) or shard it over --replicas",
        "live_activations": "use fewer samples per micro-batch (more --micro-batches)"
        + ("" if run.recompute or not run.training else " or --recompute"),
    }
    own = hints.get(largest)
    hint = more.text if own is None else own + (f", or {more.text}" if more.ipus else "")
    extra = f" for {inflight} micro-batch{'' if inflight == 1 else 'es'} in flight" if largest == "stash" else ""
    reason = (
        f"IPU {k} needs {resident / 1e6:.0f} MB of tile SRAM, it has {capacity / 1e6:.1f} MB; "
        f"largest part: {largest.replace('_', ' ')} {t[largest] / 1e6:.0f} MB{extra} ({parts}); {hint}"
    )
    return reason, more.remedy


class MoreIpus(NamedTuple):
    """What more IPUs do for a pipeline that overflows: the count that holds it (None: no count
    does), the failure line's words for it, and the remedy to place (`Failure.remedy`; none where
    the layout is the user's, which another count would not keep)."""

    ipus: int | None
    text: str
    remedy: tuple[tuple[str, int], ...] = ()


def more_ipus(run: IpuRun, pipeline: Pipeline, memory: TileMemory, serials: dict[str, SerialPlan]) -> MoreIpus:
    """The ``--ipus`` count that holds the overflowing pipeline (`ipus_to_fit`), or why none does."""
    layers, options = len(pipeline.sections.layers), run.options
    needed = ipus_to_fit(run, pipeline, memory, serials)
    if needed is not None and not relayable(options):
        if options.layers_per_ipu is not None:
            return MoreIpus(needed, f"use more IPUs (a --layers-per-ipu of {needed} or more counts)")
        return MoreIpus(needed, f"use more IPUs (--ipus {needed} or more, a --matmul-proportion for each)")
    if needed is not None:
        return MoreIpus(needed, f"use more IPUs (--ipus {needed} or more)", (("ipus", needed),))
    if ipus_needed(memory, run.fig.capacity, None) is None:
        return MoreIpus(None, "more IPUs do not help: what each IPU holds whatever its layers fills it")
    return MoreIpus(None, f"more IPUs do not help: its {layers} decoder layer(s), one an IPU at most, still overflow")


def ipus_needed(memory: TileMemory, capacity: float, layers: int | None) -> int | None:
    """The fewest IPUs that could hold the pipeline: what its layers bring (`SPREAD_TERMS`, summed
    over every IPU) spread evenly over the room each IPU has beside what it holds whatever its
    layers (the most any IPU holds of the other terms), and at least one more IPU than now. A
    bound the failure rules out below, not a layout that fits (a layer is not split, exchange
    buffers grow with the IPUs): `ipus_to_fit` searches up from it. None when that room is nil,
    or when it takes more IPUs than the pipeline's ``layers`` decoder layers (the layout puts one
    layer an IPU at most): then no number of IPUs helps. ``layers`` None: no such cap."""
    terms = memory.terms.values()
    spread = sum(t.get(name, 0.0) for t in terms for name in SPREAD_TERMS)
    room = capacity - max(sum(v for name, v in t.items() if name not in SPREAD_TERMS) for t in terms)
    if room <= 0:
        return None
    needed = max(len(memory.terms) + 1, math.ceil(spread / room))
    return None if layers is not None and needed > layers else needed


def relayable(options: IpuOptions) -> bool:
    """Whether the run's layout carries over to another ``--ipus`` count: the lowering splits the
    layers itself (no ``--layers-per-ipu``) under one ``--matmul-proportion`` for every IPU."""
    return options.layers_per_ipu is None and len(options.matmul_proportion) == 1


def ipus_to_fit(run: IpuRun, pipeline: Pipeline, memory: TileMemory, serials: dict[str, SerialPlan]) -> int | None:
    """The fewest IPUs whose layout holds every IPU's tile memory: each count laid out as ``--ipus``
    lays it (`form_stages`) and filled as the lowering fills it (`tile_memory`, the matmuls' plans
    ``serials`` kept: their budget is per IPU, not per layout), searched up from `ipus_needed`'s
    bound with a doubling stride, then bisected. The count returned fits; it is the fewest where
    the fit, once reached, holds for more IPUs (inference: each IPU's weights only shrink; in
    training more stages hold more micro-batches' stash). The bound itself where the layout is the
    user's (``--layers-per-ipu``) or the matmul proportion is given per IPU; None where no count up
    to the pipeline's decoder layers fits (one layer an IPU at most)."""
    layers, options = len(pipeline.sections.layers), run.options
    bound = ipus_needed(memory, run.fig.capacity, layers)
    if bound is None or not relayable(options):
        return bound

    @functools.cache
    def fits(ipus: int) -> bool:
        laid = tile_memory(run, form_stages(run.ctx, replace(options, ipus=ipus)), serials)
        return all(sum(t.values()) <= run.fig.capacity for t in laid.terms.values())

    short, ipus, stride = bound - 1, bound, 1  # below the bound nothing fits
    while not fits(ipus):
        if ipus == layers:
            return None
        short, ipus, stride = ipus, min(layers, ipus + stride), stride * 2
    while ipus - short > 1:
        mid = (short + ipus) // 2
        short, ipus = (short, mid) if fits(mid) else (mid, ipus)
    return ipus
