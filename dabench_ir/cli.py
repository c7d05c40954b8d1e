"""The `dabench-ir` command line: one subcommand per module in `dabench_ir.commands`.

Exit codes: 0 success, 2 bad input or usage (one line on stderr), 1 internal error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from dabench_ir import __version__
from dabench_ir.errors import UserError

__all__ = ["main"]

# Subcommand modules, imported lazily so `profile` never pays for `export`'s torch import.
_COMMANDS = (
    "profile",
    "export",
    "scale",
    "sweep",
    "compare",
    "study",
    "diff",
    "targets",
    "calibrate",
    "demo",
    "validate",
)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors follow our exit-code rules."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="dabench-ir",
        description="Profile LLM decoder graphs on dataflow accelerators (WSE, RDU, IPU), GPUs and the host CPU.",
    )
    parser.add_argument("--version", action="version", version=f"dabench-ir {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"dabench_ir.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"dabench_ir.commands.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        logging.basicConfig(
            level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
            format="%(levelname)s %(name)s: %(message)s",
        )
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"dabench-ir: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dabench-ir: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
