"""Measured execution: onnxruntime profiling joined to graph nodes, synthesis, fusion map."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dabench_ir.errors import UnboundSymbolError, UserError
from dabench_ir.execute import measure
from dabench_ir.execute.ort import map_fused, parse_profile
from dabench_ir.execute.synth import prepare_model
from dabench_ir.timeline import Bound
from tests._helpers import cpu_target_data


def _mlp(*, weight_input: bool = True, external_bias: bool = False, batch: int | str = "B") -> onnx.ModelProto:
    """ids -> Gather(embed) -> MatMul(w) -> Add(b) -> Relu -> Softmax; w shape-only."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, 8])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, 32])
    inputs = [ids]
    inits = [numpy_helper.from_array(np.ones((50, 16), np.float32), "embed")]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, 32]))
    else:
        inits.append(numpy_helper.from_array(np.ones((16, 32), np.float32) * 0.01, "w"))
    bias = numpy_helper.from_array(np.zeros(32, np.float32), "b")
    if external_bias:
        bias.ClearField("raw_data")
        bias.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "absent.bin"), ("offset", "0"), ("length", "128")):
            bias.external_data.add(key=k, value=v)
    inits.append(bias)
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed_lookup"),
        helper.make_node("MatMul", ["h", "w"], ["mm"], name="proj"),
        helper.make_node("Add", ["mm", "b"], ["biased"], name="bias_add"),
        helper.make_node("Relu", ["biased"], ["act"]),  # unnamed: the frontend names it Relu_3
        helper.make_node("Softmax", ["act"], ["y"], name="probs", axis=-1),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "mlp", inputs, [out], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    if weight_input:
        model.metadata_props.add(key="dabench.weights", value=json.dumps(["w"]))
    return model


def test_measured_path_times_every_node(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), str(path))
    m = measure(path, dims={"B": 2}, warmup=1, repeat=3, threads=1)
    names = ["embed_lookup", "proj", "bias_add", "Relu_3", "probs"]
    assert set(m.node_times) == set(names)
    assert m.missing == {}
    assert all(t > 0 for t in m.node_times.values())
    assert sum(m.node_times.values()) + sum(m.overheads_s.values()) == pytest.approx(m.run_time_s)
    assert m.threads == 1 and m.provider == "CPUExecutionProvider" and m.fused == {}
    assert m.synthesized == {
        "input_ids": "input",
        "w": "weight (shape-only graph input)",
    }
    # the timeline lays the nodes out one after another in graph order
    tl = m.timeline
    assert tl.source == "measured" and tl.step_time_s == m.run_time_s
    assert list(tl.nodes) == names
    assert tl.nodes["proj"].start == pytest.approx(tl.nodes["embed_lookup"].end)
    assert tl.duration("probs") == pytest.approx(m.node_times["probs"])
    assert tl.samples_per_step == 2


@pytest.mark.parametrize("data", [None, b"\0" * 64])  # absent; shorter than offset + length (128 bytes)
def test_measure_refuses_external_data_absent_or_cut_short(tmp_path, data):
    """Issue 33: running needs the weights' bytes; a missing or truncated data file is a broken
    model, refused in one line rather than filled with random numbers."""
    from dabench_ir.errors import UserError

    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(external_bias=True), str(path))
    if data is not None:
        (tmp_path / "absent.bin").write_bytes(data)
    why = "no such file" if data is None else "the file has 64 bytes, the tensor ends at byte 128"
    with pytest.raises(UserError, match=f"initializer 'b': external data 'absent.bin': {why}"):
        measure(path, dims={"B": 2}, warmup=1, repeat=1, threads=1)


