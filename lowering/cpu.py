"""Host CPU lowering: each node one onnxruntime kernel, timed from its shapes and the host calibration.

The CPU lowering places nodes like the GPU one (one kernel per node, unfused, on one
in-order unit), but times each from the calibrated model below rather than a roofline.

First choice, per node: the **node table**, the model's own shape families measured on this
machine (`dabench_ir.execute.microbench`, cached beside the calibration; `node_signature`
names a family). Each family has a cache-hot and a flushed time; a node sits between them
by `cold_share`: the share of its bytes that come in cold (stored operands, and activations
by the bytes written since their producer over the L2 size; outputs reuse freed buffers: hot). A node whose
family was not measured (time budget, unknown operand values) falls back to the class
curves below.

The calibration (`dabench_ir.execute.calibrate`) times, through onnxruntime, matmuls of a
few sizes and the common vector ops (Add, Tanh, Erf, Softmax, ReduceMean, Transpose,
LayerNormalization) at a few sizes, and a tiny op for the fixed per-op overhead. A node is
predicted from the measured curve of its op class, interpolated in log-log space between
the measured sizes:

- contractions (MatMul, Gemm): time = overhead + FLOPs / rate(FLOPs), where the achieved
  rate is interpolated between the measured shapes (batched GEMMs, and single GEMMs with a
  constant pre-packed B or a B computed at run time, apart), and never below the time to
  stream the operands at the measured bandwidth;
- vector ops: time = the measured time-versus-bytes curve of the closest calibrated op;
- shape-only ops (Reshape, Shape, Unsqueeze, ...): the fixed overhead.

Every curve is measured twice, cache-hot and after a flush of the private caches. A node
that reads a weight or graph input (last touched a whole run ago) sits between the two by
`cold_fraction`: the model's footprint over the last-level cache size, capped at 1. Nodes
fed only by earlier nodes' outputs use the hot curves.

Calibration itself (`dabench-ir calibrate`) lives in the measured path; this module only
reads its figures from the ``cpu`` Target. ``ort_opt`` (the option that keeps onnxruntime's
graph optimiser on) changes what onnxruntime runs, so it is one of this lowering's options.
"""

from __future__ import annotations

import bisect
import logging
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dabench_ir.lowering import Lowering, LoweringOptions
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.lowering.gpu import stream_plan
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import (
    CPU_GELU_TANH,
    CPU_KERNEL_FALLBACK,
    CPU_MATMUL,
    CPU_STREAM,
    CPU_TRANSPOSE_2D,
    traits_of,
)
from dabench_ir.passes.meta import FOLDED
from dabench_ir.plan import Unit

if TYPE_CHECKING:
    from dabench_ir.ir import Graph, Node
    from dabench_ir.plan import Plan
    from dabench_ir.targets import MemoryLevel, Target

__all__ = [
    "LOWERING",
    "NODE_TABLE_FORMAT",
    "CpuLowering",
    "CpuModel",
    "CpuOptions",
    "calibrated_threads",
    "cold_fraction",
    "load_cpu_model",
    "load_node_table",
    "node_signature",
    "node_table_path",
    "predict_cpu_times",
    "predict_node",
]

logger = logging.getLogger(__name__)

_DEFAULT_CLASS = CPU_STREAM  # elementwise, copies, gathers: a streaming op of the same bytes


def _num(x: Any) -> float:
    """A TOML number or ``{value = ..., source = ...}`` record -> float."""
    if isinstance(x, Mapping):
        x = x.get("value")
    return float(x) if x is not None else math.nan


