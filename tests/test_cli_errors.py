"""Bad input: exit code 2 and one line saying what is wrong, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dabench_ir.cli import main
from tests._helpers import weightless
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


@pytest.mark.parametrize("bad", ["batch", "batch=", "=4", "batch=x", "batch=-1"])
def test_malformed_dim(capsys, tiny_matmul_path, bad):
    code, _, err = run_cli(capsys, "profile", str(tiny_matmul_path), "--dim", bad)
    assert_one_line_error(code, err, "--dim", "NAME=VALUE")


def test_a_dim_of_zero_is_only_an_empty_kv_cache(capsys, tiny_matmul_path):
    code, _, err = run_cli(capsys, "profile", str(tiny_matmul_path), "--dim", "batch=0")
    assert_one_line_error(code, err, "--dim batch=0", "only a KV cache's length may be 0")


def test_unbound_symbol_lists_every_symbol_and_the_flag(capsys, tmp_path):
    model = parse("agraph (float[batch,seq,8] A, float[8,4] B) => (float[batch,seq,4] C) { C = MatMul(A, B) }")
    path = tmp_path / "sym.onnx"
    onnx.save(model, path)
    code, _, err = run_cli(capsys, "profile", str(path))
    assert_one_line_error(code, err, "batch", "seq", "--batch N", "--seq N")  # the flags that bind them
    code, _out, _ = run_cli(capsys, "profile", str(path), "--dim", "batch=2", "--dim", "seq=3")
    assert code == 0
    code, _out, err = run_cli(
        capsys, "study", str(path), "--pipeline", "ort-basic", "-t", "rdu", "--batch", "2", "--seq", "3", "-q"
    )
    assert code == 0, err  # study binds the sequence length like profile and scale


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
    path = weightless(tmp_path / "b2.onnx", family="gpt2", layers=1, hidden=32, heads=2, seq=4, vocab=16, batch=2)
    code, _, err = run_cli(capsys, "profile", path, "--batch", "8")
    assert_one_line_error(code, err, "fixed at 2", "--dynamic")
    assert main(["profile", str(path), "--batch", "2", "--quiet"]) == 0


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory):
    """A one-block weight-free GPT-2 export (token ids [2, 4]): a model every target places."""
    path = tmp_path_factory.mktemp("knobs") / "d.onnx"
    return Path(weightless(path, family="gpt2", layers=1, hidden=32, heads=2, seq=4, vocab=16, batch=2))


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
        (["-t", "h100", "--prompt", "8", "--gen", "4"], ["--gen applies to --scenario generate"]),
        (["-t", "h100", "--warmup", "4"], ["--warmup applies to an onnxruntime run", "add --measure"]),
        (["--max-weight-bytes", "4GiB"], ["--max-weight-bytes applies to an onnxruntime run"]),
        (["-t", "h100", "--threads", "1"], ["--threads applies to an onnxruntime run or to the host cpu"]),
        (
            ["-t", "h100", "--scenario", "generate", "--prompt", "8", "--gen", "2", "--via", "mlir"],
            ["--via mlir is not available with --scenario generate", "drop --via"],
        ),
    ],
)
def test_a_knob_that_cannot_apply_is_refused_never_ignored(capsys, tiny_decoder, flags, needles):
    code, _, err = run_cli(capsys, "profile", str(tiny_decoder), "-q", *flags)
    assert_one_line_error(code, err, *needles)


def test_a_refused_knob_on_the_host_cpu_is_refused_before_calibrating_it(capsys, tiny_decoder, tmp_path, monkeypatch):
    """The host ``cpu`` is measured on first use (15-60 s): a question that cannot be asked never waits for it."""
    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path / "cache"))
    code, _, err = run_cli(capsys, "profile", str(tiny_decoder), "-t", "cpu", "--ipus", "4")
    assert_one_line_error(code, err, "--ipus applies to ipu targets, not cpu")
    assert not (tmp_path / "cache").exists()


def test_zero_applies_to_data_parallel_training_only(capsys, tiny_decoder):
    code, _, err = run_cli(
        capsys, "scale", str(tiny_decoder), "-t", "a100", "--chips", "1,2", "--strategy", "dp", "--zero", "3", "-q"
    )
    assert_one_line_error(code, err, "--zero 3 applies to training")
    code, _, err = run_cli(
        capsys,
        "scale",
        str(tiny_decoder),
        "-t",
        "a100",
        "--chips",
        "1,2",
        "--strategy",
        "tp",
        "--zero",
        "1",
        "--mode",
        "train",
        "-q",
    )
    assert_one_line_error(code, err, "applies to --strategy dp, not --strategy tp")


# == issue 32/33: no flag accepted and ignored, one spelling per flag, no nonsense option ========================
# (this section: the flags32 helper; each case is a real CLI run in-process)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["-t", "wse", "--wse-mode", "streaming", "--replicas", "4"], ["weight streaming runs one copy"]),
        (
            ["-t", "wse", "--wse-mode", "pipelined", "--micro-batches", "1"],
            ["--micro-batches 1 splits the batch into weight streaming's lanes", "--wse-mode streaming"],
        ),
        (
            ["-t", "h100", "--strategy", "dp"],
            ["--strategy applies to a run over several chips", "--chips a count above 1"],
        ),
        (["-t", "h100", "--zero", "1", "--mode", "train"], ["--zero applies to a run over several chips"]),
        (["--chips", "2", "--strategy", "dp"], ["--chips places the model over several chips", "give --target"]),
        (
            ["-t", "wse", "--chips", "2", "--strategy", "dp", "--mode", "train", "--zero", "1"],
            ["--zero applies to gpu targets, not wse2"],
        ),
        (["-t", "a100", "--chips", "2", "--strategy", "dp", "--zero", "3"], ["--zero 3 applies to training"]),
        (
            ["-t", "a100", "--chips", "2", "--strategy", "tp", "--zero", "1", "--mode", "train"],
            ["--zero 1 applies to --strategy dp, not --strategy tp"],
        ),
        (["-t", "h100", "--micro-batch-size", "1"], ["--micro-batch-size 1 applies to training"]),
        (
            ["-t", "bow", "--replicated-tensor-sharding", "false"],
            ["--replicated-tensor-sharding false applies to training"],
        ),
        (["-t", "rdu", "--threads", "100000"], ["--threads", "at most", "CPUs"]),
        (["-t", "rdu", "--rdu-host-loop", "production"], ["--rdu-host-loop production applies to training"]),
        (["-t", "h100", "--mode", "train", "--rdu-host-loop", "production"], ["applies to rdu targets, not h100"]),
        (
            ["-t", "h100", "--mode", "train", "--recompute", "selective"],
            ["--recompute selective", "h100's default", "--fused-attention false"],
        ),
        (["-t", "cpu", "--micro-batches", "1"], ["--micro-batches 1 on cpu", "in one call", "drop it"]),
        (
            ["-t", "cpu", "--mode", "train", "--micro-batch-size", "1"],
            ["--micro-batch-size 1 on cpu (cpu) in training", "drop it"],
        ),
    ],
)
def test_profile_refuses_a_knob_where_the_table_says_it_does_not_apply(capsys, tiny_decoder, argv, needles):
    code, _, err = run_cli(capsys, "profile", str(tiny_decoder), "-q", *argv)
    assert_one_line_error(code, err, *needles)


def test_a_knob_applies_check_is_the_one_table(tiny_decoder):
    """The refusals above come from the declarations, not from per-command code: a knob declared for
    training only, or for one target kind, is refused wherever the table says it does not apply."""
    from dabench_ir.options import KNOBS

    assert KNOBS["zero"].modes == {"train"} and KNOBS["zero"].strategies == {"dp"} and KNOBS["zero"].targets == {"gpu"}
    assert {n for n, k in KNOBS.items() if k.modes == {"train"}} == {
        "recompute",
        "micro_batch",
        "optimizer_state",
        "rdu_host_loop",
        "replicated_tensor_sharding",
        "zero",
    }
    assert KNOBS["micro_batch"].flag == "--micro-batch-size" and KNOBS["micro_batch"].aliases == ("--micro-batch",)


def test_profile_over_several_chips_with_zero_runs_and_records_it(capsys, tiny_decoder, tmp_path):
    out = tmp_path / "r.json"
    code, _, err = run_cli(
        capsys,
        "profile",
        str(tiny_decoder),
        "-t",
        "a100",
        "--chips",
        "2",
        "--strategy",
        "dp",
        "--mode",
        "train",
        "--zero",
        "1",
        "-q",
        "--json",
        str(out),
    )
    assert code == 0, err
    import json

    config = json.loads(out.read_text())["config"]
    assert (config["chips"], config["strategy"], config["zero"], config["samples"]["per_step"]) == (2, "dp", 1, 4)


def test_annotate_with_several_targets_writes_one_model_per_target(capsys, tiny_decoder, tmp_path):
    code, out, err = run_cli(
        capsys, "profile", str(tiny_decoder), "-t", "wse,rdu", "--annotate", str(tmp_path / "a.onnx")
    )
    assert code == 0, err
    for name in ("a-wse.onnx", "a-rdu.onnx"):
        model = onnx.load(tmp_path / name)
        units = {p.value for n in model.graph.node for p in n.metadata_props if p.key == "dabench.unit"}
        assert units and f"wrote {tmp_path / name}" in out
    assert not (tmp_path / "a.onnx").exists()
    code, _, err = run_cli(
        capsys, "profile", str(tiny_decoder), "-t", "wse,rdu", "-q", "--annotate", f"{tmp_path}/ann/"
    )
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "ann").iterdir()) == ["rdu.onnx", "wse.onnx"]
    code, _, err = run_cli(capsys, "profile", str(tiny_decoder), "-t", "wse,rdu", "-q", "--annotate", f"{tmp_path}/ann")
    assert code == 0, err  # the folder exists now: written into, as --json DIR does


def test_a_per_target_file_that_is_the_input_is_refused(capsys, tiny_decoder, tmp_path):
    """``--annotate s.onnx`` over wse and rdu writes s-wse.onnx and s-rdu.onnx: when the model is
    s-wse.onnx it would be written over (it was, exit 0); and two outputs may not share a file."""
    model = tmp_path / "s-wse.onnx"
    model.write_bytes(tiny_decoder.read_bytes())
    code, _, err = run_cli(capsys, "profile", str(model), "-t", "wse,rdu", "--annotate", str(tmp_path / "s.onnx"))
    assert_one_line_error(code, err, "--annotate", "s-wse.onnx: is an input of this run")
    assert model.read_bytes() == tiny_decoder.read_bytes()
    code, _, err = run_cli(
        capsys,
        "profile",
        str(tiny_decoder),
        "-t",
        "wse,rdu",
        "--annotate",
        str(tmp_path / "x.onnx"),
        "--json",
        str(tmp_path / "x-wse.onnx"),
    )
    assert_one_line_error(code, err, "writes the same file")


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--pipeline", "rdu-O3", "--target", "h100"], ["--pipeline rdu-O3 applies to rdu targets only", "h100"]),
        (["--pipeline", "rdu-O3", "--target", "wse"], ["--pipeline rdu-O3 applies to rdu targets only", "wse"]),
        (["--pipeline", "rdu-O3"], ["no --target was given"]),
        (
            ["--pipeline", "ort-basic", "--target", "h100", "--scenario", "generate"],
            ["study has no --scenario", "profile"],
        ),
        (["--pipeline", "ort-basic", "--target", "h100", "--chips", "4"], ["--chips 4 needs --strategy"]),
        (["--pipeline", "ort-basic", "--strategy", "dp"], ["--strategy", "several chips"]),
    ],
)
def test_study_refuses_what_it_would_ignore(capsys, tiny_decoder, argv, needles):
    code, _, err = run_cli(capsys, "study", str(tiny_decoder), "-q", *argv)
    assert_one_line_error(code, err, *needles)


def test_study_places_over_several_chips(capsys, tiny_decoder, tmp_path):
    import json

    code, _, err = run_cli(
        capsys,
        "study",
        str(tiny_decoder),
        "--pipeline",
        "ort-basic",
        "-t",
        "h100",
        "--chips",
        "2",
        "--strategy",
        "dp",
        "-q",
        "-o",
        str(tmp_path),
    )
    assert code == 0, err
    report = json.loads((tmp_path / f"{tiny_decoder.stem}.ort-basic.h100.json").read_text())
    assert (report["config"]["chips"], report["config"]["strategy"], report["config"]["samples"]["per_step"]) == (
        2,
        "dp",
        4,
    )


def test_a_failing_pipeline_is_its_row_and_the_study_goes_on(capsys, tiny_decoder, tmp_path):
    import json

    from dabench_ir.study import pipelines
    from dabench_ir.study.pipelines import OnnxRewritePass, Pipeline

    def broken(model, workdir):
        return [][0]  # an optimiser's own bug: IndexError

    pipelines.register_pipeline(
        Pipeline(
            "broken-test", "raises", lambda out: [OnnxRewritePass(name="broken-test", rewrite=broken, out_dir=out)]
        ),
        replace=True,
    )
    try:
        code, out, err = run_cli(
            capsys,
            "study",
            str(tiny_decoder),
            "--pipeline",
            "broken-test,ort-basic",
            "-t",
            "h100",
            "--json",
            str(tmp_path / "s.json"),
        )
    finally:
        pipelines._PIPELINES.pop("broken-test")
    assert_one_line_error(code, err, "1 pipeline(s) failed: broken-test", "list index out of range")
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [r["pipeline"] for r in doc["runs"]] == ["ort-basic"]
    assert doc["failed"][0]["pipeline"] == "broken-test" and doc["failed"][0]["targets"] == ["h100"]
    assert "broken-test: failed: pipeline pass 'broken-test' failed" in out


def test_diff_names_itself_in_its_header(capsys, tiny_decoder, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        assert main(["profile", str(tiny_decoder), "-t", "rdu", "-q", "--json", str(path)]) == 0
    code, out, err = run_cli(capsys, "diff", str(a), str(b))
    assert code == 0, err
    assert out.startswith(f"dabench-ir diff: {tiny_decoder} (baseline: {a})")


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        ("export --family gpt2 --layers 1 --hidden 64 --phase decode --context 4 --chunk 0 -o x.onnx", ["--chunk 0"]),
        (
            "export --family gpt2 --layers 1 --hidden 64 --format mlir-linalg -o x.onnx",
            ["--format mlir-linalg writes a .mlir file", "x.mlir"],
        ),
        ("export --family gpt2 --layers 1 --hidden 64 -o x.mlir", ["give --format mlir-"]),
        ("export --preset gpt2 --format onnx -o x.mlir", ["--format onnx writes a .onnx file"]),
        ("export --family gpt2 --layers 10001 --hidden 64 -o x.onnx", ["at most 10,000"]),
        ("calibrate --threads 100000", ["--threads", "at most"]),
        ("calibrate --threads 0", ["--threads", "positive"]),
        ("sweep smoke --annotate x", ["sweep has no --annotate", "profile"]),
    ],
)
def test_nonsense_options_of_other_commands(capsys, tmp_path, monkeypatch, argv, needles):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv.split())
    assert_one_line_error(code, err, *needles)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_the_layer_limit_is_one_constant():
    """Export, sweep and validate read one limit, options.MAX_LAYERS; no module keeps a copy."""
    import dabench_ir
    from dabench_ir import options

    assert options.MAX_LAYERS == 10_000
    root = Path(dabench_ir.__file__).resolve().parent.parent
    for path in [*root.glob("dabench_ir/**/*.py"), *root.glob("models/*.py")]:
        text = path.read_text()
        assert "MAX_LAYERS =" not in text or path.name == "options.py", path


def test_preset_aliases_name_the_canonical_preset(capsys):
    from dabench_ir.models import PRESETS, get_preset

    assert get_preset("gpt2").preset == "gpt2-small" and get_preset("Llama-2-13b").preset == "llama-13b"
    assert "gpt2" in PRESETS and "gpt2" not in list(PRESETS) and PRESETS["GPT2"] is PRESETS["gpt2-small"]
    code, out, _ = run_cli(capsys, "export", "--list-presets")
    assert code == 0 and "gpt2 = gpt2-small" in out


@pytest.mark.parametrize(
    ("argv", "dest", "value", "new"),
    [
        (["demo", "--targets", "rdu"], "targets", "rdu", "--target"),
        (["study", "m.onnx", "--out-dir", "d"], "out_dir", "d", "--output"),
        (["scale", "m.onnx", "-t", "rdu", "--plot", "p.png"], "plot", "p.png", "--plots DIR"),
        (["profile", "m.onnx", "--micro-batch", "2"], "micro_batch", "2", "--micro-batch-size"),
    ],
)
def test_an_old_spelling_still_works_with_one_deprecation_line(argv, dest, value, new):
    from dabench_ir.cli import build_parser
    from dabench_ir.options import DEPRECATED

    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert getattr(args, DEPRECATED) == [f"{argv[-2]} is deprecated and will be removed; use {new}"]


def test_an_old_spelling_prints_its_line_after_the_run(capsys, tiny_decoder):
    code, _, err = run_cli(
        capsys, "profile", str(tiny_decoder), "-t", "h100", "--mode", "train", "--micro-batch", "1", "-q"
    )
    assert code == 0
    assert err.strip().splitlines() == [
        "WARNING dabench_ir.cli: --micro-batch is deprecated and will be removed; use --micro-batch-size"
    ]


def test_help_shows_one_spelling_per_flag():
    from dabench_ir.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {name: p.format_help() for name, p in sub.choices.items()}
    for old in ("--micro-batch ", "--targets", "--out-dir", "--plot "):
        assert not [name for name, text in helps.items() if old in text], old
    study = {s for a in sub.choices["study"]._actions for s in a.option_strings}
    assert "--zero" in helps["profile"] and "--zero" in study and "--scenario" not in study
    assert "smoke" in helps["sweep"]  # the bundled specs, listed


def test_an_abbreviated_flag_is_refused_not_completed(capsys):
    """argparse completes a unique prefix by default: ``profile --layers 1`` ran as
    ``--layers-per-ipu 1`` on an IPU. A flag is taken only as written."""
    code, out, err = run_cli(capsys, "profile", "gpt2-small", "-t", "bow", "--layers", "1")
    assert code == 2 and out == ""
    assert err.strip() == "dabench-ir: error: profile has no --layers; it is a flag of export"
    code, _, err = run_cli(capsys, "profile", "gpt2-small", "-t", "bow", "--micro", "2")
    assert code == 2 and "unrecognized arguments: --micro 2" in err


def test_every_flag_of_every_command_says_what_it_does():
    """`--help` explains each flag; a flag declared without help shows as a bare name (scale's --target
    and --quiet, profile's --no-color and the --scaling rule were)."""
    from dabench_ir.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    bare = [
        (name, action.option_strings or action.dest)
        for name, command in sub.choices.items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert bare == []


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "-q", "--no-measure", "--no-validate", "-t", "rdu"],
        ["export", "--preset", "gpt2-small", "--weights", "none"],
        ["profile", "gpt2-small", "-t", "rdu", "-q"],
    ],
)
def test_an_export_without_the_export_extra_says_what_to_install(capsys, tmp_path, monkeypatch, argv):
    """``pip install .`` without ``[export]``: every command that exports a model says which module is
    missing and what to install, in one line (it was `No module named 'onnx_ir'` from inside torch)."""
    import sys

    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "onnx_ir", None)  # as if not installed: find_spec gives None
    out = ["-o", str(tmp_path / ("demo" if argv[0] == "demo" else "m.onnx"))] if argv[0] != "profile" else []
    code, _, err = run_cli(capsys, *argv, *out)
    assert_one_line_error(code, err, "onnx_ir not installed", "pip install 'dabench-ir[export]'")


