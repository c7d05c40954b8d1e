"""Energy per node, and fair comparison across process nodes.

Energy model (docs/energy.md): a node's energy is its dynamic energy — FLOPs × energy per
FLOP at its precision, plus bytes × energy per byte at the memory level that feeds it —
plus the static power of the units it holds while it runs (static watts × its share of the
chips × its busy time). The rest of the step's static energy belongs to no node and has
rows of its own: one per timeline overhead (host time, reconfiguration, stalls, fill/drain,
collectives: the whole chip idles meanwhile) and ``idle`` (units idle while others run).
Energy figures come from a target's ``[energy]`` table when it has one; otherwise they are
derived from Horowitz's 45 nm figures (ISSCC 2014) scaled to the target's node with the
rule below, and marked as estimates.

Node normalisation (the survey's "bring every design to one node"): post-Dennard scaling
by default (Esmaeilzadeh et al., ISCA 2011: voltage no longer scales, so energy per op
scales with capacitance, ∝ feature size), classical Dennard scaling on request (Dennard et
al., JSSC 1974: energy per op ∝ size³). With λ = node / target node: throughput × λ
(delay ∝ size), area ÷ λ², energy per op ÷ λ (post-Dennard) or ÷ λ³ (Dennard).
"""

from __future__ import annotations

import logging
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from dabench_ir.errors import UserError
from dabench_ir.plan import Schedule

if TYPE_CHECKING:
    from dabench_ir.targets import Target

__all__ = [
    "HOROWITZ_45NM",
    "SCALING_RULES",
    "EnergyModel",
    "MultiChipEnergy",
    "StepEnergy",
    "check_process_node",
    "energy_model",
    "held_shares",
    "load_catalog",
    "multi_chip_energy",
    "node_energies",
    "normalize",
    "scale_factors",
    "step_energy",
    "target_area_mm2",
]

logger = logging.getLogger(__name__)

# Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, 45 nm:
# fp16 add 0.4 pJ + mul 1.1 pJ -> 1.5 pJ per FMA (2 FLOPs); fp32 add 0.9 + mul 3.7 -> 4.6 pJ;
# 8 KB SRAM read of 64 bits 10 pJ (1.25 pJ/B); DRAM 1.3–2.6 nJ per 64 bits (mid: 240 pJ/B).
HOROWITZ_45NM = {
    "pj_per_flop": {"fp32": 4.6 / 2, "fp16": 1.5 / 2, "bf16": 1.5 / 2, "fp8e4m3": 0.75 / 2, "int8": 0.23 / 2},
    "pj_per_byte": {"on-chip": 10.0 / 8, "off-chip": 1950.0 / 8},
    "node_nm": 45.0,
}
# Off-chip DRAM energy does not follow logic scaling; modern stacked DRAM is ~3.9 pJ/bit
# (HBM2, O'Connor et al., MICRO 2017) and DDR4 ~15 pJ/bit: used as given, not scaled.
DRAM_PJ_PER_BYTE = {"hbm": 3.9 * 8, "ddr": 15.0 * 8}
LINK_PJ_PER_BYTE = 10.0 * 8  # chip-to-chip SerDes, ~10 pJ/bit (estimate; order of magnitude)
STATIC_FRACTION = 0.3  # share of rated power drawn regardless of work (estimate)

SCALING_RULES = {"post-dennard": 1, "dennard": 3}


PROCESS_NODE_RANGE_NM = (0.1, 1000.0)
"""Process nodes `--normalize-to` accepts: from beyond any roadmap to the oldest planar CMOS."""


def check_process_node(nm: float, flag: str = "--normalize-to") -> float:
    """``nm`` as a process node to normalise to, or a UserError (nan, infinity, out of range)."""
    low, high = PROCESS_NODE_RANGE_NM
    if not math.isfinite(nm) or not low <= nm <= high:
        raise UserError(f"{flag} {nm:g}: a process node in nm between {low:g} and {high:g}, e.g. {flag} 7")
    return nm


def scale_factors(node_nm: float, to_nm: float, rule: str = "post-dennard") -> dict[str, float]:
    """Multipliers taking a design at ``node_nm`` to ``to_nm`` (identity when equal)."""
    if rule not in SCALING_RULES:
        raise UserError(f"unknown scaling rule {rule!r}; use {' or '.join(SCALING_RULES)}")
    if node_nm <= 0 or to_nm <= 0:
        raise UserError("process nodes must be positive (nm)")
    lam = node_nm / to_nm
    energy = lam ** SCALING_RULES[rule]
    return {
        "throughput": lam,  # faster gates
        "energy_per_op": 1 / energy,
        "power": lam / energy,  # throughput × energy per op
        "area": 1 / lam**2,
        "gops_per_w": energy,
        "gops_per_mm2": lam**3,
    }


