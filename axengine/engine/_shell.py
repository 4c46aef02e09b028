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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from axengine import codec, faults
from axengine.blobs import DEFAULT_THRESHOLD, BlobStore
from axengine.dag import Dag
from axengine.engine import _rules as rules
from axengine.engine._budget import require_fit
from axengine.engine._index import (
    choose_index,
    decode_cursor,
    encode_cursor,
    index_keys,
    index_writes,
)
from axengine.engine._view import Need, View
from axengine.errors import Conflict, NotFound, StoreError
from axengine.keys import INDEX_VERSION, StoreKeys
from axengine.limits import check_json_value, parse_json_text
from axengine.queue import WorkItem, WorkQueue
from axengine.records import BlobRef, Event, Snapshot, TaskRecord, TaskStatus
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

__all__ = ["LOCAL_PRINCIPAL", "ClaimResult", "Engine", "EngineConfig", "SubmitResult",
           "TaskView"]

#: ``submitted_by`` of tasks submitted through the embedded engine (``ax run``, the SDK):
#: there is no authenticated principal, only the local user.
LOCAL_PRINCIPAL = "local"

#: How many times a transition is re-decided after losing a compare before giving up.
MAX_CAS_RETRIES = 64
#: Index keys one page of a task listing may read (filters no index serves stop here
#: and return a short page with a token).
LIST_SCAN_BUDGET = 5000
#: Seconds within which a transition commits after it was decided (clock skew between
#: API replicas included): event paging of an unfinished task re-reads this much of the
#: timeline for events that committed after a later-stamped one.
LATE_EVENT_WINDOW = 30.0

Listener = Callable[[TaskRecord, Sequence[Event]], None]


