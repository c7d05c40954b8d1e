"""Executors: run sweep tasks in this process, in local worker processes, or on Ray.

Each executor takes tasks ``(function, args)`` and yields ``(task_id, result)`` as tasks
finish, in completion order. The functions are the same for every executor
(`worker.run_group`, `worker.run_export`), so results do not depend on where they ran.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from typing import Any

from dabench_ir import gcpolicy
from dabench_ir.errors import UserError

__all__ = [
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "SerialExecutor",
    "WorkerLost",
    "die_with_parent",
    "make_executor",
]

logger = logging.getLogger(__name__)

Task = tuple[Callable[..., Any], tuple[Any, ...]]


class WorkerLost(Exception):
    """A worker died (killed, out of memory) before finishing a task; the task is not done."""


class Executor(abc.ABC):
    """Base: `map_unordered(tasks)` yields ``(index, result or WorkerLost)``; `close()` frees workers."""

    name = "base"
    shares_files = False
    """True when tasks run on this machine and may write the driver's output folder themselves."""

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
    shares_files = True

    def map_unordered(self, tasks: list[Task]) -> Iterator[tuple[int, Any]]:
        with gcpolicy.tuned():  # as a worker process runs its tasks; the caller's settings back after
            for i, (fn, args) in enumerate(tasks):
                yield i, fn(*args)


class LocalExecutor(Executor):
    """Tasks in ``jobs`` local worker processes, each fed one task at a time through a pipe.

    Not a `concurrent.futures` pool: there a worker that dies (killed, out of memory) breaks
    the whole pool and every pending task with it. Here only the task that worker was running
    is lost (`WorkerLost`); a fresh worker takes the next task. Workers exit when this
    process dies (`die_with_parent`), so a ``kill -9`` of the driver leaves no orphans.
    """

    name = "local"
    shares_files = True

    def __init__(self, jobs: int, *, start: str = "fork") -> None:
        """``start``: how workers start; ``spawn`` (a fresh interpreter) for work that runs torch, whose
        thread pools do not survive a fork of a driver that used them (the exports)."""
        methods = multiprocessing.get_all_start_methods()
        self.ctx = multiprocessing.get_context(start if start in methods else "spawn")
        self.jobs = jobs
        self.idle: list[_Worker] = []
        self.all: list[_Worker] = []

    def _worker(self) -> _Worker:
        if self.idle:
            return self.idle.pop()
        parent_conn, child_conn = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker_main, args=(child_conn, os.getpid()), daemon=True)
        proc.start()
        child_conn.close()
        worker = _Worker(proc, parent_conn)
        self.all.append(worker)
        return worker

    def map_unordered(self, tasks: list[Task]) -> Iterator[tuple[int, Any]]:
        queue = deque(enumerate(tasks))
        busy: dict[Any, tuple[_Worker, int]] = {}
        while queue or busy:
            while queue and len(busy) < self.jobs:
                index, (fn, args) = queue.popleft()
                worker = self._worker()
                try:
                    worker.conn.send((index, fn, args))
                except (OSError, EOFError):  # it died between tasks: a fresh one takes the task
                    self._drop(worker)
                    queue.appendleft((index, (fn, args)))
                    continue
                busy[worker.conn] = (worker, index)
            ready = set(mp_wait([*busy, *(w.proc.sentinel for w, _ in busy.values())]))
            for conn, (worker, index) in list(busy.items()):
                answered = conn in ready or worker.proc.sentinel in ready
                if not answered:
                    continue
                del busy[conn]
                try:
                    if not conn.poll():
                        raise EOFError
                    got, ok, result = conn.recv()
                except (EOFError, OSError):  # the worker died: only its own task is lost
                    worker.proc.join(timeout=5)
                    self._drop(worker)
                    code = worker.proc.exitcode
                    yield index, WorkerLost(f"worker process {worker.proc.pid} died (exit code {code})")
                    continue
                self.idle.append(worker)
                if not ok:
                    raise result
                yield got, result

    def _drop(self, worker: _Worker) -> None:
        with contextlib.suppress(OSError):
            worker.conn.close()
        if worker in self.idle:
            self.idle.remove(worker)
        if worker in self.all:
            self.all.remove(worker)

    def close(self) -> None:
        for worker in self.all:
            with contextlib.suppress(OSError, EOFError, BrokenPipeError):
                worker.conn.send(None)
        for worker in self.all:
            worker.proc.join(timeout=2)
            if worker.proc.is_alive():
                worker.proc.kill()
                worker.proc.join(timeout=2)
            with contextlib.suppress(OSError):
                worker.conn.close()
        self.all.clear()
        self.idle.clear()


@dataclass
class _Worker:
    proc: Any
    conn: Any


