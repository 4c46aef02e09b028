"""Property: random bodies, headers, paths and DAG documents at every REST route.

For every route of the running API (enumerated from its ``/openapi.json`` plus the
routes the schema leaves out), hypothesis builds requests — path parameters (real ids of
a paused and a finished task, their nodes and DAG hashes, or hostile segments: ``..``,
``%2e%2e``, unicode, very long), query strings, headers (any token kind, none, garbage
``Authorization``, odd ``Content-Type``, ``Idempotency-Key`` of any size) and bodies
(random JSON, deep nesting, NaN/Infinity literals, huge ints, lone surrogates, random
bytes, DAG mappings as ``dag`` and YAML documents as ``dag_yaml`` with hostile templates,
unquoted ``{{``, tags and bounded alias bombs) — and sends them over a raw socket (no
client-side normalisation of ``..``). Every answer must be 2xx or 4xx within
:data:`CALL_TIMEOUT` (a watch stream of a final task must end), and after every refused
request the store must be unchanged (:func:`tests.security.fuzz.unchanged`).

Each test collects every distinct failure of its examples (see ``Findings``) and fails
with the list.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import h11
import httpx
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.security.conftest import store_state
from tests.security.fuzz import (
    CALL_TIMEOUT,
    CONTENT_TYPES,
    NODE_IDS,
    Findings,
    World,
    auth_header,
    close_world,
    dag_mapping,
    dag_yaml,
    depths,
    fuzz_settings,
    hostile_text,
    idempotency_header,
    json_value,
    make_world,
    nested,
    odd_json_leaf,
    path_segment,
    short,
    text,
    unchanged,
    valid_dag,
)
from tests.topology import Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Examples per route (each stays well under 15 s on 2 cores).
EXAMPLES = int(os.environ.get("AX_FUZZ_EXAMPLES", "150"))
#: Seconds a 200 watch stream of a task that is not final is read before it is closed.
STREAM_PEEK = 0.3


# ---------------------------------------------------------------------------- routes

REAL_TASKS = ("@gate", "@done")
REAL_HASHES = ("@ghash", "@dhash")

#: Query parameters each route documents, with odd values for them.
_LIMITS = st.sampled_from(["0", "1", "-1", "1000", "1001", "10000", "10001", "99999999999999",
                           "1e3", "nan", "inf", "", "abc", "1.5", "٣", " 5"])
_SEQ = st.sampled_from(["0", "-1", "1", "9223372036854775807", "9223372036854775808",
                        "1" + "0" * 100, "nan", "", "x"])
_STATUS = st.sampled_from(["RUNNING", "paused", "SUCCEEDED", "failed", "DEAD", "CANCELLED",
                           "bogus", "", "running,paused"])
QUERY: dict[str, dict[str, st.SearchStrategy[str]]] = {
    "GET /v1/tasks": {"status": st.one_of(_STATUS, hostile_text()), "dag": hostile_text(),
                      "label": st.one_of(st.sampled_from(["a=b", "a!=b", "a", "a==b,c",
                                                          "=x", ",,,", "a=b=c", "a in (b)"]),
                                         hostile_text()),
                      "limit": _LIMITS, "page_token": st.one_of(
                          st.sampled_from(REAL_TASKS), hostile_text())},
    "GET /v1/tasks/{task_id}/events": {"after_seq": _SEQ, "limit": _LIMITS},
    "GET /v1/tasks/{task_id}/watch": {"after_seq": _SEQ},
    "GET /v1/dags": {"limit": _LIMITS, "page_token": hostile_text()},
    "GET /v1/approvals": {"limit": _LIMITS, "page_token": hostile_text()},
}

#: Every route this module fuzzes: (method, path template) -> kind of body.
ROUTES: dict[str, str] = {
    "GET /healthz": "none",
    "GET /readyz": "none",
    "GET /metrics": "none",
    "POST /v1/tasks": "submit",
    "GET /v1/tasks": "none",
    "GET /v1/tasks/{task_id}": "none",
    "GET /v1/tasks/{task_id}/events": "none",
    "GET /v1/tasks/{task_id}/watch": "none",
    "POST /v1/tasks/{task_id}/nodes/{node_id}/decision": "decision",
    "POST /v1/tasks/{task_id}/nodes/{node_id}/resume": "resume",
    "POST /v1/callbacks/{key}": "callback",
    "POST /v1/tasks/{task_id}/cancel": "cancel",
    "POST /v1/tasks/{task_id}/retry": "retry",
    "POST /v1/tasks/{task_id}/fork": "fork",
    "POST /v1/dags/validate": "validate",
    "GET /v1/dags/{dag_hash}": "none",
    "GET /v1/dags": "none",
    "GET /v1/approvals": "none",
    "GET /v1/task-counts": "none",
    # Left out of the schema: the OpenAPI document, the docs page and the web UI.
    "GET /openapi.json": "none",
    "GET /docs": "none",
    "GET /": "none",
    "GET /ui": "none",
    "GET /ui/{path:path}": "none",
    "GET /ui/session": "none",
    "POST /ui/login": "login",
    "POST /ui/logout": "none",
    "GET /ui/static/{file}": "none",
    "GET /ui/vendor/{file}": "none",
}

#: Routes that exist but are not in the OpenAPI document.
NOT_IN_SCHEMA = {route for route in ROUTES if route.startswith(("GET /ui", "POST /ui"))} | {
    "GET /openapi.json", "GET /docs", "GET /"}
#: Files asked of the static mounts and the UI's page route: real ones, and escapes.
FILES = ["index.html", "app.js", "swagger-init.js", "swagger-ui/LICENSE", "tasks/t-1",
         "../api/_rest.py", "..%2f..%2fapi%2f_auth.py", "%2e%2e/%2e%2e/pyproject.toml",
         "static/../../__init__.py"]


def served_routes(topology: Topology) -> set[str]:
    """Every ``METHOD /path`` the running API serves: its OpenAPI paths, and the routes
    of the application object that the schema leaves out."""
    schema = httpx.get(f"{topology.api_url}/openapi.json", timeout=30).json()
    routes = {f"{method.upper()} {path}" for path, item in schema["paths"].items()
              for method in item if method in {"get", "post", "put", "patch", "delete",
                                               "head", "options"}}
    routes |= _app_routes_outside_schema()
    return routes


def _app_routes_outside_schema() -> set[str]:
    """Routes of ``create_app`` with ``include_in_schema=False`` (docs pages, any
    route added that way later)."""
    from fastapi.routing import APIRoute
    from starlette.routing import Mount, Route

    from axengine.api._rest import create_app
    from axengine.metrics import AxMetrics

    try:
        app = create_app(engine=None, auth=None, metrics=AxMetrics())  # type: ignore[arg-type]
    except TypeError:  # a new required argument: the schema then has to do
        return set(NOT_IN_SCHEMA)
    out = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and route.include_in_schema:
            continue
        if isinstance(route, Route | APIRoute):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                out.add(f"{method} {route.path}")
        elif isinstance(route, Mount):
            out.add(f"GET {route.path}/{{file}}")
    return out


def test_every_route_is_fuzzed(topology: Topology) -> None:
    """A route added to the API without being added to ROUTES fails here."""
    served = served_routes(topology)
    assert served - set(ROUTES) == set(), f"routes not fuzzed: {sorted(served - set(ROUTES))}"
    assert set(ROUTES) - served == set(), f"fuzzed routes gone: {sorted(set(ROUTES) - served)}"


# ---------------------------------------------------------------------------- requests


@dataclass
class Req:
    method: str
    path: str
    query: str
    headers: list[tuple[str, bytes]]
    body: bytes
    route: str = ""

    def wire(self, world: World, port: int) -> tuple[bytes, bytes]:
        target = world.resolve(self.path).encode("latin-1") + (
            b"?" + self.query.encode("latin-1") if self.query else b"")
        lines = [self.method.encode() + b" " + target + b" HTTP/1.1",
                 f"Host: 127.0.0.1:{port}".encode(),
                 f"Content-Length: {len(self.body)}".encode(), b"Connection: close"]
        for name, value in self.headers:
            for who in ("admin", "submitter2", "submitter", "approver", "executor"):
                value = value.replace(f"@tok:{who}".encode(), world.token(who).encode())
            lines.append(name.encode() + b": " + value)
        return target, b"\r\n".join(lines) + b"\r\n\r\n" + self.body

    def describe(self, world: World) -> str:
        target = world.resolve(self.path) + ("?" + self.query if self.query else "")
        heads = {n: short(v.decode("latin-1"), 80) for n, v in self.headers}
        return (f"{self.method} {short(target, 300)} headers={heads} "
                f"body={short(self.body, 700)!r}")


@dataclass
class Answer:
    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    ended: bool = True
    error: str = ""

    def describe(self) -> str:
        if self.status is None:
            return f"no answer: {self.error}"
        return f"{self.status} {short(self.body.decode('utf-8', 'replace'), 400)}"


def send(port: int, method: str, raw: bytes, *, stream_for: float) -> Answer:
    """Send raw bytes; parse the answer with h11. An SSE answer is read for
    ``stream_for`` seconds (``ended`` tells whether the server ended it)."""
    parser = h11.Connection(h11.CLIENT, max_incomplete_event_size=16 * 1024 * 1024)
    parser.send(h11.Request(method=method if method.isalpha() else "GET", target="/",
                            headers=[("Host", "x"), ("Content-Length", "0")]))
    parser.send(h11.EndOfMessage())
    answer = Answer(None)
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT)
    except OSError as exc:
        return Answer(None, error=f"connect: {exc}")
    with sock:
        # The server may answer (413) and close before reading everything.
        with contextlib.suppress(OSError):
            sock.sendall(raw)
        stream_end = None
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                answer.error = f"bad answer: {exc}"
                return answer
            if event is h11.NEED_DATA:
                if stream_end is not None:
                    left = stream_end - time.monotonic()
                    if left <= 0:
                        answer.ended = False  # the client closes: cancelled
                        return answer
                    sock.settimeout(left)
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    if stream_end is not None:
                        answer.ended = False
                        return answer
                    answer.error = f"timeout after {CALL_TIMEOUT}s" + (
                        f" (status {answer.status} sent)" if answer.status else "")
                    answer.status = None
                    return answer
                except OSError as exc:
                    answer.error = f"recv: {exc}"
                    if answer.status is None:
                        return answer
                    answer.ended = False
                    return answer
                parser.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                answer.status = event.status_code
                answer.headers = {k.decode(): v.decode("latin-1") for k, v in event.headers}
                if "text/event-stream" in answer.headers.get("content-type", ""):
                    stream_end = time.monotonic() + stream_for
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Data):
                if len(answer.body) < 65536:
                    answer.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                answer.ended = True
                return answer


# ---------------------------------------------------------------------------- bodies


def _submit_fields() -> dict[str, st.SearchStrategy[Any]]:
    return {
        "input": json_value,
        "idempotency_key": st.one_of(text(20), st.just("k" * 257), st.just(""), json_value),
        "labels": st.one_of(st.dictionaries(hostile_text(20), hostile_text(20), max_size=3),
                            json_value),
        "priority": st.one_of(st.integers(-(2**33), 2**33), st.just(10**40),
                              st.floats(), st.booleans(), text(5)),
        "deadline_seconds": st.one_of(st.floats(allow_nan=False), st.integers(-5, 10**20),
                                      st.just(0), text(5), st.none()),
    }


def _source() -> st.SearchStrategy[dict[str, Any]]:
    dag_hash = st.one_of(st.sampled_from(REAL_HASHES),
                         st.from_regex(r"[0-9a-f]{8,128}", fullmatch=True), hostile_text())
    return st.one_of(
        st.builds(lambda d: {"dag": d}, st.one_of(valid_dag(), dag_mapping(), json_value)),
        st.builds(lambda y: {"dag_yaml": y}, st.one_of(dag_yaml(), dag_yaml(), json_value)),
        st.builds(lambda h: {"dag_hash": h}, dag_hash),
        st.fixed_dictionaries({}, optional={"dag": dag_mapping(), "dag_yaml": dag_yaml(),
                                            "dag_hash": dag_hash}),
    )


@st.composite
def model_body(draw: st.DrawFn, kind: str) -> Any:
    """A body shaped like the route's model, every field random."""
    body: dict[str, Any]
    if kind == "submit":
        body = draw(_source())
        body.update(draw(st.fixed_dictionaries({}, optional=_submit_fields())))
    elif kind == "decision":
        body = draw(st.fixed_dictionaries({}, optional={
            "decision": st.one_of(st.sampled_from(["approve", "reject", "APPROVE", ""]),
                                  json_value),
            "comment": st.one_of(text(40), st.just("c" * 2001), json_value)}))
    elif kind == "cancel":
        body = draw(st.fixed_dictionaries({}, optional={
            "reason": st.one_of(hostile_text(), st.just("r" * 501), json_value)}))
    elif kind == "resume":
        body = draw(st.fixed_dictionaries({}, optional={"data": json_value}))
    elif kind == "login":
        body = draw(st.fixed_dictionaries({}, optional={
            "token": st.one_of(hostile_text(), st.just("t" * 5000), json_value)}))
    elif kind == "retry":
        body = draw(st.fixed_dictionaries({}, optional={
            "from_node": st.one_of(st.sampled_from(NODE_IDS), hostile_text(), json_value),
            "input": json_value}))
    elif kind == "fork":
        body = draw(st.fixed_dictionaries({}, optional={
            "from_node": st.one_of(st.sampled_from(NODE_IDS), hostile_text(), json_value),
            "output": json_value}))
    elif kind == "validate":
        body = draw(st.one_of(
            st.builds(lambda d: {"dag": d}, st.one_of(valid_dag(), dag_mapping(), json_value)),
            st.builds(lambda y: {"dag_yaml": y}, st.one_of(dag_yaml(), json_value)),
            st.fixed_dictionaries({}, optional={"dag": dag_mapping(), "dag_yaml": dag_yaml()})))
        if draw(st.booleans()):
            body["file"] = draw(st.one_of(hostile_text(), json_value))
    else:
        body = draw(st.dictionaries(text(10), json_value, max_size=3))
    if draw(st.integers(0, 7)) == 0:
        body[draw(text(10))] = draw(json_value)
    return body


