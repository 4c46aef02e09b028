"""The SDK client of an ``ax api`` server (REST under ``/v1``, over httpx).

::

    import axengine as ax

    with ax.Client("http://127.0.0.1:8080", token=TOKEN) as client:
        result = client.run("dags/financial_risk_assessment.yaml",
                            {"pdf_url": "dags/inputs/acme_annual_report.pdf"})
        print(result.status, result.path)

:class:`Client` and :class:`AsyncClient` have the same methods; results are the same
types the embedded engine returns (:class:`~axengine.local.RunResult`,
:class:`~axengine.records.Event`, :class:`~axengine.engine.TaskView`), so code moves
between ``ax.run`` and a server without change.

Errors. An error answer is raised as the :class:`~axengine.errors.AxError` class its
``error.type`` names (``NotFound``, ``Conflict``, ``DagError`` with its problems...);
an unreachable server as :class:`~axengine.errors.StoreUnavailable`.

Retries. A request that never reached the server (connection refused) is retried for
up to ``retry_for`` seconds, with jittered exponential backoff. A request that may have
reached it (connection dropped, 503) is retried only when repeating it is harmless:
reads, a submission with an idempotency key, a decision, a cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from axengine import errors
from axengine.dag import Dag
from axengine.engine import TaskView
from axengine.errors import AxError, DagError, DagProblem, InputError, StoreUnavailable
from axengine.local import RunResult, path_of
from axengine.records import Event, NextHop, NodeState, Snapshot, TaskRecord, TaskStatus

__all__ = [
    "DEFAULT_RETRY_FOR",
    "DEFAULT_TIMEOUT",
    "AsyncClient",
    "Client",
    "Submission",
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

#: A DAG given to :meth:`Client.submit`: a file path, a :class:`Dag`, a parsed mapping
#: or the YAML text itself.
DagLike = str | Path | Dag | Mapping[str, Any]


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


# ---------------------------------------------------------------------- pure helpers


def _dag_body(dag: DagLike) -> tuple[dict[str, Any], str | None]:
    """The DAG part of a submit body, and the file it came from (for error messages)."""
    if isinstance(dag, Dag):
        return {"dag": dag.canonical()}, None
    if isinstance(dag, Mapping):
        return {"dag": dict(dag)}, None
    if isinstance(dag, str) and ("\n" in dag or dag.lstrip().startswith(("name:", "nodes:"))):
        return {"dag_yaml": dag}, None
    path = Path(dag)
    try:
        return {"dag_yaml": path.read_text(encoding="utf-8")}, str(path)
    except OSError as exc:
        raise InputError(f"cannot read DAG file {path}: {exc.strerror or exc} (pass a path, "
                         "a Dag, a mapping or the YAML text)") from exc


def error_from_response(response: httpx.Response, *, source: str | None = None) -> AxError:
    """The :class:`AxError` an error response stands for, by its ``error.type``.

    Args:
        response: An HTTP response with status >= 400.
        source: DAG file the request carried; problems located in the request body are
            reported against it.
    """
    try:
        error = response.json()["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        text = response.text[:500].strip() or response.reason_phrase
        kind, message, error = "", f"HTTP {response.status_code}: {text}", {}
    if kind == "DagError":
        return DagError([
            DagProblem(message=str(p.get("message", "")),
                       file=source or str(p.get("file") or "<request>"),
                       line=int(p.get("line") or 0), node=p.get("node"),
                       field=p.get("field"), hint=p.get("hint"),
                       code=str(p.get("code") or "invalid"))
            for p in error.get("problems") or ()
        ] or [DagProblem(message=message, file=source or "<request>")])
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, AxError) and cls is not DagError:
        return cls(message)
    if response.status_code in (408, 429, 502, 503, 504):
        return StoreUnavailable(message)
    if response.status_code == 413:
        return InputError(message)
    return AxError(message)


def _event(data: Mapping[str, Any]) -> Event:
    return Event(task_id=str(data["task_id"]), event_id=str(data.get("event_id", "")),
                 kind=str(data["kind"]), at=float(data.get("at", 0.0)),
                 seq=int(data.get("seq", 0)), node_id=str(data.get("node_id") or ""),
                 state=str(data.get("state") or ""), attempt=int(data.get("attempt", 0)),
                 fence=int(data.get("fence", 0)), actor=str(data.get("actor") or ""),
                 detail=str(data.get("detail") or ""))


def _task_record(data: Mapping[str, Any]) -> TaskRecord:
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


def _snapshot(task_id: str, node_id: str, data: Mapping[str, Any]) -> Snapshot:
    def num(key: str) -> float:
        return float(data.get(key) or 0.0)

    hops = tuple(NextHop(str(h["target"]), bool(h["taken"])) for h in data.get("next_hops") or ())
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
        gate_until=num("gate_until"), decision=data.get("decision"),
    )


def _result(task: Mapping[str, Any], events: list[Event]) -> RunResult:
    nodes: Mapping[str, Mapping[str, Any]] = task.get("nodes") or {}
    return RunResult(
        task_id=str(task["task_id"]),
        status=str(task["status"]),
        outputs={n: v.get("output") for n, v in nodes.items() if v["state"] == "SUCCEEDED"},
        path=path_of(events),
        states={n: str(v["state"]) for n, v in nodes.items()},
        waiting=[n for n, v in nodes.items()
                 if v["state"] == "PAUSED" and v.get("type") == "human_gateway"],
        errors={n: str(v["error"]) for n, v in nodes.items() if v.get("error")},
    )


def _final(status: str) -> bool:
    return status in {s.value for s in TaskStatus if s.final}


class _SseParser:
    """Server-sent events, one line at a time: returns each complete message."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
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


