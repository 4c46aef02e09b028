"""The embedded engine in one process: store, queue, worker(s) and reconciler together.

This is what ``ax run`` and ``ax.run`` use. Everything is durable in the embedded store
(``.ax/ax.db`` by default), so a run killed at any point resumes with
``LocalSession.wait(task_id)`` (``ax run --resume TASK``): the first reconcile pass
re-enqueues WAITING nodes and fences out RUNNING nodes whose owner process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from axengine.clock import SYSTEM, Clock
from axengine.config import AxConfig
from axengine.dag import Dag
from axengine.engine import (
    Engine,
    EngineConfig,
    Event,
    TaskRecord,
    TaskStatus,
    TaskView,
)
from axengine.process import AxProcess, ExecutorSpec, Shape
from axengine.queue import DEFAULT_LANE, FAST_LANE
from axengine.wire import RunResult, path_of, result_of, resumes_by_itself
from axengine.worker import THREAD, Runner
from axengine.worker._process import DEFAULT_GRACE_SECONDS
from executors.contract import Handler

__all__ = ["GateDecider", "LocalSession", "RunResult", "load_any_dag", "path_of", "result_of"]

#: Asked for a decision at a waiting gate: ``(task, node_id) -> "approve"|"reject"|None``.
GateDecider = Callable[[TaskView, str], Awaitable[str | None]]


def load_any_dag(dag: str | Path | Dag | Mapping[str, Any]) -> Dag:
    """A DAG from a path, a parsed mapping, or a :class:`Dag`."""
    from axengine import dag as dagmod

    if isinstance(dag, Dag):
        return dag
    if isinstance(dag, Mapping):
        return dagmod.load_dag_mapping(dag)
    return dagmod.load_dag(dag)


@dataclass
class _Watch:
    """The tasks :meth:`LocalSession.wait` is waiting on: set on each commit."""

    changed: asyncio.Event
    latest: TaskRecord | None = None  # as the last commit in this process wrote it
    waiters: int = 0


class LocalSession:
    """The embedded process shape (:mod:`axengine.process`) with helpers to submit and
    wait: an engine on the embedded store, its executor and reconciler in this loop.

    Args:
        config: Where the store and blobs live (default: from the environment, ``.ax``).
        concurrency: Nodes run at once by the in-process executor.
        lease_seconds: Lease of each claim (renewed by heartbeats).
        reconcile_interval: Seconds between reconciler passes.
        handler: Node handler (default: ``executors.handlers.handle``).
        engine_config: Engine tunables.
        grace_seconds: Time nodes in flight get to finish when the session closes before
            they are handed back (WAITING again, no attempt spent).
        lanes: Lanes the executor serves (default: every lane).
        clock: Time of the engine, executor and reconciler (tests inject
            :class:`~axengine.clock.ManualClock` to run timeouts instantly).
        runner: Where nodes that do not name a runner run (``thread``, ``subprocess``;
            see :data:`axengine.runners.RUNNER_NAMES`).
        runners: Runners already built, by name; one named by ``runner`` and missing
            here is built by :func:`axengine.runners.make_runners`.
        stuck_after: Seconds a due WAITING node may look queued before the reconciler
            enqueues it again (None: its default; see :class:`~axengine.process.Shape`).
    """

    def __init__(
        self,
        config: AxConfig | None = None,
        *,
        concurrency: int = 4,
        lease_seconds: float = 30.0,
        reconcile_interval: float = 2.0,
        handler: Handler | None = None,
        engine_config: EngineConfig | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        lanes: Sequence[str] = (FAST_LANE, DEFAULT_LANE),
        clock: Clock = SYSTEM,
        runner: str = THREAD,
        runners: Mapping[str, Runner] | None = None,
        stuck_after: float | None = None,
    ) -> None:
        self.config = config or AxConfig.from_env()
        built = dict(runners or {})
        if runner != THREAD and runner not in built:
            from axengine.runners import make_runners

            built.update(make_runners([runner], handler=handler))
        # Embedded runs are your own DAGs on your own machine: the tools' policy trusts
        # them (local files, loopback) unless the caller's settings say otherwise. The
        # API shapes (ax server, ax executor) keep the default, untrusted "api".
        settings = {"trust": "local", **self.config.resolved_handler_settings}
        self.process = AxProcess(Shape(
            config=self.config, reconcile_interval=reconcile_interval,
            engine_config=engine_config, clock=clock, stuck_after=stuck_after,
            executor=ExecutorSpec(concurrency=concurrency, lease_seconds=lease_seconds,
                                  grace_seconds=grace_seconds, settings=settings,
                                  lanes=lanes, handler=handler, poll_timeout=0.2,
                                  runners=built, runner=runner,
                                  fast_share=self.config.worker.fast_share,
                                  aging_seconds=self.config.worker.aging_seconds)))
        self._watching: dict[str, _Watch] = {}

    @property
    def engine(self) -> Engine:
        return self.process.engine

    async def __aenter__(self) -> LocalSession:
        await self.process.start()
        self.engine.add_listener(self._on_commit)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.process.shutdown()

    def _on_commit(self, task: TaskRecord, events: Sequence[Event]) -> None:
        watch = self._watching.get(task.task_id)
        if watch is not None:
            # The engine calls its listeners in commit order within the task's turn, so
            # the last record seen here is the task as it stands (for this process).
            watch.latest = task
            watch.changed.set()

    async def submit(self, dag: str | Path | Dag | Mapping[str, Any], input: Any,
                     **options: Any) -> str:
        """Submit a task; ``options`` as for :meth:`Engine.submit`. Returns its id.

        The session's executor may claim the task's first node in the submit's
        transaction and run it at once (:meth:`~axengine.worker.Worker.submit`)."""
        executor = self.process.executor
        loaded = load_any_dag(dag)
        result = (await executor.submit(loaded, input, **options) if executor is not None
                  else await self.engine.submit(loaded, input, **options))
        return str(result.task_id)

    async def result(self, task_id: str) -> RunResult:
        view = await self.engine.get_task(task_id, inputs=False)  # (a result has none)
        return result_of(view, await self.engine.events(task_id))

    async def wait(
        self,
        task_id: str,
        *,
        decide: Mapping[str, str] | None = None,
        decided_by: str = "local",
        on_gate: GateDecider | None = None,
        timeout: float | None = None,
    ) -> RunResult:
        """Run until the task is final, or paused at a gate nobody decides.

        Args:
            decide: Decisions supplied up front, by gate node id.
            decided_by: Recorded as the author of those decisions.
            on_gate: Asked for a decision at a gate not in ``decide`` (e.g. a prompt on a
                terminal); None answer leaves the task PAUSED and returns.
            timeout: Give up waiting after this many seconds (the task keeps its state).
        """
        decide = dict(decide or {})
        watch = self._watching.get(task_id)
        if watch is None:
            watch = self._watching[task_id] = _Watch(asyncio.Event())
        watch.waiters += 1
        try:
            await self._wait(task_id, watch, decide, decided_by, on_gate, timeout)
        finally:
            watch.waiters -= 1
            if not watch.waiters:
                del self._watching[task_id]
        return await self.result(task_id)

    async def _wait(self, task_id: str, watch: _Watch, decide: dict[str, str],
                    decided_by: str, on_gate: GateDecider | None,
                    timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        asked: set[str] = set()
        record: TaskRecord | None = None
        while True:
            watch.changed.clear()
            # Only the task record on every wake-up (loading every snapshot per commit
            # would make waiting O(nodes) per node), and on a commit's wake-up the record
            # that commit wrote: the store is read first, after a decision, and when a
            # second passes without a commit here (another process may have written).
            if record is None:
                record = await self.engine.task_record(task_id)
            status = record.status
            record = None
            if status.final:
                return
            if status is TaskStatus.PAUSED:
                view = await self.engine.get_task(task_id)
                progressed = False
                for gate in result_of(view, ()).waiting:
                    decision = decide.get(gate)
                    if decision is None and on_gate is not None and gate not in asked:
                        asked.add(gate)
                        decision = await on_gate(view, gate)
                    if decision is not None:
                        await self.engine.decide(task_id, gate, decision=decision,
                                                 by=decided_by, comment="")
                        progressed = True
                if progressed:
                    continue
                if not any(resumes_by_itself(s, view.dag.node(n).type)
                           for n, s in view.snapshots.items()):
                    return
                # A pause with a set time: the reconciler resumes it; wait on.
            wait_for = 1.0 if end is None else min(1.0, end - loop.time())
            if wait_for <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.changed.wait(), timeout=wait_for)
                record = watch.latest
