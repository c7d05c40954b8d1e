"""The RDU as the SambaFlow compiler sees it: the units on the compiled tiles and the planning capacity."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dabench_ir.errors import UserError

if TYPE_CHECKING:
    from dabench_ir.lowering.rdu import RduOptions
    from dabench_ir.targets import Target

__all__ = ["NEEDED_BY", "Chip"]

NEEDED_BY = "rdu"
"""Who needs a target's ``[arch]`` knob when it is missing (`Target.arch_value`'s ``needed_by``)."""


@dataclass(frozen=True, slots=True)
class Chip:
    """The RDU as the compiler sees it: units on the compiled tiles, the planning capacity."""

    tiles: int
    tiles_per_rdu: int
    pcus: int  # PCUs on the compiled tiles (the allocation denominator)
    pmus: int
    capacity: int  # PCUs (and PMUs) the compiler plans fused sections with: floor(units · resource_scale)
    act_bytes_per_pmu: float
    weight_bytes_per_pmu: float
    matmul_grain: int

    @property
    def units(self) -> int:
        """PCU/PMU pairs on the compiled tiles: what a group split into parts spreads over."""
        return min(self.pcus, self.pmus)

    @property
    def share(self) -> float:
        """The compiled tiles' share of the RDU: what scales the chip's rates to them."""
        return self.tiles / self.tiles_per_rdu

    @classmethod
    def of(cls, target: Target, options: RduOptions) -> Chip:
        """The chip of ``target`` compiled onto ``options.tiles`` (None: the whole RDU) at ``options.resource_scale``."""
        per_rdu = int(target.arch_value("tiles_per_rdu", needed_by=NEEDED_BY))
        tiles = options.tiles or per_rdu
        if tiles > per_rdu:
            raise UserError(f"--tiles {tiles}: {target.name} has {per_rdu} tiles per RDU; give 1 to {per_rdu}")
        pcus = tiles * int(target.arch_value("pcus_per_tile", needed_by=NEEDED_BY))
        pmus = tiles * int(target.arch_value("pmus_per_tile", needed_by=NEEDED_BY))
        return cls(
            tiles=tiles,
            tiles_per_rdu=per_rdu,
            pcus=pcus,
            pmus=pmus,
            capacity=max(1, math.floor(min(pcus, pmus) * options.resource_scale)),
            act_bytes_per_pmu=target.arch_value("act_bytes_per_pmu", needed_by=NEEDED_BY),
            weight_bytes_per_pmu=target.arch_value("weight_bytes_per_pmu", needed_by=NEEDED_BY),
            matmul_grain=max(1, int(target.arch_value("matmul_pcu_grain", 1))),
        )
