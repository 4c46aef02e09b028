"""A mapping that keeps its most recently used entries, up to a count.

A long-running process (the API server, an executor) caches what it loaded from what
callers sent it: DAGs by content hash, inline DAG mappings by digest. The callers may be
untrusted and may send as many distinct DAGs as they like, so every such cache is bounded;
an entry that falls out is only loaded again when it is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["DAG_CACHE_ENTRIES", "Lru"]

K = TypeVar("K")
V = TypeVar("V")

#: Decoded DAGs a process keeps by content hash (an engine, an executor's client); one
#: that falls out is read from the store again when it is needed.
DAG_CACHE_ENTRIES = 512


class Lru(Generic[K, V]):
    """At most ``max_entries`` entries; the least recently read or written goes first."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def discard(self, key: K) -> None:
        """Forget ``key`` (nothing happens when it is not here)."""
        self._entries.pop(key, None)

    def put(self, key: K, value: V) -> None:
        """Remember ``value`` under ``key``, dropping the least recently used entry when
        full."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