@dataclass(slots=True)
class CpuModel:
    """The calibrated figures the predictor needs."""

    peak_flops: float
    bandwidth: float
    overhead_s: float
    gemm: list[tuple[float, float]] = field(default_factory=list)  # (flops, seconds), batch 1, B fed
    packed: list[tuple[float, float]] = field(default_factory=list)  # batch 1, constant (pre-packed) B
    bmm: list[tuple[float, float]] = field(default_factory=list)  # (flops, seconds), batched
    ops: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # op -> (bytes, seconds)
    cold: CpuModel | None = None  # the same curves with operands evicted from L1/L2 first
    llc_bytes: float = 0.0  # last-level cache size: a run's footprint above it comes in cold
    nodes: dict[str, tuple[float, float]] = field(default_factory=dict)  # signature -> (hot, flushed) seconds
    l2_bytes: float = 0.0  # a core's private cache: an operand written more bytes ago than this is cold

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the roofline turns from memory- to compute-bound."""
        from dabench_ir.targets import ridge

        return ridge(self.peak_flops, self.bandwidth)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, cold: bool = False) -> CpuModel:
        """Read a target in the TOML schema (a parsed dict): the curves measured cache-hot,
        and under ``cold`` those measured after a cache flush."""
        peaks = data.get("compute", {}).get("peak_flops", {})
        peak = _num(peaks.get("fp32", next(iter(peaks.values()), math.nan)))
        memories = data.get("memory", [])
        dram = next((m for m in memories if m.get("name") == "dram"), memories[0] if memories else {})
        bandwidth = _num(dram.get("bandwidth_bytes_per_s"))
        overhead = _num(data.get("overheads", {}).get("kernel_launch_s", 0.0))
        cal = data.get("calibration", {})
        model = cls(peak_flops=peak, bandwidth=bandwidth, overhead_s=overhead if overhead == overhead else 0.0)
        model.llc_bytes = float(cal.get("llc_bytes", 0) or 0)
        for row in cal.get("matmul", []):
            if row.get("dtype", "fp32") != "fp32" or bool(row.get("cold", False)) != cold:
                continue
            if int(row.get("m", 8)) < 8:
                continue  # matrix-vector: memory-bound, covered by the streaming floor
            point = (float(row["flops"]), float(row["time_s"]))
            if int(row.get("batch", 1)) > 1:
                model.bmm.append(point)
            else:
                (model.packed if row.get("packed") else model.gemm).append(point)
        for row in cal.get("ops", []):
            if bool(row.get("cold", False)) != cold:
                continue
            model.ops.setdefault(str(row["op"]), []).append((float(row["bytes"]), float(row["time_s"])))
        model.gemm.sort()
        model.packed.sort()
        model.bmm.sort()
        for points in model.ops.values():
            points.sort()
        if not cold and any(row.get("cold") for row in cal.get("ops", [])):
            model.cold = cls.from_dict(data, cold=True)
        return model

    # -- curves -----------------------------------------------------------------------
    def matmul_time(self, flops: float, nbytes: float, *, batched: bool, packed: bool = False) -> float:
        if batched:
            points = self.bmm or self.gemm
        else:
            points = (self.packed if packed else self.gemm) or self.gemm or self.packed or self.bmm
        if points:
            rates = [(f, f / max(t - self.overhead_s, 1e-9)) for f, t in points]
            rate = _interp_log(rates, flops)
        else:
            rate = self.peak_flops
        compute = self.overhead_s + flops / rate
        stream = self.overhead_s + nbytes / self._stream_rate(nbytes)
        return max(compute, stream)

    def op_time(self, op_class: str, nbytes: float) -> float:
        while op_class not in self.ops and op_class in CPU_KERNEL_FALLBACK:
            op_class = CPU_KERNEL_FALLBACK[op_class]
        points = self.ops.get(op_class) or self.ops.get(_DEFAULT_CLASS)
        if not points:
            return self.overhead_s + nbytes / self.bandwidth
        # time above the fixed overhead scales with bytes: interpolate bytes/s, log-log
        rates = [(b, b / max(t - self.overhead_s, 1e-9)) for b, t in points]
        return self.overhead_s + nbytes / _interp_log(rates, nbytes)

    def _stream_rate(self, nbytes: float) -> float:
        points = self.ops.get(_DEFAULT_CLASS)
        if not points:
            return self.bandwidth
        return _interp_log([(b, b / max(t - self.overhead_s, 1e-9)) for b, t in points], nbytes)


def _interp_log(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear interpolation of y in log(x); clamped to the end points."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    xs = [p[0] for p in points]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    frac = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + frac * (y1 - y0)


def load_cpu_model(target: Any) -> CpuModel:
    """A `CpuModel` from a target: a CpuModel, a parsed TOML dict, a TOML path, or a Target
    object that keeps its parsed TOML (``raw``/``data``) or its file (``path``/``source``).
    A TOML file brings its node table (`node_table_path`) when one is cached beside it."""
    if isinstance(target, CpuModel):
        return target
    if isinstance(target, Mapping):
        return CpuModel.from_dict(target)
    if isinstance(target, str | Path):
        with open(target, "rb") as fh:
            data = tomllib.load(fh)
        model = CpuModel.from_dict(data)
        model.nodes, model.l2_bytes = load_node_table(node_table_path(target), threads=calibrated_threads(data))
        return model
    file = next(
        (Path(v) for a in ("path", "source", "file") if isinstance(v := getattr(target, a, None), str | Path)), None
    )
    for attr in ("raw", "data", "toml"):
        value = getattr(target, attr, None)
        if isinstance(value, Mapping):
            model = CpuModel.from_dict(value)
            file = file or _calibration_file(value)
            if file is not None:
                model.nodes, model.l2_bytes = load_node_table(node_table_path(file), threads=calibrated_threads(value))
            return model
    if file is not None and file.is_file():
        return load_cpu_model(file)
    raise TypeError(f"cannot read CPU calibration figures from {type(target).__name__}")


# -- the per-node table: the model's own shapes, measured (dabench_ir.execute.microbench) ---------
NODE_TABLE_FORMAT = 1
"""Bumped when node signatures or the table file change; an older table is measured again."""


def node_table_path(target_path: str | Path) -> Path:
    """Where the per-node benchmark table of a calibrated ``cpu`` target TOML is cached: beside it."""
    path = Path(target_path)
    return path.with_name(f"{path.stem}.nodes.json")


def _calibration_file(data: Mapping[str, Any]) -> Path | None:
    """The calibration file a target's node table sits beside, when the measured path named it
    (``calibration.file``, set by `dabench_ir.execute.microbench.with_node_table`)."""
    file = data.get("calibration", {}).get("file")
    return Path(file) if isinstance(file, str) and file else None


def calibrated_threads(data: Mapping[str, Any]) -> int | None:
    """The onnxruntime thread count a calibrated ``cpu`` target's figures were measured at (its
    ``calibration.key.threads``, the count its cache file is named by); None for a target that
    names none (written by hand). Its peak, curves and node table hold at that count only."""
    cal = data.get("calibration") if isinstance(data, Mapping) else None
    key = cal.get("key") if isinstance(cal, Mapping) else None
    threads = key.get("threads") if isinstance(key, Mapping) else None
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None


def load_node_table(path: str | Path, *, threads: int | None = None) -> tuple[dict[str, tuple[float, float]], float]:
    """Signature -> (cache-hot, flushed) measured seconds from a node table file, and the L2 size
    it records; empty when absent, unreadable, of another format, or (``threads``: the count the
    calibration beside it was measured at, `calibrated_threads`) timed at another thread count:
    a 2-thread kernel time beside a 1-thread peak mixes two machines (the class model predicts)."""
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, 0.0
    if not isinstance(data, Mapping) or data.get("format") != NODE_TABLE_FORMAT:
        return {}, 0.0
    if threads is not None and data.get("threads") != threads:
        logger.info("node table %s was timed at %s threads, not %d: left out", path, data.get("threads"), threads)
        return {}, 0.0
    out: dict[str, tuple[float, float]] = {}
    for sig, rec in (data.get("nodes") or {}).items():
        if not isinstance(rec, Mapping):
            continue
        hot, cold = rec.get("time_s"), rec.get("cold_s")
        if all(isinstance(t, int | float) and math.isfinite(t) and t >= 0 for t in (hot, cold)):
            out[str(sig)] = (float(hot), float(cold))
    l2 = data.get("l2_bytes")
    return out, float(l2) if isinstance(l2, int | float) and l2 > 0 else 0.0


def _attr_text(value: Any) -> str:
    if isinstance(value, bool | int | float | str):
        return repr(value)
    if isinstance(value, list | tuple) and all(isinstance(v, bool | int | float | str) for v in value):
        return repr(list(value))
    return type(value).__name__  # tensors, graphs: their kind only


def node_signature(graph: Graph, node: Node) -> str | None:
    """What decides a node's kernel time on the host, as one string: op (and domain), its
    attributes, each operand's dtype and static shape with ``w`` for a stored weight or
    constant (onnxruntime pre-packs those) and ``c`` for a Constant node's output, and the
    outputs' dtypes and shapes. None when a shape is not static."""
    parts = [f"{node.domain or ''}::{node.op_type}"]
    parts.append(",".join(f"{k}={_attr_text(v)}" for k, v in sorted(node.attrs.items())))
    for label, names in (("in", node.inputs), ("out", node.outputs)):
        items = []
        for name in names:
            if not name:
                items.append("-")
                continue
            if name not in graph.values:
                return None
            value = graph.values[name]
            ttype = graph.type_of(name).bind(graph.bindings)
            if ttype.shape is None or not ttype.is_static:
                return None
            tag = ""
            if label == "in":
                if value.producer is None and value.kind.is_stored:
                    tag = "w"
                elif value.producer is not None and graph.node(value.producer).op_type == "Constant":
                    tag = "c"
            items.append(f"{ttype.dtype}{list(ttype.shape)}{tag}")
        parts.append(f"{label}:" + ";".join(items))
    return "|".join(parts)


