"""Resume a paused node through the REST API: a user tool pauses for a vendor job and
the vendor's callback (``POST /v1/callbacks/{key}``) resumes it with its answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import axengine as ax
from executors.contract import NodeRequest, Paused
from executors.tools import REGISTRY
from tests.api.conftest import ServerFactory, wait_status


@pytest.fixture
def vendor_tool() -> Iterator[None]:
    """The tool below, registered for one test (the process registry is shared)."""
    ax.tool("test_vendor_job")(vendor_job)
    yield
    REGISTRY.unregister("test_vendor_job")


def vendor_job(order: str, request: NodeRequest) -> Any:
    """Submits a vendor job on the first run and pauses until the vendor calls back;
    the resumed run returns what the callback said, with the job it remembered."""
    if request.resume is None:
        return Paused(f"vendor job for {order} queued", checkpoint={"job": f"J-{order}",
                                                                  "key": request.resume_key})
    return {"job": request.checkpoint["job"], "vendor": request.resume}


@pytest.mark.integration
def test_a_vendor_callback_resumes_the_node_through_the_api(
        api_server: ServerFactory, vendor_tool: None) -> None:
    handle = api_server("embedded")
    client = handle.client("admin")
    dag = """
name: vendor_api
nodes:
  order:
    type: tool_call
    tool: test_vendor_job
    input: {order: "{{ .input.order }}"}
    timeout: 30
"""
    reply = client.post("/v1/tasks", json={"dag_yaml": dag, "input": {"order": "A7"}})
    assert reply.status_code == 201, reply.text
    task_id = reply.json()["task_id"]
    paused = wait_status(client, task_id, "PAUSED")
    node = paused["nodes"]["order"]
    assert node["state"] == "PAUSED" and node["evidence"] == "vendor job for A7 queued"
    key = node["checkpoint"]["key"]
    assert key.startswith(f"{task_id}~order~")

    approver: httpx.Client = handle.client("approve")
    wrong = approver.post(f"/v1/callbacks/{task_id}~order~{'0' * 64}", json={})
    assert wrong.status_code == 400 and "input revision" in wrong.text
    assert handle.client("submit").post(f"/v1/callbacks/{key}", json={}).status_code == 403
    answer = approver.post(f"/v1/callbacks/{key}", json={"status": "shipped"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "committed"
    done = wait_status(client, task_id, "SUCCEEDED")
    assert done["nodes"]["order"]["output"] == {"job": "J-A7", "vendor": {"status": "shipped"}}
    again = approver.post(f"/v1/callbacks/{key}", json={"status": "shipped"})
    assert again.status_code == 200 and again.json()["result"] == "already-done"
    kinds = [e["kind"] for e in client.get(f"/v1/tasks/{task_id}/events").json()["events"]]
    assert kinds.count("paused") == 1 and kinds.count("resumed") == 1
