"""Issue 46: one schema per file format. A bad field of a target file, a study file, a measurement
catalogue, a kernel table or a ``.mlir`` header is one line naming the file, the field and the
allowed range (a UserError: exit 2), and no output overwrites a file the run reads."""

from __future__ import annotations

import math
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from dabench_ir.cli import main
from dabench_ir.errors import TargetError, UserError
from dabench_ir.schema import COUNT, FINITE, FRACTION, NON_NEGATIVE, POSITIVE, check, violates


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(code: int, err: str, *needles: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- the shared ranges ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        (FINITE, [-1, 0, 2.5], [math.nan, math.inf, True, "1"]),
        (NON_NEGATIVE, [0, 3.5], [-1e-9, math.inf]),
        (POSITIVE, [1e-30, 7], [0, -1, math.nan]),
        (FRACTION, [1, 0.5, 1e-9], [0, 1.7, -0.1, math.nan]),
        (COUNT, [1, 132, 128.0], [0, 132.5, -4, math.inf, True]),
    ],
)
def test_ranges(rule, good, bad):
    assert all(violates(v, rule) is None for v in good)
    for v in bad:
        with pytest.raises(UserError, match=r"^f\.toml: x must be ") as err:
            check(v, rule, "f.toml: x")
        assert rule.text in str(err.value)


# -- target files ----------------------------------------------------------------------------------
def _h100() -> dict:
    return tomllib.loads((resources.files("dabench_ir.targets") / "h100.toml").read_text())


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("process.area_mm2.value", 0, "process.area_mm2.value must be a finite number > 0, got 0"),
        ("energy.static_fraction.value", 1.7, "energy.static_fraction.value must be a fraction in (0, 1], got 1.7"),
        ("energy.pj_per_flop.fp32.value", -1.0, "energy.pj_per_flop.fp32.value must be a finite number > 0"),
        ("energy.pj_per_byte.hbm.value", math.nan, "energy.pj_per_byte.hbm.value must be a finite number > 0"),
        ("arch.gemm_tile.value", 0, "arch.gemm_tile.value must be a positive integer below 2^31, got 0"),
        ("compute.units.value", 132.5, "compute.units.value must be a positive integer below 2^31, got 132.5"),
        ("defaults.precision.value", "fp128", "defaults.precision.value 'fp128': expected one of fp32"),
        ("compute.peak_flops.fp128", {"value": 1e15, "source": "s"}, "compute.peak_flops.fp128: unknown precision"),
        ("energy.pj_per_flop.fp128", {"value": 1.0, "source": "s"}, "energy.pj_per_flop.fp128: unknown precision"),
        ("power.watts.value", math.inf, "power.watts.value must be a finite number > 0, got inf"),
        ("energy.pj_per_watt", {}, "energy.pj_per_watt: unknown key"),
        ("defaults.batch_size", {"value": 4, "source": "s"}, "defaults.batch_size: no such knob"),
    ],
)
def test_target_file_fields(path, value, needle):
    data = _h100()
    node = data
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    with pytest.raises(TargetError) as err:
        from dabench_ir.targets import Target

        Target.from_dict(data, origin="t.toml")
    assert str(err.value).startswith("target file t.toml: field ") and needle in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_target_file_is_one_line_on_the_command_line(capsys, tmp_path):
    text = (resources.files("dabench_ir.targets") / "h100.toml").read_text()
    bad = tmp_path / "t.toml"
    bad.write_text(text.replace("units = { value = 132,", "units = { value = 132.5,"))
    code, _, err = run_cli(capsys, "targets", "--show", bad)
    one_line(code, err, "t.toml", "compute.units.value", "a positive integer")


def test_builtin_targets_keep_their_figures():
    from dabench_ir.targets import list_targets

    h100 = next(t for t in list_targets() if t.name == "h100")
    assert h100.num_units == 132 and h100.arch_value("gemm_tile") == 128


