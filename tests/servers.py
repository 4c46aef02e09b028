"""Start real etcd and Redis servers from their binaries for tests.

Each server listens on a private loopback port chosen free at start, keeps its data in a
temporary directory, and is stopped by PID. Never the shared default ports.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Server", "free_port", "start_etcd", "start_redis"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A server process started by the tests."""

    name: str
    port: int
    data_dir: Path
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)

    @property
    def url(self) -> str:
        scheme = "etcd" if self.name == "etcd" else "redis"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir,
                start_new_session=True,
            )
        _wait_port(self.port, self.proc, timeout, self.log)
        if self.name == "etcd":
            _wait_etcd_ready(self.port, self.proc, timeout, self.log)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server by PID (SIGKILL after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port} in {timeout}s: {log.read_text()[-2000:]}")


def _wait_etcd_ready(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"etcd exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if b'"health":"true"' in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"etcd not healthy in {timeout}s: {log.read_text()[-2000:]}")


def _binary(name: str) -> str:
    fallback = f"/usr/bin/{name}"
    path = shutil.which(name) or (fallback if os.path.exists(fallback) else None)
    if path is None:
        raise RuntimeError(
            f"{name} not found; run scripts/test (it installs etcd-server and redis-server)"
        )
    return path


def start_etcd() -> Server:
    """Start a single-member etcd on private ports with a temporary data dir."""
    data = Path(tempfile.mkdtemp(prefix="ax-etcd-"))
    port, peer = free_port(), free_port()
    argv = [
        _binary("etcd"),
        "--name", "ax-test",
        "--data-dir", str(data / "data"),
        "--listen-client-urls", f"http://127.0.0.1:{port}",
        "--advertise-client-urls", f"http://127.0.0.1:{port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"ax-test=http://127.0.0.1:{peer}",
        "--log-level", "error",
        "--quota-backend-bytes", str(2 * 1024**3),
        # ax writes one transaction per transition; a wide fan-out readies many nodes at once.
        "--max-txn-ops", "20000",
        "--max-request-bytes", str(32 * 1024**2),
    ]
    server = Server("etcd", port, data, argv, log=data / "etcd.log")
    server.start()
    return server


def start_redis() -> Server:
    """Start redis-server on a private port, no persistence, temporary dir."""
    data = Path(tempfile.mkdtemp(prefix="ax-redis-"))
    port = free_port()
    argv = [
        _binary("redis-server"),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(data),
    ]
    server = Server("redis", port, data, argv, log=data / "redis.log")
    server.start()
    return server
