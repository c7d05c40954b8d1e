"""Terminal rendering of a Report: summary, top-N node table, per-layer and per-class subtotals."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .attribution import comm_label, node_share
from .model import Report

__all__ = [
    "BY",
    "NO_RULE",
    "SHARE_OF_FLOPS",
    "SHARE_OF_LAYER",
    "SHARE_OF_TIME",
    "SORTS",
    "SORT_WORDS",
    "failure_text",
    "flops_cell",
    "human",
    "no_rule_legend",
    "no_rule_roles",
    "parse_percent",
    "percent",
    "percent_change",
    "prediction_text",
    "ranked_nodes",
    "ranked_roles",
    "render_breakdown",
    "render_table",
    "role_table",
    "seconds",
    "short_percent",
    "table_sort",
    "times",
]

SHARE_OF_TIME = "share of summed time"
"""Header of every time share: of node busy times plus overhead rows (`attribution.TIME_BASIS`)."""
SHARE_OF_FLOPS = "share of FLOPs"
"""Header of a share of the FLOPs (untimed tables, the per-layer table)."""
SHARE_OF_LAYER = "share of layer"
"""Header of the representative layer's shares: of that layer's summed node time."""

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


def times(ratio: float | None, missing: str = "-") -> str:
    """A ratio of two rates or times (a speedup): ``2.00x``; below 0.1 with the digits it needs
    (``0.0041x``, never a bare ``0.00x`` for a slowdown); None: ``missing``."""
    if ratio is None:
        return missing
    return f"{ratio:.2f}x" if abs(ratio) >= 0.1 or ratio == 0 else f"{ratio:.2g}x"


# -- percentages: one helper per meaning --------------------------------------------------------


def percent(fraction: float | None, *, width: int = 0, missing: str = "-") -> str:
    """A fraction (0.25) as a percentage (``25.0%``), right-aligned in ``width``; None: ``missing``."""
    if fraction is None:
        return missing
    return f"{100 * fraction:{width}.1f}%" if width else f"{100 * fraction:.1f}%"


def short_percent(fraction: float) -> str:
    """A share with the digits a small one needs, for prose and labels: ``12%``, ``0.41%``, never a
    bare ``0%`` (``<0.01%``)."""
    if fraction >= 0.1:
        return f"{fraction:.0%}"
    return f"{100 * fraction:.2g}%" if fraction >= 1e-4 else "<0.01%"


def percent_change(before: Any, after: Any) -> str:
    """The relative change from ``before`` to ``after``, signed (``+12.5%``); ``-`` when either
    is missing or ``before`` is zero."""
    if not before or after is None:
        return "-"
    return f"{100 * (after - before) / before:+.1f}%"


def parse_percent(text: str | None) -> float | None:
    """A percentage as written (``12.5%``, ``12.5``) back to its fraction (0.125); None when blank
    (``""``, ``-``, ``–``) or not a number."""
    text = (text or "").rstrip("%")
    if text in ("", "-", "–"):
        return None
    try:
        return float(text) / 100
    except ValueError:
        return None


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
    """Aligned columns. Names are never cut: a row wider than ``width`` runs on rather than
    truncating a scope into ambiguity (``layers.*.mlp.down_…`` could be any projection)."""
    cols = len(headers)
    widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) if rows else len(headers[i]) for i in range(cols)]

    def fmt(cells: Sequence[str]) -> str:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(cells).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


BY = ("role", "node")
"""What the main table groups by: module roles across layers (default), or single nodes."""
SORTS = ("time", "flops", "energy")
"""What the main tables rank their rows by (``--sort``)."""
_SORT_KEYS = {"time": "time_s", "flops": "flops", "energy": "energy_j"}
SORT_WORDS = {"time": "time", "flops": "FLOPs", "energy": "energy"}
"""How a table's title names its ranking."""


def table_sort(report: Report, sort: str | None) -> str:
    """The ranking ``sort`` asks for, checked; none given: time when the report is timed, else FLOPs."""
    sort = sort or ("time" if report.has_times else "flops")
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}")
    return sort


