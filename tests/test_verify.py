"""The physics verifiers (`dabench_ir.verify`): exact hand-made cases, and a property grid.

The exact cases build a Report by hand on a toy target (peak 100 FLOP/s at fp32, 400 at fp16;
DRAM at 10 B/s; 10 W), one that keeps every invariant and one per invariant that breaks it,
and check the invariant's name and its two numbers. The grid profiles small decoders on every
dataflow target and two GPUs, in inference and training, at every precision, batch 1, 2 and 4,
on one chip and on two with the target's strategy, and asks each invariant of each report.

Invariants today's models break on a target are marked ``xfail(strict=True)`` for that target
alone: once the mechanism is fixed the test passes, strict xfail turns that into a failure, and
the mark must go.
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys

import pytest

from dabench_ir.ir import DType
from dabench_ir.passes import meta
from dabench_ir.plan import NodePlan, Plan, Schedule
from dabench_ir.report.model import NodeRecord, Report
from dabench_ir.targets import MemoryLevel, Quantity, Target
from dabench_ir.verify import INVARIANTS, RTOL, PhysicsError, Violation, check, verify
from tests.conftest import property_settings
from tests.lowering_graphs import chain, decoder

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# -- exact tiny cases ------------------------------------------------------------------------------


def _q(value: float) -> Quantity:
    return Quantity(value, "test")


TOY = Target(
    name="toy",
    kind="gpu",
    description="a toy chip",
    aliases=(),
    process_node=_q(7),
    power=_q(10),
    power_covers="chip",
    units=_q(1),
    unit_name="core",
    clock=None,
    peaks={"fp32": _q(100), "fp16": _q(400)},
    memories=(MemoryLevel("sram", "on-chip", _q(1000), _q(1000)), MemoryLevel("dram", "off-chip", _q(10_000), _q(10))),
)


def tiny(
    *, step: float = 2.5, fits: bool = True, graph: bool = True, memory: int = 500, energy: float = 7.0, **nodes: dict
) -> Report:
    """Two chained nodes on TOY that keep every invariant, each at or under its limit:

    n0: 100 FLOPs, 5 B from DRAM, 1 s (100 FLOP/s = the fp32 peak; intensity 20, roof 100), 5 J;
    n1: 50 FLOPs, 10 B from DRAM, 1 s (10 B/s = the DRAM bandwidth; intensity 5, roof 50), 2 J;
    the step: 2.5 s (work bound 1.5 s, chain bound 2 s), 150 FLOPs, 7 J of 25 J rated, 500 B of
    10,000 resident. ``nodes``: per-node changes to the records (``feed_bytes``: to the plan)."""
    base = {
        "n0": {"flops": 100, "feed_bytes": 5, "time_s": 1.0, "energy_j": 5.0, "intensity": 20.0},
        "n1": {"flops": 50, "feed_bytes": 10, "time_s": 1.0, "energy_j": 2.0, "intensity": 5.0},
    }
    for name, change in nodes.items():
        base[name].update(change)
    g = chain([base["n0"]["flops"], base["n1"]["flops"]], [2, 2])
    plan = Plan(target=TOY, options=None, precision=DType.FLOAT32, schedule=Schedule.CONCURRENT)
    records = []
    for node in g.nodes:
        b = base[node.name]
        plan.node_plans[node.name] = NodePlan(
            node.name, "u", "u", b["time_s"], flops=b["flops"], feed_level="dram", feed_bytes=b["feed_bytes"]
        )
        rec = NodeRecord(
            node.name,
            "Op",
            None,
            node.scope,
            None,
            meta.get_cost(node),
            intensity=b["intensity"],
            time_s=b["time_s"],
            energy_j=b["energy_j"],
            precision=b.get("precision"),
        )
        records.append(rec)
    flops = sum(r.flops for r in records)
    return Report(
        model={},
        target={"name": "toy", "kind": "gpu"},
        config={"precision": "fp32", "chips": 1},
        nodes=records,
        unattributed=[],
        fits=fits,
        plan=plan,
        target_obj=TOY,
        graph=g if graph else None,
        totals={
            "flops": flops,
            "time_s": step,
            "achieved_flops_per_s": flops / step,
            "energy_j": energy,
            "target_power_w": 10.0,
        },
        metrics={"memory_use": {"dram": {"bytes": memory, "capacity_bytes": 10_000, "fraction": memory / 10_000}}},
    )


def _only(report: Report) -> dict[str, list[Violation]]:
    out: dict[str, list[Violation]] = {}
    for v in verify(report):
        out.setdefault(v.invariant, []).append(v)
    return out


def test_a_report_at_every_limit_passes():
    report = tiny()
    assert verify(report) == []
    assert check(report) is report


@pytest.mark.parametrize(
    ("speedup", "superlinear", "broken"),
    [(8.0, None, False), (8.55, None, True), (8.91, "ZeRO-1 shards the optimizer update", False)],
)
def test_a_speedup_above_linear_needs_a_named_mechanism(speedup, superlinear, broken):
    report = tiny()
    report.extra["scale"] = {
        "points": [{"chips": 1, "speedup": 1.0}, {"chips": 8, "speedup": speedup, "superlinear": superlinear}]
    }
    found = _only(report).get("speedup_linear", [])
    assert [(v.where, v.value, v.limit) for v in found] == ([("8 chips", speedup, 8.0)] if broken else [])


@pytest.mark.parametrize(
    ("batch", "speedup", "limit"), [(16, 8.55, 8.0), (32, 8.55, None), (32, 16.5, 16.0), (2, 8.5, 8.0)]
)
def test_a_chip_running_more_samples_may_scale_above_its_count(batch, speedup, limit):
    """8 chips over one chip of 2 samples a step: each chip of a 32-sample step runs 4 (2x the one
    chip's), so up to 16x; a 16-sample step (the one chip's 2 each) stays at 8x; tensor-parallel
    shares of the one chip's 2 samples (1/8 each) are still held to 8x, not below."""
    report = tiny()
    report.extra["scale"] = {"points": [{"chips": 8, "batch": batch, "speedup": speedup, "base_samples": 2}]}
    found = _only(report).get("speedup_linear", [])
    assert [v.limit for v in found] == ([limit] if limit else [])


