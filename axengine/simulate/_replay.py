"""Replay recorded node runs under a timeout policy, and count what it would have cost.

The replay model (docs/simulator.md has it with examples):

- Runs are replayed in order of their start (:func:`sort_runs`). The durations a
  percentile or adaptive policy sees for a run are those of earlier *succeeded* runs of
  the same DAG node whose end was recorded at or before this run's start: nothing from
  the future, and nothing from runs still in flight.
- The load signal of a run is its recorded ``load``, or else the number of other runs
  (any node) in flight when it started, taken from the history: the simulator does not
  re-simulate queueing.
- The policy stops a run at ``k`` seconds when its timeout (:func:`decide`) is below the
  run's duration ``D`` (a *timeout*), or when its stall window found a gap without
  progress (:func:`first_stall`) before ``D`` (a *stall kill*), whichever comes first
  (the timeout on a tie). A run ending exactly at its timeout is not stopped.
- A kill of a run that ended on its own in the history (succeeded, failed, unavailable)
  is a *false kill*. Its ``k`` seconds are *wasted*: they produced nothing, and the run
  is redone. The re-run is assumed to take the recorded ``D`` and to be let through, so
  the node's *completion time* is ``k + D``. Not killed, it is ``D``.
- A run that was cut short in the history (timed out, stalled, stale, cancelled) has no
  true duration. Killed earlier by the policy, it counts as a timeout or stall kill but
  never as a false kill, and has no completion time. Not killed, it is *unresolved*: it
  is assumed to end as recorded, since the history cannot say what would have followed.
- *Busy* seconds are the executor time the policy spends: ``D`` per run not killed,
  ``k + D`` per false kill, ``k`` per other kill.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from axengine.simulate._history import NodeRun, RunOutcome, sort_runs
from axengine.timeouts import Decision, Policy, decide, first_stall, percentile

__all__ = ["ReplayResult", "RunVerdict", "judge", "replay"]


@dataclass(frozen=True)
class RunVerdict:
    """What one run would have become under the policy.

    Attributes:
        run: The recorded run.
        decision: The timeout the policy gave it, explained.
        load: The load signal it was decided with.
        samples: How many earlier durations the policy saw.
        killed_at: Seconds after its start the policy stops it (None: not stopped).
        cause: ``timeout`` or ``stall`` when stopped.
        false_kill: Stopped although it ended on its own in the history.
        completion: Seconds until the node's result (finished runs only).
        busy: Executor seconds it costs under the policy.
        unresolved: Cut short in the history before the policy would have stopped it.
    """

    run: NodeRun
    decision: Decision
    load: float
    samples: int
    killed_at: float | None
    cause: Literal["timeout", "stall"] | None
    false_kill: bool
    completion: float | None
    busy: float
    unresolved: bool

    @property
    def wasted(self) -> float:
        """Seconds of a false kill's run before the kill (0 otherwise)."""
        return self.killed_at if self.false_kill and self.killed_at is not None else 0.0


@dataclass(frozen=True)
class ReplayResult:
    """A policy's verdicts on a whole history, and the totals of the table."""

    policy: Policy
    verdicts: tuple[RunVerdict, ...]

    @property
    def runs(self) -> int:
        return len(self.verdicts)

    @property
    def timeouts(self) -> int:
        """Runs stopped by the timeout."""
        return sum(v.cause == "timeout" for v in self.verdicts)

    @property
    def stall_kills(self) -> int:
        """Runs stopped by the stall window (before their timeout)."""
        return sum(v.cause == "stall" for v in self.verdicts)

    @property
    def false_kills(self) -> int:
        """Stopped runs that in fact finished."""
        return sum(v.false_kill for v in self.verdicts)

    @property
    def wasted_seconds(self) -> float:
        """Run time of false kills before the kill (redone, so thrown away)."""
        return sum(v.wasted for v in self.verdicts)

    @property
    def busy_seconds(self) -> float:
        """Executor time the policy spends on the history."""
        return sum(v.busy for v in self.verdicts)

    @property
    def unresolved(self) -> int:
        """Runs cut short in the history before the policy would have stopped them."""
        return sum(v.unresolved for v in self.verdicts)

    @property
    def completions(self) -> tuple[float, ...]:
        """Completion times of the finished runs, ascending."""
        return tuple(sorted(v.completion for v in self.verdicts if v.completion is not None))

    def select(self, keep: Callable[[NodeRun], bool]) -> ReplayResult:
        """The verdicts on the runs ``keep`` accepts. Filter here rather than the
        history before the replay: the load derived from runs in flight needs every
        run."""
        return replace(self, verdicts=tuple(v for v in self.verdicts if keep(v.run)))

    def completion_percentile(self, p: float) -> float | None:
        """The nearest-rank ``p``-th percentile of the completion times (None if none)."""
        done = self.completions
        return percentile(done, p) if done else None


def judge(policy: Policy, run: NodeRun, durations: Sequence[float], load: float, *,
          ascending: bool = False) -> RunVerdict:
    """One run under ``policy``, given the durations and load known at its start
    (``ascending``: the durations are in ascending order)."""
    duration = run.duration
    marks = run.marks()
    decision = decide(policy, durations, load=load, progress=marks, elapsed=duration,
                      ascending=ascending)
    timeout_at = decision.timeout if decision.timeout < duration else None
    stall_at = first_stall(policy.stall_window, marks, duration)
    killed_at: float | None = None
    cause: Literal["timeout", "stall"] | None = None
    if timeout_at is not None and (stall_at is None or timeout_at <= stall_at):
        killed_at, cause = timeout_at, "timeout"
    elif stall_at is not None:
        killed_at, cause = stall_at, "stall"
    finished = run.finished
    if killed_at is None:
        completion = duration if finished else None
        busy = duration
    else:
        completion = killed_at + duration if finished else None
        busy = killed_at + (duration if finished else 0.0)
    return RunVerdict(run=run, decision=decision, load=load, samples=len(durations),
                      killed_at=killed_at, cause=cause,
                      false_kill=killed_at is not None and finished, completion=completion,
                      busy=busy, unresolved=killed_at is None and not finished)


def replay(history: Iterable[NodeRun], policy: Policy) -> ReplayResult:
    """Replay every run of ``history`` under ``policy``, in start order, each seeing only
    the durations recorded before it started (see the module docstring)."""
    runs = sort_runs(list(history))
    in_flight: list[tuple[float, int]] = []  # (ended, index) of runs started so far
    known: dict[tuple[str, str], list[float]] = {}
    verdicts = []
    for index, run in enumerate(runs):
        while in_flight and in_flight[0][0] <= run.started:
            _, done = heapq.heappop(in_flight)
            ended = runs[done]
            if ended.outcome is RunOutcome.SUCCEEDED:
                bisect.insort(known.setdefault(ended.key, []), ended.duration)
        load = run.load if run.load is not None else float(len(in_flight))
        heapq.heappush(in_flight, (run.ended, index))
        # (each node's durations are kept in order: insort above)
        verdicts.append(judge(policy, run, known.get(run.key, []), load, ascending=True))
    return ReplayResult(policy=policy, verdicts=tuple(verdicts))
