"""The ``llm_call`` node handler: cache, circuit breaker, fallback, output parsing.

The prompt arrives rendered in ``request.config["prompt"]``; the node input, when there
is one, is appended after an ``Input:`` line. The handler never renders templates.

Per call of one model::

    temperature 0 and cached?  ── yes ──▶ Success(cached answer)
        │ no
    circuit open?              ── yes ──▶ Unavailable (endpoint not touched)
        │ no
    provider.complete(...)     ── outage ──▶ count for the circuit; Unavailable
        │                      ── error  ──▶ Failure(retryable as the error says)
    parse the completion       ── JSON asked but not given ──▶ Failure(retryable)
        │
    Success(JSON value, or {"text": completion}; object outputs of a provider that
            counts tokens also carry ``_llm: {model, endpoint, usage}``)

With ``fallback: {model, threshold}`` the fallback model is called first while the
primary's recent success rate is below ``threshold``, and is tried second when the
primary is unavailable right now. Model choices show up as progress markers
(``llm:<model>``, ``llm:fallback ...``) in the node's timeline; the output is the
model's answer, so guards read ``output.revenue_growth`` directly. Token usage, when the
provider reports it, is a progress marker (``llm:<model> usage ...``) and, unless
``llm.usage_in_output`` is false, the ``_llm`` key of an object output.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success, Unavailable
from executors.keepalive import DEFAULT_HEARTBEAT_INTERVAL, Keepalive
from executors.llm._cache import ResultCache, cache_key
from executors.llm._config import LlmConfigError, LlmSettings, llm_settings
from executors.llm._health import CircuitBreakers, ModelHealth
from executors.llm._models import MODELS_ENV, known_models
from executors.llm._openai import OpenAICompatibleProvider
from executors.llm._prompt import asks_for_json, compose_prompt, requested_keys
from executors.llm._provider import Completion, Provider, ProviderError, ProviderUnavailable
from executors.llm._simulated import SimulatedProvider, merge_knobs

__all__ = [
    "DEFAULT_TEMPERATURE",
    "HeartbeatingProvider",
    "LlmCall",
    "MalformedAnswer",
    "ProviderFactory",
    "RoutingProvider",
    "default_provider",
    "parse_completion",
]

#: Temperature of a node that does not set one; only temperature 0 is cached.
DEFAULT_TEMPERATURE = 0.7

ProviderFactory = Callable[[NodeRequest, NodeContext], Provider]
"""Builds the provider for one node attempt (it may capture the context for liveness)."""

_MARKER_LIMIT = 200
_SNIPPET = 200
_STOPPED = "stopped: the run was cancelled or its fence went stale"


class HeartbeatingProvider:
    """Runs a blocking provider in a helper thread and keeps the node alive meanwhile.

    If the run is cancelled or its fence goes stale the call is abandoned (the helper
    thread ends on its own, bounded by the provider's timeout) and a retryable
    :class:`ProviderError` is raised.

    Args:
        inner: The blocking provider.
        keepalive: Called every ``poll`` seconds; False abandons the call.
        poll: Seconds between keepalive checks.
    """

    def __init__(self, inner: Provider, keepalive: Callable[[], bool], *, poll: float = 0.05):
        self._inner = inner
        self._keepalive = keepalive
        self._poll = poll

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        temperature: float,
        max_tokens: int | None,
        settings: Mapping[str, Any],
    ) -> str | Completion:
        """See :class:`executors.llm.Provider`."""
        done = threading.Event()
        box: list[str | Completion | BaseException] = []

        def run() -> None:
            try:
                box.append(self._inner.complete(
                    model, prompt, temperature=temperature, max_tokens=max_tokens,
                    settings=settings,
                ))
            except BaseException as exc:  # handed over to the waiting thread
                box.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name=f"ax-llm-{model}", daemon=True).start()
        while not done.wait(self._poll):
            if not self._keepalive():
                raise ProviderError(f"model call {_STOPPED}", retryable=True)
        result = box[0]
        if isinstance(result, BaseException):
            raise result
        return result


class RoutingProvider:
    """Sends each model to the provider its route names (see :mod:`executors.llm._config`).

    Args:
        config: The ``llm`` configuration.
        simulated: The simulated provider.
        openai: The OpenAI-compatible provider.
    """

    def __init__(self, config: LlmSettings, *, simulated: Provider, openai: Provider) -> None:
        self._config = config
        self._providers = {"simulated": simulated, "openai": openai}

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        temperature: float,
        max_tokens: int | None,
        settings: Mapping[str, Any],
    ) -> str | Completion:
        """See :class:`executors.llm.Provider`."""
        try:
            kind = self._config.route(model).provider
        except LlmConfigError as exc:
            raise ProviderError(str(exc), retryable=False) from None
        return self._providers[kind].complete(
            model, prompt, temperature=temperature, max_tokens=max_tokens, settings=settings
        )


def default_provider(request: NodeRequest, ctx: NodeContext) -> Provider:
    """The provider of each model as the ``llm`` configuration routes it.

    ``simulated`` (offline, the default when no endpoint, base URL or key is configured)
    or ``openai`` (any OpenAI-compatible endpoint).

    Raises:
        ProviderError: The ``llm`` configuration is invalid (not retryable).
    """
    settings = ctx.settings
    try:
        config = llm_settings(settings)
    except LlmConfigError as exc:
        raise ProviderError(str(exc), retryable=False) from None
    keepalive = Keepalive(
        ctx, interval=float(settings.get("heartbeat_interval", DEFAULT_HEARTBEAT_INTERVAL))
    )
    knobs = merge_knobs(settings.get("simulate"), request.config.get("simulate"))
    return RoutingProvider(
        config,
        simulated=SimulatedProvider(knobs=knobs, attempt=request.attempt, keepalive=keepalive),
        # The attempt's trace context goes with every model call (docs/tracing.md).
        openai=HeartbeatingProvider(OpenAICompatibleProvider(
            config=config, headers={"traceparent": request.traceparent}), keepalive),
    )


class MalformedAnswer(ValueError):
    """The model did not answer in the asked format."""


def parse_completion(completion: str, *, wants_json: bool, keys: tuple[str, ...] = ()) -> Any:
    """Turn a completion into the node's output.

    A JSON object or array (also inside a Markdown code fence) is the output as is;
    anything else becomes ``{"text": completion}``.

    Args:
        completion: The model's text.
        wants_json: The prompt asked for JSON, so prose is a malformed answer.
        keys: Keys the prompt asked for; an object missing one is malformed.

    Raises:
        MalformedAnswer: JSON was asked for and not given (or keys are missing).
    """
    value = _json_value(completion)
    if value is None:
        if wants_json:
            raise MalformedAnswer(f"expected JSON, got {completion[:_SNIPPET]!r}")
        return {"text": completion}
    if keys and isinstance(value, dict) and (missing := [k for k in keys if k not in value]):
        raise MalformedAnswer(f"JSON answer lacks keys {missing}: {completion[:_SNIPPET]!r}")
    return value


def _json_value(text: str) -> dict[str, Any] | list[Any] | None:
    candidates = [text.strip()]
    fence = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if fence:
        candidates.append(fence.group(1).strip())
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict | list):
            return value
    return None


@dataclass(frozen=True)
class _Call:
    """One node's validated call parameters."""

    primary: str
    fallback: str | None
    threshold: float
    prompt: str
    temperature: float
    max_tokens: int | None
    wants_json: bool
    keys: tuple[str, ...]


class _ConfigError(ValueError):
    pass


class LlmCall:
    """The ``llm_call`` handler with its per-process state.

    Args:
        health: Success-rate tracker (fallback decisions).
        circuits: Circuit breakers per model.
        cache: Result cache for temperature-0 calls.
        provider_factory: Builds the provider for each attempt.
    """

    def __init__(
        self,
        *,
        health: ModelHealth | None = None,
        circuits: CircuitBreakers | None = None,
        cache: ResultCache | None = None,
        provider_factory: ProviderFactory = default_provider,
    ) -> None:
        self.health = health or ModelHealth()
        self.circuits = circuits or CircuitBreakers()
        self.cache = cache or ResultCache()
        self._provider_factory = provider_factory

    def reset(self) -> None:
        """Forget health history, close circuits and drop in-memory cache entries."""
        self.health.reset()
        self.circuits.reset()
        self.cache.clear()

    def __call__(self, request: NodeRequest, ctx: NodeContext) -> Outcome:
        """Run one ``llm_call`` attempt."""
        try:
            config = llm_settings(ctx.settings)
            call = _validate(request, known_models(config))
            provider = self._provider_factory(request, ctx)
        except (_ConfigError, LlmConfigError) as exc:
            return Failure(f"node {request.node_id!r}: {exc}", retryable=False)
        except ProviderError as exc:
            return Failure(f"node {request.node_id!r}: {exc.message}", retryable=exc.retryable)
        order, note = self._order(call)
        if note and not ctx.progress(note[:_MARKER_LIMIT]):
            return Failure(_STOPPED, retryable=True, details={"stopped": True})
        outages: list[Unavailable] = []
        for i, model in enumerate(order):
            outcome = self._call_model(model, call, provider, ctx, config)
            if isinstance(outcome, Unavailable) and i + 1 < len(order):
                outages.append(outcome)
                marker = f"llm:fallback {order[i + 1]} (model {model} unavailable)"
                if not ctx.progress(marker):
                    return Failure(_STOPPED, retryable=True, details={"stopped": True})
                continue
            if isinstance(outcome, Unavailable) and outages:
                every = [*outages, outcome]
                waits = [each.retry_after for each in every]
                return Unavailable(
                    dependency=f"model:{order[0]}",
                    evidence="; ".join(each.evidence for each in every),
                    # Worth trying again as soon as any of the models may answer.
                    retry_after=(None if any(w is None for w in waits)
                                 else min(w for w in waits if w is not None)),
                )
            return outcome
        raise AssertionError("unreachable: the model order is never empty")

    def _order(self, call: _Call) -> tuple[list[str], str | None]:
        if call.fallback is None:
            return [call.primary], None
        rate = self.health.success_rate(call.primary)
        if rate is not None and rate < call.threshold:
            note = (
                f"llm:fallback {call.fallback} (primary {call.primary} success rate "
                f"{rate:.0%} < {call.threshold:.0%})"
            )
            return [call.fallback, call.primary], note
        return [call.primary, call.fallback], None

    def _call_model(
        self, model: str, call: _Call, provider: Provider, ctx: NodeContext,
        config: LlmSettings,
    ) -> Outcome:
        settings = ctx.settings
        cache_dir = settings.get("llm_cache_dir")
        key = None
        # Only temperature 0 is deterministic enough to answer from a cache.
        if call.temperature == 0:
            key = cache_key(model, call.prompt, temperature=call.temperature,
                            max_tokens=call.max_tokens)
            hit = self.cache.get(key, cache_dir)
            if hit is not None:
                try:
                    output = parse_completion(hit, wants_json=call.wants_json, keys=call.keys)
                except MalformedAnswer:
                    pass  # never cached as such; a stale entry is simply recomputed
                else:
                    ctx.progress(f"llm:{model} cache hit")
                    return Success(output)
        denial = self.circuits.acquire(model)
        if denial is not None:
            return Unavailable(dependency=f"model:{model}", evidence=denial,
                               retry_after=self.circuits.reopens_in(model))
        if not ctx.progress(f"llm:{model}"):
            self.circuits.release(model)
            return Failure(_STOPPED, retryable=True, details={"stopped": True})
        try:
            answer = provider.complete(
                model, call.prompt, temperature=call.temperature, max_tokens=call.max_tokens,
                settings=settings,
            )
        except ProviderUnavailable as exc:
            self.health.record(model, False)
            self.circuits.unavailable(
                model, exc.evidence,
                failures=_opt_int(settings.get("llm_circuit_failures")),
                cooldown=_opt_float(settings.get("llm_circuit_cooldown")),
                retry_after=exc.retry_after,
            )
            return Unavailable(dependency=f"model:{model}", evidence=exc.evidence,
                               retry_after=exc.retry_after)
        except ProviderError as exc:
            # The endpoint answered, so the circuit closes; only a transient error says
            # something about the model's health.
            self.circuits.success(model)
            if exc.retryable:
                self.health.record(model, False)
            return Failure(exc.message, retryable=exc.retryable, details={"model": model})
        self.circuits.success(model)
        if isinstance(answer, Completion):
            completion, usage, endpoint = answer.text, answer.usage, answer.endpoint
        else:
            completion, usage, endpoint = answer, None, ""
        if usage is not None:
            ctx.progress(_usage_marker(model, usage)[:_MARKER_LIMIT])
        try:
            output = parse_completion(completion, wants_json=call.wants_json, keys=call.keys)
        except MalformedAnswer as exc:
            self.health.record(model, False)
            return Failure(
                f"model {model!r} did not answer in the format the prompt asks for: {exc}",
                retryable=True,
                details={"model": model},
            )
        self.health.record(model, True)
        if key is not None:
            self.cache.put(key, completion, cache_dir, model=model)
        if usage is not None and config.usage_in_output and isinstance(output, dict):
            output = {**output, "_llm": {"model": model, "endpoint": endpoint,
                                         "usage": dict(usage)}}
        return Success(output)


def _usage_marker(model: str, usage: Mapping[str, int]) -> str:
    counts = " ".join(f"{name}={usage[name]}" for name in sorted(usage))
    return f"llm:{model} usage {counts}"


def _validate(request: NodeRequest, models: frozenset[str]) -> _Call:
    cfg = request.config
    primary = cfg.get("model")
    if not isinstance(primary, str) or not primary:
        raise _ConfigError("llm_call needs a 'model'")
    if primary not in models:
        raise _ConfigError(
            f"model {primary!r} is not configured: use one of {sorted(models)}, or list it "
            f"under an endpoint's models in the llm configuration (or ${MODELS_ENV})"
        )
    prompt = cfg.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _ConfigError("llm_call needs a non-empty rendered 'prompt'")
    temperature = cfg.get("temperature")
    temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if not _is_number(temperature) or not 0 <= temperature <= 2:
        raise _ConfigError(f"temperature must be a number in [0, 2], got {temperature!r}")
    max_tokens = cfg.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise _ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    fallback, threshold = _fallback(cfg.get("fallback"), models)
    return _Call(
        primary=primary,
        fallback=fallback if fallback != primary else None,
        threshold=threshold,
        prompt=compose_prompt(prompt, request.input),
        temperature=float(temperature),
        max_tokens=max_tokens,
        wants_json=asks_for_json(prompt),
        keys=requested_keys(prompt),
    )


def _fallback(raw: Any, models: frozenset[str]) -> tuple[str | None, float]:
    if raw is None:
        return None, 0.0
    if not isinstance(raw, Mapping):
        raise _ConfigError(f"fallback must be a mapping {{model, threshold}}, got {raw!r}")
    model, threshold = raw.get("model"), raw.get("threshold", 0.8)
    if not isinstance(model, str) or model not in models:
        raise _ConfigError(
            f"fallback model {model!r} is not configured: use one of {sorted(models)}"
        )
    if not _is_number(threshold) or not 0 <= threshold <= 1:
        raise _ConfigError(f"fallback threshold must be in [0, 1], got {threshold!r}")
    return model, float(threshold)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
