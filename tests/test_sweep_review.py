"""Sweep fixes from a cold review: a ``cpu`` point is the run ``profile`` makes, a dead worker's
written records count as run, a killed writer's temp files are removed, ``--kv-precision`` without
a decode point is refused, and a dry run lists the runs a sweep makes."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxscript")

from dabench_ir.sweep import graphs, parse_spec, point_key, run_sweep
from dabench_ir.sweep.executors import Executor, SerialExecutor, WorkerLost
from tests.test_sweep_run import TINY


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The module's export cache: the tiny base exported once."""
    return tmp_path_factory.mktemp("sweep-models")


def test_a_cpu_point_is_the_run_profile_makes_of_the_stamped_file(tmp_path, cache):
    """On ``cpu`` ``profile`` times the model's nodes on this host and predicts from that table; a
    sweep point does too, from the stamped model written into the sweep's model cache (before: the
    per-op-class model, 2907.84 against profile's 2163.44 samples/s on gpt2 L2 h64 seq 8)."""
    import onnx

    import dabench_ir

    params = {**TINY, "layers": 2, "target": "cpu"}
    spec = parse_spec({"point": [params]})
    key = graphs.base_key(spec.points[0].params)
    path = tmp_path / "m.onnx"
    onnx.save(graphs.stamped_proto(graphs.load_base(cache, key) or graphs.export_base(params), 2), str(path))
    expected = dabench_ir.profile(path, target="cpu").to_dict()
    run_sweep(spec, tmp_path / "out", executor=SerialExecutor(), cache_dir=cache, plots=False)
    (record_file,) = (tmp_path / "out" / "points").glob("*.json")
    got = json.loads(record_file.read_text())["report"]
    for name in ("time_s", "throughput_samples_per_s"):
        assert got["totals"][name] == pytest.approx(expected["totals"][name], rel=1e-9), name
    assert [n["time_s"] for n in got["nodes"]] == pytest.approx([n["time_s"] for n in expected["nodes"]], rel=1e-9)
    assert (cache / f"{graphs.model_key(spec.points[0].params)}.onnx").is_file()  # the file it ran: in the cache


class _DiesAfterOnePoint(Executor):
    """Runs each group's first point (its record written into the shared folder), then loses the
    worker: as a kill -9 of a worker between two points' records."""

    shares_files = True

    def map_unordered(self, tasks):
        from dabench_ir.sweep import worker

        for i, (fn, args) in enumerate(tasks):
            if fn is worker.run_group:
                base, layers, points, *rest = args
                fn(base, layers, points[:1], *rest)
                yield i, WorkerLost("worker process 1 died (exit code -9)")
            else:
                yield i, fn(*args)


def test_a_dead_workers_written_records_count_as_run_not_lost(tmp_path, cache, caplog):
    """A group of three points whose worker died after writing one record: that point is run (its
    row kept), two are lost, said in one line (the summary's), not a warning as well (before: 3 lost,
    0 run, and a WARNING)."""
    spec = parse_spec({"defaults": {**TINY, "layers": 1}, "axes": {"target": ["wse", "rdu", "ipu"]}})
    with caplog.at_level(logging.WARNING):
        result = run_sweep(spec, tmp_path / "out", executor=_DiesAfterOnePoint(), cache_dir=cache, plots=False)
    assert (result.ran, result.lost, len(result.missing), len(result.rows)) == (1, 2, 2, 1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    again = run_sweep(spec, tmp_path / "out", executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert (again.skipped, again.ran, again.lost) == (1, 2, 0)


def test_a_retried_points_old_record_is_not_taken_for_one_its_dead_worker_wrote(tmp_path, cache):
    """With --retry-failed a failed point's earlier record is there when its worker dies: the point
    is lost (to do), not counted as run from that stale record."""
    spec = parse_spec({"defaults": {**TINY, "layers": 1}, "axes": {"target": ["wse", "rdu"]}})
    run_sweep(spec, tmp_path / "out", executor=SerialExecutor(), cache_dir=cache, plots=False)
    for path in (tmp_path / "out" / "points").glob("*.json"):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "status": "error", "error": "earlier", "report": None}))
    result = run_sweep(
        spec, tmp_path / "out", executor=_DiesAfterOnePoint(), cache_dir=cache, plots=False, retry_failed=True
    )
    assert (result.ran, result.lost) == (1, 1)


def test_a_killed_writers_temp_files_are_removed_when_the_point_is_claimed(tmp_path, cache):
    """A kill -9 while a record was written leaves ``points/.<key>.json.<rand>.tmp``: the next sweep
    that claims the point removes it; a temp file of a point it does not hold stays (another sweep's
    write in flight)."""
    spec = parse_spec({"point": [{**TINY, "layers": 1, "target": "wse"}]})
    points = tmp_path / "out" / "points"
    points.mkdir(parents=True)
    key = point_key(spec.points[0].params)
    left = points / f".{key}.json.k2l8x_q.tmp"
    left.write_text('{"key": "' + key + '", "report": {"nodes": [')  # unterminated
    other = points / ".0123456789abcdef.json.abc123.tmp"
    other.write_text("{")
    result = run_sweep(spec, tmp_path / "out", executor=SerialExecutor(), cache_dir=cache, plots=False)
    assert result.ran == 1
    assert not left.exists() and other.exists()
    assert sorted(p.name for p in points.iterdir()) == sorted([f"{key}.json", other.name])


def test_kv_precision_is_refused_when_no_point_is_a_decode_graph(tmp_path, capsys):
    """``profile`` refuses --kv-precision on a graph without a KV cache; a sweep with no decode point
    did not (exit 0, every point failed "needs a decode graph"): now exit 2, one line, nothing run."""
    from dabench_ir.cli import main

    assert main(["sweep", "smoke", "-o", str(tmp_path / "kvo"), "--kv-precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kv-precision fp8" in err[0] and "decode" in err[0]
    assert not (tmp_path / "kvo").exists()


def test_a_prefill_point_of_a_mixed_spec_keeps_no_kv_precision():
    """In a spec with decode and prefill points, a kv_precision reaches the decode points only (a
    prefill point would fail on it): the prefill points are one run each, as without it."""
    spec = parse_spec(
        {
            "defaults": {**TINY, "layers": 1, "target": "h100", "kv_precision": "fp8", "seq": 1},
            "axes": {"phase": ["prefill", {"phase": "decode", "context": 16}]},
        }
    )
    by_phase = {p.params.get("phase"): p.params for p in spec.points}
    assert by_phase["decode"]["kv_precision"] == "fp8" and "kv_precision" not in by_phase["prefill"]


def test_a_dry_run_lists_the_runs_a_sweep_makes_each_labelled_by_its_options(tmp_path, capsys):
    """wse, wse2 and wse with wse_mode = "auto" are one run; ipus 1, 2 and 4 are three, told apart by
    their labels (before: "6 points", three lines "gpt2 L1 h64 ipu"; the run made 4)."""
    from dabench_ir.cli import main

    spec = tmp_path / "alias.toml"
    spec.write_text(
        "[defaults]\nfamily = 'gpt2'\nhidden = 64\nheads = 4\nseq = 8\nlayers = 1\n[axes]\n"
        "target = ['wse', 'wse2', {target='wse', wse_mode='auto'}, {target='ipu', ipus=1}, "
        "{target='ipu', ipus=2}, {target='ipu', ipus=4}]\n"
    )
    assert main(["sweep", str(spec), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "4 points"
    assert len(set(lines[:-1])) == 4 and "gpt2 L1 h64 ipu ipus=2" in lines
