"""The one table that maps ax's errors to HTTP and gRPC status codes.

Both adapters (REST and gRPC) answer every failure through :func:`status_of`, so an
error class means the same thing on either wire. Rows are matched in order, the first
class the error is an instance of wins; anything not in the table is a bug of ours
(500 / ``INTERNAL``) and its message is not shown to the caller.

``Conflict`` has two gRPC codes: ``ALREADY_EXISTS`` when a *submission* collides with
an earlier one (idempotency key reused with another payload), ``FAILED_PRECONDITION``
when an operation is not valid in the current state (a second, different decision; a
retry of a node still running). The adapter says which applies (``state_conflict``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from axengine.errors import (
    AxError,
    Conflict,
    DagError,
    Forbidden,
    InputError,
    NotFound,
    QueueError,
    QuotaExceeded,
    StoreUnavailable,
    TemplateError,
    Unauthorized,
)

__all__ = [
    "ERROR_TABLE",
    "INTERNAL",
    "ErrorStatus",
    "error_body",
    "problem_json",
    "public_message",
    "status_of",
]


@dataclass(frozen=True)
class ErrorStatus:
    """How one class of error is answered.

    Attributes:
        http: HTTP status code.
        grpc: gRPC status code.
        grpc_state_conflict: gRPC code when the error means "not valid in the current
            state" rather than "already exists" (only ``Conflict`` differs).
        type: Name used as ``error.type`` in REST bodies.
    """

    http: int
    grpc: grpc.StatusCode
    grpc_state_conflict: grpc.StatusCode
    type: str


def _row(http: int, code: grpc.StatusCode, type_: str,
         state_code: grpc.StatusCode | None = None) -> ErrorStatus:
    return ErrorStatus(http, code, state_code or code, type_)


_S = grpc.StatusCode

#: ``(error class, status)`` in match order: subclasses before their bases.
ERROR_TABLE: tuple[tuple[type[BaseException], ErrorStatus], ...] = (
    (DagError, _row(400, _S.INVALID_ARGUMENT, "DagError")),
    (TemplateError, _row(400, _S.INVALID_ARGUMENT, "TemplateError")),
    (InputError, _row(400, _S.INVALID_ARGUMENT, "InputError")),
    (Unauthorized, _row(401, _S.UNAUTHENTICATED, "Unauthorized")),
    (QuotaExceeded, _row(429, _S.RESOURCE_EXHAUSTED, "QuotaExceeded")),
    (Forbidden, _row(403, _S.PERMISSION_DENIED, "Forbidden")),
    (NotFound, _row(404, _S.NOT_FOUND, "NotFound")),
    (Conflict, _row(409, _S.ALREADY_EXISTS, "Conflict", _S.FAILED_PRECONDITION)),
    (StoreUnavailable, _row(503, _S.UNAVAILABLE, "StoreUnavailable")),
    (QueueError, _row(503, _S.UNAVAILABLE, "QueueError")),
)

#: Everything else: a bug or an unexpected backend failure.
INTERNAL = _row(500, _S.INTERNAL, "InternalError")


def status_of(exc: BaseException) -> ErrorStatus:
    """The row of the table that answers ``exc`` (``INTERNAL`` when none does)."""
    for cls, status in ERROR_TABLE:
        if isinstance(exc, cls):
            return status
    return INTERNAL


def public_message(exc: BaseException) -> str:
    """What the caller is told: the message of a known error, nothing of a bug."""
    if status_of(exc) is INTERNAL:
        return "internal error (logged by the server)"
    return str(exc) or type(exc).__name__


def error_body(exc: BaseException) -> dict[str, Any]:
    """The REST error body ``{"error": {"type", "message"[, "problems"]}}``."""
    status = status_of(exc)
    error: dict[str, Any] = {"type": status.type, "message": public_message(exc)}
    if isinstance(exc, DagError):
        error["problems"] = [problem_json(p) for p in exc.problems]
    elif isinstance(exc, AxError) and status is not INTERNAL:
        # A subclass keeps its own name (TemplateSecurityError...), the row its status.
        error["type"] = type(exc).__name__
    return {"error": error}


def problem_json(problem: Any) -> dict[str, Any]:
    """A :class:`~axengine.errors.DagProblem` as JSON."""
    return {
        "file": problem.file, "line": problem.line, "node": problem.node,
        "field": problem.field, "code": problem.code, "message": problem.message,
        "hint": problem.hint,
    }