def test_a_sequence_longer_than_the_learned_position_table_is_refused(capsys, tmp_path):
    """GPT-2's positions are a table: a --seq past its rows would index nothing; refused in one line."""
    path = weightless(
        tmp_path / "g.onnx",
        family="gpt2",
        layers=1,
        hidden=32,
        heads=2,
        seq=8,
        vocab=16,
        max_positions=16,
        dynamic=True,
    )
    code, _, err = run_cli(capsys, "profile", path, "-t", "rdu", "--seq", "17", "--batch", "1", "-q")
    assert_one_line_error(code, err, "sequence 17", "pos_embed.weight has 16 rows", "at most 16")
    code, _, _ = run_cli(capsys, "profile", path, "-t", "rdu", "--seq", "16", "--batch", "1", "-q")
    assert code == 0


def test_a_quantised_precision_through_linalg_is_refused_in_one_line(capsys, tiny_decoder):
    """A float precision is applied at import (tests/test_mlir_precision.py; it was an internal
    PassError about a missing op-class annotation); a quantised one is refused in one line, saying why."""
    pytest.importorskip("torch_mlir")
    code, _, _ = run_cli(capsys, "profile", str(tiny_decoder), "-t", "rdu", "--via", "mlir", "--precision", "bf16")
    assert code == 0
    code, _, _ = run_cli(capsys, "profile", str(tiny_decoder), "-t", "rdu", "--via", "mlir", "--precision", "w4a16")
    assert code == 0  # w4a16 is imported as an explicit group-wise dequantisation (docs/mlir.md, "Precision")


