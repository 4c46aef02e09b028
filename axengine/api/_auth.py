"""Bearer tokens with roles, read from a tokens file (``deploy/tokens.example.yaml``).

A presented token is hashed with sha256 and compared with every known hash using
:func:`hmac.compare_digest`, so neither the comparison nor the loop leaks which entry
(or how much of it) matched. The file may hold the hash (``token_sha256``, preferred)
or the token itself (``token``, hashed on load).

Roles (``Role``) and what they allow are listed in :data:`RULES`; read operations accept
any role. :class:`Authenticator` is shared by the REST and gRPC adapters: both call
:meth:`Authenticator.authorize` with the raw ``Authorization`` value and the operation's
rule, and map the :class:`~axengine.errors.Unauthorized` /
:class:`~axengine.errors.Forbidden` it raises through the error table.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from axengine.errors import Forbidden, InputError, Unauthorized
from axengine.owners import LOCAL_PRINCIPAL

__all__ = [
    "ANONYMOUS",
    "RULES",
    "Authenticator",
    "Principal",
    "Role",
    "check_tokens_file_mode",
    "load_tokens",
]


class Role(StrEnum):
    """What a token may do."""

    SUBMIT = "submit"
    APPROVE = "approve"
    ADMIN = "admin"
    EXECUTOR = "executor"
    #: Submit with ``lane: fast`` nodes or a priority above the default (0): jumping
    #: the queue is a privilege, or one submitter can starve everyone else.
    EXPEDITE = "expedite"


ALL_ROLES = frozenset(Role)

#: Roles accepted per kind of operation (an operation names its kind).
RULES: Mapping[str, frozenset[Role]] = {
    "read": ALL_ROLES,
    "submit": frozenset({Role.SUBMIT, Role.ADMIN}),
    "approve": frozenset({Role.APPROVE, Role.ADMIN}),
    "admin": frozenset({Role.ADMIN}),
    "executor": frozenset({Role.EXECUTOR}),
    "expedite": frozenset({Role.EXPEDITE, Role.ADMIN}),
}

log = logging.getLogger("axengine.api.auth")

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@:-]{1,128}$")
_FIELDS = frozenset({"name", "token", "token_sha256", "roles"})


@dataclass(frozen=True)
class Principal:
    """Who made a request: the token's name and its roles."""

    name: str
    roles: frozenset[Role]


#: The principal of every request when authentication is off.
ANONYMOUS = Principal("anonymous", ALL_ROLES)


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    digest: bytes


def _sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _entry(raw: Any, index: int, file: str) -> _Entry:
    where = f"{file}: tokens[{index}]"
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping with name, token_sha256 and roles")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(unknown)} "
                         f"(allowed: {', '.join(sorted(_FIELDS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"{where}: `name` must be 1-128 letters, digits or _ . @ : -")
    if name == LOCAL_PRINCIPAL:
        # Tasks of the embedded engine are submitted by 'local'; an executor running
        # with trust 'local' lends local trust to exactly those. A token by that name
        # would borrow it.
        raise InputError(f"{where}: the name {LOCAL_PRINCIPAL!r} is reserved for the "
                         "embedded engine's own tasks; choose another")
    has_hash, has_token = "token_sha256" in raw, "token" in raw
    if has_hash == has_token:
        raise InputError(f"{where} ({name}): give exactly one of token_sha256 or token")
    if has_hash:
        value = str(raw["token_sha256"]).strip().lower()
        if not _HEX64.match(value):
            raise InputError(f"{where} ({name}): token_sha256 must be 64 hex digits "
                             "(printf %s \"$TOKEN\" | sha256sum)")
        digest = bytes.fromhex(value)
    else:
        token = raw["token"]
        if not isinstance(token, str) or len(token) < 16:
            raise InputError(f"{where} ({name}): token must be a string of 16+ characters")
        digest = _sha256(token)
    roles_raw = raw.get("roles")
    if not isinstance(roles_raw, list) or not roles_raw:
        raise InputError(f"{where} ({name}): `roles` must be a non-empty list of "
                         f"{', '.join(r.value for r in Role)}")
    roles: set[Role] = set()
    for role in roles_raw:
        try:
            roles.add(Role(role))
        except ValueError:
            raise InputError(f"{where} ({name}): unknown role {role!r} (use "
                             f"{', '.join(r.value for r in Role)})") from None
    return _Entry(Principal(name, frozenset(roles)), digest)


