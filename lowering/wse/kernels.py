"""WSE kernel classification: the graph cut into the Cerebras compiler's kernels, and their work.

In pipelined mode (docs/targets.md, WSE section) the compiler cuts the graph into kernels at
its own granularity (a whole attention block, each fc, layer norm, GELU, residual add,
embedding/LM head, loss; `wse_kernels`); each kernel then gets a rectangular region of PEs
(`pipelined`). Weight streaming (`streaming`) reads the same grouping for the token-table
lookup's work and for what an attention kernel keeps for backward.

- A kernel's busy PE-seconds per sample ``W = C/f_mm + V/f_vec + S/f_sp + D/(link x clock)``
  from its nodes' `Cost`, each rate a PE's share of the target's rate for that op class
  (`Target.compute_time`: contraction FLOPs at ``pe_matmul_efficiency`` of the rate of their
  accumulator, fp32 under mixed precision (`passes.precision.accumulate_dtype`), vector
  ops at ``[compute.vector_flops]``, transcendentals at ``[compute.special_ops]``), data
  movement at the fabric link width (`KernelRates`, `_measure`).
- A residual add whose other input crosses attention holds one sample of its skip stream in
  a FIFO in its region (`_skip_bytes`; `pipelined` sizes the FIFO in whole rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from dabench_ir.errors import TargetError
from dabench_ir.ir import Cost, DType, Node, module_kind, module_of
from dabench_ir.lowering.context import LoweringContext
from dabench_ir.lowering.wse.common import WHO, is_data, phase_cost, sample_count, shape_of, trained_params
from dabench_ir.passes import meta
from dabench_ir.passes.cost_rules import OpClass, Role, traits_of
from dabench_ir.passes.precision import accumulate_dtype
from dabench_ir.passes.training import FORWARD_COST, is_loss, is_optimizer_step, token_table

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.targets import Target

__all__ = ["KERNEL_CLASSES", "KernelCut", "KernelRates", "WseKernel", "kernel_cut", "wse_kernels"]

KERNEL_CLASSES = ("attention", "fc", "emb_fc", "nlin", "layer_norm", "add", "mlm_loss", "vector", "data")
"""Kernel classes as the compile report names them (``vector``/``data``: any other kernel)."""


def _is_norm(node: Node) -> bool:
    """A row-reducing normalisation (the layer/RMS norm family; GroupNormalization is not)."""
    t = traits_of(node)
    return Role.NORM in t.roles and t.row_reductions > 0


# -- per-PE work of nodes and kernels -----------------------------------------------------
@dataclass(slots=True)
class KernelRates:
    """What the kernels' per-PE work is timed with, read once from the Target: its per-class
    rates (`Target.compute_time`: contraction at ``pe_matmul_efficiency`` of the peak, vector
    and special-function ops at ``[compute.vector_flops]`` / ``[compute.special_ops]``), shared
    evenly by its PEs, and the fabric link width for pure data movement."""

    target: Target
    pes: int
    clock: float
    mm_efficiency: float
    link_bytes: float
    _mm_dtype: dict[DType, DType] = field(default_factory=dict)  # precision -> the dtype its contractions run at
    _seconds: dict[tuple, float] = field(
        default_factory=dict
    )  # `work_s` by its arguments: a layer's costs repeat in every layer

    @classmethod
    def of(cls, target: Target) -> KernelRates:
        return cls(
            target=target,
            pes=target.num_units,
            clock=float(target.clock),
            mm_efficiency=target.arch_value("pe_matmul_efficiency", needed_by=WHO),
            link_bytes=target.arch_value("fabric_link_bytes_per_cycle", needed_by=WHO),
        )

    def work_s(self, cost: Cost, precision: DType, data_movement: bool, accumulate: DType | None = None) -> float:
        """Busy seconds of ``cost`` on one PE: its whole-wafer compute time at the per-class
        rates times the PEs (one PE does a ``1/pes`` share of each rate), plus the bytes a
        pure data-movement op moves at the link width. Contractions run at the rate of their
        accumulator (``accumulate``: fp32 under mixed precision, the 2-lane datapath of
        ``[compute.fp32_accumulate_flops]``; None: as the inputs). A precision the target has no
        peak for computes its contractions at the fp16 rate."""
        key = (cost, precision, data_movement, accumulate)
        seconds = self._seconds.get(key)
        if seconds is None:  # a 48-layer graph's 1,731 nodes have 15 distinct arguments
            seconds = self._seconds[key] = self._work_s(cost, precision, data_movement, accumulate)
        return seconds

    def _work_s(self, cost: Cost, precision: DType, data_movement: bool, accumulate: DType | None) -> float:
        mm_dtype = self._mm_dtype.get(precision)
        if mm_dtype is None:  # one look-up a precision, not one a node
            try:
                self.target.peak_flops(precision)
                mm_dtype = precision
            except TargetError:
                mm_dtype = DType.FLOAT16
            self._mm_dtype[precision] = mm_dtype
        seconds = (
            self.target.compute_time(
                cost,
                precision,
                contraction_dtype=mm_dtype,
                contraction_efficiency=self.mm_efficiency,
                accumulate_dtype=accumulate,
            )
            * self.pes
        )
        if data_movement and cost.flops == 0:
            seconds += (cost.act_bytes_in + cost.act_bytes_out) / self.link_bytes / self.clock
        return seconds


# -- kernel grouping -------------------------------------------------------------------------
@dataclass(slots=True)
class WseKernel:
    """One compiled kernel: its class, nodes and per-sample work on one PE.

    ``direction`` is ``fwd``/``bwd`` for a residual add split into its forward add and the
    backward gradient sum (training), else ``""`` (the kernel does both directions).
    """

    cls: str
    key: str
    nodes: list[Node] = field(default_factory=list)
    direction: str = ""
    work_s: float = 0.0  # busy PE-seconds per sample
    node_work_s: dict[str, float] = field(default_factory=dict)
    tokens: int = 1  # token rows per sample the kernel streams
    width: int = 1  # elements per row of its output
    out_elems: int = 1  # output elements per sample (the most PEs its shape allows, in row chunks)
    params: int = 0
    skip_bytes: int = 0  # per sample: a residual add's skip stream held while its other input crosses attention

    @property
    def rows(self) -> int:
        """The token rows a sample streams through the kernel, one after another as they arrive."""
        return max(1, self.tokens)

    @property
    def holds_sample(self) -> bool:
        """Whether the kernel emits a sample's rows only once it has read the whole sample: an
        attention kernel (its scores span the sequence: the skip FIFOs of `_skip_bytes`; its backward
        reads every row's gradient before it emits one, the causal mask putting every later query
        row behind each key row). Every other kernel passes each row on as it makes it."""
        return self.cls == "attention"

    def first_row_s(self, per_sample_s: float) -> float:
        """When a sample's first row leaves the kernel, at ``per_sample_s`` a sample: one row's time,
        or the whole sample's where it holds the sample (`holds_sample`)."""
        return per_sample_s if self.holds_sample else per_sample_s / self.rows


