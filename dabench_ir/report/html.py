"""Self-contained HTML reports: summary, attribution tables and plots in one offline file.

Plots are embedded as base64 PNG, the style sheet and one small script are inline, so the
file opens in any browser with no network. Every table (`table_html`) sorts by a click on
its header (numbers by value, SI prefixes and units read: ``1.2 ms`` > ``15.8 µs``) and
filters by the text typed in the box above it (`TABLE_SCRIPT`), and scrolls sideways inside
its section instead of overflowing the page. `write_html` renders one Report;
`write_compare_html` renders a comparison (rows from `compare.compare_reports`).
"""

from __future__ import annotations

import base64
import html
import io
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir import __version__

from .attribution import comm_label
from .compare import PER_CHIP_NOTE, PERIOD_NOTE, format_row, is_period, per_chip
from .model import NodeRecord, Report
from .table import (
    BY,
    SHARE_OF_FLOPS,
    SHARE_OF_LAYER,
    SHARE_OF_TIME,
    SORT_WORDS,
    failure_text,
    flops_cell,
    human,
    no_rule_legend,
    no_rule_roles,
    percent,
    prediction_text,
    ranked_nodes,
    ranked_roles,
    role_table,
    seconds,
    table_sort,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TABLE_CSS",
    "TABLE_SCRIPT",
    "escape",
    "figure_html",
    "render_compare_html",
    "render_html",
    "table_html",
    "write_compare_html",
    "write_html",
]

logger = logging.getLogger(__name__)

_CSS = """
:root { --ink:#1d2330; --muted:#667085; --line:#e4e7ec; --bg:#f7f8fa; --accent:#2f6fd0; --bad:#c0392b; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
       color:var(--ink); background:var(--bg); }
header { background:#1d2330; color:#fff; padding:18px 32px; }
header h1 { margin:0; font-size:22px; font-weight:600; }
header p { margin:4px 0 0; color:#c7cdd8; font-size:13px; }
main { max-width:1200px; margin:0 auto; padding:20px 32px 40px; }
section { background:#fff; border:1px solid var(--line); border-radius:8px; padding:16px 20px; margin:0 0 18px; }
h2 { font-size:17px; margin:0 0 12px; }
h3 { font-size:14px; margin:0 0 8px; color:var(--muted); font-weight:600; }
.cards { display:grid; grid-template-columns:repeat(auto-fill,minmax(170px,1fr)); gap:10px; }
.card { border:1px solid var(--line); border-radius:6px; padding:8px 12px; background:#fbfcfd; }
.card .k { font-size:11px; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); }
.card .v { font-size:17px; font-weight:600; margin-top:2px; overflow-wrap:anywhere; }
.bad { color:var(--bad); }
.grid2 { display:grid; grid-template-columns:repeat(auto-fit,minmax(340px,1fr)); gap:18px; }
td.name { max-width:330px; overflow:hidden; text-overflow:ellipsis; font-family:ui-monospace,Menlo,Consolas,monospace; }
.bar { display:inline-block; height:9px; background:var(--accent); border-radius:2px; vertical-align:middle; margin-right:6px; }
.dot { display:inline-block; width:9px; height:9px; border-radius:50%; margin-right:5px; vertical-align:middle; }
figure { margin:0 0 14px; text-align:center; }
figure img { max-width:100%; height:auto; border:1px solid var(--line); border-radius:4px; background:#fff; }
figcaption { color:var(--muted); font-size:12px; margin-top:4px; }
.note { color:var(--muted); font-size:12.5px; }
a { color:var(--accent); }
footer { color:var(--muted); font-size:12px; text-align:center; padding:10px; }
"""

