"""The processes: ``ax server`` / ``ax api`` as subprocesses (start, serve, SIGTERM),
readiness with the store down, and one reconciler leader across replicas."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from axengine.api import ServerOptions
from axengine.config import AxConfig
from tests.api.conftest import (
    GATE_YAML,
    ROOT,
    SEED_BODY,
    ServerFactory,
    ServerHandle,
    cleanup,
    eventually,
    make_backend,
    start_server,
    wait_final,
)
from tests.servers import Server, start_etcd

pytestmark = pytest.mark.slow


@dataclass
class Process:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str]
    output: list[str]
    reader: threading.Thread

    def close(self) -> None:
        """Kill if still running, then release the pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def wait_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        regex = re.compile(pattern)
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r}: {self.output}") from None
            found = regex.search(line)
            if found:
                return found

    def listening(self) -> tuple[str, str]:
        http = self.wait_line(r"^ax: http listening on (\S+)$").group(1)
        grpc = self.wait_line(r"^ax: grpc listening on (\S+)$").group(1)
        self.wait_line(r"^ax: ready$")
        return http, grpc

    def terminate(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def run_ax(*args: str, env: dict[str, str] | None = None) -> Process:
    proc = subprocess.Popen(
        [sys.executable, "-m", "axengine.cli", *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("AX_")},
             **(env or {})})
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line.rstrip("\n"))
            lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return Process(proc, lines, output, reader)


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.close()


