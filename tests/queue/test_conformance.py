"""The ``WorkQueue`` contract, checked against every implementation (in-process, Redis).

Each test runs once per backend with a fresh, empty queue (a unique Redis key prefix).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from axengine.errors import QueueError
from axengine.queue import DEFAULT_LANE, FAST_LANE, WorkItem, WorkQueue
from tests.queue.conftest import QueueHarness

#: Upper bound for "promptly": generous for a loaded CI machine, far below the timeouts
#: the tests would otherwise hit.
PROMPT = 2.0


def item(n: int, lane: str = DEFAULT_LANE, task: str = "t1") -> WorkItem:
    return WorkItem(task_id=task, node_id=f"n{n}", lane=lane)


async def drain(queue: WorkQueue, worker: str, *, lanes: tuple[str, ...] = (FAST_LANE,
                DEFAULT_LANE)) -> list[WorkItem]:
    """Pop (without waiting) until the lanes are empty."""
    popped = []
    while (got := await queue.pop(worker, lanes=lanes, timeout=0)) is not None:
        popped.append(got)
    return popped


async def pop_until(queue: WorkQueue, worker: str, *, within: float) -> tuple[WorkItem, float]:
    """Pop with short waits until an item arrives (bounded by ``within`` seconds)."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        got = await queue.pop(worker, timeout=0.05)
        if got is not None:
            return got, time.monotonic() - start
    raise AssertionError(f"no item within {within}s")


def test_implements_protocol(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        assert isinstance(queue, WorkQueue)
        assert await queue.queued() == set()
        assert await queue.depth(DEFAULT_LANE) == 0

    queues.run(scenario)


def test_fifo_per_lane(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1)])
        await queue.enqueue([item(2)])
        await queue.enqueue([item(3, FAST_LANE), item(4, FAST_LANE)])
        assert await drain(queue, "w", lanes=(DEFAULT_LANE,)) == [item(0), item(1), item(2)]
        assert await drain(queue, "w", lanes=(FAST_LANE,)) == [
            item(3, FAST_LANE), item(4, FAST_LANE)]

    queues.run(scenario)


def test_fast_lane_served_before_default(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1)])
        await queue.enqueue([item(2, FAST_LANE)])
        assert await drain(queue, "w") == [item(2, FAST_LANE), item(0), item(1)]

    queues.run(scenario)


def test_pop_serves_only_requested_lanes_in_given_order(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1, FAST_LANE)])
        assert await queue.pop("w", lanes=(DEFAULT_LANE, FAST_LANE), timeout=0) == item(0)
        assert await queue.pop("w", lanes=(DEFAULT_LANE,), timeout=0) is None
        assert await queue.depth(FAST_LANE) == 1

    queues.run(scenario)


def test_pop_needs_a_lane(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0)])
        with pytest.raises(ValueError, match="at least one lane"):
            await queue.pop("w", lanes=(), timeout=0)
        assert await queue.depth(DEFAULT_LANE) == 1

    queues.run(scenario)


def test_pop_timeout_returns_none_within_bounds(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        start = time.monotonic()
        assert await queue.pop("w", timeout=0) is None
        assert time.monotonic() - start < 0.5
        start = time.monotonic()
        assert await queue.pop("w", timeout=0.3) is None
        elapsed = time.monotonic() - start
        assert 0.25 <= elapsed < 0.3 + PROMPT

    queues.run(scenario)


def test_waiting_pop_wakes_for_new_item_in_any_lane(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        for lane in (FAST_LANE, DEFAULT_LANE):
            waiter = asyncio.create_task(queue.pop("w", timeout=10))
            await asyncio.sleep(0.05)  # realism only: the result holds either way
            start = time.monotonic()
            await queue.enqueue([item(0, lane)])
            assert await waiter == item(0, lane)
            assert time.monotonic() - start < PROMPT

    queues.run(scenario)


def test_pop_moves_item_into_processing(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1)])
        assert await queue.pop("w", timeout=0) == item(0)
        assert await queue.depth(DEFAULT_LANE) == 1
        assert await queue.queued() == {("t1", "n0"), ("t1", "n1")}
        assert await drain(queue, "w") == [item(1)]
        assert await queue.depth(DEFAULT_LANE) == 0
        assert await queue.queued() == {("t1", "n0"), ("t1", "n1")}

    queues.run(scenario)


