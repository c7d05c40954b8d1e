"""SambaNova RDU lowering: the graph as SambaFlow compiles it, sections run one after another.

The chip as the compiler sees it: an SN30 RDU has ``arch.tiles_per_rdu`` tiles of
``arch.pcus_per_tile`` PCUs and ``arch.pmus_per_tile`` PMUs; a graph is compiled onto
``--tiles N`` of them (4 = half an RDU, the other half runs a second copy as data
parallelism inside the PEF, or another job). The compiler plans with ``--resource-scale``
of those units (SambaFlow's ``--resources-scaling-factors``). A pipeline stage holds its
scratchpad, so a node's PCUs equal its PMU demand (PCU/PMU pairing), at least one PCU,
matmuls in multiples of ``arch.matmul_pcu_grain``.

Sections, per opt level (forward, backward and optimizer never share a section):

- O0: one operator per section (SambaFlow: "o0 compiles each operator as a separate
  section"); the optimizer is one section per parameter tensor.
- O1: one module (an attention, an MLP: ``module_key``) per section, cut where it would
  exceed the planning capacity.
- O3: greedy fusion of fusion groups along the program order while the section's demand
  fits the planning capacity. The attention core (QKᵀ matmul to AV matmul) is one atomic
  group: its scores stay on chip and the backward recomputes them. A group larger than the
  capacity is split (along batch or heads) into ``ceil(demand / units)`` sections tiled over
  every unit of the compiled tiles: the resource scale is the margin fusion keeps, not a
  cap on a forced split (measured PCU utilisation reaches 94 % with a 0.8 scale).
  The optimizer (all parameters) is one streaming section.

A section costs ``section_reconfig_s`` (its switch) plus the larger of its compute (below)
and its DDR traffic (weights, and every
tensor crossing its boundary: the section's inputs, its outputs read elsewhere and the
activations it saves for backward) at the DDR streaming bandwidth. The host's per-step
cost is its own row, ``Plan.step_overheads_s["host"] = host_step_s + host_per_section_s ·
sections`` for a training step; both were fitted to training steps (data loading, the
Python training loop). No SN30 inference host time is published, so an inference run pays
only the per-section launches, as the row ``HOST_ESTIMATE`` ("host (estimate: fitted to
training steps)", also in ``plan.notes``).

A section's compute is each node's Cost in three parts at the compiled tiles' rates:
contraction FLOPs at ``peak · tiles/tiles_per_rdu · pcu_efficiency[opt]`` (PCUs in systolic
mode), vector FLOPs and special functions at the target's ``[compute.vector_flops]`` and
``[compute.special_ops]`` rates (PCUs in SIMD mode; `Target.rate`), both scaled by ``tiles/tiles_per_rdu``.
Those are a stage's seconds on all the compiled tiles; the section is one pipeline whose stages
hold PCUs in proportion to their memory demand, spread over the planning capacity (every unit
for a tiled group), so it lasts its slowest stage (`pipeline_s`): ``pcus/room · Σp · max_i t_i/p_i``.
A balanced section (work in proportion to PCUs, a GEMM alone, a layer of large GEMMs) runs near
the fitted rate; one whose PCUs follow weight bytes while its work follows FLOPs (small
matmuls fused with norms, activations and the attention core at hidden 1600) waits on its
slowest stage. This is the GEMM-shape dependence of the contraction rate on this chip.
The rates are the plan's precision's: fp32 runs at half the bf16 rates (a 32-bit lane does one
fp32 or two bf16 operations), and its bytes are twice, so the whole-step mixed / fp32 ratio
comes out of the lanes, the DDR traffic and the fixed host cost.
Every figure comes from the target (targets/sn30.toml) with its source.

The RDU runs one section at a time and a section is one pipeline: every node is on one lane
(``RDU_LANE``), so the emulated section lasts its planned time. The section's time is shared
out over its stages for the per-node figures: first what each stage's own DDR stream and its
FLOPs at the tiles' peak need (no stage is given less than its bytes can cross in), then the
rest by what each stage would take alone.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dabench_ir.errors import TargetError, UserError
from dabench_ir.ir import Cost, DType
from dabench_ir.lowering import Lowering, LoweringOptions
from dabench_ir.lowering._common import (
    LoweringContext,
    module_key,
    place_node,
    training_state,
    weight_bytes,
)
from dabench_ir.passes import meta
from dabench_ir.passes.training import BACKWARD_COST, FORWARD_COST, SAVED, is_optimizer_step
from dabench_ir.plan import Plan, Schedule, Unit, UnitStats
from dabench_ir.timeline import Bound

if TYPE_CHECKING:
    from dabench_ir.ir import Graph, Node
    from dabench_ir.targets import Target

__all__ = [
    "DEVICE_STEP",
    "HOST_ESTIMATE",
    "LOWERING",
    "Chip",
    "RduLowering",
    "RduOptions",
    "Section",
    "ddr_assumption",
    "ddr_footprint",
    "form_sections",
    "pipeline_s",
    "saved_for_backward",
]  # fmt: skip

logger = logging.getLogger(__name__)

_MAX_PARTS = 1_000_000
"""Sections one node group may be cut into before the placement is refused as meaningless (issue 21)."""
_WHO = "rdu"
PHASES = ("forward", "backward", "optimizer")
HOST_ESTIMATE = "host (estimate: fitted to training steps)"
DEVICE_STEP = "device step"
"""The overhead row of a training step's fixed RDU time (``overheads.device_step_s``): device time, not host."""
RDU_LANE = "rdu"
"""The one lane every node of an RDU plan runs on: sections run one after another, each one pipeline."""
"""The overhead row of an inference run's host cost: training's fitted per-section figure, no
inference source. Its name says "(estimate": the why advice holds such rows fixed (`dabench_ir.advice`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RduOptions(LoweringOptions):
    """What the RDU lowering reads."""

    micro_batches: int | None
    opt_level: str
    tiles: int | None
    resource_scale: float


@dataclass(frozen=True, slots=True)
class Chip:
    """The RDU as the compiler sees it: units on the compiled tiles, the planning capacity."""

    tiles: int
    tiles_per_rdu: int
    pcus: int  # PCUs on the compiled tiles (the allocation denominator)
    pmus: int
    capacity: int  # PCUs (and PMUs) the compiler plans fused sections with: floor(units · resource_scale)
    act_bytes_per_pmu: float
    weight_bytes_per_pmu: float
    matmul_grain: int

    @property
    def units(self) -> int:
        """PCU/PMU pairs on the compiled tiles: what a group split into parts spreads over."""
        return min(self.pcus, self.pmus)

    @classmethod
    def of(cls, target: Target, options: RduOptions) -> Chip:
        per_rdu = int(target.arch_value("tiles_per_rdu", needed_by=_WHO))
        tiles = options.tiles or per_rdu
        if tiles > per_rdu:
            raise UserError(f"--tiles {tiles}: {target.name} has {per_rdu} tiles per RDU; give 1 to {per_rdu}")
        pcus = tiles * int(target.arch_value("pcus_per_tile", needed_by=_WHO))
        pmus = tiles * int(target.arch_value("pmus_per_tile", needed_by=_WHO))
        return cls(
            tiles=tiles,
            tiles_per_rdu=per_rdu,
            pcus=pcus,
            pmus=pmus,
            capacity=max(1, math.floor(min(pcus, pmus) * options.resource_scale)),
            act_bytes_per_pmu=target.arch_value("act_bytes_per_pmu", needed_by=_WHO),
            weight_bytes_per_pmu=target.arch_value("weight_bytes_per_pmu", needed_by=_WHO),
            matmul_grain=max(1, int(target.arch_value("matmul_pcu_grain", 1))),
        )


@dataclass(slots=True)
class Section:
    """One compiled section: its nodes (program order of its phase) and what it needs."""

    phase: str
    nodes: list[Node] = field(default_factory=list)
    pcus: int = 0  # PCU demand of the nodes (paired with their PMUs), all parts together
    pmus: int = 0
    parts: int = 1  # sections the compiler cuts it into (a group above the capacity)
    oversized: bool = False  # one group above the planning capacity: tiled over every unit


def _phase_cost(node: Node, phase: str, fallback: Cost) -> Cost:
    if phase == "optimizer":
        return fallback
    key = FORWARD_COST if phase == "forward" else BACKWARD_COST
    cost = node.meta.get(key)
    if cost is None:
        return fallback if phase == "forward" else Cost()
    return cost


class _Demand:
    """PMU and PCU demand of one node in one phase, per sample (sections stream samples)."""

    def __init__(self, ctx: LoweringContext, chip: Chip) -> None:
        self.ctx = ctx
        self.chip = chip
        # (PMUs, PCUs) per node, one map a phase: each asked several times a node and phase
        self._demand: dict[str, dict[str, tuple[int, int]]] = {phase: {} for phase in PHASES}

    def cost(self, node: Node, phase: str) -> Cost:
        return _phase_cost(node, phase, self.ctx.costs[node.name])

    def pmu(self, node: Node, phase: str) -> int:
        return self.of(node, phase)[0]

    def pcu(self, node: Node, phase: str) -> int:
        return self.of(node, phase)[1]

    def of(self, node: Node, phase: str) -> tuple[int, int]:
        """(PMUs, PCUs) of ``node`` in ``phase``."""
        memo = self._demand[phase]
        got = memo.get(node.name)
        if got is None:
            cost = self.cost(node, phase)  # read once for both
            pmu = self._pmu_of(node, cost)
            pcu = pmu
            if pmu and cost.contraction_flops > 0:
                g = self.chip.matmul_grain
                pcu = math.ceil(pmu / g) * g
            got = memo[node.name] = (pmu, pcu)
        return got

    def _pmu_of(self, node: Node, c: Cost) -> int:
        """PMUs of ``node`` for ``c``, its cost in the phase asked (`cost`)."""
        if not self.ctx.is_work(node):
            return 0
        act = (c.act_bytes_in + c.act_bytes_out) / self.ctx.batch
        return max(1, math.ceil(act / self.chip.act_bytes_per_pmu)) + math.ceil(
            c.weight_bytes / self.chip.weight_bytes_per_pmu
        )


def _attention_cores(ctx: LoweringContext, nodes: list[Node]) -> dict[str, int]:
    """Node -> its attention core id: from an activation-by-activation matmul (QKᵀ) to the next (AV)."""
    core: dict[str, int] = {}
    start: int | None = None
    layer = None
    for i, node in enumerate(nodes):
        cost = ctx.costs[node.name]
        act_matmul = cost.contraction_flops > 0 and cost.weight_bytes == 0  # activation x activation
        if act_matmul and start is not None and node.layer == layer:
            for n in nodes[start : i + 1]:
                core[n.name] = start
            start = None
        elif act_matmul:
            start, layer = i, node.layer
    return core


def _groups(ctx: LoweringContext, nodes: list[Node], opt_level: str,
            core: dict[str, int] | None = None) -> list[list[Node]]:  # fmt: skip
    """Fusion groups in program order: O3 keeps each attention core whole; otherwise one node each
    (``core``: `_attention_cores` of ``nodes``, when the caller has it)."""
    if core is None:
        core = _attention_cores(ctx, nodes) if opt_level != "O0" else {}
    groups: list[list[Node]] = []
    last_key = None
    for node in nodes:
        key = core.get(node.name)
        if groups and ((key is not None and key == last_key) or not ctx.is_work(node)):
            groups[-1].append(node)  # the core stays whole; bookkeeping rides along
        else:
            groups.append([node])
        last_key = key
    return groups


def form_sections(ctx: LoweringContext, chip: Chip, opt_level: str, demand: _Demand | None = None,
                  cores: dict[str, int] | None = None) -> list[Section]:  # fmt: skip
    """The sections SambaFlow compiles at ``opt_level``: forward, then backward, then optimizer
    (``demand``: the nodes' `_Demand` on ``chip``, ``cores``: the forward's `_attention_cores`
    at that level, when the caller has them)."""
    demand = demand or _Demand(ctx, chip)
    train = meta.graph_mode(ctx.graph) == "train"
    body, optimizer = _body_and_optimizer(ctx.graph)
    out: list[Section] = []
    modules: dict[tuple[str, int | None], str] = {}  # `module_key` by (scope, layer): a scope holds ~3 nodes
    chains = [("forward", body)]
    if train:
        chains.append(("backward", [n for n in reversed(body) if demand.cost(n, "backward").flops > 0]))
    for phase, chain in chains:
        cur = Section(phase)
        key = None
        for group in _groups(ctx, chain, opt_level, cores if phase == "forward" else None):
            pmu = pcu = 0
            for n in group:
                node_pmu, node_pcu = demand.of(n, phase)
                pmu += node_pmu
                pcu += node_pcu
            need = max(pcu, pmu)
            has_work = cur.pcus > 0  # a node holds PCUs exactly when it works (`_Demand`): cur holds work
            gkey = None
            if opt_level == "O1":  # only O1 cuts at modules
                first = group[0]
                gkey = modules.get((first.scope, first.layer))
                if gkey is None:
                    gkey = modules[first.scope, first.layer] = module_key(first)
            if not pcu:  # no work: rides with the current section
                cur.nodes.extend(group)
                continue
            if opt_level == "O0":
                split = has_work
            elif opt_level == "O1":
                split = has_work and (gkey != key or max(cur.pcus, cur.pmus) + need > chip.capacity)
            else:
                split = has_work and max(cur.pcus, cur.pmus) + need > chip.capacity
            last = out[-1] if out and not (cur.pcus or cur.pmus) else None  # cur holds no demand yet
            if (
                opt_level not in ("O0", "O1")
                and last is not None
                and last.oversized
                and last.phase == phase
                and max(last.pcus, last.pmus) + need <= last.parts * chip.capacity
            ):  # fuses into the room the last part of a tiled group leaves (the loss after the LM head)
                last.nodes.extend(cur.nodes + list(group))  # with the work-free nodes waiting in cur
                cur.nodes.clear()
                last.pcus += pcu
                last.pmus += pmu
                continue
            if opt_level != "O0" and need > chip.capacity:  # bigger than the chip: its own sections
                if cur.nodes:
                    out.append(cur)
                parts = math.ceil(need / chip.units)
                if parts > _MAX_PARTS:  # a node millions of chips large: no placement means anything
                    raise UserError(f"{group[0].name}: would be cut into {parts:,} sections (more than "
                                    f"{_MAX_PARTS:,}); the model is far larger than the chip: use smaller dims")
                out.append(Section(phase, list(group), pcu, pmu, parts, oversized=True))
                cur, key = Section(phase), None
                continue
            if split:
                out.append(cur)
                cur = Section(phase)
            cur.nodes.extend(group)
            cur.pcus += pcu
            cur.pmus += pmu
            key = gkey
        if cur.nodes:
            out.append(cur)
    if optimizer:
        tensors = len({v for n in optimizer for v in n.inputs if v}) if opt_level == "O0" else 1
        out.append(Section("optimizer", optimizer, 1, 1, max(1, tensors)))
    return out


def _body_and_optimizer(graph: Graph) -> tuple[list[Node], list[Node]]:
    """The graph's nodes but its optimizer steps, and its optimizer steps, each in program order."""
    body: list[Node] = []
    optimizer: list[Node] = []
    for n in graph.nodes:
        (optimizer if is_optimizer_step(n) else body).append(n)
    return body, optimizer


