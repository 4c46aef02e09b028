"""The template sandbox: leading dots, native values, guards, if/elif/else, node refs."""

from __future__ import annotations

import gc
import sys
import threading
import time
from types import FrameType
from typing import Any

import pytest

from axengine import template
from axengine.errors import TemplateError, TemplateLimitError, TemplateSecurityError
from axengine.template import (
    MAX_OUTPUT_CHARS,
    MISSING,
    compile_template,
    evaluate_expression,
    evaluate_guard,
    expression_labels,
    normalize,
    referenced_nodes,
    render,
    render_value,
    template_context,
)

ASSESS_RISK = """\
if .output.revenue_growth > 0.15 and .output.net_profit_margin < 0.12: high_risk
elif .output.debt_to_equity > 2.0: medium_risk
else: low_risk
"""


def ctx(output: Any = MISSING, **input_: Any) -> dict[str, Any]:
    return template_context(
        input=input_ or {"pdf_url": "s3://bucket/report.pdf", "x": 1},
        nodes={"parse_pdf": {"status": "success", "pages": [1, 2, 3]}, "b": "text"},
        task={"id": "t-1", "labels": {"lane": "gold"}},
        output=output,
    )


def line_of(exc: pytest.ExceptionInfo[TemplateError]) -> int:
    line = getattr(exc.value, "line", None)
    assert isinstance(line, int)
    return line


# ----------------------------------------------------------------------- normalize


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ .input.x }}", "{{ input.x }}"),
        ("{{.input.x}}", "{{input.x}}"),
        ("{{- .input.x -}}", "{{- input.x -}}"),
        ("if .output.a > 1: x", "if output.a > 1: x"),
        ("{{ .output.a > 1 and .output.b or not .c }}", "{{ output.a > 1 and output.b or not c }}"),
        ("{{ f(.a, [.b], {'k': .c}) }}", "{{ f(a, [b], {'k': c}) }}"),
        ("{{ .a if .b else .c }}", "{{ a if b else c }}"),
        ("{{ .a ~ .b + .c*.d }}", "{{ a ~ b + c*d }}"),
        ("{% if .input.x %}{{ .input.y }}{% endif %}", "{% if input.x %}{{ input.y }}{% endif %}"),
        ("{% for k in .input.items %}{% endfor %}", "{% for k in input.items %}{% endfor %}"),
        ("{% set y = .input.x %}", "{% set y = input.x %}"),
        # left alone: decimals, attribute access, strings, text, comments, raw blocks
        ("{{ 0.5 + .5 + 1e3 }}", "{{ 0.5 + .5 + 1e3 }}"),
        ("{{ a.b.c }}", "{{ a.b.c }}"),
        ("{{ f(x).y + a[0].b + 'x'.upper() }}", "{{ f(x).y + a[0].b + 'x'.upper() }}"),
        ("{{ a .b }}", "{{ a .b }}"),
        ("{{ '.input' ~ \".x\" ~ .input.x }}", "{{ '.input' ~ \".x\" ~ input.x }}"),
        ("{{ 'it\\'s .x' ~ .y }}", "{{ 'it\\'s .x' ~ y }}"),
        ("see .input and {{ .input.x }}", "see .input and {{ input.x }}"),
        ("{# .input #}{{ .x }}", "{# .input #}{{ x }}"),
        ("{% raw %}{{ .x }}{% endraw %}{{ .y }}", "{% raw %}{{ .x }}{% endraw %}{{ y }}"),
        ("{{ {'a': {'b': .x}} }} .z", "{{ {'a': {'b': x}} }} .z"),
        ("{{ '}}' ~ .x }}", "{{ '}}' ~ x }}"),
    ],
)
def test_normalize(source: str, expected: str) -> None:
    assert normalize(source) == expected


def test_normalize_keeps_line_numbers() -> None:
    source = "a\n{{ .input.x\n + .input.y }}\nif .output.z: q\n"
    assert normalize(source).count("\n") == source.count("\n")


def test_leading_dot_means_the_same_as_without() -> None:
    assert render("{{ .input.x }}", ctx()) == render("{{ input.x }}", ctx()) == 1


