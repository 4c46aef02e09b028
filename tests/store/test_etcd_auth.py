"""EtcdStore against an etcd with auth on and TLS: a root user, and a user ``ax`` whose role
may read and write one key prefix only (how docker-compose.dev.yml provisions etcd).

Right credentials: the store contract works (put, txn with compares, range, get_many,
watch, revision). Wrong, missing or insufficient credentials: a non-retryable
``StoreError`` that names the problem and never the password.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from axengine.errors import StoreError, StoreUnavailable
from axengine.store import Delete, Get, Mod, Put, WatchEvent
from axengine.store.etcd import EtcdStore
from axengine.store.settings import EtcdSettings, redact_url
from tests.servers import Certs, Server, enable_etcd_auth, make_certs, start_etcd

pytestmark = pytest.mark.integration

ROOT_PASSWORD = "root-Pw-7f3a"
AX_PASSWORD = "ax-Pw-9c1e"
PREFIX = "/axauth/"
#: Seconds etcd keeps an idle auth token (short, to test logging in again).
TOKEN_TTL = 2
WAIT = 10.0


@dataclass(frozen=True)
class AuthEtcd:
    server: Server
    certs: Certs
    password_file: Path

    def url(self, user: str = "ax@", query: str = "") -> str:
        base = f"etcds://{user}127.0.0.1:{self.server.port}?ca={self.certs.ca}&timeout=3"
        if user == "ax@":
            base += f"&password_file={self.password_file}"
        return base + query


@pytest.fixture(scope="module")
def auth_etcd() -> Iterator[AuthEtcd]:
    secrets = Path(tempfile.mkdtemp(prefix="ax-etcd-auth-"))
    try:
        certs = make_certs(secrets / "certs")
        password_file = secrets / "etcd-password"
        password_file.write_text(AX_PASSWORD + "\n")  # as `echo pw > file` writes it
        server = start_etcd(tls=certs, extra_args=["--auth-token-ttl", str(TOKEN_TTL)])
        try:
            enable_etcd_auth(server, root_password=ROOT_PASSWORD,
                             users={"ax": (AX_PASSWORD, PREFIX)}, tls=certs)
            yield AuthEtcd(server, certs, password_file)
        finally:
            server.close()
    finally:
        shutil.rmtree(secrets, ignore_errors=True)


def _prefix() -> str:
    return f"{PREFIX}{uuid.uuid4().hex[:12]}/"


def test_user_with_a_prefix_role_gets_the_store_contract(auth_etcd: AuthEtcd) -> None:
    p = _prefix()

    async def main() -> None:
        async with EtcdStore.from_url(auth_etcd.url()) as store:
            assert store.settings.use_tls and store.settings.password is None
            first = await store.txn([Mod(p + "a") == 0], [Put(p + "a", b"1")])
            assert first.succeeded
            refused = await store.txn([Mod(p + "a") == 0], [Put(p + "a", b"2")],
                                      [Get(p + "a")])
            assert not refused.succeeded and refused.reads[0][0].value == b"1"
            await store.txn([], [Put(p + "b", b"2")])
            assert [kv.key for kv in await store.range(p)] == [p + "a", p + "b"]
            assert set(await store.get_many([p + "a", p + "b", p + "c"])) == {p + "a", p + "b"}
            # The revision needs no permission beyond the prefix (the API's /readyz).
            assert await store.revision() >= first.revision

            events: list[WatchEvent] = []

            async def consume() -> None:
                async for event in store.watch(p, start_revision=first.revision):
                    events.append(event)
                    if len(events) == 3:
                        return

            watching = asyncio.create_task(consume())
            await store.txn([], [Delete(p, prefix=True)])
            async with asyncio.timeout(WAIT):
                await watching
            assert [(e.kind, e.kv.key) for e in events] == [
                ("put", p + "a"), ("put", p + "b"), ("delete", p + "a")]

    asyncio.run(main())


def test_idle_token_expiry_logs_in_again_for_calls_and_watches(auth_etcd: AuthEtcd) -> None:
    p = _prefix()

    async def main() -> None:
        async with EtcdStore.from_url(auth_etcd.url()) as store:
            written = await store.txn([], [Put(p + "k", b"v")])
            await asyncio.sleep(TOKEN_TTL + 1.5)  # the token expires while idle
            kv = await store.get(p + "k")
            assert kv is not None and kv.mod_revision == written.revision
            await asyncio.sleep(TOKEN_TTL + 1.5)
            async with asyncio.timeout(WAIT):
                async for event in store.watch(p, start_revision=written.revision):
                    assert event.kv.key == p + "k"
                    break
            await store.txn([], [Delete(p, prefix=True)])

    asyncio.run(main())


def _refused(url: str, key: str = PREFIX + "x") -> StoreError:
    async def main() -> StoreError:
        async with EtcdStore.from_url(url) as store:
            with pytest.raises(StoreError) as caught:
                await store.get(key)
            return caught.value

    error = asyncio.run(main())
    assert not isinstance(error, StoreUnavailable)
    assert not error.retryable, "retrying with the same credentials cannot help"
    return error


def test_wrong_password_says_authentication_failed(
        auth_etcd: AuthEtcd, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    error = _refused(auth_etcd.url(user="ax:wrong-Pw-5b2d@"))
    assert "authentication failed for user 'ax'" in str(error)
    assert "wrong-Pw-5b2d" not in str(error) and "wrong-Pw-5b2d" not in repr(error)
    assert "wrong-Pw-5b2d" not in caplog.text


def test_wrong_password_file_says_authentication_failed(
        auth_etcd: AuthEtcd, tmp_path: Path) -> None:
    wrong = tmp_path / "pw"
    wrong.write_text("not-the-Pw-0e4f")
    url = auth_etcd.url().replace(str(auth_etcd.password_file), str(wrong))
    error = _refused(url)
    assert "authentication failed" in str(error) and "not-the-Pw-0e4f" not in str(error)


def test_missing_credentials_say_authentication_required(auth_etcd: AuthEtcd) -> None:
    error = _refused(auth_etcd.url(user=""))
    assert "authentication required" in str(error)
    assert "password_file" in str(error), "the message says how to fix it"


def test_keys_outside_the_granted_prefix_are_refused(auth_etcd: AuthEtcd) -> None:
    error = _refused(auth_etcd.url(), key="/elsewhere/x")
    assert "user 'ax' lacks permission" in str(error)


def test_unreadable_password_file_is_a_configuration_error(
        auth_etcd: AuthEtcd, tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    error = _refused(auth_etcd.url().replace(str(auth_etcd.password_file), str(missing)))
    assert str(missing) in str(error) and "cannot read" in str(error)


def test_root_with_the_password_in_the_url_works(auth_etcd: AuthEtcd) -> None:
    async def main() -> None:
        async with EtcdStore.from_url(auth_etcd.url(user=f"root:{ROOT_PASSWORD}@")) as store:
            await store.txn([], [Put("/elsewhere/root", b"ok")])
            assert await store.get("/elsewhere/root") is not None

    asyncio.run(main())


def test_settings_and_store_texts_carry_no_password() -> None:
    url = "etcds://ax:pa%2Fss-3d9@h1:2379,h2?ca=/ca.pem&timeout=2"
    settings = EtcdSettings.from_url(url)
    assert settings.password == "pa/ss-3d9"
    for text in (repr(settings), str(settings), repr(EtcdStore.from_settings(settings)),
                 redact_url(url)):
        assert "pa%2Fss-3d9" not in text and "pa/ss-3d9" not in text, text
    assert "password=***" in repr(settings)
    assert redact_url(url) == "etcds://ax:***@h1:2379,h2?ca=/ca.pem&timeout=2"
    with pytest.raises(ValueError) as caught:
        EtcdSettings.from_url("etcd://ax:hunter2@h?colour=blue")
    assert "hunter2" not in str(caught.value) and "ax:***@h" in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "etcd://ax@h",  # a user without a password
        "etcd://h?password_file=/run/secrets/pw",  # a password file without a user
        "etcd://ax:pw@h?password_file=/run/secrets/pw",  # both
    ],
)
def test_incomplete_credentials_are_rejected(url: str) -> None:
    with pytest.raises(ValueError, match="password"):
        EtcdSettings.from_url(url)


def test_password_file_url_names_the_user_only() -> None:
    settings = EtcdSettings.from_url("etcd://ax@etcd:2379?password_file=/run/secrets/pw")
    assert (settings.username, settings.password, settings.password_file) == (
        "ax", None, "/run/secrets/pw")


def test_watch_outside_the_granted_prefix_is_refused_not_hung(auth_etcd: AuthEtcd) -> None:
    async def main() -> None:
        async with EtcdStore.from_url(auth_etcd.url()) as store:
            async with asyncio.timeout(WAIT):
                with pytest.raises(StoreError) as caught:
                    async for _ in store.watch("/elsewhere/"):
                        pass
            assert "refused the watch" in str(caught.value)
            assert "lacks permission" in str(caught.value)
            assert not caught.value.retryable

    asyncio.run(main())
