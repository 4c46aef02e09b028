"""SqliteStore beyond the shared contract: files, processes, durability, compaction."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from axengine.errors import RevisionCompacted, StoreError, StoreUnavailable
from axengine.store import Delete, KeyValue, Mod, Put, WatchEvent
from axengine.store.embedded import SqliteStore
from axengine.store.settings import SqliteSettings

ROOT = Path(__file__).resolve().parents[2]
WAIT = 10.0


def _python(script: str, *args: str) -> subprocess.Popen[str]:
    """Start ``script`` in a fresh interpreter that can import axengine."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


async def _take(events: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
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


def test_data_and_revision_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "ax.db"  # parent directories are created

    async def write() -> tuple[int, int]:
        async with SqliteStore.open(path) as store:
            first = await store.txn([], [Put("/a", b"1"), Put("/b", b"2")])
            last = await store.txn([Mod("/a") == first.revision], [Put("/a", b"3")])
            assert last.succeeded
            return first.revision, last.revision

    async def read(first: int, last: int) -> None:
        async with SqliteStore.from_url(f"sqlite://{path}") as store:
            assert await store.revision() == last
            assert await store.get("/a") == KeyValue("/a", b"3", first, last, 2)
            assert await store.get("/b") == KeyValue("/b", b"2", first, first, 1)
            # The change log survives too: a watch can replay from before the reopen.
            events = await _take(store.watch("/", start_revision=first), 3)
            assert [(e.kv.key, e.kv.mod_revision) for e in events] == [
                ("/a", first),
                ("/b", first),
                ("/a", last),
            ]
            again = await store.txn([], [Put("/c", b"")])
            assert again.revision == last + 1

    first, last = asyncio.run(write())
    asyncio.run(read(first, last))


def _old_change_log_file(path: Path) -> None:
    """A file as the store wrote it before 2026-12-04: the change log in ``ax_changes``,
    keyed by ``(revision, seq)`` WITHOUT ROWID; revisions 2 and 3 written."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("""
        CREATE TABLE ax_meta (id INTEGER PRIMARY KEY CHECK (id = 0),
            revision INTEGER NOT NULL, compact_revision INTEGER NOT NULL);
        INSERT INTO ax_meta VALUES (0, 3, 0);
        CREATE TABLE ax_kv (key BLOB PRIMARY KEY, value BLOB NOT NULL,
            create_revision INTEGER NOT NULL, mod_revision INTEGER NOT NULL,
            version INTEGER NOT NULL) WITHOUT ROWID;
        INSERT INTO ax_kv VALUES (x'2f61', x'33', 2, 3, 2), (x'2f62', x'32', 2, 2, 1);
        CREATE TABLE ax_changes (revision INTEGER NOT NULL, seq INTEGER NOT NULL,
            key BLOB NOT NULL, kind INTEGER NOT NULL, value BLOB NOT NULL,
            create_revision INTEGER NOT NULL, version INTEGER NOT NULL,
            PRIMARY KEY (revision, seq)) WITHOUT ROWID;
        INSERT INTO ax_changes VALUES (2, 0, x'2f61', 0, x'31', 2, 1),
            (2, 1, x'2f62', 0, x'32', 2, 1), (3, 0, x'2f61', 0, x'33', 2, 2);
    """)
    conn.close()


def test_a_file_with_the_old_change_log_keeps_its_history(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_change_log_file(path)

    async def main() -> None:
        async with SqliteStore.open(path) as store:
            events = await _take(store.watch("/", start_revision=2), 3)
            assert [(e.kv.key, e.kv.value, e.kv.mod_revision, e.kv.version)
                    for e in events] == [("/a", b"1", 2, 1), ("/b", b"2", 2, 1),
                                         ("/a", b"3", 3, 2)]
            # New changes follow the moved ones, in order.
            new = await store.txn([], [Put("/b", b"4")])
            assert new.revision == 4
            tail = await _take(store.watch("/", start_revision=3), 2)
            assert [(e.kv.key, e.kv.mod_revision) for e in tail] == [("/a", 3), ("/b", 4)]

    asyncio.run(main())
    tables = {row[0] for row in sqlite3.connect(path).execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "ax_changes" not in tables and "ax_changelog" in tables


def test_sigkill_loses_no_committed_txn(tmp_path: Path) -> None:
    """Every txn whose call returned is on disk after the process is SIGKILLed."""
    path = str(tmp_path / "kill.db")
    script = """
        import asyncio, sys
        from axengine.store import Put
        from axengine.store.embedded import SqliteStore

        async def main() -> None:
            store = SqliteStore(path=sys.argv[1])
            i = 0
            while True:
                result = await store.txn([], [Put(f"/k/{i:06}", str(i).encode())])
                print(i, result.revision, flush=True)
                i += 1

        asyncio.run(main())
    """
    reported: list[tuple[int, int]] = []
    with _python(script, path) as proc:
        assert proc.stdout is not None
        while len(reported) < 300:
            line = proc.stdout.readline()
            assert line, "writer exited early"
            index, revision = map(int, line.split())
            reported.append((index, revision))
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
    assert proc.returncode == -signal.SIGKILL

    async def check() -> None:
        async with SqliteStore.open(path) as store:
            rows = await store.range("/k/")
            keys = [kv.key for kv in rows]
            # Commits are gap-free, and include every one the writer saw returning.
            assert keys == [f"/k/{i:06}" for i in range(len(keys))]
            assert len(keys) >= len(reported)
            for index, revision in reported:
                assert rows[index].mod_revision == revision
            assert await store.revision() == rows[-1].mod_revision

    asyncio.run(check())


def test_two_processes_share_a_file_without_lost_updates(tmp_path: Path) -> None:
    """Two processes x 4 tasks CAS-increment one counter; a third watches every step."""
    path = str(tmp_path / "shared.db")
    script = """
        import asyncio, sys
        from axengine.store import Mod, Put
        from axengine.store.embedded import SqliteStore

        async def main(path: str, times: int) -> None:
            store = SqliteStore(path=path)

            async def increment() -> int:
                won = 0
                while won < times:
                    kv = await store.get("/counter")
                    result = await store.txn(
                        [Mod("/counter") == kv.mod_revision],
                        [Put("/counter", str(int(kv.value) + 1).encode())],
                    )
                    won += result.succeeded
                return won

            print("ready", flush=True)
            sys.stdin.readline()  # start together with the other process
            total = sum(await asyncio.gather(*(increment() for _ in range(4))))
            await store.close()
            print(total, flush=True)

        asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
    per_task = 150
    total = 2 * 4 * per_task

    async def run() -> None:
        async with SqliteStore.open(path) as store:
            created = await store.txn([Mod("/counter") == 0], [Put("/counter", b"0")])
            watch = store.watch("/counter", start_revision=created.revision + 1)
            with _python(script, path, str(per_task)) as one, _python(
                script, path, str(per_task)
            ) as two:
                procs = (one, two)
                for proc in procs:
                    assert proc.stdout is not None and proc.stdin is not None
                    assert proc.stdout.readline().strip() == "ready"
                for proc in procs:
                    assert proc.stdin is not None
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                events = await _take(watch, total)
                wins = []
                for proc in procs:
                    assert proc.stdout is not None
                    wins.append(int(proc.stdout.readline()))
                    assert proc.wait(WAIT) == 0
            assert sum(wins) == total
            final = await store.get("/counter")
            assert final is not None and int(final.value) == total
            # Each successful txn bumped the one revision once, and the watch (fed by
            # polling, since the writes came from other processes) saw every step.
            assert final.mod_revision == created.revision + total
            assert [int(e.kv.value) for e in events] == list(range(1, total + 1))
            assert [e.kv.mod_revision for e in events] == [
                created.revision + i for i in range(1, total + 1)
            ]

    asyncio.run(run())


def test_stores_of_one_process_wake_each_others_watchers(tmp_path: Path) -> None:
    path = tmp_path / "wake.db"

    async def main() -> None:
        # A poll interval far beyond the test's patience: only the wakeup can deliver.
        async with SqliteStore.open(path, poll_interval=3600) as watcher, SqliteStore.open(
            path
        ) as writer:
            events = watcher.watch("/w/")
            seen: list[WatchEvent] = []
            first_seen = asyncio.Event()

            async def consume() -> None:
                async for event in events:
                    seen.append(event)
                    first_seen.set()
                    if len(seen) == 2:
                        return

            task = asyncio.create_task(consume())
            await writer.txn([], [Put("/w/a", b"1")])
            async with asyncio.timeout(WAIT):
                await first_seen.wait()
            # The consumer ran on until it parked in the watch's wait; the next write
            # reaches it only through the in-process wakeup.
            await writer.txn([], [Delete("/w/a")])
            async with asyncio.timeout(WAIT):
                await task
            await events.aclose()  # type: ignore[attr-defined]
            assert [(e.kind, e.kv.key) for e in seen] == [("put", "/w/a"), ("delete", "/w/a")]

    asyncio.run(main())


def test_history_is_compacted_to_the_retention(tmp_path: Path) -> None:
    async def main() -> None:
        async with SqliteStore.open(tmp_path / "r.db", watch_retention=10) as store:
            first = await store.revision() + 1
            for i in range(40):
                await store.txn([], [Put("/k", b"%d" % i)])
            last = await store.revision()
            with pytest.raises(RevisionCompacted):
                await _take(store.watch("/", start_revision=first), 1)
            # At least the last `watch_retention` revisions stay watchable.
            recent = await _take(store.watch("/", start_revision=last - 9), 10)
            assert [e.kv.value for e in recent] == [b"%d" % i for i in range(30, 40)]
            # Compaction never touches the data itself.
            kv = await store.get("/k")
            assert kv is not None and kv.version == 40

    asyncio.run(main())


def test_a_watcher_that_falls_behind_compaction_gets_revision_compacted(tmp_path: Path) -> None:
    async def main() -> None:
        async with SqliteStore.open(tmp_path / "lag.db") as store:
            start = (await store.txn([], [Put("/a", b"0")])).revision
            events = store.watch("/", start_revision=start)
            first = await anext(events)
            assert first.kv.value == b"0"
            # Two revisions the watcher has not read yet are compacted away.
            await store.txn([], [Put("/a", b"1")])
            latest = (await store.txn([], [Put("/a", b"2")])).revision
            await store.compact(latest)
            with pytest.raises(RevisionCompacted):
                await anext(events)

    asyncio.run(main())


def test_a_held_write_lock_times_out_as_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"

    async def main() -> None:
        async with SqliteStore.open(path, busy_timeout=0.2) as store:
            await store.txn([], [Put("/k", b"1")])
            other = sqlite3.connect(path, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")  # another process holding the write lock
                with pytest.raises(StoreUnavailable):
                    await store.txn([], [Put("/k", b"2")])
                # WAL readers are not blocked by a writer.
                kv = await store.get("/k")
                assert kv is not None and kv.value == b"1"
                other.execute("ROLLBACK")
            finally:
                other.close()
            assert (await store.txn([], [Put("/k", b"3")])).succeeded

    asyncio.run(main())


def test_database_is_durable_wal(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"

    async def main() -> None:
        async with SqliteStore.open(path) as store:
            await store.txn([], [Put("/k", b"")])
            # 2 = FULL: the WAL is fsynced at every commit.
            assert store._conn.execute("PRAGMA synchronous").fetchone() == (2,)
        check = sqlite3.connect(path)
        try:
            assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        finally:
            check.close()

    asyncio.run(main())


def test_memory_store_and_closed_store() -> None:
    async def main() -> None:
        store = SqliteStore.from_url("sqlite://:memory:")
        assert await store.revision() == 1
        result = await store.txn([Mod("/m") == 0], [Put("/m", b"x")])
        assert result.revision == 2
        await store.close()
        await store.close()  # harmless
        with pytest.raises(StoreError):
            await store.get("/m")
        with pytest.raises(StoreError):
            await store.txn([], [Put("/m", b"y")])

    asyncio.run(main())


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///var/lib/ax/state.db", SqliteSettings(path="/var/lib/ax/state.db")),
        ("sqlite://ax.db", SqliteSettings(path="ax.db")),
        ("sqlite://:memory:", SqliteSettings(path=":memory:")),
        ("sqlite:///:memory:", SqliteSettings(path=":memory:")),
        ("SQLITE:///a%20b.db", SqliteSettings(path="/a b.db")),
        (
            "sqlite:///x.db?busy_timeout=2.5&synchronous=normal&watch_retention=50"
            "&poll_interval=0.1",
            SqliteSettings(
                path="/x.db",
                busy_timeout=2.5,
                synchronous="NORMAL",
                watch_retention=50,
                poll_interval=0.1,
            ),
        ),
    ],
)
def test_settings_from_url(url: str, expected: SqliteSettings) -> None:
    assert SqliteSettings.from_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "etcd://127.0.0.1:2379",
        "/var/lib/ax.db",
        "sqlite://",
        "sqlite:///x.db?synchronous=off",
        "sqlite:///x.db?busy_timeout=soon",
        "sqlite:///x.db?watch_retention=0",
        "sqlite:///x.db?poll_interval=0",
        "sqlite:///x.db?colour=blue",
    ],
)
def test_settings_from_bad_url(url: str) -> None:
    with pytest.raises(ValueError):
        SqliteSettings.from_url(url)


