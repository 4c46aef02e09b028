"""Every class of REST rejection: the status, the error body, and nothing stored.

The servers here run no executor and reconcile once an hour, so the store revision
moves only when a request writes: a rejection must leave it where it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from axengine.engine import EngineConfig
from tests.api.conftest import GATE_YAML, SEED_BODY, ServerFactory, ServerHandle, wait_status

QUIET: dict[str, Any] = {"worker": False, "reconcile_interval": 3600.0}


@pytest.fixture
def quiet(api_server: ServerFactory) -> ServerHandle:
    return api_server("embedded", **QUIET)


@pytest.fixture
def unchanged(quiet: ServerHandle) -> Iterator[Callable[[httpx.Response], None]]:
    """``unchanged(response)``: assert the response changed nothing in the store."""
    before = quiet.revision()

    def check(response: httpx.Response) -> None:
        assert quiet.revision() == before, f"{response.status_code} {response.text} wrote"

    yield check
    assert quiet.revision() == before


def post_json(client: httpx.Client, url: str, body: Any) -> httpx.Response:
    """POST ``body`` as ASCII JSON: a lone surrogate travels as its ``\\ud800`` escape
    (httpx's ``json=`` cannot encode one)."""
    return client.post(url, content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})


def error_of(response: httpx.Response, status: int, type_: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] == type_, body
    message: str = body["error"]["message"]
    return message


def test_unknown_field_is_named(quiet: ServerHandle,
                                unchanged: Callable[[httpx.Response], None]) -> None:
    client = quiet.client("submit")
    response = client.post("/v1/tasks", json={**SEED_BODY, "dag_yml": "x"})
    assert "body.dag_yml: unknown field" in error_of(response, 400, "InputError")
    unchanged(response)
    response = client.post("/v1/tasks", json={**SEED_BODY, "priority": "high"})
    assert "body.priority" in error_of(response, 400, "InputError")
    unchanged(response)
    response = client.post("/v1/tasks", json={**SEED_BODY, "labels": {"n": 1}})
    assert "body.labels.n" in error_of(response, 400, "InputError")
    unchanged(response)
    # Not a number of seconds, though a lax parser takes true for 1 and "60" for 60.
    for wrong in (True, "60"):
        response = client.post("/v1/tasks", json={**SEED_BODY, "deadline_seconds": wrong})
        assert "body.deadline_seconds" in error_of(response, 400, "InputError")
        unchanged(response)


def test_malformed_json_names_line_and_column(
        quiet: ServerHandle, unchanged: Callable[[httpx.Response], None]) -> None:
    client = quiet.client("submit")
    response = client.post("/v1/tasks", content=b'{\n  "dag": {\n    "nodes": {,\n}',
                           headers={"Content-Type": "application/json"})
    message = error_of(response, 400, "InputError")
    assert "not valid JSON" in message and "line 3, column 15" in message, message
    unchanged(response)
    response = client.post("/v1/tasks", content=b'{"dag": {}}')  # no Content-Type
    assert "Content-Type: application/json" in error_of(response, 400, "InputError")
    unchanged(response)


def test_yaml_syntax_error_and_invalid_dag_list_problems(
        quiet: ServerHandle, unchanged: Callable[[httpx.Response], None]) -> None:
    client = quiet.client("submit")
    response = client.post("/v1/tasks", json={
        "dag_yaml": "name: x\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n"
                    "    input: {{ .input.x }}\n"})
    error_of(response, 400, "DagError")
    problem = response.json()["error"]["problems"][0]
    assert problem["line"] == 6 and problem["code"] == "unquoted-template"
    assert problem["file"] == "<request>" and "quote" in problem["hint"]
    unchanged(response)
    response = client.post("/v1/tasks", json={"dag": {"nodes": {"a": {
        "type": "lm_call", "model": "gpt-3.5-turbo", "prompt": "hi"}}}})
    error_of(response, 400, "DagError")
    problems = response.json()["error"]["problems"]
    assert problems[0]["node"] == "a" and problems[0]["field"] == "type"
    assert problems[0]["hint"]
    unchanged(response)


@pytest.mark.parametrize(("template", "expected"), [
    # A filter chain Python would refuse to compile (raw SyntaxError before: a 500).
    ("{{ .input.x" + "|string" * 250 + " }}", "nested deeper than 100 levels"),
    # One Jinja2's compiler would recurse on until RecursionError.
    ("{{ .input.x" + "|string" * 1000 + " }}", "nested deeper than 100 levels"),
    # Shallow as a tree, but Python allows 20 nested loops in the code it compiles to.
    ("{% for i in [1] %}" * 25 + "x" + "{% endfor %}" * 25,
     "nested too deeply (too many statically nested blocks)"),
])
def test_a_template_nested_too_deeply_is_a_dag_error_not_a_500(
        template: str, expected: str, quiet: ServerHandle,
        unchanged: Callable[[httpx.Response], None]) -> None:
    client = quiet.client("submit")
    response = client.post("/v1/tasks", json={"dag": {"name": "deep", "nodes": {"a": {
        "type": "tool_call", "tool": "echo", "input": {"v": template}}}}})
    assert expected in error_of(response, 400, "DagError")
    problem = response.json()["error"]["problems"][0]
    assert (problem["node"], problem["field"], problem["code"]) == (
        "a", "input.v", "template-syntax"), problem
    unchanged(response)


