"""Per-node micro-benchmarks: the shapes a model runs, measured once per machine and cached.

The host calibration (`dabench_ir.execute.calibrate`) measures op classes at a few fixed
sizes; a model's own nodes come in shape families it did not see (skinny and batched
matmuls, grouped-query attention's broadcast keys, head transposes with one permutation
or another, gathers, expands). This module measures what a model needs instead: every
distinct node signature (`dabench_ir.lowering.cpu.node_signature`: op, attributes, input
and output shapes and dtypes, which operands are stored weights) becomes a one-node ONNX
model with the same operands (weights as initializers, so onnxruntime pre-packs them as
it does in the model; constants with their real values; activations synthesised) and is
timed with onnxruntime's per-node profiler, the same clock as ``--measure``, at the
calibration's thread count.

Signatures are measured most expensive first (the class model's estimate times how often
the signature occurs) until a time budget is spent (`DEFAULT_BUDGET_S`); those left over
keep the class model's prediction. Each signature is timed in `_PASSES` passes spread over
the benchmark, each just after a reference kernel (`SpeedProbe`) reads how fast the machine
runs right then; passes taken while another job held a core are dropped, and the signature
records the median of the rest, its spread (IQR / median over the timed runs), how many
runs, and the drift between passes. The table is cached beside
the calibration file (`dabench_ir.lowering.cpu.node_table_path`) and only new signatures
are measured next time.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import statistics
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.execute.ort import default_threads, parse_profile
from dabench_ir.lowering.cpu import (
    NODE_TABLE_FORMAT,
    calibrated_threads,
    load_cpu_model,
    node_signature,
    node_table_path,
    predict_node,
)
from dabench_ir.passes.cost_rules import op_traits
from dabench_ir.schema import is_number

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from dabench_ir.ir import Graph

__all__ = [
    "DEFAULT_BUDGET_S",
    "BenchResult",
    "SpeedProbe",
    "bench_node_model",
    "combine_passes",
    "ensure_for_target",
    "ensure_node_table",
    "plan_signatures",
    "signature_groups",
    "with_node_table",
]

logger = logging.getLogger(__name__)

MAX_WEIGHT_BYTES = 512 << 20
"""Models with more weight bytes than this are not benchmarked node by node (synthesising them costs more)."""
DEFAULT_BUDGET_S = 20.0
"""Wall-clock seconds one model's node benchmarks may take when nothing is cached (bounded: <= 30 s)."""
_PER_NODE_S = 0.04  # timed-run time per signature, after the warm-up
_MIN_RUNS = 5
_MAX_RUNS = 60
_BUSY = 1.5
"""A node benchmark taken while the probe (`SpeedProbe`) ran more than this many times its quiet
(fastest) time is dropped: on a machine at rest the probe reads within about 1.25x of its
fastest; with another job holding a core, 2-5x."""
_PASSES = 3
"""Passes over a model's signatures: each is timed once per pass and keeps its median over the
passes. A 2-vCPU VM shared with other jobs runs a 2-thread kernel at one speed for a second and
at up to twice the time the next; one window per node catches one state, the model's own run
(seconds long) the usual one."""
_WARMUP = 2
_MAX_CAPTURE_BYTES = 512 << 20
_MIN_FLUSH_BYTES = 8 << 20
_DEFAULT_L2_BYTES = 1 << 20  # when sysfs does not say


@dataclass(slots=True)
class BenchResult:
    """What one call measured: signatures measured now, found cached, and left to the class model."""

    table_path: Path
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)
    cached: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # signature -> why not measured
    seconds: float = 0.0


def signature_groups(graph: Graph) -> dict[str, list[str]]:
    """The names of ``graph``'s nodes by their signature (`node_signature`), in graph order;
    Constants and nodes without a signature left out."""
    groups: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.op_type == "Constant":
            continue
        sig = node_signature(graph, node)
        if sig is not None:
            groups.setdefault(sig, []).append(node.name)
    return groups


