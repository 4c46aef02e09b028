"""The asynchronous shell: performs the core's effects with ``httpx.AsyncClient``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
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

__all__ = ["AsyncClient"]

T = TypeVar("T")


class _AsyncIo:
    """Performs effects for one operation; owns the event stream it may open."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http
        self._stream: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None

    async def perform(self, effect: Effect) -> Any:
        if isinstance(effect, Send):
            try:
                return await self._http.request(effect.method, effect.path, json=effect.body,
                                                params=effect.params)
            except httpx.TransportError as exc:
                return exc
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
        elif isinstance(effect, OpenStream):
            await self.close()
            request = self._http.build_request(
                "GET", effect.path, params=effect.params, timeout=effect.timeout,
                headers={"Accept": "text/event-stream"})
            try:
                response = await self._http.send(request, stream=True)
                if response.status_code >= 400:
                    await response.aread()
                    await response.aclose()
                    return response
            except httpx.TransportError as exc:
                return exc
            self._stream, self._lines = response, response.aiter_lines()
            return response
        elif isinstance(effect, NextLine):
            if self._lines is None:
                return None
            try:
                return await anext(self._lines)
            except (StopAsyncIteration, httpx.TransportError):
                return None
        elif isinstance(effect, CloseStream):
            await self.close()
        return None

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
            self._stream, self._lines = None, None


class AsyncClient:
    """The asynchronous twin of :class:`~axengine.client.Client` (same arguments, same
    methods, same behaviour: both run the same operations)."""

    def __init__(self, url: str, token: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                 retry_for: float = DEFAULT_RETRY_FOR,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._core = Core(url, token, timeout=timeout, retry_for=retry_for)
        self.url = self._core.url
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._core.headers,
                                       timeout=timeout, transport=transport)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def _run(self, op: Op[T]) -> T:
        io = _AsyncIo(self._http)
        reply: Any = None
        try:
            while True:
                try:
                    effect = op.send(reply)
                except StopIteration as stop:
                    result: T = stop.value
                    return result
                reply = await io.perform(effect)
        finally:
            op.close()
            await io.close()

    async def _follow(self, op: Op[None]) -> AsyncGenerator[Event, None]:
        io = _AsyncIo(self._http)
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
                    reply = await io.perform(effect)
        finally:
            op.close()
            await io.close()

    async def submit(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
                     labels: Mapping[str, str] | None = None, priority: int = 0,
                     deadline_seconds: float | None = None) -> Submission:
        """See :meth:`Client.submit`."""
        return await self._run(self._core.submit(
            dag, input, idempotency_key=idempotency_key, labels=labels, priority=priority,
            deadline_seconds=deadline_seconds))

    async def get(self, task_id: str) -> dict[str, Any]:
        """See :meth:`Client.get`."""
        return await self._run(self._core.get(task_id))

    async def events(self, task_id: str, *, after_seq: int = 0) -> list[Event]:
        """See :meth:`Client.events`."""
        return await self._run(self._core.events(task_id, after_seq=after_seq))

    async def result(self, task_id: str) -> RunResult:
        """See :meth:`Client.result`."""
        return await self._run(self._core.result(task_id))

    async def task_view(self, task_id: str) -> TaskView:
        """See :meth:`Client.task_view`."""
        return await self._run(self._core.task_view(task_id))

    def watch(self, task_id: str, *, after_seq: int = 0,
              timeout: float | None = None) -> AsyncGenerator[Event, None]:
        """See :meth:`Client.watch`."""
        return self._follow(self._core.watch(task_id, after_seq=after_seq, timeout=timeout))

    async def wait(self, task_id: str, timeout: float | None = None, *,
                   decide: Mapping[str, str] | None = None,
                   on_event: Callable[[Event], None] | None = None) -> RunResult:
        """See :meth:`Client.wait`."""
        return await self._run(self._core.wait(task_id, timeout, decide=decide,
                                               on_event=on_event))

    async def run(self, dag: DagLike, input: Any = None, *, idempotency_key: str = "",
                  labels: Mapping[str, str] | None = None, priority: int = 0,
                  deadline_seconds: float | None = None,
                  decide: Mapping[str, str] | None = None, timeout: float | None = None,
                  on_event: Callable[[Event], None] | None = None) -> RunResult:
        """See :meth:`Client.run`."""
        return await self._run(self._core.run(
            dag, input, idempotency_key=idempotency_key, labels=labels, priority=priority,
            deadline_seconds=deadline_seconds, decide=decide, timeout=timeout,
            on_event=on_event))

    async def decide(self, task_id: str, node: str, decision: str, comment: str = "") -> str:
        """See :meth:`Client.decide`."""
        return await self._run(self._core.decide(task_id, node, decision, comment))

    async def approve(self, task_id: str, node: str, comment: str = "") -> str:
        """See :meth:`Client.approve`."""
        return await self.decide(task_id, node, "approve", comment)

    async def reject(self, task_id: str, node: str, comment: str = "") -> str:
        """See :meth:`Client.reject`."""
        return await self.decide(task_id, node, "reject", comment)

    async def cancel(self, task_id: str, reason: str = "") -> str:
        """See :meth:`Client.cancel`."""
        return await self._run(self._core.cancel(task_id, reason))

    async def retry(self, task_id: str, from_node: str, *, input: Any = None) -> str:
        """See :meth:`Client.retry`."""
        return await self._run(self._core.retry(task_id, from_node, input=input))

    async def list_tasks(self, *, status: str | None = None, dag: str | None = None,
                         label: str | None = None, limit: int = 100) -> list[TaskRecord]:
        """See :meth:`Client.list_tasks`."""
        return await self._run(self._core.list_tasks(status=status, dag=dag, label=label,
                                                     limit=limit))

    async def validate(self, dag: DagLike) -> dict[str, Any]:
        """See :meth:`Client.validate`."""
        return await self._run(self._core.validate(dag))

    async def ready(self) -> bool:
        """See :meth:`Client.ready`."""
        return await self._run(self._core.ready())
