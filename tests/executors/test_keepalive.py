"""``executors.keepalive.Keepalive``: cancellation on every call, heartbeats paced."""

from __future__ import annotations

from executors.keepalive import DEFAULT_HEARTBEAT_INTERVAL, Keepalive
from tests.executors.fakes import FakeContext


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_heartbeats_are_paced_by_the_interval() -> None:
    ctx, clock = FakeContext(), Clock()
    alive = Keepalive(ctx, interval=2.0, clock=clock)
    assert alive() and ctx.heartbeats == 0  # created just now: nothing to renew yet
    clock.now += 1.9
    assert alive() and ctx.heartbeats == 0
    clock.now += 0.1
    assert alive() and ctx.heartbeats == 1
    assert alive() and ctx.heartbeats == 1  # the interval restarts at each heartbeat
    clock.now += 2.0
    assert alive() and ctx.heartbeats == 2


def test_a_stale_heartbeat_stops_the_run() -> None:
    ctx, clock = FakeContext(stale_after_heartbeats=2), Clock()
    alive = Keepalive(ctx, interval=1.0, clock=clock)
    clock.now += 1.0
    assert alive()
    clock.now += 1.0
    assert not alive()
    assert ctx.heartbeats == 2


def test_cancellation_is_checked_on_every_call_without_a_heartbeat() -> None:
    ctx, clock = FakeContext(), Clock()
    alive = Keepalive(ctx, interval=1.0, clock=clock)
    ctx.cancel()
    clock.now += 5.0
    assert not alive()
    assert ctx.heartbeats == 0


def test_the_default_interval_is_one_second() -> None:
    ctx, clock = FakeContext(), Clock()
    alive = Keepalive(ctx, clock=clock)
    clock.now += DEFAULT_HEARTBEAT_INTERVAL
    assert alive() and ctx.heartbeats == 1
    assert DEFAULT_HEARTBEAT_INTERVAL == 1.0
