"""`dabench_ir.advice`: the why lines' knob changes are runs of the orchestration, each made once;
the host's power for a comparison is read by the command, not by the renderer."""

from __future__ import annotations

import json
import re

import pytest

from dabench_ir.advice import VariantRuns, advise, candidate_knobs, fitting_knob
from dabench_ir.options import ProfileOptions
from dabench_ir.pipeline import profile_graph
from dabench_ir.report.table import seconds
from dabench_ir.report.why import change_text, explain
from tests.lowering_graphs import decoder


@pytest.fixture(scope="module")
def unfit_ipu():
    """A decoder too large for one IPU with the default knobs."""
    report = profile_graph(decoder(layers=24, hidden=2048, seq=128), "ipu", ProfileOptions())
    assert report.plan is not None and not report.plan.fits
    return report


def test_fit_line_comes_from_a_variant_run(unfit_ipu):
    from dabench_ir.run import execute

    advice = advise(unfit_ipu)
    assert advice.fit_searched and advice.fit is not None
    fit = advice.fit
    assert fit.report is not None and fit.report.plan.fits and fit.report.run is fit.run
    assert all(fit.run.sources[k.name] == "user" for k, _ in fit.changes)
    lines = explain(unfit_ipu)
    first = lines[0]
    assert first["role"] == "(fit)" and first["value"] == fit.values()
    assert first["text"].endswith(f"; {change_text(fit.changes)} makes it fit")
    again = execute(unfit_ipu.run.variant(**fit.values()), unfit_ipu.graph.clone())
    assert again.plan.fits and again.timeline.step_time_s == fit.report.timeline.step_time_s
    # kept only what the lines read: the reports of variants that do not make it fit are not held
    assert all(t.report is None for t in advice.trials if not t.fits)


def test_candidates_and_fitting_search_share_their_runs(unfit_ipu):
    runs = VariantRuns(unfit_ipu)
    advice = advise(unfit_ipu, runs=runs)
    assert advice.placements == runs.placements == len(candidate_knobs(unfit_ipu)) + 1  # the candidates, the remedy
    # every change the search tries again is one already placed: found from the runs made, none placed twice
    assert fitting_knob(unfit_ipu, runs=runs) is advice.fit and runs.placements == advice.placements


def test_the_failure_sizes_its_remedy_and_the_search_places_it_first(unfit_ipu):
    """The IPU failure's "--ipus N or more" is a bound the run checks both ways: N - 1 IPUs still do
    not fit, and N is the change the fitting search finds, placed before any candidate's doublings."""
    from dabench_ir.run import execute

    failure = unfit_ipu.plan.failure
    (name, needed), *_ = failure.remedy
    assert name == "ipus" and failure.reason.endswith(f"use more IPUs (--ipus {needed} or more)")
    assert unfit_ipu.to_dict()["failure"]["remedy"] == {"ipus": needed}
    short = execute(unfit_ipu.run.variant(ipus=needed - 1), unfit_ipu.graph.clone())
    assert not short.plan.fits and short.plan.failure.remedy == (("ipus", needed),)
    runs = VariantRuns(unfit_ipu)
    fit = fitting_knob(unfit_ipu, runs=runs)
    assert fit.values() == {"ipus": needed} and runs.placements == 1


