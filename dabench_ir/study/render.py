"""A study (or a diff) as a terminal table, CSV, JSON (schema-checked) and a self-contained HTML page."""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from dabench_ir.report.table import human, percent_change, seconds, times

from .diff import NODE_COLUMNS

__all__ = [
    "render_study",
    "split_table",
    "study_schema",
    "summary_table",
    "validate_study",
    "write_study_csv",
    "write_study_html",
    "write_study_json",
]

_CHANGED = ("fused", "replaced", "added", "removed", "folded")


def _t(x: Any) -> str:
    """A time; a negative one (a step residual where node times overlap) with its sign."""
    return "-" if x is None else "-" + seconds(-x) if x < 0 else seconds(x)


def _module_cells(m: dict[str, Any]) -> list[str]:
    """One module row of a study run, as the terminal and the HTML tables show it."""
    return [
        m["module"],
        str(m["nodes_before"]),
        str(m["nodes_after"]),
        _t(m["time_before_s"]),
        _t(m["time_after_s"]),
        percent_change(m["time_before_s"], m["time_after_s"]),
    ]


def _dt(x: Any) -> str:
    """A signed time change (``-744 µs``)."""
    if x is None:
        return "-"
    return ("-" if x < 0 else "+") + seconds(abs(x)) if x else "0 ns"


def _x(x: Any) -> str:
    return times(x)


OVERLAP_NOTE = (
    "node times overlap (a pipelined step runs its kernels at once): their sum is not the step, "
    "so no part has a share of the change and node time has no speedup of its own"
)
"""The line under a split whose node times overlap on a side (`diff.speedup_split`)."""


def _node_speedup(totals: Mapping[str, Any]) -> str:
    """The ``node time x`` cell: the ratio, or ``overlap`` where node times overlap (no ratio of the step)."""
    return "overlap" if totals.get("node_times_overlap") else _x(totals.get("speedup_nodes"))


def _overhead_speedup(totals: Mapping[str, Any]) -> str:
    """The ``overheads x`` cell: the ratio, or the times themselves where a side has none (``0 -> 13.4 ms``)."""
    ratio = totals.get("speedup_overheads")
    before, after = totals.get("overhead_time_before_s"), totals.get("overhead_time_after_s")
    if ratio is None and before is not None and after is not None and (not before) != (not after):
        return f"{_t(before) if before else '0'} -> {_t(after) if after else '0'}"
    return _x(ratio)


