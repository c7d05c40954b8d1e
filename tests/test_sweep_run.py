"""Sweeps end to end on tiny models (hidden 64, 1-2 layers, seq 8): rows, plots, resume,
failures, atomic files, and the fast graph path against `dabench_ir.profile`."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxscript")

from dabench_ir.sweep import graphs, load_spec, parse_spec, run_sweep
from dabench_ir.sweep.executors import SerialExecutor

TINY = {"family": "gpt2", "hidden": 64, "heads": 4, "seq": 8, "batch": 1, "positional": "none"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One export cache for the module: the tiny base is exported once."""
    return tmp_path_factory.mktemp("sweep-models")


def _rows(folder):
    with open(folder / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_small_sweep_end_to_end(tmp_path, cache):
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "hidden": [64, 128], "target": ["wse", "rdu"]}})
    seen = []
    result = run_sweep(
        spec, tmp_path, jobs=2, cache_dir=cache, bar=lambda d, t, failed=0, phase="": seen.append((phase, d, t))
    )
    errors = {r.get("error") for r in _rows(tmp_path) if r.get("status") != "ok"}
    assert result.failed == 0 and result.ran == 8 and result.exports == 2, errors
    rows = _rows(tmp_path)
    assert len(rows) == len(spec.points) == 8
    assert {r["status"] for r in rows} == {"ok"}
    for r in rows:
        assert float(r["time_s"]) > 0 and float(r["throughput_samples_per_s"]) > 0
        assert r["dominant_bound"] and r["fits"] in ("True", "False")
        assert (tmp_path / "points" / f"{r['key']}.json").is_file()
    assert seen[-1] == ("", 8, 8)
    assert [x for x in seen if x[0]] == [
        ("exporting models", 0, 2),
        ("exporting models", 1, 2),
        ("exporting models", 2, 2),
    ]  # before the first point, not at 0/8
    assert seen.index(("exporting models", 2, 2)) < seen.index(("", 1, 8))
    for png in ("allocation_vs_layers.png", "li_vs_layers.png", "tflops_vs_hidden.png", "fits_boundary.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert not (tmp_path / "throughput_vs_batch.png").exists()  # batch is not varied
    assert not list(tmp_path.rglob(".*.tmp*"))
    # the FLOPs of the 2-layer model are twice the 1-layer model's, up to the shared tail
    flops = {(r["layers"], r["hidden"], r["target"]): int(r["flops"]) for r in rows}
    assert flops[("2", "64", "wse")] > flops[("1", "64", "wse")]


def test_plots_drawn_by_workers_match_drawn_here(tmp_path, cache):
    """The sweep's workers draw its figures (a task each); the files are the ones this process draws."""
    from dabench_ir.sweep.executors import LocalExecutor, WorkerLost
    from dabench_ir.sweep.plots import write_plots

    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "hidden": [64, 128], "target": ["wse", "rdu"]}})
    result = run_sweep(spec, tmp_path / "s", jobs=1, cache_dir=cache, plots=False)
    here = write_plots(tmp_path / "s", result.rows, spec.varied())
    with LocalExecutor(2) as workers:
        (tmp_path / "w").mkdir()
        there = write_plots(tmp_path / "w", result.rows, spec.varied(), executor=workers)
    assert (
        [p.name for p in here]
        == [p.name for p in there]
        == ["allocation_vs_layers.png", "li_vs_layers.png", "tflops_vs_hidden.png", "fits_boundary.png"]
    )
    assert [p.read_bytes() for p in here] == [p.read_bytes() for p in there]

    class Dying(SerialExecutor):  # every worker dies on its figure: each is drawn here instead
        def map_unordered(self, tasks):
            yield from ((i, WorkerLost("worker process 1 died (exit code -11)")) for i in range(len(tasks)))

    (tmp_path / "d").mkdir()
    again = write_plots(tmp_path / "d", result.rows, spec.varied(), executor=Dying())
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in here]


