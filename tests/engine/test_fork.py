"""Forking a finished task (time travel): shared history, a set output, the source untouched."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine import (
    FORKED_FROM_LABEL,
    RERUN,
    Engine,
    NextHop,
    NodeState,
    Snapshot,
    TaskRecord,
    TaskStatus,
    fork_task,
    plan_fork,
)
from axengine.errors import Conflict, InputError, NotFound
from axengine.keys import StoreKeys
from axengine.local import LocalSession
from executors.contract import NodeContext, NodeRequest, Outcome, Success
from executors.handlers import handle

ROOT = Path(__file__).resolve().parents[2]
FINANCIAL = ROOT / "dags" / "financial_risk_assessment.yaml"
ACME = {"pdf_url": str(ROOT / "dags" / "inputs" / "acme_annual_report.pdf")}
#: Fast revenue growth on a thin margin: assess_risk says high_risk.
HIGH_RISK = {"revenue_growth": 0.3, "net_profit_margin": 0.05, "debt_to_equity": 1.0}


class Counting:
    """The default handler, counting the runs of each node by task."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def __call__(self, request: NodeRequest, ctx: NodeContext) -> Outcome:
        self.calls[request.task_id, request.node_id] += 1
        return handle(request, ctx)


async def raw_snapshots(engine: Engine, task_id: str) -> dict[str, bytes]:
    # The stored bytes themselves: a fork must not rewrite a key of its source.
    kvs = await engine._store.range(StoreKeys(engine._keys.prefix).snapshots(task_id))
    return {kv.key: kv.value for kv in kvs}


def test_fork_at_extract_metrics_with_a_high_risk_output_takes_the_high_risk_path(
        tmp_path: Path) -> None:
    counting = Counting()

    async def main() -> tuple[Any, ...]:
        async with LocalSession(AxConfig(home=tmp_path), handler=counting) as s:
            source = await s.submit(FINANCIAL, ACME)
            original = await s.wait(source)
            before = await raw_snapshots(s.engine, source)
            fork = await fork_task(s.engine, source, "extract_metrics", output=HIGH_RISK,
                                   by="ops")
            forked = await s.wait(fork)
            after = await raw_snapshots(s.engine, source)
            view = await s.engine.get_task(fork)
            events = await s.engine.events(fork)
            return source, original, before, fork, forked, after, view, events

    source, original, before, fork, forked, after, view, events = asyncio.run(main())
    assert original.status == "SUCCEEDED"
    assert original.outputs["assess_risk"] == "medium_risk"
    assert before and before == after  # the source's snapshots, byte for byte
    assert fork != source
    assert view.task.labels[FORKED_FROM_LABEL] == f"{source}@extract_metrics"
    assert view.task.submitted_by == "ops"
    # The fork took the high-risk path and waits at its gate.
    assert forked.status == "PAUSED"
    assert list(forked.waiting) == ["send_high_risk_email"]
    assert forked.outputs["assess_risk"] == "high_risk"
    assert forked.outputs["extract_metrics"] == HIGH_RISK
    assert forked.states["send_medium_risk_email"] == "SKIPPED"
    # Shared history: parse_pdf's output is the source's and nothing before the fork
    # point ran again; the fork point did not run either (its output was set).
    assert forked.outputs["parse_pdf"] == original.outputs["parse_pdf"]
    assert counting.calls[fork, "parse_pdf"] == 0
    assert counting.calls[fork, "extract_metrics"] == 0
    assert counting.calls[source, "parse_pdf"] == 1
    kinds = [(e.kind, e.node_id) for e in events]
    assert ("forked", "extract_metrics") in kinds
    assert ("committed", "parse_pdf") in kinds  # the shared history's events
    assert ("task_succeeded", "") not in kinds  # but not the source's end
    # The fork point committed once in the fork, with the set output, by the fork itself.
    committed = [e for e in events if e.kind == "committed" and e.node_id == "extract_metrics"]
    assert [(e.actor, e.detail) for e in committed] == [("fork", "-> assess_risk")]
    assert view.snapshots["extract_metrics"].state is NodeState.SUCCEEDED


DAG = """
name: forkable
nodes:
  a: {type: tool_call, tool: echo, input: "{{ input.v }}", next: b}
  b: {type: tool_call, tool: echo, input: "{{ nodes.a.output }}", next: c}
  c: {type: tool_call, tool: echo, input: "{{ nodes.b.output }}"}
"""


