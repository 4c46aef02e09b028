"""Connection settings of the Redis work queue, parsed from a URL.

``RedisSettings.from_url("redis://:secret@host:6379/0?prefix=ax&poll_interval=0.1")``
builds the settings :class:`axengine.queue.redis.RedisQueue` connects with. This module
does not import redis-py, so configuration can be parsed without the client installed.

Accepted URL forms: ``redis://[[user]:password@]host[:port][/db][?option=value&...]``
and ``rediss://...`` (TLS), as redis-py's ``Redis.from_url`` reads them. Query options:
``prefix``, ``socket_timeout``, ``connect_timeout``, ``retries``, ``poll_interval``;
``password_file`` (a file holding the password, so it appears in no URL or process
list; read at each new connection, so a rotated password is picked up); and, with
``rediss://``, redis-py's ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs`` (``required``/``optional``/``none``) and ``ssl_check_hostname``.

Credentials stay out of every text ax prints: ``repr`` masks the password and
:func:`redact_url` masks it in a URL before the URL is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from axengine.credentials import masked_repr, read_secret, redact_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_QUEUE_PREFIX",
    "DEFAULT_REDIS_PORT",
    "DEFAULT_RETRIES",
    "DEFAULT_SOCKET_TIMEOUT",
    "RedisSettings",
    "redact_url",
]

#: Port used when the URL names none.
DEFAULT_REDIS_PORT = 6379
#: Root of every Redis key the queue writes (``{prefix}:lane:default``...).
DEFAULT_QUEUE_PREFIX = "ax"
#: Seconds a single Redis command may take before it fails.
DEFAULT_SOCKET_TIMEOUT = 5.0
#: Seconds to wait for a TCP connection to Redis.
DEFAULT_CONNECT_TIMEOUT = 2.0
#: Reconnect attempts after a connection error before a command fails with QueueError.
DEFAULT_RETRIES = 3
#: Longest single blocking wait inside ``pop``: bounds how late a waiting worker sees an
#: item in a lower-priority lane or a delayed item that became due.
DEFAULT_POLL_INTERVAL = 0.1

_QUERY_OPTIONS = (
    "prefix", "socket_timeout", "connect_timeout", "retries", "poll_interval",
    "password_file", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
    "ssl_check_hostname",
)
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                "ssl_check_hostname")
_CERT_REQS = ("required", "optional", "none")
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True,
             "0": False, "false": False, "no": False, "off": False}

@dataclass(frozen=True, kw_only=True)
class RedisSettings:
    """Where the Redis queue lives and how it talks to it.

    Attributes:
        host: Redis host name or address.
        port: Redis TCP port.
        db: Logical database number.
        username: ACL user name, if any.
        password: Password, if any (shown as ``***`` by ``repr``).
        password_file: File holding the password instead (read at each new connection;
            one trailing line break is ignored).
        ssl: Connect with TLS (``rediss://``).
        ssl_ca_certs: PEM file of the CA of the server certificate (system roots if None).
        ssl_certfile: PEM client certificate, for servers started with
            ``tls-auth-clients yes`` (requires ``ssl_keyfile``).
        ssl_keyfile: PEM private key of ``ssl_certfile``.
        ssl_cert_reqs: Whether the server certificate must verify: ``"required"``
            (default), ``"optional"`` or ``"none"``.
        ssl_check_hostname: Whether the server certificate must name ``host``.
        prefix: Root of every key the queue writes; use a hash tag such as ``{ax}`` to
            keep all keys in one slot of a Redis Cluster.
        socket_timeout: Seconds one command may take.
        connect_timeout: Seconds to wait for a connection.
        retries: Reconnect attempts on a connection error before giving up.
        poll_interval: Longest single blocking wait inside ``pop`` (must be shorter than
            ``socket_timeout``).
    """

    host: str = "localhost"
    port: int = DEFAULT_REDIS_PORT
    db: int = 0
    username: str | None = None
    password: str | None = None
    password_file: str | None = None
    ssl: bool = False
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cert_reqs: str = "required"
    ssl_check_hostname: bool = True
    prefix: str = DEFAULT_QUEUE_PREFIX
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    poll_interval: float = DEFAULT_POLL_INTERVAL

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("RedisSettings.prefix must not be empty (default 'ax')")
        if self.retries < 0:
            raise ValueError(f"RedisSettings.retries must be >= 0, got {self.retries}")
        if self.socket_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("RedisSettings timeouts must be positive seconds")
        if not 0 < self.poll_interval < self.socket_timeout:
            raise ValueError(
                f"RedisSettings.poll_interval ({self.poll_interval}) must be > 0 and shorter "
                f"than socket_timeout ({self.socket_timeout}): a blocking wait longer than "
                "the socket timeout would be reported as a dead connection"
            )
        if self.password is not None and self.password_file is not None:
            raise ValueError("give the Redis password or a password_file, not both")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("Redis TLS ssl_certfile and ssl_keyfile must be given together")
        if self.ssl_cert_reqs not in _CERT_REQS:
            raise ValueError(
                f"RedisSettings.ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, "
                f"not {self.ssl_cert_reqs!r}"
            )
        changed = [name for name in _TLS_OPTIONS
                   if getattr(self, name) != _FIELD_DEFAULTS[name]]
        if changed and not self.ssl:
            raise ValueError(
                f"Redis option(s) {', '.join(changed)} need TLS: use a rediss:// URL"
            )

    def __repr__(self) -> str:
        return masked_repr(self, ("password",))

    __str__ = __repr__

    def read_password(self) -> str | None:
        """The password to authenticate with: ``password``, or ``password_file``'s content.

        Raises:
            ValueError: ``password_file`` cannot be read or is empty; the message names
                the file, never its content.
        """
        if self.password_file is None:
            return self.password
        return read_secret(self.password_file, "Redis password_file")

    @classmethod
    def from_url(cls, url: str) -> RedisSettings:
        """Parse ``redis://[[user]:password@]host[:port][/db][?option=value...]``.

        Args:
            url: A ``redis://`` or ``rediss://`` URL. Query options: ``prefix``,
                ``socket_timeout``, ``connect_timeout``, ``retries``, ``poll_interval``,
                ``password_file``, and with ``rediss://`` ``ssl_ca_certs``,
                ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
                ``ssl_check_hostname``.

        Returns:
            The settings; fields absent from the URL keep their defaults.

        Raises:
            ValueError: The scheme, database number or an option is invalid; the message
                names the offending part and never shows the password.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(
                f"unsupported Redis URL scheme {parts.scheme!r} in {redact_url(url)!r}; "
                "use redis://host:6379/0 or rediss://host:6379/0"
            )
        path = parts.path.strip("/")
        try:
            db = int(path) if path else 0
            port = parts.port or DEFAULT_REDIS_PORT
        except ValueError as exc:
            raise ValueError(
                f"invalid port or database in Redis URL {redact_url(url)!r}: {exc}; "
                "expected redis://host:6379/0"
            ) from None
        settings = cls(
            host=parts.hostname or "localhost",
            port=port,
            db=db,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            ssl=parts.scheme == "rediss",
        )
        options: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for name, raw in parse_qsl(parts.query, keep_blank_values=True):
            if name not in _QUERY_OPTIONS:
                raise ValueError(
                    f"unknown option {name!r} in Redis URL; known options: "
                    + ", ".join(_QUERY_OPTIONS)
                )
            options[name] = _convert(name, raw, str(types[name]))
        return replace(settings, **options)


_FIELD_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(RedisSettings)}


def _convert(name: str, raw: str, type_name: str) -> Any:
    try:
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
        if type_name == "bool":
            return _BOOLEANS[raw.lower()]
    except (ValueError, KeyError):
        raise ValueError(
            f"Redis URL option {name}={raw!r} is not a valid {type_name}"
        ) from None
    return raw or None if type_name.endswith("None") else raw


