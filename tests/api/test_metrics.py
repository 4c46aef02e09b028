"""Metrics: event classification, the timed store, gauges read on scrape."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest

from axengine.dag import load_dag_text
from axengine.engine import Engine, Event, TaskRecord
from axengine.metrics import AxMetrics
from axengine.queue.inprocess import InProcessQueue
from axengine.store import Get, Mod, Put
from axengine.store.embedded import SqliteStore
from executors.contract import Failure, Success
from proto.ax.v1 import ax_pb2 as pb
from proto.ax.v1 import ax_pb2_grpc as pb_grpc
from tests.api.conftest import AUTH, SEED_BODY, ServerFactory, wait_final

DAG = """\
name: m
nodes:
  a: {type: tool_call, tool: echo, input: {x: 1}, next: b}
  b: {type: llm_call, model: gpt-3.5-turbo, prompt: hi}
"""


def sample(metrics: AxMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def event(kind: str, node: str = "a", detail: str = "", state: str = "") -> Event:
    return Event(task_id="t-1", event_id=kind + node, kind=kind, at=1.0, node_id=node,
                 detail=detail, state=state)


def test_events_are_counted_by_node_type(tmp_path: Path) -> None:
    async def main() -> AxMetrics:
        store = SqliteStore(path=tmp_path / "ax.db")
        metrics = AxMetrics()
        engine = Engine(store=metrics.wrap_store(store), queue=InProcessQueue(),
                        blob_dir=tmp_path)
        metrics.attach(engine)
        dag = load_dag_text(DAG)
        task_id = (await engine.submit(dag, {})).task_id
        task = TaskRecord(task_id=task_id, dag_hash=dag.hash, dag_name="m")
        metrics.on_commit(task, [
            event("committed"), event("retry", detail="timed out after 3.0s"),
            event("retry", "b", detail="boom"), event("dead", "b", detail="exhausted"),
            event("unavailable", "b"), event("lease_expired"), event("decided", "g"),
            event("task_dead", "", state="DEAD"),
        ])
        metrics.complete_answer(task_id, "b", "stale")
        metrics.complete_answer(task_id, "a", "committed")  # counted from events only
        assert await metrics.drain(engine) >= 2
        await metrics.refresh(engine)
        await store.close()
        return metrics

    m = asyncio.run(main())
    outcomes = "ax_node_outcomes_total"
    assert sample(m, outcomes, node_type="tool_call", outcome="committed") == 1
    assert sample(m, outcomes, node_type="tool_call", outcome="timeout") == 1
    assert sample(m, outcomes, node_type="llm_call", outcome="failed") == 2
    assert sample(m, outcomes, node_type="llm_call", outcome="unavailable") == 1
    assert sample(m, outcomes, node_type="llm_call", outcome="stale") == 1
    assert sample(m, outcomes, node_type="unknown", outcome="committed") == 1
    assert sample(m, "ax_retries_exhausted_total", node_type="llm_call") == 1
    assert sample(m, "ax_lease_expiries_total") == 1
    assert sample(m, "ax_tasks_finished_total", status="DEAD") == 1
    # The submit's own transaction (which also stores the DAG) went through the timed store.
    assert sample(m, "ax_snapshot_write_seconds_count", result="committed") >= 1
    # Node a is WAITING in the in-process queue since the submit.
    assert sample(m, "ax_queue_depth", lane="default") == 1
    assert sample(m, "ax_oldest_waiting_seconds", lane="default") > 0
    assert b"ax_node_outcomes_total" in generate_latest(m.registry)


def test_a_dags_node_types_are_resolved_once_for_all_its_commits(tmp_path: Path) -> None:
    async def main() -> tuple[AxMetrics, list[str]]:
        store = SqliteStore(path=tmp_path / "ax.db")
        metrics = AxMetrics()
        engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path)
        dag = load_dag_text(DAG)
        await engine.put_dag(dag)
        asked: list[str] = []
        get_dag = engine.get_dag

        async def counted(dag_hash: str) -> Any:
            asked.append(dag_hash)
            return await get_dag(dag_hash)

        engine.get_dag = counted  # type: ignore[method-assign]
        task = TaskRecord(task_id="t", dag_hash=dag.hash, dag_name="m")
        for node in ("a", "b") * 50:
            metrics.on_commit(task, [event("committed", node)])
        assert await metrics.drain(engine) == 100
        await store.close()
        return metrics, asked

    m, asked = asyncio.run(main())
    assert len(asked) == 1
    outcomes = "ax_node_outcomes_total"
    assert sample(m, outcomes, node_type="tool_call", outcome="committed") == 50
    assert sample(m, outcomes, node_type="llm_call", outcome="committed") == 50


def test_the_timed_store_times_transactions_that_write_and_no_read_only_one(
        tmp_path: Path) -> None:
    async def main() -> AxMetrics:
        metrics = AxMetrics()
        store = metrics.wrap_store(SqliteStore(path=tmp_path / "ax.db"))
        await store.txn([], [Put("/k", b"v")])
        await store.txn([Mod("/k") == 0], [Put("/k", b"w")], [Get("/k")])  # conflict
        # Reads of a batch (a reconciler pass's snapshots) are not writes.
        await store.txn([], [Get("/k"), Get("/", prefix=True)])
        await store.close()
        return metrics

    m = asyncio.run(main())
    assert sample(m, "ax_snapshot_write_seconds_count", result="committed") == 1
    assert sample(m, "ax_snapshot_write_seconds_count", result="conflict") == 1


def test_pending_records_are_bounded() -> None:
    metrics = AxMetrics(max_pending=2)
    task = TaskRecord(task_id="t", dag_hash="h", dag_name="n")
    for _ in range(5):
        metrics.on_commit(task, [event("committed")])
    assert sample(metrics, "ax_metrics_dropped_total") == 3


def test_scrape_reports_waiting_work(api_server: ServerFactory) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    client = handle.client("submit")
    for _ in range(3):
        assert client.post("/v1/tasks", json=SEED_BODY).status_code == 201
    text = handle.client(None).get("/metrics").text
    assert 'ax_queue_depth{lane="default"} 3.0' in text
    oldest = next(line for line in text.splitlines()
                  if line.startswith('ax_oldest_waiting_seconds{lane="default"} '))
    assert float(oldest.split()[1]) > 0
    assert 'ax_api_requests_total{code="201",method="POST",route="/v1/tasks"} 3.0' in text


LLM_OUTPUT: dict[str, Any] = {"text": "x", "_llm": {
    "model": "m", "endpoint": "default",
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}}


def test_llm_usage_counts_well_formed_usage_only() -> None:
    metrics = AxMetrics()
    metrics.llm_usage(Success(LLM_OUTPUT))
    for malformed in (
        Failure("boom", details=dict(LLM_OUTPUT)), Success([LLM_OUTPUT]), Success("text"),
        Success({"text": "x"}), Success({"_llm": "m"}), Success({"_llm": {"usage": {}}}),
        Success({"_llm": {"model": 7, "usage": {"prompt_tokens": 1}}}),
        Success({"_llm": {"model": "m", "usage": [1, 2]}}),
        Success({"_llm": {"model": "m", "usage": {"prompt_tokens": "9",
                                                  "completion_tokens": True}}}),
        Success({"_llm": {"model": "m", "usage": {"prompt_tokens": -4,
                                                  "completion_tokens": 1.5}}}),
        None,
    ):
        metrics.llm_usage(malformed)
    assert sample(metrics, "ax_llm_tokens_total", model="m", kind="prompt") == 3
    assert sample(metrics, "ax_llm_tokens_total", model="m", kind="completion") == 2
    # Only a committed answer counts: a stale or repeated complete adds nothing.
    for answer in ("committed", "stale", "already-done"):
        metrics.completed("t", "n", answer, Success(LLM_OUTPUT))
    assert sample(metrics, "ax_llm_tokens_total", model="m", kind="prompt") == 6
    assert sample(metrics, "ax_llm_tokens_total", model="m", kind="completion") == 4


def test_in_process_executor_counts_llm_tokens(api_server: ServerFactory,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import axengine.process

    def handler(request: Any, ctx: Any) -> Any:
        return Success(LLM_OUTPUT)

    monkeypatch.setattr(axengine.process, "default_handler", lambda: handler)
    handle = api_server("embedded", reconcile_interval=3600.0)
    client = handle.client("submit")
    task_id = client.post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    assert wait_final(client, task_id)["status"] == "SUCCEEDED"
    text = handle.client(None).get("/metrics").text
    assert 'ax_llm_tokens_total{kind="prompt",model="m"} 3.0' in text
    assert 'ax_llm_tokens_total{kind="completion",model="m"} 2.0' in text


def test_grpc_complete_counts_llm_tokens_once(api_server: ServerFactory) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    client = handle.client("submit")
    task_id = client.post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    md = (("authorization", AUTH["executor"]["Authorization"]),)
    with grpc.insecure_channel(handle.grpc_address) as channel:
        ex = pb_grpc.ExecutorServiceStub(channel)  # type: ignore[no-untyped-call]
        claim = ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id="w1"),
                         metadata=md)
        assert claim.result == pb.CLAIM_RESULT_CLAIMED
        request = pb.CompleteRequest(
            task_id=task_id, node_id="hello", fence=claim.fence, worker_id="w1",
            success=pb.CompleteRequest.Success(output_json=json.dumps(LLM_OUTPUT)))
        stale = pb.CompleteRequest()
        stale.CopyFrom(request)
        stale.fence = claim.fence + 1
        assert ex.Complete(stale, metadata=md).result == pb.COMPLETE_RESULT_STALE
        assert ex.Complete(request, metadata=md).result == pb.COMPLETE_RESULT_COMMITTED
        assert ex.Complete(request, metadata=md).result == pb.COMPLETE_RESULT_ALREADY_DONE
    text = handle.client(None).get("/metrics").text
    assert 'ax_llm_tokens_total{kind="prompt",model="m"} 3.0' in text
    assert 'ax_llm_tokens_total{kind="completion",model="m"} 2.0' in text
