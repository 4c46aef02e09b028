"""``axengine.wire``: every record through its JSON and back, the one canonical JSON
text, and the one error table seen from the server, the REST client and the gRPC
client."""

from __future__ import annotations

import json
import math
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from axengine import codec, errors, limits, wire
from axengine.api import status_of
from axengine.dag import load_dag_text
from axengine.errors import (
    ERROR_CODES,
    INTERNAL_ERROR,
    REST_ONLY_TYPES,
    ApiUnavailable,
    AxError,
    DagError,
    DagProblem,
    ErrorCode,
    InputError,
    TemplateSecurityError,
    class_for_grpc,
    class_for_http,
)
from axengine.records import Event, NextHop, NodeState, Snapshot, TaskRecord, TaskStatus
from axengine.worker.grpc_client import error_from_rpc

TIMES = st.floats(min_value=0, max_value=4e9, allow_nan=False)
TEXT = st.text(max_size=20)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**53), 2**53) | TIMES | TEXT,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)


def _through_text(value: dict[str, Any]) -> Any:
    """What the other side of the wire parses."""
    return json.loads(json.dumps(value))


# ---------------------------------------------------------------------------- records


@given(st.builds(Event, task_id=TEXT, event_id=TEXT, kind=TEXT, at=TIMES,
                 seq=st.integers(0, 2**62), node_id=TEXT, state=TEXT,
                 attempt=st.integers(0, 1000), fence=st.integers(0, 2**40), actor=TEXT,
                 detail=TEXT))
def test_event_round_trip(event: Event) -> None:
    assert wire.event_from_json(_through_text(wire.event_json(event))) == event


@given(st.builds(TaskRecord, task_id=TEXT, dag_hash=TEXT, dag_name=TEXT, input=JSON,
                 status=st.sampled_from(TaskStatus), priority=st.integers(-(2**31), 2**31 - 1),
                 deadline=TIMES, labels=st.dictionaries(TEXT, TEXT, max_size=3),
                 idempotency_key=TEXT,
                 counts=st.dictionaries(st.sampled_from([s.value for s in NodeState]),
                                        st.integers(0, 100)),
                 created_at=TIMES, updated_at=TIMES, finished_at=TIMES, submitted_by=TEXT))
def test_task_round_trip(task: TaskRecord) -> None:
    # input_ref and payload_sha256 stay in the store: the wire never carries them.
    assert wire.task_from_json(_through_text(wire.task_json(task))) == task


SNAPSHOTS = st.builds(
    Snapshot, task_id=st.just("t-1"), node_id=st.just("n"), state=st.sampled_from(NodeState),
    attempt=st.integers(0, 100), fence=st.integers(0, 2**40), owner=TEXT, lease_until=TIMES,
    heartbeat_at=TIMES, progress_at=TIMES, progress_marker=TEXT, input=JSON, output=JSON,
    next_hops=st.lists(st.builds(NextHop, TEXT, st.booleans()), max_size=3).map(tuple),
    error=TEXT, error_retryable=st.booleans(), evidence=TEXT, ready_at=TIMES,
    not_before=TIMES, started_at=TIMES, finished_at=TIMES, paused_seconds=TIMES,
    gate_until=TIMES, decision=st.none() | st.dictionaries(TEXT, JSON, max_size=3),
    items=st.integers(0, 10**5), items_started=st.integers(0, 10**5),
    items_done=st.integers(0, 10**5), visit=st.integers(0, 100))


@given(SNAPSHOTS)
def test_node_round_trip(snap: Snapshot) -> None:
    data = _through_text(wire.node_json(snap, "human_gateway"))
    assert data["type"] == "human_gateway"
    assert wire.node_from_json("t-1", "n", data) == snap


def test_a_task_with_nodes_gives_the_same_result_as_the_engine_view() -> None:
    dag = load_dag_text("name: w\nnodes:\n  a: {type: tool_call, tool: echo, next: g}\n"
                        "  g: {type: human_gateway, description: ok?}\n")
    task = TaskRecord(task_id="t-1", dag_hash=dag.hash, dag_name="w",
                      status=TaskStatus.PAUSED, input={"x": 1})
    snaps = {"a": Snapshot("t-1", "a", NodeState.SUCCEEDED, output={"text": "hi"},
                           next_hops=(NextHop("g", True),)),
             "g": Snapshot("t-1", "g", NodeState.PAUSED, error="waiting")}
    body = wire.task_json(task) | {
        "nodes": {n: wire.node_json(s, dag.nodes[n].type) for n, s in snaps.items()}}
    decoded = wire.task_nodes_from_json(_through_text(body))
    assert decoded.task == task and decoded.snapshots == snaps

    class View:  # the engine's TaskView, as far as result_of is concerned
        def __init__(self) -> None:
            self.task, self.dag, self.snapshots = task, dag, snaps

    events = [Event("t-1", "e1", "committed", 1.0, node_id="a")]
    result = wire.result_of(decoded, events)
    assert result == wire.result_of(View(), events)
    assert result.waiting == ["g"] and list(result.path) == ["a"]
    assert result.outputs == {"a": {"text": "hi"}} and result.errors == {"g": "waiting"}


def test_dag_and_result_round_trip() -> None:
    dag = load_dag_text("name: w\nnodes:\n  a: {type: tool_call, tool: echo}\n")
    summary = wire.dag_from_json(_through_text(wire.dag_json(dag)))
    assert (summary.hash, summary.name) == (dag.hash, "w")
    assert type(dag).from_canonical(summary.dag) == dag
    result = wire.RunResult("t-1", "FAILED", {"a": [1, {"b": None}]}, ["a"],
                            {"a": "SUCCEEDED", "b": "FAILED"}, [], {"b": "boom"})
    assert wire.result_from_json(_through_text(wire.result_json(result))) == result


