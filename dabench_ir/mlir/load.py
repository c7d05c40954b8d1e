"""Loading into a Graph: `.mlir` files (torch dialect or linalg) and ONNX imported through torch-mlir.

Both paths end in linalg on tensors, counted by `dabench_ir.mlir.count` (no per-op
formulas), and produce the same `Graph` type as the ONNX frontend:

- `load_mlir(path_or_text)`: one node per origin recovered from op locations (an ONNX
  node name, or an fx ``file:line`` call site), wired by the SSA values between them.
- `onnx_via_mlir(model, dims)`: the ONNX frontend's graph (names, scopes, layers, edges)
  with every node's cost replaced by the sum of the linalg ops that carry its name;
  `attach_mlir(graph, model, dims)` the same for a graph already loaded (a run binds its
  batch and sequence on the ONNX graph first: `pipeline.load_graph`).

Also the MLIR plumbing the package shares: `mlir_context`, `parse_mlir`, `first_diagnostic`,
`captured_stderr`, `entry_func`, and `create_nodes` (a module's ops as graph nodes).

torch-mlir is imported here lazily, never when `dabench_ir` is imported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import InputError, UnboundSymbolError, UserError
from dabench_ir.frontends import existing_file
from dabench_ir.frontends.onnx import fold_shapes, onnx_node_names
from dabench_ir.ir import Graph, Node, Value, ValueKind, layer_from_scope
from dabench_ir.mlir.count import (
    BUFFER_VIEWS,
    LINALG_COUNTS,
    MLIR_ARTIFACT,
    VIEW_OPS,
    MlirArtifact,
    OpCount,
    count_module,
    generic_op_views,
    node_keys,
    ops_in,
    tensor_type_of,
)
from dabench_ir.options import FLOAT_PRECISIONS
from dabench_ir.passes.base import Pass, PassResult
from dabench_ir.passes.meta import MODEL_FAMILY, MODEL_PARAMS, MODEL_WEIGHTS

if TYPE_CHECKING:
    import onnx

__all__ = [
    "IMPORT_PRECISIONS",
    "LINALG_PIPELINE",
    "ONNX_PIPELINE",
    "ONNX_STATIC_PIPELINE",
    "TORCH_PIPELINE",
    "MlirPrecisionPass",
    "all_static",
    "attach_mlir",
    "captured_stderr",
    "check_import_precision",
    "create_nodes",
    "entry_func",
    "first_diagnostic",
    "import_onnx",
    "load_mlir",
    "lower_static_onnx",
    "lower_to_linalg",
    "mlir_asm",
    "mlir_context",
    "onnx_via_mlir",
    "parse_mlir",
    "prepare_onnx",
    "reimport_at",
    "retype_onnx",
]

logger = logging.getLogger(__name__)

LINALG_PIPELINE = "torch-backend-to-linalg-on-tensors-backend-pipeline"
ONNX_PIPELINE = (
    f"builtin.module(func.func(convert-torch-onnx-to-torch),torch-lower-to-backend-contract,{LINALG_PIPELINE})"
)
# ONNX_PIPELINE without the shape and dtype refinement (inlining torch's shape and dtype library
# into every op, 1.2 s of 1.6 s on the 32-layer LLaMA): the same module when every tensor type is
# already static, as `prepare_onnx` makes them; `lower_to_linalg` checks that before and after it.
ONNX_STATIC_PIPELINE = (
    "builtin.module(func.func(convert-torch-onnx-to-torch),torch-lower-to-backend-contract{shape-dtype-refine=false})"
)
TORCH_PIPELINE = (
    "builtin.module(func.func(torch-match-quantized-custom-ops),"
    f"torchdynamo-export-to-torch-backend-pipeline,{LINALG_PIPELINE})"
)
_LINALG_DIALECTS = frozenset(
    {"builtin", "func", "linalg", "tensor", "arith", "math", "ml_program", "scf", "cf", "tm_tensor", "torch_c"}
)


# -- MLIR plumbing -----------------------------------------------------------------------
def mlir_context() -> Any:
    """A fresh torch-mlir context with the torch dialect registered; a UserError when torch-mlir is missing."""
    try:
        from torch_mlir import ir
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError(f"the MLIR path needs torch-mlir ({exc}); pip install 'dabench-ir[mlir]'") from None
    try:  # the registration alone: `torch_mlir.dialects.torch` also builds the dialect's op classes (0.16 s)
        from torch_mlir._mlir_libs._torchMlir import register_dialect
    except ImportError:  # pragma: no cover - another torch-mlir layout
        from torch_mlir.dialects.torch import register_dialect
    ctx = ir.Context()
    register_dialect(ctx)
    return ctx


def first_diagnostic(exc: Exception) -> str:
    """The first diagnostic MLIR reported, as one line."""
    diags = getattr(exc, "error_diagnostics", None) or []
    if diags:
        d = diags[0]
        loc = str(d.location)
        loc = loc[4:-1] if loc.startswith("loc(") else loc
        return f"{loc}: {d.message.strip().splitlines()[0]}"
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("error:"):
            return ln[len("error:") :].strip()
    return lines[0] if lines else type(exc).__name__


def parse_mlir(text: str, *, context: Any = None, where: str = "<mlir>", isolate: bool = True) -> Any:
    """Parse MLIR assembly; a parse error is a UserError naming the first diagnostic.

    torch-mlir's parser can crash the process (a segfault while reporting the error in a
    truncated file), so with ``isolate`` the text is first parsed in a forked child: a crash
    or an error there is one InputError here, and only text that parsed is parsed again in
    this process. The fork shares the already imported torch-mlir, so the check costs one
    extra parse (measured: bench/README.md), not an interpreter start.
    """
    from torch_mlir import ir

    ctx = context or mlir_context()
    if isolate:
        _parse_in_child(text, ctx, where)
    try:
        with ctx, captured_stderr():
            return ir.Module.parse(text)
    except ir.MLIRError as exc:
        raise InputError(f"{where}: MLIR does not parse: {first_diagnostic(exc)}") from None


def _parse_in_child(text: str, ctx: Any, where: str) -> None:
    """Parse ``text`` in a forked child; return when it parsed, raise InputError when not."""
    if not hasattr(os, "fork"):  # pragma: no cover - not Linux/macOS: parse in-process
        return
    from torch_mlir import ir

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: parse, report one line through the pipe, never return
        code = 0
        try:
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)  # MLIR's own diagnostic printing stays out of the user's stderr
            try:
                with ctx:
                    ir.Module.parse(text)
            except ir.MLIRError as exc:
                os.write(write_fd, first_diagnostic(exc).encode("utf-8", "replace")[:2000])
                code = 3
        except BaseException:  # the child must exit, whatever happened
            code = 4
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 4096):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    message = b"".join(chunks).decode("utf-8", "replace").strip()
    if os.WIFSIGNALED(status):
        raise InputError(
            f"{where}: MLIR does not parse (torch-mlir's parser crashed with signal {os.WTERMSIG(status)}); "
            "the file is truncated or malformed: export it again"
        )
    code = os.WEXITSTATUS(status)
    if code == 3:
        raise InputError(f"{where}: MLIR does not parse: {message}")
    if code != 0:
        raise InputError(f"{where}: MLIR does not parse (the parser failed); is it the right file?")


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[bool]]:
    """Hold what MLIR's C++ code prints on file descriptor 2 (warnings before an error), and
    log it as warnings: shown after a success, dropped before an error's one line.

    Yields a one-item list: set ``keep[0] = False`` to drop what was printed (an attempt that is
    discarded and run again another way)."""
    keep = [True]
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no stderr at all
        yield keep
        return
    with tempfile.TemporaryFile() as buf:
        sys.stderr.flush()
        os.dup2(buf.fileno(), 2)
        try:
            yield keep
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            buf.seek(0)
            text = buf.read(1 << 16).decode("utf-8", "replace") if keep[0] else ""
            for line in text.splitlines()[:20]:
                if line.strip():
                    logger.warning("torch-mlir: %s", line.strip()[:500])


def _dialects(module: Any) -> set[str]:
    from torch_mlir import ir

    seen: set[str] = set()

    def visit(op: Any) -> Any:
        seen.add(op.name.split(".", 1)[0])
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return seen


@generic_op_views()
def lower_to_linalg(module: Any, *, where: str = "<mlir>", refine: bool = False) -> str:
    """Lower a torch-dialect (ONNX-imported or fx-imported) module to linalg in place.

    Returns the level the module arrived at: ``onnx``, ``torch`` or ``linalg``.
    A dialect the pipeline cannot lower is a UserError with MLIR's first diagnostic.
    An ONNX-level module whose tensor types are all static skips torch-mlir's shape and dtype
    refinement (`ONNX_STATIC_PIPELINE`), which could only confirm them; ``refine=True`` runs it
    anyway (`ONNX_PIPELINE`), as does any module that is not static before or after.
    """
    from torch_mlir import ir

    text_head = module.operation.get_asm(large_elements_limit=1)
    if 'torch.operator "onnx.' in text_head or "torch.onnx_meta" in text_head:
        level, pipeline = "onnx", ONNX_PIPELINE
    elif "torch." in text_head or "!torch." in text_head:
        level, pipeline = "torch", TORCH_PIPELINE
    else:
        level, pipeline = "linalg", None
    if pipeline is not None:
        start = time.perf_counter()
        try:
            with module.context:
                module.operation.verify()  # the passes run without a verifier between them: check what they get
                with captured_stderr():
                    static = level == "onnx" and not refine and lower_static_onnx(module, text_head)
                    if not static:
                        _run_pipeline(module, pipeline)
                module.operation.verify()  # ... and what they made
        except ir.MLIRError as exc:
            raise UserError(f"{where}: cannot lower to linalg: {first_diagnostic(exc)}") from None
        how = "static types, no shape refinement" if static else "shapes and dtypes refined"
        logger.info("lowered %s (%s, %s) to linalg in %.2f s", where, level, how, time.perf_counter() - start)
    unknown = sorted(_dialects(module) - _LINALG_DIALECTS)
    if unknown:
        raise UserError(
            f"{where}: dialect(s) {', '.join(unknown)} remain after lowering; the MLIR path accepts the "
            "torch dialect (torch-mlir fx or ONNX importer) or linalg on tensors"
        )
    return level


def _run_pipeline(module: Any, pipeline: str) -> None:
    from torch_mlir.passmanager import PassManager

    pm = PassManager.parse(pipeline)
    # The IR is verified once before the passes and once after them (`lower_to_linalg`), not after
    # each of the ~45: 0.34 s of 1.6 s on the 32-layer LLaMA.
    pm.enable_verifier(False)
    pm.run(module.operation)


_TORCH_TENSOR_TYPE = re.compile(r"!torch\.v?tensor(?:<[^>]*>+)?")
_STATIC_VTENSOR = re.compile(r"!torch\.vtensor<\[\d*(?:,\d+)*\],(?!unk>)[^>]+>+")


def all_static(text: str) -> bool:
    """Every tensor in this torch-dialect text has a value-semantic type of static shape and known dtype."""
    return all(_STATIC_VTENSOR.fullmatch(t) for t in set(_TORCH_TENSOR_TYPE.findall(text)))


def lower_static_onnx(module: Any, text: str) -> bool:
    """Lower an ONNX-level module with `ONNX_STATIC_PIPELINE`, then `LINALG_PIPELINE`, when that
    gives what `ONNX_PIPELINE` gives: every tensor type static before it and after it (and the
    backend contract met, else it fails).

    False, with the module as it was and what the attempt printed dropped, when not: the full
    pipeline runs then. An imported list or optional of tensors (ONNX sequences) is not static."""
    from torch_mlir import ir

    if not all_static(text) or "!torch.list<" in text or "!torch.optional<" in text:
        return False
    backup = module.operation.clone()
    with captured_stderr() as keep:
        try:
            _run_pipeline(module, ONNX_STATIC_PIPELINE)
            keep[0] = all_static(module.operation.get_asm(large_elements_limit=1))
        except ir.MLIRError:
            keep[0] = False
        if keep[0]:
            _run_pipeline(module, f"builtin.module({LINALG_PIPELINE})")
            return True
    logger.info("the module is not static after the backend contract: refining its shapes and dtypes")
    body = module.body
    for op in list(body.operations):
        op.operation.erase()
    for op in list(backup.regions[0].blocks[0].operations):
        body.append(op.operation)
    return False


def entry_func(module: Any) -> Any:
    """The module's entry ``func.func`` (``main``, ``main_graph`` or ``forward``, else the first)."""
    funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    if not funcs:
        raise InputError("the MLIR module has no func.func")
    for f in funcs:
        if str(f.attributes["sym_name"]).strip('"') in ("main", "main_graph", "forward"):
            return f
    return funcs[0]


