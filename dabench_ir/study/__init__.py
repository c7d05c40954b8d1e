"""Compiler-optimisation studies: named pass pipelines on one model, diffed node by node per target.

`run_study` runs registered `Pipeline`s (onnxscript, onnxruntime, RDU opt levels, WSE
modes, or your own: `register_pipeline`), places each result on every target and diffs it
against the model as it is: totals, every node with the source nodes it replaced
(`provenance`), and every module. `diff_reports` does the same for any two reports.
See docs/studies.md.
"""

from __future__ import annotations

from .diff import NODE_COLUMNS, diff_reports, name_provenance
from .pipelines import OnnxRewritePass, Pipeline, get_pipeline, pipeline_names, register_pipeline
from .provenance import Provenance, module_label, provenance
from .run import STUDY_SCHEMA, run_study, study_run

__all__ = [
    "NODE_COLUMNS",
    "STUDY_SCHEMA",
    "OnnxRewritePass",
    "Pipeline",
    "Provenance",
    "diff_reports",
    "get_pipeline",
    "module_label",
    "name_provenance",
    "pipeline_names",
    "provenance",
    "register_pipeline",
    "run_study",
    "study_run",
]
