"""The per-node CSV: model and target columns, the overhead rows, and a time column that sums to the step."""

from __future__ import annotations

import csv
import math

import pytest

import dabench_ir
from tests.conftest import attention_text, parse

ATTENTION = f"""
agraph (float[1, 8, 16] x, float[16, 16] Wq, float[16, 16] Wk) => (float[1, 8, 16] y) {{
    {attention_text("x", v="x", out="y")}
}}
"""


@pytest.fixture(scope="module")
def attention_path(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("csv") / "att.onnx"
    onnx.save(parse(ATTENTION), path)
    return path


def _rows(report, tmp_path):
    path = report.write_csv(tmp_path / "r.csv")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize(
    ("target", "name", "kinds"),
    [
        # sequential: node times plus the overheads are the step; idle: the static energy no row draws (no time)
        ("rdu", "sn30", {"node", "overhead", "idle"}),
        ("h100", "h100", {"node", "overhead", "idle"}),
        ("wse", "wse2", {"node", "overlap", "idle"}),  # regions run at once: their busy times overlap
    ],
)
def test_csv_time_column_sums_to_the_step(attention_path, tmp_path, target, name, kinds):
    report = dabench_ir.profile(attention_path, target=target)
    rows = _rows(report, tmp_path)
    assert {r["model"] for r in rows} == {"att"} and {r["target"] for r in rows} == {name}
    assert {r["kind"] for r in rows} == kinds
    assert [r["name"] for r in rows if r["kind"] == "node"] == [n.name for n in report.nodes]
    assert math.fsum(float(r["time_s"]) for r in rows if r["time_s"]) == report.totals["time_s"]
    overheads = {r["name"]: float(r["time_s"]) for r in rows if r["kind"] == "overhead"}
    assert overheads == {f"overhead: {k}": v for k, v in report.timeline.overheads_s.items() if v}
    assert all(r["bound"] == "overhead" and r["op_type"] == "overhead" for r in rows if r["kind"] == "overhead")


def test_rdu_overhead_rows_are_most_of_a_small_step(attention_path, tmp_path):
    """The rows the CSV used to leave out: on SN30 the host time and the section switch."""
    report = dabench_ir.profile(attention_path, target="rdu")
    rows = _rows(report, tmp_path)
    over = math.fsum(float(r["time_s"]) for r in rows if r["kind"] == "overhead")
    assert over == math.fsum(report.timeline.overheads_s.values()) and over > 0.9 * report.totals["time_s"]
    assert "overhead: section_reconfig" in {r["name"] for r in rows}


def test_cost_only_csv_has_nodes_only(attention_path, tmp_path):
    report = dabench_ir.profile(attention_path)
    rows = _rows(report, tmp_path)
    assert [r["kind"] for r in rows] == ["node"] * 6 and {r["target"] for r in rows} == {""}
    assert rows[0]["flops"] == str(2 * 8 * 16 * 16)


def test_roles_csv_has_model_and_target(attention_path, tmp_path):
    report = dabench_ir.profile(attention_path, target="rdu")
    path = report.write_roles_csv(tmp_path / "r.roles.csv")
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0])[:3] == ["model", "target", "role"]
    assert {(r["model"], r["target"]) for r in rows} == {("att", "sn30")}
    assert math.fsum(float(r["time_s"]) for r in rows) == pytest.approx(report.totals["time_s"], rel=1e-12)
