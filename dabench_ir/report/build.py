"""`build_report`: gather a costed graph and, when present, its plan, timeline, metrics and
measurement into a `Report` (the JSON schema ``dabench-ir/report/v1``).

Every type serializes itself (``Failure.to_dict``, ``Metrics.to_dict``); the bound of a node
is the lowering's (timeline, else plan), never computed a second time here.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, Graph
from dabench_ir.options import recorded_config
from dabench_ir.passes import FLOP_CONVENTION, meta
from dabench_ir.passes.cost_rules import ESTIMATED_NOTE
from dabench_ir.passes.meta import MODEL_FAMILY, MODEL_PRESET
from dabench_ir.passes.precision import dominant_storage_dtype
from dabench_ir.report.attribution import STEP_OVERHEADS
from dabench_ir.report.model import COST_FIELDS, NodeRecord, Report
from dabench_ir.report.roles import node_roles

if TYPE_CHECKING:
    from dabench_ir.energy import StepEnergy
    from dabench_ir.plan import Plan
    from dabench_ir.run import ResolvedRun
    from dabench_ir.scaling import ScaleResult
    from dabench_ir.timeline import Timeline

__all__ = ["build_report", "build_scaled_report"]


def build_report(
    graph: Graph,
    *,
    run: ResolvedRun,
    plan: Any = None,
    timeline: Timeline | None = None,
    metrics: Any = None,
    measurement: Any = None,
    energy: StepEnergy | None = None,
) -> Report:
    """Gather graph costs, and timeline/metrics/measurements when present, into a Report of ``run``:
    a record per node (`_node_rows`), the step's totals (`_totals`), the metrics (`_metrics`), the
    plan's units (`_units`) and what the report says besides (`_extra`). ``energy``: the step energy
    of this plan and timeline when the caller has it (`energy.step_energy`), not worked out again."""
    target = run.target if plan is not None else None
    busy = timeline.busy_times() if timeline is not None else {}
    rows = _node_rows(graph, plan, timeline, busy, metrics, measurement)
    samples = timeline.samples_per_step if timeline is not None else run.samples.per_replica  # every copy's
    totals = _totals(rows, plan, timeline, measurement, samples)
    if target is not None and plan is not None and timeline is not None and timeline.source == "emulated":
        from dabench_ir.energy import step_energy

        # the metrics' feed bytes are of this plan and timeline (`place`), ``busy`` its busy times: read, not walked again
        if energy is None:
            energy = step_energy(graph, plan, timeline, target, getattr(metrics, "node_feed_bytes", None), busy)
        _add_energy(energy, plan, timeline, target, rows.records, totals, samples)
    return Report(
        model={
            "path": run.model or graph.path,
            "name": graph.name,
            "nodes": len(graph.nodes),
            "params": graph.num_params,
            "constants": _constant_elements(graph),
            "layers": len(graph.layers),
            "family": graph.metadata.get(MODEL_FAMILY),
            "preset": graph.metadata.get(MODEL_PRESET) or None,
        },
        target=None if target is None else {"name": target.name, "kind": target.kind},
        config=_config(graph, run, plan, samples, placed=target is not None),
        nodes=rows.records,
        unattributed=rows.unattributed,
        totals=totals,
        metrics=_metrics(rows.records, plan, timeline, metrics, measurement, target),
        units=_units(plan, timeline),
        fits=True if plan is None else bool(plan.fits),
        failure=plan.failure.to_dict() if plan is not None and plan.failure is not None else None,
        flop_convention=FLOP_CONVENTION,
        extra=_extra(rows.estimated, measurement, plan),
        graph=graph,
        timeline=timeline,
        target_obj=target,
        options=run.options,
        run=run,
        plan=plan,
        measured_timeline=(
            measurement.timeline
            if measurement is not None
            and timeline is not None
            and timeline is not getattr(measurement, "timeline", None)
            else None
        ),
    )


@dataclass(slots=True)
class _NodeRows:
    """A report's node records in graph order, with the rows of its unattributed nodes, its estimated
    records and the costs the totals add (the costed records')."""

    records: list[NodeRecord] = field(default_factory=list)
    unattributed: list[dict[str, Any]] = field(default_factory=list)
    estimated: list[NodeRecord] = field(default_factory=list)
    costs: list[Cost] = field(default_factory=list)


def _node_rows(
    graph: Graph, plan: Any, timeline: Timeline | None, busy: Mapping[str, float], metrics: Any, measurement: Any
) -> _NodeRows:
    """One record per node: its cost, intensity (at its feed level where the metrics have it), role,
    and where it ran and for how long (its busy time: a pipelined node runs once per micro-batch and
    waits between runs), its measured time when measured."""
    rows = _NodeRows()
    node_intensity = dict(getattr(metrics, "node_intensity", {}) or {})
    feed_bytes = metrics.node_feed_bytes if node_intensity else {}
    roles = node_roles(graph)
    timings = timeline.nodes if timeline is not None else {}
    node_plans = plan.node_plans if plan is not None else {}
    for node in graph.nodes:
        cost = meta.attributed_cost(node)
        if node.name in node_intensity:  # the feed level's, which replaces the cost's (not computed then)
            intensity, feed = node_intensity[node.name], feed_bytes.get(node.name)
        else:
            intensity, feed = (cost.intensity if cost is not None else None), None
        record = NodeRecord(
            name=node.name,
            op_type=node.qualified_op,
            layer=node.layer,
            scope=node.scope,
            op_class=_text(node.meta.get(meta.OP_CLASS)),
            cost=cost,
            intensity=intensity,
            precision=_text(node.meta.get(meta.PRECISION)),
            note=_note(node.meta),
            role=roles.get(node.name),
            feed_bytes=feed,
        )
        t = timings.get(node.name)
        if t is not None:
            record.time_s, record.start_s, record.unit = busy[node.name], t.start, t.unit
            bound = t.bound if t.bound is not None else getattr(node_plans.get(node.name), "bound", None)
            record.bound = _text(bound)  # the timeline's bound, else the plan's
        if measurement is not None:
            _add_measured(record, measurement)
        if meta.ESTIMATED in node.meta:
            rows.estimated.append(record)
        if cost is None:
            reason = node.meta.get(meta.UNATTRIBUTED, "not costed")
            row = {"name": node.name, "op_type": record.op_type, "reason": reason}
            counted = node.meta.get(meta.COST)  # work counted but owned by no node (MLIR ops without an origin)
            if counted is not None:
                row.update(flops=counted.flops, bytes=counted.bytes)
            rows.unattributed.append(row)
        else:
            rows.costs.append(cost)
        rows.records.append(record)
    return rows


def _totals(rows: _NodeRows, plan: Any, timeline: Timeline | None, measurement: Any, samples: int) -> dict[str, Any]:
    """The step's totals: FLOPs and bytes (the graph's, one copy's: ``step_flops`` counts every
    data-parallel copy a step runs, ``copies``), its time and basis, throughput and achieved FLOP/s
    of the whole step (none for a plan that does not fit), the overheads no node owns and the
    estimated nodes' share."""
    total = _total(rows.costs)
    time_s = timeline.step_time_s if timeline is not None else None
    if measurement is not None and timeline is None:
        time_s = measurement.run_time_s
    fits = plan is None or plan.fits  # a point that does not fit gets no throughput, GOP/s or GOP/s/W
    copies = plan.replicas if plan is not None else 1  # data-parallel copies of the graph in one step
    totals: dict[str, Any] = {
        "flops": total.flops,
        "bytes": total.bytes,
        "copies": copies,
        "step_flops": total.flops * copies,
        "time_s": time_s,
        "throughput_samples_per_s": samples / time_s if time_s and fits else None,
        "achieved_flops_per_s": total.flops * copies / time_s if time_s and fits else None,
        **total.as_dict(),
        "intensity": total.intensity,
        "nodes": len(rows.records),
        "unattributed_nodes": len(rows.unattributed),
        # step costs no node owns (reconfiguration, stalls, host time, fill/drain, collectives)
        "overhead_s": sum((timeline.overheads_s or {}).values()) if timeline is not None else None,
        # time_s is the steady-state step (a period where consecutive steps overlap); latency_s is one
        # step alone: they differ on pipelined targets, and time_basis says which time_s is
        "latency_s": timeline.one_step_s if timeline is not None else time_s,
        "period_s": time_s,
        "time_basis": None
        if time_s is None
        else (
            "steady-state period (consecutive steps overlap in the pipeline)"
            if timeline is not None and timeline.pipelined
            else "one step"
        ),
        **_estimated_totals(rows.estimated, rows.records),
    }
    if measurement is not None:
        totals["measured_time_s"] = measurement.run_time_s
    return totals


def _metrics(
    records: list[NodeRecord], plan: Any, timeline: Timeline | None, metrics: Any, measurement: Any, target: Any
) -> dict[str, Any]:
    """The Level-1 metrics, the target's power, and for an emulated run that was also measured the
    prediction error (each record's predicted time is then its emulated one)."""
    out: dict[str, Any] = {"allocation_ratio": None, "load_imbalance": None, "compute_efficiency": None}
    if metrics is not None:
        out.update(metrics.to_dict())
    if target is not None:
        out["target_power_w"] = float(target.watts) * max(1, int(getattr(plan, "chips", 1) or 1))
    if measurement is not None and timeline is not None and timeline.source == "emulated":
        from dabench_ir.metrics import prediction_error

        predicted = {r.name: r.time_s for r in records if r.time_s is not None}
        for r in records:
            r.predicted_time_s = r.time_s
        out["prediction_error"] = prediction_error(
            predicted,
            measurement.node_times,
            spread=measurement.node_spread or None,
            run_spread=measurement.run_spread,
            predicted_step_s=timeline.step_time_s,
            measured_step_s=measurement.run_time_s,
        )
    return out


def _units(plan: Any, timeline: Timeline | None) -> list[dict[str, Any]]:
    """The plan's units, each with its nodes, allocation, busy time and resources."""
    if plan is None:
        return []
    busy = timeline.unit_busy_s if timeline is not None else {}
    return [
        {
            "id": unit.id,
            "kind": unit.kind,
            "nodes": list(unit.nodes),
            "allocation": getattr(unit, "allocation", None),
            "time_s": busy.get(unit.id),
            "resources": unit.report_resources(),  # the lowering's detail and its UnitStats
        }
        for unit in plan.units
    ]


def _extra(estimated: list[NodeRecord], measurement: Any, plan: Plan | None) -> dict[str, Any]:
    """The estimated nodes (each with why), the measurement's settings and the lowering's notes (what
    it assumed or decided, in its words: `Plan.notes`)."""
    extra: dict[str, Any] = {}
    if plan is not None and plan.notes:
        extra["notes"] = list(plan.notes)
    if estimated:
        extra["estimated"] = [
            {"name": r.name, "op_type": r.op_type, "reason": (r.note or ""), "time_s": r.time_s, "bytes": r.bytes}
            for r in estimated
        ]
    if measurement is not None:
        extra["measurement"] = {
            "threads": measurement.threads,
            "provider": measurement.provider,
            "run_time_s": measurement.run_time_s,
            "repeat": measurement.repeat,  # timed runs (``repeat="auto"``: as many as the median needed)
            "basis": getattr(measurement, "BASIS", None),
            "overheads_s": dict(getattr(measurement, "overheads_s", {}) or {}),
            "fused": measurement.fused,
        }
    return extra


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _note(node_meta: dict[str, Any]) -> str | None:
    """A node row's note: an estimate says so (and why), else a folded constant says what it folded (a
    no-op eliminated at compile time, what it was)."""
    if meta.ESTIMATED in node_meta:
        return f"{ESTIMATED_NOTE} ({node_meta[meta.ESTIMATED]})"
    return node_meta.get(meta.FOLDED) or node_meta.get(meta.ELIMINATED)


def _add_measured(record: NodeRecord, measurement: Any) -> None:
    """The node's measured time (and spread, and how a fused kernel's time was shared) from ``measurement``,
    or why it was not measured."""
    name = record.name
    if name in measurement.node_times:
        record.measured_time_s = measurement.node_times[name]
        record.measured_spread = measurement.node_spread.get(name)
        how = measurement.notes.get(name)
        if how:  # a fused kernel's share: say so beside any other note
            record.note = f"{record.note}; {how}" if record.note else how
    elif name in measurement.missing:
        record.note = f"not measured: {measurement.missing[name]}"


def _total(costs: Sequence[Cost]) -> Cost:
    """``sum(costs, Cost())``, one field at a time (the same numbers), without a Cost or a row built per
    node (a transposed table of a 360,000-node model's costs took 3 s to build)."""
    return Cost(*(sum(map(operator.attrgetter(name), costs)) for name in COST_FIELDS))


def _estimated_totals(estimated: list[NodeRecord], records: list[NodeRecord]) -> dict[str, Any]:
    """Nodes costed by `estimate_cost` (no rule): their count, time and share of the summed node time."""
    node_time = sum(r.time_s or 0.0 for r in records)
    est_time = sum(r.time_s or 0.0 for r in estimated)
    placed = any(r.time_s is not None for r in records)
    return {
        "estimated_nodes": len(estimated),
        "estimated_time_s": est_time if placed else None,
        "estimated_time_share": est_time / node_time if placed and node_time else (0.0 if placed else None),
        "estimated_bytes": sum(r.bytes or 0 for r in estimated),
    }


_ENERGY_TOTALS = (
    "energy_j",
    "energy_per_sample_j",
    "power_w",
    "gops_per_w",
    "gops_per_w_modelled",
    "node_energy_j",
    "dynamic_energy_j",
    "static_energy_j",
    "link_energy_j",
    "node_static_energy_j",
    "idle_energy_j",
    "overhead_energy_j",
    "static_power_w",
)
"""The totals `_add_energy` writes that are of one placement's step (a multi-chip report drops them)."""

_CHIP_METRICS = (
    "allocation_ratio",
    "load_imbalance",
    "compute_efficiency",
    "achieved_flops_per_s",
    "peak_flops_per_s",
    "roofline_bound",
    "target_power_w",
    "memory_use",
    "traffic_bytes",
)
"""A multi-chip report's ``metrics`` that are one chip's placement (named in its ``metrics.per_chip``);
its ``totals`` and the scaling figures (speedup, scaling efficiency, comm share) are the whole step's."""
_WORK_TOTALS = ("flops", "contraction_flops", "vector_flops", "special_ops")
"""The totals that count work: of the model at the step's batch in a multi-chip report."""
_BYTE_TOTALS = ("weight_bytes", "act_bytes_in", "act_bytes_out")
"""The totals that count bytes moved (``bytes`` is their sum): every chip's in a multi-chip report."""


def _add_energy(step_e: StepEnergy, plan, timeline, target, records, totals, samples) -> None:
    """Per-node joules, the rows no node owns, and the step's energy, power and efficiency of ``step_e``,
    the plan's `step_energy` (docs/energy.md).

    ``energy_j`` = ``node_energy_j`` (each node: dynamic + the static power of what it holds
    while it runs) + ``idle_energy_j`` + the ``overhead_energy_j`` rows; it is also
    ``dynamic_energy_j`` + ``static_energy_j`` (static power over the whole step).
    """
    energies = step_e.nodes
    for r in records:
        r.energy_j = energies.get(r.name)
    energy = step_e.total_j
    step = timeline.step_time_s
    achieved = totals["achieved_flops_per_s"]
    watts = float(target.watts) * max(1, int(getattr(plan, "chips", 1) or 1))  # every device the plan uses
    totals.update(
        {
            "energy_j": energy,
            "energy_per_sample_j": energy / samples if samples else None,
            "power_w": energy / step if step else None,
            "target_power_w": watts,
            # achieved GOP/s per rated watt, and per modelled watt (every copy's FLOPs per joule)
            "gops_per_w": achieved / 1e9 / watts if achieved and watts else None,
            "gops_per_w_modelled": totals["step_flops"] / energy / 1e9 if energy and achieved else None,
            # where the joules go: the nodes, and the static energy no node holds
            "node_energy_j": step_e.node_j,
            "dynamic_energy_j": step_e.dynamic_j,
            "static_energy_j": step_e.static_j,
            "link_energy_j": step_e.link_j,  # of the dynamic: the plan's own chip-to-chip links
            "node_static_energy_j": sum(step_e.static.values()),
            "idle_energy_j": step_e.idle_j,
            "overhead_energy_j": dict(step_e.overheads),
            "static_power_w": step_e.static_power_w,
        }
    )


def _config(graph: Graph, run: ResolvedRun, plan: Any, samples: int, *, placed: bool) -> dict[str, Any]:
    """The recorded configuration: every run knob (target knobs when placed), resolved against the graph,
    and the resolved run itself (``run``: each knob's value and source, what ``auto`` chose)."""
    opts = run.options
    config = recorded_config(opts, target=placed)
    config.update(
        {
            "batch": samples,
            "precision": opts.precision or dominant_storage_dtype(graph),
            "chips": getattr(plan, "chips", 1) if plan is not None else 1,
            "strategy": getattr(plan, "strategy", None),
            "dims": dict(graph.bindings),
            "samples": {**run.samples.to_dict(), "replicas": getattr(plan, "replicas", 1), "per_step": samples},
            "run": run.to_dict(_chosen(run, plan)),
        }
    )
    if meta.graph_precision(graph) is not None:
        from dabench_ir.passes.precision import precision_by_class

        config["precision_by_class"] = precision_by_class(graph)
    train = meta.training_state(graph)
    if train is not None:
        config["train"] = train.to_dict()
    return config


def _chosen(run: ResolvedRun, plan: Any) -> dict[str, Any]:
    """What the lowering decided for knobs the run left to it: the WSE mode ``auto`` picked, the replicas."""
    if plan is None:
        return {}
    chosen: dict[str, Any] = {}
    if plan.stats.mode is not None:  # only the WSE lowering chooses a mode (`PlanStats.mode`)
        chosen["wse_mode"] = plan.stats.mode
    if run.options.replicas == "auto" or plan.replicas != 1:
        chosen["replicas"] = plan.replicas
    if plan.micro_batches and run.samples.micro_batches is None:
        chosen["micro_batches"] = plan.micro_batches
    return chosen


def build_scaled_report(graph: Graph, *, run: ResolvedRun, result: ScaleResult) -> Report:
    """The report of a multi-chip run: one chip's placement for the nodes (a TP share, a DP replica),
    the scaling stage's step for the totals and metrics, the whole scaling record under ``extra.scale``.

    ``totals`` are the whole step's, every device together: the model's work at the step's batch
    (FLOPs of the unsplit graph, not counting what tensor parallelism replicates), the bytes every
    chip moves, the energy of every device and link. What one chip does is ``extra.per_chip``, and
    the node rows are one chip's (``extra.nodes_basis``)."""
    point = result.points[-1]
    chip = point.chip
    if chip is not None and chip.plan is not None:
        report = build_report(
            chip.graph,
            run=run,
            plan=chip.plan,
            timeline=chip.timeline,
            metrics=chip.metrics,
            energy=point.energy.chip if point.energy is not None else None,  # the scale point's, already worked out
        )
    else:
        report = build_report(graph, run=run)
    whole = _total(
        [c for c in map(meta.attributed_cost, graph.nodes) if c is not None]
    )  # the unsplit graph: a replica's step
    steps = point.batch / max(run.samples.per_replica, 1)  # replica steps in the multi-chip step
    one = report.totals
    replicas = one.get("copies") or 1  # the placement's own data-parallel copies (the IPU's replicas)
    copies = point.copies * replicas  # chips doing the node rows' work each step (1: the placement is the whole step's)
    energy = one.get("energy_j")
    # the chip's busy time a step: under pp the placement is the whole graph, whose work no one chip
    # does: what a chip does is its stage's, the busiest stage's time (its work is not one placement's)
    staged = result.strategy == "pp" and bool(point.stage_times_s)
    busy_s = max(point.stage_times_s) if staged else point.compute_time_s
    report.extra["per_chip"] = {
        **{key: None if staged else one.get(key) for key in (*_WORK_TOTALS, "bytes", "intensity")},
        "params": None if staged else report.model.get("params"),
        "copies": copies,
        "time_s": busy_s,
        "overhead_s": None if staged else one.get("overhead_s"),
        "energy_j": None if energy is None or staged else energy / replicas,
    }
    tp = point.throughput_samples_per_s
    totals = {key: value for key, value in one.items() if key not in _ENERGY_TOTALS}
    totals.update({key: round(getattr(whole, key) * steps) for key in _WORK_TOTALS})  # counts: whole numbers
    totals.update({key: (one.get(key) or 0) * copies for key in ("bytes", *_BYTE_TOTALS)})
    totals.update(
        {
            "copies": 1,  # the work and bytes above are already every copy's
            "step_flops": totals["flops"],
            "intensity": totals["flops"] / totals["bytes"] if totals["bytes"] else None,
            "time_s": point.time_s,
            "period_s": point.time_s,
            # a pipelined chip's first sample takes its fill on top of the period: so does the step's
            "latency_s": point.time_s + (one.get("latency_s") or 0) - (one.get("period_s") or 0),
            # time no node owns, the overhead rows' sum: the chip's own rows (a reduce of its replicas
            # among them), then the collectives after; under pp the whole graph's rows on one chip beside
            # the step's beyond its busiest stage (the fill and drain, the update, the boundaries), as the
            # node rows are the whole graph's (it had been the step's alone: 710 us of 886 us of rows)
            "overhead_s": (one.get("overhead_s") or 0) + sum(point.overheads_s.values())
            if staged
            else (one.get("overhead_s") or 0) + point.time_s - (chip.time_s if chip else point.compute_time_s),
            "throughput_samples_per_s": tp,
            "achieved_flops_per_s": None if tp is None else totals["flops"] / point.time_s,
            "comm_time_s": point.comm_time_s,
            "chip_time_s": point.compute_time_s,
        }
    )
    energy = point.energy
    if energy is not None:
        joules = energy.total_j
        totals.update(
            {
                **energy.to_dict(),
                "energy_per_sample_j": joules / point.batch if point.batch else None,
                "power_w": joules / point.time_s if point.time_s else None,
                "gops_per_w": totals["achieved_flops_per_s"] / 1e9 / energy.rated_w
                if totals["achieved_flops_per_s"] and energy.rated_w
                else None,
            }
        )
    report.totals = totals
    if point.overheads_s:  # the collectives, a pipeline's fill and drain: rows of their own
        report.extra[STEP_OVERHEADS] = dict(point.overheads_s)
    report.model = {**report.model, "params": graph.num_params}  # the unsplit model's
    # a placement over several devices of its own (the IPU's replicas, its pipeline) has their rates
    # and power: one chip's is its share; under pp no one chip runs the placement's work
    devices = max(1, int(chip.plan.chips or 1)) if chip is not None and chip.plan is not None else 1
    for key in ("achieved_flops_per_s", "peak_flops_per_s", "target_power_w"):
        value = report.metrics.get(key)
        if value is not None:
            report.metrics[key] = None if staged and key == "achieved_flops_per_s" else value / devices
    report.metrics.update(
        {
            # what stays one chip's, as the text's "metrics  per chip" line says; the totals are the step's
            "per_chip": [*_CHIP_METRICS],
            "allocation_ratio": point.allocation_ratio,
            "load_imbalance": point.load_imbalance,
            "compute_efficiency": point.compute_efficiency,
            "speedup": point.speedup,
            "scaling_efficiency": point.scaling_efficiency,
            "comm_share": point.comm_share,
            "dominant_bound": point.dominant_bound,
        }
    )
    report.fits, report.failure = point.fits, point.failure
    if point.memory_per_device:  # what one device holds in the multi-chip layout (sharded, or a stage's)
        report.metrics["memory_use"] = _device_memory(run.target, point.memory_per_device)
    report.config.update({"chips": point.chips, "strategy": result.strategy, "batch": point.batch})
    report.config["samples"]["per_step"] = point.batch
    report.extra["scale"] = result.to_dict()
    if point.notes:  # what the scaling stage assumed (the collectives, the LM head's split), beside the chip's
        report.extra["notes"] = [*report.extra.get("notes", ()), *point.notes]
    report.scaling = result
    report.extra["nodes_basis"] = (
        "the whole graph on one chip; the pipeline stages are its layers' shares"
        if result.strategy == "pp"
        else "one chip's share of the step"
    )
    return report


def _device_memory(target: Any, held: dict[str, int]) -> dict[str, dict[str, float]]:
    """Memory use per level of one device of a multi-chip point: ``held`` is by memory name, or by kind
    (weights, gradients, ...; ``host``: off the device) all in the memory that feeds the units."""
    if all(target.has_memory(name.split(":")[0]) for name in held):
        levels = {name: float(b) for name, b in held.items()}
    else:
        levels = {target.feed_memory.name: float(sum(b for kind, b in held.items() if kind != "host"))}
    out = {}
    for name, used in levels.items():
        mem = target.memory(name.split(":")[0])
        cap = float(mem.capacity_bytes)
        out[name] = {"bytes": used, "capacity_bytes": cap, "fraction": used / cap if cap else 0.0, "level": mem.level}
    return out


def _constant_elements(graph: Graph) -> int | None:
    """Elements of the stored tensors that are not parameters (RoPE tables, masks, folded
    constants): reported beside the parameters, never counted as them."""
    from dabench_ir.ir import ValueKind

    try:
        return sum(
            v.type.numel(graph.bindings)
            for v in graph.values.values()
            if v.kind is ValueKind.CONSTANT and v.producer is None  # stored, not a folded weight layout
        )
    except (UserError, TypeError):
        return None
