"""The stand-in's HTTP face: Kubernetes REST paths to cluster verbs, JSON and ``Status``
answers, chunked watch and log streams, and the log of every request received.

Served by a stdlib ``ThreadingHTTPServer`` (HTTP/1.1, one thread per connection) on
127.0.0.1 with a port the OS picks. Streams use chunked transfer encoding as a real API
server does, which is what lets ``drop_watches()`` cut one off abruptly: the socket is shut
without the terminating chunk, and the client sees an incomplete body, not a clean end.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.k8s import _api
from tests.k8s._api import JSON, ApiFailure, Kind, bad_request, method_not_allowed
from tests.k8s._cluster import KINDS, Cluster, PodRun
from tests.k8s._store import WatchDropped

_ROUTES = (
    (re.compile(r"/api/v1/(?:namespaces/([^/]+)/)?(pods|secrets)(?:/([^/]+)(?:/(log))?)?"),
     ("", "v1")),
    (re.compile(r"/apis/batch/v1/(?:namespaces/([^/]+)/)?(jobs)(?:/([^/]+))?()"),
     ("batch", "v1")),
)
#: Health endpoints: answered "ok", left out of the request log.
_PROBES = ("/readyz", "/livez", "/healthz")
_VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.0-standin",
            "platform": "linux/amd64"}
#: How often a followed log re-reads a running process's output file.
_FOLLOW_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class RequestRecord:
    """One request the stand-in received (health probes aside), with its answer's status."""

    method: str
    path: str
    query: dict[str, str]
    body: Any                #: the parsed JSON body, or None
    status: int
    verb: str = ""           #: create, get, list, watch, delete, deletecollection, log
    resource: str = ""       #: jobs, pods, secrets
    namespace: str = ""
    name: str = ""


@dataclass
class Reply:
    code: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: Iterator[bytes] | None = None


def _json(code: int, obj: JSON, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(code, json.dumps(obj).encode(), headers=headers or [])


def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name, "false").lower() in ("true", "1")


def _int(query: dict[str, str], name: str) -> int | None:
    text = query.get(name)
    if text in (None, ""):
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise bad_request(f"invalid {name}: {text!r}") from exc


