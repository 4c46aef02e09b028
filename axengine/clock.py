"""Time as the engine's processes see it: one seam for reading clocks and waiting.

The engine, the worker, the reconciler and the embedded session read time and wait only
through a :class:`Clock`. :data:`SYSTEM` is the real one. :class:`ManualClock` moves only
when told to, so a test can run a 60-second node timeout, a lease expiry or a gate's
bounded wait in no real time: every timer due by the new time fires on
:meth:`ManualClock.advance`, in deadline order.

Work that is not time (a handler finishing, a queue push, a commit) still wakes waiters
at once under either clock; only the timeouts follow the clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Any, Protocol

__all__ = ["SYSTEM", "Clock", "ManualClock", "SystemClock", "sleep", "wait_event"]


class Clock(Protocol):
    """What reads time and waits for it."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (what records store)."""
        ...

    def monotonic(self) -> float:
        """Seconds that never go back (for durations)."""
        ...

    def timer(self, seconds: float) -> asyncio.Future[None]:
        """A future of the running loop that completes ``seconds`` from now."""
        ...


class SystemClock:
    """The real clocks of this machine and the event loop's timers."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def timer(self, seconds: float) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        handle = loop.call_later(max(0.0, seconds), _resolve, future)
        future.add_done_callback(lambda _: handle.cancel())
        return future


#: The clock of every process unless one is injected.
SYSTEM: Clock = SystemClock()


class ManualClock:
    """A clock that moves only by :meth:`advance` (or :meth:`set`), for tests.

    Args:
        start: Its time at creation (epoch seconds).
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def timer(self, seconds: float) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if seconds <= 0:
            future.set_result(None)
        else:
            heapq.heappush(self._timers, (self._now + seconds, next(self._order), future))
        return future

    @property
    def pending(self) -> int:
        """Timers armed and not yet due (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._timers if not f.done())

    def advance(self, seconds: float) -> None:
        """Move time forward and fire every timer due by then.

        Raises:
            ValueError: ``seconds`` is negative (time does not go back).
        """
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self.set(self._now + seconds)

    def set(self, now: float) -> None:
        """Move time to ``now`` (not earlier than the current time) and fire due timers."""
        if now < self._now:
            raise ValueError(f"a clock does not go back ({now} < {self._now})")
        self._now = now
        while self._timers and self._timers[0][0] <= now:
            _, _, future = heapq.heappop(self._timers)
            _resolve(future)

    def __call__(self) -> float:
        """Read as a plain ``() -> float`` clock (what ``Engine(clock=...)`` takes)."""
        return self._now


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def sleep(clock: Clock, seconds: float) -> None:
    """Sleep ``seconds`` of ``clock``."""
    await clock.timer(seconds)


async def wait_event(clock: Clock, event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` of ``clock`` pass; True when set."""
    if event.is_set():
        return True
    timer = clock.timer(seconds)
    setter = asyncio.ensure_future(event.wait())
    waiting: set[asyncio.Future[Any]] = {timer, setter}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        setter.cancel()
    return event.is_set()
