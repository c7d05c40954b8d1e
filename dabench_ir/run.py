"""One run: a question resolved once (`resolve`), answered by one orchestration (`execute`).

Every command is a way of asking for runs: ``profile``, ``--target a,b,c``, ``scale``,
``sweep``, ``validate``, ``study``, ``diff``, ``--scenario``, ``demo`` and the Python API all
resolve their question into a `ResolvedRun` and hand it, with the model's Graph, to
`execute`, which returns the `Report` (one chip or many). Nothing else orchestrates passes,
placement and reporting, so the same question asked through any of them gets the same figure.

A `ResolvedRun` is immutable: the model, the target, every knob with its value and where the
value came from (``user``, ``target`` ``[defaults]``, ``model``, ``default``), and the
`Samples` of a step. The samples have one owner: **the graph's batch dim is the samples one
replica runs in one step.** A static batch in the graph *is* that batch (``--batch`` may only
restate it); a symbolic one is bound by ``--batch`` (or ``--dim``). Micro-batches split it,
data-parallel copies (chips under ``--strategy dp``, IPU replicas, WSE on-wafer replicas)
multiply it: samples per step = per replica x copies (`dabench_ir.plan.Plan.samples_per_step`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.options import KNOBS, ScaleOptions, check_applies
from dabench_ir.progress import silent

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.plan import Plan
    from dabench_ir.report.model import Report
    from dabench_ir.scaling import ScaleResult
    from dabench_ir.targets import Target
    from dabench_ir.timeline import Timeline

__all__ = [
    "MAX_BATCH",
    "SOURCES",
    "Placed",
    "ResolvedRun",
    "Samples",
    "analysis_passes",
    "analyzed",
    "check_options",
    "execute",
    "is_mlir_file",
    "placed",
    "placement",
    "prepare",
    "resolve",
    "resolve_target",
    "transform_key",
    "transform_passes",
]

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]

SOURCES = ("user", "target", "model", "default", "scenario")
"""Where a knob's value came from: the user, the target's ``[defaults]``, the model, the tool's default,
or a scenario's own rule (serving keeps weights resident: ``--scenario generate`` on a WSE)."""

MAX_BATCH = 1 << 24
"""Most samples one replica may run per step (16,777,216): far above any run on these machines,
and low enough that every rule over the batch (divisors, micro-batches) stays instant."""

# knobs a target's [defaults] table may fill when the user left them open
_TARGET_DEFAULTS = ("precision", "fused_attention")


@dataclass(frozen=True, slots=True)
class Samples:
    """The samples of one step, one concept (see the module docstring).

    ``per_replica``: the graph's batch, the samples one replica runs per step. ``micro_batches``:
    how many parts a replica's step is run in (pipeline micro-batches, gradient accumulation);
    None leaves it to the lowering (a pipeline fills with one micro-batch per sample, WSE weight
    streaming takes the largest micro-batch that fits).
    """

    per_replica: int
    micro_batches: int | None
    source: str

    def __post_init__(self) -> None:
        """A micro-batch holds whole samples: a micro-batch count that does not divide a known batch
        is the user's mistake, wherever it was asked (a flag, a variant the why lines try)."""
        if self.micro_batches and self.per_replica and self.per_replica % self.micro_batches:
            flag = KNOBS["micro_batches"].flag
            raise UserError(
                f"{flag} {self.micro_batches} does not divide the batch {self.per_replica}: a micro-batch holds "
                f"whole samples; give a divisor of {self.per_replica}, or a --batch that is a multiple of "
                f"{self.micro_batches}"
            )

    @property
    def micro_batch(self) -> int | None:
        """Samples in one micro-batch, when the micro-batch count is resolved."""
        return None if self.micro_batches is None else self.per_replica // self.micro_batches

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_replica": self.per_replica,
            "micro_batches": self.micro_batches,
            "micro_batch": self.micro_batch,
            "source": self.source,
        }


