"""etcd state store (scaled-out deployments), on aetcd 1.0.0.

:class:`EtcdStore` maps the :class:`~axengine.store.StateStore` contract one to one onto
etcd v3: ``txn`` is one etcd ``Txn`` (compares built with aetcd's compare values, reads
answered inside it) — or, while another of the store's requests is on its way, a nested
``Txn`` of one request that carries the transactions waiting with it
(:mod:`axengine.store._etcd_merge`), ``get_many`` is one read-only ``Txn`` so every key
comes from one revision, ``range`` is a ``Range`` over the prefix with etcd's key order
and ``limit``, and ``watch`` is an etcd watch (through :class:`aetcd.Watcher`) from a
start revision.

Why not ``aetcd.Client.transaction``/``get_prefix``: the contract needs each response's
header revision (``TxnResult.revision``), ``Range.limit`` and TLS, which aetcd's
``Client`` does not expose. The store therefore keeps its own gRPC channel and calls the
generated etcd stubs that aetcd ships (``aetcd.rpc``); compares are aetcd's
(``aetcd.transactions.Mod(key) == rev``) and watches use aetcd's ``Watcher``.

Failures are mapped at this edge (``raise ... from exc``): a server that cannot be
reached or does not answer within ``timeout`` raises
:class:`~axengine.errors.StoreUnavailable` (for ``txn`` the outcome is then unknown, as
with any etcd client: re-read before retrying); a compacted revision raises
:class:`~axengine.errors.RevisionCompacted`; a request etcd rejects as malformed (a key
written twice in one branch, an empty key) raises ``ValueError`` exactly as
:class:`~axengine.store.embedded.SqliteStore` does. Requests wait for the channel to be
ready (``wait_for_ready``) and gRPC reconnects within a second, so after an etcd
restart the next call succeeds without any action by the caller.

Authentication: with a user, the store logs in (``Auth.Authenticate``, password from the
URL or read from ``password_file`` at each login) and sends the token with every request
and watch. etcd forgets tokens on restart and expires idle ones (``--auth-token-ttl``);
a request refused with "invalid auth token" has not run, so the store logs in again and
sends it once more. A wrong password, a missing user or a missing permission raises a
non-retryable :class:`~axengine.errors.StoreError` that says which of the three it is;
no message carries the password.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from aetcd import rpc, transactions, utils
from aetcd.exceptions import ClientError, RevisionCompactedError, WatchTimeoutError
from aetcd.watcher import Watcher

from axengine.errors import RevisionCompacted, StoreError, StoreUnavailable
from axengine.store._etcd_merge import Merger
from axengine.store._protocol import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Op,
    Put,
    TxnResult,
    WatchEvent,
)
from axengine.store.settings import (
    DEFAULT_ETCD_TIMEOUT,
    DEFAULT_MAX_TXN_OPS,
    DEFAULT_MERGE_IN_FLIGHT,
    EtcdSettings,
)

__all__ = ["EtcdStore"]

#: gRPC channel options: reconnect quickly after an etcd restart (gRPC's default
#: backoff grows to two minutes) and accept large range responses.
_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 512 * 1024 * 1024),
    ("grpc.max_send_message_length", 512 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)

_COMPARES: dict[str, Any] = {
    "mod": transactions.Mod,
    "create": transactions.Create,
    "version": transactions.Version,
    "value": transactions.Value,
}
_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
#: Texts of etcd's authentication errors (rpctypes.ErrGRPCAuthFailed, ...).
_AUTH_ERRORS = ("authentication failed", "user name is empty", "invalid auth token")

_Status = grpc.StatusCode

#: Bytes of keys and values in one merged transaction request: well under etcd's
#: default ``--max-request-bytes`` (1.5 MiB). A request refused as too large anyway is
#: sent again as its transactions one by one.
MERGE_MAX_BYTES = 1 << 20


def _encode(key: str) -> bytes:
    return key.encode("utf-8")


def _span(key: str, prefix: bool) -> tuple[bytes, bytes | None]:
    """etcd's ``(key, range_end)`` for one key or every key under a prefix."""
    raw = _encode(key)
    if not prefix:
        return raw, None
    if not raw:
        return b"\0", b"\0"  # etcd: key "\0" with range_end "\0" means every key
    return raw, utils.prefix_range_end(raw)


