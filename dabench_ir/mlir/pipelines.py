"""Instrumented MLIR pipelines: upstream passes run one at a time on the linalg module, costed after each.

`run_mlir_pipeline(module, ["linalg-fuse-elementwise-ops", "canonicalize", "cse"])` runs each
pass with torch-mlir's bundled `PassManager` and, after it, counts the module again
(`dabench_ir.mlir.count.count_module`): ops, linalg ops, FLOPs by class, bytes read and written,
the intermediate tensors it materialises, the buffers bufferization allocates, and which ops
the pass kept, created, fused away or removed.

Where ops come from. MLIR's elementwise fusion gives the fused op its consumer's location
only, so the producers' names would be lost. Every op is tagged before a pass; after it, an op
still tagged was kept, an untagged one was created and claims the ops that went (`_Claims`):

1. **dataflow**: a created op stands for the gone op whose result it replaced (a kept op now
   reads it where it read that op), and claims the gone ops behind it up to its own inputs;
   a gone op behind one created op only was fused into it;
2. **shared**: a gone op behind several created ops (one zero fill that torch-mlir shares between
   the matmuls of every layer, re-created per consumer) is in each one's sources, but names none
   of them: each copy is the work of the node its created op already names;
3. **location** (consumers first): a gone op nothing claimed joins a created op that names its
   node, by its location or (an elementwise op) by the ops in its body: the one its consumer went
   to, else one that reads what it read; what was fused into it joins with it (as in 1);
4. otherwise it was **removed** (CSE, dead code, folding).

A created op's location is then set to a fused location of its own location's nodes and those
of the ops it claims by dataflow or location (not shared ones), so the module itself says where
each fused op came from (and is a valid `.mlir` input).

Per node. An op naming several ONNX nodes has its cost split among them, each field in
proportion to that node's value of the field before the pipeline (equal shares when all are
zero; whole units by largest remainder, so the shares add up to the op's cost exactly); every
such share is labelled with the nodes it is shared with.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, Graph, layer_from_scope
from dabench_ir.mlir.count import (
    BUFFER_VIEWS,
    MLIR_ARTIFACT,
    VIEW_OPS,
    MlirArtifact,
    assign_costs,
    count_module,
    generic_op_views,
    ops_in,
    origin_of,
    tensor_nbytes,
)
from dabench_ir.mlir.load import captured_stderr, create_nodes, first_diagnostic

__all__ = [
    "MlirPassError",
    "ModuleCost",
    "PassStep",
    "PipelineRecord",
    "is_view",
    "module_cost",
    "parse_pipeline",
    "run_mlir_pipeline",
    "split_by_nodes",
    "unit_graph",
    "unit_names",
    "whole_shares",
]

logger = logging.getLogger(__name__)

_TAG = "dabench.t"  # an op's index before a pass (temporary; removed when the pipeline ends)
_NEW = "dabench.new"  # an op the pass created: its index after it


def parse_pipeline(text: str) -> list[str]:
    """``'a,b{x=1,y=2},func.func(c,d)'`` -> ``['a', 'b{x=1,y=2}', 'func.func(c,d)']`` (top-level commas)."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    if depth != 0 or not any(out):
        raise UserError(f"--mlir-pipeline {text!r}: expected comma-separated MLIR pass names (balanced brackets)")
    if not all(out):
        raise UserError(f"--mlir-pipeline {text!r}: an empty pass name between commas; drop the extra comma")
    return out


class MlirPassError(UserError):
    """A pass of an MLIR pipeline failed; ``steps`` holds the passes before it, with their results."""

    def __init__(self, message: str, steps: list[PassStep], before: ModuleCost) -> None:
        super().__init__(message)
        self.steps = steps
        self.before = before


@dataclass(frozen=True)
class ModuleCost:
    """What a linalg (or bufferized) module does and moves, summed over its ops."""

    ops: int
    linalg_ops: int
    contraction_flops: int
    vector_flops: int
    special_ops: int
    bytes_read: int
    bytes_written: int
    intermediates: int  # tensors an op writes and another op reads back (not function results)
    intermediate_bytes: int
    buffers: int | None = None  # memref.alloc after bufferization (None: still on tensors)
    buffer_bytes: int | None = None

    @property
    def flops(self) -> int:
        return self.contraction_flops + self.vector_flops + self.special_ops

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"flops": self.flops}