@pytest.mark.parametrize("only", [",", " , ", ""])
def test_reproduce_only_that_names_no_finding_is_refused(capsys, tmp_path, only):
    code, _, err = run_cli(capsys, "reproduce", "dabench", "--only", only, "--dry-run", "-o", str(tmp_path / "r"))
    lines = err.strip().splitlines()
    assert code == 2 and "--only names no finding" in lines[-1] and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--dim", "batch=1", "--dim", "batch=2"], "batch given twice (1 and 2)"),
        (["--mlir-pipeline", "cse", "--mlir-pipeline", "canonicalize"], "--mlir-pipeline given twice"),
        (["--mlir-pipeline", "canonicalize,,cse"], "an empty pass name between commas"),
    ],
)
def test_a_repeated_or_empty_value_is_refused_never_the_last_kept(capsys, tiny_decoder, argv, needle):
    command = "study" if argv[0] == "--mlir-pipeline" else "profile"
    code, _, err = run_cli(capsys, command, str(tiny_decoder), "-q", *argv)
    assert_one_line_error(code, err, needle)


def test_a_cache_folder_that_is_a_file_is_refused_before_any_work(capsys, tiny_decoder, tmp_path, monkeypatch):
    afile = tmp_path / "cache"
    afile.write_text("")
    monkeypatch.setenv("DABENCH_IR_CACHE", str(afile))
    code, _, err = run_cli(capsys, "profile", "gpt2-small", "-t", "rdu", "-q")
    assert_one_line_error(code, err, "is a file, not a folder")


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "{model}", "-t", "{target}", "--json", "{target}", "-q"],
        ["profile", "{model}", "-t", "{target}", "--csv", "{target}", "-q"],
        ["scale", "{model}", "-t", "{target}", "--chips", "1,2", "--strategy", "tp", "--json", "{target}", "-q"],
        ["study", "{model}", "--pipeline", "ort-basic", "-t", "{target}", "--json", "{target}", "-q"],
        ["targets", "--show", "{target}", "--json", "{target}"],
    ],
)
def test_a_target_file_is_an_input_no_output_overwrites(capsys, tiny_decoder, tmp_path, argv):
    """A target file is read by the run: an output flag naming it is refused before any work, the file intact."""
    target = tmp_path / "t.toml"
    target.write_text((Path(__file__).resolve().parents[1] / "targets" / "sn30.toml").read_text())
    before = target.read_bytes()
    code, _, err = run_cli(capsys, *(a.format(model=tiny_decoder, target=target) for a in argv))
    assert_one_line_error(code, err, "is an input of this run")
    assert target.read_bytes() == before


