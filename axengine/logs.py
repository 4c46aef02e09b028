"""Log output of the long-running processes (``ax server``, ``ax api``, ``ax executor``).

:func:`configure` installs one stderr handler on the root logger, in one of two formats
(``log_format``, docs/observability.md#logs):

- ``text``: ``2024-05-01 12:00:00,123 INFO axengine.executor: claimed t-1/a ...``;
- ``json``: one object per line, ``{"time", "level", "logger", "message"}`` plus
  ``exception`` for a traceback and the record's structured fields (the access log's).

The API's access log (:func:`log_access`, logger :data:`ACCESS_LOGGER`) writes one INFO
line per HTTP request. It is switched by ``access_log``, not by the log level: at the
default level (warning) it still shows. It never holds a header, a query string or a
body, so no token or payload reaches it.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["ACCESS_LOGGER", "LOG_FORMATS", "JsonFormatter", "configure", "log_access"]

#: The API's access log: one INFO record per HTTP request.
ACCESS_LOGGER = "axengine.api.access"
#: Values of ``log_format``.
LOG_FORMATS = ("text", "json")
#: The ``text`` format.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Longest path kept in an access line (a URL may be kilobytes long).
MAX_LOGGED_PATH = 512
#: Record attribute holding structured fields (``extra={FIELDS: {...}}``).
FIELDS = "ax_fields"

_access = logging.getLogger(ACCESS_LOGGER)
_installed: logging.Handler | None = None


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, the
    record's structured fields and, when there is one, the exception's traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, Mapping):
            entry.update({k: v for k, v in fields.items() if k not in entry})
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class _Stderr(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a record comes (not when the handler
    was made), so a replaced or captured stderr is followed."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure(*, level: str = "warning", log_format: str = "text",
              access_log: bool = True) -> None:
    """Send every record at ``level`` or above to stderr in ``log_format``, and the
    access log's INFO records when ``access_log`` is on. Calling it again replaces
    what the previous call installed.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error`` (any case).
        log_format: One of :data:`LOG_FORMATS`.
        access_log: Emit the access log whatever ``level`` is.
    """
    global _installed
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r} (use one of "
                         f"{', '.join(LOG_FORMATS)})")
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    handler = _Stderr()
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())
    _installed = handler
    # Its own level: the access log shows at the default level (warning) too.
    _access.setLevel(logging.INFO)
    _access.disabled = not access_log


def log_access(*, method: str, path: str, route: str, status: int, seconds: float,
               client: str, principal: str) -> None:
    """One access line: ``GET /v1/tasks/t-1 200 3.1ms route=/v1/tasks/{task_id}
    client=127.0.0.1 principal=alice`` (``-`` for an unknown principal)."""
    if not _access.isEnabledFor(logging.INFO):
        return
    fields = {"method": method, "path": path[:MAX_LOGGED_PATH], "route": route,
              "status": status, "duration_ms": round(seconds * 1000, 3),
              "client": client or "-", "principal": principal or "-"}
    _access.info("%s %s %d %.1fms route=%s client=%s principal=%s", method,
                 fields["path"], status, fields["duration_ms"], route, fields["client"],
                 fields["principal"], extra={FIELDS: fields})
