"""``http_request``: one HTTP(S) request to a host the egress policy allows.

Input: a URL string (GET), or a mapping::

    {"method": "POST", "url": "http://127.0.0.1:8080/hook", "headers": {...},
     "json": {...} | "body": "text", "timeout": 30}

Output: ``{"status": 200, "headers": {...a few...}, "body": <parsed JSON or text>}``.
Any answer below 500 — 404 and 409 included — is a business result the DAG can route
on; redirects are returned, not followed (they could leave the allowed hosts). A
destination the policy refuses (:mod:`executors.policy`: under api trust no loopback,
private, link-local or other non-public address, checked after DNS resolution and
pinned for the connection) is a non-retryable failure, and nothing is sent.
Connection errors, timeouts and 5xx are retryable failures.

Requests other than GET/HEAD/OPTIONS carry ``Idempotency-Key: http:{task}:{node}:{input
revision}`` so a server that honours the header sees a retried call as the same call.
Every request carries the attempt's W3C ``traceparent`` (docs/tracing.md) unless the
input's headers set one.

Settings: the policy's (``trust``, ``egress_allowed_hosts``, ``egress_private_allowed``,
also under ``tool_policy.http_request``), ``http_max_bytes`` (response bound, default
1 MiB), ``http_timeout`` (default 30 s).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import Message
from typing import Any

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from executors.policy import EgressDenied, Policy, PolicyError, parse_url
from executors.tools._common import read_bounded

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT", "http_request"]

#: Largest response body accepted (setting ``http_max_bytes``).
DEFAULT_MAX_BYTES = 1024 * 1024
#: Seconds per request unless the input or ``http_timeout`` says otherwise.
DEFAULT_TIMEOUT = 30.0

_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_KEPT_HEADERS = ("content-type", "content-length", "etag", "last-modified", "location",
                 "retry-after")


class _BadInput(ValueError):
    pass


def http_request(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Perform the request described by the node input."""
    try:
        policy = Policy.from_settings(ctx.settings, "http_request")
        req, timeout = _build(request, ctx.settings)
    except (_BadInput, PolicyError) as exc:
        return Failure(f"node {request.node_id!r}: {exc}", retryable=False)
    limit = int(ctx.settings.get("http_max_bytes", DEFAULT_MAX_BYTES))
    label = f"{req.get_method()} {req.full_url}"
    try:
        with policy.opener().open(req, timeout=timeout) as response:
            status, headers = response.status, response.headers
            data = read_bounded(response, limit)
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            return Failure(
                f"{label} answered HTTP {exc.code} {exc.reason}",
                retryable=True,
                details={"status": exc.code},
            )
        status, headers = exc.code, exc.headers
        data = read_bounded(exc, limit)
    except EgressDenied as exc:
        # The same destination will be refused again: no retry.
        return Failure(f"node {request.node_id!r}: {label}: {exc}", retryable=False)
    except OSError as exc:
        return Failure(f"{label} failed: {getattr(exc, 'reason', exc)}", retryable=True)
    if data is None:
        # The same request will return the same body: retrying cannot help.
        return Failure(
            f"{label}: response body exceeds {limit} bytes: raise http_max_bytes",
            retryable=False,
        )
    return Success({"status": status, "headers": _headers(headers), "body": _body(data, headers)})


def _build(
    request: NodeRequest, settings: Mapping[str, Any]
) -> tuple[urllib.request.Request, float]:
    spec: Any = request.input
    if isinstance(spec, str):
        spec = {"url": spec}
    if not isinstance(spec, Mapping):
        raise _BadInput(
            f"http_request input must be a URL or a mapping with 'url', got {type(spec).__name__}"
        )
    url = spec.get("url")
    if not isinstance(url, str):
        raise _BadInput("http_request input needs a 'url' string")
    try:
        parse_url(url)  # the destination itself is vetted when the opener connects
    except PolicyError as exc:
        raise _BadInput(str(exc)) from None
    method = str(spec.get("method", "GET")).upper()
    if method not in _METHODS:
        raise _BadInput(f"unsupported method {method!r}: use one of {sorted(_METHODS)}")
    headers = spec.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise _BadInput("'headers' must be a mapping of names to values")
    headers = {str(k): str(v) for k, v in headers.items()}
    # W3C trace context: the destination's spans join the task's trace under this
    # attempt (docs/tracing.md). A traceparent the DAG sets itself is kept.
    if not any(name.lower() == "traceparent" for name in headers):
        headers["traceparent"] = request.traceparent
    data = None
    if "json" in spec:
        data = json.dumps(spec["json"]).encode()
        headers.setdefault("Content-Type", "application/json")
    elif spec.get("body") is not None:
        body = spec["body"]
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    if method not in _SAFE_METHODS:
        headers.setdefault(
            "Idempotency-Key", f"http:{request.task_id}:{request.node_id}:{request.input_revision}"
        )
    timeout = spec.get("timeout", settings.get("http_timeout", DEFAULT_TIMEOUT))
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise _BadInput(f"'timeout' must be a positive number of seconds, got {timeout!r}")
    return urllib.request.Request(url, data=data, headers=headers, method=method), float(timeout)


def _headers(headers: Message | None) -> dict[str, str]:
    if headers is None:
        return {}
    return {name: str(headers[name]) for name in _KEPT_HEADERS if headers[name] is not None}


def _body(data: bytes, headers: Message | None) -> Any:
    text = data.decode(_charset(headers), "replace")
    content_type = (headers.get_content_type() if headers is not None else "") or ""
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # a server lying about its content type still gets its text returned
    return text


def _charset(headers: Message | None) -> str:
    charset = headers.get_content_charset() if headers is not None else None
    try:
        "".encode(charset or "utf-8")
    except LookupError:
        return "utf-8"
    return charset or "utf-8"
