"""Unit tests of the pure transition rules (``axengine.engine._rules``).

Every test builds its state in memory (:class:`tests.engine.rules_kit.World`), calls the
rules directly with an explicit ``now`` and applies the returned plan in memory: no
store, no queue, no event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from axengine.dag import Dag
from axengine.engine._refs import literal_params
from axengine.engine._rules import (
    GATE_TIMEOUT_ACTOR,
    RuleConfig,
    backoff_delay,
    category,
    derive_status,
    four_eyes_violation,
    plan_claim,
    plan_decide,
    plan_heartbeat,
    plan_submit,
    sha256_json,
)
from axengine.engine._view import Need, View
from axengine.errors import Conflict, Forbidden, InputError
from axengine.records import BlobRef, NextHop, NodeState, Snapshot, TaskStatus
from executors.contract import Failure, Success, Unavailable
from tests.engine.rules_kit import T0, World, load

LEASE = 30.0

#: a → (b if output.v > 5) / (c if output.v <= 5); b, c → d (a join).
DIAMOND = """
name: diamond
nodes:
  a:
    type: tool_call
    tool: echo
    input: "{{ input.v }}"
    retry: 1
    timeout: 60
    next:
      - {target: b, condition: "{{ output.v > 5 }}"}
      - {target: c, condition: "{{ output.v <= 5 }}"}
  b: {type: tool_call, tool: echo, input: "{{ nodes.a.output.v }}", next: d}
  c: {type: tool_call, tool: echo, input: small, next: d}
  d: {type: tool_call, tool: echo, input: end}
"""

#: One node with two retries (three attempts) and a successor.
SINGLE = """
name: single
nodes:
  a: {type: tool_call, tool: echo, input: x, retry: 2, timeout: 60, next: b}
  b: {type: tool_call, tool: echo, input: y}
"""

#: A gate between a producer and two routes.
GATE = """
name: gate
nodes:
  a: {type: tool_call, tool: echo, input: x, next: g}
  g:
    type: human_gateway
    description: "approve {{ nodes.a.output }}?"
    input: "{{ nodes.a.output }}"
    timeout: 100
    next:
      - {target: ok, condition: "{{ output.decision == 'approve' }}"}
      - {target: ko, condition: "{{ output.decision == 'reject' }}"}
  ok: {type: tool_call, tool: echo, input: ok}
  ko: {type: tool_call, tool: echo, input: ko}
"""


def at(seconds: float) -> float:
    """A time ``seconds`` after submission."""
    return T0 + seconds


def running(world: World, node_id: str, *, now: float = at(1), worker: str = "w1") -> int:
    """Claim ``node_id`` and return the fence the worker holds."""
    plan = world.claim(node_id, now=now, worker=worker, lease=LEASE)
    assert plan.result == "claimed", plan
    return world.snaps[node_id].fence


def status(world: World) -> TaskStatus:
    """The task's status now (a call, so a type checker does not keep an earlier
    assertion's narrowing across a transition)."""
    return world.task.status


def unchanged(world: World, rule_result: object, before: dict[str, Snapshot]) -> None:
    assert world.snaps == before, rule_result


# ============================================================================ view / Need


def test_a_rule_asks_for_a_snapshot_it_was_not_given() -> None:
    world = World.submit(SINGLE)
    view = View(dag=world.dag, task=world.task, task_rev=1)
    with pytest.raises(Need) as need:
        plan_claim(view, "a", worker="w1", lease=LEASE, now=at(1), ids=world.ids())
    assert need.value.nodes == {"a"}
    assert not need.value.outputs and not need.value.task_input


def test_complete_loads_only_the_targets_it_decides() -> None:
    world = World.submit(DIAMOND, {"v": 9})
    fence = running(world, "a")
    world.complete("a", Success({"v": 9}), fence=fence, now=at(2))
    # a's snapshot was preloaded; the decision needs its two targets in one load, then
    # d, once skipping c counts it off. Nothing else of the task is read.
    assert [n.nodes for n in world.loads] == [frozenset({"b", "c"}), frozenset({"d"})]


def test_a_blob_output_is_requested_when_a_template_reads_it() -> None:
    world = World.submit("""
    name: join
    nodes:
      a: {type: tool_call, tool: echo, input: x, next: j}
      b: {type: tool_call, tool: echo, input: x, next: j}
      j: {type: tool_call, tool: echo, input: "{{ nodes.a.output.v }}"}
    """)
    world.complete("a", Success({"v": 1}), fence=running(world, "a"), now=at(2))
    # The shell keeps a large output in the blob store; the snapshot holds the ref.
    ref = BlobRef(uri="blob://a", sha256="0" * 64, size=100_000)
    world.snaps["a"] = replace(world.snaps["a"], output=None, output_ref=ref)
    world.blobs["a"] = {"v": 7}
    world.complete("b", Success(2), fence=running(world, "b"), now=at(3))
    assert [n.outputs for n in world.loads if n.outputs] == [frozenset({"a"})]
    assert world.snaps["j"].input == {"input": 7}


def test_a_task_input_in_a_blob_is_requested() -> None:
    dag = load(DIAMOND)
    ref = BlobRef(uri="blob://in", sha256="1" * 64, size=8)
    world = World.submit(dag, {"v": 1})
    world.task = replace(world.task, input=None, input_ref=ref)
    view = View(dag=dag, task=world.task, task_rev=1)
    for nid in dag.nodes:
        view.snaps[nid] = Snapshot(task_id="t1", node_id=nid,
                                   preds_left=len(dag.predecessors[nid]))
    with pytest.raises(Need) as need:
        plan_submit(view, now=T0, ids=world.ids())
    assert need.value.task_input
    view.task_input, view.task_input_loaded = {"v": 4}, True
    assert plan_submit(view, now=T0, ids=world.ids()).writes["a"].input == {"input": 4}


# ============================================================================ submit


def test_submit_readies_entry_nodes_and_counts_the_rest_pending() -> None:
    world = World.submit(DIAMOND, {"v": 3})
    assert world.states() == {"a": "WAITING", "b": "PENDING", "c": "PENDING", "d": "PENDING"}
    assert world.queue == [("a", 0.0)]
    assert world.kinds() == ["submitted", "ready"]
    assert world.task.status is TaskStatus.RUNNING
    assert world.task.counts == {"ACTIVE": 1, "PENDING": 3}
    a = world.snaps["a"]
    assert a.input == {"input": 3}
    assert a.input_revision == sha256_json(["t1", "a", {"input": 3}])
    assert (a.ready_at, a.fence, a.attempt) == (T0, 0, 0)
    assert [world.snaps[n].preds_left for n in "bcd"] == [1, 1, 2]


def test_a_fixed_input_readies_as_a_fresh_copy_without_reading_upstream() -> None:
    """A node whose input and prompt hold no template markup readies with them as they
    are (``{{``-free strings stay text), in containers of its own: a handler that changes
    its input changes neither the DAG nor another task's. A templated node still renders."""
    world = World.submit("""
    name: fixed
    nodes:
      a: {type: tool_call, tool: echo, input: {v: 1}, next: [b, c]}
      b:
        type: llm_call
        model: sim
        input: {cfg: {depth: 2, tags: [x, y]}, note: "50% off, no {braces}"}
        prompt: A fixed prompt.
      c: {type: tool_call, tool: echo, input: "{{ nodes.a.output.v }}"}
    """)
    world.complete("a", Success({"v": 5}), fence=running(world, "a"), now=at(2))
    node = world.dag.node("b")
    b = world.snaps["b"].input
    assert b == {"input": node.input, "prompt": "A fixed prompt."}
    assert b["input"] is not node.input
    assert b["input"]["cfg"] is not node.input["cfg"]
    assert b["input"]["cfg"]["tags"] is not node.input["cfg"]["tags"]
    assert world.snaps["c"].input == {"input": 5}
    # b took the fixed path (no context built); c and a templated prompt do not.
    assert literal_params(node) and literal_params(world.dag.node("a"))
    assert not literal_params(world.dag.node("c"))
    assert not literal_params(replace(node, prompt="Hello {{ input.name }}"))