def plan_signatures(
    graph: Graph, model: Any = None, groups: Mapping[str, list[str]] | None = None
) -> list[tuple[str, list[str], float]]:
    """Distinct node signatures of ``graph`` (``groups``: those of `signature_groups` to plan,
    e.g. the ones a table lacks; default every one) as (signature, node names, estimated total
    seconds), most expensive first; the estimate is the class model's (``model``), else each
    node's bytes."""
    from dabench_ir.passes.meta import COST

    def estimate(name: str) -> float:
        node = graph.node(name)
        t = predict_node(graph, node, model) if model is not None else None
        if t is None:
            cost = node.meta.get(COST)
            t = float(cost.bytes) * 1e-10 if cost is not None else 0.0
        return t

    groups = signature_groups(graph) if groups is None else groups
    planned = [(sig, names, sum(map(estimate, names))) for sig, names in groups.items()]
    return sorted(planned, key=lambda r: -r[2])


def ensure_node_table(
    proto: onnx.ModelProto | str | os.PathLike[str],
    graph: Graph,
    target_path: str | os.PathLike[str],
    *,
    threads: int | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    max_weight_bytes: int = MAX_WEIGHT_BYTES,
    say: Any = None,
) -> BenchResult:
    """Measure the node signatures of ``graph`` the cached table lacks, within ``budget_s``.

    ``proto`` is the model ``graph`` came from (a ModelProto or an ONNX path; weights may
    be shape-only, they are synthesised); ``target_path`` the calibrated ``cpu`` target
    TOML whose table (`node_table_path`) is read and extended, at the thread count it was
    calibrated at (default; another ``threads`` raises UserError: the table is that
    calibration's, never one of another count written over it). A model whose weights take
    more than ``max_weight_bytes`` raises UserError (the class model predicts it).
    """
    from dabench_ir.execute.synth import name_nodes, prepare_model
    from dabench_ir.frontends.onnx import read_model
    from dabench_ir.options import check_calibrated_threads

    start = time.perf_counter()
    try:
        with open(target_path, "rb") as fh:
            target_data = tomllib.load(fh)
        model = load_cpu_model(target_data)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, TypeError, KeyError, ValueError):
        target_data, model = {}, None
    check_calibrated_threads(target_data, threads)
    threads = int(threads or calibrated_threads(target_data) or default_threads())
    table_path = node_table_path(target_path)
    table = _read_table(table_path, threads)
    stored_probe = _read_probe(table_path)
    result = BenchResult(table_path=table_path)
    groups = signature_groups(graph)
    result.cached = sum(sig in table for sig in groups)
    missing = {sig: names for sig, names in groups.items() if sig not in table}
    if not missing:
        result.seconds = time.perf_counter() - start
        return result
    raw, path = read_model(proto)
    prepared = prepare_model(  # refuses a model above the cap before any node is estimated
        raw,
        path=Path(path) if path else None,
        graph=graph,
        dims=dict(graph.bindings),
        max_weight_bytes=max_weight_bytes,
    )
    name_nodes(prepared.model, graph)
    todo = plan_signatures(graph, model, missing)
    if say:
        say(
            f"measuring {len(todo)} node shapes this host has not timed yet (the cpu target predicts from them; "
            f"once per shape, cached in {table_path}; at most {budget_s:.0f} s)"
        )
    budget = _Budget(start, budget_s)
    probe = SpeedProbe(threads)
    flush = max(8 * _l2_bytes(), _MIN_FLUSH_BYTES)
    timer = _NodeTimer(
        graph=graph,
        context=_Context.of(prepared.model, prepared.feeds, graph),
        probe=probe,
        threads=threads,
        budget=budget,
        flush_bytes=flush,
    )
    by_name = {n.name: n for n in prepared.model.graph.node}
    pass_start = time.perf_counter()
    ready = [b for sig, names, _est in todo if (b := timer.first_pass(sig, by_name.get(names[0]), result))]
    quiet = timer.more_passes(ready, one_pass_s=time.perf_counter() - pass_start, stored_probe=stored_probe)
    for bench in ready:
        rec, rec_cold = combine_passes(bench.hots, bench.colds, bench.speeds, quiet=quiet)
        rec["op"] = bench.op
        rec["cold_s"] = rec_cold["time_s"]
        rec["cold_spread"] = rec_cold["spread"]
        table[bench.signature] = rec
        result.measured[bench.signature] = rec
    if result.measured:
        _write_table(table_path, table, threads, probe_s=quiet)
    result.seconds = time.perf_counter() - start
    logger.info(
        "node benchmarks: %d measured, %d cached, %d left to the class model (%.1f s)",
        len(result.measured),
        result.cached,
        len(result.skipped),
        result.seconds,
    )
    return result


