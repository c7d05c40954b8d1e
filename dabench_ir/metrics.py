"""Level-1 metrics from a Plan and its Timeline: allocation, load imbalance, efficiency, roofline.

- allocation ratio: share of the target's compute units the workload holds; summed over
  units that run at once, time-weighted over units that run one after another.
- load imbalance LI: mean / max busy time of the subtasks that run concurrently (WSE
  regions, RDU stages inside a section, IPU stages); time-weighted over sections.
- compute efficiency: achieved FLOP/s over peak FLOP/s at the precision used.
- per node: intensity (FLOPs per byte at the memory level that feeds it on this target)
  and that level (`node_feed_intensity`). Where a unit runs its nodes as one pipeline (an
  RDU section) the unit's feed traffic streams over the whole unit while the lowering shares
  the unit's time among its nodes: a node's feed bytes are then its time share of the
  unit's traffic, so its roofline point (FLOPs / busy time against that intensity) never
  claims more bandwidth than the feed level has. A node's bound class is not recomputed here: the lowering classified it
  (`classify_bound`), the Plan and the Timeline carry it.
- prediction error: predicted against measured step (and node) times.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dabench_ir.ir import Graph
from dabench_ir.plan import Plan, Schedule
from dabench_ir.targets import Target
from dabench_ir.timeline import Timeline

__all__ = ["MemoryUse", "Metrics", "compute_metrics", "node_feed_intensity", "prediction_error", "roofline_bound"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryUse:
    """Resident bytes at one memory level against its capacity."""

    bytes: int
    capacity_bytes: int
    fraction: float
    level: str  # on-chip (the shared SRAM) or off-chip (the global DRAM): `Target.memory`

    def to_dict(self) -> dict[str, float | str]:
        return {
            "bytes": self.bytes,
            "capacity_bytes": self.capacity_bytes,
            "fraction": self.fraction,
            "level": self.level,
        }


@dataclass(slots=True)
class Metrics:
    allocation_ratio: float
    load_imbalance: float
    compute_efficiency: float
    achieved_flops_per_s: float
    peak_flops_per_s: float
    total_flops: int
    step_time_s: float
    memory_use: dict[str, MemoryUse] = field(default_factory=dict)
    node_intensity: dict[str, float | None] = field(default_factory=dict)
    node_feed_level: dict[str, str] = field(default_factory=dict)
    node_feed_bytes: dict[str, float] = field(default_factory=dict)  # bytes behind node_intensity
    ridge_point: dict[str, float] = field(default_factory=dict)  # per memory level, at the precision used
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocation_ratio": self.allocation_ratio,
            "load_imbalance": self.load_imbalance,
            "compute_efficiency": self.compute_efficiency,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "peak_flops_per_s": self.peak_flops_per_s,
            "memory_use": {k: v.to_dict() for k, v in self.memory_use.items()},
            **self.extra,
        }


def _ratio(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    if not values:
        return 1.0
    return (sum(values) / len(values)) / max(values)


def _clamp(x: float, floor: float) -> float:
    return min(1.0, max(floor, x))


def compute_metrics(graph: Graph, plan: Plan, timeline: Timeline, target: Target) -> Metrics:
    """Metrics of one step; ``timeline`` may be emulated or measured (nodes not in it are skipped):
    the allocation ratio, the load imbalance, the efficiency, the memory use per level, the roofline
    per node and the lowering's own figures (`_plan_extra`)."""
    prec = plan.precision
    sequential = plan.schedule is Schedule.SEQUENTIAL
    # a sequential plan's units run one after another: each weighs by its span in the step
    spans = {u.id: timeline.unit_spans.get(u.id) for u in plan.units}
    weights = {uid: (s[1] - s[0]) if s else 0.0 for uid, s in spans.items()}
    allocation = _clamp(_allocation(plan, weights), 1.0 / max(1, target.num_units * plan.chips))
    li = _clamp(_load_imbalance(plan, timeline, weights), 1e-12)
    node_plans = plan.node_plans
    # every data-parallel copy (IPU replicas, WSE copies on the wafer) runs the graph's work
    total_flops = plan.replicas * sum(node_plans[n].flops for n in timeline.nodes if n in node_plans)
    step = timeline.step_time_s
    achieved = total_flops / step if step > 0 else 0.0
    peak = target.peak_flops(prec) * plan.chips
    # roofline per node (the bound class is the plan's, carried by the timeline)
    ridges = {m.level: target.ridge_point(prec, m) for m in target.memories}
    intensity, feed, feed_bytes = node_feed_intensity(plan, timeline)
    extra: dict[str, Any] = {}
    region = roofline_bound(plan, target, feed, feed_bytes)
    if region is not None:
        extra["roofline_bound"] = region
    extra.update(_plan_extra(plan, weights if sequential else None))
    return Metrics(
        allocation_ratio=allocation,
        load_imbalance=li,
        compute_efficiency=achieved / peak if peak > 0 else 0.0,
        achieved_flops_per_s=achieved,
        peak_flops_per_s=peak,
        total_flops=total_flops,
        step_time_s=step,
        memory_use=_memory_use(plan, target),
        node_intensity=intensity,
        node_feed_level=feed,
        node_feed_bytes=feed_bytes,
        ridge_point={k: v for k, v in ridges.items() if k in ("on-chip", "off-chip")},
        extra=extra,
    )