def test_submit_is_deterministic() -> None:
    first = World.submit(DIAMOND, {"v": 3})
    second = World.submit(DIAMOND, {"v": 3})
    assert first.snaps == second.snaps
    assert first.events == second.events


def test_submit_pauses_an_entry_gate_without_enqueueing_it() -> None:
    world = World.submit("""
    name: g
    nodes:
      g: {type: human_gateway, description: "ok?", timeout: 100, next: a}
      a: {type: tool_call, tool: echo, input: x}
    """, now=at(0))
    g = world.snaps["g"]
    assert g.state is NodeState.PAUSED
    assert (g.paused_at, g.gate_until) == (T0, T0 + 100)
    assert g.input == {"input": None, "description": "ok?"}
    assert world.queue == []
    assert world.task.status is TaskStatus.PAUSED


def test_submit_fails_an_entry_node_whose_input_does_not_render() -> None:
    world = World.submit(SINGLE.replace("input: x", "input: '{{ input.missing }}'"), {"v": 1})
    a = world.snaps["a"]
    assert a.state is NodeState.FAILED
    assert "input template" in a.error and not a.error_retryable
    assert world.state("b") is NodeState.SKIPPED
    assert world.queue == []
    assert world.task.status is TaskStatus.FAILED


# ============================================================================ claim


def test_claim_takes_a_waiting_node_under_a_new_fence_and_lease() -> None:
    world = World.submit(SINGLE)
    plan = world.claim("a", now=at(5), worker="w1", lease=LEASE)
    a = world.snaps["a"]
    assert plan.result == "claimed"
    assert (a.state, a.fence, a.attempt, a.owner) == (NodeState.RUNNING, 1, 1, "w1")
    assert a.lease_until == at(5) + LEASE
    assert a.started_at == a.heartbeat_at == a.progress_at == at(5)
    assert plan.detail.fence == 1 and plan.detail.owner == "w1"
    assert world.kinds("a") == ["ready", "claimed"]
    assert plan.enqueue == []


def test_claim_caps_the_lease_at_the_task_deadline() -> None:
    world = World.submit(SINGLE, deadline=at(10))
    world.claim("a", now=at(5), lease=LEASE)
    assert world.snaps["a"].lease_until == at(10)


@pytest.mark.parametrize("state", [NodeState.PENDING, NodeState.PAUSED, NodeState.SUCCEEDED,
                                   NodeState.FAILED, NodeState.SKIPPED, NodeState.DEAD,
                                   NodeState.CANCELLED])
def test_only_waiting_or_lapsed_running_nodes_are_claimable(state: NodeState) -> None:
    world = World.submit(SINGLE)
    world.snaps["a"] = replace(world.snaps["a"], state=state)
    before = dict(world.snaps)
    plan = world.claim("a", now=at(1))
    assert plan.result == "not-claimable"
    assert plan.detail == (state.value, 0.0)
    assert not plan.writes and not plan.events
    unchanged(world, plan, before)


def test_a_second_claim_under_a_live_lease_is_refused() -> None:
    world = World.submit(SINGLE)
    running(world, "a", now=at(1), worker="w1")
    before = dict(world.snaps)
    plan = world.claim("a", now=at(11), worker="w2")
    assert plan.result == "not-claimable"
    assert plan.detail == ("leased", pytest.approx(20.0))
    unchanged(world, plan, before)


def test_claim_during_backoff_is_refused_until_not_before() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a")
    world.complete("a", Failure("flaky"), fence=fence, now=at(2))
    not_before = world.snaps["a"].not_before
    early = world.claim("a", now=not_before - 0.5)
    assert early.result == "not-claimable"
    assert early.detail == ("backoff", pytest.approx(0.5))
    assert world.claim("a", now=not_before).result == "claimed"


def test_claim_takes_over_a_running_node_whose_lease_expired() -> None:
    world = World.submit(SINGLE)
    old = running(world, "a", now=at(1), worker="w1")
    plan = world.claim("a", now=at(1) + LEASE, worker="w2")  # lease_until reached
    a = world.snaps["a"]
    assert plan.result == "claimed"
    assert (a.fence, a.attempt, a.owner) == (old + 1, 2, "w2")
    assert world.kinds("a")[-2:] == ["lease_expired", "claimed"]
    # The old owner is fenced out of every write.
    assert world.heartbeat("a", fence=old, now=at(32)).result == "stale"
    assert world.complete("a", Success(1), fence=old, now=at(32)).result == "stale"


def test_claim_takes_over_a_node_that_heartbeats_without_progress() -> None:
    world = World.submit("""
    name: stall
    nodes:
      a: {type: tool_call, tool: echo, input: x, timeout: 100, stall_timeout: 20}
    """)
    fence = running(world, "a", now=at(0))
    for t in (10, 20, 30):
        assert world.heartbeat("a", fence=fence, now=at(t), lease=LEASE).result == "ok"
    # The lease is live (renewed at 30) but nothing progressed for 30 s > stall 20 s.
    assert world.claim("a", now=at(30), worker="w2").result == "claimed"
    assert world.snaps["a"].owner == "w2"


def test_progress_keeps_a_heartbeating_node_from_being_taken_over() -> None:
    world = World.submit("""
    name: stall
    nodes:
      a: {type: tool_call, tool: echo, input: x, timeout: 100, stall_timeout: 20}
    """)
    fence = running(world, "a", now=at(0))
    assert world.progress("a", fence=fence, now=at(15)).result == "ok"
    assert world.claim("a", now=at(30), worker="w2").result == "not-claimable"


def test_claim_past_the_task_deadline_makes_the_node_dead() -> None:
    world = World.submit(SINGLE, deadline=at(100))
    plan = world.claim("a", now=at(100))
    assert plan.result == "dead"
    a = world.snaps["a"]
    assert a.state is NodeState.DEAD and a.error == "task deadline passed"
    assert a.attempt == 0  # no attempt was started
    assert world.state("b") is NodeState.PENDING  # a person decides what happens next
    assert world.task.status is TaskStatus.DEAD


def test_claim_after_the_queue_timeout_makes_the_node_dead() -> None:
    world = World.submit(SINGLE.replace("timeout: 60", "timeout: 60, queue_timeout: 10"))
    assert world.claim("a", now=at(10)).result == "claimed"  # exactly the bound: still ok
    world2 = World.submit(SINGLE.replace("timeout: 60", "timeout: 60, queue_timeout: 10"))
    plan = world2.claim("a", now=at(10.5))
    assert plan.result == "dead"
    assert "queue_timeout 10s" in world2.snaps["a"].error


