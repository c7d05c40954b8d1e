"""Sweep results: per-point JSON records on disk, and the table (CSV, Parquet) built from them.

Every file is written to a temporary name and moved into place with `os.replace`, so an
interrupted sweep never leaves a half-written record or table.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from pathlib import Path
from typing import Any

from dabench_ir.sweep.spec import spec_params

__all__ = [
    "METRIC_COLUMNS",
    "atomic_write",
    "columns",
    "dominant_bound",
    "encode_point",
    "file_stamp",
    "point_file",
    "read_point",
    "record_row",
    "remove_temps",
    "strip_nodes",
    "valid_record",
    "write_point",
    "write_table",
]

logger = logging.getLogger(__name__)

_LABELS = ("fits", "failure_reason", "dominant_bound", "node_bound", "roofline_bound", "execution_mode")
"""The placement's labels and flags, together in `METRIC_COLUMNS` after the figures of the step."""

METRIC_COLUMNS = (
    "status",
    "error",
    "time_s",
    "throughput_samples_per_s",
    "achieved_tflops",
    "flops",
    "bytes",
    "compute_efficiency",
    "allocation_ratio",
    "load_imbalance",
    *_LABELS,
    "memory_onchip",
    "memory_offchip",
    "params_count",
    "nodes",
    "units",
    "seconds",
)
"""Columns after the point's parameters, in order."""

LABEL_COLUMNS = ("status", "error", *_LABELS)
"""The columns of `METRIC_COLUMNS` that hold a label or a flag, not a number."""


def atomic_write(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a unique temporary file and os.replace (`dabench_ir.fileio`)."""
    from dabench_ir.fileio import write_output

    return write_output(path, data)


def encode_point(record: dict[str, Any]) -> str:
    """A point's record as compact JSON (`report.model.json_text`: one pass, NaN and infinity as
    null). The record is not copied: a row built from it (`record_row`) reads a non-finite
    figure as the null its file holds."""
    from dabench_ir.report.model import json_text

    return json_text(record)


def strip_nodes(record: dict[str, Any]) -> None:
    """Drop the report's per-node rows (a sweep's ``--no-node-detail``), keeping the bounds they
    give in ``metrics`` (``dominant_bound``, ``node_bound``); the record says so (``node_detail``
    false), so a later sweep that wants the rows runs the point again."""
    record["node_detail"] = False
    report = record.get("report")
    if report and report.get("nodes"):
        kept = report.setdefault("metrics", {})
        kept["dominant_bound"], kept["node_bound"] = _bounds(report)
        report["nodes"] = []


def point_file(folder: Path, key: str) -> Path:
    """Where the record of point ``key`` is kept in a sweep's ``points/`` folder."""
    return folder / f"{key}.json"


def file_stamp(folder: Path, key: str) -> tuple[int, int] | None:
    """Which file holds point ``key``'s record now (inode, modification time), or None when none does:
    every write replaces the file (`atomic_write`), so a changed stamp is a record written since."""
    try:
        st = point_file(folder, key).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def remove_temps(folder: Path, key: str) -> None:
    """Remove the temporary files a killed writer left of point ``key``'s record (``.<key>.json.*.tmp``,
    as `dabench_ir.fileio.write_with` names them; a kill -9 gives it no chance to). For the holder of
    the point's lock only: nothing else writes that record, so no live write's file is touched."""
    for path in folder.glob(f".{point_file(folder, key).name}.*.tmp"):
        try:
            path.unlink()
        except OSError as exc:
            logger.debug("cannot remove %s: %s", path, exc)


