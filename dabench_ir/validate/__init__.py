"""Predicted vs measured: run the catalogue of published measurements through the tool.

The catalogue (``dabench_ir/data/measurements/*.toml``, format in its README.md and
docs/validation.md) holds one record per published data point: a system, a model and the
options it ran with, the quantities measured, and the source. `validate` builds each
model weight-free (the sweep's cached 1-layer export, stamped to L layers), profiles it
with the point's options through the public pipeline, and compares every measured
quantity with the tool's prediction. A point the tool cannot run is kept with its reason;
a quantity the tool does not predict is shown as such; an option it has no knob for is
listed as ignored. Users run their own measurements with ``--catalog FILE``.

Relative error = (predicted - measured) / measured. Statistics per target use |error| and
leave out points marked ``reference_only`` (measured on another chip generation).

The package holds one concern per module: `catalog` (the format and its parser), `kernels`
(compile-report kernel tables), `results` (point results and statistics), `cache` (shared
graphs), `runner` (running the points), `predict` (report -> quantity), `gemm`
(microbenchmarks) and `write` (JSON, CSV, plots, the regression guard).
"""

from __future__ import annotations

from dabench_ir.validate.catalog import (
    FORMAT,
    HEADLINE,
    KINDS,
    NOT_RUN_KEYS,
    RUN_OPTIONS,
    Point,
    bundled_catalogs,
    load_catalog,
    parse_catalog,
)
from dabench_ir.validate.gemm import gemm_model
from dabench_ir.validate.kernels import kernel_classes, kernel_load_imbalance
from dabench_ir.validate.predict import PREDICTORS
from dabench_ir.validate.results import PointResult, Quantity, Validation
from dabench_ir.validate.runner import run_validation
from dabench_ir.validate.write import baseline, regressions, write_csv, write_json, write_plots

__all__ = [
    "FORMAT",
    "HEADLINE",
    "KINDS",
    "NOT_RUN_KEYS",
    "PREDICTORS",
    "RUN_OPTIONS",
    "Point",
    "PointResult",
    "Quantity",
    "Validation",
    "baseline",
    "bundled_catalogs",
    "gemm_model",
    "kernel_classes",
    "kernel_load_imbalance",
    "load_catalog",
    "parse_catalog",
    "regressions",
    "run_validation",
    "write_csv",
    "write_json",
    "write_plots",
]
