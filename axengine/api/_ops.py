"""Operations shared by the REST and gRPC adapters.

Both wires offer the same operations; what they share lives here so they cannot drift:
turning a DAG given inline, as YAML or by hash into a validated :class:`Dag`, submitting
with an idempotency pre-check, label selectors and task pages, event pages, following a
task's events as they commit (watch), and the JSON views of records that REST answers
with.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from axengine import codec, limits
from axengine.api._auth import Principal
from axengine.api._parsing import off_loop
from axengine.api._quotas import UNLIMITED, Quotas, active_refusal, check_submit
from axengine.api._takers import Takers
from axengine.dag import Dag, load_dag_mapping, load_dag_text
from axengine.engine import (
    Engine,
    Event,
    Snapshot,
    SubmitResult,
    TaskRecord,
    TaskStatus,
    fit_problem,
)
from axengine.engine._reads import Approval, DagInfo
from axengine.errors import DagError, DagProblem, InputError, NotFound
from axengine.lru import Lru
from axengine.wire import dag_json, event_json, node_json, task_json

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "WatchEnd",
    "approval_json",
    "approvals_page",
    "dag_info_json",
    "dag_json",
    "dags_page",
    "event_json",
    "events_page",
    "follow_event_batches",
    "inline_dag_name",
    "list_page",
    "load_request_dag",
    "node_json",
    "node_snapshot",
    "parse_json_text",
    "parse_label_selector",
    "require_task",
    "start_following",
    "submit_task",
    "task_json",
    "task_view_json",
    "validate_dag",
]

#: Tasks per page when the caller does not say.
DEFAULT_PAGE = 100
#: Largest page of tasks or events.
MAX_PAGE = 1000
#: Events per page when the caller does not say.
DEFAULT_EVENTS = 1000
#: ``file`` of problems in DAGs that came in a request.
REQUEST_FILE = "<request>"
#: Kinds of the events a task's status changes write (``task_running``, ``task_failed``...).
STATUS_EVENT_PREFIX = "task_"
#: Task events after which a watch ends.
FINAL_EVENT_KINDS = frozenset({"task_succeeded", "task_failed", "task_dead", "task_cancelled"})

_SELECTOR = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_./:@-]*))?\s*$")


# ---------------------------------------------------------------------------- DAGs


def _json_text(mapping: Mapping[str, Any]) -> str:
    """The canonical JSON of an inline DAG mapping (an InputError if it is not JSON)."""
    try:
        return codec.canonical_json(dict(mapping))
    except (TypeError, ValueError) as exc:
        raise InputError(f"dag: not a JSON document: {exc}") from exc


def inline_dag_name(mapping: Mapping[str, Any], text: str | None = None) -> str:
    """``inline-<8 hex>``: the name of an inline DAG that has none, from its content
    (``text``: its canonical JSON, when already made).

    Raises:
        InputError: The mapping is not a JSON document.
    """
    text = _json_text(mapping) if text is None else text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"inline-{digest[:8]}"


def _from_mapping(mapping: Mapping[str, Any], file: str, text: str | None = None) -> Dag:
    data = dict(mapping)
    if "name" not in data:
        data["name"] = inline_dag_name(data, text)
    return load_dag_mapping(data, file=file)


#: Inline DAGs loaded lately, by the digest of their canonical JSON: a client submits the
#: same mapping again and again, and loading validates every node and template.
_LOADED: Lru[str, Dag] = Lru(256)


async def _load_mapping(mapping: Mapping[str, Any], file: str) -> Dag:
    """:func:`_from_mapping`, off the loop, or the DAG an equal mapping loaded before
    (DAGs are immutable; a mapping that failed to load is not remembered)."""
    text = _json_text(mapping)
    # (surrogatepass: a lone surrogate still makes a key; loading refuses it, by name)
    key = hashlib.sha256(f"{file}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()
    dag = _LOADED.get(key)
    if dag is None:
        dag = await off_loop(_from_mapping, mapping, file, text)
        _LOADED.put(key, dag)
    return dag


async def load_request_dag(engine: Engine, *, mapping: Mapping[str, Any] | None = None,
                           yaml_text: str | None = None, dag_hash: str | None = None,
                           file: str = REQUEST_FILE) -> Dag:
    """The DAG of a request: exactly one of an inline mapping, YAML text or a stored hash.

    Raises:
        InputError: Not exactly one source given.
        DagError: The DAG is invalid (every problem listed).
        NotFound: ``dag_hash`` names no stored DAG.
    """
    given = [name for name, value in (("dag", mapping), ("dag_yaml", yaml_text),
                                      ("dag_hash", dag_hash)) if value is not None]
    if len(given) != 1:
        raise InputError("give exactly one of dag, dag_yaml or dag_hash"
                         + (f" (got {', '.join(given)})" if given else ""))
    # Parsing and validation are CPU work proportional to the document: off the loop.
    if mapping is not None:
        return await _load_mapping(mapping, file)
    if yaml_text is not None:
        return await off_loop(load_dag_text, yaml_text, file=file)
    assert dag_hash is not None
    if not re.fullmatch(r"[0-9a-f]{8,128}", dag_hash):
        raise InputError(f"dag_hash {dag_hash!r} is not a hex digest")
    return await engine.get_dag(dag_hash)


async def validate_dag(engine: Engine, *, mapping: Mapping[str, Any] | None = None,
                       yaml_text: str | None = None, file: str = REQUEST_FILE,
                       ) -> tuple[Dag | None, list[DagProblem]]:
    """Validate without storing: the DAG, or the problems found — including a DAG too
    large for the store's transactions, which submit would refuse."""
    if (mapping is None) == (yaml_text is None):
        raise InputError("give exactly one of dag_yaml or dag")
    try:
        if mapping is not None:
            dag = await off_loop(_from_mapping, mapping, file)
        else:
            dag = await off_loop(load_dag_text, yaml_text or "", file=file)
    except DagError as exc:
        return None, list(exc.problems)
    too_large = fit_problem(dag, engine.max_txn_ops, file=file)
    if too_large is not None:
        return None, [too_large]
    return dag, []