@dataclass
class PassStep:
    """One pass of a pipeline: the module's cost after it, and what it did to the ops."""

    name: str
    seconds: float
    cost: ModuleCost
    kept: int
    created: int
    fused_away: int  # ops that went and that a created op claims (fused into it, or rewritten as it)
    removed: int  # ops that went and that nothing claims (CSE, dead code, folding)

    def to_dict(self, before: ModuleCost) -> dict[str, Any]:
        after = self.cost.to_dict()
        prev = before.to_dict()
        delta = {
            k: (v - prev[k] if isinstance(v, int) and isinstance(prev[k], int) else None) for k, v in after.items()
        }
        return {
            "pass": self.name,
            "seconds": self.seconds,
            "kept": self.kept,
            "created": self.created,
            "fused_away": self.fused_away,
            "removed": self.removed,
            "after": after,
            "delta": delta,
        }


@dataclass
class PipelineRecord:
    """A pipeline's run: the module before, each pass, and the op-level provenance."""

    passes: list[str]
    before: ModuleCost
    steps: list[PassStep] = field(default_factory=list)
    sources: dict[int, frozenset[int]] = field(default_factory=dict)  # op index after -> op indices before
    kept: frozenset[int] = frozenset()  # op indices after that are ops of the module before, unchanged

    def steps_dict(self) -> list[dict[str, Any]]:
        out, prev = [], self.before
        for s in self.steps:
            out.append(s.to_dict(prev))
            prev = s.cost
        return out


# -- the module's cost ---------------------------------------------------------------------
def _top_ops(module: Any) -> list[Any]:
    return [op for op in ops_in(getattr(module, "operation", module)) if op.name not in ("builtin.module", "func.func")]


def is_view(name: str) -> bool:
    """A tensor or buffer op that only views its operand (a reshape, a cast): no bytes, no unit of work."""
    return name in VIEW_OPS or name in BUFFER_VIEWS


def _reaches_return(value: Any, depth: int = 0) -> bool:
    for use in value.uses:
        user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
        if user.name == "func.return":
            return True
        if depth < 16 and is_view(user.name) and any(_reaches_return(r, depth + 1) for r in user.results):
            return True
    return False


@generic_op_views()
def module_cost(module: Any, counts: Sequence[Any]) -> ModuleCost:
    """`ModuleCost` of ``module`` from its `count_module` counts."""
    from torch_mlir import ir

    total = sum((c.cost for c in counts), Cost())
    inter = inter_bytes = 0
    for c in counts:
        if is_view(c.op_name) or c.op_class == "uncounted":
            continue
        for r in c.op.results:
            if isinstance(r.type, ir.RankedTensorType) and not _reaches_return(r):
                inter += 1
                inter_bytes += tensor_nbytes(r.type)
    allocs = [op for op in _top_ops(module) if op.name in ("memref.alloc", "memref.alloca")]
    bufferized = bool(allocs) or any(
        isinstance(a.type, ir.MemRefType) for op in _top_ops(module) if op.name == "func.return" for a in op.operands
    )
    return ModuleCost(
        ops=sum(1 for c in counts if not is_view(c.op_name)),
        linalg_ops=sum(1 for c in counts if c.op_name.startswith("linalg.")),
        contraction_flops=total.contraction_flops,
        vector_flops=total.vector_flops,
        special_ops=total.special_ops,
        bytes_read=total.weight_bytes + total.act_bytes_in,
        bytes_written=total.act_bytes_out,
        intermediates=inter,
        intermediate_bytes=inter_bytes,
        buffers=len(allocs) if bufferized else None,
        buffer_bytes=sum(tensor_nbytes(a.results[0].type) for a in allocs) if bufferized else None,
    )


