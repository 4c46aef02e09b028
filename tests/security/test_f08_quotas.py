"""Finding 8 and the four-eyes rule: what one submitter may ask for.

One submitter held every worker slot with ``timeout: 1e15``, ``lane: fast`` and
``priority: 2147483647``; an admin approved its own task's gate. Through the real API
(etcd + Redis + ``ax api`` + 2 executors): refusals name the node, field, role or
limit, and each refusal leaves the store untouched (revision and key set).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.conftest import changed_keys, http, store_state
from tests.topology import Topology, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Unfinished tasks one principal may have in this module's deployment.
ACTIVE_LIMIT = 3

GATE_YAML = """\
name: quota_gate
nodes:
  review:
    type: human_gateway
    timeout: 3600
"""

FOUR_EYES_YAML = """\
name: four_eyes_gate
nodes:
  review:
    type: human_gateway
    four_eyes: true
    timeout: 3600
"""


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """The module's deployment: default timeout/deadline bounds, a small active limit."""
    with Topology(executors=2, lease=5.0, api_args=[
            "--max-active-tasks-per-principal", str(ACTIVE_LIMIT)]) as topo:
        yield topo


def _tool_dag(**node: Any) -> dict[str, Any]:
    return {"name": "quota_probe", "nodes": {"work": {
        "type": "tool_call", "tool": "echo", "input": {"x": 1}, **node}}}


def _refused(topology: Topology, who: str, body: dict[str, Any], status: int) -> str:
    before = store_state(topology)
    with http(topology, who) as client:
        reply = client.post("/v1/tasks", json=body)
    assert reply.status_code == status, reply.text
    # Nothing but the reconciler's leadership record moves while the API refuses.
    assert store_state(topology).keys == before.keys, "a refused submit must store nothing"
    assert changed_keys(topology, before.revision) == set()
    return str(reply.json()["error"]["message"])


@pytest.mark.parametrize("field", ["timeout", "stall_timeout", "queue_timeout"])
def test_huge_node_timeouts_are_refused(topology: Topology, field: str) -> None:
    # stall_timeout may not exceed timeout (a DAG rule), so both are huge there.
    node = {"timeout": 1e15 if field != "queue_timeout" else 60, field: 1e15}
    message = _refused(topology, "submitter", {"dag": _tool_dag(**node)}, 400)
    assert "'work'" in message and "limit" in message and "timeout" in message


def test_huge_deadlines_are_refused(topology: Topology) -> None:
    message = _refused(topology, "submitter",
                       {"dag": _tool_dag(), "deadline_seconds": 1e15}, 400)
    assert "deadline_seconds" in message and "limit" in message
    dag = {**_tool_dag(), "deadline": 1e12}
    assert "deadline" in _refused(topology, "submitter", {"dag": dag}, 400)


def test_fast_lane_and_high_priority_need_the_expedite_role(topology: Topology) -> None:
    message = _refused(topology, "submitter", {"dag": _tool_dag(lane="fast")}, 403)
    assert "expedite" in message and "'work'" in message
    message = _refused(topology, "submitter",
                       {"dag": _tool_dag(), "priority": 2147483647}, 403)
    assert "expedite" in message and "2147483647" in message
    # admin implies expedite.
    with http(topology, "admin") as admin:
        reply = admin.post("/v1/tasks", json={"dag": _tool_dag(lane="fast"), "priority": 5})
        assert reply.status_code == 201, reply.text


def test_active_tasks_per_principal_are_bounded(topology: Topology,
                                                record_property: Any) -> None:
    with http(topology, "submitter") as client:
        made = []
        for i in range(ACTIVE_LIMIT):
            reply = client.post("/v1/tasks", json={"dag_yaml": GATE_YAML,
                                                   "idempotency_key": f"k{i}"})
            assert reply.status_code == 201, reply.text
            made.append(reply.json()["task_id"])
        task = client.get(f"/v1/tasks/{made[0]}").json()
        assert task["submitted_by"] == "topology-submitter"
        # At the limit, a repeat of a submit creates nothing and is not refused: it
        # answers with the task it made.
        again = client.post("/v1/tasks", json={"dag_yaml": GATE_YAML,
                                               "idempotency_key": "k1"})
        assert again.status_code == 200, again.text
        assert again.json() | {"dag_hash": ""} == {"task_id": made[1], "created": False,
                                                   "dag_hash": ""}
    message = _refused(topology, "submitter", {"dag_yaml": GATE_YAML,
                                               "idempotency_key": "new"}, 429)
    assert f"has {ACTIVE_LIMIT} unfinished tasks" in message and f"is {ACTIVE_LIMIT}" in message
    # Another principal is not affected.
    with http(topology, "submitter2") as other:
        reply = other.post("/v1/tasks", json={"dag_yaml": GATE_YAML})
        assert reply.status_code == 201, reply.text
    # A finished task frees its slot (the active index entry goes with the final status).
    with http(topology, "admin") as admin:
        reply = admin.post(f"/v1/tasks/{made[0]}/cancel")
        assert reply.status_code == 200, reply.text
        assert reply.json()["task"]["status"] == "CANCELLED", reply.text
    with http(topology, "submitter") as client:
        reply = client.post("/v1/tasks", json={"dag_yaml": GATE_YAML})
        assert reply.status_code == 201, reply.text
    record_property("summary", f"submit {ACTIVE_LIMIT + 1} refused 429 {message!r}; "
                    "submitter2 unaffected; a cancelled task freed its slot")


def test_four_eyes_gate_refuses_its_submitter(topology: Topology) -> None:
    with http(topology, "admin") as admin, http(topology, "approver") as approver:
        task_id = admin.post("/v1/tasks", json={"dag_yaml": FOUR_EYES_YAML}).json()["task_id"]
        wait_until(lambda: admin.get(f"/v1/tasks/{task_id}").json()["status"] == "PAUSED",
                   30, what="the gate to wait")
        before = store_state(topology)
        reply = admin.post(f"/v1/tasks/{task_id}/nodes/review/decision",
                           json={"decision": "approve"})
        assert reply.status_code == 403, reply.text
        assert reply.json()["error"]["message"].startswith("four-eyes rule:")
        assert store_state(topology).keys == before.keys
        assert changed_keys(topology, before.revision) == set()
        reply = approver.post(f"/v1/tasks/{task_id}/nodes/review/decision",
                              json={"decision": "approve"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["node"]["decision"]["by"] == "topology-approver"