def test_a_report_never_writes_over_its_model(tiny_decoder, tmp_path):
    import shutil

    import dabench_ir

    model = tmp_path / "m.onnx"
    shutil.copy(tiny_decoder, model)
    report = dabench_ir.profile(str(model), "rdu")
    for write in (report.write_json, report.write_csv, report.write_roles_csv):
        with pytest.raises(dabench_ir.ApiError, match="is an input"):
            write(model)
    assert model.read_bytes() == tiny_decoder.read_bytes()


@pytest.mark.parametrize(
    ("address", "needle"),
    [("not an address", "expected HOST:PORT of a Ray cluster's head"), ("127.0.0.1:1", "no Ray head answers there")],
)
def test_a_ray_address_that_is_no_head_fails_in_one_line_within_seconds(capsys, tmp_path, address, needle):
    import time

    pytest.importorskip("ray")
    start = time.monotonic()
    spec = Path(__file__).resolve().parents[1] / "dabench_ir" / "data" / "sweeps" / "smoke.toml"
    argv = ["sweep", str(spec), "-o", str(tmp_path / "s"), "--executor", "ray", "--address", address, "-q"]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, needle)
    assert time.monotonic() - start < 10  # Ray alone retried for minutes


def test_strict_refuses_a_generation_scenario_whose_phases_hold_nodes_without_a_cost_rule(
    capsys, tmp_path, monkeypatch
):
    """``--strict`` was accepted by ``profile --scenario generate`` and ignored: a phase's report with
    an estimated node (no cost rule) now exits 2 as a profile does; without the flag it goes on."""
    from types import SimpleNamespace

    from dabench_ir import scenario
    from dabench_ir.options import ProfileOptions
    from dabench_ir.pipeline import load_graph, profile_graph

    model = parse(
        """<ir_version: 9, opset_import: ["" : 18, "com.example" : 1]>
        agraph (float[4] x) => (float[4] y) { y = com.example.Frobnicate(x) }"""
    )
    path = tmp_path / "declared.onnx"
    onnx.save(model, path)
    phase = SimpleNamespace(report=profile_graph(load_graph(path), "h100", ProfileOptions()))
    assert phase.report.extra.get("estimated")
    monkeypatch.setattr(scenario, "generate", lambda *a, **k: SimpleNamespace(prefill=phase, decode=[phase]))
    argv = ("profile", str(path), "-t", "h100", "--scenario", "generate", "--prompt", "4", "--gen", "2", "-q")
    assert run_cli(capsys, *argv)[0] == 0
    code, _, err = run_cli(capsys, *argv, "--strict")
    assert_one_line_error(code, err, "without a cost rule", "Frobnicate")


