"""Sweep plots (matplotlib Agg, PNG), each drawn only when the sweep varies its x axis.

allocation ratio vs layers and LI vs layers (a line per hidden size, a panel per target),
achieved TFLOP/s vs hidden, the fits boundary (layers × hidden, per target), throughput vs
batch and throughput vs chips.
"""

from __future__ import annotations

import io
import logging
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.fileio import write_output

if TYPE_CHECKING:
    from dabench_ir.sweep.executors import Executor

__all__ = ["render_plot", "target_label", "write_plots"]

logger = logging.getLogger(__name__)


def target_label(row: dict[str, Any]) -> str:
    """``rdu O1``, ``wse``: the target and its compile options, one panel each."""
    parts = [str(row.get("target"))] + [str(row[k]) for k in ("opt_level", "wse_mode") if row.get(k)]
    return " ".join(parts)


def _ok(rows: list[dict[str, Any]], *cols: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok" and all(r.get(c) is not None for c in cols)]


def _panels(plt: Any, n: int) -> tuple[Any, list[Any]]:
    cols = min(n, 3)
    nrows = (n + cols - 1) // cols
    # constrained layout places the panels, titles and the shared legend in one pass at save time
    # (tight_layout drew every figure once more)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols + 1.2, 3.4 * nrows), squeeze=False, layout="constrained")
    flat = [a for row in axes for a in row]
    for extra in flat[n:]:
        extra.set_visible(False)
    return fig, flat[:n]


def _legend(fig: Any, axes: list[Any]) -> None:
    """One legend for the figure, right of the panels: every panel shares the series' colours."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize=7)


def _order(value: Any) -> tuple[int, float, str]:
    """Series in numeric order (hidden 768 before 1024), then by name."""
    return (0, float(value), "") if isinstance(value, (int, float)) else (1, 0.0, str(value))


def _lines(
    plt: Any,
    rows: list[dict[str, Any]],
    x: str,
    y: str,
    series: str,
    title: str,
    ylabel: str,
    *,
    logx: bool = False,
    logy: bool = False,
) -> Any:
    """One panel per target, one line per value of ``series``."""
    by_target: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_target[target_label(r)].append(r)
    if not by_target:
        raise ValueError(f"no point has {y}")  # skipped, said in the log: e.g. every point failed
    fig, axes = _panels(plt, len(by_target))
    # one colour per series value in every panel, so that the figure's one legend reads for all
    values = sorted({r.get(series) for r in rows} - {None}, key=_order)
    ramp = plt.get_cmap("viridis")  # more series than the 10 cycle colours: an ordered ramp
    colour = {s: f"C{i}" if len(values) <= 10 else ramp(i / (len(values) - 1)) for i, s in enumerate(values)}
    for ax, (label, trows) in zip(axes, sorted(by_target.items()), strict=True):
        lines: dict[Any, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in trows:
            lines[r.get(series)][r[x]].append(float(r[y]))
        shared = lines.pop(None, None) if len(lines) > 1 else None
        for pts in lines.values() if shared else ():  # e.g. the 1-chip point starts every strategy's line
            for xv, ys in shared.items():
                pts[xv].extend(ys)
        for s, pts in sorted(lines.items(), key=lambda kv: _order(kv[0])):
            xs = sorted(pts)
            ax.plot(
                xs,
                [sum(pts[v]) / len(pts[v]) for v in xs],
                marker="o",
                ms=3,
                label=f"{series} {s}",
                color=colour.get(s),
            )
        ax.set_title(label)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    _legend(fig, axes)
    fig.suptitle(title)
    return fig


def _fits(plt: Any, rows: list[dict[str, Any]]) -> Any:
    by_target: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_target[target_label(r)].append(r)
    if not by_target:
        raise ValueError("no point has the figure")  # skipped, said in the log: e.g. every point failed
    fig, axes = _panels(plt, len(by_target))
    for ax, (label, trows) in zip(axes, sorted(by_target.items()), strict=True):
        yes = [(r["layers"], r["hidden"]) for r in trows if str(r["fits"]).lower() == "true"]
        no = [(r["layers"], r["hidden"]) for r in trows if str(r["fits"]).lower() != "true"]
        if yes:
            ax.scatter(*zip(*yes, strict=True), marker="o", c="tab:green", label="fits")
        if no:
            ax.scatter(*zip(*no, strict=True), marker="x", c="tab:red", label="does not fit")
        ax.set_title(label)
        ax.set_xlabel("layers")
        ax.set_ylabel("hidden")
        ax.grid(alpha=0.3)
    _legend(fig, axes)
    fig.suptitle("Fits on one chip (layers × hidden)")
    return fig


_TPUT = "throughput_samples_per_s"

_PLOTS: dict[str, tuple[set[str], Callable[[Any, list[dict[str, Any]]], Any]]] = {
    "allocation_vs_layers.png": (
        {"layers"},
        lambda plt, rows: _lines(
            plt,
            _ok(rows, "allocation_ratio"),
            "layers",
            "allocation_ratio",
            "hidden",
            "Resource allocation ratio vs layers",
            "allocation ratio",
        ),
    ),
    "li_vs_layers.png": (
        {"layers"},
        lambda plt, rows: _lines(
            plt,
            _ok(rows, "load_imbalance"),
            "layers",
            "load_imbalance",
            "hidden",
            "Load imbalance (LI = mean/max) vs layers",
            "LI",
        ),
    ),
    "tflops_vs_hidden.png": (
        {"hidden"},
        lambda plt, rows: _lines(
            plt,
            _ok(rows, "achieved_tflops"),
            "hidden",
            "achieved_tflops",
            "layers",
            "Achieved TFLOP/s vs hidden",
            "TFLOP/s",
        ),
    ),
    "fits_boundary.png": ({"layers", "hidden"}, lambda plt, rows: _fits(plt, _ok(rows, "fits"))),
    "throughput_vs_batch.png": (
        {"batch"},
        lambda plt, rows: _lines(
            plt, _ok(rows, _TPUT), "batch", _TPUT, "precision", "Throughput vs batch", "samples/s", logx=True, logy=True
        ),
    ),
    "throughput_vs_chips.png": (
        {"chips"},
        lambda plt, rows: _lines(
            plt, _ok(rows, _TPUT), "chips", _TPUT, "strategy", "Throughput vs chips", "samples/s", logx=True
        ),
    ),
}
"""Each sweep plot: the axes the sweep must vary for it, and how it is drawn from the rows."""


def render_plot(name: str, rows: list[dict[str, Any]]) -> bytes | str:
    """Plot ``name`` of ``rows`` as PNG bytes, or why it is skipped (e.g. every point failed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        fig = _PLOTS[name][1](plt, rows)
    except (ValueError, KeyError, TypeError) as exc:
        return str(exc)
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        return buffer.getvalue()
    finally:
        plt.close(fig)


def write_plots(
    folder: Path, rows: list[dict[str, Any]], varied: set[str], executor: Executor | None = None
) -> list[Path]:
    """Write the plots that apply to what the sweep varies; returns the files written.

    With ``executor`` (the sweep's workers, idle once the points are done) the figures are drawn in
    parallel there, a task each, and written here; without, one after another in this process.
    """
    from dabench_ir.sweep.executors import SerialExecutor, WorkerLost

    names = [name for name, (needs, _) in _PLOTS.items() if needs <= varied] if rows else []
    drawn: dict[str, bytes | str] = {}
    for i, out in (executor or SerialExecutor()).map_unordered([(render_plot, (name, rows)) for name in names]):
        if isinstance(out, WorkerLost):  # the figure is not lost with the worker: drawn here instead
            logger.info("plot %s: %s; drawing it here", names[i], out)
            out = render_plot(names[i], rows)
        drawn[names[i]] = out
    written = []
    for name in names:  # in the table's order, whatever order they were drawn in
        if isinstance(drawn[name], str):
            logger.warning("plot %s skipped: %s", name, drawn[name])
            continue
        written.append(write_output(folder / name, drawn[name]))
    return written
