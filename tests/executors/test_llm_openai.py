"""Real models: the ``llm`` configuration, the OpenAI provider and ``ax run`` / ``ax.run``
against a fake OpenAI-compatible endpoint on loopback (tests/fake_openai.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import axengine as ax
from axengine.cli import main as ax_cli
from executors import registry
from executors.contract import Failure, Success, Unavailable
from executors.llm import (
    LlmCall,
    LlmConfigError,
    OpenAICompatibleProvider,
    ProviderError,
    ProviderUnavailable,
    llm_call,
    llm_settings,
)
from tests.executors.fakes import FakeContext, make_request
from tests.fake_openai import FakeOpenAI, fake_openai

ROOT = Path(__file__).resolve().parents[2]
DAG = str(ROOT / "dags" / "financial_risk_assessment.yaml")
ACME = {"pdf_url": str(ROOT / "dags/inputs/acme_annual_report.pdf")}
KEY = "sk-test-0123456789abcdef"
METRICS = {"revenue_growth": 0.05, "net_profit_margin": 0.2, "debt_to_equity": 0.5}
_ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "AX_LLM_MODELS")


def _answer(body: dict[str, Any]) -> str:
    prompt = body["messages"][-1]["content"]
    return json.dumps(METRICS) if "revenue_growth" in prompt else "plain answer"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [*_ENV, *(n for n in os.environ if n.startswith("AX_LLM__"))]:
        monkeypatch.delenv(name, raising=False)
    llm_call.reset()
    yield
    llm_call.reset()


@pytest.fixture
def api() -> Iterator[FakeOpenAI]:
    with fake_openai(_answer, require_key=KEY) as server:
        yield server


def _settings(api: FakeOpenAI, **llm: Any) -> dict[str, Any]:
    return {"heartbeat_interval": 0,
            "llm": {"base_url": api.base_url, "api_key": KEY, "timeout": 5, **llm}}


def _call(settings: dict[str, Any], prompt: str = "Say hi", **config: Any) -> Any:
    request = make_request("llm_call", config={"model": "gpt-4o", "prompt": prompt,
                                               "temperature": 0.2, **config})
    ctx = FakeContext(settings=settings)
    return LlmCall()(request, ctx), ctx


# -- the request and the answer ------------------------------------------------------


def test_request_carries_key_model_temperature_system_prompt(api: FakeOpenAI) -> None:
    outcome, ctx = _call(_settings(api, system_prompt="You are terse."), max_tokens=16)
    (call,) = api.completions
    assert call.authorization == f"Bearer {KEY}"
    assert call.body["model"] == "gpt-4o"
    assert call.body["temperature"] == 0.2
    assert call.body["max_tokens"] == 16
    assert call.system_prompt == "You are terse."
    assert call.user_prompt == "Say hi"
    assert "response_format" not in call.body  # the prompt does not ask for JSON
    assert outcome == Success({"text": "plain answer", "_llm": {
        "model": "gpt-4o", "endpoint": "default",
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}})
    assert "llm:gpt-4o usage completion_tokens=2 prompt_tokens=5 total_tokens=7" \
        in ctx.markers


def test_json_prompt_uses_json_mode_and_keeps_the_answer(api: FakeOpenAI) -> None:
    prompt = "Return JSON with keys: revenue_growth, net_profit_margin, debt_to_equity."
    outcome, _ = _call(_settings(api), prompt=prompt)
    (call,) = api.completions
    assert call.body["response_format"] == {"type": "json_object"}
    assert call.system_prompt is None
    assert isinstance(outcome, Success)
    assert {k: outcome.output[k] for k in METRICS} == METRICS
    assert outcome.output["_llm"]["usage"]["total_tokens"] > 0


def test_json_mode_off_and_usage_out_of_the_output(api: FakeOpenAI) -> None:
    outcome, ctx = _call(_settings(api, json_mode="off", usage_in_output=False),
                         prompt="Return JSON with keys: revenue_growth.")
    assert "response_format" not in api.completions[0].body
    assert isinstance(outcome, Success) and "_llm" not in outcome.output
    assert any(m.startswith("llm:gpt-4o usage") for m in ctx.markers)


def test_no_key_sends_no_authorization() -> None:
    with fake_openai("ok") as api:
        outcome, _ = _call({"heartbeat_interval": 0, "llm": {"base_url": api.base_url}})
        assert isinstance(outcome, Success)
        assert api.completions[0].authorization is None


# -- errors --------------------------------------------------------------------------


def _complete(api: FakeOpenAI, key: str = KEY) -> Any:
    return OpenAICompatibleProvider().complete(
        "gpt-4o", "Say hi", temperature=0.2, max_tokens=16,
        settings={"llm": {"base_url": api.base_url, "api_key": key, "timeout": 5}},
    )


def test_429_with_retry_after_is_unavailability(api: FakeOpenAI) -> None:
    api.fail(429, headers={"Retry-After": "2"}, message="slow down")
    with pytest.raises(ProviderUnavailable) as info:
        _complete(api)
    assert info.value.retry_after == 2
    assert "429" in info.value.evidence and "Retry-After: 2s" in info.value.evidence
    api.fail(429, headers={"Retry-After": "3"})
    outcome, _ = _call(_settings(api))
    assert isinstance(outcome, Unavailable)
    assert outcome.dependency == "model:gpt-4o" and "Retry-After: 3s" in outcome.evidence


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_unavailability(api: FakeOpenAI, status: int) -> None:
    api.fail(status, message="overloaded")
    with pytest.raises(ProviderUnavailable) as info:
        _complete(api)
    assert str(status) in info.value.evidence and "overloaded" in info.value.evidence


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (404, False), (408, True)])
def test_client_errors(api: FakeOpenAI, status: int, retryable: bool) -> None:
    api.fail(status)
    with pytest.raises(ProviderError) as info:
        _complete(api)
    assert info.value.retryable is retryable


def test_401_is_a_clear_final_failure_without_the_key(api: FakeOpenAI) -> None:
    wrong = "sk-wrong-9876543210fedcba"
    with pytest.raises(ProviderError) as info:
        _complete(api, key=wrong)
    assert info.value.retryable is False
    assert "refused the API key from llm.api_key (HTTP 401)" in info.value.message
    assert wrong not in info.value.message and wrong[3:-2] not in info.value.message
    outcome, _ = _call({"heartbeat_interval": 0,
                        "llm": {"base_url": api.base_url, "api_key": wrong}})
    assert isinstance(outcome, Failure) and outcome.retryable is False
    assert wrong not in outcome.message


def test_connection_refused_is_unavailability() -> None:
    with fake_openai() as api:
        url = api.base_url
    with pytest.raises(ProviderUnavailable) as info:
        OpenAICompatibleProvider().complete(
            "gpt-4o", "hi", temperature=0, max_tokens=None,
            settings={"llm": {"base_url": url, "timeout": 5}})
    assert "unreachable" in info.value.evidence


def test_circuit_opens_after_outages(api: FakeOpenAI) -> None:
    handler = LlmCall()
    settings = {**_settings(api), "llm_circuit_failures": 2}
    request = make_request("llm_call", config={"model": "gpt-4o", "prompt": "hi"})
    assert isinstance(handler(request, FakeContext(settings=settings)), Success)
    api.fail(503, times=10)
    outcomes = [handler(request, FakeContext(settings=settings)) for _ in range(3)]
    assert all(isinstance(o, Unavailable) for o in outcomes)
    assert len(api.completions) == 3  # the third outage was never sent: circuit open
    last = outcomes[2]
    assert isinstance(last, Unavailable) and "circuit" in last.evidence


def test_stale_fence_abandons_the_call() -> None:
    gate = threading.Event()

    def slow(_body: dict[str, Any]) -> str:
        gate.wait(10)
        return "late"

    with fake_openai(slow) as api:
        ctx = FakeContext(settings={"heartbeat_interval": 0,
                                    "llm": {"base_url": api.base_url}},
                          stale_after_heartbeats=2)
        outcome = LlmCall()(make_request("llm_call", config={"model": "gpt-4o",
                                                             "prompt": "hi"}), ctx)
        gate.set()
    assert isinstance(outcome, Failure) and "stopped" in outcome.message
    assert ctx.heartbeats == 2


# -- configuration -------------------------------------------------------------------


def test_offline_default_is_simulated() -> None:
    assert llm_settings({}, env={}).route("gpt-4o", {}).provider == "simulated"
    outcome, _ = _call({"heartbeat_interval": 0})
    assert isinstance(outcome, Success) and "simulated" in outcome.output["text"]


def test_openai_env_routes_every_model_unless_simulated_is_set() -> None:
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": KEY}
    route = llm_settings({}, env=env).route("sim-small", env)
    assert (route.provider, route.base_url, route.api_key) == ("openai", env[
        "OPENAI_BASE_URL"], KEY)
    assert KEY not in repr(route)
    forced = llm_settings({"llm": {"provider": "simulated"}}, env=env)
    assert forced.route("gpt-4o", env).provider == "simulated"


def test_endpoint_routing_and_key_sources(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    env = {"OPENAI_API_KEY": KEY, "LOCAL_KEY": "sk-from-env"}
    config = llm_settings({"llm": {"endpoints": {
        "local": {"base_url": "http://127.0.0.1:8000/v1", "models": ["llama-3"],
                  "api_key_env": "LOCAL_KEY", "default_headers": {"X-Team": "risk"}},
        "vllm": {"base_url": "http://127.0.0.1:8001/v1", "models": "qwen, phi",
                 "api_key_file": str(key_file), "timeout": 9},
        "open": {"base_url": "http://127.0.0.1:8002/v1", "models": ["mistral"]},
        "sim": {"provider": "simulated", "models": ["toy"]},
    }}}, env=env)
    assert config.model_names() == {"llama-3", "qwen", "phi", "mistral", "toy"}
    local = config.route("llama-3", env)
    assert (local.endpoint, local.api_key, local.default_headers) == (
        "local", "sk-from-env", {"X-Team": "risk"})
    vllm = config.route("phi", env)
    assert (vllm.api_key, vllm.timeout) == ("sk-from-file", 9)
    # $OPENAI_API_KEY is never sent to an endpoint with a base_url of its own.
    assert config.route("mistral", env).api_key is None
    assert config.route("toy", env).provider == "simulated"
    # A model no endpoint lists goes to the default endpoint: here $OPENAI_API_KEY.
    assert config.route("gpt-4o", env).provider == "openai"


@pytest.mark.parametrize(("llm", "message"), [
    ({"provider": "anthropic"}, "llm.provider: Input should be 'simulated' or 'openai'"),
    ({"endpoints": {"x": {"bse_url": "http://h"}}}, "llm.endpoints.x.bse_url: unknown"),
    ({"endpoints": {"x": {"base_url": "h:80"}}}, "llm.endpoints.x.base_url: Value error, "
                                                 "must start with http://"),
    ({"timeout": 0}, "llm.timeout: Input should be greater than 0"),
])
def test_invalid_configuration_is_named(llm: dict[str, Any], message: str) -> None:
    with pytest.raises(LlmConfigError, match="invalid llm configuration") as info:
        llm_settings({"llm": llm})
    assert message in str(info.value)
    outcome, _ = _call({"llm": llm})
    assert isinstance(outcome, Failure) and outcome.retryable is False
    assert message in outcome.message


def test_key_source_errors_do_not_leak(tmp_path: Path) -> None:
    config = llm_settings({"llm": {"endpoints": {"e": {
        "models": ["m"], "api_key_env": "NOPE_KEY"}}}}, env={})
    with pytest.raises(LlmConfigError, match=r"llm.endpoints.e.api_key_env names \$NOPE_KEY"):
        config.route("m", {})
    both = llm_settings({"llm": {"api_key": KEY, "api_key_file": str(tmp_path / "k")}})
    with pytest.raises(LlmConfigError, match="set only one of api_key, api_key_file") as info:
        both.route("gpt-4o", {})
    assert KEY not in str(info.value)


def test_env_reader_until_the_config_layer_passes_a_table() -> None:
    env = {"AX_LLM__PROVIDER": "openai", "AX_LLM__SYSTEM_PROMPT": "Be brief.",
           "AX_LLM__ENDPOINTS__LOCAL__BASE_URL": "http://127.0.0.1:8000/v1",
           "AX_LLM__ENDPOINTS__LOCAL__MODELS": "llama-3, qwen", "AX_LLM__TIMEOUT": "7"}
    config = llm_settings({}, env=env)
    assert config.system_prompt == "Be brief." and config.timeout == 7
    assert config.route("qwen", env).endpoint == "local"
    # A table from the config layer wins over the environment.
    assert llm_settings({"llm": {}}, env=env).system_prompt is None


def test_legacy_flat_settings_still_work(api: FakeOpenAI) -> None:
    outcome, _ = _call({"heartbeat_interval": 0, "llm_base_url": api.base_url,
                        "llm_api_key": KEY})
    assert isinstance(outcome, Success)
    assert api.completions[0].authorization == f"Bearer {KEY}"


def test_model_names_come_from_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"endpoints": {"local": {"base_url": "http://h/v1", "models": ["llama-3"]}},
             "models": ["house-model"]}
    names = registry.model_names(table)
    assert {"llama-3", "house-model", "gpt-4-turbo", "sim-small"} <= names
    assert "llama-3" not in registry.model_names()
    monkeypatch.setenv("AX_LLM__ENDPOINTS__LOCAL__MODELS", "llama-3")
    assert "llama-3" in registry.model_names()
    # The handler accepts the configured name and still refuses an unknown one.
    outcome, _ = _call({"llm": {**table, "provider": "simulated"}}, model="house-model")
    assert isinstance(outcome, Success)
    outcome, _ = _call({"llm": table}, model="nobody")
    assert isinstance(outcome, Failure) and "'nobody' is not configured" in outcome.message


# -- end to end: the financial DAG's llm_call reaches the fake endpoint ---------------


def _use(monkeypatch: pytest.MonkeyPatch, api: FakeOpenAI, key: str = KEY) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", api.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", key)


def test_ax_run_sdk_reaches_the_endpoint(api: FakeOpenAI, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, api)
    result = ax.run(DAG, ACME, home=tmp_path, timeout=60)
    assert result.status == "SUCCEEDED", result.errors
    (call,) = api.completions
    assert call.authorization == f"Bearer {KEY}"
    assert call.body["model"] == "gpt-4-turbo" and call.body["temperature"] == 0.1
    assert call.body["max_tokens"] == 512
    assert call.body["response_format"] == {"type": "json_object"}
    assert "Revenue" in (call.user_prompt or "")  # the PDF text was appended as the input
    output = result.outputs["extract_metrics"]
    assert {k: output[k] for k in METRICS} == METRICS
    assert output["_llm"]["usage"]["total_tokens"] == (
        output["_llm"]["usage"]["prompt_tokens"] + output["_llm"]["usage"]["completion_tokens"])
    assert "send_low_risk_email" in result.path


def test_ax_run_cli_subprocess_configured_by_env_only(api: FakeOpenAI, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AX_", "OPENAI_"))}
    env |= {"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": KEY,
            "AX_LLM__SYSTEM_PROMPT": "You are a careful analyst."}
    proc = subprocess.run(
        [sys.executable, "-m", "axengine.cli", "run", DAG, "--input", json.dumps(ACME),
         "--home", str(tmp_path), "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "SUCCEEDED"
    (call,) = api.completions
    assert call.authorization == f"Bearer {KEY}"
    assert call.body["model"] == "gpt-4-turbo" and call.body["temperature"] == 0.1
    assert call.system_prompt == "You are a careful analyst."
    assert result["outputs"]["extract_metrics"]["_llm"]["usage"]["prompt_tokens"] > 0


@pytest.mark.slow  # waits out the endpoint's real Retry-After (1 s)
def test_throttled_node_waits_then_succeeds(api: FakeOpenAI, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _use(monkeypatch, api)
    # Throttled twice: the primary, then its fallback in the same attempt.
    api.fail(429, times=2, headers={"Retry-After": "1"}, message="rate limited")
    result = ax.run(DAG, ACME, home=tmp_path, timeout=60)
    assert result.status == "SUCCEEDED", result.errors
    assert [c.body["model"] for c in api.completions] == [
        "gpt-4-turbo", "gpt-3.5-turbo", "gpt-4-turbo"]
    assert ax_cli(["tasks", "show", result.task_id, "--home", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    waits = [e for e in shown["events"] if e["kind"] == "unavailable"]
    assert len(waits) == 1 and waits[0]["node_id"] == "extract_metrics"
    assert "model:gpt-4-turbo" in waits[0]["detail"]
    assert "Retry-After: 1s" in waits[0]["detail"]
    assert waits[0]["detail"].endswith("(offered again in 1s)")  # not the default 5 s
    assert shown["nodes"]["extract_metrics"]["attempt"] == 1  # the wait spent no attempt


def test_wrong_key_fails_the_node_clearly(api: FakeOpenAI, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = "sk-wrong-9876543210fedcba"
    _use(monkeypatch, api, key=wrong)
    result = ax.run(DAG, ACME, home=tmp_path, timeout=60)
    assert result.states["extract_metrics"] in ("FAILED", "DEAD")
    assert result.status != "SUCCEEDED"
    assert len(api.completions) == 1  # not retried
    error = result.errors["extract_metrics"]
    assert "refused the API key from $OPENAI_API_KEY (HTTP 401)" in error
    assert wrong not in error
