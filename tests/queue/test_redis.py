"""Redis-only behaviour of the work queue: key layout, data loss, restarts, outages, URLs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import cast

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from axengine.errors import QueueError
from axengine.queue import DEFAULT_LANE, FAST_LANE, QueueKeys, RedisSettings, WorkItem
from axengine.queue.redis import RedisQueue
from tests.queue.conftest import QueueHarness
from tests.servers import Server

A = WorkItem(task_id="t1", node_id="a")
B = WorkItem(task_id="t1", node_id="b", lane=FAST_LANE)
C = WorkItem(task_id="t2", node_id="c")


def raw_client(server: Server) -> aioredis.Redis:
    return aioredis.Redis.from_url(server.url)


def test_key_layout_matches_queue_keys(redis_queues: QueueHarness, redis_server: Server) -> None:
    keys = QueueKeys(prefix=redis_queues.prefix)

    async def main() -> None:
        client = raw_client(redis_server)
        try:
            async with redis_queues.open() as queue:
                await queue.enqueue([A, B])
                await queue.enqueue([C], delay=60)
                assert await queue.pop("w1", timeout=0) == B
                assert await client.type(keys.lane(DEFAULT_LANE)) == b"zset"
                # Member = 16 hex digits of position + the encoded item; score = -priority.
                members = cast(list[tuple[bytes, float]], await client.zrange(
                    keys.lane(DEFAULT_LANE), 0, -1, withscores=True))
                assert [(m[16:], score) for m, score in members] == [(A.encode().encode(), 0)]
                member = members[0][0]
                assert await client.zrange(keys.since(DEFAULT_LANE), 0, -1) == [member]
                assert await client.lrange(keys.processing("w1"), 0, -1) == [B.encode().encode()]
                assert await client.zrange(keys.delayed(), 0, -1) == [C.encode().encode()]
                assert await client.smembers(keys.workers()) == {b"w1"}
                assert await client.smembers(keys.lanes()) == {b"default", b"fast"}
                due = await client.zscore(keys.delayed(), C.encode())
                server_now = float((await client.time())[0])
                assert due is not None and 55 < due - server_now <= 61  # server clock
        finally:
            await client.aclose()

    asyncio.run(main())


def test_another_process_recovers_a_dead_workers_items(redis_queues: QueueHarness) -> None:
    async def main() -> None:
        # Not the harness's open(): its exit would delete the keys the "dead" one leaves.
        async with RedisQueue(settings=redis_queues.settings()) as first:
            await first.enqueue([A, C])
            assert await first.pop("dead", timeout=0) == A
        async with redis_queues.open() as second:
            assert isinstance(second, RedisQueue)
            assert await second.workers() == {"dead"}
            assert await second.recover("dead") == 1
            assert await second.workers() == set()
            assert await second.pop("alive", timeout=0) == A
            assert await second.pop("alive", timeout=0) == C

    asyncio.run(main())


def test_works_again_after_flushall(redis_queues: QueueHarness, redis_server: Server) -> None:
    async def main() -> None:
        client = raw_client(redis_server)
        try:
            async with redis_queues.open() as queue:
                await queue.enqueue([A, B])
                await queue.enqueue([C], delay=60)
                assert await queue.pop("w", timeout=0) == B
                await client.flushall()
                # Everything is gone and nothing fails: the reconciler refills from the store.
                assert await queue.queued() == set()
                assert await queue.depth(DEFAULT_LANE) == 0
                assert await queue.pop("w", timeout=0) is None
                await queue.ack("w", B)
                assert await queue.recover("w") == 0
                # A requeue of an item lost by the flush still schedules it.
                await queue.requeue("w", B)
                assert await queue.pop("w", timeout=0) == B
                await queue.enqueue([A])
                assert await queue.pop("w", timeout=0) == A
                assert await queue.queued() == {("t1", "a"), ("t1", "b")}
        finally:
            await client.aclose()

    asyncio.run(main())


def test_scripts_reload_after_script_flush(
    redis_queues: QueueHarness, redis_server: Server
) -> None:
    async def main() -> None:
        client = raw_client(redis_server)
        try:
            async with redis_queues.open() as queue:
                await queue.enqueue([A])
                await client.script_flush()
                assert await queue.pop("w", timeout=0) == A
                assert await queue.recover("w") == 1
        finally:
            await client.aclose()

    asyncio.run(main())


def test_reconnects_after_server_restart(
    redis_queues: QueueHarness, redis_server: Server
) -> None:
    async def main() -> None:
        async with redis_queues.open() as queue:
            await queue.enqueue([A])
            assert await queue.pop("w", timeout=0) == A  # a pooled connection now exists
            redis_server.restart()  # no persistence: the data is gone
            assert await queue.queued() == set()
            await queue.enqueue([C])
            assert await queue.pop("w", timeout=0) == C
            await queue.ack("w", C)
            assert await queue.queued() == set()

    asyncio.run(main())


def test_queue_error_while_server_is_stopped(
    redis_queues: QueueHarness, redis_server: Server
) -> None:
    async def main() -> None:
        async with redis_queues.open() as queue:
            await queue.enqueue([A])
            redis_server.stop()
            try:
                start = time.monotonic()
                calls: list[Callable[[], Awaitable[object]]] = [
                    lambda: queue.enqueue([C]),
                    lambda: queue.enqueue([C], delay=1),
                    lambda: queue.pop("w", timeout=0.2),
                    lambda: queue.ack("w", A),
                    lambda: queue.requeue("w", A),
                    lambda: queue.recover("w"),
                    lambda: queue.queued(),
                    lambda: queue.depth(DEFAULT_LANE),
                ]
                for call in calls:
                    with pytest.raises(QueueError) as caught:
                        await call()
                    assert isinstance(caught.value.__cause__, RedisError)
                    assert caught.value.retryable
                assert time.monotonic() - start < 30  # bounded retries, not a hang
            finally:
                redis_server.start()
            assert await queue.depth(DEFAULT_LANE) == 0  # and it recovers once Redis is back

    asyncio.run(main())


def test_malformed_item_raises_queue_error(
    redis_queues: QueueHarness, redis_server: Server
) -> None:
    keys = QueueKeys(prefix=redis_queues.prefix)

    async def main() -> None:
        client = raw_client(redis_server)
        try:
            async with redis_queues.open() as queue:
                await client.lpush(keys.lane(DEFAULT_LANE), "not-an-item")
                with pytest.raises(QueueError, match="malformed"):
                    await queue.pop("w", timeout=0)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_from_url_builds_a_working_queue(redis_queues: QueueHarness) -> None:
    assert redis_queues.server is not None
    url = f"{redis_queues.server.url}/1?prefix={redis_queues.prefix}"

    async def main() -> None:
        async with RedisQueue.from_url(url) as queue:
            assert queue.keys == QueueKeys(prefix=redis_queues.prefix)
            await queue.enqueue([A])
            assert await queue.depth(DEFAULT_LANE) == 1
            assert await queue.pop("w", timeout=0) == A
            assert await queue.recover("w") == 1
            await queue.pop("w", timeout=0)
            await queue.ack("w", A)
            assert await queue.queued() == set()
        await redis_queues.cleanup(db=1)

    asyncio.run(main())


def test_uses_a_given_client_and_leaves_it_open(
    redis_queues: QueueHarness, redis_server: Server
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            queue = RedisQueue(settings=redis_queues.settings(), client=client)
            async with queue:
                await queue.enqueue([A])
                assert await queue.pop("w", timeout=0) == A
                assert await queue.workers() == {"w"}
                await queue.ack("w", A)
            assert await client.ping()  # closing the queue did not close the caller's client
        finally:
            await client.aclose()
        await redis_queues.cleanup()

    asyncio.run(main())


def test_settings_from_url_reads_every_part() -> None:
    settings = RedisSettings.from_url(
        "rediss://user:p%40ss@cache.example:6380/3?prefix=%7Bax%7D&socket_timeout=2.5"
        "&connect_timeout=1&retries=5&poll_interval=0.05"
    )
    assert settings == RedisSettings(
        host="cache.example", port=6380, db=3, username="user", password="p@ss", ssl=True,
        prefix="{ax}", socket_timeout=2.5, connect_timeout=1.0, retries=5,
        poll_interval=0.05,
    )
    assert "p@ss" not in repr(settings)


def test_settings_from_url_defaults() -> None:
    assert RedisSettings.from_url("redis://localhost") == RedisSettings()
    assert RedisSettings.from_url("redis://h:6379/0?prefix=ax").prefix == "ax"
    assert RedisSettings.from_url("redis://:secret@h").password == "secret"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h:6379/0", "unsupported Redis URL scheme"),
        ("redis://h:6379/zero", "invalid port or database"),
        ("redis://h:port/0", "invalid port or database"),
        ("redis://h/0?prefx=ax", "unknown option 'prefx'"),
        ("redis://h/0?retries=many", "retries='many' is not a valid int"),
        ("redis://h/0?poll_interval=9", "poll_interval"),
        ("redis://h/0?prefix=", "prefix must not be empty"),
    ],
)
def test_settings_from_url_rejects_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisSettings.from_url(url)


def test_settings_error_hides_password() -> None:
    with pytest.raises(ValueError) as caught:
        RedisSettings.from_url("http://u:hunter2@h/0")
    assert "hunter2" not in str(caught.value)