# -- running passes ---------------------------------------------------------------------------
def _pass_manager(text: str, context: Any) -> Any:
    """A PassManager for one pass: on the module, else nested on func.func (a function pass)."""
    from torch_mlir.passmanager import PassManager

    with context:
        try:
            return PassManager.parse(f"builtin.module({text})")
        except ValueError as first:
            try:
                return PassManager.parse(f"builtin.module(func.func({text}))")
            except ValueError:
                msg = next((ln.strip() for ln in str(first).splitlines() if "error" in ln), str(first).splitlines()[0])
                raise UserError(
                    f"--mlir-pipeline: pass {text!r} is not an MLIR pass torch-mlir knows: "
                    f"{msg.split('error:', 1)[-1].strip()}"
                ) from None


def _tag(ops: list[Any], context: Any, key: str = _TAG) -> None:
    """Tag each op with its index in ``ops`` (Python op objects are not unique: attributes are)."""
    from torch_mlir import ir

    i64 = ir.IntegerType.get_signless(64, context=context)
    for i, op in enumerate(ops):
        op.attributes[key] = ir.IntegerAttr.get(i64, i)
        if key == _TAG and _NEW in op.attributes:
            del op.attributes[_NEW]


def _tag_of(op: Any, key: str = _TAG) -> int | None:
    from torch_mlir import ir

    return ir.IntegerAttr(op.attributes[key]).value if key in op.attributes else None


def _fusable(op: Any) -> bool:
    """Whether elementwise fusion can fold ``op`` into a consumer: not a reduction, not a contraction."""
    if "iterator_types" in op.attributes:
        return all("parallel" in str(a) for a in op.attributes["iterator_types"])
    return not any(k in op.name for k in ("matmul", "conv", "reduce", "pooling", "contract"))


def _payload_names(op: Any) -> set[str]:
    """The ONNX nodes the ops in a linalg op's body name (fusion keeps each moved op's location)."""
    if not op.name.startswith("linalg.") or not op.regions or not len(op.regions[0].blocks):
        return set()
    return {n for inner in op.regions[0].blocks[0].operations for n in origin_of(inner.location).names}


@dataclass(frozen=True, slots=True)
class OperandId:
    """Who produced an operand: ``kind`` ``op`` (an op tagged before the pass: ``id`` is its tag),
    ``new`` (an op the pass created: ``id`` is its index among the ops after it), ``arg`` (the
    function's argument ``id``) or ``block`` (a region's argument)."""

    kind: str
    id: int
    result: int = 0


@dataclass(frozen=True, slots=True)
class OpBefore:
    """What `_Claims` reads of an op as it was before a pass (the op itself may be gone)."""

    name: str
    operands: list[OperandId]
    origins: tuple[str, ...]  # the graph nodes its location names
    result_types: tuple[str, ...]
    fusable: bool  # elementwise: fusion may fold it into a consumer (`_fusable`)

    @classmethod
    def of(cls, op: Any) -> OpBefore:
        return cls(
            op.name,
            [operand_id(o) for o in op.operands],
            origin_of(op.location).names,
            tuple(str(r.type) for r in op.results),
            _fusable(op),
        )


