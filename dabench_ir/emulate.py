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
from dataclasses import dataclass

from dabench_ir.ir import Graph
from dabench_ir.plan import PIPELINE_FILL_DRAIN, Plan, Schedule
from dabench_ir.timeline import NodeTiming, Timeline

__all__ = ["check_dependencies", "emulate"]

logger = logging.getLogger(__name__)


def _producers(graph: Graph, position: dict[str, int]) -> list[list[int]]:
    """Each placed node's placed producers (by ``position``: a node's index in the placed order, the
    graph's order less the nodes not placed), in input order, each once; a list in that order. Read
    from the graph's own (`Graph.producer_positions`), which it is when every node is placed."""
    every = graph.producer_positions
    if len(position) == len(every):
        return every
    placed = [position.get(n.name) for n in graph.nodes]  # each node's placed position, None if not placed
    return [
        [placed[p] for p in preds if placed[p] is not None] for i, preds in enumerate(every) if placed[i] is not None
    ]


@dataclass(slots=True)
class _Runs:
    """The emulation's state, one column per placed node, indexed by its position in the placed
    (graph) order: per-node data held by position, not in tables keyed by name (a lookup by name in
    a table of every node misses the caches on a deep model; bench/lookup_scaling.py).

    ``ends[i]``: node i's end per micro-batch simulated (and the last, once the closed form added
    it); ``slices[i]``: its runs; ``busy[i]``: the time it ran; ``lane_free``: when each lane is free."""

    lanes: list[str]
    preds: list[list[int]]
    ends: list[dict[int, float]]
    slices: list[list[tuple[float, float]]]
    busy: list[float]
    lane_free: dict[str, float]

    @classmethod
    def start(cls, lanes: list[str], preds: list[list[int]]) -> _Runs:
        n = len(lanes)
        return cls(lanes, preds, [{} for _ in range(n)], [[] for _ in range(n)], [0.0] * n, defaultdict(float))


def emulate(plan: Plan, graph: Graph) -> Timeline:
    """Simulate one step of ``plan``; the Timeline respects every graph dependency."""
    node_plans = plan.node_plans
    order = [n.name for n in graph.nodes if n.name in node_plans]
    position = {name: i for i, name in enumerate(order)}
    plans = [node_plans[name] for name in order]
    runs = _Runs.start([np_.lane for np_ in plans], _producers(graph, position))
    m_count = max(1, plan.micro_batches)

    if plan.schedule is Schedule.SEQUENTIAL:
        groups = []
        for u in plan.units:
            members = sorted(position[n] for n in u.nodes if n in position)
            groups.append((u, members))
    else:
        groups = [(None, list(range(len(order))))]

    overheads: dict[str, float] = defaultdict(float)
    unit_spans: dict[str, tuple[float, float]] = {}
    clock = 0.0
    for unit, members in groups:
        gate = clock
        if unit is not None and unit.gap_before_s > 0:
            gate += unit.gap_before_s
            overheads[unit.gap_kind] += unit.gap_before_s
        node_s = unit.node_s if unit is not None else {}
        # each node's time in the unit, else its plan's
        durations = [node_s[order[i]] if order[i] in node_s else plans[i].per_micro_batch_s for i in members]
        last = _run_micro_batches(members, durations, m_count, gate, runs)
        if unit is not None:
            stall = max(0.0, gate + unit.min_time_s - last)
            if stall > 0:
                overheads["memory_stall"] += stall
            unit_spans[unit.id] = (gate, last + stall)
            clock = last + stall
        else:
            clock = last

    timings = {
        name: NodeTiming(node=name, unit=np_.unit, start=ran[0][0], end=ran[-1][1], bound=np_.bound)
        for name, np_, ran in zip(order, plans, runs.slices, strict=True)
    }
    latest = max((ran[-1][1] for ran in runs.slices), default=None)
    ran_order = dict.fromkeys(i for _, members in groups for i in members)  # the order the nodes first ran
    busy_node = {order[i]: runs.busy[i] for i in ran_order}
    unit_busy: dict[str, float] = defaultdict(float)
    for i in ran_order:
        unit_busy[plans[i].unit] += runs.busy[i]
    if plan.schedule is Schedule.SEQUENTIAL:
        unit_busy.update({uid: b - a for uid, (a, b) in unit_spans.items()})
    else:
        for u in plan.units:
            spans = [runs.slices[position[n]] for n in u.nodes if n in position]
            if spans:
                unit_spans[u.id] = (min(ran[0][0] for ran in spans), max(ran[-1][1] for ran in spans))
    makespan = max(clock, 0.0 if latest is None else latest)
    if plan.pipelined_steps and plan.schedule is Schedule.CONCURRENT:
        # consecutive steps overlap in the pipeline: a step is its busiest unit's work, every lane of
        # it (an IPU running two stages of different micro-batches in each cycle does both)
        step = max(unit_busy.values(), default=0.0)
    else:
        step = makespan
    latency = makespan  # one step from its first input to its last output, nothing overlapping it
    for name, seconds in plan.step_overheads_s.items():  # serial: nothing else runs meanwhile
        overheads[name] += seconds
        step += seconds
        if name != PIPELINE_FILL_DRAIN:  # a step alone fills and drains its pipeline in its makespan
            latency += seconds
    if plan.pipelined_steps and PIPELINE_FILL_DRAIN in plan.step_overheads_s:
        # its steps do not overlap: each drains before the next (a training step's weight update), so
        # the step is one step alone, its fill and drain the lowering's (the makespan had read 1.5 ms
        # shorter than a Bow training step, and 4.9x a WSE one's)
        latency = step
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
        slices=dict(zip(order, runs.slices, strict=True)),
        lanes=dict(zip(order, runs.lanes, strict=True)),
        unit_spans=unit_spans,
    )
    logger.debug("emulated %d nodes x %d micro-batch(es): step %.3g s", len(order), m_count, step)
    return timeline


