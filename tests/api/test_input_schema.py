"""Through the REST API: a task input that does not match the DAG's ``input_schema:`` is
a 400 InputError naming the field, and the seed's old prompt form is a 400 DagError."""

from __future__ import annotations

from tests.api.conftest import ServerFactory

DAG_YAML = """\
name: schema_checked
input_schema:
  type: object
  required: [pdf_url]
  properties:
    pdf_url: {type: string}
nodes:
  parse: {type: tool_call, tool: echo, input: "{{ .input.pdf_url }}"}
"""


def test_a_mismatching_input_is_a_400_naming_the_field(api_server: ServerFactory) -> None:
    client = api_server("embedded").client("submit")

    response = client.post("/v1/tasks", json={"dag_yaml": DAG_YAML, "input": {"pdf_url": 7}})

    assert response.status_code == 400, response.text
    body = response.json()
    assert "InputError" in response.text
    assert "input.pdf_url: 7 is not of type 'string'" in str(body)
    assert client.get("/v1/tasks").json()["tasks"] == []
    ok = client.post("/v1/tasks", json={"dag_yaml": DAG_YAML, "input": {"pdf_url": "u"}})
    assert ok.status_code == 201, ok.text


def test_the_seed_prompt_reading_input_next_to_an_input_is_a_400(
        api_server: ServerFactory) -> None:
    client = api_server("embedded").client("submit")
    body = {"dag": {"nodes": {"hello": {
        "type": "llm_call", "model": "gpt-3.5-turbo",
        "prompt": "Say hello to user {{ .input.name }}", "input": {"name": "Alice"}}}}}

    response = client.post("/v1/tasks", json=body)

    assert response.status_code == 400, response.text
    assert "ambiguous-input" in response.text and "node.input" in response.text