TABLE_CSS = """
.tablewrap { max-width:100%; overflow-x:auto; margin:0 0 10px; }
input.filter { font:inherit; font-size:12.5px; padding:3px 8px; margin:0 0 6px; width:16em; max-width:100%;
               border:1px solid #d0d5dd; border-radius:4px; }
table { border-collapse:collapse; width:100%; font-size:12.5px; }
th, td { padding:4px 8px; border-bottom:1px solid #e4e7ec; text-align:left; white-space:nowrap; }
th { background:#f0f2f5; font-weight:600; position:sticky; top:0; cursor:pointer; user-select:none; }
th[aria-sort="ascending"]::after { content:" \\25B2"; font-size:9px; }
th[aria-sort="descending"]::after { content:" \\25BC"; font-size:9px; }
td.n, th.n { text-align:right; font-variant-numeric:tabular-nums; }
tr:hover td { background:#f5f8ff; }
"""
"""The tables' style (this page's and the study page's)."""

TABLE_SCRIPT = r"""
(function () {
  var SI = {"p": 1e-12, "n": 1e-9, "u": 1e-6, "\u00b5": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "P": 1e15, "E": 1e18};
  function value(text) {
    // a prefix before a unit ("5 ms", "1.2 TFLOP/s") or alone after the number ("262 k", as human() writes a count)
    var m = /^\s*([-+]?\d*\.?\d+(?:e[-+]?\d+)?)\s*(?:x\s*)?([pnu\u00b5mkMGTPE](?=[A-Za-z\/]|\s*$))?/.exec(text);
    if (!m) return null;
    return parseFloat(m[1]) * (m[2] ? SI[m[2]] : 1);
  }
  function sortBy(table, col, th) {
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    var numeric = th.classList.contains("n"), was = th.getAttribute("aria-sort");
    var down = was ? was === "ascending" : numeric;  // first click: numbers largest first, text A to Z
    rows.sort(function (a, b) {
      var x = a.cells[col] ? a.cells[col].textContent : "", y = b.cells[col] ? b.cells[col].textContent : "";
      var c;
      var vx = numeric ? value(x) : null, vy = numeric ? value(y) : null;
      if (vx !== null || vy !== null) {
        c = (vx === null ? -Infinity : vx) - (vy === null ? -Infinity : vy);
        if (isNaN(c)) c = 0;
      } else {
        c = x.localeCompare(y, undefined, {numeric: true});
      }
      return down ? -c : c;
    });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", down ? "descending" : "ascending");
    rows.forEach(function (r) { body.appendChild(r); });
  }
  function filter(table, text) {
    var needle = text.toLowerCase();
    Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
      r.hidden = needle !== "" && r.textContent.toLowerCase().indexOf(needle) < 0;
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.title = "sort";
      th.addEventListener("click", function () { sortBy(table, col, th); });
    });
    var box = table.parentNode.previousElementSibling;
    if (box && box.classList.contains("filter")) {
      box.addEventListener("input", function () { filter(table, box.value); });
    }
  });
})();
"""
"""Sorting (a click on a header: numbers largest first, text A to Z; again: the other way) and
filtering (the box above a table hides the rows without its text, case-insensitive) for every
``table.sortable``; no network."""


def escape(x: Any) -> str:
    return html.escape("-" if x is None else str(x))


def _page(title: str, subtitle: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{_CSS}{TABLE_CSS}</style>\n</head>\n<body>\n"
        f"<header><h1>{escape(title)}</h1><p>{escape(subtitle)}</p></header>\n<main>\n{body}\n</main>\n"
        f"<footer>generated by dabench-ir {escape(__version__)}</footer>\n<script>{TABLE_SCRIPT}</script>\n"
        "</body>\n</html>\n"
    )


