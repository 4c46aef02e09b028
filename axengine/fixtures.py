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

from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from axengine.dag import Dag
from axengine.engine import Engine, NodeState, Snapshot, TaskRecord, TaskStatus
from axengine.errors import InputError
from axengine.records import BlobRef, Event, NextHop

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
            snap = replace(snap, input=await engine.blob_json(snap.input_ref))
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
    return the task id. RUNNING nodes come back WAITING with a bumped fence (see
    :meth:`Engine.restore_task <axengine.engine.Engine.restore_task>`).

    Raises:
        InputError: Not a fixture of this version, or its DAG does not match its hash.
        Conflict: The task already exists in this store.
    """
    if fixture.get("version") != FIXTURE_VERSION:
        raise InputError(f"unsupported fixture version {fixture.get('version')!r}")
    dag = Dag.from_canonical(fixture["dag"])
    if dag.hash != fixture["dag_hash"]:
        raise InputError("fixture DAG does not match its recorded hash")
    events = [Event(**{k: v for k, v in raw.items() if k != "seq"})
              for raw in fixture.get("events", ())]
    return await engine.restore_task(dag, _task(fixture["task"]),
                                     [_snapshot(raw) for raw in fixture["snapshots"]], events)
