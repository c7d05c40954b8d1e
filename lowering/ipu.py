"""Graphcore IPU lowering: BSP supersteps on tiles, layers pipelined over IPUs as Poplar does it.

Each node is one bulk-synchronous superstep on its IPU: a compute phase on the tiles its
work spreads over (one tile per ``arch.min_grain_flops``), a sync (``overheads.sync_s``)
and an exchange phase moving its inputs between tiles (``arch.exchange_bytes_per_s``).
Matmuls run on the AMP units at the achieved fraction of peak the microbenchmarks give
(``arch.matmul_efficiency_<prec>``); vector ops run on each tile's 64-bit vector pipeline
(``arch.vector_elems_per_cycle_<prec>``), transcendentals at ``arch.special_ops_per_cycle_<prec>``
per tile: each of a node's three Cost parts at its own rate. A matmul whose full-speed
temporaries exceed the matmul proportion's budget is serialised (`_serial_plan`): each pass
after the first pays a sync and the broadcast operand's exchange again, and the plan holds
what its passes need.

Layout: ``layers_per_ipu`` (a leading 0 puts the embedding alone on IPU 0, and the head
returns there, as Graphcore's GPT-2 examples place it) or ``ipus`` splitting the decoder
layers evenly. Every IPU must hold, in its tile memory, what Poplar keeps there: program
memory, code, weights in their stored precision, the gradient accumulator, on-chip optimizer
state (an ``fp16`` plan trains as Graphcore's examples do: fp16 weights, no fp32 master copy,
``arch.fp16_optimizer_bytes_per_param`` of Adam moments), the checkpoints its stages stash for
micro-batches in flight (with ``--recompute selective`` each layer's saved tensors less its
attention core's scores), one layer's live activations, matmul temporaries as their (serialised)
plans need them, and the inter-IPU exchange buffers. Tile memory is reported per IPU
(``sram:ipuK``), never summed. A tensor crossing to another IPU is copied over the IPU-Link
once, however many of that IPU's ops read it. The most loaded IPU sets the pipeline cycle; a step is ``m`` cycles plus the
pipeline fill and drain, the optimizer update (at streaming-memory bandwidth when its
state is off-chip) and the gradient reduction over replicas, each once per step
(``Plan.step_overheads_s``). docs/targets.md gives the terms and their sources.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dabench_ir.errors import UnboundSymbolError, UserError
from dabench_ir.ir import ValueKind
from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering._common import (
    LoweringContext,
    peak_live_bytes,
    place_node,
    stored_values,
    training_state,
)
from dabench_ir.lowering.collectives import ring_allreduce_time
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import Backward, traits_of
from dabench_ir.passes.training import FORWARD_COST, attention_cores, core_internal, is_optimizer_step
from dabench_ir.plan import Plan, Schedule, Unit, UnitStats

if TYPE_CHECKING:
    from dabench_ir.ir import Cost, Node
    from dabench_ir.targets import Target

__all__ = ["LOWERING", "MEMORY_TERMS", "IpuLowering", "IpuOptions"]

logger = logging.getLogger(__name__)
_WHO = "ipu"

MEMORY_TERMS = (
    "program", "code", "weights", "grad_accum", "optimizer_state", "stash", "live_activations",
    "matmul_temporaries", "exchange_buffers",
)  # fmt: skip
"""What each IPU's tile memory holds, in the order the report lists it (docs/targets.md)."""

_BACKWARD_KERNELS = 2  # a differentiable op adds about two backward kernels (dX, dW): code for 3 per op


@dataclass(frozen=True, slots=True, kw_only=True)
class IpuOptions(LoweringOptions):
    """What the IPU lowering reads. Internal (no knob): ``steady_state`` overlaps
    consecutive steps in the pipeline (step time = the most loaded IPU)."""

    micro_batches: int | None
    ipus: int
    layers_per_ipu: tuple[int, ...] | None
    matmul_proportion: tuple[float, ...]
    optimizer_state: str
    replicated_tensor_sharding: bool
    replicas: int | str | None
    steady_state: bool = internal(True)


