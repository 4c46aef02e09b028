"""Restoring a recorded task (a snapshot fixture) as if its process had crashed, pure.

A fixture (:mod:`axengine.fixtures`) holds a task record, every node snapshot and the
timeline. Written back as recorded, a RUNNING node would wait out a lease whose owner
is gone; :func:`restored` turns it back to WAITING with its fence bumped — what the
reconciler does to a dead owner's node — so resuming runs it again under a new fence and
a late write of the old owner is stale. Join bookkeeping is recounted from the
predecessors' recorded decisions, and the task's counters and status from the nodes, so
fixtures written by any version restore the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from axengine.dag import Dag
from axengine.engine._rules import DECIDED_STATES, category, derive_status
from axengine.records import COMPOSITE_OWNERS, NodeState, Snapshot, TaskRecord, TaskStatus

__all__ = ["restored"]


def restored(dag: Dag, task: TaskRecord,
             snapshots: Iterable[Snapshot]) -> tuple[TaskRecord, list[Snapshot]]:
    """The task record and the snapshots to write for a recorded task.

    Returns:
        The task with recounted counters and status, and the snapshots in the order
        given (PENDING joins recounted, RUNNING nodes back to WAITING with fence + 1).
    """
    snaps = {snap.node_id: snap for snap in snapshots}
    for snap in list(snaps.values()):
        if snap.state is NodeState.PENDING:
            preds = [snaps[p] for p in dag.predecessors[snap.node_id]]
            decided = [p for p in preds if p.state in DECIDED_STATES]
            snaps[snap.node_id] = replace(
                snap, preds_left=len(preds) - len(decided),
                reached=any(h.target_node_id == snap.node_id and h.is_taken
                            for p in decided for h in p.next_hops))
    out: list[Snapshot] = []
    counts: dict[str, int] = {}
    for snap in snaps.values():
        if snap.state is NodeState.RUNNING and snap.owner not in COMPOSITE_OWNERS:
            # The recorded owner is gone: void its lease as the reconciler would (a map
            # or sub-DAG node is held by its instances, not by a worker).
            snap = replace(snap, state=NodeState.WAITING, fence=snap.fence + 1, owner="",
                           lease_until=0.0, not_before=0.0)
        out.append(snap)
        cat = category(dag.node(snap.node_id), snap)
        if cat is not None:  # (a loop's kept visit is not counted)
            counts[cat] = counts.get(cat, 0) + 1
    status = derive_status(counts, task.status is TaskStatus.CANCELLED)
    return replace(task, counts=dict(sorted(counts.items())), status=status), out
