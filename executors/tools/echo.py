"""``echo``: returns its input unchanged (log and completion nodes)."""

from __future__ import annotations

from executors.contract import NodeContext, NodeRequest, Outcome, Success

__all__ = ["echo"]


def echo(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Succeed with the node input as the output."""
    return Success(request.input)
