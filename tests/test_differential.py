"""Differential tests: one run asked through every path gives identical figures.

A run is a small decoder on a target, in inference or training, on one chip or several. The
same run is asked through the Python API, the CLI (``profile --json``), ``--target a,b,c``
(cost once, place many), a sweep point, a validate catalogue point, a study's baseline, the
``scale`` stage and the multi-chip report, and each must give the same step time, throughput,
fit, memory, batch, precision and per-node times. A model exported with a static batch B must
give what the same model exported with a symbolic batch bound to B gives. These tests are
what keeps the paths (`dabench_ir.run`) from drifting apart again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

import dabench_ir
from dabench_ir.cli import main
from dabench_ir.pipeline import load_graph, profile_targets

MODEL = {"family": "gpt2", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 96, "batch": 2}
TARGETS = ("wse", "rdu", "ipu", "h100")
MODES = ("inference", "train")


def figures(report: dict, *, by_name: bool = True) -> dict:
    """The figures every path must agree on. Two exports of one model name their nodes apart:
    ``by_name=False`` compares the node times as a sorted list per (op type, layer)."""
    totals, metrics = report["totals"], report["metrics"]
    if by_name:
        nodes = {n["name"]: n["time_s"] for n in report["nodes"]}
    else:
        nodes = {}
        for n in report["nodes"]:
            if n["time_s"]:
                nodes.setdefault(f"{n['op_type']}@{n['layer']}", []).append(n["time_s"])
        nodes = {k: sorted(v) for k, v in nodes.items()}
    return {
        "time_s": totals["time_s"],
        "throughput": totals["throughput_samples_per_s"],
        "fits": report["fits"],
        "batch": report["config"]["batch"],
        "precision": report["config"]["precision"],
        "memory": {k: v["bytes"] for k, v in (metrics.get("memory_use") or {}).items()},
        "nodes": nodes,
        "roles": {r["role"]: r["time_s"] for r in report.get("roles") or [] if r["time_s"]},
    }


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key == "nodes" or key == "roles":
            assert a[key].keys() == b[key].keys()
            for k in a[key]:
                assert (a[key][k] is None and b[key][k] is None) or a[key][k] == pytest.approx(b[key][k], rel=1e-12), k
        elif isinstance(a[key], float):
            assert a[key] == pytest.approx(b[key], rel=1e-12), key
        else:
            assert a[key] == b[key], key


@pytest.fixture(scope="module")
def stamped(tmp_path_factory):
    """The model as sweeps and validate build it (the 1-layer base stamped to L layers), as a file,
    with the export cache that built it."""
    import onnx

    from dabench_ir.sweep import graphs

    folder = tmp_path_factory.mktemp("differential")
    cache = folder / "cache"
    key = graphs.base_key(MODEL)
    base = graphs.export_base(MODEL)
    graphs.save_base(cache, key, base)
    path = folder / "gpt2-tiny.onnx"
    onnx.save(graphs.stamped_proto(base, MODEL["layers"]), str(path))
    return path, cache


@pytest.fixture(scope="module")
def static_and_symbolic(tmp_path_factory):
    """The same model exported with a static batch and with a symbolic one."""
    from dabench_ir.models import ModelConfig, export_model

    folder = tmp_path_factory.mktemp("batch")
    cfg = ModelConfig(**MODEL)
    static, symbolic = folder / "static.onnx", folder / "symbolic.onnx"
    export_model(cfg, static, weights="none")
    export_model(cfg, symbolic, weights="none", dynamic=True)
    return static, symbolic


def _api(path: Path, target: str, **knobs) -> dict:
    return dabench_ir.profile(str(path), target=target, **knobs).to_dict()


def _scale_points(path: Path, target: str, chips: str, strategy: str, out: Path) -> list[dict]:
    """The points of ``dabench-ir scale`` of ``path`` in training on ``chips`` (a list, as the flag takes it)."""
    argv = ["scale", str(path), "-t", target, "--chips", chips, "--strategy", strategy, "--mode", "train"]
    assert main([*argv, "--json", str(out), "-q"]) == 0
    return json.loads(out.read_text())["points"]


def _flags(knobs: dict) -> list[str]:
    out = []
    for name, value in knobs.items():
        out += ["--" + name.replace("_", "-"), str(value)]
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target", TARGETS)
def test_api_cli_and_several_targets_agree(stamped, tmp_path, target, mode):
    path, _ = stamped
    api = figures(_api(path, target, mode=mode))
    out = tmp_path / "r.json"
    assert main(["profile", str(path), "-t", target, "--mode", mode, "--json", str(out), "-q"]) == 0
    _close(figures(json.loads(out.read_text())), api)
    several = profile_targets(str(path), [target, "a100"], {"mode": mode})
    _close(figures(several[target].to_dict()), api)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target", TARGETS)
def test_a_sweep_point_is_the_profile_of_its_model(stamped, target, mode):
    from dabench_ir.sweep import graphs
    from dabench_ir.sweep.worker import profile_graph

    path, cache = stamped
    params = {**MODEL, "target": target, "mode": mode, "chips": 1}
    graph = graphs.build_graph(graphs.load_base(cache, graphs.base_key(MODEL)), MODEL["layers"])
    _close(figures(profile_graph(graph, params)), figures(_api(path, target, mode=mode)))


_JSON_NATIVE = (dict, list, tuple, str, int, float, bool, type(None))


def _foreign(obj, path="report"):
    """The paths in ``obj`` holding what JSON has no type for (an enum, a float subclass, a set ...)."""
    if type(obj) not in _JSON_NATIVE:
        return [f"{path}: {type(obj).__name__}"]
    if type(obj) is dict:
        return [
            p
            for k, v in obj.items()
            for p in ([f"{path}: key {k!r}"] if type(k) is not str else []) + _foreign(v, f"{path}.{k}")
        ]
    if type(obj) in (list, tuple):
        return [p for v in obj[:50] for p in _foreign(v, f"{path}[]")]
    return []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target", TARGETS)
def test_a_report_is_plain_json_and_both_encoders_write_it_alike(stamped, target, mode):
    """Issue 34: compact reports and sweep records are written by orjson (`json_text`), indented
    ones by json. A report dict holds only JSON's own types (so neither encoder's fallback decides
    a value), and the two texts read back equal."""
    from dabench_ir.report.model import json_text

    path, _ = stamped
    data = _api(path, target, mode=mode)
    assert _foreign(data) == []
    assert json.loads(json_text(data)) == json.loads(json_text(data, indent=1)) == json.loads(json.dumps(data))


def _catalog(target: str, run: str, batch: int) -> str:
    """A one-point measurement catalogue of the test's model on ``target`` (``run``: the TOML run table's body)."""
    model = ", ".join(f"{k} = {json.dumps(batch if k == 'batch' else v)}" for k, v in MODEL.items())
    return f"""
