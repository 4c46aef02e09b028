"""``send_email``: send one email, at most once per (task, node, input revision).

Input: ``{"to": "a@x" | ["a@x", ...], "cc": ..., "bcc": ..., "subject": "...",
"body": "..."}`` (``cc`` and ``bcc`` optional, like ``to``; a non-string body is sent as
indented JSON).

Recipients are policy (:mod:`executors.policy`): under api trust, mail that leaves the
host (``smtp_url`` set) goes only to addresses matching ``mail_allowed_recipients``
(addresses and ``@domain`` entries); any other recipient fails the node without retry,
before any connection. The local mailbox (no ``smtp_url``) keeps mail on the executor's
disk and is not restricted.

Idempotency goes through the outbox record ``email:{task}:{node}:{input revision}``:

- ``DONE`` already → ``{"status": "already_sent", ...}``; nothing is sent.
- ``NEW`` → the transport is opened first (so a refused connection costs nothing and
  simply retries), then the record moves to SENDING, the message goes out, and the
  record becomes DONE with the message id → ``{"status": "sent", ...}``.
- ``SENDING``/``UNKNOWN`` → an earlier attempt died between "sending" and "done": the
  message may or may not have left. A transport that can tell (the local mailbox, where a
  message is stored under its Message-ID) settles it: delivered → recorded DONE, not
  delivered → sent now. SMTP cannot tell: the tool fails *without retry* and says so; a
  person checks the mailbox. It never sends twice.

Transport: SMTP when the ``smtp_url`` setting is set (``smtp://[user:pass@]host[:port]``
or ``smtps://...``; ``smtp_timeout`` seconds, default 30); otherwise an ``.eml`` file in
the local mailbox directory ``mail_dir`` (default ``.ax/mail``), which is what the
embedded demo uses. ``mail_from`` sets the sender (default ``ax@localhost``).
"""

from __future__ import annotations

import hashlib
import json
import os
import smtplib
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from email.utils import formatdate
from pathlib import Path
from typing import Any, Protocol

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from executors.policy import Policy, PolicyError

__all__ = ["DEFAULT_MAIL_DIR", "DEFAULT_MAIL_FROM", "DEFAULT_SMTP_TIMEOUT", "send_email"]

#: Local mailbox directory used when no ``smtp_url`` is configured (setting ``mail_dir``).
DEFAULT_MAIL_DIR = ".ax/mail"
#: Sender address (setting ``mail_from``).
DEFAULT_MAIL_FROM = "ax@localhost"
#: Seconds for SMTP connect and commands (setting ``smtp_timeout``).
DEFAULT_SMTP_TIMEOUT = 30.0


class _BadInput(ValueError):
    pass


class _Transport(Protocol):
    name: str

    #: True when ``lookup`` can tell for sure whether a message was delivered.
    verifiable: bool

    def send(self, message: EmailMessage, recipients: Sequence[str]) -> dict[str, Any]: ...

    def lookup(self, message: EmailMessage) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