@st.composite
def sane_body(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """A body of the route's model with well-typed fields (values still random)."""
    dag = st.one_of(valid_dag(), valid_dag(), dag_mapping())
    if kind == "submit":
        body = draw(st.one_of(
            st.builds(lambda d: {"dag": d}, dag),
            st.builds(lambda d: {"dag_yaml": yaml.safe_dump(d, allow_unicode=True)},
                      valid_dag()),
            st.builds(lambda y: {"dag_yaml": y}, dag_yaml()),
            st.builds(lambda h: {"dag_hash": h}, st.sampled_from(REAL_HASHES))))
        body.update(draw(st.fixed_dictionaries({}, optional={
            "input": json_value,
            "labels": st.dictionaries(st.from_regex(r"[a-z][a-z0-9_.-]{0,15}", fullmatch=True),
                                      text(20), max_size=3),
            "priority": st.integers(-100, 100),
            "deadline_seconds": st.floats(0.5, 1e6)})))
        return body
    if kind == "decision":
        return {"decision": draw(st.sampled_from(["approve", "reject"])),
                "comment": draw(text(60))}
    if kind == "cancel":
        return draw(st.fixed_dictionaries({}, optional={"reason": text(60)}))
    if kind == "resume":
        return draw(st.fixed_dictionaries({}, optional={"data": json_value}))
    if kind == "login":
        return {"token": draw(st.one_of(text(40), st.sampled_from(["@tok:admin"])))}
    if kind == "retry":
        return draw(st.fixed_dictionaries({"from_node": st.sampled_from(NODE_IDS)},
                                          optional={"input": json_value}))
    if kind == "fork":
        return draw(st.fixed_dictionaries({"from_node": st.sampled_from(NODE_IDS)},
                                          optional={"output": json_value}))
    if kind == "validate":
        return draw(st.one_of(st.builds(lambda d: {"dag": d}, dag),
                              st.builds(lambda y: {"dag_yaml": y}, dag_yaml())))
    return {}


FIELDS = {"submit": ("dag", "dag_yaml", "dag_hash", "input", "priority", "labels",
                     "deadline_seconds", "idempotency_key"),
          "decision": ("decision", "comment"), "cancel": ("reason",), "resume": ("data",),
          "callback": ("x",), "login": ("token",),
          "retry": ("from_node", "input"), "fork": ("from_node", "output"),
          "validate": ("dag", "dag_yaml", "file"),
          "none": ("x",)}


@st.composite
def body_bytes(draw: st.DrawFn, kind: str) -> bytes:
    """The bytes of a body: model-shaped JSON, odd JSON text, random bytes, nothing."""
    names = FIELDS[kind]
    choice = draw(st.integers(0, 9 if kind != "none" else 14))
    if choice <= 4:
        if kind == "none" and choice <= 3:
            return b""
        value = draw(model_body(kind))
        return json.dumps(value, ensure_ascii=draw(st.booleans())).encode()
    if choice == 5:  # an odd literal in one field of an otherwise sensible body
        value = draw(model_body(kind))
        name = draw(st.sampled_from(names))
        value[name] = "@@ODD@@"
        leaf = draw(odd_json_leaf)
        return json.dumps(value).replace('"@@ODD@@"', leaf).encode()
    if choice == 6:  # deep nesting inside a field
        name = draw(st.sampled_from(names))
        inner = nested(draw(depths), "1", draw(st.sampled_from(["list", "dict"])))
        if name == "dag":
            inner = '{"nodes": {"a": {"type": "tool_call", "tool": "echo", "input": ' \
                    + inner + "}}}"
        return ('{"' + name + '": ' + inner + "}").encode()
    if choice == 7:  # the whole body odd JSON text
        return draw(odd_json_leaf).encode()
    if choice == 8:
        return draw(st.binary(max_size=300))
    return draw(text(200)).encode("utf-8")


# ---------------------------------------------------------------------------- headers


@st.composite
def headers(draw: st.DrawFn, route: str) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    auth = draw(auth_header())
    if auth is not None:
        out.append(("Authorization", auth if isinstance(auth, bytes) else auth.encode()))
    ctype = draw(st.one_of(st.sampled_from(CONTENT_TYPES), st.sampled_from(CONTENT_TYPES),
                           text(30)))
    if ctype is not None:
        out.append(("Content-Type", ctype.encode("utf-8")))
    key = draw(idempotency_header()) if route == "POST /v1/tasks" or draw(
        st.integers(0, 4)) == 0 else None
    if key is not None:
        out.append(("Idempotency-Key", key))
    if route.endswith("/watch") or draw(st.integers(0, 6)) == 0:
        last = draw(st.one_of(st.none(), st.sampled_from(["0", "1", "99999999999999999999",
                                                          "-1", "abc", "٣"]), text(10)))
        if last is not None:
            out.append(("Last-Event-ID", last.encode("utf-8")))
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(["Accept", "Accept-Encoding", "X-Forwarded-For",
                                     "Cookie", "Expect", "X-Request-Id", "Origin",
                                     "Accept-Language", "Range"]))
        value = draw(st.one_of(text(30).map(lambda s: s.encode("utf-8")),
                               st.integers(1, 12000).map(lambda n: b"v" * n)))
        out.append((name, value.replace(b"\r", b"").replace(b"\n", b"")))
    return [(n, v.replace(b"\r", b" ").replace(b"\n", b" ")) for n, v in out]


