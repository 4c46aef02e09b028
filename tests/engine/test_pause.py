"""A handler pauses its node (``Paused``): every clock stops — the node's timeout, its
stall window and queue timeout, and the task's deadline while the task is PAUSED — and
the node resumes by time, by a resume call or by a callback. The rules, on a controlled
clock (through the REST API: tests/api/test_resume.py)."""

from __future__ import annotations

from typing import Any

import pytest

from axengine.engine._runs import claimed
from axengine.errors import Conflict, InputError
from axengine.records import NodeState, TaskStatus
from executors.contract import Paused, Success
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
