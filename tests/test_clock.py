"""The clock seam: a manual clock fires timers only when moved, in deadline order."""

from __future__ import annotations

import asyncio

import pytest

from axengine.clock import SYSTEM, ManualClock, sleep, wait_event


def test_manual_timers_fire_only_when_due_and_in_order() -> None:
    async def main() -> list[str]:
        clock = ManualClock(start=100.0)
        fired: list[str] = []
        for name, seconds in (("b", 20.0), ("a", 10.0), ("c", 30.0)):
            clock.timer(seconds).add_done_callback(lambda _, n=name: fired.append(n))
        clock.advance(9.5)
        await asyncio.sleep(0)
        assert fired == [] and clock.pending == 3
        clock.advance(10.5)  # now 120: a (110) and b (120) are due
        await asyncio.sleep(0)
        assert clock.time() == clock.monotonic() == 120.0
        assert clock.pending == 1
        return fired

    assert asyncio.run(main()) == ["a", "b"]


def test_sleep_and_wait_event_follow_the_manual_clock() -> None:
    async def main() -> tuple[bool, bool, float]:
        clock = ManualClock()
        t0 = clock.time()
        event = asyncio.Event()
        sleeper = asyncio.create_task(sleep(clock, 60.0))
        waiter = asyncio.create_task(wait_event(clock, event, 3600.0))
        await asyncio.sleep(0)
        assert not sleeper.done() and not waiter.done()
        clock.advance(60.0)
        await sleeper
        event.set()  # the event, not the hour, ends the wait
        set_first = await waiter
        timed_out = await asyncio.create_task(wait_event(clock, asyncio.Event(), 0.0))
        return set_first, timed_out, clock.time() - t0

    set_first, timed_out, elapsed = asyncio.run(main())
    assert set_first is True
    assert timed_out is False
    assert elapsed == 60.0


def test_manual_clock_refuses_to_go_back() -> None:
    clock = ManualClock(start=10.0)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="does not go back"):
        clock.set(9.0)
    assert clock() == 10.0


def test_system_clock_timer_completes() -> None:
    async def main() -> bool:
        event = asyncio.Event()
        return await wait_event(SYSTEM, event, 0.01)

    assert asyncio.run(main()) is False
