"""Training expansion: each node's cost becomes forward + backward, plus an optimizer step.

The rules, with their sources, are in docs/training.md. In short:

- a contraction's backward computes one gradient contraction per input that needs a
  gradient (dX = dY·Wᵀ, dW = Xᵀ·dY): 2× the forward FLOPs for a linear layer, so a
  matmul-dominated model costs 3× its forward pass (Kaplan et al. 2020, "6N" per token);
- vector ops: backward = 2× forward vector FLOPs (the local derivative, then the product
  with the incoming gradient) and 1× forward special ops (e.g. erf' needs one exp);
- data movement: backward moves the same bytes back (transpose back, scatter-add for gather);
- bytes: backward reads dY, the saved inputs and the weights, writes dX and dW;
- with ``recompute``, each layer's forward runs again during backward and only the tensors
  that cross layer boundaries are kept (``full``), or only the attention cores are recomputed
  (``selective``), or each block keeps the outputs of torchtitan's save-listed ops and runs the
  rest again (``op``);
- a language model's step ends in its loss: one `dabench::SoftmaxCrossEntropy` node reads the
  logits (the graph output as wide as the token-embedding table) and writes their gradient,
  as fused cross-entropy kernels do (the forward's exponentials give p − onehot, no second exp);
- one `dabench::AdamStep` node updates every parameter once per step: 13 vector FLOPs and
  1 sqrt per parameter, reading and writing fp32 master weights, momentum and variance;
- the training state beside the weights is written by kind (gradients in the weights'
  precision, fp32 master weights when the weights are 16-bit, Adam's two fp32 moments,
  saved activations), so each lowering can put each kind where its target keeps it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dabench_ir.errors import UnboundSymbolError, UserError
from dabench_ir.ir import TOOL_DOMAIN, Cost, DType, Graph, Node, ValueKind, value_bytes
from dabench_ir.options import RECOMPUTE

from . import meta
from .base import Pass, PassResult
from .cost_rules import UNKNOWN_OP, Backward, OpClass, OpTraits, Saves, op_traits, traits_of
from .meta import MODEL_FAMILY

__all__ = [
    "ADAM_FLOPS_PER_PARAM",
    "ADAM_MOMENT_BYTES_PER_PARAM",
    "FORWARD_COST",
    "FUSED_ATTENTION",
    "MASTER_BYTES_PER_PARAM",
    "RECOMPUTE",
    "SAVED",
    "FusedAttentionPass",
    "TrainingPass",
    "TrainingRecord",
    "attention_cores",
    "backward_cost",
    "core_internal",
    "is_loss",
    "is_optimizer_step",
    "lm_logits",
    "saved_for_backward",
    "token_table",
]

FORWARD_COST, BACKWARD_COST = meta.FORWARD_COST, meta.BACKWARD_COST  # declared in passes/meta.py
TrainingRecord = meta.TrainingRecord  # the pass's record (``meta.TRAINING``), declared in passes/meta.py

# Adam per parameter: m ← β1·m + (1−β1)·g (3), v ← β2·v + (1−β2)·g² (4), bias corrections
# (2), p ← p − lr·m̂ / (√v̂ + ε) (4): 13 vector FLOPs and one sqrt.
ADAM_FLOPS_PER_PARAM = (13, 1)
# Mixed-precision Adam state (Rajbhandari et al., ZeRO, SC'20, §3.1): 16-bit weights (2) and
# gradients (2), fp32 master weights (4), momentum and variance (8): 16 bytes per parameter.
# The weights are counted where they are read; the rest is training state.
ADAM_MOMENT_BYTES_PER_PARAM = 8  # fp32 momentum and variance
MASTER_BYTES_PER_PARAM = 4  # fp32 master copy, kept when the working weights are 16-bit
OPTIMIZER_OP = (TOOL_DOMAIN, "AdamStep")
LOSS_OP = (TOOL_DOMAIN, "SoftmaxCrossEntropy")
# Softmax cross-entropy per logit, forward: max, subtract, sum and the target pick (4 vector)
# and one exp, plus one log per row (as cost_rules' LogSoftmax); the gradient, in the same pass
# (fused cross-entropy): p = e/sum and the 1/N scale (2 vector), minus onehot at the target (per row).
LOSS_FLOPS_PER_LOGIT = {"forward_vector": 4, "forward_exp": 1, "backward_vector": 2}


_OPTIMIZER_DOMAIN, _OPTIMIZER_TYPE = OPTIMIZER_OP
_LOSS_DOMAIN, _LOSS_TYPE = LOSS_OP


def is_optimizer_step(node: Node) -> bool:
    """The optimizer update the training pass appends: it runs once per step, after every
    micro-batch's backward, and belongs to no layer, stage or section of the model."""
    # no (domain, op_type) tuple built: the lowerings ask this of every node several times (~2.6 x 10^5 a slice)
    return node.op_type == _OPTIMIZER_TYPE and node.domain == _OPTIMIZER_DOMAIN