class _Claims:
    """Which gone ops (tags before a pass) each created op (its index in ``after``) stands for, and
    how each gone op was claimed (``method``: dataflow, shared or location): the four rules of the
    module docstring, applied in order by `claim`."""

    def __init__(self, before: dict[int, OpBefore], after: list[Any], after_tags: list[int | None]) -> None:
        self.before, self.after = before, after
        self.gone = set(before) - {t for t in after_tags if t is not None}
        # created ops that do work or view it (not tensor.empty, constants): only they stand for gone ops
        self.created = [
            i for i, t in enumerate(after_tags) if t is None and (_counted(after[i].name) or is_view(after[i].name))
        ]
        # each created op's operands, read once: both walks and the location rule compare them
        self.inputs = {i: {operand_id(o) for o in after[i].operands} for i in self.created}
        self.stands: dict[int, set[int]] = {i: set() for i in self.created}
        self.claims: dict[int, set[int]] = {i: set() for i in self.created}
        self.method: dict[int, str] = {}
        self.anchors: set[int] = set()
        self.after_tags = after_tags

    def claim(self) -> tuple[dict[int, set[int]], dict[int, str]]:
        self._by_operand()
        self._by_node()
        self.anchors = {t for s in self.stands.values() for t in s}
        self._walk(self.stands)
        replaced = Counter(t for s in self.stands.values() for t in s)
        self.method.update((t, "shared") for t, n in replaced.items() if n > 1)  # several created ops replaced it
        placed = self._by_location()
        self._walk({i: p for i, p in placed.items() if p})  # and what was fused into the ops placed by location
        return self.claims, self.method

    def _by_operand(self) -> None:
        """1. A kept op reads a created op where it read a gone one: the created op stands for it."""
        for op, t in zip(self.after, self.after_tags, strict=True):
            if t is None or len(op.operands) != len(self.before[t].operands):
                continue
            for operand, old in zip(op.operands, self.before[t].operands, strict=True):
                new = operand_id(operand)
                if new.kind == "new" and old.kind == "op" and old.id in self.gone and new.id in self.stands:
                    self.stands[new.id].add(old.id)

    def _by_node(self) -> None:
        """1b. Else a gone op of the same node: same kind and result types, else same kind, else a
        work op for a work op (a view for a view): an op re-created in another shape (reshapes
        propagated)."""
        tiers = (
            lambda op, e: (op.name, tuple(str(r.type) for r in op.results)) == (e.name, e.result_types),
            lambda op, e: op.name == e.name,
            lambda op, e: is_view(op.name) == is_view(e.name),
        )
        taken = {t for s in self.stands.values() for t in s}
        by_node: dict[str, list[int]] = {}
        for t in sorted(self.gone):
            if self.before[t].origins:
                by_node.setdefault(self.before[t].origins[0], []).append(t)
        for match in tiers:
            for i in self.created:
                if self.stands[i]:
                    continue
                op = self.after[i]
                node = origin_of(op.location).names[:1]
                same = (
                    [t for t in by_node.get(node[0], ()) if t not in taken and match(op, self.before[t])]
                    if node
                    else []
                )
                if same:
                    self.stands[i].add(same[0])
                    taken.add(same[0])

    def _walk(self, starts: dict[int, set[int]]) -> None:
        """Claim the gone ops behind each created op's ``starts``, up to its own inputs and the others'
        anchors: reached from one created op, fused into it; from several, re-created in each (shared)."""
        before, method = self.before, self.method
        reach: dict[int, set[int]] = {}
        for i, first in starts.items():
            view = is_view(self.after[i].name)
            inputs = self.inputs[i]
            seen: set[int] = set()
            stack = list(first)
            while stack:
                t = stack.pop()
                work = not is_view(before[t].name)
                if t in seen or (view and work) or (work and t in method and t not in first):
                    continue  # a view claims views only; a view claimed already is walked through again
                seen.add(t)
                for old in before[t].operands:
                    if old.kind != "op" or old in inputs or old.id not in self.gone:
                        continue
                    if old.id not in self.anchors or old.id in self.stands[i] or is_view(before[old.id].name):
                        stack.append(old.id)
            reach[i] = seen
        for i, seen in reach.items():
            self.claims[i] |= seen
            for t in seen - starts[i]:
                method[t] = "shared" if t in method else "dataflow"
            for t in seen & starts[i]:
                method.setdefault(t, "dataflow")

    def _by_location(self) -> dict[int, set[int]]:
        """2. Location, consumers first: a gone op nothing claimed joins a created op that names its
        node, by its own location or (a producer fused into it) by the ops in its body; among those,
        the op its consumer went to, else one that reads what it read (fusion moves a producer's
        inputs into the op it joins). A reduction or contraction is never fused into another op:
        only an op of its own node can be it. Returns what each created op took this way."""
        before, after, created = self.before, self.after, self.created
        own = {i: set(origin_of(after[i].location).names) for i in created}
        body = {i: own[i] | _payload_names(after[i]) for i in created}
        inputs = self.inputs
        consumers: dict[int, set[int]] = {}
        for u, entry in before.items():
            for old in entry.operands:
                if old.kind == "op":
                    consumers.setdefault(old.id, set()).add(u)

        def went_to(t: int, depth: int = 0) -> set[int]:
            out: set[int] = set()
            for u in consumers.get(t, ()):
                have = {i for i in created if u in self.claims[i] and not is_view(after[i].name)}
                through_view = depth < 16 and u in self.gone and is_view(before[u].name)
                out |= have or (went_to(u, depth + 1) if through_view else set())
            return out

        placed: dict[int, set[int]] = {i: set() for i in created}
        for t in sorted(self.gone - set(self.method), reverse=True):
            names = body if before[t].fusable else own
            fits = [i for i in created if set(before[t].origins) & names[i]]
            if not fits:
                continue
            view = is_view(before[t].name)
            fits = [i for i in fits if is_view(after[i].name) == view] or fits
            kept_in = {
                old for old in before[t].operands if old.kind == "arg" or (old.kind == "op" and old.id not in self.gone)
            }
            best = (went_to(t) & set(fits) if not view else set()) or {
                min([i for i in fits if kept_in and kept_in <= inputs[i]] or fits)
            }
            for i in best:
                placed[i].add(t)
                self.claims[i].add(t)
            self.method[t] = "location" if len(best) == 1 else "shared"
        return placed


