"""The gRPC adapter (grpc.aio): ``ax.v1.AxService`` and ``ax.v1.ExecutorService``.

Each RPC authenticates the ``authorization: Bearer <token>`` metadata, checks the role
of its operation (:data:`axengine.api._auth.RULES`), calls the engine (through
:mod:`axengine.api._ops` for what REST shares) and answers with the messages of
``proto/ax/v1/ax.proto``. Errors leave through the one table of
:mod:`axengine.api._errors`; control-flow answers (stale, already-done, not claimable,
an idempotent repeat) are fields of the reply, never status codes.

Records are converted to messages by :mod:`axengine.codec` (its ``*_message``
functions), so the field mapping exists once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from axengine import codec, limits
from axengine.api import _ops as ops
from axengine.api._auth import ANONYMOUS, Authenticator, Principal
from axengine.api._errors import public_message, status_of
from axengine.api._grpc_decode import Malformed
from axengine.api._quotas import UNLIMITED, Quotas
from axengine.api._takers import MAX_TAKE_WAIT, Takers
from axengine.engine import (
    RERUN,
    ClaimResult,
    Engine,
    Snapshot,
    TaskRecord,
    check_digest,
    fork_task,
    holds,
)
from axengine.errors import BlobError, InputError, NotFound
from axengine.metrics import AxMetrics
from axengine.records import NO_EDITS, BlobRef, Event, NodeState
from executors.contract import Failure, Outcome, Paused, Success, Unavailable

__all__ = ["AxServicer", "ExecutorServicer", "add_services"]

log = logging.getLogger("axengine.api.grpc")

# Loaded dynamically: the generated modules are untyped for mypy (see codec.py).
pb: Any = importlib.import_module("proto.ax.v1.ax_pb2")
pb_grpc: Any = importlib.import_module("proto.ax.v1.ax_pb2_grpc")

_EFFECT_STATES = {"NEW": pb.EFFECT_STATE_NEW, "SENDING": pb.EFFECT_STATE_SENDING,
                  "DONE": pb.EFFECT_STATE_DONE, "UNKNOWN": pb.EFFECT_STATE_UNKNOWN}
_COMPLETE = {"committed": pb.COMPLETE_RESULT_COMMITTED, "stale": pb.COMPLETE_RESULT_STALE,
             "already-done": pb.COMPLETE_RESULT_ALREADY_DONE}
_DECISIONS = {pb.DECISION_APPROVE: "approve", pb.DECISION_REJECT: "reject"}

R = TypeVar("R")
Handler = Callable[[Any, Any, Any, Principal], Awaitable[Any]]


def task_pb(task: TaskRecord) -> Any:
    return codec.task_message(task)


def snapshot_pb(snap: Snapshot) -> Any:
    return codec.snapshot_message(snap)


def event_pb(event: Event) -> Any:
    return codec.event_message(event)


def _metadata(context: Any, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key.lower() == name:
            return str(value)
    return None


class _Base:
    def __init__(self, *, engine: Engine, auth: Authenticator | None, metrics: AxMetrics,
                 stopping: asyncio.Event, quotas: Quotas = UNLIMITED,
                 takers: Takers | None = None) -> None:
        self.engine = engine
        self.quotas = quotas
        self.takers = takers
        self.auth = auth
        self.metrics = metrics
        self.stopping = stopping

    def authorize(self, context: Any, rule: str) -> Principal:
        if self.auth is None:
            return Authenticator.check(ANONYMOUS, rule)
        return self.auth.authorize(_metadata(context, "authorization"), rule)


async def _abort(context: Any, exc: Exception, state_conflict: bool) -> None:
    status = status_of(exc)
    if status.http >= 500 and status.http != 503:
        log.error("gRPC call failed", exc_info=exc)
    code = status.grpc_state_conflict if state_conflict else status.grpc
    await context.abort(code, public_message(exc))


def rpc(rule: str, *, state_conflict: bool = False) -> Callable[[Handler], Any]:
    """A unary RPC: authorize for ``rule``, run, map errors through the table."""

    def wrap(fn: Handler) -> Any:
        @functools.wraps(fn)
        async def method(self: _Base, request: Any, context: Any) -> Any:
            try:
                principal = self.authorize(context, rule)
                return await fn(self, request, context, principal)
            except Exception as exc:
                await _abort(context, exc, state_conflict)
                raise  # not reached: abort raises

        return method

    return wrap


class AxServicer(_Base):
    """``ax.v1.AxService``: the client operations."""

    @rpc("submit", state_conflict=False)
    async def SubmitTask(self, request: Any, context: Any, who: Principal) -> Any:
        source = request.WhichOneof("dag")
        if source is None:
            raise InputError("give dag_yaml or dag_hash")
        dag = await ops.load_request_dag(
            self.engine, yaml_text=request.dag_yaml if source == "dag_yaml" else None,
            dag_hash=request.dag_hash if source == "dag_hash" else None)
        if request.deadline_seconds < 0:
            raise InputError("deadline_seconds must not be negative")
        task_input = ops.parse_json_text(request.input_json, "input_json", empty={})
        result = await ops.submit_task(
            self.engine, dag, task_input, idempotency_key=request.idempotency_key,
            labels=dict(request.labels), priority=request.priority,
            deadline_seconds=request.deadline_seconds or None, principal=who,
            quotas=self.quotas, takers=self.takers)
        self.metrics.track_lanes(node.lane for node in dag.nodes.values())
        task = await ops.require_task(self.engine, result.task_id)
        return pb.SubmitTaskReply(task=task_pb(task), created=result.created)

    @rpc("read")
    async def GetTask(self, request: Any, context: Any, who: Principal) -> Any:
        view = await self.engine.get_task(request.task_id)
        snaps = [snapshot_pb(await ops.resolve_input(self.engine, view.snapshots[nid]))
                 for nid in sorted(view.snapshots)]
        return pb.GetTaskReply(task=task_pb(view.task), snapshots=snaps)

    @rpc("read")
    async def ListTasks(self, request: Any, context: Any, who: Principal) -> Any:
        known = pb.TaskStatus.values()
        unknown = sorted({s for s in request.statuses if s not in known})
        if unknown:
            # proto3 enums carry any number on the wire; one we do not know is the
            # caller's mistake, not ours.
            raise InputError(f"statuses: unknown TaskStatus value(s) {unknown}")
        statuses = [pb.TaskStatus.Name(s).removeprefix("TASK_STATUS_")
                    for s in request.statuses if s != pb.TASK_STATUS_UNSPECIFIED]
        tasks, token = await ops.list_page(
            self.engine, statuses=statuses, dag_name=request.dag_name,
            selector=ops.parse_label_selector(request.label_selector),
            limit=request.page_size or ops.DEFAULT_PAGE, page_token=request.page_token)
        return pb.ListTasksReply(tasks=[task_pb(t) for t in tasks],
                                 next_page_token=token or "")

    @rpc("read")
    async def GetEvents(self, request: Any, context: Any, who: Principal) -> Any:
        events, last, token = await ops.events_page(
            self.engine, request.task_id, after_seq=request.after_seq,
            limit=request.limit or ops.DEFAULT_EVENTS, page_token=request.page_token)
        return pb.GetEventsReply(events=[event_pb(e) for e in events], last_seq=last,
                                 next_page_token=token or "")

    async def WatchTask(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            self.authorize(context, "read")
            stream = await ops.start_following(self.engine, request.task_id,
                                               after_seq=request.after_seq,
                                               stopping=self.stopping)
        except Exception as exc:
            await _abort(context, exc, False)
            return
        try:
            async for item in stream:
                if isinstance(item, ops.WatchEnd):
                    return
                for event in item or ():
                    yield event_pb(event)
        except Exception as exc:
            await _abort(context, exc, False)
        finally:
            await stream.aclose()

    @rpc("approve", state_conflict=True)
    async def Decide(self, request: Any, context: Any, who: Principal) -> Any:
        decision = _DECISIONS.get(request.decision)
        if decision is None:
            raise InputError("decision must be DECISION_APPROVE or DECISION_REJECT")
        by = who.name if self.auth is not None or not request.by else request.by
        edits = (ops.parse_json_text(request.data_json, "data_json", empty=None)
                 if request.HasField("data_json") else NO_EDITS)
        result = await self.engine.decide(request.task_id, request.node_id,
                                          decision=decision, by=by, comment=request.comment,
                                          data=edits)
        snap, _ = await ops.node_snapshot(self.engine, request.task_id, request.node_id)
        return pb.DecideReply(snapshot=snapshot_pb(snap), repeated=result == "already-done")

    @rpc("approve", state_conflict=True)
    async def ResumeNode(self, request: Any, context: Any, who: Principal) -> Any:
        data = ops.parse_json_text(request.data_json, "data_json", empty=None)
        result = await self.engine.resume(request.task_id, request.node_id, data=data,
                                          by=who.name, input_revision=request.input_revision)
        snap, _ = await ops.node_snapshot(self.engine, request.task_id, request.node_id)
        return pb.ResumeNodeReply(snapshot=snapshot_pb(snap), repeated=result == "already-done")

    @rpc("admin", state_conflict=True)
    async def CancelTask(self, request: Any, context: Any, who: Principal) -> Any:
        by = f"{who.name} ({request.reason})" if request.reason else who.name
        await self.engine.cancel(request.task_id, by=by)
        return pb.CancelTaskReply(task=task_pb(await ops.require_task(self.engine,
                                                                      request.task_id)))

    @rpc("admin", state_conflict=True)
    async def RetryTask(self, request: Any, context: Any, who: Principal) -> Any:
        if not request.from_node:
            raise InputError("from_node is required")
        override = ops.parse_json_text(request.input_json, "input_json", empty=None)
        await self.engine.retry(request.task_id, request.from_node, input_override=override,
                                by=who.name)
        return pb.RetryTaskReply(task=task_pb(await ops.require_task(self.engine,
                                                                     request.task_id)))

    @rpc("admin", state_conflict=True)
    async def ForkTask(self, request: Any, context: Any, who: Principal) -> Any:
        if not request.from_node:
            raise InputError("from_node is required")
        output = ops.parse_json_text(request.output_json, "output_json", empty=RERUN)
        fork_id = await fork_task(self.engine, request.task_id, request.from_node,
                                  output=output, by=who.name)
        return pb.ForkTaskReply(task=task_pb(await ops.require_task(self.engine, fork_id)),
                                forked_from=f"{request.task_id}@{request.from_node}")

    @rpc("submit")
    async def ValidateDag(self, request: Any, context: Any, who: Principal) -> Any:
        dag, problems = await ops.validate_dag(self.engine, yaml_text=request.dag_yaml,
                                               file=request.file_name or "<string>")
        return pb.ValidateDagReply(
            ok=dag is not None, dag_hash=dag.hash if dag else "",
            dag_name=dag.name if dag else "",
            problems=[pb.DagProblem(message=p.message, file=p.file, line=p.line,
                                    node=p.node or "", field=p.field or "",
                                    hint=p.hint or "", code=p.code) for p in problems])


def _claimed_pb(claim: ClaimResult) -> Any:
    """The ``ClaimReply`` of a claimed run (a Claim's answer, and a GetRun's ``run``)."""
    req = claim.request
    assert req is not None
    return pb.ClaimReply(
        result=pb.CLAIM_RESULT_CLAIMED, fence=req.fence, attempt=req.attempt,
        node_type=req.node_type, config_json=codec.canonical_json(dict(req.config)),
        input_json=codec.canonical_json(req.input), labels=dict(req.labels),
        input_revision=req.input_revision, lease_until=claim.lease_until,
        submitted_by=claim.submitted_by, dag_hash=claim.dag_hash,
        checkpoint_json=_json_or_empty(req.checkpoint), resume_json=_json_or_empty(req.resume),
        timeout=claim.timeout, timeout_grace=claim.timeout_grace,
        timeout_cap=claim.timeout_cap, node_id=req.node_id, task_id=req.task_id)


def _json_or_empty(value: Any) -> str:
    return "" if value is None else codec.canonical_json(value)


class ExecutorServicer(_Base):
    """``ax.v1.ExecutorService``: the worker operations, fenced."""

    @rpc("executor")
    async def Claim(self, request: Any, context: Any, who: Principal) -> Any:
        if not request.worker_id:
            raise InputError("worker_id is required")
        claim = await self.engine.claim(request.task_id, request.node_id,
                                        worker=request.worker_id,
                                        lease_seconds=request.lease_seconds or None)
        if claim.result == "claimed":
            return _claimed_pb(claim)
        if claim.result == "dead":
            return pb.ClaimReply(result=pb.CLAIM_RESULT_DEAD, reason=claim.reason)
        if claim.reason in ("backoff", "ramp"):  # ask again at not_before
            return pb.ClaimReply(result=pb.CLAIM_RESULT_NOT_YET, reason=claim.reason,
                                 not_before=self.engine.clock() + claim.retry_after)
        return pb.ClaimReply(result=pb.CLAIM_RESULT_NOT_CLAIMABLE, reason=claim.reason)

    @rpc("executor")
    async def Take(self, request: Any, context: Any, who: Principal) -> Any:
        if not request.worker_id:
            raise InputError("worker_id is required")
        if not request.lanes:
            raise InputError("lanes: name at least one lane the worker serves")
        if not 0 <= request.wait_seconds < math.inf or not 0 <= request.lease_seconds < math.inf:
            raise InputError("wait_seconds and lease_seconds must be finite and not negative")
        wait = min(request.wait_seconds, MAX_TAKE_WAIT)
        claim = None
        if self.takers is not None and wait > 0 and not self.stopping.is_set():
            claim = await self.takers.wait(request.worker_id, request.lanes,
                                           lease_seconds=request.lease_seconds or None,
                                           timeout=wait)
        return pb.TakeReply(claim=_claimed_pb(claim)) if claim is not None else pb.TakeReply()

    @rpc("executor")
    async def GetRun(self, request: Any, context: Any, who: Principal) -> Any:
        if request.fence <= 0:
            raise InputError("fence is required: send the fence of the claim that runs "
                             f"{request.task_id}/{request.node_id}")
        run = await self.engine.get_run(request.task_id, request.node_id, fence=request.fence)
        if run is None:
            return pb.GetRunReply(result=pb.LEASE_RESULT_STALE)
        return pb.GetRunReply(result=pb.LEASE_RESULT_OK, run=_claimed_pb(run))

    def _lease(self, seconds: float) -> float:
        return seconds or self.engine.config.lease_seconds

    @rpc("executor")
    async def Heartbeat(self, request: Any, context: Any, who: Principal) -> Any:
        lease = self._lease(request.lease_seconds)
        activity = None
        if request.HasField("activity"):
            try:
                activity = codec.activity_from_message(request.activity)
            except ValueError as exc:
                raise InputError(f"heartbeat activity: {exc}") from None
            # The source is free text from the executor: bounded like a progress marker.
            activity = replace(activity, source=activity.source[:200])
        answer = await self.engine.heartbeat(request.task_id, request.node_id,
                                             fence=request.fence, lease_seconds=lease,
                                             activity=activity)
        if answer != "ok":
            return pb.HeartbeatReply(result=pb.LEASE_RESULT_STALE)
        return pb.HeartbeatReply(result=pb.LEASE_RESULT_OK,
                                 lease_until=self.engine.clock() + lease)

    @rpc("executor")
    async def Progress(self, request: Any, context: Any, who: Principal) -> Any:
        answer = await self.engine.progress(request.task_id, request.node_id,
                                            fence=request.fence, marker=request.marker,
                                            lease_seconds=request.lease_seconds or None)
        if answer != "ok":
            return pb.ProgressReply(result=pb.LEASE_RESULT_STALE)
        return pb.ProgressReply(result=pb.LEASE_RESULT_OK, progress_at=self.engine.clock())

    @rpc("executor")
    async def Checkpoint(self, request: Any, context: Any, who: Principal) -> Any:
        state = ops.parse_json_text(request.state_json, "state_json", empty=None)
        answer = await self.engine.checkpoint(request.task_id, request.node_id,
                                              fence=request.fence, state=state)
        return pb.CheckpointReply(result=pb.LEASE_RESULT_OK if answer == "ok"
                                  else pb.LEASE_RESULT_STALE)

    async def _may_read_output(self, task_id: str, node_id: str, fence: int) -> bool:
        """Whether a ``Complete`` under ``fence`` may have its ``output_ref`` read: the node
        is RUNNING under that fence with a live lease, or SUCCEEDED under it (a repeat,
        answered ``already-done`` or ``stale`` by the engine after comparing outputs).
        A stale or foreign fence never makes the API touch the blob directory.

        Raises:
            NotFound: The task or the node does not exist.
        """
        await ops.require_task(self.engine, task_id)
        snap = await self.engine.snapshot(task_id, node_id)
        if snap is None:
            raise NotFound(f"task {task_id!r} has no node {node_id!r}")
        if not fence or snap.fence != fence:
            return False
        return snap.state is NodeState.SUCCEEDED or holds(snap, fence, self.engine.clock())

    async def _output_of_ref(self, ref: Any) -> Any:
        """The output an executor left in the blob directory (``uri`` is ignored: the
        digest alone names the file), read off the loop and bounded like inline JSON."""
        blob = BlobRef("", ref.sha256, ref.size)
        try:
            return await self.engine.blob_json(blob, max_bytes=limits.MAX_JSON_BYTES,
                                               strict_field="output_ref")
        except BlobError as exc:
            raise InputError(f"output_ref: {exc}") from None

    async def _outcome(self, request: Any) -> Outcome:
        which = request.WhichOneof("outcome")
        if which == "success":
            success = request.success
            if success.HasField("output_ref"):
                return Success(await self._output_of_ref(success.output_ref))
            return Success(ops.parse_json_text(success.output_json, "output_json"))
        if which == "failure":
            failure = request.failure
            details = ops.parse_json_text(failure.details_json, "details_json", empty={})
            if not isinstance(details, dict):
                raise InputError("details_json must be a JSON object")
            return Failure(failure.message, retryable=failure.retryable, details=details)
        if which == "unavailable":
            seen = request.unavailable
            return Unavailable(seen.dependency, seen.evidence,
                               seen.retry_after if seen.HasField("retry_after") else None)
        if which == "paused":
            paused = request.paused
            return Paused(paused.reason,
                          seconds=paused.seconds if paused.HasField("seconds") else None,
                          checkpoint=ops.parse_json_text(paused.checkpoint_json,
                                                         "checkpoint_json", empty=None))
        raise InputError("give an outcome: success, failure, unavailable or paused")

    @rpc("executor")
    async def Complete(self, request: Any, context: Any, who: Principal) -> Any:
        return await self._complete(request)

    async def CompleteStream(self, requests: Any, context: Any) -> None:
        """Complete over one stream (see the proto): each request is checked and handled
        as :meth:`Complete` handles it, at once, and answered as its commit ends; its
        error goes in its reply, and the stream goes on. The caller's token is checked
        again for each request."""
        try:
            self.authorize(context, "executor")
        except Exception as exc:
            await _abort(context, exc, False)
        writing = asyncio.Lock()
        running: set[asyncio.Task[None]] = set()

        async def answer(message: Any) -> None:
            try:
                self.authorize(context, "executor")
                out = pb.CompleteStreamReply(id=message.id,
                                             reply=await self._complete(message.request))
            except Exception as exc:
                status = status_of(exc)
                if status.http >= 500 and status.http != 503:
                    log.error("gRPC CompleteStream request failed", exc_info=exc)
                out = pb.CompleteStreamReply(id=message.id, code=status.grpc.value[0],
                                             message=public_message(exc))
            async with writing:
                # The caller may be gone: its request was handled all the same (a
                # repeat answers already-done or stale), and nothing is left to tell.
                with contextlib.suppress(Exception):
                    await context.write(out)

        async for message in requests:
            if isinstance(message, Malformed):
                await _abort(context, InputError(message.reason), False)
            task = asyncio.create_task(answer(message))
            running.add(task)
            task.add_done_callback(running.discard)
        while running:  # the caller is done sending: answer what is in flight, then end
            await asyncio.gather(*running, return_exceptions=True)

    async def _complete(self, request: Any) -> Any:
        success = request.success if request.WhichOneof("outcome") == "success" else None
        if success is not None and success.HasField("output_ref"):
            # The reference is checked, then the task and the fence, before any file is
            # opened: a malformed digest is refused, a stale attempt is answered stale.
            check_digest(success.output_ref.sha256)
            if not await self._may_read_output(request.task_id, request.node_id,
                                               request.fence):
                self.metrics.complete_answer(request.task_id, request.node_id, "stale")
                snap, _ = await ops.node_snapshot(self.engine, request.task_id,
                                                  request.node_id)
                return pb.CompleteReply(result=pb.COMPLETE_RESULT_STALE,
                                        snapshot=snapshot_pb(snap))
        outcome = await self._outcome(request)
        if (request.claim_lanes or request.claim_node) and not request.worker_id:
            raise InputError("worker_id is required to claim a next node "
                             "(claim_lanes, claim_node)")
        # No lanes and no node: a plain completion (nothing can be claimed).
        done = await self.engine.complete_and_claim(
            request.task_id, request.node_id, fence=request.fence, outcome=outcome,
            worker=request.worker_id, lanes=request.claim_lanes,
            lease_seconds=request.claim_lease_seconds or None,
            claim_node=request.claim_node, claim_task=request.claim_task)
        self.metrics.completed(request.task_id, request.node_id, done.answer, outcome)
        stored = done.snapshot
        if stored is None:  # nothing written: the node as it is
            stored, _ = await ops.node_snapshot(self.engine, request.task_id, request.node_id)
        reply = pb.CompleteReply(result=_COMPLETE[done.answer], snapshot=snapshot_pb(stored),
                                 acked=done.acked)
        if done.next is not None:
            reply.next.CopyFrom(_claimed_pb(done.next))
        return reply

    @staticmethod
    def _require_fence(request: Any) -> None:
        # The outbox is fenced in every mode: a request without a fence (an executor
        # older than the check) is refused rather than let through unchecked.
        if request.fence <= 0:
            raise InputError("fence is required: send the fence of the claim that runs "
                             f"{request.task_id}/{request.node_id}")

    @rpc("executor")
    async def EffectBegin(self, request: Any, context: Any, who: Principal) -> Any:
        if not request.key:
            raise InputError("key is required")
        self._require_fence(request)
        previous = await self.engine.effect_begin(request.key, task_id=request.task_id,
                                                  node_id=request.node_id,
                                                  fence=request.fence)
        if previous == "stale":
            return pb.EffectBeginReply(lease=pb.LEASE_RESULT_STALE)
        result_json = ""
        if previous == "DONE":
            record = await self.engine.effect_get(request.key)
            if record is not None and record.result is not None:
                result_json = codec.canonical_json(dict(record.result))
        return pb.EffectBeginReply(lease=pb.LEASE_RESULT_OK,
                                   previous=_EFFECT_STATES[previous], result_json=result_json)

    @rpc("executor")
    async def EffectDone(self, request: Any, context: Any, who: Principal) -> Any:
        self._require_fence(request)
        result = ops.parse_json_text(request.result_json, "result_json", empty={})
        if not isinstance(result, dict):
            raise InputError("result_json must be a JSON object")
        answer = await self.engine.effect_done(request.key, result, task_id=request.task_id,
                                               node_id=request.node_id, fence=request.fence)
        if answer == "stale":
            return pb.EffectDoneReply(lease=pb.LEASE_RESULT_STALE)
        return pb.EffectDoneReply(lease=pb.LEASE_RESULT_OK,
                                  record=await self._effect(request.key))

    @rpc("executor")
    async def EffectGet(self, request: Any, context: Any, who: Principal) -> Any:
        return await self._effect(request.key)

    async def _effect(self, key: str) -> Any:
        record = await self.engine.effect_get(key)
        if record is None:
            return pb.EffectRecord(key=key, state=pb.EFFECT_STATE_NEW)
        return codec.effect_message(record)


def add_services(server: Any, *, engine: Engine, auth: Authenticator | None,
                 metrics: AxMetrics, stopping: asyncio.Event,
                 quotas: Quotas = UNLIMITED, takers: Takers | None = None) -> None:
    """Register both services on a ``grpc.aio`` server."""
    common: dict[str, Any] = {"engine": engine, "auth": auth, "metrics": metrics,
                              "stopping": stopping, "quotas": quotas, "takers": takers}
    pb_grpc.add_AxServiceServicer_to_server(AxServicer(**common), server)
    pb_grpc.add_ExecutorServiceServicer_to_server(ExecutorServicer(**common), server)
