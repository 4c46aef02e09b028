"""The REST adapter (FastAPI): ``/v1`` operations, health, readiness, metrics.

Requests pass three ASGI layers before routing, outermost first:

1. request counting (``ax_api_requests_total``) and the access log,
2. the body limit: a ``Content-Length`` above the limit is answered 413 before anything
   is read, and a chunked body is counted as it streams,
3. authentication of ``/v1`` paths (401 before the body is even parsed).

Bodies are parsed strictly (:class:`_StrictJsonRoute`): ``NaN``/``Infinity`` literals and
values nested deeper than :data:`axengine.limits.MAX_JSON_DEPTH` are 400 before pydantic
sees them (the stock parser accepts both, and crashes on 100,000 levels).

Routes then check the role the operation needs (403), validate the body with strict
pydantic models (unknown fields are errors), and call the engine through
:mod:`axengine.api._ops`. Replies are the JSON of :mod:`axengine.wire`, sent as it is;
each route declares its reply model (:mod:`axengine.api._models`) so the OpenAPI document
describes every answer. Every error leaves as ``{"error": {"type", "message"}}`` with
the status of :mod:`axengine.api._errors`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
)
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, Header, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from axengine import limits
from axengine.api import _ops as ops
from axengine.api._auth import ANONYMOUS, Authenticator, Principal
from axengine.api._defaults import DEFAULT_MAX_BODY_BYTES
from axengine.api._errors import error_body, problem_json, status_of
from axengine.api._models import (
    ApprovalPage,
    CancelBody,
    DagPage,
    DagReply,
    DecisionBody,
    DecisionReply,
    ErrorBody,
    EventPage,
    ForkBody,
    ForkReply,
    HealthReply,
    ReadyReply,
    ResumeBody,
    ResumeReply,
    RetryBody,
    SubmitBody,
    SubmitReply,
    TaskActionReply,
    TaskCounts,
    TaskPage,
    TaskWithNodes,
    ValidateBody,
    ValidateReply,
)
from axengine.api._quotas import UNLIMITED, Quotas
from axengine.api._takers import Takers
from axengine.api._ui import (
    SecurityHeadersMiddleware,
    csrf_refusal,
    install_ui,
    scope_header,
    session_token,
)
from axengine.engine import RERUN, Engine, fork_task
from axengine.errors import ERROR_CODES, REST_ONLY_TYPES, AxError, InputError, Unauthorized
from axengine.logs import log_access
from axengine.metrics import CONTENT_TYPE_LATEST, AxMetrics
from axengine.records import NO_EDITS

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app"]

log = logging.getLogger("axengine.api")

#: Seconds a readiness probe waits for the store or the queue.
READY_TIMEOUT = 2.0
#: Seconds of silence after which a watch stream sends a keepalive comment.
SSE_KEEPALIVE = 15.0

_PRINCIPAL = "ax.principal"
_WWW_AUTH = 'Bearer realm="ax"'
#: ``error.type`` of the HTTP errors Starlette raises itself (unknown route, 405...).
_HTTP_TYPES = {**{row.http: row.type for row in ERROR_CODES if row.generic},
               **REST_ONLY_TYPES}


def _json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def _error(status: int, type_: str, message: str) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message}}


async def _send_json(send: Send, status: int, body: Any,
                     headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


# ---------------------------------------------------------------------------- middleware


class _TooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body passes the limit. An HTTPException,
    so FastAPI's body reader re-raises it unchanged instead of turning it into 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than {limit} bytes")


class BodyLimitMiddleware:
    """Refuse bodies larger than ``max_bytes`` with 413, before parsing them."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = scope_header(scope, b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await _send_json(send, 400, _error(400, "InputError",
                                                   "Content-Length is not a number"))
                return
            if int(declared) > limit:
                await _send_json(send, 413, _error(413, "PayloadTooLarge",
                                                   f"request body of {declared} bytes is "
                                                   f"larger than {limit} bytes"))
                return
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except _TooLarge as exc:
            if started:
                raise
            await _send_json(send, 413, _error(413, "PayloadTooLarge", str(exc.detail)))


