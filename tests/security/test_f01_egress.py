"""Finding 1 (critical): tools reached loopback — an inline DAG of ``http_request``
nodes read, wrote and deleted etcd keys through its HTTP gateway on 127.0.0.1.

Replayed with a ``submit``-only token against ``ax api`` + ``ax executor`` (api trust,
the default): every request to loopback, whatever its spelling, is refused before any
connection, and the store is untouched apart from the attacking tasks' own keys.
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Sequence
from typing import Any

import pytest

from tests.security.attack import everything_about, run_tool, submit_tool, wait_final
from tests.security.conftest import Canary, StoreState, http, store_state
from tests.topology import Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _assert_refused(nodes: Sequence[dict[str, object]]) -> None:
    for node in nodes:
        assert node["state"] in ("FAILED", "DEAD"), node
        error = str(node["error"])
        assert "egress_private_allowed" in error and "non-public address" in error, node
        assert not node.get("output"), node


def _foreign_changes(before: StoreState, after: StoreState, task_ids: Sequence[str]) -> set[str]:
    """Keys added or removed that the attacking tasks' own bookkeeping does not explain."""
    def own(key: str) -> bool:
        return (any(task_id in key for task_id in task_ids)
                or key.startswith(("/ax/dags/", "/ax/idempotency/", "/ax/leader/"))
                or key == "/ax/index/version")

    return {k for k in before.keys ^ after.keys if not own(k)}


def test_http_request_cannot_reach_a_loopback_listener(topology: Topology,
                                                       canary: Canary) -> None:
    port = canary.port
    urls = [canary.url("/get"), canary.url("/get", host="localhost"),
            f"http://127.1:{port}/", f"http://2130706433:{port}/",
            f"http://0x7f000001:{port}/", f"http://[::ffff:127.0.0.1]:{port}/",
            f"http://0.0.0.0:{port}/", f"http://[::1]:{port}/"]
    posts = [{"method": "POST", "url": canary.url("/hook"), "json": {"x": 1}},
             {"method": "DELETE", "url": canary.url("/thing")}]
    nodes = run_tool(topology, "http_request", [*urls, *posts])
    _assert_refused(nodes)
    assert canary.connections == 0
    assert "canary" not in everything_about(topology, [str(n["task_id"]) for n in nodes])


def test_http_request_cannot_read_write_or_delete_etcd(topology: Topology, canary: Canary,
                                                       record_property: Any) -> None:
    with http(topology, "submitter2") as other:
        victim = submit_tool(other, "echo", {"mine": True})
        wait_final(other, [victim])
    before = store_state(topology)
    assert f"/ax/tasks/{victim}" in before.keys
    etcd = urllib.parse.urlsplit(topology.store_url)
    base = f"http://{etcd.hostname}:{etcd.port}"
    everything = {"key": _b64("\0"), "range_end": _b64("\0")}
    attacks = [
        {"method": "POST", "url": f"{base}/v3/kv/range", "json": everything},
        {"method": "POST", "url": f"{base}/v3/kv/put",
         "json": {"key": _b64("/ax/pwned"), "value": _b64("yes")}},
        {"method": "POST", "url": f"{base}/v3/kv/deleterange",
         "json": {"key": _b64(f"/ax/tasks/{victim}")}},
        {"method": "POST", "url": f"http://localhost:{etcd.port}/v3/kv/deleterange",
         "json": {"key": _b64("/ax/"), "range_end": _b64("/ax0")}},
        f"{base}/version",
    ]
    nodes = run_tool(topology, "http_request", attacks)
    _assert_refused(nodes)
    after = store_state(topology)
    ids = [str(n["task_id"]) for n in nodes]
    assert _foreign_changes(before, after, ids) == set()
    assert f"/ax/tasks/{victim}" in after.keys
    assert "/ax/pwned" not in after.keys
    seen = everything_about(topology, ids)
    assert victim not in seen and "etcdserver" not in seen
    assert canary.connections == 0
    record_property("summary", f"{len(nodes)} requests at etcd's gateway refused "
                    f"({nodes[0]['error']!r}); foreign key changes 0, victim task intact, "
                    f"canary connections {canary.connections}")


def test_pdf_parser_urls_cannot_reach_loopback(topology: Topology, canary: Canary) -> None:
    nodes = run_tool(topology, "pdf_parser",
                     [canary.url("/r.pdf"), {"pdf_url": canary.url("/x.pdf", host="localhost")}])
    for node in nodes:
        output = node["output"]
        assert isinstance(output, dict) and output["status"] == "failed", node
        assert "egress_private_allowed" in output["error"]
        assert "sha256" not in output
    assert canary.connections == 0