# ----------------------------------------------------------------------- rendering


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ nodes.parse_pdf.output }}", {"status": "success", "pages": [1, 2, 3]}),
        ("{{ nodes.parse_pdf.output.pages }}", [1, 2, 3]),
        ("{{ .input.x }}", 1),
        ("{{ .input.x / 4 }}", 0.25),
        ("{{ .input.x == 1 }}", True),
        ("{{ none }}", None),
        ("{{ .input.pdf_url }}", "s3://bucket/report.pdf"),
        ("  \n{{ (1, 2) }}\n  ", [1, 2]),
        ("{{ range(3) }}", [0, 1, 2]),
        ("{{ nodes.parse_pdf.output.pages|map('string') }}", ["1", "2", "3"]),
        ("{{ {'a': [1, {'b': none}]} }}", {"a": [1, {"b": None}]}),
    ],
)
def test_single_expression_renders_native_value(source: str, expected: Any) -> None:
    value = render(source, ctx())
    assert value == expected
    assert type(value) is type(expected)


def test_native_value_is_a_copy_of_the_context_data() -> None:
    names = ctx()
    value = render("{{ nodes.parse_pdf.output }}", names)
    value["pages"].append(4)
    assert names["nodes"]["parse_pdf"]["output"]["pages"] == [1, 2, 3]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("url={{ .input.pdf_url }}", "url=s3://bucket/report.pdf"),
        ("{{ .input.x }}{{ .input.x }}", "11"),
        ("{{ .input.x }} {{ task.id }}\n", "1 t-1\n"),
        (
            "{% for p in nodes.parse_pdf.output.pages %}{{ loop.index }}:{{ p }} {% endfor %}",
            "1:1 2:2 3:3 ",
        ),
        ("{% macro m(a) %}<{{ a|upper }}>{% endmacro %}{{ m('x') }}", "<X>"),
        ("{{ '%.2f' % 1.234 }}|{{ 2 ** 10 }}|{{ 'ab' * 2 }}", "1.23|1024|abab"),
        ("{{ 'a,b'.split(',')|join('+') }}|{{ input.get('x') }}", "a+b|1"),
        ("{% for k, v in task.labels.items() %}{{ k }}={{ v }}{% endfor %}", "lane=gold"),
        ("{{ nodes.parse_pdf.output|tojson }}", '{"pages": [1, 2, 3], "status": "success"}'),
        ("{{ [3, 1, 2]|sort|join(',') }}|{{ input.missing|default('d') }}", "1,2,3|d"),
        ("{% set s %}{{ task.id }}{% endset %}{{ s ~ '!' }}", "t-1!"),
    ],
)
def test_template_renders_text(source: str, expected: str) -> None:
    assert render(source, ctx()) == expected


def test_dot_access_prefers_the_field_over_the_dict_method() -> None:
    assert render("{{ output.items }}", ctx(output={"items": [1]})) == [1]


@pytest.mark.parametrize("value", [5, None, 1.5, ["{{ x }}"], "plain .input text {x}"])
def test_non_templates_are_returned_unchanged(value: Any) -> None:
    assert render(value, ctx()) is value


def test_output_is_bounded() -> None:
    assert len(render("{{ 'x' * 65532 }}text", ctx())) == MAX_OUTPUT_CHARS
    with pytest.raises(TemplateLimitError, match="output longer"):
        render("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}", ctx())


def test_render_value_renders_nested_structures() -> None:
    value = {
        "url": "{{ .input.pdf_url }}",
        "pages": "{{ nodes.parse_pdf.output.pages }}",
        "list": ["{{ task.id }}", 3, None, {"deep": "n={{ input.x + 1 }}"}],
        "{{ key }}": "kept",
    }
    assert render_value(value, ctx()) == {
        "url": "s3://bucket/report.pdf",
        "pages": [1, 2, 3],
        "list": ["t-1", 3, None, {"deep": "n=2"}],
        "{{ key }}": "kept",
    }


def test_render_value_reports_the_failing_template_line() -> None:
    with pytest.raises(TemplateError, match="no field 'nope'") as exc:
        render_value({"a": ["ok", "x\n{{ input.nope }}"]}, ctx())
    assert line_of(exc) == 2


def test_runtime_errors_carry_the_template_line() -> None:
    with pytest.raises(TemplateError, match="no field 'missing'") as exc:
        render("a\nb\n{{ input.missing }}", ctx())
    assert line_of(exc) == 3


def test_trace_hook_is_restored_after_render() -> None:
    events: list[str] = []

    def outer(frame: FrameType, event: str, arg: Any) -> None:
        events.append(event)

    previous = sys.gettrace()
    sys.settrace(outer)
    try:
        render("{{ input.x }}", ctx())
        with pytest.raises(TemplateLimitError):
            render(
                "{% for i in range(9999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}", {}
            )
        restored = sys.gettrace()
    finally:
        sys.settrace(previous)
    assert restored is outer