def normalize(
    gops: float | None,
    gops_per_w: float | None,
    node_nm: float,
    to_nm: float,
    *,
    gops_per_mm2: float | None = None,
    rule: str = "post-dennard",
) -> dict[str, float | None]:
    """GOP/s, GOP/s/W and GOP/s/mm² of a design as if built at ``to_nm``."""
    f = scale_factors(node_nm, to_nm, rule)
    mul = lambda x, k: None if x is None else x * f[k]  # noqa: E731
    return {
        "gops": mul(gops, "throughput"),
        "gops_per_w": mul(gops_per_w, "gops_per_w"),
        "gops_per_mm2": mul(gops_per_mm2, "gops_per_mm2"),
    }


@dataclass(frozen=True)
class EnergyModel:
    """Energy figures of one target; ``estimate`` lists the ones that are derived, not sourced."""

    pj_per_flop: Mapping[str, float]
    pj_per_byte: Mapping[str, float]  # by memory level name or level ("on-chip", "off-chip", "link")
    static_watts: float
    sources: Mapping[str, str]

    def flop_energy_j(self, flops: float, dtype: str) -> float:
        table = self.pj_per_flop  # the fp32 fallback looked up only when needed (once a node in a report)
        pj = table[dtype] if dtype in table else table.get("fp32", 0.0)
        return flops * pj * 1e-12

    def byte_energy_j(self, nbytes: float, level: str) -> float:
        return nbytes * self.pj_per_byte.get(level, 0.0) * 1e-12


def energy_model(target: Target) -> EnergyModel:
    """The target's ``[energy]`` table, or figures derived from its node (marked estimates)."""
    raw = dict(getattr(target, "raw", {}) or {}).get("energy", {})
    node = float(target.node_nm)
    f = scale_factors(HOROWITZ_45NM["node_nm"], node)["energy_per_op"]
    sources: dict[str, str] = {}
    pj_flop = {k: v * f for k, v in HOROWITZ_45NM["pj_per_flop"].items()}
    sources["pj_per_flop"] = f"estimate: Horowitz ISSCC 2014 45 nm figures scaled to {node:g} nm (post-Dennard)"
    pj_byte: dict[str, float] = {"on-chip": HOROWITZ_45NM["pj_per_byte"]["on-chip"] * f, "link": LINK_PJ_PER_BYTE}
    for mem in target.memories:
        if mem.level == "on-chip":
            pj_byte[mem.name] = pj_byte["on-chip"]
        else:
            kind = "hbm" if "hbm" in mem.name.lower() else "ddr"
            pj_byte[mem.name] = DRAM_PJ_PER_BYTE[kind]
            pj_byte.setdefault("off-chip", DRAM_PJ_PER_BYTE[kind])
    pj_byte.setdefault("off-chip", DRAM_PJ_PER_BYTE["ddr"])
    sources["pj_per_byte"] = "estimate: SRAM from Horowitz scaled; DRAM from O'Connor et al. MICRO 2017 (HBM2) / DDR4"
    static = STATIC_FRACTION * float(target.watts)
    sources["static_watts"] = f"estimate: {STATIC_FRACTION:.0%} of rated power"
    for key, table in (("pj_per_flop", pj_flop), ("pj_per_byte", pj_byte)):
        for name, entry in dict(raw.get(key, {})).items():
            table[name] = float(entry["value"] if isinstance(entry, Mapping) else entry)
            if isinstance(entry, Mapping) and entry.get("source"):
                sources[f"{key}.{name}"] = str(entry["source"])
    if "static_fraction" in raw:
        entry = raw["static_fraction"]
        frac = float(entry["value"] if isinstance(entry, Mapping) else entry)
        static = frac * float(target.watts)
        sources["static_watts"] = str(entry.get("source", "")) if isinstance(entry, Mapping) else ""
    return EnergyModel(pj_per_flop=pj_flop, pj_per_byte=pj_byte, static_watts=static, sources=sources)


