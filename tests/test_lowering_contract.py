"""The lowering contract: every lowering implements `Lowering`, reads its options by knob
name, places nodes through `place_node`, and imports no later stage."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from dabench_ir.errors import UserError
from dabench_ir.ir import Cost, DType
from dabench_ir.lowering import KINDS, Lowering, LoweringOptions, lower, lowering_for
from dabench_ir.lowering.context import UNATTRIBUTED_NOTE, LoweringContext, place_node
from dabench_ir.lowering.gpu import GpuLowering
from dabench_ir.lowering.ipu import IpuLowering
from dabench_ir.lowering.rdu import RduLowering
from dabench_ir.lowering.wse import WseLowering
from dabench_ir.options import KNOBS, ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.place import place
from dabench_ir.targets import load_target
from dabench_ir.timeline import Bound, classify_bound
from tests.lowering_graphs import chain, decoder

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"wse": "wse", "rdu": "rdu", "ipu": "ipu", "gpu": "a100", "cpu": "cpu"}


# -- classify_bound ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flops", "feed", "ridge", "times", "expected"),
    [
        (100, 10, 5.0, {"work_s": 1.0}, Bound.COMPUTE),  # intensity 10 >= ridge 5
        (100, 20, 5.0, {"work_s": 1.0}, Bound.COMPUTE),  # exactly at the ridge: compute
        (100, 40, 5.0, {"work_s": 1.0}, Bound.MEMORY),  # intensity 2.5 < 5
        (100, 0, 5.0, {"work_s": 1.0}, Bound.COMPUTE),  # no bytes moved at the feed level
        (0, 0, 5.0, {"work_s": 0.0}, Bound.OVERHEAD),  # nothing to do
        (100, 10, 5.0, {"work_s": 1.0, "comm_s": 2.0}, Bound.COMMUNICATION),
        (100, 10, 5.0, {"work_s": 1.0, "comm_s": 1.0}, Bound.COMPUTE),  # a tie stays with the work
        (100, 10, 5.0, {"work_s": 1.0, "comm_s": 2.0, "overhead_s": 3.0}, Bound.OVERHEAD),
        (100, 10, 5.0, {"work_s": 1.0, "overhead_s": 1.0}, Bound.COMPUTE),  # overhead must exceed the work
        (0, 0, 5.0, {"work_s": 0.0, "comm_s": 1e-6}, Bound.COMMUNICATION),  # a pure transfer
    ],
)
def test_classify_bound(flops, feed, ridge, times, expected):
    assert classify_bound(flops, feed, ridge, **times) is expected


def test_classify_bound_is_defined_once():
    """One bound rule in the code base: no other module defines a classify_bound."""
    found = []
    for path in [*ROOT.glob("dabench_ir/**/*.py"), *ROOT.glob("lowering/**/*.py"), *ROOT.glob("passes/*.py")]:
        tree = ast.parse(path.read_text())
        found += [
            f"{path.relative_to(ROOT)}"
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name == "classify_bound"
        ]
    assert found == ["dabench_ir/timeline.py"]


# -- place_node ---------------------------------------------------------------------------------


def _ctx(flops, nbytes):
    graph = chain(flops, nbytes)
    return graph, LoweringContext.build(graph)


def _place(ctx, node, **fields):
    """`place_node` on unit "u" from the off-chip memory at ridge 10, whole allocation, unless ``fields`` say."""
    return place_node(ctx, node, **{"unit": "u", "feed_level": "off-chip", "ridge": 10.0, "allocation": 1.0, **fields})


def test_place_node_roofline_plus_comm_and_overhead_per_micro_batch():
    graph, ctx = _ctx([4000], [100])
    times = {"compute_s": 4.0, "memory_s": 1.0, "comm_s": 0.5, "overhead_s": 0.25}
    np_ = _place(ctx, graph.nodes[0], **times, feed_bytes=100, allocation=0.5, micro_batches=4)
    assert np_.per_micro_batch_s == (4.0 + 0.5 + 0.25) / 4
    assert (np_.unit, np_.lane, np_.flops, np_.bytes, np_.feed_bytes) == ("u", "u", 4000, 100, 100)
    assert (np_.compute_s, np_.memory_s, np_.comm_s, np_.overhead_s) == (4.0, 1.0, 0.5, 0.25)
    assert np_.bound is Bound.COMPUTE and np_.allocation == 0.5 and np_.note == ""


@pytest.mark.parametrize(("compute", "memory", "expected"), [(1.0, 3.0, Bound.MEMORY), (3.0, 1.0, Bound.MEMORY)])
def test_place_node_bound_is_from_intensity_not_from_which_time_is_larger(compute, memory, expected):
    graph, ctx = _ctx([100], [100])  # intensity 1 below ridge 10
    np_ = _place(ctx, graph.nodes[0], lane="u/a", compute_s=compute, memory_s=memory, feed_bytes=100)
    assert np_.per_micro_batch_s == 3.0 and np_.lane == "u/a" and np_.bound is expected


def test_place_node_bookkeeping_takes_no_time_and_is_overhead_bound():
    graph = chain([0], [64])
    graph.nodes[0].op_type = "Reshape"  # a shape op: no unit works on it
    ctx = LoweringContext.build(graph)  # the context reads each node's work once, as built
    times = {"compute_s": 1.0, "memory_s": 2.0, "comm_s": 3.0, "overhead_s": 4.0}
    np_ = _place(ctx, graph.nodes[0], **times, feed_level="on-chip", feed_bytes=64, ridge=1.0, allocation=0.0)
    assert np_.per_micro_batch_s == 0.0 and np_.bound is Bound.OVERHEAD
    assert (np_.compute_s, np_.memory_s, np_.comm_s, np_.overhead_s) == (0.0, 0.0, 0.0, 0.0)


def test_place_node_time_override_and_unattributed_note():
    graph, ctx = _ctx([10, 10], [10, 10])
    del graph.nodes[1].meta[meta.COST]
    graph.nodes[1].meta[meta.UNATTRIBUTED] = "no rule"
    ctx = LoweringContext.build(graph)
    timed = _place(ctx, graph.nodes[0], compute_s=1.0, feed_level="x", feed_bytes=10, ridge=1.0, time_s=7.0)
    assert timed.per_micro_batch_s == 7.0
    loose = _place(ctx, graph.nodes[1], compute_s=1.0, feed_level="x", feed_bytes=0, ridge=1.0)
    assert loose.note == UNATTRIBUTED_NOTE and loose.per_micro_batch_s == 0.0 and ctx.costs["n1"] == Cost()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_lowering_classifies_bookkeeping_nodes_as_overhead(kind):
    """The rule the RDU lowering had, now every lowering's (before, WSE/IPU/GPU/CPU called a
    zero-time Reshape memory-bound from its bytes)."""
    graph = decoder(layers=1, hidden=64, seq=8)
    graph.nodes[1].op_type = "Reshape"
    graph.nodes[1].meta[meta.COST] = Cost(act_bytes_in=1024, act_bytes_out=1024)
    np_ = lower(graph, load_target(TARGETS[kind]), ProfileOptions()).node_plans[graph.nodes[1].name]
    assert np_.bound is Bound.OVERHEAD
    if kind != "cpu":  # the CPU lowering charges onnxruntime's per-op overhead
        assert np_.per_micro_batch_s == 0.0


# -- the Lowering contract ------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "module"), sorted(KINDS.items()))
def test_every_registered_lowering_implements_the_contract(kind, module):
    lowering = importlib.import_module(f"dabench_ir.lowering.{module}").LOWERING
    assert isinstance(lowering, Lowering) and lowering.name == module and kind in lowering.kinds
    assert issubclass(lowering.Options, LoweringOptions)
    assert lowering.Options.__dataclass_params__.frozen
    for f in dataclasses.fields(lowering.Options):  # a knob by its declared name, or an internal setting
        assert f.name in KNOBS or f.metadata.get("internal"), f"{module}: {f.name}"
        if not f.metadata.get("internal"):
            assert f.default is dataclasses.MISSING, f"{module}: {f.name} re-declares its default"
    target = load_target(TARGETS[kind])
    assert lowering_for(target) is lowering
    plan = lowering.lower(decoder(layers=1, hidden=64, seq=8), target, ProfileOptions())
    assert isinstance(plan.options, lowering.Options)
    levels = {np_.feed_level for np_ in plan.node_plans.values()}
    if kind == "cpu":  # the host's nodes that fit in its last-level cache are fed from it (lowering.cpu.feed_levels)
        assert lowering.feed_level(target) == "off-chip" and levels <= {m.level for m in target.memories}
    else:
        assert levels == {lowering.feed_level(target)}


def test_options_read_knobs_by_name_with_their_declared_defaults():
    assert RduLowering.options(ProfileOptions(opt_level="O3")).opt_level == "O3"
    defaults = ProfileOptions()
    wse = WseLowering.options(None)
    assert (wse.wse_mode, wse.replicas) == (defaults.wse_mode, defaults.replicas)
    assert not hasattr(wse, "batch")  # the batch is the graph's (dabench_ir.run), never a lowering option
    assert wse.fuse_elementwise and wse.steady_state  # internal settings keep their defaults
    assert GpuLowering.options(ProfileOptions(precision="mixed")).precision is DType.BFLOAT16  # mixed stores bf16
    assert IpuLowering.options(ProfileOptions(precision="bf16"), steady_state=False).precision is DType.BFLOAT16
    assert IpuLowering.options(WseLowering.options(ProfileOptions(micro_batches=3))).micro_batches == 3
    with pytest.raises(TypeError, match="fuse_elementwise"):
        RduLowering.options(None, fuse_elementwise=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wse.wse_mode = "streaming"  # type: ignore[misc]


def test_lower_takes_profile_options_own_options_or_none_alike():
    graph, target = decoder(layers=1, hidden=64, seq=8), load_target("rdu")
    times = {
        repr(opts): [p.per_micro_batch_s for p in lower(graph, target, opts).node_plans.values()]
        for opts in (None, ProfileOptions(), RduLowering.options(ProfileOptions()))
    }
    assert len({tuple(v) for v in times.values()}) == 1
    o0 = lower(graph, target, ProfileOptions(opt_level="O0"))
    assert o0.extra["opt_level"] == "O0" and len(o0.units) > 1


def test_lowering_for_unknown_kind_and_wrong_target_are_user_errors():
    from types import SimpleNamespace

    from dabench_ir.targets import KINDS as TARGET_KINDS

    assert set(TARGET_KINDS) == set(KINDS)  # every kind a target file may declare has its lowering
    alien = SimpleNamespace(name="alien", kind="quantum")
    with pytest.raises(UserError, match="no lowering for target kind 'quantum'"):
        lowering_for(alien)
    with pytest.raises(UserError, match="the rdu lowering serves rdu targets, not h100"):
        RduLowering().lower(decoder(layers=1), load_target("h100"))


def test_cpu_lowering_reads_ort_opt_as_an_option():
    from dabench_ir.pipeline import analyze
    from tests.conftest import parse

    model = parse(
        """agraph (float[4,16] x) => (float[4,32] y) <float[32,16] W = {WEIGHTS}>
        { Wt = Transpose<perm=[1,0]>(W)  y = MatMul(x, Wt) }""".replace("WEIGHTS", ",".join(["0.5"] * 512))
    )
    graph = analyze(model)
    cpu = load_target("cpu")
    plain = lower(graph, cpu, ProfileOptions())
    folded = lower(graph, cpu, ProfileOptions(ort_opt=True))
    transpose = graph.nodes[0].name
    assert plain.node_plans[transpose].per_micro_batch_s > 0 == folded.node_plans[transpose].per_micro_batch_s
    assert "ort_opt" not in graph.meta


def test_place_is_lower_emulate_metrics():
    graph, target = decoder(layers=2, hidden=64, seq=8), load_target("ipu")
    plan, timeline, metrics = place(graph, target, ProfileOptions(ipus=2))
    assert plan.chips == 2 and set(timeline.nodes) == set(plan.node_plans)
    assert metrics.step_time_s == timeline.step_time_s > 0
    assert {n: t.bound for n, t in timeline.nodes.items()} == {n: p.bound for n, p in plan.node_plans.items()}


def _state(graph) -> tuple:
    """Everything a pass or a lowering could write to ``graph``, as comparable values."""
    nodes = [
        (n.name, n.op_type, n.domain, n.inputs, n.outputs, repr(n.attrs), n.scope, n.layer, repr(n.meta))
        for n in graph.nodes
    ]
    values = [(v.name, v.type, v.kind, v.producer, v.scalar) for v in graph.values.values()]
    return nodes, values, repr(graph.meta), repr(graph.bindings), graph.inputs, graph.outputs


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("micro_batches", [1, 4])
def test_placing_writes_nothing_to_the_graph(kind, micro_batches):
    """Lowering, emulating and measuring a training placement in micro-batches (every target takes
    them in training) read the graph and never write it: what lets a why line's variant run share
    the report's prepared graph (`advice.VariantRuns.shares_graph`)."""
    from dabench_ir.passes.training import TrainingPass
    from dabench_ir.verify import check_step

    graph, target = decoder(layers=2, hidden=64, seq=8, batch=4), load_target(TARGETS[kind])
    TrainingPass()(graph)
    before = _state(graph)
    plan, timeline, _ = place(graph, target, ProfileOptions(mode="train", micro_batches=micro_batches))
    check_step(graph, target, plan, timeline)
    assert _state(graph) == before


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_lowering_reads_its_context_and_a_shared_one_places_the_same(kind):
    """One `LoweringContext` serves several placements of the unchanged graph (the why lines'
    variants, `advice.VariantRuns.context`): every lowering reads it and writes nothing to it, so
    a placement with the shared context equals one that builds its own; a context of another graph
    is refused, and one at another precision is not used."""
    from dabench_ir.passes.training import TrainingPass

    graph, target = decoder(layers=2, hidden=64, seq=8, batch=4), load_target(TARGETS[kind])
    TrainingPass()(graph)
    opts = ProfileOptions(mode="train", micro_batches=2)
    ctx = LoweringContext.build(graph)
    before = (dict(ctx.costs), list(ctx.unattributed), ctx.precision, ctx.total_weight_bytes, ctx.stored)
    own = lower(graph, target, opts)
    for _ in range(2):
        shared = lower(graph, target, opts, context=ctx)
        assert shared.node_plans == own.node_plans and shared.step_overheads_s == own.step_overheads_s
    assert (dict(ctx.costs), list(ctx.unattributed), ctx.precision, ctx.total_weight_bytes, ctx.stored) == before
    with pytest.raises(ValueError, match="of the graph it was built for"):
        lower(graph.clone(), target, opts, context=ctx)
    bf16 = LoweringContext.build(graph, DType.BFLOAT16)  # the graph computes in fp32: not this plan's
    assert lower(graph, target, opts, context=bf16).node_plans == own.node_plans


# -- module hygiene ------------------------------------------------------------------------------

_LATER_STAGES = ("emulate", "metrics", "execute", "report", "scaling", "place", "pipeline", "commands", "sweep")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "dabench_ir.lowering." * (node.level > 0) + (node.module or "")
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize(
    "path", sorted((ROOT / "lowering").rglob("*.py")), ids=lambda p: p.relative_to(ROOT / "lowering").as_posix()
)
def test_lowering_imports_no_later_stage(path):
    bad = {
        n for n in _imports(path) for s in _LATER_STAGES if n == f"dabench_ir.{s}" or n.startswith(f"dabench_ir.{s}.")
    }
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("package", ["lowering", "passes", "targets", "models"])
def test_bare_top_level_import_fails_clearly(package):
    """From the repository root the folders are importable by their bare name; one file must
    be one module, so only ``dabench_ir.<package>`` imports them."""
    proc = subprocess.run([sys.executable, "-c", f"import {package}"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert f"ImportError: import dabench_ir.{package} instead of the bare top-level '{package}' package" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-c", f"import dabench_ir.{package}"], cwd=ROOT, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