# -- .mlir files -------------------------------------------------------------------------
@generic_op_views()
def load_mlir(source: str | os.PathLike[str], dims: Mapping[str, int] | None = None) -> Graph:
    """Load a `.mlir` file (or MLIR text) as a Graph of its ops' origins (cost it with `LinalgCostPass`)."""
    text, path = _read_text(source)
    where = str(path) if path else "<mlir>"
    ctx = mlir_context()
    module = parse_mlir(text, context=ctx, where=where)
    level = lower_to_linalg(module, where=where)
    func = entry_func(module)
    args = list(func.regions[0].blocks[0].arguments)
    header = _header(text)
    weight_names = _check_header(header, len(args), where)
    # The exporter passes (x, *weights): the last len(weights) arguments are the weights.
    first_weight = len(args) - len(weight_names)
    values: dict[str, Value] = {}
    inputs: list[str] = []
    for arg in args:
        ttype = tensor_type_of(arg.type)
        if ttype is None:
            continue
        if not ttype.is_static:  # its ops' loop bounds cannot be derived: every op would go uncounted
            raise UserError(
                f"{where}: argument {arg.arg_number} is {arg.type}: the module has dynamic dims, and costs "
                "need static shapes (a .mlir file's dims cannot be bound here: export it with static "
                "shapes, or profile its ONNX model with --dim NAME=N)"
            )
        i = arg.arg_number
        is_weight = i >= first_weight
        name = f"arg{i}"  # the linalg cost pass names function arguments this way
        values[name] = Value(name, ttype, ValueKind.WEIGHT if is_weight else ValueKind.INPUT)
        if not is_weight:
            inputs.append(name)
    weight_args = frozenset(range(first_weight, len(args)))
    name = header.get(MODEL_FAMILY) or (path.stem if path else "mlir")
    graph = Graph([], values, inputs, [], name=name, path=str(path) if path else None, metadata=header, bindings=dims)
    graph.metadata["dabench.frontend"] = f"mlir ({level})"
    artifact = graph.meta[MLIR_ARTIFACT] = MlirArtifact(module, weight_args=weight_args, source=where)
    # the ops' origins are the graph's nodes: count once, and the linalg cost pass reuses the counts
    counts = graph.meta[LINALG_COUNTS] = count_module(module, weight_args=weight_args)
    _build_nodes(graph, counts, artifact)
    logger.info("%s: %d origin node(s) from MLIR", where, len(graph.nodes))
    return graph