@dataclass(frozen=True)
class ResolvedRun:
    """One run, every question answered: what `execute` runs and the report records.

    ``options`` holds every knob at its resolved value (the batch, the precision and the
    micro-batches included); ``sources`` says where each came from. ``internals`` are
    lowering-internal settings a caller fixes (a scenario's steady-state prefill), never knobs.
    """

    model: str | None
    target: Target | None
    options: ScaleOptions
    sources: Mapping[str, str]
    samples: Samples
    linalg: bool = False
    internals: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dims(self) -> dict[str, int]:
        """The symbol bindings the graph is costed with (the batch symbol included)."""
        return dict(self.options.dims)

    @property
    def cost_key(self) -> tuple[Any, ...]:
        """What the costed graph depends on: runs with equal keys share one costed graph."""
        o = self.options
        return (
            tuple(sorted(o.dims.items())),
            self.linalg,
            o.precision,
            o.kv_precision,
            o.fused_attention,
            o.mode,
            o.recompute,
        )

    @property
    def multi_chip(self) -> bool:
        """Whether the run goes through the Level-2 scaling stage: over several chips, or with a
        strategy named (``--chips 1 --strategy tp`` is the scaling stage's one-chip point)."""
        return self.options.chips > 1 or self.options.strategy is not None

    def knob(self, name: str) -> Any:
        return getattr(self.options, name)

    def variant(self, *, source: str = "user", **changes: Any) -> ResolvedRun:
        """This run with ``changes`` applied, from ``source`` (the user's: a knob the why lines or a
        study tries; a scenario's own rule: ``scenario``). The samples follow a changed micro-batch count."""
        options = dataclasses.replace(self.options, **changes)
        samples = self.samples
        if "micro_batches" in changes:
            samples = dataclasses.replace(samples, micro_batches=changes["micro_batches"])
        return dataclasses.replace(
            self, options=options, samples=samples, sources={**self.sources, **dict.fromkeys(changes, source)}
        )

    def to_dict(self, chosen: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every knob with its value and source; ``chosen``: what a lowering decided for a knob left
        at ``auto`` (the WSE mode, the replicas)."""
        knobs: dict[str, Any] = {}
        for f in dataclasses.fields(self.options):
            if f.name not in KNOBS:
                continue
            value = getattr(self.options, f.name)
            entry = {"value": dict(value) if isinstance(value, Mapping) else value, "source": self.sources[f.name]}
            if chosen and f.name in chosen:
                entry["chosen"] = chosen[f.name]
            knobs[f.name] = entry
        return {
            "model": self.model,
            "target": None if self.target is None else self.target.name,
            "samples": self.samples.to_dict(),
            "costed_from": "linalg" if self.linalg else "onnx",
            "knobs": knobs,
        }


# -- resolving ----------------------------------------------------------------------------------


def is_mlir_file(model: Any) -> bool:
    return isinstance(model, (str, os.PathLike)) and Path(model).suffix.lower() == ".mlir"


def _mlir_module_only(graph: Graph, model: Any) -> bool:
    """Whether a linalg run's module keeps the types it was written in: a `.mlir` file, or a graph of
    a module's own ops (an MLIR pipeline's units, written as `.mlir`) not imported at a precision."""
    from dabench_ir.passes import meta

    artifact = graph.meta.get(meta.MLIR_ARTIFACT)
    if artifact is not None:
        return artifact.onnx_model is None and artifact.precision is None
    return is_mlir_file(model)


def _given(options: Any) -> tuple[ScaleOptions, set[str]]:
    """Options as a `ScaleOptions` and the knob names the user set.

    A mapping (the CLI's parsed flags, the API's keyword arguments) says exactly what was given;
    an options object counts every field that differs from its declared default as given.
    """
    if isinstance(options, Mapping):
        try:
            return ScaleOptions(**options), {k for k, v in options.items() if v is not None}
        except TypeError as exc:
            raise UserError(f"options: {exc}") from None
    if options is None:
        return ScaleOptions(), set()
    if not isinstance(options, ScaleOptions):  # a ProfileOptions: the same knobs, no scale fields set
        options = ScaleOptions(**{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
    given = {
        f.name
        for f in dataclasses.fields(options)
        if f.name in KNOBS and getattr(options, f.name) != _declared_default(f)
    }
    return options, given


def _declared_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]


@dataclass(frozen=True)
class HostKind:
    """What the knob checks read of the host ``cpu`` target (its name and kind) before it is calibrated."""

    name: str
    kind: str = "cpu"


def check_target(target: Any) -> None:
    """A bad target name or file fails here, before any work; the host ``cpu`` is always a valid name and
    is calibrated (up to a minute the first time) only once a run's question has been checked."""
    from dabench_ir.targets import is_host

    if not is_host(target):
        resolve_target(target)


def resolve_target(target: Any, threads: int | None = None) -> Target | None:
    """A Target from a name, alias, path or Target (None stays None); ``cpu`` is calibrated with ``threads``."""
    if target is None:
        return None
    from dabench_ir.targets import Target, is_host, load_target

    if isinstance(target, Target):
        return target
    if is_host(target) and threads:
        from dabench_ir.execute.calibrate import cpu_target_path

        return load_target(str(cpu_target_path(threads=threads)))
    return load_target(target)


