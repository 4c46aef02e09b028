"""The template sandbox: render inputs, evaluate guards and condition expressions.

Every template in a DAG (node inputs, prompts, ``next[].condition`` guards and the
``expression`` of a condition node) goes through this module and nothing else. Templates
are Jinja2 in an :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment` with
:class:`~jinja2.StrictUndefined`, tightened further:

* Names: ``input``, ``output`` (guards and expressions), ``nodes.<id>.output``, ``task``
  and a bounded ``range``. No ``lipsum``/``cycler``/``joiner``/``namespace``/``dict``.
* Attributes and calls are allowlisted per type (a few ``str``/``dict``/``list`` methods,
  ``loop`` helpers, macros); anything starting with ``_``, ``format``/``format_map``,
  ``mro`` and every other callable is refused with :class:`TemplateSecurityError`.
  ``include``/``import``/``extends`` are refused when the template is compiled.
* Bounds (:class:`TemplateLimitError`): ``range`` length, ``*`` repetition, ``**`` and
  integer ``*`` size, ``%`` widths, output size, a per-render budget of characters built
  in intermediate values, and CPU time. Time is enforced by a ``sys.settrace`` hook
  installed only while a template runs, so loops that print nothing and recursive
  macros are interrupted too; the hook is removed (the previous one restored) after.
* Go-style leading dots from the seed (``.input.x``) mean ``input.x`` (:func:`normalize`).

Every error raised carries ``line``: the 1-based line within the template source, or 0.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import time
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from contextvars import ContextVar
from types import BuiltinMethodType, FrameType, MethodType, TracebackType
from typing import Any, NoReturn, TypeVar, cast

import jinja2.filters as jf
from jinja2 import nodes, pass_context, pass_environment, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame
from jinja2.environment import Environment, Template
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.nodes import EvalContext
from jinja2.parser import Parser
from jinja2.runtime import Context, LoopContext, Macro, StrictUndefined, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import missing

from axengine.errors import TemplateError, TemplateLimitError, TemplateSecurityError

__all__ = [
    "MAX_OUTPUT_CHARS",
    "MAX_RANGE",
    "MAX_RENDER_SECONDS",
    "MISSING",
    "compile_template",
    "evaluate_expression",
    "evaluate_guard",
    "expression_labels",
    "normalize",
    "referenced_nodes",
    "render",
    "render_value",
    "template_context",
]

#: Bound on the text one render may produce (and on any single repeated value).
MAX_OUTPUT_CHARS: int = 65536
#: Bound on the CPU time of one render (one whole :func:`render_value` call).
MAX_RENDER_SECONDS: float = 0.25
#: Bound on the length of ``range()``.
MAX_RANGE: int = 10000

#: Characters (or list items) one render may build in intermediate values. Generous, so
#: that a guard may lower-case a big document, but small enough to cap memory.
_MAX_WORK_CHARS = 256 * MAX_OUTPUT_CHARS
#: Bound on integers built by ``*`` and ``**`` (Python refuses to print > 4300 digits).
_MAX_INT_BITS = 8192
#: Template sources longer than this (with template markup) are refused.
_MAX_SOURCE_CHARS = MAX_OUTPUT_CHARS
#: The CPU clock is read every this many traced events (calls and template lines).
_CHECK_EVERY = 128
_TEMPLATE_FILE = "<template>"
_RESULT = "_ax_result"
_FALSE_STRINGS = frozenset({"", "false", "0", "none", "null"})

_E = TypeVar("_E", bound=TemplateError)
_T = TypeVar("_T")


class _Missing:
    """Type of :data:`MISSING`."""

    def __repr__(self) -> str:
        return "MISSING"


#: Sentinel for :func:`template_context`: no ``output`` name (node inputs, not guards).
MISSING: object = _Missing()


def _error(cls: type[_E], message: str, line: int = 0) -> _E:
    exc = cls(message)
    cast(Any, exc).line = line
    return exc


# --------------------------------------------------------------------------- budget


class _Interrupted(BaseException):
    """Raised by the trace hook; a BaseException so no ``except Exception`` swallows it."""


class _Session:
    """The budget of one render: CPU deadline, trace countdown, characters built."""

    __slots__ = ("countdown", "deadline", "lines", "work")

    def __init__(self) -> None:
        self.deadline = time.thread_time() + MAX_RENDER_SECONDS
        self.countdown = _CHECK_EVERY
        self.work = 0
        self.lines = self._trace_lines

    def check_clock(self) -> None:
        self.countdown = _CHECK_EVERY
        # Thread CPU time, not wall time: a busy server must not fail honest renders.
        if time.thread_time() > self.deadline:
            raise _Interrupted

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.countdown -= 1
        if self.countdown <= 0:
            self.check_clock()
        # Line events only for compiled template code: that is where unbounded loops
        # live; library frames are still counted through their call events.
        return self.lines if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def _trace_lines(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.countdown -= 1
        if self.countdown <= 0:
            self.check_clock()
        return self.lines


_BUDGET_MESSAGE = f"the template built more than {_MAX_WORK_CHARS} characters of values"
_SESSION: ContextVar[_Session | None] = ContextVar("ax_template_session", default=None)


def _charge(amount: int) -> None:
    session = _SESSION.get()
    if session is None:  # a filter used outside a render: bound the single operation
        if amount > MAX_OUTPUT_CHARS:
            raise _error(TemplateLimitError, f"a value is larger than {MAX_OUTPUT_CHARS} chars")
        return
    session.work += amount
    if session.work > _MAX_WORK_CHARS:
        raise _error(TemplateLimitError, _BUDGET_MESSAGE)


def _remaining() -> int:
    session = _SESSION.get()
    return _MAX_WORK_CHARS - session.work if session else MAX_OUTPUT_CHARS


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else 0


def _template_line(tb: TracebackType | None) -> int:
    line = 0
    while tb is not None:
        template = tb.tb_frame.f_globals.get("__jinja_template__")
        if isinstance(template, Template):
            line = template.get_corresponding_lineno(tb.tb_lineno)
        tb = tb.tb_next
    return line


def _mapped(exc: BaseException, line_base: int, default_line: int) -> TemplateError:
    """Turn anything a render raised into a TemplateError with the template line."""
    line = _template_line(exc.__traceback__) or default_line
    line = line + line_base if line else 0
    if isinstance(exc, TemplateError):
        if not getattr(exc, "line", 0):
            cast(Any, exc).line = line
        return exc
    if isinstance(exc, _Interrupted):
        message = f"rendering took more than {MAX_RENDER_SECONDS}s of CPU (loop or recursion)"
        return _error(TemplateLimitError, message, line)
    if isinstance(exc, RecursionError):
        return _error(TemplateLimitError, "recursion too deep (recursive macro or loop)", line)
    if isinstance(exc, MemoryError):
        return _error(TemplateLimitError, "the template ran out of memory", line)
    if isinstance(exc, SecurityError):
        return _error(TemplateSecurityError, str(exc), line)
    if isinstance(exc, UndefinedError):
        return _error(TemplateError, str(exc), line)
    return _error(TemplateError, f"{type(exc).__name__}: {exc}", line)


def _guarded(action: Callable[[], _T], line_base: int = 0, default_line: int = 0) -> _T:
    """Run ``action`` under one budget (reusing the caller's), mapping every error.

    ``default_line`` is used for errors raised outside the template's own frames (a
    native value that turns out to be undefined); ``line_base`` shifts condition lines.
    """
    session = token = previous = None
    if _SESSION.get() is None:
        session = _Session()
        token = _SESSION.set(session)
        previous = sys.gettrace()
        sys.settrace(session.trace)
    try:
        return action()
    except (Exception, _Interrupted) as exc:
        raise _mapped(exc, line_base, default_line) from exc
    finally:
        if token is not None:
            sys.settrace(previous)
            _SESSION.reset(token)


# ------------------------------------------------------------------ values and sizes

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


def _tick() -> None:
    session = _SESSION.get()
    if session is not None:
        session.check_clock()


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
    if type(value) is str and len(value) <= MAX_OUTPUT_CHARS:
        return value
    return _text(value, MAX_OUTPUT_CHARS)


def _join_buffer(parts: Any) -> str:
    """``environment.concat``: joins macro, ``{% set %}`` block and filter block output."""
    parts = list(parts)
    total = sum(map(len, parts))
    if total > MAX_OUTPUT_CHARS:
        raise _error(TemplateLimitError, f"a block rendered more than {MAX_OUTPUT_CHARS} chars")
    _charge(total)
    return "".join(parts)


def _to_native(value: Any) -> Any:
    """Convert a native result to plain data (list/dict/str/...), refusing anything else."""
    if isinstance(value, _PLAIN):
        return value if type(value) in _PLAIN else str(value)  # Markup -> str
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    if isinstance(value, Mapping):
        return {k: v if type(v) in _PLAIN else _to_native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, range, *_VIEWS)) or (
        isinstance(value, Iterator) and not isinstance(value, LoopContext)
    ):
        items = list(value)
        _charge(len(items))
        return [v if type(v) in _PLAIN else _to_native(v) for v in items]
    message = f"a template cannot produce {_describe(value)}: only data (str, number, list...)"
    raise _error(TemplateSecurityError, message)


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


# ------------------------------------------------------------------------- filters


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


# ------------------------------------------------------------------------- sandbox

# ``center``/``ljust``/``zfill``/``expandtabs`` are left out: they amplify text.
_STR_METHODS = frozenset(
    {"capitalize", "casefold", "count", "endswith", "find", "index", "isalnum", "isalpha"}
    | {"isascii", "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle"}
    | {"isupper", "join", "lower", "lstrip", "partition", "removeprefix", "removesuffix"}
    | {"replace", "rfind", "rindex", "rpartition", "rsplit", "rstrip", "split", "splitlines"}
    | {"startswith", "strip", "swapcase", "title", "upper"}
)
_MAPPING_METHODS = frozenset({"get", "items", "keys", "values"})
_SEQUENCE_METHODS = frozenset({"count", "index"})
_RANGE_NAMES = frozenset({"start", "stop", "step", "count", "index"})
_LOOP_NAMES = frozenset(
    {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth"}
    | {"depth0", "previtem", "nextitem", "cycle", "changed"}
)
_DATA = (str, int, float, type(None), list, tuple, range, Mapping)


def _allowed_names(obj: Any) -> frozenset[str]:
    if isinstance(obj, str):
        return _STR_METHODS
    if isinstance(obj, Mapping):
        return _MAPPING_METHODS
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):  # groupby() results
        return _SEQUENCE_METHODS | frozenset(cast(Any, obj)._fields)
    if isinstance(obj, (list, tuple)):
        return _SEQUENCE_METHODS
    if isinstance(obj, range):
        return _RANGE_NAMES
    if isinstance(obj, LoopContext):
        return _LOOP_NAMES
    return frozenset()


class _Undefined(StrictUndefined):
    """StrictUndefined whose message names the missing field and what is there."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        name, obj = self._undefined_name, self._undefined_obj
        if self._undefined_hint:
            return self._undefined_hint
        if obj is missing:
            return f"{name!r} is undefined (templates can use input, output, nodes, task)"
        if isinstance(obj, Mapping):
            keys = [str(k) for k in itertools.islice(obj, 12)]
            shown = ", ".join(keys) + (", ..." if len(obj) > len(keys) else "")
            return f"no field {name!r} (fields: {shown or 'none'})"
        if isinstance(obj, (list, tuple, str)) and isinstance(name, int):
            return f"index {name} is out of range (length {len(obj)})"
        return f"{type(obj).__name__} value has no field {name!r}"


