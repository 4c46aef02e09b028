"""Sub-DAGs: a node of type ``dag`` runs another DAG whose nodes are the task's own
(``review/check``): its output is the sub-DAG's, a failure inside fails it, a gate inside
pauses the task, and cancel, retry and fork reach its nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from axengine.dag import Dag, load_dag
from axengine.engine import Engine, NodeState
from axengine.errors import Conflict
from axengine.testing import AxTestEngine
from executors.contract import Failure, Success
from tests.engine.conftest import run

TOOLS = {"echo", "check", "publish", "alert", "draft", "review", "summarise"}
MODELS: set[str] = set()

CHILD = """
name: approval
output: "{{ {'verdict': .nodes.route.output, 'notes': .nodes.check.output.notes} }}"
nodes:
  check:
    type: tool_call
    tool: check
    input: {doc: "{{ .input.doc }}"}
    next: route
  route:
    type: condition
    expression: |
      if .output.ok: approved
      else: needs_person
    next:
      - {target: person, when: needs_person}
  person:
    type: human_gateway
    input: "{{ .input.doc }}"
"""

PARENT = """
name: publishing
nodes:
  draft:
    type: tool_call
    tool: draft
    input: "{{ .input.text }}"
    next: review
  review:
    type: dag
    dag: approval.yaml
    input: {doc: "{{ .nodes.draft.output }}"}
    on_failure: alert
    next: publish
  publish:
    type: tool_call
    tool: publish
    input: "{{ .nodes.review.output }}"
  alert:
    type: tool_call
    tool: alert
    input: "{{ .nodes.draft.output }}"
"""


def files(tmp_path: Path, parent: str = PARENT, child: str = CHILD) -> Dag:
    (tmp_path / "approval.yaml").write_text(child)
    (tmp_path / "publishing.yaml").write_text(parent)
    return load_dag(tmp_path / "publishing.yaml", tools=TOOLS, models=MODELS)


def echo(request: Any) -> Any:
    return request.input


STUBS: dict[str, Any] = {"draft": echo, "publish": echo, "alert": echo,
                         "review/check": lambda r: {"ok": r.input["doc"] == "good",
                                                    "notes": f"read {r.input['doc']}"}}


def test_a_sub_dag_runs_as_nodes_of_the_task_and_its_output_is_the_node_s(
        tmp_path: Path) -> None:
    dag = files(tmp_path)
    assert [n for n in dag.nodes if "/" in n] == ["review/check", "review/route",
                                                  "review/person"]
    with AxTestEngine(tmp_path / "home") as ax:
        result = ax.run(dag, {"text": "good"}, stubs=STUBS)
    assert result.status == "SUCCEEDED"
    assert result.path == ["draft", "review/check", "review/route", "review", "publish"]
    assert result.outputs["review"] == {"verdict": "approved", "notes": "read good"}
    assert result.outputs["publish"] == result.outputs["review"]
    assert result.states["review/person"] == "SKIPPED"
    # The sub-DAG read its node's rendered input as `input`.
    assert result.snapshots["review/check"].input == {"input": {"doc": "good"}}
    started = [e for e in result.events if e.kind == "started"]
    assert len(started) == 1 and "sub-DAG approval (3 nodes" in started[0].detail


def test_a_gate_inside_a_sub_dag_pauses_the_task_and_its_decision_goes_on(
        tmp_path: Path) -> None:
    with AxTestEngine(tmp_path / "home") as ax:
        result = ax.run(files(tmp_path), {"text": "meh"}, stubs=STUBS)
        assert result.status == "PAUSED"
        assert result.waiting == ["review/person"]
        assert result.states["review"] == "RUNNING"
        result = ax.decide("review/person", "approve")
    assert result.status == "SUCCEEDED"
    assert result.outputs["review"]["verdict"] == "needs_person"
    assert result.path[-2:] == ["review", "publish"]


def test_a_failure_inside_a_sub_dag_fails_its_node_and_routes(tmp_path: Path) -> None:
    stubs = {**STUBS, "review/check": lambda r: Failure("checker crashed", retryable=False)}
    with AxTestEngine(tmp_path / "home") as ax:
        result = ax.run(files(tmp_path), {"text": "good"}, stubs=stubs)
    assert result.states["review/check"] == "FAILED"
    assert result.states["review"] == "FAILED"
    assert result.errors["review"] == "sub-DAG node check failed: checker crashed"
    assert result.states["alert"] == "SUCCEEDED" and result.states["publish"] == "SKIPPED"
    assert result.status == "SUCCEEDED"  # routed by the sub-DAG node's on_failure


def test_cancel_retry_and_fork_reach_the_sub_dag(tmp_path: Path,
                                                make_engine: Callable[..., Engine]) -> None:
    dag = files(tmp_path)
    engine = make_engine()

    async def main() -> None:
        task = (await engine.submit(dag, {"text": "good"})).task_id
        first = await engine.claim(task, "draft", worker="w")
        await engine.complete(task, "draft", fence=first.request.fence,
                              outcome=Success("good"))
        held = await engine.claim(task, "review/check", worker="w")
        assert held.result == "claimed"
        assert held.request.input == {"doc": "good"}
        assert await engine.cancel(task) == "committed"
        view = await engine.get_task(task)
        assert view.snapshots["review"].state is NodeState.CANCELLED
        assert view.snapshots["review/check"].state is NodeState.CANCELLED
        assert await engine.complete(task, "review/check", fence=held.request.fence,
                                     outcome=Success({"ok": True})) == "stale"
        with pytest.raises(Conflict, match="retry from 'review'"):
            await engine.retry(task, "review/check")
        await engine.retry(task, "review")
        view = await engine.get_task(task)
        assert view.snapshots["review"].owner == "ax:dag"
        again = await engine.claim(task, "review/check", worker="w2")
        assert again.result == "claimed" and again.request.fence > held.request.fence
        await engine.complete(task, "review/check", fence=again.request.fence,
                              outcome=Success({"ok": True, "notes": "fine"}))
        last = await engine.claim(task, "publish", worker="w2")
        await engine.complete(task, "publish", fence=last.request.fence,
                              outcome=Success("out"))
        view = await engine.get_task(task)
        assert view.task.status.value == "SUCCEEDED"
        assert view.snapshots["review"].output == {"verdict": "approved", "notes": "fine"}

    run(main())


NESTED_CHILD = """
name: summarise_all
nodes:
  sections:
    type: tool_call
    tool: summarise
    map: "{{ .input.parts }}"
    input: "{{ .item }}"
    next: draft
  draft:
    type: tool_call
    tool: draft
    input: {visit: "{{ .visit }}", before: "{{ .previous.review }}"}
    next: review
  review:
    type: tool_call
    tool: review
    input: {visit: "{{ .visit }}"}
    next:
      - {target: draft, condition: "{{ not .output.ok }}", max_visits: 3}
