"""The tools a ``tool_call`` node can run, and the ``tool_call`` handler itself.

A tool has the handler signature ``(request, ctx) -> Outcome``; ``request.input`` is the
node's rendered input. :data:`TOOLS` maps the names a DAG may use to tools:

=================  ==============================================================
``pdf_parser``     text of a PDF (path, ``file:`` URI or allowed http URL)
``http_request``   one HTTP(S) request to an allowed host
``send_email``     one email, at most once per node input (outbox), SMTP or mailbox
``video_vendor``   a slow paid vendor job that re-attaches after a crash (simulated)
``echo``           returns its input
``sleep``          waits while heartbeating
=================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from executors.contract import Failure, NodeContext, NodeRequest, Outcome
from executors.tools._common import simulated_fault
from executors.tools.echo import echo
from executors.tools.http_request import http_request
from executors.tools.pdf_parser import pdf_parser
from executors.tools.send_email import send_email
from executors.tools.sleep import sleep
from executors.tools.video_vendor import video_vendor

__all__ = ["TOOLS", "Tool", "tool_call"]

Tool = Callable[[NodeRequest, NodeContext], Outcome]
"""A tool: the same shape as a node handler."""

#: Every tool by the name a DAG uses in ``tool:``.
TOOLS: Mapping[str, Tool] = MappingProxyType({
    "echo": echo,
    "http_request": http_request,
    "pdf_parser": pdf_parser,
    "send_email": send_email,
    "sleep": sleep,
    "video_vendor": video_vendor,
})


def tool_call(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """The ``tool_call`` handler: run the tool named by ``config["tool"]``.

    The node's generic ``simulate:`` knobs (``unavailable``, ``unavailable_until``,
    ``latency``, ``fail_attempts``) act before the tool runs.
    """
    name = request.config.get("tool")
    tool = TOOLS.get(name) if isinstance(name, str) else None
    if tool is None:
        return Failure(
            f"node {request.node_id!r}: unknown tool {name!r}; known tools: "
            f"{', '.join(sorted(TOOLS))}",
            retryable=False,
        )
    fault = simulated_fault(request, ctx)
    if fault is not None:
        return fault
    return tool(request, ctx)