class _CodeGenerator(CodeGenerator):
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # ``~`` compiles to a bare str.join; route it through the sandbox so repeated
        # doubling (``{% set s = s ~ s %}``) is charged to the render's budget.
        self.write("environment.concat_values((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Sandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _CodeGenerator
    concat = staticmethod(_join_buffer)
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self) -> None:
        super().__init__(
            autoescape=False,
            undefined=_Undefined,
            finalize=_finalize,
            keep_trailing_newline=True,
            cache_size=0,
            # No compile-time constant folding: it would run filters (``'x'|center(n)``)
            # and concatenations at compile time, outside every bound of this module.
            optimized=False,
        )
        self.globals.clear()
        self.globals["range"] = _bounded_range
        self.filters = _build_filters()

    def concat_values(self, parts: tuple[Any, ...]) -> str:
        texts = [_text(part) for part in parts]
        _charge(sum(map(len, texts)))
        return "".join(texts)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        return not attr.startswith("_") and attr in _allowed_names(obj)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):  # data first: ``output.items`` is the field if present
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return self._attribute(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, Mapping) or (
            isinstance(obj, (str, list, tuple, range)) and isinstance(argument, (int, slice))
        ):
            try:
                value = obj[argument]
            except (KeyError, IndexError, TypeError):
                pass
            else:
                if isinstance(argument, slice):
                    _charge(_size(value))
                return value
        if isinstance(argument, str):
            return self._attribute(obj, argument)
        if isinstance(obj, Undefined):
            obj._fail_with_undefined_error()
        if isinstance(obj, _DATA):
            return self.undefined(obj=obj, name=argument)
        _refuse(f"indexing {_describe(obj)}")

    def _attribute(self, obj: Any, name: str) -> Any:
        if isinstance(obj, Undefined):
            obj._fail_with_undefined_error()
        if not name.startswith("_"):
            if name in _allowed_names(obj):
                try:
                    return getattr(obj, name)
                except AttributeError:
                    return self.undefined(obj=obj, name=name)
            if isinstance(obj, Mapping) or (
                isinstance(obj, _DATA) and not hasattr(type(obj), name)
            ):
                return self.undefined(obj=obj, name=name)
        _refuse(f"access to {name!r} on {_describe(obj)}")

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, Undefined):
            obj._fail_with_undefined_error()
        if obj is _bounded_range or isinstance(obj, (Macro, LoopContext)):
            return context.call(obj, *args, **kwargs)
        owner = getattr(obj, "__self__", None)
        name = getattr(obj, "__name__", "")
        if not (
            isinstance(obj, (BuiltinMethodType, MethodType))
            and not name.startswith("_")
            and name in _allowed_names(owner)
        ):
            _refuse(f"calling {_describe(obj)}")
        if isinstance(owner, str) and name == "replace":
            _check_replace(owner, *args[:3])
        elif isinstance(owner, str) and name == "join" and args:
            args = (list(args[0]),)
            _join_size(args[0], owner)
        result = obj(*args, **kwargs)
        _charge(_size(result))
        return result

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and abs(left) > 1
                and min(right, _MAX_INT_BITS + 1) * left.bit_length() > _MAX_INT_BITS
            ):
                raise _error(TemplateLimitError, f"'**' result above {_MAX_INT_BITS} bits")
        elif operator == "*":
            self._check_multiply(left, right)
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                _charge(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right)
        return self.binop_table[operator](left, right)

    @staticmethod
    def _check_multiply(left: Any, right: Any) -> None:
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                size = len(seq) * max(times, 0)
                if size > MAX_OUTPUT_CHARS:
                    message = f"repetition builds {size} items, above {MAX_OUTPUT_CHARS}"
                    raise _error(TemplateLimitError, message)
                _charge(size)
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and left.bit_length() + right.bit_length() > _MAX_INT_BITS
        ):
            raise _error(TemplateLimitError, f"'*' result above {_MAX_INT_BITS} bits")