def check_options(target: Any, options: Mapping[str, Any]) -> None:
    """What `resolve` refuses of ``options`` on ``target`` before a model is read: a knob that cannot
    apply to the target, its size or the mode (`options.check_applies`). For a caller about to start
    many runs (a sweep's points), so that a mistake is said once, up front, not as each run's failure."""
    from dabench_ir.targets import HOST, is_host

    opts, given = _given(options)
    check_applies(opts, given, HostKind(HOST) if is_host(target) else resolve_target(target, opts.threads))


def resolve(
    graph: Graph,
    target: Any = None,
    options: Any = None,
    *,
    model: Any = None,
    internals: Mapping[str, Any] | None = None,
    defaults: bool = True,
) -> ResolvedRun:
    """The one place a run's question is answered: ``options`` (a mapping of what the user gave,
    or an options object) on ``graph`` (loaded, costed or not) and ``target``.

    Resolves the samples of a step from the graph's batch dim and ``--batch``/``--dim``, the
    micro-batches from ``--micro-batch-size``/``--micro-batches``, and what the user left open from the
    target's ``[defaults]`` (``defaults=False``: options taken as they are, for a caller that placed
    them already). A UserError says what cannot be asked (a batch the model fixes otherwise, a
    micro-batch that does not divide it, a knob that cannot apply to the target or the mode).
    """
    from dabench_ir.targets import HOST, is_host

    opts, given = _given(options)
    host = is_host(target)  # calibrated once the question is checked
    tgt = None if host else resolve_target(target, opts.threads)
    sources = {name: ("user" if name in given else "default") for name in KNOBS}
    from dabench_ir.passes import meta

    linalg = opts.via == "mlir" or is_mlir_file(model) or meta.MLIR_ARTIFACT in graph.meta
    mlir_file = linalg and _mlir_module_only(graph, model)

    opts, per_replica, source = _samples(graph, opts)
    changes: dict[str, Any] = {"dims": opts.dims}
    if per_replica is not None:
        changes["batch"] = per_replica
        sources["batch"] = source
    micro_batches = _micro_batches(opts, per_replica)
    if opts.micro_batch is not None:
        changes["micro_batches"] = micro_batches
        sources["micro_batches"] = "user"

    _check_linalg(opts, linalg=linalg, mlir_file=mlir_file)
    if mlir_file and "via" in given and opts.via == "onnx":  # accepted and ignored: the module is costed from linalg
        raise UserError("--via onnx: an MLIR module has no ONNX to cost from; drop --via, or profile the .onnx file")
    trained = meta.graph_mode(graph) == "train"
    check_applies(opts, given, HostKind(HOST) if host else tgt, trained=trained)  # no knob accepted and ignored
    if host:  # measuring the host takes up to a minute the first time: only for a question that can be asked
        tgt = resolve_target(target, opts.threads)

    if tgt is not None and defaults:
        left_open = _target_defaults(tgt, opts, mlir_file=mlir_file)
        changes.update(left_open)
        sources.update(dict.fromkeys(left_open, "target"))
    if opts.precision is None and "precision" not in changes:
        sources["precision"] = "model"
    return ResolvedRun(
        model=str(model) if isinstance(model, (str, os.PathLike)) else None,
        target=tgt,
        options=dataclasses.replace(opts, **changes),
        sources=sources,
        samples=Samples(per_replica=per_replica or 0, micro_batches=micro_batches, source=source),
        linalg=linalg,
        internals=dict(internals or {}),
    )


def _samples(graph: Graph, opts: ScaleOptions) -> tuple[ScaleOptions, int | None, str]:
    """The samples of one replica's step and where they came from (user, model or default): the
    graph's batch dim, bound by ``--batch`` when it is symbolic. Returns the options with the
    sequence and the dims bound (``--seq``, ``--past``, ``--dim``; a static batch named as a dim
    becomes ``--batch``)."""
    dims = dict(opts.dims)
    dim = graph.batch_dim
    if (
        "batch" in dims
        and "batch" not in graph.symbols
        and isinstance(dim, int)
        and opts.batch in (None, dims["batch"])
    ):
        opts = dataclasses.replace(opts, batch=dims.pop("batch"))  # a static batch named as a dim
    per_replica: int | None
    if isinstance(dim, str):
        bound = dims.get(dim, graph.bindings.get(dim))
        if opts.batch is not None and bound is not None and bound != opts.batch:
            raise UserError(f"--batch {opts.batch} and --dim {dim}={bound} disagree; give one of them")
        if opts.batch is not None:
            dims[dim] = opts.batch
        per_replica = opts.batch if opts.batch is not None else bound
        source = "user" if opts.batch is not None or dim in dims else "model"
    elif isinstance(dim, int) and dim > 0:
        if opts.batch is not None and opts.batch != dim:
            raise UserError(
                f"--batch {opts.batch}: the model's batch is fixed at {dim}; export it with --dynamic "
                f"(symbolic batch) or with --batch {opts.batch}"
            )
        per_replica, source = dim, ("user" if opts.batch is not None else "model")
    else:  # no batch dim (a plain matrix, a scalar input first): one sample
        if opts.batch not in (None, 1):
            first = next((n for n in graph.inputs if graph.values[n].type.shape is not None), None)
            what = f"its first input {first!r} is {graph.values[first].type}" if first else "it has no shaped input"
            raise UserError(
                f"--batch {opts.batch}: the model has no batch dimension ({what}); a batch is dim 0 of "
                "token ids or of a [batch, seq, hidden] input, or a symbolic leading dim"
            )
        per_replica, source = 1, "user" if opts.batch is not None else "default"
    _bind_seq_and_derived(graph, _compiled_seq(graph, opts, dims), dims, opts.past)
    if per_replica is not None and per_replica > MAX_BATCH:
        raise UserError(
            f"batch {per_replica:,}: more samples per step than any run takes (at most {MAX_BATCH:,}); "
            "export the model with a smaller batch or bind a smaller --batch"
        )
    return dataclasses.replace(opts, dims=dims), per_replica, source


