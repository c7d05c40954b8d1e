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

``--wse-mode auto`` follows the Cerebras documentation: pipelined for models below about
1 B parameters when the pipelined plan fits, weight streaming otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering._common import LoweringContext
from dabench_ir.lowering.wse.common import FEED_LEVEL, WHO, trained_params
from dabench_ir.lowering.wse.kernels import KERNEL_CLASSES, WseKernel, wse_kernels
from dabench_ir.lowering.wse.pipelined import pipelined_best
from dabench_ir.lowering.wse.streaming import streaming_plan
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
    feed = FEED_LEVEL  # PE SRAM feeds every region
    replicas_on_chip = True  # data parallelism: copies of the model on one wafer (`--replicas`)

    def _lower(self, ctx: LoweringContext, target: Target, options: WseOptions) -> Plan:
        # one kernel map for every plan tried (each copy count, then streaming): it depends on the graph alone
        kernels = wse_kernels(ctx, target, fuse_elementwise=options.fuse_elementwise)
        if options.wse_mode == "streaming":
            return streaming_plan(ctx, target, options, kernels)
        plan = pipelined_best(ctx, target, options, kernels)
        if options.wse_mode == "pipelined":
            return plan
        if options.replicas not in ("auto", None):  # copies exist only pipelined: no silent fallback
            plan.notes.insert(
                0, f"auto: pipelined (--replicas {options.replicas}: on-wafer copies run only in pipelined mode)"
            )
            return plan
        limit = target.arch_value("pipelined_max_params", needed_by=WHO)
        params = trained_params(ctx)
        if plan.fits and params < limit:
            plan.notes.insert(0, f"auto: pipelined ({params / 1e6:.0f} M parameters < {limit / 1e9:g} B, and it fits)")
            return plan
        why = (
            f"{params / 1e9:.2f} B parameters >= {limit / 1e9:g} B"
            if params >= limit
            else f"pipelined mode does not fit ({plan.failure.reason if plan.failure else 'does not fit'})"
        )
        streamed = streaming_plan(ctx, target, options, kernels)
        streamed.notes.insert(0, f"auto: weight streaming ({why})")
        return streamed


LOWERING = WseLowering()
