"""Report plots (matplotlib, Agg): roofline, time by layer, scaling, predicted vs measured.

Every ``*_figure`` function returns a matplotlib Figure (or None when the report has
nothing to draw); `save_figure` writes it as PNG or SVG by the path's suffix, and
`write_plots` writes the set that applies to a report. matplotlib is imported here only,
inside the functions, so profiling without plots never pays for it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model import NodeRecord, Report
from .table import seconds, short_percent

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "OP_CLASS_COLORS",
    "compare_figure",
    "layer_time_figure",
    "predicted_vs_measured_figure",
    "roofline_figure",
    "save_figure",
    "scale_figure",
    "target_of",
    "write_plots",
]

logger = logging.getLogger(__name__)

OP_CLASS_COLORS: dict[str, str] = {
    "contraction": "#1f77b4",
    "vector": "#ff7f0e",
    "data_movement": "#2ca02c",
    "communication": "#d62728",
    "other": "#7f7f7f",
}
"""Colour per op class, shared by every plot and the HTML legend."""

_ROOF_STYLES = ("-", "--", "-.", ":")


def _color(op_class: str | None) -> str:
    return OP_CLASS_COLORS.get(op_class or "other", OP_CLASS_COLORS["other"])


def _new_figure(width: float = 8.0, height: float = 5.0, ncols: int = 1) -> tuple[Figure, Any]:
    """A Figure on the Agg canvas (no pyplot state, no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.12, top=0.92, wspace=0.28)
    return fig, axes


def _log_axes(ax: Any) -> None:
    """Log-log axes with labelled decades only (minor tick labels cost seconds on wide ranges)."""
    from matplotlib.ticker import LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, numticks=12))
        axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0), numticks=12))
        axis.set_minor_formatter(NullFormatter())


