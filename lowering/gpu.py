"""GPU lowering: one kernel per node or fused elementwise chain, roofline timed.

Each kernel takes ``max(compute, bytes / sustained DRAM bandwidth)`` plus a fixed launch overhead, on
one in-order stream (the sustained bandwidth: the datasheet's times ``arch.memory_efficiency``, the
share a streaming copy measures), its compute the sum of its op classes' times (`Target.compute_time`:
contraction FLOPs at the tensor-core peak times ``arch.matmul_efficiency``, vector FLOPs at the
CUDA-core rate, special-function ops at the SFU rate). Weights and the peak of live activations must fit in
device memory (HBM). In training the step runs ``micro_batches`` micro-batches one after
another (gradient accumulation): each kernel launches and reads its weights once per
micro-batch, activations are held for one micro-batch at a time, and the optimizer runs
once per step. Attention cores run as one fused kernel when the fused-attention pass ran;
they reach ``arch.fused_attention_efficiency`` of peak (FlashAttention-2's measured share) on the
scores they compute (a causal kernel skips the key blocks above the diagonal, about half:
``meta.CAUSAL_SHARE``), but never run faster than their exps at the SFU rate and the rest at the
hardware rates allow.
``optimizer_state=offchip`` keeps fp32 master weights and Adam moments in
host memory and runs the optimizer there (CPU offload, ZeRO-Offload; Ren et al., USENIX ATC 2021:
`offload_plan`): the Adam node streams its state through the GPU's share of the host's DRAM, each
micro-batch's gradients cross PCIe to the host under its backward pass, and the updated 16-bit weights
cross back before the next step, the part no computation hides in step rows of their own. The host
CPU lowering (`cpu`) places nodes the same way, one per onnxruntime kernel, with its calibrated times.

Decode graphs (``dabench.phase`` = decode, from ``dabench-ir export --phase decode``) are
grouped as serving engines run them: one kernel per matmul, with the norms, rotary
embedding, softmax and residual adds around it fused into it (vLLM and TensorRT-LLM fuse
these into the GEMM and attention kernels). The KV cache is an input held in HBM with the
weights, so a decode step is bound by reading weights and cache plus the launches. Their decode
attention kernels run one thread block per query head: under grouped-query attention HBM delivers
the cache once per K/V head, but each query head of a group loads it again (from L2 when it is still
there), so a cache read takes at least all those loads at the rate such a kernel loads them,
``arch.decode_attention_load_bytes_per_s`` (`cache_rereads`; at most the L2's bandwidth). A kernel of
one thread block per K/V head serving its group's query heads (TensorRT-LLM's XQA: "reducing data
loading", docs/source/blogs/XQA-kernel.md) loads it once: ``--decode-attention per-kv-head``;
``xqa-auto`` takes it where TensorRT-LLM's own heuristic would (`XQA_MIN_BLOCK_FACTOR`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, Node
from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering.context import (
    LoweringContext,
    cache_bytes,
    cache_inputs,
    kernel_groups,
    peak_live_bytes,
    place_node,
    training_state,
)
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import Backward, OpClass, traits_of
from dabench_ir.passes.precision import reads_kv_cache
from dabench_ir.passes.training import (
    ADAM_FLOPS_PER_PARAM,
    BACKWARD_COST,
    FORWARD_COST,
    FUSED_ATTENTION,
    SAVED,
    core_internal,
    is_optimizer_step,
)
from dabench_ir.plan import Failure, Plan, Schedule, Unit
from dabench_ir.timeline import Bound

if TYPE_CHECKING:
    from dabench_ir.plan import NodePlan
    from dabench_ir.targets import Link, MemoryLevel, Target

__all__ = [
    "DECODE_ATTENTION_LOAD",
    "DECODE_STEP",
    "HOST_ISSUE",
    "LOWERING",
    "OFFLOAD_GRADIENTS",
    "OFFLOAD_WEIGHTS",
    "GpuLowering",
    "GpuOptions",
    "cache_rereads",
    "device_memory",
    "gemm_wave_efficiency",
    "host_shortfall",
    "offload_plan",
    "saved_activation_bytes",
    "stream_plan",
    "strided_views",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuOptions(LoweringOptions):
    """What the GPU lowering reads. Internal (no knob): ``fuse_elementwise`` fuses
    elementwise chains onto their producer's kernel, as GPU compilers do; ``host_sharers``: the GPUs
    of one host that offload their optimizer state at once (a multi-chip run's GPUs on a node,
    `dabench_ir.scaling`), which share its memory (`Offload`)."""

    fuse_elementwise: bool = internal(True)
    host_sharers: int = internal(1)
    micro_batches: int | None
    optimizer_state: str
    decode_attention: str


class GpuLowering(Lowering):
    """GPUs: kernels one after another on one stream, each timed by the roofline plus a launch."""

    name = "gpu"
    kinds = ("gpu",)
    Options = GpuOptions
    feed = "off-chip"  # every operand streams from device memory (HBM)

    def offloads_optimizer(self, options: GpuOptions) -> bool:
        """``--optimizer-state offchip``: CPU offload, ZeRO-Offload (`Offload`)."""
        return options.optimizer_state == "offchip"

    def device_memory(self, ctx: LoweringContext, options: GpuOptions, *, zero: int, shards: int) -> dict[str, int]:
        """One GPU's bytes under data parallelism over ``shards`` with ZeRO stage ``zero`` (`device_memory`)."""
        return device_memory(
            ctx,
            micro_batches=options.micro_batches or 1,
            offload=self.offloads_optimizer(options),
            zero=zero,
            shards=shards,
        )

    def _lower(self, ctx: LoweringContext, target: Target, options: GpuOptions) -> Plan:
        unit = Unit(id="stream0", kind="gpu_stream")
        # a decode step (it reads a KV cache: a Hugging Face export's too, not only the tool's own
        # decode export) runs as a serving engine's, kernels fused and the engine's host work between steps
        groups = _serving_kernels(ctx) if reads_kv_cache(ctx.graph) else None
        offload = offload_plan(ctx, target, options)
        plan = stream_plan(ctx, target, options, unit, fuse=options.fuse_elementwise, groups=groups, offload=offload)
        # the engine's host work a decode step: required of a GPU that serves one (never read as 0)
        step_s = target.overhead_value(DECODE_STEP + "_s", needed_by=self.name) if groups is not None else 0.0
        if step_s > 0:  # the serving engine's host work between two decode steps: its own row, no node's
            plan.step_overheads_s[DECODE_STEP] = step_s
        plan.stats = replace(
            plan.stats,
            weights_home=f"{target.feed_memory.name} (read every step)",
            kv_cache_home=f"{target.feed_memory.name} ({target.feed_memory.level})",
        )
        return plan