def test_compiled_templates_are_cached() -> None:
    source = "{{ input.x ~ 'cache-probe' }}"
    render(source, ctx())
    hits = template._compiler._compile.cache_info().hits
    render(source, ctx())
    evaluate_guard(source, ctx())
    assert template._compiler._compile.cache_info().hits >= hits + 2


# --------------------------------------------------------------------------- guards


@pytest.mark.parametrize(
    ("guard", "output", "expected"),
    [
        ("{{ .output.status == 'success' }}", {"status": "success"}, True),
        ("{{ .output.status == 'success' }}", {"status": "failed"}, False),
        ("{{ .output.n > 2 and .output.ok }}", {"n": 3, "ok": True}, True),
        ("{{ .output.items }}", {"items": []}, False),
        ("{{ .output.flag }}", {"flag": "false"}, False),
        ("{{ .output.flag }}", {"flag": "False"}, False),
        ("{{ .output.flag }}", {"flag": "0"}, False),
        ("{{ .output.flag }}", {"flag": ""}, False),
        ("{{ .output.flag }}", {"flag": "yes"}, True),
        ("{% if output.n > 1 %}true{% else %}false{% endif %}", {"n": 2}, True),
        ("{% if output.n > 1 %}true{% else %} false {% endif %}", {"n": 0}, False),
        ("output.status == 'success'", {"status": "success"}, True),
        (".output.missing is defined", {"status": "x"}, False),
    ],
)
def test_guard(guard: str, output: Any, expected: bool) -> None:
    assert evaluate_guard(guard, ctx(output=output)) is expected


def test_guard_on_missing_field_is_an_error_never_false() -> None:
    with pytest.raises(TemplateError, match="no field 'status'"):
        evaluate_guard("{{ .output.status == 'success' }}", ctx(output={"state": "ok"}))
    with pytest.raises(TemplateError, match="'output' is undefined"):
        evaluate_guard("{{ output.status == 'success' }}", ctx())


# ------------------------------------------------------------- if/elif/else form


@pytest.mark.parametrize(
    ("output", "label"),
    [
        ({"revenue_growth": 0.2, "net_profit_margin": 0.1, "debt_to_equity": 1}, "high_risk"),
        ({"revenue_growth": 0.05, "net_profit_margin": 0.2, "debt_to_equity": 2.5}, "medium_risk"),
        ({"revenue_growth": 0.05, "net_profit_margin": 0.2, "debt_to_equity": 1.0}, "low_risk"),
    ],
)
def test_seed_assess_risk_expression(output: dict[str, float], label: str) -> None:
    assert evaluate_expression(ASSESS_RISK, ctx(output=output)) == label


def test_expression_missing_field_names_it_and_its_line() -> None:
    with pytest.raises(TemplateError, match="no field 'debt_to_equity'") as exc:
        evaluate_expression(
            ASSESS_RISK, ctx(output={"revenue_growth": 0.0, "net_profit_margin": 0.0})
        )
    assert line_of(exc) == 2


def test_expression_quoted_labels_blank_lines_and_comments() -> None:
    source = "\n# pick a lane\nif output.n > 1: 'big one'\n\nelse: \"small: one\"\n"
    assert evaluate_expression(source, ctx(output={"n": 5})) == "big one"
    assert evaluate_expression(source, ctx(output={"n": 0})) == "small: one"
    assert expression_labels(source) == ("big one", "small: one")


def test_expression_single_template_form() -> None:
    source = "{{ 'high' if .output.n > 1 else 'low' }}"
    assert evaluate_expression(source, ctx(output={"n": 2})) == "high"
    assert expression_labels(source) is None
    with pytest.raises(TemplateError, match="not a label"):
        evaluate_expression("{{ output.n }}", ctx(output={"n": 2}))


def test_expression_labels() -> None:
    assert expression_labels(ASSESS_RISK) == ("high_risk", "medium_risk", "low_risk")
    assert expression_labels("if a: x\nelif b: y\nelif c: x\nelse: y") == ("x", "y")