class RduLowering(Lowering):
    """SambaNova RDU: sections run one after another, each an on-chip pipeline fed from DDR."""

    name = "rdu"
    kinds = ("rdu",)
    Options = RduOptions
    feed = "off-chip"  # sections read weights and boundary tensors from DDR


    def _lower(self, ctx: LoweringContext, target: Target, options: RduOptions) -> Plan:
        return _lower(ctx, target, options)


LOWERING = RduLowering()


def saved_for_backward(graph: Graph, recomputed: set[str]) -> dict[str, dict[str, int]]:
    """What the forward leaves in DDR for the backward, by the value that carries it: each entry
    of the training pass's ``SAVED`` record (a matmul's activation operands, a norm's input and
    statistics, a fused core's output and log-sum-exp, ``{key: bytes}``), less the attention
    core's internals that are recomputed on chip. The one owner of that set: the DDR footprint
    holds it and the sections' DDR traffic writes and reads it."""
    out: dict[str, dict[str, int]] = {}
    for node in graph.nodes:
        if is_optimizer_step(node):
            continue
        for key, nbytes in (node.meta.get(SAVED) or {}).items():
            base = key.split("#")[0]
            if base not in recomputed:
                out.setdefault(base, {})[key] = int(nbytes)
    return out


def _section_ddr(ctx: LoweringContext, sec: Section, section_of: dict[str, dict[str, int]], i: int,
                 recomputed: set[str], saved: dict[str, dict[str, int]]) -> tuple[int, dict[str, int]]:  # fmt: skip
    """DDR bytes of one section and each node's share: weights, and tensors crossing its boundary.

    Forward: activations read from outside, outputs read by another forward section, and what
    the backward keeps of its outputs (``saved``: `saved_for_backward`, written once).
    Backward: the gradient read from and written to other sections, what its operators saved
    (read back once each) and the weights (read) and gradients (written). Optimizer: its state
    traffic. ``section_of``: phase -> node -> the index of its section in that phase.
    """
    graph = ctx.graph
    values, activations, consumers = graph.values, ctx.activations, graph.consumers
    outputs = set(graph.outputs)
    forward = sec.phase == "forward"
    home = section_of[sec.phase]
    per_node: dict[str, int] = {}
    seen: set[str] = set()
    for node in sec.nodes:
        if not ctx.is_work(node):
            continue
        cost = _phase_cost(node, sec.phase, ctx.costs[node.name])
        if sec.phase == "optimizer":
            per_node[node.name] = cost.bytes
            continue
        nbytes = cost.weight_bytes
        if forward:
            for v in node.inputs:  # activations from another section
                if v not in activations or v in seen:
                    continue
                producer = values[v].producer
                if producer is not None and home.get(producer) == i:
                    continue
                seen.add(v)
                nbytes += ctx.value_bytes(v)
        else:  # the backward reads back what its operator saved
            for key, size in (node.meta.get(SAVED) or {}).items():
                if key.split("#")[0] in recomputed or key in seen:
                    continue
                seen.add(key)
                nbytes += int(size)
        out_default = cost.act_bytes_out // max(1, len(node.outputs))
        for v in node.outputs:
            if not v:
                continue
            readers = consumers.get(v, ())
            size = ctx.value_bytes(v, out_default)
            if forward:
                leaves = v in outputs  # or read by another section: any() written out (its generator cost more)
                if not leaves:
                    for c in readers:
                        if home.get(c.name) != i:
                            leaves = True
                            break
                kept = saved.get(v)
                if leaves:
                    nbytes += size + (sum(b for key, b in kept.items() if key != v) if kept else 0)  # statistics beside it
                elif kept:
                    nbytes += sum(kept.values())
            elif any(home.get(c.name) != i for c in readers):
                nbytes += size  # the incoming gradient dY, read from the section that produced it
        if not forward:  # dX for inputs produced in another section
            for v in node.inputs:
                if v not in activations:
                    continue
                producer = values[v].producer
                if producer is not None and home.get(producer, i) != i:
                    nbytes += ctx.value_bytes(v)
        per_node[node.name] = nbytes
    return sum(per_node.values()), per_node


