"""The stand-in's storage and clockwork: objects under one global resourceVersion counter
with the event history watches replay, and a single controller thread for timers.

One lock (``Store.cond``) guards everything in the stand-in: API handlers, the controller
thread and process reapers all take it, so each change is one atomic step and every change
wakes whoever waits (watch streams, :meth:`KubeStandIn.wait_until`, the timer thread).
"""

from __future__ import annotations

import bisect
import copy
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tests.k8s._api import JSON, expired


class WatchDropped(Exception):
    """``drop_watches()`` was called: the stream must end without its last chunk."""


@dataclass(frozen=True)
class Event:
    rv: int
    type: str        #: ADDED / MODIFIED / DELETED
    plural: str
    namespace: str
    obj: JSON        #: a snapshot, never mutated


class Store:
    """Objects by (plural, namespace, name); every write bumps the one counter."""

    def __init__(self, check: Callable[[JSON], None] | None = None) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.rv = 0
        self.compacted = 0   #: history at or below this revision is gone
        self.drops = 0       #: bumped by drop_watches
        self.watching = 0    #: open watch streams
        self.closed = False
        self._objects: dict[tuple[str, str, str], JSON] = {}
        self._history: list[Event] = []
        self._check = check

    def get(self, plural: str, namespace: str, name: str) -> JSON | None:
        obj = self._objects.get((plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, plural: str, namespace: str | None) -> list[JSON]:
        return [copy.deepcopy(obj) for (p, ns, _), obj in sorted(self._objects.items())
                if p == plural and namespace in (None, ns)]

    def put(self, plural: str, obj: JSON) -> JSON:
        """Create or update ``obj``; returns the stored copy with its new resourceVersion."""
        meta = obj["metadata"]
        key = (plural, meta["namespace"], meta["name"])
        kind = "MODIFIED" if key in self._objects else "ADDED"
        return self._record(kind, key, obj)

    def remove(self, plural: str, namespace: str, name: str) -> JSON:
        key = (plural, namespace, name)
        obj = self._objects.pop(key)
        return self._record("DELETED", key, obj)

    def _record(self, kind: str, key: tuple[str, str, str], obj: JSON) -> JSON:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if self._check is not None:
            self._check(obj)
        if kind != "DELETED":
            self._objects[key] = obj
        self._history.append(Event(self.rv, kind, key[0], key[1], obj))
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def compact(self) -> int:
        """Forget the history up to now, as an etcd compaction does."""
        self.compacted = self.rv
        self._history.clear()
        return self.rv

    def watch(self, plural: str, namespace: str | None, match: Callable[[JSON], bool],
              since: int | None, deadline: float | None) -> Iterator[tuple[str, JSON]]:
        """``(type, object)`` pairs: history after ``since`` (or ADDED for what exists when
        ``since`` is None, as a watch without resourceVersion starts), then live changes,
        until ``deadline`` (monotonic) or close. A compacted ``since`` yields one ERROR with
        a 410 Status; :class:`WatchDropped` is raised when watches are dropped.
        """
        with self.cond:
            self.watching += 1
        try:
            yield from self._events(plural, namespace, match, since, deadline)
        finally:
            with self.cond:
                self.watching -= 1

    def _events(self, plural: str, namespace: str | None, match: Callable[[JSON], bool],
                since: int | None, deadline: float | None) -> Iterator[tuple[str, JSON]]:
        with self.cond:
            drops = self.drops
            if since is None:
                batch = [("ADDED", o) for o in self.list(plural, namespace) if match(o)]
                last = self.rv
            else:
                batch, last = [], since
        yield from batch
        while True:
            with self.cond:
                while True:
                    if self.closed:
                        return
                    if self.drops != drops:
                        raise WatchDropped
                    if last < self.compacted:
                        batch = [("ERROR", expired(last, self.compacted + 1).status)]
                        break
                    if self.rv > last:
                        start = bisect.bisect_right([e.rv for e in self._history], last)
                        batch = [(e.type, copy.deepcopy(e.obj)) for e in self._history[start:]
                                 if e.plural == plural and namespace in (None, e.namespace)
                                 and match(e.obj)]
                        last = self.rv
                        if batch:
                            break
                        continue
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return
                    self.cond.wait(remaining)
            yield from batch
            if batch[-1][0] == "ERROR":
                return


@dataclass(order=True)
class _Timer:
    due: float
    seq: int
    fn: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """One thread running callbacks when due, each under the store lock."""

    def __init__(self, cond: threading.Condition, run: Callable[[Callable[[], None]], None]):
        self._cond = cond
        self._run = run
        self._heap: list[_Timer] = []
        self._seq = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="k8s-standin-timers",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Timer:
        with self._cond:
            timer = _Timer(time.monotonic() + delay, next(self._seq), fn)
            heapq.heappush(self._heap, timer)
            self._cond.notify_all()
            return timer

    def call_soon(self, fn: Callable[[], None]) -> _Timer:
        return self.call_later(0, fn)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                while self._heap and self._heap[0].due <= now:
                    timer = heapq.heappop(self._heap)
                    if not timer.cancelled:
                        self._run(timer.fn)
                    now = time.monotonic()
                timeout = self._heap[0].due - now if self._heap else None
                self._cond.wait(timeout)
