"""``follow_event_batches`` (the watch stream's source) against a fake engine whose events
feed models the engine's shared one: it hands out every event committed after the
revision it started at (``since``) to the followers of that moment only, so the stream
must read its replay after subscribing.

Each event must be sent once and in order, whether it was committed before the feed
started, between the subscription and the replay, or after both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from axengine.api import _ops as ops
from axengine.engine import Engine, Timeline
from axengine.engine._hub import Subscription
from axengine.errors import NotFound, StoreUnavailable
from axengine.records import Event, TaskRecord, TaskStatus

TASK = "t-1"


class FakeEngine:
    """The read and the feed ``follow_event_batches`` uses, over an in-memory timeline of one
    task."""

    def __init__(self) -> None:
        self.revision_now = 0
        self.stored: list[Event] = []
        self.feeds: list[Subscription] = []
        self.task_reads = 0
        self.missing = False
        #: Commits made once the feed started (it delivers them; the replay may too).
        self.on_subscribe: Callable[[], None] = lambda: None
        #: Commits made right after the replay was read (only the feed has them).
        self.after_read: Callable[[], None] = lambda: None
        self.commit("submitted", "ready")

    def commit(self, *kinds: str) -> None:
        """One transaction: its events share the new revision as their seq."""
        self.revision_now += 1
        for kind in kinds:
            state = kind.removeprefix("task_").upper() if kind.startswith("task_") else ""
            event = Event(TASK, f"e{len(self.stored):03d}", kind, at=0.0,
                          seq=self.revision_now, state=state)
            self.stored.append(event)
            for feed in self.feeds:
                feed.inbox.put_nowait(event)

    @contextlib.asynccontextmanager
    async def subscribe_events(self, task_id: str) -> AsyncIterator[Subscription]:
        # One shared feed, as the engine's: it started when the first follower came.
        feed = Subscription(self.feeds[0].since if self.feeds else self.revision_now)
        self.feeds.append(feed)
        self.on_subscribe()
        try:
            yield feed
        finally:
            self.feeds.remove(feed)

    async def timeline(self, task_id: str) -> Timeline:
        """The record and the events, read together (one read)."""
        self.task_reads += 1
        if self.missing:
            raise NotFound(f"task {task_id!r} not found")
        record = cast(TaskRecord, SimpleNamespace(status=TaskStatus.RUNNING))
        timeline = Timeline(record, list(self.stored), self.revision_now)
        self.after_read()
        return timeline



async def flat(batches: AsyncIterator[Any]) -> list[Any]:
    """The stream's items one event at a time (keepalives dropped)."""
    items: list[Any] = []
    async for item in batches:
        if isinstance(item, list):
            items.extend(item)
        elif item is not None:
            items.append(item)
    return items


async def follow(engine: FakeEngine, after_seq: int = 0) -> list[Any]:
    async def collect() -> list[Any]:
        return await flat(ops.follow_event_batches(cast(Engine, engine), TASK,
                                                   after_seq=after_seq))

    # A guard against hanging, not a latency bound.
    return await asyncio.wait_for(collect(), 10.0)


def kinds_of(items: list[Any]) -> list[str]:
    return [item.kind if isinstance(item, Event) else item.status for item in items]


def test_events_committed_before_and_after_the_replay_are_sent_once_in_order() -> None:
    engine = FakeEngine()
    engine.on_subscribe = lambda: engine.commit("claimed")  # in the feed and the replay
    engine.after_read = lambda: engine.commit("committed", "task_succeeded")
    items = asyncio.run(follow(engine))
    assert kinds_of(items) == ["submitted", "ready", "claimed", "committed",
                               "task_succeeded", "SUCCEEDED"]
    assert isinstance(items[-1], ops.WatchEnd)
    assert engine.task_reads == 1


