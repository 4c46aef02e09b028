"""The client's logic without I/O: every operation is a generator of effects.

An operation (``Core.submit``, ``Core.wait``...) builds its requests, yields one
:data:`Effect` at a time and is sent back what it produced: an :class:`httpx.Response`,
the :class:`httpx.TransportError` that stopped a request, a line of an event stream. It
decodes answers with :mod:`axengine.wire`, maps errors, decides retries and backoff, and
returns its result (``StopIteration.value``). :class:`~axengine.client.Client` and
:class:`~axengine.client.AsyncClient` only perform the effects, with ``httpx.Client``
and ``httpx.AsyncClient``: the logic is written once (httpx's own ``BaseClient`` /
``Client`` / ``AsyncClient`` split, one step further).

Operations compose with ``yield from``: ``wait`` is ``get``, ``decide``, ``watch`` and
``result`` in a loop. ``watch`` hands each event out as an :class:`Emit` effect; ``wait``
consumes them itself, the shells' ``watch`` methods yield them to the caller.

The public operations' signatures and docstrings are written here only: the shells'
methods are these operations, bound by ``sync_op`` / ``async_op`` (``sync_stream`` /
``async_stream`` for ``watch``), which drive them with :class:`Steps` and show them with
:func:`describe_as_method`.
"""

from __future__ import annotations

import functools
import inspect
import json
import random
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar
from urllib.parse import quote

import httpx

from axengine import wire
from axengine.client._inline import inline_subdags
from axengine.errors import ApiUnavailable, AxError, InputError
from axengine.lru import DAG_CACHE_ENTRIES, Lru
from axengine.records import NO_EDITS, Event, TaskRecord, TaskStatus
from axengine.wire import RunResult

if TYPE_CHECKING:
    from axengine.dag import Dag
    from axengine.engine import TaskView

__all__ = [
    "DEFAULT_RETRY_FOR",
    "DEFAULT_TIMEOUT",
    "POLL_INTERVAL",
    "STREAM_READ_TIMEOUT",
    "CloseStream",
    "Core",
    "DagLike",
    "Effect",
    "Emit",
    "NextLine",
    "Op",
    "OpenStream",
    "Send",
    "Sleep",
    "SseParser",
    "Steps",
    "Submission",
    "describe_as_method",
    "error_from_response",
]

#: Seconds one HTTP request may take.
DEFAULT_TIMEOUT = 30.0
#: Seconds a request is retried while the server cannot be reached.
DEFAULT_RETRY_FOR = 30.0
#: Longest single read while following a task's event stream (the server sends a
#: keepalive every 15 s, so a healthy stream never hits it).
STREAM_READ_TIMEOUT = 20.0
#: Seconds between two polls when the event stream cannot be used.
POLL_INTERVAL = 0.5
_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 1.0
_EVENTS_PAGE = 1000
#: Bound of the paging loop (ten million events: far more than a task has).
_MAX_EVENT_PAGES = 10_000
_FINAL = frozenset(s.value for s in TaskStatus if s.final)


#: A DAG given to ``submit``: a file path, a :class:`~axengine.dag.Dag`, a parsed
#: mapping or the YAML text itself.
DagLike: TypeAlias = "str | Path | Dag | Mapping[str, Any]"

T = TypeVar("T")


