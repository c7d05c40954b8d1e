"""Flags several commands declare alike, each declared here once: what one command says of its
own use of a flag is its help text, passed in.

Not a subcommand: `dabench_ir.cli` registers only the modules it names.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dabench_ir.errors import UserError

__all__ = [
    "add_node_scaling",
    "add_outputs",
    "add_quiet",
    "check_top",
    "node_scaling",
    "refuse_uncounted",
    "strict_warnings",
    "wrap",
    "write_given",
]


def wrap(text: str) -> str:
    """A description for `argparse.RawDescriptionHelpFormatter`, filled to 80 columns (an epilog follows it as written)."""
    import textwrap

    return textwrap.fill(text, 80)


def check_top(top: int) -> None:
    """``--top N``: 0 (every row) or a positive number."""
    if top < 0:
        raise UserError(f"--top {top}: expected 0 (all rows) or a positive number")


def node_scaling(args: Any) -> str:
    """The rule ``--normalize-to`` scales energy by (`add_node_scaling`): ``--scaling`` without
    ``--normalize-to`` scales nothing, so it is refused."""
    if args.scaling is not None and args.normalize_to is None:
        raise UserError(
            f"--scaling {args.scaling} is how --normalize-to scales energy; add --normalize-to NM or drop it"
        )
    return args.scaling or "post-dennard"


def add_quiet(p: Any, help: str) -> None:
    """``--quiet``/``-q``; ``help`` says what the command leaves out (every command's says it)."""
    p.add_argument("--quiet", "-q", action="store_true", help=help)


def add_outputs(p: Any, **helps: str) -> None:
    """One output flag per keyword, in the order given: ``json="..."`` declares ``--json F`` with that
    help; ``plots`` a folder, ``--plots DIR``."""
    for name, help in helps.items():
        p.add_argument(f"--{name}", metavar="DIR" if name == "plots" else "F", help=help)


def add_node_scaling(p: argparse.ArgumentParser, normalize_help: str) -> None:
    """``--normalize-to NM`` and the rule it scales by, ``--scaling`` (`energy.SCALING_RULES`)."""
    from dabench_ir.energy import SCALING_RULES

    p.add_argument("--normalize-to", type=float, metavar="NM", help=normalize_help)
    p.add_argument(
        "--scaling",
        choices=list(SCALING_RULES),
        help="how --normalize-to scales energy with the node: post-dennard (linear) or dennard (cubic) "
        "(default: post-dennard; docs/energy.md)",
    )


def strict_warnings(warnings: Sequence[str], *, strict: bool, holders: str) -> None:
    """Print each warning of nodes without a cost rule on stderr; with ``--strict`` they are an error
    (exit 2) naming how many ``holders`` (e.g. "report(s)") hold such nodes."""
    from dabench_ir.errors import UserError

    for line in warnings:
        print(line, file=sys.stderr)
    if strict and warnings:
        raise UserError(f"--strict: {len(warnings)} {holders} hold nodes without a cost rule (see the warnings above)")


def refuse_uncounted(reports: Sequence[Any], *, strict: bool) -> None:
    """``--strict`` on `profile`: a report with nodes without a cost rule (unattributed, or estimated
    by a fallback) is an error (exit 2) naming how many and the first; without it, nothing."""
    from dabench_ir.errors import UserError

    uncounted = [n for r in reports for n in (*r.unattributed, *(r.extra.get("estimated") or []))]
    if strict and uncounted:
        first = uncounted[0]
        raise UserError(
            f"{len(uncounted)} node(s) without a cost rule (first: {first['name']}: {first['reason']}); "
            "drop --strict to report them and go on"
        )


def write_given(args: argparse.Namespace, writers: Mapping[str, Callable[[str], Any]]) -> list[str]:
    """Each output flag given on ``args``, written by its writer in ``writers`` (flag name -> a function
    of the flag's path returning the path written), in that order; the paths written, as text."""
    return [str(write(getattr(args, flag))) for flag, write in writers.items() if getattr(args, flag)]