def test_from_url_opens_the_file(tmp_path: Path) -> None:
    path = tmp_path / "u.db"

    async def main() -> None:
        store = SqliteStore.from_url(f"sqlite://{path}?synchronous=normal&watch_retention=7")
        try:
            assert store.settings.synchronous == "NORMAL"
            assert store.settings.watch_retention == 7
            await store.txn([], [Put("/k", b"v")])
        finally:
            await store.close()
        assert path.exists()

    asyncio.run(main())


def test_constructor_rejects_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SqliteStore(path=tmp_path / "a.db", synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SqliteStore(path=tmp_path / "b.db", watch_retention=0)
    assert not (tmp_path / "a.db").exists()


def test_a_transaction_reads_values_back_only_for_a_value_compare(tmp_path: Path) -> None:
    # Compares on revisions and versions need no value: a large one is not read back.
    from axengine.store import Value

    async def main() -> None:
        async with SqliteStore.open(tmp_path / "ax.db") as store:
            first = await store.txn([], [Put("/a", b"x" * 100_000), Put("/b", b"b")])
            statements: list[str] = []
            store._conn.set_trace_callback(statements.append)  # (the store's connection)
            moved = await store.txn([Mod("/a") == first.revision], [Put("/a", b"y")])
            assert moved.succeeded
            reads = [s for s in statements if s.startswith("SELECT") and "ax_kv" in s]
            assert reads and all("x''" in s for s in reads), reads
            statements.clear()
            held = await store.txn([Value("/b") == b"b", Mod("/a") == moved.revision],
                                   [Put("/b", b"c")])
            missed = await store.txn([Value("/b") == b"b"], [Put("/b", b"d")])
            assert (held.succeeded, missed.succeeded) == (True, False)
            assert any("SELECT key, value" in s for s in statements), statements
            store._conn.set_trace_callback(None)
            got = await store.get("/b")
            assert got is not None and got.value == b"c"

    asyncio.run(main())
