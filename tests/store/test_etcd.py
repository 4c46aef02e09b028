"""EtcdStore beyond the shared contract: outages, failover, limits, URL settings."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from aetcd import rpc

from axengine.errors import StoreError, StoreUnavailable
from axengine.store import Delete, Get, Put, WatchEvent
from axengine.store.etcd import EtcdStore
from axengine.store.settings import EtcdSettings
from tests.servers import Server, free_port

ROOT = Path(__file__).resolve().parents[2]
WAIT = 10.0


def _prefix() -> str:
    return f"/axtest/{uuid.uuid4().hex[:12]}/"


def _store(server: Server, **options: object) -> EtcdStore:
    return EtcdStore(endpoints=[("127.0.0.1", server.port)], **options)  # type: ignore[arg-type]


def test_recovers_after_etcd_restart(etcd_server: Server) -> None:
    """Down: calls and watches fail with StoreUnavailable. Back: the next call works."""
    p = _prefix()

    async def main() -> None:
        store = _store(etcd_server, timeout=3)
        try:
            written = await store.txn([], [Put(p + "kept", b"before")])
            seen: list[WatchEvent] = []
            arrived = asyncio.Event()

            async def consume() -> None:
                async for event in store.watch(p, start_revision=written.revision):
                    seen.append(event)
                    arrived.set()

            watching = asyncio.create_task(consume())
            async with asyncio.timeout(WAIT):
                await arrived.wait()

            etcd_server.stop()
            with pytest.raises(StoreUnavailable):
                await store.txn([], [Put(p + "lost", b"during")])
            with pytest.raises(StoreUnavailable):
                async with asyncio.timeout(WAIT):
                    await watching
            etcd_server.start()

            kept = await store.get(p + "kept")  # the very next call succeeds
            assert kept is not None and kept.value == b"before"
            assert kept.mod_revision == written.revision
            after = await store.txn([], [Put(p + "after", b"back")])
            assert after.succeeded and after.revision > written.revision
            # A new watch resumes from the last revision seen.
            resumed = store.watch(p, start_revision=seen[-1].kv.mod_revision + 1)
            async with asyncio.timeout(WAIT):
                event = await anext(resumed)
            await resumed.aclose()  # type: ignore[attr-defined]
            assert (event.kind, event.kv.key, event.kv.value) == ("put", p + "after", b"back")
            await store.txn([], [Delete(p, prefix=True)])
        finally:
            await store.close()

    try:
        asyncio.run(main())
    finally:
        # Leave the session's etcd running for the tests after this one.
        if etcd_server.proc is None or etcd_server.proc.poll() is not None:
            etcd_server.start()


def test_unreachable_etcd_is_unavailable() -> None:
    async def main() -> None:
        async with EtcdStore(endpoints=[("127.0.0.1", free_port())], timeout=0.3) as store:
            with pytest.raises(StoreUnavailable) as caught:
                await store.get("/k")
            assert caught.value.retryable
            with pytest.raises(StoreUnavailable):
                await store.txn([], [Put("/k", b"v")])
            with pytest.raises(StoreUnavailable):
                await anext(store.watch("/"))

    asyncio.run(main())


def test_fails_over_to_the_next_endpoint(etcd_server: Server) -> None:
    async def main() -> None:
        endpoints = [("127.0.0.1", free_port()), ("127.0.0.1", etcd_server.port)]
        async with EtcdStore(endpoints=endpoints, timeout=0.3) as store:
            with pytest.raises(StoreUnavailable):
                await store.revision()
            assert await store.revision() > 0

    asyncio.run(main())


def test_large_get_many_is_pinned_to_one_revision(etcd_server: Server) -> None:
    """With max_txn_ops=5 a 12-key read takes 3 requests, still all at one revision."""
    p = _prefix()
    keys = [f"{p}k{i:02}" for i in range(12)]

    async def main() -> None:
        async with _store(etcd_server, max_txn_ops=5) as reader, _store(etcd_server) as writer:
            await writer.txn([], [Put(k, b"0") for k in keys])
            done = asyncio.Event()

            async def write() -> None:
                for i in range(1, 41):
                    await writer.txn([], [Put(k, b"%d" % i) for k in keys])
                done.set()

            async def read() -> int:
                reads = 0
                while not done.is_set() or reads == 0:
                    found = await reader.get_many([*keys, p + "missing"])
                    assert sorted(found) == keys
                    assert len({kv.value for kv in found.values()}) == 1, found
                    reads += 1
                return reads

            _, reads = await asyncio.gather(write(), read())
            assert reads > 0
            await writer.txn([], [Delete(p, prefix=True)])

    asyncio.run(main())


def test_too_many_ops_names_the_server_flag(etcd_server: Server) -> None:
    """The test etcd runs with --max-txn-ops 20000; one op more is refused."""

    async def main() -> None:
        async with _store(etcd_server) as store:
            with pytest.raises(StoreError) as caught:
                await store.txn([], [Get(f"/axtest/many/{i}") for i in range(20001)])
            assert "--max-txn-ops" in str(caught.value)
            assert not caught.value.retryable
            wide = await store.txn([], [Get(f"/axtest/many/{i}") for i in range(20000)])
            assert wide.succeeded and len(wide.reads) == 20000

    asyncio.run(main())


def test_closed_store_refuses_calls(etcd_server: Server) -> None:
    async def main() -> None:
        store = _store(etcd_server)
        assert await store.revision() > 0
        await store.close()
        await store.close()
        with pytest.raises(StoreError):
            await store.revision()

    asyncio.run(main())


def test_importing_the_store_package_loads_no_grpc() -> None:
    code = (
        "import sys, axengine.store, axengine.store.settings;"
        "assert 'grpc' not in sys.modules and 'aetcd' not in sys.modules, sys.modules.keys();"
        "from axengine.store import EtcdStore;"
        "assert 'grpc' in sys.modules"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("etcd://10.0.0.1:2379", EtcdSettings(endpoints=(("10.0.0.1", 2379),))),
        ("etcd://etcd-0", EtcdSettings(endpoints=(("etcd-0", 2379),))),
        (
            "etcd://a:1,b:2,[::1]:3/?timeout=2.5&max_txn_ops=20000",
            EtcdSettings(
                endpoints=(("a", 1), ("b", 2), ("::1", 3)), timeout=2.5, max_txn_ops=20000
            ),
        ),
        (
            "etcd://ax:s%40cret@h:2379",
            EtcdSettings(endpoints=(("h", 2379),), username="ax", password="s@cret"),
        ),
        ("etcds://h", EtcdSettings(endpoints=(("h", 2379),), tls=True)),
        ("etcd://h?merge_in_flight=0", EtcdSettings(endpoints=(("h", 2379),),
                                                    merge_in_flight=0)),
        ("etcd://h?tls=true", EtcdSettings(endpoints=(("h", 2379),), tls=True)),
        (
            "etcd://h:2379?ca=/etc/ax/ca.pem&cert=/etc/ax/c.pem&key=/etc/ax/k.pem",
            EtcdSettings(
                endpoints=(("h", 2379),),
                ca_cert="/etc/ax/ca.pem",
                cert="/etc/ax/c.pem",
                key="/etc/ax/k.pem",
            ),
        ),
    ],
)
def test_settings_from_url(url: str, expected: EtcdSettings) -> None:
    settings = EtcdSettings.from_url(url)
    assert settings == expected
    assert settings.use_tls == (expected.tls or expected.ca_cert is not None)
    assert repr(EtcdStore.from_url(url)).startswith("EtcdStore(endpoints=")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///x.db",
        "etcd://",
        "etcd://h:notaport",
        "etcd://h:70000",
        "etcd://h,:2379",
        "etcd://user@h",
        "etcd://h?timeout=soon",
        "etcd://h?timeout=0",
        "etcd://h?max_txn_ops=0",
        "etcd://h?merge_in_flight=-1",
        "etcd://h?merge_in_flight=some",
        "etcd://h?cert=/c.pem",
        "etcd://h?colour=blue",
    ],
)
def test_settings_from_bad_url(url: str) -> None:
    with pytest.raises(ValueError):
        EtcdSettings.from_url(url)


# -- TLS, mutual TLS and password auth, on a second etcd of this module ----------------

ROOT_PASSWORD = "s3cret"


@dataclass(frozen=True)
class SecureEtcd:
    """An etcd serving TLS only, requiring client certificates, with auth enabled."""

    server: Server
    certs: Path

    def url(self, *, user: str = f"root:{ROOT_PASSWORD}@", client_cert: bool = True) -> str:
        query = f"ca={self.certs / 'ca.pem'}&timeout=3"
        if client_cert:
            query += f"&cert={self.certs / 'client.pem'}&key={self.certs / 'client.key'}"
        return f"etcds://{user}127.0.0.1:{self.server.port}?{query}"


def _openssl(certs: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True)


def _make_certs(certs: Path) -> None:
    _openssl(certs, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ax-test-ca")
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (certs / f"{name}.ext").write_text(extension + "\n")
        subject = "/CN=127.0.0.1" if name == "server" else "/CN=root"
        _openssl(certs, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", subject)
        _openssl(certs, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey",
                 "ca.key", "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                 "-extfile", f"{name}.ext")


async def _enable_auth(port: int, certs: Path) -> None:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.pem").read_bytes(),
        private_key=(certs / "client.key").read_bytes(),
        certificate_chain=(certs / "client.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        auth = rpc.AuthStub(channel)
        options = {"timeout": WAIT, "wait_for_ready": True}
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=ROOT_PASSWORD), **options)
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), **options)
        await auth.AuthEnable(rpc.AuthEnableRequest(), **options)


@pytest.fixture(scope="module")
def secure_etcd() -> Iterator[SecureEtcd]:
    data = Path(tempfile.mkdtemp(prefix="ax-etcd-tls-"))
    certs = data / "certs"
    certs.mkdir()
    _make_certs(certs)
    port, peer = free_port(), free_port()
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    argv = [
        etcd, "--name", "ax-tls", "--data-dir", str(data / "data"),
        "--listen-client-urls", f"https://127.0.0.1:{port}",
        "--advertise-client-urls", f"https://127.0.0.1:{port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"ax-tls=http://127.0.0.1:{peer}",
        "--cert-file", str(certs / "server.pem"), "--key-file", str(certs / "server.key"),
        "--client-cert-auth", "--trusted-ca-file", str(certs / "ca.pem"),
        "--log-level", "error",
    ]
    # Named apart from "etcd" so Server.start waits for the port only (its health probe
    # speaks plain HTTP); the requests below wait for readiness themselves.
    server = Server("etcd-tls", port, data, argv, log=data / "etcd.log")
    server.start()
    try:
        asyncio.run(_enable_auth(port, certs))
        yield SecureEtcd(server, certs)
    finally:
        server.close()


def test_tls_client_certificate_and_password(secure_etcd: SecureEtcd) -> None:
    async def main() -> None:
        async with EtcdStore.from_url(secure_etcd.url()) as store:
            assert store.settings.use_tls
            written = await store.txn([], [Put("/secure/k", b"v")])
            kv = await store.get("/secure/k")
            assert kv is not None and kv.mod_revision == written.revision

    asyncio.run(main())


def test_wrong_password_is_refused_and_not_retryable(secure_etcd: SecureEtcd) -> None:
    async def main() -> None:
        async with EtcdStore.from_url(secure_etcd.url(user="root:wrong@")) as store:
            with pytest.raises(StoreError) as caught:
                await store.get("/secure/k")
            assert not isinstance(caught.value, StoreUnavailable)
            assert not caught.value.retryable
            assert "credentials" in str(caught.value)

    asyncio.run(main())


def test_missing_client_certificate_cannot_connect(secure_etcd: SecureEtcd) -> None:
    async def main() -> None:
        url = secure_etcd.url(client_cert=False).replace("timeout=3", "timeout=0.5")
        async with EtcdStore.from_url(url) as store:
            with pytest.raises(StoreUnavailable):
                await store.get("/secure/k")

    asyncio.run(main())


def test_unreadable_tls_file_is_a_configuration_error(tmp_path: Path) -> None:
    async def main() -> None:
        async with EtcdStore.from_url(f"etcd://127.0.0.1:1?ca={tmp_path / 'nope.pem'}") as store:
            with pytest.raises(StoreError) as caught:
                await store.get("/k")
            assert not caught.value.retryable

    asyncio.run(main())


def test_auth_token_is_renewed_after_a_restart(secure_etcd: SecureEtcd) -> None:
    """etcd forgets its simple auth tokens on restart; the store logs in again."""

    async def main() -> None:
        async with EtcdStore.from_url(secure_etcd.url()) as store:
            written = await store.txn([], [Put("/secure/restart", b"kept")])
            secure_etcd.server.restart()
            kv = await store.get("/secure/restart")
            assert kv is not None and kv.mod_revision == written.revision

    asyncio.run(main())


def test_watches_cancelled_while_being_created_leave_later_watches_working(
        etcd_server: Server) -> None:
    """aetcd creates one watch at a time and matches etcd's "created" answers to the
    pending request: a watch abandoned half-way through its creation (its consumer
    cancelled, as an event stream that no longer needs it) must not hand its answer to
    the next watch, whose events would then never arrive."""
    async def main() -> None:
        store = _store(etcd_server)
        prefix = _prefix()
        try:
            async def first(watch_prefix: str) -> None:
                async for _ in store.watch(watch_prefix):
                    return

            for round_ in range(20):
                starting = [asyncio.create_task(first(f"{prefix}/gone{round_}-{i}/"))
                            for i in range(5)]
                await asyncio.sleep(0)  # each is now inside its watch's creation
                for task in starting:
                    task.cancel()
                await asyncio.gather(*starting, return_exceptions=True)
            watched = f"{prefix}/kept/"
            revision = await store.revision()
            seen = asyncio.ensure_future(anext(aiter(store.watch(watched,
                                                                 start_revision=revision + 1))))
            await store.txn([], [Put(watched + "k", b"v")])
            event = await asyncio.wait_for(seen, WAIT)  # a hang fails; no time is measured
            assert (event.kind, event.kv.key, event.kv.value) == ("put", watched + "k", b"v")
        finally:
            await store.close()

    asyncio.run(main())
