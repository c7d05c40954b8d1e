"""The HTML report in a real headless browser: it renders, shows its headings, logs no errors.

Needs chromium (Debian/Ubuntu package `chromium`); skipped with the reason when it is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dabench_ir.report.html import write_html
from tests.test_report_helpers import make_report, png_size

pytest.importorskip("matplotlib")


def _chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium) - headless HTML check skipped"
)


def _flags(profile: Path) -> list[str]:
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("html")
    return write_html(make_report(), folder / "report.html")


def test_screenshot_is_not_blank(page, tmp_path):
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            *_flags(tmp_path / "profile"),
            f"--screenshot={shot}",
            "--window-size=1280,2000",
            "--enable-logging=stderr",
            "--v=0",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file(), proc.stderr[-2000:]
    data = shot.read_bytes()
    assert png_size(data) == (1280, 2000)
    # a rendered page with plots and tables compresses far worse than a blank one (~10 kB)
    assert len(data) > 50_000
    console = [
        line for line in proc.stderr.splitlines() if re.search(r"Uncaught|CONSOLE\(|:CONSOLE|Console error", line)
    ]
    assert console == [], console


def test_dom_renders_headings_and_images(page, tmp_path):
    proc = subprocess.run(
        [*_flags(tmp_path / "profile"), "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = proc.stdout
    assert "<h2>Summary</h2>" in dom, proc.stderr[-2000:]
    for heading in ("Plots", "Attribution", "Top 7 of 8 nodes by time", "Unattributed nodes (1)"):
        assert heading in dom, heading
    assert dom.count('src="data:image/png;base64,') == 3
    assert "l1_mlp_matmul" in dom


_PROBE = """<script>
(function () {
  var table = Array.prototype.find.call(document.querySelectorAll("table.sortable"), function (t) {
    return t.tHead.rows[0].cells[0].textContent === "node";
  });
  var head = Array.prototype.find.call(table.tHead.rows[0].cells, function (h) { return h.textContent === "time"; });
  var col = Array.prototype.indexOf.call(table.tHead.rows[0].cells, head);
  head.click();  // descending
  head.click();  // ascending
  var names = Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[0].textContent; });
  var box = table.parentNode.previousElementSibling;
  box.value = "mlp";
  box.dispatchEvent(new Event("input"));
  var rows = Array.prototype.map.call(table.tBodies[0].rows, function (r) { return [r.hidden, r.textContent]; });
  document.body.setAttribute("data-sorted", JSON.stringify(names));
  document.body.setAttribute("data-rows", JSON.stringify(rows));
  document.body.setAttribute("data-col", String(col));
})();
</script>"""


def test_sort_and_filter_in_the_browser(tmp_path):
    """A click on the time header sorts the node table by time; the filter box hides the other rows."""
    import html as html_lib
    import json

    from dabench_ir.report.html import render_html

    report = make_report()
    page = tmp_path / "probe.html"
    page.write_text(render_html(report).replace("</body>", _PROBE + "</body>"))
    proc = subprocess.run(
        [*_flags(tmp_path / "profile"), "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body, proc.stderr[-2000:]
    attrs = dict((k, html_lib.unescape(v)) for k, v in re.findall(r'(data-[a-z]+)="([^"]*)"', body.group(1)))
    times = [report.node(name).time_s for name in json.loads(attrs["data-sorted"])]
    assert len(times) > 2 and times == sorted(times)  # ascending after the second click
    rows = json.loads(attrs["data-rows"])
    assert any(not hidden for hidden, _ in rows) and any(hidden for hidden, _ in rows)
    assert all(hidden == ("mlp" not in text.lower()) for hidden, text in rows)
