"""The llm_call handler's machinery: cache, health-based fallback, circuit breaker."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import executors.llm._models as models_module
from executors.contract import Failure, NodeContext, NodeRequest, Success, Unavailable
from executors.llm import (
    DEFAULT_MODELS,
    CircuitBreakers,
    HeartbeatingProvider,
    LlmCall,
    MalformedAnswer,
    ModelHealth,
    ProviderError,
    ProviderUnavailable,
    ResultCache,
    compose_prompt,
    known_models,
    parse_completion,
)
from tests.executors.fakes import FakeContext, make_request

Answer = str | BaseException | Callable[[], str]


class Clock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """A provider answering from per-model scripts (the last answer repeats)."""

    def __init__(self, scripts: Mapping[str, Sequence[Answer]]) -> None:
        self.scripts = {model: list(answers) for model, answers in scripts.items()}
        self.calls: list[tuple[str, str]] = []

    def complete(self, model: str, prompt: str, *, temperature: float, max_tokens: int | None,
                 settings: Mapping[str, Any]) -> str:
        self.calls.append((model, prompt))
        script = self.scripts[model]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer() if callable(answer) else answer

    def count(self, model: str) -> int:
        return sum(1 for m, _ in self.calls if m == model)


def make_handler(provider: Scripted, clock: Clock | None = None) -> LlmCall:
    clock = clock or Clock()

    def factory(_request: NodeRequest, _ctx: NodeContext) -> Scripted:
        return provider

    return LlmCall(health=ModelHealth(clock=clock), circuits=CircuitBreakers(clock=clock),
                   provider_factory=factory)


def req(config: Mapping[str, Any] | None = None, node_input: Any = None) -> NodeRequest:
    return make_request("llm_call", config={"model": "gpt-4o", "prompt": "Summarise.",
                                            **(config or {})}, input=node_input)


FALLBACK = {"fallback": {"model": "gpt-4o-mini", "threshold": 0.8}}


# --- cache ---------------------------------------------------------------------------


def test_temperature_zero_is_cached_in_memory() -> None:
    provider = Scripted({"gpt-4o": ['{"a": 1}']})
    handler = make_handler(provider)
    ctx = FakeContext()
    first = handler(req({"temperature": 0}, "doc"), ctx)
    second = handler(req({"temperature": 0}, "doc"), ctx)
    other_input = handler(req({"temperature": 0}, "other doc"), ctx)
    assert first == second == other_input == Success({"a": 1})
    assert provider.count("gpt-4o") == 2
    assert ctx.markers == ["llm:gpt-4o", "llm:gpt-4o cache hit", "llm:gpt-4o"]


@pytest.mark.parametrize("temperature", [None, 0.1, 1])
def test_nonzero_temperature_is_not_cached(temperature: float | None) -> None:
    provider = Scripted({"gpt-4o": ["one", "two"]})
    handler = make_handler(provider)
    a = handler(req({"temperature": temperature}), FakeContext())
    b = handler(req({"temperature": temperature}), FakeContext())
    assert (a, b) == (Success({"text": "one"}), Success({"text": "two"}))


def test_cache_directory_survives_a_new_process(tmp_path: Path) -> None:
    settings = {"llm_cache_dir": str(tmp_path / "cache")}
    first = make_handler(Scripted({"gpt-4o": ["hello"]}))
    assert first(req({"temperature": 0}), FakeContext(settings=settings)) == \
        Success({"text": "hello"})
    files = list((tmp_path / "cache").glob("*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["completion"] == "hello"

    fresh = Scripted({"gpt-4o": [ProviderUnavailable("must not be called")]})
    assert make_handler(fresh)(req({"temperature": 0}), FakeContext(settings=settings)) == \
        Success({"text": "hello"})
    assert fresh.calls == []


def test_failed_answers_are_not_cached() -> None:
    provider = Scripted({"gpt-4o": ["prose, not json", '{"k": 2}']})
    handler = make_handler(provider)
    bad = handler(req({"temperature": 0, "prompt": "Return JSON with keys: k."}), FakeContext())
    good = handler(req({"temperature": 0, "prompt": "Return JSON with keys: k."}), FakeContext())
    assert isinstance(bad, Failure) and bad.retryable
    assert good == Success({"k": 2})


def test_result_cache_lru_and_torn_files(tmp_path: Path) -> None:
    cache = ResultCache(max_entries=2)
    for key in ("a", "b", "c"):
        cache.put(key, key.upper())
    assert len(cache) == 2
    assert cache.get("a") is None
    assert cache.get("c") == "C"
    (tmp_path / "torn.json").write_text('{"completion": "x"')
    assert cache.get("torn", tmp_path) is None


# --- fallback ------------------------------------------------------------------------


def test_fallback_when_primary_success_rate_drops() -> None:
    provider = Scripted({"gpt-4o": [ProviderError("flaky", retryable=True)],
                           "gpt-4o-mini": ["from fallback"]})
    handler = make_handler(provider)
    outcomes = [handler(req(FALLBACK), FakeContext()) for _ in range(5)]
    assert all(isinstance(o, Failure) and o.retryable for o in outcomes)
    assert handler.health.success_rate("gpt-4o") == 0.0

    ctx = FakeContext()
    assert handler(req(FALLBACK), ctx) == Success({"text": "from fallback"})
    assert provider.count("gpt-4o") == 5
    assert ctx.markers[0] == "llm:fallback gpt-4o-mini (primary gpt-4o success rate 0% < 80%)"


def test_primary_kept_while_rate_is_unknown_or_healthy() -> None:
    provider = Scripted({"gpt-4o": ["ok", "ok", "ok", "ok", ProviderError("x", retryable=True),
                                      "ok"], "gpt-4o-mini": ["fallback"]})
    handler = make_handler(provider)
    for _ in range(6):
        handler(req(FALLBACK), FakeContext())
    assert handler.health.success_rate("gpt-4o") == pytest.approx(5 / 6)
    assert handler(req(FALLBACK), FakeContext()) == Success({"text": "ok"})
    assert provider.count("gpt-4o-mini") == 0


def test_fallback_answers_when_primary_is_unavailable_now() -> None:
    provider = Scripted({"gpt-4o": [ProviderUnavailable("503 from primary")],
                           "gpt-4o-mini": ["backup"]})
    ctx = FakeContext()
    assert make_handler(provider)(req(FALLBACK), ctx) == Success({"text": "backup"})
    assert "llm:fallback gpt-4o-mini (model gpt-4o unavailable)" in ctx.markers


def test_both_unavailable_waits_with_all_evidence() -> None:
    provider = Scripted({"gpt-4o": [ProviderUnavailable("primary down")],
                           "gpt-4o-mini": [ProviderUnavailable("fallback down")]})
    outcome = make_handler(provider)(req(FALLBACK), FakeContext())
    assert isinstance(outcome, Unavailable)
    assert outcome.dependency == "model:gpt-4o"
    assert "primary down" in outcome.evidence and "fallback down" in outcome.evidence


def test_model_health_window_min_samples_and_age() -> None:
    clock = Clock()
    health = ModelHealth(window=4, min_samples=3, max_age=60, clock=clock)
    health.record("m", False)
    health.record("m", False)
    assert health.success_rate("m") is None
    for _ in range(4):
        health.record("m", True)
    assert health.success_rate("m") == 1.0  # the two misses slid out of the window
    clock.now += 61
    assert health.success_rate("m") is None  # aged out: the model gets tried again


# --- circuit breaker -------------------------------------------------------------------


def test_circuit_opens_after_consecutive_outages_and_stops_calling() -> None:
    clock = Clock()
    provider = Scripted({"gpt-4o": [ProviderUnavailable("connection refused")]})
    handler = make_handler(provider, clock)
    for _ in range(3):
        outcome = handler(req(), FakeContext())
        assert isinstance(outcome, Unavailable)
    assert handler.circuits.state("gpt-4o") == "open"
    denied = handler(req(), FakeContext())
    assert isinstance(denied, Unavailable)
    assert denied.dependency == "model:gpt-4o"
    assert "circuit" in denied.evidence and "connection refused" in denied.evidence
    assert provider.count("gpt-4o") == 3


def test_half_open_probe_closes_or_reopens() -> None:
    clock = Clock()
    provider = Scripted({"gpt-4o": [ProviderUnavailable("down")] * 4 + ["back"]})
    handler = make_handler(provider, clock)
    for _ in range(3):
        handler(req(), FakeContext())
    clock.now += 31
    assert handler.circuits.state("gpt-4o") == "half_open"
    probe = handler(req(), FakeContext())  # the probe fails: open again at once
    assert isinstance(probe, Unavailable)
    assert handler.circuits.state("gpt-4o") == "open"
    assert provider.count("gpt-4o") == 4
    clock.now += 31
    assert handler(req(), FakeContext()) == Success({"text": "back"})
    assert handler.circuits.state("gpt-4o") == "closed"


def test_half_open_lets_exactly_one_probe_through() -> None:
    clock = Clock()
    breakers = CircuitBreakers(failures=1, cooldown=10, clock=clock)
    breakers.unavailable("m", "down")
    assert breakers.acquire("m") is not None
    clock.now += 10
    assert breakers.acquire("m") is None
    second = breakers.acquire("m")
    assert second is not None and "probe" in second
    breakers.release("m")
    assert breakers.acquire("m") is None


def test_circuit_settings_override() -> None:
    provider = Scripted({"gpt-4o": [ProviderUnavailable("down")]})
    handler = make_handler(provider)
    handler(req(), FakeContext(settings={"llm_circuit_failures": 1}))
    assert handler.circuits.state("gpt-4o") == "open"


def test_errors_from_a_reachable_endpoint_close_the_circuit() -> None:
    provider = Scripted({"gpt-4o": [ProviderUnavailable("down"), ProviderUnavailable("down"),
                                      ProviderError("bad request", retryable=False),
                                      ProviderUnavailable("down")]})
    handler = make_handler(provider)
    outcomes = [handler(req(), FakeContext()) for _ in range(4)]
    assert isinstance(outcomes[2], Failure) and outcomes[2].retryable is False
    assert handler.circuits.state("gpt-4o") == "closed"
    # A request the endpoint refuses says nothing about the model's health.
    assert handler.health.success_rate("gpt-4o") is None


# --- validation and parsing --------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {"model": "gpt-9"},
        {"model": None},
        {"prompt": ""},
        {"temperature": 3},
        {"temperature": "hot"},
        {"max_tokens": 0},
        {"fallback": {"model": "nope", "threshold": 0.5}},
        {"fallback": {"model": "gpt-4o-mini", "threshold": 2}},
        {"fallback": "gpt-4o-mini"},
    ],
)
def test_bad_config_is_not_retryable(config: dict[str, Any]) -> None:
    outcome = make_handler(Scripted({"gpt-4o": ["x"]}))(req(config), FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False


def test_unknown_provider_setting() -> None:
    outcome = LlmCall()(req(), FakeContext(settings={"llm_provider": "carrier-pigeon"}))
    assert isinstance(outcome, Failure) and outcome.retryable is False
    assert "llm_provider" in outcome.message


def test_parse_completion_forms() -> None:
    assert parse_completion('{"a": 1}', wants_json=True) == {"a": 1}
    assert parse_completion("[1, 2]", wants_json=True) == [1, 2]
    assert parse_completion('Here:\n```json\n{"a": 1}\n```\n', wants_json=True) == {"a": 1}
    assert parse_completion("42", wants_json=False) == {"text": "42"}
    assert parse_completion("just prose", wants_json=False) == {"text": "just prose"}
    with pytest.raises(MalformedAnswer):
        parse_completion("just prose", wants_json=True)
    with pytest.raises(MalformedAnswer):
        parse_completion('{"a": 1}', wants_json=True, keys=("a", "b"))


def test_compose_prompt_appends_input() -> None:
    assert compose_prompt("P", None) == "P"
    assert compose_prompt("P\n", "text") == "P\n\nInput:\ntext"
    assert compose_prompt("P", {"b": 1, "a": 2}) == 'P\n\nInput:\n{\n  "a": 2,\n  "b": 1\n}'


def test_known_models_default_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AX_LLM_MODELS", " llama-3-70b, ,mistral-large ")
    models_module._env_models.cache_clear()
    try:
        assert known_models() == DEFAULT_MODELS | {"llama-3-70b", "mistral-large"}
        assert {"gpt-4-turbo", "sim-small", "moderation-lite"} <= known_models()
    finally:
        monkeypatch.delenv("AX_LLM_MODELS")
        models_module._env_models.cache_clear()
    assert known_models() == DEFAULT_MODELS


# --- liveness while a real provider blocks ----------------------------------------------


class Blocking:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def complete(self, model: str, prompt: str, *, temperature: float, max_tokens: int | None,
                 settings: Mapping[str, Any]) -> str:
        self.started.set()
        if not self.release.wait(10):
            raise TimeoutError("never released")
        return "done"


def test_heartbeating_provider_abandons_a_stale_call() -> None:
    inner = Blocking()
    beats: list[int] = []

    def keepalive() -> bool:
        beats.append(1)
        return len(beats) < 3

    provider = HeartbeatingProvider(inner, keepalive, poll=0.01)
    with pytest.raises(ProviderError) as info:
        provider.complete("m", "p", temperature=0, max_tokens=None, settings={})
    assert info.value.retryable is True
    assert len(beats) == 3
    inner.release.set()


def test_heartbeating_provider_returns_and_raises_like_the_inner_one() -> None:
    inner = Blocking()
    inner.release.set()
    assert HeartbeatingProvider(inner, lambda: True).complete(
        "m", "p", temperature=0, max_tokens=None, settings={}) == "done"
    failing = Scripted({"m": [ProviderUnavailable("down")]})
    with pytest.raises(ProviderUnavailable):
        HeartbeatingProvider(failing, lambda: True).complete(
            "m", "p", temperature=0, max_tokens=None, settings={})


def test_retry_after_opens_the_circuit_for_exactly_that_long() -> None:
    clock = Clock()
    breakers = CircuitBreakers(failures=5, cooldown=30, clock=clock)
    assert breakers.reopens_in("m") is None
    # One throttle with a hint opens it at once (threshold 5 not reached), for 4 s.
    assert breakers.unavailable("m", "429", retry_after=4) == "open"
    assert breakers.reopens_in("m") == 4
    clock.now += 3
    assert breakers.acquire("m") is not None and breakers.reopens_in("m") == 1
    clock.now += 1
    assert breakers.acquire("m") is None  # the probe, after 4 s rather than 30 s


def test_a_throttled_model_hands_its_retry_after_to_the_engine() -> None:
    clock = Clock()
    provider = Scripted({"gpt-4o": [ProviderUnavailable("429", retry_after=7)]})
    call = make_handler(provider, clock)
    first = call(req(), FakeContext())
    assert isinstance(first, Unavailable) and first.retry_after == 7
    clock.now += 2
    denied = call(req(), FakeContext())  # the circuit is open: the rest of the wait
    assert isinstance(denied, Unavailable) and denied.retry_after == 5