@generic_op_views()
def run_mlir_pipeline(
    module: Any,
    passes: Sequence[str],
    *,
    weight_args: frozenset[int] = frozenset(),
    counts: Sequence[Any] | None = None,
) -> tuple[PipelineRecord, list[Any]]:
    """Run ``passes`` on ``module`` (in place) one at a time, costing it after each.

    Returns the record and the counts of the transformed module. ``counts`` are the module's
    counts before (counted here when not given). A pass that fails raises `MlirPassError`
    naming it and MLIR's first diagnostic; it holds the steps before it.
    """
    from torch_mlir import ir

    operation = getattr(module, "operation", module)
    context = operation.context
    managers = [_pass_manager(p, context) for p in passes]  # an unknown pass fails before any work
    counts = list(counts) if counts is not None else count_module(operation, weight_args=weight_args)
    record = PipelineRecord(list(passes), module_cost(operation, counts))
    first = _top_ops(operation)
    _tag(first, context)
    sources: dict[int, frozenset[int]] = {t: frozenset() for t in range(len(first))}  # tag -> counts before
    for k, c in enumerate(counts):
        t = _tag_of(c.op)
        if t is not None:
            sources[t] = frozenset({k})
    pristine = {t for t in sources if sources[t]}
    for text, pm in zip(passes, managers, strict=True):
        ops = _top_ops(operation)
        before = {_tag_of(op): OpBefore.of(op) for op in ops}
        started = time.perf_counter()
        try:
            with context, captured_stderr():
                pm.run(operation)
        except ir.MLIRError as exc:
            _untag(operation)
            raise MlirPassError(
                f"--mlir-pipeline: pass {text!r} failed: {first_diagnostic(exc)}", record.steps, record.before
            ) from None
        seconds = time.perf_counter() - started
        after = _top_ops(operation)
        after_tags = [_tag_of(op) for op in after]
        _tag([op for op in after], context, _NEW)
        claims, method = _Claims(before, after, after_tags).claim()
        counted_before = {t for t, entry in before.items() if _counted(entry.name)}
        kept = {t for t in after_tags if t is not None}
        new_sources = _carry_sources(before, after, after_tags, sources, claims, method, context)
        new_pristine = {i for i, t in enumerate(after_tags) if t is not None and t in pristine}
        gone = counted_before - kept
        created = sum(1 for i, t in enumerate(after_tags) if t is None and _counted(after[i].name))
        sources = new_sources
        _tag(after, context)  # tags are now the op's index in `after`
        pristine = new_pristine
        counts = count_module(operation, weight_args=weight_args)
        step = PassStep(
            text,
            seconds,
            module_cost(operation, counts),
            kept=len(counted_before & kept),
            created=created,
            fused_away=sum(1 for t in gone if t in method),
            removed=sum(1 for t in gone if t not in method),
        )
        record.steps.append(step)
        logger.info("mlir pass %s: %.3f s, %d ops -> %d", text, seconds, len(ops), len(after))
    final = [_tag_of(c.op) for c in counts]
    record.sources = {k: sources.get(t, frozenset()) if t is not None else frozenset() for k, t in enumerate(final)}
    record.kept = frozenset(k for k, t in enumerate(final) if t in pristine)
    _untag(operation)
    return record, counts