@pytest.mark.parametrize("feed_running", [False, True])
def test_start_following_reads_once_after_subscribing_and_refuses_a_missing_task(
        feed_running: bool) -> None:
    # The watch endpoints answer 404 before their response starts, from the stream's
    # own read, made after subscribing: a commit right after the read reaches the
    # stream through its feed. (Read before subscribing, it would be lost: handed out
    # to the followers of that moment only, or before the feed started.)
    engine = FakeEngine()

    async def main() -> list[Any]:
        async with contextlib.AsyncExitStack() as other:
            if feed_running:  # another stream follows the task
                await other.enter_async_context(engine.subscribe_events(TASK))
            engine.commit("claimed")
            engine.after_read = lambda: engine.commit("committed", "task_succeeded")
            stream = await ops.start_following(cast(Engine, engine), TASK)
            assert engine.task_reads == 1
            return await flat(stream)

    items = asyncio.run(asyncio.wait_for(main(), 10.0))
    assert kinds_of(items) == ["submitted", "ready", "claimed", "committed",
                               "task_succeeded", "SUCCEEDED"]
    assert engine.task_reads == 1 and engine.feeds == []

    missing = FakeEngine()
    missing.missing = True
    with pytest.raises(NotFound):
        asyncio.run(ops.start_following(cast(Engine, missing), TASK))
    assert missing.feeds == []  # the subscription did not outlive the refusal


def test_a_resumed_stream_sends_nothing_up_to_after_seq() -> None:
    engine = FakeEngine()
    engine.after_read = lambda: engine.commit("task_succeeded")
    items = asyncio.run(follow(engine, after_seq=1))
    assert kinds_of(items) == ["task_succeeded", "SUCCEEDED"]


def test_a_task_whose_replay_ends_final_ends_the_stream_with_one_read() -> None:
    engine = FakeEngine()
    engine.commit("claimed")
    engine.commit("committed", "task_succeeded")
    items = asyncio.run(follow(engine))
    assert kinds_of(items)[-2:] == ["task_succeeded", "SUCCEEDED"]
    assert engine.task_reads == 1
    assert engine.feeds == []  # the subscription ended with the stream


def test_a_feed_failure_ends_the_stream_after_what_came_before_it() -> None:
    engine = FakeEngine()
    got: list[Any] = []

    def fail() -> None:
        engine.commit("claimed")
        engine.feeds[0].inbox.put_nowait(StoreUnavailable("etcd went away"))

    engine.after_read = fail

    async def main() -> None:
        async for item in ops.follow_event_batches(cast(Engine, engine), TASK):
            got.extend(item if isinstance(item, list) else [item])

    with pytest.raises(StoreUnavailable, match="went away"):
        asyncio.run(asyncio.wait_for(main(), 10.0))
    assert kinds_of(got) == ["submitted", "ready", "claimed"]
    assert engine.feeds == []


def test_a_task_retried_after_it_failed_is_followed_past_its_old_final_event() -> None:
    engine = FakeEngine()
    engine.commit("dead", "task_failed")
    engine.commit("retried", "task_running")  # a retry re-opened the finished task
    engine.after_read = lambda: engine.commit("committed", "task_succeeded")
    items = asyncio.run(follow(engine))
    assert kinds_of(items) == ["submitted", "ready", "dead", "task_failed", "retried",
                               "task_running", "committed", "task_succeeded", "SUCCEEDED"]


def test_what_arrives_together_comes_in_one_batch() -> None:
    # A watch stream writes a batch as one chunk: the events of one transaction (or
    # of several that came before the stream looked) are not sent one by one.
    engine = FakeEngine()

    def run_on() -> None:
        engine.commit("claimed")
        engine.commit("committed", "task_succeeded")

    engine.after_read = run_on

    async def collect() -> list[Any]:
        stream = ops.follow_event_batches(cast(Engine, engine), TASK)
        return [item async for item in stream]

    items = asyncio.run(asyncio.wait_for(collect(), 10.0))
    assert [[e.kind for e in b] if isinstance(b, list) else b.status for b in items] == [
        ["submitted", "ready"], ["claimed", "committed", "task_succeeded"], "SUCCEEDED"]
