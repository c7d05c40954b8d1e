"""docs/sweeps.md's claims for a grid larger than one machine, on a local Ray (2 CPUs) and tiny
points: an interrupted Ray sweep resumes with each point run once; a Ray task retried after its
worker died yields its result once; partitions of a grid run by separate drivers into one folder
make the whole grid's table; a sweep holds a lock file per point to run past the usual open-file
limit; a cluster's workers send each point's encoded record, and the driver writes the files a
local worker would."""

from __future__ import annotations

import csv
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxscript")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dabench-ir[ray]')")

from dabench_ir.sweep import graphs, parse_spec, run_sweep, worker  # noqa: E402
from dabench_ir.sweep.executors import RayExecutor, SerialExecutor  # noqa: E402

TINY = {"family": "gpt2", "hidden": 64, "heads": 4, "seq": 8, "positional": "none"}


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module (starting it is most of the time)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The tiny base, exported here once: the Ray workers then run points only, not torch."""
    folder = tmp_path_factory.mktemp("shard-models")
    params = {**TINY, "layers": 1}
    graphs.save_base(folder, graphs.base_key(params), graphs.export_base(params))
    return folder


def _keys(folder: Path) -> list[str]:
    with open(folder / "results.csv", newline="") as fh:
        return [row["key"] for row in csv.DictReader(fh)]


class _Interrupted(RayExecutor):
    """A Ray executor whose driver is stopped (Ctrl-C) as soon as its first group of points has returned."""

    def map_unordered(self, tasks):
        for item in super().map_unordered(tasks):
            yield item
            if tasks[item[0]][0] is worker.run_group:
                raise KeyboardInterrupt


@pytest.mark.slow
def test_an_interrupted_ray_sweep_resumes_each_point_once(tmp_path, cluster, cache):
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2, 3], "target": ["rdu"]}})
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out, executor=_Interrupted(2), cache_dir=cache, plots=False)
    done = sorted(p.stem for p in (out / "points").glob("*.json"))
    assert len(done) == 1  # one task, one point
    assert not list((out / "points").glob("*.lock"))  # the interrupted driver let go of the rest
    assert sorted(_keys(out)) == done  # the table was rewritten from what finished
    stamps = {key: (out / "points" / f"{key}.json").stat().st_mtime_ns for key in done}
    resumed = run_sweep(spec, out, executor=RayExecutor(2), cache_dir=cache, plots=False)
    assert (resumed.skipped, resumed.ran, resumed.failed, resumed.lost) == (1, 2, 0, 0)
    assert {key: (out / "points" / f"{key}.json").stat().st_mtime_ns for key in done} == stamps  # not rewritten
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 3 and len(list((out / "points").glob("*.json"))) == 3
    again = run_sweep(spec, out, executor=RayExecutor(2), cache_dir=cache, plots=False)
    assert (again.skipped, again.ran) == (3, 0)


def _dies_once(marker: str) -> str:
    """A task whose worker dies on its first attempt (as a node lost mid-task) and returns on the retry."""
    attempts = Path(marker)
    with attempts.open("a") as fh:
        fh.write("x")
    if attempts.read_text() == "x":
        os._exit(1)
    return "record"


def test_a_task_retried_after_its_worker_died_returns_once(tmp_path, cluster):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import tests/
    marker = tmp_path / "attempts"
    results = list(RayExecutor(2).map_unordered([(_dies_once, (str(marker),))]))
    assert results == [(0, "record")]
    assert marker.read_text() == "xx"  # ran twice, returned once


def test_partitions_run_apart_into_one_folder_make_the_whole_table(tmp_path, cache):
    """docs/sweeps.md, several drivers: specs that split one axis, into the same folder, then the
    whole grid's spec, which runs nothing and tabulates every point."""
    whole = {"defaults": TINY, "axes": {"layers": [1, 2, 3], "target": ["rdu"]}}
    out = tmp_path / "out"
    for part in ([1, 2], [3]):
        spec = parse_spec({**whole, "axes": {**whole["axes"], "layers": part}})
        assert run_sweep(spec, out, jobs=1, cache_dir=cache, plots=False).ran == len(part)
    result = run_sweep(parse_spec(whole), out, jobs=1, cache_dir=cache, plots=False)
    assert (result.skipped, result.ran) == (3, 0) and len(set(_keys(out))) == 3


class _Cluster(SerialExecutor):
    """The serial executor as a cluster looks to the driver: its tasks do not share the driver's files."""

    shares_files = False


@pytest.mark.parametrize("node_detail", [True, False])
def test_a_cluster_sweep_writes_the_files_and_rows_a_local_one_does(tmp_path, cache, node_detail):
    """Issue 34: a worker that does not share the driver's files sends each point's encoded record
    (its text and row, not the report's objects) and the driver writes it: byte for byte the files
    and table a worker writing them itself leaves (but each point's ``seconds``)."""
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "target": ["rdu", "wse"]}})
    folders = {}
    for name, executor in (("local", SerialExecutor()), ("cluster", _Cluster())):
        folders[name] = tmp_path / name
        result = run_sweep(
            spec, folders[name], executor=executor, cache_dir=cache, plots=False, node_detail=node_detail
        )
        assert (result.ran, result.failed) == (4, 0)

    def records(folder):
        out = {}
        for path in sorted((folder / "points").glob("*.json")):
            record = json.loads(path.read_text())
            record.pop("seconds")
            out[path.name] = record
        return out

    local, cluster = records(folders["local"]), records(folders["cluster"])
    assert len(local) == 4 and local == cluster
    assert all(bool(r["report"]["nodes"]) is node_detail for r in local.values())

    def table(folder):
        with open(folder / "results.csv", newline="") as fh:
            return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)]

    assert table(folders["local"]) == table(folders["cluster"])


_FEW_FILES = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from dabench_ir.sweep import parse_spec, run_sweep
from dabench_ir.sweep.executors import SerialExecutor

class NoExporter(SerialExecutor):  # every export fails: each point is recorded with that error, no torch
    def map_unordered(self, tasks):
        return ((i, (None, None, "no exporter here")) for i in range(len(tasks)))

spec = parse_spec({"defaults": %r, "axes": {"layers": list(range(1, 301)), "target": ["rdu"]}})
result = run_sweep(spec, sys.argv[1], executor=NoExporter(), plots=False, cache_dir=sys.argv[1] + "/models")  # none cached
print(result.ran, result.failed, len(result.rows))
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048, reason="hard open-file limit too low")
def test_a_sweep_of_more_points_than_the_soft_open_file_limit_runs(tmp_path):
    """300 points to run, one lock file each, under a soft limit of 256 open files."""
    proc = subprocess.run(
        [sys.executable, "-c", _FEW_FILES % TINY, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["300", "300", "300"]