def _micro_batches(opts: ScaleOptions, per_replica: int | None) -> int | None:
    """The micro-batches of a step: ``--micro-batches``, or the number ``--micro-batch-size`` (the
    samples in flight) makes of the batch."""
    size, count = KNOBS["micro_batch"].flag, KNOBS["micro_batches"].flag
    if opts.micro_batch is None:
        return opts.micro_batches
    if per_replica is None:
        raise UserError(f"{size} {opts.micro_batch}: give --batch (the samples per step) too")
    if per_replica % opts.micro_batch:
        raise UserError(f"{size} {opts.micro_batch} does not divide the batch {per_replica}")
    m = per_replica // opts.micro_batch
    if opts.micro_batches is not None and opts.micro_batches != m:
        raise UserError(
            f"{size} {opts.micro_batch} with batch {per_replica} is {m} micro-batches, "
            f"not {count} {opts.micro_batches}; give one of them"
        )
    return m


def _check_linalg(opts: ScaleOptions, *, linalg: bool, mlir_file: bool) -> None:
    """The precision knobs a linalg run cannot take: a cache dtype of its own, a precision for a
    module that keeps the types it was written in, a quantised import."""
    if linalg and opts.kv_precision is not None:
        raise UserError(
            "--kv-precision with --via mlir: the linalg module is imported at one float precision "
            "(--precision); a cache of its own dtype is a rewrite of ONNX values: drop --via mlir"
        )
    if mlir_file and opts.precision is not None:
        raise UserError(
            f"--precision {opts.precision}: an MLIR module keeps the types it was written in; export it at "
            "that precision (dabench-ir export --dtype), or profile the .onnx file with --via mlir"
        )
    if linalg and opts.precision is not None:
        from dabench_ir.mlir.load import check_import_precision

        check_import_precision(opts.precision)  # the quantised modes: one line, why


def _target_defaults(tgt: Target, opts: ScaleOptions, *, mlir_file: bool) -> dict[str, Any]:
    """What the user left open, from the target's ``[defaults]`` (an MLIR module keeps its types, so
    no default precision for it)."""
    values: dict[str, Any] = {}
    for name in _TARGET_DEFAULTS:
        if getattr(opts, name) is not None or (name == "precision" and mlir_file):
            continue
        value = tgt.default(name)
        if value is not None:
            values[name] = bool(value) if name == "fused_attention" else str(value)
    return values


def _compiled_seq(graph: Graph, opts: Any, dims: Mapping[str, int]) -> int | None:
    """The sequence length the step runs: ``--seq``, or padded to ``--compiled-seq`` (a program compiled
    for static shapes runs its compiled length whatever the input's, `ProfileOptions.compiled_seq`).
    The sample's own length is ``--seq``, else what ``--dim`` or the model binds its sequence to."""
    from dabench_ir.frontends.onnx import seq_symbols

    padded = opts.compiled_seq
    if padded is None:
        return opts.seq
    symbols = seq_symbols(graph)
    bound = {**graph.bindings, **dims}
    own = opts.seq if opts.seq is not None else next((bound[s] for s in symbols if s in bound), None)
    if own is not None and own > padded:
        what = f"--seq {own}" if opts.seq is not None else f"the model's sequence ({own} tokens)"
        raise UserError(
            f"{what} is longer than --compiled-seq {padded}: the program takes at most {padded} tokens; "
            "compile it for more" + ("" if opts.seq is not None else " or give a shorter --seq")
        )
    if not symbols:
        raise UserError(
            f"--compiled-seq {padded} pads the model's symbolic sequence length; this model's is fixed as "
            "exported (export it with a dynamic sequence axis)"
        )
    return padded