def _stored_weight(ctx: LoweringContext, node: Node) -> bool:
    """Whether ``node`` reads a stored value or a folded layout of one."""
    if not ctx.stored.isdisjoint(node.inputs):
        return True
    graph = ctx.graph
    for v in node.inputs:
        value = graph.values.get(v) if v else None
        if value is not None and value.producer and meta.FOLDED in graph.node(value.producer).meta:
            return True
    return False


def wse_kernels(ctx: LoweringContext, target: Target, *, fuse_elementwise: bool = True) -> list[WseKernel]:
    """The graph cut into kernels (`kernel_cut`, a fact of the context: every plan of the graph cuts
    it the same way), each kernel's per-sample work, rows and parameters measured on ``target``
    (fresh records: a plan's kernels are its own)."""
    cut = ctx.fact(kernel_cut, fuse_elementwise)
    kernels = [replace(k, nodes=list(k.nodes)) for k in cut.kernels]
    _measure(ctx, kernels, cut.vocab, KernelRates.of(target))
    return kernels


class KernelCut(NamedTuple):
    """The graph's kernels as cut (`kernel_cut`: classes, keys, nodes, a residual add's direction and
    skip bytes; not yet measured), and the vocabulary of its token table (0 when it has none, `token_table`)."""

    kernels: tuple[WseKernel, ...]
    vocab: int


