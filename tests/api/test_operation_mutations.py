"""The REST operations after submit, called with hostile values: gate decisions, resume,
cancel, retry, fork, validation, listings, events, task and DAG reads, callbacks — on a
task paused at a gate. Each is answered with a 2xx or a 4xx, never a 5xx, and the
server stays healthy. A seeded sample (submit bodies: ``test_submit_mutations``)."""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

import httpx

from tests.api.conftest import GATE_YAML, ServerFactory, wait_status

CALLS = 600
HOSTILE: list[Any] = [
    None, True, -1, 0, 2**63, 10**400, 1e308, "", "x" * 3000, "\ud800", "{{ 7*7 }}", [], {},
    {"a": 1}, [[[[[[]]]]]], "approve", "reject", "draft", "review", "publish", "../x",
    "review/../draft", "%2F", "nodes[0]", "draft#2",
]
NODES = ["review", "draft", "publish", "x", "\ud800", "review\x00", "a/b", "review[0]"]


def _q(value: Any) -> str:
    """``value`` as a URL path segment or query value; a lone surrogate goes as the
    bytes UTF-8 cannot hold."""
    return quote(str(value), safe="", errors="surrogatepass")


def test_hostile_operations_get_a_client_error_never_a_server_error(
        api_server: ServerFactory) -> None:
    server = api_server("embedded")
    admin = server.client("admin")
    reply = admin.post("/v1/tasks", json={"dag_yaml": GATE_YAML, "input": {"text": "g"}})
    assert reply.status_code == 201, reply.text
    task = reply.json()["task_id"]
    wait_status(admin, task, "PAUSED")
    rng = random.Random("ax-operation-mutations")
    failures: list[tuple[str, str, str, int, str]] = []
    statuses: dict[int, int] = {}

    def send(method: str, url: str, body: Any = None) -> None:
        if body is None:
            response = admin.request(method, url)
        else:  # as ASCII JSON: a lone surrogate travels as its escape
            response = admin.request(method, url, content=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code >= 500:
            failures.append((method, url[:120], repr(body)[:200], response.status_code,
                             response.text[:200]))

    for _ in range(CALLS):
        v, w = rng.choice(HOSTILE), rng.choice(HOSTILE)
        node = _q(rng.choice(NODES))
        kind = rng.choice(["decision", "resume", "cancel", "retry", "fork", "validate",
                           "list", "events", "task", "callback", "approvals", "dag"])
        if kind == "decision":
            body: Any = {"decision": rng.choice(["approve", "reject", v]),
                         "comment": rng.choice(["", w]), "data": rng.choice([None, v])}
            send("POST", f"/v1/tasks/{task}/nodes/{node}/decision", body)
        elif kind == "resume":
            send("POST", f"/v1/tasks/{task}/nodes/{node}/resume", {"data": v})
        elif kind == "cancel":
            send("POST", f"/v1/tasks/{_q(v)}/cancel", {"reason": w})
        elif kind == "retry":
            send("POST", f"/v1/tasks/{task}/retry", {"from_node": v, "input": w})
        elif kind == "fork":
            send("POST", f"/v1/tasks/{task}/fork",
                 {"from_node": rng.choice(["draft", "review", v]), "output": w})
        elif kind == "validate":
            send("POST", "/v1/dags/validate", rng.choice(
                [{"dag_yaml": v}, {"dag": v}, {"dag_yaml": GATE_YAML, "file": v}, v]))
        elif kind == "list":
            field = rng.choice(["limit", "after", "status", "dag", "label", "page_token"])
            send("GET", f"/v1/tasks?{field}={_q(v)}")
        elif kind == "events":
            field = rng.choice(["after", "limit", "max_seq"])
            send("GET", f"/v1/tasks/{task}/events?{field}={_q(v)}")
        elif kind == "task":
            send("GET", f"/v1/tasks/{_q(v)}")
        elif kind == "callback":
            send("POST", f"/v1/callbacks/{_q(v)}", {"data": w})
        elif kind == "approvals":
            send("GET", f"/v1/approvals?limit={_q(v)}&page_token={_q(w)}")
        else:
            send("GET", f"/v1/dags/{_q(v)}")
    assert not failures, failures[:5]
    assert sum(n for code, n in statuses.items() if code >= 400) > CALLS // 2, statuses
    assert httpx.get(f"{server.url}/healthz").status_code == 200
