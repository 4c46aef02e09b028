"""Whole-DAG checks: targets, cycles, reachability, templates, labels, names, references."""

from __future__ import annotations

from pathlib import Path

import pytest

from axengine.dag import find_cycles, load_dag, load_dag_text
from axengine.errors import DagError, DagProblem
from tests.dag import MODELS, TOOLS

ROOT = Path(__file__).resolve().parents[2]


def problems_of(text: str, *, tools: frozenset[str] = TOOLS,
                models: frozenset[str] = MODELS) -> list[DagProblem]:
    with pytest.raises(DagError) as info:
        load_dag_text(text, file="v.yaml", tools=tools, models=models)
    return info.value.problems


def only(text: str, code: str) -> DagProblem:
    found = problems_of(text)
    assert [p.code for p in found] == [code], [p.format() for p in found]
    return found[0]


def chain(n: int, *, template: bool = False) -> str:
    lines = ["name: chain", "nodes:"]
    for i in range(n):
        lines += [f"  n{i}:", "    type: tool_call", "    tool: echo"]
        if template and i:
            lines.append(f'    input: "{{{{ .nodes.n{i - 1}.output }}}}"')
        if i < n - 1:
            lines.append(f"    next: n{i + 1}")
    return "\n".join(lines) + "\n"


# -- graph ------------------------------------------------------------------------------


def test_find_cycles_names_paths_in_edge_order() -> None:
    assert find_cycles({"a": ["b"], "b": ["c"], "c": []}) == []
    assert find_cycles({"a": ["a"]}) == [["a", "a"]]
    assert find_cycles({"a": ["b"], "b": ["c"], "c": ["a"]}) == [["a", "b", "c", "a"]]
    assert find_cycles({"s": ["a"], "a": ["b"], "b": ["a", "c"], "c": []}) == [["a", "b", "a"]]


def test_find_cycles_handles_a_deep_graph_without_recursion() -> None:
    n = 50_000
    succ = {f"n{i}": [f"n{i + 1}"] for i in range(n - 1)}
    succ[f"n{n - 1}"] = ["n0"]

    (cycle,) = find_cycles(succ)

    assert len(cycle) == n + 1
    assert (cycle[0], cycle[-2], cycle[-1]) == ("n0", f"n{n - 1}", "n0")


def test_unknown_target_suggests_the_closest_node() -> None:
    problem = only("""name: t
nodes:
  parse:
    type: tool_call
    tool: echo
    next: extract_metric
  extract_metrics: {type: tool_call, tool: echo}
""", "unknown-target")

    assert (problem.line, problem.node, problem.field) == (6, "parse", "next[0].target")
    assert problem.hint == "did you mean 'extract_metrics'?"


def test_cycle_is_reported_at_the_closing_edge_with_its_path() -> None:
    found = problems_of("""name: t
nodes:
  a: {type: tool_call, tool: echo, next: b}
  b: {type: tool_call, tool: echo, next: c}
  c:
    type: tool_call
    tool: echo
    on_failure: a
""")

    assert [(p.code, p.line, p.message) for p in found] == [
        ("cycle", 8, "cycle: a -> b -> c -> a"),
    ]


def test_unreachable_island_next_to_an_entry_node() -> None:
    found = problems_of("""name: t
nodes:
  start: {type: tool_call, tool: echo}
  x: {type: tool_call, tool: echo, next: y}
  y: {type: tool_call, tool: echo, next: x}
""")

    assert sorted((p.code, p.node) for p in found) == [
        ("cycle", "y"), ("unreachable", "x"), ("unreachable", "y"),
    ]
    assert "start" in (found[0].hint or "") or "start" in (found[1].hint or "")


def test_several_entry_nodes_are_fine() -> None:
    dag = load_dag_text("""name: t
nodes:
  a: {type: tool_call, tool: echo, next: j}
  b: {type: tool_call, tool: echo, next: j}
  j: {type: tool_call, tool: echo}
""", tools=TOOLS, models=MODELS)

    assert dag.entry_nodes == ("a", "b")


def test_condition_join_is_allowed_when_the_condition_sets_its_input() -> None:
    dag = load_dag_text("""name: t
nodes:
  a: {type: tool_call, tool: echo, next: route}
  b: {type: tool_call, tool: echo, next: route}
  route:
    type: condition
    input: "{{ .nodes.a.output }}"
    expression: "{{ 'big' if .output.n > 3 else 'small' }}"
""", tools=TOOLS, models=MODELS)

    assert dag.predecessors["route"] == ("a", "b")


# -- names ------------------------------------------------------------------------------


def test_tools_and_models_are_parameters() -> None:
    text = """name: t
nodes:
  a: {type: tool_call, tool: scraper, next: b}
  b: {type: llm_call, model: local-llama, prompt: hi, fallback: {model: tiny}}
"""
    found = problems_of(text)
    dag = load_dag_text(text, tools={"scraper"}, models={"local-llama", "tiny"})

    assert [(p.code, p.field) for p in found] == [
        ("unknown-tool", "tool"), ("unknown-model", "model"),
        ("unknown-model", "fallback.model"),
    ]
    assert "known tools: echo, http_request" in (found[0].hint or "")
    assert dag.nodes["b"].fallback is not None and dag.nodes["b"].fallback.model == "tiny"


def test_default_names_come_from_the_executor_registry() -> None:
    dag = load_dag(ROOT / "dags" / "video_generation.yaml")

    assert dag.nodes["render_video"].tool == "video_vendor"
    with pytest.raises(DagError) as info:
        load_dag_text("name: t\nnodes:\n  a: {type: tool_call, tool: teleport}\n")
    assert [p.code for p in info.value.problems] == ["unknown-tool"]


