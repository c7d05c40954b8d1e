"""One owner per fact, tested by behaviour: the same fact asked through each of its users gives the
same answer (a spelling grep passes while two owners disagree; these fail)."""

from __future__ import annotations

import pytest

from dabench_ir import api
from dabench_ir.targets import load_target, ridge

TARGETS = ("a100", "sn30", "wse2", "bow")


# -- the ridge point: Target.ridge_point, read by the metrics, the lowerings and the plots -------


@pytest.mark.parametrize("name", TARGETS)
def test_the_ridge_the_roofline_draws_is_the_targets(name):
    from dabench_ir.report.attribution import roofline_roofs

    report = api.profile("gpt2-small", name, batch=2, dims={"seq": 64})
    target = report.target_obj
    roofs = roofline_roofs(report, target)
    assert roofs
    for roof in roofs:
        mem = target.memory(roof["memory"])
        assert roof["ridge"] == pytest.approx(target.ridge_point(roof["precision"], mem), rel=1e-12)
        assert roof["ridge"] == pytest.approx(ridge(roof["peak_flops_per_s"], mem.bandwidth_bytes_per_s), rel=1e-12)


# -- the ring all-reduce's volume: the scaling stage's time and the energy model's link bytes ----


@pytest.mark.parametrize("chips", [2, 4, 8])
def test_an_all_reduce_moves_the_bytes_its_time_is_made_of(chips):
    """The collective's time (bytes over the link's bandwidth) and the links' energy (bytes at pJ/B) read
    one volume: each chip's 2(n-1)/n of the buffer."""
    from dabench_ir.lowering.collectives import ring_allreduce_bytes, ring_allreduce_time

    nbytes, bandwidth = 3.0e9, 1.0e11
    per_chip_s = ring_allreduce_time(nbytes, chips, bandwidth, latency=0.0)
    assert per_chip_s * bandwidth * chips == pytest.approx(ring_allreduce_bytes(nbytes, chips), rel=1e-12)


# -- the parameter count: Graph.num_params, the report, the model config's closed form -----------


@pytest.mark.parametrize("preset", ["gpt2-small", "llama-7b"])
def test_the_parameter_count_is_one_answer(preset):
    from dabench_ir.models import get_preset
    from dabench_ir.pipeline import load_graph

    report = api.profile(preset)
    graph = load_graph(preset)
    assert report.model["params"] == graph.num_params == get_preset(preset).param_count()


# -- the default heads: models/config.default_heads, read by the config and the export command ---


def test_default_heads_answer_alike_in_the_config_and_the_cli():
    from dabench_ir.cli import build_parser
    from dabench_ir.commands.export import _config
    from dabench_ir.errors import UserError
    from dabench_ir.models.config import default_heads

    with pytest.raises(UserError, match="multiple of 64: pass --heads"):
        default_heads(100, hint="pass --heads")
    for family in ("gpt2", "llama"):
        args = build_parser().parse_args(
            ["export", "--family", family, "--layers", "2", "--hidden", "768", "-o", "x.onnx"]
        )
        assert _config(args).heads == default_heads(768) == 12


# -- byte sizes: every flag that takes one parses it the same way ---------------------------------


@pytest.mark.parametrize(("text", "value"), [("4GiB", 4 << 30), ("1.5 GB", 1_500_000_000), ("512", 512)])
def test_every_byte_size_flag_parses_alike(text, value):
    from dabench_ir.cli import build_parser
    from dabench_ir.options import DEFAULT_MAX_WEIGHT_BYTES, PROFILE, ProfileOptions, options_from_args

    parser = build_parser()
    exported = parser.parse_args(["export", "--max-weight-bytes", text, "-o", "x.onnx"]).max_weight_bytes
    args = parser.parse_args(["profile", "m.onnx", "--measure", "--max-weight-bytes", text])
    profiled = options_from_args(args, ProfileOptions, PROFILE).max_weight_bytes
    assert exported == profiled == value
    from dabench_ir.commands.export import weight_cap

    defaults = (weight_cap(parser.parse_args(["export", "-o", "x.onnx"])), ProfileOptions().max_weight_bytes)
    assert defaults == (DEFAULT_MAX_WEIGHT_BYTES, DEFAULT_MAX_WEIGHT_BYTES)


# -- model choices: the export command offers what the model config accepts ----------------------


