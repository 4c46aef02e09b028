"""Key layout of the work queue: Redis keys (see :mod:`axengine.queue.redis`).

The queue is a delivery hint rebuilt from the state store, so its keys live with the
queue rather than with the store's layout (:mod:`axengine.keys`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QueueKeys"]


@dataclass(frozen=True)
class QueueKeys:
    """Key layout of the work queue (Redis keys; names of in-process lanes)."""

    prefix: str = "ax"

    def lane(self, lane: str) -> str:
        """Waiting items of ``lane`` in pop order (a sorted set; a list before
        priorities were honoured)."""
        return f"{self.prefix}:lane:{lane}"

    def since(self, lane: str) -> str:
        """The same items by the time they started waiting (for aging)."""
        return f"{self.prefix}:since:{lane}"

    def position(self) -> str:
        """Counter that orders items of equal priority within a lane."""
        return f"{self.prefix}:position"

    def processing(self, worker_id: str) -> str:
        return f"{self.prefix}:processing:{worker_id}"

    def delayed(self) -> str:
        return f"{self.prefix}:delayed"

    def wake(self) -> str:
        """A list of wake-up tokens: one pushed per item made poppable, so a blocked
        ``pop`` wakes at once whatever lane the item went to."""
        return f"{self.prefix}:wake"

    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def lanes(self) -> str:
        """Set of lane names ever enqueued to, so ``queued()`` can read every lane."""
        return f"{self.prefix}:lanes"