def _header(text: str) -> dict[str, str]:
    """``// dabench.key: value`` comment lines at the top of an exported .mlir file."""
    out: dict[str, str] = {}
    for line in text.splitlines()[:32]:
        if not line.startswith("//"):
            if line.strip():
                break
            continue
        key, sep, value = line[2:].strip().partition(":")
        if sep and key.startswith("dabench."):
            out[key.strip()] = value.strip()
    return out


def _check_header(header: Mapping[str, str], arguments: int, where: str) -> list[str]:
    """The header's schema (what `models.mlir_export` writes): ``dabench.params`` a JSON object whose
    ``layers``, when given, is a positive integer; ``dabench.weights`` a JSON list of names, no
    more than the entry function has arguments (the last ones are the weights). A malformed one
    is refused in one line (InputError), not ignored: it decides which arguments are weights and
    which layer each op is in. Returns the weight names."""
    from dabench_ir.schema import COUNT, violates

    def bad(key: str, why: str) -> InputError:
        return InputError(f"{where}: header // {key}: {why}")

    def parsed(key: str, default: str, shape: type, what: str) -> Any:
        text = header.get(key, default)
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            value = None
        if not isinstance(value, shape):
            raise bad(key, f"expected {what}, got {text[:60]!r}")
        return value

    params = parsed(MODEL_PARAMS, "{}", dict, "a JSON object of the model's parameters")
    if params.get("layers") is not None and violates(params["layers"], COUNT):
        raise bad(MODEL_PARAMS, f"layers {violates(params['layers'], COUNT)}")
    names = parsed(MODEL_WEIGHTS, "[]", list, "a JSON list of weight names")
    if not all(isinstance(n, str) and n for n in names):
        raise bad(MODEL_WEIGHTS, "expected a JSON list of weight names (non-empty strings)")
    if len(names) > arguments:
        raise bad(MODEL_WEIGHTS, f"names {len(names)} weights, but the entry function has {arguments} argument(s)")
    return names


def _read_text(source: str | os.PathLike[str]) -> tuple[str, Path | None]:
    if isinstance(source, str) and ("\n" in source or "{" in source) and not source.endswith(".mlir"):
        return source, None
    path = existing_file(source, "a .mlir file")
    try:
        return path.read_text(encoding="utf-8"), path
    except UnicodeDecodeError:
        raise InputError(f"{path}: not MLIR text (MLIR bytecode is not supported)") from None


# -- ONNX through torch-mlir -------------------------------------------------------------
def prepare_onnx(
    model: onnx.ModelProto,
    dims: Mapping[str, int] | None,
    weights: frozenset[str],
    *,
    inline_limit: int = 4096,
) -> tuple[onnx.ModelProto, frozenset[int]]:
    """A copy ready for torch-mlir's importer, and the indices of its weight arguments.

    Symbolic dims are bound (``dim_value`` set, then shapes re-inferred) so linalg gets
    static shapes; node names are made unique; weights and any external or large
    initializer become function arguments, so no weight data is read or materialised.
    """
    import onnx

    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    g = proto.graph
    for node, name in zip(g.node, onnx_node_names(g), strict=True):
        node.name = name
    dims = dict(dims or {})
    missing: set[str] = set()
    input_names = {vi.name for vi in g.input}
    for vi in (*g.input, *g.output):
        if not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param:
                if d.dim_param in dims:
                    d.dim_value = int(dims[d.dim_param])
                elif vi.name in input_names:
                    missing.add(d.dim_param)
    if missing:
        raise UnboundSymbolError(missing)
    del g.value_info[:]

    keep = []
    moved = []
    for init in g.initializer:
        numel = 1
        for d in init.dims:
            numel *= d
        external = init.data_location == onnx.TensorProto.EXTERNAL
        if init.name in weights or external or numel > inline_limit:
            moved.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    if moved:
        del g.initializer[:]
        g.initializer.extend(keep)
        existing = {vi.name for vi in g.input}
        g.input.extend(vi for vi in moved if vi.name not in existing)
    weight_args = weight_arg_indices(g, weights)
    try:  # the shape arithmetic folded with the dims bound: TorchScript's Shape/Gather/Concat chains
        proto = fold_shapes(proto)  # leave ``unk__N`` dims that ONNX inference alone cannot resolve
    except Exception as exc:
        raise InputError(f"ONNX shape inference failed before MLIR import: {_one_line(exc)}") from None
    return proto, weight_args


