"""Issue 20's rough edges, each reproduced and found fixed."""

from __future__ import annotations

import json
import re

import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto

from dabench_ir.cli import main
from dabench_ir.ir import ValueKind


def _linear_model(*, declared: bool, extra_inits: list[TensorProto]) -> onnx.ModelProto:
    """y = x @ w (+ the extra initializers, each read by an Add so they stay in the graph)."""
    nodes = [oh.make_node("MatMul", ["x", "w"], ["h"], name="mm")]
    last = "h"
    for i, t in enumerate(extra_inits):
        nodes.append(oh.make_node("Add", [last, t.name], [f"a{i}"], name=f"add{i}"))
        last = f"a{i}"
    nodes.append(oh.make_node("Identity", [last], ["y"], name="out"))
    w = oh.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.0] * 16)
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w, *extra_inits],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    if declared:
        model.metadata_props.add(key="dabench.weights", value=json.dumps(["w"]))
    return model


def test_folded_constants_are_not_parameters():
    from dabench_ir.frontends.onnx import load_onnx

    mask = oh.make_tensor("mul_1", TensorProto.FLOAT, [2, 4], [0.0] * 8)  # a table the exporter folded
    g = load_onnx(_linear_model(declared=True, extra_inits=[mask]))
    assert g.values["mul_1"].kind is ValueKind.CONSTANT and g.num_params == 16
    # nothing declared: named RoPE tables and masks are constants, other float tensors parameters
    cos = oh.make_tensor("model.rotary_emb.cos_cached", TensorProto.FLOAT, [2, 4], [1.0] * 8)
    causal = oh.make_tensor("causal_mask", TensorProto.FLOAT, [2, 4], [0.0] * 8)
    bias = oh.make_tensor("fc.bias", TensorProto.FLOAT, [2, 4], [0.0] * 8)
    g = load_onnx(_linear_model(declared=False, extra_inits=[cos, causal, bias]))
    assert {n: v.kind for n, v in g.values.items() if n in ("w", "fc.bias", cos.name, "causal_mask")} == {
        "w": ValueKind.WEIGHT,
        "fc.bias": ValueKind.WEIGHT,
        cos.name: ValueKind.CONSTANT,
        "causal_mask": ValueKind.CONSTANT,
    }
    assert g.num_params == 16 + 8


def test_folded_layouts_of_parameters_stay_parameters():
    from dabench_ir.frontends.onnx import load_onnx

    layout = oh.make_tensor("val_2", TensorProto.FLOAT, [2, 4], [0.0] * 8)  # Transpose(fc.weight), folded
    table = oh.make_tensor("val_9", TensorProto.FLOAT, [2, 4], [0.0] * 8)  # cos(arange * inv_freq), folded
    model = _linear_model(declared=True, extra_inits=[layout, table])
    for name, sources in (("val_2", "['layers.0.fc.weight']"), ("val_9", "['arange', 'val_4']")):
        vi = model.graph.value_info.add(name=name)
        vi.metadata_props.add(key="pkg.onnxscript.optimizer.folded_from", value=sources)
    g = load_onnx(model)
    assert g.values["val_2"].kind is ValueKind.WEIGHT and g.values["val_9"].kind is ValueKind.CONSTANT


def test_report_counts_constants_beside_params(tmp_path):
    from dabench_ir.pipeline import profile

    mask = oh.make_tensor("mul_1", TensorProto.FLOAT, [2, 4], [0.0] * 8)
    path = tmp_path / "m.onnx"
    onnx.save(_linear_model(declared=True, extra_inits=[mask]), path)
    model = profile(path).to_dict()["model"]
    assert (model["params"], model["constants"]) == (16, 8)


def test_large_tensor_data_is_dropped_small_kept():
    from dabench_ir.frontends.onnx import _drop_tensor_data

    big = oh.make_tensor("big", TensorProto.FLOAT, [80, 80], [0.5] * 6400)
    shape = oh.make_tensor("shape", TensorProto.INT64, [2], [8, 800])
    graph = oh.make_graph([], "g", [], [], [big, shape])
    _drop_tensor_data(graph)
    assert not graph.initializer[0].float_data and not graph.initializer[0].raw_data
    assert list(graph.initializer[1].int64_data) == [8, 800]


