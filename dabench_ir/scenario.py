"""Generation scenarios: prefill once, then decode token by token, on one target.

`generate` answers the first questions about serving a model: time to first token (the
prefill of a batch of equal prompts), time per output token as the KV cache grows, tokens/s
per user and in total, how big the cache gets and whether weights plus cache fit, and where
each lives on the target. It composes the existing pipeline and adds no cost model of its
own: each phase is a graph (`dabench-ir export`, prefill and ``--phase decode``), run through
`dabench_ir.run.execute` (costed, placed, reported and verified), exactly as `profile` runs it.

Decode steps depend on each other (token t+1 needs token t), so a step's time is its
latency: where a lowering can overlap consecutive steps in a steady-state pipeline, the
scenario asks it not to (``steady_state=False``: fill and drain counted). A prefill is one
step too: its first token comes once the prompt has left the pipeline (on the WSE, whose
regions pass each token row on as they make it, the chain's fill and the batch's periods). On a WSE left at
``--wse-mode auto`` each phase is placed pipelined (weights resident in SRAM) when that fits,
else weight-streamed: the WSE lowering's rule for any serving graph.

The cache grows by one token per step, and a step's time is linear in its context length
(the cache bytes read and the attention FLOPs are), so the decode graph is placed at a few
context lengths (`DEFAULT_SAMPLES`, both ends included) and the time of every step in
between is linearly interpolated; the result says so. One dynamic export per phase stands
for every length: `bind_dims` binds batch, prompt and context before costing.

MODEL is a preset name (``llama-7b``), a file written by ``dabench-ir export`` (its
``dabench.params`` give the shape; both phases are exported from it, weight-free, which
needs torch), ``PREFILL.onnx,DECODE.onnx``: a prefill and a decode export made with
``--dynamic`` (no torch needed), or any decoder ONNX file with a symbolic sequence length
(a Hugging Face export, with or without its cache): the file is both phases, bound through the
run's own ``--seq`` and ``--past`` (`DECODE_GRAPHS`). A file with KV-cache inputs is its own
decode step (one new token over ``--past`` cached ones; its prefill: the prompt over an empty
cache); one without has no cache to read, so each decode step runs the whole sequence again,
as generating with that file would. The result says which (``decode_graph``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.options import KNOBS, ProfileOptions, check_applies
from dabench_ir.passes.meta import MODEL_PARAMS, MODEL_PHASE, MODEL_WEIGHTS
from dabench_ir.progress import silent
from dabench_ir.report.table import human, percent, render_breakdown, seconds

if TYPE_CHECKING:
    import onnx

    from dabench_ir.models.config import ModelConfig
    from dabench_ir.plan import Plan
    from dabench_ir.report.model import Report
    from dabench_ir.run import Progress
    from dabench_ir.targets import Target

__all__ = [
    "DECODE_GRAPHS",
    "DEFAULT_SAMPLES",
    "KV_CACHE_POOL_FRACTION",
    "SCHEMA",
    "SERVING_STRATEGY",
    "Breakdown",
    "GenerateResult",
    "KvPool",
    "PhaseRun",
    "Wave",
    "generate",
    "kv_pool",
    "render_generate",
    "run_phase",
    "run_scenario",
    "sample_contexts",
]

logger = logging.getLogger(__name__)

SCHEMA = "dabench-ir/scenario/generate/v1"
SERVING_STRATEGY = "tp"
"""How the scenario shares a model over ``--chips N`` when no ``--strategy`` is given: tensor parallel
(Megatron-style heads and MLP columns split), as the serving engines shard a model within a node."""
DEFAULT_SAMPLES = 4
"""Context lengths the decode graph is placed at (the first and last step included)."""
KV_CACHE_POOL_FRACTION = "kv_cache_pool_fraction"
"""The ``[arch]`` share of the free device memory a paged serving engine takes for its cache pool (`kv_pool`)."""


DECODE_GRAPHS = {
    "export": "the tool's decode export: one new token over the cached context",
    "kv-cache": "the file's own KV-cache inputs: one new token over the cached context (--past)",
    "recompute": "the file has no KV-cache input: each step runs the whole sequence again (context + 1 tokens)",
}
"""How the scenario's decode steps are made (`GenerateResult.decode_graph`), by the model it was given."""


@dataclass
class PhaseRun:
    """One placed graph of the scenario: the prefill, or the decode step at one context length."""

    phase: str
    context: int  # tokens already in the cache (0 for the prefill)
    time_s: float
    fits: bool
    failure: str | None
    # one chip's (over several: a tensor-parallel share, a pipeline stage's, a replica's)
    weight_bytes: int
    kv_cache_bytes: int  # the cache the step reads (decode) or writes (prefill), all of the chip's requests
    memory_bytes: dict[str, int]
    homes: dict[str, str]
    report: Report | None = field(default=None, repr=False)

    def to_dict(self, *, nodes: bool = False) -> dict[str, Any]:
        out = {
            "phase": self.phase,
            "context": self.context,
            "time_s": self.time_s,
            "fits": self.fits,
            "failure": self.failure,
            "weight_bytes": self.weight_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "memory_bytes": dict(self.memory_bytes),
            "homes": dict(self.homes),
        }
        if nodes and self.report is not None:
            out["report"] = self.report.to_dict()
        return out


