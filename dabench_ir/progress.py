"""Progress on stderr: a status line for steps, a bar for counted work.

Shown only on a terminal (and never with --quiet), so pipes, logs and tests stay clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "silent"]


class Progress:
    """``progress("exporting")`` rewrites one status line; ``progress.bar(done, total)`` draws a bar."""

    def __init__(self, *, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.start = time.monotonic()
        self._width = 0
        self._phase: str | None = None
        self._phase_start = self.start
        self._phase_from = 0  # ``done`` when the phase began: work done before it is not timed

    def __call__(self, message: str) -> None:
        self._write(f"[{time.monotonic() - self.start:5.1f}s] {message}")

    def bar(self, done: int, total: int, *, failed: int = 0, label: str = "", phase: str = "") -> None:
        """``done`` of ``total`` in ``phase`` (e.g. "exporting models", then the points). The ETA
        is this phase's pace over the items it has done itself (``-`` until one is done), so a
        slow phase before it, or items done by an earlier run, do not skew it."""
        now = time.monotonic()
        if phase != self._phase:
            self._phase, self._phase_start, self._phase_from = phase, now, done
        ran = done - self._phase_from
        eta = f"{(now - self._phase_start) / ran * (total - done):.0f}s" if ran > 0 else "-"
        frac = done / total if total else 1.0
        filled = int(30 * frac)
        fail = f", {failed} failed" if failed else ""
        self._write(
            f"{label}{phase + ' ' if phase else ''}[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} "
            f"({now - self.start:.0f}s elapsed, ETA {eta}{fail})"
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


def silent(_: str) -> None:
    """The progress callback that shows nothing: what a run given no ``progress`` reports to."""
