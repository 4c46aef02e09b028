"""How a prompt is put together and what format it asks for.

Shared by the handler (to check answers) and the simulated model (to produce them), so
both read a prompt the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "INPUT_MARKER",
    "asks_for_json",
    "compose_prompt",
    "requested_choices",
    "requested_keys",
    "split_prompt",
]

#: Separates the rendered prompt from the node input appended to it.
INPUT_MARKER = "\n\nInput:\n"

_JSON_WORD = re.compile(r"\bJSON\b", re.IGNORECASE)
_KEYS = re.compile(r"JSON\b[^\n:]*?\bkeys?\b\s*:?\s*([^\n]+)", re.IGNORECASE)
_CHOICES = re.compile(
    r"\b(?:return|answer|reply)\s+(?:with\s+)?one\s+of\s*:?\s*([^\n]+)", re.IGNORECASE
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def compose_prompt(prompt: str, node_input: Any) -> str:
    """The text sent to the model: the rendered prompt, then the node input if any.

    A string input is appended as is; any other JSON value as indented JSON.
    """
    if node_input is None or node_input == "":
        return prompt
    text = node_input if isinstance(node_input, str) else json.dumps(
        node_input, indent=2, sort_keys=True, ensure_ascii=False
    )
    return f"{prompt.rstrip()}{INPUT_MARKER}{text}"


def split_prompt(full: str) -> tuple[str, str | None]:
    """``(instructions, input)`` of a composed prompt (input None when there is none)."""
    if INPUT_MARKER not in full:
        return full, None
    head, tail = full.rsplit(INPUT_MARKER, 1)
    return head, tail


def asks_for_json(prompt: str) -> bool:
    """True when the instructions mention JSON, so prose is a malformed answer."""
    return bool(_JSON_WORD.search(prompt))


def requested_keys(prompt: str) -> tuple[str, ...]:
    """Keys named by "Return JSON with keys: a, b, c." (empty when there is no such line)."""
    return _names_after(_KEYS, prompt)


def requested_choices(prompt: str) -> tuple[str, ...]:
    """Labels named by "Return one of: A, B, C." (empty when there is no such line)."""
    return _names_after(_CHOICES, prompt)


def _names_after(pattern: re.Pattern[str], prompt: str) -> tuple[str, ...]:
    match = pattern.search(prompt)
    if match is None:
        return ()
    # The list ends at the first sentence break: "keys: a, b, c. Use null if unknown."
    segment = re.split(r"\.(?:\s|$)", match.group(1), maxsplit=1)[0]
    names = (n for n in _NAME.findall(segment) if n.lower() not in {"and", "or"})
    return tuple(dict.fromkeys(names))
