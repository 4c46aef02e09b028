"""The seam between the ``llm_call`` handler and whatever produces completions.

Error hierarchy (retryability is a property of the error)::

    Exception
    ├── ProviderUnavailable   the model cannot be reached right now (outage, 5xx, 429,
    │                         connection refused); the node waits without spending an
    │                         attempt and the model's circuit breaker counts it
    └── ProviderError         the call failed; ``retryable`` says whether another attempt
                              can help (a 400 for an oversized prompt cannot)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Completion", "Provider", "ProviderError", "ProviderUnavailable"]


@dataclass(frozen=True)
class Completion:
    """A completion with what the endpoint reported about it.

    Attributes:
        text: The model's answer.
        usage: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` (None: the
            provider does not count tokens).
        endpoint: Name of the endpoint that answered.
    """

    text: str
    usage: Mapping[str, int] | None = None
    endpoint: str = ""


class ProviderUnavailable(Exception):
    """The model endpoint is down or refusing work; ``evidence`` says what was seen.

    ``retry_after`` is the endpoint's ``Retry-After`` in seconds, when it sent one.
    """

    def __init__(self, evidence: str, *, retry_after: float | None = None) -> None:
        super().__init__(evidence)
        self.evidence = evidence
        self.retry_after = retry_after


class ProviderError(Exception):
    """A model call failed.

    Attributes:
        message: What went wrong, for the node's error.
        retryable: Whether another attempt may succeed.
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class Provider(Protocol):
    """Produces one completion for one prompt."""

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        temperature: float,
        max_tokens: int | None,
        settings: Mapping[str, Any],
    ) -> str | Completion:
        """Return the model's completion (text, or a :class:`Completion` with usage).

        Args:
            model: Model name (one of :func:`executors.llm.known_models`).
            prompt: The full prompt, input included.
            temperature: Sampling temperature.
            max_tokens: Completion bound, or None for the provider's default.
            settings: Handler settings (endpoint, key, timeouts, simulation knobs).

        Raises:
            ProviderUnavailable: The model cannot be reached right now.
            ProviderError: The call failed.
        """
        ...
