"""Workers: pop → claim → run → heartbeat → complete, and the handler context.

``Executor`` (a worker with graceful shutdown, used by every process shape that runs
nodes; see :mod:`axengine.process`) is loaded lazily.
"""

from __future__ import annotations

from typing import Any

from axengine.worker._context import EngineClient, FencedOut, RunContext
from axengine.worker._runner import (
    THREAD,
    Reported,
    Runner,
    ThreadRunner,
    checked_outcome,
    stopped,
    timed_out,
)
from axengine.worker._worker import Worker

__all__ = [
    "THREAD",
    "EngineClient",
    "Executor",
    "FencedOut",
    "Reported",
    "RunContext",
    "Runner",
    "ShutdownReport",
    "ThreadRunner",
    "Worker",
    "checked_outcome",
    "stopped",
    "timed_out",
]

_PROCESS = ("Executor", "ShutdownReport")


def __getattr__(name: str) -> Any:
    if name in _PROCESS:
        from axengine.worker import _process

        return getattr(_process, name)
    raise AttributeError(f"module 'axengine.worker' has no attribute {name!r}")
