"""Precision rewrite: float, mixed and quantised precisions, as a pass that rewrites dtypes.

Mixed precision follows the usual recipe (Micikevicius et al., "Mixed Precision Training",
ICLR 2018; NVIDIA's automatic mixed precision lists): matmuls, convolutions and the
activations between them in half precision; softmax, normalisations, reductions and
transcendental-heavy ops compute in fp32 and write fp32 (the ops whose `OpTraits.keeps_fp32`
is set in passes/cost_rules.py); master weights stay fp32 (they matter in training, see
passes/training.py). Under ``mixed`` every contraction takes 16-bit inputs and accumulates in
fp32 (the recipe's fp32 accumulation; Cerebras docs, "Data Formats": "16-bit input to arithmetic
operations, and FP32 accumulations"): the pass marks each contraction's accumulation dtype in
`meta.ACCUMULATE` (fp32 under ``mixed``; the compute dtype under fp32 / fp16 / bf16). A target
whose matmul rate depends on the accumulator width declares it (``[compute.fp32_accumulate_flops]``,
`dabench_ir.targets.Target.rate`); on the others the mark changes nothing.

Quantised inference (docs/models.md, "Quantised precisions"): the weights of the matmuls in
the decoder blocks are quantised; embeddings, the LM head and norm weights stay 16-bit, as
GPTQ, AWQ, SmoothQuant and TensorRT-LLM's recipes keep them. Activations stay fp16.

- ``int8`` (W8A8, SmoothQuant-style) and ``fp8`` (e4m3, Transformer-Engine-style): int8 / fp8
  weights; the block matmuls compute at the int8 / fp8 peak, everything else in fp16.
- ``w8a16`` / ``w4a16`` (weight-only): int8 / int4 weights, dequantised to fp16 in the matmul
  and multiplied in fp16. The dequantisation is counted on the matmul that reads the weight:
  w8a16 per-output-channel symmetric, one multiply per weight element plus an fp16 scale per
  output channel; w4a16 group-wise asymmetric (group 128, as GPTQ/AWQ), a subtract and a
  multiply per weight element plus an fp16 scale and an int4 zero point per group.

``kv`` rewrites a decode graph's KV cache (the inputs and new-K/V outputs its exporter lists
in ``dabench.kv_cache``) to its own dtype, alone or with any of the above.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, DType, Graph, Node, TensorType, ValueKind
from dabench_ir.options import KV_PRECISIONS, PRECISIONS

from . import meta
from .base import Pass, PassResult
from .cost_rules import OpClass, traits_of

__all__ = [
    "KV_CACHE_METADATA_KEY",
    "DequantisePass",
    "PrecisionPass",
    "accumulate_dtype",
    "block_matmul_weights",
    "cache_inputs",
    "compute_dtype",
    "dominant_storage_dtype",
    "graph_compute_dtype",
    "kv_cache_values",
    "precision_by_class",
]

KV_CACHE_METADATA_KEY = meta.MODEL_KV_CACHE  # declared in passes/meta.py

_MODES = {"fp32": DType.FLOAT32, "fp16": DType.FLOAT16, "bf16": DType.BFLOAT16}
MIXED_HALF = "bf16"
"""The 16-bit type of ``--precision mixed``: what its contractions read and its peaks are taken at
(bf16 needs no loss scaling: Kalamkar et al., arXiv 1905.12322)."""
_KV = {**_MODES, "fp8": DType.FLOAT8E4M3FN, "int8": DType.INT8}
# quantised modes: (weight dtype, dtype the block matmuls compute in)
_QUANT = {
    "int8": (DType.INT8, DType.INT8),
    "fp8": (DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FN),
    "w8a16": (DType.INT8, DType.FLOAT16),
    "w4a16": (DType.INT4, DType.FLOAT16),
}
# weight-only dequantisation: (vector FLOPs per weight element, elements per scale group or
# None for one group per output channel, bytes of scale + zero point per group)
_DEQUANT = {"w8a16": (1, None, 2.0), "w4a16": (2, 128, 2.5)}
_CHOICES = PRECISIONS  # the knob's choices are dabench_ir.options'; each has its meaning here


def compute_dtype(precision: str | DType | None) -> DType | None:
    """The dtype peak FLOP/s are taken at for a ``--precision`` value: mixed in its 16-bit type
    (`MIXED_HALF`, what the pass stores), the weight-only modes in fp16, int8 and fp8 at their own peaks."""
    if precision is None or isinstance(precision, DType):
        return precision
    key = str(precision).lower()
    if key in _QUANT:
        return _QUANT[key][1]
    if key == "mixed":
        return _MODES[MIXED_HALF]
    return DType.from_name(key)


def accumulate_dtype(graph: Graph, node: Node | None = None) -> DType | None:
    """The dtype contractions accumulate in: ``node``'s `meta.ACCUMULATE` mark when it has one,
    else the graph's rule (fp32 under ``mixed``, the 16-bit recipe's fp32 accumulation), else None
    (as the node computes: no rewrite said otherwise). The graph's rule also covers work a
    lowering computes as a contraction that is no contraction node (the WSE's one-hot token lookup)."""
    if node is not None:
        mark = node.meta.get(meta.ACCUMULATE)
        if isinstance(mark, DType):
            return mark
    return DType.FLOAT32 if meta.graph_precision(graph) == "mixed" else None


def graph_compute_dtype(graph: Graph) -> DType:
    """The dtype a graph computes in when no ``--precision`` is given (what lowerings take peaks
    at): the precision pass's per-node choice by majority, else the majority dtype of the float
    weights, inputs and activations (counted per value), else fp32."""
    votes: Counter[DType] = Counter()
    for node in graph.nodes:
        prec = node.meta.get(meta.PRECISION)
        if isinstance(prec, DType):
            votes[prec] += 1
    if not votes:
        for value in graph.values.values():
            if value.kind in (ValueKind.WEIGHT, ValueKind.INPUT, ValueKind.ACTIVATION) and value.type.dtype.is_float:
                votes[value.type.dtype] += 1
    return votes.most_common(1)[0][0] if votes else DType.FLOAT32


def dominant_storage_dtype(graph: Graph) -> str | None:
    """The float dtype holding most elements over all shaped values (a symbolic shape counts
    one), by name: what a report records as the model's precision when none was given.
    Counted per element, not per value or per node, so it can differ from `graph_compute_dtype`."""
    counts: dict[str, int] = {}
    for value in graph.values.values():
        t = value.type
        if t.shape is not None and t.dtype.is_float:
            try:
                n = t.numel(graph.bindings)
            except UserError:
                n = 1
            counts[t.dtype.short] = counts.get(t.dtype.short, 0) + n  # short: its str
    return max(counts, key=counts.__getitem__) if counts else None


def kv_cache_values(graph: Graph) -> list[str]:
    """The KV-cache inputs and new-K/V outputs of a decode graph (empty for other graphs)."""
    raw = graph.metadata.get(KV_CACHE_METADATA_KEY)
    if not raw:
        return []
    try:
        listed = json.loads(raw)
    except json.JSONDecodeError:
        return []
    names = [*listed.get("inputs", []), *listed.get("outputs", [])] if isinstance(listed, dict) else []
    return [n for n in names if n in graph.values]


_CACHE_INPUT = re.compile(r"past|cache|present", re.IGNORECASE)


def cache_inputs(graph: Graph) -> list[str]:
    """The KV-cache inputs of a decode-step model: rank-4 inputs the exporter lists in
    ``dabench.kv_cache`` (`kv_cache_values`), else named like one (``past_key_values.0.key``,
    ``cache``, ``present``): what a decode step holds from step to step."""
    listed = set(kv_cache_values(graph))
    return [
        name
        for name in graph.inputs
        if (shape := graph.values[name].type.shape) is not None
        and len(shape) == 4
        and (name in listed or _CACHE_INPUT.search(name))
    ]


def reads_kv_cache(graph: Graph) -> bool:
    """Whether ``graph`` is a decode step: it reads a KV cache of some length (`cache_inputs`; a prefill
    through a cache model binds it empty). Its next step needs its token: consecutive steps do not
    overlap in a pipeline, and a serving engine keeps a batch in each stage instead."""
    return any(graph.type_of(name).nbytes() for name in cache_inputs(graph))


@dataclass(frozen=True)
class PrecisionPass(Pass):
    """Rewrite float values to ``precision`` (see the module docstring for each mode) and the
    KV cache to ``kv``; either may be None (left as the model is).

    Writes `meta.PRECISION` (the dtype each node computes in), `meta.ACCUMULATE` on contractions
    in the float modes (fp32 under ``mixed``, else the compute dtype) and, for weight-only modes,
    the weights each matmul reads quantised (`QUANTISED`). It only rewrites types: the cost pass
    must run after it (bytes follow the dtypes), then `DequantisePass` (`dabench_ir.run.
    transform_passes` lists the three in that order).
    """

    precision: str | None
    kv: str | None = None
    name: str = "precision"

    def requires(self, graph: Graph) -> None:
        if self.precision is not None and self.precision not in _CHOICES:
            raise UserError(f"--precision {self.precision}: expected one of {', '.join(_CHOICES)}")
        if self.kv is not None and self.kv not in _KV:
            raise UserError(f"--kv-precision {self.kv}: expected one of {', '.join(KV_PRECISIONS)}")
        for node in graph.nodes:
            meta.get(node, meta.OP_CLASS)  # classify must have run
            break

    def call(self, graph: Graph) -> PassResult:
        quantised: dict[str, tuple[str, ...]] = {}
        if self.precision is not None:
            quantised = self._rewrite(graph)
            meta.graph_set(graph, meta.GRAPH_PRECISION, self.precision)
        if self.kv is not None:
            cache = kv_cache_values(graph)
            if not cache:
                raise UserError("--kv-precision needs a decode graph (dabench-ir export --phase decode)")
            for name in cache:
                value = graph.values[name]
                value.type = value.type.with_dtype(_KV[self.kv])
        if self.precision in _DEQUANT:
            for node_name, names in quantised.items():
                graph.node(node_name).meta[QUANTISED] = (self.precision, names)
        return PassResult(graph, True)

    def _rewrite(self, graph: Graph) -> dict[str, tuple[str, ...]]:
        mixed = self.precision == "mixed"
        quant = _QUANT.get(self.precision)
        low = DType.FLOAT16 if quant else _MODES[MIXED_HALF] if mixed else _MODES[self.precision]
        # A value already at ``low`` keeps its type record; the others share one new record per distinct
        # type (as the loaded graph shares them), so the cost pass after this sizes each once.
        retyped: dict[TensorType, TensorType] = {}
        for value in graph.values.values():
            t = value.type
            if t.dtype.is_float and t.dtype is not low:
                new = retyped.get(t)
                if new is None:
                    new = retyped[t] = t.with_dtype(low)
                value.type = new
        quantised = block_matmul_weights(graph) if quant else {}
        for names in quantised.values():
            for name in names:
                graph.values[name].type = graph.values[name].type.with_dtype(quant[0])
        for node in graph.nodes:
            computes = low
            if quant and node.name in quantised:
                computes = quant[1]
            elif mixed and traits_of(node).keeps_fp32:
                computes = DType.FLOAT32
                for out in node.outputs:
                    value = graph.values.get(out)
                    if value is None or value.kind is ValueKind.OUTPUT:
                        continue
                    if value.type.dtype.is_float and value.type.dtype is not DType.FLOAT32:
                        value.type = value.type.with_dtype(DType.FLOAT32)
            node.meta[meta.PRECISION] = computes
            if not quant and node.meta.get(meta.OP_CLASS) is OpClass.CONTRACTION:
                node.meta[meta.ACCUMULATE] = DType.FLOAT32 if mixed else computes
            else:
                node.meta.pop(meta.ACCUMULATE, None)
        return quantised


QUANTISED = meta.QUANTISED


@dataclass(frozen=True)
class DequantisePass(Pass):
    """Add the dequantisation work of weight-only modes (w8a16, w4a16) to the matmuls that read a
    quantised weight (`QUANTISED`, written by `PrecisionPass`). Runs after the cost pass."""

    name: str = "dequantise"

    def call(self, graph: Graph) -> PassResult:
        modified = False
        for node in graph.nodes:
            mark = node.meta.get(QUANTISED)
            if mark is None:
                continue
            mode, names = mark
            flops_per, group, group_bytes = _DEQUANT[mode]
            weight = graph.type_of(names[-1])  # the layout the matmul reads
            numel = weight.numel()
            groups = math.ceil(numel / group) if group else (weight.dims()[-1] if weight.rank else 1)
            extra = Cost(vector_flops=flops_per * numel, weight_bytes=math.ceil(groups * group_bytes))
            node.meta[meta.COST] = (meta.get_cost(node) or Cost()) + extra
            modified = True
        return PassResult(graph, modified)


def block_matmul_weights(graph: Graph) -> dict[str, tuple[str, ...]]:
    """Matmuls inside decoder blocks that read a 2-D weight -> the stored values to quantise
    (the weight and the folded layouts between it and the matmul, the matmul's own input last)."""
    found: dict[str, tuple[str, ...]] = {}
    for node in graph.nodes:
        if node.layer is None or node.meta.get(meta.OP_CLASS) is not OpClass.CONTRACTION:
            continue
        for name in node.inputs:
            value = graph.values.get(name) if name else None
            if value is None or not value.kind.is_stored or value.type.rank != 2 or not value.type.dtype.is_float:
                continue
            chain = [name]
            while value is not None and value.producer is not None:
                producer = graph.node(value.producer)
                if meta.FOLDED not in producer.meta or not producer.inputs:
                    break
                chain.append(producer.inputs[0])
                value = graph.values.get(producer.inputs[0])
            found[node.name] = tuple(reversed(chain))
    return found


def precision_by_class(graph: Graph) -> dict[str, str]:
    """Which dtype each op class computes in (``"fp32/bf16"`` when it is mixed)."""
    pairs = {(node.meta.get(meta.OP_CLASS), node.meta.get(meta.PRECISION)) for node in graph.nodes}  # a few distinct
    seen: dict[str, set[str]] = {}
    for op_class, dtype in pairs:
        if dtype is None or op_class in (None, OpClass.SHAPE):
            continue
        seen.setdefault(str(op_class), set()).add(str(dtype))
    return {k: "/".join(sorted(v)) for k, v in sorted(seen.items())}