def test_the_export_command_offers_the_configs_choices():
    from dabench_ir.cli import build_parser
    from dabench_ir.models.config import DTYPES, FAMILIES, PHASES

    export = build_parser()._subparsers._group_actions[0].choices["export"]
    offered = {a.dest: tuple(a.choices) for a in export._actions if a.choices}
    assert (offered["dtype"], offered["family"], offered["phase"]) == (DTYPES, FAMILIES, PHASES)


# -- precision lists: dabench_ir/options.PRECISIONS, FLOAT_PRECISIONS, KV_PRECISIONS ------------


def test_precision_modes_cover_exactly_the_knob_choices():
    from dabench_ir.options import FLOAT_PRECISIONS, KV_PRECISIONS, PRECISIONS
    from dabench_ir.passes import precision

    assert precision._CHOICES is PRECISIONS
    assert set(PRECISIONS) == {*precision._MODES, "mixed", *precision._QUANT}
    assert set(KV_PRECISIONS) == set(precision._KV)
    assert set(FLOAT_PRECISIONS) == {*precision._MODES, "mixed"}


# -- the dtype a run computes in: passes/precision.py, read by the lowering and the report -------


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", "fp32"), ("bf16", "bf16"), ("mixed", "bf16")])
def test_the_compute_dtype_is_one_answer(precision, dtype):
    """The dtype the lowering takes peaks at, the graph's after the precision pass, and the knob's meaning
    (under mixed the pass stored bf16 while peaks were taken at fp16: equal figures, a wrong label)."""
    from dabench_ir.passes.precision import compute_dtype, graph_compute_dtype

    report = api.profile("gpt2-small", "h100", batch=2, dims={"seq": 64}, precision=precision)
    assert (
        str(report.plan.precision) == str(graph_compute_dtype(report.graph)) == str(compute_dtype(precision)) == dtype
    )


# -- percentages: one formatter per meaning ------------------------------------------------------


def test_percent_helpers_one_per_meaning():
    from dabench_ir.report.table import parse_percent, percent, percent_change

    assert percent(0.25) == "25.0%" and percent(None) == "-"
    assert percent(0.031, width=5, missing="   n/a") == "  3.1%" and percent(None, missing="n/a") == "n/a"
    assert percent_change(2.0, 2.5) == "+25.0%" and percent_change(0, 1.0) == "-"
    assert parse_percent("12.5%") == 0.125 and parse_percent("-") is None and parse_percent("x") is None
    assert parse_percent(percent(0.125)) == 0.125  # what one writes the other reads


@pytest.mark.parametrize(("share", "text"), [(0.42, "42%"), (0.097, "9.7%"), (0.0041, "0.41%"), (3e-5, "<0.01%")])
def test_a_small_share_reads_alike_in_the_why_lines_and_the_plot_labels(share, text):
    """One formatter for a share in prose and labels (the why lines and the roofline's labels had
    two, with different thresholds: 0.097 read 9.7 % in one and 10 % in the other)."""
    from dabench_ir.report import plots, why
    from dabench_ir.report.table import short_percent

    assert short_percent(share) == text
    assert why.short_percent is plots.short_percent is short_percent


# -- a decoder block's modules: dabench_ir.ir.module_of, read by TP, the WSE kernels, the roles --


def test_a_scope_is_the_same_module_to_every_user():
    """Which nodes are attention, MLP or norm: tensor parallelism splits the attention and MLP modules,
    the WSE lowering makes each block's attention one kernel, the report's roles name norms and MLPs.
    They ask one vocabulary (`module_of`), so a model's modules are the same to all three."""
    from dabench_ir.ir import module_of
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.lowering.wse import wse_kernels
    from dabench_ir.passes import meta
    from dabench_ir.report.roles import general_scope, node_roles
    from dabench_ir.scaling import split_for_tp
    from tests.lowering_graphs import decoder

    graph = decoder(layers=2, hidden=64)
    kinds = {n.name: module_of(n.scope).kind for n in graph.nodes}
    in_block = {n.name for n in graph.nodes if n.layer is not None}
    split = {n.name for n in graph.nodes if n.layer is not None and kinds[n.name] in ("attention", "mlp")}
    share, _ = split_for_tp(graph, 2)
    costs = [(n.name, meta.get_cost(n), meta.get_cost(s)) for n, s in zip(graph.nodes, share.nodes, strict=True)]
    halved = {name for name, whole, half in costs if whole and half and half.flops < whole.flops}
    assert halved and halved <= split
    kernels = wse_kernels(LoweringContext.build(graph, None), load_target("wse2"))
    attention = {n.name for k in kernels if k.cls == "attention" for n in k.nodes}
    assert attention == {n for n in in_block if kinds[n] == "attention"}
    roles = node_roles(graph)
    norms = {n.name: module_of(n.scope).module for n in graph.nodes if n.layer is not None and kinds[n.name] == "norm"}
    assert norms, "the decoder has norm modules"
    # a norm module's nodes carry its name as their role, or the "norms" pattern inside a container
    assert all(roles[n] == general_scope(module) or roles[n].endswith(": norms") for n, module in norms.items())