class IpuLowering(Lowering):
    """Graphcore IPU: BSP supersteps on tiles, decoder layers pipelined over IPUs."""

    name = "ipu"
    kinds = ("ipu",)
    Options = IpuOptions
    feed = "on-chip"  # tile SRAM feeds every superstep


    def _lower(self, ctx: LoweringContext, target: Target, options: IpuOptions) -> Plan:
        return _lower(ctx, target, options)


LOWERING = IpuLowering()


@dataclass(slots=True)
class _Stage:
    """One pipeline stage: the IPU it runs on, its nodes, and its decoder layers (by index)."""

    ipu: int
    nodes: list[Node] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)


def _sections(ctx: LoweringContext) -> tuple[list[Node], dict[int, list[Node]], list[Node], list[Node]]:
    """(pre-layer nodes, nodes per decoder layer, post-layer nodes, optimizer step nodes).

    A node without a layer joins the layer before it (residual adds the exporter left
    unscoped), except before the first layer (the embedding) and after the last (final
    norm, head, loss).
    """
    nodes = [n for n in ctx.graph.nodes]
    opt = [n for n in nodes if is_optimizer_step(n)]
    rest = [n for n in nodes if not is_optimizer_step(n)]
    layered = [i for i, n in enumerate(rest) if n.layer is not None]
    if not layered:
        return rest, {}, [], opt
    first, last = layered[0], layered[-1]
    layers: dict[int, list[Node]] = {}
    current = rest[first].layer
    for n in rest[first : last + 1]:
        current = n.layer if n.layer is not None else current
        layers.setdefault(int(current), []).append(n)
    return rest[:first], dict(sorted(layers.items())), rest[last + 1 :], opt


def _layout(options: IpuOptions, n_layers: int, tied: bool, embed_layers: float = 0.0) -> tuple[list[int], bool]:
    """(layers on each IPU, whether the head returns to IPU 0 as a pipeline stage of its own).

    With ``layers_per_ipu`` a head tied to the embedding goes back to IPU 0, where its
    weight is (Graphcore's GPT-2 examples). With ``ipus`` alone and a tied head, the table is
    kept once, on IPU 0, and counted as ``embed_layers`` layers' worth of weights: IPU 0 takes
    what is left of an even share (none when the table is larger than a share) and the other
    IPUs split the rest evenly, the remainder on late IPUs (GPT-2 small/medium/large on 4/8/16
    IPUs give Graphcore's shipped layouts 0,4,4,4 / 0,3,3,3,3,4,4,4 / 0,2,...,3,...,2-like).
    Otherwise the layers split evenly and the head stays on the last IPU.
    """
    if options.layers_per_ipu is not None:
        counts = list(options.layers_per_ipu)
        shown = ",".join(map(str, counts))
        if options.ipus not in (1, len(counts)):
            raise UserError(f"--layers-per-ipu {shown} names {len(counts)} IPUs but --ipus is {options.ipus}; "
                            "give one count per IPU")  # fmt: skip
        if sum(counts) != n_layers:
            raise UserError(f"--layers-per-ipu {shown} places {sum(counts)} layers; the model has {n_layers}")
        return counts, tied and len(counts) > 1
    n = max(1, min(options.ipus, n_layers))
    if tied and embed_layers > 0 and n > 1:
        first = max(0, min(n_layers, math.floor((n_layers + embed_layers) / n - embed_layers + 0.5)))
        base, extra = divmod(n_layers - first, n - 1)
        return [first] + [base + (1 if k >= n - 1 - extra else 0) for k in range(n - 1)], True
    base, extra = divmod(n_layers, n)
    return [base + (1 if k >= n - extra else 0) for k in range(n)], False  # the remainder on late IPUs


def _stages(pre: list[Node], layers: dict[int, list[Node]], post: list[Node], counts: list[int],
            head_home: bool) -> list[_Stage]:  # fmt: skip
    """Pipeline stages in order. With ``head_home`` IPU 0 runs the first stage (embedding)
    and the last (head, loss); otherwise the embedding joins the first IPU's layers and the
    head the last IPU's."""
    order = list(layers)
    stages: list[_Stage] = []
    i = 0
    for k, c in enumerate(counts):
        st = _Stage(k)
        if k == 0:
            st.nodes += pre
        for idx in order[i : i + c]:
            st.layers.append(idx)
            st.nodes += layers[idx]
        i += c
        stages.append(st)
    if head_home:
        stages.append(_Stage(0, list(post)))
    else:
        stages[-1].nodes += post
    return [s for s in stages if s.nodes] or [_Stage(0)]


