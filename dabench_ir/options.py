"""Every knob of dabench-ir, declared once.

A knob is a dataclass field whose metadata holds a `Knob`: its help, its choices, how a
command-line or TOML value is parsed and checked (its range), which commands offer it, and
which target kinds, modes and strategies it applies to. The CLI flags of ``profile``,
``scale``, ``sweep`` and ``study``, the sweep-spec validation, the lowerings' own option
classes and the report's recorded configuration are all derived from these fields (xDSL's
passes derive their CLI from their dataclass fields the same way), and `check_applies`, which
every run passes (`dabench_ir.run.resolve`), refuses a knob where its declaration says it
does not apply: no flag is accepted and ignored. A renamed flag keeps its old spelling as a
hidden alias with one deprecation line (`add_flag`).

Adding a knob: one field below (``knob(...)``) plus the code that reads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from dabench_ir.errors import UserError

__all__ = [
    "DEFAULT_MAX_WEIGHT_BYTES",
    "FLOAT_PRECISIONS",
    "GROUP_TITLES",
    "KNOBS",
    "KV_PRECISIONS",
    "MAX_LAYERS",
    "PRECISIONS",
    "PROFILE",
    "SCALE",
    "STUDY",
    "SWEEP",
    "Knob",
    "ProfileOptions",
    "ScaleOptions",
    "add_deprecated",
    "add_flag",
    "add_knob_arguments",
    "byte_size",
    "check_applies",
    "check_calibrated_threads",
    "knob",
    "knob_values",
    "knobs_for",
    "options_from_args",
    "recorded_config",
]

PROFILE, SCALE, SWEEP, STUDY = "profile", "scale", "sweep", "study"
_ALL = frozenset({PROFILE, SCALE, SWEEP, STUDY})
_PROFILE_ONLY = frozenset({PROFILE})
_NO_SWEEP = _ALL - {SWEEP}


class Knob(NamedTuple):  # a record built at import without generated code (a dataclass: ~1.5 ms)
    """How one option is offered and checked; ``name`` is the field's name."""

    help: str
    choices: tuple[str, ...] | None = None
    parse: Callable[[Any], Any] | None = None  # text/TOML value -> value; raises ValueError
    group: str = "run"  # run | target | measure | scale: the CLI's argument group
    commands: frozenset[str] = _ALL
    many: frozenset[str] = frozenset()  # commands whose flag takes a comma-separated list (scale --chips 1,2,4)
    cli: str = ""  # the flag's name when it is not the field's (dims -> dim)
    metavar: str | None = None
    targets: frozenset[str] | None = None  # target kinds whose lowering reads it (None: all)
    modes: frozenset[str] | None = None  # --mode values it means something in (None: all); its default: any
    strategies: frozenset[str] | None = None  # --strategy values it means something with (None: all)
    aliases: tuple[str, ...] = ()  # older flag spellings: still accepted, with a deprecation line
    name: str = ""
    default: Any = None  # the field's default (filled in by `_collect`; None for a factory)

    @property
    def flag(self) -> str:
        return "--" + (self.cli or self.name).replace("_", "-")

    @property
    def is_switch(self) -> bool:
        """A boolean knob that is off unless given: a bare ``--flag`` on the command line."""
        return self.parse is _bool and self.default is False

    def validate(self, value: Any) -> Any:
        """``value`` parsed and checked; ValueError saying what the knob takes."""
        if value is None:
            return None
        if self.parse is not None and (self.parse is not _bool or not isinstance(value, bool)):
            try:
                value = self.parse(value)
            except TypeError as exc:
                raise ValueError(str(exc)) from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}")
        return value

    def check(self, value: Any) -> Any:
        """``value`` parsed and checked, or a UserError naming the flag and what it takes."""
        try:
            return self.validate(value)
        except ValueError as exc:
            shown = " ".join(map(str, value)) if isinstance(value, list) else repr(value)
            raise UserError(f"{self.flag} {shown}: {exc}") from None


def knob(default: Any = None, *, default_factory: Callable[[], Any] | None = None, **how: Any) -> Any:
    """A dataclass field that is also a declared option (see `Knob`)."""
    kwargs: dict[str, Any] = {"metadata": {"knob": Knob(**how)}}
    if default_factory is not None:
        kwargs["default_factory"] = default_factory
    else:
        kwargs["default"] = default
    return field(**kwargs)


def _target_knob(default: Any = None, *, on: str | None = None, **how: Any) -> Any:
    """A knob of the ``target`` group (how a lowering places the model), read by the lowerings of the
    target kinds ``on`` names (space-separated; None: every kind's)."""
    return knob(default, group="target", targets=None if on is None else frozenset(on.split()), **how)


