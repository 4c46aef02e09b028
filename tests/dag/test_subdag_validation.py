"""Sub-DAGs (``type: dag``): loading files and inline documents, flattening, hashes,
problems located in the right file, and the client inlining sub-DAG files."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from axengine.client._core import _dag_body
from axengine.client._inline import inline_subdags
from axengine.dag import (
    Dag,
    load_dag,
    load_dag_mapping,
    load_dag_text,
    to_dot,
    to_mermaid,
    validate_file,
)
from axengine.errors import DagError, DagProblem, InputError

TOOLS = {"echo"}
MODELS = {"gpt-4o-mini"}

CHILD = """\
name: approval
output: "{{ .nodes.decide.output }}"
nodes:
  check:
    type: llm_call
    model: gpt-4o-mini
    prompt: "check {{ .node.input }}"
    input: "{{ .input.doc }}"
    next: decide
  decide: {type: human_gateway, input: "{{ .input.doc }}"}
"""

PARENT = """\
name: main
nodes:
  draft: {type: tool_call, tool: echo, next: review}
  review:
    type: dag
    dag: flows/approval.yaml
    input: {doc: "{{ .nodes.draft.output }}"}
    next: publish
  publish: {type: tool_call, tool: echo, input: "{{ .nodes.review.output }}"}
"""
DAG_LINE = 6  # line of `dag:` in PARENT


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(path: Path) -> Dag:
    return load_dag(path, tools=TOOLS, models=MODELS)


def problems(path: Path) -> list[DagProblem]:
    return validate_file(path, tools=TOOLS, models=MODELS)


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    write(tmp_path / "flows" / "approval.yaml", CHILD)
    return write(tmp_path / "main.yaml", PARENT)


def test_a_sub_dag_file_is_flattened_after_its_dag_node(parent: Path) -> None:
    dag = load(parent)
    assert list(dag.nodes) == ["draft", "review", "review/check", "review/decide", "publish"]
    review = dag.nodes["review"]
    assert review.type == "dag" and review.subdag is not None
    assert review.subdag_file == "flows/approval.yaml"
    assert review.subdag.output == "{{ .nodes.decide.output }}"
    assert review.input == {"doc": "{{ .nodes.draft.output }}"}
    assert dag.children("review") == ("review/check", "review/decide")
    assert dag.nodes["review/check"].next[0].target == "review/decide"
    assert dag.entry_nodes == ("draft",)
    assert list(dag.canonical()["nodes"]) == ["draft", "review", "publish"]
    assert dag.canonical()["nodes"]["review"]["dag"] == review.subdag.canonical()


def test_the_hash_is_stable_and_the_canonical_form_loads_back(parent: Path) -> None:
    dag = load(parent)
    assert load(parent).hash == dag.hash
    again = load_dag_mapping(dag.canonical(), tools=TOOLS, models=MODELS)
    assert again.hash == dag.hash
    assert list(again.nodes) == list(dag.nodes)
    assert again == dag
    # The stored JSON too (what the store keeps, rebuilt without validation).
    stored = Dag.from_canonical(json.loads(dag.storage_json()))
    assert stored.hash == dag.hash and list(stored.nodes) == list(dag.nodes)


def test_the_child_content_is_part_of_the_hash_but_not_its_path(
    tmp_path: Path, parent: Path
) -> None:
    before = load(parent).hash
    write(tmp_path / "flows" / "approval.yaml", CHILD.replace("check {{", "verify {{"))
    changed = load(parent).hash
    assert changed != before
    # The same content under another path: the same hash.
    write(tmp_path / "flows" / "approval.yaml", CHILD)
    write(tmp_path / "other" / "place.yaml", CHILD)
    moved = write(tmp_path / "main2.yaml", PARENT.replace("flows/approval.yaml",
                                                           "other/place.yaml"))
    assert load(moved).hash == before


def test_an_inline_sub_dag_has_the_hash_of_the_file_one(parent: Path) -> None:
    inline = PARENT.replace("    dag: flows/approval.yaml\n", "    dag:\n" + textwrap.indent(
        CHILD, "      "))
    dag = load_dag_text(inline, tools=TOOLS, models=MODELS)
    assert dag.hash == load(parent).hash
    assert dag.nodes["review"].subdag_file is None


def test_a_parent_template_reads_the_dag_node_output_but_follows_ancestor_rules(
    tmp_path: Path,
) -> None:
    write(tmp_path / "flows" / "approval.yaml", CHILD)
    bad = write(tmp_path / "main.yaml", PARENT.replace(
        "input: {doc: \"{{ .nodes.draft.output }}\"}",
        "input: {doc: \"{{ .nodes.publish.output }}\"}"))
    found = problems(bad)
    assert [(p.code, p.node, p.line) for p in found] == [("bad-reference", "review", 7)]
    assert "'publish' does not run before 'review'" in found[0].message


def test_a_missing_sub_dag_file_is_reported_at_the_dag_line(tmp_path: Path) -> None:
    parent = write(tmp_path / "main.yaml", PARENT)
    found = problems(parent)
    looked = tmp_path / "flows" / "approval.yaml"
    assert [(p.code, p.file, p.line, p.node, p.field) for p in found] == [
        ("bad-subdag", str(parent), DAG_LINE, "review", "dag")]
    assert found[0].message == (f"sub-DAG file flows/approval.yaml does not exist "
                                f"(looked for {looked})")
    with pytest.raises(DagError, match="does not exist"):
        load(parent)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_sub_dag_path_that_is_not_a_regular_file_is_reported(tmp_path: Path,
                                                               kind: str) -> None:
    target = tmp_path / "flows" / "approval.yaml"
    target.parent.mkdir()
    if kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(target)  # reading it would block the loader forever
    parent = write(tmp_path / "main.yaml", PARENT)
    found = problems(parent)
    assert [(p.code, p.line) for p in found] == [("bad-subdag", DAG_LINE)]
    assert found[0].message.startswith(
        "sub-DAG file flows/approval.yaml is not a regular file"), found[0].message


def test_a_sub_dag_path_holding_a_nul_character_is_reported(tmp_path: Path) -> None:
    parent = write(tmp_path / "main.yaml", PARENT.replace("flows/approval.yaml",
                                                          '"flows/a\\u0000.yaml"'))
    found = problems(parent)
    assert [(p.code, p.line, p.message) for p in found] == [
        ("bad-subdag", DAG_LINE, "dag: the path holds a NUL character")]


def _dag_doc(name: str, target: str) -> str:
    return f"""\
