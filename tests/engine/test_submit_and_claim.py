"""The merged transaction "submit + claim the first node" (``Engine.submit`` with ``claim_for``).

An embedded session's worker with a slot free and nothing queued claims a new task's
first node in the submit's own transaction (``Worker.submit``), as a completion claims
its successor (``complete_and_claim``). The claim is a claim like any other: next fence,
attempt, lease and a ``claimed`` event, under the same rules (lanes, deadline, ramps),
so a lease expiry or a takeover treats it as it treats a popped one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, NodeState
from axengine.engine._ramp import Ramp, encode_ramp
from axengine.errors import Conflict
from axengine.queue.inprocess import InProcessQueue
from axengine.store import Put
from axengine.store.embedded import SqliteStore
from axengine.worker import Worker
from executors.contract import NodeContext, NodeRequest, Outcome, Success
from tests.engine.conftest import FakeClock, run
from tests.engine.test_complete_and_claim import _drain, chain

TOOLS = {"echo"}


def test_a_submit_claims_the_first_node_in_its_own_transaction(
        make_engine: Callable[..., Engine]) -> None:
    async def main() -> None:
        engine = make_engine()
        revision = await engine._store.revision()
        sub = await engine.submit(chain("default", "default"), {"k": 1},
                                  claim_for="w1", claim_lanes=["default"])
        assert sub.created
        assert await engine._store.revision() == revision + 1  # one transaction
        assert sub.next is not None and sub.next.request is not None
        assert (sub.next.request.node_id, sub.next.request.fence) == ("n0", 1)
        assert sub.next.request.input == "x0"
        n0 = (await engine.get_task(sub.task_id)).snapshots["n0"]
        assert (n0.state, n0.owner, n0.fence, n0.attempt) == (NodeState.RUNNING, "w1", 1, 1)
        assert await _drain(engine.queue) == []  # type: ignore[arg-type]  # no queue trip
        kinds = [(e.kind, e.node_id) for e in await engine.events(sub.task_id)]
        assert kinds == [("submitted", ""), ("ready", "n0"), ("claimed", "n0")]

    run(main())


def test_an_entry_node_in_another_lane_goes_through_the_queue(
        make_engine: Callable[..., Engine]) -> None:
    async def main() -> None:
        engine = make_engine()
        sub = await engine.submit(chain("fast", "default"), {}, claim_for="w1",
                                  claim_lanes=["default"])
        assert sub.created and sub.next is None
        assert [(i.node_id, i.lane) for i in await _drain(engine.queue)  # type: ignore[arg-type]
                ] == [("n0", "fast")]
        n0 = (await engine.get_task(sub.task_id)).snapshots["n0"]
        assert (n0.state, n0.fence) == (NodeState.WAITING, 0)

    run(main())


def test_a_resubmit_or_a_taken_task_id_claims_nothing(
        make_engine: Callable[..., Engine]) -> None:
    async def main() -> None:
        engine = make_engine()
        dag = chain("default")
        first = await engine.submit(dag, {}, claim_for="w1", claim_lanes=["default"],
                                    idempotency_key="once")
        assert first.next is not None
        again = await engine.submit(dag, {}, claim_for="w2", claim_lanes=["default"],
                                    idempotency_key="once")
        assert (again.task_id, again.created, again.next) == (first.task_id, False, None)
        revision = await engine._store.revision()
        with pytest.raises(Conflict, match="already exists"):
            await engine.submit(dag, {}, claim_for="w2", claim_lanes=["default"],
                                task_id=first.task_id)
        assert await engine._store.revision() == revision
        n0 = (await engine.get_task(first.task_id)).snapshots["n0"]
        assert (n0.owner, n0.fence) == ("w1", 1)

    run(main())


def test_a_claim_made_at_submit_is_fenced_like_any_other(
        make_engine: Callable[..., Engine], clock: FakeClock) -> None:
    """w1's lease lapses and w2 takes the node over: w1's late outcome commits nothing
    and claims nothing."""
    async def main() -> None:
        engine = make_engine(lease_seconds=10)
        sub = await engine.submit(chain("default", "default"), {}, claim_for="w1",
                                  claim_lanes=["default"])
        assert sub.next is not None and sub.next.request is not None
        clock.advance(11)
        takeover = await engine.claim(sub.task_id, "n0", worker="w2")
        assert takeover.request is not None and takeover.request.fence == 2
        revision = await engine._store.revision()
        done = await engine.complete_and_claim(sub.task_id, "n0",
                                               fence=sub.next.request.fence,
                                               outcome=Success("late"), worker="w1",
                                               lanes=["default"])
        assert (done.answer, done.next) == ("stale", None)
        assert await engine._store.revision() == revision
        view = await engine.get_task(sub.task_id)
        assert view.snapshots["n0"].owner == "w2"
        assert view.snapshots["n1"].state is NodeState.PENDING

    run(main())


def test_a_ramp_that_changed_since_the_cache_read_leaves_the_node_queued(
        make_engine: Callable[..., Engine]) -> None:
    """The claim reads its dependency's ramp from the engine's cache under a compare:
    when an outage began meanwhile (another engine wrote the ramp), the claim is not
    made and the task is stored all the same, its first node queued."""
    async def main() -> None:
        engine = make_engine()
        dag = chain("default")
        warm = await engine.submit(dag, {}, claim_for="w1", claim_lanes=["default"])
        assert warm.next is not None  # the cache now holds "no ramp" for tool:echo
        await engine._store.txn([], [Put(engine._keys.ramp("tool:echo"),
                                         encode_ramp(Ramp(limit=1, since=1.0)))])
        sub = await engine.submit(dag, {}, claim_for="w1", claim_lanes=["default"])
        assert sub.created and sub.next is None
        assert [i.node_id for i in await _drain(engine.queue)  # type: ignore[arg-type]
                ] == ["n0"]
        n0 = (await engine.get_task(sub.task_id)).snapshots["n0"]
        assert (n0.state, n0.fence) == (NodeState.WAITING, 0)

    run(main())


def _echo(request: NodeRequest, ctx: NodeContext) -> Outcome:
    return Success(request.input)


def _parts(tmp_path: Path, concurrency: int = 4
           ) -> tuple[SqliteStore, InProcessQueue, Engine, Worker]:
    """A store, queue, engine and a worker ``w1`` (not started) on them."""
    store = SqliteStore(path=tmp_path / "ax.db")
    queue = InProcessQueue()
    engine = Engine(store=store, queue=queue, blob_dir=tmp_path / "blobs")
    worker = Worker(engine=engine, queue=queue, handler=_echo, worker_id="w1",
                    concurrency=concurrency, poll_timeout=5.0)
    return store, queue, engine, worker


async def _until_polling(worker: Worker) -> None:
    """Until the started worker's loop waits in a pop: a slot is free, nothing queued."""
    while not worker._polling:
        await asyncio.sleep(0)


