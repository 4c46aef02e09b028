"""The wire vocabulary of ax: records as the JSON the REST API sends and the SDK reads.

Each record has one writer and one reader here, side by side, so the server
(``axengine.api``) and the client (``axengine.client``) cannot drift apart:

============================  ==========================  ============================
record                        to JSON                     from JSON
============================  ==========================  ============================
:class:`TaskRecord`           :func:`task_json`           :func:`task_from_json`
:class:`Snapshot` (a node)    :func:`node_json`           :func:`node_from_json`
a task with its nodes         (``api._ops``)              :func:`task_nodes_from_json`
:class:`Event`                :func:`event_json`          :func:`event_from_json`
a stored DAG                  :func:`dag_json`            :func:`dag_from_json`
:class:`RunResult`            :func:`result_json`         :func:`result_from_json`
:class:`DagProblem`           :func:`problem_json`        :func:`problem_from_json`
an :class:`AxError`           :func:`error_body`          :func:`error_from_body`
============================  ==========================  ============================

Readers are lenient about absent fields (a default), so an older or newer server can
still be read; writers always send every field.

This module depends on records, errors and limits only: the client imports it without
loading the engine, the DAG loader or the template sandbox. What it needs of a DAG or a
task view it names as small protocols (:class:`DagDocument`, :class:`TaskState`).
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from axengine.errors import (
    INTERNAL_ERROR,
    AxError,
    DagError,
    DagProblem,
    class_for_http,
    code_of,
)
from axengine.records import Event, NextHop, NodeState, Snapshot, TaskRecord, TaskStatus

if TYPE_CHECKING:
    from axengine.codec import EffectRecord

__all__ = [
    "DagDocument",
    "DagSummary",
    "NodeInfo",
    "RunResult",
    "TaskNodes",
    "TaskState",
    "dag_from_json",
    "dag_json",
    "error_body",
    "error_from_body",
    "event_from_json",
    "event_json",
    "node_from_json",
    "node_json",
    "path_of",
    "problem_from_json",
    "problem_json",
    "public_message",
    "result_from_json",
    "result_json",
    "result_of",
    "task_from_json",
    "task_json",
    "task_nodes_from_json",
]

#: ``file`` of a problem that came back without one (it was in the request body).
REQUEST_FILE = "<request>"


# ---------------------------------------------------------------------------- protocols


class _Typed(Protocol):
    @property
    def type(self) -> str: ...


class _Nodes(Protocol):
    @property
    def nodes(self) -> Mapping[str, _Typed]: ...


class TaskState(Protocol):
    """What :func:`result_of` reads of a task: the engine's ``TaskView``, or the
    :class:`TaskNodes` a client decodes."""

    @property
    def task(self) -> TaskRecord: ...

    @property
    def dag(self) -> _Nodes: ...

    @property
    def snapshots(self) -> Mapping[str, Snapshot]: ...


class DagDocument(Protocol):
    """What :func:`dag_json` reads of a DAG (``axengine.dag.Dag``)."""

    @property
    def hash(self) -> str: ...

    @property
    def name(self) -> str: ...

    def canonical(self) -> dict[str, Any]: ...


# ---------------------------------------------------------------------------- events


def event_json(event: Event) -> dict[str, Any]:
    """An event as REST sends it (event pages and ``data:`` of the watch stream)."""
    return {
        "task_id": event.task_id, "event_id": event.event_id, "seq": event.seq,
        "kind": event.kind, "at": event.at, "node_id": event.node_id,
        "state": event.state, "attempt": event.attempt, "fence": event.fence,
        "actor": event.actor, "detail": event.detail,
    }


def event_from_json(data: Mapping[str, Any]) -> Event:
    """The :class:`Event` of :func:`event_json`."""
    return Event(task_id=str(data["task_id"]), event_id=str(data.get("event_id", "")),
                 kind=str(data["kind"]), at=float(data.get("at", 0.0)),
                 seq=int(data.get("seq", 0)), node_id=str(data.get("node_id") or ""),
                 state=str(data.get("state") or ""), attempt=int(data.get("attempt", 0)),
                 fence=int(data.get("fence", 0)), actor=str(data.get("actor") or ""),
                 detail=str(data.get("detail") or ""))


# ---------------------------------------------------------------------------- tasks


def task_json(task: TaskRecord) -> dict[str, Any]:
    """A task without its nodes (task lists, cancel and retry answers)."""
    return {
        "task_id": task.task_id, "dag_name": task.dag_name, "dag_hash": task.dag_hash,
        "status": task.status.value, "input": task.input, "priority": task.priority,
        "deadline": task.deadline, "labels": dict(task.labels),
        "idempotency_key": task.idempotency_key, "counts": dict(task.counts),
        "created_at": task.created_at, "updated_at": task.updated_at,
        "finished_at": task.finished_at, "submitted_by": task.submitted_by,
    }


def task_from_json(data: Mapping[str, Any]) -> TaskRecord:
    """The :class:`TaskRecord` of :func:`task_json` (``nodes``, if present, is ignored)."""
    return TaskRecord(
        task_id=str(data["task_id"]), dag_hash=str(data.get("dag_hash", "")),
        dag_name=str(data.get("dag_name", "")), input=data.get("input"),
        status=TaskStatus(data["status"]), priority=int(data.get("priority", 0)),
        deadline=float(data.get("deadline", 0.0)), labels=dict(data.get("labels") or {}),
        idempotency_key=str(data.get("idempotency_key") or ""),
        counts=dict(data.get("counts") or {}), created_at=float(data.get("created_at", 0.0)),
        updated_at=float(data.get("updated_at", 0.0)),
        finished_at=float(data.get("finished_at", 0.0)),
        submitted_by=str(data.get("submitted_by") or ""),
    )


def node_json(snap: Snapshot, node_type: str,
              effects: Iterable[EffectRecord] = ()) -> dict[str, Any]:
    """A node snapshot (input and output already resolved from blobs by the caller),
    with the node's outbox records when the caller read them."""
    return {
        "node_id": snap.node_id, "type": node_type, "state": snap.state.value,
        "attempt": snap.attempt, "fence": snap.fence, "owner": snap.owner,
        "lease_until": snap.lease_until, "heartbeat_at": snap.heartbeat_at,
        "progress_at": snap.progress_at, "progress_marker": snap.progress_marker,
        "input": snap.input, "output": snap.output,
        "next_hops": [{"target": h.target_node_id, "taken": h.is_taken}
                      for h in snap.next_hops],
        "error": snap.error, "error_retryable": snap.error_retryable,
        "evidence": snap.evidence,
        "decision": dict(snap.decision) if snap.decision is not None else None,
        "ready_at": snap.ready_at, "not_before": snap.not_before,
        "started_at": snap.started_at, "finished_at": snap.finished_at,
        "gate_until": snap.gate_until, "paused_seconds": snap.paused_seconds,
        "checkpoint": snap.checkpoint, "resume": snap.resume,
        "items": snap.items, "items_started": snap.items_started,
        "items_done": snap.items_done, "visit": snap.visit,
        "effects": [{"key": e.key, "state": e.state, "updated_at": e.updated_at,
                     "result": dict(e.result) if e.result is not None else None}
                    for e in effects],
    }


