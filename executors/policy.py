"""One egress, file and mail policy for every tool that touches the network or the disk.

A task's input comes from whoever holds a ``submit`` token, so under the default
``api`` trust a tool must not become the submitter's way into the executor host: no
loopback, private, link-local (cloud metadata) or otherwise non-public address, no local
file outside the operator's ``input_root``, no mail to arbitrary addresses through the
configured SMTP relay. ``ax run`` / ``ax.run`` of your own DAG on your own machine sets
``trust: local``, where only the dangerous-by-construction reads (devices, FIFOs,
``/proc``, ``/sys``, ``/dev``) stay refused.

The policy is read from the handler settings (``ctx.settings``) with
:meth:`Policy.from_settings`; ``tool_policy: {<tool>: {<key>: ...}}`` overrides any key
for one tool:

===========================  ======================  =================================
setting                      default (api trust)     default (local trust)
===========================  ======================  =================================
``trust``                    ``"api"``               ``"local"`` (set by ``ax run``)
``egress_allowed_hosts``     ``["*"]`` (any public)  ``["*"]``
``egress_private_allowed``   ``[]``                  ``["*"]``
``input_root``               unset: no local files   unset: any regular file
``mail_allowed_recipients``  ``[]`` (with smtp_url)  ignored
===========================  ======================  =================================

Network checks happen after DNS resolution, on every address a name resolves to, and
the connection is then made to a vetted address (:meth:`Policy.opener`), so a name
that resolves differently the second time (DNS rebinding) cannot reach what the check
refused. Redirects are returned, never followed.

Errors::

    PolicyError (ValueError)      a malformed policy setting
     ├── EgressDenied             the destination is not allowed
     ├── FileRefused              the local file may not be read (reveals nothing of it)
     └── MailRefused              a recipient is not allowed
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import os
import re
import socket
import ssl
import stat
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

__all__ = [
    "METADATA_HOSTS",
    "POLICY_KEYS",
    "Destination",
    "EgressDenied",
    "FileRefused",
    "HostPatterns",
    "MailRefused",
    "Policy",
    "PolicyError",
    "Trust",
    "address_class",
    "parse_url",
]

Trust = Literal["api", "local"]

#: The settings a policy reads; each may also appear under ``tool_policy.<tool>``.
POLICY_KEYS = ("trust", "egress_allowed_hosts", "egress_private_allowed", "input_root",
               "mail_allowed_recipients")
#: Names of cloud metadata services, refused like the non-public addresses they
#: resolve to (some resolve only inside the cloud, where a public-looking answer is
#: possible).
METADATA_HOSTS = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.internal",
    "instance-data", "instance-data.ec2.internal", "metadata.tencentyun.com",
    "metadata.platformequinix.com",
})
#: Trees never read as input files, under any trust: reading them has side effects
#: (devices) or returns the executor's own secrets (``/proc/self/environ``).
REFUSED_TREES = ("/proc", "/sys", "/dev")

_V4 = {
    "0.0.0.0/8": "unspecified",
    "10.0.0.0/8": "private",
    "100.64.0.0/10": "shared (CGNAT)",
    "127.0.0.0/8": "loopback",
    "169.254.0.0/16": "link-local (cloud metadata)",
    "172.16.0.0/12": "private",
    "192.0.0.0/24": "IETF protocol assignment",
    "192.0.2.0/24": "documentation",
    "192.88.99.0/24": "6to4 relay",
    "192.168.0.0/16": "private",
    "198.18.0.0/15": "benchmark",
    "198.51.100.0/24": "documentation",
    "203.0.113.0/24": "documentation",
    "224.0.0.0/4": "multicast",
    "240.0.0.0/4": "reserved",
}
_V6 = {
    "::/128": "unspecified",
    "::1/128": "loopback",
    "::/8": "reserved",  # includes the deprecated IPv4-compatible ::a.b.c.d
    "64:ff9b:1::/48": "local NAT64",
    "100::/64": "discard-only",
    "2001::/23": "IETF protocol assignment",
    "2001:db8::/32": "documentation",
    "fc00::/7": "unique local (ULA)",
    "fe80::/10": "link-local",
    "fec0::/10": "site-local",
    "ff00::/8": "multicast",
}
_DENIED: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.ip_network(net), why) for net, why in {**_V4, **_V6}.items()
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_ADDRESS = re.compile(
    r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$"
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class PolicyError(ValueError):
    """A policy setting is malformed, or a policy refused something (subclasses)."""


class EgressDenied(PolicyError):
    """The destination of a request is not allowed by the egress policy."""


class FileRefused(PolicyError):
    """A local file may not be read. The message never depends on what is on disk
    outside ``input_root``."""


class MailRefused(PolicyError):
    """A recipient is not in ``mail_allowed_recipients``."""


def address_class(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address (``"loopback"``, ``"private"``...), or None.

    IPv4 addresses embedded in IPv6 ones (mapped ``::ffff:a.b.c.d``, NAT64
    ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo) are judged by their IPv4 address,
    since that is where the packets end up.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is None and ip.teredo is not None:
            embedded = ip.teredo[1]
        if embedded is not None:
            inner = address_class(embedded)
            return f"{inner} (IPv4 inside IPv6)" if inner else None
    for network, why in _DENIED:
        if ip.version == network.version and ip in network:
            return why
    # Whatever the table misses but the standard library knows is not global.
    return None if ip.is_global else "not globally routable"


@dataclass(frozen=True)
class HostPatterns:
    """A list of host patterns: exact names, ``*.example.com`` (subdomains), IP
    addresses or CIDRs, and ``*`` (everything).

    Args:
        patterns: The entries of the setting.
        setting: The setting's name, for error messages.
    """

    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    any: bool = False
    setting: str = ""

    @classmethod
    def parse(cls, patterns: Any, setting: str) -> HostPatterns:
        """Parse a setting's value (a string or a list of strings).

        Raises:
            PolicyError: An entry is not a string.
        """
        items = [patterns] if isinstance(patterns, str) else patterns
        if not isinstance(items, Sequence) or not all(isinstance(p, str) for p in items):
            raise PolicyError(f"the {setting} setting must be a list of host names, "
                              f"'*.domain' patterns or CIDRs, got {patterns!r}")
        names, suffixes, networks, everything = set(), [], [], False
        for raw in items:
            item = raw.strip().lower().rstrip(".")
            if item.startswith("[") and item.endswith("]"):
                item = item[1:-1]
            if item == "*":
                everything = True
            elif item.startswith("*."):
                suffixes.append(item[1:])
            else:
                try:
                    networks.append(ipaddress.ip_network(item, strict=False))
                except ValueError:
                    names.add(item)
        return cls(frozenset(names), tuple(suffixes), tuple(networks), everything, setting)

    def matches_name(self, host: str) -> bool:
        """True when ``host`` (lower case, no trailing dot) is named by a pattern."""
        return self.any or host in self.names or any(host.endswith(s) for s in self.suffixes)

    def matches_address(self, ip: IPAddress) -> bool:
        """True when ``ip`` is in one of the CIDRs (or the list is ``*``)."""
        return self.any or any(ip.version == n.version and ip in n for n in self.networks)


@dataclass(frozen=True)
class Destination:
    """A vetted destination: connect only to :attr:`addresses`.

    Attributes:
        host: The URL's host name (kept for the Host header and TLS SNI).
        port: TCP port.
        addresses: ``(family, sockaddr)`` pairs from the resolution that was checked.
    """

    host: str
    port: int
    addresses: tuple[tuple[int, tuple[Any, ...]], ...]


@dataclass(frozen=True)
class Policy:
    """The policy one tool runs under. Build it with :meth:`from_settings`.

    Attributes:
        trust: ``api`` (untrusted submitters, the default) or ``local``.
        allowed_hosts: ``egress_allowed_hosts``.
        private_allowed: ``egress_private_allowed``.
        input_root: ``input_root`` resolved, or None.
        mail_allowed_recipients: Lower-cased addresses and ``@domain`` entries.
        tool: The tool this policy was built for ("" for the deployment's).
        overridden: The keys ``tool_policy.<tool>`` set.
    """

    trust: Trust = "api"
    allowed_hosts: HostPatterns = field(
        default_factory=lambda: HostPatterns(any=True, setting="egress_allowed_hosts"))
    private_allowed: HostPatterns = field(
        default_factory=lambda: HostPatterns(setting="egress_private_allowed"))
    input_root: Path | None = None
    mail_allowed_recipients: tuple[str, ...] = ()
    tool: str = ""
    overridden: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], tool: str = "") -> Policy:
        """The policy of ``tool`` under the handler ``settings``.

        Raises:
            PolicyError: A policy setting is malformed, or the removed
                ``http_allowed_hosts`` is still set (it would silently mean something
                else now).
        """
        if "http_allowed_hosts" in settings:
            raise PolicyError(
                "the http_allowed_hosts setting was removed: use egress_allowed_hosts "
                "(which public hosts tools may contact) and egress_private_allowed "
                "(non-public hosts or CIDRs an operator opts into)")
        overrides = (settings.get("tool_policy") or {}).get(tool) if tool else None
        if overrides is not None and not isinstance(overrides, Mapping):
            raise PolicyError(f"tool_policy.{tool} must be a mapping of policy settings")
        unknown = sorted(set(overrides or {}) - set(POLICY_KEYS))
        if unknown:
            raise PolicyError(f"tool_policy.{tool}: unknown keys {unknown}; policy keys "
                              f"are {list(POLICY_KEYS)}")
        values = {k: settings[k] for k in POLICY_KEYS if k in settings}
        values.update(overrides or {})

        def name(key: str) -> str:
            return f"tool_policy.{tool}.{key}" if key in (overrides or {}) else key

        trust = values.get("trust", "api")
        if trust not in ("api", "local"):
            raise PolicyError(f"the {name('trust')} setting must be 'api' or 'local', "
                              f"got {trust!r}")
        private_default: list[str] = ["*"] if trust == "local" else []
        root = values.get("input_root")
        if root is not None and not isinstance(root, str | os.PathLike):
            raise PolicyError(f"the {name('input_root')} setting must be a directory path")
        mail = values.get("mail_allowed_recipients", [])
        mail = [mail] if isinstance(mail, str) else mail
        if not isinstance(mail, Sequence) or not all(isinstance(m, str) for m in mail):
            raise PolicyError(f"the {name('mail_allowed_recipients')} setting must be a list "
                              "of addresses and '@domain' entries")
        return cls(
            trust=cast(Trust, trust),
            allowed_hosts=HostPatterns.parse(values.get("egress_allowed_hosts", ["*"]),
                                             name("egress_allowed_hosts")),
            private_allowed=HostPatterns.parse(
                values.get("egress_private_allowed", private_default),
                name("egress_private_allowed")),
            input_root=Path(os.path.realpath(root)) if root else None,
            mail_allowed_recipients=tuple(m.strip().lower() for m in mail),
            tool=tool,
            overridden=frozenset(overrides or ()),
        )

    def setting(self, key: str) -> str:
        """The name of the setting to change for ``key``: the tool's override when it
        has one, else the deployment's."""
        return f"tool_policy.{self.tool}.{key}" if key in self.overridden else key

    # ------------------------------------------------------------------ network

    def vet(self, url: str) -> Destination:
        """Resolve the URL's host and check every address it resolves to.

        Raises:
            PolicyError: Not an http(s) URL with a host.
            EgressDenied: The host or one of its addresses is not allowed.
            OSError: The name does not resolve (a transient failure).
        """
        host, port = parse_url(url)
        where = f" for tool {self.tool}" if self.tool else ""
        allowed = self.allowed_hosts
        if host in METADATA_HOSTS and not (self.private_allowed.any
                                           or self.private_allowed.matches_name(host)):
            raise EgressDenied(
                f"host {host!r} is a cloud metadata service, refused{where} under "
                f"{self.trust} trust: an operator may list it in "
                f"{self.private_allowed.setting}")
        not_listed = EgressDenied(
            f"host {host!r} is not allowed{where}: add it (or '*.domain', or a CIDR) to "
            f"the {allowed.setting} setting")
        if not allowed.matches_name(host) and not allowed.networks:
            raise not_listed  # no CIDR could admit it: not even a DNS query
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
        addresses: list[tuple[int, tuple[Any, ...]]] = []
        for family, _type, _proto, _name, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if not (allowed.matches_name(host) or allowed.matches_address(ip)):
                raise not_listed
            why = address_class(ip)
            if why and not (self.private_allowed.matches_name(host)
                            or self.private_allowed.matches_address(ip)):
                # The address itself is not shown: for a name, it would turn the
                # error into an oracle of the operator's internal DNS.
                raise EgressDenied(
                    f"host {host!r} resolves to a non-public address ({why}), which tools "
                    f"may not reach{where} under {self.trust} trust: an operator who means it "
                    f"adds the host or its CIDR to {self.private_allowed.setting}")
            if (family, sockaddr) not in addresses:
                addresses.append((family, tuple(sockaddr)))
        if not addresses:
            raise OSError(f"host {host!r} has no IPv4 or IPv6 address")
        return Destination(host, port, tuple(addresses))

    def opener(self) -> urllib.request.OpenerDirector:
        """A urllib opener for this policy: http and https only, every request vetted
        by :meth:`vet` and connected to the vetted address (Host header and TLS SNI
        keep the name), proxy variables ignored, redirects never followed (a 3xx is
        raised as ``HTTPError`` for the caller to return)."""
        opener = urllib.request.OpenerDirector()
        # Built by hand rather than with build_opener, which would add the file: and
        # ftp: handlers: a URL must never reach the disk through this opener.
        for handler in (urllib.request.ProxyHandler({}), urllib.request.UnknownHandler(),
                        urllib.request.HTTPDefaultErrorHandler(), _NoRedirect(),
                        urllib.request.HTTPErrorProcessor(), _GuardedHTTPHandler(self),
                        _GuardedHTTPSHandler(self)):
            opener.add_handler(handler)
        return opener

    # ------------------------------------------------------------------ files

    def read_file(self, source: str, limit: int, *, limit_setting: str) -> bytes:
        """Read a local file named by task input, at most ``limit`` bytes.

        Under ``api`` trust only regular files under ``input_root`` (after resolving
        ``~``, ``..`` and symlinks) are read, and every refusal has the same message,
        whether the path exists or not. Under ``local`` trust any readable regular
        file is. Devices, FIFOs, sockets and ``/proc``, ``/sys``, ``/dev`` never are.

        Raises:
            FileRefused: The file may not (or cannot) be read, or is over ``limit``.
        """
        refused = FileRefused(self._file_refusal())
        if self.trust == "api" and self.input_root is None:
            raise refused
        try:
            path = os.path.realpath(os.path.expanduser(source))
        except (OSError, ValueError):  # a NUL byte, say
            raise refused from None
        if _under(path, REFUSED_TREES) or (self.input_root is not None
                                           and not _under(path, (str(self.input_root),))):
            raise refused
        try:
            # Judged before opening: opening a device or FIFO can block or act.
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise self._detailed(refused, f"{source} is not a regular file")
            # O_NOFOLLOW: a symlink swapped in after realpath fails; O_NONBLOCK: a FIFO
            # swapped in does not block the open.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise self._detailed(refused, f"no such file: {path}") from None
        except OSError as exc:
            raise self._detailed(refused, f"cannot read {path}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or not self._fd_inside(fd):
                raise refused
            if info.st_size > limit:
                raise FileRefused(f"{source} is {info.st_size} bytes, over the {limit}-byte "
                                  f"limit ({limit_setting})")
            data = _read_fd(fd, limit + 1)
        except OSError as exc:
            raise self._detailed(refused, f"cannot read {path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        if len(data) > limit:  # grew between fstat and read
            raise FileRefused(f"{source} is over the {limit}-byte limit ({limit_setting})")
        return data

    def _file_refusal(self) -> str:
        key = self.setting("input_root")
        if self.trust == "api" and self.input_root is None:
            return (f"local files are not read for tasks under api trust: an operator "
                    f"sets {key} to a directory of input files to allow reading from it")
        if self.input_root is not None:
            return (f"not an allowed input file: the path must name a readable regular "
                    f"file under the {key} directory (links leading out of it, devices "
                    f"and /proc, /sys, /dev are refused)")
        return "not an allowed input file: devices, FIFOs and /proc, /sys, /dev are refused"

    def _detailed(self, refused: FileRefused, detail: str) -> FileRefused:
        # Only a local user, reading their own machine, learns why exactly.
        return FileRefused(detail) if self.trust == "local" else refused

    def _fd_inside(self, fd: int) -> bool:
        # Where the open descriptor really points: catches a directory on the path
        # swapped for a symlink between realpath and open.
        if self.input_root is None:
            return True
        try:
            actual = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return True  # no /proc (not Linux): realpath + O_NOFOLLOW is the check
        return _under(actual, (str(self.input_root),))

    # ------------------------------------------------------------------ mail

    def check_recipients(self, addresses: Iterable[str], *, leaves_host: bool) -> None:
        """Refuse mail to recipients outside ``mail_allowed_recipients``.

        Only mail that leaves the host (an ``smtp_url`` is set) under ``api`` trust
        is restricted; the local mailbox keeps everything on the executor's disk.

        Raises:
            MailRefused: A recipient does not match.
        """
        if self.trust == "local" or not leaves_host:
            return
        key = self.setting("mail_allowed_recipients")
        refused = sorted({a for a in addresses if not self._recipient_allowed(a)})
        if refused:
            raise MailRefused(
                f"recipient(s) {', '.join(refused)} not allowed: under api trust, mail "
                f"through smtp_url goes only to addresses or '@domain' entries listed "
                f"in the {key} setting")

    def _recipient_allowed(self, address: str) -> bool:
        address = address.strip()
        # Only plain addr-specs are judged: comments, quotes or routes could make the
        # mail server deliver somewhere else than the text compared here.
        if not _ADDRESS.match(address):
            return False
        lowered = address.lower()
        domain = "@" + lowered.rpartition("@")[2]
        return lowered in self.mail_allowed_recipients or domain in self.mail_allowed_recipients


def parse_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of an http(s) URL (host lower case, no brackets or final dot).

    Raises:
        PolicyError: Not an http or https URL with a host and a valid port.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PolicyError(f"expected an http:// or https:// URL with a host, got {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise PolicyError(f"bad port in {url!r}: {exc}") from None
    return parts.hostname.rstrip("."), port


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _read_fd(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _connect(destination: Destination, timeout: float | None,
             source_address: tuple[str, int] | None) -> socket.socket:
    """Connect to the first reachable vetted address (never resolving again)."""
    error: OSError | None = None
    for family, sockaddr in destination.addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if timeout is not None:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OSError(f"no address to connect to for {destination.host!r}")


def _pin(conn: http.client.HTTPConnection, destination: Destination) -> None:
    # http.client resolves (host, port) again in connect(); swapping its connection
    # factory makes it connect to the vetted address instead, while everything that
    # uses the name (Host header, TLS SNI and certificate check) keeps it.
    conn._create_connection = (  # type: ignore[attr-defined]
        lambda _address, timeout, source: _connect(destination, timeout, source))


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, *, destination: Destination, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        _pin(self, destination)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, *, destination: Destination, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        _pin(self, destination)


class _GuardedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self._policy = policy

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        # Vetted here, per request, so any hop a caller ever follows is checked too.
        factory = functools.partial(_PinnedHTTPConnection,
                                    destination=self._policy.vet(req.full_url))
        return self.do_open(cast(Any, factory), req)


class _GuardedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, policy: Policy) -> None:
        self._ssl = ssl.create_default_context()
        super().__init__(context=self._ssl)
        self._policy = policy

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        factory = functools.partial(_PinnedHTTPSConnection,
                                    destination=self._policy.vet(req.full_url))
        return self.do_open(cast(Any, factory), req, context=self._ssl)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # Returned to the caller instead (urllib raises the 3xx as an HTTPError).
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
