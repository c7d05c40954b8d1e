"""The runs behind the "why" lines: a report's run with each target knob changed.

For a placed `Report`, `advise` asks the orchestration for one variant run per candidate knob
change (`candidate_knobs`: every target knob the target's lowering reads, at each of its other
choices, or at twice its value for a count, half for a fraction; nothing here lists knobs by
name): ``placed(report.run.variant(knob=value), report.graph.clone())``. Each variant is an
ordinary run (`dabench_ir.run.placed`: resolved sources, the run's internals, scaling when
it spans chips), placed once; its report is built only when the fitting search hands it on. For a plan that does not fit, `fitting_knob` searches the
smallest change that makes it fit (one knob, a count doubled up to four times, else two
knobs together) through the same runs. What the runs found is handed to the report as
``report.advice`` (an `Advice`); `dabench_ir.report.why.explain` renders the lines from it
and places nothing itself.

A step cost that rests on an estimate only (an overhead row whose name says so,
``ESTIMATE_MARK``: the RDU's host cost of an inference run, "host (estimate: fitted to
training steps)") is held at the report's own
value in every variant's timeline (`hold_estimates`): variants are compared on node-owned
time plus grounded overheads, so no knob is credited with time that is only that estimate.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.options import KNOBS, Knob

if TYPE_CHECKING:
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.plan import Failure
    from dabench_ir.report.model import NodeRecord, Report
    from dabench_ir.run import Placed, Progress, ResolvedRun
    from dabench_ir.scaling import ScalePoint
    from dabench_ir.timeline import Timeline

__all__ = [
    "CHIP_RUNS",
    "ESTIMATE_MARK",
    "REMEDY_RUNS",
    "Advice",
    "StepTimes",
    "Trial",
    "VariantRuns",
    "advise",
    "candidate_knobs",
    "fitting_knob",
    "hold_estimates",
    "more_chips",
    "remedied",
]

logger = logging.getLogger(__name__)

ESTIMATE_MARK = "(estimate"
"""What the name of an overhead row resting on an estimate only contains (its label in every output)."""

Change = tuple[Knob, Any]

REMEDY_RUNS = 6
"""Runs the fitting search gives a failure's remedy and the remedies after it (`remedied`)."""

CHIP_RUNS = 3
"""Chip counts the fitting search tries, doubling, for a one-chip run no target knob fits (`more_chips`)."""


@dataclass(frozen=True, slots=True)
class StepTimes:
    """What the why lines compare between a report and its variant runs: the step, its overhead rows
    and each role's busy time (a role: a node row's ``role``, else its op type), summed over the base
    report's node rows in their order. A variant keeps this, not its timeline and plan: on a
    10,000-layer model those held ~50 MB per variant."""

    step_time_s: float
    overheads_s: dict[str, float]
    role_s: dict[str, float]
    as_run_s: float | None = None
    """A variant's step as it ran, where `hold_estimates` held an estimate-only row at the base's and
    moved ``step_time_s`` by it (None where nothing was held): what a rerun with the change prints."""

    @classmethod
    def of(cls, records: Iterable[NodeRecord], timeline: Timeline, scaled: ScalePoint | None = None) -> StepTimes:
        """The times of ``timeline``; over several chips (``scaled``, the run's scaling point) the
        step is the point's and its own rows (collectives, a pipeline's fill and drain) are among the
        overheads: one chip's timeline is not the step (a pipeline's is its stages in turn)."""
        busy = timeline.busy_times()
        role_s: dict[str, float] = {}
        for r in records:
            if r.name in timeline.nodes:
                role = r.role or r.op_type
                role_s[role] = role_s.get(role, 0) + (busy[r.name] or 0.0)
        overheads = {**(timeline.overheads_s or {}), **(scaled.overheads_s if scaled is not None else {})}
        return cls(timeline.step_time_s if scaled is None else scaled.time_s, overheads, role_s)

    def role_time(self, role: str) -> float:
        """The role's time: its nodes' busy time, or for an overhead role its row's amount."""
        from dabench_ir.report.attribution import is_overhead

        if is_overhead(role):
            return float(self.overheads_s.get(role.split(": ", 1)[1], 0.0))
        return self.role_s.get(role, 0)


