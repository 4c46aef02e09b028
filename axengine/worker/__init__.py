"""Workers: pop → claim → run → heartbeat → complete, and the handler context.

``Executor``/``serve`` (the ``ax executor`` process: Redis queue + gRPC engine client)
are loaded lazily so the embedded engine does not import grpc.
"""

from __future__ import annotations

from typing import Any

from axengine.worker._context import EngineClient, RunContext
from axengine.worker._worker import DependencyRamp, Worker

__all__ = [
    "DependencyRamp",
    "EngineClient",
    "Executor",
    "ExecutorSettings",
    "RunContext",
    "ShutdownReport",
    "Worker",
    "serve",
]

_PROCESS = ("Executor", "ExecutorSettings", "ShutdownReport", "serve")


def __getattr__(name: str) -> Any:
    if name in _PROCESS:
        from axengine.worker import _process

        return getattr(_process, name)
    raise AttributeError(f"module 'axengine.worker' has no attribute {name!r}")
