"""Finding 5: deep or non-standard input poisoned every read.

An input nested 300 levels deep was accepted (201) and then every ``GET /v1/tasks...``
of every caller answered 500; 100,000 levels over gRPC answered INTERNAL; ``NaN`` and
``Infinity`` were accepted. Now every way a caller's JSON enters is checked at the door
(standard JSON, at most 64 levels, bounded size) and refused with 400 /
``INVALID_ARGUMENT`` naming the field and the limit — and whatever is accepted, at the
exact limits, reads back through every read path.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from axengine.limits import MAX_JSON_DEPTH
from tests.security.conftest import http, store_state
from tests.topology import Topology, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pb: Any = importlib.import_module("proto.ax.v1.ax_pb2")
pb_grpc: Any = importlib.import_module("proto.ax.v1.ax_pb2_grpc")

DAG = {"name": "f05", "nodes": {"work": {"type": "tool_call", "tool": "echo",
                                         "input": {"x": 1}}}}
DAG_YAML = "name: f05\nnodes:\n  work: {type: tool_call, tool: echo, input: {x: 1}}\n"


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """The module's deployment, reconciler idle after its first pass (a quiet store)."""
    with Topology(executors=2, lease=5.0, reconcile_interval=600) as topo:
        yield topo


def _deep_text(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


def _deep_value(levels: int) -> Any:
    """``levels`` nested containers, alternating objects and arrays."""
    value: Any = "bottom"
    for i in range(levels):
        value = {"k": value} if i % 2 else [value]
    return value


def _rest_body(input_text: str) -> bytes:
    return ('{"dag": ' + json.dumps(DAG) + ', "input": ' + input_text + "}").encode()


def _stub(topology: Topology, who: str) -> tuple[Any, list[tuple[str, str]]]:
    channel = grpc.insecure_channel(topology.grpc_target)
    return pb_grpc.AxServiceStub(channel), [("authorization",
                                             f"Bearer {topology.token(who)}")]


BAD_INPUTS = {
    "300 levels": _deep_text(300),
    "100,000 levels": _deep_text(100_000),
    "one level too deep": _deep_text(MAX_JSON_DEPTH + 1),
    "NaN": '{"x": NaN}',
    "Infinity": "[Infinity]",
    "-Infinity": '{"x": [1, -Infinity]}',
    "past a float": '{"x": -1e400}',
    "lone surrogate": '"\\ud800"',
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_rest_refuses_bad_inputs_and_stores_nothing(topology: Topology, case: str) -> None:
    before = store_state(topology)
    with http(topology, "submitter") as client:
        reply = client.post("/v1/tasks", content=_rest_body(BAD_INPUTS[case]),
                            headers={"Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    if "levels" in case or "deep" in case:
        assert "input" in message and str(MAX_JSON_DEPTH) in message, message
    if case == "past a float":  # named as written, not as the infinity it would become
        assert "-1e400 is out of range for a JSON number" in message, message
    assert store_state(topology) == before


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_grpc_refuses_bad_inputs_and_stores_nothing(topology: Topology, case: str) -> None:
    before = store_state(topology)
    stub, metadata = _stub(topology, "submitter")
    with pytest.raises(grpc.RpcError) as caught:
        stub.SubmitTask(pb.SubmitTaskRequest(dag_yaml=DAG_YAML, input_json=BAD_INPUTS[case]),
                        metadata=metadata, timeout=30)
    error: Any = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    if "levels" in case or "deep" in case:
        assert "input_json" in error.details() and str(MAX_JSON_DEPTH) in error.details()
    if case == "past a float":
        assert "-1e400 is out of range for a JSON number" in error.details()
    assert store_state(topology) == before


def test_retry_overrides_are_checked_too(topology: Topology) -> None:
    with http(topology, "admin") as admin:
        reply = admin.post("/v1/tasks", json={"dag": DAG})
        assert reply.status_code == 201, reply.text
        task_id = reply.json()["task_id"]
        wait_until(lambda: admin.get(f"/v1/tasks/{task_id}").json()["status"] == "SUCCEEDED",
                   60, what="task done")
        before = store_state(topology)
        for text in (_deep_text(300), _deep_text(100_000), "[NaN]"):
            body = '{"from_node": "work", "input": ' + text + "}"
            refused = admin.post(f"/v1/tasks/{task_id}/retry", content=body.encode(),
                                 headers={"Content-Type": "application/json"})
            assert refused.status_code == 400, refused.text
        stub, metadata = _stub(topology, "admin")
        for text in (_deep_text(300), _deep_text(100_000), "[NaN]"):
            with pytest.raises(grpc.RpcError) as caught:
                stub.RetryTask(pb.RetryTaskRequest(task_id=task_id, from_node="work",
                                                   input_json=text),
                               metadata=metadata, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert store_state(topology) == before
    # Nothing poisoned: another caller reads everything.
    with http(topology, "submitter2") as reader:
        assert reader.get("/v1/tasks", params={"limit": 1000}).status_code == 200
        assert reader.get(f"/v1/tasks/{task_id}").status_code == 200
        assert reader.get(f"/v1/tasks/{task_id}/events").status_code == 200


#: Values at the limits: depth exactly MAX_JSON_DEPTH, unicode, integers past 64 bits,
#: and a large value (blob-held: above the 64 KiB threshold, under the 1 MiB body limit).
EDGE_INPUTS: dict[str, Any] = {
    "deepest": _deep_value(MAX_JSON_DEPTH),
    "unicode": {"text": "żółć ✓ 漢字 😀 \u202eRTL\u202c \u0000 tab\t", "ключ": ["é", ""]},
    "big ints": {"big": 2**200, "neg": -(10**300), "u64": 2**64 - 1, "f": 1.5e300},
    "large": {"blob": "x" * (900 * 1024)},
}


@pytest.mark.parametrize("case", list(EDGE_INPUTS))
def test_inputs_at_the_limits_read_back_everywhere(topology: Topology, case: str) -> None:
    value = EDGE_INPUTS[case]
    with http(topology, "submitter") as client:
        reply = client.post("/v1/tasks", json={"dag": DAG, "input": value})
        assert reply.status_code == 201, reply.text
        task_id = reply.json()["task_id"]
    with http(topology, "submitter2") as reader:
        wait_until(lambda: reader.get(f"/v1/tasks/{task_id}").json()["status"] == "SUCCEEDED",
                   60, what="task done")
        task = reader.get(f"/v1/tasks/{task_id}")
        assert task.status_code == 200 and task.json()["input"] == value
        assert task.json()["nodes"]["work"]["state"] == "SUCCEEDED"
        listed = reader.get("/v1/tasks", params={"limit": 1000})
        assert listed.status_code == 200
        # Lists show inline inputs; a blob-held one (``large``) is left out of the page.
        inputs = [t["input"] for t in listed.json()["tasks"] if t["task_id"] == task_id]
        assert inputs == ([None] if case == "large" else [value])
        events = reader.get(f"/v1/tasks/{task_id}/events")
        assert events.status_code == 200 and events.json()["events"]
        with reader.stream("GET", f"/v1/tasks/{task_id}/watch") as watch:
            assert watch.status_code == 200
            text = "".join(watch.iter_text())
        assert "event: end" in text
    stub, metadata = _stub(topology, "submitter2")
    got = stub.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=metadata, timeout=30)
    assert json.loads(got.task.input_json) == value
    assert [s.node_id for s in got.snapshots] == ["work"]
    page = stub.ListTasks(pb.ListTasksRequest(page_size=1000), metadata=metadata, timeout=30)
    inputs = [t.input_json for t in page.tasks if t.task_id == task_id]
    assert inputs == ([""] if case == "large" else [json.dumps(value, sort_keys=True,
                                                               separators=(",", ":"),
                                                               ensure_ascii=False)])
    assert stub.GetEvents(pb.GetEventsRequest(task_id=task_id), metadata=metadata,
                          timeout=30).events