@dataclass(frozen=True, slots=True)
class Trial:
    """One variant run: the knob changes made, the run, and what its placement gave: whether it
    fits (``failure``: why not), and its `StepTimes` (estimate-only overheads held at the base
    report's, `hold_estimates`).

    ``report`` is the variant's whole Report when the variant makes a plan fit that did not
    (`fitting_knob` hands it on, so it is not executed again), built when first read from the
    placement kept for it (``placed``): a profile that only names the change does not build it.
    Otherwise only those figures are kept, not the variant's graph, plan or timeline.
    """

    changes: tuple[Change, ...]
    run: ResolvedRun
    times: StepTimes
    fits: bool
    placed: Placed | None = None
    failure: Failure | None = None

    @property
    def report(self) -> Report | None:
        return self.placed.report() if self.placed is not None else None

    @property
    def knob(self) -> Knob:
        """The knob of a one-change trial (the first one of several)."""
        return self.changes[0][0]

    @property
    def value(self) -> Any:
        """The value of a one-change trial (the first one of several)."""
        return self.changes[0][1]

    def values(self) -> dict[str, Any]:
        """The option fields the trial changed, by name."""
        return {k.name: v for k, v in self.changes}


@dataclass(frozen=True, slots=True)
class Advice:
    """What the variant runs of one report found, for the why lines (``report.advice``).

    ``trials``: each candidate change that could be run (`candidate_knobs` order; those the
    lowering refused are left out). ``fit``: for a plan that does not fit, the smallest change
    that makes it fit, None when none does (or the plan fits). ``placements``: the variant
    runs executed for this report.
    """

    trials: tuple[Trial, ...]
    fit: Trial | None = None
    fit_searched: bool = False
    placements: int = 0


def candidate_knobs(report: Report) -> list[Change]:
    """(knob, value) pairs worth trying on the report's target: each target knob the target's
    lowering reads (`Knob.targets`), at every other choice, the other setting of a switch, twice
    a count (the plan's own when the option is unset) or half a fraction; none the run itself
    refuses (a micro-batch count that does not divide the batch)."""
    target, opts, plan = report.target_obj, report.options, report.plan
    if target is None or opts is None:
        return []
    fields = {f.name for f in dataclasses.fields(opts)}
    out: list[Change] = []
    for name, k in KNOBS.items():
        if name not in fields or k.group != "target" or (k.targets is not None and target.kind not in k.targets):
            continue
        if k.modes is not None and opts.mode not in k.modes:  # a training knob in an inference run
            continue
        current = getattr(opts, name)
        if k.choices:
            out += [(k, c) for c in k.choices if c != current]
            continue
        if current is None:
            current = getattr(plan, name, None)
        changed = _changed(current)
        if changed is None:
            continue
        for form in (changed, ",".join(map(str, changed)) if isinstance(changed, (list, tuple)) else None):
            if form is None:
                continue
            try:
                value = k.validate(form)
                if report.run is not None:
                    report.run.variant(**{name: value})
            except (UserError, ValueError):
                continue
            out.append((k, value))
            break
    return out


