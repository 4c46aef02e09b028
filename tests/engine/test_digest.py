"""A value the engine hashes and stores — a node's output, a rendered input — is written
to JSON once: :meth:`_Builder.digest` keeps the text it hashed in the plan, and the
snapshot's write reuses it. The hash is the one :func:`sha256_json` gives."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from axengine import template
from axengine.dag import load_dag_text
from axengine.engine._refs import passed_output
from axengine.engine._rules import Plan, _Builder, sha256_json
from axengine.errors import InputError
from axengine.limits import (
    canonical_json,
    canonical_list,
    canonical_parts,
    json_text_bytes,
    keep_text,
    kept_text,
)
from axengine.testing import AsyncAxTestEngine
from axengine.worker import checked_outcome
from executors.contract import Failure, Success

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON, task=st.text(min_size=1), node=st.text(min_size=1))
def test_a_digest_is_the_hash_of_the_canonical_json(value: Any, task: str, node: str) -> None:
    builder = SimpleNamespace(plan=Plan("committed"))
    try:
        expected = sha256_json(value)
    except Exception as exc:  # (a lone surrogate in a text: both refuse it alike)
        expected = repr(exc)
    try:
        got = _Builder.digest(builder, value)  # type: ignore[arg-type]
    except Exception as exc:
        got = repr(exc)
    assert got == expected
    try:
        scoped = sha256_json([task, node, value])
    except Exception as exc:
        scoped = repr(exc)
    try:
        got = _Builder.digest(builder, value, scope=(task, node))  # type: ignore[arg-type]
    except Exception as exc:
        got = repr(exc)
    assert got == scoped
    if id(value) in builder.plan.encoded:
        kept, text, members = builder.plan.encoded[id(value)]
        assert kept is value and text == canonical_json(value)
        if members is not None:
            assert members == {k: canonical_json(v) for k, v in value.items()}


DAG = """
name: digest
nodes:
  make:
    type: tool_call
    tool: echo
    next: [{target: use}]
  use:
    type: tool_call
    tool: echo
    input: "{{ .nodes.make.output }}"
"""


def test_an_output_and_its_rendered_input_are_encoded_once_per_write(
        tmp_path: Path, monkeypatch: Any) -> None:
    output = {"items": [{"id": i, "name": f"item {i}", "tags": ["a", "é"]}
                        for i in range(200)]}
    size = len(canonical_json(output))
    written: list[int] = []  # the length of each large JSON text made
    original = json.JSONEncoder.encode

    def counting(self: json.JSONEncoder, value: Any) -> str:
        text = original(self, value)
        if len(text) >= size // 2:
            written.append(len(text))
        return text

    monkeypatch.setattr(json.JSONEncoder, "encode", counting)
    dag_file = tmp_path / "digest.yaml"
    dag_file.write_text(DAG)

    async def main() -> Any:
        async with AsyncAxTestEngine(tmp_path / "home") as engine:
            return await engine.run(dag_file, {}, stubs={"make": output, "use": {"ok": 1}})

    run = asyncio.run(main())
    times = len(written)
    monkeypatch.undo()
    assert run.result.status == "SUCCEEDED"
    make, use = run.snapshots["make"], run.snapshots["use"]
    assert make.output == output
    assert make.output_sha256 == sha256_json(output)
    params = {"input": output}
    assert use.input == params
    assert use.input_revision == sha256_json([run.task_id, "use", params])
    # Each text of the value made: make's output checked by the runner, which hands
    # its text on with the outcome; the engine hashes and stores the output from it.
    # use's input passes that output on (a copy of it): it is hashed and stored from
    # the same text when readied (its per-key copy, input_params, too), that text kept
    # for the writes of use's snapshot that follow (its completion). One; it was
    # eight, then three, then two.
    assert times == 1, written


@settings(max_examples=300, deadline=None)
@given(value=JSON)
def test_the_runners_check_gives_the_canonical_text_with_the_outcome(value: Any) -> None:
    # What the engine then hashes and stores (kept_text): the same text and members as
    # encoding the output itself, or the same refusal.
    outcome = checked_outcome(Success(value), "make")
    try:
        text, members = canonical_parts(value, "output of node 'make'")
        json_text_bytes(text, "output of node 'make'")
    except InputError as exc:
        assert outcome == Failure(str(exc), retryable=False)
        assert kept_text(outcome, value) is None
        return
    assert outcome == Success(value)
    kept = kept_text(outcome, value)
    assert kept is not None and kept[0] is value and kept[1:] == (text, members)
    if isinstance(value, dict | list):  # an equal copy is another value: not its text
        assert kept_text(outcome, copy.deepcopy(value)) is None
    if isinstance(value, dict):
        assert members == {k: canonical_json(v) for k, v in value.items()}


def test_a_kept_text_is_found_for_the_very_value_only() -> None:
    value = {"a": [1, 2]}
    outcome = Success(value)
    keep_text(outcome, value, '{"a":[1,2]}', {"a": "[1,2]"})
    assert kept_text(outcome, value) == (value, '{"a":[1,2]}', {"a": "[1,2]"})
    assert kept_text(outcome, {"a": [1, 2]}) is None  # equal, but another value
    assert kept_text(Success(value), value) is None  # nothing kept on that one
    keep_text(object(), value, "{}", None)  # no room for it: nothing kept, no error
    assert kept_text(object(), value) is None


@settings(max_examples=300, deadline=None)
@given(value=JSON, form=st.sampled_from(["{{ .nodes.make.output }}", "  {{nodes.make.output}}\n",
                                         "{{  .nodes.make.output  }}"]))
def test_an_input_that_passes_an_output_on_renders_equal_to_it(value: Any, form: str) -> None:
    # What lets such an input take the output's text (passed_output): its rendering is
    # equal to the output, of the same types, so its canonical JSON is the same.
    node = load_dag_text(DAG.replace('"{{ .nodes.make.output }}"', repr(form)
                                     .replace("'", '"'))).node("use")
    assert passed_output(node) == "make"
    rendered = template.render_value(node.input, template.template_context(
        input={}, nodes={"make": value}))
    assert rendered == value and _types(rendered) == _types(value)
    try:
        expected = canonical_json(value)
    except Exception as exc:  # (a lone surrogate in a text)
        expected = repr(exc)
    try:
        got = canonical_json(rendered)
    except Exception as exc:
        got = repr(exc)
    assert got == expected


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def test_only_a_whole_output_is_passed_on() -> None:
    for source in ("{{ .nodes.make.output.items }}", "{{ .nodes.make.output | tojson }}",
                   "x {{ .nodes.make.output }}", "{{ .nodes.make.output }}{{ .input }}",
                   "{{- .nodes.make.output -}}", "{{ .input }}"):
        node = load_dag_text(DAG.replace('"{{ .nodes.make.output }}"', repr(source)
                                         .replace("'", '"'))).node("use")
        assert passed_output(node) is None, source


@settings(max_examples=300, deadline=None)
@given(items=st.lists(JSON, max_size=5), obj=st.dictionaries(st.text(), JSON, max_size=5))
def test_texts_made_from_parts_are_the_canonical_json(items: list[Any],
                                                      obj: dict[str, Any]) -> None:
    # What the submit's payload hash and a snapshot's input are written from.
    assert canonical_list(canonical_json(item) for item in items) == canonical_json(items)
    text, members = canonical_parts(obj)
    assert text == canonical_json(obj)
    assert members == {k: canonical_json(v) for k, v in obj.items()}
