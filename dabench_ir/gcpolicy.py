"""How Python's cyclic garbage collector runs in a process that does runs: a command line's, and
every sweep worker's (local or Ray), so a point costs the same however it is asked for."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["YOUNG", "tune", "tuned"]

YOUNG = 100_000
"""Allocations between young-generation collections (Python's default: 700). A run allocates mostly
acyclic records (nodes, values, rows) that reference counting frees; the default made the cyclic
collector traverse them, and the imported modules, 125 times in a profile of a 2,000-node model
(25-35 ms of a 0.45 s run), and ~10 % of a sweep point's time; a torch export's first call in a
fresh worker ran 0.3-0.9 s longer. A long sweep still collects, every 100,000."""


def tune() -> None:
    """Set the young generation's threshold to `YOUNG` (the older generations keep theirs)."""
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])


@contextlib.contextmanager
def tuned() -> Iterator[None]:
    """`tune` for the span of a with block, then the caller's thresholds back: for runs in a
    caller's own process (a sweep at ``--jobs 1`` through the API)."""
    before = gc.get_threshold()
    tune()
    try:
        yield
    finally:
        gc.set_threshold(*before)