def kernel_cut(ctx: LoweringContext, fuse_elementwise: bool) -> KernelCut:
    """The graph cut into kernels at the Cerebras compiler's granularity, in topological order.

    By scope first, op pattern where there is no scope (docs/targets.md, WSE section):
    everything under an ``attn``/``attention`` module of a block is one ``attention`` kernel
    (without scopes: an activation x activation matmul opens one and the ops that read it,
    up to the second such matmul, join it); a contraction with a stored weight is an ``fc``
    (its bias add and layout ops ride along), or ``emb_fc`` when it produces vocab-sized
    rows, together with the token-embedding Gather; norm ops or a ``*norm`` scope are a
    ``layer_norm``; activation functions a ``nlin``; an Add of two activations outside those
    a residual ``add`` (two kernels in training: forward add and backward gradient sum);
    the training loss and softmax/loss ops after the LM head ``mlm_loss``; any other op its own ``vector`` or
    ``data`` kernel, or fused onto the kernel whose output it alone reads. Bookkeeping
    (shape-only, folded) nodes ride with the kernel before them; the optimizer step is no
    kernel (its update runs where the weights live).
    """
    graph = ctx.graph
    table, vocab = token_table(graph)
    cut = _Cut()
    training = meta.graph_mode(graph) == "train"
    producer = {out: node for node in graph.nodes for out in node.outputs if out}
    latest = _LatestAttention(graph, producer, cut.owner)
    activations = ctx.activations
    root = graph.model_root  # a list that holds the model (``models.0``) is no decoder block
    for node in graph.nodes:
        if is_optimizer_step(node):
            continue
        module = module_of(node.scope, root)  # its decoder block, and the module it is in there
        prefix, rest = module.block, module.rest
        inputs_from = [cut.owner[v] for v in node.inputs if v in cut.owner]
        bookkeeping = ctx.is_shape(node) or meta.FOLDED in node.meta or not ctx.is_work(node)
        acts = [v for v in node.inputs if v in activations]
        op_class = node.meta.get(meta.OP_CLASS)
        is_contraction = op_class is OpClass.CONTRACTION or (
            op_class is None and ctx.costs[node.name].contraction_flops > 0
        )
        weighted = _stored_weight(ctx, node)
        layer = str(node.layer) if node.layer is not None else prefix
        # 1. attention by scope
        if prefix and module.kind == "attention":
            cut.add(f"{prefix}.attention", "attention", node)
            continue
        if bookkeeping:
            if inputs_from:
                cut.add(inputs_from[-1].key, inputs_from[-1].cls, node)
            else:  # a weight's folded layout or a constant: placed with the kernel that reads it
                cut.deferred.append(node)
            continue
        if is_contraction and weighted:
            out = shape_of(ctx, node.outputs[0]) if node.outputs else None
            if vocab and out and out[-1] == vocab:
                cut.add("emb_fc", "emb_fc", node)
                cut.after_head = True
            else:
                cut.add(node.scope or node.name, "fc", node)
            continue
        if node.op_type == "Gather" and vocab and node.inputs and node.inputs[0] == table:
            cut.add("emb_fc", "emb_fc", node)
            continue
        if is_contraction and len(acts) >= 2 and not weighted:  # act x act: attention without scopes
            cut.add(cut.open_attention(inputs_from, layer), "attention", node)
            continue
        open_into = next((k for k in inputs_from if cut.attention_open(k.key)), None)
        if open_into is not None and not weighted and not _is_norm(node):
            cut.add(open_into.key, "attention", node)
            continue
        if _is_norm(node) or (rest and module_kind(rest[-1]) == "norm"):
            cut.add(node.scope if rest else f"norm.{node.name}", "layer_norm", node)
            continue
        tail = rest[-1].lower() if rest else ""
        if traits_of(node).nonlinear or tail in ("act", "activation", "gelu"):
            cut.add(node.scope if tail in ("act", "activation") else f"nlin.{node.name}", "nlin", node)
            continue
        if is_loss(node) or (
            cut.after_head
            and (traits_of(node).loss or Role.SOFTMAX in traits_of(node).roles or "loss" in node.scope.lower())
        ):
            cut.add("mlm_loss", "mlm_loss", node)
            continue
        if node.op_type in ("Add", "Sum") and len(acts) >= 2 and not weighted:
            shapes = {shape_of(ctx, v) for v in acts}
            if len(shapes) == 1:
                skip = _skip_bytes(ctx, acts, latest)
                for key, direction in (
                    ((f"{node.name}.fwd", "fwd"), (f"{node.name}.bwd", "bwd")) if training else ((node.name, ""),)
                ):
                    cut.add(key, "add", node, direction).skip_bytes = skip
                continue
        # fuse an elementwise op onto the kernel whose output only it reads
        if fuse_elementwise and ctx.is_elementwise(node) and inputs_from:
            prev = inputs_from[-1]
            produced = [v for v in node.inputs if cut.owner.get(v) is prev]
            if produced and all(len(graph.consumers.get(v, [])) == 1 for v in produced) and prev.direction == "":
                cut.add(prev.key, prev.cls, node)
                continue
        cls = "data" if is_data(node) else "vector"
        cut.add(node.scope + "/" + node.name if node.scope else node.name, cls, node)
    cut.place_deferred(graph)
    return KernelCut(tuple(cut.kernels), vocab)


