"""Where a CLI command sends its work: the local store, or an ``ax api``/``ax server``.

``--server URL`` (or ``$AX_SERVER``) switches the store commands (``run``, ``tasks``,
``approve``/``reject``, ``cancel``, ``retry``, ``fork``, ``snapshot export``) to the REST API,
through :class:`axengine.client.Client`. The token comes from ``--token-file FILE``,
``$AX_TOKEN_FILE`` or ``$AX_TOKEN`` (``--token T`` is accepted but discouraged: argv is
visible to every user of the machine in ``ps``).

Every lookup of those settings is :func:`remote_of`; the config layer (``ax.toml``) maps
its ``server`` / ``token_file`` keys onto the same environment variables.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from axengine.cli._common import EXIT_FAILED, fail
from axengine.credentials import read_token_file
from axengine.errors import ApiUnavailable, AxError, Forbidden, Unauthorized

if TYPE_CHECKING:
    from axengine.client import Client

__all__ = [
    "ENV_SERVER",
    "ENV_TOKEN",
    "ENV_TOKEN_FILE",
    "REMOTE_RETRY_FOR",
    "Remote",
    "add_remote",
    "remote_of",
    "with_client",
]

#: Base URL of the server the store commands go to (as ``--server``).
ENV_SERVER = "AX_SERVER"
#: A file holding the bearer token (as ``--token-file``).
ENV_TOKEN_FILE = "AX_TOKEN_FILE"
#: The bearer token itself.
ENV_TOKEN = "AX_TOKEN"
#: Seconds a CLI command keeps retrying a server that refuses connections (the SDK's
#: default of 30 s is long for a person waiting at a prompt).
REMOTE_RETRY_FOR = 3.0


@dataclass(frozen=True)
class Remote:
    """A server to send a command to.

    Attributes:
        url: Base URL of its REST listener.
        token: Bearer token ("" when none was given).
        token_source: Where the token came from, for messages ("" when none).
    """

    url: str
    token: str
    token_source: str

    def flags(self) -> str:
        """The options naming this server in a command printed for the user (the token
        is never printed: a token file, or the environment, keeps it)."""
        return f" --server {self.url}"


def add_remote(parser: argparse.ArgumentParser) -> None:
    """Add ``--server``, ``--token-file`` and the discouraged ``--token``."""
    group = parser.add_argument_group("remote (through an ax server's REST API)")
    group.add_argument("--server", metavar="URL", default=None,
                       help=f"REST URL of an ax api / ax server (e.g. http://127.0.0.1:8080) "
                       f"to work through instead of the local store (default: ${ENV_SERVER})")
    group.add_argument("--token-file", metavar="FILE", default=None,
                       help=f"file holding the bearer token for --server (default: "
                       f"${ENV_TOKEN_FILE}, else the token in ${ENV_TOKEN})")
    group.add_argument("--token", default=None, metavar="TOKEN",
                       help="the token itself (discouraged: argv is visible to other users "
                       "in ps; prefer --token-file or $AX_TOKEN)")


def _read_token_file(path: str, what: str) -> str:
    try:
        return read_token_file(path, what)
    except ValueError as exc:
        raise AxError(str(exc)) from None


def remote_of(args: argparse.Namespace,
              env: Mapping[str, str] | None = None) -> Remote | None:
    """The server ``args`` and the environment name, or None for the local store.

    Precedence: ``--server`` over ``$AX_SERVER``; ``--token-file``, then ``--token``,
    then ``$AX_TOKEN_FILE``, then ``$AX_TOKEN``.

    Raises:
        AxError: The token file cannot be read or holds no token; ``--home`` given with
            a server (the server has its own store).
    """
    env = os.environ if env is None else env
    url = getattr(args, "server", None) or env.get(ENV_SERVER, "")
    if not url:
        if getattr(args, "token_file", None) or getattr(args, "token", None):
            raise AxError("--token-file / --token apply to --server URL (or $AX_SERVER)")
        return None
    if getattr(args, "home", None):
        raise AxError("--home names a local store; with --server the server's store is used "
                      "(drop one of them)")
    if getattr(args, "token_file", None):
        token, source = _read_token_file(args.token_file, "--token-file"), "--token-file"
    elif getattr(args, "token", None):
        token, source = str(args.token), "--token"
    elif env.get(ENV_TOKEN_FILE):
        token, source = _read_token_file(env[ENV_TOKEN_FILE], f"${ENV_TOKEN_FILE}"), \
            f"${ENV_TOKEN_FILE}"
    elif env.get(ENV_TOKEN):
        token, source = env[ENV_TOKEN], f"${ENV_TOKEN}"
    else:
        token, source = "", ""
    if not url.startswith(("http://", "https://")):
        raise AxError(f"--server {url}: give the REST URL, e.g. http://127.0.0.1:8080")
    return Remote(url=url.rstrip("/"), token=token, token_source=source)


def explain(remote: Remote, exc: AxError) -> tuple[str, int]:
    """One line for a refusal or an unreachable server, and the exit code."""
    if isinstance(exc, Unauthorized):
        if not remote.token:
            return (f"{remote.url} requires a token (401): give --token-file FILE or set "
                    f"${ENV_TOKEN_FILE} / ${ENV_TOKEN}", EXIT_FAILED)
        return (f"{remote.url} does not know the token from {remote.token_source} (401: "
                f"{exc}); check the token against the server's tokens file", EXIT_FAILED)
    if isinstance(exc, Forbidden):
        return (f"{remote.url} refused: the token from {remote.token_source or 'nowhere'} "
                f"lacks the role for this (403: {exc})", EXIT_FAILED)
    if isinstance(exc, ApiUnavailable):
        return (f"cannot reach an ax server at {remote.url} (is it running? check --server "
                f"or ${ENV_SERVER}): {exc}", EXIT_FAILED)
    return str(exc), EXIT_FAILED


def with_client(remote: Remote, op: Callable[[Client], int]) -> int:
    """Run ``op`` with a client of ``remote``; a refusal (401, 403, any error answer)
    or an unreachable server becomes one line on stderr and exit code 1."""
    from axengine.client import Client

    try:
        with Client(remote.url, remote.token, retry_for=REMOTE_RETRY_FOR) as client:
            return op(client)
    except AxError as exc:
        message, code = explain(remote, exc)
        return fail(message, code)