class AuthMiddleware:
    """Authenticate every ``/v1`` request (by its ``Authorization`` header, or the web
    UI's session cookie); the principal goes into the scope. State-changing ``/v1`` and
    ``/ui`` requests pass the CSRF checks of :func:`axengine.api._ui.csrf_refusal`."""

    def __init__(self, app: ASGIApp, auth: Authenticator | None) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith(("/v1/", "/ui/")):
            authorization = scope_header(scope, b"authorization")
            # A header is sent on purpose; a cookie comes with whatever the page asks.
            cookie = session_token(scope) if authorization is None and self.auth else None
            if path.startswith("/v1/"):
                if self.auth is None:
                    scope[_PRINCIPAL] = ANONYMOUS
                else:
                    try:
                        scope[_PRINCIPAL] = self.auth.authenticate(
                            authorization if cookie is None else f"Bearer {cookie}")
                    except Unauthorized as exc:
                        await _send_json(send, 401, error_body(exc), _auth_headers(exc))
                        return
            refused = csrf_refusal(scope, via_cookie=cookie is not None and
                                   path != "/ui/login", secret=cookie or "")
            if refused is not None:
                await _send_json(send, 403, error_body(refused))
                return
        await self.app(scope, receive, send)


def _auth_headers(exc: Unauthorized) -> dict[str, str]:
    if "unknown" in str(exc):
        return {"WWW-Authenticate": _WWW_AUTH + ', error="invalid_token"'}
    return {"WWW-Authenticate": _WWW_AUTH}


class RequestCountMiddleware:
    """Count requests by method, route template and status code, and write the access
    log (:func:`axengine.logs.log_access`).

    The route is the template of the route the request matches (``/v1/tasks/{task_id}``,
    ``/docs``, a mount's prefix such as ``/ui/static``), found before the request goes
    in, so a request refused by a middleware (401, 413) is labelled by its route too.
    A path no route matches is ``unmatched``: raw paths would make the label set
    unbounded.
    """

    def __init__(self, app: ASGIApp, metrics: AxMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()
        route = self.template(getattr(scope.get("app"), "routes", ()), scope) or "unmatched"

        async def tracked(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        finally:
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            elapsed = time.perf_counter() - started
            self.metrics.request_seconds.labels(scope["method"], route).observe(elapsed)
            principal = scope.get(_PRINCIPAL)
            client = scope.get("client")
            # The raw path: still percent-encoded, so a %0A cannot forge a log line.
            raw = scope.get("raw_path")
            log_access(method=scope["method"],
                       path=raw.decode("ascii", "replace") if raw else quote(scope["path"]),
                       route=route, status=status, seconds=elapsed,
                       client=str(client[0]) if client else "",
                       principal=principal.name if isinstance(principal, Principal) else "")

    @classmethod
    def template(cls, routes: Iterable[BaseRoute], scope: Scope) -> str | None:
        """The path template of the route of ``routes`` that serves ``scope`` as the
        router would pick it (the first full match, else the first one that matches
        all but the method), inside mounts; None when none matches."""
        partial: tuple[BaseRoute, Scope] | None = None
        for route in routes:
            if getattr(route, "path", None) is None:
                continue
            match, child = route.matches(scope)
            if match is Match.FULL:
                return cls._resolve(route, {**scope, **child})
            if match is Match.PARTIAL and partial is None:
                partial = (route, {**scope, **child})
        return cls._resolve(*partial) if partial is not None else None

    @classmethod
    def _resolve(cls, route: BaseRoute, scope: Scope) -> str:
        path = str(getattr(route, "path", ""))
        if isinstance(route, Mount):
            inner = cls.template(route.routes, scope)  # a static files mount has none
            return path + inner if inner is not None else path or "/"
        # The template without convertors: {node_id}, not {node_id:path}.
        return str(getattr(route, "path_format", None) or path)


# ---------------------------------------------------------------------------- strict JSON


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (NaN and infinities are not standard "
                     "JSON)")


_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}:]')


