"""Work queues: the ``WorkQueue`` protocol, in-process and Redis implementations.

``InProcessQueue`` (embedded default) and ``RedisQueue`` (scaled out) implement the same
contract, checked by one conformance suite (``tests/queue/test_conformance.py``).
``RedisQueue`` is imported lazily so that using the embedded queue never imports redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from axengine.queue._keys import QueueKeys
from axengine.queue._protocol import (
    DEFAULT_AGING_SECONDS,
    DEFAULT_FAST_SHARE,
    DEFAULT_LANE,
    FAST_LANE,
    WorkItem,
    WorkQueue,
)
from axengine.queue.inprocess import InProcessQueue
from axengine.queue.settings import RedisSettings

if TYPE_CHECKING:
    from axengine.queue.redis import RedisQueue

__all__ = [
    "DEFAULT_AGING_SECONDS",
    "DEFAULT_FAST_SHARE",
    "DEFAULT_LANE",
    "FAST_LANE",
    "InProcessQueue",
    "QueueKeys",
    "RedisQueue",
    "RedisSettings",
    "WorkItem",
    "WorkQueue",
]


def __getattr__(name: str) -> Any:
    if name == "RedisQueue":
        from axengine.queue.redis import RedisQueue

        return RedisQueue
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
