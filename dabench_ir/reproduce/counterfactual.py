"""Counterfactuals: a finding's experiment run again with the mechanism it names switched off.

A finding that the tool reproduces is evidence only if it could have failed. Each finding of a
study names its counterfactual: some figures of one target changed (`Target.with_changes`:
``"compute.peak_flops.fp32" = "compute.peak_flops.bf16"`` runs fp32 at the bf16 rate) and/or some
knobs of its points changed (``chips_per_node = 8``). The points the finding reads are run again
that way, their rows given back the original points' parameters, and the finding evaluated on
them as before. If it is still reproduced, the finding does not test its mechanism: it is
reported as *not a test*, as is a finding with no counterfactual at all (its ``tautology`` says
why none exists).

The changed targets are written as files into the study's output folder
(``OUT/counterfactuals/targets/NAME-HASH.toml``, named by their contents, so two findings with
the same counterfactual share its points) and the points run as one more sweep into
``OUT/counterfactuals`` (resumable like the study's own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.reproduce.rows import matches

if TYPE_CHECKING:
    from dabench_ir.reproduce.study import Finding, Study
    from dabench_ir.sweep.spec import Point, SweepSpec
    from dabench_ir.targets import Target

__all__ = ["Counterfactual", "CounterfactualRun", "needed_points", "parse_counterfactual", "plan_counterfactuals"]

_FIELDS = ("what", "on", "target", "knobs", "unset")


@dataclass(frozen=True)
class Counterfactual:
    """What a finding's mechanism switched off means: ``what`` (shown in every output), figure
    changes of the target ``on`` (a name or alias), knob changes of the points and parameters
    ``unset`` in them (back to the sweep's default: ``vocab`` unset is a bare stack of blocks)."""

    what: str
    on: str | None = None
    target: dict[str, float | str] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    unset: tuple[str, ...] = ()


def needed_points(f: Finding, spec: SweepSpec) -> list[Point]:
    """The points of ``f``'s experiment its figure is computed from: ``where``'s, narrowed to its
    one-point selectors and a curve's ends."""
    picked = [p for p in spec.points if matches(p.params, f.where)]
    selectors = [f.options[k] for k in ("numerator", "denominator", "select") if k in f.options]
    if selectors and f.kind in ("ratio", "value"):
        picked = [p for p in picked if any(matches(p.params, s) for s in selectors)]
    if f.kind == "curve" and ("from" in f.options or "to" in f.options):
        axis = f.options["axis"]
        ends = [f.options[k] for k in ("from", "to") if k in f.options]
        values = sorted({json.dumps(p[axis]) for p in picked})
        keep = (
            {json.dumps(e) for e in ends}
            | ({values[0]} if "from" not in f.options else set())
            | ({values[-1]} if "to" not in f.options else set())
        )
        picked = [p for p in picked if json.dumps(p[axis]) in keep]
    return picked


def _targets_of(points: Sequence[Point]) -> dict[str, Target]:
    from dabench_ir.targets import load_target

    return {str(p["target"]): load_target(str(p["target"])) for p in points}


def parse_counterfactual(raw: Any, where: str, points: Sequence[Point]) -> Counterfactual:
    """A finding's ``counterfactual`` table, checked against the points it reads: the target it
    changes is one of theirs and takes the changes, every knob is one the sweep knows and gives
    valid points."""
    from dabench_ir.errors import TargetError

    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: counterfactual must be a table (what, on, target, knobs)")
    unknown = [k for k in raw if k not in _FIELDS]
    if unknown:
        raise UserError(f"{where}: counterfactual has unknown field {unknown[0]!r}; it takes {', '.join(_FIELDS)}")
    what = raw.get("what")
    if not isinstance(what, str) or not what.strip():
        raise UserError(f"{where}: counterfactual.what must say what is switched off (a non-empty string)")
    changes, knobs, unset = raw.get("target", {}), raw.get("knobs", {}), raw.get("unset", [])
    if not isinstance(unset, list) or not all(isinstance(u, str) for u in unset):
        raise UserError(f"{where}: counterfactual.unset must be a list of parameter names")
    if not isinstance(changes, Mapping) or not isinstance(knobs, Mapping) or not (changes or knobs or unset):
        raise UserError(
            f"{where}: counterfactual needs target = {{ figure = value }}, knobs = {{ knob = value }} "
            "or unset = [parameter, ...]"
        )
    cf = Counterfactual(
        what=what.strip(), on=raw.get("on"), target=dict(changes), knobs=dict(knobs), unset=tuple(unset)
    )
    targets = _targets_of(points)
    try:
        _changed_target(cf, targets, where)
    except TargetError as exc:
        raise UserError(f"{where}: counterfactual: {exc}") from None
    _knobbed(cf, points, where)
    return cf


def _changed_target(cf: Counterfactual, targets: Mapping[str, Target], where: str) -> tuple[str, Target] | None:
    """(the points' target name, its changed Target) of ``cf``, or None when it changes no figure."""
    if not cf.target:
        return None
    if cf.on is None:
        if len({t.name for t in targets.values()}) != 1:
            names = ", ".join(sorted({t.name for t in targets.values()}))
            raise UserError(
                f"{where}: counterfactual changes figures of several targets' points ({names}): "
                "say which with on = NAME"
            )
        name = next(iter(targets))
    else:
        from dabench_ir.targets import load_target

        wanted = load_target(str(cf.on)).name
        names = [n for n, t in targets.items() if t.name == wanted]
        if not names:
            raise UserError(
                f"{where}: counterfactual.on = {cf.on!r}: no point the finding reads runs on it "
                f"(they run on {', '.join(sorted({t.name for t in targets.values()}))})"
            )
        name = names[0]
    return name, targets[name].with_changes(cf.target)


def _knobbed(cf: Counterfactual, points: Sequence[Point], where: str) -> list[Point]:
    """``points`` with ``cf``'s knobs set, checked and normalised as a sweep spec's points are."""
    from dabench_ir.sweep.spec import make_point

    if not cf.knobs and not cf.unset:
        return list(points)
    out = []
    for p in points:
        params = {k: v for k, v in p.params.items() if k not in cf.unset}
        out.append(make_point({**params, **cf.knobs}, f"{where}: counterfactual"))
    return out


@dataclass
class CounterfactualRun:
    """The points to run for a study's counterfactuals, and which finding reads which of them
    in place of which original point."""

    points: list[Point]
    reads: dict[str, list[tuple[Point, dict[str, Any]]]]  # finding id -> [(its cf point, the original's params)]


def plan_counterfactuals(study: Study, folder: Path) -> CounterfactualRun:
    """Every finding's counterfactual points; the changed targets are written into ``folder``
    (content-addressed files) and named by the points."""
    from dabench_ir.fileio import write_output
    from dabench_ir.sweep.spec import Point

    points: dict[str, Point] = {}
    reads: dict[str, list[tuple[Point, dict[str, Any]]]] = {}
    for f in study.findings:
        if f.counterfactual is None:
            continue
        where = f"{study.origin}: finding {f.id}"
        originals = needed_points(f, study.experiments[f.experiment])
        changed = _changed_target(f.counterfactual, _targets_of(originals), where)
        path = None
        if changed is not None:
            name, target = changed
            text = target.toml()
            path = folder / f"{target.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.toml"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                write_output(path, text)
        knobbed = _knobbed(f.counterfactual, originals, where)
        pairs = []
        for original, p in zip(originals, knobbed, strict=True):
            if path is not None and p["target"] == name:
                p = Point({**p.params, "target": str(path.resolve())})
            pairs.append((points.setdefault(p.canonical(), p), original.params))
        reads[f.id] = pairs
    return CounterfactualRun(list(points.values()), reads)