def _allocation(plan: Plan, weights: Mapping[str, float]) -> float:
    """The share of the chip's units the plan holds: a sequential plan's units weighted by their
    spans, a concurrent plan's summed."""
    if plan.schedule is not Schedule.SEQUENTIAL:
        return sum(u.allocation for u in plan.units)
    total = sum(weights.values())
    return sum(u.allocation * weights[u.id] for u in plan.units) / total if total > 0 else 0.0


def _load_imbalance(plan: Plan, timeline: Timeline, weights: Mapping[str, float]) -> float:
    """Load imbalance over the lanes that run concurrently: within each unit of a sequential plan
    (weighted by the unit's span; the lowering's own stage balance where every unit has one), over
    every unit of a concurrent one, its lanes together (a unit serving two places in a pipeline runs
    both in each period), weighted by the compute units each holds where every unit declares them
    (WSE regions of very different sizes)."""
    times = timeline.busy_times()
    sequential = plan.schedule is Schedule.SEQUENTIAL
    lanes_of: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    node_plans, lane_names = plan.node_plans, timeline.lanes
    for name in timeline.nodes:
        np_ = node_plans.get(name)
        if np_ is None:
            continue
        if sequential:
            lanes_of[np_.unit][lane_names.get(name, np_.lane)] += times[name] or 0.0
        else:
            lanes_of["all"][np_.unit] += times[name] or 0.0
    if sequential:
        num = den = 0.0
        for uid, lanes in lanes_of.items():
            w = weights.get(uid, 0.0) or sum(lanes.values())
            num += _ratio(list(lanes.values())) * w
            den += w
        li = num / den if den > 0 else 1.0
        stage_li = [u.stats.load_imbalance for u in plan.units]
        if plan.units and all(x is not None for x in stage_li):
            # the lowering knows each section's stage balance (one pipeline per section): time-weight it
            total = sum(weights.values())
            li = sum(x * weights[u.id] for u, x in zip(plan.units, stage_li, strict=True)) / total if total > 0 else li
        return li
    li = _ratio(list(lanes_of["all"].values())) if lanes_of else 1.0
    held = {u.id: u.stats.held_units for u in plan.units if u.stats.held_units is not None}
    lanes = lanes_of.get("all", {})
    if lanes and all(lane in held for lane in lanes) and max(lanes.values()) > 0:
        li = sum(held[lane] * b for lane, b in lanes.items()) / (max(lanes.values()) * sum(held[x] for x in lanes))
    return li


def _memory_use(plan: Plan, target: Target) -> dict[str, MemoryUse]:
    """Each memory level's use against its capacity (a ``name:sub`` key is one device's, else every
    chip's together)."""
    out: dict[str, MemoryUse] = {}
    for key, used in plan.memory_bytes.items():
        base, _, sub = key.partition(":")
        if not target.has_memory(base):
            continue
        mem = target.memory(base)
        cap = mem.capacity_bytes * (1 if sub else plan.chips)
        out[key] = MemoryUse(
            bytes=int(used), capacity_bytes=int(cap), fraction=used / cap if cap else 0.0, level=mem.level
        )
    return out


