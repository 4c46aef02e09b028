"""The ``StateStore`` seam: etcd's data model, implemented by etcd and by SQLite.

The model is etcd v3's: one global revision that every committed write increments; per
key a ``create_revision``, ``mod_revision`` and ``version`` (number of puts since
creation); a multi-key transaction ``txn(compares, success, failure)`` that is atomic.
A missing key has ``mod_revision == create_revision == version == 0``, so
``Mod(key) == 0`` means "does not exist yet".

Compares are built as values, as in aetcd::

    await store.txn([Mod(k) == kv.mod_revision], [Put(k, new)], [Get(k)])
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "Compare",
    "Create",
    "Delete",
    "Get",
    "KeyValue",
    "Mod",
    "Op",
    "Put",
    "StateStore",
    "StoreWrapper",
    "TxnResult",
    "Value",
    "Version",
    "WatchEvent",
]

CompareTarget = Literal["mod", "create", "version", "value"]
CompareOp = Literal["==", "!=", "<", ">"]


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A stored key with its value and revisions."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: ``<target of key> <op> <operand>``."""

    key: str
    target: CompareTarget
    op: CompareOp
    operand: int | bytes


class _Target:
    """Builds :class:`Compare` values with Python operators (``Mod(k) == 3``)."""

    target: CompareTarget

    def __init__(self, key: str) -> None:
        self.key = key

    def _cmp(self, op: CompareOp, operand: int | bytes) -> Compare:
        return Compare(self.key, self.target, op, operand)

    def __eq__(self, operand: object) -> Compare:  # type: ignore[override]
        return self._cmp("==", _operand(operand))

    def __ne__(self, operand: object) -> Compare:  # type: ignore[override]
        return self._cmp("!=", _operand(operand))

    def __lt__(self, operand: int | bytes) -> Compare:
        return self._cmp("<", operand)

    def __gt__(self, operand: int | bytes) -> Compare:
        return self._cmp(">", operand)

    __hash__ = None  # type: ignore[assignment]


def _operand(value: object) -> int | bytes:
    if isinstance(value, int | bytes):
        return value
    raise TypeError(f"compare operand must be int or bytes, not {type(value).__name__}")


class Mod(_Target):
    """Compare a key's ``mod_revision``."""

    target: CompareTarget = "mod"


class Create(_Target):
    """Compare a key's ``create_revision``."""

    target: CompareTarget = "create"


class Version(_Target):
    """Compare a key's ``version``."""

    target: CompareTarget = "version"


class Value(_Target):
    """Compare a key's value (bytes)."""

    target: CompareTarget = "value"


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` at ``key``."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key``, or every key starting with it when ``prefix`` is true."""

    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    """Read ``key`` (or a prefix) inside the transaction; results land in ``TxnResult.reads``."""

    key: str
    prefix: bool = False


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of :meth:`StateStore.txn`.

    Attributes:
        succeeded: Whether every compare held (the success branch ran).
        revision: The store revision after the transaction.
        reads: For each ``Get`` of the branch that ran, in order, the keys it found.
    """

    succeeded: bool
    revision: int
    reads: tuple[tuple[KeyValue, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change seen by :meth:`StateStore.watch`; ``kv.value`` is empty for deletes."""

    kind: Literal["put", "delete"]
    kv: KeyValue


@runtime_checkable
class StateStore(Protocol):
    """The single source of truth. Every method is safe to call concurrently."""

    @property
    def max_txn_ops(self) -> int | None:
        """Most operations one transaction branch may hold (etcd's ``--max-txn-ops``, as
        configured in the store URL); None when the store has no such limit (SQLite).
        The engine refuses a DAG whose largest transition could exceed it."""
        ...

    async def get(self, key: str) -> KeyValue | None:
        """Return the key, or None when it does not exist."""
        ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        """Return the keys that exist among ``keys``, all read at one revision."""
        ...

    async def range(
        self, prefix: str, *, start_after: str | None = None, limit: int = 0
    ) -> list[KeyValue]:
        """Return keys starting with ``prefix``, sorted by key, after ``start_after``.

        ``limit=0`` means no limit.
        """
        ...

    async def count(self, prefix: str) -> int:
        """How many keys start with ``prefix``, without reading their values."""
        ...

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        """Atomically: if every compare holds run ``success``, else ``failure``."""
        ...

    async def revision(self) -> int:
        """Return the current store revision."""
        ...

    def watch(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Yield changes under ``prefix`` from ``start_revision`` (0 = from now on).

        Raises:
            RevisionCompacted: ``start_revision`` is older than the store keeps.
        """
        ...

    async def close(self) -> None:
        """Release connections and files."""
        ...


class StoreWrapper:
    """A :class:`StateStore` that delegates every call to ``inner``: subclass it and
    override what you observe (metrics time ``txn``; tests interpose on it)."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner

    @property
    def max_txn_ops(self) -> int | None:
        return self.inner.max_txn_ops

    async def get(self, key: str) -> KeyValue | None:
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        return await self.inner.get_many(keys)

    async def range(self, prefix: str, *, start_after: str | None = None,
                    limit: int = 0) -> list[KeyValue]:
        return await self.inner.range(prefix, start_after=start_after, limit=limit)

    async def count(self, prefix: str) -> int:
        return await self.inner.count(prefix)

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = ()) -> TxnResult:
        return await self.inner.txn(compares, success, failure)

    async def revision(self) -> int:
        return await self.inner.revision()

    def watch(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        return self.inner.watch(prefix, start_revision=start_revision)

    async def close(self) -> None:
        await self.inner.close()
