"""Timing fresh processes, for the bench scripts that time `dabench-ir` as a user runs it."""

from __future__ import annotations

import compileall
import resource
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["best", "compile_package", "timed"]

ROOT = Path(__file__).resolve().parent.parent


def compile_package() -> None:
    """Compile the package's bytecode, as an installed package has it (with PYTHONDONTWRITEBYTECODE
    set, every timed process would otherwise compile dabench-ir's sources again)."""
    for folder in ("dabench_ir", "passes", "lowering", "targets", "models"):
        compileall.compile_dir(str(ROOT / folder), quiet=1)


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one process: on a busy machine the CPU time
    stays close to what the wall time is on a quiet one, and the wall time does not."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def best(runs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The least wall and the least CPU time of ``runs`` (each as `timed` gives it)."""
    wall, cpu = (min(column) for column in zip(*runs, strict=True))
    return wall, cpu
