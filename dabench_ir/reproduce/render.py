"""A study's findings as tables: the terminal's, findings.csv, findings.json and findings.md."""

from __future__ import annotations

import csv
import io
import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dabench_ir.reproduce.run import FindingOutcome
    from dabench_ir.reproduce.study import Study

__all__ = ["SCHEMA", "findings_doc", "findings_markdown", "findings_table", "summary_line", "write_findings"]

SCHEMA = "dabench-ir/reproduce/v1"

CSV_COLUMNS = ("id", "level", "experiment", "kind", "claim", "source", "metric", "paper", "paper_text", "value",
               "tool", "accept_text", "reproduced", "mechanism", "reason", "detail", "note")  # fmt: skip


def _clean(obj: Any) -> Any:
    """JSON-safe: an infinite bound as the text ``inf``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else None)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def summary_line(outcomes: Sequence[FindingOutcome]) -> str:
    """``N of M findings reproduced``."""
    return f"{sum(1 for o in outcomes if o.reproduced)} of {len(outcomes)} findings reproduced"


def findings_doc(study: Study, outcomes: Sequence[FindingOutcome]) -> dict[str, Any]:
    """findings.json: the study, the tool's version and every outcome."""
    from dabench_ir import __version__

    return _clean({
        "schema": SCHEMA,
        "study": study.name,
        "title": study.title,
        "source": study.source,
        "origin": study.origin,
        "dabench_ir": __version__,
        "reproduced": sum(1 for o in outcomes if o.reproduced),
        "total": len(outcomes),
        "findings": [o.to_dict() for o in outcomes],
    })  # fmt: skip


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


def findings_markdown(study: Study, outcomes: Sequence[FindingOutcome]) -> str:
    """findings.md: a title, the count, and one table row per finding."""
    from dabench_ir import __version__

    lines = [f"# {study.title}", ""]
    if study.source:
        lines += [f"Source: {study.source}", ""]
    lines += [f"dabench-ir {__version__}: {summary_line(outcomes)}.", ""]
    head = ("id", "level", "claim", "source", "paper", "tool", "accept", "reproduced", "mechanism", "reason")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in outcomes:
        cells = (o.id, o.level or "", o.claim, o.source, o.paper_text, o.tool, o.accept_text,
                 "yes" if o.reproduced else "no", o.mechanism, o.reason)  # fmt: skip
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_findings(out: Path, study: Study, outcomes: Sequence[FindingOutcome]) -> list[Path]:
    """Write findings.csv, findings.json and findings.md into ``out`` (atomically); returns them."""
    from dabench_ir.fileio import write_output

    text = json.dumps(findings_doc(study, outcomes), indent=1, allow_nan=False, default=str) + "\n"
    return [
        write_output(out / "findings.csv", _csv(outcomes)),
        write_output(out / "findings.json", text),
        write_output(out / "findings.md", findings_markdown(study, outcomes)),
    ]


def _short(text: str, width: int) -> str:
    return textwrap.shorten(" ".join(str(text).split()), width, placeholder="...") if text else "-"


def findings_table(outcomes: Sequence[FindingOutcome], *, unicode: bool = True, width: int = 40) -> str:
    """The terminal's table: id, claim, paper, tool, verdict, mechanism (shortened); then why each
    unreproduced finding is not, and the count line."""
    yes, no = ("✓", "✗") if unicode else ("yes", "NO")
    rows = [("id", "claim", "paper", "tool", "ok", "mechanism")]
    for o in outcomes:
        rows.append((o.id, _short(o.claim, width), _short(o.paper_text, 18), _short(o.tool, 28),
                     yes if o.reproduced else no, _short(o.mechanism, width)))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    misses = [o for o in outcomes if not o.reproduced]
    if misses:
        lines += ["", "not reproduced:"]
        for o in misses:
            lines.append(f"  {o.id}: {' '.join(o.reason.split()) or 'no reason given'}")
            if o.note:  # the study's account of why (what the model lacks, what the paper may measure)
                lines += textwrap.wrap(" ".join(o.note.split()), 100, initial_indent="      why: ",
                                       subsequent_indent="      ")  # fmt: skip
    lines += ["", summary_line(outcomes)]
    text = "\n".join(lines)
    return text if unicode else text.encode("ascii", "replace").decode("ascii")
