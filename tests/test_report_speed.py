"""The report path's one-walk forms give exactly what the plain definitions give (issue 34).

`Timeline.busy_times` against `Timeline.busy` node by node, `energy.held_shares` (one walk of
the plan's units) against the time-weighted mean over each node's units, and the role table and representative layer against
``sum()`` over each group's records: equal, not approximately equal.
"""

from __future__ import annotations

import statistics

import pytest

from dabench_ir.energy import held_share, held_shares
from dabench_ir.options import ProfileOptions
from dabench_ir.pipeline import profile_graph
from dabench_ir.plan import Schedule
from dabench_ir.report.attribution import _bound_of, representative_layer, role_rows
from dabench_ir.timeline import NodeTiming, Timeline
from tests.lowering_graphs import decoder


@pytest.fixture(scope="module", params=[("rdu", "inference"), ("rdu", "train"), ("wse", "inference"), ("ipu", "train")])
def report(request):
    target, mode = request.param
    return profile_graph(decoder(layers=3), target, ProfileOptions(mode=mode))


def test_busy_times_is_busy_of_every_node():
    timings = [NodeTiming("a", "u", 0.0, 2.0), NodeTiming("b", "u", 2.0, 2.5)]
    ran_twice = Timeline.from_timings(timings)
    ran_twice.node_busy_s = {"a": 1.25, "c": 0.5}  # "c" only in node_busy_s
    for timeline in (Timeline.from_timings(timings), ran_twice):
        times = timeline.busy_times()
        assert set(times) == set(timeline.nodes) | set(timeline.node_busy_s)
        assert times == {n: timeline.busy(n) for n in times}
    assert ran_twice.busy_times() == {"a": 1.25, "b": 0.5, "c": 0.5}


def _units_by_node(plan):
    out: dict[str, list] = {}
    for unit in plan.units:
        for name in unit.nodes:
            out.setdefault(name, []).append(unit)
    return out


def _held_share_by_definition(plan, name):
    """The time-weighted mean allocation over a sequential node's units, else its own allocation."""
    np_ = plan.node_plans[name]
    if plan.schedule is Schedule.SEQUENTIAL:
        m = max(1, int(plan.micro_batches or 1))
        runs = [(u.allocation, u.node_s.get(name, np_.per_micro_batch_s) * m) for u in _units_by_node(plan).get(name, [])]
        held = sum(t for _, t in runs)
        if held > 0:
            return min(1.0, max(0.0, sum(a * t for a, t in runs) / held))
    return min(1.0, max(0.0, float(np_.allocation)))


def test_held_shares_are_the_time_weighted_means(report):
    plan = report.plan
    shares = held_shares(plan)
    assert shares == {name: _held_share_by_definition(plan, name) for name in plan.node_plans}
    assert shares == {name: held_share(plan, name) for name in plan.node_plans}
    if plan.schedule is Schedule.SEQUENTIAL and any(len(u) > 1 for u in _units_by_node(plan).values()):
        assert any(0.0 < s < 1.0 for s in shares.values())  # training: a node in a forward and a backward section


def test_role_rows_are_the_sums_of_their_records(report):
    groups: dict[str, list] = {}
    for r in report.nodes:
        groups.setdefault(r.role or r.op_type, []).append(r)
    rows = {row["role"]: row for row in role_rows(report, overheads=False)}
    assert set(rows) == set(groups)
    for role, records in groups.items():
        row = rows[role]
        timed = [r.time_s for r in records if r.time_s is not None]
        energy = [r.energy_j for r in records if r.energy_j is not None]
        worked = [r for r in records if r.flops and r.intensity]
        assert row["time_s"] == (sum(timed) if timed else None)
        assert row["flops"] == sum(r.flops or 0 for r in records)
        assert row["bytes"] == sum(r.bytes or 0 for r in records)
        assert row["energy_j"] == (sum(energy) if energy else None)
        assert row["layers"] == len({r.layer for r in records if r.layer is not None})
        feed_bytes = sum(r.flops / r.intensity for r in worked)
        if feed_bytes:
            assert row["intensity"] == sum(r.flops for r in worked) / feed_bytes
    assert any(row["energy_j"] for row in rows.values())


def test_representative_layer_is_the_median_of_the_layer_sums(report):
    per: dict[str, dict[int, list]] = {}
    for r in report.nodes:
        if r.layer is not None:
            per.setdefault(r.role or r.op_type, {}).setdefault(r.layer, []).append(r)
    layers = sorted({r.layer for r in report.nodes if r.layer is not None})
    rows = representative_layer(report)
    assert [row["role"] for row in rows] == list(per)
    for row in rows:
        by_layer = per[row["role"]]
        times = [sum(x.time_s or 0.0 for x in by_layer.get(i, [])) for i in layers]
        assert row["time_s"] == statistics.median(times)
        assert (row["min_time_s"], row["max_time_s"]) == (min(times), max(times))
        assert row["flops"] == int(statistics.median([sum(x.flops or 0 for x in by_layer.get(i, [])) for i in layers]))
        assert row["bytes"] == int(statistics.median([sum(x.bytes or 0 for x in by_layer.get(i, [])) for i in layers]))
        assert row["bound"] == _bound_of([x for recs in by_layer.values() for x in recs])[0]


def test_containers_are_every_dotted_prefix():
    import random

    from dabench_ir.report.roles import _containers

    def by_definition(scopes):
        return {".".join(s.split(".")[:i]) for s in scopes for i in range(1, len(s.split(".")))}

    rng = random.Random(34)
    for _ in range(2000):
        scopes = {"".join(rng.choice("ab.") for _ in range(rng.randint(0, 7))) for _ in range(rng.randint(0, 6))}
        assert _containers(scopes) == by_definition(scopes), scopes
    assert _containers({"layers.0.attn.q_proj", "layers.0.mlp"}) == {"layers", "layers.0", "layers.0.attn"}
