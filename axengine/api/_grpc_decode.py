"""Answer undecodable gRPC requests with ``INVALID_ARGUMENT``.

grpc.aio decodes a request with the handler's deserializer before the servicer runs;
when that raises (corrupt wire format, bad UTF-8 in a string field) grpcio answers
``UNKNOWN`` with the exception's text — a client's mistake reported as ours.
:class:`DecodeInterceptor` wraps every handler's deserializer so a failure becomes a
:class:`Malformed` value, and the wrapped behaviour aborts with ``INVALID_ARGUMENT``
before the servicer sees it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["DecodeInterceptor"]


@dataclass(frozen=True)
class Malformed:
    """A request body the deserializer could not decode, and why."""

    reason: str


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # any decoding failure is the caller's bad bytes
            return Malformed(f"request body is not a valid protobuf message: {exc}")

    return decode


def _unary_request(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def unary(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        return await behaviour(request, context)

    return unary


def _streaming_response(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def stream(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        async for item in behaviour(request, context):
            yield item

    return stream


class DecodeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Turn request-decoding failures into ``INVALID_ARGUMENT`` (unary requests; a
    streamed request's messages arrive as :class:`Malformed` values instead)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap the handler's deserializer and behaviour; other handlers pass as they are."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        decode = _safe(handler.request_deserializer)
        if handler.stream_stream is not None:
            # Each message that does not decode reaches the servicer as a Malformed
            # value, which answers INVALID_ARGUMENT (ExecutorServicer.CompleteStream).
            return grpc.stream_stream_rpc_method_handler(
                handler.stream_stream, request_deserializer=decode,
                response_serializer=handler.response_serializer)
        if handler.request_streaming:
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary_request(handler.unary_unary), request_deserializer=decode,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _streaming_response(handler.unary_stream), request_deserializer=decode,
                response_serializer=handler.response_serializer)
        return handler
