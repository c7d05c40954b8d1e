"""Cross-check: ONNX-rule costs against linalg-level costs on exported GPT-2 and LLaMA blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch_mlir")
pytest.importorskip("torch")

from dabench_ir.crosscheck import cross_check, render_cross_check
from dabench_ir.mlir import onnx_via_mlir
from dabench_ir.passes import meta
from dabench_ir.pipeline import analyze
from tests._helpers import weightless


def _costed_load_mlir(*args, **kwargs):
    """Frontends only load: the linalg cost pass counts."""
    from dabench_ir.mlir import LinalgCostPass, load_mlir

    return LinalgCostPass()(load_mlir(*args, **kwargs)).graph


def _costed_onnx_via_mlir(*args, **kwargs):
    from dabench_ir.mlir import LinalgCostPass

    return LinalgCostPass()(onnx_via_mlir(*args, **kwargs)).graph


pytestmark = [pytest.mark.slow, pytest.mark.torch]

# Vector-op differences the docs explain (docs/mlir.md): softmax's max reduction also
# tracks the argmax index; sigmoid lowers to negate, exp, add, divide; the tanh GELU's x³ is two
# multiplies as written, one in the rule's Horner form.
EXPLAINED = {"Softmax", "Sigmoid", "Gelu"}


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def exported(request, tmp_path_factory):
    family = request.param
    path = tmp_path_factory.mktemp(family) / f"{family}.onnx"
    return family, Path(weightless(path, family=family, layers=2, hidden=32, heads=2, seq=4))


def test_contraction_flops_agree_on_every_node(exported):
    _, path = exported
    result = cross_check(analyze(path), _costed_onnx_via_mlir(path))
    assert result.nodes_compared > 20
    assert not result.contraction_disagreeing, render_cross_check(result)
    assert not result.only_mlir, result.notes  # every linalg op traced back to an ONNX node
    unexplained = [r for r in result.compared if not r.agrees and r.op_type not in EXPLAINED]
    assert not unexplained, render_cross_check(result)


def test_special_ops_agree_on_every_node(exported):
    """Transcendentals are what a GPU times at its SFU rate: both paths count the same on every node. A
    small whole power (the GELU's x³, an RMS norm's x²) is multiplies on both (math.fpowi had been a
    special op on the linalg path: 2 a GELU element against the rule's 1)."""
    _, path = exported
    onnx_graph, mlir_graph = analyze(path), _costed_onnx_via_mlir(path)
    mlir_costs = {n.name: meta.get_cost(n) for n in mlir_graph.nodes if meta.get_cost(n) is not None}
    compared = [
        (n.name, meta.get_cost(n).special_ops, mlir_costs[n.name].special_ops)
        for n in onnx_graph.nodes
        if n.name in mlir_costs and meta.get_cost(n) is not None
    ]
    assert len(compared) > 20 and all(a == b for _, a, b in compared), [c for c in compared if c[1] != c[2]]


def test_render_has_summary(exported):
    _, path = exported
    text = render_cross_check(cross_check(analyze(path), _costed_onnx_via_mlir(path)), show="all")
    assert "nodes compared:" in text and "nodes agreeing exactly:" in text
    assert "largest relative difference:" in text
    assert "contraction FLOPs: agree on every node" in text


def test_the_two_paths_agree_on_weight_bytes(tmp_path):
    """A linear layer's Transpose(W) is folded on both paths; on linalg its reader had counted the
    transposed weight as activation bytes, so --via mlir kept 13,440 of a tiny GPT-2's 406,536 B of
    weights (docs/mlir.md: the paths agree on weight bytes)."""
    pytest.importorskip("torch_mlir")
    from dabench_ir import api
    from tests._helpers import weightless

    path = weightless(tmp_path / "gpt2.onnx", family="gpt2", layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=1)
    onnx_w = api.profile(path).totals["weight_bytes"]
    mlir_w = api.profile(path, via="mlir").totals["weight_bytes"]
    assert mlir_w == pytest.approx(onnx_w, rel=1e-3)


@pytest.mark.parametrize("target", [None, "h100"])
def test_a_folded_constant_is_read_as_stored_on_both_paths(tmp_path, target):
    """GPT-2's causal mask is a constant subgraph both paths fold: on the ONNX path its Add reads it as
    stored bytes; on linalg it had stayed an activation (8.4 MB of GPT-2 small's weight bytes apart at
    seq 1024), and under an H100's fused attention it was dropped as an on-chip intermediate."""
    pytest.importorskip("torch_mlir")
    from dabench_ir import api
    from tests._helpers import weightless

    # at 256 positions the exporter leaves the mask a Trilu of a constant, which both paths fold
    path = weightless(tmp_path / "gpt2.onnx", family="gpt2", layers=1, hidden=64, heads=4, seq=256, vocab=128, batch=1)
    onnx_nodes = {n.name: n for n in api.profile(path, target=target).nodes}
    mlir_nodes = {n.name: n for n in api.profile(path, target=target, via="mlir").nodes}
    elementwise = [k for k, n in onnx_nodes.items() if n.op_type in ("Add", "Mul") and k in mlir_nodes]
    masked = [
        k for k in elementwise if onnx_nodes[k].cost.weight_bytes >= 256 * 256 * 2
    ]  # the S x S mask, 16-bit or more
    assert masked
    for name in masked:
        assert mlir_nodes[name].cost.weight_bytes == onnx_nodes[name].cost.weight_bytes, name