def weight_arg_indices(g: Any, weights: frozenset[str]) -> frozenset[int]:
    """The positions of ``weights`` among the function arguments the importer makes of ``g``'s
    inputs (those no initializer holds)."""
    initialized = {init.name for init in g.initializer}
    arg_names = [vi.name for vi in g.input if vi.name not in initialized]
    return frozenset(i for i, n in enumerate(arg_names) if n in weights)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


@generic_op_views()
def import_onnx(proto: onnx.ModelProto, *, context: Any = None, where: str = "<onnx>") -> Any:
    """Import a (shape-inferred) ONNX model into the torch dialect with torch-mlir."""
    from torch_mlir import ir
    from torch_mlir.extras import onnx_importer

    ctx = context or mlir_context()
    try:
        with captured_stderr():
            info = onnx_importer.ModelInfo(proto, config=onnx_importer.Config())
            module = info.create_module(context=ctx)
            onnx_importer.NodeImporter.define_function(info.main_graph, module.operation).import_all()
    except ir.MLIRError as exc:
        raise UserError(f"{where}: torch-mlir cannot import the model: {first_diagnostic(exc)}") from None
    except Exception as exc:  # OnnxImportError and friends carry a one-line cause
        raise UserError(f"{where}: torch-mlir cannot import the model: {_one_line(exc)}") from None
    return module


def onnx_via_mlir(model: Any, dims: Mapping[str, int] | None = None) -> Graph:
    """The ONNX frontend's graph with its torch-mlir linalg module attached (cost it with `LinalgCostPass`)."""
    from dabench_ir.frontends.onnx import load_onnx, read_model

    proto, path = read_model(model)
    return attach_mlir(load_onnx(path if path is not None else proto), proto, dims, where=str(path or "<onnx>"))


def attach_mlir(
    graph: Graph,
    model: Any,
    dims: Mapping[str, int] | None = None,
    *,
    where: str = "<onnx>",
    precision: str | None = None,
) -> Graph:
    """``graph`` (the ONNX frontend's, of ``model``: a path or an onnx.ModelProto) with ``model``
    imported through torch-mlir and lowered to linalg at ``dims``, which bind every symbolic dim,
    and at ``precision`` (`retype_onnx`; None: the dtypes it was exported in)."""
    from dabench_ir.frontends.onnx import read_model

    check_import_precision(precision)
    start = time.perf_counter()
    proto, _ = read_model(model)
    if dims:
        graph.bindings.update(dims)
    weights = frozenset(v.name for v in graph.values.values() if v.kind is ValueKind.WEIGHT)
    try:
        prepared, weight_args = prepare_onnx(proto, dims, weights)
    except UnboundSymbolError as exc:  # named with the flag that binds each: --batch, --seq or --dim
        batch = graph.batch_dim if isinstance(graph.batch_dim, str) else None
        raise UnboundSymbolError(exc.symbols, batch=batch) from None
    if precision is not None:
        retype_onnx(prepared, precision)
    if precision in QUANTISED_IMPORTS:
        quantised = dequantised_weights(prepared, graph, precision)
        weight_args = weight_arg_indices(prepared.graph, weights | quantised)
    ctx = mlir_context()
    module = import_onnx(prepared, context=ctx, where=where)
    lower_to_linalg(module, where=where)
    graph.meta[MLIR_ARTIFACT] = MlirArtifact(
        module, weight_args=weight_args, source=where, precision=precision, onnx_model=model
    )
    graph.metadata["dabench.frontend"] = "onnx via mlir"
    logger.info("%s via MLIR: %d nodes in %.2f s", where, len(graph.nodes), time.perf_counter() - start)
    return graph


# -- precision at import -----------------------------------------------------------------
_IMPORT_DTYPE = {
    "fp32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "mixed": "bf16",
    "int8": "fp16",
    "fp8": "fp16",
    "w8a16": "fp16",
    "w4a16": "fp16",
}
"""Each import precision's float dtype (`retype_onnx`)."""

IMPORT_PRECISIONS = tuple(_IMPORT_DTYPE)
"""The precisions an ONNX model is imported at (`retype_onnx`): every float tensor in that dtype;
``mixed`` is imported at bf16, whose lowering is the mixed recipe's arithmetic (docs/mlir.md);
the quantised modes at fp16, each block matmul's weight stored quantised (`dequantised_weights`):
``int8`` in QDQ form (activation and weight each quantised per tensor, which torch-mlir fuses into
an integer matmul), ``fp8`` as float8e4m3fn behind a ``Cast``, ``w8a16`` int8 behind a per-channel
``DequantizeLinear``, ``w4a16`` uint4 in groups of 128 dequantised by ``Cast``, ``Sub`` and ``Mul``."""

QUANTISED_IMPORTS = frozenset(IMPORT_PRECISIONS) - frozenset(FLOAT_PRECISIONS)
"""Import precisions whose block-matmul weights are stored quantised (`dequantised_weights`)."""


def check_import_precision(precision: str | None) -> None:
    """A UserError, in one line, for a precision no import writes (none of ``--precision``'s
    choices, since w4a16 is imported as an explicit group-wise dequantisation: docs/mlir.md)."""
    if precision is None or precision in IMPORT_PRECISIONS:
        return
    raise UserError(
        f"--precision {precision} with --via mlir: no import writes {precision} weights; the linalg module "
        f"is imported at {', '.join(IMPORT_PRECISIONS)} (drop --via mlir for {precision})"
    )