def test_several_targets_write_per_target_outputs(tiny_matmul_path, tmp_path):
    out = tmp_path / "out"
    assert (
        main(
            [
                "profile",
                str(tiny_matmul_path),
                "--target",
                "rdu,wse",
                "--json",
                f"{out}/",
                "--trace",
                f"{out}/",
                "--csv",
                str(tmp_path / "c.csv"),
                "--quiet",
            ]
        )
        == 0
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == ["compare.json", "rdu.json", "trace.json", "wse.json"]  # one trace, a process per target
    assert json.loads((out / "rdu.json").read_text())["target"]["name"] == "sn30"
    assert len(json.loads((out / "compare.json").read_text())) == 2
    assert (tmp_path / "c.csv").is_file() and (tmp_path / "c-rdu.csv").is_file()
    assert (tmp_path / "c-wse.roles.csv").is_file()
    # a file name: the comparison there, each report beside it with the target's name
    assert (
        main(["profile", str(tiny_matmul_path), "--target", "rdu,wse", "--json", str(tmp_path / "r.json"), "--quiet"])
        == 0
    )
    assert (tmp_path / "r-rdu.json").is_file() and (tmp_path / "r-wse.json").is_file()


def test_json_dash_is_stdout(tiny_matmul_path, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", str(tiny_matmul_path), "--target", "rdu", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "dabench-ir/report/v1" and not (tmp_path / "-").exists()


def test_cross_check_on_mlir_input_exits_2(tmp_path, capsys):
    path = tmp_path / "m.mlir"
    path.write_text("module {}\n")
    assert main(["profile", str(path), "--cross-check"]) == 2
    assert "--cross-check" in capsys.readouterr().err


def test_measure_on_a_gpu_target_exits_2(tiny_matmul_path, capsys):
    assert main(["profile", str(tiny_matmul_path), "--target", "h100", "--measure"]) == 2
    err = capsys.readouterr().err
    assert "host" in err and "CPUExecutionProvider" in err and "--target cpu" in err


def test_quiet_silences_the_cross_check(tiny_matmul_path, capsys):
    pytest.importorskip("torch_mlir")
    assert main(["profile", str(tiny_matmul_path), "--cross-check", "-q"]) == 0
    assert capsys.readouterr().out == ""


def test_weight_cap_message_names_the_flag(tiny_matmul_path):
    from dabench_ir.errors import UserError
    from dabench_ir.pipeline import profile

    with pytest.raises(UserError, match="--max-weight-bytes"):
        profile(tiny_matmul_path, "cpu", measure=True, max_weight_bytes=1)


def test_measure_past_the_protobuf_limit_goes_through_external_data(tiny_matmul_path, monkeypatch):
    from dabench_ir.execute import ort as ort_mod
    from dabench_ir.pipeline import profile

    monkeypatch.setattr(ort_mod, "PROTO_LIMIT_BYTES", 0)  # every model counts as too large to serialize
    report = profile(tiny_matmul_path, "cpu", measure=True, warmup=0, repeat=1)
    assert report.totals["measured_time_s"] > 0


def test_calibration_table_labels_each_shape():
    from dabench_ir.commands.calibrate import _summary

    rows = [
        {
            "dtype": "fp32",
            "batch": 1,
            "m": 8,
            "k": 8,
            "n": 8,
            "packed": p,
            "cold": c,
            "flops_per_s": 1e9,
            "time_s": 1e-6,
        }
        for p in (False, True)
        for c in (False, True)
    ]
    data = {
        "calibration": {"matmul": rows, "date": "-", "threads": 1, "ort_version": "-"},
        "compute": {"peak_flops": {"fp32": {"value": 1e9}}},
        "memory": [{"bandwidth_bytes_per_s": {"value": 1e9}}],
        "overheads": {"kernel_launch_s": {"value": 1e-6}},
    }
    text = _summary(data, "cached")
    assert [line.split("1x8x8x8")[1].split("  ")[1].strip() for line in text.splitlines() if "1x8x8x8" in line] == [
        "B fed",
        "B fed, cold",
        "constant B",
        "constant B, cold",
    ]


def test_targets_json(capsys):
    assert main(["targets", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    sn30 = next(t for t in data["targets"] if t["name"] == "sn30")
    assert sn30["kind"] == "rdu" and all("source" in f for f in sn30["figures"].values())


def test_sweep_help_lists_bundled_grids(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert re.search(r"level1\s+DABench Level 1", out) and "smoke" in out


def test_scale_plots_dir_like_profile(tiny_matmul_path, tmp_path):
    pytest.importorskip("matplotlib")
    flags = ["--target", "h100", "--chips", "1,2", "--strategy", "dp", "--quiet"]
    assert main(["scale", str(tiny_matmul_path), *flags, "--plots", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if "scaling" in p.name) == ["mm-scaling.png", "mm-scaling.svg"]


def test_annotated_mlir_splits_time_and_keeps_facts(tmp_path):
    pytest.importorskip("torch_mlir")
    from dabench_ir.pipeline import profile

    text = """
    <ir_version: 9, opset_import: ["" : 18]>
    agraph (float[2,8] x) => (float[2,8] y) <float[8,8] w1 = {0.0}, float[8,8] w2 = {0.0}> {
        h = MatMul(x, w1)
        a = Relu(h)
        y = MatMul(a, w2)
    }
    """
    text = text.replace("{0.0}", "{" + ", ".join(["0.0"] * 64) + "}")
    model = onnx.parser.parse_model(text)
    model.metadata_props.add(key="dabench.weights", value=json.dumps(["w1", "w2"]))
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    ann = tmp_path / "m.ann.mlir"
    assert main(["profile", str(src), "--via", "mlir", "--target", "rdu", "--annotate", str(ann), "--quiet"]) == 0
    annotated = ann.read_text()
    times = [float(x) for x in re.findall(r"dabench\.time_s = ([0-9.eE+-]+)", annotated)]
    report = profile(src, "rdu", via="mlir")
    assert sum(times) == pytest.approx(sum(n.time_s or 0.0 for n in report.nodes), rel=1e-6)
    again = profile(ann).to_dict()["model"]
    assert again["params"] == 128  # the weights are still known as weights