def node_from_json(task_id: str, node_id: str, data: Mapping[str, Any]) -> Snapshot:
    """The :class:`Snapshot` of :func:`node_json` (its ``type`` is the DAG's, see
    :func:`task_nodes_from_json`). Store-only fields (blob refs, hashes, counters) are
    not on the wire and come back as their defaults."""

    def num(key: str) -> float:
        return float(data.get(key) or 0.0)

    hops = tuple(NextHop(str(h["target"]), bool(h["taken"])) for h in data.get("next_hops") or ())
    decision = data.get("decision")
    return Snapshot(
        task_id=task_id, node_id=node_id, state=NodeState(data["state"]),
        attempt=int(data.get("attempt", 0)), fence=int(data.get("fence", 0)),
        owner=str(data.get("owner") or ""), lease_until=num("lease_until"),
        heartbeat_at=num("heartbeat_at"), progress_at=num("progress_at"),
        progress_marker=str(data.get("progress_marker") or ""), input=data.get("input"),
        output=data.get("output"), next_hops=hops, error=str(data.get("error") or ""),
        error_retryable=bool(data.get("error_retryable")),
        evidence=str(data.get("evidence") or ""), ready_at=num("ready_at"),
        not_before=num("not_before"), started_at=num("started_at"),
        finished_at=num("finished_at"), paused_seconds=num("paused_seconds"),
        gate_until=num("gate_until"), decision=dict(decision) if decision is not None else None,
        checkpoint=data.get("checkpoint"), resume=data.get("resume"),
        items=int(data.get("items") or 0), items_started=int(data.get("items_started") or 0),
        items_done=int(data.get("items_done") or 0), visit=int(data.get("visit") or 0),
    )


