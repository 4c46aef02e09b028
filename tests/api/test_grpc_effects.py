"""The fenced outbox through the API: ExecutorService EffectBegin / EffectDone.

A stale fence is answered ``LEASE_RESULT_STALE`` and writes nothing (the store revision
does not move); a request without a fence is refused rather than let through.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from proto.ax.v1 import ax_pb2 as pb
from tests.api.conftest import ServerFactory, ServerHandle
from tests.api.test_grpc import TOKEN, Stubs, code_of, submit


@pytest.fixture
def stubs_for() -> Iterator[Any]:
    opened: list[Stubs] = []

    def make(handle: ServerHandle) -> Stubs:
        opened.append(Stubs(handle.grpc_address))
        return opened[-1]

    yield make
    for stubs in opened:
        stubs.close()


def test_a_stale_fence_begins_and_finishes_nothing(api_server: ServerFactory,
                                                    stubs_for: Any, backend: str) -> None:
    handle = api_server(backend, worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    ex, md = stubs.ex, TOKEN["executor"]
    task_id = submit(stubs)
    claim = ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id="w1",
                                     lease_seconds=30), metadata=md)
    assert claim.result == pb.CLAIM_RESULT_CLAIMED
    ids = {"task_id": task_id, "node_id": "hello", "worker_id": "w1"}

    def state(key: str) -> int:
        return int(ex.EffectGet(pb.EffectGetRequest(key=key), metadata=md).state)

    # A fence the node does not hold: refused, and the store does not move.
    before = handle.revision()
    begin = ex.EffectBegin(pb.EffectBeginRequest(key="fx-1", fence=claim.fence + 1, **ids),
                           metadata=md)
    assert begin.lease == pb.LEASE_RESULT_STALE
    assert handle.revision() == before and state("fx-1") == pb.EFFECT_STATE_NEW
    # The holder begins; a stale fence cannot finish it.
    begun = ex.EffectBegin(pb.EffectBeginRequest(key="fx-1", fence=claim.fence, **ids),
                           metadata=md)
    assert begun.lease == pb.LEASE_RESULT_OK and begun.previous == pb.EFFECT_STATE_NEW
    before = handle.revision()
    done = ex.EffectDone(pb.EffectDoneRequest(key="fx-1", fence=claim.fence + 1,
                                              result_json='{"id":"x"}', **ids), metadata=md)
    assert done.lease == pb.LEASE_RESULT_STALE
    assert handle.revision() == before and state("fx-1") == pb.EFFECT_STATE_SENDING
    # The task is cancelled: the claim's own fence no longer holds the node either.
    stubs.ax.CancelTask(pb.CancelTaskRequest(task_id=task_id), metadata=TOKEN["admin"])
    before = handle.revision()
    late_done = ex.EffectDone(pb.EffectDoneRequest(key="fx-1", fence=claim.fence,
                                                   result_json='{"id":"x"}', **ids),
                              metadata=md)
    late_begin = ex.EffectBegin(pb.EffectBeginRequest(key="fx-2", fence=claim.fence, **ids),
                                metadata=md)
    assert (late_done.lease, late_begin.lease) == (pb.LEASE_RESULT_STALE,
                                                   pb.LEASE_RESULT_STALE)
    assert handle.revision() == before
    assert (state("fx-1"), state("fx-2")) == (pb.EFFECT_STATE_SENDING, pb.EFFECT_STATE_NEW)


def test_an_unfenced_effect_call_is_refused(api_server: ServerFactory,
                                            stubs_for: Any) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    stubs = stubs_for(handle)
    ex, md = stubs.ex, TOKEN["executor"]
    task_id = submit(stubs)
    ex.Claim(pb.ClaimRequest(task_id=task_id, node_id="hello", worker_id="w1"), metadata=md)
    ids = {"task_id": task_id, "node_id": "hello", "worker_id": "w1"}
    before = handle.revision()
    assert code_of(ex.EffectBegin, pb.EffectBeginRequest(key="fx", **ids),
                   metadata=md) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(ex.EffectDone, pb.EffectDoneRequest(key="fx", result_json="{}", **ids),
                   metadata=md) == grpc.StatusCode.INVALID_ARGUMENT
    assert handle.revision() == before
