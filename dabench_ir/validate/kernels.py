"""A compile report's kernel table (CSV) read per kernel class, and its load imbalance.

Kept apart from the catalogue schema: these read measurement files, not the catalogue's TOML.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterator
from pathlib import Path

from dabench_ir.report.table import parse_percent

__all__ = ["kernel_classes", "kernel_load_imbalance"]


def kernel_classes(csv_path: str | Path) -> dict[str, dict[str, float]]:
    """Per kernel class of a compile report's kernel table: count, PEs (sum, min, max, median),
    utilisation (min, max, median) and rates.

    The class is the kernel name without its trailing number (``attention12`` -> attention).
    The median is the typical kernel: the region the compiler's balance sets, unmoved by the
    few regions it oversizes (8 of GPT-2 small's 25 layer norms run at 1.1-2.2x the pipeline's rate).
    """
    rows: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for name, pes, util, rate in _kernel_rows(csv_path):
        rows.setdefault(name, []).append((pes, util, rate))
    out: dict[str, dict[str, float]] = {}
    for name, kernels in rows.items():
        pes = [k[0] for k in kernels]
        utils = [k[1] for k in kernels if k[1] is not None]
        rates = [k[2] for k in kernels if k[2] is not None]
        out[name] = {
            "count": len(kernels), "pes": sum(pes), "pes_min": min(pes), "pes_max": max(pes),
            "pes_median": statistics.median(pes),
            "util_min": min(utils, default=None), "util_max": max(utils, default=None),
            "util_median": statistics.median(utils) if utils else None,
            "rate_min": min(rates, default=None), "rate_max": max(rates, default=None),
        }  # fmt: skip
    return out


def kernel_load_imbalance(csv_path: str | Path) -> float | None:
    """A compile report's LI as the tool defines it (docs/targets.md, WSE): the PE-weighted share
    of each period a kernel is busy, ``sum_k p_k x (slowest rate / rate_k) / sum_k p_k``, over the
    kernels that state a rate."""
    timed = [(pes, rate) for _, pes, _, rate in _kernel_rows(csv_path) if rate]
    if not timed:
        return None
    slowest = min(rate for _, rate in timed)
    return sum(pes * slowest / rate for pes, rate in timed) / sum(pes for pes, _ in timed)


def _kernel_rows(csv_path: str | Path) -> Iterator[tuple[str, float, float | None, float | None]]:
    """(class, PEs, utilisation, samples/s) per row of a compile report's kernel table."""
    with open(csv_path, newline="") as fh:
        for row in csv.DictReader(fh):
            name = row["kernel"].rstrip("0123456789") or row["kernel"]
            yield (
                name,
                float(row["active_pes"]),
                parse_percent(row.get("compute_utilization_pct")),
                _float(row.get("samples_per_s")),
            )


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "-", "–") else None
    except ValueError:
        return None