_ENV = _Sandbox()


# ----------------------------------------------------------------------- normalize

#: Words after which a ``.name`` starts a path (``if .x``, ``a and .b``, ``for k in .m``).
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "if", "elif", "else", "for", "set", "with"})
_OPEN = re.compile(r"\{[{%#]")
_RAW = re.compile(r"\{%[-+]?\s*raw\s*[-+]?%\}")
_ENDRAW = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")


def _has_markup(source: str) -> bool:
    return "{{" in source or "{%" in source or "{#" in source


def _scan_code(text: str, start: int, closer: str | None) -> tuple[str, int]:
    """Drop leading dots from expression code until ``closer`` (at bracket depth 0)."""
    out: list[str] = []
    prev, word, depth = "start", "", 0  # kind of the previous token: start|op|word|value
    i, end = start, len(text)
    while i < end:
        if closer is not None and depth == 0 and text.startswith(closer, i):
            break
        c = text[i]
        j = i + 1
        if c in "'\"":
            while j < end and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, end)
            prev = "value"
        elif c == "." and j < end and (text[j].isalpha() or text[j] == "_"):
            if prev in ("start", "op") or (prev == "word" and word in _KEYWORDS):
                i = j  # a path start: ``.input.x`` -> ``input.x``
                continue
        elif c.isalpha() or c == "_":
            while j < end and (text[j].isalnum() or text[j] == "_"):
                j += 1
            prev, word = "word", text[i:j]
        elif c.isdigit() or c == ".":  # numbers (1.5, .5, 1e3) and stray dots stay as they are
            while j < end and (text[j].isalnum() or text[j] in "._"):
                j += 1
            prev = "value"
        elif c in "([{":
            prev, depth = "op", depth + 1
        elif c in ")]}":
            prev, depth = "value", max(depth - 1, 0)
        elif not c.isspace():
            prev = "op"
        out.append(text[i:j])
        i = j
    return "".join(out), i