def test_ax_server_serves_the_seed_and_stops_gracefully_on_sigterm(
        tmp_path: Path, processes: list[Process]) -> None:
    process = run_ax("server", "--no-auth", "--home", str(tmp_path / "home"),
                     "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
    processes.append(process)
    url, grpc_address = process.listening()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and not url.endswith(":0")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", grpc_address)
    with httpx.Client(base_url=url, timeout=30) as client:
        reply = client.post("/v1/tasks", json=SEED_BODY)
        assert reply.status_code == 201, reply.text
        task = wait_final(client, reply.json()["task_id"])
        assert task["status"] == "SUCCEEDED"
        assert task["nodes"]["hello"]["input"]["prompt"] == "Say hello to user Alice"
        gated = client.post("/v1/tasks", json={"dag_yaml": GATE_YAML,
                                               "input": {"text": "z"}}).json()["task_id"]
        # An open watch is an in-flight request: SIGTERM ends it and the process exits 0.
        kinds: list[str] = []
        with client.stream("GET", f"/v1/tasks/{gated}/watch") as stream:
            lines = stream.iter_lines()
            for line in lines:
                if line.startswith("data:"):
                    kinds.append(json.loads(line[5:]).get("kind", "end"))
                    if kinds[-1] == "task_paused":
                        process.proc.send_signal(signal.SIGTERM)
                        break
            rest = list(lines)
        assert "task_paused" in kinds and not any("event: end" in x for x in rest)
    assert process.proc.wait(60) == 0, process.output
    assert process.output[-1] == "ax: stopped"
    # State is durable in --home: the paused task is there for the next run.
    again = run_ax("server", "--no-auth", "--home", str(tmp_path / "home"),
                   "--http", "127.0.0.1:0", "--grpc", "off")
    processes.append(again)
    url = again.wait_line(r"^ax: http listening on (\S+)$").group(1)
    again.wait_line(r"^ax: ready$")
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get(f"/v1/tasks/{gated}").json()["status"] == "PAUSED"
    assert again.terminate() == 0


def test_refusals_to_start_without_auth(tmp_path: Path, processes: list[Process]) -> None:
    cases = [
        (("api", "--store", "sqlite:///" + str(tmp_path / "a.db")), "--insecure-no-auth"),
        (("server", "--home", str(tmp_path)), "--no-auth"),
        (("server", "--no-auth", "--home", str(tmp_path), "--http", "0.0.0.0:0"),
         "loopback"),
        (("server", "--no-auth", "--tokens", "x.yaml", "--home", str(tmp_path)), "not both"),
        (("api", "--tokens", str(tmp_path / "missing.yaml")), "cannot read tokens file"),
        (("server", "--no-auth", "--home", str(tmp_path), "--http", "off", "--grpc", "off"),
         "nothing to serve"),
    ]
    for args, message in cases:
        process = run_ax(*args)
        processes.append(process)
        assert process.proc.wait(60) == 2, (args, process.output)
        assert any(message in line for line in process.output), (args, process.output)


def test_ax_api_on_etcd_and_redis_with_the_example_tokens(
        tmp_path: Path, processes: list[Process], request: pytest.FixtureRequest) -> None:
    backend = make_backend("etcd", tmp_path, request)
    config = backend.config
    process = run_ax("api", "--store", config.store_url, "--queue", config.queue_url,
                     "--prefix", config.prefix, "--blobs", str(tmp_path / "blobs"),
                     "--tokens", str(ROOT / "deploy" / "tokens.example.yaml"),
                     "--allow-insecure-tokens-file",  # public example tokens, 0644 in git
                     "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
    processes.append(process)
    try:
        url, _ = process.listening()
        submit = {"Authorization": "Bearer change-me-submit"}
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/readyz").json() == {"ready": True, "store": "ok",
                                                    "queue": "ok"}
            assert client.post("/v1/tasks", json=SEED_BODY).status_code == 401
            reply = client.post("/v1/tasks", json=SEED_BODY, headers=submit)
            assert reply.status_code == 201, reply.text
            task = client.get(f"/v1/tasks/{reply.json()['task_id']}", headers=submit).json()
            # No executor here: the node waits in Redis for one.
            assert task["nodes"]["hello"]["state"] == "WAITING"
            metrics = client.get("/metrics").text
            assert 'ax_queue_depth{lane="default"} 1.0' in metrics
        assert process.terminate() == 0, process.output
    finally:
        process.close()
        # Reuse the suite's wipe of the prefix and the Redis keys.
        handle = start_server(ServerOptions(config=AxConfig.from_env(
            env={}, home=tmp_path / "h2", store_url=config.store_url,
            queue_url=config.queue_url, prefix=config.prefix), http=None, grpc=None,
            reconcile_interval=3600.0))
        cleanup(handle, backend)


def test_readiness_fails_when_the_store_is_down(tmp_path: Path) -> None:
    etcd: Server = start_etcd()
    handle = None
    try:
        config = AxConfig.from_env(env={}, home=tmp_path, store_url=f"{etcd.url}?timeout=1",
                                   prefix=f"/axtest/{uuid.uuid4().hex[:8]}")
        handle = start_server(ServerOptions(config=config, http="127.0.0.1:0", grpc=None,
                                            reconcile_interval=0.2, shutdown_grace=2.0))
        client = handle.client(None)
        assert client.get("/readyz").status_code == 200
        assert client.get("/healthz").status_code == 200
        etcd.stop()
        down = client.get("/readyz")
        assert down.status_code == 503
        body = down.json()
        assert body["ready"] is False and body["queue"] == "ok"
        assert body["store"] != "ok" and "unavailable" in body["store"].lower()
        assert client.get("/healthz").status_code == 200  # alive, just not ready
        failing = handle.client("admin").get("/v1/tasks")
        assert failing.status_code == 503
        assert failing.json()["error"]["type"] == "StoreUnavailable"
        etcd.start()
        eventually(lambda: client.get("/readyz").status_code == 200, timeout=30,
                   what="readiness after etcd came back")
    finally:
        if handle is not None:
            handle.stop()
        etcd.close()


def test_one_reconciler_leader_across_replicas(api_server: ServerFactory) -> None:
    first = api_server("etcd", worker=False)
    second = api_server("etcd", worker=False, same_store_as=first)
    engine = first.engine

    def leader(via: ServerHandle = first) -> str | None:
        reconciler = via.server.process.reconciler
        assert reconciler is not None
        return via.call(reconciler.leader())

    owners = {first.server.owner: first, second.server.owner: second}
    eventually(lambda: leader() in owners, what="a leader")
    current = leader()
    assert current is not None
    # Leadership is stable while the leader lives: the other replica never takes it.
    for _ in range(5):
        assert leader() == current
    # Redis loses everything: the leader's reconciler puts the waiting node back.
    task_id = first.client("submit").post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    backend_prefix = first.options.config.queue_url.rpartition("prefix=")[2]
    client = redis.Redis.from_url(first.options.config.queue_url.partition("?")[0])
    try:
        client.delete(*list(client.scan_iter(match=f"{backend_prefix}:*")))
        assert list(client.scan_iter(match=f"{backend_prefix}:lane:*")) == []
        eventually(lambda: bool(list(client.scan_iter(match=f"{backend_prefix}:lane:*"))),
                   what="the reconciler re-enqueued the lost node")
    finally:
        client.close()
    queued = first.call(engine.queue.queued())
    assert (task_id, "hello") in queued
    # The leader stops (handing leadership back): the other replica takes over.
    other = next(h for o, h in owners.items() if o != current)
    owners[current].stop()
    eventually(lambda: leader(other) == other.server.owner, what="the other replica leading")
