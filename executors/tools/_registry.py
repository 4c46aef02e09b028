"""The one registry of tools, and :func:`tool`, which turns a plain function into one.

Every tool a ``tool_call`` node can name lives in :data:`REGISTRY`: the built-in tools
(registered by :mod:`executors.tools`) and the tools of your own code, registered with
``@ax.tool("name")`` (this module's :func:`tool`) when their module is imported.
:func:`load_tools` imports those modules once per process, from two places:

- the modules named by the ``tool_modules`` handler setting (a list, or a
  comma-separated string) and by the ``AX_TOOL_MODULES`` environment variable
  (comma-separated);
- the entry points of the ``ax.tools`` group of every installed distribution
  (``[project.entry-points."ax.tools"] demo = "ax_tools_demo.tools"``); loading one
  imports its module.

The validator (:func:`executors.registry.tool_names`) and the ``tool_call`` handler
both call :func:`load_tools`, so ``ax validate``, the embedded worker, ``ax executor``,
the subprocess runner's node process and a Kubernetes Job see the same tools. A module
that fails to import (or registers a duplicate name) does not stop the others: the
error is logged and quoted by the "unknown tool" failure of a node that names a tool it
would have provided.

A function tool receives the node's rendered input bound to its parameters and
validated by pydantic before it runs; see :func:`tool` and ``docs/executors.md``.

Errors::

    ToolRegistrationError (ValueError)  a duplicate name or a signature ax cannot bind
    ToolError (Exception)               raised by a tool: a Failure, retryable or not
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import json
import logging
import os
import re
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NotRequired, Required, TypeVar

import pydantic
import pydantic_core
import typing_extensions

from executors.contract import (
    Failure,
    NodeContext,
    NodeRequest,
    Outcome,
    Paused,
    Success,
    Unavailable,
    runs_inline,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "MODULES_ENV",
    "MODULES_SETTING",
    "REGISTRY",
    "FunctionTool",
    "Tool",
    "ToolError",
    "ToolRegistrationError",
    "ToolRegistry",
    "configured_modules",
    "load_tools",
    "tool",
]

_log = logging.getLogger(__name__)

Tool = Callable[[NodeRequest, NodeContext], Outcome]
"""A tool: the same shape as a node handler."""

#: Entry-point group whose entry points name modules of tools.
ENTRY_POINT_GROUP = "ax.tools"
#: Handler setting naming modules of tools to import (a list, or comma-separated).
MODULES_SETTING = "tool_modules"
#: Environment variable naming modules of tools to import (comma-separated).
MODULES_ENV = "AX_TOOL_MODULES"
#: The parameter name through which a function tool receives its NodeContext.
CTX_PARAMETER = "ctx"
#: The parameter name through which a function tool receives its NodeRequest (attempt,
#: ``checkpoint`` and ``resume`` after a pause, ``resume_key`` for a vendor's callback).
REQUEST_PARAMETER = "request"
#: Seconds between cancellation checks while an async tool runs.
CANCEL_CHECK_INTERVAL = 0.05
#: Validation errors quoted in a failure message (the details hold them all).
QUOTED_ERRORS = 5

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")

F = TypeVar("F", bound=Callable[..., Any])


class ToolRegistrationError(ValueError):
    """A tool cannot be registered: its name is taken or malformed, or its signature
    cannot be bound to a node's input."""