def normalize(source: str) -> str:
    """Rewrite the seed's Go-style leading dots: ``{{ .input.x }}`` -> ``{{ input.x }}``.

    Only a dot that starts a path is removed: at the start of an expression, after an
    operator, an opening bracket, a comma or a keyword (``and``, ``if``, ``in``...).
    Decimal numbers (``.5``), attribute access (``a.b``, ``f(x).y``), string literals,
    comments and ``{% raw %}`` blocks are left alone. When ``source`` has template
    markup, only the code inside ``{{ }}`` and ``{% %}`` is rewritten; without markup the
    whole source is treated as expression code (the ``if/elif/else`` form).

    Args:
        source: Template or expression source.

    Returns:
        The source with path-leading dots removed; line numbers are unchanged.
    """
    if not _has_markup(source):
        return _scan_code(source, 0, None)[0]
    out: list[str] = []
    i = 0
    while (match := _OPEN.search(source, i)) is not None:
        out.append(source[i : match.start()])
        opener, start = match.group(), match.start()
        verbatim_end = None
        if opener == "{#":
            found = source.find("#}", start)
            verbatim_end = len(source) if found < 0 else found + 2
        elif opener == "{%" and (raw := _RAW.match(source, start)) is not None:
            endraw = _ENDRAW.search(source, raw.end())
            verbatim_end = endraw.end() if endraw else len(source)
        if verbatim_end is not None:
            out.append(source[start:verbatim_end])
            i = verbatim_end
            continue
        code, i = _scan_code(source, match.end(), "}}" if opener == "{{" else "%}")
        out.append(opener + code)
    out.append(source[i:])
    return "".join(out)