def test_queue_timeout_does_not_count_the_previous_attempt_as_queue_wait() -> None:
    world = World.submit(SINGLE.replace("timeout: 60", "timeout: 300, queue_timeout: 60")
                         .replace("retry: 2", "retry: 5"))
    fence = running(world, "a", now=at(1))
    world.heartbeat("a", fence=fence, now=at(25), lease=100)
    world.complete("a", Failure("flaky"), fence=fence, now=at(100))  # ran 99 s, retryable
    retry_at = world.snaps["a"].not_before  # offered again ~1 s later
    plan = world.claim("a", now=retry_at)
    assert plan.result == "claimed", world.snaps["a"].error  # was "waited 101s for a worker"
    # The queue wait counts from the end of the backoff, and no longer.
    world.complete("a", Failure("flaky again"), fence=plan.detail.fence, now=retry_at + 5)
    again = world.snaps["a"].not_before
    assert world.claim("a", now=again + 60).result == "claimed"  # exactly the bound
    world.complete("a", Failure("and again"), fence=world.snaps["a"].fence,
                   now=again + 61)
    third = world.snaps["a"].not_before
    plan = world.claim("a", now=third + 60.5)
    assert plan.result == "dead" and "waited 60s for a worker" in world.snaps["a"].error


def test_queue_timeout_restarts_when_an_expired_lease_puts_the_node_back() -> None:
    world = World.submit(SINGLE.replace("timeout: 60", "timeout: 300, queue_timeout: 60"))
    running(world, "a", now=at(1))
    world.expire("a", now=at(1) + LEASE + 1)  # lapsed after the lease; ran long before
    a = world.snaps["a"]
    assert a.state is NodeState.WAITING and a.not_before == at(1) + LEASE + 1
    assert world.claim("a", now=a.not_before + 59).result == "claimed"


def test_claim_of_a_lapsed_node_on_its_last_attempt_makes_it_dead() -> None:
    world = World.submit(SINGLE.replace("retry: 2", "retry: 0"))
    running(world, "a", now=at(0))
    plan = world.claim("a", now=at(LEASE), worker="w2")
    assert plan.result == "dead"
    a = world.snaps["a"]
    assert a.state is NodeState.DEAD
    assert a.error.startswith("attempts exhausted (1/1)")
    assert (a.attempt, a.owner, a.lease_until) == (1, "", 0.0)
    assert world.kinds("a")[-2:] == ["lease_expired", "dead"]


# ============================================================================ heartbeat / progress


def test_heartbeat_renews_the_lease_only() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(1))
    events = len(world.events)
    plan = world.heartbeat("a", fence=fence, now=at(20), lease=50)
    a = world.snaps["a"]
    assert plan.result == "ok"
    assert (a.lease_until, a.heartbeat_at) == (at(70), at(20))
    assert a.progress_at == at(1)  # a heartbeat is never progress
    assert (a.fence, a.attempt) == (fence, 1)
    assert len(world.events) == events  # no event per heartbeat


def test_heartbeat_lease_never_outlives_the_deadline() -> None:
    world = World.submit(SINGLE, deadline=at(40))
    fence = running(world, "a", now=at(1))
    world.heartbeat("a", fence=fence, now=at(20), lease=LEASE)
    assert world.snaps["a"].lease_until == at(40)


@pytest.mark.parametrize("fence_delta", [-1, 1, 5])
def test_heartbeat_and_progress_with_a_wrong_fence_are_stale(fence_delta: int) -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(1))
    before = dict(world.snaps)
    for plan in (world.heartbeat("a", fence=fence + fence_delta, now=at(2)),
                 world.progress("a", fence=fence + fence_delta, now=at(2))):
        assert plan.result == "stale"
        assert not plan.writes and not plan.events and not plan.enqueue
    unchanged(world, "stale", before)


def test_heartbeat_is_accepted_up_to_the_lease_end_and_stale_after() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(0))
    assert world.heartbeat("a", fence=fence, now=at(LEASE), lease=LEASE).result == "ok"
    assert world.heartbeat("a", fence=fence, now=at(2 * LEASE + 0.1)).result == "stale"


def test_heartbeat_of_a_node_that_is_not_running_is_stale() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(0))
    world.complete("a", Success(1), fence=fence, now=at(1))
    assert world.heartbeat("a", fence=fence, now=at(2)).result == "stale"


def test_progress_records_a_checkpoint_and_renews_the_lease() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(1))
    plan = world.progress("a", fence=fence, now=at(9), marker="page-" + "x" * 300, lease=40)
    a = world.snaps["a"]
    assert plan.result == "ok"
    assert (a.progress_at, a.heartbeat_at, a.lease_until) == (at(9), at(9), at(49))
    assert a.progress_marker == ("page-" + "x" * 300)[:200]
    assert world.events[-1].kind == "progress" and world.events[-1].fence == fence


# ============================================================================ complete


def test_success_commits_and_routes_through_the_guards() -> None:
    world = World.submit(DIAMOND, {"v": 9})
    fence = running(world, "a")
    plan = world.complete("a", Success({"v": 9}), fence=fence, now=at(3))
    a = world.snaps["a"]
    assert plan.result == "committed"
    assert a.state is NodeState.SUCCEEDED and a.output == {"v": 9}
    assert a.output_sha256 == sha256_json({"v": 9})
    assert a.next_hops == (NextHop("b", True), NextHop("c", False))
    assert (a.finished_at, a.lease_until) == (at(3), 0.0)
    assert world.state("b") is NodeState.WAITING
    assert world.snaps["b"].input == {"input": 9}  # rendered from a's output
    assert world.state("c") is NodeState.SKIPPED
    assert world.snaps["c"].next_hops == (NextHop("d", False),)
    # d is a join: b is still to decide, so it waits.
    assert world.state("d") is NodeState.PENDING
    assert (world.snaps["d"].preds_left, world.snaps["d"].reached) == (1, False)
    assert plan.enqueue == [("b", 0.0)]
    assert [e.kind for e in plan.events] == ["committed", "ready", "skipped"]


def test_the_other_guard_takes_the_other_branch() -> None:
    world = World.submit(DIAMOND, {"v": 1})
    fence = running(world, "a")
    world.complete("a", Success({"v": 1}), fence=fence, now=at(3))
    assert (world.state("b"), world.state("c")) == (NodeState.SKIPPED, NodeState.WAITING)


def test_a_join_runs_once_every_predecessor_is_decided() -> None:
    world = World.submit(DIAMOND, {"v": 9})
    world.complete("a", Success({"v": 9}), fence=running(world, "a"), now=at(3))
    world.complete("b", Success("B"), fence=running(world, "b", now=at(4)), now=at(5))
    d = world.snaps["d"]
    assert d.state is NodeState.WAITING
    assert (d.preds_left, d.reached) == (0, True)
    world.complete("d", Success("D"), fence=running(world, "d", now=at(6)), now=at(7))
    assert world.task.status is TaskStatus.SUCCEEDED
    assert world.task.counts == {"SKIPPED": 1, "SUCCEEDED": 3}


def test_nodes_no_taken_edge_reaches_are_skipped_down_the_chain() -> None:
    world = World.submit("""
    name: chain
    nodes:
      a:
        type: tool_call
        tool: echo
        input: x
        next: [{target: b, condition: "{{ output == 'go' }}"}]
      b: {type: tool_call, tool: echo, input: x, next: c}
      c: {type: tool_call, tool: echo, input: x, next: d}
      d: {type: tool_call, tool: echo, input: x}
    """)
    plan = world.complete("a", Success("stop"), fence=running(world, "a"), now=at(2))
    assert [world.state(n) for n in "bcd"] == [NodeState.SKIPPED] * 3
    assert [e.kind for e in plan.events] == ["committed", "skipped", "skipped", "skipped"]
    assert world.task.status is TaskStatus.SUCCEEDED