def ensure_for_target(model: Any, graph: Graph, target: Any, *, threads: int | None = None, say: Any = None) -> Any:
    """`ensure_node_table` for a loaded calibrated ``cpu`` Target; the Target to lower with
    (`with_node_table`: it names its calibration file, so the lowering finds the table), or
    ``target`` unchanged when it is not a cached calibration. The nodes are timed at the
    calibration's thread count; a ``threads`` (the run's ``--threads``) other than it raises
    UserError (`dabench_ir.options.check_calibrated_threads`). A model that cannot be
    benchmarked keeps the class model (logged), never an error here."""
    from dabench_ir.errors import UserError
    from dabench_ir.execute.calibrate import cache_file
    from dabench_ir.options import check_calibrated_threads

    raw = getattr(target, "raw", None)
    calibrated = calibrated_threads(raw) if isinstance(raw, Mapping) else None
    if calibrated is None:
        return target
    check_calibrated_threads(target, threads)  # a user's mistake, said; never a table timed at another count
    path = cache_file(raw["calibration"]["key"])
    if not path.is_file():
        return target
    try:
        ensure_node_table(model, graph, path, threads=calibrated, say=say)
    except (UserError, OSError, ValueError) as exc:
        logger.info("no node benchmarks for this model (%s): the class model predicts", exc)
    return with_node_table(target, path)


def with_node_table(target: Any, path: str | os.PathLike[str]) -> Any:
    """``target`` (a calibrated ``cpu`` Target) naming its calibration file ``path`` in
    ``raw["calibration"]["file"]``, where the lowering looks for the node table beside it."""
    import dataclasses

    raw = dict(target.raw)
    raw["calibration"] = {**raw.get("calibration", {}), "file": str(path)}
    return dataclasses.replace(target, raw=raw)


# -- one-node models ---------------------------------------------------------------------
class _CannotBench(Exception):
    """This node cannot be rebuilt on its own (an operand whose value is unknown)."""


@dataclass(slots=True)
class _Context:
    """What the prepared model knows of tensor values: initializers, Constant outputs, feeds."""

    inits: dict[str, onnx.TensorProto]
    constants: dict[str, onnx.TensorProto]
    feeds: dict[str, np.ndarray]
    opsets: list[Any]
    ir_version: int
    values: dict[str, np.ndarray] = field(default_factory=dict)  # activations from one run of the model

    @classmethod
    def of(cls, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], graph: Graph | None = None) -> _Context:
        """The prepared model's known values; with ``graph``, one run of the model (when its
        activations fit `_MAX_CAPTURE_BYTES`) gives every activation its real value: data
        matter (a masked Softmax is several times slower than one over random scores)."""
        from onnx import numpy_helper

        constants: dict[str, onnx.TensorProto] = {}
        for node in model.graph.node:
            if node.op_type != "Constant" or not node.output:
                continue
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = attr.t
                elif attr.name in ("value_int", "value_ints", "value_float", "value_floats"):
                    import numpy as np

                    value = {
                        "value_int": lambda a: np.array(a.i, np.int64),
                        "value_ints": lambda a: np.array(list(a.ints), np.int64),
                        "value_float": lambda a: np.array(a.f, np.float32),
                        "value_floats": lambda a: np.array(list(a.floats), np.float32),
                    }[attr.name](attr)
                    constants[node.output[0]] = numpy_helper.from_array(value)
        return cls(
            inits={i.name: i for i in model.graph.initializer},
            constants=constants,
            feeds=dict(feeds),
            opsets=list(model.opset_import),
            ir_version=model.ir_version,
            values=_capture(model, feeds, graph) if graph is not None else {},
        )