def reduction_depths(ctx: LoweringContext, node: Node) -> tuple[float, float, float] | None:
    """A contraction's reduction depths: the forward's K, and the two backward GEMMs' (dA = dC·Bᵀ
    reduces over N, the output's last dim; dB = Aᵀ·dC over the rows, every token when B is a
    weight, else the per-matrix rows M). None when the node contracts nothing or its shape is unknown."""
    cost = ctx.costs[node.name]
    if cost.contraction_flops <= 0:  # most nodes: asked first, before the output is looked for
        return None
    out = next((v for v in node.outputs if v), None)
    if out is None:
        return None
    fwd = _phase_cost(node, "forward", cost)
    try:
        dims = ctx.graph.type_of(out).dims()
    except Exception:  # an unknown rank or a free symbol: no shape to tile
        return None
    numel = math.prod(dims) if dims else 0
    if not numel or not dims:
        return None
    k = fwd.contraction_flops / (2 * numel)
    n = float(dims[-1])
    b = node.inputs[1] if len(node.inputs) > 1 else None
    rows = numel / n if b in ctx.stored else float(dims[-2] if len(dims) > 1 else 1)
    return max(k, 1.0), n, rows


@dataclass(frozen=True, slots=True)
class _Rates:
    """What the compiled tiles sustain per op class: contraction FLOPs on PCUs in systolic mode,
    vector FLOPs and special-function ops on PCUs in SIMD mode (`Target.rate`:
    ``[compute.vector_flops]``, ``[compute.special_ops]``).

    A contraction runs at ``contraction · K / (K + k_half)``: the PCU reduces along its lanes
    (the cross-lane reduction tree, SN40L at Hot Chips 2024) and each output vector pays the
    tree's drain and its write-back once, amortised over the reduction depth K. ``contraction``
    is the tiles' peak times the fitted asymptotic share ``pcu_efficiency_<opt>``; ``k_half``
    is the fitted ``arch.pcu_k_half`` (the depth at which half the asymptotic rate is reached).
    """

    contraction: float
    vector: float
    special: float
    k_half: float = 0.0

    def shape(self, k: float) -> float:
        """Share of the asymptotic contraction rate a GEMM of reduction depth ``k`` reaches."""
        return k / (k + self.k_half) if self.k_half > 0 else 1.0

    def time(self, cost: Cost, k: float | None = None) -> float:
        """Seconds of ``cost``: each of its three parts at its own rate.

        ``k``: the forward contraction's reduction depth K (`reduction_depths`; None: the asymptotic
        rate); a backward's split over its GEMMs is `_backward_contraction_s`."""
        t = 0  # the vector and special parts added to 0 in turn, as sum() did (a generator cost more than both)
        if cost.vector_flops and self.vector > 0:
            t += cost.vector_flops / self.vector
        if cost.special_ops and self.special > 0:
            t += cost.special_ops / self.special
        c = cost.contraction_flops
        if not c or self.contraction <= 0:
            return t
        if k is None:
            return t + c / self.contraction
        return t + c / (self.contraction * self.shape(k))