def test_json_to_stdout_is_the_only_thing_on_stdout_for_every_command(capsys, tiny_decoder, tmp_path):
    """``--json -`` makes stdout parseable: compare, diff and scale printed their table beside it."""
    import json

    reports = []
    for target in ("h100", "wse"):
        path = tmp_path / f"{target}.json"
        code, _, err = run_cli(capsys, "profile", str(tiny_decoder), "-t", target, "-q", "--json", str(path))
        assert code == 0, err
        reports.append(str(path))
    for argv in (
        ["compare", *reports, "--json", "-"],
        ["diff", reports[0], reports[0], "--json", "-"],
        ["scale", str(tiny_decoder), "-t", "h100", "--chips", "1,2", "--strategy", "dp", "--json", "-"],
        ["profile", str(tiny_decoder), "-t", "h100", "--json", "-"],
    ):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0, err
        json.loads(out)  # nothing else on stdout


def test_a_sweep_flag_no_point_keeps_is_refused(capsys, tmp_path):
    """The smoke spec's points are inference on wse and rdu: --recompute full or --ipus 4 would reach
    none of them (they were dropped point by point, exit 0); --opt-level reaches its rdu points."""
    for flag in (["--recompute", "full"], ["--ipus", "4"]):
        code, _, err = run_cli(capsys, "sweep", "smoke", "--dry-run", *flag)
        assert_one_line_error(code, err, f"{flag[0]} {flag[1]}: applies to none of the 4 points of smoke", "drop it")
    code, out, _ = run_cli(capsys, "sweep", "smoke", "--dry-run", "--opt-level", "O3")
    assert code == 0 and "rdu O3" in out