def _precision_key(node: Node, ctx: LoweringContext) -> str:
    """fp32 or fp16 (16-bit AMP and vector lanes serve fp16 and bf16 alike): the node's own
    precision, except that a 16-bit plan keeps every op but the optimizer in 16 bits
    (Graphcore's examples run ``model.half()``; the fp32 state is the optimizer's)."""
    if ctx.precision.itemsize < 4 and not is_optimizer_step(node):
        return "fp16"  # a 16-bit plan runs norms and softmax in 16 bits too, as model.half() does
    return "fp32" if ctx.node_precision(node).itemsize >= 4 else "fp16"


def _forward(node: Node, ctx: LoweringContext) -> Cost:
    fwd = node.meta.get(FORWARD_COST)
    return fwd if fwd is not None else ctx.costs[node.name]


def _act_bytes(ctx: LoweringContext, name: str) -> float:
    """Bytes of an activation as the IPU holds it: a 16-bit plan keeps every float activation in
    16 bits (Graphcore's examples run ``model.half()``: norms and softmax too), whatever the
    graph's own dtype for the ops a framework keeps in fp32."""
    value = ctx.graph.values.get(name)
    size = ctx.value_bytes(name)
    if value is None or not value.type.dtype.is_float or ctx.precision.itemsize >= value.type.dtype.itemsize:
        return float(size)
    return size * ctx.precision.itemsize / value.type.dtype.itemsize


def _boundary_bytes(ctx: LoweringContext, nodes: list[Node]) -> float:
    """The largest activation entering ``nodes`` from outside (a layer's input hidden state), whole batch."""
    graph = ctx.graph
    inside = {n.name for n in nodes}
    best = 0.0
    for node in nodes:
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            if value is None or value.kind.is_stored or value.producer in inside:
                continue
            best = max(best, _act_bytes(ctx, v))
    return best


def _saved_bytes(ctx: LoweringContext, nodes: list[Node], dropped: frozenset[str] = frozenset()) -> float:
    """Activations a layer keeps for its backward pass, whole batch: each distinct activation read
    by an op whose backward needs its operands (contractions, vector ops), once; moves and
    views need none; ``dropped`` (an attention core's scores and probabilities, `_core_internal`)
    are not kept."""
    graph = ctx.graph
    seen = {v for n in nodes if _saves_inputs(ctx, n) for v in n.inputs
            if v and v in graph.values and not graph.values[v].kind.is_stored and v not in dropped}  # fmt: skip
    return sum(_act_bytes(ctx, v) for v in seen)


def _core_internal(ctx: LoweringContext) -> frozenset[str]:
    """The values an attention core produces and only that core reads (its S x S scores and
    probabilities): with ``--recompute selective`` the backward recomputes them from Q, K and V
    (Korthikanti et al., MLSys 2023) and a fused core never writes them, so neither is stashed."""
    return frozenset(core_internal(ctx.graph, attention_cores(ctx.graph)))


def _saves_inputs(ctx: LoweringContext, node: Node) -> bool:
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
    fwd = _forward(node, ctx)
    out = max((_numel(ctx, v) for v in node.outputs if v), default=0)
    if fwd.special_ops > 0 or (out and fwd.vector_flops > out):
        return True
    graph = ctx.graph
    acts = [v for v in node.inputs if v and v in graph.values and not graph.values[v].kind.is_stored
            and _numel(ctx, v) >= out]  # fmt: skip
    return cost.vector_flops > 0 and len(acts) >= 2 and node.op_type in ("Mul", "Div")


def _numel(ctx: LoweringContext, name: str) -> int:
    value = ctx.graph.values.get(name)
    if value is None or not value.type.dtype.itemsize:  # absent, or an untyped value (no byte size)
        return 0
    return ctx.value_bytes(name) // value.type.dtype.itemsize


def _param_count(ctx: LoweringContext, roots: dict[str, int]) -> int:
    """Parameters (trainable weights) among ``roots``."""
    graph = ctx.graph
    total = 0
    for name in roots:
        value = graph.values.get(name)
        if value is not None and value.kind is ValueKind.WEIGHT:
            try:
                total += value.type.numel(graph.bindings)
            except UnboundSymbolError:
                continue
    return total