"""

OUTER = """
name: outer
nodes:
  inner:
    type: dag
    dag: approval.yaml
    input: {parts: "{{ .input.parts }}"}
  wrapper:
    type: dag
    dag: wrapper.yaml
    input: {parts: "{{ .input.parts }}"}
"""

WRAPPER = """
name: wrapper
nodes:
  deep:
    type: dag
    dag: approval.yaml
    input: {parts: "{{ .input.parts }}"}
"""


def test_maps_loops_and_sub_dags_nest_inside_a_sub_dag(tmp_path: Path) -> None:
    (tmp_path / "wrapper.yaml").write_text(WRAPPER)
    dag = files(tmp_path, parent=OUTER, child=NESTED_CHILD)
    assert "wrapper/deep/sections" in dag.nodes
    stubs = {"tool:summarise": lambda r: r.input.upper(), "tool:draft": echo,
             "tool:review": lambda r: {"ok": r.input["visit"] >= 2}}
    with AxTestEngine(tmp_path / "home") as ax:
        result = ax.run(dag, {"parts": ["a", "b"]}, stubs=stubs)
    assert result.status == "SUCCEEDED"
    for scope in ("inner", "wrapper/deep"):
        assert result.outputs[f"{scope}/sections"] == ["A", "B"]
        assert result.states[f"{scope}/sections[1]"] == "SUCCEEDED"
        assert result.states[f"{scope}/draft#1"] == "SUCCEEDED"
        # `previous` names the sub-DAG's own nodes.
        assert result.outputs[f"{scope}/draft"] == {"visit": 2, "before": {"ok": False}}
        assert result.outputs[scope] == {"review": {"ok": True}}
    assert result.outputs["wrapper"] == {"deep": {"review": {"ok": True}}}
