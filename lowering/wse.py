"""Cerebras WSE lowering: pipelined kernel regions as the compiler maps them, or weight streaming.

**Pipelined** (layer-pipelined) mode, as the Cerebras compiler maps a model (docs/targets.md,
WSE section): the graph is cut into kernels at the compiler's granularity (a whole attention
block, each fc, layer norm, GELU, residual add, embedding/LM head, loss; `wse_kernels`), each
kernel gets a rectangular region of PEs and all run at once, samples streaming through.

- A kernel's busy PE-seconds per sample ``W = (C/f_mm + V/f_vec + S*c_sp + D/link) / clock``
  from its nodes' `Cost` (contraction FLOPs at the matmul rate, vector ops at the vector
  rate, transcendental ops at a fixed cycle count, data movement at the fabric link width);
  on ``p`` PEs one sample takes ``t = W/p + tau``: ``tau`` is the per-token fixed time of
  the kernel's class (task handshakes, reduction latency, fabric hops) that more PEs do
  not shorten. Utilisation ``(W/p)/t``, rate ``1/t``.
- Regions are balanced to one period (`balance` with the fixed times): heavy kernels get
  what keeps pace, small ones just enough. A region is at least ``ceil(width/row_chunk)``
  PEs and large enough to hold its weights and optimizer state, at most one row chunk per
  PE of its output and never grown below ``min_utilisation``. A residual add whose other
  input crosses attention holds one sample of its skip stream in a FIFO in its region
  (whole rows of ``ceil(width/row_chunk)`` PEs; `_skip_bytes`).
- The wafer is shared with an I/O region and routing/FIFO PEs per kernel PE, and only
  ``max_active_fraction`` of it can be placed; pipeline buffers hold the block-boundary
  activations that are in flight between a block's forward and backward (training).
- Replicas (on-wafer data parallel) each get their regions and pay a gradient reduction
  over the fabric per step; input transmission over the system I/O caps the rate.

**Weight streaming**: each decoder layer in turn runs on the whole wafer while its weights
stream in from MemoryX (forward and again in backward; gradients stream back). Training
keeps each layer's input on the wafer and recomputes the layer in backward; the micro-batch
is the largest divisor of the batch whose checkpoints and one layer's working set fit in
SRAM, so the number of layers that fits is finite. Weights, gradients and optimizer state
live in MemoryX; the update runs there, overlapped except at the step boundary.

``--wse-mode auto`` follows the Cerebras documentation: pipelined for models below about
1 B parameters when the pipelined plan fits, weight streaming otherwise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dabench_ir.errors import UnboundSymbolError
from dabench_ir.ir import Cost, DType, Node, ValueKind
from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering._common import (
    LoweringContext,
    balance,
    largest_divisor,
    layer_blocks,
    peak_live_bytes,
    place_node,
    training_state,
    weight_bytes,
)
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import OpClass, Role, traits_of
from dabench_ir.passes.training import FORWARD_COST, is_loss, is_optimizer_step, token_table
from dabench_ir.plan import Plan, Schedule, Unit

if TYPE_CHECKING:
    from dabench_ir.targets import Target

__all__ = ["KERNEL_CLASSES", "LOWERING", "WseKernel", "WseLowering", "WseOptions", "wse_kernels"]

logger = logging.getLogger(__name__)
_WHO = "wse"

KERNEL_CLASSES = ("attention", "fc", "emb_fc", "nlin", "layer_norm", "add", "mlm_loss", "vector", "data")
"""Kernel classes as the compile report names them (``vector``/``data``: any other kernel)."""

# Dependent reductions across a row before its first element can leave (per-token fixed time):
# a layer norm needs the mean, then the variance; an RMS norm one mean of squares; a softmax
# or the loss one (online softmax keeps the running max and sum in one pass: Milakov and
# Gimelshein, arXiv 1805.02867); a bare Reduce* op one. Each op's count is its
# `OpTraits.row_reductions` (passes/cost_rules.py).


def _is_norm(node: Node) -> bool:
    """A row-reducing normalisation (the layer/RMS norm family; GroupNormalization is not)."""
    t = traits_of(node)
    return Role.NORM in t.roles and t.row_reductions > 0

_ATTN_WORDS = ("attn", "attention")
_NORM_WORDS = ("norm", "ln_", "ln1", "ln2", "ln_f")


@dataclass(frozen=True, slots=True, kw_only=True)
class WseOptions(LoweringOptions):
    """What the WSE lowering reads. ``replicas`` None means one copy.

    Internal (no knobs): ``fuse_elementwise`` fuses an elementwise op the kernel rules do not
    name onto the kernel whose output it alone reads; ``steady_state`` overlaps consecutive
    steps (step time = the slowest region).
    """

    micro_batches: int | None
    wse_mode: str
    replicas: int | str | None
    fuse_elementwise: bool = internal(True)
    steady_state: bool = internal(True)


class WseLowering(Lowering):
    """Cerebras WSE: pipelined kernel regions on PE SRAM, or weight streaming layer by layer."""

    name = "wse"
    kinds = ("wse",)
    Options = WseOptions

    def feed_level(self, target: Target) -> str:
        return "on-chip"

    def _lower(self, ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
        if options.wse_mode == "streaming":
            return _streaming(ctx, target, options)
        plan = _pipelined_best(ctx, target, options)
        if options.wse_mode == "pipelined":
            return plan
        limit = target.arch_value("pipelined_max_params", needed_by=_WHO)
        params = _params(ctx)
        if plan.fits and params < limit:
            plan.notes.insert(0, f"auto: pipelined ({params / 1e6:.0f} M parameters < {limit / 1e9:g} B, and it fits)")
            return plan
        why = (
            f"{params / 1e9:.2f} B parameters >= {limit / 1e9:g} B"
            if params >= limit
            else f"pipelined mode does not fit ({plan.failure.reason if plan.failure else 'does not fit'})"
        )
        streamed = _streaming(ctx, target, options)
        streamed.notes.insert(0, f"auto: weight streaming ({why})")
        return streamed


LOWERING = WseLowering()


# -- shared: per-PE work of nodes and kernels ----------------------------------------------
@dataclass(slots=True)
class _Rates:
    """Per-PE rates the kernels run at (cycles per unit of work), read once from the Target."""

    clock: float
    mm_cycles: dict[str, float]  # cycles per contraction FLOP, by precision name
    vec_cycles: float
    special_cycles: float
    link_bytes: float

    @classmethod
    def of(cls, target: Target) -> _Rates:
        pes = target.num_units
        clock = float(target.clock)
        eff = target.arch_value("pe_matmul_efficiency", needed_by=_WHO)
        mm = {}
        for dt in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32):
            try:
                mm[dt.name] = 1.0 / (eff * target.peak_flops(dt) / pes / clock)
            except Exception:
                continue
        return cls(
            clock=clock,
            mm_cycles=mm,
            vec_cycles=1.0 / target.arch_value("pe_vector_ops_per_cycle", needed_by=_WHO),
            special_cycles=target.arch_value("pe_special_op_cycles", needed_by=_WHO),
            link_bytes=target.arch_value("fabric_link_bytes_per_cycle", needed_by=_WHO),
        )

    def work_s(self, cost: Cost, precision: DType, data_movement: bool) -> float:
        """Busy seconds of ``cost`` on one PE (the kernel-class rates of the module docstring)."""
        mm = self.mm_cycles.get(precision.name) or self.mm_cycles[DType.FLOAT16.name]
        cycles = cost.contraction_flops * mm + cost.vector_flops * self.vec_cycles
        cycles += cost.special_ops * self.special_cycles
        if data_movement and cost.flops == 0:
            cycles += (cost.act_bytes_in + cost.act_bytes_out) / self.link_bytes
        return cycles / self.clock


def _state_bytes(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> int:
    """Weights and the training state that lives with them (gradients, fp32 master, moments)."""
    state = training_state(ctx, nodes)
    return weight_bytes(ctx, nodes) + state.gradients + state.master_weights + state.optimizer


def _is_data(node: Node) -> bool:
    cls = node.meta.get(meta.OP_CLASS)
    return cls is OpClass.DATA_MOVEMENT or str(getattr(cls, "value", cls)) == "data_movement"


def _cost(node: Node, which: str, fallback: Cost) -> Cost:
    """The node's forward or backward cost when the training pass split it, else ``fallback``."""
    c = node.meta.get(which)
    return c if isinstance(c, Cost) else fallback


