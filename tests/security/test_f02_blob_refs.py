"""Finding 2: executor-supplied blob references opened arbitrary paths.

``Complete`` with an ``output_ref.sha256`` of ``/etc/shadow``, ``../../etc/passwd`` or a
FIFO made the API open that path — before any task or fence check — and a FIFO blocked
the whole event loop. Now only a 64-hex digest is accepted, the path comes from the
digest alone, the file must be a regular file (opened without following links or
blocking) within the size limits, and a stale or unknown (task, node, fence) is answered
before the blob directory is touched.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.security.conftest import all_logs, http, store_state
from tests.topology import Topology, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pb: Any = importlib.import_module("proto.ax.v1.ax_pb2")
pb_grpc: Any = importlib.import_module("proto.ax.v1.ax_pb2_grpc")

#: Seconds a refused call may take before the test calls it blocked.
CALL_TIMEOUT = 10.0
CANARY = "AX-CANARY-SECRET-7f3a9c"


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """The module's deployment; the reconciler is idle after its first pass, so the
    store does not move while the test compares its state."""
    with Topology(executors=2, lease=5.0, reconcile_interval=600) as topo:
        yield topo


@pytest.fixture(scope="module")
def held(topology: Topology) -> Iterator[tuple[str, str, int]]:
    """A node RUNNING under a fence this test holds: ``(task_id, node_id, fence)``.

    The executors are stopped while it is claimed, so the claim is the test's own (a
    long lease, no heartbeats: nothing writes to the store meanwhile).
    """
    for index in range(len(topology.executors)):
        topology.pause_executor(index)
    try:
        # A paused executor's Take may still wait at the API, and a submit would claim
        # the node for it: the submit comes once every Take has ended.
        wait_until(lambda: _takes_waiting(topology) == 0, 15, what="no Take at the API")
        with http(topology, "submitter") as client:
            reply = client.post("/v1/tasks", json={"dag": {"name": "f02", "nodes": {
                "work": {"type": "tool_call", "tool": "echo", "input": {"x": 1}}}}})
        assert reply.status_code == 201, reply.text
        task_id = reply.json()["task_id"]
        claim = _executor(topology).Claim(
            pb.ClaimRequest(task_id=task_id, node_id="work", worker_id="f02-attacker",
                            lease_seconds=600),
            metadata=_auth(topology), timeout=CALL_TIMEOUT)
        assert claim.result == pb.CLAIM_RESULT_CLAIMED
        yield task_id, "work", claim.fence
    finally:
        for index in range(len(topology.executors)):
            topology.resume_executor(index)


def _takes_waiting(topology: Topology) -> float | None:
    text = httpx.get(f"{topology.api_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ax_api_takes_waiting":
                return float(sample.value)
    return None


def _auth(topology: Topology) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {topology.token('executor')}")]


def _executor(topology: Topology) -> Any:
    return pb_grpc.ExecutorServiceStub(grpc.insecure_channel(topology.grpc_target))


def _complete(topology: Topology, task_id: str, node_id: str, fence: int, *,
              sha256: str, size: int = 10, uri: str = "") -> Any:
    request = pb.CompleteRequest(task_id=task_id, node_id=node_id, fence=fence,
                                 worker_id="f02-attacker")
    request.success.output_ref.sha256 = sha256
    request.success.output_ref.size = size
    request.success.output_ref.uri = uri
    return _executor(topology).Complete(request, metadata=_auth(topology),
                                        timeout=CALL_TIMEOUT)


def _refused(topology: Topology, held: tuple[str, str, int], **ref: Any) -> str:
    task_id, node_id, fence = held
    with pytest.raises(grpc.RpcError) as caught:
        _complete(topology, task_id, node_id, fence, **ref)
    error: Any = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    return str(error.details())


def _healthy(topology: Topology) -> None:
    reply = httpx.get(f"{topology.api_url}/healthz", timeout=CALL_TIMEOUT)
    assert reply.status_code == 200


def _plant_fifo(topology: Topology, digest: str) -> Path:
    path = topology.blob_dir / digest[:2] / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.mkfifo(path)
    return path


def test_paths_and_planted_files_are_refused_without_touching_anything(
        topology: Topology, held: tuple[str, str, int], canary_file: Path,
        tmp_path: Path, record_property: Any) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fifo_digest = hashlib.sha256(b"f02 fifo").hexdigest()
    _plant_fifo(topology, fifo_digest)
    # A link to the canary under the canary's own digest: following it would "verify".
    canary_digest = hashlib.sha256(canary_file.read_bytes()).hexdigest()
    link = topology.blob_dir / canary_digest[:2] / canary_digest
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(canary_file)
    before = store_state(topology)

    attacks: list[dict[str, Any]] = [
        {"sha256": "/etc/shadow"},
        {"sha256": "../../etc/passwd"},
        {"sha256": str(canary_file)},
        {"sha256": str(fifo)},
        {"sha256": "A" * 64},                                   # not lowercase hex
        {"sha256": fifo_digest},                                # a FIFO in the blob dir
        {"sha256": canary_digest, "size": canary_file.stat().st_size},  # a symlink
        {"sha256": hashlib.sha256(b"absent").hexdigest(),       # uri is never opened
         "uri": canary_file.as_uri()},
        {"sha256": hashlib.sha256(b"huge").hexdigest(), "size": 2**40},
    ]
    messages = []
    for attack in attacks:
        messages.append(_refused(topology, held, **attack))
        _healthy(topology)

    assert "sha256 digest" in messages[0] and "sha256 digest" in messages[1]
    assert "not a regular file" in messages[5]
    assert "cannot be opened" in messages[6]
    assert "declares" in messages[8]
    assert store_state(topology) == before
    assert not any(CANARY in m for m in messages)
    assert CANARY not in all_logs(topology)
    with http(topology, "submitter") as client:
        task = client.get(f"/v1/tasks/{held[0]}").json()
    node = task["nodes"][held[1]]
    assert node["state"] == "RUNNING" and node["fence"] == held[2]
    record_property("summary", f"{len(attacks)} blob refs refused, /healthz 200 after each, "
                    f"store revision {before.revision} unchanged; e.g. {messages[0]!r}")


def test_a_stale_or_unknown_fence_never_reads_the_blob(
        topology: Topology, held: tuple[str, str, int]) -> None:
    task_id, node_id, fence = held
    absent = hashlib.sha256(b"never written").hexdigest()
    fifo_digest = hashlib.sha256(b"f02 stale fifo").hexdigest()
    _plant_fifo(topology, fifo_digest)
    before = store_state(topology)

    # Reading the blob would have answered INVALID_ARGUMENT ("not found", "not a regular
    # file"); the fence is checked first, so the answer is stale.
    for digest in (absent, fifo_digest):
        for wrong in (fence + 1, fence - 1, 0):
            reply = _complete(topology, task_id, node_id, wrong, sha256=digest)
            assert reply.result == pb.COMPLETE_RESULT_STALE
    for task, node in ((task_id, "no-such-node"), ("t-0000000000000000", node_id)):
        with pytest.raises(grpc.RpcError) as caught:
            _complete(topology, task, node, fence, sha256=absent)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    # A malformed digest is refused even before the fence is looked at.
    with pytest.raises(grpc.RpcError) as refused:
        _complete(topology, task_id, node_id, fence + 1, sha256="/etc/passwd")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    _healthy(topology)
    assert store_state(topology) == before