def test_ort_opt_maps_fused_nodes_back():
    m = measure(_mlp(weight_input=False, batch=2), warmup=1, repeat=2, threads=1, ort_opt=True)
    # MatMul + Add (+ Relu) become one FusedGemm/FusedMatMul-like node
    assert len(m.fused) == 1
    (ort_name, members) = next(iter(m.fused.items()))
    assert members[:2] == ["proj", "bias_add"]
    # the fused kernel's time is split over every member by predicted share, and each says so
    for member in members:
        assert m.node_times[member] > 0
        assert f"fused kernel {ort_name!r}" in m.notes[member] and "predicted share" in m.notes[member]
    graph_nodes = {"embed_lookup", "proj", "bias_add", "Relu_3", "probs"}
    assert set(m.node_times) | set(m.missing) == graph_nodes
    assert not set(m.node_times) & set(m.missing)
    # one basis: the headline step is the per-node warm medians plus the measured overhead rows
    assert sum(m.node_times.values()) + sum(m.overheads_s.values()) == pytest.approx(m.run_time_s)
    assert m.timeline.step_time_s == pytest.approx(m.run_time_s)
    # every kernel onnxruntime timed is on a source node or in the onnxruntime-only row
    attributed = sum(m.node_times.values()) + m.overheads_s.get("onnxruntime_only_nodes", 0.0)
    assert attributed == pytest.approx(m.kernel_total_s, rel=0.05)


def test_bounds_and_rates_with_target():
    from dabench_ir.ir import Cost
    from dabench_ir.lowering.cpu import CpuModel
    from dabench_ir.passes.meta import COST
    from dabench_ir.pipeline import load_graph

    graph = load_graph(_mlp(batch=2))
    for node in graph.nodes:
        node.meta[COST] = Cost(contraction_flops=1000, act_bytes_in=10)
    cpu = CpuModel(peak_flops=1e9, bandwidth=1e9, overhead_s=0.0)
    m = measure(_mlp(batch=2), graph, warmup=0, repeat=1, threads=1, target=cpu)
    rate = m.rates["proj"]
    assert rate.flops_per_s == pytest.approx(1000 / m.node_times["proj"])
    assert rate.bound is Bound.COMPUTE  # intensity 100 > ridge 1
    assert m.timeline.nodes["proj"].bound is Bound.COMPUTE


def test_parse_profile_drops_warmup_and_takes_medians():
    def run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}

    def node(name, ts, dur):
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": "Add"}}

    events = [run(0, 100), node("a", 1, 90)]  # warm-up
    for i, (da, db) in enumerate([(10, 1), (30, 3), (20, 2)]):
        base = 1000 * (i + 1)
        events += [run(base, 50), node("a", base + 1, da), node("b", base + 40, db)]
    prof = parse_profile(events, warmup=1)
    assert prof.node_times == {"a": pytest.approx(20e-6), "b": pytest.approx(2e-6)}
    # warm-median basis: kernel medians 20 + 2, plus the median run overhead (50-11, 50-33, 50-22) = 28
    assert prof.overhead_s == pytest.approx(28e-6) and prof.run_time_s == pytest.approx(50e-6)
    assert prof.run_median_s == pytest.approx(50e-6)
    assert prof.order == ["a", "b"] and prof.op_types["a"] == "Add"


def test_map_fused_on_handwritten_graphs():
    original = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Transpose", ["w0"], ["wt"], name="t", perm=[1, 0]),  # constant: folded
                helper.make_node("MatMul", ["x", "wt"], ["mm"], name="mm"),
                helper.make_node("Add", ["mm", "b"], ["y0"], name="add"),
                helper.make_node("Relu", ["y0"], ["y"], name="relu"),
                helper.make_node("Identity", ["y"], ["z"], name="ident"),  # merged into relu
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])],
            [
                numpy_helper.from_array(np.ones((4, 4), np.float32), "w0"),
                numpy_helper.from_array(np.ones(4, np.float32), "b"),
            ],
        )
    )
    optimized = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Gemm", ["x", "wt_folded", "b"], ["y0"], name="fused_gemm"),
                helper.make_node("Relu", ["y0"], ["z"], name="relu"),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])],
        )
    )
    fmap = map_fused(original, optimized)
    assert fmap.members == {"fused_gemm": ["mm", "add"], "relu": ["relu", "ident"]}
    assert fmap.anchors == {"fused_gemm": "mm", "relu": "relu"}
    assert fmap.folded == {"t"}
    assert fmap.removed == set()
    assert fmap.inserted == set()


