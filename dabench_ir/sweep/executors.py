"""Executors: run sweep tasks in this process, in local worker processes, or on Ray.

Each executor takes tasks ``(function, args)`` and yields ``(task_id, result)`` as tasks
finish, in completion order. The functions are the same for every executor
(`worker.run_group`, `worker.run_export`), so results do not depend on where they ran.
"""

from __future__ import annotations

import abc
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from dabench_ir.errors import UserError

__all__ = ["Executor", "LocalExecutor", "RayExecutor", "SerialExecutor", "WorkerLost", "make_executor"]

logger = logging.getLogger(__name__)

Task = tuple[Callable[..., Any], tuple[Any, ...]]


class WorkerLost(Exception):
    """A worker died (killed, out of memory) before finishing a task; the task is not done."""


class Executor(abc.ABC):
    """Base: `map_unordered(tasks)` yields ``(index, result or WorkerLost)``; `close()` frees workers."""

    name = "base"

    @abc.abstractmethod
    def map_unordered(self, tasks: list[Task]) -> Iterator[tuple[int, Any]]:
        """Run ``tasks``; yield each one's index and result as it finishes."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release workers (also called on Ctrl-C)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialExecutor(Executor):
    """Tasks one after another in this process (``--jobs 1``): easiest to debug."""

    name = "serial"

    def map_unordered(self, tasks: list[Task]) -> Iterator[tuple[int, Any]]:
        for i, (fn, args) in enumerate(tasks):
            yield i, fn(*args)


class LocalExecutor(Executor):
    """Tasks in ``jobs`` local worker processes (a process pool)."""

    name = "local"

    def __init__(self, jobs: int) -> None:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self.jobs = jobs
        self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)

    def map_unordered(self, tasks: list[Task]) -> Iterator[tuple[int, Any]]:
        futures: dict[Future, int] = {self.pool.submit(fn, *args): i for i, (fn, args) in enumerate(tasks)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    yield futures[fut], fut.result()
                except BrokenProcessPool as exc:
                    yield futures[fut], WorkerLost(f"a worker process died: {exc}")

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor(Executor):
    """Tasks as Ray tasks on a cluster (``address``) or on a local Ray started for the run."""

    name = "ray"

    def __init__(self, jobs: int, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install 'dabench-ir[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
            self.started = True
        self._remote: dict[Callable[..., Any], Any] = {}

    def _as_remote(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._remote:
            self._remote[fn] = self.ray.remote(max_retries=1)(fn)
        return self._remote[fn]

    def map_unordered(self, tasks: list[Task]) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        refs = {self._as_remote(fn).remote(*args): i for i, (fn, args) in enumerate(tasks)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield refs[ref], ray.get(ref)
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
                    yield refs[ref], WorkerLost(f"a Ray worker died: {exc}")

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()


def make_executor(kind: str, jobs: int | None = None, address: str | None = None) -> Executor:
    """``kind``: local (``jobs`` processes; 1 runs in this process) or ray."""
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: expected a positive number")
    if kind == "ray":
        return RayExecutor(jobs, address)
    if address:
        raise UserError("--address is for --executor ray")
    if kind != "local":
        raise UserError(f"--executor {kind}: expected local or ray")
    return SerialExecutor() if jobs == 1 else LocalExecutor(jobs)