def _samples(ctx: LoweringContext) -> int:
    """Samples the graph's costs cover (one replica's step), to turn costs into per-sample work."""
    return ctx.batch


def _shape(ctx: LoweringContext, name: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(d) for d in ctx.graph.type_of(name).dims(ctx.graph.bindings))
    except (UnboundSymbolError, KeyError, TypeError, ValueError):
        return None


def _params(ctx: LoweringContext, nodes: Sequence[Node] | None = None) -> int:
    """Trained parameters (weight elements) that ``nodes`` (None: the graph) read, each counted once."""
    graph = ctx.graph
    if nodes is None:
        try:
            return int(graph.num_params or 0)
        except UnboundSymbolError:
            return 0
    seen: set[str] = set()
    total = 0
    for node in nodes:
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            if value is None or v in seen:
                continue
            if value.kind is ValueKind.WEIGHT:
                seen.add(v)
                total += value.type.numel(graph.bindings)
            elif value.producer and meta.FOLDED in graph.node(value.producer).meta:
                for w in graph.node(value.producer).inputs:  # a folded layout of a weight: the weight
                    wv = graph.values.get(w) if w else None
                    if wv is not None and wv.kind is ValueKind.WEIGHT and w not in seen:
                        seen.add(w)
                        total += wv.type.numel(graph.bindings)
    return total


# -- kernel grouping -------------------------------------------------------------------------
@dataclass(slots=True)
class WseKernel:
    """One compiled kernel: its class, nodes and per-sample work on one PE.

    ``direction`` is ``fwd``/``bwd`` for a residual add split into its forward add and the
    backward gradient sum (training), else ``""`` (the kernel does both directions).
    """

    cls: str
    key: str
    nodes: list[Node] = field(default_factory=list)
    direction: str = ""
    work_s: float = 0.0  # busy PE-seconds per sample
    node_work_s: dict[str, float] = field(default_factory=dict)
    tokens: int = 1  # token rows per sample the kernel streams
    width: int = 1  # elements per row of its output
    out_elems: int = 1  # output elements per sample (the most PEs its shape allows, in row chunks)
    params: int = 0
    skip_bytes: int = 0  # per sample: a residual add's skip stream held while its other input crosses attention


def _block_prefix(scope: str) -> str:
    parts = [p for p in scope.replace("/", ".").split(".") if p]
    for i, part in enumerate(parts):
        if part.isdigit() and i > 0:
            return ".".join(parts[: i + 1])
    return ""


def _scope_rest(scope: str) -> list[str]:
    prefix = _block_prefix(scope)
    rest = scope.replace("/", ".")[len(prefix) :] if prefix else scope.replace("/", ".")
    return [p.lower() for p in rest.split(".") if p]


def _stored_weight(ctx: LoweringContext, node: Node) -> bool:
    graph = ctx.graph
    for v in node.inputs:
        value = graph.values.get(v) if v else None
        if value is None:
            continue
        if value.kind.is_stored:
            return True
        if value.producer and meta.FOLDED in graph.node(value.producer).meta:
            return True
    return False


