"""What a template returns as data is a copy of plain JSON values: the fast copy of a
value that is plain data already (another node's output) gives what the general
conversion gives, shares no container with the original, and is charged alike."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import Markup

from axengine.template import _values

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=25,
)


def _containers(value: Any) -> list[int]:
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            found.append(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


@settings(max_examples=300, deadline=None)
@given(value=JSON)
def test_plain_data_is_copied_whole(value: Any) -> None:
    copied = _values._to_native(value)
    assert copied == value
    assert not set(_containers(copied)) & set(_containers(value))


def test_what_is_not_plain_data_takes_the_conversion() -> None:
    value = {"a": [Markup("<b>x</b>"), (1, 2)], "b": {1: "one"}}
    assert _values._plain_copy(value) is None
    assert _values._to_native(value) == {"a": ["<b>x</b>", [1, 2]], "b": {"1": "one"}}
    assert type(_values._to_native(value)["a"][0]) is str


def test_a_value_that_shares_its_parts_is_refused_by_the_budget() -> None:
    # Small to build, 8**10 entries to copy: refused, no hang.
    from axengine.errors import TemplateLimitError
    from axengine.template import render

    levels = "".join(f"{{% set l{i} = [l{i - 1}, l{i - 1}, l{i - 1}, l{i - 1}, l{i - 1}, "
                     f"l{i - 1}, l{i - 1}, l{i - 1}] %}}" for i in range(1, 10))
    with pytest.raises(TemplateLimitError):
        render("{% set l0 = [1, 2, 3, 4, 5, 6, 7, 8] %}" + levels + "{{ l9 }}", {})


def test_the_fast_copy_stops_at_its_bound() -> None:
    shared: Any = [1, 2, 3]
    for _ in range(12):
        shared = [shared] * 8  # 8**12 lists, a few dozen objects
    assert _values._bounded_copy(shared, 10_000) is None  # (it stops, the caller refuses)
    assert _values._bounded_copy([[1, 2], {"a": [3]}], 10) == ([[1, 2], {"a": [3]}], 5)
