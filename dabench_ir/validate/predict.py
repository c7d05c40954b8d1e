"""How a profile report predicts each measured quantity: ``PREDICTORS`` and the report extractors.

A quantity with no extractor is "not predicted"; the kernel table is compared per kernel class.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dabench_ir.validate.catalog import Point
from dabench_ir.validate.kernels import kernel_classes, kernel_load_imbalance
from dabench_ir.validate.results import Quantity

if TYPE_CHECKING:
    from dabench_ir.plan import Unit
    from dabench_ir.report import Report

__all__ = ["PREDICTORS", "device_s", "host_s", "kernel_quantities", "max_pcu", "sections_of"]


def _plan_units(report: Report | None) -> list[Unit]:
    """The units of the plan behind ``report`` (none when it was not placed)."""
    plan = getattr(report, "plan", None)
    return list(plan.units) if plan is not None else []


def kernel_quantities(p: Point, key: str, name: str, report: Report | None = None) -> list[Quantity]:
    """A compile report's kernel table against the plan's regions, per kernel class: total PEs
    (``kernel_pes``), the typical kernel's PEs (``kernel_pes_typical``, classes of more than one
    kernel) and utilisation (``kernel_utilization``), and the load imbalance (``load_imbalance``)."""
    path = Path(p.file).parent / name
    if not path.is_file():
        return [Quantity(f"{key}", None, None, f"file {name} not found next to {Path(p.file).name}")]
    # the plan's regions by kernel class (WSE: unit kind "wse_region:<class>"; the I/O region is "patio")
    regions: dict[str, list[tuple[float, float | None]]] = {}
    for u in _plan_units(report) if report is not None and report.fits else []:
        kind = u.kind
        cls = kind.partition(":")[2] if kind.startswith("wse_region:") else "patio" if kind == "wse_io" else ""
        if cls:
            regions.setdefault(cls, []).append((float(u.stats.pes or 0.0), u.stats.utilisation))
    out = []
    for cls, c in sorted(kernel_classes(path).items()):
        mine = regions.get(cls)
        if not mine:
            out.append(Quantity(f"kernel_pes[{cls}]", c["pes"], None, "not predicted"))
            continue
        out.append(Quantity(f"kernel_pes[{cls}]", c["pes"], sum(pes for pes, _ in mine)))
        if c["count"] > 1:
            out.append(Quantity(f"kernel_pes_typical[{cls}]", c["pes_median"], statistics.median(x for x, _ in mine)))
        utils = [u for _, u in mine if u is not None]
        if c["util_median"] and utils:
            out.append(Quantity(f"kernel_utilization[{cls}]", c["util_median"], statistics.median(utils)))
    li = kernel_load_imbalance(path)
    if li is not None:
        predicted = report.metrics.get("load_imbalance") if report is not None and report.fits else None
        out.append(Quantity("load_imbalance", li, predicted, "" if predicted is not None else "not predicted"))
    return out


def _kernel_utilisation(report: Report) -> float | None:
    """PE-weighted mean utilisation of the plan's kernel regions (what a compile report's "compute
    utilisation" is), else the compute efficiency."""
    regions = [(u.stats.utilisation, u.stats.pes) for u in _plan_units(report)]
    regions = [(util, pes) for util, pes in regions if util is not None and pes]
    if not regions:
        return report.metrics.get("compute_efficiency")
    return sum(util * pes for util, pes in regions) / sum(pes for _, pes in regions)


def _io_rate(report: Report, key: str) -> float | None:
    """A compile report's steady-state ceilings as the plan's I/O region states them (WSE
    pipelined: ``compute``, the slowest kernel's rate, and ``transmission``, that rate under the
    input-transmission ceiling; no per-step optimizer or I/O cost); None where the plan has none."""
    for u in _plan_units(report):
        if u.kind == "wse_io":
            value = u.stats.compute_samples_per_s if key == "compute" else u.stats.transmission_samples_per_s
            return float(value) if value is not None and math.isfinite(value) else None
    return None


def host_s(report: Report) -> float | None:
    timeline = getattr(report, "timeline", None)
    over = getattr(timeline, "overheads_s", None) or {}
    host = [v for k, v in over.items() if k.startswith("host")]
    return float(sum(host)) if host else None


def device_s(report: Report) -> float | None:
    step = report.totals.get("time_s")
    if step is None:
        return None
    return step - (host_s(report) or 0.0)


def sections_of(report: Report) -> float | None:
    n = sum(1 for u in report.units if u.get("kind") == "rdu_section")
    return float(n) if n else None


def max_pcu(report: Report) -> float | None:
    alloc = [u.get("allocation") for u in report.units if u.get("kind") == "rdu_section"]
    alloc = [a for a in alloc if a is not None]
    return max(alloc) if alloc else None


def _tokens_per_s(report: Report, point: Point) -> float | None:
    from dabench_ir.sweep.graphs import base_config

    tp = report.totals.get("throughput_samples_per_s")
    return tp * base_config(dict(point.model)).seq if tp else None


def _tflops(report: Report) -> float | None:
    achieved = report.totals.get("achieved_flops_per_s")
    return achieved / 1e12 if achieved else None


PREDICTORS: dict[str, Callable[[Report, Point], float | None]] = {
    "samples_per_s": lambda r, _p: r.totals.get("throughput_samples_per_s"),
    "tokens_per_s": _tokens_per_s,
    "step_time_s": lambda r, _p: r.totals.get("time_s"),
    "latency_s": lambda r, _p: r.totals.get("time_s"),
    "host_time_s": lambda r, _p: host_s(r),
    "device_time_s": lambda r, _p: device_s(r),
    "sections": lambda r, _p: sections_of(r),
    "max_pcu_utilization": lambda r, _p: max_pcu(r),
    "active_pes": lambda r, _p: r.metrics.get("allocation_ratio"),
    "compute_utilization": lambda r, _p: _kernel_utilisation(r),
    "tflops": lambda r, _p: _tflops(r),
    "compute_limited_samples_per_s": lambda r, _p: _io_rate(r, "compute"),
    "transmission_limited_samples_per_s": lambda r, _p: _io_rate(r, "transmission"),
}
"""Measured quantity -> how the report predicts it (missing: "not predicted")."""