def test_synthesis_binds_dims_and_bounds_token_ids():
    prepared = prepare_model(_mlp(), dims={"B": 3})
    ids = prepared.feeds["input_ids"]
    assert ids.shape == (3, 8) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 50  # below the Gather table's 50 rows
    w = next(i for i in prepared.model.graph.initializer if i.name == "w")
    assert tuple(w.dims) == (16, 32) and len(w.raw_data) == 16 * 32 * 4
    assert "w" not in {vi.name for vi in prepared.model.graph.input}
    assert prepared.synthesized_bytes == 3 * 8 * 8 + 16 * 32 * 4


def test_synthesis_refuses_above_the_cap_with_bytes_needed():
    with pytest.raises(UserError, match="needs 2,112 bytes"):
        prepare_model(_mlp(), dims={"B": 1}, max_weight_bytes=1000)  # ids 64 + w 2048 bytes


def test_synthesis_needs_bound_dims():
    with pytest.raises(UnboundSymbolError, match="B"):
        prepare_model(_mlp())


def test_map_fused_joins_inserted_nodes_to_the_group_they_work_for():
    """MatMulAddFusion on 3-D input: Reshape -> Gemm -> Reshape; only the last keeps an original tensor."""
    f = TensorProto.FLOAT
    original = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
                helper.make_node("Add", ["mm", "b"], ["y"], name="add"),
            ],
            "g",
            [helper.make_tensor_value_info("x", f, [1, 2, 4])],
            [helper.make_tensor_value_info("y", f, [1, 2, 4])],
            [
                numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
                numpy_helper.from_array(np.ones(4, np.float32), "b"),
            ],
        )
    )
    optimized = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Reshape", ["x", "s2"], ["x2"], name="gemm_input_reshape"),
                helper.make_node("Gemm", ["x2", "w", "b"], ["g"], name="gemm"),
                helper.make_node("Reshape", ["g", "s3"], ["y"], name="gemm_output_reshape"),
            ],
            "g",
            [helper.make_tensor_value_info("x", f, [1, 2, 4])],
            [helper.make_tensor_value_info("y", f, [1, 2, 4])],
        )
    )
    fmap = map_fused(original, optimized)
    assert fmap.members == {"gemm_output_reshape": ["mm", "add"]}
    assert fmap.joined == {"gemm": "gemm_output_reshape", "gemm_input_reshape": "gemm_output_reshape"}
    assert fmap.inserted == set()


def test_node_benchmarks_refuse_a_model_above_the_cap_before_estimating_its_nodes(tmp_path, monkeypatch):
    """A model too big to synthesise is refused by the cap first: its missing node shapes are not
    estimated (a 10,000-layer decoder estimated 360,000 nodes, then copied its proto, to be refused)."""
    from dabench_ir.execute import microbench
    from dabench_ir.frontends.onnx import load_onnx

    model = _mlp(batch=2)
    graph = load_onnx(model)
    assert microbench.signature_groups(graph)  # shapes the (absent) table lacks

    def estimated(*_args, **_kwargs):
        raise AssertionError("estimated before the cap refused the model")

    monkeypatch.setattr(microbench, "plan_signatures", estimated)
    with pytest.raises(UserError, match="needs 2,176 bytes"):
        microbench.ensure_node_table(model, graph, tmp_path / "cpu.toml", max_weight_bytes=1000)


