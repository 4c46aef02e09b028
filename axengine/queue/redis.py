"""The Redis work queue: lists per lane, a processing list per worker, a delayed zset.

Key layout (:class:`~axengine.queue.QueueKeys`, prefix ``ax`` by default)::

    {prefix}:lane:{lane}           list   LPUSH at the tail, consumed from the right
    {prefix}:processing:{worker}   list   items a worker popped and has not acked
    {prefix}:delayed               zset   member = encoded item, score = due (server time)
    {prefix}:workers               set    workers that may hold a processing list
    {prefix}:lanes                 set    lanes ever enqueued to (read by ``queued``)
    {prefix}:wake                  list   one token per item made poppable (wakes ``pop``)

Every multi-key change is one Lua script (atomic on the server); the scripts derive lane
keys from the lane name encoded in each item, so in a Redis Cluster the prefix must be a
hash tag (``{ax}``). Due times come from the server clock (``TIME``), so workers with
skewed clocks agree on when a delayed item is due.

``pop`` first runs one script that releases due delayed items and moves the head of the
first non-empty lane into the processing list. Redis has no blocking move over several
source lists, so when every lane is empty ``pop`` blocks with ``BLPOP`` on the wake-up
list for at most ``poll_interval`` seconds, then tries the script again, until the
timeout. Every item made poppable (enqueue, requeue, recover) pushes a token to that
list, so an item in any lane wakes a waiting ``pop`` at once;
a delayed item that becomes due is seen at most ``poll_interval`` late. Every move stays a
server-side atomic move, so a crash never drops a popped item between two commands.

Credentials: the password comes from the URL or from ``password_file``, which is read for
every new connection (a redis-py credential provider), so a rotated password needs no
restart. A refused password, a missing one, or an ACL user without the needed permission
raises a non-retryable :class:`~axengine.errors.QueueError` saying which; redis-py's
messages never contain the password, and neither do ours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.credentials import CredentialProvider
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

from axengine.errors import QueueError
from axengine.queue._keys import QueueKeys
from axengine.queue._protocol import DEFAULT_LANE, FAST_LANE, WorkItem
from axengine.queue.settings import RedisSettings

__all__ = ["RedisQueue"]

T = TypeVar("T")

#: Most due delayed items one ``pop`` releases into their lanes (bounds script time).
RELEASE_BATCH = 1000
#: Shortest blocking wait sent to Redis; ``BLPOP ... 0`` would block forever.
_MIN_BLOCK = 0.001
#: Longest wake-up list kept; extra tokens only cause a spurious (cheap) wake-up.
WAKE_MAX = 10_000

# Shared Lua helper: the lane of an encoded item is the text before the first \x1f.
_LANE_OF = """
local function lane_of(item)
  local sep = string.find(item, '\\031', 1, true)
  if sep == nil then return nil end
  return string.sub(item, 1, sep - 1)
end
"""

# KEYS: delayed, processing, workers, lanes-set, lane keys in priority order...
# ARGV: lane key prefix, worker id, release batch size
_POP = _LANE_OF + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for _, item in ipairs(due) do
  local lane = lane_of(item)
  if lane ~= nil then
    redis.call('LPUSH', ARGV[1] .. lane, item)
    redis.call('SADD', KEYS[4], lane)
  end
  redis.call('ZREM', KEYS[1], item)
end
redis.call('SADD', KEYS[3], ARGV[2])
for i = 5, #KEYS do
  local item = redis.call('LMOVE', KEYS[i], KEYS[2], 'RIGHT', 'LEFT')
  if item then return {'item', item} end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then return {'wait', tostring(tonumber(nxt[2]) - now)} end
return {'empty', ''}
"""

# KEYS: delayed.  ARGV: delay seconds, encoded items...
_SCHEDULE = """
local t = redis.call('TIME')
local due = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], due, ARGV[i]) end
return #ARGV - 1
"""

# KEYS: processing, lane, delayed, lanes-set, wake.  ARGV: item, delay seconds, lane name
_REQUEUE = """
redis.call('LREM', KEYS[1], 1, ARGV[1])
local delay = tonumber(ARGV[2])
if delay > 0 then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[3], tonumber(t[1]) + tonumber(t[2]) / 1000000 + delay, ARGV[1])
else
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('SADD', KEYS[4], ARGV[3])
  redis.call('LPUSH', KEYS[5], '1')
end
return 1
"""