def _bind_seq_and_derived(graph: Graph, seq: int | None, dims: dict[str, int], past: int | None = None) -> None:
    """``--seq`` binds the sequence-length symbols and ``--past`` the KV-cache inputs' length; a dim
    written as arithmetic of bound ones (``past_sequence_length + sequence_length``) is valued from
    them (a ``--dim`` that disagrees is refused); then the symbols the graph derives from its inputs'
    (``sequence_length + 1``, ``unk__13``) follow from what is bound (`dabench_ir.frontends.onnx`)."""
    from dabench_ir.frontends.onnx import (
        combined_dims,
        derived_dims,
        dim_parts,
        mask_length_symbols,
        past_symbols,
        seq_symbols,
        unbound_inputs,
    )

    for flag, value, names, what in (
        ("--seq", seq, seq_symbols, "symbolic sequence length"),
        ("--past", past, past_symbols, "KV-cache input with a symbolic length"),
    ):
        if value is None:
            continue
        symbols = names(graph)
        if not symbols:
            raise UserError(
                f"{flag} {value}: the model has no {what} (its symbols: "
                f"{', '.join(sorted(graph.symbols)) or 'none'}); its shape is fixed as exported"
            )
        for name in symbols:
            if dims.get(name, value) != value:
                raise UserError(f"{flag} {value} and --dim {name}={dims[name]} disagree; give one of them")
            dims[name] = value
    if seq is not None and past is not None:  # an attention mask of its own length spans both
        for name in mask_length_symbols(graph):
            if dims.get(name, seq + past) != seq + past:
                raise UserError(
                    f"--dim {name}={dims[name]}: the attention mask spans the cache and the new tokens "
                    f"(--past {past} + --seq {seq} = {seq + past}); drop it"
                )
            dims[name] = seq + past
    cache_lengths = set(past_symbols(graph))
    empty = sorted(n for n, v in dims.items() if v == 0 and n not in cache_lengths)
    if empty:
        raise UserError(
            f"--dim {empty[0]}=0: only a KV cache's length may be 0 (an empty cache: --past 0); "
            "every other dim needs at least 1"
        )
    bound = {**graph.bindings, **dims}
    for name, value in combined_dims(graph, bound).items():
        if bound.get(name, value) != value:
            raise UserError(f"--dim {name}={bound[name]} disagrees with its parts (= {value}); drop it")
        bound[name] = dims[name] = value
    unbound = [s for s in unbound_inputs(graph, bound) if dim_parts(s) is None]  # a sum of symbols follows
    if unbound:
        flag = {**dict.fromkeys(past_symbols(graph), "--past N"), **dict.fromkeys(seq_symbols(graph), "--seq N")}
        if isinstance(graph.batch_dim, str):
            flag[graph.batch_dim] = "--batch N"
        flags = " ".join(dict.fromkeys(flag.get(s, f"--dim {s}=N") for s in unbound))
        raise UserError(
            f"unbound symbolic dims of the model's inputs: {', '.join(unbound)}; bind them with {flags} "
            "(the dims the graph derives from them follow)"
        )
    for name, value in derived_dims(graph, bound).items():
        dims.setdefault(name, value)
    _check_positions(graph, {**graph.bindings, **dims})


_POSITION_TABLE = re.compile(r"wpe|position|pos_emb", re.IGNORECASE)
"""A learned position table by its weight's name: GPT-2's ``wpe`` (HF), ``pos_embed`` (this tool's
exporter), ``position_embeddings`` / ``embed_positions`` (BERT-, OPT-style)."""


def _check_positions(graph: Graph, bound: Mapping[str, int]) -> None:
    """A UserError when a bound sequence indexes past a learned position table: a Gather from a
    position table whose indices span more positions than the table has rows."""
    from dabench_ir.ir import ValueKind

    for node in graph.nodes:
        if node.op_type != "Gather" or len(node.inputs) < 2:
            continue
        table, indices = graph.values.get(node.inputs[0]), graph.values.get(node.inputs[1])
        if table is None or indices is None or table.kind is not ValueKind.WEIGHT:
            continue
        rows = table.type.shape[0] if table.type.shape and len(table.type.shape) == 2 else None
        if not isinstance(rows, int) or not _POSITION_TABLE.search(table.name) or indices.type.shape is None:
            continue
        spans = [bound[d] for d in indices.type.shape if isinstance(d, str) and d in bound]
        if spans and max(spans) > rows:
            raise UserError(
                f"sequence {max(spans):,}: the model's learned position table {table.name} has {rows:,} rows "
                f"(positions): bind --seq to at most {rows:,}"
            )


