"""Synthesise what a model needs to run but does not carry: inputs and missing weights.

Timing does not depend on the values, only on dtypes and shapes, so inputs and absent
weights are seeded random data of the right dtype and shape, built in memory and held to a
stated byte cap. Weights may be missing in two ways:

- shape-only graph inputs that hold parameters (named in the model's ``dabench.weights``
  metadata, or declared weights in the dabench Graph): they become initializers.

An initializer whose external data is missing or cut short (the file absent, or its offset
and length past the file's end) is a broken model, not a missing weight: running it is
refused in one line (profiling without running needs no weight data).

Integer inputs get ranges that keep the model in bounds: token ids below the size of the
table they index (found from the Gather that reads them), masks of ones, positions 0..S-1.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dabench_ir.errors import UnboundSymbolError, UserError
from dabench_ir.options import DEFAULT_MAX_WEIGHT_BYTES
from dabench_ir.passes.cost_rules import op_traits
from dabench_ir.passes.meta import MODEL_WEIGHTS

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from dabench_ir.ir import Graph

__all__ = ["DEFAULT_MAX_WEIGHT_BYTES", "Prepared", "name_nodes", "prepare_model"]

logger = logging.getLogger(__name__)

# the default cap on the bytes of inputs and weights synthesised for one measurement: the options' one

_WEIGHTS_KEY = MODEL_WEIGHTS


@dataclass(slots=True)
class Prepared:
    """A runnable copy of the model, the feeds for its real inputs, and what was made up."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    synthesized: dict[str, str] = field(default_factory=dict)  # tensor -> what it was
    synthesized_bytes: int = 0


def name_nodes(model: onnx.ModelProto, graph: Graph | None = None) -> list[str]:
    """Give every node of ``model`` the name the dabench Graph knows it by (in place).

    The ONNX frontend names an unnamed node ``<op>_<index>`` and a duplicate
    ``<name>__<index>``; onnxruntime's profiler reports node names, so the copy that runs
    must carry the same ones.
    """
    from dabench_ir.frontends.onnx import onnx_node_names

    names = onnx_node_names(model.graph)
    same = graph is not None and len(graph.nodes) == len(model.graph.node)
    for index, proto in enumerate(model.graph.node):
        if same and graph.nodes[index].op_type == proto.op_type:  # type: ignore[union-attr]
            names[index] = graph.nodes[index].name  # type: ignore[union-attr]
        proto.name = names[index]
    return names


def prepare_model(
    source: onnx.ModelProto,
    *,
    path: Path | None = None,
    graph: Graph | None = None,
    dims: Mapping[str, int] | None = None,
    max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    seed: int = 0,
) -> Prepared:
    """Copy ``source`` and fill in every missing tensor; raise UserError above the cap (before
    copying anything: a 10,000-layer model's copy took 6 s only to be refused)."""
    import numpy as np
    import onnx

    bindings: dict[str, int] = dict(graph.bindings) if graph is not None else {}
    bindings.update(dims or {})
    rng = np.random.default_rng(seed)

    init_names = {init.name for init in source.graph.initializer}
    weight_inputs = _weight_inputs(source, graph) - init_names
    base = (path.parent if path is not None else Path.cwd()).resolve()

    # Plan first (shapes, bytes), copy and allocate only once the total is known to fit.
    plan: list[_Synthesised] = []
    named = _unnamed_input_dims(source, graph, init_names)
    for vi in source.graph.input:
        if vi.name in init_names:
            continue
        why = "weight (shape-only graph input)" if vi.name in weight_inputs else "input"
        shape = _shape_of(vi, bindings, named.get(vi.name, {}))
        plan.append(_Synthesised(name=vi.name, why=why, dtype=vi.type.tensor_type.elem_type, shape=shape))
    needed = sum(math.prod(t.shape) * _itemsize(t.dtype) for t in plan)
    if needed > max_weight_bytes:
        raise UserError(
            f"running the model needs {needed:,} bytes of synthesised inputs and weights, above the "
            f"cap of {max_weight_bytes:,} bytes; use smaller --dim values or raise --max-weight-bytes"
        )

    model = onnx.ModelProto()
    model.CopyFrom(source)
    g = model.graph
    for init in g.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            _check_external(init, base)
            onnx.external_data_helper.load_external_data_for_tensor(init, str(base))
            init.data_location = onnx.TensorProto.DEFAULT
            del init.external_data[:]

    bounds = _index_bounds(model, graph, bindings)
    prepared = Prepared(model=model, feeds={}, synthesized_bytes=needed)
    new_inits: list[onnx.TensorProto] = []
    for t in plan:
        prepared.synthesized[t.name] = t.why
        if t.why == "input":
            prepared.feeds[t.name] = _input_array(t.name, t.dtype, t.shape, bounds.get(t.name), rng)
        else:
            tensor = onnx.TensorProto(name=t.name, data_type=t.dtype, dims=list(t.shape))
            _fill_initializer(tensor, rng)
            new_inits.append(tensor)
    if new_inits:
        keep = [vi for vi in g.input if vi.name not in weight_inputs]
        del g.input[:]
        g.input.extend(keep)
        g.initializer.extend(new_inits)
    if prepared.synthesized:
        logger.info("synthesised %d tensors (%d bytes)", len(prepared.synthesized), needed)
    return prepared


