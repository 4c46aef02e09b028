"""RedisQueue against Redis with credentials: ``requirepass``, an ACL user limited to the
queue's keys, and TLS with a throwaway CA.

Right credentials: enqueue, pop and ack work. Wrong or missing ones: a non-retryable
``QueueError`` that names the problem and never the password.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.connection import parse_url

from axengine.errors import QueueError
from axengine.queue import RedisSettings, WorkItem
from axengine.queue.redis import RedisQueue
from axengine.queue.settings import redact_url
from tests.servers import Certs, Server, make_certs, start_redis

pytestmark = pytest.mark.integration

DEFAULT_PASSWORD = "default-Pw-41d7"
AX_PASSWORD = "ax-Pw-8e2b"
#: Key prefix the ACL user ``ax`` may touch; every test queue uses a prefix under it.
ACL_PREFIX = "axq"


@dataclass(frozen=True)
class AuthRedis:
    server: Server
    certs: Certs
    password_file: Path

    def url(self, userinfo: str, *, query: str = "") -> str:
        prefix = f"{ACL_PREFIX}{uuid.uuid4().hex[:8]}"
        return (f"rediss://{userinfo}127.0.0.1:{self.server.port}/0?prefix={prefix}"
                f"&ssl_ca_certs={self.certs.ca}{query}")


@pytest.fixture(scope="module")
def auth_redis() -> Iterator[AuthRedis]:
    secrets = Path(tempfile.mkdtemp(prefix="ax-redis-auth-"))
    try:
        certs = make_certs(secrets / "certs")
        password_file = secrets / "redis-password"
        password_file.write_text(AX_PASSWORD + "\n")
        server = start_redis(
            password=DEFAULT_PASSWORD,
            acl_users=[f"ax on >{AX_PASSWORD} ~{ACL_PREFIX}* resetchannels +@all -@admin"],
            tls=certs,
        )
        try:
            yield AuthRedis(server, certs, password_file)
        finally:
            server.close()
    finally:
        shutil.rmtree(secrets, ignore_errors=True)


@pytest.fixture(scope="module")
def plain_auth_redis() -> Iterator[Server]:
    """``requirepass`` without TLS (as in docker-compose.dev.yml).

    The refused-login tests use it: redis-py 8.1 leaves the TLS socket of a refused
    login unclosed (a ResourceWarning), which is redis-py's to fix, not ours to hide.
    """
    server = start_redis(password=DEFAULT_PASSWORD,
                         acl_users=[f"ax on >{AX_PASSWORD} ~{ACL_PREFIX}* +@all -@admin"])
    try:
        yield server
    finally:
        server.close()


def _plain(server: Server, userinfo: str) -> str:
    return f"redis://{userinfo}127.0.0.1:{server.port}/0?prefix={ACL_PREFIX}{uuid.uuid4().hex[:8]}"


async def _round_trip(url: str) -> None:
    item = WorkItem(task_id="t-auth", node_id="n1")
    async with RedisQueue.from_url(url) as queue:
        await queue.enqueue([item])
        popped = await queue.pop("w1", timeout=2)
        assert popped == item
        await queue.ack("w1", item)
        assert await queue.queued() == set()


@pytest.mark.parametrize("how", ["requirepass", "acl-user", "acl-user-password-file"])
def test_right_credentials_enqueue_pop_ack(auth_redis: AuthRedis, how: str) -> None:
    url = {
        "requirepass": auth_redis.url(f":{DEFAULT_PASSWORD}@"),
        "acl-user": auth_redis.url(f"ax:{AX_PASSWORD}@"),
        "acl-user-password-file": auth_redis.url(
            "ax@", query=f"&password_file={auth_redis.password_file}"),
    }[how]
    asyncio.run(_round_trip(url))


def _refused(url: str) -> QueueError:
    async def main() -> QueueError:
        async with RedisQueue.from_url(url) as queue:
            with pytest.raises(QueueError) as caught:
                await queue.enqueue([WorkItem(task_id="t", node_id="n")])
            return caught.value

    error = asyncio.run(main())
    assert not error.retryable, "retrying with the same credentials cannot help"
    return error


def test_plain_requirepass_round_trip(plain_auth_redis: Server) -> None:
    asyncio.run(_round_trip(_plain(plain_auth_redis, f":{DEFAULT_PASSWORD}@")))


def test_wrong_password_says_authentication_failed(
        plain_auth_redis: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for userinfo in (":wrong-Pw-2c6a@", "ax:wrong-Pw-2c6a@"):
        error = _refused(_plain(plain_auth_redis, userinfo))
        assert "authentication failed" in str(error)
        assert "wrong-Pw-2c6a" not in str(error) and "wrong-Pw-2c6a" not in repr(error)
    assert "wrong-Pw-2c6a" not in caplog.text


def test_missing_password_says_authentication_required(plain_auth_redis: Server) -> None:
    error = _refused(_plain(plain_auth_redis, ""))
    assert "authentication required" in str(error)
    assert "password_file" in str(error), "the message says how to fix it"


def test_acl_user_outside_its_keys_lacks_permission(auth_redis: AuthRedis) -> None:
    url = auth_redis.url(f"ax:{AX_PASSWORD}@").replace(f"prefix={ACL_PREFIX}", "prefix=other")
    error = _refused(url)
    assert "lacks permission" in str(error)


def test_unreadable_password_file_names_the_file(auth_redis: AuthRedis, tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    error = _refused(auth_redis.url("ax@", query=f"&password_file={missing}"))
    assert f"cannot read the Redis password_file {missing}" in str(error)


def test_plain_connection_to_a_tls_port_fails(auth_redis: AuthRedis) -> None:
    url = auth_redis.url(f":{DEFAULT_PASSWORD}@").replace("rediss://", "redis://")
    url = url.split("&ssl_ca_certs")[0] + "&connect_timeout=0.5&socket_timeout=0.5&retries=0"
    with warnings.catch_warnings():
        # The server resets the connection in the handshake, and redis-py 8.2 sometimes
        # drops that connection's socket without closing it (CI, twice in three runs on
        # 2026-12-04: "unclosed transport" collected inside this test and, once, in a
        # later one; not reproduced in 1,000 runs alone). It is redis-py's to fix; it
        # is collected here, where it is known, rather than failing some later test.
        warnings.filterwarnings("ignore", "unclosed", ResourceWarning)
        with pytest.raises(QueueError):
            asyncio.run(_round_trip(url))
        gc.collect()


def test_settings_keep_what_redis_py_from_url_reads() -> None:
    url = ("rediss://user:p%40ss-6f1@cache.example:6380/3?ssl_ca_certs=/ca.pem"
           "&ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_cert_reqs=optional"
           "&ssl_check_hostname=false")
    ours, theirs = RedisSettings.from_url(url), parse_url(url)  # type: ignore[no-untyped-call]
    for name in ("host", "port", "db", "username", "password", "ssl_ca_certs",
                 "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"):
        assert getattr(ours, name) == theirs[name], name
    assert ours.ssl
    assert RedisSettings.from_url("redis://:only-Pw@h").password == "only-Pw"


def test_settings_texts_carry_no_password() -> None:
    url = "redis://ax:s3cr%3Ft-77a@h:6379/0?prefix=ax"
    settings = RedisSettings.from_url(url)
    assert settings.password == "s3cr?t-77a"
    for text in (repr(settings), str(settings), redact_url(url)):
        assert "s3cr" not in text, text
    assert "password=***" in repr(settings)
    assert redact_url(url) == "redis://ax:***@h:6379/0?prefix=ax"
    with pytest.raises(ValueError) as caught:
        RedisSettings.from_url("redis://:hunter2@h/zero")
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h/0?ssl_ca_certs=/ca.pem", "need TLS: use a rediss:// URL"),
        ("rediss://h/0?ssl_certfile=/c.pem", "given together"),
        ("rediss://h/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
        ("redis://:pw@h/0?password_file=/run/secrets/pw", "not both"),
    ],
)
def test_inconsistent_credential_options_are_rejected(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisSettings.from_url(url)