name: {name}
nodes:
  start: {{type: tool_call, tool: echo, next: sub}}
  sub:
    type: dag
    dag: {target}
"""


def test_recursion_through_another_file_is_refused_with_the_chain(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", _dag_doc("a", "sub/b.yaml"))
    b = write(tmp_path / "sub" / "b.yaml", _dag_doc("b", "../a.yaml"))
    found = problems(a)
    assert [(p.code, p.file, p.line, p.node) for p in found] == [
        ("bad-subdag", str(b), 6, "sub")]
    assert found[0].message == "recursive sub-DAG: a.yaml -> sub/b.yaml -> a.yaml"


def test_a_file_running_itself_is_refused(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", _dag_doc("a", "a.yaml"))
    found = problems(a)
    assert [(p.code, p.file, p.line) for p in found] == [("bad-subdag", str(a), 6)]
    assert found[0].message == "recursive sub-DAG: a.yaml -> a.yaml"


def test_nesting_deeper_than_eight_levels_is_refused(tmp_path: Path) -> None:
    for i in range(10):
        write(tmp_path / f"d{i}.yaml", _dag_doc(f"d{i}", f"d{i + 1}.yaml"))
    write(tmp_path / "d10.yaml", "name: d10\nnodes: {only: {type: tool_call, tool: echo}}\n")
    found = problems(tmp_path / "d0.yaml")
    assert [(p.code, p.file, p.line) for p in found] == [
        ("bad-subdag", str(tmp_path / "d8.yaml"), 6)]
    assert found[0].message == "sub-DAGs are nested more than 8 levels deep"
    # Eight levels are fine.
    write(tmp_path / "d8.yaml", "name: d8\nnodes: {only: {type: tool_call, tool: echo}}\n")
    dag = load(tmp_path / "d0.yaml")
    assert "sub/sub/sub/sub/sub/sub/sub/sub/only" in dag.nodes


def test_a_child_problem_is_reported_with_the_child_file_and_line(tmp_path: Path) -> None:
    child = write(tmp_path / "flows" / "approval.yaml",
                  CHILD.replace("model: gpt-4o-mini", "model: gpt-5-huge"))
    parent = write(tmp_path / "main.yaml", PARENT.replace(
        "publish: {type: tool_call, tool: echo,", "publish: {type: tool_call, tool: nope,"))
    found = problems(parent)
    assert [(p.code, p.file, p.line, p.node) for p in found] == [
        ("unknown-tool", str(parent), 9, "publish"),
        ("unknown-model", str(child), 6, "check"),
    ]
    # The tools and models given to the parent's load apply to the child.
    assert validate_file(parent, tools={"echo", "nope"}, models={"gpt-5-huge"}) == []


def test_an_inline_child_problem_names_the_scoped_node(tmp_path: Path) -> None:
    text = """\
    name: main
    nodes:
      review:
        type: dag
        dag:
          name: inner
          nodes:
            check: {type: llm_call, model: gpt-5-huge, prompt: hi}
    """
    with pytest.raises(DagError) as err:
        load_dag_text(textwrap.dedent(text), tools=TOOLS, models=MODELS)
    assert [(p.code, p.line, p.node) for p in err.value.problems] == [
        ("unknown-model", 8, "review/check")]


def test_a_sub_dag_path_is_refused_without_a_file(parent: Path) -> None:
    for load_it in (
        lambda: load_dag_text(PARENT, tools=TOOLS, models=MODELS),
        lambda: load_dag_text(PARENT, file=str(parent), tools=TOOLS, models=MODELS),
    ):
        with pytest.raises(DagError) as err:
            load_it()
        assert [(p.code, p.line, p.node, p.field) for p in err.value.problems] == [
            ("bad-subdag", DAG_LINE, "review", "dag")]
        message = err.value.problems[0].message
        assert "a sub-DAG file is read only when the DAG is loaded from a file" in message
        assert "inline the sub-DAG (`dag:` as a mapping)" in message
    mapping = {"name": "m", "nodes": {"review": {"type": "dag", "dag": "flows/approval.yaml"}}}
    with pytest.raises(DagError) as err:
        load_dag_mapping(mapping, tools=TOOLS, models=MODELS)
    assert [(p.code, p.node) for p in err.value.problems] == [("bad-subdag", "review")]


def test_a_dag_node_refuses_handler_fields(tmp_path: Path) -> None:
    write(tmp_path / "flows" / "approval.yaml", CHILD)
    parent = write(tmp_path / "main.yaml", PARENT.replace(
        "    next: publish\n",
        "    next: publish\n    timeout: 60\n    retry: 2\n    lane: fast\n"
        "    tool: echo\n    runner: thread\n"))
    found = problems(parent)
    assert [(p.code, p.field, p.line) for p in found] == [
        ("unknown-field", "timeout", 9), ("unknown-field", "retry", 10),
        ("unknown-field", "lane", 11), ("unknown-field", "tool", 12),
        ("unknown-field", "runner", 13)]
    assert found[0].message == ("a dag node runs no handler of its own, so `timeout` "
                                "does not apply")
    assert found[0].hint == "set `timeout` on the nodes of its DAG"
    assert found[3].message == "unknown field 'tool'"
    assert found[3].hint is not None and "is a field of tool_call nodes" in found[3].hint


def test_a_dag_node_needs_dag(tmp_path: Path) -> None:
    text = "name: m\nnodes:\n  review: {type: dag}\n"
    with pytest.raises(DagError) as err:
        load_dag_text(text, tools=TOOLS, models=MODELS)
    [problem] = err.value.problems
    assert (problem.code, problem.message, problem.line) == (
        "missing-field", "dag node needs `dag`", 3)
    assert problem.hint is not None and "dag: flows/approval.yaml" in problem.hint
    with pytest.raises(DagError, match="dag must be a file path or a DAG document"):
        load_dag_text("name: m\nnodes:\n  review: {type: dag, dag: [a]}\n",
                      tools=TOOLS, models=MODELS)


def test_the_output_field_is_checked(tmp_path: Path) -> None:
    write(tmp_path / "flows" / "approval.yaml",
          CHILD.replace(".nodes.decide.output", ".nodes.decid.output"))
    found = problems(write(tmp_path / "main.yaml", PARENT))
    assert [(p.code, p.field, p.line) for p in found] == [("bad-reference", "output", 2)]
    assert found[0].message == "output: reads nodes.decid.output, but there is no node 'decid'"
    assert found[0].hint == "did you mean 'decide'?"
    with pytest.raises(DagError, match="output template"):
        load_dag_text("name: m\noutput: '{{ .nodes.a.output'\nnodes: {a: {type: tool_call, "
                      "tool: echo}}\n", tools=TOOLS, models=MODELS)


def test_flattened_children_raise_no_problem_in_the_parent(tmp_path: Path) -> None:
    # A child whose nodes have no path from the parent's entries, and a loop in the child.
    write(tmp_path / "flows" / "loop.yaml", """\
    name: looping
    nodes:
      work:
        type: tool_call
        tool: echo
        next: check
      check:
        type: tool_call
        tool: echo
        next: [{target: work, condition: "{{ .output.again }}", max_visits: 3}]
    """)
    dag = load(write(tmp_path / "main.yaml", """\
    name: main
    nodes:
      run: {type: dag, dag: flows/loop.yaml, next: done}
      done: {type: tool_call, tool: echo, input: "{{ .nodes.run.output }}"}
    """))
    assert list(dag.nodes) == ["run", "run/work", "run/check", "done"]
    assert dag.loops == {"run/check": ("run/work", "run/check")}


def test_graphs_draw_a_sub_dag_as_a_subgraph(parent: Path) -> None:
    dag = load(parent)
    mermaid = to_mermaid(dag)
    assert '    subgraph g_review ["review: approval"]' in mermaid
    assert "        n_review-check(" in mermaid
    assert "    n_review-check --> n_review-decide" in mermaid.splitlines()
    assert '    n_review -.->|"runs"| g_review' in mermaid.splitlines()
    assert not re.search(r"\b[ng]_[\w-]*/", mermaid)  # no `/` in a Mermaid id
    dot = to_dot(dag)
    assert '    subgraph "cluster_review" {' in dot
    assert '    "review" -> "review/check" [label="runs", style=dotted, ' \
        'lhead="cluster_review"];' in dot.splitlines()


# -- the client inlines sub-DAG files ----------------------------------------------------


def test_the_client_inlines_sub_dag_files(parent: Path) -> None:
    body, source = _dag_body(parent)
    assert source == str(parent)
    assert set(body) == {"dag"}
    review = body["dag"]["nodes"]["review"]
    assert review["dag"]["name"] == "approval"
    assert review["dag"]["nodes"]["check"]["model"] == "gpt-4o-mini"
    json.dumps(body)  # what is sent
    # What the server does with it: the same DAG as loading the file.
    assert load_dag_mapping(body["dag"], tools=TOOLS, models=MODELS).hash == load(parent).hash
    # A path string works as well as a Path.
    assert _dag_body(str(parent))[0] == body


def test_the_client_inlines_nested_files_relative_to_each_file(tmp_path: Path) -> None:
    write(tmp_path / "flows" / "leaf" / "x.yaml", "name: x\nnodes: {a: {type: tool_call, "
          "tool: echo, input: '2024-01-01'}}\n")
    write(tmp_path / "flows" / "mid.yaml", "name: mid\nnodes:\n  inner: {type: dag, dag: "
          "leaf/x.yaml}\n  also:\n    type: dag\n    dag:\n      name: y\n      nodes:\n"
          "        deep: {type: dag, dag: leaf/x.yaml}\n")
    top = write(tmp_path / "top.yaml", "name: top\nnodes: {m: {type: dag, dag: "
                "flows/mid.yaml}}\n")
    doc = inline_subdags(top.read_text(), top)
    assert doc is not None
    mid = doc["nodes"]["m"]["dag"]
    assert mid["nodes"]["inner"]["dag"]["name"] == "x"
    assert mid["nodes"]["also"]["dag"]["nodes"]["deep"]["dag"]["name"] == "x"
    assert mid["nodes"]["inner"]["dag"]["nodes"]["a"]["input"] == "2024-01-01"
    assert load_dag_mapping(doc, tools=TOOLS, models=MODELS).hash == \
        load(top).hash


def test_the_client_sends_a_file_without_sub_dag_files_as_text(tmp_path: Path) -> None:
    text = "name: m\nnodes: {a: {type: tool_call, tool: echo}}\n"
    plain = write(tmp_path / "plain.yaml", text)
    assert _dag_body(plain) == ({"dag_yaml": text}, str(plain))
    # Inline sub-DAGs only: still the text (the server keeps the lines).
    inline = write(tmp_path / "inline.yaml", "name: m\nnodes:\n  r:\n    type: dag\n"
                   "    dag: {name: c, nodes: {a: {type: tool_call, tool: echo}}}\n")
    assert set(_dag_body(inline)[0]) == {"dag_yaml"}
    # Not YAML: the text, for the server to report with its line.
    broken = write(tmp_path / "broken.yaml", "name: [m\n")
    assert set(_dag_body(broken)[0]) == {"dag_yaml"}


def test_the_client_refuses_missing_and_recursive_sub_dag_files(tmp_path: Path) -> None:
    missing = write(tmp_path / "main.yaml", PARENT)
    gone = "sub-DAG file flows/approval.yaml does not exist"
    with pytest.raises(InputError, match=re.escape(gone)):
        _dag_body(missing)
    a = write(tmp_path / "a.yaml", _dag_doc("a", "sub/b.yaml"))
    write(tmp_path / "sub" / "b.yaml", _dag_doc("b", "../a.yaml"))
    chain = "recursive sub-DAG: a.yaml -> sub/b.yaml -> a.yaml"
    with pytest.raises(InputError, match=re.escape(chain)):
        _dag_body(a)
