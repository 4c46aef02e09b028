"""Fixtures of the API tests: a real API server (uvicorn + grpc.aio) in a thread.

``api_server(backend=...)`` starts :class:`axengine.api.ApiServer` in its own event loop
on a background thread, with REST and gRPC on free loopback ports, and returns a
:class:`ServerHandle`. Backends:

- ``embedded``: SQLite store in the test's tmp dir, in-process queue (``ax server``);
- ``etcd``: the session's real etcd and Redis (private ports, ``tests/servers.py``),
  with a key prefix unique to the test, deleted (and checked empty) afterwards.

Tokens: one per role (``TOKENS``), plus ``Bearer`` headers ready to use (``AUTH``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import redis

from axengine.api import ApiServer, Authenticator, Listening, ServerOptions
from axengine.config import AxConfig
from axengine.engine import Engine, EngineConfig
from axengine.store import Delete
from tests.servers import Server

T = TypeVar("T")

#: token -> (name, roles)
TOKENS: dict[str, tuple[str, list[str]]] = {
    "tok-submit-0123456789": ("submitter", ["submit"]),
    "tok-approve-0123456789": ("approver", ["approve"]),
    "tok-admin-0123456789ab": ("root", ["admin"]),
    "tok-executor-012345678": ("worker-pool", ["executor"]),
}
AUTH = {
    "submit": {"Authorization": "Bearer tok-submit-0123456789"},
    "approve": {"Authorization": "Bearer tok-approve-0123456789"},
    "admin": {"Authorization": "Bearer tok-admin-0123456789ab"},
    "executor": {"Authorization": "Bearer tok-executor-012345678"},
}
ROOT = Path(__file__).resolve().parents[2]
#: The in-process worker's handler settings (api trust, like ``ax server``): the example
#: inputs may be read, and tools may reach the tests' own loopback servers.
HANDLER_SETTINGS: dict[str, Any] = {"input_root": str(ROOT / "dags" / "inputs"),
                                    "egress_private_allowed": ["127.0.0.1"]}

SEED_BODY: dict[str, Any] = {"dag": {"nodes": {"hello": {
    "type": "llm_call", "model": "gpt-3.5-turbo",
    "prompt": "Say hello to user {{ .node.input.name }}", "input": {"name": "Alice"},
}}}}

GATE_YAML = """\
name: gated
nodes:
  draft:
    type: tool_call
    tool: echo
    input: {text: "{{ .input.text }}"}
    next: review
  review:
    type: human_gateway
    description: "check {{ .input.text }}"
    timeout: 3600
    next:
      - condition: "{{ .output.decision == 'approve' }}"
        target: publish
  publish:
    type: tool_call
    tool: echo
    input: {done: true}
"""


@dataclass
class ServerHandle:
    """A running API server and ways to reach it."""

    options: ServerOptions
    server: ApiServer
    loop: asyncio.AbstractEventLoop
    listening: Listening
    thread: threading.Thread
    stop_event: asyncio.Event
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.listening.http_url is not None
        return self.listening.http_url

    @property
    def grpc_address(self) -> str:
        assert self.listening.grpc_address is not None
        return self.listening.grpc_address

    @property
    def engine(self) -> Engine:
        return self.server.engine

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine in the server's loop (the engine lives there)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def revision(self) -> int:
        return self.call(self.engine.revision())

    def client(self, role: str | None = "admin") -> httpx.Client:
        headers = AUTH[role] if role else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=30.0)
        self.clients.append(client)
        return client

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
            self.thread.join(60)
        assert not self.thread.is_alive(), "server thread did not stop"


def start_server(options: ServerOptions, timeout: float = 60.0) -> ServerHandle:
    """Start an :class:`ApiServer` on a background thread; return once it listens."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        box["loop"] = asyncio.get_running_loop()
        box["stop"] = stop = asyncio.Event()
        server = box["server"] = ApiServer(options)
        try:
            box["listening"] = await server.start()
        except BaseException as exc:
            box["error"] = exc
            started.set()
            return
        started.set()
        await stop.wait()
        await server.stop()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True,
                              name="ax-api-test")
    thread.start()
    assert started.wait(timeout), "API server did not start"
    if "error" in box:
        thread.join(10)
        raise box["error"]
    return ServerHandle(options=options, server=box["server"], loop=box["loop"],
                        listening=box["listening"], thread=thread, stop_event=box["stop"])


@dataclass
class Backend:
    """Where a test server keeps state, and how to clean it up."""

    name: str
    config: AxConfig
    prefix: str = ""
    redis_url: str = ""
    redis_prefix: str = ""


