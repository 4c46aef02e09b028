"""The DAG language's sharp edges (issue 11, item 6), each pinned.

* ``input`` means the task input in every template; a prompt (and a gate's description)
  reads the node's own rendered input as ``node.input``. The old form — a prompt reading
  ``input`` on a node that declares ``input:`` — is refused (``ambiguous-input``), and a
  DAG stored before the change keeps its meaning when it runs.
* ``output`` outside guards and condition expressions is refused by ``ax validate``, and
  the run-time message (for DAGs stored earlier) no longer says it is available.
* ``input_schema:`` must be a usable JSON Schema and is part of the DAG hash when set.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from axengine import template
from axengine.dag import Dag, check_task_input, load_dag, load_dag_mapping, load_dag_text
from axengine.errors import DagError, InputError, TemplateError
from axengine.records import NodeState
from executors.contract import Success
from tests.engine.rules_kit import MODELS, T0, TOOLS, World

DAGS = Path(__file__).resolve().parents[2] / "dags"
KNOWN: dict[str, Any] = {"tools": TOOLS, "models": MODELS}


def problems(text: str) -> list[tuple[int, str, str]]:
    try:
        load_dag_text(textwrap.dedent(text), **KNOWN)
    except DagError as exc:
        return [(p.line, p.code or "", p.format()) for p in exc.problems]
    return []


# --------------------------------------------------------------- one meaning for `input`

PROMPT_DAG = """\
name: prompts
nodes:
  ask:
    type: llm_call
    model: sim
    input: {name: "{{ .input.user }}", team: "{{ .input.team }}"}
    prompt: "{{ .node.input.name }} of {{ .node.input.team }} ({{ node.id }})"
    next: gate
  gate:
    type: human_gateway
    input: {asked: "{{ .nodes.ask.output.text }}"}
    description: "{{ .input.team }}: {{ .node.input.asked }}"
"""


def test_input_is_the_task_input_and_node_input_the_nodes_own() -> None:
    world = World.submit(load_dag_text(PROMPT_DAG, **KNOWN), {"user": "ann", "team": "ops"})

    assert world.snaps["ask"].input == {"input": {"name": "ann", "team": "ops"},
                                        "prompt": "ann of ops (ask)"}


def test_a_gate_description_reads_the_task_input_and_its_own_input() -> None:
    world = World.submit(load_dag_text(PROMPT_DAG, **KNOWN), {"user": "ann", "team": "ops"})
    world.claim("ask", now=T0 + 1)
    world.complete("ask", Success({"text": "hi"}), now=T0 + 2)

    gate = world.snaps["gate"]
    assert gate.state is NodeState.PAUSED
    assert gate.input == {"input": {"asked": "hi"}, "description": "ops: hi"}


def test_a_prompt_without_node_input_reads_the_task_input() -> None:
    world = World.submit(load_dag_text("""\
name: plain
nodes:
  ask: {type: llm_call, model: sim, prompt: "topic {{ .input.topic }}"}
