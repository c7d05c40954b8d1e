"""Targets: what an accelerator has, read from one TOML file per target.

Every number in a target file is an inline table ``{ value = ..., source = "...",
estimate = true|false }``; the lowering code reads these and hard-codes no hardware
figure. `load_target` takes a built-in name, an alias (``wse``, ``rdu``, ``ipu``), ``cpu``
(measured on this host) or a path to a user's TOML file.

The file's schema is `_Parser`, one validator for the whole format: every number finite and
in the range its field allows (`dabench_ir.schema`): non-negative by default, positive where a
zero is meaningless (peaks, capacities, bandwidths, power, area, energies), a fraction in (0, 1]
for a share of a whole (`SHARE_PATTERNS`: ``*efficiency*``, ``*fraction*``, ``*utilisation*``,
``*utilization*``), a positive integer for a count (``compute.units``,
``topology.devices_per_node``, the `ARCH_COUNTS`); every precision a known one; every
``[defaults]`` entry a valid value of its knob. A bad field is one TargetError line naming the
file, the field and the allowed range.
"""

from __future__ import annotations

from dabench_ir._layout import installed_as

installed_as(__name__, "targets")  # the folder is dabench_ir.targets; one file, one module

import fnmatch
import json
import logging
import math
import operator
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dabench_ir import schema
from dabench_ir.errors import TargetError, did_you_mean
from dabench_ir.ir import Cost, DType

__all__ = [
    "HOST",
    "KINDS",
    "OP_CLASSES",
    "SHARE_PATTERNS",
    "Link",
    "MemoryLevel",
    "Quantity",
    "Target",
    "Topology",
    "builtin_target_paths",
    "is_host",
    "is_target_path",
    "list_targets",
    "load_target",
    "ridge",
    "target_files",
]

logger = logging.getLogger(__name__)

HOST = "cpu"
"""The name of this machine's CPU as a target: built from the host's calibration on first use
(`dabench_ir.execute.calibrate`), not from a bundled file."""
KINDS = ("wse", "rdu", "ipu", "gpu", "cpu")
"""The target kinds a target file may declare: the one list (`dabench_ir.lowering.KINDS` maps each to its lowering)."""
LEVELS = ("on-chip", "off-chip", "host")
"""Memory levels: on the chip, beside it (HBM, DDR), and the host's memory it reaches over PCIe."""
SHARE_PATTERNS = ("*efficiency*", "*fraction*", "*utilisation*", "*utilization*")
"""Quantity names that are a share of a whole: their value must lie in (0, 1] (`_Parser.quantity`)."""
ARCH_COUNTS = frozenset(
    {
        "gemm_tile",
        "tiles_per_rdu",
        "pcus_per_tile",
        "pmus_per_tile",
        "matmul_pcu_grain",
        "row_chunk_elements",
        "broadcast_fanout",
        "io_region_pes",
    }
)
"""``[arch]`` figures that count things (tiles, units, elements, PEs): positive integers (`_Parser.quantity`)."""
ARCH_KEYS = frozenset(
    {
        *ARCH_COUNTS,
        # GPUs
        "decode_attention_load_bytes_per_s",
        "fused_attention_efficiency",
        "gemm_block_overhead_k",
        "kv_cache_pool_fraction",
        "matmul_efficiency",
        "memory_efficiency",
        "min_grain_flops",
        # RDU
        "act_bytes_per_pmu",
        "matmul_temp_per_operand_byte",
        "pcu_efficiency",
        "pcu_k_half",
        "weight_bytes_per_pmu",
        # IPU
        "amp_bytes_per_cycle",
        "amp_share_fp32_partials",
        "code_bytes_per_tile_op",
        "exchange_bytes_per_s",
        "fp16_optimizer_bytes_per_param",
        "matmul_efficiency_fp16",
        "matmul_efficiency_fp32",
        "program_bytes_per_tile",
        "special_ops_per_cycle_fp16",
        "special_ops_per_cycle_fp32",
        "vertex_overhead_cycles",
        "tile_sram_bytes",
        "vector_elems_per_cycle_fp16",
        "vector_elems_per_cycle_fp32",
        # WSE
        "drain_per_step",
        "fabric_link_bytes_per_cycle",
        "fifo_sram_fraction",
        "kernel_row_cycles_matmul",
        "kernel_row_cycles_reduction",
        "kernel_row_cycles_vector",
        "max_active_fraction",
        "min_utilisation",
        "pe_matmul_efficiency",
        "pe_sram_bytes",
        "pipelined_max_params",
        "route_pes_per_kernel_pe",
        "sram_usable_fraction",
        "ws_recompute",
    }
)
"""Every ``[arch]`` figure a lowering reads: a key outside it is refused when the file is read (a typo
would be a figure no lowering reads, its default taken unsaid), and a lowering that reads another is an
internal error (`Target.arch_value`)."""
OVERHEAD_KEYS = frozenset(
    {
        "decode_step_s",
        "device_step_s",
        "host_issue_s",
        "host_per_section_s",
        "host_step_s",
        "kernel_launch_s",
        "per_op_s",
        "section_reconfig_s",
        "sync_s",
        "ws_layer_pass_s",
    }
)
"""Every ``[overheads]`` figure a lowering reads, as `ARCH_KEYS` for ``[arch]``."""
SECTION_KEYS = {
    "": frozenset(
        {"name", "kind", "description", "aliases", "extends", "process", "power", "compute", "memory", "link"}
        | {"overheads", "parallel", "arch", "topology", "energy", "defaults", "calibration"}
    ),
    "process": frozenset({"node_nm", "area_mm2"}),
    "power": frozenset({"watts", "covers"}),
    "compute": frozenset({"units", "clock_hz", "unit_name", "peak_flops", "fp32_accumulate_flops"})
    | frozenset({"vector_flops", "special_ops"}),
    "memory": frozenset({"name", "level", "capacity_bytes", "bandwidth_bytes_per_s"}),
    "link": frozenset({"name", "bandwidth_bytes_per_s", "latency_s"}),
    "parallel": frozenset({"strategies", "tp_collective"}),
    "topology": frozenset({"devices_per_node", "intra_node_link", "inter_node_link"}),
    "overheads": OVERHEAD_KEYS,
    "arch": ARCH_KEYS,
}
"""The keys each table of a target file takes (``""``: the top level; ``memory`` and ``link``: each
entry of those arrays); ``[energy]`` and ``[defaults]`` check theirs where they are read, and
``[calibration]`` is the host's record of how it was measured (`dabench_ir.execute.calibrate`)."""
ENERGY_TABLES = ("pj_per_flop", "pj_per_byte")
"""The ``[energy]`` tables (`dabench_ir.energy.energy_model`): picojoules per FLOP by precision, per
byte by memory or link name; each figure positive. ``static_fraction`` beside them: a fraction."""
_DIR = Path(__file__).resolve().parent

