"""SambaNova RDU lowering: the graph as SambaFlow compiles it, sections run one after another.

The chip as the compiler sees it: an SN30 RDU has ``arch.tiles_per_rdu`` tiles of
``arch.pcus_per_tile`` PCUs and ``arch.pmus_per_tile`` PMUs; a graph is compiled onto
``--tiles N`` of them (4 = half an RDU, the other half runs a second copy as data
parallelism inside the PEF, or another job). The compiler plans with ``--resource-scale``
of those units (SambaFlow's ``--resources-scaling-factors``). A pipeline stage holds its
scratchpad, so a node's PCUs equal its PMU demand (PCU/PMU pairing), at least one PCU,
matmuls in multiples of ``arch.matmul_pcu_grain``.

Sections, per opt level (forward, backward and optimizer never share a section):

- O0: one operator per section (SambaFlow: "o0 compiles each operator as a separate
  section"); the optimizer is one section per parameter tensor.
- O1: one module (an attention, an MLP: ``module_key``; outside the blocks, read below a user's
  wrapper: `model_root`) per section, cut where it would exceed the planning capacity; an
  attention core stays in one section, as at O3 (`fusion_groups`).
- O3: greedy fusion of fusion groups along the program order while the section's demand
  fits the planning capacity. The attention core (QKᵀ matmul to AV matmul) is one atomic
  group: its scores stay on chip and the backward recomputes them. A group larger than the
  capacity is split (along batch or heads) into ``ceil(demand / units)`` sections tiled over
  every unit of the compiled tiles: the resource scale is the margin fusion keeps, not a
  cap on a forced split (measured PCU utilisation reaches 94 % with a 0.8 scale).
  The optimizer (all parameters) is one streaming section.

A section costs ``section_reconfig_s`` (its switch) plus the larger of its compute (below)
and its DDR traffic (weights, and every
tensor crossing its boundary: the section's inputs, its outputs read elsewhere and the
activations it saves for backward) at the DDR streaming bandwidth. The host's per-step
cost is its own row, ``Plan.step_overheads_s["host"] = host_step_s + host_per_section_s ·
sections`` for a training step; both were fitted to training steps (data loading, the
Python training loop). No SN30 inference host time is published, so an inference run pays
only the per-section launches, as the row ``HOST_ESTIMATE`` ("host (estimate: fitted to
training steps)", also in ``plan.notes``).

A section's compute is each node's Cost in three parts at the compiled tiles' rates:
contraction FLOPs at ``peak · tiles/tiles_per_rdu · pcu_efficiency`` (PCUs in systolic
mode), vector FLOPs and special functions at the target's ``[compute.vector_flops]`` and
``[compute.special_ops]`` rates (PCUs in SIMD mode; `Target.rate`), both scaled by ``tiles/tiles_per_rdu``.
Those are a stage's seconds on all the compiled tiles; the section is one pipeline whose stages
hold PCUs by their memory demand and compute on the PCUs they hold (the section's demand is
its allocation, DABench's allocation ratio; a tiled group above the room shares every unit by
demand), so it lasts its slowest stage (`pipeline_s`): ``pcus · max_i t_i/p_i · max(1, Σp/room)``.
No stage runs faster than its own PCUs' peak: a section holding 5 % of the PCUs computes at
no more than 5 % of the tiles' peak. With
``--rdu-mapping tuned`` (SambaNova's human-decision files, which set each operator's tiling and
PCUs by hand: the model-zoo GPT apps' ``..._spatialmapping_tiling16_...json``) every stage holds
the section's PCUs in proportion to its work, so the section lasts its balanced time
``Σt · pcus / min(Σp, room)`` (`balanced_s`). The compile mode changes the sections, the PCUs
they hold and the mapping, not the PCU's rate: one ``pcu_efficiency`` serves O0, O1 and O3.
A balanced section (work in proportion to PCUs, a GEMM alone, a layer of large GEMMs) runs near
the fitted rate; one whose PCUs follow weight bytes while its work follows FLOPs (small
matmuls fused with norms, activations and the attention core at hidden 1600) waits on its
slowest stage. This is the GEMM-shape dependence of the contraction rate on this chip.
The rates are the plan's precision's: fp32 runs at half the bf16 rates (a 32-bit lane does one
fp32 or two bf16 operations), and its bytes are twice, so the whole-step mixed / fp32 ratio
comes out of the lanes, the DDR traffic and the fixed host cost.
Every figure comes from the target (targets/sn30.toml) with its source.

The RDU runs one section at a time and a section is one pipeline: every node is on one lane
(``RDU_LANE``), so the emulated section lasts its planned time. The section's time is shared
out over its stages for the per-node figures: first what each stage's own DDR stream and its
FLOPs at the tiles' peak need (no stage is given less than its bytes can cross in), then the
rest by what each stage would take alone.

The lowering is split by concern, one file each:

- `chip` (`lowering/rdu/chip.py`): the RDU as the compiler sees it (`Chip`): units on the
  compiled tiles, the planning capacity;
- `sections` (`lowering/rdu/sections.py`): each node's PMU/PCU demand (`Demand`), fusion groups
  and the attention cores, the sections per opt level (`form_sections`, `SectionLayout`);
- `timing` (`lowering/rdu/timing.py`): the compiled tiles' rates (`Rates`), reduction depths and
  the backward's contraction, each node's seconds, the pipeline (`pipeline_s`) and each
  section's time shared out over its nodes (`SectionTimer`);
- `memory` (`lowering/rdu/memory.py`): the sections' DDR traffic (`section_ddr`), what the
  forward saves for the backward (`saved_for_backward`), the training footprint
  (`ddr_footprint`, `ddr_assumption`) and the fit against the capacities (`fit`);
- `placement` (`lowering/rdu/placement.py`): a Unit per section part and every node's NodePlan
  on the one lane (`RDU_LANE`, `NodeRun`, `Placement`);
- `overheads` (`lowering/rdu/overheads.py`): the host and device rows no node owns
  (`HOST_ESTIMATE`, `DEVICE_STEP`);
- `stats` (`lowering/rdu/stats.py`): load imbalance per section, allocation over the step.

This package holds the `Lowering` itself (`RduLowering`, `LOWERING`) and the options it reads
(`RduOptions`); its `_lower` runs those steps in turn, and it re-exports the public names of its
modules, so ``from dabench_ir.lowering.rdu import form_sections`` keeps working.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from dabench_ir.lowering import Lowering, LoweringOptions
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.lowering.rdu.chip import NEEDED_BY, Chip
from dabench_ir.lowering.rdu.memory import (
    Feed,
    SavedState,
    ddr_assumption,
    ddr_footprint,
    fit,
    saved_for_backward,
    saved_state,
    section_ddr,
)
from dabench_ir.lowering.rdu.overheads import DEVICE_STEP, HOST_ESTIMATE, step_overheads
from dabench_ir.lowering.rdu.placement import RDU_LANE, Placement
from dabench_ir.lowering.rdu.sections import PHASES, Section, SectionLayout, form_sections
from dabench_ir.lowering.rdu.stats import plan_stats
from dabench_ir.lowering.rdu.timing import NodeTimer, Rates, SectionTimer, TileFloor, pipeline_s, reduction_depths
from dabench_ir.passes import meta
from dabench_ir.plan import Plan, Schedule

if TYPE_CHECKING:
    from dabench_ir.targets import Target

__all__ = [
    "DEVICE_STEP",
    "HOST_ESTIMATE",
    "LOWERING",
    "PHASES",
    "RDU_LANE",
    "Chip",
    "RduLowering",
    "RduOptions",
    "Section",
    "ddr_assumption",
    "ddr_footprint",
    "form_sections",
    "pipeline_s",
    "reduction_depths",
    "saved_for_backward",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RduOptions(LoweringOptions):
    """What the RDU lowering reads."""

    micro_batches: int | None
    opt_level: str
    tiles: int | None
    resource_scale: float
    rdu_mapping: str
    rdu_host_loop: str


class RduLowering(Lowering):
    """SambaNova RDU: sections run one after another, each an on-chip pipeline fed from DDR."""

    name = "rdu"
    kinds = ("rdu",)
    Options = RduOptions
    feed = "off-chip"  # sections read weights and boundary tensors from DDR
    fuses_attention_itself = True  # O1 and O3 keep each attention core in one section, its scores on chip
    tp_whole_heads = False  # SambaFlow splits operators: DABench ran a 25-head GPT-2 over 2 and 4 RDUs
    without_micro_batches: ClassVar[dict[str, str]] = {
        "inference": "SambaFlow streams the compiled batch through each section once, micro-batches split a "
        "training step (gradient accumulation)"
    }

    def check_options(self, target: Target, options: RduOptions) -> None:
        Chip.of(target, options)  # refuses more tiles than the RDU has

    def _lower(self, ctx: LoweringContext, target: Target, options: RduOptions) -> Plan:
        """Form the sections, time and place each, then add the rows no node owns, fit the memory
        and sum up the plan's statistics."""
        chip = Chip.of(target, options)
        accumulated = _accumulates(ctx, options)
        micro_batches = options.micro_batches or ctx.batch
        rates = Rates.of(target, ctx.precision, chip)
        feed = Feed.of(target, ctx.precision, self.feed_level(target))
        reconfig_s = target.overhead_value("section_reconfig_s", needed_by=NEEDED_BY)
        plan = ctx.plan(target, options, Schedule.SEQUENTIAL, micro_batches=micro_batches)
        plan.stats = replace(plan.stats, allocation_chips=chip.share)  # allocation is of the compiled tiles
        layout = SectionLayout.compile(ctx, chip, options.opt_level)
        state = ctx.fact(saved_state, bool(layout.cores))  # the layout's cores, the context's
        timer = SectionTimer(
            ctx,
            chip,
            layout,
            NodeTimer(ctx, rates),
            TileFloor(ctx, target, chip.share),
            feed,
            tuned=options.rdu_mapping == "tuned",
        )
        placement = Placement(chip, feed, reconfig_s, micro_batches, accumulated=accumulated)
        section_bytes = _time_and_place(ctx, plan, layout, state, timer, placement)
        host_key = step_overheads(ctx, plan, target, placement.launches, options.rdu_host_loop)
        fit(ctx, plan, target, chip, layout, state, section_bytes, feed, micro_batches, accumulated)
        plan.extra.update(plan_stats(plan, chip, options.opt_level, host_key))
        return plan


