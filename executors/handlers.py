"""Entry point of node execution: dispatch a request to its handler by node type.

``condition`` and ``human_gateway`` nodes are decided by the API (guards, approvals), so
only ``llm_call`` and ``tool_call`` reach an executor. :func:`handle` never raises: an
exception inside a handler becomes a :class:`~executors.contract.Failure` (retryable
unless the exception carries ``retryable = False``), so a worker can always report an
outcome with its fence.

``tool_call`` looks its tool up in the one tool registry (:mod:`executors.tools`) and
loads the configured and installed tools (the ``tool_modules`` setting,
``AX_TOOL_MODULES``, ``ax.tools`` entry points) on first use, so every process that runs
:func:`handle` — a worker, a node process, a Kubernetes Job — sees the same tools.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from executors.contract import (
    INLINE_ATTRIBUTE,
    Failure,
    Handler,
    NodeContext,
    NodeRequest,
    Outcome,
    Paused,
    Success,
    Unavailable,
    runs_inline,
)
from executors.llm import llm_call
from executors.tools import tool_call

__all__ = ["HANDLERS", "handle"]

_log = logging.getLogger(__name__)

#: Handlers by node type.
HANDLERS: Mapping[str, Handler] = MappingProxyType({
    "llm_call": llm_call,
    "tool_call": tool_call,
})

_DECIDED_BY_API = frozenset({"condition", "human_gateway"})


def handle(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Run one attempt of a node and return its outcome; never raises.

    Args:
        request: What to run.
        ctx: Liveness, progress, settings and the outbox for this attempt.

    Returns:
        The handler's outcome; a non-retryable ``Failure`` for a node type no executor
        runs; a ``Failure`` describing any exception the handler raised.
    """
    handler = HANDLERS.get(request.node_type)
    if handler is None:
        where = (
            "is decided by the API, not run by an executor"
            if request.node_type in _DECIDED_BY_API
            else f"is unknown; executors run {', '.join(sorted(HANDLERS))}"
        )
        return Failure(
            f"node {request.node_id!r}: node type {request.node_type!r} {where}",
            retryable=False,
        )
    try:
        outcome = handler(request, ctx)
    except Exception as exc:
        # Full traceback to the worker log; the node's error carries the gist.
        _log.exception("handler for node %s of task %s raised", request.node_id, request.task_id)
        retryable = getattr(exc, "retryable", True)
        return Failure(
            f"node {request.node_id!r} ({request.node_type}) raised "
            f"{type(exc).__name__}: {exc}",
            retryable=retryable if isinstance(retryable, bool) else True,
            details={"exception": type(exc).__name__, "attempt": request.attempt},
        )
    if not isinstance(outcome, Success | Failure | Unavailable | Paused):
        return Failure(
            f"node {request.node_id!r}: handler returned {type(outcome).__name__}, not an "
            "Outcome (Success, Failure, Unavailable or Paused)",
            retryable=False,
        )
    return outcome


def _handler_inline(request: NodeRequest) -> bool:
    """Whether :func:`handle` may run ``request`` on the event loop: its node type's
    handler says so (a ``tool_call`` of an inline tool, see
    :func:`executors.contract.inline`)."""
    handler = HANDLERS.get(request.node_type)
    return handler is not None and runs_inline(handler, request)


setattr(handle, INLINE_ATTRIBUTE, _handler_inline)
