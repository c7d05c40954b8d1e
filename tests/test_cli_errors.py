"""Bad input: exit code 2 and one line saying what is wrong, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

from dabench_ir.cli import main
from tests.conftest import parse


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0]


def test_missing_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "profile", str(tmp_path / "nope.onnx"))
    assert_one_line_error(code, err, "no such file")


def test_directory(capsys, tmp_path):
    code, _, err = run_cli(capsys, "profile", str(tmp_path))
    assert_one_line_error(code, err, "is a directory")


def test_not_onnx(capsys, tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("these are my notes, not a model\n" * 20)
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "notes.onnx")


def test_truncated_onnx(capsys, tmp_path, tiny_matmul_path):
    data = tiny_matmul_path.read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "cut.onnx", "ONNX")


def test_custom_domain_not_imported(capsys, tmp_path):
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "com.example", "opset_import")


def test_custom_domain_op_declared_is_estimated_not_an_error(capsys, tmp_path):
    model = parse(
        """<ir_version: 9, opset_import: ["" : 18, "com.example" : 1]>
        agraph (float[4] x) => (float[4] y) { y = com.example.Frobnicate(x) }"""
    )
    path = tmp_path / "declared.onnx"
    onnx.save(model, path)
    code, out, _ = run_cli(capsys, "profile", str(path))
    assert code == 0
    assert "estimated  1 node(s) without a cost rule" in out and "com.example::Frobnicate" in out
    code, _, err = run_cli(capsys, "profile", str(path), "--strict", "--quiet")
    assert_one_line_error(code, err, "without a cost rule", "Frobnicate")


def test_external_data_outside_folder_is_refused_without_opening(capsys, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 64)
    folder = tmp_path / "model"
    folder.mkdir()
    weight = helper.make_tensor("W", TensorProto.FLOAT, [4, 4], vals=[0.0] * 16)
    weight.ClearField("float_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "64")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    path = _matmul_model(folder / "m.onnx", weight)
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "outside", "../secret.bin")


def _matmul_model(path, weight):
    """``x[2,4] @ W`` with the initializer ``weight`` (its data wherever the test puts it), written to ``path``."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[weight],
    )
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    return path


def test_absent_external_data_inside_folder_still_profiles(capsys, tmp_path):
    weight = helper.make_tensor("W", TensorProto.FLOAT, [4, 4], vals=[0.0] * 16)
    weight.ClearField("float_data")
    weight.data_location = TensorProto.EXTERNAL
    entry = weight.external_data.add()
    entry.key, entry.value = "location", "weights.bin"  # never written: weights are not needed
    path = _matmul_model(tmp_path / "m.onnx", weight)
    code, out, _ = run_cli(capsys, "profile", str(path))
    assert code == 0
    assert "16 params" in out


def test_unknown_target(capsys, tiny_matmul_path):
    code, _, err = run_cli(capsys, "profile", str(tiny_matmul_path), "--target", "tpu9000")
    assert_one_line_error(code, err, "tpu9000")


@pytest.mark.parametrize("bad", ["batch", "batch=", "=4", "batch=x", "batch=0", "batch=-1"])
def test_malformed_dim(capsys, tiny_matmul_path, bad):
    code, _, err = run_cli(capsys, "profile", str(tiny_matmul_path), "--dim", bad)
    assert_one_line_error(code, err, "--dim", "NAME=VALUE")


def test_unbound_symbol_lists_every_symbol_and_the_flag(capsys, tmp_path):
    model = parse("agraph (float[batch,seq,8] A, float[8,4] B) => (float[batch,seq,4] C) { C = MatMul(A, B) }")
    path = tmp_path / "sym.onnx"
    onnx.save(model, path)
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "batch", "seq", "--dim batch=N", "--dim seq=N")
    code, _out, _ = run_cli(capsys, "profile", str(path), "--dim", "batch=2", "--dim", "seq=3")
    assert code == 0


