"""Metrics: event classification, the timed store, gauges read on scrape."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest

from axengine.dag import load_dag_text
from axengine.engine import Engine, Event, TaskRecord
from axengine.metrics import AxMetrics
from axengine.queue.inprocess import InProcessQueue
from axengine.store.embedded import SqliteStore
from tests.api.conftest import SEED_BODY, ServerFactory

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
    assert sample(m, "ax_oldest_waiting_seconds") > 0
    assert b"ax_node_outcomes_total" in generate_latest(m.registry)


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
                  if line.startswith("ax_oldest_waiting_seconds "))
    assert float(oldest.split()[1]) > 0
    assert 'ax_api_requests_total{code="201",method="POST",route="/v1/tasks"} 3.0' in text
