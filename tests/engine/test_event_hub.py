"""The engine's shared events feed (``Engine.subscribe_events``) on SQLite and on a real
etcd: one store watch serves every follower, each follower gets its own task's events in
commit order and nothing committed after the feed started is missed; the watch stops
when nobody has followed for a while, and a failed watch ends its followers' feeds.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, Event
from axengine.engine import _hub as hub
from axengine.errors import StoreError
from axengine.store import StoreWrapper, WatchEvent
from executors.contract import Success
from tests.engine.test_backends import build

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "etcd"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    spec: dict[str, Any] = {"store": request.param, "queue": "inprocess", "tmp": tmp_path,
                            "prefix": f"/t-{uuid.uuid4().hex[:8]}"}
    if request.param == "etcd":
        spec["etcd"] = request.getfixturevalue("etcd_server")
    yield spec


class CountingWatches(StoreWrapper):
    """Counts the watches opened on the store."""

    watches = 0

    def watch(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        self.watches += 1
        return self.inner.watch(prefix, start_revision=start_revision)


def _one_node() -> Dag:
    return load_dag_mapping({"name": "one", "nodes": {
        "a": {"type": "tool_call", "tool": "echo", "input": "x"}}},
        tools={"echo"}, models=set())


def _engine(spec: dict[str, Any]) -> tuple[Engine, CountingWatches]:
    engine = build(spec)
    counting = CountingWatches(engine._store)
    engine._store = counting
    engine._hub = hub.EventHub(counting, engine._keys)
    return engine, counting


async def _next(inbox: asyncio.Queue[Event | BaseException]) -> Event | BaseException:
    return await asyncio.wait_for(inbox.get(), 10)  # a guard against hanging


async def _run_node(engine: Engine, task: str) -> None:
    claim = await engine.claim(task, "a", worker="w1")
    assert claim.request is not None
    assert await engine.complete(task, "a", fence=claim.request.fence,
                                 outcome=Success("ok")) == "committed"


def test_one_watch_serves_every_follower_with_its_own_tasks_events(
        spec: dict[str, Any]) -> None:
    async def main() -> None:
        engine, counting = _engine(spec)
        try:
            first = (await engine.submit(_one_node(), {})).task_id
            second = (await engine.submit(_one_node(), {})).task_id
            async with engine.subscribe_events(first) as a, \
                    engine.subscribe_events(second) as b:
                assert a.since == b.since and a.since >= 1
                await _run_node(engine, first)
                await _run_node(engine, second)
                kinds_a: list[str] = []
                while not kinds_a or kinds_a[-1] != "task_succeeded":
                    event = await _next(a.inbox)
                    assert isinstance(event, Event) and event.task_id == first
                    kinds_a.append(event.kind)
                assert kinds_a[0] == "claimed" and "committed" in kinds_a
                event = await _next(b.inbox)
                assert isinstance(event, Event)
                assert (event.task_id, event.kind) == (second, "claimed")
                assert event.seq > a.since
            # Followers one after another share the running watch.
            for _ in range(3):
                async with engine.subscribe_events(first):
                    pass
            assert counting.watches == 1
        finally:
            await engine._hub.close()
            await spec["opened"].close()

    asyncio.run(main())


def test_the_watch_stops_when_idle_and_starts_again_for_the_next_follower(
        spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "IDLE_SECONDS", 0.05)

    async def main() -> None:
        engine, counting = _engine(spec)
        try:
            task = (await engine.submit(_one_node(), {})).task_id
            async with engine.subscribe_events(task):
                pass
            assert counting.watches == 1
            watch = engine._hub._watch
            assert watch is not None and watch.pump is not None
            await asyncio.wait({watch.pump}, timeout=10)
            assert watch.pump.cancelled()  # stopped once idle
            assert engine._hub._watch is None
            async with engine.subscribe_events(task) as feed:
                await _run_node(engine, task)
                event = await _next(feed.inbox)
                assert isinstance(event, Event) and event.kind == "claimed"
            assert counting.watches == 2
        finally:
            await engine._hub.close()
            await spec["opened"].close()

    asyncio.run(main())


def test_a_closed_store_ends_the_feed_with_an_error(spec: dict[str, Any]) -> None:
    async def main() -> None:
        engine, _ = _engine(spec)
        task = (await engine.submit(_one_node(), {})).task_id
        async with engine.subscribe_events(task) as feed:
            await spec["opened"].close()
            error = await _next(feed.inbox)
            assert isinstance(error, StoreError)
        watch = engine._hub._watch
        assert watch is not None and watch.ended

    asyncio.run(main())