# -- per node --------------------------------------------------------------------------
def _shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    if not name or name not in graph.values:
        return None
    ttype = graph.type_of(name)
    if ttype.shape is None or not ttype.is_static:
        return None
    return tuple(int(d) for d in ttype.shape)  # type: ignore[arg-type]


def _nbytes(graph: Graph, names: Sequence[str]) -> int | None:
    total = 0
    for name in names:
        if not name:
            continue
        if name not in graph.values:
            return None
        ttype = graph.type_of(name)
        if not ttype.is_static:
            return None
        total += ttype.nbytes()
    return total


def _cost_of(node: Node) -> Any:
    from dabench_ir.passes.meta import COST

    return node.meta.get(COST)


def matmul_dims(graph: Graph, node: Node) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a MatMul/Gemm node from its input shapes, or None."""
    a = _shape(graph, node.inputs[0]) if node.inputs else None
    b = _shape(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    if a is None or b is None or not a or not b:
        return None
    if node.op_type in ("Gemm", "FusedGemm"):
        m, k = (a[1], a[0]) if node.attrs.get("transA") else (a[0], a[1])
        n = b[0] if node.attrs.get("transB") else b[1]
        return 1, m, k, n
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch_a = math.prod(a2[:-2]) if len(a2) > 2 else 1
    batch_b = math.prod(b2[:-2]) if len(b2) > 2 else 1
    if batch_b == 1:  # a stack of rows times one weight: one big GEMM
        return 1, batch_a * m, k, n
    return max(batch_a, batch_b), m, k, n


def predict_node(graph: Graph, node: Node, model: CpuModel, *, ort_opt: bool = False) -> float | None:
    """Predicted seconds for one node from the class model (curves), or None when its shapes
    are unknown. `predict_cpu_times` prefers the node table when it has the node's signature."""
    op = node.op_type
    traits = traits_of(node)
    if traits.shape_only:
        return model.overhead_s
    io_bytes = _nbytes(graph, [*node.inputs, *node.outputs])
    if io_bytes is None:
        cost = _cost_of(node)
        io_bytes = cost.bytes if cost is not None else None
    if traits.cpu_class == CPU_MATMUL:
        dims = matmul_dims(graph, node)
        if dims is not None:
            batch, m, k, n = dims
            flops = 2.0 * batch * m * k * n
            return model.matmul_time(
                flops, float(io_bytes or 0), batched=batch > 1, packed=_is_stored(graph, node, ort_opt)
            )
        cost = _cost_of(node)
        if cost is not None:
            return model.matmul_time(float(cost.flops), float(cost.bytes), batched=False)
        return None
    if io_bytes is None:
        return None
    op_class = traits.cpu_class
    if op == "Transpose" and _moves_last_axis(graph, node):
        op_class = CPU_TRANSPOSE_2D
    elif op == "Gelu" and node.attrs.get("approximate") == "tanh":
        op_class = CPU_GELU_TANH
    return model.op_time(op_class, float(io_bytes))