def check_tokens_file_mode(file: str, mode: int, *, allow_insecure: bool = False) -> None:
    """Refuse a tokens file that group or others may read or write.

    Raises:
        InputError: ``mode`` has group/other bits and ``allow_insecure`` is false; the
            message names the file and the ``chmod 600`` fix.
    """
    if not mode & 0o077:
        return
    what = f"tokens file {file} is accessible by group or others (mode {mode & 0o777:04o})"
    if not allow_insecure:
        raise InputError(f"{what}: anyone who can read it can replay the tokens in it. "
                         f"Fix it with `chmod 600 {file}` (or pass "
                         "--allow-insecure-tokens-file to accept it anyway)")
    log.warning("%s; accepted because --allow-insecure-tokens-file was given", what)


def load_tokens(path: str | os.PathLike[str], *,
                allow_insecure: bool = False) -> Authenticator:
    """Read a tokens file.

    Args:
        path: The YAML file.
        allow_insecure: Accept (with a warning) a file group or others may access.

    Raises:
        InputError: The file cannot be read, is malformed (the message names the entry
            and the field), or is readable or writable by group or others.
    """
    file = os.fspath(path)
    try:
        with open(file, encoding="utf-8") as fh:
            # The mode of the file actually opened (no window for a swap after a stat).
            check_tokens_file_mode(file, os.fstat(fh.fileno()).st_mode,
                                   allow_insecure=allow_insecure)
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise InputError(f"cannot read tokens file {file}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"tokens file {file} is not valid YAML: {exc}") from exc
    if isinstance(data, Mapping):
        extra = sorted(set(data) - {"tokens"})
        if extra:
            raise InputError(f"{file}: unknown top-level field(s) {', '.join(extra)}")
        data = data.get("tokens")
    if not isinstance(data, list) or not data:
        raise InputError(f"{file}: expected `tokens:` with a non-empty list of entries")
    return Authenticator([_entry(raw, i, file) for i, raw in enumerate(data)], source=file)


class Authenticator:
    """Checks ``Authorization: Bearer <token>`` values against known token hashes."""

    def __init__(self, entries: Iterable[_Entry], *, source: str = "<tokens>") -> None:
        self._entries = tuple(entries)
        self.source = source
        names = [e.principal.name for e in self._entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InputError(f"{source}: duplicate token name(s) {', '.join(dup)}")
        digests = [e.digest for e in self._entries]
        if len(set(digests)) != len(digests):
            raise InputError(f"{source}: two entries have the same token")

    @classmethod
    def from_tokens(cls, tokens: Mapping[str, tuple[str, Iterable[str]]]) -> Authenticator:
        """Build from ``{token: (name, roles)}`` (tests, embedding)."""
        return cls(
            [_Entry(Principal(name, frozenset(Role(r) for r in roles)), _sha256(token))
             for token, (name, roles) in tokens.items()],
            source="<inline>",
        )

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value.

        Raises:
            Unauthorized: No bearer token, or one that matches no entry.
        """
        if not authorization:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("malformed Authorization header: expected 'Bearer <token>'")
        digest = _sha256(token)
        found: Principal | None = None
        for entry in self._entries:
            # Compare with every entry (no early exit): timing says nothing about which.
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        if found is None:
            raise Unauthorized("unknown bearer token")
        return found

    @staticmethod
    def check(principal: Principal, rule: str) -> Principal:
        """Require one of the roles of ``rule`` (a key of :data:`RULES`).

        Raises:
            Forbidden: The principal has none of them.
        """
        allowed = RULES[rule]
        if principal.roles & allowed:
            return principal
        wanted = " or ".join(sorted(r.value for r in allowed))
        have = ", ".join(sorted(r.value for r in principal.roles)) or "none"
        raise Forbidden(f"{principal.name!r} may not do this: it needs role {wanted} "
                        f"(has {have})")

    def authorize(self, authorization: str | None, rule: str) -> Principal:
        """:meth:`authenticate`, then :meth:`check`."""
        return self.check(self.authenticate(authorization), rule)