def _plan_extra(plan: Plan, weights: Mapping[str, float] | None) -> dict[str, Any]:
    """What a lowering's units add: the PMU allocation (span-weighted) and the highest PCU allocation
    of a sequential plan (``weights``: its units' spans), the IPU tiles' utilisation, the traffic."""
    extra: dict[str, Any] = {}
    pmu = [u.stats.pmu_allocation for u in plan.units if u.stats.pmu_allocation is not None]
    if pmu and weights is not None:
        total = sum(weights.values())
        extra["pmu_allocation"] = (
            sum((u.stats.pmu_allocation or 0.0) * weights[u.id] for u in plan.units) / total if total > 0 else 0.0
        )
        extra["highest_pcu_allocation"] = max(u.allocation for u in plan.units)
    util = [u.stats.tile_utilisation for u in plan.units if u.stats.tile_utilisation is not None]
    if util:
        extra["tile_utilisation"] = util
    if plan.traffic_bytes:
        extra["traffic_bytes"] = dict(plan.traffic_bytes)
    return extra


def roofline_bound(plan: Plan, target: Target, feed: Mapping[str, str], feed_bytes: Mapping[str, float]) -> str | None:
    """Where the run sits on its target's roofline, as a roofline chart places one point per model:
    ``memory`` when its nodes' feed bytes take longer at their memories' bandwidth than their FLOPs
    take at peak (left of the ridge), else ``compute``. It says what bounds the work, not the step:
    the host, a pipeline drain or a stall are not in it (None without FLOPs or feed bytes)."""
    peak = target.peak_flops(plan.precision)
    memory_s = compute_s = 0.0
    node_plans = plan.node_plans
    bandwidth: dict[str, Any] = {}  # feed level -> its memory's bandwidth (None: the target has none), once a level
    for name, nbytes in feed_bytes.items():
        np_ = node_plans.get(name)
        if np_ is None or not np_.flops:
            continue
        compute_s += np_.flops / peak
        level = feed.get(name)
        if nbytes and level:
            if level not in bandwidth:
                bandwidth[level] = target.memory(level).bandwidth_bytes_per_s if target.has_memory(level) else None
            if bandwidth[level] is not None:
                memory_s += nbytes / bandwidth[level]
    if compute_s <= 0 or memory_s <= 0:
        return None
    return "memory" if memory_s > compute_s else "compute"


def node_feed_intensity(
    plan: Plan, timeline: Timeline
) -> tuple[dict[str, float | None], dict[str, str], dict[str, float]]:
    """Per timed node: its intensity at the level that feeds it, that level, and the feed bytes.

    A node's feed bytes are the lowering's (``NodePlan.feed_bytes``), except in a unit that runs
    its nodes as one pipeline while its traffic streams (``UnitStats.feed_bytes``: an RDU
    section's DDR traffic, a streamed WSE layer's weights): there the traffic flows over the
    unit's whole span (its stall included), so a node holds the share that falls in its own time
    there, and no node moves bytes faster than the level's bandwidth. Intensity = FLOPs / feed
    bytes (None without bytes). The one place a node's roofline intensity is computed.
    """
    feed: dict[str, str] = {}
    nbytes: dict[str, float] = {}
    node_plans = plan.node_plans
    for name in timeline.nodes:
        np_ = node_plans.get(name)
        if np_ is not None:
            feed[name] = np_.feed_level
            nbytes[name] = float(np_.feed_bytes)
    m = max(1, int(plan.micro_batches or 1))
    streamed: dict[str, float] = {}
    for unit in plan.units:
        span = timeline.unit_spans.get(unit.id)
        traffic = unit.stats.feed_bytes
        if traffic is None or span is None or span[1] <= span[0]:
            continue
        length, node_s = span[1] - span[0], unit.node_s
        for n in unit.nodes:
            if n in nbytes:  # a planned node's (nbytes holds no other)
                # its time in the unit, else its plan's; not `node_s.get(n, default)`: that read the default every time
                busy = (node_s[n] if n in node_s else node_plans[n].per_micro_batch_s) * m
                streamed[n] = streamed.get(n, 0.0) + traffic * busy / length
    nbytes.update(streamed)
    intensity = {name: (node_plans[name].flops / b if b else None) for name, b in nbytes.items()}
    return intensity, feed, nbytes