@pytest.mark.parametrize(
    ("scope", "layer", "wild"),
    [
        ("layers.3.mlp", 3, "layers.*.mlp"),
        ("/layers/0/mlp", 0, "/layers/*/mlp"),  # the layer rule read only '.' and '_' after the container
        ("/model/layers.2/self_attn", 2, "/model/layers.*/self_attn"),
        ("transformer.h.5.mlp", 5, "transformer.h.*.mlp"),
    ],
)
def test_a_scopes_block_is_one_answer_to_every_reader(scope, layer, wild):
    """A node's layer (the loaders' `layer_from_scope`), its block (`module_of`, the lowerings' and tp's)
    and the role's layer wildcard (`general_scope`, the report's) read one scope alike, whatever the
    exporter's separators; its module kind too (the roles' own reading of the last part)."""
    from dabench_ir.ir import layer_from_scope, module_of
    from dabench_ir.report.roles import _scope_names, general_scope

    assert layer_from_scope(scope) == module_of(scope).index == layer
    assert general_scope(scope) == wild
    assert _scope_names(scope) == (False, module_of(scope).kind == "mlp")


# -- the peak a role's "of peak" divides by: the metrics' (the plan's precision) ---------------------


@pytest.mark.parametrize(
    ("target", "precision"), [("h100", "fp8"), ("h100", "int8"), ("h100", "w4a16"), ("sn30", "mixed")]
)
def test_a_roles_share_of_peak_is_over_the_peak_the_metrics_read(target, precision):
    """``fp8`` runs the contraction at the target's ``fp8e4m3`` peak: the role table's "of peak" read the
    bf16 peak instead and printed 155 % for an fp8 GEMM on an H100."""
    from dabench_ir.report.attribution import role_rows, target_peak

    report = api.profile("gpt2-small", target, batch=8, dims={"seq": 512}, precision=precision)
    chips = report.plan.chips
    assert target_peak(report) * chips == report.metrics["peak_flops_per_s"]
    fractions = [r["peak_fraction"] for r in role_rows(report, overheads=False) if r["peak_fraction"] is not None]
    assert fractions and max(fractions) <= 1.0


# -- the work credited to a node: passes.meta.attributed_cost, read by every total ----------------


def test_a_node_no_rule_credits_is_left_out_of_every_total_alike(tmp_path):
    """A node that carries counted work but no rule attributes to it (`meta.UNATTRIBUTED`: MLIR ops
    without an origin) is left out alike by the report's totals, the annotated model's totals and the
    energy's per-node rows; each counted it in, or not, by its own test before one owner held it."""
    import onnx

    from dabench_ir.annotate import annotate_onnx
    from dabench_ir.energy import step_energy
    from dabench_ir.models.presets import preset_file
    from dabench_ir.passes import meta
    from dabench_ir.report.build import build_report

    report = api.profile("gpt2-small", "h100", batch=1, dims={"seq": 32})
    graph = report.graph
    marked = next(n for n in graph.nodes if n.op_type == "MatMul")
    counted = meta.get_cost(marked)
    assert counted is not None and counted.flops > 0
    marked.meta[meta.UNATTRIBUTED] = "no origin (test)"
    credited = sum(c.flops for n in graph.nodes if n is not marked and (c := n.meta.get(meta.COST)) is not None)

    assert build_report(graph, run=report.run).totals["flops"] == credited
    props = {
        p.key: p.value
        for p in onnx.load(annotate_onnx(preset_file("gpt2-small"), graph, tmp_path / "a.onnx")).metadata_props
    }
    assert int(props["dabench.total_flops"]) == credited
    energy = step_energy(graph, report.plan, report.timeline, report.target_obj)
    assert marked.name not in energy.dynamic and len(energy.dynamic) == sum(
        1 for n in graph.nodes if n.name in report.plan.node_plans and meta.attributed_cost(n) is not None
    )
