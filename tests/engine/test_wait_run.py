"""``wait_run``: how every runner waits for a node's run — its end, a stop, or its
timeout (moved by progress) — with a timer and futures only, on a manual clock."""

from __future__ import annotations

import asyncio

from axengine.clock import ManualClock
from axengine.worker._context import RunContext
from axengine.worker._runner import wait_run
from executors.contract import NodeRequest

REQUEST = NodeRequest(task_id="t", node_id="n", node_type="tool_call", attempt=1, fence=1,
                      config={}, input=None)


def context(clock: ManualClock) -> RunContext:
    return RunContext(loop=asyncio.get_running_loop(), engine=None,  # type: ignore[arg-type]
                      request=REQUEST, lease_seconds=30, settings={}, clock=clock)


def test_the_run_ending_a_stop_and_the_timeout_each_end_the_wait() -> None:
    async def main() -> tuple[float | None, float | None, float | None, int]:
        clock = ManualClock()
        loop = asyncio.get_running_loop()

        ended: asyncio.Future[None] = loop.create_future()
        waiting = asyncio.create_task(wait_run(context(clock), (ended,), 10, 0.0))
        await asyncio.sleep(0)
        tasks = len(asyncio.all_tasks())  # this one and main: the wait made none
        ended.set_result(None)
        by_end = await waiting

        ctx = context(clock)
        waiting = asyncio.create_task(wait_run(ctx, (loop.create_future(),), 10, 0.0))
        await asyncio.sleep(0)
        ctx.cancel()  # (from the worker: fenced out, cancelled)
        by_stop = await waiting

        ctx = context(clock)
        ctx.timeout_grace, ctx.timeout_cap = 5.0, 30.0
        started = clock.monotonic()
        waiting = asyncio.create_task(wait_run(ctx, (loop.create_future(),), 10, started))
        await asyncio.sleep(0)
        ctx.last_progress = started + 8  # progress within the last 5 s: 10 → 15
        clock.advance(10)
        await asyncio.sleep(0)
        clock.advance(5)  # no progress since 8: stopped at 15
        by_timeout = await waiting
        return by_end, by_stop, by_timeout, tasks

    by_end, by_stop, by_timeout, tasks = asyncio.run(main())
    assert (by_end, by_stop, by_timeout) == (None, None, 15.0)
    assert tasks == 2