def send_email(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Send the email described by the node input, at most once."""
    key = f"email:{request.task_id}:{request.node_id}:{request.input_revision}"
    try:
        message, recipients = _message(request.input, key, ctx.settings)
        # Before the outbox and the connection: a refused recipient costs nothing.
        Policy.from_settings(ctx.settings, "send_email").check_recipients(
            recipients, leaves_host=bool(ctx.settings.get("smtp_url")))
    except (_BadInput, PolicyError) as exc:
        return Failure(f"node {request.node_id!r}: {exc}", retryable=False)
    effect = ctx.effect(key)
    # Peek first: an email already sent needs no SMTP connection at all.
    if effect.state() == "DONE":
        return Success(_already_sent(key, effect.result()))
    try:
        transport = _open(ctx.settings)
    except ValueError as exc:
        return Failure(f"node {request.node_id!r}: {exc}", retryable=False)
    except PermissionError as exc:
        # The local mailbox is out of this process's reach: no retry changes that.
        return Failure(f"node {request.node_id!r}: the mailbox directory is not writable "
                       f"by this node process (uid {os.geteuid()}): {exc}; set "
                       "handlers.mail_dir (or --home) to a directory it can reach",
                       retryable=False)
    except (OSError, smtplib.SMTPException) as exc:
        # Nothing was begun, so nothing can have been sent: a plain retry is safe.
        return Failure(f"cannot reach the mail server for {key}: {exc}", retryable=True)
    try:
        prior = effect.begin()
        if prior == "DONE":
            return Success(_already_sent(key, effect.result()))
        if prior != "NEW":
            # An earlier attempt died mid-send. Ask the transport whether the message
            # was delivered; only a transport that can tell (the local mailbox, where
            # delivery is keyed by Message-ID) lets us settle it without a person.
            delivered = transport.lookup(message)
            if delivered is not None:
                result = {"message_id": message["Message-ID"], "transport": transport.name,
                          "verified": True, **delivered}
                effect.done(result)
                return Success(_already_sent(key, result))
            if not transport.verifiable:
                return _unknown(key, f"an earlier attempt left the outbox record {prior}")
        try:
            result = transport.send(message, recipients)
        except (OSError, smtplib.SMTPException) as exc:
            return _unknown(key, f"sending failed midway ({type(exc).__name__}: {exc})")
        result = {"message_id": message["Message-ID"], "transport": transport.name, **result}
        effect.done(result)
    finally:
        transport.close()
    return Success({"status": "sent", "idempotency_key": key, **result})


def _already_sent(key: str, result: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"status": "already_sent", "idempotency_key": key, **dict(result or {})}


def _unknown(key: str, why: str) -> Failure:
    return Failure(
        f"email outcome unknown after a crash (idempotency key {key}; {why}): check the "
        "mailbox or the mail server log for this Message-ID, then mark the effect done or "
        "retry the node by hand; ax will not send it again on its own",
        retryable=False,
        details={"effect": "UNKNOWN", "idempotency_key": key},
    )


def _recipients(value: Any, field: str = "to") -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Sequence) or isinstance(items, str | bytes) or not items:
        raise _BadInput(f"{field!r} must be an address or a non-empty list of addresses")
    addresses = []
    for item in items:
        if (
            not isinstance(item, str)
            or "@" not in item
            or any(c.isspace() for c in item.strip())
            or "," in item
        ):
            raise _BadInput(f"not an email address: {item!r}")
        addresses.append(item.strip())
    return addresses


def _message(
    spec: Any, key: str, settings: Mapping[str, Any]
) -> tuple[EmailMessage, list[str]]:
    """The message and its envelope recipients (to, cc and bcc)."""
    if not isinstance(spec, Mapping):
        raise _BadInput(
            f"send_email input must be a mapping with to/subject/body, got {type(spec).__name__}"
        )
    to = _recipients(spec.get("to"))
    cc = _recipients(spec["cc"], "cc") if spec.get("cc") else []
    bcc = _recipients(spec["bcc"], "bcc") if spec.get("bcc") else []
    subject = spec.get("subject", "")
    if not isinstance(subject, str) or "\n" in subject or "\r" in subject:
        raise _BadInput("'subject' must be a single line of text")
    body = spec.get("body", "")
    if not isinstance(body, str):
        body = json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False)
    domain = str(settings.get("mail_from", DEFAULT_MAIL_FROM)).rpartition("@")[2] or "localhost"
    message = EmailMessage()
    message["From"] = str(settings.get("mail_from", DEFAULT_MAIL_FROM))
    message["To"] = ", ".join(to)
    if cc:
        message["Cc"] = ", ".join(cc)
    message["Subject"] = subject
    message["Date"] = formatdate(localtime=False)
    # Derived from the idempotency key, so even a human-approved resend is recognisable
    # as the same message by the receiving side.
    message["Message-ID"] = f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}@{domain}>"
    message["X-Ax-Idempotency-Key"] = key
    message.set_content(body)
    # Bcc stays out of the headers; the envelope carries it.
    return message, [*to, *cc, *bcc]


def _open(settings: Mapping[str, Any]) -> _Transport:
    url = settings.get("smtp_url")
    if url:
        return _Smtp(str(url), float(settings.get("smtp_timeout", DEFAULT_SMTP_TIMEOUT)))
    return _Mailbox(Path(str(settings.get("mail_dir", DEFAULT_MAIL_DIR))))


class _Smtp:
    name = "smtp"
    verifiable = False

    def __init__(self, url: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ValueError(f"the smtp_url setting must look like smtp://host:port, got {url!r}")
        cls = smtplib.SMTP_SSL if parts.scheme == "smtps" else smtplib.SMTP
        port = parts.port or (465 if parts.scheme == "smtps" else 25)
        self._conn = cls(parts.hostname, port, timeout=timeout)
        try:
            self._conn.ehlo_or_helo_if_needed()
            if parts.username:
                self._conn.login(
                    urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
                )
        except BaseException:
            self._conn.close()
            raise

    def send(self, message: EmailMessage, recipients: Sequence[str]) -> dict[str, Any]:
        # The envelope is exactly the checked list: never re-derived from the headers.
        refused = self._conn.send_message(message, to_addrs=list(recipients))
        return {"refused": sorted(refused)} if refused else {}

    def lookup(self, message: EmailMessage) -> dict[str, Any] | None:
        # SMTP cannot say whether an earlier session delivered a message.
        return None

    def close(self) -> None:
        try:
            self._conn.quit()
        except (OSError, smtplib.SMTPException):
            self._conn.close()


class _Mailbox:
    name = "mailbox"
    verifiable = True

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory

    def _target(self, message: EmailMessage) -> Path:
        name = hashlib.sha256(str(message["Message-ID"]).encode()).hexdigest()[:24] + ".eml"
        return self._dir / name

    def lookup(self, message: EmailMessage) -> dict[str, Any] | None:
        target = self._target(message)
        return {"path": str(target)} if target.exists() else None

    def send(self, message: EmailMessage, recipients: Sequence[str]) -> dict[str, Any]:
        target = self._target(message)
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(message.as_bytes())
            # Appears whole or not at all, like a delivered message.
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return {"path": str(target)}

    def close(self) -> None:
        return None
