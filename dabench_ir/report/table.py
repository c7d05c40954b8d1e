"""Terminal rendering of a Report: summary, top-N node table, per-layer and per-class subtotals."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from dabench_ir.ir import Cost

from .model import Report

__all__ = ["human", "render_table", "seconds"]

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def human(x: float | int | None, unit: str = "") -> str:
    """1234567 -> '1.23 M' (SI prefixes); None -> '-'."""
    if x is None:
        return "-"
    for scale, prefix in _PREFIXES:
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    if isinstance(x, float) and x != int(x):
        return f"{x:.3g} {unit}".rstrip()
    return f"{int(x)} {unit}".rstrip()


def seconds(t: float | None) -> str:
    if t is None:
        return "-"
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    if t >= 1e-6:
        return f"{t * 1e6:.3g} µs"
    return f"{t * 1e9:.3g} ns"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def bold(self, s: str) -> str:
        return f"\033[1m{s}\033[0m" if self.color else s

    def dim(self, s: str) -> str:
        return f"\033[2m{s}\033[0m" if self.color else s

    def red(self, s: str) -> str:
        return f"\033[31m{s}\033[0m" if self.color else s


def _grid(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, right: set[int]) -> list[str]:
    """Aligned columns; the first column is truncated to fit ``width``."""
    cols = len(headers)
    widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) if rows else len(headers[i]) for i in range(cols)]
    over = sum(widths) + 2 * (cols - 1) - width
    if over > 0:
        widths[0] = max(12, widths[0] - over)

    def fmt(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            w = widths[i]
            if len(cell) > w:
                cell = cell[: w - 1] + "…"
            out.append(cell.rjust(w) if i in right else cell.ljust(w))
        return "  ".join(out).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def render_table(
    report: Report, *, top: int = 20, width: int | None = None, color: bool | None = None, sort: str | None = None
) -> str:
    """The per-node attribution table with totals, as plain text (ANSI bold only on a tty).

    ``sort``: rank nodes by ``time`` (default when timed), ``flops`` or ``energy``.
    """
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns
    if color is None:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    st = _Style(color)
    lines: list[str] = []
    lines += _summary(report, st)
    lines.append("")
    timed = report.has_times
    sort = sort or ("time" if timed else "flops")
    keys = {
        "time": lambda n: n.time_s or 0.0,
        "flops": lambda n: n.flops or 0,
        "energy": lambda n: n.energy_j or 0.0,
    }
    if sort not in keys:
        raise ValueError(f"sort must be one of {', '.join(keys)}")
    nodes = sorted(report.attributed, key=keys[sort], reverse=True)
    energy = any(n.energy_j is not None for n in report.nodes)
    total_time = sum(n.time_s or 0.0 for n in report.nodes) if timed else None
    shown = nodes[:top] if top > 0 else nodes
    headers = ["node", "op", "layer", "FLOPs", "bytes", "FLOP/B"]
    if timed:
        headers += ["time", "share", "bound", "unit"]
    measured = any(n.measured_time_s is not None for n in report.nodes)
    if measured:
        headers += ["measured"]
    if energy:
        headers += ["energy"]
    rows = []
    for n in shown:
        row = [
            n.name,
            n.op_type,
            "-" if n.layer is None else str(n.layer),
            human(n.flops),
            human(n.bytes, "B"),
            "-" if n.intensity is None else f"{n.intensity:.3g}",
        ]
        if timed:
            share = (n.time_s / total_time) if total_time and n.time_s is not None else None
            row += [seconds(n.time_s), _pct(share), n.bound or "-", n.unit or "-"]
        if measured:
            row += [seconds(n.measured_time_s)]
        if energy:
            row += [human(n.energy_j, "J")]
        rows.append(row)
    what = {"time": "time", "flops": "FLOPs", "energy": "energy"}[sort]
    lines.append(st.bold(f"Top {len(shown)} of {len(report.nodes)} nodes by {what}"))
    lines += _grid(headers, rows, width, right=set(range(2, len(headers))) - {8, 9})
    lines.append("")
    lines += _by_layer(report, st, width)
    if timed:
        lines.append("")
        lines += _time_shares(report, st, width)
    lines.append("")
    lines += _unattributed(report, st)
    return "\n".join(lines)


def _summary(report: Report, st: _Style) -> list[str]:
    t, m, c = report.totals, report.metrics, report.config
    model = report.model
    name = model.get("preset") or model.get("family") or model.get("name")
    out = [
        st.bold(f"dabench-ir profile: {model.get('path') or name}"),
        f"  model      {model['nodes']} nodes, {model['layers']} layers, "
        f"{human(model['params'])} params, batch {c.get('batch')}, {c.get('precision') or '-'}, {c.get('mode')}",
        f"  work       {human(t['flops'], 'FLOP')} ({human(t['contraction_flops'], 'FLOP')} contraction, "
        f"{human(t['vector_flops'], 'FLOP')} vector, {human(t['special_ops'], 'op')} special), "
        f"{human(t['bytes'], 'B')} moved, intensity {_fmt(t.get('intensity'))} FLOP/B",
    ]
    if t.get("estimated_nodes"):  # nodes no rule counts: bytes-only lower bounds, named (issue 19)
        est = report.extra.get("estimated") or []
        share = t.get("estimated_time_share")
        out.append(st.red(
            f"  estimated  {t['estimated_nodes']} node(s) without a cost rule (estimated: no rule, bytes only), "
            f"{'-' if share is None else f'{100 * share:.1f}%'} of node time: "
            + ", ".join(sorted({e['op_type'] for e in est}))
        ))  # fmt: skip
    by_class = c.get("precision_by_class")
    if by_class:
        out.append("  precision  " + ", ".join(f"{k} {v}" for k, v in by_class.items()))
    if report.target:
        fits = "yes" if report.fits else st.red("NO")
        out.append(f"  target     {report.target['name']} ({report.target['kind']}), fits: {fits}")
        if report.failure:
            f = report.failure
            out.append(
                st.red(
                    f"  failure    {f['reason']} (needs {human(f['needed_bytes'], 'B')}, "
                    f"has {human(f['capacity_bytes'], 'B')})"
                )
            )
    if t.get("time_s") is not None:
        out.append(
            f"  time       {seconds(t['time_s'])} per step, {human(t['throughput_samples_per_s'])} samples/s, "
            f"{human(t['achieved_flops_per_s'], 'FLOP/s')} achieved"
        )
    if t.get("energy_j") is not None:
        out.append(
            f"  energy     {human(t['energy_j'], 'J')} per step, {human(t.get('energy_per_sample_j'), 'J')} per sample, "
            f"{human(t.get('power_w'), 'W')} modelled, {_fmt(t.get('gops_per_w'))} GOP/s per rated W"
        )
    if report.target:
        out.append(
            f"  metrics    allocation {_pct(m.get('allocation_ratio'))}, load balance LI "
            f"{_fmt(m.get('load_imbalance'))}, efficiency {_pct(m.get('compute_efficiency'))} of peak"
        )
    err = m.get("prediction_error")
    if err:
        out.append(
            f"  predicted  end-to-end error {_pct(err.get('end_to_end_rel_error'))}, median node error "
            f"{_pct(err.get('median_node_rel_error'))} over {err.get('nodes_compared')} nodes"
        )
        if err.get("end_to_end_spread") is not None:
            verdict = "within" if err.get("end_to_end_within_noise") else "beyond"
            out.append(
                f"  noise      measured spread (IQR/median) {_pct(err.get('end_to_end_spread'))} end to end, "
                f"{_pct(err.get('median_node_spread'))} median node: the end-to-end error is {verdict} noise; "
                f"{err.get('nodes_within_noise')} of {err.get('nodes_compared')} node errors are within noise"
            )
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def _by_layer(report: Report, st: _Style, width: int) -> list[str]:
    per_layer = report.by_layer()
    times = report.group_time("layer")
    timed = bool(times)
    total = sum(per_layer.values(), Cost())
    headers = ["layer", "FLOPs", "share", "bytes"] + (["time"] if timed else [])
    rows = []
    for layer in sorted(per_layer, key=lambda x: (x is None, x if x is not None else 0)):
        c = per_layer[layer]
        row = [
            "(outside blocks)" if layer is None else str(layer),
            human(c.flops),
            _pct(c.flops / total.flops if total.flops else None),
            human(c.bytes, "B"),
        ]
        if timed:
            row.append(seconds(times.get(layer)))
        rows.append(row)
    total_row = ["total", human(total.flops), "100.0%", human(total.bytes, "B")]
    if timed:
        total_row.append(seconds(report.totals.get("time_s")))
    rows.append(total_row)
    return [st.bold("Per layer"), *_grid(headers, rows, width, right=set(range(1, len(headers))))]


def _time_shares(report: Report, st: _Style, width: int) -> list[str]:
    out = []
    total = sum(report.group_time("op_type").values()) or 1.0
    for key, title in (("op_type", "Time by op type"), ("bound", "Time by bound class")):
        groups = sorted(report.group_time(key).items(), key=lambda kv: kv[1], reverse=True)[:10]
        rows = [[str(k or "-"), seconds(v), _pct(v / total)] for k, v in groups]
        out += [st.bold(title), *_grid([key, "time", "share"], rows, width, right={1, 2}), ""]
    return out[:-1]


def _unattributed(report: Report, st: _Style) -> list[str]:
    if not report.unattributed:
        return ["Unattributed nodes: 0"]
    out = [st.red(f"Unattributed nodes: {len(report.unattributed)} (not counted in the totals above)")]
    for u in report.unattributed[:10]:
        out.append(f"  {u['name']} ({u['op_type']}): {u['reason']}")
    if len(report.unattributed) > 10:
        out.append(f"  ... and {len(report.unattributed) - 10} more (see --json)")
    return out