class Api:
    """Routes a request to the cluster and records it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.records: list[RequestRecord] = []
        self.forbidden: dict[tuple[str, str], str | None] = {}

    def serve(self, method: str, target: str, raw: bytes) -> Reply:
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        record = RequestRecord(method, url.path, query, body, 0)
        try:
            reply, record = self._route(method, url.path, query, body, record)
        except ApiFailure as failure:
            reply = _json(failure.code, failure.status)
        except Exception as exc:  # a stand-in bug: answer 500 and fail the test at stop
            self.cluster.errors.append(exc)
            reply = _json(500, ApiFailure(500, "InternalError", repr(exc)).status)
        if record.path not in _PROBES:
            with self.cluster.cond:
                self.records.append(RequestRecord(**{**record.__dict__, "status": reply.code}))
        return reply

    def _route(self, method: str, path: str, query: dict[str, str], body: Any,
               record: RequestRecord) -> tuple[Reply, RequestRecord]:
        if path in _PROBES:
            return Reply(200, b"ok", "text/plain"), record
        if path == "/version":
            return _json(200, _VERSION), record
        for pattern, (group, version) in _ROUTES:
            if m := pattern.fullmatch(path):
                namespace, plural, name, sub = m[1], m[2], m[3] or "", m[4] or ""
                kind = KINDS[plural]
                assert (kind.group, kind.version) == (group, version)
                break
        else:
            raise ApiFailure(404, "NotFound", "the server could not find the requested "
                             "resource")
        verb = self._verb(method, query, name, sub)
        record = RequestRecord(method, path, query, body, 0, verb, plural, namespace or "",
                               name)
        if (verb, plural) in self.forbidden:
            raise _api.forbidden(kind, verb, namespace or "", self.forbidden[(verb, plural)])
        if namespace is None and verb not in ("list", "watch"):
            raise ApiFailure(404, "NotFound", "the server could not find the requested "
                             "resource")
        return self._call(verb, kind, namespace, name, query, body), record

    @staticmethod
    def _verb(method: str, query: dict[str, str], name: str, sub: str) -> str:
        if sub == "log" and method == "GET":
            return "log"
        if method == "GET":
            return "get" if name else ("watch" if _flag(query, "watch") else "list")
        if method == "POST" and not name:
            return "create"
        if method == "DELETE":
            return "delete" if name else "deletecollection"
        raise method_not_allowed(f"the Kubernetes stand-in does not implement {method} "
                                 f"here (it serves create, get, list, watch, delete, log)")

    def _call(self, verb: str, kind: Kind, namespace: str | None, name: str,
              query: dict[str, str], body: Any) -> Reply:
        cluster, ns = self.cluster, namespace or ""
        dry_run = query.get("dryRun") == "All"
        if verb == "create":
            return _json(201, cluster.create(kind, ns, body, dry_run))
        if verb == "get":
            return _json(200, cluster.get(kind, ns, name))
        labels = _api.parse_label_selector(query.get("labelSelector", ""))
        fields = _api.parse_field_selector(kind.plural, query.get("fieldSelector", ""))
        if verb == "list":
            return _json(200, cluster.select(kind, namespace, labels, fields,
                                           _int(query, "limit"), query.get("continue")))
        if verb == "watch":
            since = _int(query, "resourceVersion") or None  # "0" and unset: current state
            events = cluster.watch(kind, namespace, labels, fields, since,
                                   _int(query, "timeoutSeconds"))
            return Reply(200, stream=_lines(events))
        if verb == "log":
            return self._log(ns, name, query)
        options = body if isinstance(body, dict) else {}
        propagation = query.get("propagationPolicy") or options.get("propagationPolicy")
        grace = _int(query, "gracePeriodSeconds")
        if grace is None:
            grace = options.get("gracePeriodSeconds")
        if verb == "delete":
            answer, warnings = cluster.delete(kind, ns, name, propagation=propagation,
                                              grace=grace, dry_run=dry_run)
            return _json(200, answer, [("Warning", w) for w in warnings])
        with cluster.cond:  # deletecollection: each selected object, as the server does
            listed = cluster.select(kind, ns, labels, fields, None, None)
            headers: set[str] = set()
            for item in listed["items"]:
                _, more = cluster.delete(kind, ns, item["metadata"]["name"],
                                         propagation=propagation, grace=grace,
                                         dry_run=dry_run)
                headers.update(more)
        return _json(200, listed, [("Warning", w) for w in sorted(headers)])

    def _log(self, namespace: str, name: str, query: dict[str, str]) -> Reply:
        cluster = self.cluster
        run = cluster.log(namespace, name, query.get("container"))
        tail = _int(query, "tailLines")
        if not _flag(query, "follow"):
            return Reply(200, _tail(run.log.read_bytes(), tail), "text/plain")
        return Reply(200, content_type="text/plain", stream=self._follow(run, tail))

    def _follow(self, run: PodRun, tail: int | None) -> Iterator[bytes]:
        cond = self.cluster.cond
        with run.log.open("rb") as log:
            first = True
            while True:
                with cond:
                    done = run.exit_code is not None or self.cluster.store.closed
                data = log.read()
                if first:
                    data, first = _tail(data, tail), False
                if data:
                    yield data
                elif done:
                    return
                else:
                    with cond:
                        cond.wait(_FOLLOW_POLL_SECONDS)


def _lines(events: Iterator[tuple[str, JSON]]) -> Iterator[bytes]:
    """Newline-delimited watch events (closing this closes the watch)."""
    try:
        for kind, obj in events:
            yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def _tail(data: bytes, lines: int | None) -> bytes:
    if lines is None:
        return data
    kept = data.splitlines(keepends=True)[-lines:] if lines > 0 else []
    return b"".join(kept)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is :meth:`KubeStandIn.requests`."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        reply = self.server.api.serve(self.command, self.path, raw)
        self.send_response(reply.code)
        self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.stream is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in reply.stream:
                self.wfile.write(b"%X\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except WatchDropped:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            close = getattr(reply.stream, "close", None)
            if close is not None:
                close()


class Server(ThreadingHTTPServer):
    """Tracks its connections so :meth:`close` can end idle keep-alive ones and join every
    handler thread (no thread outlives the stand-in)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, api: Api) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._thread = threading.Thread(target=self.serve_forever, name="k8s-standin-http",
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (a reset keep-alive or abandoned stream) is normal; any
        other error in a handler thread is a stand-in bug, raised at stop."""
        error = sys.exc_info()[1]
        if isinstance(error, Exception) and not isinstance(error, ConnectionError):
            self.api.cluster.errors.append(error)

    def close(self) -> None:
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self.server_close()