def test_node_above_its_dtype_peak():
    found = _only(tiny(n0={"time_s": 0.5}))
    (v,) = found["node_peak_flops"]
    assert (v.where, v.value, v.limit) == ("n0", 200.0, 100.0)
    assert "fp32" in v.detail
    assert "node_peak_flops" not in _only(tiny(n0={"time_s": 0.5, "precision": "fp16"}))  # 200 <= 400 at fp16


def test_node_above_its_feed_bandwidth():
    found = _only(tiny(n1={"feed_bytes": 30}))
    assert set(found) == {"node_feed_bandwidth", "step_time_critical_path"}  # n1 alone needs 3 s at 10 B/s
    (v,) = found["node_feed_bandwidth"]
    assert (v.where, v.value, v.limit) == ("n1", 30.0, 10.0)
    assert "dram" in v.detail


def test_resident_bytes_above_capacity_when_it_fits():
    (v,) = _only(tiny(memory=20_000))["memory_capacity"]
    assert (v.where, v.value, v.limit) == ("dram", 20_000, 10_000)
    assert verify(tiny(memory=20_000, fits=False)) == []  # a plan that does not fit says so itself


def test_step_shorter_than_its_work():
    found = _only(tiny(step=1.0))
    assert set(found) == {"step_peak_flops", "step_time_work", "step_time_critical_path"}
    assert (found["step_peak_flops"][0].value, found["step_peak_flops"][0].limit) == (150.0, 100.0)
    assert (found["step_time_work"][0].value, found["step_time_work"][0].limit) == (1.0, 1.5)


def test_step_shorter_than_its_critical_path():
    found = _only(tiny(step=1.8))
    (v,) = found["step_time_critical_path"]
    assert set(found) == {"step_time_critical_path"}
    assert (v.value, v.limit) == (1.8, 2.0)
    assert "n1" in v.detail  # the chain n0 -> n1
    assert verify(tiny(step=1.8, graph=False)) == []  # without the graph: the largest node alone (1 s)


def test_step_shorter_than_its_largest_node():
    (v,) = _only(tiny(step=1.6, graph=False, n0={"time_s": 2.0, "feed_bytes": 20}))["step_time_critical_path"]
    assert (v.value, v.limit) == (1.6, 2.0)
    assert "n0" in v.detail


def test_node_energy_above_rated_power():
    (v,) = _only(tiny(n0={"energy_j": 20.0}))["node_power"]
    assert (v.where, v.value, v.limit) == ("n0", 20.0, 10.0)


def test_step_energy_above_rated_power():
    (v,) = _only(tiny(energy=30.0))["step_power"]
    assert (v.where, v.value, v.limit) == ("step", 30.0, 25.0)


