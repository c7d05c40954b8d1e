"""The report outputs agree with the text table and with each other (a cold review's findings):
--html honours --top/--sort/--by; a node with no cost rule is marked in every row that shows its
FLOPs; the one-chip line says what its busy time holds; an annotated .mlir carries the model-level
figures the ONNX file has; --plots makes its own folder only; the CSV's energy column adds up."""

from __future__ import annotations

import csv
import json
import math
import re

import onnx
import pytest
from onnx import TensorProto, helper

from dabench_ir.cli import main
from tests.test_cli_errors import assert_one_line_error, run_cli


def _no_rule_model(path) -> str:
    """Five small nodes: a MatMul, a Relu, an Add (rules) and a Hardmax and a Det (no rule)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Hardmax", ["x"], ["h"], name="hardmax", axis=-1),
        helper.make_node("MatMul", ["h", "x"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x"], ["a"], name="add"),
        helper.make_node("Det", ["a"], ["y"], name="det"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def _headings(page: str) -> list[str]:
    return re.findall(r"<h2>([^<]*)</h2>", page)


def _table_rows(page: str, heading: str) -> list[list[str]]:
    """The body rows of the table in the section headed ``heading``, each cell's text."""
    section = page.split(f"<h2>{heading}</h2>", 1)[1].split("</section>", 1)[0]
    body = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)
    ]


def test_html_honours_top_sort_and_by(tmp_path, capsys):
    model = _no_rule_model(tmp_path / "m.onnx")
    asked, default, every = tmp_path / "a.html", tmp_path / "b.html", tmp_path / "c.html"
    common = [model, "-t", "h100", "-q"]
    flags = ["--top", "2", "--sort", "flops", "--by", "node"]
    assert main(["profile", *common, *flags, "--html", str(asked)]) == 0
    code, text, _ = run_cli(capsys, "profile", model, "-t", "h100", "--no-color", *flags)
    assert code == 0
    ranked = text.split("Top 2 of 5 nodes by FLOPs", 1)[1].splitlines()[3:5]  # below the header and its rule
    assert main(["profile", *common, "--html", str(default)]) == 0
    assert main(["profile", *common, "--top", "0", "--html", str(every)]) == 0
    page = asked.read_text()
    heads = _headings(page)
    nodes = heads.index("Top 2 of 5 nodes by FLOPs")
    assert nodes < heads.index("Top 2 of 6 module roles by FLOPs")  # --by node: the node table leads
    rows = _table_rows(page, "Top 2 of 5 nodes by FLOPs")
    assert [r[0] for r in rows] == [line.split()[0] for line in ranked]  # as the text ranks them
    assert rows[0][0] == "mm"  # the most FLOPs
    plain = _headings(default.read_text())
    assert plain.index("Top 6 of 6 module roles by time") < plain.index("Top 5 of 5 nodes by time")
    assert page != default.read_text()
    assert len(_table_rows(every.read_text(), "Top 5 of 5 nodes by time")) == 5  # --top 0: every row


