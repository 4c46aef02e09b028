"""Which model names the ``llm_call`` handler accepts."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executors.llm._config import LlmSettings

__all__ = ["DEFAULT_MODELS", "MODELS_ENV", "known_models"]

#: Models every installation knows (real names are served by the OpenAI-compatible
#: provider when one is configured, by the simulated model otherwise).
DEFAULT_MODELS: frozenset[str] = frozenset({
    "gpt-4-turbo",
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-3.5-turbo",
    "sim-small",
    "sim-large",
    "moderation-v1",
    "moderation-lite",
})

#: Environment variable with extra model names, comma-separated.
MODELS_ENV = "AX_LLM_MODELS"


@functools.cache
def _env_models() -> frozenset[str]:
    # Read once per process: the validator and the handler must agree on the set for
    # the process's whole life.
    raw = os.environ.get(MODELS_ENV, "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def known_models(config: LlmSettings | None = None) -> frozenset[str]:
    """Every model name the ``llm_call`` handler accepts.

    Args:
        config: The ``llm`` configuration whose ``models`` and endpoints' ``models`` are
            added (None: none).

    Returns:
        :data:`DEFAULT_MODELS` plus the names listed in ``$AX_LLM_MODELS`` and in
        ``config``.
    """
    extra = config.model_names() if config is not None else frozenset()
    return DEFAULT_MODELS | _env_models() | extra
