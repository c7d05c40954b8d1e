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
        [*_flags(tmp_path / "profile"), f"--screenshot={shot}", "--window-size=1280,2000",
         "--enable-logging=stderr", "--v=0", page.resolve().as_uri()],
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