# -- templates ----------------------------------------------------------------------------


def test_template_error_line_is_offset_inside_a_literal_block() -> None:
    problem = only("""name: t
nodes:
  ask:
    type: llm_call
    model: gpt-4o
    prompt: |
      line one {{ .input.a }}
      line two
      line three {{ .input.b ) }}
""", "template-syntax")

    assert (problem.line, problem.field) == (9, "prompt")


def test_templates_inside_nested_input_are_compiled_with_their_line() -> None:
    problem = only("""name: t
nodes:
  mail:
    type: tool_call
    tool: send_email
    input:
      to: [a@example.com]
      subject: "ok {{ .input.a }}"
      body: "broken {% if %}"
""", "template-syntax")

    assert (problem.line, problem.field) == (9, "input.body")


def test_gate_description_is_a_template() -> None:
    problem = only("""name: t
nodes:
  gate:
    type: human_gateway
    description: "Approve {{ .input.x ]] }}?"
""", "template-syntax")

    assert problem.field == "description"


def test_plain_strings_are_not_templates() -> None:
    dag = load_dag_text("""name: t
nodes:
  a: {type: tool_call, tool: echo, input: "50% off }} {not a template"}
""", tools=TOOLS, models=MODELS)

    assert dag.nodes["a"].input == "50% off }} {not a template"


def test_a_bare_guard_is_compiled_as_one_expression() -> None:
    text = """name: t
nodes:
  a:
    type: tool_call
    tool: echo
    next:
      - {{target: b, condition: "{guard}"}}
  b: {{type: tool_call, tool: echo}}
"""
    dag = load_dag_text(text.format(guard="output.ok and input.go"), tools=TOOLS,
                        models=MODELS)
    broken = only(text.format(guard="output.ok and"), "template-syntax")
    unknown = only(text.format(guard="nodes.b.output.ok"), "bad-reference")

    assert dag.nodes["a"].next[0].condition == "output.ok and input.go"
    assert (broken.line, broken.field) == (7, "next[0].condition")
    assert "'b' does not run before 'a'" in unknown.message


# -- labels -------------------------------------------------------------------------------


CONDITION = """name: t
nodes:
  score: {{type: tool_call, tool: echo, next: route}}
  route:
    type: condition
    expression: {expr}
    next:
      - {{target: done, when: {label}}}
  done: {{type: tool_call, tool: echo}}
"""


def test_unknown_label_lists_what_the_expression_produces() -> None:
    expr = "|\n      if .output.x > 1: high_risk\n      elif .output.y: medium_risk\n" \
           "      else: low_risk"
    problem = only(CONDITION.format(expr=expr, label="hgh_risk"), "unknown-label")

    assert problem.line == 11
    assert problem.hint == "did you mean 'high_risk'? it can produce: high_risk, " \
        "medium_risk, low_risk"


def test_any_label_goes_with_a_single_template_expression() -> None:
    text = CONDITION.format(expr="\"{{ .output.kind }}\"", label="whatever")

    dag = load_dag_text(text, tools=TOOLS, models=MODELS)

    assert dag.nodes["route"].next[0].when == "whatever"


# -- references ---------------------------------------------------------------------------


REFS = """name: t
nodes:
  a: {{type: tool_call, tool: echo, next: [b, c]}}
  b: {{type: tool_call, tool: echo, next: d}}
  c: {{type: tool_call, tool: echo}}
  d:
    type: tool_call
    tool: echo
    input: "{{{{ .nodes.{ref}.output }}}}"
"""


def test_ancestors_may_be_read() -> None:
    for ref in ("a", "b"):
        dag = load_dag_text(REFS.format(ref=ref), tools=TOOLS, models=MODELS)
        assert dag.nodes["d"].input == f"{{{{ .nodes.{ref}.output }}}}"


@pytest.mark.parametrize(("ref", "reason"), [
    ("c", "'c' does not run before 'd'"),
    ("d", "cannot read its own output"),
    ("e", "there is no node 'e'"),
])
def test_other_nodes_may_not_be_read(ref: str, reason: str) -> None:
    problem = only(REFS.format(ref=ref), "bad-reference")

    assert reason in problem.message
    assert (problem.node, problem.field, problem.line) == ("d", "input", 9)


def test_a_guard_must_read_its_own_node_as_output() -> None:
    problem = only("""name: t
nodes:
  a:
    type: tool_call
    tool: echo
    next:
      - {target: b, condition: "{{ .nodes.a.output.ok }}"}
  b: {type: tool_call, tool: echo}
""", "bad-reference")

    assert problem.hint == "read `output` in the node's `next` guards"


# -- scale --------------------------------------------------------------------------------


def test_ten_thousand_node_chain_validates() -> None:
    # bench/validation.py times this size; here it must load, whole and in order.
    dag = load_dag_text(chain(10_000), tools=TOOLS, models=MODELS)

    assert len(dag.nodes) == 10_000
    assert dag.entry_nodes == ("n0",)


def test_long_chain_with_references_and_a_cycle_at_the_end() -> None:
    text = chain(3_000, template=True) + "    next: n0\n"  # the last node loops back

    found = problems_of(text)

    assert [p.code for p in found] == ["cycle"]
    assert found[0].message.startswith("cycle: n0 -> n1 -> n2 -> ")
    assert found[0].message.endswith("-> n2999 -> n0")
