"""Plots: every figure renders to PNG and SVG with the expected series, labels and size."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dabench_ir.report import plots
from tests.test_report_helpers import make_report, png_size

pytest.importorskip("matplotlib")


def _svg(fig, tmp_path, name="fig.svg") -> str:
    return plots.save_figure(fig, tmp_path / name).read_text()


def test_roofline_has_roofs_points_and_top_labels(tmp_path):
    fig = plots.roofline_figure(make_report(), top=3)
    svg = _svg(fig, tmp_path)
    # one roof per memory level, named in the legend
    assert "ddr (off-chip) roof" in svg and "sram (on-chip) roof" in svg
    # the top offenders by time are labelled, with their share; a small node is not, nor a
    # node sitting on top of an already labelled one (l0_mlp_matmul vs l1_mlp_matmul)
    assert "l1_mlp_matmul (33%)" in svg and "l1_qkv_matmul" in svg
    assert "l0_mlp_matmul" not in svg and "embed_gather" not in svg
    # colour by op class: one legend entry per class with FLOPs and time
    assert "contraction (4)" in svg and "vector (2)" in svg
    png = plots.save_figure(fig, tmp_path / "roof.png", dpi=100).read_bytes()
    assert png_size(png) == (850, 550)


def test_roofline_attainable_is_min_of_peak_and_bandwidth(tmp_path):
    fig = plots.roofline_figure(make_report())
    ax = fig.axes[0]
    roofs = [line for line in ax.get_lines() if "roof" in str(line.get_label())]
    assert len(roofs) == 2
    for line, bw in zip(roofs, (1e11, 1e13), strict=True):  # sorted by bandwidth
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
            assert y == pytest.approx(min(1e14, x * bw))


def test_roofline_without_target_or_times():
    assert plots.roofline_figure(make_report(timed=False, target=False)) is None
    # roofs alone still make a plot
    assert plots.roofline_figure(make_report(timed=False)) is not None


def test_layer_time_stacks_op_classes(tmp_path):
    fig = plots.layer_time_figure(make_report())
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["outside", "0", "1"]
    heights = {}
    for container in ax.containers:
        heights[container.get_label()] = [bar.get_height() for bar in container]
    assert set(heights) == {"contraction", "vector", "data_movement"}
    # layer 0 contraction: 40 + 90 µs (axis in µs)
    assert heights["contraction"][1] == pytest.approx(130.0)
    assert heights["data_movement"][0] == pytest.approx(2.0)
    assert "Time by layer" in _svg(fig, tmp_path)


def test_layer_falls_back_to_flops_without_times(tmp_path):
    fig = plots.layer_time_figure(make_report(timed=False))
    assert "FLOPs by layer" in _svg(fig, tmp_path)


def test_scale_figure_series(tmp_path):
    rows = [
        {"chips": c, "throughput": 100.0 * c * e, "efficiency": e, "strategy": s}
        for s, effs in (("dp", (1.0, 0.9, 0.8)), ("tp", (1.0, 0.7, 0.5)))
        for c, e in zip((1, 2, 4), effs, strict=True)
    ]
    fig = plots.scale_figure(rows)
    ax_t, ax_e = fig.axes
    series = {line.get_label(): list(line.get_ydata()) for line in ax_t.get_lines()}
    assert series == {"dp": [100.0, 180.0, 320.0], "tp": [100.0, 140.0, 200.0]}
    assert [line.get_ydata()[-1] for line in ax_e.get_lines()] == [80.0, 50.0]
    svg = _svg(fig, tmp_path)
    assert "Throughput vs chips" in svg and "Efficiency vs chips" in svg
    assert plots.scale_figure([]) is None


def test_predicted_vs_measured(tmp_path):
    fig = plots.predicted_vs_measured_figure(make_report())
    ax = fig.axes[0]
    ident = [line for line in ax.get_lines() if line.get_label() == "y = x"]
    assert len(ident) == 1 and list(ident[0].get_xdata()) == list(ident[0].get_ydata())
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    points = sum(len(c.get_offsets()) for c in ax.collections)
    assert points == 7
    assert "7 nodes" in _svg(fig, tmp_path)
    assert plots.predicted_vs_measured_figure(make_report(measured=False)) is None


def test_write_plots_files(tmp_path):
    written = plots.write_plots(make_report(), tmp_path / "p", stem="fake")
    names = sorted(p.name for p in written)
    assert names == sorted(
        f"fake-{n}.{ext}" for n in ("roofline", "layers", "predicted-vs-measured") for ext in ("png", "svg")
    )
    for p in written:
        assert p.stat().st_size > 1000
    with pytest.raises(ValueError):
        plots.save_figure(plots.layer_time_figure(make_report()), tmp_path / "x.jpg")


def test_renderer_modules_do_not_import_matplotlib():
    code = (
        "import sys, dabench_ir.report.plots, dabench_ir.report.html, dabench_ir.report.compare, "
        "dabench_ir.commands.compare, dabench_ir.commands.demo; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at module level'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
