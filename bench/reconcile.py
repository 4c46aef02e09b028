"""The reconciler's pass cost against the number of finished tasks in the store.

``Reconciler.run_once`` looks only at unfinished tasks, which it finds through the
status index; a store that has finished 10,000 tasks should cost a pass what a store
that has finished 10 does. Measured on the embedded SQLite store (and on etcd when the
runner passes its URL), with the in-process queue: the queue's part of a pass does not
depend on the store.

Filling: one financial task runs to the end under a :class:`~axengine.worker.Worker`
with the no-op handler; its record, snapshots and timeline are then written back under
new task ids with :meth:`Engine.restore_task` — the keys and bytes a run leaves, in a
fraction of the time. Then ``unfinished`` financial tasks are submitted with no worker
running (their first node WAITING) and the first of them has its first node claimed by
this process under a long lease (RUNNING, owner alive), so a pass has work to look at
but nothing to repair. Each size has a store of its own (a SQLite file, or a prefix on
the one etcd) and a reconciler that makes one untimed pass (leadership, the index check,
the first enqueue of the WAITING nodes); then the sizes take turns for ``passes`` timed
passes each, so a drift of the machine's speed weighs on both: the median is the
figure, with the store reads and transactions each pass made.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from axengine.dag import load_dag_mapping
from axengine.engine import Engine, Reconciler, host_pid_owner
from axengine.store import Delete
from axengine.wiring import open_queue, open_store
from axengine.worker import Worker
from bench import shapes
from bench.axrun import CountingStore
from bench.common import summary

__all__ = ["run"]

#: What counts as a store read of a pass: a read-only transaction (a batch of tasks'
#: snapshots) is one.
_READS = ("get", "get_many", "range", "read_txns")


async def _finished_template(engine: Engine, worker: Worker, dag: Any) -> tuple[Any, ...]:
    """Run one financial task to the end; its record, snapshots and timeline."""
    stop = asyncio.Event()
    done = asyncio.Event()
    task_id = f"tmpl-{secrets.token_hex(4)}"

    def on_commit(task: Any, events: Any) -> None:
        if task.task_id == task_id and task.status.final:
            done.set()

    engine.add_listener(on_commit)
    running = asyncio.create_task(worker.run(stop))
    try:
        await engine.submit(dag, {"doc": "template"}, task_id=task_id)
        await asyncio.wait_for(done.wait(), 60)
    finally:
        stop.set()
        await running
    task = await engine.task_record(task_id)
    if task.status.value != "SUCCEEDED":
        raise RuntimeError(f"template task ended {task.status.value}")
    return task, await engine.snapshots(task_id), await engine.events(task_id)


async def _fill(engine: Engine, dag: Any, template: tuple[Any, ...], start: int,
                stop: int) -> None:
    """Restore copies ``start`` .. ``stop - 1`` of the template task."""
    task, snaps, events = template
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        tid = f"done-{i:06d}"
        async with sem:
            await engine.restore_task(dag, replace(task, task_id=tid),
                                      [replace(s, task_id=tid) for s in snaps],
                                      [replace(e, task_id=tid) for e in events])

    await asyncio.gather(*(one(i) for i in range(start, stop)))


class _Store:
    """One store of the measurement: ``finished`` tasks, the unfinished ones, its engine
    and reconciler."""

    def __init__(self, store_url: str, home: Path, prefix: str, owner: str) -> None:
        self.store_url, self.prefix = store_url, prefix
        self.store = CountingStore(open_store(store_url))
        self.queue = open_queue("memory://")
        self.engine = Engine(store=self.store, queue=self.queue, blob_dir=home / "blobs",
                             prefix=prefix)
        self.reconciler = Reconciler(self.engine, owner=owner, interval=3600.0)
        self.times: list[float] = []
        self.counts: Counter[str] = Counter()
        self.report: Any = None

    async def open_tasks(self, dag: Any, unfinished: int, owner: str) -> None:
        """Submit the unfinished tasks (first node WAITING) and hold one node RUNNING."""
        for i in range(unfinished):
            await self.engine.submit(dag, {"doc": f"open-{i}"}, task_id=f"open-{i:03d}")
        claim = await self.engine.claim("open-000", "parse_pdf", worker=owner,
                                        lease_seconds=3600.0)
        if claim.result != "claimed":
            raise RuntimeError(f"could not hold a node RUNNING: {claim.result} {claim.reason}")

    async def timed_pass(self) -> None:
        self.store.counts.clear()
        t = time.perf_counter()
        self.report = await self.reconciler.run_once()
        self.times.append(time.perf_counter() - t)
        self.counts.update(self.store.counts)

    async def close(self) -> None:
        await self.queue.close()
        if self.store_url.startswith("etcd"):
            with contextlib.suppress(Exception):
                await self.store.inner.txn([], [Delete(self.prefix + "/", prefix=True)])
        await self.store.close()


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="ax-bench-rec-"))
    owner = host_pid_owner("bench")
    sizes = sorted(int(n) for n in spec.get("finished", (10, 10_000)))
    passes, unfinished = int(spec.get("passes", 9)), int(spec.get("unfinished", 5))
    stores: dict[int, _Store] = {}
    points: dict[str, Any] = {}
    try:
        dag = load_dag_mapping(shapes.financial())
        template: tuple[Any, ...] = ()
        fill: dict[int, float] = {}
        for n in sizes:
            tag = secrets.token_hex(4)
            url = spec.get("store_url") or f"sqlite:///{home / f'ax-{n}.db'}"
            one = stores[n] = _Store(url, home, f"/bench-rec-{tag}", owner)
            if not template:
                worker = Worker(engine=one.engine, queue=one.queue,
                                handler=shapes.echo_handler, worker_id=owner,
                                concurrency=2, lease_seconds=30.0, poll_timeout=0.05)
                template = await _finished_template(one.engine, worker, dag)
                start = 1  # the template task is one of the finished
            else:
                start = 0
            t = time.perf_counter()
            await _fill(one.engine, dag, template, start, n)
            fill[n] = time.perf_counter() - t
            await one.open_tasks(dag, unfinished, owner)
            await one.reconciler.run_once()  # untimed: index check, first enqueue
        # The sizes take turns, pass by pass, so a drift of the machine's speed weighs
        # on both alike.
        for _ in range(passes):
            for n in sizes:
                await stores[n].timed_pass()
        for n in sizes:
            one = stores[n]
            report = one.report
            assert report is not None
            points[str(n)] = {
                "finished": n, "unfinished": unfinished, "fill_s": round(fill[n], 3),
                "passes": passes,
                "pass_median_ms": round(statistics.median(one.times) * 1000, 4),
                "pass": summary(one.times),
                "reads_per_pass": round(sum(one.counts[k] for k in _READS) / passes, 2),
                "txns_per_pass": round(one.counts["txn"] / passes, 2),
                "tasks_seen": report.tasks,
                "requeued_last_pass": len(report.requeued),
                "expired_last_pass": len(report.expired),
            }
    finally:
        for one in stores.values():
            await one.close()
        shutil.rmtree(home, ignore_errors=True)
    lo, hi = points[str(sizes[0])], points[str(sizes[-1])]
    backend = spec.get("store_url") or "sqlite"
    return {
        "backend": "etcd" if backend.startswith("etcd") else "sqlite",
        "points": points,
        "growth": round(hi["pass_median_ms"] / lo["pass_median_ms"], 3)
        if lo["pass_median_ms"] else None,
        "reads_growth": round(hi["reads_per_pass"] / lo["reads_per_pass"], 3)
        if lo["reads_per_pass"] else None,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Time reconciler passes: ``finished`` (sizes, ascending), ``unfinished``,
    ``passes``, ``store_url`` (default: a SQLite file)."""
    return asyncio.run(_run(spec))
