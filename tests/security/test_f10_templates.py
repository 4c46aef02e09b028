"""Finding 10: hostile templates passed ``ax validate`` and failed only when the node ran.

21 of 22 known sandbox-escape payloads were accepted by validation and stored with
their DAG; the error came when the node ran, and it said "input template" for a
prompt. Now the validator checks every template statically (names, ``_`` attributes,
calls, tags the sandbox refuses), so ``POST /v1/tasks`` answers 400 listing the problem
(node, field, code, line) and ``POST /v1/dags/validate`` answers ``valid: false``, with
nothing stored. Payloads that only the runtime budget can judge (``'a' * 10**9``) are
still refused by the sandbox when the node runs, and the error names the template.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.security.conftest import http, store_state
from tests.test_template_static import (
    ALL_PAYLOADS,
    RUNTIME_ONLY,
    SITE_LINE,
    hostile_dag,
)
from tests.topology import Topology, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITES = ("input", "prompt", "guard", "expression")
REFUSED_CODES = {"unsafe-template", "unknown-name", "template-syntax"}
#: Every payload the validator refuses, each at one site (rotating, so all four are hit).
HOSTILE = [
    (SITES[i % len(SITES)], name, source)
    for i, (name, source) in enumerate(n for n in ALL_PAYLOADS if n[0] not in RUNTIME_ONLY)
]


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """The shared deployment, with the reconciler idle after its first pass, so that the
    store's revision moves only if a request writes."""
    with Topology(executors=2, lease=5.0, reconcile_interval=600) as topo:
        yield topo


def _refusal(problems: list[dict[str, Any]], node: str, field: str, line: int) -> bool:
    return any(
        p["node"] == node and p["field"] == field and p["line"] == line
        and p["code"] in REFUSED_CODES and p["hint"]
        for p in problems
    )


def test_hostile_templates_are_refused_before_anything_is_stored(
        topology: Topology, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    before = store_state(topology)
    failures: list[str] = []
    with http(topology, "submitter") as client:
        for site, name, payload in HOSTILE:
            text, node, field = hostile_dag(site, payload.replace("{canary}", str(canary)))
            for body, line in (({"dag_yaml": text}, SITE_LINE[site]),
                               ({"dag": yaml.safe_load(text)}, 0)):
                submitted = client.post("/v1/tasks", json={**body, "input": {"x": 1}})
                checked = client.post("/v1/dags/validate", json=body)
                error = submitted.json().get("error", {})
                if submitted.status_code != 400 or error.get("type") != "DagError" \
                        or not _refusal(error.get("problems", []), node, field, line):
                    failures.append(f"{site}/{name} submit: {submitted.status_code} "
                                    f"{submitted.text[:300]}")
                reply = checked.json()
                if checked.status_code != 200 or reply.get("valid") is not False \
                        or not _refusal(reply.get("problems", []), node, field, line):
                    failures.append(f"{site}/{name} validate: {checked.status_code} "
                                    f"{checked.text[:300]}")
    assert failures == []
    assert store_state(topology) == before
    assert not canary.exists()


def test_payload_for_the_runtime_budget_fails_its_node_naming_the_prompt(
        topology: Topology) -> None:
    # Allowed names only: the static check cannot know 10**9 is too many; the sandbox
    # refuses it when the node runs, and the error says which template it was.
    dag = {"name": "f10_budget", "nodes": {
        "ask": {"type": "llm_call", "model": "sim-small", "prompt": "{{ 'a' * 10**9 }}"},
    }}
    with http(topology, "submitter") as client:
        assert client.post("/v1/dags/validate", json={"dag": dag}).json()["valid"] is True
        reply = client.post("/v1/tasks", json={"dag": dag, "input": {}})
        assert reply.status_code == 201, reply.text
        task_id = reply.json()["task_id"]
        task = wait_until(
            lambda: (lambda t: t if t["status"] in ("SUCCEEDED", "FAILED", "DEAD") else None)(
                client.get(f"/v1/tasks/{task_id}").json()),
            60, interval=0.2, what="the task with an over-budget prompt finished")
    assert task["status"] == "FAILED", task
    error = task["nodes"]["ask"]["error"]
    assert error.startswith("prompt template: "), error
    assert "repetition" in error, error
