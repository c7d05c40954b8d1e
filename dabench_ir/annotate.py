"""Write the model back with per-node cost annotations a user can see in Netron or MLIR.

- ONNX: node ``metadata_props`` (what Netron shows beside a node), readable keys first and
  the exact numbers after them: ``dabench.target``, ``dabench.time`` (``"15.8 µs"``),
  ``dabench.share``, ``dabench.bound``, ``dabench.role``, ``dabench.unit``, ``dabench.work``
  (``"1.23 MFLOP"``), ``dabench.moved`` (``"2.05 kB"``), ``dabench.layer``, then
  ``dabench.flops``, ``dabench.bytes``, ``dabench.intensity`` and ``dabench.time_s``
  (seconds, Python's shortest exact float text). Model-level props give the step.
  External weight data is never loaded; the file stays checker-valid.
- MLIR: the lowered linalg module with discardable attributes on every counted op
  (``dabench.flops = 1234 : i64``, ``dabench.bytes``, ``dabench.origin``, ...), printed
  so torch-mlir parses it back. The model-level figures the ONNX file carries as props (the
  step, its overheads, the target, the nodes outside the file) are comment lines at its top,
  ``// report: dabench.step_time_s = 0.0012`` (`REPORT_LINE`): MLIR tools skip comments, and
  the MLIR frontend reads only ``// dabench.key: value`` header lines, so re-profiling the
  file never takes a stale report's figures for the model's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, Graph, Node
from dabench_ir.passes.meta import COST, ESTIMATED, UNATTRIBUTED, attributed_cost

__all__ = [
    "PREFIX",
    "REPORT_LINE",
    "annotate",
    "annotate_mlir",
    "annotate_onnx",
    "annotate_report",
    "node_annotations",
    "report_annotations",
]

logger = logging.getLogger(__name__)

PREFIX = "dabench."
REPORT_LINE = "// report: {key} = {value}\n"
"""One model-level figure in an annotated .mlir (a comment: the ONNX file's model prop)."""

Extra = Mapping[Any, Mapping[str, Any]] | None
"""Per node (a Node or its name), more ``dabench.*`` values to write (a placed report's unit, time)."""
OutPath = str | os.PathLike[str]
"""Where an annotated model is written; its suffix (``.onnx``, ``.mlir``) picks the format."""
Props = Mapping[str, str] | None
"""Model-level ONNX props to add (a report's target and step time)."""


def _extra_by_name(extra: Extra) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for key, values in (extra or {}).items():
        out[key.name if isinstance(key, Node) else str(key)] = values
    return out


_READABLE = ("target", "time", "share", "bound", "role", "unit", "measured", "work", "moved", "layer")
"""Keys (after ``dabench.``) written first, in this order: what a reader looks for in Netron."""


def node_annotations(node: Node, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``dabench.*`` key/values for one node: the readable keys (`_READABLE`, in that
    order), then the exact numbers (FLOPs, bytes, intensity, seconds) and the rest."""
    from dabench_ir.report.table import human

    out: dict[str, Any] = {}
    cost: Cost | None = node.meta.get(COST)
    if cost is not None:
        out["dabench.work"] = human(cost.flops, "FLOP")
        out["dabench.moved"] = human(cost.bytes, "B")
        out["dabench.flops"] = cost.flops
        out["dabench.bytes"] = cost.bytes
        if cost.intensity is not None:
            out["dabench.intensity"] = round(cost.intensity, 6)
    if UNATTRIBUTED in node.meta:
        out["dabench.unattributed"] = str(node.meta[UNATTRIBUTED])
    if ESTIMATED in node.meta:  # a bytes-only lower bound: no rule counted it
        out["dabench.estimated"] = f"estimated: no rule ({node.meta[ESTIMATED]})"
    if node.layer is not None:
        out["dabench.layer"] = node.layer
    for key, value in (extra or {}).items():
        if value is None:
            continue
        out[key if key.startswith(PREFIX) else PREFIX + key] = value
    first = [PREFIX + k for k in _READABLE if PREFIX + k in out]
    return {k: out[k] for k in [*first, *(k for k in out if k not in first)]}


def report_annotations(report: Any) -> dict[str, dict[str, Any]]:
    """Per node name, what a placed (or measured) Report adds: its target, the node's time in
    human units and exact seconds, its share of the summed time, bound, role and unit, the dtype
    it computes in, its energy, and a note where its figure is an estimate or measured elsewhere."""
    from dabench_ir.report.attribution import TIME_BASIS, node_share
    from dabench_ir.report.table import percent, seconds

    target = (report.target or {}).get("name")
    out: dict[str, dict[str, Any]] = {}
    for n in report.nodes:
        values: dict[str, Any] = {
            "dabench.target": target,
            "dabench.role": n.role,
            "dabench.precision": n.precision,
            "dabench.energy_j": n.energy_j,
            "dabench.note": n.note,
        }
        if n.time_s is not None:
            share = node_share(report, n)
            values.update(
                {
                    "dabench.time": seconds(n.time_s),
                    "dabench.share": None if share is None else f"{percent(share)} of {TIME_BASIS}",
                    "dabench.bound": n.bound,
                    "dabench.unit": n.unit,
                    "dabench.time_s": n.time_s,
                }
            )
        if n.measured_time_s is not None:
            values["dabench.measured"] = seconds(n.measured_time_s) + " measured"
            values["dabench.measured_time_s"] = n.measured_time_s
        out[n.name] = values
    return out


def _report_props(report: Any) -> dict[str, str]:
    """Model-level ``dabench.*`` props of a report: target, step time (readable and exact) and its basis,
    the time no node owns, the energy, the nodes without a cost rule, and which chip's the nodes are."""
    from dabench_ir.report.table import seconds

    t = report.totals
    props = {
        "dabench.target": (report.target or {}).get("name"),
        "dabench.estimated_nodes": t.get("estimated_nodes", 0),
        # the step's work, every chip's in a multi-chip report (its node rows are one chip's share)
        "dabench.total_flops": t.get("flops"),
        "dabench.total_bytes": t.get("bytes"),
    }
    step = t.get("time_s")
    if step is not None:
        props.update(
            {
                "dabench.step_time": seconds(step),
                "dabench.step_time_s": step,
                "dabench.time_basis": t.get("time_basis"),
                "dabench.overhead_s": t.get("overhead_s"),
                "dabench.energy_j": t.get("energy_j"),
            }
        )
    if report.extra.get("nodes_basis"):  # a multi-chip report: the nodes are one chip's, the step the whole
        props["dabench.nodes_basis"] = report.extra["nodes_basis"]
    return {k: _text(v) for k, v in props.items() if v is not None}


def annotate_report(model: Any, report: Any, out_path: OutPath) -> Path:
    """`--annotate F` for a Report: `annotate` with `report_annotations`, and the report's target,
    step and overheads at model level (`_report_props`)."""
    return annotate(model, report.graph, out_path, report_annotations(report), model_props=_report_props(report))


def annotate_onnx(
    model: Any, graph: Graph, out_path: OutPath, extra: Extra = None, *, model_props: Props = None
) -> Path:
    """Copy of `model` (path or ModelProto) with ``dabench.*`` node metadata; returns the path.

    Nodes are matched by the names the ONNX frontend gives. External weight data is not
    read: initializers keep their references, so the data file must sit beside the output.
    """
    import onnx

    from dabench_ir.frontends.onnx import onnx_node_names, read_model

    proto, path = read_model(model)
    out = Path(out_path)
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    extras = _extra_by_name(extra)
    g = copy.graph
    written = 0
    in_file = onnx_node_names(g)
    for proto_node, name in zip(g.node, in_file, strict=True):
        kept = [p for p in proto_node.metadata_props if not p.key.startswith(PREFIX)]
        del proto_node.metadata_props[:]
        proto_node.metadata_props.extend(kept)
        if not graph.has_node(name):
            continue
        for key, value in node_annotations(graph.node(name), extras.get(name)).items():
            proto_node.metadata_props.add(key=key, value=_text(value))
        written += 1
    ours = _model_level(graph, set(in_file), extras, model_props)
    props = {p.key: p.value for p in copy.metadata_props if p.key not in ours}
    props.update(ours)
    del copy.metadata_props[:]
    for key, value in props.items():
        copy.metadata_props.add(key=key, value=value)
    _check_external_location(copy, path, out)
    try:
        onnx.save_model(copy, str(out), save_as_external_data=False)
    except OSError as exc:
        raise UserError(f"--annotate {out}: cannot write ({exc.strerror or exc})") from None
    logger.info("annotated %d ONNX node(s) into %s", written, out)
    return out


def _model_level(
    graph: Graph, in_file: set[str], extras: dict[str, Mapping[str, Any]], model_props: Props
) -> dict[str, str]:
    """The model-level ``dabench.*`` figures of an annotated file (ONNX props, MLIR report lines): the
    graph's total work, its nodes the file has no node for (`_outside_file`), then ``model_props`` (a
    report's step, overheads and target: `_report_props`), which win."""
    total = sum((c for c in map(attributed_cost, graph.nodes) if c is not None), Cost())
    out = {"dabench.total_flops": str(total.flops), "dabench.total_bytes": str(total.bytes)}
    out.update(_outside_file(graph, in_file, extras))
    out.update(model_props or {})
    return out


def _outside_file(graph: Graph, in_file: set[str], extras: dict[str, Mapping[str, Any]]) -> dict[str, str]:
    """Model-level props for the graph's nodes the file has no node for (a training step's loss and
    optimizer, which the training pass adds): their names and time, so that the file's node times,
    its ``dabench.overhead_s`` and these add up to its step."""
    outside = [n.name for n in graph.nodes if n.name not in in_file]
    if not outside:
        return {}
    seconds = sum(float(extras.get(name, {}).get("dabench.time_s") or 0.0) for name in outside)
    return {"dabench.nodes_outside_file": ", ".join(outside), "dabench.time_outside_file_s": _text(seconds)}


def _text(value: Any) -> str:
    """A prop's text; a float as ``repr`` (the shortest text that reads back to the same float)."""
    return repr(value) if isinstance(value, float) else str(value)


def _check_external_location(proto: Any, source: Path | None, out: Path) -> None:
    import onnx

    if source is None or source.resolve().parent == out.resolve().parent:
        return
    for init in proto.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            logger.warning(
                "%s references external weight data relative to its folder; copy the data file(s) "
                "from %s beside it to open the weights (annotations work without them)",
                out,
                source.parent,
            )
            return


def annotate_mlir(
    source: Any, graph: Graph, out_path: OutPath, extra: Extra = None, *, model_props: Props = None
) -> Path:
    """Write the lowered linalg module with ``dabench.*`` attributes on each counted op.

    Uses the module kept on `graph` by the MLIR frontend; otherwise lowers `source`
    (a .mlir or .onnx path) through torch-mlir first. Node-level `extra` values
    (unit, time_s) are put on every op of that node; the op-level work is
    `dabench_ir.mlir.annotate`'s. The model-level figures (`_model_level`: the totals, the
    nodes the module has no op for, ``model_props``) follow the header as `REPORT_LINE`
    comments, the same keys and values as an annotated ONNX file's props."""
    from dabench_ir.fileio import write_output
    from dabench_ir.mlir import MLIR_ARTIFACT
    from dabench_ir.mlir.annotate import annotate_ops, header_lines, lowered_for_annotation

    mlir_graph = graph if MLIR_ARTIFACT in graph.meta else lowered_for_annotation(source, graph)
    extras = _extra_by_name(extra)
    per_node = {}
    for node in mlir_graph.nodes:
        base = graph.node(node.name) if graph.has_node(node.name) else node
        per_node[node.name] = (node_annotations(base, extras.get(node.name)), attributed_cost(base) or Cost())
    count = annotate_ops(mlir_graph, per_node)
    module = mlir_graph.meta[MLIR_ARTIFACT].module
    out = Path(out_path)
    in_file = {node.name for node in mlir_graph.nodes}  # a training step's loss and optimizer are not
    report = "".join(
        REPORT_LINE.format(key=k, value=" ".join(v.split()))  # one line each
        for k, v in _model_level(graph, in_file, extras, model_props).items()
    )
    write_output(out, header_lines(graph, mlir_graph) + report + module.operation.get_asm(enable_debug_info=True))
    logger.info("annotated %d MLIR op(s) into %s", count, out)
    return out


def annotate(model: Any, graph: Graph, out_path: OutPath, extra: Extra = None, *, model_props: Props = None) -> Path:
    """`--annotate F`: annotated ONNX for ``.onnx`` F, annotated linalg MLIR for ``.mlir`` F; both
    carry ``model_props`` (ONNX as model props, MLIR as report lines)."""
    suffix = Path(out_path).suffix.lower()
    if suffix == ".onnx":
        model_suffix = Path(model).suffix.lower() if isinstance(model, (str, os.PathLike)) else ".onnx"
        if model_suffix == ".mlir":
            raise UserError(f"--annotate {out_path}: an .mlir model can only be annotated as .mlir")
        return annotate_onnx(model, graph, out_path, extra, model_props=model_props)
    if suffix == ".mlir":
        return annotate_mlir(model, graph, out_path, extra, model_props=model_props)
    raise UserError(f"--annotate {out_path}: expected a .onnx or .mlir file name")