def _kv(msg: Any) -> KeyValue:
    return KeyValue(
        bytes(msg.key).decode("utf-8"),
        bytes(msg.value),
        int(msg.create_revision),
        int(msg.mod_revision),
        int(msg.version),
    )


def _compare_message(compare: Compare) -> Any:
    builder = _COMPARES.get(compare.target)
    function = _OPERATORS.get(compare.op)
    if builder is None or function is None:
        raise ValueError(f"unknown compare {compare.target!r} {compare.op!r}")
    if not compare.key:
        raise ValueError("compare key must not be empty")
    if compare.target == "value":
        if not isinstance(compare.operand, bytes):
            raise TypeError(f"Value({compare.key!r}) compares with bytes, not an int")
    elif not isinstance(compare.operand, int):
        raise TypeError(f"{compare.target} revision of {compare.key!r} compares with int")
    # aetcd's compare values: `Mod(key) == 3` records the operator and operand.
    return function(builder(_encode(compare.key)), compare.operand).build_message()


def _request_op(op: Op) -> Any:
    if isinstance(op, Put):
        if not isinstance(op.value, bytes):
            raise TypeError(f"Put({op.key!r}) value must be bytes")
        return rpc.RequestOp(request_put=rpc.PutRequest(key=_encode(op.key), value=op.value))
    if isinstance(op, Delete):
        key, end = _span(op.key, op.prefix)
        delete = rpc.DeleteRangeRequest(key=key, range_end=end or b"")
        return rpc.RequestOp(request_delete_range=delete)
    if isinstance(op, Get):
        key, end = _span(op.key, op.prefix)
        return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, range_end=end or b""))
    raise TypeError(f"txn op must be Put, Delete or Get, not {type(op).__name__}")


def _map_rpc_error(exc: grpc.RpcError, where: str, user: str | None = None) -> Exception:
    """Translate a gRPC failure of a request to ``where`` (as ``user``) into ax's tree."""
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    details = (exc.details() if isinstance(exc, grpc.aio.AioRpcError) else None) or str(exc)
    if code in (_Status.UNAVAILABLE, _Status.DEADLINE_EXCEEDED, _Status.CANCELLED):
        return StoreUnavailable(f"etcd at {where} is unavailable: {details}")
    if code == _Status.OUT_OF_RANGE and "compacted" in details:
        return RevisionCompacted(f"etcd at {where}: {details}")
    error: StoreError
    # etcd reports a bad password or a missing token as INVALID_ARGUMENT, an expired
    # token as UNAUTHENTICATED; none of them is a malformed request of the caller.
    auth = any(text in details for text in _AUTH_ERRORS)
    if code in (_Status.UNAUTHENTICATED, _Status.PERMISSION_DENIED) or auth:
        error = StoreError(f"etcd at {where} refused the credentials: {_auth_hint(details, user)}")
        error.retryable = False
        return error
    if code == _Status.INVALID_ARGUMENT:
        if "too many operations" in details or "too large" in details:
            error = StoreError(
                f"etcd at {where} refused the request: {details}; start etcd with a larger "
                "--max-txn-ops / --max-request-bytes (see docs/stores.md)"
            )
            error.retryable = False
            return error
        return ValueError(f"etcd at {where} rejected the request: {details}")
    if code == _Status.RESOURCE_EXHAUSTED:
        return StoreError(f"etcd at {where} is out of resources (NOSPACE alarm?): {details}")
    return StoreError(f"etcd at {where} failed: {details}")


def _auth_hint(details: str, user: str | None) -> str:
    """What went wrong with the credentials, and what to change."""
    if "user name is empty" in details:
        return (f"authentication required ({details}); name a user in the store URL: "
                "etcd://user@host:2379?password_file=/path")
    if "authentication failed" in details:
        return (f"authentication failed for user {user!r} ({details}); check the user and "
                "the password (or password_file) of the store URL")
    if "permission denied" in details:
        return (f"user {user!r} lacks permission ({details}); grant its role readwrite on "
                "the key prefix: etcdctl role grant-permission ROLE --prefix=true readwrite /ax/")
    return details


