"""What the engine answers without deciding anything: records, views, pages, timelines.

The transition shell (:mod:`axengine.engine._shell`) decides and commits; this half of
the :class:`~axengine.engine.Engine` reads. Both share one owner of the store, the key
layout and the blob store, so no other layer needs any of the three: the API asks for
a task, a snapshot, a page of tasks or events, a live feed of a task's events, the
store's revision; the engine knows where those live and how they are encoded.

Listing costs what a page costs, not what the store holds: tasks are read through the
secondary indexes (:mod:`axengine.engine._index`) and timelines are sought by event key.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from axengine import codec
from axengine.blobs import BlobStore
from axengine.dag import Dag
from axengine.engine._index import choose_index, decode_cursor, encode_cursor, index_keys
from axengine.errors import NotFound
from axengine.keys import INDEX_VERSION, StoreKeys
from axengine.limits import parse_json_text
from axengine.lru import Lru
from axengine.records import BlobRef, Event, NodeState, Snapshot, TaskRecord, TaskStatus
from axengine.store import Get, KeyValue, Mod, Op, Put, StateStore

__all__ = [
    "LATE_EVENT_WINDOW",
    "LIST_SCAN_BUDGET",
    "SNAPSHOT_BATCH",
    "SNAPSHOT_BATCH_NODES",
    "Approval",
    "DagInfo",
    "EngineReads",
    "TaskView",
]

#: Index keys one page of a task listing may read (filters no index serves stop here
#: and return a short page with a token).
LIST_SCAN_BUDGET = 5000
#: Node states an approvals page reads (the gates waiting for a decision).
_PAUSED = frozenset({NodeState.PAUSED})
#: Most tasks whose snapshots :meth:`EngineReads.snapshots_each` reads in one transaction,
SNAPSHOT_BATCH = 64
#: and most snapshots (by the tasks' counters; a larger task is read alone).
SNAPSHOT_BATCH_NODES = 1024
#: Seconds within which a transition commits after it was decided (clock skew between
#: API replicas included): event paging of an unfinished task re-reads this much of the
#: timeline for events that committed after a later-stamped one.
LATE_EVENT_WINDOW = 30.0


@dataclass(frozen=True)
class Timeline:
    """A task's record and whole timeline (sorted by seq, event id), read together at
    ``revision``: a watch from ``revision + 1`` on misses nothing and repeats nothing."""

    task: TaskRecord
    events: list[Event]
    revision: int


@dataclass(frozen=True)
class TaskView:
    """A task with its DAG and every node snapshot (outputs resolved from blobs)."""

    task: TaskRecord
    dag: Dag
    snapshots: Mapping[str, Snapshot]
    revision: int


@dataclass(frozen=True)
class DagInfo:
    """A stored DAG version, without its nodes.

    Attributes:
        hash: Content hash (the key it is stored under).
        name: The DAG's name.
        nodes: Number of nodes.
        stored_revision: Store revision that first stored it (orders versions by the
            time they were first submitted; the store keeps no wall-clock time for it).
    """

    hash: str
    name: str
    nodes: int
    stored_revision: int


@dataclass(frozen=True)
class Approval:
    """A human gate waiting for a decision.

    Attributes:
        task: The task record (id, DAG name, submitter).
        node_id: The ``human_gateway`` node.
        description: Its rendered description (the DAG's text when none was rendered).
        input: The input rendered for the approver.
        waiting_since: When the gate paused (UNIX seconds).
        gate_until: When the wait expires (0: no deadline).
    """

    task: TaskRecord
    node_id: str
    description: str
    input: Any
    waiting_since: float
    gate_until: float


def _event_id(now: float, n: int = 0) -> str:
    # Time-ordered, then in the order a transition appended its events (they share one
    # store revision); the random tail keeps concurrent writers apart. It names, it does
    # not guard: the module's generator (seeded from the OS, reseeded in a forked child)
    # costs no system call, where `secrets` makes one per event.
    return f"{int(now * 1_000_000):017d}-{n:04d}-{random.getrandbits(32):08x}"


def _sorted_events(kvs: Collection[KeyValue]) -> list[Event]:
    """Events in commit order: by seq (the creating revision), then event id."""
    return sorted((_event_with_seq(kv) for kv in kvs), key=lambda e: (e.seq, e.event_id))


def _event_with_seq(kv: KeyValue) -> Event:
    # An event's seq is the revision that created its key: the commit order.
    return replace(codec.decode_event(kv.value), seq=kv.create_revision)


class EngineReads:
    """The reading half of :class:`~axengine.engine.Engine` (which sets the attributes
    declared here)."""

    _store: StateStore
    _keys: StoreKeys
    _blobs: BlobStore
    _dags: Lru[str, Dag]
    clock: Callable[[], float]

    # ------------------------------------------------------------------ the store

    @property
    def max_txn_ops(self) -> int | None:
        """Most operations one store transaction may hold (None: no limit), which bounds
        the DAGs the engine accepts (:func:`~axengine.engine.fit_problem`)."""
        return self._store.max_txn_ops

    async def revision(self) -> int:
        """The store's current revision (readiness probes; the start of a watch)."""
        return await self._store.revision()

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
        data = await asyncio.to_thread(self._blobs.get, ref, max_bytes=max_bytes)
        if strict_field is not None:
            return parse_json_text(data, strict_field)
        return json.loads(data)

    # ------------------------------------------------------------------ records

    async def get_dag(self, dag_hash: str) -> Dag:
        """The stored DAG with this content hash (cached: DAGs are immutable).

        Raises:
            NotFound: No DAG is stored under ``dag_hash``.
        """
        dag = self._dags.get(dag_hash)
        if dag is None:
            kv = await self._store.get(self._keys.dag(dag_hash))
            if kv is None:
                raise NotFound(f"DAG {dag_hash} is not stored")
            dag = Dag.from_canonical(json.loads(kv.value))
            self._dags.put(dag_hash, dag)
        return dag

    async def _task_kv(self, task_id: str) -> KeyValue:
        """The stored task record (raises :class:`NotFound`)."""
        kv = await self._store.get(self._keys.task(task_id))
        if kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        return kv

    async def _task_with(self, task_id: str, prefix: str
                         ) -> tuple[TaskRecord, tuple[KeyValue, ...], int]:
        """The task record and the keys under ``prefix``, in one read at one revision
        (returned third).

        Raises:
            NotFound: The task does not exist.
        """
        read = await self._store.txn([], [Get(self._keys.task(task_id)),
                                          Get(prefix, prefix=True)])
        found, kvs = read.reads
        if not found:
            raise NotFound(f"task {task_id!r} does not exist")
        return codec.decode_task(found[0].value), kvs, read.revision

    async def _load_task(self, task_id: str) -> tuple[TaskRecord, int]:
        kv = await self._task_kv(task_id)
        return codec.decode_task(kv.value), kv.mod_revision

    async def task_record(self, task_id: str) -> TaskRecord:
        """The task record alone (status and counters): one read, whatever the DAG size.

        Raises:
            NotFound: The task does not exist.
        """
        return (await self._load_task(task_id))[0]

    async def task_for_idempotency_key(self, principal: str, key: str) -> str | None:
        """The id of the task ``principal`` submitted with idempotency key ``key``, or
        None (keys are scoped to their principal)."""
        kv = await self._store.get(self._keys.idempotency(principal, key))
        return None if kv is None else kv.value.decode()

    async def snapshot(self, task_id: str, node_id: str) -> Snapshot | None:
        """One node's snapshot as stored (blob-held input and output not resolved), or
        None when the task or the node does not exist."""
        kv = await self._store.get(self._keys.snapshot(task_id, node_id))
        return None if kv is None else codec.decode_snapshot(kv.value)

    async def snapshots(self, task_id: str, *,
                        states: Container[NodeState] | None = None) -> list[Snapshot]:
        """Every node snapshot of a task as stored (blobs not resolved), by node id;
        with ``states``, only the nodes in one of them (the others are not decoded)."""
        found = (codec.decode_snapshot_in(kv.value, states)
                 for kv in await self._store.range(self._keys.snapshots(task_id)))
        return [snap for snap in found if snap is not None]

    async def snapshots_each(self, tasks: Sequence[TaskRecord], *,
                             states: Container[NodeState] | None = None,
                             ) -> AsyncIterator[tuple[TaskRecord, list[Snapshot]]]:
        """:meth:`snapshots` of each of ``tasks``, in order, read a batch of tasks per
        read-only transaction instead of one read per task: a reconciler pass over
        1,000 unfinished tasks makes 16 round trips, not 1,000. A batch holds at most
        :data:`SNAPSHOT_BATCH` tasks (fewer when the store's ``max_txn_ops`` is lower)
        and :data:`SNAPSHOT_BATCH_NODES` snapshots by the tasks' counters (a larger task
        is read alone), so a batch of tasks with wide maps stays small. A batch is read
        when the caller reaches it, not before."""
        limit = self._store.max_txn_ops
        most = min(SNAPSHOT_BATCH, limit) if limit else SNAPSHOT_BATCH
        start = 0
        while start < len(tasks):
            end, nodes = start, 0
            while end < len(tasks) and end - start < most:
                nodes += sum(tasks[end].counts.values())
                if end > start and nodes > SNAPSHOT_BATCH_NODES:
                    break
                end += 1
            batch = tasks[start:end]
            result = await self._store.txn(
                [], [Get(self._keys.snapshots(t.task_id), prefix=True) for t in batch])
            for task, kvs in zip(batch, result.reads, strict=True):
                found = (codec.decode_snapshot_in(kv.value, states) for kv in kvs)
                yield task, [snap for snap in found if snap is not None]
            start = end

    async def get_task(self, task_id: str, *, resolve_blobs: bool = True,
                       states: Container[NodeState] | None = None,
                       inputs: bool = True) -> TaskView:
        """The task, its DAG and every node snapshot, in DAG order; with ``states``, only
        the nodes in one of them (the others are read, not decoded: a caller watching
        the live nodes of a task does not pay for every finished node's output).
        Without ``inputs``, the nodes' rendered inputs are left out (``input`` None): a
        run's result reads outputs only.

        Raises:
            NotFound: The task does not exist.
        """
        task, kvs, _ = await self._task_with(task_id, self._keys.snapshots(task_id))
        dag = await self.get_dag(task.dag_hash)
        snaps: dict[str, Snapshot] = {}
        revision = 0
        for kv in kvs:
            revision = max(revision, kv.mod_revision)
            snap = codec.decode_snapshot_in(kv.value, states, inputs=inputs)
            if snap is None:
                continue
            if resolve_blobs and snap.output_ref is not None:
                snap = replace(snap, output=await self.blob_json(snap.output_ref))
            snaps[snap.node_id] = snap
        if resolve_blobs and task.input_ref is not None:
            task = replace(task, input=await self.blob_json(task.input_ref))
        # A map's items and a loop's kept visits follow their node.
        ordered = {nid: snaps[nid] for nid in dag.in_order(snaps)}
        return TaskView(task=task, dag=dag, snapshots=ordered, revision=revision)

    # ------------------------------------------------------------------ listings

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
        index = choose_index(self._keys, statuses=wanted, dag_name=dag_name, labels=labels)
        after = decode_cursor(index, page_token) if page_token else None
        out: list[TaskRecord] = []
        scanned = 0
        batch = limit
        while len(out) < limit and scanned < scan_budget:
            entries = await self._store.range(index, start_after=after,
                                              limit=min(batch, scan_budget - scanned))
            scanned += len(entries)
            found = await self._store.get_many([self._keys.task(kv.value.decode())
                                                for kv in entries])
            for entry in entries:
                after = entry.key
                kv = found.get(self._keys.task(entry.value.decode()))
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

    async def dag_page(self, *, limit: int = 100, after: str = "",
                       ) -> tuple[list[DagInfo], str | None]:
        """One page of stored DAG versions, by hash, after the hash ``after``; and the
        hash to pass as ``after`` for the next page (None: no more). Reads ``limit``
        keys whatever the store holds."""
        prefix = self._keys.dag("")
        kvs = await self._store.range(prefix, start_after=prefix + after if after else None,
                                      limit=limit)
        out = []
        for kv in kvs:
            data = json.loads(kv.value)
            out.append(DagInfo(hash=kv.key[len(prefix):], name=str(data.get("name", "")),
                               nodes=len(data.get("nodes") or ()),
                               stored_revision=kv.create_revision))
        return out, (out[-1].hash if len(kvs) >= limit and out else None)

    async def approvals_page(self, *, limit: int = 100, page_token: str = "",
                             ) -> tuple[list[Approval], str | None]:
        """Gates waiting for a decision, in the tasks of one page of PAUSED tasks
        (newest first, through the status index: finished tasks are never read; their
        snapshots a batch of tasks per read, :meth:`snapshots_each`); and the token of
        the next page of tasks (None: no more). ``limit`` counts tasks."""
        tasks, token = await self.task_page(statuses=(TaskStatus.PAUSED,), limit=limit,
                                            page_token=page_token)
        out: list[Approval] = []
        async for task, paused in self.snapshots_each(tasks, states=_PAUSED):
            dag = await self.get_dag(task.dag_hash)
            for snap in paused:
                node = dag.nodes.get(snap.node_id)
                if node is None or node.type != "human_gateway" or snap.decision:
                    continue
                rendered = snap.input
                if rendered is None and snap.input_ref is not None:
                    rendered = await self.blob_json(snap.input_ref)
                params = rendered if isinstance(rendered, dict) else {}
                out.append(Approval(
                    task=task, node_id=snap.node_id,
                    description=str(params.get("description") or node.description or ""),
                    input=params.get("input"), waiting_since=snap.paused_at,
                    gate_until=snap.gate_until))
        return out, token

    async def count_active(self, principal: str) -> int:
        """Unfinished tasks ``principal`` submitted, counted on the active-by-principal
        index (a count-only read: no key or value comes back, however many there are)."""
        return await self._store.count(self._keys.active_by(principal))

    async def task_counts(self) -> dict[TaskStatus, int]:
        """Tasks per status, counted on the status index (count-only reads: no record
        is fetched, whatever the store holds)."""
        counts = await asyncio.gather(*(self._store.count(self._keys.by_status(s.value))
                                        for s in TaskStatus))
        return dict(zip(TaskStatus, counts, strict=True))

    async def unfinished_tasks(self) -> list[TaskRecord]:
        """Every task not in a final status, from the status index (finished tasks are
        never read)."""
        out: list[TaskRecord] = []
        for status in (TaskStatus.RUNNING, TaskStatus.PAUSED):
            index = self._keys.by_status(status.value)
            after: str | None = None
            while True:
                entries = await self._store.range(index, start_after=after, limit=1000)
                if not entries:
                    break
                after = entries[-1].key
                found = await self._store.get_many([self._keys.task(kv.value.decode())
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
        marker = self._keys.index_version()
        kv = await self._store.get(marker)
        if kv is not None and kv.value.decode() == INDEX_VERSION:
            return 0
        prefix = self._keys.tasks()
        after: str | None = None
        done = 0
        while True:
            kvs = await self._store.range(prefix, start_after=after, limit=500)
            if not kvs:
                break
            after = kvs[-1].key
            for task_kv in kvs:
                current: KeyValue | None = task_kv
                while current is not None:
                    task = codec.decode_task(current.value)
                    ops: list[Op] = [Put(k, task.task_id.encode())
                                     for k in sorted(index_keys(self._keys, task))]
                    result = await self._store.txn(
                        [Mod(current.key) == current.mod_revision], ops, [Get(current.key)])
                    current = None if result.succeeded else (result.reads[0] or (None,))[0]
                done += 1
        await self._store.txn([], [Put(marker, INDEX_VERSION.encode())])
        return done

    # ------------------------------------------------------------------ timelines

    async def events(self, task_id: str) -> list[Event]:
        """A task's whole timeline, sorted by (seq, event id)."""
        kvs = await self._store.range(self._keys.events(task_id))
        return _sorted_events(kvs)

    async def timeline(self, task_id: str) -> Timeline:
        """The task record and its whole timeline (as :meth:`events`) with the store
        revision they were read at, in one read.

        Raises:
            NotFound: The task does not exist.
        """
        task, kvs, revision = await self._task_with(task_id, self._keys.events(task_id))
        return Timeline(task, _sorted_events(kvs), revision)

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
        prefix = self._keys.events(task_id)
        kvs = await self._store.range(prefix, start_after=prefix + after if after else None,
                                      limit=limit)
        full = len(kvs) == limit
        while full:
            more = await self._store.range(prefix, start_after=kvs[-1].key, limit=64)
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
                late = await self._store.range(prefix, start_after=start, limit=500)
                start = late[-1].key if len(late) == 500 else None
                for kv in late:
                    if kv.key[len(prefix):] > last:
                        start = None
                        break
                    if kv.create_revision > max_seq and kv.key not in seen:
                        kvs.append(kv)
        events = sorted((_event_with_seq(kv) for kv in kvs), key=lambda e: (e.seq, e.event_id))
        return events, last, max([max_seq, *(e.seq for e in events)])

    async def watch_events(self, task_id: str, *, start_revision: int) -> AsyncIterator[Event]:
        """A task's events as they commit, from ``start_revision`` on (each with its
        seq), for as long as the caller iterates.

        Replay what is already stored with :meth:`timeline` and start here right after
        the revision it was read at: nothing is missed, nothing repeated. On etcd a
        watch that starts at a past revision is served from its history only on etcd's
        next sync, up to 100 ms later; ``start_revision=0`` (from now on) is served at
        once. To follow tasks in a long-running process, prefer
        :meth:`~axengine.engine.Engine.subscribe_events`: one watch serves them all.

        Raises:
            RevisionCompacted: ``start_revision`` is older than the store keeps.
        """
        async for change in self._store.watch(self._keys.events(task_id),
                                              start_revision=start_revision):
            if change.kind == "put":
                yield _event_with_seq(change.kv)
