"""Lowerings: place an annotated Graph on a Target and return a `Plan`.

One module per architecture (`wse`, `rdu`, `ipu`, `gpu`), each exposing
``lower(graph, target, options) -> Plan``; `lower` here dispatches on ``target.kind``.
No lowering hard-codes a hardware figure: every number comes from the Target.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dabench_ir.errors import UserError
from dabench_ir.ir import DType

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.plan import Plan
    from dabench_ir.targets import Target

__all__ = ["LoweringOptions", "lower"]

logger = logging.getLogger(__name__)

_MODULES = {"wse": "wse", "rdu": "rdu", "ipu": "ipu", "gpu": "gpu", "cpu": "gpu"}


@dataclass(frozen=True, slots=True)
class LoweringOptions:
    """Options every lowering reads; each ignores those that do not apply to it.

    batch: samples one step processes (None: the graph's ``batch`` binding, else 1).
    precision: the dtype peaks are taken at (None: the graph's dtype).
    opt_level: RDU compile mode, O0 (an operator per section), O1 (a module per section),
    O3 (greedy whole-graph fusion).
    wse_mode: pipelined (all kernels resident), streaming (weights streamed per layer) or
    auto (pipelined when it fits). replicas: copies of the model on the wafer, or "auto".
    ipus: IPUs the layers are split over as pipeline stages.
    micro_batches: pipeline micro-batches per step (None: one per sample where the target
    pipelines, else 1). fuse_elementwise: fuse elementwise chains onto their producer
    (GPU and WSE kernels). steady_state: pipelined targets overlap consecutive steps, so
    the step time is the bottleneck stage's busy time rather than one step's makespan.
    """

    batch: int | None = None
    precision: DType | str | None = None
    opt_level: Literal["O0", "O1", "O3"] = "O1"
    wse_mode: Literal["pipelined", "streaming", "auto"] = "auto"
    replicas: int | Literal["auto"] = 1
    ipus: int = 1
    micro_batches: int | None = None
    fuse_elementwise: bool = True
    steady_state: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.precision, str):  # "fp16", "bf16", ..., "mixed" (16-bit compute)
            name = "fp16" if self.precision.lower() == "mixed" else self.precision
            try:
                object.__setattr__(self, "precision", DType.from_name(name))
            except ValueError:
                raise UserError(f"unknown precision {self.precision!r}; use fp32, fp16, bf16 or mixed") from None
        if self.opt_level not in ("O0", "O1", "O3"):
            raise UserError(f"opt_level must be O0, O1 or O3, got {self.opt_level!r}")
        if self.wse_mode not in ("pipelined", "streaming", "auto"):
            raise UserError(f"wse_mode must be pipelined, streaming or auto, got {self.wse_mode!r}")
        if self.replicas != "auto" and (not isinstance(self.replicas, int) or self.replicas < 1):
            raise UserError(f"replicas must be a positive integer or 'auto', got {self.replicas!r}")
        if not isinstance(self.ipus, int) or self.ipus < 1:
            raise UserError(f"ipus must be a positive integer, got {self.ipus!r}")
        if self.micro_batches is not None and self.micro_batches < 1:
            raise UserError(f"micro_batches must be positive, got {self.micro_batches!r}")
        if self.batch is not None and self.batch < 1:
            raise UserError(f"batch must be positive, got {self.batch!r}")


def lower(graph: Graph, target: Target, options: LoweringOptions | None = None) -> Plan:
    """Place ``graph`` on ``target`` with the lowering for its kind."""
    options = options or LoweringOptions()
    try:
        name = _MODULES[target.kind]
    except KeyError:
        raise UserError(f"no lowering for target kind {target.kind!r} (target {target.name})") from None
    module = importlib.import_module(f"dabench_ir.lowering.{name}")
    plan = module.lower(graph, target, options)
    logger.info(
        "lowered %s onto %s: %d unit(s), fits=%s", graph.name or "graph", target.name, len(plan.units), plan.fits
    )
    return plan
