"""Map nodes (``map:``) and bounded loops (``max_visits:`` on a back edge): what the
loader accepts, what it refuses, and at which line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from axengine.dag import Dag, load_dag, load_dag_text, to_dot, to_mermaid
from axengine.errors import DagError, DagProblem
from tests.dag import MODELS, TOOLS

ROOT = Path(__file__).resolve().parents[2]

HEAD = "name: t\nnodes:\n"  # node ids start on line 3


def load(body: str) -> Dag:
    return load_dag_text(HEAD + body, file="v.yaml", tools=TOOLS, models=MODELS)


def problems_of(body: str) -> list[DagProblem]:
    with pytest.raises(DagError) as info:
        load(body)
    return info.value.problems


def only(body: str, code: str) -> DagProblem:
    found = problems_of(body)
    assert [p.code for p in found] == [code], [p.format() for p in found]
    return found[0]


def line_of(body: str, text: str) -> int:
    """File line of the first line of ``HEAD + body`` that contains ``text``."""
    for number, line in enumerate((HEAD + body).splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in the document")


MAP = """\
  split:
    type: tool_call
    tool: echo
    next: fan
  fan:
    type: llm_call
    model: gpt-4o-mini
    map: "{{ .nodes.split.output.sections }}"
    max_concurrency: 4
    max_items: 50
    on_item_failure: collect
    input: {section: "{{ item }}", n: "{{ index }}"}
    prompt: "Summarise section {{ index }}: {{ item.title }}"
    next:
      - target: join
        condition: "{{ .output | length > 0 }}"
  join:
    type: tool_call
    tool: echo
    input: "{{ .nodes.fan.output }}"
"""

LOOP = """\
  start:
    type: tool_call
    tool: echo
    next: draft
  draft:
    type: llm_call
    model: gpt-4o-mini
    prompt: "Draft {{ .input.topic }} (visit {{ visit }}); notes: {{ previous.review }}"
    next: review
  review:
    type: llm_call
    model: gpt-4o-mini
    prompt: "Review {{ .nodes.draft.output }}"
    next:
      - target: draft
        max_visits: 3
        condition: "{{ .output.verdict == 'revise' }}"
      - target: publish
        condition: "{{ .output.verdict != 'revise' }}"
  publish:
    type: tool_call
    tool: echo
    input: "{{ .nodes.draft.output }}"
