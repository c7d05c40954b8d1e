"""Precision rewrite: fp32, fp16, bf16 or mixed, as a pass that rewrites dtypes on the graph.

Mixed precision follows the usual recipe (Micikevicius et al., "Mixed Precision Training",
ICLR 2018; NVIDIA's automatic mixed precision lists): matmuls, convolutions and the
activations between them in half precision; softmax, normalisations, reductions and
transcendental-heavy ops compute in fp32 and write fp32 (the ops whose `OpTraits.keeps_fp32`
is set in passes/cost_rules.py); master weights stay fp32 (they matter in training, see
passes/training.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from dabench_ir.errors import UserError
from dabench_ir.ir import DType, Graph, ValueKind

from . import meta
from .base import Pass, PassResult
from .cost_rules import OpClass, traits_of
from .passes import CostPass

__all__ = ["PrecisionPass", "precision_by_class"]

_MODES = {"fp32": DType.FLOAT32, "fp16": DType.FLOAT16, "bf16": DType.BFLOAT16}


@dataclass(frozen=True)
class PrecisionPass(Pass):
    """Rewrite every float value to ``precision``; ``mixed`` keeps the ops with `OpTraits.keeps_fp32` in fp32.

    Writes `meta.PRECISION` (the dtype each node computes in) and re-costs the graph,
    since bytes follow the dtypes.
    """

    precision: str
    half: str = "bf16"  # the half type of ``mixed``
    name: str = "precision"

    def requires(self, graph: Graph) -> None:
        if self.precision not in (*_MODES, "mixed"):
            raise UserError(f"--precision {self.precision}: expected fp32, fp16, bf16 or mixed")
        for node in graph.nodes:
            meta.get(node, meta.OP_CLASS)  # classify must have run
            break

    def call(self, graph: Graph) -> PassResult:
        mixed = self.precision == "mixed"
        low = _MODES[self.half] if mixed else _MODES[self.precision]
        for value in graph.values.values():
            if value.type.dtype.is_float:
                value.type = value.type.with_dtype(low)
        for node in graph.nodes:
            computes = low
            if mixed and traits_of(node).keeps_fp32:
                computes = DType.FLOAT32
                for out in node.outputs:
                    value = graph.values.get(out)
                    if value is not None and value.type.dtype.is_float and value.kind is not ValueKind.OUTPUT:
                        value.type = value.type.with_dtype(DType.FLOAT32)
            node.meta[meta.PRECISION] = computes
        meta.graph_set(graph, meta.GRAPH_PRECISION, self.precision)
        CostPass()(graph)  # bytes follow the new dtypes
        return PassResult(graph, True)


def precision_by_class(graph: Graph) -> dict[str, str]:
    """Which dtype each op class computes in (``"fp32/bf16"`` when it is mixed)."""
    seen: dict[str, set[str]] = {}
    for node in graph.nodes:
        dtype = node.meta.get(meta.PRECISION)
        op_class = node.meta.get(meta.OP_CLASS)
        if dtype is None or op_class in (None, OpClass.SHAPE):
            continue
        seen.setdefault(str(op_class), set()).add(str(dtype))
    return {k: "/".join(sorted(v)) for k, v in sorted(seen.items())}
