"""Write the bundled DABench study's findings table into docs/reproduce.md, from a run.

    .venv/bin/python scripts/reproduce_docs.py                 # run the study (out/reproduce-dabench), then write
    .venv/bin/python scripts/reproduce_docs.py --from OUT      # from a finished run's OUT/findings.json

The table between the ``<!-- findings:begin -->`` and ``<!-- findings:end -->`` markers is never
written by hand: tests/test_reproduce_verdicts.py runs the study and fails when the table differs
from what the run gives (a refit that moves a finding must come with this table regenerated).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dabench_ir.reproduce.render import DOC_BEGIN, DOC_END, docs_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "reproduce.md"


def with_table(text: str, table: str) -> str:
    """``text`` (docs/reproduce.md) with its generated block replaced by ``table``."""
    head, rest = text.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    return f"{head}{DOC_BEGIN}\n{table}\n{DOC_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="source", metavar="OUT", help="a finished run's folder (default: run the study)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    if args.source:
        out = Path(args.source)
    else:
        from dabench_ir.reproduce import load_study, run_study

        out = Path("out/reproduce-dabench")
        run_study(load_study("dabench"), out, jobs=args.jobs, plots=False)
    doc = json.loads((out / "findings.json").read_text())
    if doc.get("study") != "dabench":
        raise SystemExit(f"{out}: a run of study {doc.get('study')!r}, not of dabench")
    DOC.write_text(with_table(DOC.read_text(), docs_table(doc)))
    print(f"{DOC}: findings table written from {out / 'findings.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