def write_point(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Write one point's record as ``folder/<key>.json`` (compact JSON, atomically); returns its
    table row (`record_row`)."""
    atomic_write(point_file(folder, record["key"]), encode_point(record))
    return record_row(record)


def read_point(folder: Path, key: str) -> dict[str, Any] | None:
    """A point's record, or None when absent, unreadable or not a record of this point (a
    broken file counts as not done, and is computed again)."""
    path = point_file(folder, key)
    try:
        if not path.is_file():
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return record if valid_record(record, key) else None


def valid_record(record: Any, key: str | None = None) -> bool:
    """True for a point record as `write_point` writes it: the right key, its params, a status
    of ok (with a report object) or error (with a message), numbers where numbers go."""
    if not isinstance(record, dict) or not isinstance(record.get("params"), dict):
        return False
    if not isinstance(record.get("key"), str) or (key is not None and record["key"] != key):
        return False
    status, report = record.get("status"), record.get("report")
    if status == "ok":
        if not isinstance(report, dict):
            return False
    elif status == "error":
        if not isinstance(record.get("error"), (str, type(None))) or not isinstance(report, (dict, type(None))):
            return False
    else:
        return False
    seconds = record.get("seconds")
    if seconds is not None and (not isinstance(seconds, (int, float)) or isinstance(seconds, bool)):
        return False
    if report:
        for table in ("totals", "metrics", "model", "failure"):
            if not isinstance(report.get(table) or {}, dict):
                return False
        if not isinstance(report.get("nodes") or [], list) or not isinstance(report.get("units") or [], list):
            return False
        if not all(isinstance(n, dict) for n in report.get("nodes") or []):
            return False
        numbers = {**(report.get("totals") or {}), **(report.get("metrics") or {})}
        for name in (
            "time_s",
            "throughput_samples_per_s",
            "achieved_flops_per_s",
            "compute_efficiency",
            "allocation_ratio",
            "load_imbalance",
        ):
            value = numbers.get(name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                return False
    return True


def dominant_bound(report: dict[str, Any], *, nodes_only: bool = False) -> str | None:
    """The bound class (compute, memory, communication, ...) holding the largest share of time.

    A multi-chip point's comes from the scaling stage (communication counted); any other's from
    its node times and overhead rows, the rule every table uses (`report.attribution`). With
    ``nodes_only``, the class of the node work alone (overhead rows left out: the roofline class
    of the operators, whatever the host or a pipeline drain adds). A report kept without its node
    rows (a sweep's ``node_detail=False``) gives what was stored in its metrics before.
    """
    step, nodes = _bounds(report)
    return nodes if nodes_only else step


def _bounds(report: dict[str, Any]) -> tuple[str | None, str | None]:
    """`dominant_bound` of ``report``, and with ``nodes_only``: both from one pass over its node rows
    (a record's row asks both; each was a pass of its own)."""
    from dabench_ir.report.attribution import bound_times, dominant_of_shares, shares_of_times

    metrics = report.get("metrics") or {}
    nodes = report.get("nodes") or []
    if not nodes:
        return metrics.get("dominant_bound"), metrics.get("node_bound")
    times = bound_times(nodes)
    node_bound = dominant_of_shares(shares_of_times(times))[0] or metrics.get("node_bound")
    if (report.get("extra") or {}).get("scale"):
        return metrics.get("dominant_bound"), node_bound
    step_bound = dominant_of_shares(shares_of_times(times, report.get("overheads")))[0]
    return step_bound or metrics.get("dominant_bound"), node_bound


def _num(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else None


def _chosen(report: dict[str, Any], knob: str) -> Any:
    """The value a lowering chose for a knob left to it (``--wse-mode auto``: pipelined or streaming)."""
    entry = (((report.get("config") or {}).get("run") or {}).get("knobs") or {}).get(knob) or {}
    return entry.get("chosen")


def _memory_use(metrics: dict[str, Any], level: str) -> float | None:
    """The fullest memory of one level (on-chip: the shared SRAM; off-chip: the global DRAM), as a
    share of its capacity; None when the target has none at that level."""
    uses = [u.get("fraction") for u in (metrics.get("memory_use") or {}).values() if u.get("level") == level]
    return max((u for u in uses if u is not None), default=None)


def record_row(record: dict[str, Any]) -> dict[str, Any]:
    """One table row: the point's parameters, then the report's totals and metrics; a NaN or
    infinity is null there, as in the point's file (`encode_point`)."""
    row: dict[str, Any] = {"key": record["key"], **record["params"]}
    report = record.get("report") or {}
    totals = report.get("totals") or {}
    metrics = report.get("metrics") or {}
    failure = report.get("failure") or {}
    achieved = totals.get("achieved_flops_per_s")
    step_bound, node_bound = _bounds(report) if report else (None, None)
    row.update(
        {
            "status": record.get("status"),
            "error": record.get("error"),
            "time_s": totals.get("time_s"),
            "throughput_samples_per_s": totals.get("throughput_samples_per_s"),
            "achieved_tflops": achieved / 1e12 if achieved is not None else None,
            "flops": totals.get("flops"),
            "bytes": totals.get("bytes"),
            "compute_efficiency": metrics.get("compute_efficiency"),
            "allocation_ratio": metrics.get("allocation_ratio"),
            "load_imbalance": metrics.get("load_imbalance"),
            "fits": report.get("fits") if report else None,
            "failure_reason": failure.get("reason"),
            "dominant_bound": step_bound,
            "node_bound": node_bound,
            "roofline_bound": metrics.get("roofline_bound"),
            "execution_mode": _chosen(report, "wse_mode"),
            "memory_onchip": _memory_use(metrics, "on-chip"),
            "memory_offchip": _memory_use(metrics, "off-chip"),
            "params_count": (report.get("model") or {}).get("params"),
            "nodes": (report.get("model") or {}).get("nodes"),
            "units": len(report.get("units") or []) if report else None,
            "seconds": record.get("seconds"),
        }
    )
    return {k: _num(v) for k, v in row.items()}


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """Column order: key, the parameters in their declared order, then the metric columns."""
    present = {k for r in rows for k in r}
    params = [p for p in spec_params() if p in present]
    extra = sorted(present - {"key", *params, *METRIC_COLUMNS})
    return ["key", *params, *extra, *METRIC_COLUMNS]


TABLE_FILES = ("results.csv", "results.parquet")
"""The table files a sweep writes into its folder (the parquet one when pyarrow is installed)."""


def write_table(folder: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Write ``results.csv`` (always) and ``results.parquet`` (when pyarrow is installed)."""
    cols = columns(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in cols})
    csv_name, parquet_name = TABLE_FILES
    written = [atomic_write(folder / csv_name, buf.getvalue())]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        logger.info("pyarrow is not installed: no results.parquet")
        return written
    table = pa.Table.from_pylist([{k: r.get(k) for k in cols} for r in rows])
    from dabench_ir.fileio import write_with

    path = folder / parquet_name
    written.append(write_with(path, lambda fh: pq.write_table(table, fh), binary=True))
    return written
