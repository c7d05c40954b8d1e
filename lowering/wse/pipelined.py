"""WSE pipelined (layer-pipelined) mode: every kernel on its own region of PEs, all at once.

As the Cerebras compiler maps a model (docs/targets.md, WSE section): the graph is cut into
kernels (`kernels.wse_kernels`), each kernel gets a rectangular region of PEs and all run at
once, samples streaming through.

- A kernel's busy PE-seconds per sample ``W`` come from `kernels` (its nodes' costs at the
  per-PE rates); on ``p`` PEs one sample takes ``t = W/p + tau``: ``tau`` is the per-token
  fixed time of the kernel's class (task handshakes, reduction latency, fabric hops) that
  more PEs do not shorten (`row_cycles`). Utilisation ``(W/p)/t``, rate ``1/t``.
- Regions are balanced to one period (`balance` with the fixed times): heavy kernels get
  what keeps pace, small ones just enough. A region is at least ``ceil(width/row_chunk)``
  PEs and large enough to hold its weights and optimizer state, at most one row chunk per
  PE of its output and never grown below ``min_utilisation``. A residual add whose other
  input crosses attention holds one sample of its skip stream in a FIFO in its region
  (whole rows of ``ceil(width/row_chunk)`` PEs; `kernels._skip_bytes`).
- The wafer is shared with an I/O region and routing/FIFO PEs per kernel PE, and only
  ``max_active_fraction`` of it can be placed; pipeline buffers hold the block-boundary
  activations that are in flight between a block's forward and backward (training).
- Replicas (on-wafer data parallel) each get their regions and pay a gradient reduction
  over the fabric per step; input transmission over the system I/O caps the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dabench_ir.ir import DType
from dabench_ir.lowering.context import (
    LoweringContext,
    balance,
    cache_bytes,
    cache_inputs,
    outside_blocks,
    place_node,
    weight_bytes,
)
from dabench_ir.lowering.wse.common import (
    FEED_LEVEL,
    WHO,
    sample_count,
    shape_of,
    trained_params,
    weight_state_bytes,
)
from dabench_ir.lowering.wse.kernels import KernelRates, WseKernel
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import traits_of
from dabench_ir.passes.precision import reads_kv_cache
from dabench_ir.passes.training import is_optimizer_step
from dabench_ir.plan import PIPELINE_FILL_DRAIN, Plan, PlanStats, Schedule, Unit, UnitStats

if TYPE_CHECKING:
    from dabench_ir.lowering.wse import WseOptions
    from dabench_ir.targets import Target

__all__ = ["pipelined_best", "row_cycles"]


@dataclass(slots=True)
class _Sizing:
    kernels: list[WseKernel]
    tau: list[float]
    lo: list[int]
    hi: list[int]
    pes: list[int] | None  # None: even the minimum regions do not fit
    state_bytes: int  # the weights and their training state the regions hold
    cache_bytes: int  # a decode step's KV caches, held in PEs of their own beside the regions
    cache_pes: int
    buffer_bytes: int
    buffer_pes: int
    skip_fifo_bytes: int  # the residual adds' skip FIFOs, one sample each, in their own regions' PEs
    available: int


def _in_flight_bytes(ctx: LoweringContext, target: Target, options: WseOptions, kernels: list[WseKernel]) -> int:
    """Pipeline buffers per sample (training): block-boundary activations held for backward.

    Block ``i`` of ``L`` (in order) holds its output until the sample's backward comes back to it:
    ``2(L-i)-1`` sample periods in a full layer pipeline (the round trip to its backward, Kosson et
    al. MLSys 2021), the block recomputed in backward from it; plus the logits gradient (two
    logits-sized buffers). A buffer holds one sample per period of that round trip, but never more
    samples than the step has: a synchronous step drains the pipeline before its weight update
    (`arch.drain_per_step`, the ``pipeline_fill_drain`` row), so at most the step's batch (one copy's:
    the micro-batches of a step flow back to back) is in flight, and a block deeper than half the
    batch holds the whole batch. Cerebras' pipelined backpropagation (``drain_per_step`` 0) keeps
    the pipeline full across steps: the full round trip. Inference streams through FIFOs only: no
    buffers beyond the routing PEs.
    """
    graph = ctx.graph
    if meta.graph_mode(graph) != "train":
        return 0
    samples = max(1, sample_count(ctx))
    flowing = options.steady_state and target.arch_value("drain_per_step", needed_by=WHO) <= 0
    in_step = math.inf if flowing else samples  # samples a step can have in flight
    layers = graph.layers
    boundary = dict.fromkeys(layers, 0)
    for node in graph.nodes:
        if node.layer is None or is_optimizer_step(node):
            continue
        for out in node.outputs:
            readers = graph.consumers.get(out, [])
            crosses = any(c.layer != node.layer and not is_optimizer_step(c) for c in readers) or out in graph.outputs
            if out and crosses:
                boundary[node.layer] += ctx.graph.type_of(out).nbytes() if shape_of(ctx, out) else 0
    held = [min(2 * (len(layers) - i) - 1, in_step) for i in range(len(layers))]
    total = sum(boundary[lay] * int(n) for lay, n in zip(layers, held, strict=True)) // samples
    head = next((k for k in kernels if k.cls == "emb_fc"), None)
    if head is not None:  # the logits: the last work of the head kernel (not a folded weight layout)
        last = next(
            (n for n in reversed(head.nodes) if ctx.is_work(n) and n.outputs and shape_of(ctx, n.outputs[0])), None
        )
        if last is not None and last.op_type != "Gather":
            total += min(2, in_step) * ctx.graph.type_of(last.outputs[0]).nbytes() // samples
    return total


def _size(
    ctx: LoweringContext, target: Target, options: WseOptions, kernels: list[WseKernel], replicas: int
) -> _Sizing | None:
    """Region sizes (PEs per kernel, per replica) balanced to one period, or None if even the minimum does not fit."""
    pes = target.num_units
    clock = float(target.clock)
    chunk = target.arch_value("row_chunk_elements", needed_by=WHO)
    u_min = target.arch_value("min_utilisation", needed_by=WHO)
    usable = target.arch_value("sram_usable_fraction", needed_by=WHO)
    pe_sram = target.arch_value("pe_sram_bytes", needed_by=WHO)
    fifo = target.arch_value("fifo_sram_fraction", needed_by=WHO)
    route = target.arch_value("route_pes_per_kernel_pe", needed_by=WHO)
    active = target.arch_value("max_active_fraction", needed_by=WHO)
    io_pes = int(target.arch_value("io_region_pes", needed_by=WHO))
    taus, lo, hi = [], [], []
    for k in kernels:
        tau = row_cycles(ctx, target, k) * k.tokens / clock
        state = weight_state_bytes(ctx, k.nodes)
        rows = math.ceil(k.width / chunk)  # PEs across one row: the region grows in whole rows
        fifo_pes = rows * math.ceil(k.skip_bytes / (fifo * pe_sram * rows)) if k.skip_bytes else 0
        lo_k = max(1, rows, fifo_pes, math.ceil(state / (usable * pe_sram * (1 + route))))
        # the samples flow through a region one after another (a sample's time W/p + tau): no more PEs
        # than one sample's output has row chunks
        shape_cap = max(1, math.ceil(k.out_elems / chunk))
        util_cap = math.floor(k.work_s * (1 - u_min) / (u_min * tau) + 1e-9) if tau > 0 else shape_cap
        taus.append(tau)
        lo.append(lo_k)
        hi.append(max(lo_k, min(shape_cap, util_cap)))

    def held_pes(nbytes: int) -> int:  # PEs of their own that hold every copy's ``nbytes``
        return math.ceil(nbytes * replicas / (usable * pe_sram))

    buffer_bytes = _in_flight_bytes(ctx, target, options, kernels)
    buffer_pes = held_pes(buffer_bytes)
    placed = [n for k in kernels for n in k.nodes]
    # a decode step's caches: state kept from step to step, in PEs of their own as the buffers are (in
    # whichever region's a cache sits, it takes the same SRAM; apart, the regions balance alike however
    # an exporter groups the nodes that read it)
    cache = cache_bytes(ctx, placed)
    cache_pes = held_pes(cache)
    available = int((pes * active - io_pes - buffer_pes - cache_pes) / (1 + route)) // replicas
    sizes = balance([k.work_s for k in kernels], lo, hi, available, fixed_s=taus) if available > 0 else None
    return _Sizing(
        kernels=kernels,
        tau=taus,
        lo=lo,
        hi=hi,
        pes=sizes,
        state_bytes=weight_state_bytes(ctx, placed),
        cache_bytes=cache,
        cache_pes=cache_pes,
        buffer_bytes=buffer_bytes,
        buffer_pes=buffer_pes,
        skip_fifo_bytes=sum(k.skip_bytes for k in kernels),
        available=max(0, available),
    )


# Dependent reductions across a row before its first element can leave (per-token fixed time):
# a layer norm needs the mean, then the variance; an RMS norm one mean of squares; a softmax
# or the loss one (online softmax keeps the running max and sum in one pass: Milakov and
# Gimelshein, arXiv 1805.02867); a bare Reduce* op one. Each op's count is its
# `OpTraits.row_reductions` (passes/cost_rules.py).
def row_cycles(ctx: LoweringContext, target: Target, k: WseKernel) -> float:
    """Fixed cycles per token row a kernel pays (``tau`` x clock / tokens): the matmul class's
    for kernels with contractions, one cross-row reduction per dependent reduction the kernel's
    rows need (norms, loss), else the vector class's (elementwise and data movement)."""
    if k.cls in ("attention", "fc", "emb_fc") or any(ctx.costs[n.name].contraction_flops for n in k.nodes):
        return target.arch_value("kernel_row_cycles_matmul", needed_by=WHO)
    passes = sum(traits_of(n).row_reductions for n in k.nodes)
    if passes:
        return passes * target.arch_value("kernel_row_cycles_reduction", needed_by=WHO)
    return target.arch_value("kernel_row_cycles_vector", needed_by=WHO)