def test_a_repeat_of_the_committed_result_is_already_done() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a")
    world.complete("a", Success({"x": 1}), fence=fence, now=at(2))
    before = dict(world.snaps)
    repeat = world.complete("a", Success({"x": 1}), fence=fence, now=at(3))
    assert repeat.result == "already-done" and not repeat.writes and not repeat.events
    other = world.complete("a", Success({"x": 2}), fence=fence, now=at(3))
    assert other.result == "stale"
    older = world.complete("a", Success({"x": 1}), fence=fence - 1, now=at(3))
    assert older.result == "stale"
    failure = world.complete("a", Failure("late"), fence=fence, now=at(3))
    assert failure.result == "stale"
    unchanged(world, "repeats", before)


@pytest.mark.parametrize("outcome", [Success(1), Failure("x"), Failure("x", retryable=False),
                                     Unavailable("db", "down")])
def test_complete_with_a_stale_fence_changes_nothing(outcome: object) -> None:
    world = World.submit(SINGLE)
    old = running(world, "a", now=at(0))
    world.claim("a", now=at(LEASE + 1), worker="w2")  # took over: fence old+1
    before = dict(world.snaps)
    plan = world.complete("a", outcome, fence=old, now=at(LEASE + 2))  # type: ignore[arg-type]
    assert plan.result == "stale"
    assert not plan.writes and not plan.events and not plan.enqueue
    unchanged(world, plan, before)


def test_complete_after_the_lease_lapsed_is_stale_even_without_a_takeover() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(0))
    assert world.complete("a", Success(1), fence=fence, now=at(LEASE + 0.1)).result == "stale"
    assert world.state("a") is NodeState.RUNNING


def test_a_retryable_failure_backs_off_while_attempts_remain() -> None:
    config = RuleConfig(backoff_base=2.0, backoff_cap=100.0)
    world = World.submit(SINGLE, config=config)
    fence = running(world, "a", now=at(1))
    plan = world.complete("a", Failure("flaky " * 1000), fence=fence, now=at(5))
    a = world.snaps["a"]
    delay = backoff_delay(1, "t1/a/1", config)
    assert plan.result == "committed"
    assert (a.state, a.owner, a.lease_until) == (NodeState.WAITING, "", 0.0)
    assert (a.fence, a.attempt) == (fence, 1)  # the next claim moves both
    assert a.error == ("flaky " * 1000)[:2000] and a.error_retryable
    assert a.not_before == pytest.approx(at(5) + delay)
    assert plan.enqueue == [("a", delay)]
    assert world.events[-1].kind == "retry"
    assert world.task.status is TaskStatus.RUNNING
    # Second attempt, second failure: the delay doubles (before jitter).
    fence = running(world, "a", now=a.not_before)
    world.complete("a", Failure("flaky"), fence=fence, now=a.not_before + 1)
    assert world.queue[-1] == ("a", backoff_delay(2, "t1/a/2", config))


def test_a_retryable_failure_on_the_last_attempt_is_dead() -> None:
    world = World.submit(SINGLE.replace("retry: 2", "retry: 1"))
    t = at(1)
    for _ in range(2):
        fence = running(world, "a", now=t)
        plan = world.complete("a", Failure("flaky"), fence=fence, now=t + 1)
        t = max(t + 2, world.snaps["a"].not_before)
    a = world.snaps["a"]
    assert plan.result == "committed" and a.attempt == 2
    assert a.state is NodeState.DEAD
    assert a.error == "attempts exhausted (2/2): flaky"
    assert world.state("b") is NodeState.PENDING  # successors wait for a person
    assert world.task.status is TaskStatus.DEAD
    assert plan.enqueue == []


def test_a_non_retryable_failure_fails_the_node_and_skips_its_successors() -> None:
    world = World.submit(SINGLE)
    plan = world.complete("a", Failure("bad input", retryable=False),
                          fence=running(world, "a"), now=at(2))
    a = world.snaps["a"]
    assert a.state is NodeState.FAILED and a.error == "bad input" and not a.error_retryable
    assert a.attempt == 1  # the remaining attempts were not spent
    assert world.state("b") is NodeState.SKIPPED
    assert world.task.status is TaskStatus.FAILED
    assert [e.kind for e in plan.events] == ["failed", "skipped"]


def test_a_failure_routes_to_on_failure_when_the_node_has_one() -> None:
    world = World.submit("""
    name: routed
    nodes:
      a: {type: tool_call, tool: echo, input: x, retry: 0, next: b, on_failure: alert}
      b: {type: tool_call, tool: echo, input: x}
      alert: {type: tool_call, tool: echo, input: "{{ nodes.a.output }}"}
    """)
    world.complete("a", Failure("flaky"), fence=running(world, "a"), now=at(2))
    a = world.snaps["a"]
    assert a.state is NodeState.FAILED
    assert a.next_hops == (NextHop("b", False), NextHop("alert", True))
    assert (world.state("b"), world.state("alert")) == (NodeState.SKIPPED, NodeState.WAITING)
    assert world.snaps["alert"].input == {"input": None}  # a has no output
    assert category(world.dag.nodes["a"], a) == "FAILED"  # routed: not a task failure
    assert world.task.status is TaskStatus.RUNNING
    world.complete("alert", Success("sent"), fence=running(world, "alert"), now=at(3))
    assert status(world) is TaskStatus.SUCCEEDED


def test_unavailable_keeps_the_node_waiting_and_refunds_the_attempt() -> None:
    config = RuleConfig(unavailable_delay=7.0)
    world = World.submit(SINGLE.replace("retry: 2", "retry: 0"), config=config)
    t = at(1)
    for _ in range(3):  # more rounds than attempts: an outage never spends the budget
        fence = running(world, "a", now=t)
        plan = world.complete("a", Unavailable("llm", "circuit open " * 200), fence=fence,
                              now=t + 1)
        a = world.snaps["a"]
        assert (a.state, a.attempt, a.owner) == (NodeState.WAITING, 0, "")
        assert a.evidence == ("llm: " + "circuit open " * 200)[:1000]
        assert a.not_before == t + 1 + 7.0
        assert plan.enqueue == [("a", 7.0)]
        assert world.events[-1].kind == "unavailable"
        t = a.not_before
    assert world.claim("a", now=t).detail.evidence == ""  # a claim clears the evidence


def test_a_guard_that_cannot_be_evaluated_fails_the_node() -> None:
    world = World.submit(DIAMOND, {"v": 9})
    plan = world.complete("a", Success({"other": 1}), fence=running(world, "a"), now=at(2))
    a = world.snaps["a"]
    assert plan.result == "committed"
    assert a.state is NodeState.FAILED and a.error.startswith("guard on a:")
    assert [world.state(n) for n in "bcd"] == [NodeState.SKIPPED] * 3
    assert world.task.status is TaskStatus.FAILED


