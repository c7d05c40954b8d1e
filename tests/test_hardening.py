"""Issue 21: one regression test per hostile input found. The contract for every command:
exit 0 with a valid result, or exit 2 with exactly one line on stderr; never a traceback,
a hang, a crash, nonsense accepted, or a file the tool did not mean to write."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dabench_ir.cli import main
from tests.conftest import parse

MM = """
agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) {
    C = MatMul(A, B)
}
"""


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(code: int, err: str, *needles: str, exit_code: int = 2) -> str:
    assert code == exit_code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def mm(tmp_path) -> Path:
    path = tmp_path / "mm.onnx"
    onnx.save(parse(MM), path)
    return path


def _one_op(op: str, elem_type: int, shape: list[int]) -> onnx.ModelProto:
    """A model of one ``op`` from x to y, both of ``elem_type`` and ``shape``."""
    x = helper.make_tensor_value_info("x", elem_type, shape)
    y = helper.make_tensor_value_info("y", elem_type, shape)
    return helper.make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y]))


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "bad.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


# -- the last-resort handler and the bare command ------------------------------------------------
def test_internal_error_is_one_line_exit_1(capsys, monkeypatch, mm):
    import dabench_ir.pipeline as pipeline

    def boom(*a, **k):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(pipeline, "run_profile", boom)
    code, _, err = run_cli(capsys, "profile", mm)
    line = one_line(code, err, "internal error", "ZeroDivisionError", "--debug", exit_code=1)
    assert line.startswith("dabench-ir: internal error:")
    code, _, err = run_cli(capsys, "profile", mm, "--debug")
    assert code == 1 and "Traceback" in err


def test_no_command_prints_help_on_stdout(capsys):
    code, out, err = run_cli(capsys)
    assert code == 0 and "usage: dabench-ir" in out and err == ""


def test_warnings_before_an_error_are_dropped(capsys, tmp_path):
    model = parse(MM)
    model.metadata_props.add(key="dabench.weights", value="5")  # warns, then the run fails on the target
    path = _save(tmp_path, model)
    code, _, err = run_cli(capsys, "profile", path, "--target", "nosuchtarget")
    one_line(code, err)


# -- inputs: not a regular file ---------------------------------------------------------------------
def test_fifo_model_refused_not_blocking(capsys, tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    code, _, err = run_cli(capsys, "profile", fifo)
    one_line(code, err, "not a regular file")


def test_fifo_report_refused(capsys, tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    code, _, err = run_cli(capsys, "compare", fifo)
    one_line(code, err, "not a regular file")


@pytest.mark.parametrize("command", ["compare", "sweep", "target"])
def test_binary_files_refused(capsys, tmp_path, mm, command):
    blob = tmp_path / "x.toml"
    blob.write_bytes(b"\x00\xff\xfe binary \x89PNG")
    argv = {
        "compare": ("compare", blob),
        "sweep": ("sweep", blob, "--dry-run"),
        "target": ("profile", mm, "--target", blob),
    }[command]
    code, _, err = run_cli(capsys, *argv)
    one_line(code, err)


# -- malformed models -------------------------------------------------------------------------------
def _with_node_meta(value: str) -> onnx.ModelProto:
    model = parse(MM)
    model.graph.node[0].metadata_props.add(key="pkg.torch.onnx.name_scopes", value=value)
    return model


@pytest.mark.parametrize("value", ["5", "{'a': 1}", "[1, 2, None]", "[" * 5000, "x" * 3_000_000])
def test_name_scopes_of_any_shape(capsys, tmp_path, value):
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, _with_node_meta(value)), "-q")
    assert code == 0, err


@pytest.mark.parametrize("value", ["5", '{"a": 1}', "[1, 2]", "null", "[" * 5000])
def test_weights_metadata_of_any_shape(capsys, tmp_path, value):
    model = parse(MM)
    model.metadata_props.add(key="dabench.weights", value=value)
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model), "-q")
    assert code == 0 and "not a JSON list" in err


def test_negative_dim_refused(capsys, tmp_path):
    model = parse(MM)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -4
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model))
    one_line(code, err, "negative dim")


def test_rank_over_64_refused(capsys, tmp_path):
    model = _one_op("Relu", TensorProto.FLOAT, [1] * 70)
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model), "--measure")
    one_line(code, err, "rank 70")


def test_unknown_element_type_refused(capsys, tmp_path):
    model = parse(MM)
    model.graph.input[0].type.tensor_type.elem_type = 99
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model))
    one_line(code, err, "element type 99")


def test_string_tensor_flagged_not_zero_silently(capsys, tmp_path):
    model = _one_op("Identity", TensorProto.STRING, [3])
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model), "-q")
    assert code == 0 and "STRING" in err


def test_external_offset_not_integer_refused(capsys, tmp_path):
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[3, 4])
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="w.bin")
    w.external_data.add(key="offset", value="abc")
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3])
    c = helper.make_tensor_value_info("C", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["C"])], "g", [a], [c], [w])
    path = _save(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    (tmp_path / "w.bin").write_bytes(b"\0" * 48)
    code, _, err = run_cli(capsys, "profile", path, "--measure")
    one_line(code, err, "offset", "not a non-negative integer")


def test_cyclic_graph_refused(capsys, tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
        helper.make_node("Relu", ["a"], ["b"], name="n2"),
        helper.make_node("Identity", ["a"], ["y"], name="n3"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model), "--target", "rdu")
    one_line(code, err, "cycle")


# -- outputs: checked before the work, never clobbering -------------------------------------------
@pytest.mark.parametrize("flag", ["--json", "--csv", "--html", "--trace", "--annotate"])
def test_output_is_a_directory(capsys, tmp_path, mm, flag):
    code, _, err = run_cli(capsys, "profile", mm, "--target", "rdu", flag, tmp_path)
    one_line(code, err, "is a directory")


def test_output_folder_missing_or_unwritable(capsys, tmp_path, mm):
    code, _, err = run_cli(capsys, "profile", mm, "--json", tmp_path / "no" / "r.json")
    one_line(code, err, "does not exist")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        code, _, err = run_cli(capsys, "profile", mm, "--json", ro / "r.json")
        one_line(code, err, "not writable")
    finally:
        ro.chmod(0o700)


def test_output_under_proc_and_long_name(capsys, tmp_path, mm):
    code, _, err = run_cli(capsys, "profile", mm, "--json", "/proc/self/r.json")
    one_line(code, err, "/proc")
    code, _, err = run_cli(capsys, "profile", mm, "--json", tmp_path / ("x" * 300 + ".json"))
    one_line(code, err, "255 bytes")


def test_non_utf8_output_path(capsys, tmp_path, mm):
    name = os.fsdecode(os.fsencode(str(tmp_path)) + b"/r\xff\xfe.html")
    code, _, err = run_cli(capsys, "profile", mm, "--html", name, "-q")
    assert code == 0, err
    assert any(p.suffix == ".html" for p in tmp_path.iterdir())


def test_plots_naming_a_file(capsys, tmp_path, mm):
    f = tmp_path / "plots"
    f.write_text("x")
    code, _, err = run_cli(capsys, "profile", mm, "--target", "rdu", "--plots", f)
    one_line(code, err, "not a folder")


def test_scale_plot_bad_suffix_before_work(capsys, tmp_path, mm):
    code, _, err = run_cli(capsys, "scale", mm, "--target", "h100", "--strategy", "dp", "--plot", tmp_path / "p.pdf")
    one_line(code, err, "suffix")


def test_sweep_output_is_a_file(capsys, tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    code, _, err = run_cli(capsys, "sweep", "smoke", "-o", f)
    one_line(code, err, "not a folder")


def test_export_output_dir_before_work(capsys, tmp_path):
    code, _, err = run_cli(capsys, "export", "--family", "gpt2", "--layers", "1", "--hidden", "64", "-o", tmp_path)
    one_line(code, err, "is a directory")


def test_json_over_the_input_model_refused(capsys, mm):
    before = mm.read_bytes()
    code, _, err = run_cli(capsys, "profile", mm, "--json", mm)
    one_line(code, err, "input of this run")
    assert mm.read_bytes() == before


def test_json_to_a_device_writes_through(capsys, mm):
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    code, _, err = run_cli(capsys, "profile", mm, "--json", "/dev/null", "-q")
    assert code == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_symlinked_output_is_followed(capsys, tmp_path, mm):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    code, _, err = run_cli(capsys, "profile", mm, "--json", link, "-q")
    assert code == 0, err
    assert link.is_symlink() and json.loads(real.read_text())["schema"] == "dabench-ir/report/v1"


def test_concurrent_writers_do_not_collide(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from dabench_ir.fileio import write_output

    target = tmp_path / "out.json"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: write_output(target, json.dumps({"i": i, "pad": "x" * 100_000})), range(64)))
    assert json.loads(target.read_text())["pad"] == "x" * 100_000
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


# -- nonsense refused -------------------------------------------------------------------------------
def test_target_comma_only(capsys, mm):
    code, _, err = run_cli(capsys, "profile", mm, "--target", ",")
    one_line(code, err, "no target")


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-3", "0"])
def test_normalize_to_refused(capsys, value):
    code, _, err = run_cli(capsys, "targets", "--normalize-to", value)
    one_line(code, err, "process node")


def test_demo_bad_model_and_target(capsys, tmp_path):
    text = tmp_path / "text.onnx"
    text.write_text("hello, not a model")
    code, _, err = run_cli(capsys, "demo", "--model", text, "-o", tmp_path / "d1", "--no-measure")
    one_line(code, err)
    code, _, err = run_cli(capsys, "demo", "--target", "foo", "-o", tmp_path / "d2", "--no-measure")
    one_line(code, err, "foo")


# -- reports given to compare ---------------------------------------------------------------------
def _report(tmp_path: Path, **fields) -> Path:
    doc = {"schema": "dabench-ir/report/v1", "model": {}, "totals": {}, "nodes": [], **fields}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "fields",
    [
        {"nodes": 5},
        {"nodes": {"a": 1}},
        {"nodes": [5]},
        {"nodes": [{"time_s": "x"}]},
        {"totals": []},
        {"totals": {"time_s": "slow"}},
        {"target": {"name": 5}},
        {"model": "x"},
    ],
)
def test_compare_malformed_report(capsys, tmp_path, fields):
    code, _, err = run_cli(capsys, "compare", _report(tmp_path, **fields))
    one_line(code, err)


def test_csv_formula_cells_neutralised(tmp_path):
    from dabench_ir.report.model import csv_cell

    assert csv_cell('=HYPERLINK("x")') == '\'=HYPERLINK("x")'
    assert [csv_cell(v) for v in ("+1", "-x", "@a", "ok", -3, None)] == ["'+1", "'-x", "'@a", "ok", -3, ""]


def test_csv_node_names_neutralised(capsys, tmp_path):
    model = parse(MM)
    model.graph.node[0].name = '=HYPERLINK("http://x","y")'
    out = tmp_path / "r.csv"
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model), "--csv", out, "-q")
    assert code == 0, err
    assert "'=HYPERLINK" in out.read_text()


def test_subprocess_has_no_traceback(tmp_path):
    """The installed entry point, end to end, on a FIFO: one line, exit 2, and it returns."""
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "dabench_ir", "profile", str(fifo)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- MLIR: a crash in torch-mlir's parser is exit 2, not a segfault ----------------------------------
_TRUNCATED_RESOURCE = (
    "func.func @f() -> tensor<4xf32> {\n  %0 = arith.constant dense_resource<blob1> : tensor<4xf32>\n"
    '  return %0 : tensor<4xf32>\n}\n{-#\n  dialect_resources: {\n    builtin: {\n      blob1: "0x04000000' + "AB" * 200
)


def test_truncated_mlir_is_exit_2_not_a_segfault(tmp_path):
    pytest.importorskip("torch_mlir")
    path = tmp_path / "cut.mlir"
    path.write_text(_TRUNCATED_RESOURCE)
    proc = subprocess.run(
        [sys.executable, "-m", "dabench_ir", "profile", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "does not parse" in proc.stderr


def test_mlir_parse_error_one_line(capsys, tmp_path):
    pytest.importorskip("torch_mlir")
    path = tmp_path / "bad.mlir"
    path.write_text("func.func @f(")
    code, _, err = run_cli(capsys, "profile", path)
    one_line(code, err, "does not parse")


# -- calibration cache ----------------------------------------------------------------------------------
def test_cache_env_pointing_at_a_file(capsys, tmp_path, monkeypatch):
    f = tmp_path / "cachefile"
    f.write_text("x")
    monkeypatch.setenv("DABENCH_IR_CACHE", str(f))
    code, _, err = run_cli(capsys, "calibrate", "--quick")
    one_line(code, err, "DABENCH_IR_CACHE")


def test_cache_file_replaced_by_a_directory(capsys, tmp_path, monkeypatch):
    from dabench_ir.execute.calibrate import calibration_status

    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path))
    path, _ = calibration_status(None, allow_quick=True)
    path.mkdir(parents=True)
    code, _, err = run_cli(capsys, "calibrate", "--quick", "--force")
    one_line(code, err, "is a directory", "DABENCH_IR_CACHE")


@pytest.mark.parametrize(
    "text", ["calibration = 5\n", '[calibration]\nformat = "x"\n[compute]\npeak_flops = 3\n', "\0\1\2"]
)
def test_cache_of_the_wrong_type_is_measured_again(capsys, tmp_path, monkeypatch, text):
    from dabench_ir.execute.calibrate import calibration_status

    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path))
    path, _ = calibration_status(None, allow_quick=True)
    path.write_text(text)
    _, reason = calibration_status(None, allow_quick=True)
    assert reason is not None and ("damaged" in reason or "unreadable" in reason)


# -- sweeps --------------------------------------------------------------------------------------------
def _task(i: int) -> int:
    if i == 3:
        os.kill(os.getpid(), 9)  # this worker dies mid-task
    return i * i


def test_one_killed_worker_loses_only_its_task():
    from dabench_ir.sweep.executors import LocalExecutor, WorkerLost

    with LocalExecutor(2) as ex:
        out = dict(ex.map_unordered([(_task, (i,)) for i in range(8)]))
    assert isinstance(out.pop(3), WorkerLost)
    assert out == {i: i * i for i in range(8) if i != 3}


def _sleep_forever() -> None:
    import time

    time.sleep(600)


def test_workers_exit_when_the_driver_is_killed(tmp_path):
    """kill -9 of the driver: its workers die with it (no orphans holding memory)."""
    script = tmp_path / "driver.py"
    script.write_text(
        f"import sys, os\nsys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from dabench_ir.sweep.executors import LocalExecutor\nfrom tests.test_hardening import _sleep_forever\n"
        "ex = LocalExecutor(2)\nit = ex.map_unordered([(_sleep_forever, ()), (_sleep_forever, ())])\n"
        "import threading\nthreading.Thread(target=lambda: list(it), daemon=True).start()\n"
        "import time\ntime.sleep(1.5)\nprint(' '.join(str(w.proc.pid) for w in ex.all), flush=True)\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        proc.kill()
        proc.wait()
    import time

    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if _alive(p)]
    assert not alive


_LOCKS = []


def _make_a_lock() -> int:
    import multiprocessing

    _LOCKS.append(multiprocessing.Lock())  # a named semaphore kept alive, as tqdm's class lock is
    return 1


def test_spawned_workers_leave_no_semaphore_for_the_tracker(tmp_path):
    """A spawned worker ends with `os._exit` but unlinks its named semaphores first: the driver's exit
    printed the resource tracker's 'leaked semaphore objects' warning after every validate that
    exported models (the exports' tqdm lock)."""
    script = tmp_path / "driver.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from dabench_ir.sweep.executors import LocalExecutor\nfrom tests.test_hardening import _make_a_lock\n"
        "if __name__ == '__main__':\n"
        "    with LocalExecutor(1, start='spawn') as ex:\n"
        "        print(list(ex.map_unordered([(_make_a_lock, ())])))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(0, 1)]"
    assert "leaked semaphore" not in done.stderr, done.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_sweep_grid_counted_before_expanding(capsys, tmp_path):
    axes = "\n".join(f"{k} = [{', '.join(str(64 * (i + 1)) for i in range(10))}]" for k in ("hidden", "seq", "ffn"))
    axes += "\n" + "\n".join(
        f"{k} = [{', '.join(str(i + 1) for i in range(10))}]" for k in ("layers", "batch", "vocab")
    )
    spec = tmp_path / "huge.toml"
    spec.write_text("[axes]\n" + axes + "\n")
    code, _, err = run_cli(capsys, "sweep", spec, "--dry-run")
    one_line(code, err, "1,000,000 points", "--force")


@pytest.mark.parametrize("value", ["99999999999999999999", "999999"])
def test_sweep_absurd_layers_refused(capsys, tmp_path, value):
    spec = tmp_path / "s.toml"
    spec.write_text(f'[defaults]\nlayers = {value}\n[axes]\ntarget = ["rdu"]\n')
    code, _, err = run_cli(capsys, "sweep", spec, "--dry-run")
    one_line(code, err, "layers")


def test_sweep_unknown_target_exit_2(capsys, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[axes]\ntarget = ["nosuch"]\n')
    code, _, err = run_cli(capsys, "sweep", spec, "-o", tmp_path / "out")
    one_line(code, err, "unknown target")


def _smoke_record(tmp_path: Path):
    from dabench_ir.sweep import load_spec
    from dabench_ir.sweep.runner import point_key

    spec = load_spec("smoke")
    return spec, [point_key(p.params) for p in spec.points]


@pytest.mark.parametrize("content", ["5", "{}", '{"key": 5, "params": [], "status": 1}', "[", "\0\0"])
def test_corrupted_point_files_are_recomputed(tmp_path, content, monkeypatch):
    from dabench_ir.sweep import results
    from dabench_ir.sweep.results import read_point, valid_record

    folder = tmp_path / "points"
    folder.mkdir()
    (folder / "abc.json").write_text(content)
    assert read_point(folder, "abc") is None
    assert not valid_record({"key": "abc", "params": {}, "status": "ok", "report": {"totals": {"time_s": "x"}}})
    assert valid_record({"key": "abc", "params": {}, "status": "ok", "report": {"totals": {"time_s": 1.0}}}, "abc")
    assert results.record_row({"key": "abc", "params": {}, "status": "ok", "report": {}})["key"] == "abc"


def test_sweep_folder_in_a_points_place_and_file_in_folders_place(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "points").write_text("not a folder")
    code, _, err = run_cli(capsys, "sweep", "smoke", "-o", out, "--no-plots", "-q")
    one_line(code, err, "not a folder")


def test_point_locks(tmp_path):
    from dabench_ir.sweep.runner import _Locks

    a, b = _Locks(tmp_path), _Locks(tmp_path)
    assert a.acquire("k") and not b.acquire("k")  # held by a live process (this one)
    a.release("k")
    assert b.acquire("k")
    b.release_all()
    for text in (f"{a.host} 999999999\n", f"{a.host} 1\n", "\x00\xff garbage"):  # dead, unrelated (pid 1), garbage
        (tmp_path / "k.lock").write_text(text, errors="surrogateescape")
        assert a.acquire("k"), text  # no live sweep holds its OS lock: taken over
        assert not b.acquire("k")
        a.release_all()
        assert not (tmp_path / "k.lock").exists()


def test_damaged_cached_base_is_exported_again(tmp_path):
    from dabench_ir.sweep.graphs import load_base

    (tmp_path / "b.onnx").write_bytes(b"\x08\x07garbage")
    assert load_base(tmp_path, "b") is None and not (tmp_path / "b.onnx").exists()
    onnx.save(parse(MM), tmp_path / "c.onnx")
    assert load_base(tmp_path, "c") is not None


def test_two_sweeps_into_one_folder_compute_each_point_once(tmp_path):
    """Two drivers at once: every point is computed by exactly one of them, and none is lost."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dabench_ir", "sweep", "smoke", "-o", str(out), "--jobs", "1", "--no-plots"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    import re

    ran = [int(re.search(r"(\d+) run now", o).group(1)) for o, _ in outs]
    elsewhere = [int(m.group(1)) if (m := re.search(r"(\d+) point\(s\) left to another", o)) else 0 for o, _ in outs]
    assert sum(ran) == 4 and all(r + e <= 4 for r, e in zip(ran, elsewhere, strict=True))
    assert len(list((out / "points").glob("*.json"))) == 4 and not list((out / "points").glob("*.lock"))


# -- messages that name the fix ---------------------------------------------------------------------------
def test_peak_error_suggests_precision(capsys, mm):
    code, _, err = run_cli(capsys, "profile", mm, "--target", "rdu", "--precision", "fp8")
    one_line(code, err, "--precision")


def test_measure_string_input_names_the_type(capsys, tmp_path):
    model = _one_op("Identity", TensorProto.STRING, [3])
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model), "--measure")
    one_line(code, err, "STRING", "without --measure")


def test_native_stderr_is_held_as_warnings(caplog):
    from dabench_ir.mlir.load import captured_stderr

    with caplog.at_level("WARNING"), captured_stderr():
        os.write(2, b"loc(x): warning: something torch-mlir said\n")
    assert any("something torch-mlir said" in r.getMessage() for r in caplog.records)


def test_onnxruntime_log_line_is_not_printed(capsys, tmp_path):
    """A model onnxruntime refuses: our one line only, not its [E:onnxruntime...] line too."""
    model = parse(MM)
    model.graph.node[0].op_type = "MatMulInteger"  # float inputs: onnxruntime refuses the types
    proc = subprocess.run(
        [sys.executable, "-m", "dabench_ir", "profile", str(_save(tmp_path, model)), "--measure"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1 and "[E:onnxruntime" not in proc.stderr, proc.stderr


def _export_gpt2(capsys, tmp_path, layers: str, hidden: str, *flags: str):
    """``dabench-ir export`` of a GPT-2 of ``layers`` and ``hidden`` to ``tmp_path``/x.onnx: code, out, err."""
    return run_cli(
        capsys, "export", "--family", "gpt2", "--layers", layers, "--hidden", hidden, *flags, "-o", tmp_path / "x.onnx"
    )


def test_export_absurd_layers_refused_up_front(capsys, tmp_path):
    code, _, err = _export_gpt2(capsys, tmp_path, "99999999999999999999", "64")
    one_line(code, err, "--layers")


def test_profile_negative_top_refused(capsys, mm):
    code, _, err = run_cli(capsys, "profile", mm, "--top", "-5")
    one_line(code, err, "--top")


def test_sweep_folder_in_a_point_files_place(capsys, tmp_path):
    from dabench_ir.sweep import load_spec
    from dabench_ir.sweep.runner import point_key

    key = point_key(load_spec("smoke").points[0].params)
    (tmp_path / "out" / "points" / f"{key}.json").mkdir(parents=True)
    code, _, err = run_cli(capsys, "sweep", "smoke", "-o", tmp_path / "out", "--no-plots", "-q")
    one_line(code, err, "a folder where a point's record goes")


def test_astronomical_dims_refused_not_looped(capsys, tmp_path):
    big = 2**62
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [big, big])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [big, big])
    c = helper.make_tensor_value_info("C", TensorProto.FLOAT, [big, big])
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "g", [a, b], [c]))
    path = _save(tmp_path, model)
    code, _, err = run_cli(capsys, "profile", path, "--target", "rdu", "--opt-level", "O3")
    one_line(code, err, "far larger than the chip")
    code, _, err = run_cli(capsys, "profile", path, "--target", "wse,ipu,h100", "-q")
    assert code in (0, 2), err


# == issue 33: reads outside the input's folder =====================================================
_POINT = (
    '[[points]]\nid = "p"\nkind = "model"\ntarget = "{target}"\nsource = "t"\n'
    'model = {{ family = "gpt2", layers = {layers}, hidden = 64, heads = 4, seq = 8, batch = 1 }}\n'
    "measured = {{ {measured} }}\n"
)


def _catalogue(tmp_path: Path, *, target: str = "wse", layers: int = 1, measured: str = "samples_per_s = 1.0") -> Path:
    folder = tmp_path / "cat"
    folder.mkdir(exist_ok=True)
    path = folder / "c.toml"
    path.write_text(_POINT.format(target=target, layers=layers, measured=measured))
    return path


@pytest.mark.parametrize("name", ["../SECRET.csv", "/etc/passwd", "link.csv"])
def test_catalogue_file_outside_its_folder_is_refused(capsys, tmp_path, name):
    (tmp_path / "SECRET.csv").write_text("kernel,active_pes\nx,1\n")
    cat = _catalogue(tmp_path, measured=f'kernels_csv = "{name}"')
    (cat.parent / "link.csv").symlink_to(tmp_path / "SECRET.csv")  # a symlink out is outside too
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "measured.kernels_csv", "points outside")


def test_catalogue_kernel_table_without_its_columns(capsys, tmp_path):
    cat = _catalogue(tmp_path, measured='kernels_csv = "k.csv"')
    (cat.parent / "k.csv").write_text("name,pes\nmm0,1\n")
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "no column 'kernel', 'active_pes'")


def test_catalogue_and_spec_target_files_resolve_inside(capsys, tmp_path):
    from importlib import resources

    (tmp_path / "t.toml").write_text((resources.files("dabench_ir.targets") / "sn30.toml").read_text())
    cat = _catalogue(tmp_path, target="../t.toml")
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "target", "points outside")
    spec = tmp_path / "cat" / "s.toml"
    spec.write_text('[defaults]\nlayers = 1\nhidden = 64\ntarget = "../t.toml"\n[axes]\nbatch = [1]\n')
    code, _, err = run_cli(capsys, "sweep", spec, "--dry-run")
    one_line(code, err, "s.toml: target", "points outside")


# == issue 33: file nonsense ==========================================================================
def test_catalogue_share_above_one_and_layers_beyond_the_limit(capsys, tmp_path):
    cat = _catalogue(tmp_path, measured="compute_utilization = 7.5")
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "measured.compute_utilization", "(0, 1]")
    cat = _catalogue(tmp_path, layers=1_000_000_000)
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "model.layers", "10,000")


def test_target_efficiency_above_one(capsys, tmp_path, mm):
    from importlib import resources

    text = (resources.files("dabench_ir.targets") / "sn30.toml").read_text()
    assert "matmul_efficiency" in text or "pcu_efficiency" in text
    bad = tmp_path / "t.toml"
    import re

    bad.write_text(re.sub(r"(pcu_efficiency = \{ value = )[0-9.]+", r"\g<1>5.0", text))
    code, _, err = run_cli(capsys, "profile", mm, "--target", bad)
    one_line(code, err, "pcu_efficiency", "(0, 1]")


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_folder_or_fifo_as_target_or_spec_says_what_it_is(capsys, tmp_path, mm, kind):
    thing = tmp_path / "x.toml"
    os.mkdir(thing) if kind == "folder" else os.mkfifo(thing)
    want = "is a directory" if kind == "folder" else "not a regular file"
    code, _, err = run_cli(capsys, "profile", mm, "--target", thing)
    one_line(code, err, want)
    code, _, err = run_cli(capsys, "sweep", thing, "--dry-run")
    one_line(code, err, want)


def _written_report(capsys, tmp_path: Path, mm: Path, name: str = "r.json") -> dict:
    out = tmp_path / name
    assert run_cli(capsys, "profile", mm, "--target", "rdu", "--json", out, "-q")[0] == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("edit", ["negative time", "no target", "node without name"])
def test_hand_edited_report_given_to_compare_and_diff(capsys, tmp_path, mm, edit):
    doc = _written_report(capsys, tmp_path, mm)
    if edit == "negative time":
        doc["totals"]["time_s"] = -1
    elif edit == "no target":
        del doc["target"]
    else:
        del doc["nodes"][0]["name"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "compare", bad, "-q")
    one_line(code, err, "bad.json")
    code, _, err = run_cli(capsys, "diff", tmp_path / "r.json", bad)
    one_line(code, err, "bad.json")


def test_diff_of_two_different_models_is_refused(capsys, tmp_path, mm):
    _written_report(capsys, tmp_path, mm, "a.json")
    other = _save(tmp_path, parse("agraph (float[2,3] A) => (float[2,3] C) { C = Relu(A) }"), "relu.onnx")
    _written_report(capsys, tmp_path, other, "b.json")
    code, _, err = run_cli(capsys, "diff", tmp_path / "a.json", tmp_path / "b.json")
    one_line(code, err, "different models", "compare")


# == issue 33: graph nonsense =========================================================================
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("agraph (float[4,7] A) => (float[4,7] C) { C = MatMul(A) }", "MatMul takes 2"),
        ("agraph (float[4,7] A, float[64,64] B) => (float[4,64] C) { C = MatMul(A, B) }", "Incompatible dimensions"),
        ("agraph (float[4,7] A) => (float[4,7] C) { C = Relu(X) }", "reads tensor 'X'"),
        ("agraph (float[4,7] A) => (float[4,7] C) { C = Relu(A)\n C = Relu(A) }", "defined twice"),
    ],
)
def test_miswired_graphs(capsys, tmp_path, text, needle):
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, parse(text)))
    one_line(code, err, needle)


def test_duplicate_initializer_names(capsys, tmp_path):
    model = parse(MM)
    w = helper.make_tensor("B", TensorProto.FLOAT, [3, 4], [0.0] * 12)
    model.graph.initializer.extend([w, w])
    code, _, err = run_cli(capsys, "profile", _save(tmp_path, model))
    one_line(code, err, "two initializers are named 'B'")


# == issue 33: overwrites and lost outputs ============================================================
@pytest.mark.parametrize(
    ("model_name", "flags", "needle"),
    [
        ("m.roles.csv", ("--csv", "m.csv"), "is an input of this run"),
        ("mm.onnx", ("--json", "r.roles.csv", "--csv", "r.csv"), "writes the same file"),
        ("mm.onnx", ("--json", "out.x", "--csv", "out.x"), "writes the same file"),
        ("mm.onnx", ("--target", "rdu", "--trace", "t.json", "--html", "t.json"), "writes the same file"),
        ("mm.onnx", ("--target", "rdu", "--plots", "p", "--json", "p/mm-roofline.png"), "writes the same file"),
    ],
)
def test_one_run_never_writes_over_an_input_or_its_own_outputs(capsys, tmp_path, mm, model_name, flags, needle):
    model = tmp_path / model_name
    if model != mm:
        model.write_bytes(mm.read_bytes())
    before = model.read_bytes()
    code, _, err = run_cli(capsys, "profile", model, *[tmp_path / f if "." in f or f == "p" else f for f in flags])
    one_line(code, err, needle)
    assert model.read_bytes() == before


def test_demo_model_inside_its_output_folder(capsys, tmp_path, mm):
    rep = tmp_path / "rep"
    rep.mkdir()
    model = rep / "index.html"
    model.write_bytes(mm.read_bytes())
    code, _, err = run_cli(capsys, "demo", "-o", rep, "--model", model, "--no-measure", "--no-validate")
    one_line(code, err, "inside this output folder")
    assert model.read_bytes() == mm.read_bytes()


def test_study_runs_a_repeated_pipeline_and_an_alias_once(capsys, tmp_path, mm):
    out = tmp_path / "s.json"
    code, _, err = run_cli(
        capsys,
        "study",
        mm,
        "--pipeline",
        "none,none,ort-basic,ort-basic",
        "--target",
        "rdu,rdu,sn30",
        "--json",
        out,
        "-q",
    )
    assert code == 0, err
    runs = json.loads(out.read_text())["runs"]
    assert [(r["pipeline"], r["target"]) for r in runs] == [("ort-basic", "sn30")]


# == issue 33: inputs that take long, messages that mislead ===========================================
def test_export_random_weights_beyond_free_memory(capsys, tmp_path, monkeypatch):
    import dabench_ir.models.export as export

    monkeypatch.setattr(export, "_available_memory", lambda: 2**30)
    code, _, err = _export_gpt2(capsys, tmp_path, "2", "4096", "--weights", "random", "--max-weight-bytes", "4e18")
    one_line(code, err, "memory free")
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("argv", [("profile", "{mm}", "--json", "-"), ("profile", "{mm}"), ("targets",)])
def test_stdout_on_a_full_disk_is_one_line_exit_2(tmp_path, mm, argv):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    cmd = [sys.executable, "-m", "dabench_ir", *[a.format(mm=mm) for a in argv]]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    one_line(proc.returncode, proc.stderr, "standard output")


def test_calibrate_json_to_a_full_device_fails_before_measuring(capsys):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    code, out, err = run_cli(capsys, "calibrate", "--json", "/dev/full")
    one_line(code, err, "refuses writes")
    assert out == ""