def _state_bytes_per_param(ctx: LoweringContext, fp16_optimizer: float | None) -> tuple[float, float]:
    """(gradient accumulator, optimizer side) bytes per parameter in training, (0, 0) for inference.

    From the training pass's state by kind: the accumulator holds gradients in the weights'
    precision (Graphcore's GPT-2 example: ``accum_type=float16``); the optimizer side is the
    fp32 master copy and the Adam moments, which Poplar can keep in streaming memory. A plan
    rewritten to ``fp16`` trains as Graphcore's examples do (``model.half()`` with stochastic
    rounding: no fp32 master copy, the first moment in fp16 and the second in fp32), so its
    optimizer side is ``arch.fp16_optimizer_bytes_per_param`` (``fp16_optimizer``) when the
    target gives it; ``mixed`` keeps the master copy.
    """
    params = _trained_params(ctx)
    if not params:
        return 0.0, 0.0
    state = training_state(ctx)
    side = state.optimizer_side / params
    if fp16_optimizer is not None and meta.graph_precision(ctx.graph) == "fp16":
        side = fp16_optimizer
    return state.gradients / params, side


def _lower(ctx: LoweringContext, target: Target, options: IpuOptions) -> Plan:
    graph = ctx.graph
    tiles = int(target.arch_value("tiles", target.num_units))
    sram = target.memory(LOWERING.feed_level(target))
    capacity = sram.capacity_bytes
    clock = float(target.clock.value) if target.clock is not None else target.peak_flops("fp16") / tiles / 128
    grain = target.arch_value("min_grain_flops", needed_by=_WHO)
    exchange_bw = target.arch_value("exchange_bytes_per_s", needed_by=_WHO)
    tile_sram = target.arch_value("tile_sram_bytes", capacity / tiles)
    code_per = target.arch_value("code_bytes_per_tile_op", 0.0)
    program = target.arch_value("program_bytes_per_tile", needed_by=_WHO) * tiles
    gamma = target.arch_value("matmul_temp_per_operand_byte", needed_by=_WHO)
    eta = {p: target.arch_value(f"matmul_efficiency_{p}", needed_by=_WHO) for p in ("fp16", "fp32")}
    lanes = {p: target.arch_value(f"vector_elems_per_cycle_{p}", needed_by=_WHO) for p in ("fp16", "fp32")}
    special = {p: target.arch_value(f"special_ops_per_cycle_{p}", needed_by=_WHO) for p in ("fp16", "fp32")}
    amp_peak = {p: target.peak_flops(p) / tiles for p in ("fp16", "fp32")}
    sync = target.overhead("sync_s")
    link = target.link("ipu_link") or target.link()
    stream = target.memory("off-chip") if target.has_memory("off-chip") else None
    sram_bw = sram.bandwidth_bytes_per_s
    ridge = target.ridge_point(ctx.precision, sram)
    m = options.micro_batches or ctx.batch
    if options.replicas == "auto":
        raise UserError("--replicas auto: IPU replicas are data-parallel copies; give a number (e.g. --replicas 4)")
    replicas = int(options.replicas or 1)
    train = meta.training_state(graph)
    training = train is not None
    recompute = train is not None and train.recompute

    pre, layers, post, opt_nodes = _sections(ctx)
    tied = bool(set(stored_values(ctx, pre)) & set(stored_values(ctx, post)))
    layer_weights = [sum(stored_values(ctx, nodes).values()) for nodes in layers.values()]
    per_layer = sum(layer_weights) / len(layer_weights) if layer_weights else 0.0
    embed = sum(stored_values(ctx, pre).values()) / per_layer if per_layer else 0.0  # the table, in layers' worth
    counts, head_home = _layout(options, len(layers), tied, embed)
    stages = _stages(pre, layers, post, counts, head_home)
    n_ipus = max(s.ipu for s in stages) + 1
    n_stages = len(stages)
    amps = options.matmul_proportion
    if len(amps) not in (1, n_ipus):
        raise UserError(f"--matmul-proportion {','.join(map(str, amps))}: give one value or one per IPU ({n_ipus})")
    if options.layers_per_ipu is None and options.ipus > n_ipus:
        note = f"only {len(layers)} decoder layer(s) to place: {options.ipus - n_ipus} IPU(s) unused"
    else:
        note = ""

    def tiles_for(node: Node) -> int:
        """Tiles an operator spreads over: enough for its work (one micro-batch per superstep,
        at least ``grain`` FLOPs a tile) and enough to hold its tensors in tile memory."""
        cost = ctx.costs[node.name]
        by_work = math.ceil(cost.flops / m / grain)
        by_data = math.ceil(cost.bytes / m / tile_sram)
        return max(1, min(tiles, max(by_work, by_data)))

    plan = ctx.plan(target, options, Schedule.CONCURRENT, micro_batches=m, chips=n_ipus * replicas,
                    replicas=replicas, pipelined_steps=options.steady_state)  # fmt: skip
    if note:
        plan.notes.append(note)
    ipu_of = {n.name: st.ipu for st in stages for n in st.nodes}

    # -- time: every node on its IPU's lane ---------------------------------------------------
    lane_s: dict[int, float] = {}
    crossed: set[tuple[str, int]] = set()  # (tensor, IPU) pairs already copied over an IPU-Link
    busy: dict[int, float] = {}
    weighted: dict[int, float] = {}
    serials: dict[str, _Serial] = {}  # each node's matmul plan under its IPU's budget, for the time and the memory
    for st in stages:
        k = st.ipu
        budget = (amps[k] if len(amps) > 1 else amps[0]) * capacity
        unit_id = f"ipu{k}"
        for node in st.nodes:
            cost = ctx.costs[node.name]
            used = tiles_for(node)
            prec = _precision_key(node, ctx)
            work = ctx.is_work(node)
            matmul_s = cost.contraction_flops / (eta[prec] * amp_peak[prec] * used)
            vector_s = cost.vector_flops / (lanes[prec] * clock * used)
            special_s = cost.special_ops / (special[prec] * clock * used)
            serial = serials[node.name] = _serial_plan(ctx, node, m, gamma, budget)
            extra = serial.passes - 1  # each pass after the first: one more sync and broadcast exchange
            serial_comm_s = m * extra * serial.broadcast_bytes / exchange_bw
            link_bytes = 0.0
            for v in node.inputs:
                value = graph.values.get(v) if v else None
                if (value is not None and value.producer is not None and ipu_of.get(value.producer, k) != k
                        and (v, k) not in crossed):  # fmt: skip
                    crossed.add((v, k))  # one inter-IPU copy per tensor, however many ops read it there
                    link_bytes += _act_bytes(ctx, v) * (2 if training else 1)  # and its gradient back
            comm_s = (link_bytes / link.bandwidth_bytes_per_s + link.latency_s * m) if link and link_bytes else 0.0
            plan.node_plans[node.name] = np_ = place_node(
                ctx, node, unit=unit_id, compute_s=matmul_s + vector_s + special_s,
                memory_s=cost.bytes / (sram_bw * used / tiles),
                comm_s=cost.act_bytes_in / exchange_bw + comm_s + serial_comm_s,
                overhead_s=sync * m * (1 + extra) if work else 0.0, feed_level=sram.level, feed_bytes=cost.bytes, ridge=ridge,
                allocation=used / tiles / n_ipus if work else 0.0, micro_batches=m,
            )  # fmt: skip
            lane_s[k] = lane_s.get(k, 0.0) + np_.per_micro_batch_s
            busy[k] = busy.get(k, 0.0) + np_.per_micro_batch_s * m
            weighted[k] = weighted.get(k, 0.0) + np_.per_micro_batch_s * m * used / tiles

    # -- memory: what each IPU's tiles hold ---------------------------------------------------
    accum_pp, state_pp = _state_bytes_per_param(ctx, target.arch_value("fp16_optimizer_bytes_per_param", None))
    offchip = options.optimizer_state != "onchip" and stream is not None  # auto: Graphcore's default, off-chip
    shard = replicas if options.replicated_tensor_sharding else 1
    terms: dict[int, dict[str, float]] = {}
    offchip_bytes: dict[int, float] = {}
    # what a stage need not stash: attention cores the backward recomputes or a fused kernel holds
    dropped = _core_internal(ctx) if train is not None and (train.recompute_mode == "selective"
                                                            or train.fused_attention) else frozenset()  # fmt: skip
    params_on: dict[int, int] = {}
    inflight_of: dict[int, int] = {}
    for s, st in enumerate(stages):
        k = st.ipu
        t = terms.setdefault(k, dict.fromkeys(MEMORY_TERMS, 0.0))
        inflight = 2 * (n_stages - 1 - s) + 1 if training else 1
        layer_nodes = [layers[i] for i in st.layers]
        other = [n for n in st.nodes if n.layer is None and not any(n in ln for ln in layer_nodes)]
        phases: list[tuple[float, float]] = []  # (live activations, matmul temporaries) at once
        if layer_nodes:
            inflight_of[k] = max(inflight_of.get(k, 0), inflight)
            # the layer's input, read by a recompute stash and by the exchange buffers only
            boundary = max(_boundary_bytes(ctx, ln) for ln in layer_nodes) / m if recompute or n_ipus > 1 else 0.0
            if training:
                saved = max(_saved_bytes(ctx, ln) for ln in layer_nodes) / m
            if training and recompute:
                t["stash"] += len(layer_nodes) * boundary * inflight
                live = saved  # one layer recomputed and differentiated at a time
            elif training:
                kept = max(_saved_bytes(ctx, ln, dropped) for ln in layer_nodes) / m if dropped else saved
                t["stash"] += len(layer_nodes) * kept * inflight
                # the one core the backward recomputes is live while it does (a fused core: on-tile)
                live = saved - kept if train.recompute_mode == "selective" else 0.0
            else:
                live = max(peak_live_bytes(ctx, ln) for ln in layer_nodes) / m
            phases.append((live, _temporaries(serials, [n for ln in layer_nodes for n in ln])))
            if n_ipus > 1:
                t["exchange_buffers"] = max(t["exchange_buffers"], (4 if training else 2) * boundary)
        if other:
            phases.append((peak_live_bytes(ctx, other) / m, _temporaries(serials, other)))
            if n_ipus > 1:
                entering = _boundary_bytes(ctx, other) / m
                t["exchange_buffers"] = max(t["exchange_buffers"], (4 if training else 2) * entering)
        distinct = (layer_nodes[0] if layer_nodes else []) + other  # identical layers share outlined code
        factor = 1 + (_BACKWARD_KERNELS if training else 0)
        t["code"] += factor * code_per * sum(tiles_for(n) for n in distinct if ctx.is_work(n))
        for live, tmp in phases:  # not-always-live memory peaks in the phase with the most
            if live + tmp > t["live_activations"] + t["matmul_temporaries"]:
                t["live_activations"], t["matmul_temporaries"] = live, tmp
    for k, t in terms.items():
        nodes = [n for st in stages if st.ipu == k for n in st.nodes]
        roots = stored_values(ctx, nodes)
        params_on[k] = _param_count(ctx, roots)
        t["program"] = program
        t["weights"] = sum(roots.values())
        t["grad_accum"] = params_on[k] * accum_pp
        state = params_on[k] * state_pp / shard
        if offchip:
            offchip_bytes[k] = state
        else:
            t["optimizer_state"] = state

    # -- units, fit -----------------------------------------------------------------------
    for k in sorted(terms):
        t = terms[k]
        resident = sum(t.values())
        unit = Unit(id=f"ipu{k}", kind="ipu", nodes=[n.name for st in stages if st.ipu == k for n in st.nodes])
        util = weighted.get(k, 0.0) / busy[k] if busy.get(k) else 0.0
        unit.allocation = util / n_ipus
        unit.stats = UnitStats(tile_utilisation=util)
        unit.resources = {"tiles": float(tiles), "sram_bytes": float(resident),
                          **{f"{name}_bytes": float(v) for name, v in t.items()}}  # fmt: skip
        if k in offchip_bytes:
            unit.resources["streaming_ddr_bytes"] = float(offchip_bytes[k])
        plan.units.append(unit)
        plan.memory_bytes[f"{sram.name}:ipu{k}"] = int(resident)
        if k in offchip_bytes and stream is not None:
            plan.memory_bytes[f"{stream.name}:ipu{k}"] = int(offchip_bytes[k])
        if resident > capacity:
            plan.fail(_overflow(k, t, resident, capacity, inflight_of.get(k, 0), recompute, training, n_ipus),
                      resident, capacity)  # fmt: skip
        if stream is not None and offchip_bytes.get(k, 0) > stream.capacity_bytes:
            plan.fail(f"IPU {k} needs {offchip_bytes[k] / 1e9:.1f} GB of streaming memory for optimizer state, "
                      f"it has {stream.capacity_bytes / 1e9:.0f} GB; use more IPUs or replicas",
                      offchip_bytes[k], stream.capacity_bytes)  # fmt: skip
    # no summed "sram" entry: tile memory is per IPU ("sram:ipuK" above), and a sum over IPUs
    # read as one device's use (the multi-chip report does) would exceed any one IPU's capacity
    plan.traffic_bytes[sram.name] = sum(c.bytes for c in ctx.costs.values())

    # -- once per step: fill and drain, optimizer, gradient reduction ----------------------------
    cycle = max(lane_s.values(), default=0.0)
    if training and n_stages > 1 and options.steady_state:
        # the pipeline drains before each weight update: the bubble is paid every step (in
        # inference consecutive steps stream through without one; without steady_state the
        # event simulation already holds the fill and drain)
        plan.step_overheads_s["pipeline_fill_drain"] = (n_stages - 1) * cycle
    opt_s = 0.0
    if opt_nodes:
        per_ipu = []
        for k in terms:
            cycles = sum(_adam_cycles(ctx, n, lanes["fp32"], special["fp32"]) for n in opt_nodes)
            update = params_on[k] * cycles / (clock * tiles)
            moved = 2 * offchip_bytes.get(k, 0.0) / stream.bandwidth_bytes_per_s if offchip and stream else 0.0
            per_ipu.append(max(update, moved))  # the state streams in and out while the tiles update
        opt_s = max(per_ipu, default=0.0)
        unit = Unit(id="optimizer", kind="ipu_optimizer", nodes=[n.name for n in opt_nodes])
        plan.units.append(unit)
        for node in opt_nodes:
            plan.node_plans[node.name] = place_node(
                ctx, node, unit=unit.id, compute_s=0.0, memory_s=opt_s, feed_level=stream.level if offchip and stream
                else sram.level, feed_bytes=ctx.costs[node.name].bytes, ridge=ridge, allocation=0.0,
                micro_batches=m, time_s=0.0,
            )  # fmt: skip
        plan.step_overheads_s["optimizer"] = opt_s
        if offchip and stream is not None:
            plan.traffic_bytes[stream.name] = int(2 * sum(offchip_bytes.values()))
    if training and replicas > 1 and link is not None:
        grads = max(params_on.values(), default=0) * max(accum_pp, 1)
        # the ring's bandwidth term only: the IPU model has always left the link latency out
        plan.step_overheads_s["gradient_reduce"] = ring_allreduce_time(grads, replicas, link.bandwidth_bytes_per_s)
    plan.extra.update({
        "ipus": n_ipus,
        "layers_per_ipu": counts,
        "pipeline_stages": n_stages,
        "stages": [{"ipu": st.ipu, "layers": st.layers} for st in stages],
        "cycle_s": cycle,
        "optimizer_state": ("off-chip (streaming memory)" if offchip else "on-chip") if training else None,
        "memory_terms": {f"ipu{k}": {name: int(v) for name, v in t.items()} for k, t in sorted(terms.items())},
    })  # fmt: skip
    return plan