def _deepest_field(body: bytes) -> str:
    """Which top-level field of a body too deep to parse holds the deep part: a linear
    scan of strings and brackets, for the error message only."""
    depth, last, key = 0, b"", b""
    for token in _JSON_TOKENS.finditer(body):
        text = token.group()
        if text in (b"[", b"{"):
            depth += 1
            if depth > limits.MAX_JSON_DEPTH + 1:
                break
        elif text in (b"]", b"}"):
            depth -= 1
        elif text == b":":
            if depth == 1:
                key = last
        else:
            last = text
    try:
        name = json.loads(key) if key else ""
    except ValueError:
        name = ""
    return f"body.{name}" if isinstance(name, str) and name else "request body"


def _too_deep(where: str) -> HTTPException:
    return HTTPException(400, f"{where} is nested deeper than {limits.MAX_JSON_DEPTH} levels "
                              "(the limit for JSON values)")


def strict_json_body(body: bytes) -> Any:
    """Parse a request body as standard JSON with bounded nesting.

    A syntax error raises :class:`json.JSONDecodeError`, which FastAPI reports with its
    position; the rest raises a 400 :class:`HTTPException` naming the field and limit.
    """
    try:
        value = json.loads(body, parse_constant=_refuse_constant,
                           parse_float=limits.finite_float)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise _too_deep(_deepest_field(body)) from None
    except ValueError as exc:  # NaN/Infinity, 1e400, bad UTF-8, an integer too long to parse
        raise HTTPException(400, f"request body is not standard JSON: {exc}") from None
    # Each field may nest MAX_JSON_DEPTH levels under the body object itself.
    if isinstance(value, dict):
        for key, item in value.items():
            if limits.json_depth(item) > limits.MAX_JSON_DEPTH:
                raise _too_deep(f"body.{key}")
    elif limits.json_depth(value) > limits.MAX_JSON_DEPTH + 1:
        raise _too_deep("request body")
    return value


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json_body(await self.body())
        return self._json


class _StrictJsonRoute(APIRoute):
    """A route whose body is parsed by :func:`strict_json_body`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict


# ---------------------------------------------------------------------------- errors


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            doc = exc.body if isinstance(exc.body, str) else ""
            pos = int(loc[1]) if len(loc) > 1 and loc[1].isdigit() else 0
            line = doc.count("\n", 0, pos) + 1
            column = pos - (doc.rfind("\n", 0, pos) + 1) + 1
            reason = (err.get("ctx") or {}).get("error", "invalid JSON")
            return f"request body is not valid JSON: {reason} (line {line}, column {column})"
        where = ".".join(loc) or "request"
        if err.get("type") == "extra_forbidden":
            parts.append(f"{where}: unknown field")
        elif err.get("type") == "missing":
            parts.append(f"{where}: field required")
        elif loc == ["body"] and isinstance(exc.body, bytes | bytearray):
            parts.append("body: send a JSON object with Content-Type: application/json")
        else:
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _no_route(request: Request) -> str:
    """The 404 message of a path no route matches, as the client sent it (``%2F`` stays
    encoded), with the route meant when only a trailing slash is in the way (routes
    take none, and none redirects: a redirect would send a client's token and body
    to a URL built from its Host header)."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    path = raw.decode("ascii", "backslashreplace")
    message = f"no route {request.method} {path[:300]}"
    slashes = len(path) - len(path.rstrip("/"))  # as sent: an encoded %2F is not one
    trimmed = request.url.path[:-slashes] if slashes else ""
    if trimmed:
        for route in request.app.router.routes:
            match, _ = route.matches({**request.scope, "path": trimmed})
            if match is not Match.NONE:
                return f"{message}: routes take no trailing slash ({trimmed})"
    return message


def _install_error_handlers(app: FastAPI) -> None:
    async def ax_error(request: Request, exc: Exception) -> Response:
        status = status_of(exc)
        # Errors that are not AxError propagate to uvicorn too, which logs them.
        if isinstance(exc, AxError) and status.http >= 500 and status.http != 503:
            log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        headers = _auth_headers(exc) if isinstance(exc, Unauthorized) else None
        return _json_response(status.http, error_body(exc), headers)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _json_response(400, _error(400, "InputError", _validation_message(exc)))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        type_ = _HTTP_TYPES.get(exc.status_code, "HTTPError")
        message = str(exc.detail) if exc.detail else type_
        if exc.status_code == 404 and message == "Not Found":
            message = _no_route(request)
        return _json_response(exc.status_code, _error(exc.status_code, type_, message),
                              dict(exc.headers or {}))

    app.add_exception_handler(AxError, ax_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, ax_error)