def test_refit_uses_the_variant_report(unfit_ipu, monkeypatch):
    import dabench_ir.run as run_module
    from dabench_ir.commands.demo import _refit

    calls = []
    for name in ("execute", "placed"):  # every run placed: the variants' and any whole execute
        real = getattr(run_module, name)
        monkeypatch.setattr(run_module, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    searched = VariantRuns(unfit_ipu)
    found = fitting_knob(unfit_ipu, runs=searched)
    calls.clear()
    refit, runs = _refit(unfit_ipu, "ipu", lambda _m: None)
    assert runs is None and refit.plan.fits and "placed with" in refit.extra["demo_note"]
    assert len(calls) == searched.placements  # the search alone; the fitting run is not executed again
    assert refit.timeline.step_time_s == found.report.timeline.step_time_s


def test_no_advice_no_lines():
    report = profile_graph(decoder(layers=2), "rdu", ProfileOptions())
    assert report.advice is None and explain(report) == []
    assert advise(profile_graph(decoder(layers=2), None, ProfileOptions())) is None  # not placed


def _cpu_report_dict() -> dict:
    from tests.test_report_helpers import make_report

    data = json.loads(make_report().to_json())
    data["target"] = {"name": "cpu", "kind": "cpu"}
    data["metrics"].pop("target_power_w", None)
    data.get("extra", {}).pop("target_power_w", None)
    return data


def test_host_power_is_handed_to_the_comparison(monkeypatch):
    import dabench_ir.execute.calibrate as calibrate
    from dabench_ir.errors import UserError
    from dabench_ir.report.compare import compare_reports

    data = _cpu_report_dict()
    assert compare_reports([data])[0]["power_w"] is None  # the renderer reads no calibration
    assert compare_reports([data], powers={"cpu": 42.0})[0]["power_w"] == 42.0
    assert calibrate.host_powers([{"target": {"name": "rdu"}}]) == {}

    def missing(*_a, **_k):
        raise UserError("no calibration cached")

    monkeypatch.setattr(calibrate, "cpu_target_path", missing)
    assert calibrate.host_powers([data]) == {"cpu": None}


def test_compare_command_reads_the_host_power(tmp_path, monkeypatch):
    import dabench_ir.execute.calibrate as calibrate
    from dabench_ir.cli import main

    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(_cpu_report_dict()))
    monkeypatch.setattr(calibrate, "host_powers", lambda reports: {"cpu": 50.0})
    assert main(["compare", str(path), "--json", str(tmp_path / "c.json"), "--quiet"]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert rows[0]["power_w"] == 50.0


def test_an_estimate_only_overhead_is_held_fixed_in_the_variants():
    """RDU inference: the host cost is training's fitted per-section figure (an estimate); the
    variants are compared with it held at the report's value, so no knob is credited with it."""
    from dabench_ir.advice import hold_estimates

    report = profile_graph(decoder(layers=2, hidden=64, seq=16), "rdu", ProfileOptions())
    label = "host (estimate: fitted to training steps)"
    assert label in report.timeline.overheads_s
    held = report.timeline.overheads_s[label]
    advice = advise(report)
    assert advice.trials
    for trial in advice.trials:
        assert trial.times.overheads_s[label] == held
        assert trial.times.step_time_s >= 0
    lines = explain(report)
    host = [x for x in lines if x["role"] == f"overhead: {label}"]
    assert all(x["knob"] is None for x in host)
    # a timeline whose estimate differs moves by the difference, nothing else
    import dataclasses

    raw = dataclasses.replace(
        report.timeline,
        overheads_s={**report.timeline.overheads_s, label: held / 8},
        step_time_s=report.timeline.step_time_s - held * 7 / 8,
    )
    again = hold_estimates(report, raw)
    assert again.overheads_s[label] == held
    assert again.step_time_s == pytest.approx(report.timeline.step_time_s, rel=1e-12)


def test_a_variant_run_is_physics_checked(unfit_ipu, monkeypatch):
    """A variant's report is not built (`dabench_ir.run.placed`), but its step is still checked: a
    variant the verifier refuses is an internal error, never a why line."""
    import dabench_ir.verify as verify_module

    checked = []

    def refuse(graph, target, plan, timeline):
        checked.append(timeline.step_time_s)
        raise verify_module.PhysicsError(verify_module.Violation("step_time_work", "step", 1.0, 2.0))

    monkeypatch.setattr(verify_module, "check_step", refuse)
    with pytest.raises(verify_module.PhysicsError):
        VariantRuns(unfit_ipu).trial([candidate_knobs(unfit_ipu)[0]])
    assert checked


def test_a_plan_that_fits_is_never_advised_into_one_that_does_not():
    """Of two variants that shorten a role, the faster does not fit: a plan that fits is advised
    into the other; a plan that does not fit compares the times it would have if it fitted."""
    from types import SimpleNamespace

    from dabench_ir.report.why import _best

    def trial(fits: bool, role_s: float, step_s: float) -> SimpleNamespace:
        times = SimpleNamespace(step_time_s=step_s, role_time=lambda _role: role_s)
        return SimpleNamespace(fits=fits, times=times)

    unfit, fit = trial(False, 1.0, 5.0), trial(True, 2.0, 8.0)
    assert _best(10.0, "role", 3.0, [unfit, fit], must_fit=True) == (fit, 2.0)
    assert _best(10.0, "role", 3.0, [unfit, fit], must_fit=False) == (unfit, 1.0)
    assert _best(10.0, "role", 3.0, [unfit], must_fit=True) is None


def test_a_knob_that_saves_under_a_percent_of_a_role_is_not_advised_for_it():
    """`why.ROLE_GAIN_MIN`: a variant that takes a 14.4 ms role to 14.38 ms (0.14 %) would print as
    "from 14.4 ms to 14.4 ms"; it is not named, even though it shortens the step. One that saves 1 %
    is, and the role line says what no knob reached."""
    from types import SimpleNamespace

    from dabench_ir.report.why import ROLE_GAIN_MIN, _best

    def trial(role_s: float, step_s: float) -> SimpleNamespace:
        return SimpleNamespace(fits=True, times=SimpleNamespace(step_time_s=step_s, role_time=lambda _r: role_s))

    assert ROLE_GAIN_MIN == 0.01
    tiny, enough = trial(14.38e-3, 185e-3), trial(14.4e-3 * 0.99, 185.5e-3)
    assert _best(186e-3, "role", 14.4e-3, [tiny], must_fit=True) is None
    assert _best(186e-3, "role", 14.4e-3, [tiny, enough], must_fit=True) == (enough, 14.4e-3 * 0.99)


def test_a_too_short_pipeline_is_a_variant_that_does_not_fit():
    """Two IPUs would shorten this 1-IPU training step, but its 2 micro-batches are fewer than the 3
    pipeline stages PopART needs: that variant does not fit, and no why line offers it."""
    report = profile_graph(decoder(layers=4, hidden=256, seq=64, batch=2), "ipu", ProfileOptions(mode="train"))
    advice = advise(report)
    assert report.plan.fits
    ipus = next(t for t in advice.trials if t.knob.flag == "--ipus")
    assert not ipus.fits and ipus.times.step_time_s < report.timeline.step_time_s
    lines = explain(report)
    assert lines and not any(line["knob"] == "--ipus" for line in lines)


@pytest.mark.parametrize(
    ("target", "knobs"),
    [
        ("rdu", {"mode": "train", "tiles": 4, "rdu_mapping": "tuned"}),
        ("rdu", {"mode": "train"}),
        ("wse", {"mode": "train"}),
        ("h100", {"mode": "train"}),
        ("cpu", {}),
    ],
)
def test_a_compute_bound_role_reaches_at_most_the_peak_of_the_units_it_holds(target, knobs):
    """The why line's "at X of their peak": the role's FLOPs over the peak-seconds of the units its
    nodes held (each node's time x the chip's peak x its allocation, a share of the plan's
    ``allocation_chips``). Before session 60 it was the nodes' compute seconds over their time, which
    an RDU tuned mapping put at 116 % (GPT-2 XL, 4 tiles)."""
    import re

    report = profile_graph(decoder(layers=2, hidden=256, seq=64, batch=4), target, ProfileOptions(**knobs))
    advise(report)
    lines = explain(report, top=40)  # every role
    shares = [float(m) for line in lines for m in re.findall(r"at ([0-9.]+)% of their peak", line["text"])]
    assert shares and all(0 < s <= 100 for s in shares), shares


def test_an_ipu_pipelines_allocation_is_of_its_ipus():
    """An IPU plan's unit allocations are shares of the pipeline's IPUs: the peak they hold is the
    chip's times ``allocation x allocation_chips`` (its roles are memory-bound here, so no line)."""
    report = profile_graph(decoder(layers=2, hidden=256, seq=64, batch=4), "ipu", ProfileOptions(ipus=2))
    assert report.plan.stats.allocation_chips == 2
    assert 0 < max(u.allocation for u in report.plan.units) <= 1


def test_a_remedy_that_falls_short_is_raised_by_a_doubling_stride():
    """`remedied` follows each failure's remedy; a count that fell short (a bound that leaves out
    whole layers) is raised to at least itself plus 1, 2, 4, ... so a fit at 55 from a bound of 52
    takes three runs, not four."""
    from dabench_ir.advice import Trial, remedied
    from dabench_ir.plan import Failure

    fits_from = 55
    tried: list[dict] = []

    class Runs:
        def trial(self, changes):
            values = {k.name: v for k, v in changes}
            tried.append(values)
            ok = values["ipus"] >= fits_from
            failure = None if ok else Failure("short", remedy=(("ipus", values["ipus"] + 1),))
            return Trial(tuple(changes), None, None, ok, None, failure)

    found = remedied(Failure("too big", remedy=(("ipus", 52),)), Runs(), steps=4)
    assert [t["ipus"] for t in tried] == [52, 53, 55] and found.values() == {"ipus": 55}
    tried.clear()
    fits_from = 1_000
    assert remedied(Failure("too big", remedy=(("ipus", 52),)), Runs(), steps=4) is None
    assert [t["ipus"] for t in tried] == [52, 53, 55, 59]  # steps bound the runs
    assert remedied(Failure("too big"), Runs(), steps=4) is None  # no remedy, nothing placed


def test_ipus_needed_spreads_what_layers_bring_over_the_room_the_rest_leaves():
    from dabench_ir.lowering.ipu.memory import MEMORY_TERMS, TileMemory, ipus_needed

    terms = dict.fromkeys(MEMORY_TERMS, 0.0)
    memory = TileMemory(terms={0: {**terms, "program": 200.0, "weights": 1000.0, "matmul_temporaries": 300.0}})
    assert ipus_needed(memory, 700.0, layers=8) == 5  # 1000 over the 200 left beside program and temporaries
    assert ipus_needed(memory, 700.0, layers=4) is None  # one layer an IPU at most: four IPUs cannot hold it
    assert ipus_needed(memory, 500.0, layers=8) is None  # program and temporaries fill it: no count helps
    two = TileMemory(terms={0: {**terms, "program": 200.0, "weights": 100.0}, 1: {**terms, "program": 200.0}})
    assert ipus_needed(two, 250.0, layers=8) == 3  # at least one IPU more than the pipeline has


@pytest.mark.parametrize(("layers", "mode", "bound", "needed"), [(32, "inference", 6, 7), (16, "train", 6, 11)])
def test_the_ipu_count_is_the_fewest_the_lowerings_own_layout_holds(layers, mode, bound, needed):
    """`ipus_needed` spreads what the layers bring evenly over the room beside the rest: a bound below
    that whole layers, the head's IPU and (in training) the early stages' larger stash leave short.
    The failure names the count its own layout holds (`ipus_to_fit`): placed, that many IPUs hold
    every IPU's tile memory and one fewer do not. The bound alone named 6 in both."""
    from dabench_ir.lowering.ipu.memory import TileMemory, ipus_needed

    def placed(**knobs):
        return profile_graph(decoder(layers=layers, hidden=2048, seq=128), "ipu", ProfileOptions(mode=mode, **knobs))

    def terms(report):
        return {int(k.removeprefix("ipu")): t for k, t in report.plan.extra["memory_terms"].items()}

    report = placed()
    capacity = report.plan.failure.capacity_bytes
    assert ipus_needed(TileMemory(terms=terms(report)), capacity, layers) == bound
    assert report.plan.failure.remedy == (("ipus", needed),)
    for ipus, holds in ((needed - 1, False), (needed, True)):
        held = terms(placed(ipus=ipus)).values()
        assert (max(sum(t.values()) for t in held) <= capacity) is holds, ipus


def test_a_users_layout_that_overflows_names_more_counts_and_no_ipu_remedy():
    """With ``--layers-per-ipu`` the layout is the user's: ``--ipus N`` beside it is refused, so the
    line names a longer list and the failure carries no remedy to place."""
    report = profile_graph(decoder(layers=24, hidden=2048, seq=128), "ipu", ProfileOptions(layers_per_ipu=(12, 12)))
    failure = report.plan.failure
    assert failure.remedy == ()
    assert re.search(r"use more IPUs \(a --layers-per-ipu of \d+ or more counts\)$", failure.reason), failure.reason


def test_a_model_whose_layers_overflow_one_an_ipu_names_no_ipu_count():
    """Two decoder layers of 1.6 GB each: no number of IPUs holds one (the layout puts one layer an IPU at
    most), so the line says so and gives no remedy to run; it said "--ipus 16 or more"."""
    report = profile_graph(decoder(layers=2, hidden=8192, seq=16), "ipu", ProfileOptions())
    failure = report.plan.failure
    assert failure.remedy == ()
    assert failure.reason.endswith("more IPUs do not help: its 2 decoder layer(s), one an IPU at most, still overflow")


def test_a_one_chip_run_no_knob_fits_is_placed_tensor_parallel_over_the_fewest_chips_that_hold_it():
    """A GPU run whose weights overflow HBM (here an H100 with 30 % of the memory the model needs)
    has no target knob that fits it; the fitting search places it tensor parallel over the chips
    its bytes need (needed over held: 3.3, rounded up to 4), a scaling run of its own, verified.
    Two chips do not hold it, so four is the fewest power of two that does."""
    from dabench_ir.advice import more_chips
    from dabench_ir.run import execute
    from dabench_ir.targets import load_target

    need = profile_graph(decoder(layers=4, hidden=1024, seq=64), "h100", ProfileOptions()).plan.memory_bytes["hbm"]
    small = load_target("h100").with_changes({"memory[0].capacity_bytes": 0.3 * need})
    report = profile_graph(decoder(layers=4, hidden=1024, seq=64), small, ProfileOptions())
    assert not report.plan.fits and report.plan.failure.remedy == ()
    advice = advise(report)
    assert advice.fit.values() == {"chips": 4, "strategy": "tp"}
    fitted = advice.fit.report
    assert fitted.plan.fits and fitted.options.chips == 4 and fitted.extra.get("verified", True)
    assert explain(report)[0]["text"].endswith("; --chips 4 --strategy tp makes it fit")
    two = execute(report.run.variant(chips=2, strategy="tp"), report.graph.clone())
    assert not two.plan.fits
    assert more_chips(two, VariantRuns(two)) is None  # a run over several chips already: not resized


def test_the_fit_over_more_chips_takes_the_reports_own_run_as_its_one_chip_baseline(monkeypatch):
    """The tensor-parallel try is a scaling run whose one-chip baseline is the report's own run: the
    scaling stage places the chip's share alone, the report it gives equals a fresh run's of the
    same options, and it is built only when read (a profile names the change and builds none)."""
    from dabench_ir import scaling
    from dabench_ir.run import execute
    from dabench_ir.targets import load_target

    need = profile_graph(decoder(layers=4, hidden=1024, seq=64), "h100", ProfileOptions()).plan.memory_bytes["hbm"]
    small = load_target("h100").with_changes({"memory[0].capacity_bytes": 0.3 * need})
    report = profile_graph(decoder(layers=4, hidden=1024, seq=64), small, ProfileOptions())
    placed_chips: list[int] = []
    run_one = scaling._run_one
    monkeypatch.setattr(scaling, "_run_one", lambda g, run: placed_chips.append(run.options.chips) or run_one(g, run))
    contexts = _contexts_built(monkeypatch)
    fit = advise(report).fit
    assert placed_chips == [4]  # the share; the baseline is the report's placement
    assert report.graph not in contexts  # the try places its shares, not the report's graph: no context of it
    assert fit.placed.built is None  # not built until read
    placed_chips.clear()
    fresh = execute(fit.run, report.graph.clone())
    assert placed_chips == [4, 4]  # placed from scratch: the baseline and the share
    assert fit.report.to_dict() == fresh.to_dict()


def test_each_variant_placed_is_a_progress_line(unfit_ipu):
    """On a deep model each variant run takes seconds: the user sees each one placed, by its change."""
    lines: list[str] = []
    advice = advise(unfit_ipu, progress=lines.append)
    assert len(lines) == advice.placements > 1
    assert lines[-1] == f"why lines: placing with {change_text(advice.fit.changes)} (variant {advice.placements})"


def test_a_target_without_tensor_parallelism_is_not_tried_over_more_chips(monkeypatch):
    """The host CPU lists no multi-chip strategy: its overflow places no scaling run (each had cloned
    the graph before the scaling stage refused it: 38 s of a 10,000-layer profile)."""
    from dabench_ir.advice import more_chips

    report = profile_graph(decoder(layers=64, hidden=8192, seq=16), "cpu", ProfileOptions())  # 103 GB of weights
    assert not report.plan.fits and report.target_obj.strategies == ()
    runs = VariantRuns(report)
    assert more_chips(report, runs) is None and runs.placements == 0


def _contexts_built(monkeypatch) -> list:
    """The graphs a lowering context is built of from now on, in order (`LoweringContext.build` counted)."""
    from dabench_ir.lowering.context import LoweringContext

    graphs: list = []
    build = LoweringContext.build.__func__
    monkeypatch.setattr(LoweringContext, "build", classmethod(lambda cls, g, *a: graphs.append(g) or build(cls, g, *a)))
    return graphs


def test_the_variants_on_the_reports_graph_read_its_live_peak_worked_out_once(monkeypatch):
    """The peak of live activations over the whole graph is a fact of the graph: the why lines'
    variants placed on the report's graph share one context, and every memory check of theirs reads
    it from there (a 10,000-layer RDU profile walked the 360k nodes for it once a variant)."""
    import dabench_ir.lowering.context as common

    walks: list[int] = []
    peak = common.peak_live_bytes
    monkeypatch.setattr(
        common, "peak_live_bytes", lambda ctx, nodes, *a, **k: walks.append(len(nodes)) or peak(ctx, nodes, *a, **k)
    )
    contexts = _contexts_built(monkeypatch)
    report = profile_graph(decoder(layers=2), "rdu", ProfileOptions())
    advice = advise(report)
    whole = len(report.graph.nodes)
    assert advice.placements >= 2
    assert contexts.count(report.graph) == 2  # the report's placement, then the variants' one context
    assert walks.count(whole) == 2  # once a context, not once a placement


def test_the_ipu_plans_of_one_graph_read_its_sections_and_layer_figures_worked_out_once(monkeypatch, unfit_ipu):
    """The IPU's sections of the graph and each decoder layer's activation figures are facts of the
    graph (`LoweringContext.fact`): the why lines' variants on the report's graph, and every layout
    the search for the IPUs that fit tries, read them from one context (a 10,000-layer Bow profile
    had worked out each layer's live peak once a placement, 60,000 walks). The figures are the
    ones a fresh context works out: the report is the fixture's."""
    from collections import Counter

    import dabench_ir.lowering.ipu.memory as memory
    import dabench_ir.lowering.ipu.stages as stages
    from dabench_ir.run import execute

    laid: list[object] = []
    walked: list[int] = []
    sections, live = stages.sections, memory.LAYER_FIGURES["live"]
    monkeypatch.setattr(stages, "sections", lambda ctx: laid.append(ctx.graph) or sections(ctx))
    monkeypatch.setitem(
        memory.LAYER_FIGURES, "live", lambda ctx, nodes: walked.append(nodes[0].layer) or live(ctx, nodes)
    )
    contexts = _contexts_built(monkeypatch)
    report = execute(unfit_ipu.run, unfit_ipu.graph.clone())
    advice = advise(report)
    layers = {n.layer for n in report.graph.nodes if n.layer is not None}
    assert advice.placements >= 3 and not report.plan.fits  # the search for the IPUs that fit ran too
    assert len(laid) == len(contexts)  # laid out once a context, not once a placement or layout
    assert Counter(walked) == dict.fromkeys(layers, len(contexts))  # each layer once a context
    fresh, shared = (dict(r.to_dict(), why=None) for r in (unfit_ipu, report))  # why lines: the fixture's, if asked
    assert shared == fresh


def test_the_wse_plans_of_one_graph_cut_its_kernels_once(monkeypatch):
    """The WSE kernel cut is a fact of the graph (`LoweringContext.fact`): the why lines' variants
    on the report's graph, and the lowering's own tries (each copy count, then streaming), cut it
    once a context and measure fresh kernels from it (a plan's kernels are its own). The report is
    the one the lowering gave before."""
    import dabench_ir.lowering.wse.kernels as kernels
    from dabench_ir.run import execute

    report = profile_graph(decoder(layers=4), "wse", ProfileOptions(mode="train"))
    cuts: list[object] = []
    cut = kernels.kernel_cut
    monkeypatch.setattr(kernels, "kernel_cut", lambda ctx, *a: cuts.append(ctx.graph) or cut(ctx, *a))
    contexts = _contexts_built(monkeypatch)
    again = execute(report.run, report.graph.clone())
    assert again.to_dict() == report.to_dict()
    advice = advise(again)
    assert advice.placements >= 2 and len(contexts) < advice.placements + 1
    assert len(cuts) == len(contexts)  # once a context, not once a placement


def test_the_rdu_plans_of_one_graph_find_its_attention_cores_and_saved_state_once(monkeypatch):
    """The RDU's forward attention cores and what the forward saves for the backward are facts of
    the graph (`LoweringContext.fact`, the saved state keyed by whether the plan fuses the cores):
    the why lines' variants on the report's graph work them out once a context, not once a placement.
    The report is the one the lowering gave before."""
    import dabench_ir.lowering.rdu.memory as memory
    import dabench_ir.lowering.rdu.sections as sections
    from dabench_ir.run import execute

    report = profile_graph(decoder(layers=2), "rdu", ProfileOptions(mode="train"))
    body = len(sections.body_and_optimizer(report.graph)[0])
    walks: list[int] = []
    states: list[bool] = []
    cores, of = sections.attention_cores, memory.SavedState.of.__func__
    monkeypatch.setattr(sections, "attention_cores", lambda ctx, nodes: walks.append(len(nodes)) or cores(ctx, nodes))
    monkeypatch.setattr(memory.SavedState, "of", classmethod(lambda cls, g, c: states.append(bool(c)) or of(cls, g, c)))
    contexts = _contexts_built(monkeypatch)
    again = execute(report.run, report.graph.clone())
    assert again.to_dict() == report.to_dict()
    advice = advise(again)
    assert advice.placements >= 3 and len(contexts) < advice.placements + 1
    assert walks.count(body) == len(contexts)  # the forward's cores: once a context
    # the saved state: once a context for the plans that fuse the cores and once for those that do not (O0)
    assert len(states) <= 2 * len(contexts) < advice.placements + 1


@pytest.mark.parametrize(("target", "rereads"), [("ipu", True), ("h100", False)])
def test_a_why_line_says_when_its_feed_moves_a_roles_tensors_many_times_over(target, rereads):
    """The table's bytes count each tensor once; an IPU matmul's feed (tile SRAM) reads them again
    for every tile that needs them. A memory-bound role's why line gives both, and how many times
    over, where that is 1.5 or more (`why.REREAD_SHOWN`); where the feed moves each tensor about once
    (a GPU's HBM) it gives the traffic alone. (The prefill's matmuls are compute-bound on both chips:
    their memory line is asked for directly.)"""
    from dabench_ir.report.attribution import role_rows
    from dabench_ir.report.why import _resource

    report = profile_graph(decoder(layers=2, hidden=256, seq=64), target, ProfileOptions())
    lines = [_resource(report, {**row, "bound": "memory"}) for row in role_rows(report) if row["role"].endswith("fc1")]
    assert lines
    said = [re.search(r"\(([\d.]+ [kMG]?B) of tensors, read ([\d.]+) times over\)", line) for line in lines]
    assert any(said) == rereads, lines
    for match in filter(None, said):
        assert float(match.group(2)) >= 1.5


def test_a_why_line_gives_the_step_a_rerun_with_its_change_prints():
    """The RDU's inference host row is an estimate, held at the report's value in every variant: the
    line's step is the held one, and where the rerun's own differs it says that too ("47.2 ms -> 33.7
    ms" was printed where `--opt-level O3` gave 3.70 ms); the estimate's own row says it is held."""
    from dabench_ir.report.model import Report

    graph = decoder(layers=2, hidden=256, seq=64)
    report = profile_graph(graph.clone(), "rdu", ProfileOptions())
    advise(report)
    why = explain(report)
    lines = {w["role"]: w for w in why}
    o3 = next(w for w in why if w["knob"] == "--opt-level" and w["value"] == "O3")
    rerun: Report = profile_graph(graph.clone(), "rdu", ProfileOptions(opt_level="O3"))
    as_run = re.search(r"; ([\d.]+ [mµ]?s) as run\)", o3["text"])
    assert as_run and as_run.group(1) == seconds(rerun.totals["time_s"]), o3["text"]
    host = next(role for role in lines if "(estimate" in role)
    assert "held at this run's value in every variant run" in lines[host]["text"]


def test_a_why_line_on_a_plan_that_does_not_fit_says_when_its_change_does_not_fit_either():
    """A plan that does not fit may be advised a change that does not fit either (its steps are both
    "if it fitted"): the line says so, with the reason; "--optimizer-state onchip would take it ... (step
    84.3 ms -> 10 ms)" was printed for a run that needed 2.83 GB of a 0.94 GB IPU with it."""
    report = profile_graph(decoder(layers=8, hidden=2048, seq=128, batch=8), "ipu", ProfileOptions(mode="train"))
    assert not report.plan.fits
    advise(report)
    advised = [w for w in explain(report) if w["knob"] and not w["text"].startswith("does not fit")]
    assert advised
    for w in advised:
        trial = next(t for t in report.advice.trials if t.knob.flag == w["knob"] and t.value == w["value"])
        assert ("the run does not fit either" in w["text"]) is (not trial.fits), w["text"]
