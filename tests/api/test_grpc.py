"""gRPC end to end: AxService and ExecutorService against a real grpc.aio server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from proto.ax.v1 import ax_pb2 as pb
from proto.ax.v1 import ax_pb2_grpc as pb_grpc
from tests.api.conftest import GATE_YAML, ServerFactory, ServerHandle, wait_final

SEED_YAML = """\
name: seed
nodes:
  hello:
    type: llm_call
    model: gpt-3.5-turbo
    prompt: "Say hello to user {{ .node.input.name }}"
    input: {name: Alice}
    retry: 2
"""
TOKEN = {
    "submit": (("authorization", "Bearer tok-submit-0123456789"),),
    "approve": (("authorization", "Bearer tok-approve-0123456789"),),
    "admin": (("authorization", "Bearer tok-admin-0123456789ab"),),
    "executor": (("authorization", "Bearer tok-executor-012345678"),),
}


class Stubs:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.ax = pb_grpc.AxServiceStub(self.channel)
        self.ex = pb_grpc.ExecutorServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def stubs_for() -> Iterator[Any]:
    opened: list[Stubs] = []

    def make(handle: ServerHandle) -> Stubs:
        stubs = Stubs(handle.grpc_address)
        opened.append(stubs)
        return stubs

    yield make
    for stubs in opened:
        stubs.close()


def code_of(call: Any, *args: Any, **kwargs: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    code: grpc.StatusCode = info.value.code()
    return code


def submit(stubs: Stubs, dag_yaml: str = SEED_YAML, **fields: Any) -> str:
    reply = stubs.ax.SubmitTask(pb.SubmitTaskRequest(dag_yaml=dag_yaml, **fields),
                                metadata=TOKEN["submit"])
    assert reply.created
    task_id: str = reply.task.task_id
    return task_id


def test_executor_claim_heartbeat_complete_and_stale_fence(
        api_server: ServerFactory, stubs_for: Any, backend: str) -> None:
    handle = api_server(backend, worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    task_id = submit(stubs)
    ex, md = stubs.ex, TOKEN["executor"]
    claim = ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id="w1",
                                     lease_seconds=30), metadata=md)
    assert claim.result == pb.CLAIM_RESULT_CLAIMED
    assert claim.fence == 1 and claim.attempt == 1 and claim.node_type == "llm_call"
    config = json.loads(claim.config_json)
    assert config["prompt"] == "Say hello to user Alice" and config["timeout"] > 0
    assert json.loads(claim.input_json) == {"name": "Alice"}
    assert claim.input_revision and claim.lease_until > 0
    other = ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id="w2"),
                     metadata=md)
    assert other.result == pb.CLAIM_RESULT_NOT_CLAIMABLE and other.reason == "leased"
    beat = ex.Heartbeat(pb.HeartbeatRequest(task_id=task_id, node_id="hello", fence=1,
                                            worker_id="w1", lease_seconds=30), metadata=md)
    assert beat.result == pb.LEASE_RESULT_OK and beat.lease_until > claim.lease_until - 1
    progress = ex.Progress(pb.ProgressRequest(task_id=task_id, node_id="hello", fence=1,
                                              worker_id="w1", marker="halfway"), metadata=md)
    assert progress.result == pb.LEASE_RESULT_OK
    stale_beat = ex.Heartbeat(pb.HeartbeatRequest(task_id=task_id, node_id="hello", fence=7),
                              metadata=md)
    assert stale_beat.result == pb.LEASE_RESULT_STALE
    # A stale fence is an answer, not an error, and changes nothing.
    before = handle.revision()
    stale = ex.Complete(pb.CompleteRequest(
        task_id=task_id, node_id="hello", fence=2, worker_id="w2",
        success=pb.CompleteRequest.Success(output_json='{"text":"late"}')), metadata=md)
    assert stale.result == pb.COMPLETE_RESULT_STALE
    assert stale.snapshot.state == pb.NODE_STATE_RUNNING and stale.snapshot.fence == 1
    assert handle.revision() == before
    done = ex.Complete(pb.CompleteRequest(
        task_id=task_id, node_id="hello", fence=1, worker_id="w1",
        success=pb.CompleteRequest.Success(output_json='{"text":"hi Alice"}')), metadata=md)
    assert done.result == pb.COMPLETE_RESULT_COMMITTED
    assert done.snapshot.state == pb.NODE_STATE_SUCCEEDED
    assert json.loads(done.snapshot.output_json) == {"text": "hi Alice"}
    assert done.snapshot.progress_marker == "halfway"
    repeat = ex.Complete(pb.CompleteRequest(
        task_id=task_id, node_id="hello", fence=1, worker_id="w1",
        success=pb.CompleteRequest.Success(output_json='{"text":"hi Alice"}')), metadata=md)
    assert repeat.result == pb.COMPLETE_RESULT_ALREADY_DONE
    task = stubs.ax.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=TOKEN["submit"])
    assert task.task.status == pb.TASK_STATUS_SUCCEEDED
    assert [s.node_id for s in task.snapshots] == ["hello"]


FAN_YAML = """\
name: fan
nodes:
  start:
    type: llm_call
    model: gpt-3.5-turbo
    prompt: "go"
    next: [a, b]
  a: {type: llm_call, model: gpt-3.5-turbo, prompt: "a"}
  b: {type: llm_call, model: gpt-3.5-turbo, prompt: "b"}
