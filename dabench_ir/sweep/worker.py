"""What one worker does: profile every point that shares a model, from one costed Graph.

`run_group` is the unit of work every executor runs (a local process or a Ray task), so
both give identical records. The Graph is costed once per model and copied (pickle) for
each point; a point that fails is recorded with its error and the others go on.
"""

from __future__ import annotations

import logging
import pickle
import time
import traceback
from typing import Any

from dabench_ir.report.model import _clean

__all__ = ["point_options", "profile_graph", "run_export", "run_group"]

logger = logging.getLogger(__name__)


def point_options(params: dict[str, Any]) -> Any:
    """A point's run options: every knob ``sweep`` offers that the point sets."""
    from dabench_ir.options import SWEEP, ScaleOptions, knobs_for

    return ScaleOptions(**{k: params[k] for k in knobs_for(SWEEP) if params.get(k) is not None})


def profile_graph(graph: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The report dict of one point, from its costed Graph (consumed: precision rewrites it)."""
    from dabench_ir import pipeline

    opts = point_options(params)
    target = pipeline.resolve_target(params["target"], opts)
    opts = pipeline.resolve_defaults(opts, target)
    graph = pipeline.build_passes(opts, analysis=False)(graph).graph
    if opts.chips != 1:
        return _scaled(graph, target, opts)
    return _clean(pipeline.profile_graph(graph, target, opts).to_dict())


def _scaled(graph: Any, target: Any, opts: Any) -> dict[str, Any]:
    """A multi-chip point through `dabench_ir.scaling.scale`, as a report-shaped dict.

    ``totals``/``metrics``/``fits``/``failure`` carry the scaled figures so the results
    table reads them like any other point; ``scale`` keeps the whole scaling record.
    """
    from dabench_ir.report.build import build_report
    from dabench_ir.scaling import scale

    chips = opts.chips
    result = scale(graph, target, [1, chips], opts.strategy, opts)
    point = result.points[-1]
    base = build_report(graph, options=opts)  # cost-only: model and totals of one run
    flops_per_sample = base.totals["flops"] / max(result.points[0].batch, 1)
    report = base.to_dict()
    report["target"] = {"name": target.name, "kind": target.kind}
    report["config"].update({"chips": chips, "strategy": opts.strategy})
    report["totals"].update(
        {
            "time_s": point.time_s,
            "throughput_samples_per_s": point.throughput_samples_per_s,
            "achieved_flops_per_s": None if point.throughput_samples_per_s is None  # does not fit
            else point.throughput_samples_per_s * flops_per_sample,
            "comm_time_s": point.comm_time_s,
        }
    )
    report["metrics"].update(
        {
            "allocation_ratio": point.allocation_ratio,
            "load_imbalance": point.load_imbalance,
            "compute_efficiency": point.compute_efficiency,
            "speedup": point.speedup,
            "scaling_efficiency": point.scaling_efficiency,
            "comm_share": point.comm_share,
            "dominant_bound": point.dominant_bound,
        }
    )
    report["fits"], report["failure"] = point.fits, point.failure
    report["nodes"] = []  # per-node times are per chip; the scaling record holds the step
    report["scale"] = result.to_dict()
    return _clean(report)


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


def run_group(base: bytes, layers: int, points: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Profile ``points`` (key, params) that share the model ``base`` stamped to ``layers``.

    Returns one record per point: ``{"key", "params", "status", "error", "seconds", "report"}``.
    """
    from dabench_ir.sweep.graphs import build_graph

    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    try:
        graph = build_graph(base, layers)
        blob = pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL) if len(points) > 1 else None
        setup_error = None
    except Exception as exc:
        logger.debug("building the %d-layer graph failed", layers, exc_info=True)
        graph, blob, setup_error = None, None, exc
    share = (time.perf_counter() - start) / max(len(points), 1)
    for i, (key, params) in enumerate(points):
        t0 = time.perf_counter()
        record: dict[str, Any] = {"key": key, "params": params, "status": "ok", "error": None, "report": None}
        try:
            if setup_error is not None:
                raise setup_error
            g = graph if (blob is None or i == len(points) - 1) else pickle.loads(blob)
            record["report"] = profile_graph(g, params)
        except Exception as exc:
            record["status"], record["error"] = "error", _error_text(exc)
            record["traceback"] = traceback.format_exc(limit=8)
        record["seconds"] = time.perf_counter() - t0 + share
        records.append(record)
    return records


def run_export(key: str, params: dict[str, Any]) -> tuple[str, bytes | None, str | None]:
    """Export one base: ``(key, serialized model or None, error or None)``."""
    from dabench_ir.sweep.graphs import export_base

    try:
        return key, export_base(params), None
    except Exception as exc:
        logger.debug("export of %s failed", key, exc_info=True)
        return key, None, _error_text(exc)
