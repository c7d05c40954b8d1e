"""Emulation: run a Plan as a discrete-event simulation and return a `Timeline`.

Every node runs once per micro-batch on its lane (a region, a pipeline stage, a stream);
a lane runs one thing at a time, in the order micro-batch then topological order, and a
run starts when its lane is free and the same micro-batch of every producer has ended.
A node that takes its rows in one after another (`NodePlan.rows` > 1: a WSE region's token
rows) starts on its producers' first rows, ends no sooner than one of its rows after their
last, and passes each row on as it makes it: its consumers and the next run on its lane start
one row in (the lane's runs still take their times in turn), but a node that holds its rows
(`NodePlan.holds`: a WSE attention kernel) passes them to other lanes only at its end.
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
from dabench_ir.plan import PIPELINE_FILL_DRAIN, NodePlan, Plan, Schedule
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
    it); ``firsts[i]``: when its first row is out (its ends, the same table, when no node streams
    rows); ``rows[i]``, ``holds[i]``: its plan's `NodePlan.rows` and `NodePlan.holds`;
    ``slices[i]``: its runs; ``busy[i]``: the time it ran; ``lane_free``: when each lane's work
    is done (its runs' times in turn from their starts); ``lane_next``: when it may start its next
    run (``lane_free``, or beside a streaming run one row into it)."""

    lanes: list[str]
    rows: list[int]
    holds: list[bool]
    preds: list[list[int]]
    ends: list[dict[int, float]]
    firsts: list[dict[int, float]]
    slices: list[list[tuple[float, float]]]
    busy: list[float]
    lane_free: dict[str, float]
    lane_next: dict[str, float]

    @classmethod
    def start(cls, plans: list[NodePlan], preds: list[list[int]]) -> _Runs:
        n = len(plans)
        rows = [p.rows for p in plans]
        ends: list[dict[int, float]] = [{} for _ in range(n)]
        firsts = [{} for _ in range(n)] if any(r > 1 for r in rows) else ends
        return cls(
            lanes=[p.lane for p in plans],
            rows=rows,
            holds=[p.holds for p in plans],
            preds=preds,
            ends=ends,
            firsts=firsts,
            slices=[[] for _ in range(n)],
            busy=[0.0] * n,
            lane_free=defaultdict(float),
            lane_next=defaultdict(float),
        )


def emulate(plan: Plan, graph: Graph) -> Timeline:
    """Simulate one step of ``plan``; the Timeline respects every graph dependency."""
    node_plans = plan.node_plans
    order = [n.name for n in graph.nodes if n.name in node_plans]
    position = {name: i for i, name in enumerate(order)}
    plans = [node_plans[name] for name in order]
    runs = _Runs.start(plans, _producers(graph, position))
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
        streamed_rows={name: r for name, r in zip(order, runs.rows, strict=True) if r > 1},
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
    lanes, rows, holds, preds, ends, firsts, slices, busy = (
        runs.lanes,
        runs.rows,
        runs.holds,
        runs.preds,
        runs.ends,
        runs.firsts,
        runs.slices,
        runs.busy,
    )
    lane_free, lane_next = runs.lane_free, runs.lane_next

    def run(i: int, took: float, m: int) -> float:
        """Node ``i``'s run of micro-batch ``m``, recorded; its end. It starts at the latest of the
        gate, its lane's next start and its producers' first rows of this micro-batch, and ends at
        the latest of its lane's work done (the lane's runs take their times in turn) and one of its
        rows after each producer's end (without rows: at its start plus its time). A run of no time
        (bookkeeping: a Shape, a Reshape) waits for no lane and holds none."""
        lane, row = lanes[i], took / rows[i]  # row: the time of one of its rows
        ready = max(gate, lane_next[lane]) if took else gate
        last_rows = gate  # one of its rows after its producers' last
        for p in preds[i]:
            first = firsts[p].get(m)
            if first is not None:
                end = ends[p][m]
                ready = max(ready, end if holds[p] and lanes[p] != lane else first)
                last_rows = max(last_rows, end + row)
        worked = (max(lane_free[lane], ready) if took else ready) + took
        finish = max(worked, last_rows)
        first = ready + row if rows[i] > 1 else finish  # its first row out (a whole run's: its end)
        ends[i][m] = finish
        firsts[i][m] = first
        if took:
            lane_free[lane] = worked
            lane_next[lane] = first
        slices[i].append((ready, finish))
        busy[i] += took
        return finish

    rate: dict[str, float] = {}
    last = gate
    steady = 0
    for m in range(m_count):
        for i, took in zip(members, durations, strict=True):
            last = max(last, run(i, took, m))
        if m == 0 or m == m_count - 1:
            continue
        if not rate:
            rate = _lane_rates(members, durations, runs)
        tol = 1e-12 * max(abs(last), 1e-30)
        settled = all(
            abs(ends[i][m] - ends[i][m - 1] - rate[lanes[i]]) <= tol
            for i, took in zip(members, durations, strict=True)
            if took
        )
        steady = steady + 1 if settled else 0
        if steady >= 2:  # two micro-batches in a row at the lanes' rates: linear from here on
            rest = m_count - 1 - m
            for i, took in zip(members, durations, strict=True):
                if not took:  # on no lane: its producers' last runs, placed before it, say when it runs
                    last = max(last, run(i, took, m_count - 1))
                    continue
                start, finish = slices[i][-1]
                shift = rest * rate[lanes[i]]
                slices[i].append((start + shift, finish + shift))
                firsts[i][m_count - 1] = firsts[i][m] + shift
                ends[i][m_count - 1] = finish + shift
                busy[i] += rest * took
                last = max(last, finish + shift)
            for lane in rate:
                lane_free[lane] += rest * rate[lane]
                lane_next[lane] += rest * rate[lane]
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
        lane, on_lane = runs.lanes[i], bool(durations[j])  # a run of no time holds no lane (`_run_micro_batches`)
        inputs.append(
            [local[p] for p in runs.preds[i] if p in local] + ([final[lane]] if on_lane and lane in final else [])
        )
        if not on_lane:
            continue
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
    matching run of every producer ended, or, after a producer that passes its rows on one after
    another (`Timeline.streamed_rows`), after its first row and end no sooner than it. An empty list means the
    timeline is consistent."""
    problems = []
    placed = [n.name for n in graph.nodes if n.name in timeline.nodes]
    preds = _producers(graph, {name: i for i, name in enumerate(placed)})
    runs = max(1, timeline.micro_batches)
    for name, positions in zip(placed, preds, strict=True):
        mine = timeline.slices.get(name) or [(timeline.nodes[name].start, timeline.nodes[name].end)]
        for p in (placed[i] for i in positions):
            theirs = timeline.slices.get(p) or [(timeline.nodes[p].start, timeline.nodes[p].end)]
            rows = timeline.streamed_rows.get(p)
            first_row = timeline.node_busy_s.get(p, 0.0) / runs / rows if rows else None
            for m, ((start, end), (p_start, p_end)) in enumerate(zip(mine, theirs, strict=False)):
                if first_row is None and start + tol < p_end:
                    problems.append(f"{name} (micro-batch {m}) starts at {start:.3g}s before {p} ends at {p_end:.3g}s")
                elif first_row is not None and (start + tol < p_start + first_row or end + tol < p_end):
                    problems.append(
                        f"{name} (micro-batch {m}) runs {start:.3g}-{end:.3g}s, before {p}'s first row "
                        f"({p_start + first_row:.3g}s) or ending before it ({p_end:.3g}s)"
                    )
    return problems