def _serving_kernels(ctx: LoweringContext) -> list[list[Node]]:
    """Kernels of a decode step: a new kernel at every matmul, every other node fused into
    the kernel before it (nodes before the first matmul form one kernel)."""
    groups: list[list[Node]] = []
    for node in ctx.graph.nodes:
        if not groups or node.meta.get(meta.OP_CLASS) is OpClass.CONTRACTION:
            groups.append([node])
        else:
            groups[-1].append(node)
    return groups


LOWERING = GpuLowering()

DECODE_STEP = "decode_step"
"""The step overhead of one decode step that belongs to no node: what a serving engine does on the
host between two steps and the device waits for (scheduling, input preparation, sampling, output
processing), ``overheads.decode_step_s`` of the target."""

DECODE_ATTENTION_LOAD = "decode_attention_load_bytes_per_s"
"""The ``[arch]`` rate a decode attention kernel of one thread block per (sequence, query head) loads the
K/V cache at, its group's repeats included (`cache_rereads`): fitted where a target file says so, and
never above the L2's bandwidth, where the repeats are served when they hit."""

HOST_ISSUE = "host_issue"
"""The step overhead (`Plan.step_overheads_s`) of a stream waiting for the host to issue its kernels."""

OFFLOAD_GRADIENTS = "pcie_gradients_to_host"
"""The step overhead of an offloaded optimizer (`offload_plan`): the part of the gradients' copies to the
host that the backward passes they follow do not hide."""

OFFLOAD_WEIGHTS = "pcie_weights_to_gpu"
"""The step overhead of an offloaded optimizer (`offload_plan`): the updated 16-bit weights copied back
to the GPU over PCIe, which the next step's forward waits for."""


_CLASS_WORDS = {"vector": "the vector (CUDA) cores", "special": "the special-function units (SFU)"}


def _compute_times(
    ctx: LoweringContext, target: Target, matmul_eff: float, fused_eff: float | None, micro_batches: int
) -> dict[str, tuple[float, str]]:
    """Compute seconds of every node and the op class that takes most of them.

    A node's compute time is `Target.compute_time`: its contraction FLOPs at the tensor peak
    times ``matmul_eff`` (the maximum achievable matmul FLOP/s: a contraction figure), its
    vector FLOPs and special-function ops at the vector and SFU rates, added, every class at
    the dtype the node computes in (`LoweringContext.node_precision`): under int8 or fp8 only
    the quantised block matmuls run at that peak, the attention matmuls at fp16's, as the
    verifier's ``node_peak_flops`` bounds them. A GEMM's tile and wave efficiency is that of its
    shape in one of the step's ``micro_batches`` (`gemm_wave_efficiency`).

    The nodes of one fused attention kernel (FlashAttention) run together: the kernel takes
    its contraction FLOPs at ``fused_eff`` of the peak (the published share; FlashAttention
    counts only the matmul FLOPs, a causal run's as half), on the share of the scores it computes
    (``CAUSAL_SHARE``: a causal kernel skips the key blocks above the diagonal,
    `passes.training.causal_shares`), but never less than all its work at the hardware rates in
    series (its exps at the SFU rate, its scale, max and sums at the vector rate, its matmuls at
    the peak: the graph counts every score, and the verifier holds each node to that); each node
    gets the kernel's time in proportion to its own work at those rates. ``fused_eff`` None: the
    target has no published share; fused nodes are timed as any node.
    """
    out: dict[str, tuple[float, str]] = {}
    cores: dict[object, list[tuple[str, dict[str, float]]]] = {}
    computed: dict[object, float] = {}  # core -> the share of its scores the kernel computes
    for node in ctx.graph.nodes:
        cost = ctx.costs[node.name]
        prec = ctx.node_precision(node)
        if fused_eff is not None and FUSED_ATTENTION in node.meta:
            hw = target.class_times(cost, prec)
            core = node.meta[FUSED_ATTENTION]
            cores.setdefault(core, []).append((node.name, hw))
            computed[core] = node.meta.get(meta.CAUSAL_SHARE, 1.0)
            continue
        eff = (
            matmul_eff * gemm_wave_efficiency(ctx, node, target, micro_batches)
            if cost.contraction_flops
            else matmul_eff
        )
        times = target.class_times(cost, prec, contraction_efficiency=eff)
        out[node.name] = (sum(times.values()), max(times, key=times.get))
    for core, members in cores.items():
        floor = sum(sum(hw.values()) for _, hw in members)
        share = computed[core] * sum(hw["contraction"] for _, hw in members) / fused_eff
        kernel = max(share, floor)
        for name, hw in members:
            own = sum(hw.values())
            binds = "contraction" if share >= floor else max(hw, key=hw.get)
            out[name] = (kernel * own / floor if floor > 0 else 0.0, binds)
    return out


@functools.lru_cache(maxsize=4096)
def _tile_efficiency(m: int, n: int, k: int, batch: int, tile: int, sms: int, k0: int = 0) -> float:
    """Share of the SMs' time one GEMM's thread blocks do useful work (NVIDIA, "Matrix Multiplication
    Background User's Guide" §3: tile and wave quantisation).

    The ``batch`` x M x N output is cut into ``tile`` x ``tile`` tiles (a dimension smaller than a
    tile: one tile as tall or wide as it, in multiples of the MMA shape); the K loop may be split into
    slices at least one tile deep (split-K: cuBLAS and CUTLASS split deep, narrow GEMMs so that
    every SM has work; the partial sums' reduction is not counted). Each (tile, slice) is one thread
    block; the blocks run in waves of one per SM, the last wave partial. Each block also pays a fixed
    cost worth ``k0`` of K (filling its multistage pipeline before the first MMA and writing its tile
    after the last, ``arch.gemm_block_overhead_k``), so a shallow K loop, or one split too finely, wastes
    a larger share. The split that finishes soonest is taken. Efficiency = useful MACs / (waves x SMs x
    one block's MAC time).
    """
    tm, tn = (min(tile, _MMA * math.ceil(d / _MMA)) for d in (m, n))  # no taller or wider than the GEMM needs
    tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
    best = math.inf
    for split in range(1, max(1, min(sms, math.ceil(k / tile))) + 1):
        best = min(best, math.ceil(tiles * split / sms) * (math.ceil(k / split) + k0))
    return (batch * m * n * k) / (best * sms * tm * tn)


_MMA = 16
"""Rows (and columns) of the smallest tensor-core tile: a 16-bit ``mma.sync`` is m16n8k16 on Ampere and
Hopper (CUDA PTX ISA, warp-level matrix instructions), so a GEMM narrower than a tile pads only to a
multiple of 16 (a decode GEMV at batch 1 uses 1/16 of its tile)."""


