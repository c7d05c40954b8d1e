"""Cerebras WSE lowering: pipelined kernel regions as the compiler maps them, or weight streaming.

The lowering is split by concern, one file each:

- `kernels` (`lowering/wse/kernels.py`): the graph cut into the Cerebras compiler's kernels
  (`wse_kernels`, `WseKernel`, `KERNEL_CLASSES`) and each kernel's per-sample work on one PE;
- `pipelined` (`lowering/wse/pipelined.py`): **pipelined** (layer-pipelined) mode, each kernel
  on its own rectangular region of PEs, all running at once, samples streaming through;
- `streaming` (`lowering/wse/streaming.py`): **weight streaming**, each decoder layer in turn
  on the whole wafer while its weights stream in from MemoryX;
- `common` (`lowering/wse/common.py`): graph queries the three share (shapes, samples,
  parameters, weight and optimizer-state bytes).

This package holds the `Lowering` itself (`WseLowering`, `LOWERING`), the options it reads
(`WseOptions`) and the mode rule, and re-exports the public names of its modules, so
``from dabench_ir.lowering.wse import wse_kernels`` keeps working.

``--wse-mode auto`` follows the Cerebras documentation in training: pipelined for models below
about 1 B parameters when the pipelined plan fits, weight streaming otherwise. Serving (a graph
without a training step) keeps the weights resident in PE SRAM wherever the pipelined plan fits,
whatever their count, and streams them only when it does not: the size rule is a training rule
(optimizer state and gradients beside the weights).

Micro-batches (``--micro-batches``, ``--micro-batch-size``) are weight streaming's lanes: the batch
in parts, each through every layer while the layer's weights stream in once per part (Cerebras'
microbatching, a Wafer-Scale Cluster setting: training-docs.cerebras.ai, "Optimize performance with
automatic microbatching"). Pipelined mode has none: "training data is streamed into the WSE
continuously", sample after sample through layers that all run at once (docs.cerebras.net,
"Cerebras Execution Modes"). So micro-batches refuse ``--wse-mode pipelined`` and ``--replicas``,
and under ``auto`` they choose weight streaming, as ``--replicas`` chooses pipelined.

Data parallelism over several chips (``--chips N --strategy dp``) is N CS-2 systems of a
Wafer-Scale Cluster (`WseLowering.systems_stream_weights`): each system runs weight streaming
on its own batch, MemoryX streams the weights through SwarmX, which copies them to every system
and sums the gradients on their way back. Pipelined mode runs on one system; copies of the model
on one wafer are ``--replicas``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.errors import UserError
from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.lowering.wse.common import FEED_LEVEL, WHO, trained_params
from dabench_ir.lowering.wse.kernels import KERNEL_CLASSES, WseKernel, wse_kernels
from dabench_ir.lowering.wse.pipelined import pipelined_best
from dabench_ir.lowering.wse.streaming import streaming_plan
from dabench_ir.passes import meta
from dabench_ir.plan import Plan

if TYPE_CHECKING:
    from dabench_ir.targets import Target

__all__ = ["KERNEL_CLASSES", "LOWERING", "WseKernel", "WseLowering", "WseOptions", "wse_kernels"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class WseOptions(LoweringOptions):
    """What the WSE lowering reads. ``replicas`` None means one copy.

    Internal (no knobs): ``fuse_elementwise`` fuses an elementwise op the kernel rules do not
    name onto the kernel whose output it alone reads; ``steady_state`` overlaps consecutive
    steps (step time = the slowest region); ``systems`` is the CS-2 systems of a Wafer-Scale
    Cluster running the plan data-parallel, each on its own batch (the scaling stage sets it for
    ``--strategy dp``): above 1 the plan streams weights, and pipelined mode or on-wafer replicas
    are refused (pipelined execution "doesn't support distributed training across multiple CS-2
    systems", Cerebras docs 2.0.3 Glossary, "Pipelined Execution").
    """

    micro_batches: int | None
    wse_mode: str
    replicas: int | str | None
    fuse_elementwise: bool = internal(True)
    steady_state: bool = internal(True)
    systems: int = internal(1)

    def __post_init__(self) -> None:
        """The modes' own rules: copies on the wafer run only pipelined, lanes only in weight streaming,
        several CS-2 systems only in weight streaming, one copy each."""
        if self.wse_mode == "streaming" and self.replicas not in (None, 1, "auto"):
            raise UserError(
                f"--replicas {self.replicas}: weight streaming runs one copy on the wafer; replicas apply to "
                "--wse-mode pipelined (or auto)"
            )
        if self.micro_batches and (self.wse_mode == "pipelined" or self.replicas not in ("auto", None)):
            why = (
                "--wse-mode pipelined" if self.wse_mode == "pipelined" else f"--replicas {self.replicas} runs pipelined"
            )
            raise UserError(
                f"--micro-batches {self.micro_batches} splits the batch into weight streaming's lanes; pipelined "
                f"mode ({why}) streams samples through the wafer one at a time and has none: drop "
                "--micro-batches (or --micro-batch-size), or use --wse-mode streaming"
            )
        if self.systems <= 1:
            return
        chips = f"--chips {self.systems} --strategy dp runs {self.systems} CS-2 systems in weight streaming"
        if self.wse_mode == "pipelined":
            raise UserError(
                f"--wse-mode pipelined runs on one CS-2 system; {chips}: use --wse-mode streaming (or auto), "
                "or --replicas N for copies of the model on one wafer"
            )
        if self.replicas not in (None, 1):
            raise UserError(
                f"--replicas {self.replicas} places copies of the model on one wafer (pipelined mode); {chips}, "
                "one copy each: drop --replicas or --chips"
            )


class WseLowering(Lowering):
    """Cerebras WSE: pipelined kernel regions on PE SRAM, or weight streaming layer by layer."""

    name = "wse"
    kinds = ("wse",)
    Options = WseOptions
    feed = FEED_LEVEL  # PE SRAM feeds every region
    systems_stream_weights = True  # data parallelism: CS-2 systems joined by MemoryX and SwarmX
    fuses_attention_itself = True  # every intermediate stays in PE SRAM: no S×S traffic to remove

    def _lower(self, ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
        # one kernel map for every plan tried (each copy count, then streaming): it depends on the graph alone
        kernels = wse_kernels(ctx, target, fuse_elementwise=options.fuse_elementwise)
        if options.systems > 1:  # one system of a cluster: weight streaming (pipelined mode is single-system)
            plan = streaming_plan(ctx, target, options, kernels)
            plan.notes.insert(
                0,
                f"{options.systems} CS-2 systems, weight streaming, SwarmX broadcast/reduce: this plan is one "
                "system's, on its own batch; MemoryX streams the weights through SwarmX, which copies them to every "
                "system and sums the gradients on their way back (pipelined mode runs on one system)",
            )
            return plan
        if options.wse_mode == "streaming":
            return streaming_plan(ctx, target, options, kernels)
        if options.micro_batches:  # lanes exist only in weight streaming: no silent pipelined run
            streamed = streaming_plan(ctx, target, options, kernels)
            streamed.notes.insert(
                0,
                f"auto: weight streaming ({options.micro_batches} micro-batches: the lanes of weight streaming; "
                "pipelined mode streams samples one at a time)",
            )
            return streamed
        plan = pipelined_best(ctx, target, options, kernels)
        if options.wse_mode == "pipelined":
            return plan
        if options.replicas not in ("auto", None):  # copies exist only pipelined: no silent fallback
            plan.notes.insert(
                0, f"auto: pipelined (--replicas {options.replicas}: on-wafer copies run only in pipelined mode)"
            )
            return plan
        serving = meta.training_state(ctx.graph) is None  # the size rule below is a training rule
        if plan.fits and serving:
            plan.notes.insert(0, "auto: pipelined (serving: the weights stay resident in PE SRAM, and they fit)")
            return plan
        limit = target.arch_value("pipelined_max_params", needed_by=WHO)
        params = trained_params(ctx)
        if plan.fits and params < limit:
            plan.notes.insert(0, f"auto: pipelined ({params / 1e6:.0f} M parameters < {limit / 1e9:g} B, and it fits)")
            return plan
        why = (
            f"{params / 1e9:.2f} B parameters >= {limit / 1e9:g} B"
            if params >= limit and not serving
            else f"pipelined mode does not fit ({plan.failure.reason if plan.failure else 'does not fit'})"
        )
        streamed = streaming_plan(ctx, target, options, kernels)
        streamed.notes.insert(0, f"auto: weight streaming ({why})")
        return streamed


LOWERING = WseLowering()
