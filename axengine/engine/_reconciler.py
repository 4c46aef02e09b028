"""The reconciler: one leader at a time repairs what crashes and lost messages leave.

Each pass, for every unfinished task: WAITING nodes missing from the queue are
re-enqueued (Redis may have lost everything); RUNNING nodes whose lease expired or whose
blocking verdict (:mod:`axengine.engine._stall`) says fence are fenced out and re-queued
(or DEAD when their budget is spent), and a note, warning or extension of that verdict
is recorded once;
gates past their bounded wait take their default route; work past the task deadline
goes DEAD. Leadership is a record in the store renewed with compare-and-swap, so two
reconcilers never act at once for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from axengine.clock import SYSTEM, Clock, wait_event
from axengine.dag import is_visit
from axengine.engine import _rules as rules
from axengine.engine._shell import Engine
from axengine.engine._stall import stall_verdict
from axengine.errors import AxError
from axengine.owners import owner_is_dead
from axengine.queue import WorkItem
from axengine.records import ACTIVE_STATES, COMPOSITE_OWNERS, NodeState
from axengine.store import Delete, KeyValue, Mod, Put

__all__ = ["ReconcileReport", "Reconciler"]

log = logging.getLogger("axengine.reconciler")


@dataclass
class ReconcileReport:
    """What one pass did."""

    tasks: int = 0
    requeued: list[tuple[str, str]] = field(default_factory=list)
    expired: list[tuple[str, str, str]] = field(default_factory=list)


class Reconciler:
    """Periodic repair, run only by the elected leader.

    Args:
        engine: The engine it repairs through.
        owner: This process's owner id (named in the leadership record).
        interval: Seconds between passes.
        leader_ttl: Seconds a leadership record lasts without renewal.
        stuck_after: Seconds a due WAITING node may look queued before it is re-enqueued.
        clock: What the loop waits on between passes (decisions read ``engine.clock``).
    """

    def __init__(self, engine: Engine, *, owner: str, interval: float = 1.0,
                 leader_ttl: float = 10.0, stuck_after: float = 30.0,
                 clock: Clock = SYSTEM) -> None:
        self.engine = engine
        self.clock = clock
        self.owner = owner
        self.interval = interval
        self.leader_ttl = leader_ttl
        self.stuck_after = stuck_after
        # When each due WAITING node was first seen still waiting: an item can look
        # queued while it sits in the processing list of a worker that died.
        self._waiting_since: dict[tuple[str, str], float] = {}
        self._indexed = False

    async def _record(self) -> KeyValue | None:
        # The leader record is engine state like any other, and this module is the
        # engine's: it reads the engine's store under the engine's key layout.
        return await self.engine._store.get(self.engine._keys.leader("reconciler"))

    async def leader(self) -> str | None:
        """The owner named by the leadership record (perhaps expired), or None."""
        kv = await self._record()
        return None if kv is None else str(json.loads(kv.value)["owner"])

    async def elect(self) -> bool:
        """Take or renew leadership; True while this reconciler is the leader."""
        store, key = self.engine._store, self.engine._keys.leader("reconciler")
        now = self.engine.clock()
        kv = await self._record()
        if kv is not None:
            record = json.loads(kv.value)
            held = record["owner"] != self.owner and record["until"] > now
            if held and not owner_is_dead(record["owner"]):
                return False
            if record["owner"] == self.owner and record["until"] - now > self.leader_ttl / 2:
                # Ours for a while yet: renew at half-life, not on every pass (a write
                # per pass is store traffic for nothing).
                return True
        value = json.dumps({"owner": self.owner, "until": now + self.leader_ttl}).encode()
        result = await store.txn([Mod(key) == (kv.mod_revision if kv else 0)], [Put(key, value)])
        return result.succeeded

    async def run_once(self) -> ReconcileReport:
        """One repair pass over every unfinished task."""
        engine = self.engine
        report = ReconcileReport()
        now = engine.clock()
        for worker in sorted(await engine.queue.workers()):
            if owner_is_dead(worker):
                # Its unacked items go back to the lanes now rather than after stuck_after.
                await engine.queue.recover(worker)
        if not self._indexed:
            # The pass finds its tasks through the status index: enter tasks stored
            # before the indexes existed first (once per store, a no-op afterwards).
            await engine.ensure_indexes()
            self._indexed = True
        # The queue is read before the store. A node made WAITING since the pass began
        # may be on its way to the queue (a commit's enqueue follows it), so it is not
        # taken for lost on this pass: a fan-out readied mid-pass would be queued twice.
        queued = await engine.queue.queued()
        still_waiting: dict[tuple[str, str], float] = {}
        # Only the states a pass acts on (a lease or stall to fence, a gate to time out, a
        # waiting node to re-offer): no other node of a task is decoded. The snapshots
        # come a batch of tasks per read.
        async for task, active in engine.snapshots_each(await engine.unfinished_tasks(),
                                                        states=ACTIVE_STATES):
            report.tasks += 1
            dag = await engine.get_dag(task.dag_hash)
            for snap in active:
                # (A PAUSED task's deadline moves on while it is paused.)
                past_deadline = bool(task.deadline) and now >= rules.deadline_at(task, now)
                if is_visit(snap.node_id) or (snap.owner in COMPOSITE_OWNERS
                                           and not past_deadline):
                    continue  # a loop's kept visit; a map or sub-DAG node: its nodes run
                node = dag.node(snap.node_id)
                ident = (task.task_id, snap.node_id)
                if snap.state is NodeState.RUNNING:
                    # The verdict the claim and plan_expire reach too: expire is called
                    # to fence, and to record a note, warning or extension once (news).
                    verdict = stall_verdict(node, snap, now, engine.config.rules.blocking)
                    lost = (now > snap.lease_until or owner_is_dead(snap.owner)
                            or verdict.action == "fence"
                            or (verdict.news and verdict.action != "ok"))
                    if lost or past_deadline:
                        # A dead owner's lease is void: no need to wait it out.
                        result = await engine.expire(task.task_id, snap.node_id,
                                                     owner_dead=owner_is_dead(snap.owner))
                        report.expired.append((*ident, result))
                elif snap.state is NodeState.PAUSED:
                    # gate_until 0: paused until someone resumes it.
                    if past_deadline or (snap.gate_until and now >= snap.gate_until):
                        result = await engine.expire(task.task_id, snap.node_id)
                        report.expired.append((*ident, result))
                elif snap.state is NodeState.WAITING:
                    if past_deadline:
                        result = await engine.expire(task.task_id, snap.node_id)
                        report.expired.append((*ident, result))
                    else:
                        due = now >= snap.not_before
                        since = self._waiting_since.get(ident, now) if due else now
                        still_waiting[ident] = since
                        missing = ident not in queued and snap.last_updated < now
                        if missing or now - since >= self.stuck_after:
                            # Duplicates are harmless: the claim admits one worker.
                            delay = max(0.0, snap.not_before - now)
                            await engine.queue.enqueue(
                                [WorkItem(*ident, node.lane, priority=task.priority)],
                                delay=delay)
                            report.requeued.append(ident)
                            still_waiting[ident] = now
        self._waiting_since = still_waiting
        return report

    async def resign(self) -> None:
        """Give leadership up if this reconciler holds it, so a successor (the next
        embedded session in this process, another API replica) need not wait out the
        TTL. The delete compares the record's revision: a record taken over meanwhile is
        left alone."""
        kv = await self._record()
        if kv is not None and json.loads(kv.value)["owner"] == self.owner:
            await self.engine._store.txn([Mod(kv.key) == kv.mod_revision], [Delete(kv.key)])

    async def pass_if_leader(self) -> ReconcileReport | None:
        """Take or renew leadership and, while leading, make one pass."""
        return await self.run_once() if await self.elect() else None

    async def run(self, stop: asyncio.Event, *,
                  after_pass: Callable[[], Awaitable[None]] | None = None) -> None:
        """Reconcile every ``interval`` seconds while leader, until ``stop`` is set; then
        resign. A pass that fails (the store or queue is down) is logged once and
        retried every interval: the process keeps serving what it can.

        Args:
            stop: Set to end the loop.
            after_pass: Awaited after every pass (e.g. draining metrics).
        """
        failing = False
        while not stop.is_set():
            try:
                await self.pass_if_leader()
                if after_pass is not None:
                    await after_pass()
            except Exception:
                # A store or queue outage, or a bug of one pass: never the end of the loop.
                if not failing:
                    log.warning("reconciler pass failed; retrying every %.1fs",
                                self.interval, exc_info=True)
                failing = True
            else:
                if failing:
                    log.warning("reconciler: store and queue reachable again")
                failing = False
            await wait_event(self.clock, stop, self.interval)
        # Best effort: a store that is down at shutdown leaves the record to expire.
        with contextlib.suppress(AxError):
            await self.resign()
