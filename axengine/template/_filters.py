"""The filter table: jinja's filters, each bounded or charged to the render's budget."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jinja2.filters as jf
from jinja2 import pass_environment, pass_eval_context
from jinja2.environment import Environment
from jinja2.nodes import EvalContext

from axengine.template._budget import MAX_OUTPUT_CHARS, MAX_RANGE, _charge, _size
from axengine.template._values import (
    _check_format,
    _check_replace,
    _join_size,
    _limit,
    _text,
    _weigh,
)

#: Filters that read the attribute an argument names: its position after the value
#: (``None``: only as ``attribute=``); ``map`` is handled apart. For the static check.
_ATTRIBUTE_ARGUMENT: dict[str, int | None] = {
    "attr": 0, "groupby": 0, "selectattr": 0, "rejectattr": 0, "sum": 0, "join": 1,
    "unique": 1, "min": 1, "max": 1, "sort": 2,
}
#: Filters whose first argument names a test (``select('odd')``), with its position.
_TEST_ARGUMENT = {"select": 0, "reject": 0, "selectattr": 1, "rejectattr": 1}


def _charged(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a filter so that what it builds is charged to the render's budget."""

    @functools.wraps(func)  # keeps jinja's pass_* markers
    def run(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        _charge(_size(result))
        return result

    return run


def _weighed(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a filter that turns its whole argument into text (``string``, ``e``...)."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        value = args[1] if isinstance(args[0], EvalContext) else args[0]
        _charge(_weigh(value))
        return func(*args, **kwargs)

    return run


@pass_environment
def _f_attr(environment: Environment, obj: Any, name: str) -> Any:
    return environment.getattr(obj, name)


def _f_center(value: Any, width: Any = 80) -> str:
    text = _text(value)
    _charge(max(len(text), _limit(width, MAX_OUTPUT_CHARS, "center() width")))
    return text.center(width)


def _f_indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    text = _text(s)
    unit = len(width) if isinstance(width, str) else width
    _limit(unit, MAX_OUTPUT_CHARS, "indent() width")
    _charge(len(text) + (text.count("\n") + 1) * unit)
    return jf.do_indent(text, width, first, blank)


@pass_eval_context
def _f_join(eval_ctx: EvalContext, value: Any, d: str = "", attribute: Any = None) -> str:
    items = list(value)
    if attribute is not None:
        items = list(map(jf.make_attrgetter(eval_ctx.environment, attribute), items))
    _join_size(items, d)
    return jf.sync_do_join(eval_ctx, items, d)


@pass_eval_context
def _f_replace(eval_ctx: EvalContext, s: Any, old: Any, new: Any, count: Any = None) -> str:
    text = _text(s)
    _check_replace(text, old, new, count)
    return jf.do_replace(eval_ctx, text, old, new, count)


def _f_format(value: Any, *args: Any, **kwargs: Any) -> str:
    _check_format(_text(value, MAX_OUTPUT_CHARS), kwargs or args)
    return jf.do_format(value, *args, **kwargs)


@pass_environment
def _f_wordwrap(
    environment: Environment,
    s: Any,
    width: Any = 79,
    break_long_words: bool = True,
    wrapstring: str | None = None,
    break_on_hyphens: bool = True,
) -> str:
    text = _text(s)
    wrap = environment.newline_sequence if wrapstring is None else _text(wrapstring)
    lines = len(text) // max(_limit(width, MAX_OUTPUT_CHARS, "wordwrap() width"), 1)
    _charge(len(text) + (lines + text.count("\n") + 1) * len(wrap))
    return jf.do_wordwrap(environment, text, width, break_long_words, wrap, break_on_hyphens)


def _f_batch(value: Any, linecount: Any, fill_with: Any = None) -> Any:
    return jf.do_batch(value, _limit(linecount, MAX_RANGE, "batch() size"), fill_with)


def _f_slice(value: Any, slices: Any, fill_with: Any = None) -> Any:
    return jf.sync_do_slice(value, _limit(slices, MAX_RANGE, "slice() count"), fill_with)


@pass_environment
def _f_sum(environment: Environment, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    items = list(iterable)
    if attribute is not None:
        items = list(map(jf.make_attrgetter(environment, attribute), items))
    if not isinstance(start, (list, tuple)):
        return sum(items, start)
    # Python's sum() concatenates lists quadratically, in C, out of the clock's reach.
    result = list(start)
    for item in items:
        if not isinstance(item, (list, tuple)):
            raise TypeError(f"can only sum lists with a list start, not {type(item).__name__}")
        _charge(len(item))
        result.extend(item)
    return result


@pass_eval_context
def _f_tojson(eval_ctx: EvalContext, value: Any, indent: Any = None) -> Any:
    _charge(_weigh(value, None, _limit(indent or 0, 8, "tojson() indent")))
    return jf.do_tojson(eval_ctx, value, indent)


def _build_filters() -> dict[str, Callable[..., Any]]:
    base = jf.FILTERS
    plain = (
        "abs capitalize count d default dictsort first float groupby int items last length"
        " list lower map max min reject rejectattr reverse round safe select selectattr sort"
        " striptags title trim truncate unique upper wordcount filesizeformat"
    )
    table = {name: _charged(base[name]) for name in plain.split()}
    for name in ("string", "e", "escape", "forceescape", "urlencode", "xmlattr"):
        table[name] = _weighed(base[name])
    table.update(
        attr=_f_attr,
        batch=_f_batch,
        center=_f_center,
        format=_f_format,
        indent=_f_indent,
        join=_f_join,
        replace=_f_replace,
        slice=_f_slice,
        sum=_f_sum,
        tojson=_f_tojson,
        wordwrap=_f_wordwrap,
    )
    # Left out on purpose: pprint (object reprs), random (guards must be deterministic),
    # urlize (its target/rel/extra_schemes arguments amplify text).
    return table