def ranked_roles(report: Report, sort: str) -> list[dict[str, Any]]:
    """`attribution.role_rows` (overhead rows among them), largest ``sort`` (`SORTS`) first: the
    order of every renderer's role table (text, HTML)."""
    from .attribution import role_rows

    key = _SORT_KEYS[sort]
    return sorted(role_rows(report), key=lambda r: -(r[key] or 0))


def ranked_nodes(report: Report, sort: str) -> list[Any]:
    """The costed nodes, largest ``sort`` (`SORTS`) first: the order of every renderer's node table."""
    key = _SORT_KEYS[sort]
    return sorted(report.attributed, key=lambda n: getattr(n, key) or 0, reverse=True)


NO_RULE = "no rule: bytes only"
"""What a FLOPs cell shown as ``-`` means in a node or role row: no cost rule counts the node's work
(an estimate from the bytes it moves; ``estimated: no rule`` in its note), so its FLOPs are not
counted, which is not a node that does none."""
_SOME_NO_RULE = "*"
"""Marks the FLOPs of a role some of whose nodes (not all) have no cost rule: the others' count."""


def no_rule_roles(report: Report) -> dict[str, int]:
    """Per role (a node's role, else its op type: how `attribution.role_rows` groups), how many of
    its nodes have no cost rule (``extra.estimated``: the report's one list of them)."""
    names = {e.get("name") for e in report.extra.get("estimated") or ()}
    out: dict[str, int] = {}
    for n in report.nodes:
        if n.name in names:
            role = n.role or n.op_type
            out[role] = out.get(role, 0) + 1
    return out


def flops_cell(flops: int | None, *, nodes: int = 1, no_rule: int = 0) -> str:
    """A row's FLOPs: ``-`` when none of its ``nodes`` has a cost rule (`NO_RULE`), the others'
    count marked ``*`` when ``no_rule`` of them have none, else the count."""
    if no_rule and no_rule >= nodes:
        return "-"
    return human(flops) + (_SOME_NO_RULE if no_rule else "")


def no_rule_legend(cells: Sequence[str]) -> list[str]:
    """The legend lines under a table whose FLOPs ``cells`` (`flops_cell`) carry a no-rule mark."""
    out = []
    if "-" in cells:
        out.append(f"FLOPs '-' = {NO_RULE} (no cost rule counts the node's work; its time is estimated from its bytes)")
    if any(c.endswith(_SOME_NO_RULE) for c in cells):
        out.append(f"FLOPs '{_SOME_NO_RULE}' = some of the role's nodes have {NO_RULE}: their work is not counted")
    return out


def render_table(
    report: Report,
    *,
    top: int = 20,
    width: int | None = None,
    color: bool | None = None,
    sort: str | None = None,
    by: str = "role",
) -> str:
    """The attribution tables with totals, as plain text (ANSI bold only on a tty).

    ``by="role"``: time, FLOPs and bound per module role across layers (with the overhead
    rows), the "why" lines, one representative layer with its spread, identical layers
    collapsed. ``by="node"``: the top nodes. ``sort``: ``time`` (default when timed),
    ``flops`` or ``energy``.
    """
    width, st = _layout(width, color)
    lines: list[str] = []
    lines += _summary(report, st)
    lines.append("")
    lines += _main_rows(report, st, width, top, sort, by)
    if by == "role":
        if report.why:
            lines.append("")
            lines += _why(report, st)
        rep = _representative(report, st, width)
        if rep:
            lines += ["", *rep]
    lines.append("")
    lines += _by_layer(report, st, width)
    if report.has_times:
        lines.append("")
        lines += _time_shares(report, st, width)
    lines.append("")
    lines += _unattributed(report, st)
    return "\n".join(lines)


def render_breakdown(
    report: Report,
    *,
    top: int = 20,
    width: int | None = None,
    color: bool | None = None,
    sort: str | None = None,
    by: str = "role",
) -> str:
    """The main table of `render_table` alone: the ``top`` module roles across layers (``by="role"``,
    overhead rows among them) or single nodes (``by="node"``), by ``sort`` (``time``, the default
    when timed; ``flops``; ``energy``); ``top`` 0: every row. For a report shown inside a larger
    text: a generation scenario's prefill and decode step."""
    width, st = _layout(width, color)
    return "\n".join(_main_rows(report, st, width, top, sort, by))


