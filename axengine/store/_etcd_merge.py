"""Concurrent transactions of one :class:`~axengine.store.etcd.EtcdStore`, sent to etcd
together as one ``Txn`` of nested transactions.

While ``max_in_flight`` transaction requests of the store are on their way to etcd, the
next transactions wait; when one comes back, those waiting go out together: one ``Txn``
whose success branch holds each of them as a nested ``Txn`` with its own compares and
branches. etcd evaluates every compare of the request against the state before the
request, then applies each chosen branch, all at one revision — one request, one raft
entry and one fsync for the lot, where each used to cost its own.

Each transaction still commits or fails exactly as it would alone, provided no other
transaction of the request writes a key it compares, reads or writes: its compares then
see what they would see first in a serial order, and no other write touches what it
read. :func:`footprint` gives each transaction's keys. Transactions whose keys meet go
in separate requests, sent at the same time (as they would have been without merging:
etcd orders concurrent requests as it likes), and one with a prefix read or delete is
always sent alone. A request that etcd refuses as a whole (larger than its
``--max-request-bytes``, say) is sent again as its transactions one by one, so that a
refusal reaches only the transaction it concerns. When etcd does not answer, every
transaction of the request gets :class:`StoreUnavailable`: as for one transaction, the
outcome is unknown. A transaction that waits is answered within the store's timeout
too: one still waiting when it lapses is not sent (:class:`StoreUnavailable`, nothing
written).

With no request on its way, a transaction is sent at once, alone: transactions one at a
time (a chain of nodes) wait for nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aetcd import rpc

from axengine.errors import StoreUnavailable

__all__ = ["Answer", "Merger", "footprint"]

#: Bytes of a request counted per operation besides its key and value.
_OP_OVERHEAD = 16


@dataclass(frozen=True)
class Answer:
    """What etcd answered one transaction: whether its compares held, the responses of
    the branch it ran, and the revision of the request that carried it."""

    succeeded: bool
    responses: Sequence[Any]
    revision: int


@dataclass(frozen=True)
class Footprint:
    """The keys a transaction writes (puts, deletes) and reads (compares, gets), the
    bytes it adds to a request, and its operations (its longest list: compares or a
    branch)."""

    writes: frozenset[bytes]
    reads: frozenset[bytes]
    size: int
    ops: int


def footprint(request: Any) -> Footprint | None:
    """The keys of the ``TxnRequest`` ``request``; None when an operation spans a range
    of keys (such a transaction is sent alone)."""
    writes: set[bytes] = set()
    reads: set[bytes] = {bytes(c.key) for c in request.compare}
    size = sum(len(c.key) + len(c.value) + _OP_OVERHEAD for c in request.compare)
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put":
            writes.add(bytes(op.request_put.key))
            size += len(op.request_put.key) + len(op.request_put.value) + _OP_OVERHEAD
            continue
        inner = op.request_range if kind == "request_range" else (
            op.request_delete_range if kind == "request_delete_range" else None)
        if inner is None or inner.range_end:
            return None
        (reads if kind == "request_range" else writes).add(bytes(inner.key))
        size += len(inner.key) + _OP_OVERHEAD
    ops = max(len(request.compare), len(request.success), len(request.failure))
    return Footprint(frozenset(writes), frozenset(reads - writes), size, ops)


@dataclass
class _Batch:
    """Transactions bound for one request, and what they touch together."""

    members: list[_Waiting] = field(default_factory=list)
    writes: set[bytes] = field(default_factory=set)
    reads: set[bytes] = field(default_factory=set)
    size: int = 0
    widest: int = 0

    def fits(self, keys: Footprint, max_ops: int, max_bytes: int) -> bool:
        """Whether a transaction touching ``keys`` may join: no key one writes is
        another's, and the request stays within etcd's bounds."""
        return (len(self.members) + 1 + max(self.widest, keys.ops) <= max_ops
                and self.size + keys.size <= max_bytes
                and keys.writes.isdisjoint(self.writes) and keys.writes.isdisjoint(self.reads)
                and keys.reads.isdisjoint(self.writes))

    def add(self, waiting: _Waiting) -> None:
        keys = waiting.keys
        self.members.append(waiting)
        self.writes |= keys.writes
        self.reads |= keys.reads
        self.size += keys.size
        self.widest = max(self.widest, keys.ops)


@dataclass(eq=False)
class _Waiting:
    request: Any
    keys: Footprint
    answer: asyncio.Future[Answer] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class Merger:
    """Sends a store's transactions, merging those that wait (see the module).

    Args:
        send: Sends one ``TxnRequest`` and returns etcd's ``TxnResponse``.
        max_in_flight: Requests on their way at once before transactions wait.
        max_ops: etcd's ``--max-txn-ops``. It bounds each level of a request: a nested
            transaction may hold at most ``max_ops`` minus the transactions beside it.
        max_bytes: Bytes of keys and values in one request (etcd's
            ``--max-request-bytes`` is 1.5 MiB by default).
        timeout: Seconds a transaction that waits is given in all, as one sent alone
            is (the store's ``timeout``); None: no bound here.
    """

    def __init__(self, send: Callable[[Any], Awaitable[Any]], *, max_in_flight: int,
                 max_ops: int, max_bytes: int, timeout: float | None = None) -> None:
        self._send = send
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self._in_flight = 0
        self._waiting: list[_Waiting] = []
        self._requests: set[asyncio.Task[None]] = set()
        #: Requests sent and transactions they carried (for tests).
        self.sent = 0
        self.carried = 0

    async def txn(self, request: Any) -> Answer:
        """Send the ``TxnRequest`` ``request`` (at once, or with others) and return
        its answer."""
        keys = footprint(request)
        if (keys is None or not self.max_in_flight
                or (self._in_flight < self.max_in_flight and not self._waiting)):
            return await self._alone(request)
        waiting = _Waiting(request, keys)
        self._waiting.append(waiting)
        expiry = (None if self.timeout is None else asyncio.get_running_loop().call_later(
            self.timeout, self._expire, waiting))
        try:
            return await waiting.answer
        finally:
            if expiry is not None:
                expiry.cancel()
            if waiting in self._waiting:  # (cancelled before it was sent)
                self._waiting.remove(waiting)

    def _expire(self, waiting: _Waiting) -> None:
        """The caller's timeout lapsed while the requests ahead were slow to come back
        (etcd is down, say): it hears now, as when sent alone, not after those requests
        and then its own."""
        if waiting.answer.done():
            return
        if waiting in self._waiting:
            self._waiting.remove(waiting)
            error = StoreUnavailable(
                f"etcd did not answer this store's requests within {self.timeout}s; a "
                "transaction waiting behind them was not sent (nothing was written)")
        else:  # (its request's answer, when it comes, is dropped)
            error = StoreUnavailable(f"etcd did not answer within {self.timeout}s (the "
                                     "outcome of the transaction is unknown)")
        waiting.answer.set_exception(error)

    async def _alone(self, request: Any) -> Answer:
        self._in_flight += 1
        try:
            return (await self._request([request]))[0]
        finally:
            self._in_flight -= 1
            self._next()

    async def _request(self, requests: Sequence[Any]) -> list[Answer]:
        """Send ``requests`` in one ``Txn`` (one alone as it is) and return their
        answers."""
        self.sent += 1
        self.carried += len(requests)
        if len(requests) == 1:
            response = await self._send(requests[0])
            return [Answer(bool(response.succeeded), response.responses,
                           int(response.header.revision))]
        response = await self._send(rpc.TxnRequest(
            compare=[], success=[rpc.RequestOp(request_txn=r) for r in requests]))
        revision = int(response.header.revision)
        return [Answer(bool(r.response_txn.succeeded), r.response_txn.responses, revision)
                for r in response.responses]

    def _next(self) -> None:
        """Once fewer than ``max_in_flight`` requests are out, send every transaction
        that waits: those that go together in one request, the others in requests of
        their own, all at once."""
        if self._in_flight >= self.max_in_flight:
            return
        batches: list[_Batch] = []
        for waiting in self._waiting:
            if waiting.answer.done():
                continue
            for batch in batches:
                if batch.fits(waiting.keys, self.max_ops, self.max_bytes):
                    break
            else:
                batch = _Batch()
                batches.append(batch)
            batch.add(waiting)
        self._waiting = []
        for batch in batches:
            self._in_flight += 1
            request = asyncio.ensure_future(self._merged(batch.members))
            self._requests.add(request)
            request.add_done_callback(self._requests.discard)

    async def _merged(self, batch: list[_Waiting]) -> None:
        try:
            answers = await self._request([w.request for w in batch])
        except Exception as exc:
            if len(batch) == 1 or isinstance(exc, StoreUnavailable):
                # A transaction sent alone gets its own error; with no answer from etcd,
                # each outcome is unknown, as for one transaction.
                for waiting in batch:
                    if not waiting.answer.done():
                        waiting.answer.set_exception(exc)
            else:
                # Refused as a whole (nothing ran): each on its own, so that only the
                # transaction concerned fails.
                await asyncio.gather(*(self._resend(w) for w in batch))
            return
        finally:
            self._in_flight -= 1
            self._next()
        for waiting, answer in zip(batch, answers, strict=True):
            if not waiting.answer.done():
                waiting.answer.set_result(answer)

    async def _resend(self, waiting: _Waiting) -> None:
        if waiting.answer.done():
            return
        try:
            answer = await self._alone(waiting.request)
        except Exception as exc:
            if not waiting.answer.done():
                waiting.answer.set_exception(exc)
        else:
            if not waiting.answer.done():
                waiting.answer.set_result(answer)