@dataclass(frozen=True)
class KvPool:
    """A paged serving engine's KV-cache pool on each chip (``--kv-cache paged``): ``fraction`` of what
    ``memory`` holds beyond the weights and a decode step's other tensors (``free_bytes``), in which a request
    is admitted only when its whole cache (``request_bytes``: prompt plus generated tokens) fits."""

    memory: str
    fraction: float
    free_bytes: int
    request_bytes: int
    admitted: int  # requests in flight at once on each replica (0: not even one)

    @property
    def pool_bytes(self) -> int:
        return int(self.fraction * self.free_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "pool_bytes": self.pool_bytes}


@dataclass(frozen=True)
class Wave:
    """Requests the pool admits together, served one wave after the other (`GenerateResult.waves`)."""

    requests: int
    latency_s: float  # its prefill and every decode step
    fits: bool


@dataclass
class GenerateResult:
    """A generation scenario's answer (see the module docstring); times in seconds."""

    model: dict[str, Any]
    target: str
    prompt: int
    gen: int
    batch: int
    precision: str
    kv_precision: str
    prefill: PhaseRun
    decode: list[PhaseRun]  # the sampled context lengths, ascending
    decode_total_s: float  # all gen−1 decode steps, interpolated between the samples
    interpolated: bool
    chips: int = 1
    strategy: str | None = None  # how the chips share the model (tp, pp, dp) when chips > 1
    decode_graph: str = "export"  # a DECODE_GRAPHS key
    compiled_seq: int | None = None  # static shapes: every step runs this window (`--compiled-seq`)
    pool: KvPool | None = None  # a paged cache's pool (`kv_pool`; None: a static cache)
    waves: list[Wave] = field(default_factory=list)  # the batch served in turn, when the pool holds part of it

    @property
    def kv_cache(self) -> str:
        """How the engine holds the cache (`--kv-cache`): paged when it has a pool."""
        return "static" if self.pool is None else "paged"

    @property
    def ttft_s(self) -> float:
        """Time to first token: the prefill of the whole batch (of its first wave, when it runs in waves)."""
        return self.prefill.time_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None when gen is 1; the first wave's in waves)."""
        return self.decode_total_s / (self.gen - 1) if self.gen > 1 else None

    @property
    def latency_s(self) -> float:
        """End-to-end time of the batch: prefill plus every decode step, of every wave in turn."""
        if self.waves:
            return sum(w.latency_s for w in self.waves)
        return self.ttft_s + self.decode_total_s

    @property
    def replicas(self) -> int:
        """Copies of the model serving requests side by side: the chips of a data-parallel run (each
        serves ``batch`` requests: ``--batch`` is a replica's), else one over all its chips."""
        return self.chips if self.strategy == "dp" else 1

    @property
    def in_flight(self) -> int:
        """Requests decoded together on every replica: the batch, or in waves the first wave's (the
        steps `decode` holds), times the replicas."""
        return (self.waves[0].requests if self.waves else self.batch) * self.replicas

    @property
    def interpolation_check(self) -> float | None:
        """How far the linear interpolation is from the steps it stands for, measured at the steps
        placed: the largest relative distance of an inner sampled step from the line through its
        two neighbours (what interpolating without it would have given). None when every step was
        placed, or fewer than three were. Step time is linear in the context where the cache bytes
        and attention FLOPs are what grows; a lowering whose tiling changes with the context (an
        IPU's tiles an op spreads over) makes it a sawtooth, which this figure shows."""
        if not self.interpolated or len(self.decode) < 3:
            return None
        points = [(d.context, d.time_s) for d in self.decode]
        return max(
            abs(_interp([before, after], x) - y) / y
            for before, (x, y), after in zip(points, points[1:], points[2:], strict=False)
            if y > 0
        )

    @property
    def tokens_per_s_per_user(self) -> float | None:
        """Generated tokens over the end-to-end latency, for one request (in waves, the last one's);
        None when the run does not fit (`fits`): a configuration that does not fit has no throughput."""
        if not self.fits:
            return None
        return self.gen / self.latency_s if self.latency_s > 0 else math.inf

    @property
    def tokens_per_s_total(self) -> float | None:
        """Every request's generated tokens over the end-to-end latency (every wave's, in waves; every
        replica's); None when the run does not fit."""
        rate = self.tokens_per_s_per_user
        return None if rate is None else rate * self.batch * self.replicas

    @property
    def decode_tokens_per_s_per_user(self) -> float | None:
        """Decode rate of one request: 1 / mean time per output token; None when gen is 1 or the run
        does not fit."""
        tpot = self.tpot_s
        return 1.0 / tpot if tpot and self.fits else None

    @property
    def decode_tokens_per_s_total(self) -> float | None:
        """Tokens a decode step makes per second: the requests decoded together over its mean time."""
        rate = self.decode_tokens_per_s_per_user
        return None if rate is None else rate * self.in_flight

    @property
    def fits(self) -> bool:
        steps = self.prefill.fits and all(d.fits for d in self.decode)
        return steps and all(w.fits for w in self.waves) and (self.pool is None or self.pool.admitted > 0)

    def tpot_at(self, context: int) -> float:
        """Time of the decode step that reads ``context`` cached tokens (linear between samples)."""
        return _interp([(d.context, d.time_s) for d in self.decode], context)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "target": self.target,
            "prompt": self.prompt,
            "gen": self.gen,
            "batch": self.batch,
            "precision": self.precision,
            "kv_precision": self.kv_precision,
            "chips": self.chips,
            "strategy": self.strategy,
            "ttft_s": self.ttft_s,
            "tpot_mean_s": self.tpot_s,
            "decode_total_s": self.decode_total_s,
            "latency_s": self.latency_s,
            "tokens_per_s_per_user": self.tokens_per_s_per_user,
            "tokens_per_s_total": self.tokens_per_s_total,
            "decode_tokens_per_s_per_user": self.decode_tokens_per_s_per_user,
            "decode_tokens_per_s_total": self.decode_tokens_per_s_total,
            "in_flight": self.in_flight,
            "tpot_interpolation": "linear in context between the sampled steps" if self.interpolated else "exact",
            "tpot_interpolation_check": self.interpolation_check,
            "decode_graph": self.decode_graph,
            "decode_graph_rule": DECODE_GRAPHS[self.decode_graph],
            "compiled_seq": self.compiled_seq,
            "kv_cache": self.kv_cache,
            "kv_pool": None if self.pool is None else self.pool.to_dict(),
            "waves": [dataclasses.asdict(w) for w in self.waves],
            "fits": self.fits,
            "prefill": self.prefill.to_dict(nodes=True),
            "decode": [d.to_dict(nodes=i == len(self.decode) - 1) for i, d in enumerate(self.decode)],
        }

    def write_json(self, path: str | Path) -> Path:
        from dabench_ir.fileio import write_output

        return write_output(path, json.dumps(self.to_dict(), indent=1, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if hasattr(obj, "value"):
        return obj.value
    return str(obj)


def _interp(points: list[tuple[int, float]], x: int) -> float:
    if len(points) == 1:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1 or (x1, y1) == points[-1]:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def sample_contexts(prompt: int, gen: int, samples: int = DEFAULT_SAMPLES) -> list[int]:
    """Context lengths of the decode steps placed: evenly spaced over prompt … prompt+gen−2
    (the cache each of the gen−1 decode steps reads), both ends included."""
    first, last = prompt, prompt + gen - 2
    if gen < 2:
        return []
    n = max(1, min(samples, last - first + 1))
    if n == 1:
        return [first]
    return sorted({round(first + (last - first) * i / (n - 1)) for i in range(n)})


# ---- the graphs ------------------------------------------------------------------------------
def _model_config(model: Any) -> ModelConfig:
    """The shape of ``model``: a ModelConfig, a preset name or a dabench-ir export."""
    from dabench_ir.models import PRESETS, ModelConfig, get_preset

    if isinstance(model, ModelConfig):
        return model.replace(phase="prefill", context=0)
    text = str(model)
    if text in PRESETS:
        return get_preset(text, dtype="fp16")  # served in 16 bits; --precision rewrites
    path = Path(text)
    if not path.is_file():
        raise UserError(
            f"{text}: not a preset (see `dabench-ir export --list-presets`) nor a file; --scenario generate "
            "takes a preset, a dabench-ir export, or PREFILL.onnx,DECODE.onnx"
        )
    params = _metadata(_load(path)).get(MODEL_PARAMS)
    if not params:
        raise UserError(f"{text} has no dabench.params metadata: give a preset or a file made by dabench-ir export")
    return ModelConfig.from_params(params).replace(phase="prefill", context=0)


def _load(path: Path) -> onnx.ModelProto:
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise UserError(f"cannot read {path} as ONNX: {exc}") from None


def _metadata(proto: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in proto.metadata_props}


def _export_pair(cfg: ModelConfig, prompt: int, gen: int, say: Progress) -> tuple[Any, Any]:
    """Dynamic, weight-free prefill and decode exports of ``cfg`` (one block each, stamped), exported
    once per configuration and prompt length and kept in the preset cache (`cached_export`)."""
    from dabench_ir.models.presets import cached_export

    if cfg.positional == "learned" and prompt + gen > (cfg.max_positions or 0):
        raise UserError(f"--prompt {prompt} + --gen {gen} exceeds the model's {cfg.max_positions} learned positions")
    base = cfg.replace(batch=1, seq=max(prompt, 2))
    say("the prefill graph (one block exported, stamped; cached)")
    what = "--scenario generate (or give PREFILL.onnx,DECODE.onnx made with --dynamic)"
    # a serving engine's prefill projects only the last position through the LM head (`LOGITS`)
    prefill = _load(cached_export(base.replace(logits="last") if base.vocab else base, what=what))
    say("the decode graph (one block exported, stamped; cached)")
    decode = _load(cached_export(base.replace(phase="decode", context=max(prompt, 2), seq=1), what=what))
    return prefill, decode


@dataclass(frozen=True)
class _OwnFile:
    """A user's decoder file (no ``dabench.params``) as both phases of the scenario, each step bound
    through the run's ``--seq`` and ``--past`` (`dabench_ir.run.resolve` owns the binding)."""

    proto: onnx.ModelProto
    name: str
    layers: int
    cache: bool  # it has KV-cache inputs with a symbolic length
    batch: int | None  # the batch the file fixes (`Graph.batch_dim`, as `resolve` reads it), None when symbolic

    @property
    def decode_graph(self) -> str:
        return "kv-cache" if self.cache else "recompute"

    def step(self, phase: str, length: int) -> dict[str, int | None]:
        """The run's ``seq`` and ``past`` for the prefill of ``length`` prompt tokens, or the decode
        step that reads ``length`` cached ones (`DECODE_GRAPHS`)."""
        if phase == "prefill":
            return {"seq": length, "past": 0 if self.cache else None}
        return {"seq": 1, "past": length} if self.cache else {"seq": length + 1, "past": None}


def _own_file(model: Any) -> _OwnFile | None:
    """``model`` as a user's decoder file, or None for a preset, a config or a dabench-ir export."""
    from dabench_ir.frontends.onnx import past_symbols, seq_symbols
    from dabench_ir.models import PRESETS
    from dabench_ir.pipeline import load_graph

    if not isinstance(model, (str, Path)) or str(model) in PRESETS or not Path(model).is_file():
        return None
    path = Path(model)
    proto = _load(path)
    if _metadata(proto).get(MODEL_PARAMS):
        return None
    graph = load_graph(proto)
    if not seq_symbols(graph):
        raise UserError(
            f"{path}: its sequence length is fixed as exported (symbols: {', '.join(sorted(graph.symbols)) or 'none'}); "
            "--scenario generate binds the prompt and each step's length: export it with a dynamic sequence axis"
        )
    fixed = graph.batch_dim if isinstance(graph.batch_dim, int) else None
    return _OwnFile(proto=proto, name=path.name, layers=len(graph.layers), cache=bool(past_symbols(graph)), batch=fixed)


def _given_pair(text: str) -> tuple[Any, Any]:
    paths = [Path(p.strip()) for p in text.split(",")]
    if len(paths) != 2:
        raise UserError(f"{text}: expected PREFILL.onnx,DECODE.onnx")
    protos = []
    for path, phase in zip(paths, ("prefill", "decode"), strict=True):
        if not path.is_file():
            raise UserError(f"{path} does not exist")
        proto = _load(path)
        meta = _metadata(proto)
        if meta.get(MODEL_PHASE, "prefill") != phase:
            raise UserError(f"{path} is not a {phase} export (dabench-ir export --phase {phase} --dynamic)")
        if not json.loads(meta.get(MODEL_PARAMS, "{}")).get("dynamic"):
            raise UserError(f"{path} has fixed shapes: export it with --dynamic so prompt and context can be bound")
        protos.append(proto)
    return protos[0], protos[1]


# ---- placing one phase -----------------------------------------------------------------------
def _read_bytes(graph: Any, nodes: list[str], values: set[str]) -> int:
    """Bytes of the distinct ``values`` the ``nodes`` (names) read."""
    read = {v for name in nodes for v in graph.node(name).inputs if v in values}
    return sum(graph.type_of(v).nbytes() for v in read)


def _homes(plan: Plan, target: Target) -> dict[str, str]:
    """Where the weights and the KV cache live on ``target``, as the plan holds them.

    A lowering may say so in ``plan.stats`` (`PlanStats.weights_home`, ``kv_cache_home``).
    Otherwise: weights are streamed from an off-chip memory when the plan keeps them there
    (WSE weight streaming, RDU DDR) and resident in the on-chip memory when it holds none;
    the cache lives with the activations, in the memory that feeds the units (`Target.feed_memory`).
    """
    given = {"weights": plan.stats.weights_home, "kv_cache": plan.stats.kv_cache_home}
    if any(v is not None for v in given.values()):
        return {k: v for k, v in given.items() if v is not None}
    # "sram:ipu0" is a share of "sram"; a memory the plan holds nothing in is no home
    names = dict.fromkeys(name.split(":")[0] for name, held in plan.memory_bytes.items() if held > 0)
    held = [target.memory(name) for name in names if target.has_memory(name)]
    off = [m for m in held if m.level == "off-chip"]
    feed = target.feed_memory
    if off:
        weights = f"{off[0].name} ({'streamed per step' if off[0] is not feed else 'read every step'})"
    else:
        on = held[0] if held else feed
        weights = f"{on.name} (resident)"
    return {"weights": weights, "kv_cache": f"{feed.name} ({feed.level})"}


def run_phase(
    proto: Any, dims: dict[str, int], phase: str, target: Target, opts: ProfileOptions, *, context: int | None = None
) -> PhaseRun:
    """One phase's graph bound to ``dims`` (batch, seq or context; a user's file: by ``opts``' seq and
    past), costed and placed: one run (`dabench_ir.run`), one chip or, with ``opts.chips`` > 1
    (``--strategy``, default `SERVING_STRATEGY`), many; the per-node
    report is then one chip's. ``context``: the cached tokens the step reads (default: ``dims``').
    Each phase is one step alone, no step overlapping it (``steady_state=False``).
    """
    from dabench_ir.lowering import lowering_for
    from dabench_ir.models.export import bind_dims
    from dabench_ir.passes.precision import cache_inputs
    from dabench_ir.pipeline import load_graph
    from dabench_ir.run import execute, resolve

    if getattr(opts, "chips", 1) > 1 and opts.strategy is None:
        opts = dataclasses.replace(opts, strategy=SERVING_STRATEGY)
    lowering = lowering_for(target)
    has_option = "steady_state" in {f.name for f in dataclasses.fields(lowering.Options)}
    graph = load_graph(bind_dims(proto, dims))
    run = resolve(graph, target, opts, internals={"steady_state": False} if has_option else None)
    report = execute(run, graph)  # one dependent step (no overlap with the next)
    graph, plan = report.graph, report.plan
    failure = report.failure["reason"] if report.failure else None
    kv_bytes = sum(graph.type_of(n).nbytes() for n in cache_inputs(graph)) if phase == "decode" else 0
    declared = json.loads(graph.metadata.get(MODEL_WEIGHTS, "[]") or "[]")  # the model's parameters
    names = [n for n in declared if n in graph.values] or [v.name for v in graph.weights()]
    weights = sum(graph.type_of(n).nbytes() for n in names)
    memory_bytes = {k: int(v) for k, v in plan.memory_bytes.items()}
    held = report.scaling.points[-1].memory_per_device if report.scaling is not None else None
    if held and "weights" in held:  # by kind: what one chip holds (a pipeline stage's share, a replica)
        weights, kv_bytes = held["weights"], held.get("kv_cache", 0)  # a prefill reads no cache
        memory_bytes = {target.feed_memory.name: sum(v for k, v in held.items() if k != "host")}
    elif held and plan.units:  # by memory, each device's (an IPU of a pipeline): the most one device reads
        stored = set(names)
        weights = max(_read_bytes(graph, u.nodes, stored) for u in plan.units)
        if phase == "decode":
            caches = set(cache_inputs(graph))
            kv_bytes = max(_read_bytes(graph, u.nodes, caches) for u in plan.units)
    return PhaseRun(
        phase=phase,
        context=dims.get("context", 0) if context is None else context,
        time_s=report.totals["time_s"],
        fits=bool(report.fits),
        failure=failure,
        weight_bytes=weights,
        kv_cache_bytes=kv_bytes,
        memory_bytes=memory_bytes,
        homes=_homes(plan, target),
        report=report,
    )


def generate(
    model: Any,
    target: Any,
    opts: ProfileOptions | None = None,
    *,
    prompt: int,
    gen: int,
    samples: int = DEFAULT_SAMPLES,
    progress: Progress | None = None,
) -> GenerateResult:
    """The generation scenario of ``model`` on ``target``: B = ``opts.batch`` (default 1)
    equal requests of ``prompt`` tokens, each generating ``gen`` tokens.

    ``model``: a preset name, a `ModelConfig`, a dabench-ir export, or a
    ``(prefill, decode)`` pair of dynamic exports (paths or ModelProtos).
    """
    from dabench_ir.run import resolve_target

    opts = opts or ProfileOptions()
    say = progress or silent
    for name, value in (("--prompt", prompt), ("--gen", gen)):
        if not isinstance(value, int) or value < 1:
            raise UserError(f"--scenario generate needs {name} N (a positive integer)")
    for name in ("seq", "past"):  # each step's own: the prompt, then the context (`_OwnFile.step`)
        if getattr(opts, name, None) is not None:
            raise UserError(f"--{name} is set per step by --prompt and --gen with --scenario generate; drop it")
    if opts.mode != "inference":  # each step would carry a backward and an optimizer update
        raise UserError("--scenario generate serves requests (inference): drop --mode train")
    if opts.replicas not in (None, 1):  # its rates are of --batch requests: copies would serve others unseen
        raise UserError(
            f"--replicas {opts.replicas}: --scenario generate serves --batch requests on one copy of the model; "
            "serve more requests with --batch, or more chips with --chips N --strategy dp"
        )
    tgt = resolve_target(target, opts.threads)
    own = None
    if isinstance(model, tuple):
        prefill_proto, decode_proto = (_load(Path(m)) if not hasattr(m, "graph") else m for m in model)
    elif isinstance(model, str) and "," in model:
        prefill_proto, decode_proto = _given_pair(model)
    elif (own := _own_file(model)) is not None:
        prefill_proto = decode_proto = own.proto
    else:
        cfg = _model_config(model)
        prefill_proto, decode_proto = _export_pair(cfg, prompt, gen, say)
    params = json.loads(_metadata(decode_proto).get(MODEL_PARAMS, "{}"))
    batch = opts.batch or (own.batch if own is not None and own.batch else 1)  # a user's file may fix it
    chips = getattr(opts, "chips", 1)
    if opts.kv_cache != KNOBS["kv_cache"].default:  # a knob of the engine a GPU serves with: check it applies
        check_applies(dataclasses.replace(opts, scenario="generate"), {"kv_cache"}, tgt)
        if gen < 2:
            raise UserError(f"--kv-cache {opts.kv_cache}: --gen 1 has no decode step, no cache to hold; drop it")

    compiled = _static_window(opts, tgt, prompt, gen)
    # applied below, per step (the window) or over the batch (the engine's cache pool)
    run_opts = dataclasses.replace(
        opts, scenario=None, prompt=None, gen=None, compiled_seq=None, kv_cache=KNOBS["kv_cache"].default
    )
    model_info = {
        k: params.get(k) for k in ("family", "preset", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "dtype")
    }
    if own is not None:
        model_info.update(file=own.name, layers=own.layers)

    def served(requests: int) -> GenerateResult:
        """``requests`` served at once: their prefill, then their decode steps."""
        batch_opts = dataclasses.replace(run_opts, batch=requests)

        def step(phase: str, length: int, proto: Any, phase_opts: ProfileOptions) -> PhaseRun:
            """The prefill of ``length`` prompt tokens, or the decode step reading ``length`` cached ones;
            with static shapes, the compiled window's (the prompt padded to it, the cache one short of it)."""
            context = 0 if phase == "prefill" else length
            if compiled is not None:
                length = compiled if phase == "prefill" else compiled - 1
            if own is None:
                dims = {"batch": requests, "seq" if phase == "prefill" else "context": length}
                return run_phase(proto, dims, phase, tgt, phase_opts, context=context)
            bound = dataclasses.replace(phase_opts, **own.step(phase, length))
            return run_phase(proto, {}, phase, tgt, bound, context=context)

        say(f"placing the prefill of {requests} x {prompt} tokens on {tgt.name}")
        # the cache, and the kernel that reads it, are a decode graph's
        prefill_opts = dataclasses.replace(
            batch_opts, kv_precision=None, decode_attention=KNOBS["decode_attention"].default
        )
        prefill = step("prefill", prompt, prefill_proto, prefill_opts)
        decode = []
        for context in sample_contexts(prompt, gen, samples):
            say(f"placing a decode step at context {context} on {tgt.name}")
            decode.append(step("decode", context, decode_proto, batch_opts))
        contexts = range(prompt, prompt + gen - 1)
        points = [(d.context, d.time_s) for d in decode]
        return GenerateResult(
            model=model_info,
            target=tgt.name,
            prompt=prompt,
            gen=gen,
            batch=requests,
            precision=prefill.report.config.get("precision") or opts.precision or str(params.get("dtype", "model")),
            kv_precision=opts.kv_precision or "as activations",
            prefill=prefill,
            decode=decode,
            decode_total_s=sum(_interp(points, c) for c in contexts) if decode else 0.0,
            interpolated=len(decode) < len(contexts),
            chips=chips,
            strategy=(getattr(opts, "strategy", None) or SERVING_STRATEGY) if chips > 1 else None,
            decode_graph=own.decode_graph if own is not None else "export",
            compiled_seq=compiled,
        )

    result = served(batch)
    if opts.kv_cache != "paged":
        return result
    pool = kv_pool(result, tgt)
    if not 0 < pool.admitted < batch:
        return dataclasses.replace(result, pool=pool)
    full, rest = divmod(batch, pool.admitted)
    waves = [pool.admitted] * full + ([rest] if rest else [])
    say(f"the KV-cache pool holds {pool.admitted} of the {batch} requests: {len(waves)} waves")
    runs = {size: served(size) for size in dict.fromkeys(waves)}
    first = runs[waves[0]]
    return dataclasses.replace(
        first,
        batch=batch,
        pool=pool,
        waves=[Wave(requests=size, latency_s=runs[size].latency_s, fits=runs[size].fits) for size in waves],
    )


def kv_pool(result: GenerateResult, target: Target) -> KvPool:
    """The paged cache pool of ``result``'s engine on each chip of ``target``, and the requests it admits at
    once: the memory that holds the cache, less the weights and the other tensors of the longest decode step
    sampled, times ``arch.kv_cache_pool_fraction``, over one request's whole cache (prompt plus generated
    tokens), on each replica (``--batch`` is a replica's)."""
    step = result.decode[-1]
    if not step.kv_cache_bytes:
        raise UserError(
            f"--kv-cache paged: the decode steps keep no KV cache ({DECODE_GRAPHS[result.decode_graph]}); drop it"
        )
    memory = target.feed_memory
    per_token = step.kv_cache_bytes / (result.batch * step.context)  # a request's (a chip's share under tp, pp)
    others = step.memory_bytes.get(memory.name, 0) - step.kv_cache_bytes
    fraction = target.arch_value(KV_CACHE_POOL_FRACTION, needed_by="--kv-cache paged")
    request = round(per_token * (result.prompt + result.gen))
    free = max(0, int(memory.capacity_bytes) - others)
    return KvPool(
        memory=memory.name,
        fraction=fraction,
        free_bytes=free,
        request_bytes=request,
        admitted=int(fraction * free // request),
    )


def _static_window(opts: ProfileOptions, target: Target, prompt: int, gen: int) -> int | None:
    """``--compiled-seq``: the window every step of a program compiled for static shapes runs (an RDU's
    PEF: SambaFlow pads the input to it), checked against the target and the request; None without it."""
    from dabench_ir.options import check_applies

    compiled = getattr(opts, "compiled_seq", None)
    if compiled is None:
        return None
    check_applies(opts, {"compiled_seq"}, target)
    if prompt + gen > compiled:
        raise UserError(
            f"--prompt {prompt} + --gen {gen} is {prompt + gen} tokens, more than --compiled-seq {compiled} "
            "holds; compile the program for more"
        )
    return compiled


# ---- output ------------------------------------------------------------------------------------
def _breakdown(run: PhaseRun, view: Breakdown) -> list[str]:
    """The phase's report as `profile` tables it (`dabench_ir.report.table.render_breakdown`): its
    module roles or nodes by ``view``; nothing when the phase was not placed."""
    if run.report is None:
        return []
    return render_breakdown(run.report, top=view.top, sort=view.sort, by=view.by, color=view.color).splitlines()


def _weights_home(result: GenerateResult) -> str:
    """Where the weights live, each phase's where the target places the two apart (a WSE-2 prefill
    pipelined with its weights resident, its decode steps streaming them from MemoryX)."""
    prefill = result.prefill.homes.get("weights")
    decode = result.decode[-1].homes.get("weights") if result.decode else prefill
    return str(prefill) if decode == prefill else f"{prefill} for the prefill, {decode} for each decode step"


def _pool_lines(result: GenerateResult) -> list[str]:
    """What a paged cache's pool holds, and the waves the batch runs in when it holds part of it."""
    pool = result.pool
    if pool is None:
        return []
    tokens = result.prompt + result.gen
    lines = [
        f"  KV-cache pool (paged)        {human(pool.pool_bytes, 'B')} of {pool.memory} per chip ({pool.fraction:g} of the "
        f"{human(pool.free_bytes, 'B')} the weights and a step leave): {pool.admitted:,} requests of {tokens:,} tokens "
        f"({human(pool.request_bytes, 'B')} each) at once"
    ]
    if pool.admitted == 0:
        lines.append("  does not fit: one request's cache is larger than the pool")
    elif result.waves:
        sizes = " + ".join(f"{w.requests:,}" for w in result.waves)
        times = " + ".join(seconds(w.latency_s) for w in result.waves)
        lines.append(
            f"  waves                        {len(result.waves)} ({sizes} requests, one after the other: {times}); "
            "first token and time per token are the first wave's"
        )
    return lines


def _in_flight(result: GenerateResult) -> str:
    return f", {result.in_flight:,} requests at once" if result.waves else ""


def _chip_notes(result: GenerateResult) -> list[str]:
    """What the scaling stage assumed of a decode step over several chips (its collectives, a
    pipeline's micro-batches), as `scale` prints it; none on one chip."""
    last = result.decode[-1].report if result.decode else result.prefill.report
    scaled = last.scaling if last is not None else None
    return list(scaled.points[-1].notes) if scaled is not None and result.chips > 1 else []


def _rate_lines(result: GenerateResult) -> list[str]:
    """The throughput lines: tokens/s per user and in total, with the decode-only rates; none of
    them for a run that does not fit (`GenerateResult.fits`), whose times are what it would take."""
    if not result.fits:
        return ["  tokens/s                     does not fit (the times above are what it would take if it fitted)"]

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.4g}"

    return [
        f"  tokens/s per user            {rate(result.tokens_per_s_per_user)} (decode only: "
        f"{rate(result.decode_tokens_per_s_per_user)})",
        f"  tokens/s total               {rate(result.tokens_per_s_total)} (decode only: "
        f"{rate(result.decode_tokens_per_s_total)}{_in_flight(result)})",
    ]


@dataclass(frozen=True, slots=True)
class Breakdown:
    """How the scenario tables each phase's report, as `profile` tables one (its ``--top``, ``--sort``,
    ``--by`` and ``--no-color``): ``top`` rows (0: every row) by ``sort`` (None: time), of module
    roles across layers or of single nodes (``by``)."""

    top: int = 20
    sort: str | None = None
    by: str = "role"
    color: bool | None = None  # None: bold on a tty (``--no-color``: False)


def render_generate(result: GenerateResult, *, breakdown: Breakdown | None = Breakdown()) -> str:
    """The scenario as a terminal table: summary, decode steps sampled, and the prefill's and the
    last decode step's reports tabled by ``breakdown`` (None: neither)."""
    m = result.model
    name = m.get("preset") or m.get("file") or f"{m.get('family')} L={m.get('layers')} h={m.get('hidden')}"
    tpot = result.tpot_s
    on = f"{result.chips} x {result.target} ({result.strategy})" if result.chips > 1 else result.target
    lines = [
        f"Generation: {name} on {on}, batch {result.batch}, prompt {result.prompt}, "
        f"gen {result.gen}, precision {result.precision}, KV cache {result.kv_precision}",
        "",
        f"  time to first token          {seconds(result.ttft_s)}",
        f"  time per output token (mean) {seconds(tpot)}",
        f"  end-to-end latency           {seconds(result.latency_s)}",
        *_rate_lines(result),
        f"  weights{' per chip' if result.chips > 1 else '         '}             "
        f"{human(result.prefill.weight_bytes, 'B')} in {_weights_home(result)}",
        f"  fits at every step           {'yes' if result.fits else 'NO'}",
        *(f"  note                         {note}" for note in _chip_notes(result)),
        *_pool_lines(result),
        "",
        f"  {'step':10s} {'context':>8s} {'time':>10s} {'KV/chip' if result.chips > 1 else 'KV cache':>10s} "
        f"{'cache home':24s} fits",
        f"  {'prefill':10s} {0:>8d} {seconds(result.prefill.time_s):>10s} {'-':>10s} "
        f"{result.prefill.homes.get('kv_cache', ''):24s} {'yes' if result.prefill.fits else 'NO'}",
    ]
    for d in result.decode:
        lines.append(
            f"  {'decode':10s} {d.context:>8d} {seconds(d.time_s):>10s} {human(d.kv_cache_bytes, 'B'):>10s} "
            f"{d.homes.get('kv_cache', ''):24s} {'yes' if d.fits else 'NO: ' + (d.failure or '')}"
        )
    if result.interpolated:
        check = result.interpolation_check
        lines.append(
            "  (decode steps between these context lengths: linear interpolation"
            + ("" if check is None else f"; an inner sampled step lies {percent(check)} from its neighbours' line")
            + ")"
        )
    lines.append(f"  decode steps: {DECODE_GRAPHS[result.decode_graph]}")
    if result.compiled_seq is not None:
        n = result.compiled_seq
        lines.append(
            f"  static shapes (--compiled-seq {n}): the prompt padded to {n} tokens, each decode step over a "
            f"cache of {n - 1}, whatever the context"
        )
    if not result.prefill.fits:
        lines.append(f"  prefill does not fit: {result.prefill.failure}")
    if breakdown is not None:
        lines += ["", "Prefill", *_breakdown(result.prefill, breakdown)]
        if result.decode:
            last = result.decode[-1]
            lines += ["", f"Decode step at context {last.context}", *_breakdown(last, breakdown)]
    return "\n".join(lines)


def run_scenario(args: Any, opts: ProfileOptions, progress: Any) -> int:
    """``dabench-ir profile MODEL --scenario generate``: the CLI's one entry here."""
    from dabench_ir.options import PROFILE, ScaleOptions, options_from_args

    opts = options_from_args(args, ScaleOptions, PROFILE)
    if opts.prompt is None or opts.gen is None:
        raise UserError("--scenario generate needs --prompt P and --gen G (tokens per request)")
    if not getattr(args, "target", None) or "," in args.target:
        raise UserError("--scenario generate needs one --target (e.g. -t h100)")
    for flag in ("csv", "html", "trace", "plots", "annotate", "cross_check", "measure"):
        if getattr(args, flag, None):
            raise UserError(f"--{flag.replace('_', '-')} is not available with --scenario generate; use --json")
    if opts.via != "onnx":
        raise UserError(
            f"--via {opts.via} is not available with --scenario generate: its prefill and decode graphs are "
            "costed from ONNX; drop --via"
        )
    result = generate(args.model, args.target, opts, prompt=opts.prompt, gen=opts.gen, progress=progress)
    progress.done()
    written = [str(result.write_json(args.json))] if getattr(args, "json", None) else []
    if not getattr(args, "quiet", False):
        view = Breakdown(top=args.top, sort=args.sort, by=args.by, color=False if args.no_color else None)
        print(render_generate(result, breakdown=view))
        for path in written:
            print(f"wrote {path}")
    from dabench_ir.commands.flags import refuse_uncounted

    phases = [result.prefill, *result.decode[-1:]]  # every decode step runs the same graph
    refuse_uncounted([run.report for run in phases if run.report is not None], strict=args.strict)
    return 0
