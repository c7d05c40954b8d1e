"""The host CPU lowering: node times predicted from calibrated curves, and their error against measurement."""

from __future__ import annotations

import math

import pytest
from onnx import parser

from dabench_ir.lowering.cpu import CpuModel, predict_cpu_times
from dabench_ir.metrics import prediction_error
from dabench_ir.pipeline import load_graph


def test_prediction_error_exact():
    measured = {"a": 0.50, "b": 0.30, "c": 0.195, "tiny": 0.005}
    predicted = {"a": 0.55, "b": 0.24, "c": 0.195, "tiny": 0.5, "extra": 9.0}
    err = prediction_error(predicted, measured)
    # end to end over the nodes both have: |1.485 - 1.0| / 1.0
    assert err["end_to_end_rel_error"] == pytest.approx(0.485)
    # per node over nodes >= 1% of measured time (tiny is 0.5%): errors 0.1, 0.2, 0.0
    assert err["nodes_compared"] == 3
    assert err["median_node_rel_error"] == pytest.approx(0.1)
    assert err["p90_node_rel_error"] == pytest.approx(0.18)  # 0.1 + 0.8 * (0.2 - 0.1)
    assert prediction_error({}, {})["nodes_compared"] == 0


_MODEL = parser.parse_model(
    """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4, 8, 16] x, float[16, 32] w, float[2, 8, 16] q, float[2, 16, 8] k) => (float[4, 8, 32] y,
       float[2, 8, 8] s, float[32, 8, 4] t, float[4, 256] r) {
        y = MatMul(x, w)
        s = MatMul(q, k)
        t = Transpose <perm = [2, 1, 0]> (y)
        r = Reshape(y, shape)
        shape = Constant <value = int64[2] {4, 256}> ()
    }
    """
)


def test_predict_cpu_times_from_curves():
    cpu = CpuModel(
        peak_flops=1e9,
        bandwidth=1e9,
        overhead_s=1e-6,
        gemm=[(1e3, 1e-6 + 1e3 / 1e8), (1e5, 1e-6 + 1e5 / 1e9)],  # 0.1 .. 1 GFLOP/s
        bmm=[(1e3, 1e-6 + 1e3 / 5e8)],
        ops={"Add": [(1e3, 1e-6 + 1e-6), (1e6, 1e-6 + 1e-4)], "Transpose2D": [(1e3, 1e-6 + 1e-5)]},
    )
    graph = load_graph(_MODEL)
    pred = predict_cpu_times(graph, cpu)
    names = {n.op_type + str(i): n.name for i, n in enumerate(graph.nodes)}
    # 4x8x16 @ 16x32 is one GEMM of 32x16x32: 32768 FLOPs, rate interpolated in log-FLOPs
    flops = 2 * 32 * 16 * 32
    frac = math.log(flops / 1e3) / math.log(100)
    rate = 1e8 + frac * (1e9 - 1e8)
    assert pred[names["MatMul0"]] == pytest.approx(1e-6 + flops / rate)
    # batched 2 x (8x16 @ 16x8): 4096 FLOPs on the bmm curve (one point: 5e8 FLOP/s)
    assert pred[names["MatMul1"]] == pytest.approx(1e-6 + 4096 / 5e8)
    # the last axis moves: the Transpose2D curve, bytes = 2 x 4096
    assert pred[names["Transpose2"]] == pytest.approx(1e-6 + 8192 / (1e3 / 1e-5))
    # shape-only ops cost the fixed overhead
    assert pred[names["Reshape3"]] == pytest.approx(1e-6)


def test_predict_reads_the_target_toml(tmp_path):
    from dabench_ir.execute.calibrate import dump_toml

    data = {
        "name": "cpu",
        "kind": "cpu",
        "compute": {"peak_flops": {"fp32": {"value": 2e9, "source": "test", "estimate": False}}},
        "memory": [{"name": "dram", "level": "off-chip", "bandwidth_bytes_per_s": {"value": 1e9, "source": "t"}}],
        "overheads": {"kernel_launch_s": {"value": 0.0, "source": "t"}},
        "calibration": {"ops": [{"op": "Add", "bytes": 1000, "time_s": 1e-6}]},
    }
    path = tmp_path / "cpu.toml"
    path.write_text(dump_toml(data))
    graph = load_graph(_MODEL)
    pred = predict_cpu_times(graph, path)
    mm = graph.nodes[0].name
    # no matmul points: the fp32 peak, never below streaming the operands (Add curve: 1 GB/s)
    assert pred[mm] == pytest.approx(max(2 * 32 * 16 * 32 / 2e9, (2048 + 2048 + 4096) / 1e9))


_GELU = parser.parse_model(
    """
    <ir_version: 9, opset_import: ["" : 20]>
    g (float[4, 64] x) => (float[4, 64] a, float[4, 64] b) {
        a = Gelu(x)
        b = Gelu <approximate = "tanh"> (x)
    }
    """
)


