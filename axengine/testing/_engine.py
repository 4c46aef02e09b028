"""The test engine: the embedded engine on a test clock, with stubbed nodes.

It is the engine ``ax run`` uses — SQLite store, in-process queue, worker, reconciler —
in a fresh home, with three differences that make a DAG testable:

- **Time is a** :class:`~axengine.clock.ManualClock`. While nothing runs, the clock
  jumps to the next time something would happen to a task by itself — a retry's
  backoff ends, a node whose dependency was unavailable is offered again, a handler's
  timed pause ends, the task's deadline passes — so a test never waits for them. A
  human gate waits for a person: its timeout is reached only when the test lets time
  pass (:meth:`AsyncAxTestEngine.advance`) or decides it.
- **Handlers are stubs** (:mod:`axengine.testing._stubs`), chosen per task.
- **Gate decisions are test input** (``decide={"review": "approve"}``), applied when the
  gate is reached.

The clock jumps only when the task is quiet — no node RUNNING and none due — and every
jump is followed by a reconciler pass: that is what times out gates, resumes pauses and
re-enqueues a node whose retry is due (the in-process queue delays items on the event
loop's real clock; the pass puts them back at once). The engine's rules see only the
test clock, so what they record (backoff, ``gate_until``, event times) is what they
would record in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from axengine.clock import ManualClock
from axengine.config import AxConfig
from axengine.dag import Dag
from axengine.engine import Event, NodeState, Snapshot, TaskRecord, TaskView
from axengine.errors import InputError
from axengine.fixtures import restore_task
from axengine.local import LocalSession, load_any_dag
from axengine.process import default_handler
from axengine.records import ACTIVE_STATES, COMPOSITE_OWNERS, NO_EDITS
from axengine.testing._replay import DagLike, FixtureLike, Replay, replay
from axengine.testing._stubs import (
    StubBook,
    UnstubbedNodeError,
    did_you_mean,
    unstubbed_message,
)
from axengine.wire import RunResult, result_of, resumes_by_itself
from executors.contract import Handler, NodeContext, NodeRequest, Outcome

__all__ = ["DEFAULT_START", "AsyncAxTestEngine", "AxRun", "AxTestEngine", "Decision"]

#: Where the test clock starts (epoch seconds; 2023-11-14 22:13:20 UTC).
DEFAULT_START = 1_700_000_000.0
#: Real seconds a call waits for running handlers (real ones may be slow) before failing.
DEFAULT_TIMEOUT = 30.0
#: Clock jumps one call makes at most: a stub that always answers Unavailable would
#: otherwise keep a task waiting forever; the call returns with ``settled`` False.
DEFAULT_MAX_JUMPS = 100
#: Real seconds without a commit after which a busy task gets a reconciler pass (a due
#: node whose queue item still waits out a real-time delay).
REPAIR_AFTER = 0.25
#: The reconciler's own loop never passes: the test engine makes every pass itself, right
#: after each clock jump, so what happens is the same on every run.
NO_RECONCILE_LOOP = 1e9
#: Recorded as the author of the test's gate decisions.
DECIDED_BY = "test"

#: A gate decision: ``"approve"``, ``"reject"``, or ``{"decision": "approve", "data":
#: {...}, "comment": "..."}`` (approve with edits).
Decision = str | Mapping[str, Any]


@dataclass(frozen=True)
class AxRun:
    """Where a task stands after a call of the test engine.

    Attributes:
        result: What ``ax.run`` returns (status, path, outputs, states, waiting, errors).
        snapshots: Every node snapshot (state, attempts, ``next_hops``, decision...).
        events: The task's timeline.
        requests: Every handler call of the task so far (stubbed or real), in order.
        now: The test clock after the call.
        settled: False when the call stopped at its limit of clock jumps (a node that
            keeps answering Unavailable, a pause that never ends).
    """

    result: RunResult
    snapshots: Mapping[str, Snapshot]
    events: Sequence[Event]
    requests: Sequence[NodeRequest]
    now: float
    settled: bool = True

    @property
    def task_id(self) -> str:
        return self.result.task_id

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def path(self) -> list[str]:
        """Nodes in the order they committed (a gate by its decision)."""
        return list(self.result.path)

    @property
    def outputs(self) -> Mapping[str, Any]:
        return self.result.outputs

    @property
    def states(self) -> Mapping[str, str]:
        return self.result.states

    @property
    def waiting(self) -> list[str]:
        """Gates waiting for a decision."""
        return list(self.result.waiting)

    @property
    def errors(self) -> Mapping[str, str]:
        return self.result.errors

    def taken(self, node_id: str) -> list[str]:
        """The targets of the edges ``node_id`` took (its recorded decision)."""
        return [h.target_node_id for h in self.snapshots[node_id].next_hops if h.is_taken]

    def decision(self, gate: str) -> str | None:
        """How gate ``gate`` was decided (``approve``/``reject``), None while undecided;
        who decided and when are in ``snapshots[gate].decision``."""
        record = self.snapshots[gate].decision
        return None if record is None else str(record.get("decision"))

    def calls(self, node_id: str) -> int:
        """How many times the handler of ``node_id`` was called."""
        return sum(1 for r in self.requests if r.node_id == node_id)


def _decision(gate: str, value: Decision) -> tuple[str, Any, str]:
    if isinstance(value, str):
        return value, NO_EDITS, ""
    if not isinstance(value, Mapping) or "decision" not in value:
        raise InputError(f"decide[{gate!r}]: 'approve', 'reject' or "
                         "{'decision': 'approve', 'data': ..., 'comment': ...}")
    return str(value["decision"]), value.get("data", NO_EDITS), str(value.get("comment", ""))


def _check_gates(dag: Dag, decide: Mapping[str, Decision]) -> None:
    for gate, value in decide.items():
        node = dag.nodes.get(gate)
        if node is None or node.type != "human_gateway":
            gates = [n.id for n in dag.nodes.values() if n.type == "human_gateway"]
            what = "no node" if node is None else f"a {node.type}, not a gate,"
            raise InputError(f"decide {gate!r}: {dag.name} has {what} {gate!r}"
                             f"{did_you_mean(gate, gates)}; gates: {', '.join(gates) or 'none'}")
        _decision(gate, value)


def _next_due(view: TaskView, now: float, until: float | None) -> float | None:
    """The next time something happens to the task by itself (a retry or a re-offer
    falls due, a timed pause ends, the deadline passes) — or, up to ``until``, because
    the test lets time pass (a gate's wait ends) — strictly after ``now``."""
    times: list[float] = []
    for node_id, snap in view.snapshots.items():
        node_type = view.dag.node(node_id).type
        if snap.state is NodeState.WAITING and snap.not_before > now:
            times.append(snap.not_before)
        elif snap.gate_until > now and (
                resumes_by_itself(snap, node_type)
                # A gate's wait ends only within the time the test lets pass.
                or (until is not None and snap.state is NodeState.PAUSED
                    and snap.gate_until <= until)):
            times.append(snap.gate_until)
    task = view.task
    # The deadline of a PAUSED task moves on with the pause: it falls due only while the
    # task runs (or waits on a retry or a dependency).
    if task.deadline and not task.paused_at and task.deadline > now:
        times.append(task.deadline)
    if until is not None and now < until:
        times.append(until)
    return min(times) if times else None


class AsyncAxTestEngine:
    """The embedded engine for tests (see the module docstring); ``async with``.

    Args:
        home: Directory of its store, blobs and mailbox (a fresh one per test).
        config: Its configuration instead of ``AxConfig(home=home)`` (no ``ax.toml`` or
            ``AX_*`` variable is read unless you pass ``AxConfig.from_env(...)``).
        handler: What "real" nodes run (default: ax's handlers of every tool and model).
        start: Where the test clock starts.
        concurrency: Nodes run at once.
        timeout: Real seconds a call waits for running handlers.
        max_jumps: Clock jumps one call makes at most.
    """

    def __init__(self, home: str | Path, *, config: AxConfig | None = None,
                 handler: Handler | None = None, start: float = DEFAULT_START,
                 concurrency: int = 4, timeout: float = DEFAULT_TIMEOUT,
                 max_jumps: int = DEFAULT_MAX_JUMPS) -> None:
        self.clock = ManualClock(start)
        self.config = config or AxConfig(home=Path(home))
        self.timeout = timeout
        self.max_jumps = max_jumps
        self._concurrency = concurrency
        self._handler = handler
        self._books: dict[str, StubBook] = {}
        self._decide: dict[str, dict[str, Decision]] = {}
        self._reported: dict[str, int] = {}
        self._session: LocalSession | None = None
        self._changed: asyncio.Event | None = None
        #: The task of the last run or restore: what ``advance``, ``decide`` and
        #: ``result`` act on when not told.
        self.task_id: str | None = None

    # ------------------------------------------------------------------ life cycle

    async def __aenter__(self) -> AsyncAxTestEngine:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Open the store and start the executor (``async with`` does it)."""
        if self._session is not None:
            return
        self._changed = asyncio.Event()
        # stuck_after 0: a due WAITING node is enqueued again on every pass, not after
        # it looked stuck for 30 s — the test clock reaches due times by jumps, and the
        # queue would hold the item for its real-time delay (a duplicate is harmless:
        # the claim admits one worker).
        session = LocalSession(self.config, handler=self._dispatch, clock=self.clock,
                               concurrency=self._concurrency, grace_seconds=0.0,
                               reconcile_interval=NO_RECONCILE_LOOP, stuck_after=0.0)
        await session.__aenter__()
        self._session = session
        session.engine.add_listener(self._on_commit)

    async def aclose(self) -> None:
        """Stop the executor and close the store; idempotent."""
        session, self._session = self._session, None
        if session is None:
            return
        closing = asyncio.ensure_future(session.__aexit__(None, None, None))
        # Nodes still running (a test that failed mid-run) are handed back after grace
        # timers of the test clock: move it until the shutdown is through.
        while True:
            done, _ = await asyncio.wait({closing}, timeout=REPAIR_AFTER)
            if done:
                closing.result()
                return
            self.clock.advance(1.0)

    @property
    def now(self) -> float:
        """The test clock (epoch seconds)."""
        return self.clock.time()

    def _live(self) -> LocalSession:
        if self._session is None:
            raise RuntimeError("the test engine is not started (use `async with`)")
        return self._session

    def _on_commit(self, task: TaskRecord, events: Sequence[Event]) -> None:
        if self._changed is not None:
            self._changed.set()

    def _real_handler(self) -> Handler:
        if self._handler is None:
            self._handler = default_handler()
        return self._handler

    def _dispatch(self, request: NodeRequest, ctx: NodeContext) -> Outcome:
        book = self._books.get(request.task_id)
        if book is None:  # a task this engine did not start: nothing is stubbed
            return self._real_handler()(request, ctx)
        return book(request, ctx)

    # ------------------------------------------------------------------ runs

    async def run(self, dag: str | Path | Dag | Mapping[str, Any], input: Any = None, *,
                  stubs: Mapping[str, Any] | None = None,
                  real: bool | Iterable[str] = False,
                  decide: Mapping[str, Decision] | None = None,
                  labels: Mapping[str, str] | None = None,
                  deadline: float | None = None, priority: int = 0) -> AxRun:
        """Submit ``dag`` on ``input`` and run it until it ends or waits for the test.

        Args:
            dag: A DAG file, a parsed mapping or a :class:`Dag`.
            input: The task input (default ``{}``).
            stubs: Answers by node id, ``tool:NAME`` or ``model:NAME``
                (:mod:`axengine.testing._stubs`).
            real: Unstubbed nodes that run their real handler: True (all), or keys as
                in ``stubs``; any other unstubbed node makes the call raise
                :class:`UnstubbedNodeError`.
            decide: Gate decisions, applied when each gate is reached.
            labels: Task labels.
            deadline: Task deadline in seconds from now (of the test clock).
            priority: Task priority.

        Returns:
            The task when it ended, or when only time (a gate, a deadline), a decision
            or a resume can move it on.

        Raises:
            InputError: A stub, ``real`` or ``decide`` key that names nothing fitting
                in the DAG, or an input the DAG refuses.
            UnstubbedNodeError: A node without a stub ran (``real`` did not allow it).
        """
        session = self._live()
        loaded = load_any_dag(dag)
        decisions = dict(decide or {})
        _check_gates(loaded, decisions)
        # The id is chosen before the submit: the worker may take an entry node before
        # the submit call returns, and its stubs must be in place by then.
        task_id = f"t-{secrets.token_hex(8)}"
        self._books[task_id] = StubBook(loaded, dict(stubs or {}), real, self._real_handler)
        self._decide[task_id] = decisions
        try:
            await session.submit(loaded, {} if input is None else input, task_id=task_id,
                                 labels=dict(labels or {}), deadline_seconds=deadline,
                                 priority=priority)
        except BaseException:
            del self._books[task_id], self._decide[task_id]
            raise
        self.task_id = task_id
        return await self._settled(task_id)

    async def restore(self, fixture: Mapping[str, Any], *,
                      stubs: Mapping[str, Any] | None = None,
                      real: bool | Iterable[str] = False,
                      decide: Mapping[str, Decision] | None = None) -> AxRun:
        """Restore a recorded task (a checked fixture, :func:`axengine.fixtures.load_fixture`)
        and resume it as :meth:`run` runs a new one. The test clock first moves to the
        last time the fixture recorded, so its backoffs and gate deadlines keep their
        meaning."""
        session = self._live()
        dag = Dag.from_canonical(fixture["dag"])
        decisions = dict(decide or {})
        _check_gates(dag, decisions)
        recorded = [float(e.get("at") or 0.0) for e in fixture.get("events", ())]
        recorded.append(float(fixture["task"].get("updated_at") or 0.0))
        if max(recorded) > self.clock.time():
            self.clock.set(max(recorded))
        task_id = str(fixture["task"]["task_id"])
        self._books[task_id] = StubBook(dag, dict(stubs or {}), real, self._real_handler)
        self._decide[task_id] = decisions
        await restore_task(session.engine, fixture)
        self.task_id = task_id
        # What the first pass of a starting process does: WAITING nodes into the queue.
        await session.process.reconcile_once()
        return await self._settled(task_id)

    async def advance(self, seconds: float, *, task_id: str | None = None) -> AxRun:
        """Let ``seconds`` of test time pass: what falls due meanwhile (gate timeouts,
        deadlines, retries) happens in time order, then the task runs until it waits
        again.

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError(f"time does not go back ({seconds} s)")
        task = self._task(task_id)
        return await self._settled(task, until=self.clock.time() + seconds)

    async def decide(self, gate: str, decision: str = "approve", *, data: Any = NO_EDITS,
                     comment: str = "", task_id: str | None = None) -> AxRun:
        """Decide a waiting gate now (``data``: approve with edits) and run on."""
        task = self._task(task_id)
        await self._live().engine.decide(task, gate, decision=decision, by=DECIDED_BY,
                                         comment=comment, data=data)
        return await self._settled(task)

    async def resume(self, node_id: str, data: Any = None, *,
                     task_id: str | None = None) -> AxRun:
        """Resume a node its handler paused with no time (as a callback would) and run on."""
        task = self._task(task_id)
        await self._live().engine.resume(task, node_id, data=data, by=DECIDED_BY)
        return await self._settled(task)

    async def result(self, task_id: str | None = None) -> AxRun:
        """Where the task stands, without running anything."""
        return await self._run_of(self._task(task_id))

    async def replay(self, fixture: FixtureLike, *, dag: DagLike | None = None,
                     **options: Any) -> Replay:
        """Replay a recorded fixture here (:func:`axengine.testing.replay`): resume it,
        and replay its decisions on ``dag``. ``options``: ``stubs``, ``real``, ``decide``
        for the nodes the fixture had not committed."""
        return await replay(self, fixture, dag=dag, **options)

    async def assert_replays(self, fixture: FixtureLike, *, dag: DagLike | None = None,
                             **options: Any) -> Replay:
        """:meth:`replay`, then raise :class:`~axengine.testing.ReplayMismatch` with a
        diff naming each node that ended elsewhere (or re-ran) unless it replayed."""
        return (await self.replay(fixture, dag=dag, **options)).assert_ok()

    def _task(self, task_id: str | None) -> str:
        task = task_id or self.task_id
        if task is None:
            raise RuntimeError("no task yet: call run() (or restore()) first")
        return task

    # ------------------------------------------------------------------ settling

    async def _settled(self, task_id: str, *, until: float | None = None) -> AxRun:
        settled = await self._settle(task_id, until=until)
        run = await self._run_of(task_id, settled=settled)
        book = self._books.get(task_id)
        if book is not None and len(book.unstubbed) > self._reported.get(task_id, 0):
            fresh = book.unstubbed[self._reported.get(task_id, 0):]
            self._reported[task_id] = len(book.unstubbed)
            raise UnstubbedNodeError("\n".join(
                unstubbed_message(book.dag.nodes[n]) for n in fresh))
        return run

    async def _settle(self, task_id: str, *, until: float | None) -> bool:
        """Run until the task is quiet and nothing is due by itself (or by ``until``);
        False when the jump limit stopped it first."""
        session = self._live()
        assert self._changed is not None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.timeout
        jumps = 0
        while True:
            self._changed.clear()
            # Only the nodes that can keep the task busy or fall due (a wake-up per
            # commit: decoding every finished node's output each time was O(nodes²)).
            view = await session.engine.get_task(task_id, resolve_blobs=False,
                                                 states=ACTIVE_STATES)
            if await self._decide_waiting(view):
                continue
            now = self.clock.time()
            # (A map or sub-DAG node is RUNNING while its instances are: they say
            # whether it is busy.)
            busy = sorted(n for n, s in view.snapshots.items()
                          if (s.state is NodeState.RUNNING
                              and s.owner not in COMPOSITE_OWNERS)
                          or (s.state is NodeState.WAITING and s.not_before <= now))
            if busy and not view.task.status.final:
                left = give_up - loop.time()
                if left <= 0:
                    raise AssertionError(
                        f"task {task_id} did not settle within {self.timeout:g} s of real "
                        f"time; still running or due: {', '.join(busy)}")
                try:
                    await asyncio.wait_for(self._changed.wait(), min(left, REPAIR_AFTER))
                except TimeoutError:
                    await session.process.reconcile_once()
                continue
            due = _next_due(view, now, until)
            if due is None:
                return True
            jumps += 1
            if jumps > self.max_jumps:
                return False
            self.clock.set(due)
            await session.process.reconcile_once()

    async def _decide_waiting(self, view: TaskView) -> bool:
        decide = self._decide.get(view.task.task_id) or {}
        decided = False
        for gate, snap in view.snapshots.items():
            if gate in decide and snap.state is NodeState.PAUSED and snap.decision is None:
                decision, data, comment = _decision(gate, decide[gate])
                await self._live().engine.decide(view.task.task_id, gate, decision=decision,
                                                 by=DECIDED_BY, comment=comment, data=data)
                decided = True
        return decided

    async def _run_of(self, task_id: str, *, settled: bool = True) -> AxRun:
        engine = self._live().engine
        view = await engine.get_task(task_id)
        events = await engine.events(task_id)
        book = self._books.get(task_id)
        return AxRun(result=result_of(view, events), snapshots=dict(view.snapshots),
                     events=tuple(events), requests=tuple(book.requests) if book else (),
                     now=self.clock.time(), settled=settled)


class AxTestEngine:
    """:class:`AsyncAxTestEngine` for synchronous tests (what the ``ax_engine`` pytest
    fixture gives): it owns an event loop, which runs while a call runs. Its methods are
    those of :class:`AsyncAxTestEngine`, without ``await``."""

    def __init__(self, home: str | Path, **options: Any) -> None:
        self._runner = asyncio.Runner()
        self._closed = False
        self.engine = AsyncAxTestEngine(home, **options)
        try:
            self._runner.run(self.engine.start())
        except BaseException:
            self._runner.close()
            raise

    def __enter__(self) -> AxTestEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine and its event loop; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.ExitStack() as stack:
            stack.callback(self._runner.close)
            self._runner.run(self.engine.aclose())

    @property
    def clock(self) -> ManualClock:
        return self.engine.clock

    @property
    def now(self) -> float:
        """The test clock (epoch seconds)."""
        return self.engine.now

    @property
    def task_id(self) -> str | None:
        """The task of the last run or restore."""
        return self.engine.task_id

    def run(self, dag: str | Path | Dag | Mapping[str, Any], input: Any = None,
            **options: Any) -> AxRun:
        """:meth:`AsyncAxTestEngine.run`."""
        return self._runner.run(self.engine.run(dag, input, **options))

    def restore(self, fixture: Mapping[str, Any], **options: Any) -> AxRun:
        """:meth:`AsyncAxTestEngine.restore`."""
        return self._runner.run(self.engine.restore(fixture, **options))

    def advance(self, seconds: float, *, task_id: str | None = None) -> AxRun:
        """:meth:`AsyncAxTestEngine.advance`."""
        return self._runner.run(self.engine.advance(seconds, task_id=task_id))

    def decide(self, gate: str, decision: str = "approve", **options: Any) -> AxRun:
        """:meth:`AsyncAxTestEngine.decide`."""
        return self._runner.run(self.engine.decide(gate, decision, **options))

    def resume(self, node_id: str, data: Any = None, *, task_id: str | None = None) -> AxRun:
        """:meth:`AsyncAxTestEngine.resume`."""
        return self._runner.run(self.engine.resume(node_id, data, task_id=task_id))

    def result(self, task_id: str | None = None) -> AxRun:
        """:meth:`AsyncAxTestEngine.result`."""
        return self._runner.run(self.engine.result(task_id))

    def replay(self, fixture: FixtureLike, **options: Any) -> Replay:
        """:meth:`AsyncAxTestEngine.replay`."""
        return self._runner.run(self.engine.replay(fixture, **options))

    def assert_replays(self, fixture: FixtureLike, **options: Any) -> Replay:
        """:meth:`AsyncAxTestEngine.assert_replays`."""
        return self._runner.run(self.engine.assert_replays(fixture, **options))
