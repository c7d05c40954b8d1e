"""GEMM and bandwidth microbenchmarks: a one-MatMul model, and the gemm, max-fit, ratio and
bandwidth point runners.

Each runner fills a PointResult from the target alone (no model export, no graph cache).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from dabench_ir.validate.catalog import Point, measured_numbers
from dabench_ir.validate.results import CannotRun, PointResult, Quantity

if TYPE_CHECKING:
    import onnx

    from dabench_ir.report import Report
    from dabench_ir.validate.cache import GraphCache

__all__ = ["gemm_model", "run_bandwidth", "run_gemm", "run_max_fit", "run_ratio"]


def gemm_model(m: int, n: int, k: int) -> onnx.ModelProto:
    """A one-MatMul ONNX model, ``[m, k] x [k, n] -> [m, n]`` in fp32, both operands graph inputs."""
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [k, n])
    c = helper.make_tensor_value_info("C", TensorProto.FLOAT, [m, n])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"], name="gemm")], f"gemm{m}x{n}x{k}", [a, b], [c]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="dabench-ir validate")
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _gemm_report(size: int, target: Any, precision: str) -> Report:
    from dabench_ir import pipeline

    return pipeline.run_profile(gemm_model(size, size, size), target, {"precision": precision})


@functools.cache
def _gemm_figures(size: int, target: Any, precision: str) -> tuple[bool, float | None]:
    """Whether the ``size``^3 GEMM fits and its achieved FLOP/s: profiled once per (size, target,
    precision) in a process. A point asks whether its size fits and then its rate, and the max-fit,
    best-size and ratio points bisect and sweep the same sizes (a target is one object per file
    state, `load_target`: a changed file is a new key)."""
    report = _gemm_report(size, target, precision)
    return bool(report.fits), report.totals.get("achieved_flops_per_s")


def _gemm_tflops(size: int, target: Any, precision: str) -> float | None:
    fits, achieved = _gemm_figures(size, target, precision)
    if not fits:
        return None
    return achieved / 1e12 if achieved else None


def _best_gemm(target: Any, precision: str) -> tuple[int, float]:
    """The best achieved TFLOP/s over square sizes 256, 512, ... up to the largest that fits."""
    best, best_size, size = 0.0, 0, 256
    limit = _max_square(target, precision)
    sizes = sorted({*range(256, limit + 1, 256), limit}) if limit else []
    for size in sizes:
        t = _gemm_tflops(size, target, precision)
        if t is not None and t > best:
            best, best_size = t, size
    if not best_size:
        raise CannotRun(f"no square {precision} GEMM fits on {target.name}")
    return best_size, best


def _fits(size: int, target: Any, precision: str) -> bool:
    return _gemm_figures(size, target, precision)[0]


def _max_square(target: Any, precision: str, cap: int = 1 << 17) -> int:
    """Largest n with an n x n x n GEMM that fits (bisection; 0 if not even 1 fits)."""
    if not _fits(1, target, precision):
        return 0
    lo, hi = 1, 2
    while hi <= cap and _fits(hi, target, precision):
        lo, hi = hi, hi * 2
    if hi > cap:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(mid, target, precision) else (lo, mid)
    return lo


def run_gemm(p: Point, result: PointResult, _graphs: GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    precision = p.gemm.get("precision", "fp32")
    size = p.gemm.get("size")
    if size == "best":
        size, tflops = _best_gemm(target, precision)
        result.notes.append(f"best square GEMM predicted at {size}")
    else:
        if not _fits(size, target, precision):
            result.fits_predicted = False
            raise CannotRun(f"a {size}^3 {precision} GEMM does not fit on {target.name} in the tool")
        tflops = _gemm_tflops(size, target, precision)
    result.fits_predicted = True
    peak = target.peak_flops(precision)
    predicted = {"tflops": tflops, "fraction_of_peak": tflops * 1e12 / peak if peak and tflops else None}
    for key, value in measured_numbers(p.measured):
        pred = predicted.get(key)
        result.quantities.append(Quantity(key, value, pred, "" if pred is not None else "not predicted"))


def run_max_fit(p: Point, result: PointResult, _graphs: GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    precision = p.gemm.get("precision", "fp32")
    n = _max_square(target, precision)
    for key, value in measured_numbers(p.measured):
        pred = float(n) if key == "max_square" else None
        result.quantities.append(Quantity(key, value, pred, "" if pred is not None else "not predicted"))
    measured = p.measured.get("max_square")
    if measured:
        result.fits_expected = True
        result.fits_predicted = _fits(int(measured), target, precision)


def run_ratio(p: Point, result: PointResult, _graphs: GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    size = p.gemm["size"]
    if size == "best":
        _, fast = _best_gemm(target, p.gemm.get("precision", "fp16"))
        _, slow = _best_gemm(target, p.gemm.get("baseline_precision", "fp32"))
    else:
        fast = _gemm_tflops(size, target, p.gemm.get("precision", "fp16"))
        slow = _gemm_tflops(size, target, p.gemm.get("baseline_precision", "fp32"))
    if not fast or not slow:
        raise CannotRun(f"a {size}^3 GEMM does not fit on {target.name} at both precisions")
    for key, value in measured_numbers(p.measured):
        pred = fast / slow if key == "ratio" else None
        result.quantities.append(Quantity(key, value, pred, "" if pred is not None else "not predicted"))


def run_bandwidth(p: Point, result: PointResult, _graphs: GraphCache) -> None:
    from dabench_ir.targets import load_target

    target = load_target(p.target)
    memory = p.bandwidth.get("memory", "off-chip")
    if not target.has_memory(memory):
        raise CannotRun(f"target {target.name} has no memory {memory!r}")
    mem = target.memory(memory)
    pattern = p.bandwidth.get("pattern", "streaming")
    pred = mem.bandwidth_bytes_per_s / 1e9 if pattern == "streaming" else None
    note = "" if pred is not None else f"not predicted ({pattern} access: the target models streaming bandwidth)"
    for key, value in measured_numbers(p.measured):
        q = Quantity(key, value, pred if key == "bandwidth_gb_s" else None, note)
        if q.predicted is None and not q.note:
            q.note = "not predicted"
        result.quantities.append(q)
    result.notes.append(f"compared with {target.name}'s {mem.name} bandwidth")
