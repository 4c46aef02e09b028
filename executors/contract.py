"""The small contract between ax and the code that does a node's work.

Handlers depend on this module only — never on the control plane — so the same handler
runs in-process, in a subprocess, or in a Kubernetes Job container.

A handler is a plain callable ``handle(request, ctx) -> Outcome``. It may block (it runs
in a worker thread); it reports liveness with ``ctx.heartbeat()``, business progress with
``ctx.progress(marker)``, and must stop soon after either returns False (its fence went
stale: another worker owns the node now) or ``ctx.cancelled`` becomes true.

Side effects (email, payment, vendor job) go through ``ctx.effect(key)``: the outbox
record makes a retried send either skipped (already DONE) or reported UNKNOWN for a
person — never silently repeated.

A handler that returns at once and never blocks (the built-in ``echo`` tool) may be
marked :func:`inline`: the in-process (thread) runner then calls it on the event loop
instead of handing it to a thread, which costs more than such a node's own work.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

__all__ = [
    "INLINE_ATTRIBUTE",
    "Effect",
    "EffectState",
    "Failure",
    "Handler",
    "NodeContext",
    "NodeRequest",
    "Outcome",
    "Paused",
    "Success",
    "Unavailable",
    "attempt_span_id",
    "inline",
    "runs_inline",
    "task_span_id",
    "task_trace_id",
]

EffectState = Literal["NEW", "SENDING", "DONE", "UNKNOWN"]


@dataclass(frozen=True)
class NodeRequest:
    """What a handler is asked to do.

    Attributes:
        task_id: Task id.
        node_id: Node id.
        node_type: ``llm_call`` or ``tool_call``.
        attempt: 1-based attempt number.
        fence: The fence this attempt holds.
        config: The node's static fields from the DAG (``tool``, ``model``,
            ``temperature``, ``max_tokens``, ``fallback``, ``timeout``...), with the
            ``prompt`` already rendered by the API.
        input: The node's rendered input (any JSON value).
        labels: Task labels.
        input_revision: Stable hash of (task, node, rendered input); the base of
            side-effect idempotency keys.
        checkpoint: What an earlier run of this node left (:class:`Paused`), or None.
        resume: The data the node was resumed with after a pause (a callback's body),
            or None.
    """

    task_id: str
    node_id: str
    node_type: str
    attempt: int
    fence: int
    config: Mapping[str, Any]
    input: Any
    labels: Mapping[str, str] = field(default_factory=dict)
    input_revision: str = ""
    checkpoint: Any = None
    resume: Any = None

    @property
    def resume_key(self) -> str:
        """The key a callback names to resume this node after it paused (``POST
        /v1/callbacks/{key}``): the task, the node and its input revision, so a callback
        for another input of the node is refused."""
        return f"{self.task_id}~{self.node_id}~{self.input_revision}"

    @property
    def traceparent(self) -> str:
        """The W3C ``traceparent`` of this attempt, for the requests the handler makes
        (``http_request``, model calls): the task's trace and this attempt's span, derived
        from the ids alone, so every process that runs the node sends the same one whether
        or not it records spans (docs/tracing.md)."""
        span = attempt_span_id(self.task_id, self.node_id, self.attempt, self.fence)
        return f"00-{task_trace_id(self.task_id)}-{span}-01"


# Trace ids are derived, never stored: the API, every executor and every Job pod compute
# the same ids from the task and attempt alone (docs/tracing.md). An all-zero id is
# invalid in W3C trace context; sha256 gives one with probability 2**-64, and the
# replacement below keeps even that case valid.


def _nonzero(digest: bytes) -> str:
    return digest.hex() if any(digest) else "0" * (2 * len(digest) - 1) + "1"


def task_trace_id(task_id: str) -> str:
    """The trace id of a task: the first 16 bytes of ``sha256(task_id)``, 32 hex digits."""
    return _nonzero(hashlib.sha256(task_id.encode()).digest()[:16])


def task_span_id(task_id: str) -> str:
    """The span id of a task's span: bytes 16 to 24 of ``sha256(task_id)``, 16 hex
    digits."""
    return _nonzero(hashlib.sha256(task_id.encode()).digest()[16:24])


def attempt_span_id(task_id: str, node_id: str, attempt: int, fence: int) -> str:
    """The span id of one node attempt: the first 8 bytes of
    ``sha256("{task_id}/{node_id}/{attempt}/{fence}")``, 16 hex digits. The fence only
    grows, so every run of a node has its own."""
    text = f"{task_id}/{node_id}/{attempt}/{fence}"
    return _nonzero(hashlib.sha256(text.encode()).digest()[:8])


@dataclass(frozen=True)
class Success:
    """The node produced ``output`` (any JSON value)."""

    output: Any


@dataclass(frozen=True)
class Failure:
    """The node failed. ``retryable=False`` skips the remaining attempts."""

    message: str
    retryable: bool = True
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Unavailable:
    """A dependency the node needs is down (circuit open, 503, model outage).

    The node stays WAITING with ``evidence`` and does not spend an attempt. It never
    turns into a pass. ``retry_after`` is how many seconds from now the dependency asked
    to be left alone (an HTTP ``Retry-After``): the node is not offered again before
    then. Without it the engine's default delay applies.
    """

    dependency: str
    evidence: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Paused:
    """The node waits for something outside — a vendor's queue, a rate limit, a
    callback — and gives back its slot and lease meanwhile.

    The node is PAUSED and spends no attempt; every clock stops (its timeout, stall
    window and queue timeout, and the task's deadline while the task is PAUSED). It is
    resumed after ``seconds`` (None: only by a resume call or a callback naming
    :attr:`NodeRequest.resume_key`); the next run gets ``checkpoint`` and the resume
    data in its request, and the rest of the timeout it had not used.
    """

    reason: str
    seconds: float | None = None
    checkpoint: Any = None


Outcome = Success | Failure | Unavailable | Paused


class Effect(Protocol):
    """An outbox record for one side effect, keyed by a stable idempotency key."""

    @property
    def key(self) -> str: ...

    def state(self) -> EffectState:
        """Current state of the record."""
        ...

    def begin(self) -> EffectState:
        """Try NEW → SENDING atomically. Returns the state *before* the call: ``NEW``
        means "you may perform the effect now"; ``DONE`` means it was already done
        (read ``result()``); ``SENDING``/``UNKNOWN`` mean an earlier attempt may or may
        not have performed it — the record is now UNKNOWN and a person must decide."""
        ...

    def done(self, result: Mapping[str, Any]) -> None:
        """SENDING (or UNKNOWN, once the handler verified the delivery with the
        provider) → DONE with ``result``."""
        ...

    def result(self) -> Mapping[str, Any] | None:
        """The result recorded by :meth:`done`, if any."""
        ...


class NodeContext(Protocol):
    """What a running handler may do besides computing its result."""

    @property
    def cancelled(self) -> bool:
        """True once the run must stop (stale fence, cancellation, timeout)."""
        ...

    @property
    def settings(self) -> Mapping[str, Any]:
        """Runtime settings for handlers (simulated model behaviour, SMTP host...)."""
        ...

    def heartbeat(self) -> bool:
        """Renew the lease. False: the fence is stale; stop now."""
        ...

    def progress(self, marker: str) -> bool:
        """Record a business checkpoint. False: the fence is stale; stop now."""
        ...

    def checkpoint(self, state: Any) -> bool:
        """Save ``state`` (JSON, at most 64 KiB) for the node's next run, durably: a
        timed-out run may still call it during its grace (``cancelled`` is already true);
        the next attempt, or an ``ax retry``, gets it as ``request.checkpoint``. False:
        the fence is stale, nothing was saved."""
        ...

    def effect(self, key: str) -> Effect:
        """The outbox record for side effect ``key`` (created on first use)."""
        ...


Handler = Callable[[NodeRequest, NodeContext], Outcome]


#: The attribute :func:`inline` sets: ``inline_for(request) -> bool``. A dispatching
#: handler (``executors.handlers.handle``, the ``tool_call`` handler) sets its own, which
#: answers for the handler it would call.
INLINE_ATTRIBUTE = "inline_for"

_H = TypeVar("_H", bound=Callable[..., Any])


def inline(handler: _H) -> _H:
    """Mark ``handler`` (a handler or a tool: ``(request, ctx) -> Outcome``) as one that
    returns at once and never blocks, so the thread runner calls it on its event loop
    rather than in a thread: the hand-off to a thread and back costs a node more than a
    pure function's work (0.2 to 0.8 ms of CPU per node, measured in ``bench/``).

    Such a handler runs with the worker's event loop stopped until it returns, so it
    must not sleep, wait on I/O or call the context's blocking methods (``heartbeat``,
    ``progress``, ``checkpoint``, ``effect``): those raise ``RuntimeError`` there. No
    timeout can stop it. Runners of another process (subprocess, Kubernetes Job) run it
    as any other handler.

    Raises:
        TypeError: ``handler`` is not a plain (synchronous) callable.
    """
    if not callable(handler) or inspect.iscoroutinefunction(handler):
        raise TypeError(f"@inline takes a synchronous handler, not {handler!r}")
    setattr(handler, INLINE_ATTRIBUTE, _always)
    return handler


def runs_inline(handler: Callable[..., Any], request: NodeRequest) -> bool:
    """Whether ``handler`` may be called on the event loop for ``request`` (see
    :func:`inline`)."""
    test = getattr(handler, INLINE_ATTRIBUTE, None)
    return test is not None and bool(test(request))


def _always(request: NodeRequest) -> bool:
    return True