def _unreachable(url: str, exc: httpx.TransportError) -> StoreUnavailable:
    return StoreUnavailable(f"cannot reach the ax API at {url}: {type(exc).__name__}: {exc}")


class _Base:
    def __init__(self, url: str, token: str, timeout: float, retry_for: float) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_for = retry_for
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._dags: dict[str, Dag] = {}

    @staticmethod
    def _submit_body(dag: DagLike, input: Any, idempotency_key: str,
                     labels: Mapping[str, str] | None, priority: int,
                     deadline_seconds: float | None) -> tuple[dict[str, Any], str | None]:
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
        return body, source

    def _stream_timeout(self, end: float | None) -> httpx.Timeout:
        read = STREAM_READ_TIMEOUT
        if end is not None:
            read = max(0.05, min(read, end - time.monotonic()))
        return httpx.Timeout(self.timeout, read=read)

    @staticmethod
    def _pending_gates(task: Mapping[str, Any], decide: Mapping[str, str],
                       done: set[str]) -> list[str]:
        nodes: Mapping[str, Mapping[str, Any]] = task.get("nodes") or {}
        return [n for n, v in nodes.items() if v["state"] == "PAUSED"
                and v.get("type") == "human_gateway" and n in decide and n not in done]

    def _view(self, task: Mapping[str, Any], dag: Dag) -> TaskView:
        record = _task_record(task)
        snaps = {n: _snapshot(record.task_id, n, v) for n, v in (task.get("nodes") or {}).items()}
        return TaskView(task=record, dag=dag, snapshots=snaps, revision=0)


# ---------------------------------------------------------------------- sync client