@st.composite
def query(draw: st.DrawFn, route: str) -> str:
    params = QUERY.get(route, {})
    pairs = []
    for name, strategy in params.items():
        for _ in range(draw(st.integers(0, 2))):
            pairs.append((name, draw(strategy)))
    for _ in range(draw(st.integers(0, 1))):
        pairs.append((draw(text(10)), draw(hostile_text(20))))
    encoded = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)
    if draw(st.integers(0, 9)) == 0:
        encoded += draw(st.sampled_from(["&", "&&==", "%", "%zz", "a=%ff%fe", "=", ";",
                                         "limit=1&limit=2", "#frag", "a=b c"])).replace(
            " ", "%20").replace("#", "%23")
    return encoded


#: Principals allowed by each kind of body (what a sane request uses).
ALLOWED_WHO = {"submit": ("admin", "submitter", "submitter2"), "validate": ("submitter",
               "admin"), "decision": ("approver", "admin"), "cancel": ("admin",),
               "resume": ("approver", "admin"), "callback": ("approver", "admin"),
               "retry": ("admin",), "fork": ("admin",), "login": ("admin", "approver"),
               "none": ("admin", "submitter", "approver", "executor")}


@st.composite
def sane_request(draw: st.DrawFn, route: str) -> Req:
    """A request a well-behaved client could send (right token, JSON content type,
    real ids), whose field values are still random: what gets past the front door."""
    method, path = route.split(" ", 1)
    kind = ROUTES[route]
    for name, real in (("{task_id}", REAL_TASKS), ("{node_id}", NODE_IDS),
                       ("{key}", [f"{t}~{n}~x" for t in REAL_TASKS[:1] for n in NODE_IDS]),
                       ("{dag_hash}", REAL_HASHES), ("{file}", FILES),
                       ("{path:path}", FILES)):
        if name in path:
            path = path.replace(name, draw(st.one_of(st.sampled_from(real),
                                                     st.sampled_from(real),
                                                     path_segment(real))))
    who = draw(st.sampled_from(ALLOWED_WHO[kind]))
    heads = [("Authorization", f"Bearer @tok:{who}".encode()),
             ("Content-Type", b"application/json")]
    if route == "POST /v1/tasks" and draw(st.booleans()):
        heads.append(("Idempotency-Key", draw(st.from_regex(r"[a-z0-9-]{1,40}",
                                                            fullmatch=True)).encode()))
    body = b"" if kind == "none" else json.dumps(draw(sane_body(kind))).encode()
    params = QUERY.get(route, {})
    pairs = [(n, draw(s)) for n, s in params.items() if draw(st.booleans())]
    q = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)
    return Req(method, path, q, heads, body, route)


