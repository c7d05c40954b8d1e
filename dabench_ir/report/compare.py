"""Reports side by side: one row per report (model, target, time, metrics, dominant bound, GOP/s/W).

`compare_reports` takes Report objects or their JSON dicts (schema dabench-ir/report/v1)
and returns plain dict rows; `render_compare` prints them, `write_compare_csv` /
`write_compare_json` save them. The rows are the same whatever the input came from.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError

from .attribution import dominant_bound
from .model import SCHEMA, Report
from .table import human, percent, seconds

__all__ = [
    "COMPARE_COLUMNS",
    "LABEL_FIELDS",
    "PERIOD_NOTE",
    "PER_CHIP_NOTE",
    "compare_reports",
    "cost_only_note",
    "dominant_bound",
    "estimated_warnings",
    "format_row",
    "is_cost_only",
    "is_period",
    "load_report_json",
    "model_name",
    "render_compare",
    "write_compare_csv",
    "write_compare_json",
]

logger = logging.getLogger(__name__)

COMPARE_COLUMNS = (
    "label",
    "model",
    "target",
    "kind",
    "opt_level",
    "wse_mode",
    "precision",
    "mode",
    "batch",
    "seq",
    "chips",
    "strategy",
    "pipeline",
    "time_s",
    "latency_s",
    "throughput_samples_per_s",
    "achieved_flops_per_s",
    "allocation_ratio",
    "load_imbalance",
    "compute_efficiency",
    "fits",
    "dominant_bound",
    "dominant_bound_share",
    "power_w",
    "gops_per_w",
    "measured_time_s",
    "failure",
    "fits_with",
    "estimated_nodes",
    "estimated_time_share",
    "unattributed_nodes",
    "node_nm",
    "normalized_to_nm",
    "achieved_gops_normalized",
    "gops_per_w_normalized",
)
"""Keys of every compare row, in table, CSV and JSON order."""


def load_report_json(path: str | Path) -> dict[str, Any]:
    """Read a report JSON written by ``profile --json``; anything else is a one-line UserError."""
    from dabench_ir.fileio import read_text_file
    from dabench_ir.report.model import check_report_dict

    path = Path(path)
    try:
        text = read_text_file(path)  # a FIFO, folder or binary file is refused here
    except UserError as exc:
        raise UserError(f"cannot read report {exc}") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply; give files written by profile --json") from None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path} is not JSON ({exc.msg} at line {exc.lineno}); give files written by profile --json"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UserError(
            f"{path} is not a dabench-ir report (schema {found!r}, expected {SCHEMA!r}); write one with profile --json"
        )
    check_report_dict(data, str(path))  # the fields every report has, and their types
    _check_read_back(data, path)
    data.setdefault("_source", str(path))
    return data


def model_differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """How two reports' models differ, in words ([] for one model before and after a change):
    family, preset, layers, batch or sequence length (a step's work differs), or not one node name
    or module scope in common."""
    out = []
    fields = (("model", "family"), ("model", "preset"), ("model", "layers"), ("config", "batch"), ("config", "seq"))
    for table, key in fields:
        a, b = (before.get(table) or {}).get(key), (after.get(table) or {}).get(key)
        if a is not None and b is not None and a != b:
            out.append(f"{key} {a} vs {b}")

    def keys(report: Mapping[str, Any]) -> set[str]:
        nodes = report.get("nodes") or []
        return {n["name"] for n in nodes} | {f"scope:{n['scope']}" for n in nodes if n.get("scope")}

    if before.get("nodes") and after.get("nodes") and not keys(before) & keys(after):
        out.append("not one node name or module scope in common")
    return out


_NON_NEGATIVE = ("_s", "flops", "bytes", "_j", "intensity", "_ops")
"""A report number whose name ends so (a time, a rate, FLOPs, bytes, energy) is never negative."""


def _check_read_back(data: Mapping[str, Any], path: Path) -> None:
    """What `check_report_dict` leaves to the reader: the target named, every node named once,
    no negative time, rate, count or energy (a hand-edited report)."""

    def bad(what: str) -> UserError:
        return UserError(f"{path}: {what}; give a report written by profile --json")

    target = data.get("target")  # null: a cost-only report (written without --target)
    if target is not None and (not isinstance(target, Mapping) or not target.get("name")):
        raise bad("target has no 'name'")
    tables = [("totals", data.get("totals") or {}), ("metrics", data.get("metrics") or {})]
    names: set[str] = set()
    for i, node in enumerate(data.get("nodes") or []):
        name = node.get("name")
        if not isinstance(name, str) or not name:
            raise bad(f"node #{i} has no 'name'")
        if name in names:
            raise bad(f"node {name!r} is listed twice")
        names.add(name)
        tables.append((f"node {name!r}", node))
    for label, table in tables:
        for key, value in table.items():
            if key.endswith(_NON_NEGATIVE) and _is_real(value) and value < 0:
                raise bad(f"{label} {key} = {value!r} is negative")


def is_cost_only(report: Mapping[str, Any]) -> bool:
    """Whether a report (or a compare row) was written without a target: FLOPs and bytes, no times."""
    target = report.get("target")
    return not (target.get("name") if isinstance(target, Mapping) else target)


def cost_only_note(label: str, flops: float | None, nbytes: float | None) -> str:
    """The line that says a cost-only side has no times: what it has instead."""
    return (
        f"{label}: cost only (written without --target): {human(flops, 'FLOP')}, {human(nbytes, 'B')}; "
        "no times to compare (profile it with --target for them)"
    )


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _power_w(data: Mapping[str, Any], target_obj: Any, powers: Mapping[str, float | None]) -> float | None:
    """The power of every device the run uses, as its global FLOP/s (``totals``) are of all of them: from
    the report itself (its totals; a multi-chip report's ``metrics`` are one chip's), the live Target,
    the figures the caller handed (``powers``: the host CPU's, from its calibration), or the built-in
    target loaded by name."""
    for section in ("totals", "metrics", "extra"):
        value = (data.get(section) or {}).get("target_power_w")
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    if target_obj is not None:
        watts = getattr(target_obj, "watts", None)
        return float(watts) if watts else None
    name = (data.get("target") or {}).get("name")
    if not name:
        return None
    if name in powers:
        return powers[name]
    from dabench_ir.targets import is_host, load_target

    if is_host(name):  # the host's figure is measured, not rendered here: none was handed
        return None
    try:
        return float(load_target(name).watts) or None
    except Exception as exc:
        logger.info("no power figure for target %s: %s", name, exc)
        return None


LABEL_FIELDS = ("target", "opt_level", "wse_mode", "precision", "mode", "batch", "seq", "chips", "pipeline")
"""What a compare/diff row's label says beside the model, when it differs between the rows."""


def model_name(data: Mapping[str, Any]) -> str:
    model = data.get("model") or {}
    return str(model.get("preset") or model.get("name") or Path(str(model.get("path") or "model")).stem)


def _label(row: Mapping[str, Any], varying: Sequence[str]) -> str:
    """``model@target`` and, for each field in ``varying`` but the target, its value (O0, fp16, b8, ...)."""
    parts = [f"{row.get('_model_name')}@{row.get('target') or 'cost-only'}"]
    for key in varying:
        value = row.get(key)
        if key == "target" or value is None:
            continue
        if key == "chips":
            value = f"x{value}" + (f" {row['strategy']}" if row.get("strategy") else "")
        prefix = {"batch": "b", "seq": "seq", "pipeline": "pipeline="}.get(key, "")
        parts.append(f"{prefix}{value}")
    return " ".join(parts)


def label_rows(rows: Sequence[dict[str, Any]]) -> None:
    """Set each row's ``label``: the model and target, plus every `LABEL_FIELDS` value that differs."""
    varying = [k for k in LABEL_FIELDS if len({repr(r.get(k)) for r in rows}) > 1]
    for row in rows:
        row["label"] = _label(row, varying)


def _row(data: Mapping[str, Any], target_obj: Any, powers: Mapping[str, float | None]) -> dict[str, Any]:
    totals, metrics, config = data.get("totals") or {}, data.get("metrics") or {}, data.get("config") or {}
    model, target = data.get("model") or {}, data.get("target") or {}
    bound, share = dominant_bound(data.get("nodes") or [], data.get("overheads"))  # one rule: report.attribution
    achieved = totals.get("achieved_flops_per_s")
    power = _power_w(data, target_obj, powers)
    chips = int(config.get("chips") or 1)
    failure = data.get("failure")
    kind = target.get("kind")
    extra = data.get("extra") or {}
    return {
        "label": None,
        "_model_name": model_name(data),
        "model": model.get("preset") or model.get("name") or model.get("path"),
        "target": target.get("name"),
        "kind": kind,
        "opt_level": config.get("opt_level") if kind == "rdu" else None,
        "wse_mode": config.get("wse_mode") if kind == "wse" else None,
        "precision": config.get("precision"),
        "mode": config.get("mode"),
        "batch": config.get("batch"),
        "seq": config.get("seq"),
        "chips": chips,
        "strategy": config.get("strategy") if chips > 1 else None,
        "pipeline": extra.get("pipeline") or "none",
        "time_s": totals.get("time_s"),
        "latency_s": totals.get("latency_s"),  # one step alone: above time_s where a pipeline overlaps steps
        "throughput_samples_per_s": totals.get("throughput_samples_per_s"),
        "achieved_flops_per_s": achieved,
        "allocation_ratio": metrics.get("allocation_ratio"),
        "load_imbalance": metrics.get("load_imbalance"),
        "compute_efficiency": metrics.get("compute_efficiency"),
        "fits": data.get("fits"),
        "dominant_bound": bound,
        "dominant_bound_share": share,
        "power_w": power,
        "gops_per_w": achieved / power / 1e9 if achieved and power and data.get("fits") is not False else None,
        "measured_time_s": totals.get("measured_time_s"),
        "failure": (failure or {}).get("reason") if isinstance(failure, Mapping) else failure,
        "fits_with": _fits_with(data),
        "estimated_nodes": int(totals.get("estimated_nodes") or 0),
        "estimated_time_share": totals.get("estimated_time_share"),
        "unattributed_nodes": int(totals.get("unattributed_nodes") or 0),
        "_estimated_ops": sorted({str(e.get("op_type")) for e in extra.get("estimated") or []}),
        "_flops": totals.get("flops"),
        "_bytes": totals.get("bytes"),
        "_source": data.get("_source"),
        **dict.fromkeys(("node_nm", "normalized_to_nm", "achieved_gops_normalized", "gops_per_w_normalized")),
    }


def _fits_with(data: Mapping[str, Any]) -> str | None:
    """The change the report's fitting search found to make it fit (its why lines' "(fit)" line), as
    flags ("--ipus 55"); None when it fits, was not searched, or nothing fits."""
    from dabench_ir.options import KNOBS
    from dabench_ir.report.why import change_text

    fit = next((w for w in data.get("why") or [] if w.get("role") == "(fit)"), None)
    value = fit.get("value") if fit else None
    return change_text((KNOBS[name], v) for name, v in value.items()) if value else None


def add_normalised(rows: Sequence[dict[str, Any]], to_nm: float, rule: str = "post-dennard") -> None:
    """Add achieved GOP/s and GOP/s/W as if each target were built at ``to_nm`` (docs/energy.md).

    Rows whose target's process node is unknown (the host CPU, a cost-only report) get None.
    """
    from dabench_ir.energy import normalize

    for row in rows:
        node = _node_nm(row.get("target"))
        achieved = row.get("achieved_flops_per_s")
        norm = (
            normalize(achieved / 1e9 if achieved else None, row.get("gops_per_w"), node, to_nm, rule=rule)
            if node
            else {}
        )
        row["normalized_to_nm"] = to_nm
        row["node_nm"] = node
        row["achieved_gops_normalized"] = norm.get("gops")
        row["gops_per_w_normalized"] = norm.get("gops_per_w")


def _node_nm(target_name: Any) -> float | None:
    from dabench_ir.targets import is_host, load_target

    if not target_name or is_host(target_name):
        return None
    try:
        return float(load_target(str(target_name)).node_nm)
    except Exception as exc:
        logger.info("no process node for target %s: %s", target_name, exc)
        return None


def compare_reports(
    reports: Sequence[Report | Mapping[str, Any]],
    *,
    powers: Mapping[str, float | None] | None = None,
    fitting_first: bool = True,
) -> list[dict[str, Any]]:
    """One row per report (keys: `COMPARE_COLUMNS`), in the order given, those that do not fit last
    (``fitting_first`` False: in the order given, for a caller that reads rows by position).

    ``powers``: target name -> watts for report dicts that carry no power figure and name a target
    that is not built in: the host CPU's, from its cached calibration
    (`dabench_ir.execute.calibrate.host_powers`, which the commands call before rendering).
    """
    powers = powers or {}
    rows = []
    for rep in reports:
        if isinstance(rep, Report):
            rows.append(_row(rep.to_dict(), rep.target_obj, powers))
        elif isinstance(rep, Mapping):
            rows.append(_row(rep, None, powers))
        else:
            raise TypeError(f"compare_reports takes Report objects or report dicts, not {type(rep).__name__}")
    label_rows(rows)
    if not fitting_first:
        return rows
    return sorted(rows, key=lambda r: r.get("fits") is False)  # in the order given; points that do not fit last


def estimated_warnings(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per row whose report has nodes without a cost rule (estimated or unattributed)."""
    out = []
    for row in rows:
        est, un = row.get("estimated_nodes") or 0, row.get("unattributed_nodes") or 0
        if not est and not un:
            continue
        share = row.get("estimated_time_share")
        what = f"{est} node(s) without a cost rule (estimated: no rule"
        what += f", {percent(share)} of node time)" if share is not None else ")"
        if row.get("_estimated_ops"):
            what += ": " + ", ".join(row["_estimated_ops"])
        if un:
            what += f"; {un} unattributed (zero time)"
        out.append(f"warning: {row.get('label')}: {what}; its time is a lower bound")
    return out


def _num(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


PERIOD_NOTE = (
    "(period): the steady-state period of a pipeline whose consecutive steps overlap (one step alone takes "
    "longer: latency_s); the other times are one whole step"
)


def is_period(row: Mapping[str, Any]) -> bool:
    """Whether the row's time is a pipeline's steady-state period, shorter than one step alone."""
    time_s, latency_s = row.get("time_s"), row.get("latency_s")
    return time_s is not None and latency_s is not None and latency_s > time_s * (1 + 1e-9)


PER_CHIP_NOTE = (
    "/chip: one chip's placement of a multi-chip run (its allocation, load imbalance, efficiency); its "
    "time, throughput, FLOP/s and power are the whole step's, every chip together"
)


def per_chip(row: Mapping[str, Any]) -> bool:
    """Whether the row is a multi-chip run, whose allocation, load imbalance and efficiency are one chip's."""
    return int(row.get("chips") or 1) > 1


def format_row(row: Mapping[str, Any]) -> dict[str, str]:
    """Display strings for one compare row (shared by the terminal table and the HTML page)."""
    fits = row.get("fits")
    bound = row.get("dominant_bound")
    chip = " /chip" if per_chip(row) else ""
    return {
        "model": str(row.get("model") or "-"),
        "target": str(row.get("target") or "-"),
        "run": " ".join(row["label"].split(" ")[1:]) if row.get("label") and " " in row["label"] else "-",
        "time": seconds(row.get("time_s")) + (" (period)" if is_period(row) else ""),
        "throughput": ("does not fit" if fits is False else "-")
        if row.get("throughput_samples_per_s") is None
        else human(row["throughput_samples_per_s"], "samples/s"),
        "FLOP/s": human(row.get("achieved_flops_per_s"), "FLOP/s"),
        "alloc": percent(row.get("allocation_ratio")) + chip,
        "LI": _num(row.get("load_imbalance")) + chip,
        "eff": percent(row.get("compute_efficiency")) + chip,
        "fits": "-" if fits is None else ("yes" if fits else "NO"),
        "dominant bound": "-" if bound is None else f"{bound} ({percent(row.get('dominant_bound_share'))})",
        "GOP/s/W": _num(row.get("gops_per_w")),
        "no rule": (
            "-"
            if not row.get("estimated_nodes")
            else f"{row['estimated_nodes']} ({percent(row.get('estimated_time_share'))})"
        ),
        **(
            {f"GOP/s/W @{row['normalized_to_nm']:g}nm": _num(row.get("gops_per_w_normalized"))}
            if row.get("normalized_to_nm")
            else {}
        ),
    }


def render_compare(rows: Sequence[Mapping[str, Any]]) -> str:
    """The compare rows as an aligned plain-text table."""
    if not rows:
        return "no reports to compare"
    cells = [format_row(r) for r in rows]
    headers = list(cells[0])
    widths = {h: max(len(h), *(len(c[h]) for c in cells)) for h in headers}
    left = {"model", "target", "run", "fits", "dominant bound"}

    def line(values: Mapping[str, str]) -> str:
        return "  ".join(
            values[h].ljust(widths[h]) if h in left else values[h].rjust(widths[h]) for h in headers
        ).rstrip()

    out = [line({h: h for h in headers}), line({h: "-" * widths[h] for h in headers})]
    out += [line(c) for c in cells]
    if any(is_period(r) for r in rows):
        out.append(PERIOD_NOTE)
    if any(per_chip(r) for r in rows):
        out.append(PER_CHIP_NOTE)
    out += [cost_only_note(str(r.get("label")), r.get("_flops"), r.get("_bytes")) for r in rows if is_cost_only(r)]
    failures = [r for r in rows if r.get("failure")]
    for r in failures:
        fix = f"; {r['fits_with']} makes it fit" if r.get("fits_with") else ""
        out.append(f"{r.get('target')}: does not fit: {r['failure']}{fix}")
    return "\n".join(out)


def write_compare_csv(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """One CSV line per compare row, columns `COMPARE_COLUMNS` (empty cell for None)."""
    from dabench_ir.fileio import write_with
    from dabench_ir.report.model import csv_cell

    def write(fh: Any) -> None:
        writer = csv.DictWriter(fh, fieldnames=list(COMPARE_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: csv_cell(row.get(k)) for k in COMPARE_COLUMNS})

    return write_with(path, write)


def write_compare_json(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """``{"schema": "dabench-ir/compare/v1", "rows": [...]}`` (NaN and infinity become null)."""

    from dabench_ir.fileio import write_output
    from dabench_ir.report.model import json_text

    doc = {"schema": "dabench-ir/compare/v1", "rows": [{k: r.get(k) for k in COMPARE_COLUMNS} for r in rows]}
    return write_output(path, json_text(doc, indent=1) + "\n")
