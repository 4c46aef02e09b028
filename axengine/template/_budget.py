"""Bounds of one render: the constants, the CPU clock, the character budget.

A render runs inside :func:`_guarded`, which opens one :class:`_Session` per outermost
call (nested calls share it), installs the ``sys.settrace`` hook that reads the CPU clock,
and maps anything raised into a :class:`~axengine.errors.TemplateError` carrying the
template ``line``. :func:`_charge` counts the characters built in intermediate values.
"""

from __future__ import annotations

import gc
import math
import sys
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from types import FrameType, TracebackType
from typing import Any, TypeVar, cast

from jinja2.environment import Template
from jinja2.exceptions import SecurityError, UndefinedError

from axengine.errors import TemplateError, TemplateLimitError, TemplateSecurityError
from axengine.limits import past_int_digits

#: Bound on the text one render may produce (and on any single repeated value).
MAX_OUTPUT_CHARS: int = 65536
#: Bound on the CPU time of one render (one whole :func:`render_value` call).
MAX_RENDER_SECONDS: float = 0.25
#: Bound on the length of ``range()``.
MAX_RANGE: int = 10000
#: Bound on nested macro calls and recursive loop levels in one render. It holds
#: whatever recursion limit the host process set: deeper Jinja2 calls would overflow the
#: C stack (a crash, not an error) in a process that raised ``sys.setrecursionlimit``.
MAX_CALL_DEPTH: int = 100

#: Characters (or list items) one render may build in intermediate values. Generous, so
#: that a guard may lower-case a big document, but small enough to cap memory.
_MAX_WORK_CHARS = 256 * MAX_OUTPUT_CHARS
#: Bound on integers built by ``*`` and ``**`` (Python refuses to print > 4300 digits).
_MAX_INT_BITS = 8192
#: Template sources longer than this (with template markup) are refused.
_MAX_SOURCE_CHARS = MAX_OUTPUT_CHARS
#: The CPU clock is read every this many traced events (calls and template lines).
_CHECK_EVERY = 128
#: Jinja's file name for code compiled from a string: how the trace hook tells template
#: frames from library frames.
_TEMPLATE_FILE = "<template>"

_E = TypeVar("_E", bound=TemplateError)
_T = TypeVar("_T")


def _error(cls: type[_E], message: str, line: int = 0) -> _E:
    exc = cls(message)
    cast(Any, exc).line = line
    return exc


class _Interrupted(BaseException):
    """Raised by the trace hook; a BaseException so no ``except Exception`` swallows it."""


class _GcClock(threading.local):
    """The CPU time this thread has spent collecting garbage (finalizers included)."""

    started = 0.0
    spent = 0.0


_GC_CLOCK = _GcClock()


def _count_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _GC_CLOCK.started = time.thread_time()
    else:
        _GC_CLOCK.spent += time.thread_time() - _GC_CLOCK.started


gc.callbacks.append(_count_gc)


class _Session:
    """The budget of one render: CPU deadline, trace countdown, characters built."""

    __slots__ = ("countdown", "deadline", "depth", "gc_spent", "lines", "work")

    def __init__(self, *, timed: bool = True) -> None:
        # Untimed: a render that cannot loop (axengine.template._fast) needs no clock,
        # and reading the thread's CPU clock is a system call.
        self.deadline = time.thread_time() + MAX_RENDER_SECONDS if timed else math.inf
        self.gc_spent = _GC_CLOCK.spent
        self.countdown = _CHECK_EVERY
        self.work = 0
        self.depth = 0
        self.lines = self._trace_lines

    def check_clock(self) -> None:
        self.countdown = _CHECK_EVERY
        # Thread CPU time, not wall time: a busy server must not fail honest renders.
        # Nor does a garbage collection that happens to run on this thread count (a
        # full one, with the finalizers it runs, can take longer than a render may).
        used_by_gc = _GC_CLOCK.spent - self.gc_spent
        if time.thread_time() - used_by_gc > self.deadline:
            raise _Interrupted

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.countdown -= 1
        template = frame.f_code.co_filename == _TEMPLATE_FILE
        # The deadline is enforced only in code of the render itself (the template, the
        # sandbox, Jinja2): a finalizer the garbage collector happens to run on this
        # thread (a gRPC channel's, an asyncio transport's) must never be interrupted
        # halfway. Its calls still count; the next frame of the render checks the clock.
        if self.countdown <= 0 and (template or _is_render_code(frame)):
            self.check_clock()
        # Line events only for compiled template code: that is where unbounded loops
        # live; library frames are still counted through their call events.
        return self.lines if template else None

    def _trace_lines(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.countdown -= 1
        if self.countdown <= 0:
            self.check_clock()
        return self.lines


#: Modules whose frames belong to a render (where the deadline may interrupt).
_RENDER_MODULES = ("jinja2", "markupsafe", "axengine.template")


def _is_render_code(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__", "")
    return isinstance(module, str) and module.startswith(_RENDER_MODULES)


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


def _nested_call(call: Callable[[], _T]) -> _T:
    """Run a macro or recursive-loop call one level deeper, within MAX_CALL_DEPTH."""
    session = _SESSION.get()
    if session is None:
        return call()
    if session.depth >= MAX_CALL_DEPTH:
        message = f"macro calls or recursive loops nested deeper than {MAX_CALL_DEPTH} levels"
        raise _error(TemplateLimitError, message)
    session.depth += 1
    try:
        return call()
    finally:
        session.depth -= 1


def _remaining() -> int:
    session = _SESSION.get()
    return _MAX_WORK_CHARS - session.work if session else MAX_OUTPUT_CHARS


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else 0


def _tick() -> None:
    session = _SESSION.get()
    if session is not None:
        session.check_clock()


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
    if past_int_digits(exc):
        message = f"an integer longer than {sys.get_int_max_str_digits()} digits cannot be text"
        return _error(TemplateLimitError, message, line)
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