def _changed(value: Any) -> Any:
    """The other setting of a switch, twice a count, half a fraction (each element of a tuple)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value >= 1 else None
    if isinstance(value, float):
        return value / 2 if value > 0 else None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        parts = [_changed(v) for v in value]
        return None if any(p is None for p in parts) else type(value)(parts)
    return None


def hold_estimates(base: Report, timeline: Timeline) -> Timeline:
    """``timeline`` (a variant's) with the base report's estimate-only overheads (rows whose
    name contains ``ESTIMATE_MARK``, in either timeline) held at the base's values, the step
    time (and one step's latency) moved by the difference; ``timeline`` itself when none."""
    own = base.timeline
    if own is None:
        return timeline
    keys = {k for t in (own, timeline) for k in (t.overheads_s or {}) if ESTIMATE_MARK in k}
    if not keys:
        return timeline
    overheads = dict(timeline.overheads_s or {})
    delta = 0.0
    for key in sorted(keys):
        held = float((own.overheads_s or {}).get(key, 0.0))
        delta += held - float(overheads.get(key, 0.0))
        overheads[key] = held
    latency = None if timeline.latency_s is None else timeline.latency_s + delta
    return dataclasses.replace(
        timeline, overheads_s=overheads, step_time_s=timeline.step_time_s + delta, latency_s=latency
    )


class VariantRuns:
    """The variant runs of one report, each executed once: the why lines' candidates and the
    fitting search share them (a change both try is placed once)."""

    def __init__(self, report: Report, *, progress: Progress | None = None) -> None:
        from dabench_ir.progress import silent

        self.report = report
        self.say: Progress = progress or silent  # a line a variant placed: on a deep model each takes seconds
        self.placements = 0
        self._done: dict[tuple[tuple[str, str], ...], Trial | None] = {}
        self._contexts: dict[Any, LoweringContext] = {}  # the shared graph's, by the plan's precision

    def context(self, run: ResolvedRun) -> LoweringContext:
        """The lowering context of the report's prepared graph at ``run``'s precision, built once for
        every variant placed on that graph (`shares_graph`): its node costs, value sizes and weight
        total read once, not once a variant (a lowering writes nothing to it)."""
        from dabench_ir.lowering.context import LoweringContext
        from dabench_ir.run import lowering_options

        precision = lowering_options(run).precision
        if precision not in self._contexts:
            self._contexts[precision] = LoweringContext.build(self.report.graph, precision)
        return self._contexts[precision]

    def shares_graph(self, run: ResolvedRun) -> bool:
        """Whether ``run`` (a variant of the report's) is placed on the report's own prepared graph:
        it binds the same dims and asks for the same rewrites (`transform_key`), so preparing the
        graph would change nothing, and placing it writes nothing to it (lowerings, the emulator and
        the step check read the graph: tests/test_lowering_contract.py; the scaling stage splits a
        clone of it). A 6,000-layer model's five why-line variants cloned 216k nodes each: 2.8 s of
        a 74 s profile."""
        from dabench_ir.run import transform_key

        base = self.report.run
        return run.dims == base.dims and transform_key(run.options) == transform_key(base.options)

    def baseline(self) -> Placed | None:
        """The report's own placement: a variant over several chips on its graph takes it as the
        one-chip baseline of its speedup (`dabench_ir.scaling.scale`) instead of placing it again.
        None for a report over several chips: its placement is one chip's share or a pipeline's
        stages in turn, not one chip running the step (a pp report's, 4 micro-batches in turn, made
        a variant's speedup 2.52 over 2 chips)."""
        from dabench_ir.run import Placed

        report = self.report
        if report.run.multi_chip:
            return None
        return Placed(run=report.run, graph=report.graph, plan=report.plan, timeline=report.timeline, built=report)

    def variant(self, changes: tuple[Change, ...] | list[Change]) -> ResolvedRun:
        """The report's run with ``changes`` (the user's, as if given); placed, not measured again."""
        run = self.report.run.variant(**{k.name: v for k, v in changes})
        if run.options.measure:  # the host measurement is the report's own; a variant is placed
            run = run.variant(source=self.report.run.sources.get("measure", "user"), measure=False)
        return run

    def trial(self, changes: tuple[Change, ...] | list[Change]) -> Trial | None:
        """The variant run with ``changes``, executed on the report's prepared graph when the
        variant rewrites it as the report's run did (`shares_graph`), else on a clone of it;
        None when the lowering refuses it (a UserError or ValueError, logged)."""
        changes = tuple(changes)
        key = tuple(sorted((k.name, repr(v)) for k, v in changes))
        if key in self._done:
            return self._done[key]
        from dabench_ir.report.why import change_text
        from dabench_ir.run import placed

        trial: Trial | None = None
        try:
            run = self.variant(changes)
            self.placements += 1
            self.say(f"why lines: placing with {change_text(changes)} (variant {self.placements})")
            if self.shares_graph(run):  # a run over several chips places its own shares, not this graph
                context = None if run.multi_chip else self.context(run)
                variant = placed(run, self.report.graph, context=context, shared=True, baseline=self.baseline())
            else:
                variant = placed(run, self.report.graph.clone())
        except (UserError, ValueError) as exc:
            logger.info("why: %s not placeable: %s", " ".join(f"{k.flag} {v}" for k, v in changes), exc)
        else:
            base_fits = self.report.plan is None or self.report.plan.fits
            scaled = variant.scaled.points[-1] if variant.scaled is not None else None
            held = hold_estimates(self.report, variant.timeline)
            times = StepTimes.of(self.report.nodes, held, scaled)
            if held is not variant.timeline and scaled is None:
                times = dataclasses.replace(times, as_run_s=variant.timeline.step_time_s)
            made_fit = variant.fits and not base_fits  # the fitting search hands this report on
            kept = variant if made_fit else None
            trial = Trial(
                changes=changes,
                run=variant.run,
                times=times,
                fits=variant.fits,
                placed=kept,
                failure=variant.plan.failure,
            )
        self._done[key] = trial
        return trial


def _placeable(report: Report) -> bool:
    return not (
        report.plan is None
        or report.graph is None
        or report.options is None
        or report.timeline is None
        or report.run is None
    )


def fitting_knob(report: Report, *, doublings: int = 4, runs: VariantRuns | None = None) -> Trial | None:
    """For a plan that does not fit: the smallest knob change whose variant run fits — the
    failure's own remedy (`remedied`, `REMEDY_RUNS` runs at most), else one candidate (a count
    doubled up to ``doublings`` times), else two together (64 tries at most), else a one-chip
    run over more chips (`more_chips`); the `Trial` (its ``run`` and its ``report``, to use as
    it is), or None. ``runs``: the variant runs already made for ``report`` (`VariantRuns`), reused."""
    if report.plan is None or report.plan.fits or report.options is None or report.run is None:
        return None
    runs = runs or VariantRuns(report)
    found = remedied(report.plan.failure, runs, steps=REMEDY_RUNS)
    if found is not None:
        return found
    singles: list[Change] = []
    for k, value in candidate_knobs(report):
        if isinstance(value, int) and not isinstance(value, bool):
            singles += [(k, value * 2**i) for i in range(doublings)]
        else:
            singles.append((k, value))
    reason = report.plan.failure.reason if report.plan.failure is not None else ""
    singles.sort(key=lambda c: c[0].flag not in reason)  # knobs the failure names are tried first
    trials = [[c] for c in singles]
    trials += [[a, b] for i, a in enumerate(singles) for b in singles[i + 1 :] if a[0].name != b[0].name]
    for changes in trials[:64]:
        trial = runs.trial(changes)
        if trial is not None and trial.fits:
            return trial
    return more_chips(report, runs)


def more_chips(report: Report, runs: VariantRuns) -> Trial | None:
    """A one-chip run that overflows a memory, placed tensor parallel over more chips (each chip
    holds a share of every layer's weights): from the fewest the failure's bytes need (needed over
    held, rounded up to a power of two, as a tensor-parallel degree divides the heads), doubling,
    `CHIP_RUNS` runs at most, each a scaling run of its own (its collectives and per-chip memory
    placed, verified); the `Trial` that fits, or None (a run over several chips already, a failure
    that is not of bytes, a target without tensor parallelism among its strategies, a lowering that
    lays the model over chips itself, as the IPU's ``--ipus`` remedy does)."""
    from dabench_ir.lowering import lowering_for

    failure, target = report.plan.failure, report.run.target
    if report.run.multi_chip or failure is None:
        return None
    if "tp" not in target.strategies or lowering_for(target).pipelines_itself:
        return None
    if not failure.needed_bytes or not failure.capacity_bytes:
        return None
    chips = max(2, 1 << math.ceil(math.log2(failure.needed_bytes / failure.capacity_bytes)))
    for _ in range(CHIP_RUNS):
        trial = runs.trial([(KNOBS["chips"], chips), (KNOBS["strategy"], "tp")])
        if trial is not None and trial.fits:
            return trial
        chips *= 2
    return None


def remedied(failure: Failure | None, runs: VariantRuns, *, steps: int) -> Trial | None:
    """The variant run with the failure's remedy (`Failure.remedy`, the change its lowering sized),
    then, while that still does not fit, with the remedy of its own failure: ``steps`` runs at
    most; the `Trial` that fits, or None.

    A remedy sizes what its failure is about; the run it names can fail on the next thing (the IPU
    count that holds the weights needs more micro-batches for its pipeline), whose own remedy is
    added to the changes. A count that fell short of its own failure is raised to at least itself
    plus a stride that doubles with each run (1, 2, 4, ...), so a remedy the lowering could only
    bound reaches a fit in a few runs, not one per unit."""
    changes: dict[str, Any] = {}
    stride = 1
    for _ in range(steps):
        if failure is None or not failure.remedy:
            return None
        remedy = dict(failure.remedy)
        for name, value in remedy.items():
            short = changes.get(name)
            if isinstance(short, int) and isinstance(value, int):
                remedy[name] = max(value, short + stride)
                stride *= 2
        if all(changes.get(k) == v for k, v in remedy.items()):
            return None
        changes.update(remedy)
        trial = runs.trial([(KNOBS[name], value) for name, value in changes.items()])
        if trial is None or trial.fits:
            return trial
        failure = trial.failure
    return None


def advise(report: Report, *, runs: VariantRuns | None = None, progress: Progress | None = None) -> Advice | None:
    """Run ``report``'s run once per candidate knob change (and, when its plan does not fit, the
    fitting search), set ``report.advice`` and return it; None for a report that was not placed.

    ``runs``: variant runs already made for ``report`` (`VariantRuns`, e.g. by `fitting_knob`),
    reused rather than executed again. ``progress``: a line for each variant it places.
    """
    if not _placeable(report):
        return None
    runs = runs or VariantRuns(report)
    if progress is not None:
        runs.say = progress
    trials = tuple(t for t in (runs.trial([c]) for c in candidate_knobs(report)) if t is not None)
    searched = not report.plan.fits
    fit = fitting_knob(report, runs=runs) if searched else None
    report.advice = Advice(trials=trials, fit=fit, fit_searched=searched, placements=runs.placements)
    return report.advice
