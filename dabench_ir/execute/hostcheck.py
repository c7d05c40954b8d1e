"""Host points of the validation catalogue: a model measured live on this machine, node by node.

A ``kind = "host"`` catalogue point names a model (its ``[host]`` table), not measured
numbers: `run_host` exports it (cached under the dabench-ir cache folder), benchmarks its
node shapes, measures it in onnxruntime with ``repeat="auto"`` and predicts it from the
calibrated host model, all as ``profile MODEL --target cpu --measure`` does (`dabench_ir.run.execute`),
and returns the step and per-node errors beside the measurement's spread.

``[host]`` keys: ``builder`` ("hf": `dabench_ir.execute.hostmodels`, written apart from
dabench-ir's builders; "own": `models/`), ``family`` ("llama" or "gpt2"), ``layers``,
``hidden``, ``heads``, ``kv_heads`` (optional), ``seq``, ``attention`` ("eager" or "sdpa";
hf only), ``ort_opt`` (onnxruntime's graph optimisation on: its fused kernels).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HOST_KEYS", "HostResult", "check_host", "host_label", "run_host"]

HOST_KEYS: dict[str, type | tuple[type, ...]] = {
    "builder": str,
    "family": str,
    "layers": int,
    "hidden": int,
    "heads": int,
    "kv_heads": int,
    "seq": int,
    "attention": str,
    "ort_opt": bool,
}
_REQUIRED = ("family", "layers", "hidden", "heads", "seq")
_CHOICES = {"builder": ("hf", "own"), "family": ("llama", "gpt2"), "attention": ("eager", "sdpa")}


def check_host(host: Mapping[str, Any], bad: Callable[[str, str], Exception]) -> None:
    """Raise ``bad(key, why)`` for the first thing wrong with a point's ``[host]`` table."""
    for key, value in host.items():
        if key not in HOST_KEYS:
            raise bad(f"host.{key}", f"unknown key (known: {', '.join(HOST_KEYS)})")
        want = HOST_KEYS[key]
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise bad(f"host.{key}", f"expected {getattr(want, '__name__', want)}, got {value!r}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise bad(f"host.{key}", f"{value!r} is not one of {', '.join(_CHOICES[key])}")
        if want is int and value < 1:
            raise bad(f"host.{key}", "must be a positive integer")
    for key in _REQUIRED:
        if key not in host:
            raise bad(f"host.{key}", "missing (a host point needs family, layers, hidden, heads, seq)")
    if host["hidden"] % host["heads"] or host["heads"] % host.get("kv_heads", host["heads"]):
        raise bad("host.heads", "hidden must divide by heads, and heads by kv_heads")
    if host.get("builder", "hf") == "own" and host.get("attention", "eager") != "eager":
        raise bad("host.attention", "dabench-ir's own exports have eager attention only")


def host_label(host: Mapping[str, Any]) -> str:
    """``hf llama L2 H256 S128 kv2 eager ort-opt``: what a host point runs, in one line."""
    kv = host.get("kv_heads")
    parts = [host.get("builder", "hf"), host["family"], f"L{host['layers']}", f"H{host['hidden']}", f"S{host['seq']}"]
    if kv and kv != host["heads"]:
        parts.append(f"kv{kv}")
    parts.append(host.get("attention", "eager"))
    if host.get("ort_opt"):
        parts.append("ort-opt")
    return " ".join(parts)


@dataclass
class HostResult:
    """One host point measured and predicted, as ``profile MODEL --target cpu --measure`` reports it."""

    label: str
    measured_s: float  # the measured step: per-node warm medians and onnxruntime's per-run overhead
    predicted_s: float  # the predicted step
    error: dict[str, Any] = field(default_factory=dict)  # the report's `prediction_error`, with the spread
    repeat: int = 0


def _export(host: Mapping[str, Any]) -> Path:
    """The model's ONNX file, exported once and cached (dynamo exports take seconds)."""
    import onnx

    from dabench_ir.execute.calibrate import cache_dir

    keys = {k: host.get(k) for k in HOST_KEYS if k != "ort_opt"}
    digest = hashlib.sha1(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "models" / f"host-{digest}.onnx"
    if path.is_file():
        return path
    shape = {k: host[k] for k in ("family", "layers", "hidden", "heads", "seq")}
    shape["kv_heads"] = host.get("kv_heads")
    if host.get("builder", "hf") == "hf":
        from dabench_ir.execute.hostmodels import HostModel, export_host_model

        proto = export_host_model(HostModel(**shape, attention=host.get("attention", "eager")))
    else:
        from dabench_ir.models import ModelConfig
        from dabench_ir.models.export import export_onnx

        proto = export_onnx(ModelConfig(**shape), weights="random")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    onnx.save(proto, str(tmp))
    tmp.replace(path)
    return path


def run_host(
    host: Mapping[str, Any], *, threads: int | None = None, say: Callable[[str], None] | None = None
) -> HostResult:
    """Export one host point and profile it as ``profile MODEL --target cpu --measure --warmup 3 --repeat
    auto`` does (`dabench_ir.run.execute`: the node benchmarks, the measurement, the prediction, its error)."""
    from dabench_ir.pipeline import run_profile

    options = {"measure": True, "warmup": 3, "repeat": "auto", "threads": threads, "ort_opt": bool(host.get("ort_opt"))}
    report = run_profile(_export(host), "cpu", options, progress=say)
    error = report.metrics["prediction_error"]
    return HostResult(
        label=host_label(host),
        measured_s=error["measured_step_s"],
        predicted_s=error["predicted_step_s"],
        error=error,
        repeat=report.extra["measurement"]["repeat"],
    )