"""


def test_complete_claims_the_next_node_in_the_same_transaction(
        api_server: ServerFactory, stubs_for: Any) -> None:
    """``claim_lanes``: the completion claims a node it readies; ``claim_node``: it
    claims the named node of the task (one an executor popped) and acknowledges its
    queue item; a stale fence claims nothing and writes nothing."""
    handle = api_server("sqlite", worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    task_id = submit(stubs, FAN_YAML)
    ex, md = stubs.ex, TOKEN["executor"]

    def success(node: str, fence: int, **ask: Any) -> Any:
        return ex.Complete(pb.CompleteRequest(
            task_id=task_id, node_id=node, fence=fence, worker_id=ask.pop("worker", "w1"),
            success=pb.CompleteRequest.Success(output_json='"ok"'), **ask), metadata=md)

    claim = ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="start", worker_id="w1"),
                     metadata=md)
    assert claim.result == pb.CLAIM_RESULT_CLAIMED
    before = handle.revision()
    done = success("start", claim.fence, claim_lanes=["default"])
    assert done.result == pb.COMPLETE_RESULT_COMMITTED
    assert (done.next.result, done.next.node_id, done.next.fence) == (
        pb.CLAIM_RESULT_CLAIMED, "a", 1)
    assert not done.acked  # a readied node: no queue item to acknowledge
    assert handle.revision() == before + 1
    assert code_of(ex.Complete, pb.CompleteRequest(
        task_id=task_id, node_id="a", fence=1, claim_node="b",
        success=pb.CompleteRequest.Success(output_json='"ok"')),
        metadata=md) == grpc.StatusCode.INVALID_ARGUMENT
    before = handle.revision()
    stale = success("a", 2, claim_node="b")
    assert stale.result == pb.COMPLETE_RESULT_STALE and not stale.HasField("next")
    assert not stale.acked
    assert handle.revision() == before
    done = success("a", 1, claim_node="b")
    assert done.result == pb.COMPLETE_RESULT_COMMITTED
    assert (done.next.node_id, done.next.fence, done.next.attempt) == ("b", 1, 1)
    # The server acknowledged w1's queue item for b with the commit's push.
    assert done.acked
    assert handle.revision() == before + 1
    task = stubs.ax.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=TOKEN["submit"])
    states = {s.node_id: (s.state, s.owner) for s in task.snapshots}
    assert states["b"] == (pb.NODE_STATE_RUNNING, "w1")


def test_failure_backoff_unavailable_and_cancel_make_fences_stale(
        api_server: ServerFactory, stubs_for: Any) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    ex, md = stubs.ex, TOKEN["executor"]
    task_id = submit(stubs)

    def claim(worker: str) -> Any:
        return ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id=worker),
                        metadata=md)

    first = claim("w1")
    failed = ex.Complete(pb.CompleteRequest(
        task_id=task_id, node_id="hello", fence=first.fence, worker_id="w1",
        failure=pb.CompleteRequest.Failure(message="boom", retryable=True,
                                           details_json='{"why":"test"}')), metadata=md)
    assert failed.result == pb.COMPLETE_RESULT_COMMITTED
    assert failed.snapshot.state == pb.NODE_STATE_WAITING and failed.snapshot.error == "boom"
    backing_off = claim("w1")
    assert backing_off.result == pb.CLAIM_RESULT_NOT_YET
    assert backing_off.not_before > 0 and backing_off.reason == "backoff"
    # Unavailable: claimable right away again after the backoff; exercise it on a new task.
    other = submit(stubs, labels={"n": "2"})
    second = ex.Claim(pb.ClaimRequest(task_id=other, node_id="hello", worker_id="w1"),
                      metadata=md)
    down = ex.Complete(pb.CompleteRequest(
        task_id=other, node_id="hello", fence=second.fence, worker_id="w1",
        unavailable=pb.CompleteRequest.Unavailable(dependency="model:x", evidence="503")),
        metadata=md)
    assert down.result == pb.COMPLETE_RESULT_COMMITTED
    assert down.snapshot.state == pb.NODE_STATE_WAITING and down.snapshot.attempt == 0
    assert "503" in down.snapshot.evidence
    third = ex.Claim(pb.ClaimRequest(task_id=other, node_id="hello", worker_id="w1"),
                     metadata=md)
    assert third.result == pb.CLAIM_RESULT_NOT_YET
    # Cancel while nothing runs, then every fenced call of the old attempt is stale.
    stubs.ax.CancelTask(pb.CancelTaskRequest(task_id=other, reason="test"),
                        metadata=TOKEN["admin"])
    beat = ex.Heartbeat(pb.HeartbeatRequest(task_id=other, node_id="hello",
                                            fence=second.fence), metadata=md)
    assert beat.result == pb.LEASE_RESULT_STALE
    late = ex.Complete(pb.CompleteRequest(
        task_id=other, node_id="hello", fence=second.fence,
        success=pb.CompleteRequest.Success(output_json="1")), metadata=md)
    assert late.result == pb.COMPLETE_RESULT_STALE
    assert late.snapshot.state == pb.NODE_STATE_CANCELLED
    no_outcome = pb.CompleteRequest(task_id=other, node_id="hello", fence=1)
    assert code_of(ex.Complete, no_outcome, metadata=md) == \
        grpc.StatusCode.INVALID_ARGUMENT
    text = handle.client(None).get("/metrics").text
    assert 'ax_node_outcomes_total{node_type="llm_call",outcome="stale"} 1.0' in text
    assert 'ax_node_outcomes_total{node_type="llm_call",outcome="unavailable"} 1.0' in text
    assert 'ax_node_outcomes_total{node_type="llm_call",outcome="failed"} 1.0' in text


def test_effect_outbox(api_server: ServerFactory, stubs_for: Any) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    ex, md = stubs.ex, TOKEN["executor"]
    task_id = submit(stubs)
    claim = ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id="w1"),
                     metadata=md)
    ids = {"task_id": task_id, "node_id": "hello", "worker_id": "w1"}
    assert ex.EffectGet(pb.EffectGetRequest(key="mail-1"), metadata=md).state == \
        pb.EFFECT_STATE_NEW
    stale = ex.EffectBegin(pb.EffectBeginRequest(key="mail-1", fence=claim.fence + 1, **ids),
                           metadata=md)
    assert stale.lease == pb.LEASE_RESULT_STALE
    assert ex.EffectGet(pb.EffectGetRequest(key="mail-1"), metadata=md).state == \
        pb.EFFECT_STATE_NEW
    begun = ex.EffectBegin(pb.EffectBeginRequest(key="mail-1", fence=claim.fence, **ids),
                           metadata=md)
    assert begun.lease == pb.LEASE_RESULT_OK and begun.previous == pb.EFFECT_STATE_NEW
    done = ex.EffectDone(pb.EffectDoneRequest(key="mail-1", fence=claim.fence,
                                              result_json='{"id":"m1"}', **ids), metadata=md)
    assert done.record.state == pb.EFFECT_STATE_DONE
    assert json.loads(done.record.result_json) == {"id": "m1"}
    again = ex.EffectBegin(pb.EffectBeginRequest(key="mail-1", fence=claim.fence, **ids),
                           metadata=md)
    assert again.previous == pb.EFFECT_STATE_DONE and json.loads(again.result_json) == {
        "id": "m1"}
    ex.EffectBegin(pb.EffectBeginRequest(key="mail-2", fence=claim.fence, **ids), metadata=md)
    unknown = ex.EffectBegin(pb.EffectBeginRequest(key="mail-2", fence=claim.fence, **ids),
                             metadata=md)
    assert unknown.previous == pb.EFFECT_STATE_SENDING
    assert ex.EffectGet(pb.EffectGetRequest(key="mail-2"), metadata=md).state == \
        pb.EFFECT_STATE_UNKNOWN
    never = pb.EffectDoneRequest(key="never", fence=claim.fence, result_json="{}", **ids)
    assert code_of(ex.EffectDone, never, metadata=md) == grpc.StatusCode.NOT_FOUND
    # A request without a fence (an executor older than the fenced outbox) is refused,
    # not let through unchecked.
    unfenced = pb.EffectBeginRequest(key="mail-3", **ids)
    assert code_of(ex.EffectBegin, unfenced, metadata=md) == grpc.StatusCode.INVALID_ARGUMENT
    unfenced_done = pb.EffectDoneRequest(key="mail-1", result_json="{}", **ids)
    assert code_of(ex.EffectDone, unfenced_done, metadata=md) == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_ax_service_operations(api_server: ServerFactory, stubs_for: Any) -> None:
    handle = api_server("embedded")
    stubs = stubs_for(handle)
    ax = stubs.ax
    first = ax.SubmitTask(pb.SubmitTaskRequest(dag_yaml=GATE_YAML, input_json='{"text":"g"}',
                                               idempotency_key="g1", labels={"team": "x"}),
                          metadata=TOKEN["submit"])
    task_id = first.task.task_id
    assert first.created and first.task.labels["team"] == "x"
    repeat = ax.SubmitTask(pb.SubmitTaskRequest(dag_yaml=GATE_YAML, input_json='{"text":"g"}',
                                                idempotency_key="g1", labels={"team": "x"}),
                           metadata=TOKEN["submit"])
    assert not repeat.created and repeat.task.task_id == task_id
    conflict = pb.SubmitTaskRequest(dag_yaml=GATE_YAML, input_json='{"text":"other"}',
                                    idempotency_key="g1")
    assert code_of(ax.SubmitTask, conflict, metadata=TOKEN["submit"]) == \
        grpc.StatusCode.ALREADY_EXISTS
    bad_json = pb.SubmitTaskRequest(dag_yaml=GATE_YAML, input_json="{nope")
    assert code_of(ax.SubmitTask, bad_json, metadata=TOKEN["submit"]) == \
        grpc.StatusCode.INVALID_ARGUMENT
    # The bounds REST puts on its body hold over gRPC too (the engine checks them).
    for refused in (pb.SubmitTaskRequest(dag_yaml=GATE_YAML, idempotency_key="k" * 257),
                    pb.SubmitTaskRequest(dag_yaml=GATE_YAML, labels={"ax.forked_from": "x"}),
                    pb.SubmitTaskRequest(dag_yaml=GATE_YAML, deadline_seconds=float("nan")),
                    pb.SubmitTaskRequest(dag_yaml=GATE_YAML, deadline_seconds=-1.0)):
        assert code_of(ax.SubmitTask, refused, metadata=TOKEN["submit"]) == \
            grpc.StatusCode.INVALID_ARGUMENT
    # Watch: replay then live, until the task is final; the gate is decided meanwhile.
    stream = ax.WatchTask(pb.WatchTaskRequest(task_id=task_id), metadata=TOKEN["submit"])
    kinds = []
    for event in stream:
        kinds.append(event.kind)
        if event.kind == "task_paused":
            not_gate = pb.DecideRequest(task_id=task_id, node_id="draft",
                                        decision=pb.DECISION_APPROVE)
            assert code_of(ax.Decide, not_gate, metadata=TOKEN["approve"]) == \
                grpc.StatusCode.INVALID_ARGUMENT
            edits = pb.DecideRequest(task_id=task_id, node_id="review",
                                     decision=pb.DECISION_REJECT, data_json="{}")
            assert code_of(ax.Decide, edits, metadata=TOKEN["approve"]) == \
                grpc.StatusCode.INVALID_ARGUMENT  # edits go with an approval
            long_comment = pb.DecideRequest(task_id=task_id, node_id="review",
                                            decision=pb.DECISION_APPROVE, comment="c" * 2001)
            assert code_of(ax.Decide, long_comment, metadata=TOKEN["approve"]) == \
                grpc.StatusCode.INVALID_ARGUMENT  # REST's bound too
            decided = ax.Decide(pb.DecideRequest(task_id=task_id, node_id="review",
                                                 decision=pb.DECISION_APPROVE, by="mallory",
                                                 data_json='{"text": "edited"}'),
                                metadata=TOKEN["approve"])
            assert not decided.repeated
            assert json.loads(decided.snapshot.decision_json)["by"] == "approver"
            assert json.loads(decided.snapshot.output_json)["data"] == {"text": "edited"}
            again = ax.Decide(pb.DecideRequest(task_id=task_id, node_id="review",
                                               decision=pb.DECISION_APPROVE),
                              metadata=TOKEN["approve"])
            assert again.repeated
            flip = pb.DecideRequest(task_id=task_id, node_id="review",
                                    decision=pb.DECISION_REJECT)
            assert code_of(ax.Decide, flip, metadata=TOKEN["approve"]) == \
                grpc.StatusCode.FAILED_PRECONDITION
    assert kinds[0] == "submitted" and kinds[-1] == "task_succeeded" and "decided" in kinds
    events = ax.GetEvents(pb.GetEventsRequest(task_id=task_id), metadata=TOKEN["submit"])
    assert [e.kind for e in events.events] == kinds
    assert events.last_seq == events.events[-1].seq
    listed = ax.ListTasks(pb.ListTasksRequest(statuses=[pb.TASK_STATUS_SUCCEEDED],
                                              label_selector="team=x"),
                          metadata=TOKEN["submit"])
    assert [t.task_id for t in listed.tasks] == [task_id] and listed.next_page_token == ""
    retried = ax.RetryTask(pb.RetryTaskRequest(task_id=task_id, from_node="publish"),
                           metadata=TOKEN["admin"])
    assert retried.task.status == pb.TASK_STATUS_RUNNING
    assert code_of(ax.RetryTask, pb.RetryTaskRequest(task_id=task_id),
                                        metadata=TOKEN["admin"]) == \
        grpc.StatusCode.INVALID_ARGUMENT
    missing = pb.GetTaskRequest(task_id="t-none")
    assert code_of(ax.GetTask, missing, metadata=TOKEN["submit"]) == \
        grpc.StatusCode.NOT_FOUND
    watch_missing = ax.WatchTask(pb.WatchTaskRequest(task_id="t-none"),
                                 metadata=TOKEN["submit"])
    assert code_of(list, watch_missing) == grpc.StatusCode.NOT_FOUND
    valid = ax.ValidateDag(pb.ValidateDagRequest(dag_yaml=GATE_YAML), metadata=TOKEN["submit"])
    assert valid.ok and valid.dag_name == "gated" and len(valid.dag_hash) == 64
    invalid = ax.ValidateDag(pb.ValidateDagRequest(
        dag_yaml="name: x\nnodes:\n  a: {type: tool_call, tool: echo, next: b}\n",
        file_name="x.yaml"), metadata=TOKEN["submit"])
    assert not invalid.ok and invalid.problems[0].file == "x.yaml"
    assert invalid.problems[0].line == 3 and invalid.problems[0].node == "a"


def test_grpc_auth(api_server: ServerFactory, stubs_for: Any) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    before = handle.revision()
    request = pb.SubmitTaskRequest(dag_yaml=SEED_YAML)
    assert code_of(stubs.ax.SubmitTask, request) == grpc.StatusCode.UNAUTHENTICATED
    wrong = (("authorization", "Bearer not-a-token"),)
    assert code_of(stubs.ax.SubmitTask, request, metadata=wrong) == \
        grpc.StatusCode.UNAUTHENTICATED
    assert code_of(stubs.ax.SubmitTask, request, metadata=TOKEN["approve"]) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert code_of(stubs.ax.SubmitTask, request, metadata=TOKEN["executor"]) == \
        grpc.StatusCode.PERMISSION_DENIED
    claim = pb.ClaimRequest(task_id="t-x", node_id="n", worker_id="w")
    assert code_of(stubs.ex.Claim, claim, metadata=TOKEN["admin"]) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert code_of(stubs.ex.Claim, claim) == grpc.StatusCode.UNAUTHENTICATED
    cancel = pb.CancelTaskRequest(task_id="t-x")
    assert code_of(stubs.ax.CancelTask, cancel, metadata=TOKEN["submit"]) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert handle.revision() == before
    # Any role reads; an unknown task is then NOT_FOUND, not a permission problem.
    assert code_of(stubs.ax.GetTask, pb.GetTaskRequest(task_id="t-x"),
                                            metadata=TOKEN["executor"]) == \
        grpc.StatusCode.NOT_FOUND


def test_fork_task(api_server: ServerFactory, stubs_for: Any) -> None:
    handle = api_server("embedded")
    stubs = stubs_for(handle)
    ax = stubs.ax
    task_id = submit(stubs)
    source = wait_final(handle.client("submit"), task_id)
    assert source["status"] == "SUCCEEDED"
    # An output set on the fork point commits it in the fork's first transaction.
    forked = ax.ForkTask(pb.ForkTaskRequest(task_id=task_id, from_node="hello",
                                            output_json='{"text": "forked"}'),
                         metadata=TOKEN["admin"])
    assert forked.forked_from == f"{task_id}@hello"
    assert forked.task.task_id != task_id
    assert forked.task.status == pb.TASK_STATUS_SUCCEEDED
    assert forked.task.labels["ax.forked_from"] == f"{task_id}@hello"
    got = ax.GetTask(pb.GetTaskRequest(task_id=forked.task.task_id), metadata=TOKEN["submit"])
    assert json.loads(got.snapshots[0].output_json) == {"text": "forked"}
    # Without an output the fork runs the node again; the source is untouched.
    rerun = ax.ForkTask(pb.ForkTaskRequest(task_id=task_id, from_node="hello"),
                        metadata=TOKEN["admin"])
    again = wait_final(handle.client("submit"), rerun.task.task_id)
    assert again["status"] == "SUCCEEDED" and again["nodes"]["hello"]["attempt"] == 1
    assert handle.client("submit").get(f"/v1/tasks/{task_id}").json() == source
    refusals = [
        (pb.ForkTaskRequest(task_id=task_id, from_node="nope"), "admin",
         grpc.StatusCode.INVALID_ARGUMENT),
        (pb.ForkTaskRequest(task_id=task_id), "admin", grpc.StatusCode.INVALID_ARGUMENT),
        (pb.ForkTaskRequest(task_id=task_id, from_node="hello", output_json="{nope"), "admin",
         grpc.StatusCode.INVALID_ARGUMENT),
        (pb.ForkTaskRequest(task_id="t-none", from_node="hello"), "admin",
         grpc.StatusCode.NOT_FOUND),
        (pb.ForkTaskRequest(task_id=task_id, from_node="hello"), "submit",
         grpc.StatusCode.PERMISSION_DENIED),
    ]
    for request, role, code in refusals:
        assert code_of(ax.ForkTask, request, metadata=TOKEN[role]) == code, request


def test_complete_stream_answers_each_request_by_id_and_goes_on_after_an_error(
        api_server: ServerFactory, stubs_for: Any, backend: str) -> None:
    """Complete over one stream: a commit, a stale fence, a malformed request and a
    repeat, each answered by its id as Complete answers it; the error ends nothing."""
    handle = api_server(backend, worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    ex, md = stubs.ex, TOKEN["executor"]
    tasks = [submit(stubs) for _ in range(2)]
    for task_id in tasks:
        claim = ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id="w1",
                                         lease_seconds=30), metadata=md)
        assert claim.result == pb.CLAIM_RESULT_CLAIMED and claim.fence == 1

    def complete(task_id: str, fence: int, text: str = "hi") -> pb.CompleteRequest:
        return pb.CompleteRequest(task_id=task_id, node_id="hello", fence=fence,
                                  worker_id="w1", success=pb.CompleteRequest.Success(
                                      output_json=json.dumps({"text": text})))

    requests = [
        pb.CompleteStreamRequest(id=7, request=complete(tasks[0], 1, "first")),
        pb.CompleteStreamRequest(id=8, request=complete(tasks[1], 5)),  # stale fence
        pb.CompleteStreamRequest(id=9, request=pb.CompleteRequest(  # no outcome
            task_id=tasks[1], node_id="hello", fence=1, worker_id="w1")),
        pb.CompleteStreamRequest(id=10, request=complete(tasks[1], 1, "second")),
    ]
    replies = {r.id: r for r in ex.CompleteStream(iter(requests), metadata=md)}
    assert sorted(replies) == [7, 8, 9, 10]
    assert replies[7].code == 0 and replies[7].reply.result == pb.COMPLETE_RESULT_COMMITTED
    assert replies[8].code == 0 and replies[8].reply.result == pb.COMPLETE_RESULT_STALE
    assert replies[9].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "outcome" in replies[9].message and not replies[9].HasField("reply")
    assert replies[10].reply.result == pb.COMPLETE_RESULT_COMMITTED
    assert json.loads(replies[10].reply.snapshot.output_json) == {"text": "second"}
    # A repeat over a new stream answers already-done, as Complete does.
    again = list(ex.CompleteStream(iter([pb.CompleteStreamRequest(
        id=1, request=complete(tasks[0], 1, "first"))]), metadata=md))
    assert [r.reply.result for r in again] == [pb.COMPLETE_RESULT_ALREADY_DONE]
    for task_id in tasks:
        task = stubs.ax.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=TOKEN["submit"])
        assert task.task.status == pb.TASK_STATUS_SUCCEEDED


def test_complete_stream_refuses_a_caller_without_the_executor_role(
        api_server: ServerFactory, stubs_for: Any) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    task_id = submit(stubs)
    request = pb.CompleteStreamRequest(id=1, request=pb.CompleteRequest(
        task_id=task_id, node_id="hello", fence=1, worker_id="w1",
        success=pb.CompleteRequest.Success(output_json="{}")))
    before = handle.revision()
    for metadata, code in ((TOKEN["submit"], grpc.StatusCode.PERMISSION_DENIED),
                           ((("authorization", "Bearer nope"),),
                            grpc.StatusCode.UNAUTHENTICATED)):
        assert code_of(lambda md: list(stubs.ex.CompleteStream(iter([request]),
                                                              metadata=md)),
                       metadata) == code
    assert handle.revision() == before
