"""Target files: loading, aliases, sources on every number, and errors that name the field."""

from __future__ import annotations

import sys

import pytest

from dabench_ir.cli import main
from dabench_ir.commands.targets import render_parameters
from dabench_ir.errors import TargetError
from dabench_ir.ir import DType
from dabench_ir.targets import builtin_target_paths, list_targets, load_target

BUILTIN = ("wse2", "sn30", "bow", "a100", "a100-40gb", "h100", "h200")

_GOOD = """
name = "mine"
kind = "gpu"
[process]
node_nm = { value = 7, source = "s" }
[power]
watts = { value = 100, source = "s" }
[compute]
units = { value = 10, source = "s" }
[compute.peak_flops]
fp16 = { value = 1e12, source = "s", estimate = true }
[[memory]]
name = "hbm"
level = "off-chip"
capacity_bytes = { value = 1e9, source = "s" }
bandwidth_bytes_per_s = { value = 1e11, source = "s" }
"""


def test_builtins_present_and_load():
    assert set(BUILTIN) <= set(builtin_target_paths())
    names = {t.name for t in list_targets()}
    assert set(BUILTIN) <= names
    assert "cpu" not in names  # listing never calibrates the host


@pytest.mark.parametrize("alias,name", [("wse", "wse2"), ("rdu", "sn30"), ("ipu", "bow"), ("H100", "h100")])
def test_aliases(alias, name):
    assert load_target(alias).name == name


@pytest.mark.parametrize("name", BUILTIN)
def test_every_number_has_a_source(name):
    target = load_target(name)
    quantities = target.quantities()
    assert quantities
    assert all(q.source.strip() for _, q in quantities)
    # estimates say what they rest on
    assert all(len(q.source) > 10 for _, q in quantities if q.estimate)
    assert target.peak_flops(DType.FLOAT16) > 0
    assert target.memory(target.feed_level).capacity_bytes > 0


def test_dataflow_estimates_marked():
    assert "compute.units" in load_target("sn30").estimates()
    assert any(e.startswith("memory[") for e in load_target("bow").estimates())
    assert "power.watts" in load_target("wse2").estimates()


def test_ridge_point_is_peak_over_bandwidth():
    t = load_target("a100")
    assert t.ridge_point("fp16") == pytest.approx(312e12 / 2.039e12)
    assert t.ridge_point(DType.BFLOAT16, "hbm") == t.ridge_point("fp16")


def test_bf16_falls_back_to_fp16_peak():
    assert load_target("bow").peak_flops("bf16") == load_target("bow").peak_flops("fp16")
    with pytest.raises(TargetError, match="no peak"):
        load_target("bow").peak_flops("int8")


def test_unknown_name_lists_known():
    with pytest.raises(TargetError, match=r"known targets: .*a100.*wse2"):
        load_target("tpu9")


