"""Host CPU calibration: short onnxruntime micro-benchmarks, cached per machine.

The ``cpu`` target's figures are measured, not looked up: matmul FLOP/s over a few shapes,
streaming bandwidth (a large Add), the time-versus-size curves of the common vector ops,
and the fixed per-op overhead (a one-element Add). Shapes and layouts are those exported
decoders use (token-by-hidden GEMMs, 2-D weight transposes, [0,2,1,3] head transposes,
causally masked attention scores, GELU). In a model, a node's operands were last touched
several nodes (or a whole run) ago and sit in the outer caches or DRAM, not in the L1/L2
a repeat loop keeps hot, so each benchmarked node runs after a "flush" node that reads a
buffer larger than the private caches. Everything runs through onnxruntime
with its per-node profiler, the same engine and the same clock as ``--measure``, at the
same thread count. The result is a target TOML file (the ``targets/*.toml`` schema, every
number marked as measured with the date) in a per-machine cache:
``$DABENCH_IR_CACHE``, else ``$XDG_CACHE_HOME/dabench-ir``, else ``~/.cache/dabench-ir``.

The cache key is the CPU model and count, the onnxruntime version and the thread count;
a file whose key, format or age does not match is measured again, with a one-line notice.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
import logging
import math
import os
import platform
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.execute.ort import default_threads, run_profiled
from dabench_ir.fileio import meminfo_bytes
from dabench_ir.passes.cost_rules import CPU_KERNELS, CPU_STREAM
from dabench_ir.progress import silent

__all__ = [
    "CALIBRATION_FORMAT",
    "MAX_AGE_DAYS",
    "cache_dir",
    "cache_file",
    "calibrate",
    "calibration_status",
    "cpu_target_path",
    "dump_toml",
    "host_powers",
    "load_calibration",
    "machine_key",
    "measure_host",
]

logger = logging.getLogger(__name__)

CALIBRATION_FORMAT = 5
"""Bumped when the benchmarks or the file layout change; older files are measured again."""
MAX_AGE_DAYS = 90
"""A calibration older than this is stale (BIOS, kernel and library updates move figures)."""

# (batch, M, K, N): token-by-hidden GEMMs spanning ~1 MFLOP..4 GFLOP, attention-like
# batched GEMMs, and one matrix-vector product (memory-bound; recorded, not used for the curve).
_MATMULS_FULL = (
    (1, 32, 128, 128),
    (1, 64, 256, 256),
    (1, 128, 256, 1024),
    (1, 128, 768, 768),
    (1, 256, 512, 2048),
    (1, 128, 768, 3072),
    (1, 256, 1024, 1024),
    (1, 512, 1024, 4096),
    (1, 1, 2048, 2048),
    (4, 64, 64, 64),
    (8, 128, 64, 128),
    (8, 128, 128, 64),
    (12, 256, 64, 256),
    (12, 256, 256, 64),
    (16, 512, 64, 512),
)
_PACKED_FULL = frozenset({(1, 64, 256, 256), (1, 128, 768, 768), (1, 256, 1024, 1024), (1, 512, 1024, 4096)})
_MATMULS_QUICK = ((1, 32, 64, 64), (1, 64, 128, 128), (4, 32, 32, 32))
_ROWS_FULL = (4, 32, 256, 2048, 8192)  # x 1024 fp32 columns: 16 KiB .. 32 MiB per tensor
_ROWS_QUICK = (4, 64)
_COLS = 1024
_SOFTMAX_FULL = ((1, 64), (4, 128), (8, 256), (12, 512), (16, 1024))  # (heads, seq): scores heads x seq x seq
_SOFTMAX_QUICK = ((1, 64), (2, 128))
_WEIGHTS_FULL = ((128, 128), (256, 256), (512, 512), (1024, 768), (1024, 1024), (4096, 1024))  # 2-D transposes
_WEIGHTS_QUICK = ((64, 64), (256, 128))
_FLUSH_BYTES = 16 << 20  # read before each benchmarked node: more than the L1/L2 a core keeps
_FLUSH_BYTES_QUICK = 1 << 20
_BUDGET_S_FULL = 0.12  # time per benchmark, measured runs
_BUDGET_S_QUICK = 0.01
_WATTS_PER_CORE = 10.0  # estimate only: the power draw is not measurable from user space
_ASSUMED_NODE_NM = 10.0  # estimate only: the process node is not visible to software


def cache_dir() -> Path:
    """Where calibrations are kept: ``$DABENCH_IR_CACHE`` or the XDG cache folder."""
    override = os.environ.get("DABENCH_IR_CACHE")
    if override:
        folder = Path(override).expanduser()
        if folder.exists() and not folder.is_dir():
            raise UserError(f"DABENCH_IR_CACHE={override} is a file, not a folder; point it at a folder (or unset it)")
        return folder
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "dabench-ir"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _llc_bytes() -> int:
    """Size of the largest (last-level) data or unified cache in sysfs; 0 when unreadable."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return best


