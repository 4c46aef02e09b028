"""The one error table, and the REST error body."""

from __future__ import annotations

import grpc
import pytest

from axengine.api import error_body, status_of
from axengine.errors import (
    AxError,
    BlobError,
    Conflict,
    DagError,
    DagProblem,
    Forbidden,
    InputError,
    NotFound,
    QueueError,
    StoreError,
    StoreUnavailable,
    TemplateError,
    TemplateSecurityError,
    Unauthorized,
)

S = grpc.StatusCode


@pytest.mark.parametrize(("error", "http", "code"), [
    (InputError("x"), 400, S.INVALID_ARGUMENT),
    (DagError([DagProblem("bad")]), 400, S.INVALID_ARGUMENT),
    (TemplateError("x"), 400, S.INVALID_ARGUMENT),
    (TemplateSecurityError("x"), 400, S.INVALID_ARGUMENT),
    (Unauthorized("x"), 401, S.UNAUTHENTICATED),
    (Forbidden("x"), 403, S.PERMISSION_DENIED),
    (NotFound("x"), 404, S.NOT_FOUND),
    (Conflict("x"), 409, S.ALREADY_EXISTS),
    (StoreUnavailable("x"), 503, S.UNAVAILABLE),
    (QueueError("x"), 503, S.UNAVAILABLE),
    (StoreError("x"), 500, S.INTERNAL),
    (BlobError("x"), 500, S.INTERNAL),
    (AxError("x"), 500, S.INTERNAL),
    (RuntimeError("x"), 500, S.INTERNAL),
])
def test_table(error: Exception, http: int, code: grpc.StatusCode) -> None:
    status = status_of(error)
    assert (status.http, status.grpc) == (http, code)


def test_conflict_has_a_state_code() -> None:
    assert status_of(Conflict("x")).grpc_state_conflict is S.FAILED_PRECONDITION
    assert status_of(NotFound("x")).grpc_state_conflict is S.NOT_FOUND


def test_bodies() -> None:
    assert error_body(Conflict("taken")) == {"error": {"type": "Conflict",
                                                       "message": "taken"}}
    assert error_body(TemplateSecurityError("no"))["error"]["type"] == "TemplateSecurityError"
    problem = DagProblem("unknown target 'b'", "f.yaml", 3, node="a", field="next",
                         hint="add node b", code="unknown-target")
    body = error_body(DagError([problem]))["error"]
    assert body["type"] == "DagError" and "f.yaml:3" in body["message"]
    assert body["problems"] == [{"file": "f.yaml", "line": 3, "node": "a", "field": "next",
                                 "code": "unknown-target", "message": "unknown target 'b'",
                                 "hint": "add node b"}]
    # A bug's message (may hold paths, keys, secrets) is never shown.
    hidden = error_body(RuntimeError("/etc/secret"))["error"]
    assert hidden["type"] == "InternalError" and "secret" not in hidden["message"]