def _capture(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], graph: Graph) -> dict[str, np.ndarray]:
    """Every statically shaped activation of one run of ``model`` (empty when they would take
    more than `_MAX_CAPTURE_BYTES` or onnxruntime refuses)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    names: list[str] = []
    total = 0
    have = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        for name in node.output:
            if not name or name in have or name not in graph.values:
                continue
            ttype = graph.type_of(name).bind(graph.bindings)
            if ttype.shape is None or not ttype.is_static:
                continue
            total += ttype.nbytes()
            names.append(name)
    if not names:
        return {}
    if total > _MAX_CAPTURE_BYTES:
        logger.info("activations take %d bytes: node benchmarks synthesise them", total)
        return {}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        session = ort.InferenceSession(copy.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = session.run(names, dict(feeds))
    except Exception as exc:  # onnxruntime's own exception types
        logger.info("cannot capture activations (%s): node benchmarks synthesise them", str(exc)[:120])
        return {}
    return dict(zip(names, outs, strict=True))


def bench_node_model(
    node: onnx.NodeProto, graph: Graph, ctx: _Context, *, flush_bytes: int = 0
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """A one-node model running ``node`` (renamed ``bench``) on operands like the model's, and its feeds.

    Stored operands (initializers, Constant outputs) keep their values; graph inputs take the
    prepared feeds; activations are synthesised at their static shapes (shape operands of
    Reshape/Expand from the output shape, indices as zeros). Raises _CannotBench otherwise.
    """
    import numpy as np
    import onnx
    from onnx import helper

    rng = np.random.default_rng(0)
    inputs: list[onnx.ValueInfoProto] = []
    inits: list[onnx.TensorProto] = []
    feeds: dict[str, Any] = {}
    seen: set[str] = set()
    traits = op_traits(node.op_type, node.domain)  # which integer inputs it can be fed
    for idx, name in enumerate(node.input):
        if not name or name in seen:
            continue
        seen.add(name)
        if name in ctx.inits or name in ctx.constants:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(ctx.inits.get(name) or ctx.constants[name])
            tensor.name = name
            inits.append(tensor)
            continue
        shape, code = _static_type(graph, name)
        np_dtype = helper.tensor_dtype_to_np_dtype(code)
        if name in ctx.feeds or name in ctx.values:
            value = ctx.feeds.get(name, ctx.values.get(name))
        elif np.issubdtype(np_dtype, np.floating):
            value = rng.standard_normal(shape).astype(np_dtype)
        elif np_dtype == np.bool_:
            value = rng.random(shape) < 0.5
        elif traits.output_shape_input == idx and node.output:
            out_shape, _ = _static_type(graph, node.output[0])
            value = np.array(out_shape, dtype=np_dtype)
            if value.shape != tuple(shape):
                raise _CannotBench(f"{node.op_type} shape operand {name!r} is not the output shape")
        elif traits.index_input == idx:
            value = np.zeros(shape, dtype=np_dtype)
        else:
            raise _CannotBench(f"integer operand {name!r} of {node.op_type} is computed at run time")
        feeds[name] = value
        inputs.append(helper.make_tensor_value_info(name, code, shape))
    outputs = []
    for name in node.output:
        if not name:
            continue
        shape, code = _static_type(graph, name)
        outputs.append(helper.make_tensor_value_info(name, code, shape))
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = "bench"
    nodes = [copy]
    if flush_bytes:  # read a buffer larger than the private caches first, as the rest of a model does
        inputs.append(helper.make_tensor_value_info("_flush", onnx.TensorProto.FLOAT, (flush_bytes // 4,)))
        outputs.append(helper.make_tensor_value_info("_flushed", onnx.TensorProto.FLOAT, ()))
        nodes.insert(0, helper.make_node("ReduceMax", ["_flush"], ["_flushed"], name="flush", keepdims=0))
        feeds["_flush"] = np.ones(flush_bytes // 4, dtype=np.float32)
    graph_proto = helper.make_graph(nodes, "bench", inputs, outputs, inits)
    model = helper.make_model(graph_proto, opset_imports=ctx.opsets)
    model.ir_version = ctx.ir_version
    return model, feeds


def _static_type(graph: Graph, name: str) -> tuple[tuple[int, ...], int]:
    if name not in graph.values:
        raise _CannotBench(f"no type for {name!r}")
    ttype = graph.type_of(name).bind(graph.bindings)
    if ttype.shape is None or not ttype.is_static:
        raise _CannotBench(f"{name!r} has no static shape")
    return tuple(int(d) for d in ttype.shape), ttype.dtype.onnx_code  # type: ignore[arg-type]


@dataclass(slots=True)
class _Bench:
    """One node signature being timed: its op, its hot and flushed one-node models (model, feeds),
    and per pass its hot and flushed `_time_node` records and the speed probe's reading before them."""

    signature: str
    op: str
    hot: tuple[onnx.ModelProto, dict[str, Any]]
    cold: tuple[onnx.ModelProto, dict[str, Any]]
    hots: list[dict[str, Any]] = field(default_factory=list)
    colds: list[dict[str, Any]] = field(default_factory=list)
    speeds: list[float] = field(default_factory=list)

    def another_pass(self, probe: SpeedProbe, threads: int) -> None:
        """One more pass of a node already timed once: the probe, then its hot and flushed timings,
        appended together (a pass onnxruntime fails is left out; the first one stands)."""
        speed = probe.time()
        try:
            hot = _time_node(*self.hot, threads=threads, max_s=_PER_NODE_S)
            cold = _time_node(*self.cold, threads=threads, max_s=_PER_NODE_S)
        except Exception as exc:  # onnxruntime's own exception types; the node has its first pass
            logger.debug("node benchmark pass dropped: %s", exc)
            return
        self.hots.append(hot)
        self.colds.append(cold)
        self.speeds.append(speed)


