"""DDR as the RDU spends it: the sections' traffic, what the forward saves for the backward, the
training footprint, and the fit of a plan's memory against the target's capacities."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.lowering.context import LoweringContext, training_state
from dabench_ir.lowering.rdu.sections import forward_cores, phase_cost
from dabench_ir.passes import meta
from dabench_ir.passes.training import SAVED, is_optimizer_step

if TYPE_CHECKING:
    from dabench_ir.ir import DType, Graph
    from dabench_ir.lowering.rdu.chip import Chip
    from dabench_ir.lowering.rdu.sections import Section, SectionLayout
    from dabench_ir.plan import Plan
    from dabench_ir.targets import MemoryLevel, Target

__all__ = [
    "Feed",
    "SavedState",
    "SectionTraffic",
    "ddr_assumption",
    "ddr_footprint",
    "fit",
    "recomputed_values",
    "saved_for_backward",
    "saved_state",
    "section_ddr",
]


@dataclass(frozen=True, slots=True)
class Feed:
    """The memories a section streams through: DDR (its feed level) and the PMUs' on-chip SRAM.

    ``ridge``: the roofline ridge point at the plan's precision against DDR; ``sram_bandwidth``:
    the on-chip memory's bandwidth (DDR's when the target names no on-chip memory).
    """

    ddr: MemoryLevel
    ridge: float
    sram_bandwidth: float

    @property
    def bandwidth(self) -> float:
        """DDR's streaming bandwidth (bytes/s): what a section's traffic crosses at."""
        return self.ddr.bandwidth_bytes_per_s

    @classmethod
    def of(cls, target: Target, precision: DType, level: str) -> Feed:
        """The feed of ``target`` at memory ``level`` (the lowering's `feed_level`)."""
        ddr = target.memory(level)
        bw = ddr.bandwidth_bytes_per_s
        ridge = target.ridge_point(precision, ddr)
        sram_bw = target.memory("on-chip").bandwidth_bytes_per_s if target.has_memory("on-chip") else bw
        return cls(ddr, ridge, sram_bw)


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


def recomputed_values(graph: Graph, cores: dict[str, int]) -> set[str]:
    """Values inside an attention core (``cores``: node -> core id), which only the core reads:
    they never leave the chip, and the backward recomputes them (`passes.training.core_internal`)."""
    from dabench_ir.passes.training import core_internal

    return core_internal(graph, cores)


@dataclass(frozen=True, slots=True)
class SavedState:
    """What the forward keeps for the backward: ``recomputed`` (`recomputed_values`, kept on chip)
    and ``saved`` (`saved_for_backward`, kept in DDR)."""

    recomputed: set[str]
    saved: dict[str, dict[str, int]]

    @classmethod
    def of(cls, graph: Graph, cores: dict[str, int]) -> SavedState:
        """The saved state of ``graph`` whose attention cores are ``cores``."""
        recomputed = recomputed_values(graph, cores)
        return cls(recomputed, saved_for_backward(graph, recomputed))


def saved_state(ctx: LoweringContext, fused: bool) -> SavedState:
    """What the forward keeps for the backward (`SavedState`), a fact of the context
    (`LoweringContext.fact`): with the attention cores ``fused`` (`forward_cores`, the layout's
    cores) their internals stay on chip; without, every saved tensor goes to DDR."""
    return SavedState.of(ctx.graph, ctx.fact(forward_cores) if fused else {})


@dataclass(frozen=True, slots=True)
class SectionTraffic:
    """One section's DDR bytes (``total``) and each working node's share (``per_node``), of which
    ``repeated`` per node are what each further pass over the section moves again: the weights it
    streams in, and in the backward the gradient sum it accumulates."""

    total: int
    per_node: dict[str, int]
    repeated: dict[str, int]

    def passes(self, count: int) -> SectionTraffic:
        """The traffic of ``count`` passes over the section that share out one pass's activations:
        gradient accumulation runs the section once per micro-batch, moving its ``repeated`` bytes each
        time, while the micro-batches together move the batch's activations once."""
        if count == 1:
            return self
        extra = {n: (count - 1) * b for n, b in self.repeated.items()}
        per_node = {n: b + extra.get(n, 0) for n, b in self.per_node.items()}
        return SectionTraffic(self.total + sum(extra.values()), per_node, self.repeated)


def section_ddr(
    ctx: LoweringContext,
    sec: Section,
    section_of: dict[str, dict[str, int]],
    i: int,
    recomputed: set[str],
    saved: dict[str, dict[str, int]],
) -> SectionTraffic:
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
    repeated: dict[str, int] = {}
    seen: set[str] = set()
    for node in sec.nodes:
        if not ctx.is_work(node):
            continue
        cost = phase_cost(node, sec.phase, ctx.costs[node.name])
        if sec.phase == "optimizer":
            per_node[node.name] = cost.bytes
            continue
        nbytes = cost.weight_bytes
        # each further micro-batch reads the weights again; its backward (read W, write dW: 2 W) also
        # reads back the gradient sum the micro-batches before it wrote, to add to it: 3 W
        repeated[node.name] = nbytes if forward else nbytes * 3 // 2
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
                leaves = v in outputs or any(home.get(c.name) != i for c in readers)  # or read by another section
                kept = saved.get(v)
                if leaves:
                    beside = sum(b for key, b in kept.items() if key != v) if kept else 0  # statistics beside it
                    nbytes += size + beside
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
    return SectionTraffic(sum(per_node.values()), per_node, repeated)


def ddr_assumption(ctx: LoweringContext, micro_batches: int, recomputed: bool, accumulated: bool = False) -> str:
    """The memory assumption of a training plan's DDR figure, for its notes and any does-not-fit
    reason: what it holds, and how this run batches, recomputes and treats attention."""
    record = meta.training_state(ctx.graph)
    recompute = getattr(record, "recompute_mode", "none")
    if accumulated:
        batching = (
            f"the batch of {ctx.batch} runs as {micro_batches} accumulated micro-batches of "
            f"{ctx.batch // micro_batches}: each runs forward and backward over every section before the next, so "
            "one micro-batch's saved tensors are held, the gradients summed in place (one weight update per step)"
        )
    else:
        batching = (
            f"the batch of {ctx.batch} streams through each section in {micro_batches} piece(s) and its saved "
            "tensors are all kept (one weight update per step, no gradient accumulation)"
        )
    attention = (
        "the attention scores stay on chip and are recomputed in backward (fused core)"
        if recomputed
        else "no attention core fused on chip: its scores are saved like any tensor"
    )
    return (
        "DDR as SambaFlow spends it in training: weights, gradients, fp32 master weights and Adam moments, "
        "each operator's saved inputs as autograd keeps them "
        f"(recompute {recompute}), {batching}; {attention}; and the largest section's boundary tensors in flight"
    )


def ddr_footprint(
    ctx: LoweringContext,
    sections: list[Section],
    section_bytes: list[int],
    saved: dict[str, dict[str, int]],
    passes: int = 1,
) -> dict[str, int]:
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
    ``section_bytes``: each section's DDR bytes in one pass over the batch (`section_ddr`).
    ``passes``: the micro-batches a gradient-accumulating step runs one after another, each
    forward and backward whole; what is saved and in flight is one micro-batch's.
    """
    state = training_state(ctx)
    transient = 0
    for i, sec in enumerate(sections):
        if sec.phase == "optimizer":
            continue
        weights = sum(phase_cost(n, sec.phase, ctx.costs[n.name]).weight_bytes for n in sec.nodes if ctx.is_work(n))
        transient = max(transient, section_bytes[i] - weights)
    return {
        "weights": ctx.total_weight_bytes,
        "gradients": state.gradients,
        "master_weights": state.master_weights,
        "optimizer": state.optimizer,
        "saved_activations": sum(b for kept in saved.values() for b in kept.values()) // passes,
        "transient": transient // passes,
    }


def fit(
    ctx: LoweringContext,
    plan: Plan,
    target: Target,
    chip: Chip,
    layout: SectionLayout,
    state: SavedState,
    section_bytes: list[int],
    feed: Feed,
    micro_batches: int,
    accumulated: bool = False,
) -> None:
    """Fit the plan's memory against the target's: what DDR holds (a training step's footprint,
    `ddr_footprint`, else the resident weights and activations), the largest section's PMU SRAM,
    and a failure when DDR is too small. ``section_bytes``: each section's DDR bytes in one pass,
    in order; ``accumulated``: the step accumulates gradients over its ``micro_batches``."""
    training = meta.graph_mode(ctx.graph) == "train"
    ddr = feed.ddr
    passes = micro_batches if accumulated else 1
    footprint = ddr_footprint(ctx, layout.sections, section_bytes, state.saved, passes) if training else None
    resident = sum(footprint.values()) if footprint is not None else ctx.resident_bytes()
    plan.memory_bytes[ddr.name] = resident
    if footprint is not None:
        plan.extra["ddr_bytes_by_kind"] = dict(footprint)
        plan.notes.append(ddr_assumption(ctx, micro_batches, bool(state.recomputed), accumulated))
    if target.has_memory("on-chip"):
        sram = target.memory("on-chip")
        pmu_bytes = sram.capacity_bytes / (chip.tiles_per_rdu * chip.pmus / chip.tiles)
        plan.memory_bytes[sram.name] = int(max((u.resources["pmus"] for u in plan.units), default=0) * pmu_bytes)
    if resident > ddr.capacity_bytes:
        held = (
            f" ({ddr_assumption(ctx, micro_batches, bool(state.recomputed), accumulated)})"
            if footprint is not None
            else ""
        )
        plan.fail(
            f"weights and activations need {resident / 1e9:.1f} GB of DDR, the RDU has {ddr.capacity_bytes / 1e9:.1f} GB"
            + held,
            resident,
            ddr.capacity_bytes,
        )