def _is_stored(graph: Graph, node: Node, ort_opt: bool) -> bool:
    """True when a MatMul's B operand is a weight or constant (onnxruntime pre-packs it)."""
    if len(node.inputs) < 2 or node.inputs[1] not in graph.values:
        return False
    value = graph.values[node.inputs[1]]
    if not value.kind.is_stored:
        return False
    if value.producer is None:
        return True
    # a folded weight layout is a constant to onnxruntime only when its optimiser runs
    return ort_opt and FOLDED in graph.node(value.producer).meta


def _moves_last_axis(graph: Graph, node: Node) -> bool:
    """True when a Transpose changes the innermost axis (element-wise gather, slow)."""
    perm = node.attrs.get("perm")
    if perm is None:
        shape = _shape(graph, node.inputs[0]) if node.inputs else None
        return shape is None or len(shape) > 1
    return len(perm) > 1 and int(perm[-1]) != len(perm) - 1


def predict_cpu_times(graph: Graph, target: Any, *, ort_opt: bool = False) -> dict[str, float]:
    """Predicted seconds per node on the calibrated host CPU; nodes of unknown shape left out.

    ``target`` is the ``cpu`` target (a Target object, its parsed TOML, or its path);
    ``ort_opt``: onnxruntime's graph optimiser is on, so it folds weight layouts away.
    """
    model = load_cpu_model(target)
    frac = cold_fraction(graph, model)
    written = _bytes_written_before(graph) if model.nodes else {}
    run_bytes = float(footprint_bytes(graph)) if model.nodes else 0.0
    out: dict[str, float] = {}
    for node in graph.nodes:
        if ort_opt and FOLDED in node.meta:
            out[node.name] = 0.0
            continue
        sig = node_signature(graph, node) if model.nodes else None
        if sig is not None and sig in model.nodes:
            hot, flushed = model.nodes[sig]
            flushed = max(flushed, hot)  # a flushed cache never speeds a node up: a lower reading is noise
            share = cold_share(graph, node, written, model.l2_bytes, run_bytes)
            out[node.name] = hot + share * (flushed - hot)
            continue
        t = curve = predict_node(graph, node, model, ort_opt=ort_opt)
        if t is not None and curve and model.cold is not None and frac > 0 and _reads_stored(graph, node):
            # the table and the hot curves are measured cache-hot; the model's stored operands
            # come in as far colder as the flushed curve is slower, by its footprint over the cache
            t_cold = predict_node(graph, node, model.cold, ort_opt=ort_opt)
            if t_cold is not None:
                t *= 1.0 + frac * (t_cold / curve - 1.0)
        if t is not None:
            out[node.name] = t
    return out