def _time_and_place(
    ctx: LoweringContext,
    plan: Plan,
    layout: SectionLayout,
    state: SavedState,
    timer: SectionTimer,
    placement: Placement,
) -> list[int]:
    """Time each section (its DDR traffic, `section_ddr`, over every pass the step makes of it, and
    its pipeline), add its units to ``plan`` and its traffic to the plan's, then place every node;
    returns each section's DDR bytes in one pass, in order (what a pass holds in flight)."""
    section_bytes: list[int] = []
    moved = 0
    for i, sec in enumerate(layout.sections):
        traffic = section_ddr(ctx, sec, layout.section_of, i, state.recomputed, state.saved)
        section_bytes.append(traffic.total)
        traffic = traffic.passes(placement.passes(sec))
        moved += traffic.total
        placement.add_section(plan, sec, timer.time(sec, traffic))
    plan.traffic_bytes[timer.feed.ddr.name] = moved
    placement.place_nodes(ctx, plan)
    return section_bytes


LOWERING = RduLowering()


def _accumulates(ctx: LoweringContext, options: RduOptions) -> bool:
    """Whether the step accumulates gradients: a training step asked for micro-batches (however the
    question put them: a count, or a micro-batch size) runs each micro-batch forward and backward
    over every section before the next, one weight update per step. (An inference run has none:
    the run refuses them, `without_micro_batches`.)"""
    return options.micro_batches is not None and meta.graph_mode(ctx.graph) == "train"
