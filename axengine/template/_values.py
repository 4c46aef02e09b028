"""What a template may print or return, and the checks on operations that build text.

Everything here refuses values that are not data (functions, methods, objects) and
charges what it builds to the render's budget (:mod:`axengine.template._budget`).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, NoReturn

from jinja2 import pass_context
from jinja2.runtime import Context, LoopContext, Undefined

from axengine.errors import TemplateError, TemplateLimitError, TemplateSecurityError
from axengine.template._budget import (
    _BUDGET_MESSAGE,
    MAX_OUTPUT_CHARS,
    MAX_RANGE,
    _charge,
    _error,
    _remaining,
    _tick,
)

_PLAIN = (str, int, float, bool, type(None))
_VIEWS = (KeysView, ValuesView, ItemsView)


def _refuse(what: str) -> NoReturn:
    raise _error(TemplateSecurityError, f"{what} is not allowed in templates")


def _describe(obj: Any) -> str:
    name = getattr(obj, "__name__", None)
    kind = type(obj).__name__
    return f"{kind} {name!r}" if isinstance(name, str) else kind


def _weigh(value: Any, limit: int | None = None, indent: int = 0) -> int:
    """Estimate the text size of data, refusing anything that is not data.

    ``limit`` defaults to what is left of the render's budget.
    """
    bound = _remaining() if limit is None else limit
    total, count = 0, 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        total += depth * indent + 2
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3
        elif isinstance(item, float):
            total += 24
        elif isinstance(item, Mapping):
            stack.extend((x, depth + 1) for pair in item.items() for x in pair)
        elif isinstance(item, (list, tuple, *_VIEWS)):
            stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, range):
            total += 24
        elif isinstance(item, Undefined):
            item._fail_with_undefined_error()
        else:
            message = f"{_describe(item)} is not data: it cannot be printed or formatted"
            raise _error(TemplateSecurityError, message)
        count += 1
        if total > bound:
            message = _BUDGET_MESSAGE if limit is None else f"a value is over {limit} characters"
            raise _error(TemplateLimitError, message)
        if count % 4096 == 0:
            _tick()
    return total


def _text(value: Any, limit: int | None = None) -> str:
    """``str(value)`` for data only, refusing results larger than ``limit`` (budget)."""
    if isinstance(value, str):
        if len(value) > (_remaining() if limit is None else limit):
            message = _BUDGET_MESSAGE if limit is None else f"a value is over {limit} characters"
            raise _error(TemplateLimitError, message)
        return str(value)
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    _charge(_weigh(value, limit))
    return str(value)


@pass_context  # a context-taking finalize also stops jinja folding output at compile time
def _finalize(context: Context, value: Any) -> str:
    return _output_text(value)


def _output_text(value: Any) -> str:
    """The text of a value a template outputs (the sandbox's ``finalize``)."""
    if type(value) is str and len(value) <= MAX_OUTPUT_CHARS:
        return value
    return _text(value, MAX_OUTPUT_CHARS)


def _output(chunks: Iterable[str]) -> str:
    """The chunks a text template renders, joined; refused past ``MAX_OUTPUT_CHARS``
    (checked as they come, so a long render stops at the bound)."""
    parts: list[str] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_OUTPUT_CHARS:
            raise _error(TemplateLimitError, f"output longer than {MAX_OUTPUT_CHARS} characters")
        parts.append(chunk)
    return "".join(parts)


def _join_buffer(parts: Any) -> str:
    """``environment.concat``: joins macro, ``{% set %}`` block and filter block output."""
    parts = list(parts)
    total = sum(map(len, parts))
    if total > MAX_OUTPUT_CHARS:
        raise _error(TemplateLimitError, f"a block rendered more than {MAX_OUTPUT_CHARS} chars")
    _charge(total)
    return "".join(parts)


#: The exact types of plain data's leaves (a subclass, such as Markup, is converted).
_PLAIN_TYPES = frozenset(_PLAIN)


def _to_native(value: Any) -> Any:
    """Convert a native result to plain data (list/dict/str/...), refusing anything else.

    Always a copy of the containers: the value may be another node's output, which the
    engine keeps and a handler given this one may change in place."""
    if type(value) is dict or type(value) is list:
        copied = _plain_copy(value)
        if copied is not None:
            return copied
    if isinstance(value, _PLAIN):
        return value if type(value) in _PLAIN else str(value)  # Markup -> str
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    if isinstance(value, Mapping):
        if any(type(k) is not str for k in value):
            return _with_json_keys(value)
        return {k: v if type(v) in _PLAIN else _to_native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, range, *_VIEWS)) or (
        isinstance(value, Iterator) and not isinstance(value, LoopContext)
    ):
        items = list(value)
        _charge(len(items))
        return [v if type(v) in _PLAIN else _to_native(v) for v in items]
    message = f"a template cannot produce {_describe(value)}: only data (str, number, list...)"
    raise _error(TemplateSecurityError, message)


