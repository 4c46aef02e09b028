"""Every key layout of the state store, in one place.

Only the engine (:mod:`axengine.engine`) reads and writes these keys; every other layer
asks the engine. The work queue's key names live with the queue
(:class:`axengine.queue.QueueKeys`).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from urllib.parse import quote

from axengine.config import DEFAULT_PREFIX

__all__ = ["DEFAULT_PREFIX", "INDEX_VERSION", "StoreKeys", "inverted_time"]

#: Version of the secondary task indexes; a store whose ``index_version`` key holds
#: another value (or none: written before indexes existed) is backfilled once.
INDEX_VERSION = "1"
#: Largest creation time (microseconds) the inverted timestamp can order: year 5138.
_TIME_SPAN = 10**17


def inverted_time(created_at: float) -> str:
    """A fixed-width, zero-padded ``10**17 - 1 - microseconds``: an ascending key range
    over it lists the newest task first."""
    micros = min(max(int(created_at * 1_000_000), 0), _TIME_SPAN - 1)
    return f"{_TIME_SPAN - 1 - micros:017d}"


@functools.lru_cache(maxsize=4096)
def _part(text: str) -> str:
    # Names, label keys and values may hold "/" or "=": percent-encode every key part
    # that comes from a user so it can never split or merge index segments. (Cached:
    # the same DAG names and dependencies come back on every commit.)
    return quote(text, safe="")


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

    def all_events(self) -> str:
        """Every task's events (``all_events() + task_id + "/" + event_id``)."""
        return f"{self.prefix}/events/"

    def event_task(self, key: str) -> str:
        """The task id of an event's key (:meth:`event`)."""
        return key[len(self.all_events()):key.rfind("/")]

    def idempotency(self, principal: str, key: str) -> str:
        """An idempotency key is scoped to the principal that submitted with it, so one
        client can neither squat nor probe another's keys."""
        return f"{self.prefix}/idempotency/{_part(principal)}/{key}"

    def effect(self, key: str) -> str:
        return f"{self.prefix}/effects/{key}"

    def effects_of(self, task_id: str, node_id: str = "") -> str:
        """The index of a task's outbox records (of one node when given); each entry's
        value is the effect's key."""
        base = f"{self.prefix}/effect-index/{task_id}/"
        return f"{base}{_part(node_id)}/" if node_id else base

    def effect_entry(self, task_id: str, node_id: str, key: str) -> str:
        """The index entry of the effect ``key`` of a node (a digest: keys are free
        text)."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"{self.effects_of(task_id, node_id)}{digest}"

    def stats(self, dag_name: str, node_id: str) -> str:
        """Recent run durations of one DAG node (its ``timeout_policy`` reads them)."""
        return f"{self.prefix}/stats/{_part(dag_name)}/{_part(node_id)}"

    def ramp(self, dependency: str) -> str:
        """The slow ramp of one dependency after an outage (``engine/_ramp.py``)."""
        return f"{self.prefix}/ramps/{_part(dependency)}"

    def leader(self, role: str) -> str:
        return f"{self.prefix}/leader/{role}"

    # Secondary task indexes (values: the task id). Written in the transaction that
    # writes the task record, so an index never disagrees with a committed task.

    def index_version(self) -> str:
        return f"{self.prefix}/index/version"

    def by_created(self) -> str:
        """Every task, newest first."""
        return f"{self.prefix}/index/created/"

    def by_status(self, status: str) -> str:
        """Tasks with one status, newest first."""
        return f"{self.prefix}/index/status/{_part(status)}/"

    def by_dag(self, dag_name: str) -> str:
        """Tasks of one DAG name, newest first."""
        return f"{self.prefix}/index/dag/{_part(dag_name)}/"

    def by_label(self, key: str, value: str) -> str:
        """Tasks labelled ``key=value``, newest first."""
        return f"{self.prefix}/index/label/{_part(key)}={_part(value)}/"

    def active_by(self, principal: str) -> str:
        """Unfinished tasks submitted by ``principal`` (the per-principal quota)."""
        return f"{self.prefix}/index/active/{_part(principal)}/"

    @staticmethod
    def index_entry(index: str, created_at: float, task_id: str) -> str:
        """The key of a task in a newest-first index (``by_created``, ``by_status``...)."""
        return f"{index}{inverted_time(created_at)}/{task_id}"
