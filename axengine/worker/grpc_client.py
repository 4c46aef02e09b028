"""The worker's :class:`~axengine.worker.EngineClient` over the API's ``ExecutorService``.

An ``ax executor`` process talks to the control plane only through this client: claim,
heartbeat, progress, complete and the side-effect outbox, each carrying the fence its
claim got. A Kubernetes Job's container (:mod:`axengine.runners.job_entry`) uses it too:
``get_run`` fetches the run its executor claimed, by fence, and the rest is the same.

Answers that are control flow (``stale``, ``already-done``, ``not-claimable``) come back
as results; real errors come back as gRPC status codes and are mapped to the
:class:`~axengine.errors.AxError` tree here, at the edge.

Retries. ``UNAVAILABLE`` (the API is restarting, or it cannot reach etcd) and
``DEADLINE_EXCEEDED`` are retried inside the client with exponential backoff and jitter
for at most ``retry_for`` seconds, then raised as :class:`ApiUnavailable`. Every call
of this service is safe to repeat:

- heartbeat, progress, get_run, effect_get and effect_done are idempotent;
- a repeated complete answers ``already-done`` (same fence, same output) or ``stale``
  (the first one moved the node on): never a second commit;
- a claim whose reply was lost left the node RUNNING under this worker; the repeat
  answers ``not-claimable`` and the worker acks, so the node waits out its lease and the
  reconciler hands it to someone (a lease of delay, nothing lost);
- an effect_begin whose reply was lost left the record SENDING; the repeat reports it
  and the record becomes UNKNOWN, which a handler settles by asking the transport, or a
  person does. An effect is never silently performed twice.

The outbox calls carry the fence of the attempt that makes them, like every other call;
the API decides them in the transaction that writes the record and answers ``stale``
(nothing written) to an attempt that no longer holds the node.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import grpc

from axengine import codec
from axengine.activity import Activity
from axengine.engine import ClaimResult, Completed
from axengine.errors import AxError, BlobError, InputError, StoreError, class_for_grpc
from axengine.limits import kept_text
from executors.contract import Failure, NodeRequest, Outcome, Paused, Success, Unavailable
from proto.ax.v1 import ax_pb2, ax_pb2_grpc

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_RETRY_FOR",
    "GrpcEngineClient",
    "error_from_rpc",
]

log = logging.getLogger("axengine.worker.grpc")

#: Seconds one RPC may take before it fails with DEADLINE_EXCEEDED (and is retried).
DEFAULT_CALL_TIMEOUT = 10.0
#: Seconds the client keeps retrying an UNAVAILABLE API before raising ApiUnavailable.
#: Long enough to ride out an API restart or an etcd leader change.
DEFAULT_RETRY_FOR = 60.0
#: First backoff delay; doubles per retry up to :data:`MAX_BACKOFF`, with full jitter.
INITIAL_BACKOFF = 0.05
#: Largest delay between two retries.
MAX_BACKOFF = 1.0
#: Largest gRPC message sent or received (rendered inputs and outputs travel inline).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_CODES: Mapping[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}

#: Largest Complete request sent over the completion stream; a larger one (an output
#: passed inline) goes as a call of its own, so that it holds up no small one behind it.
STREAM_MAX_BYTES = 256 * 1024

_LEASE: Mapping[int, str] = {ax_pb2.LEASE_RESULT_OK: "ok", ax_pb2.LEASE_RESULT_STALE: "stale"}
_COMPLETE: Mapping[int, str] = {
    ax_pb2.COMPLETE_RESULT_COMMITTED: "committed",
    ax_pb2.COMPLETE_RESULT_STALE: "stale",
    ax_pb2.COMPLETE_RESULT_ALREADY_DONE: "already-done",
}
_EFFECT_STATES: Mapping[int, str] = {
    ax_pb2.EFFECT_STATE_NEW: "NEW",
    ax_pb2.EFFECT_STATE_SENDING: "SENDING",
    ax_pb2.EFFECT_STATE_DONE: "DONE",
    ax_pb2.EFFECT_STATE_UNKNOWN: "UNKNOWN",
}


def error_from_rpc(exc: grpc.aio.AioRpcError, what: str) -> AxError:
    """The :class:`AxError` an RPC failure stands for (``what`` names the call): the
    inverse of the API's error table (:func:`axengine.errors.class_for_grpc`), so
    ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` are :class:`~axengine.errors.ApiUnavailable`
    and a code the table does not name is a plain :class:`AxError`."""
    cls = class_for_grpc(exc.code().name)
    detail = exc.details() or exc.code().name
    return cls(f"{what}: {detail} (gRPC {exc.code().name})")


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, details=details)


class _Stream:
    """One open ``CompleteStream`` call: the requests sent on it that wait for their
    reply, and the task that reads the replies."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.writing = asyncio.Lock()
        self.error: grpc.aio.AioRpcError | None = None
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for reply in self.call:
                answer = self.waiting.pop(reply.id, None)
                if answer is not None and not answer.done():  # (else its caller gave up)
                    answer.set_result(reply)
            self.fail(_rpc_error(grpc.StatusCode.UNAVAILABLE,
                                 "the API ended the completion stream"))
        except grpc.aio.AioRpcError as exc:
            self.fail(exc)
        except asyncio.CancelledError:
            self.fail(_rpc_error(grpc.StatusCode.UNAVAILABLE, "completion stream closed"))
            raise

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        """End the stream: every request still waiting gets ``error``."""
        if self.error is None:
            self.error = error
        waiting, self.waiting = self.waiting, {}
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(error)
        self.call.cancel()


class _CompleteStream:
    """``Complete`` calls multiplexed over one long-lived ``CompleteStream``: a message
    costs the API about a quarter of a unary call. A stream that breaks fails the
    requests waiting on it with ``UNAVAILABLE`` (retried by the client: a repeated
    completion is safe); the next request opens a new one. A server without the method
    (``UNIMPLEMENTED``) gets unary calls from then on."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self._stream: _Stream | None = None
        self._ids = itertools.count(1)
        self.unsupported = False
        #: Requests sent over a stream (for tests and the curious).
        self.sent = 0

    async def complete(self, request: Any, *, timeout: float, metadata: Any = None) -> Any:
        """As ``stub.Complete(request, timeout=..., metadata=...)``: the reply, or an
        ``AioRpcError`` (the request's own error, or ``UNAVAILABLE`` when the stream
        broke). A new stream opens with ``metadata``."""
        stream = self._stream
        if stream is None or stream.error is not None:
            stream = self._stream = _Stream(self._stub.CompleteStream(metadata=metadata))
        key = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        stream.waiting[key] = answer
        try:
            async with stream.writing:
                await stream.call.write(ax_pb2.CompleteStreamRequest(id=key, request=request))
            self.sent += 1
            reply = await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            # A stream that answers nothing in time is dropped with what waits on it.
            stream.fail(_rpc_error(grpc.StatusCode.UNAVAILABLE, "completion stream silent"))
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"no answer on the completion stream within {timeout:g}s"
                             ) from None
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            if stream.error is None:  # a write failed: the stream is of no more use
                details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else ""
                stream.fail(_rpc_error(grpc.StatusCode.UNAVAILABLE,
                                       f"completion stream broke: {details}"))
            assert stream.error is not None
            if stream.error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unsupported = True
                return await self._stub.Complete(request, timeout=timeout,
                                                 metadata=metadata)
            raise stream.error from None
        finally:
            stream.waiting.pop(key, None)
        if reply.code:
            raise _rpc_error(_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.message)
        return reply.reply

    def close(self) -> None:
        if self._stream is not None:
            self._stream.fail(_rpc_error(grpc.StatusCode.UNAVAILABLE, "client closed"))
            self._stream.reader.cancel()
            self._stream = None


class GrpcEngineClient:
    """:class:`~axengine.worker.EngineClient` backed by the API server's gRPC
    ``ExecutorService``.

    Args:
        target: ``host:port`` of the API's gRPC listener.
        token: Bearer token with the ``executor`` role ("" when auth is off).
        timeout: Seconds per RPC.
        retry_for: Seconds to keep retrying UNAVAILABLE / DEADLINE_EXCEEDED before
            raising :class:`~axengine.errors.ApiUnavailable`.
        channel_options: Extra gRPC channel options.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str = "",
        timeout: float = DEFAULT_CALL_TIMEOUT,
        retry_for: float = DEFAULT_RETRY_FOR,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.retry_for = retry_for
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # gRPC backs off reconnects up to 120 s by default; an API replica that
            # restarts in two seconds must be found again in about that time.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.enable_retries", 0),
            *channel_options,
        ]
        self._channel: grpc.aio.Channel | None = None
        # The generated stub is untyped: its methods are Any either way.
        self._stub: Any = None
        self._completions: _CompleteStream | None = None
        # The calls after a claim carry the worker id the claim named (the protocol's
        # calls name only the fence), so the client remembers each claim of this process.
        self._claims: dict[tuple[str, str], tuple[int, str]] = {}
        #: Calls retried after UNAVAILABLE / DEADLINE_EXCEEDED since the client started.
        self.retries = 0

    # ------------------------------------------------------------------ plumbing

    @property
    def stub(self) -> Any:
        """The ``ExecutorService`` stub (channel opened on first use)."""
        if self._stub is None:
            # Created on first use so the channel binds to the running event loop.
            self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._stub = ax_pb2_grpc.ExecutorServiceStub(self._channel)  # type: ignore[no-untyped-call]
            self._completions = _CompleteStream(self._stub)
        return self._stub

    async def close(self) -> None:
        """Close the channel (calls in flight are cancelled)."""
        if self._completions is not None:
            self._completions.close()
            self._completions = None
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    async def __aenter__(self) -> GrpcEngineClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def _call(self, what: str, method: Callable[..., Awaitable[Any]],
                    request: Any, *, timeout: float | None = None) -> Any:
        give_up = time.monotonic() + self.retry_for
        delay = INITIAL_BACKOFF
        while True:
            try:
                return await method(request, timeout=timeout or self.timeout,
                                    metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                pause = random.uniform(0.0, delay)
                if exc.code() not in _RETRY_CODES or time.monotonic() + pause >= give_up:
                    raise error_from_rpc(exc, f"{what} via {self.target}") from exc
                self.retries += 1
                log.debug("%s: %s; retrying in %.2fs", what, exc.code().name, pause)
                await asyncio.sleep(pause)
                delay = min(delay * 2, MAX_BACKOFF)

    def _fence_of(self, task_id: str, node_id: str) -> tuple[int, str]:
        return self._claims.get((task_id, node_id), (0, ""))

    # ------------------------------------------------------------------ operations

    async def claim(self, task_id: str, node_id: str, *, worker: str,
                    lease_seconds: float | None = None) -> ClaimResult:
        """Claim a node for ``worker``; see :meth:`axengine.engine.Engine.claim`."""
        reply = await self._call(f"claim {task_id}/{node_id}", self.stub.Claim,
                                 ax_pb2.ClaimRequest(task_id=task_id, node_id=node_id,
                                                     worker_id=worker,
                                                     lease_seconds=lease_seconds or 0.0))
        result = reply.result
        if result == ax_pb2.CLAIM_RESULT_CLAIMED:
            self._claims[(task_id, node_id)] = (reply.fence, worker)
            return self._claimed(task_id, node_id, reply)
        if result == ax_pb2.CLAIM_RESULT_NOT_YET:
            # Backing off, or waiting for a dependency's ramp after an outage.
            return ClaimResult("not-claimable", reason=reply.reason or "backoff",
                               retry_after=max(0.0, reply.not_before - time.time()))
        if result == ax_pb2.CLAIM_RESULT_DEAD:
            return ClaimResult("dead", reason=reply.reason or "deadline or attempt budget")
        if result == ax_pb2.CLAIM_RESULT_NOT_CLAIMABLE:
            return ClaimResult("not-claimable", reason=reply.reason)
        raise StoreError(f"claim {task_id}/{node_id}: the API answered an unknown result "
                         f"{result}; is it a newer version than this executor?")

    async def take(self, *, worker: str, lanes: Iterable[str], wait_seconds: float,
                   lease_seconds: float | None = None) -> ClaimResult | None:
        """Wait at the API, up to ``wait_seconds``, for a task submitted there whose first
        node its submit claims for ``worker`` in one of ``lanes`` (``Take``): that claim,
        or None when none came. An API server older than ``Take`` answers
        ``UNIMPLEMENTED``, which raises :class:`~axengine.errors.AxError`."""
        reply = await self._call(
            f"take for {worker}", self.stub.Take,
            ax_pb2.TakeRequest(worker_id=worker, lanes=list(lanes),
                               lease_seconds=lease_seconds or 0.0, wait_seconds=wait_seconds),
            timeout=wait_seconds + self.timeout)
        if not reply.HasField("claim"):
            return None
        return self._handed(f"take for {worker}", reply.claim, worker)

    async def get_run(self, task_id: str, node_id: str, *, fence: int) -> ClaimResult | None:
        """The run of the attempt holding ``fence`` — what its claim answered — or None
        when ``fence`` is not the node's current fence under a live lease (``STALE``);
        see :meth:`axengine.engine.Engine.get_run`. Changes nothing.

        Raises:
            NotFound: The task or the node does not exist.
        """
        reply = await self._call(f"get_run {task_id}/{node_id}", self.stub.GetRun,
                                 ax_pb2.GetRunRequest(task_id=task_id, node_id=node_id,
                                                      fence=fence))
        if reply.result != ax_pb2.LEASE_RESULT_OK:
            return None
        if reply.run.result != ax_pb2.CLAIM_RESULT_CLAIMED or reply.run.fence != fence:
            raise StoreError(f"get_run {task_id}/{node_id}: the API answered a run of fence "
                             f"{reply.run.fence} for fence {fence}")
        return self._claimed(task_id, node_id, reply.run)

    def _claimed(self, task_id: str, node_id: str, reply: Any) -> ClaimResult:
        """The ``claimed`` :class:`ClaimResult` a ``ClaimReply`` carries."""
        config = json.loads(reply.config_json) if reply.config_json else {}
        request = NodeRequest(
            task_id=task_id, node_id=node_id, node_type=reply.node_type,
            attempt=reply.attempt, fence=reply.fence, config=config,
            input=self._input_of(reply), labels=dict(reply.labels),
            input_revision=reply.input_revision,
            checkpoint=json.loads(reply.checkpoint_json) if reply.checkpoint_json else None,
            resume=json.loads(reply.resume_json) if reply.resume_json else None,
        )
        # An older API sends no timeout: the node's own.
        timeout = reply.timeout or float(config.get("timeout") or 0.0) or 300.0
        return ClaimResult("claimed", request=request, timeout=timeout,
                           timeout_grace=reply.timeout_grace, timeout_cap=reply.timeout_cap,
                           lease_until=reply.lease_until, submitted_by=reply.submitted_by,
                           dag_hash=reply.dag_hash)

    @staticmethod
    def _input_of(reply: Any) -> Any:
        if reply.input_json:
            return json.loads(reply.input_json)
        ref = reply.input_ref
        if not ref.uri:
            return None
        # The API inlines inputs for executors; a blob reference can only be followed
        # when the blob directory is shared (a file: URI visible from here).
        parts = urlsplit(ref.uri)
        if parts.scheme != "file":
            raise BlobError(f"node input is in blob {ref.uri}, which this executor cannot "
                            "read; let the API inline inputs or share the blob directory")
        data = Path(url2pathname(parts.path)).read_bytes()
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise BlobError(f"blob {ref.uri} does not match its sha256 {ref.sha256}")
        return json.loads(data)

    async def heartbeat(self, task_id: str, node_id: str, *, fence: int,
                        lease_seconds: float | None = None,
                        activity: Activity | None = None) -> str:
        """Renew the lease (with the run's recent ``activity``, if sampled): ``ok`` or
        ``stale``."""
        _, worker = self._fence_of(task_id, node_id)
        reply = await self._call(f"heartbeat {task_id}/{node_id}", self.stub.Heartbeat,
                                 ax_pb2.HeartbeatRequest(
                                     task_id=task_id, node_id=node_id, fence=fence,
                                     worker_id=worker, lease_seconds=lease_seconds or 0.0,
                                     activity=codec.activity_message(activity)))
        return self._lease_answer(task_id, node_id, fence, reply.result)

    async def progress(self, task_id: str, node_id: str, *, fence: int, marker: str,
                       lease_seconds: float | None = None) -> str:
        """Record a checkpoint (renewing the lease): ``ok`` or ``stale``."""
        _, worker = self._fence_of(task_id, node_id)
        reply = await self._call(f"progress {task_id}/{node_id}", self.stub.Progress,
                                 ax_pb2.ProgressRequest(task_id=task_id, node_id=node_id,
                                                        fence=fence, worker_id=worker,
                                                        marker=marker,
                                                        lease_seconds=lease_seconds or 0.0))
        return self._lease_answer(task_id, node_id, fence, reply.result)

    async def checkpoint(self, task_id: str, node_id: str, *, fence: int,
                         state: Any) -> str:
        """Save state for the node's next run: ``ok`` or ``stale``."""
        _, worker = self._fence_of(task_id, node_id)
        reply = await self._call(f"checkpoint {task_id}/{node_id}", self.stub.Checkpoint,
                                 ax_pb2.CheckpointRequest(
                                     task_id=task_id, node_id=node_id, fence=fence,
                                     worker_id=worker, state_json=codec.canonical_json(state)))
        return self._lease_answer(task_id, node_id, fence, reply.result)

    def _lease_answer(self, task_id: str, node_id: str, fence: int, result: int) -> str:
        answer = _LEASE.get(result, "stale")
        if answer == "stale":
            self._forget(task_id, node_id, fence)
        return answer

    def _forget(self, task_id: str, node_id: str, fence: int) -> None:
        if self._claims.get((task_id, node_id), (None, ""))[0] == fence:
            del self._claims[(task_id, node_id)]

    async def complete(self, task_id: str, node_id: str, *, fence: int,
                       outcome: Outcome) -> str:
        """Commit an outcome: ``committed``, ``stale`` or ``already-done``."""
        _, worker = self._fence_of(task_id, node_id)
        request = self._complete_request(task_id, node_id, fence, worker, outcome)
        return (await self._complete(request)).answer

    async def complete_and_claim(self, task_id: str, node_id: str, *, fence: int,
                                 outcome: Outcome, worker: str, lanes: Iterable[str],
                                 lease_seconds: float | None = None,
                                 claim_node: str = "", claim_task: str = "") -> Completed:
        """Commit an outcome and claim the node the worker's slot runs next for
        ``worker`` in the same transaction; see
        :meth:`axengine.engine.Engine.complete_and_claim`."""
        request = self._complete_request(task_id, node_id, fence, worker, outcome)
        request.claim_lanes.extend(lanes)
        request.claim_node = claim_node
        request.claim_task = claim_task
        request.claim_lease_seconds = lease_seconds or 0.0
        return await self._complete(request)

    async def _complete(self, request: Any) -> Completed:
        task_id, node_id = request.task_id, request.node_id
        method = self.stub.Complete
        streams = self._completions
        if streams is not None and not streams.unsupported \
                and request.ByteSize() <= STREAM_MAX_BYTES:
            method = streams.complete
        reply = await self._call(f"complete {task_id}/{node_id}", method, request)
        self._forget(task_id, node_id, request.fence)
        answer = _COMPLETE.get(reply.result)
        if answer is None:
            raise StoreError(f"complete {task_id}/{node_id}: unknown result {reply.result}")
        following = None
        if reply.HasField("next"):
            # (An older server names no task: the claimed node is of this task.)
            following = self._handed(f"complete {task_id}/{node_id}", reply.next,
                                     request.worker_id, task_id=task_id)
        return Completed(answer, next=following, acked=reply.acked)

    def _handed(self, what: str, claim: Any, worker: str, *, task_id: str = "",
                ) -> ClaimResult:
        """The claim a reply hands over for ``worker`` (a completion's next node, a
        Take's), recorded as held; ``task_id``: its task when the reply names none."""
        claimed_task = claim.task_id or task_id
        if claim.result != ax_pb2.CLAIM_RESULT_CLAIMED or not claimed_task \
                or not claim.node_id:
            raise StoreError(f"{what}: the API answered a claim without a claimed node")
        self._claims[(claimed_task, claim.node_id)] = (claim.fence, worker)
        return self._claimed(claimed_task, claim.node_id, claim)

    @staticmethod
    def _complete_request(task_id: str, node_id: str, fence: int, worker: str,
                          outcome: Outcome) -> Any:
        request = ax_pb2.CompleteRequest(task_id=task_id, node_id=node_id, fence=fence,
                                         worker_id=worker)
        if isinstance(outcome, Success):
            known = kept_text(outcome, outcome.output)  # (the runner's check made it)
            request.success.output_json = (known[1] if known is not None
                                           else codec.canonical_json(outcome.output))
        elif isinstance(outcome, Unavailable):
            request.unavailable.dependency = outcome.dependency
            request.unavailable.evidence = outcome.evidence
            if outcome.retry_after is not None:
                request.unavailable.retry_after = outcome.retry_after
        elif isinstance(outcome, Paused):
            request.paused.reason = outcome.reason
            if outcome.seconds is not None:
                request.paused.seconds = outcome.seconds
            if outcome.checkpoint is not None:
                request.paused.checkpoint_json = codec.canonical_json(outcome.checkpoint)
        elif isinstance(outcome, Failure):
            request.failure.message = outcome.message
            request.failure.retryable = outcome.retryable
            if outcome.details:
                request.failure.details_json = codec.canonical_json(dict(outcome.details))
        else:
            raise InputError(f"complete {task_id}/{node_id}: not an outcome: {outcome!r}")
        return request

    async def effect_begin(self, key: str, *, task_id: str, node_id: str,
                           fence: int) -> str:
        """Outbox NEW → SENDING under ``fence``: the state before the call, or ``stale``
        when the fence no longer holds the node (nothing written: the effect must not
        be performed)."""
        _, worker = self._fence_of(task_id, node_id)
        reply = await self._call(f"effect_begin {key}", self.stub.EffectBegin,
                                 ax_pb2.EffectBeginRequest(key=key, task_id=task_id,
                                                           node_id=node_id, fence=fence,
                                                           worker_id=worker))
        if reply.lease == ax_pb2.LEASE_RESULT_STALE:
            return "stale"
        state = _EFFECT_STATES.get(reply.previous)
        if state is None:
            raise StoreError(f"effect_begin {key}: unknown state {reply.previous}")
        return state

    async def effect_done(self, key: str, result: Mapping[str, Any], *, task_id: str,
                          node_id: str, fence: int) -> str:
        """Outbox → DONE with ``result`` under ``fence``: ``ok``, or ``stale`` (the
        record was not marked DONE; the next attempt settles it, see ``effect_begin``).

        Raises:
            NotFound: The effect was never begun.
        """
        _, worker = self._fence_of(task_id, node_id)
        reply = await self._call(
            f"effect_done {key}", self.stub.EffectDone,
            ax_pb2.EffectDoneRequest(key=key, task_id=task_id, node_id=node_id, fence=fence,
                                     worker_id=worker,
                                     result_json=codec.canonical_json(dict(result))))
        return "stale" if reply.lease == ax_pb2.LEASE_RESULT_STALE else "ok"

    async def effect_get(self, key: str) -> codec.EffectRecord | None:
        """The outbox record, or None when nothing was begun under ``key``."""
        reply = await self._call(f"effect_get {key}", self.stub.EffectGet,
                                 ax_pb2.EffectGetRequest(key=key))
        if reply.state in (ax_pb2.EFFECT_STATE_NEW, ax_pb2.EFFECT_STATE_UNSPECIFIED):
            return None
        return codec.effect_from_message(reply)
