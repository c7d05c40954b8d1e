"""Lowerings: place an annotated Graph on a Target and return a `Plan`.

One module per architecture (`wse`, `rdu`, `ipu`, `gpu`, `cpu`), each holding one
`Lowering`: its name, the target kinds it serves, its own frozen `Options` (the knobs it
reads, by the names `dabench_ir.options` declares them under), the memory level that
feeds it, and ``lower(graph, target, options) -> Plan``. `lower` here dispatches on
``target.kind``. No lowering hard-codes a hardware figure (every number comes from the
Target), and none emulates, measures or reports: `dabench_ir.place` and
`dabench_ir.scaling` compose lowering with the later stages.
"""

from __future__ import annotations

from dabench_ir._layout import installed_as

installed_as(__name__, "lowering")  # the folder is dabench_ir.lowering; one file, one module

import dataclasses
import importlib
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

from dabench_ir.errors import UserError
from dabench_ir.ir import DType
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.targets import KINDS as TARGET_KINDS

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.plan import Plan
    from dabench_ir.targets import Target

__all__ = ["KINDS", "Lowering", "LoweringOptions", "internal", "lower", "lowering_for"]

logger = logging.getLogger(__name__)

KINDS: dict[str, str] = {kind: kind for kind in TARGET_KINDS}
"""Target kind -> the module (``dabench_ir.lowering.<module>``) whose `Lowering` serves it: each
kind a target file may declare (`dabench_ir.targets.KINDS`, the owner) has the module of its name."""


def internal(default: Any) -> Any:
    """An option field that is no user knob: a lowering-internal setting with its default."""
    return field(default=default, metadata={"internal": True})