def is_loss(node: Node) -> bool:
    """The loss the training pass appends to a language model's logits."""
    return node.op_type == _LOSS_TYPE and node.domain == _LOSS_DOMAIN


def token_table(graph: Graph) -> tuple[str | None, int]:
    """A language model's token-embedding table and its row count (the vocabulary); ``(None, 0)`` when
    no Gather reads a stored 2-D table. Of the tables Gathers read, the one as tall as a float output
    is wide (the logits), the largest such; without one (a model without its head), the largest. The
    largest alone took GPT-2's 1,024-row position table for a 1,000-word vocabulary, and the step had
    no loss."""
    tables: dict[str, int] = {}
    for node in graph.nodes:
        table = graph.values.get(node.inputs[0]) if node.op_type == "Gather" and node.inputs else None
        if table is None or not table.kind.is_stored:
            continue
        dims = _dims(graph, table.name)
        if dims is not None and len(dims) == 2:
            tables[table.name] = int(dims[0])
    widths = {dims[-1] for name in graph.outputs if (dims := _float_dims(graph, name))}
    headed = {name: rows for name, rows in tables.items() if rows in widths}
    pool = headed or tables
    if not pool:
        return None, 0
    best = max(pool, key=pool.__getitem__)  # the first of the largest
    return best, pool[best]


def _dims(graph: Graph, name: str) -> tuple[int, ...] | None:
    """A value's dims with the graph's bindings; None when unknown or symbolic."""
    value = graph.values.get(name)
    if value is None:
        return None
    try:
        return tuple(value.type.dims(graph.bindings))
    except UnboundSymbolError:
        return None


def _float_dims(graph: Graph, name: str) -> tuple[int, ...] | None:
    """A float value's dims (`_dims`); None for any other."""
    value = graph.values.get(name)
    return _dims(graph, name) if value is not None and value.type.dtype.is_float else None


def lm_logits(graph: Graph) -> str | None:
    """A language model's logits: the first graph output as wide as its token-embedding table."""
    _, vocab = token_table(graph)
    return next(
        (name for name in graph.outputs if vocab and (dims := _float_dims(graph, name)) and dims[-1] == vocab), None
    )


def _needs_grad(graph: Graph) -> set[str]:
    """Values whose gradient backward must compute: weights and what depends on them."""
    needs = {v.name for v in graph.values.values() if v.kind is ValueKind.WEIGHT}
    for node in graph.nodes:
        if any(name in needs for name in node.inputs if name):
            needs.update(out for out in node.outputs if out)
    return needs


def backward_cost(
    node: Node, forward: Cost, grad_inputs: int, data_inputs: int, traits: OpTraits | None = None
) -> Cost:
    """Backward cost of one node from its forward cost, by its op's `Backward` rule (module docstring).
    ``traits``: the node's `traits_of`, when the caller has them."""
    rule = (traits or traits_of(node)).backward
    if rule is Backward.NONE or grad_inputs == 0:
        return Cost()
    contraction, vector, special = 0, 0, 0
    if rule is Backward.CONTRACTION:
        share = grad_inputs / max(data_inputs, 1)
        contraction = round(forward.contraction_flops * grad_inputs)
        vector = round(forward.vector_flops * share)
    elif rule is Backward.SCATTER_ADD:  # one add per gradient element summed into the table
        vector = forward.act_bytes_out // max(_itemsize(node), 1)
    elif rule is Backward.VECTOR:
        vector, special = 2 * forward.vector_flops, forward.special_ops
    return Cost(
        contraction_flops=contraction,
        vector_flops=vector,
        special_ops=special,
        weight_bytes=2 * forward.weight_bytes,  # read W, write dW
        act_bytes_in=forward.act_bytes_out + forward.act_bytes_in,  # dY and the saved inputs
        act_bytes_out=forward.act_bytes_in,  # dX
    )


