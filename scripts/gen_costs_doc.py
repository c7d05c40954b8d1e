"""Rewrite the generated per-op table in docs/costs.md from the cost rule registry.

    .venv/bin/python scripts/gen_costs_doc.py          # rewrite the table in place
    .venv/bin/python scripts/gen_costs_doc.py --check  # exit 1 when the doc has drifted

The table lies between the marker comments that `render_costs_markdown()` writes; the prose
around it is kept. tests/test_op_traits.py runs the same check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dabench_ir.passes.cost_rules import render_costs_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "costs.md"


def splice(doc: str, table: str) -> str:
    """``doc`` with the block between ``table``'s first and last lines replaced by ``table``."""
    begin, end = table.splitlines()[0], table.splitlines()[-1]
    if begin not in doc or end not in doc:
        raise SystemExit(f"{DOC}: no generated-table markers; add the lines\n{begin}\n{end}")
    head, _, rest = doc.partition(begin)
    _, _, tail = rest.partition(end)
    return head + table.rstrip("\n") + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether docs/costs.md is up to date")
    args = parser.parse_args()
    doc = DOC.read_text()
    new = splice(doc, render_costs_markdown())
    if new == doc:
        return 0
    if args.check:
        print(f"{DOC} is out of date: run scripts/gen_costs_doc.py", file=sys.stderr)
        return 1
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
