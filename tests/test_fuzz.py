"""Property-based fuzzing of the command line (issue 21): malformed graphs, metadata, paths,
specs, reports and caches. The contract for every command and every input:

- exit 0 with a valid result (the JSON it wrote parses and has the schema), or
- exit 2 with exactly one line on stderr,
- never anything else: no exit 1 (internal error), no traceback, no crash, no hang.

Bounded: few examples per property, no deadline; the whole file runs in well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dabench_ir.cli import main
from tests.conftest import property_settings

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = property_settings("DABENCH_FUZZ_EXAMPLES", 40)


def run(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def contract(*argv: object, outputs: tuple[Path, ...] = ()) -> int:
    """Run the command; assert the contract; return the exit code (0 or 2)."""
    code, _, err = run(*argv)
    assert "Traceback" not in err, err
    assert code in (0, 2), f"exit {code}: {err}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, f"expected one line, got: {err!r}"
        assert lines[0].startswith("dabench-ir: error:"), lines[0]
    else:
        for path in outputs:
            if path.suffix == ".json" and path.is_file():
                doc = json.loads(path.read_text(encoding="utf-8"))
                assert isinstance(doc, dict) and "schema" in doc
    return code


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="dabench-fuzz-") as d:
        yield Path(d)


# -- graphs -------------------------------------------------------------------------------------------------
_OPS = [
    "MatMul",
    "Add",
    "Mul",
    "Relu",
    "Softmax",
    "Gemm",
    "Transpose",
    "Reshape",
    "Concat",
    "LayerNormalization",
    "Gather",
    "Conv",
    "ReduceMean",
    "Cast",
    "Identity",
    "Where",
    "Foo",
    "Shape",
    "Expand",
    "Sqrt",
]
_DIMS = st.one_of(st.integers(-2, 6), st.sampled_from(["batch", "seq", "", "n", 2**31, 2**62]))
_ELEM = st.one_of(st.sampled_from([1, 1, 1, 10, 16, 7, 6, 9]), st.integers(0, 40))


@st.composite
def graphs(draw) -> bytes:
    """A small ONNX model, usually well-formed, often not: bad dims, element types, wiring, cycles, metadata."""
    n_inputs = draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(n_inputs)]
    inputs = [helper.make_tensor_value_info(n, draw(_ELEM), draw(st.lists(_DIMS, max_size=4))) for n in names]
    nodes = []
    pool = list(names)
    for i in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(_OPS))
        k = draw(st.integers(1, 3))
        ins = [draw(st.sampled_from([*pool, f"v{i + 1}", "missing", ""])) for _ in range(k)]  # forward refs: cycles
        out = f"v{i}"
        node = helper.make_node(op, ins, [out], name=draw(st.sampled_from([f"n{i}", "", "=cmd|x", "n0", "@a"])))
        if draw(st.booleans()):
            node.metadata_props.add(
                key="pkg.torch.onnx.name_scopes",
                value=draw(st.sampled_from(["['layers.0', 'mm']", "5", "[[[", "{'a': 1}", "x"])),
            )
        nodes.append(node)
        pool.append(out)
    outputs = [helper.make_tensor_value_info(pool[-1], draw(_ELEM), None)]
    inits = []
    if draw(st.booleans()):
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        inits.append(helper.make_tensor("w", TensorProto.FLOAT, shape, [0.5] * math.prod(shape)))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", draw(st.sampled_from([13, 17, 18, 99])))])
    model.ir_version = draw(st.sampled_from([8, 9, 0]))
    if draw(st.booleans()):
        model.metadata_props.add(key="dabench.weights", value=draw(st.sampled_from(['["w"]', "5", "{}", "[", "[1]"])))
    data = model.SerializeToString()
    if draw(st.integers(0, 4)) == 0:  # damage the bytes
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(max_size=8))
    return data


@FUZZ
@given(data=graphs(), target=st.sampled_from([None, "rdu", "wse", "ipu", "h100", "wse,rdu"]))
def test_profile_any_graph(workdir, data, target):
    model = workdir / "g.onnx"
    model.write_bytes(data)
    out = workdir / "r.json"
    out.unlink(missing_ok=True)
    argv = ["profile", model, "-q", "--json", out] + (["--target", target] if target else [])
    contract(*argv, outputs=(out,))


@settings(FUZZ, max_examples=max(4, FUZZ.max_examples // 3))
@given(data=graphs())
def test_profile_measure_any_graph(workdir, data):
    model = workdir / "m.onnx"
    model.write_bytes(data)
    contract("profile", model, "-q", "--measure", "--dim", "batch=1", "--dim", "seq=2", "--dim", "n=2")


# -- paths -------------------------------------------------------------------------------------------------
_SPECIAL_PATHS = [
    "{dir}",
    "{dir}/missing/r.json",
    "/proc/self/r.json",
    "{model}",
    "/dev/null",
    "{dir}/" + "y" * 300,
    "{dir}/ok.json",
    "{dir}/sub/",
    "{file}/r.json",
    "-",
]


@FUZZ
@given(
    flag=st.sampled_from(["--json", "--csv", "--html", "--trace", "--annotate", "--plots"]),
    path=st.one_of(st.sampled_from(_SPECIAL_PATHS), st.text(min_size=1, max_size=20).map(lambda t: "{dir}/" + t)),
)
def test_profile_output_paths(workdir, flag, path):
    model = workdir / "mm.onnx"
    if not model.exists():
        onnx.save(
            helper.make_model(
                helper.make_graph(
                    [helper.make_node("MatMul", ["A", "B"], ["C"])],
                    "g",
                    [helper.make_tensor_value_info("A", 1, [2, 3]), helper.make_tensor_value_info("B", 1, [3, 4])],
                    [helper.make_tensor_value_info("C", 1, [2, 4])],
                )
            ),
            model,
        )
    (workdir / "afile").write_text("x")
    before = model.read_bytes()
    target = path.replace("{dir}", str(workdir)).replace("{model}", str(model))
    target = target.replace("{file}", str(workdir / "afile")).replace("\0", "_")
    contract("profile", model, "--target", "rdu", "-q", flag, target)
    assert model.read_bytes() == before  # never the input
    assert stat_kind("/dev/null") == "char"


def stat_kind(path: str) -> str:
    import stat

    mode = os.stat(path).st_mode
    return "char" if stat.S_ISCHR(mode) else "other"


# -- specs --------------------------------------------------------------------------------------------------
_KEYS = [
    "layers",
    "hidden",
    "seq",
    "batch",
    "target",
    "precision",
    "chips",
    "strategy",
    "family",
    "heads",
    "opt_level",
    "mode",
    "junk",
    "preset",
    "vocab",
]
_SCALARS = st.one_of(
    st.integers(-5, 10**6),
    st.just(99999999999999999999),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["rdu", "wse", "nosuch", "gpt2", "fp16", "dp", "", "llama"]),
    st.booleans(),
)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


@FUZZ
@given(
    defaults=st.dictionaries(st.sampled_from(_KEYS), _SCALARS, max_size=4),
    axes=st.dictionaries(st.sampled_from(_KEYS), st.lists(_SCALARS, min_size=0, max_size=4), max_size=3),
    garbage=st.one_of(st.none(), st.binary(max_size=30), st.text(max_size=30)),
)
def test_sweep_any_spec(workdir, defaults, axes, garbage):
    spec = workdir / "spec.toml"
    if isinstance(garbage, bytes):
        spec.write_bytes(garbage)
    else:
        text = "[defaults]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in defaults.items())
        text += "[axes]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in axes.items())
        spec.write_text(text + (garbage or ""))
    contract("sweep", spec, "--dry-run")


# -- reports given to compare ------------------------------------------------------------------------------
_JSON = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False), st.text(max_size=8)
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
_REPORT_KEYS = ["model", "totals", "nodes", "target", "metrics", "fits", "units", "failure", "config"]
_NODE_KEYS = ["name", "op_type", "time_s", "bound", "flops", "bytes", "layer", "energy_j"]


@FUZZ
@given(
    fields=st.dictionaries(st.sampled_from(_REPORT_KEYS), _JSON, max_size=4),
    nodes=st.lists(st.dictionaries(st.sampled_from(_NODE_KEYS), _JSON, max_size=4), max_size=3),
    normalize=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
)
def test_compare_any_report(workdir, fields, nodes, normalize):
    doc = {"schema": "dabench-ir/report/v1", "model": {}, "totals": {}, "nodes": nodes, **fields}
    report = workdir / "rep.json"
    report.write_text(json.dumps(doc))
    out = workdir / "cmp.json"
    argv = ["compare", report, "-q", "--json", out]
    if normalize is not None:
        argv += ["--normalize-to", repr(normalize)]
    contract(*argv, outputs=(out,))


@FUZZ
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6)))
def test_targets_normalize_to(value):
    contract("targets", "--normalize-to", value if isinstance(value, str) else repr(value))


@FUZZ
@given(target=st.text(max_size=12))
def test_profile_any_target_name(workdir, target):
    model = workdir / "t.onnx"
    if not model.exists():
        onnx.save(
            helper.make_model(
                helper.make_graph(
                    [helper.make_node("Relu", ["x"], ["y"])],
                    "g",
                    [helper.make_tensor_value_info("x", 1, [4])],
                    [helper.make_tensor_value_info("y", 1, [4])],
                )
            ),
            model,
        )
    if "cpu" in target.lower():
        return  # cpu calibrates the host: not for a fuzz loop
    contract("profile", model, "-q", "--target", target.replace("\0", ""))


# -- caches ------------------------------------------------------------------------------------------------
@FUZZ
@given(
    content=st.one_of(
        st.binary(max_size=40),
        st.text(max_size=80),
        st.sampled_from(["calibration = 5\n", "[calibration]\nformat = 1\n", "[compute]\n"]),
    )
)
def test_calibration_cache_of_any_content(workdir, content, monkeypatch_module):
    from dabench_ir.execute.calibrate import calibration_status

    monkeypatch_module.setenv("DABENCH_IR_CACHE", str(workdir / "cache"))
    path, _ = calibration_status(None, allow_quick=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    _, reason = calibration_status(None, allow_quick=True)
    assert reason is not None  # never accepted, never a traceback


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@FUZZ
@given(record=_JSON)
def test_sweep_point_file_of_any_content(workdir, record):
    from dabench_ir.sweep.results import read_point, record_row

    folder = workdir / "points"
    folder.mkdir(exist_ok=True)
    (folder / "k.json").write_text(json.dumps(record))
    got = read_point(folder, "k")
    assert got is None or isinstance(record_row(got), dict)


# ==== issue 33 (harden33): paths inside files, outputs of one run, graph wiring =============

_SEGMENT = st.sampled_from(["..", ".", "a", "b", "k.csv", "/etc", "/etc/passwd", "", "sub/..", "../.."])


@FUZZ
@given(parts=st.lists(_SEGMENT, min_size=1, max_size=4))
def test_catalogue_file_paths_stay_inside_the_folder(workdir, parts):
    """A catalogue's kernels_csv: resolved inside the catalogue's folder, or one line; never read outside."""
    folder = workdir / "cat" / "inner"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "k.csv").write_text("kernel,active_pes\nmm0,10\n")
    name = "/".join(parts)
    cat = folder / "c.toml"
    cat.write_text(
        f'[[points]]\nid = "p"\nkind = "model"\ntarget = "wse"\nsource = "t"\n'
        f'model = {{ family = "gpt2", layers = 1, hidden = 64, heads = 4, seq = 8, batch = 1 }}\n'
        f"measured = {{ kernels_csv = {json.dumps(name)} }}\n"
    )
    from dabench_ir.errors import UserError
    from dabench_ir.validate import load_catalog

    try:
        load_catalog(cat)
    except UserError as exc:
        assert "\n" not in str(exc)
        resolved = Path(os.path.realpath(folder / name))
        assert os.path.isabs(name) or not resolved.is_relative_to(folder.resolve()) or "kernels_csv" in str(exc)
    else:
        assert not os.path.isabs(name) and Path(os.path.realpath(folder / name)).is_relative_to(folder.resolve())


_OUT_NAMES = st.sampled_from(["m.onnx", "o.x", "o.roles.csv", "o.csv", "p/m-roofline.png", "p/", "o.json"])


@FUZZ
@given(
    flags=st.dictionaries(st.sampled_from(["--json", "--csv", "--html", "--trace", "--plots"]), _OUT_NAMES, max_size=4)
)
def test_profile_outputs_never_overwrite_an_input_or_each_other(workdir, flags):
    """Every output of one run is distinct from the others and from the model, or the run is refused."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    model = run_dir / "m.onnx"
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    before = model.read_bytes()
    argv = ["profile", model, "--target", "rdu", "-q"]
    for flag, name in flags.items():
        argv += [flag, run_dir / name]
    contract(*argv)
    assert model.read_bytes() == before


