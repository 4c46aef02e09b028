"""Settings of the two state stores, each parsed from a URL (``from_url``).

::

    sqlite:///var/lib/ax/state.db?busy_timeout=10&synchronous=full
    sqlite://:memory:
    etcd://127.0.0.1:2379,10.0.0.2:2379?timeout=5&max_txn_ops=20000
    etcds://user:secret@etcd.internal:2379?ca=/etc/ax/ca.pem&cert=/etc/ax/c.pem&key=/etc/ax/k.pem
    etcd://ax@etcd:2379?password_file=/run/secrets/etcd-password

Credentials stay out of every text ax prints: ``repr`` of the settings masks the password,
and :func:`redact_url` masks it in a URL before the URL is shown. ``password_file`` keeps
the password out of the URL (and so out of process lists and shell history) altogether;
the file is read at each login, so a rotated password is picked up on the next one.

This module imports nothing but the standard library (and the stdlib-only
:mod:`axengine.credentials`), so configuration code can build
settings without loading the SQLite or gRPC machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote

from axengine.credentials import masked_repr, read_secret, redact_url

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_ETCD_PORT",
    "DEFAULT_ETCD_TIMEOUT",
    "DEFAULT_MAX_TXN_OPS",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_WATCH_RETENTION",
    "EtcdSettings",
    "SqliteSettings",
    "read_secret",
    "redact_url",
]

#: Seconds a writer waits for another process's write lock before ``StoreUnavailable``.
DEFAULT_BUSY_TIMEOUT = 10.0

#: How many revisions of change log the SQLite store keeps for ``watch`` (etcd keeps
#: history until it is compacted; this is the embedded equivalent of auto-compaction).
DEFAULT_WATCH_RETENTION = 100_000

#: Seconds between two polls of the change log by a SQLite watch. In-process writes wake
#: watchers at once; the poll only bounds the delay for writes made by other processes.
DEFAULT_POLL_INTERVAL = 0.025

#: Port used when an etcd URL names a host without one.
DEFAULT_ETCD_PORT = 2379

#: Seconds for one etcd request (including waiting for a connection) before it fails.
DEFAULT_ETCD_TIMEOUT = 5.0

#: etcd's own default for ``--max-txn-ops``; ``get_many`` splits larger reads into
#: chunks pinned to one revision. Raise it together with the server flag.
DEFAULT_MAX_TXN_OPS = 128

#: Txn requests an :class:`~axengine.store.etcd.EtcdStore` keeps on their way to etcd
#: before concurrent transactions wait and go out merged (``axengine/store/_etcd_merge``).
DEFAULT_MERGE_IN_FLIGHT = 1

_TRUE = {"1", "true", "yes", "on"}

def _query(url: str) -> tuple[str, dict[str, str]]:
    base, _, query = url.partition("?")
    params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    return base, params


def _pop_float(params: dict[str, str], name: str, default: float) -> float:
    raw = params.pop(name, None)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"store URL parameter {name}={raw!r} is not a number") from None
    if value < 0:
        raise ValueError(f"store URL parameter {name}={raw!r} must not be negative")
    return value


def _pop_int(params: dict[str, str], name: str, default: int, *, least: int = 1) -> int:
    raw = params.pop(name, None)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"store URL parameter {name}={raw!r} is not an integer") from None
    if value < least:
        raise ValueError(f"store URL parameter {name}={raw!r} must be "
                         f"{'positive' if least == 1 else f'at least {least}'}")
    return value


def _reject_unknown(params: dict[str, str], url: str) -> None:
    if params:
        names = ", ".join(sorted(params))
        raise ValueError(f"unknown parameter(s) {names} in store URL {url!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SqliteSettings:
    """Settings of :class:`axengine.store.embedded.SqliteStore`.

    Attributes:
        path: Database file, or ``":memory:"`` for a private in-memory store.
        busy_timeout: Seconds to wait for another process's write lock.
        synchronous: ``"FULL"`` (default) makes every commit durable when ``txn``
            returns, even after a power loss. ``"NORMAL"`` survives a process crash
            (SIGKILL) but may lose the last commits on power loss.
        watch_retention: Revisions of change history kept for ``watch``; older start
            revisions raise ``RevisionCompacted``.
        poll_interval: Seconds between change-log polls of a watch.
    """

    path: str
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    synchronous: Literal["FULL", "NORMAL"] = "FULL"
    watch_retention: int = DEFAULT_WATCH_RETENTION
    poll_interval: float = DEFAULT_POLL_INTERVAL

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("SQLite store path must not be empty (use ':memory:')")
        if self.synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', not {self.synchronous!r}")
        if self.busy_timeout < 0:
            raise ValueError("busy_timeout must not be negative")
        if self.watch_retention <= 0:
            raise ValueError("watch_retention must be positive")
        if self.poll_interval <= 0:
            raise ValueError("poll_interval must be positive")

    @classmethod
    def from_url(cls, url: str) -> SqliteSettings:
        """Parse ``sqlite:///abs/path.db``, ``sqlite://rel/path.db`` or ``sqlite://:memory:``.

        Query parameters: ``busy_timeout`` (seconds), ``synchronous`` (``full`` or
        ``normal``), ``watch_retention`` (revisions), ``poll_interval`` (seconds).

        Raises:
            ValueError: Not a ``sqlite://`` URL, no path, or an unknown parameter.
        """
        base, params = _query(url)
        scheme, sep, rest = base.partition("://")
        if not sep or scheme.lower() != "sqlite":
            raise ValueError(f"not a sqlite URL: {url!r} (expected sqlite:///path/to/ax.db)")
        path = unquote(rest)
        if path in ("", "/"):
            raise ValueError(f"sqlite URL has no path: {url!r} (expected sqlite:///path)")
        if path == "/:memory:":
            path = ":memory:"
        sync = params.pop("synchronous", "full").upper()
        if sync not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be full or normal, not {sync.lower()!r}")
        settings = cls(
            path=path,
            busy_timeout=_pop_float(params, "busy_timeout", DEFAULT_BUSY_TIMEOUT),
            synchronous="FULL" if sync == "FULL" else "NORMAL",
            watch_retention=_pop_int(params, "watch_retention", DEFAULT_WATCH_RETENTION),
            poll_interval=_pop_float(params, "poll_interval", DEFAULT_POLL_INTERVAL),
        )
        _reject_unknown(params, url)
        return settings


@dataclass(frozen=True, kw_only=True, slots=True)
class EtcdSettings:
    """Settings of :class:`axengine.store.etcd.EtcdStore`.

    Attributes:
        endpoints: ``(host, port)`` pairs; the store uses one at a time and moves to the
            next after a connection failure.
        timeout: Seconds per request, including the wait for a (re)connection.
        username: etcd user (requires ``password`` or ``password_file``).
        password: Password of ``username`` (shown as ``***`` by ``repr``).
        password_file: File holding the password of ``username`` instead (read at each
            login; one trailing line break is ignored).
        tls: Use TLS. Implied by ``ca_cert``/``cert``/``key`` and by ``etcds://``.
        ca_cert: PEM file of the CA that signed the server certificate (system roots
            when None).
        cert: PEM client certificate for mutual TLS (requires ``key``).
        key: PEM private key of ``cert``.
        max_txn_ops: The server's ``--max-txn-ops``; ``get_many`` reads at most this
            many keys per request (larger reads are pinned to one revision).
        merge_in_flight: While this many of the store's transaction requests are on
            their way to etcd, further transactions wait and then go out together, as
            nested transactions of one request (each commits or fails as alone; see
            docs/stores.md). 0: every transaction is its own request.
    """

    endpoints: tuple[tuple[str, int], ...] = (("127.0.0.1", DEFAULT_ETCD_PORT),)
    timeout: float = DEFAULT_ETCD_TIMEOUT
    username: str | None = None
    password: str | None = None
    password_file: str | None = None
    tls: bool = False
    ca_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS
    merge_in_flight: int = DEFAULT_MERGE_IN_FLIGHT

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("etcd settings need at least one endpoint")
        if self.password is not None and self.password_file is not None:
            raise ValueError("give the etcd password or a password_file, not both")
        has_secret = self.password is not None or self.password_file is not None
        if (self.username is None) == has_secret:
            raise ValueError(
                "etcd username and password go together: etcd://user:password@host or "
                "etcd://user@host?password_file=/path"
            )
        if (self.cert is None) != (self.key is None):
            raise ValueError("etcd TLS client cert and key must be given together")
        if self.max_txn_ops <= 0:
            raise ValueError("max_txn_ops must be positive")
        if self.merge_in_flight < 0:
            raise ValueError("merge_in_flight must be 0 (never merge) or positive")
        if self.timeout <= 0:
            raise ValueError("etcd timeout must be positive")

    def __repr__(self) -> str:
        return masked_repr(self, ("password",))

    __str__ = __repr__

    @property
    def use_tls(self) -> bool:
        """Whether connections use TLS."""
        return self.tls or any(p is not None for p in (self.ca_cert, self.cert, self.key))

    def read_password(self) -> str | None:
        """The password to log in with: ``password``, or the content of ``password_file``.

        Raises:
            ValueError: ``password_file`` cannot be read or is empty.
        """
        if self.password_file is not None:
            return read_secret(self.password_file, "etcd password_file")
        return self.password

    @classmethod
    def from_url(cls, url: str) -> EtcdSettings:
        """Parse ``etcd://[user[:password]@]host[:port][,host2[:port]]...[?params]``.

        ``etcds://`` turns TLS on. Query parameters: ``timeout`` (seconds), ``ca``,
        ``cert``, ``key`` (PEM file paths), ``tls`` (``true``/``false``),
        ``password_file`` (path of a file holding the password of ``user``; the URL
        then names the user only), ``max_txn_ops``, ``merge_in_flight``.

        Raises:
            ValueError: Not an etcd URL, a bad host/port, a user without a password, or an
                unknown parameter. Messages show the URL with its password masked.
        """
        base, params = _query(url)
        scheme, sep, rest = base.partition("://")
        scheme = scheme.lower()
        shown = redact_url(url)
        if not sep or scheme not in ("etcd", "etcds"):
            raise ValueError(f"not an etcd URL: {shown!r} (expected etcd://host:2379)")
        password_file = params.pop("password_file", None) or None
        username = password = None
        if "@" in rest:
            userinfo, _, rest = rest.rpartition("@")
            user, colon, secret = userinfo.partition(":")
            if not user or bool(colon) == (password_file is not None):
                raise ValueError(
                    "etcd URL credentials must be user:password@ or user@ with "
                    f"?password_file=/path, in {shown!r}"
                )
            username = unquote(user)
            password = unquote(secret) if colon else None
        elif password_file is not None:
            raise ValueError(f"password_file needs a user (etcd://user@host?...) in {shown!r}")
        rest = rest.rstrip("/")
        if not rest:
            raise ValueError(f"etcd URL has no host: {shown!r}")
        endpoints = tuple(_endpoint(part, url) for part in rest.split(","))
        tls_raw = params.pop("tls", None)
        settings = cls(
            endpoints=endpoints,
            timeout=_pop_float(params, "timeout", DEFAULT_ETCD_TIMEOUT),
            username=username,
            password=password,
            password_file=password_file,
            tls=scheme == "etcds" or (tls_raw is not None and tls_raw.lower() in _TRUE),
            ca_cert=params.pop("ca", None) or None,
            cert=params.pop("cert", None) or None,
            key=params.pop("key", None) or None,
            max_txn_ops=_pop_int(params, "max_txn_ops", DEFAULT_MAX_TXN_OPS),
            merge_in_flight=_pop_int(params, "merge_in_flight", DEFAULT_MERGE_IN_FLIGHT,
                                     least=0),
        )
        _reject_unknown(params, shown)
        return settings


def _endpoint(part: str, url: str) -> tuple[str, int]:
    part = part.strip()
    if part.startswith("["):  # [::1]:2379
        host, _, tail = part[1:].partition("]")
        port_text = tail.removeprefix(":")
    else:
        host, _, port_text = part.partition(":")
    if not host:
        raise ValueError(f"empty host in etcd URL {redact_url(url)!r}")
    if not port_text:
        return host, DEFAULT_ETCD_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port {port_text!r} in etcd URL {redact_url(url)!r}")
    return host, int(port_text)
