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
import math
from collections import defaultdict

from dabench_ir.ir import Graph
from dabench_ir.plan import Plan, Schedule
from dabench_ir.timeline import NodeTiming, Timeline

__all__ = ["check_dependencies", "emulate"]

logger = logging.getLogger(__name__)


def _producers(graph: Graph, placed: set[str]) -> dict[str, list[str]]:
    """Each placed node's placed producers, in input order, each once."""
    producer_of = {name: v.producer for name, v in graph.values.items() if name and v.producer in placed}
    preds: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.name not in placed:
            continue
        seen: list[str] = []
        for v in node.inputs:
            prod = producer_of.get(v)
            if prod is not None and prod not in seen:
                seen.append(prod)
        preds[node.name] = seen
    return preds


def emulate(plan: Plan, graph: Graph) -> Timeline:
    """Simulate one step of ``plan``; the Timeline respects every graph dependency."""
    node_plans = plan.node_plans
    order = [n.name for n in graph.nodes if n.name in node_plans]
    placed = set(order)
    lanes = {n: node_plans[n].lane for n in order}
    preds = _producers(graph, placed)
    m_count = max(1, plan.micro_batches)

    if plan.schedule is Schedule.SEQUENTIAL:
        position = {name: i for i, name in enumerate(order)}
        groups = []
        for u in plan.units:
            names = [n for n in u.nodes if n in placed]
            if len(names) > 1:
                names.sort(key=position.__getitem__)
            groups.append((u, names))
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
        if unit is not None:
            node_s = unit.node_s
            # each node's time in the unit, else its plan's (not `get(name, default)`: the default read every time)
            durations = {name: node_s[name] if name in node_s else node_plans[name].per_micro_batch_s for name in names}
        else:
            durations = {name: node_plans[name].per_micro_batch_s for name in names}
        last = _run_micro_batches(names, durations, m_count, gate, lanes, preds, end, lane_free, slices, busy_node)
        if unit is not None:
            stall = max(0.0, gate + unit.min_time_s - last)
            if stall > 0:
                overheads["memory_stall"] += stall
            unit_spans[unit.id] = (gate, last + stall)
            clock = last + stall
        else:
            clock = last

    timings = {}
    latest = None  # the latest end, as max() over the timings picks it (one walk less)
    for name in order:
        runs = slices[name]
        np_ = node_plans[name]
        t_end = runs[-1][1]
        timings[name] = NodeTiming(name, np_.unit, runs[0][0], t_end, np_.bound)
        if latest is None or t_end > latest:
            latest = t_end
    busy_node = dict(busy_node)
    unit_busy: dict[str, float] = defaultdict(float)
    for name, b in busy_node.items():
        unit_busy[node_plans[name].unit] += b
    if plan.schedule is Schedule.SEQUENTIAL:
        unit_busy.update({uid: b - a for uid, (a, b) in unit_spans.items()})
    else:
        for u in plan.units:
            # the first start and last end of its timed nodes, as min() and max() pick them, in one walk
            lo = hi = None
            for n in u.nodes:
                t = timings.get(n)
                if t is None:
                    continue
                if lo is None:
                    lo, hi = t.start, t.end
                else:
                    if t.start < lo:
                        lo = t.start
                    if t.end > hi:
                        hi = t.end
            if lo is not None:
                unit_spans[u.id] = (lo, hi)
    makespan = max(clock, 0.0 if latest is None else latest)
    if plan.pipelined_steps and plan.schedule is Schedule.CONCURRENT:
        lane_busy: dict[str, float] = defaultdict(float)
        for name, b in busy_node.items():
            lane_busy[lanes[name]] += b
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
        lanes=lanes,
        unit_spans=unit_spans,
    )
    logger.debug("emulated %d nodes x %d micro-batch(es): step %.3g s", len(order), m_count, step)
    return timeline