def make_backend(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    home = tmp_path / f"home-{uuid.uuid4().hex[:6]}"
    if name == "embedded":
        return Backend(name, AxConfig.from_env(env={}, home=home,
                                               handler_settings=HANDLER_SETTINGS))
    etcd: Server = request.getfixturevalue("etcd_server")
    rds: Server = request.getfixturevalue("redis_server")
    tag = uuid.uuid4().hex[:12]
    prefix, qprefix = f"/axtest/{tag}", f"axtest:{tag}"
    config = AxConfig.from_env(env={}, home=home, store_url=f"{etcd.url}?timeout=5",
                               queue_url=f"{rds.url}/0?prefix={qprefix}", prefix=prefix,
                               handler_settings=HANDLER_SETTINGS)
    return Backend(name, config, prefix=prefix, redis_url=f"{rds.url}/0",
                   redis_prefix=qprefix)


def cleanup(handle: ServerHandle, backend: Backend) -> None:
    """Stop the server (so its worker and reconciler write nothing more), then delete
    the test's keys and check none is left (delete-prefix-then-assert-empty)."""
    handle.stop()
    if backend.name != "etcd":
        return
    from axengine.store.etcd import EtcdStore

    async def wipe() -> list[Any]:
        store = EtcdStore.from_url(backend.config.store_url)
        try:
            await store.txn([], [Delete(backend.prefix + "/", prefix=True)])
            return await store.range(backend.prefix + "/")
        finally:
            await store.close()

    left = asyncio.run(wipe())
    assert left == [], f"keys left under {backend.prefix}: {left}"
    client = redis.Redis.from_url(backend.redis_url)
    try:
        keys = list(client.scan_iter(match=f"{backend.redis_prefix}:*"))
        if keys:
            client.delete(*keys)
        assert list(client.scan_iter(match=f"{backend.redis_prefix}:*")) == []
    finally:
        client.close()


ServerFactory = Callable[..., ServerHandle]


@pytest.fixture
def api_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerFactory]:
    """Factory: ``api_server(backend="embedded"|"etcd", auth=True, worker=True, **opts)``."""
    started: list[tuple[ServerHandle, Backend]] = []

    def factory(backend: str = "embedded", *, auth: bool = True, worker: bool = True,
                same_store_as: ServerHandle | None = None, **opts: Any) -> ServerHandle:
        shared = [b for h, b in started if h is same_store_as]
        where = shared[0] if shared else make_backend(backend, tmp_path, request)
        opts.setdefault("reconcile_interval", 0.2)
        opts.setdefault("engine_config", EngineConfig(lease_seconds=5.0))
        options = ServerOptions(
            config=where.config, http="127.0.0.1:0", grpc="127.0.0.1:0",
            auth=Authenticator.from_tokens(TOKENS) if auth else None,
            run_worker=worker, lease_seconds=5.0, shutdown_grace=5.0, **opts)
        handle = start_server(options)
        started.append((handle, where))
        return handle

    yield factory
    for handle, where in reversed(started):
        if any(h is not handle and b is where for h, b in started[:started.index(
                (handle, where))]):
            handle.stop()  # an earlier server shares the backend and cleans it up
        else:
            cleanup(handle, where)


@pytest.fixture(params=["embedded", "etcd"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend: embedded (SQLite + in-process queue) and real etcd + Redis."""
    return str(request.param)


# ---------------------------------------------------------------------------- helpers


def sse_messages(client: httpx.Client, path: str, **params: Any) -> list[dict[str, Any]]:
    """Read a server-sent event stream to its end: ``[{"event", "id", "data"}]``."""
    messages: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with client.stream("GET", path, params=params) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                if current:
                    messages.append(current)
                    current = {}
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                current["data"] = json.loads(value)
                current.setdefault("event", "message")
            elif name in ("event", "id"):
                current[name] = value
    if current:
        messages.append(current)
    return messages


def wait_final(client: httpx.Client, task_id: str) -> dict[str, Any]:
    """Follow the task's watch stream until it ends; return the task."""
    messages = sse_messages(client, f"/v1/tasks/{task_id}/watch")
    assert messages and messages[-1]["event"] == "end", messages[-3:]
    response = client.get(f"/v1/tasks/{task_id}")
    assert response.status_code == 200
    task: dict[str, Any] = response.json()
    assert task["status"] == messages[-1]["data"]["status"]
    return task


def eventually(condition: Callable[[], bool], timeout: float = 15.0,
               what: str = "condition") -> None:
    """Wait until ``condition()`` holds (polled every 50 ms), or fail after ``timeout``."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"{what} did not hold within {timeout}s"
        time.sleep(0.05)


def wait_status(client: httpx.Client, task_id: str, status: str) -> dict[str, Any]:
    """Follow the watch stream until a ``task_<status>`` event (the task may go on)."""
    kind = f"task_{status.lower()}"
    with client.stream("GET", f"/v1/tasks/{task_id}/watch") as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("kind") == kind:
                break
            if line.startswith("event: end"):
                break
    task: dict[str, Any] = client.get(f"/v1/tasks/{task_id}").json()
    assert task["status"] == status, task
    return task
