"""The option schema (`dabench_ir.options`): every knob declared once, the CLI flags of
profile/scale/sweep, the sweep-spec checks and the report's configuration derived from it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from dabench_ir import options
from dabench_ir.cli import build_parser, main
from dabench_ir.errors import UserError
from dabench_ir.options import (
    KNOBS,
    PROFILE,
    SCALE,
    SWEEP,
    ProfileOptions,
    ScaleOptions,
    add_knob_arguments,
    knob,
    knob_values,
    knobs_for,
    options_from_args,
    recorded_config,
)
from dabench_ir.sweep.spec import parse_spec, spec_params


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[command]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


# -- the declarations ---------------------------------------------------------------------------


def test_defaults_come_from_the_fields():
    opts = ProfileOptions()
    assert (opts.mode, opts.opt_level, opts.wse_mode, opts.ipus, opts.warmup, opts.repeat) == (
        "inference",
        "O1",
        "auto",
        1,
        2,
        5,
    )
    assert KNOBS["opt_level"].default == "O1" and KNOBS["max_weight_bytes"].default == 4 << 30
    assert ScaleOptions().chips == 1 and ScaleOptions().strategy is None


def test_flags_and_choices():
    assert KNOBS["micro_batches"].flag == "--micro-batches"
    assert KNOBS["dims"].flag == "--dim"
    assert KNOBS["precision"].choices == ("fp32", "fp16", "bf16", "mixed", "int8", "fp8", "w8a16", "w4a16")
    assert KNOBS["measure"].is_switch and not KNOBS["batch"].is_switch
    assert KNOBS["recompute"].choices == ("none", "selective", "op", "full")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch", 0, "--batch 0: expected a positive integer"),
        ("batch", "x", "--batch 'x': expected a positive integer"),
        ("precision", "fp4", "--precision 'fp4': expected one of fp32, fp16, bf16, mixed, int8, fp8, w8a16, w4a16"),
        ("replicas", "many", "--replicas 'many': expected a positive integer"),
        ("warmup", -1, "--warmup -1: expected a non-negative integer"),
        ("recompute", "maybe", "--recompute 'maybe': expected one of none, selective, op, full"),
        ("dims", {"seq": -1}, "--dim"),
    ],
)
def test_a_bad_value_names_the_flag(field, value, message):
    with pytest.raises(UserError) as info:
        ProfileOptions(**{field: value})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_values_are_parsed_once():
    opts = ProfileOptions(batch="4", replicas="auto", recompute="yes", dims={"seq": "8"})
    assert (opts.batch, opts.replicas, opts.recompute, dict(opts.dims)) == (4, "auto", "full", {"seq": 8})
    assert ProfileOptions(replicas="3").replicas == 3


def test_commands_offer_their_knobs():
    assert "via" in knobs_for(PROFILE) and "via" not in knobs_for(SCALE) and "via" not in knobs_for(SWEEP)
    assert "measure" in knobs_for(PROFILE) and "measure" not in knobs_for(SWEEP)
    assert {"chips", "strategy"} <= set(knobs_for(SCALE)) & set(knobs_for(SWEEP))
    assert "chips" in knobs_for(PROFILE)  # profile --scenario generate --chips N


# -- the CLI -------------------------------------------------------------------------------------


def test_every_offered_knob_is_a_flag_of_its_command():
    parser = build_parser()
    for command in (PROFILE, SCALE, SWEEP):
        flags = _flags(_subparser(parser, command))
        assert {k.flag for k in knobs_for(command).values()} <= flags, command


def test_options_from_args_keeps_the_dataclass_defaults():
    p = argparse.ArgumentParser()
    add_knob_arguments(p, PROFILE)
    opts = options_from_args(p.parse_args([]), ProfileOptions, PROFILE)
    assert opts == ProfileOptions()
    args = p.parse_args(["--batch", "2", "--dim", "seq=8", "--dim", "n=3", "--recompute", "full", "--replicas", "auto"])
    opts = options_from_args(args, ProfileOptions, PROFILE)
    assert (opts.batch, dict(opts.dims), opts.recompute, opts.replicas) == (2, {"seq": 8, "n": 3}, "full", "auto")


def test_list_flags_parse_each_item():
    p = argparse.ArgumentParser()
    add_knob_arguments(p, SCALE)
    values = knob_values(p.parse_args(["--chips", "1,2,4", "--batch", "8", "--strategy", "dp"]), SCALE)
    assert values == {"chips": [1, 2, 4], "batch": [8], "strategy": "dp"}
    with pytest.raises(UserError, match=r"--chips 'x': expected a positive integer"):
        knob_values(p.parse_args(["--chips", "1,x"]), SCALE)
    with pytest.raises(UserError, match="comma-separated"):
        knob_values(p.parse_args(["--chips", "1,,2"]), SCALE)
    with pytest.raises(UserError, match="--chips takes one value here"):
        options_from_args(p.parse_args(["--chips", "1,2"]), ScaleOptions, SCALE)


def test_cli_usage_errors_name_the_flag(capsys, tiny_matmul_path):
    assert main(["profile", str(tiny_matmul_path), "--precision", "fp4"]) == 2
    err = capsys.readouterr().err
    assert "--precision 'fp4': expected one of fp32, fp16, bf16, mixed, int8" in err
    assert main(["scale", str(tiny_matmul_path), "--target", "rdu", "--chips", "1,0", "--strategy", "dp"]) == 2
    assert "--chips '0': expected a positive integer" in capsys.readouterr().err


# -- the report ----------------------------------------------------------------------------------


def test_recorded_config_is_the_run_knobs():
    opts = ScaleOptions(batch=2, precision="bf16", chips=4, strategy="tp", measure=True)
    config = recorded_config(opts)
    assert config["batch"] == 2 and config["chips"] == 4 and config["strategy"] == "tp"
    assert config["opt_level"] == "O1" and "measure" not in config and "warmup" not in config
    assert "opt_level" not in recorded_config(opts, target=False)


# -- adding a knob touches only its declaration ------------------------------------------------


@dataclass(frozen=True)
class _WithNewKnob(ScaleOptions):
    stage_depth: int = knob(3, help="a knob a test adds", parse=options._positive, group="target")


@pytest.fixture
def new_knob(monkeypatch):
    monkeypatch.setattr(options, "KNOBS", options._collect(_WithNewKnob))
    return options.KNOBS["stage_depth"]


def test_a_new_knob_reaches_every_parser_and_the_spec(new_knob):
    parser = build_parser()
    for command in (PROFILE, SCALE, SWEEP):
        sub = _subparser(parser, command)
        assert "--stage-depth" in _flags(sub), command
        assert "a knob a test adds (default: 3)" in sub.format_help().replace("\n", " ").replace("  ", " ")
    args = parser.parse_args(["profile", "m.onnx", "--stage-depth", "7"])
    assert options_from_args(args, _WithNewKnob, PROFILE).stage_depth == 7
    with pytest.raises(UserError, match="--stage-depth '0': expected a positive integer"):
        knob_values(parser.parse_args(["sweep", "s.toml", "--stage-depth", "0"]), SWEEP)
    assert "stage_depth" in spec_params()
    (point,) = parse_spec({"point": [{"stage_depth": 5}]}).points
    assert point["stage_depth"] == 5
    with pytest.raises(UserError, match="stage_depth = 0: expected a positive integer"):
        parse_spec({"point": [{"stage_depth": 0}]})
    assert recorded_config(_WithNewKnob(stage_depth=4))["stage_depth"] == 4


def test_absurd_chip_counts_are_refused_naming_the_flag():
    from dabench_ir.errors import UserError
    from dabench_ir.options import MAX_CHIPS, ScaleOptions

    assert ScaleOptions(chips=MAX_CHIPS).chips == MAX_CHIPS
    with pytest.raises(UserError, match=r"--chips .*at most 1,048,576 chips"):
        ScaleOptions(chips=99999999999)


def test_chips_per_node_is_a_scale_knob_of_scale_sweep_and_profile():
    k = KNOBS["chips_per_node"]
    assert k.flag == "--chips-per-node" and k.group == "scale" and k.default is None
    assert all("chips_per_node" in knobs_for(c) for c in (PROFILE, SCALE, SWEEP))
    assert "how many of the run's chips share a node: a job spread over machines" in k.help
    assert ScaleOptions(chips_per_node="2").chips_per_node == 2
    with pytest.raises(UserError, match=r"--chips-per-node 0: expected a positive integer"):
        ScaleOptions(chips_per_node=0)
    (point,) = parse_spec({"point": [{"chips": 4, "strategy": "tp", "chips_per_node": 2}]}).points
    assert point["chips_per_node"] == 2
    assert recorded_config(ScaleOptions(chips=4, strategy="tp", chips_per_node=2))["chips_per_node"] == 2


def test_fused_attention_is_refused_where_the_lowering_fuses_attention_itself():
    """The RDU and WSE lowerings model the chip's own attention fusion: the FlashAttention cost
    rewrite before them would count it twice (exit 2, one line). GPUs and the IPU read it; the
    target's own default (off) may be given on any target."""
    from dabench_ir.lowering import lowering_for
    from dabench_ir.run import resolve
    from dabench_ir.targets import load_target
    from tests.lowering_graphs import decoder

    graph = decoder(layers=1, hidden=64, seq=8)
    for name in ("sn30", "wse2"):
        assert lowering_for(load_target(name)).fuses_attention_itself
        with pytest.raises(UserError, match=rf"--fused-attention true on {name} .* count the fusion twice; drop it"):
            resolve(graph, name, {"fused_attention": True})
        assert resolve(graph, name, {"fused_attention": False}).options.fused_attention is False
    for name in ("h100", "bow"):
        assert not lowering_for(load_target(name)).fuses_attention_itself
        assert resolve(graph, name, {"fused_attention": True}).options.fused_attention is True
    assert main(["profile", "gpt2-small", "-t", "sn30", "--fused-attention", "true"]) == 2
