"""Property tests of the pure transition rules: random DAGs (``on_failure`` routes and
``queue_timeout`` included), random sequences of operations (claims, heartbeats,
progress, completions with random fences, lease expiries, gate decisions, cancel, retry
— a retry after a cancel included) applied in memory, and the invariants every state
reachable that way must keep.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from axengine.dag import Dag, load_dag_mapping
from axengine.engine._rules import (
    DECIDED_STATES,
    Plan,
    RuleConfig,
    backoff_delay,
    derive_status,
    plan_cancel,
    plan_claim,
    plan_complete,
    plan_decide,
    plan_expire,
    plan_heartbeat,
    plan_progress,
    plan_retry,
)
from axengine.engine._view import View
from axengine.errors import Conflict, Forbidden, InputError
from axengine.records import FINAL_STATES, NodeState, Snapshot, TaskStatus
from executors.contract import Failure, Outcome, Success, Unavailable
from tests.engine.rules_kit import MODELS, T0, TOOLS, World, recount

LEASE = 30.0
SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# ============================================================================ strategies


@st.composite
def dags(draw: st.DrawFn) -> Dag:
    """2 to 6 nodes in topological order n0, n1...: tool calls with 0 to 2 retries, some
    with a ``queue_timeout`` or an ``on_failure`` route, and guarded or plain edges to
    later nodes; at most one gate."""
    n = draw(st.integers(2, 6))
    gate = draw(st.sampled_from([None, *range(1, n)]))
    nodes: dict[str, dict[str, Any]] = {}
    for i in range(n):
        edges: list[dict[str, Any]] = []
        for j in range(i + 1, n):
            if not draw(st.booleans()):
                continue
            if draw(st.booleans()):
                edges.append({"target": f"n{j}"})
            elif i == gate:
                decision = draw(st.sampled_from(["approve", "reject"]))
                edges.append({"target": f"n{j}",
                              "condition": f"{{{{ output.decision == '{decision}' }}}}"})
            else:
                edges.append({"target": f"n{j}",
                              "condition": f"{{{{ output.v > {draw(st.integers(0, 9))} }}}}"})
        if i == gate:
            nodes[f"n{i}"] = {"type": "human_gateway", "description": "ok?", "timeout": 100,
                              "next": edges}
        else:
            nodes[f"n{i}"] = {"type": "tool_call", "tool": "echo", "input": "{{ input.seed }}",
                              "retry": draw(st.integers(0, 2)), "timeout": 60,
                              "stall_timeout": 45, "next": edges}
            queue_timeout = draw(st.sampled_from([None, None, None, 40, 100]))
            if queue_timeout is not None:
                nodes[f"n{i}"]["queue_timeout"] = queue_timeout
            if i + 1 < n and draw(st.booleans()):
                nodes[f"n{i}"]["on_failure"] = f"n{draw(st.integers(i + 1, n - 1))}"
    # Every node reachable from n0 (the validator refuses unreachable nodes).
    for j in range(1, n):
        reached = any(e["target"] == f"n{j}" or nodes[f"n{i}"].get("on_failure") == f"n{j}"
                      for i in range(j) for e in [*nodes[f"n{i}"]["next"], {"target": ""}])
        if not reached:
            nodes[f"n{j - 1}"]["next"].append({"target": f"n{j}"})
    return load_dag_mapping({"name": "prop", "nodes": nodes}, tools=TOOLS, models=MODELS)


workers = st.sampled_from(["A", "B"])
#: A node by position, or (negative) one of the running nodes: most random picks of a
#: node would otherwise hit one nobody holds.
node_ix = st.one_of(st.integers(0, 5), st.integers(-2, -1), st.integers(-2, -1))
#: The fence a completion, heartbeat or progress carries: ``None`` the one the latest
#: claim of the node handed out (the live owner, if its lease holds), ``"old"`` the one
#: before (a worker that was taken over), or a guess.
fences = st.one_of(st.none(), st.none(), st.just("old"), st.integers(0, 6))
successes = st.builds(Success, st.fixed_dictionaries({"v": st.integers(0, 9)}))
outcomes: st.SearchStrategy[Outcome] = st.one_of(
    successes,
    st.builds(Failure, st.just("flaky"), st.booleans()),
    st.builds(Unavailable, st.just("db"), st.just("down")),
)


def operations(*, cancel: bool = True, retry: bool = True) -> st.SearchStrategy[Any]:
    choices: list[st.SearchStrategy[Any]] = [
        st.tuples(st.just("work"), workers, st.one_of(successes, outcomes)),
        st.tuples(st.just("work"), workers, st.one_of(successes, outcomes)),
        st.tuples(st.just("claim"), workers, node_ix),
        st.tuples(st.just("claim"), workers, node_ix),
        st.tuples(st.just("crash"), workers, st.sampled_from([20.0, 31.0, 50.0])),
        st.tuples(st.just("heartbeat"), workers, node_ix, fences),
        st.tuples(st.just("progress"), workers, node_ix, fences),
        st.tuples(st.just("complete"), workers, node_ix, fences, outcomes),
        st.tuples(st.just("complete"), workers, node_ix, fences, outcomes),
        st.tuples(st.just("complete"), workers, node_ix, fences, outcomes),
        st.tuples(st.just("expire"), node_ix, st.booleans()),
        st.tuples(st.just("advance"), st.sampled_from([0.5, 5.0, 20.0, 31.0, 50.0, 120.0])),
        st.tuples(st.just("decide"), st.sampled_from(["approve", "reject"]),
                  st.sampled_from(["bob", "alice"])),
    ]
    if retry:
        choices.append(st.tuples(st.just("retry"), node_ix))
    if cancel:  # one op in ~50: a cancel ends the interesting part of a run
        choices.append(st.tuples(st.just("cancel"), st.integers(0, 3)))
    return st.lists(st.one_of(choices), min_size=8, max_size=40)


# ============================================================================ driver

#: Errors a refused request raises (the plan is never applied).
REFUSED = (Conflict, Forbidden, InputError)
Rule = Callable[[View, Callable[[], str]], Plan]


def fresh_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"e{next(counter):04d}"


@dataclass
class Run:
    """A world plus what the workers were handed and what the invariants track."""

    world: World
    now: float = T0 + 1
    issued: dict[str, list[int]] = field(default_factory=dict)
    commits: dict[str, int] = field(default_factory=dict)
    cancelled: bool = False

    def node(self, ix: int) -> str:
        if ix < 0:
            snaps = self.world.snaps
            for state in (NodeState.RUNNING, NodeState.WAITING):
                found = sorted(n for n, s in snaps.items() if s.state is state)
                if found:
                    return found[-ix % len(found)]
        return list(self.world.dag.nodes)[ix % len(self.world.dag.nodes)]

    def fence(self, node: str, choice: int | str | None) -> int:
        if isinstance(choice, int):
            return choice
        issued = [0, 0, *self.issued.get(node, [])]
        return issued[-1] if choice is None else issued[-2]

    def step(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "advance":
            self.now += op[1]
            return
        if kind == "cancel" and op[1]:
            return
        if kind == "crash":  # a worker claims the first waiting node and goes silent
            waiting = sorted(n for n, s in self.world.snaps.items()
                             if s.state is NodeState.WAITING)
            if waiting:
                self.now = max(self.now, self.world.snaps[waiting[0]].not_before)
                self.step(("claim", op[1], list(self.world.dag.nodes).index(waiting[0])))
            self.now += op[2]
            return
        if kind == "work":  # a worker claims the first waiting node and completes it
            waiting = sorted(n for n, s in self.world.snaps.items()
                             if s.state is NodeState.WAITING)
            if not waiting:
                return
            ix = list(self.world.dag.nodes).index(waiting[0])
            self.now = max(self.now, self.world.snaps[waiting[0]].not_before)
            self.step(("claim", op[1], ix))
            self.step(("complete", op[1], ix, None, op[2]))
            return
        node = ""
        if kind in ("claim", "heartbeat", "progress", "complete"):
            node = self.node(op[2])
        elif kind in ("expire", "retry"):
            node = self.node(op[1])
        elif kind == "decide":
            gates = [n for n, nd in self.world.dag.nodes.items() if nd.type == "human_gateway"]
            node = gates[0] if gates else "n0"
        self.decide_and_apply(self.rule(op, node), op, node)

    def rule(self, op: tuple[Any, ...], node: str) -> Rule:
        kind, now, config = op[0], self.now, self.world.config
        if kind == "claim":
            worker = op[1]
            return lambda v, ids: plan_claim(v, node, worker=worker, lease=LEASE, now=now,
                                             ids=ids)
        if kind == "heartbeat":
            fence = self.fence(node, op[3])
            return lambda v, ids: plan_heartbeat(v, node, fence=fence, lease=LEASE, now=now,
                                                 ids=ids)
        if kind == "progress":
            fence = self.fence(node, op[3])
            return lambda v, ids: plan_progress(v, node, fence=fence, marker="m",
                                                lease=LEASE, now=now, ids=ids)
        if kind == "complete":
            fence, outcome = self.fence(node, op[3]), op[4]
            return lambda v, ids: plan_complete(v, node, fence=fence, outcome=outcome,
                                                now=now, ids=ids, config=config)
        if kind == "expire":
            dead = op[2]
            return lambda v, ids: plan_expire(v, node, now=now, ids=ids, owner_dead=dead)
        if kind == "decide":
            decision, by = op[1], op[2]
            return lambda v, ids: plan_decide(v, node, decision=decision, by=by, comment="",
                                              now=now, ids=ids)
        if kind == "cancel":
            return lambda v, ids: plan_cancel(v, now=now, ids=ids, by="ops")
        assert kind == "retry"
        return lambda v, ids: plan_retry(v, node, input_override=None, now=now, ids=ids,
                                         by="ops")

    def decide_and_apply(self, rule: Rule, op: tuple[Any, ...], node: str) -> None:
        world = self.world
        # The shell preloads the node a worker names; the rule asks for the rest.
        preload = [node] if op[0] in ("claim", "heartbeat", "progress", "complete",
                                      "expire") else []
        # The same decision on every snapshot loaded up front, and on a view that grows
        # one Need at a time: a rule's answer never depends on how it was loaded, and
        # two calls on the same state give the same writes.
        try:
            full = rule(world.view(), fresh_ids())
        except REFUSED as exc:
            with pytest.raises(type(exc)):
                world.decide(lambda v: rule(v, fresh_ids()), preload=preload)
            return
        plan = world.decide(lambda v: rule(v, fresh_ids()), preload=preload)
        assert plan == full, op
        before = dict(world.snaps)
        world.apply(plan)
        self.check_step(op, plan, before, node if op[0] == "retry" else None)
        if plan.result == "claimed":
            self.issued.setdefault(node, []).append(plan.detail.fence)
        if op[0] in ("cancel", "retry") and plan.result == "committed":
            self.cancelled = op[0] == "cancel"
        self.check_state()

    # ------------------------------------------------------------------ invariants

    def check_step(self, op: tuple[Any, ...], plan: Any, before: dict[str, Snapshot],
                   retried: str | None) -> None:
        world = self.world
        after = world.snaps
        if plan.result in ("stale", "already-done", "not-claimable") or (
                plan.result == "ok" and op[0] == "expire"):
            # A refusal or a no-op writes nothing (heartbeat's "ok" renews the lease).
            assert not plan.writes and not plan.events and not plan.enqueue, op
        if plan.result == "stale":
            assert after == before, op
        reset: set[str] = set()
        if retried is not None:
            # A retry re-opens the node, its descendants, and (after a cancel) every
            # cancelled node.
            reset = {retried} | _descendants(world.dag, retried) | {
                n for n, s in before.items() if s.state is NodeState.CANCELLED}
            for nid in reset:
                self.commits[nid] = 0
        for nid, old in before.items():
            new = after[nid]
            # A fence never goes back: it is what makes an old worker's writes stale.
            assert new.fence >= old.fence, (op, nid, old.fence, new.fence)
            # Final is final: only an admin retry reopens a node.
            if old.state in FINAL_STATES and nid not in reset:
                assert new == old, (op, nid, old.state, new.state)
        for nid, new in plan.writes.items():
            old = before[nid]
            if new.state is NodeState.WAITING and (old.state is not NodeState.WAITING
                                                   or old.fence != new.fence):
                # A node made ready is handed to the queue in the same plan (no lost work).
                assert nid in [n for n, _ in plan.enqueue], (op, nid)
        for nid, _ in plan.enqueue:
            assert after[nid].state is NodeState.WAITING, (op, nid, after[nid].state)
        for event in plan.events:
            if event.kind in ("committed", "decided"):
                self.commits[event.node_id] = self.commits.get(event.node_id, 0) + 1
                assert self.commits[event.node_id] == 1, (op, event.node_id, "committed twice")

    def check_state(self) -> None:
        world, dag = self.world, self.world.dag
        for nid, snap in world.snaps.items():
            node = dag.nodes[nid]
            assert snap.attempt <= node.attempts, (nid, snap.attempt, node.attempts)
            if snap.state is NodeState.RUNNING:
                assert snap.owner and snap.lease_until > 0, nid
            if snap.state is NodeState.PENDING:
                # Join bookkeeping equals what the predecessors decided, and a node
                # with nothing left to wait for never stays PENDING.
                preds = [world.snaps[p] for p in dag.predecessors[nid]]
                undecided = [p for p in preds if p.state not in DECIDED_STATES]
                reached = any(h.target_node_id == nid and h.is_taken
                              for p in preds if p.state in DECIDED_STATES
                              for h in p.next_hops)
                assert snap.preds_left == len(undecided), (nid, snap.preds_left, undecided)
                assert snap.reached == reached, nid
                assert snap.preds_left > 0, nid
        # At most one live claim per node: of every fence a claim handed out, at most one
        # still passes a heartbeat now; and claims hand out increasing fences.
        for nid, issued in self.issued.items():
            assert issued == sorted(set(issued)), (nid, issued)
            live = [f for f in issued
                    if plan_heartbeat(world.view([nid]), nid, fence=f, lease=LEASE,
                                      now=self.now, ids=fresh_ids()).result == "ok"]
            assert len(live) <= 1, (nid, live)
        # CANCELLED belongs to a cancelled task only: a retry lifts the cancel from
        # every node, so none can be left out of a running task's status.
        if not self.cancelled:
            assert all(s.state is not NodeState.CANCELLED for s in world.snaps.values()), (
                world.states())
        # The task's counters and status are what its nodes say.
        counts = recount(dag, world.snaps.values())
        assert dict(world.task.counts) == counts
        status = derive_status(counts, self.cancelled)
        assert world.task.status is status
        if status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            # A finished task left nothing behind (only a DEAD node may hold successors).
            assert all(s.state in FINAL_STATES for s in world.snaps.values()), world.states()


def _descendants(dag: Dag, start: str) -> set[str]:
    seen: set[str] = set()
    work = list(dag.nodes[start].targets)
    while work:
        nid = work.pop()
        if nid not in seen:
            seen.add(nid)
            work.extend(dag.nodes[nid].targets)
    return seen


def start(dag: Dag, deadline: float) -> Run:
    world = World.submit(dag, {"seed": 1}, deadline=T0 + deadline if deadline else 0.0,
                         config=RuleConfig(backoff_base=1.0, backoff_cap=8.0,
                                           unavailable_delay=3.0))
    run = Run(world)
    run.check_state()
    return run


# ============================================================================ properties


@SETTINGS
@example(  # a lease that lapses on the last attempt of a node with on_failure
    dag=load_dag_mapping({"name": "prop", "nodes": {
        "n0": {"type": "tool_call", "tool": "echo", "input": "x", "retry": 0,
               "next": ["n1"], "on_failure": "n1"},
        "n1": {"type": "tool_call", "tool": "echo", "input": "y"}}},
        tools=TOOLS, models=MODELS),
    ops=[("claim", "A", 0), ("advance", 31.0), ("expire", 0, False),
         ("work", "A", Success({"v": 1}))],
    deadline=0.0,
)
@given(dag=dags(), ops=operations(), deadline=st.sampled_from([0.0, 0.0, 400.0]))
def test_random_operations_keep_the_invariants(dag: Dag, ops: list[Any],
                                               deadline: float) -> None:
    run = start(dag, deadline)
    for op in ops:
        run.step(op)


@SETTINGS
@example(  # cancel, retry one branch of a join: the other branch is re-opened too
    dag=load_dag_mapping({"name": "prop", "nodes": {
        "n0": {"type": "tool_call", "tool": "echo", "input": "x", "next": ["n1", "n2"]},
        "n1": {"type": "tool_call", "tool": "echo", "input": "x", "next": ["n3"]},
        "n2": {"type": "tool_call", "tool": "echo", "input": "x", "next": ["n3"]},
        "n3": {"type": "tool_call", "tool": "echo", "input": "y"}}},
        tools=TOOLS, models=MODELS),
    ops=[("work", "A", Success({"v": 1})), ("cancel", 0), ("retry", 1),
         *[("work", "A", Success({"v": 1}))] * 5],
)
@given(dag=dags(), ops=operations(cancel=False).flatmap(
    lambda ops: st.lists(st.sampled_from([("cancel", 0), ("retry", 0), ("retry", 1),
                                          ("retry", 2), ("retry", 3)]),
                         min_size=1, max_size=4).map(lambda admin: ops + admin + ops)))
def test_random_operations_with_admin_retries_keep_the_invariants(dag: Dag,
                                                                 ops: list[Any]) -> None:
    """Chaos, then a burst of cancels and retries, then chaos again."""
    run = start(dag, 0.0)
    for op in ops:
        run.step(op)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag=dags(), ops=operations(), retry_from=st.integers(0, 5))
def test_a_healthy_worker_always_drives_the_task_to_an_end(dag: Dag, ops: list[Any],
                                                           retry_from: int) -> None:
    """After any prefix of chaos, a worker that completes everything (approving gates,
    waiting out leases and backoffs) finishes the task: nothing is lost or stuck. A task
    the chaos cancelled is first retried, from a node the retry accepts."""
    run = start(dag, 0.0)
    for op in ops:
        run.step(op)
    if run.world.task.status is TaskStatus.CANCELLED:
        retry_a_cancelled_task(run, retry_from)
    for _ in range(200):
        if run.world.task.status.final:
            break
        snaps = run.world.snaps
        paused = [n for n, s in snaps.items() if s.state is NodeState.PAUSED]
        waiting = [n for n, s in snaps.items() if s.state is NodeState.WAITING]
        if paused:
            run.step(("decide", "approve", "bob"))
        elif waiting:
            run.step(("work", "A", Success({"v": 7})))
        else:  # only lapsed RUNNING nodes left: let the reconciler requeue them
            run.now += 100.0
            for ix in range(len(snaps)):
                run.step(("expire", ix, False))
    task = run.world.task
    assert task.status.final and task.status is not TaskStatus.CANCELLED, (
        run.world.states())
    if task.status is not TaskStatus.DEAD:
        assert all(s.state in FINAL_STATES for s in run.world.snaps.values())


def retry_a_cancelled_task(run: Run, first: int) -> None:
    """Retry from the first node, in DAG order from ``first`` on, that the retry accepts
    (one the task had reached before the cancel): the task runs again."""
    nodes = list(run.world.dag.nodes)
    for k in range(len(nodes)):
        run.step(("retry", (first + k) % len(nodes)))
        if run.world.task.status is not TaskStatus.CANCELLED:
            break
    assert run.world.task.status in (TaskStatus.RUNNING, TaskStatus.PAUSED), (
        run.world.states())


@settings(max_examples=200, deadline=None)
@given(attempt=st.integers(0, 40), key=st.text(max_size=20),
       base=st.floats(0.01, 10.0), cap=st.floats(0.01, 600.0))
def test_backoff_grows_with_the_attempt_and_stays_in_its_jitter_band(
        attempt: int, key: str, base: float, cap: float) -> None:
    config = RuleConfig(backoff_base=base, backoff_cap=cap)
    delay = backoff_delay(attempt, key, config)
    nominal = min(cap, base * 2 ** max(attempt - 1, 0))
    assert 0.8 * nominal <= delay <= 1.2 * nominal * (1 + 1e-12)
    assert delay <= cap  # the cap bounds the jittered delay too
    assert delay == backoff_delay(attempt, key, config)
    # The jitter is a function of the key only, so a later attempt never waits less.
    assert backoff_delay(attempt + 1, key, config) >= delay