def wse_kernels(ctx: LoweringContext, target: Target, *, fuse_elementwise: bool = True) -> list[WseKernel]:
    """The graph cut into kernels at the Cerebras compiler's granularity, in topological order.

    By scope first, op pattern where there is no scope (docs/targets.md, WSE section):
    everything under an ``attn``/``attention`` module of a block is one ``attention`` kernel
    (without scopes: an activation x activation matmul opens one and the ops that read it,
    up to the second such matmul, join it); a contraction with a stored weight is an ``fc``
    (its bias add and layout ops ride along), or ``emb_fc`` when it produces vocab-sized
    rows, together with the token-embedding Gather; norm ops or a ``*norm`` scope are a
    ``layer_norm``; activation functions a ``nlin``; an Add of two activations outside those
    a residual ``add`` (two kernels in training: forward add and backward gradient sum);
    the training loss and softmax/loss ops after the LM head ``mlm_loss``; any other op its own ``vector`` or
    ``data`` kernel, or fused onto the kernel whose output it alone reads. Bookkeeping
    (shape-only, folded) nodes ride with the kernel before them; the optimizer step is no
    kernel (its update runs where the weights live).
    """
    graph = ctx.graph
    table, vocab = token_table(graph)
    kernels: list[WseKernel] = []
    by_key: dict[str, WseKernel] = {}
    owner: dict[str, WseKernel] = {}  # value -> kernel that produced it
    open_attn: dict[str, int] = {}  # attention kernel key -> act x act matmuls seen (no scopes)
    after_head = False
    training = meta.graph_mode(graph) == "train"
    deferred: list[Node] = []
    producer = {out: node for node in graph.nodes for out in node.outputs if out}

    def add_to(key: str, cls: str, node: Node, direction: str = "") -> None:
        k = by_key.get(key)
        if k is None:
            k = by_key[key] = WseKernel(cls, key, direction=direction)
            kernels.append(k)
        k.nodes.append(node)
        for out in node.outputs:
            if out:
                owner[out] = k

    for node in graph.nodes:
        if is_optimizer_step(node):
            continue
        prefix = _block_prefix(node.scope)
        rest = _scope_rest(node.scope)
        inputs_from = [owner[v] for v in node.inputs if v in owner]
        bookkeeping = ctx.is_shape(node) or meta.FOLDED in node.meta or not ctx.is_work(node)
        acts = [v for v in node.inputs if v and v in graph.values and not graph.values[v].kind.is_stored]
        op_class = node.meta.get(meta.OP_CLASS)
        is_contraction = op_class is OpClass.CONTRACTION or (
            op_class is None and ctx.costs[node.name].contraction_flops > 0
        )
        weighted = _stored_weight(ctx, node)
        layer = str(node.layer) if node.layer is not None else prefix
        # 1. attention by scope
        if prefix and rest and rest[0].endswith(_ATTN_WORDS):
            add_to(f"{prefix}.attention", "attention", node)
            continue
        if bookkeeping:
            if inputs_from:
                add_to(inputs_from[-1].key, inputs_from[-1].cls, node)
            else:  # a weight's folded layout or a constant: placed with the kernel that reads it
                deferred.append(node)
            continue
        if is_contraction and weighted:
            out = _shape(ctx, node.outputs[0]) if node.outputs else None
            if vocab and out and out[-1] == vocab:
                add_to("emb_fc", "emb_fc", node)
                after_head = True
            else:
                add_to(node.scope or node.name, "fc", node)
            continue
        if node.op_type == "Gather" and vocab and node.inputs and node.inputs[0] == table:
            add_to("emb_fc", "emb_fc", node)
            continue
        if is_contraction and len(acts) >= 2 and not weighted:  # act x act: attention without scopes
            key = next((k for k, n in open_attn.items() if n < 2 and by_key[k] in inputs_from), None)
            key = key or f"attention.{layer or len(kernels)}.{len(open_attn)}"
            open_attn[key] = open_attn.get(key, 0) + 1
            add_to(key, "attention", node)
            continue
        open_into = next((k for k in inputs_from if k.key in open_attn and open_attn[k.key] < 2), None)
        if open_into is not None and not weighted and not _is_norm(node):
            add_to(open_into.key, "attention", node)
            continue
        if _is_norm(node) or (rest and any(w in rest[-1] for w in _NORM_WORDS)):
            add_to(node.scope if rest else f"norm.{node.name}", "layer_norm", node)
            continue
        if traits_of(node).nonlinear or (rest and rest[-1] in ("act", "activation", "gelu")):
            add_to(node.scope if rest and rest[-1] in ("act", "activation") else f"nlin.{node.name}", "nlin", node)
            continue
        if is_loss(node) or (after_head and (traits_of(node).loss or Role.SOFTMAX in traits_of(node).roles or "loss" in node.scope.lower())):
            add_to("mlm_loss", "mlm_loss", node)
            continue
        if node.op_type in ("Add", "Sum") and len(acts) >= 2 and not weighted:
            shapes = {_shape(ctx, v) for v in acts}
            if len(shapes) == 1:
                skip = _skip_bytes(ctx, acts, producer, owner)
                for key, direction in (
                    ((f"{node.name}.fwd", "fwd"), (f"{node.name}.bwd", "bwd")) if training else ((node.name, ""),)
                ):
                    add_to(key, "add", node, direction)
                    by_key[key].skip_bytes = skip
                continue
        # fuse an elementwise op onto the kernel whose output only it reads
        if fuse_elementwise and ctx.is_elementwise(node) and inputs_from:
            prev = inputs_from[-1]
            produced = [v for v in node.inputs if owner.get(v) is prev]
            if produced and all(len(graph.consumers.get(v, [])) == 1 for v in produced) and prev.direction == "":
                add_to(prev.key, prev.cls, node)
                continue
        cls = "data" if _is_data(node) else "vector"
        add_to(node.scope + "/" + node.name if node.scope else node.name, cls, node)
    for node in deferred:
        readers = [owner[out] for out in node.outputs if out in owner]
        readers += [
            by_key[k.key]
            for c in (graph.consumers.get(out, []) for out in node.outputs if out)
            for n in c
            for k in kernels
            if n in k.nodes
        ][:1]
        if not readers and not kernels:
            add_to(node.name, "data", node)
            continue
        home = readers[0] if readers else kernels[0]
        home.nodes.append(node)
    _measure(ctx, kernels, vocab, _Rates.of(target))
    return kernels


