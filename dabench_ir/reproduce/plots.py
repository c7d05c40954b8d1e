"""A study's plots (matplotlib Agg, PNG): the paper's plot types drawn from its experiments,
with the paper's values beside the tool's where the study file gives them.

Plot kinds (`PLOT_KINDS`): ``lines`` (a metric along an axis, a line per series, a panel per
group), ``bars`` (a figure per group, e.g. the mixed-precision gain per target, tool bars
beside hatched paper bars), ``roofline`` (per target: each point's arithmetic intensity at
its feed level vs its achieved FLOP/s, under the target's roof) and ``fits`` (layers x
hidden, which points fit). Paper values are black X markers (hatched bars) labelled "paper".
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dabench_ir.reproduce import kinds as K
from dabench_ir.reproduce.rows import (
    REDUCERS,
    axis_sort_key,
    group_label,
    label_sort_key,
    metric_value,
    select,
    usable,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from dabench_ir.reproduce.study import PlotSpec

__all__ = ["PLOT_KINDS", "PlotKind", "plot_kind", "roofline_point"]

logger = logging.getLogger(__name__)

Row = Mapping[str, Any]
Records = Callable[[Row], "dict[str, Any] | None"]
"""A row's point record (its report), read on demand: only the roofline needs it."""

TPUT = "throughput_samples_per_s"
_PAPER = {"marker": "X", "color": "black", "s": 70, "zorder": 5, "label": "paper"}


@dataclass(frozen=True)
class PlotKind:
    """A registered plot kind: its fields (types as finding fields), the required ones, and how it draws."""

    name: str
    draw: Callable[[Sequence[Row], PlotSpec, Records], Figure]
    fields: Mapping[str, str]
    required: frozenset[str]


PLOT_KINDS: dict[str, PlotKind] = {}
"""Every plot kind, by name."""


def plot_kind(name: str, *, fields: Mapping[str, str], required: set[str] | frozenset[str] = frozenset()) -> Callable:
    """Register a plot kind ``name``: ``draw(rows, spec, records) -> Figure``."""

    def register(fn: Callable[[Sequence[Row], PlotSpec, Records], Figure]) -> Callable:
        PLOT_KINDS[name] = PlotKind(name=name, draw=fn, fields=dict(fields), required=frozenset(required))
        return fn

    return register


# -- helpers -----------------------------------------------------------------------------------
def _panel_of(row: Row, panel: Any) -> str:
    """A row's panel: the ``panel`` parameter(s), by default the target with its compile options (``rdu O3``)."""
    if panel:
        return group_label(row, panel)
    from dabench_ir.sweep.plots import target_label

    return target_label(row)


def _figure(n: int, width: float = 4.6, height: float = 3.5) -> tuple[Figure, list[Any]]:
    """A Figure on the Agg canvas (no pyplot state) with ``n`` panels, at most 3 a row."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = max(1, min(n, 3))
    nrows = max(1, (n + cols - 1) // cols)
    fig = Figure(figsize=(width * cols, height * nrows + 0.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, cols, squeeze=False)
    flat = [a for row in axes for a in row]
    for extra in flat[n:]:
        extra.set_visible(False)
    return fig, flat[:n]


def _paper_points(
    ax: Any, paper: list[dict[str, Any]] | None, panel: str, tool: Mapping[str, Mapping[Any, float]] | None = None
) -> None:
    """The paper's marks on one panel (`study._MARKS`): points, bands, lines, linear scaling.
    ``tool`` (series -> x -> figure) places the marks drawn relative to the tool's figures."""
    tool = tool or {}

    def at(mark: Mapping[str, Any], x: Any) -> float | None:
        series = tool.get(str(mark["series"])) if "series" in mark else next(iter(tool.values()), None)
        return (series or {}).get(x)

    mine = [p for p in paper or [] if str(p.get("panel", panel)) == panel]
    for p in mine:
        label = p.get("label", "paper")
        if "hspan" in p:
            ax.axhspan(*p["hspan"], color="black", alpha=0.08, label=label)
        elif "vline" in p:
            ax.axvline(p["vline"], color="black", linestyle=":", linewidth=1.2, label=label)
        elif "linear_from" in p:
            x0, xs = p["linear_from"], sorted(x for s in tool.values() for x in s)
            y0 = at(p, x0)
            if y0 is not None:
                ax.plot(
                    [x for x in xs if x >= x0],
                    [y0 * x / x0 for x in xs if x >= x0],
                    color="black",
                    linestyle="--",
                    linewidth=1,
                    label=label,
                )
        else:
            base = at(p, p["relative_to"]) if "relative_to" in p else 1.0
            if not base:
                continue  # no tool figure to scale: the mark has no height
            ax.scatter([p["x"]], [p["y"] * base], **{**_PAPER, "label": label})


