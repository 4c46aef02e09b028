"""The seeds' reference scenarios, through ax's own engine API.

Seed 000 (re-review queue after a model outage): lease exclusion, stale fence rejected,
duplicate commit answered already-done, revision conflict, finite retry → DEAD,
deadline → DEAD. Seed 002 (slow vendor): heartbeat is not progress; early takeover is
refused inside the progress window, allowed after it; the old owner's commit is refused
and the new owner's accepted.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from axengine.dag import load_dag_text
from axengine.engine import Engine, NodeState
from axengine.errors import Conflict
from executors.contract import Success
from tests.engine.conftest import FakeClock, run

REVIEW_DAG = """
name: rereview
nodes:
  review:
    type: llm_call
    model: moderation-v1
    prompt: "Review: {{ .input.content }}. Return one of: APPROVED, REJECTED, MANUAL"
    retry: 1          # two attempts in all, like the seed's maxAttempts=2
    timeout: 100
"""

VENDOR_DAG = """
name: vendor
nodes:
  render:
    type: tool_call
    tool: video_vendor
    input: "{{ .input.prompt }}"
    timeout: 600
    stall_timeout: 10   # the seed's takeover window
"""


def test_seed_000_reference_queue(make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    engine = make_engine(lease_seconds=100)
    dag = load_dag_text(REVIEW_DAG)
    t0 = clock.now

    async def scenario() -> None:
        def at(t: float) -> None:
            clock.now = t0 + t

        async def add(key: str, revision: str, deadline: float) -> str:
            res = await engine.submit(dag, {"content": key, "revision": revision},
                                      idempotency_key=key, deadline_seconds=deadline)
            return res.task_id

        a = await add("a", "v1", 1000)
        t1 = await engine.claim(a, "review", worker="w1")
        assert t1.result == "claimed" and t1.request.fence == 1
        at(10)
        leased = await engine.claim(a, "review", worker="w2")
        assert leased.result == "not-claimable" and leased.reason == "leased"
        at(101)
        t2 = await engine.claim(a, "review", worker="w2")
        assert t2.result == "claimed" and t2.request.fence == 2
        at(110)
        assert await engine.complete(a, "review", fence=1,
                                     outcome=Success({"text": "APPROVED"})) == "stale"
        assert await engine.complete(a, "review", fence=2,
                                     outcome=Success({"text": "MANUAL"})) == "committed"
        at(111)
        assert await engine.complete(a, "review", fence=2,
                                     outcome=Success({"text": "MANUAL"})) == "already-done"
        # The stale worker's result never landed.
        view = await engine.get_task(a)
        assert view.snapshots["review"].output == {"text": "MANUAL"}
        assert view.task.status.value == "SUCCEEDED"
        # Same id, other content: a revision conflict, and nothing stored changes.
        at(112)
        with pytest.raises(Conflict):
            await add("a", "v2", 1000)
        assert (await engine.get_task(a)).snapshots["review"].fence == 2
        # Same id, same content: the same task.
        assert (await engine.submit(dag, {"content": "a", "revision": "v1"},
                                    idempotency_key="a", deadline_seconds=1000)).task_id == a

        # Finite retry: the third claim finds the budget spent → DEAD.
        at(0)
        b = await add("b", "v1", 1000)
        assert (await engine.claim(b, "review", worker="w1")).result == "claimed"
        at(101)
        assert (await engine.claim(b, "review", worker="w2")).result == "claimed"
        at(202)
        assert (await engine.claim(b, "review", worker="w3")).result == "dead"
        view = await engine.get_task(b)
        assert view.snapshots["review"].state is NodeState.DEAD
        assert view.task.status.value == "DEAD"

        # Deadline: work past its deadline goes DEAD instead of being claimed.
        at(0)
        c = await add("c", "v1", 50)
        at(50)
        assert (await engine.claim(c, "review", worker="w1")).result == "dead"
        assert (await engine.get_task(c)).snapshots["review"].state is NodeState.DEAD

    run(scenario())


def test_seed_002_heartbeat_is_not_progress(make_engine: Callable[..., Engine],
                                            clock: FakeClock) -> None:
    engine = make_engine(lease_seconds=100)
    dag = load_dag_text(VENDOR_DAG)
    t0 = clock.now

    async def scenario() -> None:
        def at(t: float) -> None:
            clock.now = t0 + t

        task = (await engine.submit(dag, {"prompt": "a cat"})).task_id
        at(10)
        a = await engine.claim(task, "render", worker="A")
        assert a.result == "claimed" and a.request.fence == 1
        at(15)
        early = await engine.claim(task, "render", worker="B")
        assert early.result == "not-claimable", "takeover inside the progress window"
        at(19)
        assert await engine.heartbeat(task, "render", fence=1) == "ok"
        snap = (await engine.get_task(task)).snapshots["render"]
        assert snap.heartbeat_at == t0 + 19 and snap.progress_at == t0 + 10
        at(30)  # alive (heartbeats) but no progress for 20s > 10s window
        b = await engine.claim(task, "render", worker="B")
        assert b.result == "claimed" and b.request.fence == 2
        at(31)
        assert await engine.complete(task, "render", fence=1,
                                     outcome=Success({"video": "old"})) == "stale"
        assert await engine.heartbeat(task, "render", fence=1) == "stale"
        at(32)
        assert await engine.complete(task, "render", fence=2,
                                     outcome=Success({"video": "new"})) == "committed"
        view = await engine.get_task(task)
        assert view.snapshots["render"].output == {"video": "new"}
        kinds = [e.kind for e in await engine.events(task)]
        assert kinds.count("committed") == 1 and "lease_expired" in kinds

    run(scenario())


def test_queue_timeout_sends_unclaimed_work_to_dead(make_engine: Callable[..., Engine],
                                                    clock: FakeClock) -> None:
    """A ready node nobody claimed within its queue_timeout is DEAD, not run late."""
    engine = make_engine()
    dag = load_dag_text("""
name: q
nodes:
  n: {type: tool_call, tool: echo, input: x, queue_timeout: 1}
""")

    async def scenario() -> None:
        task = (await engine.submit(dag, {})).task_id
        clock.advance(5)
        assert (await engine.claim(task, "n", worker="late")).result == "dead"
        view = await engine.get_task(task)
        assert view.task.status.value == "DEAD"
        assert "queue_timeout" in view.snapshots["n"].error

    run(scenario())