def retype_onnx(proto: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    """Retype ``proto``'s float tensors to ``precision`` (``mixed``: bf16) in place, as if it had been exported so:
    graph inputs, outputs and value_info, inline initializers (converted, round to nearest even),
    ``Cast`` to a float type, ``dtype`` attributes and float tensor attributes (``Constant``,
    ``ConstantOfShape``), subgraphs included.

    Weights are function arguments by now (`prepare_onnx`): retyping them reads no weight data.
    torch-mlir then lowers the model with its own numerics at that dtype (a 16-bit matmul
    accumulates in f32, softmax computes in f32, LayerNormalization in its ``stash_type``):
    docs/mlir.md, "Precision"."""
    import onnx

    check_import_precision(precision)
    dtypes = {"fp32": onnx.TensorProto.FLOAT, "fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}
    to = dtypes[_IMPORT_DTYPE[precision]]
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    _retype_graph(proto.graph, to, floats)
    return proto


def _retype_graph(g: Any, to: int, floats: set[int]) -> None:
    import onnx

    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in floats:
            vi.type.tensor_type.elem_type = to
    for init in g.initializer:
        if init.data_type in floats:
            init.CopyFrom(_converted(init, to))
    for node in g.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.INT and attr.name in ("to", "dtype") and attr.i in floats:
                attr.i = to
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in floats:
                attr.t.CopyFrom(_converted(attr.t, to))
            elif attr.type == onnx.AttributeProto.GRAPH:
                _retype_graph(attr.g, to, floats)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _retype_graph(sub, to, floats)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):  # value_float(s): an f32 constant
            for k, attr in enumerate(node.attribute):
                if attr.name in ("value_float", "value_floats"):
                    values = [attr.f] if attr.name == "value_float" else list(attr.floats)
                    dims = [] if attr.name == "value_float" else [len(values)]
                    tensor = onnx.helper.make_tensor("value", onnx.TensorProto.FLOAT, dims, values)
                    node.attribute[k].CopyFrom(onnx.helper.make_attribute("value", _converted(tensor, to)))


def _converted(tensor: Any, to: int) -> Any:
    """``tensor`` (a float TensorProto) as ``to``, its data as ``raw_data``: torch-mlir's importer
    reads bf16 initializer data from ``raw_data`` only. A value beyond fp16's range becomes ±inf, as
    ``Tensor.half()`` makes it (an attention mask's fp32 minimum, Falcon's and BLOOM's: a -inf mask)."""
    import ml_dtypes
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if tensor.data_type == to:
        return tensor
    data = numpy_helper.to_array(tensor).astype(np.float32)
    dtype = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16}.get(to, ml_dtypes.bfloat16)
    with np.errstate(over="ignore"):
        raw = data.astype(dtype).tobytes()
    out = onnx.helper.make_tensor(tensor.name, to, list(tensor.dims), raw, raw=True)
    out.doc_string = tensor.doc_string
    return out


def dequantised_weights(proto: onnx.ModelProto, graph: Graph, precision: str = "w8a16") -> frozenset[str]:
    """``proto`` (prepared, retyped to fp16) with the weight of every matmul inside a decoder block
    stored quantised at ``precision`` and widened before the matmul reads it, each added node named
    as the matmul, so its linalg work is the matmul's; returns the arguments added (scales, zero
    points), weights of the module. The weights quantised are the ONNX path's (`block_matmul_weights`
    of the frontend's ``graph``).

    - ``w8a16``: int8, dequantised per output channel by a ``DequantizeLinear`` (fp16 scale and int8
      zero point per channel: torch-mlir lowers it only with a zero point), where the ONNX path adds
      its dequantisation (`passes.precision.DequantisePass`); `_dequantise_per_channel`;
    - ``int8`` (W8A8): the QDQ form, `_quantise_qdq`: torch-mlir's torch-dialect pipeline fuses a
      per-tensor ``DequantizeLinear`` of both operands into ``linalg.quantized_matmul`` (i8 x i8
      accumulating in i32); a per-channel one it does not fuse;
    - ``fp8``: float8e4m3fn behind a ``Cast`` to fp16 (`_widen_fp8`): torch-mlir legalises neither a
      float8 ``DequantizeLinear`` nor a ``Cast`` to float8, so the activations stay fp16; the count
      fuses the widening into the contraction (`dabench_ir.mlir.count`, docs/mlir.md);
    - ``w4a16``: uint4 in groups of 128 along the contraction dim, each group with an fp16 scale and a
      uint4 zero point, dequantised by ``Cast``, ``Sub``, ``Mul`` and ``Reshape`` (`_dequantise_groups`):
      torch-mlir does not legalise a block-wise int4 ``DequantizeLinear``; the count fuses the chain
      into the matmul (`count._fuse_dequantisations`), as the ONNX path adds its dequantisation."""
    import onnx

    from dabench_ir.passes import PassManager
    from dabench_ir.passes.passes import ClassifyOps, FoldWeightLayouts, TagLayers
    from dabench_ir.passes.precision import block_matmul_weights

    classified = PassManager([TagLayers(), ClassifyOps(), FoldWeightLayouts()])(graph.clone()).graph
    g = proto.graph
    inputs = {vi.name: vi for vi in g.input}
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 19)
    readers = {node.name: node for node in g.node}
    reads: dict[str, str] = {}  # stored weight -> the widened value its readers take
    before: dict[str, list[onnx.NodeProto]] = {}  # a matmul's name -> the nodes to run just before it
    front: list[onnx.NodeProto] = []  # nodes that read only graph inputs (weights)
    added: set[str] = set()  # the weights, scales and zero points: the module's weight arguments
    for matmul, chain in block_matmul_weights(classified).items():
        stored = chain[0]
        if stored not in inputs or stored in reads:
            continue
        reader = classified.node(matmul)
        direct = len(chain) == 1 and not (reader.op_type == "Gemm" and reader.attrs.get("transB"))  # W[K, N] as it is
        if precision == "int8":
            node = readers.get(matmul)
            if node is None:
                continue
            nodes, activation_nodes, names = _quantise_qdq(g, inputs[stored], node, chain[-1], added)
            before.setdefault(matmul, []).extend(activation_nodes)
        elif precision == "fp8":
            nodes, names = _widen_fp8(inputs[stored], matmul)
        elif precision == "w4a16":
            nodes, names, init = _dequantise_groups(g, inputs[stored], matmul, k_axis=0 if direct else 1)
            g.initializer.extend(init)  # the weight's own 2-D shape, named after it
        else:
            nodes, names = _dequantise_per_channel(g, inputs[stored], matmul, axis=1 if direct else 0, opset=opset)
        front.extend(nodes)
        reads[stored] = nodes[-1].output[0]
        added |= {stored, *names}
    for node in g.node:
        node.input[:] = [reads.get(i, i) for i in node.input]
    rest = list(g.node)
    del g.node[:]
    g.node.extend(front)  # a repeated message field takes no slice assignment
    for node in rest:
        g.node.extend(before.get(node.name, []))
        g.node.append(node)
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    del g.value_info[:]
    g.value_info.extend(inferred.graph.value_info)
    return frozenset(added)


