"""The engine on every store x queue combination, against real etcd and Redis servers:
the financial DAG end to end through a worker, and the seed-000 fence contract."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from axengine.dag import load_dag, load_dag_text
from axengine.engine import Engine, EngineConfig, Reconciler
from axengine.errors import NotFound
from axengine.process import default_handler
from axengine.queue import WorkQueue
from axengine.queue.inprocess import InProcessQueue
from axengine.store import KeyValue, StateStore, StoreWrapper, TxnResult
from axengine.store.embedded import SqliteStore
from axengine.worker import Worker
from executors.contract import Success
from tests.servers import Server

ROOT = Path(__file__).resolve().parents[2]
COMBOS = [("sqlite", "inprocess"), ("sqlite", "redis"), ("etcd", "inprocess"),
          ("etcd", "redis")]

pytestmark = pytest.mark.integration


@pytest.fixture(params=COMBOS, ids=lambda c: f"{c[0]}+{c[1]}")
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    store_kind, queue_kind = request.param
    prefix = f"/t-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {"store": store_kind, "queue": queue_kind, "tmp": tmp_path,
                            "prefix": prefix}
    if store_kind == "etcd":
        spec["etcd"] = request.getfixturevalue("etcd_server")
    if queue_kind == "redis":
        spec["redis"] = request.getfixturevalue("redis_server")
    yield spec


def build(spec: dict[str, Any]) -> Engine:
    store: StateStore
    queue: WorkQueue
    if spec["store"] == "etcd":
        from axengine.store.etcd import EtcdStore

        server: Server = spec["etcd"]
        store = EtcdStore.from_url(server.url)
    else:
        store = SqliteStore(path=spec["tmp"] / "ax.db")
    if spec["queue"] == "redis":
        from axengine.queue.redis import RedisQueue

        queue = RedisQueue.from_url(f"{spec['redis'].url}/0?prefix=q{spec['prefix'][3:]}")
    else:
        queue = InProcessQueue()
    spec["opened"] = store  # closed by the test: the engine does not own it
    return Engine(store=store, queue=queue, blob_dir=spec["tmp"] / "blobs",
                  prefix=spec["prefix"], config=EngineConfig(lease_seconds=10))


def test_financial_dag_runs_on_every_combination(backends: dict[str, Any]) -> None:
    dag = load_dag(ROOT / "dags" / "financial_risk_assessment.yaml")
    pdf = str(ROOT / "dags" / "inputs" / "acme_annual_report.pdf")

    async def main() -> Any:
        engine = build(backends)
        stop = asyncio.Event()
        worker = Worker(engine=engine, queue=engine.queue, handler=default_handler(),
                        concurrency=2, lease_seconds=10,
                        settings={"mail_dir": str(backends["tmp"] / "mail"),
                                  "input_root": str(ROOT / "dags" / "inputs")},
                        poll_timeout=0.1)
        reconciler = Reconciler(engine, owner=worker.worker_id, interval=0.5)
        runner = asyncio.create_task(worker.run(stop))
        repair = asyncio.create_task(reconciler.run(stop))
        try:
            tasks = [(await engine.submit(dag, {"pdf_url": pdf})).task_id for _ in range(3)]
            for _ in range(600):
                views = [await engine.get_task(t) for t in tasks]
                if all(v.task.status.final for v in views):
                    break
                await asyncio.sleep(0.05)
            return views, [await engine.events(t) for t in tasks]
        finally:
            stop.set()
            await asyncio.gather(runner, repair)
            await engine.queue.close()
            await backends["opened"].close()

    views, timelines = asyncio.run(main())
    for view, events in zip(views, timelines, strict=True):
        assert view.task.status.value == "SUCCEEDED"
        path = [e.node_id for e in events if e.kind == "committed"]
        assert path == ["parse_pdf", "extract_metrics", "assess_risk",
                        "send_medium_risk_email", "log_completion"]
    assert len(list((backends["tmp"] / "mail").glob("*.eml"))) == 3


def test_fence_contract_on_every_combination(backends: dict[str, Any]) -> None:
    dag = load_dag_text("""
