"""The embedded work queue: lanes, processing lists and delayed items in one event loop.

Semantics match :class:`axengine.queue.redis.RedisQueue` (one conformance suite checks
both, see ``docs/queues.md``):

- Lanes are FIFO. ``pop`` serves the lanes in the order given (fast first by default).
- Duplicates are kept: enqueueing an item already waiting in a lane delivers it twice; the
  engine's claim makes the second delivery a no-op.
- The delayed set holds an item at most once: scheduling it again replaces its due time
  (like ``ZADD`` on the Redis sorted set).
- ``requeue`` without delay and ``recover`` put items back at the *front* of their lane,
  oldest first, because they were already at the head of the line when popped.
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
from collections import deque
from collections.abc import Iterable, Sequence
from types import TracebackType

from axengine.errors import QueueError
from axengine.queue._protocol import DEFAULT_LANE, FAST_LANE, WorkItem

__all__ = ["InProcessQueue"]


class InProcessQueue:
    """A :class:`~axengine.queue.WorkQueue` held in memory, for the embedded engine.

    Bound to the event loop that first waits on it; create one per loop.
    """

    def __init__(self) -> None:
        self._lanes: dict[str, deque[WorkItem]] = {}
        self._processing: dict[str, list[WorkItem]] = {}
        # The heap may hold stale entries for rescheduled items; ``_delayed`` says which
        # (due, seq) entry is current for each item, like a sorted set's single score.
        self._delayed: dict[WorkItem, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, WorkItem]] = []
        self._seq = itertools.count()
        self._changed = asyncio.Condition()
        self._closed = False

    async def __aenter__(self) -> InProcessQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def enqueue(self, items: Sequence[WorkItem], *, delay: float = 0.0) -> None:
        """Append items to their lanes, or schedule them ``delay`` seconds from now.

        Args:
            items: Items to add, in order; each goes to ``item.lane``.
            delay: Seconds before the items become visible to ``pop``; 0 for now.

        Raises:
            QueueError: The queue is closed.
        """
        self._check_open()
        async with self._changed:
            if delay > 0:
                due = asyncio.get_running_loop().time() + delay
                for item in items:
                    self._schedule(item, due)
            else:
                for item in items:
                    self._lane(item.lane).append(item)
            # Waiters recompute their bound too: a new delayed item may be due sooner.
            self._changed.notify_all()

    async def pop(
        self,
        worker_id: str,
        *,
        lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        timeout: float = 1.0,
    ) -> WorkItem | None:
        """Move the oldest item of the first non-empty lane into ``worker_id``'s
        processing list and return it.

        Args:
            worker_id: Owner of the processing list the item moves into.
            lanes: Lanes to serve, highest priority first.
            timeout: Seconds to wait for an item; 0 returns at once.

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
        async with self._changed:
            while not self._closed:
                now = loop.time()
                self._release_due(now)
                item = self._take(worker_id, lanes)
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
        held = self._processing.get(worker_id)
        if held is not None and item in held:
            held.remove(item)

    async def requeue(self, worker_id: str, item: WorkItem, *, delay: float = 0.0) -> None:
        """Move ``item`` from the processing list back to the front of its lane, or into
        the delayed set ``delay`` seconds from now.

        Raises:
            QueueError: The queue is closed.
        """
        self._check_open()
        async with self._changed:
            await self.ack(worker_id, item)
            if delay > 0:
                self._schedule(item, asyncio.get_running_loop().time() + delay)
            else:
                self._lane(item.lane).appendleft(item)
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
                self._lane(item.lane).appendleft(item)
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

    def _lane(self, lane: str) -> deque[WorkItem]:
        return self._lanes.setdefault(lane, deque())

    def _take(self, worker_id: str, lanes: Sequence[str]) -> WorkItem | None:
        for lane in lanes:
            waiting = self._lanes.get(lane)
            if waiting:
                item = waiting.popleft()
                self._processing.setdefault(worker_id, []).append(item)
                return item
        return None

    def _schedule(self, item: WorkItem, due: float) -> None:
        seq = next(self._seq)
        self._delayed[item] = (due, seq)
        heapq.heappush(self._heap, (due, seq, item))

    def _release_due(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            due, seq, item = heapq.heappop(self._heap)
            if self._delayed.get(item) == (due, seq):
                del self._delayed[item]
                self._lane(item.lane).append(item)

    def _next_due(self) -> float | None:
        while self._heap:
            due, seq, item = self._heap[0]
            if self._delayed.get(item) == (due, seq):
                return due
            heapq.heappop(self._heap)
        return None
