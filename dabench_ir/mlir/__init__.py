"""The MLIR path: models read through torch-mlir, costed from linalg, studied through MLIR passes.

- `load` — into a Graph: `.mlir` files (`load_mlir`) and ONNX imported by torch-mlir and lowered
  to linalg on tensors (`onnx_via_mlir`, `attach_mlir`), and the MLIR plumbing the package
  shares (context, parsing, first diagnostic, held stderr, graph nodes from ops).
- `count` — formula-free counts of a linalg module (`count_module`: iteration domain × payload
  arithmetic, bytes read and written), where each op came from (`origin_of`), and the pass that
  sums them onto graph nodes (`LinalgCostPass`, the ``linalg-cost`` pass of ``--via mlir``).
- `pipelines` — upstream MLIR passes run one at a time on the linalg module and costed after
  each (`run_mlir_pipeline`), with op-level provenance, per-node splits (`split_by_nodes`) and
  the module as a graph of units for the lowerings (`unit_graph`).

Dependencies run one way: `count` ← `load` ← `pipelines`. torch-mlir is imported lazily,
inside the functions that need it, never when this package is imported.
"""

from __future__ import annotations

from dabench_ir.mlir.count import (
    BUFFER_VIEWS,
    LINALG_COUNTS,
    MLIR_ARTIFACT,
    MLIR_CLASS,
    MLIR_OPS,
    UNATTRIBUTED_NODE,
    VIEW_OPS,
    LinalgCostPass,
    MlirArtifact,
    OpCount,
    Origin,
    assign_costs,
    count_module,
    node_keys,
    origin_keys,
    origin_of,
    tensor_type_of,
)
from dabench_ir.mlir.load import (
    attach_mlir,
    entry_func,
    import_onnx,
    load_mlir,
    lower_to_linalg,
    mlir_asm,
    mlir_context,
    onnx_via_mlir,
    parse_mlir,
    prepare_onnx,
)
from dabench_ir.mlir.pipelines import (
    MlirPassError,
    ModuleCost,
    PassStep,
    PipelineRecord,
    is_view,
    module_cost,
    parse_pipeline,
    run_mlir_pipeline,
    split_by_nodes,
    unit_graph,
    unit_names,
)

__all__ = [
    "BUFFER_VIEWS",
    "LINALG_COUNTS",
    "MLIR_ARTIFACT",
    "MLIR_CLASS",
    "MLIR_OPS",
    "UNATTRIBUTED_NODE",
    "VIEW_OPS",
    "LinalgCostPass",
    "MlirArtifact",
    "MlirPassError",
    "ModuleCost",
    "OpCount",
    "Origin",
    "PassStep",
    "PipelineRecord",
    "assign_costs",
    "attach_mlir",
    "count_module",
    "entry_func",
    "import_onnx",
    "is_view",
    "load_mlir",
    "lower_to_linalg",
    "mlir_asm",
    "mlir_context",
    "module_cost",
    "node_keys",
    "onnx_via_mlir",
    "origin_keys",
    "origin_of",
    "parse_mlir",
    "parse_pipeline",
    "prepare_onnx",
    "run_mlir_pipeline",
    "split_by_nodes",
    "tensor_type_of",
    "unit_graph",
    "unit_names",
]
