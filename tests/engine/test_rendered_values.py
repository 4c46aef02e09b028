"""A template that renders a value JSON cannot hold (NaN, an infinity, two keys JSON would
write alike, an integer past Python's 4,300 digits, a lone surrogate) fails its own
node, with the reason; keys JSON can write (1, 1.5, false, null) come out as it writes
them.

Before, the value reached the hash of the node's input (or the encoding of its
snapshot) and raised there, inside the transaction that readies the node: the submit,
or the predecessor's completion, failed with an error naming no node, and a completion
failed again each time it was retried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import axengine as ax

#: Template → the reason the node's error gives.
NOT_JSON = {
    "infinity": ("{{ 'inf'|float }}", "is not standard JSON: it holds NaN or an infinity"),
    "keys JSON writes alike": ("{{ {1: 'a', '1': 'b'} }}",
                               ": object keys 1 and '1' are the same key in JSON"),
    "huge integer": ("{{ ('9' * 4300)|int + 1 }}",
                     "is not standard JSON: it holds an integer longer than 4300 digits"),
    "lone surrogate": ("{{ 'a\\ud800' }}", "is not valid Unicode text: surrogates not allowed"),
}


def downstream(where: str, rendered: str) -> dict[str, Any]:
    """Node ``b``, after ``a``, with ``rendered`` in the place ``where`` names."""
    if where == "tool input":
        return {"type": "tool_call", "tool": "echo", "input": rendered}
    if where == "condition input":
        return {"type": "condition", "input": rendered, "expression": "{{ 'x' }}",
                "next": [{"target": "z", "when": "x"}]}
    if where == "map list":
        # (a list that reads an output: validation cannot render it ahead)
        return {"type": "tool_call", "tool": "echo", "input": "{{ .item }}",
                "map": "{{ [.nodes.a.output, " + rendered[3:-3] + "] }}"}
    assert where == "map item input"
    return {"type": "tool_call", "tool": "echo", "map": "{{ [1] }}", "input": rendered}


@pytest.mark.parametrize("case", list(NOT_JSON))
@pytest.mark.parametrize("where", ["tool input", "condition input", "map list",
                                   "map item input"])
def test_a_value_json_cannot_hold_fails_the_node_that_renders_it(
        where: str, case: str, tmp_path: Path) -> None:
    rendered, reason = NOT_JSON[case]
    nodes: dict[str, Any] = {
        "a": {"type": "tool_call", "tool": "echo", "input": "x", "next": "b"},
        "b": downstream(where, rendered),
    }
    if where == "condition input":
        nodes["z"] = {"type": "tool_call", "tool": "echo", "input": "z"}

    result = ax.run({"name": "not_json", "nodes": nodes}, {}, home=tmp_path, timeout=20)

    assert result.status == "FAILED", result
    assert result.states["a"] == "SUCCEEDED"  # its completion committed
    failed = {n: e for n, e in result.errors.items() if result.states[n] == "FAILED"}
    assert failed, result
    error = failed.get("b", next(iter(failed.values())))
    template = "map template" if where == "map list" else "input template"
    assert f"{template}: " in error and reason in error, error


@pytest.mark.parametrize("case", list(NOT_JSON))
def test_an_entry_node_fails_at_submit_and_the_task_is_stored(case: str,
                                                             tmp_path: Path) -> None:
    rendered, reason = NOT_JSON[case]
    dag = {"name": "entry", "nodes": {"a": {"type": "tool_call", "tool": "echo",
                                            "input": rendered}}}

    result = ax.run(dag, {}, home=tmp_path, timeout=20)

    assert (result.status, result.states) == ("FAILED", {"a": "FAILED"})
    assert reason in result.errors["a"], result.errors


def test_object_keys_come_out_as_json_writes_them(tmp_path: Path) -> None:
    # As an executor reading the input back over gRPC gets them: an inline handler sees
    # the same input, and `output of node 'a': object key 1.5 is not a string` is gone.
    dag = {"name": "keys", "nodes": {"a": {"type": "tool_call", "tool": "echo",
                                           "input": "{{ {1: 'a', 1.5: 'b', false: 'c', "
                                                    "none: {2: 'd'}} }}"}}}

    result = ax.run(dag, {}, home=tmp_path, timeout=20)

    assert result.status == "SUCCEEDED", result.errors
    assert result.outputs["a"] == {"1": "a", "1.5": "b", "false": "c", "null": {"2": "d"}}


def test_an_integer_too_long_for_text_is_a_template_limit(tmp_path: Path) -> None:
    dag = {"name": "text", "nodes": {"a": {"type": "tool_call", "tool": "echo",
                                           "input": "x{{ ('9' * 4300)|int + 1 }}"}}}

    result = ax.run(dag, {}, home=tmp_path, timeout=20)

    assert result.errors["a"] == ("input template: an integer longer than 4300 digits "
                                  "cannot be text"), result.errors