def _layout(width: int | None, color: bool | None) -> tuple[int, _Style]:
    """The terminal's width and the style (ANSI bold only on a tty without NO_COLOR), unless given."""
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns
    if color is None:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return width, _Style(color)


def _main_rows(report: Report, st: _Style, width: int, top: int, sort: str | None, by: str) -> list[str]:
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}")
    sort = table_sort(report, sort)
    return _roles(report, st, width, top, sort) if by == "role" else _nodes(report, st, width, top, sort)


def _roles(report: Report, st: _Style, width: int, top: int, sort: str) -> list[str]:
    rows = ranked_roles(report, sort)
    no_rule = no_rule_roles(report)
    shown = rows[:top] if top > 0 else rows
    timed = report.has_times
    headers = ["role", "nodes", "FLOPs", "bytes", _intensity_header(report)]
    if timed:
        headers += ["time", SHARE_OF_TIME, "achieved", "of peak", "bound"]
    else:
        headers += [SHARE_OF_FLOPS]
    measured = any(r["measured_time_s"] is not None for r in rows)
    if measured:
        headers += ["measured"]
    out = []
    for r in shown:
        flops = flops_cell(r["flops"], nodes=r["nodes"], no_rule=no_rule.get(r["role"], 0))
        uncounted = flops == "-"  # no rule counts its work: no intensity or rate either
        row = [r["role"], str(r["nodes"]), flops, human(r["bytes"], "B"), "-" if uncounted else _fmt(r["intensity"])]
        if timed:
            bound = r["bound"] or "-"
            if r["bound_share"] is not None and r["bound_share"] < 0.995:
                bound += f" ({100 * r['bound_share']:.0f}%)"
            row += [
                seconds(r["time_s"]),
                percent(r["share"]),
                "-" if uncounted else human(r["achieved_flops_per_s"], "FLOP/s"),
                "-" if uncounted else percent(r["peak_fraction"]),
                bound,
            ]
        else:
            row += [percent(r["share"])]
        if measured:
            row.append(seconds(r["measured_time_s"]))
        out.append(row)
    note = " (share of summed time = node busy times + overhead rows; overheads are rows of their own)" if timed else ""
    title = st.bold(f"Top {len(shown)} of {len(rows)} module roles by {SORT_WORDS[sort]}, all layers together") + note
    return [
        title,
        *_grid(
            headers,
            out,
            width,
            right=set(range(1, len(headers))) - {len(headers) - 1} if timed else set(range(1, len(headers))),
        ),
        *no_rule_legend([row[2] for row in out]),
    ]


def _why(report: Report, st: _Style) -> list[str]:
    return [st.bold("Why"), *(f"  {w['text']}" for w in report.why)]


