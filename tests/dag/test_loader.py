"""Loading: YAML and inline mappings → Dag, defaults, line numbers, bounds, content hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from axengine.dag import (
    DEFAULT_RETRY,
    DEFAULT_TIMEOUT,
    MAX_DAG_NODES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    Dag,
    Edge,
    Fallback,
    load_dag,
    load_dag_mapping,
    load_dag_text,
    validate_file,
)
from axengine.errors import DagError, DagProblem
from tests.dag import MODELS, TOOLS

ROOT = Path(__file__).resolve().parents[2]
FINANCIAL = ROOT / "dags" / "financial_risk_assessment.yaml"


def load(text: str, **kwargs: Any) -> Dag:
    return load_dag_text(text, tools=TOOLS, models=MODELS, **kwargs)


def problems_of(text: str) -> list[DagProblem]:
    with pytest.raises(DagError) as info:
        load(text, file="dag.yaml")
    return info.value.problems


def codes(text: str) -> list[str]:
    return [p.code for p in problems_of(text)]


def test_financial_example_keeps_every_seed_field() -> None:
    dag = load_dag(FINANCIAL, tools=TOOLS, models=MODELS)

    assert dag.name == "financial_risk_assessment"
    assert dag.description == "Analyze financial report and generate risk alert"
    parse = dag.nodes["parse_pdf"]
    assert (parse.type, parse.tool, parse.input) == ("tool_call", "pdf_parser",
                                                     "{{ .input.pdf_url }}")
    assert (parse.timeout, parse.retry, parse.attempts) == (300.0, 2, 3)
    assert parse.next == (
        Edge("extract_metrics", condition="{{ .output.status == 'success' }}"),
        Edge("send_alert", condition="{{ .output.status == 'failed' }}"),
    )
    extract = dag.nodes["extract_metrics"]
    assert extract.model == "gpt-4-turbo"
    assert extract.prompt is not None and extract.prompt.startswith("You are a financial")
    assert "Return JSON with keys: revenue_growth" in extract.prompt
    assert (extract.temperature, extract.max_tokens) == (0.1, 512)
    assert extract.fallback == Fallback("gpt-3.5-turbo", 0.8)
    assert extract.input == "{{ .nodes.parse_pdf.output.text }}"
    assess = dag.nodes["assess_risk"]
    assert [(e.target, e.when) for e in assess.next] == [
        ("send_high_risk_email", "high_risk"),
        ("send_medium_risk_email", "medium_risk"),
        ("send_low_risk_email", "low_risk"),
    ]
    gate = dag.nodes["send_high_risk_email"]
    assert (gate.type, gate.timeout, gate.on_timeout) == ("human_gateway", 86400.0, "reject")
    assert dag.entry_nodes == ("parse_pdf",)
    assert len(dag.predecessors["log_completion"]) == 5


def test_defaults_come_from_the_model() -> None:
    dag = load("""
name: defaults
nodes:
  t: {type: tool_call, tool: echo, next: l}
  l: {type: llm_call, model: gpt-4o, prompt: hi, next: c}
  c: {type: condition, expression: "{{ 'x' }}", next: [g]}
  g: {type: human_gateway}
""")

    for node in dag.nodes.values():
        assert node.timeout == DEFAULT_TIMEOUT[node.type]
        assert node.retry == DEFAULT_RETRY[node.type]
        assert node.lane == "default"
    assert dag.nodes["g"].on_timeout == "reject"
    assert dag.nodes["t"].on_timeout is None
    assert dag.deadline is None


def test_next_accepts_id_list_and_guarded_mappings_mixed() -> None:
    dag = load("""
name: fanout
nodes:
  a:
    type: tool_call
    tool: echo
    next:
      - b
      - target: c
        condition: "{{ .output.ok }}"
  b: {type: tool_call, tool: echo, next: d}
  c: {type: tool_call, tool: echo, next: [d]}
  d: {type: tool_call, tool: echo}
""")

    assert dag.nodes["a"].next == (Edge("b"), Edge("c", condition="{{ .output.ok }}"))
    assert dag.nodes["b"].next == (Edge("d"),)
    assert dag.nodes["c"].next == (Edge("d"),)
    assert dag.predecessors["d"] == ("b", "c")


def test_lines_of_nodes_and_edges_are_recorded() -> None:
    dag = load("""name: lines
nodes:
  a:
    type: tool_call
    tool: echo
    next:
      - b
      - {target: c}
  b: {type: tool_call, tool: echo}
  c: {type: tool_call, tool: echo}
