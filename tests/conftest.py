"""Shared helpers: build tiny ONNX graphs from text and cost them."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

from dabench_ir.ir import Cost, Graph
from dabench_ir.passes import meta


def parse(text: str, opset: int = 18) -> onnx.ModelProto:
    """An ONNX model from the textual syntax; the header is added when missing."""
    if not text.lstrip().startswith("<"):
        text = f'<ir_version: 9, opset_import: ["" : {opset}]>\n' + text
    return onnx.parser.parse_model(text)


def analyze_text(text: str, dims: dict[str, int] | None = None, opset: int = 18) -> Graph:
    from dabench_ir.pipeline import analyze

    return analyze(parse(text, opset), dims=dims)


def rewrite(graph: Graph, **options) -> Graph:
    """``graph`` through the rewrites a run with ``options`` applies after costing (precision, then the
    costs again, fused attention, training), as `dabench_ir.run` lists them."""
    from dabench_ir.options import ProfileOptions
    from dabench_ir.passes import PassManager
    from dabench_ir.run import transform_passes

    return PassManager(transform_passes(ProfileOptions(**options)))(graph).graph


def node_cost(graph: Graph, index: int = 0) -> Cost | None:
    return meta.get_cost(graph.nodes[index])


def attention_text(x: str, v: str, out: str) -> str:
    """The nodes, in ONNX text, of one head of self-attention on ``x`` with weights ``Wq`` and ``Wk``:
    ``out`` = softmax(q kᵀ) ``v``, q = x Wq and k = x Wk, kᵀ by a Transpose (as exporters write it)."""
    return f"""
        q = MatMul({x}, Wq)
        k = MatMul({x}, Wk)
        kt = Transpose<perm=[0,2,1]>(k)
        s = MatMul(q, kt)
        p = Softmax<axis=-1>(s)
        {out} = MatMul(p, {v})
    """


def report_flags(stem) -> list[str]:
    """``--json``, ``--csv`` and ``--html`` to ``stem``.json, .csv and .html: every table format a command writes."""
    return [arg for fmt in ("json", "csv", "html") for arg in (f"--{fmt}", f"{stem}.{fmt}")]


@pytest.fixture
def tiny_matmul_path(tmp_path):
    model = parse(
        """
        agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) {
            C = MatMul(A, B)
        }
        """
    )
    path = tmp_path / "mm.onnx"
    onnx.save(model, path)
    return path


def property_settings(env: str, examples: int):
    """Hypothesis settings of the property suites: ``examples`` cases (``env`` overrides), no deadline,
    fixed examples in CI (``DABENCH_FUZZ_RANDOM`` set: explore), no example database."""
    import os

    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=int(os.environ.get(env, str(examples))),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=not os.environ.get("DABENCH_FUZZ_RANDOM"),
    )
