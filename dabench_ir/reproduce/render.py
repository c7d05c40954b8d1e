"""A study's findings as tables: the terminal's, findings.csv, findings.json and findings.md."""

from __future__ import annotations

import csv
import io
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dabench_ir.reproduce.run import FindingOutcome
    from dabench_ir.reproduce.study import Study

__all__ = [
    "DOC_BEGIN",
    "DOC_END",
    "MARKS",
    "SCHEMA",
    "counts",
    "docs_table",
    "findings_doc",
    "findings_markdown",
    "findings_table",
    "summary_line",
    "write_findings",
]

SCHEMA = "dabench-ir/reproduce/v1"

CSV_COLUMNS = (
    "id",
    "level",
    "table",
    "experiment",
    "kind",
    "claim",
    "source",
    "metric",
    "paper",
    "paper_text",
    "value",
    "tool",
    "grading",
    "accept_text",
    "verdict",
    "reproduced",
    "provenance",
    "fitted",
    "counterfactual",
    "counterfactual_tool",
    "counterfactual_reproduced",
    "mechanism",
    "reason",
    "detail",
    "note",
)

TABLE_TITLES = {"paper": "the paper's findings", "artifact": "checks against the paper's artifact"}
"""Each table's name (`study.TABLES`), as the counts line says it."""


def _heading(table: str) -> str:
    return TABLE_TITLES[table][0].upper() + TABLE_TITLES[table][1:]