class ToolError(Exception):
    """Raise it from a tool to fail the node with a message of your own.

    Args:
        message: What went wrong; the node's error is ``node 'n': tool 't': <message>``.
        retryable: False skips the remaining attempts (bad input, a refused request);
            True (the default, as for any other exception) retries with backoff.
        details: JSON values stored with the failure.
    """

    def __init__(self, message: str, *, retryable: bool = True,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.details = dict(details or {})


@dataclass(frozen=True)
class _Entry:
    run: Tool
    origin: str


class ToolRegistry:
    """Tools by the name a DAG uses in ``tool:``; thread-safe, filled once per process."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._runs: dict[str, Tool] = {}
        #: A live read-only view: name → tool.
        self.tools: Mapping[str, Tool] = MappingProxyType(self._runs)
        self._lock = threading.RLock()
        self._modules_seen: set[str] = set()
        self._entry_points_seen = False
        self._errors: list[str] = []

    def register(self, name: str, run: Tool, *, origin: str) -> None:
        """Add ``run`` under ``name``.

        Registering the same origin again (a module imported twice) replaces the entry.

        Raises:
            ToolRegistrationError: ``name`` is malformed or registered by another origin.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolRegistrationError(
                f"tool name {name!r} ({origin}): use letters, digits, '_', '.' or '-', "
                "starting with a letter or '_'")
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None and existing.origin != origin:
                raise ToolRegistrationError(
                    f"tool {name!r} is registered twice: by {existing.origin} and by "
                    f"{origin}; rename one of them")
            self._entries[name] = _Entry(run, origin)
            self._runs[name] = run

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a tool registered for a while: a test, a plugin unloaded)."""
        with self._lock:
            self._entries.pop(name, None)
            self._runs.pop(name, None)

    def get(self, name: str) -> Tool | None:
        """The tool named ``name``, if registered."""
        return self._runs.get(name)

    def names(self) -> frozenset[str]:
        """Every registered name."""
        with self._lock:
            return frozenset(self._runs)

    def origin(self, name: str) -> str | None:
        """Where ``name`` was registered from (``module:function``)."""
        entry = self._entries.get(name)
        return entry.origin if entry else None

    @property
    def errors(self) -> tuple[str, ...]:
        """Why modules or entry points could not be loaded (one line each)."""
        with self._lock:
            return tuple(self._errors)

    def discover(self, modules: Iterable[str] = (), *, entry_points: bool = True) -> None:
        """Import ``modules`` and (the first time) the ``ax.tools`` entry points.

        Each module is imported once per process; a failure is logged and recorded in
        :attr:`errors`, never raised, so one broken package does not hide the others.
        """
        with self._lock:
            if entry_points and not self._entry_points_seen:
                self._entry_points_seen = True
                for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                    dist = point.dist.name if point.dist is not None else "?"
                    self._load(f"entry point {point.name} = {point.value} ({dist})",
                               point.load)
            for module in modules:
                if module in self._modules_seen:
                    continue
                self._modules_seen.add(module)
                self._load(f"tool module {module!r}",
                           functools.partial(importlib.import_module, module))

    def _load(self, source: str, load: Callable[[], object]) -> None:
        try:
            load()
        except Exception as exc:
            message = f"{source}: {type(exc).__name__}: {exc}"
            self._errors.append(message)
            _log.error("cannot load tools from %s", message)

    def note(self, error: str) -> None:
        """Record a discovery problem found outside :meth:`discover` (a bad setting)."""
        with self._lock:
            if error not in self._errors:
                self._errors.append(error)
                _log.error("%s", error)


#: The registry of this process.
REGISTRY = ToolRegistry()


def configured_modules(settings: Mapping[str, Any] | None = None,
                       env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Modules named by the ``tool_modules`` setting, then by ``AX_TOOL_MODULES``.

    A malformed setting is recorded in ``REGISTRY.errors`` and ignored.
    """
    names: list[str] = []
    value = (settings or {}).get(MODULES_SETTING)
    if isinstance(value, str):
        names += value.split(",")
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        names += value
    elif value is not None:
        REGISTRY.note(f"setting {MODULES_SETTING} must be a list of module names, "
                      f"got {value!r}")
    names += (os.environ if env is None else env).get(MODULES_ENV, "").split(",")
    return tuple(dict.fromkeys(n.strip() for n in names if n.strip()))


def load_tools(settings: Mapping[str, Any] | None = None) -> ToolRegistry:
    """The registry, with the configured modules and ``ax.tools`` entry points loaded.

    Cheap after the first call (each module is imported once per process).
    """
    REGISTRY.discover(configured_modules(settings))
    return REGISTRY