# -- helpers --------------------------------------------------------------------------
class _Synthesised(NamedTuple):
    """A graph input the run synthesises: its name, why (an input, or a weight the file holds no
    data for), its ONNX element type and its shape with the run's bindings."""

    name: str
    why: str
    dtype: int
    shape: tuple[int, ...]


def _weight_inputs(model: onnx.ModelProto, graph: Graph | None) -> set[str]:
    names: set[str] = set()
    for prop in model.metadata_props:
        if prop.key == _WEIGHTS_KEY:
            from dabench_ir.frontends.checks import safe_name_list

            listable = (v.name for v in (*model.graph.input, *model.graph.initializer))
            names.update(safe_name_list(prop.value, _WEIGHTS_KEY, listable))
    if graph is not None:
        from dabench_ir.ir import ValueKind

        names.update(v.name for v in graph.values.values() if v.kind is ValueKind.WEIGHT)
    return names


def _shape_of(
    vi: onnx.ValueInfoProto, bindings: Mapping[str, int], named: Mapping[int, str] | None = None
) -> tuple[int, ...]:
    """An input's shape under ``bindings``; ``named``: axis -> the symbol the graph knows an unnamed
    dim of this input by (`_unnamed_input_dims`). Raises UnboundSymbolError naming what is left open."""
    ttype = vi.type.tensor_type
    if not ttype.HasField("shape"):
        raise UnboundSymbolError({f"<unknown rank of {vi.name}>"})
    shape: list[int] = []
    free: set[str] = set()
    for axis, d in enumerate(ttype.shape.dim):
        symbol = d.dim_param or (named or {}).get(axis, "")
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        elif symbol and symbol in bindings:
            shape.append(int(bindings[symbol]))
        else:
            free.add(symbol or f"<unnamed dim of {vi.name}>")
    if free:
        raise UnboundSymbolError(free)
    return tuple(shape)


def _unnamed_input_dims(
    source: onnx.ModelProto, graph: Graph | None, init_names: set[str]
) -> dict[str, dict[int, str]]:
    """Input -> axis -> the graph's symbol for each input dim of the file that has neither a size nor
    a name (``[None, 64]``): the name the frontend gave it (`frontends.onnx._name_blank_input_dims`,
    ``x_dim0``), which the unbound-symbol advice tells the user to bind."""
    out: dict[str, dict[int, str]] = {}
    for vi in source.graph.input:
        value = graph.values.get(vi.name) if graph is not None and vi.name not in init_names else None
        shape = value.type.shape if value is not None else None
        if shape is None or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.HasField("dim_value") and not d.dim_param and axis < len(shape) and isinstance(shape[axis], str):
                out.setdefault(vi.name, {})[axis] = shape[axis]
    return out


def _itemsize(onnx_dtype: int) -> int:
    from dabench_ir.ir import DType

    size = DType.from_onnx(onnx_dtype).itemsize
    if size == 0:
        import onnx

        try:
            label = onnx.TensorProto.DataType.Name(onnx_dtype)
        except ValueError:
            label = f"undefined type {onnx_dtype}"
        raise UserError(
            f"--measure cannot make input data of element type {label} (ONNX dtype {onnx_dtype}); "
            "profile this model without --measure, or give it numeric inputs"
        )
    return size