def test_unknown_dim_name(capsys, tiny_matmul_path):
    code, _, err = run_cli(capsys, "profile", str(tiny_matmul_path), "--dim", "batch=2")
    assert_one_line_error(code, err, "no symbolic dim 'batch'")


def test_usage_error_is_exit_2(capsys):
    code, _, err = run_cli(capsys, "profile")
    assert_one_line_error(code, err, "MODEL")


def test_subprocess_help_and_error_have_no_traceback(tmp_path):
    for argv in (["--help"], ["profile", "--help"]):
        done = subprocess.run([sys.executable, "-m", "dabench_ir", *argv], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "usage:" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "dabench_ir", "profile", str(tmp_path / "missing.onnx")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr


def test_batch_on_a_fixed_batch_model(capsys, tiny_matmul_path):
    code, _, err = run_cli(capsys, "profile", str(tiny_matmul_path), "--batch", "8")
    assert_one_line_error(code, err, "no batch dimension")  # a [2,3] x [3,4] MatMul is one sample
    assert main(["profile", str(tiny_matmul_path), "--batch", "1", "--quiet"]) == 0


def test_batch_on_a_fixed_batch_export(capsys, tmp_path):
    from dabench_ir.models import ModelConfig, export_model

    pytest.importorskip("torch")
    path = tmp_path / "b2.onnx"
    export_model(ModelConfig(family="gpt2", layers=1, hidden=32, heads=2, seq=4, vocab=16, batch=2), path, weights="none")
    code, _, err = run_cli(capsys, "profile", str(path), "--batch", "8")
    assert_one_line_error(code, err, "fixed at 2", "--dynamic")
    assert main(["profile", str(path), "--batch", "2", "--quiet"]) == 0


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory):
    """A one-block weight-free GPT-2 export (token ids [2, 4]): a model every target places."""
    pytest.importorskip("torch")
    from dabench_ir.models import ModelConfig, export_model

    path = tmp_path_factory.mktemp("knobs") / "d.onnx"
    export_model(ModelConfig(family="gpt2", layers=1, hidden=32, heads=2, seq=4, vocab=16, batch=2), path, weights="none")
    return path


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["-t", "h100", "--opt-level", "O3"], ["--opt-level applies to rdu targets", "h100"]),
        (["-t", "cpu", "--ipus", "4"], ["--ipus applies to ipu targets"]),
        (["-t", "h100", "--replicas", "4"], ["--replicas applies to ipu, wse targets"]),
        (["--opt-level", "O3"], ["give --target"]),
        (["-t", "rdu", "--recompute", "full"], ["--recompute full applies to training"]),
        (["-t", "ipu", "--optimizer-state", "offchip"], ["--optimizer-state offchip applies to training"]),
        (["-t", "h100", "--precision", "int8", "--mode", "train"], ["--precision int8 is an inference"]),
        (["-t", "wse", "--replicas", "10000000"], ["--replicas 10,000,000", "850,000 compute units"]),
    ],
)
def test_a_knob_that_cannot_apply_is_refused_never_ignored(capsys, tiny_decoder, flags, needles):
    code, _, err = run_cli(capsys, "profile", str(tiny_decoder), "-q", *flags)
    assert_one_line_error(code, err, *needles)


def test_zero_applies_to_data_parallel_training_only(capsys, tiny_decoder):
    code, _, err = run_cli(capsys, "scale", str(tiny_decoder), "-t", "a100", "--chips", "1,2", "--strategy", "dp",
                           "--zero", "3", "-q")  # fmt: skip
    assert_one_line_error(code, err, "--zero 3 applies to training")
    code, _, err = run_cli(capsys, "scale", str(tiny_decoder), "-t", "a100", "--chips", "1,2", "--strategy", "tp",
                           "--zero", "1", "--mode", "train", "-q")  # fmt: skip
    assert_one_line_error(code, err, "applies to --strategy dp, not --strategy tp")
