"""Finding 7: gRPC read 64 MiB messages before authenticating them.

Four unauthenticated 60 MB calls took the API from 280 to 683 MB. Now an interceptor
refuses calls without a known token before their bodies are read, and the server reads
at most ``--grpc-max-message-bytes`` (8 MiB by default) from anyone.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests.security.conftest import store_state
from tests.topology import Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pb: Any = importlib.import_module("proto.ax.v1.ax_pb2")
pb_grpc: Any = importlib.import_module("proto.ax.v1.ax_pb2_grpc")

#: Size of one oversized call.
BIG = 60 * 1024 * 1024
#: How much the API may grow over four refused 60 MB calls: gRPC's buffers, not the bodies.
RSS_GROWTH_BOUND = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """The module's deployment, reconciler idle after its first pass (a quiet store)."""
    with Topology(executors=2, lease=5.0, reconcile_interval=600) as topo:
        yield topo


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _channel(topology: Topology) -> grpc.Channel:
    # The client itself must be willing to send the big message.
    return grpc.insecure_channel(topology.grpc_target,
                                 options=[("grpc.max_send_message_length", -1)])


def _big_submit() -> Any:
    return pb.SubmitTaskRequest(dag_yaml="name: x\nnodes: {}\n", input_json="[" + "1," * (
        BIG // 2) + "1]")


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    code: grpc.StatusCode = caught.value.code()  # type: ignore[attr-defined]
    return code


def test_unauthenticated_big_calls_are_refused_unread(topology: Topology,
                                                    record_property: Any) -> None:
    assert topology.api is not None
    request = _big_submit()
    before = store_state(topology)
    with _channel(topology) as channel:
        stub = pb_grpc.AxServiceStub(channel)
        executor = pb_grpc.ExecutorServiceStub(channel)
        # One call first, so lazily built server state is in the baseline.
        assert _code(lambda: stub.SubmitTask(request, timeout=60)) == \
            grpc.StatusCode.UNAUTHENTICATED
        rss_before = _rss(topology.api.pid)
        for metadata in ([], [("authorization", "Bearer not-a-token")],
                         [("authorization", "Basic abc")], []):
            # UNAUTHENTICATED, not RESOURCE_EXHAUSTED: refused before the body was read.
            assert _code(lambda m=metadata: stub.SubmitTask(request, metadata=m, timeout=60)) \
                == grpc.StatusCode.UNAUTHENTICATED
        grown = _rss(topology.api.pid) - rss_before
        # The executor service is behind the same door.
        complete = pb.CompleteRequest(task_id="t", node_id="n", fence=1)
        complete.success.output_json = request.input_json
        assert _code(lambda: executor.Complete(complete, timeout=60)) == \
            grpc.StatusCode.UNAUTHENTICATED
        # A small unauthenticated call is UNAUTHENTICATED (not merely too large).
        assert _code(lambda: stub.GetTask(pb.GetTaskRequest(task_id="t"), timeout=10)) == \
            grpc.StatusCode.UNAUTHENTICATED
    assert grown < RSS_GROWTH_BOUND, f"the API grew by {grown / 2**20:.0f} MiB"
    assert httpx.get(f"{topology.api_url}/healthz", timeout=10).status_code == 200
    assert store_state(topology) == before
    record_property("summary", f"4 unauthenticated {len(request.input_json) / 2**20:.0f} MiB "
                    f"SubmitTask calls: UNAUTHENTICATED; API RSS grew "
                    f"{grown / 2**20:.1f} MiB (bound {RSS_GROWTH_BOUND / 2**20:.0f})")


def test_authenticated_oversized_calls_are_refused(topology: Topology) -> None:
    before = store_state(topology)
    metadata = [("authorization", f"Bearer {topology.token('submitter')}")]
    with _channel(topology) as channel:
        stub = pb_grpc.AxServiceStub(channel)
        assert _code(lambda: stub.SubmitTask(_big_submit(), metadata=metadata, timeout=60)) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Just over the default 8 MiB limit is refused too; the limit is what counts.
        over = pb.SubmitTaskRequest(dag_yaml="name: x\nnodes: {}\n",
                                    input_json='"' + "x" * (8 * 1024 * 1024) + '"')
        assert _code(lambda: stub.SubmitTask(over, metadata=metadata, timeout=60)) == \
            grpc.StatusCode.RESOURCE_EXHAUSTED
    assert store_state(topology) == before