class _WatchRefused(Exception):
    """etcd created and at once cancelled a watch (``cancel_reason`` says why)."""


class _Watcher(Watcher):  # type: ignore[misc]  # aetcd ships no types
    """aetcd's :class:`Watcher`, but a watch etcd refuses fails instead of hanging.

    etcd answers a watch it does not permit (a key range outside the user's roles, or an
    auth token that expired before the watch stream opened) with ``created`` and
    ``canceled`` set; aetcd 1.0.0 takes that for a live watch that never yields.
    """

    async def _handle_response(self, response: Any) -> None:
        if response.created and response.canceled:
            async with self._lock:
                if self._new_callback is not None:
                    reason = response.cancel_reason or "watch cancelled by etcd"
                    self._new_callback.error = _WatchRefused(reason)
                    self._new_callback_ready.notify_all()
            return
        await super()._handle_response(response)


async def _created(create: Awaitable[Any], watcher: Any) -> Any:
    """The watch ``create`` makes, seen through to the end even when the caller is
    cancelled meanwhile: aetcd creates one watch at a time and hands etcd's next
    "created" answer to whichever request is pending, so a creation abandoned half-way
    would give its answer — its watch id — to the next watch, whose events would then
    never arrive. A cancelled caller's watch is cancelled once it exists."""
    task = asyncio.ensure_future(create)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            callback = await asyncio.shield(task)
            await watcher.cancel(callback.watch_id)
        raise


def _map_client_error(exc: BaseException, where: str, user: str | None = None) -> Exception:
    """Translate what aetcd's watcher delivers (aetcd or gRPC errors)."""
    if isinstance(exc, _WatchRefused):
        error = StoreError(f"etcd at {where} refused the watch: {_auth_hint(str(exc), user)}")
        error.retryable = False
        return error
    if isinstance(exc, RevisionCompactedError):
        return RevisionCompacted(
            f"etcd at {where} compacted revisions below {exc.compacted_revision}; re-read "
            "the current state and watch from its revision"
        )
    if isinstance(exc, grpc.RpcError):
        return _map_rpc_error(exc, where, user)
    if isinstance(exc, WatchTimeoutError):
        return StoreUnavailable(f"etcd at {where} did not confirm the watch in time")
    cause = exc.__cause__
    if isinstance(exc, ClientError) and isinstance(cause, grpc.RpcError):
        return _map_rpc_error(cause, where, user)
    return StoreError(f"etcd at {where} failed: {exc!r}")


class _Connection:
    """One gRPC channel to one etcd member, its KV stub, auth token and watch stream."""

    def __init__(self, target: str, channel: Any, metadata: Any, timeout: float) -> None:
        self.target = target
        self.channel = channel
        self.metadata = metadata
        self.kv = rpc.KVStub(channel)
        self.watcher = _Watcher(rpc.WatchStub(channel), timeout=timeout, metadata=metadata)

    async def close(self) -> None:
        # Shutting the watcher down ends its watches with no error; EtcdStore.watch
        # turns that into StoreUnavailable unless the store itself is closing.
        with contextlib.suppress(Exception):
            await self.watcher.shutdown()
        await self.channel.close()