def _clean(obj: Any) -> Any:
    """JSON-safe: an infinite bound as the text ``inf``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else None)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def counts(outcomes: Sequence[FindingOutcome]) -> dict[str, int]:
    """How many findings are reproduced and predicted, reproduced in sample, not a test, not reproduced."""
    return {
        "total": len(outcomes),
        "predicted": sum(1 for o in outcomes if o.reproduced and not o.fitted),
        "in_sample": sum(1 for o in outcomes if o.reproduced and o.fitted),
        "not_a_test": sum(1 for o in outcomes if o.verdict == "not a test"),
        "not_reproduced": sum(1 for o in outcomes if o.verdict == "not reproduced"),
    }


def _by_table(outcomes: Sequence[FindingOutcome]) -> dict[str, list[FindingOutcome]]:
    return {t: [o for o in outcomes if o.table == t] for t in TABLE_TITLES if any(o.table == t for o in outcomes)}


def _counts_text(c: dict[str, int]) -> str:
    return (
        f"{c['predicted']} of {c['total']} reproduced as predicted, {c['in_sample']} in sample; "
        f"{c['not_a_test']} not a test, {c['not_reproduced']} not reproduced"
    )


def summary_line(outcomes: Sequence[FindingOutcome]) -> str:
    """``N of M reproduced as predicted, K in sample; T not a test, X not reproduced``, one line per
    table (the paper's findings, the artifact checks)."""
    return "\n".join(f"{TABLE_TITLES[t]}: {_counts_text(counts(mine))}" for t, mine in _by_table(outcomes).items())


def findings_doc(study: Study, outcomes: Sequence[FindingOutcome]) -> dict[str, Any]:
    """findings.json: the study, the tool's version, the counts per table and every outcome."""
    from dabench_ir import __version__

    return _clean(
        {
            "schema": SCHEMA,
            "study": study.name,
            "title": study.title,
            "source": study.source,
            "origin": study.origin,
            "dabench_ir": __version__,
            "reproduced": sum(1 for o in outcomes if o.reproduced),
            "total": len(outcomes),
            "counts": {table: counts(mine) for table, mine in _by_table(outcomes).items()},
            "findings": [o.to_dict() for o in outcomes],
        }
    )


def _csv(outcomes: Sequence[FindingOutcome]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for o in outcomes:
        row = _clean(o.to_dict())
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def _md_cell(text: Any) -> str:
    return " ".join(str("" if text is None else text).split()).replace("|", "\\|")


def fitted_text(fitted: Sequence[str], shown: int = 3) -> str:
    """``wse2 compute.vector_flops.fp16, ... (15 parameters)``: the first few of a finding's fitted parameters."""
    more = f", ... ({len(fitted)} parameters)" if len(fitted) > shown else ""
    return ", ".join(fitted[:shown]) + more


MARKS = {"reproduced": ("✓", "yes"), "not reproduced": ("✗", "NO"), "not a test": ("○", "n/t")}
"""How a verdict is shown (unicode, ascii)."""


def _cf_text(o: FindingOutcome, *, what: bool = True) -> str:
    """The counterfactual's figure and fate (``+70.1% (fails)``), after what it switches off."""
    if not o.counterfactual:
        return "none"
    fate = {True: "still holds", False: "fails", None: "not run"}[o.counterfactual_reproduced]
    shown = fate if o.counterfactual_reproduced is None else f"{o.counterfactual_tool} ({fate})"
    return f"{o.counterfactual}: {shown}" if what else shown


def findings_markdown(study: Study, outcomes: Sequence[FindingOutcome]) -> str:
    """findings.md: a title, the counts, and one table per kind of finding (the paper's, the artifact's)."""
    from dabench_ir import __version__

    lines = [f"# {study.title}", ""]
    if study.source:
        lines += [f"Source: {study.source}", ""]
    lines += [f"dabench-ir {__version__}:", ""] + [f"- {line}" for line in summary_line(outcomes).splitlines()]
    head = (
        "id",
        "level",
        "claim",
        "paper",
        "band",
        "tool",
        "verdict",
        "provenance",
        "counterfactual",
        "mechanism",
        "reason",
    )
    for table, mine in _by_table(outcomes).items():
        lines += ["", f"## {_heading(table)}", ""]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for o in mine:
            cells = (
                o.id,
                o.level or "",
                o.claim,
                o.paper_text,
                o.accept_text,
                o.tool,
                o.verdict,
                o.provenance + (f" ({fitted_text(o.fitted)})" if o.fitted else ""),
                _cf_text(o),
                o.mechanism,
                o.reason,
            )
            lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


DOC_BEGIN, DOC_END = "<!-- findings:begin -->", "<!-- findings:end -->"
"""The markers of the generated findings table in docs/reproduce.md (`docs_table`)."""


def docs_table(doc: dict[str, Any]) -> str:
    """The findings table docs/reproduce.md carries, from a run's findings.json (``doc``): the
    counts, then per table each finding's paper figure, band, tool figure, verdict, provenance and
    counterfactual figure. `scripts/reproduce_docs.py` writes it; a test compares it with a run."""
    lines = []
    for table in TABLE_TITLES:
        mine = [f for f in doc["findings"] if f["table"] == table]
        if not mine:
            continue
        lines += [
            "",
            f"**{_heading(table)}**: {_counts_text(doc['counts'][table])}.",
            "",
            "| id | claim | paper | band | tool | verdict | provenance | counterfactual: its figure |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for f in mine:
            cf = "none" if not f["counterfactual"] else f"{f['counterfactual']}: {f['counterfactual_tool']}"
            cells = (
                f["id"],
                f["claim"],
                f["paper_text"],
                f["accept_text"],
                f["tool"],
                f["verdict"],
                f["provenance"],
                cf,
            )
            lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines[1:])


def write_findings(out: Path, study: Study, outcomes: Sequence[FindingOutcome]) -> list[Path]:
    """Write findings.csv, findings.json and findings.md into ``out`` (atomically); returns them."""
    from dabench_ir.fileio import write_output
    from dabench_ir.report.model import json_text

    text = json_text(findings_doc(study, outcomes), indent=1) + "\n"
    return [
        write_output(out / "findings.csv", _csv(outcomes)),
        write_output(out / "findings.json", text),
        write_output(out / "findings.md", findings_markdown(study, outcomes)),
    ]


def _short(text: str, width: int) -> str:
    return textwrap.shorten(" ".join(str(text).split()), width, placeholder="...") if text else "-"


def findings_table(outcomes: Sequence[FindingOutcome], *, unicode: bool = True, width: int = 34) -> str:
    """The terminal's tables (the paper's findings, then the artifact checks): id, claim, paper,
    band, tool, verdict, provenance, counterfactual; then why each finding that is not reproduced
    is not, why each that is not a test cannot fail, and the counts."""
    mark = {v: m[0 if unicode else 1] for v, m in MARKS.items()}
    lines: list[str] = []
    for table, mine in _by_table(outcomes).items():
        rows = [("id", "claim", "paper", "band", "tool", "ok", "basis", "counterfactual (its figure)")]
        for o in mine:
            band = o.accept_text.split(": ", 1)[-1] if o.accept else o.accept_text
            rows.append(
                (
                    o.id,
                    _short(o.claim, width),
                    _short(o.paper_text, 16),
                    _short(band, 26),
                    _short(o.tool, 26),
                    mark[o.verdict],
                    o.provenance,
                    _cf_text(o, what=False),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        if lines:
            lines.append("")
        lines.append(_heading(table))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows[:1]]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows[1:]]
    for verdict, title in (
        ("not reproduced", "not reproduced:"),
        ("not a test", "not a test (could not have failed):"),
    ):
        misses = [o for o in outcomes if o.verdict == verdict]
        if misses:
            lines += ["", title]
        for o in misses:
            lines.append(f"  {o.id}: {' '.join(o.reason.split()) or 'no reason given'}")
            if o.note and verdict == "not reproduced":  # the study's account of why (what the model lacks)
                lines += textwrap.wrap(
                    " ".join(o.note.split()), 100, initial_indent="      why: ", subsequent_indent="      "
                )
    fitted = [o for o in outcomes if o.reproduced and o.fitted]
    if fitted:
        lines += ["", "in sample (a parameter was fitted to the figure checked):"]
        lines += [f"  {o.id}: {fitted_text(o.fitted)}" for o in fitted]
    lines += ["", summary_line(outcomes)]
    text = "\n".join(lines)
    return text if unicode else text.encode("ascii", "replace").decode("ascii")