@dataclass(frozen=True, slots=True)
class _Serial:
    """A matmul's plan under the matmul proportion: serial passes, the temporaries the plan
    holds, and the operand it broadcasts again in each pass (bytes per micro-batch)."""

    passes: int = 1
    temporaries: float = 0.0
    broadcast_bytes: float = 0.0


_NO_MATMUL = _Serial()
"""The plan of a node that contracts nothing (most nodes): one pass, nothing held; shared, as it is frozen."""


def _serial_plan(ctx: LoweringContext, node: Node, m: int, gamma: float, budget: float) -> _Serial:
    """How the PopLibs planner fits a matmul's temporaries into ``budget`` (the matmul
    proportion of the IPU's memory). At full speed the plan wants ``gamma`` bytes of
    temporaries per operand byte (rearranged copies, partials), W. When W exceeds the budget
    the planner serialises the matmul into k = ceil(W / budget) passes over the larger
    operands; each pass holds 1/k of their temporaries plus the whole copy of the operand it
    broadcasts to every pass (the smaller input), so a small budget can be exceeded by that
    copy, as Poplar's plans can. Each pass after the first pays a sync and exchanges the
    broadcast operand again (the lowering's time); none of it where the budget does not bind."""
    graph = ctx.graph
    if ctx.costs[node.name].contraction_flops <= 0:
        return _NO_MATMUL
    sizes: list[float] = []
    total = 0.0
    for i, v in enumerate([*node.inputs, *node.outputs]):
        value = graph.values.get(v) if v else None
        if value is None:
            continue
        size = ctx.value_bytes(v) if value.kind.is_stored else _act_bytes(ctx, v) / m
        total += size
        if i < len(node.inputs) and size > 0:
            sizes.append(size)
    broadcast = min(sizes, default=0.0)
    want = gamma * total
    if want <= budget or budget <= 0:
        return _Serial(1, want, broadcast)
    passes = math.ceil(want / budget)
    return _Serial(passes, gamma * (broadcast + (total - broadcast) / passes), broadcast)