# -- study files -----------------------------------------------------------------------------------
STUDY = """
name = "s"
[experiment.a.defaults]
layers = 2
hidden = 64
seq = 16
[experiment.a.axes]
target = ["rdu", "wse"]
batch = [1, 2]
"""


def _finding(**fields: str) -> str:
    body = {"id": '"f"', "experiment": '"a"', "claim": '"c"', "tautology": '"t"', **fields}
    return "[[finding]]\n" + "\n".join(f"{k} = {v}" for k, v in body.items()) + "\n"


def _study(text: str, **kw):
    from dabench_ir.reproduce import parse_study

    return parse_study(tomllib.loads(text), origin="s.toml", **kw)


@pytest.mark.parametrize(
    ("finding", "needle"),
    [
        (_finding(kind='"dominant"', bound='"memroy"'), "bound 'memroy'; with of = 'step' expected one of compute"),
        (_finding(kind='"dominant"', bound='"compute"', of='"roofline"'), None),
        (
            _finding(kind='"dominant"', bound='"overhead"', of='"roofline"'),
            "with of = 'roofline' expected one of memory, compute",
        ),
        (_finding(kind='"value"', reduce='"max"', paper="nan"), "paper must be a number"),
        (_finding(kind='"value"', reduce='"max"', paper="[1, inf]"), "paper must be a number"),
        (_finding(kind='"value"', reduce='"max"', paper="[3, 1]"), "is reversed"),
        (
            _finding(
                kind='"ratio"', numerator='{ target = "rdu", batch = 1 }', denominator='{ batch = 1, target = "rdu" }'
            ),
            "numerator and denominator pick the same point",
        ),
        (
            _finding(
                kind='"argmax"',
                group='"target"',
                expect='"rdu"',
                numerator="{ batch = 2 }",
                denominator="{ batch = 1 }",
            ),
            "",  # a ratio per group whose two selectors pick other sets of points is fine
        ),
        (
            _finding(
                kind='"argmax"',
                group='"target"',
                expect='"rdu"',
                numerator="{ batch = 2 }",
                denominator="{ batch = { min = 2 } }",
            ),
            "pick the same point in group 'rdu'",
        ),
        (_finding(kind='"argmax"', group='"target"', expect='"ipu"'), "expect names group 'ipu'"),
        (_finding(kind='"argmax"', group='"target"', expect='"wse"'), None),
        (
            _finding(kind='"dominant"', bound='"memory"', group='"target"', expect='"gpu"'),
            "expect names group 'gpu', which no point (with where) has; the groups of 'target' are rdu, wse",
        ),
        (_finding(kind='"dominant"', bound='"memory"', expect='"rdu"'), "expect names groups: give group"),
        (_finding(kind='"limits"', group='"target"', expect='{ rdu = "capcity" }'), "a limiter is one of capacity"),
        (
            _finding(kind='"switch"', axis='"batch"', expect='["pipelined", "streamed"]'),
            "expect 'streamed' is no execution mode (modes: pipelined, streaming)",
        ),
        (
            _finding(kind='"switch"', axis='"batch"', expect='["pipelined", "streaming"]', where='{ target = "wse" }'),
            None,
        ),
        (_finding(kind='"value"', reduce='"max"', where="{ layers = 2 }"), "keeps every point of experiment 'a'"),
        (
            _finding(kind='"value"', reduce='"max"', where='{ target = { not = "gpu" } }'),
            "a filter that filters nothing",
        ),
        (_finding(kind='"value"', reduce='"max"', where="{ batch = { min = 2, max = 1 } }"), "the range is reversed"),
        (_finding(kind='"value"', reduce='"max"', where="{ batch = { min = -inf } }"), "batch.min must be a finite"),
        (_finding(kind='"value"', reduce='"max"', where="{ batch = { in = [] } }"), "batch.in must be a non-empty"),
        (_finding(kind='"value"', reduce='"max"', tolerance="-0.1"), "unknown field 'tolerance'"),
    ],
)
def test_study_finding_fields(finding, needle):
    if not needle:
        _study(STUDY + finding)
        return
    with pytest.raises(UserError) as err:
        _study(STUDY + finding)
    assert str(err.value).startswith("s.toml: finding f") and needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_study_plot_band_reversed():
    plot = '[[plot]]\nid = "p"\nkind = "lines"\nexperiment = "a"\nx = "batch"\npaper = [{ hspan = [2, 1] }]\n'
    with pytest.raises(UserError, match=r"plot p: paper #1: hspan must be \[low, high\] with low <= high"):
        _study(STUDY + _finding(kind='"value"', reduce='"max"') + plot)


