"""Embedded state store: etcd's data model in one SQLite file.

:class:`SqliteStore` gives the embedded engine (``ax run``, ``ax server``, ``ax.run``)
the same contract as :class:`axengine.store.etcd.EtcdStore`: one global revision bumped
once by every transaction that writes, per-key ``create_revision``/``mod_revision``/
``version``, missing keys comparing as 0, atomic ``txn`` with reads, and ``watch`` from a
revision with compaction. The rules mirror etcd's, including its quirks: a ``Value``
compare on a missing key is false, a delete that removes nothing does not write, and a
branch may not write one key twice.

Durability: the database runs in WAL mode with ``synchronous=FULL``, so a transaction is
on disk when :meth:`SqliteStore.txn` returns and survives SIGKILL or power loss.

Several processes may open the same file (``ax run`` then ``ax run --resume``, or
``ax server`` next to CLI reads): writers take SQLite's write lock up front
(``BEGIN IMMEDIATE``) and read the revision inside it, so revisions stay gap-free and
compare-and-swap holds across processes. Within a process, a store uses one connection
guarded by a lock; every statement runs in a short synchronous critical section, so
concurrent asyncio tasks (or threads) cannot interleave a transaction. The writing
transactions asked for in one turn of an event loop commit together: each is decided as
if alone, in order, with its own revision, in one SQLite transaction with one ``COMMIT``
(one fsync for the group); nobody is answered before that ``COMMIT``.

Watches read a change log (``ax_changelog``) that keeps the last
:data:`~axengine.store.settings.DEFAULT_WATCH_RETENTION` revisions; in-process writes wake
watchers at once, writes from other processes are seen at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import os
import sqlite3
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from axengine.errors import RevisionCompacted, StoreError, StoreUnavailable
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
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_WATCH_RETENTION,
    SqliteSettings,
)

__all__ = ["SqliteStore"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ax_meta (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        revision INTEGER NOT NULL,
        compact_revision INTEGER NOT NULL
    )""",
    "INSERT OR IGNORE INTO ax_meta (id, revision, compact_revision) VALUES (0, 1, 0)",
    # Keys are stored as UTF-8 BLOBs: SQLite compares BLOBs with memcmp, which is
    # etcd's byte order, and a prefix's upper bound may not be valid UTF-8 text.
    """CREATE TABLE IF NOT EXISTS ax_kv (
        key BLOB PRIMARY KEY,
        value BLOB NOT NULL,
        create_revision INTEGER NOT NULL,
        mod_revision INTEGER NOT NULL,
        version INTEGER NOT NULL
    ) WITHOUT ROWID""",
    # The change log is appended at its end only: a rowid table keyed by
    # (revision << 32) | seq takes an append by adding a page at its right edge, where
    # a WITHOUT ROWID b-tree rebalances the last leaves on every commit (measured
    # apart, with commits the size of a chain node's: 13.5 WAL frames per commit against
    # 10.1, COMMIT 0.34 ms against 0.24).
    """CREATE TABLE IF NOT EXISTS ax_changelog (
        id INTEGER PRIMARY KEY,
        key BLOB NOT NULL,
        kind INTEGER NOT NULL,
        value BLOB NOT NULL,
        create_revision INTEGER NOT NULL,
        version INTEGER NOT NULL
    )""",
)

#: Bits of a change-log id below the revision: a change's id is
#: ``(revision << _SEQ_BITS) | seq``, ``seq`` its place in the revision's changes.
_SEQ_BITS = 32

#: Change-log rows one watch poll reads at most.
_WATCH_BATCH = 512
#: Keys per statement in ``get_many`` (well below SQLite's bound-parameter limit).
_CHUNK = 500
#: Greater than every stored key: UTF-8 never contains the byte 0xff.
_TOP = b"\xff"
_PUT, _DELETE = 0, 1
_KV_COLUMNS = "key, value, create_revision, mod_revision, version"
#: The same row with an empty value, for a read that needs the revisions only.
_KV_REVISIONS = "key, x'', create_revision, mod_revision, version"

_Row = tuple[bytes, bytes, int, int, int]
_ChangeRow = tuple[int, bytes, int, bytes, int, int]