@st.composite
def requests(draw: st.DrawFn, route: str) -> Req:
    if draw(st.integers(0, 9)) < 4:
        return draw(sane_request(route))
    method, template = route.split(" ", 1)
    if draw(st.integers(0, 11)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD",
                                       "OPTIONS", "TRACE", "FOO"]))
    path = template
    if "{task_id}" in path:
        path = path.replace("{task_id}", draw(path_segment(REAL_TASKS)))
    if "{node_id}" in path:
        path = path.replace("{node_id}", draw(path_segment(NODE_IDS)))
    if "{dag_hash}" in path:
        path = path.replace("{dag_hash}", draw(path_segment(REAL_HASHES)))
    if "{key}" in path:
        path = path.replace("{key}", draw(path_segment([f"{REAL_TASKS[0]}~n~x"])))
    for name in ("{file}", "{path:path}"):
        if name in path:
            path = path.replace(name, draw(st.one_of(st.sampled_from(FILES),
                                                     path_segment(FILES))))
    if draw(st.integers(0, 14)) == 0:
        path += draw(st.sampled_from(["/", "/..", "/%2e%2e", "//", "/x"]))
    return Req(method, path, draw(query(route)), draw(headers(route)),
               draw(body_bytes(ROUTES[route])), route)


# ---------------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def world(topology: Topology) -> Iterator[World]:
    w = make_world(topology)
    try:
        yield w
    finally:
        close_world(w)


