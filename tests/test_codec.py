"""``axengine.codec``: exact round trips, seed-compatible fields, refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from axengine.activity import Activity
from axengine.codec import (
    EffectRecord,
    canonical_json,
    decode_effect,
    decode_event,
    decode_snapshot,
    decode_snapshot_in,
    decode_task,
    encode_effect,
    encode_event,
    encode_snapshot,
    encode_task,
)
from axengine.records import (
    BlobRef,
    Event,
    NextHop,
    NodeState,
    Snapshot,
    TaskRecord,
    TaskStatus,
)
from proto.ax.v1 import ax_pb2

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
UINT32 = st.integers(min_value=0, max_value=2**31 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT64 = st.integers(min_value=0, max_value=2**63 - 1)
TIMES = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=40)

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)
JSON_OBJECTS = st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=6)

BLOBS = st.none() | st.builds(BlobRef, uri=TEXT, sha256=TEXT, size=UINT64)
AMOUNTS = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
#: Unknown counters (None) must come back unknown, never as 0.
ACTIVITIES = st.none() | st.builds(
    Activity, seconds=AMOUNTS, cpu_seconds=st.none() | AMOUNTS,
    io_bytes=st.none() | UINT64, net_bytes=st.none() | UINT64, source=TEXT)

SNAPSHOTS = st.builds(
    Snapshot,
    task_id=TEXT,
    node_id=TEXT,
    state=st.sampled_from(NodeState),
    attempt=UINT32,
    fence=UINT64,
    owner=TEXT,
    lease_until=TIMES,
    heartbeat_at=TIMES,
    progress_at=TIMES,
    progress_marker=TEXT,
    activity=ACTIVITIES,
    activity_at=TIMES,
    stall_verdict=st.sampled_from(["", "note", "warn", "extend"]),
    stall_progress_at=TIMES,
    stall_extended_until=TIMES,
    input=JSON_VALUES,
    input_ref=BLOBS,
    input_revision=TEXT,
    output=JSON_VALUES,
    output_ref=BLOBS,
    output_sha256=TEXT,
    next_hops=st.lists(st.builds(NextHop, TEXT, st.booleans()), max_size=4).map(tuple),
    error=TEXT,
    error_retryable=st.booleans(),
    evidence=TEXT,
    ready_at=TIMES,
    not_before=TIMES,
    started_at=TIMES,
    finished_at=TIMES,
    paused_at=TIMES,
    paused_seconds=TIMES,
    gate_until=TIMES,
    decision=st.none() | JSON_OBJECTS,
    last_updated=TIMES,
)

TASKS = st.builds(
    TaskRecord,
    task_id=TEXT,
    dag_hash=TEXT,
    dag_name=TEXT,
    input=JSON_VALUES,
    input_ref=BLOBS,
    status=st.sampled_from(TaskStatus),
    priority=INT32,
    deadline=TIMES,
    labels=st.dictionaries(TEXT, TEXT, max_size=5),
    idempotency_key=TEXT,
    payload_sha256=TEXT,
    counts=st.dictionaries(st.sampled_from([s.value for s in NodeState]), INT64),
    created_at=TIMES,
    updated_at=TIMES,
    finished_at=TIMES,
)

EVENTS = st.builds(
    Event,
    task_id=TEXT,
    event_id=TEXT,
    kind=TEXT,
    at=TIMES,
    seq=INT64,
    node_id=TEXT,
    state=TEXT,
    attempt=INT32,
    fence=INT64,
    actor=TEXT,
    detail=TEXT,
)

EFFECTS = st.builds(
    EffectRecord,
    key=TEXT,
    state=st.sampled_from(["NEW", "SENDING", "DONE", "UNKNOWN"]),
    result=st.none() | JSON_OBJECTS,
    task_id=TEXT,
    node_id=TEXT,
    updated_at=TIMES,
)


@settings(deadline=None)
@given(SNAPSHOTS)
def test_snapshot_round_trip_is_exact(snapshot: Snapshot) -> None:
    data = encode_snapshot(snapshot)
    assert isinstance(data, bytes)
    assert decode_snapshot(data) == snapshot


@settings(deadline=None)
@given(SNAPSHOTS)
def test_a_snapshot_encoded_with_its_json_texts_given_is_the_same_bytes(
        snapshot: Snapshot) -> None:
    # The engine passes the canonical JSON it made to measure the input and output.
    given_texts = encode_snapshot(
        snapshot,
        input_json="" if snapshot.input is None else canonical_json(snapshot.input),
        output_json="" if snapshot.output is None else canonical_json(snapshot.output))
    assert given_texts == encode_snapshot(snapshot)


@settings(deadline=None)
@given(SNAPSHOTS, st.sets(st.sampled_from(list(NodeState))))
def test_a_snapshot_decodes_only_in_the_states_asked(snapshot: Snapshot,
                                                    states: set[NodeState]) -> None:
    data = encode_snapshot(snapshot)
    expected = snapshot if snapshot.state in states else None
    assert decode_snapshot_in(data, states) == expected
    assert decode_snapshot_in(data, None) == snapshot


@settings(deadline=None)
@given(TASKS)
def test_task_round_trip_is_exact(task: TaskRecord) -> None:
    assert decode_task(encode_task(task)) == task


@given(EVENTS)
def test_event_round_trip_is_exact(event: Event) -> None:
    assert decode_event(encode_event(event)) == event


@settings(deadline=None)
@given(EFFECTS)
def test_effect_round_trip_is_exact(record: EffectRecord) -> None:
    assert decode_effect(encode_effect(record)) == record


def test_snapshot_with_a_60_kib_output_round_trips() -> None:
    output = {
        "text": "財務報告 " * 4000 + "x" * (60 * 1024 - 4000 * 13),
        "pages": list(range(200)),
        "metrics": {"revenue_growth": 0.1834, "net_profit_margin": 0.0917},
    }
    assert len(canonical_json(output).encode()) >= 60 * 1024
    snapshot = Snapshot(
        task_id="t-1", node_id="parse_pdf", state=NodeState.SUCCEEDED, attempt=1,
        output=output, output_sha256="ab" * 32, last_updated=1_733_000_000.5,
    )
    data = encode_snapshot(snapshot)
    assert len(data) > 60 * 1024
    assert decode_snapshot(data) == snapshot


@settings(deadline=None)
@given(SNAPSHOTS)
def test_seed_fields_are_filled_for_seed_readers(snapshot: Snapshot) -> None:
    msg = ax_pb2.TaskSnapshot.FromString(encode_snapshot(snapshot))
    assert msg.task_id == snapshot.task_id
    assert msg.node_id == snapshot.node_id
    assert msg.retry_count == max(snapshot.attempt - 1, 0)
    assert msg.status == {
        NodeState.PENDING: "pending", NodeState.WAITING: "waiting",
        NodeState.RUNNING: "running", NodeState.PAUSED: "paused",
        NodeState.SUCCEEDED: "success", NodeState.FAILED: "failed",
        NodeState.SKIPPED: "skipped", NodeState.DEAD: "dead",
        NodeState.CANCELLED: "cancelled",
    }[snapshot.state]
    assert [(h.target_node_id, h.is_taken) for h in msg.next_hops] == [
        (h.target_node_id, h.is_taken) for h in snapshot.next_hops
    ]
    expected_output = "" if snapshot.output is None else canonical_json(snapshot.output)
    assert msg.output_json == expected_output


def test_input_params_hold_top_level_keys_of_an_object_input() -> None:
    snapshot = Snapshot(
        task_id="t", node_id="n",
        input={"pdf_url": "s3://r/q3.pdf", "pages": 12, "opts": {"ocr": True}, "n": None},
    )
    msg = ax_pb2.TaskSnapshot.FromString(encode_snapshot(snapshot))
    assert dict(msg.input_params) == {
        "pdf_url": "s3://r/q3.pdf", "pages": "12", "opts": '{"ocr":true}', "n": "null",
    }
    assert json.loads(msg.input_json) == snapshot.input


def test_input_params_are_empty_for_a_non_object_input() -> None:
    msg = ax_pb2.TaskSnapshot.FromString(
        encode_snapshot(Snapshot(task_id="t", node_id="n", input=["a", "b"]))
    )
    assert len(msg.input_params) == 0
    assert msg.input_json == '["a","b"]'


def test_last_updated_timestamp_is_filled_to_the_microsecond() -> None:
    msg = ax_pb2.TaskSnapshot.FromString(
        encode_snapshot(Snapshot(task_id="t", node_id="n", last_updated=1_733_000_000.25))
    )
    assert msg.last_updated.seconds == 1_733_000_000
    assert msg.last_updated.nanos == 250_000_000
    assert msg.last_updated_unix == 1_733_000_000.25


def test_a_message_written_by_a_seed_tool_decodes_from_its_seed_fields() -> None:
    msg = ax_pb2.TaskSnapshot(
        task_id="t", node_id="assess_risk", status="success", retry_count=1,
        input_params={"x": "1"}, output_json='{"risk":"high_risk"}',
        next_hops=[ax_pb2.TaskSnapshot.NextHop(target_node_id="email", is_taken=True)],
    )
    msg.last_updated.seconds = 1_700_000_000
    msg.last_updated.nanos = 500_000_000
    snapshot = decode_snapshot(msg.SerializeToString())
    assert snapshot.state is NodeState.SUCCEEDED
    assert snapshot.output == {"risk": "high_risk"}
    assert snapshot.next_hops == (NextHop("email", True),)
    assert snapshot.last_updated == 1_700_000_000.5
    # input_params is informational: the authoritative input_json was not written.
    assert snapshot.input is None


def test_canonical_json_is_compact_sorted_and_utf8() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"], "c": None}) == '{"a":[1.5,"é"],"b":1,"c":null}'


@pytest.mark.parametrize("value", [float("nan"), {"x": float("inf")}, [float("-inf")]])
def test_non_finite_floats_are_refused(value: Any) -> None:
    with pytest.raises(ValueError):
        encode_snapshot(Snapshot(task_id="t", node_id="n", output=value))


def test_a_value_that_is_not_json_is_refused() -> None:
    with pytest.raises(TypeError):
        encode_task(TaskRecord(task_id="t", dag_hash="h", dag_name="d", input={1, 2}))


@pytest.mark.parametrize(
    "decode", [decode_snapshot, decode_task, decode_event, decode_effect]
)
def test_garbage_bytes_are_refused(decode: Any) -> None:
    with pytest.raises(ValueError, match=r"not an ax\.v1\."):
        decode(b"\xff\xff\xff")


def test_a_snapshot_without_a_known_state_is_refused() -> None:
    data = ax_pb2.TaskSnapshot(task_id="t", node_id="n", status="exploded").SerializeToString()
    with pytest.raises(ValueError, match="unknown state"):
        decode_snapshot(data)


def test_a_task_without_a_status_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown status"):
        decode_task(ax_pb2.Task(task_id="t").SerializeToString())


def test_an_effect_result_must_be_an_object() -> None:
    data = ax_pb2.EffectRecord(
        key="k", state=ax_pb2.EFFECT_STATE_DONE, result_json="[1]"
    ).SerializeToString()
    with pytest.raises(ValueError, match="JSON object"):
        decode_effect(data)


def test_an_unknown_effect_state_is_refused() -> None:
    record = EffectRecord(key="k", state="LOST")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown state"):
        encode_effect(record)


def test_the_records_replace_matches_dataclasses_replace() -> None:
    import dataclasses

    from axengine.records import NextHop, Snapshot, TaskRecord, TaskStatus, replace

    snap = Snapshot(task_id="t", node_id="n", attempt=2, next_hops=(NextHop("m", True),))
    changed = {"state": NodeState.RUNNING, "fence": 3, "owner": "w"}
    assert replace(snap, **changed) == dataclasses.replace(snap, **changed)
    assert replace(snap) == snap and replace(snap) is not snap
    task = TaskRecord(task_id="t", dag_hash="h", dag_name="d", input={"a": 1})
    assert replace(task, status=TaskStatus.PAUSED) == dataclasses.replace(
        task, status=TaskStatus.PAUSED)
    with pytest.raises(TypeError, match="no field"):
        replace(snap, colour="red")
    # Records without slots (a ramp) are copied too.
    from axengine.engine._ramp import Ramp

    ramp = Ramp(limit=2, since=5.0)
    assert replace(ramp, limit=3) == dataclasses.replace(ramp, limit=3)
