"""Fixtures of the store tests: a ``store`` case per ``StateStore`` implementation.

Every test of the conformance suite runs once per implementation (``STORE_KINDS``),
against a real backend: a fresh SQLite file, or the session's etcd (a private port,
see ``tests/servers.py``). Each test gets a unique key prefix, emptied (and checked
empty) before and after it, in aetcd's delete-prefix-then-assert-empty style.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from axengine.store import Delete, StateStore
from axengine.store.embedded import SqliteStore
from axengine.store.etcd import EtcdStore

STORE_KINDS = ["sqlite", "etcd"]


class CompactingStore(StateStore, Protocol):
    """What the tests use beyond the protocol: both stores can compact history."""

    async def compact(self, revision: int) -> None: ...


@dataclass(frozen=True)
class StoreCase:
    """One implementation under test.

    Attributes:
        kind: ``"sqlite"`` or ``"etcd"``.
        url: The store URL the case opens.
        prefix: Unique key prefix of this test; keys outside it belong to others.
        factory: Builds a bare store of this kind (connects inside the running loop);
            the caller closes it. Prefer :meth:`open`.
    """

    kind: str
    url: str
    prefix: str
    factory: Callable[[], CompactingStore]

    def key(self, name: str) -> str:
        """A key of this test: ``prefix + name``."""
        return self.prefix + name

    def open(self) -> AbstractAsyncContextManager[CompactingStore]:
        """Open a new connection to the backend (inside the running event loop).

        The prefix is cleared and checked empty on entry and cleared on exit; the store
        is closed on exit. Open several to test concurrent connections.
        """
        return self._open()

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[CompactingStore]:
        store = self.factory()
        try:
            await store.txn([], [Delete(self.prefix, prefix=True)])
            assert await store.range(self.prefix) == []
            yield store
            await store.txn([], [Delete(self.prefix, prefix=True)])
        finally:
            await store.close()


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCase]:
    """A case of each store implementation with a unique key prefix."""
    kind: str = request.param
    prefix = f"/axtest/{uuid.uuid4().hex[:12]}/"
    if kind == "sqlite":
        url = f"sqlite://{tmp_path / 'store.db'}"

        def factory() -> CompactingStore:
            return SqliteStore.from_url(url)
    else:
        server = request.getfixturevalue("etcd_server")
        url = f"{server.url}?timeout=5&max_txn_ops=20000"

        def factory() -> CompactingStore:
            return EtcdStore.from_url(url)

    yield StoreCase(kind, url, prefix, factory)
