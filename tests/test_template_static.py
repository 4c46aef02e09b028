"""The static template check: hostile templates are refused by ``ax validate``, not at run.

Three parts:

* :func:`check_template` on its own: what it lets through (everything the example DAGs
  and the docs use) and what it refuses, with codes and lines.
* Every payload of ``tests/test_template_escapes.py`` (and the list of the security
  review, finding 10) in a node's ``input``, an ``llm_call`` ``prompt``, an edge guard
  and a condition ``expression`` (both forms): the loader refuses it with file:line,
  node and field, or the payload is listed in :data:`RUNTIME_ONLY` with the reason.
* Errors name the template that failed, at validation and when a node runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import axengine as ax
from axengine import template
from axengine.dag import load_dag_text
from axengine.errors import DagError, DagProblem, TemplateError, TemplateLimitError
from axengine.template import check_template, referenced_nodes
from tests.test_template_escapes import PAYLOADS

TOOLS = frozenset({"echo"})
MODELS = frozenset({"sim-small"})

# ------------------------------------------------------------------ check_template


@pytest.mark.parametrize("source", [
    "{{ .input.pdf_url }}",
    "{{ .nodes.parse_pdf.output.text|truncate(4000) }}",
    "{{ input.items }}",  # the field `items` when the input has one: only data can tell
    "{{ input.items() }}{{ task.labels.get('team', 'none') }}{{ input.keys()|list }}",
    "{% for p in nodes.parse.output.pages %}{{ loop.index }}: {{ p.text|upper }}"
    "{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for x in [1] recursive %}{{ loop([]) }}{% endfor %}",
    "{% set total = input.rows|map(attribute='n')|sum %}{{ total }}",
    "{% with name = input.name %}{{ name.strip().title() }}{% endwith %}",
    "{% macro row(k, v) %}{{ k }}={{ v }}{{ varargs }}{% endmacro %}{{ row('a', 1) }}",
    "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}x{% endcall %}",
    "{{ range(3)|list }}{{ [1, 2, 3]|select('odd')|list }}{{ input|dictsort }}",
    "{{ '%s km'|format(input.n) }}{{ 'a,b'.split(',') }}{{ (1, 2).count(1) }}",
    "{{ {'a': 1}.a }}{{ input is defined }}{{ input|attr('name') }}",
    "{{ input.rows|sort(attribute='n.v')|groupby('k')|list }}",
    "{% filter upper %}text{% endfilter %}{# {{ input.__class__ }} in a comment #}",
    "plain text, no template: {x} .input.__class__",
])
def test_safe_templates_pass(source: str) -> None:
    assert check_template(source) == ()


@pytest.mark.parametrize(("source", "code", "message"), [
    ("{{ input.__class__ }}", "unsafe-template", "reads .__class__"),
    ("{{ input['__class__'] }}", "unsafe-template", "reads ['__class__']"),
    ("{{ input['_private'] }}", "unsafe-template", "reads ['_private']"),
    ("{{ input|attr('__dict__') }}", "unsafe-template", "|attr reads the attribute '__dict__'"),
    ("{{ [input]|map(attribute='a.__class__')|list }}", "unsafe-template", "'a.__class__'"),
    ("{{ [input]|map('attr', '__class__')|list }}", "unsafe-template", "|map reads"),
    ("{{ [input]|selectattr('_x')|list }}", "unsafe-template", "|selectattr reads"),
    ("{{ input.x.format(1) }}", "unsafe-template", "calls .format()"),
    ("{{ 'x'.mro() }}", "unsafe-template", "calls .mro()"),
    ("{{ input.x.append(1) }}", "unsafe-template", "calls .append()"),
    ("{{ input.get('f')(1) }}", "unsafe-template", "calls the result of an expression"),
    ("{% set f = input.f %}{{ f() }}", "unsafe-template", "calls 'f', which is not a macro"),
    ("{{ input() }}", "unsafe-template", "calls 'input', which is not a macro"),
    ("{{ ''.join }}", "unsafe-template", ".join of a str is a method"),
    ("{{ 'x'.center }}", "unsafe-template", "reads .center of a str"),
    ("{{ range }}", "unsafe-template", "`range` is a function"),
    ("{{ cycler }}", "unknown-name", "'cycler' is not defined"),
    ("{{ self }}", "unknown-name", "'self' is not defined"),
    ("{{ inputs.x }}", "unknown-name", "'inputs' is not defined"),
    ("{{ output.ok }}", "unknown-name", "'output' exists only in guards"),
    ("{% if input.x %}{{ input|pprint }}{% endif %}", "unknown-name", "no filter named 'pprint'"),
    ("{% if input.x %}{{ input is nothing }}{% endif %}", "unknown-name", "no test named"),
    ("{{ [1]|select('nothing')|list }}", "unknown-name", "no test named 'nothing'"),
])
def test_refused_templates(source: str, code: str, message: str) -> None:
    found = check_template(source)

    assert any(p.code == code and message in p.message and p.hint for p in found), found


def test_output_exists_only_in_guards_and_expressions() -> None:
    assert check_template("{{ output.ok }}", kind="guard") == ()
    assert check_template("output.ok and input.go", kind="guard") == ()
    assert check_template("{{ output.kind }}", kind="expression") == ()
    assert check_template("if output.a > 1: high\nelse: low", kind="expression") == ()
    assert [p.code for p in check_template("{{ output }}")] == ["unknown-name"]


def test_lines_are_lines_of_the_template() -> None:
    source = "one {{ input.a }}\ntwo\nthree {{ input.__class__ }}"
    expression = "if output.a: x\n\nelif output.b.__class__: y\nelse: z"

    assert [p.line for p in check_template(source)] == [3]
    assert [p.line for p in check_template(expression, kind="expression")] == [3]
    assert [p.line for p in check_template("output.__class__", kind="guard")] == [1]


def test_tags_the_sandbox_refuses_raise_as_when_compiling() -> None:
    for source in ("{% import 'os' as os %}", "{% include 'x' %}", "{% extends 'x' %}"):
        with pytest.raises(TemplateError, match="not allowed"):
            check_template(source)


def test_the_check_walks_the_tree_already_compiled() -> None:
    source = "{{ input.static_check_cache_probe }}"
    template.compile_template(source)
    misses = template._compiler._compile.cache_info().misses

    check_template(source)
    referenced_nodes(source)

    assert template._compiler._compile.cache_info().misses == misses


# ------------------------------------------------------------------ payloads in DAGs

#: The payloads of the security review (finding 10), beyond those of the escape tests.
REVIEW_PAYLOADS: list[tuple[str, str]] = [
    ("review-mro", "{{ ''.__class__.__mro__ }}"),
    ("review-attr", "{{ input|attr('__class__') }}"),
    ("review-cycler", "{{ cycler.__init__.__globals__ }}"),
    ("review-lipsum", "{{ lipsum }}"),
    ("review-range-self", "{{ range.__self__ }}"),
    ("review-config", "{{ config }}"),
    ("review-self", "{{ self }}"),
    ("review-request", "{{ request }}"),
    ("review-namespace", "{{ namespace }}"),
    ("review-joiner", "{{ joiner }}"),
    ("review-format", "{{ ''.format }}"),
    ("review-import", "{% import 'os' as os %}"),
    ("review-dict", "{{ input.__dict__ }}"),
    ("review-underscore-item", "{{ input['_x'] }}"),
    ("review-dq-item", '{{ input["__class__"] }}'),
    ("review-mro-call", "{{ ''.__class__.mro() }}"),
    ("review-nested-item", "{{ input.x['__globals__'] }}"),
    ("review-sort-attribute", "{{ [input]|sort(attribute='__class__') }}"),
    ("review-groupby", "{{ [input]|groupby('__class__')|list }}"),
    ("review-set-escape", "{% set c = input.__class__ %}{{ c }}"),
    ("review-with-escape", "{% with x = input %}{{ x.__class__ }}{% endwith %}"),
    ("review-caller-globals", "{% macro m() %}{{ caller.__globals__ }}{% endmacro %}"),
    ("review-loop-var-call", "{% for f in input.fns %}{{ f() }}{% endfor %}"),
    ("review-format-map", "{{ 'x'.format_map(input) }}"),
    ("review-os", "{{ os.system('id') }}"),
    ("review-super", "{% block b %}{{ super() }}{% endblock %}"),
    ("review-namespace-set", "{% set ns = namespace() %}{% set ns.x = 1 %}{{ ns.x }}"),
    ("review-random", "{{ [1, 2]|random }}"),
    ("review-pprint-soft", "{% if input %}{{ input|pprint }}{% endif %}"),
]

ALL_PAYLOADS = [(name, source) for name, source, _ in PAYLOADS] + REVIEW_PAYLOADS

#: Limit payloads refused at validation: they do not compile within the nesting bounds
#: (or hold an integer literal Python will not read).
NESTED_TOO_DEEPLY = {"deep-nesting", "filter-chain", "operator-chain", "attribute-chain",
                     "nested-loops", "huge-int-literal", "huge-int-index"}

#: Payloads ``ax validate`` lets through, and why. The sandbox refuses every one of them
#: when the node runs (``tests/test_template_escapes.py`` asserts that for each).
RUNTIME_ONLY: dict[str, str] = {
    # Dot access on a mapping reads the field first: `input.items` is data when the input
    # has a field `items`, the dict method otherwise. Only the data can tell.
    "bound-method-print": "field or method depends on the data",
    # Resource exhaustion through allowed names only (range(), *, **, %, filters,
    # macros, loops): whether `'a' * n` is too big depends on values, which is the
    # runtime budget's job (size checks before each step, CPU clock, output bound).
    **{name: "runtime budget (TemplateLimitError)" for name, _, expected in PAYLOADS
       if expected is TemplateLimitError and name not in NESTED_TOO_DEEPLY},
}

SITE_LINE = {"input": 6, "prompt": 6, "guard": 7, "expression": 6, "expression-if": 8}


def hostile_dag(site: str, payload: str) -> tuple[str, str, str]:
    """YAML text of a DAG with ``payload`` at ``site``, and the node and field holding it."""
    quoted = json.dumps(payload)  # a JSON string is a YAML double-quoted scalar
    head = "name: hostile\nnodes:\n"
    if site == "input":
        return head + f"  fetch:\n    type: tool_call\n    tool: echo\n    input: {quoted}\n", \
            "fetch", "input"
    if site == "prompt":
        return head + f"  ask:\n    type: llm_call\n    model: sim-small\n    prompt: {quoted}\n", \
            "ask", "prompt"
    if site == "guard":
        return head + (
            "  fetch:\n    type: tool_call\n    tool: echo\n    next:\n"
            f"      - condition: {quoted}\n        target: done\n"
            "  done: {type: tool_call, tool: echo}\n"
        ), "fetch", "next[0].condition"
    fetch = "  fetch: {type: tool_call, tool: echo, next: route}\n"
    if site == "expression":
        return head + fetch + f"  route:\n    type: condition\n    expression: {quoted}\n", \
            "route", "expression"
    expr = _single_expression(payload)
    assert expr is not None
    return head + fetch + (
        "  route:\n    type: condition\n    expression: |\n"
        "      if output.ok: fine\n"
        f"      elif {expr}: hostile\n"
        "      else: other\n"
    ), "route", "expression"


def _single_expression(payload: str) -> str | None:
    """The expression of a payload that is one ``{{ expr }}`` on one line, else None."""
    match = re.fullmatch(r"\{\{(.*)\}\}", payload.strip())
    if match is None or "{{" in match.group(1) or "{%" in match.group(1) or "\n" in payload:
        return None
    return match.group(1).strip()


def problems_of(text: str) -> list[DagProblem]:
    try:
        load_dag_text(text, file="hostile.yaml", tools=TOOLS, models=MODELS)
    except DagError as exc:
        return exc.problems
    return []


CASES = [
    pytest.param(site, name, source, id=f"{site}-{name}")
    for name, source in ALL_PAYLOADS
    for site in ("input", "prompt", "guard", "expression", "expression-if")
    if site != "expression-if" or _single_expression(source) is not None
]
REFUSED_CODES = {"unsafe-template", "unknown-name", "template-syntax"}
NAMED = {"input": "input template", "prompt": "prompt template",
         "guard": "guard next[0].condition", "expression": "expression",
         "expression-if": "expression"}


@pytest.mark.parametrize(("site", "name", "payload"), CASES)
def test_loader_refuses_the_payload_with_file_and_line(site: str, name: str,
                                                       payload: str) -> None:
    text, node, field = hostile_dag(site, payload.replace("{canary}", "/tmp/ax-canary"))

    problems = problems_of(text)

    if name in RUNTIME_ONLY:
        assert problems == [], f"{name} is refused now: remove it from RUNTIME_ONLY"
        return
    line = SITE_LINE[site]
    assert any(
        (p.file, p.line, p.node, p.field) == ("hostile.yaml", line, node, field)
        and p.code in REFUSED_CODES and p.message.startswith(NAMED[site])
        for p in problems
    ), [p.format() for p in problems]


def test_runtime_only_payloads_are_the_ones_the_sandbox_catches() -> None:
    expected = {name: cls for name, _, cls in PAYLOADS}

    assert set(RUNTIME_ONLY) <= set(expected)
    # The list is short and every entry is caught by the second wall at run time.
    security = [n for n in RUNTIME_ONLY if expected[n] is not TemplateLimitError]
    assert security == ["bound-method-print"]
    # 21 of the 22 payloads the review found passing `ax validate` now fail it, and all
    # of the review's own list.
    assert not set(RUNTIME_ONLY) & {name for name, _ in REVIEW_PAYLOADS}


# ------------------------------------------------------------------ which template failed


def test_validation_names_the_template_that_failed() -> None:
    text = """name: named
