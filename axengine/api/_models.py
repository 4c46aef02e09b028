"""Pydantic models of the REST API: request bodies, and the replies for the OpenAPI
document.

Request models validate bodies strictly (unknown fields are errors). Reply models
describe the JSON that :mod:`axengine.wire` writes; routes send that JSON as it is
(``JSONResponse``), so a reply model documents the body and never reshapes it.
``tests/api/test_openapi.py`` checks that the writers' JSON validates against these
models (no field missing, none unknown).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from axengine import limits
from axengine.api import _ops as ops
from axengine.records import NodeState, TaskStatus

__all__ = [
    "ApprovalJson",
    "ApprovalPage",
    "CancelBody",
    "DagInfoJson",
    "DagPage",
    "DagReply",
    "DecisionBody",
    "DecisionReply",
    "ErrorBody",
    "EventJson",
    "EventPage",
    "ForkBody",
    "ForkReply",
    "HealthReply",
    "NodeJson",
    "ProblemJson",
    "ReadyReply",
    "RetryBody",
    "SubmitBody",
    "SubmitReply",
    "TaskActionReply",
    "TaskJson",
    "TaskPage",
    "TaskWithNodes",
    "ValidateBody",
    "ValidateReply",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------- requests


class SubmitBody(_Strict):
    """``POST /v1/tasks``: exactly one of ``dag``, ``dag_yaml``, ``dag_hash``."""

    dag: dict[str, Any] | None = Field(None, description="the DAG as a JSON mapping")
    dag_yaml: str | None = Field(None, description="the DAG document (YAML)")
    dag_hash: str | None = Field(None, description="a DAG stored earlier")
    input: Any = Field(None, description="task input (absent: {})")
    idempotency_key: str | None = Field(None, min_length=1,
                                        max_length=limits.MAX_IDEMPOTENCY_KEY)
    labels: dict[str, str] = Field(default_factory=dict)
    priority: int = Field(0, strict=True, ge=-(2**31), le=2**31 - 1)
    deadline_seconds: float | None = Field(None, gt=0, strict=True, allow_inf_nan=False)


class DecisionBody(_Strict):
    decision: Literal["approve", "reject"]
    comment: str = Field("", max_length=limits.MAX_COMMENT)
    data: Any = Field(None, description=(
        "approve only, optional: the data the gate passes on instead of what was reviewed "
        "(approve-with-edits; the gate's output `data`, recorded as edited)"))


class TaskCounts(BaseModel):
    """``GET /v1/task-counts``."""

    counts: dict[str, int] = Field(description="tasks per status; every status present")


class ResumeBody(_Strict):
    """``POST …/resume``: the data handed to the node's next run."""

    data: Any = Field(None, description="any JSON value; the next run's request.resume")


class CancelBody(_Strict):
    reason: str = Field("", max_length=500)


class RetryBody(_Strict):
    from_node: str = Field(min_length=1)
    input: Any = Field(None, description="override of the node's rendered input")


class ForkBody(_Strict):
    from_node: str = Field(min_length=1)
    output: Any = Field(None, description="the fork point's output in the fork (its edges "
                        "are decided from it); absent: the fork runs the node again")


class ValidateBody(_Strict):
    dag_yaml: str | None = None
    dag: dict[str, Any] | None = None
    file: str = Field(ops.REQUEST_FILE, max_length=256)


# ---------------------------------------------------------------------------- replies


class SubmitReply(_Strict):
    """A submission: the task (the earlier one for an idempotent repeat)."""

    task_id: str
    created: bool = Field(description="false for an idempotent repeat (HTTP 200)")
    dag_hash: str


class NextHopJson(_Strict):
    target: str
    taken: bool


class EffectJson(_Strict):
    """A side effect of a node (its outbox record)."""

    key: str = Field(description="the effect's idempotency key")
    state: Literal["NEW", "SENDING", "DONE", "UNKNOWN"]
    updated_at: float
    result: dict[str, Any] | None = Field(description="what the effect returned, once DONE")


class NodeJson(_Strict):
    """A node snapshot (``axengine.wire.node_json``); times are UNIX seconds, 0 = unset."""

    node_id: str
    type: str = Field(description="node type of the DAG: tool_call, llm_call, ...")
    state: NodeState
    attempt: int
    fence: int
    owner: str
    lease_until: float
    heartbeat_at: float
    progress_at: float
    progress_marker: str
    input: Any = Field(description="the rendered input: {input, prompt?, description?}")
    output: Any
    next_hops: list[NextHopJson]
    error: str
    error_retryable: bool
    evidence: str
    decision: dict[str, Any] | None = Field(
        description="a gate's decision: {decision, by, at, comment}")
    ready_at: float
    not_before: float
    started_at: float
    finished_at: float
    gate_until: float
    paused_seconds: float
    checkpoint: Any = Field(None, description="what a paused run left for the next run")
    resume: Any = Field(None, description="the data the node was resumed with")
    items: int = Field(0, description="a map node: items in its expansion (its items are "
                       "the nodes {node_id}[0], [1], ...)")
    items_started: int = Field(0, description="a map node: items started so far; a "
                               "sub-DAG node: 0")
    items_done: int = Field(0, description="a map node: items ended; a sub-DAG node: its "
                            "DAG's last nodes decided, of `items`")
    visit: int = Field(0, description="a node in a bounded loop: its visit (0 or 1: the "
                       "first); earlier visits are the nodes {node_id}#1, #2, ...")
    effects: list[EffectJson] = Field(
        default_factory=list, description="the node's outbox records (side effects), "
        "oldest first; listed by GET /v1/tasks/{task_id} only")