# KEYS: processing, workers, lanes-set, wake.  ARGV: lane key prefix, worker id
# LPOP takes the most recently popped item first; RPUSH-ing in that order leaves the
# oldest at the consuming (right) end, so items come back oldest first.
_RECOVER = _LANE_OF + """
local n = 0
while true do
  local item = redis.call('LPOP', KEYS[1])
  if not item then break end
  local lane = lane_of(item)
  if lane ~= nil then
    redis.call('RPUSH', ARGV[1] .. lane, item)
    redis.call('SADD', KEYS[3], lane)
    redis.call('LPUSH', KEYS[4], '1')
    n = n + 1
  end
end
redis.call('SREM', KEYS[2], ARGV[2])
return n
"""

# KEYS: lanes-set, delayed, workers.  ARGV: lane key prefix, processing key prefix
# One script so the answer is a consistent snapshot: an item moving from a lane into a
# processing list cannot be missed by reading the two keys at different moments.
_QUEUED = """
local out = {}
local function add(list) for _, v in ipairs(list) do out[#out + 1] = v end end
for _, lane in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  add(redis.call('LRANGE', ARGV[1] .. lane, 0, -1))
end
add(redis.call('ZRANGE', KEYS[2], 0, -1))
for _, worker in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  add(redis.call('LRANGE', ARGV[2] .. worker, 0, -1))
end
return out
"""


