"""Where a claimed node runs: the seam between the worker and the handler.

The worker claims, the runner runs, the worker commits. A :class:`Runner` gets the
claim's :class:`~executors.contract.NodeRequest` and the attempt's
:class:`~axengine.worker.RunContext` (fence, lease, the control-plane calls) and returns
the node's outcome. It owns three duties whatever it runs on:

- **the timeout**: past ``timeout`` seconds of ``ctx.clock`` the run is stopped and
  answered ``Failure("timed out …", retryable=True)``;
- **the stop**: when ``ctx.wait_stopped()`` fires (fenced out by a stale heartbeat,
  handed back at shutdown, cancelled) the run is stopped and its outcome discarded —
  a thread is abandoned (it is told through ``ctx.cancelled``), a process is killed, a
  Job is deleted;
- **the output check**: a ``Success`` whose output the store cannot hold (NaN, a set,
  past the nesting limit) becomes a non-retryable ``Failure`` naming the node.

The worker keeps the lease alive with heartbeats while ``run`` is awaited, whatever the
runner. A runner whose run commits its own outcome through the API (a Kubernetes Job
does) returns :class:`Reported`; the worker then acks without completing. At each
heartbeat the worker asks the runner for the run's resource counters
(:meth:`Runner.activity`: a thread's CPU clock, a process group's ``/proc`` counters)
and sends what was used since about a minute with the heartbeat, for the blocking
verdict (docs/blocking.md).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from axengine import faults
from axengine.activity import ActivitySample, sample_thread
from axengine.errors import InputError
from axengine.limits import MAX_CHECKPOINT_BYTES, check_json_value, checked_parts, keep_text
from axengine.worker._context import RunContext
from executors.contract import (
    Failure,
    Handler,
    NodeRequest,
    Outcome,
    Paused,
    Success,
    runs_inline,
)

__all__ = ["THREAD", "Reported", "Runner", "ThreadRunner", "checked_outcome", "pick_runner",
           "stopped", "timed_out"]

#: Name of the runner that runs handlers in the worker's own threads.
THREAD = "thread"

#: An inline handler that holds the event loop longer than this is logged: it should
#: not be inline.
INLINE_WARN_SECONDS = 0.05

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reported:
    """The run reported its own outcome through the API under its fence.

    Attributes:
        answer: What the engine answered it (``committed``, ``stale``,
            ``already-done``), or ``unknown`` when the runner could not learn it.
    """

    answer: str


class Runner(Protocol):
    """Runs one claimed node to its outcome (see the module docstring)."""

    name: str
    #: True when a run goes on without its executor (it keeps its own lease and
    #: commits through the API): at shutdown the executor releases such runs
    #: (``ctx.release()``) instead of handing them back.
    detached: bool

    async def run(self, request: NodeRequest, ctx: RunContext, *,
                  timeout: float) -> Outcome | Reported:
        """Run the node; stop it on ``ctx.wait_stopped()`` or after ``timeout``."""
        ...

    def activity(self, ctx: RunContext) -> ActivitySample | None:
        """The run's cumulative resource counters now (:mod:`axengine.activity`), or
        None when this runner cannot see them or the run is not running here (yet, or
        any more). Called from a worker thread at each heartbeat: it may read ``/proc``
        but must not touch the event loop."""
        ...

    async def close(self) -> None:
        """Release what the runner holds (threads, processes, connections)."""
        ...


def checked_outcome(outcome: Outcome, node_id: str) -> Outcome:
    """``outcome``, or a non-retryable Failure when a Success's output is not storable
    JSON (size not bounded here: large outputs go to the blob store), or a Paused's
    checkpoint is not JSON within :data:`MAX_CHECKPOINT_BYTES`."""
    try:
        if isinstance(outcome, Success):
            # The text made for the check goes with the outcome: the engine hashes and
            # stores the output from it instead of encoding it again.
            text, members = checked_parts(outcome.output, f"output of node {node_id!r}",
                                          max_bytes=sys.maxsize)
            keep_text(outcome, outcome.output, text, members)
        elif isinstance(outcome, Paused) and outcome.checkpoint is not None:
            check_json_value(outcome.checkpoint, f"checkpoint of node {node_id!r}",
                             max_bytes=MAX_CHECKPOINT_BYTES)
    except InputError as exc:
        return Failure(str(exc), retryable=False)
    return outcome


async def wait_run(ctx: RunContext, runs: Sequence[asyncio.Future[Any]], timeout: float,
                   started: float) -> float | None:
    """Wait until one of ``runs`` (what tells that the run ended) is done, the run is
    stopped (``ctx.stopped_future()``) or its timeout passes: None unless the timeout
    passed first, else the timeout in force then.

    While progress keeps arriving — a mark within the last ``ctx.timeout_grace`` seconds
    when the deadline comes — the deadline moves by that grace, up to
    ``ctx.timeout_cap`` (a ``timeout_policy``'s ``progress_grace`` and ``max``). One
    timer and the futures, no task of its own: this wait is part of every node's run."""
    stop = ctx.stopped_future()
    limit = timeout
    try:
        while True:
            timer = ctx.clock.timer(max(started + limit - ctx.clock.monotonic(), 0.0))
            try:
                await asyncio.wait((*runs, stop, timer), return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if stop.done() or any(run.done() for run in runs):
                return None
            moved = _moved_deadline(ctx, limit, started)
            if moved is None:
                return limit
            limit = moved
    finally:
        stop.cancel()


def _moved_deadline(ctx: RunContext, limit: float, started: float) -> float | None:
    """The timeout once ``limit`` has passed: moved by the progress grace when a mark
    came within it (up to the cap), None when the run is past its timeout."""
    grace, cap = ctx.timeout_grace, ctx.timeout_cap
    if grace > 0 and limit < cap and ctx.last_progress > started + limit - grace:
        return min(limit + grace, cap)
    return None


def timed_out(elapsed: float, timeout: float, *, resumable: bool = False,
              grace: float = 0.0) -> Failure:
    """The outcome of a run stopped at its timeout (retryable: the next attempt may be
    faster); ``resumable`` when it saved a checkpoint, which the next attempt gets;
    ``grace``: how far progress moved the timeout."""
    message = f"timed out after {elapsed:.1f}s (timeout {timeout:g}s"
    message += f" + progress grace {grace:g}s)" if grace > 0 else ")"
    if resumable:
        message += ", resumable: the next run gets its checkpoint"
    return Failure(message, retryable=True, details={"resumable": resumable})


def stopped(ctx: RunContext) -> Failure:
    """The outcome of a run stopped from outside; the worker discards it when stale."""
    if ctx.stale:
        return Failure("fenced out: another worker owns the node", retryable=True)
    return Failure("the run was stopped", retryable=True)


def pick_runner(runners: Mapping[str, Runner], default: str,
                request: NodeRequest) -> Runner | Failure:
    """The runner a node asks for (its ``runner`` field), else ``default``; a Failure
    naming what this executor offers when it lacks the one asked for."""
    wanted = str(request.config.get("runner") or default)
    runner = runners.get(wanted)
    if runner is None:
        offered = ", ".join(sorted(runners))
        return Failure(f"node {request.node_id!r} needs the {wanted!r} runner; this "
                       f"executor offers {offered}", retryable=False)
    return runner


#: Seconds a thread-run handler past its timeout gets to checkpoint and return.
DEFAULT_TIMEOUT_GRACE = 5.0


class ThreadRunner:
    """Runs handlers in the worker's threads (the embedded default).

    A thread cannot be killed: a stopped or timed-out run is told through
    ``ctx.cancelled`` and abandoned; its late result is never committed. Abandoned
    threads do not starve new runs (the pool holds twice the concurrency). A handler
    marked :func:`~executors.contract.inline` for the request (the ``echo`` tool) is
    called right here on the event loop instead: the thread hand-off would cost more
    than its work.

    Args:
        handler: ``handle(request, ctx) -> Outcome``.
        concurrency: Nodes run at once by the worker.
        grace: Seconds a handler past its timeout gets to save a checkpoint and return.
    """

    name = THREAD
    detached = False

    def __init__(self, handler: Handler, *, concurrency: int = 4,
                 grace: float = DEFAULT_TIMEOUT_GRACE) -> None:
        self.handler = handler
        self.grace = grace
        self._threads = ThreadPoolExecutor(max_workers=max(1, concurrency) * 2,
                                           thread_name_prefix="ax-node")
        # The thread running each handler, while it runs: pool threads are reused, and
        # a stale entry would count the next handler's CPU as this run's.
        self._running: dict[RunContext, threading.Thread] = {}

    def activity(self, ctx: RunContext) -> ActivitySample | None:
        """The handler thread's CPU clock (I/O and network are per process: unknown)."""
        thread = self._running.get(ctx)
        return None if thread is None else sample_thread(thread)

    async def run(self, request: NodeRequest, ctx: RunContext, *,
                  timeout: float) -> Outcome | Reported:
        if runs_inline(self.handler, request):
            return self._call_inline(request, ctx)
        loop = asyncio.get_running_loop()
        started = ctx.clock.monotonic()
        future = loop.run_in_executor(self._threads, self._call, request, ctx)
        faults.point("handler-running")
        passed = await wait_run(ctx, (future,), timeout, started)
        if future.done():
            return future.result()
        if ctx.cancelled:
            # Stop waiting for a handler that ignores cancellation; its result could
            # never be committed.
            return stopped(ctx)
        # Its timeout: the handler is told (ctx.cancelled) and gets a grace to save a
        # checkpoint and return; one that ignores it is abandoned.
        elapsed = ctx.clock.monotonic() - started
        moved = passed - timeout if passed is not None else 0.0
        ctx.cancel()
        grace = ctx.clock.timer(self.grace)
        try:
            both: list[asyncio.Future[Any]] = [future, grace]
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            grace.cancel()
        return timed_out(elapsed, timeout, resumable=ctx.checkpointed and not ctx.stale,
                         grace=moved)

    def _call(self, request: NodeRequest, ctx: RunContext) -> Outcome:
        self._running[ctx] = threading.current_thread()
        try:
            return self._outcome(request, ctx)
        finally:
            self._running.pop(ctx, None)

    def _call_inline(self, request: NodeRequest, ctx: RunContext) -> Outcome:
        """Call an inline handler here, on the loop (no thread, no timeout to enforce:
        it returns at once)."""
        started = time.perf_counter()
        faults.point("handler-running")  # (a crash here: as if in the handler's thread)
        outcome = self._outcome(request, ctx)
        took = time.perf_counter() - started
        if took > INLINE_WARN_SECONDS:
            log.warning("the inline handler of %s/%s held the event loop for %.0f ms; a "
                        "handler that can take this long should run in a thread (drop "
                        "@inline)", request.task_id, request.node_id, took * 1000)
        return outcome

    def _outcome(self, request: NodeRequest, ctx: RunContext) -> Outcome:
        try:
            outcome = self.handler(request, ctx)
        except Exception as exc:  # handlers should not raise; never let one kill the run
            return Failure(f"{type(exc).__name__}: {exc}", retryable=True)
        # Checked here, in the handler's thread, rather than in the commit.
        return checked_outcome(outcome, request.node_id)

    async def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
