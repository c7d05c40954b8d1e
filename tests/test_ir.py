"""Core IR types: dtypes, symbolic shapes, the summable Cost, layer tags, the networkx view."""

from __future__ import annotations

import pytest

from dabench_ir.errors import UnboundSymbolError
from dabench_ir.ir import Cost, DType, TensorType, layer_from_scope
from tests.conftest import analyze_text


def test_dtype_sizes_and_lookup():
    assert DType.FLOAT32.itemsize == 4
    assert DType.BFLOAT16.itemsize == 2
    assert DType.from_onnx(10) is DType.FLOAT16
    assert DType.from_name("bfloat16") is DType.BFLOAT16
    assert DType.from_name("fp16") is DType.FLOAT16
    with pytest.raises(ValueError):
        DType.from_name("fp7")


def test_symbolic_shapes_bind_and_report_every_unbound_symbol():
    t = TensorType(("batch", "seq", 64), DType.FLOAT16)
    assert t.symbols == {"batch", "seq"}
    assert t.nbytes({"batch": 2, "seq": 8}) == 2 * 8 * 64 * 2
    assert t.bind({"batch": 2}).shape == (2, "seq", 64)
    with pytest.raises(UnboundSymbolError) as err:
        t.numel({"batch": 2})
    assert err.value.symbols == {"seq"}
    assert "--seq N" in str(err.value)  # a sequence length answers to --seq


def test_cost_sums_field_by_field():
    a = Cost(contraction_flops=10, vector_flops=2, special_ops=1, weight_bytes=4, act_bytes_in=8, act_bytes_out=16)
    b = Cost(contraction_flops=5, act_bytes_out=4)
    total = sum([a, b])
    assert total == Cost(15, 2, 1, 4, 8, 20)
    assert total.flops == 18
    assert total.bytes == 32
    assert total.intensity == pytest.approx(18 / 32)
    assert Cost().intensity is None
    assert a.scale(2).contraction_flops == 20


@pytest.mark.parametrize(
    ("scope", "layer"),
    [
        ("layers.3.attn.q_proj", 3),
        ("model.layers.12.mlp", 12),
        ("h.0.attn", 0),
        ("/layers.7/attn/MatMul", 7),
        ("transformer.blocks.2", 2),
        ("lm_head", None),
        ("layers", None),
        ("player.1", None),
    ],
)
def test_layer_from_scope(scope, layer):
    assert layer_from_scope(scope) == layer


def test_graph_networkx_view_follows_values():
    g = analyze_text(
        """
        agraph (float[4] x) => (float[4] z) {
            y = Relu(x)
            z = Add(y, y)
        }
        """
    )
    dg = g.to_networkx()
    names = [n.name for n in g.nodes]
    assert list(dg.edges) == [(names[0], names[1])]
    assert dg.edges[names[0], names[1]]["values"] == ["y"]
    assert [c.name for c in g.consumers["y"]] == [names[1]]


def test_batch_dim_and_size():
    g = analyze_text("agraph (float[batch,4] x) => (float[batch,4] y) { y = Relu(x) }", dims={"batch": 3})
    assert g.batch_dim == "batch" and g.batch_size == 3
    g = analyze_text("agraph (float[2,4,8] x) => (float[2,4,8] y) { y = Relu(x) }")
    assert g.batch_dim == 2 and g.batch_size == 2  # a batch of sequences of 8-wide vectors
    g = analyze_text("agraph (int64[2,4] ids) => (int64[2,4] y) { y = Identity(ids) }")
    assert g.batch_dim == 2 and g.batch_size == 2  # token ids: batch x sequence
    g = analyze_text("agraph (float[2,4] x) => (float[2,4] y) { y = Relu(x) }")
    assert g.batch_dim is None and g.batch_size is None  # a plain matrix is one sample, not 2