def gemm_wave_efficiency(ctx: LoweringContext, node: Node, target: Target, micro_batches: int = 1) -> float:
    """The tile and wave efficiency of a contraction node (`_tile_efficiency` with ``arch.gemm_tile``
    and ``arch.gemm_block_overhead_k`` over the target's SMs; 1 when the target has no tile, or the
    node's shapes are unknown or do not account for the contraction FLOPs its cost counts).

    In training the node's cost holds its backward too: the gradient GEMMs (dX: M x K output over N,
    dW: K x N output over M, one per operand needing a gradient) have their own shapes; the
    efficiency returned is the time-weighted one over the forward and those GEMMs. With
    ``micro_batches`` each kernel runs one micro-batch's share of the samples: a batched GEMM's
    batch, else a weight GEMM's rows (and the weight gradient's depth), over the micro-batches.
    """
    tile = int(target.arch_value("gemm_tile", 0.0))
    if tile <= 0:
        return 1.0
    from dabench_ir.lowering.cpu import matmul_dims

    dims = matmul_dims(ctx.graph, node)
    if dims is None:
        return 1.0
    batch, m, k, n = dims
    forward, backward = node.meta.get(FORWARD_COST), node.meta.get(BACKWARD_COST)
    counted = (forward or ctx.costs[node.name]).contraction_flops
    if not math.isclose(2 * batch * m * n * k, counted, rel_tol=0.01):
        return 1.0  # the shapes do not account for the FLOPs the cost counts: not this GEMM's tiles
    if batch > 1 and batch % micro_batches == 0:
        batch //= micro_batches
    elif m % micro_batches == 0:
        m //= micro_batches
    sms = target.num_units
    k0 = int(target.arch_value("gemm_block_overhead_k", needed_by="gpu"))  # a GPU with a tile states its own
    shapes = [(m, n, k)]
    if forward is not None and backward is not None and forward.contraction_flops:
        grads = round(backward.contraction_flops / forward.contraction_flops)
        shapes += [(m, k, n), (k, n, m)][:grads]
    slowness = sum(1.0 / _tile_efficiency(a, b, c, batch, tile, sms, k0) for a, b, c in shapes)
    return len(shapes) / slowness


def _backward_kernels(ctx: LoweringContext, group: list[Node], cores: set[object]) -> int:
    """Kernels the backward of one forward kernel launches (training; 0 in inference).

    One per gradient contraction of its GEMMs (dX and dW; with recompute the forward GEMM again),
    and one for the rest of the group's backward work, fused as its forward is. A fused attention
    core's backward is one kernel (FlashAttention's backward), counted once per core (``cores``:
    the cores counted so far). Layout moves (transpose, reshape) launch nothing of their own: the
    gradient is read through a strided view by the kernel next to it.
    """
    gemms, rest = 0, False
    for node in group:
        backward, forward = node.meta.get(BACKWARD_COST), node.meta.get(FORWARD_COST)
        if backward is None or traits_of(node).backward is Backward.MOVE:
            continue
        core = node.meta.get(FUSED_ATTENTION)
        if core is not None:
            if core not in cores and (backward.flops or backward.bytes):
                cores.add(core)
                gemms += 1
            continue
        if backward.contraction_flops and forward is not None and forward.contraction_flops:
            gemms += max(1, round(backward.contraction_flops / forward.contraction_flops))
        elif backward.flops or backward.bytes:
            rest = True
    return gemms + int(rest)


def _layout(node: Node) -> bool:
    """A view or a strided view of its input (Reshape, Squeeze, ..., Transpose): no arithmetic."""
    traits = traits_of(node)
    return traits.strided_view or (traits.shape_only and traits.keeps_values)


def strided_views(ctx: LoweringContext) -> frozenset[str]:
    """Transposes a fused attention kernel reads or writes through strides: they move no bytes.

    FlashAttention takes Q, K and V as ``(batch, seq, heads, head_dim)`` with any batch, sequence
    and head strides and writes its output in that layout (flash-attn's ``flash_attn_func``
    interface; PyTorch's SDPA passes the ``transpose(1, 2)`` views of the projections unchanged, and
    cuDNN's fused attention takes the packed QKV buffer with strides, as llm.c calls it), and its
    backward writes dQ, dK and dV the same way. So the head split and merge around a fused core
    (the chains of layout ops between the projections and the core, and from the core to the
    output projection) copy nothing, forward or backward. A transpose is counted as a view only
    when every reader of its output is the core or another such layout op.
    """
    graph = ctx.graph
    producer = {v: n for n in graph.nodes for v in n.outputs if v}
    cores = {n.name for n in graph.nodes if FUSED_ATTENTION in n.meta}
    if not cores:
        return frozenset()
    found: set[str] = set()

    def readers(node: Node) -> list[Node]:
        return [c for v in node.outputs if v for c in graph.consumers.get(v, [])]

    for name in cores:
        node = graph.node(name)
        up = [producer[v] for v in node.inputs if v in producer]
        while up:  # the head split: projections -> layout ops (GQA's broadcast of K and V too) -> core
            n = up.pop()
            if (
                (_layout(n) or _gqa_broadcast(n))
                and n.name not in found
                and all(c.name in cores or _layout(c) for c in readers(n))
            ):
                found.add(n.name)
                up += [producer[v] for v in n.inputs[:1] if v in producer]
        down = [c for c in readers(node) if c.name not in cores]
        while down:  # the head merge: core -> layout ops -> output projection
            n = down.pop()
            if _layout(n) and n.name not in found:
                found.add(n.name)
                down += readers(n)
    return frozenset(n for n in found if traits_of(graph.node(n)).strided_view or _gqa_broadcast(graph.node(n)))


def _gqa_broadcast(node: Node) -> bool:
    """A forward-only ``Expand`` (GQA's ``repeat_kv`` of K or V) on the way into a fused core: the
    kernel reads K and V with fewer heads than Q (flash-attn's ``flash_attn_func``: "MQA/GQA",
    nheads_k < nheads; PyTorch SDPA's ``enable_gqa``), so the broadcast copies nothing. In training
    it stays a kernel: FlashAttention-2's backward sums dK and dV over each group of query heads
    (flash-attn csrc/flash_attn/flash_api.cpp, ``mha_bwd``: ``at::sum_out`` of ``dk_expanded``)."""
    return node.op_type == "Expand" and BACKWARD_COST not in node.meta


