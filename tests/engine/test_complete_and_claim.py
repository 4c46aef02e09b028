"""The merged transaction "commit A + claim B" (``Engine.complete_and_claim``).

A worker that commits a node's outcome may claim, in the same transaction, the node its
slot runs next: a successor the commit readies, when nothing waits in that successor's
lane, or a node of the same task it took from the queue (a fan-out's next sibling). The
fence rules do not move: a stale fence commits nothing and claims nothing; a claim made
this way is a claim like any other (next fence, attempt, lease, a ``claimed`` event), so
a takeover, a lease expiry or a crash treat it as they treat a popped one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, EngineConfig, NodeState, TaskRecord
from axengine.queue import WorkItem
from axengine.queue.inprocess import InProcessQueue
from axengine.store.embedded import SqliteStore
from axengine.worker import Worker
from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from tests.engine.conftest import FakeClock, run
from tests.engine.test_interleavings import (
    OP_STEPS,
    assert_finished_cleanly,
    dags,
    scenario_engine,
    two_node_dag,
    value_of,
)

TOOLS = {"echo"}


def chain(*lanes: str) -> Dag:
    nodes: dict[str, dict[str, object]] = {}
    for i, lane in enumerate(lanes):
        nodes[f"n{i}"] = {"type": "tool_call", "tool": "echo", "input": f"x{i}",
                          "lane": lane, **({"next": f"n{i + 1}"} if i + 1 < len(lanes) else {})}
    return load_dag_mapping({"name": "chain", "nodes": nodes}, tools=TOOLS, models=set())


async def _drain(queue: InProcessQueue) -> list[WorkItem]:
    """Pop and ack everything queued now (a worker taking the queue's items)."""
    items = []
    while (item := await queue.pop("drain", lanes=("fast", "default"), timeout=0)) is not None:
        await queue.ack("drain", item)
        items.append(item)
    return items


def test_a_completion_claims_its_successor_in_the_same_transaction(
        make_engine: Callable[..., Engine]) -> None:
    async def main() -> None:
        engine = make_engine()
        queue = engine.queue
        assert isinstance(queue, InProcessQueue)
        task = (await engine.submit(chain("default", "default", "default"), {})).task_id
        assert [i.node_id for i in await _drain(queue)] == ["n0"]
        first = await engine.claim(task, "n0", worker="w1")
        assert first.request is not None
        revision = await engine._store.revision()
        done = await engine.complete_and_claim(task, "n0", fence=first.request.fence,
                                               outcome=Success("a"), worker="w1",
                                               lanes=["default"])
        assert done.answer == "committed"
        assert await engine._store.revision() == revision + 1  # one transaction
        assert done.next is not None and done.next.request is not None
        assert (done.next.request.node_id, done.next.request.fence) == ("n1", 1)
        assert done.next.request.input == "x1"
        assert done.snapshot is not None and done.snapshot.state is NodeState.SUCCEEDED
        view = await engine.get_task(task)
        n1 = view.snapshots["n1"]
        assert (n1.state, n1.owner, n1.fence, n1.attempt) == (NodeState.RUNNING, "w1", 1, 1)
        assert await queue.depth("default") == 0  # it skipped the queue
        kinds = [(e.kind, e.node_id) for e in await engine.events(task)]
        assert kinds[-3:] == [("committed", "n0"), ("ready", "n1"), ("claimed", "n1")]

    run(main())


def test_a_stale_fence_commits_nothing_and_claims_nothing(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    async def main() -> None:
        engine = make_engine(lease_seconds=10)
        task = (await engine.submit(chain("default", "default"), {})).task_id
        old = await engine.claim(task, "n0", worker="w1")
        clock.advance(11)  # w1's lease lapses; w2 takes the node over
        new = await engine.claim(task, "n0", worker="w2")
        assert old.request is not None and new.request is not None
        await _drain(engine.queue)  # type: ignore[arg-type]
        revision = await engine._store.revision()
        done = await engine.complete_and_claim(task, "n0", fence=old.request.fence,
                                               outcome=Success("late"), worker="w1",
                                               lanes=["default"])
        assert (done.answer, done.next) == ("stale", None)
        assert await engine._store.revision() == revision
        view = await engine.get_task(task)
        assert view.snapshots["n1"].state is NodeState.PENDING
        assert view.snapshots["n0"].owner == "w2"

    run(main())


def test_a_node_in_another_lane_goes_through_the_queue(
        make_engine: Callable[..., Engine]) -> None:
    async def main() -> None:
        engine = make_engine()
        queue = engine.queue
        assert isinstance(queue, InProcessQueue)
        task = (await engine.submit(chain("default", "fast"), {})).task_id
        await _drain(queue)
        claim = await engine.claim(task, "n0", worker="w1")
        assert claim.request is not None
        # n1 is in the fast lane; this slot serves the default lane only.
        done = await engine.complete_and_claim(task, "n0", fence=claim.request.fence,
                                               outcome=Success("a"), worker="w1",
                                               lanes=["default"])
        assert (done.answer, done.next) == ("committed", None)
        assert [(i.node_id, i.lane) for i in await _drain(queue)] == [("n1", "fast")]

    run(main())


def test_a_worker_goes_on_with_a_chain_only_when_nothing_waits_in_its_lane(
        make_engine: Callable[..., Engine]) -> None:
    """One slot. Alone, a chain runs on one pop; with another task's node queued in the
    lane while the first node runs, the successor queues behind it (no overtaking)."""
    async def main() -> None:
        engine = make_engine()
        queue = engine.queue
        assert isinstance(queue, InProcessQueue)
        ran: list[tuple[str, str]] = []
        names: dict[str, str] = {}
        later = asyncio.Event()

        def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
            ran.append((names.get(request.task_id, "?"), request.node_id))
            if later.is_set() and len(ran) == 1:
                # The other task is submitted while this first node runs.
                asyncio.run_coroutine_threadsafe(submit_other(), loop).result()
            return Success(request.input)

        loop = asyncio.get_running_loop()
        finished: dict[str, asyncio.Event] = {}

        def on_commit(task: TaskRecord, events: object) -> None:
            if task.status.final and task.task_id in finished:
                finished[task.task_id].set()

        engine.add_listener(on_commit)

        async def submit(dag: Dag, name: str) -> str:
            task = (await engine.submit(dag, {})).task_id
            names[task], finished[task] = name, asyncio.Event()
            return task

        async def submit_other() -> None:
            await submit(chain("default"), "other")

        stop = asyncio.Event()
        worker = Worker(engine=engine, queue=queue, handler=handler, worker_id="w",
                        concurrency=1, poll_timeout=5)
        serving = asyncio.create_task(worker.run(stop))
        try:
            alone = await submit(chain("default", "default", "default"), "alone")
            await finished[alone].wait()
            assert ran == [("alone", "n0"), ("alone", "n1"), ("alone", "n2")]
            # n1 and n2 were claimed by the commits of their predecessors (same time).
            at = {(e.kind, e.node_id): e.at for e in await engine.events(alone)}
            assert at[("claimed", "n1")] == at[("committed", "n0")]
            assert at[("claimed", "n2")] == at[("committed", "n1")]
            ran.clear()
            later.set()
            first = await submit(chain("default", "default"), "first")
            await finished[first].wait()
            await asyncio.gather(*(e.wait() for e in finished.values()))
            assert ran == [("first", "n0"), ("other", "n0"), ("first", "n1")]
        finally:
            stop.set()
            await serving

    run(main())


def fan_out(width: int) -> Dag:
    nodes: dict[str, dict[str, object]] = {
        "start": {"type": "tool_call", "tool": "echo", "input": "s",
                  "next": [f"s{i}" for i in range(width)]}}
    for i in range(width):
        nodes[f"s{i}"] = {"type": "tool_call", "tool": "echo", "input": f"x{i}",
                          "next": "join"}
    nodes["join"] = {"type": "tool_call", "tool": "echo", "input": "j"}
    return load_dag_mapping({"name": "fan", "nodes": nodes}, tools=TOOLS, models=set())


@pytest.mark.parametrize("other_task", [False, True])
def test_a_slot_claims_the_queued_node_it_takes_next_in_the_completion(
        make_engine: Callable[..., Engine], other_task: bool) -> None:
    """One slot runs a fan-out of 5. Each sibling's completion takes the next queued
    sibling from the queue and claims it in its own transaction: the whole task costs
    one transaction per node (+ the submit and the first claim), in queue order. With
    another task's node queued while ``start`` runs, the slot takes that one next, also
    claimed by the completion before it, and the siblings queued behind it wait. Each
    item taken that way is acknowledged by the push after the commit that claimed it,
    in the same queue call: no ack call of its own."""
    async def main() -> None:
        engine = make_engine()
        queue = engine.queue
        assert isinstance(queue, InProcessQueue)
        ran: list[str] = []
        pushes: list[tuple[list[str], list[str]]] = []  # (items pushed, items acked)
        acks: list[str] = []  # items acked alone
        enqueue, ack = queue.enqueue, queue.ack

        def name(item: WorkItem) -> str:
            return f"{item.task_id[-2:]}:{item.node_id}"

        async def counted_enqueue(items: Any, *, delay: float = 0.0,
                                  acks: Any = ()) -> None:
            pushes.append(([name(i) for i in items], [name(i) for _, i in acks]))
            await enqueue(items, delay=delay, acks=acks)

        async def counted_ack(worker_id: str, item: WorkItem) -> None:
            acks.append(name(item))
            await ack(worker_id, item)

        queue.enqueue, queue.ack = counted_enqueue, counted_ack  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        done: dict[str, asyncio.Event] = {}

        def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
            ran.append(f"{request.task_id[-2:]}:{request.node_id}")
            if other_task and request.node_id == "start":
                asyncio.run_coroutine_threadsafe(submit(chain("default"), "o"),
                                                 loop).result()
            return Success(request.input)

        def on_commit(task: TaskRecord, events: object) -> None:
            if task.status.final:
                done[task.task_id].set()

        async def submit(dag: Dag, tail: str) -> str:
            task = (await engine.submit(dag, {}, task_id=f"task-{tail}")).task_id
            done[task] = asyncio.Event()
            return task

        engine.add_listener(on_commit)
        stop = asyncio.Event()
        worker = Worker(engine=engine, queue=queue, handler=handler, worker_id="w",
                        concurrency=1, poll_timeout=5)
        revision = await engine._store.revision()
        serving = asyncio.create_task(worker.run(stop))
        try:
            task = await submit(fan_out(5), "f")
            await asyncio.gather(*(e.wait() for e in done.values()))
        finally:
            stop.set()
            await serving
        siblings = [f"-f:s{i}" for i in range(5)]
        # The other task's node, queued while start ran, runs before s0..s4.
        assert ran == ["-f:start", *(["-o:n0"] if other_task else []), *siblings, "-f:join"]
        # The submits, the claim of start, then one transaction per completion: each
        # claims the node the slot runs next (s0 readied or o:n0 queued, then the
        # queued siblings, and the join readied), whichever task it belongs to.
        assert await engine._store.revision() == revision + len(done) + 1 + len(ran)
        kinds = [(e.kind, e.node_id) for e in await engine.events(task)]
        assert kinds.count(("claimed", "s3")) == 1
        at = kinds.index(("claimed", "s3"))
        assert kinds[at - 1] == ("committed", "s2")  # written by s2's transaction
        assert await queue.depth("default") == 0
        # Only the item the serving loop popped (start) is acked alone, once it ran;
        # every item a completion took and claimed is acked with that commit's push.
        assert acks == ["-f:start"]
        if other_task:  # start's commit readies s0-s4 and claims o:n0, o:n0's takes s0
            assert pushes[2:] == [(siblings, ["-o:n0"]), *(([], [s]) for s in siblings)]
        else:  # start's commit readies s1-s4 behind s0, which it claims
            assert pushes[1:] == [(siblings[1:], []), *(([], [s]) for s in siblings[1:])]
        assert await queue.queued() == set()  # no item left in the worker's hands

    run(main())


def test_a_failure_or_a_retry_claims_nothing(make_engine: Callable[..., Engine]) -> None:
    async def main() -> None:
        engine = make_engine()
        task = (await engine.submit(chain("default", "default"), {})).task_id
        await _drain(engine.queue)  # type: ignore[arg-type]
        claim = await engine.claim(task, "n0", worker="w1")
        assert claim.request is not None
        done = await engine.complete_and_claim(task, "n0", fence=claim.request.fence,
                                               outcome=Failure("flaky", retryable=True),
                                               worker="w1", lanes=["default"])
        assert (done.answer, done.next) == ("committed", None)
        view = await engine.get_task(task)
        assert view.snapshots["n0"].state is NodeState.WAITING  # backing off, queued
        assert view.snapshots["n1"].state is NodeState.PENDING

    run(main())


# --------------------------------------------------------------------- property

#: The interleaving test's steps, plus a worker taking everything queued (a completion
#: only claims in a lane with nothing waiting).
ops = st.lists(st.one_of(*OP_STEPS, st.tuples(st.just("drain"), st.just(""), st.just(0))),
               min_size=4, max_size=40)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(dag=dags(), script=ops, seed=st.integers(0, 9))
# A stale worker completes after a takeover (nothing written, nothing claimed), then the
# new holder's completion claims the successor.
@example(dag=two_node_dag(), script=[("claim", "A", 0), ("advance", 40.0, 0),
                                     ("claim", "B", 0), ("drain", "", 0),
                                     ("complete", "A", 0), ("complete", "B", 0)], seed=3)
def test_merged_commit_and_claim_keeps_the_fence_rules(
        tmp_path_factory: object, dag: Dag, script: list[tuple[str, object, object]],
        seed: int) -> None:
    """Two workers complete with ``complete_and_claim`` under random interleavings,
    takeovers, lease expiries and crashes. After every call: a stale fence wrote nothing
    (the store revision did not move) and claimed nothing; a committed call wrote one
    transaction; a claimed node is RUNNING for the caller under the fence handed back,
    one more than its last, and is the node named when one was. At the end a healthy
    worker drains the task and it ends as the interleaving test requires
    (:func:`assert_finished_cleanly`)."""
    base = Path(tmp_path_factory.mktemp("merged"))  # type: ignore[attr-defined]
    asyncio.run(_scenario(base, dag, script, seed, tasks=1))


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(dag=dags(), script=ops, seed=st.integers(0, 9))
def test_merged_commit_and_claim_across_two_tasks_keeps_the_fence_rules(
        tmp_path_factory: object, dag: Dag, script: list[tuple[str, object, object]],
        seed: int) -> None:
    """The same with two tasks: a completion may name a waiting node of either task
    (a worker whose next queue item belongs to another task), and the two decisions
    commit in one transaction or not at all."""
    base = Path(tmp_path_factory.mktemp("merged2"))  # type: ignore[attr-defined]
    asyncio.run(_scenario(base, dag, script, seed, tasks=2))


async def _scenario(base: Path, dag: Dag, script: list[tuple[str, object, object]],
                    seed: int, *, tasks: int) -> None:
    engine, store, clock = scenario_engine(base)
    queue = engine.queue
    assert isinstance(queue, InProcessQueue)
    try:
        ids = [(await engine.submit(dag, {"seed": seed})).task_id for _ in range(tasks)]
        held: dict[str, list[tuple[str, str, int]]] = {"A": [], "B": []}
        fences: dict[tuple[str, str], int] = {}

        async def snapshots() -> dict[tuple[str, str], Any]:
            return {(task, node): snap for task in ids
                    for node, snap in (await engine.get_task(task)).snapshots.items()}

        for op, who, idx in script:
            worker, index = str(who), int(idx)  # type: ignore[call-overload]
            if op == "claim":
                snaps = await snapshots()
                candidates = sorted(k for k, s in snaps.items()
                                    if s.state in (NodeState.WAITING, NodeState.RUNNING))
                if candidates:
                    task, node = candidates[index % len(candidates)]
                    res = await engine.claim(task, node, worker=worker)
                    if res.result == "claimed":
                        assert res.request is not None
                        held[worker].append((task, node, res.request.fence))
            elif op in ("complete", "fail") and held[worker]:
                task, node, fence = held[worker].pop(index % len(held[worker]))
                outcome = (Success({"v": value_of(node, seed), "fence": fence})
                           if op == "complete" else Failure("flaky", retryable=True))
                before = await snapshots()
                revision = await store.revision()
                # An odd index: the worker took a waiting node from the queue to run
                # next (of either task; the queue may hold stale items too) and names
                # it; an even one: it may take a node the completion readies.
                waiting = sorted(k for k, s in before.items() if s.state is NodeState.WAITING)
                named = waiting[index % len(waiting)] if index % 2 and waiting else ("", "")
                done = await engine.complete_and_claim(
                    task, node, fence=fence, outcome=outcome, worker=worker,
                    lanes=["default"], claim_task=named[0], claim_node=named[1])
                if done.answer != "committed":
                    assert done.next is None, done
                    assert await store.revision() == revision, "a stale call wrote"
                    continue
                assert await store.revision() == revision + 1  # one transaction
                if done.next is None:
                    continue
                request = done.next.request
                assert request is not None
                claimed = (request.task_id, request.node_id)
                if named[1]:
                    assert claimed == named, "claimed another node than the one named"
                else:
                    assert claimed[0] == task  # a node the completion readied
                after = (await engine.get_task(claimed[0])).snapshots[claimed[1]]
                assert before[claimed].state in (NodeState.PENDING, NodeState.WAITING)
                assert (after.state, after.owner, after.fence) == (
                    NodeState.RUNNING, worker, request.fence)
                assert request.fence == before[claimed].fence + 1
                assert request.fence > fences.get(claimed, 0)
                fences[claimed] = request.fence
                held[worker].append((*claimed, request.fence))
            elif op == "drain":
                await _drain(queue)
            elif op == "advance":
                clock.advance(float(who))  # type: ignore[arg-type]
            elif op == "crash":
                held[worker].clear()
            elif op == "expire":
                for (task, node), snap in (await snapshots()).items():
                    if snap.state is NodeState.RUNNING:
                        await engine.expire(task, node)

        for task in ids:
            await _drain_task(engine, queue, clock, task, seed)
            await assert_finished_cleanly(engine, task, dag, seed)
    finally:
        await store.close()


async def _drain_task(engine: Engine, queue: InProcessQueue, clock: FakeClock, task: str,
                      seed: int) -> None:
    """Run ``task`` to its end with a healthy worker that also chains: nothing may be
    lost."""
    for _ in range(500):
        view = await engine.get_task(task)
        if view.task.status.final:
            return
        progressed = False
        for node, snap in view.snapshots.items():
            if snap.state is not NodeState.WAITING:
                continue
            res = await engine.claim(task, node, worker="C")
            while res is not None and res.result == "claimed":
                assert res.request is not None
                current = res.request
                await _drain(queue)
                done = await engine.complete_and_claim(
                    task, current.node_id, fence=current.fence, outcome=Success(
                        {"v": value_of(current.node_id, seed), "fence": current.fence}),
                    worker="C", lanes=["default"])
                progressed = True
                res = done.next
        if not progressed:
            clock.advance(31.0)
            for node, snap in view.snapshots.items():
                if snap.state is NodeState.RUNNING:
                    await engine.expire(task, node)


# --------------------------------------------------------------------- the cache


def test_an_engine_never_answers_from_what_another_engine_changed(
        tmp_path: Path, clock: FakeClock) -> None:
    """Two engines on one store (two API replicas): each caches what it wrote. A
    takeover through the second leaves the first's cache behind; the first must still
    answer the new holder's calls right — a write-less answer (``stale``) is re-decided
    on fresh reads, a write fails its compare and is re-decided."""
    async def main() -> None:
        store = SqliteStore(path=tmp_path / "ax.db")
        one, two = (Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "b",
                           clock=clock, config=EngineConfig(lease_seconds=10))
                    for _ in range(2))
        try:
            task = (await one.submit(chain("default", "default"), {})).task_id
            old = await one.claim(task, "n0", worker="w1")
            clock.advance(11)
            new = await two.claim(task, "n0", worker="w2")  # one's cache still has fence 1
            assert old.request is not None and new.request is not None
            assert new.request.fence == old.request.fence + 1
            # The old holder is stale, whichever engine it asks.
            assert await one.heartbeat(task, "n0", fence=old.request.fence) == "stale"
            # The new holder is current through the engine whose cache says otherwise.
            assert await one.heartbeat(task, "n0", fence=new.request.fence) == "ok"
            done = await one.complete_and_claim(task, "n0", fence=new.request.fence,
                                                outcome=Success("v"), worker="w2",
                                                lanes=["default"])
            assert done.answer == "committed"
            view = await two.get_task(task)
            assert view.snapshots["n0"].output == "v"
            assert view.snapshots["n0"].fence == new.request.fence
            # And the engine that wrote nothing of it since answers from fresh state.
            assert await two.complete(task, "n0", fence=new.request.fence,
                                      outcome=Success("v")) == "already-done"
        finally:
            await store.close()

    run(main())


def test_the_record_cache_is_bounded_and_never_goes_back() -> None:
    from axengine.engine._cache import RecordCache

    cache = RecordCache(max_bytes=100)
    cache.put("a", 5, "A5", 40)
    cache.put("a", 3, "A3", 40)  # an older read arriving late does not win
    assert cache.get("a") == (5, "A5")
    cache.put("b", 1, "B", 40)
    cache.get("a")  # a is now the most recently used
    cache.put("c", 1, "C", 40)  # 120 bytes: b, the least recently used, goes
    assert (cache.get("b"), len(cache)) == (None, 2)
    cache.put("huge", 1, "H", 101)  # larger than the bound: not kept
    assert cache.get("huge") is None
    counted = RecordCache(max_bytes=10**6, max_entries=2)
    for key in "xyz":
        counted.put(key, 1, key.upper(), 1)
    assert (counted.get("x"), len(counted)) == (None, 2)  # the count bound holds too
    cache.drop(["a", "missing"])
    assert cache.get("a") is None and cache.get("c") == (1, "C")


def test_a_fan_out_wider_than_the_cache_keeps_the_branches_served_first(
        make_engine: Callable[..., Engine]) -> None:
    """One transaction that readies more nodes than the record cache holds keeps those
    it wrote first: the queue serves them first, so their claims find them cached."""
    from axengine.engine._cache import RecordCache

    async def main() -> None:
        engine = make_engine()
        engine._cache = RecordCache(max_entries=6)
        branches = [f"b{i}" for i in range(10)]
        dag = load_dag_mapping({"name": "wide", "nodes": {
            "src": {"type": "tool_call", "tool": "echo", "input": "s", "next": branches},
            **{b: {"type": "tool_call", "tool": "echo", "input": b} for b in branches}}},
            tools=TOOLS, models=set())
        task = (await engine.submit(dag, {})).task_id
        await _drain(engine.queue)  # type: ignore[arg-type]
        first = await engine.claim(task, "src", worker="w1")
        assert first.request is not None
        await engine.complete(task, "src", fence=first.request.fence, outcome=Success("s"))
        served = [i.node_id for i in await _drain(engine.queue)]  # type: ignore[arg-type]
        assert served == branches
        cached = {key.rsplit("/", 1)[-1] for key in engine._cache._entries}
        assert {"b0", "b1", "b2", "b3"} <= cached and "b9" not in cached, cached

    run(main())


def test_two_transitions_join_only_within_the_stores_limits() -> None:
    """A completion and another task's claim go in one transaction only when they write
    no key in common and the joined compares and writes fit the store's max_txn_ops."""
    from axengine.engine._shell import _Txn
    from axengine.store import Mod, Put

    def txn(*keys: str) -> _Txn:
        return _Txn([Mod(k) == 1 for k in keys], [Put(k, b"v") for k in keys], [], [])

    joined = txn("a", "b").join(txn("c"), None)
    assert joined is not None and [op.key for op in joined.ops] == ["a", "b", "c"]
    assert len(joined.compares) == 3
    assert txn("a", "b").join(txn("b"), None) is None  # a key written twice
    assert txn("a", "b").join(txn("c"), 3) is not None
    assert txn("a", "b").join(txn("c"), 2) is None  # three writes, the store takes two
