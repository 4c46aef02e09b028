"""Tests of the DAG language: loader, validator, graph rendering, ``ax validate|graph``.

``TOOLS`` and ``MODELS`` are passed explicitly where a test is about the validator
itself, so it does not depend on which handlers the executors package registers.
"""

from __future__ import annotations

TOOLS = frozenset({"pdf_parser", "http_request", "send_email", "video_vendor", "echo", "sleep"})
MODELS = frozenset({
    "gpt-4-turbo", "gpt-4o", "gpt-4o-mini", "gpt-3.5-turbo", "sim-small", "sim-large",
    "moderation-v1", "moderation-lite",
})
