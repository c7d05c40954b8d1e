"""One owner per fact: each shared figure or formula is written once and read from there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dabench_ir.targets import load_target, ridge

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("dabench_ir", "passes", "lowering", "targets", "models", "bench", "scripts")


def _sources():
    for folder in SOURCE_DIRS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _mentions(node: ast.AST, words: tuple[str, ...]) -> bool:
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else ""
        if any(w in name.lower() for w in words):
            return True
    return False


# -- ridge point: Target.ridge_point / targets.ridge -------------------------------------------


def test_ridge_point_is_peak_over_the_given_memory():
    t = load_target("a100")
    for mem in t.memories:
        assert t.ridge_point("fp16", mem) == t.peak_flops("fp16") / mem.bandwidth_bytes_per_s
        assert t.ridge_point("fp16", mem.name) == t.ridge_point("fp16", mem)
    assert ridge(10.0, 4.0) == 2.5


def test_ridge_expressions_only_in_targets():
    """A peak divided by a bandwidth is written once, in targets/__init__.py."""
    owner = ROOT / "targets" / "__init__.py"
    found = []
    for path in _sources():
        if path == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            is_div = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            if is_div and _mentions(node.left, ("peak",)) and _mentions(node.right, ("bandwidth", "bw")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"ridge point computed outside Target.ridge_point: {found}"


def _lines_matching(pattern: str, owner: Path) -> list[str]:
    """``file:line`` of every source line outside ``owner`` that matches ``pattern``."""
    regex = re.compile(pattern)
    return [
        f"{path.relative_to(ROOT)}:{i}"
        for path in _sources()
        if path != owner
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if regex.search(line)
    ]


# -- ring all-reduce: lowering/collectives.py ---------------------------------------------------


def test_ring_allreduce_formula_only_in_collectives():
    """The ring's 2(n-1)/n volume factor is written once, in lowering/collectives.py."""
    found = _lines_matching(r"2 \* \(\w+ - 1\) / \w+", ROOT / "lowering" / "collectives.py")
    assert not found, f"ring all-reduce written outside lowering/collectives.py: {found}"


# -- parameter count: Graph.num_params ----------------------------------------------------------


def test_parameter_count_only_in_graph():
    """Summing the weights' elements is Graph.num_params' job alone (dabench_ir/ir.py)."""
    found = _lines_matching(r"numel\([^)]*\) for \w+ in \w+\.weights\(\)", ROOT / "dabench_ir" / "ir.py")
    assert not found, f"parameter count written outside Graph.num_params: {found}"


# -- default heads: models/config.default_heads -------------------------------------------------


def test_default_heads_is_hidden_over_64_and_written_once():
    from dabench_ir.errors import UserError
    from dabench_ir.models.config import default_heads

    assert default_heads(768) == 12
    with pytest.raises(UserError, match="multiple of 64: pass --heads"):
        default_heads(100, hint="pass --heads")
    found = _lines_matching(r"hidden\W*\s*(//|%) 64\b", ROOT / "models" / "config.py")
    assert not found, f"heads = hidden / 64 written outside models/config.py: {found}"


# -- the 4 GiB synthesised-weight cap: dabench_ir/options.DEFAULT_MAX_WEIGHT_BYTES ---------------


def test_weight_cap_is_one_constant():
    from dabench_ir.execute import synth
    from dabench_ir.models import export
    from dabench_ir.options import DEFAULT_MAX_WEIGHT_BYTES, ProfileOptions

    assert DEFAULT_MAX_WEIGHT_BYTES == 4 << 30
    assert ProfileOptions().max_weight_bytes == synth.DEFAULT_MAX_WEIGHT_BYTES == DEFAULT_MAX_WEIGHT_BYTES
    assert export.DEFAULT_MAX_WEIGHT_BYTES is DEFAULT_MAX_WEIGHT_BYTES
    found = _lines_matching(r"\b4 << 30\b|\b4 \* 2\*\*30\b|default=\"4GiB\"", ROOT / "dabench_ir" / "options.py")
    assert not found, f"the 4 GiB weight cap written outside dabench_ir/options.py: {found}"


# -- precision lists: dabench_ir/options.PRECISIONS, FLOAT_PRECISIONS, KV_PRECISIONS ------------


def test_precision_modes_cover_exactly_the_knob_choices():
    from dabench_ir.options import FLOAT_PRECISIONS, KV_PRECISIONS, PRECISIONS
    from dabench_ir.passes import precision

    assert precision._CHOICES is PRECISIONS
    assert set(PRECISIONS) == {*precision._MODES, "mixed", *precision._QUANT}
    assert set(KV_PRECISIONS) == set(precision._KV)
    assert set(FLOAT_PRECISIONS) == {*precision._MODES, "mixed"}


# -- percentages: dabench_ir/report/table.percent, percent_change, parse_percent -----------------


def test_percent_helpers_one_per_meaning():
    from dabench_ir.report.table import parse_percent, percent, percent_change

    assert percent(0.25) == "25.0%" and percent(None) == "-"
    assert percent(0.031, width=5, missing="   n/a") == "  3.1%" and percent(None, missing="n/a") == "n/a"
    assert percent_change(2.0, 2.5) == "+25.0%" and percent_change(0, 1.0) == "-"
    assert parse_percent("12.5%") == 0.125 and parse_percent("-") is None and parse_percent("x") is None
    found = _lines_matching(r"^\s*def _?pct\(", ROOT / "dabench_ir" / "report" / "table.py")
    assert not found, f"a percentage helper defined outside dabench_ir/report/table.py: {found}"


@pytest.mark.parametrize(("share", "text"), [(0.42, "42%"), (0.097, "9.7%"), (0.0041, "0.41%"), (3e-5, "<0.01%")])
def test_a_small_share_reads_alike_in_the_why_lines_and_the_plot_labels(share, text):
    """One formatter for a share in prose and labels (the why lines and the roofline's labels had
    two, with different thresholds: 0.097 read 9.7 % in one and 10 % in the other)."""
    from dabench_ir.report import plots, why
    from dabench_ir.report.table import short_percent

    assert short_percent(share) == text
    assert why.short_percent is plots.short_percent is short_percent


# -- compute dtype: passes/precision.py (compute_dtype, graph_compute_dtype, dominant_storage_dtype)


def test_dtype_questions_answered_in_passes_precision_only():
    from dabench_ir.ir import DType
    from dabench_ir.passes.precision import compute_dtype, dominant_storage_dtype, graph_compute_dtype
    from tests.lowering_graphs import decoder

    assert compute_dtype("mixed") is DType.FLOAT16 and compute_dtype("w4a16") is DType.FLOAT16
    graph = decoder(dtype=DType.FLOAT16)
    assert graph_compute_dtype(graph) is DType.FLOAT16
    assert dominant_storage_dtype(graph) == str(DType.FLOAT16)
    names = "graph_dtype|_dominant_dtype|compute_dtype|graph_compute_dtype|dominant_storage_dtype"
    found = _lines_matching(rf"^\s*def ({names})\(", ROOT / "passes" / "precision.py")
    assert not found, f"a graph's dtype decided outside passes/precision.py: {found}"