def test_study_point_limit_is_for_the_whole_study():
    """Two experiments of 60,000 points each: 120,000 for the study, refused before any is expanded."""
    axes = "batch = [{}]\nseq = [{}]\n".format(", ".join(map(str, range(1, 301))), ", ".join(map(str, range(1, 201))))
    text = "".join(f"[experiment.{e}.defaults]\nlayers = 1\n[experiment.{e}.axes]\n{axes}" for e in ("a", "b"))
    text += _finding(kind='"value"', reduce='"max"')
    with pytest.raises(
        UserError, match=r"s\.toml: 120,000 points over 2 experiment\(s\), more than 100,000 for the whole"
    ):
        _study(text)


def test_study_target_files_resolve_inside_the_study_folder(tmp_path, monkeypatch):
    from dabench_ir.reproduce import load_study

    folder = tmp_path / "studies"
    folder.mkdir()
    text = (resources.files("dabench_ir.targets") / "h100.toml").read_text()
    (folder / "mine.toml").write_text(text.replace('name = "h100"', 'name = "mine"'))
    study = STUDY.replace('target = ["rdu", "wse"]', 'target = ["rdu", "mine.toml"]')
    (folder / "s.toml").write_text(study + _finding(kind='"value"', reduce='"max"', where='{ target = "rdu" }'))
    monkeypatch.chdir(tmp_path)  # not the study's folder: mine.toml is found beside the study all the same
    loaded = load_study("studies/s.toml")
    assert str(folder / "mine.toml") in {p["target"] for p in loaded.points()}
    assert {p.resolve() for p in loaded.input_files()} == {(folder / n).resolve() for n in ("s.toml", "mine.toml")}
    (folder / "evil.toml").write_text(
        study.replace("mine.toml", str(folder / "mine.toml")) + _finding(kind='"value"', reduce='"max"')
    )
    with pytest.raises(UserError, match=r"target: '/.*mine\.toml' is an absolute path"):
        load_study(folder / "evil.toml")


def test_reproduce_refuses_an_output_folder_holding_its_study(capsys, tmp_path, monkeypatch):
    study = tmp_path / "findings.md"  # a study named like the table reproduce writes
    text = STUDY + _finding(kind='"value"', reduce='"max"', where='{ target = "rdu" }')
    study.write_text(text)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "reproduce", "findings.md", "-o", ".")
    one_line(code, err, "-o .", "input findings.md lies inside this output folder")
    assert out == "" and study.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["findings.md"]


def test_reproduce_refuses_a_bad_ray_address_before_any_work(capsys, tmp_path):
    study = tmp_path / "s.toml"
    study.write_text(STUDY + _finding(kind='"value"', reduce='"max"', where='{ target = "rdu" }'))
    code, out, err = run_cli(capsys, "reproduce", study, "-o", tmp_path / "out", "--executor", "ray", "--address", "x")
    one_line(code, err, "--address x: expected HOST:PORT")
    assert out == "" and not (tmp_path / "out").exists()


# -- catalogues and kernel tables -------------------------------------------------------------------
POINT = """format = "dabench-ir/measurements/v1"
[[points]]
id = "p1"
kind = "model"
target = "{target}"
source = "s"
model = {{ family = "gpt2", layers = 1, hidden = 64, heads = 2, seq = 16, batch = 1 }}
measured = {{ {measured} }}
{run}
"""


