"""What the command line needs of the API server before it starts one: its defaults and
its address parsing, importable without the server's frameworks (FastAPI, uvicorn,
gRPC), so that every ``ax`` command does not pay for loading them.
"""

from __future__ import annotations

import ipaddress

from axengine.errors import InputError

__all__ = ["DEFAULT_GRPC_MAX_MESSAGE", "DEFAULT_MAX_BODY_BYTES", "is_loopback",
           "parse_address"]

#: Largest request body accepted (bytes) unless configured otherwise.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: Largest gRPC request the server reads (``--grpc-max-message-bytes``). Executors send
#: outputs inline, so this is also the largest output a remote node can return; it
#: matches :data:`axengine.limits.MAX_JSON_BYTES`. Each concurrent call may hold this much
#: memory, so it stays far below gRPC's own 64 MiB-ish habits.
DEFAULT_GRPC_MAX_MESSAGE = 8 * 1024 * 1024


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → ``(host, port)``.

    Raises:
        InputError: Not an address with a port in 0-65535.
    """
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InputError(f"{what} {text!r}: use HOST:PORT, e.g. 127.0.0.1:8080")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