def test_ack_removes_from_processing(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1)])
        first = await queue.pop("w", timeout=0)
        assert first == item(0)
        await queue.ack("w", first)
        assert await queue.queued() == {("t1", "n1")}
        await queue.ack("w", first)  # acking twice, or what was never held, is a no-op
        await queue.ack("other", item(1))
        assert await queue.queued() == {("t1", "n1")}
        assert await queue.recover("w") == 0

    queues.run(scenario)


def test_enqueue_acks_what_workers_hold_in_the_same_call(queues: QueueHarness) -> None:
    """``enqueue(items, acks=...)`` acknowledges as ``ack`` would (one occurrence, any
    priority, a no-op for what is not held), pushes the items, and does both with no
    items or with a delay."""
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1), item(2), item(3)])
        held = [await queue.pop(w, timeout=0) for w in ("a", "b", "a", "b")]
        assert held == [item(0), item(1), item(2), item(3)]
        await queue.enqueue([item(4)], acks=[
            ("a", item(0)),
            ("b", WorkItem("t1", "n1", priority=7)),  # (priority is not identity)
            ("b", item(2)),  # held by a, not b: a no-op
            ("c", item(9)),  # never held
        ])
        assert await queue.queued() == {("t1", "n2"), ("t1", "n3"), ("t1", "n4")}
        await queue.enqueue([], acks=[("a", item(2))])
        assert await queue.queued() == {("t1", "n3"), ("t1", "n4")}
        await queue.enqueue([item(5)], delay=60, acks=[("b", item(3))])
        assert await queue.queued() == {("t1", "n4"), ("t1", "n5")}
        assert await drain(queue, "a") == [item(4)]  # n5 is not due for a minute
        assert await queue.recover("b") == 0

    queues.run(scenario)


def test_requeue_without_delay_returns_item_to_front_of_lane(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1)])
        first = await queue.pop("w", timeout=0)
        assert first == item(0)
        await queue.requeue("w", first)
        assert await queue.depth(DEFAULT_LANE) == 2
        assert await queue.recover("w") == 0  # no longer in the processing list
        assert await drain(queue, "w2") == [item(0), item(1)]

    queues.run(scenario)


def test_requeue_with_delay_is_not_popped_before_due(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0)])
        got = await queue.pop("w", timeout=0)
        assert got == item(0)
        start = time.monotonic()
        await queue.requeue("w", got, delay=0.4)
        assert await queue.pop("w", timeout=0) is None
        assert await queue.depth(DEFAULT_LANE) == 0
        assert await queue.queued() == {("t1", "n0")}  # the delayed set counts as queued
        again, _ = await pop_until(queue, "w", within=0.4 + PROMPT)
        assert again == item(0)
        assert time.monotonic() - start >= 0.35
        assert await queue.recover("w") == 1  # only the re-popped copy is held

    queues.run(scenario)


def test_enqueue_with_delay_and_waiting_pop_wakes_when_due(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        start = time.monotonic()
        await queue.enqueue([item(0), item(1, FAST_LANE)], delay=0.3)
        assert await queue.pop("w", timeout=0) is None
        # One long pop: it must wake for the due items by itself, not only at its timeout.
        got = await queue.pop("w", timeout=10)
        elapsed = time.monotonic() - start
        assert got == item(1, FAST_LANE)
        assert 0.25 <= elapsed < 0.3 + PROMPT
        assert await queue.pop("w", timeout=0) == item(0)

    queues.run(scenario)


def test_delayed_item_is_held_once_and_rescheduling_replaces_due_time(
    queues: QueueHarness,
) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0)], delay=60)
        await queue.enqueue([item(0)], delay=0.1)
        got, _ = await pop_until(queue, "w", within=0.1 + PROMPT)
        assert got == item(0)
        await queue.ack("w", got)
        assert await queue.queued() == set()  # the 60 s entry was replaced, not kept

    queues.run(scenario)