def _memory_s(cost: Cost, runs: int, bw: float, reread: int = 0, load_rate: float = 0.0) -> float:
    """Memory seconds of a node over the step: its bytes from HBM, its weights read again each further
    micro-batch; with ``reread`` (`cache_rereads`: bytes loaded again) never less than all it loads at
    ``load_rate``, the rate a decode attention kernel of one thread block per query head loads them.
    The micro-batches split the step's sequences, so they load the cache and its repeats once together."""
    again = (runs - 1) * cost.weight_bytes / bw
    hbm = cost.bytes / bw + again
    return max(hbm, (cost.bytes + reread) / load_rate + again) if reread and load_rate > 0 else hbm


def cache_rereads(ctx: LoweringContext) -> dict[str, int]:
    """Bytes a decode step's attention loads from the KV cache beyond reading it once, by node.

    The decode attention kernels of the serving engines run one thread block per (sequence, query
    head), each loading the K and V of its head's group: TensorRT-LLM's masked multi-head attention
    (cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/decoderMaskedMultiheadAttentionTemplate.h:
    ``hi = blockIdx.x``, ``hi_kv = hi / qhead_per_kv``) and vLLM's paged attention
    (csrc/attention/attention_kernels.cu: ``head_idx = blockIdx.x``, ``kv_head_idx = head_idx /
    num_queries_per_kv``). Under grouped-query attention the decode graph reads each cached K/V head
    once, with the group's query heads as the rows of one matmul (`models.gpt2.attend_cached`), and
    its cost counts the cache once: what HBM delivers when the group's blocks, launched side by side,
    find it in L2. But each of the ``rows`` query heads loads it again (from L2 when it hits): ``rows - 1``
    more loads of the cache, all of them at the kernel's load rate (`DECODE_ATTENTION_LOAD`). A matmul
    of a decode step (`passes.precision.reads_kv_cache`) reading a KV-cache input
    (`passes.precision.kv_cache_values`) rereads it ``rows - 1`` times, its rows the other operand's
    (for the second operand; its columns for the first). Multi-head attention (one row)
    rereads nothing; nodes that reread nothing are left out. One chip of a tensor-parallel run with
    fewer K/V heads than chips holds a copy of one K/V head for its own query heads only (the graph's
    rows are the whole group's): its loads are the rows times `meta.CACHE_GROUP_SHARE`.
    """
    if not reads_kv_cache(ctx.graph):
        return {}
    from dabench_ir.lowering.cpu import matmul_dims

    caches = cache_inputs(ctx)
    served = meta.graph_find(ctx.graph, meta.CACHE_GROUP_SHARE, 1.0)  # of each group's query heads, this chip's
    out: dict[str, int] = {}
    for node in ctx.graph.nodes:
        if node.op_type != "MatMul" or len(node.inputs) < 2 or not caches.intersection(node.inputs[:2]):
            continue
        dims = matmul_dims(ctx.graph, node)
        if dims is None:
            continue
        _, rows, _, cols = dims
        side = 1 if node.inputs[1] in caches else 0
        loads = (rows if side == 1 else cols) * served
        if loads > 1:
            out[node.name] = round((loads - 1) * ctx.value_bytes(node.inputs[side]))
    return out


def _group_device_s(
    ctx: LoweringContext,
    group: list[Node],
    compute: Mapping[str, tuple[float, str]],
    memory: Callable[[Node, int], float],
    m: int,
    views: frozenset[str],
) -> float:
    """Device seconds of one kernel group's work over the step (roofline per node, launches apart;
    ``memory``: a node's memory seconds over its runs; ``views``: `strided_views`, no work)."""
    total = 0.0
    for node in group:
        if ctx.is_work(node) and node.name not in views:
            runs = 1 if is_optimizer_step(node) else m
            total += max(compute[node.name][0], memory(node, runs))
    return total


def _host_wait(launches: list[KernelGroup], issue_s: float, micro_batches: int) -> float:
    """Seconds per step the stream idles, its next kernel not yet issued by the host.

    ``launches``: per kernel group, its kernels per run, its runs per step (1: the optimizer, once
    per step), whether the host issues it and its device seconds over the step, launches included
    (0 for a strided view: the host dispatches the op, no kernel runs). The host issues one kernel
    (or view op) every ``issue_s`` (the framework's host cost per op, ``overheads.host_issue_s``)
    and runs ahead of the device as far as it can; the device starts kernel i at ``max(end of
    kernel i-1, when the host issued i)``. A step starts with an empty queue (the loop reads the
    loss back every step, as training loops do), so a step of short kernels is bound by the host
    and one of long kernels hides it. Order: each
    micro-batch's forward kernels in graph order, then their backward kernels in reverse, the
    once-per-step kernels last; a group's device time is split evenly over its kernels (exact for a
    GEMM and its two gradient GEMMs).
    """
    forward: list[float] = []
    backward: list[float] = []
    once: list[float] = []
    for g in launches:
        if not g.issued:
            continue
        each = g.device_s / (g.runs * g.kernels)
        if any(is_optimizer_step(n) for n in g.nodes):
            once += [each] * g.kernels
            continue
        forward.append(each)
        backward += [each] * (g.kernels - 1)
    wait = host = end = 0.0

    def issue(kernels: list[float]) -> None:
        nonlocal wait, host, end
        for each in kernels:
            host += issue_s
            if host > end:
                wait += host - end
                end = host
            end += each

    one = forward + backward[::-1]
    issue(one)
    if micro_batches > 1:
        # The other micro-batches in closed form, not one simulation each (issue 34): a kernel maps the
        # device's lead over the host, d = end - host, to max(d + each - issue_s, each), so a micro-batch
        # maps it to max(d + a, b) and j of them to max(d + j a, b + (j - 1) max(a, 0)); the wait is the
        # end's growth less the kernels' and the host's.
        a, b = 0.0, -math.inf
        for each in one:
            a, b = a + each - issue_s, max(b + each - issue_s, each)
        j = micro_batches - 1
        lead = end - host
        after = max(lead + j * a, b + (j - 1) * max(a, 0.0))
        wait += after - lead - j * a
        host += j * len(one) * issue_s
        end = host + after
    issue(once)
    return wait


def _view_outputs(ctx: LoweringContext) -> set[str]:
    """Outputs of the strided views a fused attention kernel reads in place (`strided_views`): no memory of their own."""
    views = strided_views(ctx)
    return {v for n in ctx.graph.nodes if n.name in views for v in n.outputs if v}


def _on_chip(ctx: LoweringContext) -> set[str]:
    """Values that never reach HBM: a fused attention core's S x S scores and probabilities (they
    live in the kernel's registers and shared memory, FlashAttention's point)."""
    cores = {n.name: n.meta[FUSED_ATTENTION] for n in ctx.graph.nodes if FUSED_ATTENTION in n.meta}
    return core_internal(ctx.graph, cores) if cores else set()