def _itemsize(node: Node) -> int:
    dtype = node.meta.get(meta.PRECISION)
    return dtype.itemsize if isinstance(dtype, DType) else 4


# the ``--recompute`` choices, owned by dabench_ir.options (the knob); what each keeps is below
# (`TrainingPass`, `op_checkpoint_keeps`) and in docs/training.md
FUSED_ATTENTION, SAVED = meta.FUSED_ATTENTION, meta.SAVED  # declared in passes/meta.py


def _is_activation(graph: Graph, name: str) -> bool:
    value = graph.values.get(name) if name else None
    return (
        value is not None
        and not value.kind.is_stored
        and value.kind is not ValueKind.CONSTANT
        and (value.type.dtype.is_float)
    )


def saved_for_backward(graph: Graph, node: Node, needs: set[str], traits: OpTraits | None = None) -> dict[str, int]:
    """What autograd keeps of ``node`` for the backward pass: value name -> bytes (extra
    per-row statistics under a ``name#stats`` key). Nothing when no gradient flows through it.

    A contraction keeps each activation operand whose partner needs a gradient (X for dW,
    Q and K for QKᵀ); softmax, sigmoid, tanh, exp and sqrt keep their output; a fused norm
    keeps its input and two fp32 statistics per row; adds, casts, reductions, views and
    layout moves keep nothing; any other vector op (GELU, Pow, Mul, Div, ...) keeps its
    activation inputs that a partner's gradient needs. Which of these an op does is its
    `OpTraits.saves` (PyTorch's saved tensors; docs/training.md). ``traits``: the node's
    `traits_of`, when the caller has them.
    """
    ins = [n for n in node.inputs if n]
    if needs.isdisjoint(ins):
        return {}
    saves = (traits or traits_of(node)).saves
    saved: dict[str, int] = {}
    if saves is Saves.OPERANDS:
        ops = ins[:2]
        for i, name in enumerate(ops):
            partner = ops[1 - i] if len(ops) == 2 else None
            if _is_activation(graph, name) and (partner is None or partner in needs):
                saved[name] = value_bytes(graph, name)
    elif saves is Saves.OUTPUT:
        out = node.outputs[0] if node.outputs else ""
        if out:
            saved[out] = value_bytes(graph, out)
    elif saves is Saves.INPUT_AND_STATS:
        x = ins[0]
        saved[x] = value_bytes(graph, x)
        size = graph.values[x].type.dtype.itemsize if x in graph.values else 4
        saved[f"{x}#stats"] = 2 * 4 * (saved[x] // max(size, 1) // _last_dim(graph, x))  # mean and 1/σ, fp32
    elif saves is Saves.INPUTS:  # elementwise with a data-dependent derivative: the inputs its backward reads
        for i, name in enumerate(ins):
            if _is_activation(graph, name) and _backward_reads(node, ins, i, needs):
                saved[name] = value_bytes(graph, name)
    return saved


def _backward_reads(node: Node, ins: list[str], i: int, needs: set[str]) -> bool:
    """Whether an elementwise op's backward reads its ``i``-th input (autograd's saved tensors).

    A product's gradient with respect to one factor is the other, so Mul keeps a factor only when its
    partner needs a gradient: ``scores * scale`` and ``q * cos`` keep nothing of ``scores`` or ``q``.
    A quotient's gradient with respect to its numerator is one over the denominator: Div keeps its
    numerator only for the denominator's gradient. Any other op (GELU, Pow, Where, ...) reads its
    inputs for its own gradient."""
    if node.domain not in ("", "ai.onnx") or len(ins) != 2:
        return True
    partner = ins[1 - i]
    if node.op_type == "Mul":
        return partner in needs
    if node.op_type == "Div" and i == 0:
        return partner in needs
    return True


def attention_cores(graph: Graph) -> dict[str, int]:
    """Node name -> attention core id: the nodes from an activation-by-activation matmul
    (QKᵀ) to the next one in the same block (softmax(·)V), scale, mask and softmax between."""
    core: dict[str, int] = {}
    start: int | None = None
    layer = None
    for i, node in enumerate(graph.nodes):
        if traits_of(node).backward is not Backward.CONTRACTION:
            continue
        operands = [n for n in node.inputs[:2] if n]
        act_by_act = len(operands) == 2 and all(_is_activation(graph, n) for n in operands)
        if act_by_act and start is not None and node.layer == layer:
            for n in graph.nodes[start : i + 1]:
                core[n.name] = start
            start = None
        elif act_by_act:
            start, layer = i, node.layer
    return core


_MASK_WALK = 64
"""Producers walked back from a core's mask to find what makes it (a mask shared by every layer: walked once)."""


def causal_shares(graph: Graph, cores: dict[str, int]) -> dict[int, float]:
    """Core id -> the share of its S x T scores a causal kernel computes, for each core whose mask is
    causal (`_causal_mask`): the S queries are the last S of the T keys, and query i sees the keys up
    to its own position, S·(T − S) + S·(S + 1)/2 pairs of S·T. A fused causal kernel skips the key
    blocks wholly above the diagonal (FlashAttention-2, Dao 2023, section 3.1.1: "we can skip the
    computation of blocks where all the column indices are more than the row indices"; its FLOP/s
    figures count a causal run's FLOPs as half). A decode step (S = 1) sees every key: share 1, left
    out, as is a core with no causal mask."""
    by_core: dict[int, list[Node]] = {}
    for name, cid in cores.items():
        by_core.setdefault(cid, []).append(graph.node(name))
    made: dict[str, bool] = {}
    shares: dict[int, float] = {}
    for cid, members in by_core.items():
        masks = [n for n in members if n.op_type in ("Add", "Where")]
        if not any(_causal_mask(graph, v, made) for n in masks for v in n.inputs if v):
            continue
        try:  # the scores' [.., S, T], the run's dims bound
            shape = graph.type_of(members[0].outputs[0]).shape
        except (UnboundSymbolError, KeyError, IndexError):
            continue
        if not shape or len(shape) < 2 or not all(isinstance(d, int) for d in shape[-2:]):
            continue
        s, t = shape[-2:]
        if 1 < s <= t:
            shares[cid] = (s * (t - s) + s * (s + 1) / 2) / (s * t)
    return shares


def _causal_mask(graph: Graph, value: str, made: dict[str, bool]) -> bool:
    """Whether ``value`` is, or is made from, a causal mask: within `_MASK_WALK` producers, nearest
    first (not through a contraction, the scores' own path, nor into what a Shape reads) an op that
    makes a causal mask (`OpTraits.makes_causal_mask`), or a constant matrix of this tool's
    decoder export, whose one mask is the causal triangle (`models.gpt2.causal_mask`; the exporter
    folds its Trilu into a constant). ``made``: the answers so far, by value."""
    if value in made:
        return made[value]
    exported = MODEL_FAMILY in graph.metadata
    queue, visited, found = deque([value]), set(), False
    while queue and len(visited) < _MASK_WALK and not found:  # nearest producers first
        name = queue.popleft()
        if name in visited or name not in graph.values:
            continue
        visited.add(name)
        v = graph.values[name]
        if v.producer is None:
            found = exported and v.kind is ValueKind.CONSTANT and len(v.type.shape or ()) >= 2
            continue
        node = graph.node(v.producer)
        traits = traits_of(node)
        found = traits.makes_causal_mask
        if node.op_type != "Shape" and traits.backward is not Backward.CONTRACTION:
            queue.extend(i for i in node.inputs if i)  # not a Shape's input: only its dims are read
    made[value] = found
    return found


def core_internal(graph: Graph, cores: dict[str, int]) -> set[str]:
    """Values a core produces and only the same core reads (scores, probabilities)."""
    internal = set()
    for name, cid in cores.items():
        for out in graph.node(name).outputs:
            readers = graph.consumers.get(out, []) if out else []
            if readers and all(cores.get(r.name) == cid for r in readers):
                internal.add(out)
    return internal


@dataclass(frozen=True)
class FusedAttentionPass(Pass):
    """Run each attention core as one fused kernel (FlashAttention; Dao et al., NeurIPS 2022):
    the S×S scores and probabilities stay on chip, so the core's nodes neither read nor write
    them from memory: a core node moves at most what crosses the core's boundary (on the linalg
    path a node also counts the intermediates of the ops it lowers to, which stay on chip too).
    FLOPs are unchanged; the training pass then saves Q, K, V, the output and the softmax's
    log-sum-exp rows, and the backward recomputes the scores."""

    name: str = "fused_attention"

    def call(self, graph: Graph) -> PassResult:
        cores = attention_cores(graph)
        if not cores:
            return PassResult(graph, False)
        internal = core_internal(graph, cores)
        causal = causal_shares(graph, cores)
        for name, cid in cores.items():
            node = graph.node(name)
            cost = meta.get_cost(node)
            node.meta[FUSED_ATTENTION] = cid
            if cid in causal:
                node.meta[meta.CAUSAL_SHARE] = causal[cid]
            if cost is None:
                continue
            drop_in = sum(value_bytes(graph, v) for v in node.inputs if v in internal)
            drop_out = sum(value_bytes(graph, v) for v in node.outputs if v in internal)
            # at most what crosses the core's boundary: the intermediates a linalg-level node counts
            # inside itself (QKᵀ's scaling, a softmax's max, exp, sum and divide) stay on chip too
            crossing_in = sum(
                value_bytes(graph, v) for v in node.inputs if _is_activation(graph, v) and v not in internal
            )
            crossing_out = sum(value_bytes(graph, v) for v in node.outputs if v and v not in internal)
            node.meta[meta.COST] = Cost(
                contraction_flops=cost.contraction_flops,
                vector_flops=cost.vector_flops,
                special_ops=cost.special_ops,
                weight_bytes=cost.weight_bytes,
                act_bytes_in=min(max(0, cost.act_bytes_in - drop_in), crossing_in),
                act_bytes_out=min(max(0, cost.act_bytes_out - drop_out), crossing_out),
            )
        return PassResult(graph, True)


def _weight_matmul(graph: Graph, node: Node, traits: OpTraits) -> bool:
    """A contraction with a stored operand (X·W): PyTorch's ``aten.mm`` of a linear layer, as
    opposed to the activation-by-activation matmuls of an attention core."""
    if traits.backward is not Backward.CONTRACTION:
        return False
    operands = [n for n in node.inputs[:2] if n]
    return len(operands) == 2 and not all(_is_activation(graph, n) for n in operands)


def op_checkpoint_keeps(graph: Graph, cores: Mapping[str, int]) -> tuple[dict[str, dict[str, int]], frozenset[str]]:
    """torchtitan's per-op selective activation checkpointing (``selective_ac_option = "op"``)
    on each decoder block: node name -> what it keeps (value -> bytes) for every node of a block,
    and the nodes whose forward the backward runs again (every node of a block but the
    save-listed ones, whose cached outputs the recomputation returns; an attention core's
    scores are recomputed by the core's own rule, as FlashAttention's backward does).

    The policy (pytorch/torchtitan, ``_apply_ac_to_transformer_block`` in
    torchtitan/models/llama3/parallelize_llama.py, December 2024; now
    torchtitan/distributed/activation_checkpoint.py): each block runs under
    ``create_selective_checkpoint_contexts`` with a fresh ``mm`` counter; an op's output is
    ``MUST_SAVE`` when the op is in ``_save_list`` (``aten.mm``, the SDPA flash/efficient/cudnn
    kernels, ``reduce_scatter_tensor``, ``aten.max``) "except every second mm" (the count is
    incremented before the test, so the 2nd, 4th, 6th... mm of a block are recomputed), and
    every other op is ``PREFER_RECOMPUTE``. The checkpoint wrapper keeps the block's input. Here:
    a block's weight matmuls counted in graph order (q, k, v, o, gate, up, down in a Llama block:
    q, v, gate and down saved), an attention core as the SDPA kernel (its output O and the
    softmax's log-sum-exp, one fp32 per score row), and the activations entering the block from
    outside it. Nodes outside the blocks (embedding, final norm, LM head) are not checkpointed
    and are absent from the result (they keep what autograd saves)."""
    producer_layer = {v: n.layer for n in graph.nodes for v in n.outputs if v}
    internal = core_internal(graph, dict(cores)) if cores else set()
    count: dict[int, int] = {}
    keeps: dict[str, dict[str, int]] = {}
    recomputed: set[str] = set()
    for node in graph.nodes:
        layer = node.layer
        if layer is None or is_optimizer_step(node) or is_loss(node):
            continue
        traits = traits_of(node)
        keep: dict[str, int] = {}
        for name in node.inputs:  # the block's input, kept by the checkpoint wrapper
            if name and _is_activation(graph, name) and producer_layer.get(name) != layer:
                keep[name] = value_bytes(graph, name)
        out = node.outputs[0] if node.outputs else ""
        if node.name in cores and out:
            if not any(o in internal for o in node.outputs):  # the kernel's output O
                keep[out] = value_bytes(graph, out)
            elif traits.saves is Saves.OUTPUT:  # the softmax's log-sum-exp, one fp32 per score row
                itemsize = graph.values[out].type.dtype.itemsize if out in graph.values else 4
                keep[f"{out}#lse"] = 4 * (value_bytes(graph, out) // max(itemsize, 1) // _last_dim(graph, out))
        elif _weight_matmul(graph, node, traits) and out:
            count[layer] = count.get(layer, 0) + 1
            if count[layer] % 2 == 1:  # "except every second mm"
                keep[out] = value_bytes(graph, out)
            else:
                recomputed.add(node.name)
        else:
            recomputed.add(node.name)
        keeps[node.name] = keep
    return keeps, frozenset(recomputed)


OPTIMIZERS = ("adam",)
"""The optimizers a training step models (`_optimizer_node`: Adam's FLOPs, bytes and state)."""


def _recompute_mode(value: object) -> str:
    """A `RECOMPUTE` choice (``True``/``False`` from older specs: full/none); anything else is refused
    (``selectiv`` had been recorded as given and run as none)."""
    if value is True:
        return "full"
    if value in (False, None):
        return "none"
    if value not in RECOMPUTE:
        raise ValueError(f"TrainingPass(recompute={value!r}): expected one of {', '.join(RECOMPUTE)}")
    return str(value)


def _training_traits(node: Node, forward: Cost) -> OpTraits:
    """The traits the backward rules read: the op's own, or, for an op no registration names that
    contracts (a `.mlir` file's linalg op: `linalg.matmul`, a generalised `linalg.generic`), a
    MatMul's: its backward is two contractions, one per operand (it took the vector rule, and a
    linalg module's training step counted its forward contractions alone)."""
    traits = traits_of(node)
    if traits is UNKNOWN_OP and forward.contraction_flops:
        return op_traits("MatMul")
    return traits


@dataclass(frozen=True)
class TrainingPass(Pass):
    """Turn a costed forward graph into one training step (forward, backward, optimizer).

    ``recompute``: ``none`` keeps what autograd saves; ``selective`` recomputes each
    attention core in backward and keeps only its inputs (Korthikanti et al., MLSys 2023);
    ``op`` is torchtitan's per-op selective checkpointing (`op_checkpoint_keeps`: each block
    keeps its input, every other weight matmul's output and the attention kernel's output and
    log-sum-exp, and recomputes the rest); ``full`` keeps each block's input and recomputes the block (``True``/``False`` from
    older specs mean full/none).
    """

    recompute: str | bool = "none"
    optimizer: str = "adam"
    name: str = "training"

    def __post_init__(self) -> None:
        _recompute_mode(self.recompute)
        if self.optimizer not in OPTIMIZERS:  # the step's cost and state are Adam's: no other is modelled
            raise ValueError(
                f"TrainingPass(optimizer={self.optimizer!r}): the modelled optimizers are {', '.join(OPTIMIZERS)}"
            )

    def requires(self, graph: Graph) -> None:
        quantised = next((n for n in graph.nodes if traits_of(n).reads_quantised_weights), None)
        if quantised is not None:  # its integer weights have no gradient rule (it trained 4,096 scales with Adam)
            raise UserError(
                f"{graph.name}: {quantised.op_type} ({quantised.name}) reads quantised weights; a quantised model "
                "is for inference: train the float model (--mode train), and quantise it with --precision"
            )
        for node in graph.nodes:
            if meta.COST in node.meta or meta.UNATTRIBUTED in node.meta:
                return
            meta.get(node, meta.COST)  # raises: run 'cost' first

    def call(self, graph: Graph) -> PassResult:
        if meta.graph_mode(graph) == "train":
            return PassResult(graph, False)
        mode = _recompute_mode(self.recompute)
        needs = _needs_grad(graph)
        fused = {n.name: n.meta[FUSED_ATTENTION] for n in graph.nodes if FUSED_ATTENTION in n.meta}
        cores = fused or (attention_cores(graph) if mode in ("selective", "op") else {})
        internal = core_internal(graph, cores) if cores else set()
        op_keeps, op_recomputed = op_checkpoint_keeps(graph, cores) if mode == "op" else ({}, frozenset())
        saved: dict[str, int] = {}
        per_layer: dict[int | None, dict[str, int]] = {}
        boundary = 0
        crossing: set[str] = set()  # the values the boundary counts
        blocked = bool(graph.layers)  # without blocks (no scopes) the whole graph is the one checkpoint
        values, consumers = graph.values, graph.consumers
        for node in graph.nodes:
            forward = meta.get_cost(node)
            if forward is None:
                continue
            traits = _training_traits(node, forward)  # read once for the three rules below
            data = [n for n in node.inputs if n and values[n].kind is not ValueKind.CONSTANT]
            if traits.backward is Backward.CONTRACTION:
                data = [n for n in node.inputs[:2] if n]  # the two operands; a bias grad is a reduction
            grads = sum(1 for n in data if n in needs)
            bwd = backward_cost(node, forward, grads, len(data), traits)
            keep = saved_for_backward(graph, node, needs, traits)
            if node.name in cores:
                # a fused or recomputed core keeps only what enters it from outside (Q, K, V);
                # its backward runs the scores' forward again (the last matmul's output is kept)
                keep = {v: b for v, b in keep.items() if v.split("#")[0] not in internal}
                last = not any(out in internal for out in node.outputs)
                if not last and grads:
                    # a fused kernel recomputes the scores on chip: their FLOPs again, no traffic; the
                    # unfused core's ops run again as they ran, reading and writing their S x S tensors
                    # (selective recompute without fused attention had cost FLOPs alone: GPT-2 medium at
                    # seq 1024 trained 0.1 ms slower for 77 GB of recomputed traffic)
                    on_chip = replace(forward, weight_bytes=0, act_bytes_in=0, act_bytes_out=0)
                    bwd = bwd + (on_chip if node.name in fused else forward)
                    node.meta[meta.RECOMPUTED] = True
                if node.name in fused and node.outputs and (last or traits.saves is Saves.OUTPUT):
                    out = node.outputs[0]
                    if last:  # the kernel's output O
                        keep[out] = value_bytes(graph, out)
                    else:  # the softmax's log-sum-exp, one fp32 per score row
                        itemsize = graph.values[out].type.dtype.itemsize if out in graph.values else 4
                        keep[f"{out}#lse"] = 4 * (value_bytes(graph, out) // max(itemsize, 1) // _last_dim(graph, out))
            if node.name in op_keeps:  # a checkpointed block under the per-op policy
                keep = dict(op_keeps[node.name])
            # its forward runs again in backward (under op also a block's ops no gradient flows
            # through, such as the first block's norm: their outputs feed the saved ops' inputs)
            if (mode == "full" and grads and (node.layer is not None or not blocked)) or node.name in op_recomputed:
                bwd = bwd + forward
                node.meta[meta.RECOMPUTED] = True
            node.meta[FORWARD_COST] = forward
            node.meta[BACKWARD_COST] = bwd
            node.meta[meta.COST] = forward + bwd
            if keep:
                node.meta[SAVED] = keep
                saved.update(keep)
                per_layer.setdefault(node.layer, {}).update(keep)  # (a layer that keeps nothing adds 0)
            if _crosses_layer(node, consumers):
                boundary += forward.act_bytes_out
                crossing.update(node.outputs)
        params = graph.num_params or 0  # None: a symbolic weight shape
        itemsize = _weight_itemsize(graph)
        logits = lm_logits(graph)
        loss = next((n for n in graph.nodes if is_loss(n)), None)
        if logits is not None and loss is None:
            loss = _loss_node(graph, logits)
            graph.nodes.append(loss)
        step = _optimizer_node(graph, params, itemsize)
        graph.nodes.append(step)
        graph.invalidate()
        layer_peak = max((sum(k.values()) for layer, k in per_layer.items() if layer is not None), default=0)
        # full: the blocks' boundaries and one block's set, beside what the nodes outside the blocks
        # (embedding, final norm, head), which are not recomputed, keep as they would
        outside = sum(b for name, b in per_layer.get(None, {}).items() if name not in crossing)
        kept = boundary + layer_peak + outside if mode == "full" and blocked else sum(saved.values())
        meta.graph_set(
            graph,
            meta.TRAINING,
            TrainingRecord(
                optimizer=self.optimizer,
                loss=loss.name if loss is not None else None,  # None: no language-model logits to score
                recompute=mode == "full",  # the IPU lowering's stash model: whole blocks recomputed
                recompute_mode=mode,
                fused_attention=bool(fused),
                params=params,
                gradient_bytes=itemsize * params,
                master_weight_bytes=MASTER_BYTES_PER_PARAM * params if itemsize < 4 else 0,
                optimizer_state_bytes=ADAM_MOMENT_BYTES_PER_PARAM * params,
                # activations kept for backward over the whole bound batch: what autograd saves per
                # op, or with full recompute the tensors crossing block boundaries plus one block's set
                saved_activation_bytes=kept,
            ),
        )
        meta.graph_set(graph, meta.GRAPH_MODE, "train")
        return PassResult(graph, True)


def _crosses_layer(node: Node, consumers: Mapping[str, list[Node]]) -> bool:
    """Whether a node of another layer reads one of ``node``'s outputs (a block boundary)."""
    layer = node.layer
    for out in node.outputs:
        for c in consumers.get(out, ()):
            if c.layer != layer:
                return True
    return False


def _last_dim(graph: Graph, name: str) -> int:
    try:
        dim = graph.type_of(name).shape[-1]
    except (KeyError, IndexError, UnboundSymbolError):
        return 1
    if isinstance(dim, int):
        return max(dim, 1)
    return max(int(graph.bindings.get(dim, 1)), 1)


def _weight_itemsize(graph: Graph) -> int:
    """Bytes per parameter of the working weights (2 after a 16-bit precision rewrite)."""
    sizes = [v.type.dtype.itemsize for v in graph.weights() if v.type.dtype.is_float]
    return max(set(sizes), key=sizes.count) if sizes else 4


def _loss_node(graph: Graph, logits: str) -> Node:
    domain, op_type = LOSS_OP
    node = Node(name="loss.cross_entropy", op_type=op_type, domain=domain, inputs=[logits], outputs=[], scope="loss")
    logits_type = graph.values[logits].type
    try:
        n = logits_type.numel(graph.bindings)
    except UnboundSymbolError:
        n = 0
    rows = n // _last_dim(graph, logits)
    size = logits_type.dtype.itemsize
    f = LOSS_FLOPS_PER_LOGIT
    forward = Cost(
        vector_flops=f["forward_vector"] * n,
        special_ops=f["forward_exp"] * n + rows,
        act_bytes_in=size * n + 8 * rows,
        act_bytes_out=4,  # logits and int64 labels in, the loss out
    )
    gradient = Cost(vector_flops=f["backward_vector"] * n + rows, act_bytes_out=size * n)  # d logits
    # the gradient is written in the same pass as the loss: the whole cost is forward, the
    # backward of the logits' producer starts from it
    node.meta[FORWARD_COST] = forward + gradient
    node.meta[BACKWARD_COST] = Cost()
    node.meta[meta.COST] = forward + gradient
    node.meta[meta.OP_CLASS] = OpClass.VECTOR
    node.meta[meta.PRECISION] = DType.FLOAT32
    return node


def _optimizer_node(graph: Graph, params: int, itemsize: int) -> Node:
    vector, special = ADAM_FLOPS_PER_PARAM
    domain, op_type = OPTIMIZER_OP
    node = Node(
        name="optimizer.adam_step",
        op_type=op_type,
        domain=domain,
        inputs=[v.name for v in graph.weights()],
        outputs=[],
        scope="optimizer",
    )
    # reads the fp32 parameter (the master copy when the weights are 16-bit), the gradient
    # and both moments; writes the parameter, both moments and, when 16-bit, the working copy
    half = itemsize < 4
    node.meta[meta.COST] = Cost(
        vector_flops=vector * params,
        special_ops=special * params,
        weight_bytes=(4 + itemsize + ADAM_MOMENT_BYTES_PER_PARAM) * params,
        act_bytes_out=(4 + ADAM_MOMENT_BYTES_PER_PARAM + (itemsize if half else 0)) * params,
    )
    node.meta[meta.OP_CLASS] = OpClass.VECTOR
    node.meta[meta.PRECISION] = DType.FLOAT32
    return node
