"""ax scaled out: the same workloads through ``ax api`` (REST) and ``ax executor``
processes, on etcd + Redis (``tests/topology.py`` starts them on private ports).

The client submits with :class:`axengine.client.AsyncClient` and follows each task's
event stream (``/v1/tasks/{id}/watch``) until it ends, at most ``inflight`` tasks at a
time; the streamed events give each node's ``ready`` → ``committed`` time, and the last
one the task's final status (no read follows, as for any client that watches). Executors run
the real handlers (the ``echo`` tool), so nothing is stubbed on the server side.

Store writes are counted exactly from etcd: its revision grows by one per committed
write request, whoever sent it (``write_txns``: the API store's transactions that wait
while one of its requests is on its way share one request, docs/stores.md, so this
counts requests, at most one per transaction). CPU time is read from ``/proc`` for every process
of the topology (API, executors, etcd, Redis) and this client.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import shapes
from bench.axrun import anomalies, proc_cpu, slowest_commit, timeline_latencies
from bench.common import cpu_seconds, rate, summary

__all__ = ["peak_rss_mib", "run"]


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size of another process (``VmHWM``), in MiB; 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    from axengine.api._ops import FINAL_EVENT_KINDS
    from axengine.client import AsyncClient
    from axengine.store.etcd import EtcdStore

    kind, size = spec["shape"], int(spec.get("size", 0))
    tasks, inflight = int(spec.get("tasks", 1)), int(spec.get("inflight", 1))
    lane = spec.get("lane")
    mapping = shapes.shape(kind, size, lane=lane)
    pids: dict[str, int] = spec.get("pids", {})
    store = EtcdStore.from_url(spec["etcd_url"])
    statuses: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    slowest: dict[str, Any] = {"node": "", "took": 0.0}
    latencies: dict[str, list[float]] = {}
    submit_times: list[float] = []
    keep = int(spec.get("latency_tasks", tasks))

    async with AsyncClient(spec["api_url"], spec["token"], timeout=120.0) as client:

        async def one(i: int, dag: Any, sem: asyncio.Semaphore, record: bool) -> None:
            async with sem:
                t = time.perf_counter()
                sub = await client.submit(dag, {"doc": f"doc-{i}", "seed": i},
                                          idempotency_key=f"bench-{secrets.token_hex(8)}")
                if record:
                    submit_times.append(time.perf_counter() - t)
                events = [e async for e in client.watch(sub.task_id)]
                # The stream's last event carries the task's final status, so a client
                # that watched needs no read afterwards.
                last = events[-1] if events else None
                if last is not None and last.kind in FINAL_EVENT_KINDS:
                    status = last.state
                else:
                    # The stream broke before the end: wait the task out, then read it.
                    await client.wait(sub.task_id)
                    events = await client.events(sub.task_id)
                    status = (await client.get(sub.task_id))["status"]
                if record:
                    statuses[status] += 1
                    kinds.update(e.kind for e in events)
                    node, took = slowest_commit(events)
                    if took > slowest["took"]:
                        slowest.update(node=node, took=took)
                    if i < keep:
                        for key, values in timeline_latencies(events).items():
                            latencies.setdefault(key, []).extend(values)

        warm = shapes.chain(3, name="bench_warmup")
        await asyncio.gather(*(one(-1 - j, warm, asyncio.Semaphore(2), False)
                               for j in range(2)))
        rev0 = await store.revision()
        cpu0 = {name: proc_cpu(pid) for name, pid in pids.items()}
        client_cpu0, t0 = cpu_seconds(), time.perf_counter()
        sem = asyncio.Semaphore(inflight)
        await asyncio.gather(*(one(i, mapping, sem, True) for i in range(tasks)))
        wall = time.perf_counter() - t0
        client_cpu = cpu_seconds() - client_cpu0
        cpu = {name: round(proc_cpu(pid) - cpu0[name], 3) for name, pid in pids.items()}
        write_txns = await store.revision() - rev0
    await store.close()

    nodes_per_task = shapes.executed_nodes(kind, size)
    nodes = nodes_per_task * tasks
    total_cpu = client_cpu + sum(cpu.values())
    return {
        "shape": kind, "size": size, "tasks": tasks, "inflight": inflight,
        "lane": lane or "default", "nodes_per_task": nodes_per_task, "nodes": nodes,
        "statuses": dict(statuses),
        "wall_s": round(wall, 4),
        "tasks_per_s": rate(tasks, wall), "nodes_per_s": rate(nodes, wall),
        "wall_per_node_ms": round(wall / nodes * 1000, 4),
        "cpu_s": {**cpu, "client": round(client_cpu, 3)},
        "cpu_per_node_ms": round(total_cpu / nodes * 1000, 4),
        "submit": summary(submit_times),
        "node_latency": {k: summary(v) for k, v in latencies.items()},
        "event_kinds": dict(kinds), "anomalies": anomalies(kinds),
        "slowest_commit": {"node": slowest["node"],
                           "claimed_to_committed_s": round(slowest["took"], 4),
                           "share_of_wall": round(slowest["took"] / wall, 4)},
        "write_txns": write_txns,
        "write_txns_per_node": round(write_txns / nodes, 3),
        "peak_rss_mib": {name: peak_rss_mib(pid) for name, pid in pids.items()},
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one workload through the API: ``api_url``, ``token``, ``etcd_url``, ``pids``
    (name → pid of the topology's processes), ``shape``, ``size``, ``tasks``,
    ``inflight``, ``lane``, ``latency_tasks``."""
    return asyncio.run(_run(spec))
