"""Helpers of the tool-policy regression tests (f01, f03, f04): submit a one-node DAG as
the untrusted ``submitter`` and wait for the verdict, then read everything a task left
(outputs, errors, events) as one text to search for leaked secrets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx

from tests.security.conftest import http
from tests.topology import Topology, wait_until

__all__ = ["FINAL", "everything_about", "run_tool", "submit_tool", "wait_final"]

#: Task statuses that end a task.
FINAL = frozenset({"SUCCEEDED", "FAILED", "DEAD", "CANCELLED"})


def submit_tool(client: httpx.Client, tool: str, node_input: Any, *, retry: int = 0) -> str:
    """Submit a one-node DAG ``attack`` running ``tool`` on ``node_input``; its task id."""
    dag = {"name": f"attack-{tool}",
           "nodes": {"attack": {"type": "tool_call", "tool": tool, "input": node_input,
                                "retry": retry, "timeout": 30}}}
    response = client.post("/v1/tasks", json={"dag": dag, "input": {}})
    assert response.status_code == 201, response.text
    return str(response.json()["task_id"])


def wait_final(client: httpx.Client, task_ids: Sequence[str],
               timeout: float = 60.0) -> list[dict[str, Any]]:
    """Wait until every task is final; return their JSON views (in order)."""
    def done() -> list[dict[str, Any]] | None:
        views = [client.get(f"/v1/tasks/{t}").json() for t in task_ids]
        return views if all(v["status"] in FINAL for v in views) else None

    views: list[dict[str, Any]] = wait_until(done, timeout, interval=0.2,
                                             what=f"tasks {list(task_ids)} final")
    return views


def run_tool(topology: Topology, tool: str, inputs: Sequence[Any]) -> list[dict[str, Any]]:
    """As ``submitter``: one task per input, run to the end; the ``attack`` node of each."""
    with http(topology, "submitter") as client:
        ids = [submit_tool(client, tool, value) for value in inputs]
        views = wait_final(client, ids)
    return [{"task_id": t, **v["nodes"]["attack"]} for t, v in zip(ids, views, strict=True)]


def everything_about(topology: Topology, task_ids: Sequence[str]) -> str:
    """Every node, output, error and event of the tasks, as admin sees them (JSON)."""
    with http(topology, "admin") as client:
        parts = []
        for task_id in task_ids:
            parts.append(client.get(f"/v1/tasks/{task_id}").text)
            parts.append(client.get(f"/v1/tasks/{task_id}/events").text)
    return json.dumps(parts)