class RedisQueue:
    """A :class:`~axengine.queue.WorkQueue` on Redis lists (the reliable-queue pattern).

    Args:
        settings: Where Redis is and the queue's key prefix and poll interval.
        client: An existing ``redis.asyncio.Redis`` to use instead of connecting from
            ``settings`` (only ``prefix`` and ``poll_interval`` are then read from
            ``settings``; the caller keeps ownership and closes it).

    Example:
        >>> queue = RedisQueue.from_url("redis://localhost:6379/0?prefix=ax")
    """

    def __init__(
        self,
        *,
        settings: RedisSettings | None = None,
        client: aioredis.Redis | None = None,
    ) -> None:
        self._settings = settings or RedisSettings()
        self._keys = QueueKeys(prefix=self._settings.prefix)
        self._owns_client = client is None
        self._client = client if client is not None else _connect(self._settings)
        self._closed = False
        # Pops in flight; close() lets them notice ``_closed`` and finish their current
        # blocking slice before the connections are closed under them.
        self._pops = 0
        self._no_pops = asyncio.Event()
        self._no_pops.set()
        # Key prefixes the scripts append a lane name or worker id to.
        self._lane_prefix = self._keys.lane("")
        self._processing_prefix = self._keys.processing("")
        self._pop = self._client.register_script(_POP)
        self._schedule = self._client.register_script(_SCHEDULE)
        self._requeue = self._client.register_script(_REQUEUE)
        self._recover = self._client.register_script(_RECOVER)
        self._queued = self._client.register_script(_QUEUED)

    @classmethod
    def from_url(cls, url: str) -> RedisQueue:
        """Connect to the queue at ``redis://host:6379/0?prefix=ax`` (see ``RedisSettings``)."""
        return cls(settings=RedisSettings.from_url(url))

    @property
    def keys(self) -> QueueKeys:
        """The key layout this queue writes."""
        return self._keys

    async def __aenter__(self) -> RedisQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def enqueue(self, items: Sequence[WorkItem], *, delay: float = 0.0) -> None:
        """Append items to their lanes, or schedule them ``delay`` seconds from now.

        Args:
            items: Items to add, in order; each goes to ``item.lane``.
            delay: Seconds (server clock) before the items become visible to ``pop``.

        Raises:
            QueueError: Redis failed or the queue is closed. After a connection error the
                items may or may not have been written.
        """
        self._check_open()
        if not items:
            return
        with _map_errors("enqueue"):
            if delay > 0:
                await self._schedule(keys=[self._keys.delayed()],
                                     args=[delay, *(i.encode() for i in items)])
                return
            by_lane: dict[str, list[str]] = {}
            for item in items:
                by_lane.setdefault(item.lane, []).append(item.encode())
            async with self._client.pipeline(transaction=True) as pipe:
                for lane, encoded in by_lane.items():
                    pipe.lpush(self._keys.lane(lane), *encoded)
                pipe.sadd(self._keys.lanes(), *by_lane)
                pipe.lpush(self._keys.wake(), *(["1"] * len(items)))
                pipe.ltrim(self._keys.wake(), 0, WAKE_MAX - 1)
                await pipe.execute()

    async def pop(
        self,
        worker_id: str,
        *,
        lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        timeout: float = 1.0,
    ) -> WorkItem | None:
        """Move the oldest item of the first non-empty lane into ``worker_id``'s
        processing list and return it, releasing due delayed items first.

        Args:
            worker_id: Owner of the processing list the item moves into.
            lanes: Lanes to serve, highest priority first.
            timeout: Seconds to wait for an item; 0 returns after one attempt.

        Returns:
            The item, or None when nothing arrived in time or the queue was closed while
            waiting.

        Raises:
            QueueError: Redis failed, or the queue was already closed.
            ValueError: ``lanes`` is empty.
        """
        self._check_open()
        if not lanes:
            raise ValueError("pop needs at least one lane, e.g. lanes=('fast', 'default')")
        deadline = time.monotonic() + max(timeout, 0.0)
        processing = self._keys.processing(worker_id)
        script_keys = [self._keys.delayed(), processing, self._keys.workers(),
                       self._keys.lanes(), *(self._keys.lane(lane) for lane in lanes)]
        script_args: list[Any] = [self._lane_prefix, worker_id, RELEASE_BATCH]
        self._pops += 1
        self._no_pops.clear()
        try:
            with _map_errors("pop"):
                while True:
                    kind, value = await self._pop(keys=script_keys, args=script_args)
                    if kind in (b"item", "item"):  # bytes, or str with decode_responses
                        return _decode(value)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed:
                        return None
                    block = min(remaining, self._settings.poll_interval)
                    if kind in (b"wait", "wait"):
                        block = min(block, float(value))
                    # Wait for a wake-up token (pushed with every item made poppable, in
                    # any lane), then let the script move the item atomically.
                    # Not blpop(): redis-py types its timeout as int, Redis takes a double.
                    await self._client.execute_command(  # type: ignore[no-untyped-call]
                        "BLPOP", self._keys.wake(), max(block, _MIN_BLOCK),
                    )
        except QueueError:
            if self._closed:
                return None  # closed while blocked: shutdown, not a failure
            raise
        finally:
            self._pops -= 1
            if not self._pops:
                self._no_pops.set()

    async def ack(self, worker_id: str, item: WorkItem) -> None:
        """Remove one occurrence of ``item`` from ``worker_id``'s processing list
        (a no-op when the worker does not hold it).

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("ack"):
            await self._client.lrem(self._keys.processing(worker_id), 1, item.encode())

    async def requeue(self, worker_id: str, item: WorkItem, *, delay: float = 0.0) -> None:
        """Atomically move ``item`` from the processing list to the front of its lane, or
        into the delayed set ``delay`` seconds from now (server clock).

        The item is scheduled even if the worker no longer holds it (e.g. after FLUSHALL):
        a duplicate is harmless, a lost item waits for the reconciler.

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("requeue"):
            await self._requeue(
                keys=[self._keys.processing(worker_id), self._keys.lane(item.lane),
                      self._keys.delayed(), self._keys.lanes(), self._keys.wake()],
                args=[item.encode(), max(delay, 0.0), item.lane],
            )

    async def recover(self, worker_id: str) -> int:
        """Atomically move ``worker_id``'s processing list back to the front of the lanes,
        oldest popped first, and forget the worker; return how many items moved.

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("recover"):
            moved = await self._recover(
                keys=[self._keys.processing(worker_id), self._keys.workers(),
                      self._keys.lanes(), self._keys.wake()],
                args=[self._lane_prefix, worker_id],
            )
        return int(moved)

    async def queued(self) -> set[tuple[str, str]]:
        """Every ``(task_id, node_id)`` in a lane, the delayed set or a processing list,
        read as one consistent snapshot.

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("queued"):
            raw = await self._queued(
                keys=[self._keys.lanes(), self._keys.delayed(), self._keys.workers()],
                args=[self._lane_prefix, self._processing_prefix],
            )
            items = [_decode(value) for value in raw]
        return {(item.task_id, item.node_id) for item in items}

    async def depth(self, lane: str) -> int:
        """Number of items waiting in ``lane`` (delayed and processing items excluded).

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("depth"):
            return int(await self._client.llen(self._keys.lane(lane)))

    async def workers(self) -> set[str]:
        """Ids of workers that may hold a processing list (candidates for ``recover``).

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("workers"):
            members = await self._client.smembers(self._keys.workers())
        return {m.decode() if isinstance(m, bytes) else str(m) for m in members}

    async def close(self) -> None:
        """Close the connections this queue opened; waiting ``pop`` calls return None.

        Waits for in-flight ``pop`` calls to end their current blocking slice (at most
        ``poll_interval``, or ``socket_timeout`` if Redis hangs) before closing.
        """
        if self._closed:
            return
        self._closed = True
        with suppress(TimeoutError):
            async with asyncio.timeout(self._settings.socket_timeout):
                await self._no_pops.wait()
        if self._owns_client:
            await self._client.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise QueueError("the Redis queue is closed; create a new RedisQueue")


