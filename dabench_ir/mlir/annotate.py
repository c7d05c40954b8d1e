"""Annotating a lowered linalg module: ``dabench.*`` attributes on every counted op, and the header
lines the MLIR frontend reads back (`dabench_ir.annotate.annotate_mlir` asks for them per node).
torch-mlir is imported inside the functions that need it."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dabench_ir.ir import Cost, Graph, ValueKind
from dabench_ir.passes.meta import MODEL_WEIGHTS

__all__ = ["annotate_ops", "header_lines", "lowered_for_annotation"]

logger = logging.getLogger(__name__)

_NODE_KEYS = ("dabench.target", "dabench.layer", "dabench.unit", "dabench.bound", "dabench.role")
"""A node's annotations every op of it carries as they are."""


def annotate_ops(mlir_graph: Graph, per_node: Mapping[str, tuple[Mapping[str, Any], Cost]]) -> int:
    """Set ``dabench.*`` attributes on each counted op of ``mlir_graph``'s module from its node's
    annotations and cost (``per_node``: name -> (annotations, the cost the report has)): the node's
    FLOPs, bytes and time shared over its ops as they counted, so that they sum to the node's.
    Returns how many ops were annotated."""
    from torch_mlir import ir

    from dabench_ir.mlir import MLIR_ARTIFACT, MLIR_OPS
    from dabench_ir.mlir.pipelines import whole_shares
    from dabench_ir.report.table import seconds

    count = 0
    with mlir_graph.meta[MLIR_ARTIFACT].module.context, ir.Location.unknown():
        i64, f64 = ir.IntegerType.get_signless(64), ir.F64Type.get()
        for node in mlir_graph.nodes:
            node_extra, cost = per_node[node.name]
            ops = [c for c in node.meta.get(MLIR_OPS, []) if c.op is not None]
            shares = _op_shares(ops)
            # the node's FLOPs and bytes as the report has them (a folded weight layout costs
            # nothing; a fused core moves less), shared over its ops as they counted: they sum to it
            flops = whole_shares(cost.flops, [c.cost.flops for c in ops])
            nbytes = whole_shares(cost.bytes, [c.cost.bytes for c in ops])
            for c, share, op_flops, op_bytes in zip(ops, shares, flops, nbytes, strict=True):
                attrs: dict[str, Any] = {
                    "dabench.flops": op_flops,
                    "dabench.bytes": op_bytes,
                    "dabench.class": c.op_class,
                    "dabench.origin": node.name,
                }
                if op_bytes:
                    attrs["dabench.intensity"] = round(op_flops / op_bytes, 6)
                attrs.update({key: node_extra[key] for key in _NODE_KEYS if key in node_extra})
                if "dabench.time_s" in node_extra:  # the node's time split over its ops: they sum to it
                    attrs["dabench.time_s"] = float(node_extra["dabench.time_s"]) * share
                    attrs["dabench.time"] = seconds(attrs["dabench.time_s"])
                    attrs["dabench.time_share"] = round(share, 6)
                if c.reason:
                    attrs["dabench.unattributed"] = c.reason
                for key, value in attrs.items():
                    c.op.attributes[key] = _attr(value, i64, f64)
                count += 1
    return count


def _op_shares(ops: list[Any]) -> list[float]:
    """Each op's share of its node: by FLOPs, else by bytes, else equal; the shares sum to 1."""
    for key in ("flops", "bytes"):
        total = sum(getattr(c.cost, key) for c in ops)
        if total > 0:
            return [getattr(c.cost, key) / total for c in ops]
    return [1.0 / len(ops)] * len(ops) if ops else []


def header_lines(graph: Graph, mlir_graph: Graph) -> str:
    """``// dabench.key: value`` lines the MLIR frontend reads back: the model's facts (family,
    preset, shape) and which function arguments are weights, so that re-profiling the
    annotated file keeps the parameter count and the layers."""
    from dabench_ir.mlir import MLIR_ARTIFACT, entry_func

    header = {
        k: v
        for k, v in graph.metadata.items()
        if k.startswith("dabench.") and k not in ("dabench.frontend", MODEL_WEIGHTS) and "\n" not in str(v)
    }
    artifact = mlir_graph.meta.get(MLIR_ARTIFACT)
    weights = sorted(getattr(artifact, "weight_args", ()) or ())
    n_args = len(entry_func(artifact.module).regions[0].blocks[0].arguments) if artifact is not None else 0
    if weights and weights == list(range(n_args - len(weights), n_args)):  # the loader's convention: (x, *weights)
        names = [v.name for v in graph.values.values() if v.kind is ValueKind.WEIGHT]
        header[MODEL_WEIGHTS] = json.dumps(names if len(names) == len(weights) else [f"arg{i}" for i in weights])
    elif weights:
        logger.warning("annotated MLIR: weight arguments are not the trailing ones; the parameter count is not kept")
    return "".join(f"// {k}: {v}\n" for k, v in header.items())


def _attr(value: Any, i64: Any, f64: Any) -> Any:
    from torch_mlir import ir

    if isinstance(value, bool):
        return ir.BoolAttr.get(value)
    if isinstance(value, int):
        return ir.IntegerAttr.get(i64, value)
    if isinstance(value, float):
        return ir.FloatAttr.get(f64, value)
    return ir.StringAttr.get(str(value))


def lowered_for_annotation(source: Any, graph: Graph) -> Graph:
    """The linalg graph of ``source`` (a .mlir or .onnx path, or an ONNX model), at ``graph``'s
    bindings and costed, for a graph that the ONNX path profiled."""
    from dabench_ir.mlir import load_mlir, onnx_via_mlir
    from dabench_ir.passes import PassManager
    from dabench_ir.run import analysis_passes

    suffix = Path(source).suffix.lower() if isinstance(source, (str, os.PathLike)) else ".onnx"
    dims = dict(graph.bindings)
    lowered = load_mlir(source, dims=dims) if suffix == ".mlir" else onnx_via_mlir(source, dims=dims)
    return PassManager(analysis_passes(dims, linalg=True))(lowered).graph
