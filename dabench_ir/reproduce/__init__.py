"""Reproduce a published study: its experiments (sweep grids) run, its findings checked one by one.

    >>> from dabench_ir.reproduce import load_study, run_study
    >>> result = run_study(load_study("dabench"), "out/reproduce-dabench", jobs=2)
    >>> [(o.id, o.reproduced) for o in result.outcomes]

A study is one TOML file (bundled ones in ``dabench_ir/data/reproduce/``): experiments in the
sweep spec format, findings as data evaluated by registered kinds (`kinds.KINDS`), plots.
See docs/reproduce.md for the format.
"""

from __future__ import annotations

from dabench_ir.reproduce.kinds import KINDS, Outcome, Unmet, evaluate, finding_kind
from dabench_ir.reproduce.run import FindingOutcome, StudyResult, run_study
from dabench_ir.reproduce.study import Finding, PlotSpec, Study, bundled_studies, load_study, parse_study

__all__ = [
    "KINDS",
    "Finding",
    "FindingOutcome",
    "Outcome",
    "PlotSpec",
    "Study",
    "StudyResult",
    "Unmet",
    "bundled_studies",
    "evaluate",
    "finding_kind",
    "load_study",
    "parse_study",
    "run_study",
]