def _png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def figure_html(fig: Figure | bytes | None, caption: str) -> str:
    """A figure (or PNG bytes) as an embedded base64 PNG inside a <figure> ('' for None)."""
    if fig is None:
        return ""
    png = fig if isinstance(fig, bytes) else _png_bytes(fig)
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{escape(caption)}">'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def table_html(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    numeric: Iterable[int] = (),
    *,
    raw: Iterable[int] = (),
    cls: Mapping[int, str] | None = None,
    row_classes: Sequence[str] = (),
) -> str:
    """A sortable, filterable table (`TABLE_SCRIPT`) in a box that scrolls sideways: columns in
    ``numeric`` are right-aligned and sort by value; cells are escaped unless their column is in
    ``raw``; ``cls`` adds a class per column, ``row_classes`` one per row."""
    cls, numeric, raw = cls or {}, set(numeric), set(raw)

    def attr(i: int) -> str:
        names = " ".join(x for x in ("n" if i in numeric else "", cls.get(i, "")) if x)
        return f' class="{names}"' if names else ""

    head = "".join(f"<th{attr(i)}>{escape(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        (f'<tr class="{escape(row_classes[r])}">' if r < len(row_classes) and row_classes[r] else "<tr>")
        + "".join(f"<td{attr(i)}>{c if i in raw else escape(c)}</td>" for i, c in enumerate(row))
        + "</tr>"
        for r, row in enumerate(rows)
    )
    return (
        '<input type="search" class="filter" placeholder="filter rows" aria-label="filter rows">'
        f'<div class="tablewrap"><table class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _share_cell(share: float | None) -> str:
    if share is None:
        return "-"
    width = max(1, round(80 * share))
    return f'<span class="bar" style="width:{width}px"></span>{100 * share:.1f}%'


def _class_cell(op_class: str | None) -> str:
    from .plots import OP_CLASS_COLORS

    color = OP_CLASS_COLORS.get(op_class or "other", OP_CLASS_COLORS["other"])
    return f'<span class="dot" style="background:{color}"></span>{escape(op_class)}'


def _card(key: str, value: str, bad: bool = False) -> str:
    return f'<div class="card"><div class="k">{escape(key)}</div><div class="v{" bad" if bad else ""}">{escape(value)}</div></div>'


def _summary(report: Report) -> str:
    t, m, c, model = report.totals, report.metrics, report.config, report.model
    chips = c.get("chips") if "per_chip" in report.extra else None  # a multi-chip step: the text's labels
    cards = [
        _card("model", str(model.get("preset") or model.get("name") or model.get("path") or "-")),
        _card("nodes / layers", f"{model.get('nodes')} / {model.get('layers')}"),
        _card("parameters", human(model.get("params"))),
        _card("batch / precision", f"{c.get('batch')} / {c.get('precision') or '-'} / {c.get('mode')}"),
        *(
            [_card("precision by op class", ", ".join(f"{k} {v}" for k, v in c["precision_by_class"].items()))]
            if c.get("precision_by_class")
            else []
        ),
        _card("work" + (f" (all {chips} chips: the model's)" if chips else ""), human(t.get("flops"), "FLOP")),
        _card("bytes moved" + (" (every chip's)" if chips else ""), human(t.get("bytes"), "B")),
        _card("intensity", "-" if t.get("intensity") is None else f"{t['intensity']:.3g} FLOP/B"),
    ]
    if report.target:
        cards.append(_card("target", f"{report.target['name']} ({report.target['kind']})"))
        cards.append(_card("fits", "yes" if report.fits else "NO", bad=not report.fits))
    if t.get("time_s") is not None:
        pipelined = (t.get("latency_s") or 0) > t["time_s"] * (1 + 1e-9)  # consecutive steps overlap
        cards += [
            _card("period (steady state)" if pipelined else "time per step", seconds(t["time_s"])),
            *([_card("latency (one step alone)", seconds(t["latency_s"]))] if pipelined else []),
            _card("time no node owns", seconds(t.get("overhead_s"))),
            _card("throughput", human(t.get("throughput_samples_per_s"), "samples/s")),
            _card("achieved", human(t.get("achieved_flops_per_s"), "FLOP/s")),
        ]
    if t.get("energy_j") is not None:
        cards.append(_card("energy per step", human(t["energy_j"], "J")))
    if chips:
        cards += [
            _card("chips", f"{chips} ({c.get('strategy')})"),
            _card(comm_label(c.get("strategy")), seconds(t.get("comm_time_s"))),
            _card("node rows", str(report.extra.get("nodes_basis"))),
        ]
    if report.target:
        label = "per chip: " if chips else ""
        cards += [
            _card(f"{label}allocation", percent(m.get("allocation_ratio"))),
            _card(f"{label}load balance LI", "-" if m.get("load_imbalance") is None else f"{m['load_imbalance']:.3g}"),
            _card(f"{label}efficiency", percent(m.get("compute_efficiency"))),
        ]
    if t.get("measured_time_s") is not None:
        cards.append(_card("measured step", seconds(t["measured_time_s"])))
    share = t.get("estimated_time_share")
    estimated = int(t.get("estimated_nodes") or 0)
    cards.append(
        _card(
            "estimated nodes (no cost rule)",
            f"{estimated}" + (f", {100 * share:.1f}% of node time" if estimated and share is not None else ""),
            bad=bool(estimated),
        )
    )
    cards.append(_card("unattributed", str(len(report.unattributed)), bad=bool(report.unattributed)))
    out = f'<section><h2>Summary</h2><div class="cards">{"".join(cards)}</div>'
    err = m.get("prediction_error")
    if err:
        out += f'<p class="note">Predicted vs measured: {escape(prediction_text(err))}.</p>'
    if report.failure:
        out += f'<p class="bad">Does not fit: {escape(failure_text(report.failure))}</p>'
    out += "".join(f'<p class="note">{escape(note)}</p>' for note in report.extra.get("notes", ()))
    return out + "</section>"


_SHARE_HEADERS = frozenset({SHARE_OF_TIME, SHARE_OF_FLOPS, SHARE_OF_LAYER})
_NUMERIC_HEADERS = (
    frozenset({"layer", "FLOPs", "bytes", "FLOP/B", "FLOP/B at feed", "time", "measured", "energy"}) | _SHARE_HEADERS
)


def _top_nodes(report: Report, top: int, sort: str) -> str:
    """The ``top`` nodes (0: every one) by ``sort``, as the text's ``--by node`` table ranks them."""
    timed = report.has_times
    nodes: list[NodeRecord] = ranked_nodes(report, sort)
    from .attribution import node_share

    no_rule = {e.get("name") for e in report.extra.get("estimated") or ()}
    total_flops = sum(n.flops or 0 for n in report.attributed) or None
    measured = any(n.measured_time_s is not None for n in report.nodes)
    energy = any(n.energy_j is not None for n in report.nodes)
    headers = ["node", "op", "layer", "class", "FLOPs", "bytes", "FLOP/B at feed" if report.target else "FLOP/B"]
    headers += ["time", SHARE_OF_TIME, "bound", "unit"] if timed else [SHARE_OF_FLOPS]
    headers += ["measured"] if measured else []
    headers += ["energy"] if energy else []
    rows = []
    for n in nodes[:top] if top > 0 else nodes:
        uncounted = n.name in no_rule
        row = [
            n.name,
            n.op_type,
            "-" if n.layer is None else str(n.layer),
            _class_cell(n.op_class),
            flops_cell(n.flops, no_rule=int(uncounted)),
            human(n.bytes, "B"),
            "-" if n.intensity is None or uncounted else f"{n.intensity:.3g}",
        ]
        if timed:
            row += [seconds(n.time_s), _share_cell(node_share(report, n)), n.bound or "-", n.unit or "-"]
        else:
            row += [_share_cell((n.flops or 0) / total_flops if total_flops else None)]
        if measured:
            row.append(seconds(n.measured_time_s))
        if energy:
            row.append(human(n.energy_j, "J"))
        rows.append(row)
    numeric = {i for i, h in enumerate(headers) if h in _NUMERIC_HEADERS}
    raw = {i for i, h in enumerate(headers) if h == "class" or h in _SHARE_HEADERS}
    return (
        f"<section><h2>Top {len(rows)} of {len(report.nodes)} nodes by {SORT_WORDS[sort]}</h2>"
        + table_html(headers, rows, numeric, raw=raw, cls={0: "name"})
        + _legend([row[4] for row in rows])
        + "</section>"
    )


def _legend(flops_cells: Sequence[str]) -> str:
    """The no-rule legend (`table.no_rule_legend`) under a table, if any of its FLOPs cells is marked."""
    return "".join(f'<p class="note">{escape(line)}</p>' for line in no_rule_legend(flops_cells))


def _group_table(
    title: str,
    key_header: str,
    groups: Mapping[Any, float],
    *,
    fmt=seconds,
    limit: int = 15,
    share_header: str = SHARE_OF_TIME,
) -> str:
    """One grouping with its share column; the groups hold every row of the basis (they sum to 100 %)."""
    total = sum(groups.values()) or None
    items = sorted(groups.items(), key=lambda kv: kv[1], reverse=True)
    if key_header == "layer":  # layers in order, then the outside-block nodes, then the overheads
        items = sorted(
            groups.items(),
            key=lambda kv: (
                2 if isinstance(kv[0], str) else 1 if kv[0] is None else 0,
                kv[0] if isinstance(kv[0], int) else 0,
            ),
        )
    rows = [
        [
            "(outside blocks)" if k is None and key_header == "layer" else str(k if k is not None else "-"),
            fmt(v),
            _share_cell(v / total if total else None),
        ]
        for k, v in items[:limit]
    ]
    more = f'<p class="note">... and {len(items) - limit} more</p>' if len(items) > limit else ""
    headers = [key_header, "time" if fmt is seconds else "FLOPs", share_header]
    return f"<div><h3>{escape(title)}</h3>{table_html(headers, rows, {1, 2}, raw={2})}{more}</div>"


def _attribution(report: Report) -> str:
    if report.has_times:
        from .attribution import time_groups

        parts = [
            _group_table("Time by op type", "op_type", time_groups(report, "op_type")),
            _group_table("Time by layer", "layer", time_groups(report, "layer"), limit=200),
            _group_table("Time by bound class", "bound", time_groups(report, "bound")),
            _group_table("Time by op class", "op_class", time_groups(report, "op_class")),
        ]
    else:

        def flops_by(key: str) -> dict[Any, float]:
            out: dict[Any, float] = {}
            for n in report.attributed:
                out[getattr(n, key)] = out.get(getattr(n, key), 0.0) + float(n.flops or 0)
            return out

        parts = [
            _group_table("FLOPs by op type", "op_type", flops_by("op_type"), fmt=human, share_header=SHARE_OF_FLOPS),
            _group_table(
                "FLOPs by layer", "layer", flops_by("layer"), fmt=human, limit=200, share_header=SHARE_OF_FLOPS
            ),
            _group_table("FLOPs by op class", "op_class", flops_by("op_class"), fmt=human, share_header=SHARE_OF_FLOPS),
        ]
    return f'<section><h2>Attribution</h2><div class="grid2">{"".join(parts)}</div></section>'


def _roles(report: Report, top: int, sort: str) -> str:
    """Module roles across layers (with the overhead rows), the ``top`` of them (0: every one) by
    ``sort`` as the text's role table ranks them, the why lines, and one layer."""
    from .attribution import representative_layer

    rows = ranked_roles(report, sort)
    no_rule = no_rule_roles(report)
    timed = report.has_times
    headers = ["role", "nodes", "FLOPs", "bytes", "FLOP/B at feed" if report.target else "FLOP/B"]
    headers += ["time", SHARE_OF_TIME, "achieved", "of peak", "bound"] if timed else [SHARE_OF_FLOPS]
    body = []
    for r in rows[:top] if top > 0 else rows:
        flops = flops_cell(r["flops"], nodes=r["nodes"], no_rule=no_rule.get(r["role"], 0))
        uncounted = flops == "-"  # no rule counts its work: no intensity or rate either
        row = [
            r["role"],
            str(r["nodes"]),
            flops,
            human(r["bytes"], "B"),
            "-" if r["intensity"] is None or uncounted else f"{r['intensity']:.3g}",
        ]
        if timed:
            row += [
                seconds(r["time_s"]),
                _share_cell(r["share"]),
                "-" if uncounted else human(r["achieved_flops_per_s"], "FLOP/s"),
                "-" if uncounted else percent(r["peak_fraction"]),
                r["bound"] or "-",
            ]
        else:
            row += [_share_cell(r["share"])]
        body.append(row)
    numeric = {i for i, h in enumerate(headers) if h in _NUMERIC_HEADERS | {"nodes", "achieved", "of peak"}}
    raw = {i for i, h in enumerate(headers) if h in _SHARE_HEADERS}
    out = (
        f"<section><h2>Top {len(body)} of {len(rows)} module roles by {SORT_WORDS[sort]}</h2>"
        '<p class="note">Node times added up by module role across all layers; overheads no node owns are rows '
        "of their own. Every time share on this page is a share of the summed time: node busy times plus "
        "the overhead rows (on a target that runs nodes concurrently this exceeds the step).</p>"
        + table_html(headers, body, numeric, raw=raw, cls={0: "name"})
        + _legend([row[2] for row in body])
    )
    if report.why:
        items = "".join(f"<li>{escape(w['text'])}</li>" for w in report.why)
        out += f"<h3>Why</h3><ul>{items}</ul>"
    out += "</section>"
    rep = representative_layer(report)
    if rep:
        h, body = role_table(rep, share=_share_cell, spread=percent, no_rule=no_rule)
        out += (
            "<section><h2>One decoder layer, every role</h2>"
            f'<p class="note">Median over {max(r["layers"] for r in rep)} layers; min, max and spread across layers.</p>'
            + table_html(h, body, {1, 2, 3, 4, 6, 7, 8}, raw={5}, cls={0: "name"})
            + _legend([row[2] for row in body])
            + "</section>"
        )
    return out


def _layers(report: Report) -> str:
    """The per-layer table: identical consecutive layers in one row."""
    from .attribution import layer_runs

    runs = layer_runs(report)
    body = [
        [r["layers"], str(r["count"]), human(r["flops"]), human(r["bytes"], "B"), seconds(r["time_s"])] for r in runs
    ]
    return (
        '<section><h2>Per layer</h2><p class="note">Identical consecutive layers in one row; figures per layer.</p>'
        + table_html(["layers", "count", "FLOPs", "bytes", "time"], body, {1, 2, 3, 4})
        + "</section>"
    )


def _unattributed(report: Report) -> str:
    if not report.unattributed:
        return '<section><h2>Unattributed nodes</h2><p class="note">None: every node has a cost.</p></section>'
    rows = [[u.get("name"), u.get("op_type"), u.get("reason")] for u in report.unattributed]
    return (
        f'<section><h2 class="bad">Unattributed nodes ({len(rows)})</h2>'
        '<p class="note">Not counted in the totals above.</p>'
        f"{table_html(['node', 'op', 'reason'], rows, cls={0: 'name'})}</section>"
    )


_PLOTS = (
    ("roofline", "roofline_figure", "Roofline: each point a node, size its share of time, colour its op class"),
    ("layers", "layer_time_figure", "Time by decoder layer, stacked by op class"),
    (
        "predicted-vs-measured",
        "predicted_vs_measured_figure",
        "Predicted vs measured time per node (log-log, y = x dashed)",
    ),
)


def _plots(report: Report, plot_dir: Path | None, stem: str) -> str:
    """The plots section; with ``plot_dir``, each plot is also saved there as PNG and SVG."""
    from . import plots

    figs = []
    for name, maker, caption in _PLOTS:
        fig = getattr(plots, maker)(report)
        if fig is None:
            continue
        png = _png_bytes(fig)
        if plot_dir is not None:
            plot_dir.mkdir(parents=True, exist_ok=True)
            base = f"{stem}-{name}" if stem else name
            (plot_dir / f"{base}.png").write_bytes(png)
            plots.save_figure(fig, plot_dir / f"{base}.svg")
        figs.append(figure_html(png, caption))
    if not figs:
        return ""
    return f'<section><h2>Plots</h2>{figs[0]}<div class="grid2">{"".join(figs[1:])}</div></section>'


def render_html(
    report: Report,
    *,
    top: int = 20,
    sort: str | None = None,
    by: str = "role",
    title: str | None = None,
    plot_dir: str | Path | None = None,
    plot_stem: str = "",
) -> str:
    """The whole report as one self-contained HTML page (plots also saved to ``plot_dir`` if given).

    ``top``, ``sort`` and ``by`` are the text table's (`table.render_table`, ``profile --top --sort
    --by``): the role and node tables show the ``top`` rows (0: every one) ranked by ``sort``
    (``time``, the default when timed; ``flops``; ``energy``), and ``by`` picks the table that leads
    the page (``role``: the module roles, the why lines and one layer; ``node``: the single nodes).
    The page keeps both, as its tables can be sorted and filtered in place."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}")
    sort = table_sort(report, sort)
    target = (report.target or {}).get("name")
    model = report.model.get("preset") or report.model.get("name") or report.model.get("path") or "model"
    title = title or f"dabench-ir: {model}" + (f" on {target}" if target else "")
    subtitle = " · ".join(
        str(x) for x in (report.model.get("path"), getattr(report.target_obj, "description", None)) if x
    )
    plots_html = _plots(report, None if plot_dir is None else Path(plot_dir), plot_stem)
    roles, nodes = _roles(report, top, sort) + _layers(report), _top_nodes(report, top, sort)
    body = (
        _summary(report)
        + plots_html
        + (roles + nodes if by == "role" else nodes + roles)
        + _attribution(report)
        + _unattributed(report)
    )
    return _page(title, subtitle, body)


def write_html(report: Report, path: str | Path, **options: Any) -> Path:
    """Write ``render_html(report)`` to ``path``; returns the path."""
    from dabench_ir.fileio import write_output

    return write_output(path, render_html(report, **options))


def render_compare_html(
    rows: Sequence[Mapping[str, Any]],
    *,
    title: str = "dabench-ir: comparison",
    subtitle: str = "",
    links: Sequence[Sequence[tuple[str, str]]] | None = None,
    errors: Mapping[str, str] | None = None,
    extra_html: str = "",
) -> str:
    """A comparison page: one row per report; ``links[i]`` lists (text, href) pairs for row i."""
    cells = [format_row(r) for r in rows]
    headers = list(cells[0]) if cells else list(format_row({}))
    table_rows = []
    for i, cell in enumerate(cells):
        values = [cell[h] for h in headers]
        anchors = links[i] if links is not None and i < len(links) else ()
        values.append(" ".join(f'<a href="{escape(href)}">{escape(text)}</a>' for text, href in anchors) or "-")
        table_rows.append(values)
    n = len(headers)
    body = (
        "<section><h2>Targets side by side</h2>"
        + table_html([*headers, "files"], table_rows, numeric=set(range(2, 8)) | {n - 1}, raw={n}, cls={})
        + '<p class="note">alloc: resource allocation ratio; LI: load imbalance (mean/max busy time, 1 = balanced); '
        "eff: achieved / peak FLOP/s; dominant bound: the bound class (overhead rows counted as one) with the largest share of the summed time; "
        "GOP/s/W: achieved GFLOP/s per watt of the target's rated power."
        + (f" time {escape(PERIOD_NOTE)}" if any(is_period(r) for r in rows) else "")
        + (f" {escape(PER_CHIP_NOTE)}" if any(per_chip(r) for r in rows) else "")
        + "</p></section>"
    )
    if errors:
        err_rows = [[k, v] for k, v in errors.items()]
        body += f'<section><h2 class="bad">Failed ({len(err_rows)})</h2>{table_html(["target", "error"], err_rows)}</section>'
    body += extra_html
    return _page(title, subtitle, body)


def write_compare_html(rows: Sequence[Mapping[str, Any]], path: str | Path, **options: Any) -> Path:
    """Write ``render_compare_html(rows, **options)`` to ``path``."""
    from dabench_ir.fileio import write_output

    return write_output(path, render_compare_html(rows, **options))
