"""The executor: a :class:`Worker` with what a long-lived process needs on top of it.

Every process shape that runs nodes (``ax run``, ``ax server``, ``ax executor``) runs
them through an :class:`Executor`, assembled by :mod:`axengine.process` around the
control plane it has (the in-process engine, or the API's gRPC client). It adds:

- **Graceful shutdown.** The first SIGTERM/SIGINT stops popping. Nodes in flight get
  ``grace_seconds`` to finish and commit normally. Whatever still runs after that is
  *handed back*: completed with ``Unavailable(dependency="executor:shutdown")`` under its
  own fence, which puts the node back to WAITING without spending an attempt, and the
  handler is told to stop. A hand-back is one fenced transition like any other, so a node
  is never half-committed: either the run's own result committed first (the hand-back
  is then answered ``stale``) or the hand-back did (the run's late result is then
  ``stale``). A second signal skips the rest of the grace period.
- **Queue outages.** A Redis error ends one worker loop, not the process: a new loop
  (same worker id, so the processing list is recovered) starts after a backoff, a bounded
  number of times in a row.
- **Dead neighbours.** Every few seconds the executor hands back the unacked queue items
  of workers on its own host whose process is gone (a SIGKILLed executor that came back
  under a new id never recovers its old processing list itself; without this its items
  would wait for the reconciler's stuck-item timeout).

A SIGKILL leaves no chance for any of this and needs none: the node's lease expires (or
the reconciler sees the owner's PID is gone), its fence is bumped and it runs elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from axengine.activity import Activity
from axengine.clock import SYSTEM, Clock, wait_event
from axengine.errors import AxError, QueueError
from axengine.owners import host_pid_owner, owner_is_dead
from axengine.queue import (
    DEFAULT_AGING_SECONDS,
    DEFAULT_FAST_SHARE,
    DEFAULT_LANE,
    FAST_LANE,
    WorkItem,
    WorkQueue,
)
from axengine.worker._context import EngineClient, RunContext, SubmittingEngine, TakingEngine
from axengine.worker._runner import THREAD, Runner
from axengine.worker._worker import Worker
from executors.contract import Handler, NodeRequest, Unavailable

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "Executor",
    "ShutdownReport",
]

log = logging.getLogger("axengine.executor")

#: Seconds in-flight nodes get to finish after the first shutdown signal.
DEFAULT_GRACE_SECONDS = 30.0
#: Dependency named by the outcome that hands an unfinished node back at shutdown.
SHUTDOWN_DEPENDENCY = "executor:shutdown"
#: Seconds to wait, after handing nodes back, for their handlers to notice and return.
SETTLE_SECONDS = 5.0
#: Consecutive worker loops a queue error may end before the process gives up.
MAX_QUEUE_RESTARTS = 20
#: Longest pause between two worker loops after a queue error.
MAX_QUEUE_BACKOFF = 5.0
#: A worker loop that served this long before failing resets the restart count.
HEALTHY_LOOP_SECONDS = 60.0
#: Seconds between two looks for dead workers on this host.
REAP_INTERVAL = 5.0


@dataclass
class ShutdownReport:
    """How an executor stopped.

    Attributes:
        worker_id: The worker's id.
        processed: Nodes whose outcome this executor committed (or found committed).
        graceful: True when every node in flight finished within the grace period.
        handed_back: ``(task_id, node_id, answer)`` of each node handed back, with the
            engine's answer to the hand-back (``committed``: back to WAITING; ``stale``:
            its own result or another worker got there first).
        released: ``(task_id, node_id)`` of each run left to go on without this
            executor (a detached runner's, e.g. a Kubernetes Job that keeps its own
            lease and commits through the API).
    """

    worker_id: str
    processed: int = 0
    graceful: bool = True
    handed_back: list[tuple[str, str, str]] = field(default_factory=list)
    released: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class _Flight:
    """A node this process claimed and has not completed yet."""

    request: NodeRequest
    ctx: RunContext | None = None
    detached: bool = False
    completing: bool = False
    handed_back: bool = False

    @property
    def item(self) -> WorkItem:
        lane = str(self.request.config.get("lane") or DEFAULT_LANE)
        return WorkItem(self.request.task_id, self.request.node_id, lane)


class _Tracking:
    """The engine client as the worker sees it: it records claims and completions so the
    executor knows what is in flight, and logs every fenced answer."""

    def __init__(self, inner: EngineClient, flights: dict[tuple[str, str], _Flight],
                 observe: Callable[[str, str, str, Any], None] | None = None) -> None:
        self.inner = inner
        self.flights = flights
        self.observe = observe

    async def claim(self, task_id: str, node_id: str, *, worker: str,
                    lease_seconds: float | None = None) -> Any:
        claim = await self.inner.claim(task_id, node_id, worker=worker,
                                       lease_seconds=lease_seconds)
        if claim.result == "claimed":
            self._claimed(claim)
        else:
            log.debug("claim %s/%s: %s %s", task_id, node_id, claim.result, claim.reason)
        return claim

    def _claimed(self, claim: Any) -> None:
        request = claim.request
        self.flights[(request.task_id, request.node_id)] = _Flight(request)
        log.info("claimed %s/%s fence=%d attempt=%d", request.task_id, request.node_id,
                 request.fence, request.attempt)

    async def heartbeat(self, task_id: str, node_id: str, *, fence: int,
                        lease_seconds: float | None = None,
                        activity: Activity | None = None) -> str:
        answer = await self.inner.heartbeat(task_id, node_id, fence=fence,
                                            lease_seconds=lease_seconds, activity=activity)
        if answer == "stale":
            log.warning("heartbeat %s/%s fence=%d: stale (fenced out; stopping the run)",
                        task_id, node_id, fence)
            self.forget(task_id, node_id, fence)
        return answer

    async def progress(self, task_id: str, node_id: str, *, fence: int, marker: str,
                       lease_seconds: float | None = None) -> str:
        answer = await self.inner.progress(task_id, node_id, fence=fence, marker=marker,
                                           lease_seconds=lease_seconds)
        if answer == "stale":
            log.warning("progress %s/%s fence=%d: stale (fenced out; stopping the run)",
                        task_id, node_id, fence)
            self.forget(task_id, node_id, fence)
        return answer

    async def checkpoint(self, task_id: str, node_id: str, *, fence: int,
                         state: Any) -> str:
        answer = await self.inner.checkpoint(task_id, node_id, fence=fence, state=state)
        if answer == "stale":
            self.forget(task_id, node_id, fence)
        return answer

    async def complete(self, task_id: str, node_id: str, *, fence: int,
                       outcome: Any) -> str:
        done: str = await self._completing(
            task_id, node_id, fence, outcome,
            self.inner.complete(task_id, node_id, fence=fence, outcome=outcome))
        return done

    async def complete_and_claim(self, task_id: str, node_id: str, *, fence: int,
                                 outcome: Any, worker: str, lanes: Iterable[str],
                                 lease_seconds: float | None = None,
                                 claim_node: str = "", claim_task: str = "") -> Any:
        done = await self._completing(
            task_id, node_id, fence, outcome,
            self.inner.complete_and_claim(task_id, node_id, fence=fence, outcome=outcome,
                                          worker=worker, lanes=lanes,
                                          lease_seconds=lease_seconds,
                                          claim_node=claim_node, claim_task=claim_task))
        following = done.next
        if following is not None:
            self._claimed(following)
        return done

    async def submit(self, dag: Any, input: Any, **options: Any) -> Any:
        result = await cast(SubmittingEngine, self.inner).submit(dag, input, **options)
        if result.next is not None:  # (claim_for: the submit claimed a node for us)
            self._claimed(result.next)
        return result

    async def _completing(self, task_id: str, node_id: str, fence: int, outcome: Any,
                          call: Awaitable[Any]) -> Any:
        """Await a completion ``call``, keeping the flight's books and logging the answer."""
        flight = self.flights.get((task_id, node_id))
        if flight is not None and flight.request.fence == fence:
            flight.completing = True
        try:
            done = await call
        except BaseException:
            if flight is not None:
                flight.completing = False
            raise
        answer = done if isinstance(done, str) else done.answer
        self.forget(task_id, node_id, fence)
        if self.observe is not None:
            self.observe(task_id, node_id, answer, outcome)
        log.log(logging.WARNING if answer == "stale" else logging.INFO,
                "complete %s/%s fence=%d %s: %s", task_id, node_id, fence,
                type(outcome).__name__, answer)
        return done

    def forget(self, task_id: str, node_id: str, fence: int) -> None:
        flight = self.flights.get((task_id, node_id))
        if flight is not None and flight.request.fence == fence:
            del self.flights[(task_id, node_id)]

    async def effect_begin(self, key: str, *, task_id: str, node_id: str,
                           fence: int) -> str:
        answer = await self.inner.effect_begin(key, task_id=task_id, node_id=node_id,
                                               fence=fence)
        if answer == "stale":
            log.warning("effect_begin %s %s/%s fence=%d: stale (fenced out; the effect is "
                        "not performed)", key, task_id, node_id, fence)
            self.forget(task_id, node_id, fence)
        return answer

    async def effect_done(self, key: str, result: Mapping[str, Any], *, task_id: str,
                          node_id: str, fence: int) -> str:
        answer = await self.inner.effect_done(key, result, task_id=task_id, node_id=node_id,
                                              fence=fence)
        if answer == "stale":
            log.warning("effect_done %s %s/%s fence=%d: stale (fenced out; the record is "
                        "not marked done)", key, task_id, node_id, fence)
            self.forget(task_id, node_id, fence)
        return answer

    async def effect_get(self, key: str) -> Any:
        return await self.inner.effect_get(key)

    async def get_run(self, task_id: str, node_id: str, *, fence: int) -> Any:
        return await self.inner.get_run(task_id, node_id, fence=fence)


