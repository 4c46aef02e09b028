"""Work queues: the ``WorkQueue`` protocol, in-process and Redis implementations."""

from __future__ import annotations

from axengine.queue._protocol import DEFAULT_LANE, FAST_LANE, WorkItem, WorkQueue

__all__ = ["DEFAULT_LANE", "FAST_LANE", "WorkItem", "WorkQueue"]
