"""The web UI's server side: pages, sessions, CSRF and security headers.

The UI (``axengine/ui/static``) is a single page written in plain JavaScript that talks
to the same ``/v1`` routes as every other client; this module only serves it and lets a
browser hold a token safely:

- ``GET /`` redirects to ``/ui/``; ``GET /ui/static/<file>`` serves the page's files;
  every other ``GET /ui/...`` answers the page itself, which routes on the URL.
- ``POST /ui/login`` takes a token of the tokens file and sets it as the ``ax_session``
  cookie: ``HttpOnly`` (scripts cannot read it), ``SameSite=Strict`` (other sites'
  pages cannot make the browser send it), ``Secure`` when the request came over https.
  The API stays stateless: any replica authenticates the cookie as it would the header.
- **CSRF**: a state-changing request (any method but GET, HEAD, OPTIONS) authenticated
  by the cookie must carry ``X-CSRF-Token``: a keyed hash of the session token that
  ``/ui/session`` and ``/ui/login`` return, which a page of another origin cannot read.
  And any state-changing request whose ``Origin`` (or ``Sec-Fetch-Site``) says it comes
  from another site is refused, cookie or not — that also guards a server run without
  tokens, where no cookie is involved.
- Every UI page and the API docs carry a strict Content-Security-Policy: scripts and
  styles only from this origin, no inline script, no framing.
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from axengine.api._auth import ANONYMOUS, Authenticator, Principal
from axengine.api._errors import error_body
from axengine.api._models import _Strict
from axengine.errors import Forbidden, NotFound, Unauthorized

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "SecurityHeadersMiddleware",
    "csrf_refusal",
    "install_ui",
    "scope_header",
    "session_token",
]

#: The session cookie: the bearer token itself, out of reach of scripts.
COOKIE = "ax_session"
#: The header a cookie-authenticated state-changing request must carry.
CSRF_HEADER = "X-CSRF-Token"
#: Seconds a session cookie lives (a working day).
SESSION_SECONDS = 12 * 3600

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
STATIC_DIR = UI_DIR / "static"
VENDOR_DIR = UI_DIR / "vendor"

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Paths whose answers carry the page headers (CSP...): the UI and the API docs.
_PAGE_PREFIXES = ("/ui", "/docs")


class LoginBody(_Strict):
    token: str = Field(..., min_length=1, max_length=4096)


def scope_header(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lower-case bytes) of an ASGI request, if sent."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def session_token(scope: Scope) -> str | None:
    """The token of the ``ax_session`` cookie of a request, if any."""
    raw = scope_header(scope, b"cookie")
    if not raw:
        return None
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(raw)
    except Exception:  # a malformed Cookie header is no session
        return None
    morsel = cookies.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def csrf_token(secret: str) -> str:
    """The CSRF token of a session: a keyed hash, useless without reading it from us."""
    return hmac.new(secret.encode(), b"ax-csrf-v1", hashlib.sha256).hexdigest()


def _foreign(scope: Scope) -> bool:
    """The browser says the request comes from a page of another site."""
    if scope_header(scope, b"sec-fetch-site") == "cross-site":
        return True
    origin = scope_header(scope, b"origin")
    if not origin or origin == "null":
        return origin == "null"
    host = scope_header(scope, b"host") or ""
    scheme = scope.get("scheme", "http")
    forwarded = scope_header(scope, b"x-forwarded-proto")
    allowed = {f"{scheme}://{host}"}
    if forwarded:
        allowed.add(f"{forwarded.split(',')[0].strip()}://{host}")
    return origin not in allowed


def csrf_refusal(scope: Scope, *, via_cookie: bool, secret: str) -> Forbidden | None:
    """Why a request must be refused as a possible cross-site forgery (None: it may go
    on). Only state-changing methods are checked."""
    if scope.get("method", "GET") in _SAFE_METHODS:
        return None
    if _foreign(scope):
        return Forbidden("cross-site request refused: the Origin of this state-changing "
                         "request is not this server")
    if via_cookie:
        sent = scope_header(scope, CSRF_HEADER.lower().encode()) or ""
        if not hmac.compare_digest(sent.encode(), csrf_token(secret).encode()):
            return Forbidden(f"CSRF check failed: a request authenticated by the {COOKIE} "
                             f"cookie must carry the {CSRF_HEADER} header that GET "
                             "/ui/session returns")
    return None


class SecurityHeadersMiddleware:
    """Add the page headers (CSP, nosniff, no framing) to UI and docs answers, and
    ``nosniff`` to every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        page = path == "/" or path.startswith(_PAGE_PREFIXES)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {k.lower() for k, _ in headers}
                extra = _HEADERS if page else {"X-Content-Type-Options": "nosniff"}
                headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()
                            if k.lower().encode() not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _session_body(principal: Principal, secret: str, *, auth: bool) -> dict[str, Any]:
    return {"name": principal.name, "roles": sorted(r.value for r in principal.roles),
            "csrf": csrf_token(secret), "auth": auth}


def install_ui(app: FastAPI, *, auth: Authenticator | None,
               anonymous_secret: str) -> None:
    """Add the UI routes to ``app`` (before the catch-all page route, which is last).

    Args:
        app: The REST application.
        auth: Tokens and roles (None: authentication off, everyone is ``anonymous``).
        anonymous_secret: Keys the CSRF token when authentication is off.
    """

    def session_of(request: Request) -> tuple[Principal, str]:
        if auth is None:
            return ANONYMOUS, anonymous_secret
        token = session_token(request.scope)
        if token is None:
            raise Unauthorized("not signed in: POST /ui/login with a token")
        return auth.authenticate(f"Bearer {token}"), token

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("/ui/", status_code=307)

    @app.get("/ui/session", include_in_schema=False)
    async def session(request: Request) -> Response:
        principal, secret = session_of(request)
        return JSONResponse(_session_body(principal, secret, auth=auth is not None),
                            headers={"Cache-Control": "no-store"})

    @app.post("/ui/login", include_in_schema=False)
    async def login(body: LoginBody, request: Request) -> Response:
        if auth is None:
            return JSONResponse(_session_body(ANONYMOUS, anonymous_secret, auth=False),
                                headers={"Cache-Control": "no-store"})
        principal = auth.authenticate(f"Bearer {body.token.strip()}")
        answer = JSONResponse(_session_body(principal, body.token.strip(), auth=True),
                              headers={"Cache-Control": "no-store"})
        answer.set_cookie(COOKIE, body.token.strip(), max_age=SESSION_SECONDS, path="/",
                          httponly=True, samesite="strict",
                          secure=_https(request.scope))
        return answer

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        answer = JSONResponse({"signed_out": True})
        answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                             secure=_https(request.scope))
        return answer

    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR, check_dir=False),
              name="ui-static")
    app.mount("/ui/vendor", StaticFiles(directory=VENDOR_DIR, check_dir=False),
              name="ui-vendor")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return FileResponse(VENDOR_DIR / "swagger.html")

    @app.get("/ui", include_in_schema=False)
    @app.get("/ui/{path:path}", include_in_schema=False)
    async def page(path: str = "") -> Response:
        if path.startswith(("static/", "vendor/")):
            return JSONResponse(error_body(NotFound(f"no file /ui/{path}")), status_code=404)
        return FileResponse(STATIC_DIR / "index.html",
                            headers={"Cache-Control": "no-cache"})


def _https(scope: Scope) -> bool:
    forwarded = scope_header(scope, b"x-forwarded-proto") or ""
    return scope.get("scheme") == "https" or forwarded.split(",")[0].strip() == "https"

