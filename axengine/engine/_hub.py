"""One store watch on every task's events, shared by all who follow a task in a process.

A watch per follower costs the API server a watch creation and a cancellation in the
store's client for every stream it serves, and on etcd a watch that starts at a past
revision is only served at etcd's next history sync, up to 100 ms later. The hub keeps
one watch on the whole events prefix for as long as anyone follows a task (and
:data:`IDLE_SECONDS` after the last one left), and hands each event to the followers of
its task; events of tasks nobody follows are dropped without being decoded.

The hub's watch starts right after a revision it read first (:attr:`Subscription.since`),
so it delivers every event committed after that revision: a follower that subscribes and
then reads the task's timeline at a revision at least ``since`` misses nothing (the two
overlap; the follower drops what it already has by seq).

When the watch fails (the store became unreachable, or it closed), every follower of the
moment is handed the error, and the next subscription starts a new watch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from axengine.engine._reads import _event_with_seq
from axengine.errors import StoreUnavailable
from axengine.keys import StoreKeys
from axengine.records import Event
from axengine.store import StateStore, WatchEvent

__all__ = ["IDLE_SECONDS", "EventHub", "Subscription"]

#: How long the shared watch outlives its last follower (a client that follows one task
#: after another keeps one watch).
IDLE_SECONDS = 30.0


@dataclass(eq=False)
class Subscription:
    """A follower's inbox: the events of its task, in commit order, as they commit; an
    exception ends it (the hub's watch failed).

    Attributes:
        since: The hub delivers every event committed after this store revision.
    """

    since: int
    inbox: asyncio.Queue[Event | BaseException] = field(default_factory=asyncio.Queue)


class _Watch:
    """One run of the shared watch: its followers by task id, and the task pumping it."""

    def __init__(self, since: int) -> None:
        self.since = since
        self.followers: dict[str, set[Subscription]] = {}
        self.pump: asyncio.Task[None] | None = None
        self.idle: asyncio.TimerHandle | None = None
        self.ended = False


class EventHub:
    """The shared events watch of one store (see the module docstring)."""

    def __init__(self, store: StateStore, keys: StoreKeys) -> None:
        self._store = store
        self._keys = keys
        self._watch: _Watch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def subscribe(self, task_id: str) -> AsyncIterator[Subscription]:
        """Follow ``task_id``'s events until the context exits."""
        watch = await self._running()
        sub = Subscription(watch.since)
        watch.followers.setdefault(task_id, set()).add(sub)
        if watch.idle is not None:
            watch.idle.cancel()
            watch.idle = None
        try:
            yield sub
        finally:
            subs = watch.followers.get(task_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del watch.followers[task_id]
            if not watch.ended and not watch.followers and watch.idle is None:
                watch.idle = asyncio.get_running_loop().call_later(
                    IDLE_SECONDS, self._stop_if_idle, watch)

    async def close(self) -> None:
        """Stop the shared watch (its followers are handed an error)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            await self._end(watch, StoreUnavailable("the events watch was closed"))

    async def _running(self) -> _Watch:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: nothing of the old one runs
            self._loop, self._watch, self._starting = loop, None, asyncio.Lock()
        async with self._starting:
            watch = self._watch
            if watch is None or watch.ended:
                watch = _Watch(await self._store.revision())
                changes = self._store.watch(self._keys.all_events(),
                                            start_revision=watch.since + 1)
                watch.pump = asyncio.create_task(self._pump(watch, changes))
                self._watch = watch
            return watch

    async def _pump(self, watch: _Watch, changes: AsyncIterator[WatchEvent]) -> None:
        error: BaseException = StoreUnavailable("the store closed")
        try:
            async for change in changes:
                if change.kind != "put":
                    continue
                subs = watch.followers.get(self._keys.event_task(change.kv.key))
                if subs:
                    event = _event_with_seq(change.kv)
                    for sub in subs:
                        sub.inbox.put_nowait(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to every follower, which raises it
            error = exc
        watch.ended = True
        for subs in watch.followers.values():
            for sub in subs:
                sub.inbox.put_nowait(error)

    def _stop_if_idle(self, watch: _Watch) -> None:
        if not watch.followers and not watch.ended:
            if self._watch is watch:
                self._watch = None
            watch.ended = True
            if watch.pump is not None:
                watch.pump.cancel()

    async def _end(self, watch: _Watch, error: BaseException) -> None:
        watch.ended = True
        if watch.idle is not None:
            watch.idle.cancel()
        if watch.pump is not None:
            watch.pump.cancel()
            with contextlib.suppress(BaseException):
                await watch.pump
        for subs in watch.followers.values():
            for sub in subs:
                sub.inbox.put_nowait(error)