class _Cut:
    """The kernels cut so far, in order, and who holds what: each value's producing kernel
    (``owner``), each node's first kernel (``held_by``), the attention kernels opened without scopes
    with the act x act matmuls each has seen, the nodes waiting for a reader (``deferred``), and
    whether the LM head has been cut (what follows it is the loss)."""

    def __init__(self) -> None:
        self.kernels: list[WseKernel] = []
        self.by_key: dict[str, WseKernel] = {}
        self.owner: dict[str, WseKernel] = {}
        self.held_by: dict[str, WseKernel] = {}
        self.open_attn: dict[str, int] = {}
        self.deferred: list[Node] = []
        self.after_head = False

    def add(self, key: str, cls: str, node: Node, direction: str = "") -> WseKernel:
        """``node`` into the kernel ``key`` (opened as a ``cls`` kernel if new); returns the kernel."""
        k = self.by_key.get(key)
        if k is None:
            k = self.by_key[key] = WseKernel(cls, key, direction=direction)
            self.kernels.append(k)
        k.nodes.append(node)
        self.held_by.setdefault(node.name, k)
        for out in node.outputs:
            if out:
                self.owner[out] = k
        return k

    def attention_open(self, key: str) -> bool:
        """Whether ``key`` is an attention kernel opened without scopes that has not yet seen its
        second act x act matmul."""
        return key in self.open_attn and self.open_attn[key] < 2

    def open_attention(self, inputs_from: list[WseKernel], layer: str | None) -> str:
        """The attention kernel an act x act matmul joins: the open one it reads from, else a new one
        (it counts the matmul)."""
        key = next((k for k, n in self.open_attn.items() if n < 2 and self.by_key[k] in inputs_from), None)
        key = key or f"attention.{layer or len(self.kernels)}.{len(self.open_attn)}"
        self.open_attn[key] = self.open_attn.get(key, 0) + 1
        return key

    def place_deferred(self, graph: Graph) -> None:
        """Each deferred node (a weight's folded layout, a constant) into the kernel of its first
        reader, else the first kernel (a kernel of its own when there is none)."""
        for node in self.deferred:
            readers = [self.owner[out] for out in node.outputs if out in self.owner]
            readers += [  # the first reader's kernel (a map: a scan of every kernel per reader was quadratic)
                self.held_by[n.name]
                for c in (graph.consumers.get(out, []) for out in node.outputs if out)
                for n in c
                if n.name in self.held_by
            ][:1]
            if not readers and not self.kernels:
                self.add(node.name, "data", node)
                continue
            home = readers[0] if readers else self.kernels[0]
            home.nodes.append(node)
            self.held_by.setdefault(node.name, home)


