"""The JSON Schema for dabench-ir/report/v1 matches what `Report.to_dict()` writes."""

from __future__ import annotations

import json

import pytest

from dabench_ir.report.model import SCHEMA
from tests.test_report_helpers import load_schema, make_report, validate


def test_schema_file_names_the_contract():
    schema = load_schema()
    assert schema["properties"]["schema"]["const"] == SCHEMA
    # every top-level key to_dict writes is described
    assert set(make_report().to_dict()) <= set(schema["properties"])


@pytest.mark.parametrize("kw", [{}, {"timed": False, "measured": False, "target": False}])
def test_hand_built_report_validates(kw):
    data = json.loads(make_report(**kw).to_json())
    assert validate(data, load_schema()) == []


def test_node_fields_all_described():
    node_schema = load_schema()["properties"]["nodes"]["items"]
    assert set(make_report().nodes[0].to_dict()) == set(node_schema["properties"])


def test_pipeline_report_validates(tiny_matmul_path, tmp_path):
    from dabench_ir.pipeline import profile

    report = profile(tiny_matmul_path)
    path = report.write_json(tmp_path / "r.json")
    assert validate(json.loads(path.read_text()), load_schema()) == []


def test_validator_catches_errors():
    data = json.loads(make_report().to_json())
    del data["totals"]["flops"]
    data["nodes"][0]["time_s"] = "fast"
    data["schema"] = "other/v9"
    errors = validate(data, load_schema())
    assert any("totals" in e and "flops" in e for e in errors)
    assert any("nodes[0].time_s" in e for e in errors)
    assert any("$.schema" in e for e in errors)


def test_jsonschema_when_installed():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(make_report().to_json()), load_schema())