def test_fork_without_an_output_reruns_the_node_and_what_follows(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []

    def handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
        calls.append((request.task_id, request.node_id))
        return Success(request.input)

    async def main() -> tuple[Any, ...]:
        async with LocalSession(AxConfig(home=tmp_path), handler=handler) as s:
            source = await s.submit(load_dag_text(DAG), {"v": "x"})
            await s.wait(source)
            fork = await fork_task(s.engine, source, "b", by="ops")
            return source, fork, await s.wait(fork)

    source, fork, forked = asyncio.run(main())
    assert forked.status == "SUCCEEDED" and forked.outputs == {"a": "x", "b": "x", "c": "x"}
    assert [c for c in calls if c[0] == source] == [(source, "a"), (source, "b"), (source, "c")]
    assert [c for c in calls if c[0] == fork] == [(fork, "b"), (fork, "c")]


def test_fork_refusals_name_the_problem(tmp_path: Path) -> None:
    async def main() -> None:
        async with LocalSession(AxConfig(home=tmp_path)) as s:
            finished = await s.submit(FINANCIAL, ACME)
            await s.wait(finished)
            with pytest.raises(InputError, match="no node 'extract'"):
                await fork_task(s.engine, finished, "extract", by="ops")
            with pytest.raises(Conflict, match="never reached node 'send_alert'"):
                await fork_task(s.engine, finished, "send_alert", by="ops")
            with pytest.raises(InputError, match="condition"):
                await fork_task(s.engine, finished, "assess_risk", output="high_risk",
                                by="ops")
            with pytest.raises(NotFound):
                await fork_task(s.engine, "t-missing", "parse_pdf", by="ops")
            # A task that still runs (here: paused at its gate) is not forked.
            high = await fork_task(s.engine, finished, "extract_metrics", output=HIGH_RISK,
                                   by="ops")
            assert (await s.wait(high)).status == "PAUSED"
            with pytest.raises(Conflict, match=r"PAUSED.*fork a finished task"):
                await fork_task(s.engine, high, "parse_pdf", by="ops")
            snaps = {x.node_id: x.state for x in await s.engine.snapshots(high)}
            assert snaps["send_high_risk_email"] is NodeState.PAUSED

    asyncio.run(main())


def test_plan_fork_is_pure_and_resets_only_the_fork_point_and_after() -> None:
    dag = load_dag_text(DAG)
    done = {n: Snapshot(task_id="t-src", node_id=n, state=NodeState.SUCCEEDED, attempt=1,
                        fence=1, output="x", next_hops=tuple(NextHop(t, True)
                                                             for t in dag.nodes[n].targets))
            for n in dag.nodes}
    source = TaskRecord(task_id="t-src", dag_hash=dag.hash, dag_name=dag.name,
                        input={"v": "x"}, status=TaskStatus.SUCCEEDED, labels={"team": "a"})
    args: dict[str, Any] = {"fork_id": "t-fork", "from_node": "b", "by": "ops", "now": 100.0}
    fork = plan_fork(dag, source, done, [], **args)
    # Deterministic: the same inputs give the same writes (event ids carry a random tail).
    assert fork.snapshots == plan_fork(dag, source, done, [], **args, output=RERUN).snapshots
    snaps = {s.node_id: s for s in fork.snapshots}
    assert snaps["a"] == replace(done["a"], task_id="t-fork")  # shared, as committed
    assert snaps["b"].state is NodeState.WAITING and snaps["b"].input == {"input": "x"}
    assert snaps["b"].fence == 2  # above every fence of the source's run
    assert snaps["c"].state is NodeState.PENDING and snaps["c"].preds_left == 1
    assert fork.enqueue == [("b", 0.0)]
    assert fork.task.labels == {"team": "a", FORKED_FROM_LABEL: "t-src@b"}
    assert [e.kind for e in fork.events] == ["forked", "ready"]
    set_ = plan_fork(dag, source, done, [], **args, output="y")
    assert [e.kind for e in set_.events] == ["forked", "ready", "committed", "ready"]
    snaps = {s.node_id: s for s in set_.snapshots}
    assert snaps["b"].state is NodeState.SUCCEEDED and snaps["b"].output == "y"
    assert snaps["c"].state is NodeState.WAITING and snaps["c"].input == {"input": "y"}
    assert set_.enqueue == [("c", 0.0)]
