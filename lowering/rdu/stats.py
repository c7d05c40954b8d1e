"""What a plan's sections hold of the chip: load imbalance per section, allocation over the step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dabench_ir.lowering.rdu.overheads import DEVICE_STEP
from dabench_ir.lowering.rdu.sections import PHASES

if TYPE_CHECKING:
    from dabench_ir.lowering.rdu.chip import Chip
    from dabench_ir.lowering.rdu.sections import Demand, Section
    from dabench_ir.plan import Plan

__all__ = ["plan_stats", "section_load_imbalance"]


def section_load_imbalance(demand: Demand, sec: Section, flops: dict[str, int]) -> float:
    """Load imbalance of a section's pipeline: mean / max stage time, a stage's time being its
    FLOPs over the PCUs it holds (its paired PMU demand)."""
    times = [flops[n.name] / max(1, demand.pcu(n, sec.phase)) for n in sec.nodes if flops.get(n.name)]
    if not times:
        return 1.0
    return (sum(times) / len(times)) / max(times)


def plan_stats(plan: Plan, chip: Chip, opt_level: str, host_key: str) -> dict[str, Any]:
    """The plan's ``extra`` figures: its sections (by phase), the chip it was compiled for, its PCU
    and PMU allocation and load imbalance weighted by each section's time, the RDU's time (sections,
    their switches and the device step) and the host's (its row ``host_key``)."""
    units = plan.units
    times = [u.resources["time_s"] for u in units]
    timed = list(zip(units, times, strict=True))
    span = sum(times) or 1.0
    return {
        "sections": len(units),
        "sections_by_phase": {p: sum(1 for u in units if f"phase_{p}" in u.resources) for p in PHASES},
        "opt_level": opt_level,
        "tiles": chip.tiles,
        "planning_capacity_pcus": chip.capacity,
        "highest_pcu_allocation": max((u.allocation for u in units), default=0.0),
        "pcu_allocation_time_weighted": sum(u.allocation * t for u, t in timed) / span,
        "pmu_allocation_time_weighted": sum((u.stats.pmu_allocation or 0.0) * t for u, t in timed) / span,
        "load_imbalance_time_weighted": sum((u.stats.load_imbalance or 0.0) * t for u, t in timed) / span,
        "rdu_time_s": sum(u.gap_before_s + t for u, t in timed) + plan.step_overheads_s.get(DEVICE_STEP, 0.0),
        "host_time_s": plan.step_overheads_s.get(host_key, 0.0),
    }
