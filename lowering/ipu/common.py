"""What every step of the IPU lowering reads: the Target's figures, the run, and byte counts.

`IpuFigures` holds the hardware figures read from the Target once per plan (nothing here
hard-codes one); `IpuRun` adds the run's micro-batches, replicas and training state. The
helpers size activations as the IPU holds them and read a node's forward cost and the
trained parameters, for `stages`, `supersteps`, `memory` and `step` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dabench_ir.errors import TargetError
from dabench_ir.passes import meta
from dabench_ir.passes.training import FORWARD_COST

if TYPE_CHECKING:
    from dabench_ir.ir import Cost, Node
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.ipu import IpuOptions
    from dabench_ir.passes.meta import TrainingRecord
    from dabench_ir.targets import Link, MemoryLevel, Target

__all__ = ["FEED_LEVEL", "WHO", "IpuFigures", "IpuRun", "act_bytes", "forward_cost", "numel", "trained_params"]

WHO = "ipu"
"""The lowering's name in missing-field messages (``needed by the ipu lowering``)."""

FEED_LEVEL = "on-chip"
"""The memory level that feeds every superstep: tile SRAM (`IpuLowering.feed_level`)."""

_PRECISIONS = ("fp16", "fp32")  # 16-bit AMP and vector lanes serve fp16 and bf16 alike


@dataclass(frozen=True, slots=True, kw_only=True)
class IpuFigures:
    """The IPU's figures as the lowering reads them from the Target (docs/targets.md); rates
    keyed by ``fp16``/``fp32`` (`supersteps.precision_key`)."""

    tiles: int
    sram: MemoryLevel  # tile SRAM, the feed level
    capacity: float  # one IPU's tile SRAM, bytes
    clock: float  # tile clock, Hz
    grain: float  # arch.min_grain_flops: least work worth a tile
    exchange_bw: float  # arch.exchange_bytes_per_s
    tile_sram: float  # one tile's memory, bytes
    code_per: float  # arch.code_bytes_per_tile_op
    program: float  # program memory over all tiles, bytes
    gamma: float  # arch.matmul_temp_per_operand_byte
    eta: dict[str, float]  # arch.matmul_efficiency_<prec>
    fp32_partials_share: float  # arch.amp_share_fp32_partials: the 16-bit AMP rate kept with fp32 partials
    amp_bytes: (
        float  # arch.amp_bytes_per_cycle: tile-memory bytes an AMP instruction's loads and store move (0: none given)
    )
    lanes: dict[str, float]  # arch.vector_elems_per_cycle_<prec>
    special: dict[str, float]  # arch.special_ops_per_cycle_<prec>
    amp_peak: dict[str, float]  # one tile's share of the AMP peak, FLOP/s
    sync: float  # overheads.sync_s, one BSP sync
    vertex_s: float  # arch.vertex_overhead_cycles over the clock: a vertex's launch on each tile it runs on
    link: Link | None  # the IPU-Link
    host: Link | None  # the host's path to the IPUs (the IPU-Gateway): host data streams
    stream: MemoryLevel | None  # streaming (off-chip) memory, where the target has one
    sram_bw: float
    ridge: float  # at the plan's precision against tile SRAM

    @classmethod
    def read(cls, target: Target, ctx: LoweringContext) -> IpuFigures:
        """The figures of ``target``; a missing required field raises naming it (``needed by the ipu lowering``)."""
        tiles = target.num_units
        sram = target.memory(FEED_LEVEL)
        capacity = sram.capacity_bytes
        return cls(
            tiles=tiles,
            sram=sram,
            capacity=capacity,
            clock=_clock(target),
            grain=target.arch_value("min_grain_flops", needed_by=WHO),
            exchange_bw=target.arch_value("exchange_bytes_per_s", needed_by=WHO),
            tile_sram=target.arch_value("tile_sram_bytes", capacity / tiles),
            code_per=target.arch_value("code_bytes_per_tile_op", 0.0),
            program=target.arch_value("program_bytes_per_tile", needed_by=WHO) * tiles,
            gamma=target.arch_value("matmul_temp_per_operand_byte", needed_by=WHO),
            eta={p: target.arch_value(f"matmul_efficiency_{p}", needed_by=WHO) for p in _PRECISIONS},
            fp32_partials_share=target.arch_value("amp_share_fp32_partials", 1.0),
            amp_bytes=target.arch_value("amp_bytes_per_cycle", 0.0),
            lanes={p: target.arch_value(f"vector_elems_per_cycle_{p}", needed_by=WHO) for p in _PRECISIONS},
            special={p: target.arch_value(f"special_ops_per_cycle_{p}", needed_by=WHO) for p in _PRECISIONS},
            amp_peak={p: target.peak_flops(p) / tiles for p in _PRECISIONS},
            sync=target.overhead_value("sync_s", needed_by="ipu"),
            vertex_s=target.arch_value("vertex_overhead_cycles", 0.0) / _clock(target),
            link=target.topology.intra if target.topology is not None else target.link(),
            host=target.link("gateway"),  # the host's path to the IPUs (an IPU-Gateway), by its name
            stream=target.memory("off-chip") if target.has_memory("off-chip") else None,
            sram_bw=sram.bandwidth_bytes_per_s,
            ridge=target.ridge_point(ctx.precision, sram),
        )


