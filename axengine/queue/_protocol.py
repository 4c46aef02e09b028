"""The ``WorkQueue`` seam: a delivery hint, never the source of truth.

The reliable-queue pattern: ``pop`` moves an item from a lane into the worker's own
processing list; ``ack`` removes it after the node's outcome is committed; ``requeue``
puts it back (optionally after a delay); ``recover`` hands back everything a dead worker
was holding. Items may be delivered more than once — the engine's claim (fence) makes
that harmless — and may be lost entirely: the reconciler rebuilds the queue from the
store.

Ordering (both implementations, one conformance suite): within a lane, higher
``priority`` pops first and equal priorities pop in enqueue order. Lanes are served in
the order ``pop`` is given them, except that with ``aging`` set, an item that has waited
at least ``aging`` seconds is served before every item that has not (the oldest such item
first, whatever its lane or priority), so no lane and no priority can starve another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["DEFAULT_AGING_SECONDS", "DEFAULT_FAST_SHARE", "DEFAULT_LANE", "FAST_LANE",
           "WorkItem", "WorkQueue"]

#: Lane for ordinary work.
DEFAULT_LANE = "default"
#: Lane served before the default lane (short interactive nodes).
FAST_LANE = "fast"
#: Share of a worker's slots the fast lane is served first in (at least one slot); a
#: slot that frees above it goes to the other lanes' work first, so a flood of fast
#: work cannot keep them from every slot.
DEFAULT_FAST_SHARE = 0.5
#: Seconds after which a waiting item is popped before every lane and priority, so a
#: single-slot worker (whose fast share is the whole worker) cannot starve a lane.
DEFAULT_AGING_SECONDS = 30.0


#: Separator of the fields of an encoded item (ids must not contain it).
SEPARATOR = "\x1f"


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One node to run: the queue carries only identities, never payloads.

    ``priority`` (the task's; higher pops first within a lane) orders the item but is not
    part of its identity: equality, hashing, ``ack`` and ``requeue`` ignore it, so a
    caller that rebuilds an item from the node alone still acknowledges the one it holds.
    """

    task_id: str
    node_id: str
    lane: str = DEFAULT_LANE
    priority: int = field(default=0, compare=False)

    def encode(self) -> str:
        """``lane \\x1f task_id \\x1f node_id [\\x1f priority]``.

        Priority 0 keeps the three-field encoding of earlier versions, so items written
        by either version decode in the other.
        """
        ident = f"{self.lane}{SEPARATOR}{self.task_id}{SEPARATOR}{self.node_id}"
        return f"{ident}{SEPARATOR}{self.priority}" if self.priority else ident

    @classmethod
    def decode(cls, raw: str | bytes) -> WorkItem:
        """The item of :meth:`encode` (three fields: priority 0).

        Raises:
            ValueError: Not an encoded item.
        """
        text = raw.decode() if isinstance(raw, bytes) else raw
        fields = text.split(SEPARATOR)
        if len(fields) == 3:
            lane, task_id, node_id = fields
            return cls(task_id=task_id, node_id=node_id, lane=lane)
        lane, task_id, node_id, priority = fields
        return cls(task_id=task_id, node_id=node_id, lane=lane, priority=int(priority))


@runtime_checkable
class WorkQueue(Protocol):
    """Lanes of work items with reliable pop, ack, delayed requeue and recovery."""

    async def enqueue(self, items: Sequence[WorkItem], *, delay: float = 0.0,
                      acks: Sequence[tuple[str, WorkItem]] = ()) -> None:
        """Append items to their lanes, or schedule them ``delay`` seconds from now.

        ``acks``: ``(worker_id, item)`` pairs acknowledged in the same call, as
        :meth:`ack` would — a commit that claimed the nodes of items its worker holds
        pushes what it readied and drops those items in one round trip."""
        ...

    async def pop(
        self, worker_id: str, *, lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        timeout: float = 1.0, aging: float | None = None,
    ) -> WorkItem | None:
        """Move the next item into ``worker_id``'s processing list and return it; wait up
        to ``timeout`` seconds; None if nothing.

        The next item is the oldest one that has waited at least ``aging`` seconds in
        any of ``lanes`` (when ``aging`` is not None), else the head of the first
        non-empty lane: highest priority first, oldest first among equals. Due delayed
        items are released into their lanes first.
        """
        ...

    async def ack(self, worker_id: str, item: WorkItem) -> None:
        """Remove ``item`` (matched by lane, task and node) from ``worker_id``'s
        processing list."""
        ...

    async def requeue(self, worker_id: str, item: WorkItem, *, delay: float = 0.0) -> None:
        """Atomically move ``item`` from the processing list back to its lane (or to the
        delayed set when ``delay`` > 0)."""
        ...

    async def recover(self, worker_id: str) -> int:
        """Move everything in ``worker_id``'s processing list back to the lanes; return
        how many items moved."""
        ...

    async def queued(self) -> set[tuple[str, str]]:
        """Every ``(task_id, node_id)`` present in a lane, the delayed set or any
        processing list (used by the reconciler to find lost work)."""
        ...

    async def workers(self) -> set[str]:
        """Ids of every worker that popped from this queue and may hold items in its
        processing list (the reconciler recovers those of dead workers)."""
        ...

    async def depth(self, lane: str) -> int:
        """Number of items waiting in ``lane`` (not counting delayed items)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
