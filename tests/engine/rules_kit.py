"""An in-memory world for testing the pure transition rules without a store.

:class:`World` holds what the store would: the task record, every node snapshot, the
blob outputs, the timeline and the queue. It decides a rule the way the engine shell
does — a :class:`View` that starts empty and is filled with exactly what the rule asks
for through :class:`Need` — and applies the resulting :class:`Plan` the way the shell
commits it (snapshots, events, enqueue; task counters moved by category and the status
derived with :func:`derive_status`). No I/O, no event loop: time is the ``now`` the
test passes.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from axengine.activity import Activity
from axengine.dag import Dag, load_dag_text
from axengine.engine._ramp import Ramp, dependency_of
from axengine.engine._rules import (
    Plan,
    RuleConfig,
    category,
    derive_status,
    plan_cancel,
    plan_checkpoint,
    plan_claim,
    plan_complete,
    plan_decide,
    plan_expire,
    plan_heartbeat,
    plan_progress,
    plan_resume,
    plan_retry,
    plan_submit,
    task_clock,
)
from axengine.engine._view import Need, View
from axengine.records import NO_EDITS, Event, NodeState, Snapshot, TaskRecord, TaskStatus
from executors.contract import Outcome

__all__ = ["T0", "TOOLS", "Rule", "World", "load", "recount"]

#: Tool names the test DAGs may use (the validator checks them).
TOOLS = frozenset({"echo"})
#: Model names the test DAGs may use.
MODELS = frozenset({"sim"})
#: Submission time of every world (an arbitrary, readable epoch).
T0 = 1_000.0

Rule = Callable[[View], Plan]


def load(text: str) -> Dag:
    """A validated DAG from (indented) YAML text."""
    return load_dag_text(textwrap.dedent(text), tools=TOOLS, models=MODELS)


def recount(dag: Dag, snaps: Iterable[Snapshot]) -> dict[str, int]:
    """Task counters recomputed from scratch (the shell keeps them incrementally)."""
    counts: dict[str, int] = {}
    for snap in snaps:
        key = category(dag.nodes[snap.node_id], snap)
        counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass
class World:
    """One task's durable state, kept in memory.

    Attributes:
        dag: The task's DAG.
        task: The task record (status and counters kept as the shell keeps them).
        snaps: Every node's snapshot.
        blobs: Outputs kept "outside" the snapshot (``output_ref`` set), by node id.
        events: The timeline, in commit order.
        queue: Every ``(node_id, delay)`` enqueued after a commit, in order.
        loads: The last decision's :class:`Need` requests, in order.
        config: Rule tunables passed to ``plan_complete``.
        ramps: The dependencies' ramps after an outage (shared with other worlds when
            given the same dict: the store is shared by every task).
    """

    dag: Dag
    task: TaskRecord
    snaps: dict[str, Snapshot] = field(default_factory=dict)
    blobs: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    queue: list[tuple[str, float]] = field(default_factory=list)
    loads: list[Need] = field(default_factory=list)
    config: RuleConfig = field(default_factory=RuleConfig)
    ramps: dict[str, Ramp] = field(default_factory=dict)
    durations: dict[str, list[float]] = field(default_factory=dict)
    depths: dict[str, int] = field(default_factory=dict)
    _counter: Iterator[int] = field(default_factory=itertools.count, repr=False)

    # ------------------------------------------------------------------ building

    @classmethod
    def submit(cls, dag: Dag | str, input: Any = None, *, now: float = T0,
               deadline: float = 0.0, submitted_by: str = "alice",
               labels: dict[str, str] | None = None, config: RuleConfig | None = None,
               task_id: str = "t1", ramps: dict[str, Ramp] | None = None) -> World:
        """Submit a task (as ``Engine.submit`` builds its view) and apply the plan."""
        if isinstance(dag, str):
            dag = load(dag)
        task = TaskRecord(task_id=task_id, dag_hash=dag.hash, dag_name=dag.name, input=input,
                          deadline=deadline, labels=labels or {}, created_at=now,
                          updated_at=now, submitted_by=submitted_by)
        world = cls(dag=dag, task=task, config=config or RuleConfig(),
                    ramps={} if ramps is None else ramps)
        view = View(dag=dag, task=task, task_rev=0, task_input=input, task_input_loaded=True)
        for nid, preds in dag.predecessors.items():
            view.snaps[nid] = Snapshot(task_id=task_id, node_id=nid, last_updated=now,
                                       preds_left=len(preds))
        world.apply(plan_submit(view, now=now, ids=world.ids()))
        return world

    def ids(self) -> Callable[[], str]:
        """Event ids, unique within the world (the shell's are time-ordered)."""
        return lambda: f"e{next(self._counter):06d}"

    # ------------------------------------------------------------------ deciding

    def view(self, nodes: Iterable[str] | None = None) -> View:
        """A view holding ``nodes`` (every node when None), as the shell would load it."""
        view = View(dag=self.dag, task=self.task, task_rev=1)
        self.fill(view, Need(nodes=self.dag.nodes if nodes is None else nodes))
        return view

    def fill(self, view: View, need: Need) -> None:
        """Load what a rule asked for, as ``Engine._fill`` does."""
        ramps = set(need.ramps)
        for nid in sorted(need.nodes):
            view.snaps[nid] = self.snaps[nid]
            view.revs[nid] = 1
            # The shell reads the ramps of these nodes' dependencies in the same read.
            dependency = dependency_of(self.dag.nodes[nid])
            if dependency and dependency not in view.ramps:
                ramps.add(dependency)
        for nid in sorted(need.outputs):
            view.outputs[nid] = self.blobs[nid]
        if need.task_input:
            view.task_input = self.task.input
            view.task_input_loaded = True
        for nid in sorted(need.durations):
            view.run_durations[nid] = list(self.durations.get(nid, []))
        for lane in sorted(need.depths):
            view.queue_depths[lane] = self.depths.get(lane, 0)
        for dependency in sorted(ramps):
            view.ramps[dependency] = self.ramps.get(dependency)
            view.ramp_revs[dependency] = 1 if dependency in self.ramps else 0

    def decide(self, rule: Rule, *, preload: Iterable[str] = ()) -> Plan:
        """Call ``rule`` on a view that starts with ``preload`` and grows on each
        :class:`Need`, exactly as the shell's decide loop does. Nothing is applied."""
        view = self.view(preload)
        self.loads = []
        while True:
            try:
                return rule(view)
            except Need as need:
                assert (need.nodes or need.outputs or need.task_input or need.ramps
                        or need.durations or need.depths), "an empty Need"
                # A rule must never ask again for what it was given: that would loop.
                assert not (need.nodes & view.snaps.keys()), need.nodes
                self.loads.append(need)
                self.fill(view, need)

    def apply(self, plan: Plan) -> Plan:
        """Commit ``plan`` in memory as the shell commits it."""
        counts = dict(self.task.counts)
        changed = plan.task is not None
        for nid, new in plan.writes.items():
            node = self.dag.nodes[nid]
            old = self.snaps.get(nid)
            before = category(node, old) if old is not None else None
            after = category(node, new)
            if before != after:
                changed = True
                if before is not None:
                    counts[before] = counts.get(before, 0) - 1
                counts[after] = counts.get(after, 0) + 1
        self.snaps.update(plan.writes)
        self.durations.update(plan.durations)
        for dependency, ramp in plan.ramps.items():
            if ramp is None:
                self.ramps.pop(dependency, None)
            else:
                self.ramps[dependency] = ramp
        self.events.extend(plan.events)
        self.queue.extend(plan.enqueue)
        if changed:
            base = plan.task or self.task
            status = derive_status(counts, base.status is TaskStatus.CANCELLED)
            self.task = task_clock(self.task, replace(
                base, counts={k: v for k, v in sorted(counts.items()) if v}, status=status),
                # The shell stamps the commit with its clock; here, the plan's own time.
                max((e.at for e in plan.events), default=self.task.updated_at))
        return plan

    def run(self, rule: Rule, *, preload: Iterable[str] = ()) -> Plan:
        """Decide and apply."""
        return self.apply(self.decide(rule, preload=preload))

    # ------------------------------------------------------------------ operations

    def claim(self, node_id: str, *, now: float, worker: str = "w1",
              lease: float = 30.0) -> Plan:
        return self.run(lambda v: plan_claim(v, node_id, worker=worker, lease=lease, now=now,
                                             ids=self.ids(), config=self.config),
                        preload=(node_id,))

    def heartbeat(self, node_id: str, *, fence: int, now: float, lease: float = 30.0,
                  activity: Activity | None = None) -> Plan:
        return self.run(lambda v: plan_heartbeat(v, node_id, fence=fence, lease=lease,
                                                 now=now, ids=self.ids(), activity=activity),
                        preload=(node_id,))

    def progress(self, node_id: str, *, fence: int, now: float, marker: str = "m",
                 lease: float = 30.0) -> Plan:
        return self.run(lambda v: plan_progress(v, node_id, fence=fence, marker=marker,
                                                lease=lease, now=now, ids=self.ids()),
                        preload=(node_id,))

    def complete(self, node_id: str, outcome: Outcome, *, now: float,
                 fence: int | None = None) -> Plan:
        """Complete with ``fence`` (the node's current fence when None)."""
        f = self.snaps[node_id].fence if fence is None else fence
        return self.run(lambda v: plan_complete(v, node_id, fence=f, outcome=outcome, now=now,
                                                ids=self.ids(), config=self.config),
                        preload=(node_id,))

    def decide_gate(self, node_id: str, decision: str, *, now: float, by: str = "bob",
                    comment: str = "", four_eyes: bool = False,
                    data: Any = NO_EDITS) -> Plan:
        return self.run(lambda v: plan_decide(v, node_id, decision=decision, by=by,
                                              comment=comment, now=now, ids=self.ids(),
                                              four_eyes=four_eyes, data=data))

    def resume(self, node_id: str, *, now: float, data: Any = None, by: str = "vendor",
               input_revision: str = "") -> Plan:
        return self.run(lambda v: plan_resume(v, node_id, data=data, by=by, now=now,
                                              ids=self.ids(), input_revision=input_revision),
                        preload=(node_id,))

    def expire(self, node_id: str, *, now: float, owner_dead: bool = False) -> Plan:
        return self.run(lambda v: plan_expire(v, node_id, now=now, ids=self.ids(),
                                              owner_dead=owner_dead, config=self.config),
                        preload=(node_id,))

    def cancel(self, *, now: float, by: str = "admin") -> Plan:
        return self.run(lambda v: plan_cancel(v, now=now, ids=self.ids(), by=by))

    def checkpoint(self, node_id: str, *, fence: int, state: Any, now: float) -> Plan:
        return self.run(lambda v: plan_checkpoint(v, node_id, fence=fence, state=state,
                                                  now=now, ids=self.ids()),
                        preload=(node_id,))

    def retry(self, from_node: str, *, now: float, input_override: Any = None,
              by: str = "admin") -> Plan:
        return self.run(lambda v: plan_retry(v, from_node, input_override=input_override,
                                             now=now, ids=self.ids(), by=by))

    # ------------------------------------------------------------------ reading

    def state(self, node_id: str) -> NodeState:
        return self.snaps[node_id].state

    def states(self) -> dict[str, str]:
        return {nid: s.state.value for nid, s in self.snaps.items()}

    def kinds(self, node_id: str | None = None) -> list[str]:
        """Event kinds of the timeline (of one node when given)."""
        return [e.kind for e in self.events if node_id is None or e.node_id == node_id]