# Where ops are fed from, for the roofline: dataflow chips with all-SRAM execution read
# their operands on-chip; DDR/HBM-backed targets read them off-chip.
# Peak-FLOP fallbacks when a target lists no figure for a dtype (16-bit formats share units).
_PEAK_FALLBACK = {"bf16": "fp16", "fp16": "bf16"}
_DTYPE_KEYS = {"mixed": "fp16", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

OP_CLASSES = ("contraction", "vector", "special")
"""The op classes a `Cost` splits its work into, each with its own rate (`Target.rate`):
``contraction`` FLOP/s (tensor cores, the matmul datapath: ``[compute.peak_flops]``),
``vector`` FLOP/s (elementwise arithmetic on the vector/CUDA cores: ``[compute.vector_flops]``)
and ``special`` results/s (exp, erf, rsqrt, ... on the special-function units:
``[compute.special_ops]``)."""
_RATE_TABLES = {"vector": "vector_flops", "special": "special_ops"}
_ACCUMULATE_TABLE = "fp32_accumulate_flops"
"""``[compute.fp32_accumulate_flops]``: the contraction rate of 16-bit inputs accumulated in fp32,
per input dtype, on a target whose matmul datapath is bound by the accumulator's width (the WSE:
the partial sums stream through PE SRAM). Absent: fp32 accumulation runs at the 16-bit peak (GPU
tensor cores accumulate in fp32 at full rate)."""


def _dtype_key(dtype: DType | str) -> str:
    """The target-file key of a dtype (``fp16``, ``bf16``, ``fp32``, ...)."""
    key = dtype.short if isinstance(dtype, DType) else str(dtype).lower()
    return _DTYPE_KEYS.get(key, key)


def ridge(peak_flops: float, bandwidth_bytes_per_s: float) -> float:
    """The roofline's ridge point, FLOPs per byte: ``peak_flops`` over ``bandwidth_bytes_per_s``.

    `Target.ridge_point` applies it to a target's memory; a caller holding a peak that is not
    one of a target's (a plot's fallback, a calibrated host model) calls it directly.
    """
    return peak_flops / bandwidth_bytes_per_s


def _value_of(figure: str) -> property:
    """A read-only attribute that is the value of the `Quantity` field ``figure`` (``watts`` of ``power``)."""
    return property(operator.attrgetter(f"{figure}.value"))


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number with the source it comes from; ``estimate`` marks an assumption.

    ``fitted_to`` names the validation-catalogue points a fitted parameter was fitted to
    (point ids, ``fnmatch`` patterns such as ``"sn30-gpt2-h1600-L*-O3"``): the one record of
    which points are in sample (`validate` scores every other point of the target out of sample).
    """

    value: float
    source: str
    estimate: bool = False
    fitted_to: tuple[str, ...] = ()

    @property
    def fitted(self) -> bool:
        return bool(self.fitted_to)

    def fitted_on(self, point_id: str) -> bool:
        """Whether catalogue point ``point_id`` is one this parameter was fitted to."""
        return any(fnmatch.fnmatchcase(point_id, pattern) for pattern in self.fitted_to)

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True, slots=True)
class MemoryLevel:
    """One of a target's memories (``[[memory]]``): its level, its capacity and its bandwidth."""

    name: str
    level: str  # one of `LEVELS`
    capacity: Quantity
    bandwidth: Quantity
    capacity_bytes = _value_of("capacity")
    bandwidth_bytes_per_s = _value_of("bandwidth")


@dataclass(frozen=True, slots=True)
class Link:
    """A link between devices (``[[link]]``): its bandwidth and the latency of one transfer."""

    name: str
    bandwidth: Quantity
    latency: Quantity
    bandwidth_bytes_per_s = _value_of("bandwidth")
    latency_s = _value_of("latency")


@dataclass(frozen=True, slots=True)
class Topology:
    """How devices are grouped into nodes: devices per node, the link inside a node and between nodes.

    A collective among devices of one node runs over ``intra``; one that spans nodes runs
    hierarchically (inside each node over ``intra``, between nodes over ``inter``, which is
    the per-device share of the node's network). ``inter`` None: one node is the whole system.
    """

    devices_per_node: Quantity
    intra: Link
    inter: Link | None = None

    @property
    def per_node(self) -> int:
        return int(self.devices_per_node.value)

    def nodes(self, devices: int) -> int:
        """Nodes that ``devices`` devices span (filled node by node)."""
        return max(1, math.ceil(devices / self.per_node))


@dataclass(frozen=True, eq=False)
class Target:
    """One accelerator (one chip, card or system as ``power_covers`` says)."""

    name: str
    kind: str
    description: str
    aliases: tuple[str, ...]
    process_node: Quantity
    power: Quantity
    power_covers: str
    units: Quantity
    unit_name: str
    clock: Quantity | None
    peaks: Mapping[str, Quantity]
    memories: tuple[MemoryLevel, ...]
    vector_rates: Mapping[str, Quantity] = field(default_factory=dict)
    special_rates: Mapping[str, Quantity] = field(default_factory=dict)
    accumulate_rates: Mapping[str, Quantity] = field(default_factory=dict)
    links: tuple[Link, ...] = ()
    overheads: Mapping[str, Quantity] = field(default_factory=dict)
    strategies: tuple[str, ...] = ()
    arch: Mapping[str, Quantity] = field(default_factory=dict)
    topology: Topology | None = None
    origin: str = "<dict>"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    base: str = ""  # the built-in target this one's file extends (`derived`), "" for a file of its own

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], origin: str = "<dict>") -> Target:
        """Validate a parsed target file; a missing or bad field raises TargetError by name."""
        return _Parser(origin).target(d)

    # -- accessors ------------------------------------------------------------------
    @property
    def num_units(self) -> int:
        return int(self.units.value)

    node_nm = _value_of("process_node")
    watts = _value_of("power")

    def peak_flops(self, dtype: DType | str) -> float:
        """Peak FLOP/s at ``dtype``; bf16 and fp16 stand in for each other when one is absent."""
        key = _dtype_key(dtype)
        if key in self.peaks:
            return self.peaks[key].value
        alt = _PEAK_FALLBACK.get(key)
        if alt in self.peaks:
            logger.info("target %s has no %s peak; using its %s peak", self.name, key, alt)
            return self.peaks[alt].value
        raise TargetError(
            f"target {self.name} does not support {key} (no peak FLOP/s for it); it supports "
            f"{', '.join(self.peaks)}: choose one of those with --precision"
        )

    def peak_bound(self, dtype: DType | str) -> float:
        """The FLOP/s no node at ``dtype`` may exceed: `peak_flops`, or for a dtype the target lists
        no peak for its highest peak (a bound whatever units the node runs on). The physics
        verifier checks it; the host CPU's times are floored by it."""
        try:
            return self.peak_flops(dtype)
        except TargetError:
            return max(q.value for q in self.peaks.values())

    def rate(self, op_class: str, dtype: DType | str, accumulate: DType | str | None = None) -> float:
        """Peak rate of one op class (`OP_CLASSES`) at ``dtype``, per second: ``contraction``
        FLOP/s is `peak_flops`, or with ``accumulate`` fp32 and 16-bit inputs the target's
        ``[compute.fp32_accumulate_flops]`` entry for ``dtype`` where it has one (a datapath bound
        by the accumulator's width; absent: the 16-bit peak); ``vector`` FLOP/s and ``special`` results/s come from
        ``[compute.vector_flops]`` / ``[compute.special_ops]``. A dtype a table lacks takes its
        16-bit twin (bf16/fp16), else the fp32 entry (elementwise and special-function math
        runs in fp32 when the storage format has no unit of its own). A target whose file has
        no table for the class runs that class at `peak_flops` (one rate for every FLOP)."""
        if op_class == "contraction":
            key = _dtype_key(dtype)
            if accumulate is not None and _dtype_key(accumulate) == "fp32" and key != "fp32":
                for k in (key, _PEAK_FALLBACK.get(key)):
                    if k in self.accumulate_rates:
                        return self.accumulate_rates[k].value
            return self.peak_flops(dtype)
        if op_class not in _RATE_TABLES:
            raise ValueError(f"unknown op class {op_class!r}; one of {', '.join(OP_CLASSES)}")
        table = self.vector_rates if op_class == "vector" else self.special_rates
        if not table:
            return self.peak_flops(dtype)
        key = _dtype_key(dtype)
        for k in (key, _PEAK_FALLBACK.get(key), "fp32"):
            if k in table:
                return table[k].value
        raise TargetError(
            f"target {self.name} has no {_RATE_TABLES[op_class]} rate for {key} (nor fp32); it lists {', '.join(table)}"
        )

    def class_times(
        self,
        cost: Cost,
        dtype: DType | str,
        *,
        contraction_dtype: DType | str | None = None,
        contraction_efficiency: float = 1.0,
        accumulate_dtype: DType | str | None = None,
    ) -> dict[str, float]:
        """Seconds of each op class of ``cost`` at its own rate (`rate`): contraction FLOPs at the
        ``contraction_dtype`` (default ``dtype``) rate with products accumulated in
        ``accumulate_dtype`` (None: as the inputs), times ``contraction_efficiency`` (the matmul
        efficiency is a contraction figure and applies to nothing else), vector FLOPs and
        special-function ops at the vector and special rates of ``dtype``. Classes with no work
        take 0 s (and need no rate)."""
        work = {"contraction": cost.contraction_flops, "vector": cost.vector_flops, "special": cost.special_ops}
        out = dict.fromkeys(OP_CLASSES, 0.0)
        for cls, n in work.items():
            if n:
                if cls == "contraction":
                    rate = self.rate(cls, contraction_dtype or dtype, accumulate_dtype) * contraction_efficiency
                else:
                    rate = self.rate(cls, dtype)
                out[cls] = n / rate
        return out

    def compute_time(self, cost: Cost, dtype: DType | str, **contraction: Any) -> float:
        """Compute seconds of ``cost``: the sum of its op classes' times (`class_times`, whose
        ``contraction_*`` and ``accumulate_dtype`` keywords ``contraction`` holds),
        ``C / (rate_c x efficiency) + V / rate_v + S / rate_s``. The one rule every lowering
        times compute with (docs/targets.md, "Rates per op class"): the classes share the
        issue slots (a GPU warp scheduler, a WSE PE's single core), so their times add."""
        return sum(self.class_times(cost, dtype, **contraction).values())

    def memory(self, name_or_level: str) -> MemoryLevel:
        """A memory by name (``hbm``), or the first one at a level (``on-chip``/``off-chip``)."""
        for mem in self.memories:
            if mem.name == name_or_level:
                return mem
        for mem in self.memories:
            if mem.level == name_or_level:
                return mem
        known = ", ".join(f"{m.name} ({m.level})" for m in self.memories)
        raise TargetError(f"target {self.name} has no memory {name_or_level!r}; it has {known}")

    def has_memory(self, name_or_level: str) -> bool:
        return any(name_or_level in (m.name, m.level) for m in self.memories)

    @property
    def feed_level(self) -> str:
        """The memory level whose bandwidth bounds ops on this target (roofline): the
        lowering for its kind says (see `Lowering.feed_level`)."""
        from dabench_ir.lowering import lowering_for

        return lowering_for(self).feed_level(self)

    @property
    def feed_memory(self) -> MemoryLevel:
        if self.has_memory(self.feed_level):
            return self.memory(self.feed_level)
        return self.memories[0]

    def ridge_point(self, dtype: DType | str, level: str | MemoryLevel | None = None) -> float:
        """FLOPs per byte where the roofline turns from memory- to compute-bound: peak FLOP/s at
        ``dtype`` over the bandwidth of ``level`` (a `MemoryLevel`, a memory's name or level;
        None: the feed memory). The one place a target's ridge point is computed."""
        mem = level if isinstance(level, MemoryLevel) else (self.memory(level) if level else self.feed_memory)
        return ridge(self.peak_flops(dtype), mem.bandwidth_bytes_per_s)

    def link(self, name: str | None = None) -> Link | None:
        """A link by name, or the first one; None when the target lists none."""
        if name is None:
            return self.links[0] if self.links else None
        for link in self.links:
            if link.name == name:
                return link
        return None

    def default(self, name: str) -> Any:
        """The target's ``[defaults]`` value for a knob (``precision``, ``fused_attention``), or None:
        what practitioners run on it when the user does not say (each entry carries its source)."""
        entry = (self.raw.get("defaults") or {}).get(name)
        return entry.get("value") if isinstance(entry, Mapping) else None

    def overhead(self, name: str, default: float = 0.0) -> float:
        """An ``[overheads]`` figure a lowering may go without (``default`` when the file has none)."""
        q = self.overheads.get(_declared(name, OVERHEAD_KEYS))
        return default if q is None else q.value

    def overhead_value(self, name: str, *, needed_by: str) -> float:
        """An ``[overheads]`` figure the ``needed_by`` lowering cannot go without (a fitted host or
        device cost: read as 0 it would vanish from every step unsaid); missing raises TargetError
        naming ``overheads.<name>``."""
        q = self.overheads.get(_declared(name, OVERHEAD_KEYS))
        if q is None:
            raise TargetError(
                f"target file {self.origin}: missing field overheads.{name} (needed by the {needed_by} lowering)"
            )
        return q.value

    def arch_value(self, name: str, default: float | None = None, *, needed_by: str = "") -> float:
        """An ``[arch]`` knob; missing and no default raises TargetError naming ``arch.<name>``."""
        q = self.arch.get(_declared(name, ARCH_KEYS))
        if q is not None:
            return q.value
        if default is not None:
            return default
        who = f" (needed by the {needed_by} lowering)" if needed_by else ""
        raise TargetError(f"target file {self.origin}: missing field arch.{name}{who}")

    def estimates(self) -> list[str]:
        """Dotted names of every figure marked as an estimate."""
        out = []
        for path, q in self.quantities():
            if q.estimate:
                out.append(path)
        return out

    def fitted_on(self, point_id: str) -> list[str]:
        """The dotted names of the parameters fitted to catalogue point ``point_id`` (none: the
        point is out of sample for this target)."""
        return [path for path, q in self.quantities() if q.fitted_on(point_id)]

    def quantities(self) -> list[tuple[str, Quantity]]:
        """Every number in the target with its dotted field name."""
        items: list[tuple[str, Quantity]] = [
            ("process.node_nm", self.process_node),
            ("power.watts", self.power),
            ("compute.units", self.units),
        ]
        if self.clock is not None:
            items.append(("compute.clock_hz", self.clock))
        items += [(f"compute.peak_flops.{k}", q) for k, q in self.peaks.items()]
        items += [(f"compute.vector_flops.{k}", q) for k, q in self.vector_rates.items()]
        items += [(f"compute.special_ops.{k}", q) for k, q in self.special_rates.items()]
        items += [(f"compute.{_ACCUMULATE_TABLE}.{k}", q) for k, q in self.accumulate_rates.items()]
        for i, m in enumerate(self.memories):
            items += [(f"memory[{i}].capacity_bytes", m.capacity), (f"memory[{i}].bandwidth_bytes_per_s", m.bandwidth)]
        for i, lk in enumerate(self.links):
            items += [(f"link[{i}].bandwidth_bytes_per_s", lk.bandwidth), (f"link[{i}].latency_s", lk.latency)]
        items += [(f"overheads.{k}", q) for k, q in self.overheads.items()]
        items += [(f"arch.{k}", q) for k, q in self.arch.items()]
        if self.topology is not None:
            items.append(("topology.devices_per_node", self.topology.devices_per_node))
        return items

    def with_changes(self, changes: Mapping[str, float | str]) -> Target:
        """This target with some figures changed: a *counterfactual* machine (a finding's mechanism
        switched off, `dabench_ir.reproduce`). ``changes`` maps a figure's dotted name in the file
        (as `quantities` names it: ``compute.peak_flops.fp32``, ``memory[1].bandwidth_bytes_per_s``;
        or ``energy.pj_per_byte.ddr``) to a number or to another figure's name whose value it takes
        (``"compute.peak_flops.bf16"``: fp32 at the bf16 rate). A name in a table the file has
        (``overheads``, ``arch``) may be new. Each changed figure's source says what it replaced;
        a bad name or value raises TargetError naming it."""
        import copy

        raw = copy.deepcopy(dict(self.raw))
        for path, value in changes.items():
            if isinstance(value, str):
                number = _figure_entry(raw, value, self.name, create=False)["value"]
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                number = float(value)
            else:
                raise TargetError(f"target {self.name}: {path} = {value!r}: expected a number or a figure's name")
            entry = _figure_entry(raw, path, self.name, create=True)
            old = f"was {entry['value']:g}" if "value" in entry else "not in the file"
            entry.clear()
            entry.update({"value": number, "source": f"counterfactual: {path} = {value!r}; {old}", "estimate": True})
        return Target.from_dict(raw, origin=f"{self.origin} (counterfactual)")

    def toml(self) -> str:
        """The target file's text (`with_changes` targets are written with it for sweep workers)."""
        return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in self.raw.items())

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