class _LatestAttention:
    """Per tensor, the position (in node order) of the latest attention-kernel output upstream of
    it, -1 for none: one memoised walk over the graph however many residual adds ask, so the
    kernel map stays linear in the graph's size."""

    def __init__(self, graph, producer: dict[str, Node], owner: dict[str, WseKernel]) -> None:
        self.producer, self.owner = producer, owner
        self.pos = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs if out}
        self.memo: dict[str, int] = {}

    def __call__(self, value: str) -> int:
        memo, producer = self.memo, self.producer
        known = memo.get(value)
        if known is not None:  # asked before, or upstream of an earlier ask: no walk
            return known
        stack = [value]
        while stack:  # post-order without recursion (a chain may be 100k nodes deep)
            v = stack[-1]
            if v in memo:
                stack.pop()
                continue
            inputs = [u for u in producer[v].inputs if u] if v in producer else []
            pending = [u for u in inputs if u not in memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            own = self.pos[v] if v in self.owner and self.owner[v].cls == "attention" else -1
            memo[v] = max([own, *(memo[u] for u in inputs)])
        return memo[value]


def _skip_bytes(ctx: LoweringContext, acts: Sequence[str], latest: _LatestAttention) -> int:
    """Bytes per sample a residual add holds in its region: one whole sample of its skip input
    when the other input has passed an attention kernel the skip has not (the latest attention
    upstream of it comes after the skip's latest), else 0.

    Attention emits a sample's rows only after it has read the whole sample (its scores span the
    sequence), so the skip stream, which arrives at once, waits one sample in a FIFO in the add's
    region; the token-wise MLP branch delays a few rows, which the routing FIFOs absorb. The same
    holds in backward for the gradient sum where the attention branch rejoins.
    """
    if len(acts) != 2:
        return 0
    for skip, branch in ((acts[0], acts[1]), (acts[1], acts[0])):
        if latest(branch) > latest(skip):
            return ctx.graph.type_of(skip).nbytes() // max(1, sample_count(ctx)) if shape_of(ctx, skip) else 0
    return 0


def _measure(ctx: LoweringContext, kernels: list[WseKernel], vocab: int, rates: KernelRates) -> None:
    """Fill each kernel's per-sample work, token rows, row width, shape bound and parameters."""
    samples = max(1, sample_count(ctx))
    for k in kernels:
        k.params = trained_params(ctx, k.nodes)
        k.node_work_s = {}
        for node in k.nodes:
            cost = ctx.costs[node.name]
            if k.direction:  # forward add; backward: the gradient sum where the paths rejoin, one add per element
                cost = phase_cost(node, FORWARD_COST, cost)
            if not ctx.is_work(node) or meta.FOLDED in node.meta:
                w = 0.0
            elif node.op_type == "Gather" and k.cls == "emb_fc":
                # the compiler computes the token lookup as a dense one-hot matmul on the
                # (tied) table: 2 x tokens x hidden x vocab FLOPs (inferred from report A)
                out = shape_of(ctx, node.outputs[0]) if node.outputs else None
                elems = math.prod(out) if out else 0
                lookup = Cost(contraction_flops=2 * elems * vocab)
                w = rates.work_s(lookup, ctx.precision, False, accumulate_dtype(ctx.graph)) if out else 0.0
            else:
                w = rates.work_s(cost, ctx.node_precision(node), is_data(node), accumulate_dtype(ctx.graph, node))
            k.node_work_s[node.name] = w / samples
        k.work_s = sum(k.node_work_s.values())
        k.tokens, k.width, k.out_elems = _streams(ctx, k, samples)


def _row_view(shape: tuple[int, ...]) -> int:
    """Elements per row of ``shape``: its last dim that holds more than one element.

    A trailing dim of 1 is layout only (the tool's own rule: Unsqueeze and Reshape are free views of the
    same bytes), so a (1, 1, 1, 128, 1) mask streams as the one row of 128 its (1, 1, 1, 128) view is, not
    as 128 rows of one element each paying the per-row fixed time (TorchScript's vmap mask ends in such a
    dim, dynamo's GatherND does not: issue 45).
    """
    return max(1, next((d for d in reversed(shape) if d != 1), 1))


def _streams(ctx: LoweringContext, k: WseKernel, samples: int) -> tuple[int, int, int]:
    """The kernel's token rows per sample, row width and output elements per sample, from the tensors
    it streams out to other kernels (`_streamed_out`).

    A kernel that streams several outputs is bounded by each: the tied embedding and LM head of
    ``emb_fc`` stream a sample's token rows out of the lookup and its logits out of the head. With the
    last position's logits only (``--logits last``) the lookup still streams every token, so the
    kernel's largest stream (ties: the later, its last output) sets its token rows (the per-row fixed
    time) and its elements (the most PEs its shape allows), and its widest row the PEs across one row.
    """
    shapes = [shape for shape in (shape_of(ctx, v) for v in _streamed_out(ctx, k)) if shape]
    if not shapes:
        return 1, 1, 1
    largest = max(reversed(shapes), key=math.prod)  # reversed: a tie goes to the later stream
    numel, width = math.prod(largest), _row_view(largest)
    return max(1, numel // width // samples), max(_row_view(s) for s in shapes), max(1, numel // samples)


def _streamed_out(ctx: LoweringContext, k: WseKernel) -> list[str]:
    """The values the kernel's work nodes stream to another kernel or out of the graph, else its last
    work node's output (a loss writes no tensor: its input)."""
    graph = ctx.graph
    work = [n for n in k.nodes if ctx.is_work(n) and (n.outputs or n.inputs)]
    if not work:
        return []
    inside = {n.name for n in k.nodes}
    leaving = [
        out
        for n in work
        for out in n.outputs
        if out and (out in graph.outputs or any(c.name not in inside for c in graph.consumers.get(out, [])))
    ]
    last = work[-1]
    return leaving or [(last.outputs or last.inputs)[0]]
