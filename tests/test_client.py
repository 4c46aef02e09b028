"""The SDK client (``ax.Client`` / ``ax.AsyncClient``) against a running ``ax api``.

The topology (tests/topology.py) runs etcd, Redis, the API and one executor as real
processes; every test here goes through REST with a bearer token. Pure parts of the
client (error mapping, the event-stream parser, retry on a refused connection) are
tested without a server at the end; ``tests/test_wire.py`` covers the vocabulary and
the error table they share with the server.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

import axengine as ax
from axengine.cli import main as cli_main
from axengine.client import AsyncClient, Client, error_from_response
from axengine.client._core import Core, SseParser
from axengine.dag import load_dag
from axengine.errors import (
    ApiUnavailable,
    AxError,
    Conflict,
    DagError,
    Forbidden,
    InputError,
    NotFound,
    StoreUnavailable,
    TemplateSecurityError,
    Unauthorized,
)
from axengine.wire import RunResult
from tests.servers import free_port
from tests.topology import REPO, Topology, wait_until

pytestmark = pytest.mark.integration

FINANCIAL = REPO / "dags" / "financial_risk_assessment.yaml"
ACME = {"pdf_url": "dags/inputs/acme_annual_report.pdf"}
ACME_PATH = ["parse_pdf", "extract_metrics", "assess_risk", "send_medium_risk_email",
             "log_completion"]

GATE_DAG = """\
name: sdk_gate
nodes:
  draft:
    type: tool_call
    tool: echo
    input: {text: "{{ .input.text }}"}
    next: review
  review:
    type: human_gateway
    description: "Publish {{ .input.text }}?"
    input: "{{ .nodes.draft.output }}"
    timeout: 600
    next:
      - condition: "{{ .output.decision == 'approve' }}"
        target: publish
  publish:
    type: tool_call
    tool: echo
    input: "published {{ .input.text }}"
"""

SLEEP_DAG = """\
name: sdk_sleep
nodes:
  nap:
    type: tool_call
    tool: sleep
    input: "{{ .input.seconds }}"
    timeout: 120