@pytest.mark.parametrize(("labels", "expected"), [
    ({"ax.forked_from": "t-x@a"}, "set by ax itself"),  # a forged fork origin
    ({"a=b": "1"}, "what a label selector can name"),
    ({"": "1"}, "what a label selector can name"),
    ({"k" * 129: "1"}, "what a label selector can name"),
    ({"team": "a\u0000b"}, "printable text"),
    ({"team": "\ud800"}, "printable text"),
    ({"team": "v" * 257}, "at most 256 characters"),
    ({f"k{i}": "v" for i in range(65)}, "the limit is 64"),
])
def test_labels_a_selector_cannot_name_or_ax_sets_are_refused(
        labels: dict[str, str], expected: str, quiet: ServerHandle,
        unchanged: Callable[[httpx.Response], None]) -> None:
    response = post_json(quiet.client("submit"), "/v1/tasks", {**SEED_BODY, "labels": labels})
    assert expected in error_of(response, 400, "InputError")
    unchanged(response)


@pytest.mark.parametrize("where", ["input", "node id", "name", "description"])
def test_a_lone_surrogate_in_a_dag_is_a_dag_error_not_a_500(
        where: str, quiet: ServerHandle, unchanged: Callable[[httpx.Response], None],
) -> None:
    node: dict[str, Any] = {"type": "tool_call", "tool": "echo", "input": "x"}
    dag: dict[str, Any] = {"name": "s", "nodes": {"e": node}}
    if where == "input":
        node["input"] = {"text": "a\ud800"}
    elif where == "node id":
        dag["nodes"] = {"e\ud800": node}
    elif where == "name":
        dag["name"] = "s\ud800"
    else:
        dag["description"] = "\ud800"
    response = post_json(quiet.client("submit"), "/v1/tasks", {"dag": dag})
    assert "not valid Unicode text" in error_of(response, 400, "DagError")
    unchanged(response)


def test_a_lone_surrogate_in_dag_yaml_is_a_dag_error_not_a_500(
        quiet: ServerHandle, unchanged: Callable[[httpx.Response], None]) -> None:
    # JSON can spell one ("\ud800"); the YAML parser cannot read it (it was a 500).
    yaml_text = GATE_YAML.replace("check {{", "che\ud800ck {{")
    response = post_json(quiet.client("submit"), "/v1/tasks",
                         {"dag_yaml": yaml_text, "input": {"text": "x"}})
    message = error_of(response, 400, "DagError")
    assert "a lone surrogate ('\\ud800') is not Unicode text" in message, message
    unchanged(response)


def test_exactly_one_dag_source(quiet: ServerHandle,
                                unchanged: Callable[[httpx.Response], None]) -> None:
    client = quiet.client("submit")
    for body in ({"input": {}}, {**SEED_BODY, "dag_yaml": GATE_YAML},
                 {"dag_hash": "not-hex!"}):
        response = client.post("/v1/tasks", json=body)
        error_of(response, 400, "InputError")
        unchanged(response)
    response = client.post("/v1/tasks", json={"dag_hash": "ab" * 32})
    assert "not stored" in error_of(response, 404, "NotFound")
    unchanged(response)


def test_oversized_bodies_get_413_before_parsing(
        api_server: ServerFactory) -> None:
    handle = api_server("embedded", max_body_bytes=4096, **QUIET)
    client = handle.client("submit")
    before = handle.revision()
    big = {**SEED_BODY, "input": {"blob": "x" * 5000}}
    response = client.post("/v1/tasks", json=big)
    assert "larger than 4096" in error_of(response, 413, "PayloadTooLarge")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"input": {"blob": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}, "dag_hash": "00"}'

    response = client.post("/v1/tasks", content=chunks(),
                           headers={"Content-Type": "application/json"})
    assert "larger than 4096" in error_of(response, 413, "PayloadTooLarge")
    assert handle.revision() == before
    ok = client.post("/v1/tasks", json=SEED_BODY)
    assert ok.status_code == 201


def test_oversized_input_is_refused_by_the_engine(api_server: ServerFactory) -> None:
    handle = api_server("embedded", engine_config=EngineConfig(max_input_bytes=100), **QUIET)
    client = handle.client("submit")
    before = handle.revision()
    response = client.post("/v1/tasks", json={**SEED_BODY, "input": {"x": "y" * 200}})
    assert "limit is 100" in error_of(response, 400, "InputError")
    assert handle.revision() == before


