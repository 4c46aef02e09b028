"""Finding 9: listing and event paging cost what the store holds, not what a page holds.

``GET /v1/tasks?limit=1&label=x`` scanned every task, and event paging re-read the
whole timeline for every page. Listing now seeks a secondary index and event pages seek
by event key. Store work is measured by counting the keys an in-process engine over the
deployment's etcd reads (:class:`CountingStore`), not by wall time; the API answers the
same pages.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from axengine import codec
from axengine.api import _ops as ops
from axengine.dag import load_dag_text
from axengine.engine import Engine, Event
from axengine.engine._shell import _event_id
from axengine.keys import StoreKeys
from axengine.queue.inprocess import InProcessQueue
from axengine.store import KeyValue, Op, Put, StoreWrapper
from axengine.store.etcd import EtcdStore
from tests.security.conftest import http
from tests.topology import Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Tasks stored besides the one looked for.
BULK_TASKS = 400
#: Events of the long timeline.
EVENTS = 9000

GATE = load_dag_text("""\
name: listing_gate
nodes:
  review:
    type: human_gateway
    timeout: 3600
""")


class CountingStore(StoreWrapper):
    """A store that counts the keys every read returns (range, get, get_many)."""

    def __init__(self, inner: EtcdStore) -> None:
        super().__init__(inner)
        self.keys_read = 0

    async def get(self, key: str) -> KeyValue | None:
        kv = await self.inner.get(key)
        self.keys_read += kv is not None
        return kv

    async def get_many(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        found = await self.inner.get_many(keys)
        self.keys_read += len(found)
        return found

    async def range(self, prefix: str, *, start_after: str | None = None,
                    limit: int = 0) -> list[KeyValue]:
        kvs = await self.inner.range(prefix, start_after=start_after, limit=limit)
        self.keys_read += len(kvs)
        return kvs


def _engine(topology: Topology, tmp_path: Path) -> tuple[Engine, CountingStore]:
    store = CountingStore(EtcdStore.from_url(topology.store_url))
    engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs")
    return engine, store


def test_label_listing_reads_a_bounded_number_of_keys(topology: Topology, tmp_path: Path,
                                                      record_property: Any) -> None:
    async def main() -> tuple[str, list[int]]:
        engine, store = _engine(topology, tmp_path)
        try:
            needle = (await engine.submit(GATE, {}, labels={"x": "needle"},
                                          submitted_by="topology-submitter")).task_id
            for start in range(0, BULK_TASKS, 50):
                await asyncio.gather(*(engine.submit(GATE, {}, labels={"bulk": "f09"})
                                       for _ in range(start, min(start + 50, BULK_TASKS))))
            costs = []
            store.keys_read = 0
            tasks, _ = await ops.list_page(engine, selector=ops.parse_label_selector(
                "x=needle"), limit=1)
            assert [t.task_id for t in tasks] == [needle]
            costs.append(store.keys_read)
            # Paging everything newest first: each page reads about a page of keys.
            token: str | None = ""
            seen: list[str] = []
            while token is not None:
                store.keys_read = 0
                page, token = await ops.list_page(
                    engine, selector=ops.parse_label_selector("bulk=f09"), limit=50,
                    page_token=token)
                seen += [t.task_id for t in page]
                costs.append(store.keys_read)
            assert len(seen) == len(set(seen)) == BULK_TASKS
            return needle, costs
        finally:
            await store.close()

    needle, costs = asyncio.run(main())
    assert costs[0] <= 4, costs  # index key(s) + the record, not 400+ tasks
    assert max(costs[1:]) <= 2 * 50 + 2, costs
    with http(topology, "submitter") as client:
        reply = client.get("/v1/tasks", params={"limit": 1, "label": "x=needle"}).json()
        assert [t["task_id"] for t in reply["tasks"]] == [needle]
        newest = client.get("/v1/tasks", params={"limit": 2}).json()["tasks"]
        assert newest[0]["created_at"] >= newest[1]["created_at"]
    record_property("summary", f"limit=1&label=x=needle among {BULK_TASKS + 1} tasks read "
                    f"{costs[0]} keys; paging {BULK_TASKS} by 50 read at most "
                    f"{max(costs[1:])} keys per page")


def test_event_pages_read_a_page_of_keys(topology: Topology, tmp_path: Path) -> None:
    async def main() -> tuple[str, list[int], list[Event]]:
        engine, store = _engine(topology, tmp_path)
        try:
            task_id = (await engine.submit(GATE, {})).task_id
            await engine.cancel(task_id, by="test")  # final: nothing commits any more
            # A long, old timeline, written straight into the store.
            base = time.time() - 7200
            keys = StoreKeys()
            for start in range(0, EVENTS, 100):
                ops_: list[Op] = []
                for i in range(start, start + 100):
                    event = Event(task_id=task_id, event_id=_event_id(base + i / 1000),
                                  kind="progress", at=base + i / 1000, node_id="review")
                    ops_.append(Put(keys.event(task_id, event.event_id),
                                    codec.encode_event(event)))
                await store.txn([], ops_)
            costs: list[int] = []
            events: list[Event] = []
            token: str | None = ""
            while token is not None:
                store.keys_read = 0
                page, _, token = await ops.events_page(engine, task_id, limit=150,
                                                       page_token=token)
                events += page
                costs.append(store.keys_read)
            return task_id, costs, events
        finally:
            await store.close()

    task_id, costs, events = asyncio.run(main())
    assert len(events) == len({e.event_id for e in events}) >= EVENTS
    # 100 events per written transaction: a page ends at a transaction's end.
    assert len(costs) >= EVENTS // (150 + 100)
    assert max(costs) <= 150 + 64 + 2, costs  # the task record + a page (+ a txn's tail)
    # Through the API, the token pages the same timeline.
    with http(topology, "submitter") as client:
        seen: list[Any] = []
        params: dict[str, Any] = {"limit": 1000}
        while True:
            reply = client.get(f"/v1/tasks/{task_id}/events", params=params).json()
            seen += reply["events"]
            if not reply["next_page_token"]:
                break
            params = {"limit": 1000, "page_token": reply["next_page_token"]}
        assert [e["event_id"] for e in seen] == [e.event_id for e in events]


def test_unknown_page_tokens_are_refused(topology: Topology) -> None:
    with http(topology, "submitter") as client:
        reply = client.get("/v1/tasks", params={"page_token": "%%%" + secrets.token_hex(2)})
        assert reply.status_code == 400
