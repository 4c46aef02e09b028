"""The executor's gRPC client completes over ``ExecutorService.CompleteStream`` when the
API has it, and falls back to unary ``Complete`` when it does not (an older API): against
in-process gRPC servers that implement one or the other."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from axengine.errors import InputError
from axengine.worker.grpc_client import STREAM_MAX_BYTES, GrpcEngineClient
from executors.contract import Success
from proto.ax.v1 import ax_pb2 as pb
from proto.ax.v1 import ax_pb2_grpc as pb_grpc


class _Unary(pb_grpc.ExecutorServiceServicer):  # type: ignore[misc]
    """An API without CompleteStream: every Complete commits; one for node "bad" is a
    bad request."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def Complete(self, request: Any, context: Any) -> Any:
        self.calls.append(f"unary {request.node_id}")
        if request.node_id == "bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad node")
        return pb.CompleteReply(result=pb.COMPLETE_RESULT_COMMITTED)


class _Streaming(_Unary):
    async def CompleteStream(self, requests: Any, context: Any) -> Any:
        async for message in requests:
            self.calls.append(f"stream {message.request.node_id}")
            if message.request.node_id == "bad":
                yield pb.CompleteStreamReply(id=message.id, code=3, message="bad node")
            else:
                yield pb.CompleteStreamReply(id=message.id, reply=pb.CompleteReply(
                    result=pb.COMPLETE_RESULT_COMMITTED))


async def _completions(servicer: _Unary, nodes: list[str],
                       output: Any = "x") -> tuple[list[str | BaseException], int]:
    server = grpc.aio.server()
    pb_grpc.add_ExecutorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with GrpcEngineClient(f"127.0.0.1:{port}", retry_for=1) as client:
            answers = await asyncio.gather(
                *(client.complete("t", n, fence=1, outcome=Success(output)) for n in nodes),
                return_exceptions=True)
            streams = client._completions
            return list(answers), (streams.sent if streams is not None else -1)
    finally:
        await server.stop(None)


@pytest.mark.parametrize("streaming", [True, False])
def test_completions_use_the_stream_or_fall_back_to_unary(streaming: bool) -> None:
    servicer = _Streaming() if streaming else _Unary()
    answers, sent = asyncio.run(_completions(servicer, ["a", "bad", "b"]))
    assert answers[0] == answers[2] == "committed"
    # A request's own error is the same error either way, and nothing else fails.
    assert isinstance(answers[1], InputError) and "bad node" in str(answers[1])
    kind = "stream" if streaming else "unary"
    assert sorted(servicer.calls) == sorted(f"{kind} {n}" for n in ("a", "bad", "b"))
    assert (sent == 3) if streaming else (sent >= 1)


def test_a_large_completion_goes_as_a_call_of_its_own() -> None:
    servicer = _Streaming()
    answers, sent = asyncio.run(_completions(servicer, ["big"],
                                             output="x" * (STREAM_MAX_BYTES + 1)))
    assert answers == ["committed"] and sent == 0
    assert servicer.calls == ["unary big"]