def _storage_root(ctx: LoweringContext, name: str, producer: Mapping[str, Node], cores: set[str]) -> str:
    """The value whose memory ``name`` is a view of: up the chain of layout ops (transpose,
    reshape, ...) that make it, and through a GQA ``Expand`` of K or V that only a fused attention
    core reads (FlashAttention takes K and V with fewer heads than Q and saves them as passed:
    flash-attn's ``flash_attn_func``, "MQA/GQA"; ``torch.expand`` is itself a stride-0 view)."""
    seen: set[str] = set()
    while name in producer and name not in seen:
        seen.add(name)
        node = producer[name]
        readers = ctx.graph.consumers.get(name, [])
        gqa = node.op_type == "Expand" and cores and all(_reaches_core(ctx, r, cores) for r in readers)
        if not (_layout(node) or gqa) or not node.inputs or not node.inputs[0]:
            break
        name = node.inputs[0]
    return name


def _reaches_core(ctx: LoweringContext, node: Node, cores: set[str]) -> bool:
    """Whether ``node`` is a fused attention core or a chain of layout ops that only feeds cores."""
    for _ in range(8):  # head split chains are a few ops long
        if node.name in cores:
            return True
        if not _layout(node):
            return False
        readers = [c for v in node.outputs if v for c in ctx.graph.consumers.get(v, [])]
        if len(readers) != 1:
            return bool(readers) and all(_reaches_core(ctx, r, cores) for r in readers)
        node = readers[0]
    return False


def saved_activation_bytes(ctx: LoweringContext) -> tuple[int, frozenset[str]]:
    """Bytes the backward pass keeps (what autograd saves, ``passes.training``'s per-node
    `meta.SAVED`), each memory counted once, and the names of the values that hold it.

    Autograd saves tensors, not names: a value that is a view of another saved value (the
    attention output O and its merged-heads reshape that the output projection saves; Q, K, V
    as strided views of their projections) shares its memory, and a fused core saves GQA's K
    and V before the head broadcast, at ``kv_heads``. So each saved value is charged as the
    value at the root of its view chain (`_storage_root`), once; per-row statistics (the
    norms' mean and 1/σ, the fused softmax's log-sum-exp) are counted as recorded.

    Under ``--recompute full`` a block keeps only its input and recomputes the rest in its
    backward: what is held is every block's input (the values that cross a block boundary), the
    saved sets of the nodes outside the blocks (embedding, final norm, LM head, loss), and during
    one block's backward that block's own set beside them (the largest block's)."""
    nodes = ctx.graph.nodes
    producer = {v: n for n in nodes for v in n.outputs if v}
    cores = {n.name for n in nodes if FUSED_ATTENTION in n.meta}
    record = meta.training_state(ctx.graph)
    if record is None or record.recompute_mode != "full":
        roots = _saved_roots(ctx, nodes, producer, cores)
        return sum(roots.values()), frozenset(roots)
    by_layer: dict[int | None, list[Node]] = {}
    for node in nodes:
        by_layer.setdefault(node.layer, []).append(node)
    held = _saved_roots(ctx, by_layer.pop(None, []), producer, cores)
    for node in nodes:
        for out in node.outputs:
            if out and any(reader.layer != node.layer for reader in ctx.graph.consumers.get(out, [])):
                root = _storage_root(ctx, out, producer, cores)
                held[root] = max(held.get(root, 0), ctx.value_bytes(root))
    block = max(
        (
            sum(b for r, b in _saved_roots(ctx, layer, producer, cores).items() if r not in held)
            for layer in by_layer.values()
        ),
        default=0,
    )
    return sum(held.values()) + block, frozenset(held)


def _saved_roots(
    ctx: LoweringContext, nodes: Sequence[Node], producer: Mapping[str, Node], cores: set[str]
) -> dict[str, int]:
    """The saved memories of ``nodes`` (`saved_activation_bytes`): bytes by the value at the root of
    each saved value's view chain; a per-row statistic keeps its own ``name#stat`` key."""
    roots: dict[str, int] = {}
    for node in nodes:
        for name, nbytes in (node.meta.get(SAVED) or {}).items():
            if "#" in name:
                roots[name] = roots.get(name, 0) + nbytes
                continue
            root = _storage_root(ctx, name, producer, cores)
            size = ctx.value_bytes(root) if root != name else nbytes
            roots[root] = max(roots.get(root, 0), size if size > 0 else nbytes)
    return roots


def device_memory(
    ctx: LoweringContext, *, micro_batches: int = 1, offload: bool = False, zero: int = 0, shards: int = 1
) -> dict[str, int]:
    """Bytes one device holds, by kind: ``weights``, ``gradients``, ``optimizer`` (fp32 master
    weights and Adam moments), ``activations`` (saved for backward, one micro-batch, each memory
    once: `saved_activation_bytes`), ``live`` (one micro-batch's working set beyond the saved
    tensors: in inference the forward's peak of live tensors; in training the peak of the live
    tensors that are not saved, since the saved ones are already held) and ``host`` (optimizer
    state offloaded to CPU memory). ``zero``: the ZeRO stage over ``shards`` data-parallel
    devices (Rajbhandari et al., SC'20: 1 shards the optimizer state, 2 also gradients, 3 also
    the weights, as FSDP does: each block's are gathered whole while it runs, so the largest block's
    beyond its shard are held too, `gathered_weight_bytes`)."""
    m = max(1, micro_batches)
    state = training_state(ctx)
    saved, held = saved_activation_bytes(ctx) if state.activations else (0, frozenset())

    def shard(nbytes: int, stage: int) -> int:
        return math.ceil(nbytes / shards) if zero >= stage and shards > 1 else nbytes

    optimizer = shard(state.optimizer_side, 1)
    return {
        "weights": shard(ctx.total_weight_bytes, 3) + (gathered_weight_bytes(ctx, shards) if zero >= 3 else 0),
        "gradients": shard(state.gradients, 2),
        "optimizer": 0 if offload else optimizer,
        "activations": math.ceil(saved / m),
        "kv_cache": cache_bytes(ctx, ctx.graph.nodes),
        "live": live_bytes(ctx, ctx.graph.nodes, live_skip(ctx, held), micro_batches=m),
        "host": optimizer if offload else 0,
    }


def gathered_weight_bytes(ctx: LoweringContext, shards: int) -> int:
    """What ZeRO-3 (FSDP) holds beyond a device's shard of the weights: a block's weights are
    all-gathered whole before it runs (forward and backward), so while the largest one runs the
    device holds it whole, its own 1/``shards`` of it already counted (FSDP's unit, a decoder block;
    the embedding and head outside the blocks one more). LLaMA-7B over 8 GPUs: 459 MB (its
    embedding and head's unit) beside the 1.68 GB of shards, which had been counted alone."""
    if shards <= 1:
        return 0
    weights = {v.name: ctx.value_bytes(v.name) for v in ctx.graph.weights()}
    units: dict[int | None, set[str]] = {}
    for node in ctx.graph.nodes:
        if not is_optimizer_step(node):
            units.setdefault(node.layer, set()).update(v for v in node.inputs if v in weights)
    largest = max((sum(weights[v] for v in unit) for unit in units.values()), default=0)
    return largest - math.ceil(largest / shards)