@pytest.mark.parametrize(("concurrency", "merged"), [(4, True), (1, False)])
def test_a_serving_worker_runs_the_first_node_without_the_queue(
        tmp_path: Path, concurrency: int, merged: bool) -> None:
    """A 3-node chain through ``Worker.submit``: with a slot free besides the one
    waiting in a pop, four write transactions (submit + claim n0, then one per
    completion); with a single slot (it waits in the pop), the plain five."""
    async def main() -> None:
        store, _, engine, worker = _parts(tmp_path, concurrency)
        finished: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def on_commit(task: object, events: object) -> None:
            status = getattr(task, "status", None)
            if status is not None and status.final and not finished.done():
                finished.set_result(status.value)

        engine.add_listener(on_commit)
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.run(stop))
        try:
            await _until_polling(worker)
            dag: Dag = load_dag_mapping(
                {"name": "c3", "nodes": {
                    "a": {"type": "tool_call", "tool": "echo", "input": "1", "next": "b"},
                    "b": {"type": "tool_call", "tool": "echo", "input": "2", "next": "c"},
                    "c": {"type": "tool_call", "tool": "echo", "input": "3"}}},
                tools=TOOLS, models=set())
            before = await store.revision()
            sub = await worker.submit(dag, {})
            assert (sub.next is not None) is merged
            assert await finished == "SUCCEEDED"
            assert await store.revision() - before == (4 if merged else 5)
            view = await engine.get_task(sub.task_id)
            assert {n: s.fence for n, s in view.snapshots.items()} == {"a": 1, "b": 1, "c": 1}
        finally:
            stop.set()
            await serving
            await store.close()

    run(main())


def test_a_worker_that_does_not_serve_submits_plainly(tmp_path: Path) -> None:
    """Not started yet, or stopped: the first node goes to the queue unclaimed."""
    async def main() -> None:
        store, queue, engine, worker = _parts(tmp_path)
        subs = [await worker.submit(chain("default"), {})]
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.run(stop))
        await _until_polling(worker)
        stop.set()
        await serving
        subs.append(await worker.submit(chain("default"), {}))
        assert [s.next for s in subs] == [None, None]
        late = (await engine.get_task(subs[1].task_id)).snapshots["n0"]
        assert (late.state, late.fence) == (NodeState.WAITING, 0)
        assert [i.task_id for i in await _drain(queue)] == [subs[1].task_id]
        await store.close()

    run(main())