def test_a_condition_is_evaluated_inline_when_its_predecessor_commits() -> None:
    world = World.submit("""
    name: cond
    nodes:
      a: {type: tool_call, tool: echo, input: x, next: c}
      c:
        type: condition
        expression: |
          if .output.v > 5: big
          else: small
        next:
          - {target: big, when: big}
          - {target: small, when: small}
      big: {type: llm_call, model: sim, input: {name: bob}, prompt: "hi {{ .node.input.name }}"}
      small: {type: tool_call, tool: echo, input: s}
    """)
    plan = world.complete("a", Success({"v": 8}), fence=running(world, "a"), now=at(2))
    c = world.snaps["c"]
    assert (c.state, c.output, c.attempt, c.fence) == (NodeState.SUCCEEDED, "big", 1, 1)
    assert c.input == {"output": {"v": 8}}
    assert c.next_hops == (NextHop("big", True), NextHop("small", False))
    assert world.snaps["big"].input == {"input": {"name": "bob"}, "prompt": "hi bob"}
    assert world.state("small") is NodeState.SKIPPED
    assert plan.enqueue == [("big", 0.0)]


# ============================================================================ decide (gates)


def gate_world(**submit: object) -> World:
    world = World.submit(GATE, **submit)  # type: ignore[arg-type]
    world.complete("a", Success("report"), fence=running(world, "a"), now=at(2))
    assert world.state("g") is NodeState.PAUSED
    return world


def test_a_gate_pauses_the_task_until_someone_decides() -> None:
    world = gate_world()
    g = world.snaps["g"]
    assert (g.paused_at, g.gate_until) == (at(2), at(102))
    assert g.input == {"input": "report", "description": "approve report?"}
    assert world.task.status is TaskStatus.PAUSED
    assert ("g", 0.0) not in world.queue
    assert world.claim("g", now=at(3)).result == "not-claimable"


def test_an_approval_with_edits_passes_the_corrected_data_on() -> None:
    world = gate_world()
    edits = {"input": "report v2", "note": None}
    plan = world.decide_gate("g", "approve", now=at(12), by="bob", comment="typo",
                             data=edits)
    g = world.snaps["g"]
    assert plan.result == "committed"
    assert g.output["data"] == edits and g.input != edits
    assert g.decision is not None and g.decision["edited"] is True
    assert ("decided", "approve with edits by bob: typo") in [(e.kind, e.detail)
                                                              for e in plan.events]
    # None is data too: an approver may clear everything.
    cleared = gate_world()
    cleared.decide_gate("g", "approve", now=at(12), data=None)
    assert cleared.snaps["g"].output["data"] is None


def test_a_rejection_with_edits_is_refused_and_changes_nothing() -> None:
    world = gate_world()
    with pytest.raises(InputError, match="edits go with an approval"):
        world.decide_gate("g", "reject", now=at(12), data={"x": 1})
    assert world.snaps["g"].state is NodeState.PAUSED


@pytest.mark.parametrize(("decision", "taken", "skipped"),
                         [("approve", "ok", "ko"), ("reject", "ko", "ok")])
def test_a_decision_commits_the_gate_and_routes_on_it(decision: str, taken: str,
                                                      skipped: str) -> None:
    world = gate_world()
    plan = world.decide_gate("g", decision, now=at(12), by="bob", comment="fine")
    g = world.snaps["g"]
    assert plan.result == "committed"
    assert g.state is NodeState.SUCCEEDED
    assert g.decision == {"decision": decision, "by": "bob", "at": at(12), "comment": "fine"}
    # The output is the record and what was reviewed, passed on as it was.
    assert g.output == {**g.decision, "data": "report"}
    assert (g.paused_seconds, g.paused_at, g.attempt) == (10.0, 0.0, 1)
    assert world.state(taken) is NodeState.WAITING
    assert world.state(skipped) is NodeState.SKIPPED
    assert world.task.status is TaskStatus.RUNNING
    assert world.events[len(world.events) - len(plan.events)].actor == "bob"


def test_the_same_decision_again_is_already_done_and_the_opposite_conflicts() -> None:
    world = gate_world()
    world.decide_gate("g", "approve", now=at(5))
    before = dict(world.snaps)
    assert world.decide_gate("g", "approve", now=at(6)).result == "already-done"
    with pytest.raises(Conflict, match="already decided: approve by bob"):
        world.decide_gate("g", "reject", now=at(6))
    unchanged(world, "decide", before)


def test_a_gate_that_is_not_waiting_cannot_be_decided() -> None:
    world = World.submit(GATE)
    with pytest.raises(Conflict, match="is PENDING"):
        world.decide_gate("g", "approve", now=at(1))
    world = gate_world()
    world.cancel(now=at(3))
    with pytest.raises(Conflict, match="is CANCELLED"):
        world.decide_gate("g", "approve", now=at(4))


@pytest.mark.parametrize(("node", "decision", "message"), [
    ("g", "maybe", "decision must be"),
    ("a", "approve", "not a human_gateway"),
    ("zz", "approve", "no node 'zz'"),
])
def test_decide_refuses_bad_requests(node: str, decision: str, message: str) -> None:
    world = gate_world()
    with pytest.raises(InputError, match=message):
        world.decide_gate(node, decision, now=at(3))


def test_four_eyes_refuses_the_submitter_on_a_four_eyes_gate() -> None:
    world = World.submit(GATE.replace("timeout: 100", "timeout: 100\n    four_eyes: true"),
                         submitted_by="alice")
    world.complete("a", Success("r"), fence=running(world, "a"), now=at(2))
    with pytest.raises(Forbidden, match="'alice' submitted this task"):
        world.decide_gate("g", "approve", now=at(3), by="alice")
    assert world.state("g") is NodeState.PAUSED
    assert world.decide_gate("g", "approve", now=at(3), by="bob").result == "committed"


def test_four_eyes_as_the_deployment_rule_applies_to_every_gate() -> None:
    world = gate_world(submitted_by="alice")
    assert world.dag.nodes["g"].four_eyes is False
    with pytest.raises(Forbidden):
        world.decide_gate("g", "approve", now=at(3), by="alice", four_eyes=True)
    # Without the deployment rule the submitter may decide a plain gate.
    assert world.decide_gate("g", "approve", now=at(3), by="alice").result == "committed"


def test_four_eyes_without_a_recorded_submitter_refuses_everyone_but_the_timeout() -> None:
    node = replace(load(GATE).nodes["g"], four_eyes=True)
    assert four_eyes_violation(node, "", "bob") is not None
    assert "no recorded submitter" in (four_eyes_violation(node, "", "bob") or "")
    assert four_eyes_violation(node, "", GATE_TIMEOUT_ACTOR) is None
    assert four_eyes_violation(node, "alice", "alice") is not None
    assert four_eyes_violation(node, "alice", "bob") is None
    plain = load(GATE).nodes["g"]
    assert four_eyes_violation(plain, "alice", "alice") is None
    assert four_eyes_violation(plain, "alice", "alice", four_eyes=True) is not None


def test_decide_checks_four_eyes_before_anything_is_written() -> None:
    world = gate_world(submitted_by="")
    view = world.view()
    with pytest.raises(Forbidden):
        plan_decide(view, "g", decision="approve", by="bob", comment="", now=at(3),
                    ids=world.ids(), four_eyes=True)


# ============================================================================ expire


def test_expire_requeues_a_running_node_whose_lease_lapsed() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(0))
    assert world.expire("a", now=at(LEASE)).result == "ok"  # lease_until itself: still held
    plan = world.expire("a", now=at(LEASE + 0.1))
    a = world.snaps["a"]
    assert plan.result == "committed"
    assert (a.state, a.fence, a.attempt, a.owner) == (NodeState.WAITING, fence + 1, 1, "")
    assert a.error == "lease expired" and a.error_retryable
    assert plan.enqueue == [("a", 0.0)]
    assert world.events[-1].kind == "lease_expired" and world.events[-1].actor == "reconciler"
    assert world.complete("a", Success(1), fence=fence, now=at(LEASE + 1)).result == "stale"
    assert world.claim("a", now=at(LEASE + 1)).detail.attempt == 2


