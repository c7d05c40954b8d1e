#!/usr/bin/env python
"""Regenerate docs/validation.md's table, docs/img/validation-*.png and the pinned baseline.

Runs the bundled measurement catalogue (`dabench-ir validate`), then:

- replaces the text between the ``<!-- validation:* -->`` markers of docs/validation.md
  (the catalogue format, copied from dabench_ir/data/measurements/README.md; the table;
  the figures), leaving the hand-written rest alone;
- writes one figure per target to docs/img/validation-<target>.png;
- writes tests/data/validation_baseline.json, the errors tests/test_validate.py pins.

Run it after a change that improves the errors:  .venv/bin/python scripts/validation_report.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from dabench_ir import validate
from dabench_ir.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "validation.md"
IMG = ROOT / "docs" / "img"
BASELINE = ROOT / "tests" / "data" / "validation_baseline.json"
FORMAT_DOC = ROOT / "dabench_ir" / "data" / "measurements" / "README.md"


def _replace(text: str, name: str, body: str) -> str:
    start, end = f"<!-- validation:{name}:start -->", f"<!-- validation:{name}:end -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: markers {start} ... {end} are missing")
    return pattern.sub(lambda _m: f"{start}\n{body.rstrip()}\n{end}", text)


def _format_section() -> str:
    text = FORMAT_DOC.read_text()
    i = text.index("## Catalogue format")
    section = text[i:].replace("## ", "### ", 1)
    return re.sub(r"^### (?!Catalogue)", "#### ", section, flags=re.M)


def main() -> int:
    progress = Progress()
    try:
        result = validate.run_validation(validate.load_catalog(), say=progress, bar=progress.bar)
    finally:
        progress.done()
    figures = validate.write_plots(result, IMG)
    table = "```\n" + result.format_table() + "\n```"
    figs = "\n\n".join(f"![{p.stem}](img/{p.name})" for p in figures)
    text = DOC.read_text()
    text = _replace(text, "format", _format_section())
    text = _replace(text, "table", table)
    text = _replace(text, "figures", figs)
    DOC.write_text(text)
    BASELINE.parent.mkdir(parents=True, exist_ok=True)
    BASELINE.write_text(json.dumps(validate.baseline(result), indent=1, sort_keys=True) + "\n")
    summary = result.format_table().splitlines()
    print("\n".join(summary[summary.index("") + 1 :]))
    print(f"wrote {DOC.relative_to(ROOT)}, {BASELINE.relative_to(ROOT)}, {len(figures)} figure(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