def _legend(ax: Any) -> None:
    """The panel's legend, one entry per label (every paper mark is "paper" unless it says)."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=7)


def _finish(fig: Figure, spec: PlotSpec, default_title: str) -> Figure:
    """The title, wrapped to the figure's width (about 11 characters an inch at 11 pt), and the layout."""
    import textwrap

    width = max(30, int(fig.get_figwidth() * 11))
    fig.suptitle("\n".join(textwrap.wrap(spec.title or default_title, width)), fontsize=11)
    fig.tight_layout()
    return fig


def _panels(rows: Sequence[Row], spec: PlotSpec, metric: str | None) -> dict[str, list[Row]]:
    by: dict[str, list[Row]] = defaultdict(list)
    for r in select(rows, spec.options.get("where")):
        if metric is None or usable(r, metric) is None:
            by[_panel_of(r, spec.options.get("panel"))].append(r)
    if not by:
        raise ValueError(f"no point of experiment {spec.experiment!r} has {metric or 'a result'}")
    return dict(sorted(by.items(), key=lambda kv: label_sort_key(kv[0])))


# -- kinds ---------------------------------------------------------------------------------------
_METRIC_FIELDS = {"metric": K.METRIC, "series": K.GROUP, "ylabel": K.TEXT}
"""The fields of a plot of one metric: the results column (default throughput), one line or bar per
``series`` value, the y axis label (default the metric's name)."""


