"""The report's numbers agree with each other and with physics: roofline points at or below
their roofs (plot = table = JSON), one basis per share column, the measured step error."""

from __future__ import annotations

import json
import re

import onnx
import pytest

from dabench_ir.metrics import prediction_error
from dabench_ir.pipeline import profile
from dabench_ir.report import plots
from dabench_ir.report.attribution import (
    bound_shares,
    dominant_bound,
    node_share,
    role_rows,
    roofline_points,
    summed_time,
    time_groups,
)
from dabench_ir.report.html import render_html
from dabench_ir.report.table import SHARE_OF_TIME, render_table

pytest.importorskip("onnxscript")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """A two-layer llama (hidden 128, seq 64, vocab 500) exported weight-free."""
    from dabench_ir.models import ModelConfig
    from dabench_ir.models.export import export_onnx

    cfg = ModelConfig(family="llama", layers=2, hidden=128, heads=4, kv_heads=2, ffn=256, seq=64, batch=2, vocab=500)
    path = tmp_path_factory.mktemp("physics") / "tiny.onnx"
    onnx.save(export_onnx(cfg, weights="none"), str(path))
    return path


@pytest.fixture(scope="module")
def reports(tiny_path):
    return {}


def _report(reports, path, target):
    if target not in reports:
        reports[target] = profile(path, target=target)
    return reports[target]


@pytest.mark.parametrize("target", ["rdu", "wse", "ipu", "h100", "cpu"])
def test_every_roofline_point_is_at_or_below_its_roof(reports, tiny_path, target, tmp_path):
    report = _report(reports, tiny_path, target)
    points = roofline_points(report)
    assert points
    data = {n["name"]: n for n in json.loads(report.to_json())["nodes"]}
    for p in points:
        assert p["roof_flops_per_s"] is not None, p["name"]
        # the roof of its feed level at its dtype: min(peak, intensity x bandwidth)
        assert p["achieved_flops_per_s"] <= p["roof_flops_per_s"] * (1 + 1e-9), p
        assert p["ridge"] == pytest.approx(p["peak_flops_per_s"] / p["bandwidth_bytes_per_s"])
        # the plotted numbers are the table's and the JSON's
        node = report.node(p["name"])
        assert p["intensity"] == node.intensity == pytest.approx(data[p["name"]]["intensity"])
        assert p["achieved_flops_per_s"] == pytest.approx(data[p["name"]]["flops"] / data[p["name"]]["time_s"])
        assert p["feed_level"] == report.plan.node_plans[p["name"]].feed_level
    # the figure draws exactly these points
    fig = plots.roofline_figure(report)
    drawn = sorted(tuple(xy) for c in fig.axes[0].collections for xy in c.get_offsets().tolist())
    expected = sorted((p["intensity"], p["achieved_flops_per_s"]) for p in points)
    assert len(drawn) == len(expected)
    for (dx, dy), (ex, ey) in zip(drawn, expected, strict=True):
        assert dx == pytest.approx(ex) and dy == pytest.approx(ey)
    # the node table prints the same intensity
    text = render_table(report, by="node", top=0, color=False, width=400)
    top = max(points, key=lambda p: p["time_s"])
    line = next(ln for ln in text.splitlines() if ln.startswith(top["name"] + " "))
    assert f"{top['intensity']:.3g}" in line.split()
    plots.save_figure(fig, tmp_path / f"{target}-roofline.png")


def _html_share(page: str, role: str) -> list[float]:
    """The share cells (percent) of the rows whose first cell is ``role`` (every table of the page)."""
    out = []
    for row in re.findall(r"<tr>(.*?)</tr>", page):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        if cells and cells[0] == role:
            out += [float(m) for m in re.findall(r'class="bar"[^>]*></span>([0-9.]+)%', row)]
    return out