name: fence
nodes:
  review: {type: tool_call, tool: echo, input: x, retry: 1}
""")

    async def main() -> None:
        now = [1_000_000.0]
        engine = build(backends)
        engine.clock = lambda: now[0]
        try:
            task = (await engine.submit(dag, {}, idempotency_key=f"k{uuid.uuid4().hex}")).task_id
            first = await engine.claim(task, "review", worker="w1", lease_seconds=100)
            assert first.result == "claimed"
            assert (await engine.claim(task, "review", worker="w2")).result == "not-claimable"
            now[0] += 101
            second = await engine.claim(task, "review", worker="w2", lease_seconds=100)
            assert second.request.fence == first.request.fence + 1
            assert await engine.complete(task, "review", fence=first.request.fence,
                                         outcome=Success("old")) == "stale"
            assert await engine.complete(task, "review", fence=second.request.fence,
                                         outcome=Success("new")) == "committed"
            assert await engine.complete(task, "review", fence=second.request.fence,
                                         outcome=Success("new")) == "already-done"
            assert (await engine.get_task(task)).snapshots["review"].output == "new"
        finally:
            await engine.queue.close()
            await backends["opened"].close()

    asyncio.run(main())


class CountingStore(StoreWrapper):
    """Counts the requests made to the store."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.requests = 0

    async def get(self, key: str) -> KeyValue | None:
        self.requests += 1
        return await self.inner.get(key)

    async def get_many(self, keys: Any) -> dict[str, KeyValue]:
        self.requests += 1
        return await self.inner.get_many(keys)

    async def range(self, prefix: str, *, start_after: str | None = None,
                    limit: int = 0) -> list[KeyValue]:
        self.requests += 1
        return await self.inner.range(prefix, start_after=start_after, limit=limit)

    async def txn(self, compares: Any, success: Any, failure: Any = ()) -> TxnResult:
        self.requests += 1
        return await self.inner.txn(compares, success, failure)


@pytest.mark.parametrize("kind", ["sqlite", "etcd"])
def test_a_task_and_a_timeline_are_each_read_in_one_request(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``get_task`` reads the record and the snapshots together, ``timeline`` the record,
    the events and the revision they were read at; a watch from the next revision then
    brings the next commit and nothing already replayed."""
    spec: dict[str, Any] = {"store": kind, "queue": "inprocess", "tmp": tmp_path,
                            "prefix": f"/t-{uuid.uuid4().hex[:8]}"}
    if kind == "etcd":
        spec["etcd"] = request.getfixturevalue("etcd_server")
    dag = load_dag_text("""
name: reads
nodes:
  a: {type: tool_call, tool: echo, input: x, next: b}
  b: {type: tool_call, tool: echo, input: y}
""")

    async def main() -> None:
        engine = build(spec)
        counting = CountingStore(engine._store)
        engine._store = counting
        try:
            task = (await engine.submit(dag, {})).task_id
            counting.requests = 0
            view = await engine.get_task(task)
            assert counting.requests == 1
            assert set(view.snapshots) == {"a", "b"} and view.task.task_id == task
            timeline = await engine.timeline(task)
            assert counting.requests == 2
            assert timeline.task == view.task
            assert timeline.events == await engine.events(task) and timeline.events
            revision = timeline.revision
            assert revision == await engine.revision()
            events = engine.watch_events(task, start_revision=revision + 1)
            claimed = await engine.claim(task, "a", worker="w1")
            assert claimed.result == "claimed"
            first = await asyncio.wait_for(anext(events), 10)
            assert first.kind == "claimed" and first.seq == revision + 1
            await events.aclose()
            for read in (engine.get_task, engine.timeline):
                with pytest.raises(NotFound):
                    await read("t-missing")
        finally:
            await engine.queue.close()
            await spec["opened"].close()

    asyncio.run(main())