def pipelined_best(ctx: LoweringContext, target: Target, options: WseOptions, kernels: list[WseKernel]) -> Plan:
    """The pipelined plan of ``kernels`` (`wse_kernels`: the graph's, the same for every copy count tried)."""
    if options.replicas != "auto":
        return _place_pipelined(ctx, target, options, int(options.replicas or 1), kernels)
    best: Plan | None = None
    for r in range(1, _MAX_AUTO_REPLICAS + 1):  # copies, each running the graph's batch
        plan = _place_pipelined(ctx, target, options, r, kernels)
        if not plan.fits:
            break  # more copies only need more PEs and SRAM
        if best is None or _rate(plan) > _rate(best) * (1 + 1e-9):
            best = plan
    return best if best is not None else _place_pipelined(ctx, target, options, 1, kernels)


_MAX_AUTO_REPLICAS = 64
"""``--replicas auto`` tries 1 to this many on-wafer copies (a wafer of 850k PEs holds a few dozen
copies of a small decoder at most before the minimum region sizes stop it)."""


def _rate(plan: Plan) -> float:
    """Samples per second of a pipelined plan's step (all its copies)."""
    step = plan.stats.step_s or 0.0
    return plan.samples_per_step / step if step > 0 else 0.0


def _place_pipelined(
    ctx: LoweringContext, target: Target, options: WseOptions, replicas: int, kernels: list[WseKernel]
) -> Plan:
    """The pipelined plan: every kernel a region of PEs sized to balance the pipeline (`_size`),
    ``replicas`` copies on the wafer. Steps: the fit, the regions and their nodes, the I/O and buffer
    PEs, the step (its period, the drain, the optimizer windows, the overheads), the statistics."""
    sram = target.memory(FEED_LEVEL)
    samples = ctx.batch  # every copy runs the graph's batch (dabench_ir.run), one sample after another
    plan = ctx.plan(
        target,
        options,
        Schedule.CONCURRENT,
        micro_batches=samples,
        replicas=replicas,
        pipelined_steps=_steps_overlap(ctx, options),
    )
    sizing = _size(ctx, target, options, kernels, replicas)
    assert sizing is not None
    plan.traffic_bytes[sram.name] = sum(c.bytes for c in ctx.costs.values())
    sizes = _fit_regions(target, plan, kernels, sizing, replicas)
    times = [k.work_s / p + tau for k, p, tau in zip(kernels, sizes, sizing.tau, strict=True)]
    period = max((t for t, k in zip(times, kernels, strict=True) if k.work_s > 0), default=0.0)
    kernel_pes = _place_regions(ctx, target, plan, kernels, sizes, sizing.tau, times, replicas)
    io_pes = int(target.arch_value("io_region_pes", needed_by=WHO))
    # non-kernel PEs: the I/O region, the KV caches and the pipeline buffers (routing is in each region's)
    plan.units.append(
        Unit(id="io", kind="wse_io", stats=UnitStats(pes=float(io_pes)), allocation=io_pes / target.num_units)
    )
    held = (
        ("kv_cache", "wse_kv_cache", sizing.cache_pes, sizing.cache_bytes),
        ("buffers", "wse_buffers", sizing.buffer_pes, sizing.buffer_bytes),
    )
    for uid, kind, held_pes, nbytes in held:  # PEs that only hold state: a decode step's caches, the buffers
        if held_pes:
            plan.units.append(
                Unit(
                    id=uid,
                    kind=kind,
                    stats=UnitStats(pes=float(held_pes)),
                    resources={"bytes": float(nbytes * replicas)},
                    allocation=held_pes / target.num_units,
                )
            )
    # synchronous training: a step's update waits for its last sample's gradients, so each step
    # drains the pipeline, updates, and refills it (`_chain_latency`); each region updates its own
    # weights in the window between its last backward and the next step's first forward
    step = period * samples
    chain, before = _chain_latency(kernels, times)
    fill = _fill(kernels, times, chain, period)
    training = meta.graph_mode(ctx.graph) == "train"
    drains = training and options.steady_state and target.arch_value("drain_per_step", needed_by=WHO) > 0
    drain = fill if drains else 0.0
    windows = [(k.params / p, wait) for k, p, wait in zip(kernels, sizes, before, strict=True) if k.params]
    _place_optimizer(ctx, plan, target, windows, sram.level, target.ridge_point(ctx.precision, sram))
    overheads, transmission = _pipelined_overheads(ctx, target, plan, replicas, step, kernel_pes)
    if drain > 0:
        overheads[PIPELINE_FILL_DRAIN] = drain
    plan.step_overheads_s.update(overheads)
    rates = [1.0 / t if t > 0 else 0.0 for t in times]
    pipe_rate = min((r for r, k in zip(rates, kernels, strict=True) if k.work_s > 0), default=0.0) * replicas
    ceiling = math.inf if transmission is None else transmission
    for unit in plan.units:  # the compile report's steady states (no per-step costs): compute-limited,
        if unit.kind == "wse_io":  # and with the input-transmission ceiling applied
            unit.stats = replace(
                unit.stats, compute_samples_per_s=pipe_rate, transmission_samples_per_s=min(pipe_rate, ceiling)
            )
    # a step the next cannot overlap (a decode step) fills and drains the pipeline in its own time (the
    # emulated step is its makespan, which holds them): counted here too, so copies are ranked on it
    alone = fill if not plan.pipelined_steps and not drain else 0.0
    plan.stats = PlanStats(
        mode="pipelined",
        step_s=step + alone + sum(plan.step_overheads_s.values()),  # the optimizer excess too
        pipeline_rate_samples_per_s=pipe_rate,
        transmission_rate_samples_per_s=transmission,
    )
    plan.extra.update(
        _pipelined_extra(target, kernels, sizes, times, period, sizing, replicas, kernel_pes, io_pes, chain)
    )
    return plan


