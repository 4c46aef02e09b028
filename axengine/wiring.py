"""The one place concrete backends are built from configuration."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from axengine import tracing
from axengine.config import AxConfig
from axengine.credentials import redact_url
from axengine.engine import Engine, EngineConfig
from axengine.errors import InputError
from axengine.queue import WorkQueue
from axengine.store import StateStore

if TYPE_CHECKING:
    from axengine.metrics import AxMetrics

__all__ = ["Runtime", "build_runtime", "open_queue", "open_store"]


def open_store(url: str) -> StateStore:
    """``sqlite:///path`` → SqliteStore; ``etcd://host:port`` → EtcdStore."""
    if url.startswith("sqlite:"):
        from axengine.store.embedded import SqliteStore

        return SqliteStore.from_url(url)
    if url.startswith(("etcd:", "etcds:")):
        from axengine.store.etcd import EtcdStore

        return EtcdStore.from_url(url)
    raise InputError(f"unsupported store URL {redact_url(url)!r}: use sqlite:///path or etcd://host:2379")


def open_queue(url: str) -> WorkQueue:
    """``memory://`` → InProcessQueue; ``redis://host:port/db`` → RedisQueue."""
    if url in ("memory://", "memory:", ""):
        from axengine.queue.inprocess import InProcessQueue

        return InProcessQueue()
    if url.startswith(("redis:", "rediss:")):
        from axengine.queue.redis import RedisQueue

        return RedisQueue.from_url(url)
    raise InputError(f"unsupported queue URL {redact_url(url)!r}: use memory:// or redis://host:6379/0")


@dataclass
class Runtime:
    """A wired engine with the backends it owns (the engine owns the blob directory)."""

    config: AxConfig
    store: StateStore
    queue: WorkQueue
    engine: Engine

    async def close(self) -> None:
        await self.queue.close()
        await self.store.close()


def build_runtime(config: AxConfig, *, engine_config: EngineConfig | None = None,
                  metrics: AxMetrics | None = None,
                  clock: Callable[[], float] = time.time) -> Runtime:
    """Build store, queue and engine from ``config``.

    Args:
        config: Where the store, queue and blobs live, and the key prefix.
        engine_config: Engine tunables.
        metrics: When given, every store transaction is timed into its
            ``ax_snapshot_write_seconds`` (:meth:`AxMetrics.wrap_store`).
        clock: The engine's time (epoch seconds).

    The engine emits task spans when this process traces (:func:`axengine.tracing.current`).
    """
    store = open_store(config.resolved_store_url)
    if metrics is not None:
        store = metrics.wrap_store(store)
    queue = open_queue(config.queue_url)
    engine = Engine(store=store, queue=queue, blob_dir=config.resolved_blob_dir,
                    prefix=config.prefix, config=engine_config, clock=clock)
    tracing.current().attach(engine)
    return Runtime(config=config, store=store, queue=queue, engine=engine)