def test_shares_on_one_basis_across_tables(reports, tiny_path):
    report = _report(reports, tiny_path, "rdu")
    total = summed_time(report)
    assert total > sum(n.time_s or 0.0 for n in report.nodes)  # the RDU has host and reconfiguration rows
    rows = role_rows(report)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    lm = next(r for r in rows if r["role"] == "lm_head")
    nodes = [n for n in report.nodes if n.role == "lm_head"]
    assert lm["share"] == pytest.approx(sum(node_share(report, n) for n in nodes))
    # every grouping of time sums to the same total, overheads included
    for key in ("op_type", "layer", "op_class", "bound"):
        assert sum(time_groups(report, key).values()) == pytest.approx(total)
    shares = bound_shares(report.nodes, report.timeline.overheads_s)
    assert sum(shares.values()) == pytest.approx(1.0)
    # the host-heavy step's dominant bound is overhead
    assert dominant_bound(report.nodes, report.timeline.overheads_s)[0] == "overhead"
    # the text tables: role and node share columns name the basis and agree on lm_head
    role_text = render_table(report, color=False, width=400, top=0)
    node_text = render_table(report, by="node", color=False, width=400, top=0)
    for text in (role_text, node_text):
        assert SHARE_OF_TIME in text
    lm_line = next(ln for ln in role_text.splitlines() if ln.startswith("lm_head "))
    assert f"{100 * lm['share']:.1f}%" in lm_line
    node_shares = []
    for n in nodes:
        line = next(ln for ln in node_text.splitlines() if ln.startswith(n.name + " "))
        node_shares.append(float(next(c for c in line.split() if c.endswith("%")).rstrip("%")))
    assert sum(node_shares) == pytest.approx(100 * lm["share"], abs=0.05 * len(nodes) + 1e-9)
    # the HTML: the role table and the node table show the same basis and the same figure
    page = render_html(report, top=1000)
    assert page.count(SHARE_OF_TIME) >= 3
    role_cell = _html_share(page, "lm_head")
    assert role_cell and role_cell[0] == pytest.approx(100 * lm["share"], abs=0.05)
    html_nodes = [s for n in nodes for s in _html_share(page, n.name)]
    assert sum(html_nodes) == pytest.approx(100 * lm["share"], abs=0.05 * len(nodes) + 1e-9)


def test_prediction_error_compares_steps_and_keeps_the_node_sum():
    # the case: the nodes agree to 12.9 % but the step misses onnxruntime's per-run overhead
    err = prediction_error(
        {"a": 1.0e-3, "b": 0.34e-3}, {"a": 0.9e-3, "b": 0.3e-3}, predicted_step_s=1.34e-3, measured_step_s=1.93e-3
    )
    assert err["end_to_end_basis"] == "step"
    assert err["end_to_end_signed_error"] == pytest.approx(1.34 / 1.93 - 1)
    assert err["end_to_end_rel_error"] == pytest.approx(1 - 1.34 / 1.93)
    assert err["node_sum_rel_error"] == pytest.approx(0.14 / 1.2)
    # without the steps: the node sum, labelled so
    plain = prediction_error({"a": 1.0}, {"a": 2.0})
    assert plain["end_to_end_basis"] == "node sum" and plain["end_to_end_rel_error"] == pytest.approx(0.5)


def test_measured_step_error_on_the_host(tiny_matmul_path):
    report = profile(tiny_matmul_path, "cpu", measure=True, warmup=1, repeat=3)
    measured_step = report.totals["measured_time_s"]
    predicted_step = report.timeline.step_time_s
    measured = {n.name: n.measured_time_s for n in report.nodes if n.measured_time_s is not None}
    predicted = {n.name: n.time_s for n in report.nodes if n.time_s is not None}
    assert measured_step >= sum(measured.values())  # onnxruntime's per-run overhead is in the step
    err = prediction_error(predicted, measured, predicted_step_s=predicted_step, measured_step_s=measured_step)
    assert err["end_to_end_rel_error"] == pytest.approx(abs(predicted_step - measured_step) / measured_step)
    node_sum = sum(predicted[n] for n in measured)
    assert err["node_sum_rel_error"] == pytest.approx(abs(node_sum - sum(measured.values())) / sum(measured.values()))
    # the report states the basis of its end-to-end figure beside the node-sum one
    shown = report.metrics["prediction_error"]
    assert shown["end_to_end_basis"] in ("step", "node sum") and shown["node_sum_rel_error"] is not None
    if shown["end_to_end_basis"] == "step":  # build_report passes the steps
        assert shown["end_to_end_rel_error"] == pytest.approx(err["end_to_end_rel_error"])
    text = render_table(report, color=False)
    assert f"end-to-end ({shown['end_to_end_basis']}) error" in text