def test_a_run_over_several_chips_is_neither_measured_nor_placed_as_one_chip():
    """``--measure`` with ``--chips N`` was measured and then dropped (the report was the scaling
    stage's): it is refused when the run is resolved. The plan-only fit check answered a multi-chip
    question with one chip's plan: it refuses such a run (`placed` answers it)."""
    from dabench_ir.errors import UserError
    from dabench_ir.run import placement, resolve
    from tests.lowering_graphs import decoder

    graph = decoder(layers=1, hidden=64, batch=2)
    with pytest.raises(UserError, match="cannot measure a run over --chips 2"):
        resolve(graph, "h100", {"measure": True, "chips": 2, "strategy": "tp"})
    with pytest.raises(ValueError, match="placement\\(\\) places one chip"):
        placement(resolve(graph, "h100", {"chips": 2, "strategy": "tp"}), graph.clone())
    assert placement(resolve(graph, "h100", {}), graph.clone()).fits


def test_an_inserted_input_reshape_joins_its_gemm_not_the_node_before_it():
    """With a mapped node before the Gemm (a norm), the input reshape's producer is mapped and its
    consumer (the Gemm) not yet joined: it joined the norm (a measured norm took the q/k/v reshapes'
    time). Consumers first, to a fixed point: it joins the Gemm's group."""
    f = TensorProto.FLOAT
    init = [
        numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
        numpy_helper.from_array(np.ones(4, np.float32), "b"),
    ]
    original = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Relu", ["x"], ["r"], name="norm"),
                helper.make_node("MatMul", ["r", "w"], ["mm"], name="mm"),
                helper.make_node("Add", ["mm", "b"], ["y"], name="add"),
            ],
            "g",
            [helper.make_tensor_value_info("x", f, [1, 2, 4])],
            [helper.make_tensor_value_info("y", f, [1, 2, 4])],
            init,
        )
    )
    optimized = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Relu", ["x"], ["r"], name="norm"),
                helper.make_node("Reshape", ["r", "s2"], ["x2"], name="gemm_input_reshape"),
                helper.make_node("Gemm", ["x2", "w", "b"], ["g"], name="node_mm/MatMulAddFusion"),
                helper.make_node("Reshape", ["g", "s3"], ["y"], name="gemm_output_reshape"),
            ],
            "g",
            [helper.make_tensor_value_info("x", f, [1, 2, 4])],
            [helper.make_tensor_value_info("y", f, [1, 2, 4])],
        )
    )
    fmap = map_fused(original, optimized)
    joined = {"node_mm/MatMulAddFusion": "gemm_output_reshape", "gemm_input_reshape": "gemm_output_reshape"}
    assert fmap.joined == joined  # the Gemm's name sorts after the reshape's, as onnxruntime's do


@pytest.mark.parametrize(
    ("knobs", "words"),
    [
        ({"mode": "train"}, "cannot time a training step"),
        ({"precision": "fp16"}, "--precision fp16 rewrites the graph"),
        ({"fused_attention": True}, "--fused-attention true rewrites the graph"),
        ({"micro_batches": 2}, "--micro-batches splits a step into micro-batches on a target; give --target"),
    ],
)
def test_a_measurement_refuses_what_would_describe_another_graph_than_the_one_timed(knobs, words):
    """onnxruntime runs the file as exported, its whole batch in one call: a training step, a precision
    or fusion rewrite, or micro-batches would label the forward pass it timed as something else (a
    "train" step at 3x the achieved rate, fp16 bytes beside fp32 times)."""
    from dabench_ir.run import resolve
    from tests.lowering_graphs import decoder

    graph = decoder(layers=1, hidden=64, batch=2)
    with pytest.raises(UserError, match=re.escape(words)):
        resolve(graph, None, {"measure": True, **knobs})
    with pytest.raises(UserError, match=re.escape(words) if "give --target" not in words else "micro-batch"):
        resolve(graph, "cpu", {"measure": True, **knobs})


