"""WSE weight-streaming mode: each decoder layer in turn on the whole wafer, weights from MemoryX.

Each decoder layer in turn runs on the whole wafer while its weights stream in from MemoryX
(forward and again in backward; gradients stream back). Training keeps each layer's input on
the wafer and recomputes the layer in backward; activations never leave the wafer, so the batch
runs in lanes (the compiler's word; the tool's micro-batches): the lane is the largest divisor of
the batch whose checkpoints and one layer's working set fit in SRAM, so the number of layers that
fits is finite. Weights, gradients and optimizer state live in MemoryX; the update runs
there, overlapped except at the step boundary.

Per-node work comes from the kernel rates (`kernels.KernelRates`); the kernel grouping
(`kernels.wse_kernels`) says which Gather is the token-table lookup and what an attention
kernel keeps for backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.ir import Cost, Node
from dabench_ir.lowering.context import (
    Block,
    LoweringContext,
    cache_bytes,
    cache_inputs,
    largest_divisor,
    layer_blocks,
    outside_blocks,
    peak_live_bytes,
    place_node,
    weight_bytes,
)
from dabench_ir.lowering.wse.common import WHO, is_data, phase_cost, sample_count, shape_of, weight_state_bytes
from dabench_ir.lowering.wse.kernels import KernelRates, WseKernel
from dabench_ir.passes import meta
from dabench_ir.passes.precision import accumulate_dtype
from dabench_ir.passes.training import FORWARD_COST, is_loss, is_optimizer_step
from dabench_ir.plan import Plan, PlanStats, Schedule, Unit, UnitStats

if TYPE_CHECKING:
    from dabench_ir.lowering.wse import WseOptions
    from dabench_ir.targets import MemoryLevel, Target

__all__ = ["BlockStream", "block_streams", "streaming_plan"]


@dataclass(frozen=True, slots=True)
class BlockStream:
    """One block (a decoder layer, or the nodes outside the layers) as weight streaming runs it."""

    block: Block
    nodes: list[Node]  # its nodes, the optimizer step left out (it runs in MemoryX)
    work_s: dict[str, float]  # each node's whole-wafer busy seconds per sample (`KernelRates.work_s`)
    weight_bytes: int
    stream_bytes: int  # what streams from MemoryX per lane: W in (fwd), W in again (bwd), dW out
    is_layer: bool
    checkpoint_bytes: int  # per sample: the block's output, kept on the wafer for the backward
    working_bytes: int  # per sample: its working set on the wafer


@dataclass(frozen=True, slots=True)
class _Wafer:
    """The wafer and MemoryX as the streaming plan reads them."""

    pes: int
    sram: MemoryLevel
    ext: MemoryLevel
    usable: float  # the share of SRAM a plan may fill

    @property
    def sram_bytes(self) -> float:
        return self.usable * self.sram.capacity_bytes


def streaming_plan(ctx: LoweringContext, target: Target, options: WseOptions, kernels: list[WseKernel]) -> Plan:
    """The weight-streaming plan; ``kernels``: the graph's (`wse_kernels`), as the pipelined attempt had
    them. Steps: each block's work and streams, the lane (micro-batch) that fits SRAM, the blocks
    placed in turn on the whole wafer, the optimizer step in MemoryX, then the fit."""
    target.peak_flops(ctx.precision)  # an unsupported precision fails here, before any planning
    wafer = _Wafer(
        pes=target.num_units,
        sram=target.memory("on-chip"),
        ext=target.memory("off-chip"),
        usable=target.arch_value("sram_usable_fraction", needed_by=WHO),
    )
    training = meta.graph_mode(ctx.graph) == "train"
    batch = ctx.batch
    plan = ctx.plan(target, options, Schedule.SEQUENTIAL)
    streams = block_streams(ctx, target, kernels)
    layers = sum(1 for b in streams if b.is_layer)
    keep = sum(b.checkpoint_bytes for b in streams if b.is_layer) if training else 0
    working = max((b.working_bytes for b in streams), default=0)
    max_w = max((b.weight_bytes for b in streams), default=0)
    cache = cache_bytes(ctx, ctx.graph.nodes)  # a decode step's KV caches, every layer's: kept on the wafer

    def need(mb: int) -> float:  # SRAM at lane ``mb``: its checkpoints and working set, weights double-buffered
        return mb * (keep + working) + 2 * max_w + cache

    budget = wafer.sram_bytes - 2 * max_w - cache  # what a lane may fill beside the weights and the caches
    most = int(max(1, min(batch, budget // (keep + working)))) if keep + working > 0 else batch
    mb = _lane(options, batch, most)
    n_mb = max(1, math.ceil(batch / mb))
    plan.micro_batches = n_mb
    per_layer = keep / layers if layers else 0
    fits_layers = int(max(0.0, budget - mb * working) // (mb * per_layer)) if per_layer else None
    plan.stats = PlanStats(mode="streaming", micro_batch=mb, max_layers_at_micro_batch=fits_layers)
    plan.extra.update(
        {
            "layers": layers,
            "sram_need_bytes": need(mb),
            "checkpoint_bytes_per_sample": keep,
            "working_bytes_per_sample": working,
        }
    )
    if training and n_mb > 1 and not options.micro_batches:
        plan.notes.append(
            f"the batch of {batch} runs as {n_mb} lanes of {mb} (the Cerebras compiler's 'per-box batch size "
            f"{batch} with {n_mb} lanes'): a lane goes through every layer forward and backward with its own "
            f"{layers} layer checkpoints on the wafer ({mb * keep / 1e9:.2f} GB), the weights stream once per "
            "lane, the gradients add up in MemoryX, one weight update per batch"
        )
    _place_blocks(ctx, target, plan, wafer, streams, mb, n_mb)
    total_w = ctx.total_weight_bytes
    state = weight_state_bytes(ctx) - total_w  # gradients, fp32 master weights and moments: in MemoryX
    plan.memory_bytes = {wafer.sram.name: int(need(mb)), wafer.ext.name: int(total_w + state)}
    plan.traffic_bytes = {wafer.ext.name: int(sum(b.stream_bytes for b in streams) * n_mb)}
    if training:
        last_layer = next((b for b in reversed(streams) if b.is_layer), None)
        lw = last_layer.weight_bytes if last_layer else max_w
        plan.step_overheads_s["wse_grad_writeback"] = lw / wafer.ext.bandwidth_bytes_per_s
        plan.step_overheads_s["wse_memoryx_update"] = lw / wafer.ext.bandwidth_bytes_per_s
        _place_optimizer(ctx, target, plan, wafer)
    _check_fit(
        plan,
        wafer,
        need,
        mb=mb,
        batch=batch,
        most=most,
        layers=layers,
        keep=keep,
        working=working,
        max_w=max_w,
        cache=cache,
        memoryx_bytes=total_w + state,
    )
    return plan


def block_streams(ctx: LoweringContext, target: Target, kernels: list[WseKernel]) -> list[BlockStream]:
    """Each block's per-sample whole-wafer work, stream bytes and on-wafer bytes. Training recomputes
    a layer's forward in its backward (``[arch] ws_recompute``, `_runs_forward_again`); the token-table
    lookup is its kernel's work."""
    rates = KernelRates.of(target)
    training = meta.graph_mode(ctx.graph) == "train"
    forward_again = _runs_forward_again(ctx, target)
    samples = max(1, sample_count(ctx))
    kernel_of = {n.name: k for k in kernels for n in k.nodes}
    out = []
    for block in layer_blocks(ctx.graph):
        nodes = [n for n in block.nodes if not is_optimizer_step(n)]
        if not nodes:
            continue
        work = {}
        for n in nodes:
            if not ctx.is_work(n) or meta.FOLDED in n.meta:
                work[n.name] = 0.0
                continue
            prec = ctx.node_precision(n)
            acc = accumulate_dtype(ctx.graph, n)
            w = rates.work_s(ctx.costs[n.name], prec, is_data(n), acc)
            if n.name in forward_again:
                w += rates.work_s(phase_cost(n, FORWARD_COST, Cost()), prec, is_data(n), acc)
            k = kernel_of.get(n.name)
            if n.op_type == "Gather" and k is not None and k.cls == "emb_fc":
                w = k.node_work_s.get(n.name, 0.0) * samples
            work[n.name] = w / samples
        wbytes = weight_bytes(ctx, nodes)
        out.append(
            BlockStream(
                block=block,
                nodes=nodes,
                work_s=work,
                weight_bytes=wbytes,
                stream_bytes=(3 if training else 1) * wbytes,
                is_layer=block.key.startswith("layer"),
                checkpoint_bytes=_block_out_bytes(ctx, nodes) // samples,
                working_bytes=_working_bytes(ctx, nodes, kernel_of) // samples,
            )
        )
    return out


