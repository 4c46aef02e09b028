"""Templates that only read values are evaluated without Jinja (``axengine.template._fast``)
and must answer exactly as Jinja does.

Each generated template and context is rendered twice through the public functions:
as they run, and with the fast path switched off (every template through Jinja, as
before it existed). The two outcomes must be the same: the same value of the same
types, or the same error class, message and line. Templates come from a grammar of the
fast forms (paths, constants, one comparison, and/or/not, text around) with near
misses beside them (chained comparisons, arithmetic, filters, ``if``/``else``, names
that are not context lookups); contexts hold the fields the paths ask for, or not, with
values of every JSON type, and the names Jinja treats apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from axengine.errors import TemplateError
from axengine.template import (
    _api,
    _expression,
    _fast,
    evaluate_expression,
    evaluate_guard,
    render,
    render_value,
    template_context,
)
from axengine.template._compiler import _compile_condition, _compiled

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

HEADS = ["input", "nodes", "output", "task", "x", "self", "range", "loop", "_x"]
#: Heads drawn mostly from the context's plain names (the others are near misses).
COMMON_HEADS = ["input", "output", "x"] * 4 + HEADS
PARTS = [".a", ".b", ".items", ".keys", "._x", "['a']", "['b']", "['_x']", "[0]", "[1]",
         ".0", "['items']"]
LITERALS = ["'a'", "'b'", "''", "1", "0", "2.5", "true", "false", "none", "True", "None",
            "'1'"]
COMPARISONS = ["==", "!=", "<", ">", "<=", ">="]
# Near misses: Jinja evaluates them, the fast path must leave them to it.
OTHER_OPERATORS = ["+", "~", "*", "in", "is", "< 1 <", "if"]
FILTERS = ["|lower", "|length", "|default('d')", "|tojson"]
TEXTS = ["", " ", "x ", " y", "\n", "a\nb ", "} ", "{x}"]


@st.composite
def paths(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(PARTS), max_size=3))
    return draw(st.sampled_from(["", "."])) + draw(st.sampled_from(COMMON_HEADS)) + "".join(parts)


@st.composite
def operands(draw: st.DrawFn) -> str:
    out = draw(st.one_of(paths(), st.sampled_from(LITERALS)))
    if draw(st.integers(0, 9)) == 0:
        out += draw(st.sampled_from(FILTERS))
    return out


@st.composite
def conditions(draw: st.DrawFn) -> str:
    """``[not] a [op b] (and|or [not] c [op d])*``, now and then with a near miss."""
    def term() -> str:
        out = draw(st.sampled_from(["", "", "not "])) + draw(operands())
        kind = draw(st.integers(0, 9))
        if kind < 5:
            out += f" {draw(st.sampled_from(COMPARISONS))} {draw(operands())}"
        elif kind == 5:
            out += f" {draw(st.sampled_from(OTHER_OPERATORS))} {draw(operands())}"
            if out.endswith(" if " + out.rsplit(" if ", 1)[-1]):
                out += f" else {draw(operands())}"
        return out
    out = term()
    for _ in range(draw(st.integers(0, 2))):
        out += f" {draw(st.sampled_from(['and', 'or', 'and not', 'or not']))} {term()}"
    return out


@st.composite
def templates(draw: st.DrawFn) -> str:
    out = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 3))):
        out += "{{ " + draw(conditions()) + " }}" + draw(st.sampled_from(TEXTS))
    return out


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3),
              st.floats(allow_nan=False, allow_infinity=False, width=16),
              st.sampled_from(["", "a", "b", "1", "false", " x "])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "items", "keys", "_x", "0"]), inner,
                        max_size=4)),
    max_leaves=12)


KEYS = st.sampled_from(["a", "b", "items", "keys", "_x", "0"])
# Mostly dicts and lists holding what the paths ask for, so that most reads succeed.
containers = st.one_of(
    st.dictionaries(KEYS, json_values, min_size=2, max_size=5),
    st.lists(json_values, min_size=1, max_size=3),
    json_values)


@st.composite
def contexts(draw: st.DrawFn) -> dict[str, Any]:
    names = [name for name in HEADS if draw(st.integers(0, 5))]
    return {name: draw(containers) for name in names}


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What ``call`` gave: its value with the type of every part, or its error."""
    try:
        value = call()
    except TemplateError as exc:
        return ("error", type(exc), str(exc), getattr(exc, "line", 0))
    return ("value", _typed(value))


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        return ("dict", [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


def _both(call: Callable[[], Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``call``'s outcome as it runs, and through Jinja alone (no fast path)."""
    fast = _outcome(call)
    with mock.patch.object(_fast, "run", return_value=_fast.GAVE_UP):
        slow = _outcome(call)
    return fast, slow


def _same(call: Callable[[], Any]) -> None:
    fast, slow = _both(call)
    assert fast == slow


@SETTINGS
@given(templates(), contexts())
@example("{{ .input.a }}", {"input": {"a": [1, {"b": True}]}})
@example("report {{ .input.a }}\n", {"input": {"a": "doc"}})
@example("{{ .input.items }}", {"input": {"b": 1}})
@example("{{ .input[1] }}", {"input": ["a"]})
@example("{{ self }}", {"self": 1})
@example("{{ .input.a < 1 }}", {"input": {"a": "x"}})
@example("{{ x.a and x.b }}", {"x": {"a": 0}})
@example("{{ x.a or x.b }}", {"x": {"a": 0}})
def test_render_answers_as_jinja(source: str, context: dict[str, Any]) -> None:
    _same(lambda: render(source, context))
    _same(lambda: render_value({"k": source, "l": [source, "plain", 3]}, context))
    _same(lambda: evaluate_guard(source, context))


@SETTINGS
@given(conditions(), conditions(), contexts())
@example("output.a == 'x'", "output.b > 1", {"output": {"a": "y", "b": 2}})
@example("output.a", "output.missing", {"output": {"a": 0}})
def test_conditions_answer_as_jinja(first: str, second: str, context: dict[str, Any]) -> None:
    _same(lambda: evaluate_guard(first, context))
    expression = f"if {first}: one\nelif {second}: two\nelse: three"
    _same(lambda: evaluate_expression(expression, context))


FAST_FORMS = [
    "{{ .input.doc }}",
    "report {{ .input.doc }}",
    "{{ .nodes.parse_pdf.output.text }}",
    "{{ .nodes.extract.output['rows'][0] }}",
    "{{ .output.status == 'success' }}",
    "{{ not .output.ok or .output.n >= 2 }}",
]


@pytest.mark.parametrize("source", FAST_FORMS)
def test_reading_templates_skip_jinja(source: str) -> None:
    context = template_context(
        input={"doc": "d"},
        nodes={"parse_pdf": {"text": "t"}, "extract": {"rows": [1]}},
        output={"status": "success", "ok": True, "n": 1})
    assert _compiled(source).fast is not None
    with mock.patch.object(_api, "_guarded", side_effect=AssertionError("Jinja ran")):
        rendered = render(source, context)
        structure = render_value({"a": source, "b": ["x", source]}, context)
        guard = evaluate_guard(source, context)
    fast, slow = _both(lambda: render(source, context))
    assert fast == slow == ("value", _typed(rendered))
    assert structure == {"a": rendered, "b": ["x", rendered]}
    assert _both(lambda: evaluate_guard(source, context)) == (("value", _typed(guard)),) * 2


def test_an_if_form_of_reads_skips_jinja() -> None:
    source = ("if .output.growth > 0.15 and .output.margin < 0.12: high\n"
              "elif .output.d2e > 2.0: medium\nelse: low")
    context = template_context(input={}, nodes={},
                               output={"growth": 0.05, "margin": 0.2, "d2e": 2.5})
    with mock.patch.object(_expression, "_guarded", side_effect=AssertionError("Jinja ran")):
        assert evaluate_expression(source, context) == "medium"


@pytest.mark.parametrize("source", [
    "{{ .input.doc|lower }}", "{{ .input.n + 1 }}", "{{ 'a' if .input.x else 'b' }}",
    "{{ range(3) }}", "{{ .input.a < .input.b < .input.c }}", "{% if x %}y{% endif %}",
    "{{ .input.doc ~ 'x' }}", "{{ self }}", "{{ .input.items() }}", "{{ .input[1:2] }}",
])
def test_other_templates_take_jinja(source: str) -> None:
    assert _compiled(source).fast is None


def test_a_bare_condition_has_a_fast_form() -> None:
    assert _compile_condition("output.a == 1 and not output.b", 0).fast is not None
    assert _compile_condition("output.a|length > 1", 0).fast is None


def test_a_miss_is_jinja_s_error() -> None:
    context = template_context(input={"doc": "d"}, nodes={})
    with pytest.raises(TemplateError, match="no field 'missing'"):
        render("{{ .input.missing }}", context)
    # The text bound: one value over it, or two values that are over it together.
    with pytest.raises(TemplateError, match="65536"):
        render("x {{ .input.doc }}", template_context(input={"doc": "d" * 70_000}, nodes={}))
    with pytest.raises(TemplateError, match="output longer than 65536"):
        render("{{ .input.doc }}{{ .input.doc }}",
               template_context(input={"doc": "d" * 40_000}, nodes={}))


def test_a_read_value_is_a_copy() -> None:
    """As through Jinja: a handler given the rendered input may change it in place
    without changing the output it was read from, and a tuple comes back a list."""
    output = {"rows": [{"n": 1}], "pair": ("a", "b")}
    context = template_context(input={}, nodes={"extract": output})
    rows = render("{{ .nodes.extract.output.rows }}", context)
    assert rows == [{"n": 1}] and rows is not output["rows"]
    rows[0]["n"] = 2
    assert output["rows"] == [{"n": 1}]
    assert render("{{ .nodes.extract.output.pair }}", context) == ["a", "b"]
