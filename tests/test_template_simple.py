"""The fast path of the static check (``axengine.template._simple``) reads exactly as Jinja.

For every source the fast path accepts, Jinja parses and compiles it in the sandbox
without error and the walk of its tree gives the same analysis (problems in the same
order, names with their lines, node references) as the fast path; everything else must
be refused (None), so that it takes the full path. Sources are generated from a grammar
wider than the simple forms: near misses (spaces inside paths, operator words as names,
unknown filters, arguments naming an attribute, whitespace control, ``{% %}``, deep
chains, non-ASCII names...) sit next to the forms the fast path must accept.
"""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from axengine.errors import TemplateError
from axengine.template import _simple, _static
from axengine.template._budget import _MAX_SOURCE_CHARS
from axengine.template._compiler import _compile_condition, _compiled
from axengine.template._simple import condition_reads, template_reads

SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Each choice below takes a form the fast path must accept, or now and then a near miss
# (so that most generated sources are simple forms and each near miss is met alone).
NAMES = ["input", "nodes", "task", "output", "node", "x", "n1", "items", "get", "pdf_url",
         "_x", "__class__", "_ax_result", "a_b", "True_", "nodes_"]
BAD_NAMES = ["range", "loop", "caller", "self", "and", "not", "if", "for", "in", "true",
             "None", "é", "xé", "1a"]
KEYS = ["'a'", '"b"', "'_c'", '"__d"', "''", "'a.b'", "'x._y'", "0", "12", "'a b'"]
BAD_KEYS = ["00", "'a\\'b'", "'}}'", " 0 ", "-1", "'é'", "x", "1:2", "'a'|lower"]
LITERALS = ["'x'", '"y z"', "''", "'a.b'", "1", "0", "1.5", "10.25", "true", "false",
            "none", "True", "None", "'é'"]
BAD_LITERALS = ["'it''s'", "'a}}b'", "'{{'", "'\\n'", "01", "1e3", ".5", "1_000", "1.",
                "[1]", "(1)", "-1"]
FILTERS = ["|lower", "| upper", "|join(', ')", "|default(1)", "|default('', true)",
           "|round(2)", "|length()", "| e", "|tojson(2)", "|d (1)", "|sum", "|select",
           "|sort(true, false)", "|truncate(10, true, '...')", "|map"]
BAD_FILTERS = ["|join(', ', 'a')", "|join(', ', '_a')", "|map('upper')",
               "|map(attribute='x')", "|nosuch", "|pprint", "|attr('x')", "|attr('_x')",
               "|select('odd')", "|sort(true, false, 'x')", "|first.x", "|lower(x)",
               "|default(1,)", "|default(x=1)", "|lower()()"]
OPERATORS = ["==", "!=", "<", ">", "<=", ">=", "+", "*", "**", "//", "/", "%", "~",
             "and", "or", "and not", "or not not"]
BAD_OPERATORS = ["-", "in", "is", "=", "not", "<>", "|", "if", "and and", "!", "==="]
PARTS = [f".{name}" for name in NAMES] + [f"[{key}]" for key in KEYS]
BAD_PARTS = [f".{name}" for name in BAD_NAMES] + [f"[{key}]" for key in BAD_KEYS] + [
    ". x", ".0", "()", ".get('a')", "[x]"]
BLANKS = [" ", " ", "\n", "\t", " \n "]
SPACES = ["", *BLANKS]
TEXTS = ["", "x", " + 1", "\n", "a\nb", "}", "}}", "é", "{x}"]
BAD_TEXTS = ["{%", "{#", "\r\n", "{% raw %}", "{{", "\r", "{"]


class Picker:
    """Draws each choice from the good forms, or with ``misses`` now and then a near miss."""

    def __init__(self, draw: st.DrawFn, misses: bool) -> None:
        self.draw, self.misses = draw, misses

    def __call__(self, good: list[str], bad: list[str]) -> str:
        miss = self.misses and self.draw(st.integers(0, 20)) == 0
        return self.draw(st.sampled_from(bad if miss else good))

    def count(self, most: int) -> int:
        return self.draw(st.integers(min_value=0, max_value=most))


def _path(pick: Picker) -> str:
    parts = "".join(pick(PARTS, BAD_PARTS) for _ in range(pick.count(4)))
    return pick(["", "."], [". "]) + pick(NAMES, BAD_NAMES) + parts


def _operand(pick: Picker) -> str:
    base = _path(pick) if pick.count(1) else pick(LITERALS, BAD_LITERALS)
    filters = [pick(FILTERS, BAD_FILTERS) for _ in range(pick.count(2))]
    return pick(["", " "], ["  |"]).join([base, *filters])


def _or_expression(pick: Picker) -> str:
    """``[not] operand (operator [not] operand)*`` with random spacing (including none)."""
    out = pick(SPACES, [""]) + pick(["", "", "not ", "not not "], ["not", "-"])
    out += _operand(pick)
    for _ in range(pick.count(3)):
        operator = pick(OPERATORS, BAD_OPERATORS)
        spaces = BLANKS if operator[0].isalpha() else SPACES  # `a and b`, never `a andb`
        out += pick(spaces, [""]) + operator + pick(spaces, [""]) + _operand(pick)
    return out + pick(SPACES, [""])


def _expression(pick: Picker) -> str:
    """An or-expression, or ``a if b``, ``a if b else c`` (and near misses of those)."""
    shape = pick(["", "", "", "if", "if else"], ["if if", "else", "if else if", "if else"])
    out = _or_expression(pick)
    for word in shape.split():
        # The words need blanks around them; the near misses sometimes go without.
        around = pick([" "], ["", " "])
        out += around + word + around + _or_expression(pick)
    return out


