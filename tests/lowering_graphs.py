"""Hand-built, already-costed decoder graphs for the lowering, emulation and metrics tests.

The graphs are GPT-2-like (LayerNorm, q/k/v/o projections, attention matmuls, softmax,
GELU MLP, residual adds) with exporter-style scopes, and each node's Cost is written
straight into its meta by closed-form formulas, so these tests need neither ONNX nor the
cost pass and run in milliseconds.
"""

from __future__ import annotations

from dabench_ir.ir import Cost, DType, Graph, Node, TensorType, Value, ValueKind
from dabench_ir.passes import meta

__all__ = ["chain", "decoder"]


class _Builder:
    def __init__(self, dtype: DType) -> None:
        self.dtype = dtype
        self.nodes: list[Node] = []
        self.values: dict[str, Value] = {}

    def value(self, name: str, shape: tuple[int, ...], kind: ValueKind, producer: str | None = None) -> str:
        self.values[name] = Value(name, TensorType(shape, self.dtype), kind, producer)
        return name

    def node(
        self,
        name: str,
        op: str,
        inputs: list[str],
        out_shape: tuple[int, ...],
        cost: Cost,
        scope: str,
        layer: int | None,
    ) -> str:
        out = self.value(f"{name}_out", out_shape, ValueKind.ACTIVATION, name)
        node = Node(name, op, inputs=inputs, outputs=[out], scope=scope, layer=layer)
        node.meta[meta.COST] = cost
        self.nodes.append(node)
        return out

    def nbytes(self, shape: tuple[int, ...]) -> int:
        n = self.dtype.itemsize
        for d in shape:
            n *= d
        return n


def decoder(
    layers: int = 2, hidden: int = 64, seq: int = 16, batch: int = 1, heads: int = 4, dtype: DType = DType.FLOAT16
) -> Graph:
    """A GPT-2-style decoder stack with closed-form costs on every node."""
    b = _Builder(dtype)
    tok = (batch, seq, hidden)
    x = b.value("x", tok, ValueKind.INPUT)
    act = b.nbytes(tok)

    def linear(name: str, inp: str, n_in: int, n_out: int, scope: str, layer: int) -> str:
        w = b.value(f"{name}.weight", (n_in, n_out), ValueKind.WEIGHT)
        out_shape = (batch, seq, n_out)
        cost = Cost(
            contraction_flops=2 * batch * seq * n_in * n_out,
            weight_bytes=b.nbytes((n_in, n_out)),
            act_bytes_in=b.nbytes((batch, seq, n_in)),
            act_bytes_out=b.nbytes(out_shape),
        )
        return b.node(name, "MatMul", [inp, w], out_shape, cost, scope, layer)

    def vector(name: str, op: str, inputs: list[str], flops_per: int, scope: str, layer: int | None) -> str:
        n = batch * seq * hidden
        cost = Cost(vector_flops=flops_per * n, act_bytes_in=act * len(inputs), act_bytes_out=act)
        return b.node(name, op, inputs, tok, cost, scope, layer)

    for i in range(layers):
        p = f"layers.{i}"
        h = vector(f"{p}.ln1", "LayerNormalization", [x], 8, f"{p}.ln1", i)
        q = linear(f"{p}.attn.q_proj", h, hidden, hidden, f"{p}.attn.q_proj", i)
        k = linear(f"{p}.attn.k_proj", h, hidden, hidden, f"{p}.attn.k_proj", i)
        v = linear(f"{p}.attn.v_proj", h, hidden, hidden, f"{p}.attn.v_proj", i)
        s_shape = (batch, heads, seq, seq)
        s = b.node(
            f"{p}.attn.qk",
            "MatMul",
            [q, k],
            s_shape,
            Cost(
                contraction_flops=2 * batch * seq * seq * hidden, act_bytes_in=2 * act, act_bytes_out=b.nbytes(s_shape)
            ),
            f"{p}.attn",
            i,
        )
        sm = b.node(
            f"{p}.attn.softmax",
            "Softmax",
            [s],
            s_shape,
            Cost(
                vector_flops=4 * batch * heads * seq * seq,
                special_ops=batch * heads * seq * seq,
                act_bytes_in=b.nbytes(s_shape),
                act_bytes_out=b.nbytes(s_shape),
            ),
            f"{p}.attn",
            i,
        )
        a = b.node(
            f"{p}.attn.av",
            "MatMul",
            [sm, v],
            tok,
            Cost(
                contraction_flops=2 * batch * seq * seq * hidden,
                act_bytes_in=b.nbytes(s_shape) + act,
                act_bytes_out=act,
            ),
            f"{p}.attn",
            i,
        )
        o = linear(f"{p}.attn.o_proj", a, hidden, hidden, f"{p}.attn.o_proj", i)
        r1 = vector(f"{p}.add1", "Add", [x, o], 1, p, i)
        h2 = vector(f"{p}.ln2", "LayerNormalization", [r1], 8, f"{p}.ln2", i)
        f1 = linear(f"{p}.mlp.fc1", h2, hidden, 4 * hidden, f"{p}.mlp.fc1", i)
        g = b.node(
            f"{p}.mlp.gelu",
            "Gelu",
            [f1],
            (batch, seq, 4 * hidden),
            Cost(vector_flops=8 * batch * seq * 4 * hidden, act_bytes_in=4 * act, act_bytes_out=4 * act),
            f"{p}.mlp",
            i,
        )
        f2 = linear(f"{p}.mlp.fc2", g, 4 * hidden, hidden, f"{p}.mlp.fc2", i)
        x = vector(f"{p}.add2", "Add", [r1, f2], 1, p, i)
    return Graph(b.nodes, b.values, ["x"], [x], name=f"decoder-L{layers}-H{hidden}", bindings={"batch": batch})


def chain(flops: list[int], nbytes: list[int], dtype: DType = DType.FLOAT32) -> Graph:
    """A straight chain of nodes with the given FLOPs and bytes (activations in/out halves)."""
    b = _Builder(dtype)
    x = b.value("x", (1,), ValueKind.INPUT)
    for i, (f, n) in enumerate(zip(flops, nbytes, strict=True)):
        x = b.node(
            f"n{i}",
            "Op",
            [x],
            (1,),
            Cost(contraction_flops=f, act_bytes_in=n // 2, act_bytes_out=n - n // 2),
            f"op{i}",
            None,
        )
    return Graph(b.nodes, b.values, ["x"], [x], name="chain")
