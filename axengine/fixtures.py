"""Snapshot fixtures: export a task to JSON, restore it into another store.

``ax snapshot export TASK > f.json`` records a task — its DAG, task record, every node
snapshot (outputs inlined from the blob store) and its timeline. Restoring writes the
same keys into another (typically fresh, embedded) store; nodes that were RUNNING are
turned back to WAITING with their fence bumped, exactly as if the process that ran them
had crashed, so resuming continues from the recorded point without re-running anything
committed. Secrets never appear: the store holds none (credentials live in handler
settings, not in tasks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from axengine import codec
from axengine.dag import Dag
from axengine.engine import Engine, NodeState, Snapshot, TaskRecord, TaskStatus, index_writes
from axengine.engine._rules import DECIDED_STATES, category, derive_status
from axengine.errors import Conflict, InputError
from axengine.records import BlobRef, Event, NextHop
from axengine.store import Mod, Op, Put

__all__ = ["FIXTURE_VERSION", "export_task", "restore_task"]

#: Format version written into every fixture.
FIXTURE_VERSION = 1


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, NodeState | TaskStatus):
        return value.value
    return value


async def export_task(engine: Engine, task_id: str) -> dict[str, Any]:
    """A JSON-able record of a task (outputs and inputs inlined)."""
    view = await engine.get_task(task_id)
    snaps = []
    for snap in view.snapshots.values():
        if snap.input_ref is not None:
            snap = replace(snap, input=json.loads(engine.blobs.get(snap.input_ref)))
        snaps.append(_plain(asdict(replace(snap, input_ref=None, output_ref=None))))
    task = replace(view.task, input_ref=None)
    events = [_plain(asdict(e)) for e in await engine.events(task_id)]
    return {
        "version": FIXTURE_VERSION,
        "dag": view.dag.canonical(),
        "dag_hash": view.dag.hash,
        "task": _plain(asdict(task)),
        "snapshots": snaps,
        "events": events,
    }


def _snapshot(data: Mapping[str, Any]) -> Snapshot:
    fields = dict(data)
    fields["state"] = NodeState(fields["state"])
    fields["next_hops"] = tuple(NextHop(**h) for h in fields.get("next_hops", ()))
    for ref in ("input_ref", "output_ref"):
        if fields.get(ref):
            fields[ref] = BlobRef(**fields[ref])
    return Snapshot(**fields)


def _task(data: Mapping[str, Any]) -> TaskRecord:
    fields = dict(data)
    fields["status"] = TaskStatus(fields["status"])
    if fields.get("input_ref"):
        fields["input_ref"] = BlobRef(**fields["input_ref"])
    return TaskRecord(**fields)


async def restore_task(engine: Engine, fixture: Mapping[str, Any]) -> str:
    """Write a fixture's task into ``engine``'s store (the task id must be free) and
    return the task id. RUNNING nodes come back WAITING with a bumped fence."""
    if fixture.get("version") != FIXTURE_VERSION:
        raise InputError(f"unsupported fixture version {fixture.get('version')!r}")
    dag = Dag.from_canonical(fixture["dag"])
    if dag.hash != fixture["dag_hash"]:
        raise InputError("fixture DAG does not match its recorded hash")
    await engine.put_dag(dag)
    task = _task(fixture["task"])
    keys = engine.keys
    ops: list[Op] = []
    counts: dict[str, int] = {}

    snaps = {raw["node_id"]: _snapshot(raw) for raw in fixture["snapshots"]}
    for snap in list(snaps.values()):
        if snap.state is NodeState.PENDING:
            # Recount the join bookkeeping from the predecessors' recorded decisions, so
            # fixtures from any version restore the same way.
            preds = [snaps[p] for p in dag.predecessors[snap.node_id]]
            decided = [p for p in preds if p.state in DECIDED_STATES]
            snaps[snap.node_id] = replace(
                snap, preds_left=len(preds) - len(decided),
                reached=any(h.target_node_id == snap.node_id and h.is_taken
                            for p in decided for h in p.next_hops))
    for snap in snaps.values():
        if snap.state is NodeState.RUNNING:
            # The recorded owner is gone: void its lease as the reconciler would.
            snap = replace(snap, state=NodeState.WAITING, fence=snap.fence + 1, owner="",
                           lease_until=0.0, not_before=0.0)
        cat = category(dag.nodes[snap.node_id], snap)
        counts[cat] = counts.get(cat, 0) + 1
        ops.append(Put(keys.snapshot(task.task_id, snap.node_id),
                       codec.encode_snapshot(await engine._externalize(snap))))
    status = derive_status(counts, task.status is TaskStatus.CANCELLED)
    task = replace(task, counts=dict(sorted(counts.items())), status=status)
    ops.insert(0, Put(keys.task(task.task_id), codec.encode_task(task)))
    # Listing and the reconciler find tasks through the indexes: enter it there too.
    ops.extend(index_writes(keys, None, task))
    for raw in fixture.get("events", ()):
        event = Event(**{k: v for k, v in raw.items() if k != "seq"})
        ops.append(Put(keys.event(task.task_id, event.event_id), codec.encode_event(event)))
    result = await engine.store.txn([Mod(keys.task(task.task_id)) == 0], ops, [])
    if not result.succeeded:
        raise Conflict(f"task {task.task_id} already exists in this store")
    return task.task_id
