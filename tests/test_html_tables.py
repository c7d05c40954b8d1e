"""HTML tables without a browser: the markup the sort/filter script needs, the script itself
(inline, no network), and its number parser run in node when node is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from dabench_ir.report.html import TABLE_SCRIPT, render_compare_html, render_html
from tests.test_report_helpers import make_report

pytest.importorskip("matplotlib")


class _Tables(HTMLParser):
    """Each table's class, header cells (with their class), body rows, and the element before
    its wrapper; every script's source and text; every href/src that leaves the page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict] = []
        self.scripts: list[tuple[str | None, str]] = []
        self.external: list[str] = []
        self._last_start: tuple[str, dict] | None = None
        self._before_wrap: tuple[str, dict] | None = None
        self._in_wrap = False
        self._table: dict | None = None
        self._part = ""
        self._script: list[str] | None = None
        self._src: str | None = None

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        for key in ("src", "href"):
            if key in a and not a[key].startswith(("data:", "#")) and not a[key].endswith((".html", ".json")):
                self.external.append(a[key])
        if tag == "div" and "tablewrap" in a.get("class", "").split():
            self._before_wrap, self._in_wrap = self._last_start, True
        elif tag == "table":
            self._table = {
                "class": a.get("class", ""),
                "wrapped": self._in_wrap,
                "before": self._before_wrap,
                "head": [],
                "rows": [],
                "thead": False,
                "tbody": False,
            }
        elif tag in ("thead", "tbody") and self._table is not None:
            self._part = tag
            self._table[tag] = True
        elif tag == "tr" and self._table is not None and self._part == "tbody":
            self._table["rows"].append([])
        elif tag == "th" and self._table is not None:
            self._table["head"].append(a.get("class", ""))
        elif tag == "script":
            self._script, self._src = [], a.get("src")
        self._last_start = (tag, a)

    def handle_endtag(self, tag):
        if tag == "table" and self._table is not None:
            self.tables.append(self._table)
            self._table, self._in_wrap, self._part = None, False, ""
        if tag == "script" and self._script is not None:
            self.scripts.append((self._src, "".join(self._script)))
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self._script.append(data)
        elif self._table is not None and self._part == "tbody" and self._table["rows"]:
            self._table["rows"][-1].append(data)


def _parse(text: str) -> _Tables:
    p = _Tables()
    p.feed(text)
    p.close()
    return p


def _check_tables(page: _Tables, at_least: int) -> None:
    assert len(page.tables) >= at_least
    for t in page.tables:
        assert t["class"] == "sortable" and t["thead"] and t["tbody"] and t["head"], t
        assert t["wrapped"], "a table scrolls inside its wrapper, not past the page"
        tag, attrs = t["before"]
        assert tag == "input" and attrs.get("class") == "filter" and attrs.get("type") == "search"
    assert page.external == []
    assert [src for src, _ in page.scripts] == [None]  # one inline script, nothing loaded
    script = page.scripts[0][1]
    assert script == TABLE_SCRIPT
    for needle in (
        'querySelectorAll("table.sortable")',
        'addEventListener("click"',
        'addEventListener("input"',
        "aria-sort",
        "r.hidden",
        "previousElementSibling",
    ):
        assert needle in script, needle


def test_report_tables_are_sortable_and_filterable():
    page = _parse(render_html(make_report()))
    _check_tables(page, 5)
    numeric = [t for t in page.tables if "n" in " ".join(t["head"]).split()]
    assert numeric, "numeric columns carry class n: the script sorts them by value"


def test_compare_tables_are_sortable_and_filterable():
    report = make_report()
    from dabench_ir.report.compare import compare_reports

    page = _parse(render_compare_html(compare_reports([report, report]), errors={"x": "failed"}))
    _check_tables(page, 2)
    assert len(page.tables[0]["rows"]) == 2


def test_study_html_has_a_summary_table_and_sortable_tables(tmp_path):
    pytest.importorskip("onnxruntime")
    from dabench_ir.study import run_study
    from dabench_ir.study.render import write_study_html
    from tests.test_study import _mlp

    doc = run_study(_mlp(tmp_path / "m.onnx"), ["ort-basic"], ["rdu"])
    text = write_study_html(doc, tmp_path / "s.html").read_text()
    assert "<pre>" not in text
    page = _parse(text)
    _check_tables(page, 3)
    summary = page.tables[0]
    assert len(summary["rows"]) == len(doc["runs"]) == 1
    assert summary["rows"][0][0] == doc["runs"][0]["label"]
    assert summary["rows"][0][3].endswith("x")  # the speedup


