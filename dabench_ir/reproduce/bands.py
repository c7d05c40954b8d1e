"""Bands: how close the tool's figure must come to the paper's for a finding to count as reproduced.

One rule per kind of figure, written here and nowhere else; a study file states the paper's
figure (``paper``) and never its own acceptance range, so no band can be widened to let one
finding pass. Every output names the rule a finding was graded by (`Grading.text`).

| rule | the figure | reproduced when |
|---|---|---|
| ``change`` | a relative change (a gain, a loss: ratio - 1) | within ±1/3 of the paper's change |
| ``factor`` | a plain ratio (0.6x) | its change (ratio - 1) within ±1/3 of the paper's |
| ``relative`` | any other number (samples/s) | within ±1/3 of the paper's |
| ``scaling`` | gain along a scaled axis / the linear gain | within ±1/3 of the paper's (1 "near-linear", 0 "flat") |
| ``share`` | a fraction of a whole (allocation, efficiency, LI) | within ±5 percentage points of the paper's (in [0, 1]) |
| ``limit`` | where a model stops fitting (layers) | within ±15 % of the paper's count |
| ``position`` | where a curve bends (a batch size) | within a factor of 2 (one doubling) of the paper's |
| ``label`` | a category (which target, which bound) | equal to the paper's |
| ``direction`` | where the paper gives no number | the paper's direction, beyond ±2 % (*direction only*) |
| ``none`` | the paper's figure is not in the study's sources | never: the finding is not a test |

Why these widths: ±1/3 keeps a change's sign and size class (+34 % accepts +23..46 %; neither
no effect nor twice the effect passes); a share's band is absolute because a relative one near
100 % would accept values above it; ±15 % of a depth keeps a 72-layer limit to 62..82 layers,
so on a grid of 12-layer steps only the paper's own depth; one doubling is the resolution of
the doubling grids bends are read on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHANGE_TOLERANCE",
    "DIRECTION_TOLERANCE",
    "KNEE_LEVEL",
    "LIMIT_TOLERANCE",
    "MAJORITY",
    "NO_FIGURE",
    "POSITION_FACTOR",
    "RANGE_SHARE",
    "RULES",
    "SCALING_WORDS",
    "SHARE_METRICS",
    "SHARE_POINTS",
    "Grading",
    "grade",
]

CHANGE_TOLERANCE = 1 / 3
"""A change, a ratio's change, a number, a scaling efficiency: within this fraction of the paper's
(of the linear gain, for a scaling efficiency)."""
SHARE_POINTS = 0.05
"""A share of a whole: within this many (absolute) points of the paper's."""
LIMIT_TOLERANCE = 0.15
"""A fit limit: within this fraction of the paper's count."""
POSITION_FACTOR = 2.0
"""Where a curve bends: within this factor of the paper's axis value."""
DIRECTION_TOLERANCE = 0.02
"""A direction-only claim: the change must exceed this (a step within it counts either way)."""
RANGE_SHARE = 0.9
"""A claim over a sweep ("stays at 0.96-1.0"): holds when this share of its points lie in the band."""
MAJORITY = 0.5
"""A claim about most points (memory-bound, compute-bound): this share of them."""
KNEE_LEVEL = 0.9
"""Where a curve flattens: the first axis value whose figure reaches this share of the range's largest."""

SHARE_METRICS = frozenset(
    {"allocation_ratio", "compute_efficiency", "load_imbalance", "memory_onchip", "memory_offchip"}
)
"""Results columns that are a fraction of a whole (graded by ``share``)."""

SCALING_WORDS = {"near-linear": 1.0, "linear": 1.0, "flat": 0.0}
"""The paper's words for a scaling efficiency (gain over the linear gain)."""

RULES: dict[str, str] = {
    "change": "within ±1/3 of the paper's change",
    "factor": "change within ±1/3 of the paper's",
    "relative": "within ±1/3 of the paper's figure",
    "scaling": "scaling efficiency within ±1/3 of the paper's",
    "share": "within ±5 points of the paper's",
    "limit": "within ±15 % of the paper's count",
    "position": "within a factor of 2 of the paper's",
    "label": "equal to the paper's",
    "direction": "direction only",
    "none": "no paper figure in the study's sources",
}
"""Each rule's name and how every output states it."""


@dataclass(frozen=True)
class Grading:
    """How a finding is graded: its rule (`RULES`), the band its figure must lie in (None for a
    label, or when there is no figure), and the rule as shown."""

    rule: str
    accept: tuple[float, float] | None = None

    @property
    def text(self) -> str:
        return RULES[self.rule]

    @property
    def numeric(self) -> bool:
        """True when the paper gives a number (a direction-only or label claim does not)."""
        return self.rule not in ("label", "direction", "none")


NO_FIGURE = Grading("none")
"""The grading of a finding whose paper figure the study does not have: never reproduced, not a test."""


def _ends(paper: Any) -> tuple[float, float] | None:
    """The paper's figure as (low, high): a number is both ends, a [low, high] range its ends."""
    if isinstance(paper, (int, float)) and not isinstance(paper, bool):
        return float(paper), float(paper)
    if isinstance(paper, (list, tuple)) and len(paper) == 2:
        return float(paper[0]), float(paper[1])
    return None


def _direction(expect: str, rule: str) -> tuple[float, float]:
    """The band of a direction-only claim on a change (``factor``: on a plain ratio)."""
    one = 1.0 if rule == "factor" else 0.0
    if expect in ("increasing", "higher"):
        return one + DIRECTION_TOLERANCE, math.inf
    if expect in ("decreasing", "lower"):
        return -math.inf, one - DIRECTION_TOLERANCE
    return one - DIRECTION_TOLERANCE, one + DIRECTION_TOLERANCE


def grade(rule: str, paper: Any, options: Mapping[str, Any]) -> Grading:
    """The grading of a finding whose figure the kind grades by ``rule`` (`RULES`), from the
    paper's figure ``paper`` (a number, a [low, high] range, a word or None) and the finding's
    ``expect`` (a direction, when the paper gives no number)."""
    if rule == "label":
        return Grading("label")
    if rule == "scaling" and isinstance(paper, str) and paper in SCALING_WORDS:
        paper = SCALING_WORDS[paper]
    ends = _ends(paper)
    if ends is None or rule == "direction":
        expect = options.get("expect")
        if rule in ("change", "factor", "scaling", "direction") and isinstance(expect, str):
            return Grading("direction", None if rule == "direction" else _direction(expect, rule))
        return NO_FIGURE
    lo, hi = ends
    if rule == "change" or rule == "relative":
        return Grading(rule, (lo - abs(lo) * CHANGE_TOLERANCE, hi + abs(hi) * CHANGE_TOLERANCE))
    if rule == "factor":
        return Grading(rule, (lo - abs(lo - 1) * CHANGE_TOLERANCE, hi + abs(hi - 1) * CHANGE_TOLERANCE))
    if rule == "scaling":
        return Grading(rule, (lo - CHANGE_TOLERANCE, hi + CHANGE_TOLERANCE))
    if rule == "share":
        return Grading(rule, (max(0.0, lo - SHARE_POINTS), min(1.0, hi + SHARE_POINTS)))
    if rule == "limit":
        return Grading(rule, (lo * (1 - LIMIT_TOLERANCE), hi * (1 + LIMIT_TOLERANCE)))
    if rule == "position":
        return Grading(rule, (lo / POSITION_FACTOR, hi * POSITION_FACTOR))
    raise ValueError(f"unknown band rule {rule!r}")
