"""The slow ramp after an outage (``engine/_ramp.py``), on the rules with a controlled
clock: several tasks share one dependency's ramp, as every executor shares the store.

Seed 000: while the model is down, work stays WAITING; after recovery it is let through
at small concurrency first, then more, in the order of queue age, deadline and retry
budget — and waiting for the ramp never costs a lease or an attempt.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine import EngineConfig
from axengine.engine._ramp import Ramp, Waiter, decode_ramp, encode_ramp, order
from axengine.engine._rules import RuleConfig
from axengine.local import LocalSession
from axengine.records import NodeState
from executors.contract import (
    Failure,
    NodeContext,
    NodeRequest,
    Outcome,
    Success,
    Unavailable,
)
from tests.engine.rules_kit import T0, World

LEASE = 30.0
DEP = "tool:echo"
ONE = """
name: one
nodes:
  a: {type: tool_call, tool: echo, input: x, retry: 1, timeout: 60}
"""
CONFIG = RuleConfig(unavailable_delay=5.0, ramp_full=4, ramp_poll=1.0, ramp_waiter_ttl=15.0)


def at(seconds: float) -> float:
    return T0 + seconds


def fleet(count: int, *, every: float = 10.0, deadlines: dict[int, float] | None = None,
          ) -> tuple[list[World], dict[str, Ramp]]:
    """``count`` tasks of ONE submitted ``every`` seconds apart, sharing the ramps."""
    ramps: dict[str, Ramp] = {}
    worlds = [World.submit(ONE, now=at(i * every), task_id=f"t{i}", config=CONFIG,
                           ramps=ramps, deadline=(deadlines or {}).get(i, 0.0))
              for i in range(count)]
    return worlds, ramps


def claim(world: World, now: float) -> str:
    return world.claim("a", now=now, lease=LEASE).result  # type: ignore[no-any-return]


def fence(world: World) -> int:
    return world.snaps["a"].fence


def test_an_outage_opens_a_ramp_of_one_and_successes_double_it_until_it_ends() -> None:
    worlds, ramps = fleet(6)
    first = worlds[0]
    assert claim(first, at(60)) == "claimed" and ramps == {}  # no outage: no ramp
    first.complete("a", Unavailable(DEP, "503"), fence=fence(first), now=at(61))
    assert ramps[DEP].limit == 1 and ramps[DEP].since == at(61)
    assert first.snaps["a"].attempt == 0  # the outage spent nothing

    # The probe is the only one let through; the others wait unclaimed.
    t = at(70)
    assert [claim(w, t) for w in worlds] == ["claimed"] + ["not-claimable"] * 5
    assert all(w.snaps["a"].state is NodeState.WAITING for w in worlds[1:])
    assert all(w.snaps["a"].owner == "" and w.snaps["a"].attempt == 0 for w in worlds[1:])
    probe = worlds[0]
    probe.complete("a", Success("ok"), fence=fence(probe), now=at(71))
    assert ramps[DEP].limit == 2
    assert [claim(w, at(72)) for w in worlds[1:]] == ["claimed"] * 2 + ["not-claimable"] * 3
    for w in worlds[1:3]:
        w.complete("a", Success("ok"), fence=fence(w), now=at(73))
    # 2 → 4 = ramp_full: the outage is over, the ramp is gone and nothing waits for it.
    assert DEP not in ramps
    assert [claim(w, at(74)) for w in worlds[3:]] == ["claimed"] * 3


def test_waiting_for_the_ramp_never_expires_a_lease_or_spends_an_attempt() -> None:
    worlds, ramps = fleet(4)
    w0 = worlds[0]
    claim(w0, at(40))
    w0.complete("a", Unavailable(DEP, "503"), fence=fence(w0), now=at(41))
    # A long recovery: the probe answers unavailable again and again for ten minutes
    # while the others keep asking. Nobody is ever claimed but the probe.
    t = at(50)
    for _ in range(60):
        results = [claim(w, t) for w in worlds]
        assert results.count("claimed") == 1
        holder = worlds[results.index("claimed")]
        holder.complete("a", Unavailable(DEP, "still down"), fence=fence(holder), now=t + 1)
        t += CONFIG.unavailable_delay + 5
    for w in worlds:
        a = w.snaps["a"]
        assert (a.state, a.attempt, a.owner) == (NodeState.WAITING, 0, "")
        assert "lease_expired" not in w.kinds("a")
    assert ramps[DEP].limit == 1


def test_the_ramp_admits_the_waiters_in_seed_000s_order() -> None:
    # t0 ready at 0 s, t1 at 10 s, t2 at 20 s, t3 at 30 s; t3's task has the deadline.
    worlds, ramps = fleet(4, deadlines={3: at(10_000)})
    w0, w1, w2, w3 = worlds
    claim(w2, at(40))
    w2.complete("a", Unavailable(DEP, "503"), fence=fence(w2), now=at(41))
    # The probe goes to whoever asks first; everyone else asks and is told to wait.
    assert [claim(w, at(50)) for w in (w3, w1, w0, w2)] == [
        "claimed", "not-claimable", "not-claimable", "not-claimable"]
    w3.complete("a", Unavailable(DEP, "503"), fence=fence(w3), now=at(51))
    # The slot is free again: asked in the worst order, it goes to the oldest wait.
    t = at(60)
    assert [claim(w, t) for w in (w3, w2, w1, w0)] == [
        "not-claimable", "not-claimable", "not-claimable", "claimed"]
    w0.complete("a", Success("ok"), fence=fence(w0), now=at(61))
    # Limit 2: t1 and t2 (older) before t3, although t3 asks first.
    assert [claim(w, at(62)) for w in (w3, w2, w1)] == [
        "not-claimable", "claimed", "claimed"]
    assert ramps[DEP].admitted.keys() == {"t1/a", "t2/a"}


def test_order_is_queue_age_then_deadline_then_retry_budget() -> None:
    waiters = {
        "young": Waiter(queued=50, deadline=0, budget=3, seen=0),
        "old": Waiter(queued=10, deadline=0, budget=1, seen=0),
        "old-due": Waiter(queued=10, deadline=500, budget=1, seen=0),
        "old-due-budget": Waiter(queued=10, deadline=500, budget=2, seen=0),
    }
    assert [k for k, _ in sorted(waiters.items(), key=order)] == [
        "old-due-budget", "old-due", "old", "young"]
    ramp = Ramp(limit=3, admitted={"x": 99.0}, waiting=waiters)
    assert ramp.first(ramp.limit - len(ramp.admitted)) == ["old-due-budget", "old-due"]
    assert decode_ramp(encode_ramp(ramp)) == ramp


def test_a_waiter_that_stops_asking_and_a_slot_that_outlives_its_bound_are_dropped(
        ) -> None:
    worlds, ramps = fleet(3)
    w0, w1, w2 = worlds
    claim(w0, at(30))
    w0.complete("a", Unavailable(DEP, "503"), fence=fence(w0), now=at(31))
    assert claim(w0, at(40)) == "claimed"            # the probe, never heard of again
    assert claim(w1, at(40)) == "not-claimable"      # t1 asks once, then is cancelled
    # Past the probe's bound (timeout 60 + lease 30) and t1's waiter TTL, t2 gets in.
    assert claim(w2, at(40 + 60 + LEASE + 1)) == "claimed"
    assert ramps[DEP].admitted.keys() == {"t2/a"} and ramps[DEP].waiting == {}


def test_a_lapsed_lease_or_a_failure_frees_the_slot_and_another_outage_resets_it() -> None:
    worlds, ramps = fleet(3)
    w0, w1, w2 = worlds
    claim(w0, at(30))
    w0.complete("a", Unavailable(DEP, "503"), fence=fence(w0), now=at(31))
    assert claim(w1, at(40)) == "claimed"
    w1.expire("a", now=at(40 + LEASE + 1))          # its worker died: slot freed
    assert ramps[DEP].admitted == {}
    assert claim(w2, at(72)) == "claimed"
    w2.complete("a", Failure("bad input", retryable=False), fence=fence(w2), now=at(73))
    assert ramps[DEP].admitted == {} and ramps[DEP].limit == 1  # a failure says nothing
    assert claim(w0, at(74)) == "claimed"
    w0.complete("a", Success("ok"), fence=fence(w0), now=at(75))
    assert ramps[DEP].limit == 2
    assert claim(w1, at(76)) == "claimed"
    w1.complete("a", Unavailable(DEP, "down again"), fence=fence(w1), now=at(77))
    assert ramps[DEP].limit == 1 and ramps[DEP].since == at(77)


@pytest.mark.parametrize("dependency", ["executor:shutdown", "kubernetes:quota", "tool:other"])
def test_an_outage_of_something_else_opens_no_ramp(dependency: str) -> None:
    worlds, ramps = fleet(1)
    claim(worlds[0], at(5))
    worlds[0].complete("a", Unavailable(dependency, "x"), fence=fence(worlds[0]), now=at(6))
    assert ramps == {}


# ------------------------------------------------------------------ the outage probe


PROBE = load_dag_text("""\
name: outage_probe
nodes:
  call:
    type: tool_call
    tool: echo
    input: x
    retry: 1
    timeout: 30