def _dequantise_per_channel(g: Any, stored: Any, matmul: str, *, axis: int, opset: int) -> tuple[list[Any], set[str]]:
    """w8a16: ``stored`` (a graph input) retyped int8, dequantised along ``axis`` (its output channels)
    by a ``DequantizeLinear`` with an fp16 scale and an int8 zero point per channel (before opset 19
    the scale and result are fp32, cast to fp16); the nodes and the arguments added."""
    import onnx

    channels = [d.dim_value for d in stored.type.tensor_type.shape.dim][axis]
    stored.type.tensor_type.elem_type = onnx.TensorProto.INT8
    # DequantizeLinear-19 writes its scale's type; before opset 19 both are fp32, cast to the fp16 read
    scale_type = onnx.TensorProto.FLOAT16 if opset >= 19 else onnx.TensorProto.FLOAT
    name = stored.name
    scale, zero, read = f"{name}.scale", f"{name}.zero_point", f"{name}.dequantised"
    g.input.extend(
        [
            onnx.helper.make_tensor_value_info(scale, scale_type, [channels]),
            onnx.helper.make_tensor_value_info(zero, onnx.TensorProto.INT8, [channels]),
        ]
    )
    wide = read if opset >= 19 else f"{name}.dequantised_fp32"
    nodes = [onnx.helper.make_node("DequantizeLinear", [name, scale, zero], [wide], name=matmul, axis=axis)]
    if wide != read:
        nodes.append(onnx.helper.make_node("Cast", [wide], [read], name=matmul, to=onnx.TensorProto.FLOAT16))
    return nodes, {scale, zero}


W4_GROUP = 128
"""The w4a16 group: elements along the contraction dim sharing a scale and a zero point (as
`passes.precision`'s w4a16)."""


def _dequantise_groups(g: Any, stored: Any, matmul: str, *, k_axis: int) -> tuple[list[Any], set[str], list[Any]]:
    """w4a16: ``stored`` (a 2-D graph input, its contraction dim at ``k_axis``) retyped uint4 and
    split into groups of `W4_GROUP` along that dim (a 3-D argument: [K/128, 128, N], or [N, K/128, 128]),
    with an fp16 scale and a uint4 zero point per group (arguments of the group shape, one element
    wide on the group axis), dequantised as ``(Cast(w) - Cast(zero)) * scale`` and reshaped to the 2-D
    layout the matmul reads, each node named as ``matmul``; the nodes, the arguments added and the
    initializers (the 2-D shape). A dim that 128 does not divide is grouped by its largest divisor
    below 128."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    dims = [d.dim_value for d in stored.type.tensor_type.shape.dim]
    k = dims[k_axis]
    group = next(n for n in range(min(W4_GROUP, k), 0, -1) if k % n == 0)
    grouped = [k // group, group, dims[1]] if k_axis == 0 else [dims[0], k // group, group]
    per_group = [k // group, 1, dims[1]] if k_axis == 0 else [dims[0], k // group, 1]
    name, fp16 = stored.name, onnx.TensorProto.FLOAT16
    stored.type.CopyFrom(onnx.helper.make_tensor_type_proto(onnx.TensorProto.UINT4, grouped))
    scale, zero, shape = f"{name}.scale", f"{name}.zero_point", f"{name}.shape"
    g.input.extend(
        [
            onnx.helper.make_tensor_value_info(scale, fp16, per_group),
            onnx.helper.make_tensor_value_info(zero, onnx.TensorProto.UINT4, per_group),
        ]
    )
    wide, zero_wide, centred, scaled = (f"{name}.{s}" for s in ("widened", "zero_widened", "centred", "scaled"))
    nodes = [
        onnx.helper.make_node("Cast", [name], [wide], name=matmul, to=fp16),
        onnx.helper.make_node("Cast", [zero], [zero_wide], name=matmul, to=fp16),
        onnx.helper.make_node("Sub", [wide, zero_wide], [centred], name=matmul),
        onnx.helper.make_node("Mul", [centred, scale], [scaled], name=matmul),
        onnx.helper.make_node("Reshape", [scaled, shape], [f"{name}.dequantised"], name=matmul),
    ]
    return nodes, {scale, zero}, [numpy_helper.from_array(np.array(dims, dtype=np.int64), shape)]


_INT8_ZERO = "dabench.int8_zero_point"
"""The int8 zero point (0: symmetric) every int8 QDQ pair shares, an inline initializer."""


def _quantise_qdq(
    g: Any, stored: Any, matmul: Any, weight_read: str, added: set[str]
) -> tuple[list[Any], list[Any], set[str]]:
    """int8 (W8A8) in QDQ form: ``stored`` retyped int8 behind a per-tensor ``DequantizeLinear``, and
    the activation ``matmul`` reads quantised and dequantised (``QuantizeLinear`` then
    ``DequantizeLinear``), each with an fp16 scale and the shared zero point 0, named as ``matmul``.
    An activation two matmuls read (the Q, K and V projections) is quantised once, by the first.
    Returns the weight's nodes, the activation's (to run just before ``matmul``) and the scale
    arguments added. torch-mlir's conversion takes the QDQ types as written (fp16 scale and
    dequantised value at any opset)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if not any(init.name == _INT8_ZERO for init in g.initializer):
        g.initializer.append(numpy_helper.from_array(np.array(0, dtype=np.int8), _INT8_ZERO))
    fp16, name = onnx.TensorProto.FLOAT16, stored.name
    stored.type.tensor_type.elem_type = onnx.TensorProto.INT8
    scale, read = f"{name}.scale", f"{name}.dequantised"
    g.input.append(onnx.helper.make_tensor_value_info(scale, fp16, []))
    weight = [onnx.helper.make_node("DequantizeLinear", [name, scale, _INT8_ZERO], [read], name=matmul.name)]
    activations: list[Any] = []
    names = {scale}
    for k, value in enumerate(matmul.input[:2]):
        if value == weight_read or not value:
            continue
        act_scale, quantised, dequantised = f"{value}.scale", f"{value}.quantised", f"{value}.dequantised"
        if act_scale not in added:  # the first matmul to read it quantises it
            g.input.append(onnx.helper.make_tensor_value_info(act_scale, fp16, []))
            activations += [
                onnx.helper.make_node("QuantizeLinear", [value, act_scale, _INT8_ZERO], [quantised], name=matmul.name),
                onnx.helper.make_node(
                    "DequantizeLinear", [quantised, act_scale, _INT8_ZERO], [dequantised], name=matmul.name
                ),
            ]
            added.add(act_scale)
        names.add(act_scale)
        matmul.input[k] = dequantised
    return weight, activations, names