def _catalogue(tmp_path: Path, *, target: str = "wse", measured: str = "samples_per_s = 1.0", run: str = "") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(POINT.format(target=target, measured=measured, run=run))
    return path


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("k1,nan,50%,10", "line 3: column active_pes must be a positive integer below 2^31, got nan"),
        ("k1,-3,50,10", "column active_pes must be a positive integer below 2^31, got -3.0"),
        ("k1,0,50,10", "column active_pes must be a positive integer below 2^31, got 0.0"),
        ("k1,10,982%,10", "column compute_utilization_pct must be a percentage in [0, 100], got 982.0"),
        ("k1,10,50,nan", "column samples_per_s must be a finite number > 0, got nan"),
        ("k1,10,50,-1", "column samples_per_s must be a finite number > 0"),
        ("k1,10,fast,1", "column compute_utilization_pct must be a percentage in [0, 100], got 'fast'"),
    ],
)
def test_kernel_table_values(capsys, tmp_path, row, needle):
    (tmp_path / "k.csv").write_text(f"kernel,active_pes,compute_utilization_pct,samples_per_s\nk0,8,0%,--\n{row}\n")
    cat = _catalogue(tmp_path, measured='samples_per_s = 1.0, kernels_csv = "k.csv"')
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "c.toml: point 'p1': measured.kernels_csv: k.csv:", needle)


def test_kernel_table_that_is_a_folder_says_so(capsys, tmp_path):
    (tmp_path / "k.csv").mkdir()
    cat = _catalogue(tmp_path, measured='samples_per_s = 1.0, kernels_csv = "k.csv"')
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "measured.kernels_csv", "is a directory")


@pytest.mark.parametrize(
    ("target", "run", "needle"),
    [
        ("ipu", "run = { matmul_proportion = nan }", "run.matmul_proportion: nan: expected fractions in (0, 1]"),
        ("rdu", "run = { resource_scaling = 9.82 }", "run.resource_scaling: 9.82: expected a number in (0, 1]"),
        ("ipu", "run = { layers_per_ipu = [1, -1] }", "run.layers_per_ipu: [1, -1]: expected a non-negative integer"),
    ],
)
def test_catalogue_run_values_checked_when_read(capsys, tmp_path, target, run, needle):
    cat = _catalogue(tmp_path, target=target, run=run)
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "c.toml: point 'p1':", needle)


@pytest.mark.parametrize("measured", ["samples_per_s = nan", "samples_per_s = -1.0", "samples_per_s = 0"])
def test_catalogue_measured_values(capsys, tmp_path, measured):
    cat = _catalogue(tmp_path, measured=measured)
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "-q")
    one_line(code, err, "measured.samples_per_s", "positive number")


def test_validate_never_writes_over_the_kernel_table_its_catalogue_names(capsys, tmp_path):
    table = "kernel,active_pes\nk0,8\n"
    (tmp_path / "k.csv").write_text(table)
    cat = _catalogue(tmp_path, measured='samples_per_s = 1.0, kernels_csv = "k.csv"')
    code, _, err = run_cli(capsys, "validate", "--catalog", cat, "--csv", tmp_path / "k.csv", "-q")
    one_line(code, err, "--csv", "k.csv: is an input of this run")
    assert (tmp_path / "k.csv").read_text() == table


def test_catalogue_input_files(tmp_path):
    from dabench_ir.validate.catalog import input_files, load_catalog

    text = (resources.files("dabench_ir.targets") / "sn30.toml").read_text()
    (tmp_path / "t.toml").write_text(text)
    (tmp_path / "k.csv").write_text("kernel,active_pes\nk0,8\n")
    cat = _catalogue(tmp_path, target="t.toml", measured='samples_per_s = 1.0, kernels_csv = "k.csv"')
    files = {p.resolve() for p in input_files(load_catalog(cat))}
    assert files == {cat.resolve(), (tmp_path / "k.csv").resolve(), (tmp_path / "t.toml").resolve()}