""")


@pytest.mark.slow  # real time: four 2.5 s calls behind a ramp (about 9 s)
def test_the_outage_probe_ends_four_of_four_with_no_lease_expiry(
        tmp_path: Path, record_property: Any) -> None:
    """Issue 12's probe: 4 tasks, lease 1.5 s, calls of 2.5 s, ``retry: 1``, an outage
    then recovery. Before the engine admitted nodes at the claim, the nodes held by the
    worker's ramp sent no heartbeat: 1 of 4 went DEAD, 2 more had lease expiries."""
    lock = threading.Lock()
    state = {"down": True, "running": 0, "most": 0, "calls": 0}
    recovered = threading.Event()

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        with lock:
            state["calls"] += 1
            if state["down"]:
                return Unavailable(DEP, "503 from the fake dependency")
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
        try:
            time.sleep(2.5)  # the call itself; the worker heartbeats meanwhile
            return Success("answered")
        finally:
            with lock:
                state["running"] -= 1

    engine_config = EngineConfig(rules=RuleConfig(unavailable_delay=0.3, ramp_full=4,
                                                  ramp_poll=0.2))

    async def main() -> list[tuple[str, str, int, list[str]]]:
        async with LocalSession(AxConfig(home=tmp_path), handler=handler,
                                lease_seconds=1.5, engine_config=engine_config,
                                concurrency=4) as session:
            tasks = [await session.submit(PROBE, {}) for _ in range(4)]

            async def outage_seen() -> bool:
                return state["calls"] >= 4
            await until(outage_seen, "every node meeting the outage")
            with lock:
                state["down"] = False
            recovered.set()
            out = []
            for task in tasks:
                result = await session.wait(task, timeout=25)
                view = await session.engine.get_task(task)
                kinds = [e.kind for e in await session.engine.events(task)]
                out.append((result.status, view.snapshots["call"].state.value,
                            view.snapshots["call"].attempt, kinds))
            return out

    results = asyncio.run(main())
    assert [r[:3] for r in results] == [("SUCCEEDED", "SUCCEEDED", 1)] * 4
    assert all("lease_expired" not in kinds for *_, kinds in results)
    assert all("unavailable" in kinds for *_, kinds in results[:1])
    # After recovery: one probe, then two, then the rest (ramp_full 4): never all four.
    assert state["most"] <= 2
    record_property("summary", f"outage probe: 4/4 SUCCEEDED, 0 lease expiries, attempts "
                    f"{[r[2] for r in results]}, at most {state['most']} calls at once "
                    f"after recovery, {state['calls']} calls in all")


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.02)