def die_with_parent(parent_pid: int) -> None:
    """Make this (worker) process exit when ``parent_pid`` dies: ``PR_SET_PDEATHSIG`` on Linux,
    else a thread that polls the parent id once a second."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl
            _watch_parent(parent_pid)
    else:  # pragma: no cover - other systems
        _watch_parent(parent_pid)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def _watch_parent(parent_pid: int) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="dabench-parent-watch").start()


def _exit_now() -> None:
    """End a worker that has sent every reply: flush its output and logs, then ``os._exit``. A normal
    interpreter exit tears down every module first, seconds of CPU in a worker that ran torch (the
    exports), spent while the points want the core.

    The exit's first step is kept: multiprocessing's own finalizers, which unlink the named
    semaphores a spawned worker made (tqdm's lock, in the exports' progress bars). Skipped, the
    resource tracker unlinks them when the driver exits and warns of "leaked semaphore objects"."""
    multiprocessing.util._run_finalizers(0)  # what `multiprocessing.util._exit_function` runs first
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _worker_main(conn: Any, parent_pid: int) -> None:
    """A worker: run ``(index, fn, args)`` tasks from the pipe until it closes or sends None."""
    die_with_parent(parent_pid)
    gcpolicy.tune()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the driver's `cli.Terminated`: a worker just ends
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            _exit_now()
        index, fn, args = message
        try:
            reply = (index, True, fn(*args))
        except Exception as exc:  # the driver re-raises it
            reply = (index, False, exc)
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable result or exception
            conn.send((index, False, RuntimeError(f"{type(exc).__name__}: {exc}")))


def _ray_task(fn: Callable[..., Any], *args: Any) -> Any:
    """One task in a Ray worker, with the collector as a local worker runs it (`gcpolicy`)."""
    gcpolicy.tune()
    return fn(*args)


class RayExecutor(Executor):
    """Tasks as Ray tasks on a cluster (``address``) or on a local Ray started for the run.

    Built for grids far larger than one machine's: a large argument many tasks share (a sweep's
    base model, the same bytes for every depth of it) goes into Ray's object store once, not once
    per task, and at most ``window`` tasks are in flight (default: 4 per cluster CPU), so the
    driver and the object store hold a bounded part of a 10^5-point grid at any time.
    """

    name = "ray"

    SHARED_BYTES = 1 << 16
    """Arguments of at least this many bytes are put in the object store once and passed by reference."""

    def __init__(self, jobs: int, address: str | None = None, *, window: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install 'dabench-ir[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            if address:
                check_ray_address(address)  # one line within seconds, not Ray's minutes of retries
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
            self.started = True
        self._remote: Any = None
        self.window = window

    def _window(self) -> int:
        if self.window is None:
            cpus = int(self.ray.cluster_resources().get("CPU", 1) or 1)
            self.window = max(4 * cpus, 1)
        return self.window

    def _args(self, args: tuple[Any, ...], shared: dict[int, tuple[Any, Any]]) -> tuple[Any, ...]:
        """``args`` with each large bytes argument replaced by its object-store reference (one per
        distinct object; Ray hands the task the value)."""
        out = []
        for arg in args:
            if isinstance(arg, bytes) and len(arg) >= self.SHARED_BYTES:
                if id(arg) not in shared:
                    shared[id(arg)] = (arg, self.ray.put(arg))  # the object kept: its id stays its own
                arg = shared[id(arg)][1]
            out.append(arg)
        return tuple(out)

    def _as_remote(self) -> Any:
        if self._remote is None:
            self._remote = self.ray.remote(max_retries=1)(_ray_task)
        return self._remote

    def map_unordered(self, tasks: list[Task]) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        shared: dict[int, tuple[Any, Any]] = {}
        queue = deque(enumerate(tasks))
        refs: dict[Any, int] = {}
        window = self._window()
        while queue or refs:
            while queue and len(refs) < window:
                i, (fn, args) = queue.popleft()
                refs[self._as_remote().remote(fn, *self._args(args, shared))] = i
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                i = refs.pop(ref)
                try:
                    yield i, ray.get(ref)
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
                    yield i, WorkerLost(f"a Ray worker died: {exc}")

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()


RAY_CONNECT_S = 3.0
"""How long `check_ray_address` waits for a Ray head to accept a connection."""


def check_ray_address(address: str) -> None:
    """A UserError, in one line, for an ``--address`` that is no Ray head's: not ``HOST:PORT``
    (``ray://HOST:PORT`` for Ray Client; ``auto`` is Ray's own lookup), or nothing accepting a TCP
    connection there within `RAY_CONNECT_S` (Ray itself retries for minutes)."""
    import socket

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise UserError(
            f"--address {address}: expected HOST:PORT of a Ray cluster's head (or ray://HOST:PORT, or auto)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_S).close()
    except OSError as exc:
        raise UserError(
            f"--address {address}: no Ray head answers there ({exc.strerror or exc}); start one with "
            "`ray start --head`, or check the address"
        ) from None


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