# ------------------------------------------------------------------------- compile


class _Compiled:
    """A compiled template; ``native`` ones store their single expression's value."""

    __slots__ = ("line", "native", "template", "tree")

    def __init__(self, tree: nodes.Template, expr: nodes.Expr | None) -> None:
        self.line = expr.lineno if expr is not None else 0
        if expr is not None:
            target = nodes.Name(_RESULT, "store", lineno=expr.lineno)
            tree = nodes.Template([nodes.Assign(target, expr, lineno=expr.lineno)], lineno=1)
            tree.set_environment(_ENV)
        self.tree = tree
        self.native = expr is not None
        try:
            self.template = _ENV.from_string(tree)
        except TemplateSyntaxError as exc:  # unknown filter or test, found by the compiler
            raise _error(TemplateError, exc.message or str(exc), exc.lineno) from exc


_REFUSED_TAGS: dict[type[nodes.Node], str] = {
    nodes.Extends: "extends",
    nodes.Include: "include",
    nodes.Import: "import",
    nodes.FromImport: "from ... import",
    # Its argument is evaluated at compile time; ax renders text with autoescape off.
    nodes.ScopedEvalContextModifier: "autoescape",
}


@functools.lru_cache(maxsize=1024)
def _compile(normalized: str) -> _Compiled:
    try:
        tree = _ENV.parse(normalized)
    except TemplateSyntaxError as exc:
        raise _error(TemplateError, exc.message or str(exc), exc.lineno) from exc
    except RecursionError:
        raise _error(TemplateLimitError, "the template is nested too deeply") from None
    for node in tree.find_all(tuple(_REFUSED_TAGS)):
        tag = _REFUSED_TAGS[type(node)]
        message = f"{{% {tag} %}} is not allowed in ax templates (no file, module or escaping)"
        raise _error(TemplateSecurityError, message, node.lineno)
    expr = None
    if len(tree.body) == 1 and isinstance(tree.body[0], nodes.Output):
        parts = [
            n
            for n in tree.body[0].nodes
            if not (isinstance(n, nodes.TemplateData) and not n.data.strip())
        ]
        if len(parts) == 1 and not isinstance(parts[0], nodes.TemplateData):
            expr = parts[0]
    return _Compiled(tree, expr)