def test_a_multi_chip_steps_energy_is_its_parts_and_every_chips_static_power():
    """A 4-H100 step whose energy were one chip's, or not its dynamic and static parts' sum, broke no
    invariant (`energy_floor`, `energy_sum`); a multi-chip report's dynamic energy held no link energy
    where a one-chip report's does (the parts missed 63 uJ of a 2-chip training step's 160 mJ)."""
    from dabench_ir.pipeline import profile_graph
    from tests.lowering_graphs import decoder

    options = {"mode": "train", "chips": 2, "strategy": "dp"}
    report = profile_graph(decoder(layers=2, hidden=64, seq=16, batch=2), "h100", options)
    t = report.totals
    assert t["link_energy_j"] > 0 and verify(report) == []
    assert t["energy_j"] == pytest.approx(t["dynamic_energy_j"] + t["static_energy_j"], rel=1e-12)
    one_chip = {k: t[k] / 2 for k in ("energy_j", "dynamic_energy_j", "static_energy_j")}
    (v,) = _only(dataclasses.replace(report, totals={**t, **one_chip}))["energy_floor"]
    from dabench_ir.energy import energy_model

    assert v.limit == pytest.approx(energy_model(report.target_obj).static_watts * 2 * t["time_s"], rel=1e-9)
    (v,) = _only(dataclasses.replace(report, totals={**t, "energy_j": t["energy_j"] * 1.01}))["energy_sum"]
    assert v.limit == pytest.approx(t["energy_j"])


def test_shares_that_do_not_sum_to_one(monkeypatch):
    from dabench_ir.report import attribution

    rows = [{"role": "a", "share": 0.5}, {"role": "b", "share": 0.4}]
    monkeypatch.setattr(attribution, "role_rows", lambda report: rows)
    (v,) = _only(tiny())["shares_sum"]
    assert (v.where, v.value, v.limit) == ("roles", 0.9, 1.0)
    rows[1]["share"] = 0.5 + RTOL / 2  # within the tolerance
    assert verify(tiny()) == []


def test_roofline_point_above_its_roof():
    found = _only(tiny(n1={"intensity": 2.0}))  # the report plots n1 at 2 FLOP/B: roof 20 FLOP/s
    assert set(found) == {"roofline_point"}
    (v,) = found["roofline_point"]
    assert (v.where, v.value, v.limit) == ("n1", 50.0, 20.0)


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_a_negative_or_not_finite_time_is_refused(seconds):
    """The node checks skip a node without a positive time (it does no work to bound): a node at -1 s
    had passed every invariant."""
    found = _only(tiny(n1={"time_s": seconds}))
    assert "times_valid" in found
    (v,) = found["times_valid"]
    assert v.where == "n1" and v.limit == 0.0


def test_nodes_without_time_or_work_are_skipped():
    assert verify(tiny(n0={"time_s": 0.0, "energy_j": 99.0})) == []
    assert verify(tiny(n0={"flops": 0, "feed_bytes": 0, "energy_j": 99.0, "intensity": None})) == []


def test_check_raises_the_first_violation():
    with pytest.raises(PhysicsError) as info:
        check(tiny(n0={"energy_j": 20.0}))
    assert info.value.violation == Violation("node_power", "n0", 20.0, 10.0, info.value.violation.detail)
    assert "node_power at n0: 20 > 10" in str(info.value)


def test_an_unplaced_report_has_only_shares_to_check():
    from dabench_ir.pipeline import profile_graph

    assert verify(profile_graph(decoder(layers=1), None)) == []