_WIRING = [
    "agraph (float[4,7] A, float[64,64] B) => (float[4,64] C) { C = MatMul(A, B) }",
    "agraph (float[4,7] A) => (float[4,7] C) { C = MatMul(A) }",
    "agraph (float[4,7] A) => (float[4,7] C) { C = Relu(X) }",
    "agraph (float[4,7] A) => (float[4,7] C) { C = Relu(A)\n C = Relu(A) }",
    "agraph (float[4,7] A) => (float[4,7] A2) { A2 = Relu(A)\n A = Relu(A2) }",
]


@FUZZ
@given(text=st.sampled_from(_WIRING), drop=st.integers(0, 3))
def test_miswired_graphs_are_one_line(workdir, text, drop):
    """A graph whose tensors are miswired (arity, undefined, defined twice, shapes an op refuses): exit 2."""
    from tests.conftest import parse

    model = parse(text)
    if drop and len(model.graph.node[0].input) > 1:
        del model.graph.node[0].input[-1]
    path = workdir / "wired.onnx"
    path.write_bytes(model.SerializeToString())
    assert contract("profile", path, "-q") == 2


# == knobs against the option table (issues 32, 33: the flags32 helper) =======================================
# Any mix of run, target and scale flags on any target: exit 0 or one line, and a run that exits 0 took
# only knobs the table (dabench_ir.options.KNOBS) says apply to its target kind, mode and strategy.
_KNOB_VALUES = ["1", "2", "4", "auto", "0.5", "0,4", "true", "false", "3", "100000000"]
_KNOB_TARGETS = {None: None, "rdu": "rdu", "wse": "wse", "ipu": "ipu", "h100": "gpu"}