def load_catalog() -> list[dict[str, Any]]:
    """Published accelerator designs (dabench_ir/data/accelerators.toml)."""
    text = resources.files("dabench_ir").joinpath("data/accelerators.toml").read_text()
    rows = tomllib.loads(text)["design"]
    for row in rows:
        if row.get("gops") and row.get("watts") and not row.get("gops_per_w"):
            row["gops_per_w"] = row["gops"] / row["watts"]
        if row.get("gops") and row.get("area_mm2") and not row.get("gops_per_mm2"):
            row["gops_per_mm2"] = row["gops"] / row["area_mm2"]
    return rows


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass(frozen=True)
class StepEnergy:
    """One step's energy, attributed by what each node does (docs/energy.md).

    ``dynamic`` and ``static`` are per node (joules): its FLOPs and bytes, and the static
    power of the share of the chips it holds for its busy time. ``overheads`` is the energy of
    each timeline overhead row: its static power (the whole plan idles meanwhile), and for the
    ``memory_stall`` row also the bytes a streaming unit moves while its nodes wait, ``stall_j``
    of it, which is dynamic energy. ``idle_j`` is the static energy of units idle while others
    run. ``static_power_w`` is the static power of every chip the plan uses; ``step_time_s``
    the step these joules are of. ``link_j``: the bytes the plan's own chip-to-chip links carry
    (``plan.stats.link_bytes``: an IPU pipeline's stage boundaries, its replicas' gradient ring),
    dynamic energy of no node's.
    """

    dynamic: Mapping[str, float]
    static: Mapping[str, float]
    overheads: Mapping[str, float]
    idle_j: float
    static_power_w: float
    step_time_s: float
    stall_j: float = 0.0
    link_j: float = 0.0

    @property
    def nodes(self) -> dict[str, float]:
        """Joules per node: its dynamic energy plus the static energy of what it holds while it runs."""
        return {name: e + self.static.get(name, 0.0) for name, e in self.dynamic.items()}

    @property
    def node_j(self) -> float:
        """The nodes' joules together."""
        return sum(self.dynamic.values()) + sum(self.static.values())

    @property
    def dynamic_j(self) -> float:
        """The step's dynamic joules: the nodes' FLOPs and bytes, the bytes streamed in a stall, and
        those the plan's links carry."""
        return sum(self.dynamic.values()) + self.stall_j + self.link_j

    @property
    def static_j(self) -> float:
        """Static power over the whole step: the nodes' share, the overhead rows' and the idle row."""
        return sum(self.static.values()) + sum(self.overheads.values()) - self.stall_j + self.idle_j

    @property
    def total_j(self) -> float:
        """The step's joules: the nodes plus the rows no node owns, and the plan's links."""
        return self.node_j + sum(self.overheads.values()) + self.idle_j + self.link_j


def link_energy_j(model: EnergyModel, nbytes: float, link: str | None) -> float:
    """Joules of ``nbytes`` over the link named ``link`` (its ``[energy.pj_per_byte]`` entry, else the
    chip-to-chip estimate)."""
    return nbytes * model.pj_per_byte.get(link or "", model.pj_per_byte["link"]) * 1e-12


