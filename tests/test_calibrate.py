"""Host calibration: the cached cpu target, its key, and its reuse and invalidation.

The suite runs one quick (sub-second) calibration; the full one is never run here.
"""

from __future__ import annotations

import tomllib

import pytest

from dabench_ir.errors import UserError
from dabench_ir.execute import calibrate as cal


@pytest.fixture(scope="module")
def quick_cache(tmp_path_factory):
    """One quick calibration in a private cache folder, shared by the tests below."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DABENCH_IR_CACHE", str(folder))
        path = cal.calibrate(1, quick=True)
    return folder, path


@pytest.fixture
def cache(quick_cache, monkeypatch):
    folder, path = quick_cache
    monkeypatch.setenv("DABENCH_IR_CACHE", str(folder))
    return path


def _no_measuring(*_args, **_kwargs):
    raise AssertionError("calibration ran again although a valid one is cached")


def test_quick_calibration_is_a_valid_target(cache):
    from dabench_ir.targets import Target

    data = tomllib.loads(cache.read_text())
    target = Target.from_dict(data, origin=cache.name)
    assert target.kind == "cpu" and target.name == "cpu"
    assert target.peak_flops("fp32") > 0
    assert target.memory("dram").bandwidth_bytes_per_s > 0
    assert data["overheads"]["kernel_launch_s"]["value"] > 0
    assert data["compute"]["peak_flops"]["fp32"]["source"].startswith("measured by dabench-ir calibrate on ")
    assert data["calibration"]["threads"] == 1 and data["calibration"]["quick"] is True
    assert data["calibration"]["key"] == cal.machine_key(1)
    assert {row["m"] for row in data["calibration"]["matmul"]}
    assert data["calibration"]["seconds"] < 10


def test_cache_reused(cache, monkeypatch):
    monkeypatch.setattr(cal, "measure_host", _no_measuring)
    assert cal.cpu_target_path(1, quick=True) == cache
    assert cal.calibration_status(1, allow_quick=True) == (cache, None)


def test_quick_calibration_not_used_for_real_predictions(cache, monkeypatch):
    monkeypatch.setattr(cal, "measure_host", _no_measuring)
    with pytest.raises(UserError, match="rough"):
        cal.cpu_target_path(1, measure_if_missing=False)


def test_machine_key_change_invalidates(cache, monkeypatch, capsys):
    calls = []

    def fake_calibrate(threads=None, *, quick=False, verbose=False):
        calls.append((threads, quick))
        return cache

    monkeypatch.setattr(cal, "calibrate", fake_calibrate)
    monkeypatch.setattr(cal, "_cpu_model", lambda: "Some Other CPU 9000")
    path, reason = cal.calibration_status(1, allow_quick=True)
    assert path != cache and reason == "no calibration for this machine yet"
    cal.cpu_target_path(1, quick=True)
    assert calls == [(1, True)]
    err = capsys.readouterr().err
    assert f"calibrating this host's CPU (about a second; cached in {path}): no calibration" in err


def test_mismatching_key_in_file_invalidates(cache, monkeypatch):
    """Same file name (e.g. a hash collision or a hand-edited file) but another key."""
    monkeypatch.setattr(cal, "cache_file", lambda key: cache)
    real_key = cal.machine_key

    monkeypatch.setattr(cal, "machine_key", lambda threads=None: {**real_key(threads), "ort_version": "0.0.1"})
    assert "other settings" in cal.calibration_status(1, allow_quick=True)[1]


def test_thread_count_is_part_of_the_key(cache):
    path, reason = cal.calibration_status(2, allow_quick=True)
    assert path != cache and reason is not None
    assert cal.machine_key(2)["threads"] == 2


def test_stale_calibration_is_measured_again(cache, tmp_path, monkeypatch):
    old = tmp_path / cache.name
    old.write_text(cache.read_text().replace('date = "', 'date = "1999-01-01" #'))
    monkeypatch.setattr(cal, "cache_file", lambda key: old)
    assert "days old" in cal.calibration_status(1, allow_quick=True)[1]


def test_cache_dir_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("DABENCH_IR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cal.cache_dir() == tmp_path / "dabench-ir"
    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path / "x"))
    assert cal.cache_dir() == tmp_path / "x"


def test_cli_calibrate_shows_cached_figures(cache, monkeypatch, capsys):
    from dabench_ir.cli import main

    monkeypatch.setattr(cal, "measure_host", _no_measuring)
    assert main(["calibrate", "--threads", "1", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "cached on" in out and "GFLOP/s" in out and str(cache) in out
    assert main(["calibrate", "--threads", "0"]) == 2


def test_cli_calibrate_never_writes_its_json_over_the_calibration_it_keeps(cache, monkeypatch, capsys):
    # --json naming the cache file had written JSON over it (the next run found it unreadable)
    from dabench_ir.cli import main

    monkeypatch.setattr(cal, "measure_host", _no_measuring)
    assert main(["calibrate", "--threads", "1", "--quick"]) == 0
    kept = cal.calibration_status(1, allow_quick=True)[0]
    before = kept.read_bytes()
    capsys.readouterr()
    assert main(["calibrate", "--threads", "1", "--quick", "--json", str(kept)]) == 2
    assert "input" in capsys.readouterr().err and kept.read_bytes() == before


def test_dump_toml_round_trips():
    data = {
        "name": "cpu",
        "n": 3,
        "x": 1.5e-07,
        "big": 2.5e11,
        "flag": True,
        "rec": {"value": 1.0, "source": 'say "hi"', "estimate": False},
        "table": {"inner": {"value": 2, "source": "s"}, "sub": {"k": [1, 2]}},
        "rows": [{"a": 1}, {"a": 2, "b": "z"}],
        "empty": [],
    }
    assert tomllib.loads(cal.dump_toml(data)) == data


def test_a_new_calibration_drops_the_node_timings_taken_beside_the_old_one(tmp_path, monkeypatch):
    """Per-node kernel timings are measured again with the calibration, never mixed with one
    taken under other conditions (a busy machine's timings would make a quiet one look slow)."""
    from dabench_ir.lowering.cpu import node_table_path

    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path))
    stale = node_table_path(cal.cache_file(cal.machine_key(1)))
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("{}")
    path = cal.calibrate(1, quick=True)
    assert node_table_path(path) == stale and not stale.exists()


