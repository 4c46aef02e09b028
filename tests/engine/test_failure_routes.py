"""Failure routes and admin retries through the engine shell, on the embedded store.

Regressions of two bugs the pure-rule tests pin (``test_rules.py``), checked here where
the plan is committed, the counters and status are derived and ready nodes are queued:

- a node with ``on_failure`` that fails for good through a claim or the reconciler's
  expiry (a lapsed last attempt, the ``queue_timeout``) took no route at all: its
  successors stayed PENDING and the task reported SUCCEEDED;
- a retry after a cancel left the other cancelled branches CANCELLED, so a join below
  them waited forever while the task reported SUCCEEDED.
"""

from __future__ import annotations

from collections.abc import Callable

from axengine.dag import load_dag_text
from axengine.engine import Engine, NodeState, Reconciler
from axengine.records import TaskStatus
from executors.contract import Success
from tests.engine.conftest import FakeClock, run

ROUTED = """
name: routed
nodes:
  a: {type: tool_call, tool: echo, input: x, retry: 0, queue_timeout: 50, next: b,
      on_failure: alert}
  b: {type: tool_call, tool: echo, input: b}
  alert: {type: tool_call, tool: echo, input: alert}
"""

JOIN = """
name: join
nodes:
  a: {type: tool_call, tool: echo, input: a, next: j}
  b: {type: tool_call, tool: echo, input: b, next: j}
  j: {type: tool_call, tool: echo, input: j}
"""


async def finish(engine: Engine, task_id: str, node_id: str) -> None:
    """Claim ``node_id`` and commit a success, as a healthy worker would."""
    claim = await engine.claim(task_id, node_id, worker="w9")
    assert claim.result == "claimed" and claim.request is not None, claim
    result = await engine.complete(task_id, node_id, fence=claim.request.fence,
                                   outcome=Success(node_id))
    assert result == "committed"


async def assert_routed(engine: Engine, task_id: str) -> None:
    """``a`` failed and took its on_failure route: ``alert`` is queued and runs, ``b``
    is skipped, and the task ends SUCCEEDED because the failure was handled."""
    view = await engine.get_task(task_id)
    states = {n: s.state for n, s in view.snapshots.items()}
    assert states == {"a": NodeState.FAILED, "b": NodeState.SKIPPED,
                      "alert": NodeState.WAITING}, states
    assert view.task.status is TaskStatus.RUNNING
    assert (task_id, "alert") in await engine.queue.queued()
    await finish(engine, task_id, "alert")
    assert (await engine.task_record(task_id)).status is TaskStatus.SUCCEEDED


def test_a_lease_lapsing_on_the_last_attempt_takes_the_failure_route(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    engine = make_engine(lease_seconds=30)

    async def scenario() -> None:
        task = (await engine.submit(load_dag_text(ROUTED), None)).task_id
        assert (await engine.claim(task, "a", worker="w1")).result == "claimed"
        clock.advance(31)
        report = await Reconciler(engine, owner="reconciler").run_once()
        assert (task, "a", "committed") in report.expired
        await assert_routed(engine, task)

    run(scenario())


def test_a_claim_past_the_attempt_budget_takes_the_failure_route(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    engine = make_engine(lease_seconds=30)

    async def scenario() -> None:
        task = (await engine.submit(load_dag_text(ROUTED), None)).task_id
        assert (await engine.claim(task, "a", worker="w1")).result == "claimed"
        clock.advance(31)
        assert (await engine.claim(task, "a", worker="w2")).result == "dead"
        await assert_routed(engine, task)

    run(scenario())


def test_a_claim_past_the_queue_timeout_takes_the_failure_route(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    engine = make_engine()

    async def scenario() -> None:
        task = (await engine.submit(load_dag_text(ROUTED), None)).task_id
        clock.advance(60)
        assert (await engine.claim(task, "a", worker="w1")).result == "dead"
        assert "queue_timeout" in (await engine.get_task(task)).snapshots["a"].error
        await assert_routed(engine, task)

    run(scenario())


def test_a_retry_after_a_cancel_runs_the_join_below_both_branches(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    engine = make_engine()

    async def scenario() -> None:
        task = (await engine.submit(load_dag_text(JOIN), None)).task_id
        assert await engine.cancel(task, by="ops") == "committed"
        clock.advance(1)
        assert await engine.retry(task, "a", by="ops") == "committed"
        view = await engine.get_task(task)
        assert {n: s.state for n, s in view.snapshots.items()} == {
            "a": NodeState.WAITING, "b": NodeState.WAITING, "j": NodeState.PENDING}
        assert view.task.status is TaskStatus.RUNNING
        assert {(task, "a"), (task, "b")} <= await engine.queue.queued()
        await finish(engine, task, "a")
        # The join still waits for b: the task is not done (it used to say SUCCEEDED).
        view = await engine.get_task(task)
        assert view.snapshots["j"].state is NodeState.PENDING
        assert view.task.status is TaskStatus.RUNNING
        await finish(engine, task, "b")
        await finish(engine, task, "j")
        view = await engine.get_task(task)
        assert view.task.status is TaskStatus.SUCCEEDED
        assert view.task.finished_at == clock.now
        assert {s.state for s in view.snapshots.values()} == {NodeState.SUCCEEDED}

    run(scenario())
