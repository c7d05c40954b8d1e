"""Progress on stderr: a status line for steps, a bar for counted work.

Shown only on a terminal (and never with --quiet), so pipes, logs and tests stay clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``progress("exporting")`` rewrites one status line; ``progress.bar(done, total)`` draws a bar."""

    def __init__(self, *, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.start = time.monotonic()
        self._width = 0

    def __call__(self, message: str) -> None:
        self._write(f"[{time.monotonic() - self.start:5.1f}s] {message}")

    def bar(self, done: int, total: int, *, failed: int = 0, label: str = "") -> None:
        elapsed = time.monotonic() - self.start
        frac = done / total if total else 1.0
        eta = elapsed / done * (total - done) if done else 0.0
        filled = int(30 * frac)
        fail = f", {failed} failed" if failed else ""
        self._write(
            f"{label}[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} "
            f"({elapsed:.0f}s elapsed, ETA {eta:.0f}s{fail})"
        )

    def _write(self, text: str) -> None:
        if not self.enabled:
            return
        pad = max(self._width - len(text), 0)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def done(self) -> None:
        """End the status line (leaves the terminal on a fresh line)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
