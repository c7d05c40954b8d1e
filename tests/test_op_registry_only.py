"""Per-op knowledge lives only in the registry (passes/cost_rules.py): no module keeps a side table.

A side table is a module-level assignment whose value builds a set, frozenset, dict, tuple or
list holding two or more string literals that are registered op types (``_NORM_OPS =
frozenset({"LayerNormalization", "RMSNormalization"})``). Such a fact belongs in the op's
`@cost_rule` / `op_traits_only` registration, read with `traits_of(node)` or `ops_with(...)`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from dabench_ir.passes import cost_rules

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dabench_ir", "passes", "lowering")
REGISTRY = "passes/cost_rules.py"

ALLOWED: dict[tuple[str, str], str] = {}  # (file, name) -> why it is not op knowledge; none today


def _op_names() -> frozenset[str]:
    """Every op type the registry knows (costed or traits-only), without its domain."""
    return frozenset(op for _, op in cost_rules._TRAITS)


def _string_literals(value: ast.expr) -> list[str]:
    """String constants directly inside a set/frozenset/dict/tuple/list display (or a call
    such as ``frozenset({...})`` / ``dict(...)`` wrapping one)."""
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id
        in (
            "frozenset",
            "set",
            "tuple",
            "list",
            "dict",
        )
    ):
        out = [s for arg in value.args for s in _string_literals(arg)]
        out += [kw.arg for kw in value.keywords if kw.arg]
        return out
    if isinstance(value, ast.Set | ast.Tuple | ast.List):
        return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if isinstance(value, ast.Dict):
        return [
            e.value for e in (*value.keys, *value.values) if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


def _targets(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def side_tables(source: str, ops: frozenset[str]) -> list[tuple[int, str, list[str]]]:
    """(line, variable, op names) for each module-level side table in ``source``."""
    found = []
    for stmt in ast.parse(source).body:
        if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
            continue
        named = sorted({s for s in _string_literals(stmt.value) if s in ops})
        if len(named) >= 2:
            found.extend((stmt.lineno, name, named) for name in _targets(stmt))
    return found


def test_the_checker_finds_a_side_table():
    ops = _op_names()
    src = 'X = 1\n_NORMS = frozenset({"LayerNormalization", "RMSNormalization"})\nY: dict = {"Gelu": 1, "Erf": 2}\n'
    assert [(line, name) for line, name, _ in side_tables(src, ops)] == [(2, "_NORMS"), (3, "Y")]
    assert side_tables('WORDS = ("attn", "attention")\nONE = ("Gelu",)\n', ops) == []


def test_no_module_outside_the_registry_keeps_an_op_side_table():
    ops = _op_names()
    problems = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == REGISTRY or (rel, "*") in ALLOWED:
                continue
            for line, name, named in side_tables(path.read_text(encoding="utf-8"), ops):
                if (rel, name) not in ALLOWED:
                    problems.append(f"{rel}:{line}: {name} lists op types {', '.join(named)}")
    assert not problems, "op knowledge outside passes/cost_rules.py (declare it as an OpTraits field):\n" + "\n".join(
        problems
    )