def step_energy(
    graph: Any,
    plan: Any,
    timeline: Any,
    target: Target,
    feed_bytes: Mapping[str, float] | None = None,
    busy: Mapping[str, float] | None = None,
) -> StepEnergy:
    """One step's energy: per node (dynamic plus held static), per overhead row, and idle.

    Dynamic: FLOPs at the node's precision, and the bytes it moves at the memory level that
    feeds it on this target, once for each data-parallel copy the plan runs (``plan.replicas``:
    the WSE's copies on the wafer, the IPU's replicas; a node row is one copy's node). Static:
    the target's static power times the chips the plan spans (``P_s``). A node gets
    ``P_s × share × busy``, ``share`` being the part of the plan's hardware it holds while it runs
    (`held_shares`), ``busy`` the time it really ran; a node that takes no time on the timeline
    gets no static energy. Each overhead row of the timeline gets ``P_s × its seconds``: nothing runs meanwhile. What is left of
    ``P_s × step time`` is the idle row: units idle while others run (the SMs a kernel does
    not use, WSE regions waiting on the bottleneck, the routing and I/O PEs, pipeline fill).
    A node's bytes are those its roofline point counts (`metrics.node_feed_intensity`: in a
    unit whose traffic streams over its span, the share in the node's time); what such a unit
    streams while its nodes wait (its stall) is dynamic energy of the ``memory_stall`` row.
    ``feed_bytes``: those bytes when the caller has them (`Metrics.node_feed_bytes` of this plan and timeline);
    ``busy``: the timeline's `Timeline.busy_times` when the caller has them.
    """
    from dabench_ir.metrics import node_feed_intensity
    from dabench_ir.passes import meta

    model = energy_model(target)
    default_dtype = str(getattr(plan, "precision", "") or "fp32")
    chips = max(1, int(getattr(plan, "chips", 1) or 1))
    copies = max(1, int(getattr(plan, "replicas", 1) or 1))  # each data-parallel copy does every node's work
    static_w = model.static_watts * chips
    dynamic: dict[str, float] = {}
    static: dict[str, float] = {}
    shares = held_shares(plan)
    if feed_bytes is None:
        _, _, feed_bytes = node_feed_intensity(plan, timeline)
    streamed = sum(u.stats.feed_bytes or 0.0 for u in plan.units)
    in_streams = {n for u in plan.units if u.stats.feed_bytes is not None for n in u.nodes}  # nodes of a streaming unit
    streamed_in_nodes = 0.0
    level_key: dict[str, str] = {}  # feed level -> the key of its bytes' energy (the memory's name, else the level)
    node_plans = plan.node_plans
    busy_times = timeline.busy_times() if busy is None else busy
    for node in graph.nodes:
        cost = meta.attributed_cost(node)
        node_plan = node_plans.get(node.name)
        if cost is None or node_plan is None:
            continue
        level = node_plan.feed_level
        if level not in level_key:
            level_name = _feed_memory_name(target, level)
            level_key[level] = level_name if level_name in model.pj_per_byte else level
        moved = feed_bytes.get(node.name, float(node_plan.feed_bytes))
        if node.name in in_streams:
            streamed_in_nodes += moved
        dtype = str(node.meta.get(meta.PRECISION) or default_dtype)
        dynamic[node.name] = copies * (
            model.flop_energy_j(cost.flops, dtype) + model.byte_energy_j(moved, level_key[level])
        )
        busy_s = busy_times.get(node.name) or 0.0
        static[node.name] = static_w * shares[node.name] * busy_s if busy_s > 0 else 0.0
    step = float(timeline.step_time_s)
    overheads = {name: static_w * float(s) for name, s in (timeline.overheads_s or {}).items()}
    idle = static_w * step - sum(static.values()) - sum(overheads.values())
    if idle < -1e-9 * static_w * max(step, 1e-30):
        logger.warning(
            "energy: nodes and overhead rows hold %.3g J of static energy, more than the step's %.3g J; "
            "idle row set to 0",
            sum(static.values()) + sum(overheads.values()),
            static_w * step,
        )
    stall_j = 0.0
    if streamed > streamed_in_nodes * (1 + 1e-9):  # streamed while the nodes waited on it
        level = next(
            plan.node_plans[n].feed_level
            for u in plan.units
            if u.stats.feed_bytes is not None
            for n in u.nodes
            if n in plan.node_plans
        )
        name = _feed_memory_name(target, level)
        stall_j = copies * model.byte_energy_j(
            streamed - streamed_in_nodes, name if name in model.pj_per_byte else level
        )
        overheads["memory_stall"] = overheads.get("memory_stall", 0.0) + stall_j
    link = target.link()
    carried = float(getattr(getattr(plan, "stats", None), "link_bytes", 0.0) or 0.0)
    link_j = link_energy_j(model, carried, None if link is None else link.name) if carried else 0.0
    return StepEnergy(
        dynamic=dynamic,
        static=static,
        overheads=overheads,
        idle_j=max(0.0, idle),
        static_power_w=static_w,
        step_time_s=step,
        stall_j=stall_j,
        link_j=link_j,
    )


@dataclass(frozen=True, slots=True)
class MultiChipEnergy:
    """One step of a run over several devices (docs/energy.md, "Several chips"): every chip's
    work, the static power of every device over the whole step (its collectives, bubbles and
    waits included: a device draws it whether it computes or not) and the bytes the
    chip-to-chip links carry. Global figures: all devices together."""

    dynamic_j: float  # every chip's FLOPs and memory traffic
    static_j: float  # static power x devices x step time
    link_j: float  # chip-to-chip bytes x the link's pJ/B
    link_bytes: float  # bytes all links carry in one step
    devices: int  # devices drawing power: chips, or IPUs of a pipeline, or the wafer its replicas share
    rated_w: float  # rated power of those devices together
    chip: StepEnergy | None = field(default=None, compare=False)  # the one chip's step it was made from

    @property
    def total_j(self) -> float:
        return self.dynamic_j + self.static_j + self.link_j

    def to_dict(self) -> dict[str, float | int]:
        """The report's totals: its ``dynamic_energy_j`` holds the links' energy too, as a one-chip
        report's does (`StepEnergy.dynamic_j`), so a report's energy is its dynamic and static parts."""
        return {
            "energy_j": self.total_j,
            "dynamic_energy_j": self.dynamic_j + self.link_j,
            "static_energy_j": self.static_j,
            "link_energy_j": self.link_j,
            "link_bytes": self.link_bytes,
            "devices": self.devices,
            "target_power_w": self.rated_w,
        }


