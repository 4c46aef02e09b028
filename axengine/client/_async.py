"""The asynchronous shell: performs the core's effects with ``httpx.AsyncClient``.

Its methods are the core's operations, bound by :func:`async_op` and
:func:`async_stream`: their signatures and docstrings are those of
:class:`~axengine.client._core.Core`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from axengine.client import _core as core
from axengine.records import Event

__all__ = ["AsyncClient", "async_op", "async_stream"]

P = ParamSpec("P")
T = TypeVar("T")


class _AsyncIo:
    """Performs effects for one operation; owns the event stream it may open."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http
        self._stream: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None

    async def __aenter__(self) -> _AsyncIo:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def perform(self, effect: core.Effect) -> Any:
        if isinstance(effect, core.Sleep):
            await asyncio.sleep(effect.seconds)
        elif isinstance(effect, core.CloseStream):
            await self.close()
        elif isinstance(effect, core.NextLine) and self._lines is not None:
            try:
                return await anext(self._lines, None)
            except httpx.TransportError:
                return None
        elif isinstance(effect, core.Send | core.OpenStream):
            try:
                return await self._send(effect)
            except httpx.TransportError as exc:
                return exc
        return None

    async def _send(self, effect: core.Send | core.OpenStream) -> httpx.Response:
        if isinstance(effect, core.Send):
            return await self._http.send(effect.request(self._http))
        await self.close()
        response = await self._http.send(effect.request(self._http), stream=True)
        if response.is_error:
            try:
                await response.aread()
            finally:
                await response.aclose()
        else:
            self._stream, self._lines = response, response.aiter_lines()
        return response

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
            self._stream, self._lines = None, None


def async_op(op: Callable[Concatenate[core.Core, P], core.Op[T]]
             ) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """The :class:`AsyncClient` method that runs the core operation ``op`` to its
    result."""

    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        async with _AsyncIo(self._http) as io:
            with core.Steps(op(self._core, *args, **kwargs)) as steps:
                for effect in steps:
                    steps.reply = await io.perform(effect)
                return steps.result

    core.describe_as_method(method, op, "AsyncClient")
    return method


def async_stream(op: Callable[Concatenate[core.Core, P], core.Op[None]]
                 ) -> Callable[Concatenate[AsyncClient, P], AsyncGenerator[Event, None]]:
    """The :class:`AsyncClient` method that yields the events the core operation ``op``
    emits."""

    async def method(self: AsyncClient, /, *args: P.args,
                     **kwargs: P.kwargs) -> AsyncGenerator[Event, None]:
        async with _AsyncIo(self._http) as io:
            with core.Steps(op(self._core, *args, **kwargs)) as steps:
                for effect in steps:
                    if isinstance(effect, core.Emit):
                        yield effect.event
                    else:
                        steps.reply = await io.perform(effect)

    core.describe_as_method(method, op, "AsyncClient", "AsyncGenerator[Event, None]")
    return method


class AsyncClient:
    """The asynchronous twin of :class:`~axengine.client.Client` (same arguments, same
    methods, same behaviour: both run the same operations)."""

    def __init__(self, url: str, token: str = "", *, timeout: float = core.DEFAULT_TIMEOUT,
                 retry_for: float = core.DEFAULT_RETRY_FOR,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._core = core.Core(url, token, timeout=timeout, retry_for=retry_for)
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

    submit = async_op(core.Core.submit)
    get = async_op(core.Core.get)
    events = async_op(core.Core.events)
    result = async_op(core.Core.result)
    task_view = async_op(core.Core.task_view)
    watch = async_stream(core.Core.watch)
    wait = async_op(core.Core.wait)
    run = async_op(core.Core.run)
    decide = async_op(core.Core.decide)
    approve = async_op(core.Core.approve)
    reject = async_op(core.Core.reject)
    resume = async_op(core.Core.resume)
    cancel = async_op(core.Core.cancel)
    retry = async_op(core.Core.retry)
    fork = async_op(core.Core.fork)
    list_tasks = async_op(core.Core.list_tasks)
    list_dags = async_op(core.Core.list_dags)
    list_approvals = async_op(core.Core.list_approvals)
    validate = async_op(core.Core.validate)
    ready = async_op(core.Core.ready)
