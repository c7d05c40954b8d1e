""" "Why" in words: for the top roles, what binds them and which knob would change it.

For each of a report's top roles (by time): its bound, the resource that binds it (the
memory that feeds it and how much it moves there, the compute units and their
utilisation, the link, or the fixed cost), and the target knob whose change shortens it
most. The knob changes are runs the orchestration made (`dabench_ir.advice.advise`: one
``ResolvedRun.variant`` per candidate, executed by `dabench_ir.run.execute`) and handed to
the report as ``report.advice``; this module only renders from them and places nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dabench_ir.advice import ESTIMATE_MARK, StepTimes
from dabench_ir.options import Knob

from .attribution import is_overhead, role_rows, target_peak
from .table import human, seconds, short_percent

if TYPE_CHECKING:
    from dabench_ir.advice import Trial

    from .model import Report

__all__ = ["change_text", "explain"]

logger = logging.getLogger(__name__)


def change_text(changes: Iterable[tuple[Knob, Any]]) -> str:
    """The flags of knob changes with their values: ``--ipus 4``, ``--ipus 4 --matmul-proportion 0.3``."""
    return " ".join(f"{k.flag} {_shown(v)}" for k, v in changes)


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


REREAD_SHOWN = 1.5
"""How many times over its feed must move a role's tensors before its why line says so beside the
traffic: the table's bytes count each tensor once, the feed's traffic every read of it."""


def _resource(report: Report, row: dict[str, Any]) -> str:
    """The resource that binds a role, in words, from the plan's node placements."""
    target, plan = report.target_obj, report.plan
    role, bound = row["role"], row["bound"]
    if is_overhead(role):
        kind = role.split(": ", 1)[1]
        name = kind.replace("_", " ")
        units = [u for u in plan.units if u.gap_before_s > 0 and getattr(u, "gap_kind", None) == kind] if plan else []
        if units and "stall" not in name:
            return f"{name}: {seconds(units[0].gap_before_s)} before each of {len(units)} units"
        return f"{name}: time no node owns"
    records = [n for n in report.nodes if (n.role or n.op_type) == role]
    plans = [plan.node_plans[n.name] for n in records if plan is not None and n.name in plan.node_plans]
    if bound == "memory" and plans:
        levels: dict[str, int] = {}
        for p in plans:
            levels[p.feed_level] = levels.get(p.feed_level, 0) + p.feed_bytes
        level = max(levels, key=levels.__getitem__)
        moved = levels[level]
        costs = [n.cost for n in records if n.cost is not None]
        weights = sum(c.weight_bytes for c in costs)
        tensors = sum(c.bytes for c in costs)  # the role's own tensors, each once: the table's bytes
        try:
            mem = target.memory(level)
            where = f"{mem.name} {human(mem.bandwidth_bytes_per_s, 'B/s')}"
        except Exception:  # a level the target does not name: say the level
            where = level or "memory"
        what = "weights" if weights >= (tensors or moved) / 2 else "activations"
        rereads = moved / tensors if tensors else 1.0
        # a feed that re-reads the tensors (an IPU matmul's tiles) moves more than the table's bytes
        again = f" ({human(tensors, 'B')} of tensors, read {rereads:.3g} times over)" if rereads >= REREAD_SHOWN else ""
        return f"{where}: {human(moved, 'B')} moved{again}, mostly {what}"
    if bound == "compute":
        # units the role holds at once: every region of a spatial plan, one section at a time otherwise
        per_unit: dict[str, float] = {}
        for p in plans:
            per_unit[p.unit] = max(per_unit.get(p.unit, 0.0), p.allocation)
        concurrent = str(getattr(plan, "schedule", "")) == "concurrent"
        allocation = min(1.0, sum(per_unit.values())) if concurrent else max(per_unit.values(), default=0.0)
        peak = target_peak(report)
        util = _held_peak_share(report, records, peak)
        used = f", at {short_percent(util)} of their peak" if util is not None else ""
        units = f"{short_percent(allocation)} of the {target.unit_name}s" if allocation else f"the {target.unit_name}s"
        return f"{target.unit_name} compute on {units}{used} ({human(peak, 'FLOP/s')} chip peak)"
    if bound == "communication":
        link = target.link()
        comm = sum(p.comm_s for p in plans)
        via = f"{link.name} {human(link.bandwidth_bytes_per_s, 'B/s')}" if link is not None else "exchange"
        return f"{via} exchange: {seconds(comm)} of link and exchange time"
    return f"fixed costs (launch, sync, per-row latency): {seconds(sum(p.overhead_s for p in plans))}"