def test_user_file_loads(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(_GOOD)
    target = load_target(str(path))
    assert target.name == "mine" and target.kind == "gpu" and target.peaks["fp16"].estimate


@pytest.mark.parametrize(
    "edit,field",
    [
        (
            lambda s: s.replace('bandwidth_bytes_per_s = { value = 1e11, source = "s" }\n', ""),
            "memory[0].bandwidth_bytes_per_s",
        ),
        (lambda s: s.replace('[power]\nwatts = { value = 100, source = "s" }\n', ""), "power"),
        (lambda s: s.replace('units = { value = 10, source = "s" }', "units = { value = 10 }"), "compute.units.source"),
        (lambda s: s.replace("value = 10,", 'value = "ten",'), "compute.units.value"),
        (lambda s: s.replace('kind = "gpu"', 'kind = "tpu"'), "kind"),
        (
            lambda s: s + '[[memory]]\nname = "x"\nlevel = "on-chip"\ncapacity_bytes = { value = 1, source = "s" }\n',
            "memory[1].bandwidth_bytes_per_s",
        ),
    ],
)
def test_bad_file_names_the_field(tmp_path, edit, field):
    path = tmp_path / "my.toml"
    path.write_text(edit(_GOOD))
    with pytest.raises(TargetError, match=rf"my\.toml: .*{field.replace('[', '.').replace(']', '.')}"):
        load_target(path)


# -- a file that extends a built-in target ------------------------------------------------------


def test_a_derived_target_is_its_base_with_only_its_own_figures_changed():
    """a100-40gb writes only the 40 GB part's memory: every other figure is the a100's, from one place."""
    small, base = load_target("a100-40gb"), load_target("a100")
    assert small.base == "a100" and base.base == "" and small.aliases == ()
    mine, theirs = dict(small.quantities()), dict(base.quantities())
    assert mine.keys() == theirs.keys()
    changed = {k for k in mine if mine[k].value != theirs[k].value or mine[k].source != theirs[k].source}
    assert changed == {"memory[0].capacity_bytes", "memory[0].bandwidth_bytes_per_s", "memory[1].capacity_bytes"}
    assert small.feed_memory.bandwidth_bytes_per_s == 1.555e12 and small.feed_memory.capacity_bytes == 40 * 2**30
    assert small.memory("hbm").level == base.memory("hbm").level  # a named table merges: its level is the base's
    shown = render_parameters(small).splitlines()
    assert shown[0].endswith("; extends a100: 3 its own, 34 marked (a100)")
    own = [line for line in shown[1:] if "(a100) " not in line]
    assert [line.split()[0] for line in own] == sorted(changed, key=[n for n, _ in small.quantities()].index)


def test_a_derived_figure_is_replaced_whole_and_a_new_named_table_appended(tmp_path):
    """A new value takes none of the base figure's flags: a figure fitted in the base is not fitted here."""
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\nextends = "h100"\n'
        '[arch]\ndecode_attention_load_bytes_per_s = { value = 1e12, source = "mine" }\n'
        '[[memory]]\nname = "sram"\nlevel = "on-chip"\n'
        'capacity_bytes = { value = 5e7, source = "s" }\nbandwidth_bytes_per_s = { value = 1e13, source = "s" }\n'
    )
    mine, h100 = load_target(path), load_target("h100")
    assert h100.arch["decode_attention_load_bytes_per_s"].fitted
    rate = mine.arch["decode_attention_load_bytes_per_s"]
    assert (rate.value, rate.source, rate.fitted, rate.estimate) == (1e12, "mine", False, False)
    assert [m.name for m in mine.memories] == [m.name for m in h100.memories] + ["sram"]
    assert mine.kind == "gpu" and mine.peaks == h100.peaks


