"""What this engine last read or wrote of a task: its record and node snapshots, decoded,
with the ``mod_revision`` they had.

A transition reads the task record and the snapshots it decides on; in a chain, the
engine that commits node A and claims B reads next exactly what it just wrote. The
cache saves those reads and decodes, and it is never trusted: a view built from it
compares the ``mod_revision`` of every cached key it used in its transaction, so an
entry another engine made stale fails the compare and the transition is decided again
on fresh reads (:meth:`~axengine.engine._shell.Engine._apply`). A decision that would
write nothing is never taken on cached state either: it is decided again on fresh reads.

Entries are immutable decoded records, bounded by the bytes of their encoding (oldest
used first out).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["RecordCache"]

#: Default bound on the encoded bytes the cache holds.
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


class RecordCache:
    """Decoded records by store key, with their ``mod_revision``; least recently used
    out first once the encoded sizes pass ``max_bytes``."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[int, Any, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> tuple[int, Any] | None:
        """``(mod_revision, record)`` of ``key``, or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0], entry[1]

    def put(self, key: str, revision: int, record: Any, size: int) -> None:
        """Remember ``record`` at ``revision`` (``size``: its encoded bytes); an entry
        never goes back to an older revision."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[2]
            if old[0] > revision:
                revision, record, size = old
        if size > self.max_bytes:
            return
        self._entries[key] = (revision, record, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped

    def drop(self, keys: Any) -> None:
        """Forget ``keys`` (an iterable of store keys)."""
        for key in keys:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