def _split_rows(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The run's split parts (node time, overhead rows, residual); [] for a run written without them."""
    return list(run.get("split") or [])


def _overhead_rows(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The split's overhead and residual parts that either side has (rows of the per-node tables)."""
    return [p for p in _split_rows(run) if p["kind"] != "nodes" and (p["before_s"] or p["after_s"])]


def split_table(run: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the run's speedup split, with a total line the parts add up to."""
    t = run["totals"]
    cells = [
        [
            p["part"] if p["kind"] == "nodes" else f"overhead: {p['part']}" if p["kind"] == "overhead" else p["part"],
            _t(p["before_s"]),
            _t(p["after_s"]),
            _dt(p["delta_s"]),
            "-" if p["change_share"] is None else f"{100 * p['change_share']:.1f}%",
            _x(p["speedup_alone"]),
        ]
        for p in _split_rows(run)
    ]
    delta = None if t["time_before_s"] is None or t["time_after_s"] is None else t["time_after_s"] - t["time_before_s"]
    cells.append(
        [
            "step (total)",
            _t(t["time_before_s"]),
            _t(t["time_after_s"]),
            _dt(delta),
            "100.0%" if any(p["change_share"] is not None for p in _split_rows(run)) else "-",
            _x(t.get("speedup_total", t.get("speedup"))),
        ]
    )
    return ["part", "before", "after", "delta", "share of change", "speedup alone"], cells


def _changed_rows(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Node rows that changed: fused/added/removed, or kept with a different time or bound."""
    out = []
    for r in run["nodes"]:
        moved = r["time_before_s"] != r["time_after_s"] or r["bound_before"] != r["bound_after"]
        if r["status"] in _CHANGED or moved:
            out.append(r)
    return sorted(out, key=lambda r: -abs((r["time_before_s"] or 0) - (r["time_after_s"] or 0)))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def summary_table(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and one row per run: the total change against its baseline (text and HTML)."""
    rows = []
    for run in doc["runs"]:
        t = run["totals"]
        speed = t.get("speedup")
        rows.append(
            [
                run["label"],
                _t(t["time_before_s"]),
                _t(t["time_after_s"]),
                times(speed),
                _node_speedup(t),
                _overhead_speedup(t),
                percent_change(t["flops_before"], t["flops_after"]),
                percent_change(t["bytes_before"], t["bytes_after"]),
                f"{t['nodes_before']} -> {t['nodes_after']}",
                f"{t['nodes_fused']}/{t['nodes_added']}/{t['nodes_removed'] + t['nodes_folded']}",
                str(t["bound_changes"]),
                f"{t['estimated_before']}/{t['estimated_after']}",
            ]
        )
    headers = [
        "run",
        "time before",
        "after",
        "speedup",
        "node time x",
        "overheads x",
        "FLOPs",
        "bytes",
        "nodes",
        "fused/added/gone",
        "bound chg",
        "no rule b/a",
    ]
    return headers, rows


def render_study(doc: Mapping[str, Any], *, top: int = 12) -> str:
    """Per run: the total change, the nodes that changed most, and the modules."""
    out: list[str] = [
        f"dabench-ir {doc.get('command', 'study')}: {doc.get('model')} (baseline: {doc.get('baseline', 'none')})",
        "",
    ]
    out += _table(*summary_table(doc))
    for run in doc["runs"]:
        out += ["", f"{run['label']}  vs  {run['baseline_label']}"]
        out += [f"  {w}" for w in run.get("warnings", [])]
        if run.get("mlir"):
            out += ["  " + line for line in _mlir_lines(run["mlir"], top)] + [""]
        if _split_rows(run):
            head, split = split_table(run)
            out += ["  " + line for line in _table(head, split)]
            out += [f"  {OVERLAP_NOTE}"] if run["totals"].get("node_times_overlap") else []
            out += [""]
        rows = _changed_rows(run)
        extra = [
            [
                "(overhead)" if p["kind"] == "overhead" else "(residual)",
                p["part"],
                p["kind"],
                "-",
                _t(p["before_s"]),
                _t(p["after_s"]),
                "overhead -> overhead",
                "-",
            ]
            for p in _overhead_rows(run)
        ]
        if not rows and not extra:
            out.append("  no node changed")
            continue
        cells = []
        for r in rows[:top]:
            replaces = ", ".join(r["replaces"][:3]) + (f" +{len(r['replaces']) - 3}" if len(r["replaces"]) > 3 else "")
            cells.append(
                [
                    r["node"] or "(gone)",
                    str(r["op"]),
                    r["status"],
                    replaces or "-",
                    _t(r["time_before_s"]),
                    _t(r["time_after_s"]),
                    f"{r['bound_before'] or '-'} -> {r['bound_after'] or '-'}",
                    human(r["bytes_before"], "B") + " -> " + human(r["bytes_after"], "B"),
                ]
            )
        out += [
            "  " + line
            for line in _table(
                ["node", "op", "status", "replaces", "before", "after", "bound", "bytes"], cells + extra, left=4
            )
        ]
        if len(rows) > top:
            out.append(f"  ... and {len(rows) - top} more changed nodes (see --csv/--json)")
        mods = [_module_cells(m) for m in run["modules"][:top]]
        out += [
            "",
            *(
                "  " + line
                for line in _table(["module", "nodes before", "after", "time before", "after", "change"], mods)
            ),
        ]
    for cmp in doc.get("mlir_vs_onnx") or []:
        out += ["", *_agreement_lines(cmp, top)]
    return "\n".join(out)


def _delta(v: Any, d: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    text = human(v, unit) if unit else str(v)
    return text if not d else f"{text} ({'+' if d > 0 else '-'}{human(abs(d), unit) if unit else abs(d)})"


def pass_table(before: Any, steps: Sequence[Any]) -> str:
    """The per-pass table of an MLIR pipeline (`ModuleCost` before, `PassStep`s), e.g. up to a failed pass."""
    prev, rows = before, []
    for s in steps:
        rows.append(s.to_dict(prev))
        prev = s.cost
    return "\n".join(_pass_lines(before.to_dict(), rows))


_PASS_HEADERS = [
    "pass",
    "s",
    "ops",
    "linalg",
    "FLOPs",
    "read",
    "written",
    "intermediates",
    "buffers",
    "kept/created/fused/removed",
]


def _pass_cells(before: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The per-pass table's rows: the module as lowered, then each pass (value after, change in brackets)."""

    def cells(name: str, a: Mapping[str, Any], d: Mapping[str, Any], did: str, secs: str) -> list[str]:
        buf = "-" if a["buffers"] is None else f"{a['buffers']} / {human(a['buffer_bytes'], 'B')}"
        return [
            name,
            secs,
            _delta(a["ops"], d.get("ops")),
            _delta(a["linalg_ops"], d.get("linalg_ops")),
            _delta(a["flops"], d.get("flops"), "FLOP"),
            _delta(a["bytes_read"], d.get("bytes_read"), "B"),
            _delta(a["bytes_written"], d.get("bytes_written"), "B"),
            f"{_delta(a['intermediates'], d.get('intermediates'))} / {human(a['intermediate_bytes'], 'B')}",
            buf,
            did,
        ]

    rows = [cells("(as lowered)", before, {}, "-", "-")]
    return rows + [
        cells(
            s["pass"],
            s["after"],
            s["delta"],
            f"{s['kept']}/{s['created']}/{s['fused_away']}/{s['removed']}",
            f"{s['seconds']:.3f}",
        )
        for s in steps
    ]


def _pass_lines(before: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> list[str]:
    return _table(_PASS_HEADERS, _pass_cells(before, steps))


_MLIR_NODE_HEADERS = ["node", "op", "ops", "FLOPs", "bytes", "split with"]
_MLIR_NODE_NOTE = "per ONNX node (a fused op's cost split by what its ops held before, node by node; docs/mlir.md):"


def _mlir_node_cells(rec: Mapping[str, Any], top: int, *, cap: int = 3) -> list[list[str]]:
    """Per ONNX node before -> after the pipeline, the largest byte changes first."""
    rows = sorted(rec["nodes"], key=lambda r: -abs(r["bytes_before"] - r["bytes_after"]))[:top]

    def others(names: Sequence[str]) -> str:
        return (", ".join(names[:cap]) + (f" +{len(names) - cap}" if len(names) > cap else "")) or "-"

    return [
        [
            r["node"],
            str(r["op"] or "-"),
            f"{r['ops_before']} -> {r['ops_after']}",
            human(r["flops_before"], "FLOP") + " -> " + human(r["flops_after"], "FLOP"),
            human(r["bytes_before"], "B") + " -> " + human(r["bytes_after"], "B"),
            others(r["shared_with"]),
        ]
        for r in rows
    ]


def _module_where(rec: Mapping[str, Any]) -> str:
    return rec["module"] or "the module is written with -o DIR"


def _mlir_lines(rec: Mapping[str, Any], top: int) -> list[str]:
    out = [f"MLIR passes ({_module_where(rec)}):", *_pass_lines(rec["before"], rec["steps"]), "", _MLIR_NODE_NOTE]
    return out + _table(_MLIR_NODE_HEADERS, _mlir_node_cells(rec, top), left=2)


def _agreement_title(cmp: Mapping[str, Any]) -> str:
    s = cmp["summary"]
    return (
        f"ONNX-level {cmp['onnx_pipeline']} vs MLIR-level {cmp['mlir_pipeline']} on the nodes ONNX fused: "
        f"{s['same bytes']} move the same bytes, MLIR moves more on {s['MLIR moves more']}, less on "
        f"{s['MLIR moves less']}"
    )


_AGREEMENT_HEADERS = ["ONNX node", "op", "nodes", "ONNX bytes", "MLIR bytes", "MLIR fused", "verdict"]


def _agreement_cells(cmp: Mapping[str, Any], top: int) -> list[list[str]]:
    return [
        [
            r["node"],
            str(r["op"]),
            str(r["replaces"]),
            human(r["onnx_bytes_before"], "B") + " -> " + human(r["onnx_bytes_after"], "B"),
            human(r["mlir_bytes_before"], "B") + " -> " + human(r["mlir_bytes_after"], "B"),
            "yes" if r["mlir_fused"] else "no",
            r["verdict"],
        ]
        for r in cmp["rows"][:top]
    ]


def _agreement_lines(cmp: Mapping[str, Any], top: int) -> list[str]:
    out = [_agreement_title(cmp)]
    cells = _agreement_cells(cmp, top)
    if cells:
        out += ["  " + line for line in _table(_AGREEMENT_HEADERS, cells, left=2)]
    return out


def study_schema() -> dict[str, Any]:
    return json.loads(resources.files("dabench_ir").joinpath("data/study.schema.json").read_text(encoding="utf-8"))


def validate_study(doc: Mapping[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``doc`` does not follow data/study.schema.json."""
    import jsonschema

    jsonschema.validate(doc, study_schema())


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Mapping):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_study_json(doc: Mapping[str, Any], path: str | Path) -> Path:
    """The study as JSON (NaN and infinity become null), checked against its schema first."""
    clean = _clean(doc)
    validate_study(clean)
    from dabench_ir.fileio import write_output

    return write_output(path, json.dumps(clean, indent=1) + "\n")


def _overhead_csv_row(part: Mapping[str, Any]) -> dict[str, Any]:
    """An overhead (or residual) part as a CSV node row: status ``overhead``/``residual``, its times."""
    return {
        "node": f"{part['kind']}: {part['part']}",
        "status": part["kind"],
        "replaces": [],
        "provenance": [],
        "time_before_s": part["before_s"],
        "time_after_s": part["after_s"],
        "bound_before": "overhead",
        "bound_after": "overhead",
    }


MLIR_CSV_COLUMNS = (
    "ops_before",
    "ops_after",
    "shared_with",
    "seconds",
    "kept",
    "created",
    "fused_away",
    "removed",
    "intermediates_after",
    "intermediate_bytes_after",
    "buffers_after",
    "buffer_bytes_after",
)
"""Columns the CSV adds when a study has MLIR pipelines (its ``mlir-pass`` and ``mlir-node`` rows)."""


def _mlir_records(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(pipeline, its ``mlir`` record) once per MLIR pipeline (the record is the same on every target)."""
    seen: dict[str, Mapping[str, Any]] = {}
    for run in doc["runs"]:
        if run.get("mlir") and run["pipeline"] not in seen:
            seen[run["pipeline"]] = run["mlir"]
    return list(seen.items())


def _mlir_csv_rows(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per pass (status ``mlir-pass``: the module before and after it) and per ONNX node (``mlir-node``:
    before and after the whole pipeline, fused ops split by the documented rule)."""
    out, prev = [], rec["before"]
    for s in rec["steps"]:
        a = s["after"]
        out.append(
            {
                "node": s["pass"],
                "status": "mlir-pass",
                "flops_before": prev["flops"],
                "flops_after": a["flops"],
                "bytes_before": prev["bytes_read"] + prev["bytes_written"],
                "bytes_after": a["bytes_read"] + a["bytes_written"],
                "ops_before": prev["ops"],
                "ops_after": a["ops"],
                "seconds": s["seconds"],
                "kept": s["kept"],
                "created": s["created"],
                "fused_away": s["fused_away"],
                "removed": s["removed"],
                "intermediates_after": a["intermediates"],
                "intermediate_bytes_after": a["intermediate_bytes"],
                "buffers_after": a["buffers"],
                "buffer_bytes_after": a["buffer_bytes"],
            }
        )
        prev = a
    for r in rec["nodes"]:
        out.append(
            {
                k: r[k]
                for k in (
                    "node",
                    "op",
                    "flops_before",
                    "flops_after",
                    "bytes_before",
                    "bytes_after",
                    "ops_before",
                    "ops_after",
                    "shared_with",
                )
            }
            | {"status": "mlir-node", "note": r["label"]}
        )
    return out


def write_study_csv(doc: Mapping[str, Any], path: str | Path) -> Path:
    """One line per (run, node row): the run's pipeline, target and label, then `NODE_COLUMNS`;
    then one per overhead row of the run's split (status ``overhead``/``residual``), so the time
    columns of a run add up to its step times. A study with MLIR pipelines adds `MLIR_CSV_COLUMNS`
    and, per MLIR pipeline (no target: the same on every one), one ``mlir-pass`` line per pass and
    one ``mlir-node`` line per ONNX node."""
    from dabench_ir.fileio import write_with
    from dabench_ir.report.model import csv_cell

    records = _mlir_records(doc)
    columns = (*NODE_COLUMNS, *(MLIR_CSV_COLUMNS if records else ()))
    lines = [
        ((run["pipeline"], run["target"], run["label"]), r)
        for run in doc["runs"]
        for r in [*run["nodes"], *(_overhead_csv_row(p) for p in _overhead_rows(run))]
    ]
    lines += [((pipe, None, pipe), r) for pipe, rec in records for r in _mlir_csv_rows(rec)]

    def write(fh: Any) -> None:
        writer = csv.writer(fh)
        writer.writerow(["pipeline", "target", "label", *columns])
        for head, r in lines:
            cells = list(head)
            for k in columns:
                v = r.get(k)
                cells.append(";".join(map(str, v)) if isinstance(v, list) else v)
            writer.writerow([csv_cell(c) for c in cells])

    return write_with(path, write)


_CSS = """body{font:14px system-ui,sans-serif;margin:2em;color:#222;max-width:100%}
.warn{color:#a00}.fused td{background:#eef6ff}.added td{background:#efe}.removed td,.folded td{background:#fee}"""


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], classes: Sequence[str] = ()) -> str:
    """`report.html.table_html`: sortable, filterable, scrolling sideways; columns after the first are numbers."""
    from dabench_ir.report.html import table_html

    return table_html(headers, rows, numeric=range(1, len(headers)), row_classes=classes)


def write_study_html(doc: Mapping[str, Any], path: str | Path) -> Path:
    """A self-contained page: the runs side by side, then each run's changed nodes and modules (an MLIR
    run: first its per-pass table and its per-ONNX-node costs), then MLIR beside the ONNX level."""
    parts = [f"<h1>Study: {html.escape(str(doc.get('model')))}</h1>"]
    parts.append("<h2>Runs against the baseline</h2>" + _html_table(*summary_table(doc)))
    for run in doc["runs"]:
        parts.append(f"<h2>{html.escape(run['label'])}</h2>")
        parts += [f"<p class='warn'>{html.escape(w)}</p>" for w in run.get("warnings", [])]
        if run.get("mlir"):
            rec = run["mlir"]
            parts.append(
                f"<h3>MLIR passes ({html.escape(_module_where(rec))})</h3>"
                + _html_table(_PASS_HEADERS, _pass_cells(rec["before"], rec["steps"]))
            )
            parts.append(
                f"<h3>{html.escape(_MLIR_NODE_NOTE.rstrip(':'))}</h3>"
                + _html_table(_MLIR_NODE_HEADERS, _mlir_node_cells(rec, len(rec["nodes"]), cap=10**6))
            )
        if _split_rows(run):
            head, split = split_table(run)
            parts.append("<h3>Speedup split: node time and overhead rows</h3>" + _html_table(head, split))
            if run["totals"].get("node_times_overlap"):
                parts.append(f"<p>{html.escape(OVERLAP_NOTE)}</p>")
        rows = _changed_rows(run)
        parts.append(
            _html_table(
                [
                    "node",
                    "op",
                    "status",
                    "replaces",
                    "provenance",
                    "time before",
                    "after",
                    "bound before",
                    "after",
                    "bytes before",
                    "after",
                ],
                [
                    [
                        r["node"] or "(gone)",
                        str(r["op"]),
                        r["status"],
                        ", ".join(r["replaces"]),
                        ", ".join(r["provenance"]),
                        _t(r["time_before_s"]),
                        _t(r["time_after_s"]),
                        r["bound_before"] or "-",
                        r["bound_after"] or "-",
                        human(r["bytes_before"], "B"),
                        human(r["bytes_after"], "B"),
                    ]
                    for r in rows
                ]
                + [
                    [
                        f"({p['kind']})",
                        p["part"],
                        p["kind"],
                        "-",
                        "-",
                        _t(p["before_s"]),
                        _t(p["after_s"]),
                        "overhead",
                        "overhead",
                        "-",
                        "-",
                    ]
                    for p in _overhead_rows(run)
                ],
                [r["status"] for r in rows],
            )
        )
        parts.append(
            _html_table(
                ["module", "nodes before", "after", "time before", "after", "change"],
                [_module_cells(m) for m in run["modules"]],
            )
        )
    for cmp in doc.get("mlir_vs_onnx") or []:
        parts.append(
            f"<h2>{html.escape(_agreement_title(cmp))}</h2>"
            + _html_table(_AGREEMENT_HEADERS, _agreement_cells(cmp, len(cmp["rows"])))
        )
    from dabench_ir.report.html import TABLE_CSS, TABLE_SCRIPT

    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>dabench-ir study</title>"
        f"<style>{_CSS}{TABLE_CSS}</style></head><body>{''.join(parts)}<script>{TABLE_SCRIPT}</script></body></html>\n"
    )
    from dabench_ir.fileio import write_output

    return write_output(path, page)
