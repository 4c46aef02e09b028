"""Names of the tools and models handlers know, and lookup of handlers by node type.

The DAG validator uses :func:`tool_names` and :func:`model_names` to reject a DAG that
names a tool or model nobody can run.
"""

from __future__ import annotations

__all__ = ["model_names", "tool_names"]


def tool_names() -> frozenset[str]:
    """Every tool name the ``tool_call`` handler can run."""
    from executors.tools import TOOLS

    return frozenset(TOOLS)


def model_names() -> frozenset[str]:
    """Every model name the ``llm_call`` handler accepts (configured models)."""
    from executors.llm import known_models

    return frozenset(known_models())
