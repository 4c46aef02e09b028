"""A handler pauses its node (``Paused``): every clock stops — the node's timeout, its
stall window and queue timeout, and the task's deadline while the task is PAUSED — and
the node resumes by time, by a resume call or by a callback. The rules, on a controlled
clock (through the REST API: tests/api/test_resume.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from axengine.clock import ManualClock
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine._runs import claimed
from axengine.errors import Conflict, InputError
from axengine.local import LocalSession
from axengine.records import NodeState, TaskStatus
from executors.contract import NodeContext, NodeRequest, Outcome, Paused, Success
from tests.engine.rules_kit import T0, World

VENDOR = """
name: vendor
nodes:
  job:
    type: tool_call
    tool: echo
    input: x
    timeout: 60
    queue_timeout: 5
    retry: 1
    next: after
  after: {type: tool_call, tool: echo, input: y}
"""


def at(seconds: float) -> float:
    return T0 + seconds


def pause_job(world: World, *, claim_at: float, pause_at: float,
              seconds: float | None = 300.0, checkpoint: Any = None) -> None:
    assert world.claim("job", now=claim_at, lease=30).result == "claimed"
    plan = world.complete("job", Paused("vendor job queued", seconds=seconds,
                                        checkpoint=checkpoint),
                          fence=world.snaps["job"].fence, now=pause_at)
    assert plan.result == "committed"


def test_a_paused_node_gives_back_its_slot_and_spends_no_attempt() -> None:
    world = World.submit(VENDOR, now=at(8))
    pause_job(world, claim_at=at(10), pause_at=at(20), checkpoint={"job": 42})
    job = world.snaps["job"]
    assert (job.state, job.attempt, job.owner, job.lease_until) == (
        NodeState.PAUSED, 0, "", 0.0)
    assert job.evidence == "vendor job queued" and job.checkpoint == {"job": 42}
    assert (job.paused_at, job.gate_until, job.run_seconds) == (at(20), at(320), 10.0)
    assert world.events[-1].kind == "paused"
    assert world.events[-1].detail == "vendor job queued (until 1970-01-01T00:22:00+00:00)"
    assert world.task.status is TaskStatus.PAUSED and world.task.paused_at == at(20)


def test_the_node_resumes_at_its_time_and_not_a_second_before() -> None:
    world = World.submit(VENDOR, now=at(8))
    pause_job(world, claim_at=at(10), pause_at=at(20), checkpoint={"job": 42})
    assert world.expire("job", now=at(319)).result == "ok"
    assert world.snaps["job"].state is NodeState.PAUSED
    world.expire("job", now=at(320))
    job = world.snaps["job"]
    assert (job.state, job.not_before, job.paused_seconds) == (NodeState.WAITING, at(320), 300)
    assert world.kinds("job")[-1] == "resumed" and world.queue[-1] == ("job", 0.0)
    assert world.task.status is TaskStatus.RUNNING
    # The next run: the same attempt number, the checkpoint, the rest of the timeout.
    assert world.claim("job", now=at(321), lease=30).result == "claimed"
    run = claimed(world.task, world.dag.nodes["job"], world.snaps["job"], {"input": "x"})
    assert run.request is not None
    assert (run.request.attempt, run.request.checkpoint, run.timeout) == (1, {"job": 42}, 50)


def test_a_paused_node_and_its_task_survive_past_their_deadline_by_the_pause_only() -> None:
    world = World.submit(VENDOR, now=at(8), deadline=at(100))
    pause_job(world, claim_at=at(10), pause_at=at(20))      # paused 20 → 320
    world.expire("job", now=at(200))                         # past the first deadline
    assert world.snaps["job"].state is NodeState.PAUSED      # ... and alive
    world.expire("job", now=at(320))                         # resumed: deadline 400
    assert world.task.deadline == at(400) and world.task.paused_at == 0.0
    assert world.claim("job", now=at(321), lease=300).result == "claimed"
    assert world.snaps["job"].lease_until == at(400)         # a lease never outlives it
    world.expire("job", now=at(380))                         # (inside its stall window)
    assert world.snaps["job"].state is NodeState.RUNNING
    world.expire("job", now=at(400))                         # and no longer
    assert world.snaps["job"].state is NodeState.DEAD
    assert world.snaps["job"].error == "task deadline passed"


def test_queue_timeout_counts_from_the_resume() -> None:
    world = World.submit(VENDOR)
    pause_job(world, claim_at=at(1), pause_at=at(2), seconds=None)
    world.resume("job", now=at(1000), data={"status": "done"})
    assert world.claim("job", now=at(1004.9), lease=30).result == "claimed"
    world2 = World.submit(VENDOR)
    pause_job(world2, claim_at=at(1), pause_at=at(2), seconds=None)
    world2.resume("job", now=at(1000))
    assert world2.claim("job", now=at(1005.5), lease=30).result == "dead"
    assert "waited 6s for a worker" in world2.snaps["job"].error


def test_resume_by_call_hands_the_data_over_once() -> None:
    world = World.submit(VENDOR)
    pause_job(world, claim_at=at(1), pause_at=at(2), seconds=None, checkpoint={"job": 7})
    assert world.expire("job", now=at(10**6)).result == "ok"  # no time set: waits
    revision = world.snaps["job"].input_revision
    with pytest.raises(InputError, match="input revision"):
        world.resume("job", now=at(50), data={"ok": True}, input_revision="0" * 64)
    assert world.resume("job", now=at(50), data={"ok": True},
                        input_revision=revision).result == "committed"
    job = world.snaps["job"]
    assert (job.state, job.resume, job.paused_seconds) == (NodeState.WAITING, {"ok": True}, 48)
    assert world.events[-1].detail == "resumed by vendor"
    # The same callback again is harmless; another one is a conflict.
    assert world.resume("job", now=at(51), data={"ok": True}).result == "already-done"
    with pytest.raises(Conflict, match="not paused"):
        world.resume("job", now=at(51), data={"ok": False})
    world.claim("job", now=at(52), lease=30)
    world.complete("job", Success("done"), fence=world.snaps["job"].fence, now=at(53))
    assert world.snaps["job"].state is NodeState.SUCCEEDED


def test_a_gate_is_decided_not_resumed() -> None:
    world = World.submit("""