def test_expire_requeues_a_live_lease_whose_owner_is_dead() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(0))
    assert world.expire("a", now=at(5)).result == "ok"
    world.expire("a", now=at(5), owner_dead=True)
    a = world.snaps["a"]
    assert (a.state, a.fence, a.error) == (NodeState.WAITING, fence + 1,
                                           "owner process is gone")


def test_expire_requeues_a_node_that_made_no_progress() -> None:
    world = World.submit("""
    name: stall
    nodes:
      a: {type: tool_call, tool: echo, input: x, timeout: 100, stall_timeout: 20}
    """)
    fence = running(world, "a", now=at(0))
    world.heartbeat("a", fence=fence, now=at(15))
    assert world.expire("a", now=at(10)).result == "ok"  # half the window: nothing
    world.expire("a", now=at(20))  # at the window: a note, still running
    world.expire("a", now=at(21))  # past it, resources unknown: a warning, no fence
    assert world.state("a") is NodeState.RUNNING
    assert world.kinds("a")[-2:] == ["stall_note", "stall_warning"]
    world.expire("a", now=at(26))  # past the window's 25% grace for unknown resources
    assert world.state("a") is NodeState.WAITING
    assert world.snaps["a"].error.startswith("no progress for 26 s in step (none yet)")
    assert world.snaps["a"].error.endswith("→ fence out")


def test_expire_on_the_last_attempt_makes_the_node_dead() -> None:
    world = World.submit(SINGLE.replace("retry: 2", "retry: 0"))
    running(world, "a", now=at(0))
    plan = world.expire("a", now=at(LEASE + 1))
    a = world.snaps["a"]
    assert plan.result == "committed" and plan.enqueue == []
    assert a.state is NodeState.DEAD
    assert a.error == "lease expired on the last attempt (1/1)"
    assert world.state("b") is NodeState.PENDING
    assert world.task.status is TaskStatus.DEAD


ROUTED = """
name: routed
nodes:
  a: {type: tool_call, tool: echo, input: x, retry: 0, timeout: 60, next: b, on_failure: alert}
  b: {type: tool_call, tool: echo, input: x}
  alert: {type: tool_call, tool: echo, input: x}
"""


def _lapsed_last_attempt_expired(world: World) -> None:
    running(world, "a", now=at(0))
    world.expire("a", now=at(LEASE + 1))


def _lapsed_last_attempt_claimed(world: World) -> None:
    running(world, "a", now=at(0))
    world.claim("a", now=at(LEASE + 1), worker="w2")


def _past_deadline_expired(world: World) -> None:
    world.expire("a", now=at(500))


def _past_deadline_claimed(world: World) -> None:
    world.claim("a", now=at(500))


def _past_queue_timeout_claimed(world: World) -> None:
    world.claim("a", now=at(100))


@pytest.mark.parametrize("fail", [
    _lapsed_last_attempt_expired, _lapsed_last_attempt_claimed, _past_deadline_expired,
    _past_deadline_claimed, _past_queue_timeout_claimed,
], ids=lambda f: f.__name__.strip("_"))
def test_a_dead_end_with_on_failure_routes_to_it(fail: Callable[[World], None]) -> None:
    """A claim or an expiry that ends a node for good settles it as a completion does:
    the on_failure node is readied (and queued), the other successor skipped."""
    text = ROUTED.replace("timeout: 60", "timeout: 60, queue_timeout: 50")
    world = World.submit(text, deadline=at(400))
    fail(world)
    a = world.snaps["a"]
    assert a.state is NodeState.FAILED and (a.owner, a.lease_until) == ("", 0.0)
    assert a.next_hops == (NextHop("b", False), NextHop("alert", True))
    assert (world.state("b"), world.state("alert")) == (NodeState.SKIPPED, NodeState.WAITING)
    assert world.queue[-1] == ("alert", 0.0)
    assert status(world) is TaskStatus.RUNNING


def test_a_failure_routed_by_complete_counts_its_successors_off() -> None:
    """The same route taken through plan_complete (the path that always settled)."""
    world = World.submit(ROUTED)
    world.complete("a", Failure("late", retryable=False), fence=running(world, "a"),
                   now=at(2))
    assert (world.state("b"), world.state("alert")) == (NodeState.SKIPPED, NodeState.WAITING)


@pytest.mark.parametrize("setup", ["waiting", "running"])
def test_expire_past_the_task_deadline_makes_unfinished_nodes_dead(setup: str) -> None:
    # (A PAUSED task's deadline does not run: tests/engine/test_pause.py.)
    world = World.submit(GATE, deadline=at(50))
    node = "a"
    if setup == "running":
        running(world, "a", now=at(1))
    world.expire(node, now=at(50))
    snap = world.snaps[node]
    assert snap.state is NodeState.DEAD and snap.error == "task deadline passed"
    assert world.task.status is TaskStatus.DEAD


@pytest.mark.parametrize(("on_timeout", "taken"), [(None, "ko"), ("approve", "ok")])
def test_expire_times_out_a_gate_with_its_default_route(on_timeout: str | None,
                                                        taken: str) -> None:
    text = GATE if on_timeout is None else GATE.replace(
        "timeout: 100", f"timeout: 100\n    on_timeout: {on_timeout}")
    world = World.submit(text.replace("timeout: 100", "timeout: 100\n    four_eyes: true"),
                         submitted_by="")
    world.complete("a", Success("r"), fence=running(world, "a"), now=at(2))
    assert world.expire("g", now=at(101)).result == "ok"  # gate_until is 102
    plan = world.expire("g", now=at(102))
    g = world.snaps["g"]
    assert plan.result == "committed"
    assert g.decision is not None and g.decision["by"] == GATE_TIMEOUT_ACTOR
    assert g.decision["comment"] == "no decision within 100s"
    assert world.state(taken) is NodeState.WAITING


@pytest.mark.parametrize("state", [NodeState.PENDING, NodeState.SUCCEEDED, NodeState.DEAD,
                                   NodeState.CANCELLED, NodeState.WAITING])
def test_expire_leaves_other_nodes_alone(state: NodeState) -> None:
    world = World.submit(SINGLE, deadline=at(1000))
    world.snaps["a"] = replace(world.snaps["a"], state=state)
    before = dict(world.snaps)
    plan = world.expire("a", now=at(999), owner_dead=True)
    assert plan.result == "ok" and not plan.writes and not plan.events
    unchanged(world, plan, before)


# ============================================================================ cancel


def test_cancel_fences_out_every_unfinished_node() -> None:
    world = World.submit(DIAMOND, {"v": 9})
    world.complete("a", Success({"v": 9}), fence=running(world, "a"), now=at(2))
    fence_b = running(world, "b", now=at(3))
    done = dict(world.snaps)
    plan = world.cancel(now=at(4), by="ops")
    assert plan.result == "committed"
    assert world.states() == {"a": "SUCCEEDED", "b": "CANCELLED", "c": "SKIPPED",
                              "d": "CANCELLED"}
    assert world.snaps["a"] == done["a"] and world.snaps["c"] == done["c"]
    assert world.snaps["b"].fence == fence_b + 1 and world.snaps["b"].owner == ""
    assert world.snaps["d"].fence == 1
    assert world.task.status is TaskStatus.CANCELLED
    assert {e.node_id for e in plan.events} == {"b", "d"}
    assert world.complete("b", Success(1), fence=fence_b, now=at(5)).result == "stale"
    assert world.heartbeat("b", fence=fence_b, now=at(5)).result == "stale"


