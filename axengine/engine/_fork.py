"""Forking a finished task (time travel): a new task that shares the source's history.

A fork copies the source task's committed history — every node that is not ``from_node``
or a descendant of it keeps its state, output and cached ``next_hops`` — and runs again
from ``from_node``. The reset is the admin retry's own rule (:func:`rules.plan_retry`),
applied to an in-memory copy under the fork's id, so join bookkeeping, rendering and
skip propagation are decided exactly as a retry decides them. With an output given, the
fork point is committed with it by :func:`rules.plan_complete` under a fence only the
fork holds, so its edges are decided again from that output by its own guards.

:func:`plan_fork` is pure: it returns the fork's record, snapshots, events and the nodes
to enqueue. :func:`fork_task` reads the source, calls it, writes the fork in one
transaction (:meth:`Engine.restore_task`), then enqueues — a crash between the two is
covered as for every commit: the reconciler enqueues WAITING nodes missing from the
queue. The source task is only read.
"""

from __future__ import annotations

import difflib
import itertools
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from axengine.dag import Dag, base_id, is_visit
from axengine.engine import _rules as rules
from axengine.engine._ramp import dependency_of
from axengine.engine._reads import _event_id
from axengine.engine._shell import Engine
from axengine.engine._view import Need, View
from axengine.errors import Conflict, InputError
from axengine.limits import check_json_value
from axengine.queue import WorkItem
from axengine.records import FINAL_STATES, Event, NodeState, Snapshot, TaskRecord
from executors.contract import Success

__all__ = ["FORKED_FROM_LABEL", "RERUN", "Fork", "fork_task", "plan_fork"]

#: Label a fork carries: ``<source task id>@<node id>``.
FORKED_FROM_LABEL = "ax.forked_from"
#: Worker name the fork point's commit is recorded under when an output is set.
FORK_WORKER = "fork"


class _Rerun:
    def __repr__(self) -> str:
        return "RERUN"


#: ``output`` of a fork that runs the fork point again (rather than setting its output).
RERUN: Any = _Rerun()


@dataclass(frozen=True)
class Fork:
    """What to write for a fork.

    Attributes:
        task: The fork's task record (status and counts recounted on restore).
        snapshots: Every node snapshot of the fork, in DAG order.
        events: The shared history's events (renamed to the fork), then the fork's own.
        enqueue: ``(node_id, delay_seconds)`` to push to the queue after the write.
    """

    task: TaskRecord
    snapshots: list[Snapshot]
    events: list[Event]
    enqueue: list[tuple[str, float]]


def plan_fork(dag: Dag, source: TaskRecord, snapshots: Mapping[str, Snapshot],
              events: Sequence[Event], *, fork_id: str, from_node: str, by: str,
              now: float, output: Any = RERUN, outputs: Mapping[str, Any] | None = None,
              inputs: Mapping[str, Any] | None = None, task_input: Any = None,
              config: rules.RuleConfig | None = None) -> Fork:
    """The fork of ``source`` at ``from_node``.

    Args:
        dag: The source's DAG (the fork runs the same version).
        source: The source task's record.
        snapshots: Every node snapshot of the source, as stored, by node id.
        events: The source's timeline.
        fork_id: The new task's id.
        from_node: The fork point: it and its descendants are reset.
        by: Who forks (the fork's submitter, the actor of its events).
        now: Engine time.
        output: The fork point's output in the fork (its edges are decided from it);
            :data:`RERUN` runs the fork point again.
        outputs: Blob-held outputs of the source, by node id (rendering reads them).
        inputs: Blob-held rendered inputs of the source, by node id.
        task_input: The task input when it is blob-held.
        config: Rule tunables.

    Raises:
        InputError: No such node, or an output for a node that runs no handler, or an
            output the node's guards cannot read.
        Conflict: The source still runs, or never reached ``from_node``.
    """
    if from_node not in dag.nodes:
        close = difflib.get_close_matches(from_node, list(dag.nodes), n=1)
        raise InputError(f"task {source.task_id} has no node {from_node!r}"
                         + (f"; did you mean {close[0]!r}?" if close else ""))
    unfinished = sorted(n for n, s in snapshots.items() if s.state not in FINAL_STATES)
    if unfinished:
        raise Conflict(f"task {source.task_id} is {source.status.value} ({unfinished[0]} is "
                       f"{snapshots[unfinished[0]].state.value}); fork a finished task, "
                       "or cancel it first")
    state = snapshots[from_node].state
    if state is NodeState.SKIPPED:
        raise Conflict(f"task {source.task_id} never reached node {from_node!r} (SKIPPED); "
                       "fork at a node it ran")
    node = dag.nodes[from_node]
    setting = output is not RERUN
    if setting and (node.type in rules.INLINE_TYPES):
        raise InputError(f"node {from_node!r} is a {node.type}: an output can be set on "
                         "tool_call and llm_call nodes only; fork without one to re-run it")
    if setting:
        check_json_value(output, f"output of node {from_node!r}")
    ids = _ids(now)
    labels = {**source.labels, FORKED_FROM_LABEL: f"{source.task_id}@{from_node}"}
    span = source.deadline - source.created_at if source.deadline else 0.0
    task = replace(
        source, task_id=fork_id, labels=labels, idempotency_key="", created_at=now,
        updated_at=now, finished_at=0.0, paused_at=0.0, submitted_by=by,
        deadline=now + span if span > 0 else 0.0,
        payload_sha256=rules.sha256_json([
            dag.hash, task_input if source.input_ref is not None else source.input, labels,
            source.priority, span]),
    )
    rerun = {from_node, *rules._descendants(dag, from_node)}
    view = View(dag=dag, task=task, task_rev=0,
                snaps={n: replace(s, task_id=fork_id) for n, s in snapshots.items()
                       if _shared(dag, n, rerun, from_node)},
                outputs=dict(outputs or {}), inputs=dict(inputs or {}),
                task_input=task_input, task_input_loaded=True)
    forked = Event(task_id=fork_id, event_id=ids(), kind="forked", at=now, node_id=from_node,
                   actor=by, detail=f"forked from {source.task_id} at {from_node} by {by}"
                   + (" with its output set" if setting else ""))
    # The source's status changes (``task_succeeded``...) are not the fork's history.
    shared = [replace(e, task_id=fork_id, seq=0) for e in events
              if base_id(e.node_id) not in rerun and not e.kind.startswith("task_")]
    plan = _decided(view, lambda: rules.plan_retry(view, from_node, input_override=None,
                                                   now=now, ids=ids, by=by))
    # The retry's own event says "retried"; in a fork, ``forked`` tells that story.
    plan_events = [e for e in plan.events if e.kind != "retried"]
    view.snaps.update(plan.writes)
    enqueue = list(plan.enqueue)
    if setting:
        enqueue = [(n, d) for n, d in enqueue if n != from_node]
        snap = view.snaps[from_node]
        # Claimed by the fork itself, under a fence no worker was ever given: the commit
        # below is an ordinary fenced completion, decided by the rules that decide any.
        held = replace(snap, state=NodeState.RUNNING, attempt=snap.attempt + 1,
                       fence=snap.fence + 1, owner=FORK_WORKER, started_at=now,
                       lease_until=now)
        view.snaps[from_node] = held
        # The fork point's commit touches no ramp and records no duration: nothing ran.
        dependency = dependency_of(node)
        if dependency is not None:
            view.ramps[dependency] = None
        view.run_durations[from_node] = []
        done = _decided(view, lambda: rules.plan_complete(
            view, from_node, fence=held.fence, outcome=Success(output), now=now, ids=ids,
            config=config or rules.RuleConfig()))
        written = done.writes.get(from_node)
        if written is None or written.state is not NodeState.SUCCEEDED:
            error = written.error if written is not None else done.result
            raise InputError(f"the output set for node {from_node!r} does not decide its "
                             f"edges: {error}")
        view.snaps.update(done.writes)
        plan_events += done.events
        enqueue += done.enqueue
    ordered = [view.snaps[n] for n in dag.in_order(view.snaps)]
    return Fork(task=task, snapshots=ordered, events=[*shared, forked, *plan_events],
                enqueue=enqueue)


