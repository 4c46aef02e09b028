"""Executors' free slots waiting at this API server for a submit to hand them a task's
first node (``ExecutorService.Take``).

A task submitted through the API used to reach an executor through the queue: the
submit pushed its first node, an executor popped it and sent a Claim, which wrote a
transaction of its own — three hops and a transaction before the node ran. An executor
whose serving loop waits on an empty queue with a slot free asks this server to take
work instead: its Take waits here, and the next submit claims its first node for that
worker in the submit's own transaction (``claim_for`` of
:meth:`~axengine.engine.Engine.submit`, the embedded worker's way) and answers the Take
with the claim. The node is fenced and leased like any claim.

The rules:

- A submit takes the longest-waiting Take that serves the lane of one of the task's
  entry nodes; the submit's transaction claims a node in one of the Take's lanes only
  when it readies one at once (otherwise the node goes to the queue, as before, and the
  Take goes back to waiting, first in line).
- A Take that ends (its wait is over, the executor stops or goes away) while a submit
  is claiming for it gets that submit's answer if it can still be given. If it cannot
  (the call is gone), the claim is not run: its lease lapses and the reconciler offers
  the node again, as after an executor's crash. The executor cancels a Take only when
  it stops.
- Takes are per server: a task submitted through another replica goes to the queue,
  which the executors keep popping while their Take waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from axengine.engine import ClaimResult

__all__ = ["MAX_TAKE_WAIT", "Taker", "Takers"]

log = logging.getLogger("axengine.api.takers")

#: The longest a Take waits here, in seconds (a request asking more gets this).
MAX_TAKE_WAIT = 30.0


@dataclass(eq=False)
class Taker:
    """One waiting Take: the worker, its lanes and lease, and its answer."""

    worker_id: str
    lanes: frozenset[str]
    lease_seconds: float | None
    answer: asyncio.Future[ClaimResult | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    #: The Take's wait is over: a submit that had it in hand answers it, then no one.
    ended: bool = False


class Takers:
    """The Takes waiting at this server, oldest first.

    Args:
        on_end: Told how each Take ended: ``claimed``, ``empty`` (no claim came) or
            ``lost`` (it ended while a submit claimed for it: the claim lapses).
    """

    def __init__(self, on_end: Callable[[str], None] | None = None) -> None:
        self._waiting: deque[Taker] = deque()
        self._on_end = on_end or (lambda result: None)

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait(self, worker_id: str, lanes: Iterable[str], *,
                   lease_seconds: float | None, timeout: float) -> ClaimResult | None:
        """Wait up to ``timeout`` seconds for a submit's claim for ``worker_id`` in one of
        ``lanes``; None when none came. Cancelled (the caller went away), a claim made
        for it meanwhile is left to lapse (see the module docstring)."""
        taker = Taker(worker_id, frozenset(lanes), lease_seconds)
        self._waiting.append(taker)
        try:
            try:
                claim = await asyncio.wait_for(asyncio.shield(taker.answer), timeout)
            except TimeoutError:
                taker.ended = True
                # Held by a submit: its answer comes when its transaction is done.
                claim = None if self._drop(taker) else await taker.answer
            self._on_end("empty" if claim is None else "claimed")
            return claim
        finally:
            taker.ended = True
            self._drop(taker)
            if not taker.answer.done():
                taker.answer.cancel()  # (gone: a submit holding it sees that)

    def reserve(self, lanes: Iterable[str]) -> Taker | None:
        """The longest-waiting Take that serves one of ``lanes`` (those of a new task's
        entry nodes), taken out of the line for one submit (give it back with
        :meth:`answer`)."""
        if not self._waiting:
            return None  # (the lanes are not even read: a submit with no Take waiting)
        wanted = set(lanes)
        for taker in list(self._waiting):
            if taker.ended or taker.answer.done():
                self._waiting.remove(taker)
            elif taker.lanes & wanted:
                self._waiting.remove(taker)
                return taker
        return None

    def answer(self, taker: Taker, claim: ClaimResult | None) -> None:
        """The submit that reserved ``taker`` is done: hand it ``claim``, or (None: the
        submit claimed nothing for it) put it back first in line."""
        if claim is None:
            if taker.ended:
                if not taker.answer.done():
                    taker.answer.set_result(None)
            else:
                self._waiting.appendleft(taker)
            return
        if taker.answer.done():
            self._on_end("lost")
            request = claim.request
            log.warning("claimed %s/%s for worker %s, whose Take had ended: the claim is "
                        "not run; its lease lapses and the node is offered again",
                        request.task_id if request else "?",
                        request.node_id if request else "?", taker.worker_id)
            return
        taker.answer.set_result(claim)

    def close(self) -> None:
        """End every waiting Take with no claim (the server stops)."""
        while self._waiting:
            taker = self._waiting.popleft()
            taker.ended = True
            if not taker.answer.done():
                taker.answer.set_result(None)

    def _drop(self, taker: Taker) -> bool:
        """Take ``taker`` out of the line; False when it was not in it (a submit holds
        it, or it was answered)."""
        try:
            self._waiting.remove(taker)
        except ValueError:
            return False
        return True
