"""``pdf_parser``: extract the text of a PDF with pypdf.

Input: a path (relative paths resolve against the worker's current directory), a
``file:`` URI, or an http(s) URL — as a string, or as a mapping with ``url``, ``path``
or ``pdf_url``. What may be read is the policy's (:mod:`executors.policy`): under api
trust, local files only under ``input_root`` and URLs only to public addresses; a
refused source is reported as ``status: failed`` with a message that reveals nothing of
the file (no hash, no size, not whether it exists).

Output on success::

    {"status": "success", "text": "...", "pages": 3, "sha256": "<of the PDF bytes>",
     "source": "<as given>"}

A missing, oversized, corrupt, encrypted or text-less PDF is a *business* result,
``{"status": "failed", "error": "...", "source": ...}``, so the DAG can route it (to an
alert, say). Only transient trouble fetching a URL (connection refused, 5xx) is an
error that retries.

Settings: ``pdf_max_bytes`` (default 20 MiB), ``pdf_timeout`` (seconds, default 60),
and the policy's (``trust``, ``input_root``, ``egress_allowed_hosts``,
``egress_private_allowed``, also under ``tool_policy.pdf_parser``).
"""

from __future__ import annotations

import hashlib
import io
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from executors.keepalive import Keepalive
from executors.policy import FileRefused, Policy, PolicyError
from executors.tools._common import heartbeat_interval, read_bounded, stopped

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT", "pdf_parser"]

#: Largest PDF accepted (setting ``pdf_max_bytes``).
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
#: Seconds to fetch a PDF over HTTP (setting ``pdf_timeout``).
DEFAULT_TIMEOUT = 60.0


class _Rejected(Exception):
    """The PDF cannot be used: reported as ``status: failed``."""


class _Transient(Exception):
    """Fetching failed in a way another attempt may fix."""


def pdf_parser(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Extract the text of the PDF named by the node input."""
    source = _source(request.input)
    if source is None:
        return Failure(
            f"node {request.node_id!r}: pdf_parser input must be a path, file: URI or "
            f"http(s) URL (or a mapping with 'url'/'path'/'pdf_url'), got "
            f"{type(request.input).__name__}",
            retryable=False,
        )
    limit = int(ctx.settings.get("pdf_max_bytes", DEFAULT_MAX_BYTES))
    try:
        policy = Policy.from_settings(ctx.settings, "pdf_parser")
    except PolicyError as exc:
        return Failure(f"node {request.node_id!r}: {exc}", retryable=False)
    try:
        data = _load(source, policy, ctx.settings, limit)
    except _Rejected as exc:
        return Success(_failed(source, str(exc)))
    except _Transient as exc:
        return Failure(f"fetching {source}: {exc}", retryable=True)
    digest = hashlib.sha256(data).hexdigest()
    try:
        return _extract(data, source, digest, ctx)
    except _Rejected as exc:
        return Success(_failed(source, str(exc), sha256=digest))


def _source(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = next((value[k] for k in ("url", "path", "pdf_url") if k in value), None)
    return value.strip() if isinstance(value, str) else None


def _failed(source: str, error: str, **extra: Any) -> dict[str, Any]:
    return {"status": "failed", "error": error, "source": source, **extra}


def _load(source: str, policy: Policy, settings: Mapping[str, Any], limit: int) -> bytes:
    if not source:
        raise _Rejected("no PDF given (empty input): check the task's pdf_url")
    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if scheme in ("http", "https"):
        return _fetch(source, policy, settings, limit)
    if scheme == "file":
        parts = urllib.parse.urlsplit(source)
        if parts.netloc not in ("", "localhost"):
            raise _Rejected(f"file: URI on another host {parts.netloc!r} is not supported")
        path = urllib.request.url2pathname(urllib.parse.unquote(parts.path))
    elif len(scheme) > 1:  # a one-letter "scheme" is a Windows drive letter
        raise _Rejected(f"unsupported URL scheme {scheme!r}: use a path, file: or http(s)")
    else:
        path = source
    try:
        return policy.read_file(path, limit, limit_setting="pdf_max_bytes")
    except FileRefused as exc:
        raise _Rejected(str(exc)) from None


def _fetch(url: str, policy: Policy, settings: Mapping[str, Any], limit: int) -> bytes:
    timeout = float(settings.get("pdf_timeout", DEFAULT_TIMEOUT))
    request = urllib.request.Request(url, headers={"Accept": "application/pdf"})
    try:
        with policy.opener().open(request, timeout=timeout) as response:
            data = read_bounded(response, limit)
    except PolicyError as exc:  # EgressDenied, or not a usable URL
        raise _Rejected(str(exc)) from None
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            raise _Transient(f"HTTP {exc.code} {exc.reason}") from exc
        raise _Rejected(f"GET {url} answered HTTP {exc.code} {exc.reason}") from exc
    except OSError as exc:
        raise _Transient(f"unreachable: {getattr(exc, 'reason', exc)}") from exc
    if data is None:
        raise _Rejected(f"{url} is over the {limit}-byte limit (pdf_max_bytes)")
    return data


def _extract(data: bytes, source: str, digest: str, ctx: NodeContext) -> Outcome:
    # Imported here so that listing tools (DAG validation) does not load pypdf.
    from pypdf import PdfReader

    keepalive = Keepalive(ctx, interval=heartbeat_interval(ctx))
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise _Rejected("the PDF is encrypted with a password")
        count = len(reader.pages)
    except _Rejected:
        raise
    except Exception as exc:  # pypdf raises many types for broken files
        raise _Rejected(f"not a readable PDF: {type(exc).__name__}: {exc}") from None
    if count == 0:
        raise _Rejected("the PDF has no pages")
    texts = []
    for number, page in enumerate(reader.pages, start=1):
        try:
            texts.append(page.extract_text() or "")
        except Exception as exc:
            raise _Rejected(
                f"page {number}/{count} is unreadable: {type(exc).__name__}: {exc}"
            ) from None
        if not ctx.progress(f"page {number}/{count}") or not keepalive():
            return stopped()
    text = "\n".join(texts).strip()
    if not text:
        raise _Rejected(
            f"no extractable text in {count} page(s): a scanned image PDF needs OCR first"
        )
    return Success(
        {"status": "success", "text": text, "pages": count, "sha256": digest, "source": source}
    )