def test_a_sweep_flag_every_point_overrides_is_refused(capsys):
    """level2's axes set the batch and the chips of every point: --batch 7 --chips 3 printed the same
    288 points as without them (accepted and ignored)."""
    code, _, err = run_cli(capsys, "sweep", "level2", "--dry-run", "--batch", "7", "--chips", "3")
    assert_one_line_error(code, err, "--batch 7: every point of level2 sets batch itself", "drop it")


def test_a_sweep_point_its_target_refuses_is_said_before_anything_runs(capsys, tmp_path):
    """``--tiles 9`` on the smoke spec's 8-tile sn30 points: exit 2 and one line naming the point, no
    folder written (each rdu point had been run and saved as failed, exit 0); a spec's own value alike."""
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "sweep", "smoke", "--tiles", "9", "-o", str(out), "-q")
    assert_one_line_error(code, err, "smoke, point gpt2 L1 h64 rdu O1 tiles=9: --tiles 9: sn30 has 8 tiles per RDU")
    assert not out.exists()
    spec = tmp_path / "tiles.toml"
    spec.write_text(
        '[defaults]\ntarget = "rdu"\nlayers = 1\nhidden = 64\nheads = 4\nseq = 8\n[axes]\ntiles = [8, 16]\n'
    )
    code, _, err = run_cli(capsys, "sweep", str(spec), "--dry-run")
    assert_one_line_error(code, err, "--tiles 16: sn30 has 8 tiles per RDU")
    # the IPU's replicas are a number: each point had run and been saved as failed, exit 0
    spec.write_text('[defaults]\ntarget = "ipu"\nlayers = 1\nhidden = 64\nheads = 4\nseq = 8\n[axes]\nbatch = [1, 2]\n')
    code, _, err = run_cli(capsys, "sweep", str(spec), "--replicas", "auto", "--dry-run")
    assert_one_line_error(code, err, "--replicas auto: IPU replicas are data-parallel copies")


