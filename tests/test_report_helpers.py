"""Shared helpers for the report renderer tests: a hand-built Report, a fake Target, a schema checker.

Reports are built by hand so these tests do not depend on the lowerings' numbers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pytest

from dabench_ir.ir import Cost
from dabench_ir.report.model import NodeRecord, Report

__all__ = ["FakeMemory", "FakeTarget", "load_schema", "make_report", "png_size", "validate"]


@dataclass(frozen=True)
class FakeMemory:
    name: str
    level: str
    bandwidth_bytes_per_s: float
    capacity_bytes: float = 1e9


@dataclass(frozen=True)
class FakeTarget:
    """The slice of `dabench_ir.targets.Target` the renderers read."""

    name: str = "fakechip"
    kind: str = "rdu"
    watts: float = 500.0
    description: str = "a made-up chip for tests"
    peaks: dict[str, Any] = field(default_factory=dict)
    memories: tuple[FakeMemory, ...] = (
        FakeMemory("ddr", "off-chip", 1e11),
        FakeMemory("sram", "on-chip", 1e13),
    )

    def peak_flops(self, dtype: str) -> float:
        return 1e14


def _node(name, op_type, layer, op_class, flops, nbytes, time_s, bound, measured=None) -> NodeRecord:
    cost = (
        Cost(contraction_flops=flops, act_bytes_in=nbytes)
        if op_class == "contraction"
        else Cost(vector_flops=flops, act_bytes_in=nbytes)
    )
    return NodeRecord(
        name=name,
        op_type=op_type,
        layer=layer,
        scope=f"layers.{layer}" if layer is not None else "",
        op_class=op_class,
        cost=cost,
        intensity=flops / nbytes if nbytes else None,
        time_s=time_s,
        bound=bound,
        unit="u0" if layer in (None, 0) else "u1",
        measured_time_s=measured,
    )


def make_report(*, timed: bool = True, measured: bool = True, target: bool = True) -> Report:
    """Seven costed nodes over layers None/0/1 and one unattributed node."""
    rows = [
        ("embed_gather", "Gather", None, "data_movement", 0, 4096, 2e-6, "memory", 3e-6),
        ("l0_qkv_matmul", "MatMul", 0, "contraction", 2_000_000, 40_000, 40e-6, "compute", 50e-6),
        ("l0_softmax", "Softmax", 0, "vector", 50_000, 80_000, 10e-6, "memory", 8e-6),
        ("l0_mlp_matmul", "MatMul", 0, "contraction", 8_000_000, 100_000, 90e-6, "compute", 120e-6),
        ("l1_qkv_matmul", "MatMul", 1, "contraction", 2_000_000, 40_000, 41e-6, "compute", 45e-6),
        ("l1_gelu", "Gelu", 1, "vector", 100_000, 60_000, 12e-6, "memory", 20e-6),
        ("l1_mlp_matmul", "MatMul", 1, "contraction", 8_000_000, 100_000, 95e-6, "compute", 110e-6),
    ]
    nodes = [
        _node(n, op, layer, cls, f, b, t if timed else None, bound if timed else None, m if measured else None)
        for n, op, layer, cls, f, b, t, bound, m in rows
    ]
    nodes.append(NodeRecord("weird_op", "com.acme::Frobnicate", 1, "layers.1", None, None))
    total = sum((n.cost for n in nodes if n.cost is not None), Cost())
    time_s = sum(n.time_s or 0.0 for n in nodes) if timed else None
    tgt = FakeTarget() if target else None
    return Report(
        model={
            "path": "/tmp/tiny.onnx",
            "name": "tiny",
            "nodes": len(nodes),
            "params": 1234,
            "layers": 2,
            "family": "gpt2",
            "preset": None,
        },
        target={"name": tgt.name, "kind": tgt.kind} if tgt else None,
        config={"batch": 2, "precision": "fp32", "mode": "inference", "chips": 1, "strategy": None, "dims": {}},
        nodes=nodes,
        unattributed=[{"name": "weird_op", "op_type": "com.acme::Frobnicate", "reason": "no cost rule"}],
        totals={
            "flops": total.flops,
            "bytes": total.bytes,
            "time_s": time_s,
            "throughput_samples_per_s": 2 / time_s if time_s else None,
            "achieved_flops_per_s": total.flops / time_s if time_s else None,
            **total.as_dict(),
            "intensity": total.intensity,
            **({"measured_time_s": 356e-6} if measured else {}),
        },
        metrics={"allocation_ratio": 0.25, "load_imbalance": 0.8, "compute_efficiency": 0.1}
        if target
        else {"allocation_ratio": None, "load_imbalance": None, "compute_efficiency": None},
        units=[{"id": "u0", "kind": "section", "nodes": ["l0_qkv_matmul"], "allocation": 0.5, "time_s": 1e-4}],
        fits=True,
        flop_convention="2 FLOPs per multiply-add",
        target_obj=tgt,
    )


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def load_schema() -> dict[str, Any]:
    return json.loads(resources.files("dabench_ir").joinpath("data/report.schema.json").read_text())


_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def validate(instance: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """The errors of ``instance`` against the JSON-Schema subset the report schema uses."""
    errors: list[str] = []
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {instance!r}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(instance, t) for t in types):
            return [*errors, f"{path}: expected {'/'.join(types)}, got {type(instance).__name__}"]
    if "minimum" in schema and _is_type(instance, "number") and instance < schema["minimum"]:
        errors.append(f"{path}: {instance} < minimum {schema['minimum']}")
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            if key not in instance:
                errors.append(f"{path}: missing required field {key!r}")
        for key, sub in schema.get("properties", {}).items():
            if key in instance:
                errors += validate(instance[key], sub, f"{path}.{key}")
    if isinstance(instance, list) and "items" in schema:
        for i, item in enumerate(instance):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    return errors


def test_a_ratio_shows_a_slowdown_with_its_digits():
    from dabench_ir.report.table import times

    assert [times(x) for x in (2.0, 1.0, 0.35, 0.1, 0.0041, 0.0, None)] == [
        "2.00x",
        "1.00x",
        "0.35x",
        "0.10x",
        "0.0041x",
        "0.00x",
        "-",
    ]


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed: the table script's value reader not run")
def test_the_html_tables_read_a_prefixed_count_as_its_value():
    """Sorting by a numeric column reads ``262 k`` as 262,000 (a count `human` writes without a unit) as it
    reads ``5 ms`` and ``1.2 TFLOP/s``: the page sorted ``512; 262 k; 90.1 k`` above ``8.39 M``."""
    from dabench_ir.report.html import TABLE_SCRIPT

    reader = re.search(r"var SI = .*?\n  function value\(text\) \{.*?\n  \}\n", TABLE_SCRIPT, re.S).group(0)
    texts = ["512", "262 k", "90.1 k", "8.39 M", "5 ms", "1.2 TFLOP/s", "2.00x", "-"]
    script = reader + f"console.log(JSON.stringify({json.dumps(texts)}.map(value)));"
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [512, 262e3, 90.1e3, 8.39e6, 5e-3, 1.2e12, 2.0, None]


def test_the_summary_says_what_each_memory_holds_against_its_capacity():
    from dabench_ir.report.table import _memory_use

    use = {
        "ddr": {"bytes": 355e6, "capacity_bytes": 1e12, "fraction": 355e-6, "level": "off-chip"},
        "pmu_sram": {"bytes": 179e6, "capacity_bytes": 640e6, "fraction": 179 / 640, "level": "on-chip"},
    }
    assert _memory_use(use) == "pmu_sram 179 MB of 640 MB (28.0%), ddr 355 MB of 1 TB (0.0%)"
    many = {f"sram:ipu{i}": {"bytes": i, "capacity_bytes": 10, "fraction": i / 10} for i in range(5)}
    assert _memory_use(many, shown=2) == "sram:ipu4 4 B of 10 B (40.0%), sram:ipu3 3 B of 10 B (30.0%) and 3 less full"


def test_a_pipelines_period_is_marked_beside_whole_steps():
    """The cross-target time column holds the WSE's steady-state period beside the others' whole step:
    marked, with the note saying which, and each row's one-step latency in the row."""
    from dabench_ir.report.compare import PERIOD_NOTE, format_row, render_compare

    period = {"label": "m wse2", "time_s": 6.29e-4, "latency_s": 2.1e-3}
    step = {"label": "m h100", "time_s": 1.32e-3, "latency_s": 1.32e-3}
    assert format_row(period)["time"].endswith("(period)") and "period" not in format_row(step)["time"]
    assert PERIOD_NOTE in render_compare([period, step]) and PERIOD_NOTE not in render_compare([step])


def test_every_json_writer_writes_json_non_finite_figures_as_null(tmp_path):
    """JSON has no NaN or infinity: compare, validate, reproduce and trace files write them as null
    (each through the one writer, `report.model.json_text`), never as ``NaN`` (or a crash)."""
    from types import SimpleNamespace

    from dabench_ir.report.compare import write_compare_json
    from dabench_ir.validate.write import write_json

    def strict(path):
        return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path.name} holds {c}"))

    rows = [{"label": "m t", "time_s": float("nan"), "gops_per_w": float("inf")}]
    doc = strict(write_compare_json(rows, tmp_path / "c.json"))
    assert doc["rows"][0]["time_s"] is None and doc["rows"][0]["gops_per_w"] is None
    validation = SimpleNamespace(to_dict=lambda: {"rows": [{"error": float("-inf"), "tflops": float("nan")}]})
    assert strict(write_json(validation, tmp_path / "v.json")) == {"rows": [{"error": None, "tflops": None}]}
