"""A run past its timeout gets a grace to save a checkpoint (``ctx.checkpoint``); the
node shows "timed out, resumable" and its next attempt — or an ``ax retry`` — gets the
checkpoint in its request. A handler that ignores the grace is abandoned. The thread
runner on the injected clock (the node-process path: tests/runners/test_subprocess.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from axengine.clock import ManualClock
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.local import LocalSession
from axengine.records import NodeState, TaskStatus
from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from tests.engine.rules_kit import T0, World

DAG = load_dag_text("name: pages\nnodes:\n  n: {type: tool_call, tool: echo, input: x, "
                    "timeout: 10, retry: 1}\n")


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.01)


def run_with(handler: Callable[[NodeRequest, NodeContext], Outcome], tmp_path: Path,
             *, grace_advance: float = 0, told: threading.Event | None = None,
             ) -> tuple[Any, list[Any]]:
    """Run DAG on a manual clock: once the first attempt runs, move the clock past its
    timeout (10 s); then, once the handler was ``told`` (it saw ``ctx.cancelled``), by
    ``grace_advance``."""
    async def main() -> tuple[Any, list[Any]]:
        clock = ManualClock()
        async with LocalSession(AxConfig(home=tmp_path), handler=handler, clock=clock,
                                reconcile_interval=3600) as session:
            task = await session.submit(DAG, {})

            async def running() -> bool:
                snap = (await session.engine.get_task(task)).snapshots["n"]
                return snap.state is NodeState.RUNNING

            await until(running, "the first attempt running")
            clock.advance(10.5)

            if told is not None:
                async def in_grace() -> bool:
                    # The runner arms the grace timer in the step that cancels the run.
                    return told.is_set()
                await until(in_grace, "the handler told its time is up")
                clock.advance(grace_advance)

            async def retried() -> bool:
                return any(e.kind == "retry" for e in await session.engine.events(task))
            await until(retried, "the first attempt timed out")
            clock.advance(5)  # past the backoff
            result = await session.wait(task, timeout=20)
            return result, await session.engine.events(task)

    return asyncio.run(main())


def test_a_handler_saves_a_checkpoint_in_its_grace_and_the_next_attempt_gets_it(
        tmp_path: Path) -> None:
    seen: list[Any] = []

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        seen.append(request.checkpoint)
        if request.checkpoint is not None:
            return Success({"resumed_at": request.checkpoint["page"]})
        page = 0
        while not ctx.cancelled:  # working until told the time is up
            page += 1
            time.sleep(0.005)
        assert ctx.checkpoint({"page": page})
        return Failure("stopping", retryable=True)

    result, events = run_with(handler, tmp_path)
    assert result.status == TaskStatus.SUCCEEDED.value
    page = seen[1]["page"]
    assert seen == [None, {"page": page}] and result.outputs["n"] == {"resumed_at": page}
    retry = next(e for e in events if e.kind == "retry")
    assert retry.detail.startswith("timed out after 10.5s (timeout 10s), resumable: the next "
                                   "run gets its checkpoint (retry in ")
    checkpoint = next(e for e in events if e.kind == "checkpoint")
    assert checkpoint.detail.startswith("saved for the next run (") and checkpoint.attempt == 1


def test_a_handler_that_ignores_the_grace_is_abandoned_and_not_resumable(
        tmp_path: Path) -> None:
    release, told = threading.Event(), threading.Event()
    attempts: list[int] = []

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        attempts.append(request.attempt)
        if request.attempt > 1:
            return Success("second")
        while not release.is_set():  # sees ctx.cancelled, and ignores it and its grace
            if ctx.cancelled:
                told.set()
            time.sleep(0.005)
        return Success("far too late")

    try:
        result, events = run_with(handler, tmp_path, grace_advance=6, told=told)
    finally:
        release.set()
    retry = next(e for e in events if e.kind == "retry")
    assert retry.detail.startswith("timed out after 10.5s (timeout 10s) (retry in ")
    assert "checkpoint" not in [e.kind for e in events]
    assert result.status == TaskStatus.SUCCEEDED.value and result.outputs["n"] == "second"
    assert attempts == [1, 2]


def test_a_stale_run_cannot_checkpoint_and_ax_retry_keeps_the_checkpoint() -> None:
    world = World.submit("name: r\nnodes:\n  n: {type: tool_call, tool: echo, input: x, "
                         "retry: 0}\n")
    world.claim("n", now=T0 + 1, lease=30)
    fence = world.snaps["n"].fence
    assert world.checkpoint("n", fence=fence, state={"page": 3}, now=T0 + 2).result == "ok"
    assert world.checkpoint("n", fence=fence + 1, state={"x": 1}, now=T0 + 2).result == "stale"
    assert world.checkpoint("n", fence=fence, state={"x": 1}, now=T0 + 40).result == "stale"
    assert world.snaps["n"].checkpoint == {"page": 3}
    world.complete("n", Failure("broken", retryable=False), fence=fence, now=T0 + 3)
    world.retry("n", now=T0 + 4)
    assert world.snaps["n"].checkpoint == {"page": 3}  # the retried run starts from it