# -- the passes a run needs ---------------------------------------------------------------------


def analyzed(graph: Graph) -> bool:
    """Whether ``graph`` went through the costing passes (every node has a cost or a reason)."""
    from dabench_ir.passes import meta

    return meta.analyzed_by(graph) is not None


def analysis_passes(
    dims: Mapping[str, int] | None = None, *, linalg: bool = False, precision: str | None = None
) -> list[Any]:
    """The costing passes every run starts with (`prepare`, and the sweep's stamped graphs): the
    standard ONNX passes with ``dims`` bound, or for a linalg module the linalg cost pass, after the
    module is imported at the run's ``precision`` (`dabench_ir.mlir.load.MlirPrecisionPass`: bytes
    follow the module's dtypes, so the precision applies before the count, not after it)."""
    if linalg:
        from dabench_ir.mlir import LinalgCostPass
        from dabench_ir.mlir.load import MlirPrecisionPass

        return [*([MlirPrecisionPass(precision)] if precision is not None else []), LinalgCostPass()]
    from dabench_ir.passes import standard_passes

    return list(standard_passes(dims).passes)


def transform_key(options: Any) -> tuple[Any, ...]:
    """The options the rewrites after costing depend on (`transform_passes`)."""
    return (options.precision, options.kv_precision, bool(options.fused_attention), options.mode, options.recompute)


def transform_passes(options: Any) -> list[Any]:
    """The rewrites the options ask for after costing: precision (then the costs again, since bytes
    follow dtypes, and the weight-only dequantisation), fused attention, the training expansion."""
    passes: list[Any] = []
    if options.precision is not None or options.kv_precision is not None:
        from dabench_ir.passes.passes import CostPass
        from dabench_ir.passes.precision import DequantisePass, PrecisionPass

        passes += [PrecisionPass(options.precision, kv=options.kv_precision), CostPass(), DequantisePass()]
    if options.fused_attention:
        from dabench_ir.passes.training import FusedAttentionPass

        passes.append(FusedAttentionPass())
    if options.mode == "train":
        from dabench_ir.passes.training import TrainingPass

        passes.append(TrainingPass(recompute=options.recompute))
    return passes


@dataclass(frozen=True)
class _CostsOnRetyping:
    """The cost pass after the precision rewrite, on a graph the ONNX cost rules costed before it:
    a node's cost follows its values' types (bytes follow dtypes) and nothing else the rewrite
    writes, so where the rewrite changed no type (a model already at the asked precision: every
    level-1 point) the costs the graph has are what the pass would compute again, and it does not
    (a tenth of such a point's time). ``costed_types``: every value's type when it was costed."""

    costed_types: list[Any]
    name: str = "cost"

    def __call__(self, graph: Graph) -> Any:
        from dabench_ir.passes.base import PassResult
        from dabench_ir.passes.passes import CostPass

        if [v.type for v in graph.values.values()] == self.costed_types:
            return PassResult(graph, False)
        return CostPass()(graph)


def prepare(run: ResolvedRun, graph: Graph) -> Graph:
    """``graph`` (loaded, costed or already rewritten; consumed) through every pass ``run`` needs that
    it has not had: the costing passes, then the rewrites (`transform_passes`)."""
    from dabench_ir.passes import PassManager, meta

    passes = [] if analyzed(graph) else analysis_passes(run.dims, linalg=run.linalg, precision=run.options.precision)
    if analyzed(graph):
        rebound = {k: v for k, v in run.dims.items() if graph.bindings.get(k) != v}
        if rebound:
            raise UserError(f"the graph was costed with {dict(graph.bindings)}; it cannot be rebound to {rebound}")
    key = transform_key(run.options)
    done = meta.graph_find(graph, meta.TRANSFORMED)
    if done is not None and done != key:
        raise RuntimeError(f"graph already rewritten for {done}, asked for {key}: pass a clone of the costed graph")
    if done is None:  # rewrites a caller applied by hand (a TrainingPass run directly) are not applied twice
        applied = {"training"} if meta.graph_mode(graph) == "train" else set()
        if meta.graph_precision(graph) is not None or run.linalg:  # linalg: applied at import (analysis_passes)
            applied |= {"precision", "cost", "dequantise"}
        rewrites = [p for p in transform_passes(run.options) if p.name not in applied]
        if passes and not run.linalg and any(p.name == "cost" for p in rewrites):
            passes = [p for p in passes if p.name != "cost"]  # costed once, after the rewrite retypes the values
        passes += rewrites
        if meta.analyzed_by(graph) == "onnx" and not applied:  # costed by the ONNX rules, not rewritten since
            costed_types = [v.type for v in graph.values.values()]
            passes = [_CostsOnRetyping(costed_types) if p.name == "cost" else p for p in passes]
    graph = PassManager(passes)(graph).graph
    meta.graph_set(graph, meta.TRANSFORMED, key)
    return graph