NODE = shutil.which("node") or shutil.which("nodejs")


@pytest.mark.skipif(NODE is None, reason="node not installed - the script's number parser is not run")
def test_script_reads_units_and_si_prefixes():
    """The sort key of a cell, by the script's own ``value`` function run in node."""
    body = re.search(r"function value\(text\) \{.*?\n  \}", TABLE_SCRIPT, re.S).group(0)
    si = re.search(r"var SI = \{.*?\};", TABLE_SCRIPT, re.S).group(0)
    cells = [
        "15.8 µs",
        "1.2 ms",
        "4 s",
        "2.05 kB",
        "1.23 MFLOP",
        "12 GFLOP/s",
        "100.0%",
        "0.462",
        "-",
        "3.2x",
        "7 ns",
        "abc",
    ]
    program = f"{si}\n{body}\nconsole.log(JSON.stringify({json.dumps(cells)}.map(value)));"
    out = subprocess.run([NODE, "-e", program], capture_output=True, text=True, timeout=30, check=True).stdout
    got = json.loads(out)
    expected = [15.8e-6, 1.2e-3, 4, 2050, 1.23e6, 12e9, 100.0, 0.462, None, 3.2, 7e-9, None]
    assert [g is None for g in got] == [e is None for e in expected]
    assert [g for g in got if g is not None] == pytest.approx([e for e in expected if e is not None], rel=1e-12)


_FAKE_DOM = """
function El(text) { this.textContent = text || ""; this.attrs = {}; this.on = {}; this.hidden = false;
  var list = this.list = []; this.classList = {contains: function (c) { return list.indexOf(c) >= 0; }}; }
El.prototype.getAttribute = function (k) { return k in this.attrs ? this.attrs[k] : null; };
El.prototype.setAttribute = function (k, v) { this.attrs[k] = String(v); };
El.prototype.removeAttribute = function (k) { delete this.attrs[k]; };
El.prototype.addEventListener = function (k, f) { this.on[k] = f; };
var ths = HEAD.map(function (h) { var e = new El(h[0]); if (h[1]) e.list.push(h[1]); return e; });
var body = {rows: [], appendChild: function (r) { this.rows.splice(this.rows.indexOf(r), 1); this.rows.push(r); }};
ROWS.forEach(function (r) { var tr = new El(r.join(" ")); tr.cells = r.map(function (c) { return new El(c); });
  body.rows.push(tr); });
var box = new El(); box.list.push("filter"); box.value = "";
var table = {tHead: {rows: [{cells: ths}]}, tBodies: [body], parentNode: {previousElementSibling: box}};
var document = {querySelectorAll: function () { return [table]; }};
function names() { return body.rows.map(function (r) { return r.cells[0].textContent; }); }
var out = {};
"""


@pytest.mark.skipif(NODE is None, reason="node not installed - the script is not run")
def test_script_sorts_and_filters_a_table():
    """The whole script in node, on a stand-in for the DOM calls it makes (no browser here)."""
    head = [["node", ""], ["time", "n"]]
    rows = [["a", "40 µs"], ["b", "2 µs"], ["c", "1.2 ms"], ["mlp_x", "10 µs"], ["d", "-"]]
    probe = """
ths[1].on.click(); out.down = names(); out.sort1 = ths[1].attrs["aria-sort"];
ths[1].on.click(); out.up = names();
ths[0].on.click(); out.text = names(); out.cleared = ths[1].getAttribute("aria-sort");
box.value = "MLP"; box.on.input(); out.hidden = body.rows.map(function (r) { return r.hidden; });
console.log(JSON.stringify(out));
"""
    program = f"var HEAD = {json.dumps(head)}, ROWS = {json.dumps(rows)};" + _FAKE_DOM + TABLE_SCRIPT + probe
    got = json.loads(
        subprocess.run([NODE, "-e", program], capture_output=True, text=True, timeout=30, check=True).stdout
    )
    assert got["down"] == ["c", "a", "mlp_x", "b", "d"] and got["sort1"] == "descending"  # 1.2 ms > 40 µs > ...
    assert got["up"] == ["d", "b", "mlp_x", "a", "c"]
    assert got["text"] == ["a", "b", "c", "d", "mlp_x"] and got["cleared"] is None
    assert got["hidden"] == [True, True, True, True, False]  # case-insensitive: only mlp_x stays