_normalized = functools.lru_cache(maxsize=1024)(normalize)


def _compiled(source: str) -> _Compiled:
    if len(source) > _MAX_SOURCE_CHARS:
        raise _error(TemplateLimitError, f"template longer than {_MAX_SOURCE_CHARS} characters")
    return _compile(_normalized(source))


@functools.lru_cache(maxsize=1024)
def _compile_condition(code: str, line_base: int) -> _Compiled:
    """Compile bare expression code (a guard without braces, an ``if`` condition)."""
    try:
        parser = Parser(_ENV, _scan_code(code, 0, None)[0], state="variable")
        expr = parser.parse_expression()
        if not parser.stream.eos:
            parser.fail(f"unexpected {parser.stream.current.value!r} after the condition")
    except TemplateSyntaxError as exc:
        line = exc.lineno + line_base
        raise _error(TemplateError, f"bad condition: {exc.message}", line) from exc
    except RecursionError:
        message = "the condition is nested too deeply"
        raise _error(TemplateLimitError, message, 1 + line_base) from None
    return _Compiled(nodes.Template([], lineno=1), expr)


def _run(compiled: _Compiled, context: Mapping[str, Any]) -> Any:
    template = compiled.template
    # shared=True skips merging the globals ChainMap (slow under the trace hook); the one
    # global is added by hand, last, so the context cannot replace the bounded range.
    ctx = template.new_context({**context, "range": _bounded_range}, shared=True)
    if compiled.native:
        for _ in template.root_render_func(ctx):
            pass
        return _to_native(ctx.vars[_RESULT])
    parts: list[str] = []
    size = 0
    for chunk in template.root_render_func(ctx):
        size += len(chunk)
        if size > MAX_OUTPUT_CHARS:
            raise _error(TemplateLimitError, f"output longer than {MAX_OUTPUT_CHARS} characters")
        parts.append(chunk)
    return "".join(parts)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_STRINGS
    return bool(value)


# ------------------------------------------------------------- if/elif/else form

_CLAUSE = re.compile(r"(if|elif|else)\b")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|'[^'\\]+'|\"[^\"\\]+\"")


class _Clause:
    __slots__ = ("condition", "label", "line")

    def __init__(self, line: int, condition: _Compiled | None, label: str) -> None:
        self.line, self.condition, self.label = line, condition, label


def _is_if_form(source: str) -> bool:
    for raw in source.splitlines():
        text = raw.strip()
        if text and not text.startswith("#"):
            return _CLAUSE.match(text) is not None
    return False


def _split_clause(rest: str, line: int) -> tuple[str, str]:
    """Split ``<condition>: <label>`` at the first colon outside strings and brackets."""
    depth, quote = 0, ""
    i = 0
    while i < len(rest):
        c = rest[i]
        if quote:
            i += c == "\\"
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ":" and depth == 0:
            break
        i += 1
    else:
        raise _error(TemplateError, "missing ':' before the label", line)
    label = rest[i + 1 :].strip()
    if not _LABEL.fullmatch(label):
        hint = "use a name such as high_risk, or a quoted string"
        raise _error(TemplateError, f"bad label {label!r}: {hint}", line)
    return rest[:i].strip(), label.strip("'\"")


