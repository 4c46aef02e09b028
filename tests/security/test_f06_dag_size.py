"""Finding 6: DAGs the validator accepted could not be committed by the store.

A 20,000-node fan-out blocked the API for 32 s, answered 500 ("too many operations in
txn") and left its DAG record stored; YAML parsing ran on the event loop. Now submit and
validate refuse a DAG whose largest transition cannot fit the store's transaction limit
(a 400 naming both numbers and what to raise) before anything is stored, a DAG at the
limit runs to the end, and parsing runs in worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from axengine.engine import TXN_FIXED_OPS
from tests.security.conftest import http, store_state
from tests.servers import ETCD_MAX_TXN_OPS
from tests.topology import Topology, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: What the API is told etcd takes (etcd itself takes more: only the API's view counts).
DECLARED_MAX_TXN_OPS = 200
#: The widest fan-out that fits: src + WIDTH + join nodes, 2 ops each plus the fixed part.
WIDTH = (DECLARED_MAX_TXN_OPS - TXN_FIXED_OPS) // 2 - 2


class _SmallTxnTopology(Topology):
    @property
    def store_url(self) -> str:
        assert self.etcd is not None
        return f"{self.etcd.url}?max_txn_ops={DECLARED_MAX_TXN_OPS}"


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """A deployment whose store URL declares a small transaction limit; the reconciler
    is idle after its first pass (a quiet store)."""
    assert ETCD_MAX_TXN_OPS > DECLARED_MAX_TXN_OPS
    with _SmallTxnTopology(executors=2, lease=5.0, reconcile_interval=600) as topo:
        yield topo


def _fanout(width: int) -> dict[str, Any]:
    nodes: dict[str, Any] = {"src": {"type": "tool_call", "tool": "echo", "input": {"i": -1},
                                     "next": [f"w{i}" for i in range(width)]}}
    for i in range(width):
        nodes[f"w{i}"] = {"type": "tool_call", "tool": "echo", "input": {"i": i},
                          "next": "join"}
    nodes["join"] = {"type": "tool_call", "tool": "echo", "input": {"i": width}}
    return {"name": f"f06_fanout_{width}", "nodes": nodes}


def test_a_dag_larger_than_the_store_takes_is_refused_before_storing(
        topology: Topology, record_property: Any) -> None:
    dag = _fanout(WIDTH + 1)
    needed = 2 * (WIDTH + 3) + TXN_FIXED_OPS
    before = store_state(topology)
    with http(topology, "submitter") as client:
        reply = client.post("/v1/tasks", json={"dag": dag})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        checked = client.post("/v1/dags/validate", json={"dag": dag})
    assert error["type"] == "DagError"
    text = error["message"] + " ".join(p["hint"] or "" for p in error["problems"])
    for part in (str(needed), str(DECLARED_MAX_TXN_OPS), "--max-txn-ops", "max_txn_ops="):
        assert part in text, text
    assert checked.status_code == 200
    assert checked.json()["valid"] is False
    assert checked.json()["problems"][0]["code"] == "too-large"
    after = store_state(topology)
    assert after == before
    assert not any(key.startswith("/ax/dags/") and key not in before.keys for key in after.keys)
    record_property("summary", f"{WIDTH + 1}-wide fan-out: 400 {error['message']!r}; "
                    f"store revision {before.revision} and keys unchanged")


def test_a_dag_at_the_limit_runs_to_the_end(topology: Topology) -> None:
    dag = _fanout(WIDTH)
    with http(topology, "submitter") as client:
        assert client.post("/v1/dags/validate", json={"dag": dag}).json()["valid"] is True
        reply = client.post("/v1/tasks", json={"dag": dag})
        assert reply.status_code == 201, reply.text
        task_id = reply.json()["task_id"]
        task = wait_until(lambda: (lambda t: t if t["status"] in (
            "SUCCEEDED", "FAILED", "DEAD") else None)(client.get(f"/v1/tasks/{task_id}").json()),
            120, interval=0.2, what="fan-out at the limit finished")
    assert task["status"] == "SUCCEEDED"
    assert task["counts"] == {"SUCCEEDED": WIDTH + 2}


def _yaml_bomb(seed: int) -> str:
    """416 bytes that expand to 10^9 values: the loader stops at its limit, after
    seconds of CPU work."""
    text = f'a: &a ["x{seed}","x","x","x","x","x","x","x","x","x"]\n'
    for level in range(1, 9):
        prev, name = chr(96 + level), chr(97 + level)
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]\n"
    return text + "name: bomb\nnodes: {x: {type: tool_call, tool: echo, input: *i}}\n"


def test_yaml_bombs_do_not_stall_the_event_loop(topology: Topology) -> None:
    bombs = 10
    finished = threading.Semaphore(0)
    remaining = [bombs]
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {topology.token('submitter')}"}

    def validate(seed: int) -> int:
        try:
            reply = httpx.post(f"{topology.api_url}/v1/dags/validate", headers=headers,
                               json={"dag_yaml": _yaml_bomb(seed)}, timeout=300)
            return reply.status_code
        finally:
            with lock:
                remaining[0] -= 1
            finished.release()

    before = store_state(topology)
    with ThreadPoolExecutor(bombs) as pool:
        futures = [pool.submit(validate, seed) for seed in range(bombs)]
        # Once one validation is done the API is certainly busy with the rest (two parse
        # at a time, the others wait their turn).
        assert finished.acquire(timeout=300)
        health = httpx.get(f"{topology.api_url}/healthz", timeout=300)
        with lock:
            still_running = remaining[0]
        assert health.status_code == 200
        assert still_running > 0, "/healthz was answered only after every validation"
        assert [f.result() for f in futures] == [200] * bombs
    assert store_state(topology) == before
