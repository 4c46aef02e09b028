"""Fixtures of the security regression tests: attacks through the real API.

Every test here plays an untrusted caller against ``ax api`` + 2 ``ax executor`` on
real etcd and Redis (:class:`tests.topology.Topology`), and checks two things: the
refusal, and that nothing was touched — the store's revision and key set
(:func:`store_state`), a loopback listener that must see no connection
(:class:`Canary`), a canary file that must not be read.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.topology import Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass(frozen=True)
class StoreState:
    """The store's revision and every key in it."""

    revision: int
    keys: frozenset[str]


def store_state(topology: Topology) -> StoreState:
    """Read the revision and the key set straight from etcd (not through the API)."""
    from axengine.store.etcd import EtcdStore

    async def read() -> StoreState:
        store = EtcdStore.from_url(topology.store_url)
        try:
            revision = await store.revision()
            kvs = await store.range("")
            return StoreState(revision, frozenset(kv.key for kv in kvs))
        finally:
            await store.close()

    return asyncio.run(read())


def changed_keys(topology: Topology, since: int) -> set[str]:
    """Keys written or created after revision ``since``, apart from the reconciler's
    leadership record (renewed every pass, whatever the requests do)."""
    from axengine.store.etcd import EtcdStore

    async def read() -> set[str]:
        store = EtcdStore.from_url(topology.store_url)
        try:
            return {kv.key for kv in await store.range("")
                    if kv.mod_revision > since and "/leader/" not in kv.key}
        finally:
            await store.close()

    return asyncio.run(read())


@dataclass
class Canary:
    """A TCP listener on loopback that records every connection made to it.

    A tool that must not reach the host's services is pointed at it; the test then
    asserts :attr:`connections` stayed 0.
    """

    sock: socket.socket
    connections: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n"
                                 b"Content-Type: text/plain\r\n\r\ncanary")
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def canary() -> Iterator[Canary]:
    """A fresh loopback listener per test."""
    sock = socket.create_server(("127.0.0.1", 0))
    listener = Canary(sock)
    thread = threading.Thread(target=listener.serve, daemon=True)
    thread.start()
    try:
        yield listener
    finally:
        listener.close()
        thread.join(timeout=5)


@pytest.fixture
def canary_file(tmp_path: Path) -> Path:
    """A secret file outside any input root; its atime is not reliable, so tests check
    that its content never comes back (in outputs, errors or logs)."""
    path = tmp_path / "canary-secret.txt"
    path.write_text("AX-CANARY-SECRET-7f3a9c\n")
    return path


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """etcd + Redis + ``ax api`` + 2 ``ax executor``, shared by a test module."""
    with Topology(executors=2, lease=5.0) as topo:
        yield topo


def http(topology: Topology, who: str) -> httpx.Client:
    """An HTTP client of the API with the token of ``who`` (see ``TOKEN_ROLES``)."""
    return httpx.Client(base_url=topology.api_url, timeout=30,
                        headers={"Authorization": f"Bearer {topology.token(who)}"})


def all_logs(topology: Topology) -> str:
    """Everything the API and the executors printed so far."""
    parts: list[Any] = [topology.api.all_output() if topology.api else ""]
    parts += [e.all_output() for e in topology.executors]
    return "\n".join(parts)