def test_gelu_variants_have_their_own_curves_and_fall_back():
    # bytes in + out = 2 x 1024: 2048 bytes per node
    curves = {"Add": [(1e3, 2e-6)], "Erf": [(2048.0, 4e-6)], "GeluTanh": [(2048.0, 6e-6)]}
    cpu = CpuModel(peak_flops=1e9, bandwidth=1e9, overhead_s=1e-6, ops=curves)
    graph = load_graph(_GELU)
    pred = predict_cpu_times(graph, cpu)
    exact, tanh = (n.name for n in graph.nodes)
    assert pred[exact] == pytest.approx(4e-6)  # no Gelu curve: the Erf one
    assert pred[tanh] == pytest.approx(6e-6)


def test_folded_weight_layouts_vanish_only_under_ort_optimisation():
    from dabench_ir.pipeline import analyze
    from tests.conftest import parse

    model = parse(
        """agraph (float[4,16] x) => (float[4,32] y) <float[32,16] W = {WEIGHTS}>
        { Wt = Transpose<perm=[1,0]>(W)  y = MatMul(x, Wt) }""".replace("WEIGHTS", ",".join(["0.5"] * 512))
    )
    cpu = CpuModel(
        peak_flops=1e9,
        bandwidth=1e9,
        overhead_s=1e-6,
        gemm=[(1e3, 1e-6 + 1e3 / 1e8), (1e5, 1e-6 + 1e5 / 1e9)],
        packed=[(1e3, 1e-6 + 1e3 / 2e8), (1e5, 1e-6 + 1e5 / 2e9)],
        ops={"Transpose2D": [(1e3, 1e-6 + 1e-5)]},
    )
    graph = analyze(model)
    transpose, mm = graph.nodes
    plain = predict_cpu_times(graph, cpu)
    assert plain[transpose.name] > 0  # onnxruntime without optimisation runs the transpose
    folded = predict_cpu_times(graph, cpu, ort_opt=True)
    assert folded[transpose.name] == 0.0
    assert folded[mm.name] < plain[mm.name]  # and the MatMul reads a constant, pre-packed weight


_TWO_ADDS = parser.parse_model(
    """
    <ir_version: 9, opset_import: ["" : 20]>
    g (float[64, 64] x, float[8, 8] y) => (float[64, 64] a, float[8, 8] b) {
        a = Add(x, x)
        b = Add(y, y)
    }
    """
)


def test_a_node_is_fed_by_the_cache_it_fits_in_and_never_streams_faster_than_its_level(tmp_path):
    """The calibration's last-level cache (on-chip, 10 kB at 10 GB/s here) feeds a node whose bytes
    fit in it; a larger one streams from DRAM (1 GB/s) and takes at least its bytes over DRAM's
    bandwidth, though the warm Add curve (measured in cache at 10 GB/s) would run it faster."""
    import onnx

    from dabench_ir.execute.calibrate import dump_toml
    from dabench_ir.pipeline import profile_graph

    rec = {"source": "test", "estimate": False}
    data = {
        "name": "cpu",
        "kind": "cpu",
        "compute": {"units": {"value": 1, **rec}, "peak_flops": {"fp32": {"value": 2e9, **rec}}},
        "memory": [
            {
                "name": "dram",
                "level": "off-chip",
                "bandwidth_bytes_per_s": {"value": 1e9, **rec},
                "capacity_bytes": {"value": 1e9, **rec},
            },
            {
                "name": "llc",
                "level": "on-chip",
                "bandwidth_bytes_per_s": {"value": 1e10, **rec},
                "capacity_bytes": {"value": 1e4, **rec},
            },
        ],
        "overheads": {"kernel_launch_s": {"value": 0.0, **rec}},
        "power": {"watts": {"value": 10.0, **rec}},
        "process": {"node_nm": {"value": 10.0, **rec}},
        "calibration": {"ops": [{"op": "Add", "bytes": 1000, "time_s": 1e-7}]},
    }
    target = tmp_path / "cpu.toml"
    target.write_text(dump_toml(data))
    model = tmp_path / "adds.onnx"
    onnx.save(_TWO_ADDS, model)
    report = profile_graph(load_graph(str(model)), str(target))  # the physics verifier runs on it
    big, small = report.graph.nodes
    plans = report.plan.node_plans
    assert plans[big.name].feed_level == "off-chip" and plans[small.name].feed_level == "on-chip"
    # Add(x, x) reads x once and writes a: 2 x 16 kB
    assert report.node(big.name).time_s == pytest.approx(2 * 64 * 64 * 4 / 1e9)  # DRAM-bound, not 10 GB/s
    # the warm curve, at the bytes onnxruntime streams (both operands and the output)
    assert report.node(small.name).time_s == pytest.approx(3 * 8 * 8 * 4 / 1e10)
