"""How a worker shares its slots between lanes: the fast share, aging, priority end to end.

The worker's ``_process`` (one item, and the item its slot took next) is replaced by a
recorder (the run loop is what is under test); every wait is on a condition, never a
sleep, and time moves only on a ManualClock.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from axengine.clock import ManualClock
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.queue import DEFAULT_LANE, FAST_LANE, InProcessQueue, WorkItem
from axengine.wiring import build_runtime
from axengine.worker import EngineClient, Worker
from executors.contract import NodeContext, NodeRequest, Outcome, Success

#: Guard against a hang only; every test finishes in a fraction of it.
HANG = 5.0


class Recorder(Worker):
    """A worker whose ``_process`` records the item and runs ``body`` instead (taking
    no item for the slot's next turn)."""

    def __init__(self, body: Callable[[WorkItem], Any], **options: Any) -> None:
        super().__init__(engine=cast(EngineClient, None), handler=_unused, **options)
        self.body = body
        self.running: Counter[str] = Counter()
        self.peak_fast = 0
        self.order: list[WorkItem] = []
        self.changed = asyncio.Condition()

    async def _process(self, item: WorkItem) -> tuple[str, WorkItem | None]:
        self.order.append(item)
        async with self.changed:
            self.running[item.lane] += 1
            self.peak_fast = max(self.peak_fast, self.running[FAST_LANE])
            self.changed.notify_all()
        try:
            await self.body(item)
        finally:
            async with self.changed:
                self.running[item.lane] -= 1
                self.changed.notify_all()
        return "committed", None

    async def until(self, test: Callable[[], bool]) -> None:
        async with asyncio.timeout(HANG), self.changed:
            await self.changed.wait_for(test)


class PopLog(InProcessQueue):
    """Notes the lanes of every pop, so a test can wait for the worker to hit its cap."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.asked: list[tuple[str, ...]] = []
        self.popping = asyncio.Event()

    async def pop(self, worker_id: str, *, lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
                  timeout: float = 1.0, aging: float | None = None) -> WorkItem | None:
        self.asked.append(tuple(lanes))
        self.popping.set()
        return await super().pop(worker_id, lanes=lanes, timeout=timeout, aging=aging)


def _unused(request: NodeRequest, ctx: NodeContext) -> Outcome:
    raise AssertionError("the recorder never runs the handler")


async def _never(item: WorkItem) -> None:
    raise AssertionError("not served in this test")


def items(lane: str, n: int, prefix: str = "") -> list[WorkItem]:
    return [WorkItem(f"t-{lane}{prefix}{i}", "n", lane) for i in range(n)]


async def serve(worker: Worker, scenario: Callable[[], Any]) -> None:
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await scenario()
    except BaseException:
        # A failed scenario may leave bodies waiting on gates it never opened: the
        # stop would wait for them (a stopping worker finishes its runs).
        for slot in list(worker._active):
            slot.cancel()
        raise
    finally:
        stop.set()
        async with asyncio.timeout(HANG):
            await running


# ---------------------------------------------------------------- the fast share


def test_fast_lane_holds_at_most_its_share_while_default_work_waits() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        queue = PopLog()
        worker = Recorder(lambda _: gate.wait(), queue=queue, concurrency=4,
                          fast_share=0.5, poll_timeout=0.05)
        await queue.enqueue(items(FAST_LANE, 6) + items(DEFAULT_LANE, 6))

        async def scenario() -> None:
            await worker.until(lambda: sum(worker.running.values()) == 4)
            assert worker.running == Counter({FAST_LANE: 2, DEFAULT_LANE: 2})
            gate.set()  # let everything finish: default work waits all the way
            await worker.until(lambda: len(worker.order) == 12)
            assert worker.peak_fast == 2
            # The first four taken: two fast (the share), then default ones.
            assert [i.lane for i in worker.order[:4]] == [FAST_LANE] * 2 + [DEFAULT_LANE] * 2

        await serve(worker, scenario)

    asyncio.run(main())


def test_default_lane_borrows_every_slot_when_no_fast_work() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        queue = InProcessQueue()
        worker = Recorder(lambda _: gate.wait(), queue=queue, concurrency=4,
                          fast_share=0.5)
        await queue.enqueue(items(DEFAULT_LANE, 5))

        async def scenario() -> None:
            await worker.until(lambda: worker.running[DEFAULT_LANE] == 4)
            assert await queue.depth(DEFAULT_LANE) == 1
            gate.set()

        await serve(worker, scenario)

    asyncio.run(main())


def test_fast_work_borrows_every_slot_when_nothing_else_waits() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        queue = PopLog()
        worker = Recorder(lambda _: gate.wait(), queue=queue, concurrency=4,
                          fast_share=0.5, poll_timeout=0.05)
        await queue.enqueue(items(FAST_LANE, 5))

        async def scenario() -> None:
            await worker.until(lambda: worker.running[FAST_LANE] == 4)
            assert await queue.depth(FAST_LANE) == 1
            # Past the share the free slots asked the default lane first.
            assert queue.asked[:4] == [(FAST_LANE, DEFAULT_LANE)] * 2 + [
                (DEFAULT_LANE, FAST_LANE)] * 2
            gate.set()
            await worker.until(lambda: len(worker.order) == 5)
            assert worker.peak_fast == 4

        await serve(worker, scenario)

    asyncio.run(main())


def test_a_slot_freed_above_the_fast_share_goes_to_default_work() -> None:
    """Fast work holds every slot (nothing else waited); default work queued meanwhile
    takes the next slot that frees, ahead of fast work queued before it, and the fast
    lane goes back to its share."""
    async def main() -> None:
        queue = InProcessQueue()
        gates: dict[str, asyncio.Event] = {}

        def gate(task_id: str) -> asyncio.Event:
            return gates.setdefault(task_id, asyncio.Event())

        async def body(item: WorkItem) -> None:
            await gate(item.task_id).wait()

        worker = Recorder(body, queue=queue, concurrency=4, fast_share=0.5)
        first = items(FAST_LANE, 4)
        await queue.enqueue(first)

        async def scenario() -> None:
            await worker.until(lambda: worker.running[FAST_LANE] == 4)
            late = items(FAST_LANE, 2, prefix="late")
            await queue.enqueue(late)
            await queue.enqueue(items(DEFAULT_LANE, 2))
            for n, item in enumerate(first[:2], start=1):
                gate(item.task_id).set()
                await worker.until(lambda n=n: worker.running[DEFAULT_LANE] == n)
            assert worker.running == Counter({FAST_LANE: 2, DEFAULT_LANE: 2})
            assert await queue.depth(FAST_LANE) == 2  # the share: fast work waits
            for item in [*first, *late, *items(DEFAULT_LANE, 2)]:
                gate(item.task_id).set()
            await worker.until(lambda: len(worker.order) == 8)

        await serve(worker, scenario)

    asyncio.run(main())


@pytest.mark.parametrize(("concurrency", "share", "slots"),
                         [(4, 0.5, 2), (1, 0.5, 1), (3, 0.5, 1), (8, 0.25, 2), (4, 1.0, 4)])
def test_fast_slots_round_down_to_at_least_one(concurrency: int, share: float,
                                               slots: int) -> None:
    worker = Recorder(_never, queue=InProcessQueue(), concurrency=concurrency,
                      fast_share=share)
    assert worker.fast_slots == slots


@pytest.mark.parametrize("options", [{"fast_share": 0.0}, {"fast_share": 1.5},
                                     {"aging_seconds": -1.0}])
def test_bad_lane_settings_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Recorder(_never, queue=InProcessQueue(), **options)


# ---------------------------------------------------------------- starvation


def _flood(queue: InProcessQueue, clock: ManualClock, served: list[tuple[WorkItem, float]],
           done: asyncio.Event) -> Callable[[WorkItem], Any]:
    """A fast node takes one second and queues another: the fast lane is never empty."""
    counter = iter(range(10_000))

    async def body(item: WorkItem) -> None:
        served.append((item, clock.monotonic()))
        if item.lane == DEFAULT_LANE:
            done.set()
            return
        clock.advance(1)
        await queue.enqueue([WorkItem(f"t-more{next(counter)}", "n", FAST_LANE)])
        if len(served) >= 200:
            done.set()  # the control case: give up long after the bound

    return body


def test_a_regular_node_runs_within_the_aging_bound_under_a_fast_flood() -> None:
    async def main() -> None:
        clock = ManualClock()
        queue = InProcessQueue(clock=clock)
        served: list[tuple[WorkItem, float]] = []
        done = asyncio.Event()
        # One slot: the fast share is the whole worker, so only aging can help.
        worker = Recorder(_flood(queue, clock, served, done), queue=queue, concurrency=1,
                          aging_seconds=30, clock=clock)
        start = clock.monotonic()
        await queue.enqueue([*items(FAST_LANE, 3), WorkItem("t-regular", "n")])

        async def scenario() -> None:
            async with asyncio.timeout(HANG):
                await done.wait()

        await serve(worker, scenario)
        regular = [at for item, at in served if item.lane == DEFAULT_LANE]
        assert regular, "the regular node starved"
        waited = regular[0] - start
        assert 30 <= waited <= 30 + 1  # due at 30 s, served by the next free slot
        assert sum(item.lane == FAST_LANE for item, _ in served) >= 30  # it was a flood

    asyncio.run(main())


def test_without_aging_the_same_flood_starves_the_regular_node() -> None:
    async def main() -> None:
        clock = ManualClock()
        queue = InProcessQueue(clock=clock)
        served: list[tuple[WorkItem, float]] = []
        done = asyncio.Event()
        worker = Recorder(_flood(queue, clock, served, done), queue=queue, concurrency=1,
                          aging_seconds=None, clock=clock)
        await queue.enqueue([*items(FAST_LANE, 3), WorkItem("t-regular", "n")])

        async def scenario() -> None:
            async with asyncio.timeout(HANG):
                await done.wait()

        await serve(worker, scenario)
        assert all(item.lane == FAST_LANE for item, _ in served)  # 200 s, never served

    asyncio.run(main())


# ---------------------------------------------------------------- end to end

ONE = load_dag_text("""
name: one
nodes:
  only: {type: tool_call, tool: echo, input: x, timeout: 60}
""")


def test_embedded_engine_runs_the_highest_priority_task_first(tmp_path: Path) -> None:
    async def main() -> list[str]:
        runtime = build_runtime(AxConfig(home=tmp_path))
        ran: list[str] = []

        def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
            ran.append(request.task_id)
            return Success("done")

        try:
            # Queued before any worker runs: the single slot then picks among all four.
            for n, priority in enumerate([0, 0, 0, 100]):
                await runtime.engine.submit(ONE, {}, priority=priority, task_id=f"t{n}")
            finished: set[str] = set()
            all_done = asyncio.Event()

            def listener(task: Any, events: Any) -> None:
                if task.status.name == "SUCCEEDED":
                    finished.add(task.task_id)
                    if len(finished) == 4:
                        all_done.set()

            runtime.engine.add_listener(listener)
            worker = Worker(engine=runtime.engine, queue=runtime.queue, handler=handler,
                            concurrency=1, poll_timeout=0.05)
            stop = asyncio.Event()
            running = asyncio.create_task(worker.run(stop))
            async with asyncio.timeout(HANG):
                await all_done.wait()
            stop.set()
            await running
        finally:
            await runtime.close()
        return ran

    assert asyncio.run(main()) == ["t3", "t0", "t1", "t2"]


def test_a_completing_slot_takes_next_what_the_serving_loop_would_pop() -> None:
    """As a node completes, its slot pops the item it runs next (``_take_next``): from
    the lanes, in the order, the loop would pop once that slot is free — fast first
    while the fast lane is under its share, fast last when it holds its share without
    this slot."""
    async def main() -> None:
        queue = PopLog()
        worker = Recorder(_never, queue=queue, concurrency=4, fast_share=0.5)
        await queue.enqueue(items(FAST_LANE, 3) + items(DEFAULT_LANE, 2))
        worker._fast_in_flight = 2  # the fast lane holds its share (2 of 4)...
        taken = await worker._take_next(DEFAULT_LANE)  # ...so default work comes first
        assert taken is not None and taken.lane == DEFAULT_LANE
        assert queue.asked[-1] == (DEFAULT_LANE, FAST_LANE)
        taken = await worker._take_next(FAST_LANE)  # a fast slot frees one fast share
        assert taken is not None and taken.lane == FAST_LANE
        assert queue.asked[-1] == (FAST_LANE, DEFAULT_LANE)
        worker._fast_in_flight = 1
        taken = await worker._take_next(DEFAULT_LANE)  # under its share: fast first
        assert taken is not None and taken.lane == FAST_LANE
        worker._fast_in_flight = 2
        taken = await worker._take_next(DEFAULT_LANE)  # the last default
        assert taken is not None and taken.lane == DEFAULT_LANE
        taken = await worker._take_next(DEFAULT_LANE)  # no default left: fast borrows
        assert taken is not None and taken.lane == FAST_LANE
        assert await worker._take_next(DEFAULT_LANE) is None  # nothing left

    asyncio.run(main())


def test_a_slot_does_not_ask_the_queue_while_a_free_slot_waits_on_every_lane() -> None:
    """While the serving loop waits in a pop on all its lanes, whatever is queued goes
    to that free slot: a completing slot takes nothing next and spends no round trip."""
    async def main() -> tuple[WorkItem | None, int, int]:
        queue = PopLog()
        seen: list[tuple[WorkItem | None, int, int]] = []

        async def body(item: WorkItem) -> None:
            async with asyncio.timeout(HANG):
                while not worker._polling:  # the loop's pop for the free slot
                    queue.popping.clear()
                    await queue.popping.wait()
            asked = len(queue.asked)
            seen.append((await worker._take_next(item.lane), asked, len(queue.asked)))

        worker = Recorder(body, queue=queue, concurrency=2)

        async def scenario() -> None:
            await queue.enqueue(items(DEFAULT_LANE, 1))
            await worker.until(lambda: len(seen) == 1)

        await serve(worker, scenario)
        return seen[0]

    taken, asked_before, asked_after = asyncio.run(main())
    assert taken is None
    assert asked_after == asked_before  # the queue was not asked