def test_a_sweep_never_writes_into_a_folder_that_holds_its_spec(capsys, tmp_path):
    spec = Path(__file__).resolve().parents[1] / "dabench_ir" / "data" / "sweeps" / "smoke.toml"
    inside = tmp_path / "out" / "results.csv"  # the table the run writes
    inside.parent.mkdir()
    inside.write_text(spec.read_text())
    code, _, err = run_cli(capsys, "sweep", str(inside), "-o", str(inside.parent), "-q")
    assert_one_line_error(code, err, "lies inside this output folder")
    assert inside.read_text() == spec.read_text()


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["targets", "--scaling", "dennard"], ["--scaling dennard is how --normalize-to scales energy"]),
        (["targets", "--show", "wse2", "--catalog"], ["--show prints one target's figures; --catalog"]),
        (["targets", "--show", "wse2", "--normalize-to", "7"], ["--normalize-to applies to the table"]),
        (["sweep", "smoke", "--dry-run", "--jobs", "-1"], ["--jobs -1: expected a positive number"]),
        (
            ["export", "--preset", "gpt2-small", "--layers", "1", "--weights", "none", "--seed", "3", "-o", "x.onnx"],
            ["--seed seeds random weights; this export has none"],
        ),
        (
            [
                "export",
                "--preset",
                "gpt2-small",
                "--layers",
                "1",
                "--weights",
                "none",
                "--max-weight-bytes",
                "5",
                "-o",
                "x.onnx",
            ],
            ["--max-weight-bytes caps random weights"],
        ),
        (
            [
                "export",
                "--preset",
                "gpt2-small",
                "--layers",
                "1",
                "--no-stamp",
                "--format",
                "mlir-torch",
                "-o",
                "x.mlir",
            ],
            ["--no-stamp applies to ONNX exports"],
        ),
    ],
)
def test_a_flag_that_changes_nothing_is_refused(capsys, tmp_path, monkeypatch, argv, needles):
    """Each was accepted and the output byte-identical without it."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, *needles)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_a_negative_top_is_refused_by_every_command_that_takes_it(capsys, tiny_decoder, tmp_path):
    report = tmp_path / "r.json"
    assert run_cli(capsys, "profile", str(tiny_decoder), "-t", "h100", "-q", "--json", str(report))[0] == 0
    for argv in (["profile", str(tiny_decoder), "-t", "h100"], ["diff", str(report), str(report)]):
        code, _, err = run_cli(capsys, *argv, "--top", "-3")
        assert_one_line_error(code, err, "--top -3: expected 0 (all rows) or a positive number")


def test_a_linalg_module_with_dynamic_dims_is_refused(capsys, tmp_path):
    """Its ops' loop bounds cannot be derived, so every op went uncounted: 0 FLOP, exit 0 (and --dim
    taken and ignored); docs/mlir.md promises a one-line error."""
    pytest.importorskip("torch_mlir")
    path = tmp_path / "dyn.mlir"
    path.write_text(
        "module {\n"
        "  func.func @f(%a: tensor<?x8xf32>, %b: tensor<8x8xf32>, %c: tensor<?x8xf32>) -> tensor<?x8xf32> {\n"
        "    %0 = linalg.matmul ins(%a, %b : tensor<?x8xf32>, tensor<8x8xf32>) outs(%c : tensor<?x8xf32>) "
        "-> tensor<?x8xf32>\n"
        "    return %0 : tensor<?x8xf32>\n"
        "  }\n"
        "}\n"
    )
    code, _, err = run_cli(capsys, "profile", str(path), "-t", "h100")
    assert_one_line_error(code, err, "argument 0 is tensor<?x8xf32>: the module has dynamic dims")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--mode", "train"], "--scenario generate serves requests (inference): drop --mode train"),
        (["-t", "wse", "--replicas", "4"], "--scenario generate serves --batch requests on one copy"),
    ],
)
def test_the_generate_scenario_refuses_what_its_rates_would_leave_out(capsys, argv, words):
    """A training step's optimizer in every decode step, replicas serving requests the tokens/s never
    counted: both ran (exit 0) with the headline unchanged or wrong."""
    target = [] if "-t" in argv else ["-t", "h100"]
    code, _, err = run_cli(
        capsys, "profile", "gpt2-small", *target, "--scenario", "generate", "--prompt", "8", "--gen", "2", *argv
    )
    assert_one_line_error(code, err, words)


def test_a_list_flag_refuses_a_value_given_twice(capsys):
    """``scale --chips 1,1,2`` printed the one-chip row twice."""
    code, _, err = run_cli(capsys, "scale", "gpt2-small", "-t", "h100", "--chips", "1,1,2", "--strategy", "tp")
    assert_one_line_error(code, err, "--chips 1,1,2: 1 given more than once")
