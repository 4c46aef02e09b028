"""A tiny HTTP server on 127.0.0.1 for tests, answering from a route table."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Seen:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    """What to answer."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Route = Callable[[Seen], Reply]


@dataclass
class LocalServer:
    """A running server: its base URL, route table and request log."""

    url: str
    routes: dict[str, Route]
    seen: list[Seen]


@contextmanager
def serve(routes: dict[str, Route] | None = None) -> Iterator[LocalServer]:
    """Serve ``routes`` (path → responder) on a free loopback port while in the block."""
    table: dict[str, Route] = dict(routes or {})
    seen: list[Seen] = []

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = Seen(self.command, self.path, dict(self.headers.items()),
                           self.rfile.read(length))
            seen.append(request)
            route = table.get(self.path.split("?", 1)[0])
            reply = route(request) if route else Reply(404, b"not found")
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep test output clean

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield LocalServer(f"http://127.0.0.1:{server.server_address[1]}", table, seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
