"""Study sweeps: a grid of models × targets × options, run in parallel, resumable, tabulated.

    >>> from dabench_ir.sweep import load_spec, run_sweep
    >>> result = run_sweep(load_spec("level1"), "out/level1", jobs=2)
    >>> result.rows[0]["allocation_ratio"]

See docs/sweeps.md for the spec format and the output folder.
"""

from __future__ import annotations

from dabench_ir.sweep.results import dominant_bound, record_row
from dabench_ir.sweep.runner import SweepResult, point_key, run_sweep
from dabench_ir.sweep.spec import Point, SweepSpec, bundled_specs, load_spec, parse_spec, spec_params

__all__ = [
    "Point",
    "SweepResult",
    "SweepSpec",
    "bundled_specs",
    "dominant_bound",
    "load_spec",
    "parse_spec",
    "point_key",
    "record_row",
    "run_sweep",
    "spec_params",
]
