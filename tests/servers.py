"""Start real etcd and Redis servers from their binaries for tests.

Each server listens on a private loopback port chosen free at start, keeps its data in a
temporary directory, and is stopped by PID. Never the shared default ports.

Secured variants for the credential tests: :func:`make_certs` writes a throwaway CA and
server/client certificates (``openssl`` CLI), ``start_etcd(tls=...)`` serves TLS,
:func:`enable_etcd_auth` adds users and roles and turns etcd auth on, and
``start_redis(password=..., acl_users=..., tls=...)`` starts Redis with ``requirepass``,
ACL users and TLS from a config file (so no password shows in the process list).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ETCD_MAX_TXN_OPS",
    "Certs",
    "Server",
    "ax_server_process",
    "enable_etcd_auth",
    "free_port",
    "make_certs",
    "start_etcd",
    "start_redis",
]


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


@dataclass(frozen=True)
class Certs:
    """A throwaway CA and the certificates it signed, all PEM files in ``directory``."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"


def make_certs(directory: Path, *, client_cn: str = "ax") -> Certs:
    """Write a CA, a server certificate for 127.0.0.1/localhost and a client certificate
    (common name ``client_cn``) into ``directory`` with the ``openssl`` CLI."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run([_binary("openssl"), *args], cwd=directory, check=True,
                       capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ax-test-ca")
    for name, subject, extension in (
        ("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", f"/CN={client_cn}", "extendedKeyUsage=clientAuth"),
    ):
        (directory / f"{name}.ext").write_text(extension + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", subject)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                "-extfile", f"{name}.ext")
    return Certs(directory)


def enable_etcd_auth(
    server: Server,
    *,
    root_password: str,
    users: Mapping[str, tuple[str, str]] = {},
    tls: Certs | None = None,
    timeout: float = 20.0,
) -> None:
    """Add ``root`` and ``users`` to etcd and turn authentication on.

    Each entry of ``users`` is ``name: (password, key_prefix)``: the user gets a role of
    its own name granted ``readwrite`` on ``key_prefix`` only (what ``etcdctl role
    grant-permission ROLE --prefix=true readwrite PREFIX`` does).
    """
    import asyncio

    import grpc
    from aetcd import rpc, utils

    async def main() -> None:
        target = f"127.0.0.1:{server.port}"
        if tls is None:
            channel = grpc.aio.insecure_channel(target)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca.read_bytes(),
                private_key=tls.client_key.read_bytes(),
                certificate_chain=tls.client_cert.read_bytes(),
            )
            channel = grpc.aio.secure_channel(target, credentials)
        async with channel:
            auth = rpc.AuthStub(channel)
            options = {"timeout": timeout, "wait_for_ready": True}
            await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=root_password),
                               **options)
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"),
                                     **options)
            for name, (password, prefix) in sorted(users.items()):
                key = prefix.encode()
                await auth.RoleAdd(rpc.AuthRoleAddRequest(name=name), **options)
                permission = rpc.Permission(permType=rpc.Permission.READWRITE, key=key,
                                            range_end=utils.prefix_range_end(key))
                await auth.RoleGrantPermission(
                    rpc.AuthRoleGrantPermissionRequest(name=name, perm=permission), **options)
                await auth.UserAdd(rpc.AuthUserAddRequest(name=name, password=password),
                                   **options)
                await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=name, role=name),
                                         **options)
            await auth.AuthEnable(rpc.AuthEnableRequest(), **options)

    asyncio.run(main())


#: ``--max-txn-ops`` of the test etcd; clients that submit large DAGs declare it in the
#: store URL (``?max_txn_ops=``), or the engine refuses DAGs above etcd's default (128).
ETCD_MAX_TXN_OPS = 20000


def start_etcd(
    *,
    tls: Certs | None = None,
    client_cert_auth: bool = False,
    extra_args: Sequence[str] = (),
) -> Server:
    """Start a single-member etcd on private ports with a temporary data dir.

    Args:
        tls: Serve clients over TLS only, with this CA's server certificate. The server
            is then named ``etcd-tls`` and its readiness is left to the first request
            (the health probe speaks plain HTTP).
        client_cert_auth: With ``tls``, require client certificates signed by the CA.
        extra_args: More etcd flags (``--auth-token-ttl``...).
    """
    data = Path(tempfile.mkdtemp(prefix="ax-etcd-"))
    port, peer = free_port(), free_port()
    scheme = "http" if tls is None else "https"
    argv = [
        _binary("etcd"),
        "--name", "ax-test",
        "--data-dir", str(data / "data"),
        "--listen-client-urls", f"{scheme}://127.0.0.1:{port}",
        "--advertise-client-urls", f"{scheme}://127.0.0.1:{port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"ax-test=http://127.0.0.1:{peer}",
        "--log-level", "error",
        "--quota-backend-bytes", str(2 * 1024**3),
        # ax writes one transaction per transition; a wide fan-out readies many nodes at once.
        "--max-txn-ops", str(ETCD_MAX_TXN_OPS),
        "--max-request-bytes", str(32 * 1024**2),
    ]
    if tls is not None:
        argv += ["--cert-file", str(tls.server_cert), "--key-file", str(tls.server_key)]
        if client_cert_auth:  # etcd asks every client for a certificate once it has a CA
            argv += ["--client-cert-auth", "--trusted-ca-file", str(tls.ca)]
    argv += list(extra_args)
    name = "etcd" if tls is None else "etcd-tls"
    server = Server(name, port, data, argv, log=data / "etcd.log")
    server.start()
    return server


def start_redis(
    *,
    password: str | None = None,
    acl_users: Sequence[str] = (),
    tls: Certs | None = None,
    tls_auth_clients: bool = False,
) -> Server:
    """Start redis-server on a private port, no persistence, temporary dir.

    Args:
        password: ``requirepass`` of the default user.
        acl_users: ACL rules, one user each (``"ax on >secret ~ax:* +@all"``).
        tls: Serve TLS only (``tls-port``; the plain port is off) with this CA's server
            certificate.
        tls_auth_clients: With ``tls``, require client certificates.

    Secrets go to a ``redis.conf`` in the data directory, never on the command line.
    """
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
    lines = []
    if password is not None:
        lines.append(f"requirepass {password}")
    lines += [f"user {rule}" for rule in acl_users]
    if tls is not None:
        lines += [
            "port 0",
            f"tls-port {port}",
            f"tls-cert-file {tls.server_cert}",
            f"tls-key-file {tls.server_key}",
            f"tls-ca-cert-file {tls.ca}",
            f"tls-auth-clients {'yes' if tls_auth_clients else 'no'}",
        ]
    if lines:
        config = data / "redis.conf"
        config.write_text("\n".join(lines) + "\n")
        config.chmod(0o600)
        argv.insert(1, str(config))
        if tls is not None:  # the config file's "port 0" must win over --port
            i = argv.index("--port")
            del argv[i:i + 2]
    server = Server("redis", port, data, argv, log=data / "redis.log")
    server.start()
    return server


@contextlib.contextmanager
def ax_server_process(tokens: Path, home: Path,
                      env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run ``ax server --tokens TOKENS --home HOME`` on a free loopback port (no gRPC),
    without the caller's ``AX_*`` variables (plus ``env``); yield its URL once it is
    ready, and stop it with SIGTERM (SIGKILL after 60 s) on exit."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "axengine.cli", "server", "--tokens", str(tokens),
         "--home", str(home), "--http", "127.0.0.1:0", "--grpc", "off"],
        cwd=root, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("AX_")},
             **(env or {})})
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            lines.put(line.strip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    url = ""
    try:
        while True:
            try:
                line = lines.get(timeout=60)
            except queue.Empty:
                raise RuntimeError("ax server did not start:\n" + "".join(output)) from None
            found = re.match(r"^ax: http listening on (\S+)$", line)
            if found:
                url = found.group(1)
            if line == "ax: ready":
                break
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