@pytest.mark.parametrize("target", [None, "cpu"])
def test_a_measured_runs_csv_gives_every_measured_second_a_row(tiny_matmul_path, tmp_path, target):
    """onnxruntime's session time between its kernels is a row of its own in the CSV's measured column:
    with ``-t cpu`` it was in the JSON's extra alone (the column summed to 24 of 43 µs), without a
    target its row carried the time but not the measured time."""
    import csv

    from dabench_ir.cli import main

    out = tmp_path / "m"
    argv = ["profile", str(tiny_matmul_path), "--measure", "--repeat", "3", "-q", "--json", f"{out}.json"]
    assert main([*argv, "--csv", f"{out}.csv", *(["-t", target] if target else [])]) == 0
    with open(f"{out}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    measured = json.loads((tmp_path / "m.json").read_text())["totals"]["measured_time_s"]
    column = [float(r["measured_time_s"]) for r in rows if r["measured_time_s"]]
    assert sum(column) == pytest.approx(measured, rel=1e-9)
    assert any(r["kind"] == "overhead" and r["measured_time_s"] for r in rows)


def test_the_nodes_of_an_if_branch_are_timed_inside_their_if_not_beside_it(tmp_path):
    """onnxruntime's profile has an event for each node of a taken If branch, inside the If's own event:
    they were added beside it (as a row of nodes onnxruntime ran that the graph lacks), counting the
    branch twice (a 1.80 ms run reported as 3.47 ms)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.random((128, 128), dtype=np.float32), "W")
    ty = [1, 128, 128]
    then = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["t1"], name="then_mm1"),
            helper.make_node("MatMul", ["t1", "W"], ["t"], name="then_mm2"),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ty)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["X"], ["e"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, ty)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Greater", ["s", "z"], ["cond"], name="cmp"),
            helper.make_node("If", ["cond"], ["Y"], name="iff", then_branch=then, else_branch=other),
        ],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ty),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ty)],
        [weight, numpy_helper.from_array(np.array(-1.0, np.float32), "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "if.onnx"
    onnx.save(model, path)
    result = measure(str(path), repeat=5, warmup=1)
    assert set(result.node_times) == {"cmp", "iff"} and not result.unmatched
    assert "onnxruntime_only_nodes" not in result.overheads_s
    assert result.run_time_s == pytest.approx(sum(result.node_times.values()) + sum(result.overheads_s.values()))


def test_a_measured_summary_says_how_many_nodes_doing_work_went_unmeasured(tmp_path):
    """onnxruntime's optimiser folds an If on a constant condition: the node has bytes but no measured
    time, and the summary said nothing of it (its row showed '-' beside a note)."""
    from dabench_ir.api import profile
    from dabench_ir.report.table import render_table

    ty = [4, 16]
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(np.ones(ty, np.float32)))],
        "branch",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, ty)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["mm"], name="mm"),
            helper.make_node("Constant", [], ["cond"], name="cond", value=numpy_helper.from_array(np.array(True))),
            helper.make_node("If", ["cond"], ["f"], name="iff", then_branch=branch, else_branch=branch),
            helper.make_node("Add", ["mm", "f"], ["Y"], name="add"),
        ],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ty)],
        [numpy_helper.from_array(np.ones((16, 16), np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "if.onnx"
    onnx.save(model, path)
    report = profile(str(path), measure=True, ort_opt=True, repeat=3)
    line = next(x for x in render_table(report, color=False).splitlines() if x.strip().startswith("unmeasured"))
    assert "1 node(s) doing work have no measured time" in line and "constant-folded" in line


def _matmul_add(rows: int | None = 4) -> onnx.ModelProto:
    """x[rows, 64] @ W[64, 32] + B[32]: the pair onnxruntime's optimiser fuses into one Gemm (``rows``
    None: an input dim with neither a size nor a name, as ``[None, 64]`` writes it)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "B"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "B"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "mm_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 32])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_an_unnamed_input_dim_is_bound_by_the_name_the_advice_gives(capsys):
    """``x: [None, 64]``: the frontend names the dim after its input (``x_dim0``), the name the advice
    gives, and the batch binds it. Shape inference had left the whole input unshaped (``--batch 4``:
    "it has no shaped input") and named the dim only where it flowed on (``unk__0``), which emulation
    took but the measurement, looking on the input itself, refused ("<unnamed dim of x>")."""
    from dabench_ir.frontends.onnx import load_onnx

    model = _matmul_add(rows=None)
    graph = load_onnx(model)
    assert graph.values["x"].type.shape == ("x_dim0", 64) and graph.batch_dim == "x_dim0"
    assert not model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # the caller's model untouched
    with pytest.raises(UnboundSymbolError, match="x_dim0"):
        prepare_model(model, graph=graph)
    assert prepare_model(model, graph=graph, dims={"x_dim0": 4}).feeds["x"].shape == (4, 64)
    m = measure(model, dims={"x_dim0": 4}, warmup=1, repeat=1, threads=1)
    assert set(m.node_times) == {"mm", "add"} and m.missing == {}


