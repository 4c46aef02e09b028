"""Adaptive timeouts (seed 001): a node's ``timeout_policy`` decides each attempt's
timeout at its claim from the durations the same DAG node recorded and the load, and
the ``claimed`` event says why."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from axengine.clock import ManualClock
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine._runs import claimed
from axengine.local import LocalSession
from axengine.records import NodeState
from axengine.timeouts import TIMES as X
from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Paused, Success
from tests.engine.rules_kit import T0, World

POLICY = """
name: adaptive
nodes:
  a:
    type: tool_call
    tool: echo
    input: x
    timeout: 60
    retry: 3
    timeout_policy: {kind: adaptive, percentile: 90, factor: 1.5, min: 5, min_samples: 3,
                     load: [{at: 4, factor: 2}]}
"""


def at(seconds: float) -> float:
    return T0 + seconds


def run(world: World, start: float, seconds: float) -> str:
    """Claim ``a`` at ``start`` and succeed ``seconds`` later; the claim's explanation."""
    assert world.claim("a", now=at(start), lease=120).result == "claimed"
    why = world.events[-1].detail
    world.complete("a", Success("ok"), fence=world.snaps["a"].fence, now=at(start + seconds))
    return why


def timeout_of(world: World) -> float:
    return claimed(world.task, world.dag.nodes["a"], world.snaps["a"], {"input": "x"}).timeout


def test_the_first_runs_use_the_fallback_then_the_percentile_of_recorded_durations() -> None:
    durations: dict[str, list[float]] = {}
    whys = []
    for i, seconds in enumerate((10.0, 20.0, 30.0)):
        world = World.submit(POLICY, task_id=f"t{i}")
        world.durations = durations  # the store's record, shared by every task
        whys.append(run(world, 1, seconds))
    assert whys == [f"timeout 60 s = fallback 60 s ({n} < 3) {X} load 1"
                    for n in ("0 samples", "1 sample", "2 samples")]
    assert durations == {"a": [10.0, 20.0, 30.0]}

    world = World.submit(POLICY, task_id="t3")
    world.durations = durations
    assert world.claim("a", now=at(1), lease=120).result == "claimed"
    assert world.events[-1].detail == f"timeout 45 s = p90 30 s {X} 1.5 {X} load 1"
    assert world.snaps["a"].attempt_timeout == 45 and timeout_of(world) == 45


def test_load_scales_it_and_the_node_timeout_bounds_it() -> None:
    world = World.submit(POLICY)
    world.durations = {"a": [10.0, 20.0, 30.0]}
    world.depths = {"default": 8}
    world.claim("a", now=at(1), lease=120)
    # 30 x 1.5 x 2 = 90, capped at max = the node's timeout.
    assert world.events[-1].detail == (f"timeout 60 s = p90 30 s {X} 1.5 {X} load 2, capped at "
                                       "max 60 s (load: 8 queued in lane default)")
    assert timeout_of(world) == 60


def test_only_successes_are_recorded_and_a_resumed_run_keeps_its_attempts_timeout() -> None:
    world = World.submit(POLICY)
    world.durations = {"a": [4.0, 4.0, 4.0]}
    world.claim("a", now=at(1), lease=120)
    assert world.snaps["a"].attempt_timeout == 6  # p90 4 x 1.5
    world.complete("a", Failure("flaky"), fence=world.snaps["a"].fence, now=at(3))
    assert world.durations["a"] == [4.0, 4.0, 4.0]
    world.claim("a", now=at(10), lease=120)
    world.complete("a", Paused("vendor", seconds=None), fence=world.snaps["a"].fence,
                   now=at(12))
    world.durations["a"] = [100.0] * 3  # other tasks recorded slow runs meanwhile
    world.resume("a", now=at(50))
    world.claim("a", now=at(51), lease=120)
    assert world.events[-1].detail == "timeout 6 s (the attempt's, resumed)"
    assert timeout_of(world) == 4  # 6 s, less the 2 s it ran before pausing
    world.complete("a", Success("ok"), fence=world.snaps["a"].fence, now=at(52))
    assert world.durations["a"] == [100.0, 100.0, 100.0, 3.0]  # 2 s + 1 s