def _carry_sources(
    before: dict[int, OpBefore],
    after: list[Any],
    after_tags: list[int | None],
    sources: dict[int, frozenset[int]],
    claims: dict[int, set[int]],
    method: dict[int, str],
    context: Any,
) -> dict[int, frozenset[int]]:
    """Each op after a pass (its index) -> the counts before the pipeline it comes from: a kept op's
    own, a created op's those of the ops it claims. A created op's location becomes a fused one
    of its own nodes and those of the ops it claims by dataflow or location (not shared ones)."""
    from torch_mlir import ir

    new_sources: dict[int, frozenset[int]] = {}
    for i, op in enumerate(after):
        t = after_tags[i]
        if t is not None:
            new_sources[i] = sources.get(t, frozenset())
            continue
        claimed = claims.get(i, set())
        new_sources[i] = frozenset().union(*(sources.get(c, frozenset()) for c in claimed))
        fused = (n for c in sorted(claimed) if method[c] != "shared" for n in before[c].origins)
        names = list(dict.fromkeys([*origin_of(op.location).names, *fused]))
        if len(names) > 1:
            op.location = ir.Location.fused([ir.Location.name(n, context=context) for n in names], context=context)
    return new_sources


def operand_id(value: Any) -> OperandId:
    """Who produced ``value`` (`OperandId`): a tagged op, an untagged one (created by the pass), a
    function argument or a region's argument."""
    from torch_mlir import ir

    if isinstance(value, ir.BlockArgument):
        owner = value.owner.owner
        if owner is not None and owner.operation.name == "func.func":
            return OperandId("arg", value.arg_number)
        return OperandId("block", 0)
    op = value.owner.operation if hasattr(value.owner, "operation") else value.owner
    tag = _tag_of(op)
    if tag is not None:
        return OperandId("op", tag, value.result_number)
    return OperandId("new", _tag_of(op, _NEW), value.result_number)


def _counted(name: str) -> bool:
    return (
        (name.startswith("linalg.") or name.startswith("tensor.") or name == "memref.copy")
        and not is_view(name)
        and name not in ("tensor.empty", "tensor.dim", "tensor.extract", "tensor.from_elements")
    )


def _untag(operation: Any) -> None:
    for op in _top_ops(operation):
        for key in (_TAG, _NEW):
            if key in op.attributes:
                del op.attributes[key]


# -- per ONNX node ----------------------------------------------------------------------------
def whole_shares(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (equal when all are 0), whole units, summing to ``total``."""
    n = len(weights)
    if sum(weights) <= 0:
        weights = [1] * n
    s = sum(weights)
    raw = [total * w / s for w in weights]
    out = [math.floor(r) for r in raw]
    for i in sorted(range(n), key=lambda i: (-(raw[i] - out[i]), i))[: total - sum(out)]:
        out[i] += 1
    return out


def split_by_nodes(
    counts: Sequence[Any],
    before: Mapping[str, Cost],
    *,
    sources: Mapping[int, frozenset[int]] | None = None,
    counts_before: Sequence[Any] = (),
) -> tuple[dict[str, Cost], dict[str, set[str]]]:
    """Each op's cost onto the ONNX nodes its location names (the module doc's rule).

    A fused op's cost is split, field by field, by what the ops it was made of held of that field
    before the pipeline, per node: ``sources`` (a pipeline's `PipelineRecord.sources`, indices into
    ``counts_before``), so a matmul's multiply-adds stay on its MatMul and a fused producer's
    arithmetic goes to the producer's node (split by the nodes' whole costs, a MatMul whose bias add
    was fused into the next MatMul's generic took half of that MatMul's 604 MFLOP). Where its ops
    held none of a field, or without ``sources``, by ``before``: each node's cost before the
    pipeline. Returns the cost per node and, per node, the other nodes it shares a fused op with."""
    out: dict[str, Cost] = {}
    shared: dict[str, set[str]] = {}
    for op_index, c in enumerate(counts):
        names = list(c.origin.names) or ([c.origin.name] if c.origin.name else ["unattributed"])
        if len(names) == 1:
            out[names[0]] = out.get(names[0], Cost()) + c.cost
            continue
        made_of = [counts_before[i] for i in (sources or {}).get(op_index, ())]
        parts = {
            f.name: whole_shares(getattr(c.cost, f.name), _split_weights(f.name, names, made_of, before))
            for f in fields(Cost)
        }
        for j, n in enumerate(names):
            out[n] = out.get(n, Cost()) + Cost(**{k: v[j] for k, v in parts.items()})
            shared.setdefault(n, set()).update(m for m in names if m != n)
    return out, shared


def _split_weights(field: str, names: list[str], made_of: Sequence[Any], before: Mapping[str, Cost]) -> list[int]:
    """How much of ``field`` each of ``names`` held among the ops a fused op was made of, or, where
    they held none of it, in the nodes' whole costs before (`split_by_nodes`)."""
    held = [sum(getattr(op.cost, field) for op in made_of if op.origin.name == n) for n in names]
    return held if sum(held) > 0 else [getattr(before.get(n, Cost()), field) for n in names]


