"""The :class:`executors.contract.NodeContext` a running handler sees.

Handlers run in worker threads; every call here crosses back into the worker's event
loop (``run_coroutine_threadsafe``) to reach the engine, so the engine client needs no
thread safety of its own.

Every call carries the attempt's fence. A ``stale`` answer means another worker owns the
node: heartbeats and progress report it by returning False; the outbox calls
(``effect.begin()``, ``effect.done()``) cannot, so they raise :class:`FencedOut` into the
handler — it must not perform the effect — after marking the run stale, so the worker
discards the run's outcome as it does after a stale heartbeat.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, cast, runtime_checkable

from axengine import faults
from axengine.activity import Activity
from axengine.clock import SYSTEM, Clock
from axengine.errors import Conflict
from executors.contract import EffectState, NodeRequest

__all__ = ["EngineClient", "FencedOut", "RunContext"]

#: Seconds to wait for the engine when a handler heartbeats, reports or records an effect.
CALL_TIMEOUT = 30.0


class EngineClient(Protocol):
    """What a worker needs from the control plane (the in-process ``Engine`` or the
    gRPC client of the API server)."""

    async def claim(self, task_id: str, node_id: str, *, worker: str,
                    lease_seconds: float | None = None) -> Any: ...

    async def heartbeat(self, task_id: str, node_id: str, *, fence: int,
                        lease_seconds: float | None = None,
                        activity: Activity | None = None) -> str:
        """Renew the lease: ``ok`` or ``stale``. ``activity``: the resources the run
        used over the last sampling interval (None: no sample), for the blocking
        verdict."""
        ...

    async def progress(self, task_id: str, node_id: str, *, fence: int, marker: str,
                       lease_seconds: float | None = None) -> str: ...

    async def checkpoint(self, task_id: str, node_id: str, *, fence: int,
                         state: Any) -> str:
        """Save state for the node's next run: ``ok`` or ``stale``."""
        ...

    async def complete(self, task_id: str, node_id: str, *, fence: int,
                       outcome: Any) -> str: ...

    async def complete_and_claim(self, task_id: str, node_id: str, *, fence: int,
                                 outcome: Any, worker: str, lanes: Iterable[str],
                                 lease_seconds: float | None = None,
                                 claim_node: str = "", claim_task: str = "") -> Any:
        """Commit an outcome and claim, in the same transaction, ``claim_node`` of
        ``claim_task`` (default: this task; a node taken from the queue) or else a node
        it readies in one of ``lanes`` with nothing queued ahead (a ``Completed``: the
        answer, that claim or None, and whether the worker's queue item for
        ``claim_node`` was acknowledged with the commit's push)."""
        ...

    async def effect_begin(self, key: str, *, task_id: str, node_id: str,
                           fence: int) -> str:
        """Outbox NEW → SENDING: the state before the call, or ``stale``."""
        ...

    async def effect_done(self, key: str, result: Mapping[str, Any], *, task_id: str,
                          node_id: str, fence: int) -> str:
        """Outbox → DONE: ``ok`` or ``stale``."""
        ...

    async def effect_get(self, key: str) -> Any: ...

    async def get_run(self, task_id: str, node_id: str, *, fence: int) -> Any:
        """What the attempt holding ``fence`` runs (its claim's answer), or None when the
        fence no longer holds. Changes nothing."""
        ...


@runtime_checkable
class SubmittingEngine(EngineClient, Protocol):
    """The in-process engine as an embedded session's worker sees it: it also takes
    submits, which may claim a new task's first node for the worker in the submit's
    transaction (``claim_for`` of :meth:`~axengine.engine.Engine.submit`)."""

    async def submit(self, dag: Any, input: Any, **options: Any) -> Any:
        """Submit (a ``SubmitResult``; with ``claim_for``, its ``next`` is the claim of
        a readied entry node for that worker, or None)."""
        ...


@runtime_checkable
class TakingEngine(EngineClient, Protocol):
    """A remote API as an executor's worker sees it: it also holds a worker's free slot
    for the next task submitted there, whose first node the submit claims for it
    (``ExecutorService.Take``; :mod:`axengine.api._takers`)."""

    async def take(self, *, worker: str, lanes: Iterable[str], wait_seconds: float,
                   lease_seconds: float | None = None) -> Any:
        """A ``claimed`` ClaimResult, or None when no task came within ``wait_seconds``."""
        ...