@plot_kind(
    "lines",
    fields={"x": K.PARAM, **_METRIC_FIELDS, "panel": K.GROUP, "logx": K.BOOL, "logy": K.BOOL, "paper": K.POINTS},
    required={"x"},
)
def lines(rows: Sequence[Row], spec: PlotSpec, records: Records) -> Figure:
    """``metric`` along ``x``: one line per ``series`` value, one panel per ``panel`` (default: the target)."""
    o = spec.options
    x, y, series = o["x"], o.get("metric", TPUT), o.get("series")
    panels = _panels(rows, spec, y)
    fig, axes = _figure(len(panels))
    for ax, (label, prows) in zip(axes, panels.items(), strict=True):
        by: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
        shared = []  # points without the series parameter (normalised away: 1 chip has no chips_per_node)
        for r in prows:
            if series and not group_label(r, series):
                shared.append(r)
                continue
            by[group_label(r, series) if series else "tool"][r.get(x)].append(metric_value(r, y))  # type: ignore[arg-type]
        for r in shared:  # such a point is every series' point there
            for s in by or {"tool": None}:
                by[s][r.get(x)].append(metric_value(r, y))  # type: ignore[arg-type]
        lines: dict[str, dict[Any, float]] = {}
        for s, pts in sorted(by.items(), key=lambda kv: label_sort_key(kv[0])):
            xs = sorted(pts, key=axis_sort_key)
            name = f"{series if isinstance(series, str) else ''} {s}".strip() if series else "tool"
            lines[s] = {v: sum(pts[v]) / len(pts[v]) for v in xs}
            ax.plot(xs, list(lines[s].values()), marker="o", ms=3, label=name)
        _paper_points(ax, o.get("paper"), label, lines)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(x)
        ax.set_ylabel(o.get("ylabel", y))
        if o.get("logx"):
            ax.set_xscale("log", base=2)
        if o.get("logy"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        _legend(ax)
    return _finish(fig, spec, f"{y} vs {x}")


@plot_kind(
    "bars",
    fields={
        "x": K.GROUP,
        **_METRIC_FIELDS,
        "numerator": K.GROUP_ROW,
        "denominator": K.GROUP_ROW,
        "minus_one": K.BOOL,
        "reduce": K.REDUCE,
        "format": K.FORMAT,
        "paper": K.MAPPING,
    },
    required={"x"},
)
def bars(rows: Sequence[Row], spec: PlotSpec, records: Records) -> Figure:
    """A figure per ``x`` group (``reduce`` of the metric per ``series``, or a numerator/denominator
    ratio), tool bars beside hatched paper bars."""
    o = spec.options
    metric, x = o.get("metric", TPUT), o["x"]
    picked = select(rows, o.get("where"))
    labels = sorted({group_label(r, x) for r in picked}, key=label_sort_key)
    tool: dict[str, dict[str, float | None]] = defaultdict(dict)  # series -> x label -> figure
    for g in labels:
        mine = [r for r in picked if group_label(r, x) == g]
        if "numerator" in o:
            a = [metric_value(r, metric) for r in select(mine, o["numerator"]) if usable(r, metric) is None]
            b = [metric_value(r, metric) for r in select(mine, o["denominator"]) if usable(r, metric) is None]
            ok = len(a) == 1 and len(b) == 1 and b[0]
            tool["tool"][g] = a[0] / b[0] - (1.0 if o.get("minus_one", True) else 0.0) if ok else None  # type: ignore[operator]
            continue
        by: dict[str, list[float]] = defaultdict(list)
        for r in mine:
            if usable(r, metric) is None:
                by[group_label(r, o["series"]) if o.get("series") else "tool"].append(metric_value(r, metric))  # type: ignore[arg-type]
        for s, values in by.items():
            tool[s][g] = REDUCERS[o.get("reduce", "mean")](values)
    paper = o.get("paper") or {}
    nested = any(isinstance(v, Mapping) for v in paper.values())
    paper_series = {f"paper {s}": v for s, v in paper.items()} if nested else ({"paper": paper} if paper else {})
    columns = [*sorted(tool), *paper_series]
    fmt = o.get("format", "pct" if "numerator" in o else "num")
    fig, (ax,) = _figure(1, width=max(5.0, 1.4 * len(labels) * max(len(columns), 1) / 2 + 2), height=4.0)
    width = 0.8 / max(len(columns), 1)
    for j, name in enumerate(columns):
        values = tool[name] if name in tool else paper_series[name]
        xs = [i + (j - (len(columns) - 1) / 2) * width for i in range(len(labels))]
        ys = [values.get(g) for g in labels]
        is_paper = name not in tool
        style = {"hatch": "//", "facecolor": "white", "edgecolor": "black"} if is_paper else {}
        heights = [v if v is not None else 0.0 for v in ys]
        drawn = ax.bar(xs, heights, width=width * 0.95, label=name, **style)
        for rect, v in zip(drawn, ys, strict=True):
            text = K.format_value(v, fmt, signed=fmt == "pct") if v is not None else "n/a"
            ax.annotate(
                text,
                (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_xlabel(x if isinstance(x, str) else " ".join(x))
    ax.set_ylabel(o.get("ylabel", metric))
    ax.axhline(0, color="#555555", linewidth=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, spec, f"{metric} per {x}")


def roofline_point(report: Mapping[str, Any]) -> tuple[float, float] | None:
    """A run's place on its target's roofline: (arithmetic intensity, achieved FLOP/s).

    The intensity uses the bytes the report's roofline uses: each node's bytes at the memory
    that feeds it (`dabench_ir.report.attribution.roofline_points`), summed through the
    report's role rows (each role's ``intensity`` is its FLOPs over its nodes' feed bytes): sum
    FLOPs / sum feed bytes over the roles with both. The achieved figure is the run's own,
    FLOPs over the step time (``totals.achieved_flops_per_s``, what compute efficiency is made
    of), as a benchmark measures it. None when either is missing.
    """
    flops = feed = 0.0
    for role in report.get("roles") or []:
        f, x = role.get("flops"), role.get("intensity")
        if f and x and math.isfinite(x) and x > 0:
            flops += f
            feed += f / x
    achieved = (report.get("totals") or {}).get("achieved_flops_per_s")
    if not feed or not achieved:
        return None
    return flops / feed, float(achieved)


def _roof(target_name: str, precision: str | None) -> tuple[str, float, float, float] | None:
    """(label, peak FLOP/s, feed bandwidth, ridge) of a target at the dtype ``precision`` computes in."""
    from dabench_ir.passes.precision import compute_dtype
    from dabench_ir.targets import load_target

    try:
        target = load_target(target_name)
        dtype = compute_dtype(precision or "fp32")
        mem = target.feed_memory
        peak = float(target.peak_flops(dtype))
        return (
            f"{target.name} {mem.name} at {dtype}",
            peak,
            float(mem.bandwidth_bytes_per_s),
            target.ridge_point(dtype, mem),
        )
    except Exception as exc:  # a roof is decoration: the points are drawn without it
        logger.info("no roof for %s at %s: %s", target_name, precision, exc)
        return None


@plot_kind("roofline", fields={"panel": K.GROUP, "series": K.GROUP, "paper": K.POINTS})
def roofline(rows: Sequence[Row], spec: PlotSpec, records: Records) -> Figure:
    """Per panel (default: the target): each point's feed-level intensity vs its achieved FLOP/s
    (`roofline_point`), under the roof of its target at its precision (peak, feed memory bandwidth)."""
    o = spec.options
    panels = _panels(rows, spec, "achieved_tflops")
    fig, axes = _figure(len(panels), width=5.0, height=4.0)
    for ax, (label, prows) in zip(axes, panels.items(), strict=True):
        pts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        roofs: dict[str, tuple[str, float, float, float]] = {}
        for r in prows:
            record = records(r)
            report = (record or {}).get("report") or {}
            point = roofline_point(report)
            if point is None:
                continue
            pts[group_label(r, o["series"]) if o.get("series") else "tool"].append(point)
            precision = (report.get("config") or {}).get("precision")
            roof = _roof(str(r.get("target")), precision)
            if roof is not None:
                roofs[roof[0]] = roof
        xs = [p[0] for v in pts.values() for p in v] + [p["x"] for p in o.get("paper") or []]
        lo, hi = min([*xs, 1.0]) / 4, max([*xs, 100.0]) * 4
        for *_, ridge in roofs.values():
            lo, hi = min(lo, ridge / 20), max(hi, ridge * 20)
        grid = [lo * (hi / lo) ** (i / 199) for i in range(200)]
        for name, peak, bw, ridge in roofs.values():
            ax.plot(
                grid,
                [min(peak, g * bw) for g in grid],
                "-",
                color="#333333",
                linewidth=1.2,
                label=f"roof: {name}, ridge {ridge:.3g} FLOP/B",
            )
        for s, v in sorted(pts.items(), key=lambda kv: label_sort_key(kv[0])):
            name = (
                f"{o['series'] if isinstance(o.get('series'), str) else ''} {s}".strip() if o.get("series") else "tool"
            )
            ax.scatter(
                [p[0] for p in v], [p[1] for p in v], s=18, alpha=0.8, edgecolors="black", linewidths=0.3, label=name
            )
        _paper_points(ax, o.get("paper"), label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("arithmetic intensity at the feed level (FLOP/byte)")
        ax.set_ylabel("achieved FLOP/s (FLOPs / step time)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    return _finish(fig, spec, "Roofline per target")


@plot_kind("fits", fields={"x": K.PARAM, "y": K.PARAM, "panel": K.GROUP, "paper": K.POINTS})
def fits(rows: Sequence[Row], spec: PlotSpec, records: Records) -> Figure:
    """``x`` (default layers) x ``y`` (default hidden) per panel: which points fit, which do not, which failed."""
    o = spec.options
    x, y = o.get("x", "layers"), o.get("y", "hidden")
    panels = _panels(rows, spec, None)
    fig, axes = _figure(len(panels))
    for ax, (label, prows) in zip(axes, panels.items(), strict=True):
        groups = {
            "fits": ([r for r in prows if r.get("status") == "ok" and r.get("fits") is True], "o", "tab:green"),
            "does not fit": ([r for r in prows if r.get("status") == "ok" and r.get("fits") is False], "x", "tab:red"),
            "failed": ([r for r in prows if r.get("status") != "ok"], "s", "#aaaaaa"),
        }
        for name, (grows, marker, color) in groups.items():
            if grows:
                ax.scatter([r.get(x) for r in grows], [r.get(y) for r in grows], marker=marker, c=color, label=name)
        _paper_points(ax, o.get("paper"), label)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        _legend(ax)
    return _finish(fig, spec, f"Fits on one chip ({x} x {y})")