async def fork_task(engine: Engine, task_id: str, from_node: str, *, output: Any = RERUN,
                    by: str, fork_id: str | None = None) -> str:
    """Fork the finished task ``task_id`` at ``from_node`` (see :func:`plan_fork`) and
    return the fork's id. The fork is written in one transaction, then its ready nodes
    are enqueued; the source is not written.

    Raises:
        NotFound: No such task.
        InputError, Conflict: See :func:`plan_fork`.
    """
    view = await engine.get_task(task_id, resolve_blobs=False)
    source, dag = view.task, view.dag
    snaps = dict(view.snapshots)
    outputs = {n: await engine.blob_json(s.output_ref)
               for n, s in snaps.items() if s.output_ref is not None}
    inputs = {n: await engine.blob_json(s.input_ref)
              for n, s in snaps.items() if s.input_ref is not None}
    task_input = (await engine.blob_json(source.input_ref)
                  if source.input_ref is not None else source.input)
    fork = plan_fork(dag, source, snaps, await engine.events(task_id),
                     fork_id=fork_id or f"t-{secrets.token_hex(8)}", from_node=from_node,
                     by=by, now=engine.clock(), output=output, outputs=outputs,
                     inputs=inputs, task_input=task_input, config=engine.config.rules)
    new_id = await engine.restore_task(dag, fork.task, fork.snapshots, fork.events)
    for node_id, delay in fork.enqueue:
        await engine.queue.enqueue([WorkItem(new_id, node_id, dag.node(node_id).lane,
                                             priority=fork.task.priority)], delay=delay)
    return new_id


def _shared(dag: Dag, node_id: str, rerun: set[str], from_node: str) -> bool:
    """Whether the fork keeps ``node_id``'s snapshot as shared history: every node's
    but the items of a map it runs again (made again as it runs) and the kept visits of
    a loop it runs again from before the loop (its visits count from the first again);
    a fork from inside a loop keeps the visits before."""
    base = base_id(node_id)
    if node_id == base or base not in rerun:
        return True
    closer = dag.loop_of(base)
    return is_visit(node_id) and closer is not None and from_node in dag.loops[closer]


def _decided(view: View, rule: Callable[[], rules.Plan]) -> rules.Plan:
    while True:
        try:
            return rule()
        except Need as need:
            # Every snapshot, output and input is in the view, but for the items of a
            # map and the visits of a loop the fork makes anew.
            fresh = [n for n in need.nodes if n != base_id(n)]
            if not fresh or len(fresh) != len(need.nodes) or need.outputs or need.inputs:
                raise AssertionError(f"fork view is missing state: {vars(need)}") from None
            for nid in fresh:
                view.absent(nid)


def _ids(now: float) -> Callable[[], str]:
    counter = itertools.count()
    return lambda: _event_id(now, next(counter))
