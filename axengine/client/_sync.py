"""The blocking shell: performs the core's effects with ``httpx.Client``."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from axengine.client._core import (
    DEFAULT_RETRY_FOR,
    DEFAULT_TIMEOUT,
    CloseStream,
    Core,
    DagLike,
    Effect,
    Emit,
    NextLine,
    Op,
    OpenStream,
    Send,
    Sleep,
    Submission,
)
from axengine.records import Event, TaskRecord
from axengine.wire import RunResult

if TYPE_CHECKING:
    from axengine.engine import TaskView

__all__ = ["Client"]

T = TypeVar("T")


class _Io:
    """Performs effects for one operation; owns the event stream it may open."""

    def __init__(self, http: httpx.Client) -> None:
        self._http = http
        self._stream: httpx.Response | None = None
        self._lines: Iterator[str] = iter(())

    def perform(self, effect: Effect) -> Any:
        if isinstance(effect, Send):
            try:
                return self._http.request(effect.method, effect.path, json=effect.body,
                                          params=effect.params)
            except httpx.TransportError as exc:
                return exc
        if isinstance(effect, Sleep):
            time.sleep(effect.seconds)
        elif isinstance(effect, OpenStream):
            self.close()
            request = self._http.build_request(
                "GET", effect.path, params=effect.params, timeout=effect.timeout,
                headers={"Accept": "text/event-stream"})
            try:
                response = self._http.send(request, stream=True)
                if response.status_code >= 400:
                    response.read()
                    response.close()
                    return response
            except httpx.TransportError as exc:
                return exc
            self._stream, self._lines = response, response.iter_lines()
            return response
        elif isinstance(effect, NextLine):
            try:
                return next(self._lines)
            except (StopIteration, httpx.TransportError):
                return None
        elif isinstance(effect, CloseStream):
            self.close()
        return None

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream, self._lines = None, iter(())


class Client:
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
        self._core = Core(url, token, timeout=timeout, retry_for=retry_for)
        self.url = self._core.url
        self._http = httpx.Client(base_url=self.url, headers=self._core.headers,
                                  timeout=timeout, transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        io = _Io(self._http)
        reply: Any = None
        try:
            while True:
                try:
                    effect = op.send(reply)
                except StopIteration as stop:
                    result: T = stop.value
                    return result
                reply = io.perform(effect)
        finally:
            op.close()
            io.close()

    def _follow(self, op: Op[None]) -> Generator[Event, None, None]:
        io = _Io(self._http)
        reply: Any = None
        try:
            while True:
                try:
                    effect = op.send(reply)
                except StopIteration:
                    return
                if isinstance(effect, Emit):
                    reply = None
                    yield effect.event
                else:
                    reply = io.perform(effect)
        finally:
            op.close()
            io.close()

    def submit(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
               labels: Mapping[str, str] | None = None, priority: int = 0,
               deadline_seconds: float | None = None) -> Submission:
        """Submit a task. The same ``idempotency_key`` with the same payload names the
        same task (``created=False``); with another payload it raises ``Conflict``."""
        return self._run(self._core.submit(
            dag, input, idempotency_key=idempotency_key, labels=labels, priority=priority,
            deadline_seconds=deadline_seconds))

    def get(self, task_id: str) -> dict[str, Any]:
        """The task and its nodes, as the REST API returns them."""
        return self._run(self._core.get(task_id))

    def events(self, task_id: str, *, after_seq: int = 0) -> list[Event]:
        """The task's events in commit order (every page)."""
        return self._run(self._core.events(task_id, after_seq=after_seq))

    def result(self, task_id: str) -> RunResult:
        """The task's current :class:`RunResult` (final or not)."""
        return self._run(self._core.result(task_id))

    def task_view(self, task_id: str) -> TaskView:
        """The task as the engine sees it: record, DAG and node snapshots."""
        return self._run(self._core.task_view(task_id))

    def watch(self, task_id: str, *, after_seq: int = 0,
              timeout: float | None = None) -> Generator[Event, None, None]:
        """Follow the task's events as they commit (server-sent events).

        Ends when the task is final, when ``timeout`` seconds have passed, or when the
        stream breaks (the server restarted: call again with the last ``seq``).
        """
        return self._follow(self._core.watch(task_id, after_seq=after_seq, timeout=timeout))

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
        return self._run(self._core.wait(task_id, timeout, decide=decide, on_event=on_event))

    def run(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
            labels: Mapping[str, str] | None = None, priority: int = 0,
            deadline_seconds: float | None = None, decide: Mapping[str, str] | None = None,
            timeout: float | None = None,
            on_event: Callable[[Event], None] | None = None) -> RunResult:
        """Submit, then :meth:`wait` for the result."""
        return self._run(self._core.run(
            dag, input, idempotency_key=idempotency_key, labels=labels, priority=priority,
            deadline_seconds=deadline_seconds, decide=decide, timeout=timeout,
            on_event=on_event))

    def decide(self, task_id: str, node: str, decision: str, comment: str = "") -> str:
        """Approve or reject a waiting gate: ``committed`` or ``already-done``."""
        return self._run(self._core.decide(task_id, node, decision, comment))

    def approve(self, task_id: str, node: str, comment: str = "") -> str:
        """Approve a waiting gate."""
        return self.decide(task_id, node, "approve", comment)

    def reject(self, task_id: str, node: str, comment: str = "") -> str:
        """Reject a waiting gate."""
        return self.decide(task_id, node, "reject", comment)

    def cancel(self, task_id: str, reason: str = "") -> str:
        """Cancel every unfinished node: ``committed`` or ``already-done``."""
        return self._run(self._core.cancel(task_id, reason))

    def retry(self, task_id: str, from_node: str, *, input: Any = None) -> str:
        """Re-run a finished task from ``from_node`` (admin); ``input`` overrides that
        node's rendered input."""
        return self._run(self._core.retry(task_id, from_node, input=input))

    def list_tasks(self, *, status: str | None = None, dag: str | None = None,
                   label: str | None = None, limit: int = 100) -> list[TaskRecord]:
        """Tasks matching the filters (newest first), at most ``limit``."""
        return self._run(self._core.list_tasks(status=status, dag=dag, label=label,
                                               limit=limit))

    def validate(self, dag: DagLike) -> dict[str, Any]:
        """Validate a DAG on the server without storing it."""
        return self._run(self._core.validate(dag))

    def ready(self) -> bool:
        """True when the server answers ``/readyz`` with its store and queue up."""
        return self._run(self._core.ready())
