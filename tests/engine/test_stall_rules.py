"""Blocking verdicts in the pure rules: a silent RUNNING node is judged on its
heartbeat, its progress and the resource activity its heartbeats carried
(``axengine.engine._stall``, docs/blocking.md).

Every test sets the snapshots and times by hand through :class:`World`: heartbeats every
10 s (the worker's rhythm at a 30 s lease), the reconciler's ``expire`` at chosen times.
"""

from __future__ import annotations

from axengine.activity import Activity
from axengine.records import NodeState
from tests.engine.rules_kit import T0, World

LEASE = 30.0
#: One node whose "llm:*" steps may be silent 120 s; retries so a fence re-queues it.
DAG = """
name: stall
nodes:
  a:
    type: tool_call
    tool: echo
    input: x
    timeout: 600
    retry: 2
    stall_windows: {"llm:*": 120}
"""
BUSY = Activity(seconds=60, cpu_seconds=4.2, io_bytes=3 * 1024 * 1024, net_bytes=None,
                source="pgrp 812 (io read_bytes+write_bytes, net shared namespace)")
IDLE = Activity(seconds=60, cpu_seconds=0.0, io_bytes=0, net_bytes=None,
                source="pgrp 812 (io read_bytes+write_bytes, net shared namespace)")


def at(t: float) -> float:
    return T0 + 100 + t


def started(world: World) -> int:
    """Claim ``a`` at 0 and report the step ``llm:gpt-4o`` at once; its fence."""
    assert world.claim("a", now=at(0), worker="w1", lease=LEASE).result == "claimed"
    fence = world.snaps["a"].fence
    assert world.progress("a", fence=fence, now=at(0), marker="llm:gpt-4o usage 0").result \
        == "ok"
    return fence


def beat(world: World, fence: int, start: float, end: float,
         activity: Activity | None) -> None:
    """Heartbeats every 10 s from ``start`` to ``end`` (inclusive), each with
    ``activity``."""
    t = start
    while t <= end:
        assert world.heartbeat("a", fence=fence, now=at(t), lease=LEASE,
                               activity=activity).result == "ok"
        t += 10


def details(world: World, kind: str) -> list[str]:
    return [e.detail for e in world.events if e.kind == kind]


def test_a_silent_busy_node_is_extended_once_then_fenced() -> None:
    world = World.submit(DAG)
    fence = started(world)
    beat(world, fence, 10, 120, BUSY)
    assert world.expire("a", now=at(60)).result == "ok"          # half the window: ok
    world.expire("a", now=at(100))                               # a note
    beat(world, fence, 121, 121, BUSY)
    world.expire("a", now=at(121))                               # past W, working
    a = world.snaps["a"]
    assert a.state is NodeState.RUNNING
    assert (a.stall_verdict, a.stall_extended_until) == ("extend", at(181))
    assert details(world, "stall_extended") == [
        "no progress for 121 s in step llm:gpt-4o (window 120 s, step window 'llm:*'); "
        "cpu 4.20 s, io 3.0 MiB, net unknown over 60 s: working → extend once by 60 s"]
    beat(world, fence, 131, 181, BUSY)
    for t in (140, 150, 181):                                    # one warning, not three
        world.expire("a", now=at(t))
    assert world.kinds("a").count("stall_warning") == 1
    assert world.state("a") is NodeState.RUNNING
    world.expire("a", now=at(182))                               # past the extension
    a = world.snaps["a"]
    assert (a.state, a.fence) == (NodeState.WAITING, fence + 1)
    assert world.kinds("a")[-1] == "lease_expired"
    assert details(world, "lease_expired") == [
        "no progress for 182 s in step llm:gpt-4o (window 120 s, step window 'llm:*'); "
        "cpu 4.20 s, io 3.0 MiB, net unknown over 60 s: still busy, yet no progress (a "
        "busy loop looks like this; raise the step's window if it is normal); past the "
        "extension (181 s) → fence out; owner w1 fenced out"]
    # The attempt ended: its activity and verdicts do not follow the node.
    assert (a.activity, a.stall_verdict, a.stall_extended_until) == (None, "", 0.0)
    assert world.kinds("a").count("stall_note") == 1