# ---------------------------------------------------------------------------- app


class _EventStream(StreamingResponse):
    media_type = "text/event-stream"


class _PrometheusText(Response):
    media_type = CONTENT_TYPE_LATEST


_ERROR_DOC = ("the error body; `error.type` names the AxError class (see docs/api.md, "
              "Errors)")
#: Error answers of a JSON route (FastAPI's 422 is never sent: validation is a 400).
_ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": _ERROR_DOC},
    "5XX": {"model": ErrorBody, "description": _ERROR_DOC},
}
#: The same for the watch stream, whose errors before the stream starts are JSON too.
_STREAM_ERRORS: dict[int | str, dict[str, Any]] = {
    key: {"description": _ERROR_DOC, "content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/ErrorBody"}}}}
    for key in ("4XX", "5XX")
}
_WATCH_FORMAT = (
    "Server-sent events. One message per event: `id: <seq>` and `data: <Event JSON>` (the "
    "EventJson schema); when the task is final, `event: end` with `data: {\"task_id\", "
    "\"status\"}`; a store failure while following, `event: error` with the ErrorBody "
    "JSON; `: keepalive` comments every 15 s of silence."
)

_bearer = HTTPBearer(auto_error=False, description="a token of the tokens file")


def _role(rule: str) -> Callable[..., Awaitable[Principal]]:
    # A coroutine: FastAPI runs a plain function dependency in a worker thread, a hop
    # per request for a check that only reads what the middleware set.
    async def dependency(
        request: Request,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
    ) -> Principal:
        principal = request.scope.get(_PRINCIPAL)
        if not isinstance(principal, Principal):  # the middleware always sets it
            raise Unauthorized("missing bearer token")
        return Authenticator.check(principal, rule)

    return dependency


Reader = Annotated[Principal, Depends(_role("read"))]
Submitter = Annotated[Principal, Depends(_role("submit"))]
Approver = Annotated[Principal, Depends(_role("approve"))]
Admin = Annotated[Principal, Depends(_role("admin"))]