def tool(name: str, *, registry: ToolRegistry | None = None) -> Callable[[F], F]:
    """Register a plain (sync or async) function as the tool ``name``.

    The node's rendered input is bound to the parameters and validated with pydantic
    when the node runs:

    - one parameter annotated with a pydantic model gets the whole input, validated as
      that model;
    - otherwise a JSON object input is bound key by key (unknown keys are errors,
      parameters with defaults are optional), and any other input goes to the only
      parameter; annotations are the validation schema (none means ``Any``);
    - a parameter named ``ctx`` receives the :class:`~executors.contract.NodeContext`
      (``settings``, ``heartbeat()``, ``progress()``, ``effect()``, ``cancelled``);
    - a parameter named ``request`` receives the :class:`~executors.contract.NodeRequest`
      (``attempt``, ``checkpoint`` and ``resume`` after a pause, ``resume_key``).

    The return value is the output: JSON values, pydantic models, dataclasses, dates…
    (converted with pydantic's JSON mode); an ``Outcome`` (``Success``, ``Failure``,
    ``Unavailable``, ``Paused``) is passed on as is. Invalid input is a non-retryable failure naming
    the node, tool and field; an exception is a retryable failure unless it is a
    :class:`ToolError` with ``retryable=False`` (or carries ``retryable = False``).
    An ``async def`` runs in an event loop of its own in the handler's thread and is
    cancelled once ``ctx.cancelled`` turns true. A function that returns at once and
    never waits may also be marked :func:`~executors.contract.inline`: the thread runner
    then calls it on its event loop.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        ToolRegistrationError: (from the decorator) the name is taken by another
            function, or the signature cannot be bound (``*args``, ``**kwargs``,
            positional-only parameters, a type pydantic cannot validate).
    """
    target = REGISTRY if registry is None else registry

    def register(function: F) -> F:
        target.register(name, FunctionTool(name, function), origin=_origin(function))
        return function

    return register


def _origin(function: Callable[..., Any]) -> str:
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', '?')}"