# -- the placed graph -----------------------------------------------------------------------
def unit_names(counts: Sequence[Any], suffix: str = "") -> list[str | None]:
    """A node name per counted op (None for views): ``<first node>`` when it is that node's only
    op, else ``<first node>#k``; ``suffix`` marks ops a pipeline created (``node/linalg-fuse``)."""
    bases = [None if is_view(c.op_name) else (c.origin.name or "mlir_op") for c in counts]
    total: dict[str, int] = {}
    for b in bases:
        if b is not None:
            total[b] = total.get(b, 0) + 1
    seen: dict[str, int] = {}
    out: list[str | None] = []
    for b in bases:
        if b is None:
            out.append(None)
            continue
        k = seen[b] = seen.get(b, -1) + 1
        out.append(b + suffix if total[b] == 1 else f"{b}{suffix}#{k}")
    return out


def unit_graph(
    source: Graph, module: Any, counts: Sequence[Any], names: Sequence[str | None], *, path: str | None
) -> Graph:
    """The module's ops as a costed Graph for the lowerings: one node per op (a fused
    ``linalg.generic`` is one unit of work), named by ``names``, wired by SSA values, its module
    scope the common scope of the ONNX nodes it names (from ``source``, the ONNX graph)."""
    from dabench_ir.study.scopes import common_scope

    artifact: MlirArtifact = source.meta[MLIR_ARTIFACT]
    art = MlirArtifact(module, weight_args=artifact.weight_args, source=artifact.source)
    # the source's inputs, unread: the run's batch is the graph's batch dim (`dabench_ir.run`), so a
    # unit graph runs the samples its ONNX graph does (it had no input: one sample, half the samples/s)
    inputs = {name: dataclasses.replace(source.values[name], producer=None) for name in source.inputs}
    graph = Graph(
        [], inputs, list(inputs), [], name=source.name, path=path, metadata=source.metadata, bindings=source.bindings
    )
    graph.meta[MLIR_ARTIFACT] = art
    by_unit: dict[str, list[Any]] = {}
    for c, n in zip(counts, names, strict=True):
        if n is not None and c.op_class != "uncounted":
            by_unit.setdefault(n, []).append(c)
    create_nodes(graph, by_unit, art)
    for node in graph.nodes:
        c = by_unit[node.name][0]
        onnx_nodes = [source.node(n) for n in c.origin.names if source.has_node(n)]
        node.scope = common_scope([n.scope for n in onnx_nodes if n.scope])
        layers = {n.layer for n in onnx_nodes}
        node.layer = layer_from_scope(node.scope) if node.scope else (layers.pop() if len(layers) == 1 else None)
        node.attrs["origins"] = list(c.origin.names)
    graph.invalidate()
    kept = [(c, n) for c, n in zip(counts, names, strict=True) if n is not None or c.op_class == "uncounted"]
    assign_costs(graph, [c for c, _ in kept], [n for _, n in kept])  # views (no name) cost nothing
    return graph
