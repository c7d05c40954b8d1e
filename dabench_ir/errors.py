"""Error types. A `UserError` is the user's to fix: the CLI prints its one line, exit 2."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["InputError", "TargetError", "UnboundSymbolError", "UserError", "did_you_mean"]


class UserError(Exception):
    """Bad input or usage. The message is one line saying what is wrong and how to fix it."""


class InputError(UserError):
    """A model file that cannot be read as a model."""


class TargetError(UserError):
    """An unknown target name, or a target file with a missing or bad field."""


class UnboundSymbolError(UserError):
    """A cost needs the value of symbolic dims that nobody bound."""

    def __init__(self, symbols: Iterable[str], *, batch: str | None = None) -> None:
        self.symbols = frozenset(symbols)
        self.batch = batch  # the graph's batch symbol, which --batch binds
        super().__init__(self._message())

    def _flag(self, symbol: str) -> str:
        """The flag that binds ``symbol``: --batch for the batch, --seq for a sequence length
        (`dabench_ir.frontends.onnx.SEQ_SYMBOLS`), else --dim."""
        from dabench_ir.frontends.onnx import SEQ_SYMBOLS

        if symbol == self.batch:
            return "--batch N"
        return "--seq N" if symbol.lower() in SEQ_SYMBOLS else f"--dim {symbol}=N"

    def _message(self) -> str:
        names = sorted(self.symbols)
        flags = " ".join(dict.fromkeys(self._flag(s) for s in names if not s.startswith("<")))
        hint = f"; bind them with {flags}" if flags else ""
        return f"unbound symbolic dims: {', '.join(names)}{hint}"


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name closest to a mistyped ``key``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