@dataclass(frozen=True)
class EngineConfig:
    """Engine tunables.

    Attributes:
        lease_seconds: Default lease a claim grants (renewed by heartbeats).
        blob_threshold: Payloads (JSON bytes) above this go to the blob store.
        max_input_bytes: Largest task input accepted at submit.
        rules: Backoff and unavailability delays.
        four_eyes: Every ``human_gateway`` refuses a decision by the task's submitter
            (otherwise only gates that declare ``four_eyes: true``).
    """

    lease_seconds: float = 30.0
    blob_threshold: int = DEFAULT_THRESHOLD
    max_input_bytes: int = 8 * 1024 * 1024
    rules: rules.RuleConfig = field(default_factory=rules.RuleConfig)
    four_eyes: bool = False


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
        submitted_by: Who submitted the task (``local`` for the embedded engine; "" when
            the answer came over the wire, which does not carry it).
    """

    result: str
    request: NodeRequest | None = None
    timeout: float = 0.0
    lease_until: float = 0.0
    retry_after: float = 0.0
    reason: str = ""
    submitted_by: str = ""


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
            view.outputs[nid] = await self.blob_json(ref)
        if need.task_input:
            assert view.task.input_ref is not None
            view.task_input = await self.blob_json(view.task.input_ref)
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
            for nid in preload:
                # A caller naming a node the DAG does not have is a bad request, not a
                # missing snapshot in the store.
                if nid not in view.dag.nodes:
                    raise NotFound(f"task {task_id!r} has no node {nid!r}")
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

    async def _externalize(self, snap: Snapshot) -> Snapshot:
        threshold = self.config.blob_threshold
        if snap.output is not None and snap.output_ref is None:
            data = rules.canonical_json(snap.output)
            if len(data) > threshold:
                ref = await asyncio.to_thread(self.blobs.put, data)  # file I/O: off the loop
                snap = replace(snap, output=None, output_ref=ref)
        if snap.input is not None and snap.input_ref is None:
            data = rules.canonical_json(snap.input)
            if len(data) > threshold:
                ref = await asyncio.to_thread(self.blobs.put, data)
                snap = replace(snap, input=None, input_ref=ref)
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
            # The indexes move in the same transaction as the record (revision 0: a
            # submit, every entry is new).
            ops.extend(index_writes(self.keys, view.task if view.task_rev else None, task))
            plan.task = task
        for nid, snap in plan.writes.items():
            key = self.keys.snapshot(task_id, nid)
            compares.append(Mod(key) == view.revs.get(nid, 0))
            ops.append(Put(key, codec.encode_snapshot(await self._externalize(snap))))
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
        submitted_by: str = LOCAL_PRINCIPAL,
    ) -> SubmitResult:
        """Create a task and ready its entry nodes in one transaction.

        The same ``idempotency_key`` with the same payload returns the same task; with
        another payload it raises :class:`Conflict`.
        """
        labels = dict(labels or {})
        # Checked before anything is stored: the input must read back on every path
        # (standard JSON, bounded depth and size), and the largest transition of the DAG
        # must fit one store transaction, or the task could never finish.
        input_bytes = check_json_value(input, "task input",
                                       max_bytes=self.config.max_input_bytes)
        require_fit(dag, self.store.max_txn_ops, labels=len(labels))
        now = self.clock()
        deadline_s = deadline_seconds if deadline_seconds is not None else dag.deadline
        payload = rules.sha256_json([dag.hash, input, labels, priority, deadline_s])
        task_id = task_id or f"t-{secrets.token_hex(8)}"
        input_ref = None
        stored_input = input
        if len(input_bytes) > self.config.blob_threshold:
            input_ref, stored_input = await asyncio.to_thread(self.blobs.put, input_bytes), None
        task = TaskRecord(
            task_id=task_id, dag_hash=dag.hash, dag_name=dag.name, input=stored_input,
            input_ref=input_ref, status=TaskStatus.RUNNING, priority=priority,
            deadline=now + deadline_s if deadline_s else 0.0, labels=labels,
            idempotency_key=idempotency_key, payload_sha256=payload, created_at=now,
            submitted_by=submitted_by,
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
            ikey = self.keys.idempotency(submitted_by, idempotency_key)
            compares.append(Version(ikey) == 0)
            extra.append(Put(ikey, task_id.encode()))
            failure.append(Get(ikey))
        if dag.hash not in self._dags:
            # The DAG record rides in the submit's transaction, so a refused or conflicting
            # submit stores nothing; re-putting a stored DAG writes the same bytes (the
            # key is its content hash).
            extra.append(Put(self.keys.dag(dag.hash), dag.storage_json()))
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
        self._dags[dag.hash] = dag
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
                params = await self.blob_json(snap.input_ref)
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
                               lease_until=snap.lease_until,
                               submitted_by=view.task.submitted_by)
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
            four_eyes=self.config.four_eyes,
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
        if input_override is not None:
            # The same door as a submitted input, for every caller (REST, gRPC, CLI).
            check_json_value(input_override, "retry input",
                             max_bytes=self.config.max_input_bytes)
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

    async def blob_json(self, ref: BlobRef, *, max_bytes: int | None = None,
                        strict_field: str | None = None) -> Any:
        """The JSON value held in a blob, read in a worker thread (a blob may be
        megabytes; the event loop keeps serving meanwhile).

        Args:
            ref: The reference; only its sha256 (and declared size) are used.
            max_bytes: Refuse blobs larger than this (None: the blob store's maximum).
            strict_field: Parse with the door's JSON limits (a blob named by a caller),
                naming this field in refusals; None for blobs the engine wrote.

        Raises:
            InputError: ``ref`` is not a sha256 digest or declares more than the limit;
                with ``strict_field``, content that is not acceptable JSON.
            BlobError: Missing, not a regular file, too large, or corrupt.
        """
        data = await asyncio.to_thread(self.blobs.get, ref, max_bytes=max_bytes)
        if strict_field is not None:
            return parse_json_text(data, strict_field)
        return json.loads(data)

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
                snap = replace(snap, output=await self.blob_json(snap.output_ref))
            snaps[snap.node_id] = snap
            revision = max(revision, kv.mod_revision)
        if resolve_blobs and task.input_ref is not None:
            task = replace(task, input=await self.blob_json(task.input_ref))
        ordered = {nid: snaps[nid] for nid in dag.nodes if nid in snaps}
        return TaskView(task=task, dag=dag, snapshots=ordered, revision=revision)

    async def events(self, task_id: str) -> list[Event]:
        kvs = await self.store.range(self.keys.events(task_id))
        return sorted((_event_with_seq(kv) for kv in kvs), key=lambda e: (e.seq, e.event_id))

    async def list_tasks(self, *, status: str | None = None, dag_name: str | None = None,
                         limit: int = 100) -> list[TaskRecord]:
        """Up to ``limit`` tasks, newest first (see :meth:`task_page`)."""
        statuses = frozenset({TaskStatus(status)}) if status else frozenset()
        out: list[TaskRecord] = []
        token = ""
        while len(out) < limit:
            page, next_token = await self.task_page(statuses=statuses, dag_name=dag_name or "",
                                                    limit=min(limit - len(out), 1000),
                                                    page_token=token)
            out += page
            if next_token is None:
                break
            token = next_token
        return out

    async def task_page(
        self, *, statuses: Collection[TaskStatus] = (), dag_name: str = "",
        labels: Mapping[str, str] | None = None,
        match: Callable[[TaskRecord], bool] | None = None, limit: int = 100,
        page_token: str = "", scan_budget: int = LIST_SCAN_BUDGET,
    ) -> tuple[list[TaskRecord], str | None]:
        """One page of tasks, newest first, read through a secondary index.

        The index is the most selective equality filter (:func:`choose_index`): its keys
        are read page by page with ``start_after`` seeks, the task records fetched with
        one ``get_many`` per batch, and every filter (``statuses``, ``dag_name``,
        ``labels`` and ``match``) re-checked on the records. A page reads at most
        ``scan_budget`` index keys, so a filter no index serves returns a short page
        with a token rather than scanning the store.

        Returns:
            The tasks, and the opaque token of the next page (None: no more).

        Raises:
            InputError: ``page_token`` was not returned by this method.
        """
        wanted = frozenset(statuses)
        labels = dict(labels or {})
        index = choose_index(self.keys, statuses=wanted, dag_name=dag_name, labels=labels)
        after = decode_cursor(index, page_token) if page_token else None
        out: list[TaskRecord] = []
        scanned = 0
        batch = limit
        while len(out) < limit and scanned < scan_budget:
            entries = await self.store.range(index, start_after=after,
                                             limit=min(batch, scan_budget - scanned))
            scanned += len(entries)
            found = await self.store.get_many([self.keys.task(kv.value.decode())
                                               for kv in entries])
            for entry in entries:
                after = entry.key
                kv = found.get(self.keys.task(entry.value.decode()))
                if kv is None:
                    continue
                task = codec.decode_task(kv.value)
                if ((not wanted or task.status in wanted)
                        and (not dag_name or task.dag_name == dag_name)
                        and all(task.labels.get(k) == v for k, v in labels.items())
                        and (match is None or match(task))):
                    out.append(task)
                    if len(out) >= limit:
                        break
            if len(entries) < batch:
                return out, None  # the index has no more keys
            # Residual filters rejected some: read more per round trip, up to a page.
            batch = min(batch * 2, 1000)
        return out, (encode_cursor(index, after) if after else None)

    async def count_active(self, principal: str, *, cap: int) -> int:
        """Unfinished tasks ``principal`` submitted, counted up to ``cap`` from the
        active-by-principal index (reads at most ``cap`` keys, whatever the store holds)."""
        return len(await self.store.range(self.keys.active_by(principal), limit=cap))

    async def unfinished_tasks(self) -> list[TaskRecord]:
        """Every task not in a final status, from the status index (finished tasks are
        never read)."""
        out: list[TaskRecord] = []
        for status in (TaskStatus.RUNNING, TaskStatus.PAUSED):
            index = self.keys.by_status(status.value)
            after: str | None = None
            while True:
                entries = await self.store.range(index, start_after=after, limit=1000)
                if not entries:
                    break
                after = entries[-1].key
                found = await self.store.get_many([self.keys.task(kv.value.decode())
                                                   for kv in entries])
                for kv in found.values():
                    task = codec.decode_task(kv.value)
                    if not task.status.final:
                        out.append(task)
        return sorted({t.task_id: t for t in out}.values(), key=lambda t: t.task_id)

    async def ensure_indexes(self) -> int:
        """Enter every task stored before the indexes existed, once per store.

        Skipped when the ``index_version`` marker holds :data:`INDEX_VERSION`. Each task
        is indexed by a transaction that compares its record's mod_revision, so a task
        changing meanwhile is re-read rather than indexed with a stale status; the puts
        are idempotent, so replicas racing here do no harm. Returns the tasks indexed.
        """
        marker = self.keys.index_version()
        kv = await self.store.get(marker)
        if kv is not None and kv.value.decode() == INDEX_VERSION:
            return 0
        prefix = self.keys.tasks()
        after: str | None = None
        done = 0
        while True:
            kvs = await self.store.range(prefix, start_after=after, limit=500)
            if not kvs:
                break
            after = kvs[-1].key
            for task_kv in kvs:
                current: KeyValue | None = task_kv
                while current is not None:
                    task = codec.decode_task(current.value)
                    ops: list[Op] = [Put(k, task.task_id.encode())
                                     for k in sorted(index_keys(self.keys, task))]
                    result = await self.store.txn(
                        [Mod(current.key) == current.mod_revision], ops, [Get(current.key)])
                    current = None if result.succeeded else (result.reads[0] or (None,))[0]
                done += 1
        await self.store.txn([], [Put(marker, INDEX_VERSION.encode())])
        return done

    async def events_page(self, task_id: str, *, after: str = "", max_seq: int = 0,
                          limit: int = 1000, settled: bool = False,
                          ) -> tuple[list[Event], str, int]:
        """One page of a task's events, sought by event key rather than read whole.

        Events are keyed by a time-ordered id; the page reads ``limit`` keys after
        ``after`` (extended so a transaction is never split). A transition decided
        before another can still commit after it, so unless the task was already final
        (``settled``: nothing commits any more), the last :data:`LATE_EVENT_WINDOW`
        seconds of keys up to the page's end are re-read for events committed after
        ``max_seq``, the highest seq returned so far.

        Returns:
            The events sorted by (seq, event id), the key to continue after, and the
            highest seq returned (``max_seq`` when the page is empty).
        """
        prefix = self.keys.events(task_id)
        kvs = await self.store.range(prefix, start_after=prefix + after if after else None,
                                     limit=limit)
        full = len(kvs) == limit
        while full:
            more = await self.store.range(prefix, start_after=kvs[-1].key, limit=64)
            seq = kvs[-1].create_revision
            same: list[KeyValue] = []
            for kv in more:
                if kv.create_revision != seq:
                    break
                same.append(kv)
            kvs += same
            full = len(same) == len(more) == 64
        last = kvs[-1].key[len(prefix):] if kvs else after
        if not settled:
            window = _event_id(self.clock() - LATE_EVENT_WINDOW)[:17]
            seen = {kv.key for kv in kvs}
            start: str | None = prefix + window
            while start is not None:
                late = await self.store.range(prefix, start_after=start, limit=500)
                start = late[-1].key if len(late) == 500 else None
                for kv in late:
                    if kv.key[len(prefix):] > last:
                        start = None
                        break
                    if kv.create_revision > max_seq and kv.key not in seen:
                        kvs.append(kv)
        events = sorted((_event_with_seq(kv) for kv in kvs), key=lambda e: (e.seq, e.event_id))
        return events, last, max([max_seq, *(e.seq for e in events)])


def _event_with_seq(kv: KeyValue) -> Event:
    return replace(codec.decode_event(kv.value), seq=kv.create_revision)


def host_pid_owner(prefix: str = "w") -> str:
    """A worker id that names its host and process, so a resumed embedded run can tell
    whether the previous owner is still alive."""
    return f"{prefix}:{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(3)}"
