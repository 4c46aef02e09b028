"""The floor: what the primitives a durable engine cannot avoid cost on this machine,
measured in the same run as the engine.

A durable engine commits at least two compare-and-swap transactions per node (claim and
complete: without the claim two workers could run the node, without the complete its
result is lost) and moves the node through the queue once (push, reliable pop into a
processing list, ack). So::

    floor cost per node  = 2 / txn_rate + 1 / queue_round_trip_rate
    floor nodes/s        = 1 / floor cost per node

with rates taken at the same concurrency from one Python client process, like the
engine's (the client's CPU time per operation adds up, so the costs add). Measured:

- etcd: ``EtcdStore.txn([Mod(key) == rev], [Put(key, value)])`` sequentially and from
  8 concurrent coroutines (each on its own key), one request per transaction (the store's
  merging of concurrent transactions is off: ``merge_in_flight=0``), and the same through
  raw aetcd (``aetcd.Client.transaction``) to show the store adapter's own cost;
- Redis: ``RedisQueue`` enqueue → pop (``LMOVE`` into the processing list, in a Lua
  script) → ack (``LREM``), sequentially and 8 concurrent, and the same three commands
  with raw redis-py;
- SQLite: ``SqliteStore`` (WAL, ``synchronous=FULL``) CAS transactions, sequential (it
  serialises writers anyway), and the in-process queue's round trip.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import rate, summary

__all__ = ["floor_nodes_per_s", "run"]

Op = Callable[[], Awaitable[None]]


async def _measure(make_op: Callable[[int], Awaitable[Op]], *, concurrency: int,
                   seconds: float, min_ops: int = 20) -> dict[str, Any]:
    """Run ``concurrency`` loops of the op made by ``make_op(worker)`` for ``seconds``
    (at least ``min_ops`` ops in all); report latency and rate."""
    ops = [await make_op(w) for w in range(concurrency)]
    for op in ops:  # warm-up: connections, script loading
        await op()
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def loop(op: Op) -> None:
        while time.perf_counter() < end or len(latencies) < min_ops:
            t = time.perf_counter()
            await op()
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(op) for op in ops))
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "ops": len(latencies), "wall_s": round(wall, 3),
            "ops_per_s": rate(len(latencies), wall), "latency": summary(latencies)}


async def _etcd_store(url: str, seconds: float) -> dict[str, Any]:
    from axengine.store import Delete, Mod, Put
    from axengine.store.etcd import EtcdStore
    from axengine.store.settings import EtcdSettings

    # One CAS transaction per request, as the primitive costs: the store's merging of
    # concurrent transactions (what the engine may gain over this floor) is off here.
    store = EtcdStore.from_settings(
        dataclasses.replace(EtcdSettings.from_url(url), merge_in_flight=0))
    prefix = f"/floor-{secrets.token_hex(4)}"
    value = b"x" * 256  # about a snapshot's size

    async def make(w: int) -> Op:
        key = f"{prefix}/k{w}"
        rev = (await store.txn([], [Put(key, value)])).revision

        async def op() -> None:
            nonlocal rev
            result = await store.txn([Mod(key) == rev], [Put(key, value)])
            if not result.succeeded:
                raise RuntimeError("floor: CAS lost on a private key")
            rev = result.revision

        return op

    try:
        seq = await _measure(make, concurrency=1, seconds=seconds)
        c8 = await _measure(make, concurrency=8, seconds=seconds)
        await store.txn([], [Delete(prefix + "/", prefix=True)])
    finally:
        await store.close()
    return {"sequential": seq, "concurrent_8": c8}


async def _etcd_raw(host: str, port: int, seconds: float) -> dict[str, Any]:
    import aetcd

    client = aetcd.Client(host=host, port=port)
    await client.connect()
    prefix = f"/floor-raw-{secrets.token_hex(4)}"
    value = b"x" * 256
    tx = client.transactions

    async def make(w: int) -> Op:
        key = f"{prefix}/k{w}".encode()
        put = await client.put(key, value)
        rev = int(put.header.revision)

        async def op() -> None:
            nonlocal rev
            ok, responses = await client.transaction(compare=[tx.mod(key) == rev],
                                                     success=[tx.put(key, value)], failure=[])
            if not ok:
                raise RuntimeError("floor: raw CAS lost on a private key")
            rev = int(responses[0].response_put.header.revision)

        return op

    try:
        seq = await _measure(make, concurrency=1, seconds=seconds)
        c8 = await _measure(make, concurrency=8, seconds=seconds)
        await client.delete_prefix(prefix.encode())
    finally:
        await client.close()
    return {"sequential": seq, "concurrent_8": c8}


async def _redis_queue(url: str, seconds: float) -> dict[str, Any]:
    from axengine.queue import WorkItem
    from axengine.queue.redis import RedisQueue

    prefix = f"floor-{secrets.token_hex(4)}"
    queue = RedisQueue.from_url(f"{url}?prefix={prefix}")

    async def make(w: int) -> Op:
        worker = f"floor-w{w}"
        item = WorkItem("t-floor", f"n{w}")

        async def op() -> None:
            await queue.enqueue([item])
            popped = await queue.pop(worker, timeout=0)
            if popped is None:
                raise RuntimeError("floor: nothing popped")
            await queue.ack(worker, popped)

        return op

    try:
        seq = await _measure(make, concurrency=1, seconds=seconds)
        c8 = await _measure(make, concurrency=8, seconds=seconds)
    finally:
        await queue.close()
    return {"sequential": seq, "concurrent_8": c8}


async def _redis_raw(url: str, seconds: float) -> dict[str, Any]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    prefix = f"floor-raw-{secrets.token_hex(4)}"

    async def make(w: int) -> Op:
        lane, processing, item = f"{prefix}:lane", f"{prefix}:processing:{w}", f"item-{w}"

        async def op() -> None:
            await client.lpush(lane, item)
            popped = await client.lmove(lane, processing, "RIGHT", "LEFT")
            if popped is None:
                raise RuntimeError("floor: nothing popped")
            await client.lrem(processing, 1, item)

        return op

    try:
        seq = await _measure(make, concurrency=1, seconds=seconds)
        c8 = await _measure(make, concurrency=8, seconds=seconds)
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
    return {"sequential": seq, "concurrent_8": c8}


async def _sqlite(seconds: float) -> dict[str, Any]:
    from axengine.store import Mod, Put
    from axengine.store.embedded import SqliteStore

    home = Path(tempfile.mkdtemp(prefix="ax-bench-floor-"))
    store = SqliteStore(path=home / "floor.db", synchronous="FULL")
    value = b"x" * 256

    async def make(w: int) -> Op:
        key = f"/floor/k{w}"
        rev = (await store.txn([], [Put(key, value)])).revision

        async def op() -> None:
            nonlocal rev
            result = await store.txn([Mod(key) == rev], [Put(key, value)])
            if not result.succeeded:
                raise RuntimeError("floor: CAS lost on a private key")
            rev = result.revision

        return op

    try:
        seq = await _measure(make, concurrency=1, seconds=seconds)
    finally:
        await store.close()
        shutil.rmtree(home, ignore_errors=True)
    return {"synchronous": store.settings.synchronous, "sequential": seq}


async def _inprocess_queue(seconds: float) -> dict[str, Any]:
    from axengine.queue import WorkItem
    from axengine.queue.inprocess import InProcessQueue

    queue = InProcessQueue()

    async def make(w: int) -> Op:
        item = WorkItem("t-floor", f"n{w}")

        async def op() -> None:
            await queue.enqueue([item])
            popped = await queue.pop(f"w{w}", timeout=0)
            if popped is None:
                raise RuntimeError("floor: nothing popped")
            await queue.ack(f"w{w}", popped)

        return op

    try:
        seq = await _measure(make, concurrency=1, seconds=seconds)
        c8 = await _measure(make, concurrency=8, seconds=seconds)
    finally:
        await queue.close()
    return {"sequential": seq, "concurrent_8": c8}


def floor_nodes_per_s(txn_per_s: float, queue_rt_per_s: float) -> float:
    """Nodes/s if a node cost exactly 2 transactions and 1 queue round trip."""
    if txn_per_s <= 0 or queue_rt_per_s <= 0:
        return 0.0
    return round(1.0 / (2.0 / txn_per_s + 1.0 / queue_rt_per_s), 1)


def _floors(out: dict[str, Any]) -> dict[str, Any]:
    floors: dict[str, Any] = {}
    if "sqlite" in out and "inprocess_queue" in out:
        sq, iq = out["sqlite"]["sequential"], out["inprocess_queue"]["sequential"]
        floors["sqlite_inprocess"] = {
            "nodes_per_s": floor_nodes_per_s(sq["ops_per_s"], iq["ops_per_s"]),
            "per_node_ms": round(2 * sq["latency"]["mean_ms"] + iq["latency"]["mean_ms"],
                                 4),
        }
    if "etcd" in out and "redis_queue" in out:
        for mode in ("sequential", "concurrent_8"):
            e, r = out["etcd"][mode], out["redis_queue"][mode]
            floors[f"etcd_redis_{mode}"] = {
                "nodes_per_s": floor_nodes_per_s(e["ops_per_s"], r["ops_per_s"]),
                "per_node_ms": round(2 * 1000 / e["ops_per_s"] + 1000 / r["ops_per_s"], 4),
            }
    return floors


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    seconds = float(spec.get("seconds", 2.0))
    out: dict[str, Any] = {"seconds_per_measurement": seconds}
    # ``section``: only the etcd + Redis floor, measured again where a section starts.
    whole = not spec.get("section")
    if whole:
        out["sqlite"] = await _sqlite(seconds)
        out["inprocess_queue"] = await _inprocess_queue(min(seconds, 1.0))
    if spec.get("etcd_url"):
        out["etcd"] = await _etcd_store(spec["etcd_url"], seconds)
        if whole:
            host, port = spec["etcd_url"].split("://", 1)[1].rsplit(":", 1)
            out["etcd_raw_aetcd"] = await _etcd_raw(host, int(port), seconds)
    if spec.get("redis_url"):
        out["redis_queue"] = await _redis_queue(spec["redis_url"], seconds)
        if whole:
            out["redis_raw"] = await _redis_raw(spec["redis_url"], seconds)
    out["floor"] = _floors(out)
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure the floor; ``spec``: ``seconds`` per measurement, ``etcd_url``
    (``etcd://127.0.0.1:PORT``), ``redis_url`` (``redis://127.0.0.1:PORT/0``),
    ``section`` (true: only the etcd + Redis primitives the floors are made of)."""
    return asyncio.run(_run(spec))
