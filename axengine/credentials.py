"""Secrets in connection URLs: masking them for display and reading them from files.

Standard library only, so the store and queue settings modules can use it without
loading any client. One copy for every URL ax prints (store, queue, API addresses).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

__all__ = ["MASK", "masked_repr", "read_secret", "redact_url"]

#: What replaces a secret in ``repr`` and in redacted URLs.
MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part replaced by ``***``.

    Use it wherever a URL is printed or logged: ``etcd://ax:s3cret@h:2379`` becomes
    ``etcd://ax:***@h:2379``. Other parts (hosts, ``password_file`` paths) are kept. A
    password with unescaped ``/``, ``?`` or ``@`` is masked too: when in doubt, more of
    the URL is masked, never less.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    head, question, query = rest.partition("?")
    if "@" in head:
        userinfo, _, tail = head.rpartition("@")
        tail += question + query
    else:  # an unescaped "?" in the password
        userinfo, _, tail = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not colon:
        return url
    return f"{scheme}://{user}:{MASK}@{tail}"


def read_secret(path: str, what: str) -> str:
    """The secret stored in the file ``path``, without its trailing line break.

    Args:
        path: File holding the secret (a Docker/Kubernetes secret mount, for instance).
        what: What the secret is, for the error message (``"etcd password_file"``).

    Raises:
        ValueError: The file cannot be read or is empty; the message names the file,
            never its content.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ValueError(f"cannot read the {what} {path}: {reason}") from None
    secret = text.removesuffix("\n").removesuffix("\r")
    if not secret:
        raise ValueError(f"the {what} {path} is empty")
    return secret


def read_token_file(path: str | Path, what: str) -> str:
    """The bearer token in a token file: its first line that is neither blank nor a
    ``#`` comment, stripped.

    Args:
        path: The file.
        what: How the caller names it, for the error message (``"--token-file"``).

    Raises:
        ValueError: The file cannot be read or holds no token; the message names
            ``what`` and the file, never its content.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    raise ValueError(f"{what} {path} holds no token")


def masked_repr(settings: object, secrets: tuple[str, ...]) -> str:
    """``Name(field=value, ...)`` of a settings dataclass with ``secrets`` shown as ``***``."""
    parts = []
    for f in fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, f.name)
        shown = MASK if f.name in secrets and value is not None else repr(value)
        parts.append(f"{f.name}={shown}")
    return f"{type(settings).__name__}({', '.join(parts)})"
