"""``follow_events`` (the watch stream's source) against a fake engine that models etcd's
two kinds of watch: one from now on is served at each commit, one from a past revision
only when etcd next syncs its history (up to 100 ms later; here: when the test says).

The stream must not depend on the history watch for events committed after the live
watch started, and must still end when the task finished before the live watch started.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

from axengine.api import _ops as ops
from axengine.engine import Engine, Timeline
from axengine.records import Event, TaskRecord, TaskStatus

TASK = "t-1"


class FakeEngine:
    """The reads ``follow_events`` makes, over an in-memory timeline of one task."""

    def __init__(self, *, serve_history: bool) -> None:
        self.revision_now = 0
        self.stored: list[Event] = []
        self.watches: list[asyncio.Queue[Event]] = []
        self.serve_history = serve_history
        self.task_reads = 0
        #: Called as the live watch starts: commits made by ``before_live`` are missed
        #: by it, those made by ``after_live`` are delivered by it.
        self.before_live: Callable[[], None] = lambda: None
        self.after_live: Callable[[], None] = lambda: None
        self.commit("submitted", "ready")

    def commit(self, *kinds: str) -> None:
        """One transaction: its events share the new revision as their seq."""
        self.revision_now += 1
        for kind in kinds:
            state = kind.removeprefix("task_").upper() if kind.startswith("task_") else ""
            event = Event(TASK, f"e{len(self.stored):03d}", kind, at=0.0,
                          seq=self.revision_now, state=state)
            self.stored.append(event)
            for queue in self.watches:
                queue.put_nowait(event)

    async def revision(self) -> int:
        return self.revision_now

    async def timeline(self, task_id: str) -> Timeline:
        """The record and the events, read together (one read)."""
        self.task_reads += 1
        record = cast(TaskRecord, SimpleNamespace(status=TaskStatus.RUNNING))
        return Timeline(record, list(self.stored), self.revision_now)

    async def events(self, task_id: str) -> list[Event]:
        return list(self.stored)


    async def watch_events(self, task_id: str, *, start_revision: int
                           ) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        if start_revision:
            if not self.serve_history:
                await asyncio.Event().wait()  # etcd never gets round to syncing it
            for event in self.stored:
                if event.seq >= start_revision:
                    queue.put_nowait(event)
        else:
            self.before_live()
        self.watches.append(queue)
        if not start_revision:
            self.after_live()
        while True:
            yield await queue.get()


async def follow(engine: FakeEngine, after_seq: int = 0) -> list[Any]:
    async def collect() -> list[Any]:
        stream = ops.follow_events(cast(Engine, engine), TASK, after_seq=after_seq)
        return [item async for item in stream]

    # A guard against hanging, not a latency bound.
    return await asyncio.wait_for(collect(), 10.0)


def kinds_of(items: list[Any]) -> list[str]:
    return [item.kind if isinstance(item, Event) else item.status for item in items]


def test_live_events_need_no_history_watch() -> None:
    engine = FakeEngine(serve_history=False)
    engine.before_live = lambda: engine.commit("claimed")  # between replay and watch
    engine.after_live = lambda: engine.commit("committed", "task_succeeded")
    items = asyncio.run(follow(engine))
    assert kinds_of(items) == ["submitted", "ready", "claimed", "committed",
                               "task_succeeded", "SUCCEEDED"]
    assert isinstance(items[-1], ops.WatchEnd)


def test_a_task_that_ended_before_the_live_watch_still_ends_the_stream() -> None:
    engine = FakeEngine(serve_history=True)

    def finish() -> None:
        engine.commit("claimed")
        engine.commit("committed", "task_succeeded")

    engine.before_live = finish  # nothing is left for the live watch to see
    items = asyncio.run(follow(engine))
    assert kinds_of(items) == ["submitted", "ready", "claimed", "committed",
                               "task_succeeded", "SUCCEEDED"]


def test_both_watches_together_send_each_event_once_in_order() -> None:
    engine = FakeEngine(serve_history=True)
    engine.before_live = lambda: engine.commit("claimed")

    def run_on() -> None:
        engine.commit("committed", "ready")
        engine.commit("claimed")
        engine.commit("committed", "task_succeeded")

    engine.after_live = run_on
    items = asyncio.run(follow(engine))
    events = [item for item in items if isinstance(item, Event)]
    assert [e.event_id for e in events] == [e.event_id for e in engine.stored]
    assert kinds_of(items)[-1] == "SUCCEEDED"


def test_a_resumed_stream_sends_nothing_up_to_after_seq() -> None:
    engine = FakeEngine(serve_history=False)
    engine.after_live = lambda: engine.commit("task_succeeded")
    items = asyncio.run(follow(engine, after_seq=1))
    assert kinds_of(items) == ["task_succeeded", "SUCCEEDED"]



def test_a_task_whose_replay_ends_final_ends_the_stream_with_one_read() -> None:
    engine = FakeEngine(serve_history=False)
    engine.commit("claimed")
    engine.commit("committed", "task_succeeded")

    def watched() -> None:
        raise AssertionError("a finished task's stream started a watch")

    engine.before_live = watched
    items = asyncio.run(follow(engine))
    assert kinds_of(items)[-2:] == ["task_succeeded", "SUCCEEDED"]
    assert engine.task_reads == 1


def test_a_task_retried_after_it_failed_is_followed_past_its_old_final_event() -> None:
    engine = FakeEngine(serve_history=False)
    engine.commit("dead", "task_failed")
    engine.commit("retried", "task_running")  # a retry re-opened the finished task
    engine.after_live = lambda: engine.commit("committed", "task_succeeded")
    items = asyncio.run(follow(engine))
    assert kinds_of(items) == ["submitted", "ready", "dead", "task_failed", "retried",
                               "task_running", "committed", "task_succeeded", "SUCCEEDED"]


def test_what_arrives_together_comes_in_one_batch() -> None:
    # A watch stream writes a batch as one chunk: the events of one transaction (or
    # of several that came before the stream looked) are not sent one by one.
    engine = FakeEngine(serve_history=False)

    def run_on() -> None:
        engine.commit("claimed")
        engine.commit("committed", "task_succeeded")

    engine.after_live = run_on

    async def collect() -> list[Any]:
        stream = ops.follow_event_batches(cast(Engine, engine), TASK)
        return [item async for item in stream]

    items = asyncio.run(asyncio.wait_for(collect(), 10.0))
    assert [[e.kind for e in b] if isinstance(b, list) else b.status for b in items] == [
        ["submitted", "ready"], ["claimed", "committed", "task_succeeded"], "SUCCEEDED"]