def resumes_by_itself(snap: Snapshot, node_type: str) -> bool:
    """A node its handler paused for a set time: the engine resumes it (a gate, or a
    pause until a resume call, waits for someone)."""
    return (snap.state is NodeState.PAUSED and node_type != "human_gateway"
            and snap.gate_until > 0)


@dataclass(frozen=True)
class NodeInfo:
    """What the wire says of a DAG node besides its snapshot: its type."""

    type: str


@dataclass(frozen=True)
class _NodeTypes:
    nodes: Mapping[str, NodeInfo]


@dataclass(frozen=True)
class TaskNodes:
    """A task with its node snapshots, as ``GET /v1/tasks/{id}`` answers: a
    :class:`TaskState` whose ``dag`` knows the node types only.

    Attributes:
        task: The task record.
        dag: ``dag.nodes[node_id].type`` for every node.
        snapshots: Snapshots by node id, in DAG document order.
    """

    task: TaskRecord
    dag: _NodeTypes
    snapshots: Mapping[str, Snapshot]


def task_nodes_from_json(data: Mapping[str, Any]) -> TaskNodes:
    """A task with its nodes (the body of ``GET /v1/tasks/{id}``)."""
    task = task_from_json(data)
    nodes: Mapping[str, Mapping[str, Any]] = data.get("nodes") or {}
    return TaskNodes(
        task=task,
        dag=_NodeTypes({n: NodeInfo(str(v.get("type") or "")) for n, v in nodes.items()}),
        snapshots={n: node_from_json(task.task_id, n, v) for n, v in nodes.items()},
    )


# ---------------------------------------------------------------------------- DAGs


@dataclass(frozen=True)
class DagSummary:
    """A stored DAG as ``GET /v1/dags/{hash}`` answers.

    Attributes:
        hash: Content hash.
        name: DAG name.
        dag: Canonical mapping (``axengine.dag.Dag.from_canonical`` rebuilds the DAG).
    """

    hash: str
    name: str
    dag: Mapping[str, Any]


def dag_json(dag: DagDocument) -> dict[str, Any]:
    """A stored DAG: its hash, name and canonical mapping."""
    return {"hash": dag.hash, "name": dag.name, "dag": dag.canonical()}


def dag_from_json(data: Mapping[str, Any]) -> DagSummary:
    """The :class:`DagSummary` of :func:`dag_json`."""
    return DagSummary(hash=str(data["hash"]), name=str(data["name"]), dag=dict(data["dag"]))


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True)
class RunResult:
    """The result of a run.

    Attributes:
        task_id: Task id (resume with it).
        status: Task status (``SUCCEEDED``, ``FAILED``, ``DEAD``, ``PAUSED``...).
        outputs: Output of every node that succeeded.
        path: Nodes that committed, in commit order — the path taken.
        states: State of every node.
        waiting: Gates waiting for a decision (when ``status == "PAUSED"``).
        errors: Last error of nodes that have one.
    """

    task_id: str
    status: str
    outputs: Mapping[str, Any]
    path: Sequence[str]
    states: Mapping[str, str]
    waiting: Sequence[str] = ()
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == TaskStatus.SUCCEEDED.value

    def __repr__(self) -> str:
        # Bounded: outputs can be megabytes (the attributes hold them whole). asyncio
        # reprs a run's task, result included, on its way out (Runner.run's
        # signal.getsignal): an unbounded repr cost milliseconds per run.
        shown = ", ".join(f"{f.name}={_SHORT.repr(getattr(self, f.name))}"
                          for f in dataclasses.fields(self))
        return f"RunResult({shown})"


#: How a :class:`RunResult` shows its values: a few items of each, short texts.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple = 3, 8, 12, 12
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 80, 80, 40


def path_of(events: Sequence[Event]) -> list[str]:
    """The path taken: nodes in the order they committed (a gate by its decision)."""
    return [e.node_id for e in events if e.kind in ("committed", "decided")]


def _base_id(node_id: str) -> str:
    """The DAG node of a map item (``node[3]``) or kept loop visit (``node#2``); as
    :func:`axengine.dag.base_id`, which a client does not import."""
    return node_id.split("[", 1)[0].split("#", 1)[0]


