"""SqliteStore commits the writing transactions asked for in one turn of the event loop
together: one SQLite transaction, one ``COMMIT`` (one fsync), each transaction decided
as if alone, in order, with a revision of its own; one that fails takes nothing else
with it, and a caller cancelled while waiting has nothing applied."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from axengine.errors import StoreError
from axengine.store import Get, Mod, Put, TxnResult
from axengine.store.embedded import SqliteStore


def _counting_commits(store: SqliteStore) -> list[str]:
    """The COMMIT statements the store's connection runs from now on."""
    seen: list[str] = []
    store._conn.set_trace_callback(lambda sql: seen.append(sql) if sql == "COMMIT" else None)
    return seen


def test_transactions_asked_together_commit_once_each_decided_as_if_alone(
        tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(path=tmp_path / "ax.db")
        base = await store.revision()
        commits = _counting_commits(store)
        results = await asyncio.gather(
            store.txn([Mod("/a") == 0], [Put("/a", b"1")]),
            store.txn([Mod("/a") == 0], [Put("/a", b"2")]),  # sees the one before: loses
            store.txn([Mod("/b") == 0], [Put("/b", b"1"), Put("/c", b"1")]),
            store.txn([Mod("/a") == 0], [Put("/a", b"3")], [Get("/a")]),  # loses, reads
        )
        assert len(commits) == 1
        assert [r.succeeded for r in results] == [True, False, True, False]
        # A revision each for the ones that wrote, in the order they were asked.
        assert [r.revision for r in results] == [base + 1, base + 1, base + 2, base + 2]
        assert [kv.value for kv in results[3].reads[0]] == [b"1"]
        assert (await store.get("/a")).value == b"1"  # type: ignore[union-attr]
        assert (await store.get("/c")).mod_revision == base + 2  # type: ignore[union-attr]

        # One at a time: a COMMIT each, as before.
        await store.txn([], [Put("/d", b"1")])
        await store.txn([], [Put("/e", b"1")])
        assert len(commits) == 3
        await store.close()

    asyncio.run(main())


def test_a_transaction_that_fails_in_a_group_is_undone_alone(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(path=tmp_path / "ax.db")
        apply = store._apply

        def failing_after_its_writes(conn: Any, compares: Any, success: Any,
                                     failure: Any) -> tuple[TxnResult, bool]:
            outcome = apply(conn, compares, success, failure)
            if any(getattr(op, "key", "") == "/boom" for op in success):
                raise RuntimeError("boom")
            return outcome

        store._apply = failing_after_its_writes  # type: ignore[method-assign]
        results = await asyncio.gather(
            store.txn([], [Put("/before", b"1")]),
            store.txn([], [Put("/partial", b"1"), Put("/boom", b"1")]),
            store.txn([], [Put("/after", b"1")]),
            return_exceptions=True)
        assert isinstance(results[1], RuntimeError)
        assert [isinstance(r, TxnResult) and r.succeeded for r in (results[0], results[2])] \
            == [True, True]
        assert await store.get("/partial") is None and await store.get("/boom") is None
        assert await store.get("/before") is not None and await store.get("/after") is not None
        # The failed one took no revision: the two others are consecutive.
        assert results[2].revision == results[0].revision + 1  # type: ignore[union-attr]

        # Alone, its failure is the whole transaction's, as before the groups.
        with pytest.raises(RuntimeError):
            await store.txn([], [Put("/partial", b"2"), Put("/boom", b"2")])
        assert await store.get("/partial") is None
        await store.close()

    asyncio.run(main())


def test_a_caller_cancelled_while_waiting_has_nothing_applied(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(path=tmp_path / "ax.db")
        kept = asyncio.create_task(store.txn([], [Put("/kept", b"1")]))
        dropped = asyncio.create_task(store.txn([], [Put("/dropped", b"1")]))
        await asyncio.sleep(0)  # both queued for the group commit, not yet committed
        dropped.cancel()
        assert (await kept).succeeded
        with pytest.raises(asyncio.CancelledError):
            await dropped
        assert await store.get("/kept") is not None
        assert await store.get("/dropped") is None
        await store.close()

    asyncio.run(main())


def test_a_closed_store_answers_every_waiting_transaction(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(path=tmp_path / "ax.db")
        waiting = [asyncio.create_task(store.txn([], [Put(f"/k{i}", b"1")])) for i in range(3)]
        await asyncio.sleep(0)  # queued
        await store.close()
        for task in waiting:
            with pytest.raises(StoreError, match="closed"):
                await task

    asyncio.run(main())