def _runs_forward_again(ctx: LoweringContext, target: Target) -> frozenset[str]:
    """The nodes weight streaming runs forward again in backward: a training step keeps each decoder
    layer's input on the wafer and recomputes the layer from it (``[arch] ws_recompute``), so every
    node of a layer, except those whose backward cost holds their forward already (the graph's own
    ``--recompute``, `passes.meta.RECOMPUTED`: one recompute, counted there once). Not the nodes after
    the last layer (final norm, LM head, loss), which `layer_blocks` streams with the last layer: the
    source recomputes "the layer", and the head's backward follows its forward at once, its
    activations still on the wafer."""
    if meta.graph_mode(ctx.graph) != "train" or not target.arch_value("ws_recompute", 1.0):
        return frozenset()
    _, tail = outside_blocks(ctx.graph.nodes)
    after = {n.name for n in tail}
    return frozenset(
        n.name
        for n in ctx.graph.nodes
        if n.name not in after and not n.meta.get(meta.RECOMPUTED) and not is_optimizer_step(n)
    )


def _lane(options: WseOptions, batch: int, most: int) -> int:
    """The samples of one lane: the batch over ``--micro-batches``, else the largest divisor of the
    batch up to ``most``, the samples whose bytes fit the SRAM left beside the double-buffered
    weights (the need grows linearly with the lane)."""
    if options.micro_batches:
        return max(1, batch // options.micro_batches)
    return largest_divisor(batch, most)


def _place_blocks(
    ctx: LoweringContext, target: Target, plan: Plan, wafer: _Wafer, streams: list[BlockStream], mb: int, n_mb: int
) -> None:
    """Each block in turn on the whole wafer, once per lane: a unit held by the stream when its
    weights take longer to arrive than its work (its nodes then fed from MemoryX), else by the work."""
    sram_ridge = target.ridge_point(ctx.precision, wafer.sram)
    ext_ridge = target.ridge_point(ctx.precision, wafer.ext)
    pass_s = target.overhead_value("ws_layer_pass_s", needed_by=WHO)  # fitted: never read as 0
    for b in streams:
        t_c = mb * sum(b.work_s.values()) / wafer.pes
        t_s = b.stream_bytes / wafer.ext.bandwidth_bytes_per_s
        unit = Unit(
            id=b.block.key,
            kind="wse_layer",
            nodes=[n.name for n in b.nodes],
            stats=UnitStats(pes=float(wafer.pes), held_units=float(wafer.pes), feed_bytes=float(b.stream_bytes * n_mb)),
            resources={
                "weight_bytes": float(b.weight_bytes),
                "stream_s_per_micro_batch": t_s,
                "compute_s_per_micro_batch": t_c,
            },
            allocation=1.0,
            gap_before_s=pass_s * n_mb if b.is_layer else 0.0,
            gap_kind="layer_switch",
            min_time_s=t_s * n_mb,
        )
        plan.units.append(unit)
        streamed = t_s > t_c
        block_weights = max(1, sum(ctx.costs[x.name].weight_bytes for x in b.nodes))
        for n in b.nodes:
            cost = ctx.costs[n.name]
            compute = mb * b.work_s[n.name] / wafer.pes * n_mb
            share = cost.weight_bytes / block_weights
            plan.node_plans[n.name] = place_node(
                ctx,
                n,
                unit=unit.id,
                compute_s=compute,
                memory_s=t_s * n_mb * share if streamed else 0.0,
                feed_level=wafer.ext.level if streamed else wafer.sram.level,
                feed_bytes=cost.weight_bytes if streamed else cost.bytes,
                ridge=ext_ridge if streamed else sram_ridge,
                feed_bandwidth=(wafer.ext if streamed else wafer.sram).bandwidth_bytes_per_s,
                allocation=1.0 if ctx.is_work(n) else 0.0,
                micro_batches=n_mb,
            )
            if streamed:  # the unit's min_time_s holds the stream; nodes carry their compute
                plan.node_plans[n.name].per_micro_batch_s = compute / n_mb


def _place_optimizer(ctx: LoweringContext, target: Target, plan: Plan, wafer: _Wafer) -> None:
    """The optimizer step runs in MemoryX, overlapped with the next layers (its tail is the
    ``wse_memoryx_update`` row)."""
    ext_ridge = target.ridge_point(ctx.precision, wafer.ext)
    for node in ctx.graph.nodes:
        if not is_optimizer_step(node):
            continue
        plan.units.append(Unit(id="memoryx", kind="wse_memoryx", nodes=[node.name], allocation=0.0))
        np_ = place_node(
            ctx,
            node,
            unit="memoryx",
            compute_s=0.0,
            feed_level=wafer.ext.level,
            feed_bytes=ctx.costs[node.name].bytes,
            ridge=ext_ridge,
            allocation=0.0,
            time_s=0.0,
        )
        np_.note = "runs in MemoryX, overlapped with the next layers; its tail is wse_memoryx_update"
        plan.node_plans[node.name] = np_


def _check_fit(
    plan: Plan,
    wafer: _Wafer,
    need: Callable[[int], float],
    *,
    mb: int,
    batch: int,
    most: int,
    layers: int,
    keep: int,
    working: int,
    max_w: int,
    cache: int,
    memoryx_bytes: int,
) -> None:
    """The plan fails when even a lane of one sample overflows the usable SRAM, when its lane does
    (the remedy: the fewest micro-batches that divide the batch into lanes of ``most`` samples or fewer),
    or when the weights and optimizer state overflow MemoryX."""
    sram = wafer.sram
    if need(1) > wafer.sram_bytes:
        plan.fail(
            f"weight streaming needs {need(1) / 1e9:.2f} GB of wafer SRAM at micro-batch 1 ({layers} layer "
            f"checkpoints of {keep / max(layers, 1) / 1e6:.1f} MB, one layer's working set {working / 1e6:.1f} MB, "
            f"double-buffered weights {2 * max_w / 1e6:.1f} MB"
            + (f", the KV caches {cache / 1e9:.2f} GB" if cache else "")
            + f"); {wafer.usable:.0%} of "
            f"{sram.capacity_bytes / 1e9:.0f} GB is usable",
            need(1),
            wafer.sram_bytes,
        )
    elif need(mb) > wafer.sram_bytes:
        lane = largest_divisor(batch, most)  # the lane `_lane` would choose: a divisor of the batch that fits
        enough = batch // lane  # the fewest micro-batches that divide the batch (as --micro-batches must)
        plan.fail(
            f"weight streaming at micro-batch {mb} needs {need(mb) / 1e9:.2f} GB of wafer SRAM; "
            f"{wafer.usable:.0%} of {sram.capacity_bytes / 1e9:.0f} GB is usable "
            f"(use more micro-batches: --micro-batches {enough}, lanes of {lane} samples; a lane fits up "
            f"to {most})",
            need(mb),
            wafer.sram_bytes,
            remedy=(("micro_batches", enough),),
        )
    if memoryx_bytes > wafer.ext.capacity_bytes:
        plan.fail(
            f"weights and optimizer state ({memoryx_bytes / 1e9:.1f} GB) exceed {wafer.ext.name}",
            memoryx_bytes,
            wafer.ext.capacity_bytes,
        )


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
            # read outside asked first: most outputs are not, and their shape need not be built
            if out and any(c.name not in names and not is_optimizer_step(c) for c in readers) and shape_of(ctx, out):
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
        return peak_live_bytes(ctx, nodes, skip=cache_inputs(ctx))  # the caches are held apart (`cache_bytes`)
    graph = ctx.graph
    seen: set[str] = set()
    total = 0
    for node in nodes:
        if is_loss(node):  # it writes the logits' gradient in the same pass: nothing kept for backward
            continue
        k = kernel_of.get(node.name)
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            if value is None or v in seen or value.kind.is_stored or not shape_of(ctx, v):
                continue
            prod = kernel_of.get(value.producer) if value.producer else None
            if k is not None and k.cls == "attention" and prod is k:
                continue
            seen.add(v)
            total += graph.type_of(v).nbytes()
    return total