def test_a_node_without_a_policy_records_nothing_and_says_nothing() -> None:
    world = World.submit(
        "name: plain\nnodes:\n  a: {type: tool_call, tool: echo, input: x, timeout: 60}\n")
    run(world, 1, 5)
    assert [e.detail for e in world.events if e.kind == "claimed"] == [""]
    assert world.durations == {} and world.snaps["a"].attempt_timeout == 0


def test_the_embedded_engine_records_and_uses_the_durations(tmp_path: Path) -> None:
    dag = load_dag_text("""
name: learns
nodes:
  a:
    type: tool_call
    tool: echo
    input: x
    timeout: 30
    timeout_policy: {kind: percentile, percentile: 50, min: 2, min_samples: 2}
""")

    async def main() -> list[str]:
        async with LocalSession(AxConfig(home=tmp_path)) as session:
            details = []
            for _ in range(3):
                task = await session.submit(dag, {})
                result = await session.wait(task, timeout=20)
                assert result.status == "SUCCEEDED"
                details += [e.detail for e in await session.engine.events(task)
                            if e.kind == "claimed"]
            return details

    details = asyncio.run(main())
    assert details[:2] == ["timeout 30 s = fallback 30 s (0 samples < 2)",
                           "timeout 30 s = fallback 30 s (1 sample < 2)"]
    # echo takes milliseconds: p50 of two such runs, raised to min 2 s.
    assert details[2].startswith("timeout 2 s = p50 0") and details[2].endswith(
        "raised to min 2 s"), details[2]


def test_progress_moves_the_timeout_by_the_grace_up_to_the_max(tmp_path: Path) -> None:
    """progress_grace on the embedded engine, on a manual clock: a run that reports
    progress near its 10 s deadline gets 5 s more, again while progress keeps coming,
    never past max (30 s); without progress in the last 5 s it is stopped."""
    dag = load_dag_text("""
name: graced
nodes:
  a:
    type: tool_call
    tool: echo
    input: x
    timeout: 30
    retry: 0
    timeout_policy: {kind: adaptive, fallback: 10, progress_grace: 5}
""")
    step = threading.Event()
    done = threading.Event()

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        while not ctx.cancelled:
            if step.wait(0.01):
                step.clear()
                ctx.progress("page")
                done.set()
        return Failure("stopped", retryable=True)

    async def main() -> tuple[str, str]:
        clock = ManualClock()
        async with LocalSession(AxConfig(home=tmp_path), handler=handler, clock=clock,
                                reconcile_interval=3600, lease_seconds=600) as session:
            task = await session.submit(dag, {})

            async def running() -> bool:
                snap = (await session.engine.get_task(task)).snapshots["a"]
                return snap.state is NodeState.RUNNING

            async def progressed() -> bool:
                return done.is_set()

            await until(running)  # claimed: the run's clock starts now (t = 0)
            for gap in (8.0, 5.0):  # progress at t = 8 (before 10), then t = 13 (before 15)
                clock.advance(gap)
                step.set()
                await until(progressed)
                done.clear()
            clock.advance(8.0)  # t = 21: no progress after 13, so the deadline 20 holds
            result = await session.wait(task, timeout=20)
            claimed_ = [e.detail for e in await session.engine.events(task)
                        if e.kind == "claimed"]
            return result.errors["a"], claimed_[0]

    error, why = asyncio.run(main())
    assert why == f"timeout 10 s = fallback 10 s (0 samples < 5) {X} load 1"
    # 10 → 15 (progress at 8) → 20 (progress at 13) → stopped at 20: no progress since 15.
    assert error == ("attempts exhausted (1/1): timed out after 21.0s (timeout 10s + progress "
                     "grace 10s)"), error


async def until(check: Any) -> None:
    for _ in range(2000):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached within 20 s")
