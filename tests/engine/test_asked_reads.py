"""What a decision asked for beyond what it was given is read first the next time.

A rule that finds a record missing from its view raises ``Need``; the engine loads it
and runs the rule again from the start. A completion that evaluates the condition after
it inline, skips the branch it did not take and counts it off at the join, or readies a
node whose template reads another node, asks for those one at a time. The engine
remembers what decisions of one kind on one node of one DAG asked for (``_Prefetch``)
and loads it with what it reads first, so the rule runs once per transition after the
first task of a DAG, and a new branch is asked for once when it is first taken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, NodeState
from axengine.engine import _rules as rules
from executors.contract import Success
from tests.engine.conftest import run


def branches() -> Dag:
    """``a`` → condition ``c`` → ``hi`` or ``lo`` → ``j``, whose input reads ``c``."""
    tool = {"type": "tool_call", "tool": "echo"}
    return load_dag_mapping({"name": "branches", "nodes": {
        "a": {**tool, "input": {"score": "{{ .input.score }}"}, "next": "c"},
        "c": {"type": "condition",
              "expression": "if .output.score > 5: high\nelse: low",
              "next": [{"target": "hi", "when": "high"}, {"target": "lo", "when": "low"}]},
        "hi": {**tool, "input": "high", "next": "j"},
        "lo": {**tool, "input": "low", "next": "j"},
        "j": {**tool, "input": {"risk": "{{ .nodes.c.output }}"}},
    }}, tools={"echo"}, models=set())


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each rule ran (a ``Need`` runs it again)."""
    counts: Counter[str] = Counter()
    for name in ("plan_submit", "plan_complete"):
        rule = getattr(rules, name)

        def counted(*args: Any, _rule: Any = rule, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _rule(*args, **kwargs)

        monkeypatch.setattr(rules, name, counted)
    return counts


async def _run_task(engine: Engine, dag: Dag, score: int) -> dict[str, NodeState]:
    """Submit and run every node the way an embedded worker with one slot does: the
    submit claims the entry node, each completion claims the node it readies."""
    sub = await engine.submit(dag, {"score": score}, claim_for="w1", claim_lanes=["default"])
    claim = sub.next
    while claim is not None:
        request = claim.request
        assert request is not None
        done = await engine.complete_and_claim(
            sub.task_id, request.node_id, fence=request.fence,
            outcome=Success(request.input), worker="w1", lanes=["default"])
        assert done.answer == "committed"
        claim = done.next
    view = await engine.get_task(sub.task_id)
    assert view.task.status.value == "SUCCEEDED"
    return {nid: snap.state for nid, snap in view.snapshots.items()}


def test_a_dags_transitions_ask_for_what_they_read_once(
        make_engine: Callable[..., Engine], decisions: Counter[str]) -> None:
    async def main() -> None:
        engine = make_engine()
        dag = branches()
        runs: list[tuple[int, int]] = []
        states: list[tuple[NodeState, NodeState]] = []
        for score in (9, 9, 1, 1):
            decisions.clear()
            done = await _run_task(engine, dag, score)
            runs.append((decisions["plan_submit"], decisions["plan_complete"]))
            states.append((done["hi"], done["lo"]))
        high = (NodeState.SUCCEEDED, NodeState.SKIPPED)
        low = (NodeState.SKIPPED, NodeState.SUCCEEDED)
        assert states == [high, high, low, low]
        # Three completions a task (a, the branch taken, j). The first task asks one at a
        # time: the submit for the entry's ramp; a's completion for hi and lo (the
        # condition's targets), then j (the skipped branch counts off there); hi's for
        # c (j's input reads it). The second task asks for nothing. The first task down
        # the other branch asks once more: lo's completion, for c.
        assert runs == [(2, 6), (1, 3), (1, 4), (1, 3)]

    run(main())
