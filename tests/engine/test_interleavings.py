"""Property test: random DAGs, two workers, random interleavings, lease expiries and
crashes. Invariants: every node commits at most once, no node is lost (the task always
finishes once a healthy worker drains it), every committed output comes from the fence
that committed it, and the final path equals the cached next hops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, EngineConfig, NodeState
from axengine.engine._rules import RuleConfig
from axengine.queue.inprocess import InProcessQueue
from axengine.store.embedded import SqliteStore
from executors.contract import Failure, Outcome, Success
from tests.engine.conftest import FakeClock

TOOLS = {"echo"}
MODELS: set[str] = set()


@st.composite
def dags(draw: st.DrawFn) -> Dag:
    n = draw(st.integers(2, 6))
    nodes: dict[str, dict[str, object]] = {}
    for i in range(n):
        edges: list[dict[str, object]] = []
        for j in range(i + 1, n):
            if draw(st.booleans()):
                threshold = draw(st.integers(0, 9))
                if draw(st.booleans()):
                    edges.append({"target": f"n{j}"})
                else:
                    edges.append({"target": f"n{j}",
                                  "condition": f"{{{{ output.v > {threshold} }}}}"})
        nodes[f"n{i}"] = {"type": "tool_call", "tool": "echo", "retry": 60,
                          "input": "{{ input.seed }}", "next": edges}
    # Keep every node reachable from n0 so the validator accepts the DAG.
    for j in range(1, n):
        if not any(e["target"] == f"n{j}" for i in range(j) for e in nodes[f"n{i}"]["next"]):  # type: ignore[union-attr]
            nodes[f"n{j - 1}"]["next"].append({"target": f"n{j}"})  # type: ignore[union-attr]
    return load_dag_mapping({"name": "prop", "nodes": nodes}, tools=TOOLS, models=MODELS)


def value_of(node_id: str, seed: int) -> int:
    return (int(node_id[1:]) * 7 + seed) % 10


#: A stale worker racing the worker that took its node over: the classic lost-fence bug.
TAKEOVER_RACE = [("claim", "A", 0), ("advance", 40.0, 0), ("claim", "B", 0),
                 ("complete", "A", 0), ("complete", "B", 0)]


def two_node_dag() -> Dag:
    return load_dag_mapping({"name": "pair", "nodes": {
        "n0": {"type": "tool_call", "tool": "echo", "retry": 60, "input": "x", "next": "n1"},
        "n1": {"type": "tool_call", "tool": "echo", "retry": 60, "input": "y"},
    }}, tools=TOOLS, models=MODELS)


#: One step of a script: (operation, worker or amount, which of the candidates).
OP_STEPS = (
    st.tuples(st.just("claim"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("complete"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("fail"), st.sampled_from("AB"), st.integers(0, 7)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 20.0, 40.0, 40.0]), st.just(0)),
    st.tuples(st.just("crash"), st.sampled_from("AB"), st.just(0)),
    st.tuples(st.just("expire"), st.just(""), st.just(0)),
)
ops = st.lists(st.one_of(*OP_STEPS), min_size=4, max_size=40)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(dag=dags(), script=ops, seed=st.integers(0, 9))
@example(dag=two_node_dag(), script=TAKEOVER_RACE, seed=3)
def test_random_interleavings_keep_invariants(tmp_path_factory: object, dag: Dag,
                                              script: list[tuple[str, object, object]],
                                              seed: int) -> None:
    base = Path(tmp_path_factory.mktemp("interleave"))  # type: ignore[attr-defined]
    asyncio.run(_scenario(base, dag, script, seed))


def scenario_engine(base: Path) -> tuple[Engine, SqliteStore, FakeClock]:
    """The engine the property scenarios play against: a SQLite file under ``base``, an
    in-process queue, a fake clock, 30 s leases and short backoffs."""
    clock = FakeClock()
    store = SqliteStore(path=base / "ax.db")
    engine = Engine(store=store, queue=InProcessQueue(), blob_dir=base / "blobs", clock=clock,
                    config=EngineConfig(lease_seconds=30,
                                        rules=RuleConfig(backoff_base=0.5, backoff_cap=2.0)))
    return engine, store, clock


async def _scenario(base: Path, dag: Dag, script: list[tuple[str, object, object]],
                    seed: int) -> None:
    engine, store, clock = scenario_engine(base)
    try:
        task = (await engine.submit(dag, {"seed": seed})).task_id
        await play_script(engine, clock, task, script, lambda node, fence, _: Success(
            {"v": value_of(node, seed), "fence": fence}))

        # Drain with a healthy worker: nothing may be lost.
        for _ in range(500):
            view = await engine.get_task(task)
            if view.task.status.final:
                break
            progressed = False
            for node, snap in view.snapshots.items():
                if snap.state is NodeState.WAITING:
                    res = await engine.claim(task, node, worker="C")
                    if res.result == "claimed":
                        await engine.complete(task, node, fence=res.request.fence, outcome=Success(
                            {"v": value_of(node, seed), "fence": res.request.fence}))
                        progressed = True
            if not progressed:
                clock.advance(31.0)
                for node, snap in view.snapshots.items():
                    if snap.state is NodeState.RUNNING:
                        await engine.expire(task, node)
        await assert_finished_cleanly(engine, task, dag, seed)
    finally:
        await store.close()


#: What a worker answers for ``(node, fence, the request's input)`` on ``complete``.
Answer = Callable[[str, int, Any], Outcome]


async def play_script(engine: Engine, clock: FakeClock, task: str,
                      script: list[tuple[str, object, object]], answer: Answer) -> None:
    """Play a script of :data:`OP_STEPS` against ``task``: workers A and B claim among
    the waiting or running nodes, complete (with ``answer``) or fail (retryable) what
    they hold, lose what they hold (crash), the clock advances, the reconciler expires
    running nodes."""
    held: dict[str, list[tuple[str, int, Any]]] = {"A": [], "B": []}

    async def states() -> dict[str, NodeState]:
        view = await engine.get_task(task)
        return {n: s.state for n, s in view.snapshots.items()}

    for op, who, idx in script:
        if op == "claim":
            candidates = sorted(n for n, s in (await states()).items()
                                if s in (NodeState.WAITING, NodeState.RUNNING))
            if candidates:
                node = candidates[int(idx) % len(candidates)]  # type: ignore[call-overload]
                res = await engine.claim(task, node, worker=str(who))
                if res.result == "claimed":
                    assert res.request is not None
                    held[str(who)].append((node, res.request.fence, res.request.input))
        elif op in ("complete", "fail") and held[str(who)]:
            node, fence, given = held[str(who)].pop(
                int(idx) % len(held[str(who)]))  # type: ignore[call-overload]
            outcome = (answer(node, fence, given) if op == "complete"
                       else Failure("flaky", retryable=True))
            await engine.complete(task, node, fence=fence, outcome=outcome)
        elif op == "advance":
            clock.advance(float(who))  # type: ignore[arg-type]
        elif op == "crash":
            held[str(who)].clear()
        elif op == "expire":
            for node, state in (await states()).items():
                if state is NodeState.RUNNING:
                    await engine.expire(task, node)


async def assert_finished_cleanly(engine: Engine, task: str, dag: Dag, seed: int) -> None:
    """The task SUCCEEDED; every node committed at most once, final, reached exactly when
    a taken edge leads to it, with the output its fence wrote and the edges its guards
    give on that output."""
    view = await engine.get_task(task)
    assert view.task.status.value == "SUCCEEDED", view.task
    events = await engine.events(task)
    for node in dag.nodes:
        commits = [e for e in events if e.kind == "committed" and e.node_id == node]
        assert len(commits) <= 1, f"{node} committed {len(commits)} times"
    preds = dag.predecessors
    for node, snap in view.snapshots.items():
        assert snap.state in (NodeState.SUCCEEDED, NodeState.SKIPPED), (node, snap.state)
        reached = not preds[node] or any(
            view.snapshots[p].state is NodeState.SUCCEEDED
            and any(h.target_node_id == node and h.is_taken
                    for h in view.snapshots[p].next_hops)
            for p in preds[node])
        assert (snap.state is NodeState.SUCCEEDED) == reached, node
        if snap.state is NodeState.SUCCEEDED:
            assert snap.output == {"v": value_of(node, seed), "fence": snap.fence}
            # The cached decision equals the guards evaluated on the committed output.
            for hop in snap.next_hops:
                edges = [e for e in dag.nodes[node].next if e.target == hop.target_node_id]
                expected = any(
                    e.condition is None
                    or snap.output["v"] > int(e.condition.split(">")[1].split("}")[0])
                    for e in edges)
                assert hop.is_taken == expected, (node, hop)