@functools.lru_cache(maxsize=512)
def _if_form(source: str) -> tuple[_Clause, ...]:
    clauses: list[_Clause] = []
    last = 1
    for last, raw in enumerate(source.splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        match = _CLAUSE.match(text)
        if match is None:
            raise _error(TemplateError, f"expected if/elif/else, got {text[:40]!r}", last)
        keyword = match.group(1)
        if clauses and clauses[-1].condition is None:
            raise _error(TemplateError, "nothing may follow the final 'else:'", last)
        if keyword == "if" and clauses:
            raise _error(TemplateError, "only the first clause is 'if'; use 'elif'", last)
        if keyword != "if" and not clauses:
            raise _error(TemplateError, f"'{keyword}' before 'if'", last)
        condition, label = _split_clause(text[match.end() :], last)
        if keyword == "else":
            if condition:
                raise _error(TemplateError, "'else' takes no condition; use 'elif'", last)
            clauses.append(_Clause(last, None, label))
        elif not condition:
            raise _error(TemplateError, f"empty condition after '{keyword}'", last)
        else:
            clauses.append(_Clause(last, _compile_condition(condition, last - 1), label))
    if not clauses or clauses[-1].condition is not None:
        hint = "end with 'else: <label>' so the condition always yields a label"
        raise _error(TemplateError, f"missing final 'else:' ({hint})", last)
    return tuple(clauses)


def _not_an_expression(source: str) -> TemplateError:
    hint = "write 'if <expr>: <label>' lines ending with 'else: <label>', or a {{ }} template"
    return _error(TemplateError, f"not a condition expression ({hint})", 1 if source else 0)


# ------------------------------------------------------------------------ public API


def compile_template(source: str) -> None:
    """Check that a template compiles (after :func:`normalize`); cache the result.

    Args:
        source: Template source. Text without ``{{``, ``{%`` or ``{#`` always compiles.

    Raises:
        TemplateError: Syntax error, unknown filter; ``line`` is set.
        TemplateSecurityError: ``include``, ``import`` or ``extends``.
        TemplateLimitError: The source is longer than the bound.
    """
    if _has_markup(source):
        _compiled(source)


def render(source: str, context: Mapping[str, Any]) -> Any:
    """Render one template.

    Args:
        source: Template source. Anything that is not a ``str`` is returned unchanged,
            and so is text without template markup.
        context: The names the template sees (see :func:`template_context`).

    Returns:
        If ``source`` (stripped) is exactly one ``{{ expr }}``, the native value of
        ``expr`` as plain data (dict, list, str, int, float, bool or None); otherwise the
        rendered text.

    Raises:
        TemplateError: Compile or render error, including a missing field.
        TemplateSecurityError: The sandbox refused an operation.
        TemplateLimitError: A size or time bound was exceeded.
    """
    if not isinstance(source, str) or not _has_markup(source):
        return source
    compiled = _compiled(source)  # outside the clock: compiling is not the template's time
    return _guarded(lambda: _run(compiled, context), 0, compiled.line)


def _each_string(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _each_string(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _each_string(item)


def _render_tree(value: Any, context: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return render(value, context)
    if isinstance(value, Mapping):
        return {key: _render_tree(item, context) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_render_tree(item, context) for item in value]
    return value


def render_value(value: Any, context: Mapping[str, Any]) -> Any:
    """Render every string inside dicts and lists (keys are not rendered).

    One time and size budget covers the whole structure. Tuples come back as lists.

    Args:
        value: A string, or a structure of dicts/lists with strings inside.
        context: The names the templates see.

    Returns:
        The same structure with each string replaced by :func:`render`'s result.

    Raises:
        TemplateError: As :func:`render`, for the first string that fails.
    """
    for text in _each_string(value):
        compile_template(text)
    return _guarded(lambda: _render_tree(value, context))


def evaluate_guard(source: str, context: Mapping[str, Any]) -> bool:
    """Evaluate an edge guard such as ``{{ .output.status == 'success' }}``.

    A source without ``{{ }}`` is evaluated as a bare expression (``output.ok``).

    Args:
        source: The guard.
        context: The names it sees, ``output`` included.

    Returns:
        The truthiness of the native value; the strings ``""``, ``"false"``, ``"0"``,
        ``"none"`` and ``"null"`` (any case, surrounding blanks ignored) are false.

    Raises:
        TemplateError: Also when a referenced field is missing: never a silent False.
    """
    if not _has_markup(source) and len(source) > _MAX_SOURCE_CHARS:
        raise _error(TemplateLimitError, f"guard longer than {_MAX_SOURCE_CHARS} characters")
    compiled = _compiled(source) if _has_markup(source) else _compile_condition(source, 0)
    return _truthy(_guarded(lambda: _run(compiled, context), 0, compiled.line))


def evaluate_expression(source: str, context: Mapping[str, Any]) -> str:
    """Evaluate a condition node's expression and return its label.

    Two forms: ``if <expr>: <label>`` / ``elif <expr>: <label>`` / ``else: <label>``
    lines (blank lines and ``#`` comments ignored; a label is a name or a quoted
    string), or a template whose value is the label.

    Args:
        source: The expression.
        context: The names it sees, ``output`` included.

    Returns:
        The label of the first true clause (the ``else`` label if none is).

    Raises:
        TemplateError: Malformed expression, a missing field (named in the message),
            or a template that does not produce a non-empty string.
    """
    if _is_if_form(source):
        clauses = _if_form(source)

        def choose() -> str:
            for clause in clauses[:-1]:
                condition = cast(_Compiled, clause.condition)
                run = functools.partial(_run, condition, context)
                if _truthy(_guarded(run, clause.line - 1, 1)):
                    return clause.label
            return clauses[-1].label

        return _guarded(choose)
    if not _has_markup(source):
        raise _not_an_expression(source)
    value = render(source, context)
    if not isinstance(value, str) or not value.strip():
        raise _error(TemplateError, f"the expression produced {value!r}, not a label")
    return value.strip()


def expression_labels(source: str) -> tuple[str, ...] | None:
    """The labels a condition expression can produce, for validating ``when:`` edges.

    Args:
        source: The expression.

    Returns:
        The labels of the ``if/elif/else`` form in document order without duplicates,
        or None for the template form, whose labels cannot be known statically.

    Raises:
        TemplateError: ``elif``/``else`` before ``if``, text after ``else``, a missing
            final ``else``, an empty condition, a bad label, a syntax error in a
            condition or template; ``line`` is the line within ``source``.
    """
    if _is_if_form(source):
        return tuple(dict.fromkeys(clause.label for clause in _if_form(source)))
    if not _has_markup(source):
        raise _not_an_expression(source)
    _compiled(source)
    return None


def _node_ids(tree: nodes.Node) -> frozenset[str] | None:
    found: set[str] = set()
    static: set[int] = set()
    called = {id(call.node) for call in tree.find_all(nodes.Call)}
    for found_node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        node = cast(nodes.Getattr | nodes.Getitem, found_node)
        inner = node.node
        if not (isinstance(inner, nodes.Name) and inner.name == "nodes") or id(node) in called:
            continue  # nodes.get('x'), nodes.items() are method calls, not node ids
        if isinstance(node, nodes.Getattr):
            found.add(node.attr)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            found.add(node.arg.value)
        else:
            continue
        static.add(id(inner))
    for name in tree.find_all(nodes.Name):
        if name.name == "nodes" and (name.ctx != "load" or id(name) not in static):
            return None  # nodes[var], nodes|..., a loop over nodes, or a shadowing name
    return frozenset(found)


def referenced_nodes(source: str) -> frozenset[str] | None:
    """Node ids a template or condition expression reads as ``nodes.<id>``.

    Args:
        source: A template, or an ``if/elif/else`` expression. Plain text refers to
            no node.

    Returns:
        The ids used as ``nodes.<id>``, ``nodes['<id>']`` or ``nodes["<id>"]``; None when
        ``nodes`` is used dynamically (``nodes[var]``, ``nodes|...``, iterated,
        reassigned), so the set cannot be known.

    Raises:
        TemplateError: The source does not compile.
    """
    if _has_markup(source):
        return _node_ids(_compiled(source).tree)
    if not _is_if_form(source):
        return frozenset()
    found: set[str] = set()
    for clause in _if_form(source):
        ids = _node_ids(clause.condition.tree) if clause.condition else frozenset[str]()
        if ids is None:
            return None
        found |= ids
    return frozenset(found)


def template_context(
    *,
    input: Any,
    nodes: Mapping[str, Any],
    task: Mapping[str, Any] | None = None,
    output: Any = MISSING,
) -> dict[str, Any]:
    """Build the names a template sees.

    Args:
        input: The task input.
        nodes: Output of each earlier node, by node id.
        task: Task facts (``id``, ``labels``).
        output: This node's output, for guards and condition expressions; leave it
            :data:`MISSING` when rendering a node's input.

    Returns:
        ``{"input": ..., "nodes": {id: {"output": ...}}, "task": {...}}`` plus
        ``"output"`` when given.
    """
    names: dict[str, Any] = {
        "input": input,
        "nodes": {node_id: {"output": nodes[node_id]} for node_id in sorted(nodes)},
        "task": dict(task) if task else {},
    }
    if output is not MISSING:
        names["output"] = output
    return names