@pytest.mark.parametrize("spelling", ["cpu", "CPU", " Cpu "])
def test_every_spelling_of_the_host_reaches_its_calibration_with_its_threads(spelling, cache, monkeypatch):
    """One owner of the host's name (`targets.HOST`, `targets.is_host`): `--target CPU --threads 2`
    used to skip the per-thread calibration (a case-sensitive ``== "cpu"``) and load the default
    one, a flag accepted and ignored."""
    from dabench_ir.run import check_target, resolve_target
    from dabench_ir.targets import HOST, is_host, load_target

    asked = []

    def path_for(threads=None, **_kwargs):
        asked.append(threads)
        return cache

    monkeypatch.setattr(cal, "cpu_target_path", path_for)
    assert is_host(spelling)
    check_target(spelling)  # never calibrates: the host is always a valid name
    assert asked == []
    assert resolve_target(spelling, threads=2).name == HOST
    assert load_target(spelling).name == HOST
    assert asked == [2, None]  # the threads asked for, then the default calibration


def test_a_calibration_file_refuses_another_thread_count(cache, tiny_matmul_path, tmp_path, monkeypatch, capsys):
    """A copy of the 1-thread calibration given as ``--target FILE --threads 2`` had predicted with the
    1-thread peak and 2-thread node benchmarks, and written that 2-thread table over the 1-thread one."""
    import shutil

    from dabench_ir.cli import main
    from dabench_ir.lowering.cpu import node_table_path

    monkeypatch.setattr("dabench_ir.execute.ort.default_threads", lambda: 4)  # --threads 2 is in range anywhere
    mine = tmp_path / "mycpu.toml"
    shutil.copy(cache, mine)
    table = node_table_path(cache)
    before = table.read_bytes() if table.exists() else None
    capsys.readouterr()
    assert main(["profile", str(tiny_matmul_path), "--target", str(mine), "--threads", "2", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--threads 2: mycpu.toml was calibrated at 1 thread; drop --threads" in err
    assert "dabench-ir calibrate --threads 2" in err
    assert (table.read_bytes() if table.exists() else None) == before