def test_resume_skips_done_points(tmp_path, cache):
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "target": ["wse"]}})
    first = run_sweep(spec, tmp_path, jobs=1, cache_dir=cache, plots=False)
    assert first.ran == 2
    stamp = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "points").iterdir()}
    bigger = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2, 3], "target": ["wse"]}})
    second = run_sweep(bigger, tmp_path, jobs=1, cache_dir=cache, plots=False)
    assert (second.skipped, second.ran, second.exports) == (2, 1, 0)
    assert all((tmp_path / "points" / name).stat().st_mtime_ns == t for name, t in stamp.items())
    assert len(_rows(tmp_path)) == 3
    # a half-written (corrupt) record is not "done": it is run again
    victim = next(iter(stamp))
    (tmp_path / "points" / victim).write_text('{"key": ')
    third = run_sweep(bigger, tmp_path, jobs=1, cache_dir=cache, plots=False)
    assert (third.skipped, third.ran) == (2, 1)


def test_failing_point_does_not_stop_others(tmp_path, cache):
    # a target name is checked when the spec is read; a target file that is gone by run time
    # fails its point alone
    from importlib import resources

    gone = tmp_path / "no-such-target.toml"
    gone.write_text((resources.files("dabench_ir.targets") / "sn30.toml").read_text())
    spec = parse_spec(
        {
            "defaults": TINY,
            "axes": {"layers": [1], "target": ["wse", str(gone), "rdu"]},
            "point": [
                {"layers": 1, "chips": 2, "strategy": "tp", "target": "rdu"},
                {"layers": 1, "chips": 4, "strategy": "pp", "target": "rdu"},
            ],
        }
    )
    gone.unlink()
    out = tmp_path / "out"
    result = run_sweep(spec, out, executor=SerialExecutor(), cache_dir=cache, plots=False)
    rows = {r["target"].replace(str(gone), "no-such-target") + r["chips"]: r for r in _rows(out)}
    assert len(rows) == 5
    assert rows["wse1"]["status"] == rows["rdu1"]["status"] == "ok"
    bad = rows["no-such-target1"]
    assert bad["status"] == "error" and "no-such-target" in bad["error"]
    record = json.loads((out / "points" / f"{bad['key']}.json").read_text())
    assert record["status"] == "error" and record["error"] == bad["error"]
    assert result.failed >= 1
    # multi-chip points run through dabench_ir.scaling.scale; an unsupported strategy is an error by name
    scaled = rows["rdu2"]
    assert scaled["status"] == "ok" and float(scaled["time_s"]) > 0 and float(scaled["throughput_samples_per_s"]) > 0
    refused = rows["rdu4"]
    assert refused["status"] == "error" and "does not support --strategy pp; it supports: dp, tp" in refused["error"]


def test_fast_graph_path_matches_profile(tmp_path, cache):
    """Stamped base + one shape inference gives the report `dabench_ir.profile` gives on the file."""
    import onnx

    import dabench_ir

    params = {
        **TINY,
        "layers": 3,
        "target": "rdu",
        "opt_level": "O1",
        "precision": "fp16",
        "mode": "inference",
        "chips": 1,
    }
    key = graphs.base_key(params)
    base = graphs.load_base(cache, key) or graphs.export_base(params)
    path = tmp_path / "m.onnx"
    onnx.save(graphs.stamped_proto(base, 3), str(path))
    expected = dabench_ir.profile(path, target="rdu", batch=1, precision="fp16", opt_level="O1").to_dict()
    spec = parse_spec({"point": [params]})
    run_sweep(spec, tmp_path / "out", executor=SerialExecutor(), cache_dir=cache, plots=False)
    (record_file,) = (tmp_path / "out" / "points").iterdir()
    got = json.loads(record_file.read_text())["report"]
    for section in ("totals", "metrics"):
        for name, value in expected[section].items():
            if isinstance(value, float):
                assert got[section][name] == pytest.approx(value, rel=1e-9), name
            elif not isinstance(value, dict):
                assert got[section][name] == value, name
    assert got["fits"] == expected["fits"]
    assert [n["name"] for n in got["nodes"]] == [n["name"] for n in expected["nodes"]]