def test_cancel_of_a_finished_task_is_already_done() -> None:
    world = World.submit(SINGLE)
    world.cancel(now=at(1))
    assert world.cancel(now=at(2)).result == "already-done"
    finished = World.submit(SINGLE.replace("retry: 2", "retry: 0"))
    finished.complete("a", Failure("no", retryable=False), fence=running(finished, "a"),
                      now=at(2))
    assert finished.task.status is TaskStatus.FAILED
    plan = finished.cancel(now=at(3))
    assert plan.result == "already-done" and not plan.writes and plan.task is None


# ============================================================================ retry


def test_retry_reruns_a_node_and_its_descendants_only() -> None:
    world = World.submit(DIAMOND, {"v": 9})
    world.complete("a", Success({"v": 9}), fence=running(world, "a"), now=at(2))
    world.complete("b", Failure("bad", retryable=False), fence=running(world, "b", now=at(3)),
                   now=at(4))
    assert world.task.status is TaskStatus.FAILED
    fence_b = world.snaps["b"].fence
    a_before = world.snaps["a"]
    plan = world.retry("b", now=at(10), by="ops")
    assert plan.result == "committed"
    assert world.snaps["a"] == a_before  # committed, not a descendant: untouched
    b = world.snaps["b"]
    assert (b.state, b.attempt, b.fence, b.error) == (NodeState.WAITING, 0, fence_b + 1, "")
    assert b.input == {"input": 9}
    d = world.snaps["d"]
    assert (d.state, d.preds_left, d.reached) == (NodeState.PENDING, 1, False)
    assert d.fence == 1  # it was SKIPPED (fence 0) and is reset
    assert status(world) is TaskStatus.RUNNING and world.task.finished_at == 0.0
    assert plan.enqueue == [("b", 0.0)]
    assert [e.kind for e in plan.events][:1] == ["retried"]
    assert world.complete("b", Success(1), fence=fence_b, now=at(11)).result == "stale"


def test_retry_of_a_dead_node_gives_it_a_fresh_attempt_budget() -> None:
    world = World.submit(SINGLE.replace("retry: 2", "retry: 0"))
    world.complete("a", Failure("flaky"), fence=running(world, "a"), now=at(2))
    assert world.state("a") is NodeState.DEAD
    world.retry("a", now=at(3))
    assert (world.state("a"), world.snaps["a"].attempt) == (NodeState.WAITING, 0)
    world.complete("a", Success(1), fence=running(world, "a", now=at(4)), now=at(5))
    assert world.state("b") is NodeState.WAITING


def test_retry_with_an_input_override_runs_the_node_on_that_input() -> None:
    world = World.submit(SINGLE)
    world.complete("a", Failure("bad", retryable=False), fence=running(world, "a"), now=at(2))
    world.retry("a", now=at(3), input_override={"fixed": True})
    a = world.snaps["a"]
    assert (a.state, a.input) == (NodeState.WAITING, {"input": {"fixed": True}})
    assert a.input_revision == sha256_json(["t1", "a", {"input": {"fixed": True}}])
    assert world.events[-1].detail == "input overridden"
    assert world.queue[-1] == ("a", 0.0)


def test_retry_of_a_gate_with_an_input_override_is_refused() -> None:
    world = gate_world()
    world.decide_gate("g", "reject", now=at(3))
    with pytest.raises(InputError, match="tool_call and llm_call"):
        world.retry("g", now=at(4), input_override="x")


def test_retry_of_a_decided_gate_asks_again() -> None:
    world = gate_world()
    world.decide_gate("g", "reject", now=at(3))
    world.retry("g", now=at(4))
    g = world.snaps["g"]
    assert (g.state, g.decision) == (NodeState.PAUSED, None)
    assert world.state("ko") is NodeState.PENDING  # reset, waits for the new decision
    world.decide_gate("g", "approve", now=at(5))
    assert (world.state("ok"), world.state("ko")) == (NodeState.WAITING, NodeState.SKIPPED)


@pytest.mark.parametrize(("setup", "message"), [
    ("waiting", "is WAITING"), ("running", "is RUNNING"), ("pending", "not been reached"),
])
def test_retry_of_an_unfinished_node_conflicts(setup: str, message: str) -> None:
    world = World.submit(SINGLE)
    node = "b" if setup == "pending" else "a"
    if setup == "running":
        running(world, "a")
    with pytest.raises(Conflict, match=message):
        world.retry(node, now=at(2))


def test_retry_of_an_unknown_node_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no node 'zz'"):
        World.submit(SINGLE).retry("zz", now=at(1))


def test_retry_recounts_a_join_from_its_predecessors() -> None:
    world = World.submit("""
    name: join
    nodes:
      a: {type: tool_call, tool: echo, input: x, next: j}
      b: {type: tool_call, tool: echo, input: x, next: j}
      j: {type: tool_call, tool: echo, input: x}
    """)
    for n in "ab":
        world.complete(n, Success(n), fence=running(world, n), now=at(2))
    world.complete("j", Success("j"), fence=running(world, "j", now=at(3)), now=at(4))
    world.retry("a", now=at(5))
    j = world.snaps["j"]
    assert (j.state, j.preds_left, j.reached) == (NodeState.PENDING, 1, True)
    world.complete("a", Success("a2"), fence=running(world, "a", now=at(6)), now=at(7))
    assert world.state("j") is NodeState.WAITING
    assert world.task.status is TaskStatus.RUNNING


JOIN = """
name: join
nodes:
  a: {type: tool_call, tool: echo, input: x, next: j}
  b: {type: tool_call, tool: echo, input: x, next: j}
  j: {type: tool_call, tool: echo, input: x}
"""


def test_retry_after_cancel_does_not_strand_a_join() -> None:
    """A retry lifts the cancel: the cancelled branch b runs again, so the join below
    both waits for it instead of waiting forever while the task reports SUCCEEDED."""
    world = World.submit(JOIN)
    world.cancel(now=at(1))
    plan = world.retry("a", now=at(2))
    assert world.states() == {"a": "WAITING", "b": "WAITING", "j": "PENDING"}
    assert sorted(plan.enqueue) == [("a", 0.0), ("b", 0.0)]
    assert plan.events[0].detail == "retry from a by admin; re-opened 2 cancelled node(s)"
    world.complete("a", Success("a"), fence=running(world, "a", now=at(3)), now=at(4))
    assert world.state("j") is NodeState.PENDING and world.snaps["j"].preds_left == 1
    assert status(world) is TaskStatus.RUNNING
    world.complete("b", Success("b"), fence=running(world, "b", now=at(5)), now=at(6))
    world.complete("j", Success("j"), fence=running(world, "j", now=at(7)), now=at(8))
    assert status(world) is TaskStatus.SUCCEEDED


