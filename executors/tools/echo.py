"""``echo``: returns its input unchanged (log and completion nodes). It is
:func:`~executors.contract.inline`: the thread runner calls it on the event loop."""

from __future__ import annotations

from executors.contract import NodeContext, NodeRequest, Outcome, Success, inline

__all__ = ["echo"]


@inline
def echo(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Succeed with the node input as the output."""
    return Success(request.input)