def test_problem_round_trip_and_source_override() -> None:
    problem = DagProblem("unknown target 'b'", "<request>", 3, node="a", field="next",
                         hint="add node b", code="unknown-target")
    data = _through_text(wire.problem_json(problem))
    assert wire.problem_from_json(data) == problem
    assert wire.problem_from_json(data, source="dags/x.yaml").file == "dags/x.yaml"


# ---------------------------------------------------------------------------- canonical JSON


def test_one_canonical_json() -> None:
    assert codec.canonical_json is limits.canonical_json
    assert limits.canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'


@pytest.mark.parametrize("value", [math.nan, {"x": math.inf}, [1, -math.inf], {"s": {1, 2}},
                                   {"b": b"raw"}, {1: "a", "b": 2}, 10**5000],
                         ids=["nan", "inf", "-inf", "set", "bytes", "mixed-keys", "huge-int"])
def test_canonical_json_refuses_what_is_not_json(value: Any) -> None:
    with pytest.raises(InputError, match=r"^task input "):
        limits.canonical_json(value, "task input")
    with pytest.raises(InputError, match="task input"):
        limits.check_json_value(value, "task input")


# ---------------------------------------------------------------------------- errors


def _instance(row: ErrorCode) -> AxError:
    if row.error is DagError:
        return DagError([DagProblem("unknown node type 'lm_call'", node="a")])
    return row.error(f"a {row.type}")


@pytest.mark.parametrize("row", ERROR_CODES, ids=lambda row: row.type)
def test_every_row_round_trips_over_rest(row: ErrorCode) -> None:
    exc = _instance(row)
    assert row.type == row.error.__name__
    body = _through_text(wire.error_body(exc))
    assert status_of(exc).http == row.http and body["error"]["type"] == row.type
    back = wire.error_from_body(row.http, body)
    assert type(back) is row.error and str(back) == str(exc)


@pytest.mark.parametrize("row", ERROR_CODES, ids=lambda row: row.type)
def test_every_row_round_trips_over_grpc(row: ErrorCode) -> None:
    status = status_of(_instance(row))
    assert status.grpc is grpc.StatusCode[row.grpc]
    assert status.grpc_state_conflict is grpc.StatusCode[row.grpc_state or row.grpc]
    for code in row.grpc_codes:
        back = class_for_grpc(code)
        rpc = grpc.aio.AioRpcError(grpc.StatusCode[code], grpc.aio.Metadata(),
                                   grpc.aio.Metadata(), details="why")
        assert type(error_from_rpc(rpc, "claim")) is back
        if row.generic:
            assert back is row.error
        else:  # the code is shared: it comes back as the class standing for it
            assert back is not row.error and back in {AxError, ApiUnavailable} | {
                r.error for r in ERROR_CODES if r.generic}


def test_the_table_is_well_formed() -> None:
    for i, row in enumerate(ERROR_CODES):
        for later in ERROR_CODES[i + 1:]:
            assert not issubclass(later.error, row.error), f"{later.type} is shadowed"
    for key in ("http", "grpc"):
        generic = [getattr(row, key) for row in ERROR_CODES if row.generic]
        assert len(generic) == len(set(generic)), f"two generic rows for one {key} value"
    for row in ERROR_CODES:
        assert row.error.__module__ == "axengine.errors"
    assert not hasattr(errors, "NodeError")
    assert ApiUnavailable.retryable
    assert class_for_http(503, "StoreUnavailable") is errors.StoreUnavailable


@pytest.mark.parametrize(("status", "type_", "cls"), [
    (400, "TemplateSecurityError", TemplateSecurityError),
    (500, INTERNAL_ERROR.type, AxError),
    (503, "", ApiUnavailable),
    (502, "", ApiUnavailable),
    (400, "", InputError),
    (418, "", AxError),
    (404, "NoSuchClass", errors.NotFound),
    *[(status, name, InputError) for status, name in REST_ONLY_TYPES.items()],
])
def test_client_side_mapping(status: int, type_: str, cls: type[AxError]) -> None:
    assert class_for_http(status, type_) is cls


def test_internal_errors_hide_their_message() -> None:
    body = wire.error_body(RuntimeError("/etc/secret"))
    assert body["error"]["type"] == "InternalError" and "secret" not in str(body)
    back = wire.error_from_body(500, body)
    assert type(back) is AxError


def test_a_body_that_is_not_ours() -> None:
    back = wire.error_from_body(502, None, text="<html>bad gateway</html>")
    assert type(back) is ApiUnavailable and str(back) == "HTTP 502: <html>bad gateway</html>"
    assert str(wire.error_from_body(504, None, reason="Gateway Timeout")) == \
        "HTTP 504: Gateway Timeout"


def test_a_lone_surrogate_is_refused_as_input_not_a_crash() -> None:
    from axengine.limits import check_json_value

    with pytest.raises(InputError, match="task input is not valid Unicode text"):
        check_json_value({"x": "\ud800"}, "task input")


def test_a_run_result_shows_a_bounded_repr() -> None:
    # asyncio reprs a run's task, result included, as the run ends: a megabyte of
    # outputs made that repr cost milliseconds per run.
    from axengine.wire import RunResult

    result = RunResult(task_id="t-1", status="SUCCEEDED",
                       outputs={"doc": {"text": "x" * 1_000_000, "pages": list(range(10_000))}},
                       path=["doc"], states={"doc": "SUCCEEDED"})
    text = repr(result)
    assert text.startswith("RunResult(task_id='t-1', status='SUCCEEDED', outputs={'doc': ")
    assert len(text) < 600
    assert result.outputs["doc"]["text"] == "x" * 1_000_000  # the value itself is whole