@dataclass(frozen=True, slots=True)
class _Budget:
    """The seconds a table's measurement may take, from ``start`` (a `time.perf_counter` reading)."""

    start: float
    seconds: float

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return max(self.seconds - self.spent(), 0.0)


@dataclass
class _NodeTimer:
    """Times one-node models of ``graph`` within ``budget``: a first pass over every signature, then
    more passes while the budget holds a whole one, and again for nodes timed only while the machine
    was busy (the speed probe slower than its quietest reading by `_BUSY`). A flushed run first
    streams ``flush_bytes`` to push the node's operands out of the caches."""

    graph: Graph
    context: _Context
    probe: SpeedProbe
    threads: int
    budget: _Budget
    flush_bytes: int

    def first_pass(self, sig: str, onnx_node: onnx.NodeProto | None, result: BenchResult) -> _Bench | None:
        """``sig`` timed once, hot and flushed; None, with the reason in ``result.skipped``, when the
        budget is spent or the node cannot be timed alone (the class model predicts it)."""
        if self.budget.left() <= 0:
            result.skipped[sig] = f"time budget ({self.budget.seconds:g} s) spent"
            return None
        if onnx_node is None:
            result.skipped[sig] = "node not found in the ONNX model"
            return None
        try:
            hot = bench_node_model(onnx_node, self.graph, self.context)
            cold = bench_node_model(onnx_node, self.graph, self.context, flush_bytes=self.flush_bytes)
        except _CannotBench as exc:
            result.skipped[sig] = str(exc)
            return None
        per_s = min(_PER_NODE_S, self.budget.left() / 2)
        bench = _Bench(sig, onnx_node.op_type, hot, cold)
        try:
            bench.speeds.append(self.probe.time())
            bench.hots.append(_time_node(*hot, threads=self.threads, max_s=per_s))
            bench.colds.append(_time_node(*cold, threads=self.threads, max_s=per_s))
        except Exception as exc:  # onnxruntime rejects an odd one-node model: keep the class model
            result.skipped[sig] = f"onnxruntime: {str(exc).splitlines()[0][:120]}"
            return None
        return bench

    def more_passes(self, ready: list[_Bench], *, one_pass_s: float, stored_probe: float | None) -> float:
        """Later passes over ``ready`` (the machine's speed drifts), while the budget holds one of
        ``one_pass_s``, then again for the nodes with no quiet pass yet; the quietest probe reading
        (this run's, or the table's ``stored_probe``)."""
        for _ in range(_PASSES - 1):
            if not ready or self.budget.spent() + one_pass_s > self.budget.seconds:
                break
            for bench in ready:
                bench.another_pass(self.probe, self.threads)
        quiet = min([*self.probe.readings, *([stored_probe] if stored_probe else [])], default=0.0)
        for _ in range(_PASSES):
            busy = [b for b in ready if min(b.speeds) > _BUSY * quiet]
            if not busy:
                break
            for bench in busy:
                if self.budget.left() <= 0:
                    break
                bench.another_pass(self.probe, self.threads)
            quiet = min([quiet, *self.probe.readings])
        return quiet