def _temporaries(serials: dict[str, _Serial], nodes: list[Node]) -> float:
    """Matmul temporaries of ``nodes``: the largest any one matmul's plan holds (``serials``: each
    node's `_serial_plan` under its IPU's budget)."""
    return max((serials[n.name].temporaries for n in nodes), default=0.0)


def _trained_params(ctx: LoweringContext) -> int:
    """Parameters the training pass's optimizer updates (0 for inference or a symbolic shape)."""
    train = meta.training_state(ctx.graph)
    return int(train.params or 0) if train is not None else 0


def _adam_cycles(ctx: LoweringContext, node: Node, lanes: float, special: float) -> float:
    """Tile cycles per parameter of an optimizer step node: its element ops on the fp32 vector
    lanes and its transcendentals (the square root) at the fp32 special-function rate."""
    cost = ctx.costs[node.name]
    params = _trained_params(ctx)
    if not params:
        return 0.0
    return (cost.vector_flops / lanes + cost.special_ops / special) / params


def _overflow(k: int, t: dict[str, float], resident: float, capacity: float, inflight: int, recompute: bool,
              training: bool, n_ipus: int) -> str:  # fmt: skip
    """The failure line: the IPU, its total, the part that overflows most, and what to try."""
    largest = max((name for name in t if name != "program"), key=t.__getitem__)
    parts = ", ".join(f"{name.replace('_', ' ')} {v / 1e6:.0f} MB" for name, v in t.items() if v >= 0.5e6)
    hint = {
        "stash": "use --recompute" if training and not recompute else "put fewer layers on early IPUs (--layers-per-ipu)",
        "matmul_temporaries": "lower --matmul-proportion",
        "optimizer_state": "keep optimizer state off-chip (--optimizer-state offchip) or shard it over --replicas",
        "live_activations": "use fewer samples per micro-batch (more --micro-batches)"
        + ("" if recompute or not training else " or --recompute"),
    }.get(largest, f"use more IPUs (--ipus {_ipus_needed(t, capacity, n_ipus)} or more)")
    extra = f" for {inflight} micro-batches in flight" if largest == "stash" else ""
    return (
        f"IPU {k} needs {resident / 1e6:.0f} MB of tile SRAM, it has {capacity / 1e6:.1f} MB; "
        f"largest part: {largest.replace('_', ' ')} {t[largest] / 1e6:.0f} MB{extra} ({parts}); {hint}"
    )


def _ipus_needed(t: dict[str, float], capacity: float, n_ipus: int) -> int:
    """IPUs that would hold this IPU's load spread evenly, each paying its own program memory."""
    spare = capacity - t["program"]
    spread = sum(v for name, v in t.items() if name != "program") * n_ipus
    return max(n_ipus + 1, math.ceil(spread / spare)) if spare > 0 else n_ipus + 1
