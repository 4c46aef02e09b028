"""Map the engine's records to and from the protobuf bytes kept in the state store.

Every value under ``/ax/tasks``, ``/ax/snapshots``, ``/ax/events`` and ``/ax/effects`` is
one message of ``proto/ax/v1/ax.proto`` (``Task``, ``TaskSnapshot``, ``Event``,
``EffectRecord``). This module is the only place that knows the field mapping; it is
called on every transition, so it is written out field by field rather than driven by
reflection.

Two faces, two owners. The store bytes (``encode_*`` / ``decode_*``) are the engine's
alone: only :mod:`axengine.engine` reads and writes records in the store
(``tests/engine/test_engine_closed.py`` keeps it so). The same messages travel on the
gRPC wire, so the adapters build them with the ``*_message`` functions (and a worker
reads an outbox record back with :func:`effect_from_message`) without touching the
store format's entry points.

Round trips are exact: ``decode_x(encode_x(r)) == r`` for every field, because

- times stay UNIX seconds in ``double`` fields (the engine's floats, bit for bit). The
  seed's ``TaskSnapshot.last_updated`` is a ``google.protobuf.Timestamp`` filled for
  seed-era readers; ``last_updated_unix`` carries the exact float next to it, and the
  Timestamp is only read back when that field is absent (a message a seed tool wrote);
- JSON values (inputs, outputs, decisions, effect results) are stored as canonical
  JSON text (:func:`canonical_json`), which Python's ``json`` reads back to equal
  values. Only JSON round-trips: tuples come back as lists and object keys must be
  strings; NaN and infinities are refused.

Seed compatibility fields of ``TaskSnapshot`` are written but never trusted on decode:
``status`` (legacy lowercase name of ``state``), ``retry_count`` (``attempt - 1``) and
``input_params`` (top-level keys of an object input). The one exception: a message with
no ``state`` (written by a seed-era tool) takes its state from ``status``.

Errors: encoding raises ``TypeError`` for a value that is not JSON and ``ValueError``
for a non-finite float or an integer out of its field's range; decoding raises
``ValueError`` for bytes that are not the expected message or hold an unknown enum value
or malformed JSON. Both mean a bug or a corrupt store, never a condition to retry.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Final

from axengine.activity import Activity
from axengine.limits import canonical_json
from axengine.records import (
    BlobRef,
    Event,
    NextHop,
    NodeState,
    Snapshot,
    TaskRecord,
    TaskStatus,
)
from executors.contract import EffectState

__all__ = [
    "EffectRecord",
    "activity_from_message",
    "activity_message",
    "canonical_json",
    "decode_effect",
    "decode_event",
    "decode_snapshot",
    "decode_snapshot_in",
    "decode_task",
    "effect_from_message",
    "effect_message",
    "encode_effect",
    "encode_event",
    "encode_snapshot",
    "encode_task",
    "event_message",
    "snapshot_message",
    "task_message",
]

# The generated stubs (ax_pb2.pyi) need types-protobuf, which ax does not depend on;
# loading the modules dynamically keeps them untyped (Any) for mypy, as pyproject
# intends for ``proto.*``, instead of failing on the stubs' own imports.
_pb: Any = importlib.import_module("proto.ax.v1.ax_pb2")
_DecodeError: type[Exception] = importlib.import_module("google.protobuf.message").DecodeError

_TaskSnapshotPb: Any = _pb.TaskSnapshot
_NextHopPb: Any = _pb.TaskSnapshot.NextHop
_TaskPb: Any = _pb.Task
_EventPb: Any = _pb.Event
_EffectRecordPb: Any = _pb.EffectRecord
_BlobRefPb: Any = _pb.BlobRef
_ActivityPb: Any = _pb.Activity

_ENCODER: Final = json.JSONEncoder(
    separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
)

#: Range of ``google.protobuf.Timestamp`` (0001-01-01 to 9999-12-31, UTC).
_TIMESTAMP_MIN: Final = -62_135_596_800
_TIMESTAMP_MAX: Final = 253_402_300_799

_NODE_STATE_TO_PB: Final[dict[NodeState, int]] = {
    NodeState.PENDING: _pb.NODE_STATE_PENDING,
    NodeState.WAITING: _pb.NODE_STATE_WAITING,
    NodeState.RUNNING: _pb.NODE_STATE_RUNNING,
    NodeState.PAUSED: _pb.NODE_STATE_PAUSED,
    NodeState.SUCCEEDED: _pb.NODE_STATE_SUCCEEDED,
    NodeState.FAILED: _pb.NODE_STATE_FAILED,
    NodeState.SKIPPED: _pb.NODE_STATE_SKIPPED,
    NodeState.DEAD: _pb.NODE_STATE_DEAD,
    NodeState.CANCELLED: _pb.NODE_STATE_CANCELLED,
}
_NODE_STATE_FROM_PB: Final = {v: k for k, v in _NODE_STATE_TO_PB.items()}

#: ``TaskSnapshot.status``: the seed's lowercase names (it said ``success``, not
#: ``succeeded``), extended one to one to the states the seed did not have.
_LEGACY_STATUS: Final[dict[NodeState, str]] = {
    NodeState.PENDING: "pending",
    NodeState.WAITING: "waiting",
    NodeState.RUNNING: "running",
    NodeState.PAUSED: "paused",
    NodeState.SUCCEEDED: "success",
    NodeState.FAILED: "failed",
    NodeState.SKIPPED: "skipped",
    NodeState.DEAD: "dead",
    NodeState.CANCELLED: "cancelled",
}
_STATE_FROM_LEGACY: Final = {v: k for k, v in _LEGACY_STATUS.items()}

_TASK_STATUS_TO_PB: Final[dict[TaskStatus, int]] = {
    TaskStatus.RUNNING: _pb.TASK_STATUS_RUNNING,
    TaskStatus.PAUSED: _pb.TASK_STATUS_PAUSED,
    TaskStatus.SUCCEEDED: _pb.TASK_STATUS_SUCCEEDED,
    TaskStatus.FAILED: _pb.TASK_STATUS_FAILED,
    TaskStatus.DEAD: _pb.TASK_STATUS_DEAD,
    TaskStatus.CANCELLED: _pb.TASK_STATUS_CANCELLED,
}
_TASK_STATUS_FROM_PB: Final = {v: k for k, v in _TASK_STATUS_TO_PB.items()}

_EFFECT_STATE_TO_PB: Final[dict[str, int]] = {
    "NEW": _pb.EFFECT_STATE_NEW,
    "SENDING": _pb.EFFECT_STATE_SENDING,
    "DONE": _pb.EFFECT_STATE_DONE,
    "UNKNOWN": _pb.EFFECT_STATE_UNKNOWN,
}
_EFFECT_STATE_FROM_PB: Final[dict[int, EffectState]] = {
    _pb.EFFECT_STATE_NEW: "NEW",
    _pb.EFFECT_STATE_SENDING: "SENDING",
    _pb.EFFECT_STATE_DONE: "DONE",
    _pb.EFFECT_STATE_UNKNOWN: "UNKNOWN",
}


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """A side-effect outbox record (``/ax/effects/{key}``).

    Attributes:
        key: Stable idempotency key (task, node, input revision, effect name).
        state: ``NEW``, ``SENDING``, ``DONE`` or ``UNKNOWN`` (see
            :class:`executors.contract.Effect`).
        result: What the effect returned, once ``DONE``.
        task_id: Task that owns the effect.
        node_id: Node that owns the effect.
        updated_at: Time of the last write (UNIX seconds).
    """

    key: str
    state: EffectState
    result: Mapping[str, Any] | None = None
    task_id: str = ""
    node_id: str = ""
    updated_at: float = 0.0


def encode_snapshot(s: Snapshot, *, input_json: str = "", output_json: str = "",
                    input_members: Mapping[str, str] | None = None) -> bytes:
    """Serialize a node snapshot as an ``ax.v1.TaskSnapshot``.

    Args:
        s: The snapshot.
        input_json: The canonical JSON text of ``s.input`` when the caller made it
            already (:func:`axengine.limits.canonical_json`; "": make it here).
        output_json: The same for ``s.output``.
        input_members: The canonical text of each member of ``s.input`` when the caller
            made them (:func:`axengine.limits.canonical_parts`), for ``input_params``.

    Raises:
        TypeError: The input, output or decision is not JSON.
        ValueError: A float in them is not finite, or an integer is out of range.
    """
    data: bytes = snapshot_message(s, input_json=input_json, output_json=output_json,
                                   input_members=input_members).SerializeToString()
    return data


def snapshot_message(s: Snapshot, *, input_json: str = "", output_json: str = "",
                     input_members: Mapping[str, str] | None = None) -> Any:
    """The ``ax.v1.TaskSnapshot`` message of a node snapshot (see :func:`encode_snapshot`
    for the arguments and the errors)."""
    inp = s.input
    msg = _TaskSnapshotPb(
        task_id=s.task_id,
        node_id=s.node_id,
        status=_LEGACY_STATUS[s.state],
        retry_count=max(s.attempt - 1, 0),
        output_json=output_json or _json_or_empty(s.output),
        next_hops=[_NextHopPb(target_node_id=h.target_node_id, is_taken=h.is_taken)
                   for h in s.next_hops],
        state=_NODE_STATE_TO_PB[s.state],
        attempt=s.attempt,
        fence=s.fence,
        owner=s.owner,
        lease_until=s.lease_until,
        heartbeat_at=s.heartbeat_at,
        progress_at=s.progress_at,
        progress_marker=s.progress_marker,
        activity=activity_message(s.activity),
        activity_at=s.activity_at,
        stall_verdict=s.stall_verdict,
        stall_progress_at=s.stall_progress_at,
        stall_extended_until=s.stall_extended_until,
        input_json=input_json or _json_or_empty(inp),
        input_ref=_blob_to_pb(s.input_ref),
        input_revision=s.input_revision,
        output_ref=_blob_to_pb(s.output_ref),
        output_sha256=s.output_sha256,
        error=s.error,
        error_retryable=s.error_retryable,
        evidence=s.evidence,
        ready_at=s.ready_at,
        not_before=s.not_before,
        started_at=s.started_at,
        finished_at=s.finished_at,
        paused_at=s.paused_at,
        paused_seconds=s.paused_seconds,
        gate_until=s.gate_until,
        decision_json=_json_or_empty(s.decision),
        resume_json=_json_or_empty(s.resume),
        checkpoint_json=_json_or_empty(s.checkpoint),
        run_seconds=s.run_seconds,
        attempt_timeout=s.attempt_timeout,
        preds_left=s.preds_left,
        reached=s.reached,
        items=s.items,
        items_started=s.items_started,
        items_done=s.items_done,
        visit=s.visit,
        last_updated_unix=s.last_updated,
    )
    if isinstance(inp, (dict, Mapping)):  # (a dict first: the ABC check is slow)
        _fill(msg.input_params, _input_params(inp, input_members))
    t = s.last_updated
    # The Timestamp is only for the seed's readers; a value it cannot hold is skipped
    # (last_updated_unix still has it).
    if t and _TIMESTAMP_MIN <= t < _TIMESTAMP_MAX + 1:
        seconds = math.floor(t)
        stamp = msg.last_updated
        stamp.seconds = seconds
        stamp.nanos = min(round((t - seconds) * 1e9), 999_999_999)
    return msg


def decode_snapshot(data: bytes) -> Snapshot:
    """Parse bytes written by :func:`encode_snapshot` (or by a seed-era tool).

    Raises:
        ValueError: ``data`` is not a ``TaskSnapshot``, has no known state, or holds
            malformed JSON.
    """
    snap = decode_snapshot_in(data, None)
    assert snap is not None  # no states to leave out
    return snap


def decode_snapshot_in(data: bytes, states: Container[NodeState] | None, *,
                       inputs: bool = True) -> Snapshot | None:
    """:func:`decode_snapshot`, or None when the node's state is not one of ``states``
    (None: any state) — told from the parsed message before the rest is converted, so
    a reader that wants a few live nodes among many finished ones pays little for the
    others. Without ``inputs``, the rendered input is not decoded (``input`` is None;
    ``input_ref`` and ``input_revision`` are kept).

    Raises:
        ValueError: As :func:`decode_snapshot`.
    """
    m = _parse(_TaskSnapshotPb, data)
    state = _NODE_STATE_FROM_PB.get(m.state)
    if state is None:
        state = _STATE_FROM_LEGACY.get(m.status)
        if state is None:
            raise ValueError(
                f"TaskSnapshot {m.task_id}/{m.node_id}: unknown state {m.state} "
                f"and status {m.status!r}"
            )
    if states is not None and state not in states:
        return None
    last_updated: float = m.last_updated_unix
    if not last_updated and m.HasField("last_updated"):
        stamp = m.last_updated
        last_updated = stamp.seconds + stamp.nanos / 1e9
    return Snapshot(
        task_id=m.task_id,
        node_id=m.node_id,
        state=state,
        attempt=m.attempt,
        fence=m.fence,
        owner=m.owner,
        lease_until=m.lease_until,
        heartbeat_at=m.heartbeat_at,
        progress_at=m.progress_at,
        progress_marker=m.progress_marker,
        activity=activity_from_message(m.activity) if m.HasField("activity") else None,
        activity_at=m.activity_at,
        stall_verdict=m.stall_verdict,
        stall_progress_at=m.stall_progress_at,
        stall_extended_until=m.stall_extended_until,
        input=_json_or_none(m.input_json) if inputs else None,
        input_ref=_blob_from_pb(m.input_ref) if m.HasField("input_ref") else None,
        input_revision=m.input_revision,
        output=_json_or_none(m.output_json),
        output_ref=_blob_from_pb(m.output_ref) if m.HasField("output_ref") else None,
        output_sha256=m.output_sha256,
        next_hops=tuple(NextHop(h.target_node_id, h.is_taken) for h in m.next_hops),
        error=m.error,
        error_retryable=m.error_retryable,
        evidence=m.evidence,
        ready_at=m.ready_at,
        not_before=m.not_before,
        started_at=m.started_at,
        finished_at=m.finished_at,
        paused_at=m.paused_at,
        paused_seconds=m.paused_seconds,
        gate_until=m.gate_until,
        decision=_json_object_or_none(m.decision_json, "decision_json"),
        resume=_json_or_none(m.resume_json),
        checkpoint=_json_or_none(m.checkpoint_json),
        run_seconds=m.run_seconds,
        attempt_timeout=m.attempt_timeout,
        preds_left=m.preds_left,
        reached=m.reached,
        items=m.items,
        items_started=m.items_started,
        items_done=m.items_done,
        visit=m.visit,
        last_updated=last_updated,
    )


def encode_task(t: TaskRecord, *, input_json: str = "") -> bytes:
    """Serialize a task as an ``ax.v1.Task`` (``input_json``: the canonical JSON text of
    ``t.input`` when the caller has it; "": made here).

    Raises:
        TypeError: The input is not JSON.
        ValueError: A float in it is not finite, or an integer is out of range.
    """
    data: bytes = task_message(t, input_json=input_json).SerializeToString()
    return data


def task_message(t: TaskRecord, *, input_json: str = "") -> Any:
    """The ``ax.v1.Task`` message of a task (see :func:`encode_task` for the errors)."""
    msg = _TaskPb(
        task_id=t.task_id,
        dag_hash=t.dag_hash,
        dag_name=t.dag_name,
        input_json=input_json or _json_or_empty(t.input),
        input_ref=_blob_to_pb(t.input_ref),
        status=_TASK_STATUS_TO_PB[t.status],
        priority=t.priority,
        deadline=t.deadline,
        idempotency_key=t.idempotency_key,
        payload_sha256=t.payload_sha256,
        created_at=t.created_at,
        updated_at=t.updated_at,
        finished_at=t.finished_at,
        submitted_by=t.submitted_by,
        paused_at=t.paused_at,
    )
    _fill(msg.labels, t.labels)
    _fill(msg.counts, t.counts)
    return msg


def decode_task(data: bytes) -> TaskRecord:
    """Parse bytes written by :func:`encode_task`.

    Raises:
        ValueError: ``data`` is not a ``Task``, has no known status, or holds malformed
            JSON.
    """
    m = _parse(_TaskPb, data)
    status = _TASK_STATUS_FROM_PB.get(m.status)
    if status is None:
        raise ValueError(f"Task {m.task_id}: unknown status {m.status}")
    return TaskRecord(
        task_id=m.task_id,
        dag_hash=m.dag_hash,
        dag_name=m.dag_name,
        input=_json_or_none(m.input_json),
        input_ref=_blob_from_pb(m.input_ref) if m.HasField("input_ref") else None,
        status=status,
        priority=m.priority,
        deadline=m.deadline,
        labels=dict(m.labels),
        idempotency_key=m.idempotency_key,
        payload_sha256=m.payload_sha256,
        counts=dict(m.counts),
        created_at=m.created_at,
        updated_at=m.updated_at,
        finished_at=m.finished_at,
        submitted_by=m.submitted_by,
        paused_at=m.paused_at,
    )


def encode_event(e: Event) -> bytes:
    """Serialize a timeline event as an ``ax.v1.Event``.

    Raises:
        ValueError: An integer is out of its field's range.
    """
    data: bytes = event_message(e).SerializeToString()
    return data


def event_message(e: Event) -> Any:
    """The ``ax.v1.Event`` message of an event (see :func:`encode_event` for the errors)."""
    return _EventPb(
        task_id=e.task_id,
        event_id=e.event_id,
        seq=e.seq,
        kind=e.kind,
        at=e.at,
        node_id=e.node_id,
        state=e.state,
        attempt=e.attempt,
        fence=e.fence,
        actor=e.actor,
        detail=e.detail,
    )


def decode_event(data: bytes) -> Event:
    """Parse bytes written by :func:`encode_event`.

    Raises:
        ValueError: ``data`` is not an ``Event``.
    """
    m = _parse(_EventPb, data)
    return Event(
        task_id=m.task_id,
        event_id=m.event_id,
        kind=m.kind,
        at=m.at,
        seq=m.seq,
        node_id=m.node_id,
        state=m.state,
        attempt=m.attempt,
        fence=m.fence,
        actor=m.actor,
        detail=m.detail,
    )


def encode_effect(r: EffectRecord) -> bytes:
    """Serialize an outbox record as an ``ax.v1.EffectRecord``.

    Raises:
        TypeError: The result is not JSON.
        ValueError: The state is not an effect state, or a float in the result is not
            finite.
    """
    data: bytes = effect_message(r).SerializeToString()
    return data


def effect_message(r: EffectRecord) -> Any:
    """The ``ax.v1.EffectRecord`` message of an outbox record (see
    :func:`encode_effect` for the errors)."""
    state = _EFFECT_STATE_TO_PB.get(r.state)
    if state is None:
        raise ValueError(f"effect {r.key}: unknown state {r.state!r}")
    return _EffectRecordPb(
        key=r.key,
        state=state,
        result_json=_json_or_empty(r.result),
        updated_at=r.updated_at,
        task_id=r.task_id,
        node_id=r.node_id,
    )


def decode_effect(data: bytes) -> EffectRecord:
    """Parse bytes written by :func:`encode_effect`.

    Raises:
        ValueError: ``data`` is not an ``EffectRecord``, has no known state, or its
            result is not a JSON object.
    """
    return effect_from_message(_parse(_EffectRecordPb, data))


def effect_from_message(m: Any) -> EffectRecord:
    """The outbox record an ``ax.v1.EffectRecord`` message holds (a worker reading the
    API's answer).

    Raises:
        ValueError: No known state, or the result is not a JSON object.
    """
    state = _EFFECT_STATE_FROM_PB.get(m.state)
    if state is None:
        raise ValueError(f"effect {m.key}: unknown state {m.state}")
    return EffectRecord(
        key=m.key,
        state=state,
        result=_json_object_or_none(m.result_json, "result_json"),
        task_id=m.task_id,
        node_id=m.node_id,
        updated_at=m.updated_at,
    )


def _parse(message_type: Any, data: bytes) -> Any:
    try:
        return message_type.FromString(data)
    except _DecodeError as exc:
        raise ValueError(f"not an ax.v1.{message_type.__name__}: {exc}") from exc


def _json_or_empty(value: Any) -> str:
    # "" stands for None: every JSON value renders as non-empty text.
    return "" if value is None else _ENCODER.encode(value)


def _json_or_none(text: str) -> Any:
    return json.loads(text) if text else None


def _json_object_or_none(text: str, field: str) -> dict[str, Any] | None:
    if not text:
        return None
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"{field} must hold a JSON object, got {type(value).__name__}")
    return value


def _fill(field: Any, values: Mapping[str, Any]) -> None:
    """Set the entries of a map field: a dict passed to a message's constructor goes
    through the ``MutableMapping.update`` written in Python, twice as slow."""
    for key, value in values.items():
        field[key] = value


def _input_params(inp: Mapping[str, Any], members: Mapping[str, str] | None = None
                  ) -> dict[str, str]:
    # Seed readers expect map<string, string>: strings as they are, anything else as JSON
    # (``members``: each member's JSON text, made already).
    if members is not None:
        return {k: v if isinstance(v, str) else members[k] for k, v in inp.items()}
    return {k: v if isinstance(v, str) else _ENCODER.encode(v) for k, v in inp.items()}


def _blob_to_pb(ref: BlobRef | None) -> Any:
    if ref is None:
        return None
    return _BlobRefPb(uri=ref.uri, sha256=ref.sha256, size=ref.size)


def _blob_from_pb(m: Any) -> BlobRef:
    return BlobRef(uri=m.uri, sha256=m.sha256, size=m.size)


def activity_message(a: Activity | None) -> Any:
    """The ``ax.v1.Activity`` message of ``a`` (None for None): an unknown counter is
    left unset, so it reads back as unknown, never as 0."""
    if a is None:
        return None
    return _ActivityPb(seconds=a.seconds, cpu_seconds=a.cpu_seconds, io_bytes=a.io_bytes,
                       net_bytes=a.net_bytes, source=a.source)


def activity_from_message(m: Any) -> Activity:
    """An :class:`~axengine.activity.Activity` from its message (unset counters: None).

    Raises:
        ValueError: A counter or the interval is negative or not finite (a sender's bug:
            the samplers never produce one).
    """
    cpu = m.cpu_seconds if m.HasField("cpu_seconds") else None
    io = m.io_bytes if m.HasField("io_bytes") else None
    net = m.net_bytes if m.HasField("net_bytes") else None
    numbers = [m.seconds, *(v for v in (cpu, io, net) if v is not None)]
    if not all(math.isfinite(v) and v >= 0 for v in numbers):
        raise ValueError(f"activity counters must be finite and not negative: {numbers}")
    return Activity(seconds=m.seconds, cpu_seconds=cpu, io_bytes=io, net_bytes=net,
                    source=m.source)
