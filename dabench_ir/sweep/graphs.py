"""Graphs for sweeps, built without re-exporting per point: export once, stamp layers.

A sweep's models differ mostly in layer count. One weight-free, 1-layer ONNX "base" is
exported with torch per (family, hidden, heads, seq, batch, ...) — precision and target do
not change it — shape-inferred once, and cached on disk. A point's L-layer graph is the base
with its block stamped L-1 more times at the ONNX level (`models.export.stamp_layers`),
loaded without a second shape inference (the stamped copies carry the base's inferred
types), and costed once for every point that shares the model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.sweep.spec import MODEL_PARAMS

if TYPE_CHECKING:
    import onnx

    from dabench_ir.ir import Graph
    from dabench_ir.models import ModelConfig

__all__ = [
    "base_config",
    "base_key",
    "build_graph",
    "default_cache",
    "export_base",
    "export_missing",
    "exporter_versions",
    "load_base",
    "model_key",
    "save_base",
]

logger = logging.getLogger(__name__)

_EXPORT_VERSION = "1"  # bump when the base export changes, to invalidate caches


def _model_fields(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in MODEL_PARAMS if params.get(k) is not None}


def base_config(params: dict[str, Any]) -> ModelConfig:
    """The 1-layer `ModelConfig` of a point's model."""
    from dabench_ir.models import ModelConfig, get_preset

    fields = _model_fields(params)
    fields["layers"] = 1
    preset = fields.pop("preset", None)
    if preset:
        return get_preset(preset, **fields)
    return ModelConfig(**fields)


def default_cache() -> Path:
    """Where base exports are cached unless ``--cache-dir`` says otherwise: ``models`` in the user's
    dabench-ir cache (`execute.calibrate.cache_dir`), shared by every sweep, study and validation."""
    from dabench_ir.execute.calibrate import cache_dir

    return cache_dir() / "models"


@functools.cache
def exporter_versions() -> dict[str, str]:
    """The versions of the packages an export comes from (a cached base outlives an upgrade)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "onnxscript", "onnx"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "none"
    return found


def base_key(params: dict[str, Any]) -> str:
    """Cache key of a point's base export: model parameters except layers, the tool's version and
    the exporter's (torch, onnxscript, onnx)."""
    from dabench_ir import __version__

    cfg = base_config(params)
    text = json.dumps(
        {"cfg": cfg.to_dict(), "v": __version__, "export": _EXPORT_VERSION, **exporter_versions()}, sort_keys=True
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{cfg.family}-h{cfg.hidden}-n{cfg.heads}-s{cfg.seq}-b{cfg.batch}-{digest}"


def model_key(params: dict[str, Any]) -> str:
    """The model a point needs: its base and its layer count."""
    return f"{base_key(params)}-L{params['layers']}"


def export_base(params: dict[str, Any]) -> bytes:
    """Export the point's 1-layer, weight-free base with torch and shape-infer it (serialized)."""
    import onnx

    from dabench_ir.models.export import export_onnx

    cfg = base_config(params)
    proto = export_onnx(cfg, weights="none", dynamic=False, stamp=True)
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    return proto.SerializeToString()


def save_base(folder: Path, key: str, data: bytes) -> Path:
    """Write a base export into the cache atomically (tmp file + os.replace)."""
    from dabench_ir.fileio import write_output

    folder.mkdir(parents=True, exist_ok=True)
    return write_output(folder / f"{key}.onnx", data)


def load_base(folder: Path, key: str) -> bytes | None:
    """A cached base export, or None when absent or damaged (then it is exported again).

    The bytes must parse as an ONNX model that passes `onnx.checker` with a graph of
    nodes; a truncated or overwritten file is removed so the export replaces it.
    """
    import onnx
    from google.protobuf.message import DecodeError

    path = folder / f"{key}.onnx"
    try:
        if not path.is_file():
            return None
        data = path.read_bytes()
    except OSError:
        return None
    try:
        proto = onnx.ModelProto.FromString(data)
        if not proto.graph.node:
            raise ValueError("no nodes")
        onnx.checker.check_model(proto)
    except (DecodeError, ValueError, RuntimeError, onnx.checker.ValidationError) as exc:
        logger.warning("cached base model %s is damaged (%s); exporting it again", path.name, str(exc)[:80])
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return data


def export_missing(
    folder: Path,
    wanted: dict[str, dict[str, Any]],
    executor: Any,
    tick: Callable[[int, int], None] = lambda _n, _m: None,
) -> tuple[dict[str, bytes], dict[str, str], int]:
    """The bases ``wanted`` (key -> a point's params): read from ``folder``, the missing ones exported
    on ``executor`` (one `worker.run_export` task each, in parallel) and saved there;
    ``tick(exported, of)`` follows the exports (a sweep's progress shows the export phase).

    Returns ``(bases, errors, exported)``: the serialized base of every key that has one, for each
    export that failed its error text, and how many were exported. A key whose worker was lost (killed,
    out of memory) is in neither: nothing is known about its export, so its points stay to do. A `LocalExecutor` exports in workers of its own
    started fresh (``spawn``): torch's thread pools do not survive a fork of a driver that used them.
    """
    from dabench_ir.sweep import worker
    from dabench_ir.sweep.executors import LocalExecutor, WorkerLost

    bases: dict[str, bytes] = {}
    missing = []
    for key, params in wanted.items():
        data = load_base(folder, key)
        if data is None:
            missing.append((key, params))
        else:
            bases[key] = data
    errors: dict[str, str] = {}
    if not missing:
        return bases, errors, 0
    logger.info("exporting %d base model(s) with torch", len(missing))
    tasks = [(worker.run_export, (key, params)) for key, params in missing]
    forks = isinstance(executor, LocalExecutor) and executor.ctx.get_start_method() != "spawn"
    exporter = LocalExecutor(executor.jobs, start="spawn") if forks else executor
    exported = []
    tick(0, len(tasks))
    try:
        for item in exporter.map_unordered(tasks):
            exported.append(item)
            tick(len(exported), len(tasks))
    finally:
        if exporter is not executor:
            exporter.close()
    for i, out in exported:
        key = missing[i][0]
        if isinstance(out, WorkerLost):
            logger.warning("%s; the export of %s stays to do", out, key)
            continue
        _, data, error = out
        if data is None:
            errors[key] = error or "export failed"
            continue
        try:
            save_base(folder, key, data)
        except OSError as exc:
            logger.warning("cannot cache the export in %s: %s", folder, exc)
        bases[key] = data
    return bases, errors, len(missing)


def stamped_proto(base: bytes, layers: int) -> onnx.ModelProto:
    """The L-layer model: the base's block stamped ``layers`` times."""
    import onnx

    from dabench_ir.models.export import stamp_layers

    proto = onnx.ModelProto.FromString(base)
    return stamp_layers(proto, layers)


def build_graph(base: bytes, layers: int) -> Graph:
    """The costed L-layer Graph (standard passes run), ready for precision, lowering, emulation."""
    from dabench_ir.frontends.onnx import load_onnx
    from dabench_ir.passes import PassManager
    from dabench_ir.run import analysis_passes

    graph = load_onnx(stamped_proto(base, layers), infer_shapes=False)
    return PassManager(analysis_passes())(graph).graph
