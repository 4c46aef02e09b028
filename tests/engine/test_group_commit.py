"""Transitions of one task that wait for its turn together commit together
(``Engine._apply_group``): decided one after another, each on what the ones before it
left, and written in one transaction under the compares of what they read before.

The property: a group is the same as applying its transitions one by one, in the order
they arrived. Two engines on two stores play the same scripts — one runs each batch of
calls concurrently (they form groups), the other awaits them one at a time — and after
every batch their answers, nodes, task records and events must be equal; the grouped
engine must never have written more transactions. Stale fences, double claims, lease
expiries and completions that also claim the next node are all in the mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, NodeState
from axengine.queue.inprocess import InProcessQueue
from axengine.store import Put, StoreWrapper, TxnResult
from executors.contract import Failure, Success
from tests.engine.conftest import FakeClock, run
from tests.engine.test_interleavings import (
    assert_finished_cleanly,
    dags,
    scenario_engine,
    value_of,
)

TOOLS = {"echo"}

#: One call of a batch: (operation, worker, which of the candidates).
CALL = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("complete"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("chain"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("fail"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("beat"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("expire"), st.just(""), st.integers(0, 7)),
)
#: A batch: the clock moves by this much, then these calls run together.
BATCH = st.tuples(st.sampled_from([0.0, 0.0, 1.0, 40.0]), st.lists(CALL, min_size=1,
                                                                       max_size=8))


def fan_out(width: int) -> Dag:
    nodes: dict[str, dict[str, object]] = {
        "n0": {"type": "tool_call", "tool": "echo", "retry": 60, "input": "{{ input.seed }}",
               "next": [f"n{i}" for i in range(1, width + 1)]}}
    for i in range(1, width + 1):
        nodes[f"n{i}"] = {"type": "tool_call", "tool": "echo", "retry": 60,
                          "input": "{{ input.seed }}", "next": f"n{width + 1}"}
    nodes[f"n{width + 1}"] = {"type": "tool_call", "tool": "echo", "retry": 60,
                              "input": "{{ input.seed }}"}
    return load_dag_mapping({"name": "fan", "nodes": nodes}, tools=TOOLS, models=set())


#: Every sibling of a fan-out of 4 claimed, then all completed at once.
ALL_SIBLINGS = [(0.0, [("claim", "A", 0)]), (0.0, [("complete", "A", 0)]),
                (0.0, [("claim", "A", i) for i in range(4)] + [("claim", "B", 0)]),
                (0.0, [("complete", "A", 0)] * 4 + [("chain", "B", 0)]),
                (40.0, [("expire", "", 0), ("claim", "B", 0), ("complete", "A", 0)])]


class Counting(StoreWrapper):
    """Counts the write transactions that committed. Each transaction first hands the
    event loop to the other callers, as a network round trip to etcd does (SQLite's
    commits do not suspend), so callers also arrive while a turn's group commits."""

    commits = 0

    async def txn(self, compares: Any, success: Any, failure: Any = ()) -> TxnResult:
        await asyncio.sleep(0)
        result = await self.inner.txn(compares, success, failure)
        if result.succeeded and any(isinstance(op, Put) for op in success):
            self.commits += 1
        return result


def _engine(base: Path) -> tuple[Engine, Counting, FakeClock]:
    engine, store, clock = scenario_engine(base)
    counting = Counting(store)
    engine._store = counting
    return engine, counting, clock


def _comparable(snap: Any) -> Any:
    return dataclasses.replace(snap, task_id="")


async def _state(engine: Engine, task: str) -> tuple[Any, ...]:
    view = await engine.get_task(task)
    events = Counter((e.kind, e.node_id, e.state, e.attempt, e.fence, e.detail)
                     for e in await engine.events(task))
    task_record = (view.task.status, view.task.counts)
    return task_record, {n: _comparable(s) for n, s in view.snapshots.items()}, events