# -- executing ----------------------------------------------------------------------------------


def execute(run: ResolvedRun, graph: Graph, *, progress: Progress | None = None) -> Report:
    """The Report of ``run`` on ``graph`` (loaded or costed; consumed: passes rewrite it in place,
    so a caller that keeps it passes ``graph.clone()``).

    Costing passes, the precision and training rewrites, the host's node benchmarks (``cpu``),
    the measurement (``--measure``), placement on one chip or scaling over several, the report.
    """
    say = progress or silent
    opts = run.options
    run, graph = _prepared(run, graph, say)
    tgt = run.target
    measurement = None
    if opts.measure:
        measurement = _measure(run, graph, say)
    from dabench_ir.report.build import build_report

    if tgt is None:
        timeline = measurement.timeline if measurement is not None else None
        return build_report(graph, run=run, timeline=timeline, measurement=measurement)
    if run.multi_chip:  # a scaling run (each point of `scale` too): verified alike
        return _scaled(run, graph, say).report()
    from dabench_ir.place import place

    say(f"placing on {tgt.name}")
    plan, timeline, metrics = place(graph, tgt, lowering_options(run))
    report = build_report(graph, run=run, plan=plan, timeline=timeline, metrics=metrics, measurement=measurement)
    return _verified(run, report)


@dataclass(slots=True)
class Placed:
    """A run placed and emulated, its report not built yet: what a caller that keeps only the step
    reads (a why line's variant run keeps its `StepTimes` and whether it fits), with the report on
    demand (`report`). On a 1,000-layer model the report and its verification are a third of a
    run; a caller that drops them does not pay for them.

    The step is checked when placed (`dabench_ir.verify.check_step`; over several chips, every
    scaling point's speedup and one-chip step, `dabench_ir.verify.check_scaled`); the report, when
    built, is verified whole as `execute`'s is. A multi-chip run keeps the scaling stage's points
    (``scaled``, the last is the run's) and one chip's placement (``plan``, ``timeline``).
    ``shared``: ``graph`` is another report's (a variant placed on it), so the report built from
    it works on a clone."""

    run: ResolvedRun
    graph: Graph
    plan: Plan
    timeline: Timeline
    scaled: ScaleResult | None = None
    shared: bool = False
    built: Report | None = None

    @property
    def fits(self) -> bool:
        """Whether the run fits: its plan's verdict, or over several chips its scaling point's."""
        return bool(self.scaled.points[-1].fits if self.scaled is not None else self.plan.fits)

    def one_chip(self) -> Placed | None:
        """A run over several chips: its one-chip baseline, the placement of its graph its speedup is
        over, for the run over another chip count on that graph to take (`placed`'s ``baseline``)."""
        if self.scaled is None:
            return None
        first = self.scaled.points[0].chip  # the scaling points include one chip, first
        if first is None:
            return None
        return Placed(run=first.run, graph=first.graph, plan=first.plan, timeline=first.timeline)

    def report(self) -> Report:
        """The run's verified `Report`, as `execute` gives it: built on the first call."""
        if self.built is None:
            from dabench_ir.metrics import compute_metrics
            from dabench_ir.report.build import build_report, build_scaled_report

            graph = self.graph.clone() if self.shared else self.graph
            if self.scaled is not None:
                report = build_scaled_report(graph, run=self.run, result=self.scaled)
            else:
                metrics = compute_metrics(graph, self.plan, self.timeline, self.run.target)
                report = build_report(graph, run=self.run, plan=self.plan, timeline=self.timeline, metrics=metrics)
            self.built = _verified(self.run, report)
        return self.built


def placed(
    run: ResolvedRun,
    graph: Graph,
    *,
    progress: Progress | None = None,
    context: LoweringContext | None = None,
    shared: bool = False,
    baseline: Placed | None = None,
) -> Placed:
    """``run`` placed and emulated on ``graph`` (consumed unless ``shared``: another report's graph,
    which placing writes nothing to), as `execute` places it, without building its report:
    `Placed`. A run that measures is refused (its figures are the measurement's). ``context``: the
    lowering context of ``graph`` as prepared, for a caller placing it several times
    (`dabench_ir.lowering.Lowering.lower`). ``baseline``: for a run over several chips, the
    one-chip placement of ``graph`` the caller holds (`dabench_ir.scaling.scale`)."""
    if run.target is None:
        raise UserError("a placement needs a target; give --target")
    if run.options.measure:
        raise ValueError("a measured run is answered by execute(), not placed()")
    say = progress or silent
    run, graph = _prepared(run, graph, say)
    if run.multi_chip:
        return _scaled(run, graph, say, shared=shared, baseline=baseline)
    from dabench_ir.emulate import emulate
    from dabench_ir.lowering import lower
    from dabench_ir.verify import check_step

    say(f"placing on {run.target.name}")
    plan = lower(graph, run.target, lowering_options(run), context=context)
    timeline = emulate(plan, graph)
    if not run.options.no_verify:
        check_step(graph, run.target, plan, timeline)
    return Placed(run=run, graph=graph, plan=plan, timeline=timeline, shared=shared)