def _widen_fp8(stored: Any, matmul: str) -> tuple[list[Any], set[str]]:
    """fp8: ``stored`` retyped float8e4m3fn and widened to fp16 by a ``Cast`` named as ``matmul``."""
    import onnx

    stored.type.tensor_type.elem_type = onnx.TensorProto.FLOAT8E4M3FN
    read = f"{stored.name}.widened"
    return [onnx.helper.make_node("Cast", [stored.name], [read], name=matmul, to=onnx.TensorProto.FLOAT16)], set()


def reimport_at(graph: Graph, precision: str | None) -> None:
    """``graph``'s linalg module imported again from its ONNX model at ``precision`` (a run at another
    precision than the one it was loaded at: `dabench_ir.run.prepare`); a `.mlir` module, which keeps
    its own types, is refused in one line."""
    artifact: MlirArtifact = graph.meta[MLIR_ARTIFACT]
    if artifact.precision == precision:
        return
    if artifact.onnx_model is None:
        raise UserError(
            f"--precision {precision}: {artifact.source} is an MLIR module and keeps the types it was written "
            "in; export it at that precision, or profile the .onnx file with --via mlir"
        )
    attach_mlir(graph, artifact.onnx_model, dict(graph.bindings), where=artifact.source, precision=precision)
    graph.meta.pop(LINALG_COUNTS, None)


@dataclass(frozen=True)
class MlirPrecisionPass(Pass):
    """A linalg run at ``precision``: its module imported at it (`reimport_at`, when the graph was
    loaded at another), then, on the ONNX frontend's graph (``--via mlir``), its values retyped and
    its nodes marked by `PrecisionPass` as on the ONNX path (what the lowerings read: each node's
    compute and accumulation dtype, the weights' resident bytes); the costs stay the module's
    (`LinalgCostPass` runs after this). A graph of the module's own ops keeps the module's types."""

    precision: str
    name: str = "mlir-precision"

    def call(self, graph: Graph) -> PassResult:
        from dabench_ir.passes import meta
        from dabench_ir.passes.passes import ClassifyOps
        from dabench_ir.passes.precision import PrecisionPass

        reimport_at(graph, self.precision)
        if graph.metadata.get("dabench.frontend") == "onnx via mlir":
            ClassifyOps()(graph)
            PrecisionPass(self.precision)(graph)
        else:
            meta.graph_set(graph, meta.GRAPH_PRECISION, self.precision)
        return PassResult(graph, True)


def mlir_asm(graph: Graph, *, debug_info: bool = True) -> str:
    """The lowered module kept on a graph, as text (resources elided)."""
    artifact: MlirArtifact = graph.meta[MLIR_ARTIFACT]
    return artifact.module.operation.get_asm(enable_debug_info=debug_info, large_elements_limit=16)


# -- building a Graph from the module's origins ---------------------------------------------
def _layers_from_runs(graph: Graph, nodes: list[tuple[Node, str]]) -> None:
    """fx origins carry no layer index; when a call chain recurs the same number of times in every
    decoder block (a whole multiple of the model's `layers`, from the exporter header), its runs are
    the blocks' in turn: the k-th of m a block is in block k // m. (GPT-2's block calls one line for
    both norms and one for both residual adds, twice a block: those nodes had no layer, the per-layer
    table put them outside the blocks.)"""
    try:
        layers = int(json.loads(graph.metadata.get(MODEL_PARAMS, "{}")).get("layers") or 0)
    except (ValueError, TypeError, AttributeError):
        layers = 0
    if layers <= 0:
        return
    by_chain: dict[str, list[Node]] = {}
    for node, chain in nodes:
        if node.layer is None and " <- " in chain:
            by_chain.setdefault(chain, []).append(node)
    for members in by_chain.values():
        if len(members) % layers == 0:
            per_block = len(members) // layers
            for k, node in enumerate(members):
                node.layer = k // per_block


def _dominant(ops: list[OpCount]) -> str:
    best = max(ops, key=lambda c: (c.cost.flops, c.cost.bytes))
    return best.op_name


def _build_nodes(graph: Graph, counts: list[OpCount], artifact: MlirArtifact) -> None:
    """One node per origin of the counted ops (named by `node_keys`, as the linalg cost
    pass will look them up), wired by the SSA values that cross between them."""
    by_origin: dict[str, list[OpCount]] = {}
    for c, key in zip(counts, node_keys(counts), strict=True):
        if c.op_class != "uncounted" and key is not None:
            by_origin.setdefault(key, []).append(c)
    create_nodes(graph, by_origin, artifact)
    graph.invalidate()


def _is_view_result(value: Any) -> bool:
    from torch_mlir import ir

    return isinstance(value, ir.OpResult) and value.owner.name in VIEW_OPS and len(value.owner.operands) > 0


