"""Emulation: run a Plan as a discrete-event simulation and return a `Timeline`.

Every node runs once per micro-batch on its lane (a region, a pipeline stage, a stream);
a lane runs one thing at a time, in the order micro-batch then topological order, and a
run starts when its lane is free and the same micro-batch of every producer has ended.
Because each lane's order is fixed and every dependency comes earlier in that order, one
pass in global (micro-batch, topological) order gives the exact event times, including
pipeline fill and drain. Sequential plans (RDU sections, streamed WSE layers) run their
units one after another, each after its gap (reconfiguration) and for at least its
``min_time_s`` (e.g. its DDR traffic at DDR bandwidth).

Time that belongs to no node is never hidden: unit gaps (under their ``gap_kind``), memory
stalls and the plan's serial step overheads (host time, an off-chip optimizer update, ...)
are named rows of ``Timeline.overheads_s``, and the step time includes every one of them.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from dabench_ir.ir import Graph
from dabench_ir.plan import Plan, Schedule
from dabench_ir.timeline import NodeTiming, Timeline

__all__ = ["check_dependencies", "emulate"]

logger = logging.getLogger(__name__)


def _producers(graph: Graph, placed: set[str]) -> dict[str, list[str]]:
    preds: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.name not in placed:
            continue
        seen: list[str] = []
        for v in node.inputs:
            value = graph.values.get(v) if v else None
            prod = value.producer if value is not None else None
            if prod in placed and prod not in seen:
                seen.append(prod)
        preds[node.name] = seen
    return preds


def emulate(plan: Plan, graph: Graph) -> Timeline:
    """Simulate one step of ``plan``; the Timeline respects every graph dependency."""
    order = [n.name for n in graph.nodes if n.name in plan.node_plans]
    placed = set(order)
    preds = _producers(graph, placed)
    position = {name: i for i, name in enumerate(order)}
    m_count = max(1, plan.micro_batches)

    if plan.schedule is Schedule.SEQUENTIAL:
        groups = [
            (u, sorted((n for n in u.nodes if n in placed), key=position.__getitem__)) for u in plan.units
        ]
    else:
        groups = [(None, order)]

    end: dict[tuple[str, int], float] = {}
    lane_free: dict[str, float] = defaultdict(float)
    slices: dict[str, list[tuple[float, float]]] = {name: [] for name in order}
    busy_node: dict[str, float] = defaultdict(float)
    unit_spans: dict[str, tuple[float, float]] = {}
    overheads: dict[str, float] = defaultdict(float)
    clock = 0.0
    for unit, names in groups:
        gate = clock
        if unit is not None and unit.gap_before_s > 0:
            gate += unit.gap_before_s
            overheads[unit.gap_kind] += unit.gap_before_s
        durations = {
            name: unit.node_s.get(name, plan.node_plans[name].per_micro_batch_s) if unit else
            plan.node_plans[name].per_micro_batch_s
            for name in names
        }  # fmt: skip
        last = _run_micro_batches(names, durations, m_count, gate, plan, preds, end, lane_free, slices, busy_node)
        if unit is not None:
            stall = max(0.0, gate + unit.min_time_s - last)
            if stall > 0:
                overheads["memory_stall"] += stall
            unit_spans[unit.id] = (gate, last + stall)
            clock = last + stall
        else:
            clock = last

    timings = {}
    for name in order:
        runs = slices[name]
        np_ = plan.node_plans[name]
        timings[name] = NodeTiming(name, np_.unit, runs[0][0], runs[-1][1], np_.bound)
    busy_node = dict(busy_node)
    unit_busy: dict[str, float] = defaultdict(float)
    for name, b in busy_node.items():
        unit_busy[plan.node_plans[name].unit] += b
    if plan.schedule is Schedule.SEQUENTIAL:
        unit_busy.update({uid: b - a for uid, (a, b) in unit_spans.items()})
    else:
        for u in plan.units:
            members = [n for n in u.nodes if n in timings]
            if members:
                unit_spans[u.id] = (min(timings[n].start for n in members), max(timings[n].end for n in members))
    makespan = max(clock, max((t.end for t in timings.values()), default=0.0))
    if plan.pipelined_steps and plan.schedule is Schedule.CONCURRENT:
        lane_busy: dict[str, float] = defaultdict(float)
        for name, b in busy_node.items():
            lane_busy[plan.node_plans[name].lane] += b
        step = max(lane_busy.values(), default=0.0)  # consecutive steps overlap in the pipeline
    else:
        step = makespan
    latency = makespan  # one step from its first input to its last output, nothing overlapping it
    for name, seconds in plan.step_overheads_s.items():  # serial: nothing else runs meanwhile
        overheads[name] += seconds
        step += seconds
        latency += seconds
    timeline = Timeline(
        nodes=timings,
        step_time_s=step,
        latency_s=latency,
        samples_per_step=plan.samples_per_step,
        source="emulated",
        unit_busy_s=dict(unit_busy),
        overheads_s=dict(overheads),
        micro_batches=m_count,
        node_busy_s=busy_node,
        slices=slices,
        lanes={n: plan.node_plans[n].lane for n in order},
        unit_spans=unit_spans,
    )
    logger.debug("emulated %d nodes x %d micro-batch(es): step %.3g s", len(order), m_count, step)
    return timeline


def _run_micro_batches(
    names: list[str],
    durations: dict[str, float],
    m_count: int,
    gate: float,
    plan: Plan,
    preds: dict[str, list[str]],
    end: dict[tuple[str, int], float],
    lane_free: dict[str, float],
    slices: dict[str, list[tuple[float, float]]],
    busy_node: dict[str, float],
) -> float:
    """Run ``m_count`` micro-batches of ``names`` from ``gate``; the time the last run ends.

    The event times are a max-plus linear recurrence in the micro-batch index. Each lane runs its
    nodes in order every micro-batch, so a lane is a cycle whose rate (seconds per micro-batch) is
    its own load or the rate of a lane that feeds it, whichever is larger (`_lane_rates`); a
    lane fed by nothing slower runs ahead of the bottleneck at its own rate. Once every node's
    run ends exactly its lane's rate after its previous run, for two micro-batches in a row, the
    recurrence is linear from there on (each node's latest input is the fastest-growing one and
    stays so), and the rest of the micro-batches are added in closed form: m micro-batches cost
    fill + m periods + drain without m simulations. ``slices`` keeps each simulated run and the
    last one.
    """
    rate = _lane_rates(names, durations, plan, preds)
    last = gate
    steady = 0
    for m in range(m_count):
        for name in names:
            lane = plan.node_plans[name].lane
            ready = max([gate, lane_free[lane]] + [end[(p, m)] for p in preds[name] if (p, m) in end])
            finish = ready + durations[name]
            end[(name, m)] = finish
            lane_free[lane] = finish
            slices[name].append((ready, finish))
            busy_node[name] += durations[name]
            last = max(last, finish)
        if m == 0 or m == m_count - 1:
            continue
        tol = 1e-12 * max(abs(last), 1e-30)
        settled = all(abs(end[(n, m)] - end[(n, m - 1)] - rate[plan.node_plans[n].lane]) <= tol for n in names)
        steady = steady + 1 if settled else 0
        if steady >= 2:  # two micro-batches in a row at the lanes' rates: linear from here on
            rest = m_count - 1 - m
            for name in names:
                start, finish = slices[name][-1]
                shift = rest * rate[plan.node_plans[name].lane]
                slices[name].append((start + shift, finish + shift))
                end[(name, m_count - 1)] = finish + shift
                busy_node[name] += rest * durations[name]
                last = max(last, finish + shift)
            for lane in rate:
                lane_free[lane] += rest * rate[lane]
            return last
    return last


def _lane_rates(
    names: list[str], durations: dict[str, float], plan: Plan, preds: dict[str, list[str]]
) -> dict[str, float]:
    """Each lane's steady rate, seconds per micro-batch: its own load (its nodes' durations) or the
    rate of a lane feeding one of its nodes, whichever is larger (a fixed point over the lanes:
    a lane can go no faster than its slowest upstream lane, and never faster than its load)."""
    rate: dict[str, float] = defaultdict(float)
    for name in names:
        rate[plan.node_plans[name].lane] += durations[name]
    feeds: dict[str, set[str]] = defaultdict(set)
    for name in names:
        lane = plan.node_plans[name].lane
        feeds[lane].update(plan.node_plans[p].lane for p in preds[name] if p in plan.node_plans)
    changed = True
    while changed:  # monotone and bounded by the largest load: at most one pass per lane
        changed = False
        for lane, sources in feeds.items():
            top = max((rate[s] for s in sources), default=0.0)
            if top > rate[lane]:
                rate[lane] = top
                changed = True
    return dict(rate)


def check_dependencies(timeline: Timeline, graph: Graph, tol: float = 1e-12) -> list[str]:
    """Violations of graph order in a timeline: each run of a node must start after the
    matching run of every producer ended. An empty list means the timeline is consistent."""
    problems = []
    placed = set(timeline.nodes)
    preds = _producers(graph, placed)
    for name, ps in preds.items():
        mine = timeline.slices.get(name) or [(timeline.nodes[name].start, timeline.nodes[name].end)]
        for p in ps:
            theirs = timeline.slices.get(p) or [(timeline.nodes[p].start, timeline.nodes[p].end)]
            for m, ((start, _), (_, p_end)) in enumerate(zip(mine, theirs, strict=False)):
                if start + tol < p_end:
                    problems.append(f"{name} (micro-batch {m}) starts at {start:.3g}s before {p} ends at {p_end:.3g}s")
    return problems