def combine_passes(
    hots: Sequence[Mapping[str, Any]],
    colds: Sequence[Mapping[str, Any]],
    probes: Sequence[float] = (),
    *,
    quiet: float = 0.0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One node's hot and flushed records from its passes (`_time_node` records, one per pass):
    the median over the passes of each pass's median (the in-model time it is compared with
    is a median over a run of seconds, not the luckiest or unluckiest window), the median
    spread within a pass, the runs in all, and ``drift``: the passes' range over their median
    (how far the machine's speed moved while the table was measured).

    ``probes``: the reference kernel's time (`SpeedProbe`) just before each pass's timing, and
    ``quiet`` its time on the machine at rest (the fastest reading): passes taken while the
    probe read more than `_BUSY` times ``quiet`` (another job held a core) are dropped, unless
    every pass was; then those nearest the quiet reading are kept."""
    keep = list(range(len(hots)))
    if probes and len(probes) == len(hots) and quiet > 0:
        ok = [i for i, p in enumerate(probes) if p <= _BUSY * quiet]
        best = min(probes)
        keep = ok or [i for i, p in enumerate(probes) if p <= _BUSY * best]
    picked = []
    for recs in ([hots[i] for i in keep], [colds[i] for i in keep]):
        times = [float(r["time_s"]) for r in recs]
        med = statistics.median(times)
        picked.append(
            {
                "time_s": med,
                "spread": statistics.median(float(r.get("spread", 0.0)) for r in recs),
                "runs": sum(int(r.get("runs", 0)) for r in recs),
                "attempts": len(recs),
                "busy": len(hots) - len(recs),
                "drift": (max(times) - min(times)) / med if med > 0 else 0.0,
            }
        )
    return picked[0], picked[1]


class SpeedProbe:
    """A fixed reference kernel (a 128x256 by 256x512 fp32 MatMul at the benchmarks' thread
    count, about 0.1-0.2 ms a run) timed just before each node benchmark: how fast the machine is
    running right then. On a VM whose vCPUs other jobs share, a multi-threaded kernel takes up
    to twice its time while another process holds a core; the probe reads that state."""

    def __init__(self, threads: int) -> None:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(0)
        weight = numpy_helper.from_array(rng.standard_normal((256, 512)).astype(np.float32), "w")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, (128, 256))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, (128, 512))],
            [weight],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self._session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self._feeds = {"x": rng.standard_normal((128, 256)).astype(np.float32)}
        self.readings: list[float] = []
        self._session.run(None, self._feeds)

    def time(self, runs: int = 16) -> float:
        """The mean wall time of ``runs`` probe runs back to back (seconds, about 2-4 ms in all,
        so a share of the cores taken by another process shows, not only a whole preemption);
        kept in `readings`."""
        t0 = time.perf_counter()
        for _ in range(runs):
            self._session.run(None, self._feeds)
        value = (time.perf_counter() - t0) / runs
        self.readings.append(value)
        return value


def _time_node(model: onnx.ModelProto, feeds: dict[str, Any], *, threads: int, max_s: float) -> dict[str, Any]:
    """Median kernel time of node ``bench`` over timed runs that stop after ``max_s``
    (at least `_MIN_RUNS`, at most `_MAX_RUNS`), with its spread."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="dabench-nb-") as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # fatal only: a node that fails to load raises, and its profile-less end logs an error
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for _ in range(_WARMUP):
            session.run(None, feeds)
        runs = 0
        t0 = time.perf_counter()
        while runs < _MAX_RUNS and (runs < _MIN_RUNS or time.perf_counter() - t0 < max_s):
            session.run(None, feeds)
            runs += 1
        with open(session.end_profiling(), encoding="utf-8") as fh:
            events = json.load(fh)
    prof = parse_profile(events, warmup=_WARMUP)
    t = prof.node_times.get("bench")
    if t is None:
        raise RuntimeError("no kernel event for the benchmarked node")
    return {"time_s": t, "spread": prof.node_spread.get("bench", 0.0), "runs": runs}


# -- the table file ------------------------------------------------------------------------
def _read_table(path: Path, threads: int) -> dict[str, dict[str, Any]]:
    """The cached signatures for this calibration (empty when absent, unreadable or another format)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("format") != NODE_TABLE_FORMAT or data.get("threads") != threads:
        return {}
    nodes = data.get("nodes")
    if not isinstance(nodes, dict):
        return {}
    return {
        k: v for k, v in nodes.items() if isinstance(v, dict) and all(is_number(v.get(f)) for f in ("time_s", "cold_s"))
    }


def _l2_bytes() -> int:
    """Size of one core's level-2 cache from sysfs (the private cache a node's operands fall out of); 0 if unknown."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "level").read_text().strip() != "2" or (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
            return int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        except (OSError, ValueError):
            continue
    return 0


def _read_probe(path: Path) -> float:
    """The quiet probe time a cached table was measured against (0 when none)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("probe_s")
    except (OSError, ValueError, AttributeError, RecursionError):
        return 0.0
    return float(value) if is_number(value) and value > 0 else 0.0


def _write_table(path: Path, table: Mapping[str, Mapping[str, Any]], threads: int, *, probe_s: float = 0.0) -> None:
    data = {
        "format": NODE_TABLE_FORMAT,
        "threads": threads,
        "probe_s": probe_s,
        "l2_bytes": _l2_bytes() or _DEFAULT_L2_BYTES,
        "date": _dt.date.today().isoformat(),
        "source": "measured by dabench-ir (one-node onnxruntime models, per-node profiler)",
        "nodes": dict(table),
    }
    from dabench_ir.errors import UserError
    from dabench_ir.fileio import write_output

    try:  # a cache: one that cannot be written costs a re-measure next time, not this run
        path.parent.mkdir(parents=True, exist_ok=True)
        write_output(path, json.dumps(data, indent=0, sort_keys=True))
    except (OSError, UserError) as exc:
        logger.warning("node benchmark cache %s not written: %s", path, exc)
