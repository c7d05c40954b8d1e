"""A compile report's kernel table (CSV) read per kernel class, and its load imbalance.

Kept apart from the catalogue schema: these read measurement files, not the catalogue's TOML.
The table's schema is `_kernel_rows`, its one reader: the `REQUIRED_COLUMNS`, ``active_pes`` a
positive count of PEs, ``compute_utilization_pct`` a percentage in [0, 100], ``samples_per_s``
a positive rate (blank where not stated); any other value is one UserError line naming the
file, the line, the column and the allowed range.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterator
from pathlib import Path

from dabench_ir.errors import UserError
from dabench_ir.schema import COUNT, POSITIVE, Range, check

__all__ = ["REQUIRED_COLUMNS", "check_kernel_table", "kernel_classes", "kernel_load_imbalance"]

REQUIRED_COLUMNS = ("kernel", "active_pes")
"""The columns a compile report's kernel table must have (``compute_utilization_pct`` and
``samples_per_s`` are read where present)."""


def check_kernel_table(csv_path: str | Path, where: str = "") -> None:
    """Refuse, in one line, a kernel table that lacks a required column or holds a bad number."""
    for _ in _kernel_rows(csv_path, where):
        pass


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
            "count": len(kernels),
            "pes": sum(pes),
            "pes_min": min(pes),
            "pes_max": max(pes),
            "pes_median": statistics.median(pes),
            "util_min": min(utils, default=None),
            "util_max": max(utils, default=None),
            "util_median": statistics.median(utils) if utils else None,
            "rate_min": min(rates, default=None),
            "rate_max": max(rates, default=None),
        }
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


def _kernel_rows(csv_path: str | Path, where: str = "") -> Iterator[tuple[str, float, float | None, float | None]]:
    """(class, PEs, utilisation, samples/s) per row of a compile report's kernel table; a
    UserError naming the file (after ``where``) and the column when one is missing or bad."""
    label = f"{where + ': ' if where else ''}{Path(csv_path).name}"
    try:
        with open(csv_path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise UserError(
                    f"{label}: no column {', '.join(map(repr, missing))}; a kernel table has the columns "
                    f"{', '.join(REQUIRED_COLUMNS)} (and compute_utilization_pct, samples_per_s)"
                )
            for line, row in enumerate(reader, start=2):
                name = (row["kernel"] or "").rstrip("0123456789") or row["kernel"]
                where = f"{label}: line {line}: column"
                pes = _cell(row, "active_pes", COUNT, where, required=True)
                util = _cell(row, "compute_utilization_pct", _PERCENT, where)
                rate = _cell(row, "samples_per_s", POSITIVE, where)
                yield name, pes, None if util is None else util / 100, rate  # type: ignore[misc]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{label}: cannot read it as a CSV table ({exc})") from None


_PERCENT = Range("a percentage in [0, 100]", low=0.0, high=100.0)
"""``compute_utilization_pct``: a share of the kernel's PEs' time, written as a percentage (a compile
report rounds a tiny one to 0 %)."""
_BLANK = ("", "-", "--", "–")
"""How a kernel table writes a figure it does not state (the I/O region has no rate)."""


def _cell(row: dict[str, str | None], column: str, rule: Range, where: str, *, required: bool = False) -> float | None:
    """The number in ``column`` of a kernel table's ``row`` (a trailing ``%`` allowed), in ``rule``'s
    range; None when blank and not ``required``, else one UserError line naming the column."""
    text = (row.get(column) or "").strip()
    if text in _BLANK and not required:
        return None
    try:
        value = float(text.rstrip("%").strip())
    except ValueError:
        value = text  # type: ignore[assignment]  # refused below, shown as written
    return check(value, rule, f"{where} {column}")
