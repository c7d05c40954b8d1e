"""`dabench-ir targets`: list the built-in targets and their key figures."""

from __future__ import annotations

import argparse
import logging

from dabench_ir.targets import Target, list_targets

__all__ = ["register", "run"]

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "targets",
        help="list targets and their key figures",
        description="List the built-in targets with peak FLOP/s per precision, memories, power and process "
        "node. Figures marked * are estimates (see the target file for the basis).",
    )
    parser.set_defaults(func=run)


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _star(estimate: bool) -> str:
    return "*" if estimate else ""


def describe(target: Target) -> list[str]:
    """Lines describing one target's key figures."""
    peaks = ", ".join(f"{k} {_si(q.value, 'FLOP/s')}{_star(q.estimate)}" for k, q in target.peaks.items())
    mems = "; ".join(
        f"{m.name} ({m.level}) {_si(m.capacity_bytes, 'B')}{_star(m.capacity.estimate)} @ "
        f"{_si(m.bandwidth_bytes_per_s, 'B/s')}{_star(m.bandwidth.estimate)}"
        for m in target.memories
    )
    alias = f" (alias {', '.join(target.aliases)})" if target.aliases else ""
    return [
        f"{target.name}{alias} [{target.kind}] {target.description}",
        f"    units    {target.num_units:,} {target.unit_name}s{_star(target.units.estimate)}",
        f"    peak     {peaks}",
        f"    memory   {mems}",
        f"    power    {target.watts:,.0f} W per {target.power_covers}{_star(target.power.estimate)}; "
        f"process {target.node_nm:g} nm{_star(target.process_node.estimate)}; "
        f"parallel {', '.join(target.strategies) or '-'}",
    ]


def run(args: argparse.Namespace) -> int:
    for target in list_targets():
        print("\n".join(describe(target)))
    print("cpu [cpu] the host, measured by `dabench-ir calibrate` (loaded with --target cpu)")
    print("* estimate; every figure's source is in targets/<name>.toml")
    return 0