def test_idempotency_conflicts_store_nothing(quiet: ServerHandle) -> None:
    client = quiet.client("submit")
    first = client.post("/v1/tasks", json={**SEED_BODY, "idempotency_key": "same"})
    assert first.status_code == 201
    before = quiet.revision()
    other_input = client.post("/v1/tasks", json={**SEED_BODY, "idempotency_key": "same",
                                                 "input": {"other": 1}})
    assert "same" in error_of(other_input, 409, "Conflict")
    other_dag = client.post("/v1/tasks", json={"dag_yaml": GATE_YAML,
                                               "idempotency_key": "same"})
    assert first.json()["task_id"] in error_of(other_dag, 409, "Conflict")
    both = client.post("/v1/tasks", json={**SEED_BODY, "idempotency_key": "a"},
                       headers={"Idempotency-Key": "b"})
    error_of(both, 400, "InputError")
    assert quiet.revision() == before
    tasks = client.get("/v1/tasks").json()["tasks"]
    assert [t["task_id"] for t in tasks] == [first.json()["task_id"]]


def test_decision_rejections(api_server: ServerFactory) -> None:
    handle = api_server("embedded", reconcile_interval=3600.0)
    submit, approver = handle.client("submit"), handle.client("approve")
    task_id = submit.post("/v1/tasks", json={"dag_yaml": GATE_YAML,
                                             "input": {"text": "t"}}).json()["task_id"]
    wait_status(submit, task_id, "PAUSED")
    before = handle.revision()
    url = f"/v1/tasks/{task_id}/nodes"
    not_gate = approver.post(f"{url}/draft/decision", json={"decision": "approve"})
    assert "not a human_gateway" in error_of(not_gate, 400, "InputError")
    unknown_node = approver.post(f"{url}/nope/decision", json={"decision": "approve"})
    error_of(unknown_node, 400, "InputError")
    bad_value = approver.post(f"{url}/review/decision", json={"decision": "maybe"})
    assert "body.decision" in error_of(bad_value, 400, "InputError")
    not_text = post_json(approver, f"{url}/review/decision",
                         {"decision": "approve", "data": "\ud800"})
    assert "not valid Unicode text" in error_of(not_text, 400, "InputError")
    unknown_task = approver.post("/v1/tasks/t-missing/nodes/review/decision",
                                 json={"decision": "approve"})
    error_of(unknown_task, 404, "NotFound")
    assert handle.revision() == before
    assert approver.post(f"{url}/review/decision",
                         json={"decision": "reject"}).status_code == 200
    after = handle.revision()
    conflicting = approver.post(f"{url}/review/decision", json={"decision": "approve"})
    assert "already decided" in error_of(conflicting, 409, "Conflict")
    assert handle.revision() == after


def test_retry_and_cancel_rejections(quiet: ServerHandle) -> None:
    admin = quiet.client("admin")
    start = quiet.revision()
    error_of(admin.post("/v1/tasks/t-nope/cancel"), 404, "NotFound")
    error_of(admin.post("/v1/tasks/t-nope/retry", json={"from_node": "a"}), 404, "NotFound")
    assert quiet.revision() == start
    task_id = quiet.client("submit").post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    before = quiet.revision()
    waiting = admin.post(f"/v1/tasks/{task_id}/retry", json={"from_node": "hello"})
    assert "WAITING" in error_of(waiting, 409, "Conflict")
    unknown = admin.post(f"/v1/tasks/{task_id}/retry", json={"from_node": "nope"})
    error_of(unknown, 400, "InputError")
    no_node = admin.post(f"/v1/tasks/{task_id}/retry", json={})
    assert "body.from_node: field required" in error_of(no_node, 400, "InputError")
    extra = admin.post(f"/v1/tasks/{task_id}/cancel", json={"why": "x"})
    assert "body.why: unknown field" in error_of(extra, 400, "InputError")
    assert quiet.revision() == before


def test_unknown_routes_methods_and_queries(
        quiet: ServerHandle, unchanged: Callable[[httpx.Response], None]) -> None:
    client = quiet.client("admin")
    error_of(client.get("/v1/tasks/t-missing"), 404, "NotFound")
    error_of(client.get("/v1/tasks/t-missing/events"), 404, "NotFound")
    error_of(client.get("/v1/tasks/t-missing/watch"), 404, "NotFound")
    error_of(client.get("/v1/nothing"), 404, "NotFound")
    error_of(client.delete("/v1/tasks"), 405, "MethodNotAllowed")
    assert "unknown status" in error_of(client.get("/v1/tasks", params={"status": "DONE"}),
                                        400, "InputError")
    error_of(client.get("/v1/tasks", params={"limit": 0}), 400, "InputError")
    error_of(client.get("/v1/tasks", params={"label": "a=b=c"}), 400, "InputError")
    unchanged(client.get("/v1/tasks"))
