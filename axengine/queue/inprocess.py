"""The embedded work queue: lanes, processing lists and delayed items in one event loop.

Semantics match :class:`axengine.queue.redis.RedisQueue` (one conformance suite checks
both, see ``docs/queues.md``):

- Within a lane, higher priority pops first and equal priorities pop in enqueue order.
  ``pop`` serves the lanes in the order given (fast first by default); with ``aging``,
  an item that has waited that long is served first, oldest first, whatever its lane.
- Duplicates are kept: enqueueing an item already waiting in a lane delivers it twice; the
  engine's claim makes the second delivery a no-op.
- The delayed set holds an item at most once: scheduling it again replaces its due time
  (like ``ZADD`` on the Redis sorted set).
- ``requeue`` without delay and ``recover`` put items back at the *front* of their
  priority in their lane, oldest first, because they were already at the head of the
  line when popped. Their waiting time (for ``aging``) starts again.
- ``requeue`` schedules the item even when ``worker_id`` no longer holds it: losing work is
  worse than delivering it twice.

All state lives in the instance and is touched only from the event loop that uses it, so
every method body runs without interleaving; the condition only wakes waiting ``pop``
calls. Nothing survives the process: the reconciler rebuilds the queue from the store.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

from axengine.clock import SYSTEM, Clock
from axengine.errors import QueueError
from axengine.queue._protocol import DEFAULT_LANE, FAST_LANE, WorkItem

__all__ = ["InProcessQueue"]


@dataclass(eq=False, slots=True)
class _Waiting:
    item: WorkItem
    since: float
    taken: bool = False


class _Lane:
    """The items waiting in one lane, in two orders: by (priority, sequence) for the head
    of the line, by waiting time for aging. Taking an item marks it; both heaps drop
    marked entries lazily."""

    def __init__(self) -> None:
        self._line: list[tuple[int, int, _Waiting]] = []
        self._age: list[tuple[float, int, _Waiting]] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[WorkItem]:
        return (w.item for _, _, w in self._line if not w.taken)

    def add(self, item: WorkItem, seq: int, since: float) -> None:
        waiting = _Waiting(item, since)
        heapq.heappush(self._line, (-item.priority, seq, waiting))
        heapq.heappush(self._age, (since, seq, waiting))
        self._count += 1

    def head(self) -> _Waiting | None:
        while self._line and self._line[0][2].taken:
            heapq.heappop(self._line)
        return self._line[0][2] if self._line else None

    def oldest(self) -> _Waiting | None:
        while self._age and self._age[0][2].taken:
            heapq.heappop(self._age)
        return self._age[0][2] if self._age else None

    def take(self, waiting: _Waiting) -> WorkItem:
        waiting.taken = True
        self._count -= 1
        return waiting.item


class InProcessQueue:
    """A :class:`~axengine.queue.WorkQueue` held in memory, for the embedded engine.

    Bound to the event loop that first waits on it; create one per loop.

    Args:
        clock: Measures how long items wait (for ``pop``'s ``aging``); delays follow
            the event loop's clock.
    """

    def __init__(self, *, clock: Clock = SYSTEM) -> None:
        self._clock = clock
        self._lanes: dict[str, _Lane] = {}
        self._processing: dict[str, list[WorkItem]] = {}
        # The heap may hold stale entries for rescheduled items; ``_delayed`` says which
        # (due, seq) entry is current for each item, like a sorted set's single score.
        self._delayed: dict[WorkItem, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, WorkItem]] = []
        self._seq = itertools.count()
        # Positions in a lane: enqueued items take n, items put back at the front -n,
        # from one counter, so the front grows forwards and the tail backwards.
        self._position = itertools.count(1)
        self._changed = asyncio.Condition()
        self._closed = False
        # Wake-ups per worker (``wake``): a pop that sees the count change returns None.
        self._wakes: dict[str, int] = {}

    async def __aenter__(self) -> InProcessQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def enqueue(self, items: Sequence[WorkItem], *, delay: float = 0.0,
                      acks: Sequence[tuple[str, WorkItem]] = ()) -> None:
        """Append items to their lanes, or schedule them ``delay`` seconds from now.

        Args:
            items: Items to add, in order; each goes to ``item.lane``.
            delay: Seconds before the items become visible to ``pop``; 0 for now.
            acks: ``(worker_id, item)`` pairs to acknowledge (as :meth:`ack`) first.

        Raises:
            QueueError: The queue is closed.
        """
        self._check_open()
        for worker_id, item in acks:
            self._drop_held(worker_id, item)
        if not items:
            return
        async with self._changed:
            if delay > 0:
                due = asyncio.get_running_loop().time() + delay
                for item in items:
                    self._schedule(item, due)
            else:
                for item in items:
                    self._append(item)
            # Waiters recompute their bound too: a new delayed item may be due sooner.
            self._changed.notify_all()

    async def pop(
        self,
        worker_id: str,
        *,
        lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        timeout: float = 1.0,
        aging: float | None = None,
    ) -> WorkItem | None:
        """Move the next item into ``worker_id``'s processing list and return it: the
        oldest item that has waited ``aging`` seconds, else the head of the first
        non-empty lane (highest priority, then oldest).

        Args:
            worker_id: Owner of the processing list the item moves into.
            lanes: Lanes to serve, preferred first.
            timeout: Seconds to wait for an item; 0 returns at once.
            aging: Seconds after which a waiting item is served before every lane and
                priority; None: never.

        Returns:
            The item, or None when nothing arrived in time or the queue was closed while
            waiting.

        Raises:
            QueueError: The queue was already closed.
            ValueError: ``lanes`` is empty.
        """
        self._check_open()
        if not lanes:
            raise ValueError("pop needs at least one lane, e.g. lanes=('fast', 'default')")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        wakes = self._wakes.get(worker_id, 0)  # before any await: a wake from now on counts
        async with self._changed:
            while not self._closed:
                if self._wakes.get(worker_id, 0) != wakes:
                    return None
                now = loop.time()
                self._release_due(now)
                item = self._take(worker_id, lanes, aging)
                if item is not None:
                    return item
                wait = deadline - now
                if wait <= 0:
                    return None
                next_due = self._next_due()
                if next_due is not None:
                    wait = min(wait, next_due - now)
                try:
                    async with asyncio.timeout(wait):
                        await self._changed.wait()
                except TimeoutError:
                    pass
        return None

    async def ack(self, worker_id: str, item: WorkItem) -> None:
        """Remove one occurrence of ``item`` from ``worker_id``'s processing list.

        Acknowledging an item the worker does not hold is a no-op.
        """
        self._check_open()
        self._drop_held(worker_id, item)

    def _drop_held(self, worker_id: str, item: WorkItem) -> None:
        held = self._processing.get(worker_id)
        if held is not None and item in held:
            held.remove(item)

    async def requeue(self, worker_id: str, item: WorkItem, *, delay: float = 0.0) -> None:
        """Move ``item`` from the processing list back to the front of its priority in
        its lane, or into the delayed set ``delay`` seconds from now.

        Raises:
            QueueError: The queue is closed.
        """
        self._check_open()
        async with self._changed:
            await self.ack(worker_id, item)
            if delay > 0:
                self._schedule(item, asyncio.get_running_loop().time() + delay)
            else:
                self._put_front(item)
            self._changed.notify_all()

    async def recover(self, worker_id: str) -> int:
        """Move ``worker_id``'s processing list back to the front of the lanes, oldest
        popped first; return how many items moved.

        Raises:
            QueueError: The queue is closed.
        """
        self._check_open()
        async with self._changed:
            held = self._processing.pop(worker_id, [])
            for item in reversed(held):
                self._put_front(item)
            if held:
                self._changed.notify_all()
            return len(held)

    async def queued(self) -> set[tuple[str, str]]:
        """Every ``(task_id, node_id)`` in a lane, the delayed set or a processing list."""
        self._check_open()
        everywhere: Iterable[WorkItem] = itertools.chain(
            itertools.chain.from_iterable(self._lanes.values()),
            itertools.chain.from_iterable(self._processing.values()),
            self._delayed,
        )
        return {(item.task_id, item.node_id) for item in everywhere}

    async def depth(self, lane: str) -> int:
        """Number of items waiting in ``lane`` (delayed and processing items excluded)."""
        self._check_open()
        return len(self._lanes.get(lane, ()))

    async def workers(self) -> set[str]:
        """Ids of workers that hold a processing list (candidates for ``recover``)."""
        self._check_open()
        return set(self._processing)

    async def wake(self, worker_id: str) -> None:
        """End every ``pop`` of ``worker_id`` waiting now, with None: a stopping worker
        need not wait out its poll timeout. Nothing is taken, so nothing can be lost;
        later pops wait as usual."""
        async with self._changed:
            self._wakes[worker_id] = self._wakes.get(worker_id, 0) + 1
            self._changed.notify_all()

    async def close(self) -> None:
        """Close the queue: waiting ``pop`` calls return None, later calls raise."""
        if self._closed:
            return
        self._closed = True
        async with self._changed:
            self._changed.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise QueueError("the in-process queue is closed; create a new InProcessQueue")

    def _lane(self, lane: str) -> _Lane:
        return self._lanes.setdefault(lane, _Lane())

    def _append(self, item: WorkItem) -> None:
        self._lane(item.lane).add(item, next(self._position), self._clock.monotonic())

    def _put_front(self, item: WorkItem) -> None:
        self._lane(item.lane).add(item, -next(self._position), self._clock.monotonic())

    def _take(self, worker_id: str, lanes: Sequence[str],
              aging: float | None) -> WorkItem | None:
        served = [lane for name in lanes if (lane := self._lanes.get(name))]
        if not served:
            return None
        pick: tuple[_Lane, _Waiting | None] = (served[0], served[0].head())
        if aging is not None:
            due = self._clock.monotonic() - aging
            aged = [(lane, oldest) for lane in served
                    if (oldest := lane.oldest()) is not None and oldest.since <= due]
            if aged:  # min() keeps the first of equals: lane order breaks ties
                pick = min(aged, key=lambda each: each[1].since)
        lane, waiting = pick
        assert waiting is not None  # a non-empty lane has a head
        item = lane.take(waiting)
        self._processing.setdefault(worker_id, []).append(item)
        return item

    def _schedule(self, item: WorkItem, due: float) -> None:
        seq = next(self._seq)
        self._delayed[item] = (due, seq)
        heapq.heappush(self._heap, (due, seq, item))

    def _release_due(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            due, seq, item = heapq.heappop(self._heap)
            if self._delayed.get(item) == (due, seq):
                del self._delayed[item]
                self._append(item)

    def _next_due(self) -> float | None:
        while self._heap:
            due, seq, item = self._heap[0]
            if self._delayed.get(item) == (due, seq):
                return due
            heapq.heappop(self._heap)
        return None