@st.composite
def expressions(draw: st.DrawFn, misses: bool = True) -> str:
    return _expression(Picker(draw, misses))


@st.composite
def templates(draw: st.DrawFn, misses: bool = True) -> str:
    pick = Picker(draw, misses)
    out = pick(TEXTS, BAD_TEXTS)
    for _ in range(1 + pick.count(2)):
        opener = pick(["{{"], ["{{-", "{{+", "{%", "{"])
        closer = pick(["}}"], ["-}}", "%}", "}", ""])
        out += opener + _expression(pick) + closer + pick(TEXTS, BAD_TEXTS)
    return out


def _full_template(source: str) -> _static._Analysis | None:
    """The analysis of the full path (Jinja's tree), or None when compiling fails."""
    try:
        return _static._analyse(_compiled(source))
    except (TemplateError, SyntaxError, RecursionError):
        return None


def _full_condition(code: str) -> _static._Analysis | None:
    try:
        return _static._analyse(_compile_condition(code, 0))
    except (TemplateError, SyntaxError, RecursionError):
        return None


@SETTINGS
@given(templates())
@example("{{ .nodes.n1.output.x }} + 1")
@example("{{ a._b['_c'].d[0] }}\n{{ nodes['_x'] }} {{ a._b }}")
@example("{{ not.x }}")  # normalize() makes it `notx`
@example("{{ a.if.b }}")  # normalize() makes it `a.ifb`
@example("{{ 'x' and.y }}")
def test_simple_templates_read_as_jinja_reads_them(source: str) -> None:
    reads = template_reads(source)
    if reads is None:
        return
    full = _full_template(source)
    assert full is not None, f"the fast path accepted {source!r}, which does not compile"
    assert _static._reads_analysis(reads) == full, source


@SETTINGS
@given(expressions())
@example("output.ok")
@example(".output.a > 0.15 and not .output.b")
@example("output.x\n== 1")
def test_simple_conditions_read_as_jinja_reads_them(code: str) -> None:
    reads = condition_reads(code)
    if reads is None:
        return
    full = _full_condition(code)
    assert full is not None, f"the fast path accepted {code!r}, which does not compile"
    assert _static._reads_analysis(reads) == full, code


@SETTINGS
@given(templates(misses=False), expressions(misses=False))
def test_the_simple_forms_take_the_fast_path(source: str, code: str) -> None:
    # Long generated expressions pass the bound on tokens, which is tested apart.
    with mock.patch.object(_simple, "_MAX_TOKENS", 10**6):
        assert template_reads(source) is not None, source
        assert condition_reads(code) is not None, code


@pytest.mark.parametrize("source", [
    "{{ .input.pdf_url }}",
    "report {{ .input.doc }} for {{ task.id }}",
    "{{ .nodes.parse_pdf.output.text|truncate(4000) }}",
    "{{ .output.status == 'success' }}",
    "{{ .output.score >= 0.8 and not .output.flagged }}",
    "{{ input.tags|join(', ')|upper }}",
    "{{ input['a-b'][0].c }} {{ nodes[\"x\"].output }}",
    "line one\n{{ input.a }}\n{{ input.__class__ }}",
    "{{ input.a ~ '-' ~ input.b }}",
    "{{ 'person' if .nodes.review.output else 'model' }}",
    "{{ nodes }}",
])
def test_common_forms_take_the_fast_path(source: str) -> None:
    reads = template_reads(source)

    assert reads is not None
    assert _static._reads_analysis(reads) == _full_template(source)


@pytest.mark.parametrize("source", [
    "{% if input.a %}x{% endif %}",  # a tag
    "{# note #}{{ input.a }}",  # a comment
    "{{- input.a }}",  # whitespace control
    "{{ input.a -}}",
    "{{ input. a }}",  # a space inside a path
    "{{ input.a() }}",  # a call
    "{{ range }}",  # names the full walk treats apart
    "{{ loop.index }}",
    "{{ input|map('upper') }}",  # filters whose arguments name a filter, test, attribute
    "{{ input|attr('x') }}",
    "{{ input|join(', ', 'name') }}",
    "{{ input|select('odd') }}",
    "{{ input|nosuch }}",  # unknown filter: the compiler's error
    "{{ input|pprint }}",
    "{{ input.a if input.b else 1 if input.c }}",  # operators outside the simple forms
    "{{ input.a in input.b }}",
    "{{ input.a is defined }}",
    "{{ -input.a }}",
    "{{ [input.a] }}",
    "{{ 'a\\'b' }}",  # a backslash in a string
    "{{ 01 }}",
    "{{ input.é }}",  # a name Jinja reads further than ASCII
    "a\r\n{{ input.a }}",  # a carriage return: Jinja's own line count
    "{{ input.a }",  # never closed
    "{{ input.a }} {{",
    "{{ " + ".".join(["input"] + ["a"] * 60) + " }}",  # nested deeper than the bound
    "{{ " + " + ".join(["input.a"] * 30) + " }}",
])
def test_near_misses_take_the_full_path(source: str) -> None:
    assert template_reads(source) is None


def test_long_sources_take_the_full_path() -> None:
    source = "{{ input.a }}" + "x" * _MAX_SOURCE_CHARS

    assert template_reads(source) is None
    assert condition_reads("input.a" + " " * _MAX_SOURCE_CHARS) is None