async def _probe(what: Awaitable[Any]) -> str:
    try:
        await asyncio.wait_for(what, timeout=READY_TIMEOUT)
    except TimeoutError:
        return f"timeout: no answer within {READY_TIMEOUT:g}s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def create_app(*, engine: Engine, auth: Authenticator | None, metrics: AxMetrics,
               stopping: asyncio.Event | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               quotas: Quotas = UNLIMITED, takers: Takers | None = None) -> FastAPI:
    """Build the REST application.

    Args:
        engine: The engine every operation goes through.
        auth: Tokens and roles; None turns authentication off (every caller is
            ``anonymous`` with every role).
        metrics: Process metrics (served at ``/metrics``, fed by request counting).
        stopping: Set when the server shuts down: watch streams end, readiness fails.
        max_body_bytes: Largest request body accepted (413 above).
        quotas: What a submitter may ask for (timeouts, deadline, active tasks).
        takers: Executors' Takes waiting at this server: a submit claims its first
            node for one (None: every first node goes through the queue).
    """
    stop = stopping or asyncio.Event()
    app = FastAPI(
        title="ax API", version="1",
        description="Durable DAG workflow engine for agentic work (see docs/api.md).",
        # The docs page is served with local assets (axengine/api/_ui.py): no CDN.
        docs_url=None, redoc_url=None,
        # A path with a trailing slash is a 404 naming the route meant (_no_route).
        redirect_slashes=False,
    )
    app.router.route_class = _StrictJsonRoute
    _install_error_handlers(app)
    app.add_middleware(AuthMiddleware, auth=auth)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(RequestCountMiddleware, metrics=metrics)
    app.add_middleware(SecurityHeadersMiddleware)

    @app.get("/healthz", tags=["ops"], response_model=HealthReply)
    async def healthz() -> Response:
        """The process is alive."""
        return _json_response(200, {"status": "ok"})

    @app.get("/readyz", tags=["ops"], response_model=ReadyReply,
             responses={503: {"model": ReadyReply, "description": "not ready (the failing "
                                                                   "part says why)"}})
    async def readyz() -> Response:
        """The store and the queue answer (503 otherwise, and while shutting down)."""
        store = await _probe(engine.revision())
        queue = await _probe(engine.queue.depth("default"))
        ready = store == "ok" and queue == "ok" and not stop.is_set()
        body: dict[str, Any] = {"ready": ready, "store": store, "queue": queue}
        if stop.is_set():
            body["stopping"] = True
        return _json_response(200 if ready else 503, body)

    @app.get("/metrics", tags=["ops"], response_class=_PrometheusText,
             responses={200: {"description": "Prometheus text exposition format"}})
    async def prometheus() -> Response:
        """Prometheus text exposition."""
        return Response(await metrics.render(engine), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/tasks", status_code=201, response_model=SubmitReply, tags=["tasks"],
              responses={200: {"model": SubmitReply,
                               "description": "an idempotent repeat (created: false)"},
                          **_ERRORS})
    async def submit(
        body: SubmitBody, who: Submitter,
        idempotency_header: Annotated[str | None, Header(alias="Idempotency-Key",
                                                         max_length=256)] = None,
    ) -> Response:
        """Submit a task (exactly one of dag, dag_yaml, dag_hash)."""
        key = body.idempotency_key or ""
        if idempotency_header:
            if key and key != idempotency_header:
                raise InputError("Idempotency-Key header and idempotency_key field differ")
            key = idempotency_header
        dag = await ops.load_request_dag(engine, mapping=body.dag, yaml_text=body.dag_yaml,
                                         dag_hash=body.dag_hash)
        task_input = body.input if "input" in body.model_fields_set else {}
        result = await ops.submit_task(
            engine, dag, task_input, idempotency_key=key, labels=body.labels,
            priority=body.priority, deadline_seconds=body.deadline_seconds,
            principal=who, quotas=quotas, takers=takers)
        metrics.track_lanes(node.lane for node in dag.nodes.values())
        reply = {"task_id": result.task_id, "created": result.created, "dag_hash": dag.hash}
        return _json_response(201 if result.created else 200, reply)

    @app.get("/v1/tasks", tags=["tasks"], response_model=TaskPage, responses=_ERRORS)
    async def list_tasks(
        who: Reader,
        status: Annotated[list[str] | None, Query()] = None,
        dag: str = "", label: str = "",
        limit: Annotated[int, Query(ge=1, le=ops.MAX_PAGE)] = ops.DEFAULT_PAGE,
        page_token: str = "",
    ) -> Response:
        """Tasks newest first, one page at a time (an opaque `next_page_token`)."""
        tasks, token = await ops.list_page(
            engine, statuses=status or (), dag_name=dag,
            selector=ops.parse_label_selector(label), limit=limit, page_token=page_token)
        return _json_response(200, {"tasks": [ops.task_json(t) for t in tasks],
                                    "next_page_token": token})

    @app.get("/v1/task-counts", tags=["tasks"], response_model=TaskCounts,
             responses=_ERRORS)
    async def task_counts(who: Reader) -> Response:
        """Tasks per status (every status present), counted on the status index."""
        counts = await engine.task_counts()
        return _json_response(200, {"counts": {s.value: n for s, n in counts.items()}})

    @app.get("/v1/tasks/{task_id}", tags=["tasks"], response_model=TaskWithNodes,
             responses=_ERRORS)
    async def get_task(task_id: str, who: Reader) -> Response:
        """A task and the snapshots of its nodes."""
        return _json_response(200, await ops.task_view_json(engine, task_id))

    @app.get("/v1/tasks/{task_id}/events", tags=["tasks"], response_model=EventPage,
             responses=_ERRORS)
    async def get_events(
        task_id: str, who: Reader,
        after_seq: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=ops.MAX_PAGE * 10)] = ops.DEFAULT_EVENTS,
        page_token: Annotated[str, Query(max_length=512)] = "",
    ) -> Response:
        """The task's events in commit order, one page at a time (pass
        ``next_page_token`` back as ``page_token``)."""
        events, last, token = await ops.events_page(engine, task_id, after_seq=after_seq,
                                                    limit=limit, page_token=page_token)
        return _json_response(200, {"events": [ops.event_json(e) for e in events],
                                    "last_seq": last, "next_page_token": token})

    @app.get("/v1/tasks/{task_id}/watch", tags=["tasks"], response_class=_EventStream,
             responses={200: {"description": _WATCH_FORMAT}, **_STREAM_ERRORS})
    async def watch(
        task_id: str, who: Reader,
        after_seq: Annotated[int, Query(ge=0)] = 0,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    ) -> StreamingResponse:
        """Server-sent events: one ``data:`` JSON per event until the task is final."""
        # An EventSource sends back whatever id it last saw: anything but a plain seq of
        # at most 20 digits is ignored like an absent header (str.isdigit() passed "²"
        # and 5,000 digits, which int() refuses: a 500).
        if last_event_id and re.fullmatch(r"[0-9]{1,20}", last_event_id):
            after_seq = max(after_seq, int(last_event_id))
        # Subscribed and replayed before the response starts: a 404 comes as one.
        stream = await ops.start_following(engine, task_id, after_seq=after_seq,
                                           stopping=stop, keepalive=SSE_KEEPALIVE)
        return StreamingResponse(_sse(stream), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})

    @app.post("/v1/tasks/{task_id}/nodes/{node_id:path}/decision", tags=["gates"],
              response_model=DecisionReply, responses=_ERRORS)
    async def decide(task_id: str, node_id: str, body: DecisionBody,
                     who: Approver) -> Response:
        """Approve or reject a paused human gate (recorded with the token's name).
        ``data`` with an approval replaces what the gate passes on (its output's
        ``data``, by default what the approver reviewed): approve-with-edits."""
        edits = body.data if "data" in body.model_fields_set else NO_EDITS
        result = await engine.decide(task_id, node_id, decision=body.decision, by=who.name,
                                     comment=body.comment, data=edits)
        snap, node_type = await ops.node_snapshot(engine, task_id, node_id)
        return _json_response(200, {"result": result, "node": ops.node_json(snap, node_type)})

    async def _resume(task_id: str, node_id: str, data: Any, who: Principal,
                      input_revision: str = "") -> Response:
        result = await engine.resume(task_id, node_id, data=data, by=who.name,
                                     input_revision=input_revision)
        snap, node_type = await ops.node_snapshot(engine, task_id, node_id)
        return _json_response(200, {"result": result, "node": ops.node_json(snap, node_type)})

    @app.post("/v1/tasks/{task_id}/nodes/{node_id:path}/resume", tags=["gates"],
              response_model=ResumeReply, responses=_ERRORS)
    async def resume(task_id: str, node_id: str, who: Approver,
                     body: ResumeBody | None = None) -> Response:
        """Resume a node its handler paused; ``data`` goes to its next run."""
        return await _resume(task_id, node_id, body.data if body else None, who)

    @app.post("/v1/callbacks/{key}", tags=["gates"], response_model=ResumeReply,
              responses=_ERRORS)
    async def callback(key: str, request: Request, who: Approver) -> Response:
        """A callback for a paused node, named by its ``resume_key`` (task, node and input
        revision, as its handler received it); the JSON body goes to its next run."""
        parts = key.split("~")
        if len(parts) != 3 or not all(parts):
            raise InputError(f"callback key {key[:80]!r} is not TASK~NODE~INPUT_REVISION "
                             "(the resume_key the node's handler was given)")
        raw = await request.body()
        data = limits.parse_json_text(raw.decode("utf-8", "replace"), "callback body") \
            if raw.strip() else None
        return await _resume(parts[0], parts[1], data, who, input_revision=parts[2])

    @app.post("/v1/tasks/{task_id}/cancel", tags=["tasks"], response_model=TaskActionReply,
              responses=_ERRORS)
    async def cancel(task_id: str, who: Admin,
                     body: CancelBody | None = None) -> Response:
        """Cancel every node not yet final."""
        reason = body.reason if body else ""
        by = f"{who.name} ({reason})" if reason else who.name
        result = await engine.cancel(task_id, by=by)
        task = ops.task_json(await ops.require_task(engine, task_id))
        return _json_response(200, {"result": result, "task": task})

    @app.post("/v1/tasks/{task_id}/retry", tags=["tasks"], response_model=TaskActionReply,
              responses=_ERRORS)
    async def retry(task_id: str, body: RetryBody, who: Admin) -> Response:
        """Re-run a node and everything after it."""
        override = body.input if "input" in body.model_fields_set else None
        result = await engine.retry(task_id, body.from_node, input_override=override,
                                    by=who.name)
        task = ops.task_json(await ops.require_task(engine, task_id))
        return _json_response(200, {"result": result, "task": task})

    @app.post("/v1/tasks/{task_id}/fork", tags=["tasks"], response_model=ForkReply,
              status_code=201, responses=_ERRORS)
    async def fork(task_id: str, body: ForkBody, who: Admin) -> Response:
        """Fork a finished task at a node: a new task sharing the history before it."""
        output = body.output if "output" in body.model_fields_set else RERUN
        fork_id = await fork_task(engine, task_id, body.from_node, output=output,
                                  by=who.name)
        task = ops.task_json(await ops.require_task(engine, fork_id))
        return _json_response(201, {"forked_from": f"{task_id}@{body.from_node}",
                                    "task": task})

    @app.post("/v1/dags/validate", tags=["dags"], response_model=ValidateReply,
              responses=_ERRORS)
    async def validate(body: ValidateBody, who: Submitter) -> Response:
        """Validate a DAG without storing it."""
        dag, problems = await ops.validate_dag(engine, mapping=body.dag,
                                               yaml_text=body.dag_yaml, file=body.file)
        return _json_response(200, {
            "valid": dag is not None, "problems": [problem_json(p) for p in problems],
            "hash": dag.hash if dag else None, "name": dag.name if dag else None})

    @app.get("/v1/dags", tags=["dags"], response_model=DagPage, responses=_ERRORS)
    async def list_dags(
        who: Reader,
        limit: Annotated[int, Query(ge=1, le=ops.MAX_PAGE)] = ops.DEFAULT_PAGE,
        page_token: Annotated[str, Query(max_length=128)] = "",
    ) -> Response:
        """Stored DAG versions by hash, one page at a time (name and node count; get one
        whole with ``GET /v1/dags/{dag_hash}``)."""
        dags, token = await ops.dags_page(engine, limit=limit, page_token=page_token)
        return _json_response(200, {"dags": [ops.dag_info_json(d) for d in dags],
                                    "next_page_token": token})

    @app.get("/v1/approvals", tags=["gates"], response_model=ApprovalPage, responses=_ERRORS)
    async def list_approvals(
        who: Reader,
        limit: Annotated[int, Query(ge=1, le=ops.MAX_PAGE)] = ops.DEFAULT_PAGE,
        page_token: Annotated[str, Query(max_length=512)] = "",
    ) -> Response:
        """Gates waiting for a decision, across PAUSED tasks (newest first; ``limit``
        counts tasks), with their rendered input and deadline."""
        found, token = await ops.approvals_page(engine, limit=limit, page_token=page_token)
        return _json_response(200, {"approvals": [ops.approval_json(a) for a in found],
                                    "next_page_token": token})

    @app.get("/v1/dags/{dag_hash}", tags=["dags"], response_model=DagReply, responses=_ERRORS)
    async def get_dag(dag_hash: str, who: Reader) -> Response:
        """A stored DAG by content hash."""
        return _json_response(200, ops.dag_json(await engine.get_dag(dag_hash)))

    install_ui(app, auth=auth, anonymous_secret=secrets.token_hex(32))
    return app


async def _sse(stream: AsyncGenerator[Any, None]) -> AsyncIterator[bytes]:
    try:
        async for item in stream:
            if item is None:
                yield b": keepalive\n\n"
            elif isinstance(item, ops.WatchEnd):
                data = json.dumps({"task_id": item.task_id, "status": item.status})
                yield f"event: end\ndata: {data}\n\n".encode()
            else:  # a batch: one chunk, one write
                yield "".join(f"id: {event.seq}\ndata: {json.dumps(ops.event_json(event))}\n\n"
                              for event in item).encode()
    except AxError as exc:
        # Headers are gone already: tell the client in the stream, then end it.
        yield f"event: error\ndata: {json.dumps(error_body(exc))}\n\n".encode()
    finally:
        await stream.aclose()