async def _play(base: Path, dag: Dag, batches: list[tuple[float, list[Any]]],
                seed: int) -> None:
    grouped, grouped_store, grouped_clock = _engine(base / "grouped")
    alone, alone_store, alone_clock = _engine(base / "alone")
    try:
        # One task id on both stores: backoff jitter and input revisions derive from it.
        g_task = (await grouped.submit(dag, {"seed": seed}, task_id="t-1")).task_id
        a_task = (await alone.submit(dag, {"seed": seed}, task_id="t-1")).task_id
        held: dict[str, list[tuple[str, int]]] = {"A": [], "B": []}
        for advance, calls in batches:
            grouped_clock.advance(advance)
            alone_clock.advance(advance)
            view = await alone.get_task(a_task)
            live = sorted(n for n, s in view.snapshots.items()
                          if s.state in (NodeState.WAITING, NodeState.RUNNING))
            running = sorted(n for n, s in view.snapshots.items()
                             if s.state is NodeState.RUNNING)
            # The calls, made concrete on the state before the batch (the same for both).
            made: list[tuple[str, str, str, int]] = []
            for op, worker, index in calls:
                if op == "claim" and live:
                    made.append((op, worker, live[index % len(live)], 0))
                elif op in ("complete", "chain", "fail", "beat") and held[worker]:
                    node, fence = held[worker][index % len(held[worker])]
                    if op != "beat":
                        held[worker].remove((node, fence))
                    made.append((op, worker, node, fence))
                elif op == "expire" and running:
                    made.append((op, "", running[index % len(running)], 0))

            def call(engine: Engine, task: str,
                     step: tuple[str, str, str, int]) -> Awaitable[Any]:
                op, worker, node, fence = step
                if op == "claim":
                    return engine.claim(task, node, worker=worker)
                if op == "beat":
                    return engine.heartbeat(task, node, fence=fence)
                if op == "expire":
                    return engine.expire(task, node)
                if op == "fail":
                    return engine.complete(task, node, fence=fence,
                                           outcome=Failure("flaky", retryable=True))
                outcome = Success({"v": value_of(node, seed), "fence": fence})
                if op == "chain":
                    return engine.complete_and_claim(task, node, fence=fence,
                                                     outcome=outcome, worker=worker,
                                                     lanes=["default"])
                return engine.complete(task, node, fence=fence, outcome=outcome)

            before = (grouped_store.commits, alone_store.commits)
            together = await asyncio.gather(*(call(grouped, g_task, s) for s in made))
            one_by_one = [await call(alone, a_task, s) for s in made]
            assert [_answer(r) for r in together] == [_answer(r) for r in one_by_one], made
            g_state, a_state = await _state(grouped, g_task), await _state(alone, a_task)
            assert g_state == a_state, (made, _diff(g_state, a_state))
            assert (grouped_store.commits - before[0]) <= (alone_store.commits - before[1])
            for (_, worker, _, _), answer in zip(made, one_by_one, strict=True):
                for request in _claimed(answer):
                    held[worker].append((request.node_id, request.fence))
        # A healthy worker finishes the grouped task: nothing was lost.
        for _ in range(200):
            view = await grouped.get_task(g_task)
            if view.task.status.final:
                break
            waiting = [n for n, s in view.snapshots.items() if s.state is NodeState.WAITING]
            claims = await asyncio.gather(*(grouped.claim(g_task, n, worker="C")
                                            for n in waiting))
            if not any(c.request is not None for c in claims):  # backoffs, lost leases
                grouped_clock.advance(41.0)
                await asyncio.gather(*(grouped.expire(g_task, n)
                                       for n, s in view.snapshots.items()
                                       if s.state is NodeState.RUNNING))
                continue
            await asyncio.gather(*(grouped.complete(
                g_task, c.request.node_id, fence=c.request.fence,
                outcome=Success({"v": value_of(c.request.node_id, seed),
                                 "fence": c.request.fence}))
                for c in claims if c.request is not None))
        await assert_finished_cleanly(grouped, g_task, dag, seed)
    finally:
        await grouped_store.close()
        await alone_store.close()


def _diff(left: Any, right: Any) -> Any:
    """Where two states differ (for the failure message)."""
    if left[0] != right[0] or left[2] != right[2]:
        return left[0], right[0], left[2] - right[2], right[2] - left[2]
    return {n: {f.name: (getattr(s, f.name), getattr(right[1].get(n), f.name, None))
                for f in dataclasses.fields(s)
                if getattr(s, f.name) != getattr(right[1].get(n), f.name, None)}
            for n, s in left[1].items() if s != right[1].get(n)}


def _answer(result: Any) -> Any:
    """What a caller learns, without the task id (the two engines' tasks differ)."""
    if isinstance(result, str):
        return result
    if hasattr(result, "answer"):  # Completed
        nxt = result.next
        return (result.answer, None if nxt is None or nxt.request is None else
                (nxt.request.node_id, nxt.request.fence))
    request = result.request
    return (result.result, None if request is None else (request.node_id, request.fence))