def result_of(view: TaskState, events: Sequence[Event]) -> RunResult:
    """Build a :class:`RunResult` from a task (engine view or decoded reply) and its
    timeline."""
    snaps = view.snapshots
    nodes = view.dag.nodes
    return RunResult(
        task_id=view.task.task_id,
        status=view.task.status.value,
        outputs={n: s.output for n, s in snaps.items() if s.state is NodeState.SUCCEEDED},
        path=path_of(events),
        states={n: s.state.value for n, s in snaps.items()},
        waiting=[n for n, s in snaps.items()
                 if s.state is NodeState.PAUSED
                 and nodes[_base_id(n)].type == "human_gateway"],
        errors={n: s.error for n, s in snaps.items() if s.error},
    )


def result_json(result: RunResult) -> dict[str, Any]:
    """A :class:`RunResult` as JSON (``ax run --json`` prints the same fields)."""
    return {
        "task_id": result.task_id, "status": result.status, "path": list(result.path),
        "states": dict(result.states), "outputs": dict(result.outputs),
        "waiting": list(result.waiting), "errors": dict(result.errors),
    }


def result_from_json(data: Mapping[str, Any]) -> RunResult:
    """The :class:`RunResult` of :func:`result_json`."""
    return RunResult(
        task_id=str(data["task_id"]), status=str(data["status"]),
        outputs=dict(data.get("outputs") or {}), path=[str(n) for n in data.get("path") or ()],
        states={str(k): str(v) for k, v in (data.get("states") or {}).items()},
        waiting=[str(n) for n in data.get("waiting") or ()],
        errors={str(k): str(v) for k, v in (data.get("errors") or {}).items()},
    )


# ---------------------------------------------------------------------------- errors


def problem_json(problem: DagProblem) -> dict[str, Any]:
    """A :class:`~axengine.errors.DagProblem` as JSON."""
    return {
        "file": problem.file, "line": problem.line, "node": problem.node,
        "field": problem.field, "code": problem.code, "message": problem.message,
        "hint": problem.hint,
    }


def problem_from_json(data: Mapping[str, Any], *, source: str | None = None) -> DagProblem:
    """The :class:`DagProblem` of :func:`problem_json`; ``source`` replaces its file
    (the DAG file a client sent as text)."""
    return DagProblem(message=str(data.get("message", "")),
                      file=source or str(data.get("file") or REQUEST_FILE),
                      line=int(data.get("line") or 0), node=data.get("node"),
                      field=data.get("field"), hint=data.get("hint"),
                      code=str(data.get("code") or "invalid"))


def public_message(exc: BaseException) -> str:
    """What the caller is told: the message of a known error, nothing of a bug."""
    if code_of(exc) is INTERNAL_ERROR:
        return "internal error (logged by the server)"
    return str(exc) or type(exc).__name__


def error_body(exc: BaseException) -> dict[str, Any]:
    """The REST error body ``{"error": {"type", "message"[, "problems"]}}``."""
    code = code_of(exc)
    error: dict[str, Any] = {"type": code.type, "message": public_message(exc)}
    if isinstance(exc, DagError):
        error["problems"] = [problem_json(p) for p in exc.problems]
    elif isinstance(exc, AxError) and code is not INTERNAL_ERROR:
        # A subclass keeps its own name (TemplateSecurityError...), the row its status.
        error["type"] = type(exc).__name__
    return {"error": error}


def error_from_body(status: int, body: Any, *, text: str = "", reason: str = "",
                    source: str | None = None) -> AxError:
    """The :class:`AxError` an error answer stands for (the inverse of
    :func:`error_body`): by its ``error.type``, else by its status.

    Args:
        status: HTTP status (>= 400).
        body: The parsed JSON body, or None when it was not JSON.
        text: The raw body, quoted when the body is not ours.
        reason: The reason phrase, quoted instead of an empty body.
        source: DAG file the request carried; problems located in the request body
            are reported against it.
    """
    try:
        error = body["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (KeyError, TypeError):
        kind, message, error = "", f"HTTP {status}: {text[:500].strip() or reason}", {}
    cls = class_for_http(status, kind)
    if cls is DagError:
        listed = error.get("problems")
        problems = [problem_from_json(p, source=source)
                    for p in (listed if isinstance(listed, list) else ())
                    if isinstance(p, Mapping)]
        return DagError(problems or [DagProblem(message=message, file=source or REQUEST_FILE)])
    return cls(message)
