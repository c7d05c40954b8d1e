"""--measure on a GPU: onnxruntime's CUDA profile joined to graph nodes (on CPU, against a
hand-written profile in onnxruntime's format: tests/data/ort_cuda_profile.README.md), and the
refusal where no CUDA provider is present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dabench_ir.errors import UserError
from dabench_ir.execute import ort
from dabench_ir.execute.ort import UNMATCHED_KERNEL_PREFIX, parse_profile

PROFILE = Path(__file__).parent / "data" / "ort_cuda_profile.json"
STRAY = (
    UNMATCHED_KERNEL_PREFIX + "void cask_cudnn::computeOffsetsKernel<false, false>(cask_cudnn::ComputeOffsetsParams)"
)


def _events() -> list[dict]:
    return json.loads(PROFILE.read_text())


def test_a_cuda_node_is_the_sum_of_its_kernels_and_a_stray_kernel_its_own_row():
    p = parse_profile(_events(), warmup=1)
    us = 1e-6
    # run 1: sgemm 40 + split-K reduce 6; run 2: 42 + 6; the Node events' dur (host launch) is not counted
    assert p.node_times == pytest.approx({"mm": 47 * us, "add": 10 * us, "relu": 7 * us})
    assert p.kernels["mm"] == [
        "ampere_sgemm_32x32_sliced1x4_nn",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, false>",
    ]
    assert p.providers["mm"] == "CUDAExecutionProvider" and p.op_types["add"] == "Add"
    assert p.unmatched_kernels == pytest.approx({STRAY: 3 * us})  # kept, labelled, not dropped
    # the warm median of each run less its kernels: (300 - 62 - 3, 310 - 66 - 3) -> 238 us
    assert p.overhead_s == pytest.approx(238 * us)
    assert p.run_time_s == pytest.approx((47 + 10 + 7 + 3 + 238) * us)


def test_a_kernel_whose_op_name_is_not_its_nodes_has_no_parent():
    events = _events()
    for e in events:
        if e.get("cat") == "Kernel" and e["args"]["op_name"] == "Relu":
            e["args"]["op_name"] = "Conv"
    p = parse_profile(events, warmup=1)
    assert p.node_times["relu"] == 0.0
    assert any("_UnaryElementWise" in k for k in p.unmatched_kernels)


def test_a_cuda_profile_without_kernel_events_is_refused():
    events = [e for e in _events() if e.get("cat") != "Kernel"]
    with pytest.raises(UserError, match="no CUDA kernel events"):
        parse_profile(events, warmup=1)


def test_measure_joins_the_cuda_kernels_to_graph_nodes(monkeypatch):
    import onnx.parser

    from dabench_ir import execute
    from dabench_ir.frontends.onnx import load_onnx

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4, 8] x, float[8, 16] w, float[16] b) => (float[4, 16] y) {
            h = MatMul (x, w)
            z = Add (h, b)
            y = Relu (z)
        }""")
    for node, name in zip(model.graph.node, ("mm", "add", "relu"), strict=True):
        node.name = name
    graph = load_onnx(model)
    monkeypatch.setattr(execute, "resolve_provider", lambda provider: "CUDAExecutionProvider")
    monkeypatch.setattr(execute, "run_profiled", lambda *a, **k: parse_profile(_events(), warmup=1))
    m = execute.measure(model, graph, provider="cuda")
    assert m.node_times == pytest.approx({"mm": 47e-6, "add": 10e-6, "relu": 7e-6})
    assert m.unmatched == pytest.approx({STRAY: 3e-6})
    assert m.overheads_s["cuda_kernels_without_node"] == pytest.approx(3e-6)
    assert m.timeline.step_time_s == pytest.approx(305e-6)
    assert "splitKreduce" in m.notes["mm"] and not m.missing


def test_measure_on_a_gpu_refuses_without_the_cuda_provider():
    import onnxruntime

    from dabench_ir.execute import measure_provider

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("a CUDA provider is present here")
    with pytest.raises(UserError) as info:
        measure_provider("gpu", "a100")
    text = str(info.value)
    assert "\n" not in text and "CUDAExecutionProvider" in text and "--target cpu" in text
    assert measure_provider("cpu") == "cpu" and measure_provider(None) == "cpu"
    with pytest.raises(UserError, match="cannot measure --target wse"):
        measure_provider("wse", "wse")


def test_profile_measure_on_a100_is_one_line_exit_2(tiny_matmul_path, capsys):
    import onnxruntime

    from dabench_ir.cli import main

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("a CUDA provider is present here")
    assert main(["profile", str(tiny_matmul_path), "--target", "a100", "--measure"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDA execution provider" in err


def test_the_session_must_keep_the_cuda_provider(monkeypatch):
    """onnxruntime falls back to the CPU when the CUDA provider cannot start: refused, not measured."""
    import onnx.parser
    import onnxruntime

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) { y = Relu (x) }""")
    monkeypatch.setattr(ort, "resolve_provider", lambda provider: "CUDAExecutionProvider")
    real = onnxruntime.InferenceSession
    monkeypatch.setattr(
        onnxruntime, "InferenceSession", lambda src, so, providers: real(src, so, providers=["CPUExecutionProvider"])
    )
    import numpy as np

    with pytest.raises(UserError, match="could not start CUDAExecutionProvider"):
        ort.run_profiled(model, {"x": np.ones(2, dtype=np.float32)}, provider="cuda")