def test_bundled_smoke_spec_runs_from_cli(tmp_path, cache, capsys):
    from dabench_ir.cli import main

    spec = load_spec("smoke")
    out = tmp_path / "smoke"
    assert main(["sweep", "smoke", "-o", str(out), "-j", "1", "--cache-dir", str(cache), "--no-plots"]) == 0
    assert len(_rows(out)) == len(spec.points)
    assert "0 failed" in capsys.readouterr().out


def test_no_node_detail_keeps_the_row_and_drops_the_nodes(tmp_path, cache):
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1], "target": ["wse", "rdu"]}})
    full = run_sweep(spec, tmp_path / "full", executor=SerialExecutor(), cache_dir=cache, plots=False)
    slim = run_sweep(
        spec, tmp_path / "slim", executor=SerialExecutor(), cache_dir=cache, plots=False, node_detail=False
    )
    assert [r["dominant_bound"] for r in slim.rows] == [r["dominant_bound"] for r in full.rows]
    assert [r["time_s"] for r in slim.rows] == [r["time_s"] for r in full.rows]
    record = json.loads(next((tmp_path / "slim" / "points").glob("*.json")).read_text())
    assert record["report"]["nodes"] == [] and record["report"]["metrics"]["dominant_bound"]
    # resumed wanting the node rows, the slim points run again (they were skipped: 0 of 2 had rows);
    # resumed slim, the full records serve
    again = run_sweep(spec, tmp_path / "slim", executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert (again.ran, again.skipped) == (2, 0)
    assert all(json.loads(f.read_text())["report"]["nodes"] for f in (tmp_path / "slim" / "points").glob("*.json"))
    slim = run_sweep(
        spec, tmp_path / "slim", executor=SerialExecutor(), cache_dir=cache, plots=False, node_detail=False
    )
    assert (slim.ran, slim.skipped) == (0, 2)


@pytest.mark.parametrize("lock_text", ["{host} 1\n", "\x00\xff garbage", "{host} 999999999\n"])
def test_a_lock_no_live_sweep_holds_is_taken_over(tmp_path, cache, lock_text):
    """Issue 33: a lock naming an unrelated live process (pid 1), a dead one or garbage is not a
    sweep at work: the point runs and is in the table; a lock a live sweep holds is waited for."""
    import socket

    from dabench_ir.sweep.runner import point_key

    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1], "target": ["wse", "rdu"]}})
    (tmp_path / "points").mkdir()
    victim = point_key(spec.points[0].params)
    (tmp_path / "points" / f"{victim}.lock").write_text(
        lock_text.format(host=socket.gethostname()), errors="surrogateescape"
    )
    result = run_sweep(spec, tmp_path, executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert (result.ran, result.elsewhere, result.missing) == (2, 0, [])
    assert {r["key"] for r in _rows(tmp_path)} == {point_key(p.params) for p in spec.points}
    assert not list((tmp_path / "points").glob("*.lock"))


def test_a_stale_lock_beside_a_finished_point_is_cleared_on_the_next_run(tmp_path, cache):
    """A sweep killed (kill -9) after writing a point's record and before letting go leaves its lock
    file: the next run skips the point and removes the lock, which no live sweep holds."""
    from dabench_ir.sweep.runner import point_key

    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1], "target": ["wse"]}})
    run_sweep(spec, tmp_path, executor=SerialExecutor(), cache_dir=cache, plots=False)
    stale = tmp_path / "points" / f"{point_key(spec.points[0].params)}.lock"
    stale.write_text("a dead sweep's lock\n")
    again = run_sweep(spec, tmp_path, executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert (again.ran, again.skipped) == (0, 1) and not stale.exists()


def test_a_point_a_live_sweep_holds_is_waited_for_then_run_if_left(tmp_path, cache):
    """A lock held by a live sweep that lets go without a record: this sweep runs the point
    itself rather than ending without it (no point lost, none computed twice)."""
    import threading

    from dabench_ir.sweep.runner import _Locks, point_key

    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1], "target": ["wse"]}})
    (tmp_path / "points").mkdir()
    other = _Locks(tmp_path / "points")
    key = point_key(spec.points[0].params)
    assert other.acquire(key)
    threading.Timer(0.5, other.release, args=(key,)).start()  # the other sweep dies without a record
    result = run_sweep(spec, tmp_path, executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert (result.elsewhere, result.ran, result.missing) == (1, 1, [])
    assert [r["key"] for r in _rows(tmp_path)] == [key]


def test_results_table_a_folder_is_refused_before_any_point(tmp_path, cache):
    from dabench_ir.errors import UserError

    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1], "target": ["wse"]}})
    (tmp_path / "results.csv").mkdir()
    with pytest.raises(UserError, match=r"results\.csv: is a directory"):
        run_sweep(spec, tmp_path, executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert not (tmp_path / "points").exists() or not list((tmp_path / "points").iterdir())


class _Elsewhere(SerialExecutor):
    """Tasks whose workers do not share the driver's files (as on a Ray cluster): records come back whole."""

    shares_files = False


@pytest.mark.parametrize("node_detail", [True, False])
def test_records_a_worker_writes_equal_those_the_driver_writes(tmp_path, cache, node_detail):
    """Issue 34: local workers write their points' records and send back only the row; the files and
    rows are those the driver writes from the records a remote worker returns (all but ``seconds``)."""
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "target": ["wse", "rdu"]}})
    runs = {}
    for name, executor in (("here", SerialExecutor()), ("elsewhere", _Elsewhere())):
        result = run_sweep(
            spec, tmp_path / name, executor=executor, cache_dir=cache, plots=False, node_detail=node_detail
        )
        records = {}
        for path in sorted((tmp_path / name / "points").glob("*.json")):
            record = json.loads(path.read_text())
            assert record.pop("seconds") > 0
            records[path.name] = record
        rows = [{k: v for k, v in r.items() if k != "seconds"} for r in result.rows]
        runs[name] = (records, rows, [{k: v for k, v in r.items() if k != "seconds"} for r in _rows(tmp_path / name)])
    assert len(runs["here"][0]) == 4 and runs["here"] == runs["elsewhere"]
    nodes = [len(r["report"]["nodes"]) for r in runs["here"][0].values()]
    assert all(nodes) if node_detail else not any(nodes)


