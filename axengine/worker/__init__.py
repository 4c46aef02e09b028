"""Workers: pop → claim → run → heartbeat → complete, and the handler context."""

from __future__ import annotations

from axengine.worker._context import EngineClient, RunContext
from axengine.worker._worker import DependencyRamp, Worker

__all__ = ["DependencyRamp", "EngineClient", "RunContext", "Worker"]