def test_the_api_splits_a_fused_kernel_as_the_cli_does(tmp_path, monkeypatch, capsys):
    """`measure` had loaded the graph without costs: no prediction to split a fused kernel by, so equal
    shares, labelled "(bytes moved)". It costs the graph as ``profile --measure`` does; a graph given
    without costs is split equally and says so."""
    from dabench_ir.cli import main
    from dabench_ir.frontends.onnx import load_onnx

    monkeypatch.setenv("DABENCH_IR_CACHE", str(tmp_path / "cache"))  # no calibration: bytes moved
    path = tmp_path / "mm_add.onnx"
    onnx.save(_matmul_add(), str(path))
    m = measure(path, warmup=1, repeat=1, threads=1, ort_opt=True)
    assert list(m.fused.values()) == [["mm", "add"]]
    # bytes moved: MatMul (4x64 + 64x32 + 4x32) x 4 B = 9,728; Add (4x32 + 32 + 4x32) x 4 B = 1,152
    share = m.node_times["mm"] / (m.node_times["mm"] + m.node_times["add"])
    assert share == pytest.approx(9728 / 10880)
    assert "89% of onnxruntime's fused kernel" in m.notes["mm"] and m.notes["mm"].endswith("(bytes moved)")
    capsys.readouterr()
    out = tmp_path / "r.json"
    assert main(["profile", str(path), "--measure", "--ort-opt", "--threads", "1", "--json", str(out), "-q"]) == 0
    cli = {n["name"]: n["note"] for n in json.loads(out.read_text())["nodes"]}
    assert cli["mm"].split(" (Gemm")[0] == m.notes["mm"].split(" (Gemm")[0]
    uncosted = measure(path, load_onnx(str(path)), warmup=1, repeat=1, threads=1, ort_opt=True)
    assert "50% of" in uncosted.notes["mm"] and uncosted.notes["mm"].endswith(
        "in equal shares (no member has a prediction)"
    )


def test_a_fused_kernel_is_split_by_the_calibration_at_the_measured_thread_count(tmp_path, monkeypatch):
    """Without a target the split had used the calibration of the default thread count, whatever
    count the model was measured at."""
    from dabench_ir.execute import calibrate as cal
    from dabench_ir.execute.calibrate import dump_toml

    target = tmp_path / "cpu.toml"
    target.write_text(dump_toml(cpu_target_data()))
    asked = []

    def path_for(threads=None, **_kwargs):
        asked.append(threads)
        return target

    monkeypatch.setattr(cal, "cpu_target_path", path_for)
    m = measure(_matmul_add(), warmup=1, repeat=1, threads=1, ort_opt=True)
    assert asked == [1]
    assert m.notes["mm"].endswith("(host-CPU model)")


def test_a_measurement_against_a_calibrated_target_runs_at_its_thread_count(monkeypatch):
    """A calibration holds at its own thread count: measured against it, the run takes that count,
    and another one is refused (its peak and its node times would describe another machine)."""
    monkeypatch.setattr("dabench_ir.execute.default_threads", lambda: 2)
    target = cpu_target_data(threads=1)
    assert measure(_matmul_add(), warmup=0, repeat=1, target=target).threads == 1
    assert measure(_matmul_add(), warmup=0, repeat=1).threads == 2
    with pytest.raises(UserError, match="calibrated at 1 thread"):
        measure(_matmul_add(), warmup=0, repeat=1, threads=2, target=target)