def _figure_entry(raw: dict[str, Any], path: str, target: str, *, create: bool) -> dict[str, Any]:
    """The inline table ``{ value, source, ... }`` of figure ``path`` in a target file's table
    ``raw``; with ``create``, a new one in an existing ``overheads`` or ``arch`` table."""
    parts = path.split(".")
    node: Any = raw
    for part in parts[:-1]:
        name, _, index = part.partition("[")
        node = node.get(name) if isinstance(node, dict) else None
        if index and isinstance(node, list) and index[:-1].isdigit() and int(index[:-1]) < len(node):
            node = node[int(index[:-1])]
        if not isinstance(node, dict):
            break
    entry = node.get(parts[-1]) if isinstance(node, dict) else None
    if isinstance(entry, dict) and "value" in entry:
        return entry
    if create and entry is None and isinstance(node, dict) and len(parts) == 2 and parts[0] in ("overheads", "arch"):
        return node.setdefault(parts[-1], {})
    raise TargetError(
        f"target {target}: no figure {path!r} (`dabench-ir targets --show {target}` lists them; "
        "a new figure may only be added to overheads or arch)"
    )


def _toml_key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)


def _toml_value(value: Any) -> str:
    """A value as inline TOML (strings in JSON's escapes, which TOML's basic strings share)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


_OWNED_ELSEWHERE = {"arch.tiles": "an IPU's compute.units (its tiles)"}
"""Keys older target files set that another field owns now: read twice, the two could disagree."""


def _declared(name: str, keys: frozenset[str]) -> str:
    """``name``, a figure the format declares (`ARCH_KEYS`, `OVERHEAD_KEYS`): reading another is a bug."""
    if name not in keys:
        raise ValueError(f"no target file declares the figure {name!r}: add it to the format's keys")
    return name


class _Parser:
    """Field-by-field validation with error messages that name the field."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, what: str) -> TargetError:
        return TargetError(f"target file {self.origin}: {what}")

    def keys(self, d: Mapping[str, Any], section: str, path: str) -> None:
        """Refuse a key ``section`` does not take (`SECTION_KEYS`): a typo would be a figure nothing
        reads, its default taken unsaid."""
        allowed = SECTION_KEYS[section]
        for key in d:
            if key not in allowed:
                where = f"{path}.{key}" if path else key
                if where in _OWNED_ELSEWHERE:
                    raise self.fail(f"{where} is {_OWNED_ELSEWHERE[where]}; drop {where}")
                hint = did_you_mean(key, allowed) or f"; it takes {', '.join(sorted(allowed))}"
                raise self.fail(f"field {where}: unknown key{hint}")

    def table(self, d: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> Mapping[str, Any]:
        if key not in d:
            if required:
                raise self.fail(f"missing field {path}")
            return {}
        val = d[key]
        if not isinstance(val, Mapping):
            raise self.fail(f"field {path} must be a table, got {type(val).__name__}")
        return val

    def string(self, d: Mapping[str, Any], key: str, path: str, *, default: str | None = None) -> str:
        if key not in d:
            if default is None:
                raise self.fail(f"missing field {path}")
            return default
        val = d[key]
        if not isinstance(val, str) or not val:
            raise self.fail(f"field {path} must be a non-empty string, got {val!r}")
        return val

    def quantity(
        self,
        d: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = True,
        positive: bool = False,
        rule: schema.Range | None = None,
    ) -> Quantity | None:
        """The figure ``d[key]`` (``{ value, source, estimate?, fitted_to? }``), its value in the range
        ``rule`` (default: a fraction for a share of a whole, `SHARE_PATTERNS`, else positive
        with ``positive``, else non-negative)."""
        if key not in d:
            if required:
                raise self.fail(f"missing field {path}")
            return None
        raw = d[key]
        if not isinstance(raw, Mapping):
            raise self.fail(f'field {path} must be an inline table {{ value = ..., source = "..." }}, got {raw!r}')
        if "value" not in raw:
            raise self.fail(f"missing field {path}.value")
        if rule is None and any(fnmatch.fnmatchcase(key, pattern) for pattern in SHARE_PATTERNS):
            rule = schema.FRACTION
        rule = rule or (schema.POSITIVE if positive else schema.NON_NEGATIVE)
        value = schema.check(raw["value"], rule, f"target file {self.origin}: field {path}.value", TargetError)
        if "source" not in raw:
            raise self.fail(f"missing field {path}.source")
        source = raw["source"]
        if not isinstance(source, str) or not source.strip():
            raise self.fail(f"field {path}.source must be a non-empty string")
        estimate = raw.get("estimate", False)
        if not isinstance(estimate, bool):
            raise self.fail(f"field {path}.estimate must be true or false, got {estimate!r}")
        fitted_to = raw.get("fitted_to", [])
        if not isinstance(fitted_to, list) or not all(isinstance(x, str) and x.strip() for x in fitted_to):
            raise self.fail(
                f"field {path}.fitted_to must be a list of catalogue point ids (or patterns), got {fitted_to!r}"
            )
        unknown = sorted(set(raw) - {"value", "source", "estimate", "fitted_to"})
        if unknown:
            raise self.fail(
                f"field {path} has unknown key {unknown[0]!r}: a figure is {{ value, source, estimate, fitted_to }}"
            )
        return Quantity(float(value), source, estimate, tuple(fitted_to))

    def precision(self, key: str, path: str) -> None:
        """A table key that names a precision (``fp32``, ``bf16``; ``tf32``: fp32 storage on tensor cores)."""
        try:
            DType.from_name("fp32" if key == "tf32" else key)
        except ValueError:
            raise self.fail(f"field {path}: unknown precision {key!r}") from None

    def energy(self, raw: Mapping[str, Any]) -> None:
        """The ``[energy]`` table (read by `dabench_ir.energy.energy_model`): ``static_fraction`` a
        fraction of the rated power, `ENERGY_TABLES` of positive picojoule figures."""
        unknown = sorted(set(raw) - {"static_fraction", *ENERGY_TABLES})
        if unknown:
            raise self.fail(
                f"field energy.{unknown[0]}: unknown key; [energy] takes static_fraction, {', '.join(ENERGY_TABLES)}"
            )
        self.quantity(raw, "static_fraction", "energy.static_fraction", required=False, rule=schema.FRACTION)
        for table in ENERGY_TABLES:
            entries = self.table(raw, table, f"energy.{table}", required=False)
            for key in entries:
                if table == "pj_per_flop":
                    self.precision(key, f"energy.{table}.{key}")
                self.quantity(entries, key, f"energy.{table}.{key}", rule=schema.POSITIVE)

    def defaults(self, raw: Mapping[str, Any]) -> None:
        """The ``[defaults]`` table: each entry ``{ value, source }`` whose value its knob
        (`dabench_ir.options.KNOBS`) accepts, as the command line's flag would be checked."""
        from dabench_ir.options import KNOBS

        for key, entry in raw.items():
            if not isinstance(entry, Mapping) or "value" not in entry or not str(entry.get("source", "")).strip():
                raise self.fail(f'field defaults.{key} must be an inline table {{ value = ..., source = "..." }}')
            if key not in KNOBS:
                raise self.fail(f"field defaults.{key}: no such knob; a default is a knob's value (e.g. precision)")
            try:
                KNOBS[key].validate(entry["value"])
            except ValueError as exc:
                raise self.fail(f"field defaults.{key}.value {entry['value']!r}: {exc}") from None

    def topology(self, raw: Mapping[str, Any], links: list[Link]) -> Topology | None:
        """The ``[topology]`` table: ``devices_per_node`` and the names of two ``[[link]]`` entries."""
        if not raw:
            return None
        self.keys(raw, "topology", "topology")
        per_node = self.quantity(raw, "devices_per_node", "topology.devices_per_node", rule=schema.COUNT)
        by_name = {lk.name: lk for lk in links}

        def link(key: str, required: bool) -> Link | None:
            name = raw.get(key)
            if name is None and not required:
                return None
            name = self.string(raw, key, f"topology.{key}")
            if name not in by_name:
                known = ", ".join(by_name) or "none"
                raise self.fail(f"field topology.{key} names link {name!r}; the file declares: {known}")
            return by_name[name]

        return Topology(per_node, link("intra_node_link", True), link("inter_node_link", False))

    def compute(self, compute: Mapping[str, Any]) -> dict[str, Any]:
        """``[compute]``: the units, their clock and name, the peak per precision, the per-class rates
        (``vector_flops``, ``special_ops``) and the fp32-accumulated rate of 16-bit inputs, as the
        `Target` fields they fill."""
        self.keys(compute, "compute", "compute")
        units = self.quantity(compute, "units", "compute.units", rule=schema.COUNT)
        clock = self.quantity(compute, "clock_hz", "compute.clock_hz", required=False, positive=True)
        unit_name = self.string(compute, "unit_name", "compute.unit_name", default="unit")
        peaks_raw = self.table(compute, "peak_flops", "compute.peak_flops")
        if not peaks_raw:
            raise self.fail("field compute.peak_flops must list at least one precision (fp32 = {...})")
        peaks = {}
        for key in peaks_raw:
            self.precision(key, f"compute.peak_flops.{key}")
            peaks[key] = self.quantity(peaks_raw, key, f"compute.peak_flops.{key}", positive=True)
        rates = {}
        for table in _RATE_TABLES.values():  # per-class rates, optional: [compute.vector_flops], [compute.special_ops]
            raw = self.table(compute, table, f"compute.{table}", required=False)
            for key in raw:
                self.precision(key, f"compute.{table}.{key}")
            rates[table] = {k: self.quantity(raw, k, f"compute.{table}.{k}", positive=True) for k in raw}
        acc_raw = self.table(compute, _ACCUMULATE_TABLE, f"compute.{_ACCUMULATE_TABLE}", required=False)
        for key in acc_raw:  # keyed by the 16-bit input dtype whose fp32-accumulated rate it is
            if key not in ("fp16", "bf16"):
                raise self.fail(f"field compute.{_ACCUMULATE_TABLE}.{key}: expected a 16-bit input dtype (fp16, bf16)")
        return {
            "units": units,
            "unit_name": unit_name,
            "clock": clock,
            "peaks": peaks,
            "vector_rates": rates["vector_flops"],
            "special_rates": rates["special_ops"],
            "accumulate_rates": {
                k: self.quantity(acc_raw, k, f"compute.{_ACCUMULATE_TABLE}.{k}", positive=True) for k in acc_raw
            },
        }

    def memories(self, mems_raw: Any) -> list[MemoryLevel]:
        """``[[memory]]``: at least one level, each with its name, level, capacity and bandwidth."""
        if mems_raw is None:
            raise self.fail("missing field memory (at least one [[memory]] entry)")
        if not isinstance(mems_raw, list) or not mems_raw:
            raise self.fail("field memory must be a non-empty array of tables ([[memory]])")
        memories = []
        for i, m in enumerate(mems_raw):
            p = f"memory[{i}]"
            if not isinstance(m, Mapping):
                raise self.fail(f"field {p} must be a table")
            self.keys(m, "memory", p)
            level = self.string(m, "level", f"{p}.level")
            if level not in LEVELS:
                raise self.fail(f"field {p}.level must be one of {', '.join(LEVELS)}, got {level!r}")
            memories.append(
                MemoryLevel(
                    name=self.string(m, "name", f"{p}.name"),
                    level=level,
                    capacity=self.quantity(m, "capacity_bytes", f"{p}.capacity_bytes", positive=True),
                    bandwidth=self.quantity(m, "bandwidth_bytes_per_s", f"{p}.bandwidth_bytes_per_s", positive=True),
                )
            )
        return memories

    def links(self, links_raw: Any) -> list[Link]:
        """``[[link]]``: each link's name, bandwidth and latency (none: a single-device target)."""
        if not isinstance(links_raw, list):
            raise self.fail("field link must be an array of tables ([[link]])")
        links = []
        for i, lk in enumerate(links_raw):
            p = f"link[{i}]"
            if not isinstance(lk, Mapping):
                raise self.fail(f"field {p} must be a table")
            self.keys(lk, "link", p)
            links.append(
                Link(
                    name=self.string(lk, "name", f"{p}.name"),
                    bandwidth=self.quantity(lk, "bandwidth_bytes_per_s", f"{p}.bandwidth_bytes_per_s", positive=True),
                    latency=self.quantity(lk, "latency_s", f"{p}.latency_s"),
                )
            )
        return links

    def target(self, d: Mapping[str, Any]) -> Target:
        if not isinstance(d, Mapping):
            raise self.fail("a target file must be a TOML table")
        self.keys(d, "", "")
        name = self.string(d, "name", "name")
        kind = self.string(d, "kind", "kind")
        if kind not in KINDS:
            raise self.fail(f"field kind must be one of {', '.join(KINDS)}, got {kind!r}")
        aliases = d.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise self.fail("field aliases must be a list of strings")

        process = self.table(d, "process", "process")
        self.keys(process, "process", "process")
        node = self.quantity(process, "node_nm", "process.node_nm", positive=True)
        self.quantity(process, "area_mm2", "process.area_mm2", required=False, positive=True)  # energy.target_area_mm2
        power = self.table(d, "power", "power")
        self.keys(power, "power", "power")
        watts = self.quantity(power, "watts", "power.watts", positive=True)
        covers = self.string(power, "covers", "power.covers", default="chip")

        compute = self.compute(self.table(d, "compute", "compute"))
        memories = self.memories(d.get("memory"))
        links = self.links(d.get("link", []))

        overheads_raw = self.table(d, "overheads", "overheads", required=False)
        self.keys(overheads_raw, "overheads", "overheads")
        overheads = {k: self.quantity(overheads_raw, k, f"overheads.{k}") for k in overheads_raw}
        parallel = self.table(d, "parallel", "parallel", required=False)
        self.keys(parallel, "parallel", "parallel")
        strategies = parallel.get("strategies", [])
        if not isinstance(strategies, list) or not all(s in ("dp", "tp", "pp") for s in strategies):
            raise self.fail(f"field parallel.strategies must list some of dp, tp, pp, got {strategies!r}")
        arch_raw = self.table(d, "arch", "arch", required=False)
        self.keys(arch_raw, "arch", "arch")
        arch = {
            k: self.quantity(arch_raw, k, f"arch.{k}", rule=schema.COUNT if k in ARCH_COUNTS else None)
            for k in arch_raw
        }
        topology = self.topology(self.table(d, "topology", "topology", required=False), links)
        self.energy(self.table(d, "energy", "energy", required=False))
        self.defaults(self.table(d, "defaults", "defaults", required=False))

        return Target(
            name=name,
            kind=kind,
            description=str(d.get("description", "")),
            aliases=tuple(aliases),
            process_node=node,
            power=watts,
            power_covers=covers,
            **compute,
            memories=tuple(memories),
            links=tuple(links),
            overheads=overheads,
            strategies=tuple(strategies),
            arch=arch,
            topology=topology,
            origin=self.origin,
            raw=dict(d),
            base=str(d.get("extends") or ""),
        )


def builtin_target_paths() -> dict[str, Path]:
    """Built-in target name -> its TOML file (shipped as package data)."""
    return {p.stem: p for p in sorted(_DIR.glob("*.toml"))}


_LOADED: dict[tuple, Target] = {}
"""Targets read in this process, by file and its stat: a file read again unchanged is not parsed again
(validate and sweeps load a target per point); a changed file (a new calibration) is read anew."""


def _stat_key(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


def _load_file(path: Path) -> Target:
    key = _stat_key(path)
    if key is not None and key in _LOADED:
        return _LOADED[key]
    target = _read_file(path)
    if key is not None:
        _LOADED[key] = target
    return target


def _read_file(path: Path) -> Target:
    from dabench_ir.errors import UserError
    from dabench_ir.fileio import read_text_file

    try:
        text = read_text_file(path, "target file")  # a FIFO, folder or binary file is refused here
    except UserError as exc:
        raise TargetError(str(exc)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TargetError(f"target file {path.name}: not valid TOML ({exc})") from None
    return Target.from_dict(_extended(data, path.name), origin=path.name)


def _extended(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """A target file that ``extends`` a built-in target: that target's figures with the file's own
    laid over them (`derived`); a file without ``extends`` as it is."""
    base = data.get("extends")
    if base is None:
        return data
    if not isinstance(base, str) or base.strip().lower() not in builtin_target_paths():
        raise TargetError(
            f"target file {origin}: extends = {base!r} must name a built-in target ({', '.join(builtin_target_paths())})"
        )
    base_target = _load_file(builtin_target_paths()[base.strip().lower()])
    if base_target.base:
        raise TargetError(f"target file {origin}: extends {base_target.name}, which extends another; extend that one")
    if not isinstance(data.get("name"), str) or not data["name"].strip():
        raise TargetError(f'target file {origin}: a file that extends {base_target.name} gives its own name = "..."')
    own = {k: v for k, v in data.items() if k != "extends"}
    for key, value in own.items():
        if isinstance(value, list) and any(isinstance(e, Mapping) for e in value):
            names = [e.get("name") if isinstance(e, Mapping) else None for e in value]
            if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
                raise TargetError(
                    f"target file {origin}: every [[{key}]] entry of a file that extends another needs a name of "
                    f"its own (a string, once), got {names!r}"
                )
    return {**derived(base_target.raw, own), "extends": base_target.name}


def derived(base: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """``own`` laid over ``base`` (two parsed target files): a table merges key by key; a figure (a
    table with a ``value``) and any other value are replaced whole, so no source, estimate flag or
    ``fitted_to`` of the base's figure survives a new value; an array of named tables (``[[memory]]``,
    ``[[link]]``) merges by ``name``, an entry of a new name appended. ``aliases`` are the file's own."""
    out = {k: v for k, v in base.items() if k != "aliases"}
    for key, value in own.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping) and "value" not in value and "value" not in old:
            out[key] = derived(old, value)
        elif _named_tables(value) and _named_tables(old):
            mine = {entry["name"]: entry for entry in value}
            merged = [derived(entry, mine.pop(entry["name"])) if entry["name"] in mine else entry for entry in old]
            out[key] = merged + list(mine.values())
        else:
            out[key] = value
    return out


def _named_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(e, Mapping) and "name" in e for e in value)


_ALIASES: dict[tuple, dict[str, Path]] = {}


def _alias_map() -> dict[str, Path]:
    paths = builtin_target_paths()
    key = tuple(_stat_key(p) for p in paths.values())  # the built-in files as they are now
    if key not in _ALIASES:
        _ALIASES.clear()
        _ALIASES[key] = _read_aliases(paths)
    return dict(_ALIASES[key])


def _read_aliases(paths: dict[str, Path]) -> dict[str, Path]:
    names: dict[str, Path] = {}
    for stem, path in paths.items():
        names[stem] = path
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue
        for alias in data.get("aliases", []) or []:
            names.setdefault(str(alias), path)
    return names


def target_files(targets: str | list[str] | None) -> list[str]:
    """The ``--target`` arguments (comma-separated or a list of them) that name target files: inputs of
    the run, which no output may overwrite (`dabench_ir.fileio.plan_outputs`)."""
    given = [targets] if isinstance(targets, str) else list(targets or [])
    names = [t.strip() for text in given for t in text.split(",") if t.strip()]
    return [t for t in names if is_target_path(t)]


def is_target_path(text: str) -> bool:
    """Whether a target argument names a file (``*.toml``, or an existing path) rather than a target."""
    text = text.strip()
    return text.endswith(".toml") or ("/" in text and os.path.lexists(text))


def is_host(target: object) -> bool:
    """Whether ``target`` is the name of this machine's CPU (`HOST`, any case)."""
    return isinstance(target, str) and target.strip().lower() == HOST


def load_target(name_or_path: str | Path) -> Target:
    """A target by built-in name, alias, ``cpu`` (host, calibrated) or path to a TOML file."""
    if isinstance(name_or_path, Target):
        return name_or_path
    text = str(name_or_path).strip()
    path = Path(text)
    if isinstance(name_or_path, Path) or is_target_path(text):
        if not os.path.lexists(path):
            raise TargetError(f"target file {text} does not exist")
        return _load_file(path)  # a folder or FIFO is refused there, by what it is
    key = text.lower()
    if is_host(key):
        try:
            from dabench_ir.execute.calibrate import cpu_target_path
        except ImportError as exc:
            raise TargetError(f"the cpu target needs host calibration, which is unavailable here ({exc})") from None
        return load_target(Path(cpu_target_path()))
    names = _alias_map()
    if key in names:
        return _load_file(names[key])
    known = sorted({*names, HOST})
    raise TargetError(f"unknown target {text!r}; known targets: {', '.join(known)} (or a path to a .toml file)")


def list_targets() -> list[Target]:
    """The built-in targets (not ``cpu``, which needs calibrating the host)."""
    return [_load_file(p) for p in builtin_target_paths().values()]