def machine_key(threads: int | None = None) -> dict[str, Any]:
    """What a calibration is valid for: CPU model and count, onnxruntime version, threads."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # fatal only: its errors reach the user as our one line

    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count() or 1,
        "ort_version": ort.__version__,
        "threads": int(threads or default_threads()),
    }


def _key_id(key: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:12]


def cache_file(key: Mapping[str, Any]) -> Path:
    return cache_dir() / f"cpu-{key['threads']}t-{_key_id(key)}.toml"


def check_cache_writable(path: Path) -> None:
    """Refuse, before minutes of measuring, a cache the result could not be written to:
    ``DABENCH_IR_CACHE`` naming a file, a folder in the cache file's place, an unwritable folder."""
    from dabench_ir.fileio import check_output_dir, check_output_path

    hint = "set DABENCH_IR_CACHE to a writable folder"
    try:
        check_output_dir(path.parent, "calibration cache")
        if path.exists() or path.is_symlink():
            check_output_path(path, "calibration cache")
    except UserError as exc:
        raise UserError(f"{exc}; {hint}") from None


def _why_invalid(path: Path, key: Mapping[str, Any], *, allow_quick: bool = False) -> str | None:
    """None when ``path`` holds a usable calibration for ``key``; else the reason."""
    if not path.is_file():
        return "no calibration for this machine yet"
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return f"unreadable calibration ({' '.join(str(exc).split())})"
    cal = data.get("calibration")
    if not isinstance(cal, dict):
        return "damaged calibration (no [calibration] table)"
    try:
        from dabench_ir.targets import Target

        Target.from_dict(data, origin=path.name)  # the file is the cpu target: it must load as one
        _check_summary_fields(data)
    except (UserError, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return f"damaged calibration ({' '.join(str(exc).split())[:200]})"
    if cal.get("format") != CALIBRATION_FORMAT:
        return "calibration from an older dabench-ir"
    if cal.get("quick") and not allow_quick:
        return "only a rough (--quick) calibration is cached"
    if cal.get("key") != dict(key):
        return "calibration was measured with other settings or on another machine"
    try:
        age = (_dt.date.today() - _dt.date.fromisoformat(str(cal.get("date")))).days
    except ValueError:
        return "calibration has no valid date"
    if age > MAX_AGE_DAYS:
        return f"calibration is {age} days old"
    return None


def calibration_status(threads: int | None = None, *, allow_quick: bool = False) -> tuple[Path, str | None]:
    """The cache file for this machine and thread count, and why it is unusable (None: usable)."""
    key = machine_key(threads)
    path = cache_file(key)
    return path, _why_invalid(path, key, allow_quick=allow_quick)


def cpu_target_path(threads: int | None = None, *, measure_if_missing: bool = True, quick: bool = False) -> Path:
    """The cached ``cpu`` target TOML for this machine and thread count.

    A missing, stale or mismatching calibration is measured again (a one-line notice on
    stderr) unless ``measure_if_missing`` is False, in which case UserError says so.
    A rough (``quick``) calibration is accepted, and made, only when ``quick`` is True.
    """
    key = machine_key(threads)
    path = cache_file(key)
    reason = _why_invalid(path, key, allow_quick=quick)
    if reason is None:
        return path
    if not measure_if_missing:
        raise UserError(f"{reason}; run `dabench-ir calibrate --threads {key['threads']}`")
    check_cache_writable(path)
    took = "about a second" if quick else "once per machine, ~20-60 s"
    print(f"dabench-ir: calibrating this host's CPU ({took}; cached in {path}): {reason}", file=sys.stderr)
    start = time.perf_counter()
    result = calibrate(key["threads"], quick=quick)
    print(f"dabench-ir: calibrated in {time.perf_counter() - start:.0f} s; cached in {result}", file=sys.stderr)
    return result


def host_powers(reports: Iterable[Any]) -> dict[str, float | None]:
    """The power figures a comparison of ``reports`` needs from this host, before it is rendered
    (`dabench_ir.report.compare.compare_reports` ``powers``): ``{"cpu": W}`` from the cached
    calibration when a report dict names the ``cpu`` target (None: no calibration cached), else {}.

    Never calibrates: a comparison uses the cached calibration or nothing.
    """
    from dabench_ir.targets import HOST, is_host, load_target

    if not any(isinstance(r, Mapping) and is_host((r.get("target") or {}).get("name")) for r in reports):
        return {}
    name = HOST
    try:
        name = str(cpu_target_path(measure_if_missing=False))
        return {HOST: float(load_target(name).watts) or None}
    except Exception as exc:
        logger.info("no power figure for target %s: %s", name, exc)
        return {HOST: None}


def _check_summary_fields(data: Mapping[str, Any]) -> None:
    """The fields `dabench-ir calibrate` prints, with their types (raises on a damaged file)."""
    for rec in data["compute"]["peak_flops"].values():
        float(rec["value"])
    float(data["memory"][0]["bandwidth_bytes_per_s"]["value"])
    float(data["overheads"]["kernel_launch_s"]["value"])
    for row in data["calibration"].get("matmul", []):
        for k in ("batch", "m", "k", "n", "flops_per_s", "time_s"):
            float(row[k])
        str(row["dtype"])


def load_calibration(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


# -- the benchmarks -------------------------------------------------------------------
@dataclass(slots=True)
class _Bench:
    """One single-op model, its feeds, and the node to time."""

    model: Any
    feeds: dict[str, Any]


def _single_op(
    op: str,
    inputs: list[tuple[str, int, tuple[int, ...]]],
    out: tuple[int, int, tuple[int, ...]] | None,
    *,
    inits: Mapping[str, Any] | None = None,
    flush: int = 0,
    **attrs: Any,
) -> Any:
    """A one-node ONNX model: the node is named ``bench``. With ``flush`` > 0 a ReduceMax
    over a fed ``flush``-byte buffer (input ``_flush``) runs first, evicting the bench
    node's operands from the private caches as the rest of a model would."""
    from onnx import TensorProto, helper, numpy_helper

    init_names = set(inits or {})
    vis = [helper.make_tensor_value_info(n, dt, shape) for n, dt, shape in inputs if n not in init_names]
    out_dtype, _, out_shape = out if out else (TensorProto.FLOAT, 0, None)
    nodes = [helper.make_node(op, [n for n, _, _ in inputs], ["y"], name="bench", **attrs)]
    outputs = [helper.make_tensor_value_info("y", out_dtype, out_shape)]
    if flush:
        vis.append(helper.make_tensor_value_info("_flush", TensorProto.FLOAT, (flush // 4,)))
        outputs.append(helper.make_tensor_value_info("_flushed", TensorProto.FLOAT, ()))
        nodes.insert(0, helper.make_node("ReduceMax", ["_flush"], ["_flushed"], name="flush", keepdims=0))
    graph = helper.make_graph(
        nodes,
        f"bench_{op}",
        vis,
        outputs,
        [numpy_helper.from_array(v, n) for n, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def _time_bench(bench: _Bench, threads: int, budget_s: float) -> float:
    """Median kernel time of node ``bench``: a probe run (flush included) sizes the repeats."""
    probe = run_profiled(bench.model, bench.feeds, warmup=1, repeat=1, threads=threads)
    t = max(probe.run_time_s, probe.node_times.get("bench", 0.0))
    repeat = int(min(max(budget_s / max(t, 1e-7), 5), 200))
    prof = run_profiled(bench.model, bench.feeds, warmup=1, repeat=repeat, threads=threads)
    return prof.node_times["bench"]


def _flushed(bench: _Bench, flush: int) -> _Bench:
    """Feed the flush buffer of a model built with ``flush`` bytes (none when 0)."""
    if flush:
        import numpy as np

        bench.feeds["_flush"] = np.ones(flush // 4, dtype=np.float32)
    return bench


def _matmul_bench(batch: int, m: int, k: int, n: int, dtype: str, rng: Any, *, packed: bool, flush: int = 0) -> _Bench:
    """``packed``: B is a constant initializer, which onnxruntime pre-packs at load; else B
    is fed each run, as when it comes out of another node (e.g. a Transpose of the weight)."""
    import numpy as np
    from onnx import TensorProto

    np_dtype = np.float16 if dtype == "fp16" else np.float32
    code = TensorProto.FLOAT16 if dtype == "fp16" else TensorProto.FLOAT
    a_shape = (batch, m, k) if batch > 1 else (m, k)
    b_shape = (batch, k, n) if batch > 1 else (k, n)
    y_shape = (batch, m, n) if batch > 1 else (m, n)
    b = (rng.standard_normal(b_shape) * 0.02).astype(np_dtype)
    inits = {"b": b} if packed else None
    model = _single_op(
        "MatMul", [("a", code, a_shape), ("b", code, b_shape)], (code, 0, y_shape), inits=inits, flush=flush
    )
    feeds = {"a": rng.standard_normal(a_shape).astype(np_dtype)}
    if not packed:
        feeds["b"] = b
    return _flushed(_Bench(model, feeds), flush)


def _op_sizes(op: str, quick: bool) -> tuple[tuple[int, ...], ...]:
    """The sizes one op class is measured at (the meaning depends on the op)."""
    if op == "Softmax":
        return _SOFTMAX_QUICK if quick else _SOFTMAX_FULL
    if op == "Transpose2D":
        return _WEIGHTS_QUICK if quick else _WEIGHTS_FULL
    return tuple((r,) for r in (_ROWS_QUICK if quick else _ROWS_FULL))


def _op_bench(op: str, size: tuple[int, ...], rng: Any, flush: int = 0) -> tuple[_Bench, int]:
    """A vector-op benchmark at one size, and the bytes it moves (inputs plus output).

    Most ops run on a (rows, 1024) fp32 tensor; Softmax on causally masked (heads, seq,
    seq) attention scores; Transpose2D on a (rows, cols) weight, as exported decoders
    transpose their linear weights at run time."""
    import numpy as np
    from onnx import TensorProto

    f = TensorProto.FLOAT
    if op == "Softmax":
        heads, seq = size
        shape = (1, heads, seq, seq)
        # masked like a decoder's scores: -inf above the diagonal (half the row on average)
        x = rng.standard_normal(shape).astype(np.float32) + np.triu(np.full((seq, seq), -np.inf, np.float32), 1)
        model = _single_op(op, [("x", f, shape)], (f, 0, shape), flush=flush, axis=-1)
        return _flushed(_Bench(model, {"x": x}), flush), 8 * x.size
    if op == "Transpose2D":  # the last axis moves: an element-wise gather, not block copies
        rows, cols = size
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        model = _single_op("Transpose", [("x", f, (rows, cols))], (f, 0, (cols, rows)), flush=flush, perm=[1, 0])
        return _flushed(_Bench(model, {"x": x}), flush), 8 * x.size
    (rows,) = size
    shape = (rows, _COLS)
    x = rng.standard_normal(shape).astype(np.float32)
    numel = rows * _COLS
    if op == "Add":
        model = _single_op("Add", [("x", f, shape), ("z", f, shape)], (f, 0, shape), flush=flush)
        feeds = {"x": x, "z": rng.standard_normal(shape).astype(np.float32)}
        return _flushed(_Bench(model, feeds), flush), 12 * numel
    if op in ("Tanh", "Erf", "Gelu", "GeluTanh"):
        attrs = {"approximate": "tanh"} if op == "GeluTanh" else {}
        onnx_op = "Gelu" if op == "GeluTanh" else op
        model = _single_op(onnx_op, [("x", f, shape)], (f, 0, shape), flush=flush, **attrs)
        return _flushed(_Bench(model, {"x": x}), flush), 8 * numel
    if op == "ReduceMean":
        axes = np.array([-1], dtype=np.int64)
        model = _single_op(
            op,
            [("x", f, shape), ("axes", TensorProto.INT64, (1,))],
            (f, 0, (rows, 1)),
            inits={"axes": axes},
            flush=flush,
            keepdims=1,
        )
        return _flushed(_Bench(model, {"x": x}), flush), 4 * numel + 4 * rows + 8
    if op == "Transpose":  # attention heads: (1, seq, heads, 64) -> (1, heads, seq, 64)
        heads = _COLS // 64
        shape4 = (1, rows, heads, 64)
        model = _single_op(op, [("x", f, shape4)], (f, 0, (1, heads, rows, 64)), flush=flush, perm=[0, 2, 1, 3])
        return _flushed(_Bench(model, {"x": x.reshape(shape4)}), flush), 8 * numel
    if op == "LayerNormalization":
        gain = np.ones(_COLS, dtype=np.float32)
        bias = np.zeros(_COLS, dtype=np.float32)
        model = _single_op(
            op,
            [("x", f, shape), ("g", f, (_COLS,)), ("b", f, (_COLS,))],
            (f, 0, shape),
            inits={"g": gain, "b": bias},
            flush=flush,
            axis=-1,
            epsilon=1e-5,
        )
        return _flushed(_Bench(model, {"x": x}), flush), 8 * numel + 8 * _COLS
    raise ValueError(op)


def measure_host(
    threads: int | None = None, *, quick: bool = False, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the micro-benchmarks; the raw results (no file written)."""
    import numpy as np

    threads = int(threads or default_threads())
    rng = np.random.default_rng(0)
    budget = _BUDGET_S_QUICK if quick else _BUDGET_S_FULL
    flush = _FLUSH_BYTES_QUICK if quick else _FLUSH_BYTES
    say = progress or silent
    start = time.perf_counter()

    tiny = _single_op("Add", [("x", 1, (1,)), ("z", 1, (1,))], (1, 0, (1,)))
    overhead = _time_bench(_Bench(tiny, {"x": np.ones(1, np.float32), "z": np.ones(1, np.float32)}), threads, budget)
    say(f"per-op overhead {overhead * 1e6:.1f} us")

    matmul: list[dict[str, Any]] = []
    shapes = [(s, "fp32") for s in (_MATMULS_QUICK if quick else _MATMULS_FULL)]
    if not quick:
        shapes.append(((1, 256, 768, 768), "fp16"))
    for ((batch, m, k, n), dtype), cold in itertools.product(shapes, (False, True)):
        # B fed each run (as from a runtime weight transpose), and at some shapes constant B
        variants = (False, True) if batch == 1 and (quick or (batch, m, k, n) in _PACKED_FULL) else (False,)
        for packed in variants:
            try:
                bench = _matmul_bench(batch, m, k, n, dtype, rng, packed=packed, flush=flush if cold else 0)
                t = _time_bench(bench, threads, budget)
            except UserError as exc:  # e.g. no fp16 MatMul kernel on this CPU build
                logger.info("skipping %s matmul benchmark: %s", dtype, exc)
                continue
            flops = 2 * batch * m * k * n
            row = {"dtype": dtype, "batch": batch, "m": m, "k": k, "n": n, "packed": packed, "cold": cold}
            matmul.append({**row, "flops": flops, "time_s": t, "flops_per_s": flops / t})
            kind = ("constant B" if packed else "B fed") + (", cold" if cold else "")
            say(f"matmul {dtype} {batch}x{m}x{k}x{n} ({kind}): {flops / t / 1e9:.1f} GFLOP/s")

    ops: list[dict[str, Any]] = []
    for op, cold in itertools.product((CPU_STREAM,) if quick else CPU_KERNELS, (False, True)):
        for size in _op_sizes(op, quick):
            bench, nbytes = _op_bench(op, size, rng, flush=flush if cold else 0)
            t = _time_bench(bench, threads, budget)
            ops.append(
                {
                    "op": op,
                    "cold": cold,
                    "elements": int(bench.feeds["x"].size),
                    "bytes": nbytes,
                    "time_s": t,
                    "bytes_per_s": nbytes / t,
                }
            )
        say(
            f"{op}{' (cold)' if cold else ''}: {ops[-1]['bytes_per_s'] / 1e9:.1f} GB/s at {ops[-1]['bytes'] / 1e6:.0f} MB"
        )
    return {
        "threads": threads,
        "overhead_s": overhead,
        "flush_bytes": flush,
        "llc_bytes": _llc_bytes(),
        "matmul": matmul,
        "ops": ops,
        "seconds": time.perf_counter() - start,
        "quick": quick,
    }


# -- the target file --------------------------------------------------------------------
def _cache_level(raw: Mapping[str, Any], src: str, rec: Any) -> list[dict[str, Any]]:
    """The last-level cache as the on-chip memory level that feeds a node whose bytes fit in it:
    its size (sysfs) and the fastest cache-warm elementwise rate measured, the per-kernel overhead
    taken off (`lowering.cpu.feed_levels` bounds each node's time by it). None when unknown."""
    llc, overhead = raw.get("llc_bytes") or 0, raw["overhead_s"]
    warm = [r for r in raw["ops"] if not r.get("cold") and r["bytes"] <= llc and r["time_s"] > overhead]
    if not llc or not warm:
        return []
    rate = max(r["bytes"] / (r["time_s"] - overhead) for r in warm)
    return [
        {
            "name": "llc",
            "level": "on-chip",
            "bandwidth_bytes_per_s": rec(
                rate, f"{src} (fastest cache-warm elementwise op through onnxruntime, per-op overhead removed)"
            ),
            "capacity_bytes": rec(llc, "last-level cache size (sysfs)"),
        }
    ]


def _target_dict(raw: Mapping[str, Any], key: Mapping[str, Any], date: str) -> dict[str, Any]:
    from dabench_ir.targets import HOST

    src = f"measured by dabench-ir calibrate on {date}"

    def rec(value: float | int, source: str = src, estimate: bool = False) -> dict[str, Any]:
        return {"value": value, "source": source, "estimate": estimate}

    peaks: dict[str, Any] = {}
    for dtype in ("fp32", "fp16"):
        rates = [r["flops_per_s"] for r in raw["matmul"] if r["dtype"] == dtype]
        if rates:
            peaks[dtype] = rec(max(rates), f"{src} (best matmul through onnxruntime)")
    stream = [r for r in raw["ops"] if r["op"] == CPU_STREAM]
    bandwidth = stream[-1]["bytes_per_s"] if stream else math.nan
    memory: dict[str, Any] = {
        "name": "dram",
        "level": "off-chip",
        "bandwidth_bytes_per_s": rec(bandwidth, f"{src} (streaming Add through onnxruntime)"),
    }
    capacity = meminfo_bytes("MemTotal")
    memory["capacity_bytes"] = (
        rec(capacity, "/proc/meminfo MemTotal")
        if capacity
        else rec(8 << 30, "assumption: memory size unreadable, 8 GiB assumed", True)
    )
    return {
        "name": HOST,
        "kind": "cpu",
        "description": f"Host CPU: {key['cpu']}, {key['cpus']} CPUs, onnxruntime {key['ort_version']}, "
        f"{key['threads']} threads (measured)",
        "aliases": [],
        "compute": {
            "unit_name": "core",
            "units": rec(key["threads"], f"{src} (onnxruntime intra-op threads)"),
            "peak_flops": peaks,
        },
        "memory": [memory, *_cache_level(raw, src, rec)],
        "overheads": {"kernel_launch_s": rec(raw["overhead_s"], f"{src} (one-element Add kernel time)")},
        "power": {
            "watts": rec(
                _WATTS_PER_CORE * key["threads"],
                f"unknown: not measurable by calibrate; assumption {_WATTS_PER_CORE:g} W per core used",
                True,
            ),
            "covers": "cores used",
        },
        "process": {
            "node_nm": rec(
                _ASSUMED_NODE_NM,
                "unknown: not measurable by calibrate; assumption typical of current server CPUs",
                True,
            )
        },
        "parallel": {"strategies": []},
        "calibration": {
            "format": CALIBRATION_FORMAT,
            "date": date,
            "threads": key["threads"],
            "ort_version": key["ort_version"],
            "machine": f"{key['cpu']} x{key['cpus']}",
            "quick": bool(raw.get("quick", False)),
            "seconds": round(raw["seconds"], 3),
            "flush_bytes": int(raw.get("flush_bytes", 0)),
            "llc_bytes": int(raw.get("llc_bytes", 0)),
            "key": dict(key),
            "matmul": raw["matmul"],
            "ops": raw["ops"],
        },
    }


def calibrate(threads: int | None = None, *, quick: bool = False, verbose: bool = False) -> Path:
    """Measure this host and write its ``cpu`` target to the cache; the file's path."""
    key = machine_key(threads)
    check_cache_writable(cache_file(key))  # before the measuring, not after it
    progress = (lambda msg: print(f"  {msg}", file=sys.stderr)) if verbose else None
    raw = measure_host(key["threads"], quick=quick, progress=progress)
    data = _target_dict(raw, key, _dt.date.today().isoformat())
    path = cache_file(key)
    check_cache_writable(path)
    from dabench_ir.fileio import write_output

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"calibration cache {path.parent}: cannot create it ({exc.strerror or exc})") from None
    write_output(path, dump_toml(data))
    # per-node kernel timings belong to the calibration they were taken beside: measured
    # again with it, never mixed with a new one taken under other conditions
    from dabench_ir.lowering.cpu import node_table_path

    node_table_path(path).unlink(missing_ok=True)
    logger.info("wrote host calibration %s (%.1f s)", path, raw["seconds"])
    return path


# -- a small TOML writer (tomllib reads; the standard library has no writer) -----------
def _toml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".en") else f"{text}.0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_scalar(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_scalar(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _is_table(value: Any) -> bool:
    """Nested tables get a header; number records ({value, source, ...}) stay inline."""
    return isinstance(value, Mapping) and "value" not in value


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) and "value" not in v for v in value)


def dump_toml(data: Mapping[str, Any], _prefix: str = "") -> str:
    """Serialise nested dicts: scalars and records inline, dicts as tables, lists of
    dicts as arrays of tables."""
    lines: list[str] = []
    for k, v in data.items():
        if not (_is_table(v) or _is_table_array(v)):
            lines.append(f"{_toml_key(k)} = {_toml_scalar(v)}")
    for k, v in data.items():
        name = f"{_prefix}{_toml_key(k)}"
        if _is_table(v):
            body = dump_toml(v, f"{name}.")
            lines.append(f"\n[{name}]")
            if body.strip():
                lines.append(body.rstrip("\n"))
        elif _is_table_array(v):
            for item in v:
                lines.append(f"\n[[{name}]]")
                body = dump_toml(item, f"{name}.")
                if body.strip():
                    lines.append(body.rstrip("\n"))
    return "\n".join(lines).lstrip("\n") + "\n"
