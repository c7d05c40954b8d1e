"""Issue 34: the profile path does less work for the same answer.

`safe_name_scopes` splits the exporter's plain list form without a parse; every text gives the
list `ast.literal_eval` gives (the reference), and any other text still goes through the parse.
"""

from __future__ import annotations

import ast

import pytest

from dabench_ir.frontends.checks import safe_name_scopes


def _reference(text: str) -> list[str]:
    try:
        entries = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return []
    return [s for s in entries if isinstance(s, str) and s] if isinstance(entries, (list, tuple)) else []


@pytest.mark.parametrize(
    "text",
    ["['', 'full']", "['layers.0', 'layers.0.self_attn', 'linear']", "[]", "['']", "['a']", "['a', '']",
     "['a b', 'c;d']", "['a','b']", "[ 'a']", " ['a']", "['a', 'b',]", "['it\\'s']", '["a", "b"]',
     "['a\\nb']", "['é']", "['a', 5]", "('a', 'b')", "['a'] + ['b']", "['a', 'b'", "['a\tb']", "[''a']",
     "['[', ']']", "['a', ', ', 'b']"],
)  # fmt: skip
def test_name_scopes_as_literal_eval(text):
    assert safe_name_scopes(text) == _reference(text)


def test_name_scopes_property():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.conftest import property_settings

    items = st.lists(st.text(alphabet=st.sampled_from(list("ab.0 ',\\[]\t\né")), max_size=6), max_size=4)

    @property_settings("DABENCH_FUZZ_EXAMPLES", 200)
    @given(items, st.booleans())
    def check(entries, as_repr):
        text = repr(entries) if as_repr else "[" + ", ".join(f"'{e}'" for e in entries) + "]"
        assert safe_name_scopes(text) == _reference(text)

    assert hypothesis
    check()