def placement(run: ResolvedRun, graph: Graph, *, progress: Progress | None = None) -> Plan:
    """The placement of ``run`` on its target alone, without emulation or a report: what a fit check
    reads (`Plan.fits`, `Plan.failure`). ``graph`` is prepared as `execute` prepares it, and consumed.
    One chip's: a run over several chips fits by its scaling point (`placed`), not by one plan."""
    from dabench_ir.lowering import lower

    say = progress or silent
    if run.target is None:
        raise UserError("a placement needs a target; give --target")
    if run.multi_chip:
        raise ValueError(f"placement() places one chip; a run over {run.options.chips} chips fits by placed()")
    run, graph = _prepared(run, graph, say)
    say(f"placing on {run.target.name}")
    return lower(graph, run.target, lowering_options(run))


def _prepared(run: ResolvedRun, graph: Graph, say: Progress) -> tuple[ResolvedRun, Graph]:
    """``graph`` costed and rewritten for ``run`` (`prepare`), and the run with its target ready: the
    host CPU's node benchmarks taken for a model file (``cpu``: its node table)."""
    say("costing the graph")
    graph = prepare(run, graph)
    tgt = run.target
    if tgt is not None and tgt.kind == "cpu" and run.model is not None and not is_mlir_file(run.model):
        from dabench_ir.execute.microbench import ensure_for_target

        tgt = ensure_for_target(run.model, graph, tgt, threads=run.options.threads, say=say)
        run = dataclasses.replace(run, target=tgt)
    return run, graph


def _verified(run: ResolvedRun, report: Report) -> Report:
    """``report`` after the physics verifier (`dabench_ir.verify.check`): a figure no machine can give
    is an internal error naming the node, the invariant and the two numbers, never a printed figure."""
    if run.options.no_verify:
        report.extra["verified"] = False  # said in the report: its figures were not checked
        return report
    from dabench_ir.verify import check

    return check(report)


def lowering_options(run: ResolvedRun) -> Any:
    """The run's options as its target's lowering reads them, with the run's internals."""
    from dabench_ir.lowering import lowering_for

    return lowering_for(run.target).options(run.options, **run.internals)


def _measure(run: ResolvedRun, graph: Graph, say: Progress) -> Any:
    from dabench_ir.execute import measure, measure_provider

    if run.model is None and graph.path is None:
        raise UserError("--measure runs a model file in onnxruntime; give the .onnx path")
    if run.linalg and is_mlir_file(run.model):
        raise UserError("--measure runs ONNX models in onnxruntime; give the .onnx file")
    o = run.options
    say("measuring in onnxruntime")
    tgt = run.target
    return measure(
        run.model or graph.path,
        graph,
        dims=dict(graph.bindings),
        warmup=o.warmup,
        repeat=o.repeat,
        threads=o.threads,
        ort_opt=o.ort_opt,
        max_weight_bytes=o.max_weight_bytes,
        provider=measure_provider(tgt.kind if tgt is not None else None, tgt.name if tgt is not None else ""),
        target=tgt if tgt is not None and tgt.kind == "cpu" else None,
    )


def _scaled(
    run: ResolvedRun, graph: Graph, say: Progress, *, shared: bool = False, baseline: Placed | None = None
) -> Placed:
    """A multi-chip run (``graph`` prepared) through the Level-2 scaling stage: `Placed` on the
    scaling point of its chips, one chip's placement for the nodes of its report."""
    from dabench_ir.scaling import scale

    o = run.options
    if o.strategy is None:
        raise UserError(f"--chips {o.chips} needs --strategy dp, tp or pp")
    say(f"scaling over {o.chips} chip{'s' if o.chips > 1 else ''} ({o.strategy})")
    result = scale(graph, run.target, sorted({1, o.chips}), o.strategy, run, baseline=baseline)
    if not o.no_verify:
        from dabench_ir.verify import check_scaled

        check_scaled(result)  # every point, before any report is built of it (a fit's may never be)
    chip = result.points[-1].chip
    return Placed(run=run, graph=graph, plan=chip.plan, timeline=chip.timeline, scaled=result, shared=shared)