def _claimed(result: Any) -> list[Any]:
    if hasattr(result, "answer"):
        nxt = result.next
        return [] if nxt is None or nxt.request is None else [nxt.request]
    if hasattr(result, "request") and result.request is not None:
        return [result.request]
    return []


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(dag=st.one_of(dags(), st.integers(2, 5).map(fan_out)),
       batches=st.lists(BATCH, min_size=2, max_size=12), seed=st.integers(0, 9))
@example(dag=fan_out(4), batches=ALL_SIBLINGS, seed=3)
def test_a_group_commits_what_its_transitions_commit_one_by_one(
        tmp_path_factory: object, dag: Dag, batches: list[tuple[float, list[Any]]],
        seed: int) -> None:
    base = Path(tmp_path_factory.mktemp("group"))  # type: ignore[attr-defined]
    run(_play(base, dag, batches, seed))


async def _fanned_out(engine: Engine, width: int) -> str:
    """A task of :func:`fan_out` whose first node committed: its siblings are waiting."""
    task = (await engine.submit(fan_out(width), {"seed": 1})).task_id
    first = await engine.claim(task, "n0", worker="w")
    assert first.request is not None
    assert await engine.complete(task, "n0", fence=first.request.fence,
                                 outcome=Success({"v": 1, "fence": 1})) == "committed"
    return task


async def _siblings_claimed(engine: Engine) -> tuple[str, list[int]]:
    """A task fanned out to eight siblings (:func:`_fanned_out`), all claimed at once:
    the task and their fences."""
    task = await _fanned_out(engine, 8)
    claims = await asyncio.gather(*(engine.claim(task, f"n{i}", worker="w")
                                    for i in range(1, 9)))
    fences = [c.request.fence for c in claims if c.request is not None]
    assert len(fences) == 8
    return task, fences


def test_siblings_completing_at_once_share_transactions(tmp_path: Path) -> None:
    async def main() -> None:
        engine, store, _ = _engine(tmp_path)
        try:
            task, fences = await _siblings_claimed(engine)
            before = store.commits
            answers = await asyncio.gather(*(engine.complete(
                task, f"n{i}", fence=fence, outcome=Success({"v": i, "fence": fence}))
                for i, fence in enumerate(fences, 1)))
            assert answers == ["committed"] * 8
            # The first to take the turn lets the others ask for it: all eight commit
            # together.
            assert store.commits - before == 1
            view = await engine.get_task(task)
            assert all(view.snapshots[f"n{i}"].state is NodeState.SUCCEEDED
                       for i in range(1, 9))
            assert view.snapshots["n9"].state is NodeState.WAITING  # the join, once
            events = await engine.events(task)
            readied = [e for e in events if e.kind == "ready" and e.node_id == "n9"]
            assert len(readied) == 1
            # One transaction's events keep the order their transitions were decided in.
            committed = [e for e in events if e.kind == "committed" and e.node_id != "n0"]
            assert len({e.seq for e in committed}) == 1
            assert [e.node_id for e in committed] == [f"n{i}" for i in range(1, 9)]
            assert view.task.counts == {"ACTIVE": 1, "SUCCEEDED": 9}
        finally:
            await store.close()

    run(main())


