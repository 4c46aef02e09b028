"""The worker loop: pop → claim → run (heartbeating) → complete with the fence → ack.

A worker never decides anything: the claim says whether it may run, the fence says
whether its result counts. A ``stale`` answer to a heartbeat stops the run; the result
of a stale run is never committed. The queue item is acked only after the outcome is
committed, so a crash anywhere leaves the item in this worker's processing list (or the
node WAITING in the store) for recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from axengine import faults, tracing
from axengine.activity import Activity, ActivityMeter, ActivitySample
from axengine.clock import SYSTEM, Clock, sleep
from axengine.engine._runs import ClaimResult
from axengine.errors import AxError
from axengine.owners import LOCAL_PRINCIPAL, host_pid_owner
from axengine.queue import (
    DEFAULT_AGING_SECONDS,
    DEFAULT_FAST_SHARE,
    DEFAULT_LANE,
    FAST_LANE,
    WorkItem,
    WorkQueue,
)
from axengine.worker._context import EngineClient, RunContext, SubmittingEngine, TakingEngine
from axengine.worker._runner import (
    THREAD,
    Reported,
    Runner,
    ThreadRunner,
    pick_runner,
    stopped,
)
from executors.contract import Failure, Handler, NodeRequest, Outcome

__all__ = ["Worker"]

log = logging.getLogger("axengine.worker")

#: Longest wait of one Take at the API (an executor's free slot waiting there for the
#: next task submitted, while the serving loop keeps popping the queue). Short: a hung
#: executor (a frozen VM, a stopped process) may be handed a claim for this long after
#: it hangs; the claim then waits for its lease to lapse, as a crash's would.
TAKE_WAIT = 2.0
#: Pause before taking at the API again after a Take failed (the queue serves meanwhile).
TAKE_RETRY = 5.0

#: Seconds the activity sent with a heartbeat covers: the thresholds of "work" are per
#: minute, and a minute smooths a run that works in bursts (axengine.activity).
ACTIVITY_SPAN = 60.0


class _RunMeter:
    """The resource activity of one run, sampled at each heartbeat: an
    :class:`ActivityMeter` over the runner's samples, made once the runner gives one
    (a runner that cannot see the run never gets a meter)."""

    def __init__(self, runner: Runner, ctx: RunContext) -> None:
        self._runner = runner
        self._ctx = ctx
        self._meter: ActivityMeter | None = None

    def tick(self) -> Activity | None:
        """The activity over about :data:`ACTIVITY_SPAN` (None: no sample, or the first)."""
        if self._meter is None:
            if self._runner.activity(self._ctx) is None:
                return None
            self._meter = ActivityMeter(self._sample, span=ACTIVITY_SPAN)
        return self._meter.tick()

    def _sample(self) -> ActivitySample:
        sample = self._runner.activity(self._ctx)
        if sample is None:  # the run ended between two beats: nothing is known now
            return ActivitySample(at=time.monotonic(), cpu_seconds=None, io_bytes=None,
                                  net_bytes=None, source="run ended")
        return sample


def settings_for(settings: Mapping[str, Any], submitted_by: str) -> Mapping[str, Any]:
    """The handler settings one task runs under.

    ``trust: local`` (set by ``ax run`` / ``ax.run``) holds only for tasks the embedded
    engine submitted itself. A task a principal submitted through the API runs under
    ``api`` trust whichever process picks it up — an ``ax run`` on the same store as an
    ``ax server`` must not lend its trust to the server's submitters.
    """
    if settings.get("trust") == "local" and submitted_by != LOCAL_PRINCIPAL:
        return {**settings, "trust": "api"}
    return settings

class Worker:
    """Runs nodes popped from a :class:`WorkQueue` through an :class:`EngineClient`.

    Args:
        engine: The control plane (in-process engine or API client).
        queue: Where work items come from.
        handler: ``handle(request, ctx) -> Outcome`` (the composition passes
            ``executors.handlers.handle`` unless told otherwise).
        worker_id: Stable id of this worker (default: host, pid and a random tail).
        concurrency: Nodes run at once.
        lease_seconds: Lease asked for on claim and on each heartbeat.
        settings: Passed to handlers as ``ctx.settings``.
        lanes: Lanes served, in priority order.
        poll_timeout: Longest wait of one queue pop.
        fast_share: Share of ``concurrency`` the fast lane is served first in (rounded
            down, at least one slot; 1.0: every slot). A slot that frees while the
            fast lane holds its share asks the other lanes first and takes fast work
            only when they are empty: no slot idles while work waits, and work of the
            other lanes takes the next slot that frees above the share. Applies when
            the worker serves the fast lane and another.
        aging_seconds: An item waiting this long (queue clock) is popped before every
            lane and priority, oldest first; None: strict lane order.
        clock: Node timeouts and heartbeat intervals follow it.
        runners: Runners besides ``thread`` (which runs ``handler`` in this process),
            by name.
        runner: The runner of nodes that do not name one.
        on_run: Told of each run's context and runner before the runner starts it (the
            executor reaches runs through it to hand them back or release them).
        on_end: Told of a run that ends without this worker completing it (fenced out,
            or its outcome reported by the run itself).
        observe_run: Told the request and the seconds (``clock``) of every run whose
            runner returned, whatever the outcome (metrics).
    """

    def __init__(
        self,
        *,
        engine: EngineClient,
        queue: WorkQueue,
        handler: Handler,
        worker_id: str | None = None,
        concurrency: int = 4,
        lease_seconds: float = 30.0,
        settings: Mapping[str, Any] | None = None,
        lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        poll_timeout: float = 0.5,
        clock: Clock = SYSTEM,
        runners: Mapping[str, Runner] | None = None,
        runner: str = THREAD,
        on_run: Callable[[RunContext, Runner], None] | None = None,
        on_end: Callable[[RunContext], None] | None = None,
        fast_share: float = DEFAULT_FAST_SHARE,
        aging_seconds: float | None = DEFAULT_AGING_SECONDS,
        observe_run: Callable[[NodeRequest, float], None] | None = None,
    ) -> None:
        if not 0 < fast_share <= 1:
            raise ValueError(f"fast_share must be in (0, 1], got {fast_share}")
        if aging_seconds is not None and aging_seconds < 0:
            raise ValueError(f"aging_seconds must not be negative, got {aging_seconds}")
        self.engine = engine
        self.on_run = on_run
        self.on_end = on_end
        self.observe_run = observe_run
        self.queue = queue
        self.handler = handler
        self.worker_id = worker_id or host_pid_owner("w")
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.settings = dict(settings or {})
        self.lanes = tuple(lanes)
        self.poll_timeout = poll_timeout
        self.aging_seconds = aging_seconds
        self.fast_share = fast_share
        # The lanes in the order a free slot asks them while the fast lane holds its
        # share: the others first, the fast lane last. None: the fast lane has no share
        # (not served, served alone, or given every slot).
        others = tuple(lane for lane in self.lanes if lane != FAST_LANE)
        self.fast_slots = max(1, int(concurrency * fast_share))
        self._over_share_lanes = ((*others, FAST_LANE) if others and FAST_LANE in self.lanes
                                  and self.fast_slots < concurrency else None)
        self._fast_in_flight = 0
        self.clock = clock
        self.runners: dict[str, Runner] = {THREAD: ThreadRunner(handler,
                                                                concurrency=concurrency)}
        self.runners.update(runners or {})
        self.runner = runner
        self._active: set[asyncio.Task[None]] = set()
        #: The slots of :meth:`run` while it serves (a submit's claim takes a free one).
        self._slots: asyncio.Semaphore | None = None
        #: Submits claiming a node for a slot, until the slot has started (:meth:`submit`).
        self._claiming: set[asyncio.Future[None]] = set()
        #: Set while :meth:`run` serves (None: not serving — :meth:`process` called alone
        #: commits each node plainly and claims nothing more).
        self._stop: asyncio.Event | None = None
        self.processed = 0
        #: True while the serving loop waits in a pop on all its lanes (a slot is free):
        #: an item queued meanwhile goes to that slot at once.
        self._polling = False
        #: Set when the serving loop starts waiting in a pop with another slot free: a
        #: remote engine's worker then waits at the API too (:meth:`_take_loop`).
        self._take_wake = asyncio.Event()
        #: The Take in flight, cancelled at the stop.
        self._take_call: asyncio.Future[Any] | None = None
        #: Emits a span per node attempt when this process traces (docs/tracing.md).
        self.tracing = tracing.current()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then finish the runs in flight.

        Each free slot pops one item, from every lane the worker serves: in lane order
        while the fast lane holds fewer than ``fast_slots`` slots, the fast lane last
        once it holds them (:meth:`_lanes_open`).
        """
        await self.queue.recover(self.worker_id)
        self._stop = stop
        slots = self._slots = asyncio.Semaphore(self.concurrency)
        # A queue that can end a waiting pop (the in-process one) is told to at the stop,
        # so stopping takes no poll timeout; a Redis pop is never cut short.
        wake = getattr(self.queue, "wake", None)
        waker = (asyncio.create_task(self._wake_at(stop, wake)) if wake is not None
                 else None)
        taker = (asyncio.create_task(self._take_loop(stop, slots, self.engine))
                 if isinstance(self.engine, TakingEngine) else None)
        try:
            while not stop.is_set():
                await slots.acquire()
                if stop.is_set():
                    slots.release()
                    break
                self._polling = True
                if not slots.locked():
                    self._take_wake.set()
                try:
                    item = await self.queue.pop(
                        self.worker_id, lanes=self._lanes_open(self._fast_in_flight),
                        timeout=self.poll_timeout, aging=self.aging_seconds)
                finally:
                    self._polling = False
                if item is None:
                    slots.release()
                    continue
                if item.lane == FAST_LANE:
                    self._fast_in_flight += 1
                self._start_slot(item, item.lane, slots)
        finally:
            if waker is not None:
                waker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waker
            if taker is not None:
                # A Take still waiting ends; a claim it brought has its slot started.
                if self._take_call is not None:
                    self._take_call.cancel()
                self._take_wake.set()
                await asyncio.gather(taker, return_exceptions=True)
            # (A submit may still hand a claimed node to a slot while these finish.)
            while self._active or self._claiming:
                await asyncio.gather(*self._active, *self._claiming,
                                     return_exceptions=True)
            self._slots = None
            for each in self.runners.values():
                await each.close()

    async def _take_loop(self, stop: asyncio.Event, slots: asyncio.Semaphore,
                         engine: TakingEngine) -> None:
        """While the serving loop waits in a pop with another slot free, wait at the API
        as well (``take``): the next task submitted there has its first node claimed
        for this worker in the submit's transaction, and a slot runs it at once — the
        node costs no queue round trip and no claim of its own, as in an embedded
        session (:meth:`submit`). The queue keeps being popped meanwhile (tasks
        submitted through other API servers, nodes readied later)."""
        while not stop.is_set():
            await self._take_wake.wait()
            self._take_wake.clear()
            while self._polling and not slots.locked() and not stop.is_set():
                asked = self.clock.monotonic()
                call = self._take_call = asyncio.ensure_future(engine.take(
                    worker=self.worker_id, lanes=self._lanes_open(self._fast_in_flight),
                    wait_seconds=TAKE_WAIT, lease_seconds=self.lease_seconds))
                try:
                    claim: ClaimResult | None = await call
                except asyncio.CancelledError:
                    if stop.is_set():
                        return  # (the stop ended the wait)
                    raise
                except AxError as exc:
                    log.warning("worker %s: waiting at the API for work failed (%s); the "
                                "queue serves, trying again in %.0fs", self.worker_id, exc,
                                TAKE_RETRY)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), TAKE_RETRY)
                    continue
                finally:
                    self._take_call = None
                if claim is None or claim.request is None:
                    if self.clock.monotonic() - asked < TAKE_WAIT / 2:
                        # Answered at once with nothing (a server that is stopping, or
                        # holds no Takes): not asked again before the pause.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), TAKE_RETRY)
                    continue
                # Claimed for this worker: it runs here, at once. Its slot is a free one;
                # when the slots filled up while the Take waited, it runs all the same,
                # one over the worker's concurrency (at most one Take waits at a time):
                # waiting for a slot would leave it behind queued work, measured at
                # over a second with 50 tasks in flight, its lease running.
                if slots.locked():
                    self._start_claimed(claim, asyncio.Semaphore(0))  # (no slot held)
                else:
                    await slots.acquire()
                    self._start_claimed(claim, slots)

    async def _wake_at(self, stop: asyncio.Event,
                       wake: Callable[[str], Awaitable[None]]) -> None:
        await stop.wait()
        await wake(self.worker_id)

    async def submit(self, dag: Any, input: Any, **options: Any) -> Any:
        """Submit a task through the in-process engine (``options`` as for
        :meth:`~axengine.engine.Engine.submit`; returns its ``SubmitResult``).

        While this worker serves with a slot free and nothing queued for it (a slot
        waits in a pop on every lane), the submit claims the task's first node for a
        free slot in its own transaction (``claim_for`` of :meth:`~axengine.engine.Engine.submit`)
        and the slot runs it at once: the first node costs no claim transaction and no
        queue round trip, as a chain's next node costs none (:meth:`_complete`).
        Otherwise it is a plain submit and the first node goes through the queue.

        Raises:
            TypeError: The worker's engine is not the in-process one.
        """
        engine = self.engine
        if not isinstance(engine, SubmittingEngine):
            raise TypeError(f"Worker.submit needs the in-process engine, not {engine!r}")
        slots = self._slots
        if slots is None or slots.locked() or not self._polling or not self._serving():
            return await engine.submit(dag, input, **options)
        await slots.acquire()  # (free: it does not wait)
        lanes = self._lanes_open(self._fast_in_flight)
        # Until its slot has started, the submit is counted in flight: a stop that
        # comes meanwhile waits for the node it claims as for any running slot.
        claiming: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._claiming.add(claiming)
        try:
            try:
                result = await engine.submit(dag, input, claim_for=self.worker_id,
                                             claim_lanes=lanes,
                                             lease_seconds=self.lease_seconds, **options)
            except BaseException:
                slots.release()
                raise
            claim: ClaimResult | None = result.next
            if claim is None or claim.request is None:
                slots.release()
                return result
            self._start_claimed(claim, slots)
            return result
        finally:
            self._claiming.discard(claiming)
            if not claiming.done():  # (a cancelled stop may have cancelled it)
                claiming.set_result(None)

    def _start_claimed(self, claim: ClaimResult, slots: asyncio.Semaphore) -> None:
        """Start a slot (held in ``slots``) on a node claimed for this worker outside
        the queue — by a submit, in process or at the API — in the node's lane."""
        assert claim.request is not None
        lane = str(claim.request.config.get("lane", DEFAULT_LANE))
        if lane == FAST_LANE:
            self._fast_in_flight += 1
        self._start_slot(claim, lane, slots)

    def _start_slot(self, first: WorkItem | ClaimResult, lane: str,
                    slots: asyncio.Semaphore) -> None:
        task = asyncio.create_task(self._guarded(first, lane, slots))
        self._active.add(task)
        task.add_done_callback(self._active.discard)

    async def _guarded(self, first: WorkItem | ClaimResult, lane: str,
                       slots: asyncio.Semaphore) -> None:
        """Serve one slot: ``first`` (a popped item, or a node a submit claimed for the
        slot in ``lane``), then each item the slot took from the queue while completing
        the one before (see :meth:`_attempt`), until none was taken."""
        current: WorkItem | ClaimResult | None = first
        try:
            if isinstance(first, WorkItem):
                faults.point("after-pop")  # (an item taken later passed it when taken)
            while current is not None:
                if isinstance(current, ClaimResult):
                    try:
                        _, current = await self._run_claimed(current, lane)
                    except Exception:
                        # Claimed, not queued: its lease lapses and the reconciler
                        # offers it again, as after a crash.
                        log.exception("worker %s: running a claimed node failed",
                                      self.worker_id)
                        break
                    continue
                if current.lane != lane:
                    self._switch_lane(lane, current.lane)
                    lane = current.lane
                if not self._serving() and current is not first:
                    # Taken for the next turn, but the worker stops: it goes back.
                    await self.queue.requeue(self.worker_id, current)
                    break
                try:
                    _, taken = await self._process(current)
                except Exception:
                    # The item stays in the processing list; recovery or the reconciler
                    # re-runs it. A worker must not die of one node.
                    log.exception("worker %s: processing %s/%s failed", self.worker_id,
                                  current.task_id, current.node_id)
                    break
                current = taken
        finally:
            # Before the slot: the loop that takes it must see the fast share free.
            if lane == FAST_LANE:
                self._fast_in_flight -= 1
            slots.release()

    def _switch_lane(self, old: str, new: str) -> None:
        """A slot goes on with an item of another lane: the fast share follows it."""
        if old == FAST_LANE:
            self._fast_in_flight -= 1
        if new == FAST_LANE:
            self._fast_in_flight += 1

    async def process(self, item: WorkItem) -> str:
        """Handle one queue item end to end; returns what happened (for tests)."""
        faults.point("after-pop")
        answer, following = await self._process(item)
        assert following is None  # only a serving worker takes the next item early
        return answer

    async def _process(self, item: WorkItem) -> tuple[str, WorkItem | None]:
        """Handle one queue item end to end: what happened, and the queue item the slot
        took to run next (popped, not claimed), if any."""
        claim = await self.engine.claim(item.task_id, item.node_id, worker=self.worker_id,
                                        lease_seconds=self.lease_seconds)
        if claim.result != "claimed":
            # Backing off, or not admitted by its dependency's ramp after an outage:
            # asked again later (no lease was taken meanwhile).
            if claim.result == "not-claimable" and claim.reason in ("backoff", "ramp"):
                await self.queue.requeue(self.worker_id, item, delay=claim.retry_after)
            else:
                await self.queue.ack(self.worker_id, item)
            return claim.result, None
        return await self._run_claimed(claim, item.lane, item)

    async def _run_claimed(self, claim: ClaimResult, lane: str, item: WorkItem | None = None
                           ) -> tuple[str, WorkItem | None]:
        """Run a claimed node (``item``: the queue item it came from, acked once it ran)
        and each node its completion claims for the slot: what happened, and the queue
        item the slot took to run next, if any."""
        answer, following, taken = await self._attempt(claim, lane)
        if item is not None:
            await self.queue.ack(self.worker_id, item)
            faults.point("after-ack")
        # A node the completion claimed for this slot runs here: a successor it readied
        # (no queue item), or the queue item the slot took next (acked once claimed).
        # Were this process to die, its lease would lapse and the reconciler would offer
        # it again, as for any claimed node.
        while following is not None:
            answer, following, taken = await self._attempt(following, lane)
        return answer, taken

    async def _attempt(self, claim: ClaimResult, lane: str
                       ) -> tuple[str, ClaimResult | None, WorkItem | None]:
        """Run a claimed node and commit its outcome under the claim's fence: the answer,
        the claim of the node the same commit took for this slot, and a queue item the
        slot took next without claiming it (see :meth:`_complete`)."""
        faults.point("after-claim")
        request = claim.request
        assert request is not None  # a claimed result carries its request
        ctx = RunContext(loop=asyncio.get_running_loop(), engine=self.engine, request=request,
                         lease_seconds=self.lease_seconds,
                         settings=settings_for(self.settings, claim.submitted_by),
                         clock=self.clock)
        ctx.timeout_grace, ctx.timeout_cap = claim.timeout_grace, claim.timeout_cap
        with self.tracing.attempt(request) as span:
            outcome = await self._run(request, ctx, claim.timeout)
            span.outcome(outcome, stale=ctx.stale)
        if ctx.stale or isinstance(outcome, Reported):
            # Fenced out: nothing to commit. Reported: the run committed its own
            # outcome through the API under its fence (or goes on without us).
            if self.on_end is not None:
                self.on_end(ctx)
            if isinstance(outcome, Reported) and not ctx.stale:
                self.processed += 1
                return outcome.answer, None, None
            return "stale", None, None
        faults.point("before-complete")
        answer, following, taken = await self._complete(request, outcome, lane)
        faults.point("after-complete")
        self.processed += 1
        return answer, following, taken

    def _serving(self) -> bool:
        return self._stop is not None and not self._stop.is_set()

    def _lanes_open(self, fast_in_flight: int) -> Sequence[str]:
        """The lanes a free slot takes work from with ``fast_in_flight`` fast slots busy,
        in the order it asks them: the worker's order, or the fast lane last once it
        holds its share (fast work then takes a slot only when no other work waits)."""
        if self._over_share_lanes is not None and fast_in_flight >= self.fast_slots:
            return self._over_share_lanes
        return self.lanes

    async def _take_next(self, lane: str) -> WorkItem | None:
        """Pop, without waiting, the item this slot would take once the node it runs in
        ``lane`` completes — from the lanes, in the order, the serving loop would pop
        then (that slot counted free). None: nothing waits there, or a free slot waits
        in a pop on every lane (what is queued goes to it; asking the queue would cost a
        round trip per node that finds nothing)."""
        if self._polling:
            return None
        lanes = self._lanes_open(self._fast_in_flight - (lane == FAST_LANE))
        try:
            taken = await self.queue.pop(self.worker_id, lanes=lanes, timeout=0,
                                         aging=self.aging_seconds)
        except AxError:
            return None
        if taken is not None:
            faults.point("after-pop")
        return taken

    async def _complete(self, request: NodeRequest, outcome: Outcome, lane: str
                        ) -> tuple[str, ClaimResult | None, WorkItem | None]:
        """Commit ``outcome``; while this worker serves, in the same transaction claim
        the node the slot runs next (``complete_and_claim``) without overtaking queued
        work: the queue item the slot takes next (:meth:`_take_next`) when it is in the
        same lane (of this task or another), or, when nothing waits, a node the
        completion readies in ``lane``. A chain runs on one slot with one transaction
        per node, as do a fan-out's siblings and a crowd of tasks. An item of another
        lane, or one the commit could not claim, is the third value: the slot claims it
        next as it would any popped item. A stopping worker takes nothing new."""
        task_id, node_id, fence = request.task_id, request.node_id, request.fence
        if not self._serving():
            return await self.engine.complete(task_id, node_id, fence=fence,
                                              outcome=outcome), None, None
        taken = await self._take_next(lane)
        try:
            if taken is not None and taken.lane != lane:
                return await self.engine.complete(task_id, node_id, fence=fence,
                                                  outcome=outcome), None, taken
            done = await self.engine.complete_and_claim(
                task_id, node_id, fence=fence, outcome=outcome, worker=self.worker_id,
                lanes=(lane,), lease_seconds=self.lease_seconds,
                claim_node=taken.node_id if taken is not None else "",
                claim_task=taken.task_id if taken is not None else "")
        except BaseException:
            if taken is not None:  # not run by this slot after all: back to the queue
                with contextlib.suppress(Exception):
                    await self.queue.requeue(self.worker_id, taken)
            raise
        if taken is None or done.next is None:
            # A claim made while the stop came is a run in flight like any other: it
            # runs (an executor's shutdown may hand it back); the next completion takes
            # nothing. A taken item the commit could not claim is claimed as any other.
            return done.answer, done.next, taken
        if not done.acked:  # (acked with the commit's push: one round trip for both)
            await self.queue.ack(self.worker_id, taken)
        faults.point("after-ack")
        return done.answer, done.next, None

    async def _run(self, request: NodeRequest, ctx: RunContext,
                   timeout: float) -> Outcome | Reported:
        runner = pick_runner(self.runners, self.runner, request)
        if isinstance(runner, Failure):
            return runner
        if self.on_run is not None:
            self.on_run(ctx, runner)
        if ctx.cancelled:
            return stopped(ctx)  # stopped before it started: it never starts
        # The first heartbeat is due a third of the lease in: only a run that lasts that
        # long gets the task that beats (most runs end long before). Its timer is set
        # when the loop next turns: a run that ends first (an inline handler's) has none.
        first_beat: list[asyncio.Future[None]] = []
        beats: list[asyncio.Task[None]] = []
        ended = False

        def beat_on(timer: asyncio.Future[None]) -> None:
            if not timer.cancelled():
                beats.append(asyncio.create_task(self._heartbeats(ctx, runner)))

        def arm() -> None:
            if not ended:
                first_beat.append(self.clock.timer(self.lease_seconds / 3))
                first_beat[0].add_done_callback(beat_on)

        asyncio.get_running_loop().call_soon(arm)
        started = self.clock.monotonic()
        try:
            outcome = await runner.run(request, ctx, timeout=timeout)
        finally:
            ended = True
            for timer in first_beat:
                timer.cancel()
            for task in beats:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.observe_run is not None:
            self.observe_run(request, self.clock.monotonic() - started)
        return outcome

    async def _heartbeats(self, ctx: RunContext, runner: Runner) -> None:
        """Beat now (the first beat is due), then every third of the lease."""
        req = ctx.request
        interval = self.lease_seconds / 3
        meter = _RunMeter(runner, ctx)
        while not ctx.cancelled:
            # Sampled just before the beat, off the loop (a process group's sample
            # reads /proc); None until the runner gives a first sample.
            activity = await asyncio.to_thread(meter.tick)
            try:
                answer = await self.engine.heartbeat(req.task_id, req.node_id, fence=req.fence,
                                                     lease_seconds=self.lease_seconds,
                                                     activity=activity)
            except AxError as exc:
                if not exc.retryable:
                    raise
                # The control plane is briefly unreachable: keep running; if the lease
                # lapses meanwhile, the next answer is `stale` and the run stops then.
                log.warning("heartbeat %s/%s: %s", req.task_id, req.node_id, exc)
            else:
                ctx.beat_answer(answer)
            if not ctx.cancelled:
                await sleep(self.clock, interval)
