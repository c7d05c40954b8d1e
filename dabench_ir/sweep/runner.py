"""Run a sweep: key the points, skip those done, export bases, profile groups, write results.

Layout of the output folder::

    DIR/points/<key>.json   one record per point (params, status, error, report)
    DIR/models/<base>.onnx  cached 1-layer base exports (or --cache-dir)
    DIR/results.csv         one row per point, rebuilt from points/ at the end (and on resume)
    DIR/results.parquet     the same, when pyarrow is installed
    DIR/*.png               plots of the axes the sweep varies

A point's key hashes its parameters, the contents of its target file and the tool version,
so a rerun skips exactly the points whose answer cannot have changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dabench_ir import options
from dabench_ir.errors import UserError
from dabench_ir.sweep import graphs, results, worker
from dabench_ir.sweep.executors import Executor, WorkerLost, make_executor
from dabench_ir.sweep.spec import Point, SweepSpec

__all__ = ["SweepResult", "configurations", "point_key", "run_sweep"]

logger = logging.getLogger(__name__)

Bar = Callable[..., None]
EXPORT_PHASE = "exporting models"
"""The ``phase`` a sweep's bar shows while base models are exported with torch, before any point."""
READ_PHASE = "reading finished points"
"""The ``phase`` a resumed sweep's bar shows while it reads the records of the points done before."""


@dataclass
class SweepResult:
    """What a run did: points in the spec, done before, run now, failed, lost, and the files."""

    total: int
    skipped: int = 0
    ran: int = 0
    failed: int = 0
    lost: int = 0
    elsewhere: int = 0
    missing: list[str] = field(default_factory=list)  # labels of the points left without a record
    exports: int = 0
    seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


_TARGET_HASHES: dict[str, str] = {}


def _target_digest(name: str) -> str:
    """Hash of the target file's contents (parsed), so editing a target reruns its points."""
    if name not in _TARGET_HASHES:
        from dabench_ir.targets import load_target

        try:
            raw = load_target(name).raw
            _TARGET_HASHES[name] = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()
        except UserError:
            _TARGET_HASHES[name] = "unknown"  # the point will fail with the target's own error
    return _TARGET_HASHES[name]


