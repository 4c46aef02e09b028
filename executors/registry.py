"""Names of the tools and models handlers know, and lookup of handlers by node type.

The DAG validator uses :func:`tool_names` and :func:`model_names` to reject a DAG that
names a tool or model nobody can run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["model_names", "tool_names"]


def tool_names(settings: Mapping[str, Any] | None = None) -> frozenset[str]:
    """Every tool name the ``tool_call`` handler can run: the built-in tools and those
    of the modules named by the handler ``settings``' ``tool_modules``, by
    ``AX_TOOL_MODULES`` and by the ``ax.tools`` entry points (each loaded once per
    process)."""
    from executors.tools import load_tools

    return load_tools(settings).names()


def model_names(llm: Mapping[str, Any] | None = None) -> frozenset[str]:
    """Every model name the ``llm_call`` handler accepts.

    The simulator's defaults, ``$AX_LLM_MODELS``, and every model the ``llm``
    configuration names (its ``models`` and each endpoint's ``models``).

    Args:
        llm: The ``llm`` table the config layer built (None: read ``AX_LLM__…`` from the
            environment, as the handler does without one).

    Raises:
        executors.llm.LlmConfigError: The configuration does not validate.
    """
    from executors.llm import known_models, llm_settings

    settings = {} if llm is None else {"llm": llm}
    return frozenset(known_models(llm_settings(settings)))
