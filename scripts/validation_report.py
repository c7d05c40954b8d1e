#!/usr/bin/env python
"""Regenerate docs/validation.md's table, docs/img/validation-*.png and the pinned baseline.

Runs the bundled measurement catalogue (`dabench-ir validate`), then:

- replaces the text between the ``<!-- validation:* -->`` markers of docs/validation.md
  (the catalogue format, copied from dabench_ir/data/measurements/README.md; what the catalogue
  holds, by source; the table; the figures), leaving the hand-written rest alone;
- writes one figure per target to docs/img/validation-<target>.png;
- writes tests/data/validation_baseline.json, the errors tests/test_validate.py pins.

Run it after a change that improves the errors:  .venv/bin/python scripts/validation_report.py

``--host``: instead, run the host points (`dabench-ir validate --target cpu`, measured live on
this machine) and replace only the text between the ``<!-- validation:host:* -->`` markers
with their table (nothing else is written: no figures, no baseline).
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


def _host_table(result: validate.Validation) -> str:
    """The host points as a markdown table: errors beside the measurement's noise (IQR/median)."""

    def pc(x: object) -> str:
        return "-" if not isinstance(x, int | float) else f"{100 * x:.1f}%"

    lines = [
        "| model | measured | predicted | end-to-end error | e2e noise | median node error | p90 | "
        "median node noise | nodes within noise |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.results:
        h = r.host
        if r.status != "ok" or not h:
            lines.append(f"| {r.point.id} | cannot run: {r.reason} | | | | | | | |")
            continue
        q = r.quantities[0]
        lines.append(
            f"| {h['label']} | {q.measured * 1e3:.2f} ms | {q.predicted * 1e3:.2f} ms | "
            f"{pc(h.get('end_to_end_rel_error'))} | {pc(h.get('end_to_end_spread'))} | "
            f"{pc(h.get('median_node_rel_error'))} | {pc(h.get('p90_node_rel_error'))} | "
            f"{pc(h.get('median_node_spread'))} | {h.get('nodes_within_noise')}/{h.get('nodes_compared')} |"
        )
    return "\n".join(lines)


def _host_main() -> int:
    import os
    import time

    progress = Progress()
    try:
        result = validate.run_validation(validate.load_catalog(), target="cpu", say=progress, bar=progress.bar)
    finally:
        progress.done()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    table = _host_table(result) + (
        f"\n\nMeasured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} CPUs, "
        f"load average after {load}; repeat = auto; errors over nodes taking >= 1% of the time."
    )
    DOC.write_text(_replace(DOC.read_text(), "host", table))
    print(table)
    return 0


def _informed_table(result: validate.Validation) -> str:
    """Per point, the parameters fitted to it (from the target files' ``fitted_to``); out of sample: none.
    A reference-only point (another chip generation, left out of the statistics) is marked ``(ref)``."""
    lines = ["| point | target | sample | parameters fitted to it |", "|---|---|---|---|"]
    for r in result.results:
        names = ", ".join(f"`{n}`" for n in r.informed) or "none"
        sample = ("in" if r.in_sample else "out") + (" (ref)" if r.point.reference_only else "")
        lines.append(f"| `{r.point.id}` | {r.point.target} | {sample} | {names} |")
    return "\n".join(lines)


def holdings_table(points: list[validate.Point]) -> str:
    """What the catalogue holds: per target and source (`crossval.source_of`, the unit cross-validation
    leaves out), its points by kind, how many a parameter is fitted to (the target file's
    ``fitted_to``) and how many are reference only (another chip generation). Built from the
    catalogue and the target files alone: tests/test_validate.py checks the docs' copy against it."""
    from dabench_ir.targets import load_target
    from dabench_ir.validate.crossval import source_of

    groups: dict[tuple[str, str], list[validate.Point]] = {}
    for p in points:
        groups.setdefault((p.target, source_of(p)), []).append(p)
    lines = ["| target | source | points | kinds | in sample | reference only |", "|---|---|---|---|---|---|"]
    in_sample = ref = 0
    for (target, source), members in groups.items():
        fitted = load_target(target).fitted_on
        kinds = ", ".join(sorted({p.kind for p in members}))
        n_in = sum(1 for p in members if fitted(p.id))
        n_ref = sum(1 for p in members if p.reference_only)
        lines.append(f"| {target} | {source} | {len(members)} | {kinds} | {n_in} | {n_ref} |")
        in_sample, ref = in_sample + n_in, ref + n_ref
    sources = len({source for _, source in groups})
    lines.append(f"| **all** | {sources} sources | {len(points)} | | {in_sample} | {ref} |")
    return "\n".join(lines)


def main() -> int:
    if "--host" in sys.argv[1:]:
        return _host_main()
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
    text = _replace(text, "informed", _informed_table(result))
    text = _replace(text, "holdings", holdings_table(validate.load_catalog()))
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
