"""ExecutorService calls with hostile values: claims, heartbeats, progress and every kind
of completion, for tasks and nodes that exist or not, any fence, edge numbers (NaN,
infinities), and JSON texts edited by character. Each is answered — a result, or a
status that names the caller's mistake — never UNKNOWN or INTERNAL. A seeded sample."""

from __future__ import annotations

import json
import random
from typing import Any

import grpc

from proto.ax.v1 import ax_pb2 as pb
from tests.api.conftest import ServerFactory
from tests.api.test_grpc import TOKEN, Stubs, submit
from tests.api.test_grpc_submit_mutations import _edit_text

CALLS = 600
NUMBERS = [float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e308, 5e-324, 30.0]
JSON_TEXTS = ["", "null", "1e400", "9" * 5000, "[" * 200, "NaN", '{"a": 1}']
BROKEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def _outcome(kind: str, rng: random.Random) -> dict[str, Any]:
    text = _edit_text(json.dumps({"text": "hi", "n": [1, 2.5, None]}), rng) \
        if rng.random() < 0.7 else rng.choice(JSON_TEXTS)
    if kind == "success":
        return {"success": pb.CompleteRequest.Success(output_json=text)}
    if kind == "failure":
        return {"failure": pb.CompleteRequest.Failure(
            message=rng.choice(["", "x" * 5000]), retryable=rng.random() < 0.5,
            details_json=text)}
    if kind == "unavailable":
        return {"unavailable": pb.CompleteRequest.Unavailable(
            dependency=rng.choice(["", "db", "x" * 500]), evidence="e",
            retry_after=rng.choice(NUMBERS))}
    return {"paused": pb.CompleteRequest.Paused(reason="r", seconds=rng.choice(NUMBERS),
                                                checkpoint_json=text)}


def test_hostile_executor_calls_are_answered_never_broken(api_server: ServerFactory) -> None:
    server = api_server("embedded", worker=False, reconcile_interval=3600.0)
    stubs = Stubs(server.grpc_address)
    executor = TOKEN["executor"]
    rng = random.Random("ax-executor-mutations")
    tasks = [submit(stubs) for _ in range(3)]
    for task in tasks:
        stubs.ex.Claim(pb.ClaimRequest(task_id=task, node_id="hello", worker_id="w1",
                                       lease_seconds=30), metadata=executor)
    broken: list[tuple[Any, ...]] = []
    sent = 0
    try:
        for _ in range(CALLS):
            task = rng.choice([*tasks, "t-nothere", "", "x" * 300])
            node = rng.choice(["hello", "", "x", "hello[0]", "hello#1", "a" * 300])
            fence = rng.choice([1, 0, -1, 2**63 - 1, -(2**63)])
            kind = rng.choice(["claim", "heartbeat", "progress", "success", "failure",
                               "unavailable", "paused"])
            try:
                if kind == "claim":
                    stubs.ex.Claim(pb.ClaimRequest(
                        task_id=task, node_id=node, worker_id=rng.choice(["w1", "", "é"]),
                        lease_seconds=rng.choice(NUMBERS)), metadata=executor)
                elif kind == "heartbeat":
                    stubs.ex.Heartbeat(pb.HeartbeatRequest(
                        task_id=task, node_id=node, fence=fence, worker_id="w1",
                        lease_seconds=rng.choice(NUMBERS)), metadata=executor)
                elif kind == "progress":
                    stubs.ex.Progress(pb.ProgressRequest(
                        task_id=task, node_id=node, fence=fence, worker_id="w1",
                        marker=rng.choice(["", "x" * 5000, "{{ 1 }}"])), metadata=executor)
                else:
                    stubs.ex.Complete(pb.CompleteRequest(
                        task_id=task, node_id=node, fence=fence, worker_id="w1",
                        **_outcome(kind, rng)), metadata=executor)
                sent += 1
            except grpc.RpcError as exc:
                sent += 1
                if exc.code() in BROKEN:
                    broken.append((kind, task[:20], node[:20], fence, exc.code(),
                                   exc.details()))
            except ValueError:
                pass  # a text protobuf cannot carry: refused by the client library
        assert not broken, broken[:5]
        assert sent > CALLS * 0.9
        # Still serving: the first task's node completes.
        done = stubs.ex.Complete(pb.CompleteRequest(
            task_id=tasks[0], node_id="hello", fence=1, worker_id="w1",
            success=pb.CompleteRequest.Success(output_json='{"ok": true}')),
            metadata=executor)
        assert done.result in (pb.COMPLETE_RESULT_COMMITTED, pb.COMPLETE_RESULT_STALE,
                               pb.COMPLETE_RESULT_ALREADY_DONE)
    finally:
        stubs.close()
