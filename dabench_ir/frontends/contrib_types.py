"""Output types of the onnxruntime contrib ops that ONNX shape inference does not know.

Optimisers (onnxscript's `optimize_for_ort`, onnxruntime's transformer optimiser) write
`com.microsoft` ops without types on their outputs, and ONNX shape inference stops at them,
so every node after a fused attention would lose its shapes too. `complete_contrib_types`
adds the outputs' types from the kernels' documented shapes (onnxruntime ContribOperators.md)
and runs shape inference again, until nothing more is learnt.

Each function here is an op's ``output_types`` trait, declared with the op's registration
in `passes/cost_rules.py`: (node, input (shape, elem type) list) -> output (shape, elem type)
list.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

__all__ = ["complete_contrib_types", "has_contrib_ops"]

logger = logging.getLogger(__name__)

Dim = int | str
Shape = list[Dim]
_FLOAT = 1
_UINT8 = 2


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _add(*dims: Dim) -> Dim | None:
    """The sum of dims when all are known integers (None otherwise)."""
    return sum(dims) if all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]


def _div(d: Dim, k: int) -> Dim | None:
    return d // k if isinstance(d, int) and k else None


def same(node, ins):
    """Every output as input 0."""
    return [ins[0]] * len(node.output)


def skip_norm(node, ins):
    shape, dtype = ins[0]
    stats = ([*shape[:-1], 1], _FLOAT)
    return [(shape, dtype), stats, stats, (shape, dtype)][: len(node.output)]


def simplified_norm(node, ins):
    shape, dtype = ins[0]
    return [(shape, dtype), ([*shape[:-1], 1], _FLOAT)][: len(node.output)]


def _kv_heads_len(node, ins, key_i: int, past_i: int) -> Dim | None:
    """Keys in the present K/V: past + new (None when unknown)."""
    q = ins[0][0]
    if len(ins) > key_i and ins[key_i] is not None:
        key = ins[key_i][0]
        new = key[2] if len(key) == 4 else key[1]
    else:
        new = q[1]
    past = ins[past_i][0][2] if len(ins) > past_i and ins[past_i] is not None else 0
    return _add(past, new)


def mha(node, ins):
    (q, dtype) = ins[0]
    heads = int(_attr(node, "num_heads", 1))
    if len(q) == 5:  # packed QKV [B, S, N, 3, H]
        head = q[4]
        dv = _add(*([head] * heads)) if isinstance(head, int) else None
    else:
        head = _div(q[-1], heads)
        value = ins[2][0] if len(ins) > 2 and ins[2] is not None else None
        if value is not None and len(value) == 3:
            dv = value[2]
        elif value is not None and len(value) == 4:
            dv = value[1] * value[3] if isinstance(value[1], int) and isinstance(value[3], int) else None
        else:
            dv = q[-1]
    out = [([q[0], q[1], dv], dtype)]
    total = _kv_heads_len(node, ins, 1, 6)
    present = ([q[0], heads, total, head], dtype)
    return ([*out, present, present])[: len(node.output)]


def gqa(node, ins):
    (q, dtype) = ins[0]
    heads, kv_heads = int(_attr(node, "num_heads", 1)), int(_attr(node, "kv_num_heads", 1))
    packed = not (len(ins) > 1 and ins[1] is not None)
    head = _div(q[-1], heads + 2 * kv_heads) if packed else _div(q[-1], heads)
    width = head * heads if isinstance(head, int) else None
    past = ins[3][0][2] if len(ins) > 3 and ins[3] is not None else 0
    present = ([q[0], kv_heads, _add(past, q[1]), head], dtype)
    return [([q[0], q[1], width], dtype), present, present][: len(node.output)]


def attention(node, ins):
    (x, dtype) = ins[0]
    width = ins[1][0][-1]
    heads = int(_attr(node, "num_heads", 1))
    sizes = _attr(node, "qkv_hidden_sizes") or ([width // 3] * 3 if isinstance(width, int) else [None] * 3)
    past = ins[4][0][3] if len(ins) > 4 and ins[4] is not None else 0
    present = ([2, x[0], heads, _add(past, x[1]), _div(sizes[1], heads) if sizes[1] else None], dtype)
    return [([x[0], x[1], sizes[2]], dtype), present][: len(node.output)]


def fused_matmul(node, ins):
    (a, dtype), (b, _) = ins[0], ins[1]
    m = a[-1] if _attr(node, "transA", 0) else a[-2]
    n = b[-2] if _attr(node, "transB", 0) else b[-1]
    batch = a[:-2] if len(a) >= len(b) else b[:-2]
    return [([*list(batch), m, n], dtype)]


def fused_gemm(node, ins):
    (a, dtype), (b, _) = ins[0], ins[1]
    m = a[1] if _attr(node, "transA", 0) else a[0]
    n = b[0] if _attr(node, "transB", 0) else b[1]
    return [([m, n], dtype)]


def matmul_nbits(node, ins):
    (a, dtype) = ins[0]
    return [([*a[:-1], int(_attr(node, "N"))], dtype)]


def quantize(node, ins):
    zp = ins[2][1] if len(ins) > 2 and ins[2] is not None else _UINT8
    return [(ins[0][0], zp)]


def dequantize(node, ins):
    return [(ins[0][0], ins[1][1])]


def has_contrib_ops(model: onnx.ModelProto) -> bool:
    """Whether any node is a com.microsoft op (or an onnx-domain op ONNX has no schema for here)."""
    return any(n.domain == "com.microsoft" or n.op_type == "SimplifiedLayerNormalization" for n in model.graph.node)


def _known(model: onnx.ModelProto) -> dict[str, tuple[Shape, int]]:
    g = model.graph
    out: dict[str, tuple[Shape, int]] = {}
    for init in g.initializer:
        out[init.name] = (list(init.dims), init.data_type)
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        if not t.HasField("shape") or not t.elem_type:
            continue
        dims: Shape = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.dim_param:
                dims.append(d.dim_param)
            else:
                break
        else:
            out[vi.name] = (dims, t.elem_type)
    return out


def complete_contrib_types(model: onnx.ModelProto, *, rounds: int = 16) -> onnx.ModelProto:
    """``model`` with types on the outputs of its contrib ops, and shape inference run after them."""
    import onnx

    from dabench_ir.passes.cost_rules import op_traits

    for _ in range(rounds):
        known = _known(model)
        added = 0
        for node in model.graph.node:
            if node.domain not in ("com.microsoft", ""):
                continue
            rule = op_traits(node.op_type, node.domain).output_types
            if rule is None:
                continue
            missing = [o for o in node.output if o and o not in known]
            if not missing or not node.input or node.input[0] not in known:
                continue
            ins = [known.get(i) if i else None for i in node.input]
            try:
                outs = rule(node, ins)
            except (IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
                logger.debug("no output types for %s (%s): %s", node.name, node.op_type, exc)
                continue
            for name, (shape, dtype) in zip(node.output, outs, strict=False):
                if not name or name in known or any(d is None for d in shape):
                    continue
                model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, dtype, shape))
                known[name] = (shape, dtype)
                added += 1
        if not added:
            break
        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception as exc:  # best effort, as in the frontend
            logger.debug("shape inference after contrib types failed: %s", exc)
            break
    return model
