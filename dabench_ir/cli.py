"""The `dabench-ir` command line: one subcommand per module in `dabench_ir.commands`, named after
it (its ``HELP``, ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args)``).

Exit codes: 0 success, 2 bad input or usage (one line on stderr), 1 internal error (one
line on stderr naming it; ``--debug`` prints the traceback). ``dabench-ir`` alone prints the
help on stdout and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from dabench_ir import __version__, gcpolicy
from dabench_ir.errors import UserError
from dabench_ir.options import DEPRECATED

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
    "reproduce",
)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors follow our exit-code rules, and takes
    no abbreviated flag: ``--layers 1`` to ``profile`` was read as ``--layers-per-ipu 1``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` the one subcommand a run names (each subcommand's
    parser costs its module's import and its own setup: ``sweep`` reads the bundled specs)."""
    parser = _ArgumentParser(
        prog="dabench-ir",
        description="Profile LLM decoder graphs on dataflow accelerators (WSE, RDU, IPU), GPUs and the host CPU.",
    )
    parser.add_argument("--version", action="version", version=f"dabench-ir {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for name in (only,) if only in _COMMANDS else _COMMANDS:
        try:
            module = importlib.import_module(f"dabench_ir.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"dabench_ir.commands.{name}":
                continue  # subcommand not built yet
            raise
        command = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(command)
        command.set_defaults(func=module.run)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (what batch schedulers and ``kill`` send), raised where the process is, as Ctrl-C's
    KeyboardInterrupt is: a sweep or study stops its workers, writes its table and removes its locks."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough: a second must not cut the cleanup short
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command line. The collector runs as `gcpolicy` says; at the end of the process's own
    command line everything left is frozen (`gc.freeze`): the interpreter's collection at exit
    would traverse it all once more just before the process ends. The process's own command line
    takes SIGTERM as Ctrl-C (`Terminated`; exit 143 where Ctrl-C's is 130)."""
    gcpolicy.tune()
    if argv is None:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv)
    finally:
        if argv is None:  # the process's own command line: it exits next
            gc.freeze()  # so the collection at exit skips what the run left (20-40 ms); refcounting still frees it


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    head = args_list[: args_list.index("--") if "--" in args_list else None]
    debug = "--debug" in head
    if debug:  # accepted anywhere on the line, not only before the command
        args_list = [a for a in head if a != "--debug"] + args_list[len(head) :]
    try:
        parser = build_parser(_named_command(head))
        args, unknown = parser.parse_known_args(args_list)
        if unknown:
            raise UserError(_unrecognised(build_parser(), getattr(args, "command", None), unknown))
        held = _setup_logging(args.verbose)
        for line in getattr(args, DEPRECATED, None) or ():  # an old flag spelling: one line, with the rest
            logging.getLogger("dabench_ir.cli").warning(line)
        if not getattr(args, "func", None):
            parser.print_help(sys.stdout)
            return 0
        if getattr(args, "json", None) == "-" and hasattr(args, "quiet"):
            args.quiet = True  # stdout carries the JSON alone: no table, no progress, no "wrote" lines
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a full disk behind stdout fails here, not at exit
        if held is not None:
            held.show()
        return code
    except UserError as exc:
        print(f"dabench-ir: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"dabench-ir: {'terminated (SIGTERM)' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except RecursionError:
        if debug:
            traceback.print_exc()
        print("dabench-ir: error: the model is nested too deeply to read; is it the right file?", file=sys.stderr)
        return 2
    except OSError as exc:
        from dabench_ir.fileio import stdout_fails

        if not stdout_fails():
            return _internal_error(exc, debug)
        _silence_stdout()
        print(
            f"dabench-ir: error: cannot write to standard output ({exc.strerror or exc}); "
            "redirect it to a file system with space, or give an output file",
            file=sys.stderr,
        )
        return 2
    except MemoryError:
        print("dabench-ir: error: out of memory; try a smaller model or fewer points", file=sys.stderr)
        return 1
    except Exception as exc:  # the last resort: one line, never a traceback unless asked
        return _internal_error(exc, debug)


def _named_command(head: Sequence[str]) -> str | None:
    """The subcommand a command line runs, when only its parser is needed: the first word that is
    no option (the top-level options take no value), unless help before it lists every command."""
    for arg in head:
        if not arg.startswith("-"):
            return arg
        if arg.startswith(("-h", "--h")):
            return None
    return None


def _internal_error(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    print(
        f"dabench-ir: internal error: {type(exc).__name__}: {_one_line(exc)}; rerun with --debug for the traceback",
        file=sys.stderr,
    )
    return 1


def _unrecognised(parser: argparse.ArgumentParser, command: str | None, unknown: list[str]) -> str:
    """What argparse would say of arguments no flag takes, naming the commands a flag belongs to."""
    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for flag in flags:
        where = [name for name, p in sub.choices.items() if flag in p._option_string_actions]
        if command and where:
            return f"{command} has no {flag}; it is a flag of {', '.join(where)}"
    return f"{'dabench-ir ' + command if command else 'dabench-ir'}: unrecognized arguments: {' '.join(unknown)}"


class _HeldWarnings(logging.Handler):
    """Hold warnings until the command ends: shown after a success, dropped before an error,
    so a failing run prints exactly one line (-v shows everything as it happens)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def show(self) -> None:
        """Print the held warnings (after a success)."""
        for record in self.records:
            print(" ".join(self.format(record).split()), file=sys.stderr)
        self.records.clear()


def _setup_logging(verbose: int) -> _HeldWarnings | None:
    logging.captureWarnings(True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _HeldWarnings):  # left by an earlier main() in this process
            root.removeHandler(handler)
    if verbose:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
        root.setLevel((logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)])
        return None
    held = _HeldWarnings()
    root.addHandler(held)
    root.setLevel(logging.WARNING)
    return held


def _one_line(exc: BaseException) -> str:
    """An exception's message as one printable line."""
    text = " ".join(str(exc).split())
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:2000]


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
