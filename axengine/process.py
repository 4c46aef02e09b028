"""One composition for every process shape: embedded run, ``ax server``, ``ax api``,
``ax executor``.

A :class:`Shape` says what a process holds:

================  ===============  ============  ==========================
shape             control plane    reconciler    executor
================  ===============  ============  ==========================
``ax run``        local engine     yes           in process (trust: local)
``ax server``     local engine     yes           in process
``ax api``        local engine     yes           none (executors connect)
``ax executor``   the API (gRPC)   no            yes
================  ===============  ============  ==========================

:class:`AxProcess` assembles that shape from configuration and owns it: ``async with``,
or ``await start()`` … ``await shutdown()``, or ``await run(stop)``. Shutdown is the
same everywhere and graceful: the executor stops popping, nodes in flight get the grace
period and are then handed back under their own fence; the reconciler finishes its pass
and resigns leadership; the store, queue and client are closed. The REST and gRPC
listeners of an API process sit on top (:mod:`axengine.api._server`) and stop first.

The worker sees the control plane through :class:`~axengine.worker.EngineClient` only:
the in-process :class:`~axengine.engine.Engine` or the API's gRPC client. This is the
seam where where-a-node-runs (thread, subprocess, Kubernetes Job) plugs in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from axengine.clock import SYSTEM, Clock, wait_event
from axengine.config import AxConfig
from axengine.engine import Engine, EngineConfig, Reconciler
from axengine.errors import AxError
from axengine.owners import host_pid_owner
from axengine.queue import (
    DEFAULT_AGING_SECONDS,
    DEFAULT_FAST_SHARE,
    DEFAULT_LANE,
    FAST_LANE,
    WorkQueue,
)
from axengine.wiring import Runtime, build_runtime, open_queue
from axengine.worker import THREAD, EngineClient, Runner
from axengine.worker._process import DEFAULT_GRACE_SECONDS, Executor, ShutdownReport
from executors.contract import Handler, NodeRequest

__all__ = ["AxProcess", "ExecutorSpec", "RemoteApi", "Shape", "default_handler", "serve",
           "stop_on_signals"]

log = logging.getLogger("axengine.process")


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec:
    """The executor of a process.

    Attributes:
        concurrency: Nodes run at once.
        lease_seconds: Lease asked for on claim and on each heartbeat.
        grace_seconds: Time nodes in flight get to finish at shutdown before they are
            handed back.
        settings: ``ctx.settings`` of the handlers (tool policy, mail dir…).
        lanes: Lanes served, in priority order.
        handler: ``handle(request, ctx) -> Outcome`` (default:
            ``executors.handlers.handle``).
        worker_id: Stable worker id (default ``w:<host>:<pid>:<random>``).
        poll_timeout: Longest wait of one queue pop.
        observe: Told ``(task_id, node_id, answer, outcome)`` of every completion.
        observe_run: Told the request and the seconds of every run of a handler
            (``AxMetrics.node_ran``).
        runners: Runners besides ``thread`` (which runs ``handler`` in this process), by
            name.
        runner: The runner of nodes that do not name one.
        fast_share: Share of ``concurrency`` the fast lane is served first in (at least
            one slot; 1.0: every slot); above it a freed slot takes other lanes' work
            first, fast work only when none waits.
        aging_seconds: An item waiting this long is popped before every lane and
            priority; None: strict lane order.
    """

    concurrency: int = 4
    lease_seconds: float = 30.0
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    settings: Mapping[str, Any] = field(default_factory=dict)
    lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE)
    handler: Handler | None = None
    worker_id: str | None = None
    poll_timeout: float = 0.5
    observe: Callable[[str, str, str, Any], None] | None = None
    observe_run: Callable[[NodeRequest, float], None] | None = None
    runners: Mapping[str, Runner] = field(default_factory=dict)
    runner: str = THREAD
    fast_share: float = DEFAULT_FAST_SHARE
    aging_seconds: float | None = DEFAULT_AGING_SECONDS


@dataclass(frozen=True, kw_only=True)
class RemoteApi:
    """The control plane of an ``ax executor``: the API's gRPC listener.

    Attributes:
        address: ``host:port``.
        token: Bearer token with the ``executor`` role.
        call_timeout: Seconds per RPC.
        retry_for: Seconds an RPC is retried while the API is unavailable.
    """

    address: str
    token: str = ""
    call_timeout: float = 10.0
    retry_for: float = 60.0


@dataclass(frozen=True, kw_only=True)
class Shape:
    """What one process holds.

    Attributes:
        config: Store, queue, blob directory and key prefix (an ``ax executor`` uses
            only its queue).
        remote: Talk to this API instead of holding the engine (``ax executor``).
        executor: Run nodes in this process (None: serve only).
        reconcile_interval: Seconds between reconciler passes; None: no reconciler.
            Only a process holding the engine reconciles.
        engine_config: Engine tunables.
        metrics: Times the store's transactions and counts commits (an API process).
        role: Prefix of this process's owner id.
        clock: Time for the engine, worker and reconciler (tests inject a manual one).
        stuck_after: Seconds a due WAITING node may look queued before the reconciler
            enqueues it again (None: the reconciler's default). The test engine, whose
            clock reaches due times by jumps, sets 0.
    """

    config: AxConfig
    remote: RemoteApi | None = None
    executor: ExecutorSpec | None = None
    reconcile_interval: float | None = 1.0
    engine_config: EngineConfig | None = None
    metrics: Any = None
    role: str = "w"
    clock: Clock = SYSTEM
    stuck_after: float | None = None


def default_handler() -> Handler:
    """The handler of every node type and registered tool and model
    (``executors.handlers.handle``), imported on first use: it loads them all."""
    from executors.handlers import handle

    return handle


class AxProcess:
    """One process of ax, assembled from its :class:`Shape`.

    ``start()`` builds the backends, makes a first reconciler pass (the in-process queue
    is rebuilt from the store before anything is served; a store that is down now is
    logged and retried, not fatal) and starts the executor and the reconciler loop.
    """

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.owner = host_pid_owner(shape.role)
        self._runtime: Runtime | None = None
        self._client: EngineClient | None = None
        self._queue: WorkQueue | None = None
        self.reconciler: Reconciler | None = None
        self.executor: Executor | None = None
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._serving: asyncio.Task[ShutdownReport] | None = None
        self._started = False
        self.report: ShutdownReport | None = None

    # ------------------------------------------------------------------ parts

    @property
    def engine(self) -> Engine:
        """The engine this process holds.

        Raises:
            RuntimeError: Not started, or an ``ax executor`` (it holds no engine).
        """
        if self._runtime is None:
            raise RuntimeError("this process holds no engine (not started, or remote)")
        return self._runtime.engine

    @property
    def client(self) -> EngineClient:
        """The control plane as the executor sees it."""
        if self._client is None:
            raise RuntimeError("the process is not started")
        return self._client

    @property
    def queue(self) -> WorkQueue:
        if self._queue is None:
            raise RuntimeError("the process is not started")
        return self._queue

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> AxProcess:
        if self._started:
            return self
        shape = self.shape
        if shape.remote is not None:
            from axengine.worker.grpc_client import GrpcEngineClient

            self._queue = open_queue(shape.config.queue_url)
            self._client = GrpcEngineClient(
                shape.remote.address, token=shape.remote.token,
                timeout=shape.remote.call_timeout, retry_for=shape.remote.retry_for)
        else:
            self._runtime = build_runtime(shape.config, engine_config=shape.engine_config,
                                          metrics=shape.metrics, clock=shape.clock.time)
            self._queue = self._runtime.queue
            self._client = self._runtime.engine
            if shape.metrics is not None:
                shape.metrics.attach(self._runtime.engine)
        self._started = True
        try:
            if shape.reconcile_interval is not None and self._runtime is not None:
                tuning = {} if shape.stuck_after is None else {"stuck_after": shape.stuck_after}
                self.reconciler = Reconciler(
                    self._runtime.engine, owner=self.owner, interval=shape.reconcile_interval,
                    leader_ttl=max(5.0, shape.reconcile_interval * 4), clock=shape.clock,
                    **tuning)
                try:
                    await self.reconcile_once()
                except AxError:
                    log.warning("first reconciler pass failed; retrying every %.1fs",
                                shape.reconcile_interval, exc_info=True)
                self._tasks.append(asyncio.create_task(self._reconcile_later()))
            if shape.executor is not None:
                self.executor = self._new_executor(shape.executor)
                self._serving = asyncio.create_task(
                    self.executor.run(self._stop, hurry=self._hurry))
        except BaseException:
            await self.shutdown()
            raise
        return self

    def _new_executor(self, spec: ExecutorSpec) -> Executor:
        return Executor(engine=self.client, queue=self.queue, worker_id=spec.worker_id,
                        concurrency=spec.concurrency, lease_seconds=spec.lease_seconds,
                        grace_seconds=spec.grace_seconds, settings=spec.settings,
                        lanes=spec.lanes, handler=spec.handler or default_handler(),
                        poll_timeout=spec.poll_timeout,
                        observe=spec.observe, observe_run=spec.observe_run,
                        clock=self.shape.clock,
                        runners=spec.runners, runner=spec.runner,
                        fast_share=spec.fast_share, aging_seconds=spec.aging_seconds)

    async def reconcile_once(self) -> None:
        """One reconciler pass now, if this process leads (a no-op without one)."""
        if self.reconciler is not None:
            await self.reconciler.pass_if_leader()
            await self._after_pass()

    async def _after_pass(self) -> None:
        if self.shape.metrics is not None:
            await self.shape.metrics.drain(self.engine)

    async def _reconcile_later(self) -> None:
        # start() made the first pass; the loop's first pass comes one interval later.
        assert self.reconciler is not None
        if not await wait_event(self.shape.clock, self._stop, self.reconciler.interval):
            await self.reconciler.run(self._stop, after_pass=self._after_pass)

    def hurry(self) -> None:
        """End the executor's grace period now (a second SIGTERM)."""
        self._hurry.set()

    async def shutdown(self) -> ShutdownReport | None:
        """Stop gracefully (see the module docstring); idempotent."""
        if not self._started:
            return self.report
        self._started = False
        self._stop.set()
        failure: BaseException | None = None
        if self._serving is not None:
            try:
                self.report = await self._serving
            except AxError as exc:
                failure = exc
        for result in await asyncio.gather(*self._tasks, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError):
                log.warning("background task ended with an error: %r", result)
        if self.reconciler is not None:
            # Best effort: a store that is down at shutdown leaves the record to expire.
            with contextlib.suppress(AxError):
                await self.reconciler.resign()
        await self._close()
        if failure is not None:
            raise failure
        return self.report

    async def _close(self) -> None:
        if self._runtime is not None:
            runtime, self._runtime = self._runtime, None
            await runtime.close()
        elif self._client is not None:
            close = getattr(self._client, "close", None)
            if close is not None:
                await close()
            if self._queue is not None:
                await self._queue.close()
        self._client = None
        self._queue = None

    async def run(self, stop: asyncio.Event) -> ShutdownReport | None:
        """Start, serve until ``stop`` is set (or the executor fails), shut down."""
        await self.start()
        waiting = asyncio.ensure_future(stop.wait())
        try:
            # The executor's task is waited on, never cancelled: shutdown collects it.
            await asyncio.wait({waiting, *([self._serving] if self._serving else [])},
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        return await self.shutdown()

    async def __aenter__(self) -> AxProcess:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.shutdown()


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event, hurry: Callable[[], None] | None = None,
                    *, name: str = "ax") -> Iterator[None]:
    """SIGTERM/SIGINT set ``stop``; a second one calls ``hurry`` (ends the grace period)."""
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT)

    def on_signal(signum: int) -> None:
        if stop.is_set() and hurry is not None:
            log.warning("%s: second %s; ending the grace period now", name,
                        signal.Signals(signum).name)
            hurry()
        else:
            log.info("%s: %s received", name, signal.Signals(signum).name)
            stop.set()

    for sig in handled:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


async def serve(shape: Shape, *, announce: Callable[[AxProcess], None] | None = None,
                stop: asyncio.Event | None = None) -> ShutdownReport | None:
    """Run a process of ``shape`` until SIGTERM/SIGINT (or ``stop``); what ``ax
    executor`` runs.

    Args:
        shape: What the process holds.
        announce: Called once the process is started (e.g. to print its worker id).
        stop: Set to stop as a signal would.

    Returns:
        What the executor's shutdown did (None without an executor).
    """
    stop = stop or asyncio.Event()
    process = AxProcess(shape)
    with stop_on_signals(stop, process.hurry, name=process.owner):
        await process.start()
        if announce is not None:
            announce(process)
        return await process.run(stop)
