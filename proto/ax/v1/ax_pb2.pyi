import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_PENDING: _ClassVar[NodeState]
    NODE_STATE_WAITING: _ClassVar[NodeState]
    NODE_STATE_RUNNING: _ClassVar[NodeState]
    NODE_STATE_PAUSED: _ClassVar[NodeState]
    NODE_STATE_SUCCEEDED: _ClassVar[NodeState]
    NODE_STATE_FAILED: _ClassVar[NodeState]
    NODE_STATE_SKIPPED: _ClassVar[NodeState]
    NODE_STATE_DEAD: _ClassVar[NodeState]
    NODE_STATE_CANCELLED: _ClassVar[NodeState]

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_PAUSED: _ClassVar[TaskStatus]
    TASK_STATUS_SUCCEEDED: _ClassVar[TaskStatus]
    TASK_STATUS_FAILED: _ClassVar[TaskStatus]
    TASK_STATUS_DEAD: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]

class EffectState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EFFECT_STATE_UNSPECIFIED: _ClassVar[EffectState]
    EFFECT_STATE_NEW: _ClassVar[EffectState]
    EFFECT_STATE_SENDING: _ClassVar[EffectState]
    EFFECT_STATE_DONE: _ClassVar[EffectState]
    EFFECT_STATE_UNKNOWN: _ClassVar[EffectState]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_APPROVE: _ClassVar[Decision]
    DECISION_REJECT: _ClassVar[Decision]

class LeaseResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_RESULT_UNSPECIFIED: _ClassVar[LeaseResult]
    LEASE_RESULT_OK: _ClassVar[LeaseResult]
    LEASE_RESULT_STALE: _ClassVar[LeaseResult]

class ClaimResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLAIM_RESULT_UNSPECIFIED: _ClassVar[ClaimResult]
    CLAIM_RESULT_CLAIMED: _ClassVar[ClaimResult]
    CLAIM_RESULT_NOT_CLAIMABLE: _ClassVar[ClaimResult]
    CLAIM_RESULT_NOT_YET: _ClassVar[ClaimResult]
    CLAIM_RESULT_DEAD: _ClassVar[ClaimResult]

class CompleteResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPLETE_RESULT_UNSPECIFIED: _ClassVar[CompleteResult]
    COMPLETE_RESULT_COMMITTED: _ClassVar[CompleteResult]
    COMPLETE_RESULT_STALE: _ClassVar[CompleteResult]
    COMPLETE_RESULT_ALREADY_DONE: _ClassVar[CompleteResult]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_PENDING: NodeState
NODE_STATE_WAITING: NodeState
NODE_STATE_RUNNING: NodeState
NODE_STATE_PAUSED: NodeState
NODE_STATE_SUCCEEDED: NodeState
NODE_STATE_FAILED: NodeState
NODE_STATE_SKIPPED: NodeState
NODE_STATE_DEAD: NodeState
NODE_STATE_CANCELLED: NodeState
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_PAUSED: TaskStatus
TASK_STATUS_SUCCEEDED: TaskStatus
TASK_STATUS_FAILED: TaskStatus
TASK_STATUS_DEAD: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
EFFECT_STATE_UNSPECIFIED: EffectState
EFFECT_STATE_NEW: EffectState
EFFECT_STATE_SENDING: EffectState
EFFECT_STATE_DONE: EffectState
EFFECT_STATE_UNKNOWN: EffectState
DECISION_UNSPECIFIED: Decision
DECISION_APPROVE: Decision
DECISION_REJECT: Decision
LEASE_RESULT_UNSPECIFIED: LeaseResult
LEASE_RESULT_OK: LeaseResult
LEASE_RESULT_STALE: LeaseResult
CLAIM_RESULT_UNSPECIFIED: ClaimResult
CLAIM_RESULT_CLAIMED: ClaimResult
CLAIM_RESULT_NOT_CLAIMABLE: ClaimResult
CLAIM_RESULT_NOT_YET: ClaimResult
CLAIM_RESULT_DEAD: ClaimResult
COMPLETE_RESULT_UNSPECIFIED: CompleteResult
COMPLETE_RESULT_COMMITTED: CompleteResult
COMPLETE_RESULT_STALE: CompleteResult
COMPLETE_RESULT_ALREADY_DONE: CompleteResult