def test_base_exports_are_cached_per_machine_for_every_later_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path / "cache"))
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "target": ["wse"]}})
    first = run_sweep(spec, tmp_path / "a", jobs=1, plots=False)
    second = run_sweep(spec, tmp_path / "b", jobs=1, plots=False)  # another folder: the same cache
    assert (first.exports, second.exports, second.ran) == (1, 0, 2)
    assert len(list((tmp_path / "cache" / "models").glob("*.onnx"))) == 1
    assert not (tmp_path / "a" / "models").exists()
    timeless = [[{k: v for k, v in r.items() if k != "seconds"} for r in _rows(tmp_path / d)] for d in "ab"]
    assert timeless[0] == timeless[1]


@pytest.mark.slow
def test_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path):
    """What a batch scheduler sends (SIGTERM, to the whole process group) stops a sweep like Ctrl-C:
    its workers end, the points done so far are in results.csv, no lock file is left; exit 143."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "sw"
    spec = Path(__file__).resolve().parents[1] / "dabench_ir" / "data" / "sweeps" / "level1.toml"
    env = {**os.environ, "DABENCH_IR_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "dabench_ir", "sweep", str(spec), "-o", str(out), "--jobs", "2", "-q"]
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list((out / "points").glob("*.json"))) < 3:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "dabench-ir: terminated (SIGTERM)" in err and "Traceback" not in err
    assert not list((out / "points").glob("*.lock"))
    done = len(list((out / "points").glob("*.json")))
    rows = (out / "results.csv").read_text().splitlines()
    assert 3 <= done < 420 and len(rows) == done + 1  # every finished point in the table, nothing more


class _LosesItsExports(SerialExecutor):
    """An executor whose export workers die (killed, out of memory) before they answer."""

    def map_unordered(self, tasks):
        from dabench_ir.sweep import worker
        from dabench_ir.sweep.executors import WorkerLost

        for i, (fn, args) in enumerate(tasks):
            yield i, WorkerLost("worker process 1 died (exit code -9)") if fn is worker.run_export else fn(*args)


def test_a_lost_export_worker_leaves_its_points_to_do_not_failed(tmp_path):
    """A worker killed while it exported a base says nothing about the export: its points are lost
    (counted, no record), and the next run exports and runs them, where each had been recorded as
    failed and skipped on resume until --retry-failed."""
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "target": ["wse"]}})
    models = tmp_path / "models"
    lost = run_sweep(spec, tmp_path / "out", executor=_LosesItsExports(), cache_dir=models, plots=False)
    assert (lost.lost, lost.failed, lost.ran) == (2, 0, 0) and len(lost.missing) == 2
    again = run_sweep(spec, tmp_path / "out", executor=SerialExecutor(), cache_dir=models, plots=False)
    assert (again.skipped, again.ran, again.failed) == (0, 2, 0)
    assert [r["error"] for r in _rows(tmp_path / "out")] == ["", ""]


def test_one_configuration_is_one_run_however_the_spec_spells_it(tmp_path, cache):
    """``rdu`` and ``sn30`` name one chip; ``wse_mode = "auto"`` is the default whether given or not:
    each pair was two keys, two runs and two identical rows, and giving a default as a flag reran a
    finished sweep."""
    from dabench_ir.sweep.runner import point_key

    assert point_key({**TINY, "target": "rdu"}) == point_key({**TINY, "target": "sn30"})
    assert point_key({**TINY, "target": "wse", "wse_mode": "auto"}) == point_key({**TINY, "target": "wse"})
    assert point_key({**TINY, "target": "wse", "wse_mode": "pipelined"}) != point_key({**TINY, "target": "wse"})
    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1], "target": ["rdu", "sn30", "wse"]}})
    result = run_sweep(spec, tmp_path, executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert (result.total, result.ran, result.missing) == (2, 2, [])
    assert [r["target"] for r in _rows(tmp_path)] == ["rdu", "wse"]


def test_a_points_key_follows_the_exporter_its_model_comes_from(monkeypatch):
    """After a torch upgrade the base is exported again (its key has the exporter's versions); the
    points built from it must not be read back from the old export's records."""
    from dabench_ir.sweep.runner import point_key

    before = point_key({**TINY, "target": "wse"})
    monkeypatch.setattr(graphs, "exporter_versions", lambda: {"torch": "9.9.9", "onnxscript": "0", "onnx": "0"})
    assert point_key({**TINY, "target": "wse"}) != before


def test_a_resume_reads_each_finished_record_once_and_shows_it_reading(tmp_path, cache, monkeypatch):
    """Resuming a finished sweep parsed every record twice (is it done; its table row) before the bar
    moved: a 420-point folder showed nothing for 6.5 s. Each record is read once now, under a phase."""
    from dabench_ir.sweep import results
    from dabench_ir.sweep.runner import READ_PHASE

    spec = parse_spec({"defaults": TINY, "axes": {"layers": [1, 2], "target": ["wse", "rdu"]}})
    run_sweep(spec, tmp_path, executor=SerialExecutor(), cache_dir=cache, plots=False)
    reads, phases = [], []
    real = results.read_point
    monkeypatch.setattr(results, "read_point", lambda folder, key: reads.append(key) or real(folder, key))
    again = run_sweep(
        spec,
        tmp_path,
        executor=SerialExecutor(),
        cache_dir=cache,
        plots=False,
        bar=lambda *a, **k: phases.append(k.get("phase")),
    )
    assert (again.skipped, again.ran, len(again.rows)) == (4, 0, 4)
    assert sorted(reads) == sorted({r["key"] for r in again.rows}) and READ_PHASE in phases