class FunctionTool:
    """The ``(request, ctx) -> Outcome`` form of a function registered with :func:`tool`.

    Raises:
        ToolRegistrationError: The signature cannot be bound to a node's input.
    """

    def __init__(self, name: str, function: Callable[..., Any]) -> None:
        self.name = name
        self.function = function
        where = f"tool {name!r} ({_origin(function)})"
        try:
            signature = inspect.signature(function)
            hints = _parameter_hints(function)
        except (TypeError, ValueError, NameError) as exc:
            raise ToolRegistrationError(f"{where}: cannot read its signature: {exc}") from exc
        self.wants_ctx = self.wants_request = False
        fields: dict[str, Any] = {}
        for param in signature.parameters.values():
            if param.name == CTX_PARAMETER:
                self.wants_ctx = True
                continue
            if param.name == REQUEST_PARAMETER:
                self.wants_request = True
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
                raise ToolRegistrationError(
                    f"{where}: parameter {param.name!r} cannot be bound to a node input; "
                    "use named parameters (or one pydantic model)")
            hint = hints.get(param.name, Any)
            fields[param.name] = (Required[hint] if param.default is param.empty
                                  else NotRequired[hint])
        self.parameters = tuple(fields)
        only = hints.get(self.parameters[0]) if len(fields) == 1 else None
        #: The parameter that takes the whole input as a pydantic model, if any.
        self.model_parameter = (self.parameters[0] if isinstance(only, type)
                                and issubclass(only, pydantic.BaseModel) else None)
        #: What the input should be, for error messages.
        self.expects = (f"its input: {getattr(only, '__name__', 'a model')}"
                        if self.model_parameter is not None
                        else f"its parameters: {', '.join(self.parameters) or 'none'}")
        schema: Any = only
        if self.model_parameter is None:
            # The arguments as a TypedDict (not a model): parameters named like BaseModel
            # attributes are fine, and a missing optional key leaves the function's own
            # default in charge. pydantic needs typing_extensions' TypedDict before 3.12.
            make_typed_dict: Any = typing_extensions.TypedDict
            schema = make_typed_dict(f"{name}_input", fields)
            schema.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")
        try:
            self._adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(schema)
        except pydantic.PydanticUserError as exc:  # includes schema generation errors
            raise ToolRegistrationError(f"{where}: {exc}") from exc

    def inline_for(self, request: NodeRequest) -> bool:
        """Whether the function is marked :func:`~executors.contract.inline` (above or
        below ``@ax.tool``): binding and validating its input are quick too."""
        return runs_inline(self.function, request)

    def __call__(self, request: NodeRequest, ctx: NodeContext) -> Outcome:
        where = f"node {request.node_id!r}: tool {self.name!r}"
        try:
            kwargs = self.arguments(request.input)
        except pydantic.ValidationError as exc:
            return _invalid(where, exc, self.expects)
        if self.wants_ctx:
            kwargs[CTX_PARAMETER] = ctx
        if self.wants_request:
            kwargs[REQUEST_PARAMETER] = request
        try:
            result = self.function(**kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(_supervised(result, ctx))
        except _Stopped:
            return Failure("stopped: the run was cancelled or its fence went stale",
                           retryable=True, details={"stopped": True})
        except Exception as exc:
            return _raised(where, exc, request)
        return _outcome(where, result)

    def arguments(self, value: Any) -> dict[str, Any]:
        """The keyword arguments of the function for the node input ``value``.

        Raises:
            pydantic.ValidationError: ``value`` does not fit the parameters.
        """
        if self.model_parameter is not None:
            return {self.model_parameter: self._adapter.validate_python(
                {} if value is None else value)}
        if value is None:
            value = {}
        elif not isinstance(value, Mapping) and len(self.parameters) == 1:
            value = {self.parameters[0]: value}
        return dict(self._adapter.validate_python(value))


def _parameter_hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The evaluated annotations of the parameters but ``ctx`` (whose type a module may
    import only for type checkers) and the return value (never validated)."""
    annotations = dict(getattr(function, "__annotations__", None) or {})
    annotations.pop(CTX_PARAMETER, None)
    annotations.pop(REQUEST_PARAMETER, None)
    annotations.pop("return", None)
    target = inspect.unwrap(function)
    holder = types.SimpleNamespace(__annotations__=annotations,
                                   __globals__=getattr(target, "__globals__", {}))
    return typing.get_type_hints(holder, include_extras=True)


class _Stopped(Exception):
    pass


async def _supervised(awaitable: Any, ctx: NodeContext) -> Any:
    task = asyncio.ensure_future(awaitable)
    while True:
        done, _ = await asyncio.wait({task}, timeout=CANCEL_CHECK_INTERVAL)
        if done:
            return task.result()
        if ctx.cancelled:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise _Stopped


def _invalid(where: str, exc: pydantic.ValidationError, expects: str) -> Failure:
    errors = [{"field": ".".join(str(p) for p in e["loc"]) or "(input)", "message": e["msg"]}
              for e in exc.errors(include_url=False)]
    quoted = "; ".join(f"field {e['field']!r}: {e['message']}" for e in errors[:QUOTED_ERRORS])
    more = f" (and {len(errors) - QUOTED_ERRORS} more)" if len(errors) > QUOTED_ERRORS else ""
    return Failure(f"{where}: invalid input: {quoted}{more} ({expects})", retryable=False,
                   details={"errors": errors})


def _raised(where: str, exc: Exception, request: NodeRequest) -> Failure:
    from executors.policy import PolicyError  # the policy's refusals never pass on a retry

    if isinstance(exc, ToolError):
        return Failure(f"{where}: {exc}", retryable=exc.retryable,
                       details={**exc.details, "exception": "ToolError"})
    _log.exception("%s raised (task %s)", where, request.task_id)
    flag = getattr(exc, "retryable", True)
    retryable = (flag if isinstance(flag, bool) else True) and not isinstance(exc, PolicyError)
    return Failure(f"{where} raised {type(exc).__name__}: {exc}", retryable=retryable,
                   details={"exception": type(exc).__name__, "attempt": request.attempt})


def _outcome(where: str, result: Any) -> Outcome:
    if isinstance(result, Success | Failure | Unavailable | Paused):
        return result
    try:
        output = pydantic_core.to_jsonable_python(result)
        json.dumps(output, allow_nan=False)
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
        return Failure(f"{where} returned a {type(result).__name__}, which is not JSON: "
                       f"{exc}", retryable=False)
    return Success(output)
