"""Graphcore IPU lowering: BSP supersteps on tiles, layers pipelined over IPUs as Poplar does it.

Each node is one bulk-synchronous superstep on its IPU: a compute phase on the tiles its
work spreads over (a grain of work each: ``arch.min_grain_flops`` at a tile's 16-bit AMP peak,
each part of the work at its unit's rate; `supersteps.tiles_for`), a sync (``overheads.sync_s``)
and a vertex launch on each of them (``arch.vertex_overhead_cycles``), and an exchange phase
moving its inputs into its tiles at their share of ``arch.exchange_bytes_per_s``.
Matmuls run on the AMP units at the achieved fraction of peak the microbenchmarks give
(``arch.matmul_efficiency_<prec>``); vector ops run on each tile's 64-bit vector pipeline
(``arch.vector_elems_per_cycle_<prec>``), transcendentals at ``arch.special_ops_per_cycle_<prec>``
per tile: each of a node's three Cost parts at its own rate. A matmul whose full-speed
temporaries exceed the matmul proportion's budget is serialised (`supersteps.serial_plan`):
each pass after the first pays a sync and the broadcast operand's exchange again, and the plan
holds what its passes need.

Layout: ``layers_per_ipu`` (a leading 0 puts the embedding alone on IPU 0, and the head
returns there, as Graphcore's GPT-2 examples place it) or ``ipus`` splitting the decoder
layers evenly. Every IPU must hold, in its tile memory, what Poplar keeps there (`MEMORY_TERMS`).
Tile memory is reported per IPU (``sram:ipuK``), never summed. A tensor crossing to another IPU
is copied over the IPU-Link once, however many of that IPU's ops read it. The most loaded IPU
sets the pipeline cycle; a step is ``m`` cycles plus the pipeline fill and drain, the optimizer
update (at streaming-memory bandwidth when its state is off-chip) and the gradient reduction
over replicas, each once per step (``Plan.step_overheads_s``). docs/targets.md gives the terms
and their sources.

The lowering is split by concern, one file each, in the order `_lower` runs them:

- `common` (`lowering/ipu/common.py`): the Target's figures (`IpuFigures`), the run
  (`IpuRun`: micro-batches, replicas, training state) and the byte counts every step reads;
- `stages` (`lowering/ipu/stages.py`): the decoder layers laid out over IPUs as pipeline
  stages (`form_stages`);
- `supersteps` (`lowering/ipu/supersteps.py`): tiles per node and each node's superstep time
  on its IPU's lane, matmuls serialised under the matmul proportion (`place_nodes`);
- `memory` (`lowering/ipu/memory.py`): what each IPU's tiles hold (`tile_memory`), the units
  and the fit check, with the overflow message and the IPUs that would fit (`place_units`);
- `step` (`lowering/ipu/step.py`): what a step pays once: fill and drain, the optimizer,
  the gradient reduction (`add_step_costs`).

This package holds the `Lowering` itself (`IpuLowering`, `LOWERING`) and the options it reads
(`IpuOptions`), and re-exports `MEMORY_TERMS`, so ``from dabench_ir.lowering.ipu import
MEMORY_TERMS`` keeps working.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from dabench_ir.errors import UserError
from dabench_ir.lowering import Lowering, LoweringOptions, internal
from dabench_ir.lowering.ipu.common import FEED_LEVEL, IpuRun
from dabench_ir.lowering.ipu.memory import MEMORY_TERMS, TileMemory, place_units, tile_memory
from dabench_ir.lowering.ipu.stages import Pipeline, check_accumulation, form_stages
from dabench_ir.lowering.ipu.step import add_step_costs
from dabench_ir.lowering.ipu.supersteps import place_nodes
from dabench_ir.plan import Plan, Schedule

if TYPE_CHECKING:
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.targets import Target

__all__ = ["LOWERING", "MEMORY_TERMS", "IpuLowering", "IpuOptions"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class IpuOptions(LoweringOptions):
    """What the IPU lowering reads. Internal (no knob): ``steady_state`` overlaps
    consecutive steps in the pipeline (step time = the most loaded IPU)."""

    micro_batches: int | None
    ipus: int
    layers_per_ipu: tuple[int, ...] | None
    matmul_proportion: tuple[float, ...]
    optimizer_state: str
    replicated_tensor_sharding: bool
    half_partials: bool
    replicas: int | str | None
    steady_state: bool = internal(True)


class IpuLowering(Lowering):
    """Graphcore IPU: BSP supersteps on tiles, decoder layers pipelined over IPUs."""

    name = "ipu"
    kinds = ("ipu",)
    Options = IpuOptions
    feed = FEED_LEVEL  # tile SRAM feeds every superstep
    pipelines_itself = True  # decoder layers pipelined over `--ipus` IPUs by this lowering
    replicates_itself = True  # `--replicas` copies of that pipeline, the gradients all-reduced over them
    recompute_without: ClassVar[dict[str, str]] = {
        "op": "the IPU lowering models PopTorch's recomputation checkpoints, a whole layer (full) or its "
        "attention core (selective), with its own rule for what a layer stashes; op is torchtitan's per-op "
        "policy, which it would place as selective",
    }

    def check_options(self, target: Target, options: IpuOptions) -> None:
        """``--replicas auto`` is the WSE's on-wafer copies: the IPU's replicas are a number."""
        if options.replicas == "auto":
            raise UserError("--replicas auto: IPU replicas are data-parallel copies; give a number (e.g. --replicas 4)")

    def _lower(self, ctx: LoweringContext, target: Target, options: IpuOptions) -> Plan:
        run = IpuRun.build(ctx, target, options)
        pipeline = form_stages(ctx, options)
        plan = ctx.plan(
            target,
            options,
            Schedule.CONCURRENT,
            micro_batches=run.m,
            chips=pipeline.ipus * run.replicas,
            replicas=run.replicas,
            pipelined_steps=options.steady_state,
        )
        if pipeline.note:
            plan.notes.append(pipeline.note)
        check_accumulation(pipeline, run.m, ctx.batch, run.training, plan)
        times = place_nodes(run, pipeline, plan)
        plan.stats = replace(  # each replica's pipeline; allocation is of the pipeline's IPUs
            plan.stats, link_bytes=times.link_bytes * run.replicas, allocation_chips=pipeline.ipus
        )
        memory = tile_memory(run, pipeline, times.serials)
        place_units(run, pipeline, memory, times, plan)
        add_step_costs(run, pipeline, memory, times.cycle_s, plan)
        # what the tiles' SRAM feeds the nodes (the optimizer's among them), as their rows say: a
        # matmul's operands once per tile that needs them (`supersteps`), not each tensor once
        plan.traffic_bytes[run.fig.sram.name] = sum(np_.feed_bytes for np_ in plan.node_plans.values())
        _record_layout(run, pipeline, memory, times.cycle_s, plan)
        return plan


LOWERING = IpuLowering()


def _record_layout(run: IpuRun, pipeline: Pipeline, memory: TileMemory, cycle_s: float, plan: Plan) -> None:
    """Step 6: the plan's IPU summary (``plan.extra``): the layout, the stages, the pipeline
    cycle, where the optimizer state lives, and each IPU's tile memory by term."""
    plan.extra.update(
        {
            "ipus": pipeline.ipus,
            "layers_per_ipu": pipeline.counts,
            "pipeline_stages": pipeline.n_stages,
            "stages": [{"ipu": st.ipu, "layers": st.layers} for st in pipeline.stages],
            "cycle_s": cycle_s,
            "optimizer_state": ("off-chip (streaming memory)" if memory.offchip else "on-chip")
            if run.training
            else None,
            "memory_terms": {
                f"ipu{k}": {name: int(v) for name, v in t.items()} for k, t in sorted(memory.terms.items())
            },
        }
    )