def _clock(target: Target) -> float:
    """The IPU's clock (``compute.clock_hz``): its rates are per tile per cycle, so it is required
    (it was worked out from the fp16 peak at an unsourced 128 FLOP a tile-cycle where missing)."""
    if target.clock is None:
        raise TargetError(f"target file {target.origin}: missing field compute.clock_hz (needed by the {WHO} lowering)")
    return float(target.clock.value)


@dataclass(frozen=True, slots=True)
class IpuRun:
    """One plan's inputs as every step reads them: the context, the Target and its figures, the
    options, the micro-batches ``m`` (one step's batch over them), the data-parallel
    ``replicas`` and the training state (None: inference); ``layer_figures``: each decoder layer's
    figures that read the run's options (matmul temporaries, code tiles), by (figure, layer index),
    worked out once a run (`memory.most_of_layers`: every layout `memory.ipus_to_fit` tries asks
    again; the figures of the graph alone are the context's, `memory.GraphFigures`)."""

    ctx: LoweringContext
    target: Target
    fig: IpuFigures
    options: IpuOptions
    m: int
    replicas: int
    train: TrainingRecord | None
    layer_figures: dict[tuple[str, int], float] = field(default_factory=dict)

    @classmethod
    def build(cls, ctx: LoweringContext, target: Target, options: IpuOptions) -> IpuRun:
        """The run of ``options`` on ``target`` (whose checks, `IpuLowering.check_options`, it passed)."""
        fig = IpuFigures.read(target, ctx)
        m = options.micro_batches or ctx.batch
        return cls(ctx, target, fig, options, m, int(options.replicas or 1), meta.training_state(ctx.graph))

    @property
    def training(self) -> bool:
        """Whether the graph is a training step (the training pass ran)."""
        return self.train is not None

    @property
    def recompute(self) -> bool:
        """Whether training recomputes each layer in backward (its stash: the layer's input)."""
        return self.train is not None and self.train.recompute


def forward_cost(node: Node, ctx: LoweringContext) -> Cost:
    """The node's forward cost when the training pass split it, else its whole cost."""
    fwd = node.meta.get(FORWARD_COST)
    return fwd if fwd is not None else ctx.costs[node.name]


def act_bytes(ctx: LoweringContext, name: str) -> float:
    """Bytes of an activation as the IPU holds it: a 16-bit plan keeps every float activation in
    16 bits (Graphcore's examples run ``model.half()``: norms and softmax too), whatever the
    graph's own dtype for the ops a framework keeps in fp32."""
    value = ctx.graph.values.get(name)
    size = ctx.value_bytes(name)
    if value is None or not value.type.dtype.is_float or ctx.precision.itemsize >= value.type.dtype.itemsize:
        return float(size)
    return size * ctx.precision.itemsize / value.type.dtype.itemsize


def numel(ctx: LoweringContext, name: str) -> int:
    """Elements of value ``name`` (0 when it is absent or untyped)."""
    value = ctx.graph.values.get(name)
    if value is None or not value.type.dtype.itemsize:  # absent, or an untyped value (no byte size)
        return 0
    return ctx.value_bytes(name) // value.type.dtype.itemsize


def trained_params(ctx: LoweringContext) -> int:
    """Parameters the training pass's optimizer updates (0 for inference or a symbolic shape)."""
    train = meta.training_state(ctx.graph)
    return int(train.params or 0) if train is not None else 0