class TaskJson(_Strict):
    """A task without its nodes (``axengine.wire.task_json``)."""

    task_id: str
    dag_name: str
    dag_hash: str
    status: TaskStatus
    input: Any
    priority: int
    deadline: float
    labels: dict[str, str]
    idempotency_key: str
    counts: dict[str, int] = Field(description="number of nodes per state")
    created_at: float
    updated_at: float
    finished_at: float
    submitted_by: str


class TaskWithNodes(TaskJson):
    """A task and its node snapshots, by node id in DAG document order."""

    nodes: dict[str, NodeJson]


class TaskPage(_Strict):
    tasks: list[TaskJson]
    next_page_token: str | None = Field(description="null on the last page")


class EventJson(_Strict):
    """One event of a task's timeline (``axengine.wire.event_json``)."""

    task_id: str
    event_id: str
    seq: int = Field(description="store revision of the transaction; shared by its events")
    kind: str
    at: float
    node_id: str
    state: str
    attempt: int
    fence: int
    actor: str
    detail: str


class EventPage(_Strict):
    events: list[EventJson]
    last_seq: int
    next_page_token: str | None = Field(description="null when the page is short")


class DecisionReply(_Strict):
    result: Literal["committed", "already-done"]
    node: NodeJson


class ResumeReply(_Strict):
    result: Literal["committed", "already-done"]
    node: NodeJson


class TaskActionReply(_Strict):
    """Answer of cancel and retry."""

    result: str = Field(description="committed, or already-done for a repeat")
    task: TaskJson


class ForkReply(_Strict):
    """Answer of a fork: the new task."""

    forked_from: str = Field(description="<source task id>@<fork node>")
    task: TaskJson


class ProblemJson(_Strict):
    """One problem of a DAG (``axengine.wire.problem_json``)."""

    file: str
    line: int = Field(description="1-based; 0 when unknown (inline DAGs)")
    node: str | None
    field: str | None
    code: str
    message: str
    hint: str | None


class ValidateReply(_Strict):
    valid: bool
    problems: list[ProblemJson]
    hash: str | None
    name: str | None


class DagReply(_Strict):
    """A stored DAG (``axengine.wire.dag_json``)."""

    hash: str
    name: str
    dag: dict[str, Any] = Field(description="the canonical mapping")


class DagInfoJson(_Strict):
    """A stored DAG version, without its nodes (``axengine.api._ops.dag_info_json``)."""

    hash: str
    name: str
    nodes: int = Field(description="number of nodes")
    stored_revision: int = Field(description="store revision that first stored it (orders "
                                             "versions by first submission)")


class DagPage(_Strict):
    dags: list[DagInfoJson] = Field(description="by hash")
    next_page_token: str | None = Field(description="null on the last page")


class ApprovalJson(_Strict):
    """A human gate waiting for a decision (``axengine.api._ops.approval_json``)."""

    task_id: str
    dag_name: str
    submitted_by: str
    node_id: str
    description: str = Field(description="rendered description of the gate")
    input: Any = Field(description="the input rendered for the approver")
    waiting_since: float = Field(description="when the gate paused (UNIX seconds)")
    gate_until: float = Field(description="when the wait expires; 0 = no deadline")


class ApprovalPage(_Strict):
    approvals: list[ApprovalJson] = Field(description="gates of one page of PAUSED tasks, "
                                                      "newest task first")
    next_page_token: str | None = Field(description="null on the last page")


class HealthReply(_Strict):
    status: Literal["ok"]


class ReadyReply(_Strict):
    """Readiness: ``ok`` or the failing part's error, for the store and the queue."""

    ready: bool
    store: str
    queue: str
    stopping: bool | None = Field(None, description="present (true) while shutting down")


class ErrorDetail(_Strict):
    type: str = Field(description="the AxError class (InputError, NotFound, DagError...), "
                                  "or PayloadTooLarge, MethodNotAllowed, InternalError")
    message: str
    problems: list[ProblemJson] | None = Field(None, description="DagError only")


class ErrorBody(_Strict):
    """Every error answer (``axengine.wire.error_body``)."""

    error: ErrorDetail
