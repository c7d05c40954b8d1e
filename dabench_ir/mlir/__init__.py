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
- `annotate` — ``dabench.*`` attributes on a module's counted ops and the header the loader reads
  back (`annotate_ops`, `header_lines`), for `dabench_ir.annotate.annotate_mlir`; imported by it,
  not here.

Dependencies run one way: `count` ← `load` ← `pipelines` ← `annotate`. torch-mlir is imported lazily,
inside the functions that need it, never when this package is imported.
"""

from __future__ import annotations

from dabench_ir.mlir import count, load, pipelines
from dabench_ir.mlir.count import *  # noqa: F403
from dabench_ir.mlir.load import *  # noqa: F403
from dabench_ir.mlir.pipelines import *  # noqa: F403

__all__ = [*count.__all__, *load.__all__, *pipelines.__all__]
"""The package offers what each module offers (its ``__all__``): a name is listed once, in its module."""