def test_a_group_writes_each_output_from_the_text_its_decision_hashed(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Siblings committed together: each output is encoded once, to be hashed, and
    written from that text (the group's plan keeps what its decisions made)."""
    pad = "x" * 2000
    made: list[int] = []
    original = json.JSONEncoder.encode

    def counting(self: json.JSONEncoder, value: Any) -> str:
        text = original(self, value)
        if pad in text:
            made.append(len(text))
        return text

    async def main() -> None:
        engine, store, _ = _engine(tmp_path)
        try:
            task, fences = await _siblings_claimed(engine)
            before = store.commits
            monkeypatch.setattr(json.JSONEncoder, "encode", counting)
            answers = await asyncio.gather(*(engine.complete(
                task, f"n{i}", fence=fence, outcome=Success({"v": i, "pad": pad}))
                for i, fence in enumerate(fences, 1)))
            monkeypatch.undo()
            assert answers == ["committed"] * 8 and store.commits - before == 1
            view = await engine.get_task(task)
            assert [view.snapshots[f"n{i}"].output for i in range(1, 9)] == [
                {"v": i, "pad": pad} for i in range(1, 9)]
        finally:
            await store.close()

    run(main())
    assert len(made) == 8, made


def test_a_group_that_loses_its_compare_commits_each_transition_alone(
        tmp_path: Path) -> None:
    """Another engine (another API replica) writes the task while a group is decided:
    the joined transaction fails its compare and each transition is decided again on
    fresh reads and committed alone — none is lost, none is committed twice."""

    async def main() -> None:
        engine, store, clock = scenario_engine(tmp_path)
        counting = Counting(store)
        engine._store = counting
        other = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs",
                       clock=clock, config=engine.config)
        try:
            task = await _fanned_out(engine, 3)
            claims = [await engine.claim(task, f"n{i}", worker="w") for i in (1, 2, 3)]
            requests = [c.request for c in claims if c.request is not None]
            # The other engine heartbeats n3 just before the group commits.
            inner_txn = counting.txn
            interfered = False

            async def txn(compares: Any, success: Any, failure: Any = ()) -> TxnResult:
                nonlocal interfered
                if not interfered and len(success) > 6:  # the joined transaction
                    interfered = True
                    assert await other.heartbeat(task, "n3",
                                                 fence=requests[2].fence) == "ok"
                return await inner_txn(compares, success, failure)

            counting.txn = txn  # type: ignore[method-assign]
            answers = await asyncio.gather(*(engine.complete(
                task, r.node_id, fence=r.fence,
                outcome=Success({"v": 2, "fence": r.fence})) for r in requests))
            assert interfered
            assert answers == ["committed"] * 3
            view = await engine.get_task(task)
            assert [view.snapshots[f"n{i}"].state for i in (1, 2, 3, 4)] == [
                NodeState.SUCCEEDED] * 3 + [NodeState.WAITING]
            commits = [e for e in await engine.events(task) if e.kind == "committed"]
            assert sorted(e.node_id for e in commits) == ["n0", "n1", "n2", "n3"]
        finally:
            await store.close()

    run(main())


def test_a_caller_cancelled_while_it_waits_for_the_turn_commits_nothing(
        tmp_path: Path) -> None:
    async def main() -> None:
        engine, store, _ = _engine(tmp_path)
        try:
            task = await _fanned_out(engine, 2)
            a, b = [await engine.claim(task, f"n{i}", worker="w") for i in (1, 2)]
            assert a.request is not None and b.request is not None
            async with engine._turns((task,)):  # a transition holds the turn
                first_call = asyncio.ensure_future(engine.complete(
                    task, "n1", fence=a.request.fence, outcome=Success({"v": 1, "fence": 2})))
                cancelled = asyncio.ensure_future(engine.complete(
                    task, "n2", fence=b.request.fence, outcome=Success({"v": 1, "fence": 2})))
                while len(engine._waiting.get(task, ())) < 2:  # both queue for the turn
                    await asyncio.sleep(0)
                cancelled.cancel()
            assert await first_call == "committed"
            assert cancelled.cancelled()
            view = await engine.get_task(task)
            assert view.snapshots["n1"].state is NodeState.SUCCEEDED
            assert view.snapshots["n2"].state is NodeState.RUNNING
            assert task not in engine._waiting
            # Nobody holds or waits for the turn: its lock and count are gone, and the
            # turn can be taken again.
            assert task not in engine._task_locks and task not in engine._task_users
            async with engine._turns((task,)):
                assert engine._task_users[task] == 1
        finally:
            await store.close()

    run(main())


def test_a_caller_cancelled_while_it_waits_for_a_second_turn_gives_back_the_first(
        tmp_path: Path) -> None:
    async def main() -> None:
        engine, store, _ = _engine(tmp_path)
        try:
            async with engine._turns(("b",)):  # another transition holds b's turn
                waiter = asyncio.ensure_future(_hold(engine, ("a", "b")))
                while engine._task_users.get("b") != 2:  # it holds a, waits for b
                    await asyncio.sleep(0)
                assert engine._task_locks["a"].locked()
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
                assert "a" not in engine._task_locks and engine._task_users == {"b": 1}
            assert engine._task_locks == {} and engine._task_users == {}
        finally:
            await store.close()

    run(main())


async def _hold(engine: Engine, task_ids: tuple[str, ...]) -> None:
    async with engine._turns(task_ids):
        await asyncio.sleep(3600)