""", **KNOWN), {"topic": "rain"})

    assert world.snaps["ask"].input == {"input": None, "prompt": "topic rain"}


def test_the_old_form_is_refused_with_the_rewrite_to_make() -> None:
    found = problems("""\
        name: seed
        nodes:
          hello:
            type: llm_call
            model: sim
            prompt: "Say hello to user {{ .input.name }}"
            input: {name: Alice}
        """)

    assert [(line, code) for line, code, _ in found] == [(6, "ambiguous-input")]
    message = found[0][2]
    assert "in a prompt `input` is the task input" in message
    assert "{{ .node.input.name }}" in message


def test_input_in_a_prompt_is_fine_when_the_node_declares_no_input() -> None:
    assert problems("""\
        name: ok
        nodes:
          hello: {type: llm_call, model: sim, prompt: "hi {{ input.name }}"}
        """) == []


def test_a_name_the_prompt_sets_itself_is_not_the_input() -> None:
    assert problems("""\
        name: ok
        nodes:
          hello:
            type: llm_call
            model: sim
            input: {name: Alice}
            prompt: "{% set who = node.input.name %}hi {{ who }}"
        """) == []


def test_node_is_refused_outside_prompts_and_descriptions() -> None:
    found = problems("""\
        name: bad
        nodes:
          a: {type: tool_call, tool: echo, input: "{{ node.input }}", next: b}
          b:
            type: tool_call
            tool: echo
            next:
              - {target: c, condition: "{{ node.input }}"}
          c: {type: tool_call, tool: echo}
        """)

    assert [(line, code) for line, code, _ in found] == [(3, "unknown-name"),
                                                         (8, "unknown-name")]
    assert "exists only in a prompt and a gate's description" in found[0][2]


def test_a_dag_stored_with_the_old_form_keeps_its_meaning() -> None:
    # Stored before `ambiguous-input` existed: rebuilt from the store, not re-validated.
    stored = Dag.from_canonical({"name": "seed", "nodes": {"hello": {
        "type": "llm_call", "model": "sim", "input": {"name": "Alice"},
        "prompt": "Say hello to user {{ .input.name }}", "timeout": 120.0, "retry": 2,
        "lane": "default", "next": []}}})

    world = World.submit(stored, {"name": "Mallory"})

    assert world.snaps["hello"].input["prompt"] == "Say hello to user Alice"


@pytest.mark.parametrize("path", sorted(DAGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_example_dags_have_no_prompt_that_reads_input_next_to_an_input(
        path: Path) -> None:
    dag = load_dag(path)  # valid: so no `ambiguous-input`

    for node in dag.nodes.values():
        if node.prompt is not None and node.input is not None:
            assert "input" not in template.names_read(node.prompt), node.id


# --------------------------------------------------------------- `output` in a node input


def test_output_in_a_node_input_is_refused_at_its_line() -> None:
    found = problems("""\
        name: bad
        nodes:
          fetch: {type: tool_call, tool: echo, next: report}
          report:
            type: tool_call
            tool: echo
            input:
              status: "{{ .output.status }}"
        """)

    assert [(line, code) for line, code, _ in found] == [(8, "unknown-name")]
    assert "'output' exists only in guards and condition expressions" in found[0][2]
    assert "nodes.<id>.output" in found[0][2]


def test_output_is_legal_in_guards_and_condition_expressions() -> None:
    assert problems("""\
        name: ok
        nodes:
          a:
            type: tool_call
            tool: echo
            next:
              - {target: c, condition: "{{ .output.ok }}"}
              - {target: d, condition: "output.n > 2"}
          c:
            type: condition
            expression: "{{ 'x' if .output.ok else 'y' }}"
            next:
              - {target: d, condition: "{{ output == 'x' }}"}
          d: {type: tool_call, tool: echo}
        """) == []


def test_the_run_time_message_does_not_contradict_itself() -> None:
    ctx = template.template_context(input={}, nodes={})

    with pytest.raises(TemplateError) as caught:
        template.render_value({"s": "{{ output.status }}"}, ctx)

    message = str(caught.value)
    assert "exists only in guards and condition expressions" in message
    assert "can use input, output" not in message


# --------------------------------------------------------------- input_schema

SCHEMA: dict[str, Any] = {"type": "object", "required": ["pdf_url"],
          "properties": {"pdf_url": {"type": "string"}}}


def mapping(**extra: Any) -> dict[str, Any]:
    return {"name": "s", **extra, "nodes": {"a": {"type": "tool_call", "tool": "echo"}}}


def test_input_schema_is_part_of_the_hash_only_when_set() -> None:
    plain = load_dag_mapping(mapping(), **KNOWN)
    with_schema = load_dag_mapping(mapping(input_schema=SCHEMA), **KNOWN)
    same = load_dag_mapping(mapping(input_schema=dict(reversed(SCHEMA.items()))), **KNOWN)

    assert "input_schema" not in plain.canonical()
    assert with_schema.hash != plain.hash and same.hash == with_schema.hash
    assert Dag.from_canonical(with_schema.canonical()).input_schema == SCHEMA


@pytest.mark.parametrize(("schema", "substring"), [
    ({"type": "strin"}, "input_schema.type"),
    ({"properties": {"a": {"minimum": "1"}}}, "input_schema.properties.a.minimum"),
    ([{"type": "object"}], "must be a JSON Schema mapping"),
    ({"$ref": "other.json"}, "only references inside the schema"),
])
def test_a_bad_input_schema_is_a_dag_problem(schema: Any, substring: str) -> None:
    with pytest.raises(DagError) as caught:
        load_dag_mapping(mapping(input_schema=schema), **KNOWN)

    (problem,) = caught.value.problems
    assert problem.code == "bad-schema" and problem.field == "input_schema"
    assert substring in problem.format()


def test_check_task_input_names_the_field_path() -> None:
    item: dict[str, Any] = {"type": "object", "required": ["qty"],
                            "properties": {"qty": {"type": "integer"}}}
    order = {"type": "object", "properties": {"items": {"type": "array", "items": item}}}
    schema: dict[str, Any] = {"type": "object", "properties": {"order": order}}

    check_task_input(schema, {"order": {"items": [{"qty": 1}]}})
    check_task_input(None, "anything")
    with pytest.raises(InputError, match=r"input\.order\.items\[1\]\.qty: 'x' is not of type"):
        check_task_input(schema, {"order": {"items": [{"qty": 1}, {"qty": "x"}]}})
    with pytest.raises(InputError, match=r"input: 'qty' is a required property"):
        check_task_input(item, {})
