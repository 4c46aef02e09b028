"""Every key layout ax uses in the state store and the work queue, in one place."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_PREFIX", "QueueKeys", "StoreKeys"]

#: Default root of every key ax writes to the state store.
DEFAULT_PREFIX = "/ax"


@dataclass(frozen=True)
class StoreKeys:
    """Key layout of the state store (DESIGN §3)."""

    prefix: str = DEFAULT_PREFIX

    def dag(self, dag_hash: str) -> str:
        return f"{self.prefix}/dags/{dag_hash}"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}/tasks/{task_id}"

    def tasks(self) -> str:
        return f"{self.prefix}/tasks/"

    def snapshot(self, task_id: str, node_id: str) -> str:
        return f"{self.prefix}/snapshots/{task_id}/{node_id}"

    def snapshots(self, task_id: str) -> str:
        return f"{self.prefix}/snapshots/{task_id}/"

    def event(self, task_id: str, event_id: str) -> str:
        return f"{self.prefix}/events/{task_id}/{event_id}"

    def events(self, task_id: str) -> str:
        return f"{self.prefix}/events/{task_id}/"

    def idempotency(self, key: str) -> str:
        return f"{self.prefix}/idempotency/{key}"

    def effect(self, key: str) -> str:
        return f"{self.prefix}/effects/{key}"

    def leader(self, role: str) -> str:
        return f"{self.prefix}/leader/{role}"


@dataclass(frozen=True)
class QueueKeys:
    """Key layout of the work queue (Redis keys; names of in-process lanes)."""

    prefix: str = "ax"

    def lane(self, lane: str) -> str:
        return f"{self.prefix}:lane:{lane}"

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
