"""A DAG's ``input_schema:`` is checked by ``Engine.submit``: a task input that does not
match is refused with an InputError naming the field path, and nothing is stored."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from axengine.dag import load_dag_text
from axengine.engine import Engine
from axengine.errors import InputError, NotFound
from axengine.records import NodeState
from tests.engine.conftest import run

DAG = """\
name: schema_checked
input_schema:
  type: object
  required: [pdf_url]
  properties:
    pdf_url: {type: string, pattern: "^https://"}
    pages: {type: integer, minimum: 1}
  additionalProperties: false
nodes:
  parse:
    type: tool_call
    tool: echo
    input: "{{ .input.pdf_url }}"
"""


@pytest.mark.parametrize(("task_input", "message"), [
    ({}, "input: 'pdf_url' is a required property"),
    ({"pdf_url": "http://x"}, "input.pdf_url: 'http://x' does not match '^https://'"),
    ({"pdf_url": "https://x", "pages": 0}, "input.pages: 0 is less than the minimum of 1"),
    ({"pdf_url": "https://x", "extra": 1}, "Additional properties are not allowed"),
    ([], "input: [] is not of type 'object'"),
])
def test_a_mismatching_input_is_refused_and_nothing_is_stored(
        make_engine: Callable[..., Engine], task_input: object, message: str) -> None:
    engine = make_engine()
    dag = load_dag_text(DAG, tools={"echo"}, models=set())

    async def scenario() -> None:
        with pytest.raises(InputError) as caught:
            await engine.submit(dag, task_input, idempotency_key="k1")
        assert message in str(caught.value)
        assert "does not match the DAG's input_schema" in str(caught.value)
        assert await engine.list_tasks() == []
        with pytest.raises(NotFound):
            await engine.get_dag(dag.hash)
        # The key was not taken: the same key with a good input creates the task.
        result = await engine.submit(dag, {"pdf_url": "https://x"}, idempotency_key="k1")
        assert result.created
        view = await engine.get_task(result.task_id)
        assert view.snapshots["parse"].state is NodeState.WAITING

    run(scenario())


def test_a_dag_without_input_schema_takes_any_input(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    dag = load_dag_text("name: any_input\n" + DAG.split("additionalProperties: false\n")[1],
                        tools={"echo"}, models=set())

    async def scenario() -> None:
        assert dag.input_schema is None
        result = await engine.submit(dag, {"pdf_url": 3})
        assert result.created

    run(scenario())