def live_skip(ctx: LoweringContext, held: frozenset[str] | None = None) -> frozenset[str]:
    """The values a step's working set never holds in memory beyond what `device_memory` counts
    apart: a fused core's on-chip scores, strided views, a decode step's KV caches (`cache_bytes`),
    and in training the saved tensors (``held``, `saved_activation_bytes`'s names, worked out here
    when the caller does not have them)."""
    if held is None:
        held = saved_activation_bytes(ctx)[1] if training_state(ctx).activations else frozenset()
    return frozenset(_on_chip(ctx) | held | _view_outputs(ctx) | cache_inputs(ctx))


def live_bytes(ctx: LoweringContext, nodes: Sequence[Node], skip: frozenset[str], *, micro_batches: int = 1) -> int:
    """One micro-batch's working set while ``nodes`` run in order: the peak of live tensors that reach
    memory, ``skip`` (`live_skip`) left out. ``nodes``: the whole graph, or a pipeline stage's share
    of it (`dabench_ir.scaling`)."""
    return math.ceil(peak_live_bytes(ctx, nodes, skip=skip) / max(1, micro_batches))


def stream_plan(
    ctx: LoweringContext,
    target: Target,
    options: LoweringOptions,
    unit: Unit,
    *,
    fuse: bool,
    times: Mapping[str, float] | None = None,
    groups: list[list[Node]] | None = None,
    feed_of: Mapping[str, MemoryLevel] | None = None,
    offload: Offload | None = None,
) -> Plan:
    """Kernels in order on one ``unit``: roofline time plus launch overhead per kernel, or
    ``times`` (seconds per node) where a finer model has them; ``groups`` replaces the kernel
    grouping (default `kernel_groups`); ``feed_of`` names the memory level that feeds a node
    where it is not the target's feed memory (the host CPU's cache); ``offload``: the optimizer
    runs on the host (`offload_plan`); fits when the weights and the peak of live activations fit
    the feed memory."""
    times = times or {}
    hosted = offload.node if offload is not None else None  # the node the host's CPU runs, no kernel
    m = max(1, int(getattr(options, "micro_batches", None) or 1))
    target.peak_flops(ctx.precision)  # an unsupported precision fails here, naming the ones the target has
    mem = target.feed_memory
    # a streaming kernel sustains only part of the datasheet bandwidth (DRAM refresh, row switches,
    # read/write turnarounds): measured copy and STREAM rates, ``arch.memory_efficiency``
    bw = mem.bandwidth_bytes_per_s * target.arch_value("memory_efficiency", 1.0)
    rereads, load_rate = _decode_rereads(ctx, target, options)

    def memory(node: Node, runs: int) -> float:
        if node.name == hosted:  # CPU Adam streams its state through the host's DRAM
            return ctx.costs[node.name].bytes / offload.host_bandwidth
        return _memory_s(ctx.costs[node.name], runs, bw, rereads.get(node.name, 0), load_rate)

    ridge = target.ridge_point(ctx.precision, mem)
    # a CPU calibration may call its fixed per-op cost per_op_s
    launch = target.overhead("kernel_launch_s", target.overhead("per_op_s"))
    n_units = target.num_units
    grain = target.arch_value("min_grain_flops", 0.0)
    # a fused attention kernel reaches a published share of peak (FlashAttention-2 on this GPU);
    # a GEMM at best the maximum achievable matmul FLOP/s measured on the chip
    fused_eff = target.arch.get("fused_attention_efficiency")
    matmul_eff = target.arch_value("matmul_efficiency", 1.0)
    compute = _compute_times(ctx, target, matmul_eff, fused_eff.value if fused_eff is not None else None, m)
    if hosted is not None:  # bound by the host's DRAM, by far (`offload_plan`): no GPU compute
        compute[hosted] = (0.0, "host")
    plan = ctx.plan(target, options, Schedule.CONCURRENT, units=[unit])
    views = strided_views(ctx)  # read in place by a fused attention kernel: no copy, no launch
    launches = _launches(ctx, groups if groups is not None else kernel_groups(ctx, fuse), views, m, hosted)
    for g in launches:
        if g.issued and not g.views_only:
            g.device_s = _group_device_s(ctx, g.nodes, compute, memory, m, views) + g.runs * g.kernels * launch
    weighted_alloc = total_t = 0.0
    traffic = 0
    for g in launches:
        launched = False
        for node in g.nodes:
            cost = ctx.costs[node.name]
            unit.nodes.append(node.name)
            view = node.name in views
            kernel = ctx.is_work(node) and not view and node.name != hosted
            overhead = g.runs * g.kernels * launch if kernel and not launched else 0.0
            launched = launched or kernel
            alloc = _unit_share(cost.flops, grain, n_units) if kernel else 0.0
            compute_s, binds = compute[node.name]
            fed = offload.host if node.name == hosted else (feed_of or {}).get(node.name, mem)
            # what it moves from its memory over the step: its weights read again each further micro-batch
            moved = 0 if view else cost.bytes + (g.runs - 1) * cost.weight_bytes
            plan.node_plans[node.name] = np_ = place_node(
                ctx,
                node,
                unit=unit.id,
                compute_s=compute_s,
                memory_s=0.0 if view else memory(node, g.runs),
                overhead_s=overhead,
                feed_level=fed.level,
                feed_bytes=moved,
                ridge=ridge,
                feed_bandwidth=bw if fed is mem else fed.bandwidth_bytes_per_s,
                allocation=alloc,
                time_s=times.get(node.name),
            )
            reloads = node.name in rereads and np_.memory_s > _memory_s(cost, g.runs, bw)
            np_.note = _kernel_note(np_, binds, view=view, hosted=node.name == hosted, reloads=reloads)
            weighted_alloc += alloc * np_.per_micro_batch_s
            total_t += np_.per_micro_batch_s
            traffic += 0 if node.name == hosted else moved
    unit.allocation = weighted_alloc / total_t if total_t > 0 else 0.0
    issue = target.overhead("host_issue_s")
    wait = _host_wait(launches, issue, m) if issue > 0 else 0.0
    if wait > 0:  # the stream idles, its next kernel not yet issued: a step cost no node owns
        plan.step_overheads_s[HOST_ISSUE] = wait
    unit.resources = {target.unit_name.lower() + "s": float(n_units)}
    plan.traffic_bytes[mem.name] = traffic
    if offload is not None:
        plan.traffic_bytes[offload.host.name] = ctx.costs[offload.node].bytes
        plan.step_overheads_s.update(offload.transfers(ctx, plan, m))
    _fit_device_memory(ctx, target, plan, m, offload)
    return plan


