"""REST end to end against a real uvicorn, on the embedded store and on etcd + Redis."""

from __future__ import annotations

import json
from typing import Any

from tests.api.conftest import (
    GATE_YAML,
    ROOT,
    SEED_BODY,
    ServerFactory,
    sse_messages,
    wait_final,
    wait_status,
)


def test_seed_curl_body_runs_to_success(api_server: ServerFactory, backend: str) -> None:
    handle = api_server(backend)
    client = handle.client("submit")
    # The seed's curl (plus the token), with `.node.input` where the seed reads the
    # node's own input as `.input` (that form is `ambiguous-input` now, see
    # tests/api/test_input_schema.py).
    body = ('{"dag": {"nodes": {"hello": {"type": "llm_call", "model": "gpt-3.5-turbo", '
            '"prompt": "Say hello to user {{ .node.input.name }}", "input": {"name": "Alice"}}}}}')
    response = client.post("/v1/tasks", content=body,
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 201, response.text
    reply = response.json()
    assert reply["created"] is True and reply["task_id"].startswith("t-")
    assert len(reply["dag_hash"]) == 64
    task = wait_final(client, reply["task_id"])
    assert task["status"] == "SUCCEEDED"
    assert task["dag_name"].startswith("inline-") and len(task["dag_name"]) == 15
    hello = task["nodes"]["hello"]
    # The prompt was rendered by the API against the node's own input.
    assert hello["input"]["prompt"] == "Say hello to user Alice"
    assert hello["state"] == "SUCCEEDED" and hello["attempt"] == 1 and hello["fence"] == 1
    assert "Say hello to user Alice" in hello["output"]["text"]
    assert hello["type"] == "llm_call"


def test_financial_dag_completes_through_server_wiring(api_server: ServerFactory,
                                                       backend: str) -> None:
    handle = api_server(backend)
    client = handle.client("submit")
    dag_yaml = (ROOT / "dags" / "financial_risk_assessment.yaml").read_text()
    task_input = json.loads((ROOT / "dags" / "inputs" / "financial_risk_assessment.json")
                            .read_text())
    response = client.post("/v1/tasks", json={"dag_yaml": dag_yaml, "input": task_input,
                                              "labels": {"team": "risk"}})
    assert response.status_code == 201, response.text
    task = wait_final(client, response.json()["task_id"])
    assert task["status"] == "SUCCEEDED", {n: (v["state"], v["error"])
                                           for n, v in task["nodes"].items()}
    nodes = task["nodes"]
    assert list(nodes) == ["parse_pdf", "extract_metrics", "assess_risk",
                           "send_high_risk_email", "notify_high_risk",
                           "send_medium_risk_email", "send_low_risk_email", "send_alert",
                           "log_completion"]
    assert nodes["parse_pdf"]["output"]["status"] == "success"
    label = nodes["assess_risk"]["output"]
    assert label in ("high_risk", "medium_risk", "low_risk")
    taken = [h["target"] for h in nodes["assess_risk"]["next_hops"] if h["taken"]]
    assert len(taken) == 1 and nodes[taken[0]]["state"] in ("SUCCEEDED", "PAUSED")
    # The email went through the outbox: its record is listed with its node, only there.
    sent = nodes[taken[0]]["effects"]
    assert [(e["state"], e["key"]) for e in sent] == [
        ("DONE", f"email:{task['task_id']}:{taken[0]}:{sent[0]['key'].split(':')[-1]}")]
    assert sent[0]["result"] is not None
    assert [n for n, v in nodes.items() if v["effects"]] == [taken[0]]
    assert nodes["send_alert"]["state"] == "SKIPPED"
    assert nodes["log_completion"]["state"] == "SUCCEEDED"
    assert task["labels"] == {"team": "risk"}


def test_gate_decision_flow_and_events(api_server: ServerFactory, backend: str) -> None:
    handle = api_server(backend)
    submit, approver = handle.client("submit"), handle.client("approve")
    response = submit.post("/v1/tasks", json={"dag_yaml": GATE_YAML, "input": {"text": "hi"}})
    assert response.status_code == 201, response.text
    task_id = response.json()["task_id"]
    paused = wait_status(submit, task_id, "PAUSED")
    gate = paused["nodes"]["review"]
    assert gate["state"] == "PAUSED" and gate["input"]["description"] == "check hi"
    decided = approver.post(f"/v1/tasks/{task_id}/nodes/review/decision",
                            json={"decision": "approve", "comment": "looks fine"})
    assert decided.status_code == 200, decided.text
    assert decided.json()["result"] == "committed"
    decision = decided.json()["node"]["decision"]
    assert decision["decision"] == "approve" and decision["by"] == "approver"
    assert decision["comment"] == "looks fine"
    again = approver.post(f"/v1/tasks/{task_id}/nodes/review/decision",
                          json={"decision": "approve"})
    assert again.status_code == 200 and again.json()["result"] == "already-done"
    task = wait_final(submit, task_id)
    assert task["status"] == "SUCCEEDED" and task["nodes"]["publish"]["state"] == "SUCCEEDED"
    events = submit.get(f"/v1/tasks/{task_id}/events").json()
    kinds = [e["kind"] for e in events["events"]]
    assert kinds[0] == "submitted" and "paused" in kinds and "decided" in kinds
    assert kinds[-1] == "task_succeeded"
    seqs = [e["seq"] for e in events["events"]]
    assert seqs == sorted(seqs) and events["last_seq"] == seqs[-1]
    # Paging by after_seq never splits a transaction and never repeats an event.
    first = submit.get(f"/v1/tasks/{task_id}/events", params={"limit": 2}).json()
    rest = submit.get(f"/v1/tasks/{task_id}/events",
                      params={"after_seq": first["last_seq"]}).json()
    ids = [e["event_id"] for e in first["events"] + rest["events"]]
    assert ids == [e["event_id"] for e in events["events"]]


def test_watch_streams_every_event_until_final(api_server: ServerFactory) -> None:
    handle = api_server("embedded")
    client = handle.client("submit")
    task_id = client.post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    messages = sse_messages(client, f"/v1/tasks/{task_id}/watch")
    assert messages[-1] == {"event": "end",
                            "data": {"task_id": task_id, "status": "SUCCEEDED"}}
    streamed = [m["data"]["event_id"] for m in messages[:-1]]
    stored = [e["event_id"] for e in client.get(f"/v1/tasks/{task_id}/events")
              .json()["events"]]
    assert streamed == stored
    assert all(m["id"] == str(m["data"]["seq"]) for m in messages[:-1])
    # Resuming after the last seen seq replays nothing but still ends.
    resumed = sse_messages(client, f"/v1/tasks/{task_id}/watch",
                           after_seq=messages[-2]["data"]["seq"])
    assert [m["event"] for m in resumed] == ["end"]


def test_watch_follows_live_transitions(api_server: ServerFactory) -> None:
    handle = api_server("embedded")
    submit, approver = handle.client("submit"), handle.client("approve")
    task_id = submit.post("/v1/tasks", json={"dag_yaml": GATE_YAML,
                                             "input": {"text": "x"}}).json()["task_id"]
    wait_status(submit, task_id, "PAUSED")
    seen: list[str] = []
    with submit.stream("GET", f"/v1/tasks/{task_id}/watch") as stream:
        lines = stream.iter_lines()
        for line in lines:  # replay up to the pause
            if line.startswith("data:"):
                seen.append(json.loads(line[5:])["kind"])
                if seen[-1] == "task_paused":
                    break
        # The stream is open and idle: the decision arrives through the store watch.
        assert approver.post(f"/v1/tasks/{task_id}/nodes/review/decision",
                             json={"decision": "reject"}).status_code == 200
        for line in lines:
            if line.startswith("data:"):
                seen.append(json.loads(line[5:]).get("kind", "end"))
    assert seen[-1] == "end"
    assert "decided" in seen and "task_succeeded" in seen
    assert seen.index("task_paused") < seen.index("decided")


def test_list_filters_and_pages(api_server: ServerFactory, backend: str) -> None:
    handle = api_server(backend, worker=False)
    client = handle.client("submit")
    ids = []
    for i in range(5):
        response = client.post("/v1/tasks", json={**SEED_BODY, "labels": {
            "team": "risk" if i % 2 else "ops", "n": str(i)}})
        assert response.status_code == 201
        ids.append(response.json()["task_id"])
    page1 = client.get("/v1/tasks", params={"limit": 2}).json()
    assert len(page1["tasks"]) == 2 and page1["next_page_token"]
    seen = [t["task_id"] for t in page1["tasks"]]
    token = page1["next_page_token"]
    while token:
        page = client.get("/v1/tasks", params={"limit": 2, "page_token": token}).json()
        seen += [t["task_id"] for t in page["tasks"]]
        token = page["next_page_token"]
    assert seen == ids[::-1]  # newest first (the creation-time index)
    risk = client.get("/v1/tasks", params={"label": "team=risk"}).json()["tasks"]
    assert sorted(t["task_id"] for t in risk) == sorted(ids[1::2])
    not_risk = client.get("/v1/tasks", params={"label": "team!=risk,n"}).json()["tasks"]
    assert sorted(t["task_id"] for t in not_risk) == sorted(ids[0::2])
    running = client.get("/v1/tasks", params={"status": "RUNNING",
                                              "dag": "inline-800abc78"}).json()["tasks"]
    assert len(running) == 5 and all("nodes" not in t for t in running)
    assert client.get("/v1/tasks", params={"status": "SUCCEEDED"}).json()["tasks"] == []


def test_idempotent_submit_returns_the_same_task(api_server: ServerFactory,
                                                 backend: str) -> None:
    # No reconciler pass in between: a pass may renew its leadership, moving the revision.
    handle = api_server(backend, worker=False, reconcile_interval=3600.0)
    client = handle.client("submit")
    first = client.post("/v1/tasks", json=SEED_BODY, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201 and first.json()["created"] is True
    revision = handle.revision()
    again = client.post("/v1/tasks", json={**SEED_BODY, "idempotency_key": "k-1"})
    assert again.status_code == 200
    assert again.json() == {**first.json(), "created": False}
    assert handle.revision() == revision
    task = client.get(f"/v1/tasks/{first.json()['task_id']}").json()
    assert task["idempotency_key"] == "k-1"


def test_submit_by_hash_cancel_and_retry(api_server: ServerFactory) -> None:
    handle = api_server("embedded", worker=False)
    submit, admin = handle.client("submit"), handle.client("admin")
    first = submit.post("/v1/tasks", json=SEED_BODY).json()
    dag = submit.get(f"/v1/dags/{first['dag_hash']}").json()
    assert dag["hash"] == first["dag_hash"] and "hello" in dag["dag"]["nodes"]
    # A priority above 0 needs the expedite role, which admin implies.
    second = admin.post("/v1/tasks", json={"dag_hash": first["dag_hash"], "priority": 3,
                                           "deadline_seconds": 600})
    assert second.status_code == 201 and second.json()["dag_hash"] == first["dag_hash"]
    task_id = second.json()["task_id"]
    task = submit.get(f"/v1/tasks/{task_id}").json()
    assert task["priority"] == 3 and task["deadline"] > task["created_at"] + 590
    cancelled = admin.post(f"/v1/tasks/{task_id}/cancel", json={"reason": "test"})
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["task"]["status"] == "CANCELLED"
    assert admin.post(f"/v1/tasks/{task_id}/cancel").json()["result"] == "already-done"
    retried = admin.post(f"/v1/tasks/{task_id}/retry", json={"from_node": "hello"})
    assert retried.status_code == 200, retried.text
    assert retried.json()["task"]["status"] == "RUNNING"
    node = submit.get(f"/v1/tasks/{task_id}").json()["nodes"]["hello"]
    assert node["state"] == "WAITING"
    events = [e["kind"] for e in submit.get(f"/v1/tasks/{task_id}/events").json()["events"]]
    assert "cancelled" in events and "retried" in events


def test_validate_reports_problems_and_stores_nothing(api_server: ServerFactory) -> None:
    # No reconciler pass in between: a pass may renew its leadership, moving the revision.
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    client = handle.client("submit")
    revision = handle.revision()
    good = client.post("/v1/dags/validate", json={"dag_yaml": GATE_YAML})
    assert good.status_code == 200
    assert good.json()["valid"] is True and good.json()["name"] == "gated"
    bad = client.post("/v1/dags/validate", json={
        "dag_yaml": "name: bad\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n"
                    "    next: nowhere\n", "file": "bad.yaml"})
    body = bad.json()
    assert bad.status_code == 200 and body["valid"] is False and body["hash"] is None
    problem = body["problems"][0]
    assert problem["file"] == "bad.yaml" and problem["line"] == 6
    assert problem["node"] == "a" and "nowhere" in problem["message"]
    assert handle.revision() == revision
    assert client.get(f"/v1/dags/{good.json()['hash']}").status_code == 404


def test_openapi_docs_health_and_metrics(api_server: ServerFactory) -> None:
    handle = api_server("embedded")
    anonymous = handle.client(None)
    spec = anonymous.get("/openapi.json")
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    for path in ("/v1/tasks", "/v1/tasks/{task_id}", "/v1/tasks/{task_id}/events",
                 "/v1/tasks/{task_id}/watch", "/v1/tasks/{task_id}/cancel",
                 "/v1/tasks/{task_id}/retry", "/v1/tasks/{task_id}/fork",
                 "/v1/dags/validate",
                 "/v1/tasks/{task_id}/nodes/{node_id}/decision"):
        assert path in paths, path
    assert "HTTPBearer" in spec.json()["components"]["securitySchemes"]
    assert "SubmitBody" in spec.json()["components"]["schemas"]
    assert anonymous.get("/docs").status_code == 200
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    ready = anonymous.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    client = handle.client("submit")
    task_id = client.post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    wait_final(client, task_id)
    text = anonymous.get("/metrics").text
    assert 'ax_node_outcomes_total{node_type="llm_call",outcome="committed"} 1.0' in text
    assert 'ax_tasks_finished_total{status="SUCCEEDED"} 1.0' in text
    assert 'ax_queue_depth{lane="default"} 0.0' in text
    assert "ax_snapshot_write_seconds_count{result=\"committed\"}" in text
    assert 'route="/v1/tasks",method="POST"' in text or \
        'method="POST",route="/v1/tasks"' in text


HIGH_RISK = {"revenue_growth": 0.3, "net_profit_margin": 0.05, "debt_to_equity": 1.0}


def test_fork_a_finished_task_at_a_node_with_a_set_output(api_server: ServerFactory) -> None:
    handle = api_server("embedded")
    submit, admin = handle.client("submit"), handle.client("admin")
    dag_yaml = (ROOT / "dags" / "financial_risk_assessment.yaml").read_text()
    task_input = json.loads((ROOT / "dags" / "inputs" / "financial_risk_assessment.json")
                            .read_text())
    created = submit.post("/v1/tasks", json={"dag_yaml": dag_yaml, "input": task_input})
    source_id = created.json()["task_id"]
    source = wait_final(submit, source_id)
    assert source["nodes"]["assess_risk"]["output"] == "medium_risk"
    path = f"/v1/tasks/{source_id}/fork"
    body = {"from_node": "extract_metrics", "output": HIGH_RISK}
    assert submit.post(path, json=body).status_code == 403  # admin only
    forked = admin.post(path, json=body)
    assert forked.status_code == 201, forked.text
    reply = forked.json()
    assert reply["forked_from"] == f"{source_id}@extract_metrics"
    fork = submit.get(f"/v1/tasks/{reply['task']['task_id']}").json()
    # The set output decided the edges in the fork's first transaction: high risk.
    assert fork["status"] == "PAUSED"
    assert fork["labels"]["ax.forked_from"] == f"{source_id}@extract_metrics"
    assert fork["nodes"]["assess_risk"]["output"] == "high_risk"
    assert fork["nodes"]["send_high_risk_email"]["state"] == "PAUSED"
    assert fork["nodes"]["parse_pdf"]["output"] == source["nodes"]["parse_pdf"]["output"]
    assert submit.get(f"/v1/tasks/{source_id}").json() == source
    kinds = [e["kind"] for e in submit.get(f"/v1/tasks/{fork['task_id']}/events")
             .json()["events"]]
    assert "forked" in kinds
    unknown = admin.post(path, json={"from_node": "extract"})
    assert unknown.status_code == 400 and "extract" in unknown.text
    never = admin.post(path, json={"from_node": "send_alert"})
    assert never.status_code == 409 and "never reached" in never.text
    running = admin.post(f"/v1/tasks/{fork['task_id']}/fork", json={"from_node": "parse_pdf"})
    assert running.status_code == 409 and "fork a finished task" in running.text


SUBDAG_PARENT = """\
name: publishing
nodes:
  draft:
    type: tool_call
    tool: echo
    input: "{{ .input.text }}"
    next: review
  review:
    type: dag
    dag: flows/approval.yaml
    input: {doc: "{{ .nodes.draft.output }}"}
    next: publish
  publish:
    type: tool_call
    tool: echo
    input: "{{ .nodes.review.output }}"
"""
SUBDAG_CHILD = """\
name: approval
output: "{{ .nodes.person.output.decision }}"
nodes:
  person:
    type: human_gateway
    input: "{{ .input.doc }}"
"""


def test_a_sub_dag_file_is_inlined_by_the_client_and_its_gate_decided_by_its_path(
        api_server: ServerFactory, tmp_path: Any) -> None:
    from axengine.client import Client
    from tests.api.conftest import AUTH

    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "approval.yaml").write_text(SUBDAG_CHILD)
    (tmp_path / "publishing.yaml").write_text(SUBDAG_PARENT)
    handle = api_server("embedded")
    raw = handle.client("submit")
    # The server reads no file a submitter names.
    refused = raw.post("/v1/tasks", json={"dag_yaml": SUBDAG_PARENT, "input": {"text": "x"}})
    assert refused.status_code == 400, refused.text
    assert "bad-subdag" in refused.text and "inline the sub-DAG" in refused.text
    token = AUTH["admin"]["Authorization"].removeprefix("Bearer ")
    with Client(handle.url, token) as client:
        task_id = client.submit(tmp_path / "publishing.yaml", {"text": "hello"}).task_id
        paused = wait_status(raw, task_id, "PAUSED")
        assert paused["nodes"]["review/person"]["state"] == "PAUSED"
        assert paused["nodes"]["review"]["state"] == "RUNNING"
        # A slash in the node id goes in the path as it is.
        decided = handle.client("approve").post(
            f"/v1/tasks/{task_id}/nodes/review/person/decision", json={"decision": "approve"})
        assert decided.status_code == 200, decided.text
        task = wait_final(raw, task_id)
    assert task["status"] == "SUCCEEDED"
    assert task["nodes"]["review"]["output"] == "approve"
    assert task["nodes"]["publish"]["output"] == "approve"


def test_a_path_no_route_matches_is_a_404_naming_it_and_never_a_redirect(
        api_server: ServerFactory) -> None:
    client = api_server("embedded").client("admin")
    for method, path, message in (
            ("GET", "/v1/tasks/", "no route GET /v1/tasks/: routes take no trailing slash "
                                  "(/v1/tasks)"),
            ("POST", "/v1/tasks/", "no route POST /v1/tasks/: routes take no trailing "
                                   "slash (/v1/tasks)"),
            ("GET", "/v1/tasks/t-1/events/", "no route GET /v1/tasks/t-1/events/: routes "
                                             "take no trailing slash (/v1/tasks/t-1/events)"),
            ("GET", "/v1/tasks/%2F", "no route GET /v1/tasks/%2F"),
            ("GET", "/v1/tasks/%2F/events", "no route GET /v1/tasks/%2F/events"),
            ("GET", "/v1/nothing/", "no route GET /v1/nothing/")):
        reply = client.request(method, path, json={} if method == "POST" else None)
        assert reply.status_code == 404, (method, path, reply.status_code)
        assert "location" not in reply.headers
        assert reply.json() == {"error": {"type": "NotFound", "message": message}}
    assert client.get("/v1/tasks").status_code == 200  # the route itself
