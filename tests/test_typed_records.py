"""Stages exchange typed records, not string-keyed dicts.

A lowering states what later stages read about a unit in `UnitStats` (``Unit.stats``) and about
the whole plan in `PlanStats` (``Plan.stats``); ``Unit.resources`` and ``Plan.extra`` hold the
lowering's own detail, which only the report shows; the training pass's record is a
`TrainingRecord`. An AST scan keeps it so: no module outside ``lowering/`` reads a ``resources``
or a plan's ``extra`` by key, and a lowering reads only the keys it writes itself.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from dabench_ir.options import ProfileOptions
from dabench_ir.passes import meta
from dabench_ir.passes.training import TrainingPass, TrainingRecord
from dabench_ir.place import place
from dabench_ir.plan import RESOURCE_KEYS, Plan, PlanStats, Schedule, Unit, UnitStats
from dabench_ir.report.build import build_report
from dabench_ir.run import resolve
from dabench_ir.targets import load_target
from tests.lowering_graphs import decoder

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("dabench_ir", "lowering", "passes")


def _sources() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py"))


def _in_lowering(path: Path) -> bool:
    return path.relative_to(ROOT).parts[0] == "lowering"


def _lowering_of(path: Path) -> tuple[str, ...]:
    """The target lowering a file belongs to: its package (``lowering/rdu/``) or its own module."""
    parts = path.relative_to(ROOT).parts
    return parts[:2] if len(parts) > 2 else parts


def _is_plan(expr: ast.expr) -> bool:
    """``plan``, ``best``, ``x.plan``, ``chip.plan``...: an expression naming a Plan (the scan's heuristic)."""
    text = ast.unparse(expr).split(".")[-1]
    return text.endswith("plan") or text in {"best", "small", "big"}


def _field(expr: ast.expr, name: str, *, plan_only: bool = False) -> bool:
    """``<x>.<name>`` (for ``extra``: only on a plan)."""
    return isinstance(expr, ast.Attribute) and expr.attr == name and (not plan_only or _is_plan(expr.value))


def _reads(tree: ast.AST, name: str, *, plan_only: bool = False) -> list[tuple[int, str | None]]:
    """Keyed reads of ``<x>.<name>``: ``[key]`` loads, ``.get(key)``, ``key in``; (line, the key if a literal)."""
    out = []
    for node in ast.walk(tree):
        key = None
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _field(node.value, name, plan_only=plan_only)
        ):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop")
            and _field(node.func.value, name, plan_only=plan_only)
            and node.args
        ):
            key = node.args[0]
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            and any(_field(c, name, plan_only=plan_only) for c in node.comparators)
        ):
            key = node.left
        else:
            continue
        out.append((node.lineno, key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None))
    return out


def _json_reads(tree: ast.AST, key: str) -> list[int]:
    """``x["resources"]`` loads and ``x.get("resources")`` calls: a serialised unit read back."""

    def is_key(expr: ast.expr | None) -> bool:
        return isinstance(expr, ast.Constant) and expr.value == key

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_key(node.slice):
            out.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            out += [node.lineno] if node.args and is_key(node.args[0]) else []
    return out