"""

# -- accepted ---------------------------------------------------------------------------


def test_a_map_node_is_accepted_with_its_fields() -> None:
    dag = load(MAP)

    fan = dag.nodes["fan"]
    assert fan.map == "{{ .nodes.split.output.sections }}"
    assert (fan.max_concurrency, fan.max_items, fan.on_item_failure) == (4, 50, "collect")
    assert dag.nodes["split"].map is None
    assert dag.nodes["split"].on_item_failure == "fail"
    assert dag.canonical()["nodes"]["fan"]["map"] == fan.map
    assert "[map]" in to_mermaid(dag)
    assert "fan\\nllm_call: gpt-4o-mini [map]" in to_dot(dag)


def test_a_constant_map_that_renders_a_list_is_accepted() -> None:
    dag = load('  fan:\n    type: tool_call\n    tool: echo\n    map: "{{ [1, 2, 3] }}"\n'
               '    input: "{{ item }}"\n')
    assert dag.nodes["fan"].map == "{{ [1, 2, 3] }}"


def test_a_bounded_loop_is_accepted() -> None:
    dag = load(LOOP)

    back = dag.nodes["review"].next[0]
    assert (back.target, back.max_visits, back.loops) == ("draft", 3, True)
    assert dag.nodes["review"].targets == ("publish",)
    assert dag.loops == {"review": ("draft", "review")}
    assert dag.loop_of("draft") == "review"
    assert dag.loop_of("publish") is None
    assert dag.entry_nodes == ("start",)
    assert dag.canonical()["nodes"]["review"]["next"][0]["max_visits"] == 3


def test_a_loop_of_one_node_is_accepted() -> None:
    dag = load("  poll:\n    type: tool_call\n    tool: echo\n    input: \"{{ visit }}\"\n"
               "    next:\n      - target: poll\n        max_visits: 5\n"
               "        condition: \"{{ not .output.done }}\"\n")
    assert dag.loops == {"poll": ("poll",)}


def test_the_back_edge_is_drawn_dotted_with_its_bound() -> None:
    dag = load(LOOP)

    mermaid = to_mermaid(dag).splitlines()
    assert '    n_review -.->|"≤3 visits: .output.verdict == \'revise\'"| n_draft' in mermaid
    assert '    n_draft --> n_review' in mermaid
    dot = to_dot(dag).splitlines()
    assert ('    "review" -> "draft" [label="≤3 visits: .output.verdict == \'revise\'", '
            'style=dashed];') in dot


# -- map: refused -----------------------------------------------------------------------


def test_map_without_template_markup_is_refused() -> None:
    body = MAP.replace('map: "{{ .nodes.split.output.sections }}"', "map: sections")
    problem = only(body, "bad-value")

    assert problem.line == line_of(body, "map: sections")
    assert problem.node == "fan"
    assert problem.field == "map"
    assert problem.message == ('map must be a template that renders a list, e.g. '
                               'map: "{{ .nodes.split.output.sections }}"')


def test_a_constant_map_that_is_not_a_list_is_refused() -> None:
    body = ('  fan:\n    type: tool_call\n    tool: echo\n    map: "{{ 3 }}"\n'
            '    input: "{{ item }}"\n')
    problem = only(body, "bad-value")

    assert problem.line == 6
    assert problem.field == "map"
    assert problem.message == "map of fan renders a number, not a list"


def test_map_on_a_condition_node_is_an_unknown_field() -> None:
    body = ('  c:\n    type: condition\n    expression: "{{ .input.kind }}"\n'
            '    map: "{{ .input.kinds }}"\n')
    problem = only(body, "unknown-field")

    assert problem.line == 6
    assert problem.field == "map"
    assert "tool_call and llm_call" in (problem.hint or "")


def test_max_concurrency_without_map_is_refused() -> None:
    body = "  a:\n    type: tool_call\n    tool: echo\n    max_concurrency: 4\n"
    problem = only(body, "missing-field")

    assert problem.line == 6
    assert problem.field == "max_concurrency"
    assert problem.message == "max_concurrency applies to a map node; add `map:`"


@pytest.mark.parametrize(("field", "value"), [
    ("max_concurrency", "0"), ("max_concurrency", "1001"), ("max_items", "0"),
    ("max_items", "100001"), ("max_items", "true"), ("on_item_failure", "skip"),
])
def test_map_fields_out_of_range_are_refused(field: str, value: str) -> None:
    body = MAP.replace("    max_concurrency: 4\n    max_items: 50\n"
                       "    on_item_failure: collect\n", f"    {field}: {value}\n")
    problem = only(body, "bad-value")

    assert problem.line == line_of(body, f"{field}: {value}")
    assert problem.field == field


def test_map_reading_a_later_node_is_a_bad_reference() -> None:
    body = MAP.replace(".nodes.split.output.sections", ".nodes.join.output")
    problem = only(body, "bad-reference")

    assert problem.line == line_of(body, "map:")
    assert problem.field == "map"
    assert "nodes.join.output" in problem.message


def test_item_in_a_node_without_map_is_refused() -> None:
    body = '  a:\n    type: tool_call\n    tool: echo\n    input: "{{ item.x }}"\n'
    problem = only(body, "unknown-name")

    assert problem.line == 6
    assert problem.field == "input"
    assert "`item` is only defined in a map node's templates" in problem.message


def test_index_in_the_guard_of_a_map_node_is_refused() -> None:
    body = MAP.replace("{{ .output | length > 0 }}", "{{ index > 0 }}")
    problem = only(body, "unknown-name")

    assert problem.line == line_of(body, "index > 0")
    assert "`index` is only defined in a map node's input and prompt" in problem.message


# -- loops: refused ---------------------------------------------------------------------


def test_an_unbounded_cycle_names_the_cycle_and_how_to_bound_it() -> None:
    body = LOOP.replace("        max_visits: 3\n", "")
    problem = only(body, "cycle")

    assert problem.message == "cycle: draft -> review -> draft"
    assert problem.line == line_of(body, "- target: draft")
    assert problem.node == "review"
    assert "max_visits" in (problem.hint or "")
    assert "guard" in (problem.hint or "")


def test_a_back_edge_without_a_guard_is_refused() -> None:
    body = LOOP.replace("        condition: \"{{ .output.verdict == 'revise' }}\"\n", "", 1)
    problem = only(body, "bad-edge")

    assert problem.line == line_of(body, "max_visits: 3")
    assert problem.message == ("a loop's back edge needs a guard (`condition:` or `when:`) "
                               "as well as max_visits")


def test_max_visits_out_of_range_is_refused_without_a_cycle_besides() -> None:
    body = LOOP.replace("max_visits: 3", "max_visits: 101")
    problem = only(body, "bad-value")

    assert problem.line == line_of(body, "max_visits: 101")
    assert problem.field == "next[0].max_visits"


def test_max_visits_on_a_forward_edge_is_refused() -> None:
    body = ("  a:\n    type: tool_call\n    tool: echo\n    next:\n      - target: b\n"
            "        max_visits: 3\n        condition: \"{{ .output.again }}\"\n"
            "  b:\n    type: tool_call\n    tool: echo\n")
    problem = only(body, "bad-edge")

    assert problem.line == line_of(body, "- target: b")
    assert problem.message == ("next[0]: max_visits on an edge that closes no loop: b does "
                               "not lead back to a")


def test_leaving_a_loop_from_the_middle_is_refused() -> None:
    body = LOOP.replace("    next: review\n", "    next: [review, publish]\n")
    problem = only(body, "bad-edge")

    assert problem.line == line_of(body, "next: [review, publish]")
    assert problem.node == "draft"
    assert problem.field == "next[1]"
    assert "draft leads to publish" in problem.message
    assert "exits from a loop must leave from its last node, review" in problem.message


def test_on_failure_out_of_the_middle_of_a_loop_is_refused() -> None:
    body = LOOP.replace("    next: review\n", "    next: review\n    on_failure: publish\n")
    problem = only(body, "bad-edge")

    assert problem.line == line_of(body, "on_failure: publish")
    assert problem.field == "on_failure"


def test_entering_a_loop_in_the_middle_is_refused() -> None:
    body = LOOP.replace("    next: draft\n", "    next: [draft, review]\n", 1)
    problem = only(body, "bad-edge")

    assert problem.line == line_of(body, "next: [draft, review]")
    assert problem.node == "start"
    assert problem.message == ("next[1]: start -> review enters the loop from draft to "
                               "review in the middle; only the loop's first node draft may "
                               "be entered from outside the loop")


def test_a_map_node_inside_a_loop_is_refused() -> None:
    body = LOOP.replace('    prompt: "Draft', '    map: "{{ .input.topics }}"\n'
                        '    prompt: "Draft', 1)
    problem = only(body, "bad-loop")

    assert problem.line == line_of(body, "map:")
    assert problem.node == "draft"
    assert "not supported yet" in problem.message


def test_overlapping_loops_are_refused() -> None:
    body = ("  a:\n    type: tool_call\n    tool: echo\n    next: b\n"
            "  b:\n    type: tool_call\n    tool: echo\n    next:\n      - c\n"
            "      - target: a\n        max_visits: 3\n        condition: \"{{ .output.x }}\"\n"
            "  c:\n    type: tool_call\n    tool: echo\n    next:\n"
            "      - target: b\n        max_visits: 2\n        condition: \"{{ .output.x }}\"\n")
    found = problems_of(body)

    assert "bad-loop" in [p.code for p in found], [p.format() for p in found]
    problem = next(p for p in found if p.code == "bad-loop")
    assert problem.line == line_of(body, "- target: b")
    assert "nested or overlapping loops are not supported yet" in problem.message


def test_a_node_closes_one_loop_only() -> None:
    body = ("  a:\n    type: tool_call\n    tool: echo\n    next: b\n"
            "  b:\n    type: tool_call\n    tool: echo\n    next: c\n"
            "  c:\n    type: tool_call\n    tool: echo\n    next:\n"
            "      - target: a\n        max_visits: 3\n        condition: \"{{ .output.x }}\"\n"
            "      - target: b\n        max_visits: 2\n        condition: \"{{ .output.y }}\"\n")
    found = problems_of(body)

    problem = next(p for p in found if p.code == "bad-edge")
    assert problem.line == line_of(body, "- target: b")
    assert "a node may close one loop only" in problem.message


def test_visit_outside_a_loop_is_refused() -> None:
    body = '  a:\n    type: llm_call\n    model: gpt-4o-mini\n    prompt: "try {{ visit }}"\n'
    problem = only(body, "unknown-name")

    assert problem.line == 6
    assert "`visit` is only defined in the templates of a loop's nodes" in problem.message


def test_previous_of_a_node_outside_the_loop_is_refused() -> None:
    body = LOOP.replace("{{ previous.review }}", "{{ previous.start }}")
    problem = only(body, "bad-reference")

    assert problem.line == line_of(body, "previous.start")
    assert "previous.start" in problem.message


def test_a_loop_node_reads_an_earlier_visit_through_previous_not_nodes() -> None:
    body = LOOP.replace("{{ previous.review }}", "{{ .nodes.review.output }}")
    problem = only(body, "bad-reference")

    assert problem.node == "draft"
    assert "not an ancestor" in problem.message


# -- hash -------------------------------------------------------------------------------


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_the_hash_of_a_dag_without_maps_or_loops_is_unchanged() -> None:
    dag = load_dag(ROOT / "dags" / "financial_risk_assessment.yaml")

    canonical = dag.canonical()
    new = {"map", "max_concurrency", "max_items", "on_item_failure", "max_visits"}
    assert not _keys(canonical) & new
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert dag.hash == hashlib.sha256(text.encode()).hexdigest()
    # The hash this DAG had before map nodes and loops existed.
    assert dag.hash == "da42bd4b25d90da3162ae9b78b48ebf7bf501d2e5154dcb245a2db3657ca004b"
    assert Dag.from_canonical(canonical).hash == dag.hash