def point_key(params: dict[str, Any]) -> str:
    """Hash of what decides the point's result (`_deciding`), its target file's contents, the tool's
    version and the exporter's its model comes from; a point that times its nodes (`worker.times_nodes`:
    ``cpu``) says so, so a record from before it did (the class model's figures) is not taken as done."""
    from dabench_ir import __version__

    text = json.dumps(
        {
            "params": _deciding(params),
            **({"node_table": True} if worker.times_nodes(params) else {}),  # cpu: the run `profile` makes
            "target": _target_digest(str(params.get("target"))),
            "version": __version__,
            "exporter": graphs.exporter_versions(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _deciding(params: dict[str, Any]) -> dict[str, Any]:
    """A point's parameters as they decide its result: its target by its file's name (``rdu`` and
    ``sn30`` are one chip) and no target knob at its default (``wse_mode = "auto"`` given or left out
    is one run), so one configuration has one key however a spec spells it."""
    from dabench_ir.targets import load_target

    deciding = {
        name: value
        for name, value in params.items()
        if not (
            name in options.KNOBS and options.KNOBS[name].group == "target" and value == options.KNOBS[name].default
        )
    }
    with contextlib.suppress(UserError):  # an unknown target: the point fails with the target's own error
        deciding["target"] = load_target(str(params["target"])).name
    return deciding


class _Locks:
    """Per-point lock files ``points/<key>.lock``, each held with an OS lock (``fcntl.flock``)
    by this sweep process for as long as the point runs, so two sweeps into one folder never
    compute the same point. Only a live holder of the OS lock keeps a point: a lock file left
    by a dead sweep, naming an unrelated process or holding garbage is simply taken over (the
    kernel drops a dead process's lock); the file's text (host and pid) is for people only."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.held: dict[str, int] = {}  # key -> the open, locked file descriptor
        self.host = socket.gethostname()

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.lock"

    def acquire(self, key: str, *, wait: bool = False) -> bool:
        """Lock ``key``'s point: True when this sweep now holds it; False when a live sweep
        does (``wait``: block until it lets go instead)."""
        import fcntl

        path = self._path(key)
        for _ in range(3):
            try:
                fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            except OSError as exc:
                raise UserError(f"{path}: cannot create a lock file ({exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False  # a live sweep holds it
            except OSError as exc:
                os.close(fd)
                raise UserError(f"{path}: cannot lock it ({exc.strerror or exc})") from None
            try:  # the file locked must still be the one at the path (a releaser unlinks it)
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except OSError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{self.host} {os.getpid()}\n".encode())
            self.held[key] = fd
            results.remove_temps(self.folder, key)  # a dead writer's: only the lock's holder writes the record
            return True
        return False

    def clear_stale(self, key: str) -> None:
        """Remove ``key``'s lock file when a dead sweep left it beside its finished point (a kill -9
        between writing the record and letting go); one a live sweep holds stays."""
        if self._path(key).exists() and self.acquire(key):
            self.release(key)

    def release(self, key: str) -> None:
        fd = self.held.pop(key, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                self._path(key).unlink()  # while still locked: a waiter re-checks the inode
            os.close(fd)

    def release_all(self) -> None:
        for key in list(self.held):
            self.release(key)


def _allow_open_files(count: int) -> None:
    """Raise this process's soft limit of open files (up to the hard one) to hold ``count`` lock files
    and some: a sweep holds one per point it has to run (a 10^5-point grid: 10^5), and the usual soft
    limit is 1024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):  # a system that refuses: the lock says so, one line
            limit = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def _collect(spec_keys: list[str], points_dir: Path, known: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows: ``known`` (the rows of the points this run wrote, or read when it found them
    done) and, for the others (another sweep's), their files."""
    rows = []
    for key in spec_keys:
        if key in known:
            rows.append(known[key])
            continue
        record = results.read_point(points_dir, key)
        if record is not None:
            rows.append(results.record_row(record))
    return rows


def _no_bar(*_args: Any, **_kwargs: Any) -> None:
    """The bar of a sweep run without one."""


def _error_record(key: str, params: dict[str, Any], error: str) -> dict[str, Any]:
    """The record of a point the driver fails before any worker runs it (a model the config
    refuses, a base that did not export)."""
    return {"key": key, "params": params, "status": "error", "error": error, "report": None, "seconds": 0.0}


def _check_outputs(out: Path, points_dir: Path, models_dir: Path, keys: list[str]) -> None:
    """Refuse, before any work, a file where a folder goes, a folder where the table or a point's
    record goes (one line each)."""
    from dabench_ir.fileio import check_output_dir, plan_outputs

    for folder, flag in ((out, "-o"), (points_dir, "-o"), (models_dir, "--cache-dir")):
        check_output_dir(folder, flag, create=True)
    plan_outputs([], [(out / name, "-o") for name in results.TABLE_FILES])
    for key in keys:
        if (path := results.point_file(points_dir, key)).is_dir():
            raise UserError(f"{path}: a folder where a point's record goes; remove it")


@dataclass
class _Book:
    """What a sweep has done so far: the table's rows, each kept as its point is found done or finishes
    (not read back at the end), the count done, and the bar (``tick``) that shows it."""

    points_dir: Path
    locks: _Locks
    result: SweepResult
    retry_failed: bool
    node_detail: bool
    tick: Bar
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: int = 0
    found: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    """Each point this sweep runs: its record file as it was when claimed (`results.file_stamp`), so
    a record its worker wrote before dying is told from one an earlier run left (`recorded`)."""

    def is_done(self, key: str) -> bool:
        """Whether ``key``'s point has its record (a failed one counts unless ``retry_failed``; one
        kept without its node rows does not when this sweep wants them)."""
        record = results.read_point(self.points_dir, key)
        if record is None or (self.node_detail and not record.get("node_detail", True)):
            return False
        done = record.get("status") == "ok" or not self.retry_failed
        if done:  # its row now, from the record read once (the table's, `_collect`)
            self.rows[key] = results.record_row(record)
        return done

    def claim(self, keyed: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], list[Any]]:
        """Lock every point not done yet: (the points this sweep runs, those another live sweep
        into the folder is computing now). Interrupted while locking, it leaves no lock behind."""
        todo, elsewhere = [], []
        try:
            for checked, (key, params) in enumerate(keyed, start=1):
                if self.is_done(key):
                    self.result.skipped += 1
                    if self.result.skipped % 16 == 1:  # a resume reads each finished point's record: seconds
                        self.tick(checked, len(keyed), failed=0, phase=READ_PHASE)
                    self.locks.clear_stale(key)
                elif not self.locks.acquire(key):
                    elsewhere.append((key, params))
                elif self.is_done(key):  # finished by another sweep between the check and the lock
                    self.locks.release(key)
                    self.result.skipped += 1
                else:
                    todo.append((key, params))
                    self.found[key] = results.file_stamp(self.points_dir, key)
        except BaseException:  # Ctrl-C, SIGTERM
            self.locks.release_all()
            raise
        self.done = self.result.skipped
        return todo, elsewhere

    def finish(self, record: dict[str, Any]) -> None:
        """A point's record: written (by its worker, or here), its lock let go, the bar moved."""
        key, result = record["key"], self.result
        if "row" in record:  # a worker's (`worker.run_group`): its file written there, or its text sent
            if "text" in record:
                results.atomic_write(results.point_file(self.points_dir, key), record["text"])
            self.rows[key] = record["row"]
        else:  # one the driver records (`_error_record`)
            if not self.node_detail:
                results.strip_nodes(record)
            self.rows[key] = results.write_point(self.points_dir, record)
        self.locks.release(key)
        self.done += 1
        result.ran += 1
        if record["status"] != "ok":
            result.failed += 1
            logger.info("point %s failed: %s", key, record["error"])
        self.tick(self.done, result.total, failed=result.failed)

    def recorded(self, key: str) -> bool:
        """Whether a worker lost with ``key``'s point had written its record (a new file since the
        point was claimed, and a valid one): then it is finished (`finish`) and counts as run."""
        if results.file_stamp(self.points_dir, key) in (None, self.found.get(key)):
            return False
        record = results.read_point(self.points_dir, key)
        if record is None:
            return False
        self.finish(
            {"key": key, "status": record["status"], "error": record.get("error"), "row": results.record_row(record)}
        )
        return True

    def export_tick(self, exported: int, of: int) -> None:
        self.tick(exported, of, failed=0, phase=EXPORT_PHASE)
        if exported == of:  # the points' phase (and its ETA) starts now
            self.tick(self.done, self.result.total, failed=self.result.failed, phase="")

    def wait_for(self, elsewhere: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        """Wait for the points another sweep was computing: done with its record, or ours to run
        (returned) when it died without one."""
        todo = []
        for key, params in elsewhere:
            self.locks.acquire(key, wait=True)
            if self.is_done(key):
                self.locks.release(key)
                self.done += 1
                self.tick(self.done, self.result.total, failed=self.result.failed)
            else:
                todo.append((key, params))
                self.found[key] = results.file_stamp(self.points_dir, key)
        return todo


def run_sweep(
    spec: SweepSpec,
    out_dir: str | Path,
    *,
    jobs: int | None = None,
    executor: str | Executor = "local",
    address: str | None = None,
    cache_dir: str | Path | None = None,
    retry_failed: bool = False,
    plots: bool = True,
    node_detail: bool = True,
    bar: Bar | None = None,
) -> SweepResult:
    """Run every point of ``spec`` not already done in ``out_dir``; return what happened.

    ``bar(done, total, failed=..., phase=...)`` is called as base models are exported (phase
    `EXPORT_PHASE`) and as points finish (phase ``""``) (e.g. `Progress.bar`).
    Ctrl-C stops the workers, keeps every finished point and rewrites the table. With
    ``node_detail=False`` each point's JSON keeps the report without its per-node rows
    (about 100x smaller for large models; the dominant bound is kept in ``metrics``).
    """
    start = time.perf_counter()
    out = Path(out_dir)
    points_dir = out / "points"
    models_dir = Path(cache_dir) if cache_dir else graphs.default_cache()
    point_keys = [point_key(p.params) for p in spec.points]
    runs = configurations(spec, point_keys)
    keyed = [(key, point.params) for key, point in runs.items()]
    keys = list(runs)
    _check_outputs(out, points_dir, models_dir, keys)
    result = SweepResult(total=len(keyed))
    _allow_open_files(len(keyed))
    book = _Book(
        points_dir=points_dir,
        locks=_Locks(points_dir),
        result=result,
        retry_failed=retry_failed,
        node_detail=node_detail,
        tick=bar or _no_bar,
    )
    todo, elsewhere = book.claim(keyed)
    result.elsewhere = len(elsewhere)
    if elsewhere:
        logger.warning(
            "%d point(s) are being computed by another sweep into %s; waiting for them after ours", len(elsewhere), out
        )
    logger.info("%s: %d points, %d done before, %d to run", spec.name, len(keyed), result.skipped, len(todo))
    book.tick(book.done, result.total, failed=0)

    ex: Executor | None = executor if isinstance(executor, Executor) else None
    owned = not isinstance(executor, Executor)
    finished = False
    try:
        while todo or elsewhere:
            if todo:
                ex = ex or make_executor(str(executor), jobs, address)
                shared = points_dir if ex.shares_files else None
                result.exports += _run(ex, todo, models_dir, book, points_dir=shared, node_detail=node_detail)
            todo, elsewhere = book.wait_for(elsewhere), []
        finished = True
    finally:
        if ex is not None and owned and not finished:  # Ctrl-C or an error: no worker writes after the table
            ex.close()
        book.locks.release_all()
        result.rows = _collect(keys, points_dir, book.rows)
        result.files = results.write_table(out, result.rows)
        result.seconds = time.perf_counter() - start
    recorded = {row["key"] for row in result.rows}
    result.missing = [p.label() for key, p in zip(point_keys, spec.points, strict=True) if key not in recorded]
    try:
        if plots:
            from dabench_ir.sweep.plots import write_plots

            local = ex if ex is not None and ex.shares_files else None  # a cluster's nodes may lack matplotlib
            result.files += write_plots(out, result.rows, spec.varied(), executor=local)  # drawn by the idle workers
        result.seconds = time.perf_counter() - start  # the whole run, its plots included
    finally:
        if ex is not None and owned:
            ex.close()
    return result


def configurations(spec: SweepSpec, keys: list[str] | None = None) -> dict[str, Point]:
    """The runs a sweep of ``spec`` makes: key (`point_key`) -> the first point that asks for it. One
    configuration is one run however the spec spells it (``wse`` and ``wse2``; ``wse_mode = "auto"``
    given or left out). ``keys``: the points' keys, when the caller has them."""
    runs: dict[str, Point] = {}
    for key, point in zip(keys or [point_key(p.params) for p in spec.points], spec.points, strict=True):
        runs.setdefault(key, point)
    return runs


def _run(
    ex: Executor,
    todo: list[tuple[str, dict[str, Any]]],
    models_dir: Path,
    book: _Book,
    *,
    points_dir: Path | None = None,
    node_detail: bool = True,
) -> int:
    """Export missing bases, then profile the points grouped by model; returns exports made.
    ``book.export_tick`` follows the exports, ``book.finish`` each point. With ``points_dir`` the
    workers write the points' records there themselves (`worker.run_group`)."""
    by_base: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, int], list[tuple[str, dict[str, Any]]]] = {}
    for key, params in todo:
        try:
            bkey = graphs.base_key(params)
        except UserError as exc:  # a model the config refuses: record it, go on
            book.finish(_error_record(key, params, f"UserError: {exc}"))
            continue
        by_base.setdefault(bkey, params)
        groups.setdefault((bkey, int(params["layers"])), []).append((key, params))

    bases, base_errors, exported = graphs.export_missing(models_dir, by_base, ex, book.export_tick)

    ordered = sorted(groups.items(), key=lambda kv: -kv[0][1] * len(kv[1]))  # longest first
    tasks = []
    task_points = []
    timing: list[int] = []  # the tasks whose points time their model's nodes on this host
    for (bkey, layers), pts in ordered:
        if bkey in base_errors:
            for key, params in pts:
                book.finish(_error_record(key, params, f"export failed: {base_errors[bkey]}"))
            continue
        if bkey not in bases:  # its export's worker was lost: no record, the points stay to do
            book.result.lost += len(pts)
            continue
        folder = None if points_dir is None else str(points_dir)
        model_file = None
        if any(worker.times_nodes(params) for _, params in pts):
            timing.append(len(tasks))
            model_file = str(models_dir / f"{graphs.model_key(pts[0][1])}.onnx")
        tasks.append((worker.run_group, (bases[bkey], layers, pts, folder, node_detail, model_file)))
        task_points.append(pts)
    # a task that times nodes on this host runs alone, as `profile` does: tasks beside it would slow
    # the timings it writes to the host's node table, which every later run on this host reads
    batches = [[i] for i in timing] + [[i for i in range(len(tasks)) if i not in set(timing)]]
    for batch in batches:
        for j, records in ex.map_unordered([tasks[i] for i in batch]):
            i = batch[j]
            if isinstance(records, WorkerLost):
                left = [key for key, _ in task_points[i] if not book.recorded(key)]
                book.result.lost += len(left)
                logger.info("%s; %d of its %d point(s) stay to do", records, len(left), len(task_points[i]))
                continue
            for record in records:
                book.finish(record)
    return exported