def _backward_contraction_s(rates: _Rates, c: float, k: float, n: float, rows: float, fwd: float | None = None) -> float:
    """A backward's contraction seconds: dA (depth N) and dB (depth rows), each one forward's FLOPs;
    with FLOPs for one gradient only, the weight's (dB) when there is one; the rest at depth K."""
    one = fwd if fwd else c / 2  # FLOPs of one backward GEMM: the forward's
    parts = [(min(c, one), rows), (min(max(c - one, 0.0), one), n), (max(c - 2 * one, 0.0), k)]
    return sum(f / (rates.contraction * rates.shape(d)) for f, d in parts if f > 0)


def pipeline_s(stages: list[tuple[float, int]], room: int, pcus: int) -> float:
    """A section's compute seconds as one pipeline whose slowest stage sets the pace.

    ``stages``: (seconds the stage's work takes on all ``pcus`` PCUs of the compiled tiles, its
    PCU demand). The compiler sizes each stage by its memory (a PCU per PMU it needs: `_Demand`),
    not by its FLOPs, and spreads the section's stages over ``room`` PCUs (the planning capacity;
    every unit for a group tiled into parts) in proportion to that demand: stage i holds
    ``p_i · room / Σp`` PCUs and takes ``t_i · pcus / (p_i · room / Σp)``. Every stage streams
    the same samples, so the section lasts its longest stage. A pipeline whose stages' work
    follows their PCUs (t_i ∝ p_i) lasts ``Σt · pcus / room``; any imbalance lengthens it.
    """
    if not stages:
        return 0.0
    held = 0  # sum(max(1, p)) and max(t / max(1, p)) in one loop (two generators were most of its time)
    slowest = None
    for t, p in stages:
        p = p if p > 1 else 1
        held += p
        if slowest is None or t / p > slowest:
            slowest = t / p
    return pcus / room * held * slowest