format = "dabench-ir/measurements/v1"
[[points]]
id = "tiny-{target}"
kind = "model"
target = "{target}"
source = "this test"
model = {{ {model} }}
run = {{ {run} }}
measured = {{ samples_per_s = 1.0, step_time_s = 1.0 }}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_a_validate_point_predicts_the_profile_of_its_model(stamped, target):
    from dabench_ir.validate import parse_catalog, run_validation

    path, cache = stamped
    result = run_validation(parse_catalog(_catalog(target, 'mode = "train"', MODEL["batch"])), cache_dir=cache).results[
        0
    ]
    assert result.status == "ok", result.reason
    predicted = {q.name: q.predicted for q in result.quantities}
    api = figures(_api(path, target, mode="train"))
    assert predicted["samples_per_s"] == pytest.approx(api["throughput"], rel=1e-12)
    assert predicted["step_time_s"] == pytest.approx(api["time_s"], rel=1e-12)


def test_a_study_baseline_is_the_profile_of_its_model(stamped, tmp_path):
    from dabench_ir.options import ProfileOptions
    from dabench_ir.study import run_study

    path, _ = stamped
    run_study(path, ["none"], ["rdu", "wse"], ProfileOptions(mode="train"), out_dir=tmp_path)
    for target in ("rdu", "wse"):
        baseline = json.loads((tmp_path / f"{path.stem}.none.{target}.json").read_text())
        _close(figures(baseline), figures(_api(path, target, mode="train")))


