"""The history model: one :class:`NodeRun` per node run, stored as JSON Lines.

A run is one attempt of one node on a worker, from its claim to the event that ended
it. The outcome says how it ended, which matters to the replay: a run that ended on its
own (:data:`FINISHED`) has a true duration, so a policy that would have stopped it
earlier made a *false kill*; a run that was cut short (timed out, stalled, fenced out,
cancelled) only tells that it would have taken *at least* its recorded duration.

JSON Lines because history grows by appending and is read line by line: a bad line is
reported with its number, and ``grep``/``jq`` work on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from axengine.errors import InputError
from axengine.limits import finite_number, short_repr

__all__ = [
    "FINISHED",
    "HistoryError",
    "NodeRun",
    "RunOutcome",
    "parse_history",
    "run_from_json",
    "run_to_json",
    "runs_to_jsonl",
    "sort_runs",
]


class HistoryError(InputError):
    """A history file or line is invalid; the message names the file and line."""


class RunOutcome(StrEnum):
    """How a node run ended."""

    #: Committed its output.
    SUCCEEDED = "succeeded"
    #: Returned a failure (retried or final), other than a timeout.
    FAILED = "failed"
    #: Answered that a dependency was down (the attempt is refunded).
    UNAVAILABLE = "unavailable"
    #: Stopped by its node timeout.
    TIMED_OUT = "timed_out"
    #: Fenced out after going longer than its stall window without progress.
    STALLED = "stalled"
    #: Fenced out because its lease expired or its owner process was gone.
    STALE = "stale"
    #: Stopped because the task was cancelled.
    CANCELLED = "cancelled"


#: Outcomes of runs that ended on their own: their duration is the true duration.
FINISHED = frozenset({RunOutcome.SUCCEEDED, RunOutcome.FAILED, RunOutcome.UNAVAILABLE})


@dataclass(frozen=True, kw_only=True)
class NodeRun:
    """One recorded node run.

    Attributes:
        task_id: The task.
        dag: The DAG's name.
        node: The node id.
        node_type: ``tool_call`` or ``llm_call``.
        model: The node's model (``llm_call``), "" otherwise.
        tool: The node's tool (``tool_call``), "" otherwise.
        attempt: 1-based attempt number.
        started: UNIX seconds of the claim.
        ended: UNIX seconds of the event that ended the run.
        progress: UNIX seconds of each progress mark, in order.
        outcome: How it ended.
        detail: The ending event's detail (error message, chosen edges...).
        load: Load signal at the start, when recorded (None: the replay derives it).
    """

    task_id: str
    dag: str
    node: str
    node_type: str = ""
    model: str = ""
    tool: str = ""
    attempt: int = 1
    started: float
    ended: float
    progress: tuple[float, ...] = field(default=())
    outcome: RunOutcome
    detail: str = ""
    load: float | None = None

    @property
    def duration(self) -> float:
        """Seconds from claim to end."""
        return self.ended - self.started

    @property
    def key(self) -> tuple[str, str]:
        """What durations are pooled by: the same node of the same DAG."""
        return self.dag, self.node

    @property
    def finished(self) -> bool:
        """Whether the run ended on its own (its duration is a true duration)."""
        return self.outcome in FINISHED

    def marks(self) -> tuple[float, ...]:
        """Progress marks as offsets from the start."""
        return tuple(t - self.started for t in self.progress)


def run_to_json(run: NodeRun) -> dict[str, Any]:
    """The JSON object of one history line."""
    return {
        "task_id": run.task_id, "dag": run.dag, "node": run.node, "type": run.node_type,
        "model": run.model, "tool": run.tool, "attempt": run.attempt,
        "started": run.started, "ended": run.ended, "duration": round(run.duration, 6),
        "progress": list(run.progress), "outcome": run.outcome.value, "detail": run.detail,
        **({"load": run.load} if run.load is not None else {}),
    }


def runs_to_jsonl(runs: Iterable[NodeRun]) -> Iterator[str]:
    """History lines (each ending with a newline)."""
    for run in runs:
        yield json.dumps(run_to_json(run), ensure_ascii=False) + "\n"


def _number(data: Mapping[str, Any], name: str, where: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    number = finite_number(value)
    if number is None:
        raise HistoryError(f"{where}: field {name!r}: must be a finite number, got "
                           f"{short_repr(value)}")
    return number


def _text(data: Mapping[str, Any], name: str, where: str, *, required: bool = False) -> str:
    value = data.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise HistoryError(f"{where}: field {name!r}: must be a non-empty string, got "
                           f"{value!r}")
    return value


def run_from_json(data: Any, where: str = "history") -> NodeRun:
    """A run from one parsed history line.

    ``started`` is required with ``ended`` or ``duration`` (either derives the other;
    given both, they must agree), so hand-written histories may give durations only.

    Raises:
        HistoryError: A missing or mistyped field, named with ``where`` (``file:line``).
    """
    if not isinstance(data, Mapping):
        raise HistoryError(f"{where}: a history line must be a JSON object, got "
                           f"{type(data).__name__}")
    started = _number(data, "started", where)
    if started is None:
        raise HistoryError(f"{where}: field 'started': required (UNIX seconds of the claim)")
    ended = _number(data, "ended", where)
    duration = _number(data, "duration", where)
    if ended is None and duration is None:
        raise HistoryError(f"{where}: field 'ended': required, or give 'duration'")
    if ended is None:
        assert duration is not None
        ended = started + duration
    elif duration is not None and abs(ended - started - duration) > 1e-3:
        raise HistoryError(f"{where}: field 'duration': {duration:g} does not match ended - "
                           f"started = {ended - started:g}")
    if ended < started:
        raise HistoryError(f"{where}: field 'ended': before 'started'")
    raw_outcome = data.get("outcome")
    if not isinstance(raw_outcome, str) or raw_outcome not in {o.value for o in RunOutcome}:
        raise HistoryError(f"{where}: field 'outcome': must be one of "
                           f"{', '.join(o.value for o in RunOutcome)}, got {raw_outcome!r}")
    outcome = RunOutcome(str(raw_outcome))
    marks = data.get("progress") or []
    if not isinstance(marks, list) or any(
            isinstance(m, bool) or not isinstance(m, int | float) for m in marks):
        raise HistoryError(f"{where}: field 'progress': must be a list of UNIX seconds, got "
                           f"{marks!r}")
    attempt = data.get("attempt", 1)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise HistoryError(f"{where}: field 'attempt': must be a whole number ≥ 1, got "
                           f"{attempt!r}")
    return NodeRun(
        task_id=_text(data, "task_id", where, required=True),
        dag=_text(data, "dag", where, required=True),
        node=_text(data, "node", where, required=True),
        node_type=_text(data, "type", where), model=_text(data, "model", where),
        tool=_text(data, "tool", where), attempt=attempt, started=started, ended=ended,
        progress=tuple(sorted(float(m) for m in marks)), outcome=outcome,
        detail=_text(data, "detail", where), load=_number(data, "load", where))


def parse_history(lines: Iterable[str], source: str = "history") -> list[NodeRun]:
    """Runs from JSON Lines text; blank lines are skipped.

    Raises:
        HistoryError: A line that is not JSON or not a valid run, named ``source:line``.
    """
    runs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"
                               ) from exc
        runs.append(run_from_json(data, where))
    return runs


def sort_runs(runs: Sequence[NodeRun]) -> list[NodeRun]:
    """Runs in replay order: by start, ties broken by task, node and attempt, so the
    same history always replays (and reports) the same way."""
    return sorted(runs, key=lambda r: (r.started, r.task_id, r.node, r.attempt))