def _lower(ctx: LoweringContext, target: Target, options: RduOptions) -> Plan:
    graph = ctx.graph
    chip = Chip.of(target, options)
    m = options.micro_batches or ctx.batch
    opt_level = options.opt_level
    eff = target.arch_value(f"pcu_efficiency_{opt_level.lower()}", needed_by=_WHO)
    peak = target.peak_flops(ctx.precision)
    share = chip.tiles / chip.tiles_per_rdu
    rates = _Rates(
        contraction=peak * share * eff,  # systolic PCUs at the fitted achieved fraction
        vector=target.rate("vector", ctx.precision) * share,
        special=target.rate("special", ctx.precision) * share,
        k_half=target.arch_value("pcu_k_half", 0.0),
    )
    depth_of: dict[str, tuple[float, float, float] | None] = {}

    def node_s(node: Node, phase: str) -> float:  # a node's seconds in one phase at the tiles' rates
        if node.name not in depth_of:
            depth_of[node.name] = reduction_depths(ctx, node)
        cost = _phase_cost(node, phase, ctx.costs[node.name])
        d = depth_of[node.name]
        if d is None or phase == "optimizer":
            return rates.time(cost)
        if phase == "forward":
            return rates.time(cost, d[0])
        fwd = _phase_cost(node, "forward", ctx.costs[node.name]).contraction_flops
        t = rates.time(Cost(vector_flops=cost.vector_flops, special_ops=cost.special_ops))
        return t + _backward_contraction_s(rates, cost.contraction_flops, *d, fwd=fwd)

    ddr = target.memory(LOWERING.feed_level(target))
    bw = ddr.bandwidth_bytes_per_s
    ridge = target.ridge_point(ctx.precision, ddr)
    reconfig = target.overhead("section_reconfig_s")
    sram_bw = target.memory("on-chip").bandwidth_bytes_per_s if target.has_memory("on-chip") else bw
    plan = ctx.plan(target, options, Schedule.SEQUENTIAL, micro_batches=m)
    demand = _Demand(ctx, chip)
    cores = _attention_cores(ctx, _body_and_optimizer(graph)[0]) if opt_level != "O0" else {}
    sections = form_sections(ctx, chip, opt_level, demand, cores)  # the forward's cores found once for both
    section_of: dict[str, dict[str, int]] = {phase: {} for phase in PHASES}  # phase -> node -> its section
    for i, sec in enumerate(sections):
        in_phase = section_of[sec.phase]
        for n in sec.nodes:
            in_phase[n.name] = i
    # values inside an attention core: never leave the chip; the backward recomputes them
    recomputed = {v for name in cores for v in graph.node(name).outputs if v and _core_internal(graph, v, cores)}
    saved = saved_for_backward(graph, recomputed)
    core_fwd_flops: dict[int, int] = {}
    core_fwd_s: dict[int, float] = {}
    core_nodes: dict[int, list[Node]] = {}  # core id -> its nodes in order (a scan of every core per section was quadratic)
    for name, cid in cores.items():
        node = graph.node(name)
        fwd = _phase_cost(node, "forward", ctx.costs[name])
        core_fwd_flops[cid] = core_fwd_flops.get(cid, 0) + fwd.flops
        core_fwd_s[cid] = core_fwd_s.get(cid, 0.0) + node_s(node, "forward")
        core_nodes.setdefault(cid, []).append(node)
    dtype_peak: dict[DType, float] = {}

    def peak_of(node: Node) -> float:  # the compiled tiles' peak at the dtype the node computes in
        dt = ctx.node_precision(node)
        peak = dtype_peak.get(dt)
        if peak is None:  # one look-up a dtype, not one a node
            try:
                peak = dtype_peak[dt] = target.peak_flops(dt if dt.is_float else ctx.precision) * share
            except TargetError:
                peak = dtype_peak[dt] = target.peak_flops(ctx.precision) * share
        return peak

    # node -> [its home unit, then its time, compute, memory and bytes summed over its runs, in run order
    # from 0 as sum() adds] (a list of runs zipped and summed per node was a tenth of an O0 lowering)
    runs: dict[str, list] = {}
    section_bound: dict[str, Bound] = {}  # section -> what binds its pipeline (DDR traffic or compute)
    ddr_total = 0
    unit_index = 0
    section_bytes: list[int] = []  # each section's DDR bytes, for the training footprint
    for i, sec in enumerate(sections):
        ddr_bytes, node_bytes = _section_ddr(ctx, sec, section_of, i, recomputed, saved)
        section_bytes.append(ddr_bytes)
        flops: dict[str, int] = {}
        busy: dict[str, float] = {}
        through_pmus: dict[str, float] = {}  # a working node's bytes through the PMUs, in seconds
        working: list[Node] = []
        for n in sec.nodes:  # each node's phase cost read once for its FLOPs, time and bytes
            if ctx.is_work(n):
                cost = _phase_cost(n, sec.phase, ctx.costs[n.name])
                flops[n.name], busy[n.name], through_pmus[n.name] = cost.flops, node_s(n, sec.phase), cost.bytes / sram_bw
                working.append(n)
            else:
                flops[n.name], busy[n.name] = 0, 0.0
        stages = [(busy[n.name], demand.pcu(n, sec.phase)) for n in sec.nodes if busy[n.name] > 0]  # (s, PCUs)
        if sec.phase == "backward":  # recompute: the core's forward runs again inside its backward section
            for cid in {cores[n.name] for n in sec.nodes if n.name in cores}:
                first = next(n for n in sec.nodes if cores.get(n.name) == cid)
                flops[first.name] += core_fwd_flops[cid]
                busy[first.name] += core_fwd_s[cid]
                stages += [(node_s(c, "forward"), demand.pcu(c, "forward"))
                           for c in core_nodes[cid]]  # its forward nodes: stages of this section
        total_flops = sum(flops.values())
        room = chip.units if sec.oversized else chip.capacity  # a split group is tiled over every unit
        compute_s = pipeline_s(stages, room, chip.pcus)
        memory_s = ddr_bytes / bw
        # the section's time is shared out over its stages (one pipeline, reported per node):
        # first each stage's floor, what its own DDR stream and its FLOPs at the tiles' peak need,
        # then the rest by what it would take alone (its FLOPs on the PCUs plus its bytes through
        # the PMUs, so a data-movement stage or one with an estimated cost holds a share too)
        weights = {name: busy[name] + pmu_s for name, pmu_s in through_pmus.items()}
        wsum = sum(weights.values()) or 1
        floors = {n.name: max(node_bytes.get(n.name, 0) / bw, flops[n.name] / peak_of(n)) for n in working}
        # the floors fit in all but tiny sections (the DDR streams add up to the section's, the
        # FLOPs at the peak to pcu_efficiency of its compute); where they do not, the section
        # lasts their sum: no stage streams or computes faster than the chip can
        floor_s = sum(floors.values())
        work_s = max(compute_s, memory_s, floor_s)
        rest = work_s - floor_s
        ddr_total += ddr_bytes
        pcus = min(room, math.ceil(sec.pcus / sec.parts))
        pmus = min(room, math.ceil(sec.pmus / sec.parts))
        li = _section_li(demand, sec, flops)
        for _part in range(sec.parts):
            unit = Unit(
                id=f"section{unit_index}",
                kind="rdu_section",
                nodes=[n.name for n in sec.nodes],
                resources={
                    "phase_" + sec.phase: 1.0,
                    "pcus": float(pcus),
                    "pmus": float(pmus),
                    "pcu_allocation": pcus / chip.pcus,
                    "flops": total_flops / sec.parts,
                    "ddr_bytes": float(ddr_bytes / sec.parts),
                    "compute_s": compute_s / sec.parts,
                    "ddr_s": memory_s / sec.parts,
                    "time_s": work_s / sec.parts,  # max(compute_s, ddr_s), or the stages' floors in a tiny section
                },
                stats=UnitStats(pmu_allocation=pmus / chip.pmus, load_imbalance=li, feed_bytes=float(ddr_bytes / sec.parts)),
                allocation=pcus / chip.pcus,
                gap_before_s=reconfig,
                gap_kind="section_reconfig",
            )
            unit_index += 1
            for n in sec.nodes:
                t = (floors.get(n.name, 0.0) + rest * weights.get(n.name, 0.0) / wsum) / sec.parts
                unit.node_s[n.name] = t / m
                nbytes = node_bytes.get(n.name, 0)
                run = runs.get(n.name)
                if run is None:
                    run = runs[n.name] = [unit.id, 0, 0, 0, 0]
                run[1] += t
                run[2] += busy[n.name] / sec.parts
                run[3] += nbytes / bw / sec.parts
                run[4] += nbytes // sec.parts
            plan.units.append(unit)
            section_bound[unit.id] = Bound.MEMORY if memory_s > compute_s else Bound.COMPUTE
    allocation = {u.id: u.allocation for u in plan.units}
    # One lane for every node: the RDU runs one section at a time and a section is one pipeline,
    # so nothing in a section overlaps anything else. A node runs in its forward and its backward
    # section; a lane per home section would let a backward section's nodes from different
    # forward sections overlap one another and end before the section's planned time.
    for node in graph.nodes:
        home, span, compute, memory, moved = runs.get(node.name) or ("section0", 0, 0, 0, 0)
        plan.node_plans[node.name] = np_ = place_node(
            ctx,
            node,
            unit=home,
            lane=RDU_LANE,
            compute_s=compute,
            memory_s=memory,
            feed_level=ddr.level,
            feed_bytes=moved,
            ridge=ridge,
            allocation=allocation.get(home, 0.0),  # the PCUs of the section it runs in
            micro_batches=m,
            time_s=span,
        )
        if np_.bound in (Bound.COMPUTE, Bound.MEMORY) and home in section_bound:
            np_.bound = section_bound[home]  # one pipeline: what binds the section binds each of its nodes
    n_sections = len(plan.units)
    plan.traffic_bytes[ddr.name] = ddr_total
    training = meta.graph_mode(ctx.graph) == "train"
    host_step = target.overhead("host_step_s") if training else 0.0
    host_key = "host" if training else HOST_ESTIMATE
    plan.step_overheads_s[host_key] = host_step + target.overhead("host_per_section_s") * n_sections
    device_step = target.overhead("device_step_s") if training else 0.0
    if device_step:
        plan.step_overheads_s[DEVICE_STEP] = device_step
    if not training:
        per = target.overhead("host_per_section_s") * 1e3
        plan.notes.append(
            f"{host_key}: {per:.3g} ms per section launch x {n_sections} sections, fitted to training steps "
            "(no published SN30 inference host time)"
        )
    footprint = ddr_footprint(ctx, sections, section_bytes, saved) if training else None
    resident = sum(footprint.values()) if footprint is not None else ctx.resident_bytes()
    plan.memory_bytes[ddr.name] = resident
    if footprint is not None:
        plan.extra["ddr_bytes_by_kind"] = dict(footprint)
        plan.notes.append(ddr_assumption(ctx, m, bool(recomputed)))
    if target.has_memory("on-chip"):
        sram = target.memory("on-chip")
        pmu_bytes = sram.capacity_bytes / (chip.tiles_per_rdu * chip.pmus / chip.tiles)
        plan.memory_bytes[sram.name] = int(max((u.resources["pmus"] for u in plan.units), default=0) * pmu_bytes)
    if resident > ddr.capacity_bytes:
        held = f" ({ddr_assumption(ctx, m, bool(recomputed))})" if footprint is not None else ""
        plan.fail(
            f"weights and activations need {resident / 1e9:.1f} GB of DDR, the RDU has {ddr.capacity_bytes / 1e9:.1f} GB"
            + held,
            resident,
            ddr.capacity_bytes,
        )
    busy = [(u, u.resources["compute_s"], u.resources["time_s"]) for u in plan.units]
    span = sum(t for _, _, t in busy) or 1.0
    plan.extra.update(
        {
            "sections": n_sections,
            "sections_by_phase": {p: sum(1 for u in plan.units if f"phase_{p}" in u.resources) for p in PHASES},
            "opt_level": opt_level,
            "tiles": chip.tiles,
            "planning_capacity_pcus": chip.capacity,
            "highest_pcu_allocation": max((u.allocation for u in plan.units), default=0.0),
            "pcu_allocation_time_weighted": sum(u.allocation * t for u, _, t in busy) / span,
            "pmu_allocation_time_weighted": sum((u.stats.pmu_allocation or 0.0) * t for u, _, t in busy) / span,
            "load_imbalance_time_weighted": sum((u.stats.load_imbalance or 0.0) * t for u, _, t in busy) / span,
            "rdu_time_s": sum(reconfig + t for _, _, t in busy) + plan.step_overheads_s.get(DEVICE_STEP, 0.0),
            "host_time_s": plan.step_overheads_s[host_key],
        }
    )
    return plan


