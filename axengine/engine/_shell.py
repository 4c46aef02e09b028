"""The engine shell: load → pure rule → one transaction → enqueue → notify.

Every state change goes through :meth:`Engine._apply`: it reads the task record, lets
the rule ask for exactly the snapshots and blobs it needs (``Need``), writes the plan as
one ``txn`` that compares the mod_revision of every snapshot written (and of the task
record when node categories change), and only after the commit enqueues the nodes the
plan made ready. A lost compare means someone else moved first: reload and re-decide.
A crash between the commit and the enqueue loses nothing: the reconciler re-enqueues
WAITING nodes that are missing from the queue.

The side-effect outbox follows the same rule with a smaller write set: the pure rules of
:mod:`~axengine.engine._effects` decide on the node's snapshot and the record, and the
record is written in one transaction that compares both, so the fence that was checked
is the fence under which the record changes. Reads (views, pages, timelines) live in
:mod:`~axengine.engine._reads`; this module only decides and commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import itertools
import json
import math
import os
import random
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from axengine import codec, faults
from axengine.activity import Activity
from axengine.blobs import DEFAULT_THRESHOLD, DirBlobStore
from axengine.config import DEFAULT_PREFIX
from axengine.dag import Dag, Node, base_id, check_task_input
from axengine.engine import _effects as effects
from axengine.engine import _rules as rules
from axengine.engine._budget import require_fit
from axengine.engine._cache import RecordCache
from axengine.engine._expand import parent_of
from axengine.engine._hub import EventHub, Subscription
from axengine.engine._index import index_writes
from axengine.engine._ramp import decode_ramp, dependency_of, encode_ramp
from axengine.engine._reads import EngineReads, TaskView, _event_id
from axengine.engine._restore import restored
from axengine.engine._runs import ClaimResult, Completed, claimed
from axengine.engine._view import Need, View
from axengine.errors import Conflict, InputError, NotFound, StoreError
from axengine.keys import StoreKeys
from axengine.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_COMMENT,
    MAX_IDEMPOTENCY_KEY,
    canonical_json,
    canonical_list,
    canonical_parts,
    check_json_value,
    check_labels,
)
from axengine.lru import DAG_CACHE_ENTRIES, Lru
from axengine.owners import LOCAL_PRINCIPAL
from axengine.queue import WorkItem, WorkQueue
from axengine.records import (
    FINAL_STATES,
    NO_EDITS,
    Event,
    Snapshot,
    TaskRecord,
    TaskStatus,
    replace,
)
from axengine.store import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Mod,
    Op,
    Put,
    StateStore,
    TxnResult,
    Version,
)
from executors.contract import Outcome

__all__ = ["Engine", "EngineConfig", "SubmitResult", "TaskView"]

#: How many times a transition is re-decided after losing a compare before giving up.
MAX_CAS_RETRIES = 64
#: Most transitions of one task decided and committed together (:meth:`Engine._apply_group`).
MAX_GROUP = 32
#: Task inputs, and nodes' rendered inputs, whose JSON text the engine keeps (each at
#: most the blob threshold inline).
INPUT_TEXT_ENTRIES = 128
#: What decisions asked for beyond what they were given, remembered by DAG, kind and
#: node (see :class:`_Prefetch`); one that falls out is asked for again once.
ASKED_ENTRIES = 4096

Listener = Callable[[TaskRecord, Sequence[Event]], None]
#: An outbox rule bound to its arguments: (record, holder snapshot, now) → answer, write.
_OutboxRule = Callable[[codec.EffectRecord | None, Snapshot | None, float],
                       tuple[str, codec.EffectRecord | None]]


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


@dataclass
class _Txn:
    """One transaction being made: compares, writes, and what the engine's cache learns
    (``learned``: key, record, size) or forgets when it commits."""

    compares: list[Compare]
    ops: list[Op]
    learned: list[tuple[str, Any, int]]
    forgotten: list[str]

    def join(self, other: _Txn, max_ops: int | None) -> _Txn | None:
        """Both in one transaction, or None when they write a key in common (a
        transaction writes a key once) or would exceed the store's ``max_ops`` compares
        or writes (the budget of a DAG counts its own transitions only)."""
        mine = {op.key for op in self.ops}
        if any(op.key in mine for op in other.ops):
            return None
        joined = _Txn(self.compares + other.compares, self.ops + other.ops,
                      self.learned + other.learned, self.forgotten + other.forgotten)
        if max_ops is not None and max(len(joined.ops), len(joined.compares)) > max_ops:
            return None
        return joined


@dataclass(frozen=True)
class _Prefetch:
    """What a decision will most likely ask for, loaded with what it reads first: one
    read rather than one :class:`Need` (and one more run of the rule) at a time.

    ``nodes(dag)`` names what the caller knows it reads (a completion: the targets its
    success settles). The engine adds what decisions of the same ``kind`` on the same
    node of the same DAG asked for beyond that before (:meth:`Engine._decide_on`): a
    DAG's nodes, and mostly its branches, are the same from task to task, so a
    completion that evaluates the condition after it inline, skips the branches not
    taken and counts them off at their join asks for those nodes once per DAG, not
    once per task."""

    kind: str
    node_id: str
    nodes: Callable[[Dag], tuple[str, ...]]


@dataclass(eq=False)
class _Waiting:
    """A transition waiting for its task's turn, and the answer it gets (its plan and the
    view it was decided on)."""

    rule: Callable[[View], rules.Plan]
    preload: tuple[str, ...]
    prefetch: _Prefetch | None
    answer: asyncio.Future[tuple[rules.Plan, View]]


def _writes_nothing(plan: rules.Plan) -> bool:
    """Whether ``plan`` changes no record (its answer is given on fresh reads only)."""
    return not plan.writes and plan.task is None and not plan.ramps


def _advance(work: View, plan: rules.Plan,
             before: dict[str, tuple[Snapshot | None, int]],
             task: TaskRecord | None) -> None:
    """Make ``work`` hold what ``plan`` writes, as if committed, for the next decision of
    a group; ``before`` keeps what the group found of each node it writes first, and
    ``task`` is the task record the plan leaves (None: unchanged)."""
    for nid, snap in plan.writes.items():
        old = work.snaps.get(nid)
        if nid not in before:
            before[nid] = (old if work.revs.get(nid) else None, work.revs.get(nid, 0))
        work.snaps[nid] = snap
        # Held as stored from now on (a nonzero revision), so the counters of a later
        # decision count it as existing; the group compares the revision it found.
        work.revs[nid] = work.revs.get(nid) or -1
        if old is None or old.output_ref != snap.output_ref:
            work.outputs.pop(nid, None)
        if old is None or old.input_ref != snap.input_ref:
            work.inputs.pop(nid, None)
    work.ramps.update(plan.ramps)
    work.run_durations.update(plan.durations)
    if task is not None:
        work.task = task


def _before_group(work: View, before: Mapping[str, tuple[Snapshot | None, int]],
                  found: View) -> View:
    """The view a group's joined plan is prepared on: the state as the group found it
    (``found``'s task record, each written node as it was), with everything its
    decisions loaded meanwhile."""
    base = copy.copy(work)
    base.snaps, base.revs = dict(work.snaps), dict(work.revs)
    for nid, (snap, rev) in before.items():
        base.revs[nid] = rev
        if snap is None:
            base.snaps.pop(nid, None)
        else:
            base.snaps[nid] = snap
    base.task, base.task_rev = found.task, found.task_rev
    return base


def _merged(plans: Sequence[rules.Plan]) -> rules.Plan:
    """One plan doing what ``plans`` do in order: the last write of each record wins,
    events and queue pushes add up. The events are numbered again, so that within the
    transaction they sort in the order they were decided (each plan numbered its own
    from 0, and plans decided in the same microsecond would interleave)."""
    merged = rules.Plan(result="group")
    first = next((e.at for plan in plans for e in plan.events), 0.0)
    for plan in plans:
        merged.writes.update(plan.writes)
        for event in plan.events:
            merged.events.append(replace(event,
                                         event_id=_event_id(first, len(merged.events))))
        merged.enqueue.extend(plan.enqueue)
        merged.acks.extend(plan.acks)
        merged.ramps.update(plan.ramps)
        merged.durations.update(plan.durations)
        merged.encoded.update(plan.encoded)  # (outputs hashed in the decisions: not again)
        if plan.task is not None:
            merged.task = plan.task
    return merged


@dataclass(frozen=True)
class SubmitResult:
    """A submit's answer: the task, whether this call created it, and the node the
    submit claimed for the calling worker (``claim_for`` of :meth:`Engine.submit`), if any."""

    task_id: str
    created: bool
    next: ClaimResult | None = None


class _Turns:
    """The turns of some tasks, taken on entry and given back on exit (what
    :meth:`Engine._turns` returns; a class, not a generator with an exit stack: it is
    entered once per transition)."""

    __slots__ = ("_engine", "_held", "_ids")

    def __init__(self, engine: Engine, task_ids: list[str]) -> None:
        self._engine = engine
        self._ids = task_ids
        #: The tasks counted as users of their lock, with the lock once it is held.
        self._held: list[tuple[str, asyncio.Lock | None]] = []

    async def __aenter__(self) -> None:
        engine = self._engine
        users, locks = engine._task_users, engine._task_locks
        try:
            for task_id in self._ids:
                lock = locks.get(task_id)
                if lock is None:
                    lock = locks[task_id] = asyncio.Lock()
                users[task_id] = users.get(task_id, 0) + 1
                self._held.append((task_id, None))
                await lock.acquire()
                self._held[-1] = (task_id, lock)
        except BaseException:
            self._give_back()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._give_back()

    def _give_back(self) -> None:
        for task_id, lock in reversed(self._held):
            if lock is not None:
                lock.release()
            self._engine._leave(task_id)
        self._held.clear()


class Engine(EngineReads):
    """Applies the transition rules to a :class:`StateStore` and feeds a
    :class:`WorkQueue`. Stateless apart from caches of immutable DAGs: any number of
    engines may share one store.

    The engine is the only owner of the store's keys, of the records' encoding and of
    the blob store: other layers call its methods (the reads are in
    :class:`~axengine.engine._reads.EngineReads`).

    Args:
        store: The state store.
        queue: Where ready nodes are enqueued.
        blob_dir: Directory of the content-addressed blob store (large payloads).
        prefix: Root of every key the engine writes (``AX_PREFIX``).
        config: Tunables.
        clock: UNIX seconds (tests inject a fake one).
    """

    def __init__(
        self,
        *,
        store: StateStore,
        queue: WorkQueue,
        blob_dir: str | os.PathLike[str],
        prefix: str = DEFAULT_PREFIX,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._keys = StoreKeys(prefix)
        self._blobs = DirBlobStore(Path(blob_dir))
        self.queue = queue
        self.config = config or EngineConfig()
        self.clock = clock
        #: DAGs stored or read lately, by content hash; bounded, since submitters may
        #: send any number of distinct DAGs (a DAG that falls out is read again).
        self._dags: Lru[str, Dag] = Lru(DAG_CACHE_ENTRIES)
        self._listeners: list[Listener] = []
        self._cache = RecordCache()
        #: The canonical JSON of tasks' inputs by task id, each with the input it is
        #: the text of: the task record is written again at most transitions (its
        #: counters), and its input, up to the blob threshold inline, was encoded again
        #: each time. Bounded: a task that falls out has its input encoded once more.
        self._input_texts: Lru[str, tuple[Any, str]] = Lru(INPUT_TEXT_ENTRIES)
        #: The same for nodes' rendered inputs, by (task id, node id), with their
        #: members' texts: a node's snapshot is written again when it is claimed and when
        #: it ends, its input unchanged.
        self._node_inputs: Lru[tuple[str, str], tuple[Any, str, dict[str, str] | None]] = \
            Lru(INPUT_TEXT_ENTRIES)
        #: What decisions asked for beyond what they were given (see :class:`_Prefetch`),
        #: by (DAG hash, kind, node id).
        self._asked: Lru[tuple[str, str, str], Need] = Lru(ASKED_ENTRIES)
        self._hub = EventHub(store, self._keys)
        #: Transitions of one task take turns in this engine (see :meth:`_apply`).
        self._task_locks: dict[str, asyncio.Lock] = {}
        self._task_users: dict[str, int] = {}
        #: Transitions waiting for their task's turn, in arrival order (see :meth:`_apply`).
        self._waiting: dict[str, list[_Waiting]] = {}

    # ------------------------------------------------------------------ plumbing

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(task, events)`` after every committed transition (in-process
        progress display, metrics)."""
        self._listeners.append(listener)

    def subscribe_events(self, task_id: str) -> contextlib.AbstractAsyncContextManager[
            Subscription]:
        """Follow a task's events as they commit, until the context exits: the
        subscription's inbox receives each event (in commit order) or the error that
        ended the feed; it holds every event committed after ``since``, so read the
        timeline after subscribing (see :mod:`axengine.engine._hub`)."""
        return self._hub.subscribe(task_id)

    async def put_dag(self, dag: Dag) -> str:
        """Store a validated DAG under its content hash (idempotent)."""
        if dag.hash not in self._dags:
            key = self._keys.dag(dag.hash)
            await self._store.txn([Version(key) == 0], [Put(key, dag.storage_json())], [])
            self._dags.put(dag.hash, dag)
        return dag.hash

    async def _view(self, task_id: str, *, use_cache: bool) -> View:
        """A view of the task record (from the cache when ``use_cache`` and it is there)."""
        key = self._keys.task(task_id)
        hit = self._cache.get(key) if use_cache else None
        if hit is not None:
            task_rev, task = hit
        else:
            kv = await self._task_kv(task_id)
            task, task_rev = codec.decode_task(kv.value), kv.mod_revision
            self._cache.put(key, task_rev, task, len(kv.value))
        return View(dag=await self.get_dag(task.dag_hash), task=task, task_rev=task_rev,
                    use_cache=use_cache, task_cached=hit is not None)

    async def _fill(self, view: View, need: Need) -> None:
        ramps = set(need.ramps)
        # (A node the view holds already keeps what it holds: a group's decision reads
        # what the decisions before it wrote, not the store.)
        nodes = need.nodes - view.snaps.keys()
        if nodes:
            keys: dict[str, str] = {}
            for nid in sorted(nodes):
                key = self._keys.snapshot(view.task.task_id, nid)
                hit = self._cache.get(key) if view.use_cache else None
                if hit is None:
                    keys[key] = nid
                else:
                    view.revs[nid], view.snaps[nid] = hit
                    view.cached.add(nid)
            # The ramps of these nodes' dependencies come in the same read: a claim or
            # an outcome asks for them next, and one round trip is cheaper than two.
            deps = {d for n in nodes if (d := dependency_of(view.dag.node(n)))
                    and d not in view.ramps}
            ramp_keys = self._cached_ramps(view, deps - ramps)
            found = (await self._store.get_many([*keys, *ramp_keys]) if keys or ramp_keys
                     else {})
            for key, nid in keys.items():
                kv = found.get(key)
                if kv is None and nid != base_id(nid):
                    view.absent(nid)  # an instance not made yet
                    continue
                if kv is None:
                    raise StoreError(f"snapshot {key} is missing")
                view.snaps[nid] = snap = codec.decode_snapshot(kv.value)
                view.revs[nid] = kv.mod_revision
                self._cache.put(key, kv.mod_revision, snap, len(kv.value))
            for key, dependency in ramp_keys.items():
                self._loaded_ramp(view, dependency, key, found.get(key))
        for nid in sorted(need.outputs):
            ref = view.snaps[nid].output_ref
            assert ref is not None
            view.outputs[nid] = await self.blob_json(ref)
        for nid in sorted(need.inputs):
            ref = view.snaps[nid].input_ref
            assert ref is not None
            view.inputs[nid] = await self.blob_json(ref)
        if need.task_input:
            assert view.task.input_ref is not None
            view.task_input = await self.blob_json(view.task.input_ref)
            view.task_input_loaded = True
        if need.durations:
            keys = {self._keys.stats(view.task.dag_name, n): n for n in sorted(need.durations)}
            found = await self._store.get_many(list(keys))
            for key, nid in keys.items():
                kv = found.get(key)
                view.run_durations[nid] = [] if kv is None else _durations(kv.value)
        for lane in sorted(need.depths):
            view.queue_depths[lane] = await self.queue.depth(lane)
        if ramps:
            keys = self._cached_ramps(view, ramps)
            found = await self._store.get_many(list(keys)) if keys else {}
            for key, dependency in keys.items():
                self._loaded_ramp(view, dependency, key, found.get(key))

    def _cached_ramps(self, view: View, dependencies: Iterable[str]) -> dict[str, str]:
        """Fill ``view`` with the ramps of ``dependencies`` the cache holds (a ramp's
        absence included); return the keys left to read, with their dependency."""
        missing: dict[str, str] = {}
        for dependency in sorted(dependencies):
            key = self._keys.ramp(dependency)
            hit = self._cache.get(key) if view.use_cache else None
            if hit is None:
                missing[key] = dependency
            else:
                view.ramp_revs[dependency], view.ramps[dependency] = hit
                view.cached_ramps.add(dependency)
        return missing

    def _loaded_ramp(self, view: View, dependency: str, key: str,
                     kv: KeyValue | None) -> None:
        view.ramps[dependency] = ramp = None if kv is None else decode_ramp(kv.value)
        view.ramp_revs[dependency] = rev = 0 if kv is None else kv.mod_revision
        self._cache.put(key, rev, ramp, 0 if kv is None else len(kv.value))

    @staticmethod
    def _decide(view: View, rule: Callable[[View], rules.Plan]) -> rules.Plan | Need:
        try:
            return rule(view)
        except Need as need:
            return need

    async def _apply(
        self, task_id: str, rule: Callable[[View], rules.Plan], *,
        preload: Iterable[str] = (), prefetch: _Prefetch | None = None,
    ) -> tuple[rules.Plan, View]:
        """Decide and commit one transition, re-deciding on a lost compare.

        ``preload``: nodes the rule reads first (checked to exist); ``prefetch``: what
        the rule will most likely ask for next, loaded with them in one read rather
        than one :class:`Need` at a time.

        The transitions this engine applies to one task take turns: siblings of a
        fan-out completing at once would otherwise all write the task record (and their
        join) at once, and all but one lose the compare, back off and decide again.
        Taking turns, each decides on what the one before it committed (from the
        cache) and commits the first time. The compares still guard every write:
        other engines (other processes) are serialised by the store, as before.

        Transitions that queued up for the turn while another committed are decided
        one after another and committed together, in one transaction
        (:meth:`_apply_group`): a fan-out's siblings cost one transaction per group,
        not one each."""
        entry = _Waiting(rule, tuple(preload), prefetch,
                         asyncio.get_running_loop().create_future())
        waiting = self._waiting.setdefault(task_id, [])
        waiting.append(entry)
        try:
            async with self._turns((task_id,)):
                if entry.answer.done():  # decided in another caller's group
                    return entry.answer.result()
                if self._has_siblings(task_id):
                    # Let the callers that are ready to run ask for this turn too (an
                    # embedded store's commit suspends for one turn of the loop at
                    # most, too short for them to wait for it); a task running one
                    # node at a time (a chain) has none.
                    await asyncio.sleep(0)
                group = [e for e in self._waiting.pop(task_id, []) if not e.answer.done()]
                if entry in group[MAX_GROUP:]:
                    group.remove(entry)
                    group.insert(0, entry)
                if len(group) > MAX_GROUP:  # the rest take the next turn, together
                    self._waiting.setdefault(task_id, [])[:0] = group[MAX_GROUP:]
                    group = group[:MAX_GROUP]
                if len(group) <= 1:
                    return await self._apply_once(task_id, rule, preload=entry.preload,
                                                  prefetch=prefetch)
                try:
                    await self._apply_group(task_id, group)
                finally:
                    # Left undecided (this caller was cancelled half-way): the next
                    # caller to take the turn decides them.
                    left = [e for e in group if e is not entry and not e.answer.done()]
                    if left:
                        self._waiting.setdefault(task_id, [])[:0] = left
                return entry.answer.result()
        finally:
            if not entry.answer.done():
                entry.answer.cancel()  # (cancelled while it waited: no one decides it)
            queued = self._waiting.get(task_id)
            if queued is not None and entry in queued:
                queued.remove(entry)
            if queued is not None and not queued:
                del self._waiting[task_id]

    async def _apply_group(self, task_id: str, group: Sequence[_Waiting]) -> None:
        """Decide the transitions of ``group`` in order, each on the state the ones
        before it leave, and commit all that write something in one transaction under
        the compares of what they read before the group (one plan, :func:`_merged`).
        Answers every entry. A decision that writes nothing is taken again alone (on
        fresh reads, as :meth:`_apply_once` does); if the joined transaction does not
        fit the store's limits or loses a compare, each is applied alone, in order."""
        view = await self._view(task_id, use_cache=True)
        work = copy.copy(view)
        work.snaps, work.revs = dict(view.snaps), dict(view.revs)
        work.outputs, work.inputs = dict(view.outputs), dict(view.inputs)
        work.ramps, work.run_durations = dict(view.ramps), dict(view.run_durations)
        before: dict[str, tuple[Snapshot | None, int]] = {}  # as the group found them
        decided: list[tuple[_Waiting, rules.Plan, View]] = []
        alone: list[_Waiting] = []
        for entry in group:
            if entry.answer.done():
                continue
            try:
                plan = await self._decide_on(work, entry.rule, entry.preload, entry.prefetch)
            except Exception:
                alone.append(entry)  # decided again alone, where it raises for its caller
                continue
            if _writes_nothing(plan):
                alone.append(entry)
                continue
            decided.append((entry, plan, copy.copy(work)))
            _advance(work, plan, before, self._task_writes(work, plan, self.clock()))
        if len(decided) == 1:
            alone.insert(0, decided.pop()[0])
        if decided:
            plans = [plan for _, plan, _ in decided]
            merged = _merged(plans)
            base = _before_group(work, before, view)
            written = dict(merged.writes)
            txn = await self._prepare(base, merged)
            limit = self._store.max_txn_ops
            fits = limit is None or max(len(txn.ops), len(txn.compares)) <= limit
            if fits and (await self._write(txn)).succeeded:
                for plan in plans:  # each caller sees its snapshots as stored
                    for nid, snap in plan.writes.items():
                        if written.get(nid) is snap:
                            plan.writes[nid] = merged.writes[nid]
                try:
                    await self._after_commit((base, merged))
                finally:  # committed: each caller is told so, even if a push failed
                    for entry, plan, seen in decided:
                        if not entry.answer.done():
                            entry.answer.set_result((plan, seen))
            else:
                self._forget(base, merged)
                alone[:0] = [entry for entry, _, _ in decided]
        for entry in sorted(alone, key=group.index):
            if entry.answer.done():
                continue
            try:
                answer = await self._apply_once(task_id, entry.rule, preload=entry.preload,
                                                prefetch=entry.prefetch)
            except Exception as exc:
                if not entry.answer.done():
                    entry.answer.set_exception(exc)
            else:
                if not entry.answer.done():
                    entry.answer.set_result(answer)

    def _has_siblings(self, task_id: str) -> bool:
        """Whether the task, as this engine last saw it, has more than one node waiting
        or running (whose transitions may come at once)."""
        hit = self._cache.get(self._keys.task(task_id))
        return hit is not None and hit[1].counts.get("ACTIVE", 0) > 1

    def _turns(self, task_ids: Iterable[str]) -> _Turns:
        """Take the turn of each task of ``task_ids`` (see :meth:`_apply`), in sorted
        order so that two callers wanting the same two tasks cannot wait on each
        other."""
        return _Turns(self, sorted(set(task_ids)))

    def _leave(self, task_id: str) -> None:
        users = self._task_users
        users[task_id] -= 1
        if not users[task_id]:
            del users[task_id], self._task_locks[task_id]

    async def _apply_once(
        self, task_id: str, rule: Callable[[View], rules.Plan], *,
        preload: Iterable[str] = (), prefetch: _Prefetch | None = None,
    ) -> tuple[rules.Plan, View]:
        preload = tuple(preload)
        use_cache, lost = True, 0
        for _ in range(MAX_CAS_RETRIES + 1):
            if lost:
                # Lost a compare: siblings of a join all write the task record; jittered
                # backoff keeps a crowd of them from colliding again in lockstep.
                await asyncio.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** lost)))
            plan, view = await self._plan(task_id, rule, use_cache=use_cache,
                                          preload=preload, prefetch=prefetch)
            # (Recorded durations never come alone: they ride with a node's success.)
            if _writes_nothing(plan):
                if view.from_cache:
                    # Nothing written means nothing compared: the answer (stale, not
                    # claimable...) is only given on fresh reads.
                    use_cache = False
                    continue
                return plan, view
            if (await self._commit(view, plan)).succeeded:
                await self._after_commit((view, plan))
                return plan, view
            self._forget(view, plan)
            use_cache, lost = False, lost + 1
            if lost >= MAX_CAS_RETRIES:
                break
        raise StoreError(f"task {task_id}: gave up after {MAX_CAS_RETRIES} conflicting writes")

    async def _plan(
        self, task_id: str, rule: Callable[[View], rules.Plan], *, use_cache: bool,
        preload: Iterable[str] = (), prefetch: _Prefetch | None = None,
    ) -> tuple[rules.Plan, View]:
        """Decide one transition on a view of the task (see :meth:`_apply`)."""
        view = await self._view(task_id, use_cache=use_cache)
        return await self._decide_on(view, rule, tuple(preload), prefetch), view

    async def _decide_on(self, view: View, rule: Callable[[View], rules.Plan],
                         preload: tuple[str, ...],
                         prefetch: _Prefetch | None) -> rules.Plan:
        """Decide on ``view``, loading into it what the rule needs."""
        for nid in preload:
            # A caller naming a node the DAG does not have is a bad request, not a
            # missing snapshot in the store.
            if view.dag.get_node(nid) is None:
                raise NotFound(f"task {view.task.task_id!r} has no node {nid!r}")
        key: tuple[str, str, str] | None = None
        if prefetch is not None:
            key = (view.dag.hash, prefetch.kind, prefetch.node_id)
            ahead = (*preload, *prefetch.nodes(view.dag))
            asked = self._asked.get(key)
            await self._fill(view, Need(nodes=ahead) if asked is None else Need(
                nodes=(*ahead, *asked.nodes), ramps=asked.ramps,
                durations=asked.durations, depths=asked.depths))
        elif preload:
            await self._fill(view, Need(nodes=preload))
        needs: list[Need] = []
        while isinstance(decided := self._decide(view, rule), Need):
            needs.append(decided)
            await self._fill(view, decided)
        if needs and key is not None:
            self._remember(key, needs, nodes=True)
        return decided

    def _remember(self, key: tuple[str, str, str], needs: list[Need], *,
                  nodes: bool) -> None:
        """Add to what decisions of ``key`` (DAG hash, kind, node) asked for: the nodes
        (unless ``nodes`` is false), ramps, run durations and queue depths of ``needs``.
        Blob contents are not kept: which values are blobs differs from task to task."""
        before = self._asked.get(key)
        kept = [*needs] if before is None else [before, *needs]
        self._asked.put(key, Need(
            nodes=frozenset().union(*(n.nodes for n in kept)) if nodes else (),
            ramps=frozenset().union(*(n.ramps for n in kept)),
            durations=frozenset().union(*(n.durations for n in kept)),
            depths=frozenset().union(*(n.depths for n in kept))))

    def _forget(self, view: View, plan: rules.Plan) -> None:
        """Drop from the cache what a transaction that lost its compares read or meant
        to write: the next decision reads it fresh."""
        task_id = view.task.task_id
        self._cache.drop([self._keys.task(task_id), *(
            self._keys.snapshot(task_id, n) for n in {*view.snaps, *plan.writes}), *(
            self._keys.ramp(d) for d in {*view.ramps, *plan.ramps})])

    def _input_text(self, task: TaskRecord) -> str:
        """The canonical JSON of ``task.input`` ("" for none): from :attr:`_input_texts`
        when it holds this very input, else encoded (and kept)."""
        if task.input is None:
            return ""
        known = self._input_texts.get(task.task_id)
        if known is not None and known[0] is task.input:
            return known[1]
        text = canonical_json(task.input, "task input")
        self._input_texts.put(task.task_id, (task.input, text))
        return text

    async def _externalize(
        self, snap: Snapshot, encoded: Mapping[int, tuple[Any, str, dict[str, str] | None]],
    ) -> tuple[Snapshot, bytes]:
        """The snapshot as stored — an input or output larger than the blob threshold
        moved to the blob store — and its encoding, which reuses the JSON text made
        here to measure them (or, from ``encoded``, when its hash was taken:
        :attr:`rules.Plan.encoded`) and the input's members' texts."""
        threshold = self.config.blob_threshold
        output_json = input_json = ""
        members: dict[str, str] | None = None
        if snap.output is not None and snap.output_ref is None:
            text = canonical_parts(snap.output, known=encoded)[0]
            data = text.encode()
            if len(data) > threshold:
                ref = await asyncio.to_thread(self._blobs.put, data)  # file I/O: off the loop
                snap = replace(snap, output=None, output_ref=ref)
            else:
                output_json = text
        if snap.input is not None and snap.input_ref is None:
            node = (snap.task_id, snap.node_id)
            known = self._node_inputs.get(node)
            if known is not None and known[0] is snap.input:
                text, members = known[1], known[2]
            else:
                text, members = canonical_parts(snap.input, known=encoded)
            data = text.encode()
            if len(data) > threshold:
                ref = await asyncio.to_thread(self._blobs.put, data)
                snap, members = replace(snap, input=None, input_ref=ref), None
            else:
                input_json = text
                if snap.state not in FINAL_STATES and (known is None
                                                       or known[0] is not snap.input):
                    self._node_inputs.put(node, (snap.input, text, members))
        if snap.state in FINAL_STATES:
            # Written for the last time, as a rule: kept, a large input would stay alive
            # for the garbage collector to scan at every full collection.
            self._node_inputs.discard((snap.task_id, snap.node_id))
        return snap, codec.encode_snapshot(snap, input_json=input_json,
                                           output_json=output_json, input_members=members)

    def _task_writes(self, view: View, plan: rules.Plan, now: float) -> TaskRecord | None:
        """Apply category changes of the written snapshots to the task counters; return
        the new task record, or None when the task record does not change."""
        counts = dict(view.task.counts)
        changed = plan.task is not None
        for nid, new in plan.writes.items():
            node = view.dag.node(nid)
            old = view.snaps.get(nid) if view.revs.get(nid) else None
            before = rules.category(node, old) if old is not None else None
            after = rules.category(node, new)
            if before != after:
                changed = True
                if before is not None:
                    counts[before] = counts.get(before, 0) - 1
                if after is not None:
                    counts[after] = counts.get(after, 0) + 1
        if not changed:
            return None
        base = plan.task or view.task
        counts = {k: v for k, v in sorted(counts.items()) if v}
        status = rules.derive_status(counts, base.status is TaskStatus.CANCELLED)
        finished = base.finished_at
        if status.final and not view.task.status.final:
            finished = now
        return rules.task_clock(view.task, replace(
            base, counts=counts, status=status, updated_at=now, finished_at=finished), now)

    async def _commit(self, view: View, plan: rules.Plan, *,
                      extra_compares: Sequence[Compare] = (), extra_ops: Sequence[Op] = (),
                      failure: Sequence[Op] = ()) -> TxnResult:
        """Write ``plan`` as one transaction (plus ``extra_*``, e.g. an idempotency key)."""
        txn = await self._prepare(view, plan)
        txn.compares[:0] = extra_compares
        txn.ops[:0] = extra_ops
        return await self._write(txn, failure)

    async def _write(self, txn: _Txn, failure: Sequence[Op] = ()) -> TxnResult:
        """Commit what :meth:`_prepare` made (one plan's, or several plans' joined)."""
        faults.point("before-commit")
        result = await self._store.txn(txn.compares, txn.ops, failure)
        if result.succeeded:
            # Last written, first in: when one transaction writes more records than the
            # cache holds (a wide fan-out readied at once), those it wrote first stay —
            # the queue serves its nodes in that order.
            for key, record, size in reversed(txn.learned):
                self._cache.put(key, result.revision, record, size)
            self._cache.drop(txn.forgotten)
            faults.point("after-commit")
        return result

    async def _prepare(self, view: View, plan: rules.Plan) -> _Txn:
        """The compares and writes of ``plan``: every record it writes, under a compare
        on what the decision read, with the task's counters, indexes and events."""
        now = self.clock()
        task_id = view.task.task_id
        compares: list[Compare] = []
        ops: list[Op] = []
        #: What the cache learns if the transaction commits: (key, record, bytes).
        learned: list[tuple[str, Any, int]] = []
        task = self._task_writes(view, plan, now)
        if task is not None or view.task_cached:
            compares.append(Mod(self._keys.task(task_id)) == view.task_rev)
        # Cached snapshots the decision read without writing them are compared too: a
        # cached view commits only if all it read is still current.
        for nid in sorted(view.cached - plan.writes.keys()):
            compares.append(Mod(self._keys.snapshot(task_id, nid)) == view.revs[nid])
        if task is not None:
            if task.status != view.task.status:
                plan.events.append(Event(
                    task_id=task_id, event_id=_event_id(now, 9999),
                    kind="task_" + task.status.lower(),
                    at=now, state=task.status.value, actor="engine",
                ))
            data = codec.encode_task(task, input_json=self._input_text(task))
            if task.status.final:
                # Its last write, as a rule: kept, a large input would stay alive for
                # every full garbage collection to scan (as a node's: _externalize).
                self._input_texts.discard(task_id)
            ops.append(Put(self._keys.task(task_id), data))
            learned.append((self._keys.task(task_id), task, len(data)))
            # The indexes move in the same transaction as the record (revision 0: a
            # submit, every entry is new).
            ops.extend(index_writes(self._keys, view.task if view.task_rev else None, task))
            plan.task = task
        for nid, snap in list(plan.writes.items()):
            key = self._keys.snapshot(task_id, nid)
            compares.append(Mod(key) == view.revs.get(nid, 0))
            # The plan keeps the snapshot as stored (large payloads as blob references).
            snap, data = await self._externalize(snap, plan.encoded)
            plan.writes[nid] = snap
            ops.append(Put(key, data))
            learned.append((key, snap, len(data)))
        for event in plan.events:
            ops.append(Put(self._keys.event(task_id, event.event_id), codec.encode_event(event)))
        for nid, durations in plan.durations.items():
            ops.append(Put(self._keys.stats(view.task.dag_name, nid),
                           json.dumps({"durations": durations}).encode()))
        forgotten: list[str] = []
        for dependency, ramp in plan.ramps.items():
            # Every executor's claims meet here: the ramp moves under a compare too.
            key = self._keys.ramp(dependency)
            compares.append(Mod(key) == view.ramp_revs.get(dependency, 0))
            if ramp is None:
                ops.append(Delete(key))
                forgotten.append(key)  # (a deleted key's revision is 0: read it again)
            else:
                data = encode_ramp(ramp)
                ops.append(Put(key, data))
                learned.append((key, ramp, len(data)))
        for dependency in sorted(view.cached_ramps - plan.ramps.keys()):
            compares.append(Mod(self._keys.ramp(dependency)) == view.ramp_revs[dependency])
        return _Txn(compares, ops, learned, forgotten)

    async def _after_commit(self, *committed: tuple[View, rules.Plan]) -> None:
        """What follows the commit of one transaction (of each ``(view, plan)`` it
        wrote): the queue work, one round trip for what is due now — the nodes readied,
        the held items of the nodes claimed (``plan.acks``) — then the listeners."""
        now_items: list[WorkItem] = []
        later: list[tuple[WorkItem, float]] = []
        acks: list[tuple[str, WorkItem]] = []
        for view, plan in committed:
            task, dag = view.task, view.dag
            for n, delay in plan.enqueue:
                item = WorkItem(task.task_id, n, dag.node(n).lane, priority=task.priority)
                if delay > 0:
                    later.append((item, delay))
                else:
                    now_items.append(item)
            acks.extend((worker, WorkItem(task.task_id, n, dag.node(n).lane))
                        for worker, n in plan.acks)
        if now_items or acks:
            await self.queue.enqueue(now_items, acks=acks)
        for item, delay in later:
            await self.queue.enqueue([item], delay=delay)
        if now_items or later:
            faults.point("after-enqueue")
        for view, plan in committed:
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
        claim_for: str = "",
        claim_lanes: Iterable[str] = (),
        lease_seconds: float | None = None,
    ) -> SubmitResult:
        """Create a task and ready its entry nodes in one transaction.

        The same ``idempotency_key`` with the same payload returns the same task; with
        another payload it raises :class:`Conflict`.

        ``claim_for``: a worker that has a slot free (an embedded session's, through
        :meth:`~axengine.worker.Worker.submit`). The same transaction then also claims
        for it, with a lease of ``lease_seconds``, the first entry node the submit
        readies in one of ``claim_lanes`` — lanes where nothing waits, so the claim
        overtakes no queued work — as :meth:`complete_and_claim` claims a successor:
        the worker runs it without a queue round trip, and a task's first node costs no
        transaction of its own. ``SubmitResult.next`` is that claim, or None when no
        node could be claimed at once (it went to the queue) or the task existed.
        """
        ask = (rules.NextClaim(worker=claim_for, lanes=frozenset(claim_lanes),
                               lease=lease_seconds or self.config.lease_seconds)
               if claim_for else None)
        labels = dict(labels or {})
        check_labels(labels)
        if len(idempotency_key) > MAX_IDEMPOTENCY_KEY:
            raise InputError(f"idempotency_key: at most {MAX_IDEMPOTENCY_KEY} characters")
        if deadline_seconds is not None and not 0 < deadline_seconds < math.inf:
            raise InputError(f"deadline_seconds must be a positive number of seconds, not "
                             f"{deadline_seconds!r}")
        # Checked before anything is stored: the input must read back on every path
        # (standard JSON, bounded depth and size), and the largest transition of the DAG
        # must fit one store transaction, or the task could never finish.
        input_bytes = check_json_value(input, "task input",
                                       max_bytes=self.config.max_input_bytes)
        input_text = input_bytes.decode()
        check_task_input(dag.input_schema, input)
        require_fit(dag, self._store.max_txn_ops, labels=len(labels))
        now = self.clock()
        deadline_s = deadline_seconds if deadline_seconds is not None else dag.deadline
        # sha256_json([dag.hash, input, labels, priority, deadline_s]), the input's text
        # made once above.
        payload = hashlib.sha256(canonical_list([
            canonical_json(dag.hash), input_text, canonical_json(labels),
            canonical_json(priority), canonical_json(deadline_s)]).encode()).hexdigest()
        task_id = task_id or f"t-{secrets.token_hex(8)}"
        input_ref = None
        stored_input = input
        if len(input_bytes) > self.config.blob_threshold:
            input_ref, stored_input = await asyncio.to_thread(self._blobs.put, input_bytes), None
        else:
            self._input_texts.put(task_id, (input, input_text))
        task = TaskRecord(
            task_id=task_id, dag_hash=dag.hash, dag_name=dag.name, input=stored_input,
            input_ref=input_ref, status=TaskStatus.RUNNING, priority=priority,
            deadline=now + deadline_s if deadline_s else 0.0, labels=labels,
            idempotency_key=idempotency_key, payload_sha256=payload, created_at=now,
            submitted_by=submitted_by,
            updated_at=now,
        )
        # A claim reads the ramp of its node's dependency from the cache, under a
        # compare (see below for when that compare fails).
        view = View(dag=dag, task=task, task_rev=0, task_input=input, task_input_loaded=True,
                    use_cache=ask is not None)
        preds = dag.predecessors
        for nid in dag.nodes:
            view.snaps[nid] = Snapshot(task_id=task_id, node_id=nid, last_updated=now,
                                       preds_left=len(preds[nid]))
        # What submits of this DAG that claimed asked for before is read first (see
        # _Prefetch): the entry's ramp, run durations, lane depths.
        key = (dag.hash, "submit", "")
        asked = self._asked.get(key) if ask is not None else None
        if asked is not None:
            await self._fill(view, asked)
        needs: list[Need] = []
        while isinstance(decided := self._decide(view, lambda v: rules.plan_submit(
                v, now=now, ids=self._ids(), claim_next=ask)), Need):
            # A map at an entry asks for its items, which a new task has not; the claim
            # of an entry node (claim_for), for its dependency's ramp or its run
            # durations or a lane's depth (an adaptive timeout), which are read.
            needs.append(decided)
            for nid in decided.nodes:
                view.absent(nid)
            if decided.ramps or decided.durations or decided.depths:
                await self._fill(view, Need(ramps=decided.ramps, durations=decided.durations,
                                            depths=decided.depths))
        if needs and ask is not None:
            self._remember(key, needs, nodes=False)
        plan = decided
        compares: list[Compare] = []
        extra: list[Op] = []
        failure: list[Op] = []
        if idempotency_key:
            ikey = self._keys.idempotency(submitted_by, idempotency_key)
            compares.append(Version(ikey) == 0)
            extra.append(Put(ikey, task_id.encode()))
            failure.append(Get(ikey))
        if dag.hash not in self._dags:
            # The DAG record rides in the submit's transaction, so a refused or conflicting
            # submit stores nothing; re-putting a stored DAG writes the same bytes (the
            # key is its content hash).
            extra.append(Put(self._keys.dag(dag.hash), dag.storage_json()))
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
            if ask is not None:
                # The task id is taken, or the ramp the claim read changed (an outage
                # began or ended): a plain submit tells which, and stores the task in
                # the second case.
                return await self.submit(
                    dag, input, idempotency_key=idempotency_key, labels=labels,
                    priority=priority, deadline_seconds=deadline_seconds, task_id=task_id,
                    submitted_by=submitted_by)
            raise Conflict(f"task id {task_id!r} already exists")
        self._dags.put(dag.hash, dag)
        await self._after_commit((view, plan))
        return SubmitResult(task_id, created=True, next=await self._claim_made(view, plan))

    async def claim(self, task_id: str, node_id: str, *, worker: str,
                    lease_seconds: float | None = None) -> ClaimResult:
        """Claim a node for ``worker`` (see :func:`rules.plan_claim`)."""
        lease = lease_seconds or self.config.lease_seconds
        plan, view = await self._apply(task_id, lambda v: rules.plan_claim(
            v, node_id, worker=worker, lease=lease, now=self.clock(), ids=self._ids(),
            config=self.config.rules),
            preload=(node_id,))
        if plan.result == "claimed":
            snap: Snapshot = plan.detail
            return await self._claimed(view.task, view.dag.node(node_id), snap)
        if plan.result == "dead":
            return ClaimResult("dead", reason="deadline or attempt budget")
        reason, retry_after = plan.detail or ("", 0.0)
        return ClaimResult("not-claimable", retry_after=retry_after, reason=reason)

    async def get_run(self, task_id: str, node_id: str, *, fence: int) -> ClaimResult | None:
        """What the attempt holding ``fence`` runs — its claim's answer — or None when
        ``fence`` is not the node's current fence under a live lease. Changes nothing.

        A Kubernetes Job's container asks this (``GetRun``) for the run its executor
        claimed; a runner's garbage collection asks it whether a Job's fence still
        holds. A None is final for that fence: fences only grow.

        Raises:
            NotFound: The task or the node does not exist.
        """
        task, _ = await self._load_task(task_id)
        dag = await self.get_dag(task.dag_hash)
        node = dag.get_node(node_id)
        snap = await self.snapshot(task_id, node_id) if node is not None else None
        if node is None or snap is None:
            raise NotFound(f"task {task_id!r} has no node {node_id!r}")
        if not rules.holds(snap, fence, self.clock()):
            return None
        return await self._claimed(task, node, snap)

    async def _claim_made(self, view: View, plan: rules.Plan) -> ClaimResult | None:
        """The claim a committed plan made alongside its transition (``_claim_next``:
        its ``detail`` is the claimed snapshot), or None."""
        if not isinstance(plan.detail, Snapshot):
            return None
        snap: Snapshot = plan.detail
        return await self._claimed(plan.task or view.task, view.dag.node(snap.node_id), snap)

    async def _claimed(self, task: TaskRecord, node: Node, snap: Snapshot) -> ClaimResult:
        params = snap.input
        if snap.input_ref is not None:
            params = await self.blob_json(snap.input_ref)
        return claimed(task, node, snap, params)

    async def heartbeat(self, task_id: str, node_id: str, *, fence: int,
                        lease_seconds: float | None = None,
                        activity: Activity | None = None) -> str:
        """Renew the lease: ``ok`` or ``stale`` (stop the run). ``activity``: the
        resources the run used lately, kept for the blocking verdict (None: no sample)."""
        lease = lease_seconds or self.config.lease_seconds
        plan, _ = await self._apply(task_id, lambda v: rules.plan_heartbeat(
            v, node_id, fence=fence, lease=lease, now=self.clock(), ids=self._ids(),
            activity=activity), preload=(node_id,))
        return plan.result

    async def progress(self, task_id: str, node_id: str, *, fence: int, marker: str,
                       lease_seconds: float | None = None) -> str:
        """Record a checkpoint: ``ok`` or ``stale``."""
        lease = lease_seconds or self.config.lease_seconds
        plan, _ = await self._apply(task_id, lambda v: rules.plan_progress(
            v, node_id, fence=fence, marker=marker, lease=lease, now=self.clock(),
            ids=self._ids()), preload=(node_id,))
        return plan.result

    async def checkpoint(self, task_id: str, node_id: str, *, fence: int, state: Any) -> str:
        """Save state for the node's next run under ``fence``: ``ok`` or ``stale``.

        Raises:
            InputError: ``state`` is not JSON within 64 KiB.
        """
        check_json_value(state, f"checkpoint of node {node_id!r}",
                         max_bytes=MAX_CHECKPOINT_BYTES)
        plan, _ = await self._apply(task_id, lambda v: rules.plan_checkpoint(
            v, node_id, fence=fence, state=state, now=self.clock(), ids=self._ids()),
            preload=(node_id,))
        return plan.result

    async def complete(self, task_id: str, node_id: str, *, fence: int,
                       outcome: Outcome) -> str:
        """Commit an outcome: ``committed``, ``stale`` or ``already-done``."""
        return (await self._complete(task_id, node_id, fence, outcome, None)).answer

    async def complete_and_claim(self, task_id: str, node_id: str, *, fence: int,
                                 outcome: Outcome, worker: str, lanes: Iterable[str],
                                 lease_seconds: float | None = None,
                                 claim_node: str = "", claim_task: str = "") -> Completed:
        """Commit an outcome and, in the same transaction, claim for ``worker`` the node
        its slot runs next: ``claim_node`` of ``claim_task`` (default: this task), a
        node the worker took from the queue, or else one the completion readies in one
        of ``lanes`` (:func:`rules.plan_complete` with a :class:`rules.NextClaim`) — the
        caller names the lanes it may take without overtaking queued work. One
        transaction per node, and no queue round trip for a chain; the fence rules are
        those of a claim and a completion, each checked as if alone. A node that cannot
        be claimed at once is not claimed (``next`` is None): the caller claims it the
        plain way, which says why."""
        lease = lease_seconds or self.config.lease_seconds
        if claim_node and claim_task and claim_task != task_id:
            done = await self._complete_claiming(task_id, node_id, fence, outcome,
                                                 claim_task, claim_node, worker, lease)
            if done is not None:
                return done
            return await self._complete(task_id, node_id, fence, outcome, None)
        ask = rules.NextClaim(worker=worker, lease=lease, lanes=frozenset(lanes),
                              node_id=claim_node)
        return await self._complete(task_id, node_id, fence, outcome, ask)

    async def _complete(self, task_id: str, node_id: str, fence: int, outcome: Outcome,
                        ask: rules.NextClaim | None) -> Completed:
        plan, view = await self._apply(task_id, lambda v: rules.plan_complete(
            v, node_id, fence=fence, outcome=outcome, now=self.clock(), ids=self._ids(),
            config=self.config.rules, claim_next=ask), preload=(node_id,),
            prefetch=_completion_reads(node_id, ask.node_id if ask is not None else ""))
        return Completed(plan.result, plan.writes.get(node_id),
                         await self._claim_made(view, plan), acked=bool(plan.acks))

    async def _complete_claiming(self, task_id: str, node_id: str, fence: int,
                                 outcome: Outcome, other: str, claim_node: str,
                                 worker: str, lease: float) -> Completed | None:
        """Commit an outcome and claim ``claim_node`` of the task ``other`` in one
        transaction: each decided as alone (:func:`rules.plan_complete`,
        :func:`rules.plan_claim`) on its own task's view, in both tasks' turns, and
        written together under both decisions' compares. None when they cannot go
        together — the completion writes nothing, the node is not claimable now, they
        write a key in common, or a compare failed — and nothing was written: the caller
        commits the outcome alone and the node is claimed the plain way."""
        async with self._turns((task_id, other)):
            plan, view = await self._plan(task_id, lambda v: rules.plan_complete(
                v, node_id, fence=fence, outcome=outcome, now=self.clock(),
                ids=self._ids(), config=self.config.rules), use_cache=True,
                preload=(node_id,), prefetch=_completion_reads(node_id, ""))
            if not plan.writes:
                return None
            try:
                claim, claimed_view = await self._plan(other, lambda v: rules.plan_claim(
                    v, claim_node, worker=worker, lease=lease, now=self.clock(),
                    ids=self._ids(), config=self.config.rules), use_cache=True,
                    preload=(claim_node,))
            except NotFound:
                return None
            if claim.result != "claimed":
                return None
            txn = (await self._prepare(view, plan)).join(
                await self._prepare(claimed_view, claim), self._store.max_txn_ops)
            if txn is None:
                return None
            if not (await self._write(txn)).succeeded:
                self._forget(view, plan)
                self._forget(claimed_view, claim)
                return None
            claim.acks.append((worker, claim_node))  # the item the worker took
            await self._after_commit((view, plan), (claimed_view, claim))
        snap: Snapshot = claim.detail
        following = await self._claimed(claim.task or claimed_view.task,
                                        claimed_view.dag.node(claim_node), snap)
        return Completed(plan.result, plan.writes.get(node_id), following, acked=True)

    async def decide(self, task_id: str, node_id: str, *, decision: str, by: str,
                     comment: str = "", data: Any = NO_EDITS) -> str:
        """Approve or reject a paused gate: ``committed`` or ``already-done``. ``data``
        (an approval only) replaces what the gate passes on: approve-with-edits."""
        if len(comment) > MAX_COMMENT:
            raise InputError(f"comment: at most {MAX_COMMENT} characters")
        plan, _ = await self._apply(task_id, lambda v: rules.plan_decide(
            v, node_id, decision=decision, by=by, comment=comment, now=self.clock(),
            four_eyes=self.config.four_eyes, data=data,
            ids=self._ids()), preload=())
        return plan.result

    async def resume(self, task_id: str, node_id: str, *, data: Any = None, by: str,
                     input_revision: str = "") -> str:
        """Resume a node its handler paused (see :func:`rules.plan_resume`):
        ``committed`` or ``already-done``."""
        plan, _ = await self._apply(task_id, lambda v: rules.plan_resume(
            v, node_id, data=data, by=by, now=self.clock(), ids=self._ids(),
            input_revision=input_revision), preload=())
        return plan.result

    async def expire(self, task_id: str, node_id: str, *, owner_dead: bool = False) -> str:
        """Reconciler transition for one node (deadline, lease, stall, gate timeout)."""
        plan, _ = await self._apply(task_id, lambda v: rules.plan_expire(
            v, node_id, now=self.clock(), ids=self._ids(), owner_dead=owner_dead,
            config=self.config.rules),
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

    async def effect_begin(self, key: str, *, task_id: str, node_id: str, fence: int) -> str:
        """Outbox: NEW → SENDING, for the attempt that holds ``task_id/node_id`` under
        ``fence`` (see :func:`~axengine.engine._effects.decide_begin`).

        Returns:
            The state before the call (``NEW``: perform the effect now; ``DONE``;
            ``SENDING``, which is now ``UNKNOWN``; ``UNKNOWN``), or ``stale`` when
            ``fence`` is not the node's current fence under a live lease — nothing was
            written and the effect must not be performed.
        """
        return await self._outbox(key, task_id, node_id, lambda record, snap, now: (
            effects.decide_begin(record, snap, key=key, task_id=task_id, node_id=node_id,
                                 fence=fence, now=now)))

    async def effect_done(self, key: str, result: Mapping[str, Any], *, task_id: str,
                          node_id: str, fence: int) -> str:
        """Outbox: → DONE with ``result``, for the attempt that holds the node under
        ``fence``: ``ok``, or ``stale`` (nothing written).

        Raises:
            NotFound: The caller holds the node but never began the effect.
        """
        return await self._outbox(key, task_id, node_id, lambda record, snap, now: (
            effects.decide_done(record, snap, key=key, fence=fence, result=result, now=now)))

    async def _outbox(self, key: str, task_id: str, node_id: str, rule: _OutboxRule) -> str:
        """Decide an outbox call on the node's snapshot and the record, read at one
        revision, and write the record in one transaction that compares both: a fence
        that goes stale after the read (a takeover, a cancel) fails the compare and the
        call is decided again. Never a check in one transaction and a write in another.
        """
        ekey, skey = self._keys.effect(key), self._keys.snapshot(task_id, node_id)
        for attempt in range(MAX_CAS_RETRIES):
            if attempt:
                await asyncio.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** attempt)))
            found = await self._store.get_many([skey, ekey])
            skv, ekv = found.get(skey), found.get(ekey)
            snap = codec.decode_snapshot(skv.value) if skv is not None else None
            record = codec.decode_effect(ekv.value) if ekv is not None else None
            answer, write = rule(record, snap, self.clock())
            if write is None:
                # Nothing to write: decided on one consistent read (a stale fence stays
                # stale; a DONE or UNKNOWN record is only reported).
                return answer
            assert skv is not None  # a write is only decided for the node's holder
            compares = [Mod(skey) == skv.mod_revision,
                        Mod(ekey) == (ekv.mod_revision if ekv is not None else 0)]
            ops: list[Op] = [Put(ekey, codec.encode_effect(write))]
            if ekv is None:  # a new record enters its node's index (the UI lists them)
                ops.append(Put(self._keys.effect_entry(task_id, node_id, key), key.encode()))
            if (await self._store.txn(compares, ops)).succeeded:
                return answer
        raise StoreError(f"effect {key}: gave up after {MAX_CAS_RETRIES} conflicting writes")

    async def effect_get(self, key: str) -> codec.EffectRecord | None:
        """The outbox record of ``key``, or None when nothing was begun under it."""
        kv = await self._store.get(self._keys.effect(key))
        return codec.decode_effect(kv.value) if kv else None

    async def task_effects(self, task_id: str) -> dict[str, list[codec.EffectRecord]]:
        """The outbox records of a task's nodes, by node id (from the effect index: two
        reads whatever the store holds; one when the task has none)."""
        entries = await self._store.range(self._keys.effects_of(task_id))
        if not entries:
            return {}
        found = await self._store.get_many([self._keys.effect(kv.value.decode())
                                            for kv in entries])
        out: dict[str, list[codec.EffectRecord]] = {}
        for kv in sorted(found.values(), key=lambda kv: kv.create_revision):
            record = codec.decode_effect(kv.value)
            out.setdefault(record.node_id, []).append(record)
        return out

    # ------------------------------------------------------------------ fixtures

    async def restore_task(self, dag: Dag, task: TaskRecord, snapshots: Iterable[Snapshot],
                           events: Iterable[Event]) -> str:
        """Write a recorded task (a snapshot fixture) into this store in one transaction
        and return its id. RUNNING nodes come back WAITING with a bumped fence (see
        :func:`~axengine.engine._restore.restored`); the task enters the indexes.

        Raises:
            Conflict: A task with this id already exists here.
        """
        await self.put_dag(dag)
        task, snaps = restored(dag, task, snapshots)
        keys = self._keys
        ops: list[Op] = [Put(keys.task(task.task_id), codec.encode_task(task))]
        for snap in snaps:
            _, data = await self._externalize(snap, {})
            ops.append(Put(keys.snapshot(task.task_id, snap.node_id), data))
        # Listing and the reconciler find tasks through the indexes: enter it there too.
        ops.extend(index_writes(keys, None, task))
        for event in events:
            ops.append(Put(keys.event(task.task_id, event.event_id), codec.encode_event(event)))
        result = await self._store.txn([Mod(keys.task(task.task_id)) == 0], ops, [])
        if not result.succeeded:
            raise Conflict(f"task {task.task_id} already exists in this store")
        return task.task_id


def _durations(raw: bytes) -> list[float]:
    """The durations of a stats record; an unreadable record counts as none (they are
    samples, and a policy falls back while it has too few)."""
    try:
        values = json.loads(raw)["durations"]
        return [float(v) for v in values if isinstance(v, int | float)]
    except (ValueError, KeyError, TypeError):
        return []


def _completion_reads(node_id: str, claim_node: str) -> _Prefetch:
    """What a completion of ``node_id`` reads with the node itself: the targets a
    success settles (a map's item counts off on its map node), and ``claim_node``, the
    node it may claim next; and what completions of the node asked for before."""
    def ahead(dag: Dag) -> tuple[str, ...]:
        item = parent_of(node_id)
        nodes: tuple[str, ...]
        if item is not None:
            nodes = (item[0],) if item[0] in dag.nodes else ()
        else:
            nodes = dag.nodes[node_id].targets if node_id in dag.nodes else ()
        if claim_node and dag.get_node(claim_node) is not None:
            nodes = (*nodes, claim_node)
        return nodes

    return _Prefetch("complete", node_id, ahead)
