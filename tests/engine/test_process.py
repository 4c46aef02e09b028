"""The one composition: process shapes start, serve and stop the same way, and the
embedded shape runs on an injected clock (timeouts without waiting for them)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from axengine.clock import ManualClock
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.local import LocalSession
from axengine.process import AxProcess, ExecutorSpec, Shape
from axengine.records import NodeState, TaskStatus
from executors.contract import NodeContext, NodeRequest, Outcome, Success

BLOCKING = load_dag_text("""\
name: blocking
nodes:
  slow:
    type: tool_call
    tool: echo
    input: x
    timeout: 60
    retry: 0
""")

GATED = load_dag_text("""\
name: gated
nodes:
  review:
    type: human_gateway
    description: approve?
    input: x
    timeout: 3600
    on_timeout: approve
    next: done
  done: {type: tool_call, tool: echo, input: ok}
""")


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Await a condition of the store (commits wake nothing here: poll the loop)."""
    for _ in range(2000):
        if await check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def test_a_node_timeout_fires_on_the_injected_clock(tmp_path: Path) -> None:
    released = threading.Event()

    def blocks_until_cancelled(request: NodeRequest, ctx: NodeContext) -> Outcome:
        while not ctx.cancelled and not released.wait(0.01):
            pass
        return Success("finished")

    async def main() -> tuple[str, str, float]:
        clock = ManualClock()
        # A lease far longer than the timeout, a reconciler that does not pass within
        # it: only the worker's node timeout can end the run.
        async with LocalSession(AxConfig(home=tmp_path), handler=blocks_until_cancelled,
                                lease_seconds=600, reconcile_interval=10_000,
                                clock=clock) as session:
            task = await session.submit(BLOCKING, {})

            async def running() -> bool:
                snap = (await session.engine.get_task(task)).snapshots["slow"]
                return snap.state is NodeState.RUNNING

            await until(running, "the node running")
            t0 = clock.time()
            clock.advance(61)
            result = await session.wait(task, timeout=20)
            released.set()
            return result.status, result.errors.get("slow", ""), clock.time() - t0

    status, error, elapsed = asyncio.run(main())
    assert status == TaskStatus.DEAD.value
    # The handler never returned: the worker gave up at the 60 s of the injected clock.
    assert "timed out after 61.0s (timeout 60s)" in error
    assert elapsed == 61


def test_a_gate_timeout_is_decided_by_the_reconciler_on_the_injected_clock(
        tmp_path: Path) -> None:
    async def main() -> tuple[str, list[str], dict[str, str]]:
        clock = ManualClock()
        async with LocalSession(AxConfig(home=tmp_path), clock=clock,
                                reconcile_interval=2.0) as session:
            task = await session.submit(GATED, {})

            async def paused() -> bool:
                return (await session.engine.task_record(task)).status is TaskStatus.PAUSED

            await until(paused, "the gate waiting")
            clock.advance(3599)
            await asyncio.sleep(0.05)
            still = (await session.engine.task_record(task)).status
            assert still is TaskStatus.PAUSED, still  # not a second early
            clock.advance(2)  # past the bounded wait and one reconciler interval

            async def final() -> bool:
                return (await session.engine.task_record(task)).status.final

            await until(final, "the gate's default route taken and the task finished")
            result = await session.result(task)
            return result.status, list(result.path), dict(result.states)

    status, path, states = asyncio.run(main())
    assert status == TaskStatus.SUCCEEDED.value
    assert path == ["review", "done"]
    assert states == {"review": "SUCCEEDED", "done": "SUCCEEDED"}


def test_every_shape_shuts_down_the_same_way(tmp_path: Path) -> None:
    """An engine-only shape (the CLI's store commands) and an embedded shape with an
    executor both close cleanly; a second shutdown is a no-op; the executor's report
    says the stop was graceful; leadership is handed back at once."""

    async def main() -> tuple[bool, str | None, str | None]:
        config = AxConfig(home=tmp_path)
        async with AxProcess(Shape(config=config, reconcile_interval=None)) as bare:
            assert bare.reconciler is None and bare.executor is None
            await bare.engine.put_dag(GATED)
        embedded = AxProcess(Shape(config=config, reconcile_interval=0.5,
                                   executor=ExecutorSpec(concurrency=1)))
        await embedded.start()
        assert embedded.reconciler is not None
        leader_while_running = await embedded.reconciler.leader()
        report = await embedded.shutdown()
        assert await embedded.shutdown() is report
        async with AxProcess(Shape(config=config, reconcile_interval=None)) as after:
            from axengine.engine import Reconciler

            probe = Reconciler(after.engine, owner="probe")
            leader_after = await probe.leader()
        assert report is not None
        return report.graceful, leader_while_running, leader_after

    graceful, leader_while_running, leader_after = asyncio.run(main())
    assert graceful is True
    assert leader_while_running is not None and leader_while_running.startswith("w:")
    assert leader_after is None
