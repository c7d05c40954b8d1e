"""What one worker does: profile every point that shares a model, from one costed Graph.

`run_group` is the unit of work every executor runs (a local process or a Ray task), so
both give identical records. The Graph is costed once per model and each point runs on its
own `Graph.clone`; a point that fails is recorded with its error and the others go on.
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import Any

from dabench_ir.report.model import json_safe

__all__ = ["point_options", "profile_graph", "run_export", "run_group", "times_nodes"]

logger = logging.getLogger(__name__)


def point_options(params: dict[str, Any]) -> dict[str, Any]:
    """A point's run options: every knob ``sweep`` offers that the point sets (the user's, for `resolve`)."""
    from dabench_ir.options import SWEEP, knobs_for

    return {k: params[k] for k in knobs_for(SWEEP) if params.get(k) is not None}


def profile_graph(graph: Any, params: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """The report dict of one point, from its costed Graph (consumed: the rewrites work in place).

    The point is one run (`dabench_ir.run`), resolved and executed exactly as ``profile`` would,
    one chip or many; ``model``: the graph's ONNX file, for a point that needs one (`times_nodes`)."""
    return json_safe(_report_dict(graph, params, model))


def times_nodes(params: dict[str, Any]) -> bool:
    """Whether the point's run times the model's nodes on this host: the ``cpu`` target predicts from
    a node table measured on the model file (`run._prepared`, `microbench.ensure_for_target`), as
    ``profile`` does, so such a point's run is given the stamped model as a file (`run_group`)."""
    from dabench_ir.errors import UserError
    from dabench_ir.sweep.spec import target_kind

    try:
        return target_kind(str(params["target"])) == "cpu"
    except UserError:  # an unknown target: the point fails with the target's own error
        return False


def _report_dict(graph: Any, params: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    from dabench_ir.run import execute, resolve

    run = resolve(graph, params["target"], point_options(params), model=model if times_nodes(params) else None)
    return execute(run, graph).to_dict()


def _model_file(base: bytes, layers: int, path: str) -> str:
    """The stamped model of ``base`` at ``layers`` as the ONNX file ``path`` (in the sweep's model
    cache), written atomically unless a complete one is there: a sweep running beside this one
    writes the same bytes."""
    from dabench_ir.fileio import write_output
    from dabench_ir.sweep.graphs import stamped_proto

    data = stamped_proto(base, layers).SerializeToString()
    target = Path(path)
    try:
        same = target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data
    except OSError:
        same = False
    if not same:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_output(target, data)
    return path


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


def run_group(
    base: bytes,
    layers: int,
    points: list[tuple[str, dict[str, Any]]],
    folder: str | None = None,
    node_detail: bool = True,
    model_file: str | None = None,
) -> list[dict[str, Any]]:
    """Profile ``points`` (key, params) that share the model ``base`` stamped to ``layers``.

    ``model_file``: where the stamped model goes as a file (`_model_file`), for the points whose run
    times its nodes (`times_nodes`), as ``profile`` runs the file.

    Each point's record (``{"key", "params", "status", "error", "seconds", "report"}``, the report
    without its per-node rows unless ``node_detail``) is encoded here, once, and either written into
    ``folder`` (the sweep's ``points/``, when this worker shares the driver's files:
    `results.write_point`) or returned as that text for the driver to write (`results.encode_point`). Returns one summary per point:
    ``{"key", "status", "error", "row"}`` (`results.record_row`), plus ``"text"`` without ``folder``.
    No report crosses a pipe or an object store as Python objects: decoding them there cost the
    driver more than the encoding costs a worker.
    """
    from dabench_ir.sweep import results
    from dabench_ir.sweep.graphs import build_graph

    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    try:
        graph = build_graph(base, layers)
        model = _model_file(base, layers, model_file) if model_file else None
        setup_error = None
    except Exception as exc:
        logger.debug("building the %d-layer graph failed", layers, exc_info=True)
        graph, setup_error = None, exc
    share = (time.perf_counter() - start) / max(len(points), 1)
    for i, (key, params) in enumerate(points):
        t0 = time.perf_counter()
        record: dict[str, Any] = {"key": key, "params": params, "status": "ok", "error": None, "report": None}
        try:
            if setup_error is not None:
                raise setup_error
            record["report"] = _report_dict(graph if i == len(points) - 1 else graph.clone(), params, model)
        except Exception as exc:
            record["status"], record["error"] = "error", _error_text(exc)
            record["traceback"] = traceback.format_exc(limit=8)
        record["seconds"] = time.perf_counter() - t0 + share
        if not node_detail:
            results.strip_nodes(record)
        summary = {"key": key, "status": record["status"], "error": record["error"]}
        if folder is None:
            summary.update(row=results.record_row(record), text=results.encode_point(record))
        else:
            summary["row"] = results.write_point(Path(folder), record)
        records.append(summary)
    return records


def run_export(key: str, params: dict[str, Any]) -> tuple[str, bytes | None, str | None]:
    """Export one base: ``(key, serialized model or None, error or None)``."""
    from dabench_ir.sweep.graphs import export_base

    try:
        return key, export_base(params), None
    except Exception as exc:
        logger.debug("export of %s failed", key, exc_info=True)
        return key, None, _error_text(exc)
