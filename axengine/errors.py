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
    └── NodeError                   a node handler failed (retryable unless said so)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AxError",
    "BlobError",
    "Conflict",
    "DagError",
    "DagProblem",
    "Forbidden",
    "InputError",
    "NodeError",
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


class NodeError(AxError):
    """A node handler failed.

    Args:
        message: What went wrong.
        retryable: False when retrying the same input cannot help (bad input, malformed
            output); such a failure skips the remaining attempts.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