def _held_peak_share(report: Report, records: list[Any], peak: float | None) -> float | None:
    """The share of the peak of the units a role's nodes held that their FLOPs reached: the FLOPs
    over the peak-seconds held (each node's time times the peak of its ``allocation``, a share of
    ``allocation_chips`` chips: an RDU's compiled tiles, an IPU pipeline's IPUs). At most 1 on a
    physical plan; None where the role held no units or the target states no peak."""
    plan = report.plan
    if plan is None or not peak:
        return None
    flops = held_s = 0.0
    for n in records:
        np_ = plan.node_plans.get(n.name)
        if np_ is not None and n.time_s:
            flops += np_.flops
            held_s += n.time_s * np_.allocation
    return flops / (held_s * peak * plan.stats.allocation_chips) if held_s > 0 else None


def explain(report: Report, *, top: int = 3) -> list[dict[str, Any]]:
    """One line each for the ``top`` roles by time: bound, binding resource, and the knob
    that shortens the role most, with the role's and the step's new times.

    Renders from ``report.advice`` (the variant runs `dabench_ir.advice.advise` made); needs a
    placed report with its advice, returns [] otherwise. The lines are also stored on
    ``report.why`` (the JSON ``why`` key, the table's "Why" section).
    """
    advice = report.advice
    if report.plan is None or report.options is None or report.timeline is None or advice is None:
        return []
    rows = [r for r in role_rows(report) if r["time_s"]][:top]
    own = StepTimes.of(report.nodes, report.timeline, report.scaling.points[-1] if report.scaling else None)
    step = own.step_time_s
    out = []
    if not report.plan.fits:
        found: Trial | None = advice.fit
        reason = report.plan.failure.reason if report.plan.failure is not None else "does not fit"
        fix = f"{change_text(found.changes)} makes it fit" if found else "no target knob makes it fit"
        out.append(
            {
                "role": "(fit)",
                "bound": None,
                "resource": reason,
                "time_s": None,
                "step_s": step,
                "knob": " ".join(k.flag for k, _ in found.changes) if found else None,
                "value": (found.values() if found else None),
                "new_time_s": None,
                "new_step_s": None,
                "text": f"does not fit: {reason}; {fix}",
            }
        )
    for row in rows:
        role = row["role"]
        before = own.role_time(role)
        best = _best(step, role, before, advice.trials, must_fit=report.plan.fits)
        entry: dict[str, Any] = {
            "role": role,
            "bound": row["bound"],
            "resource": _resource(report, row),
            "time_s": before,
            "step_s": step,
            "knob": None,
            "value": None,
            "new_time_s": None,
            "new_step_s": None,
        }
        text = f"{role}: {row['bound'] or '-'}-bound, {entry['resource']}; "
        if ESTIMATE_MARK in role:  # `advice.hold_estimates`: no variant's own value is compared
            text += "an estimate, held at this run's value in every variant run: no knob is credited with changing it"
        elif not advice.trials:  # nothing was tried: "no knob shortens it" could not have failed
            text += "no target knob of this chip was tried"
        elif best is None:
            tried = ", ".join(sorted({t.knob.flag for t in advice.trials}))
            text += f"no knob shortens it by {short_percent(ROLE_GAIN_MIN)} or more without lengthening the step ({tried} tried)"
        else:
            trial, after = best
            new_step = trial.times.step_time_s
            entry.update(knob=trial.knob.flag, value=trial.value, new_time_s=after, new_step_s=new_step)
            as_run = trial.times.as_run_s
            held = (
                f" with the estimate-only rows held at this run's; {seconds(as_run)} as run"
                if as_run is not None and abs(as_run - new_step) > ROLE_GAIN_MIN * new_step
                else ""
            )
            text += (
                f"{trial.knob.flag} {trial.value} would take it from {seconds(before)} to {seconds(after)} "
                f"(step {seconds(step)} -> {seconds(new_step)}{held})"
            )
            if not trial.fits:  # the base does not fit either (`_best`): both steps are if they fitted
                reason = trial.failure.reason if trial.failure is not None else "does not fit"
                text += f", if it fitted: with it the run does not fit either ({reason})"
        entry["text"] = text
        out.append(entry)
    report.why = out
    return out


ROLE_GAIN_MIN = 0.01
"""The least share of a role's time a knob must save to be advised for it: a smaller change is
inside what the chip models can tell apart (their cross-validated errors are several percent,
docs/validation.md) and prints as no change at three figures ("from 14.4 ms to 14.4 ms")."""


def _best(
    step: float, role: str, before: float, trials: Iterable[Trial], *, must_fit: bool
) -> tuple[Trial, float] | None:
    """Among the trials that shorten ``role`` by at least `ROLE_GAIN_MIN` of its time and do not
    lengthen the ``step`` (and fit, when ``must_fit``: a plan that fits is never advised into one
    that does not), the one with the shortest step (ties: the shorter role time), with the role's
    time in it; None when there is none."""
    best = None
    for trial in trials:
        if must_fit and not trial.fits:
            continue
        after = trial.times.role_time(role)
        if after > before * (1 - ROLE_GAIN_MIN) or trial.times.step_time_s > step * (1 + 1e-9):
            continue
        if best is None or (trial.times.step_time_s, after) < (best[0].times.step_time_s, best[1]):
            best = (trial, after)
    return best
