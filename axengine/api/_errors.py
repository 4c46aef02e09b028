"""The error table of the API adapters, with real gRPC status codes.

The table itself is :data:`axengine.errors.ERROR_CODES` (class → HTTP status, REST
``error.type``, gRPC code by name); this module only turns each code name into its
``grpc.StatusCode``, so both adapters (REST and gRPC) answer every failure through
:func:`status_of` and an error class means the same thing on either wire. Rows are
matched in order, the first class the error is an instance of wins; anything not in the
table is a bug of ours (500 / ``INTERNAL``) and its message is not shown to the caller.

``Conflict`` has two gRPC codes: ``ALREADY_EXISTS`` when a *submission* collides with
an earlier one (idempotency key reused with another payload), ``FAILED_PRECONDITION``
when an operation is not valid in the current state (a second, different decision; a
retry of a node still running). The adapter says which applies (``state_conflict``).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from axengine.errors import ERROR_CODES, INTERNAL_ERROR, ErrorCode
from axengine.wire import error_body, problem_json, public_message

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

    @classmethod
    def of(cls, row: ErrorCode) -> ErrorStatus:
        """The row of :data:`axengine.errors.ERROR_CODES` with its gRPC codes resolved."""
        code = grpc.StatusCode[row.grpc]
        return cls(row.http, code, grpc.StatusCode[row.grpc_state] if row.grpc_state else code,
                   row.type)


#: ``(error class, status)`` in match order: subclasses before their bases.
ERROR_TABLE: tuple[tuple[type[BaseException], ErrorStatus], ...] = tuple(
    (row.error, ErrorStatus.of(row)) for row in ERROR_CODES)

#: Everything else: a bug or an unexpected backend failure.
INTERNAL = ErrorStatus.of(INTERNAL_ERROR)


def status_of(exc: BaseException) -> ErrorStatus:
    """The row of the table that answers ``exc`` (``INTERNAL`` when none does)."""
    for cls, status in ERROR_TABLE:
        if isinstance(exc, cls):
            return status
    return INTERNAL