def test_verify_imports_no_heavy_module():
    code = (
        "import sys, dabench_ir.verify\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnxruntime', 'matplotlib')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# -- the grid --------------------------------------------------------------------------------------

TARGETS = ("wse", "rdu", "ipu", "h100", "a100")
MODES = ("inference", "train")
PRECISIONS = ("fp32", "fp16", "bf16", "mixed")
BATCHES = (1, 2, 4)
CHIPS = (1, 2)
SIZES = ((2, 64, 16), (2, 128, 32))  # (layers, hidden, seq): both place in tens of milliseconds
WSE_MODES = ("auto", "pipelined", "streaming")  # the WSE's execution modes; other targets have one

GRID = property_settings("DABENCH_VERIFY_EXAMPLES", 20)


@functools.cache
def violations(
    target: str, mode: str, precision: str, batch: int, chips: int, size: tuple[int, int, int], wse_mode: str | None
) -> tuple[Violation, ...]:
    """Every violation in the report of a small decoder run (cached: each invariant asks it)."""
    from dabench_ir.pipeline import profile_graph
    from dabench_ir.targets import load_target

    options: dict = {"mode": mode, "precision": precision, "no_verify": True}  # the grid asks verify() itself
    if wse_mode is not None:
        options["wse_mode"] = wse_mode
    if chips > 1:
        options.update(chips=chips, strategy=load_target(target).strategies[0])
    layers, hidden, seq = size
    report = profile_graph(decoder(layers=layers, hidden=hidden, seq=seq, batch=batch), target, options)
    return tuple(verify(report))


# (invariant, target) -> why it fails today; each has its @example below and in docs/reports.md
KNOWN: dict[tuple[str, str], str] = {}  # (invariant, target) -> why today's model breaks it: none


def _cases():
    for invariant in INVARIANTS:
        for target in TARGETS:
            reason = KNOWN.get((invariant, target))
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason else []
            yield pytest.param(invariant, target, marks=marks, id=f"{invariant}-{target}")


SMALL, WIDER = SIZES


@pytest.mark.parametrize(("invariant", "target"), list(_cases()))
@GRID
@given(
    mode=st.sampled_from(MODES),
    precision=st.sampled_from(PRECISIONS),
    batch=st.sampled_from(BATCHES),
    chips=st.sampled_from(CHIPS),
    size=st.sampled_from(SIZES),
    wse_mode=st.sampled_from(WSE_MODES),
)
# the examples that break an invariant today (KNOWN), tried first on every target
@example(mode="inference", precision="fp32", batch=1, chips=1, size=SMALL, wse_mode="auto")  # RDU
@example(mode="inference", precision="mixed", batch=1, chips=1, size=SMALL, wse_mode="auto")  # GPU softmax
@example(mode="inference", precision="fp32", batch=1, chips=1, size=SMALL, wse_mode="streaming")  # WSE
@example(mode="train", precision="fp16", batch=1, chips=1, size=WIDER, wse_mode="auto")  # IPU power
def test_grid_keeps_the_invariant(invariant, target, mode, precision, batch, chips, size, wse_mode):
    assume(not (target == "wse" and chips > 1 and wse_mode == "pipelined"))  # one system only: refused
    run = (target, mode, precision, batch, chips, size, wse_mode if target == "wse" else None)
    found = [v for v in violations(*run) if v.invariant == invariant]
    assert not found, f"{run}: {found[0]} (+{len(found) - 1} more)"


def test_known_failures_name_real_invariants_and_targets():
    assert {i for i, _ in KNOWN} <= set(INVARIANTS)
    assert {t for _, t in KNOWN} <= set(TARGETS)


def test_a_violation_is_an_internal_error_of_one_line_and_no_verify_skips_it(monkeypatch, tmp_path, capsys):
    """The product runs the verifier after every placement: a violation exits 1 with one line naming the
    invariant, the node and the two numbers, and prints no figure; --no-verify (debugging) skips it and
    the report says its figures were not checked."""
    import json

    from dabench_ir import verify as verify_module
    from dabench_ir.cli import main
    from tests.conftest import parse

    model = tmp_path / "m.onnx"
    model.write_bytes(
        parse("agraph (float[2,8,8] x, float[8,8] w) => (float[2,8,8] y) { y = MatMul(x, w) }").SerializeToString()
    )
    broken = Violation("node_peak_flops", "MatMul_0", 2.0, 1.0, "planted")
    monkeypatch.setattr(verify_module, "_violations", lambda report: iter([broken]))
    assert main(["profile", str(model), "-t", "h100"]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "internal error" in err[0] and "node_peak_flops at MatMul_0" in err[0], err
    assert "per step" not in captured.out  # no figure was printed
    out = tmp_path / "r.json"
    assert main(["profile", str(model), "-t", "h100", "--no-verify", "-q", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["extra"]["verified"] is False


def test_an_elementwise_node_cannot_borrow_the_contraction_peak(monkeypatch):
    """node_class_rate (issue 43): a node's vector and special-function work runs at its op class's rate.
    The RDU shares a section's time out over its stages from floors; floored at the contraction peak (the
    rule before), a Softmax or a Mul ran up to 4x (here; 12x on LLaMA) faster than the PCUs' SIMD rates allow."""
    from dabench_ir import api
    from dabench_ir.lowering.rdu import timing

    report = api.profile("gpt2-small", "sn30", batch=4, dims={"seq": 128})
    assert verify(report) == []
    target = report.target_obj

    def contraction_peak_floor(self, node, cost):  # the old floor: every FLOP at the tiles' contraction peak
        return cost.flops / (target.peak_flops(self.ctx.precision) * self.share)

    monkeypatch.setattr(timing.TileFloor, "seconds", contraction_peak_floor)
    # and sections at their floors (since session 60 a section computes on the PCUs it holds, so
    # its pipeline outlasts the floors and hid the old one)
    monkeypatch.setattr(timing, "pipeline_s", lambda stages, room, pcus: 0.0)
    found = _only(api.profile("gpt2-small", "sn30", batch=4, dims={"seq": 128}, no_verify=True))
    broken = found["node_class_rate"]
    assert {v.where.split("_")[1].lower() for v in broken} >= {"softmax", "mul"}
    assert max(v.value / v.limit for v in broken) == pytest.approx(4.0)  # the contraction peak over the vector rate


def test_a_placed_step_shorter_than_its_work_at_the_highest_peak():
    """`check_step` (a placement whose report is not built, a why line's variant): the step's
    150 FLOPs at TOY's highest peak (400 FLOP/s, fp16) need 0.375 s, whatever dtype each node has."""
    from types import SimpleNamespace

    from dabench_ir.verify import check_step

    g = chain([100, 50], [2, 2])
    plan = Plan(target=TOY, options=None, precision=DType.FLOAT32, schedule=Schedule.CONCURRENT)
    check_step(g, TOY, plan, SimpleNamespace(step_time_s=0.375))
    with pytest.raises(PhysicsError) as err:
        check_step(g, TOY, plan, SimpleNamespace(step_time_s=0.3))
    v = err.value.violation
    assert (v.invariant, v.value, v.limit) == ("step_time_work", 0.3, 0.375)
    check_step(g, TOY, dataclasses.replace(plan, chips=2), SimpleNamespace(step_time_s=0.1875))  # 2 chips
    # two copies of the graph on those 2 chips (IPU or WSE replicas) do twice the work: 0.375 s again
    copies = dataclasses.replace(plan, chips=2, replicas=2)
    check_step(g, TOY, copies, SimpleNamespace(step_time_s=0.375))
    with pytest.raises(PhysicsError):
        check_step(g, TOY, copies, SimpleNamespace(step_time_s=0.1875))


def test_a_placement_over_several_chips_is_checked_when_placed_before_any_report(monkeypatch):
    """The fitting search's try over more chips is placed and never reported by `profile`: its points
    are checked when placed (`verify.check_scaled`), a speedup above linear with no mechanism named
    refused there, as the report's check would; ``--no-verify`` skips it."""
    from dabench_ir import scaling
    from dabench_ir.options import ProfileOptions
    from dabench_ir.pipeline import profile_graph
    from dabench_ir.run import placed

    report = profile_graph(decoder(layers=2), "h100", ProfileOptions())
    scale = scaling.scale

    def above_linear(*args, **kwargs):
        result = scale(*args, **kwargs)
        result.points[-1].speedup = 2.5 * result.points[-1].chips
        return result

    monkeypatch.setattr(scaling, "scale", above_linear)
    run = report.run.variant(chips=2, strategy="dp")
    with pytest.raises(PhysicsError, match="speedup_linear at 2 chips: 5 > 2"):
        placed(run, report.graph.clone())
    unchecked = placed(run.variant(no_verify=True), report.graph.clone())
    assert unchecked.scaled.points[-1].speedup == 5.0 and unchecked.built is None


def test_a_study_over_batches_holds_each_point_to_its_own_batchs_one_chip():
    """``scale --batch 1,8``: the batch-8 points' speedups are over the batch-8 one-chip run, and the
    verifier holds them to that baseline, not the first batch's (where 8 samples a chip over 1 would
    allow 8x more)."""
    from dabench_ir.api import scale_model

    result = scale_model("gpt2-small", "h100", [1, 2], [1, 8], {"strategy": "tp"})
    assert [(p.batch, p.chips, p.base_samples) for p in result.points] == [(1, 1, 1), (1, 2, 1), (8, 1, 8), (8, 2, 8)]
    study = result.to_dict()
    study["points"][3]["speedup"] = 7.9  # 2 chips, each running a share of the one chip's 8 samples
    report = tiny()
    report.extra["scale"] = study
    (v,) = _only(report)["speedup_linear"]
    assert (v.where, v.value, v.limit) == ("2 chips", 7.9, 2.0)