class _TakingTracking(_Tracking):
    """:class:`_Tracking` of a client that can take work at the API (``take``)."""

    async def take(self, **options: Any) -> Any:
        """The inner client's ``take`` (a remote API's ``Take``), its claim tracked."""
        claim = await cast(TakingEngine, self.inner).take(**options)
        if claim is not None:
            self._claimed(claim)
        return claim


class Executor:
    """A :class:`Worker` with graceful shutdown and hand-back of unfinished nodes.

    Args:
        engine: The control plane (normally a ``GrpcEngineClient``).
        queue: Where work items come from.
        worker_id: Stable worker id (default: host, pid and a random tail).
        concurrency: Nodes run at once.
        lease_seconds: Lease asked for on claim and heartbeat.
        grace_seconds: Time in-flight nodes get to finish after the stop signal.
        settings: ``ctx.settings`` of the handlers.
        lanes: Lanes served, in priority order.
        handler: ``handle(request, ctx) -> Outcome``.
        poll_timeout: Longest wait of one queue pop.
        observe: Told ``(task_id, node_id, answer, outcome)`` of every completion
            (metrics).
        clock: Node timeouts, heartbeats and the grace period follow it.
        runners: Runners besides ``thread``, by name (see :mod:`axengine.worker._runner`).
        runner: The runner of nodes that do not name one.
        fast_share: Share of ``concurrency`` the fast lane is served first in.
        aging_seconds: Wait after which an item is popped before every lane and
            priority; None: never.
        observe_run: Told the request and the seconds of every run of a handler
            (metrics; see :class:`Worker`).
    """

    def __init__(
        self,
        *,
        engine: EngineClient,
        queue: WorkQueue,
        worker_id: str | None = None,
        concurrency: int = 4,
        lease_seconds: float = 30.0,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        settings: Mapping[str, Any] | None = None,
        lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        handler: Handler,
        poll_timeout: float = 0.5,
        observe: Callable[[str, str, str, Any], None] | None = None,
        clock: Clock = SYSTEM,
        runners: Mapping[str, Runner] | None = None,
        runner: str = THREAD,
        fast_share: float = DEFAULT_FAST_SHARE,
        aging_seconds: float | None = DEFAULT_AGING_SECONDS,
        observe_run: Callable[[NodeRequest, float], None] | None = None,
    ) -> None:
        self.fast_share = fast_share
        self.aging_seconds = aging_seconds
        self.observe_run = observe_run
        self.engine = engine
        self.queue = queue
        self.worker_id = worker_id or host_pid_owner("w")
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.grace_seconds = grace_seconds
        self.settings = dict(settings or {})
        self.lanes = tuple(lanes)
        self.poll_timeout = poll_timeout
        self.clock = clock
        self.runners = dict(runners or {})
        self.runner = runner
        self._handler = handler
        self._flights: dict[tuple[str, str], _Flight] = {}
        tracking = _TakingTracking if isinstance(engine, TakingEngine) else _Tracking
        self._tracking = tracking(engine, self._flights, observe)
        self.worker: Worker | None = None
        self.report = ShutdownReport(worker_id=self.worker_id)

    @property
    def in_flight(self) -> list[tuple[str, str]]:
        """``(task_id, node_id)`` claimed and not completed yet, sorted."""
        return sorted(self._flights)

    def _started(self, ctx: RunContext, runner: Runner) -> None:
        """Told of every run before its runner starts it: the hand-back reaches the run
        through its context, whatever the runner (a thread is told, a process killed,
        a Job deleted). A node handed back before it started never starts."""
        req = ctx.request
        flight = self._flights.get((req.task_id, req.node_id))
        if flight is not None and flight.request.fence == req.fence:
            flight.ctx = ctx
            flight.detached = getattr(runner, "detached", False)
            if flight.handed_back:
                ctx.mark_stale()  # the worker acks without completing

    def _ended(self, ctx: RunContext) -> None:
        """A run ended without this executor completing it: no longer in flight."""
        req = ctx.request
        self._tracking.forget(req.task_id, req.node_id, req.fence)

    def _release_detached(self) -> None:
        """Leave every run of a detached runner to go on by itself: it keeps its own
        lease and commits through the API, so a rolling restart of executors costs no
        work. Its runner stops following it and the worker acks its queue item."""
        for key in sorted(self._flights):
            flight = self._flights[key]
            if flight.ctx is None or not flight.detached or flight.completing:
                continue
            flight.ctx.release()
            del self._flights[key]
            self.report.released.append(key)
            log.info("left %s/%s fence=%d running without this executor", *key,
                     flight.request.fence)

    def _new_worker(self) -> Worker:
        return Worker(engine=self._tracking, queue=self.queue, handler=self._handler,
                      on_run=self._started, on_end=self._ended,
                      worker_id=self.worker_id, concurrency=self.concurrency,
                      lease_seconds=self.lease_seconds, settings=self.settings,
                      lanes=self.lanes, poll_timeout=self.poll_timeout, clock=self.clock,
                      runners=self.runners, runner=self.runner,
                      fast_share=self.fast_share, aging_seconds=self.aging_seconds,
                      observe_run=self.observe_run)

    async def _serve(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            self.worker = self._new_worker()
            began = self.clock.monotonic()
            try:
                await self.worker.run(stop)
                return
            except QueueError as exc:
                if self.clock.monotonic() - began > HEALTHY_LOOP_SECONDS:
                    failures = 0
                failures += 1
                if failures > MAX_QUEUE_RESTARTS:
                    raise
                pause = min(MAX_QUEUE_BACKOFF, 0.2 * 2 ** min(failures, 8))
                log.warning("worker %s: queue error (%s); restarting the loop in %.1fs "
                            "(%d/%d)", self.worker_id, exc, pause, failures,
                            MAX_QUEUE_RESTARTS)
                await wait_event(self.clock, stop, pause)
            finally:
                self.report.processed += self.worker.processed

    async def reap_dead_workers(self) -> int:
        """Move the unacked items of dead workers on this host back to their lanes;
        return how many moved. A worker counts as dead only when its id names this host
        and a PID that no longer exists, so a live worker is never robbed."""
        list_workers = getattr(self.queue, "workers", None)
        if list_workers is None:
            return 0
        moved = 0
        for worker in sorted(await list_workers()):
            if worker != self.worker_id and owner_is_dead(worker):
                count = await self.queue.recover(worker)
                if count:
                    log.info("recovered %d unacked item(s) of dead worker %s", count, worker)
                moved += count
        return moved

    async def _reaper(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.reap_dead_workers()
            except QueueError as exc:
                log.debug("looking for dead workers failed: %s", exc)
            await wait_event(self.clock, stop, REAP_INTERVAL)

    async def submit(self, dag: Any, input: Any, **options: Any) -> Any:
        """Submit through the in-process engine (an embedded session): the serving
        worker may claim the task's first node in the submit's transaction and run it
        at once (:meth:`Worker.submit`). Returns the ``SubmitResult``."""
        if self.worker is None:
            return await self._tracking.submit(dag, input, **options)
        return await self.worker.submit(dag, input, **options)

    async def run(self, stop: asyncio.Event, *, hurry: asyncio.Event | None = None
                  ) -> ShutdownReport:
        """Serve until ``stop`` is set, then shut down gracefully.

        Args:
            stop: Set to stop popping new work.
            hurry: Set (e.g. by a second signal) to end the grace period now.

        Returns:
            What the shutdown did.

        Raises:
            AxError: A fatal error of the worker loop (e.g. the queue stayed unreachable).
        """
        hurry = hurry or asyncio.Event()
        serving = asyncio.create_task(self._serve(stop), name=f"ax-executor-{self.worker_id}")
        reaper = asyncio.create_task(self._reaper(stop))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not serving.done():
                self._release_detached()
                log.info("worker %s: stopping; %d node(s) in flight get %.1fs to finish",
                         self.worker_id, len(self._flights), self.grace_seconds)
                hurrying = asyncio.create_task(hurry.wait())
                grace = self.clock.timer(self.grace_seconds)
                ends: set[asyncio.Future[Any]] = {serving, hurrying, grace}
                try:
                    await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    hurrying.cancel()
                    grace.cancel()
            if not serving.done():
                self.report.graceful = False
                await self._hand_back()
                settle = self.clock.timer(SETTLE_SECONDS)
                settled: set[asyncio.Future[Any]] = {serving, settle}
                await asyncio.wait(settled, return_when=asyncio.FIRST_COMPLETED)
                settle.cancel()
            if not serving.done():
                await self._hand_back()  # anything claimed since the first hand-back
                serving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await serving
            if not serving.cancelled():
                serving.result()  # a fatal error of the loop propagates
        finally:
            stopping.cancel()
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            if not serving.done():
                serving.cancel()
        return self.report

    async def _hand_back(self) -> None:
        for key in sorted(self._flights):
            flight = self._flights.get(key)
            if flight is None or flight.completing:
                continue  # its own result is being committed right now
            flight.handed_back = True
            if flight.ctx is not None:
                # The worker then acks without completing, and the handler stops.
                flight.ctx.mark_stale()
            req = flight.request
            evidence = (f"executor {self.worker_id} shut down with attempt {req.attempt} still "
                        f"running after a {self.grace_seconds:g}s grace period; handed back "
                        "without spending the attempt")
            try:
                answer = await self.engine.complete(
                    req.task_id, req.node_id, fence=req.fence,
                    outcome=Unavailable(dependency=SHUTDOWN_DEPENDENCY, evidence=evidence))
            except AxError as exc:
                # The lease runs out instead; the reconciler hands the node on.
                log.warning("hand-back of %s/%s failed: %s", req.task_id, req.node_id, exc)
                answer = "error"
            with contextlib.suppress(QueueError):
                await self.queue.ack(self.worker_id, flight.item)
            self._flights.pop(key, None)
            self.report.handed_back.append((req.task_id, req.node_id, answer))
            log.info("handed back %s/%s fence=%d: %s", req.task_id, req.node_id, req.fence,
                     answer)