def parse_json_text(text: str, what: str, *, empty: Any = None) -> Any:
    """A JSON value sent as text (gRPC ``*_json`` fields); ``""`` gives ``empty``.

    Strict (:func:`axengine.limits.parse_json_text`): standard JSON within the depth and
    size limits, or :class:`InputError` naming ``what``.
    """
    if text == "":
        return empty
    return limits.parse_json_text(text, what)


# ---------------------------------------------------------------------------- tasks


async def require_task(engine: Engine, task_id: str) -> TaskRecord:
    """The task record, or :class:`NotFound`."""
    return await engine.task_record(task_id)


async def submit_task(engine: Engine, dag: Dag, task_input: Any, *, idempotency_key: str,
                      labels: Mapping[str, str], priority: int,
                      deadline_seconds: float | None, principal: Principal,
                      quotas: Quotas = UNLIMITED,
                      takers: Takers | None = None) -> SubmitResult:
    """Submit as ``principal`` (recorded as ``submitted_by``; idempotency keys are
    scoped to it). The deployment's quotas are checked first; a refused request writes
    nothing. The engine decides an idempotency key atomically in the submit's
    transaction (a repeat returns the task it made, another payload is a conflict and
    stores nothing), so the key is read here only when the active-task quota would
    refuse: a repeat creates nothing and is not refused.

    With an executor's Take waiting in ``takers``, the submit's transaction also claims
    the task's first node for that executor when it can, and the Take is answered with
    the claim (:mod:`axengine.api._takers`).

    Raises:
        InputError: Bad input, or a timeout/deadline above the quotas (400).
        Forbidden: ``lane: fast`` or priority > 0 without the ``expedite`` role (403).
        QuotaExceeded: Too many unfinished tasks for this principal (429).
        Conflict: The key was used by this principal for another payload (409).
    """
    # The input itself is checked by Engine.submit, before anything is stored.
    if not -(2**31) <= priority < 2**31:
        raise InputError(f"priority {priority} is out of range (32-bit integer)")
    check_submit(dag, principal, quotas, priority=priority, deadline_seconds=deadline_seconds)
    refusal = await active_refusal(engine, principal, quotas)
    if refusal is not None and not await _is_repeat(engine, principal, idempotency_key):
        raise refusal
    taker = (takers.reserve(dag.node(n).lane for n in dag.entry_nodes)
             if takers is not None else None)
    claim = None
    try:
        result = await engine.submit(
            dag, task_input, idempotency_key=idempotency_key, labels=dict(labels),
            priority=priority, deadline_seconds=deadline_seconds,
            submitted_by=principal.name, claim_for=taker.worker_id if taker else "",
            claim_lanes=taker.lanes if taker else (),
            lease_seconds=taker.lease_seconds if taker else None)
        if result.next is not None and result.next.request is not None:
            claim = result.next
    finally:
        if taker is not None:
            assert takers is not None
            takers.answer(taker, claim)
    return result