"""


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    with Topology(executors=1, concurrency=4, lease=5.0) as topo:
        yield topo


@pytest.fixture
def client(topology: Topology) -> Iterator[Client]:
    with ax.Client(topology.api_url, topology.admin_token, timeout=30) as c:
        yield c


def test_ax_client_runs_the_financial_dag_from_a_path(client: Client,
                                                       topology: Topology) -> None:
    assert ax.Client is Client
    result = client.run(FINANCIAL, ACME, timeout=60)
    assert isinstance(result, RunResult)
    assert result.ok and result.status == "SUCCEEDED"
    assert list(result.path) == ACME_PATH
    assert result.states["send_high_risk_email"] == "SKIPPED"
    assert result.outputs["send_medium_risk_email"]["status"] == "sent"
    assert result.outputs["assess_risk"] == "medium_risk"
    mails = [m for m in topology.emails() if result.task_id in m["X-Ax-Idempotency-Key"]]
    assert len(mails) == 1 and mails[0]["Subject"].startswith("Medium risk")


def test_submit_accepts_a_dag_object_a_mapping_and_yaml_text(client: Client) -> None:
    dag = load_dag(FINANCIAL)
    by_object = client.submit(dag, ACME, idempotency_key="forms-object")
    by_mapping = client.submit(dag.canonical(), ACME, idempotency_key="forms-mapping")
    by_text = client.submit(FINANCIAL.read_text(), ACME, idempotency_key="forms-text")
    assert by_object.dag_hash == by_mapping.dag_hash == by_text.dag_hash == dag.hash
    assert len({by_object.task_id, by_mapping.task_id, by_text.task_id}) == 3
    for sub in (by_object, by_mapping, by_text):
        assert client.wait(sub.task_id, timeout=60).status == "SUCCEEDED"


def test_idempotent_submit_and_conflicting_reuse(client: Client) -> None:
    first = client.submit(FINANCIAL, {**ACME, "n": 1}, idempotency_key="sdk-idem")
    again = client.submit(FINANCIAL, {**ACME, "n": 1}, idempotency_key="sdk-idem")
    assert first.created and not again.created
    assert again.task_id == first.task_id
    with pytest.raises(Conflict, match="sdk-idem"):
        client.submit(FINANCIAL, {**ACME, "n": 2}, idempotency_key="sdk-idem")
    assert client.wait(first.task_id, timeout=60).ok


def test_errors_come_back_as_ax_error_classes(client: Client, topology: Topology,
                                              tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        client.get("t-does-not-exist")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnodes:\n  a:\n    type: lm_call\n")
    with pytest.raises(DagError) as caught:
        client.submit(bad, {})
    assert caught.value.problems
    assert all(p.file == str(bad) for p in caught.value.problems)
    assert any("lm_call" in p.message for p in caught.value.problems)
    with Client(topology.api_url, "not-a-token") as stranger, pytest.raises(Unauthorized):
        stranger.get("t-anything")
    with Client(topology.api_url, topology.executor_token) as worker, \
            pytest.raises(Forbidden, match="submit"):
        worker.submit(FINANCIAL, ACME)
    with pytest.raises(InputError):
        client.submit(tmp_path / "missing.yaml", {})


def test_gate_waits_then_approve_is_idempotent_and_reject_conflicts(client: Client) -> None:
    sub = client.submit(GATE_DAG, {"text": "hello"})
    paused = client.wait(sub.task_id, timeout=60)
    assert paused.status == "PAUSED"
    assert list(paused.waiting) == ["review"]
    assert client.approve(sub.task_id, "review", "looks fine") == "committed"
    assert client.approve(sub.task_id, "review") == "already-done"
    with pytest.raises(Conflict):
        client.reject(sub.task_id, "review")
    done = client.wait(sub.task_id, timeout=60)
    assert done.status == "SUCCEEDED"
    assert done.outputs["publish"] == "published hello"
    assert done.outputs["review"]["decision"] == "approve"
    assert list(done.path) == ["draft", "review", "publish"]


@pytest.mark.parametrize("shape", ["x/../{id}", "../{id}", "{id}/../{id}", "{id}?x=1",
                                   "{id}#frag", ".."])
def test_an_id_is_one_path_segment_and_reaches_no_other_task(client: Client,
                                                             shape: str) -> None:
    # The ids went into the URL as they were: `x/../t-1` approved task t-1.
    sub = client.submit(GATE_DAG, {"text": "other"})
    assert client.wait(sub.task_id, timeout=60).status == "PAUSED"
    odd = shape.format(id=sub.task_id)
    with pytest.raises(NotFound):
        client.approve(odd, "review")
    with pytest.raises(NotFound):
        client.get(odd)
    assert client.wait(sub.task_id, timeout=5).status == "PAUSED"  # still undecided
    with pytest.raises(InputError, match="empty id"):
        client.get("")


def test_run_decides_gates_given_up_front(client: Client) -> None:
    result = client.run(GATE_DAG, {"text": "bye"}, decide={"review": "reject"}, timeout=60)
    assert result.status == "SUCCEEDED"
    assert result.states["publish"] == "SKIPPED"
    assert result.outputs["review"]["decision"] == "reject"


def test_cancel_stops_a_running_task_and_is_idempotent(client: Client) -> None:
    sub = client.submit(SLEEP_DAG, {"seconds": 60})
    wait_until(lambda: client.get(sub.task_id)["nodes"]["nap"]["state"] == "RUNNING", 30,
               what="the sleep node running")
    assert client.cancel(sub.task_id, "test") == "committed"
    assert client.cancel(sub.task_id) == "already-done"
    result = client.wait(sub.task_id, timeout=30)
    assert result.status == "CANCELLED"
    assert result.states["nap"] == "CANCELLED"
    assert [e.kind for e in client.events(sub.task_id)].count("committed") == 0


def test_retry_reruns_a_finished_task_from_a_node(client: Client) -> None:
    first = client.run(GATE_DAG, {"text": "again"}, decide={"review": "approve"}, timeout=60)
    assert first.ok
    assert client.retry(first.task_id, "publish") == "committed"
    second = client.wait(first.task_id, timeout=60)
    assert second.ok
    commits = [e.node_id for e in client.events(first.task_id) if e.kind == "committed"]
    assert commits.count("publish") == 2 and commits.count("draft") == 1


def test_fork_runs_a_new_task_from_a_node_with_a_set_output(client: Client) -> None:
    first = client.run(GATE_DAG, {"text": "again"}, decide={"review": "approve"}, timeout=60)
    assert first.ok
    fork = client.fork(first.task_id, "draft", output="forked text")
    assert fork != first.task_id
    second = client.wait(fork, timeout=60, decide={"review": "approve"})
    assert second.ok and second.outputs["draft"] == "forked text"
    assert client.get(fork)["labels"]["ax.forked_from"] == f"{first.task_id}@draft"
    # The source is untouched: its draft committed once, with its own output.
    assert client.result(first.task_id).outputs["draft"] == first.outputs["draft"]


def test_watch_follows_events_in_commit_order_until_the_end(client: Client) -> None:
    sub = client.submit(FINANCIAL, {**ACME, "n": "watch"})
    seen = list(client.watch(sub.task_id, timeout=60))
    seqs = [e.seq for e in seen]
    # seq is the revision of the transaction: events written together share it.
    assert seqs == sorted(seqs)
    assert len({e.event_id for e in seen}) == len(seen)
    assert "task_succeeded" in [e.kind for e in seen if e.seq == seqs[-1]]
    committed = [e.node_id for e in seen if e.kind == "committed"]
    assert committed == ACME_PATH
    assert seen == client.events(sub.task_id)
    before_last = max(s for s in seqs if s < seqs[-1])
    tail = list(client.watch(sub.task_id, after_seq=before_last, timeout=10))
    assert tail == [e for e in seen if e.seq == seqs[-1]]


def test_task_view_and_list_tasks(client: Client) -> None:
    result = client.run(FINANCIAL, {**ACME, "n": "view"}, labels={"suite": "sdk-view"},
                        timeout=60)
    view = client.task_view(result.task_id)
    assert view.dag.name == "financial_risk_assessment"
    assert view.task.status.value == "SUCCEEDED"
    assert view.snapshots["assess_risk"].next_hops
    assert [h.target_node_id for h in view.snapshots["assess_risk"].next_hops if h.is_taken] \
        == ["send_medium_risk_email"]
    listed = client.list_tasks(label="suite=sdk-view")
    assert [t.task_id for t in listed] == [result.task_id]
    assert client.validate(FINANCIAL)["valid"] is True


def test_async_client_has_the_same_behaviour(topology: Topology) -> None:
    async def scenario() -> tuple[RunResult, list[str], str]:
        async with AsyncClient(topology.api_url, topology.admin_token) as aclient:
            result = await aclient.run(FINANCIAL, {**ACME, "n": "async"}, timeout=60)
            kinds = [e.kind async for e in aclient.watch(result.task_id, timeout=10)]
            gate = await aclient.submit(GATE_DAG, {"text": "async"})
            paused = await aclient.wait(gate.task_id, timeout=60)
            assert paused.waiting == ["review"]
            answer = await aclient.approve(gate.task_id, "review")
            with pytest.raises(NotFound):
                await aclient.get("t-nope")
            return result, kinds, answer

    result, kinds, answer = asyncio.run(scenario())
    assert result.ok and list(result.path) == ACME_PATH
    assert kinds.count("committed") == len(ACME_PATH)
    assert answer == "committed"


def test_ax_run_with_server_prints_the_summary_and_exit_codes(
        topology: Topology, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli_main(["run", str(FINANCIAL), "--input",
                     str(REPO / "dags" / "inputs" / "financial_risk_assessment.json"),
                     "--server", topology.api_url, "--token", topology.admin_token])
    out = capsys.readouterr().out
    assert code == 0
    assert "SUCCEEDED in" in out
    assert "path: " + " -> ".join(ACME_PATH) in out
    assert "send_medium_risk_email" in out and "committed" in out
    gate = tmp_path / "gate.yaml"
    gate.write_text(GATE_DAG)
    code = cli_main(["run", str(gate), "--input", '{"text": "cli"}', "--json",
                     "--server", topology.api_url, "--token", topology.admin_token])
    captured = capsys.readouterr()
    assert code == 3
    assert json.loads(captured.out)["waiting"] == ["review"]
    code = cli_main(["run", str(FINANCIAL), "--input", "{}", "--server", topology.api_url,
                     "--token", "wrong-token"])
    assert code == 1
    assert "unknown bearer token" in capsys.readouterr().err


# ---------------------------------------------------------------------- no server


def test_a_refused_connection_is_retried_then_raised_as_api_unavailable() -> None:
    port = free_port()
    started = time.monotonic()
    with Client(f"http://127.0.0.1:{port}", "t", retry_for=0.5) as dead, \
            pytest.raises(ApiUnavailable, match="cannot reach"):
        dead.get("t-1")
    assert 0.1 < time.monotonic() - started < 5


def test_transport_errors_after_sending_are_retried_only_when_harmless() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        raise httpx.ReadError("connection reset by peer", request=request)

    def attempts(call: Callable[[Client], object]) -> int:
        calls.clear()
        with Client("http://ax.test", transport=httpx.MockTransport(handler),
                    retry_for=0.3) as c, pytest.raises(ApiUnavailable, match="ReadError"):
            call(c)
        return len(calls)

    # Harmless to repeat: a read, a keyed submission, a decision, a cancellation.
    assert attempts(lambda c: c.get("t-1")) > 1
    assert attempts(lambda c: c.submit("name: x\nnodes: {}\n", {}, idempotency_key="k")) > 1
    assert attempts(lambda c: c.approve("t-1", "gate")) > 1
    assert attempts(lambda c: c.cancel("t-1")) > 1
    # A repeat could create a second task or re-run a node: one attempt only.
    assert attempts(lambda c: c.submit("name: x\nnodes: {}\n", {})) == 1
    assert attempts(lambda c: c.retry("t-1", "a")) == 1


@pytest.mark.parametrize(("status", "body", "cls"), [
    (404, {"error": {"type": "NotFound", "message": "task 't' does not exist"}}, NotFound),
    (409, {"error": {"type": "Conflict", "message": "already decided"}}, Conflict),
    (401, {"error": {"type": "Unauthorized", "message": "unknown bearer token"}},
     Unauthorized),
    (403, {"error": {"type": "Forbidden", "message": "needs role admin"}}, Forbidden),
    (400, {"error": {"type": "TemplateSecurityError", "message": "unsafe"}},
     TemplateSecurityError),
    (413, {"error": {"type": "PayloadTooLarge", "message": "body too large"}}, InputError),
    (503, {"error": {"type": "StoreUnavailable", "message": "etcd down"}}, StoreUnavailable),
    (500, {"error": {"type": "InternalError", "message": "internal error"}}, AxError),
    (502, "<html>bad gateway</html>", ApiUnavailable),
    (504, "", ApiUnavailable),
    (400, "not ours", InputError),
    (418, "teapot", AxError),
])
def test_error_types_map_back_to_classes(status: int, body: object,
                                         cls: type[AxError]) -> None:
    if isinstance(body, dict):
        response = httpx.Response(status, json=body)
        message = body["error"]["message"]
    else:
        response = httpx.Response(status, text=str(body))
        message = f"HTTP {status}: {body or response.reason_phrase}"
    error = error_from_response(response)
    assert type(error) is cls
    assert str(error) == message


def test_dag_error_problems_are_rebuilt_with_the_source_file() -> None:
    response = httpx.Response(400, json={"error": {
        "type": "DagError", "message": "1 problem", "problems": [
            {"file": "<request>", "line": 4, "node": "a", "field": "type",
             "code": "unknown-node-type", "message": "unknown node type 'lm_call'",
             "hint": "use llm_call"}]}})
    error = error_from_response(response, source="dags/x.yaml")
    assert isinstance(error, DagError)
    assert error.problems[0].format() == \
        "dags/x.yaml:4: node 'a': unknown node type 'lm_call' (hint: use llm_call)"


def test_sse_parser_yields_messages_and_skips_keepalives() -> None:
    parser = SseParser()
    lines = [": keepalive", "id: 7", 'data: {"seq": 7}', "", "", "event: end",
             'data: {"status": "SUCCEEDED"}', ""]
    messages = [m for m in map(parser.feed, lines) if m is not None]
    assert messages == [("message", '{"seq": 7}'), ("end", '{"status": "SUCCEEDED"}')]


def test_token_is_sent_as_a_bearer_header() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"task_id": "t-9", "status": "RUNNING", "nodes": {}})

    with Client("http://ax.test/", "s3cret", transport=httpx.MockTransport(handler)) as c:
        assert c.get("t-9")["task_id"] == "t-9"
    assert seen == ["Bearer s3cret"]


OPERATIONS = ["submit", "get", "events", "result", "task_view", "watch", "wait", "run",
              "decide", "approve", "reject", "resume", "cancel", "retry", "fork", "list_tasks",
              "list_dags", "list_approvals", "validate", "ready"]


@pytest.mark.parametrize("name", OPERATIONS)
def test_client_methods_are_the_core_operations_with_their_docs(name: str) -> None:
    op = getattr(Core, name)
    for cls in (Client, AsyncClient):
        method = getattr(cls, name)
        assert method.__doc__ and method.__doc__ == op.__doc__
        assert method.__qualname__ == f"{cls.__name__}.{name}"
        assert method.__module__ == cls.__module__
        shown = inspect.signature(method)
        assert shown.parameters == inspect.signature(op).parameters
        assert "Op[" not in str(shown.return_annotation)
    assert inspect.iscoroutinefunction(AsyncClient.run) and not inspect.iscoroutinefunction(
        Client.run)
    assert inspect.isgeneratorfunction(Client.watch)
    assert inspect.isasyncgenfunction(AsyncClient.watch)
    assert inspect.signature(Client.submit).return_annotation == "Submission"


def test_every_public_core_operation_is_a_client_method() -> None:
    public = {n for n, f in vars(Core).items() if inspect.isfunction(f) and n[0] != "_"}
    assert public - {"call"} == set(OPERATIONS)
    for cls in (Client, AsyncClient):
        assert {"close"} | set(OPERATIONS) <= set(dir(cls))
    with Client("http://ax.test/") as client:
        assert client.url == "http://ax.test"


def _fake_server() -> Callable[[httpx.Request], httpx.Response]:
    """A task that runs one node: RUNNING until its event stream has been read, then
    SUCCEEDED. Enough to drive the wait loop of both clients without a server."""
    events = [
        {"task_id": "t-1", "event_id": "e1", "seq": 5, "kind": "claimed", "at": 1.0,
         "node_id": "a", "state": "RUNNING", "attempt": 1, "fence": 1, "actor": "w",
         "detail": ""},
        {"task_id": "t-1", "event_id": "e2", "seq": 6, "kind": "committed", "at": 2.0,
         "node_id": "a", "state": "SUCCEEDED", "attempt": 1, "fence": 1, "actor": "w",
         "detail": ""},
    ]
    streamed: list[int] = []

    def task() -> dict[str, object]:
        state = "SUCCEEDED" if streamed else "RUNNING"
        return {"task_id": "t-1", "dag_hash": "h", "dag_name": "d", "status": state,
                "nodes": {"a": {"node_id": "a", "type": "tool_call", "state": state,
                                "output": {"ok": True} if streamed else None}}}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/tasks/t-1":
            return httpx.Response(200, json=task())
        if path == "/v1/tasks/t-1/events":
            after = int(request.url.params.get("after_seq", 0))
            return httpx.Response(200, json={"events": [e for e in events if e["seq"] > after],
                                             "last_seq": 6, "next_page_token": None})
        if path == "/v1/tasks/t-1/watch":
            assert request.headers["accept"] == "text/event-stream"
            streamed.append(int(request.url.params["after_seq"]))
            text = ": keepalive\n\n" + "".join(
                f"id: {e['seq']}\ndata: {json.dumps(e)}\n\n" for e in events)
            text += 'event: end\ndata: {"task_id": "t-1", "status": "SUCCEEDED"}\n\n'
            return httpx.Response(200, text=text,
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(404, json={"error": {"type": "NotFound", "message": path}})

    return handler


def test_both_clients_run_the_same_wait_loop_without_a_server() -> None:
    seen: list[str] = []
    with Client("http://ax.test", transport=httpx.MockTransport(_fake_server())) as c:
        result = c.wait("t-1", timeout=10, on_event=lambda e: seen.append(e.kind))
        with pytest.raises(NotFound):
            next(c.watch("t-2"))

    async def scenario() -> tuple[RunResult, list[str]]:
        kinds: list[str] = []
        async with AsyncClient("http://ax.test",
                               transport=httpx.MockTransport(_fake_server())) as ac:
            done = await ac.wait("t-1", timeout=10, on_event=lambda e: kinds.append(e.kind))
            watched = [e.kind async for e in ac.watch("t-1")]
            assert watched == ["claimed", "committed"]
            with pytest.raises(NotFound):
                await ac.get("t-2")
            with pytest.raises(NotFound):
                await anext(ac.watch("t-2"))
            return done, kinds

    assert seen == ["claimed", "committed"]
    assert result.ok and list(result.path) == ["a"] and result.outputs == {"a": {"ok": True}}
    assert asyncio.run(scenario()) == (result, seen)
