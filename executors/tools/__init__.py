"""The tools a ``tool_call`` node can run, and the ``tool_call`` handler itself.

A tool has the handler signature ``(request, ctx) -> Outcome``; ``request.input`` is the
node's rendered input. Every tool lives in one registry (:data:`REGISTRY`,
:mod:`executors.tools._registry`): the built-in tools below, registered here, and your
own functions registered with ``@ax.tool("name")`` (:func:`tool`), found through the
``tool_modules`` setting, ``AX_TOOL_MODULES`` and ``ax.tools`` entry points
(:func:`load_tools`). :data:`TOOLS` is a live read-only view of it. The built-in tools:

=================  ==============================================================
``pdf_parser``     text of a PDF (path, ``file:`` URI or allowed http URL)
``http_request``   one HTTP(S) request to an allowed host
``send_email``     one email, at most once per node input (outbox), SMTP or mailbox
``video_vendor``   a slow paid vendor job that re-attaches after a crash (simulated)
``echo``           returns its input (inline: run on the event loop)
``sleep``          waits while heartbeating
=================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from executors.contract import (
    INLINE_ATTRIBUTE,
    Failure,
    NodeContext,
    NodeRequest,
    Outcome,
    runs_inline,
)
from executors.tools._common import simulated_fault
from executors.tools._registry import (
    ENTRY_POINT_GROUP,
    MODULES_ENV,
    MODULES_SETTING,
    REGISTRY,
    FunctionTool,
    Tool,
    ToolError,
    ToolRegistrationError,
    ToolRegistry,
    configured_modules,
    load_tools,
    tool,
)
from executors.tools.echo import echo
from executors.tools.http_request import http_request
from executors.tools.pdf_parser import pdf_parser
from executors.tools.send_email import send_email
from executors.tools.sleep import sleep
from executors.tools.video_vendor import video_vendor

__all__ = [
    "BUILTIN_TOOLS",
    "ENTRY_POINT_GROUP",
    "MODULES_ENV",
    "MODULES_SETTING",
    "REGISTRY",
    "TOOLS",
    "FunctionTool",
    "Tool",
    "ToolError",
    "ToolRegistrationError",
    "ToolRegistry",
    "configured_modules",
    "load_tools",
    "tool",
    "tool_call",
]

#: The tools ax ships, by the name a DAG uses in ``tool:``.
BUILTIN_TOOLS: Mapping[str, Tool] = MappingProxyType({
    "echo": echo,
    "http_request": http_request,
    "pdf_parser": pdf_parser,
    "send_email": send_email,
    "sleep": sleep,
    "video_vendor": video_vendor,
})
for _name, _tool in BUILTIN_TOOLS.items():
    REGISTRY.register(_name, _tool, origin=f"{_tool.__module__}:{_tool.__qualname__} (built in)")

#: Every registered tool by name (a live view of :data:`REGISTRY`; call
#: :func:`load_tools` first to include the configured and installed ones).
TOOLS: Mapping[str, Tool] = REGISTRY.tools


def tool_call(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """The ``tool_call`` handler: run the tool named by ``config["tool"]``.

    Loads the configured and installed tools first (once per process: this is how the
    subprocess runner's node process and a Kubernetes Job find them). The node's generic
    ``simulate:`` knobs (``unavailable``, ``unavailable_until``, ``latency``,
    ``fail_attempts``) act before the tool runs.
    """
    registry = load_tools(ctx.settings)
    name = request.config.get("tool")
    found = registry.get(name) if isinstance(name, str) else None
    if found is None:
        problems = "".join(f"; {error}" for error in registry.errors)
        return Failure(
            f"node {request.node_id!r}: unknown tool {name!r}; known tools: "
            f"{', '.join(sorted(registry.names()))}{problems}",
            retryable=False,
        )
    fault = simulated_fault(request, ctx)
    if fault is not None:
        return fault
    return found(request, ctx)


def _tool_inline(request: NodeRequest) -> bool:
    """Whether the tool a ``tool_call`` request names is inline (and no ``simulate:``
    knob, which may wait, acts first). A tool not registered yet (its module is loaded
    on first use) runs in a thread the first time."""
    name = request.config.get("tool")
    found = REGISTRY.get(name) if isinstance(name, str) else None
    return (found is not None and not request.config.get("simulate")
            and runs_inline(found, request))


setattr(tool_call, INLINE_ATTRIBUTE, _tool_inline)