def multi_chip_energy(
    chip: StepEnergy,
    target: Target,
    *,
    copies: int,
    devices: int,
    step_s: float,
    link_bytes: float,
    link: str | None,
) -> MultiChipEnergy:
    """The energy of a multi-chip step from one chip's (``chip``: its placement's `step_energy`).

    ``copies``: how many chips do that placement's work each step (n for data and tensor
    parallelism, whose chips each run a replica or a share; 1 when the placement is already
    the whole step's work: a pipeline's stages are its layers, a plan that spans its own
    devices); ``devices``: the devices drawing static power for ``step_s``; ``link_bytes``
    over ``link`` (its ``[energy.pj_per_byte]`` entry, else the chip-to-chip estimate).
    The chip's dynamic energy counts its memory stalls' bytes (`StepEnergy.stall_j`); their
    seconds' static power is in the devices' static energy over ``step_s``."""
    model = energy_model(target)
    return MultiChipEnergy(
        dynamic_j=copies * (chip.dynamic_j - chip.link_j),  # ``link_bytes`` hold the placement's own links
        static_j=model.static_watts * devices * step_s,
        link_j=link_energy_j(model, link_bytes, link),
        link_bytes=link_bytes,
        devices=devices,
        rated_w=float(target.watts) * devices,
        chip=chip,
    )


def held_shares(plan: Any) -> dict[str, float]:
    """Part of the plan's hardware (all its chips) each planned node holds while it runs, in [0, 1].

    On a sequential schedule (RDU sections, streamed WSE layers) a unit is configured for
    its nodes and holds its allocation while any of them runs: a node holds the allocation
    of the unit it runs in (a node in several units, e.g. an RDU forward and backward
    section, the time-weighted mean over them). On a concurrent schedule (a GPU stream, IPU
    compute sets, WSE regions) a node holds its own allocation: the SMs its kernel uses,
    the tiles of its compute set, its kernel's PEs.
    """
    node_plans = plan.node_plans
    held: dict[str, float] = {}  # a node's time in its units, and that time weighted by their allocation,
    weighted: dict[str, float] = {}  # each added up in plan order from 0 (one walk of the units, not one per node)
    if plan.schedule is Schedule.SEQUENTIAL:
        m = max(1, int(getattr(plan, "micro_batches", 1) or 1))
        for u in getattr(plan, "units", None) or []:
            node_s, allocation = u.node_s, u.allocation
            for name in u.nodes:
                np_ = node_plans.get(name)
                if np_ is not None:
                    t = node_s.get(name, np_.per_micro_batch_s) * m
                    held[name] = held.get(name, 0) + t
                    weighted[name] = weighted.get(name, 0) + allocation * t
    shares = {}
    for name, np_ in node_plans.items():
        t = held.get(name, 0)
        share = weighted[name] / t if t > 0 else float(np_.allocation)
        shares[name] = min(1.0, max(0.0, share))
    return shares


def node_energies(graph: Any, plan: Any, timeline: Any, target: Target) -> dict[str, float]:
    """Joules per node for one step: dynamic energy plus the static energy of what it holds
    while it runs (`step_energy`). They do not sum to the step's energy: the overhead and
    idle rows of `StepEnergy` hold the rest."""
    return step_energy(graph, plan, timeline, target).nodes


def _feed_memory_name(target: Target, level: str) -> str:
    """The name of the memory at ``level`` (``on-chip``/``off-chip``), or the level itself."""
    for mem in target.memories:
        if level in (mem.name, mem.level):
            return mem.name
    return level


def target_area_mm2(target: Target) -> float | None:
    """Die area from the target file's ``[process] area_mm2``, when it gives one."""
    entry = dict(getattr(target, "raw", {}) or {}).get("process", {}).get("area_mm2")
    if entry is None:
        return None
    return float(entry["value"] if isinstance(entry, Mapping) else entry)