STORED_COLD = 1.0
"""How cold a stored operand (weight, constant, graph input) is (0..1): last touched a run ago."""
OUTPUT_COLD = 0.0
"""How cold a node's outputs are (0..1). onnxruntime's memory planner writes a node's output
into a buffer an earlier node of the same run freed (an activation just consumed), so the
lines it writes are as warm as the activations it replaces: hot, as in the hot benchmark
(where the output buffer was written the run before). Counting them cold (1.0) put the
small weight MatMuls of the foreign decoders 20-50 % slow (a flushed one-node run pays for
its output lines too) and the models 5-13 % slow end to end."""


def _bytes_written_before(graph: Graph) -> dict[str, int]:
    """Node -> bytes the nodes before it wrote (a running total, in graph order)."""
    out: dict[str, int] = {}
    total = 0
    for node in graph.nodes:
        out[node.name] = total
        total += _nbytes(graph, node.outputs) or 0
    return out


def cold_share(
    graph: Graph, node: Node, written: Mapping[str, int], l2_bytes: float, run_bytes: float = math.inf
) -> float:
    """How far between its cache-hot and its flushed time a node runs in the model, 0..1: the
    share of its operand bytes that come in cold. A stored operand (weight, constant, graph
    input) was last touched a run ago: cold. An activation is cold by how many bytes the nodes
    between its producer and this node wrote, over the private (L2) cache, capped at 1. The
    outputs land in buffers the same run freed: as cold as `OUTPUT_COLD` says (hot). What a
    run last touched a run ago is cold only as far as the run's footprint (``run_bytes``)
    exceeds the L2 cache: a run that fits it keeps everything hot."""
    if traits_of(node).shape_only:
        return 0.0  # views (Reshape, Squeeze, ...) touch no data: their time is the fixed overhead
    if l2_bytes <= 0:
        return 1.0
    per_run = min(1.0, run_bytes / l2_bytes)
    here = written.get(node.name, 0)
    total = cold = 0.0
    for name in node.inputs:
        if not name or name not in graph.values:
            continue
        ttype = graph.type_of(name)
        if not ttype.is_static:
            continue
        nbytes = float(ttype.nbytes())
        producer = graph.values[name].producer
        if producer is None or graph.node(producer).op_type == "Constant":
            share = STORED_COLD * per_run
        else:
            since = here - written.get(producer, 0) - (_nbytes(graph, graph.node(producer).outputs) or 0)
            share = min(1.0, max(since, 0) / l2_bytes)
        total += nbytes
        cold += share * nbytes
    out_bytes = float(_nbytes(graph, node.outputs) or 0)
    total += out_bytes
    cold += OUTPUT_COLD * per_run * out_bytes
    return cold / total if total > 0 else 0.0