def prediction_error(
    predicted: Mapping[str, float],
    measured: Mapping[str, float],
    *,
    min_share: float = 0.01,
    spread: Mapping[str, float] | None = None,
    run_spread: float | None = None,
    predicted_step_s: float | None = None,
    measured_step_s: float | None = None,
) -> dict[str, Any]:
    """Error of predicted against measured times: the step, the node sum, each node.

    End to end (``end_to_end_rel_error``): with ``predicted_step_s`` (the predicted step:
    node times plus the predicted overhead rows) and ``measured_step_s`` (the measured step:
    onnxruntime's run time, its per-run overhead included), |pred step - meas step| / meas
    step, signed in ``end_to_end_signed_error``; ``end_to_end_basis`` says ``step``. Without
    them it falls back to the node sum and the basis says ``node sum``. The node-sum figure
    (|sum predicted - sum measured| / sum measured over the nodes both have) is always
    there as ``node_sum_rel_error``, beside ``predicted_node_sum_s``/``measured_node_sum_s``.
    Per node: |pred - meas| / meas, median and 90th percentile over nodes taking at least
    ``min_share`` of the measured time. With ``spread`` (node -> IQR / median of its
    measured runs) it also says how noisy the nodes were: ``median_node_spread``,
    ``weighted_node_spread`` (the node spreads weighted by measured time) and
    ``nodes_within_noise`` (compared nodes whose error is no larger than their spread). With
    ``run_spread`` (IQR / median of the measured runs' durations, `Measurement.run_spread`)
    it says how noisy the step was: ``end_to_end_spread``, and ``end_to_end_within_noise``
    when the end-to-end error is no larger. The end-to-end verdict is the run's alone: node
    spreads do not add up to it (a step's nodes are not all slow in the same run), and the
    weighted one had stood in for it under its name.
    """
    common = [n for n in measured if n in predicted]
    total = sum(measured[n] for n in common)
    if total <= 0:
        return {
            "end_to_end_rel_error": None,
            "median_node_rel_error": None,
            "p90_node_rel_error": None,
            "nodes_compared": 0,
            "node_sum_rel_error": None,
            "end_to_end_basis": None,
        }
    predicted_sum = sum(predicted[n] for n in common)
    node_sum = abs(predicted_sum - total) / total
    step = predicted_step_s is not None and measured_step_s is not None and measured_step_s > 0
    if step:
        signed = (predicted_step_s - measured_step_s) / measured_step_s  # type: ignore[operator]
        e2e = abs(signed)
    else:
        signed = (predicted_sum - total) / total
        e2e = node_sum
    errors = sorted(
        abs(predicted[n] - measured[n]) / measured[n]
        for n in common
        if measured[n] > 0 and measured[n] >= min_share * total
    )
    out: dict[str, Any] = {
        "end_to_end_rel_error": e2e,
        "median_node_rel_error": _quantile(errors, 0.5),
        "p90_node_rel_error": _quantile(errors, 0.9),
        "nodes_compared": len(errors),
        "end_to_end_basis": "step" if step else "node sum",
        "end_to_end_signed_error": signed,
        "predicted_step_s": predicted_step_s if step else None,
        "measured_step_s": measured_step_s if step else None,
        "node_sum_rel_error": node_sum,
        "predicted_node_sum_s": predicted_sum,
        "measured_node_sum_s": total,
    }
    if spread is not None:
        big = [n for n in common if measured[n] > 0 and measured[n] >= min_share * total]
        out["median_node_spread"] = _quantile(sorted(spread.get(n, 0.0) for n in big), 0.5)
        out["weighted_node_spread"] = sum(measured[n] * spread.get(n, 0.0) for n in common) / total
        out["nodes_within_noise"] = sum(
            1 for n in big if abs(predicted[n] - measured[n]) / measured[n] <= spread.get(n, 0.0)
        )
    if run_spread is not None:
        out["end_to_end_spread"] = run_spread
        out["end_to_end_within_noise"] = e2e <= run_spread
    return out


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default method) of sorted values."""
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])
