"""docs/api.md's examples, run as written on a small static export, and the API's wording of errors."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

import dabench_ir

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx

    folder = tmp_path_factory.mktemp("api")
    cfg = ModelConfig(family="gpt2", layers=1, hidden=64, heads=2, seq=16, batch=1)
    (folder / "model.onnx").write_bytes(export_onnx(cfg, weights="none").SerializeToString())
    return folder


def _examples() -> list[tuple[int, str]]:
    text = DOC.read_text()
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def test_every_example_of_docs_api_runs(model_dir, monkeypatch):
    monkeypatch.chdir(model_dir)
    pandas = importlib.util.find_spec("pandas")
    scope: dict = {}
    for line, code in _examples():
        try:
            exec(compile(code, f"docs/api.md:{line}", "exec"), scope)
        except ImportError as exc:
            assert pandas is None and "dabench-ir[pandas]" in str(exc), f"docs/api.md:{line}: {exc}"
        except Exception as exc:
            pytest.fail(f"docs/api.md line {line}: {type(exc).__name__}: {exc}")
    assert isinstance(scope["report"], dabench_ir.Report) and scope["report"].nodes


def test_a_contradicting_static_batch_is_worded_for_python(model_dir):
    with pytest.raises(dabench_ir.ApiError, match=r"^batch=2: the model's batch is fixed at 1") as err:
        dabench_ir.profile(model_dir / "model.onnx", target="rdu", dims={"batch": 2})
    assert "--batch" not in str(err.value)
    with pytest.raises(ValueError, match=r"^opt_level= applies to rdu targets"):
        dabench_ir.profile(model_dir / "model.onnx", target="h100", opt_level="O3")


def test_a_report_read_back_has_the_same_tables(model_dir, tmp_path):
    report = dabench_ir.profile(model_dir / "model.onnx", target="h100")
    back = dabench_ir.Report.from_json(report.write_json(tmp_path / "r.json"))
    written = json.loads(report.to_json())
    assert back.totals == written["totals"] and back.config == written["config"]
    assert json.loads(back.to_json())["nodes"] == written["nodes"]


def test_to_pandas_without_pandas_names_the_extra(model_dir):
    report = dabench_ir.profile(model_dir / "model.onnx")
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install 'dabench-ir\[pandas\]'"):
            report.to_pandas(by="role")
    else:
        assert len(report.to_pandas()) == len(report.nodes)
        assert set(report.to_pandas(by="role").columns) >= {"role", "time_s"}


# -- scale, study, validate: the CLI's answers, typed -------------------------------------------------


def _cli_json(tmp_path, *argv: str) -> dict:
    from dabench_ir.cli import main

    out = tmp_path / "cli.json"
    assert main([*argv, "--json", str(out), "-q"]) == 0
    return json.loads(out.read_text())


def test_scale_is_the_cli_scale(model_dir, tmp_path):
    result = dabench_ir.scale(model_dir / "model.onnx", "h100", strategy="dp", chips=(1, 2), precision="fp16")
    assert isinstance(result, dabench_ir.ScaleResult) and isinstance(result.points[0], dabench_ir.ScalePoint)
    assert [(p.chips, p.batch) for p in result.points] == [(1, 1), (2, 2)]  # dp: a replica per chip
    cli = _cli_json(
        tmp_path,
        "scale",
        str(model_dir / "model.onnx"),
        "-t",
        "h100",
        "--strategy",
        "dp",
        "--chips",
        "1,2",
        "--precision",
        "fp16",
    )
    assert json.loads(json.dumps(result.to_dict(), default=str)) == cli
    assert (
        result.points[1].speedup
        == result.points[1].throughput_samples_per_s / result.points[0].throughput_samples_per_s
    )
    with pytest.raises(dabench_ir.ApiError, match=r"^batch=4: the model's batch is fixed at 1"):
        dabench_ir.scale(model_dir / "model.onnx", "h100", strategy="dp", batch=[1, 4])
    with pytest.raises(dabench_ir.ApiError, match=r"^opt_level= applies to rdu targets"):
        dabench_ir.scale(model_dir / "model.onnx", "h100", strategy="tp", opt_level="O3")


def test_run_study_is_the_cli_study(model_dir, tmp_path):
    study = dabench_ir.run_study(model_dir / "model.onnx", ["rdu-O3"], ["rdu"])
    run = study.run("rdu-O3", "rdu")
    assert isinstance(run, dabench_ir.StudyRun) and run.target == "sn30" and study.run("rdu-O3") is run
    assert run.totals["speedup"] == run.totals["time_before_s"] / run.totals["time_after_s"]
    assert run.totals["flops_before"] == run.totals["flops_after"] == study.doc["runs"][0]["totals"]["flops_after"]
    assert run.config["opt_level"] == "O3" and study.failed == []
    cli = _cli_json(tmp_path, "study", str(model_dir / "model.onnx"), "--pipeline", "rdu-O3", "-t", "rdu")
    assert cli["runs"][0]["totals"] == run.totals and cli["runs"][0]["nodes"] == run.nodes
    with pytest.raises(dabench_ir.ApiError, match=r"no such run"):
        study.run("rdu-O0")
    with pytest.raises(dabench_ir.ApiError, match=r"unknown pipeline"):
        dabench_ir.run_study(model_dir / "model.onnx", ["nope"], ["rdu"])


def test_run_validation_is_the_cli_validate(tmp_path):
    catalog = tmp_path / "mine.toml"
    catalog.write_text(
        'format = "dabench-ir/measurements/v1"\n[[points]]\nid = "bw"\nkind = "bandwidth"\n'
        'target = "ipu"\nsource = "s"\nbandwidth = { memory = "off-chip", pattern = "streaming" }\n'
        "measured = { bandwidth_gb_s = 10.0 }\n"
    )
    check = dabench_ir.run_validation(catalog=catalog)
    assert isinstance(check, dabench_ir.Validation) and isinstance(check.results[0], dabench_ir.PointResult)
    (q,) = check.results[0].quantities
    assert q.measured == 10.0 and q.error == (q.predicted - 10.0) / 10.0
    summary = check.summary()["bow"]
    assert set(summary) == set(dabench_ir.TargetSummary.__annotations__)
    assert summary["compared"] == 1 and summary["median_abs_error"] == abs(q.error)
    from dabench_ir.cli import main

    assert main(["validate", "--catalog", str(catalog), "-q", "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["rows"] == json.loads(json.dumps(check.to_dict()["rows"]))
    with pytest.raises(dabench_ir.ApiError, match=r"nope.toml"):
        dabench_ir.run_validation(catalog=tmp_path / "nope.toml")
    assert check.cross_validation is None  # a user's catalogue has no recorded folds


@pytest.mark.slow  # two whole-target validations with their cross-validation folds
def test_run_validation_cross_validates_the_bundled_catalogue_as_the_cli_does(tmp_path):
    """The figure to trust is the same through the API and the CLI: leave one source out."""
    check = dabench_ir.run_validation("sn30")
    from dabench_ir.cli import main

    assert main(["validate", "-t", "sn30", "-q", "--json", str(tmp_path / "v.json")]) == 0
    cli = json.loads((tmp_path / "v.json").read_text())["cross_validation"]
    assert cli == json.loads(json.dumps(check.cross_validation.to_dict()))
    assert cli["sn30"]["compared"] > 0


def test_the_typed_mappings_name_keys_the_reports_have(model_dir):
    report = dabench_ir.profile(model_dir / "model.onnx", target="h100")
    assert set(dabench_ir.Totals.__annotations__) <= set(report.totals)
    assert set(dabench_ir.Metrics.__annotations__) <= set(report.metrics)
    run = dabench_ir.run_study(model_dir / "model.onnx", ["rdu-O1"], ["rdu"]).runs[0]
    assert set(dabench_ir.StudyTotals.__annotations__) <= set(run.totals)


def test_to_pandas_rows_are_the_reports_nodes_and_roles():
    """One MatMul of 2x3 @ 3x4: 48 FLOPs (2 per multiply-add); in bf16 (h100's default precision)
    2 * (6 + 12 + 8) = 52 bytes; the roles are the node's and the host's kernel issue (7 us on h100)."""
    from tests.conftest import parse

    report = dabench_ir.profile(
        parse("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[2,3] a, float[3,4] b) => (float[2,4] c) { c = MatMul(a, b) }"""),
        target="h100",
    )
    if importlib.util.find_spec("pandas") is None:  # CI installs '.[all]': pandas is there and this runs
        with pytest.raises(
            ImportError, match=r"^Report.to_pandas\(\) needs pandas: pip install 'dabench-ir\[pandas\]'$"
        ):
            report.to_pandas()
        pytest.skip("pandas is not installed here (the optional extra 'pandas'); the error path is checked above")
    nodes = report.to_pandas()
    assert list(nodes["op_type"]) == ["MatMul"] and list(nodes["flops"]) == [48] and list(nodes["bytes"]) == [52]
    assert nodes["time_s"].iloc[0] == report.nodes[0].time_s and list(nodes.columns)[:3] == ["name", "op_type", "layer"]
    roles = report.to_pandas(by="role")
    assert roles["role"].tolist() == ["overhead: host_issue", "MatMul (activations)"]
    assert roles["flops"].tolist() == [0, 48] and roles["bytes"].tolist() == [0, 52]
    assert roles["time_s"].tolist() == [7e-06, report.nodes[0].time_s]
    assert roles["time_s"].sum() == pytest.approx(report.totals["time_s"], rel=1e-12)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda d: d.profile(None), "model=None: give a path"),
        (lambda d: d.profile(123), "model=123: give a path"),
        (lambda d: d.profile_targets("gpt2-small", "rdu"), "targets='rdu': give a list of target names"),
        (lambda d: d.scale("gpt2-small", "h100", strategy="dp", chips=4), "chips=4: give a sequence"),
        (lambda d: d.scale("gpt2-small", "h100", strategy="dp", chips="1,2"), "chips='1,2': give a sequence"),
        (lambda d: d.scale("gpt2-small", "h100", strategy="dp", chips=()), "chips=(): give at least one"),
        (lambda d: d.scale("gpt2-small", "h100", strategy="dp", chips=(1, 0)), "0 is not a positive integer"),
        (lambda d: d.scale("gpt2-small", "h100", strategy="dp", batch=float("nan")), "batch=nan"),
        # a generation is many steps: profile ran one step with it recorded as given and ignored
        (
            lambda d: d.profile("gpt2-small", "h100", scenario="generate", prompt=64, gen=4),
            "call dabench_ir.api.generate",
        ),
        (lambda d: d.generate("gpt2-small", "h100", prompt=0, gen=4), "prompt=0: expected a positive integer"),
        (
            lambda d: d.generate("gpt2-small", "h100", prompt=64, gen=4, tiles=4),
            "tiles= applies to rdu targets, not h100",
        ),
    ],
)
def test_a_bad_api_argument_is_an_api_error_in_the_apis_own_words(call, needle):
    """Every bad argument is an `ApiError` (a ValueError) naming the parameter, before any work: never a
    TypeError from deep inside, never a string iterated as a list of targets."""
    import dabench_ir

    with pytest.raises(dabench_ir.ApiError, match=re.escape(needle)):
        call(dabench_ir)