def _reads_stored(graph: Graph, node: Node) -> bool:
    """True when a node reads a weight or graph input larger than a cache line or two: data
    last touched a whole run ago. Other operands were just written by earlier nodes."""
    for name in node.inputs:
        value = graph.values.get(name) if name else None
        ttype = graph.type_of(name) if value is not None and value.producer is None else None
        if ttype is not None and ttype.is_static and ttype.nbytes() > 4096:
            return True
    return False


def footprint_bytes(graph: Graph) -> int:
    """Bytes of every statically shaped value a run reads or writes once: weights, inputs,
    and each node's outputs."""
    return sum(graph.type_of(name).nbytes() for name in graph.values if graph.type_of(name).is_static)


def cold_fraction(graph: Graph, model: CpuModel) -> float:
    """How far between the cache-hot and the flushed curves a model's nodes sit: a run whose
    footprint fits the last-level cache finds its operands there (0); one that streams
    through more than the cache finds them evicted (1); linear in between."""
    if model.cold is None:
        return 0.0
    if model.llc_bytes <= 0:
        return 1.0
    return min(1.0, footprint_bytes(graph) / model.llc_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuOptions(LoweringOptions):
    """What the host CPU lowering reads."""

    ort_opt: bool


class CpuLowering(Lowering):
    """The host CPU: onnxruntime's kernels one after another, each timed by the calibration."""

    name = "cpu"
    kinds = ("cpu",)
    Options = CpuOptions
    feed = "off-chip"  # every operand streams from host DRAM
    without_micro_batches: ClassVar[dict[str, str]] = dict.fromkeys(
        ("inference", "train"), "onnxruntime runs a step's whole batch in one call of the graph on the host"
    )

    def _lower(self, ctx: LoweringContext, target: Target, options: CpuOptions) -> Plan:
        times = predict_cpu_times(ctx.graph, target, ort_opt=options.ort_opt)
        feed_of = feed_levels(ctx, target)
        for name, level in feed_of.items():  # the roofline floor: no faster than the peak, or the level feeding it
            node = ctx.graph.node(name)
            if name in times and ctx.is_work(node):
                cost = ctx.costs[name]
                peak = target.peak_bound(str(node.meta.get(meta.PRECISION) or ctx.precision))
                times[name] = max(times[name], cost.bytes / level.bandwidth_bytes_per_s, cost.flops / peak)
        # onnxruntime runs one kernel per node, unfused
        return stream_plan(ctx, target, options, Unit(id="cpu0", kind="cpu"), fuse=False, times=times, feed_of=feed_of)


def feed_levels(ctx: LoweringContext, target: Target) -> dict[str, MemoryLevel]:
    """The memory level that feeds each node: the last-level cache (the calibration's on-chip
    ``llc`` level) when the node's bytes fit in it, else DRAM. A node's measured or interpolated
    time never beats its bytes over that level's bandwidth (the physics verifier's bound):
    between a cache-resident and a DRAM-sized calibration point the log-log curve would
    otherwise run a 67 MB op at cache speed."""
    dram = target.memory("off-chip")
    cache = target.memory("on-chip") if target.has_memory("on-chip") else None
    out = {}
    for node in ctx.graph.nodes:
        nbytes = ctx.costs[node.name].bytes
        out[node.name] = cache if cache is not None and nbytes <= cache.capacity_bytes else dram
    return out


LOWERING = CpuLowering()