class FencedOut(Conflict):
    """Raised into a handler by an outbox call answered ``stale``: another worker owns
    the node, so this run must not perform (or record) the effect. The run is already
    marked stale; the worker discards its outcome."""


class _Effect:
    """``ctx.effect(key)`` for a handler thread: each call waits for the async one."""

    def __init__(self, ctx: RunContext, key: str) -> None:
        self._ctx = ctx
        self._key = key

    @property
    def key(self) -> str:
        return self._key

    def state(self) -> EffectState:
        return cast(EffectState, self._ctx.call(self._ctx.effect_state(self._key)))

    def begin(self) -> EffectState:
        return cast(EffectState, self._ctx.call(self._ctx.effect_begin(self._key)))

    def done(self, result: Mapping[str, Any]) -> None:
        self._ctx.call(self._ctx.effect_done(self._key, result))

    def result(self) -> Mapping[str, Any] | None:
        return cast("Mapping[str, Any] | None", self._ctx.call(self._ctx.effect_result(self._key)))


class RunContext:
    """NodeContext for one attempt. ``stale`` turns true when the engine answers
    ``stale`` (another worker owns the node now): the handler must stop.

    Every call to the control plane is written once, as a coroutine run in the worker's
    loop (``beat``, ``report_progress``, ``effect_*``): a runner that relays a node
    process's requests awaits them; a handler thread calls the blocking ``heartbeat``,
    ``progress`` and ``effect(key)`` methods, which wait for them.
    """

    def __init__(self, *, loop: asyncio.AbstractEventLoop, engine: EngineClient,
                 request: NodeRequest, lease_seconds: float,
                 settings: Mapping[str, Any], clock: Clock = SYSTEM) -> None:
        self.loop = loop
        self.engine = engine
        self.request = request
        self.lease_seconds = lease_seconds
        self._settings = settings
        #: Set from the loop or a handler's thread, read from either: one flag (an
        #: attribute write is atomic), no lock.
        self._cancelled = False
        #: Set in the worker's loop once the run is cancelled, fenced out or released;
        #: the futures of :meth:`stopped_future` given out until then.
        self._stopped = False
        self._stop_waiters: list[asyncio.Future[None]] = []
        self.stale = False
        self.released = False
        #: A checkpoint was saved by this attempt (a timeout then says "resumable").
        self.checkpointed = False
        #: Progress moves the timeout by this much, up to ``timeout_cap`` (the node's
        #: ``timeout_policy``; 0: never).
        self.timeout_grace = 0.0
        self.timeout_cap = 0.0
        #: When progress was last recorded (the clock's monotonic time).
        self.last_progress = -math.inf
        self.clock = clock
        self._last_beat = clock.monotonic()

    def call(self, coro: Any) -> Any:
        """Run a coroutine in the worker's loop and wait for it (from a handler thread).

        Raises:
            RuntimeError: Called on the worker's loop itself (an inline handler, see
                :func:`executors.contract.inline`): waiting there would never end.
        """
        if asyncio._get_running_loop() is self.loop:
            coro.close()
            raise RuntimeError(
                f"node {self.request.node_id!r}: its handler runs inline, on the worker's "
                "event loop, where the blocking context methods (heartbeat, progress, "
                "checkpoint, effect) cannot wait; drop @inline from a handler that calls "
                "them")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_TIMEOUT)

    def cancel(self) -> None:
        self._cancelled = True
        self.loop.call_soon_threadsafe(self._stop)

    def mark_stale(self) -> None:
        self.stale = True
        self.cancel()

    def release(self) -> None:
        """The executor leaves (shutdown) and the run goes on without it: a detached
        runner stops following it and leaves it running (a Kubernetes Job heartbeats and
        commits through the API by itself). Nothing is cancelled."""
        self.released = True
        self.loop.call_soon_threadsafe(self._stop)

    def fenced_out(self, message: str) -> FencedOut:
        """Mark the run stale and return the error an outbox call raises."""
        self.mark_stale()
        return FencedOut(message)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    async def wait_stopped(self) -> None:
        """Until the run is cancelled, fenced out or released (in the worker's loop)."""
        await self.stopped_future()

    def stopped_future(self) -> asyncio.Future[None]:
        """A future of the worker's loop, done once the run is cancelled, fenced out or
        released (what :meth:`wait_stopped` awaits; a runner waiting on several things
        passes it to ``asyncio.wait`` with no task to run, and cancels it when done)."""
        future: asyncio.Future[None] = self.loop.create_future()
        if self._stopped:
            future.set_result(None)
        else:
            self._stop_waiters.append(future)
        return future

    def _stop(self) -> None:
        self._stopped = True
        waiters, self._stop_waiters = self._stop_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    @property
    def settings(self) -> Mapping[str, Any]:
        return self._settings

    # ------------------------------------------------------------ the calls, once

    async def beat(self) -> bool:
        """Renew the lease unless a beat went out recently; False once the run must stop."""
        if self.cancelled:
            return False
        # The worker heartbeats on its own schedule; a handler's extra beats only need
        # to reach the engine when the last one is getting old.
        if self.clock.monotonic() - self._last_beat < self.lease_seconds / 6:
            return True
        req = self.request
        self.beat_answer(await self.engine.heartbeat(
            req.task_id, req.node_id, fence=req.fence, lease_seconds=self.lease_seconds))
        return not self.cancelled

    async def report_progress(self, marker: str) -> bool:
        """Record a checkpoint (renews the lease too); False once the run must stop."""
        if self.cancelled:
            return False
        req = self.request
        self.beat_answer(await self.engine.progress(
            req.task_id, req.node_id, fence=req.fence, marker=marker,
            lease_seconds=self.lease_seconds))
        if not self.stale:
            self.last_progress = self.clock.monotonic()
        return not self.cancelled

    async def save_checkpoint(self, state: Any) -> bool:
        """Save state for the node's next run; False when the fence is stale. Works while
        the run is cancelled for its timeout: that is what the grace is for."""
        if self.stale:
            return False
        req = self.request
        answer = await self.engine.checkpoint(req.task_id, req.node_id, fence=req.fence,
                                              state=state)
        if answer == "stale":
            self.mark_stale()
            return False
        self.checkpointed = True
        return True

    async def effect_state(self, key: str) -> EffectState:
        record = await self.engine.effect_get(key)
        return "NEW" if record is None else cast(EffectState, record.state)

    async def effect_begin(self, key: str) -> EffectState:
        """NEW → SENDING under this run's fence; the state before the call.

        Raises:
            FencedOut: The fence is stale: the effect must not be performed.
        """
        req = self.request
        answer = await self.engine.effect_begin(key, task_id=req.task_id, node_id=req.node_id,
                                                fence=req.fence)
        if answer == "stale":
            raise self.fenced_out(f"effect {key}: fence {req.fence} of {req.task_id}/"
                                  f"{req.node_id} is stale; another worker owns the node, "
                                  "so this run must not perform it")
        if answer == "NEW":
            faults.point("effect-begun")
        return cast(EffectState, answer)

    async def effect_done(self, key: str, result: Mapping[str, Any]) -> None:
        """SENDING → DONE with ``result`` under this run's fence.

        Raises:
            FencedOut: The fence is stale: the record is not marked done.
        """
        faults.point("effect-performed")
        req = self.request
        answer = await self.engine.effect_done(key, result, task_id=req.task_id,
                                               node_id=req.node_id, fence=req.fence)
        if answer == "stale":
            raise self.fenced_out(f"effect {key}: fence {req.fence} of {req.task_id}/"
                                  f"{req.node_id} is stale; the outbox record was not "
                                  "marked done")

    async def effect_result(self, key: str) -> Mapping[str, Any] | None:
        record = await self.engine.effect_get(key)
        return None if record is None else record.result

    # ------------------------------------------------------------ NodeContext (threads)

    def heartbeat(self) -> bool:
        if self.cancelled:
            return False
        return bool(self.call(self.beat()))

    def beat_answer(self, answer: str) -> None:
        if answer == "stale":
            self.mark_stale()
        else:
            self._last_beat = self.clock.monotonic()

    def progress(self, marker: str) -> bool:
        if self.cancelled:
            return False
        return bool(self.call(self.report_progress(marker)))

    def checkpoint(self, state: Any) -> bool:
        return bool(self.call(self.save_checkpoint(state)))

    def effect(self, key: str) -> _Effect:
        return _Effect(self, key)