def test_a_node_without_a_cost_rule_is_marked_in_every_row(tmp_path, capsys):
    model = _no_rule_model(tmp_path / "m.onnx")
    trace, page = tmp_path / "t.json", tmp_path / "r.html"
    code, out, _ = run_cli(
        capsys, "profile", model, "-t", "h100", "--by", "node", "--no-color", "--trace", str(trace), "--html", str(page)
    )
    assert code == 0
    slices = {e["name"]: e["args"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"}
    assert slices["det"]["estimated"].startswith("estimated: no rule") and "estimated" not in slices["mm"]
    det = next(line for line in out.splitlines() if line.startswith("det "))
    assert det.split()[4] == "-"  # its FLOPs: not counted, not 0
    assert "FLOPs '-' = no rule: bytes only" in out
    html = page.read_text()
    rows = {r[0]: r for r in _table_rows(html, "Top 5 of 5 nodes by time")}
    assert rows["det"][4] == "-" and rows["mm"][4] != "-"
    roles = {r[0]: r for r in _table_rows(html, "Top 6 of 6 module roles by time")}
    assert roles["Det"][2] == "-" and roles["Hardmax"][2] == "-"
    assert "FLOPs &#x27;-&#x27; = no rule: bytes only" in html


def test_the_one_chip_line_splits_its_busy_time_into_node_and_overhead_rows():
    from dabench_ir import api
    from dabench_ir.report.table import render_table, seconds

    tp = api.profile("gpt2-small", "h100", chips=2, strategy="tp")
    one = tp.extra["per_chip"]
    nodes = sum(n.time_s or 0.0 for n in tp.nodes)
    assert one["time_s"] == pytest.approx(nodes + one["overhead_s"], rel=1e-9)  # host time is in its busy time
    line = next(x for x in render_table(tp, color=False, width=300).splitlines() if x.startswith("  one chip"))
    assert f"{seconds(one['time_s'])} busy" in line
    assert f"{seconds(nodes)} in the node rows + {seconds(one['overhead_s'])} in its own overhead rows" in line
    assert "overhead: host_issue" in line and "the node rows)" not in line


def test_an_annotated_mlir_carries_the_model_level_figures(tmp_path, capsys):
    pytest.importorskip("torch_mlir")
    import numpy as np

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    w = onnx.numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [w])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    ann, ref = tmp_path / "a.mlir", tmp_path / "a.onnx"
    for out in (ann, ref):
        assert main(["profile", str(model), "-t", "rdu", "--mode", "train", "-q", "--annotate", str(out)]) == 0
    props = {p.key: p.value for p in onnx.load(str(ref)).metadata_props}
    lines = dict(re.findall(r"^// report: (dabench\.\S+) = (.*)$", ann.read_text(), re.MULTILINE))
    for key in ("dabench.step_time_s", "dabench.overhead_s", "dabench.target", "dabench.nodes_outside_file"):
        assert key in props and key in lines, key
    assert lines["dabench.nodes_outside_file"] == props["dabench.nodes_outside_file"]  # the optimizer
    assert float(lines["dabench.step_time_s"]) == pytest.approx(float(props["dabench.step_time_s"]), rel=1e-9)
    again = tmp_path / "again.json"  # still a valid input, whose header is not the report's figures
    assert main(["profile", str(ann), "-t", "rdu", "-q", "--json", str(again)]) == 0
    assert not any("step_time" in str(k) for k in json.loads(again.read_text())["model"])


def test_plots_makes_its_own_folder_only(tmp_path, capsys):
    model = _no_rule_model(tmp_path / "m.onnx")
    code, _, err = run_cli(capsys, "profile", model, "-t", "h100", "-q", "--plots", str(tmp_path / "no" / "p"))
    assert_one_line_error(code, err, "--plots", "does not exist; create it first")
    code, _, err = run_cli(
        capsys, "profile", model, "-t", "h100,a100", "-q", "--json", str(tmp_path / "no2" / "q") + "/"
    )
    assert_one_line_error(code, err, "--json", "does not exist; create it first")
    assert not (tmp_path / "no").exists() and not (tmp_path / "no2").exists()
    assert main(["profile", model, "-t", "h100", "-q", "--plots", str(tmp_path / "p")]) == 0  # its own folder: made
    assert any((tmp_path / "p").iterdir())


def test_the_csv_energy_column_sums_to_the_step_energy(tmp_path, capsys):
    model = _no_rule_model(tmp_path / "m.onnx")
    table, report = tmp_path / "r.csv", tmp_path / "r.json"
    assert main(["profile", model, "-t", "rdu", "-q", "--csv", str(table), "--json", str(report)]) == 0
    doc = json.loads(report.read_text())
    totals = doc["totals"]
    rows = list(csv.DictReader(table.open()))
    overheads = {r["name"]: r for r in rows if r["kind"] == "overhead"}
    assert overheads and all(r["energy_j"] for r in overheads.values())
    for name, joules in totals["overhead_energy_j"].items():
        assert float(overheads[f"overhead: {name}"]["energy_j"]) == joules
    (idle,) = [r for r in rows if r["kind"] == "idle"]
    assert float(idle["energy_j"]) == totals["idle_energy_j"] and idle["time_s"] == ""
    total = math.fsum(float(r["energy_j"]) for r in rows if r["energy_j"])
    assert total == pytest.approx(totals["energy_j"], rel=1e-12)
    assert all(r["energy_j"] is not None for r in doc["roles"] if r["role"].startswith("overhead: "))


def test_a_multi_chip_csv_energy_column_says_what_no_row_holds(tmp_path):
    from dabench_ir import api

    tp = api.profile("gpt2-small", "h100", chips=2, strategy="tp")
    rows = list(csv.DictReader(tp.write_csv(tmp_path / "tp.csv").open()))
    (rest,) = [r for r in rows if r["kind"] == "remainder" and r["energy_j"]]
    assert "the other chips'" in rest["name"]
    assert math.fsum(float(r["energy_j"]) for r in rows if r["energy_j"]) == pytest.approx(
        tp.totals["energy_j"], rel=1e-12
    )


def test_a_role_partly_without_rules_marks_its_counted_flops():
    from dabench_ir.report.table import flops_cell, no_rule_legend

    cells = [flops_cell(1000, nodes=3, no_rule=1), flops_cell(0, nodes=2, no_rule=2), flops_cell(5, nodes=1)]
    assert cells == ["1 k*", "-", "5"]
    assert [line.split(" = ")[0] for line in no_rule_legend(cells)] == ["FLOPs '-'", "FLOPs '*'"]
    assert no_rule_legend(["5"]) == []
