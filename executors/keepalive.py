"""Liveness while a handler blocks: cancellation checks and paced heartbeats.

Shared by every handler that waits on something slow (a model call, a PDF download, a
vendor job); it depends on the contract only, like the handlers themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from executors.contract import NodeContext

__all__ = ["DEFAULT_HEARTBEAT_INTERVAL", "Keepalive"]

#: Seconds between heartbeats while a handler waits (setting ``heartbeat_interval``).
DEFAULT_HEARTBEAT_INTERVAL = 1.0


class Keepalive:
    """A callable that says whether a blocked call should keep going.

    Cancellation is checked on every call, but a heartbeat (a store write) is sent at
    most once per ``interval`` so fine-grained waiting loops stay cheap.
    """

    def __init__(
        self,
        ctx: NodeContext,
        *,
        interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ctx = ctx
        self._interval = interval
        self._clock = clock
        self._last = clock()

    def __call__(self) -> bool:
        """True while the run may continue; False once the fence is stale or cancelled."""
        if self._ctx.cancelled:
            return False
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            if not self._ctx.heartbeat():
                return False
        return not self._ctx.cancelled