_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
_TARGET_COLUMN = {"create": 2, "mod": 3, "version": 4}


def _encode(key: str) -> bytes:
    return key.encode("utf-8")


def _key_range(prefix: str) -> tuple[bytes, bytes]:
    """``[lo, hi)`` covering every key that starts with ``prefix`` (etcd's range_end)."""
    lo = _encode(prefix)
    stripped = lo.rstrip(b"\xff")
    if not stripped:
        return lo, _TOP
    return lo, stripped[:-1] + bytes([stripped[-1] + 1])


def _kv(row: _Row) -> KeyValue:
    return KeyValue(row[0].decode("utf-8"), bytes(row[1]), row[2], row[3], row[4])


def _check_compare(compare: Compare) -> None:
    if compare.op not in _OPERATORS:
        raise ValueError(f"unknown compare operator {compare.op!r}")
    if not compare.key:
        raise ValueError("compare key must not be empty")
    if compare.target == "value":
        if not isinstance(compare.operand, bytes):
            raise TypeError(f"Value({compare.key!r}) compares with bytes, not an int")
    elif compare.target in _TARGET_COLUMN:
        if not isinstance(compare.operand, int):
            raise TypeError(f"{compare.target} revision of {compare.key!r} compares with int")
    else:
        raise ValueError(f"unknown compare target {compare.target!r}")


def _holds(row: _Row | None, compare: Compare) -> bool:
    """Whether ``compare`` holds for the stored ``row`` of its key (None: missing)."""
    if compare.target == "value":
        # etcd: comparing the value of a missing key is always false, since a missing
        # value cannot be told from an empty one.
        if row is None:
            return False
        actual: int | bytes = bytes(row[1])
    else:
        actual = 0 if row is None else row[_TARGET_COLUMN[compare.target]]
    return _OPERATORS[compare.op](actual, compare.operand)


def _check_branch(ops: Sequence[Op]) -> bool:
    """Validate one branch as etcd does; return whether it writes.

    Like etcd (``checkIntervals``), a branch may not put one key twice nor put a key that
    one of its deletes covers; deletes may overlap each other.

    Raises:
        ValueError: An empty key, or a key written twice in the branch.
        TypeError: An op that is not Put, Delete or Get, or a non-bytes value.
    """
    puts: set[bytes] = set()
    deletes: list[tuple[bytes, bytes]] = []
    for op in ops:
        if isinstance(op, Put):
            if not isinstance(op.value, bytes):
                raise TypeError(f"Put({op.key!r}) value must be bytes")
            if not op.key:
                raise ValueError("Put key must not be empty")
            key = _encode(op.key)
            if key in puts:
                raise ValueError(f"duplicate key given in txn request: {op.key!r}")
            puts.add(key)
        elif isinstance(op, Delete):
            if op.prefix:
                deletes.append(_key_range(op.key))
            elif not op.key:
                raise ValueError("Delete key must not be empty")
            else:
                key = _encode(op.key)
                deletes.append((key, key + b"\0"))
        elif isinstance(op, Get):
            if not op.key and not op.prefix:
                raise ValueError("Get key must not be empty")
        else:
            raise TypeError(f"txn op must be Put, Delete or Get, not {type(op).__name__}")
    for key in puts:
        if any(lo <= key < hi for lo, hi in deletes):
            raise ValueError(f"duplicate key given in txn request: {key.decode()!r}")
    return bool(puts or deletes)


def _map_error(exc: sqlite3.Error, path: str) -> StoreError:
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc):
        return StoreUnavailable(
            f"SQLite store {path} is locked by another process ({exc}); retry, or raise "
            "busy_timeout if long transactions are expected"
        )
    if name.startswith("SQLITE_CANTOPEN"):
        return StoreUnavailable(f"cannot open SQLite store {path}: {exc}")
    return StoreError(f"SQLite store {path} failed: {exc}")