def _precision(value: Any) -> DType | None:
    """The dtype peaks are taken at: a `DType`, or a precision knob's value (``mixed`` computes in 16 bits)."""
    from dabench_ir.passes.precision import compute_dtype  # int8, fp8, weight-only modes too

    return compute_dtype(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoweringOptions:
    """Base of every lowering's ``Options``: the knobs it reads, nothing declared twice.

    Each field is either a knob of `dabench_ir.options` (same name; its type, choices,
    default and checks live there only) or an `internal` setting no user sets. Build one
    with `read` from any options object (`ProfileOptions`, `ScaleOptions`, another
    lowering's options): knob fields the object lacks take their declared default.
    ``precision`` arrives as the knob's text and is kept as the `DType` peaks are taken at.
    The batch is no option: it is the graph's (`dabench_ir.run`), read from the context.
    """

    precision: DType | None

    @classmethod
    def read(cls, source: Any = None, **internals: Any) -> Self:
        """The options ``source`` sets for this lowering, with ``internals`` overriding internal fields."""
        from dabench_ir.options import ProfileOptions

        declared = {f.name: f for f in dataclasses.fields(ProfileOptions)}
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.metadata.get("internal"):
                if f.name in internals:
                    values[f.name] = internals.pop(f.name)
                elif hasattr(source, f.name):
                    values[f.name] = getattr(source, f.name)
                continue
            if hasattr(source, f.name):
                values[f.name] = getattr(source, f.name)
            else:
                values[f.name] = declared[f.name].default
        if internals:
            raise TypeError(f"{cls.__qualname__} has no internal option {', '.join(internals)}")
        values["precision"] = _precision(values["precision"])
        return cls(**values)


class Lowering(ABC):
    """One target architecture's lowering: what every module in `lowering/` implements.

    ``name`` is how the pipeline and the tests refer to it, ``kinds`` the target kinds it
    serves, ``Options`` its own frozen options (a `LoweringOptions` subclass listing the
    fields it reads), ``feed`` the memory level that feeds it. Subclasses implement `_lower`;
    `lower` converts any options object to ``Options`` first.
    """

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    Options: ClassVar[type[LoweringOptions]]

    @classmethod
    def options(cls, source: Any = None, **internals: Any) -> LoweringOptions:
        """This lowering's options read from ``source`` (a `ProfileOptions`, None: the defaults)."""
        return cls.Options.read(source, **internals)

    feed: ClassVar[str]
    """The memory level that feeds this architecture's units (the roofline's bandwidth):
    ``on-chip`` (WSE PE SRAM, IPU tile SRAM) or ``off-chip`` (RDU DDR, GPU HBM, host DRAM)."""

    systems_stream_weights: ClassVar[bool] = False
    """Data parallelism over n chips is n systems that each stream the weights from one off-chip store,
    joined by a broadcast/reduce tree that copies the weights to every system and sums the gradients on
    their way back (a Cerebras Wafer-Scale Cluster: MemoryX, SwarmX). Each system runs the one-system plan
    on its own batch; the lowering learns the count through its internal option ``systems``, places
    each system in its streaming mode and opens that plan's notes with what the systems are. Each system
    streams the bytes one system alone does; the step adds the tree's latency: levels of the target's
    ``[arch] broadcast_fanout``, each one hop of its ``[topology] inter_node_link``. (Copies of the model on
    one chip are a lowering's own knob, the WSE's ``replicas``, not chips.)"""

    pipelines_itself: ClassVar[bool] = False
    """The lowering places a pipeline over several devices itself (the IPU's ``--ipus``): pipeline
    parallelism over n is its plan on n devices, not the scaling stage's stage split."""

    replicates_itself: ClassVar[bool] = False
    """The lowering places data-parallel replicas itself (the IPU's ``--replicas``: each replica's
    devices run the graph's batch, and a training step all-reduces the gradients over them as its own
    ``gradient_reduce`` row): data parallelism over n is its plan with n replicas, not the scaling
    stage's copies and collective."""

    tp_whole_heads: ClassVar[bool] = True
    """Tensor parallelism gives each chip whole attention heads (Megatron-LM, as TensorRT-LLM and vLLM
    run it): a chip count that does not divide the heads is refused (`dabench_ir.scaling`). A
    compiler that splits operators along their tensor dims (SambaFlow's) takes any count."""

    fuses_attention_itself: ClassVar[bool] = False
    """The lowering models how the architecture fuses an attention core itself (an RDU O3 section keeps
    the core's scores on chip and recomputes them; the WSE keeps every intermediate in PE SRAM), so
    the cost rewrite of ``--fused-attention true`` before it would count the fusion twice or change
    nothing: the run refuses it (`dabench_ir.options.check_applies`)."""

    without_micro_batches: ClassVar[dict[str, str]] = {}
    """By mode (``inference``, ``train``), why a run on this architecture has no micro-batches to run
    (a mode not named runs them, a pipeline's or one after another): the run refuses them
    (`dabench_ir.options.check_applies`)."""

    recompute_without: ClassVar[dict[str, str]] = {}
    """By ``--recompute`` mode, why this lowering does not model it (a mode not named is modelled): the
    run refuses it (`dabench_ir.options.check_applies`) rather than place it as another mode."""

    def check_options(self, target: Target, options: Any) -> None:
        """A UserError for a knob value ``target``'s size refuses (``--tiles 9`` on an 8-tile RDU), said
        before anything runs (`dabench_ir.options.check_applies`); ``options`` of this lowering's
        ``Options`` type. Most lowerings have no such bound."""
        return

    def offloads_optimizer(self, options: Any) -> bool:
        """Whether the run keeps its optimizer state in its host's memory and updates it there, so that
        the devices of one host that offload at once share its memory (the GPUs' CPU offload)."""
        return False

    def device_memory(self, ctx: LoweringContext, options: Any, *, zero: int, shards: int) -> dict[str, int] | None:
        """Bytes one device holds by kind (weights, gradients, optimizer, activations, ...; ``host`` off the
        device) when the run is data-parallel over ``shards`` devices with ZeRO stage ``zero``; None where the
        lowering models no such layout (its plan's own memory stands, and ZeRO is refused)."""
        return None

    def feed_level(self, target: Target) -> str:
        """The level of ``target``'s memories that feeds this architecture's units (`feed`)."""
        return self.feed

    def lower(
        self, graph: Graph, target: Target, options: Any = None, *, context: LoweringContext | None = None
    ) -> Plan:
        """Place ``graph`` on ``target``; ``options`` is any options object (None: the defaults).

        ``context``: a `LoweringContext` of this very ``graph``, built by a caller that places the
        unchanged graph several times (the why lines' variant runs): used when it is at the plan's
        precision, else one is built. A lowering reads its context and writes nothing to it."""
        if target.kind not in self.kinds:
            raise UserError(f"the {self.name} lowering serves {', '.join(self.kinds)} targets, not {target.name}")
        opts = options if type(options) is self.Options else self.options(options)
        self.check_options(target, opts)  # said before anything runs too; here for a caller that places directly
        if context is not None and context.graph is not graph:
            raise ValueError("a lowering context is of the graph it was built for")
        if context is None or not context.serves(graph, opts.precision):
            context = LoweringContext.build(graph, opts.precision)
        plan = self._lower(context, target, opts)
        logger.info(
            "lowered %s onto %s: %d unit(s), fits=%s", graph.name or "graph", target.name, len(plan.units), plan.fits
        )
        return plan

    @abstractmethod
    def _lower(self, ctx: LoweringContext, target: Target, options: Any) -> Plan:
        """The Plan of ``ctx.graph`` (its node costs resolved in ``ctx``), with options of this
        lowering's ``Options`` type."""


def lowering_for(target: Target) -> Lowering:
    """The `Lowering` that serves ``target``'s kind."""
    try:
        module = KINDS[target.kind]
    except KeyError:
        raise UserError(f"no lowering for target kind {target.kind!r} (target {target.name})") from None
    return importlib.import_module(f"{__name__}.{module}").LOWERING


def lower(graph: Graph, target: Target, options: Any = None, *, context: LoweringContext | None = None) -> Plan:
    """Place ``graph`` on ``target`` with the lowering for its kind (``options``: a `ProfileOptions`, None:
    defaults; ``context``: see `Lowering.lower`)."""
    return lowering_for(target).lower(graph, target, options, context=context)
