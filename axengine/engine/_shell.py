"""The engine shell: load → pure rule → one transaction → enqueue → notify.

Every state change goes through :meth:`Engine._apply`: it reads the task record, lets
the rule ask for exactly the snapshots and blobs it needs (``Need``), writes the plan as
one ``txn`` that compares the mod_revision of every snapshot written (and of the task
record when node categories change), and only after the commit enqueues the nodes the
plan made ready. A lost compare means someone else moved first: reload and re-decide.
A crash between the commit and the enqueue loses nothing: the reconciler re-enqueues
WAITING nodes that are missing from the queue.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from axengine import codec, faults
from axengine.blobs import DEFAULT_THRESHOLD, BlobStore
from axengine.dag import Dag
from axengine.engine import _rules as rules
from axengine.engine._view import Need, View
from axengine.errors import Conflict, InputError, NotFound, StoreError
from axengine.keys import StoreKeys
from axengine.queue import WorkItem, WorkQueue
from axengine.records import Event, Snapshot, TaskRecord, TaskStatus
from axengine.store import (
    Compare,
    Get,
    KeyValue,
    Mod,
    Op,
    Put,
    StateStore,
    TxnResult,
    Version,
)
from executors.contract import NodeRequest, Outcome

__all__ = ["ClaimResult", "Engine", "EngineConfig", "SubmitResult", "TaskView"]

#: How many times a transition is re-decided after losing a compare before giving up.
MAX_CAS_RETRIES = 64

Listener = Callable[[TaskRecord, Sequence[Event]], None]


@dataclass(frozen=True)
class EngineConfig:
    """Engine tunables.

    Attributes:
        lease_seconds: Default lease a claim grants (renewed by heartbeats).
        blob_threshold: Payloads (JSON bytes) above this go to the blob store.
        max_input_bytes: Largest task input accepted at submit.
        rules: Backoff and unavailability delays.
    """

    lease_seconds: float = 30.0
    blob_threshold: int = DEFAULT_THRESHOLD
    max_input_bytes: int = 8 * 1024 * 1024
    rules: rules.RuleConfig = field(default_factory=rules.RuleConfig)


@dataclass(frozen=True)
class SubmitResult:
    task_id: str
    created: bool


@dataclass(frozen=True)
class ClaimResult:
    """Answer to a claim.

    Attributes:
        result: ``claimed``, ``not-claimable`` or ``dead``.
        request: What to run (when claimed), with the fence this attempt holds.
        timeout: Seconds this attempt may run.
        lease_until: Lease expiry granted by the claim.
        retry_after: When not claimable because of backoff or a live lease: seconds
            until it may be claimable.
        reason: Why it is not claimable (``backoff``, ``leased``, the node state).
    """

    result: str
    request: NodeRequest | None = None
    timeout: float = 0.0
    lease_until: float = 0.0
    retry_after: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class TaskView:
    """A task with its DAG and every node snapshot (outputs resolved from blobs)."""

    task: TaskRecord
    dag: Dag
    snapshots: Mapping[str, Snapshot]
    revision: int


def _event_id(now: float, n: int = 0) -> str:
    # Time-ordered, then in the order a transition appended its events (they share one
    # store revision); the random tail keeps concurrent writers apart.
    return f"{int(now * 1_000_000):017d}-{n:04d}-{secrets.token_hex(4)}"


class Engine:
    """Applies the transition rules to a :class:`StateStore` and feeds a
    :class:`WorkQueue`. Stateless apart from caches of immutable DAGs: any number of
    engines may share one store."""

    def __init__(
        self,
        *,
        store: StateStore,
        queue: WorkQueue,
        blobs: BlobStore,
        keys: StoreKeys | None = None,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.queue = queue
        self.blobs = blobs
        self.keys = keys or StoreKeys()
        self.config = config or EngineConfig()
        self.clock = clock
        self._dags: dict[str, Dag] = {}
        self._listeners: list[Listener] = []

    # ------------------------------------------------------------------ plumbing

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(task, events)`` after every committed transition (in-process
        progress display, metrics)."""
        self._listeners.append(listener)

    async def put_dag(self, dag: Dag) -> str:
        """Store a validated DAG under its content hash (idempotent)."""
        if dag.hash not in self._dags:
            key = self.keys.dag(dag.hash)
            await self.store.txn([Version(key) == 0], [Put(key, dag.storage_json())], [])
            self._dags[dag.hash] = dag
        return dag.hash

    async def get_dag(self, dag_hash: str) -> Dag:
        dag = self._dags.get(dag_hash)
        if dag is None:
            kv = await self.store.get(self.keys.dag(dag_hash))
            if kv is None:
                raise NotFound(f"DAG {dag_hash} is not stored")
            dag = Dag.from_canonical(json.loads(kv.value))
            self._dags[dag_hash] = dag
        return dag

    async def _load_task(self, task_id: str) -> tuple[TaskRecord, int]:
        kv = await self.store.get(self.keys.task(task_id))
        if kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        return codec.decode_task(kv.value), kv.mod_revision

    async def _fill(self, view: View, need: Need) -> None:
        if need.nodes:
            keys = {self.keys.snapshot(view.task.task_id, n): n for n in sorted(need.nodes)}
            found = await self.store.get_many(list(keys))
            for key, nid in keys.items():
                kv = found.get(key)
                if kv is None:
                    raise StoreError(f"snapshot {key} is missing")
                view.snaps[nid] = codec.decode_snapshot(kv.value)
                view.revs[nid] = kv.mod_revision
        for nid in sorted(need.outputs):
            ref = view.snaps[nid].output_ref
            assert ref is not None
            view.outputs[nid] = json.loads(self.blobs.get(ref))
        if need.task_input:
            assert view.task.input_ref is not None
            view.task_input = json.loads(self.blobs.get(view.task.input_ref))
            view.task_input_loaded = True

    @staticmethod
    def _decide(view: View, rule: Callable[[View], rules.Plan]) -> rules.Plan | Need:
        try:
            return rule(view)
        except Need as need:
            return need

    async def _apply(
        self, task_id: str, rule: Callable[[View], rules.Plan], *,
        preload: Iterable[str] = (),
    ) -> tuple[rules.Plan, View]:
        """Decide and commit one transition, re-deciding on a lost compare."""
        preload = tuple(preload)
        for attempt in range(MAX_CAS_RETRIES):
            if attempt:
                # Lost a compare: siblings of a join all write the task record; jittered
                # backoff keeps a crowd of them from colliding again in lockstep.
                await asyncio.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** attempt)))
            task, task_rev = await self._load_task(task_id)
            view = View(dag=await self.get_dag(task.dag_hash), task=task, task_rev=task_rev)
            if preload:
                await self._fill(view, Need(nodes=preload))
            while isinstance(decided := self._decide(view, rule), Need):
                await self._fill(view, decided)
            plan = decided
            if not plan.writes and plan.task is None:
                return plan, view
            if (await self._commit(view, plan)).succeeded:
                await self._after_commit(view, plan)
                return plan, view
        raise StoreError(f"task {task_id}: gave up after {MAX_CAS_RETRIES} conflicting writes")

    def _externalize(self, snap: Snapshot) -> Snapshot:
        threshold = self.config.blob_threshold
        if snap.output is not None and snap.output_ref is None:
            data = rules.canonical_json(snap.output)
            if len(data) > threshold:
                snap = replace(snap, output=None, output_ref=self.blobs.put(data))
        if snap.input is not None and snap.input_ref is None:
            data = rules.canonical_json(snap.input)
            if len(data) > threshold:
                snap = replace(snap, input=None, input_ref=self.blobs.put(data))
        return snap

    def _task_writes(self, view: View, plan: rules.Plan, now: float) -> TaskRecord | None:
        """Apply category changes of the written snapshots to the task counters; return
        the new task record, or None when the task record does not change."""
        counts = dict(view.task.counts)
        changed = plan.task is not None
        for nid, new in plan.writes.items():
            node = view.dag.nodes[nid]
            old = view.snaps.get(nid) if view.revs.get(nid) else None
            before = rules.category(node, old) if old is not None else None
            after = rules.category(node, new)
            if before != after:
                changed = True
                if before is not None:
                    counts[before] = counts.get(before, 0) - 1
                counts[after] = counts.get(after, 0) + 1
        if not changed:
            return None
        base = plan.task or view.task
        counts = {k: v for k, v in sorted(counts.items()) if v}
        status = rules.derive_status(counts, base.status is TaskStatus.CANCELLED)
        finished = base.finished_at
        if status.final and not view.task.status.final:
            finished = now
        return replace(base, counts=counts, status=status, updated_at=now, finished_at=finished)

    async def _commit(self, view: View, plan: rules.Plan, *,
                      extra_compares: Sequence[Compare] = (), extra_ops: Sequence[Op] = (),
                      failure: Sequence[Op] = ()) -> TxnResult:
        """Write ``plan`` as one transaction (plus ``extra_*``, e.g. an idempotency key)."""
        now = self.clock()
        task_id = view.task.task_id
        compares = list(extra_compares)
        ops: list[Op] = list(extra_ops)
        task = self._task_writes(view, plan, now)
        if task is not None:
            compares.append(Mod(self.keys.task(task_id)) == view.task_rev)
            if task.status != view.task.status:
                plan.events.append(Event(
                    task_id=task_id, event_id=_event_id(now, 9999),
                    kind="task_" + task.status.lower(),
                    at=now, state=task.status.value, actor="engine",
                ))
            ops.append(Put(self.keys.task(task_id), codec.encode_task(task)))
            plan.task = task
        for nid, snap in plan.writes.items():
            key = self.keys.snapshot(task_id, nid)
            compares.append(Mod(key) == view.revs.get(nid, 0))
            ops.append(Put(key, codec.encode_snapshot(self._externalize(snap))))
        for event in plan.events:
            ops.append(Put(self.keys.event(task_id, event.event_id), codec.encode_event(event)))
        faults.point("before-commit")
        result = await self.store.txn(compares, ops, failure)
        if result.succeeded:
            faults.point("after-commit")
        return result

    async def _after_commit(self, view: View, plan: rules.Plan) -> None:
        if plan.enqueue:
            dag = view.dag
            now_items = [WorkItem(view.task.task_id, n, dag.nodes[n].lane)
                         for n, delay in plan.enqueue if delay <= 0]
            if now_items:
                await self.queue.enqueue(now_items)
            for n, delay in plan.enqueue:
                if delay > 0:
                    await self.queue.enqueue(
                        [WorkItem(view.task.task_id, n, dag.nodes[n].lane)], delay=delay)
            faults.point("after-enqueue")
        task = plan.task or view.task
        for listener in self._listeners:
            listener(task, plan.events)

    def _ids(self) -> Callable[[], str]:
        now = self.clock()
        counter = itertools.count()
        return lambda: _event_id(now, next(counter))

    # ------------------------------------------------------------------ operations

    async def submit(
        self,
        dag: Dag,
        input: Any,
        *,
        idempotency_key: str = "",
        labels: Mapping[str, str] | None = None,
        priority: int = 0,
        deadline_seconds: float | None = None,
        task_id: str | None = None,
    ) -> SubmitResult:
        """Create a task and ready its entry nodes in one transaction.

        The same ``idempotency_key`` with the same payload returns the same task; with
        another payload it raises :class:`Conflict`.
        """
        labels = dict(labels or {})
        input_bytes = rules.canonical_json(input)
        if len(input_bytes) > self.config.max_input_bytes:
            raise InputError(
                f"task input is {len(input_bytes)} bytes; the limit is "
                f"{self.config.max_input_bytes}"
            )
        await self.put_dag(dag)
        now = self.clock()
        deadline_s = deadline_seconds if deadline_seconds is not None else dag.deadline
        payload = rules.sha256_json([dag.hash, input, labels, priority, deadline_s])
        task_id = task_id or f"t-{secrets.token_hex(8)}"
        input_ref = None
        stored_input = input
        if len(input_bytes) > self.config.blob_threshold:
            input_ref, stored_input = self.blobs.put(input_bytes), None
        task = TaskRecord(
            task_id=task_id, dag_hash=dag.hash, dag_name=dag.name, input=stored_input,
            input_ref=input_ref, status=TaskStatus.RUNNING, priority=priority,
            deadline=now + deadline_s if deadline_s else 0.0, labels=labels,
            idempotency_key=idempotency_key, payload_sha256=payload, created_at=now,
            updated_at=now,
        )
        view = View(dag=dag, task=task, task_rev=0, task_input=input, task_input_loaded=True)
        preds = dag.predecessors
        for nid in dag.nodes:
            view.snaps[nid] = Snapshot(task_id=task_id, node_id=nid, last_updated=now,
                                       preds_left=len(preds[nid]))
        plan = rules.plan_submit(view, now=now, ids=self._ids())
        compares: list[Compare] = []
        extra: list[Op] = []
        failure: list[Op] = []
        if idempotency_key:
            ikey = self.keys.idempotency(idempotency_key)
            compares.append(Version(ikey) == 0)
            extra.append(Put(ikey, task_id.encode()))
            failure.append(Get(ikey))
        # Same commit as every transition: the task and snapshots are new (revision 0),
        # so the counters are built from scratch.
        result = await self._commit(view, plan, extra_compares=compares, extra_ops=extra,
                                    failure=failure)
        if not result.succeeded:
            if idempotency_key and result.reads and result.reads[0]:
                existing_id = result.reads[0][0].value.decode()
                existing, _ = await self._load_task(existing_id)
                if existing.payload_sha256 != payload:
                    raise Conflict(
                        f"idempotency key {idempotency_key!r} was used for task {existing_id} "
                        "with a different DAG, input, labels, priority or deadline"
                    )
                return SubmitResult(existing_id, created=False)
            raise Conflict(f"task id {task_id!r} already exists")
        await self._after_commit(view, plan)
        return SubmitResult(task_id, created=True)

    async def claim(self, task_id: str, node_id: str, *, worker: str,
                    lease_seconds: float | None = None) -> ClaimResult:
        """Claim a node for ``worker`` (see :func:`rules.plan_claim`)."""
        lease = lease_seconds or self.config.lease_seconds
        plan, view = await self._apply(task_id, lambda v: rules.plan_claim(
            v, node_id, worker=worker, lease=lease, now=self.clock(), ids=self._ids()),
            preload=(node_id,))
        if plan.result == "claimed":
            snap: Snapshot = plan.detail
            node = view.dag.nodes[node_id]
            params = snap.input
            if snap.input_ref is not None:
                params = json.loads(self.blobs.get(snap.input_ref))
            params = params or {}
            config = {k: v for k, v in node.canonical().items() if k not in ("next", "input")}
            if "prompt" in params:
                config["prompt"] = params["prompt"]
            request = NodeRequest(
                task_id=task_id, node_id=node_id, node_type=node.type, attempt=snap.attempt,
                fence=snap.fence, config=config, input=params.get("input"),
                labels=dict(view.task.labels), input_revision=snap.input_revision,
            )
            return ClaimResult("claimed", request=request, timeout=node.timeout,
                               lease_until=snap.lease_until)
        if plan.result == "dead":
            return ClaimResult("dead", reason="deadline or attempt budget")
        reason, retry_after = plan.detail or ("", 0.0)
        return ClaimResult("not-claimable", retry_after=retry_after, reason=reason)

    async def heartbeat(self, task_id: str, node_id: str, *, fence: int,
                        lease_seconds: float | None = None) -> str:
        """Renew the lease: ``ok`` or ``stale`` (stop the run)."""
        lease = lease_seconds or self.config.lease_seconds
        plan, _ = await self._apply(task_id, lambda v: rules.plan_heartbeat(
            v, node_id, fence=fence, lease=lease, now=self.clock(), ids=self._ids()),
            preload=(node_id,))
        return plan.result

    async def progress(self, task_id: str, node_id: str, *, fence: int, marker: str,
                       lease_seconds: float | None = None) -> str:
        """Record a checkpoint: ``ok`` or ``stale``."""
        lease = lease_seconds or self.config.lease_seconds
        plan, _ = await self._apply(task_id, lambda v: rules.plan_progress(
            v, node_id, fence=fence, marker=marker, lease=lease, now=self.clock(),
            ids=self._ids()), preload=(node_id,))
        return plan.result

    async def complete(self, task_id: str, node_id: str, *, fence: int,
                       outcome: Outcome) -> str:
        """Commit an outcome: ``committed``, ``stale`` or ``already-done``."""
        plan, _ = await self._apply(task_id, lambda v: rules.plan_complete(
            v, node_id, fence=fence, outcome=outcome, now=self.clock(), ids=self._ids(),
            config=self.config.rules), preload=(node_id,))
        return plan.result

    async def decide(self, task_id: str, node_id: str, *, decision: str, by: str,
                     comment: str = "") -> str:
        """Approve or reject a paused gate: ``committed`` or ``already-done``."""
        plan, _ = await self._apply(task_id, lambda v: rules.plan_decide(
            v, node_id, decision=decision, by=by, comment=comment, now=self.clock(),
            ids=self._ids()), preload=())
        return plan.result

    async def expire(self, task_id: str, node_id: str, *, owner_dead: bool = False) -> str:
        """Reconciler transition for one node (deadline, lease, stall, gate timeout)."""
        plan, _ = await self._apply(task_id, lambda v: rules.plan_expire(
            v, node_id, now=self.clock(), ids=self._ids(), owner_dead=owner_dead),
            preload=(node_id,))
        return plan.result

    async def cancel(self, task_id: str, *, by: str = "admin") -> str:
        plan, _ = await self._apply(task_id, lambda v: rules.plan_cancel(
            v, now=self.clock(), ids=self._ids(), by=by))
        return plan.result

    async def retry(self, task_id: str, from_node: str, *, input_override: Any = None,
                    by: str = "admin") -> str:
        plan, _ = await self._apply(task_id, lambda v: rules.plan_retry(
            v, from_node, input_override=input_override, now=self.clock(), ids=self._ids(),
            by=by))
        return plan.result

    # ------------------------------------------------------------------ effects

    async def effect_begin(self, key: str, *, task_id: str, node_id: str) -> str:
        """Outbox: NEW → SENDING atomically. Returns the state before the call; an
        earlier SENDING becomes UNKNOWN (an attempt died mid-effect: a person decides)."""
        skey = self.keys.effect(key)
        now = self.clock()
        record = codec.EffectRecord(key=key, state="SENDING", result=None, task_id=task_id,
                                    node_id=node_id, updated_at=now)
        res = await self.store.txn([Version(skey) == 0], [Put(skey, codec.encode_effect(record))],
                                   [Get(skey)])
        if res.succeeded:
            return "NEW"
        kv = res.reads[0][0]
        current = codec.decode_effect(kv.value)
        if current.state == "SENDING":
            unknown = replace(current, state="UNKNOWN", updated_at=now)
            await self.store.txn([Mod(skey) == kv.mod_revision],
                                 [Put(skey, codec.encode_effect(unknown))], [])
        return current.state

    async def effect_done(self, key: str, result: Mapping[str, Any]) -> None:
        skey = self.keys.effect(key)
        kv = await self.store.get(skey)
        if kv is None:
            raise NotFound(f"effect {key!r} was never begun")
        current = codec.decode_effect(kv.value)
        done = replace(current, state="DONE", result=dict(result), updated_at=self.clock())
        await self.store.txn([Mod(skey) == kv.mod_revision], [Put(skey, codec.encode_effect(done))],
                             [])

    async def effect_get(self, key: str) -> codec.EffectRecord | None:
        kv = await self.store.get(self.keys.effect(key))
        return codec.decode_effect(kv.value) if kv else None

    # ------------------------------------------------------------------ reads

    async def task_record(self, task_id: str) -> TaskRecord:
        """The task record alone (status and counters): one read, whatever the DAG size."""
        return (await self._load_task(task_id))[0]

    async def get_task(self, task_id: str, *, resolve_blobs: bool = True) -> TaskView:
        task, _ = await self._load_task(task_id)
        dag = await self.get_dag(task.dag_hash)
        kvs = await self.store.range(self.keys.snapshots(task_id))
        snaps: dict[str, Snapshot] = {}
        revision = 0
        for kv in kvs:
            snap = codec.decode_snapshot(kv.value)
            if resolve_blobs and snap.output_ref is not None:
                snap = replace(snap, output=json.loads(self.blobs.get(snap.output_ref)))
            snaps[snap.node_id] = snap
            revision = max(revision, kv.mod_revision)
        if resolve_blobs and task.input_ref is not None:
            task = replace(task, input=json.loads(self.blobs.get(task.input_ref)))
        ordered = {nid: snaps[nid] for nid in dag.nodes if nid in snaps}
        return TaskView(task=task, dag=dag, snapshots=ordered, revision=revision)

    async def events(self, task_id: str) -> list[Event]:
        kvs = await self.store.range(self.keys.events(task_id))
        return sorted((_event_with_seq(kv) for kv in kvs), key=lambda e: (e.seq, e.event_id))

    async def list_tasks(self, *, status: str | None = None, dag_name: str | None = None,
                         limit: int = 100, start_after: str | None = None) -> list[TaskRecord]:
        prefix = self.keys.tasks()
        after = prefix + start_after if start_after else None
        out: list[TaskRecord] = []
        while len(out) < limit:
            kvs = await self.store.range(prefix, start_after=after, limit=max(limit, 100))
            if not kvs:
                break
            for kv in kvs:
                task = codec.decode_task(kv.value)
                if (status is None or task.status.value == status) and (
                        dag_name is None or task.dag_name == dag_name):
                    out.append(task)
                    if len(out) >= limit:
                        break
            after = kvs[-1].key
        return out


def _event_with_seq(kv: KeyValue) -> Event:
    return replace(codec.decode_event(kv.value), seq=kv.create_revision)


def host_pid_owner(prefix: str = "w") -> str:
    """A worker id that names its host and process, so a resumed embedded run can tell
    whether the previous owner is still alive."""
    return f"{prefix}:{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(3)}"