def _run_micro_batches(members: list[int], durations: list[float], m_count: int, gate: float, runs: _Runs) -> float:
    """Run ``m_count`` micro-batches of the nodes at ``members`` (positions, in graph order; their
    ``durations`` alike) from ``gate``, recording each run in ``runs``; the time the last run ends.

    The event times are a max-plus linear recurrence in the micro-batch index: a lane runs its
    nodes in order every micro-batch, so each micro-batch waits for the one before on every lane.
    Its growth rate, seconds per micro-batch, is a node's lane's `_lane_rates`: the largest mean
    of the cycles that reach the lane (a lane's own load, or a round trip: a pipeline stage whose
    forward waits for its backward of the micro-batch before). Once every node's run ends exactly
    its rate after its previous run, for two micro-batches in a row, the recurrence is linear from
    there on, and the rest of the micro-batches are added in closed form: m micro-batches cost
    fill + m periods + drain without m simulations. ``runs.slices`` keeps each simulated run and
    the last one.
    """
    lanes, preds, ends, slices, busy, lane_free = (
        runs.lanes,
        runs.preds,
        runs.ends,
        runs.slices,
        runs.busy,
        runs.lane_free,
    )
    rate: dict[str, float] = {}
    last = gate
    steady = 0
    for m in range(m_count):
        for i, took in zip(members, durations, strict=True):
            lane = lanes[i]
            # the latest of the gate, the lane free and the producers' ends of this micro-batch
            ready = max(gate, lane_free[lane])
            for p in preds[i]:
                e = ends[p].get(m)
                if e is not None and e > ready:
                    ready = e
            finish = ready + took
            ends[i][m] = finish
            lane_free[lane] = finish
            slices[i].append((ready, finish))
            busy[i] += took
            if finish > last:
                last = finish
        if m == 0 or m == m_count - 1:
            continue
        if not rate:
            rate = _lane_rates(members, durations, runs)
        tol = 1e-12 * max(abs(last), 1e-30)
        settled = all(abs(ends[i][m] - ends[i][m - 1] - rate[lanes[i]]) <= tol for i in members)
        steady = steady + 1 if settled else 0
        if steady >= 2:  # two micro-batches in a row at the lanes' rates: linear from here on
            rest = m_count - 1 - m
            for i, took in zip(members, durations, strict=True):
                start, finish = slices[i][-1]
                shift = rest * rate[lanes[i]]
                slices[i].append((start + shift, finish + shift))
                ends[i][m_count - 1] = finish + shift
                busy[i] += rest * took
                last = max(last, finish + shift)
            for lane in rate:
                lane_free[lane] += rest * rate[lane]
            return last
    return last


def _lane_rates(members: list[int], durations: list[float], runs: _Runs) -> dict[str, float]:
    """Each lane's steady growth rate, seconds per micro-batch, exactly (max-plus algebra), for
    the nodes at ``members`` (positions in graph order, which every lane's order follows).

    Lanes form a graph: an edge a -> b weighs the longest path, inside one micro-batch, from a's
    first node to b's last (node durations along graph and lane order), after which b's next
    micro-batch may start. A lane's rate is the largest cycle mean (weight per edge, one edge a
    micro-batch) of the strongly connected parts of that graph that reach it (Karp's algorithm on
    each part).

    Nodes on one lane (an RDU section, a GPU stream) form one cycle through all of them: the rate
    is their durations' sum, which the general walk below also gives, after a pass per lane."""
    lanes = {runs.lanes[i] for i in members}
    if len(lanes) == 1:
        period = 0.0
        for took in durations:  # left to right, as the walk below adds them
            period += took
        return {lanes.pop(): period}
    local = {i: j for j, i in enumerate(members)}  # a member's index in ``members``
    first: dict[str, int] = {}
    final: dict[str, int] = {}
    inputs: list[list[int]] = []
    for j, i in enumerate(members):
        lane = runs.lanes[i]
        inputs.append([local[p] for p in runs.preds[i] if p in local] + ([final[lane]] if lane in final else []))
        first.setdefault(lane, j)
        final[lane] = j
    weight: dict[str, dict[str, float]] = {}
    for a, head in first.items():
        dist: dict[int, float] = {}
        for j in range(head, len(members)):
            reached = [dist[p] for p in inputs[j] if p in dist]
            if j == head or reached:
                dist[j] = (max(reached) if j != head else 0.0) + durations[j]
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
    placed = [n.name for n in graph.nodes if n.name in timeline.nodes]
    preds = _producers(graph, {name: i for i, name in enumerate(placed)})
    for name, positions in zip(placed, preds, strict=True):
        mine = timeline.slices.get(name) or [(timeline.nodes[name].start, timeline.nodes[name].end)]
        for p in (placed[i] for i in positions):
            theirs = timeline.slices.get(p) or [(timeline.nodes[p].start, timeline.nodes[p].end)]
            for m, ((start, _), (_, p_end)) in enumerate(zip(mine, theirs, strict=False)):
                if start + tol < p_end:
                    problems.append(f"{name} (micro-batch {m}) starts at {start:.3g}s before {p} ends at {p_end:.3g}s")
    return problems