""")

    assert dag.nodes["a"].line == 3
    assert [e.line for e in dag.nodes["a"].next] == [7, 8]
    assert dag.nodes["c"].line == 10


def test_hash_ignores_key_order_comments_and_quoting() -> None:
    first = load("""
name: h
nodes:
  a: {type: tool_call, tool: echo, timeout: 30, next: b}
  b: {type: llm_call, model: gpt-4o, prompt: hi, temperature: 0}
""")
    second = load("""
# the same DAG, written differently
nodes:
  b:
    temperature: 0.0
    prompt: 'hi'
    model: "gpt-4o"
    type: llm_call
  a:
    next: [b]
    timeout: 30.0
    tool: echo
    type: tool_call
name: h
""")
    changed = load("""
name: h
nodes:
  a: {type: tool_call, tool: echo, timeout: 31, next: b}
  b: {type: llm_call, model: gpt-4o, prompt: hi, temperature: 0}
""")

    assert first.hash == second.hash
    assert len(first.hash) == 64
    assert changed.hash != first.hash


def test_inline_mapping_loads_like_yaml() -> None:
    text = FINANCIAL.read_text()
    data = json.loads(json.dumps(yaml.safe_load(text)))

    from_yaml = load_dag_text(text, tools=TOOLS, models=MODELS)
    inline = load_dag_mapping(data, tools=TOOLS, models=MODELS)

    assert inline.hash == from_yaml.hash
    assert inline.source == "<inline>"
    assert type(inline.nodes["send_alert"].input) is dict


def test_inline_mapping_problems_name_node_and_field_without_lines() -> None:
    with pytest.raises(DagError) as info:
        load_dag_mapping(
            {"name": "x", "nodes": {"a": {"type": "tool_call", "tool": "nope", "retry": -1}}},
            tools=TOOLS, models=MODELS,
        )

    found = {(p.code, p.node, p.field, p.line, p.file) for p in info.value.problems}
    assert found == {
        ("bad-value", "a", "retry", 0, "<inline>"),
        ("unknown-tool", "a", "tool", 0, "<inline>"),
    }


def test_stored_input_is_plain_json_data() -> None:
    dag = load("""
name: plain
nodes:
  a:
    type: tool_call
    tool: echo
    input:
      to: [x@example.com]
      nested: {k: "{{ .input.v }}"}
      when: 2024-01-01
""")

    value = dag.nodes["a"].input
    assert value == {"to": ["x@example.com"], "nested": {"k": "{{ .input.v }}"},
                     "when": "2024-01-01"}
    assert type(value) is dict and type(value["to"]) is list
    assert json.loads(dag.canonical_json())["nodes"]["a"]["input"] == value


def test_merge_keys_share_settings() -> None:
    dag = load("""
name: merged
nodes:
  a: &base {type: tool_call, tool: echo, timeout: 12}
  b: {<<: *base, timeout: 5}
""")

    assert dag.nodes["a"].timeout == 12.0
    assert dag.nodes["b"].timeout == 5.0
    assert (dag.nodes["b"].type, dag.nodes["b"].tool) == ("tool_call", "echo")


def test_every_problem_is_reported_not_just_the_first() -> None:
    found = codes("""
name: many
nodes:
  a:
    type: tool_call
    tool: nope
    retry: 1000
    colour: red
    next: missing
  b:
    type: teleport
