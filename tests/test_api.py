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
