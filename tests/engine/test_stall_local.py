"""Blocking detection end to end in the embedded engine: the worker samples the
handler thread's CPU at each heartbeat, the heartbeat carries it, the reconciler judges
(docs/blocking.md).

Windows are shrunk to seconds: a 3 s lease (heartbeats every second), a 2 s stall
window, and thresholds that judge half-second intervals (the defaults need 10 s).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from axengine.activity import ActivitySample, ActivityThresholds
from axengine.blocking import BlockingPolicy
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine import EngineConfig, RuleConfig
from axengine.local import LocalSession
from axengine.records import Event
from axengine.worker import RunContext, ThreadRunner
from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success

DAG = load_dag_text("""
name: blocking
nodes:
  busy: {type: tool_call, tool: echo, input: x, timeout: 10, stall_timeout: 2, retry: 0}
  idle: {type: tool_call, tool: echo, input: x, timeout: 10, stall_timeout: 2, retry: 0}
""", tools={"echo"})
#: 0.1 CPU second per second is work: a spinning thread uses about 1, a sleeping one ~0.
POLICY = BlockingPolicy(thresholds=ActivityThresholds(cpu_per_minute=6.0, min_seconds=0.4))


def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """``busy`` spins, ``idle`` sleeps; neither reports progress; both stop when told."""
    end = time.monotonic() + 8
    while not ctx.cancelled and time.monotonic() < end:
        if request.node_id == "idle":
            time.sleep(0.2)
        else:
            sum(range(2000))
            time.sleep(0)  # let the worker's heartbeats have the GIL on a busy machine
    return Failure("stopped", retryable=True)


async def until(events: list[Event], predicate: Callable[[Event], bool],
                timeout: float = 15.0) -> None:
    """Wait (a condition, not a fixed sleep) until an event satisfies ``predicate``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not any(predicate(e) for e in events):
        assert asyncio.get_running_loop().time() < deadline, [
            (e.kind, e.node_id, e.detail) for e in events]
        await asyncio.sleep(0.05)


def test_a_busy_silent_node_is_extended_and_a_sleeping_one_fenced(tmp_path: Path) -> None:
    async def main() -> list[Event]:
        events: list[Event] = []
        config = EngineConfig(lease_seconds=3.0, rules=RuleConfig(blocking=POLICY))
        async with LocalSession(AxConfig(home=tmp_path), handler=handler, lease_seconds=3.0,
                                reconcile_interval=0.2, engine_config=config) as s:
            s.engine.add_listener(lambda task, new: events.extend(new))
            task = await s.submit(DAG, None)
            await until(events, lambda e: e.kind == "stall_extended" and e.node_id == "busy")
            await until(events, lambda e: e.kind == "dead" and e.node_id == "idle")
            await until(events, lambda e: e.kind == "dead" and e.node_id == "busy")
            await s.wait(task, timeout=5)
        return events

    events = asyncio.run(main())
    by = {(e.node_id, e.kind): e.detail for e in events}
    # The busy node: extended once on its CPU, then fenced past the extension.
    assert "working → extend once" in by[("busy", "stall_extended")]
    assert "cpu " in by[("busy", "stall_extended")]
    assert "still busy, yet no progress" in by[("busy", "dead")]
    # The sleeping node: fenced at its window, the evidence naming its idle CPU.
    idle = by[("idle", "dead")]
    assert "cpu 0.0" in idle and ": no work → fence out" in idle, idle
    assert ("idle", "stall_extended") not in by


def test_the_thread_runner_samples_the_handler_thread_only_while_it_runs() -> None:
    started, release = threading.Event(), threading.Event()

    def waits(request: NodeRequest, ctx: NodeContext) -> Outcome:
        started.set()
        release.wait(5)
        return Success(None)

    async def main() -> tuple[ActivitySample | None, ActivitySample | None,
                              ActivitySample | None]:
        runner = ThreadRunner(waits, concurrency=1)
        request = NodeRequest(task_id="t", node_id="n", node_type="tool_call", attempt=1,
                              fence=1, config={}, input=None)
        ctx = RunContext(loop=asyncio.get_running_loop(), engine=None,  # type: ignore[arg-type]
                         request=request, lease_seconds=30, settings={})
        before = runner.activity(ctx)
        run = asyncio.create_task(runner.run(request, ctx, timeout=10))
        await asyncio.to_thread(started.wait, 5)
        during = runner.activity(ctx)
        release.set()
        await run
        after = runner.activity(ctx)
        await runner.close()
        return before, during, after

    before, during, after = asyncio.run(main())
    assert before is None and after is None  # a reused pool thread is never counted
    assert during is not None and during.cpu_seconds is not None
    assert during.source.startswith("thread ax-node") and during.io_bytes is None
