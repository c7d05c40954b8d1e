"""The sections SambaFlow compiles: each node's PMU/PCU demand, fusion groups, sections per opt level.

Forward, backward and optimizer never share a section. O0 compiles one operator a section, O1
one module, O3 fuses groups greedily while the section's demand fits the planning capacity
(the package docstring, `dabench_ir.lowering.rdu`, tells the whole rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, module_of
from dabench_ir.lowering.context import LoweringContext, module_key
from dabench_ir.passes import meta
from dabench_ir.passes.training import BACKWARD_COST, FORWARD_COST, is_optimizer_step

if TYPE_CHECKING:
    from dabench_ir.ir import Graph, Node
    from dabench_ir.lowering.rdu.chip import Chip

__all__ = [
    "MAX_PARTS",
    "PHASES",
    "Demand",
    "NodeDemand",
    "Section",
    "SectionLayout",
    "attention_cores",
    "body_and_optimizer",
    "form_sections",
    "forward_cores",
    "fusion_groups",
    "phase_cost",
    "pmu_demand",
]

PHASES = ("forward", "backward", "optimizer")
"""The phases of a step, in the order their sections run; no section holds two."""
MAX_PARTS = 1_000_000
"""Sections one node group may be cut into before the placement is refused as meaningless (issue 21)."""


@dataclass(slots=True)
class Section:
    """One compiled section: its nodes (program order of its phase) and what it needs."""

    phase: str
    nodes: list[Node] = field(default_factory=list)
    pcus: int = 0  # PCU demand of the nodes (paired with their PMUs), all parts together
    pmus: int = 0
    parts: int = 1  # sections the compiler cuts it into (a group above the capacity)
    oversized: bool = False  # one group above the planning capacity: tiled over every unit


def phase_cost(node: Node, phase: str, fallback: Cost) -> Cost:
    """``node``'s Cost in ``phase``: the training pass's forward or backward record, ``fallback``
    (the node's whole cost) for the optimizer or a forward without a record, nothing for a
    backward without one."""
    if phase == "optimizer":
        return fallback
    key = FORWARD_COST if phase == "forward" else BACKWARD_COST
    cost = node.meta.get(key)
    if cost is None:
        return fallback if phase == "forward" else Cost()
    return cost


class NodeDemand(NamedTuple):
    """The PMUs and PCUs one node needs in one phase."""

    pmus: int
    pcus: int


def pmu_demand(ctx: LoweringContext, chip: Chip, node: Node, cost: Cost) -> int:
    """PMUs ``node`` needs for ``cost``, its cost in the phase asked, per sample: its activations
    over ``chip.act_bytes_per_pmu`` (at least one) plus its weights over ``chip.weight_bytes_per_pmu``;
    none for a node that does no work."""
    if not ctx.is_work(node):
        return 0
    act = (cost.act_bytes_in + cost.act_bytes_out) / ctx.batch
    return max(1, math.ceil(act / chip.act_bytes_per_pmu)) + math.ceil(cost.weight_bytes / chip.weight_bytes_per_pmu)


class Demand:
    """PMU and PCU demand of one node in one phase, per sample (sections stream samples)."""

    def __init__(self, ctx: LoweringContext, chip: Chip) -> None:
        self.ctx = ctx
        self.chip = chip
        # NodeDemand per node, one map a phase: each asked several times a node and phase
        self._demand: dict[str, dict[str, NodeDemand]] = {phase: {} for phase in PHASES}

    def cost(self, node: Node, phase: str) -> Cost:
        """``node``'s Cost in ``phase`` (`phase_cost`)."""
        return phase_cost(node, phase, self.ctx.costs[node.name])

    def pmu(self, node: Node, phase: str) -> int:
        """PMUs of ``node`` in ``phase``."""
        return self.of(node, phase).pmus

    def pcu(self, node: Node, phase: str) -> int:
        """PCUs of ``node`` in ``phase``: its PMUs (PCU/PMU pairing), matmuls rounded up to the grain."""
        return self.of(node, phase).pcus

    def of(self, node: Node, phase: str) -> NodeDemand:
        """PMUs and PCUs of ``node`` in ``phase``."""
        memo = self._demand[phase]
        got = memo.get(node.name)
        if got is None:
            cost = self.cost(node, phase)  # read once for both
            pmu = pmu_demand(self.ctx, self.chip, node, cost)
            pcu = pmu
            if pmu and cost.contraction_flops > 0:
                g = self.chip.matmul_grain
                pcu = math.ceil(pmu / g) * g
            got = memo[node.name] = NodeDemand(pmu, pcu)
        return got


def attention_cores(ctx: LoweringContext, nodes: list[Node]) -> dict[str, int]:
    """Node -> its attention core id among ``nodes``: the training pass's cores (its one rule, from an
    activation-by-activation matmul, QKᵀ, to the next, AV; `passes.training.attention_cores`)."""
    from dabench_ir.passes.training import attention_cores as graph_cores

    names = {n.name for n in nodes}
    return {name: cid for name, cid in graph_cores(ctx.graph).items() if name in names}


def forward_cores(ctx: LoweringContext) -> dict[str, int]:
    """The attention cores of the graph's body (`attention_cores`: node -> core id), a fact of the
    context (`LoweringContext.fact`): the same for every plan that fuses them (O1 and O3)."""
    return attention_cores(ctx, body_and_optimizer(ctx.graph)[0])


def fusion_groups(
    ctx: LoweringContext, nodes: list[Node], opt_level: str, core: dict[str, int] | None = None
) -> list[list[Node]]:
    """Fusion groups in program order: O1 and O3 keep each attention core whole (its scores on chip,
    recomputed in backward); O0 one node each (``core``: `attention_cores` of ``nodes``, when the
    caller has it)."""
    if core is None:
        core = attention_cores(ctx, nodes) if opt_level != "O0" else {}
    groups: list[list[Node]] = []
    last_key = None
    for node in nodes:
        key = core.get(node.name)
        if groups and ((key is not None and key == last_key) or not ctx.is_work(node)):
            groups[-1].append(node)  # the core stays whole; bookkeeping rides along
        else:
            groups.append([node])
        last_key = key
    return groups


def body_and_optimizer(graph: Graph) -> tuple[list[Node], list[Node]]:
    """The graph's nodes but its optimizer steps, and its optimizer steps, each in program order."""
    body: list[Node] = []
    optimizer: list[Node] = []
    for n in graph.nodes:
        (optimizer if is_optimizer_step(n) else body).append(n)
    return body, optimizer


def form_sections(
    ctx: LoweringContext, chip: Chip, opt_level: str, demand: Demand | None = None, cores: dict[str, int] | None = None
) -> list[Section]:
    """The sections SambaFlow compiles at ``opt_level``: forward, then backward, then optimizer
    (``demand``: the nodes' `Demand` on ``chip``, ``cores``: the forward's `attention_cores`
    at that level, when the caller has them).

    At O1 a node the exporter left without a scope joins the module it is written in: a module is
    what the program ran inside one ``nn.Module``'s forward (SambaFlow's o1 fuses operators within
    the modules it traces, docs.sambanova.ai/developer/latest/compiler-o1.html), and a node without a
    recorded scope ran there too; its exporter only dropped the record. torch's dynamo exporter writes
    GPT-2's ``c_attn(x).split(...)`` (inside ``GPT2Attention.forward``) as one ``Split`` without a
    module stack, TorchScript keeps it: as a module of its own it cut the attention into three
    sections in one export of the model and not in the other (issue 45).

    A module is read below the model's root (`Graph.model_root`): a user's wrapper around the model (its
    ``self.model``) neither makes the whole model one module outside the decoder blocks (the final
    norm and the LM head in one section) nor its own nodes a module the unwrapped export does not have;
    the root is the exported nodes', not the training pass's loss and optimizer step's."""
    demand = demand or Demand(ctx, chip)
    train = meta.graph_mode(ctx.graph) == "train"
    body, optimizer = body_and_optimizer(ctx.graph)
    out: list[Section] = []
    modules = _Modules(ctx.graph.model_root) if opt_level == "O1" else None  # only O1 cuts at modules
    chains = [("forward", body)]
    if train:
        chains.append(("backward", [n for n in reversed(body) if demand.cost(n, "backward").flops > 0]))
    for phase, chain in chains:
        cur = Section(phase)
        key = None  # the module of the current section (O1)
        for group in fusion_groups(ctx, chain, opt_level, cores if phase == "forward" else None):
            pmu = pcu = 0
            for n in group:
                node_pmu, node_pcu = demand.of(n, phase)
                pmu += node_pmu
                pcu += node_pcu
            need = max(pcu, pmu)
            gkey = modules.of(group[0], key) if modules is not None else None
            if not pcu:  # no work: rides with the current section
                cur.nodes.extend(group)
                continue
            last = out[-1] if out and not (cur.pcus or cur.pmus) else None  # cur holds no demand yet
            if opt_level not in ("O0", "O1") and _fits_tiled_room(last, phase, need, chip):
                last.nodes.extend(cur.nodes + list(group))  # with the work-free nodes waiting in cur
                cur.nodes.clear()
                last.pcus += pcu
                last.pmus += pmu
                continue
            if opt_level != "O0" and need > chip.capacity:  # bigger than the chip: its own sections
                if cur.nodes:
                    out.append(cur)
                out.append(_tiled(phase, group, pcu, pmu, need, chip))
                cur, key = Section(phase), None
                continue
            if _splits(opt_level, cur, need, chip, new_module=gkey != key):
                out.append(cur)
                cur = Section(phase)
            cur.nodes.extend(group)
            cur.pcus += pcu
            cur.pmus += pmu
            key = gkey
        if cur.nodes:
            out.append(cur)
    if optimizer:
        tensors = len({v for n in optimizer for v in n.inputs if v}) if opt_level == "O0" else 1
        out.append(Section(phase="optimizer", nodes=optimizer, pcus=1, pmus=1, parts=max(1, tensors)))
    return out


class _Modules:
    """The module a group belongs to at O1: its first node's module below the model's ``root``
    (`module_of`), read once per scope (a scope holds ~3 nodes); a node without a recorded module
    (no scope, or the wrapper's own) stays in the current section's."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.by_scope: dict[str, str] = {}

    def of(self, first: Node, current: str | None) -> str:
        module = self.by_scope.get(first.scope)
        if module is None:
            module = self.by_scope[first.scope] = module_of(first.scope, self.root).module
        if not module:
            return current if current is not None else module_key(first, self.root)
        return module


def _splits(opt_level: str, cur: Section, need: int, chip: Chip, *, new_module: bool) -> bool:
    """Whether a group of ``need`` units starts a new section after ``cur`` (which holds work): at
    O0 always (one operator a section), at O1 at a new module or when the section would overflow the
    chip, at O3 when it would overflow."""
    if cur.pcus == 0:  # a node holds PCUs exactly when it works (`Demand`): nothing to split from
        return False
    if opt_level == "O0":
        return True
    overflows = max(cur.pcus, cur.pmus) + need > chip.capacity
    return (new_module or overflows) if opt_level == "O1" else overflows


def _fits_tiled_room(last: Section | None, phase: str, need: int, chip: Chip) -> bool:
    """Whether a group of ``need`` units fuses into the room the last part of a tiled group leaves
    (the loss after the LM head), ``last`` being the section before an empty current one."""
    return (
        last is not None
        and last.oversized
        and last.phase == phase
        and max(last.pcus, last.pmus) + need <= last.parts * chip.capacity
    )


def _tiled(phase: str, group: list[Node], pcu: int, pmu: int, need: int, chip: Chip) -> Section:
    """A group bigger than the chip: the sections the compiler cuts it into, tiled over every unit."""
    parts = math.ceil(need / chip.units)
    if parts > MAX_PARTS:  # a node millions of chips large: no placement means anything
        raise UserError(
            f"{group[0].name}: would be cut into {parts:,} sections (more than "
            f"{MAX_PARTS:,}); the model is far larger than the chip: use smaller dims"
        )
    return Section(phase=phase, nodes=list(group), pcus=pcu, pmus=pmu, parts=parts, oversized=True)


@dataclass(slots=True)
class SectionLayout:
    """The sections of one plan and what the later steps ask of them.

    ``demand``: every node's `Demand` on the chip; ``cores``: node -> its forward attention core
    (`attention_cores`; empty at O0); ``section_of``: phase -> node -> the index of its section.
    """

    sections: list[Section]
    demand: Demand
    cores: dict[str, int]
    section_of: dict[str, dict[str, int]]

    @classmethod
    def compile(cls, ctx: LoweringContext, chip: Chip, opt_level: str) -> SectionLayout:
        """Form the sections of ``ctx.graph`` on ``chip`` at ``opt_level`` and index them by node."""
        demand = Demand(ctx, chip)
        cores = ctx.fact(forward_cores) if opt_level != "O0" else {}
        sections = form_sections(ctx, chip, opt_level, demand, cores)  # the forward's cores found once for both
        section_of: dict[str, dict[str, int]] = {phase: {} for phase in PHASES}  # phase -> node -> its section
        for i, sec in enumerate(sections):
            in_phase = section_of[sec.phase]
            for n in sec.nodes:
                in_phase[n.name] = i
        return cls(sections, demand, cores, section_of)