# -- .mlir headers ----------------------------------------------------------------------------------
def _mlir(header: str) -> str:
    """The linalg matmul module of tests/test_mlir_linalg.py under ``header``."""
    from tests.test_mlir_linalg import MATMUL

    return header + MATMUL


@pytest.mark.parametrize(
    ("header", "needle"),
    [
        ("// dabench.params: {bad", "header // dabench.params: expected a JSON object of the model's parameters"),
        ("// dabench.params: [1, 2]", "header // dabench.params: expected a JSON object"),
        (
            '// dabench.params: {"layers": -2}',
            "header // dabench.params: layers must be a positive integer below 2^31, got -2",
        ),
        ('// dabench.params: {"layers": 2.5}', "layers must be a positive integer below 2^31, got 2.5"),
        ("// dabench.weights: 5", "header // dabench.weights: expected a JSON list of weight names, got '5'"),
        ("// dabench.weights: [1]", "header // dabench.weights: expected a JSON list of weight names (non-empty"),
        ('// dabench.weights: ["a", "b", "c"]', "names 3 weights, but the entry function has 2 argument(s)"),
    ],
)
def test_mlir_header_fields(tmp_path, header, needle):
    pytest.importorskip("torch_mlir")
    from dabench_ir.errors import InputError
    from dabench_ir.mlir import load_mlir

    path = tmp_path / "m.mlir"
    path.write_text(_mlir(header))
    with pytest.raises(InputError) as err:
        load_mlir(path)
    assert str(err.value).startswith(f"{path}: header //") and needle in str(err.value), str(err.value)


def test_mlir_header_weights_mark_the_last_arguments(tmp_path):
    pytest.importorskip("torch_mlir")
    from dabench_ir.ir import ValueKind
    from dabench_ir.mlir import load_mlir

    path = tmp_path / "m.mlir"
    path.write_text(_mlir('// dabench.params: {"layers": 1}\n// dabench.weights: ["w"]'))
    graph = load_mlir(path)
    assert graph.values["arg1"].kind == ValueKind.WEIGHT and graph.values["arg0"].kind == ValueKind.INPUT


def test_mlir_without_locations_is_costed_not_zero(capsys, tmp_path):
    """Issue 46: a hand-written linalg matmul without locations profiled at 0 FLOP, 0 ns, "fits"."""
    pytest.importorskip("torch_mlir")
    path = tmp_path / "m.mlir"
    path.write_text(_mlir("").replace(' loc("mm")', ""))
    code, out, err = run_cli(capsys, "profile", path, "--target", "rdu")
    assert code == 0, err
    assert "48 FLOP (48 FLOP contraction" in out and "Unattributed nodes: 0" in out


# -- report JSON ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"schema": "dabench-ir/report/v1"}', "report has no 'model' field (nor 'target', 'totals', 'nodes')"),
        ('{"schema": "dabench-ir/report/v1", "model": {}, "target": null, "nodes": []}', "has no 'totals' field"),
        ('{"schema": "dabench-ir/report/v1", "model": [], "target": null, "totals": {}, "nodes": []}', "'model'"),
        ("[" * 5000, "not JSON"),
        ('{"schema": "other"}', "not a dabench-ir report"),
    ],
)
def test_report_from_json_is_an_api_error_naming_the_fault(tmp_path, content, needle):
    import dabench_ir

    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(dabench_ir.ApiError) as err:
        dabench_ir.Report.from_json(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


# -- messages that said the wrong thing ----------------------------------------------------------------
def test_dangling_output_folder_symlink_says_so(capsys, tmp_path):
    study = tmp_path / "s.toml"
    study.write_text(STUDY + _finding(kind='"value"', reduce='"max"', where='{ target = "rdu" }'))
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "missing" / "folder")
    code, _, err = run_cli(capsys, "reproduce", study, "-o", link)
    one_line(code, err, "-o", "a symlink to a missing folder")  # was "cannot create it (File exists)"