name: gate
nodes:
  g: {type: human_gateway, description: ok?, input: x, timeout: 100}
""")
    with pytest.raises(Conflict, match="approve or reject"):
        world.resume("g", now=at(1))


# ------------------------------------------- the engine, its reconciler, a manual clock


def test_the_reconciler_resumes_a_timed_pause_on_the_injected_clock(tmp_path: Path) -> None:
    """Through the embedded engine: the handler pauses for 60 s; nothing happens a second
    before; past it the reconciler resumes the node and the run gets its checkpoint."""
    runs: list[NodeRequest] = []

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        runs.append(request)
        if request.checkpoint is None:
            return Paused("rate limited by the vendor", seconds=60, checkpoint={"page": 3})
        return Success({"resumed_at_page": request.checkpoint["page"]})

    dag = load_dag_text("name: timed\nnodes:\n  n: {type: tool_call, tool: echo, input: x}\n")

    async def main() -> tuple[str, Any]:
        clock = ManualClock()
        async with LocalSession(AxConfig(home=tmp_path), handler=handler, clock=clock,
                                reconcile_interval=1.0) as session:
            task = await session.submit(dag, {})

            async def paused() -> bool:
                return (await session.engine.task_record(task)).status is TaskStatus.PAUSED

            await until(paused, "the node paused")
            clock.advance(59)
            await session.process.reconcile_once()
            assert (await session.engine.task_record(task)).status is TaskStatus.PAUSED
            assert len(runs) == 1
            clock.advance(2)
            await session.process.reconcile_once()
            result = await session.wait(task, timeout=20)
            return result.status, result.outputs.get("n")

    status, output = asyncio.run(main())
    assert (status, output) == ("SUCCEEDED", {"resumed_at_page": 3})
    assert [r.attempt for r in runs] == [1, 1]  # the pause spent no attempt


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.02)