def _steps_overlap(ctx: LoweringContext, options: WseOptions) -> bool:
    """Whether consecutive steps overlap in the pipeline (the step time is then its period): in a
    steady state (``steady_state``), unless each step reads the KV cache the step before it wrote (a
    decode step, `reads_kv_cache`): its new token is that step's output, so it enters only once the
    step before has left the pipeline, and its time is its latency, fill and drain included (as the
    generation scenario times it)."""
    return options.steady_state and not reads_kv_cache(ctx.graph)


def _fit_regions(target: Target, plan: Plan, kernels: list[WseKernel], sizing: _Sizing, replicas: int) -> list[int]:
    """Each kernel's region in PEs, failing the plan when the copies' weights, optimizer state, KV
    caches, pipeline buffers and skip FIFOs overflow the usable SRAM, or when the kernels' minimum
    regions do not fit beside I/O, routing and buffers (a failure of PEs, not of bytes: it states
    PEs only), then still timed, squeezed in proportion, so a plan that does not fit stays physical."""
    sram = target.memory(FEED_LEVEL)
    usable = target.arch_value("sram_usable_fraction", needed_by=WHO)
    held = {
        "weights and optimizer state": sizing.state_bytes,
        "KV cache": sizing.cache_bytes,
        "pipeline buffers": sizing.buffer_bytes,
        "skip FIFOs": sizing.skip_fifo_bytes,
    }
    need = sum(held.values()) * replicas
    plan.memory_bytes[sram.name] = need
    if need > usable * sram.capacity_bytes:
        parts = ", ".join(f"{what} {nbytes * replicas / 1e9:.2f} GB" for what, nbytes in held.items() if nbytes)
        plan.fail(
            f"pipelined mode needs {need / 1e9:.2f} GB of PE SRAM ({parts}, {replicas} "
            f"cop{'y' if replicas == 1 else 'ies'}); {usable:.0%} of the wafer's "
            f"{sram.capacity_bytes / 1e9:.0f} GB is usable",
            need,
            usable * sram.capacity_bytes,
        )
    if sizing.pes is not None:
        return sizing.pes
    plan.fail(
        f"{len(kernels)} kernels need at least {sum(sizing.lo) * replicas} PEs (minimum regions: row width, "
        f"weights and optimizer state), "
        f"{sizing.available * replicas} are left for kernels beside I/O, routing and buffers"
    )
    squeeze = max(sizing.available, 1) / max(sum(sizing.lo), 1)
    return [max(1, math.floor(p * squeeze)) for p in sizing.lo]


