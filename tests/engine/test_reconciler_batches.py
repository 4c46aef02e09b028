"""A reconciler pass and a metrics scrape read the snapshots of unfinished tasks a batch
of tasks per read-only transaction, not one read per task, and still see every task.

With one read per task a pass over 1,000 unfinished tasks (say, waiting at approval
gates) made 1,000 sequential round trips to etcd: 0.83 s per pass, every second.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from axengine.dag import load_dag_mapping
from axengine.engine import SNAPSHOT_BATCH, Engine, EngineConfig, Reconciler
from axengine.metrics import AxMetrics
from axengine.queue.inprocess import InProcessQueue
from axengine.records import NodeState, TaskRecord
from axengine.store import StateStore
from axengine.store.embedded import SqliteStore
from bench.axrun import CountingStore
from tests.engine.conftest import FakeClock
from tests.engine.test_complete_and_claim import _drain
from tests.servers import Server

TASKS = 2 * SNAPSHOT_BATCH + 22  # three batches, the last one short

TWO_STEPS = {"name": "two", "nodes": {
    "first": {"type": "tool_call", "tool": "echo", "input": "1", "next": ["second"]},
    "second": {"type": "tool_call", "tool": "echo", "input": "2"},
}}


class _Counting(CountingStore):
    """The benchmark's counting store (``range`` reads, ``read_txns``), with
    ``max_txn_ops`` as given."""

    def __init__(self, inner: StateStore, max_txn_ops: int | None) -> None:
        super().__init__(inner)
        self._max_txn_ops = max_txn_ops

    @property
    def max_txn_ops(self) -> int | None:
        return self._max_txn_ops


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> StateStore:
    if kind == "etcd":
        from axengine.store.etcd import EtcdStore

        server: Server = request.getfixturevalue("etcd_server")
        return EtcdStore.from_url(server.url)
    return SqliteStore(path=tmp_path / "ax.db")


@pytest.mark.parametrize("max_txn_ops", [None, 24], ids=["batch-64", "max-txn-ops-24"])
@pytest.mark.parametrize("kind", ["sqlite", "etcd"])
def test_a_pass_and_a_scrape_read_snapshots_in_batches_and_miss_no_task(
        kind: str, max_txn_ops: int | None, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    async def main() -> None:
        clock = FakeClock()
        store = _Counting(_store(kind, tmp_path, request), max_txn_ops)
        queue = InProcessQueue()
        engine = Engine(store=store, queue=queue, blob_dir=tmp_path / "blobs",
                        config=EngineConfig(), clock=clock,
                        prefix=f"/batches-{uuid.uuid4().hex[:8]}")
        dag = load_dag_mapping(TWO_STEPS, tools={"echo"}, models=set())
        tasks = [(await engine.submit(dag, {"n": i})).task_id for i in range(TASKS)]
        # The queue loses every entry node: only a pass that reads every task's
        # snapshots offers them all again.
        assert len(await _drain(queue)) == TASKS
        clock.advance(1.0)
        reconciler = Reconciler(engine, owner="r")
        await reconciler.run_once()  # leadership and the index check
        assert len(await _drain(queue)) == TASKS
        clock.advance(1.0)

        store.counts.clear()
        report = await reconciler.run_once()
        batch = min(SNAPSHOT_BATCH, max_txn_ops or SNAPSHOT_BATCH)
        assert report.tasks == TASKS
        assert sorted(report.requeued) == sorted((t, "first") for t in tasks)
        assert sorted(i.task_id for i in await _drain(queue)) == sorted(tasks)
        assert store.counts["read_txns"] == math.ceil(TASKS / batch)
        # The status index is read by range; no task's snapshots are.
        assert store.counts["range"] <= 4

        metrics = AxMetrics()
        store.counts.clear()
        await metrics.refresh(engine)
        assert metrics.registry.get_sample_value("ax_nodes", {"state": "waiting"}) == TASKS
        assert metrics.registry.get_sample_value("ax_nodes", {"state": "running"}) == 0
        assert store.counts["read_txns"] == math.ceil(TASKS / batch)
        assert store.counts["range"] <= 4
        await store.close()

    asyncio.run(main())


def test_snapshots_each_yields_every_task_in_order_with_its_own_snapshots(
        tmp_path: Path) -> None:
    async def main() -> None:
        store = _Counting(SqliteStore(path=tmp_path / "ax.db"), None)
        engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs")
        dag = load_dag_mapping(TWO_STEPS, tools={"echo"}, models=set())
        ids = [(await engine.submit(dag, {"n": i})).task_id for i in range(70)]
        tasks = [await engine.task_record(t) for t in ids]
        # Nothing stored under this one: no snapshots, still yielded.
        tasks.append(TaskRecord(task_id="no-such-task", dag_hash="", dag_name=""))
        seen = [(t.task_id, sorted((s.node_id, s.state.value) for s in snaps))
                async for t, snaps in engine.snapshots_each(tasks)]
        assert [t for t, _ in seen] == [t.task_id for t in tasks]
        assert all(nodes == [("first", "WAITING"), ("second", "PENDING")]
                   for _, nodes in seen[:-1])
        assert seen[-1] == ("no-such-task", [])
        only_waiting = [[s.node_id for s in snaps] async for _, snaps in
                        engine.snapshots_each(tasks[:3], states={NodeState.WAITING})]
        assert only_waiting == [["first"]] * 3

        # Tasks with many nodes (wide maps) make smaller batches: at most
        # SNAPSHOT_BATCH_NODES snapshots by their counters, a larger task alone.
        def weighing(task: TaskRecord, nodes: int) -> TaskRecord:
            return replace(task, counts={"PENDING": nodes})

        for weights, reads in (([600] * 5, 5), ([300] * 7, 3), ([2000, 10, 10], 2),
                               ([10, 2000, 10], 3), ([1] * 70, 2)):
            store.counts.clear()
            heavy = [weighing(t, n) for t, n in zip(tasks, weights, strict=False)]
            got = [t.task_id async for t, _ in engine.snapshots_each(heavy)]
            assert got == [t.task_id for t in heavy]
            assert store.counts["read_txns"] == reads, weights
        await store.close()

    asyncio.run(main())


GATE = {"name": "gate", "nodes": {
    "ask": {"type": "human_gateway", "description": "approve {{ input.n }}?",
            "next": ["after"]},
    "after": {"type": "tool_call", "tool": "echo", "input": "done"},
}}


def test_an_approvals_page_reads_its_tasks_gates_in_batches(tmp_path: Path) -> None:
    async def main() -> None:
        store = _Counting(SqliteStore(path=tmp_path / "ax.db"), None)
        engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs")
        dag = load_dag_mapping(GATE, tools={"echo"}, models=set())
        tasks = [(await engine.submit(dag, {"n": i})).task_id for i in range(TASKS)]
        store.counts.clear()
        approvals, _ = await engine.approvals_page(limit=TASKS)
        assert sorted(a.task.task_id for a in approvals) == sorted(tasks)
        assert {a.node_id for a in approvals} == {"ask"}
        assert sorted(a.description for a in approvals) == sorted(
            f"approve {i}?" for i in range(TASKS))
        assert store.counts["read_txns"] == math.ceil(TASKS / SNAPSHOT_BATCH)
        assert store.counts["range"] <= 2  # the PAUSED index
        await store.close()

    asyncio.run(main())