def test_a_stop_during_a_claiming_submit_waits_for_the_node_it_claimed(
        tmp_path: Path) -> None:
    """The stop comes while the submit's transaction is in flight: the worker's run does
    not end before the slot it hands the claimed node to has run it."""
    async def main() -> None:
        store, _, engine, worker = _parts(tmp_path)
        stop = asyncio.Event()
        real_submit = engine.submit
        serving: asyncio.Task[None]

        async def submit_then_stop(*args: Any, **kwargs: Any) -> Any:
            result = await real_submit(*args, **kwargs)
            stop.set()
            # Give the stopping run every chance to end (it has nothing else to wait
            # for): only the submit in flight may hold it.
            for _ in range(200):
                if serving.done():
                    break
                await asyncio.sleep(0)
            return result

        engine.submit = submit_then_stop  # type: ignore[method-assign]
        serving = asyncio.create_task(worker.run(stop))
        await _until_polling(worker)
        sub = await worker.submit(chain("default"), {})
        assert sub.next is not None
        await serving
        n0 = (await engine.get_task(sub.task_id)).snapshots["n0"]
        assert (n0.state, n0.fence) == (NodeState.SUCCEEDED, 1)
        await store.close()

    run(main())


class _TakingEngine:
    """The in-process engine with a ``take``, as an executor's API client has one: a Take
    waits for a claim the test makes for it (``hand``), as a submit at the API would."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.waiting = 0
        self._claims: asyncio.Queue[Any] = asyncio.Queue()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def take(self, *, worker: str, lanes: Any, wait_seconds: float,
                   lease_seconds: float | None = None) -> Any:
        self.waiting += 1
        try:
            return await asyncio.wait_for(self._claims.get(), wait_seconds)
        except TimeoutError:
            return None
        finally:
            self.waiting -= 1

    async def hand(self, dag: Dag, worker: str) -> str:
        """Submit ``dag`` claiming its first node for ``worker``; answer the Take."""
        sub = await self.engine.submit(dag, {}, claim_for=worker, claim_lanes=["default"])
        assert sub.next is not None
        self._claims.put_nowait(sub.next)
        return sub.task_id


def test_a_worker_runs_what_its_take_brings_even_with_every_slot_filled_since(
        tmp_path: Path) -> None:
    # An executor's worker waits at the API (take) while it waits in a pop with a slot
    # free. The slots may fill up before a submit answers: the claim runs at once all
    # the same (one over the concurrency), not behind the queued work.
    release = threading.Event()
    started: list[str] = []

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:  # (in a thread)
        started.append(request.task_id)
        if request.input == "block":
            release.wait(20)
        return Success(request.input)

    async def main() -> None:
        store = SqliteStore(path=tmp_path / "ax.db")
        queue = InProcessQueue()
        engine = Engine(store=store, queue=queue, blob_dir=tmp_path / "blobs")
        taking = _TakingEngine(engine)
        worker = Worker(engine=taking, queue=queue, handler=handler, worker_id="w1",
                        concurrency=2, poll_timeout=5.0)
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.run(stop))
        while not taking.waiting:  # (the worker polls with a slot free: it takes)
            await asyncio.sleep(0)
        block = load_dag_mapping({"name": "block", "nodes": {"b": {
            "type": "tool_call", "tool": "echo", "input": "block"}}}, tools=TOOLS,
            models=set())
        blockers = [(await engine.submit(block, {})).task_id for _ in range(2)]
        while len(started) < 2:  # both slots run a blocked node
            await asyncio.sleep(0)
        taken = await taking.hand(chain("default"), "w1")
        while taken not in started:
            await asyncio.sleep(0)
        assert sorted(started[:2]) == sorted(blockers)  # still running, blocked
        release.set()
        for task_id in (*blockers, taken):
            while not (await engine.get_task(task_id)).task.status.final:
                await asyncio.sleep(0.01)
        stop.set()
        await serving
        for task_id in (*blockers, taken):
            assert (await engine.get_task(task_id)).task.status.value == "SUCCEEDED"
        events = await engine.events(taken)
        assert [(e.kind, e.actor) for e in events if e.kind == "claimed"] == [("claimed", "w1")]
        await store.close()

    run(main())
