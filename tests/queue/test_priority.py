"""Priority within a lane and aging across lanes, checked on every queue implementation.

Redis has no injectable clock (enqueue times are server time), so the Redis cases use
``aging=0`` (everything waiting counts as aged) and a large ``aging`` (nothing does);
the in-process queue is also driven with a :class:`ManualClock`.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from axengine.clock import ManualClock
from axengine.queue import DEFAULT_LANE, FAST_LANE, InProcessQueue, QueueKeys, WorkItem, WorkQueue
from tests.queue.conftest import QueueHarness
from tests.queue.test_conformance import drain
from tests.servers import Server


def item(node: str, priority: int = 0, lane: str = DEFAULT_LANE) -> WorkItem:
    return WorkItem(task_id=f"t-{node}", node_id=node, lane=lane, priority=priority)


def ordered(items: list[WorkItem]) -> list[tuple[str, int]]:
    """Node and priority of each item: ``==`` on WorkItem ignores priority."""
    return [(i.node_id, i.priority) for i in items]


async def drain_n(queue: WorkQueue, worker: str, n: int,
                  aging: float | None = None) -> list[WorkItem]:
    """Pop exactly ``n`` items without waiting."""
    popped = []
    for _ in range(n):
        got = await queue.pop(worker, timeout=0, aging=aging)
        assert got is not None
        popped.append(got)
    return popped


# ---------------------------------------------------------------- encoding


def test_encoding_keeps_the_three_field_form_for_priority_zero() -> None:
    assert item("a").encode() == "default\x1ft-a\x1fa"
    assert item("a", 7).encode() == "default\x1ft-a\x1fa\x1f7"
    assert WorkItem.decode(item("a", -3).encode()).priority == -3
    assert WorkItem.decode(b"fast\x1ft\x1fn\x1f100") == WorkItem("t", "n", FAST_LANE)


def test_items_written_by_an_earlier_version_decode_with_priority_zero() -> None:
    old = WorkItem.decode(b"fast\x1ft1\x1fn1")
    assert (old.task_id, old.node_id, old.lane, old.priority) == ("t1", "n1", FAST_LANE, 0)


def test_priority_is_not_part_of_an_items_identity() -> None:
    assert item("a", 100) == item("a") and hash(item("a", 100)) == hash(item("a"))
    assert item("a", lane=FAST_LANE) != item("a")


# ---------------------------------------------------------------- ordering


def test_higher_priority_pops_first_fifo_among_equals(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item("a"), item("b"), item("c", 100), item("d", 5)])
        await queue.enqueue([item("e", 100), item("f", -1), item("g")])
        assert ordered(await drain(queue, "w", lanes=(DEFAULT_LANE,))) == [
            ("c", 100), ("e", 100), ("d", 5), ("a", 0), ("b", 0), ("g", 0), ("f", -1)]

    queues.run(scenario)


def test_lane_order_still_beats_priority_without_aging(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item("d", 100), item("f", 0, FAST_LANE)])
        assert ordered(await drain(queue, "w")) == [("f", 0), ("d", 100)]

    queues.run(scenario)


def test_requeue_and_recover_go_to_the_front_of_their_priority(
        queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item("a"), item("b"), item("c", 9), item("d", 9)])
        popped = await drain_n(queue, "w", 3)
        assert ordered(popped) == [("c", 9), ("d", 9), ("a", 0)]
        await queue.requeue("w", popped[0])
        await queue.enqueue([item("e", 9)])
        assert await queue.recover("w") == 2  # d and a, oldest popped first
        assert ordered(await drain(queue, "w2")) == [
            ("d", 9), ("c", 9), ("e", 9), ("a", 0), ("b", 0)]

    queues.run(scenario)


def test_ack_and_requeue_match_an_item_whatever_its_priority(
        queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item("a", 42), item("b", 7)])
        a = await queue.pop("w", timeout=0)
        assert a is not None and a.priority == 42
        # The executor's hand-back rebuilds the item from the node, without a priority.
        await queue.ack("w", WorkItem(a.task_id, a.node_id, a.lane))
        b = await queue.pop("w", timeout=0)
        assert b is not None and b.priority == 7
        await queue.requeue("w", WorkItem(b.task_id, b.node_id, b.lane, priority=7))
        assert await queue.queued() == {("t-b", "b")}
        assert await queue.recover("w") == 0  # nothing left held

    queues.run(scenario)


def test_delayed_items_keep_their_priority(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item("a")])
        await queue.enqueue([item("late", 50)], delay=0.05)
        # A pop on another lane releases due items into their lanes while it waits.
        assert await queue.pop("probe", lanes=("elsewhere",), timeout=0.5) is None
        assert await queue.depth(DEFAULT_LANE) == 2
        assert ordered(await drain(queue, "w", lanes=(DEFAULT_LANE,))) == [
            ("late", 50), ("a", 0)]

    queues.run(scenario)


# ---------------------------------------------------------------- aging


def test_aging_serves_the_oldest_waiting_item_first(queues: QueueHarness) -> None:
    async def scenario(queue: WorkQueue) -> None:
        await queue.enqueue([item("old")])
        await queue.enqueue([item("f1", lane=FAST_LANE), item("hi", 100)])
        # Nothing has waited an hour: lanes in order, priorities within.
        assert ordered(await drain_n(queue, "w", 1, aging=3600)) == [("f1", 0)]
        await queue.enqueue([item("f2", lane=FAST_LANE)])
        # Everything waiting counts as aged: oldest first, whatever lane or priority.
        assert ordered(await _pop_all(queue, aging=0)) == [
            ("old", 0), ("hi", 100), ("f2", 0)]

    queues.run(scenario)


async def _pop_all(queue: WorkQueue, *, aging: float) -> list[WorkItem]:
    popped = []
    while (got := await queue.pop("w", timeout=0, aging=aging)) is not None:
        popped.append(got)
    return popped


def test_aging_follows_the_injected_clock() -> None:
    async def main() -> None:
        clock = ManualClock()
        async with InProcessQueue(clock=clock) as queue:
            await queue.enqueue([item("regular")])
            served = []
            for n in range(40):
                await queue.enqueue([item(f"f{n}", lane=FAST_LANE)])
                got = await queue.pop("w", timeout=0, aging=30)
                assert got is not None
                served.append(got.node_id)
                if got.node_id == "regular":
                    break
                clock.advance(1)  # one fast node's run
            assert served[-1] == "regular"
            assert len(served) == 31  # 30 fast pops at t+0..29, then it is due at t+30

    asyncio.run(main())


# ---------------------------------------------------------------- Redis upgrade


def test_redis_lanes_of_an_earlier_version_are_served(
        redis_queues: QueueHarness, redis_server: Server) -> None:
    keys = QueueKeys(prefix=redis_queues.prefix)

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            async with redis_queues.open() as queue:
                # What an earlier version left: a list, LPUSH at the tail, 3-field items.
                await client.lpush(keys.lane(DEFAULT_LANE), "default\x1fold\x1f1",
                                   "default\x1fold\x1f2")
                await client.sadd(keys.lanes(), DEFAULT_LANE)
                await client.lpush(keys.processing("dead"), "fast\x1fold\x1f3")
                await client.sadd(keys.workers(), "dead")
                assert await queue.queued() == {("old", "1"), ("old", "2"), ("old", "3")}
                assert await queue.depth(DEFAULT_LANE) == 2
                await queue.enqueue([item("new"), item("urgent", 100)])
                assert await queue.recover("dead") == 1
                assert ordered(await drain(queue, "w")) == [
                    ("3", 0), ("urgent", 100), ("1", 0), ("2", 0), ("new", 0)]
        finally:
            await client.aclose()

    asyncio.run(main())