def role_table(
    rows: Sequence[dict[str, Any]],
    *,
    share: Callable[[float | None], str],
    spread: Callable[[float | None], str],
    no_rule: Mapping[str, int] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """The representative layer's table (`attribution.representative_layer` ``rows``) as every
    renderer shows it: headers and one row per role, the time columns only when timed; ``share`` and
    ``spread`` write those two cells (a bar in HTML); ``no_rule`` (`no_rule_roles`) marks the FLOPs
    of roles whose nodes have no cost rule (`flops_cell`)."""
    timed = any(r["time_s"] is not None for r in rows)
    headers = ["role", "nodes", "FLOPs", "bytes"] + (
        ["time", SHARE_OF_LAYER, "min", "max", "spread", "bound"] if timed else []
    )
    body = []
    for r in rows:
        # the role's nodes across every layer and how many of them have no rule: per layer, the same share
        counted = (no_rule or {}).get(r["role"], 0)
        total = r["nodes_per_layer"] * r["layers"]
        flops = flops_cell(r["flops"], nodes=max(total, 1), no_rule=counted)
        row = [r["role"], str(r["nodes_per_layer"]), flops, human(r["bytes"], "B")]
        if timed:
            row += [
                seconds(r["time_s"]),
                share(r["share"]),
                seconds(r["min_time_s"]),
                seconds(r["max_time_s"]),
                spread(r["spread"]),
                r["bound"] or "-",
            ]
        body.append(row)
    return headers, body


def _spread(spread: float | None) -> str:
    return "0%" if spread is not None and spread < 1e-6 else percent(spread)


def _representative(report: Report, st: _Style, width: int) -> list[str]:
    from .attribution import representative_layer

    rows = representative_layer(report)
    if not rows:
        return []
    headers, out = role_table(rows, share=percent, spread=_spread, no_rule=no_rule_roles(report))
    n = max(r["layers"] for r in rows)
    title = st.bold(f"One decoder layer (median of {n} layers), every role; min/max/spread across layers")
    return [
        title,
        *_grid(headers, out, width, right=set(range(1, len(headers))) - {len(headers) - 1}),
        *no_rule_legend([row[2] for row in out]),
    ]


def _nodes(report: Report, st: _Style, width: int, top: int, sort: str) -> list[str]:
    timed = report.has_times
    nodes = ranked_nodes(report, sort)
    no_rule = {e.get("name") for e in report.extra.get("estimated") or ()}
    energy = any(n.energy_j is not None for n in report.nodes)
    shown = nodes[:top] if top > 0 else nodes
    headers = ["node", "role", "op", "layer", "FLOPs", "bytes", _intensity_header(report)]
    if timed:
        headers += ["time", SHARE_OF_TIME, "bound", "unit"]
    measured = any(n.measured_time_s is not None for n in report.nodes)
    if measured:
        headers += ["measured"]
    if energy:
        headers += ["energy"]
    rows = []
    for n in shown:
        row = [
            n.name,
            n.role or "-",
            n.op_type,
            "-" if n.layer is None else str(n.layer),
            flops_cell(n.flops, no_rule=int(n.name in no_rule)),
            human(n.bytes, "B"),
            "-" if n.intensity is None or n.name in no_rule else f"{n.intensity:.3g}",
        ]
        if timed:
            row += [seconds(n.time_s), percent(node_share(report, n)), n.bound or "-", n.unit or "-"]
        if measured:
            row += [seconds(n.measured_time_s)]
        if energy:
            row += [human(n.energy_j, "J")]
        rows.append(row)
    right = set(range(3, len(headers))) - {headers.index(h) for h in ("bound", "unit") if h in headers}
    return [
        st.bold(f"Top {len(shown)} of {len(report.nodes)} nodes by {SORT_WORDS[sort]}"),
        *_grid(headers, rows, width, right),
        *no_rule_legend([row[4] for row in rows]),
    ]


def _train_basis(config: dict) -> str:
    """What a training step holds beyond the graph: its loss and optimizer (docs/training.md)."""
    from dabench_ir.passes.meta import TrainingRecord

    if not config.get("train"):
        return ""
    train = TrainingRecord.from_dict(config["train"])  # the report's config.train: the pass's record
    loss = "softmax cross-entropy loss" if train.loss else "no loss (no language-model logits)"
    return f" ({loss}, {train.optimizer}, recompute {train.recompute_mode})"


def _summary(report: Report, st: _Style) -> list[str]:
    t, m, c = report.totals, report.metrics, report.config
    chips = c.get("chips") if "per_chip" in report.extra else None  # a multi-chip step
    model = report.model
    name = model.get("preset") or model.get("family") or model.get("name")
    out = [
        st.bold(f"dabench-ir profile: {model.get('path') or name}"),
        f"  model      {model['nodes']} nodes, {model['layers']} layers, "
        f"{human(model['params'])} params"
        + (f" (+{human(model['constants'])} constants)" if model.get("constants") else "")
        + f", batch {c.get('batch')}, {c.get('precision') or '-'}, {c.get('mode')}{_train_basis(c)}",
        f"  work       {_work(t)}" + (f" (all {chips} chips: the model's work, every chip's bytes)" if chips else ""),
    ]
    if t.get("copies", 1) > 1:  # data-parallel copies of the graph (IPU replicas, WSE copies on the wafer)
        out[-1] += f" for one copy; {t['copies']} copies a step: {human(t['step_flops'], 'FLOP')}"
    one = report.extra.get("per_chip") or {}
    if chips and one.get("copies", 1) > 1:  # chips each doing a share: what one does, labelled apart
        out.append(f"  one chip   {_work(one)}, {human(one.get('params'))} params, {_chip_busy(report, one)}")
    if not t.get("estimated_nodes"):  # every summary says how many: none
        out.append("  estimated  0 nodes without a cost rule")
    else:  # nodes no rule counts: bytes-only lower bounds, named (issue 19)
        est = report.extra.get("estimated") or []
        share = t.get("estimated_time_share")
        out.append(
            st.red(
                f"  estimated  {t['estimated_nodes']} node(s) without a cost rule (estimated: no rule, bytes only), "
                f"{'-' if share is None else f'{100 * share:.1f}%'} of node time: "
                + ", ".join(sorted({e["op_type"] for e in est}))
            )
        )
    by_class = c.get("precision_by_class")
    if by_class:
        out.append("  precision  " + ", ".join(f"{k} {v}" for k, v in by_class.items()))
    if report.target:
        fits = "yes" if report.fits else st.red("NO")
        out.append(f"  target     {report.target['name']} ({report.target['kind']}), fits: {fits}")
        if report.failure:
            out.append(st.red(f"  failure    {failure_text(report.failure)}"))
        if m.get("memory_use"):
            per_device = "per device: " if "per_chip" in report.extra else ""  # one chip's placement's
            out.append(f"  memory     {per_device}{_memory_use(m['memory_use'])}")
        out += [f"  note       {note}" for note in report.extra.get("notes", ())]  # the lowering's basis
    if t.get("time_s") is not None:
        pipelined = (t.get("latency_s") or 0) > t["time_s"] * (1 + 1e-9)  # consecutive steps overlap
        per = "period (steady state)" if pipelined else "per step"
        out.append(
            f"  time       {seconds(t['time_s'])} {per}, {human(t['throughput_samples_per_s'])} samples/s, "
            f"{human(t['achieved_flops_per_s'], 'FLOP/s')} achieved in steady state"
            if t.get("throughput_samples_per_s") is not None
            else f"  time       {seconds(t['time_s'])} {per} if it fitted; throughput: does not fit"
        )
        if pipelined:
            out.append(f"  latency    {seconds(t['latency_s'])} for one step alone (first input to last output)")
        if chips:
            out.append(
                f"  chips      {chips} ({c.get('strategy')}): {seconds(t.get('comm_time_s'))} of "
                f"{comm_label(c.get('strategy'))}, "
                f"{human(t.get('link_bytes'), 'B')} over the links, speedup {times(m.get('speedup'))}, "
                f"scaling efficiency {percent(m.get('scaling_efficiency'))}"
            )
    if t.get("energy_j") is not None:
        out.append(
            f"  energy     {human(t['energy_j'], 'J')} per step, {human(t.get('energy_per_sample_j'), 'J')} per sample, "
            f"{human(t.get('power_w'), 'W')} modelled, {_fmt(t.get('gops_per_w'))} GOP/s per rated W"
            + (f" ({t['devices']} devices and their links)" if chips else "")
        )
    if report.target:
        out.append(
            f"  metrics    {'per chip: ' if chips else ''}allocation {percent(m.get('allocation_ratio'))}, load balance LI "
            f"{_fmt(m.get('load_imbalance'))}, efficiency {percent(m.get('compute_efficiency'))} of peak"
            + ("" if report.fits is not False else " if it fitted")
        )
    if report.extra.get("measurement"):
        out += _unmeasured(report)
    err = m.get("prediction_error")
    if err:
        out.append(f"  predicted  {prediction_text(err)}")
        if err.get("end_to_end_spread") is not None:
            verdict = "within" if err.get("end_to_end_within_noise") else "beyond"
            out.append(
                f"  noise      measured spread (IQR/median) {percent(err.get('end_to_end_spread'))} end to end, "
                f"{percent(err.get('median_node_spread'))} median node: the end-to-end error is {verdict} noise; "
                f"{err.get('nodes_within_noise')} of {err.get('nodes_compared')} node errors are within noise"
            )
    return out


def _chip_busy(report: Report, one: Mapping[str, Any]) -> str:
    """One chip's busy time a step (``extra.per_chip.time_s``) and what adds up to it: its node rows
    and its own overhead rows (the chip's host time: the step's collectives are not in it)."""
    from dabench_ir.report.roles import overhead_role

    busy = f"{seconds(one.get('time_s'))} busy ({report.extra.get('nodes_basis')})"
    own = one.get("overhead_s")
    if own is None:  # no one placement's figures (a pipeline's stage): the busy time alone
        return busy
    nodes = sum(n.time_s or 0.0 for n in report.nodes)
    names = [overhead_role(k) for k, v in (getattr(report.timeline, "overheads_s", None) or {}).items() if v]
    text = f"{busy}: {seconds(nodes)} in the node rows + {seconds(own)} in its own overhead rows" + (
        f" ({', '.join(names)})" if names else ""
    )
    rest = (one.get("time_s") or 0.0) - nodes - own
    if abs(rest) > 1e-6 * (one.get("time_s") or 0.0):  # concurrent nodes, or time no row holds
        text += f" - {seconds(-rest)} the nodes overlap" if rest < 0 else f" + {seconds(rest)} no row holds"
    return text


def _unmeasured(report: Report) -> list[str]:
    """A measured run's nodes that do work (FLOPs or bytes) but have no measured time (folded at compile
    time, a training graph's loss and optimizer, a node onnxruntime ran inside another): how many and
    how much, with their notes' reasons, so no work is silently left out of the measured step."""
    left = [n for n in report.nodes if n.measured_time_s is None and (n.flops or n.bytes)]
    if not left:
        return []
    why = sorted({(n.note or "no note").split(";")[0] for n in left})
    return [
        f"  unmeasured {len(left)} node(s) doing work have no measured time ({human(sum(n.flops or 0 for n in left), 'FLOP')}, "
        f"{human(sum(n.bytes or 0 for n in left), 'B')}): {'; '.join(why[:3])}{' ...' if len(why) > 3 else ''}"
    ]


def _memory_use(use: dict[str, dict[str, Any]], shown: int = 3) -> str:
    """What each memory holds against its capacity, the fullest first (``sram 1.2 GB of 40 GB (3.0%)``),
    ``shown`` of them and how many more (a pipeline's devices each have their own)."""
    rows = sorted(use.items(), key=lambda kv: -(kv[1].get("fraction") or 0.0))
    text = ", ".join(
        f"{name} {human(u.get('bytes'), 'B')} of {human(u.get('capacity_bytes'), 'B')} ({percent(u.get('fraction'))})"
        for name, u in rows[:shown]
    )
    return text + (f" and {len(rows) - shown} less full" if len(rows) > shown else "")


def _work(t: dict[str, Any]) -> str:
    """FLOPs by class, bytes and intensity of a totals block (the step's, or one chip's)."""
    return (
        f"{human(t['flops'], 'FLOP')} ({human(t['contraction_flops'], 'FLOP')} contraction, "
        f"{human(t['vector_flops'], 'FLOP')} vector, {human(t['special_ops'], 'op')} special), "
        f"{human(t['bytes'], 'B')} moved, intensity {_fmt(t.get('intensity'))} FLOP/B"
    )


def failure_text(failure: Mapping[str, Any]) -> str:
    """Why a plan does not fit: its reason, with the bytes it needs and has when the failure is one
    of capacity (a refused configuration, such as too few micro-batches for a pipeline, has none)."""
    needed, capacity = failure.get("needed_bytes"), failure.get("capacity_bytes")
    if needed is None and capacity is None:
        return failure["reason"]
    return f"{failure['reason']} (needs {human(needed, 'B')}, has {human(capacity, 'B')})"


def prediction_text(err: dict[str, Any]) -> str:
    """The prediction error in words, each figure with its basis: the step (predicted nodes and
    overheads against the measured run, its per-run overhead included), the node sum, the nodes."""
    basis = err.get("end_to_end_basis") or "node sum"
    if basis == "step":
        head = (
            f"end-to-end (step) error {percent(err.get('end_to_end_rel_error'))}: predicted step "
            f"{seconds(err.get('predicted_step_s'))} vs measured step {seconds(err.get('measured_step_s'))}"
        )
    else:
        head = f"end-to-end (node sum) error {percent(err.get('end_to_end_rel_error'))}"
    parts = [head]
    if basis == "step" and err.get("node_sum_rel_error") is not None:
        parts.append(
            f"node-sum error {percent(err.get('node_sum_rel_error'))} ({seconds(err.get('predicted_node_sum_s'))} "
            f"vs {seconds(err.get('measured_node_sum_s'))}, no overheads)"
        )
    parts.append(
        f"median node error {percent(err.get('median_node_rel_error'))} over {err.get('nodes_compared')} nodes"
    )
    return "; ".join(parts)


def _intensity_header(report: Report) -> str:
    """FLOP/B at the feed level on a placed report (the roofline's x), over every byte otherwise."""
    return "FLOP/B at feed" if report.target else "FLOP/B"


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def _by_layer(report: Report, st: _Style, width: int) -> list[str]:
    from .attribution import layer_runs

    runs = layer_runs(report)
    timed = report.has_times
    total_flops = sum(r["flops"] * r["count"] for r in runs)
    headers = ["layer", "count", "FLOPs", SHARE_OF_FLOPS, "bytes"] + (["time"] if timed else [])
    rows = []
    for r in runs:
        row = [
            r["layers"],
            f"x{r['count']}" if r["count"] > 1 else "1",
            human(r["flops"]),
            percent(r["flops"] / total_flops if total_flops else None),
            human(r["bytes"], "B"),
        ]
        if timed:
            row.append(seconds(r["time_s"]))
        rows.append(row)
    # the rows' own sums: on several chips the rows are one chip's nodes, the report's totals every chip's
    # (2 data-parallel H100s' rows summed to 115 GFLOP under a 'total' of 230)
    total_bytes = sum(r["bytes"] * r["count"] for r in runs)
    total_row = ["total", "", human(total_flops), "100.0%", human(total_bytes, "B")]
    if timed:  # the rows' own sum (node time), never the step: on a pipeline the step is a period
        total_row.append(seconds(sum(r["time_s"] * r["count"] for r in runs if r["time_s"] is not None)))
    rows.append(total_row)
    title = "Per layer (identical consecutive layers in one row; figures per layer; time: node busy time)"
    return [st.bold(title), *_grid(headers, rows, width, right=set(range(1, len(headers))))]


def _time_shares(report: Report, st: _Style, width: int) -> list[str]:
    """Time by op type and by bound class, each with the overheads as a row of its own (the bound
    class ``overhead``), every share of the summed time: each table sums to 100 %."""
    from .attribution import summed_time, time_groups

    out = []
    total = summed_time(report) or 1.0
    for key, title in (("op_type", "Time by op type"), ("bound", "Time by bound class")):
        groups = sorted(time_groups(report, key).items(), key=lambda kv: kv[1], reverse=True)[:10]
        rows = [[str(k or "-"), seconds(v), percent(v / total)] for k, v in groups]
        out += [st.bold(title), *_grid([key, "time", SHARE_OF_TIME], rows, width, right={1, 2}), ""]
    return out[:-1]


def _unattributed(report: Report, st: _Style) -> list[str]:
    if not report.unattributed:
        return ["Unattributed nodes: 0"]
    counted = [u for u in report.unattributed if u.get("flops") is not None]
    work = (
        f": {human(sum(u['flops'] for u in counted), 'FLOP')}, {human(sum(u['bytes'] for u in counted), 'B')} "
        f"counted on {len(counted)} of them"
        if counted
        else ""
    )
    out = [st.red(f"Unattributed nodes: {len(report.unattributed)} (not counted in the totals above{work})")]
    for u in report.unattributed[:10]:
        size = f" [{human(u['flops'], 'FLOP')}, {human(u['bytes'], 'B')}]" if u.get("flops") is not None else ""
        out.append(f"  {u['name']} ({u['op_type']}){size}: {u['reason']}")
    if len(report.unattributed) > 10:
        out.append(f"  ... and {len(report.unattributed) - 10} more (see --json)")
    return out