def save_figure(fig: Figure, path: str | Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path``; the suffix (.png or .svg) picks the format."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise ValueError(f"plot format must be .png or .svg, got {path.name}")
    import matplotlib

    # svg.fonttype "none": text stays text (searchable, smaller) instead of glyph paths
    from dabench_ir.fileio import write_with

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dabench-ir"}):
        write_with(path, lambda fh: fig.savefig(fh, format=fmt, dpi=dpi), binary=True)
    return path


def target_of(report: Report) -> Any:
    """The report's Target: the live object, else loaded by name (never ``cpu``: that calibrates)."""
    if report.target_obj is not None:
        return report.target_obj
    from dabench_ir.targets import is_host, load_target

    name = (report.target or {}).get("name")
    if not name or is_host(name):
        return None
    try:
        return load_target(name)
    except Exception as exc:
        logger.info("no roofs for target %s: %s", name, exc)
        return None


def roofline_figure(report: Report, *, top: int = 6) -> Figure | None:
    """Roofline of ``report``'s target: a roof per (memory, dtype) that feeds a node, one point per timed node.

    Points and roofs are `attribution.roofline_points` / `roofline_roofs`: x the node's
    intensity at its feed level (the table's and JSON's ``intensity``), y its FLOPs over its
    busy time; the roofs at the nodes' dtypes, bandwidths of their feed memories (solid;
    memories feeding no node dashed, thin). Point size is the node's share of the summed
    time, colour its op class; the ``top`` nodes by time are labelled. None when there are
    neither roofs nor timed nodes to draw.
    """
    from .attribution import roofline_points, roofline_roofs

    target = target_of(report)
    pts = roofline_points(report, target)
    roofs = roofline_roofs(report, target) if target is not None else []
    if not roofs and not pts:
        return None
    fig, ax = _new_figure(8.5, 5.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_axes(ax)
    xs = [p["intensity"] for p in pts]
    lo = min([*xs, 0.1]) / 4
    hi = max([*xs, 1000.0]) * 4
    for r in roofs:
        lo, hi = min(lo, r["ridge"] / 20), max(hi, r["ridge"] * 20)
    grid = _logspace(lo, hi, 200)
    for i, r in enumerate(roofs):
        peak, bw = r["peak_flops_per_s"], r["bandwidth_bytes_per_s"]
        feeding = r["feeds"] > 0
        ax.plot(
            grid,
            [min(peak, x * bw) for x in grid],
            _ROOF_STYLES[i % len(_ROOF_STYLES)] if feeding else ":",
            color="#333333" if feeding else "#aaaaaa",
            linewidth=1.4 if feeding else 0.9,
            label=f"{r['memory']} ({r['level']}) roof at {r['precision']}, ridge {r['ridge']:.3g} FLOP/B"
            + (f", feeds {r['feeds']}" if feeding else ", feeds none"),
        )
    by_name = {n.name: n for n in report.nodes}
    by_class: dict[str, list[dict[str, Any]]] = {}
    for p in pts:
        by_class.setdefault(p["op_class"] or "other", []).append(p)
    for op_class, group in sorted(by_class.items()):
        ax.scatter(
            [p["intensity"] for p in group],
            [p["achieved_flops_per_s"] for p in group],
            s=[20 + 800 * (p["share"] or 0.0) for p in group],
            c=_color(op_class),
            alpha=0.7,
            edgecolors="black",
            linewidths=0.4,
            label=f"{op_class} ({len(group)})",
        )
    ranked = sorted(pts, key=lambda p: p["time_s"], reverse=True)
    triples = [(by_name[p["name"]], p["intensity"], p["achieved_flops_per_s"]) for p in ranked]
    share = {p["name"]: p["share"] or 0.0 for p in pts}
    for n, x, y in _spread(triples, top):
        ax.annotate(
            f"{n.role or n.name} ({short_percent(share[n.name])})",
            (x, y),
            xytext=(6, 4),
            textcoords="offset points",
            fontsize=7,
        )
    ax.set_xlim(lo, hi)
    hidden = sum(1 for n in report.nodes if n.time_s and not n.flops)
    name = (report.target or {}).get("name", "no target")
    note = f"; {hidden} zero-FLOP nodes not shown" if hidden else ""
    ax.set_title(f"Roofline on {name} ({report.config.get('precision') or 'fp32'}{note})", fontsize=10)
    ax.set_xlabel("arithmetic intensity at the feed level (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s (FLOPs / busy time)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _spread(points: list[tuple[NodeRecord, float, float]], top: int) -> list[tuple[NodeRecord, float, float]]:
    """The first ``top`` points that are not on top of an already chosen one (labels stay legible)."""
    chosen: list[tuple[NodeRecord, float, float]] = []
    for p in points:
        if len(chosen) >= top:
            break
        if all(abs(math.log10(p[1] / q[1])) > 0.15 or abs(math.log10(p[2] / q[2])) > 0.08 for q in chosen):
            chosen.append(p)
    return chosen


def _logspace(lo: float, hi: float, n: int) -> list[float]:
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def _layer_label(layer: int | None) -> str:
    return "outside" if layer is None else str(layer)


def layer_time_figure(report: Report) -> Figure | None:
    """Time per decoder layer, stacked by op class (FLOPs when the report has no times)."""
    timed = report.has_times
    cells: dict[tuple[int | None, str], float] = {}
    for n in report.nodes:
        value = n.time_s if timed else n.flops
        if value:
            key = (n.layer, n.op_class or "other")
            cells[key] = cells.get(key, 0.0) + float(value)
    if not cells:
        return None
    layers = sorted({k[0] for k in cells}, key=lambda x: (x is not None, x if x is not None else 0))
    classes = sorted(
        {k[1] for k in cells},
        key=lambda c: (c not in OP_CLASS_COLORS, list(OP_CLASS_COLORS).index(c) if c in OP_CLASS_COLORS else 0, c),
    )
    fig, ax = _new_figure(max(6.0, 0.5 * len(layers) + 3), 4.5)
    xs = list(range(len(layers)))
    bottom = [0.0] * len(layers)
    scale, unit = _time_scale(max(cells.values())) if timed else (1.0, "FLOPs")
    for cls in classes:
        heights = [cells.get((layer, cls), 0.0) / scale for layer in layers]
        ax.bar(xs, heights, bottom=bottom, color=_color(cls), label=cls, edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(xs, [_layer_label(layer) for layer in layers])
    ax.set_xlabel("decoder layer")
    ax.set_ylabel(f"time ({unit})" if timed else "FLOPs")
    name = (report.target or {}).get("name")
    what = "Time" if timed else "FLOPs"
    ax.set_title(f"{what} by layer and op class" + (f" on {name}" if name else ""), fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def _time_scale(t: float) -> tuple[float, str]:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if t >= scale:
            return scale, unit
    return 1e-9, "ns"


def scale_figure(rows: Sequence[Mapping[str, Any]]) -> Figure | None:
    """Throughput and efficiency vs chip count, one series per ``strategy`` (or ``label``).

    Each row: ``chips``, ``throughput`` (samples/s) and ``efficiency`` (0..1; None skips it).
    """
    series: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("chips") is None:
            continue
        key = str(row.get("strategy") or row.get("label") or "")
        series.setdefault(key, []).append(row)
    if not series:
        return None
    fig, (ax_t, ax_e) = _new_figure(10.0, 4.2, ncols=2)
    for key, pts in sorted(series.items()):
        pts = sorted(pts, key=lambda r: r["chips"])
        label = key or None
        t = [(r["chips"], r["throughput"]) for r in pts if r.get("throughput") is not None]
        e = [(r["chips"], 100 * r["efficiency"]) for r in pts if r.get("efficiency") is not None]
        if t:
            ax_t.plot(*zip(*t, strict=True), "o-", label=label)
        if e:
            ax_e.plot(*zip(*e, strict=True), "s-", label=label)
    chips = sorted({r["chips"] for pts in series.values() for r in pts})
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(chips, [str(c) for c in chips])
        ax.set_xlabel("chips")
        ax.grid(True, alpha=0.3)
        if any(series):
            ax.legend(fontsize=8)
    ax_t.set_ylabel("throughput (samples/s)")
    ax_t.set_title("Throughput vs chips", fontsize=10)
    ax_e.set_ylabel("scaling efficiency (% of linear)")
    ax_e.set_title("Efficiency vs chips", fontsize=10)
    ax_e.set_ylim(bottom=0)
    return fig


def _predicted(n: NodeRecord) -> float | None:
    return n.predicted_time_s if n.predicted_time_s is not None else n.time_s


def predicted_vs_measured_figure(report: Report, *, top: int = 5) -> Figure | None:
    """Predicted (emulated) vs measured time per node, log-log, with the y = x line.

    The ``top`` nodes with the largest error ratio are labelled. None when no node has both.
    """
    pts = [
        (n, n.measured_time_s, _predicted(n))
        for n in report.nodes
        if n.measured_time_s and _predicted(n) and n.measured_time_s > 0 and (_predicted(n) or 0) > 0
    ]
    if not pts:
        return None
    fig, ax = _new_figure(6.5, 6.0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_axes(ax)
    by_class: dict[str, list[tuple[NodeRecord, float, float]]] = {}
    for p in pts:
        by_class.setdefault(p[0].op_class or "other", []).append(p)  # type: ignore[arg-type]
    for op_class, group in sorted(by_class.items()):
        ax.scatter(
            [g[1] for g in group],
            [g[2] for g in group],
            c=_color(op_class),
            alpha=0.7,
            edgecolors="black",
            linewidths=0.4,
            label=f"{op_class} ({len(group)})",
        )
    values = [v for p in pts for v in (p[1], p[2])]
    lo, hi = min(values) / 2, max(values) * 2
    ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="y = x")
    worst = sorted(pts, key=lambda q: abs(math.log(q[2] / q[1])), reverse=True)
    for n, m, p in _spread(worst, top):  # type: ignore[arg-type]
        ax.annotate(n.name, (m, p), xytext=(5, 3), textcoords="offset points", fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured time per node (s)")
    ax.set_ylabel("predicted time per node (s)")
    total_m = sum(p[1] for p in pts)
    total_p = sum(p[2] for p in pts)
    ax.set_title(f"Predicted vs measured, {len(pts)} nodes (sum {seconds(total_p)} vs {seconds(total_m)})", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig


_BOUND_COLORS = {"compute": "#1f77b4", "memory": "#ff7f0e", "communication": "#d62728", "overhead": "#7f7f7f"}


def compare_figure(rows: Sequence[Mapping[str, Any]]) -> Figure | None:
    """Compare rows as bars: throughput and compute efficiency per report, coloured by dominant bound."""
    rows = [r for r in rows if r.get("throughput_samples_per_s")]
    if not rows:
        return None
    fig, (ax_t, ax_e) = _new_figure(10.0, 0.45 * len(rows) + 1.8, ncols=2)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.2, top=0.85, wspace=0.35)
    labels = [str(r.get("target") or r.get("label")) for r in rows]
    colors = [_BOUND_COLORS.get(str(r.get("dominant_bound")), "#bbbbbb") for r in rows]
    ys = list(range(len(rows)))
    ax_t.barh(ys, [r["throughput_samples_per_s"] for r in rows], color=colors)
    ax_t.set_xscale("log")
    ax_t.set_title("Throughput (samples/s, log)", fontsize=10)
    ax_e.barh(ys, [100 * (r.get("compute_efficiency") or 0.0) for r in rows], color=colors)
    ax_e.set_title("Compute efficiency (% of peak)", fontsize=10)
    for ax in (ax_t, ax_e):
        ax.set_yticks(ys, labels)
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
    from matplotlib.patches import Patch

    used = sorted({str(r.get("dominant_bound")) for r in rows if r.get("dominant_bound")})
    if used:
        handles = [Patch(color=_BOUND_COLORS.get(b, "#bbbbbb"), label=f"{b}-bound") for b in used]
        fig.legend(handles=handles, loc="lower center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


PLOT_NAMES = ("roofline", "layers", "predicted-vs-measured")
"""The plots `write_plots` may write, each as ``[STEM-]NAME.FORMAT``."""
PLOT_FORMATS = ("png", "svg")


def plot_path(folder: str | Path, stem: str, name: str, fmt: str) -> Path:
    """Where `write_plots` puts plot ``name`` in format ``fmt`` (the outputs plan lists them before the work)."""
    return Path(folder) / f"{stem + '-' if stem else ''}{name}.{fmt}"


def write_plots(
    report: Report, folder: str | Path, *, stem: str = "", formats: Iterable[str] = PLOT_FORMATS
) -> list[Path]:
    """Write every plot that applies to ``report`` into ``folder`` (created); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in zip(PLOT_NAMES, (roofline_figure, layer_time_figure, predicted_vs_measured_figure), strict=True):
        fig = make(report)
        if fig is None:
            continue
        for fmt in formats:
            written.append(save_figure(fig, plot_path(folder, stem, name, fmt)))
    return written