_measure_knob = partial(knob, group="measure", commands=_PROFILE_ONLY)
"""A knob of profile's onnxruntime measurement (``--measure``), offered by profile alone."""
_PLACEMENT_ONLY = frozenset({"micro_batches", "micro_batch"})
"""Knobs only a target's placement reads: a run without a target (FLOPs and bytes alone, or a
measurement, which runs the step's whole batch in one call) has no use for them."""
_REWRITES_THE_GRAPH = frozenset({"precision", "kv_precision", "fused_attention"})
"""Knobs that rewrite the graph before it is costed (dtypes, a fused attention core): a measurement
times the file as exported, so ``--measure`` refuses them (`_check_measured`)."""
_MEASURED_OR_NOT = frozenset({"measure", "threads"})
"""The measurement knobs that mean something without ``--measure``: the switch itself, and the threads a
calibrated ``cpu`` target's figures were measured with (`dabench_ir.run.resolve_target`)."""
_scenario_knob = partial(knob, group="scenario", commands=_PROFILE_ONLY)
"""A knob of profile's generation scenario (``--scenario generate``), offered by profile alone."""
_scale_knob = partial(knob, group="scale")
"""A knob of the placement over several chips (``scale``, multi-chip sweep points)."""


# -- value parsers: each raises ValueError with what it expected --------------------------------


def _positive(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().lstrip("+").isdigit() or int(value) < 1:
        raise ValueError("expected a positive integer")
    return int(value)


_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?(?:e\+?\d+)?)\s*(b|kb|kib|k|mb|mib|m|gb|gib|g|tb|tib|t)?\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "kb": 10**3,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "g": 2**30,
    "gib": 2**30,
    "gb": 10**9,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}


def byte_size(value: Any) -> int:
    """A size in bytes, a count or with a unit (``4294967296``, ``4e9``, ``4GiB``, ``512MB``): the one
    parser of every flag that takes bytes (``profile --max-weight-bytes``, ``export --max-weight-bytes``)."""
    match = None if isinstance(value, bool) else _SIZE.match(str(value))
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]) if match else 0
    if size < 1:
        raise ValueError(f"not a size: {value!r} (e.g. 4294967296, 4e9, 4GiB, 512MB)")
    return size