# ---------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Send:
    """Send one request; answered with the :class:`httpx.Response` (body read), or the
    :class:`httpx.TransportError` that stopped it."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    body: Any = None

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(self.method, self.path, json=self.body, params=self.params)


@dataclass(frozen=True)
class OpenStream:
    """Open a streamed ``GET`` (closing any stream still open); answered like
    :class:`Send`, the body unread unless the status is an error."""

    path: str
    params: Mapping[str, Any]
    timeout: httpx.Timeout

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request("GET", self.path, params=self.params, timeout=self.timeout,
                                  headers={"Accept": "text/event-stream"})


@dataclass(frozen=True)
class NextLine:
    """Read the next line of the open stream; answered with the line, or None when the
    stream ended or broke."""


@dataclass(frozen=True)
class CloseStream:
    """Close the open stream, if any; answered with None."""


@dataclass(frozen=True)
class Sleep:
    """Pause; answered with None."""

    seconds: float


@dataclass(frozen=True)
class Emit:
    """Hand an event of a followed stream to the caller; answered with None."""

    event: Event


Effect: TypeAlias = Send | OpenStream | NextLine | CloseStream | Sleep | Emit
#: An operation: yields effects, is sent their answers, returns its result.
Op: TypeAlias = Generator[Effect, Any, T]


# ---------------------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Submission:
    """Answer to a submission.

    Attributes:
        task_id: The task (the earlier one for an idempotent repeat).
        created: False when the idempotency key named an earlier, identical submission.
        dag_hash: Content hash of the DAG the task runs.
    """

    task_id: str
    created: bool
    dag_hash: str


def error_from_response(response: httpx.Response, *, source: str | None = None) -> AxError:
    """The :class:`AxError` an error response stands for, by its ``error.type``
    (:func:`axengine.wire.error_from_body`).

    Args:
        response: An HTTP response with status >= 400, its body read.
        source: DAG file the request carried; problems located in the request body are
            reported against it.
    """
    try:
        body = response.json()
    except ValueError:
        body = None
    return wire.error_from_body(response.status_code, body, text=response.text,
                                reason=response.reason_phrase, source=source)


def _dag_body(dag: DagLike) -> tuple[dict[str, Any], str | None]:
    """The DAG part of a submit body, and the file it came from (for error messages)."""
    if isinstance(dag, Mapping):
        return {"dag": dict(dag)}, None
    if isinstance(dag, str) and ("\n" in dag or dag.lstrip().startswith(("name:", "nodes:"))):
        return {"dag_yaml": dag}, None
    if not isinstance(dag, str | Path):
        return {"dag": dag.canonical()}, None
    path = Path(dag)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read DAG file {path}: {exc.strerror or exc} (pass a path, "
                         "a Dag, a mapping or the YAML text)") from exc
    # The server reads no file: sub-DAG files (`dag: <path>`) are sent inline.
    inlined = inline_subdags(text, path)
    if inlined is not None:
        return {"dag": inlined}, str(path)
    return {"dag_yaml": text}, str(path)


def _pending_gates(task: Mapping[str, Any], decide: Mapping[str, str],
                   done: set[str]) -> list[str]:
    nodes: Mapping[str, Mapping[str, Any]] = task.get("nodes") or {}
    return [n for n, v in nodes.items() if v["state"] == "PAUSED"
            and v.get("type") == "human_gateway" and n in decide and n not in done]


def _seg(value: str) -> str:
    """``value`` as one URL path segment: a ``/``, ``?``, ``#`` or ``..`` in an id cannot
    reach another route or another task (``ax approve 'x/../t-1' gate`` approved t-1).

    Raises:
        InputError: ``value`` is empty (``/v1/tasks/`` is the list, not a task).
    """
    if not value:
        raise InputError("an empty id names no task, node or DAG")
    return quote(value, safe="").replace(".", "%2E")


class SseParser:
    """Server-sent events, one line at a time: returns each complete message."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        """Take one line; return ``(event, data)`` when it completes a message."""
        if not line:
            if not self._data:
                self._event = "message"
                return None
            message = (self._event, "\n".join(self._data))
            self._event, self._data = "message", []
            return message
        if line.startswith(":"):
            return None  # keepalive comment
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


class _Backoff:
    """Jittered exponential delays until ``retry_for`` seconds have passed."""

    def __init__(self, retry_for: float) -> None:
        self._give_up = time.monotonic() + retry_for
        self._delay = _FIRST_BACKOFF

    def next(self) -> float | None:
        pause = random.uniform(0.0, self._delay)
        if time.monotonic() + pause >= self._give_up:
            return None
        self._delay = min(self._delay * 2, _MAX_BACKOFF)
        return pause


def _retryable(exc: httpx.TransportError | None, status: int, idempotent: bool) -> bool:
    if exc is not None:
        # Not connected means not sent: any request may be repeated.
        return idempotent or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    return idempotent and status in (502, 503, 504)


def _relay(op: Op[None], on_emit: Callable[[Event], bool]) -> Op[None]:
    """Run ``op`` inside the calling operation: its effects go out, its events go to
    ``on_emit``, which returns True to stop following (``op`` is closed then)."""
    reply: Any = None
    try:
        while True:
            try:
                effect = op.send(reply)
            except StopIteration:
                return
            reply = None
            if isinstance(effect, Emit):
                if on_emit(effect.event):
                    return
            else:
                reply = yield effect
    finally:
        op.close()


# ---------------------------------------------------------------------------- driving


class Steps(Generic[T]):
    """An operation as a shell drives it: iterating gives its effects; set ``reply`` to an
    effect's answer before taking the next one (an :class:`Emit` is answered with None);
    ``result`` is what it returned. As a context manager, closes the operation on exit.
    """

    result: T

    def __init__(self, op: Op[T]) -> None:
        self._op = op
        self.reply: Any = None

    def __iter__(self) -> Steps[T]:
        return self

    def __next__(self) -> Effect:
        reply, self.reply = self.reply, None
        try:
            return self._op.send(reply)
        except StopIteration as stop:
            self.result = stop.value
            raise

    def __enter__(self) -> Steps[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._op.close()


def describe_as_method(method: Callable[..., Any], op: Callable[..., Any], owner: str,
                       returns: str | None = None) -> None:
    """Give a shell's ``method`` that runs the operation ``op`` the name, docstring and
    parameters of ``op`` (``functools.wraps``), as a method of the class ``owner``
    returning ``returns``, by default what ``op`` returns (``Op[X]``: ``X``); so help()
    and documentation tools show the operation as the shell's method."""
    module = method.__module__
    functools.update_wrapper(method, op)
    result = returns or str(op.__annotations__["return"]).removeprefix("Op[").removesuffix("]")
    signature = inspect.signature(op).replace(return_annotation=result)
    vars(method)["__signature__"] = signature
    method.__annotations__ = {**op.__annotations__, "return": result}
    method.__qualname__ = f"{owner}.{op.__name__}"
    method.__module__ = module