@generic_op_views()
def create_nodes(graph: Graph, by_origin: dict[str, list[OpCount]], artifact: MlirArtifact) -> None:
    """Nodes for origins the graph lacks, wired by the SSA values that cross between them.

    ``by_origin`` maps a node name to its counted ops (in module order); the `.mlir` loader
    names them by origin, `dabench_ir.mlir.pipelines.unit_graph` one per op. After
    bufferization (ops without results) the edges go through the buffers ops write and read."""
    from torch_mlir import ir

    owner_of: dict[Any, str] = {}
    for name, ops in by_origin.items():
        for c in ops:
            for res in c.op.results:
                owner_of[res] = name
    order = list(by_origin)
    rank = {n: i for i, n in enumerate(order)}
    created: dict[str, Node] = {}
    for name in order:
        if graph.has_node(name):
            continue
        ops = by_origin[name]
        first = ops[0].origin
        node = Node(name=name, op_type=_dominant(ops), domain="mlir", scope=first.scope)
        node.layer = layer_from_scope(first.scope or name)
        if node.layer is None and "dabench.layer" in ops[0].op.attributes:  # an annotated file keeps its layers
            node.layer = int(ir.IntegerAttr(ops[0].op.attributes["dabench.layer"]).value)
        if first.kind == "file":
            node.attrs["source"] = f"{first.file}:{first.line}"
        created[name] = node
    _layers_from_runs(graph, [(n, by_origin[k][0].origin.scope) for k, n in created.items()])
    value_names: dict[Any, str] = {}
    produced: dict[str | None, int] = {}

    def value_name(v: Any, producer: str | None) -> str:
        if v not in value_names:
            if isinstance(v, ir.BlockArgument):
                value_names[v] = f"arg{v.arg_number}"
            else:
                k = produced[producer] = produced.get(producer, -1) + 1
                value_names[v] = f"{producer}:{k}"
        return value_names[v]

    for name, node in created.items():
        for c in by_origin[name]:
            for operand in c.op.operands:
                producer = owner_of.get(operand)
                while producer is None and _is_view_result(operand):  # a view between two nodes is no node
                    operand = operand.owner.operands[0]
                    producer = owner_of.get(operand)
                is_arg = isinstance(operand, ir.BlockArgument) and operand.owner.owner.operation.name == "func.func"
                if not is_arg and (producer is None or producer == name or rank[producer] > rank[name]):
                    continue
                ttype = tensor_type_of(operand.type)
                if ttype is None:
                    continue
                vname = value_name(operand, producer)
                if vname not in graph.values:
                    kind = ValueKind.ACTIVATION
                    if is_arg:
                        kind = ValueKind.WEIGHT if operand.arg_number in artifact.weight_args else ValueKind.INPUT
                    graph.values[vname] = Value(name=vname, type=ttype, kind=kind, producer=producer)
                    if producer is not None and producer in created and vname not in created[producer].outputs:
                        created[producer].outputs.append(vname)
                if vname not in node.inputs:
                    node.inputs.append(vname)
    _buffer_edges(graph, by_origin, created, rank, artifact)
    graph.nodes.extend(created.values())


def _buffer_access(op: Any) -> tuple[list[Any], list[Any]]:
    """The buffers (memref operands) an op reads and writes: a linalg op reads its ``ins`` and the
    ``outs`` its body reads (an accumulator), and writes its ``outs``; ``memref.copy`` reads its
    source and writes its target."""
    from torch_mlir import ir

    if op.name == "memref.copy":
        return [op.operands[0]], [op.operands[1]]
    operands = list(op.operands)
    if not op.name.startswith("linalg.") or op.results or not operands:
        return [], []
    segments = list(op.attributes["operandSegmentSizes"]) if "operandSegmentSizes" in op.attributes else None
    n_in = int(segments[0]) if segments else len(operands) - 1  # transpose, broadcast: one init
    args = list(op.regions[0].blocks[0].arguments) if op.regions and len(op.regions[0].blocks) else []
    reads = [v for k, v in enumerate(operands) if k < n_in or (k < len(args) and len(list(args[k].uses)) > 0)]
    if op.regions and len(op.regions[0].blocks):  # a gather: memref.load of a buffer from outside the body
        reads += [inner.operands[0] for inner in op.regions[0].blocks[0].operations if inner.name == "memref.load"]
    buffers = [v for v in reads if isinstance(v.type, ir.MemRefType)]
    return buffers, [v for v in operands[n_in:] if isinstance(v.type, ir.MemRefType)]


def _buffer_root(value: Any) -> tuple[Any, bool]:
    """The buffer a memref value views (through reshapes, casts and subviews), and whether the
    value is all of it (no subview on the way)."""
    whole = True
    for _ in range(64):
        owner = getattr(value, "owner", None)
        op = getattr(owner, "operation", owner)
        if op is None or not hasattr(op, "name") or op.name not in BUFFER_VIEWS or not op.operands:
            break
        whole = whole and op.name not in ("memref.subview", "memref.reinterpret_cast")
        value = op.operands[0]
    return value, whole


def _buffer_edges(
    graph: Graph,
    by_origin: dict[str, list[OpCount]],
    created: dict[str, Node],
    rank: dict[str, int],
    artifact: MlirArtifact,
) -> None:
    """After bufferization ops have no results: an op that writes a buffer feeds the later ops that
    read it (each write a value ``WRITER:k`` of the written buffer's type), until a write of the whole
    buffer replaces it; a read of a function argument is that input (or weight)."""
    from torch_mlir import ir

    owner: dict[Any, str] = {c.op: name for name, ops in by_origin.items() if name in created for c in ops}
    writers: dict[Any, list[tuple[str, str]]] = {}  # buffer -> (writer, value) since its last whole write

    for op in ops_in(artifact.module.operation):
        name = owner.get(op)
        if name is None:
            continue
        node = created[name]
        reads, writes = _buffer_access(op)
        for v in reads:
            root, _ = _buffer_root(v)
            if isinstance(root, ir.BlockArgument) and root.owner.owner.operation.name == "func.func":
                ttype = tensor_type_of(root.type)
                vname = f"arg{root.arg_number}"
                if ttype is not None and vname not in graph.values:
                    kind = ValueKind.WEIGHT if root.arg_number in artifact.weight_args else ValueKind.INPUT
                    graph.values[vname] = Value(vname, ttype, kind)
                sources = [vname] if ttype is not None else []
            else:
                sources = [val for w, val in writers.get(root, ()) if w != name and rank[w] < rank[name]]
            node.inputs.extend(s for s in sources if s not in node.inputs)
        for v in writes:
            root, whole = _buffer_root(v)
            ttype = tensor_type_of(v.type)
            if ttype is None:
                continue
            k = 0
            while f"{name}:{k}" in graph.values:
                k += 1
            vname = f"{name}:{k}"
            graph.values[vname] = Value(name=vname, type=ttype, kind=ValueKind.ACTIVATION, producer=name)
            node.outputs.append(vname)
            ws = writers.setdefault(root, [])
            if whole:
                ws.clear()
            ws.append((name, vname))
