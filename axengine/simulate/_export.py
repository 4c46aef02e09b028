"""Node runs from the engine's task timelines.

Every transition appends an event to its task's timeline (:meth:`Engine.events`); a node
run is the stretch of one node's events from a ``claimed`` to the event that ended the
attempt. :func:`runs_from_events` is the pure pairing over one task's events;
:func:`export_history` walks tasks through the engine's public reads (never the store).

Endings, as the rules (``axengine/engine/_rules.py``) write them:

============================  =====================================================
event                         outcome
============================  =====================================================
``committed``                 succeeded
``retry`` / ``failed`` /      timed_out when the worker stopped it at its timeout
``dead``                      (detail "timed out after …"); stalled when the
                              reconciler found no progress ("no progress for …");
                              stale when its lease expired or its owner was gone;
                              failed otherwise
``unavailable``               unavailable (a dependency was down)
``lease_expired``             stalled ("no progress for …") or stale
``cancelled``                 cancelled
another ``claimed``           stale (the previous run was taken over without an
                              event of its own)
============================  =====================================================

Nodes that run inline (``condition``, ``human_gateway``) are never claimed, so they
produce no runs. A run still open when the timeline ends (a run in flight, or a worker
that died with no reconciler pass since) is left out: it has no end to replay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from axengine.dag import Dag
from axengine.engine import Engine, Event, TaskRecord
from axengine.simulate._history import NodeRun, RunOutcome, sort_runs

__all__ = ["ENDING_KINDS", "NodeInfo", "export_history", "node_infos", "runs_from_events"]

#: Event kinds that end a running attempt.
ENDING_KINDS = frozenset({"committed", "retry", "failed", "dead", "unavailable",
                          "lease_expired", "cancelled"})
#: Longest ``detail`` kept per run (error messages can be long).
DETAIL_LIMIT = 200
#: Tasks read per page while exporting.
PAGE = 200


@dataclass(frozen=True)
class NodeInfo:
    """What the DAG says about a node that a run record keeps."""

    node_type: str = ""
    model: str = ""
    tool: str = ""


def node_infos(dag: Dag) -> dict[str, NodeInfo]:
    """Type, model and tool of every node of ``dag``."""
    return {nid: NodeInfo(node.type, node.model or "", node.tool or "")
            for nid, node in dag.nodes.items()}


def _outcome(event: Event) -> RunOutcome:
    kind, detail = event.kind, event.detail
    if kind == "committed":
        return RunOutcome.SUCCEEDED
    if kind == "unavailable":
        return RunOutcome.UNAVAILABLE
    if kind == "cancelled":
        return RunOutcome.CANCELLED
    if "timed out after" in detail:
        return RunOutcome.TIMED_OUT
    if "no progress for" in detail:
        return RunOutcome.STALLED
    if kind == "lease_expired" or "lease expired" in detail or "owner process is gone" in detail:
        return RunOutcome.STALE
    return RunOutcome.FAILED


@dataclass
class _Open:
    attempt: int
    started: float
    progress: list[float]


def runs_from_events(task_id: str, dag_name: str, nodes: Mapping[str, NodeInfo],
                     events: Iterable[Event]) -> list[NodeRun]:
    """Pair each ``claimed`` event with the event that ended the attempt.

    Args:
        task_id: The task the events belong to.
        dag_name: Its DAG's name.
        nodes: Type, model and tool by node id (unknown nodes get empty fields).
        events: The task's timeline, in commit order (:meth:`Engine.events`).

    Returns:
        The finished runs, by start time then node id.
    """
    open_runs: dict[str, _Open] = {}
    runs: list[NodeRun] = []

    def close(node_id: str, run: _Open, at: float, outcome: RunOutcome, detail: str) -> None:
        info = nodes.get(node_id, NodeInfo())
        runs.append(NodeRun(
            task_id=task_id, dag=dag_name, node=node_id, node_type=info.node_type,
            model=info.model, tool=info.tool, attempt=max(run.attempt, 1),
            started=run.started, ended=max(at, run.started), progress=tuple(run.progress),
            outcome=outcome, detail=detail[:DETAIL_LIMIT]))

    for event in events:
        if not event.node_id:
            continue
        current = open_runs.get(event.node_id)
        if event.kind == "claimed":
            if current is not None:
                close(event.node_id, current, event.at, RunOutcome.STALE,
                      "claimed again before this run ended")
            open_runs[event.node_id] = _Open(event.attempt, event.at, [])
        elif current is None:
            continue  # an inline node, or an ending with no run (e.g. dead at claim)
        elif event.kind == "progress":
            current.progress.append(event.at)
        elif event.kind in ENDING_KINDS:
            del open_runs[event.node_id]
            close(event.node_id, current, event.at, _outcome(event), event.detail)
    return sorted(runs, key=lambda r: (r.started, r.node, r.attempt))


async def _task_runs(engine: Engine, task: TaskRecord,
                     infos: dict[str, dict[str, NodeInfo]]) -> list[NodeRun]:
    nodes = infos.get(task.dag_hash)
    if nodes is None:
        nodes = infos[task.dag_hash] = node_infos(await engine.get_dag(task.dag_hash))
    return runs_from_events(task.task_id, task.dag_name, nodes,
                            await engine.events(task.task_id))


async def export_history(engine: Engine, *, dag_name: str = "",
                         limit: int | None = None) -> list[NodeRun]:
    """Every finished node run of the stored tasks, oldest first.

    Args:
        engine: The engine to read through (its public reads only).
        dag_name: Only tasks of this DAG ("" for all).
        limit: At most this many tasks, the newest (None: all).
    """
    infos: dict[str, dict[str, NodeInfo]] = {}
    tasks: list[TaskRecord] = []
    token = ""
    while limit is None or len(tasks) < limit:
        size = PAGE if limit is None else min(PAGE, limit - len(tasks))
        page, next_token = await engine.task_page(dag_name=dag_name, limit=size,
                                                  page_token=token)
        tasks += page
        if next_token is None:
            break
        token = next_token
    runs: list[NodeRun] = []
    for task in tasks:
        runs += await _task_runs(engine, task, infos)
    return sort_runs(runs)

