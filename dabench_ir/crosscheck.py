"""Node-by-node comparison of ONNX-rule costs with linalg-level (formula-free) costs.

Both graphs name their nodes after the ONNX nodes (`onnx_via_mlir` keeps the ONNX
frontend's names), so the join is by name. Contraction FLOPs are expected to agree
exactly; vector-op differences come from how ops decompose (see docs/mlir.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dabench_ir.ir import Cost, Graph
from dabench_ir.passes.meta import COST, UNATTRIBUTED

__all__ = ["CrossCheck", "CrossCheckRow", "cross_check", "render_cross_check"]


@dataclass(frozen=True, slots=True)
class CrossCheckRow:
    """One ONNX node: its ONNX-rule cost beside its linalg cost (None where one side has none)."""

    name: str
    op_type: str
    layer: int | None
    onnx: Cost | None
    mlir: Cost | None

    @property
    def compared(self) -> bool:
        return self.onnx is not None and self.mlir is not None

    @property
    def onnx_flops(self) -> int | None:
        return None if self.onnx is None else self.onnx.flops

    @property
    def mlir_flops(self) -> int | None:
        return None if self.mlir is None else self.mlir.flops

    @property
    def diff(self) -> int | None:
        """linalg FLOPs - ONNX FLOPs."""
        return self.mlir.flops - self.onnx.flops if self.compared else None  # type: ignore[union-attr]

    @property
    def rel_diff(self) -> float | None:
        """|diff| / ONNX FLOPs (inf when the ONNX rule says 0 and linalg does not)."""
        if not self.compared:
            return None
        o, d = self.onnx.flops, abs(self.diff or 0)  # type: ignore[union-attr]
        if d == 0:
            return 0.0
        return d / o if o else math.inf

    @property
    def agrees(self) -> bool:
        return self.compared and self.diff == 0

    @property
    def contraction_agrees(self) -> bool:
        return self.compared and self.onnx.contraction_flops == self.mlir.contraction_flops  # type: ignore[union-attr]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "layer": self.layer,
            "onnx": None if self.onnx is None else self.onnx.as_dict(),
            "mlir": None if self.mlir is None else self.mlir.as_dict(),
            "onnx_flops": self.onnx_flops,
            "mlir_flops": self.mlir_flops,
            "diff": self.diff,
            "rel_diff": self.rel_diff,
        }


@dataclass(frozen=True)
class CrossCheck:
    """All rows, plus what only one side has, and the summary figures."""

    rows: list[CrossCheckRow]
    only_mlir: dict[str, Cost] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # unattributed entries: reason

    @property
    def compared(self) -> list[CrossCheckRow]:
        return [r for r in self.rows if r.compared]

    @property
    def nodes_compared(self) -> int:
        return len(self.compared)

    @property
    def nodes_agreeing(self) -> int:
        return sum(r.agrees for r in self.compared)

    @property
    def contraction_disagreeing(self) -> list[CrossCheckRow]:
        return [r for r in self.compared if not r.contraction_agrees]

    @property
    def largest(self) -> CrossCheckRow | None:
        """The compared row with the largest relative difference (None when all agree)."""
        diffs = [r for r in self.compared if r.rel_diff]
        return max(diffs, key=lambda r: (r.rel_diff, abs(r.diff or 0))) if diffs else None

    @property
    def total_onnx(self) -> Cost:
        return sum((r.onnx for r in self.compared), Cost())  # type: ignore[misc]

    @property
    def total_mlir(self) -> Cost:
        return sum((r.mlir for r in self.compared), Cost())  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        largest = self.largest
        return {
            "nodes_compared": self.nodes_compared,
            "nodes_agreeing": self.nodes_agreeing,
            "contraction_disagreeing": [r.name for r in self.contraction_disagreeing],
            "largest_rel_diff": None if largest is None else {"name": largest.name, "rel_diff": largest.rel_diff},
            "total_onnx_flops": self.total_onnx.flops,
            "total_mlir_flops": self.total_mlir.flops,
            "only_mlir": {k: v.as_dict() for k, v in self.only_mlir.items()},
            "rows": [r.to_dict() for r in self.rows],
        }


def _cost(graph: Graph, name: str) -> Cost | None:
    if not graph.has_node(name):
        return None
    node = graph.node(name)
    if UNATTRIBUTED in node.meta:
        return None
    return node.meta.get(COST)


def cross_check(onnx_graph: Graph, mlir_graph: Graph) -> CrossCheck:
    """Join the two graphs by node name and compare costs (see `CrossCheck`)."""
    rows = [
        CrossCheckRow(
            name=n.name,
            op_type=n.op_type,
            layer=n.layer,
            onnx=_cost(onnx_graph, n.name),
            mlir=_cost(mlir_graph, n.name),
        )
        for n in onnx_graph.nodes
        if UNATTRIBUTED not in n.meta or mlir_graph.has_node(n.name)
    ]
    only = {
        n.name: n.meta.get(COST, Cost())
        for n in mlir_graph.nodes
        if not onnx_graph.has_node(n.name) and (UNATTRIBUTED in n.meta or n.meta.get(COST, Cost()) != Cost())
    }
    notes = {n.name: n.meta[UNATTRIBUTED] for n in mlir_graph.nodes if UNATTRIBUTED in n.meta}
    return CrossCheck(rows, only, notes)


def _fmt(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _rel(r: float | None) -> str:
    if r is None:
        return "-"
    if math.isinf(r):
        return "new"
    return f"{100 * r:.1f}%"


def render_cross_check(result: CrossCheck, *, show: str = "differences", limit: int | None = 40) -> str:
    """Text table: per node ONNX-rule FLOPs, linalg FLOPs, difference; then the summary.

    ``show``: "differences" (rows that differ, or that one side lacks) or "all".
    """
    rows = result.rows if show == "all" else [r for r in result.rows if not r.agrees]
    rows = sorted(rows, key=lambda r: -(abs(r.diff) if r.diff is not None else -1))
    hidden = 0
    if limit is not None and len(rows) > limit:
        hidden = len(rows) - limit
        rows = rows[:limit]
    header = ("node", "op", "layer", "onnx flops", "linalg flops", "diff", "rel", "contraction")
    table = [header]
    for r in rows:
        contraction = "-" if not r.compared else ("=" if r.contraction_agrees else "DIFFERS")
        table.append(
            (
                r.name,
                r.op_type,
                "-" if r.layer is None else str(r.layer),
                _fmt(r.onnx_flops),
                _fmt(r.mlir_flops),
                "-" if r.diff is None else f"{r.diff:+,}",
                _rel(r.rel_diff),
                contraction,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for k, row in enumerate(table):
        cells = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    if hidden:
        lines.append(f"... {hidden} more row(s)")
    if len(table) == 1:
        lines.append("(every compared node agrees exactly)")
    for name, cost in result.only_mlir.items():
        note = result.notes.get(name)
        lines.append(f"linalg only: {name}: {cost.flops:,} FLOPs" + (f" ({note})" if note else ""))
    largest = result.largest
    bad = result.contraction_disagreeing
    lines += [
        "",
        f"nodes compared: {result.nodes_compared}",
        f"nodes agreeing exactly: {result.nodes_agreeing}",
        f"contraction FLOPs: {'agree on every node' if not bad else f'differ on {len(bad)} node(s)'}",
        "largest relative difference: "
        + ("none" if largest is None else f"{_rel(largest.rel_diff)} ({largest.name}, {largest.op_type})"),
        f"total FLOPs: onnx {result.total_onnx.flops:,}, linalg {result.total_mlir.flops:,}",
    ]
    return "\n".join(lines)