@pytest.mark.parametrize(
    ("source", "line", "message"),
    [
        ("elif x: a\nelse: b", 1, "'elif' before 'if'"),
        ("else: b", 1, "'else' before 'if'"),
        ("if x: a\nelse: b\nelif y: c", 3, "nothing may follow"),
        ("if x: a\nelif y: b", 2, "missing final 'else:'"),
        ("if : a\nelse: b", 1, "empty condition"),
        ("if x: 1bad\nelse: b", 1, "bad label"),
        ("if x: a b\nelse: b", 1, "bad label"),
        ("if x a\nelse: b", 1, "missing ':'"),
        ("if x ==: a\nelse: b", 1, "bad condition"),
        ("\n\nif x: a\nelif y or: b\nelse: c", 4, "bad condition"),
        ("if x: a\nif y: b\nelse: c", 2, "use 'elif'"),
        ("if x: a\nelse y: b", 2, "'else' takes no condition"),
        ("if x: a\nsometimes: b\nelse: c", 2, "expected if/elif/else"),
        ("high_risk", 1, "not a condition expression"),
        ("x\n{{ output. }}", 2, "expected name"),
    ],
)
def test_malformed_expression(source: str, line: int, message: str) -> None:
    with pytest.raises(TemplateError, match=message) as exc:
        expression_labels(source)
    assert line_of(exc) == line
    with pytest.raises(TemplateError, match=message):
        evaluate_expression(source, ctx(output={}))


# ------------------------------------------------------------------ compile errors


@pytest.mark.parametrize(
    ("source", "line", "error"),
    [
        ("line one\n{{ x + }}", 2, TemplateError),
        ("a\n\n{% endfor %}", 3, TemplateError),
        ("a\n{{ x|pprint }}", 2, TemplateError),
        ("a\nb\n{% include 'x' %}", 3, TemplateSecurityError),
        ("{% autoescape true %}{% endautoescape %}", 1, TemplateSecurityError),
    ],
)
def test_compile_errors_carry_lines(source: str, line: int, error: type[TemplateError]) -> None:
    with pytest.raises(error) as exc:
        compile_template(source)
    assert line_of(exc) == line


def test_compile_accepts_valid_templates_and_plain_text() -> None:
    compile_template("{{ .input.x }} {% if .output.a %}y{% endif %}")
    compile_template("no template here: {x} .input")
    assert render("{{ .input.x }}", ctx()) == 1


# -------------------------------------------------------------------- node refs


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ nodes.parse_pdf.output }}", {"parse_pdf"}),
        ("{{ nodes['a'].output ~ nodes[\"b\"].output.x }}", {"a", "b"}),
        ("{% for p in nodes.a.output.pages %}{{ nodes.b.output[p] }}{% endfor %}", {"a", "b"}),
        ("{{ input.nodes.x }} {{ output }}", set()),
        ("plain text nodes.a", set()),
        ("if nodes.a.output.n > 1: x\nelif .nodes.b.output: y\nelse: z", {"a", "b"}),
    ],
)
def test_referenced_nodes_static(source: str, expected: set[str]) -> None:
    assert referenced_nodes(source) == frozenset(expected)


@pytest.mark.parametrize(
    "source",
    [
        "{{ nodes[input.which].output }}",
        "{{ nodes|list }}",
        "{% for n in nodes %}{{ n }}{% endfor %}",
        "{{ nodes }}",
        "{{ nodes[0] }}",
        "{% set nodes = input %}{{ nodes.a }}",
        "{{ nodes.a.output }}{{ nodes.get('b') }}",
        "{% for k, v in nodes.items() %}{{ v }}{% endfor %}",
        "if nodes[x]: a\nelse: b",
    ],
)
def test_referenced_nodes_dynamic(source: str) -> None:
    assert referenced_nodes(source) is None


# ------------------------------------------------------------------------ context


def test_template_context_shape() -> None:
    names = template_context(input={"a": 1}, nodes={"n2": 2, "n1": {"x": 1}})
    assert names == {
        "input": {"a": 1},
        "nodes": {"n1": {"output": {"x": 1}}, "n2": {"output": 2}},
        "task": {},
    }
    assert "output" not in names
    with_output = template_context(input=None, nodes={}, task={"id": "t"}, output=None)
    assert with_output["output"] is None
    assert with_output["task"] == {"id": "t"}
    assert repr(MISSING) == "MISSING"


def test_time_bound_holds_on_another_thread() -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            render(
                "{% for i in range(9999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}", {}
            )
        except TemplateLimitError as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(errors) == 1


def test_the_render_clock_leaves_out_garbage_collection() -> None:
    """A collection that runs on the rendering thread (with the finalizers it calls) is
    not the render's CPU time; the render's own time still is."""
    from axengine.template import _budget

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    class SlowToFinalize:
        def __del__(self) -> None:
            burn(_budget.MAX_RENDER_SECONDS + 0.05)

    session = _budget._Session()
    garbage = SlowToFinalize()
    garbage.cycle = garbage  # type: ignore[attr-defined]  # only a collection frees it
    del garbage
    gc.collect()
    session.check_clock()  # the collection's 0.3 s are not counted
    burn(_budget.MAX_RENDER_SECONDS + 0.05)
    with pytest.raises(_budget._Interrupted):
        session.check_clock()
