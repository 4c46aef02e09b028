"""The ``llm_call`` handler and the model providers behind it.

- :data:`llm_call` — the handler (one per process, holding the model health tracker,
  the circuit breakers and the in-memory result cache).
- :class:`Provider` — the seam to a model: :class:`SimulatedProvider` (deterministic,
  offline, the default) and :class:`OpenAICompatibleProvider` (any ``/chat/completions``
  endpoint, on the ``openai`` client), chosen per model by :class:`LlmSettings`.
- :func:`known_models` — the model names a DAG may use.

See ``docs/executors.md`` for settings and the simulated model's knobs.
"""

from __future__ import annotations

from executors.llm._cache import ResultCache, cache_key
from executors.llm._config import (
    EndpointSettings,
    LlmConfigError,
    LlmSettings,
    Route,
    llm_settings,
)
from executors.llm._handler import (
    DEFAULT_TEMPERATURE,
    HeartbeatingProvider,
    LlmCall,
    MalformedAnswer,
    ProviderFactory,
    RoutingProvider,
    default_provider,
    parse_completion,
)
from executors.llm._health import CircuitBreakers, CircuitState, ModelHealth
from executors.llm._models import DEFAULT_MODELS, MODELS_ENV, known_models
from executors.llm._openai import OpenAICompatibleProvider
from executors.llm._prompt import INPUT_MARKER, compose_prompt
from executors.llm._provider import Completion, Provider, ProviderError, ProviderUnavailable
from executors.llm._simulated import SimulatedProvider, knobs_for_model, merge_knobs

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_TEMPERATURE",
    "INPUT_MARKER",
    "MODELS_ENV",
    "CircuitBreakers",
    "CircuitState",
    "Completion",
    "EndpointSettings",
    "HeartbeatingProvider",
    "LlmCall",
    "LlmConfigError",
    "LlmSettings",
    "MalformedAnswer",
    "ModelHealth",
    "OpenAICompatibleProvider",
    "Provider",
    "ProviderError",
    "ProviderFactory",
    "ProviderUnavailable",
    "ResultCache",
    "Route",
    "RoutingProvider",
    "SimulatedProvider",
    "cache_key",
    "compose_prompt",
    "default_provider",
    "knobs_for_model",
    "known_models",
    "llm_call",
    "llm_settings",
    "merge_knobs",
    "parse_completion",
]

#: The process's ``llm_call`` handler.
llm_call = LlmCall()
