"""The ax error tree.

Every error ax raises on purpose derives from :class:`AxError`. Backend exceptions
(sqlite3, aetcd/grpc, redis) are mapped at the adapter edge with ``raise ... from exc``.
Retryability is a property of the error class (``retryable``), never guessed by callers.

Control flow is *not* an error: a stale fence, an already-committed result or a paused
gate are results (see ``axengine.engine``), not exceptions.

::

    AxError
    ├── DagError                    a DAG file or document is invalid (has .problems)
    ├── TemplateError               a template does not compile, render or evaluate
    │   ├── TemplateSecurityError   a sandbox rule was hit (unsafe attribute, call, ...)
    │   └── TemplateLimitError      output size or render time bound exceeded
    ├── InputError                  a request (task input, decision, ...) is malformed
    ├── NotFound                    a task, node, DAG or blob does not exist
    ├── Conflict                    same idempotency key with another payload; a second
    │                               conflicting decision; an operation not valid in state
    ├── Unauthorized / Forbidden    missing/wrong token; token lacks the role
    │                 └── QuotaExceeded  the principal has too many unfinished tasks
    ├── StoreError                  the state store failed            (retryable)
    │   ├── StoreUnavailable        cannot reach it                   (retryable)
    │   └── RevisionCompacted       a watch/read asked for a compacted revision
    ├── QueueError                  the work queue failed             (retryable)
    ├── BlobError                   blob missing or its sha256 does not match
    └── ApiUnavailable              a client cannot reach the ax API  (retryable)

:data:`ERROR_CODES` is the one table from these classes to what the API answers: HTTP
status, ``error.type`` of REST bodies and gRPC status code (by name, so this module needs
no grpc). The server's adapters (``axengine.api._errors``), the REST client
(``axengine.client``) and the executor's gRPC client (``axengine.worker.grpc_client``)
all derive their mappings from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ERROR_CODES",
    "INTERNAL_ERROR",
    "REST_ONLY_TYPES",
    "UNREACHABLE_GRPC",
    "UNREACHABLE_HTTP",
    "ApiUnavailable",
    "AxError",
    "BlobError",
    "Conflict",
    "DagError",
    "DagProblem",
    "ErrorCode",
    "Forbidden",
    "InputError",
    "NotFound",
    "QueueError",
    "QuotaExceeded",
    "RevisionCompacted",
    "StoreError",
    "StoreUnavailable",
    "TemplateError",
    "TemplateLimitError",
    "TemplateSecurityError",
    "Unauthorized",
    "class_for_grpc",
    "class_for_http",
    "code_of",
]


class AxError(Exception):
    """Base of every error ax raises on purpose."""

    #: Whether retrying the same operation later may succeed.
    retryable: bool = False


@dataclass(frozen=True)
class DagProblem:
    """One problem found in a DAG document.

    Attributes:
        message: What is wrong, in one sentence.
        file: Path of the file, or ``"<string>"`` for inline documents.
        line: 1-based line of the offending YAML node, or 0 when unknown.
        node: Node id the problem belongs to, if any.
        field: Field name (``"next[1].target"``, ``"expression"``...), if any.
        hint: How to fix it, if there is something useful to say.
        code: Stable machine-readable class of the problem (``"unknown-target"``...).
    """

    message: str
    file: str = "<string>"
    line: int = 0
    node: str | None = None
    field: str | None = None
    hint: str | None = None
    code: str = "invalid"

    def format(self) -> str:
        """Render as the ``file:line: message`` line ``ax validate`` prints."""
        where = f"{self.file}:{self.line}" if self.line else self.file
        parts = [f"{where}: {self.message}"]
        if self.node:
            parts[0] = f"{where}: node {self.node!r}: {self.message}"
        if self.hint:
            parts.append(f" (hint: {self.hint})")
        return "".join(parts)


class DagError(AxError):
    """A DAG failed to load or validate; ``problems`` lists every problem found."""

    def __init__(self, problems: list[DagProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(p.format() for p in self.problems) or "invalid DAG")


class TemplateError(AxError):
    """A template did not compile, render or evaluate (missing field, bad syntax...)."""


class TemplateSecurityError(TemplateError):
    """The sandbox refused an operation (unsafe attribute, callable, import...)."""


class TemplateLimitError(TemplateError):
    """A render exceeded its bound on output size, time or work."""


class InputError(AxError):
    """A request is malformed: bad JSON, unknown field, not a gate, oversized body."""


class NotFound(AxError):
    """The task, node, DAG or blob asked for does not exist."""


class Conflict(AxError):
    """The request conflicts with stored state (idempotency key reuse, second decision)."""


class Unauthorized(AxError):
    """No bearer token, or an unknown one."""


class Forbidden(AxError):
    """The token is valid but lacks the role the operation needs."""


class QuotaExceeded(Forbidden):
    """The principal already has as many unfinished tasks as it may (HTTP 429): it
    may submit again once some finish; another principal is not affected."""


class StoreError(AxError):
    """The state store failed; the operation may be retried."""

    retryable = True


class StoreUnavailable(StoreError):
    """The state store cannot be reached."""


class RevisionCompacted(StoreError):
    """A read or watch asked for a revision the store has compacted away."""

    retryable = False


class QueueError(AxError):
    """The work queue failed; the queue is a hint, so callers may retry or reconcile."""

    retryable = True


class BlobError(AxError):
    """A blob is missing or its content does not match its sha256."""


class ApiUnavailable(AxError):
    """The ax API cannot be reached: connection refused or dropped, a timeout, or a proxy
    answering 502/503/504 in its place. Raised by clients, never by the server."""

    retryable = True


# ---------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class ErrorCode:
    """How the API answers one class of error, on either wire.

    Attributes:
        error: The class (its subclasses share the row).
        http: HTTP status code.
        type: ``error.type`` of REST error bodies (a subclass sends its own class name).
        grpc: Name of the ``grpc.StatusCode``.
        grpc_state: gRPC code when the error means "not valid in the current state"
            rather than "already exists" (only ``Conflict`` differs); ``""``: as ``grpc``.
        generic: This class stands for its HTTP status and gRPC codes when an answer
            names no class: every gRPC answer, a REST body without a known ``type``.
            At most one row is generic for a status or a code.
    """

    error: type[AxError]
    http: int
    type: str
    grpc: str
    grpc_state: str = ""
    generic: bool = False

    @property
    def grpc_codes(self) -> tuple[str, ...]:
        """Every gRPC code the row is answered with."""
        return (self.grpc, self.grpc_state) if self.grpc_state else (self.grpc,)


#: ``ErrorCode`` rows in match order: subclasses before their bases.
ERROR_CODES: tuple[ErrorCode, ...] = (
    ErrorCode(DagError, 400, "DagError", "INVALID_ARGUMENT"),
    ErrorCode(TemplateError, 400, "TemplateError", "INVALID_ARGUMENT"),
    ErrorCode(InputError, 400, "InputError", "INVALID_ARGUMENT", generic=True),
    ErrorCode(Unauthorized, 401, "Unauthorized", "UNAUTHENTICATED", generic=True),
    # Not generic: gRPC also answers RESOURCE_EXHAUSTED for a message over its size limit.
    ErrorCode(QuotaExceeded, 429, "QuotaExceeded", "RESOURCE_EXHAUSTED"),
    ErrorCode(Forbidden, 403, "Forbidden", "PERMISSION_DENIED", generic=True),
    ErrorCode(NotFound, 404, "NotFound", "NOT_FOUND", generic=True),
    ErrorCode(Conflict, 409, "Conflict", "ALREADY_EXISTS", "FAILED_PRECONDITION",
              generic=True),
    ErrorCode(StoreUnavailable, 503, "StoreUnavailable", "UNAVAILABLE"),
    ErrorCode(QueueError, 503, "QueueError", "UNAVAILABLE"),
)

#: Everything else: a bug or an unexpected backend failure (its message is not shown).
INTERNAL_ERROR = ErrorCode(AxError, 500, "InternalError", "INTERNAL")

#: ``error.type`` of rejections made by the REST layer before any operation runs; a
#: client raises :class:`InputError` for them.
REST_ONLY_TYPES: Mapping[int, str] = {
    405: "MethodNotAllowed", 413: "PayloadTooLarge", 415: "UnsupportedMediaType"}

#: Answers that come from the way to the API rather than from it (a proxy, a timeout, a
#: connection that broke): a client raises :class:`ApiUnavailable` for them when the
#: answer names no class of the table.
UNREACHABLE_HTTP = frozenset({408, 429, 502, 503, 504})
UNREACHABLE_GRPC = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})


def code_of(exc: BaseException) -> ErrorCode:
    """The row that answers ``exc`` (:data:`INTERNAL_ERROR` when none does)."""
    for row in ERROR_CODES:
        if isinstance(exc, row.error):
            return row
    return INTERNAL_ERROR


def _named(type_: str) -> type[AxError] | None:
    # A class of the table or one of its subclasses (TemplateSecurityError...).
    stack: list[type[AxError]] = [row.error for row in ERROR_CODES]
    while stack:
        cls = stack.pop()
        if cls.__name__ == type_:
            return cls
        stack.extend(cls.__subclasses__())
    return None


def class_for_http(status: int, type_: str = "") -> type[AxError]:
    """The class a REST error answer stands for, by its ``error.type`` first.

    Args:
        status: The HTTP status.
        type_: ``error.type`` of the body (``""`` when the body is not ours).
    """
    named = _named(type_) if type_ else None
    if named is not None:
        return named
    if type_ in REST_ONLY_TYPES.values():
        return InputError
    if type_ == INTERNAL_ERROR.type:
        return AxError
    for row in ERROR_CODES:
        if row.generic and row.http == status:
            return row.error
    if status in UNREACHABLE_HTTP:
        return ApiUnavailable
    if status in REST_ONLY_TYPES:
        return InputError
    return AxError


def class_for_grpc(code: str) -> type[AxError]:
    """The class a gRPC status code (by name: ``"NOT_FOUND"``) stands for."""
    for row in ERROR_CODES:
        if row.generic and code in row.grpc_codes:
            return row.error
    if code in UNREACHABLE_GRPC:
        return ApiUnavailable
    return AxError