def _unit_share(flops: float, grain: float, units: int) -> float:
    """The share of the ``units`` SMs (cores) a kernel of ``flops`` keeps busy: one per ``grain`` of its
    work, every one without a stated grain (the host CPU's intra-op threads), one for a kernel of no FLOPs."""
    if grain <= 0:
        return 1.0
    if flops > 0:
        return min(1.0, math.ceil(flops / grain) / units)
    return 1.0 / units


def _kernel_note(np_: NodePlan, binds: str, *, view: bool, hosted: bool, reloads: bool) -> str | None:
    """Why a node's time is what it is, where the roofline alone would not say: a strided view read in
    place, the optimizer on the host's CPU, a decode attention loading its K/V cache once per query head,
    or the op class a compute-bound node is bound on."""
    if view:
        return "a strided view the fused attention kernel reads or writes in place: no copy"
    if hosted:
        return "the host's CPU runs it (--optimizer-state offchip): its state streams through host DRAM"
    if reloads:
        return "load-bound: the decode attention kernel loads the K/V cache once per query head"
    if np_.bound is Bound.COMPUTE and binds in _CLASS_WORDS and not np_.note:
        return f"compute-bound on {_CLASS_WORDS[binds]}"
    return np_.note


@dataclass(slots=True)
class KernelGroup:
    """One kernel group of the stream as it is launched: its nodes, the kernels one run launches (its
    backward kernels too in training), its runs a step (1: the optimizer, once per step), whether the
    host issues it (it works or views), whether it is strided views alone (dispatched, nothing runs),
    and its device seconds over the step, launches included (`stream_plan` fills them)."""

    nodes: list[Node]
    kernels: int
    runs: int
    issued: bool
    views_only: bool = False
    device_s: float = 0.0


def _launches(
    ctx: LoweringContext, groups: Iterable[list[Node]], views: set[str], m: int, hosted: str | None = None
) -> list[KernelGroup]:
    """The kernel groups as the stream launches them (`KernelGroup`); ``hosted``: the node the host's
    CPU runs (`offload_plan`), which launches nothing."""
    cores: set[object] = set()
    out = []
    for group in groups:
        kernels = 1 + _backward_kernels(ctx, group, cores)  # in training its backward kernels launch too
        work = [n for n in group if ctx.is_work(n) and n.name not in views and n.name != hosted]
        viewed = [n for n in group if n.name in views]
        views_only = bool(viewed) and not work
        if views_only:  # the framework still dispatches the view (and its autograd backward)
            kernels = 1 + int(any(BACKWARD_COST in n.meta for n in viewed))
        runs = 1 if any(is_optimizer_step(n) for n in group) else m  # the optimizer runs once per step
        out.append(
            KernelGroup(nodes=group, kernels=kernels, runs=runs, issued=bool(work or viewed), views_only=views_only)
        )
    return out


XQA_MIN_BLOCK_FACTOR = 4
"""TensorRT-LLM's choice between its two decode attention kernels where XQA is built in (trtllm-build's
``--enable_xqa`` default, tensorrt_llm/plugin/plugin.py ``PluginConfig.enable_xqa = True`` from 2024;
docs/source/advanced/gpt-attention.md, "XQA Optimization": "This is default enabled ... a heuristic
algorithm is also used to decide whether to use XQA kernel or masked MHA kernel"). The heuristic,
``DecoderXQAImpl::mayHavePerfGain`` (cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/): XQA
when the step's thread blocks, one per (sequence, K/V head) without multi-block mode, times
``kEnableMinBlockFactor`` = 4 reach the GPU's SMs; else the masked MHA kernel, a block per query head."""


def xqa_takes(ctx: LoweringContext, name: str, target: Target, micro_batches: int = 1) -> bool:
    """Whether TensorRT-LLM's heuristic (`XQA_MIN_BLOCK_FACTOR`) runs decode attention node ``name`` as
    XQA on ``target``: its thread blocks are the (sequence, K/V head) pairs of the cache it reads
    (`cache_inputs`), on this chip (the cache's leading dims: a tensor-parallel share holds its own
    K/V heads), of one launch (a micro-batch's sequences), against the target's SMs (``units``)."""
    caches = cache_inputs(ctx)
    cache = next(v for v in ctx.graph.node(name).inputs[:2] if v in caches)
    *pairs, _, _ = ctx.graph.values[cache].type.shape
    if not all(isinstance(d, int) for d in pairs):
        return False
    blocks = math.prod(pairs) // max(1, micro_batches)
    return blocks * XQA_MIN_BLOCK_FACTOR >= target.num_units


def _decode_rereads(ctx: LoweringContext, target: Target, options: LoweringOptions) -> tuple[dict[str, int], float]:
    """The decode attention nodes that load a GQA cache once per query head, with their rereads
    (`cache_rereads`), and the rate such a kernel loads at (``arch.decode_attention_load_bytes_per_s``):
    none for ``--decode-attention per-kv-head`` (a block per K/V head loads it once; refused without
    such attention), none for the nodes TensorRT-LLM's heuristic runs as XQA under ``xqa-auto``
    (`xqa_takes`), or none on a target without the figure (the cache is read from HBM once)."""
    load_rate = target.arch_value(DECODE_ATTENTION_LOAD, 0.0)
    rereads = cache_rereads(ctx)
    kernel = getattr(options, "decode_attention", None)
    if kernel in ("per-kv-head", "xqa-auto") and not rereads:  # a kernel choice with nothing to choose for
        raise UserError(
            f"--decode-attention {kernel}: the graph has no decode attention over a grouped-query KV "
            "cache (a decode step of a model with fewer K/V heads than query heads: dabench-ir export "
            "--phase decode); drop it"
        )
    if kernel == "per-kv-head":
        rereads = {}
    elif kernel == "xqa-auto":
        m = int(getattr(options, "micro_batches", None) or 1)
        rereads = {name: extra for name, extra in rereads.items() if not xqa_takes(ctx, name, target, m)}
    if load_rate <= 0:
        rereads = {}
    return rereads, load_rate