def ddr_assumption(ctx: LoweringContext, micro_batches: int, recomputed: bool) -> str:
    """The memory assumption of a training plan's DDR figure, for its notes and any does-not-fit
    reason: what it holds, and how this run batches, recomputes and treats attention."""
    record = meta.training_state(ctx.graph)
    recompute = getattr(record, "recompute_mode", "none")
    batching = (f"the batch of {ctx.batch} streams through each section in {micro_batches} piece(s) and its saved "
                "tensors are all kept (one weight update per step, no gradient accumulation)")  # fmt: skip
    attention = ("the attention scores stay on chip and are recomputed in backward (fused core)" if recomputed
                 else "no attention core fused on chip: its scores are saved like any tensor")  # fmt: skip
    return (
        "DDR as SambaFlow spends it in training: weights, gradients, fp32 master weights and Adam moments, "
        "each operator's saved inputs as autograd keeps them "
        f"(recompute {recompute}), {batching}; {attention}; and the largest section's boundary tensors in flight"
    )


def ddr_footprint(ctx: LoweringContext, sections: list[Section], section_bytes: list[int],
                  saved: dict[str, dict[str, int]]) -> dict[str, int]:  # fmt: skip
    """What a training step holds in DDR at its peak, by kind (bytes).

    Sections exchange tensors through DDR and the backward reads what the forward left there:
    ``saved_activations`` is what each operator's backward needs (``saved``:
    `saved_for_backward`, PyTorch's saved tensors: a matmul's activation operands, a norm's input
    and statistics, GELU's input, ...), over the whole batch, less the attention core's internal
    values (scores, probabilities) that never leave the chip and are recomputed; the sections'
    DDR traffic writes and reads the same set. ``transient`` is the largest section's boundary
    tensors besides its weights
    (what is in flight while it runs; it may count a saved tensor twice: an upper bound).
    The training state is the training pass's (gradients, master weights, moments).
    ``section_bytes``: each section's DDR bytes, as `_section_ddr` counted them for its time.
    """
    state = training_state(ctx)
    transient = 0
    for i, sec in enumerate(sections):
        if sec.phase == "optimizer":
            continue
        weights = sum(_phase_cost(n, sec.phase, ctx.costs[n.name]).weight_bytes for n in sec.nodes if ctx.is_work(n))
        transient = max(transient, section_bytes[i] - weights)
    return {
        "weights": weight_bytes(ctx),
        "gradients": state.gradients,
        "master_weights": state.master_weights,
        "optimizer": state.optimizer,
        "saved_activations": sum(b for kept in saved.values() for b in kept.values()),
        "transient": transient,
    }


def _core_internal(graph, v: str, cores: dict[str, int]) -> bool:
    """A core's value that only its own core reads (the scores, probabilities): never saved."""
    value = graph.values.get(v)
    if value is None or value.producer not in cores:
        return False
    readers = graph.consumers.get(v, [])
    return bool(readers) and all(cores.get(r.name) == cores[value.producer] for r in readers)


def _section_li(demand: _Demand, sec: Section, flops: dict[str, int]) -> float:
    """Load imbalance of a section's pipeline: mean / max stage time, a stage's time being its
    FLOPs over the PCUs it holds (its paired PMU demand)."""
    times = [flops[n.name] / max(1, demand.pcu(n, sec.phase)) for n in sec.nodes if flops.get(n.name)]
    if not times:
        return 1.0
    return (sum(times) / len(times)) / max(times)