@pytest.mark.parametrize(
    "extends,needle",
    [("tpu9", "must name a built-in target"), (3, "must name a built-in target"), ("a100-40gb", "extends another")],
)
def test_extends_names_one_built_in_target(tmp_path, capsys, extends, needle):
    path = tmp_path / "mine.toml"
    path.write_text(f'name = "mine"\nextends = {extends!r}\n'.replace("'", '"'))
    with pytest.raises(TargetError, match=needle):
        load_target(path)
    assert main(["profile", "gpt2-small", "--target", str(path), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "body,needle",
    [
        ('extends = "a100"\n', 'gives its own name = "..."'),  # not the built-in's name, taken silently
        ('name = "x"\nextends = "a100"\n[[link]]\nname = { a = 1 }\n', "[[link]] entry"),
        ('name = "x"\nextends = "a100"\n[[memory]]\nname = "hbm"\n[[memory]]\nname = "hbm"\n', "[[memory]] entry"),
    ],
)
def test_a_file_that_extends_another_names_itself_and_each_entry_once(tmp_path, capsys, body, needle):
    path = tmp_path / "mine.toml"
    path.write_text(body)
    assert main(["targets", "--show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_cpu_without_calibration_is_a_target_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "dabench_ir.execute.calibrate", None)  # import fails
    with pytest.raises(TargetError, match="calibration"):
        load_target("cpu")


def test_cli_targets_lists_figures(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for name in BUILTIN:
        assert name in out
    assert "PFLOP/s" in out and "nm" in out


def test_targets_show_lists_every_parameter_with_its_basis(capsys):
    """`targets --show T`: every number a model uses, with its source and basis (issue 14), and
    each fitted parameter with the catalogue points its fitted_to names (issue 30)."""
    from dabench_ir.validate import load_catalog

    assert main(["targets", "--show", "rdu"]) == 0
    out = capsys.readouterr().out
    target = load_target("rdu")
    assert out.splitlines()[0].startswith(f"sn30 [rdu] from sn30.toml: {len(target.quantities())} figures")
    host = next(line for line in out.splitlines() if "overheads.host_step_s" in line)
    assert " fitted " in host and "sn30-gpt2-h1600" in host  # names the catalogue points it was fitted to
    lines = out.splitlines()
    expanded = lines[lines.index(host) + 1].strip()  # its fitted_to patterns, expanded over the bundled catalogue
    fitted = target.overheads["host_step_s"]
    ids = [p.id for p in load_catalog() if fitted.fitted_on(p.id)]
    assert expanded == f"fitted to {len(ids)} point(s): " + ", ".join(ids) and len(ids) >= 6
    rows = {line.split()[0]: line.split()[2] for line in lines[1:] if not line.strip().startswith("fitted to")}
    assert rows["overheads.host_step_s"] == "fitted" and rows["overheads.sync_s"] == "estimate"
    for name in ("wse2", "sn30", "bow", "a100", "h100", "h200"):
        assert all(q.source.strip() for _, q in load_target(name).quantities()), name


def test_a_counterfactual_target_changes_named_figures_and_says_so():
    import tomllib

    from dabench_ir.targets import Target

    sn30 = load_target("sn30")
    cf = sn30.with_changes(
        {
            "compute.peak_flops.fp32": "compute.peak_flops.bf16",
            "link[1].bandwidth_bytes_per_s": "link[0].bandwidth_bytes_per_s",
            "energy.pj_per_byte.ddr": 0.5,
            "overheads.host_step_s": 0,
            "arch.pcu_k_half": 1,  # a figure the file sets
            "arch.min_grain_flops": 1,  # one the format declares that the file does not set
        }
    )
    assert cf.peak_flops("fp32") == sn30.peak_flops("bf16") == 650e12 and sn30.peak_flops("fp32") == 325e12
    assert cf.links[1].bandwidth_bytes_per_s == 32e9 and cf.overhead("host_step_s") == 0.0
    assert cf.raw["energy"]["pj_per_byte"]["ddr"]["value"] == 0.5 and cf.arch_value("min_grain_flops") == 1.0
    q = cf.peaks["fp32"]
    assert (
        q.estimate and q.source == "counterfactual: compute.peak_flops.fp32 = 'compute.peak_flops.bf16'; was 3.25e+14"
    )
    assert not q.fitted_to and cf.overheads["host_step_s"].source.endswith("was 1.459")
    # the file a sweep worker reads back is the same target
    again = Target.from_dict(tomllib.loads(cf.toml()))
    assert again.raw == cf.raw and again.peak_flops("fp32") == 650e12
    for name in BUILTIN:
        t = load_target(name)
        assert tomllib.loads(t.toml()) == dict(t.raw), name


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"compute.peak_flops.fp64": 1.0}, "no figure 'compute.peak_flops.fp64'"),
        ({"nope.x": 1.0}, "no figure 'nope.x'"),
        ({"compute.peak_flops": 1.0}, "no figure 'compute.peak_flops'"),
        ({"compute.peak_flops.fp32": "compute.nope"}, "no figure 'compute.nope'"),
        ({"compute.peak_flops.fp32": True}, "expected a number or a figure's name"),
        ({"compute.peak_flops.fp32": -1.0}, "compute.peak_flops.fp32.value must be a finite number > 0"),
        ({"arch.pcu_efficiency": 2.0}, "must be a fraction in (0, 1]"),
    ],
)
def test_a_counterfactual_target_refuses_what_is_not_a_figure(changes, needle):
    with pytest.raises(TargetError, match=needle.replace("(", r"\(").replace(")", r"\)")) as err:
        load_target("sn30").with_changes(changes)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("target", "figure", "mode"),
    [
        ("sn30", "section_reconfig_s", "inference"),
        ("sn30", "host_per_section_s", "inference"),
        ("sn30", "host_step_s", "train"),
        ("sn30", "device_step_s", "train"),
        ("bow", "sync_s", "inference"),
        ("wse2", "ws_layer_pass_s", "train"),
        ("h100", "decode_step_s", "decode"),
    ],
)
def test_a_fitted_overhead_the_lowering_needs_is_never_read_as_zero(tmp_path, capsys, target, figure, mode):
    """A target file without a host or device cost its lowering charges every step (fitted to
    measurements) is refused in one line naming the field; it was read as 0 and the row vanished
    from every step unsaid (a SN30 training step 0.29 s instead of 2.09 s)."""
    from importlib import resources

    from dabench_ir.cli import main

    text = (resources.files("dabench_ir.targets") / f"{target}.toml").read_text()
    kept = [line for line in text.splitlines() if not line.startswith(f"{figure} = ")]
    assert len(kept) == len(text.splitlines()) - 1
    path = tmp_path / f"{target}-without-{figure}.toml"
    path.write_text("\n".join(kept).replace(f'name = "{target}"', f'name = "{path.stem}"', 1))
    run = ["--scenario", "generate", "--prompt", "8", "--gen", "2"] if mode == "decode" else ["--mode", mode]
    if target == "wse2":
        run += ["--wse-mode", "streaming"]
    code = main(["profile", "gpt2-small", "-t", str(path), *run, "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"missing field overheads.{figure}" in err


TYPOS = [
    (
        "[overheads]\n",
        'kernel_lanch_s = { value = 1.0, source = "x" }',
        "overheads.kernel_lanch_s: unknown key; did you mean",
    ),
    (
        "[arch]\n",
        'matmul_eficiency = { value = 0.5, source = "x" }',
        "arch.matmul_eficiency: unknown key; did you mean",
    ),
    ("[power]\n", 'wattz = { value = 3, source = "x" }', "field power.wattz: unknown key"),
]


@pytest.mark.parametrize(("table", "line", "needle"), TYPOS)
def test_a_key_the_format_does_not_take_is_refused_naming_it(tmp_path, table, line, needle):
    """A typo is a figure no lowering reads, its default taken unsaid (a mistyped kernel_launch_s
    dropped every kernel launch: 241 -> 229 us a step): refused when the file is read, with the key
    it probably meant; so is a table the format does not have."""
    text = builtin_target_paths()["h100"].read_text()
    assert table in text
    path = tmp_path / "h100-typo.toml"
    path.write_text(text.replace('name = "h100"', 'name = "h100-typo"', 1).replace(table, f"{table}{line}\n", 1))
    with pytest.raises(TargetError, match=needle.replace(".", r"\.")):
        load_target(str(path))
    path.write_text(text.replace('name = "h100"', 'name = "h100-typo"', 1) + "\n[bogus]\nx = 1\n")
    with pytest.raises(TargetError, match="field bogus: unknown key"):
        load_target(str(path))


def test_a_lowering_reading_a_figure_the_format_does_not_declare_is_a_bug():
    with pytest.raises(ValueError, match="no target file declares the figure 'no_such_figure'"):
        load_target("h100").arch_value("no_such_figure", 1.0)


def test_a_count_past_any_machine_is_refused(tmp_path):
    """1e300 units is an integer to TOML; it gave 3.7e292 s a step. A count stops below 2^31."""
    text = builtin_target_paths()["h100"].read_text()
    assert "units = { value = 132," in text
    path = tmp_path / "h100-units.toml"
    path.write_text(text.replace("units = { value = 132,", "units = { value = 1e300,", 1))
    with pytest.raises(TargetError, match=r"compute\.units\.value must be a positive integer below 2\^31"):
        load_target(str(path))
