"""The API server of ax: REST (FastAPI) and gRPC adapters over the engine.

- :func:`create_app` builds the REST application (``/v1``, OpenAPI, health, metrics);
- :func:`add_services` registers ``ax.v1.AxService`` and ``ax.v1.ExecutorService`` on a
  ``grpc.aio`` server;
- :class:`Authenticator` / :func:`load_tokens` check bearer tokens and roles;
- :func:`status_of` is the one table from ``AxError`` classes to HTTP and gRPC codes;
- :class:`ApiServer` / :func:`serve` assemble a process (``ax api``, ``ax server``).

The wire contracts are described in ``docs/api.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from axengine.api._auth import ANONYMOUS, RULES, Authenticator, Principal, Role, load_tokens
    from axengine.api._defaults import DEFAULT_MAX_BODY_BYTES, is_loopback, parse_address
    from axengine.api._errors import ERROR_TABLE, ErrorStatus, error_body, status_of
    from axengine.api._grpc import AxServicer, ExecutorServicer, add_services
    from axengine.api._quotas import Quotas
    from axengine.api._rest import create_app
    from axengine.api._server import ApiServer, Listening, ServerOptions, serve

#: Where each name lives: the package loads a module when one of its names is first
#: used, so a command that only parses an address does not load FastAPI, uvicorn and
#: the gRPC server (about 0.3 s).
_HOMES = {
    "_auth": ("ANONYMOUS", "RULES", "Authenticator", "Principal", "Role", "load_tokens"),
    "_defaults": ("DEFAULT_MAX_BODY_BYTES", "is_loopback", "parse_address"),
    "_errors": ("ERROR_TABLE", "ErrorStatus", "error_body", "status_of"),
    "_grpc": ("AxServicer", "ExecutorServicer", "add_services"),
    "_quotas": ("Quotas",),
    "_rest": ("create_app",),
    "_server": ("ApiServer", "Listening", "ServerOptions", "serve"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'axengine.api' has no attribute {name!r}")
    return getattr(importlib.import_module(f"axengine.api.{module}"), name)


__all__ = [
    "ANONYMOUS",
    "DEFAULT_MAX_BODY_BYTES",
    "ERROR_TABLE",
    "RULES",
    "ApiServer",
    "Authenticator",
    "AxServicer",
    "ErrorStatus",
    "ExecutorServicer",
    "Listening",
    "Principal",
    "Quotas",
    "Role",
    "ServerOptions",
    "add_services",
    "create_app",
    "error_body",
    "is_loopback",
    "load_tokens",
    "parse_address",
    "serve",
    "status_of",
]
