"""`Plan`: what a lowering produces — units, the nodes placed on each, and planned times.

A Plan is everything `emulate` needs: which unit (and which lane inside it) runs each
node, how long one micro-batch of the node takes there, how the units are scheduled
(concurrently as a spatial pipeline, or one after another), and the gaps between them.
When the workload does not fit the target, ``fits`` is False and ``failure`` says why:
a result, not an exception.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from dabench_ir.timeline import Bound

if TYPE_CHECKING:
    from dabench_ir.ir import DType
    from dabench_ir.lowering import LoweringOptions
    from dabench_ir.targets import Target

__all__ = [
    "COLLECTIVES",
    "COMMUNICATION_ROWS",
    "GRADIENT_REDUCE",
    "PIPELINE_BOUNDARIES",
    "PIPELINE_FILL_DRAIN",
    "RESOURCE_KEYS",
    "Failure",
    "NodePlan",
    "Plan",
    "PlanStats",
    "Schedule",
    "Unit",
    "UnitStats",
    "row_bound",
]

GRADIENT_REDUCE = "gradient_reduce"
"""The step row in which a lowering that places its own replicas (`Lowering.replicates_itself`, the
IPU's) all-reduces their gradients: what the scaling stage reads as such a point's communication."""
COLLECTIVES = "collectives"
"""The step overhead of a tensor- or data-parallel run's collectives beyond its chip's own step."""
PIPELINE_BOUNDARIES = "pipeline_boundaries"
"""The step overhead of a pipeline-parallel run's activations crossing its stage boundaries."""
COMMUNICATION_ROWS = frozenset({GRADIENT_REDUCE, COLLECTIVES, PIPELINE_BOUNDARIES})
"""The step overheads that are data moving between chips: bound by communication (`row_bound`)."""


def row_bound(name: str) -> str:
    """The bound of a step-overhead row no node owns: ``communication`` for data moving between chips
    (`COMMUNICATION_ROWS`), else ``overhead`` (host time, reconfiguration, stalls, fill and drain)."""
    return "communication" if name in COMMUNICATION_ROWS else "overhead"


PIPELINE_FILL_DRAIN = "pipeline_fill_drain"
"""The step overhead of a pipeline's ramp up and down, the stages idle while the first micro-batch
fills them and the last drains them: a step that drains before the next (a training step's weight
update; chips in a pipeline-parallel run) pays it beside its busiest stage's work, and a step run
alone (its latency) holds it in its makespan already."""


class Schedule(enum.StrEnum):
    """How a plan's units run relative to each other."""

    CONCURRENT = "concurrent"  # all units at once (WSE regions, IPU stages, one GPU stream)
    SEQUENTIAL = "sequential"  # one unit after another (RDU sections, WSE streamed layers)


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a plan cannot run: the reason and, for capacity failures, bytes needed and held.

    ``remedy``: the option values the reason names as the fix, when the lowering can size one
    (``(("ipus", 55),)`` for "use more IPUs (--ipus 55 or more)"), by option field name. It sizes
    what the failure is about, not a promise that the change fits (the run it names can fail on
    something else, or fall short where the lowering can only bound it): the fitting search
    (`dabench_ir.advice.fitting_knob`) places it first and follows the remedy of what it places.
    """

    reason: str
    needed_bytes: int | None = None
    capacity_bytes: int | None = None
    remedy: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The report's ``failure``; ``remedy`` only when the lowering sized one."""
        out: dict[str, Any] = {
            "reason": self.reason,
            "needed_bytes": self.needed_bytes,
            "capacity_bytes": self.capacity_bytes,
        }
        if self.remedy:
            out["remedy"] = dict(self.remedy)
        return out


@dataclass(frozen=True, slots=True)
class UnitStats:
    """What a lowering states about one unit that later stages read (metrics, validation, the report).

    Every field is optional: a lowering sets the ones its target has. The report writes the
    set ones into ``units[].resources`` under the keys of `RESOURCE_KEYS` (the report contract).
    """

    held_units: float | None = None
    """Compute units the unit holds, all its copies (WSE PEs): metrics weigh each lane's balance by them."""
    load_imbalance: float | None = None
    """Mean / max busy time of the unit's concurrent stages (an RDU section's pipeline), 0 to 1."""
    pmu_allocation: float | None = None
    """Share of the chip's memory units (RDU PMUs) the unit holds while it runs, 0 to 1."""
    tile_utilisation: float | None = None
    """Busy share of the unit's tiles over the step (an IPU), 0 to 1."""
    pes: float | None = None
    """Processing elements one copy of the unit spans (WSE regions, layers, I/O, buffers)."""
    utilisation: float | None = None
    """Busy share of a WSE region's period: its work over work plus per-row fixed time, 0 to 1."""
    compute_samples_per_s: float | None = None
    """Steady-state rate of the slowest kernel, all copies, no per-step costs (the WSE I/O region)."""
    transmission_samples_per_s: float | None = None
    """``compute_samples_per_s`` under the input-transmission ceiling (the WSE I/O region)."""
    feed_bytes: float | None = None
    """Bytes the unit moves at the plan's feed level over its whole span, its nodes running as one
    pipeline while the traffic streams (an RDU section's DDR traffic, a streamed WSE layer's
    weights): each node holds the share of it that falls in its time (`metrics.node_feed_intensity`)."""

    def to_resources(self) -> dict[str, float]:
        """The set fields under their report keys (`RESOURCE_KEYS`), as ``units[].resources`` holds them."""
        out: dict[str, float] = {}
        for name, key in _RESOURCE_ITEMS:
            value = getattr(self, name)
            if value is not None:
                out[key] = value
        return out


RESOURCE_KEYS: dict[str, str] = {f.name: f.name for f in fields(UnitStats)} | {"held_units": "units"}
"""`UnitStats` field -> its key in the report's ``units[].resources`` (the schema's names)."""
_RESOURCE_ITEMS = tuple(RESOURCE_KEYS.items())  # field order; `fields()` per unit was 27 us of an RDU O0 plan's 2,500


@dataclass(slots=True)
class Unit:
    """A placed piece of hardware holding some nodes.

    ``kind``: wse_region | wse_layer | rdu_section | ipu | gpu_stream | cpu.
    ``allocation``: share of the target's compute units this unit holds while it runs,
    relative to everything the plan uses (units that run concurrently sum to at most 1).
    ``gap_before_s``: fixed cost paid before the unit starts (sequential schedules:
    reconfiguration, layer switch). ``min_time_s``: the unit lasts at least this long
    (e.g. its DDR traffic at DDR bandwidth), whatever its nodes take. ``node_s``: a node's
    time per micro-batch in this unit, for nodes that run in several units (an RDU node's
    forward and backward sections); nodes not in it take their NodePlan's time.
    ``stats``: what later stages read about the unit (`UnitStats`). ``resources``: the
    lowering's own detail (tiles, bytes, per-phase times), shown in the report's
    ``units[].resources`` and read by no other stage.
    """

    id: str
    kind: str
    nodes: list[str] = field(default_factory=list)
    resources: dict[str, float] = field(default_factory=dict)
    stats: UnitStats = field(default_factory=UnitStats)
    allocation: float = 0.0
    gap_before_s: float = 0.0
    gap_kind: str = "reconfiguration"  # the overhead row its gap is reported under
    min_time_s: float = 0.0
    node_s: dict[str, float] = field(default_factory=dict)

    def report_resources(self) -> dict[str, float]:
        """The report's ``units[].resources``: the lowering's detail and the stats under their keys."""
        return {**self.resources, **self.stats.to_resources()}


@dataclass(slots=True)
class NodePlan:
    """One node's placement and planned cost for a whole step (all micro-batches).

    ``per_micro_batch_s`` is what one micro-batch of the node occupies its lane for.
    ``feed_level``/``feed_bytes`` are the memory level that feeds the node on this target
    and the bytes it moves there (the roofline's intensity denominator).
    """

    node: str
    unit: str
    lane: str
    per_micro_batch_s: float
    flops: int = 0
    bytes: int = 0
    feed_level: str = ""
    feed_bytes: int = 0
    compute_s: float = 0.0
    memory_s: float = 0.0
    comm_s: float = 0.0
    overhead_s: float = 0.0
    bound: Bound | None = None
    allocation: float = 0.0  # share of the target's units the node uses while it runs
    note: str = ""
    rows: int = 1
    """The rows (a sample's token rows) a run takes in one after another as they arrive: above 1, it
    starts on its producers' first rows, ends no sooner than one of its rows after their last, and
    passes each row on as it makes it, its consumers and the next run on its lane starting one row in
    (a WSE region interleaves its nodes' rows: `dabench_ir.emulate`); 1: it waits for whole runs."""
    holds: bool = False
    """With ``rows``: it emits its rows only once its whole run is done (a WSE attention kernel)."""


@dataclass(frozen=True, slots=True)
class PlanStats:
    """What a lowering states about the whole plan that other stages (and tests) read.

    Every field is optional; the lowering's own detail stays in ``Plan.extra``.
    """

    mode: str | None = None
    """The WSE execution mode the lowering chose: ``pipelined`` or ``streaming`` (None elsewhere)."""
    step_s: float | None = None
    """WSE pipelined: one step, per-step overheads included (how ``--replicas auto`` ranks copies)."""
    pipeline_rate_samples_per_s: float | None = None
    """WSE pipelined: the slowest kernel's steady-state rate, all copies, no per-step costs."""
    transmission_rate_samples_per_s: float | None = None
    """WSE pipelined: samples per second the system I/O link can feed (inf: no inputs to send)."""
    micro_batch: int | None = None
    """WSE streaming: samples in one micro-batch streamed through each layer."""
    max_layers_at_micro_batch: int | None = None
    """WSE streaming: layers whose checkpoints fit in SRAM at that micro-batch (None: no per-layer state)."""
    weights_home: str | None = None
    """Where the plan keeps the weights, in words (None: the scenario infers it from memory_bytes)."""
    kv_cache_home: str | None = None
    """Where the plan keeps a KV cache, in words (None: the scenario infers it)."""
    replicas_share: str | None = None
    """A plan of several replicas placed by its lowering (the IPU's): the work one replica alone would
    do that the replicas split among them, in words (replicated tensor sharding: each updates 1/n of
    the weights), None when each does all of it. The mechanism that lets data parallelism
    run faster than linear (`dabench_ir.verify`'s speedup check reads it off the scale point)."""
    link_bytes: float = 0.0
    """Bytes a plan that spans several devices moves over their chip-to-chip links per step
    (an IPU pipeline's stage boundaries); 0 on one device."""
    allocation_chips: float = 1.0
    """The chips' worth of compute units a unit's or node's ``allocation`` is a share of: the
    compiled tiles' share of an RDU (``--tiles 4`` of 8: 0.5), the IPUs of one pipeline; 1 elsewhere.
    The peak of the units a node holds is the chip's peak times ``allocation · allocation_chips``."""


@dataclass(slots=True)
class Plan:
    """The lowering of one graph onto one target."""

    target: Target
    options: LoweringOptions  # the lowering's own Options subclass
    precision: DType
    schedule: Schedule
    units: list[Unit] = field(default_factory=list)
    node_plans: dict[str, NodePlan] = field(default_factory=dict)
    fits: bool = True
    failure: Failure | None = None
    micro_batches: int = 1
    batch: int = 1  # the graph's batch: samples one replica runs per step (dabench_ir.run)
    chips: int = 1  # chips the plan spans (IPUs in a pipeline, times its replicas)
    replicas: int = 1  # data-parallel copies of the graph (WSE on-wafer replicas, IPU replicas)
    pipelined_steps: bool = False  # consecutive steps overlap: step time = bottleneck lane
    memory_bytes: dict[str, int] = field(default_factory=dict)  # resident bytes per memory name
    traffic_bytes: dict[str, int] = field(default_factory=dict)  # bytes moved per step per memory name
    # serial costs of a step that no node owns (host time, optimizer update streamed from
    # off-chip memory, gradient reduction): emulate adds them to the step time, one row each
    step_overheads_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unattributed: list[str] = field(default_factory=list)
    stats: PlanStats = field(default_factory=PlanStats)  # what other stages read (`PlanStats`)
    extra: dict[str, Any] = field(default_factory=dict)  # the lowering's own detail, read by no other stage

    @property
    def samples_per_step(self) -> int:
        """Samples one step processes: the graph's batch on every data-parallel copy."""
        return self.batch * self.replicas

    def fail(
        self,
        reason: str,
        needed: float | None = None,
        capacity: float | None = None,
        *,
        remedy: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        """Mark the plan as not fitting (the first failure is kept; ``remedy``: `Failure.remedy`)."""
        self.fits = False
        if self.failure is None:
            self.failure = Failure(
                reason=reason,
                needed_bytes=None if needed is None else int(needed),
                capacity_bytes=None if capacity is None else int(capacity),
                remedy=remedy,
            )
