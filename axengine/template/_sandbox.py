"""The sandboxed environment: allowlisted attributes and calls, intercepted operators.

:data:`_ENV` is the one :class:`_Sandbox` every template is compiled in.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from types import BuiltinMethodType, MethodType
from typing import Any, cast

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, LoopContext, Macro, StrictUndefined, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import missing

from axengine.errors import TemplateLimitError
from axengine.template._budget import (
    _MAX_INT_BITS,
    MAX_OUTPUT_CHARS,
    _charge,
    _error,
    _nested_call,
    _size,
)
from axengine.template._filters import _build_filters
from axengine.template._values import (
    _bounded_range,
    _check_format,
    _check_replace,
    _describe,
    _finalize,
    _join_buffer,
    _join_size,
    _refuse,
    _text,
)

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
            if name == "output":
                return ("'output' is undefined here: it exists only in guards and condition "
                        "expressions (read an earlier node's result as nodes.<id>.output)")
            if name == "node":
                return ("'node' is undefined here: it (this node's rendered input) exists "
                        "only in a prompt and a gate's description")
            return (f"{name!r} is undefined (templates can use input, nodes, task; output "
                    "in guards, node in prompts)")
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
        if obj is _bounded_range:
            return context.call(obj, *args, **kwargs)
        if isinstance(obj, (Macro, LoopContext)):
            return _nested_call(lambda: context.call(obj, *args, **kwargs))
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