def test_an_idle_node_is_fenced_after_the_window_with_its_evidence() -> None:
    world = World.submit(DAG)
    fence = started(world)
    beat(world, fence, 10, 120, IDLE)
    world.expire("a", now=at(120))                               # s = W: only a note
    assert world.state("a") is NodeState.RUNNING
    world.expire("a", now=at(121))
    assert world.state("a") is NodeState.WAITING
    [detail] = details(world, "lease_expired")
    assert detail == ("no progress for 121 s in step llm:gpt-4o (window 120 s, step window "
                      "'llm:*'); cpu 0.00 s, io 0 B, net unknown over 60 s: no work → "
                      "fence out; owner w1 fenced out")
    assert world.snaps["a"].error.endswith("no work → fence out")
    assert world.kinds("a").count("stall_extended") == 0


def test_unknown_activity_warns_then_fences_at_a_quarter_past_the_window() -> None:
    world = World.submit(DAG)
    fence = started(world)
    beat(world, fence, 10, 150, None)                            # beats without samples
    world.expire("a", now=at(121))
    assert world.state("a") is NodeState.RUNNING
    assert details(world, "stall_warning") == [
        "no progress for 121 s in step llm:gpt-4o (window 120 s, step window 'llm:*'); "
        "resource activity unknown (no sample); never extended on missing evidence → "
        "warn, fence out after 150 s"]
    world.expire("a", now=at(150))                               # 1.25 W: still a warning
    assert world.state("a") is NodeState.RUNNING
    assert world.kinds("a").count("stall_warning") == 1
    world.expire("a", now=at(151))
    assert world.state("a") is NodeState.WAITING
    assert "resource activity unknown" in details(world, "lease_expired")[0]


def test_activity_older_than_two_heartbeats_counts_as_unknown() -> None:
    world = World.submit(DAG)
    fence = started(world)
    beat(world, fence, 10, 90, BUSY)
    beat(world, fence, 100, 120, None)        # the sampler stopped: handler beats only
    world.expire("a", now=at(121))            # last sample at 90, 31 s > two beats old
    assert world.kinds("a").count("stall_extended") == 0
    assert "resource activity unknown" in details(world, "stall_warning")[0]


def test_progress_starts_a_new_stall_with_a_fresh_extension() -> None:
    world = World.submit(DAG)
    fence = started(world)
    beat(world, fence, 10, 121, BUSY)
    world.expire("a", now=at(121))
    assert world.snaps["a"].stall_verdict == "extend"
    assert world.progress("a", fence=fence, now=at(130), marker="llm:gpt-4o usage 1").result \
        == "ok"
    a = world.snaps["a"]
    assert (a.stall_verdict, a.stall_progress_at, a.stall_extended_until) == ("", 0.0, 0.0)
    beat(world, fence, 140, 251, BUSY)
    world.expire("a", now=at(251))            # 121 s after the new progress: extended again
    assert world.kinds("a").count("stall_extended") == 2
    assert world.snaps["a"].stall_extended_until == at(311)


def test_a_claim_does_not_take_over_an_extended_node() -> None:
    world = World.submit(DAG)
    fence = started(world)
    beat(world, fence, 10, 171, BUSY)
    world.expire("a", now=at(121))            # extended until 181
    # The lease is live; the node is past its window but extended: not stalled.
    plan = world.claim("a", now=at(171), worker="w2", lease=LEASE)
    assert plan.result == "not-claimable" and world.snaps["a"].owner == "w1"
    # Past the extension the verdict fences, and the claim takes over as the
    # reconciler would.
    assert world.claim("a", now=at(182), worker="w2", lease=LEASE).result == "claimed"
    assert world.snaps["a"].owner == "w2"


def test_a_claim_waits_out_the_warning_of_a_node_whose_resources_are_unknown() -> None:
    world = World.submit(DAG)
    fence = started(world)
    beat(world, fence, 10, 150, None)
    assert world.claim("a", now=at(150), worker="w2", lease=LEASE).result == "not-claimable"
    assert world.claim("a", now=at(151), worker="w2", lease=LEASE).result == "claimed"
