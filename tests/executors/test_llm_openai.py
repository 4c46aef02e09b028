"""OpenAICompatibleProvider against a local /chat/completions server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from executors.contract import Failure, Success, Unavailable
from executors.llm import LlmCall, OpenAICompatibleProvider, ProviderError, ProviderUnavailable
from tests.executors.fakes import FakeContext, make_request
from tests.executors.local_http import Reply, Seen, serve

PATH = "/v1/chat/completions"


def _chat(content: Any) -> Reply:
    body = {"id": "c1", "choices": [{"index": 0, "message": {"role": "assistant",
                                                             "content": content}}]}
    return Reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})


def _complete(url: str, **settings: Any) -> str:
    return OpenAICompatibleProvider().complete(
        "gpt-4o", "Say hi", temperature=0.2, max_tokens=16,
        settings={"llm_base_url": f"{url}/v1", "llm_timeout": 5, **settings},
    )


def test_posts_chat_completion_and_returns_content() -> None:
    with serve({PATH: lambda _: _chat("hi there")}) as srv:
        text = _complete(srv.url, llm_api_key="sk-test")
        (seen,) = srv.seen
    assert text == "hi there"
    assert seen.method == "POST"
    assert seen.headers["Authorization"] == "Bearer sk-test"
    assert json.loads(seen.body) == {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "Say hi"}],
        "temperature": 0.2,
        "max_tokens": 16,
    }


def test_no_api_key_no_header() -> None:
    with serve({PATH: lambda _: _chat("ok")}) as srv:
        _complete(srv.url)
        assert "Authorization" not in srv.seen[0].headers


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_server_errors_and_throttling_are_unavailability(status: int) -> None:
    with serve({PATH: lambda _: Reply(status, b'{"error": "overloaded"}')}) as srv, \
            pytest.raises(ProviderUnavailable) as info:
        _complete(srv.url)
    assert str(status) in info.value.evidence
    assert "overloaded" in info.value.evidence


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (401, False), (404, False),
                                                    (408, True)])
def test_client_errors(status: int, retryable: bool) -> None:
    with serve({PATH: lambda _: Reply(status, b"nope")}) as srv, \
            pytest.raises(ProviderError) as info:
        _complete(srv.url)
    assert info.value.retryable is retryable


def test_connection_refused_is_unavailability() -> None:
    with serve() as srv:
        url = srv.url
    with pytest.raises(ProviderUnavailable) as info:
        _complete(url)
    assert "unreachable" in info.value.evidence


def test_response_size_is_bounded() -> None:
    with serve({PATH: lambda _: _chat("x" * 5000)}) as srv, \
            pytest.raises(ProviderError) as info:
        _complete(srv.url, llm_max_response_bytes=1000)
    assert info.value.retryable is False


@pytest.mark.parametrize("body", [b"not json", b'{"choices": []}', b'{"choices": [{"message":'
                                  b' {"content": 5}}]}'])
def test_malformed_responses_are_retryable(body: bytes) -> None:
    with serve({PATH: lambda _: Reply(200, body)}) as srv, \
            pytest.raises(ProviderError) as info:
        _complete(srv.url)
    assert info.value.retryable is True


def test_missing_base_url() -> None:
    with pytest.raises(ProviderError) as info:
        OpenAICompatibleProvider().complete("m", "p", temperature=0, max_tokens=None, settings={})
    assert info.value.retryable is False


def test_handler_uses_endpoint_and_opens_the_circuit() -> None:
    answers = iter([_chat('{"risk": "low"}')] + [Reply(503, b"down")] * 10)

    def route(_seen: Seen) -> Reply:
        return next(answers)

    handler = LlmCall()
    with serve({PATH: route}) as srv:
        settings = {"llm_base_url": f"{srv.url}/v1", "llm_timeout": 5,
                    "llm_circuit_failures": 2, "heartbeat_interval": 0}
        request = make_request("llm_call", config={"model": "gpt-4o",
                                                   "prompt": "Return JSON with keys: risk."})
        ctx = FakeContext(settings=settings)
        assert handler(request, ctx) == Success({"risk": "low"})
        outcomes = [handler(request, FakeContext(settings=settings)) for _ in range(3)]
        calls = len(srv.seen)
    assert all(isinstance(o, Unavailable) for o in outcomes)
    assert calls == 3  # the third outage call was never made: the circuit was open
    last = outcomes[2]
    assert isinstance(last, Unavailable) and "circuit" in last.evidence


def test_handler_reports_a_stale_fence_while_waiting() -> None:
    import threading

    gate = threading.Event()

    def slow(_seen: Seen) -> Reply:
        gate.wait(10)
        return _chat("late")

    with serve({PATH: slow}) as srv:
        ctx = FakeContext(settings={"llm_base_url": f"{srv.url}/v1", "heartbeat_interval": 0},
                          stale_after_heartbeats=2)
        outcome = LlmCall()(make_request("llm_call", config={"model": "gpt-4o",
                                                             "prompt": "hi"}), ctx)
        gate.set()
    assert isinstance(outcome, Failure)
    assert "stopped" in outcome.message
    assert ctx.heartbeats == 2
