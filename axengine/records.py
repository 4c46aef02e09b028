"""Records the engine keeps in the state store: tasks, node snapshots and events.

They are plain frozen dataclasses so the transition rules can be pure functions
(``dataclasses.replace`` in, writes out). ``axengine.codec`` maps them to and from the
protobuf messages of ``proto/ax/v1`` that are stored as values.

Times are UNIX seconds (float); 0 means "not set".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MemberDescriptorType
from typing import Any, TypeVar

from axengine.activity import Activity

__all__ = [
    "ACTIVE_STATES",
    "COMPOSITE_OWNERS",
    "FINAL_STATES",
    "MAP_OWNER",
    "NO_EDITS",
    "SUBDAG_OWNER",
    "BlobRef",
    "Event",
    "NextHop",
    "NodeState",
    "Snapshot",
    "TaskRecord",
    "TaskStatus",
    "replace",
]


class NodeState(StrEnum):
    """Life cycle of one node of one task (DESIGN §3)."""

    PENDING = "PENDING"  #: not reachable yet
    WAITING = "WAITING"  #: ready; queued (or backing off until ``not_before``)
    RUNNING = "RUNNING"  #: claimed under a lease and a fence
    PAUSED = "PAUSED"  #: waiting on a human or external resource; clock stopped
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  #: failed for good; ``on_failure`` route taken if the node has one
    SKIPPED = "SKIPPED"  #: no taken edge can reach it
    DEAD = "DEAD"  #: deadline passed or attempts exhausted with no failure route
    CANCELLED = "CANCELLED"


#: ``owner`` of a map node while its items run: no worker holds it, its items do.
MAP_OWNER = "ax:map"
#: ``owner`` of a sub-DAG node while its DAG runs: its nodes hold the leases.
SUBDAG_OWNER = "ax:dag"
#: Owners of a RUNNING node no worker holds: a map or a sub-DAG, whose instances run.
COMPOSITE_OWNERS = frozenset({MAP_OWNER, SUBDAG_OWNER})

#: States in which a node still holds the task open.
ACTIVE_STATES = frozenset({NodeState.WAITING, NodeState.RUNNING, NodeState.PAUSED})
#: States a node never leaves (except through an explicit admin ``retry``).
FINAL_STATES = frozenset(
    {NodeState.SUCCEEDED, NodeState.FAILED, NodeState.SKIPPED, NodeState.DEAD,
     NodeState.CANCELLED}
)


class TaskStatus(StrEnum):
    """Status of a task, derived from its nodes."""

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"  #: nothing runnable; at least one gate waits for a decision
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DEAD = "DEAD"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self in (
            TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.DEAD, TaskStatus.CANCELLED
        )


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A payload kept outside the store: content-addressed URI, sha256 and size."""

    uri: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class NextHop:
    """A decided edge: cached at commit time, never re-evaluated on resume."""

    target_node_id: str
    is_taken: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The durable state of one node of one task (``/ax/snapshots/{task}/{node}``).

    Attributes:
        state: Current :class:`NodeState`.
        attempt: Attempts started so far (claims); ``retry_count`` is ``attempt - 1``.
        fence: Increases on every claim; only the current fence may commit.
        owner: Worker id holding the lease.
        lease_until: Lease expiry (renewed by heartbeats).
        heartbeat_at: Last heartbeat (the process is alive).
        progress_at: Last business checkpoint (the work advanced).
        progress_marker: Name of that checkpoint.
        activity: Resources the run used over the worker's last sampling interval, as
            sent with a heartbeat (None: no sample; see :mod:`axengine.activity`).
        activity_at: When that activity was recorded (engine time).
        stall_verdict: The last blocking verdict recorded on the current stall
            (``note``, ``warn``, ``extend``; "" for none; see :mod:`axengine.blocking`).
        stall_progress_at: The stall that verdict was about (its ``progress_at``): a
            history of another stall is ignored.
        stall_extended_until: The deadline of the stall's one extension (0: none).
        input: Rendered input (None when kept in a blob, see ``input_ref``).
        input_ref: Blob holding the rendered input when it is large.
        input_revision: sha256 of the rendered input; base of side-effect keys.
        output: Output (None when in a blob, see ``output_ref``).
        output_ref: Blob holding the output when it is large.
        output_sha256: sha256 of the canonical output JSON (repeat detection).
        next_hops: Edges decided at commit.
        error: Last error message.
        error_retryable: Whether that error was retryable.
        evidence: Why a dependency was unavailable (node kept WAITING).
        ready_at: When the node last became WAITING (queue age).
        not_before: Earliest time the node may be claimed (retry backoff).
        started_at: When the current attempt was claimed.
        finished_at: When the node reached a final state.
        paused_at: When the node was paused (0 when not paused).
        paused_seconds: Time spent paused, not counted as node time.
        gate_until: PAUSED: when the wait ends — a ``human_gateway``'s decision deadline,
            or the time a paused handler asked to be resumed at (0: until resumed).
        resume: The data the node was resumed with (a callback's body), handed to the
            next run in its request.
        checkpoint: State the handler left for its next run (a vendor job id...).
        run_seconds: Time the current attempt ran before it paused: the resumed run has
            the rest of the node's timeout, not a new one.
        attempt_timeout: The timeout the node's ``timeout_policy`` gave the current
            attempt at its claim (0: the node's ``timeout``).
        decision: ``human_gateway``: {decision, by, at, comment} once decided.
        last_updated: Time of the last write.
        preds_left: Predecessors whose outgoing edges are not decided yet; the node is
            resolved (readied or skipped) when it reaches 0, in O(1) per decision.
        reached: Whether a decided predecessor took an edge to this node.
        items: A map node: how many items its expansion has (its rendered ``input``
            holds them); its items are the snapshots ``{node}[{index}]``.
        items_started: A map node: items started so far (in index order).
        items_done: A map node: items ended so far (succeeded, or failed for good).
        visit: A node in a bounded loop's body: its visit (0 or 1 is the first);
            earlier visits are kept as the snapshots ``{node}#{visit}``.
    """

    task_id: str
    node_id: str
    state: NodeState = NodeState.PENDING
    attempt: int = 0
    fence: int = 0
    owner: str = ""
    lease_until: float = 0.0
    heartbeat_at: float = 0.0
    progress_at: float = 0.0
    progress_marker: str = ""
    activity: Activity | None = None
    activity_at: float = 0.0
    stall_verdict: str = ""
    stall_progress_at: float = 0.0
    stall_extended_until: float = 0.0
    input: Any = None
    input_ref: BlobRef | None = None
    input_revision: str = ""
    output: Any = None
    output_ref: BlobRef | None = None
    output_sha256: str = ""
    next_hops: tuple[NextHop, ...] = ()
    error: str = ""
    error_retryable: bool = False
    evidence: str = ""
    ready_at: float = 0.0
    not_before: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    paused_at: float = 0.0
    paused_seconds: float = 0.0
    gate_until: float = 0.0
    decision: Mapping[str, Any] | None = None
    resume: Any = None
    checkpoint: Any = None
    run_seconds: float = 0.0
    attempt_timeout: float = 0.0
    last_updated: float = 0.0
    preds_left: int = 0
    reached: bool = False
    items: int = 0
    items_started: int = 0
    items_done: int = 0
    visit: int = 0

    @property
    def retry_count(self) -> int:
        return max(self.attempt - 1, 0)


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A submitted task (``/ax/tasks/{task_id}``).

    Attributes:
        dag_hash: Content hash of the DAG version the task runs.
        input: Task input (None when in a blob, see ``input_ref``).
        status: Derived :class:`TaskStatus`.
        priority: Higher runs first within a lane.
        deadline: Absolute deadline (0: none); work past it goes DEAD.
        idempotency_key: Client-chosen key ("" if none).
        payload_sha256: sha256 of (dag hash, input, labels, deadline, priority); the same
            key with another payload is a conflict.
        counts: Number of nodes per :class:`NodeState` value.
        submitted_by: The principal that submitted the task (the token's name; ``local``
            for the embedded engine). Gates with the four-eyes rule refuse its decision.
        paused_at: When the task became PAUSED (0: it is not). Its deadline does not
            run while it is PAUSED: leaving PAUSED moves ``deadline`` by the pause.
    """

    task_id: str
    dag_hash: str
    dag_name: str
    input: Any = None
    input_ref: BlobRef | None = None
    status: TaskStatus = TaskStatus.RUNNING
    priority: int = 0
    deadline: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str = ""
    payload_sha256: str = ""
    counts: Mapping[str, int] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    finished_at: float = 0.0
    submitted_by: str = ""
    paused_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    """One transition in a task's timeline (``/ax/events/{task_id}/{event_id}``).

    Events are ordered by the store revision that wrote them; ``event_id`` is unique
    (time-ordered plus random) so concurrent transitions never collide.

    Attributes:
        event_id: Key suffix, unique per task.
        seq: Store revision that committed the event (filled when read back; 0 before).
        kind: What happened: ``submitted``, ``ready``, ``claimed``, ``progress``,
            ``committed``, ``retry``, ``unavailable``, ``failed``, ``dead``, ``skipped``,
            ``paused``, ``decided``, ``lease_expired``, ``cancelled``, ``retried``,
            ``task_finished``; ``stall_note``, ``stall_warning``, ``stall_extended``
            (a blocking verdict on a running node, its evidence as ``detail``).
        node_id: Node concerned ("" for task-level events).
        state: Node state (or task status) after the transition.
        attempt: Node attempt at the time.
        fence: Node fence at the time.
        actor: Who caused it (worker id, ``reconciler``, user name, ``api``).
        detail: Free text (error, decision comment, chosen edges...).
    """

    task_id: str
    event_id: str
    kind: str
    at: float
    seq: int = 0
    node_id: str = ""
    state: str = ""
    attempt: int = 0
    fence: int = 0
    actor: str = ""
    detail: str = ""


class _NoEdits:
    """The ``data`` of a gate decision that edits nothing (None is a value an approver
    may set): what the engine, the API and the client pass when there are no edits."""

    def __repr__(self) -> str:
        return "NO_EDITS"


NO_EDITS: Any = _NoEdits()


_R = TypeVar("_R")
#: The copier :func:`replace` made for each record class, on first use.
_COPIERS: dict[type, Callable[[Any, dict[str, Any]], Any]] = {}


def replace(record: _R, /, **changes: Any) -> _R:
    """``dataclasses.replace`` for the frozen records of this package, about 2.5 times
    as fast for slotted ones: a new instance gets the fields through their slot
    descriptors, without ``__init__`` (the records have no ``__post_init__`` and no
    derived fields; a transition copies a 44-field snapshot about ten times per node).

    Raises:
        TypeError: ``changes`` names a field the record does not have.
    """
    cls = type(record)
    copier = _COPIERS.get(cls)
    if copier is None:
        copier = _COPIERS[cls] = _copier(cls)
    return copier(record, changes)  # type: ignore[no-any-return]


def _copier(cls: type) -> Callable[[Any, dict[str, Any]], Any]:
    """A function ``(record, changes) -> copy`` for the frozen dataclass ``cls``: one
    line per field, as ``dataclasses`` makes ``__init__`` (a loop over 44 fields with a
    lookup each costs twice as much), then the changed fields set by name."""
    names = [f.name for f in fields(cls)]
    if not all(name.isidentifier() for name in names):
        raise TypeError(f"{cls.__name__}: field names must be identifiers")
    setters = {name: _setter(cls, name) for name in names}

    def unknown(changes: dict[str, Any]) -> None:
        wrong = sorted(changes.keys() - setters.keys())
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(wrong)}")

    lines = ["def copy(record, changes):", "    new = new_instance(cls)"]
    lines += [f"    set_{name}(new, record.{name})" for name in names]
    lines += ["    for name, value in changes.items():",
              "        setter = setters.get(name)",
              "        if setter is None:",
              "            unknown(changes)",
              "        setter(new, value)",
              "    return new"]
    scope: dict[str, Any] = {"new_instance": object.__new__, "cls": cls,
                             "setters": setters, "unknown": unknown,
                             **{f"set_{name}": setters[name] for name in names}}
    exec("\n".join(lines), scope)  # the source holds only the checked field names
    return scope["copy"]  # type: ignore[no-any-return]


def _setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """What sets field ``name`` of a ``cls`` instance past a frozen ``__setattr__``: its
    slot's descriptor, or (a class without slots) ``object.__setattr__``."""
    slot = cls.__dict__.get(name)
    if isinstance(slot, MemberDescriptorType):
        return slot.__set__

    def set_field(obj: Any, value: Any) -> None:
        object.__setattr__(obj, name, value)
    return set_field
