"""The Redis work queue: sorted sets per lane, a processing list per worker, a delayed
zset.

Key layout (:class:`~axengine.queue.QueueKeys`, prefix ``ax`` by default)::

    {prefix}:lane:{lane}           zset   score = -priority, member = position + item
    {prefix}:since:{lane}          zset   the same members, score = enqueue time (server)
    {prefix}:position              string counter ordering equal priorities (FIFO)
    {prefix}:processing:{worker}   list   items a worker popped and has not acked
    {prefix}:delayed               zset   member = encoded item, score = due (server time)
    {prefix}:workers               set    workers that may hold a processing list
    {prefix}:lanes                 set    lanes ever enqueued to (read by ``queued``)
    {prefix}:wake                  list   one token per item made poppable (wakes ``pop``)

Every multi-key change is one Lua script (atomic on the server); the scripts derive lane
keys from the lane name encoded in each item, so in a Redis Cluster the prefix must be a
hash tag (``{ax}``). Due and enqueue times come from the server clock (``TIME``), so
workers with skewed clocks agree on when a delayed item is due and how long one waited.

A lane key written by an earlier version is a list of three-field items; the first
script that touches it turns it into a sorted set (priority 0, oldest first).

``pop`` first runs one script that releases due delayed items and moves the next item
(the oldest one waiting ``aging`` seconds, else the head of the first non-empty lane:
highest priority, then lowest position) into the processing list. Redis has no
blocking move over several sorted sets, so when every lane is empty ``pop`` blocks with
``BLPOP`` on the wake-up list for at most ``poll_interval`` seconds, then tries the
script again, until the timeout. Every item made poppable (enqueue, requeue, recover)
pushes a token to that list, so an item in any lane wakes a waiting ``pop`` at once; a
delayed item that becomes due is seen at most ``poll_interval`` late. Every move stays a
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

# Shared Lua helpers. Every script sets LANE, SINCE (key prefixes a lane name is appended
# to) and POS (the position counter) first. A lane is a sorted set: score = -priority,
# member = 16 hex digits of position + encoded item, so equal priorities pop in position
# order (Redis orders equal scores by member). Enqueued items take ORIGIN + n, items put
# back at the front ORIGIN - n, n from one counter. SINCE holds the same members scored
# by the time they started waiting (server clock).
_COMMON = """
local SEP = '\\031'
local ORIGIN = 4503599627370496
local LANE, SINCE, POS
local function fields(item)
  local out, start = {}, 1
  while true do
    local sep = string.find(item, SEP, start, true)
    if sep == nil then out[#out + 1] = string.sub(item, start) return out end
    out[#out + 1] = string.sub(item, start, sep - 1)
    start = sep + 1
  end
end
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function add(lane, item, front, since)
  local n = redis.call('INCR', POS)
  local member = string.format('%016x', front and ORIGIN - n or ORIGIN + n) .. item
  redis.call('ZADD', LANE .. lane, 0 - (tonumber(fields(item)[4]) or 0), member)
  redis.call('ZADD', SINCE .. lane, since, member)
end
-- The lane's key, after turning a list written by an earlier version into a sorted set
-- (oldest first; they start waiting now).
local function ready(lane, t)
  local key = LANE .. lane
  if redis.call('TYPE', key).ok == 'list' then
    local old = redis.call('LRANGE', key, 0, -1)
    redis.call('DEL', key)
    for i = #old, 1, -1 do add(lane, old[i], false, t) end
  end
  return key
end
-- Put an encoded item in its lane; its lane, or nil for a malformed item.
local function put(item, front, since)
  local f = fields(item)
  if #f < 3 then return nil end
  ready(f[1], since)
  add(f[1], item, front, since)
  return f[1]
end
-- Remove one item of the same lane, task and node (any priority) from a processing list.
local function unhold(key, item)
  local f = fields(item)
  local ident = f[1] .. SEP .. f[2] .. SEP .. f[3]
  for _, held in ipairs(redis.call('LRANGE', key, 0, -1)) do
    if held == ident or string.sub(held, 1, #ident + 1) == ident .. SEP then
      return redis.call('LREM', key, 1, held)
    end
  end
  return 0
end
"""

# KEYS: delayed, processing, workers, lanes-set, position
# ARGV: lane prefix, since prefix, worker id, release batch, aging ('' = none), lanes...
_POP = _COMMON + """
LANE, SINCE, POS = ARGV[1], ARGV[2], KEYS[5]
local t = now()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', t, 'WITHSCORES', 'LIMIT', 0,
                       tonumber(ARGV[4]))
for i = 1, #due, 2 do
  local lane = put(due[i], false, tonumber(due[i + 1]))
  if lane ~= nil then redis.call('SADD', KEYS[4], lane) end
  redis.call('ZREM', KEYS[1], due[i])
end
redis.call('SADD', KEYS[3], ARGV[3])
local lane, member
if ARGV[5] ~= '' then
  local oldest = t - tonumber(ARGV[5])
  for i = 6, #ARGV do
    ready(ARGV[i], t)
    local first = redis.call('ZRANGE', SINCE .. ARGV[i], 0, 0, 'WITHSCORES')
    if first[1] and tonumber(first[2]) <= oldest then
      lane, member, oldest = ARGV[i], first[1], tonumber(first[2])
    end
  end
end
if lane == nil then
  for i = 6, #ARGV do
    local head = redis.call('ZRANGE', ready(ARGV[i], t), 0, 0)
    if head[1] then lane, member = ARGV[i], head[1] break end
  end
end
if lane ~= nil then
  redis.call('ZREM', LANE .. lane, member)
  redis.call('ZREM', SINCE .. lane, member)
  local item = string.sub(member, 17)
  redis.call('LPUSH', KEYS[2], item)
  return {'item', item}
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then return {'wait', tostring(tonumber(nxt[2]) - t)} end
return {'empty', ''}
"""

# Items acknowledged by an enqueue: KEYS[first..] are the processing lists, ARGV[first..]
# the items, one each (see RedisQueue.enqueue).
_UNHOLD_ALL = """
local function unhold_all(first, n)
  for i = 0, n - 1 do unhold(KEYS[first + i], ARGV[first + i]) end
end
"""

# KEYS: lanes-set, wake, position, then one processing list per ack.
# ARGV: lane prefix, since prefix, wake max, then one item per ack, then the items.
_ENQUEUE = _COMMON + _UNHOLD_ALL + """
LANE, SINCE, POS = ARGV[1], ARGV[2], KEYS[3]
unhold_all(4, #KEYS - 3)
local t = now()
for i = #KEYS + 1, #ARGV do
  local lane = put(ARGV[i], false, t)
  if lane ~= nil then
    redis.call('SADD', KEYS[1], lane)
    redis.call('LPUSH', KEYS[2], '1')
  end
end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return #ARGV - #KEYS
"""

# KEYS: delayed, then one processing list per ack.
# ARGV: delay seconds, then one item per ack, then the encoded items.
_SCHEDULE = _COMMON + _UNHOLD_ALL + """
unhold_all(2, #KEYS - 1)
local due = now() + tonumber(ARGV[1])
for i = #KEYS + 1, #ARGV do redis.call('ZADD', KEYS[1], due, ARGV[i]) end
return #ARGV - #KEYS
"""

# KEYS: processing.  ARGV: item
_ACK = _COMMON + """
return unhold(KEYS[1], ARGV[1])
"""

# KEYS: processing, delayed, lanes-set, wake, position
# ARGV: lane prefix, since prefix, item, delay seconds
_REQUEUE = _COMMON + """
LANE, SINCE, POS = ARGV[1], ARGV[2], KEYS[5]
unhold(KEYS[1], ARGV[3])
local delay = tonumber(ARGV[4])
if delay > 0 then
  redis.call('ZADD', KEYS[2], now() + delay, ARGV[3])
else
  local lane = put(ARGV[3], true, now())
  if lane ~= nil then
    redis.call('SADD', KEYS[3], lane)
    redis.call('LPUSH', KEYS[4], '1')
  end
end
return 1
"""

# KEYS: processing, workers, lanes-set, wake, position
# ARGV: lane prefix, since prefix, worker id
# LPOP takes the most recently popped item first; each goes in front of the previous
# one, so items come back oldest popped first.
_RECOVER = _COMMON + """
LANE, SINCE, POS = ARGV[1], ARGV[2], KEYS[5]
local t = now()
local n = 0
while true do
  local item = redis.call('LPOP', KEYS[1])
  if not item then break end
  local lane = put(item, true, t)
  if lane ~= nil then
    redis.call('SADD', KEYS[3], lane)
    redis.call('LPUSH', KEYS[4], '1')
    n = n + 1
  end
end
redis.call('SREM', KEYS[2], ARGV[3])
return n
"""

# KEYS: lanes-set, delayed, workers, position.
# ARGV: lane prefix, since prefix, processing key prefix
# One script so the answer is a consistent snapshot: an item moving from a lane into a
# processing list cannot be missed by reading the two keys at different moments.
_QUEUED = _COMMON + """
LANE, SINCE, POS = ARGV[1], ARGV[2], KEYS[4]
local t = now()
local out = {}
local function add_all(list, skip)
  for _, v in ipairs(list) do out[#out + 1] = string.sub(v, skip + 1) end
end
for _, lane in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  add_all(redis.call('ZRANGE', ready(lane, t), 0, -1), 16)
end
add_all(redis.call('ZRANGE', KEYS[2], 0, -1), 0)
for _, worker in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  add_all(redis.call('LRANGE', ARGV[3] .. worker, 0, -1), 0)
end
return out
"""

# KEYS: position.  ARGV: lane prefix, since prefix, lane
_DEPTH = _COMMON + """
LANE, SINCE, POS = ARGV[1], ARGV[2], KEYS[1]
return redis.call('ZCARD', ready(ARGV[3], now()))
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
        self._since_prefix = self._keys.since("")
        self._pop = self._client.register_script(_POP)
        self._enqueue = self._client.register_script(_ENQUEUE)
        self._schedule = self._client.register_script(_SCHEDULE)
        self._ack = self._client.register_script(_ACK)
        self._requeue = self._client.register_script(_REQUEUE)
        self._recover = self._client.register_script(_RECOVER)
        self._queued = self._client.register_script(_QUEUED)
        self._depth = self._client.register_script(_DEPTH)

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

    async def enqueue(self, items: Sequence[WorkItem], *, delay: float = 0.0,
                      acks: Sequence[tuple[str, WorkItem]] = ()) -> None:
        """Append items to their lanes, or schedule them ``delay`` seconds from now.

        Args:
            items: Items to add, in order; each goes to ``item.lane``.
            delay: Seconds (server clock) before the items become visible to ``pop``.
            acks: ``(worker_id, item)`` pairs acknowledged (as :meth:`ack`) in the same
                script: one round trip for both.

        Raises:
            QueueError: Redis failed or the queue is closed. After a connection error the
                items may or may not have been written.
        """
        self._check_open()
        if not items and not acks:
            return
        held_keys = [self._keys.processing(worker_id) for worker_id, _ in acks]
        args = [*(item.encode() for _, item in acks), *(i.encode() for i in items)]
        with _map_errors("enqueue"):
            if delay > 0:
                await self._schedule(keys=[self._keys.delayed(), *held_keys],
                                     args=[delay, *args])
                return
            await self._enqueue(
                keys=[self._keys.lanes(), self._keys.wake(), self._keys.position(),
                      *held_keys],
                args=[self._lane_prefix, self._since_prefix, WAKE_MAX, *args])

    async def pop(
        self,
        worker_id: str,
        *,
        lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        timeout: float = 1.0,
        aging: float | None = None,
    ) -> WorkItem | None:
        """Move the next item into ``worker_id``'s processing list and return it: the
        oldest item that has waited ``aging`` seconds (server clock), else the head of
        the first non-empty lane (highest priority, then oldest). Due delayed items are
        released first.

        Args:
            worker_id: Owner of the processing list the item moves into.
            lanes: Lanes to serve, preferred first.
            timeout: Seconds to wait for an item; 0 returns after one attempt.
            aging: Seconds after which a waiting item is served before every lane and
                priority; None: never.

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
                       self._keys.lanes(), self._keys.position()]
        script_args: list[Any] = [self._lane_prefix, self._since_prefix, worker_id,
                                  RELEASE_BATCH, "" if aging is None else max(aging, 0.0),
                                  *lanes]
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
        """Remove one occurrence of ``item`` (same lane, task and node, any priority)
        from ``worker_id``'s processing list (a no-op when the worker does not hold it).

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("ack"):
            await self._ack(keys=[self._keys.processing(worker_id)], args=[item.encode()])

    async def requeue(self, worker_id: str, item: WorkItem, *, delay: float = 0.0) -> None:
        """Atomically move ``item`` from the processing list to the front of its priority
        in its lane, or into the delayed set ``delay`` seconds from now (server clock).

        The item is scheduled even if the worker no longer holds it (e.g. after FLUSHALL):
        a duplicate is harmless, a lost item waits for the reconciler.

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("requeue"):
            await self._requeue(
                keys=[self._keys.processing(worker_id), self._keys.delayed(),
                      self._keys.lanes(), self._keys.wake(), self._keys.position()],
                args=[self._lane_prefix, self._since_prefix, item.encode(), max(delay, 0.0)],
            )

    async def recover(self, worker_id: str) -> int:
        """Atomically move ``worker_id``'s processing list back to the front of their
        priorities in their lanes, oldest popped first, and forget the worker; return how
        many items moved.

        Raises:
            QueueError: Redis failed or the queue is closed.
        """
        self._check_open()
        with _map_errors("recover"):
            moved = await self._recover(
                keys=[self._keys.processing(worker_id), self._keys.workers(),
                      self._keys.lanes(), self._keys.wake(), self._keys.position()],
                args=[self._lane_prefix, self._since_prefix, worker_id],
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
                keys=[self._keys.lanes(), self._keys.delayed(), self._keys.workers(),
                      self._keys.position()],
                args=[self._lane_prefix, self._since_prefix, self._processing_prefix],
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
            return int(await self._depth(keys=[self._keys.position()],
                                         args=[self._lane_prefix, self._since_prefix, lane]))

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
