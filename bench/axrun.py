"""ax with the engine in this process: embedded (SQLite + in-process queue) or against
real etcd + Redis.

One workload = one shape submitted ``tasks`` times with at most ``inflight`` tasks
unfinished, run by one :class:`~axengine.worker.Worker` (no-op handler) and the
reconciler, as :class:`~axengine.local.LocalSession` wires them, except that the store
and queue are wrapped in counting proxies and the reconciler passes every 0.5 s
(``reconcile_interval``; a session's default is 2 s, ``ax api``'s 1 s): a long workload
pays its passes over the active snapshots more often than a session would. The timed
window runs from the first submit to the moment the last task is final (seen through an
engine listener, no polling). Afterwards the timelines give each node's ``ready`` →
``committed`` time.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import pstats
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from axengine.clock import SYSTEM, wait_event
from axengine.dag import load_dag_mapping
from axengine.engine import Engine, Event, Reconciler, TaskRecord, host_pid_owner
from axengine.queue import WorkItem, WorkQueue
from axengine.store import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Op,
    Put,
    StateStore,
    StoreWrapper,
    TxnResult,
)
from axengine.store.embedded import SqliteStore
from axengine.wiring import open_queue, open_store
from axengine.worker import Worker
from bench import shapes
from bench.common import cpu_seconds, rate, summary

__all__ = [
    "CLEAN_EVENTS",
    "CountingQueue",
    "CountingStore",
    "anomalies",
    "proc_cpu",
    "run",
    "slowest_commit",
    "timeline_latencies",
]


class CountingStore(StoreWrapper):
    """A :class:`StateStore` proxy that counts reads, transactions and writes.

    ``write_txns`` counts transactions whose executed branch wrote something (what costs
    an fsync / a raft round); ``conflicts`` counts transactions whose compares failed.
    """

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()
        #: While a list: the writes of every transaction that wrote, in commit order
        #: (for :func:`replay`).
        self.recorded: list[list[Op]] | None = None

    async def get(self, key: str) -> KeyValue | None:
        self.counts["get"] += 1
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        self.counts["get_many"] += 1
        return await self.inner.get_many(keys)

    async def range(self, prefix: str, *, start_after: str | None = None,
                    limit: int = 0) -> list[KeyValue]:
        self.counts["range"] += 1
        return await self.inner.range(prefix, start_after=start_after, limit=limit)

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = ()) -> TxnResult:
        result = await self.inner.txn(compares, success, failure)
        branch = success if result.succeeded else failure
        writes = sum(isinstance(op, Put | Delete) for op in branch)
        self.counts["txn"] += 1
        self.counts["puts"] += writes
        if writes:
            self.counts["write_txns"] += 1
            if self.recorded is not None:
                self.recorded.append([op for op in branch if isinstance(op, Put | Delete)])
        elif any(isinstance(op, Get) for op in branch):
            self.counts["read_txns"] += 1  # reads several keys or prefixes at once
        if not result.succeeded:
            self.counts["conflicts"] += 1
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingQueue:
    """A :class:`WorkQueue` proxy that counts enqueued items, pops that returned an
    item, acks (alone or with a push) and requeues, and the calls that carry them
    (``calls``: one round trip each on Redis)."""

    def __init__(self, inner: WorkQueue) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()

    async def enqueue(self, items: Sequence[WorkItem], *, delay: float = 0.0,
                      acks: Sequence[tuple[str, WorkItem]] = ()) -> None:
        self.counts["enqueue_calls"] += 1
        self.counts["calls"] += 1
        self.counts["enqueued"] += len(items)
        self.counts["acks"] += len(acks)
        await self.inner.enqueue(items, delay=delay, acks=acks)

    async def pop(self, worker_id: str, *, lanes: Sequence[str] = ("fast", "default"),
                  timeout: float = 1.0, aging: float | None = None) -> WorkItem | None:
        item = await self.inner.pop(worker_id, lanes=lanes, timeout=timeout, aging=aging)
        self.counts["calls"] += 1
        self.counts["pops" if item is not None else "empty_pops"] += 1
        return item

    async def ack(self, worker_id: str, item: WorkItem) -> None:
        self.counts["acks"] += 1
        self.counts["calls"] += 1
        await self.inner.ack(worker_id, item)

    async def requeue(self, worker_id: str, item: WorkItem, *, delay: float = 0.0) -> None:
        self.counts["requeues"] += 1
        self.counts["calls"] += 1
        await self.inner.requeue(worker_id, item, delay=delay)

    async def recover(self, worker_id: str) -> int:
        return await self.inner.recover(worker_id)

    async def queued(self) -> set[tuple[str, str]]:
        return await self.inner.queued()

    async def depth(self, lane: str) -> int:
        return await self.inner.depth(lane)

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) another process has used, from ``/proc`` (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def timeline_latencies(events: Sequence[Event]) -> dict[str, list[float]]:
    """Per node of one task: ``ready``→``committed``, ``ready``→``claimed`` and
    ``claimed``→``committed`` in seconds (first ready, last claim, first commit)."""
    ready: dict[str, float] = {}
    claimed: dict[str, float] = {}
    committed: dict[str, float] = {}
    for event in events:
        if not event.node_id:
            continue
        if event.kind == "ready":
            ready.setdefault(event.node_id, event.at)
        elif event.kind == "claimed":
            claimed[event.node_id] = event.at
        elif event.kind == "committed":
            committed.setdefault(event.node_id, event.at)
    out: dict[str, list[float]] = {"ready_to_committed": [], "ready_to_claimed": [],
                                   "claimed_to_committed": []}
    for node, done in committed.items():
        if node in ready:
            out["ready_to_committed"].append(done - ready[node])
            if node in claimed:
                out["ready_to_claimed"].append(claimed[node] - ready[node])
                out["claimed_to_committed"].append(done - claimed[node])
    return out


def slowest_commit(events: Sequence[Event]) -> tuple[str, float]:
    """The node of one task whose last claim took longest to commit, and that time in
    seconds (``("", 0.0)`` when nothing committed)."""
    claimed: dict[str, float] = {}
    worst = ("", 0.0)
    for event in events:
        if event.kind == "claimed":
            claimed[event.node_id] = event.at
        elif event.kind == "committed" and event.node_id in claimed:
            took = event.at - claimed[event.node_id]
            if took > worst[1]:
                worst = (event.node_id, took)
    return worst


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    home = Path(spec.get("home") or tempfile.mkdtemp(prefix="ax-bench-"))
    prefix = spec.get("prefix") or f"/bench-{secrets.token_hex(4)}"
    store_url = spec.get("store_url") or f"sqlite:///{home / 'ax.db'}"
    queue_url = spec.get("queue_url") or "memory://"
    store = CountingStore(open_store(store_url))
    queue = CountingQueue(open_queue(queue_url))
    engine = Engine(store=store, queue=queue, blob_dir=home / "blobs", prefix=prefix)
    owner = host_pid_owner("bench")
    worker = Worker(engine=engine, queue=queue, handler=shapes.echo_handler, worker_id=owner,
                    concurrency=spec.get("worker_concurrency", 8), lease_seconds=30.0,
                    poll_timeout=0.2)
    interval = spec.get("reconcile_interval", 0.5)
    reconciler = Reconciler(engine, owner=owner, interval=interval,
                            leader_ttl=max(5.0, interval * 4))

    loop = asyncio.get_running_loop()
    waiters: dict[str, asyncio.Future[str]] = {}

    def on_commit(task: TaskRecord, events: Sequence[Event]) -> None:
        if task.status.final:
            fut = waiters.pop(task.task_id, None)
            if fut is not None and not fut.done():
                fut.set_result(task.status.value)

    engine.add_listener(on_commit)
    stop = asyncio.Event()

    async def reconcile_later() -> None:
        if not await wait_event(SYSTEM, stop, interval):
            await reconciler.run(stop)

    # As every ax process starts (AxProcess.start): the first reconciler pass before any
    # traffic (on a fresh store it writes the index marker while there is no task to
    # index), the loop's next pass one interval later.
    await reconciler.pass_if_leader()
    background = [asyncio.create_task(worker.run(stop)),
                  asyncio.create_task(reconcile_later())]
    kind, size = spec["shape"], int(spec.get("size", 0))
    tasks, inflight = int(spec.get("tasks", 1)), int(spec.get("inflight", 1))
    statuses: Counter[str] = Counter()
    ids: list[str] = []

    async def one(i: int, dag: Any, sem: asyncio.Semaphore,
                  submit_times: list[float]) -> None:
        async with sem:
            task_id = f"t-{i:06d}-{secrets.token_hex(3)}"
            fut: asyncio.Future[str] = loop.create_future()
            waiters[task_id] = fut
            t = time.perf_counter()
            # As an embedded session submits (LocalSession.submit): through the worker,
            # which may claim the first node in the submit's transaction.
            await worker.submit(dag, {"doc": f"doc-{i}", "seed": i}, task_id=task_id)
            submit_times.append(time.perf_counter() - t)
            ids.append(task_id)
            statuses[await fut] += 1

    try:
        # Warm-up: imports, template caches, connections, one small task end to end.
        warm = load_dag_mapping(shapes.chain(3, name="bench_warmup"))
        await asyncio.gather(*(one(-1 - j, warm, asyncio.Semaphore(1), []) for j in range(2)))
        ids.clear()
        statuses.clear()
        dag = load_dag_mapping(shapes.shape(kind, size, lane=spec.get("lane")))
        await engine.put_dag(dag)
        store.counts.clear()
        if spec.get("replay") and store_url.startswith("sqlite"):
            store.recorded = []
        queue.counts.clear()
        servers = {name: proc_cpu(pid) for name, pid in spec.get("server_pids", {}).items()}
        profiler = cProfile.Profile() if spec.get("profile") else None
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        sem = asyncio.Semaphore(inflight)
        submit_times: list[float] = []
        await asyncio.gather(*(one(i, dag, sem, submit_times) for i in range(tasks)))
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        server_cpu = {name: round(proc_cpu(pid) - servers[name], 3)
                      for name, pid in spec.get("server_pids", {}).items()}
        counts_store, counts_queue = dict(store.counts), dict(queue.counts)
        recorded, store.recorded = store.recorded, None
        latencies: dict[str, list[float]] = {}
        kinds: Counter[str] = Counter()
        slowest = ("", 0.0)
        for task_id in ids[: int(spec.get("latency_tasks", tasks))]:
            events = await engine.events(task_id)
            kinds.update(e.kind for e in events)
            worst = slowest_commit(events)
            slowest = worst if worst[1] > slowest[1] else slowest
            for key, values in timeline_latencies(events).items():
                latencies.setdefault(key, []).extend(values)
    finally:
        stop.set()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await queue.close()
        # Leave a shared etcd clean for the next workload (SQLite homes are removed).
        if store_url.startswith("etcd"):
            with contextlib.suppress(Exception):
                await store.inner.txn([], [Delete(prefix + "/", prefix=True)])
        await store.close()
        if not spec.get("home"):
            shutil.rmtree(home, ignore_errors=True)

    nodes_per_task = shapes.executed_nodes(kind, size)
    nodes = nodes_per_task * tasks
    result: dict[str, Any] = {
        "shape": kind, "size": size, "tasks": tasks, "inflight": inflight,
        "worker_concurrency": spec.get("worker_concurrency", 8),
        "lane": spec.get("lane") or "default",
        "declared_nodes_per_task": len(dag.nodes), "nodes_per_task": nodes_per_task,
        "nodes": nodes, "statuses": dict(statuses),
        "wall_s": round(wall, 4),
        "tasks_per_s": rate(tasks, wall), "nodes_per_s": rate(nodes, wall),
        "wall_per_node_ms": round(wall / nodes * 1000, 4),
        "cpu_s": round(cpu, 3), "cpu_per_node_ms": round(cpu / nodes * 1000, 4),
        "server_cpu_s": server_cpu,
        "submit": summary(submit_times),
        "node_latency": {k: summary(v) for k, v in latencies.items()},
        "event_kinds": dict(kinds), "anomalies": anomalies(kinds),
        "slowest_commit": {"node": slowest[0],
                           "claimed_to_committed_s": round(slowest[1], 4),
                           "share_of_wall": round(slowest[1] / wall, 4) if wall else 0.0},
        "store": counts_store, "queue": counts_queue,
        "write_txns_per_node": round(counts_store.get("write_txns", 0) / nodes, 3),
        "txns_per_node": round(counts_store.get("txn", 0) / nodes, 3),
        "reads_per_node": round(sum(counts_store.get(k, 0) for k in
                                    ("get", "get_many", "range", "read_txns")) / nodes, 3),
        "queue_calls_per_node": round(counts_queue.get("calls", 0) / nodes, 3),
    }
    if recorded:
        result["store_replay"] = await replay(recorded, nodes)
    if profiler is not None:
        result["profile"] = profile_summary(profiler, int(spec.get("profile_top", 25)))
    return result


async def replay(writes: Sequence[Sequence[Op]], nodes: int) -> dict[str, Any]:
    """The store alone: ``writes`` (a workload's write transactions, in commit order)
    committed one after another on a new :class:`SqliteStore` (``synchronous=FULL``, as
    the engine's), without compares and without the engine. What a node costs beyond
    it is the engine's; what it costs is a bound no engine on this store goes under."""
    home = Path(tempfile.mkdtemp(prefix="ax-bench-replay-"))
    store = SqliteStore(path=home / "replay.db")
    took: list[float] = []
    try:
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        for ops in writes:
            t = time.perf_counter()
            await store.txn((), ops)
            took.append(time.perf_counter() - t)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    finally:
        await store.close()
        shutil.rmtree(home, ignore_errors=True)
    return {"txns": len(writes), "puts_per_txn": round(
                sum(isinstance(op, Put) for ops in writes for op in ops) / len(writes), 2),
            "bytes_per_txn": round(sum(len(op.value) for ops in writes for op in ops
                                       if isinstance(op, Put)) / len(writes)),
            "wall_per_node_ms": round(wall / nodes * 1000, 4),
            "cpu_per_node_ms": round(cpu / nodes * 1000, 4),
            "txn": summary(took)}


#: Timeline events of a clean run; any other kind (``lease_expired``, ``retry``,
#: ``unavailable``, ``failed``...) means a node did not go straight through.
CLEAN_EVENTS = frozenset({"submitted", "ready", "claimed", "committed", "skipped",
                          "task_succeeded"})


def anomalies(kinds: Counter[str]) -> dict[str, int]:
    """Event kinds of ``kinds`` that a clean run does not produce, with their counts."""
    return {k: n for k, n in sorted(kinds.items()) if k not in CLEAN_EVENTS}


def profile_summary(profiler: cProfile.Profile, top: int) -> dict[str, Any]:
    """The ``top`` functions by own time and by cumulative time, as text rows."""
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    rows = []
    for (path, line, func), (_cc, ncalls, tottime, cumtime, _) in \
            stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{_short(path)}:{line}({func})", "calls": ncalls,
                     "tottime_s": round(tottime, 4), "cumtime_s": round(cumtime, 4),
                     "tottime_share": round(tottime / total, 4) if total else 0.0})
    by_tot = sorted(rows, key=lambda r: -r["tottime_s"])[:top]
    by_cum = sorted(rows, key=lambda r: -r["cumtime_s"])[:top]
    return {"total_s": round(total, 4), "by_tottime": by_tot, "by_cumtime": by_cum}


def _short(path: str) -> str:
    for marker in ("/axengine/", "/executors/", "/bench/", "/site-packages/", "/lib/python3"):
        if marker in path:
            return marker.strip("/") + "/" + path.split(marker, 1)[1]
    return path


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one workload described by ``spec`` and return its figures.

    Keys of ``spec``: ``shape``, ``size``, ``tasks``, ``inflight``, ``worker_concurrency``,
    ``store_url``/``queue_url`` (default: embedded), ``home``, ``prefix``,
    ``server_pids`` (name → pid whose CPU time to report), ``latency_tasks``,
    ``reconcile_interval``, ``profile``.
    """
    return asyncio.run(_run(spec))
