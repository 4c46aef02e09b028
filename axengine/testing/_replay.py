"""Replaying a recorded fixture: does the DAG still take the recorded path?

A replay does two things with a fixture (``ax snapshot export TASK -o f.json``):

1. **Resume.** The task is restored as recorded and resumed (on the DAG it recorded: a
   task keeps the DAG version it started with). Every handler call is recorded; a
   node the fixture had committed must not run again.
2. **Decisions.** The recorded input is run again on the DAG under test — the file in
   your repository, perhaps edited since — with every node answering what it answered
   in the recording and every gate decided as it was; ax evaluates conditions and
   guards afresh. Each node must end where it ended in the recording: the same state
   and the same taken edges. A node the recording does not hold (the task was exported
   mid-run) pauses there.

The first difference is the node whose guard or expression changed; the nodes after it
differ as a consequence and are listed too, in graph order::

    node assess_risk: recorded medium_risk -> send_medium_risk_email, replayed low_risk ->
    send_low_risk_email

Redacted fields (:func:`axengine.fixtures.redact_fixture`) replay as ``[redacted]``: a
decision that reads one cannot be checked, and the report says which fields the fixture
redacts when a decision differs.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from axengine.config import AxConfig
from axengine.dag import Dag, base_id, is_item
from axengine.engine import NodeState, Snapshot, TaskStatus
from axengine.engine._expand import parent_of
from axengine.errors import AxError
from axengine.fixtures import committed_nodes, fixture_snapshots, load_fixture
from axengine.local import load_any_dag
from axengine.testing._stubs import HANDLER_TYPES, NOT_RECORDED, calls
from axengine.wire import RunResult
from executors.contract import Failure, Handler, Paused, Success

if TYPE_CHECKING:
    from axengine.testing._engine import AsyncAxTestEngine, AxRun, Decision

__all__ = ["HopDiff", "Replay", "ReplayMismatch", "assert_replays", "decision_diffs",
           "replay", "replay_fixture"]

FixtureLike = str | os.PathLike[str] | Mapping[str, Any]
DagLike = str | os.PathLike[str] | Dag | Mapping[str, Any]

_DECIDED = (NodeState.SUCCEEDED, NodeState.FAILED, NodeState.SKIPPED)
#: How much of a failed node's error a diff line quotes.
MAX_ERROR_CHARS = 160


class ReplayMismatch(AssertionError):
    """A replayed fixture left its recorded path, or re-ran a committed node."""


@dataclass(frozen=True)
class HopDiff:
    """One node that ended elsewhere than in the recording.

    Attributes:
        node: The node id.
        recorded: Where it ended in the recording (``medium_risk -> send_medium_risk_email``,
            ``SKIPPED``, ``reached (RUNNING)``...).
        replayed: Where it ended in the replay, in the same words.
    """

    node: str
    recorded: str
    replayed: str

    def __str__(self) -> str:
        return f"node {self.node}: recorded {self.recorded}, replayed {self.replayed}"


@dataclass(frozen=True)
class Replay:
    """What replaying a fixture did.

    Attributes:
        result: The resumed task's result.
        executed: Nodes whose handler ran while the task resumed, in order.
        committed_before: Nodes the fixture had committed.
        diffs: Nodes whose replayed decision differs from the recorded one (graph order).
        problems: Anything else that kept the decisions from being replayed (an input
            the DAG under test refuses).
        source: The fixture's file, or ``fixture``.
        dag: What the decisions were replayed on (a file, or the recorded DAG's name).
        redacted: The fields the fixture redacts.
        resumed: The resumed task in full.
        check: The task of the decision replay.
    """

    result: RunResult
    executed: list[str]
    committed_before: list[str]
    diffs: tuple[HopDiff, ...] = ()
    problems: tuple[str, ...] = ()
    source: str = "fixture"
    dag: str = ""
    redacted: tuple[str, ...] = ()
    resumed: AxRun | None = field(default=None, repr=False)
    check: AxRun | None = field(default=None, repr=False)

    @property
    def rerun(self) -> list[str]:
        """Nodes committed in the fixture that ran again (should be empty)."""
        return [n for n in self.executed if n in self.committed_before]

    @property
    def ok(self) -> bool:
        """Nothing committed ran again and every recorded decision replayed the same."""
        return not (self.rerun or self.diffs or self.problems)

    def report(self) -> str:
        """What differs, one line per node, with what to do about it."""
        if self.ok:
            return (f"{self.source}: replays on {self.dag} ({len(self.committed_before)} "
                    "committed nodes, none ran again)")
        lines = [f"{self.source} does not replay on {self.dag}:"]
        lines += [f"  {d}" for d in self.diffs]
        lines += [f"  {p}" for p in self.problems]
        if self.rerun:
            lines.append(f"  committed nodes ran again on resume: {', '.join(self.rerun)}")
        if self.diffs and self.redacted:
            lines.append(f"  Note: the fixture redacts {', '.join(self.redacted)}; a decision "
                         "that reads a redacted field replays on '[redacted]' and may differ "
                         "for that reason alone.")
        if self.diffs:
            lines.append("  If the new path is intended, record the fixture again (ax run, "
                         "then ax snapshot export TASK -o FILE).")
        return "\n".join(lines)

    def assert_ok(self) -> Replay:
        """Raise :class:`ReplayMismatch` with :meth:`report` unless :attr:`ok`."""
        if not self.ok:
            raise ReplayMismatch(self.report())
        return self


# ------------------------------------------------------------------ comparing, pure


def _taken(snap: Snapshot) -> list[str]:
    return [h.target_node_id for h in snap.next_hops if h.is_taken]


def _kind(snap: Snapshot | None) -> tuple[Any, ...]:
    if snap is None:
        return ("absent",)
    if snap.state in (NodeState.SUCCEEDED, NodeState.FAILED):
        return (snap.state, frozenset(_taken(snap)))
    if snap.state in (NodeState.SKIPPED, NodeState.PENDING):
        return (snap.state,)
    return ("reached",)


def describe(snap: Snapshot | None, node_type: str | None, missing: str) -> str:
    """Where a node ended, in the words of a diff."""
    if snap is None:
        return missing
    if snap.state is NodeState.PENDING:
        return "not reached"
    if snap.state is NodeState.SKIPPED:
        return "SKIPPED"
    if snap.state is NodeState.PAUSED and snap.evidence == NOT_RECORDED:
        return "reached"
    if snap.state not in _DECIDED:
        return f"reached ({snap.state.value})"
    label = ""
    if node_type == "condition" and snap.state is NodeState.SUCCEEDED:
        label = f"{snap.output} "
    elif snap.decision is not None:
        label = f"{snap.decision.get('decision')} "
    taken = _taken(snap)
    arrow = ("-> " + ", ".join(taken) if taken
             else "-> (end)" if not snap.next_hops else "-> (no edge taken)")
    if snap.state is NodeState.SUCCEEDED:
        return label + arrow
    error = snap.error if len(snap.error) <= MAX_ERROR_CHARS else (
        snap.error[:MAX_ERROR_CHARS] + "…")
    return f"FAILED {arrow}" + (f" ({error})" if error else "")


def decision_diffs(recorded: Mapping[str, Snapshot], replayed: Mapping[str, Snapshot], *,
                   recorded_dag: Dag, replayed_dag: Dag,
                   recording_final: bool) -> list[HopDiff]:
    """The nodes that ended elsewhere in ``replayed`` than in ``recorded``, in graph order.

    A node the recording had not reached yet (PENDING) is not compared. A node that is
    new in the replayed DAG differs only when the recording is of a finished task and
    the replay reached it.
    """
    order = [*recorded_dag.graph_order,
             *(n for n in replayed_dag.graph_order if n not in recorded_dag.nodes)]
    diffs: list[HopDiff] = []
    for node in order:
        rec, rep = recorded.get(node), replayed.get(node)
        rk, pk = _kind(rec), _kind(rep)
        if rk[0] is NodeState.PENDING:
            continue
        if rk == ("absent",):
            if not recording_final or pk[0] in ("absent", NodeState.PENDING,
                                                 NodeState.SKIPPED):
                continue
        elif rk == ("reached",):
            # Reached but not done when exported: reaching it again is all there is to check.
            if pk[0] in ("reached", NodeState.SUCCEEDED, NodeState.FAILED):
                continue
        elif rk == pk:
            continue
        rtype = recorded_dag.nodes[node].type if node in recorded_dag.nodes else None
        ptype = replayed_dag.nodes[node].type if node in replayed_dag.nodes else None
        diffs.append(HopDiff(node, describe(rec, rtype, "(not in the recording)"),
                             describe(rep, ptype, "(not in the DAG)")))
    return diffs


def _answer(snap: Snapshot | None) -> Success | Failure | Paused:
    """What a recorded run of a node answered (paused: the recording has no answer)."""
    if snap is not None and snap.state is NodeState.SUCCEEDED:
        return Success(snap.output)
    if snap is not None and snap.state is NodeState.FAILED:
        return Failure(snap.error, retryable=False)
    return Paused(NOT_RECORDED)


@dataclass(frozen=True)
class _ItemAnswers:
    """A map node's recorded answers, by item (``node[3]``)."""

    items: Mapping[str, Success | Failure | Paused]

    def __call__(self, request: Any) -> Success | Failure | Paused:
        return self.items.get(request.node_id, Paused(NOT_RECORDED))


def recorded_answers(recorded: Mapping[str, Snapshot], dag: Dag
                     ) -> tuple[dict[str, Any], dict[str, Decision]]:
    """Stubs and gate decisions that make ``dag``'s nodes answer what they answered in
    the recording; a handler node the recording does not hold pauses."""
    stubs: dict[str, Any] = {}
    decide: dict[str, Decision] = {}
    for node in dag.nodes.values():
        snap = recorded.get(node.id)
        if node.type in HANDLER_TYPES and node.map is not None:
            # A map: each item answers what that item answered.
            items = {k: _answer(s) for k, s in recorded.items()
                     if (found := parent_of(k)) is not None and found[0] == node.id}
            stubs[node.id] = _ItemAnswers(items)
        elif node.type in HANDLER_TYPES and dag.loop_of(node.id) is not None:
            # A loop's node: each visit answers what that visit answered, in order.
            visits = sorted((max(s.visit, 1), k) for k, s in recorded.items()
                            if base_id(k) == node.id and not is_item(k))
            stubs[node.id] = (calls(*(_answer(recorded[k]) for _, k in visits)) if visits
                              else Paused(NOT_RECORDED))
        elif node.type in HANDLER_TYPES:
            stubs[node.id] = _answer(snap)
        elif node.type == "human_gateway" and snap is not None and snap.decision:
            value: dict[str, Any] = {"decision": snap.decision.get("decision"),
                                     "comment": snap.decision.get("comment", "")}
            if snap.decision.get("edited") and isinstance(snap.output, Mapping):
                value["data"] = snap.output.get("data")
            decide[node.id] = value
    return stubs, decide


# ------------------------------------------------------------------ replaying


async def replay(engine: AsyncAxTestEngine, fixture: FixtureLike, *,
                 dag: DagLike | None = None, stubs: Mapping[str, Any] | None = None,
                 real: bool | Iterable[str] = False,
                 decide: Mapping[str, Decision] | None = None) -> Replay:
    """Replay ``fixture`` on ``engine`` (see the module docstring).

    Args:
        engine: A started test engine (the fixture's task id must be free in it).
        fixture: The fixture file, or its parsed JSON.
        dag: The DAG the recorded decisions are checked on (default: the recorded one).
        stubs: Answers of nodes the fixture had not committed, for the resume.
        real: Which of those run their real handler (as :meth:`AsyncAxTestEngine.run`).
        decide: Decisions of gates the fixture left waiting, for the resume.

    Raises:
        InputError: Not a fixture this ax reads, or bad stubs.
        UnstubbedNodeError: The resume reached a node with no stub and ``real`` did not
            allow its real handler.
    """
    data = load_fixture(fixture)
    source = "fixture" if isinstance(fixture, Mapping) else os.fspath(fixture)
    recorded_dag = Dag.from_canonical(data["dag"])
    recorded = fixture_snapshots(data)
    resumed = await engine.restore(data, stubs=stubs, real=real, decide=decide)
    committed = committed_nodes(data)
    # The resume may never change a committed decision (it reads next_hops, never
    # re-evaluates a guard): checked like the replay, on the recorded nodes that are done.
    done = {n: s for n, s in recorded.items() if s.state in _DECIDED}
    diffs = decision_diffs(done, resumed.snapshots, recorded_dag=recorded_dag,
                           replayed_dag=recorded_dag, recording_final=False)
    under_test = recorded_dag if dag is None else load_any_dag(
        Path(dag) if isinstance(dag, os.PathLike) else dag)
    problems: list[str] = [f"resumed: {d}" for d in diffs]
    answers, decisions = recorded_answers(recorded, under_test)
    task = data["task"]
    check: AxRun | None = None
    try:
        check = await engine.run(under_test, task.get("input"), stubs=answers,
                                 decide=decisions, labels=task.get("labels") or {})
    except AxError as exc:
        problems.append(f"the recorded input does not run on this DAG: {exc}")
    # What the test acts on next (advance, decide, result) is the resumed task.
    engine.task_id = resumed.task_id
    hop_diffs: list[HopDiff] = []
    if check is not None:
        hop_diffs = decision_diffs(
            recorded, check.snapshots, recorded_dag=recorded_dag, replayed_dag=under_test,
            recording_final=TaskStatus(task["status"]).final)
    return Replay(
        result=resumed.result, executed=[r.node_id for r in resumed.requests],
        committed_before=committed, diffs=tuple(hop_diffs), problems=tuple(problems),
        source=source, dag=_dag_name(dag, under_test),
        redacted=tuple(data.get("redacted", ())),
        resumed=resumed, check=check)


def _dag_name(dag: DagLike | None, under_test: Dag) -> str:
    if dag is None:
        return f"its recorded DAG ({under_test.name})"
    if isinstance(dag, str | os.PathLike):
        return os.fspath(dag)
    return under_test.name


def _with_engine(home: str | os.PathLike[str] | None, engine_options: Mapping[str, Any],
                 fixture: FixtureLike, options: Mapping[str, Any]) -> Replay:
    from axengine.testing._engine import AsyncAxTestEngine

    async def main(where: Path) -> Replay:
        async with AsyncAxTestEngine(where, **engine_options) as engine:
            return await replay(engine, fixture, **options)

    if home is not None:
        return asyncio.run(main(Path(home)))
    with tempfile.TemporaryDirectory(prefix="ax-replay-") as tmp:
        return asyncio.run(main(Path(tmp)))


def assert_replays(fixture: FixtureLike, *, dag: DagLike | None = None,
                   home: str | os.PathLike[str] | None = None,
                   **options: Any) -> Replay:
    """Replay ``fixture`` in a fresh test engine and assert it replays: nothing
    committed ran again and every recorded decision holds on ``dag``.

    Args:
        fixture: The fixture file, or its parsed JSON.
        dag: The DAG to check the recorded decisions on (default: the recorded one).
        home: Where the engine keeps its store (default: a temporary directory).
        options: ``stubs``, ``real``, ``decide`` as for :func:`replay`.

    Raises:
        ReplayMismatch: A readable diff, one line per node that ended elsewhere.
    """
    return _with_engine(home, {}, fixture, {"dag": dag, **options}).assert_ok()


def replay_fixture(fixture: FixtureLike, *, home: str | os.PathLike[str],
                   handler: Handler | None = None,
                   decide: Mapping[str, str] | None = None,
                   timeout: float = 120.0) -> Replay:
    """Restore ``fixture`` into a fresh store under ``home`` and resume it to the end (or
    a gate nobody decides) with the real handlers (or ``handler``); report what ran.
    Nothing is asserted: see :func:`assert_replays`."""
    engine_options = {"config": AxConfig(home=Path(home)), "handler": handler,
                      "timeout": timeout}
    return _with_engine(home, engine_options, fixture,
                        {"real": True, "decide": dict(decide or {})})