def _writes(tree: ast.AST, name: str) -> set[str]:
    """Literal keys a module writes into ``<x>.<name>``: ``name={...}`` arguments, ``x.name = {...}``,
    ``x.name[key] = ...`` and ``x.name.update({...})``."""
    keys: set[str] = set()

    def literal(d: ast.expr | None) -> None:
        if isinstance(d, ast.Dict):
            keys.update(k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name:
            literal(node.value)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if _field(t, name):
                    literal(node.value)
                elif isinstance(t, ast.Subscript) and _field(t.value, name) and isinstance(t.slice, ast.Constant):
                    keys.add(t.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            literal(node.args[0] if _field(node.func.value, name) and node.args else None)
    return keys


@pytest.mark.parametrize("field_name", ["resources", "extra"])
def test_no_stage_reads_another_modules_string_keys(field_name):
    plan_only = field_name == "extra"  # Report.extra and Metrics.extra are other records
    bad = []
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in _sources()}
    written_by: dict[tuple[str, ...], set[str]] = {}  # a lowering's keys, over the modules of its package
    for path, tree in trees.items():
        if _in_lowering(path):
            written_by.setdefault(_lowering_of(path), set()).update(_writes(tree, field_name))
    for path, tree in trees.items():
        rel = path.relative_to(ROOT)
        reads = _reads(tree, field_name, plan_only=plan_only)
        if not _in_lowering(path):
            bad += [f"{rel}:{line}: {field_name}[{key!r}]" for line, key in reads]
            if field_name == "resources":
                bad += [
                    f"{rel}:{line}: a serialised unit's resources read back" for line in _json_reads(tree, "resources")
                ]
            continue
        written = written_by[_lowering_of(path)]
        bad += [
            f"{rel}:{line}: {field_name}[{key!r}] is written by another lowering"
            for line, key in reads
            if key is not None and key not in written
        ]
    assert not bad, "read a typed record (UnitStats, PlanStats) instead:\n" + "\n".join(bad)


def test_the_scan_sees_a_read():
    tree = ast.parse(
        'x = unit.resources["pes"]\ny = plan.extra.get("mode")\nz = "a" in u.resources\nw = report.extra["estimated"]'
    )
    assert _reads(tree, "resources") == [(1, "pes"), (3, "a")]
    assert _reads(tree, "extra", plan_only=True) == [(2, "mode")]


def test_records_construct_with_defaults():
    unit = Unit(id="u", kind="k")
    assert unit.stats == UnitStats() and unit.report_resources() == {}
    plan = Plan(target=None, options=None, precision=None, schedule=Schedule.CONCURRENT)  # type: ignore[arg-type]
    assert plan.stats == PlanStats()


def test_report_resources_hold_the_stats_under_their_report_keys():
    unit = Unit(id="r", kind="wse_region:fc", resources={"width": 3.0}, stats=UnitStats(held_units=18.0, pes=9.0))
    assert unit.report_resources() == {"width": 3.0, "units": 18.0, "pes": 9.0}
    assert set(RESOURCE_KEYS) == {f.name for f in dataclasses.fields(UnitStats)}
    graph = TrainingPass()(decoder(layers=1, hidden=64)).graph
    target = load_target("wse")
    plan, timeline, metrics = place(graph, target, ProfileOptions(mode="train", wse_mode="pipelined"))
    report = build_report(graph, run=resolve(graph, target), plan=plan, timeline=timeline, metrics=metrics)
    for u, row in zip(plan.units, report.to_dict()["units"], strict=True):
        assert row["resources"] == {**u.resources, **u.stats.to_resources()}
    io = next(row for row in report.to_dict()["units"] if row["kind"] == "wse_io")
    assert {"pes", "compute_samples_per_s", "transmission_samples_per_s"} <= set(io["resources"])
    assert plan.stats.mode == "pipelined" and plan.stats.step_s and plan.stats.step_s > 0


def test_training_record_is_typed_and_serialises_as_before():
    graph = TrainingPass(recompute="selective")(decoder(layers=1, hidden=64)).graph
    train = meta.training_state(graph)
    assert isinstance(train, TrainingRecord) and train.recompute_mode == "selective" and not train.recompute
    assert list(train.to_dict()) == [
        "optimizer",
        "loss",
        "recompute",
        "recompute_mode",
        "fused_attention",
        "params",
        "gradient_bytes",
        "master_weight_bytes",
        "optimizer_state_bytes",
        "saved_activation_bytes",
    ]
    assert TrainingRecord.from_dict(train.to_dict()) == train
    assert meta.training_state(decoder(layers=1, hidden=64)) is None
    with pytest.raises(TypeError):
        meta.graph_set(graph, meta.TRAINING, train.to_dict())  # the record, not a dict
