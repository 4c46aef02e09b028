"""EtcdStore sends transactions that wait while another is on its way to etcd together,
as nested transactions of one ``Txn`` request (``axengine/store/_etcd_merge.py``): each
commits or fails exactly as it would alone; transactions whose keys meet never share a
request; a request refused as a whole is sent again one by one; a caller cancelled
while waiting has nothing applied. Against the session's real etcd."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aetcd import rpc

from axengine.errors import StoreUnavailable
from axengine.store import Delete, Get, Mod, Put, TxnResult, Value
from axengine.store._etcd_merge import Merger
from axengine.store.etcd import EtcdStore
from tests.servers import Server


def _store(server: Server, **options: Any) -> EtcdStore:
    return EtcdStore(endpoints=[("127.0.0.1", server.port)], **options)


def _run(server: Server, body: Callable[[EtcdStore, str], Awaitable[None]],
         **options: Any) -> None:
    prefix = f"/axtest/merge-{uuid.uuid4().hex[:10]}/"

    async def main() -> None:
        async with _store(server, **options) as store:
            try:
                await body(store, prefix)
            finally:
                await store.txn([], [Delete(prefix, prefix=True)])

    asyncio.run(main())


async def _value(store: EtcdStore, key: str) -> bytes | None:
    found = await store.get(key)
    return None if found is None else found.value


def test_transactions_that_wait_go_out_in_one_request_each_decided_as_alone(
        etcd_server: Server) -> None:
    async def body(store: EtcdStore, p: str) -> None:
        setup = await store.txn([], [Put(p + "a", b"0"), Put(p + "b", b"0")])
        merger = store._merger
        sent, carried = merger.sent, merger.carried
        results = await asyncio.gather(
            store.txn([], [Put(p + "first", b"1")]),  # goes at once; the rest wait
            store.txn([Mod(p + "a") == setup.revision], [Put(p + "a", b"1")]),
            store.txn([Mod(p + "b") == 1], [Put(p + "b", b"lost")],  # a stale compare
                      [Get(p + "b")]),
            store.txn([Value(p + "c") == b"x"], [Put(p + "c", b"never")],
                      [Put(p + "c-missing", b"yes")]),
            store.txn([], [Put(p + "d", b"1"), Get(p + "d")]),
        )
        assert (merger.sent - sent, merger.carried - carried) == (2, 5)
        assert [r.succeeded for r in results] == [True, True, False, False, True]
        # The four that waited were committed at one revision, after the first.
        assert len({r.revision for r in results[1:]}) == 1
        assert results[1].revision > results[0].revision
        # Each one's reads come from its own branch.
        assert [kv.value for kv in results[2].reads[0]] == [b"0"]
        assert [kv.value for kv in results[4].reads[0]] == [b"1"]
        assert results[1].reads == () and results[3].reads == ()
        assert await _value(store, p + "a") == b"1"
        assert await _value(store, p + "b") == b"0"
        assert await _value(store, p + "c") is None
        assert await _value(store, p + "c-missing") == b"yes"
        a = await store.get(p + "a")
        assert a is not None and a.mod_revision == results[1].revision

    _run(etcd_server, body)


def test_transactions_whose_keys_meet_never_share_a_request(etcd_server: Server) -> None:
    """Such transactions go in separate requests, sent at the same time: etcd orders
    them, as it orders any concurrent requests. Within one request nothing would."""

    async def body(store: EtcdStore, p: str) -> None:
        base = (await store.txn([], [Put(p + "x", b"0"), Put(p + "y", b"0")])).revision
        merger = store._merger
        sent = merger.sent
        results = await asyncio.gather(
            store.txn([], [Put(p + "other", b"1")]),  # in flight while the rest wait
            # Both compare x at the same revision: alone, one after the other, only the
            # first holds. Merged, etcd would refuse the request (x put twice).
            store.txn([Mod(p + "x") == base], [Put(p + "x", b"A")]),
            store.txn([Mod(p + "x") == base], [Put(p + "x", b"B")]),
            # Write skew: each compares what the other writes. Merged, both compares
            # would see the state before both and both would commit; one after the
            # other, the second sees the first's write.
            store.txn([Mod(p + "y") == base], [Put(p + "z", b"1")]),
            store.txn([Mod(p + "z") == 0], [Put(p + "y", b"1")]),
        )
        # Exactly one of each pair commits, as one after the other.
        assert sorted(r.succeeded for r in results[1:3]) == [False, True]
        winner = b"A" if results[1].succeeded else b"B"
        assert await _value(store, p + "x") == winner
        assert sorted(r.succeeded for r in results[3:]) == [False, True]
        assert (await store.get(p + "z") is None) == results[4].succeeded
        # The first alone; then, at once, one of x with the first of the skew pair, and
        # the other of x with the second.
        assert merger.sent - sent == 3

    _run(etcd_server, body)


def test_a_prefix_read_or_delete_is_sent_alone(etcd_server: Server) -> None:
    async def body(store: EtcdStore, p: str) -> None:
        await store.txn([], [Put(p + "d/1", b"1")])
        merger = store._merger
        sent, carried = merger.sent, merger.carried
        results = await asyncio.gather(
            store.txn([], [Put(p + "first", b"1")]),
            store.txn([], [Put(p + "d/2", b"2")]),
            store.txn([], [Get(p + "d/", prefix=True)]),
            store.txn([], [Delete(p + "e/", prefix=True)]),
        )
        assert all(r.succeeded for r in results)
        # Each went as its own request (only one transaction was waiting to merge).
        assert (merger.sent - sent, merger.carried - carried) == (4, 4)

    _run(etcd_server, body)


def test_a_request_refused_as_a_whole_is_sent_again_one_by_one(etcd_server: Server) -> None:
    async def body(store: EtcdStore, p: str) -> None:
        results = await asyncio.gather(
            store.txn([], [Put(p + "first", b"1")]),
            store.txn([], [Put(p + "good", b"1")]),
            # The same key twice in one branch: etcd refuses the request it is in.
            store.txn([], [Put(p + "twice", b"1"), Put(p + "twice", b"2")]),
            store.txn([], [Put(p + "also-good", b"1")]),
            return_exceptions=True,
        )
        assert isinstance(results[2], ValueError), results[2]
        assert "duplicate key" in str(results[2])
        assert all(isinstance(r, TxnResult) and r.succeeded
                   for i, r in enumerate(results) if i != 2)
        assert await _value(store, p + "good") == b"1"
        assert await _value(store, p + "also-good") == b"1"
        assert await _value(store, p + "twice") is None

    _run(etcd_server, body)


def test_a_caller_cancelled_while_waiting_has_nothing_applied(etcd_server: Server) -> None:
    async def body(store: EtcdStore, p: str) -> None:
        first = asyncio.ensure_future(store.txn([], [Put(p + "first", b"1")]))
        await asyncio.sleep(0)  # the first is on its way: the next one waits
        waiting = asyncio.ensure_future(store.txn([], [Put(p + "cancelled", b"1")]))
        kept = asyncio.ensure_future(store.txn([], [Put(p + "kept", b"1")]))
        await asyncio.sleep(0)
        assert len(store._merger._waiting) == 2
        waiting.cancel()
        assert (await first).succeeded and (await kept).succeeded
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await _value(store, p + "cancelled") is None
        assert await _value(store, p + "kept") == b"1"

    _run(etcd_server, body)


def test_requests_respect_the_operation_bound_of_nested_transactions(
        etcd_server: Server) -> None:
    """etcd allows a nested transaction ``max_txn_ops`` minus the transactions beside
    it: with a bound of 20, 40 waiting transactions of 6 operations go out in several
    requests, none refused."""
    async def body(store: EtcdStore, p: str) -> None:
        merger = store._merger
        sent = merger.sent
        results = await asyncio.gather(*(
            store.txn([], [Put(f"{p}{i}/{j}", b"v") for j in range(6)])
            for i in range(41)))
        assert all(r.succeeded for r in results)
        # 1 alone, then the 40 waiting in requests of at most 20 - 6 = 14 transactions.
        assert merger.sent - sent >= 1 + 3
        assert len(await store.range(p)) == 41 * 6

    _run(etcd_server, body, max_txn_ops=20)


def test_merge_in_flight_0_sends_every_transaction_alone(etcd_server: Server) -> None:
    async def body(store: EtcdStore, p: str) -> None:
        merger = store._merger
        sent = merger.sent
        results = await asyncio.gather(*(store.txn([], [Put(f"{p}{i}", b"v")])
                                         for i in range(10)))
        assert all(r.succeeded for r in results)
        assert len({r.revision for r in results}) == 10
        assert merger.sent - sent == 10

    _run(etcd_server, body, merge_in_flight=0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_concurrent_transfers_keep_the_total_and_every_committed_transfer(
        etcd_server: Server, seed: int) -> None:
    """Many clients move amounts between a few accounts with compare-and-swap loops
    (read both balances, commit both under their mod revisions, retry on a lost
    compare), on one store, so that most transactions are merged. The total never
    changes, and the balances are exactly what the committed transfers add up to: a
    merge that let two conflicting transfers both commit would break one or the
    other."""
    rng = random.Random(seed)
    accounts = 6
    plans = [[(rng.randrange(accounts), rng.randrange(accounts), rng.randrange(1, 5))
              for _ in range(15)] for _ in range(12)]

    async def body(store: EtcdStore, p: str) -> None:
        key = [f"{p}acct/{i}" for i in range(accounts)]
        await store.txn([], [Put(k, b"100") for k in key])
        committed: list[tuple[int, int, int]] = []

        async def client(plan: list[tuple[int, int, int]]) -> None:
            for src, dst, amount in plan:
                if src == dst:
                    continue
                while True:
                    found = await store.get_many([key[src], key[dst]])
                    a, b = found[key[src]], found[key[dst]]
                    result = await store.txn(
                        [Mod(a.key) == a.mod_revision, Mod(b.key) == b.mod_revision],
                        [Put(a.key, str(int(a.value) - amount).encode()),
                         Put(b.key, str(int(b.value) + amount).encode())])
                    if result.succeeded:
                        committed.append((src, dst, amount))
                        break

        sent = store._merger.sent
        carried = store._merger.carried
        await asyncio.gather(*(client(plan) for plan in plans))
        assert store._merger.carried - carried > store._merger.sent - sent  # merged some
        expected = [100] * accounts
        for src, dst, amount in committed:
            expected[src] -= amount
            expected[dst] += amount
        final = await store.get_many(key)
        assert [int(final[k].value) for k in key] == expected
        assert sum(expected) == 100 * accounts

    _run(etcd_server, body)


def test_a_watch_sees_every_write_of_a_merged_request_once(etcd_server: Server) -> None:
    async def body(store: EtcdStore, p: str) -> None:
        start = await store.revision()
        seen: list[tuple[str, int]] = []
        done = asyncio.Event()

        async def follow() -> None:
            async for event in store.watch(p, start_revision=start + 1):
                seen.append((event.kv.key, event.kv.mod_revision))
                if len(seen) == 1 + 2 * 20:
                    done.set()
                    return

        follower = asyncio.ensure_future(follow())
        try:
            results = await asyncio.gather(
                store.txn([], [Put(p + "first", b"1")]),
                *(store.txn([Mod(f"{p}t{i}/a") == 0],
                            [Put(f"{p}t{i}/a", b"a"), Put(f"{p}t{i}/b", b"b")])
                  for i in range(20)))
            await asyncio.wait_for(done.wait(), 10)
        finally:
            follower.cancel()
        assert all(r.succeeded for r in results)
        assert len({r.revision for r in results[1:]}) == 1  # one request for the 20
        expected = {(p + "first", results[0].revision)} | {
            (f"{p}t{i}/{k}", results[1].revision) for i in range(20) for k in "ab"}
        assert len(seen) == len(expected) and set(seen) == expected

    _run(etcd_server, body)


def _put(key: bytes) -> Any:
    return rpc.TxnRequest(compare=[], success=[
        rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"v"))])


def test_a_transaction_waiting_behind_a_silent_etcd_hears_within_its_timeout() -> None:
    """The requests on their way get no answer (etcd is down): a transaction waiting
    behind them gets StoreUnavailable within the store's timeout, not after them and
    then its own request. Still waiting, it is never sent; sent and unanswered, its
    outcome is unknown. (The merger alone, with a send that answers when told.)"""

    async def main() -> None:
        sent: list[Any] = []
        answer: dict[int, asyncio.Future[Any]] = {}

        async def send(request: Any) -> Any:
            sent.append(request)
            answer[len(sent)] = asyncio.get_running_loop().create_future()
            return await answer[len(sent)]

        merger = Merger(send, max_in_flight=1, max_ops=128, max_bytes=1 << 20,
                        timeout=0.05)
        first = asyncio.ensure_future(merger.txn(_put(b"a")))
        while not sent:
            await asyncio.sleep(0)
        with pytest.raises(StoreUnavailable, match="was not sent"):
            await asyncio.wait_for(merger.txn(_put(b"b")), 10)
        assert len(sent) == 1 and not merger._waiting

        # Sent behind the first, and then nothing comes back.
        third = asyncio.ensure_future(merger.txn(_put(b"c")))
        while not merger._waiting:
            await asyncio.sleep(0)
        answer[1].set_result(rpc.TxnResponse(succeeded=True))
        assert (await first).succeeded
        with pytest.raises(StoreUnavailable, match="outcome of the transaction is unknown"):
            await asyncio.wait_for(third, 10)
        assert len(sent) == 2
        answer[2].set_result(rpc.TxnResponse(succeeded=True))  # too late: dropped
        await asyncio.sleep(0)

    asyncio.run(main())