async def _is_repeat(engine: Engine, principal: Principal, key: str) -> bool:
    """Whether ``principal`` already submitted a task under the idempotency ``key``."""
    return bool(key) and await engine.task_for_idempotency_key(principal.name, key) is not None


Selector = tuple[tuple[str, str, str | None], ...]


def parse_label_selector(text: str) -> Selector:
    """Parse ``team=risk,env!=dev,canary`` (kubectl equality selectors).

    Raises:
        InputError: A term is not ``key``, ``key=value``, ``key==value`` or ``key!=value``.
    """
    terms: list[tuple[str, str, str | None]] = []
    for raw in text.split(","):
        if not raw.strip():
            continue
        found = _SELECTOR.match(raw)
        if found is None:
            raise InputError(f"label selector term {raw.strip()!r}: use key, key=value or "
                             "key!=value")
        key, op, value = found.groups()
        terms.append((key, "!=" if op == "!=" else ("=" if op else "exists"), value))
    return tuple(terms)


def _selected(labels: Mapping[str, str], selector: Selector) -> bool:
    for key, op, value in selector:
        if op == "exists" and key not in labels:
            return False
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
    return True


async def list_page(engine: Engine, *, statuses: Sequence[str] = (), dag_name: str = "",
                    selector: Selector = (), limit: int = DEFAULT_PAGE,
                    page_token: str = "") -> tuple[list[TaskRecord], str | None]:
    """One page of tasks, newest first, and the opaque token of the next page (None:
    last). Read through the engine's secondary indexes: the cost is the page's, not the
    store's (see :meth:`Engine.task_page`); a page may be short and still have a token
    when the filters leave most index entries out."""
    wanted = set()
    for status in statuses:
        try:
            wanted.add(TaskStatus(status.upper()))
        except ValueError:
            raise InputError(f"unknown status {status!r}: use one of "
                             f"{', '.join(s.value for s in TaskStatus)}") from None
    if not 1 <= limit <= MAX_PAGE:
        raise InputError(f"limit must be between 1 and {MAX_PAGE}")
    equal = {key: value for key, op, value in selector if op == "=" and value is not None}
    return await engine.task_page(statuses=wanted, dag_name=dag_name, labels=equal,
                                  match=lambda task: _selected(task.labels, selector),
                                  limit=limit, page_token=page_token)


async def events_page(engine: Engine, task_id: str, *, after_seq: int = 0,
                      limit: int = DEFAULT_EVENTS, page_token: str = "",
                      ) -> tuple[list[Event], int, str | None]:
    """A page of events, the highest seq in it, and the token of the next page.

    With ``page_token`` (or from the start, ``after_seq == 0``) the page is sought by
    event key: it reads about ``limit`` keys whatever the timeline's length
    (:meth:`Engine.events_page`). ``after_seq`` alone (the older contract) still works
    but reads the whole timeline to filter it. The token is None when the page is
    shorter than ``limit`` (nothing more for now; a running task's next events come
    through watch, or by asking again with the last token).
    """
    if not 1 <= limit <= MAX_PAGE * 10:
        raise InputError(f"limit must be between 1 and {MAX_PAGE * 10}")
    task = await require_task(engine, task_id)
    if after_seq and not page_token:
        newer = [e for e in await engine.events(task_id) if e.seq > after_seq]
        events = newer[:limit]
        # Events of one transaction share their seq: never cut a transaction in two, or
        # ``after_seq=last_seq`` would skip the rest of it.
        while events and len(events) < len(newer) and newer[len(events)].seq == events[-1].seq:
            events.append(newer[len(events)])
        last_seq = events[-1].seq if events else after_seq
        return events, last_seq, None
    after, max_seq = _parse_events_token(page_token) if page_token else ("", after_seq)
    events, last_key, last_seq = await engine.events_page(
        task_id, after=after, max_seq=max_seq, limit=limit, settled=task.status.final)
    events = [e for e in events if e.seq > after_seq]
    return events, last_seq, (_events_token(last_key, last_seq)
                              if len(events) >= limit else None)