class Client(_Base):
    """Blocking client of an ``ax api`` server.

    Args:
        url: Base URL of the REST listener, e.g. ``http://127.0.0.1:8080``.
        token: Bearer token ("" when the server runs without auth).
        timeout: Seconds per request.
        retry_for: Seconds to keep retrying while the server cannot be reached.
        transport: An httpx transport to use instead of the network (tests).
    """

    def __init__(self, url: str, token: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                 retry_for: float = DEFAULT_RETRY_FOR,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(url, token, timeout, retry_for)
        self._http = httpx.Client(base_url=self.url, headers=self._headers, timeout=timeout,
                                  transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _request(self, method: str, path: str, *, body: Any = None,
                 params: Mapping[str, Any] | None = None, idempotent: bool,
                 source: str | None = None) -> Any:
        backoff = _Backoff(self.retry_for)
        while True:
            try:
                response = self._http.request(method, path, json=body, params=params)
            except httpx.TransportError as exc:
                pause = backoff.next() if _retryable(exc, 0, idempotent) else None
                if pause is None:
                    raise _unreachable(self.url, exc) from exc
                time.sleep(pause)
                continue
            if response.status_code < 400:
                return response.json()
            pause = backoff.next() if _retryable(None, response.status_code, idempotent) else None
            if pause is None:
                raise error_from_response(response, source=source)
            time.sleep(pause)

    def submit(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
               labels: Mapping[str, str] | None = None, priority: int = 0,
               deadline_seconds: float | None = None) -> Submission:
        """Submit a task. The same ``idempotency_key`` with the same payload names the
        same task (``created=False``); with another payload it raises ``Conflict``."""
        body, source = self._submit_body(dag, input, idempotency_key, labels, priority,
                                         deadline_seconds)
        data = self._request("POST", "/v1/tasks", body=body, idempotent=bool(idempotency_key),
                             source=source)
        return Submission(str(data["task_id"]), bool(data["created"]), str(data["dag_hash"]))

    def get(self, task_id: str) -> dict[str, Any]:
        """The task and its nodes, as the REST API returns them."""
        return dict(self._request("GET", f"/v1/tasks/{task_id}", idempotent=True))

    def events(self, task_id: str, *, after_seq: int = 0) -> list[Event]:
        """The task's events in commit order (every page)."""
        out: list[Event] = []
        params: dict[str, Any] = {"after_seq": after_seq, "limit": _EVENTS_PAGE}
        for _ in range(_MAX_EVENT_PAGES):
            page = self._request("GET", f"/v1/tasks/{task_id}/events", idempotent=True,
                                 params=params)
            out.extend(_event(e) for e in page["events"])
            if len(page["events"]) < _EVENTS_PAGE:
                break
            # The token seeks (a page costs a page); a server without it pages by seq.
            token = page.get("next_page_token")
            params = ({"page_token": token, "limit": _EVENTS_PAGE} if token else
                      {"after_seq": int(page["last_seq"]), "limit": _EVENTS_PAGE})
        return out

    def result(self, task_id: str) -> RunResult:
        """The task's current :class:`RunResult` (final or not)."""
        return _result(self.get(task_id), self.events(task_id))

    def task_view(self, task_id: str) -> TaskView:
        """The task as the engine sees it: record, DAG and node snapshots."""
        task = self.get(task_id)
        dag_hash = str(task["dag_hash"])
        if dag_hash not in self._dags:
            data = self._request("GET", f"/v1/dags/{dag_hash}", idempotent=True)
            self._dags[dag_hash] = Dag.from_canonical(data["dag"])
        return self._view(task, self._dags[dag_hash])

    def watch(self, task_id: str, *, after_seq: int = 0,
              timeout: float | None = None) -> Generator[Event, None, None]:
        """Follow the task's events as they commit (server-sent events).

        Ends when the task is final, when ``timeout`` seconds have passed, or when the
        stream breaks (the server restarted: call again with the last ``seq``).
        """
        end = None if timeout is None else time.monotonic() + timeout
        parser = _SseParser()
        try:
            with self._http.stream("GET", f"/v1/tasks/{task_id}/watch",
                                   params={"after_seq": after_seq},
                                   headers={"Accept": "text/event-stream"},
                                   timeout=self._stream_timeout(end)) as response:
                if response.status_code >= 400:
                    response.read()
                    raise error_from_response(response)
                for line in response.iter_lines():
                    message = parser.feed(line)
                    if message is not None:
                        if message[0] == "end":
                            return
                        yield _event(json.loads(message[1]))
                    if end is not None and time.monotonic() >= end:
                        return
        except httpx.TransportError:
            return

    def wait(self, task_id: str, timeout: float | None = None, *,
             decide: Mapping[str, str] | None = None,
             on_event: Callable[[Event], None] | None = None) -> RunResult:
        """Wait until the task is final, or paused at a gate ``decide`` does not cover.

        Args:
            task_id: The task.
            timeout: Give up waiting after this many seconds (the task goes on).
            decide: Decisions for gates, by node id, made when they are reached.
            on_event: Called with every event seen while waiting.
        """
        decide = dict(decide or {})
        end = None if timeout is None else time.monotonic() + timeout
        decided: set[str] = set()
        after_seq = 0
        while end is None or time.monotonic() < end:
            task = self.get(task_id)
            if _final(task["status"]):
                break
            gates = self._pending_gates(task, decide, decided)
            for gate in gates:
                self.decide(task_id, gate, decide[gate], comment="decided by the SDK")
                decided.add(gate)
            if task["status"] == "PAUSED" and not gates:
                break
            left = None if end is None else end - time.monotonic()
            seen = False
            with contextlib.closing(self.watch(task_id, after_seq=after_seq,
                                               timeout=left)) as stream:
                for event in stream:
                    seen = True
                    after_seq = max(after_seq, event.seq)
                    if on_event is not None:
                        on_event(event)
                    if event.kind == "task_paused":
                        break
            if not seen:
                # No stream (or it broke at once): poll instead of spinning.
                time.sleep(POLL_INTERVAL if end is None
                           else max(0.0, min(POLL_INTERVAL, end - time.monotonic())))
        return self.result(task_id)

    def run(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
            labels: Mapping[str, str] | None = None, priority: int = 0,
            deadline_seconds: float | None = None, decide: Mapping[str, str] | None = None,
            timeout: float | None = None,
            on_event: Callable[[Event], None] | None = None) -> RunResult:
        """Submit, then :meth:`wait` for the result."""
        sub = self.submit(dag, input, idempotency_key=idempotency_key, labels=labels,
                          priority=priority, deadline_seconds=deadline_seconds)
        return self.wait(sub.task_id, timeout, decide=decide, on_event=on_event)

    def decide(self, task_id: str, node: str, decision: str, comment: str = "") -> str:
        """Approve or reject a waiting gate: ``committed`` or ``already-done``."""
        data = self._request("POST", f"/v1/tasks/{task_id}/nodes/{node}/decision",
                             body={"decision": decision, "comment": comment}, idempotent=True)
        return str(data["result"])

    def approve(self, task_id: str, node: str, comment: str = "") -> str:
        """Approve a waiting gate."""
        return self.decide(task_id, node, "approve", comment)

    def reject(self, task_id: str, node: str, comment: str = "") -> str:
        """Reject a waiting gate."""
        return self.decide(task_id, node, "reject", comment)

    def cancel(self, task_id: str, reason: str = "") -> str:
        """Cancel every unfinished node: ``committed`` or ``already-done``."""
        data = self._request("POST", f"/v1/tasks/{task_id}/cancel", body={"reason": reason},
                             idempotent=True)
        return str(data["result"])

    def retry(self, task_id: str, from_node: str, *, input: Any = None) -> str:
        """Re-run a finished task from ``from_node`` (admin); ``input`` overrides that
        node's rendered input."""
        body: dict[str, Any] = {"from_node": from_node}
        if input is not None:
            body["input"] = input
        data = self._request("POST", f"/v1/tasks/{task_id}/retry", body=body, idempotent=False)
        return str(data["result"])

    def list_tasks(self, *, status: str | None = None, dag: str | None = None,
                   label: str | None = None, limit: int = 100) -> list[TaskRecord]:
        """Tasks matching the filters (newest first), at most ``limit``."""
        params = {k: v for k, v in (("status", status), ("dag", dag), ("label", label)) if v}
        out: list[TaskRecord] = []
        token: str | None = None
        while len(out) < limit:
            page = self._request("GET", "/v1/tasks", idempotent=True, params={
                **params, "limit": min(1000, limit - len(out)),
                **({"page_token": token} if token else {})})
            out.extend(_task_record(t) for t in page["tasks"])
            token = page.get("next_page_token")
            if not token or not page["tasks"]:
                break
        return out

    def validate(self, dag: DagLike) -> dict[str, Any]:
        """Validate a DAG on the server without storing it."""
        body, _ = _dag_body(dag)
        return dict(self._request("POST", "/v1/dags/validate", body=body, idempotent=True))

    def ready(self) -> bool:
        """True when the server answers ``/readyz`` with its store and queue up."""
        try:
            response = self._http.get("/readyz")
        except httpx.TransportError:
            return False
        return response.status_code == 200


# ---------------------------------------------------------------------- async client


class AsyncClient(_Base):
    """The asynchronous twin of :class:`Client` (same arguments, same methods)."""

    def __init__(self, url: str, token: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                 retry_for: float = DEFAULT_RETRY_FOR,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(url, token, timeout, retry_for)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers,
                                       timeout=timeout, transport=transport)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def _request(self, method: str, path: str, *, body: Any = None,
                       params: Mapping[str, Any] | None = None, idempotent: bool,
                       source: str | None = None) -> Any:
        backoff = _Backoff(self.retry_for)
        while True:
            try:
                response = await self._http.request(method, path, json=body, params=params)
            except httpx.TransportError as exc:
                pause = backoff.next() if _retryable(exc, 0, idempotent) else None
                if pause is None:
                    raise _unreachable(self.url, exc) from exc
                await asyncio.sleep(pause)
                continue
            if response.status_code < 400:
                return response.json()
            pause = backoff.next() if _retryable(None, response.status_code, idempotent) else None
            if pause is None:
                raise error_from_response(response, source=source)
            await asyncio.sleep(pause)

    async def submit(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
                     labels: Mapping[str, str] | None = None, priority: int = 0,
                     deadline_seconds: float | None = None) -> Submission:
        """See :meth:`Client.submit`."""
        body, source = self._submit_body(dag, input, idempotency_key, labels, priority,
                                         deadline_seconds)
        data = await self._request("POST", "/v1/tasks", body=body,
                                   idempotent=bool(idempotency_key), source=source)
        return Submission(str(data["task_id"]), bool(data["created"]), str(data["dag_hash"]))

    async def get(self, task_id: str) -> dict[str, Any]:
        """See :meth:`Client.get`."""
        return dict(await self._request("GET", f"/v1/tasks/{task_id}", idempotent=True))

    async def events(self, task_id: str, *, after_seq: int = 0) -> list[Event]:
        """See :meth:`Client.events`."""
        out: list[Event] = []
        params: dict[str, Any] = {"after_seq": after_seq, "limit": _EVENTS_PAGE}
        for _ in range(_MAX_EVENT_PAGES):
            page = await self._request("GET", f"/v1/tasks/{task_id}/events", idempotent=True,
                                       params=params)
            out.extend(_event(e) for e in page["events"])
            if len(page["events"]) < _EVENTS_PAGE:
                break
            # The token seeks (a page costs a page); a server without it pages by seq.
            token = page.get("next_page_token")
            params = ({"page_token": token, "limit": _EVENTS_PAGE} if token else
                      {"after_seq": int(page["last_seq"]), "limit": _EVENTS_PAGE})
        return out

    async def result(self, task_id: str) -> RunResult:
        """See :meth:`Client.result`."""
        return _result(await self.get(task_id), await self.events(task_id))

    async def task_view(self, task_id: str) -> TaskView:
        """See :meth:`Client.task_view`."""
        task = await self.get(task_id)
        dag_hash = str(task["dag_hash"])
        if dag_hash not in self._dags:
            data = await self._request("GET", f"/v1/dags/{dag_hash}", idempotent=True)
            self._dags[dag_hash] = Dag.from_canonical(data["dag"])
        return self._view(task, self._dags[dag_hash])

    async def watch(self, task_id: str, *, after_seq: int = 0,
                    timeout: float | None = None) -> AsyncGenerator[Event, None]:
        """See :meth:`Client.watch`."""
        end = None if timeout is None else time.monotonic() + timeout
        parser = _SseParser()
        try:
            async with self._http.stream("GET", f"/v1/tasks/{task_id}/watch",
                                         params={"after_seq": after_seq},
                                         headers={"Accept": "text/event-stream"},
                                         timeout=self._stream_timeout(end)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_from_response(response)
                async for line in response.aiter_lines():
                    message = parser.feed(line)
                    if message is not None:
                        if message[0] == "end":
                            return
                        yield _event(json.loads(message[1]))
                    if end is not None and time.monotonic() >= end:
                        return
        except httpx.TransportError:
            return

    async def wait(self, task_id: str, timeout: float | None = None, *,
                   decide: Mapping[str, str] | None = None,
                   on_event: Callable[[Event], None] | None = None) -> RunResult:
        """See :meth:`Client.wait`."""
        decide = dict(decide or {})
        end = None if timeout is None else time.monotonic() + timeout
        decided: set[str] = set()
        after_seq = 0
        while end is None or time.monotonic() < end:
            task = await self.get(task_id)
            if _final(task["status"]):
                break
            gates = self._pending_gates(task, decide, decided)
            for gate in gates:
                await self.decide(task_id, gate, decide[gate], comment="decided by the SDK")
                decided.add(gate)
            if task["status"] == "PAUSED" and not gates:
                break
            left = None if end is None else end - time.monotonic()
            seen = False
            async with contextlib.aclosing(self.watch(task_id, after_seq=after_seq,
                                                      timeout=left)) as stream:
                async for event in stream:
                    seen = True
                    after_seq = max(after_seq, event.seq)
                    if on_event is not None:
                        on_event(event)
                    if event.kind == "task_paused":
                        break
            if not seen:
                await asyncio.sleep(POLL_INTERVAL if end is None
                                    else max(0.0, min(POLL_INTERVAL, end - time.monotonic())))
        return await self.result(task_id)

    async def run(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
                  labels: Mapping[str, str] | None = None, priority: int = 0,
                  deadline_seconds: float | None = None,
                  decide: Mapping[str, str] | None = None, timeout: float | None = None,
                  on_event: Callable[[Event], None] | None = None) -> RunResult:
        """See :meth:`Client.run`."""
        sub = await self.submit(dag, input, idempotency_key=idempotency_key, labels=labels,
                                priority=priority, deadline_seconds=deadline_seconds)
        return await self.wait(sub.task_id, timeout, decide=decide, on_event=on_event)

    async def decide(self, task_id: str, node: str, decision: str, comment: str = "") -> str:
        """See :meth:`Client.decide`."""
        data = await self._request("POST", f"/v1/tasks/{task_id}/nodes/{node}/decision",
                                   body={"decision": decision, "comment": comment},
                                   idempotent=True)
        return str(data["result"])

    async def approve(self, task_id: str, node: str, comment: str = "") -> str:
        """See :meth:`Client.approve`."""
        return await self.decide(task_id, node, "approve", comment)

    async def reject(self, task_id: str, node: str, comment: str = "") -> str:
        """See :meth:`Client.reject`."""
        return await self.decide(task_id, node, "reject", comment)

    async def cancel(self, task_id: str, reason: str = "") -> str:
        """See :meth:`Client.cancel`."""
        data = await self._request("POST", f"/v1/tasks/{task_id}/cancel",
                                   body={"reason": reason}, idempotent=True)
        return str(data["result"])

    async def retry(self, task_id: str, from_node: str, *, input: Any = None) -> str:
        """See :meth:`Client.retry`."""
        body: dict[str, Any] = {"from_node": from_node}
        if input is not None:
            body["input"] = input
        data = await self._request("POST", f"/v1/tasks/{task_id}/retry", body=body,
                                   idempotent=False)
        return str(data["result"])

    async def list_tasks(self, *, status: str | None = None, dag: str | None = None,
                         label: str | None = None, limit: int = 100) -> list[TaskRecord]:
        """See :meth:`Client.list_tasks`."""
        params = {k: v for k, v in (("status", status), ("dag", dag), ("label", label)) if v}
        out: list[TaskRecord] = []
        token: str | None = None
        while len(out) < limit:
            page = await self._request("GET", "/v1/tasks", idempotent=True, params={
                **params, "limit": min(1000, limit - len(out)),
                **({"page_token": token} if token else {})})
            out.extend(_task_record(t) for t in page["tasks"])
            token = page.get("next_page_token")
            if not token or not page["tasks"]:
                break
        return out

    async def validate(self, dag: DagLike) -> dict[str, Any]:
        """See :meth:`Client.validate`."""
        body, _ = _dag_body(dag)
        return dict(await self._request("POST", "/v1/dags/validate", body=body,
                                        idempotent=True))

    async def ready(self) -> bool:
        """See :meth:`Client.ready`."""
        try:
            response = await self._http.get("/readyz")
        except httpx.TransportError:
            return False
        return response.status_code == 200