def _skip_bytes(
    ctx: LoweringContext, acts: Sequence[str], producer: dict[str, Node], owner: dict[str, WseKernel]
) -> int:
    """Bytes per sample a residual add holds in its region: one whole sample of its skip input
    when the other input's path since the fork crosses an attention kernel, else 0.

    Attention emits a sample's rows only after it has read the whole sample (its scores span the
    sequence), so the skip stream, which arrives at once, waits one sample in a FIFO in the add's
    region; the token-wise MLP branch delays a few rows, which the routing FIFOs absorb. The same
    holds in backward for the gradient sum where the attention branch rejoins.
    """
    if len(acts) != 2:
        return 0

    def upstream(value: str, stop: set[str]) -> set[str]:
        seen: set[str] = set()
        todo = [value]
        while todo:
            v = todo.pop()
            if v in seen or v in stop:
                continue
            seen.add(v)
            node = producer.get(v)
            if node is not None:
                todo.extend(i for i in node.inputs if i)
        return seen

    for skip, branch in ((acts[0], acts[1]), (acts[1], acts[0])):
        path = upstream(branch, upstream(skip, set()))
        if any(v in owner and owner[v].cls == "attention" for v in path):
            return ctx.graph.type_of(skip).nbytes() // max(1, _samples(ctx)) if _shape(ctx, skip) else 0
    return 0