def _read_pem(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


class EtcdStore:
    """The scaled-out :class:`~axengine.store.StateStore`, on an etcd v3 cluster.

    The connection is opened on first use, inside the running event loop; use a store
    from one event loop and :meth:`close` it there.

    Args:
        endpoints: ``(host, port)`` of etcd members; one is used at a time, the next one
            after a connection failure.
        timeout: Seconds per request, including waiting for a (re)connection.
        username: etcd user, with ``password`` or ``password_file``.
        password: Password of ``username``.
        password_file: File holding the password of ``username``, read at each login.
        tls: Use TLS (implied by ``ca_cert``/``cert``/``key``).
        ca_cert: PEM file of the CA of the server certificates (system roots if None).
        cert: PEM client certificate for mutual TLS, with ``key``.
        key: PEM private key of ``cert``.
        max_txn_ops: The server's ``--max-txn-ops``; larger ``get_many`` reads are
            split into requests pinned to one revision.
        merge_in_flight: Transaction requests on their way to etcd before concurrent
            transactions wait and go out merged into one (0: never merged; see
            :mod:`axengine.store._etcd_merge`).

    Example::

        store = EtcdStore.from_url("etcd://10.0.0.1:2379,10.0.0.2:2379?timeout=5")
        result = await store.txn([Mod("/ax/x") == 0], [Put("/ax/x", b"1")])
        await store.close()
    """

    def __init__(
        self,
        *,
        endpoints: Sequence[tuple[str, int]] = (("127.0.0.1", 2379),),
        timeout: float = DEFAULT_ETCD_TIMEOUT,
        username: str | None = None,
        password: str | None = None,
        password_file: str | None = None,
        tls: bool = False,
        ca_cert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        merge_in_flight: int = DEFAULT_MERGE_IN_FLIGHT,
    ) -> None:
        self.settings = EtcdSettings(
            endpoints=tuple((host, int(port)) for host, port in endpoints),
            timeout=timeout,
            username=username,
            password=password,
            password_file=password_file,
            tls=tls,
            ca_cert=ca_cert,
            cert=cert,
            key=key,
            max_txn_ops=max_txn_ops,
            merge_in_flight=merge_in_flight,
        )
        self._endpoint = 0
        self._conn: _Connection | None = None
        self._conn_lock = asyncio.Lock()
        self._failed: _Connection | None = None
        self._closed = False
        self._merger = Merger(lambda request: self._unary("Txn", request),
                              max_in_flight=merge_in_flight, max_ops=max_txn_ops,
                              max_bytes=MERGE_MAX_BYTES, timeout=timeout)

    @classmethod
    def from_settings(cls, settings: EtcdSettings) -> EtcdStore:
        """A store for ``settings`` (no connection is made yet)."""
        return cls(
            endpoints=settings.endpoints,
            timeout=settings.timeout,
            username=settings.username,
            password=settings.password,
            password_file=settings.password_file,
            tls=settings.tls,
            ca_cert=settings.ca_cert,
            cert=settings.cert,
            key=settings.key,
            max_txn_ops=settings.max_txn_ops,
            merge_in_flight=settings.merge_in_flight,
        )

    @classmethod
    def from_url(cls, url: str) -> EtcdStore:
        """A store for an ``etcd://host:2379[,host2:2379][?timeout=5]`` URL."""
        return cls.from_settings(EtcdSettings.from_url(url))

    def __repr__(self) -> str:
        members = ",".join(f"{h}:{p}" for h, p in self.settings.endpoints)
        return f"EtcdStore(endpoints={members!r})"

    @property
    def max_txn_ops(self) -> int:
        """The server's ``--max-txn-ops`` as the URL declares it (``?max_txn_ops=``)."""
        return self.settings.max_txn_ops

    # -- connection -------------------------------------------------------------------

    def _target(self) -> str:
        host, port = self.settings.endpoints[self._endpoint]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and self._failed is not conn:
            return conn
        async with self._conn_lock:
            if self._closed:
                raise StoreError(f"{self!r} is closed")
            if self._conn is not None and self._failed is self._conn:
                # Move to the next member; with one member, keep the channel (gRPC
                # reconnects it) unless its auth token was refused.
                old, self._conn = self._conn, None
                self._endpoint = (self._endpoint + 1) % len(self.settings.endpoints)
                await old.close()
            if self._conn is None:
                try:
                    self._conn = await self._open()
                except StoreUnavailable:
                    # Logging in failed on this member: try the next one next time.
                    self._endpoint = (self._endpoint + 1) % len(self.settings.endpoints)
                    raise
            return self._conn

    async def _open(self) -> _Connection:
        settings, target = self.settings, self._target()
        if settings.use_tls:
            try:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=_read_pem(settings.ca_cert),
                    private_key=_read_pem(settings.key),
                    certificate_chain=_read_pem(settings.cert),
                )
            except OSError as exc:
                error = StoreError(f"cannot read the etcd TLS files: {exc}")
                error.retryable = False
                raise error from exc
            channel = grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        metadata = None
        if settings.username is not None:
            try:
                password = settings.read_password()
            except ValueError as exc:
                await channel.close()
                error = StoreError(str(exc))
                error.retryable = False
                raise error from None
            try:
                response = await rpc.AuthStub(channel).Authenticate(
                    rpc.AuthenticateRequest(name=settings.username, password=password),
                    timeout=settings.timeout,
                    wait_for_ready=True,
                )
            except grpc.RpcError as exc:
                await channel.close()
                raise _map_rpc_error(exc, target, settings.username) from exc
            metadata = (("token", response.token),)
        return _Connection(target, channel, metadata, settings.timeout)

    def _connection_failed(self, conn: _Connection, exc: Exception) -> None:
        token_refused = self.settings.username is not None and "invalid auth token" in str(exc)
        if token_refused or (
            isinstance(exc, StoreUnavailable) and len(self.settings.endpoints) > 1
        ):
            self._failed = conn

    async def _unary(self, method: str, request: Any) -> Any:
        """Call ``KV.<method>``; re-authenticate once if etcd forgot the auth token."""
        for attempt in range(2):
            conn = await self._connection()
            try:
                return await getattr(conn.kv, method)(
                    request,
                    timeout=self.settings.timeout,
                    metadata=conn.metadata,
                    wait_for_ready=True,
                )
            except grpc.RpcError as exc:
                error = _map_rpc_error(exc, conn.target, self.settings.username)
                self._connection_failed(conn, error)
                # An expired token (etcd restarted) is refused before anything runs,
                # so sending the request again after a fresh login is safe.
                if attempt == 0 and self._failed is conn and not isinstance(
                    error, StoreUnavailable
                ):
                    continue
                raise error from exc
            except grpc.aio.UsageError as exc:  # channel closed under us
                raise StoreUnavailable(f"etcd channel to {conn.target} closed: {exc}") from exc
        raise AssertionError("unreachable")

    # -- reads ------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        """Return the key, or None when it does not exist."""
        response = await self._unary("Range", rpc.RangeRequest(key=_encode(key)))
        return _kv(response.kvs[0]) if response.kvs else None

    async def get_many(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        """Return the keys that exist among ``keys``, all read at one revision.

        Up to ``max_txn_ops`` keys are read by one read-only transaction; larger sets are
        read in chunks pinned to the revision of the first chunk.
        """
        wanted = sorted(set(keys))
        for attempt in range(3):
            try:
                return await self._get_pinned(wanted)
            except RevisionCompacted:
                # Compacted between two chunks: start over at a newer revision.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _get_pinned(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        found: dict[str, KeyValue] = {}
        revision = 0  # 0 = latest; later chunks read at the first chunk's revision
        size = self.settings.max_txn_ops
        for i in range(0, len(keys), size):
            ops = [
                rpc.RequestOp(request_range=rpc.RangeRequest(key=_encode(k), revision=revision))
                for k in keys[i : i + size]
            ]
            response = await self._unary("Txn", rpc.TxnRequest(compare=[], success=ops))
            revision = revision or int(response.header.revision)
            for item in response.responses:
                for msg in item.response_range.kvs:
                    kv = _kv(msg)
                    found[kv.key] = kv
        return found

    async def range(
        self, prefix: str, *, start_after: str | None = None, limit: int = 0
    ) -> list[KeyValue]:
        """Return keys starting with ``prefix``, sorted by key, after ``start_after``.

        ``limit=0`` means no limit.
        """
        if limit < 0:
            raise ValueError("limit must not be negative")
        start, end = _span(prefix, True)
        assert end is not None
        if start_after is not None:
            start = max(start, _encode(start_after) + b"\0")
            if end != b"\0" and start >= end:
                return []
        # Sort order NONE is etcd's key order, and unlike an explicit sort it lets the
        # server stop at `limit` instead of reading the whole range.
        response = await self._unary(
            "Range", rpc.RangeRequest(key=start, range_end=end, limit=limit)
        )
        return [_kv(msg) for msg in response.kvs]

    async def count(self, prefix: str) -> int:
        """How many keys start with ``prefix`` (a count-only range: no key or value is
        sent back)."""
        start, end = _span(prefix, True)
        response = await self._unary(
            "Range", rpc.RangeRequest(key=start, range_end=end, count_only=True))
        return int(response.count)

    async def revision(self) -> int:
        """Return the current store revision."""
        # An empty transaction reads no key, so it needs no permission: a user granted
        # only the ax key prefix may ask for the revision (the API's /readyz does).
        response = await self._unary("Txn", rpc.TxnRequest())
        return int(response.header.revision)

    # -- transactions -----------------------------------------------------------------

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        """Atomically: if every compare holds run ``success``, else ``failure``.

        Raises:
            ValueError: An empty key, or a branch that writes one key twice.
            TypeError: A compare operand or value of the wrong type.
            StoreUnavailable: etcd did not answer; the outcome is unknown.
            StoreError: etcd refused the transaction (e.g. more ops than
                ``--max-txn-ops``).
        """
        request = rpc.TxnRequest(
            compare=[_compare_message(c) for c in compares],
            success=[_request_op(op) for op in success],
            failure=[_request_op(op) for op in failure],
        )
        answer = await self._merger.txn(request)
        reads = tuple(
            tuple(_kv(msg) for msg in item.response_range.kvs)
            for item in answer.responses
            if item.WhichOneof("response") == "response_range"
        )
        return TxnResult(answer.succeeded, answer.revision, reads)

    async def compact(self, revision: int) -> None:
        """Compact etcd's history below ``revision`` (a no-op if already compacted).

        Raises:
            ValueError: ``revision`` is newer than the store's revision.
        """
        try:
            await self._unary("Compact", rpc.CompactionRequest(revision=revision, physical=True))
        except RevisionCompacted:
            return
        except StoreError as exc:
            if "future revision" in str(exc):
                raise ValueError(f"cannot compact to revision {revision}: {exc}") from exc
            raise

    # -- watch ------------------------------------------------------------------------

    def watch(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Yield changes under ``prefix`` from ``start_revision`` (0 = from now on).

        The watch is created when iteration starts; "now" is that moment. To miss
        nothing, pass ``start_revision = revision_read + 1``. Iteration ends when the
        store closes; a lost connection raises ``StoreUnavailable`` (watch again from
        the last seen ``kv.mod_revision + 1``).

        Raises:
            RevisionCompacted: ``start_revision`` is older than etcd's history.
            StoreUnavailable: The watch stream broke.
        """
        return self._watch(prefix, start_revision)

    async def _watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        key, end = _span(prefix, True)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        user = self.settings.username
        for attempt in range(2):
            conn = await self._connection()
            try:
                callback = await _created(conn.watcher.add_callback(
                    key, queue.put, range_end=end, start_revision=start_revision or None
                ), conn.watcher)
                break
            except Exception as exc:
                error = _map_client_error(exc, conn.target, user)
                self._connection_failed(conn, error)
                # etcd refuses a watch alike for an expired token and for a missing
                # permission; a fresh login tells the two apart (the watch never ran).
                if isinstance(exc, _WatchRefused) and user is not None:
                    self._failed = conn
                if attempt == 0 and self._failed is conn and not isinstance(
                    error, StoreUnavailable
                ):
                    continue
                raise error from exc
        else:
            raise AssertionError("unreachable")
        try:
            while True:
                item = await queue.get()
                if item is None:
                    if self._closed:
                        return
                    raise StoreUnavailable(f"etcd watch stream to {conn.target} was closed")
                if isinstance(item, BaseException):
                    error = _map_client_error(item, conn.target, user)
                    self._connection_failed(conn, error)
                    raise error from item
                yield WatchEvent("delete" if item.kind == "DELETE" else "put", _kv(item.kv))
        finally:
            with contextlib.suppress(Exception):
                await conn.watcher.cancel(callback.watch_id)

    # -- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection; running watches end. Closing twice is harmless."""
        async with self._conn_lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> EtcdStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