@pytest.mark.parametrize("target", TARGETS)
def test_one_chip_of_scale_is_the_profile(stamped, tmp_path, target):
    path, _ = stamped
    strategy = {"wse": "dp", "rdu": "tp", "ipu": "pp", "h100": "dp"}[target]
    point = _scale_points(path, target, "1", strategy, tmp_path / "s.json")[0]
    api = figures(_api(path, target, mode="train"))
    assert point["time_s"] == pytest.approx(api["time_s"], rel=1e-12)
    assert point["throughput_samples_per_s"] == pytest.approx(api["throughput"], rel=1e-12)
    assert point["fits"] == api["fits"]


@pytest.mark.parametrize(("target", "strategy"), [("h100", "dp"), ("rdu", "tp"), ("wse", "dp"), ("a100", "pp")])
def test_multi_chip_runs_agree_across_sweep_validate_and_scale(stamped, tmp_path, target, strategy):
    """Two chips: the sweep point, the validate point (whose catalogue batch is the global one), the
    scale stage and the multi-chip report of `dabench_ir.run` are one run."""
    from dabench_ir.run import execute, resolve
    from dabench_ir.sweep import graphs
    from dabench_ir.sweep.worker import profile_graph
    from dabench_ir.validate import parse_catalog, run_validation

    path, cache = stamped
    knobs = {"mode": "train", "chips": 2, "strategy": strategy}
    base = graphs.load_base(cache, graphs.base_key(MODEL))
    sweep = profile_graph(graphs.build_graph(base, MODEL["layers"]), {**MODEL, "target": target, **knobs})
    graph = load_graph(str(path))
    report = execute(resolve(graph, target, knobs, model=str(path)), graph).to_dict()
    _close(figures(sweep), figures(report))
    point = _scale_points(path, target, "1,2", strategy, tmp_path / "s.json")[1]
    assert point["throughput_samples_per_s"] == pytest.approx(report["totals"]["throughput_samples_per_s"], rel=1e-12)
    assert point["time_s"] == pytest.approx(report["totals"]["time_s"], rel=1e-12)
    per_step = MODEL["batch"] * (2 if strategy == "dp" else 1)  # data parallel: each chip runs the graph's batch
    assert report["config"]["batch"] == per_step
    text = _catalog(target, f'mode = "train", chips = 2, strategy = "{strategy}"', per_step)  # the global batch
    result = run_validation(parse_catalog(text), cache_dir=cache).results[0]
    assert result.status == "ok", result.reason
    predicted = {q.name: q.predicted for q in result.quantities}
    assert predicted["samples_per_s"] == pytest.approx(report["totals"]["throughput_samples_per_s"], rel=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target", TARGETS)
def test_a_static_batch_is_the_symbolic_batch_bound(static_and_symbolic, target, mode):
    """Exported with batch 2, profiled without --batch == exported symbolic, bound with --batch 2;
    and restating the static batch on the command line changes nothing."""
    static, symbolic = static_and_symbolic
    seq = {"dims": {"seq": MODEL["seq"]}}
    fixed = figures(_api(static, target, mode=mode), by_name=False)
    assert fixed["batch"] == MODEL["batch"]
    _close(fixed, figures(_api(symbolic, target, mode=mode, batch=MODEL["batch"], **seq), by_name=False))
    _close(fixed, figures(_api(static, target, mode=mode, batch=MODEL["batch"]), by_name=False))


@pytest.mark.parametrize("target", TARGETS)
def test_no_figure_breaks_the_peak(static_and_symbolic, target):
    """The figure the batch bug broke: achieved FLOP/s never exceeds the chip's peak."""
    static, _ = static_and_symbolic
    report = dabench_ir.profile(str(static), target=target, mode="train")
    achieved = report.totals["achieved_flops_per_s"]
    assert achieved is None or achieved <= report.metrics["peak_flops_per_s"]


def test_the_report_records_the_resolved_run(static_and_symbolic):
    static, _ = static_and_symbolic
    report = dabench_ir.profile(str(static), target="wse", mode="train").to_dict()
    run = report["config"]["run"]
    knobs = run["knobs"]
    assert knobs["mode"] == {"value": "train", "source": "user"}
    assert knobs["batch"] == {"value": MODEL["batch"], "source": "model"}
    assert knobs["precision"]["source"] == "target" and knobs["precision"]["value"] == report["config"]["precision"]
    assert knobs["wse_mode"]["value"] == "auto" and knobs["wse_mode"]["chosen"] in ("pipelined", "streaming")
    assert knobs["opt_level"]["source"] == "default"
    assert run["samples"]["per_replica"] == MODEL["batch"]
