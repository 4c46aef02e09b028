"""Reconciler leadership: a leader that stops resigns, so its successor need not wait
out the TTL (a second embedded session in one process, an API rolling restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from axengine.engine import Engine, Reconciler
from tests.engine.conftest import FakeClock, run


def test_a_stopped_leader_resigns_and_the_next_one_is_elected_at_once(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    engine = make_engine()

    async def main() -> tuple[bool, bool, bool]:
        first = Reconciler(engine, owner="first", interval=0.01, leader_ttl=3600)
        second = Reconciler(engine, owner="second", interval=0.01, leader_ttl=3600)
        assert await first.elect()
        # While the first one leads (its TTL is an hour on a frozen clock), nobody else can.
        blocked = not await second.elect()
        stop = asyncio.Event()
        stop.set()
        await first.run(stop)  # stops at once, then resigns
        return blocked, await second.elect(), await first.elect()

    blocked, taken, retaken = run(main())
    assert blocked
    assert taken, "the successor had to wait for the resigned leader's TTL"
    assert not retaken, "leadership moved to the successor, not back"


def test_resign_leaves_a_record_someone_else_holds(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()

    async def main() -> bool:
        holder = Reconciler(engine, owner="holder", leader_ttl=3600)
        other = Reconciler(engine, owner="other", leader_ttl=3600)
        assert await holder.elect()
        await other.resign()  # not its record: must not delete it
        return await other.elect()

    assert not run(main())