class BlobRef(_message.Message):
    __slots__ = ("uri", "sha256", "size")
    URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    uri: str
    sha256: str
    size: int
    def __init__(self, uri: _Optional[str] = ..., sha256: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class Activity(_message.Message):
    __slots__ = ("seconds", "cpu_seconds", "io_bytes", "net_bytes", "source")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IO_BYTES_FIELD_NUMBER: _ClassVar[int]
    NET_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    cpu_seconds: float
    io_bytes: int
    net_bytes: int
    source: str
    def __init__(self, seconds: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., io_bytes: _Optional[int] = ..., net_bytes: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class TaskSnapshot(_message.Message):
    __slots__ = ("task_id", "node_id", "status", "retry_count", "last_updated", "input_params", "output_json", "next_hops", "state", "attempt", "fence", "owner", "lease_until", "heartbeat_at", "progress_at", "progress_marker", "input_json", "input_ref", "input_revision", "output_ref", "output_sha256", "error", "error_retryable", "evidence", "ready_at", "not_before", "started_at", "finished_at", "paused_at", "paused_seconds", "gate_until", "decision_json", "last_updated_unix", "preds_left", "reached", "resume_json", "checkpoint_json", "run_seconds", "activity", "activity_at", "stall_verdict", "stall_progress_at", "stall_extended_until", "attempt_timeout", "items", "items_started", "items_done", "visit")
    class InputParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class NextHop(_message.Message):
        __slots__ = ("target_node_id", "is_taken")
        TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
        IS_TAKEN_FIELD_NUMBER: _ClassVar[int]
        target_node_id: str
        is_taken: bool
        def __init__(self, target_node_id: _Optional[str] = ..., is_taken: _Optional[bool] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATED_FIELD_NUMBER: _ClassVar[int]
    INPUT_PARAMS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOPS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_AT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_MARKER_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    INPUT_REF_FIELD_NUMBER: _ClassVar[int]
    INPUT_REVISION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_REF_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHA256_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    READY_AT_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_AT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GATE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    DECISION_JSON_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    PREDS_LEFT_FIELD_NUMBER: _ClassVar[int]
    REACHED_FIELD_NUMBER: _ClassVar[int]
    RESUME_JSON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_JSON_FIELD_NUMBER: _ClassVar[int]
    RUN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_AT_FIELD_NUMBER: _ClassVar[int]
    STALL_VERDICT_FIELD_NUMBER: _ClassVar[int]
    STALL_PROGRESS_AT_FIELD_NUMBER: _ClassVar[int]
    STALL_EXTENDED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_STARTED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_DONE_FIELD_NUMBER: _ClassVar[int]
    VISIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    status: str
    retry_count: int
    last_updated: _timestamp_pb2.Timestamp
    input_params: _containers.ScalarMap[str, str]
    output_json: str
    next_hops: _containers.RepeatedCompositeFieldContainer[TaskSnapshot.NextHop]
    state: NodeState
    attempt: int
    fence: int
    owner: str
    lease_until: float
    heartbeat_at: float
    progress_at: float
    progress_marker: str
    input_json: str
    input_ref: BlobRef
    input_revision: str
    output_ref: BlobRef
    output_sha256: str
    error: str
    error_retryable: bool
    evidence: str
    ready_at: float
    not_before: float
    started_at: float
    finished_at: float
    paused_at: float
    paused_seconds: float
    gate_until: float
    decision_json: str
    last_updated_unix: float
    preds_left: int
    reached: bool
    resume_json: str
    checkpoint_json: str
    run_seconds: float
    activity: Activity
    activity_at: float
    stall_verdict: str
    stall_progress_at: float
    stall_extended_until: float
    attempt_timeout: float
    items: int
    items_started: int
    items_done: int
    visit: int
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., status: _Optional[str] = ..., retry_count: _Optional[int] = ..., last_updated: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., input_params: _Optional[_Mapping[str, str]] = ..., output_json: _Optional[str] = ..., next_hops: _Optional[_Iterable[_Union[TaskSnapshot.NextHop, _Mapping]]] = ..., state: _Optional[_Union[NodeState, str]] = ..., attempt: _Optional[int] = ..., fence: _Optional[int] = ..., owner: _Optional[str] = ..., lease_until: _Optional[float] = ..., heartbeat_at: _Optional[float] = ..., progress_at: _Optional[float] = ..., progress_marker: _Optional[str] = ..., input_json: _Optional[str] = ..., input_ref: _Optional[_Union[BlobRef, _Mapping]] = ..., input_revision: _Optional[str] = ..., output_ref: _Optional[_Union[BlobRef, _Mapping]] = ..., output_sha256: _Optional[str] = ..., error: _Optional[str] = ..., error_retryable: _Optional[bool] = ..., evidence: _Optional[str] = ..., ready_at: _Optional[float] = ..., not_before: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., paused_at: _Optional[float] = ..., paused_seconds: _Optional[float] = ..., gate_until: _Optional[float] = ..., decision_json: _Optional[str] = ..., last_updated_unix: _Optional[float] = ..., preds_left: _Optional[int] = ..., reached: _Optional[bool] = ..., resume_json: _Optional[str] = ..., checkpoint_json: _Optional[str] = ..., run_seconds: _Optional[float] = ..., activity: _Optional[_Union[Activity, _Mapping]] = ..., activity_at: _Optional[float] = ..., stall_verdict: _Optional[str] = ..., stall_progress_at: _Optional[float] = ..., stall_extended_until: _Optional[float] = ..., attempt_timeout: _Optional[float] = ..., items: _Optional[int] = ..., items_started: _Optional[int] = ..., items_done: _Optional[int] = ..., visit: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "dag_hash", "dag_name", "input_json", "input_ref", "status", "priority", "deadline", "labels", "idempotency_key", "payload_sha256", "counts", "created_at", "updated_at", "finished_at", "submitted_by", "paused_at")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DAG_HASH_FIELD_NUMBER: _ClassVar[int]
    DAG_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    INPUT_REF_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA256_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    PAUSED_AT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    dag_hash: str
    dag_name: str
    input_json: str
    input_ref: BlobRef
    status: TaskStatus
    priority: int
    deadline: float
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    payload_sha256: str
    counts: _containers.ScalarMap[str, int]
    created_at: float
    updated_at: float
    finished_at: float
    submitted_by: str
    paused_at: float
    def __init__(self, task_id: _Optional[str] = ..., dag_hash: _Optional[str] = ..., dag_name: _Optional[str] = ..., input_json: _Optional[str] = ..., input_ref: _Optional[_Union[BlobRef, _Mapping]] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., priority: _Optional[int] = ..., deadline: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., payload_sha256: _Optional[str] = ..., counts: _Optional[_Mapping[str, int]] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., submitted_by: _Optional[str] = ..., paused_at: _Optional[float] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("task_id", "event_id", "seq", "kind", "at", "node_id", "state", "attempt", "fence", "actor", "detail")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    event_id: str
    seq: int
    kind: str
    at: float
    node_id: str
    state: str
    attempt: int
    fence: int
    actor: str
    detail: str
    def __init__(self, task_id: _Optional[str] = ..., event_id: _Optional[str] = ..., seq: _Optional[int] = ..., kind: _Optional[str] = ..., at: _Optional[float] = ..., node_id: _Optional[str] = ..., state: _Optional[str] = ..., attempt: _Optional[int] = ..., fence: _Optional[int] = ..., actor: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class EffectRecord(_message.Message):
    __slots__ = ("key", "state", "result_json", "updated_at", "task_id", "node_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    state: EffectState
    result_json: str
    updated_at: float
    task_id: str
    node_id: str
    def __init__(self, key: _Optional[str] = ..., state: _Optional[_Union[EffectState, str]] = ..., result_json: _Optional[str] = ..., updated_at: _Optional[float] = ..., task_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class SubmitTaskRequest(_message.Message):
    __slots__ = ("dag_yaml", "dag_hash", "input_json", "idempotency_key", "labels", "priority", "deadline_seconds")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DAG_YAML_FIELD_NUMBER: _ClassVar[int]
    DAG_HASH_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    dag_yaml: str
    dag_hash: str
    input_json: str
    idempotency_key: str
    labels: _containers.ScalarMap[str, str]
    priority: int
    deadline_seconds: float
    def __init__(self, dag_yaml: _Optional[str] = ..., dag_hash: _Optional[str] = ..., input_json: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., deadline_seconds: _Optional[float] = ...) -> None: ...

class SubmitTaskReply(_message.Message):
    __slots__ = ("task", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    created: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetTaskReply(_message.Message):
    __slots__ = ("task", "snapshots")
    TASK_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    task: Task
    snapshots: _containers.RepeatedCompositeFieldContainer[TaskSnapshot]
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., snapshots: _Optional[_Iterable[_Union[TaskSnapshot, _Mapping]]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("statuses", "dag_name", "label_selector", "page_size", "page_token")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    DAG_NAME_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[TaskStatus]
    dag_name: str
    label_selector: str
    page_size: int
    page_token: str
    def __init__(self, statuses: _Optional[_Iterable[_Union[TaskStatus, str]]] = ..., dag_name: _Optional[str] = ..., label_selector: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksReply(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetEventsRequest(_message.Message):
    __slots__ = ("task_id", "after_seq", "limit", "page_token")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    after_seq: int
    limit: int
    page_token: str
    def __init__(self, task_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetEventsReply(_message.Message):
    __slots__ = ("events", "last_seq", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    last_seq: int
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., last_seq: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchTaskRequest(_message.Message):
    __slots__ = ("task_id", "after_seq")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    after_seq: int
    def __init__(self, task_id: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "decision", "by", "comment", "data_json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    decision: Decision
    by: str
    comment: str
    data_json: str
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., decision: _Optional[_Union[Decision, str]] = ..., by: _Optional[str] = ..., comment: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class ResumeNodeRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "data_json", "input_revision")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    INPUT_REVISION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    data_json: str
    input_revision: str
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., data_json: _Optional[str] = ..., input_revision: _Optional[str] = ...) -> None: ...

class ResumeNodeReply(_message.Message):
    __slots__ = ("snapshot", "repeated")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    REPEATED_FIELD_NUMBER: _ClassVar[int]
    snapshot: TaskSnapshot
    repeated: bool
    def __init__(self, snapshot: _Optional[_Union[TaskSnapshot, _Mapping]] = ..., repeated: _Optional[bool] = ...) -> None: ...

class DecideReply(_message.Message):
    __slots__ = ("snapshot", "repeated")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    REPEATED_FIELD_NUMBER: _ClassVar[int]
    snapshot: TaskSnapshot
    repeated: bool
    def __init__(self, snapshot: _Optional[_Union[TaskSnapshot, _Mapping]] = ..., repeated: _Optional[bool] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelTaskReply(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class RetryTaskRequest(_message.Message):
    __slots__ = ("task_id", "from_node", "input_json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_node: str
    input_json: str
    def __init__(self, task_id: _Optional[str] = ..., from_node: _Optional[str] = ..., input_json: _Optional[str] = ...) -> None: ...

class RetryTaskReply(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class ForkTaskRequest(_message.Message):
    __slots__ = ("task_id", "from_node", "output_json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_node: str
    output_json: str
    def __init__(self, task_id: _Optional[str] = ..., from_node: _Optional[str] = ..., output_json: _Optional[str] = ...) -> None: ...

class ForkTaskReply(_message.Message):
    __slots__ = ("task", "forked_from")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_FIELD_NUMBER: _ClassVar[int]
    task: Task
    forked_from: str
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., forked_from: _Optional[str] = ...) -> None: ...

class ValidateDagRequest(_message.Message):
    __slots__ = ("dag_yaml", "file_name")
    DAG_YAML_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    dag_yaml: str
    file_name: str
    def __init__(self, dag_yaml: _Optional[str] = ..., file_name: _Optional[str] = ...) -> None: ...

class DagProblem(_message.Message):
    __slots__ = ("message", "file", "line", "node", "field", "hint", "code")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    message: str
    file: str
    line: int
    node: str
    field: str
    hint: str
    code: str
    def __init__(self, message: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., node: _Optional[str] = ..., field: _Optional[str] = ..., hint: _Optional[str] = ..., code: _Optional[str] = ...) -> None: ...

class ValidateDagReply(_message.Message):
    __slots__ = ("ok", "dag_hash", "dag_name", "problems")
    OK_FIELD_NUMBER: _ClassVar[int]
    DAG_HASH_FIELD_NUMBER: _ClassVar[int]
    DAG_NAME_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    dag_hash: str
    dag_name: str
    problems: _containers.RepeatedCompositeFieldContainer[DagProblem]
    def __init__(self, ok: _Optional[bool] = ..., dag_hash: _Optional[str] = ..., dag_name: _Optional[str] = ..., problems: _Optional[_Iterable[_Union[DagProblem, _Mapping]]] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "worker_id", "lease_seconds")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    worker_id: str
    lease_seconds: float
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class TakeRequest(_message.Message):
    __slots__ = ("worker_id", "lanes", "lease_seconds", "wait_seconds")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lanes: _containers.RepeatedScalarFieldContainer[str]
    lease_seconds: float
    wait_seconds: float
    def __init__(self, worker_id: _Optional[str] = ..., lanes: _Optional[_Iterable[str]] = ..., lease_seconds: _Optional[float] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class TakeReply(_message.Message):
    __slots__ = ("claim",)
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    claim: ClaimReply
    def __init__(self, claim: _Optional[_Union[ClaimReply, _Mapping]] = ...) -> None: ...

class ClaimReply(_message.Message):
    __slots__ = ("result", "fence", "attempt", "node_type", "config_json", "input_json", "labels", "input_revision", "lease_until", "input_ref", "not_before", "reason", "submitted_by", "dag_hash", "checkpoint_json", "resume_json", "timeout", "timeout_grace", "timeout_cap", "node_id", "task_id")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESULT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    INPUT_REVISION_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    INPUT_REF_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    DAG_HASH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_JSON_FIELD_NUMBER: _ClassVar[int]
    RESUME_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_GRACE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_CAP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    result: ClaimResult
    fence: int
    attempt: int
    node_type: str
    config_json: str
    input_json: str
    labels: _containers.ScalarMap[str, str]
    input_revision: str
    lease_until: float
    input_ref: BlobRef
    not_before: float
    reason: str
    submitted_by: str
    dag_hash: str
    checkpoint_json: str
    resume_json: str
    timeout: float
    timeout_grace: float
    timeout_cap: float
    node_id: str
    task_id: str
    def __init__(self, result: _Optional[_Union[ClaimResult, str]] = ..., fence: _Optional[int] = ..., attempt: _Optional[int] = ..., node_type: _Optional[str] = ..., config_json: _Optional[str] = ..., input_json: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., input_revision: _Optional[str] = ..., lease_until: _Optional[float] = ..., input_ref: _Optional[_Union[BlobRef, _Mapping]] = ..., not_before: _Optional[float] = ..., reason: _Optional[str] = ..., submitted_by: _Optional[str] = ..., dag_hash: _Optional[str] = ..., checkpoint_json: _Optional[str] = ..., resume_json: _Optional[str] = ..., timeout: _Optional[float] = ..., timeout_grace: _Optional[float] = ..., timeout_cap: _Optional[float] = ..., node_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "fence")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    fence: int
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class GetRunReply(_message.Message):
    __slots__ = ("result", "run")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    result: LeaseResult
    run: ClaimReply
    def __init__(self, result: _Optional[_Union[LeaseResult, str]] = ..., run: _Optional[_Union[ClaimReply, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "fence", "worker_id", "lease_seconds", "activity")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    fence: int
    worker_id: str
    lease_seconds: float
    activity: Activity
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., fence: _Optional[int] = ..., worker_id: _Optional[str] = ..., lease_seconds: _Optional[float] = ..., activity: _Optional[_Union[Activity, _Mapping]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("result", "lease_until")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    result: LeaseResult
    lease_until: float
    def __init__(self, result: _Optional[_Union[LeaseResult, str]] = ..., lease_until: _Optional[float] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "fence", "worker_id", "marker", "lease_seconds")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MARKER_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    fence: int
    worker_id: str
    marker: str
    lease_seconds: float
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., fence: _Optional[int] = ..., worker_id: _Optional[str] = ..., marker: _Optional[str] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class ProgressReply(_message.Message):
    __slots__ = ("result", "progress_at")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_AT_FIELD_NUMBER: _ClassVar[int]
    result: LeaseResult
    progress_at: float
    def __init__(self, result: _Optional[_Union[LeaseResult, str]] = ..., progress_at: _Optional[float] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "fence", "worker_id", "state_json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    fence: int
    worker_id: str
    state_json: str
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., fence: _Optional[int] = ..., worker_id: _Optional[str] = ..., state_json: _Optional[str] = ...) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: LeaseResult
    def __init__(self, result: _Optional[_Union[LeaseResult, str]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("task_id", "node_id", "fence", "worker_id", "success", "failure", "unavailable", "paused", "claim_lanes", "claim_lease_seconds", "claim_node", "claim_task")
    class Success(_message.Message):
        __slots__ = ("output_json", "output_ref")
        OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
        OUTPUT_REF_FIELD_NUMBER: _ClassVar[int]
        output_json: str
        output_ref: BlobRef
        def __init__(self, output_json: _Optional[str] = ..., output_ref: _Optional[_Union[BlobRef, _Mapping]] = ...) -> None: ...
    class Failure(_message.Message):
        __slots__ = ("message", "retryable", "details_json")
        MESSAGE_FIELD_NUMBER: _ClassVar[int]
        RETRYABLE_FIELD_NUMBER: _ClassVar[int]
        DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
        message: str
        retryable: bool
        details_json: str
        def __init__(self, message: _Optional[str] = ..., retryable: _Optional[bool] = ..., details_json: _Optional[str] = ...) -> None: ...
    class Unavailable(_message.Message):
        __slots__ = ("dependency", "evidence", "retry_after")
        DEPENDENCY_FIELD_NUMBER: _ClassVar[int]
        EVIDENCE_FIELD_NUMBER: _ClassVar[int]
        RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
        dependency: str
        evidence: str
        retry_after: float
        def __init__(self, dependency: _Optional[str] = ..., evidence: _Optional[str] = ..., retry_after: _Optional[float] = ...) -> None: ...
    class Paused(_message.Message):
        __slots__ = ("reason", "seconds", "checkpoint_json")
        REASON_FIELD_NUMBER: _ClassVar[int]
        SECONDS_FIELD_NUMBER: _ClassVar[int]
        CHECKPOINT_JSON_FIELD_NUMBER: _ClassVar[int]
        reason: str
        seconds: float
        checkpoint_json: str
        def __init__(self, reason: _Optional[str] = ..., seconds: _Optional[float] = ..., checkpoint_json: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    CLAIM_LANES_FIELD_NUMBER: _ClassVar[int]
    CLAIM_LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_NODE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TASK_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    fence: int
    worker_id: str
    success: CompleteRequest.Success
    failure: CompleteRequest.Failure
    unavailable: CompleteRequest.Unavailable
    paused: CompleteRequest.Paused
    claim_lanes: _containers.RepeatedScalarFieldContainer[str]
    claim_lease_seconds: float
    claim_node: str
    claim_task: str
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., fence: _Optional[int] = ..., worker_id: _Optional[str] = ..., success: _Optional[_Union[CompleteRequest.Success, _Mapping]] = ..., failure: _Optional[_Union[CompleteRequest.Failure, _Mapping]] = ..., unavailable: _Optional[_Union[CompleteRequest.Unavailable, _Mapping]] = ..., paused: _Optional[_Union[CompleteRequest.Paused, _Mapping]] = ..., claim_lanes: _Optional[_Iterable[str]] = ..., claim_lease_seconds: _Optional[float] = ..., claim_node: _Optional[str] = ..., claim_task: _Optional[str] = ...) -> None: ...

class CompleteReply(_message.Message):
    __slots__ = ("result", "snapshot", "next", "acked")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    result: CompleteResult
    snapshot: TaskSnapshot
    next: ClaimReply
    acked: bool
    def __init__(self, result: _Optional[_Union[CompleteResult, str]] = ..., snapshot: _Optional[_Union[TaskSnapshot, _Mapping]] = ..., next: _Optional[_Union[ClaimReply, _Mapping]] = ..., acked: _Optional[bool] = ...) -> None: ...

class CompleteStreamRequest(_message.Message):
    __slots__ = ("id", "request")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: CompleteRequest
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[CompleteRequest, _Mapping]] = ...) -> None: ...

class CompleteStreamReply(_message.Message):
    __slots__ = ("id", "reply", "code", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    reply: CompleteReply
    code: int
    message: str
    def __init__(self, id: _Optional[int] = ..., reply: _Optional[_Union[CompleteReply, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class EffectBeginRequest(_message.Message):
    __slots__ = ("key", "task_id", "node_id", "fence", "worker_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    task_id: str
    node_id: str
    fence: int
    worker_id: str
    def __init__(self, key: _Optional[str] = ..., task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., fence: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class EffectBeginReply(_message.Message):
    __slots__ = ("lease", "previous", "result_json")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseResult
    previous: EffectState
    result_json: str
    def __init__(self, lease: _Optional[_Union[LeaseResult, str]] = ..., previous: _Optional[_Union[EffectState, str]] = ..., result_json: _Optional[str] = ...) -> None: ...

class EffectDoneRequest(_message.Message):
    __slots__ = ("key", "task_id", "node_id", "fence", "worker_id", "result_json")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    key: str
    task_id: str
    node_id: str
    fence: int
    worker_id: str
    result_json: str
    def __init__(self, key: _Optional[str] = ..., task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., fence: _Optional[int] = ..., worker_id: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class EffectDoneReply(_message.Message):
    __slots__ = ("lease", "record")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseResult
    record: EffectRecord
    def __init__(self, lease: _Optional[_Union[LeaseResult, str]] = ..., record: _Optional[_Union[EffectRecord, _Mapping]] = ...) -> None: ...

class EffectGetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...
