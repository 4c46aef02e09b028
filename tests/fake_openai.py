"""A fake OpenAI-compatible endpoint on loopback, recording what it is sent.

    with fake_openai(answer='{"risk": "low"}') as api:
        env = {"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": "sk-test"}
        ...                                 # run ax against it
        (call,) = api.calls                 # .headers, .body (the JSON request)

Serves ``POST /v1/chat/completions`` (and ``GET /v1/models``). Each answer reports
token usage (words of the prompt / of the answer). ``api.fail(status, times=…,
headers=…)`` queues error replies that are served before the next normal answers; a key
set with ``require_key`` is checked like OpenAI does (401 otherwise). Reusable by the
tests of ``ax server`` / ``ax executor``: everything runs in one daemon thread of the
test process.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Call", "FakeOpenAI", "fake_openai"]

Answer = str | Callable[[dict[str, Any]], str]


@dataclass
class Call:
    """One request the endpoint received."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def authorization(self) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == "authorization"),
                    None)

    @property
    def system_prompt(self) -> str | None:
        return next((m["content"] for m in self.body.get("messages", [])
                     if m.get("role") == "system"), None)

    @property
    def user_prompt(self) -> str | None:
        return next((m["content"] for m in self.body.get("messages", [])
                     if m.get("role") == "user"), None)


@dataclass
class _Failure:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class FakeOpenAI:
    """A running fake endpoint.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1`` — what ``OPENAI_BASE_URL`` should be.
        answer: The completion text, or a function of the request body returning it.
        require_key: When set, requests without ``Authorization: Bearer <key>`` get 401.
        calls: Every request received, in order.
    """

    base_url: str
    answer: Answer
    require_key: str | None = None
    calls: list[Call] = field(default_factory=list)
    _failures: list[_Failure] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, status: int, *, times: int = 1, headers: dict[str, str] | None = None,
             message: str = "fake failure") -> None:
        """Answer the next ``times`` completion requests with HTTP ``status``."""
        body = {"error": {"message": message, "type": "fake_error", "code": status}}
        with self._lock:
            self._failures.extend(_Failure(status, body, dict(headers or {}))
                                  for _ in range(times))

    @property
    def completions(self) -> list[Call]:
        """The chat completion requests received."""
        return [c for c in self.calls if c.path.endswith("/chat/completions")]

    def _reply(self, call: Call) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._lock:
            self.calls.append(call)
            failure = self._failures.pop(0) if self._failures else None
        if not call.path.startswith("/v1/"):
            return 404, {"error": {"message": f"no route {call.path}"}}, {}
        if self.require_key is not None and call.authorization != f"Bearer {self.require_key}":
            given = (call.authorization or "").removeprefix("Bearer ")
            # Like OpenAI, name (a masked form of) the key that was refused.
            masked = given[:3] + "***" + given[-2:] if len(given) > 6 else "***"
            return 401, {"error": {"message": f"Incorrect API key provided: {masked}",
                                   "type": "invalid_request_error",
                                   "code": "invalid_api_key"}}, {}
        if failure is not None:
            return failure.status, failure.body, failure.headers
        if call.path == "/v1/models":
            return 200, {"object": "list", "data": []}, {}
        if call.path != "/v1/chat/completions" or call.method != "POST":
            return 404, {"error": {"message": f"no route {call.method} {call.path}"}}, {}
        text = self.answer(call.body) if callable(self.answer) else self.answer
        prompt_words = sum(len(str(m.get("content", "")).split())
                           for m in call.body.get("messages", []))
        completion_words = len(text.split())
        return 200, {
            "id": f"chatcmpl-{len(self.calls)}",
            "object": "chat.completion",
            "created": 0,
            "model": call.body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_words, "completion_tokens": completion_words,
                      "total_tokens": prompt_words + completion_words},
        }, {}


@contextmanager
def fake_openai(answer: Answer = "ok", *, require_key: str | None = None
                ) -> Iterator[FakeOpenAI]:
    """Serve a :class:`FakeOpenAI` on a free loopback port while in the block."""
    holder: list[FakeOpenAI] = []

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {"_raw": raw.decode("utf-8", "replace")}
            call = Call(self.command, self.path.split("?", 1)[0],
                        dict(self.headers.items()), body)
            status, reply, headers = holder[0]._reply(call)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(FakeOpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                             answer=answer, require_key=require_key))
    # A short poll interval: shutdown() waits up to one interval for the loop to notice.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                              name="fake-openai", daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
