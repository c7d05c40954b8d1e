"""The layout of a graph over IPUs: sections, layers per IPU, and the pipeline stages.

The graph splits into the nodes before the decoder layers (the embedding), the nodes of each
layer, those after (final norm, head, loss) and the optimizer step (`sections`). The layers go
over the IPUs as ``--layers-per-ipu`` says or evenly over ``--ipus`` (`layout`), and each IPU's
share becomes a pipeline stage, with the head back on IPU 0 where its weight is tied to the
embedding (`pipeline_stages`). `form_stages` is the lowering's step that does all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from dabench_ir.errors import UserError
from dabench_ir.lowering.context import stored_values
from dabench_ir.passes.training import is_optimizer_step

if TYPE_CHECKING:
    from dabench_ir.ir import Node
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.ipu import IpuOptions
    from dabench_ir.plan import Plan

__all__ = [
    "Layout",
    "Pipeline",
    "Sections",
    "Stage",
    "check_accumulation",
    "form_stages",
    "layout",
    "pipeline_stages",
    "sections",
]


@dataclass(slots=True)
class Stage:
    """One pipeline stage: the IPU it runs on, its nodes, its decoder layers (by index) and its
    nodes outside them (the embedding before them, the head and loss after)."""

    ipu: int
    nodes: list[Node] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    others: list[Node] = field(default_factory=list)


class Sections(NamedTuple):
    """The graph's nodes by where they sit in the pipeline."""

    pre: list[Node]  # before the first decoder layer (the embedding)
    layers: dict[int, list[Node]]  # each decoder layer's nodes, by layer index in order
    post: list[Node]  # after the last layer (final norm, head, loss)
    optimizer: list[Node]  # the optimizer step, in no stage
    tied: bool  # the head reads the embedding's table
    table_layers: float  # the embedding's weights in decoder layers' worth (`layout`'s ``embed_layers``)
    layer_roots: dict[int, dict[str, int]]  # each decoder layer's stored values (`stored_values`)


class Layout(NamedTuple):
    """Decoder layers on each IPU, and whether the head returns to IPU 0 as a stage of its own."""

    counts: list[int]
    head_home: bool


@dataclass(slots=True)
class Pipeline:
    """The stages a plan runs, the layout they come from, and the IPUs they use."""

    sections: Sections
    counts: list[int]  # decoder layers on each IPU
    stages: list[Stage]
    ipus: int  # IPUs the stages use
    note: str  # a line for the plan's notes ("" when none)

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def training_stages(self) -> int:
        """The pipeline stages of a training step as PopART counts them: each forward stage and
        its backward, the last stage's two run as one (2S - 1)."""
        return 2 * self.n_stages - 1

    def in_flight(self, s: int) -> int:
        """Micro-batches stage ``s`` holds between its forward and its backward in training: the
        pipeline stages from its forward to its own backward (1 for the last)."""
        return 2 * (self.n_stages - 1 - s) + 1

    def ipu_of(self) -> dict[str, int]:
        """Each stage node's IPU, by node name."""
        return {n.name: st.ipu for st in self.stages for n in st.nodes}

    def stages_by_ipu(self) -> dict[int, list[Stage]]:
        """Each IPU's stages, in stage order, from one walk over them: what a question asked of every
        IPU reads (a scan of every stage per IPU was quadratic in a deep model's IPU count)."""
        by_ipu: dict[int, list[Stage]] = {}
        for st in self.stages:
            by_ipu.setdefault(st.ipu, []).append(st)
        return by_ipu


def sections(ctx: LoweringContext) -> Sections:
    """The graph's pre-layer nodes, nodes per decoder layer, post-layer nodes and optimizer step
    nodes; whether the head is tied to the embedding, the table's weight in layers' worth, and
    each layer's stored values.

    A node without a layer joins the layer before it (residual adds the exporter left
    unscoped), except before the first layer (the embedding) and after the last (final
    norm, head, loss).
    """
    nodes = [n for n in ctx.graph.nodes]
    opt = [n for n in nodes if is_optimizer_step(n)]
    rest = [n for n in nodes if not is_optimizer_step(n)]
    layered = [i for i, n in enumerate(rest) if n.layer is not None]
    if not layered:
        return Sections(pre=rest, layers={}, post=[], optimizer=opt, tied=False, table_layers=0.0, layer_roots={})
    first, last = layered[0], layered[-1]
    layers: dict[int, list[Node]] = {}
    current = rest[first].layer
    for n in rest[first : last + 1]:
        current = n.layer if n.layer is not None else current
        layers.setdefault(int(current), []).append(n)
    layers = dict(sorted(layers.items()))
    pre, post = rest[:first], rest[last + 1 :]
    before = stored_values(ctx, pre)
    tied = bool(before.keys() & stored_values(ctx, post).keys())
    roots = {i: stored_values(ctx, ln) for i, ln in layers.items()}
    per_layer = sum(sum(r.values()) for r in roots.values()) / len(roots)
    table = sum(before.values()) / per_layer if per_layer else 0.0
    return Sections(pre=pre, layers=layers, post=post, optimizer=opt, tied=tied, table_layers=table, layer_roots=roots)