def _place_regions(
    ctx: LoweringContext,
    target: Target,
    plan: Plan,
    kernels: list[WseKernel],
    sizes: list[int],
    taus: list[float],
    times: list[float],
    replicas: int,
) -> int:
    """One unit a kernel (its region of ``sizes`` PEs, ``replicas`` copies) and its nodes' plans: a
    node's compute is its share of the region's W/p + tau per sample, over the copy's batch (each
    sample its own micro-batch: samples stream through one at a time).
    Returns the PEs the regions hold."""
    pes = target.num_units
    sram = target.memory(FEED_LEVEL)
    ridge = target.ridge_point(ctx.precision, sram)
    route = target.arch_value("route_pes_per_kernel_pe", needed_by=WHO)
    samples = ctx.batch
    kernel_pes = 0
    # a region whose nodes run both before the decoder blocks and after them (the tied embedding and LM
    # head of emb_fc) serves two places in the pipeline: each sample's head runs on a lane of its own
    # beside the next samples' lookups (the region's period is its lanes' sum: `dabench_ir.emulate`)
    _, after = outside_blocks(ctx.graph.nodes)
    after_blocks = {n.name for n in after}

    for i, (k, p, tau, t) in enumerate(zip(kernels, sizes, taus, times, strict=True)):
        busy = k.work_s / p
        width = math.ceil(math.sqrt(p))
        unit = Unit(
            id=f"region{i}",
            kind=f"wse_region:{k.cls}",
            nodes=[n.name for n in k.nodes if n.name not in plan.node_plans],
            stats=UnitStats(pes=float(p), held_units=float(p * replicas), utilisation=busy / t if t > 0 else 0.0),
            resources={
                "width": float(width),
                "height": float(math.ceil(p / width)),
                "rate_samples_per_s": (1.0 / t if t > 0 else 0.0) * replicas,
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
        returns = any(n.name not in after_blocks for n in k.nodes) and any(n.name in after_blocks for n in k.nodes)
        for node in k.nodes:
            w = k.node_work_s.get(node.name, 0.0)
            share = w / k.work_s if k.work_s > 0 else 0.0
            # a node's time is its share of W/p + tau: its work on the region's PEs, and its share of
            # the kernel's fixed time a row (tau), which no PE count shortens: an overhead, so a norm
            # region spending 80 % of its time there is overhead-bound, not compute-bound at 0.75 % of peak
            compute, fixed = w / p * samples, tau * share * samples
            if node.name in plan.node_plans:  # an add's backward half: same node, a second region beside
                prev = plan.node_plans[node.name]  # the first, running at the same time: the slower one counts
                if compute + fixed > prev.compute_s + prev.overhead_s:
                    prev.compute_s, prev.overhead_s = compute, fixed
                    prev.per_micro_batch_s = (compute + fixed) / samples
                continue
            plan.node_plans[node.name] = place_node(
                ctx,
                node,
                unit=unit.id,
                lane=f"{unit.id}.after" if returns and node.name in after_blocks else None,
                compute_s=compute,
                overhead_s=fixed,
                feed_level=sram.level,
                feed_bytes=ctx.costs[node.name].bytes,
                ridge=ridge,
                feed_bandwidth=sram.bandwidth_bytes_per_s * p * replicas / pes,  # the SRAM of the region's PEs
                allocation=p * replicas / pes,
                micro_batches=samples,
                rows=k.rows,
                holds=k.holds_sample,
            )
            if not ctx.is_work(node) or k.work_s == 0:
                plan.node_plans[node.name].per_micro_batch_s = 0.0
    return kernel_pes


def _pipelined_extra(
    target: Target,
    kernels: list[WseKernel],
    sizes: list[int],
    times: list[float],
    period: float,
    sizing: _Sizing,
    replicas: int,
    kernel_pes: int,
    io_pes: int,
    chain: float,
) -> dict[str, float]:
    """The plan's PE accounting (kernels, routing, I/O, buffers), load balance and utilisation."""
    pes = target.num_units
    route = target.arch_value("route_pes_per_kernel_pe", needed_by=WHO)
    weighted = sum(p * (t / period) for p, t, k in zip(sizes, times, kernels, strict=True) if k.work_s > 0 and t > 0)
    total_p = sum(p for p, k in zip(sizes, kernels, strict=True) if k.work_s > 0)
    route_pes = sum(sizes) * replicas * route
    return {
        "pes": pes,
        "pes_kernels": kernel_pes,
        "pes_route": route_pes,
        "pes_io": io_pes,
        "pes_buffer": sizing.buffer_pes,
        "pes_placed": kernel_pes,
        "pes_kv_cache": sizing.cache_pes,
        "active_pes_fraction": (kernel_pes + route_pes + io_pes + sizing.buffer_pes + sizing.cache_pes) / pes,
        "load_imbalance_pe_weighted": weighted / total_p if total_p else 1.0,
        "compute_utilisation": (
            sum(k.work_s for k, p in zip(kernels, sizes, strict=True) if k.work_s > 0) / (period * total_p)
            if period > 0 and total_p
            else 0.0
        ),
        "kernels": len(kernels),
        "period_s": period,
        "chain_latency_s": chain,
        "buffer_bytes": sizing.buffer_bytes * replicas,
        "state_bytes": sizing.state_bytes * replicas,
    }


def _chain_latency(kernels: list[WseKernel], times: list[float]) -> tuple[float, list[float]]:
    """One sample's latency through the kernel chain, forward and backward, and each kernel's share
    of it before the kernel (its window to update its weights between steps): each kernel passes a
    sample on once its first row is out (its time per sample over its rows), an attention kernel
    once it has read the whole sample (`WseKernel.holds_sample`: its whole time per sample, forward
    and backward shares together), summed over the chain in kernel order."""
    before, acc = [], 0.0
    for k, t in zip(kernels, times, strict=True):
        before.append(acc)
        acc += k.first_row_s(t)
    return acc, before


def _fill(kernels: list[WseKernel], times: list[float], chain: float, period: float) -> float:
    """What a step alone takes beyond its samples' periods. The first sample's first row leaves the
    chain after ``chain`` (`_chain_latency`); its last row leaves as long after as the kernel that
    holds it longest between its first row in and its last row out (a kernel that streams rows:
    its time per sample less one row's; one that holds the sample: none); each further sample
    one period later. So a step alone is that sample's latency and ``B - 1`` periods."""
    tails = [t - k.first_row_s(t) for t, k in zip(times, kernels, strict=True) if k.work_s > 0]
    return max(0.0, chain + max(tails, default=0.0) - period)


def _place_optimizer(
    ctx: LoweringContext, plan: Plan, target: Target, regions: list[tuple[float, float]], level: str, ridge: float
) -> None:
    """The optimizer step: every region updates its own weights (``regions``: parameters per PE
    and the window it has for that, from its last backward of a step to the next step's first
    forward reaching it, beside the update that holds the next step back); the largest excess over
    its window is the step overhead ``wse_optimizer`` (at least the first region's whole update:
    its window is nil, the next step enters through it)."""
    params = trained_params(ctx)
    for node in ctx.graph.nodes:
        if not is_optimizer_step(node) or not params:
            continue
        per_param = KernelRates.of(target).work_s(ctx.costs[node.name], DType.FLOAT32, False) / params
        busy = max((max(0.0, per_param * q - window) for q, window in regions), default=0.0)
        plan.units.append(
            Unit(
                id="optimizer", kind="wse_optimizer", nodes=[node.name], stats=UnitStats(held_units=0.0), allocation=0.0
            )
        )
        np_ = place_node(
            ctx,
            node,
            unit="optimizer",
            compute_s=busy,
            feed_level=level,
            feed_bytes=ctx.costs[node.name].bytes,
            ridge=ridge,
            allocation=0.0,
            time_s=0.0,
        )
        np_.note = (
            "runs in every region on its own weights once the step's gradients are complete, while the "
            "pipeline drains and refills; what outlasts that is the step overhead wse_optimizer"
        )
        plan.node_plans[node.name] = np_
        plan.step_overheads_s["wse_optimizer"] = busy


def _pipelined_overheads(
    ctx: LoweringContext, target: Target, plan: Plan, replicas: int, step_s: float, kernel_pes: int
) -> tuple[dict[str, float], float | None]:
    """Per-step costs no region owns: replicas' gradient reduction and the input-transmission
    ceiling; and the samples per second the system I/O link can feed (None: the target has none)."""
    out: dict[str, float] = {}
    transmission: float | None = None
    if replicas > 1 and meta.graph_mode(ctx.graph) == "train":
        clock = float(target.clock)
        link = target.arch_value("fabric_link_bytes_per_cycle", needed_by=WHO)
        hop = target.link("fabric").latency_s if target.link("fabric") else 1.0 / clock
        side = math.sqrt(target.num_units)
        cut_bw = side * link * clock  # one link per row crossing the wafer's bisection
        grad = trained_params(ctx) * 4  # fp32 gradients
        from dabench_ir.lowering.collectives import ring_allreduce_time

        out["wse_replica_reduce"] = ring_allreduce_time(grad, replicas, cut_bw) + (replicas - 1) * side * hop
    io = target.link("system_io")
    if io is not None:
        samples = max(1, sample_count(ctx))
        held = cache_inputs(ctx)  # a decode step's caches stay on the wafer: only its new tokens are sent
        sent = [v for v in ctx.graph.inputs if v not in held and shape_of(ctx, v)]
        in_bytes = sum(ctx.graph.type_of(v).nbytes() for v in sent) / samples
        if meta.graph_mode(ctx.graph) == "train":
            in_bytes *= 2  # labels beside the inputs
        send = plan.samples_per_step * in_bytes / io.bandwidth_bytes_per_s
        transmission = io.bandwidth_bytes_per_s / in_bytes if in_bytes else math.inf
        if send > step_s:
            out["wse_input_transmission"] = send - step_s
    return out, transmission
