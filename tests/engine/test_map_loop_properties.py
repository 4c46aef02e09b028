"""Property test of maps and bounded loops: random lists (0 to 8 items), concurrency,
failure policy, loop bounds and reviewer verdicts, driven by two workers in random
interleavings with lease expiries, stale completions and crashes, then drained by a
healthy worker. Invariants: the task ends; every started item is final and none beyond
the expansion exists; a successful map's output is its items' outputs in item order;
every item and every visit commits at most once, under its fence; the loop runs at most
its bound, keeps one snapshot per earlier visit, and leaves the way its guards say."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, NodeState
from executors.contract import Failure, Success
from tests.engine.test_interleavings import OP_STEPS, play_script, scenario_engine

FINAL = {NodeState.SUCCEEDED, NodeState.FAILED, NodeState.SKIPPED, NodeState.CANCELLED,
         NodeState.DEAD}


@st.composite
def shapes(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "items": draw(st.lists(st.integers(0, 99), max_size=8)),
        "concurrency": draw(st.integers(1, 4)),
        "policy": draw(st.sampled_from(["fail", "collect"])),
        "bad": draw(st.sets(st.integers(0, 7), max_size=2)),  # items that fail for good
        "bound": draw(st.integers(1, 4)),
        "approve_at": draw(st.integers(1, 5)),  # the visit the reviewer approves
    }


def dag_for(shape: dict[str, Any]) -> Dag:
    return load_dag_mapping({"name": "maploop", "nodes": {
        "src": {"type": "tool_call", "tool": "echo", "retry": 60, "input": "go",
                "next": "m"},
        "m": {"type": "tool_call", "tool": "echo", "retry": 60,
              "map": "{{ input.items }}", "max_concurrency": shape["concurrency"],
              "on_item_failure": shape["policy"], "input": {"v": "{{ item }}",
                                                            "i": "{{ index }}"},
              "next": "draft", "on_failure": "failed"},
        "draft": {"type": "tool_call", "tool": "echo", "retry": 60,
                  "input": {"visit": "{{ visit }}"}, "next": "review"},
        "review": {"type": "tool_call", "tool": "echo", "retry": 60,
                   "input": {"visit": "{{ visit }}"}, "next": [
                       {"target": "draft", "condition": "{{ not output.ok }}",
                        "max_visits": shape["bound"]},
                       {"target": "done", "condition": "{{ output.ok }}"},
                       {"target": "gave_up",
                        "condition": f"{{{{ not output.ok and visit >= {shape['bound']} }}}}"},
                   ]},
        "done": {"type": "tool_call", "tool": "echo", "input": "ok", "retry": 60},
        "gave_up": {"type": "tool_call", "tool": "echo", "input": "no", "retry": 60},
        "failed": {"type": "tool_call", "tool": "echo", "input": "failed", "retry": 60},
    }}, tools={"echo"}, models=set())


def answer(node: str, request_input: Any, shape: dict[str, Any], fence: int) -> Any:
    """What a worker answers: each item doubles its value (or fails for good when it is
    a bad one), the reviewer approves from ``approve_at`` on."""
    if node.startswith("m["):
        index = int(node[2:-1])
        if index in shape["bad"]:
            return Failure(f"item {index} is bad", retryable=False)
        return Success({"double": 2 * request_input["v"], "fence": fence})
    if node == "review":
        return Success({"ok": request_input["visit"] >= shape["approve_at"]})
    return Success({"node": node, "fence": fence})


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=shapes(), script=st.lists(st.one_of(*OP_STEPS), min_size=4, max_size=50))
def test_random_maps_and_loops_keep_their_invariants(
        tmp_path_factory: object, shape: dict[str, Any],
        script: list[tuple[str, object, object]]) -> None:
    base = Path(tmp_path_factory.mktemp("maploop"))  # type: ignore[attr-defined]
    asyncio.run(_scenario(base, shape, script))


async def _scenario(base: Path, shape: dict[str, Any],
                    script: list[tuple[str, object, object]]) -> None:
    dag = dag_for(shape)
    engine, store, clock = scenario_engine(base)
    try:
        task = (await engine.submit(dag, {"items": shape["items"]})).task_id
        await play_script(engine, clock, task, script,
                          lambda node, fence, given: answer(node, given, shape, fence))

        async def run_one(worker: str, node: str) -> bool:
            res = await engine.claim(task, node, worker=worker)
            if res.result == "claimed":
                await engine.complete(task, node, fence=res.request.fence, outcome=answer(
                    node, res.request.input, shape, res.request.fence))
            return res.result == "claimed"

        for _ in range(400):  # a healthy worker drains the task: nothing may be lost
            view = await engine.get_task(task)
            if view.task.status.final:
                break
            waiting = [n for n, s in view.snapshots.items() if s.state is NodeState.WAITING]
            progressed = [await run_one("C", node) for node in waiting]
            if not any(progressed):  # backing off, or held by a lost worker's lease
                clock.advance(31.0)
                for node, snap in view.snapshots.items():
                    if snap.state is NodeState.RUNNING:
                        await engine.expire(task, node)
        await _check(engine, task, shape)
    finally:
        await store.close()


async def _check(engine: Engine, task: str, shape: dict[str, Any]) -> None:
    view = await engine.get_task(task)
    snaps = view.snapshots
    items, bad = shape["items"], {i for i in shape["bad"] if i < len(shape["items"])}
    assert view.task.status.final, view.task
    events = await engine.events(task)
    commits = Counter(e.node_id for e in events if e.kind == "committed")

    # The map: its expansion, its items, its output.
    parent = snaps["m"]
    assert parent.input == {"items": items}
    assert parent.items == len(items)
    started = sorted(n for n in snaps if n.startswith("m["))
    assert started == sorted(f"m[{i}]" for i in range(parent.items_started))
    assert parent.items_started <= len(items)
    for node in started:
        assert snaps[node].state in FINAL, (node, snaps[node].state)
        assert commits[node] <= 1, (node, commits[node])
        if snaps[node].state is NodeState.SUCCEEDED:
            assert commits[node] == 1
            assert snaps[node].output["fence"] == snaps[node].fence
    map_failed = shape["policy"] == "fail" and bad
    if map_failed:
        assert parent.state is NodeState.FAILED
        assert snaps["failed"].state is NodeState.SUCCEEDED
        assert snaps["draft"].state is NodeState.SKIPPED
        assert view.task.status.value == "SUCCEEDED"  # routed by on_failure
        return
    assert parent.state is NodeState.SUCCEEDED
    assert parent.items_started == parent.items_done == len(items)
    expected = [{"ok": False, "error": f"item {i} is bad"} if i in bad
                else {"double": 2 * v} for i, v in enumerate(items)]
    got = parent.output
    if shape["policy"] == "collect":
        got = [r if not r["ok"] else {"double": r["output"]["double"]} for r in got]
    else:
        got = [{"double": r["double"]} for r in got]
    assert got == expected

    # The loop: at most its bound, one kept snapshot per earlier visit, left as guarded.
    bound, approve_at = shape["bound"], shape["approve_at"]
    visits = min(bound, approve_at)
    assert commits["draft"] == commits["review"] == visits
    kept = sorted(n for n in snaps if "#" in n)
    assert kept == sorted(f"{n}#{v}" for n in ("draft", "review") for v in range(1, visits))
    for v in range(1, visits):
        assert [h.target_node_id for h in snaps[f"review#{v}"].next_hops if h.is_taken] == [
            "draft"]
    approved = approve_at <= bound
    assert snaps["done"].state is (NodeState.SUCCEEDED if approved else NodeState.SKIPPED)
    assert snaps["gave_up"].state is (NodeState.SKIPPED if approved else NodeState.SUCCEEDED)
    assert view.task.status.value == "SUCCEEDED"
    # Fences only grow along a node's (or an item's) timeline.
    last: dict[str, int] = {}
    for event in events:
        if event.node_id:
            assert event.fence >= last.get(event.node_id, 0), event
            last[event.node_id] = event.fence