def _check_external(init: onnx.TensorProto, base: Path) -> None:
    """Refuse, in one line, an initializer whose external data file is absent (or inside no
    folder of the model's) or shorter than its offset + length: running needs its bytes."""
    from dabench_ir.fileio import resolve_inside

    entries = {e.key: e.value for e in init.external_data}
    location = entries.get("location", "")
    where = f"initializer {init.name!r}: external data {location!r}"
    fix = "--measure runs the model and needs its weights; put the data file beside the model, or drop --measure"
    target = resolve_inside(base, location, where)
    try:
        size = os.stat(target).st_size if target.is_file() else None
        end = int(entries.get("offset", 0) or 0) + int(entries.get("length", 0) or 0)
    except (OSError, ValueError):
        size, end = None, 0
    if size is None:
        raise UserError(f"{where}: no such file next to the model; {fix}")
    need = end if "length" in entries else int(entries.get("offset", 0) or 0) + _nbytes(init)
    if size < need:
        raise UserError(f"{where}: the file has {size:,} bytes, the tensor ends at byte {need:,}; {fix}")


def _nbytes(init: onnx.TensorProto) -> int:
    return math.prod(init.dims) * _itemsize(init.data_type)


def _random_floats(shape: tuple[int, ...], name: str, rng: np.random.Generator) -> np.ndarray:
    import numpy as np

    data = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    if len(shape) == 1 and ("norm" in name.lower() or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))):
        data += np.float32(1.0)  # normalisation gains sit around one
    return data


def _fill_initializer(tensor: onnx.TensorProto, rng: np.random.Generator) -> None:
    """Give ``tensor`` seeded random inline data of its own dtype and shape."""
    import numpy as np
    import onnx

    shape = tuple(tensor.dims)
    dtype = tensor.data_type
    if dtype == onnx.TensorProto.BFLOAT16:
        raw = (_random_floats(shape, tensor.name, rng).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    else:
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
        if np.issubdtype(np_dtype, np.floating):
            raw = _random_floats(shape, tensor.name, rng).astype(np_dtype).tobytes()
        elif np_dtype == np.bool_:
            raw = np.ones(shape, dtype=np.bool_).tobytes()
        else:
            raw = rng.integers(0, 2, size=shape).astype(np_dtype).tobytes()
    for fname in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(fname)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = raw


def _input_array(
    name: str, dtype: int, shape: tuple[int, ...], bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    import numpy as np
    import onnx

    if dtype == onnx.TensorProto.BFLOAT16:
        raise UserError(f"graph input {name!r} is bf16, which numpy cannot feed; export with fp32 inputs")
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    lower = name.lower()
    if np.issubdtype(np_dtype, np.floating):
        if "mask" in lower:
            return np.zeros(shape, dtype=np_dtype)  # additive mask: nothing masked
        return rng.standard_normal(shape, dtype=np.float32).astype(np_dtype)
    if np_dtype == np.bool_ or "mask" in lower:
        return np.ones(shape, dtype=np_dtype)
    if "position" in lower and shape:
        high = bound or shape[-1]
        pos = np.arange(shape[-1]) % max(high, 1)
        return np.broadcast_to(pos, shape).astype(np_dtype).copy()
    high = bound if bound is not None else 2
    return rng.integers(0, max(high, 1), size=shape).astype(np_dtype)


def _index_bounds(model: onnx.ModelProto, graph: Graph | None, bindings: Mapping[str, int]) -> dict[str, int]:
    """For integer graph inputs: the size of the smallest table a Gather indexes with them."""
    g = model.graph
    shapes: dict[str, tuple[Any, ...]] = {init.name: tuple(init.dims) for init in g.initializer}
    for vi in (*g.input, *g.value_info):
        if vi.name not in shapes and vi.type.tensor_type.HasField("shape"):
            shapes[vi.name] = tuple(
                d.dim_value if d.HasField("dim_value") else bindings.get(d.dim_param)
                for d in vi.type.tensor_type.shape.dim
            )
    if graph is not None:
        for value in graph.values.values():
            if value.name not in shapes and value.type.shape is not None:
                shapes[value.name] = tuple(bindings.get(d) if isinstance(d, str) else d for d in value.type.shape)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    bounds: dict[str, int] = {}
    for vi in g.input:
        frontier, seen = [vi.name], set()
        for _ in range(4):  # follow Cast/Reshape/... a few steps
            nxt: list[str] = []
            for tensor in frontier:
                for node in consumers.get(tensor, []):
                    if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
                        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                        table = shapes.get(node.input[0])
                        if table and -len(table) <= axis < len(table) and isinstance(table[axis], int):
                            size = table[axis]
                            bounds[vi.name] = min(bounds.get(vi.name, size), size)
                    elif op_traits(node.op_type, node.domain).keeps_values and node.input and node.input[0] == tensor:
                        nxt.extend(o for o in node.output if o not in seen)
            seen.update(nxt)
            frontier = nxt
    return bounds