def _knob_model(workdir: Path) -> Path:
    path = workdir / "knobs.onnx"
    if not path.exists():
        w = helper.make_tensor("W", TensorProto.FLOAT, [8, 8], [0.5] * 64)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
            initializer=[w],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


@st.composite
def knob_flags(draw) -> dict[str, str]:
    from dabench_ir.options import PROFILE, knobs_for

    knobs = {n: k for n, k in knobs_for(PROFILE).items() if k.group not in ("measure", "scenario") and n != "dims"}
    chosen = draw(st.lists(st.sampled_from(sorted(knobs)), max_size=4, unique=True))
    out = {}
    for name in chosen:
        k = knobs[name]
        out[name] = "" if k.is_switch else draw(st.sampled_from(list(k.choices) if k.choices else _KNOB_VALUES))
    return out


@FUZZ
@given(target=st.sampled_from(sorted(_KNOB_TARGETS, key=str)), flags=knob_flags(), batch=st.sampled_from(["1", "4"]))
def test_profile_any_knobs_on_any_target(workdir, target, flags, batch):
    from dabench_ir.options import KNOBS

    argv = ["profile", _knob_model(workdir), "-q", "--dim", f"batch={batch}"] + (["-t", target] if target else [])
    for name, value in flags.items():
        argv += [KNOBS[name].flag] + ([value] if value else [])
    if contract(*argv) != 0:
        return
    kind, mode = _KNOB_TARGETS[target], flags.get("mode", "inference")
    for name, value in flags.items():
        k = KNOBS[name]
        assert k.targets is None or kind in k.targets, f"{k.flag} taken on {target}"
        assert k.group != "scale" or target is not None, f"{k.flag} taken with no target"
        assert k.modes is None or mode in k.modes or k.validate(value) == k.default, f"{k.flag} {value} taken in {mode}"
        assert k.strategies is None or k.validate(value) == k.default or flags.get("strategy") in (None, *k.strategies)