def layout(options: IpuOptions, n_layers: int, tied: bool, embed_layers: float = 0.0) -> Layout:
    """Layers on each IPU, and whether the head returns to IPU 0 as a pipeline stage of its own.

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
            raise UserError(
                f"--layers-per-ipu {shown} names {len(counts)} IPUs but --ipus is {options.ipus}; "
                "give one count per IPU"
            )
        if sum(counts) != n_layers:
            raise UserError(f"--layers-per-ipu {shown} places {sum(counts)} layers; the model has {n_layers}")
        return Layout(counts, tied and len(counts) > 1)
    n = max(1, min(options.ipus, n_layers))
    if tied and embed_layers > 0 and n > 1:
        first = max(0, min(n_layers, math.floor((n_layers + embed_layers) / n - embed_layers + 0.5)))
        base, extra = divmod(n_layers - first, n - 1)
        return Layout([first] + [base + (1 if k >= n - 1 - extra else 0) for k in range(n - 1)], True)
    base, extra = divmod(n_layers, n)
    return Layout([base + (1 if k >= n - extra else 0) for k in range(n)], False)  # the remainder on late IPUs


def pipeline_stages(parts: Sections, place: Layout) -> list[Stage]:
    """Pipeline stages in order. With ``place.head_home`` IPU 0 runs the first stage (embedding)
    and the last (head, loss); otherwise the embedding joins the first IPU's layers and the
    head the last IPU's."""
    order = list(parts.layers)
    stages: list[Stage] = []
    i = 0
    for k, c in enumerate(place.counts):
        st = Stage(k)
        if k == 0:
            st.nodes += parts.pre
            st.others += parts.pre
        for idx in order[i : i + c]:
            st.layers.append(idx)
            st.nodes += parts.layers[idx]
        i += c
        stages.append(st)
    if place.head_home:
        stages.append(Stage(0, list(parts.post), others=list(parts.post)))
    else:
        stages[-1].nodes += parts.post
        stages[-1].others += parts.post
    return [s for s in stages if s.nodes] or [Stage(0)]


def check_accumulation(pipeline: Pipeline, m: int, batch: int, training: bool, plan: Plan) -> None:
    """Fail a pipelined training step of ``m`` micro-batches (of a ``batch``) with fewer than its
    pipeline stages: the weights update only between pipeline runs, so PopART refuses a gradient
    accumulation factor below the number of pipeline stages (graphcore/popart
    willow/src/transforms/pipeline.cpp, "depth (gradient accumulation factor) must equal at least
    the number of pipeline stages"; PopTorch's user guide, docs/user_guide/batching.rst: "set the
    number of accumulations to at least the number of pipeline stages"). The failure names the
    fix: the fewest micro-batches of whole samples that are enough, else a larger batch."""
    depth = pipeline.training_stages
    if not training or pipeline.n_stages < 2 or m >= depth:
        return
    enough = next((d for d in range(depth, batch + 1) if batch % d == 0), None)
    fix = f"--micro-batches {enough}" if enough else f"a --batch of {depth} or more, one sample a micro-batch"
    plan.fail(
        f"pipelined training runs {depth} forward and backward pipeline stages over {pipeline.ipus} IPUs "
        f"and PopART needs at least that many micro-batches a step (gradient accumulation); this step has {m}: "
        f"use {fix}",
        remedy=(("micro_batches", enough),) if enough else (),
    )


def _check_every_ipu_used(counts: tuple[int, ...], used: set[int], named: int) -> None:
    """``--layers-per-ipu`` names ``named`` IPUs: each must hold a stage (layers, the embedding or the
    head). An empty IPU inside the layout (``0,0,4``) had been accepted and billed, its power and
    energy a third of the run's for a device doing nothing; one after the last was refused."""
    idle = [k for k in range(named) if k not in used]
    if not idle:
        return
    shown = ",".join(map(str, counts))
    which = ", ".join(map(str, idle))
    raise UserError(
        f"--layers-per-ipu {shown} leaves IPU {which} without a layer, the embedding or the head; "
        f"give {'it' if len(idle) == 1 else 'them'} layers or name {named - len(idle)} IPU(s)"
    )


def form_stages(ctx: LoweringContext, options: IpuOptions) -> Pipeline:
    """Step 1: lay the decoder layers out over the IPUs as pipeline stages.

    A head whose weight is the embedding's (tied) returns to IPU 0; with ``--ipus`` alone the
    table counts as its layers' worth of weights (`layout`). ``--matmul-proportion`` must give
    one value or one per IPU used; IPUs left without a layer are noted. The graph's `sections`
    are a fact of the context (`LoweringContext.fact`), the same for every layout of it.
    """
    parts = ctx.fact(sections)
    place = layout(options, len(parts.layers), parts.tied, parts.table_layers)
    stages = pipeline_stages(parts, place)
    n_ipus = max(s.ipu for s in stages) + 1
    if options.layers_per_ipu is not None:
        _check_every_ipu_used(options.layers_per_ipu, {s.ipu for s in stages}, len(place.counts))
    amps = options.matmul_proportion
    if len(amps) not in (1, n_ipus):
        raise UserError(f"--matmul-proportion {','.join(map(str, amps))}: give one value or one per IPU ({n_ipus})")
    if options.layers_per_ipu is None and options.ipus > n_ipus:
        note = f"only {len(parts.layers)} decoder layer(s) to place: {options.ipus - n_ipus} IPU(s) unused"
    else:
        note = ""
    return Pipeline(parts, place.counts, stages, n_ipus, note)
