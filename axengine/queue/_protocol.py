"""The ``WorkQueue`` seam: a delivery hint, never the source of truth.

The reliable-queue pattern: ``pop`` moves an item from a lane into the worker's own
processing list; ``ack`` removes it after the node's outcome is committed; ``requeue``
puts it back (optionally after a delay); ``recover`` hands back everything a dead worker
was holding. Items may be delivered more than once — the engine's claim (fence) makes
that harmless — and may be lost entirely: the reconciler rebuilds the queue from the
store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["DEFAULT_LANE", "FAST_LANE", "WorkItem", "WorkQueue"]

#: Lane for ordinary work.
DEFAULT_LANE = "default"
#: Lane served before the default lane (short interactive nodes).
FAST_LANE = "fast"


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One node to run: the queue carries only identities, never payloads."""

    task_id: str
    node_id: str
    lane: str = DEFAULT_LANE

    def encode(self) -> str:
        return f"{self.lane}\x1f{self.task_id}\x1f{self.node_id}"

    @classmethod
    def decode(cls, raw: str | bytes) -> WorkItem:
        text = raw.decode() if isinstance(raw, bytes) else raw
        lane, task_id, node_id = text.split("\x1f")
        return cls(task_id=task_id, node_id=node_id, lane=lane)


@runtime_checkable
class WorkQueue(Protocol):
    """Lanes of work items with reliable pop, ack, delayed requeue and recovery."""

    async def enqueue(self, items: Sequence[WorkItem], *, delay: float = 0.0) -> None:
        """Append items to their lanes, or schedule them ``delay`` seconds from now."""
        ...

    async def pop(
        self, worker_id: str, *, lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        timeout: float = 1.0,
    ) -> WorkItem | None:
        """Move the oldest item of the first non-empty lane into ``worker_id``'s
        processing list and return it; wait up to ``timeout`` seconds; None if nothing.

        Due delayed items are released into their lanes first.
        """
        ...

    async def ack(self, worker_id: str, item: WorkItem) -> None:
        """Remove ``item`` from ``worker_id``'s processing list."""
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