def _non_negative(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().lstrip("+").isdigit():
        raise ValueError("expected a non-negative integer")
    return int(value)


def _fraction(value: Any) -> float:
    """A number in (0, 1], or a comma list of them (the smallest is kept)."""
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    try:
        numbers = [float(v) for v in items]
    except (TypeError, ValueError):
        raise ValueError("expected a number in (0, 1], or a comma list of them") from None
    if not numbers or isinstance(value, bool) or any(not 0 < x <= 1 for x in numbers):
        raise ValueError("expected a number in (0, 1], or a comma list of them")
    return min(numbers)


MAX_CHIPS = 1 << 20
"""More chips than any machine has (the largest systems hold tens of thousands): a typo, refused."""


def _chip_count(value: Any) -> int:
    chips = _positive(value)
    if chips > MAX_CHIPS:
        raise ValueError(f"expected at most {MAX_CHIPS:,} chips")
    return chips


def _thread_count(value: Any) -> int:
    from dabench_ir.execute.ort import default_threads  # the CPUs this process may use

    threads, cpus = _positive(value), default_threads()
    if threads > cpus:
        raise ValueError(f"expected at most {cpus} (the CPUs this process may use)")
    return threads


MAX_LAYERS = 10_000
"""The most decoder blocks a model may have: export and sweep refuse more (sweep: unless --force),
validate's catalogue reads the same limit. Far above any published model (LLaMA-2 70B: 80)."""


def _positive_or_auto(value: Any) -> int | str:
    return "auto" if value == "auto" else _positive(value)


def _dims(value: Any) -> dict[str, int]:
    """``["batch=1", "seq=128"]`` (repeated ``--dim``) or a mapping -> ``{"batch": 1, "seq": 128}``."""
    items = value.items() if isinstance(value, Mapping) else (str(v).partition("=")[::2] for v in value)
    dims: dict[str, int] = {}
    for name, number in items:
        name = str(name).strip()
        if not name or isinstance(number, bool) or not str(number).strip().isdigit():
            raise ValueError(f"expected NAME=VALUE with a whole number, e.g. --dim batch=1 (got {name}={number})")
        if dims.get(name, int(number)) != int(number):
            raise ValueError(f"{name} given twice ({dims[name]} and {int(number)}); give it once")
        dims[name] = int(number)
    return dims


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _counts(value: Any) -> tuple[int, ...]:
    """``"0,4,4,4"`` or ``[0, 4, 4, 4]`` -> ``(0, 4, 4, 4)``: non-negative integers, at least one positive."""
    items = str(value).split(",") if isinstance(value, str) else list(value)
    counts = tuple(_non_negative(v) for v in items)
    if not counts or not any(counts):
        raise ValueError("expected comma-separated layer counts with at least one positive, e.g. 0,4,4,4")
    return counts


def _proportions(value: Any) -> tuple[float, ...]:
    """``"0.15"``, ``"0.3,0.15"`` or a list -> a tuple of fractions in (0, 1]."""
    items = str(value).split(",") if isinstance(value, (str, int, float)) else list(value)
    try:
        out = tuple(float(v) for v in items)
    except (TypeError, ValueError):
        raise ValueError("expected fractions in (0, 1], e.g. 0.15 or 0.3,0.15") from None
    if not out or not all(0 < v <= 1 for v in out):
        raise ValueError("expected fractions in (0, 1], e.g. 0.15 or 0.3,0.15")
    return out


def _recompute(value: Any) -> str:
    """``none``, ``selective``, ``op`` or ``full``; a boolean from older specs means full (True) or none (False)."""
    if isinstance(value, bool):
        return "full" if value else "none"
    text = str(value).strip().lower()
    legacy = {
        "true": "full",
        "yes": "full",
        "on": "full",
        "1": "full",
        "false": "none",
        "no": "none",
        "off": "none",
        "0": "none",
    }
    return legacy.get(text, text)


def _zero(value: Any) -> int:
    if isinstance(value, bool) or str(value).strip() not in ("0", "1", "2", "3"):
        raise ValueError("expected 0, 1, 2 or 3 (ZeRO stage; 3 = FSDP)")
    return int(value)


DEFAULT_MAX_WEIGHT_BYTES = 4 << 30
"""The 4 GiB cap on weights synthesised for one run: profile's measurement (``--max-weight-bytes``,
`dabench_ir.execute.synth`) and export's ``--weights random`` (`dabench_ir.models.export`)."""
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16", "mixed")
"""The float ``--precision`` choices (no quantised weights): the one list of them."""
PRECISIONS = (*FLOAT_PRECISIONS, "int8", "fp8", "w8a16", "w4a16")
"""Every ``--precision`` choice; `dabench_ir.passes.precision` says what each one rewrites."""
KV_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8")
"""Every ``--kv-precision`` choice."""
SCENARIOS = ("generate",)
RECOMPUTE = ("none", "selective", "op", "full")
"""Every ``--recompute`` choice; `dabench_ir.passes.training` says what each one keeps (docs/training.md)."""
OPTIMIZER_STATE = ("auto", "onchip", "offchip")
DECODE_ATTENTION = ("per-query-head", "per-kv-head", "xqa-auto")
"""How a GPU decode step's attention kernel loads a grouped-query KV cache (`lowering.gpu.cache_rereads`)."""
KV_CACHES = ("static", "paged")
"""How a GPU serving engine holds a generation's KV cache (`dabench_ir.scenario.KvPool`)."""
MODES = ("inference", "train")
_TRAIN = frozenset({"train"})
OPT_LEVELS = ("O0", "O1", "O3")
RDU_MAPPINGS = ("compiler", "tuned")
"""Every ``--rdu-mapping`` choice: the compiler's own stage mapping, or SambaNova's tuned one."""
RDU_HOST_LOOPS = ("tutorial", "production")
"""Every ``--rdu-host-loop`` choice: the training app whose host loop drives the RDU (`lowering.rdu.overheads`)."""
WSE_MODES = ("pipelined", "streaming", "auto")
STRATEGIES = ("dp", "tp", "pp")


@dataclass(frozen=True)
class ProfileOptions:
    """Everything `profile` can be asked. The CLI flags are derived from these fields."""

    dims: Mapping[str, int] = knob(
        default_factory=dict,
        help="bind a symbolic dim, NAME=VALUE (repeatable; 0 only for a KV cache's length: an empty cache)",
        parse=_dims,
        cli="dim",
        metavar="NAME=VALUE",
        commands=_NO_SWEEP,
    )
    batch: int | None = knob(
        None,
        help="samples per step on each replica: binds the model's batch dim when it is symbolic; a static "
        "batch is the model's own (default: as exported)",
        parse=_positive,
        many=frozenset({SCALE}),
    )
    seq: int | None = knob(
        None,
        help="tokens per sample: binds the model's symbolic sequence length (seq, sequence_length, "
        "total_sequence_length: dabench_ir.frontends.onnx.SEQ_SYMBOLS)",
        parse=_positive,
        commands=_NO_SWEEP,
    )
    past: int | None = knob(
        None,
        help="tokens already in the KV cache of a decode-step model: binds its cache inputs' symbolic "
        "length (past_sequence_length, a dynamo export's sNN, this tool's context: "
        "dabench_ir.frontends.onnx.past_symbols); a dim made of bound parts (past_sequence_length + "
        "sequence_length) follows; 0: the cache empty (a prefill through a cache model)",
        parse=_non_negative,
        commands=_NO_SWEEP,
    )
    compiled_seq: int | None = _target_knob(
        None,
        help="the sequence length an RDU program (PEF) was compiled for: SambaFlow compiles static shapes "
        "and a shorter input is padded to it (sambanova/tutorials generative_nlp/generative_inference.py "
        "pads input_ids to --max_seq_length), so the step runs this many tokens; --seq (at most this) "
        "stays the sample's own",
        parse=_positive,
        on="rdu",
        commands=_NO_SWEEP,
    )
    precision: str | None = knob(
        None,
        help="rewrite dtypes before costing (default: the target's [defaults] precision; without a target, "
        "as the model is); int8 = W8A8, fp8 = e4m3 "
        "weights and matmul inputs, w8a16/w4a16 = weight-only with dequantisation counted",
        choices=PRECISIONS,
    )
    kv_precision: str | None = knob(
        None, help="dtype of a decode graph's KV cache (default: the activations')", choices=KV_PRECISIONS
    )
    mode: str = knob("inference", help="inference (forward) or train (backward and optimizer too)", choices=MODES)
    recompute: str = knob(
        "none",
        help="train mode: none (keep what autograd saves), selective (recompute attention cores), op "
        "(torchtitan's per-op selective checkpointing: keep the block input, every other matmul's and the "
        "attention kernel's outputs, recompute the rest) or full (keep block inputs, recompute each block); "
        "true/false from older specs mean full/none",
        choices=RECOMPUTE,
        parse=_recompute,
        modes=_TRAIN,
    )
    fused_attention: bool | None = knob(
        None,
        help="run attention cores as one fused kernel (FlashAttention: no S×S tensor in memory; "
        "default: the target's [defaults])",
        parse=_bool,
        metavar="{true,false}",
    )
    decode_attention: str = knob(
        "per-query-head",
        help="GPU decode step's attention kernel under grouped-query attention: per-query-head (a thread "
        "block per query head loads its group's K/V, the repeats from L2: TensorRT-LLM's masked MHA, vLLM's "
        "paged attention), per-kv-head (a block per K/V head serves its query heads, the cache loaded "
        "once: TensorRT-LLM's XQA, TRTLLM_ENABLE_XQA=1) or xqa-auto (TensorRT-LLM's own choice where XQA "
        "is built in, trtllm-build's default: XQA when a step has at least a quarter as many "
        "sequence x K/V-head blocks as the GPU has SMs, else per-query-head)",
        choices=DECODE_ATTENTION,
        targets=frozenset({"gpu"}),
    )
    micro_batch: int | None = knob(
        None,
        help="train: samples in flight per micro-batch (gradient accumulation over --batch / "
        "--micro-batch-size micro-batches; the optimizer runs once per step); sets --micro-batches",
        parse=_positive,
        modes=_TRAIN,
        cli="micro_batch_size",
        aliases=("--micro-batch",),
        metavar="N",
    )
    via: str = knob(
        "onnx", help="cost from ONNX rules or from linalg", choices=("onnx", "mlir"), commands=_PROFILE_ONLY
    )
    no_verify: bool = knob(
        False,
        help="skip the physics verifier that checks every run (dabench_ir.verify; debugging only: a "
        "violation is an internal error, and a report made without the check says so)",
        parse=_bool,
    )
    # target lowering
    opt_level: str = _target_knob("O1", help="RDU compiler fusion level", choices=OPT_LEVELS, on="rdu")
    tiles: int | None = _target_knob(
        None,
        help="RDU tiles the graph is compiled onto (SambaFlow --num-tiles; default: the whole RDU)",
        parse=_positive,
        on="rdu",
    )
    rdu_mapping: str = _target_knob(
        "compiler",
        help="RDU stage mapping: compiler (each stage of a section holds PCUs by its memory demand, "
        "SambaFlow's own mapping) or tuned (SambaNova's human-decision files, --mac-human-decision: "
        "each stage tiled over PCUs by its work)",
        choices=RDU_MAPPINGS,
        on="rdu",
    )
    rdu_host_loop: str = _target_knob(
        "tutorial",
        help="RDU training app's host loop: tutorial (SambaNova's tutorial app as DABench-LLM profiled it: "
        "the host's fitted per-step work runs between steps, the RDU idle) or production (SambaNova's "
        "transformers_on_rdu apps: the tiles measured executing 90-97 percent of a run: no host time between steps)",
        choices=RDU_HOST_LOOPS,
        on="rdu",
        modes=_TRAIN,
    )
    resource_scale: float = _target_knob(
        1.0,
        help="share of the tiles' PCUs/PMUs the RDU compiler plans with (SambaFlow --resources-scaling-factors: "
        "one factor, or a comma list whose smallest is used)",
        parse=_fraction,
        on="rdu",
    )
    wse_mode: str = _target_knob("auto", help="WSE execution mode", choices=WSE_MODES, on="wse")
    replicas: int | str | None = _target_knob(
        None,
        help="WSE on-wafer replicas (N or 'auto'); IPU data-parallel replicas (N)",
        parse=_positive_or_auto,
        on="wse ipu",
    )
    ipus: int = _target_knob(1, help="IPUs to pipeline over", parse=_positive, on="ipu")
    micro_batches: int | None = _target_knob(
        None, help="micro-batches per step where the target pipelines", parse=_positive
    )
    layers_per_ipu: tuple[int, ...] | None = _target_knob(
        None,
        help="decoder layers on each IPU, e.g. 0,4,4,4 (a leading 0: the embedding alone on IPU 0; a tied head returns there)",
        parse=_counts,
        on="ipu",
        metavar="N,N,...",
    )
    matmul_proportion: tuple[float, ...] = _target_knob(
        (0.6,),
        help="share of each IPU's memory the planner may give matmul temporaries (one value, or one per IPU)",
        parse=_proportions,
        on="ipu",
        metavar="P[,P...]",
    )
    optimizer_state: str = _target_knob(
        "auto",
        help="where optimizer state (fp32 master weights and moments) lives: auto (the vendor's default), "
        "onchip, or offchip (IPU streaming memory; GPU CPU offload)",
        choices=OPTIMIZER_STATE,
        on="ipu gpu",
        modes=_TRAIN,
    )
    replicated_tensor_sharding: bool = _target_knob(
        True,
        help="IPU, train: shard optimizer state over the replicas",
        parse=_bool,
        on="ipu",
        metavar="{true,false}",
        modes=_TRAIN,
    )
    half_partials: bool = _target_knob(
        True,
        help="IPU: 16-bit matmuls keep fp16 partial sums (PopTorch setPartialsType(half), the GPT-2 examples' "
        "--enable-half-partials); false: fp32 partials, on half the AMP units",
        parse=_bool,
        on="ipu",
        metavar="{true,false}",
    )
    # measurement
    measure: bool = _measure_knob(False, help="run the model in onnxruntime and time every node", parse=_bool)
    warmup: int = _measure_knob(2, help="untimed runs first", parse=_non_negative)
    repeat: int | str = _measure_knob(
        5, help="timed runs (the median is kept); auto: until the median's spread is known", parse=_positive_or_auto
    )
    threads: int | None = _measure_knob(
        None, help="onnxruntime intra-op threads (at most the CPUs this process may use)", parse=_thread_count
    )
    ort_opt: bool = _measure_knob(False, help="keep onnxruntime graph optimisation on", parse=_bool)
    max_weight_bytes: int = _measure_knob(
        DEFAULT_MAX_WEIGHT_BYTES, help="cap on synthesised weights (bytes: 4294967296, 4GiB, 512MB)", parse=byte_size
    )
    # generation scenario (dabench_ir.scenario): prefill + decode of one request batch
    scenario: str | None = _scenario_knob(
        None,
        help="generate: time to first token and per output token (MODEL: a preset or a dabench-ir export)",
        choices=SCENARIOS,
    )
    prompt: int | None = _scenario_knob(None, help="prompt tokens per request", parse=_positive)
    gen: int | None = _scenario_knob(None, help="tokens generated per request", parse=_positive)
    kv_cache: str = _scenario_knob(
        "static",
        help="how a GPU serving engine holds the cache: static (the whole batch's cache at once, or the run does "
        "not fit: a contiguous cache, TensorRT-LLM's gptSessionBenchmark) or paged (a pool of "
        "arch.kv_cache_pool_fraction of the memory the weights and a step leave, a request admitted only when its "
        "whole cache fits, so a batch beyond the pool runs in waves: TensorRT-LLM's GUARANTEED_NO_EVICT, vLLM)",
        choices=KV_CACHES,
        targets=frozenset({"gpu"}),
    )

    def __post_init__(self) -> None:
        for name, k in KNOBS.items():
            if name in self.__dataclass_fields__:
                object.__setattr__(self, name, k.check(getattr(self, name)))


@dataclass(frozen=True)
class ScaleOptions(ProfileOptions):
    """`scale` and multi-chip sweep points: a profile placed over several chips."""

    chips: int = _scale_knob(
        1,
        help="chips to place the model over, with --strategy (scale: a list)",
        parse=_chip_count,
        many=frozenset({SCALE}),
    )
    strategy: str | None = _scale_knob(None, help="data, tensor or pipeline parallel", choices=STRATEGIES)
    zero: int = _scale_knob(
        0,
        help="data parallel training: ZeRO stage sharding over the chips (1 optimizer state, "
        "2 + gradients, 3 + weights = FSDP)",
        parse=_zero,
        modes=_TRAIN,
        strategies=frozenset({"dp"}),
        targets=frozenset({"gpu"}),
        metavar="{0,1,2,3}",
    )
    chips_per_node: int | None = _scale_knob(
        None,
        help="how many of the run's chips share a node: a job spread over machines, its collectives and "
        "pipeline boundaries crossing the inter-node link (default: the target's [topology] devices_per_node; "
        "at most that)",
        parse=_chip_count,
        metavar="N",
    )


def _collect(*classes: type) -> dict[str, Knob]:
    found: dict[str, Knob] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if "knob" in f.metadata:
                default = None if f.default is dataclasses.MISSING else f.default
                found[f.name] = f.metadata["knob"]._replace(name=f.name, default=default)
    return found


KNOBS: dict[str, Knob] = _collect(ProfileOptions, ScaleOptions)
"""Every declared option, by field name."""

GROUP_TITLES = {
    "run": None,  # the command's own arguments
    "target": "target options",
    "scale": "scaling",
    "measure": "measurement (onnxruntime)",
    "scenario": "generation scenario (--scenario generate)",
}
"""The CLI argument group each knob ``group`` is shown under."""


# -- derived: CLI flags, parsed values, recorded configuration ----------------------------------


def knobs_for(command: str, knobs: Mapping[str, Knob] | None = None) -> dict[str, Knob]:
    """The knobs ``command`` offers, in declaration order."""
    return {n: k for n, k in (KNOBS if knobs is None else knobs).items() if command in k.commands}


def add_knob_arguments(
    parser: argparse.ArgumentParser,
    command: str,
    *,
    knobs: Mapping[str, Knob] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Add one flag per knob ``command`` offers, under its group's heading.

    Flags default to None ("not given") so the options dataclass keeps its own defaults;
    `options_from_args` parses and checks what was given. ``defaults`` shows a command's
    own default for a knob in the help (``scale --chips`` lists 1,2,4,8).
    """
    groups: dict[str, Any] = {}
    for name, k in knobs_for(command, knobs).items():
        title = GROUP_TITLES.get(k.group, k.group)
        if title is None:
            target = parser
        else:
            target = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        shown = (defaults or {}).get(name, k.default)
        help_text = k.help if shown in (None, False) or k.is_switch else f"{k.help} (default: {_text(shown)})"
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
        if k.is_switch:
            kwargs["action"] = "store_true"
        elif k.parse is _dims:
            kwargs.update(action="append", metavar=k.metavar)
        elif command in k.many:
            kwargs["metavar"] = k.metavar or f"{name.upper()}[,{name.upper()}...]"
        else:
            kwargs["metavar"] = k.metavar or ("{" + ",".join(k.choices) + "}" if k.choices else name.upper())
        add_flag(target, k.flag, deprecated=k.aliases, **kwargs)


DEPRECATED = "_deprecated"
"""The parsed namespace's list of deprecation lines (an old spelling was used); `dabench_ir.cli` prints
them as warnings after the command."""


class _Deprecated(argparse.Action):
    """An old flag, not shown in the help: it does what ``base`` (the flag that replaced it) does, or
    stores its value, and records a deprecation line saying what to ``use``."""

    def __init__(
        self,
        option_strings,
        dest,
        *,
        use: str,
        base: argparse.Action | None = None,
        nargs=None,
        const=None,
        default=None,
        metavar=None,
        **_: Any,
    ):
        if base is not None:
            nargs, const, default = base.nargs, base.const, argparse.SUPPRESS  # the new flag owns the default
        super().__init__(
            option_strings, dest, nargs=nargs, const=const, default=default, metavar=metavar, help=argparse.SUPPRESS
        )
        self.use, self.base = use, base

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        lines = getattr(namespace, DEPRECATED, None) or []
        lines.append(f"{option_string} is deprecated and will be removed; use {self.use}")
        setattr(namespace, DEPRECATED, lines)
        if self.base is not None:
            self.base(parser, namespace, values, option_string)
        else:
            setattr(namespace, self.dest, values)


def add_flag(parser: Any, *flags: str, deprecated: tuple[str, ...] = (), **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(*flags, **kwargs)``, also answering to the ``deprecated`` spellings (not
    shown in the help): each use of one records a deprecation line naming the flag to use. Every
    command keeps a renamed flag's old spelling this way."""
    action = parser.add_argument(*flags, **kwargs)
    if deprecated:
        use = next((f for f in flags if f.startswith("--")), flags[0])
        parser.add_argument(*deprecated, dest=action.dest, action=_Deprecated, base=action, use=use)
    return action


def add_deprecated(parser: Any, flag: str, *, use: str, **kwargs: Any) -> argparse.Action:
    """A retired flag that still works as it did (not shown in the help), with a deprecation line
    saying what to ``use`` instead (``scale --plot F``: use --plots DIR)."""
    return parser.add_argument(flag, action=_Deprecated, use=use, **kwargs)


def _text(value: Any) -> str:
    """A knob's value as its flag takes it (a list comma-separated, a switch true/false)."""
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def knob_values(args: argparse.Namespace, command: str, *, knobs: Mapping[str, Knob] | None = None) -> dict[str, Any]:
    """The knobs given on the command line, parsed and checked (a list where ``command`` takes many)."""
    values: dict[str, Any] = {}
    for name, k in knobs_for(command, knobs).items():
        raw = getattr(args, name, None)
        if raw is None:
            continue
        if command in k.many:
            items = [v.strip() for v in str(raw).split(",")]
            if not any(items) or not all(items):
                raise UserError(f"{k.flag} {raw!r}: expected a comma-separated list, e.g. {k.flag} 1,2,4")
            values[name] = [k.check(v) for v in items]
            twice = sorted({repr(v) for v in values[name] if values[name].count(v) > 1})
            if twice:  # one point a value: a second would print the same row again
                raise UserError(f"{k.flag} {raw}: {', '.join(twice)} given more than once; give each value once")
        else:
            values[name] = k.check(raw)
    return values


def options_from_args(args: argparse.Namespace, cls: type, command: str, **fixed: Any) -> Any:
    """An options object (``cls``) from parsed flags; ``fixed`` sets fields (one value of a list flag)."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = knob_values(args, command)
    dropped = [KNOBS[n].flag for n in values if n not in names]
    if dropped:  # never accepted and ignored: a command offers only the knobs its options hold
        raise RuntimeError(f"{command} offers {dropped[0]}, which {cls.__name__} has no field for")
    values.update(fixed)
    listed = [KNOBS[n].flag for n, v in values.items() if isinstance(v, list)]
    if listed:
        raise UserError(f"{listed[0]} takes one value here")
    return cls(**values)


def _check_measured(opts: Any, given: set[str] | frozenset[str], *, trained: bool) -> None:
    """``--measure`` runs the file as exported in onnxruntime, on one device: a knob that rewrites the
    graph before it is costed (`_REWRITES_THE_GRAPH`, a training step), or several chips, would describe
    another run than the one timed."""
    chips = getattr(opts, "chips", None) or 1  # a scaling knob: a profile's plain options have none
    if chips > 1:  # its report would be the scaling stage's, the measurement lost
        raise UserError(
            f"--measure times the model in onnxruntime on this machine, one device; it cannot measure a run "
            f"over --chips {chips}: drop one of them"
        )
    if opts.mode == "train" and not trained:
        raise UserError(
            "--measure times the exported graph in onnxruntime, a forward pass; it cannot time a training step "
            "(--mode train is emulated): drop one of them"
        )
    rewrites = [f"{KNOBS[n].flag} {_text(getattr(opts, n))}" for n in sorted(given & _REWRITES_THE_GRAPH)]
    if rewrites:
        raise UserError(
            f"--measure times the file as exported; {rewrites[0]} rewrites the graph before it is costed, so the "
            "costed and the timed graphs would differ: drop one of them (export the model as you want it timed)"
        )


def _check_lowering_takes(opts: Any, given: set[str] | frozenset[str], target: Any, mode: str) -> None:
    """The knobs a target's lowering declares it has no use for (`Lowering.fuses_attention_itself`,
    `Lowering.without_micro_batches`): refused, naming why; and the lowering's own rules on how its
    knobs combine (its options' checks, e.g. the WSE's copies and lanes), before anything runs."""
    from dabench_ir.lowering import lowering_for

    lowering = lowering_for(target)
    lowering.check_options(target, lowering.options(opts))  # a combination the lowering refuses, a size its target does
    asks_fusion = opts.fused_attention and "fused_attention" in given
    asks_micro_batches = [f"{KNOBS[n].flag} {getattr(opts, n)}" for n in ("micro_batches", "micro_batch") if n in given]
    if asks_fusion and lowering.fuses_attention_itself:
        raise UserError(
            f"--fused-attention true on {target.name} ({target.kind}): its lowering models how the chip fuses "
            "an attention core itself; a cost rewrite before it would count the fusion twice; drop it"
        )
    not_modelled = lowering.recompute_without.get(opts.recompute) if "recompute" in given and mode == "train" else None
    if not_modelled:
        modes = ", ".join(m for m in RECOMPUTE if m not in lowering.recompute_without)
        raise UserError(
            f"--recompute {opts.recompute} on {target.name} ({target.kind}): {not_modelled}; use one of {modes}"
        )
    why = lowering.without_micro_batches.get(mode) if asks_micro_batches else None
    if why:
        fix = "drop it" if len(asks_micro_batches) == 1 else "drop them"
        if mode != "train" and "train" not in lowering.without_micro_batches:
            fix += ", or add --mode train"
        raise UserError(
            f"{' '.join(asks_micro_batches)} on {target.name} ({target.kind}) in "
            f"{'training' if mode == 'train' else 'inference'}: {why}; {fix}"
        )


def _check_recompute(opts: Any, given: set[str] | frozenset[str], target: Any, mode: str) -> None:
    """``--recompute selective`` recomputes each attention core in the backward: with fused attention
    (given, or the target's default) the fused kernel's backward does so already, and the step is
    the one without it (passes/training.py): refused, naming the fix."""
    if "recompute" not in given or opts.recompute != "selective" or mode != "train":
        return
    fused, source = opts.fused_attention, "--fused-attention true"
    if fused is None and target is not None:
        fused, source = bool(target.default("fused_attention")), f"{target.name}'s default"
    if fused:
        raise UserError(
            f"--recompute selective recomputes each attention core in the backward, which the fused attention "
            f"kernel does already ({source}): the step is the one without it; drop it, or add --fused-attention false"
        )


def check_applies(opts: Any, given: set[str] | frozenset[str], target: Any = None, *, trained: bool = False) -> None:
    """The one check that no knob is accepted and ignored: each knob the user ``given`` must apply to
    ``target`` (its kind, its size), the run's mode (``trained``: the graph is already a training
    graph) and strategy, as its declaration says; a UserError names the flag and where it applies.

    Every run passes here (`dabench_ir.run.resolve`), whatever command or API asked for it.
    """
    mode = "train" if trained else opts.mode
    for name in sorted(given):
        k = KNOBS[name]
        value = getattr(opts, name)
        if target is None and k.group == "scale":
            raise UserError(f"{k.flag} places the model over several chips of a target; give --target")
        if target is None and name in _PLACEMENT_ONLY:
            raise UserError(f"{k.flag} splits a step into micro-batches on a target; give --target, or drop {k.flag}")
        if k.targets is not None:
            kinds = ", ".join(sorted(k.targets))
            if target is None:
                raise UserError(
                    f"{k.flag} sets how a {kinds} target places the model; give --target (e.g. -t {min(k.targets)})"
                )
            if target.kind not in k.targets:
                raise UserError(f"{k.flag} applies to {kinds} targets, not {target.name} ({target.kind}); drop it")
        if k.modes is not None and mode not in k.modes and value != k.default:
            raise UserError(f"{k.flag} {_text(value)} applies to training; add --mode train")
        if k.strategies is not None and value != k.default and opts.strategy not in (None, *k.strategies):
            raise UserError(
                f"{k.flag} {_text(value)} applies to --strategy {', '.join(sorted(k.strategies))}, "
                f"not --strategy {opts.strategy}; drop it or use --strategy dp"
            )
        if k.group == "scenario" and name != "scenario" and not opts.scenario:
            raise UserError(f"{k.flag} applies to --scenario generate; add it or drop {k.flag}")
        if k.group == "measure" and name not in _MEASURED_OR_NOT and not opts.measure:
            raise UserError(f"{k.flag} applies to an onnxruntime run; add --measure or drop {k.flag}")
        if name == "threads" and not opts.measure and (target is None or target.kind != "cpu"):
            raise UserError(
                f"{k.flag} applies to an onnxruntime run or to the host cpu target's calibration; "
                f"add --measure, use -t cpu, or drop {k.flag}"
            )
        if name == "threads" and target is not None and target.kind == "cpu":
            check_calibrated_threads(target, value)
    if opts.measure:
        _check_measured(opts, given, trained=trained)
    if target is not None:
        _check_lowering_takes(opts, given, target, mode)
    _check_recompute(opts, given, target, mode)
    if opts.precision is not None and opts.precision not in FLOAT_PRECISIONS and mode == "train":
        raise UserError(
            f"--precision {opts.precision} is an inference (quantised) precision; train in "
            f"{', '.join(FLOAT_PRECISIONS)}"
        )
    if target is None or "replicas" not in given or opts.replicas in (None, 1):
        return
    if isinstance(opts.replicas, int) and opts.replicas > target.num_units:
        raise UserError(
            f"--replicas {opts.replicas:,}: {target.name} has {target.num_units:,} compute units; a copy "
            "needs at least one"
        )


def check_calibrated_threads(target: Any, threads: int | None) -> None:
    """A calibrated ``cpu`` target (a Target, or its parsed TOML) asked to run at ``threads``: its
    figures (peak, curves, node table) were measured at the thread count its calibration names
    (`dabench_ir.lowering.cpu.calibrated_threads`), so another count would predict with one count's
    peak and another's kernel times; refused, naming the two fixes. The host name ``cpu`` is calibrated
    at the count asked (`dabench_ir.run.resolve_target`); a hand-written target names no count."""
    from dabench_ir.lowering.cpu import calibrated_threads

    raw = getattr(target, "raw", target)
    calibrated = calibrated_threads(raw) if isinstance(raw, Mapping) else None
    if threads is None or calibrated is None or threads == calibrated:
        return
    where = getattr(target, "origin", None) or "this cpu target"
    plural = "s" if calibrated != 1 else ""
    raise UserError(
        f"--threads {threads}: {where} was calibrated at {calibrated} thread{plural}; drop --threads to use "
        f"its figures, or calibrate at {threads} (--target cpu --threads {threads}, or `dabench-ir calibrate "
        f"--threads {threads}`)"
    )


def recorded_config(opts: Any, *, target: bool = True) -> dict[str, Any]:
    """The knobs a report records as its configuration: every run, target and scale knob.

    Measurement knobs are recorded with the measurement; target knobs only when a target
    was placed on (``target``). Callers then resolve what the options left open (the batch
    the graph binds, the precision the model computes in).
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(opts):
        k = KNOBS.get(f.name)
        if k is None or k.group in ("measure", "scenario") or (k.group == "target" and not target):
            continue
        value = getattr(opts, f.name)
        out[f.name] = dict(value) if isinstance(value, Mapping) else value
    return out


SHARING_KNOBS = ("strategy", "zero", "chips_per_node")
"""The knobs of sharing a run over chips: nothing to share on one chip."""


def check_shared(chips: int, given: Mapping[str, Any]) -> None:
    """Refuse the knobs of sharing (`SHARING_KNOBS`, those ``given`` a value) on a run of ``chips`` = 1
    at most: one chip has nothing for a strategy, ZeRO or a node size to split (``scale --chips 1
    --zero 3`` had run and ignored it)."""
    if chips > 1:
        return
    flag = next((KNOBS[k].flag for k in SHARING_KNOBS if given.get(k) not in (None, 0)), None)
    if flag:
        raise UserError(f"{flag} applies to a run over several chips; give --chips a count above 1")