def exercise(topology: Topology, world: World, findings: Findings, req: Req) -> None:
    """Send one request and check the property; failures go to ``findings``."""
    world.quiesce()
    before = store_state(topology)
    port = topology.http_port
    findings.mark()
    _target, raw = req.wire(world, port)
    watch = req.route.endswith("/watch") and req.method == "GET"
    answer = send(port, req.method, raw, stream_for=STREAM_PEEK if watch else CALL_TIMEOUT)
    where = req.route
    if answer.status is None:
        findings.add("hang/no answer", where, req.describe(world), answer.describe())
        return
    findings.count(f"{answer.status} {_error_type(answer.body)}".strip())
    if answer.status >= 500 or answer.status < 200:
        findings.add(f"HTTP {answer.status}", where, req.describe(world), answer.describe())
    elif 300 <= answer.status < 400 and not answer.headers.get("location"):
        findings.add(f"HTTP {answer.status} without Location", where, req.describe(world),
                     answer.describe())
    if watch and answer.status == 200 and not answer.ended:
        # Open stream: fine while the task is not final; a final task's stream ends.
        task_id = _task_of(world.resolve(req.path))
        task = world.probe.task(task_id)
        if task is None or task.status.final:
            again = send(port, req.method, raw, stream_for=CALL_TIMEOUT)
            if again.status == 200 and not again.ended:
                findings.add("watch of a final/absent task did not end", where,
                             req.describe(world), again.describe())
    if answer.status >= 300 or (answer.status < 200):
        after = store_state(topology)
        changed = unchanged(world.probe, before, after)
        if changed:
            findings.add(f"store changed by refused request (HTTP {answer.status})", where,
                         req.describe(world), f"{answer.describe()} | {changed}")


def _error_type(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["type"])
    except Exception:
        return ""


def _task_of(path: str) -> str:
    from urllib.parse import unquote

    parts = path.split("/")
    return unquote(parts[3]) if len(parts) > 3 else ""


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_fuzz_route(topology: Topology, world: World, route: str) -> None:
    world.ensure()
    findings = Findings(topology)

    @fuzz_settings(EXAMPLES)
    @given(req=requests(route))
    def run(req: Req) -> None:
        exercise(topology, world, findings, req)

    run()
    findings.check()