@dataclass(frozen=True, slots=True)
class Offload:
    """The optimizer on the host, as ZeRO-Offload runs it (Ren et al., USENIX ATC 2021, sec. 4: the
    fp32 master weights and Adam moments live in host memory, the CPU updates them, gradients go
    down to the host and the updated 16-bit weights come back over PCIe each step).

    ``node``: the Adam node, which the host's CPU runs. Its state (what the node reads and writes:
    fp32 weights, moments, gradient, the 16-bit copy) streams through ``host``, the host's DRAM,
    whose bandwidth and capacity the ``sharers`` GPUs of the node that offload at once share
    (`host_bandwidth`, `host_shortfall`; one GPU alone has all of it). DeepSpeed's vectorised CPU
    Adam (DeepSpeedCPUAdam) is bound there, by far: a DGX H100's 112 cores' AVX-512 FMAs at their
    2.0 GHz base clock (about 14 TFLOP/s) spend under 2 % of that time on Adam's 14 FLOPs a
    parameter against its 28 bytes at 563 GB/s, for any share of both. ``pcie``: one direction of
    the GPU's own host link.
    """

    node: str
    host: MemoryLevel
    pcie: Link
    sharers: int = 1

    @property
    def host_bandwidth(self) -> float:
        """This GPU's share of the host's DRAM bandwidth, bytes/s."""
        return self.host.bandwidth_bytes_per_s / self.sharers

    def transfers(self, ctx: LoweringContext, plan: Plan, micro_batches: int) -> dict[str, float]:
        """The step rows of the copies over PCIe, bandwidth-bound.

        Gradients: DeepSpeed's ZeRO-2 offload copies each micro-batch's 16-bit gradients to pinned
        host buffers as its backward pass produces them, asynchronously
        (deepspeed/runtime/zero/stage_1_and_2.py, ``async_accumulate_grad_in_cpu_via_gpu``,
        ``overlap_comm``): what the backward does not hide, ``OFFLOAD_GRADIENTS``, its seconds
        estimated from each node's share of backward work (`_backward_s`). Weights: the updated
        16-bit weights come back after the CPU's update and the next forward waits for them,
        ``OFFLOAD_WEIGHTS``, all of it. Both are of the parameters this GPU's optimizer updates
        (`updated_share`): under ZeRO each GPU offloads its own partition.
        """
        rate = self.pcie.bandwidth_bytes_per_s
        share = self.updated_share(ctx)
        gradients_s = share * training_state(ctx).gradients / rate
        backward_s = _backward_s(ctx, plan, exclude=self.node) / micro_batches  # one micro-batch's
        exposed = micro_batches * max(0.0, gradients_s - backward_s)
        rows = {OFFLOAD_WEIGHTS: share * ctx.total_weight_bytes / rate}
        if exposed > 0:
            rows[OFFLOAD_GRADIENTS] = exposed
        return rows

    def updated_share(self, ctx: LoweringContext) -> float:
        """The share of the model's parameters this GPU's optimizer updates: 1, or its partition
        under ZeRO (`dabench_ir.scaling.shard_optimizer_step` scales the Adam node's cost)."""
        record = meta.training_state(ctx.graph)
        if record is None or not record.params:
            return 1.0
        return ctx.costs[self.node].vector_flops / (ADAM_FLOPS_PER_PARAM[0] * record.params)


def host_shortfall(target: Target, held: int, sharers: int, whose: str = "the") -> Failure | None:
    """Why ``held`` bytes of offloaded optimizer state do not fit one GPU's share of its host's memory
    (an equal share among the ``sharers`` GPUs that offload at once, `Offload`), or None where they
    fit: the one check of the lowering, a data-parallel point and each pipeline stage. ``whose``: the
    state's owner in the reason (``the``, ``stage 0's``)."""
    capacity = target.memory("host").capacity_bytes / max(1, sharers)
    if held <= capacity:
        return None
    return Failure(
        f"{whose} offloaded optimizer state needs {held / 1e9:.2f} GB of host memory, "
        f"{target.name}'s GPU has {capacity / 1e9:.2f} GB of it ({sharers} GPU(s) sharing its host)",
        int(held),
        int(capacity),
    )


def offload_plan(ctx: LoweringContext, target: Target, options: LoweringOptions) -> Offload | None:
    """The host's part of a training step whose optimizer state is offloaded (``--optimizer-state
    offchip``: `Offload`), or None: not asked, or no optimizer step in the graph (inference)."""
    if not LOWERING.offloads_optimizer(options):
        return None
    node = next((n.name for n in ctx.graph.nodes if is_optimizer_step(n)), None)
    if node is None:
        return None
    pcie = target.link("pcie")
    if not target.has_memory("host") or pcie is None:
        raise UserError(
            f"--optimizer-state offchip: target {target.name} has no host memory ([[memory]] with level = "
            '"host") or no host link ([[link]] named "pcie") to offload to; add them to its target file, '
            "or keep the optimizer state on the device"
        )
    return Offload(node=node, host=target.memory("host"), pcie=pcie, sharers=max(1, options.host_sharers))


def _backward_s(ctx: LoweringContext, plan: Plan, *, exclude: str) -> float:
    """Seconds of the step's backward passes on the stream (the stream's node plans are over the whole
    step): each node's time times the share of its work that is backward (its backward FLOPs over all
    of them; bytes where it has no FLOPs), an estimate since a node's time is planned for its forward
    and backward together."""
    total = 0.0
    for name, node_plan in plan.node_plans.items():
        backward = ctx.graph.node(name).meta.get(BACKWARD_COST)
        if backward is None or name == exclude:
            continue
        cost = ctx.costs[name]
        share = backward.flops / cost.flops if cost.flops else backward.bytes / cost.bytes if cost.bytes else 0.0
        total += node_plan.per_micro_batch_s * share
    return total


def _fit_device_memory(ctx: LoweringContext, target: Target, plan: Plan, m: int, offload: Offload | None) -> None:
    """What the device holds (`device_memory`: weights, training state, live activations; the
    optimizer state on the host under ``offload``), and the failure when it exceeds the feed
    memory, or the offloaded state the GPU's share of the host's."""
    mem = target.feed_memory
    parts = device_memory(ctx, micro_batches=m, offload=offload is not None)
    resident = sum(v for k, v in parts.items() if k != "host")
    plan.memory_bytes[mem.name] = resident
    if offload is not None:
        plan.memory_bytes["host"] = parts["host"]
        short = host_shortfall(target, parts["host"], offload.sharers)
        if short is not None:
            plan.fail(short.reason, short.needed_bytes, short.capacity_bytes)
    state = training_state(ctx)
    if resident > mem.capacity_bytes:
        plan.fail(
            f"weights{', training state' if state.total else ''} and live activations need "
            f"{resident / 1e9:.2f} GB of {mem.name}, "
            f"{target.name} has {mem.capacity_bytes / 1e9:.2f} GB",
            resident,
            mem.capacity_bytes,
        )
