"""The report path's one-walk forms give exactly what the plain definitions give (issue 34).

`Timeline.busy_times` against `Timeline.busy` node by node, `energy.held_shares` (one walk of
the plan's units) against the time-weighted mean over each node's units, and the role table and representative layer against
``sum()`` over each group's records: equal, not approximately equal.
"""

from __future__ import annotations

import statistics

import pytest

from dabench_ir.energy import held_shares
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
        runs = [
            (u.allocation, u.node_s.get(name, np_.per_micro_batch_s) * m) for u in _units_by_node(plan).get(name, [])
        ]
        held = sum(t for _, t in runs)
        if held > 0:
            return min(1.0, max(0.0, sum(a * t for a, t in runs) / held))
    return min(1.0, max(0.0, float(np_.allocation)))


def test_held_shares_are_the_time_weighted_means(report):
    plan = report.plan
    shares = held_shares(plan)
    assert shares == {name: _held_share_by_definition(plan, name) for name in plan.node_plans}
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


def test_role_rows_bound_is_bound_of_their_records(report):
    """`_row` adds up its bound sums in the walk that adds its time: the same answer as `_bound_of`."""
    groups: dict[str, list] = {}
    for r in report.nodes:
        groups.setdefault(r.role or r.op_type, []).append(r)
    for row in role_rows(report, overheads=False):
        assert (row["bound"], row["bound_share"]) == _bound_of(groups[row["role"]])


def test_a_record_row_bounds_are_the_two_separate_passes():
    """`record_row` takes the step's and the nodes' dominant bound from one pass over the node rows:
    each the rule `attribution.dominant_bound` gives over the rows (with, and without, the overheads)."""
    from dabench_ir.report.attribution import dominant_bound
    from dabench_ir.sweep.results import record_row, strip_nodes

    nodes = [
        {"time_s": 1.0, "bound": "memory"},
        {"time_s": 0.5, "bound": "compute"},
        {"time_s": None, "bound": "compute"},
        {"time_s": 0.75, "bound": "compute"},
        {"time_s": float("nan"), "bound": "memory"},
        {"time_s": 0.1},
    ]
    for overheads in ({}, {"host": 3.0}, {"host": 0.1, "overhead": 0.2}):
        report = {"nodes": nodes, "overheads": overheads, "metrics": {"dominant_bound": "x", "node_bound": "y"}}
        row = record_row({"key": "k", "params": {}, "status": "ok", "report": report})
        assert row["dominant_bound"] == dominant_bound(nodes, overheads)[0]
        assert row["node_bound"] == dominant_bound(nodes)[0] == "compute"
        record = {"report": dict(report, metrics={})}
        strip_nodes(record)
        assert record["report"]["metrics"] == {"dominant_bound": row["dominant_bound"], "node_bound": "compute"}
    scaled = {"nodes": nodes, "extra": {"scale": {"chips": 4}}, "metrics": {"dominant_bound": "communication"}}
    row = record_row({"key": "k", "params": {}, "status": "ok", "report": scaled})
    assert (row["dominant_bound"], row["node_bound"]) == ("communication", "compute")


def test_json_text_writes_string_keys_first_and_other_keys_as_their_text():
    """`json_text` asks orjson for string keys first (twice as fast) and encodes data with another key
    again with the option for them: both texts are what the option alone writes."""
    import orjson

    from dabench_ir.report.model import json_text

    plain = {"a": [1.5, float("nan"), None, {"b": float("inf")}], "c": "text"}
    keyed = {"a": {1: 2.0, None: 3}, "z": [{"k": {2: "x"}}]}
    for data in (plain, keyed):
        assert json_text(data) == orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS).decode()
    assert json_text(keyed) == '{"a":{"1":2.0,"null":3},"z":[{"k":{"2":"x"}}]}'
    assert json_text({"big": 1 << 70}) == '{"big":1180591620717411303424}'  # past 64 bits: json writes it