def _run_micro_batches(
    names: list[str],
    durations: dict[str, float],
    m_count: int,
    gate: float,
    lanes: dict[str, str],
    preds: dict[str, list[str]],
    end: dict[tuple[str, int], float],
    lane_free: dict[str, float],
    slices: dict[str, list[tuple[float, float]]],
    busy_node: dict[str, float],
) -> float:
    """Run ``m_count`` micro-batches of ``names`` from ``gate``; the time the last run ends.

    The event times are a max-plus linear recurrence in the micro-batch index: a lane runs its
    nodes in order every micro-batch, so each micro-batch waits for the one before on every lane.
    Its growth rate, seconds per micro-batch, is a node's lane's `_lane_rates`: the largest mean
    of the cycles that reach the lane (a lane's own load, or a round trip: a pipeline stage whose
    forward waits for its backward of the micro-batch before). Once every node's run ends exactly
    its rate after its previous run, for two micro-batches in a row, the recurrence is linear from
    there on, and the rest of the micro-batches are added in closed form: m micro-batches cost
    fill + m periods + drain without m simulations. ``slices`` keeps each simulated run and the
    last one.
    """
    rate: dict[str, float] = {}
    last = gate
    steady = 0
    for m in range(m_count):
        for name in names:
            lane = lanes[name]
            # max(gate, the lane free, the producers' ends of this micro-batch), as max() picks it,
            # without the two lists that built its argument per run
            ready = gate
            free = lane_free[lane]
            if free > ready:
                ready = free
            for p in preds[name]:
                e = end.get((p, m))
                if e is not None and e > ready:
                    ready = e
            took = durations[name]
            finish = ready + took
            end[(name, m)] = finish
            lane_free[lane] = finish
            slices[name].append((ready, finish))
            busy_node[name] += took
            if finish > last:
                last = finish
        if m == 0 or m == m_count - 1:
            continue
        if not rate:
            rate = _lane_rates(names, durations, lanes, preds)
        tol = 1e-12 * max(abs(last), 1e-30)
        settled = all(abs(end[(n, m)] - end[(n, m - 1)] - rate[lanes[n]]) <= tol for n in names)
        steady = steady + 1 if settled else 0
        if steady >= 2:  # two micro-batches in a row at the lanes' rates: linear from here on
            rest = m_count - 1 - m
            for name in names:
                start, finish = slices[name][-1]
                shift = rest * rate[lanes[name]]
                slices[name].append((start + shift, finish + shift))
                end[(name, m_count - 1)] = finish + shift
                busy_node[name] += rest * durations[name]
                last = max(last, finish + shift)
            for lane in rate:
                lane_free[lane] += rest * rate[lane]
            return last
    return last


def _lane_rates(
    names: list[str], durations: dict[str, float], lanes: dict[str, str], preds: dict[str, list[str]]
) -> dict[str, float]:
    """Each lane's steady growth rate, seconds per micro-batch, exactly (max-plus algebra).

    Lanes form a graph: an edge a -> b weighs the longest path, inside one micro-batch, from a's
    first node to b's last (node durations along graph and lane order), after which b's next
    micro-batch may start. A lane's rate is the largest cycle mean (weight per edge, one edge a
    micro-batch) of the strongly connected parts of that graph that reach it (Karp's algorithm on
    each part). ``names`` is in graph order, which every lane's order follows."""
    lane_of = {n: lanes[n] for n in names}
    first: dict[str, str] = {}
    final: dict[str, str] = {}
    inputs: dict[str, list[str]] = {}
    for n in names:
        lane = lane_of[n]
        inputs[n] = [p for p in preds[n] if p in lane_of] + ([final[lane]] if lane in final else [])
        first.setdefault(lane, n)
        final[lane] = n
    index = {n: i for i, n in enumerate(names)}
    weight: dict[str, dict[str, float]] = {}
    for a, head in first.items():
        dist: dict[str, float] = {}
        for n in names[index[head] :]:
            reached = [dist[p] for p in inputs[n] if p in dist]
            if n == head or reached:
                dist[n] = (max(reached) if n != head else 0.0) + durations[n]
        weight[a] = {b: dist[tail] for b, tail in final.items() if tail in dist}
    return _reached_cycle_means(weight)


def _reached_cycle_means(weight: dict[str, dict[str, float]]) -> dict[str, float]:
    """For a weighted digraph (``weight[a][b]``), each vertex's largest mean over the cycles of the
    strongly connected components that reach it (its own included; a component with no cycle
    contributes nothing)."""
    order: list[list[str]] = _components(weight)  # reverse topological: sinks first
    comp_of = {v: i for i, comp in enumerate(order) for v in comp}
    upstream: list[set[int]] = [set() for _ in order]  # the components with an edge into each
    for u, outs in weight.items():
        for v in outs:
            if comp_of[v] != comp_of[u]:
                upstream[comp_of[v]].add(comp_of[u])
    best: dict[int, float] = {}
    for i in reversed(range(len(order))):  # sources first
        best[i] = max([_max_cycle_mean(order[i], weight), *(best[j] for j in upstream[i])])
    return {v: best[comp_of[v]] for v in weight}


def _components(weight: dict[str, dict[str, float]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively; in reverse topological order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in weight:
        if root in index:
            continue
        work = [(root, iter(weight[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(weight[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(comp)
    return out


def _max_cycle_mean(comp: list[str], weight: dict[str, dict[str, float]]) -> float:
    """Karp's maximum cycle mean of one strongly connected component (0 without a cycle)."""
    members = set(comp)
    if len(comp) == 1 and comp[0] not in weight[comp[0]]:
        return 0.0
    n = len(comp)
    neg = -math.inf
    d = [{v: neg for v in comp} for _ in range(n + 1)]
    d[0][comp[0]] = 0.0
    for k in range(1, n + 1):
        for u in comp:
            if d[k - 1][u] == neg:
                continue
            for v, w in weight[u].items():
                if v in members and d[k - 1][u] + w > d[k][v]:
                    d[k][v] = d[k - 1][u] + w
    means = [min((d[n][v] - d[k][v]) / (n - k) for k in range(n) if d[k][v] != neg) for v in comp if d[n][v] != neg]
    return max(means, default=0.0)


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