class _Retry(Retry):
    """redis-py's ``Retry`` minus authentication errors (a ``ConnectionError`` subclass).

    Retrying a refused password cannot help, and redis-py 8.1 leaks the TLS socket of
    every retried login; the failed connection is closed once, then the error raised.
    """

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        def retryable(error: Exception) -> bool:
            if isinstance(error, AuthenticationError):
                return False
            return is_retryable is None or is_retryable(error)

        try:
            return await super().call_with_retry(do, fail, retryable, with_failure_count)
        except AuthenticationError as error:
            await (fail(error, 1) if with_failure_count else fail(error))
            raise


class _PasswordFile(CredentialProvider):
    """Credentials read from ``settings.password_file`` for each new connection."""

    def __init__(self, settings: RedisSettings) -> None:
        self._settings = settings

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        try:
            password = self._settings.read_password()
        except ValueError as exc:
            # A QueueError passes through redis-py's retries untouched: retrying cannot
            # make a missing file appear.
            raise _not_retryable(str(exc)) from None
        assert password is not None
        user = self._settings.username
        return (user, password) if user else (password,)

    async def get_credentials_async(self) -> tuple[str] | tuple[str, str]:
        return self.get_credentials()


def _connect(settings: RedisSettings) -> aioredis.Redis:
    retry = _Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), settings.retries)
    from_file = settings.password_file is not None
    return aioredis.Redis(
        host=settings.host,
        port=settings.port,
        db=settings.db,
        username=None if from_file else settings.username,
        password=None if from_file else settings.password,
        credential_provider=_PasswordFile(settings) if from_file else None,
        ssl=settings.ssl,
        ssl_ca_certs=settings.ssl_ca_certs,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        ssl_cert_reqs=settings.ssl_cert_reqs,
        ssl_check_hostname=settings.ssl_check_hostname,
        socket_timeout=settings.socket_timeout,
        socket_connect_timeout=settings.connect_timeout,
        retry=retry,
    )


def _not_retryable(message: str) -> QueueError:
    error = QueueError(message)
    error.retryable = False
    return error


def _decode(raw: Any) -> WorkItem:
    try:
        return WorkItem.decode(raw)
    except (ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise QueueError(f"malformed work item in Redis: {raw!r}") from exc


@contextmanager
def _map_errors(operation: str) -> Iterator[None]:
    """Turn redis-py and socket errors into :class:`QueueError` at the adapter edge."""
    try:
        yield
    except AuthenticationError as exc:
        text = str(exc).lower()
        # NOAUTH: no password was sent ("Authentication required", or HELLO refused).
        if "required" in text or "already authenticated" in text:
            hint = ("authentication required: the server has a password and the queue URL "
                    "gives none (redis://:PASSWORD@host or ?password_file=/path)")
        else:  # WRONGPASS, or a password sent to a server that has none
            hint = ("authentication failed: the server refused the user or password; "
                    "check the password (or password_file) of the queue URL")
        raise _not_retryable(f"Redis queue {operation} failed: {hint} ({exc})") from exc
    except NoPermissionError as exc:
        raise _not_retryable(
            f"Redis queue {operation} failed: the Redis user lacks permission ({exc}); its "
            "ACL must allow the queue's keys (~PREFIX:*) and commands (see docs/queues.md)"
        ) from exc
    except RedisError as exc:
        raise QueueError(f"Redis queue {operation} failed: {exc}") from exc
    except OSError as exc:
        raise QueueError(f"Redis queue {operation} failed: {exc}") from exc