def _events_token(event_key: str, max_seq: int) -> str:
    return base64.urlsafe_b64encode(f"{event_key}|{max_seq}".encode()).decode().rstrip("=")


def _parse_events_token(token: str) -> tuple[str, int]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        key, _, seq = raw.rpartition("|")
        if not key or "/" in key:
            raise ValueError(token)
        return key, int(seq)
    except (ValueError, UnicodeDecodeError):
        raise InputError("page_token is not an events token this server returned") from None


# ---------------------------------------------------------------------------- watch


@dataclass(frozen=True)
class WatchEnd:
    """The watched task reached a final status; the stream ends after this."""

    task_id: str
    status: str


class _Cursor:
    """What a watch stream has sent: events of one transaction share their seq (the
    commit revision), so the cursor is the last seq plus the ids already sent at it."""

    def __init__(self, after_seq: int) -> None:
        self.after_seq = after_seq  # the client has every event up to this seq
        self.last, self.sent = after_seq, set[str]()

    def take(self, event: Event) -> bool:
        """Whether ``event`` is new (then it counts as sent): events must come in seq
        order, as a replay or a watch gives them."""
        if event.seq <= self.after_seq or event.seq < self.last or (
                event.seq == self.last and event.event_id in self.sent):
            return False
        if event.seq != self.last:
            self.last, self.sent = event.seq, set()
        self.sent.add(event.event_id)
        return True


async def follow_event_batches(engine: Engine, task_id: str, *, after_seq: int = 0,
                               stopping: asyncio.Event | None = None,
                               keepalive: float = 15.0, max_seconds: float = 3600.0,
                               ) -> AsyncGenerator[list[Event] | WatchEnd | None, None]:
    """Events of a task as they commit, in batches: first those with ``seq >
    after_seq`` (the replay: always the first item, maybe empty, yielded without
    waiting), then live ones from the engine's shared events feed (a batch: all that
    arrived by the time the stream looked, e.g. the events of one transaction), until
    the task is final (:class:`WatchEnd`), ``stopping`` is set or ``max_seconds`` pass.
    ``None`` is yielded after ``keepalive`` seconds of silence so the caller can probe
    its connection.

    The feed (:meth:`~axengine.engine.Engine.subscribe_events`) holds every event
    committed after the moment this stream subscribed, so the task's timeline is read
    once, after subscribing, and nothing committed in between is lost; the cursor drops
    what both hold. (A timeline read before subscribing would miss an event the feed
    handed out meanwhile to the followers of that moment only.)

    Raises:
        NotFound: The task does not exist (before anything is yielded).
    """
    async with engine.subscribe_events(task_id) as feed:
        timeline = await engine.timeline(task_id)
        cursor = _Cursor(after_seq)
        status = ""  # as the last status change in the replay left it
        replayed: list[Event] = []
        for event in timeline.events:
            if cursor.take(event):
                replayed.append(event)
            if event.kind.startswith(STATUS_EVENT_PREFIX):
                status = event.state
        yield replayed
        # (No status event: a task stored without its events, e.g. by a seed-era tool.)
        if TaskStatus(status or timeline.task.status).final:
            yield WatchEnd(task_id, status or timeline.task.status.value)
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + max_seconds
        stop = stopping or asyncio.Event()
        stop_task = asyncio.create_task(stop.wait())
        get_task: asyncio.Task[Event | BaseException] | None = None
        try:
            while not stop.is_set():
                remaining = end - loop.time()
                if remaining <= 0:
                    return
                if get_task is None:
                    get_task = asyncio.create_task(feed.inbox.get())
                done, _ = await asyncio.wait({get_task, stop_task},
                                             timeout=min(keepalive, remaining),
                                             return_when=asyncio.FIRST_COMPLETED)
                if get_task not in done:
                    if not done and end - loop.time() > 0:
                        yield None
                    continue
                arrived = [get_task.result()]
                get_task = None
                while not feed.inbox.empty():  # the rest of what came meanwhile: one batch
                    arrived.append(feed.inbox.get_nowait())
                out: list[Event] = []
                for item in arrived:
                    if isinstance(item, BaseException):
                        if out:
                            yield out
                        raise item
                    if not cursor.take(item):
                        continue
                    out.append(item)
                    if item.kind in FINAL_EVENT_KINDS:
                        yield out
                        yield WatchEnd(task_id, item.state)
                        return
                if out:
                    yield out
        finally:
            for pending in (stop_task, get_task):
                if pending is not None:
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending


async def start_following(engine: Engine, task_id: str, *, after_seq: int = 0,
                          stopping: asyncio.Event | None = None, keepalive: float = 15.0,
                          max_seconds: float = 3600.0,
                          ) -> AsyncGenerator[list[Event] | WatchEnd | None, None]:
    """:func:`follow_event_batches`, already subscribed and replayed: a missing task
    raises :class:`NotFound` here, before a response starts streaming, and the task is
    read once (after subscribing). An empty replay is left out."""
    batches = follow_event_batches(engine, task_id, after_seq=after_seq, stopping=stopping,
                                   keepalive=keepalive, max_seconds=max_seconds)
    try:
        replay = await anext(batches)
    except BaseException:
        await batches.aclose()
        raise
    return _after(replay, batches)


async def _after(first: list[Event] | WatchEnd | None,
                 rest: AsyncGenerator[list[Event] | WatchEnd | None, None],
                 ) -> AsyncGenerator[list[Event] | WatchEnd | None, None]:
    try:
        if first:
            yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


# ---------------------------------------------------------------------------- listings


def dag_info_json(info: DagInfo) -> dict[str, Any]:
    """A stored DAG version as ``GET /v1/dags`` lists it."""
    return {"hash": info.hash, "name": info.name, "nodes": info.nodes,
            "stored_revision": info.stored_revision}


def approval_json(approval: Approval) -> dict[str, Any]:
    """A waiting gate as ``GET /v1/approvals`` lists it."""
    return {"task_id": approval.task.task_id, "dag_name": approval.task.dag_name,
            "submitted_by": approval.task.submitted_by, "node_id": approval.node_id,
            "description": approval.description, "input": approval.input,
            "waiting_since": approval.waiting_since, "gate_until": approval.gate_until}


async def dags_page(engine: Engine, *, limit: int = DEFAULT_PAGE, page_token: str = "",
                    ) -> tuple[list[DagInfo], str | None]:
    """One page of stored DAG versions by hash; the token is the last hash of the page.

    Raises:
        InputError: ``limit`` out of range, or a token that is not a hash.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise InputError(f"limit must be between 1 and {MAX_PAGE}")
    if page_token and not re.fullmatch(r"[0-9a-f]{8,128}", page_token):
        raise InputError("page_token is not a token GET /v1/dags returned")
    return await engine.dag_page(limit=limit, after=page_token)


async def approvals_page(engine: Engine, *, limit: int = DEFAULT_PAGE, page_token: str = "",
                         ) -> tuple[list[Approval], str | None]:
    """The gates waiting in one page of PAUSED tasks (``limit`` counts tasks).

    Raises:
        InputError: ``limit`` out of range, or a bad token.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise InputError(f"limit must be between 1 and {MAX_PAGE}")
    return await engine.approvals_page(limit=limit, page_token=page_token)


# ---------------------------------------------------------------------------- views


async def resolve_input(engine: Engine, snap: Snapshot) -> Snapshot:
    """The snapshot with a blob-held rendered input read back (off the event loop)."""
    if snap.input_ref is not None and snap.input is None:
        return replace(snap, input=await engine.blob_json(snap.input_ref))
    return snap


async def node_snapshot(engine: Engine, task_id: str, node_id: str) -> tuple[Snapshot, str]:
    """One node's snapshot (input and output resolved from blobs) and its node type.

    Raises:
        NotFound: The task or the node does not exist.
    """
    task = await require_task(engine, task_id)
    dag = await engine.get_dag(task.dag_hash)
    node = dag.get_node(node_id)
    snap = await engine.snapshot(task_id, node_id) if node is not None else None
    if node is None or snap is None:
        raise NotFound(f"task {task_id!r} has no node {node_id!r}")
    if snap.output_ref is not None and snap.output is None:
        snap = replace(snap, output=await engine.blob_json(snap.output_ref))
    return await resolve_input(engine, snap), node.type


async def task_view_json(engine: Engine, task_id: str) -> dict[str, Any]:
    """A task with every node, as ``GET /v1/tasks/{id}`` answers."""
    view = await engine.get_task(task_id)
    effects = await engine.task_effects(task_id)
    body = task_json(view.task)
    body["nodes"] = {
        nid: node_json(await resolve_input(engine, snap), view.dag.node(nid).type,
                       effects.get(nid, ()))
        for nid, snap in view.snapshots.items()
    }
    return body
