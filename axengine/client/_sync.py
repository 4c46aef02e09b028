"""The blocking shell: performs the core's effects with ``httpx.Client``.

Its methods are the core's operations, bound by :func:`sync_op` and :func:`sync_stream`:
their signatures and docstrings are those of :class:`~axengine.client._core.Core`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from axengine.client import _core as core
from axengine.records import Event

__all__ = ["Client", "sync_op", "sync_stream"]

P = ParamSpec("P")
T = TypeVar("T")


class _Io:
    """Performs effects for one operation; owns the event stream it may open."""

    def __init__(self, http: httpx.Client) -> None:
        self._http = http
        self._stream: httpx.Response | None = None
        self._lines: Iterator[str] = iter(())

    def __enter__(self) -> _Io:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def perform(self, effect: core.Effect) -> Any:
        if isinstance(effect, core.Sleep):
            time.sleep(effect.seconds)
        elif isinstance(effect, core.CloseStream):
            self.close()
        elif isinstance(effect, core.NextLine):
            try:
                return next(self._lines, None)
            except httpx.TransportError:
                return None
        elif isinstance(effect, core.Send | core.OpenStream):
            try:
                return self._send(effect)
            except httpx.TransportError as exc:
                return exc
        return None

    def _send(self, effect: core.Send | core.OpenStream) -> httpx.Response:
        if isinstance(effect, core.Send):
            return self._http.send(effect.request(self._http))
        self.close()
        response = self._http.send(effect.request(self._http), stream=True)
        if response.is_error:
            try:
                response.read()
            finally:
                response.close()
        else:
            self._stream, self._lines = response, response.iter_lines()
        return response

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream, self._lines = None, iter(())


def sync_op(op: Callable[Concatenate[core.Core, P], core.Op[T]]
            ) -> Callable[Concatenate[Client, P], T]:
    """The :class:`Client` method that runs the core operation ``op`` to its result."""

    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with _Io(self._http) as io, core.Steps(op(self._core, *args, **kwargs)) as steps:
            for effect in steps:
                steps.reply = io.perform(effect)
            return steps.result

    core.describe_as_method(method, op, "Client")
    return method


def sync_stream(op: Callable[Concatenate[core.Core, P], core.Op[None]]
                ) -> Callable[Concatenate[Client, P], Generator[Event, None, None]]:
    """The :class:`Client` method that yields the events the core operation ``op``
    emits."""

    def method(self: Client, /, *args: P.args,
               **kwargs: P.kwargs) -> Generator[Event, None, None]:
        with _Io(self._http) as io, core.Steps(op(self._core, *args, **kwargs)) as steps:
            for effect in steps:
                if isinstance(effect, core.Emit):
                    yield effect.event
                else:
                    steps.reply = io.perform(effect)

    core.describe_as_method(method, op, "Client", "Generator[Event, None, None]")
    return method


class Client:
    """Blocking client of an ``ax api`` server.

    Args:
        url: Base URL of the REST listener, e.g. ``http://127.0.0.1:8080``.
        token: Bearer token ("" when the server runs without auth).
        timeout: Seconds per request.
        retry_for: Seconds to keep retrying while the server cannot be reached.
        transport: An httpx transport to use instead of the network (tests).
    """

    def __init__(self, url: str, token: str = "", *, timeout: float = core.DEFAULT_TIMEOUT,
                 retry_for: float = core.DEFAULT_RETRY_FOR,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._core = core.Core(url, token, timeout=timeout, retry_for=retry_for)
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

    submit = sync_op(core.Core.submit)
    get = sync_op(core.Core.get)
    events = sync_op(core.Core.events)
    result = sync_op(core.Core.result)
    task_view = sync_op(core.Core.task_view)
    watch = sync_stream(core.Core.watch)
    wait = sync_op(core.Core.wait)
    run = sync_op(core.Core.run)
    decide = sync_op(core.Core.decide)
    approve = sync_op(core.Core.approve)
    reject = sync_op(core.Core.reject)
    resume = sync_op(core.Core.resume)
    cancel = sync_op(core.Core.cancel)
    retry = sync_op(core.Core.retry)
    fork = sync_op(core.Core.fork)
    list_tasks = sync_op(core.Core.list_tasks)
    list_dags = sync_op(core.Core.list_dags)
    list_approvals = sync_op(core.Core.list_approvals)
    validate = sync_op(core.Core.validate)
    ready = sync_op(core.Core.ready)
