"""Writing a validation: JSON, CSV and per-target plots, and the regression guard against a
pinned baseline.

Matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dabench_ir.report.table import percent
from dabench_ir.validate.catalog import HEADLINE, Point
from dabench_ir.validate.results import PointResult, Validation

__all__ = ["baseline", "regressions", "write_csv", "write_json", "write_plots"]


_COLUMNS = (
    "id",
    "target",
    "kind",
    "status",
    "quantity",
    "measured",
    "predicted",
    "rel_error",
    "note",
    "fits_expected",
    "fits_predicted",
    "fit_verdict",
    "ignored",
    "reference_only",
    "in_sample",
    "informed",
    "reason",
    "source",
)


def write_json(validation: Validation, path: str | Path) -> Path:
    """The summary and every row as JSON (schema ``dabench-ir/validation/v1``)."""
    from dabench_ir.fileio import write_output
    from dabench_ir.report.model import json_text

    return write_output(path, json_text(validation.to_dict(), indent=1) + "\n")  # NaN and infinity as null


def write_csv(validation: Validation, path: str | Path) -> Path:
    """One row per point and quantity (columns: see ``_COLUMNS``)."""
    from dabench_ir.fileio import write_with
    from dabench_ir.report.model import csv_cell

    def write(fh: Any) -> None:
        writer = csv.DictWriter(fh, fieldnames=list(_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in validation.rows():
            writer.writerow({k: csv_cell(v) for k, v in row.items()})

    return write_with(path, write)


def write_plots(validation: Validation, folder: str | Path, *, prefix: str = "validation-") -> list[Path]:
    """One PNG per target: predicted (open) and measured (filled) on the same axes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    by_target: dict[str, list[PointResult]] = {}
    for r in validation.results:
        by_target.setdefault(r.point.target, []).append(r)
    paths = []
    for target, results in by_target.items():
        fig = _target_figure(target, results)
        if fig is None:
            continue
        from dabench_ir.report.plots import save_figure

        paths.append(save_figure(fig, folder / f"{prefix}{target}.png"))
    return paths


def _series_key(p: Point) -> str:
    """Points differing only in layers form one series (a depth sweep)."""
    model = {k: v for k, v in p.model.items() if k != "layers"}
    label = ", ".join(f"{k} {v}" for k, v in model.items() if k in ("hidden", "seq", "batch"))
    opts = ", ".join(f"{v}" for k, v in p.run.items() if k in ("opt_level", "wse_mode", "ipus"))
    return f"{opts} {label}".strip()


def _target_figure(target: str, results: list[PointResult]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def value(r: PointResult, name: str) -> tuple[float | None, float | None]:
        for q in r.quantities:
            if q.name == name:
                return q.measured, q.predicted
        return None, None

    model = [r for r in results if r.point.kind == "model" and value(r, HEADLINE)[0] is not None]
    micro = [r for r in results if r.point.kind != "model" and r.quantities]
    series: dict[str, list[PointResult]] = {}
    for r in model:
        series.setdefault(_series_key(r.point), []).append(r)
    sweeps = {k: v for k, v in series.items() if len({r.point.model["layers"] for r in v}) > 1}
    singles = [r for k, v in series.items() if k not in sweeps for r in v]
    panels = [x for x in (sweeps, singles, micro) if x]
    if not panels:
        return None
    fig = Figure(figsize=(6.0 * len(panels), 4.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]

    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
    ax_i = 0
    if sweeps:
        ax = axes[ax_i]
        ax_i += 1
        for c, (label, rs) in enumerate(sweeps.items()):
            rs = sorted(rs, key=lambda r: r.point.model["layers"])
            xs = [r.point.model["layers"] for r in rs]
            meas = [value(r, HEADLINE)[0] for r in rs]
            pred = [value(r, HEADLINE)[1] for r in rs]
            color = colors[c % len(colors)]
            ax.plot(xs, meas, "o-", color=color, label=f"{label}: measured")
            if any(v is not None for v in pred):
                ax.plot(
                    xs,
                    [v if v is not None else math.nan for v in pred],
                    "s--",
                    color=color,
                    mfc="none",
                    label=f"{label}: predicted",
                )
        ax.set_xlabel("decoder layers")
        ax.set_ylabel("throughput (samples/s)")
        ax.set_yscale("log")
        ax.set_title(f"{target}: throughput vs depth")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    for group, title, ylabel in ((singles, "throughput per model", "samples/s"), (micro, "microbenchmarks", "value")):
        if not group:
            continue
        ax = axes[ax_i]
        ax_i += 1
        labels, meas, pred, nofit = [], [], [], []
        for r in group:
            names = [HEADLINE] if r.point.kind == "model" else [q.name for q in r.quantities]
            for name in names:
                m, pr = value(r, name)
                if m is None:
                    continue
                labels.append(r.point.id if r.point.kind == "model" else f"{r.point.id}\n{name}")
                meas.append(m)
                pred.append(pr if pr is not None else math.nan)
                if r.fits_predicted is False:
                    nofit.append((len(labels) - 1, m))
        xs = list(range(len(labels)))
        ax.scatter(xs, meas, marker="o", color="#1f77b4", label="measured", zorder=3)
        ax.scatter(xs, pred, marker="s", facecolors="none", edgecolors="#d62728", label="predicted", zorder=3)
        for x, m in nofit:
            ax.annotate(
                "tool: does not fit", (x, m), xytext=(6, -3), textcoords="offset points", fontsize=7, color="#d62728"
            )
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{target}: {title}")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


# -- regression guard ---------------------------------------------------------------------------------


def baseline(validation: Validation) -> dict[str, Any]:
    """Each point's status, fit verdict and |relative error| per quantity: what a rerun must not worsen."""
    points: dict[str, Any] = {}
    for r in validation.results:
        points[r.point.id] = {
            "status": r.status,
            "fit_verdict": r.fit_verdict,
            "abs_errors": {q.name: (abs(q.error) if q.error is not None else None) for q in r.quantities},
        }
    return {"schema": "dabench-ir/validation-baseline/v1", "points": points}


def regressions(
    validation: Validation, pinned: Mapping[str, Any], *, abs_tol: float = 0.01, rel_tol: float = 0.02
) -> list[str]:
    """What got worse than ``pinned`` (a `baseline`): one line per regression, empty when none.

    Worse: a pinned point missing or no longer run; a fit verdict that was right and is now
    wrong; a predicted quantity no longer predicted; an |error| above pinned x (1 + rel_tol) + abs_tol.
    """
    now = baseline(validation)["points"]
    problems = []
    for pid, old in pinned.get("points", {}).items():
        new = now.get(pid)
        if new is None:
            problems.append(f"{pid}: pinned point is missing from the catalogue run")
            continue
        if old["status"] == "ok" and new["status"] != "ok":
            reason = next((r.reason for r in validation.results if r.point.id == pid), "")
            problems.append(f"{pid}: ran before, cannot run now ({reason})")
            continue
        if old.get("fit_verdict") == "right" and new.get("fit_verdict") == "wrong":
            problems.append(f"{pid}: fit verdict flipped from right to wrong")
        for name, err in old.get("abs_errors", {}).items():
            if err is None:
                continue
            cur = new["abs_errors"].get(name)
            if cur is None:
                problems.append(f"{pid}: {name} was predicted (|error| {percent(err)}), is not now")
            elif cur > err * (1 + rel_tol) + abs_tol:
                problems.append(f"{pid}: {name} |error| {percent(cur)} is worse than the pinned {percent(err)}")
    return problems