def test_duplicates_in_a_lane_are_delivered_twice(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0)])
        await queue.enqueue([item(0)])
        assert await queue.depth(DEFAULT_LANE) == 2
        assert await drain(queue, "w") == [item(0), item(0)]
        await queue.ack("w", item(0))
        assert await queue.queued() == {("t1", "n0")}  # one copy still held
        await queue.ack("w", item(0))
        assert await queue.queued() == set()

    queues.run(scenario)


def test_recover_returns_crashed_workers_items_oldest_first(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0), item(1), item(2), item(3, FAST_LANE)])
        held = [await queue.pop("crashed", timeout=0) for _ in range(3)]
        assert held == [item(3, FAST_LANE), item(0), item(1)]
        assert await queue.pop("alive", timeout=0) == item(2)
        assert await queue.recover("crashed") == 3
        assert await queue.recover("crashed") == 0
        assert await queue.recover("never-seen") == 0
        assert await queue.depth(FAST_LANE) == 1
        assert await queue.depth(DEFAULT_LANE) == 2
        # The alive worker's item stays with it; the recovered ones come back in order.
        assert await drain(queue, "w2") == [item(3, FAST_LANE), item(0), item(1)]
        assert await queue.recover("alive") == 1

    queues.run(scenario)


def test_queued_covers_lanes_delayed_and_every_processing_list(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(0, task="a"), item(1, task="b")])
        await queue.enqueue([item(2, FAST_LANE, task="c")])
        await queue.enqueue([item(3, task="d")], delay=60)
        assert await queue.pop("w1", timeout=0) == item(2, FAST_LANE, task="c")
        assert await queue.pop("w2", timeout=0) == item(0, task="a")
        assert await queue.queued() == {("a", "n0"), ("b", "n1"), ("c", "n2"), ("d", "n3")}

    queues.run(scenario)


def test_depth_counts_waiting_items_per_lane(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item(n) for n in range(5)] + [item(9, FAST_LANE)])
        await queue.enqueue([item(7)], delay=60)
        assert await queue.depth(DEFAULT_LANE) == 5
        assert await queue.depth(FAST_LANE) == 1
        assert await queue.depth("unknown") == 0
        await queue.pop("w", lanes=(DEFAULT_LANE,), timeout=0)
        assert await queue.depth(DEFAULT_LANE) == 4

    queues.run(scenario)


def test_concurrent_consumers_get_each_item_exactly_once(queues: QueueHarness) -> None:
    total = 200

    async def consume(queue: WorkQueue, worker: str, seen: list[WorkItem]) -> None:
        while (got := await queue.pop(worker, timeout=0.5)) is not None:
            seen.append(got)
            await queue.ack(worker, got)

    async def scenario(queue: WorkQueue) -> None:
        seen: list[WorkItem] = []
        consumers = [asyncio.create_task(consume(queue, f"w{i}", seen)) for i in range(4)]
        items = [item(n, FAST_LANE if n % 3 == 0 else DEFAULT_LANE) for n in range(total)]
        for start in range(0, total, 20):  # arrive in batches while consumers wait
            await queue.enqueue(items[start:start + 20])
        await asyncio.gather(*consumers)
        assert len(seen) == total
        assert set(seen) == set(items)
        assert await queue.queued() == set()

    queues.run(scenario)


def test_empty_enqueue_is_a_no_op(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([])
        await queue.enqueue([], delay=1)
        assert await queue.queued() == set()

    queues.run(scenario)


def test_closed_queue_raises_and_waiting_pop_returns_none(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        waiter = asyncio.create_task(queue.pop("w", timeout=10))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        await queue.close()
        assert await waiter is None
        assert time.monotonic() - start < PROMPT
        with pytest.raises(QueueError, match="closed"):
            await queue.enqueue([item(0)])
        with pytest.raises(QueueError, match="closed"):
            await queue.pop("w", timeout=0)
        await queue.close()  # idempotent

    queues.run(scenario)