nodes:
  fetch:
    type: tool_call
    tool: echo
    input: {to: "{{ input.__class__ }}"}
    next:
      - condition: "{{ output.ok ) }}"
        target: route
  route:
    type: condition
    expression: "{{ output.__class__ }}"
    next: [ask, gate]
  ask: {type: llm_call, model: sim-small, prompt: "{{ lipsum }}"}
  gate: {type: human_gateway, description: "{{ input.mro() }}"}
"""
    found = {(p.field, p.message.split(":")[0]) for p in problems_of(text)}

    assert found >= {
        ("input.to", "input template (input.to)"),
        ("next[0].condition", "guard next[0].condition does not compile"),
        ("expression", "expression"),
        ("prompt", "prompt template"),
        ("description", "description template"),
    }, found


def test_runtime_errors_name_the_template_that_failed(tmp_path: Path) -> None:
    # Each node passes the static check and fails on data: a field the input lacks.
    dag: dict[str, Any] = {"name": "named_errors", "nodes": {
        "bad_input": {"type": "tool_call", "tool": "echo", "input": "{{ input.nope }}"},
        "bad_prompt": {"type": "llm_call", "model": "sim-small",
                       "prompt": "Hello {{ input.nope }}"},
        "bad_description": {"type": "human_gateway",
                            "description": "Approve {{ input.nope }}?"},
        "bad_expression": {"type": "condition",
                           "expression": "if input.nope: a\nelse: b"},
        "bad_condition_input": {"type": "condition", "input": "{{ input.nope }}",
                                "expression": "{{ output }}"},
        "bad_guard": {"type": "tool_call", "tool": "echo", "input": {"ok": True},
                      "next": [{"condition": "{{ output.nope }}", "target": "after"}]},
        "after": {"type": "tool_call", "tool": "echo"},
    }}

    result = ax.run(dag, {"present": 1}, home=tmp_path)

    errors = dict(result.errors)
    assert errors["bad_input"].startswith("input template: "), errors
    assert errors["bad_prompt"].startswith("prompt template: "), errors
    assert errors["bad_description"].startswith("description template: "), errors
    assert errors["bad_expression"].startswith("expression: "), errors
    assert errors["bad_condition_input"].startswith("input template: "), errors
    assert errors["bad_guard"].startswith("guard on bad_guard: "), errors
    assert all("'nope'" in message for message in errors.values()), errors
