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


def test_a_leader_renews_at_half_life_not_on_every_pass(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    engine = make_engine()

    async def main() -> list[int]:
        leader = Reconciler(engine, owner="leader", leader_ttl=10)
        other = Reconciler(engine, owner="other", leader_ttl=10)
        revisions = []
        for step in (0.0, 1.0, 3.0, 1.5, 0.1, 4.0):  # seconds between elections
            clock.advance(step)
            assert await leader.elect()
            assert not await other.elect()
            revisions.append(await engine.revision())
        return revisions

    revisions = run(main())
    # TTL 10 s: written at t=0 (until 10); kept at t=1 and t=4 (9 s and 6 s left);
    # renewed at t=5.5 (4.5 s left, under half); kept at t=5.6 and t=9.6 (until 15.5).
    first = revisions[0]
    assert revisions[1] == revisions[2] == first
    assert revisions[3] > first
    assert revisions[4] == revisions[5] == revisions[3]
