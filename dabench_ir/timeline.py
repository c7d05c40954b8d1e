"""`Timeline`: when each node ran, on which unit, and what bound it.

The emulator (dataflow targets, GPUs) and the measured path (onnxruntime) both produce a
Timeline, so reports, metrics and comparisons never ask where one came from.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Bound", "NodeTiming", "Timeline", "classify_bound"]


class Bound(enum.StrEnum):
    """What limits a node's time."""

    COMPUTE = "compute"
    MEMORY = "memory"
    COMMUNICATION = "communication"
    OVERHEAD = "overhead"  # launch, sync, reconfiguration: fixed costs, not work


def classify_bound(
    flops: float, feed_bytes: float, ridge: float, *, work_s: float, comm_s: float = 0.0, overhead_s: float = 0.0
) -> Bound:
    """What bounds a node: overhead or communication when that dominates its time, else
    compute when its intensity (FLOPs per byte at the level that feeds it) is at or above
    the ridge point, else memory.

    The one bound rule of dabench-ir: lowerings classify every placed node with it (through
    `place_node`), and the measured path classifies each measured node with it.
    ``work_s`` is the node's compute or memory time, ``comm_s`` its link/exchange time,
    ``overhead_s`` its fixed cost (launch, sync).
    """
    if overhead_s > max(work_s, comm_s) or (flops == 0 and feed_bytes == 0 and comm_s == 0):
        return Bound.OVERHEAD
    if comm_s > work_s:
        return Bound.COMMUNICATION
    if feed_bytes == 0:
        return Bound.COMPUTE
    return Bound.COMPUTE if flops / feed_bytes >= ridge else Bound.MEMORY


@dataclass(frozen=True, slots=True)
class NodeTiming:
    """One node's slot on the timeline, in seconds from the start of the step."""

    node: str
    unit: str
    start: float
    end: float
    bound: Bound | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class Timeline:
    """Per node: unit, start, end, bound; per unit: busy time.

    ``step_time_s`` is the time of one step (one batch) in steady state: on a target that
    pipelines consecutive steps (WSE, IPU pipelines) it is the period, the bottleneck lane's
    time, shorter than one step's own ``latency_s`` (first input to last output); elsewhere
    the two are equal. Both include the costs no node owns (reconfiguration, sync, host).
    ``samples_per_step`` is the batch the step processes.
    """

    nodes: dict[str, NodeTiming]
    step_time_s: float
    samples_per_step: int = 1
    source: str = "emulated"  # or "measured"
    latency_s: float | None = None  # one step alone (None: as step_time_s, steps do not overlap)
    unit_busy_s: dict[str, float] = field(default_factory=dict)
    overheads_s: dict[str, float] = field(default_factory=dict)  # named step costs no node owns
    # Added for pipelined emulation (all optional; a measured timeline leaves them empty).
    # With micro-batches a node runs several times per step: its NodeTiming spans its first
    # start to its last end, ``node_busy_s`` is the time it really ran, ``slices`` each run.
    micro_batches: int = 1
    node_busy_s: dict[str, float] = field(default_factory=dict)
    slices: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    lanes: dict[str, str] = field(default_factory=dict)  # node -> lane inside its unit
    streamed_rows: dict[str, int] = field(default_factory=dict)  # node -> the rows it takes one after another (> 1)
    unit_spans: dict[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def from_timings(
        cls,
        timings: Iterable[NodeTiming],
        *,
        step_time_s: float | None = None,
        samples_per_step: int = 1,
        source: str = "emulated",
        overheads_s: Mapping[str, float] | None = None,
    ) -> Timeline:
        """Build a Timeline, deriving unit busy time and (by default) the step time."""
        nodes = {t.node: t for t in timings}
        busy: dict[str, float] = {}
        for t in nodes.values():
            busy[t.unit] = busy.get(t.unit, 0.0) + t.duration
        makespan = max((t.end for t in nodes.values()), default=0.0)
        return cls(
            nodes=nodes,
            step_time_s=makespan if step_time_s is None else step_time_s,
            samples_per_step=samples_per_step,
            source=source,
            unit_busy_s=busy,
            overheads_s=dict(overheads_s or {}),
        )

    @property
    def pipelined(self) -> bool:
        """Consecutive steps overlap: the step time is a period, shorter than one step's latency."""
        return self.latency_s is not None and self.latency_s > self.step_time_s * (1 + 1e-12)

    @property
    def one_step_s(self) -> float:
        """One step alone, first input to last output (the latency of a request)."""
        return self.step_time_s if self.latency_s is None else self.latency_s

    @property
    def makespan_s(self) -> float:
        return max((t.end for t in self.nodes.values()), default=0.0)

    @property
    def throughput_samples_per_s(self) -> float | None:
        return self.samples_per_step / self.step_time_s if self.step_time_s > 0 else None

    def duration(self, node: str) -> float | None:
        timing = self.nodes.get(node)
        return None if timing is None else timing.duration

    def busy(self, node: str) -> float | None:
        """Time the node really ran in the step (its span when it ran once)."""
        if node in self.node_busy_s:
            return self.node_busy_s[node]
        return self.duration(node)

    def busy_times(self) -> dict[str, float]:
        """`busy` of every node it has a time for (in ``nodes`` or ``node_busy_s``): one walk for
        the many nodes of a report, instead of a call per node."""
        times = {name: t.end - t.start for name, t in self.nodes.items()}  # each span, `NodeTiming.duration`
        times.update(self.node_busy_s)
        return times