""")

    assert sorted(found) == [
        "bad-value", "unknown-field", "unknown-node-type", "unknown-target", "unknown-tool",
    ]


def test_problems_are_sorted_by_line_and_format_as_file_line() -> None:
    with pytest.raises(DagError) as info:
        load("name: s\nnodes:\n  a:\n    type: tool_call\n    tool: x\n    retry: -2\n",
             file="s.yaml")

    lines = [p.line for p in info.value.problems]
    assert lines == sorted(lines) == [5, 6]
    assert str(info.value).splitlines()[0].startswith("s.yaml:5: node 'a': unknown tool 'x'")


def test_unknown_field_hint_suggests_the_closest_field() -> None:
    (problem,) = problems_of("name: t\nnodes:\n  a: {type: tool_call, tool: echo, retyr: 1}\n")

    assert problem.code == "unknown-field"
    assert problem.hint == "did you mean 'retry'?"
    assert problem.line == 3


def test_unknown_field_without_a_close_match_lists_each_valid_field_once() -> None:
    (problem,) = problems_of("name: t\nnodes:\n  a: {type: tool_call, tool: echo, "
                             "depends_on: [b]}\n")

    assert problem.code == "unknown-field"
    fields = problem.hint.removeprefix("valid fields: ").split(", ")
    assert {"tool", "runner", "next", "map"} <= set(fields)
    assert len(fields) == len(set(fields)), fields


def test_duplicate_keys_are_rejected_with_both_lines() -> None:
    (problem,) = problems_of("name: d\nnodes:\n  a:\n    type: tool_call\n"
                             "    tool: echo\n    tool: echo\n")

    assert problem.code == "duplicate-key"
    assert problem.line == 6
    assert "first at line 5" in problem.message


def test_python_tags_are_refused_not_executed() -> None:
    found = problems_of("name: t\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n"
                        "    input: !!python/object/apply:os.system ['true']\n")

    assert [p.code for p in found] == ["yaml-syntax"]
    assert "unsupported YAML tag" in found[0].message


def test_empty_document_is_not_a_mapping() -> None:
    assert codes("# nothing here\n") == ["not-a-mapping"]


def test_multiple_documents_are_a_syntax_error() -> None:
    assert codes("name: a\n---\nname: b\n") == ["yaml-syntax"]


def test_unquoted_template_in_a_list_is_caught() -> None:
    found = problems_of("name: t\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n"
                        "    input:\n      - {{ .input.x }}\n")

    assert [(p.code, p.line) for p in found] == [("unquoted-template", 7)]
    assert found[0].hint == 'quote the template: "{{ .input.x }}"'


def test_document_size_is_bounded() -> None:
    text = "name: big\ndescription: " + "x" * MAX_DOCUMENT_BYTES + "\nnodes: {}\n"

    assert codes(text) == ["too-large"]


def test_node_count_is_bounded() -> None:
    nodes = {f"n{i}": {"type": "tool_call", "tool": "echo"} for i in range(MAX_DAG_NODES + 1)}

    with pytest.raises(DagError) as info:
        load_dag_mapping({"name": "many", "nodes": nodes}, tools=TOOLS, models=MODELS)

    assert [p.code for p in info.value.problems] == ["too-large"]


def test_nesting_depth_is_bounded() -> None:
    deep = "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)

    found = codes(f"name: t\nnodes:\n  a: {{type: tool_call, tool: echo, input: {deep}}}\n")

    assert found == ["too-large"]


def test_deep_inline_mapping_is_bounded() -> None:
    value: Any = "leaf"
    for _ in range(MAX_DEPTH + 5):
        value = [value]

    with pytest.raises(DagError) as info:
        load_dag_mapping({"name": "t", "nodes": {"a": {"type": "tool_call", "tool": "echo",
                                                        "input": value}}})

    assert [p.code for p in info.value.problems] == ["too-large"]


def test_missing_file_and_bad_encoding(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: x\nnodes:\n  \xff\xfe: 1\n")

    with pytest.raises(DagError) as info:
        load_dag(missing)
    assert [p.code for p in info.value.problems] == ["unreadable"]
    assert [(p.code, p.line) for p in validate_file(binary)] == [("yaml-syntax", 3)]


def test_validate_file_returns_nothing_for_a_valid_file() -> None:
    assert validate_file(FINANCIAL, tools=TOOLS, models=MODELS) == []


def test_deadline_and_fields_with_numbers_are_checked() -> None:
    found = problems_of("""
name: nums
deadline: -5
nodes:
  a:
    type: llm_call
    model: gpt-4o
    prompt: hi
    timeout: true
    max_tokens: 0
    temperature: 3.5
    lane: slow
    fallback: {model: gpt-4o-mini, threshold: 2}
""")

    assert sorted((p.field or "") for p in found) == [
        "deadline", "fallback.threshold", "lane", "max_tokens", "temperature", "timeout",
    ]
    assert {p.code for p in found} == {"bad-value"}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {1, 2}, b"raw"])
def test_inline_mappings_refuse_values_json_cannot_hold(value: object) -> None:
    # ax.run and the REST API's inline JSON hand the loader Python values: a NaN or a set
    # would pass validation and then fail to store at submit.
    mapping = {"name": "inline", "nodes": {"a": {"type": "tool_call", "tool": "echo",
                                                 "input": {"x": value}}}}

    with pytest.raises(DagError, match="not a JSON"):
        load_dag_mapping(mapping)
