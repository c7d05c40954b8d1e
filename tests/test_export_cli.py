"""`dabench-ir export`: presets listing, user errors (exit 2, one line), a tiny export, lazy torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dabench_ir.cli import main


def test_list_presets(capsys) -> None:
    assert main(["export", "--list-presets"]) == 0
    out = capsys.readouterr().out
    for name in ("gpt2-small", "gpt2-xl", "llama-7b", "llama-70b", "dabench-gpt2-h1600"):
        assert name in out


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["--family", "llama", "--layers", "2", "--hidden", "64", "--heads", "6"], "heads"),
        (["--family", "llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "3"], "kv_heads"),
        (["--family", "gpt2", "--layers", "0", "--hidden", "64"], "layers"),
        (["--family", "gpt2", "--hidden", "64"], "--layers"),
        (["--preset", "nope"], "unknown preset"),
        (["--preset", "llama-7b", "--weights", "random"], "--max-weight-bytes"),
        # accepted and ignored before: exit 0, nothing listed, exported or changed
        (["--list-presets", "--preset", "llama-7b"], "--list-presets lists the presets and exports nothing"),
        (["--preset", "llama-7b", "--dynamic", "--seq", "16"], "--dynamic makes batch, seq"),
        (["--preset", "llama-7b", "--phase", "decode", "--dynamic", "--context", "9"], "--context has no effect"),
        (["--preset", "gpt2-small", "--max-weight-bytes", "8GiB"], "a larger cap has no effect"),
        # a traceback after the export before
        (["--preset", "gpt2-small", "--seed", str(2**64)], "--seed 18446744073709551616: expected an integer"),
    ],
)
def test_user_errors_exit_2_with_one_line(capsys, tmp_path, argv: list[str], word: str) -> None:
    assert main(["export", *argv, "-o", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and "\n" not in err and "Traceback" not in err


def test_command_module_does_not_import_torch() -> None:
    code = "import sys, dabench_ir.cli as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_an_mlir_export_is_named_as_profile_reads_it(capsys, tmp_path) -> None:
    """profile reads a file by its suffix: an MLIR export named ``y`` was read back as ONNX and failed."""
    assert main(["export", "--preset", "gpt2-small", "--format", "mlir-torch", "-o", str(tmp_path / "y")]) == 2
    assert "name it y.mlir" in capsys.readouterr().err


@pytest.mark.slow
def test_an_export_to_stdout_is_the_model_alone(tmp_path) -> None:
    """``-o -``: the model on stdout, the summary on stderr (it was appended to the model's bytes)."""
    onnx = pytest.importorskip("onnx")
    argv = ["export", "--family", "gpt2", "--layers", "1", "--hidden", "32", "--heads", "4", "--seq", "8", "-o", "-"]
    proc = subprocess.run([sys.executable, "-m", "dabench_ir", *argv], capture_output=True, check=True)
    assert len(onnx.load_from_string(proc.stdout).graph.node) > 0 and b"wrote -" in proc.stderr


@pytest.mark.slow
def test_tiny_export(capsys, tmp_path) -> None:
    pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    path = tmp_path / "m.onnx"
    argv = [
        "export",
        "--family",
        "llama",
        "--layers",
        "2",
        "--hidden",
        "32",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--seq",
        "8",
        "--weights",
        "none",
        "-o",
        str(path),
    ]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    model = onnx.load(path)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["dabench.family"] == "llama"
    assert json.loads(meta["dabench.params"])["kv_heads"] == 2


@pytest.mark.parametrize(
    ("text", "size"),
    [("4GiB", 4 << 30), ("4294967296", 4 << 30), ("4e9", 4_000_000_000), ("512MB", 512_000_000), ("1k", 1024)],
)
def test_a_byte_size_parses_the_same_for_export_and_profile(text, size):
    """One parser for every flag that takes bytes (issue 43: export took 4GiB, profile refused it)."""
    from dabench_ir.commands.export import _byte_size
    from dabench_ir.options import KNOBS

    assert _byte_size(text) == KNOBS["max_weight_bytes"].validate(text) == size


@pytest.mark.parametrize("text", ["0", "-1", "lots", "1.5x"])
def test_a_bad_byte_size_is_refused_alike(text, capsys):
    from dabench_ir.cli import main

    assert main(["export", "--family", "gpt2", "--layers", "1", "--max-weight-bytes", text, "-o", "x.onnx"]) == 2
    assert f"not a size: {text!r}" in capsys.readouterr().err
    assert main(["profile", "gpt2-small", "--max-weight-bytes", text]) == 2
    assert f"not a size: {text!r}" in capsys.readouterr().err


@pytest.mark.slow
def test_a_model_with_external_data_exports_again_over_itself(tmp_path, monkeypatch) -> None:
    """Weights above protobuf's cap go to PATH.data: onnx refuses a data file name that exists relative
    to the working directory, so the same export twice in its output folder failed with a traceback
    after the work (a 439 M-parameter model: 27 s)."""
    onnx = pytest.importorskip("onnx")
    from dabench_ir.models import export

    monkeypatch.setattr(export, "_EXTERNAL_DATA_BYTES", 1000)  # a tiny model takes the large path
    monkeypatch.chdir(tmp_path)  # onnx looks for the data file's name relative to the working directory
    argv = ["export", "--family", "gpt2", "--layers", "1", "--hidden", "32", "--heads", "4", "--seq", "8"]
    path = tmp_path / "m.onnx"
    for _ in range(2):
        assert main([*argv, "--weights", "random", "-o", str(path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    onnx.checker.check_model(str(path), full_check=True)
