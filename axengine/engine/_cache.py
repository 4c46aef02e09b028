"""What this engine last read or wrote of a task: its record and node snapshots, decoded,
with the ``mod_revision`` they had.

A transition reads the task record and the snapshots it decides on; in a chain, the
engine that commits node A and claims B reads next exactly what it just wrote. The
cache saves those reads and decodes, and it is never trusted: a view built from it
compares the ``mod_revision`` of every cached key it used in its transaction, so an
entry another engine made stale fails the compare and the transition is decided again
on fresh reads (:meth:`~axengine.engine._shell.Engine._apply`). A decision that would
write nothing is never taken on cached state either: it is decided again on fresh reads.

Entries are immutable decoded records, bounded by count and by the bytes of their
encoding (least recently used first out). The count bound is small on purpose: the
cache only needs the records of the transitions in flight, and every object it keeps is
one more for the garbage collector to scan — 60,000 cached snapshots make a full
collection take about 145 ms (10 ms without), a pause every request of a long-running
API server would feel. The bytes bound is small for the same reason: decoded JSON is
about one object per 10 bytes, so 8 MB of large values (a chain passing 60 KB node to
node) kept some 400,000 objects alive, and full collections took 15 % of that run.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["RecordCache"]

#: Default bounds: records held, and the encoded bytes of them.
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 2 * 1024 * 1024


class RecordCache:
    """Decoded records by store key, with their ``mod_revision``; least recently used
    out first past ``max_entries`` records or ``max_bytes`` encoded bytes."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
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
        while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped

    def drop(self, keys: Any) -> None:
        """Forget ``keys`` (an iterable of store keys)."""
        for key in keys:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
