"""Limits on the JSON values callers hand to ax, checked at the door.

Task inputs, retry overrides, executor outputs, failure details and effect results are
stored and later served back by every read path (REST and gRPC task views, lists,
events, watch). A value that can be stored but not read back poisons every later read of
its task — a 300-level nesting made ``GET /v1/tasks`` answer 500 for every caller — so
one checker decides what is accepted, before anything is stored:

- standard JSON only: objects with string keys, arrays, strings, finite numbers,
  booleans and null (no NaN or infinities, no tuples, no other Python objects);
- at most :data:`MAX_JSON_DEPTH` nested containers;
- at most :data:`MAX_JSON_BYTES` bytes of canonical JSON.

Text is parsed with :func:`parse_json_text`, which refuses ``NaN``/``Infinity`` literals
and turns the parser's own ``RecursionError`` on absurd nesting (100,000 levels) into an
:class:`~axengine.errors.InputError` instead of a crash. Every refusal names the field
and the limit.

Values are written with :func:`canonical_json`, ax's one canonical JSON text (sorted keys,
compact, UTF-8, no NaN or infinities): what is hashed, stored and compared.

Task labels are checked by :func:`check_labels`: keys a label selector can name, values
of printable text, a bounded number of each, and the ``ax.`` prefix kept for ax's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import sys
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from axengine.errors import InputError

__all__ = [
    "MAX_COMMENT",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_LABELS",
    "FileTooLarge",
    "NotRegularFile",
    "canonical_bytes",
    "canonical_json",
    "canonical_list",
    "canonical_parts",
    "check_json_value",
    "check_labels",
    "checked_parts",
    "finite_float",
    "finite_number",
    "is_utf8",
    "json_depth",
    "keep_text",
    "kept_text",
    "known_text",
    "parse_json_text",
    "past_int_digits",
    "read_regular",
    "sha256_json",
    "short_repr",
]

#: Most nested containers (objects/arrays) in one value. The readers of a value recurse
#: per level — FastAPI's ``jsonable_encoder`` several frames per level, protobuf's
#: Struct two messages per level under its recursion limit of 100 — so 64 keeps the
#: deepest accepted value far from the interpreter's recursion limit (1,000) on every
#: read path; it is also the DAG loader's nesting limit, so one number rules both.
MAX_JSON_DEPTH = 64

#: Largest value (canonical JSON, UTF-8 bytes); the engine's default task-input limit
#: and the API's default gRPC message size, so anything accepted can be sent back.
MAX_JSON_BYTES = 8 * 1024 * 1024
#: Largest checkpoint a run may save (it lives in the node's snapshot; large state
#: belongs in the user's own store, the checkpoint naming it).
MAX_CHECKPOINT_BYTES = 64 * 1024

_SCALARS = (str, int, float, bool, type(None))

_CANONICAL = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False,
                              allow_nan=False)


def canonical_json(value: Any, field: str = "value") -> str:
    """Render a JSON value the way ax stores and hashes it.

    Compact separators, sorted keys, UTF-8 text (no ``\\u`` escapes for non-ASCII), and
    no NaN or infinities, so equal values always give equal text.

    Args:
        value: The value.
        field: What the caller calls it, for the error message.

    Raises:
        InputError: ``value`` holds a NaN or an infinity, an integer past Python's
            int-to-text digit limit, or something JSON cannot represent (a set, bytes,
            object keys of mixed types...); the message names ``field``.
    """
    try:
        return _CANONICAL.encode(value)
    except RecursionError:
        raise InputError(f"{field} is nested too deeply to write as JSON") from None
    except (ValueError, TypeError) as exc:
        raise InputError(f"{field} is not standard JSON: {_why_not_json(exc)}") from None


#: Canonical texts known already, by ``id(value)``: each with its value (which keeps the
#: id from being reused, and is checked by identity) and its members' texts.
KnownTexts = Mapping[int, tuple[Any, str, dict[str, str] | None]]


def canonical_parts(value: Any, field: str = "value", known: KnownTexts | None = None,
                    ) -> tuple[str, dict[str, str] | None]:
    """:func:`canonical_json` of ``value`` and, for an object with text keys, the text of
    each member, the object's text being made from them: a writer that needs both (a
    snapshot's input and its per-key ``input_params``) encodes the value once. The value
    or a member found in ``known`` (by identity) is not encoded again.

    Raises:
        InputError: As :func:`canonical_json`.
    """
    found = known_text(value, known)
    if found is not None:
        return found[1], found[2]
    if type(value) is not dict or not all(type(key) is str for key in value):
        return canonical_json(value, field), None
    members = {key: found[1] if (found := known_text(item, known)) is not None
               else canonical_json(item, field) for key, item in value.items()}
    # What the encoder writes with sorted keys: "{" key ":" value, joined by ",", "}".
    text = "{" + ",".join(f"{_CANONICAL.encode(key)}:{members[key]}"
                          for key in sorted(members)) + "}"
    return text, members


def known_text(value: Any, known: KnownTexts | None,
               ) -> tuple[Any, str, dict[str, str] | None] | None:
    """The entry of ``known`` for this very ``value`` (its id, and the value itself:
    an id alone may be another object's by now), or None."""
    found = known.get(id(value)) if known is not None else None
    return found if found is not None and found[0] is value else None


def keep_text(holder: Any, value: Any, text: str, members: dict[str, str] | None) -> None:
    """Attach to ``holder`` — a frozen record that carries ``value``, such as a node's
    outcome — the canonical text of ``value`` and of its members (:func:`checked_parts`),
    for the one who hashes and stores it next (:func:`kept_text`). A holder without
    instance attributes (a subclass with ``__slots__``) keeps nothing."""
    with contextlib.suppress(AttributeError, TypeError):
        object.__setattr__(holder, "_canonical", (value, text, members))


def kept_text(holder: Any, value: Any) -> tuple[Any, str, dict[str, str] | None] | None:
    """What :func:`keep_text` attached to ``holder`` for this very ``value`` (an entry
    of :data:`KnownTexts`), or None."""
    found = getattr(holder, "__dict__", {}).get("_canonical")
    return found if found is not None and found[0] is value else None


def canonical_list(texts: Iterable[str]) -> str:
    """:func:`canonical_json` of a list, made from the canonical texts of its items
    (``[`` the items joined by ``,`` ``]``, as the encoder writes a list)."""
    return "[" + ",".join(texts) + "]"


#: Longest idempotency key, and the longest comment on a gate decision (the same on
#: every path: REST, gRPC, embedded).
MAX_IDEMPOTENCY_KEY = 256
MAX_COMMENT = 2000

#: Most labels on one task, and the longest key and value.
MAX_LABELS = 64
MAX_LABEL_KEY = 128
MAX_LABEL_VALUE = 256
#: What a label selector (``team=risk,env!=dev``) can name: a key of another shape could
#: be stored but never selected.
_LABEL_KEY = re.compile(r"[A-Za-z0-9_./-]+")
#: Label keys ax sets itself (``ax.forked_from``): a submitter cannot forge them.
RESERVED_LABEL_PREFIX = "ax."


def check_labels(labels: Mapping[str, str]) -> None:
    """Check a submitted task's labels.

    Raises:
        InputError: More than :data:`MAX_LABELS`; a key that is empty, longer than
            :data:`MAX_LABEL_KEY`, not made of letters, digits and ``_ . / -``, or
            starting with ``ax.``; a value that is not a string, longer than
            :data:`MAX_LABEL_VALUE`, or holding a control character or a lone surrogate.
    """
    if len(labels) > MAX_LABELS:
        raise InputError(f"labels: {len(labels)} labels; the limit is {MAX_LABELS}")
    for key, value in labels.items():
        shown = repr(key if len(key) <= 40 else key[:37] + "...")
        if not (isinstance(key, str) and 0 < len(key) <= MAX_LABEL_KEY
                and _LABEL_KEY.fullmatch(key)):
            raise InputError(f"labels: key {shown} must be 1 to {MAX_LABEL_KEY} letters, "
                             "digits and _ . / - (what a label selector can name)")
        if key.startswith(RESERVED_LABEL_PREFIX):
            raise InputError(f"labels: key {shown}: keys starting with "
                             f"{RESERVED_LABEL_PREFIX!r} are set by ax itself")
        if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE:
            raise InputError(f"labels.{key}: the value must be a string of at most "
                             f"{MAX_LABEL_VALUE} characters")
        if not value.isprintable():  # (a lone surrogate is not printable either)
            raise InputError(f"labels.{key}: the value must be printable text (no control "
                             "characters, line breaks or lone surrogates)")


def sha256_json(value: Any, field: str = "value") -> str:
    """sha256 hex of the canonical JSON of ``value`` (:func:`canonical_bytes`): the hash
    of an output or a rendered input the engine stores, and that a fixture's edits are
    hashed with again.

    Raises:
        InputError: As :func:`canonical_bytes`; the message names ``field``.
    """
    return hashlib.sha256(canonical_bytes(value, field)).hexdigest()


def canonical_bytes(value: Any, field: str = "value") -> bytes:
    """:func:`canonical_json` as UTF-8 bytes, what is stored and hashed.

    Raises:
        InputError: As :func:`canonical_json`; also for a lone surrogate (``"\\ud800"``,
            which JSON escapes can spell but UTF-8 cannot hold).
    """
    return json_text_bytes(canonical_json(value, field), field)


def json_text_bytes(text: str, field: str = "value") -> bytes:
    """The UTF-8 bytes of JSON text ``text`` (what :func:`canonical_json` wrote).

    Raises:
        InputError: A lone surrogate, which UTF-8 cannot hold; the message names
            ``field``.
    """
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InputError(f"{field} is not valid Unicode text: {exc.reason} at character "
                         f"{exc.start} of its JSON") from None


def past_int_digits(exc: BaseException) -> bool:
    """Whether ``exc`` is Python refusing to turn an integer of more than
    ``sys.get_int_max_str_digits()`` digits into text, or text into one."""
    return isinstance(exc, ValueError) and "integer string conversion" in str(exc)


def _why_not_json(exc: Exception) -> str:
    """The json module's complaint, in the terms of the value."""
    text = str(exc)
    if "Out of range float" in text:
        return "it holds NaN or an infinity"
    if past_int_digits(exc):
        return f"it holds an integer longer than {sys.get_int_max_str_digits()} digits"
    if "not supported between instances" in text:  # sort_keys over mixed key types
        return f"its object keys are not all strings ({text})"
    return text


def _refuse_constant(name: str) -> NoReturn:
    # json.loads calls this for NaN, Infinity and -Infinity, which are not JSON.
    raise ValueError(f"{name} is not a JSON number")


def finite_float(text: str) -> float:
    """``json.loads``' ``parse_float``: a number past a 64-bit float (``1e400``) is
    refused where it is read, not turned into an infinity that fails later."""
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ValueError(f"{shown} is out of range for a JSON number (a 64-bit float)")
    return value


class NotRegularFile(ValueError):
    """:func:`read_regular` was named a FIFO, a device or a directory."""


class FileTooLarge(ValueError):
    """:func:`read_regular` found more bytes than its limit."""


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, of at most ``max_bytes``.

    Opened without blocking and checked before anything is read, so a FIFO (which would
    wait for a writer for ever) or a device such as ``/dev/zero`` (which never ends) is
    refused, and at most ``max_bytes`` + 1 bytes are read whatever the file grows to.
    Callers word the errors in their own terms (an option, a configuration file).

    Raises:
        OSError: The file cannot be opened.
        NotRegularFile: It is not a regular file.
        FileTooLarge: It holds more than ``max_bytes`` bytes.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{os.fspath(path)} is not a regular file")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLarge(f"{os.fspath(path)} is larger than {max_bytes} bytes")
    return data


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (an int or a float, not a
    bool), else None — an integer too large for a float included, where
    ``math.isfinite`` would raise ``OverflowError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a message quoting a bad value
    (a 400-digit number need not fill the screen; one past Python's digit limit, which
    ``repr`` refuses, is named by its size)."""
    try:
        text = repr(value)
    except ValueError as exc:
        if not (isinstance(value, int) and past_int_digits(exc)):
            raise
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: not if it holds a lone surrogate (a
    JSON escape such as ``"\\ud800"``, or bytes that were not UTF-8 in a command line)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed value: 0 for a scalar, 1 for ``[]``, 2 for ``[[1]]``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def check_json_value(value: Any, field: str, *, max_depth: int = MAX_JSON_DEPTH,
                     max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """Check that ``value`` is storable, readable JSON; return its canonical bytes.

    The walk is iterative (a hostile value cannot exhaust the stack) and stops at the
    first level past ``max_depth``.

    Args:
        value: The parsed value.
        field: What the caller called it (``input``, ``output_json``...), for messages.
        max_depth: Most nested containers allowed.
        max_bytes: Largest canonical JSON allowed.

    Raises:
        InputError: Not standard JSON, nested deeper than ``max_depth`` or larger than
            ``max_bytes``; the message names ``field`` and the limit.
    """
    _check_tree(value, field, max_depth)
    data = canonical_bytes(value, field)  # the walk left the digit limit, surrogates
    if len(data) > max_bytes:
        raise InputError(f"{field} is {len(data)} bytes of JSON; the limit is {max_bytes}")
    return data


def checked_parts(value: Any, field: str, *, max_depth: int = MAX_JSON_DEPTH,
                  max_bytes: int = MAX_JSON_BYTES) -> tuple[str, dict[str, str] | None]:
    """:func:`check_json_value`, giving what :func:`canonical_parts` gives (the canonical
    text, and each member's for an object) instead of the bytes: a checker whose value
    is hashed and stored next (:func:`keep_text`) encodes it once.

    Raises:
        InputError: As :func:`check_json_value`.
    """
    _check_tree(value, field, max_depth)
    text, members = canonical_parts(value, field)
    size = len(json_text_bytes(text, field))  # (a lone surrogate is refused here)
    if size > max_bytes:
        raise InputError(f"{field} is {size} bytes of JSON; the limit is {max_bytes}")
    return text, members


def _check_tree(value: Any, field: str, max_depth: int) -> None:
    """The walk of :func:`check_json_value`: every type, float, key and depth."""
    stack: list[tuple[Any, int, str]] = [(value, 0, field)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InputError(f"{where}: {item} is not a JSON number (NaN and infinities "
                             "are not standard JSON)")
        if isinstance(item, _SCALARS):
            continue
        if not isinstance(item, dict | list | tuple):  # a tuple encodes as an array
            raise InputError(f"{where}: a {type(item).__name__} is not a JSON value")
        depth += 1
        if depth > max_depth:
            raise InputError(f"{field} is nested deeper than {max_depth} levels (the limit "
                             "for JSON values)")
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    raise InputError(f"{where}: object key {key!r} is not a string")
            children: Any = item.values()
        else:
            children = item
        for child in children:
            # Leaves of the exact plain types need no visit (a float only its check):
            # most of a large value, pushed and popped one by one before.
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:
                continue
            if kind is float and math.isfinite(child):
                continue
            stack.append((child, depth, where))


def parse_json_text(text: str | bytes, field: str, *, max_depth: int = MAX_JSON_DEPTH,
                    max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse JSON text strictly and check it with :func:`check_json_value`.

    Raises:
        InputError: Not JSON, a ``NaN``/``Infinity`` literal or a number past a float's
            range, an integer past Python's digit limit, nested too deep, or too large
            (each names ``field``).
    """
    if len(text) > max_bytes:
        raise InputError(f"{field} is {len(text)} bytes of JSON; the limit is {max_bytes}")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=finite_float)
    except json.JSONDecodeError as exc:
        raise InputError(f"{field} is not valid JSON: {exc.msg} (line {exc.lineno}, "
                         f"column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{field} is nested deeper than {max_depth} levels (the limit for "
                         "JSON values)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{field} is not valid JSON: {exc}") from None
    check_json_value(value, field, max_depth=max_depth, max_bytes=max_bytes)
    return value
