"""Error types. A `UserError` is the user's to fix: the CLI prints its one line, exit 2."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["InputError", "TargetError", "UnboundSymbolError", "UserError"]


class UserError(Exception):
    """Bad input or usage. The message is one line saying what is wrong and how to fix it."""


class InputError(UserError):
    """A model file that cannot be read as a model."""


class TargetError(UserError):
    """An unknown target name, or a target file with a missing or bad field."""


class UnboundSymbolError(UserError):
    """A cost needs the value of symbolic dims that nobody bound."""

    def __init__(self, symbols: Iterable[str]) -> None:
        self.symbols = frozenset(symbols)
        super().__init__(self._message())

    def _message(self) -> str:
        names = sorted(self.symbols)
        flags = " ".join(f"--dim {s}=N" for s in names if not s.startswith("<"))
        hint = f"; bind them with {flags}" if flags else ""
        return f"unbound symbolic dims: {', '.join(names)}{hint}"