def _plain_copy(value: dict[str, Any] | list[Any]) -> Any:
    """A copy of ``value`` when it is plain data already — dicts with text keys and lists,
    down to leaves of the exact plain types — else None (:func:`_to_native` converts
    it). What a template most often returns, another node's output as decoded from the
    store; one loop in one frame, where the recursive conversion made a traced call per
    container and per comprehension (a 60 KB output: 9 ms of a render, now about 2)."""
    # Not traced: the render's budget hook (sys.settrace) makes a loop in Python several
    # times slower. The loop is bounded instead by the render's remaining work: a value
    # that shares its parts ([a, a, a] of [b, b, b]...) is small to build and huge to
    # copy, and past that bound the conversion takes over and refuses it.
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        copied = _bounded_copy(value, _remaining())
    finally:
        sys.settrace(tracer)
    if copied is not None:
        _charge(copied[1])  # as the conversion charges each list's items
        return copied[0]
    return None


def _bounded_copy(value: dict[str, Any] | list[Any], limit: int) -> tuple[Any, int] | None:
    """:func:`_plain_copy`'s loop: the copy and the number of list items, or None (not
    plain data, or more than ``limit`` entries to copy)."""
    plain = _PLAIN_TYPES
    root: Any = {} if type(value) is dict else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    items = entries = 0
    while stack:
        source, copy = stack.pop()
        entries += len(source)
        if entries > limit:
            return None
        if type(source) is dict:
            for key, child in source.items():
                kind = type(child)
                if type(key) is not str:
                    return None
                if kind is dict or kind is list:
                    inner: Any = {} if kind is dict else []
                    stack.append((child, inner))
                    copy[key] = inner
                elif kind in plain:
                    copy[key] = child
                else:
                    return None
        else:
            items += len(source)
            for child in source:
                kind = type(child)
                if kind is dict or kind is list:
                    inner = {} if kind is dict else []
                    stack.append((child, inner))
                    copy.append(inner)
                elif kind in plain:
                    copy.append(child)
                else:
                    return None
    return root, items


def _with_json_keys(value: Mapping[Any, Any]) -> dict[str, Any]:
    """The mapping with its keys as JSON writes them (``1`` -> ``"1"``, ``True`` ->
    ``"true"``), as an executor reading the node's input back gets them; two keys that
    JSON would write alike are refused rather than one silently dropped."""
    out: dict[str, Any] = {}
    keys: dict[str, Any] = {}
    for key, item in value.items():
        text = _json_key(key)
        if text in out:
            message = (f"object keys {keys[text]!r} and {key!r} are the same key in JSON "
                       f"({text!r})")
            raise _error(TemplateError, message)
        keys[text] = key
        out[text] = item if type(item) in _PLAIN else _to_native(item)
    return out


def _json_key(key: Any) -> str:
    if type(key) is str:
        return key
    if type(key) is bool:
        return "true" if key else "false"
    if key is None:
        return "null"
    if type(key) is int:
        try:
            return str(key)
        except ValueError:  # past Python's 4,300 digits
            raise _error(TemplateLimitError, "an object key is an integer too long to be "
                                             "text") from None
    if type(key) is float and math.isfinite(key):
        return repr(key)
    shown = repr(key) if isinstance(key, float | tuple) else _describe(key)
    raise _error(TemplateError, f"{shown[:60]} cannot be an object key in JSON (only "
                                "strings, finite numbers, booleans and null can)")


def _bounded_range(*args: int) -> range:
    try:
        values = range(*args)
        size = len(values)
    except OverflowError:
        size = MAX_RANGE + 1
    if size > MAX_RANGE:
        raise _error(TemplateLimitError, f"range() is limited to {MAX_RANGE} items")
    return values


_bounded_range.__name__ = _bounded_range.__qualname__ = "range"


def _limit(value: Any, bound: int, what: str) -> int:
    # Never negative: a negative width would otherwise give budget back.
    if not isinstance(value, int) or not 0 <= value <= bound:
        raise _error(TemplateLimitError, f"{what} must be an integer up to {bound}")
    return value


_FORMAT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _check_format(fmt: str, args: Any) -> None:
    extra = 0
    for match in _FORMAT_SPEC.finditer(fmt):
        for number in match.groups():
            if number == "*" or (number and len(number) > 6):
                raise _error(TemplateLimitError, "'%' widths must be literal and small")
            extra += int(number or 0)
    if extra > MAX_OUTPUT_CHARS:
        raise _error(TemplateLimitError, f"'%' widths add up to more than {MAX_OUTPUT_CHARS}")
    _charge(len(fmt) + extra + _weigh(args))


def _check_replace(text: str, old: Any, new: Any, count: Any = None) -> None:
    old, new = _text(old), _text(new)  # data only: no str() of a function or method
    hits = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _charge(len(text) + max(0, hits * (len(new) - len(old))))


def _join_size(items: list[Any], separator: Any) -> None:
    _charge(_weigh(items) + len(_text(separator)) * len(items))