def _measure(ctx: LoweringContext, kernels: list[WseKernel], vocab: int, rates: _Rates) -> None:
    """Fill each kernel's per-sample work, token rows, row width, shape bound and parameters."""
    samples = max(1, _samples(ctx))
    for k in kernels:
        k.params = _params(ctx, k.nodes)
        k.node_work_s = {}
        for node in k.nodes:
            cost = ctx.costs[node.name]
            if k.direction:  # forward add; backward: the gradient sum where the paths rejoin, one add per element
                cost = _cost(node, FORWARD_COST, cost)
            if not ctx.is_work(node) or meta.FOLDED in node.meta:
                w = 0.0
            elif node.op_type == "Gather" and k.cls == "emb_fc":
                # the compiler computes the token lookup as a dense one-hot matmul on the
                # (tied) table: 2 x tokens x hidden x vocab FLOPs (inferred from report A)
                out = _shape(ctx, node.outputs[0]) if node.outputs else None
                elems = math.prod(out) if out else 0
                w = rates.work_s(Cost(contraction_flops=2 * elems * vocab), ctx.precision, False) if out else 0.0
            else:
                w = rates.work_s(cost, ctx.node_precision(node), _is_data(node))
            k.node_work_s[node.name] = w / samples
        k.work_s = sum(k.node_work_s.values())
        last = next((n for n in reversed(k.nodes) if ctx.is_work(n) and (n.outputs or n.inputs)), None)
        row = (last.outputs or last.inputs)[0] if last is not None else None  # a loss writes no tensor: its input
        shape = _shape(ctx, row) if row else None
        if shape:
            k.width = max(1, shape[-1])
            numel = math.prod(shape)
            k.tokens = max(1, numel // k.width // samples)
            k.out_elems = max(1, numel // samples)


# -- pipelined mode -----------------------------------------------------------------------
@dataclass(slots=True)
class _Sizing:
    kernels: list[WseKernel]
    tau: list[float]
    lo: list[int]
    hi: list[int]
    pes: list[int] | None  # None: even the minimum regions do not fit
    state_bytes: int
    buffer_bytes: int
    buffer_pes: int
    available: int


def _in_flight_bytes(ctx: LoweringContext, kernels: list[WseKernel]) -> int:
    """Pipeline buffers per sample (training): block-boundary activations held for backward.

    Block ``i`` of ``L`` (in order) holds its output for ``2(L-i)-1`` sample periods (the
    round trip to its backward in a layer pipeline, Kosson et al. MLSys 2021), the block is
    recomputed in backward from it; plus the logits gradient (two logits-sized buffers).
    Inference streams through FIFOs only: no buffers beyond the routing PEs.
    """
    graph = ctx.graph
    if meta.graph_mode(graph) != "train":
        return 0
    samples = max(1, _samples(ctx))
    layers = graph.layers
    boundary = dict.fromkeys(layers, 0)
    for node in graph.nodes:
        if node.layer is None or is_optimizer_step(node):
            continue
        for out in node.outputs:
            readers = graph.consumers.get(out, [])
            crosses = any(c.layer != node.layer and not is_optimizer_step(c) for c in readers) or out in graph.outputs
            if out and crosses:
                boundary[node.layer] += ctx.graph.type_of(out).nbytes() if _shape(ctx, out) else 0
    total = sum(boundary[lay] * (2 * (len(layers) - i) - 1) for i, lay in enumerate(layers)) // samples
    head = next((k for k in kernels if k.cls == "emb_fc"), None)
    if head is not None:
        last = next((n for n in reversed(head.nodes) if n.outputs and _shape(ctx, n.outputs[0])), None)
        if last is not None and last.op_type != "Gather":
            total += 2 * ctx.graph.type_of(last.outputs[0]).nbytes() // samples
    return total


def _size(ctx: LoweringContext, target: Target, kernels: list[WseKernel], replicas: int) -> _Sizing | None:
    """Region sizes (PEs per kernel, per replica) balanced to one period, or None if even the minimum does not fit."""
    pes = target.num_units
    clock = float(target.clock)
    chunk = target.arch_value("row_chunk_elements", needed_by=_WHO)
    u_min = target.arch_value("min_utilisation", needed_by=_WHO)
    usable = target.arch_value("sram_usable_fraction", needed_by=_WHO)
    pe_sram = target.arch_value("pe_sram_bytes", needed_by=_WHO)
    fifo = target.arch_value("fifo_sram_fraction", needed_by=_WHO)
    route = target.arch_value("route_pes_per_kernel_pe", needed_by=_WHO)
    active = target.arch_value("max_active_fraction", needed_by=_WHO)
    io_pes = int(target.arch_value("io_region_pes", needed_by=_WHO))
    samples_per_replica = ctx.batch  # every copy runs the graph's batch
    taus, lo, hi = [], [], []
    for k in kernels:
        tau = _row_cycles(ctx, target, k) * k.tokens / clock
        state = _state_bytes(ctx, k.nodes)
        rows = math.ceil(k.width / chunk)  # PEs across one row: the region grows in whole rows
        fifo_pes = rows * math.ceil(k.skip_bytes / (fifo * pe_sram * rows)) if k.skip_bytes else 0
        lo_k = max(1, rows, fifo_pes, math.ceil(state / (usable * pe_sram * (1 + route))))
        shape_cap = max(1, math.ceil(k.out_elems * samples_per_replica / chunk))
        util_cap = math.floor(k.work_s * (1 - u_min) / (u_min * tau) + 1e-9) if tau > 0 else shape_cap
        taus.append(tau)
        lo.append(lo_k)
        hi.append(max(lo_k, min(shape_cap, util_cap)))
    buffer_bytes = _in_flight_bytes(ctx, kernels)
    buffer_pes = math.ceil(buffer_bytes * replicas / (usable * pe_sram))
    available = int((pes * active - io_pes - buffer_pes) / (1 + route)) // replicas
    state_bytes = _state_bytes(ctx, [n for k in kernels for n in k.nodes])
    if available <= 0:
        return _Sizing(kernels, taus, lo, hi, None, state_bytes, buffer_bytes, buffer_pes, 0)
    sizes = balance([k.work_s for k in kernels], lo, hi, available, fixed_s=taus)
    if sizes is None:
        return _Sizing(kernels, taus, lo, hi, None, state_bytes, buffer_bytes, buffer_pes, available)
    return _Sizing(kernels, taus, lo, hi, sizes, state_bytes, buffer_bytes, buffer_pes, available)


def _row_cycles(ctx: LoweringContext, target: Target, k: WseKernel) -> float:
    """Fixed cycles per token row a kernel pays (``tau`` x clock / tokens): the matmul class's
    for kernels with contractions, one cross-row reduction per dependent reduction the kernel's
    rows need (norms, loss), else the vector class's (elementwise and data movement)."""
    if k.cls in ("attention", "fc", "emb_fc") or any(ctx.costs[n.name].contraction_flops for n in k.nodes):
        return target.arch_value("kernel_row_cycles_matmul", needed_by=_WHO)
    passes = sum(
        traits_of(n).row_reductions for n in k.nodes
    )
    if passes:
        return passes * target.arch_value("kernel_row_cycles_reduction", needed_by=_WHO)
    return target.arch_value("kernel_row_cycles_vector", needed_by=_WHO)


def _pipelined_best(ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
    if options.replicas != "auto":
        return _pipelined(ctx, target, options, int(options.replicas or 1))
    best: Plan | None = None
    for r in range(1, _MAX_AUTO_REPLICAS + 1):  # copies, each running the graph's batch
        plan = _pipelined(ctx, target, options, r)
        if not plan.fits:
            break  # more copies only need more PEs and SRAM
        if best is None or _rate(plan) > _rate(best) * (1 + 1e-9):
            best = plan
    return best if best is not None else _pipelined(ctx, target, options, 1)


_MAX_AUTO_REPLICAS = 64
"""``--replicas auto`` tries 1 to this many on-wafer copies (a wafer of 850k PEs holds a few dozen
copies of a small decoder at most before the minimum region sizes stop it)."""


def _rate(plan: Plan) -> float:
    """Samples per second of a pipelined plan's step (all its copies)."""
    return plan.samples_per_step / plan.extra["step_s"] if plan.extra["step_s"] > 0 else 0.0


def _pipelined(ctx: LoweringContext, target: Target, options: WseOptions, replicas: int) -> Plan:
    return _place_pipelined(
        ctx, target, options, replicas, wse_kernels(ctx, target, fuse_elementwise=options.fuse_elementwise)
    )


def _place_pipelined(
    ctx: LoweringContext, target: Target, options: WseOptions, replicas: int, kernels: list[WseKernel]
) -> Plan:
    pes = target.num_units
    sram = target.memory(LOWERING.feed_level(target))
    ridge = target.ridge_point(ctx.precision, sram)
    route = target.arch_value("route_pes_per_kernel_pe", needed_by=_WHO)
    usable = target.arch_value("sram_usable_fraction", needed_by=_WHO)
    io_pes = int(target.arch_value("io_region_pes", needed_by=_WHO))
    per_replica = ctx.batch  # every copy runs the graph's batch (dabench_ir.run)
    m = options.micro_batches or per_replica
    plan = ctx.plan(
        target, options, Schedule.CONCURRENT, micro_batches=m, replicas=replicas, pipelined_steps=options.steady_state
    )
    sizing = _size(ctx, target, kernels, replicas)
    assert sizing is not None
    need = (sizing.state_bytes + sizing.buffer_bytes) * replicas
    plan.memory_bytes[sram.name] = need
    plan.traffic_bytes[sram.name] = sum(c.bytes for c in ctx.costs.values())
    if need > usable * sram.capacity_bytes:
        plan.fail(
            f"pipelined mode needs {need / 1e9:.2f} GB of PE SRAM (weights and optimizer state "
            f"{sizing.state_bytes * replicas / 1e9:.2f} GB, pipeline buffers {sizing.buffer_bytes * replicas / 1e9:.2f} GB"
            f", {replicas} cop{'y' if replicas == 1 else 'ies'}); {usable:.0%} of the wafer's "
            f"{sram.capacity_bytes / 1e9:.0f} GB is usable",
            need,
            usable * sram.capacity_bytes,
        )
    sizes = sizing.pes
    if sizes is None:
        plan.fail(
            f"{len(kernels)} kernels need at least {sum(sizing.lo) * replicas} PEs (minimum regions: row width, "
            f"weights and optimizer state), "
            f"{sizing.available * replicas} are left for kernels beside I/O, routing and buffers",
            need,
            usable * sram.capacity_bytes,
        )
        # still time it, squeezed in proportion, so a plan that does not fit stays physical
        squeeze = max(sizing.available, 1) / max(sum(sizing.lo), 1)
        sizes = [max(1, math.floor(p * squeeze)) for p in sizing.lo]
    times = [k.work_s / p + tau for k, p, tau in zip(kernels, sizes, sizing.tau, strict=True)]
    period = max((t for t, k in zip(times, kernels, strict=True) if k.work_s > 0), default=0.0)
    rates = [1.0 / t if t > 0 else 0.0 for t in times]
    kernel_pes = 0
    for i, (k, p, tau, t) in enumerate(zip(kernels, sizes, sizing.tau, times, strict=True)):
        busy = k.work_s / p
        width = math.ceil(math.sqrt(p))
        unit = Unit(
            id=f"region{i}",
            kind=f"wse_region:{k.cls}",
            nodes=[n.name for n in k.nodes if n.name not in plan.node_plans],
            resources={
                "pes": float(p),
                "units": float(p * replicas),
                "width": float(width),
                "height": float(math.ceil(p / width)),
                "utilisation": busy / t if t > 0 else 0.0,
                "rate_samples_per_s": rates[i] * replicas,
                "work_pe_s_per_sample": k.work_s,
                "row_s_per_sample": tau,
                "params": float(k.params),
                "weight_bytes": float(weight_bytes(ctx, k.nodes)),
                "skip_fifo_bytes": float(k.skip_bytes),
                "replicas": float(replicas),
            },
            allocation=p * (1 + route) * replicas / pes,
        )
        kernel_pes += p * replicas
        plan.units.append(unit)
        for node in k.nodes:
            w = k.node_work_s.get(node.name, 0.0)
            share = w / k.work_s if k.work_s > 0 else 0.0
            # the per-token fixed time is part of the kernel's execution (its utilisation says
            # how much): a node's compute time is its share of W/p + tau
            compute = (w / p + tau * share) * per_replica
            over = 0.0
            if node.name in plan.node_plans:  # an add's backward half: same node, a second region beside
                prev = plan.node_plans[node.name]  # the first, running at the same time: the slower one counts
                if compute + over > prev.compute_s + prev.overhead_s:
                    prev.compute_s, prev.overhead_s, prev.per_micro_batch_s = compute, over, (compute + over) / m
                continue
            cost = ctx.costs[node.name]
            plan.node_plans[node.name] = place_node(
                ctx,
                node,
                unit=unit.id,
                compute_s=compute,
                overhead_s=over,
                feed_level=sram.level,
                feed_bytes=cost.bytes,
                ridge=ridge,
                allocation=p * replicas / pes,
                micro_batches=m,
            )
            if not ctx.is_work(node) or k.work_s == 0:
                plan.node_plans[node.name].per_micro_batch_s = 0.0
    # non-kernel PEs: the I/O region and the pipeline buffers (routing is in each region's allocation)
    plan.units.append(Unit(id="io", kind="wse_io", resources={"pes": float(io_pes)}, allocation=io_pes / pes))
    if sizing.buffer_pes:
        plan.units.append(
            Unit(
                id="buffers",
                kind="wse_buffers",
                resources={"pes": float(sizing.buffer_pes), "bytes": float(sizing.buffer_bytes * replicas)},
                allocation=sizing.buffer_pes / pes,
            )
        )
    # each region updates its own weights once per step, in the time it idles while the bottleneck
    # works (per_replica x (period - its own time)); what does not fit in that slack stalls the step
    spill = [
        (k.params / p, per_replica * max(0.0, period - t))
        for k, p, t in zip(kernels, sizes, times, strict=True)
        if k.params
    ]
    _place_optimizer(ctx, plan, target, spill, sram.level, ridge)
    step = period * per_replica
    overheads = _pipelined_overheads(ctx, target, plan, replicas, step, kernel_pes)
    plan.step_overheads_s.update(overheads)
    pipe_rate = min((r for r, k in zip(rates, kernels, strict=True) if k.work_s > 0), default=0.0) * replicas
    ceiling = plan.extra.get("transmission_rate_samples_per_s", math.inf)
    for unit in plan.units:  # the compile report's steady states (no per-step costs): compute-limited,
        if unit.kind == "wse_io":  # and with the input-transmission ceiling applied
            unit.resources["compute_samples_per_s"] = pipe_rate
            unit.resources["transmission_samples_per_s"] = min(pipe_rate, ceiling)
    weighted = sum(p * (t / period) for p, t, k in zip(sizes, times, kernels, strict=True) if k.work_s > 0 and t > 0)
    total_p = sum(p for p, k in zip(sizes, kernels, strict=True) if k.work_s > 0)
    route_pes = sum(sizes) * replicas * route
    plan.extra.update({
        "mode": "pipelined",
        "pes": pes,
        "pes_kernels": kernel_pes,
        "pes_route": route_pes,
        "pes_io": io_pes,
        "pes_buffer": sizing.buffer_pes,
        "pes_placed": kernel_pes,
        "active_pes_fraction": (kernel_pes + route_pes + io_pes + sizing.buffer_pes) / pes,
        "pipeline_rate_samples_per_s": pipe_rate,
        "load_imbalance_pe_weighted": weighted / total_p if total_p else 1.0,
        "compute_utilisation": (
            sum(k.work_s for k, p in zip(kernels, sizes, strict=True) if k.work_s > 0) / (period * total_p)
            if period > 0 and total_p
            else 0.0
        ),
        "kernels": len(kernels),
        "period_s": period,
        "step_s": step + sum(overheads.values()),
        "buffer_bytes": sizing.buffer_bytes * replicas,
        "state_bytes": sizing.state_bytes * replicas,
    })  # fmt: skip
    return plan


def _place_optimizer(
    ctx: LoweringContext, plan: Plan, target: Target, regions: list[tuple[float, float]], level: str, ridge: float
) -> None:
    """The optimizer step: every region updates its own weights (``regions``: parameters per PE
    and the idle time per step it can do that in); the largest excess is a step overhead."""
    params = _params(ctx)
    for node in ctx.graph.nodes:
        if not is_optimizer_step(node) or not params:
            continue
        per_param = _Rates.of(target).work_s(ctx.costs[node.name], DType.FLOAT32, False) / params
        busy = max((max(0.0, per_param * q - slack) for q, slack in regions), default=0.0)
        plan.units.append(
            Unit(id="optimizer", kind="wse_optimizer", nodes=[node.name], resources={"units": 0.0}, allocation=0.0)
        )
        np_ = place_node(
            ctx, node, unit="optimizer", compute_s=busy, feed_level=level, feed_bytes=ctx.costs[node.name].bytes,
            ridge=ridge, allocation=0.0, time_s=0.0,
        )  # fmt: skip
        np_.note = (
            "runs in every region on its own weights, in its idle time; the excess is the step overhead wse_optimizer"
        )
        plan.node_plans[node.name] = np_
        plan.step_overheads_s["wse_optimizer"] = busy


def _pipelined_overheads(
    ctx: LoweringContext, target: Target, plan: Plan, replicas: int, step_s: float, kernel_pes: int
) -> dict[str, float]:
    """Per-step costs no region owns: replicas' gradient reduction and the input-transmission ceiling."""
    out: dict[str, float] = {}
    if replicas > 1 and meta.graph_mode(ctx.graph) == "train":
        clock = float(target.clock)
        link = target.arch_value("fabric_link_bytes_per_cycle", needed_by=_WHO)
        hop = target.link("fabric").latency_s if target.link("fabric") else 1.0 / clock
        side = math.sqrt(target.num_units)
        cut_bw = side * link * clock  # one link per row crossing the wafer's bisection
        grad = _params(ctx) * 4  # fp32 gradients
        from dabench_ir.lowering.collectives import ring_allreduce_time

        out["wse_replica_reduce"] = ring_allreduce_time(grad, replicas, cut_bw) + (replicas - 1) * side * hop
    io = target.link("system_io")
    if io is not None:
        samples = max(1, _samples(ctx))
        in_bytes = sum(ctx.graph.type_of(v).nbytes() for v in ctx.graph.inputs if _shape(ctx, v)) / samples
        if meta.graph_mode(ctx.graph) == "train":
            in_bytes *= 2  # labels beside the inputs
        send = plan.samples_per_step * in_bytes / io.bandwidth_bytes_per_s
        plan.extra["transmission_rate_samples_per_s"] = io.bandwidth_bytes_per_s / in_bytes if in_bytes else math.inf
        if send > step_s:
            out["wse_input_transmission"] = send - step_s
    return out


# -- weight-streaming mode -----------------------------------------------------------------
def _streaming(ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
    rates = _Rates.of(target)
    kernels = wse_kernels(ctx, target, fuse_elementwise=options.fuse_elementwise)
    pes = target.num_units
    target.peak_flops(ctx.precision)  # an unsupported precision fails here, before any planning
    sram = target.memory("on-chip")
    ext = target.memory("off-chip")
    usable = target.arch_value("sram_usable_fraction", needed_by=_WHO)
    pass_s = target.overhead("ws_layer_pass_s")
    recompute_always = bool(target.arch_value("ws_recompute", 1.0))
    training = meta.graph_mode(ctx.graph) == "train"
    train_state = meta.training_state(ctx.graph) or {}
    recomputed = bool(train_state.get("recompute"))
    samples = max(1, _samples(ctx))
    batch = ctx.batch
    plan = ctx.plan(target, options, Schedule.SEQUENTIAL)
    if options.replicas not in (None, 1, "auto"):
        plan.notes.append("replicas apply to pipelined mode only; weight streaming uses one copy")
    kernel_of = {n.name: k for k in kernels for n in k.nodes}
    blocks = [b for b in layer_blocks(ctx.graph) if any(not is_optimizer_step(n) for n in b.nodes)]

    # per-sample whole-wafer work, stream bytes and on-wafer bytes of each block
    info = []
    for block in blocks:
        nodes = [n for n in block.nodes if not is_optimizer_step(n)]
        work = {}
        for n in nodes:
            if not ctx.is_work(n) or meta.FOLDED in n.meta:
                work[n.name] = 0.0
                continue
            prec = ctx.node_precision(n)
            total = ctx.costs[n.name]
            w = rates.work_s(total, prec, _is_data(n))
            if training and recompute_always and not recomputed:
                w += rates.work_s(_cost(n, FORWARD_COST, Cost()), prec, _is_data(n))  # forward again in backward
            k = kernel_of.get(n.name)
            if n.op_type == "Gather" and k is not None and k.cls == "emb_fc":
                w = k.node_work_s.get(n.name, 0.0) * samples
            work[n.name] = w / samples
        wbytes = weight_bytes(ctx, nodes)
        stream = (3 if training else 1) * wbytes  # W in (fwd), W in again (bwd), dW out
        is_layer = block.key.startswith("layer")
        boundary = _block_out_bytes(ctx, nodes) // samples
        working = _working_bytes(ctx, nodes, kernel_of) // samples
        info.append((block, nodes, work, wbytes, stream, is_layer, boundary, working))
    layers = sum(1 for i in info if i[5])
    keep = sum(i[6] for i in info if i[5]) if training else 0
    working = max((i[7] for i in info), default=0)
    max_w = max((i[3] for i in info), default=0)
    budget = usable * sram.capacity_bytes - 2 * max_w  # streamed weights double-buffered

    def need(mb: int) -> float:
        return mb * (keep + working) + 2 * max_w

    if options.micro_batches:
        mb = max(1, batch // options.micro_batches)
    else:
        per_sample = keep + working  # need(mb) grows linearly: the largest divisor under the bound fits
        bound = (usable * sram.capacity_bytes - 2 * max_w) // per_sample if per_sample > 0 else batch
        mb = largest_divisor(batch, int(max(1, min(batch, bound))))
    n_mb = max(1, math.ceil(batch / mb))
    plan.micro_batches = n_mb
    per_layer = keep / layers if layers else 0
    fits_layers = int(max(0.0, budget - mb * working) // (mb * per_layer)) if per_layer else None
    plan.extra.update({
        "mode": "streaming",
        "micro_batch": mb,
        "layers": layers,
        "max_layers_at_micro_batch": fits_layers,
        "sram_need_bytes": need(mb),
        "checkpoint_bytes_per_sample": keep,
        "working_bytes_per_sample": working,
    })  # fmt: skip
    sram_ridge = target.ridge_point(ctx.precision, sram)
    ext_ridge = target.ridge_point(ctx.precision, ext)
    for block, nodes, work, wbytes, stream, is_layer, _, _ in info:
        t_c = mb * sum(work.values()) / pes
        t_s = stream / ext.bandwidth_bytes_per_s
        unit = Unit(
            id=block.key,
            kind="wse_layer",
            nodes=[n.name for n in nodes],
            resources={
                "pes": float(pes),
                "units": float(pes),
                "weight_bytes": float(wbytes),
                "stream_s_per_micro_batch": t_s,
                "compute_s_per_micro_batch": t_c,
            },
            allocation=1.0,
            gap_before_s=pass_s * n_mb if is_layer else 0.0,
            gap_kind="layer_switch",
            min_time_s=t_s * n_mb,
        )
        plan.units.append(unit)
        streamed = t_s > t_c
        for n in nodes:
            cost = ctx.costs[n.name]
            compute = mb * work[n.name] / pes * n_mb
            share = cost.weight_bytes / max(1, sum(ctx.costs[x.name].weight_bytes for x in nodes))
            plan.node_plans[n.name] = place_node(
                ctx,
                n,
                unit=unit.id,
                compute_s=compute,
                memory_s=t_s * n_mb * share if streamed else 0.0,
                feed_level=ext.level if streamed else sram.level,
                feed_bytes=cost.weight_bytes if streamed else cost.bytes,
                ridge=ext_ridge if streamed else sram_ridge,
                allocation=1.0 if ctx.is_work(n) else 0.0,
                micro_batches=n_mb,
            )
            if streamed:  # the unit's min_time_s holds the stream; nodes carry their compute
                np_ = plan.node_plans[n.name]
                np_.per_micro_batch_s = compute / n_mb
    total_w = weight_bytes(ctx)
    state = _state_bytes(ctx) - total_w  # gradients, fp32 master weights and moments: in MemoryX
    plan.memory_bytes = {sram.name: int(need(mb)), ext.name: int(total_w + state)}
    plan.traffic_bytes = {ext.name: int(sum(i[4] for i in info) * n_mb)}
    last_layer = next((i for i in reversed(info) if i[5]), None)
    lw = last_layer[3] if last_layer else max_w
    if training:
        plan.step_overheads_s["wse_grad_writeback"] = lw / ext.bandwidth_bytes_per_s
        plan.step_overheads_s["wse_memoryx_update"] = lw / ext.bandwidth_bytes_per_s
        for node in ctx.graph.nodes:
            if is_optimizer_step(node):
                plan.units.append(Unit(id="memoryx", kind="wse_memoryx", nodes=[node.name], allocation=0.0))
                np_ = place_node(
                    ctx, node, unit="memoryx", compute_s=0.0, feed_level=ext.level,
                    feed_bytes=ctx.costs[node.name].bytes, ridge=ext_ridge, allocation=0.0, time_s=0.0,
                )  # fmt: skip
                np_.note = "runs in MemoryX, overlapped with the next layers; its tail is wse_memoryx_update"
                plan.node_plans[node.name] = np_
    if need(1) > usable * sram.capacity_bytes:
        plan.fail(
            f"weight streaming needs {need(1) / 1e9:.2f} GB of wafer SRAM at micro-batch 1 ({layers} layer "
            f"checkpoints of {keep / max(layers, 1) / 1e6:.1f} MB, one layer's working set {working / 1e6:.1f} MB, "
            f"double-buffered weights {2 * max_w / 1e6:.1f} MB); {usable:.0%} of {sram.capacity_bytes / 1e9:.0f} GB "
            "is usable",
            need(1),
            usable * sram.capacity_bytes,
        )
    elif need(mb) > usable * sram.capacity_bytes:
        plan.fail(
            f"weight streaming at micro-batch {mb} needs {need(mb) / 1e9:.2f} GB of wafer SRAM; "
            f"{usable:.0%} of {sram.capacity_bytes / 1e9:.0f} GB is usable (use more --micro-batches)",
            need(mb),
            usable * sram.capacity_bytes,
        )
    if total_w + state > ext.capacity_bytes:
        plan.fail(f"weights and optimizer state ({(total_w + state) / 1e9:.1f} GB) exceed {ext.name}",
                  total_w + state, ext.capacity_bytes)  # fmt: skip
    return plan


def _block_out_bytes(ctx: LoweringContext, nodes: Sequence[Node]) -> int:
    """Bytes of the block's outputs read outside it: the checkpoint kept per layer for backward."""
    graph = ctx.graph
    names = {n.name for n in nodes}
    total = 0
    for node in nodes:
        if node.layer is None:  # constants the exporter left unscoped (masks) are no per-sample activations
            continue
        for out in node.outputs:
            readers = graph.consumers.get(out, [])
            if out and _shape(ctx, out) and any(c.name not in names and not is_optimizer_step(c) for c in readers):
                total += graph.type_of(out).nbytes()
    return total


def _working_bytes(ctx: LoweringContext, nodes: Sequence[Node], kernel_of: dict[str, WseKernel]) -> int:
    """One layer's activations for its backward: inputs of the nodes that need a gradient.

    An attention kernel keeps only its own inputs and recomputes its internals (scores,
    softmax) in backward, so tensors produced inside an attention kernel are not counted;
    the loss keeps nothing (it writes the logits' gradient in the same pass).
    Inference: the peak of live activations.
    """
    if meta.graph_mode(ctx.graph) != "train":
        return peak_live_bytes(ctx, nodes)
    graph = ctx.graph
    seen: set[str] = set()
    total = 0
    for node in nodes:
        if is_loss(node):  # it writes the logits' gradient in the same pass: nothing kept for backward
            continue
        k = kernel_of.get(node.name)
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            if value is None or v in seen or value.kind.is_stored or not _shape(ctx, v):
                continue
            prod = kernel_of.get(value.producer) if value.producer else None
            if k is not None and k.cls == "attention" and prod is k:
                continue
            seen.add(v)
            total += graph.type_of(v).nbytes()
    return total