class _Notifier:
    """Wakes the watchers of one database file when this process commits to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: set[Callable[[], None]] = set()

    def add(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks.add(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks.discard(callback)

    def notify(self) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()


# One notifier per database file, so two stores of one process on the same file (an API
# and an executor, say) wake each other's watchers without polling.
_NOTIFIERS: weakref.WeakValueDictionary[str, _Notifier] = weakref.WeakValueDictionary()
_NOTIFIERS_LOCK = threading.Lock()


def _notifier_for(path: str | None) -> _Notifier:
    if path is None:
        return _Notifier()
    with _NOTIFIERS_LOCK:
        notifier = _NOTIFIERS.get(path)
        if notifier is None:
            notifier = _NOTIFIERS[path] = _Notifier()
        return notifier


def _waker(event: asyncio.Event) -> Callable[[], None]:
    """A callback that sets ``event`` from any thread, on the loop that owns it."""
    loop = asyncio.get_running_loop()

    def wake() -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            # The watcher's loop may be gone already; then there is nobody to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    return wake


@dataclass(eq=False)
class _Txn:
    """A writing transaction waiting for a group commit, and where its answer goes."""

    compares: Sequence[Compare]
    success: Sequence[Op]
    failure: Sequence[Op]
    answer: asyncio.Future[TxnResult] = field(init=False)


class SqliteStore:
    """The embedded :class:`~axengine.store.StateStore`, on one SQLite file.

    Args:
        path: Database file (created with its parent directories if missing), or
            ``":memory:"`` for a private store that vanishes on close.
        busy_timeout: Seconds a writer waits for another process's write lock before
            raising :class:`~axengine.errors.StoreUnavailable`.
        synchronous: ``"FULL"`` (durable at return) or ``"NORMAL"`` (survives process
            crashes, may lose the last commits on power loss).
        watch_retention: Revisions of change history kept for ``watch``.
        poll_interval: Seconds between change-log polls of a watch.

    Raises:
        StoreUnavailable: The file cannot be opened or stays locked.
        StoreError: Any other SQLite failure.

    Example::

        store = SqliteStore.from_url("sqlite:///var/lib/ax/state.db")
        result = await store.txn([Mod("/ax/x") == 0], [Put("/ax/x", b"1")])
        await store.close()
    """

    #: SQLite commits a transaction of any size (one write lock, one fsync).
    max_txn_ops: int | None = None

    def __init__(
        self,
        *,
        path: str | os.PathLike[str] = ":memory:",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        watch_retention: int = DEFAULT_WATCH_RETENTION,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self.settings = SqliteSettings(
            path=os.fspath(path),
            busy_timeout=busy_timeout,
            synchronous=synchronous,
            watch_retention=watch_retention,
            poll_interval=poll_interval,
        )
        self._path = self.settings.path
        self._lock = threading.Lock()
        self._closed = False
        #: Writing transactions waiting for their event loop's next group commit.
        self._queued: dict[asyncio.AbstractEventLoop, list[_Txn]] = {}
        memory = self._path == ":memory:"
        try:
            if not memory:
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                self._path,
                timeout=busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except OSError as exc:
            why = exc.strerror or str(exc)
            parent = Path(self._path).parent
            # The nearest existing ancestor, when a file stands in the way (a --home
            # naming a file): that one is to blame, not the directory it prevents.
            blocking = next((p for p in (parent, *parent.parents) if p.exists()), None)
            if blocking is not None and not blocking.is_dir():
                why = f"{blocking} is not a directory"
            raise StoreUnavailable(f"cannot create the directory of {self._path}: {why}"
                                   ) from exc
        except sqlite3.Error as exc:
            raise _map_error(exc, self._path) from exc
        try:
            self._setup()
        except sqlite3.Error as exc:
            self._conn.close()
            raise _map_error(exc, self._path) from exc
        except BaseException:
            self._conn.close()
            raise
        self._notifier = _notifier_for(None if memory else os.path.realpath(self._path))
        # Keep compaction batches small so no single commit stalls on a big delete.
        self._compact_step = max(1, min(1024, watch_retention // 8))

    @classmethod
    def open(cls, path: str | os.PathLike[str], **options: Any) -> SqliteStore:
        """Open (or create) the store at ``path``; ``options`` as for the constructor."""
        return cls(path=path, **options)

    @classmethod
    def from_settings(cls, settings: SqliteSettings) -> SqliteStore:
        """Open the store described by ``settings``."""
        return cls(
            path=settings.path,
            busy_timeout=settings.busy_timeout,
            synchronous=settings.synchronous,
            watch_retention=settings.watch_retention,
            poll_interval=settings.poll_interval,
        )

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        """Open the store of a ``sqlite:///abs/path.db`` or ``sqlite://:memory:`` URL."""
        return cls.from_settings(SqliteSettings.from_url(url))

    def __repr__(self) -> str:
        return f"SqliteStore(path={self._path!r})"

    def _setup(self) -> None:
        conn = self._conn
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.settings.synchronous}")
        conn.execute("BEGIN IMMEDIATE")  # two processes may create the schema at once
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
            self._migrate(conn)
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Move the change log of a file written before 2026-12-04 (``ax_changes``,
        keyed by ``(revision, seq)`` WITHOUT ROWID) into ``ax_changelog``, so watches
        from a revision it kept still see it."""
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                        "AND name = 'ax_changes'").fetchone() is None:
            return
        conn.execute(
            "INSERT INTO ax_changelog SELECT (revision << ?) | seq, key, kind, value, "
            "create_revision, version FROM ax_changes", (_SEQ_BITS,))
        conn.execute("DROP TABLE ax_changes")

    # -- plumbing ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed")

    def _read(self, fn: Callable[[sqlite3.Connection], Any], *, snapshot: bool = False) -> Any:
        """Run ``fn`` under the lock; in one read transaction when ``snapshot``.

        A single statement always reads one consistent state, so only readers that run
        several statements need ``snapshot``.
        """
        with self._lock:
            self._check_open()
            conn = self._conn
            try:
                if not snapshot:
                    return fn(conn)
                conn.execute("BEGIN")
                try:
                    return fn(conn)
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise _map_error(exc, self._path) from exc

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    @staticmethod
    def _meta(conn: sqlite3.Connection) -> tuple[int, int]:
        row = conn.execute("SELECT revision, compact_revision FROM ax_meta WHERE id = 0").fetchone()
        return int(row[0]), int(row[1])

    @staticmethod
    def _get_row(conn: sqlite3.Connection, key: bytes) -> _Row | None:
        row: _Row | None = conn.execute(
            f"SELECT {_KV_COLUMNS} FROM ax_kv WHERE key = ?", (key,)
        ).fetchone()
        return row

    @staticmethod
    def _range_rows(
        conn: sqlite3.Connection, lo: bytes, hi: bytes, limit: int = -1
    ) -> list[_Row]:
        rows: list[_Row] = conn.execute(
            f"SELECT {_KV_COLUMNS} FROM ax_kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?",
            (lo, hi, limit),
        ).fetchall()
        return rows

    # -- reads ------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        """Return the key, or None when it does not exist."""
        row = self._read(lambda conn: self._get_row(conn, _encode(key)))
        return None if row is None else _kv(row)

    async def get_many(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        """Return the keys that exist among ``keys``, all read in one snapshot."""
        wanted = sorted({_encode(k) for k in keys})

        def read(conn: sqlite3.Connection) -> list[_Row]:
            rows: list[_Row] = []
            for i in range(0, len(wanted), _CHUNK):
                chunk = wanted[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows.extend(
                    conn.execute(
                        f"SELECT {_KV_COLUMNS} FROM ax_kv WHERE key IN ({marks})", chunk
                    ).fetchall()
                )
            return rows

        if not wanted:
            return {}
        rows = self._read(read, snapshot=len(wanted) > _CHUNK)
        return {kv.key: kv for kv in map(_kv, rows)}

    async def range(
        self, prefix: str, *, start_after: str | None = None, limit: int = 0
    ) -> list[KeyValue]:
        """Return keys starting with ``prefix``, sorted by key, after ``start_after``.

        ``limit=0`` means no limit.
        """
        if limit < 0:
            raise ValueError("limit must not be negative")
        lo, hi = _key_range(prefix)
        if start_after is not None:
            lo = max(lo, _encode(start_after) + b"\0")
        if lo >= hi:
            return []
        rows = self._read(lambda conn: self._range_rows(conn, lo, hi, limit or -1))
        return [_kv(row) for row in rows]

    async def count(self, prefix: str) -> int:
        """How many keys start with ``prefix`` (counted on the key index)."""
        lo, hi = _key_range(prefix)
        found: int = self._read(lambda conn: conn.execute(
            "SELECT COUNT(*) FROM ax_kv WHERE key >= ? AND key < ?", (lo, hi)).fetchone()[0])
        return found

    async def revision(self) -> int:
        """Return the current store revision."""
        revision: int = self._read(lambda conn: self._meta(conn)[0])
        return revision

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
            StoreUnavailable: Another process held the write lock past ``busy_timeout``.
            StoreError: SQLite failed; nothing was written.
        """
        for compare in compares:
            _check_compare(compare)
        writes = _check_branch(success) | _check_branch(failure)
        if writes:
            return await self._commit_together(_Txn(compares, success, failure))
        result: TxnResult = self._read(
            lambda conn: self._apply(conn, compares, success, failure)[0], snapshot=True)
        return result

    async def _commit_together(self, txn: _Txn) -> TxnResult:
        """Queue a writing transaction for this event loop's next group commit.

        The writing transactions asked for in one turn of the event loop (tasks in
        flight each committing a transition) are applied one after another, each as if
        alone (its compares, its revision), in one SQLite transaction with one
        ``COMMIT``: one fsync for the group instead of one each. Nobody is answered
        before that ``COMMIT``. A caller cancelled while its transaction waits takes it
        out of the group: it is not applied."""
        loop = asyncio.get_running_loop()
        txn.answer = loop.create_future()
        queued = self._queued.setdefault(loop, [])
        queued.append(txn)
        if len(queued) == 1:
            loop.call_soon(self._commit_queued, loop)
        try:
            return await txn.answer
        except asyncio.CancelledError:
            waiting = self._queued.get(loop)
            if waiting is not None and txn in waiting:
                waiting.remove(txn)
            raise

    def _commit_queued(self, loop: asyncio.AbstractEventLoop) -> None:
        # (A caller cancelled while waiting has its answer cancelled already: skipped.)
        group = [txn for txn in self._queued.pop(loop, []) if not txn.answer.done()]
        if not group:
            return
        outcomes: list[TxnResult | BaseException] = []
        changed = False
        with self._lock:
            try:
                self._check_open()
                conn = self._conn
                # The write lock first, before reading anything: the compares and the
                # writes see one state, even across processes.
                conn.execute("BEGIN IMMEDIATE")
                for txn in group:
                    outcome, wrote = self._apply_in_group(conn, txn, alone=len(group) == 1)
                    outcomes.append(outcome)
                    changed |= wrote
                conn.execute("COMMIT")
            except BaseException as exc:
                if not self._closed:
                    self._rollback()
                error = self._answer_for(exc)
                for txn in group:
                    if not txn.answer.done():
                        txn.answer.set_exception(error)
                return
        if changed:
            self._notifier.notify()
        for txn, outcome in zip(group, outcomes, strict=True):
            if txn.answer.done():
                continue
            if isinstance(outcome, BaseException):
                txn.answer.set_exception(outcome)
            else:
                txn.answer.set_result(outcome)

    def _answer_for(self, exc: BaseException) -> BaseException:
        """What a waiting caller is answered when its transaction failed with ``exc``."""
        return _map_error(exc, self._path) if isinstance(exc, sqlite3.Error) else exc

    def _apply_in_group(self, conn: sqlite3.Connection, txn: _Txn, *, alone: bool,
                        ) -> tuple[TxnResult | BaseException, bool]:
        """One transaction of a group; one that fails is undone to its savepoint and
        answered with its error, the others are not touched (alone, it fails the group:
        nothing else would be committed)."""
        if alone:
            return self._apply(conn, txn.compares, txn.success, txn.failure)
        conn.execute("SAVEPOINT ax_txn")
        try:
            outcome = self._apply(conn, txn.compares, txn.success, txn.failure)
        except Exception as exc:
            conn.execute("ROLLBACK TO ax_txn")
            conn.execute("RELEASE ax_txn")
            return self._answer_for(exc), False
        conn.execute("RELEASE ax_txn")
        return outcome

    def _apply(
        self,
        conn: sqlite3.Connection,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op],
    ) -> tuple[TxnResult, bool]:
        revision, compact_revision = self._meta(conn)
        # One read for every key the compares and the puts of either branch name: the
        # compares are decided on it and the puts take their create revision and
        # version from it (a branch never puts a key twice nor one it deletes, so no op
        # of the branch changes these rows before their put).
        rows = self._rows(conn, {_encode(op.key) for op in (*success, *failure)
                                 if isinstance(op, Put)}
                          | {_encode(c.key) for c in compares},
                          values=any(c.target == "value" for c in compares))
        succeeded = all(_holds(rows.get(_encode(c.key)), c) for c in compares)
        new_revision = revision + 1
        first = new_revision << _SEQ_BITS  # the change-log id of its first change
        changes: list[_ChangeRow] = []
        puts: list[_Row] = []
        reads: list[tuple[KeyValue, ...]] = []
        for op in success if succeeded else failure:
            if isinstance(op, Put):
                key = _encode(op.key)
                row = rows.get(key)
                create, version = (new_revision, 1) if row is None else (row[2], row[4] + 1)
                puts.append((key, op.value, create, new_revision, version))
                changes.append((first + len(changes), key, _PUT, op.value, create, version))
                continue
            # The puts so far are written before a delete or a read: a read inside a
            # txn sees the txn's own earlier writes, as in etcd.
            self._write(conn, puts)
            if isinstance(op, Delete):
                if op.prefix:
                    lo, hi = _key_range(op.key)
                else:
                    lo = _encode(op.key)
                    hi = lo + b"\0"  # the smallest key after `lo`: exactly one key
                deleted = conn.execute(
                    "SELECT key FROM ax_kv WHERE key >= ? AND key < ? ORDER BY key", (lo, hi)
                ).fetchall()
                if deleted:
                    conn.execute("DELETE FROM ax_kv WHERE key >= ? AND key < ?", (lo, hi))
                    seq = len(changes)
                    changes.extend(
                        (first + seq + i, row[0], _DELETE, b"", 0, 0)
                        for i, row in enumerate(deleted)
                    )
            else:
                if op.prefix:
                    lo, hi = _key_range(op.key)
                    found = self._range_rows(conn, lo, hi)
                else:
                    one = self._get_row(conn, _encode(op.key))
                    found = [] if one is None else [one]
                reads.append(tuple(_kv(r) for r in found))
        self._write(conn, puts)
        if changes:
            revision = new_revision
            conn.executemany("INSERT INTO ax_changelog VALUES (?, ?, ?, ?, ?, ?)", changes)
            retention = self.settings.watch_retention
            if revision - compact_revision >= retention + self._compact_step:
                compact_revision = revision - retention + 1
                self._drop_changes(conn, compact_revision)
            conn.execute(
                "UPDATE ax_meta SET revision = ?, compact_revision = ? WHERE id = 0",
                (revision, compact_revision),
            )
        return TxnResult(succeeded, revision, tuple(reads)), bool(changes)

    @staticmethod
    def _rows(conn: sqlite3.Connection, keys: set[bytes], *, values: bool = True,
              ) -> dict[bytes, _Row]:
        """The stored rows of ``keys`` (a missing key has none), in few statements;
        without ``values``, each row's value is left empty (a transaction whose compares
        read no value needs the revisions and versions only: a large value is not read
        back from its pages for nothing)."""
        wanted = sorted(keys)
        found: dict[bytes, _Row] = {}
        columns = _KV_COLUMNS if values else _KV_REVISIONS
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(
                    f"SELECT {columns} FROM ax_kv WHERE key IN ({marks})", chunk):
                found[bytes(row[0])] = row
        return found

    @staticmethod
    def _write(conn: sqlite3.Connection, puts: list[_Row]) -> None:
        """Write the rows of ``puts`` (revisions and versions already decided) in one
        statement, and empty the list."""
        if puts:
            conn.executemany(f"INSERT OR REPLACE INTO ax_kv ({_KV_COLUMNS}) "
                             "VALUES (?, ?, ?, ?, ?)", puts)
            puts.clear()

    async def compact(self, revision: int) -> None:
        """Drop change history older than ``revision``.

        A later ``watch(start_revision < revision)`` raises
        :class:`~axengine.errors.RevisionCompacted`. Compacting to a revision already
        compacted does nothing. The store also compacts itself to keep
        ``watch_retention`` revisions.

        Raises:
            ValueError: ``revision`` is newer than the store's revision.
        """
        with self._lock:
            self._check_open()
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                current, compacted = self._meta(conn)
                if revision > current:
                    raise ValueError(
                        f"cannot compact to revision {revision}: the store is at {current}"
                    )
                if revision > compacted:
                    self._drop_changes(conn, revision)
                    conn.execute(
                        "UPDATE ax_meta SET compact_revision = ? WHERE id = 0", (revision,)
                    )
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise _map_error(exc, self._path) from exc
            except BaseException:
                self._rollback()
                raise

    # -- watch ------------------------------------------------------------------------

    def watch(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Yield changes under ``prefix`` from ``start_revision`` (0 = from now on).

        "Now" is the revision when ``watch`` is called, so a write made after the call
        is seen even if iteration starts later. Iteration ends when the store closes.

        Raises:
            RevisionCompacted: ``start_revision`` (or, for a watcher that fell behind,
                the next revision it needs) is older than the kept history.
        """
        if start_revision <= 0:
            start_revision = self._read(lambda conn: self._meta(conn)[0]) + 1
        return self._watch(prefix, start_revision)

    async def _watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        lo, hi = _key_range(prefix)
        # The change-log id of the last change delivered (or just before the first
        # one wanted): everything up to it is done.
        after = (start_revision << _SEQ_BITS) - 1
        event = asyncio.Event()
        wake = _waker(event)
        self._notifier.add(wake)
        try:
            while not self._closed:
                event.clear()
                try:
                    rows, current, compacted = self._poll(lo, hi, after)
                except StoreError:
                    if self._closed:
                        return
                    raise
                needed = (after + 1) >> _SEQ_BITS
                if needed < compacted:
                    raise RevisionCompacted(
                        f"watch of {prefix!r} needs revision {needed}, but the SQLite "
                        f"store keeps history from revision {compacted} only; re-read the "
                        "current state and watch from its revision"
                    )
                for change_id, key, kind, value, create, version in rows:
                    after = change_id
                    kv = KeyValue(key.decode("utf-8"), bytes(value), create,
                                  change_id >> _SEQ_BITS, version)
                    yield WatchEvent("put" if kind == _PUT else "delete", kv)
                if len(rows) == _WATCH_BATCH:
                    continue
                # The poll saw every change up to `current`: move past it, so a later
                # compaction of revisions without matching changes is not an error.
                after = max(after, ((current + 1) << _SEQ_BITS) - 1)
                if not self._closed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.settings.poll_interval):
                            await event.wait()
        finally:
            self._notifier.discard(wake)

    def _poll(
        self, lo: bytes, hi: bytes, after: int
    ) -> tuple[list[_ChangeRow], int, int]:
        def read(conn: sqlite3.Connection) -> tuple[list[_ChangeRow], int, int]:
            current, compacted = self._meta(conn)
            rows: list[_ChangeRow] = conn.execute(
                "SELECT id, key, kind, value, create_revision, version FROM ax_changelog "
                "WHERE id > ? AND key >= ? AND key < ? ORDER BY id LIMIT ?",
                (after, lo, hi, _WATCH_BATCH),
            ).fetchall()
            return rows, current, compacted

        result: tuple[list[_ChangeRow], int, int] = self._read(read, snapshot=True)
        return result

    @staticmethod
    def _drop_changes(conn: sqlite3.Connection, revision: int) -> None:
        """Delete the change log's history before ``revision``."""
        conn.execute("DELETE FROM ax_changelog WHERE id < ?", (revision << _SEQ_BITS,))

    # -- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        """Close the database; running watches end. Closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()
        self._notifier.notify()

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