def test_retry_after_cancel_reopens_every_cancelled_node() -> None:
    """Running and never-reached nodes all come back, each as its predecessors'
    decisions make it, with a fresh attempt budget; committed nodes stay committed and
    the cancelled workers' fences stay stale."""
    world = World.submit(DIAMOND + "  e: {type: tool_call, tool: echo, input: e}\n",
                         {"v": 9})
    world.complete("a", Success({"v": 9}), fence=running(world, "a"), now=at(2))
    fence_b = running(world, "b", now=at(3))
    fence_e = running(world, "e", now=at(3))
    world.cancel(now=at(4))
    assert world.states() == {"a": "SUCCEEDED", "b": "CANCELLED", "c": "SKIPPED",
                              "e": "CANCELLED", "d": "CANCELLED"}
    a_before = world.snaps["a"]
    world.retry("b", now=at(5))
    assert world.snaps["a"] == a_before
    assert world.states() == {"a": "SUCCEEDED", "b": "WAITING", "c": "SKIPPED",
                              "e": "WAITING", "d": "PENDING"}
    b, e = world.snaps["b"], world.snaps["e"]
    assert (b.attempt, e.attempt) == (0, 0) and b.input == {"input": 9}
    assert world.complete("e", Success(1), fence=fence_e, now=at(6)).result == "stale"
    assert world.complete("b", Success(1), fence=fence_b, now=at(6)).result == "stale"
    for node in ("b", "e", "d"):
        world.complete(node, Success(node), fence=running(world, node, now=at(7)), now=at(8))
    assert status(world) is TaskStatus.SUCCEEDED


def test_retry_after_cancel_from_a_node_that_was_never_reached_conflicts() -> None:
    world = World.submit(JOIN)
    world.cancel(now=at(1))
    with pytest.raises(Conflict, match="had not been reached when the task was cancelled"):
        world.retry("j", now=at(2))


def test_retry_after_cancel_asks_a_cancelled_gate_again() -> None:
    world = gate_world()
    world.cancel(now=at(3))
    world.retry("a", now=at(4))
    world.complete("a", Success("again"), fence=running(world, "a", now=at(5)), now=at(6))
    g = world.snaps["g"]
    assert (g.state, g.decision, g.gate_until) == (NodeState.PAUSED, None, at(106))


def test_a_retried_four_eyes_gate_without_a_recorded_submitter_still_refuses() -> None:
    """A retry keeps the task record, so a task with no recorded submitter still has
    none: its four-eyes gate refuses every person, and only its timeout decides it
    (docs/dag-language.md says so)."""
    world = World.submit(GATE.replace("timeout: 100", "timeout: 100\n    four_eyes: true"),
                         submitted_by="")
    world.complete("a", Success("r"), fence=running(world, "a"), now=at(2))
    world.cancel(now=at(3))
    world.retry("a", now=at(4))
    world.complete("a", Success("r"), fence=running(world, "a", now=at(5)), now=at(6))
    assert world.task.submitted_by == "" and world.state("g") is NodeState.PAUSED
    with pytest.raises(Forbidden, match="no recorded submitter"):
        world.decide_gate("g", "approve", now=at(7), by="bob")
    world.expire("g", now=at(106))
    assert world.snaps["g"].decision is not None
    assert world.snaps["g"].decision["by"] == GATE_TIMEOUT_ACTOR
    assert world.state("ko") is NodeState.WAITING


# ============================================================================ helpers


def test_backoff_doubles_per_attempt_with_deterministic_jitter() -> None:
    config = RuleConfig(backoff_base=1.0, backoff_cap=1000.0)
    for attempt, base in [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0)]:
        delay = backoff_delay(attempt, "k", config)
        assert 0.8 * base <= delay <= 1.2 * base
        assert delay == backoff_delay(attempt, "k", config)
    delays = {backoff_delay(1, f"key-{i}", config) for i in range(50)}
    assert len(delays) > 40  # the jitter spreads keys apart


def test_backoff_never_exceeds_the_cap() -> None:
    config = RuleConfig(backoff_base=1.0, backoff_cap=60.0)
    assert max(backoff_delay(20, f"k{i}", config) for i in range(100)) <= 60.0


@pytest.mark.parametrize(("counts", "cancelled", "status"), [
    ({"ACTIVE": 1, "PAUSED": 1, "DEAD": 1}, False, TaskStatus.RUNNING),
    ({"PAUSED": 1, "DEAD": 1, "FAILED_UNROUTED": 1}, False, TaskStatus.PAUSED),
    ({"DEAD": 1, "FAILED_UNROUTED": 1, "SUCCEEDED": 2}, False, TaskStatus.DEAD),
    ({"FAILED_UNROUTED": 1, "SUCCEEDED": 2}, False, TaskStatus.FAILED),
    ({"FAILED": 1, "SUCCEEDED": 2, "SKIPPED": 1}, False, TaskStatus.SUCCEEDED),
    ({"ACTIVE": 3}, True, TaskStatus.CANCELLED),
    ({"ACTIVE": 0, "SUCCEEDED": 1}, False, TaskStatus.SUCCEEDED),
])
def test_derive_status_orders_the_categories(counts: dict[str, int], cancelled: bool,
                                             status: TaskStatus) -> None:
    assert derive_status(counts, cancelled) is status


def test_category_buckets_nodes_for_the_task_counters() -> None:
    dag: Dag = load("""
    name: routed
    nodes:
      a: {type: tool_call, tool: echo, input: x, on_failure: b}
      b: {type: tool_call, tool: echo, input: x}
    """)
    snap = Snapshot(task_id="t", node_id="a")
    a, b = dag.nodes["a"], dag.nodes["b"]
    assert category(a, replace(snap, state=NodeState.WAITING)) == "ACTIVE"
    assert category(a, replace(snap, state=NodeState.RUNNING)) == "ACTIVE"
    assert category(a, replace(snap, state=NodeState.PAUSED)) == "PAUSED"
    assert category(a, replace(snap, state=NodeState.FAILED)) == "FAILED"
    assert category(b, replace(snap, state=NodeState.FAILED)) == "FAILED_UNROUTED"
    assert category(b, replace(snap, state=NodeState.DEAD)) == "DEAD"


def test_heartbeat_rule_is_pure() -> None:
    world = World.submit(SINGLE)
    fence = running(world, "a", now=at(1))
    view = world.view()
    first = plan_heartbeat(view, "a", fence=fence, lease=LEASE, now=at(2), ids=world.ids())
    second = plan_heartbeat(view, "a", fence=fence, lease=LEASE, now=at(2), ids=world.ids())
    assert first == second
    assert view.snaps == world.snaps  # the view was not mutated


@pytest.mark.parametrize(("retry_after", "delay"), [
    (30.0, 30.0),           # the dependency's Retry-After, not the default 7 s
    (0.5, 0.5),             # a shorter one too: the dependency knows best
    (-4.0, 0.0),            # a negative one means "now"
    (1e9, 3600.0),          # cut to the cap
    (float("inf"), 3600.0),
])
def test_unavailable_with_retry_after_is_offered_again_then(retry_after: float,
                                                            delay: float) -> None:
    world = World.submit(SINGLE, config=RuleConfig(unavailable_delay=7.0))
    fence = running(world, "a", now=at(1))
    plan = world.complete("a", Unavailable("model:m", "429", retry_after=retry_after),
                          fence=fence, now=at(2))
    a = world.snaps["a"]
    assert (a.state, a.attempt) == (NodeState.WAITING, 0)
    assert a.not_before == at(2) + delay
    assert plan.enqueue == [("a", delay)]
    assert world.events[-1].detail.endswith(f"(offered again in {delay:g}s)")
    assert world.claim("a", now=at(2) + delay - 0.01).result == "not-claimable"
    assert world.claim("a", now=at(2) + delay).result == "claimed"
