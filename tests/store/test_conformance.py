"""The ``StateStore`` contract, checked against every implementation (sqlite, etcd).

Each test runs once per store kind (see ``conftest.store``) against a real backend.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from axengine.errors import RevisionCompacted, StoreError
from axengine.store import (
    Compare,
    Create,
    Delete,
    Get,
    KeyValue,
    Mod,
    Put,
    StateStore,
    Value,
    Version,
    WatchEvent,
)
from tests.store.conftest import StoreCase

#: Upper bound for anything awaited in these tests (never a synchronisation sleep).
WAIT = 10.0


async def _take(events: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    """The next ``count`` events of a watch, then close it."""
    seen: list[WatchEvent] = []
    try:
        async with asyncio.timeout(WAIT):
            async for event in events:
                seen.append(event)
                if len(seen) == count:
                    break
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return seen


def _summary(events: list[WatchEvent]) -> list[tuple[str, str, bytes]]:
    return [(e.kind, e.kv.key, e.kv.value) for e in events]


def test_implements_protocol(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            assert isinstance(s, StateStore)

    asyncio.run(main())


def test_put_get_revisions(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            k = store.key("a")
            assert await s.get(k) is None
            first = await s.txn([], [Put(k, b"1")])
            assert first.succeeded
            assert await s.get(k) == KeyValue(k, b"1", first.revision, first.revision, 1)
            second = await s.txn([], [Put(k, b"2")])
            assert second.revision == first.revision + 1
            assert await s.get(k) == KeyValue(k, b"2", first.revision, second.revision, 2)
            assert await s.revision() == second.revision
            # Deleting and re-creating starts a new life: new create_revision, version 1.
            gone = await s.txn([], [Delete(k)])
            assert gone.revision == second.revision + 1
            assert await s.get(k) is None
            again = await s.txn([], [Put(k, b"3")])
            assert await s.get(k) == KeyValue(k, b"3", again.revision, again.revision, 1)

    asyncio.run(main())


def test_missing_key_compares_as_zero(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            k = store.key("missing")
            for compare in (Mod(k) == 0, Create(k) == 0, Version(k) == 0, Mod(k) < 1):
                assert (await s.txn([compare], [])).succeeded, compare
            for compare in (Mod(k) > 0, Version(k) != 0):
                assert not (await s.txn([compare], [])).succeeded, compare
            # As in etcd, a value compare on a missing key is false whatever the operator.
            for compare in (Value(k) == b"", Value(k) != b"x"):
                assert not (await s.txn([compare], [])).succeeded, compare
            created = await s.txn([Mod(k) == 0], [Put(k, b"v")])
            assert created.succeeded
            assert not (await s.txn([Mod(k) == 0], [Put(k, b"w")])).succeeded
            assert (await s.get(k)) == KeyValue(k, b"v", created.revision, created.revision, 1)

    asyncio.run(main())


def test_compare_targets_and_operators(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            k = store.key("c")
            created = (await s.txn([], [Put(k, b"m")])).revision
            modified = (await s.txn([], [Put(k, b"m")])).revision  # version 2
            cases: list[tuple[Compare, bool]] = [
                (Mod(k) == modified, True),
                (Mod(k) != modified, False),
                (Mod(k) < modified + 1, True),
                (Mod(k) < modified, False),
                (Mod(k) > modified - 1, True),
                (Mod(k) > modified, False),
                (Create(k) == created, True),
                (Create(k) != created, False),
                (Create(k) < modified, True),
                (Create(k) > created, False),
                (Version(k) == 2, True),
                (Version(k) != 2, False),
                (Version(k) < 3, True),
                (Version(k) > 2, False),
                (Value(k) == b"m", True),
                (Value(k) != b"m", False),
                (Value(k) < b"n", True),
                (Value(k) < b"m", False),
                (Value(k) > b"l", True),
                (Value(k) > b"m", False),
            ]
            for compare, expected in cases:
                result = await s.txn([compare], [])
                assert result.succeeded is expected, compare
                assert result.revision == modified
            # Several compares: all must hold.
            assert (await s.txn([Version(k) == 2, Value(k) == b"m"], [])).succeeded
            assert not (await s.txn([Version(k) == 2, Value(k) == b"x"], [])).succeeded

    asyncio.run(main())


def test_failed_compare_writes_nothing_and_runs_failure(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            a, b, c = store.key("a"), store.key("b"), store.key("c")
            base = (await s.txn([], [Put(a, b"1")])).revision
            result = await s.txn(
                [Mod(a) == base, Value(a) == b"other"],
                [Put(b, b"success"), Delete(a), Get(a)],
                [Put(c, b"failure"), Get(a), Get(c), Get(b)],
            )
            assert not result.succeeded
            assert result.revision == base + 1
            assert await s.get(b) is None
            assert (await s.get(a)) == KeyValue(a, b"1", base, base, 1)
            assert [[kv.key for kv in read] for read in result.reads] == [[a], [c], []]
            assert result.reads[1][0].value == b"failure"
            # A failed compare with an empty failure branch changes nothing at all.
            nothing = await s.txn([Value(a) == b"nope"], [Put(b, b"x")])
            assert (nothing.succeeded, nothing.revision, nothing.reads) == (False, base + 1, ())
            assert await s.revision() == base + 1

    asyncio.run(main())


def test_revision_bumps_once_per_writing_txn(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            keys = [store.key(f"k{i}") for i in range(5)]
            before = await s.revision()
            wrote = await s.txn([], [Put(k, b"x") for k in keys])
            assert wrote.revision == before + 1
            assert {kv.mod_revision for kv in (await s.get_many(keys)).values()} == {
                wrote.revision
            }
            read_only = await s.txn([Mod(keys[0]) == wrote.revision], [Get(keys[0])], [])
            assert read_only.succeeded
            assert read_only.revision == wrote.revision
            # Deleting nothing writes nothing, as in etcd.
            noop = await s.txn([], [Delete(store.key("absent")), Delete(store.key("zz/"), True)])
            assert noop.revision == wrote.revision
            mixed = await s.txn([], [Put(keys[0], b"y"), Delete(keys[1]), Get(keys[0])])
            assert mixed.revision == wrote.revision + 1
            assert await s.revision() == wrote.revision + 1

    asyncio.run(main())


def test_reads_inside_txn_see_its_own_writes(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            p = store.key("r/")
            await s.txn([], [Put(p + "b", b"old"), Put(p + "c", b"c")])
            result = await s.txn(
                [],
                [
                    Get(p + "b"),
                    Put(p + "b", b"new"),
                    Put(p + "a", b"a"),
                    Get(p + "b"),
                    Get(p, prefix=True),
                    Get(p + "zzz"),
                ],
            )
            before, after, listing, missing = result.reads
            assert [kv.value for kv in before] == [b"old"]
            assert after == (KeyValue(p + "b", b"new", result.revision - 1, result.revision, 2),)
            assert [kv.key for kv in listing] == [p + "a", p + "b", p + "c"]
            assert missing == ()

    asyncio.run(main())


def test_delete_and_delete_prefix(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            names = ["a", "a/x", "a/y", "ab", "b", "b/a"]
            await s.txn([], [Put(store.key(n), n.encode()) for n in names])
            deleted = await s.txn([], [Delete(store.key("a/"), prefix=True)])
            assert [kv.key for kv in await s.range(store.prefix)] == [
                store.key(n) for n in ("a", "ab", "b", "b/a")
            ]
            await s.txn([], [Delete(store.key("a"))])
            assert [kv.key for kv in await s.range(store.prefix)] == [
                store.key(n) for n in ("ab", "b", "b/a")
            ]
            # A bare-string prefix covers every key starting with it, "/"-separated or not.
            await s.txn([], [Delete(store.key("b"), prefix=True)])
            assert [kv.key for kv in await s.range(store.prefix)] == [store.key("ab")]
            assert await s.revision() == deleted.revision + 2

    asyncio.run(main())


def test_count_counts_the_keys_of_a_prefix(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            names = ["a", "a0", "c", "c/0", "c/1", "ä"]
            await s.txn([], [Put(store.key(n), b"x" * 10) for n in names])
            assert await s.count(store.prefix) == 6
            assert await s.count(store.key("c")) == 3
            assert await s.count(store.key("a")) == 2
            assert await s.count(store.key("zz")) == 0
            await s.txn([], [Delete(store.key("c/0"))])
            assert await s.count(store.key("c")) == 2

    asyncio.run(main())


def test_range_order_start_after_and_limit(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            names = ["b", "a", "c/1", "c", "ä", "Z", "a0", "c/0"]
            await s.txn([], [Put(store.key(n), b"") for n in names])
            # Keys sort by their UTF-8 bytes, as in etcd.
            ordered = sorted(names, key=lambda n: n.encode())
            everything = await s.range(store.prefix)
            assert [kv.key for kv in everything] == [store.key(n) for n in ordered]
            assert [kv.key for kv in await s.range(store.key("c"))] == [
                store.key(n) for n in ("c", "c/0", "c/1")
            ]
            after = await s.range(store.prefix, start_after=store.key("a0"))
            assert [kv.key for kv in after] == [store.key(n) for n in ordered[3:]]
            assert [kv.key for kv in await s.range(store.prefix, limit=2)] == [
                store.key(n) for n in ordered[:2]
            ]
            # Paging with start_after + limit visits every key once, in order.
            paged: list[str] = []
            cursor: str | None = None
            while page := await s.range(store.prefix, start_after=cursor, limit=3):
                paged.extend(kv.key for kv in page)
                cursor = page[-1].key
            assert paged == [store.key(n) for n in ordered]
            # start_after before the prefix starts at the prefix; after it, nothing.
            assert len(await s.range(store.key("c"), start_after=store.key("a"))) == 3
            assert await s.range(store.key("c"), start_after=store.key("d")) == []
            assert await s.range(store.key("nothing")) == []
            with pytest.raises(ValueError):
                await s.range(store.prefix, limit=-1)

    asyncio.run(main())


def test_get_many(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            keys = [store.key(f"k{i:03}") for i in range(300)]
            result = await s.txn([], [Put(k, k.encode()) for k in keys[::2]])
            found = await s.get_many([*keys, keys[0], store.key("missing")])
            assert sorted(found) == keys[::2]
            assert all(kv.value == k.encode() for k, kv in found.items())
            assert {kv.mod_revision for kv in found.values()} == {result.revision}
            assert await s.get_many([]) == {}

    asyncio.run(main())


def test_get_many_reads_one_revision(store: StoreCase) -> None:
    """A writer keeps two keys equal in every txn; no reader may see them differ."""

    async def main() -> None:
        async with store.open() as writer_store, store.open() as reader_store:
            a, b = store.key("a"), store.key("b")
            await writer_store.txn([], [Put(a, b"0"), Put(b, b"0")])
            done = asyncio.Event()

            async def writer() -> None:
                for i in range(1, 101):
                    await writer_store.txn([], [Put(a, b"%d" % i), Put(b, b"%d" % i)])
                done.set()

            async def reader() -> int:
                reads = 0
                while not done.is_set() or reads == 0:
                    both = await reader_store.get_many([a, b])
                    assert both[a].value == both[b].value
                    assert both[a].mod_revision == both[b].mod_revision
                    reads += 1
                    await asyncio.sleep(0)  # yield to the writer, not a synchronisation
                return reads

            _, reads = await asyncio.gather(writer(), reader())
            assert reads > 0
            final = await reader_store.get_many([a, b])
            assert final[a].value == final[b].value == b"100"

    asyncio.run(main())


def test_concurrent_cas_increments_lose_nothing(store: StoreCase) -> None:
    """8 tasks over 2 connections increment one counter with compare-and-swap."""

    async def main() -> None:
        async with store.open() as first, store.open() as second:
            counter = store.key("counter")
            await first.txn([Mod(counter) == 0], [Put(counter, b"0")])

            async def increment(s: StateStore, times: int) -> tuple[int, int]:
                won = lost = 0
                while won < times:
                    kv = await s.get(counter)
                    assert kv is not None
                    result = await s.txn(
                        [Mod(counter) == kv.mod_revision],
                        [Put(counter, b"%d" % (int(kv.value) + 1))],
                    )
                    won += result.succeeded
                    lost += not result.succeeded
                return won, lost

            outcomes = await asyncio.gather(
                *(increment(first if i % 2 else second, 25) for i in range(8))
            )
            successes = sum(won for won, _ in outcomes)
            final = await first.get(counter)
            assert final is not None
            assert int(final.value) == successes == 8 * 25
            assert final.version == successes + 1

    asyncio.run(main())


def test_txn_rejects_a_key_written_twice(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            a = store.key("a")
            before = await s.revision()
            with pytest.raises(ValueError):
                await s.txn([], [Put(a, b"1"), Put(a, b"2")])
            with pytest.raises(ValueError):
                await s.txn([], [Put(a, b"1")], [Delete(store.prefix, prefix=True), Put(a, b"")])
            with pytest.raises(ValueError):
                await s.txn([], [Put("", b"1")])
            assert await s.get(a) is None
            assert await s.revision() == before
            # Overlapping deletes, and reads of a written key, are fine.
            b = store.key("b")
            ok = await s.txn([], [Put(a, b"1"), Get(a), Delete(b), Delete(b, prefix=True)])
            assert ok.succeeded
            assert ok.reads == ((KeyValue(a, b"1", ok.revision, ok.revision, 1),),)

    asyncio.run(main())


def test_compare_operand_types_are_checked(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            k = store.key("k")
            with pytest.raises(TypeError):
                await s.txn([Value(k) < 3], [Put(k, b"x")])
            with pytest.raises(TypeError):
                await s.txn([Mod(k) > b"3"], [Put(k, b"x")])
            with pytest.raises(TypeError):
                await s.txn([], [Put(k, "text")])  # type: ignore[arg-type]
            assert await s.get(k) is None

    asyncio.run(main())


def test_watch_sees_puts_and_deletes_in_order(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            p = store.key("w/")
            start = await s.revision() + 1
            await s.txn([], [Put(p + "a", b"1")])
            await s.txn([], [Put(p + "b", b"2"), Put(p + "a", b"3")])
            await s.txn([], [Put(store.key("outside"), b"x")])
            await s.txn([], [Delete(p + "a")])
            last = await s.txn([], [Delete(p, prefix=True)])
            events = await _take(s.watch(p, start_revision=start), 5)
            assert _summary(events) == [
                ("put", p + "a", b"1"),
                ("put", p + "b", b"2"),
                ("put", p + "a", b"3"),
                ("delete", p + "a", b""),
                ("delete", p + "b", b""),
            ]
            assert [e.kv.mod_revision for e in events] == [
                start, start + 1, start + 1, start + 3, last.revision
            ]
            assert [e.kv.version for e in events[:3]] == [1, 1, 2]
            assert events[2].kv.create_revision == start

    asyncio.run(main())


def test_watch_follows_live_writes(store: StoreCase) -> None:
    """A watch from "now" sees later writes (and not earlier ones) as they happen."""

    async def main() -> None:
        async with store.open() as s, store.open() as other:
            p = store.key("live/")
            await s.txn([], [Put(p + "before", b"old")])
            events = s.watch(p)
            seen: list[WatchEvent] = []
            got_tick = asyncio.Event()

            async def consume() -> None:
                async for event in events:
                    seen.append(event)
                    if event.kv.key.startswith(p + "tick"):
                        got_tick.set()
                    if event.kv.key == p + "end":
                        return

            task = asyncio.create_task(consume())
            # Until the watch is established we cannot know it has started; write
            # ticks (from another connection) until one arrives.
            async with asyncio.timeout(WAIT):
                tick = 0
                while not got_tick.is_set():
                    await other.txn([], [Put(p + f"tick{tick}", b"")])
                    tick += 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(got_tick.wait(), 0.1)
            await other.txn([], [Put(p + "x", b"1")])
            await other.txn([], [Delete(p + "x"), Put(p + "end", b"")])
            async with asyncio.timeout(WAIT):
                await task
            await events.aclose()  # type: ignore[attr-defined]
            keys = [e.kv.key for e in seen]
            assert p + "before" not in keys
            assert keys[-3:] == [p + "x", p + "x", p + "end"]
            assert [e.kind for e in seen[-3:]] == ["put", "delete", "put"]
            revisions = [e.kv.mod_revision for e in seen]
            assert revisions == sorted(revisions)

    asyncio.run(main())


def test_watch_of_compacted_revision_raises(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as s:
            k = store.key("compact")
            first = await s.txn([], [Put(k, b"1")])
            await s.txn([], [Put(k, b"2")])
            last = await s.txn([], [Put(k, b"3")])
            await s.compact(last.revision)
            await s.compact(first.revision)  # older than what is compacted: no-op
            with pytest.raises(RevisionCompacted):
                await _take(s.watch(store.prefix, start_revision=first.revision), 1)
            # The compacted revision itself is still watchable.
            events = await _take(s.watch(store.prefix, start_revision=last.revision), 1)
            assert _summary(events) == [("put", k, b"3")]
            with pytest.raises(ValueError):
                await s.compact(last.revision + 1000)

    asyncio.run(main())


def test_watch_ends_when_store_closes(store: StoreCase) -> None:
    async def main() -> None:
        async with store.open() as keeper:
            s = store.factory()
            k = store.key("k")
            first = await s.txn([], [Put(k, b"1")])
            seen: list[WatchEvent] = []
            arrived = asyncio.Event()

            async def consume() -> None:
                async for event in s.watch(store.prefix, start_revision=first.revision):
                    seen.append(event)
                    arrived.set()

            task = asyncio.create_task(consume())
            async with asyncio.timeout(WAIT):
                await arrived.wait()
            await s.close()
            async with asyncio.timeout(WAIT):
                await task  # ends without an error
            assert [e.kv.key for e in seen] == [k]
            with pytest.raises(StoreError):
                await s.get(k)
            assert (await keeper.get(k)) is not None

    asyncio.run(main())
