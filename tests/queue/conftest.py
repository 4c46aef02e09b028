"""Fixtures for the work-queue tests: a fresh queue per test, in-process or on Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest
import redis.asyncio as aioredis

from axengine.queue import InProcessQueue, RedisSettings, WorkQueue
from axengine.queue.redis import RedisQueue
from tests.servers import Server

Scenario = Callable[[WorkQueue], Awaitable[None]]


@dataclass
class QueueHarness:
    """Opens queues of one backend; every Redis queue of a harness shares its prefix.

    Clients are bound to the event loop they first run in, so queues are opened inside
    the test's ``asyncio.run`` (``run`` does that for single-queue scenarios).
    """

    backend: str
    server: Server | None = None
    prefix: str = ""

    def settings(self, **overrides: Any) -> RedisSettings:
        assert self.server is not None, "only Redis harnesses have settings"
        base = RedisSettings.from_url(f"{self.server.url}/0?prefix={self.prefix}")
        return replace(base, **overrides)

    @asynccontextmanager
    async def open(self, **overrides: Any) -> AsyncIterator[WorkQueue]:
        if self.backend == "inprocess":
            async with InProcessQueue() as queue:
                yield queue
            return
        async with RedisQueue(settings=self.settings(**overrides)) as queue:
            yield queue
        await self.cleanup()

    def run(self, scenario: Scenario) -> None:
        async def main() -> None:
            async with self.open() as queue:
                await scenario(queue)

        asyncio.run(main())

    async def cleanup(self, db: int = 0) -> None:
        """Delete this harness's keys in ``db``, then prove nothing is left (as aetcd's
        suite does)."""
        assert self.server is not None
        client = aioredis.Redis.from_url(f"{self.server.url}/{db}")
        try:
            keys = [key async for key in client.scan_iter(match=f"{self.prefix}:*")]
            if keys:
                await client.delete(*keys)
            assert [key async for key in client.scan_iter(match=f"{self.prefix}:*")] == []
        finally:
            await client.aclose()


def _redis_harness(server: Server) -> QueueHarness:
    return QueueHarness("redis", server, prefix=f"axtest:{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["inprocess", "redis"])
def queues(request: pytest.FixtureRequest) -> QueueHarness:
    """A harness for each backend; Redis queues get a unique key prefix per test."""
    if request.param == "inprocess":
        return QueueHarness("inprocess")
    return _redis_harness(request.getfixturevalue("redis_server"))


@pytest.fixture
def redis_queues(redis_server: Server) -> QueueHarness:
    """A Redis-only harness with a unique key prefix."""
    return _redis_harness(redis_server)