# ---------------------------------------------------------------------------- operations


class Core:
    """Request building, decoding, error mapping, retries and the wait loop, for one
    server. Holds no connection: the shells own those.

    Its public operations (all but :meth:`call`) are the methods of
    :class:`~axengine.client.Client` and :class:`~axengine.client.AsyncClient`, with the
    signatures and docstrings written here; a docstring says what the client's method
    returns, which the operation returns when it ends (``Op[X]``: ``X``).

    Args:
        url: Base URL of the REST listener.
        token: Bearer token ("" when the server runs without auth).
        timeout: Seconds per request.
        retry_for: Seconds to keep retrying while the server cannot be reached.
    """

    def __init__(self, url: str, token: str, *, timeout: float, retry_for: float) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_for = retry_for
        self.headers = {"Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        #: DAGs read by hash (immutable), bounded: an executor serves many submitters.
        self._dags: Lru[str, Dag] = Lru(DAG_CACHE_ENTRIES)

    def call(self, method: str, path: str, *, body: Any = None,
             params: Mapping[str, Any] | None = None, idempotent: bool,
             source: str | None = None) -> Op[Any]:
        """One request, retried while that is harmless; returns the JSON answer.

        A request that never reached the server (connection refused) is retried for up
        to ``retry_for`` seconds; one that may have reached it (connection dropped, 502,
        503, 504) only when ``idempotent``.

        Raises:
            ApiUnavailable: The server could not be reached in time.
            AxError: The server's error answer, as its class.
        """
        backoff = _Backoff(self.retry_for)
        while True:
            reply = yield Send(method, path, params, body)
            if isinstance(reply, httpx.TransportError):
                pause = backoff.next() if _retryable(reply, 0, idempotent) else None
                if pause is None:
                    raise ApiUnavailable(f"cannot reach the ax API at {self.url}: "
                                         f"{type(reply).__name__}: {reply}") from reply
            elif reply.status_code < 400:
                return reply.json()
            else:
                pause = (backoff.next() if _retryable(None, reply.status_code, idempotent)
                         else None)
                if pause is None:
                    raise error_from_response(reply, source=source)
            yield Sleep(pause)

    def submit(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
               labels: Mapping[str, str] | None = None, priority: int = 0,
               deadline_seconds: float | None = None) -> Op[Submission]:
        """Submit a task. The same ``idempotency_key`` with the same payload names the
        same task (``created=False``); with another payload it raises ``Conflict``.

        Args:
            dag: A DAG file path, a :class:`~axengine.dag.Dag`, a parsed mapping or the
                YAML text itself.
            input: The task's input (``{}`` when None).
            idempotency_key: Names the submission: repeating it is harmless (and retried
                when the connection drops).
            labels: ``key: value`` labels to find the task by (:meth:`list_tasks`).
            priority: The task's priority; above the default (0) needs the ``expedite``
                role.
            deadline_seconds: Seconds the task has to finish; past them its unfinished
                nodes fail.
        """
        body, source = _dag_body(dag)
        body["input"] = {} if input is None else input
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        if labels:
            body["labels"] = dict(labels)
        if priority:
            body["priority"] = priority
        if deadline_seconds is not None:
            body["deadline_seconds"] = deadline_seconds
        data = yield from self.call("POST", "/v1/tasks", body=body,
                                    idempotent=bool(idempotency_key), source=source)
        return Submission(str(data["task_id"]), bool(data["created"]), str(data["dag_hash"]))

    def get(self, task_id: str) -> Op[dict[str, Any]]:
        """The task and its nodes, as the REST API returns them."""
        return dict((yield from self.call("GET", f"/v1/tasks/{_seg(task_id)}", idempotent=True)))

    def events(self, task_id: str, *, after_seq: int = 0) -> Op[list[Event]]:
        """The task's events in commit order (every page), after ``after_seq``."""
        out: list[Event] = []
        params: dict[str, Any] = {"after_seq": after_seq, "limit": _EVENTS_PAGE}
        for _ in range(_MAX_EVENT_PAGES):
            page = yield from self.call("GET", f"/v1/tasks/{_seg(task_id)}/events", idempotent=True,
                                        params=params)
            out.extend(wire.event_from_json(e) for e in page["events"])
            if len(page["events"]) < _EVENTS_PAGE:
                break
            # The token seeks (a page costs a page); a server without it pages by seq.
            token = page.get("next_page_token")
            params = ({"page_token": token, "limit": _EVENTS_PAGE} if token else
                      {"after_seq": int(page["last_seq"]), "limit": _EVENTS_PAGE})
        return out

    def result(self, task_id: str) -> Op[RunResult]:
        """The task's current :class:`~axengine.wire.RunResult` (final or not)."""
        task = yield from self.get(task_id)
        events = yield from self.events(task_id)
        return wire.result_of(wire.task_nodes_from_json(task), events)

    def task_view(self, task_id: str) -> Op[TaskView]:
        """The task as the engine sees it: record, DAG and node snapshots (loads the
        engine and the DAG model on first use)."""
        # Imported here: the DAG model and the engine's view cost the template sandbox
        # and the engine, which nothing else of the client needs.
        from axengine.dag import Dag
        from axengine.engine import TaskView

        task = wire.task_nodes_from_json((yield from self.get(task_id)))
        dag_hash = task.task.dag_hash
        dag = self._dags.get(dag_hash)
        if dag is None:
            data = yield from self.call("GET", f"/v1/dags/{_seg(dag_hash)}", idempotent=True)
            dag = Dag.from_canonical(wire.dag_from_json(data).dag)
            self._dags.put(dag_hash, dag)
        return TaskView(task=task.task, dag=dag, snapshots=task.snapshots,
                        revision=0)

    def watch(self, task_id: str, *, after_seq: int = 0,
              timeout: float | None = None) -> Op[None]:
        """Follow the task's events as they commit (server-sent events): the client's
        ``watch`` yields each one (this operation emits it as an :class:`Emit` effect).

        Ends when the task is final, when ``timeout`` seconds have passed, or when the
        stream breaks (the server restarted: call again with the last ``seq``).

        Raises:
            AxError: The server refused the watch (unknown task...), or reported a
                failure in the stream.
        """
        end = None if timeout is None else time.monotonic() + timeout
        read = STREAM_READ_TIMEOUT
        if end is not None:
            read = max(0.05, min(read, end - time.monotonic()))
        response = yield OpenStream(f"/v1/tasks/{_seg(task_id)}/watch", {"after_seq": after_seq},
                                    httpx.Timeout(self.timeout, read=read))
        if isinstance(response, httpx.TransportError):
            return
        if response.status_code >= 400:
            raise error_from_response(response)
        parser = SseParser()
        while end is None or time.monotonic() < end:
            line = yield NextLine()
            if line is None:
                break
            message = parser.feed(line)
            if message is None:
                continue
            kind, data = message
            if kind == "end":
                break
            if kind == "error":
                raise wire.error_from_body(500, json.loads(data), text=data)
            yield Emit(wire.event_from_json(json.loads(data)))
        yield CloseStream()

    def wait(self, task_id: str, timeout: float | None = None, *,
             decide: Mapping[str, str] | None = None,
             on_event: Callable[[Event], None] | None = None,
             comment: str = "decided by the SDK") -> Op[RunResult]:
        """Wait until the task is final, or paused at a gate ``decide`` does not cover;
        return its :class:`~axengine.wire.RunResult`.

        Args:
            task_id: The task.
            timeout: Give up waiting after this many seconds (the task goes on).
            decide: Decisions for gates, by node id, made when they are reached.
            on_event: Called with every event of the task in commit order, up to the
                moment the wait returns (a task already paused or final when the wait
                starts shows its history too).
            comment: The comment recorded with the decisions of ``decide``.
        """
        decide = dict(decide or {})
        end = None if timeout is None else time.monotonic() + timeout
        decided: set[str] = set()
        after_seq = 0
        seen = False

        def take(event: Event) -> bool:
            nonlocal after_seq, seen
            seen = True
            after_seq = max(after_seq, event.seq)
            if on_event is not None:
                on_event(event)
            return event.kind == "task_paused"

        while end is None or time.monotonic() < end:
            task = yield from self.get(task_id)
            if task["status"] in _FINAL:
                break
            gates = _pending_gates(task, decide, decided)
            for gate in gates:
                yield from self.decide(task_id, gate, decide[gate], comment=comment)
                decided.add(gate)
            if task["status"] == "PAUSED" and not gates and not any(
                    v["state"] == "PAUSED" and v.get("type") != "human_gateway"
                    and v.get("gate_until") for v in (task.get("nodes") or {}).values()):
                break  # waiting for a person; a pause with a set time ends by itself
            left = None if end is None else end - time.monotonic()
            seen = False
            yield from _relay(self.watch(task_id, after_seq=after_seq, timeout=left), take)
            yield CloseStream()  # when `take` stopped following
            if not seen:
                # No stream (or it broke at once): poll instead of spinning.
                yield Sleep(POLL_INTERVAL if end is None
                            else max(0.0, min(POLL_INTERVAL, end - time.monotonic())))
        if on_event is not None:
            # What the stream had not shown yet (all of it when the task was paused or
            # final from the start): the caller sees the history before the result.
            for event in (yield from self.events(task_id, after_seq=after_seq)):
                take(event)
        return (yield from self.result(task_id))

    def run(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
            labels: Mapping[str, str] | None = None, priority: int = 0,
            deadline_seconds: float | None = None, decide: Mapping[str, str] | None = None,
            timeout: float | None = None,
            on_event: Callable[[Event], None] | None = None) -> Op[RunResult]:
        """:meth:`submit`, then :meth:`wait` for the result (same arguments)."""
        sub = yield from self.submit(dag, input, idempotency_key=idempotency_key,
                                     labels=labels, priority=priority,
                                     deadline_seconds=deadline_seconds)
        return (yield from self.wait(sub.task_id, timeout, decide=decide, on_event=on_event))

    def decide(self, task_id: str, node: str, decision: str, comment: str = "", *,
               data: Any = NO_EDITS) -> Op[str]:
        """Approve or reject a waiting gate: ``committed`` or ``already-done``. ``data``
        (approve only) is approve-with-edits: what the gate passes on instead of what
        was reviewed."""
        body: dict[str, Any] = {"decision": decision, "comment": comment}
        if data is not NO_EDITS:
            body["data"] = data
        url = f"/v1/tasks/{_seg(task_id)}/nodes/{_seg(node)}/decision"
        reply = yield from self.call("POST", url, body=body, idempotent=True)
        return str(reply["result"])

    def approve(self, task_id: str, node: str, comment: str = "", *,
                data: Any = NO_EDITS) -> Op[str]:
        """Approve a waiting gate (:meth:`decide` with ``approve``); ``data``: with
        edits."""
        return self.decide(task_id, node, "approve", comment, data=data)

    def reject(self, task_id: str, node: str, comment: str = "") -> Op[str]:
        """Reject a waiting gate (:meth:`decide` with ``reject``)."""
        return self.decide(task_id, node, "reject", comment)

    def resume(self, task_id: str, node: str, data: Any = None) -> Op[str]:
        """Resume a node its handler paused; ``data`` goes to its next run:
        ``committed`` or ``already-done``."""
        reply = yield from self.call("POST", f"/v1/tasks/{_seg(task_id)}/nodes/{_seg(node)}/resume",
                                     body={"data": data}, idempotent=True)
        return str(reply["result"])

    def cancel(self, task_id: str, reason: str = "") -> Op[str]:
        """Cancel every unfinished node: ``committed`` or ``already-done``."""
        data = yield from self.call("POST", f"/v1/tasks/{_seg(task_id)}/cancel",
                                    body={"reason": reason}, idempotent=True)
        return str(data["result"])

    def retry(self, task_id: str, from_node: str, *, input: Any = None) -> Op[str]:
        """Re-run a finished task from ``from_node`` (admin); ``input`` overrides that
        node's rendered input."""
        body: dict[str, Any] = {"from_node": from_node}
        if input is not None:
            body["input"] = input
        data = yield from self.call("POST", f"/v1/tasks/{_seg(task_id)}/retry", body=body,
                                    idempotent=False)
        return str(data["result"])

    def fork(self, task_id: str, from_node: str, *, output: Any = None) -> Op[str]:
        """Fork the finished task ``task_id`` at ``from_node`` (admin) and return the new
        task's id: it shares the history before ``from_node`` and runs from there.
        ``output`` (not None) is ``from_node``'s output in the fork, its edges decided
        from it; None runs ``from_node`` again."""
        body: dict[str, Any] = {"from_node": from_node}
        if output is not None:
            body["output"] = output
        data = yield from self.call("POST", f"/v1/tasks/{_seg(task_id)}/fork", body=body,
                                    idempotent=False)
        return str(data["task"]["task_id"])

    def list_tasks(self, *, status: str | None = None, dag: str | None = None,
                   label: str | None = None, limit: int = 100) -> Op[list[TaskRecord]]:
        """Tasks matching the filters (newest first), at most ``limit``; ``label`` is
        ``key=value``."""
        params = {k: v for k, v in (("status", status), ("dag", dag), ("label", label)) if v}
        out: list[TaskRecord] = []
        token: str | None = None
        while len(out) < limit:
            page = yield from self.call("GET", "/v1/tasks", idempotent=True, params={
                **params, "limit": min(1000, limit - len(out)),
                **({"page_token": token} if token else {})})
            out.extend(wire.task_from_json(t) for t in page["tasks"])
            token = page.get("next_page_token")
            if not token or not page["tasks"]:
                break
        return out

    def list_dags(self, *, limit: int = 100) -> Op[list[dict[str, Any]]]:
        """Stored DAG versions by hash, at most ``limit``: ``{hash, name, nodes,
        stored_revision}`` each (the whole DAG: ``GET /v1/dags/{hash}``)."""
        return (yield from self._pages("/v1/dags", "dags", limit, {}))

    def list_approvals(self, *, limit: int = 100) -> Op[list[dict[str, Any]]]:
        """Gates waiting for a decision, newest task first, at most ``limit``:
        ``{task_id, dag_name, submitted_by, node_id, description, input, waiting_since,
        gate_until}`` each (decide one with :meth:`approve` / :meth:`reject`)."""
        return (yield from self._pages("/v1/approvals", "approvals", limit, {}))

    def _pages(self, path: str, key: str, limit: int,
               params: Mapping[str, Any]) -> Op[list[dict[str, Any]]]:
        out: list[dict[str, Any]] = []
        token: str | None = None
        while len(out) < limit:
            page = yield from self.call("GET", path, idempotent=True, params={
                **params, "limit": min(1000, limit - len(out)),
                **({"page_token": token} if token else {})})
            out.extend(dict(item) for item in page[key])
            token = page.get("next_page_token")
            if not token:
                break
        return out[:limit]

    def validate(self, dag: DagLike) -> Op[dict[str, Any]]:
        """Validate a DAG (any form :meth:`submit` takes) on the server without storing
        it."""
        body, _ = _dag_body(dag)
        return dict((yield from self.call("POST", "/v1/dags/validate", body=body,
                                          idempotent=True)))

    def ready(self) -> Op[bool]:
        """True when the server answers ``/readyz`` with its store and queue up."""
        reply = yield Send("GET", "/readyz")
        return not isinstance(reply, httpx.TransportError) and reply.status_code == 200
