"""HTML report: one self-contained page with the summary, attribution tables and embedded plots."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

import pytest

from dabench_ir.report.html import render_compare_html, write_html
from tests.test_report_helpers import make_report, png_size

pytest.importorskip("matplotlib")


class _Collect(HTMLParser):
    """Headings, table rows, image sources and anything that would load from elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.rows: list[list[str]] = []
        self.images: list[str] = []
        self.external: list[str] = []
        self._in: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("h1", "h2", "h3"):
            self._in, self._text = tag, ""
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag in ("link", "iframe") or (
            tag in ("img", "script") and a.get("src") is not None and not a["src"].startswith("data:")
        ):
            self.external.append(tag)
        if tag == "tr":
            self._row = []
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag == self._in:
            self.headings.append(self._text.strip())
            self._in = None
        if tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._cell).strip())
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._in:
            self._text += data
        self._cell.append(data)


def _parse(text: str) -> _Collect:
    p = _Collect()
    p.feed(text)
    return p


def test_html_has_summary_tables_and_embedded_plots(tmp_path):
    path = write_html(make_report(), tmp_path / "r.html")
    text = path.read_text()
    page = _parse(text)
    assert page.headings[0] == "dabench-ir: tiny on fakechip"
    for heading in (
        "Summary",
        "Plots",
        "Top 7 of 8 nodes by time",
        "Attribution",
        "Time by op type",
        "Time by layer",
        "Time by bound class",
        "Unattributed nodes (1)",
    ):
        assert heading in page.headings, heading
    # roofline, layer plot, predicted vs measured: embedded PNGs, nothing loaded from elsewhere
    assert len(page.images) == 3
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        width, height = png_size(base64.b64decode(src.split(",", 1)[1]))
        assert width > 400 and height > 300
    assert page.external == []
    assert not re.search(r"(src|href)=\"https?://", text)
    # the top-nodes table: biggest first, with its share of time and the measured time
    top = next(r for r in page.rows if r and r[0] == "l1_mlp_matmul")
    assert top[:4] == ["l1_mlp_matmul", "MatMul", "1", "contraction"]
    assert "32.8%" in top and "95 µs" in top and "110 µs" in top
    body_rows = [r[0] for r in page.rows if r and r[0].startswith(("l0_", "l1_", "embed"))]
    assert body_rows[0] == "l1_mlp_matmul"
    # by bound class: compute 266 µs of 290 µs
    bound = next(r for r in page.rows if r and r[0] == "compute")
    assert bound[1] == "266 µs" and bound[2] == "91.7%"
    # the unattributed node, with its reason
    assert ["weird_op", "com.acme::Frobnicate", "no cost rule"] in page.rows


def test_html_cost_only_report(tmp_path):
    text = write_html(make_report(timed=False, measured=False, target=False), tmp_path / "c.html").read_text()
    page = _parse(text)
    assert "Top 7 of 8 nodes by FLOPs" in page.headings
    assert "FLOPs by op type" in page.headings
    assert len(page.images) == 1  # FLOPs by layer only: no roofs, no times, no measurements


def test_html_escapes_names(tmp_path):
    report = make_report()
    report.nodes[1].name = "<script>alert(1)</script>"
    text = write_html(report, tmp_path / "e.html").read_text()
    assert "<script>alert" not in text and "&lt;script&gt;alert" in text


def test_html_plot_dir_writes_png_and_svg(tmp_path):
    write_html(make_report(), tmp_path / "r.html", plot_dir=tmp_path / "plots", plot_stem="fake")
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "fake-roofline.png" in names and "fake-roofline.svg" in names and "fake-layers.svg" in names


def test_compare_html_links_and_errors():
    rows = [{"label": "a@x", "model": "tiny", "target": "x", "time_s": 1e-3, "fits": True}]
    text = render_compare_html(rows, links=[[("report", "x.html")]], errors={"y": "unknown target 'y'"})
    page = _parse(text)
    assert "Targets side by side" in page.headings and "Failed (1)" in page.headings
    assert '<a href="x.html">report</a>' in text
    assert ["y", "unknown target &#x27;y&#x27;"] in page.rows or ["y", "unknown target 'y'"] in page.rows
